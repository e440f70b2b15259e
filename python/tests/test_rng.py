"""Per-device default generators: seed + offset state, reproducible random ops."""

import pytest
import torch
import torch.nn.functional as F


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
