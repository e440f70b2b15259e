"""torch_tern.compiler.export: a model becomes one .tern file that the C example
examples/run_model runs on .npy inputs and checks against PyTorch CPU.

run_model comes from the repository's normal build (build/examples/run_model,
or TORCH_TERN_RUN_MODEL). The test command builds it first and sets
TORCH_TERN_REQUIRE_RUN_MODEL=1, so there a missing binary fails the test
instead of skipping it.
"""

import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_tern.compiler as tc

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_model_binary() -> str:
    path = os.environ.get("TORCH_TERN_RUN_MODEL", str(ROOT / "build" / "examples" / "run_model"))
    if not os.access(path, os.X_OK):
        if os.environ.get("TORCH_TERN_REQUIRE_RUN_MODEL") == "1":
            pytest.fail(f"run_model is not built at {path}")
        pytest.skip(f"run_model is not built at {path} (build the repository first)")
    return path


def export_and_run(tmp_path, model, inputs, rtol=1e-4, atol=1e-5):
    model = model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    exe = tmp_path / "model.tern"
    stats = tc.export(model, inputs, exe, graph_path=tmp_path / "model.ternir")
    assert exe.stat().st_size == stats["bytes"]
    assert (tmp_path / "model.ternir").stat().st_size > 0
    # Device 1: this process's tern tensors (other tests) hold a core of device 0.
    args = [run_model_binary(), str(exe), "--no-output", "--rtol", str(rtol), "--atol", str(atol),
            "--device", "1"]
    for i, x in enumerate(inputs):
        np.save(tmp_path / f"in{i}.npy", x.numpy())
        args.append(str(tmp_path / f"in{i}.npy"))
    for i, y in enumerate(expected):
        np.save(tmp_path / f"out{i}.npy", y.detach().numpy())
        args += ["--expect", str(tmp_path / f"out{i}.npy")]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return stats


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class AttentionBlock(nn.Module):
    """Pre-norm self-attention and an MLP, as in GPT-2, written with the ops
    the compiler lowers (one head, no dropout)."""

    def __init__(self, d=32):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.d = d

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(self.d, dim=-1)
        scores = torch.softmax(q @ k.transpose(-1, -2) / self.d**0.5, dim=-1)
        x = x + self.proj(scores @ v)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


def test_mlp_runs_from_c(tmp_path):
    torch.manual_seed(0)
    stats = export_and_run(tmp_path, Mlp(), (torch.randn(8, 32),))
    assert stats["nodes"] >= 3
    # addmm, relu, addmm: the relu is the first matmul's epilogue.
    assert stats["compute_instructions_unfused"] == 3
    assert stats["compute_instructions"] == 2
    assert stats["epilogues"] == 1


def test_attention_block_runs_from_c(tmp_path):
    torch.manual_seed(1)
    export_and_run(tmp_path, AttentionBlock(), (torch.randn(16, 32),), rtol=1e-4, atol=1e-4)


def test_unsupported_op_names_the_op_and_the_line(tmp_path):
    class Cumulative(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=0) + 1

    with pytest.raises(ValueError) as error:
        tc.export(Cumulative(), (torch.randn(4, 4),), tmp_path / "m.tern")
    message = str(error.value)
    assert "aten.cumsum.default" in message
    assert "test_compiler_export.py" in message  # the user's source line
    assert "does not know this operator" in message


def test_graph_spec_is_plain_data():
    program = torch.export.export(Mlp().eval(), (torch.randn(2, 32),)).run_decompositions()
    spec = tc.to_graph_spec(program)
    assert [name for name, _, _ in spec["inputs"]] == ["x"]
    assert {c[0] for c in spec["constants"]} == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    ops = [node[0] for node in spec["nodes"]]
    assert "aten.addmm.default" in ops


def _transformer(name):
    transformers = pytest.importorskip("transformers")
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64,
                                         vocab_size=128, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Model(config)
    if name == "bert":
        config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64,
                                         num_attention_heads=4, intermediate_size=128,
                                         vocab_size=128, max_position_embeddings=64)
        return transformers.BertModel(config)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128,
                                      vocab_size=128, max_position_embeddings=64)
    return transformers.LlamaModel(config)


class _LastHidden(nn.Module):
    """The model's last hidden state for token ids (no KV cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).last_hidden_state


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_transformers_models_run_from_c(tmp_path, name):
    """Built from small configs, random weights (nothing downloaded); the
    attention masks the models build from arange and full are folded into
    constants at export."""
    torch.manual_seed(2)
    model = _LastHidden(_transformer(name)).eval()
    ids = torch.randint(0, 128, (1, 16))
    stats = export_and_run(tmp_path, model, (ids,), rtol=1e-4, atol=1e-4)
    # The planner's invariants (its targets are the benchmark's business).
    assert stats["scratch_max_live"] <= stats["scratch_peak"] <= stats["scratch_naive_sum"]


def test_load_runs_the_executable_on_tern_tensors(tmp_path):
    torch.manual_seed(3)
    model = Mlp().eval()
    x = torch.randn(8, 32)
    tc.export(model, (x,), tmp_path / "mlp.tern")
    compiled = tc.load(tmp_path / "mlp.tern")
    assert compiled.input_names == ["x"]
    y = compiled(x.to("tern"))
    assert y.device.type == "tern"
    torch.testing.assert_close(y.cpu(), model(x).detach(), rtol=1e-4, atol=1e-5)
    with pytest.raises(RuntimeError, match="has shape"):
        compiled(torch.randn(4, 32).to("tern"))
    with pytest.raises(RuntimeError, match="move it there"):
        compiled(x)


class _ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class SmallResNet(nn.Module):
    """A ResNet in miniature: stem conv (stride 2), batch norm, ReLU, max pool,
    one residual block, global average pool and a linear classifier."""

    def __init__(self, channels=8, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.block = _ResidualBlock(channels)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)
        # Running statistics that are not the identity, as after training.
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.data.uniform_(0.5, 1.5)
                module.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.stem(x))))
        return self.fc(torch.flatten(self.avg(self.block(x)), 1))


def test_resnet_style_cnn_graph_uses_the_lowered_ops():
    torch.manual_seed(4)
    program = torch.export.export(SmallResNet().eval(), (torch.randn(2, 3, 16, 16),))
    ops = {node[0] for node in tc.to_graph_spec(program.run_decompositions())["nodes"]}
    assert ops <= {
        "aten.convolution.default",
        "aten._native_batch_norm_legit_no_training.default",
        "aten.relu.default",
        "aten.max_pool2d_with_indices.default",
        "aten.add.Tensor",
        "aten.mean.dim",
        "aten.view.default",
        "aten.permute.default",
        "aten.addmm.default",
    }, ops


def test_resnet_style_cnn_runs_from_c(tmp_path):
    torch.manual_seed(4)
    stats = export_and_run(tmp_path, SmallResNet(), (torch.randn(2, 3, 16, 16),),
                           rtol=1e-4, atol=1e-4)
    assert stats["nodes"] >= 10


# --- The export-level cache (docs/compiler.md, "Export cache") -----------------------------


@pytest.fixture
def export_cache_dir(tmp_path, monkeypatch):
    """A compile cache (and so an export cache) of this test's own."""
    directory = tmp_path / "compile-cache"
    monkeypatch.setenv("TERN_COMPILE_CACHE_DIR", str(directory))
    monkeypatch.delenv("TORCH_TERN_EXPORT_CACHE", raising=False)
    return directory


def _refuse_torch_export(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.export.export was called")

    monkeypatch.setattr(torch.export, "export", refuse)


def test_export_cache_hit_skips_torch_export(tmp_path, export_cache_dir, monkeypatch):
    import time

    torch.manual_seed(5)
    model, x = Mlp().eval(), torch.randn(8, 32)
    t0 = time.perf_counter()
    first = tc.export(model, (x,), tmp_path / "a.tern")
    first_s = time.perf_counter() - t0
    assert first["export_cache"] == "miss" and first["export_skipped"] is False
    _refuse_torch_export(monkeypatch)
    t0 = time.perf_counter()
    second = tc.export(model, (x,), tmp_path / "b.tern")
    hit_ms = (time.perf_counter() - t0) * 1e3
    assert second["cache"] == "hit" and second["export_skipped"] is True, second
    assert (tmp_path / "a.tern").read_bytes() == (tmp_path / "b.tern").read_bytes()
    assert second["bytes"] == (tmp_path / "b.tern").stat().st_size
    assert second["nodes"] == first["nodes"] and second["instructions"] == first["instructions"]
    print(f"export cache hit: {hit_ms:.1f} ms (key {second['export_key_ms']:.1f} ms); "
          f"the first export: {first_s:.2f} s")
    # The opt-outs run torch.export (which now raises).
    with pytest.raises(AssertionError, match="torch.export.export was called"):
        tc.export(model, (x,), tmp_path / "c.tern", cache="graph")
    monkeypatch.setenv("TORCH_TERN_EXPORT_CACHE", "0")
    with pytest.raises(AssertionError, match="torch.export.export was called"):
        tc.export(model, (x,), tmp_path / "c.tern")


def test_export_cache_misses_on_a_parameter_change(tmp_path, export_cache_dir):
    torch.manual_seed(6)
    model, x = Mlp().eval(), torch.randn(8, 32)
    tc.export(model, (x,), tmp_path / "a.tern")
    value = model.fc1.weight[3, 7].item()
    with torch.no_grad():
        model.fc1.weight[3, 7] = value + 1.0
    changed = tc.export(model, (x,), tmp_path / "b.tern")
    assert changed["export_skipped"] is False and changed["export_cache"] == "miss"
    assert (tmp_path / "a.tern").read_bytes() != (tmp_path / "b.tern").read_bytes()
    with torch.no_grad():
        model.fc1.weight[3, 7] = value  # the same values again: the first entry
    back = tc.export(model, (x,), tmp_path / "c.tern")
    assert back["export_skipped"] is True
    assert (tmp_path / "a.tern").read_bytes() == (tmp_path / "c.tern").read_bytes()


def test_export_cache_misses_on_an_input_shape_change(tmp_path, export_cache_dir):
    torch.manual_seed(7)
    model = Mlp().eval()
    tc.export(model, (torch.randn(8, 32),), tmp_path / "a.tern")
    other = tc.export(model, (torch.randn(4, 32),), tmp_path / "b.tern")
    assert other["export_skipped"] is False and other["export_cache"] == "miss"
    assert tc.load(tmp_path / "b.tern").input_names == ["x"]
    assert (tmp_path / "a.tern").read_bytes() != (tmp_path / "b.tern").read_bytes()


class _MlpSigmoid(Mlp):
    def forward(self, x):
        return self.fc2(torch.sigmoid(self.fc1(x)))


def test_export_cache_misses_on_another_model_class(tmp_path, export_cache_dir):
    torch.manual_seed(8)
    model, x = Mlp().eval(), torch.randn(8, 32)
    tc.export(model, (x,), tmp_path / "a.tern")
    other = _MlpSigmoid().eval()
    other.load_state_dict(model.state_dict())  # the same parameters, another class
    stats = tc.export(other, (x,), tmp_path / "b.tern")
    assert stats["export_skipped"] is False and stats["export_cache"] == "miss"
    assert (tmp_path / "a.tern").read_bytes() != (tmp_path / "b.tern").read_bytes()


_TEMPORARY_MODEL_SOURCE = '''
import torch
import torch.nn as nn


class TemporaryModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))  # VARIANT
'''


def test_export_cache_misses_when_the_model_source_file_changes(tmp_path, export_cache_dir):
    import importlib.util

    source = tmp_path / "temporary_model_source.py"
    source.write_text(_TEMPORARY_MODEL_SOURCE)
    spec = importlib.util.spec_from_file_location(f"temporary_model_{os.getpid()}", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(9)
    model, x = module.TemporaryModel().eval(), torch.randn(4, 16)
    assert tc.export(model, (x,), tmp_path / "a.tern")["export_cache"] == "miss"
    assert tc.export(model, (x,), tmp_path / "b.tern")["export_skipped"] is True
    # The file changes on disk (here only a comment; it could be a helper the
    # running code does not show yet): the same model object misses.
    source.write_text(_TEMPORARY_MODEL_SOURCE.replace("# VARIANT", "# VARIANT 2"))
    changed = tc.export(model, (x,), tmp_path / "c.tern")
    assert changed["export_skipped"] is False and changed["export_cache"] == "miss"
    assert tc.export(model, (x,), tmp_path / "d.tern")["export_skipped"] is True


def test_export_cache_falls_back_for_what_the_key_does_not_cover(tmp_path, export_cache_dir):
    torch.manual_seed(10)
    x = torch.randn(8, 32)

    hooked = Mlp().eval()
    hooked.fc1.register_forward_hook(lambda module, inputs, output: output * 2)
    stats = tc.export(hooked, (x,), tmp_path / "a.tern")
    assert stats["export_cache"].startswith("bypassed") and "hooks" in stats["export_cache"]

    patched = Mlp().eval()
    patched.forward = lambda x: patched.fc2(patched.fc1(x))
    stats = tc.export(patched, (x,), tmp_path / "b.tern")
    assert stats["export_cache"].startswith("bypassed") and "patched" in stats["export_cache"]

    plain = Mlp().eval()
    stats = tc.export(plain, (x,), tmp_path / "c.tern", graph_path=tmp_path / "c.ternir")
    assert stats["export_cache"].startswith("bypassed") and (tmp_path / "c.ternir").exists()
    # None of them was stored: each bypass exported.
    for path in ("a.tern", "b.tern"):
        again = tc.export(hooked if path == "a.tern" else patched, (x,), tmp_path / "again.tern")
        assert again["export_skipped"] is False


_CONCURRENT_EXPORT_SCRIPT = '''
import sys

import torch
import torch.nn as nn

import torch_tern.compiler as tc


class Concurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


torch.manual_seed(11)
stats = tc.export(Concurrent().eval(), (torch.zeros(2, 16),), sys.argv[1])
print("OUTCOME", stats["export_cache"])
'''


def test_export_cache_concurrent_processes_get_the_same_bytes(tmp_path, export_cache_dir,
                                                              node_env):
    import sys

    script = tmp_path / "concurrent_export.py"
    script.write_text(_CONCURRENT_EXPORT_SCRIPT)
    env = dict(node_env, TERN_COMPILE_CACHE_DIR=str(export_cache_dir))
    env.pop("TORCH_TERN_EXPORT_CACHE", None)

    def start(name):
        return subprocess.Popen([sys.executable, "-P", str(script), str(tmp_path / name)],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def outcome(process):
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, out + err
        return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("OUTCOME")][0]

    processes = [start(f"p{i}.tern") for i in range(3)]
    outcomes = [outcome(p) for p in processes]
    # One process exports; the others wait for it (or come later) and hit.
    assert sorted(outcomes)[0] in ("hit", "miss", "waited")
    assert outcomes.count("miss") == 1, outcomes
    assert all(o in ("miss", "waited", "hit") for o in outcomes), outcomes
    blobs = {(tmp_path / f"p{i}.tern").read_bytes() for i in range(3)}
    assert len(blobs) == 1
    assert outcome(start("later.tern")) == "hit"
    assert (tmp_path / "later.tern").read_bytes() in blobs
    print(f"concurrent exports: {outcomes}")


def test_an_export_the_decompositions_would_not_change_is_not_traced_again():
    # A graph of operators the compiler takes as they are, none of which the
    # core ATen table decomposes, skips run_decompositions (a second trace of
    # the whole program) and converts to the same compiler graph; one with
    # rms_norm (which the table decomposes) does not skip it.
    from torch_tern.compiler import _frontend

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 8))

        def forward(self, x):
            for i in range(4):
                x = torch.relu(x * self.w[i] + 1.0) - x
            return x

    class Norm(nn.Module):
        def forward(self, x):
            return torch.nn.functional.rms_norm(x, (8,)) * 2

    x = torch.randn(3, 8)
    program = torch.export.export(Chain(), (x,))
    assert not _frontend._needs_decompositions(program)

    def computation(spec):
        return ([(op, inputs, attrs) for op, inputs, attrs, _, _ in spec["nodes"]],
                [i[1:] for i in spec["inputs"]], [o[1] for o in spec["outputs"]])

    assert computation(_frontend.to_graph_spec(program)) == computation(
        _frontend.to_graph_spec(program.run_decompositions()))
    assert _frontend._needs_decompositions(torch.export.export(Norm(), (x,)))
