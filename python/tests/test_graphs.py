"""Stream capture into tern graphs: torch.tern.graph, TernGraph, pools, and
what capture refuses."""

import pytest
import torch

import torch_tern


def _close(a, b):
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-5)


def test_api_is_shaped_like_torch_cuda():
    assert torch.tern.TernGraph is torch.tern.graphs.TernGraph
    assert torch.tern.CUDAGraph is torch.tern.TernGraph
    assert torch.tern.graph is torch.tern.graphs.graph
    assert not torch.tern.is_current_stream_capturing()
    a, b = torch.tern.graph_pool_handle(), torch.tern.graph_pool_handle()
    assert a != b and a[0] == 0


def test_matmul_add_relu_replays_with_new_inputs():
    torch.manual_seed(0)
    x = torch.randn(8, 16, device="tern")
    w = torch.randn(16, 4, device="tern")
    b = torch.randn(4, device="tern")
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        assert torch.tern.is_current_stream_capturing()
        y = torch.relu(x @ w + b)
    assert not torch.tern.is_current_stream_capturing()
    assert g.command_count() >= 2  # nothing ran yet: the recording holds the work
    for _ in range(3):
        fresh = torch.randn(8, 16)
        x.copy_(fresh)
        g.replay()
        _close(y, torch.relu(fresh @ w.cpu() + b.cpu()))
    g.reset()


def test_mlp_forward_and_many_replays():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).to("tern").eval()
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10)).eval()
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    static_in = torch.zeros(4, 32, device="tern")
    with torch.no_grad():
        model(static_in)  # warm up: build the kernels outside the capture
        g = torch.tern.TernGraph()
        with torch.tern.graph(g):
            static_out = model(static_in) * 2.0 + 1.0
    inputs = [torch.randn(4, 32) for _ in range(20)]
    for batch in inputs:
        static_in.copy_(batch)
        g.replay()
        with torch.no_grad():
            expected = reference(batch) * 2.0 + 1.0
        _close(static_out, expected)
    g.reset()


def test_in_place_update_accumulates_per_replay():
    acc = torch.zeros(100, device="tern")
    step = torch.ones(100, device="tern")
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        acc.add_(step, alpha=0.5)
        acc.mul_(2)
    assert torch.equal(acc.cpu(), torch.zeros(100))  # capture ran nothing
    for _ in range(5):
        g.replay()
    expected = torch.zeros(100)
    for _ in range(5):
        expected = (expected + 0.5) * 2
    _close(acc, expected)
    g.reset()


def test_fill_and_small_host_copies_are_recorded_by_value():
    out = torch.empty(7, dtype=torch.int16, device="tern")
    small = torch.empty(3, device="tern")
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        out.fill_(3)
        small.copy_(torch.tensor([1.0, 2.0, 3.0]))
        cst = torch.tensor([10.0, 20.0, 30.0], device="tern")
        total = small + cst
    out.fill_(0)
    small.zero_()
    g.replay()
    assert out.cpu().tolist() == [3] * 7
    assert total.cpu().tolist() == [11.0, 22.0, 33.0]
    g.reset()


def test_replay_on_another_stream_is_stream_ordered():
    x = torch.ones(1000, device="tern")
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        y = x * 3
    s = torch.tern.Stream()
    s.wait_stream(torch.tern.current_stream())
    with torch.tern.stream(s):
        x.fill_(2)
        g.replay()
        z = y + 1
    torch.tern.current_stream().wait_stream(s)
    assert z.cpu().tolist() == [7.0] * 1000
    g.reset()


def test_two_graphs_share_a_pool():
    pool = torch.tern.graph_pool_handle()
    x = torch.randn(64, 64, device="tern")
    g1, g2 = torch.tern.TernGraph(), torch.tern.TernGraph()
    with torch.tern.graph(g1, pool=pool):
        y1 = x.relu() + 1
    with torch.tern.graph(g2, pool=g1.pool()):
        y2 = y1 * 2
    assert g1.pool() == g2.pool() == pool
    fresh = torch.randn(64, 64)
    x.copy_(fresh)
    g1.replay()
    g2.replay()
    _close(y2, (fresh.relu() + 1) * 2)
    g1.reset()
    g2.replay()  # the pool lives while g2 does
    _close(y2, (fresh.relu() + 1) * 2)
    g2.reset()


def _usable_afterwards():
    assert not torch.tern.is_current_stream_capturing()
    a = torch.arange(6.0, device="tern")
    assert (a * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    torch.tern.synchronize()


@pytest.mark.parametrize("forbidden, match", [
    (lambda x: x.cpu(), "device-to-host copy"),
    (lambda x: x.sum().item(), "device-to-host copy"),
    (lambda x: torch.tern.synchronize(), r"torch\.tern\.synchronize\(\)"),
    (lambda x: torch.tern.current_stream().synchronize(), r"Stream\.synchronize\(\)"),
    (lambda x: torch.rand(3, device="tern"), "random numbers"),
    (lambda x: torch.tern.current_stream().record_event(), "recording an event"),
])
def test_forbidden_operations_end_the_capture_clearly(forbidden, match):
    x = torch.ones(4, device="tern")
    g = torch.tern.TernGraph()
    with pytest.raises(RuntimeError, match=match) as info:
        with torch.tern.graph(g):
            y = x + 1
            forbidden(y)
    assert "being captured into a tern graph" in str(info.value)
    assert "capture was ended" in str(info.value)
    with pytest.raises(RuntimeError):
        g.replay()
    _usable_afterwards()
    g.reset()
    # A fresh capture on the same graph works after reset.
    with torch.tern.graph(g):
        z = x * 5
    g.replay()
    assert z.cpu().tolist() == [5.0] * 4
    g.reset()


def test_capture_end_reports_an_invalidated_capture():
    x = torch.ones(4, device="tern")
    g = torch.tern.TernGraph()
    s = torch.tern.Stream()
    with torch.tern.stream(s):
        g.capture_begin()
        x.add_(1)
        with pytest.raises(RuntimeError, match="device-to-host copy"):
            x.tolist()
        with pytest.raises(RuntimeError, match="capture was invalidated"):
            g.capture_end()
    g.reset()
    _usable_afterwards()


def test_cpu_fallback_is_refused_naming_the_operator(fallback_log):
    x = torch.full((4,), 3.0, device="tern")
    g = torch.tern.TernGraph()
    with pytest.raises(RuntimeError, match=r"operator 'aten::lgamma\.out' .*CPU fallback"):
        with torch.tern.graph(g):
            (x + 1).lgamma()
    g.reset()
    _usable_afterwards()
    # A native op that declines (tern has no int16 add) takes the same path.
    d = torch.ones(4, dtype=torch.int16, device="tern")
    with pytest.raises(RuntimeError, match=r"operator 'aten::add\.out'"):
        with torch.tern.graph(g):
            d + d
    g.reset()
    _usable_afterwards()


def test_reset_frees_the_graph_memory():
    import gc

    gc.collect()
    torch.tern.synchronize()
    torch.tern.empty_cache()
    x = torch.randn(256, 256, device="tern")
    baseline = torch.tern.memory_allocated()
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        y = (x @ x).relu()
        tmp = y + 1  # freed during the capture: held by the graph's pool
        out = tmp.sum(dim=0)
        del tmp
    g.replay()
    assert torch.tern.memory_allocated() > baseline
    del y, out
    g.reset()
    assert torch.tern.memory_allocated() == baseline
    reserved = torch.tern.memory_reserved()
    torch.tern.empty_cache()
    assert torch.tern.memory_reserved() < reserved
    # After reset, the cached blocks serve ordinary allocations again.
    z = torch.ones(256, 256, device="tern") * 2
    assert z.sum().item() == 2 * 256 * 256


def test_blocks_freed_during_capture_are_not_reused_outside():
    x = torch.ones(1024, device="tern")
    before = torch.full((1024,), 5.0, device="tern")  # allocated outside the capture
    before_address = before.data_ptr()
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        t = x * 2
        address = t.data_ptr()
        y = t + before
        del t, before  # freed during the capture: both stay with the graph
    # The capture's freed block stays with the graph.
    others = [torch.empty(1024, device="tern") for _ in range(4)]
    with torch.tern.stream(torch.tern.graphs.graph.default_capture_stream):
        others += [torch.empty(1024, device="tern") for _ in range(4)]
    assert all(o.data_ptr() not in (address, before_address) for o in others)
    snapshot = {s["address"]: s["blocks"][0]["state"] for s in torch.tern.memory_snapshot()}
    assert snapshot[before_address] == "graph_pool_deferred"
    assert snapshot[address] == "graph_pool_inactive"
    g.replay()
    assert y.cpu().tolist() == [7.0] * 1024
    g.reset()
    snapshot = {s["address"]: s["blocks"][0]["state"] for s in torch.tern.memory_snapshot()}
    assert snapshot[before_address] == snapshot[address] == "inactive"


def test_kernel_cache_eviction_keeps_the_graph_executables():
    x = torch.randn(16, device="tern")
    g = torch.tern.TernGraph()
    with torch.tern.graph(g):
        y = torch.tanh(x) * 3 - 1
    torch_tern._C._kernel_cache_clear()  # unloads every cached executable but pinned ones
    fresh = torch.randn(16)
    x.copy_(fresh)
    g.replay()
    _close(y, torch.tanh(fresh) * 3 - 1)
    g.reset()


def test_make_graphed_callables_trains_like_eager():
    torch.manual_seed(2)
    eager = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    graphed = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 4)).to("tern")
    graphed.load_state_dict({k: v.to("tern") for k, v in eager.state_dict().items()})
    sample = torch.randn(8, 16, device="tern", requires_grad=True)
    graphed = torch.tern.make_graphed_callables(graphed, (sample,))
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(8, 16)
        xt = x.to("tern").requires_grad_()
        xe = x.clone().requires_grad_()
        loss_e = eager(xe).square().mean()
        loss_g = graphed(xt).square().mean()
        loss_e.backward()
        loss_g.backward()
        _close(loss_g.detach(), loss_e.detach())
        _close(xt.grad, xe.grad)
        for pe, pg in zip(eager.parameters(), graphed.parameters()):
            _close(pg.grad, pe.grad)
        opt_e.step()
        opt_g.step()
        opt_e.zero_grad()
        opt_g.zero_grad()


def test_dropping_the_graph_releases_it_like_reset():
    import gc

    gc.collect()  # earlier tests' cycles (graphed callables) go first
    torch.tern.synchronize()
    x = torch.randn(128, 128, device="tern")
    baseline = torch.tern.memory_allocated()
    g = torch.tern.TernGraph()
    g.capture_begin(pool=torch.tern.graph_pool_handle())  # on the current (default) stream
    y = (x * 2).sum(dim=1)
    g.capture_end()
    g.replay()
    _close(y, (x.cpu() * 2).sum(dim=1))
    del g, y
    gc.collect()
    assert torch.tern.memory_allocated() == baseline
    assert "graph_pool" not in str([s["blocks"][0]["state"] for s in torch.tern.memory_snapshot()])


def test_make_graphed_callables_of_a_function():
    w = torch.randn(8, 8, device="tern", requires_grad=True)

    def fn(a):
        return torch.tanh(a @ w), a.sum()

    sample = torch.randn(4, 8, device="tern", requires_grad=True)
    graphed = torch.tern.make_graphed_callables(fn, (sample,))
    a = torch.randn(4, 8, device="tern", requires_grad=True)
    out, total = graphed(a)
    (out.sum() + total).backward()
    a_cpu = a.detach().cpu().requires_grad_()
    w_cpu = w.detach().cpu().requires_grad_()
    out_cpu = torch.tanh(a_cpu @ w_cpu)
    (out_cpu.sum() + a_cpu.sum()).backward()
    _close(out, out_cpu)
    _close(a.grad, a_cpu.grad)
