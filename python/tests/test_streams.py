"""Streams (tern queues) and events (tern events)."""

import threading

import torch


def test_default_and_new_streams():
    default = torch.tern.current_stream()
    assert default.stream_id == 0 and default.device == torch.device("tern:0")
    assert torch.tern.default_stream() == default
    s1 = torch.tern.Stream()
    s2 = torch.Stream(device="tern")
    assert s1.device.type == "tern"
    assert s1.stream_id != 0 and s2.stream_id != 0 and s1.stream_id != s2.stream_id
    assert s1.query()
    with torch.tern.stream(s1):
        assert torch.tern.current_stream() == s1
    assert torch.tern.current_stream() == default
    with s2:
        assert torch.accelerator.current_stream() == s2
    assert torch.accelerator.current_stream() == default


def test_current_stream_is_per_thread():
    s = torch.tern.Stream()
    seen = {}
    with torch.tern.stream(s):
        t = threading.Thread(target=lambda: seen.setdefault("id", torch.tern.current_stream().stream_id))
        t.start()
        t.join()
        assert torch.tern.current_stream() == s
    assert seen["id"] == 0


def test_work_on_streams_and_events():
    s = torch.tern.Stream()
    x = torch.full((1 << 16,), 2.0, device="tern")
    start = torch.Event(device="tern", enable_timing=True)
    end = torch.tern.Event(enable_timing=True)
    done = torch.tern.current_stream().record_event()
    with torch.tern.stream(s):
        s.wait_event(done)
        start.record()
        y = x * 3
        end.record()
    s.synchronize()
    assert end.query()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    torch.tern.current_stream().wait_stream(s)
    assert torch.equal(y.cpu(), torch.full((1 << 16,), 6.0))


def test_record_stream_and_per_stream_pools():
    torch.tern.synchronize()
    torch.tern.empty_cache()
    s = torch.tern.Stream()
    a = torch.empty(3000, device="tern")  # allocated on the default stream
    ptr = a.data_ptr()
    a.record_stream(s)  # used on s as well
    del a
    with torch.tern.stream(s):
        b = torch.empty(3000, device="tern")  # s has its own pool: a fresh block
        assert b.data_ptr() != ptr
    torch.tern.synchronize()
    c = torch.empty(3000, device="tern")  # record_stream's event completed: reused
    assert c.data_ptr() == ptr


def test_synchronize_calls():
    x = torch.ones(1024, device="tern:1")
    torch.tern.synchronize(1)
    torch.accelerator.synchronize("tern:1")
    torch.tern.synchronize()
    assert x.device.index == 1 and x[0].item() == 1.0


def test_dropped_events_are_reused_as_new_ones():
    """Dropped events are kept for the next record (a collective's Work makes
    one per operation): a reused event shows its new recording only, and two
    live events never share one."""
    idle, busy = torch.tern.Stream(), torch.tern.Stream()
    first = torch.Event(device="tern")
    with torch.tern.stream(idle):
        first.record()
    first.synchronize()
    assert first.query()
    first_id = first.event_id
    del first

    x = torch.randn(1536, 1536, device="tern") / 40.0
    busy.wait_stream(torch.tern.current_stream())
    with torch.tern.stream(busy):
        for _ in range(6):
            x = x @ x  # tens of milliseconds of device work
        second = torch.Event(device="tern")
        second.record()
    assert second.event_id == first_id, "the dropped event was not reused"
    assert not second.query(), "a reused event reported its previous, completed recording"

    live = [torch.Event(device="tern") for _ in range(8)]
    for e in live:
        e.record(idle)
    assert len({e.event_id for e in live} | {second.event_id}) == 9
    second.synchronize()
    assert second.query()
    torch.tern.current_stream().wait_stream(busy)
    assert torch.isfinite(x).all()
