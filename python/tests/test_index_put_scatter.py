"""index_put_ without accumulate (x[idx] = v, x[mask] = v) and scatter with a
src tensor run natively on tern (the SCATTER, SCATTER_ALONG_AXIS, WHERE, SCAN
and GATHER instructions) and match the CPU exactly: every dtype models use,
duplicate indices (the last write wins, as the CPU's serial loops), negative
indices, empty indices, boolean masks, slices before the index, with no CPU
fallback; out-of-range indices raise, and layouts the kernels decline still
run through the CPU."""

import pytest
import torch

g = torch.Generator().manual_seed(0)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]


def rand(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def tern(x):
    return x.to("tern")


def check_index_put(x, indices, values, fallback_log):
    want = torch.ops.aten.index_put_(x.clone(), list(indices), values)
    dev = tern(x)
    got = torch.ops.aten.index_put_(dev, [None if i is None else tern(i) for i in indices],
                                    tern(values))
    assert got.data_ptr() == dev.data_ptr()  # in place
    assert torch.equal(got.cpu(), want)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_put_integer_duplicates_and_negative(dtype, fallback_log):
    x = rand((6, 5), dtype)
    # Duplicates (2 and -4 name the same row; 5 twice): the last write wins.
    rows = torch.tensor([2, 5, -4, 0, 5, -1])
    check_index_put(x, (rows,), rand((6, 5), dtype), fallback_log)
    # An index among slices (x[:, cols] = v), i32 indices, values broadcast.
    cols = torch.tensor([[4, -5], [1, 4]], dtype=torch.int32)
    check_index_put(x, (None, cols), rand((6, 1, 2), dtype), fallback_log)
    check_index_put(x, (None, cols), rand((), dtype), fallback_log)
    # A 0-dim index and an empty one.
    check_index_put(x, (torch.tensor(-2),), rand((5,), dtype), fallback_log)
    check_index_put(x, (torch.tensor([], dtype=torch.int64),), rand((0, 5), dtype), fallback_log)


def test_index_put_through_python_indexing(fallback_log):
    x = torch.randn(4, 6, 3, generator=g)
    idx = torch.tensor([5, 0, 5, 2])
    v = torch.randn(4, 4, 3, generator=g)
    want = x.clone()
    want[:, idx] = v
    want[..., idx, 1] = 7.0
    got = tern(x)
    got[:, tern(idx)] = tern(v)
    got[..., tern(idx), 1] = 7.0
    assert torch.equal(got.cpu(), want)
    # A non-contiguous target (a transposed view) is written through its strides.
    base = torch.zeros(5, 4)
    want_t = base.clone()
    want_t.t()[torch.tensor([1, 3])] = torch.arange(10.0).reshape(2, 5)
    got_t = tern(base)
    got_t.t()[tern(torch.tensor([1, 3]))] = tern(torch.arange(10.0).reshape(2, 5))
    assert torch.equal(got_t.cpu(), want_t)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_put_boolean_mask(dtype, fallback_log):
    x = rand((4, 3, 5), dtype)
    mask = torch.rand(4, 3, generator=g) > 0.4
    count = int(mask.sum())
    # A value for every selected element: rows gathered by the mask's count.
    check_index_put(x, (mask,), rand((count, 5), dtype), fallback_log)
    # A value broadcast over the selected elements: no synchronisation.
    check_index_put(x, (mask,), rand((), dtype), fallback_log)
    check_index_put(x, (mask,), rand((5,), dtype), fallback_log)
    # A mask after a slice, and one over the last dims.
    inner = torch.rand(3, 5, generator=g) > 0.5
    check_index_put(x, (None, inner), rand((1,), dtype), fallback_log)
    check_index_put(x, (None, inner), rand((4, int(inner.sum())), dtype), fallback_log)
    # Nothing selected.
    none = torch.zeros(4, 3, dtype=torch.bool)
    check_index_put(x, (none,), rand((0, 5), dtype), fallback_log)


def test_masked_assignment_in_python(fallback_log):
    x = torch.randn(3, 8, generator=g)
    want = x.clone()
    want[want < 0] = 0.0
    want[want > 1] = torch.arange(int((want > 1).sum()), dtype=torch.float32)
    got = tern(x)
    got[got < 0] = 0.0
    got[got > 1] = tern(torch.arange(int((got > 1).sum().cpu()), dtype=torch.float32))
    assert torch.equal(got.cpu(), want)
    assert fallback_log.get_fallback_ops() == {}


def test_index_put_errors_and_declined_layouts(fallback_log):
    x = tern(torch.zeros(4, 3))
    with pytest.raises(RuntimeError, match="out of range"):
        x[tern(torch.tensor([0, 4]))] = tern(torch.ones(2, 3))
        x.cpu()
    # The stream stays usable, and nothing was written.
    assert torch.equal(x.cpu(), torch.zeros(4, 3))
    # A mask whose count disagrees with the values: the CPU's error.
    mask = tern(torch.tensor([True, False, True, True]))
    with pytest.raises((RuntimeError, IndexError), match="shape mismatch"):
        x[mask] = tern(torch.ones(2, 3))
    # Two index tensors: the CPU runs it (declined, not a crash).
    fallback_log.clear_op_tracking()
    want = torch.zeros(4, 3)
    want[torch.tensor([0, 1]), torch.tensor([2, 2])] = 5.0
    y = tern(torch.zeros(4, 3))
    y[tern(torch.tensor([0, 1])), tern(torch.tensor([2, 2]))] = 5.0
    assert torch.equal(y.cpu(), want)
    assert "aten::_index_put_impl_" in fallback_log.get_fallback_ops()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_src_matches_cpu(dtype, dim, fallback_log):
    x = rand((5, 6, 4), dtype)
    shape = [4, 5, 3]
    shape[dim] = 9  # more positions than the axis holds: duplicates in every line
    size = x.shape[dim]
    index = torch.randint(0, size, shape, generator=g)
    src = rand((9, 9, 9), dtype)  # larger than index: its first elements are read
    want = x.scatter(dim, index, src)
    got = tern(x).scatter(dim, tern(index), tern(src))
    assert torch.equal(got.cpu(), want)
    # In place, and the out= form.
    dev = tern(x)
    dev.scatter_(dim, tern(index), tern(src))
    assert torch.equal(dev.cpu(), want)
    out = tern(torch.empty(0, dtype=dtype))
    torch.scatter(tern(x), dim, tern(index), tern(src), out=out)
    assert torch.equal(out.cpu(), want)
    assert fallback_log.get_fallback_ops() == {}


def test_scatter_src_edges(fallback_log):
    x = torch.randn(3, 4, generator=g)
    # An empty index writes nothing; an i32 index is taken too.
    empty = torch.empty(3, 0, dtype=torch.int64)
    assert torch.equal(tern(x).scatter(1, tern(empty), tern(x)).cpu(), x)
    # MoE routing weights: zeros, then the top-k weights at the chosen experts.
    logits = torch.randn(6, 8, generator=g)
    weights, experts = logits.softmax(-1).topk(2, dim=-1)
    want = torch.zeros_like(logits).scatter_(1, experts, weights)
    got = torch.zeros_like(tern(logits)).scatter_(1, tern(experts), tern(weights))
    assert torch.equal(got.cpu(), want)
    assert fallback_log.get_fallback_ops() == {}
    # A negative index raises, as on the CPU (torch.scatter does not count
    # from the end).
    with pytest.raises(RuntimeError, match="out of range"):
        tern(x).scatter(1, tern(torch.tensor([[0, -1]])), tern(x)).cpu()
    with pytest.raises(RuntimeError):
        x.scatter(1, torch.tensor([[0, -1]]), x)
    with pytest.raises(RuntimeError, match="out of range"):
        tern(x).scatter(0, tern(torch.tensor([[3]])), tern(x)).cpu()
    # scatter with a number follows the same index rule.
    with pytest.raises(RuntimeError, match="out of range"):
        tern(x).scatter(1, tern(torch.tensor([[-1]])), 2.0).cpu()
    with pytest.raises(RuntimeError):
        x.scatter(1, torch.tensor([[-1]]), 2.0)
    for dtype in DTYPES:
        y, index = rand((3, 4), dtype), torch.tensor([[3, 3, 0], [1, 2, 1]])
        want = y.scatter(1, index, True if dtype == torch.bool else 5)
        got = tern(y).scatter(1, tern(index), True if dtype == torch.bool else 5)
        assert torch.equal(got.cpu(), want)
    # A src of another dtype: the CPU's error, through the fallback.
    with pytest.raises(RuntimeError, match="dtype"):
        tern(x).scatter(0, tern(torch.tensor([[0]])), tern(x.double()))


def test_scatter_in_place_on_strided_views(fallback_log):
    # Bigbird's pattern: view[:, :, 2:-2, :, 1:-1].scatter_(...) writes a
    # strided, non-dense view in place; so do scatter_add_ and index_add_.
    base = torch.randn(2, 6, 4, 5, generator=g)
    index = torch.randint(0, 3, (2, 2, 4, 2), generator=g)
    src = torch.randn(2, 2, 4, 2, generator=g)
    rows = torch.tensor([0, 2, 2])
    added = torch.randn(2, 3, 4, 3, generator=g)

    def run(x, index, src, rows, added):
        x[:, 2:-2, :, 1:-1].scatter_(3, index, src)
        x[:, 1:5, :, 2:].scatter_add_(3, index, src)
        x[:, :, 1:, 1:4].index_add_(1, rows, added[:, :, :3])
        x[:, 1:3, :, ::2].scatter_(2, index[..., :2].clone(), 9.0)
        return x

    want = run(base.clone(), index, src, rows, added)
    got = run(tern(base), tern(index), tern(src), tern(rows), tern(added))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_with_several_adjacent_index_tensors(dtype, fallback_log):
    x = rand((4, 5, 6, 3), dtype)
    i = torch.tensor([[0, -1], [3, 2]])
    j = torch.tensor([4, -5], dtype=torch.int32)
    k = torch.tensor([2, -3])  # for the dim of size 3
    cases = [
        lambda t, i, j, k: t[i, j],                      # leading dims, broadcast indices
        lambda t, i, j, k: t[:, i, j],                   # after a slice (sizes 5, 6)
        lambda t, i, j, k: t[..., i, k],                 # trailing dims (sizes 6, 3)
        lambda t, i, j, k: t[i[0, 0], j[0]],             # 0-dim indices
        lambda t, i, j, k: t[i[:0, 0], j[:0]],           # empty indices
        lambda t, i, j, k: t.transpose(2, 3)[:, :, k, i],  # dims that do not merge: CPU
    ]
    for n, case in enumerate(cases):
        want = case(x, i, j, k)
        got = case(tern(x), tern(i), tern(j), tern(k))
        assert torch.equal(got.cpu(), want), n
    # Only the transposed case, whose indexed dims do not merge, falls back.
    assert fallback_log.get_fallback_ops() == {"aten::index.Tensor_out": 1}
    # The padding-mask lookup of transformers' masking utilities.
    mask = torch.rand(2, 7, generator=g) > 0.3
    batch, kv = torch.arange(2)[:, None], torch.arange(7)[None, :]
    assert torch.equal(tern(mask)[tern(batch), tern(kv)].cpu(), mask[batch, kv])
    # An index out of range for its own dim raises, naming its value.
    with pytest.raises(RuntimeError, match="index 5 .* out of range for axis 0 of size 5"):
        tern(x)[tern(torch.tensor([0])), tern(torch.tensor([5]))].cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool], ids=str)
def test_boolean_mask_reads_and_nonzero(dtype, fallback_log):
    """x[mask], nonzero, torch.where(cond), masked_select and the backward of
    x[mask] (index_put_ with accumulate) run on tern, with the count read on
    the host as every device's must, and match the CPU."""
    x = rand((4, 3, 5), dtype)
    mask = torch.rand(4, 3, 5, generator=g) > 0.4
    rows = torch.tensor([True, False, True, True])
    inner = torch.rand(3, 5, generator=g) > 0.5
    none = torch.zeros(4, 3, dtype=torch.bool)
    cases = [
        (lambda t, m, r, i, n: t[m]),
        (lambda t, m, r, i, n: t[r]),
        (lambda t, m, r, i, n: t[:, i]),
        (lambda t, m, r, i, n: t[n]),
        (lambda t, m, r, i, n: torch.nonzero(m)),
        (lambda t, m, r, i, n: torch.nonzero(t)),
        (lambda t, m, r, i, n: torch.nonzero(t[0, 0, 0])),  # a 0-dim input: [count, 0]
        (lambda t, m, r, i, n: torch.stack(torch.where(m))),
        (lambda t, m, r, i, n: torch.masked_select(t, i)),  # the mask broadcasts
        (lambda t, m, r, i, n: torch.masked_select(t, n[..., None])),
    ]
    for case in cases:
        want = case(x, mask, rows, inner, none)
        got = case(*(tern(a) for a in (x, mask, rows, inner, none)))
        assert got.device.type == "tern"
        assert torch.equal(got.cpu(), want)
    if dtype.is_floating_point:
        weights = torch.arange(int(mask.sum()), dtype=torch.float32).to(dtype)
        a = x.clone().requires_grad_()
        (a[mask] * weights).sum().backward()
        b = tern(x).requires_grad_()
        (b[tern(mask)] * tern(weights)).sum().backward()
        assert torch.equal(b.grad.cpu(), a.grad)
    assert fallback_log.get_fallback_ops() == {}
