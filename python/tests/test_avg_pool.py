"""2-D average pooling runs natively on tern and matches the CPU: kernel,
stride, padding, ceil_mode, count_include_pad and divisor_override, batched
and unbatched, float32 and the 16-bit floats, forward and backward, with no
CPU fallback (densenet's and poolformer's pools took it before)."""

import pytest
import torch
import torch.nn.functional as F

g = torch.Generator().manual_seed(0)

CASES = [
    # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    (2, None, 0, False, True, None),
    (3, 2, 1, False, True, None),
    (3, 2, 1, False, False, None),
    (3, 2, 1, True, True, None),
    (3, 2, 1, True, False, None),
    ((3, 2), (2, 1), (1, 0), True, False, None),
    (3, 1, 1, False, False, None),  # poolformer: stride 1, no padded counts
    (2, 2, 0, True, True, None),  # an odd size: ceil_mode's last window hangs over
    (3, 3, 1, False, True, 5),
    (1, 1, 0, False, True, None),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (3, 8, 8)], ids=str)
def test_avg_pool2d_matches_cpu(case, shape, fallback_log):
    kernel, stride, padding, ceil_mode, include_pad, divisor = case
    x = torch.randn(shape, generator=g, requires_grad=True)
    xt = x.detach().to("tern").requires_grad_()

    def pool(t):
        return F.avg_pool2d(t, kernel, stride, padding, ceil_mode, include_pad, divisor)

    want = pool(x)
    got = pool(xt)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    w = torch.randn(want.shape, generator=g)
    (want * w).sum().backward()
    (got * w.to("tern")).sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_avg_pool2d_low_precision(dtype, fallback_log):
    x = torch.randn(2, 4, 9, 9, generator=g).to(dtype).requires_grad_()
    xt = x.detach().to("tern").requires_grad_()
    want = F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)
    got = F.avg_pool2d(xt, 3, 2, 1, ceil_mode=True, count_include_pad=False)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), want)
    want.float().sum().backward()
    got.float().sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad)
    assert fallback_log.get_fallback_ops() == {}


def test_avg_pool_module_layouts(fallback_log):
    # nn.AvgPool2d on a channels-last input and a transposed view.
    pool = torch.nn.AvgPool2d(3, stride=2, padding=1)
    x = torch.randn(2, 5, 10, 6, generator=g)
    for view in (x.to(memory_format=torch.channels_last), x.transpose(2, 3)):
        torch.testing.assert_close(pool(view.to("tern")).cpu(), pool(view))
    assert fallback_log.get_fallback_ops() == {}


def test_avg_pool2d_errors_as_on_the_cpu():
    x = torch.randn(1, 1, 4, 4)
    for args in [(3, 1, 2), (5, 1, 0)]:  # padding over half the kernel; a window larger than x
        with pytest.raises(RuntimeError):
            F.avg_pool2d(x, *args)
        with pytest.raises(RuntimeError):
            F.avg_pool2d(x.to("tern"), *args)
