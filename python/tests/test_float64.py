"""float64 tensors on tern: copies and casts (.double(), .float()), the
arithmetic and comparisons the ISA's f64 functions cover, and the unary
functions neg, abs, reciprocal, sqrt, rsqrt, exp, log, sin and cos run on the device,
exactly as on the CPU; GradScaler's step (which takes the reciprocal of its
scale in float64) takes no CPU fallback. Everything else on float64 still
takes the logged fallback."""

import math

import pytest
import torch

import torch_tern

g = torch.Generator().manual_seed(0)


def tern(x):
    return x.to("tern")


def test_casts_and_copies_stay_on_the_device(fallback_log):
    x = torch.randn(5, 7, generator=g)
    d = tern(x).double()
    assert d.dtype == torch.float64 and d.device.type == "tern"
    assert torch.equal(d.cpu(), x.double())
    assert torch.equal(d.float().cpu(), x)
    assert torch.equal(d.t().contiguous().cpu(), x.double().t().contiguous())
    big = torch.tensor([2.0**53 + 1, -(2.0**60)], dtype=torch.float64)
    assert torch.equal(tern(big).long().cpu(), big.long())
    assert torch.equal(tern(big).long().double().cpu(), big.long().double())
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("op", ["neg", "abs", "reciprocal", "sqrt", "rsqrt", "exp", "log", "sin",
                                "cos"])
def test_unary_matches_cpu(op, fallback_log):
    x = torch.rand(64, generator=g, dtype=torch.float64) * 10 + 1e-3
    x[0] = 1.0 / 3.0
    fn = getattr(torch, op)
    # IEEE operations are exact; exp, log, sin, cos and rsqrt within a few units in the
    # last place (the CPU's vectorised versions are not the C library's).
    tol = {} if op in ("neg", "abs", "reciprocal", "sqrt") else {"rtol": 1e-15, "atol": 0}
    want = fn(x)
    if op == "sqrt":
        # IEEE's correctly rounded square root: PyTorch's vectorised CPU sqrt
        # is one unit in the last place off for some inputs on some CPUs
        # (seen on an AMD EPYC), so the reference is the C library's.
        want = torch.tensor([math.sqrt(v) for v in x.tolist()], dtype=torch.float64)
        torch.testing.assert_close(fn(x), want, rtol=4.5e-16, atol=0)
    torch.testing.assert_close(fn(tern(x)).cpu(), want, **(tol or {"rtol": 0, "atol": 0}))
    out = torch.empty(0, dtype=torch.float64, device="tern")
    fn(tern(x), out=out)
    torch.testing.assert_close(out.cpu(), want, **(tol or {"rtol": 0, "atol": 0}))
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "ge"])
def test_binary_matches_cpu_exactly(op, fallback_log):
    a = torch.randn(6, 5, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64)  # broadcast
    a[0, 0] = float("nan")
    fn = getattr(torch, op)
    torch.testing.assert_close(fn(tern(a), tern(b)).cpu(), fn(a, b), rtol=0, atol=0,
                               equal_nan=True)
    assert fallback_log.get_fallback_ops() == {}


def test_python_numbers_are_float64_arguments(fallback_log):
    # A model's float64 rotary angles: `emb.cos() * attention_scaling`.
    a = torch.randn(4, 6, generator=g, dtype=torch.float64)
    t = tern(a)
    for scale in (0.7071067811865476, 3, 1e-300):
        assert torch.equal((t * scale).cpu(), a * scale)
        assert torch.equal((scale / t).cpu(), scale / a)
        assert torch.equal((t - scale).cpu(), a - scale)
        assert torch.equal((t > scale).cpu(), a > scale)
    t.mul_(2.5)
    assert torch.equal(t.cpu(), a * 2.5)
    before = torch_tern.kernel_cache_info()["misses"]
    for scale in (0.25, 0.5, 0.75):  # a new value builds nothing
        assert torch.equal((tern(a) * scale).cpu(), a * scale)
    assert torch_tern.kernel_cache_info()["misses"] == before
    assert fallback_log.get_fallback_ops() == {}
    # Not an f64 function of the ISA: declined at once (no refused program), the CPU runs it.
    failures = torch_tern.kernel_cache_info()["failures"]
    assert torch.equal(torch.fmod(tern(a), 1.5).cpu(), torch.fmod(a, 1.5))
    assert torch_tern.kernel_cache_info()["failures"] == failures
    assert set(fallback_log.get_fallback_ops()) == {"aten::fmod.Tensor_out"}


def test_in_place_and_other_ops_fall_back(fallback_log):
    a = torch.randn(8, generator=g, dtype=torch.float64)
    t = tern(a)
    t.mul_(tern(a))
    assert torch.equal(t.cpu(), a * a)
    assert fallback_log.get_fallback_ops() == {}
    # Not an f64 function of the ISA: the CPU fallback, as before.
    assert torch.allclose(torch.tanh(tern(a)).cpu(), torch.tanh(a), rtol=0, atol=0)
    assert "aten::tanh.out" in fallback_log.get_fallback_ops()


def test_grad_scaler_step_takes_no_fallback(fallback_log):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to("tern")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("tern", init_scale=2.0**10)
    cpu = torch.nn.Linear(8, 4)
    cpu.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    cpu_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x = torch.randn(16, 8, generator=g)
    for _ in range(3):
        for m, o, s, xx in ((model, opt, scaler, tern(x)), (cpu, cpu_opt, cpu_scaler, x)):
            o.zero_grad()
            s.scale(m(xx).square().mean()).backward()
            s.step(o)
            s.update()
    assert fallback_log.get_fallback_ops() == {}
    for p, q in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
