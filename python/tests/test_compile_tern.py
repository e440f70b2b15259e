"""torch.compile(model, backend="tern"): tern's compiler under Dynamo and AOTAutograd.

What a backend author and a user would check first (PyTorch's OpenReg tests
have the same list): the backend and the device interface are registered;
Dynamo sees tern tensors as tern tensors while tracing; compiled results and
gradients match eager tern; guards and recompiles behave as Dynamo's counters
say; graph breaks, autocast and dynamic shapes work; operators the compiler
cannot take run on the eager device, reported in stats() and refused under
TORCH_TERN_FALLBACK=error; a second process finds everything in the
persistent cache; HF GPT-2 and Llama (small configs) train 20 AdamW steps
like eager tern; a CNN with batch norm trains in training mode.
"""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
import torch_tern
import torch_tern.compiler as ternc

pytestmark = pytest.mark.filterwarnings("ignore")

TOL = 1e-4


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """Each test: its own compile cache, Dynamo's caches and counters reset,
    the backend's stats zeroed, eager fallback allowed."""
    monkeypatch.setenv("TORCH_TERN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_TERN_FALLBACK", raising=False)
    torch._dynamo.reset()
    ternc.reset_stats()
    yield
    torch._dynamo.reset()


def _close(a, b, tol=TOL):
    a, b = a.detach().cpu().float(), b.detach().cpu().float()
    assert a.shape == b.shape
    scale = max(b.abs().max().item(), 1e-6)
    assert (a - b).abs().max().item() <= tol * scale, ((a - b).abs().max().item(), scale)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4)).to("tern")


# --- registration ----------------------------------------------------------------


def test_backend_and_device_interface_are_registered():
    from torch._dynamo.backends.registry import list_backends, lookup_backend
    from torch._dynamo.device_interface import get_interface_for_device

    assert "tern" in list_backends()
    assert lookup_backend("tern") is ternc.backend
    interface = get_interface_for_device("tern")
    assert interface is get_interface_for_device(torch.device("tern", 0))
    assert interface.device_count() == torch.tern.device_count()
    assert interface.current_device() == torch.tern.current_device()
    assert interface.is_available()
    stream = interface.current_stream()
    assert stream.device.type == "tern"
    assert interface.get_raw_stream(0) == torch.tern.current_stream(0).stream_id
    interface.synchronize()
    assert interface.Worker.get_device_properties(0).name


def test_streams_in_compiled_code():
    """A stream context and current_stream() inside a compiled function:
    Dynamo traces current_stream() through torch.accelerator (it used to
    fail inside Dynamo); the stream context runs eagerly (a graph break; it
    used to leave its stream current after the block); the result is
    eager's."""
    side = torch.tern.Stream()

    def fn(x):
        with torch.tern.stream(side):
            y = x * 2
        torch.tern.current_stream().wait_stream(side)
        return y + 1

    x = torch.randn(4, device="tern")
    before = torch.tern.current_stream()
    _close(torch.compile(fn, backend="tern")(x), fn(x), tol=0)
    assert torch.tern.current_stream() == before  # the block's stream did not stay current

    def current(x):
        stream = torch.tern.current_stream()
        stream.wait_stream(side)
        return x + 1

    _close(torch.compile(current, backend="tern", fullgraph=True)(x), current(x), tol=0)


def test_traced_tensors_carry_the_tern_device():
    seen = []

    def spy(gm, example_inputs):
        seen.extend(t.device for t in example_inputs if isinstance(t, torch.Tensor))
        return ternc.backend(gm, example_inputs)

    def fn(x, y):
        return (x * y).sum(0)

    x = torch.randn(4, 4, device="tern")
    out = torch.compile(fn, backend=spy)(x, x)
    assert seen and all(d.type == "tern" for d in seen)
    assert out.device.type == "tern"
    _close(out, fn(x, x))


# --- results, gradients, stats ---------------------------------------------------------


def test_forward_and_gradients_match_eager_and_run_compiled():
    model = _mlp()
    x = torch.randn(8, 16, device="tern")
    compiled = torch.compile(model, backend="tern")
    _close(compiled(x), model(x))
    compiled(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    for got, want in zip(grads, (p.grad for p in model.parameters())):
        _close(got, want)
    stats = ternc.stats()
    assert stats["graphs_by_kind"] == {"forward": 1, "backward": 1}
    assert stats["partitions"] >= 2 and stats["compiled_nodes"] > 10
    assert stats["executables"] == stats["partitions"]
    assert stats["fallback_nodes"] == {}
    assert stats["cache_misses"] == stats["executables"]


def test_a_result_returned_as_a_view_stays_a_view():
    """A partition's result that leaves the graph through a view (as the
    transposed activations a training forward saves for its backward) is
    returned as that view of the result, with eager's strides: no copy."""
    fn = torch.compile(lambda x, w: (torch.tanh(x @ w) * 2).t(), backend="tern")
    x, w = torch.randn(8, 16, device="tern"), torch.randn(16, 32, device="tern")
    got, want = fn(x, w), (torch.tanh(x @ w) * 2).t()
    _close(got, want)
    assert got.stride() == want.stride() and not got.is_contiguous()
    assert ternc.stats()["fallback_nodes"] == {}


def test_an_input_laid_out_permuted_is_taken_as_it_lies():
    """A partition input traced as a dense permutation (a transposed saved
    activation) is passed in memory order and permuted back inside the
    executable; given in another layout at run time, it is copied and the
    answer is the same."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch_tern.compiler._dynamo import _CompiledPartition, _dense_order

    assert _dense_order(torch.empty(4, 5)) is None
    assert _dense_order(torch.empty(5, 4).t()) == (1, 0)
    assert _dense_order(torch.empty(2, 5, 4).permute(2, 0, 1)) == (1, 2, 0)
    assert _dense_order(torch.empty(4, 1).expand(4, 3)) is None
    assert _dense_order(torch.empty(4, 1, 5)[:, :, ::2]) is None

    def f(a, b):
        return torch.relu(a @ b) + 1

    a = torch.randn(32, 8, device="tern").t()  # [8, 32], strides (1, 8)
    b = torch.randn(32, 4, device="tern")
    gm = make_fx(f, tracing_mode="fake")(a, b)
    partition = _CompiledPartition(gm, "test", "forward")
    assert partition.input_orders == {0: (1, 0)}
    want = f(a, b)
    _close(partition(a, b), want)
    _close(partition(a.contiguous(), b), want)


def test_inference_graph_under_no_grad():
    model = _mlp()
    x = torch.randn(8, 16, device="tern")
    compiled = torch.compile(model, backend="tern")
    with torch.no_grad():
        _close(compiled(x), model(x))
    assert ternc.stats()["graphs_by_kind"] == {"inference": 1}


# --- guards, recompiles, graph breaks -----------------------------------------------------


def test_static_shapes_recompile_and_the_counters_say_so():
    counter = torch._dynamo.testing.CompileCounterWithBackend("tern")
    fn = torch.compile(lambda x: torch.tanh(x) * 2, backend=counter, dynamic=False)
    for n in (4, 4, 6):
        x = torch.randn(n, device="tern")
        _close(fn(x), torch.tanh(x) * 2)
    assert counter.frame_count == 2
    stats = ternc.stats()
    assert stats["recompiles"]["count"] >= 1
    assert any("size" in r or "shape" in r for r in stats["recompiles"]["reasons"])


def test_dynamic_sizes_one_trace_an_executable_per_size_no_recompile():
    counter = torch._dynamo.testing.CompileCounterWithBackend("tern")
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                             batch_first=True, dropout=0.0).to("tern")
    compiled = torch.compile(layer, backend=counter, dynamic=True)
    frames = []
    with torch.no_grad():
        for n in (5, 9, 17, 9):
            x = torch.randn(2, n, 32, device="tern")
            _close(compiled(x), layer(x))
            frames.append(counter.frame_count)
            if len(frames) == 1:
                first_compiles = ternc.stats()["backend_compiles"]
        with torch.compiler.set_stance("fail_on_recompile"):
            x = torch.randn(3, 33, 32, device="tern")
            _close(compiled(x), layer(x))
    # The layer has a graph break of its own (its fast-path checks): its
    # frames are traced on the first call and never again.
    assert frames == [frames[0]] * 4 and counter.frame_count == frames[0]
    stats = ternc.stats()
    assert stats["recompiles"]["count"] == 0
    assert stats["backend_compiles"] == first_compiles == stats["graphs_by_kind"]["inference"]
    # 5, 9, 17 and (3, 33): four sizes, the first compiled with the graph.
    assert stats["executables"] == 4 * stats["partitions"]
    assert stats["specializations"] == 3 * stats["partitions"]


def test_automatic_dynamic_after_the_first_recompile():
    """Default torch.compile: the first size compiles static, a second size
    recompiles once with the dimension dynamic (Dynamo's automatic dynamic
    shapes), and later sizes reuse that graph: only new executables."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("tern")
    model = _mlp()
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad():
        for n in (8, 12, 20, 33, 12):
            x = torch.randn(n, 16, device="tern")
            _close(compiled(x), model(x))
    assert counter.frame_count == 2
    stats = ternc.stats()
    assert stats["recompiles"]["count"] == 1
    assert stats["backend_compiles"] == 2
    # One partition per graph. The static graph: size 8; the dynamic graph:
    # 12 (with the graph), then 20 and 33 (specialisations).
    assert stats["partitions"] == 2
    assert stats["executables"] == 4 and stats["specializations"] == 2


def test_graph_break_gives_two_graphs_and_the_right_answer():
    counter = torch._dynamo.testing.CompileCounterWithBackend("tern")

    def fn(x):
        y = torch.sin(x) + 1
        torch._dynamo.graph_break()
        return torch.cos(y) * y

    x = torch.randn(5, 3, device="tern")
    _close(torch.compile(fn, backend=counter)(x), fn(x))
    assert counter.frame_count == 2
    assert ternc.stats()["partitions"] == 2


def test_autocast_region_inside_a_compiled_graph():
    model = _mlp()
    x = torch.randn(8, 16, device="tern")

    def fn(x):
        with torch.autocast("tern", dtype=torch.bfloat16):
            return model(x)

    got = torch.compile(fn, backend="tern")(x)
    want = fn(x)
    assert got.dtype == want.dtype
    _close(got, want, tol=2e-2)


# --- partitions and the fallback -----------------------------------------------------------


def _with_unsupported(x):
    # cumsum has no lowering in tern's compiler: it splits the graph in two.
    y = torch.relu(x) * 3
    return torch.cumsum(y, dim=1) - y


def test_unsupported_operator_runs_eagerly_between_partitions():
    x = torch.randn(4, 6, device="tern")
    _close(torch.compile(_with_unsupported, backend="tern")(x), _with_unsupported(x))
    stats = ternc.stats()
    assert stats["fallback_nodes"] == {"aten.cumsum.default": 1}
    assert "no lowering" in stats["fallback_reasons"]["aten.cumsum.default"]
    assert stats["partitions"] == 2


def test_number_minus_tensor_compiles():
    def fn(x):
        return (1.0 - torch.sigmoid(x)) * x

    x = torch.randn(4, 6, device="tern")
    _close(torch.compile(fn, backend="tern")(x), fn(x), tol=0)
    assert ternc.stats()["fallback_nodes"] == {}


def test_fallback_error_mode_names_the_operator(monkeypatch):
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "error")
    x = torch.randn(4, 6, device="tern")
    with pytest.raises(Exception, match=r"TORCH_TERN_FALLBACK=error forbids.*aten\.cumsum\.default"):
        torch.compile(_with_unsupported, backend="tern")(x)


def test_fallback_warn_mode_warns_once(monkeypatch):
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "warn")
    from torch_tern.compiler import _dynamo

    _dynamo._WARNED.discard("aten.cumsum.default")
    x = torch.randn(4, 6, device="tern")
    with pytest.warns(UserWarning, match="cumsum"):
        torch.compile(_with_unsupported, backend="tern")(x)


# --- compiled optimizers ----------------------------------------------------------------------


@pytest.mark.parametrize("capturable", [False, True])
def test_compiled_adamw_step_matches_eager_with_no_eager_foreach(capturable):
    # AdamW's foreach operators become per-tensor operators the compiler fuses
    # (one elementwise program per parameter).
    torch.manual_seed(0)
    model = _mlp()
    twin = copy.deepcopy(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1, capturable=capturable)
            for m in (model, twin)]
    compiled_step = torch.compile(opts[0].step, backend="tern")
    x = torch.randn(8, 16, device="tern")
    for _ in range(3):
        for m, opt, step in ((model, opts[0], compiled_step), (twin, opts[1], opts[1].step)):
            opt.zero_grad()
            m(x).square().mean().backward()
            step()
    for a, b in zip(model.parameters(), twin.parameters()):
        _close(a, b)
    for p, q in zip(model.parameters(), twin.parameters()):
        _close(opts[0].state[p]["exp_avg_sq"], opts[1].state[q]["exp_avg_sq"])
        # Compiled, the step counters live on the device either way (as
        # Dynamo makes them for CUDA parameters); eagerly, as asked.
        assert opts[0].state[p]["step"].device.type == "tern"
        assert opts[1].state[q]["step"].device.type == ("tern" if capturable else "cpu")
    stats = ternc.stats()
    assert stats["fallback_nodes"] == {}, stats["fallback_nodes"]
    assert stats["partitions"] == 1


def test_compiled_adamw_step_updates_parameters_in_place(tmp_path):
    # The step's graph ends with copy_(input, value) for every parameter and
    # state it updates: the executable writes them where they are (each
    # mutated output bound to its input's memory), with no copy afterwards.
    import json

    torch.manual_seed(0)
    model = _mlp()
    twin = copy.deepcopy(model)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True) for m in (model, twin)]
    compiled_step = torch.compile(opts[0].step, backend="tern")
    x = torch.randn(8, 16, device="tern")
    for m in (model, twin):
        m(x).square().mean().backward()
    compiled_step()  # compiles (and initialises the states)
    opts[1].step()
    before = [p.data_ptr() for p in model.parameters()]
    trace = tmp_path / "step.json"
    with torch.tern.profiler.profile(str(trace)):
        compiled_step()
        torch.tern.synchronize()
    opts[1].step()
    for a, b in zip(model.parameters(), twin.parameters()):
        _close(a, b)
    assert [p.data_ptr() for p in model.parameters()] == before
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = [e.get("name", "") for e in events if e.get("ph") == "X"]
    assert any(n.startswith("execute") for n in names), names
    assert not [n for n in names if n.startswith("copy D2D")], names


def test_an_input_update_waits_for_its_eager_readers():
    # buf is read by cumsum (no lowering: eager) and by buf * 3, and updated
    # in place (copy_ at the graph's end): readers see the old buf, and buf
    # ends updated, whichever partition takes the update.
    def step(buf, x):
        z = buf * 3
        y = torch.cumsum(buf, dim=0)
        buf.mul_(2)
        return y + z + x

    buf = torch.arange(6.0, device="tern").reshape(2, 3)
    buf_ref = buf.clone()
    x = torch.ones(2, 3, device="tern")
    with torch.no_grad():
        got = torch.compile(step, backend="tern")(buf, x)
        want = step(buf_ref, x)
    _close(got, want, tol=0)
    _close(buf, buf_ref, tol=0)


# --- the persistent cache ---------------------------------------------------------------------

_SECOND_PROCESS = textwrap.dedent("""
    import json, torch, torch_tern, torch_tern.compiler as ternc
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4)).to("tern")
    x = torch.randn(8, 16, device="tern")
    torch.compile(model, backend="tern")(x).sum().backward()
    s = ternc.stats()
    print(json.dumps({k: s[k] for k in ("executables", "cache_hits", "cache_misses")}))
""")


def test_second_process_compiles_nothing_and_clear_cache_empties(tmp_path, node_env):
    env = dict(node_env, TORCH_TERN_CACHE_DIR=str(tmp_path / "shared-cache"))
    runs = [subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    import json

    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first["cache_misses"] == first["executables"] >= 2
    assert second["cache_hits"] == second["executables"] == first["executables"]
    assert second["cache_misses"] == 0
    os.environ["TORCH_TERN_CACHE_DIR"] = env["TORCH_TERN_CACHE_DIR"]
    cleared = ternc.clear_cache()
    assert cleared["entries_removed"] == first["executables"]
    assert ternc.clear_cache()["entries_removed"] == 0


# --- real models ---------------------------------------------------------------------------------


def _train_both(model, batch_fn, steps=20):
    """Trains `model` on tern eagerly and a copy compiled with backend="tern",
    AdamW, the same batches; returns both losses per step and both models."""
    eager = model.to("tern")
    compiled_model = copy.deepcopy(eager)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_c = torch.optim.AdamW(compiled_model.parameters(), lr=1e-3)
    compiled = torch.compile(compiled_model, backend="tern")
    losses = []
    for step in range(steps):
        args = batch_fn(step)
        pair = []
        for m, opt in ((eager, opt_e), (compiled, opt_c)):
            loss = m(*args)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            pair.append(loss.item())
        losses.append(pair)
    return losses, eager, compiled_model


def _assert_trained_alike(losses, eager, compiled_model):
    for step, (e, c) in enumerate(losses):
        assert abs(e - c) <= TOL * abs(e), (step, e, c)
    # All parameters as one vector: AdamW turns gradients that are zero in
    # exact arithmetic (GPT-2's key bias: softmax ignores a shift common to
    # all keys) into full-size steps of rounding noise, different on each
    # side, so single tiny tensors are compared within the whole.
    a = torch.cat([p.detach().cpu().reshape(-1) for p in eager.parameters()])
    b = torch.cat([p.detach().cpu().reshape(-1) for p in compiled_model.parameters()])
    assert ((a - b).norm() / a.norm()).item() <= TOL


def _lm_batches(vocab):
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, vocab, (2, 16), generator=gen).to("tern") for _ in range(4)]
    return lambda step: (batches[step % 4],)


class _LMLoss(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


def test_gpt2_trains_20_adamw_steps_like_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                     n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    model = _LMLoss(transformers.GPT2LMHeadModel(config))
    _assert_trained_alike(*_train_both(model, _lm_batches(128)))
    stats = ternc.stats()
    assert stats["compiled_nodes"] > 300
    assert stats["recompiles"]["count"] == 0


def test_llama_trains_20_adamw_steps_like_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=128, max_position_embeddings=64)
    model = _LMLoss(transformers.LlamaForCausalLM(config))
    _assert_trained_alike(*_train_both(model, _lm_batches(128)))
    assert ternc.stats()["compiled_nodes"] > 300


class _SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            # No bias before batch norm (its gradient is zero in exact
            # arithmetic, and AdamW would amplify the rounding noise).
            torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(16, 10))

    def forward(self, x, target):
        return torch.nn.functional.cross_entropy(self.features(x), target)


def test_cnn_with_batch_norm_trains_like_eager():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    data = [(torch.randn(4, 3, 16, 16, generator=gen).to("tern"),
             torch.randint(0, 10, (4,), generator=gen).to("tern")) for _ in range(2)]
    model = _SmallCNN()
    losses, eager, compiled_model = _train_both(model, lambda step: data[step % 2], steps=10)
    _assert_trained_alike(losses, eager, compiled_model)
    # Training-mode batch norm updates the running statistics on both sides.
    for a, b in zip(eager.buffers(), compiled_model.buffers()):
        _close(b, a)
    assert ternc.stats()["compiled_nodes"] > 20


def test_variable_length_training_traces_once_and_never_recompiles():
    """A GPT-2 trained on random sequence lengths with dynamic=True: after the
    first step, no recompile and no new backend compile, only one executable
    per partition and size. (Lengths from 2: a language model's loss over one
    token has no targets; Dynamo would also specialise length 1.) The benchmark
    runs 200 steps over [1, 512]."""
    transformers = pytest.importorskip("transformers")
    import random

    torch.manual_seed(0)
    rng = random.Random(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    model = _LMLoss(transformers.GPT2LMHeadModel(config)).to("tern")
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    counter = torch._dynamo.testing.CompileCounterWithBackend("tern")
    compiled = torch.compile(model, backend=counter, dynamic=True)
    lengths = [5] + [rng.randint(2, 128) for _ in range(15)]
    for step, n in enumerate(lengths):
        ids = torch.randint(0, 64, (2, n)).to("tern")
        if step == 1:
            warm = (counter.frame_count, ternc.stats()["backend_compiles"])
            stance = torch.compiler.set_stance("fail_on_recompile")
            stance.__enter__()
        try:
            losses = []
            for m, o in ((compiled, opt), (reference, opt_ref)):
                loss = m(ids)
                loss.backward()
                o.step()
                o.zero_grad(set_to_none=True)
                losses.append(loss.item())
        finally:
            if step == len(lengths) - 1:
                stance.__exit__(None, None, None)
        assert abs(losses[0] - losses[1]) <= TOL * abs(losses[1]), (step, n, losses)
    assert (counter.frame_count, ternc.stats()["backend_compiles"]) == warm
    stats = ternc.stats()
    assert stats["recompiles"]["count"] == 0
    assert stats["specializations"] >= len(set(lengths)) - 1
