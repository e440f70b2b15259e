"""Per-device default generators: seed + offset state, reproducible random ops."""

import pytest
import torch
import torch.nn.functional as F

import torch_tern


def draw():
    return [torch.rand(100, device="tern").cpu(), torch.randn(7, 3, device="tern").cpu(),
            torch.empty(50, device="tern").bernoulli_(0.3).cpu(),
            torch.randint(0, 10, (20,), device="tern").cpu(),
            F.dropout(torch.ones(64, device="tern"), 0.5, training=True).cpu()]


def test_manual_seed_reproducible():
    torch.tern.manual_seed(1234)
    first = draw()
    torch.tern.manual_seed(1234)
    second = draw()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    torch.tern.manual_seed(4321)
    third = draw()
    assert not torch.equal(first[0], third[0])
    r = first[0]
    assert bool(((r >= 0) & (r < 1)).all())
    assert set(first[2].unique().tolist()) <= {0.0, 1.0}
    assert set(first[4].unique().tolist()) <= {0.0, 2.0}


def test_independent_of_cpu_generator():
    torch.tern.manual_seed(7)
    a = torch.rand(10, device="tern").cpu()
    torch.tern.manual_seed(7)
    torch.rand(1000)  # CPU draws do not move the tern generator
    b = torch.rand(10, device="tern").cpu()
    assert torch.equal(a, b)


def test_torch_manual_seed_seeds_tern():
    torch.manual_seed(99)
    a = torch.randn(10, device="tern").cpu()
    torch.manual_seed(99)
    b = torch.randn(10, device="tern").cpu()
    assert torch.equal(a, b)
    assert torch.tern.initial_seed() == 99


def test_state_is_seed_and_offset():
    torch.tern.manual_seed(5)
    state = torch.tern.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    words = state.view(torch.int64).tolist()
    assert words == [5, 0]
    torch.rand(10, device="tern")  # reserves 10 counters, rounded up to 12
    assert torch.tern.get_rng_state().view(torch.int64).tolist() == [5, 12]
    x = torch.rand(8, device="tern").cpu()
    torch.tern.set_rng_state(torch.tensor([5, 12], dtype=torch.int64).view(torch.uint8))
    y = torch.rand(8, device="tern").cpu()
    assert torch.equal(x, y)
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.tern.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_explicit_generator_and_devices():
    g = torch.Generator(device="tern")
    g.manual_seed(11)
    a = torch.rand(5, device="tern", generator=g).cpu()
    g.manual_seed(11)
    b = torch.rand(5, device="tern", generator=g).cpu()
    assert torch.equal(a, b)
    torch.tern.manual_seed_all(3)
    on0 = torch.rand(5, device="tern:0").cpu()
    on1 = torch.rand(5, device="tern:1").cpu()
    assert torch.equal(on0, on1)  # same seed and offset on each device
    states = torch.tern.get_rng_state_all()
    assert len(states) == 2


def test_pool_and_direct_draws_agree(fallback_log):
    # Small draws read a pool filled by RANDOM, large ones run RANDOM
    # directly: the numbers are the same Philox stream either way.
    torch.tern.manual_seed(123)
    direct = torch.rand(100000, device="tern").cpu()
    torch.tern.manual_seed(123)
    pooled = torch.cat([torch.rand(10000, device="tern").cpu() for _ in range(10)])
    assert torch.equal(direct, pooled)
    torch.tern.manual_seed(9)
    direct = torch.randn(100000, device="tern").cpu()
    torch.tern.manual_seed(9)
    pooled = torch.cat([torch.randn(25000, device="tern").cpu() for _ in range(4)])
    assert torch.equal(direct, pooled)
    assert fallback_log.get_fallback_ops() == {}


def test_distributions_on_device(fallback_log):
    torch.tern.manual_seed(0)
    u = torch.empty(200000, device="tern").uniform_(-2, 3).cpu()
    assert float(u.min()) >= -2 and float(u.max()) < 3
    assert abs(float(u.mean()) - 0.5) < 0.02
    n = torch.empty(200000, device="tern").normal_(1.5, 2.0).cpu()
    assert abs(float(n.mean()) - 1.5) < 0.02 and abs(float(n.std()) - 2.0) < 0.02
    b = torch.empty(100000, device="tern").bernoulli_(0.3).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(float(b.mean()) - 0.3) < 0.01
    p = torch.full((100000,), 0.8, device="tern")
    assert abs(float(torch.bernoulli(p).cpu().mean()) - 0.8) < 0.01
    e = torch.empty(100000, device="tern").exponential_(4.0).cpu()
    assert float(e.min()) >= 0 and abs(float(e.mean()) - 0.25) < 0.01
    r = torch.randint(3, 9, (100000,), device="tern").cpu()
    assert int(r.min()) == 3 and int(r.max()) == 8
    h = torch.rand(10000, dtype=torch.bfloat16, device="tern").cpu()
    assert float(h.max()) < 1.0
    assert fallback_log.get_fallback_ops() == {}


def test_dropout_mask_and_scale(fallback_log):
    torch.tern.manual_seed(5)
    x = torch.ones(100000, device="tern")
    out, mask = torch.ops.aten.native_dropout(x, 0.25, True)
    out, mask = out.cpu(), mask.cpu()
    assert mask.dtype == torch.bool
    assert abs(float(mask.float().mean()) - 0.75) < 0.01
    assert torch.equal(out, mask.float() / 0.75)
    assert fallback_log.get_fallback_ops() == {}


def test_draws_reuse_executables():
    torch.tern.manual_seed(1)
    torch.rand(64, device="tern")
    F.dropout(torch.ones(64, device="tern"), 0.1)
    before = torch_tern.kernel_cache_info()["misses"]
    for _ in range(20):
        torch.rand(64, device="tern")
        F.dropout(torch.ones(64, device="tern"), 0.1)
    assert torch_tern.kernel_cache_info()["misses"] == before
