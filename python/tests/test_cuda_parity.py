"""torch.tern next to torch.cuda: the names docs/torch.md lists, device
properties as attributes, the per-process memory fraction, the allocator's
snapshot and summary, utilization, and the amp / memory / random submodules."""

import os
import re
import time

import pytest
import torch

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "torch.md")


def _parity_table() -> dict[str, str]:
    """name -> status from docs/torch.md's table of torch.cuda's names."""
    text = open(DOCS, encoding="utf-8").read()
    section = text.split("### torch.tern next to torch.cuda", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([A-Za-z_0-9.]+)`\s*\|\s*(done|not applicable|planned)\s*\|", line)
        if m:
            table[m.group(1)] = m.group(2)
    return table


def test_every_torch_cuda_name_is_listed_with_a_status():
    table = _parity_table()
    missing = sorted(set(torch.cuda.__all__) - set(table))
    assert not missing, f"docs/torch.md does not list these torch.cuda names: {missing}"
    not_there = sorted(n for n, status in table.items()
                       if status == "done" and not hasattr(torch.tern, n))
    assert not not_there, f"listed as done but missing on torch.tern: {not_there}"


def test_device_properties_are_attributes():
    props = torch.tern.get_device_properties(0)
    assert props.core_count == 2 and props.total_memory == 2 << 30
    assert props.multi_processor_count == props.core_count
    assert props.driver == "sim" and props.arch == "trn2"
    assert (props.major, props.minor) == torch.tern.get_device_capability(0) == (2, 0)
    assert torch.tern.get_device_name(1) == props.name
    assert "trn2" in torch.tern.get_arch_list()
    assert "total_memory=2048MB" in repr(props)
    assert len(props.uuid) == 36 and props.uuid != torch.tern.get_device_properties(1).uuid
    assert props.bus_id.startswith("sim:") and props.driver_version.startswith("sim ")
    with pytest.raises(AttributeError):
        props.no_such_property


def test_memory_fraction_caps_the_caching_allocator():
    torch.tern.empty_cache()
    mib = 1 << 20
    assert torch.tern.get_per_process_memory_fraction(0) == 1.0
    torch.tern.set_per_process_memory_fraction(24 * mib / (2 << 30), 0)  # 24 MiB of 2 GiB
    try:
        a = torch.empty(16 * mib // 4, device="tern:0")
        with pytest.raises(torch.OutOfMemoryError, match="set_per_process_memory_fraction"):
            torch.empty(16 * mib // 4, device="tern:0")
        retries = torch.tern.memory_stats(0)["num_alloc_retries"]
        del a  # cached now: the next request of another size class must release it
        b = torch.empty(12 * mib // 4, device="tern:0")
        assert torch.tern.memory_stats(0)["num_alloc_retries"] == retries + 1
        assert torch.tern.memory_reserved(0) <= 24 * mib
        del b
        with pytest.raises(RuntimeError, match=r"in \(0, 1\]"):
            torch.tern.set_per_process_memory_fraction(1.5, 0)
    finally:
        torch.tern.set_per_process_memory_fraction(1.0, 0)
    torch.empty(64 * mib // 4, device="tern:0")  # no cap any more


def test_memory_snapshot_and_summary():
    torch.tern.empty_cache()
    x = torch.ones(1000, device="tern:0")
    y = torch.ones(300_000, device="tern:0")
    del y
    segments = torch.tern.memory_snapshot()
    by_address = {s["address"]: s for s in segments}
    live = by_address[x.data_ptr()]
    assert live["device"] == 0 and live["blocks"][0]["state"] == "active_allocated"
    assert live["requested_size"] == 4000 and live["total_size"] >= 4000
    cached = [s for s in segments if s["blocks"][0]["state"] == "inactive"]
    assert any(s["total_size"] >= 1_200_000 for s in cached)
    summary = torch.tern.memory_summary(0)
    assert "Allocated memory" in summary and "Reserved memory" in summary
    assert torch.tern.memory.memory_summary is torch.tern.memory_summary
    del x


def test_utilization_sees_work():
    torch.tern.utilization(0)  # starts a sample
    time.sleep(0.05)
    idle = torch.tern.utilization(0)
    a = torch.randn(512, 512, device="tern:0")
    torch.tern.utilization(0)
    start = time.monotonic()
    while time.monotonic() - start < 0.3:
        for _ in range(20):
            a = (a @ a).tanh()
        torch.tern.synchronize(0)
    busy = torch.tern.utilization(0)
    assert 0 <= idle <= 100 and 0 <= busy <= 100
    assert busy > idle and busy >= 20


def test_amp_submodule_autocasts_and_scales():
    model = torch.nn.Linear(8, 4).to("tern")
    x = torch.randn(16, 8, device="tern")
    with torch.tern.amp.autocast():
        out = model(x)
    assert out.dtype == torch.get_autocast_dtype("tern")
    scaler = torch.tern.amp.GradScaler(init_scale=256.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().cpu().clone()
    with torch.tern.amp.autocast():
        loss = model(x).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 256.0  # finite gradients: no back-off
    assert not torch.equal(before, model.weight.detach().cpu())


def test_random_submodule():
    torch.tern.random.manual_seed(123)
    a = torch.rand(4, device="tern")
    state = torch.tern.random.get_rng_state()
    b = torch.rand(4, device="tern")
    torch.tern.random.set_rng_state(state)
    assert torch.equal(b.cpu(), torch.rand(4, device="tern").cpu())
    assert not torch.equal(a.cpu(), b.cpu())
    assert torch.tern.random.initial_seed() == 123
