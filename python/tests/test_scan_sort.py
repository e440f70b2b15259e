"""cumsum, cumprod, cummax, cummin, sort, argsort and topk run natively on tern (the SCAN, SORT
and TOPK instructions) and match the CPU: values, indices, dtypes, dims,
layouts, NaN and ties, and their backward functions, with no CPU fallback.
flip and roll (reordering copies) likewise."""

import pytest
import torch

g = torch.Generator().manual_seed(0)


def tern(x):
    return x.to("tern")


def rand(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def ties(shape, dtype):
    """Few distinct values (many ties); floats also get NaN, inf, -0.0."""
    x = torch.randint(-3, 4, shape, generator=g).to(torch.float32)
    if dtype.is_floating_point:
        x[x == 3] = float("nan")
        x[x == -3] = float("inf")
        x[(x == 0) & (torch.rand(shape, generator=g) > 0.5)] = -0.0
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


SCAN_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
               torch.int8, torch.bool]


@pytest.mark.parametrize("dtype", SCAN_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_cumprod_match_cpu(dtype, dim, fallback_log):
    x = rand((6, 33), dtype)
    for fn in (torch.cumsum, torch.cumprod):
        want = fn(x, dim)
        got = fn(tern(x), dim)
        assert got.dtype == want.dtype  # int and bool promote to int64
        # Same accumulation as the CPU (f64 for f32, f32 for bf16/f16): same bits.
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
        # Non-contiguous input and the method form.
        xt = x.t()
        torch.testing.assert_close(getattr(tern(x).t(), fn.__name__)(dim).cpu(),
                                   getattr(xt, fn.__name__)(dim), rtol=0, atol=0, equal_nan=True)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", [d for d in SCAN_DTYPES if d != torch.bool], ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin_match_cpu_exactly(op, dtype, dim, fallback_log):
    # Ties (the CPU moves the index to the latest equal value), NaN (it
    # sticks, the index following each later NaN), infinities.
    x = ties((6, 9, 4), dtype)
    want = getattr(x, op)(dim)
    got = getattr(tern(x), op)(dim)
    torch.testing.assert_close(got.values.cpu(), want.values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got.indices.cpu(), want.indices)
    # out= forms, a strided self, rank 0 and an empty self.
    values, indices = tern(torch.empty(0, dtype=dtype)), tern(torch.empty(0, dtype=torch.long))
    getattr(torch, op)(tern(x).transpose(0, 2), dim, out=(values, indices))
    want_t = getattr(x.transpose(0, 2), op)(dim)
    torch.testing.assert_close(values.cpu(), want_t.values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices.cpu(), want_t.indices)
    scalar = getattr(tern(x[0, 0, 0]), op)(0)
    assert scalar.indices.item() == 0
    assert getattr(tern(x[:0]), op)(dim).values.shape == x[:0].shape
    assert fallback_log.get_fallback_ops() == {}


def test_cumsum_dtype_argument_out_inplace_and_shapes(fallback_log):
    x = rand((4, 5), torch.bfloat16)
    torch.testing.assert_close(torch.cumsum(tern(x), 1, dtype=torch.float32).cpu(),
                               torch.cumsum(x, 1, dtype=torch.float32), rtol=0, atol=0)
    i = rand((4, 5), torch.int32)
    assert torch.equal(torch.cumsum(tern(i), 0, dtype=torch.int32).cpu(),
                       torch.cumsum(i, 0, dtype=torch.int32))
    out = torch.empty(0, device="tern")
    torch.cumsum(tern(x.float()), -1, out=out)
    torch.testing.assert_close(out.cpu(), torch.cumsum(x.float(), -1), rtol=0, atol=0)
    y = tern(x.float())
    y.cumsum_(0)
    torch.testing.assert_close(y.cpu(), x.float().cumsum(0), rtol=0, atol=0)
    for shape, dim in (((), 0), ((0,), 0), ((3, 0), 1), ((3, 1), 1), ((1,), -1)):
        z = rand(shape, torch.float32)
        assert torch.equal(tern(z).cumsum(dim).cpu(), z.cumsum(dim))
        assert torch.equal(tern(z).cumprod(dim).cpu(), z.cumprod(dim))
    # i64 stays exact beyond 2^53.
    big = torch.full((7,), 2**58 + 1, dtype=torch.int64)
    assert torch.equal(tern(big).cumsum(0).cpu(), big.cumsum(0))
    assert fallback_log.get_fallback_ops() == {}


def test_position_ids_from_attention_mask(fallback_log):
    # The pattern that made cumsum the most frequent fallback in transformers.
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    want = mask.long().cumsum(-1) - 1
    got = tern(mask).long().cumsum(-1) - 1
    assert torch.equal(got.cpu(), want)
    assert torch.equal(tern(mask.bool()).cumsum(-1).cpu(), mask.bool().cumsum(-1))
    assert fallback_log.get_fallback_ops() == {}


SORT_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
               torch.bool]


@pytest.mark.parametrize("dtype", SORT_DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_matches_cpu_exactly(dtype, dim, descending, fallback_log):
    x = ties((9, 40), dtype)
    want = torch.sort(x, dim=dim, descending=descending, stable=True)
    for got in (torch.sort(tern(x), dim=dim, descending=descending, stable=True),
                tern(x).sort(stable=True, dim=dim, descending=descending),
                torch.sort(tern(x.t()).t(), dim=dim, descending=descending, stable=True)):
        assert torch.equal(got.indices.cpu(), want.indices)
        torch.testing.assert_close(got.values.cpu(), want.values, rtol=0, atol=0, equal_nan=True)
    # Unstable forms reach the same (stable) kernel: a valid sort.
    assert torch.equal(torch.argsort(tern(x), dim=dim, descending=descending, stable=True).cpu(),
                       want.indices)
    values, indices = torch.sort(tern(x), dim, descending)
    torch.testing.assert_close(values.cpu(), want.values, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(torch.gather(x, dim, indices.cpu()), want.values, rtol=0, atol=0,
                               equal_nan=True)
    assert torch.equal(torch.argsort(tern(x), dim=dim, descending=descending).cpu(), indices.cpu())
    assert fallback_log.get_fallback_ops() == {}


def test_sort_shapes_and_nan_order(fallback_log):
    x = torch.tensor([2.0, float("nan"), -1.0, float("-inf"), float("nan"), 0.0])
    for descending in (False, True):
        want = torch.sort(x, descending=descending, stable=True)
        got = torch.sort(tern(x), descending=descending, stable=True)
        assert torch.equal(got.indices.cpu(), want.indices)
    for shape in ((), (0,), (3, 0), (3, 1)):
        z = rand(shape, torch.float32)
        want = torch.sort(z, stable=True)
        got = torch.sort(tern(z), stable=True)
        assert torch.equal(got.values.cpu(), want.values)
        assert torch.equal(got.indices.cpu(), want.indices)
    torch.testing.assert_close(torch.msort(tern(x)).cpu(), torch.msort(x), rtol=0, atol=0,
                               equal_nan=True)
    assert fallback_log.get_fallback_ops() == {}


def check_topk(x, k, dim, largest, sorted_=True):
    values, indices = torch.topk(tern(x), k, dim=dim, largest=largest, sorted=sorted_)
    values, indices = values.cpu(), indices.cpu()
    want = torch.topk(x, k, dim=dim, largest=largest, sorted=True).values
    if not sorted_:  # any order is valid: compare in sorted order
        values = values.sort(dim=dim, descending=largest, stable=True).values
    torch.testing.assert_close(values, want, rtol=0, atol=0, equal_nan=True)
    # A valid topk: the indices pick these values, each position at most once.
    picked = torch.gather(x, dim, indices).sort(dim=dim, descending=largest, stable=True).values
    torch.testing.assert_close(picked, want, rtol=0, atol=0, equal_nan=True)
    for line in indices.movedim(dim, -1).reshape(-1, k):
        assert len(set(line.tolist())) == k


@pytest.mark.parametrize("dtype", [d for d in SORT_DTYPES if d != torch.bool], ids=str)
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_cpu(dtype, dim, largest, fallback_log):
    x = ties((12, 40), dtype)
    for k in (1, 2, 5, x.shape[dim]):
        check_topk(x, k, dim, largest)
    check_topk(x, 3, dim, largest, sorted_=False)
    check_topk(rand((12, 40), dtype), 4, dim, largest)
    assert fallback_log.get_fallback_ops() == {}


def test_topk_router_shape_and_edges(fallback_log):
    logits = torch.randn(512, 64, generator=g)
    check_topk(logits, 2, -1, True)
    z = torch.randn(3, 5, generator=g)
    values, indices = torch.topk(tern(z), 0, dim=1)
    assert values.shape == (3, 0) and indices.shape == (3, 0)
    s = torch.tensor(1.5)
    values, indices = torch.topk(tern(s), 1)
    assert values.cpu() == s and indices.cpu() == 0
    assert fallback_log.get_fallback_ops() == {}


def grad_of(fn, x):
    x = x.detach().clone().requires_grad_()
    y = fn(x)
    weights = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(y.device)
    (y * weights).sum().backward()
    return x.grad


# PyTorch's backward of sort and topk (value_selecting_reduction_backward)
# scatters the gradient with aten::scatter, which has no native kernel yet.
# sort's and topk's backward scatter the gradient (scatter.src, native on
# tern since the SCATTER_ALONG_AXIS instruction): no fallback remains.
BACKWARD_FALLBACKS = set()


@pytest.mark.parametrize("name,fn,allowed", [
    ("cumsum", lambda x: x.cumsum(1), set()),
    ("cumprod", lambda x: x.cumprod(-1), set()),
    ("sort", lambda x: x.sort(dim=1, descending=True, stable=True).values, BACKWARD_FALLBACKS),
    ("topk", lambda x: x.topk(3, dim=-1).values, BACKWARD_FALLBACKS),
    ("topk_dim0", lambda x: x.topk(2, dim=0, largest=False).values, BACKWARD_FALLBACKS),
    ("cummax", lambda x: x.cummax(1).values, set()),
    ("cummin", lambda x: x.cummin(0).values, set()),
])
def test_backward_matches_cpu(name, fn, allowed, fallback_log):
    x = torch.randn(5, 8, generator=g)
    want = grad_of(fn, x)
    got = grad_of(fn, tern(x))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert set(fallback_log.get_fallback_ops()) <= allowed, name


@pytest.mark.parametrize("dims", [(0,), (1,), (-1, 0), (), (2, 0, 1)])
def test_flip_matches_cpu(dims, fallback_log):
    x = torch.randn(3, 4, 5, generator=g)
    assert torch.equal(torch.flip(tern(x), dims).cpu(), torch.flip(x, dims))
    assert torch.equal(torch.flip(tern(x).transpose(0, 2), dims).cpu(),
                       torch.flip(x.transpose(0, 2), dims))
    i = torch.arange(6).reshape(2, 3)
    assert torch.equal(torch.flip(tern(i), (1,)).cpu(), torch.flip(i, (1,)))
    assert torch.equal(torch.flip(tern(torch.tensor(2.0)), (0,)).cpu(), torch.tensor(2.0))
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("shifts,dims", [
    (1, 0), (-2, 1), (7, -1), (5, 2), (0, 1), ((1, -3), (0, 2)), ((2, 1, -1), (2, 0, 1)),
    (3, None), (-13, None), (60, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool],
                         ids=str)
def test_roll_matches_cpu(shifts, dims, dtype, fallback_log):
    x = rand((3, 4, 5), dtype)
    args = (shifts,) if dims is None else (shifts, dims)
    assert torch.equal(torch.roll(tern(x), *args).cpu(), torch.roll(x, *args))
    # A non-contiguous input (a flattened roll copies it first).
    xt = x.transpose(0, 2)
    assert torch.equal(torch.roll(tern(xt), *args).cpu(), torch.roll(xt, *args))
    assert fallback_log.get_fallback_ops() == {}


def test_roll_backward_and_edge_cases(fallback_log):
    x = torch.randn(4, 6, generator=g, requires_grad=True)
    xt = tern(x.detach()).requires_grad_()
    w = torch.randn(4, 6, generator=g)
    (torch.roll(x, (1, -2), (0, 1)) * w).sum().backward()
    (torch.roll(xt, (1, -2), (0, 1)) * tern(w)).sum().backward()
    assert torch.equal(xt.grad.cpu(), x.grad)
    empty = torch.empty(0, 3)
    assert torch.roll(tern(empty), 2, 0).shape == (0, 3)
    scalar = torch.tensor(3.0)
    assert torch.equal(torch.roll(tern(scalar), 1).cpu(), scalar)
    assert fallback_log.get_fallback_ops() == {}
    with pytest.raises(RuntimeError):
        torch.roll(tern(x.detach()), (1, 2), (0,))  # as on the CPU: shifts and dims differ
