"""Training on tern follows the CPU, the device being the only change.

A 2-layer MLP (SGD with momentum) and a small CNN (convolutions, batch norm,
max pooling, cross-entropy) train for a fixed number of steps on synthetic data;
tiny Hugging Face Llama and GPT-2 models (built from configs, nothing
downloaded) run forward, backward and one AdamW step. Every step's loss,
the gradients and the parameters are compared with the same run on the CPU,
and the runs must take no CPU fallback (everything on native tern kernels).
"""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_tern  # noqa: E402


def train(model, x, y, device, loss_fn, steps, lr=0.05):
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def compare_runs(model, x, y, loss_fn, steps, loss_tol, param_tol, fallback_log):
    cpu_losses, cpu_model = train(copy.deepcopy(model), x, y, "cpu", loss_fn, steps)
    fallback_log.clear_op_tracking()
    tern_losses, tern_model = train(copy.deepcopy(model), x, y, "tern", loss_fn, steps)
    assert fallback_log.get_fallback_ops() == {}
    assert len(tern_losses) == steps
    for step, (c, t) in enumerate(zip(cpu_losses, tern_losses)):
        assert abs(c - t) <= loss_tol * max(1.0, abs(c)), (step, c, t)
    assert tern_losses[-1] < 0.8 * tern_losses[0]  # it learned something
    for p_cpu, p_tern in zip(cpu_model.parameters(), tern_model.parameters()):
        assert p_tern.device.type == "tern"
        torch.testing.assert_close(p_tern.detach().cpu(), p_cpu.detach(), atol=param_tol,
                                   rtol=param_tol)
    for b_cpu, b_tern in zip(cpu_model.buffers(), tern_model.buffers()):  # running statistics
        torch.testing.assert_close(b_tern.cpu(), b_cpu, atol=param_tol, rtol=param_tol)


def test_mlp_matches_cpu(fallback_log):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 1, generator=g)) + 0.1 * torch.randn(64, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    compare_runs(model, x, y, F.mse_loss, steps=20, loss_tol=1e-5, param_tol=1e-5,
                 fallback_log=fallback_log)


def test_cnn_matches_cpu(fallback_log):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 1, 12, 12, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, stride=2, padding=1), torch.nn.Flatten(),
        torch.nn.Linear(8 * 3 * 3, 4))
    compare_runs(model, x, y, F.cross_entropy, steps=15, loss_tol=1e-4, param_tol=1e-4,
                 fallback_log=fallback_log)


def tiny_model(kind):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                     n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def step(model, ids, device):
    model = model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = model(input_ids=ids.to(device), labels=ids.to(device))
    out.loss.backward()
    grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
    opt.step()
    params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return out.loss.item(), out.logits.detach().cpu(), grads, params, model


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_transformers_step_matches_cpu(kind, fallback_log):
    base = tiny_model(kind)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    cpu_loss, cpu_logits, cpu_grads, cpu_params, _ = step(copy.deepcopy(base), ids, "cpu")
    fallback_log.clear_op_tracking()
    loss, logits, grads, params, model = step(copy.deepcopy(base), ids, "tern")
    assert fallback_log.get_fallback_ops() == {}
    assert abs(loss - cpu_loss) <= 1e-5
    torch.testing.assert_close(logits, cpu_logits, atol=1e-5, rtol=1e-5)
    assert grads.keys() == cpu_grads.keys()
    for name, g in grads.items():
        scale = cpu_grads[name].abs().max().item()
        torch.testing.assert_close(g, cpu_grads[name], atol=1e-5 * max(scale, 1e-3), rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")
    for name, p in params.items():
        torch.testing.assert_close(p, cpu_params[name], atol=1e-4, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")
    if kind == "gpt2":  # tied input and output embeddings stay tied on tern
        assert model.lm_head.weight is model.transformer.wte.weight


def test_module_to_keeps_shared_parameters_shared():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = torch.nn.Sequential(embedding, head).to("tern")
    assert model[0].weight is model[1].weight and model[0].weight.device.type == "tern"
    back = model.cpu()
    assert back[0].weight is back[1].weight and back[0].weight.device.type == "cpu"
