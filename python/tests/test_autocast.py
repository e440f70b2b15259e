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


def test_grad_scaler_matches_cpu(fallback_log):
    """GradScaler on tern and on the CPU through 12 steps with growth_interval 3
    and an inf planted in the gradients at steps 4 and 9: the same scales,
    trackers, skipped steps and parameters. The unscale and the update run on
    tern (only the float64 reciprocal of the scale falls back: tern computes
    no float64)."""
    import copy

    torch.manual_seed(0)
    models = {"cpu": torch.nn.Linear(6, 3)}
    models["tern"] = copy.deepcopy(models["cpu"]).to("tern")
    opts = {d: torch.optim.SGD(m.parameters(), lr=0.05) for d, m in models.items()}
    scalers = {d: torch.amp.GradScaler(d, init_scale=64.0, growth_interval=3) for d in models}
    history = []
    for step in range(12):
        x = torch.randn(5, 6)
        for d, model in models.items():
            opts[d].zero_grad()
            loss = model(x.to(d)).square().mean()
            scalers[d].scale(loss).backward()
            if step in (4, 9):
                model.weight.grad[0, 0] = float("inf") if step == 4 else float("nan")
            scalers[d].step(opts[d])
            scalers[d].update()
        assert scalers["tern"].get_scale() == scalers["cpu"].get_scale(), step
        assert (scalers["tern"]._growth_tracker.item()
                == scalers["cpu"]._growth_tracker.item()), step
        history.append(scalers["cpu"].get_scale())
    assert 128.0 in history and history[4] == 64.0  # it grew, and backed off at the inf
    for p, q in zip(models["cpu"].parameters(), models["tern"].parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-6, atol=1e-6)
    assert set(fallback_log.get_fallback_ops()) <= {"aten::reciprocal.out"}


def test_bf16_autocast_cnn_with_batch_norm_trains_natively(fallback_log):
    """Convolutions give bf16 under autocast, and batch norm (on no autocast
    list) takes the bf16 activations with its float32 parameters: on tern that
    runs natively, computed in float32 as the CPU's mixed-dtype kernel does.
    Three SGD steps against the same run on the CPU, with no fallback."""
    import copy

    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    losses = {}
    models = {"cpu": copy.deepcopy(model), "tern": copy.deepcopy(model).to("tern")}
    for device, m in models.items():
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses[device] = []
        for _ in range(3):
            with torch.autocast(device, dtype=torch.bfloat16):
                out = m(x.to(device))
                loss = F.cross_entropy(out, y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[device].append(loss.item())
    assert out.dtype == torch.bfloat16
    for a, b in zip(losses["cpu"], losses["tern"]):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(a)), losses
    cpu_bn, tern_bn = models["cpu"][1], models["tern"][1]
    torch.testing.assert_close(tern_bn.running_mean.cpu(), cpu_bn.running_mean, rtol=2e-2,
                               atol=2e-2)
    assert fallback_log.get_fallback_ops() == {}
