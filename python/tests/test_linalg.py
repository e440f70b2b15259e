"""linalg_solve_triangular runs natively on tern for float32 systems of up to
256 unknowns (the inverse of the triangle from native matmuls,
python/csrc/aten/linalg.cc) and is as accurate as the CPU's substitution
against float64, for every combination of upper, left and unitriangular,
batched and broadcast, with its backward; other cases take the CPU."""

import pytest
import torch

g = torch.Generator().manual_seed(0)


def ut_system(batch, n):
    """The unit lower-triangular system of a chunked gated delta rule (Qwen3-Next)."""
    k = torch.nn.functional.normalize(torch.randn(batch, n, 16, generator=g), dim=-1)
    beta = torch.rand(batch, n, 1, generator=g)
    decay = torch.exp(-torch.rand(batch, n, n, generator=g).tril().cumsum(-1) * 0.1)
    return torch.eye(n) + ((beta * k) @ k.transpose(-1, -2) * decay).tril(-1)


def rel_error(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("n", [1, 3, 64, 100])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular_as_accurate_as_cpu(n, upper, left, unit, fallback_log):
    a = ut_system(3, n)
    if upper:
        a = a.transpose(-1, -2)  # a strided view, as autograd's backward passes
    if not unit:
        a = a + torch.diag_embed(torch.rand(3, n, generator=g) + 0.5)
    # Large values in the other triangle: never read.
    a = a + 100 * (a.tril(-1) if upper else a.triu(1))
    b = torch.randn(3, n, 5, generator=g) if left else torch.randn(3, 5, n, generator=g)
    kw = dict(upper=upper, left=left, unitriangular=unit)
    ref = torch.linalg.solve_triangular(a.double(), b.double(), **kw)
    cpu = torch.linalg.solve_triangular(a, b, **kw)
    got = torch.linalg.solve_triangular(a.to("tern"), b.to("tern"), **kw).cpu()
    assert got.shape == cpu.shape
    assert rel_error(got, ref) <= max(4 * rel_error(cpu, ref), 1e-6)
    out = torch.empty(0, device="tern")
    torch.linalg.solve_triangular(a.to("tern"), b.to("tern"), out=out, **kw)
    assert torch.equal(out.cpu(), got)
    assert fallback_log.get_fallback_ops() == {}


def test_solve_triangular_broadcast_and_backward(fallback_log):
    a = ut_system(2, 64)[:, None]  # [2, 1, 64, 64] against b [2, 3, 64, 8]
    b = torch.randn(2, 3, 64, 8, generator=g)
    weights = torch.randn(2, 3, 64, 8, generator=g)

    def grads(a, b):
        a = a.clone().requires_grad_()
        b = b.clone().requires_grad_()
        x = torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True)
        (x * weights.to(x.device)).sum().backward()
        return x, a.grad, b.grad

    for want, got in zip(grads(a, b), grads(a.to("tern"), b.to("tern"))):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert fallback_log.get_fallback_ops() == {}


def test_solve_triangular_declined_cases_fall_back(fallback_log):
    a = ut_system(1, 4)[0]
    b = torch.randn(4, 2, generator=g)
    # float64 and a mismatched B: the CPU runs it (its result, its error).
    got = torch.linalg.solve_triangular(a.double().to("tern"), b.double().to("tern"), upper=False)
    torch.testing.assert_close(got.cpu(), torch.linalg.solve_triangular(a.double(), b.double(),
                                                                        upper=False))
    assert "aten::linalg_solve_triangular" in fallback_log.get_fallback_ops()
    with pytest.raises(RuntimeError):
        torch.linalg.solve_triangular(a.to("tern"), torch.randn(3, 2).to("tern"), upper=False)
