"""Autocast on tern: bfloat16 for the lower-precision list, float32 for the fp32 list."""

import torch
import torch.nn.functional as F


def test_default_autocast_dtype_is_bf16():
    assert torch.get_autocast_dtype("tern") == torch.bfloat16
    assert torch.bfloat16 in torch.tern.get_amp_supported_dtype()


def test_policies_with_fallback_ops():
    a = torch.randn(8, 16).to("tern")
    b = torch.randn(16, 4).to("tern")
    w = torch.randn(4, 16).to("tern")
    with torch.autocast("tern", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("tern")
        mm = a @ b
        lin = F.linear(a, w)
        soft = torch.softmax(mm, dim=-1)
        summed = mm.sum()
        mixed = mm + a[:, :4]  # not in a list: ordinary promotion
    assert mm.dtype == torch.bfloat16 and mm.device.type == "tern"
    assert lin.dtype == torch.bfloat16
    assert soft.dtype == torch.float32
    assert summed.dtype == torch.float32
    assert mixed.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mm_cpu = a.cpu() @ b.cpu()
    assert torch.equal(mm.cpu(), mm_cpu)


def test_autocast_default_dtype_and_backward():
    x = torch.randn(4, 8).to("tern")
    layer = torch.nn.Linear(8, 3).to("tern")
    with torch.autocast("tern"):
        out = layer(x)
        loss = out.float().pow(2).mean()
    assert out.dtype == torch.bfloat16
    loss.backward()
    assert layer.weight.grad.dtype == torch.float32
    assert layer.weight.grad.device.type == "tern"
    with torch.autocast("tern", enabled=False):
        assert layer(x).dtype == torch.float32
