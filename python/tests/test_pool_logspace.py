"""Native logspace, max pooling (1-D, 2-D, 3-D, with indices, and their
backward), max unpooling, searchsorted, unique and unique_consecutive against
the CPU, including the cases that used to take the CPU fallback: logspace,
max_unpool, searchsorted and unique (with or without a dim) entirely; ceil_mode, channels-last
gradients and every 3-D max pool."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_tern


def _no_fallback(fallback_log, what):
    assert fallback_log.get_fallback_ops() == {}, f"{what} fell back"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logspace_matches_cpu(dtype, fallback_log):
    cases = [(0, 3, 5, 10.0), (-3, 0, 11, 2.0), (1.2, 4.3, 50, 1.1), (4.3, 1.2, 7, 5.0),
             (2, 2, 3, 3.0), (-1, 4, 1, 10.0), (0, 1, 0, 10.0), (0.5, -2.5, 2, 0.5),
             (-2, 3, 6, -2.0)]
    for start, end, steps, base in cases:
        expected = torch.logspace(start, end, steps, base, dtype=dtype)
        actual = torch.logspace(start, end, steps, base, dtype=dtype, device="tern")
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(actual.cpu(), expected, rtol=tol, atol=tol, equal_nan=True)
    # The tensor overloads read start/end with .item() and run logspace.out.
    s, e = torch.tensor(1.2), torch.tensor(4.3)
    expected = torch.logspace(s, e, 20, 2.0, dtype=dtype)
    actual = torch.logspace(s.to("tern"), e.to("tern"), 20, 2.0, dtype=dtype, device="tern")
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-2, atol=1e-2)
    out = torch.empty(3, dtype=dtype, device="tern")
    torch.logspace(0, 2, 9, out=out)
    torch.testing.assert_close(out.cpu(), torch.logspace(0, 2, 9, dtype=dtype))
    _no_fallback(fallback_log, "logspace")


def _pool_inputs(shape, channels_last):
    x = torch.randn(shape)
    # Ties, -inf, and a NaN: the first maximum in scan order wins, NaN wins.
    x.view(-1)[::7] = 0.5
    x.view(-1)[3] = float("-inf")
    x.view(-1)[11] = float("nan")
    if channels_last:
        x = x.to(memory_format=torch.channels_last if x.dim() == 4
                 else torch.channels_last_3d)
    return x


def _check_pool(pool, x, fallback_log, what):
    expected, expected_idx = pool(x)
    xt = x.to("tern")
    actual, actual_idx = pool(xt)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)
    assert torch.equal(actual_idx.cpu(), expected_idx), what
    _no_fallback(fallback_log, what)


GEOMETRIES_2D = [
    # kernel, stride, padding, dilation
    (3, None, 0, 1), (3, 2, 1, 1), ((2, 3), (2, 1), (1, 1), 1), (2, 3, 1, 2),
    ((3, 2), 2, (1, 0), (2, 1)), (1, 1, 0, 1),
]


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool2d_matches_cpu(ceil_mode, channels_last, fallback_log):
    torch.manual_seed(0)
    for (k, s, p, d), shape in itertools.product(GEOMETRIES_2D, [(2, 3, 7, 9), (3, 6, 5)]):
        if channels_last and len(shape) != 4:
            continue
        x = _pool_inputs(shape, channels_last)
        pool = lambda t: F.max_pool2d(t, k, s, p, d, ceil_mode=ceil_mode,  # noqa: E731
                                      return_indices=True)
        _check_pool(pool, x, fallback_log, f"max_pool2d {k} {s} {p} {d} {shape}")
        # Gradients (max_pool2d_with_indices_backward) through tern's indices.
        w = torch.randn(pool(x)[0].shape)
        xc = x.nan_to_num(0.0, float("inf"), float("-inf")).requires_grad_()
        (pool(xc)[0] * w).sum().backward()
        xt = xc.detach().to("tern").requires_grad_()
        (pool(xt)[0] * w.to("tern")).sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
        _no_fallback(fallback_log, f"max_pool2d backward {k} {s} {p} {d} {shape}")


def test_max_pool2d_all_minus_inf_windows(fallback_log):
    # Windows that hold only -inf (and padding): the index is the window's
    # first position inside the input, as on the CPU.
    x = torch.full((1, 1, 5, 5), float("-inf"))
    for ceil_mode in (False, True):
        pool = lambda t: F.max_pool2d(t, 3, 2, 1, 2, ceil_mode=ceil_mode,  # noqa: E731
                                      return_indices=True)
        _check_pool(pool, x, fallback_log, "all -inf")


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool1d_matches_cpu(ceil_mode, fallback_log):
    torch.manual_seed(1)
    for k, s, p, d in [(3, None, 0, 1), (2, 3, 1, 2), (4, 3, 2, 1)]:
        for shape in [(2, 3, 10), (4, 7)]:
            x = _pool_inputs(shape, False)
            pool = lambda t: F.max_pool1d(t, k, s, p, d, ceil_mode=ceil_mode,  # noqa: E731
                                          return_indices=True)
            _check_pool(pool, x, fallback_log, f"max_pool1d {k} {s} {p} {d} {shape}")


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool3d_matches_cpu(ceil_mode, channels_last, fallback_log):
    torch.manual_seed(2)
    geometries = [(3, None, 0, 1), ((3, 2, 3), 2, 1, 1), (2, (1, 2, 2), (1, 0, 1), (2, 1, 1))]
    for (k, s, p, d), shape in itertools.product(geometries, [(2, 2, 4, 6, 5), (2, 3, 6, 5)]):
        if channels_last and len(shape) != 5:
            continue
        x = _pool_inputs(shape, channels_last)
        pool = lambda t: F.max_pool3d(t, k, s, p, d, ceil_mode=ceil_mode,  # noqa: E731
                                      return_indices=True)
        _check_pool(pool, x, fallback_log, f"max_pool3d {k} {s} {p} {d} {shape}")
        w = torch.randn(pool(x)[0].shape)
        xc = x.nan_to_num(0.0, float("inf"), float("-inf")).requires_grad_()
        (pool(xc)[0] * w).sum().backward()
        xt = xc.detach().to("tern").requires_grad_()
        (pool(xt)[0] * w.to("tern")).sum().backward()
        torch.testing.assert_close(xt.grad.cpu(), xc.grad)
        _no_fallback(fallback_log, f"max_pool3d backward {k} {s} {p} {d} {shape}")


def test_max_pool_declines_clearly(fallback_log):
    # A window of more than 64 positions is not native: the CPU runs it.
    x = torch.randn(1, 1, 12, 12)
    expected = F.max_pool2d(x, 9, 1)
    actual = F.max_pool2d(x.to("tern"), 9, 1)
    torch.testing.assert_close(actual.cpu(), expected)
    assert "aten::max_pool2d_with_indices.out" in fallback_log.get_fallback_ops()
    # Invalid arguments raise PyTorch's own error, as on the CPU.
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.max_pool2d(x.to("tern"), 2, 1, 2)


@pytest.mark.parametrize("channels_last", [False, True])
def test_max_unpool_matches_cpu(channels_last, fallback_log):
    torch.manual_seed(3)
    x = _pool_inputs((2, 3, 8, 7), channels_last).nan_to_num(0.0)
    values, idx = F.max_pool2d(x, 2, 2, return_indices=True)
    for size in ((8, 7), (9, 7)):
        expected = F.max_unpool2d(values, idx, 2, 2, output_size=size)
        actual = F.max_unpool2d(values.to("tern"), idx.to("tern"), 2, 2, output_size=size)
        assert torch.equal(actual.cpu(), expected)
    # Unbatched, 1-D (through max_unpool2d), and repeated indices (the last wins).
    v1, i1 = F.max_pool1d(x[0, :, 0], 3, 1, 1, return_indices=True)
    expected = F.max_unpool1d(v1, i1, 3, 1, 1)
    assert torch.equal(F.max_unpool1d(v1.to("tern"), i1.to("tern"), 3, 1, 1).cpu(), expected)
    x3 = _pool_inputs((2, 2, 4, 6, 5), channels_last).nan_to_num(0.0)
    v3, i3 = F.max_pool3d(x3, 2, 2, return_indices=True)
    for size in ((4, 6, 5), (5, 7, 5)):
        expected = F.max_unpool3d(v3, i3, 2, 2, output_size=size)
        actual = F.max_unpool3d(v3.to("tern"), i3.to("tern"), 2, 2, output_size=size)
        assert torch.equal(actual.cpu(), expected)
    _no_fallback(fallback_log, "max_unpool")


def test_max_unpool_invalid_index_raises():
    values = torch.ones(1, 1, 2, 2, device="tern")
    idx = torch.tensor([[[[0, 1], [2, 99]]]], device="tern")
    with pytest.raises(RuntimeError):
        F.max_unpool2d(values, idx, 2).cpu()


@pytest.mark.parametrize("out_int32", [False, True])
def test_searchsorted_matches_cpu(out_int32, fallback_log):
    torch.manual_seed(4)
    seq1 = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 3.0])
    seq2 = torch.randn(3, 6).sort(-1).values
    seq2[1, 2] = seq2[1, 3]  # a tie
    vals1 = torch.tensor([[-2.0, 0.0, 0.25], [2.0, 9.0, float("nan")]])
    vals2 = torch.cat([torch.randn(3, 4), seq2[:, :2]], 1)
    unsorted = torch.randn(3, 6)
    sorter = unsorted.argsort(-1)
    cases = [(seq1, vals1, None), (seq2, vals2, None), (unsorted, vals2, sorter),
             (seq1, torch.tensor(0.5), None)]
    for (seq, vals, srt), kw in itertools.product(
            cases, [{}, {"right": True}, {"side": "left"}, {"side": "right"}]):
        expected = torch.searchsorted(seq, vals, out_int32=out_int32, sorter=srt, **kw)
        actual = torch.searchsorted(seq.to("tern"), vals.to("tern"), out_int32=out_int32,
                                    sorter=None if srt is None else srt.to("tern"), **kw)
        assert torch.equal(actual.cpu(), expected), (seq, vals, kw)
        for scalar in (0.0, 2.5, -7.0):
            if seq.dim() == 1:
                expected = torch.searchsorted(seq, scalar, out_int32=out_int32, **kw)
                actual = torch.searchsorted(seq.to("tern"), scalar, out_int32=out_int32, **kw)
                assert torch.equal(actual.cpu(), expected), (scalar, kw)
    out = torch.empty(0, dtype=torch.int32 if out_int32 else torch.int64, device="tern")
    torch.searchsorted(seq1.to("tern"), vals1.to("tern"), out_int32=out_int32, out=out)
    assert torch.equal(out.cpu(), torch.searchsorted(seq1, vals1, out_int32=out_int32))
    _no_fallback(fallback_log, "searchsorted")


def test_searchsorted_errors_as_cpu():
    seq = torch.tensor([0.0, 1.0], device="tern")
    with pytest.raises(RuntimeError, match="side"):
        torch.searchsorted(seq, seq, right=True, side="left")


UNIQUE_INPUTS = [
    torch.tensor([3.0, 1.0, 2.0, 1.0, float("nan"), 3.0, float("nan"), -0.0, 0.0]),
    torch.tensor([[5, 5, 2], [2, 7, 5]]),
    torch.tensor(4.0),
    torch.zeros(0, 3),
    torch.tensor([1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 3.0, 3.0]).reshape(2, 4).t(),  # not contiguous
]


@pytest.mark.parametrize("return_inverse", [False, True])
@pytest.mark.parametrize("return_counts", [False, True])
def test_unique_matches_cpu(return_inverse, return_counts, fallback_log):
    for x in UNIQUE_INPUTS:
        for sorted_ in (False, True):
            kw = dict(return_inverse=return_inverse, return_counts=return_counts)
            expected = torch.unique(x, sorted=sorted_, **kw)
            actual = torch.unique(x.to("tern"), sorted=sorted_, **kw)
            for a, e in zip(actual if isinstance(actual, tuple) else [actual],
                            expected if isinstance(expected, tuple) else [expected]):
                torch.testing.assert_close(a.cpu(), e, equal_nan=True, rtol=0, atol=0)
        expected = torch.unique_consecutive(x, **kw)
        actual = torch.unique_consecutive(x.to("tern"), **kw)
        for a, e in zip(actual if isinstance(actual, tuple) else [actual],
                        expected if isinstance(expected, tuple) else [expected]):
            torch.testing.assert_close(a.cpu(), e, equal_nan=True, rtol=0, atol=0)
    x = UNIQUE_INPUTS[0]
    torch.testing.assert_close(torch.unique_consecutive(x.to("tern"), dim=0).cpu(),
                               torch.unique_consecutive(x, dim=0), equal_nan=True)
    _no_fallback(fallback_log, "unique")


def test_unique_dim_matches_cpu(fallback_log):
    torch.manual_seed(5)
    x = torch.randint(0, 3, (6, 2, 4)).float()
    x[3] = x[1]  # repeated slices along every dim
    x[:, :, 2] = x[:, :, 0]
    x[:, 1] = -0.0 * x[:, 0]
    inputs = [x, x.transpose(0, 2), torch.tensor([2.0, 1.0, 2.0, 2.0]), torch.zeros(5, 0, 5),
              torch.randint(0, 2, (5, 1, 5))]
    for t in inputs:
        for dim in range(-t.dim(), t.dim()):
            if t.numel() == 0 and t.size(dim) != 0:
                continue  # the CPU's error
            kw = dict(return_inverse=True, return_counts=True)
            for e, a in zip(torch.unique(t, dim=dim, **kw),
                            torch.unique(t.to("tern"), dim=dim, **kw)):
                assert torch.equal(a.cpu(), e), (t.shape, dim)
            for e, a in zip(torch.unique_consecutive(t, dim=dim, **kw),
                            torch.unique_consecutive(t.to("tern"), dim=dim, **kw)):
                assert torch.equal(a.cpu(), e), (t.shape, dim)
            # The raw ops return the inverse and the counts even when not asked for.
            for e, a in zip(torch.ops.aten.unique_dim(t, dim),
                            torch.ops.aten.unique_dim(t.to("tern"), dim)):
                assert torch.equal(a.cpu(), e), (t.shape, dim)
    _no_fallback(fallback_log, "unique with a dim")
