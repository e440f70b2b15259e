"""A 2-layer MLP trained on tern follows CPU's loss curve (the device is the only change)."""

import copy

import pytest
import torch

# torch's own CPU mse_loss.out warns when handed a 0-dim out tensor, which the
# CPU fallback does on its way; CPU-only runs of the same composite path do too.
pytestmark = pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(64, 1, generator=g)
    return x, y


def train(model, x, y, device, steps=20):
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_mlp_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    x, y = make_data()
    cpu_losses, cpu_model = train(copy.deepcopy(model), x, y, "cpu")
    tern_losses, tern_model = train(copy.deepcopy(model), x, y, "tern")
    assert len(tern_losses) == 20
    for step, (c, t) in enumerate(zip(cpu_losses, tern_losses)):
        assert abs(c - t) <= 1e-4, (step, c, t)
    assert tern_losses[-1] < tern_losses[0]
    for p_cpu, p_tern in zip(cpu_model.parameters(), tern_model.parameters()):
        assert p_tern.device.type == "tern"
        assert torch.allclose(p_cpu.detach(), p_tern.detach().cpu(), atol=1e-5)
