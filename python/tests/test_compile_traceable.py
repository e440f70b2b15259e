"""torch.compile on tern: every native operator traces, and inductor refuses clearly.

Dynamo and AOTAutograd run a model on fake tensors (no data) to trace it, so
every operator the plugin implements natively must have a fake (meta)
implementation and must not reach a kernel while traced. Here the OpInfo
samples of the ops with native tern kernels (opinfo_harness) are compiled
with ``torch.compile(fn, backend="aot_eager", fullgraph=True)`` on tern
tensors, forward and backward, and must match eager tern; so must a model
with ``nn.RMSNorm`` and a small Llama block (transformers, from a config).

The default run takes DEFAULT_SAMPLES samples per op (a fixed, seeded
subset, well under two minutes); the full sweep compiles every sample:

    TORCH_TERN_COMPILE_SWEEP=1 python/build_and_test.sh -k compile_traceable

``torch.compile(model)`` with the default backend (inductor) must fail at
once with a message that names the backend to pass (torch_tern/_inductor.py).
"""

import collections
import functools
import os
import sys
import time
import warnings

import pytest
import torch
import torch_tern

sys.path.insert(0, os.path.dirname(__file__))
import opinfo_harness as harness  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

SWEEP = os.environ.get("TORCH_TERN_COMPILE_SWEEP", "0") not in ("", "0")
DEFAULT_SAMPLES = 1
# Compiled against eager tern: the same kernels, but a traced composite (rms_norm)
# runs ATen's decomposition instead of tern's fused instruction.
TOL = 1e-4

# The ops of the OpInfo subset whose samples reach native kernels (the
# subset's fallback-only ops are left out) and a few more native ones.
OPS = [k for k in harness.SUBSET if k != "lgamma"] + [
    "nn.functional.threshold", "nn.functional.relu6", "nn.functional.embedding",
    "masked_select", "isnan", "flip", "nn.functional.logsigmoid", "scatter", "eye",
    "isneginf", "isposinf", "nn.functional.normalize", "nn.functional.instance_norm",
    "nn.functional.max_pool1d", "__getitem__", "index_put", "rsub", "zero_",
    "linalg.solve_triangular", "cummax", "cummin", "logspace", "nn.functional.max_pool3d",
    "nn.functional.max_unpool2d", "nn.functional.max_unpool3d", "searchsorted", "roll",
    "nn.functional.avg_pool2d",
]

# Native ops (by base name) that no compiled OpInfo graph holds, and why that
# is fine. Base name: the schema name without overload and in-place suffix.
ELSEWHERE = {
    # Allocation, copies, storage and streams: ATen's own meta functions; the
    # graph holds the functional operators that use them.
    "_copy_from": "copies (ATen's copy_ meta)",
    "_copy_from_and_resize": "copies (ATen's copy_ meta)",
    "_local_scalar_dense": "item(): a graph break, not a graph operator",
    "empty": "allocation", "empty_strided": "allocation", "resize": "allocation",
    "set": "storage", "record_stream": "streams",
    "_has_compatible_shallow_copy_type": "a question about tensor types (Module.to, set_data)",
    "as_strided": "views are metadata", "view": "views are metadata",
    "_reshape_alias": "views are metadata", "unfold": "views are metadata",
    "view_as_real": "views are metadata", "view_as_complex": "views are metadata",
    # CompositeImplicitAutograd ops: traced, they decompose (docs/torch.md).
    "rms_norm": "ATen composite when traced (test_rms_norm_model)",
    "mish_backward": "ATen composite when traced",
    "silu_backward": "PyTorch decomposes it when traced (a Python CompositeImplicitAutograd rule)",
    # Random: compared separately (test_random_ops), OpInfo excludes them.
    "uniform": "test_random_ops", "normal": "test_random_ops", "bernoulli": "test_random_ops",
    "random": "test_random_ops", "exponential": "test_random_ops",
    "native_dropout": "test_random_ops", "native_dropout_backward": "test_random_ops",
    # Integer only (the OpInfo harness runs float32): test_integer_ops.
    "bitwise_and": "test_integer_ops", "bitwise_or": "test_integer_ops",
    "bitwise_xor": "test_integer_ops", "bitwise_not": "test_integer_ops",
    # Optimizers: test_foreach_and_fused_adamw.
    "_foreach_add": "test_foreach_and_fused_adamw", "_foreach_mul": "test_foreach_and_fused_adamw",
    "_foreach_div": "test_foreach_and_fused_adamw",
    "_foreach_addcdiv": "test_foreach_and_fused_adamw",
    "_foreach_addcmul": "test_foreach_and_fused_adamw",
    "_foreach_lerp": "test_foreach_and_fused_adamw",
    "_foreach_sqrt": "test_foreach_and_fused_adamw",
    "_foreach_zero": "test_foreach_and_fused_adamw",
    "_fused_adam": "test_foreach_and_fused_adamw", "_fused_adamw": "test_foreach_and_fused_adamw",
    # What PyTorch sends to accelerators only (test_accelerator_only_ops.py).
    "_thnn_fused_lstm_cell": "test_rnn_cells", "_thnn_fused_gru_cell": "test_rnn_cells",
    "_thnn_fused_lstm_cell_backward_impl": "test_rnn_cells",
    "_thnn_fused_gru_cell_backward": "test_rnn_cells",
    "histc": "test_integer_histc",
    # GradScaler's step: eager between compiled graphs (test_autocast.py).
    "_amp_foreach_non_finite_check_and_unscale": "test_grad_scaler_matches_cpu",
    "_amp_update_scale": "test_grad_scaler_matches_cpu",
    # A data-dependent output size: Dynamo breaks the graph there (fullgraph
    # refuses it); eager only (test_pool_logspace.py).
    "_unique2": "test_unique_matches_cpu", "unique_consecutive": "test_unique_matches_cpu",
    "unique_dim": "test_unique_dim_matches_cpu",
    "unique_dim_consecutive": "test_unique_dim_matches_cpu",
    "nonzero": "test_boolean_mask_reads_and_nonzero",
    # nn.SyncBatchNorm's pieces: a torch.distributed autograd.Function, eager
    # (test_distributed.py::test_distributed_sync_batch_norm_matches_single_process).
    "batch_norm_stats": "SyncBatchNorm", "batch_norm_elemt": "SyncBatchNorm",
    "batch_norm_gather_stats": "SyncBatchNorm",
    "batch_norm_gather_stats_with_counts": "SyncBatchNorm",
    "batch_norm_backward_reduce": "SyncBatchNorm", "batch_norm_backward_elemt": "SyncBatchNorm",
}


# Native ops that traced graphs hold under another name.
ALIASES = {
    "_index_put_impl": {"index_put"},
    "_cummax_helper": {"cummax"},
    "_cummin_helper": {"cummin"},
    "native_batch_norm": {"_native_batch_norm_legit_functional",
                          "_native_batch_norm_legit_no_training", "_native_batch_norm_legit"},
}

# Samples Dynamo cannot take on any device but the CPU (the meta device fails
# the same way): (op, words of the error) -> why.
PYTORCH_LIMITS = {
    ("narrow", "PendingUnbackedSymbolNotFound"):
        "a start given as a device tensor: Dynamo loses the unbacked size of its item()",
}


def base_name(schema_name: str) -> str:
    name = schema_name.split(".")[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


class Recorder:
    """A Dynamo backend: aot_eager itself (AOTAutograd's forward and backward
    graphs run eagerly), with compilers that record every graph's operators."""

    def __init__(self):
        from torch._dynamo.backends.debugging import aot_eager, boxed_nop

        self.ops = set()

        def compiler(gm, example_inputs):
            for node in gm.graph.nodes:
                if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                    self.ops.add(base_name(node.target.name().split("::")[-1]))
            return boxed_nop(gm, example_inputs)

        self.backend = functools.partial(aot_eager, fw_compiler=compiler, bw_compiler=compiler)


def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from tensors(v)


def run(fn, sample):
    """fn's result on tern copies of `sample` and the gradients of the sum of its
    floating outputs with respect to the inputs that require them."""
    inp, args, kwargs = (harness.to_tern(sample.input), harness.to_tern(sample.args),
                         harness.to_tern(sample.kwargs))
    if "device" in kwargs and str(kwargs["device"]).startswith("cpu"):
        kwargs["device"] = "tern"
    leaves = [t for t in tensors((inp, args, kwargs)) if t.requires_grad]
    torch.manual_seed(0)
    out = fn(inp, *args, **kwargs)
    grads = []
    outs = [t for t in tensors(out) if t.requires_grad and t.is_floating_point()]
    if leaves and outs:
        loss = sum(t.float().sum() for t in outs)
        grads = list(torch.autograd.grad(loss, leaves, allow_unused=True))
    return harness.to_cpu(out), harness.to_cpu(grads)


# OpInfo entries whose callable wraps the op in something Dynamo skips
# (wrapper_set_seed): compiled as the op itself.
DIRECT = {
    "nn.functional.scaled_dot_product_attention": torch.nn.functional.scaled_dot_product_attention,
}


def compiles_on_cpu(fn, sample):
    """Whether Dynamo and AOTAutograd take the sample on CPU tensors: if not, a
    failure on tern is PyTorch's limitation (e.g. narrow with a tensor start:
    an unbacked size), not tern's."""
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.compile(fn, backend="aot_eager", fullgraph=True)(
                sample.input, *sample.args, **sample.kwargs)
        return True
    except Exception:  # noqa: BLE001
        return False


def check_sample(op, sample, recorder):
    """("pass", None) when the compiled sample matches eager tern, ("skip", why)
    when eager tern or the compile on the CPU rejects it too, else ("fail", why)."""
    if harness.random_sample(op, sample):
        return "skip", "draws random numbers"
    f = DIRECT.get(harness.op_key(op), op.op)

    def fn(*args, **kwargs):
        return f(*args, **kwargs)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = run(fn, sample)
    except Exception:  # noqa: BLE001 - eager tern rejects the sample: nothing to compile
        return "skip", "eager tern rejects it"
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=recorder.backend, fullgraph=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = run(compiled, sample)
    except Exception as e:  # noqa: BLE001
        if not compiles_on_cpu(fn, sample):
            return "skip", "does not compile on the CPU either"
        for (key, words), why in PYTORCH_LIMITS.items():
            if key == harness.op_key(op) and words in str(e):
                return "skip", why
        return "fail", f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    why = harness.compare(actual, expected, tol=TOL)
    return ("fail", why) if why else ("pass", None)


@pytest.fixture(scope="module")
def compiled_results():
    recorder = Recorder()
    ops = harness.selected_ops(set(OPS))
    found = {harness.op_key(op) for op in ops} | {op.name for op in ops}
    missing = [k for k in OPS if k not in found]
    assert not missing, f"not in op_db (renamed?): {missing}"
    problems, counted = [], collections.Counter()
    start = time.perf_counter()
    for op in ops:
        if harness.exclusion(op):
            continue
        torch.manual_seed(0)
        samples = op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)
        for i, sample in enumerate(samples):
            if not SWEEP and i >= DEFAULT_SAMPLES:
                break
            outcome, why = check_sample(op, sample, recorder)
            counted[outcome] += 1
            if outcome == "fail":
                problems.append(f"{harness.op_key(op)} sample {i}: {why}")
    torch._dynamo.reset()
    return problems, counted, recorder.ops, time.perf_counter() - start


def test_opinfo_samples_compile(compiled_results):
    problems, counted, _, seconds = compiled_results
    assert not problems, "\n".join(problems)
    assert counted["pass"] >= 180  # the samples really ran (185 on 2026-12-05)
    print(f"\ncompiled samples: {dict(counted)} in {seconds:.0f} s")


def test_every_native_op_is_traced(compiled_results):
    """Every native op appears in some compiled graph, or ELSEWHERE says why not."""
    _, _, seen, _ = compiled_results
    native = {base_name(name) for _, name in torch_tern._C._native_ops()}
    seen = seen | {name for name, aliases in ALIASES.items() if aliases & seen}
    unaccounted = sorted(native - seen - set(ELSEWHERE))
    assert not unaccounted, f"native ops in no compiled graph: {unaccounted}"


def compile_and_compare(make_model, x, steps=1):
    """Forward, backward and gradients of a compiled model against eager tern."""
    torch.manual_seed(0)
    eager = make_model().to("tern")
    compiled_model = make_model().to("tern")
    compiled_model.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend="aot_eager", fullgraph=True)
    for _ in range(steps):
        y_e, y_c = eager(x), compiled(x)
        y_e = y_e if isinstance(y_e, torch.Tensor) else y_e[0]
        y_c = y_c if isinstance(y_c, torch.Tensor) else y_c[0]
        torch.testing.assert_close(y_c.cpu(), y_e.cpu(), rtol=TOL, atol=TOL)
        y_e.float().square().mean().backward()
        y_c.float().square().mean().backward()
        for (name, p_e), p_c in zip(eager.named_parameters(), compiled_model.parameters()):
            torch.testing.assert_close(p_c.grad.cpu(), p_e.grad.cpu(), rtol=TOL, atol=TOL,
                                       msg=lambda m, name=name: f"{name}: {m}")
    torch._dynamo.reset()


def test_rms_norm_model(fallback_log):
    def make():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.RMSNorm(32),
                                   torch.nn.SiLU(), torch.nn.Linear(32, 8),
                                   torch.nn.RMSNorm(8, elementwise_affine=False))

    x = torch.randn(4, 5, 16).to("tern")
    compile_and_compare(make, x, steps=2)
    assert not torch_tern.get_fallback_ops(), torch_tern.get_fallback_ops()


def test_rms_norm_dynamic_shapes():
    norm = torch.nn.RMSNorm(8).to("tern")
    torch._dynamo.reset()
    compiled = torch.compile(norm, backend="aot_eager", dynamic=True, fullgraph=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 8).to("tern")
        torch.testing.assert_close(compiled(x).cpu(), norm(x).cpu(), rtol=TOL, atol=TOL)
    torch._dynamo.reset()


def test_llama_block(fallback_log):
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=64, max_position_embeddings=64)
    config._attn_implementation = "sdpa"

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = LlamaDecoderLayer(config, layer_idx=0)
            self.rope = LlamaRotaryEmbedding(config)

        def forward(self, x):
            pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            out = self.layer(x, position_embeddings=self.rope(x, pos), position_ids=pos)
            return out if isinstance(out, torch.Tensor) else out[0]

    x = torch.randn(2, 6, 32).to("tern")
    compile_and_compare(Block, x)


def test_random_ops():
    """Random ops trace; the graph draws the same numbers as eager from the same seed."""
    def fn(x):
        a = torch.empty_like(x).uniform_(-1, 2)
        b = torch.empty_like(x).normal_(0.5, 2.0)
        c = torch.bernoulli(torch.full_like(x, 0.3))
        d = torch.empty_like(x).exponential_(1.5)
        e = torch.randint_like(x, 0, 10)  # Dynamo refuses Tensor.random_
        f = torch.nn.functional.dropout(x, 0.25, training=True)
        return a, b, c, d, e, f

    x = torch.ones(64, 8).to("tern")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    expected = harness.to_cpu(fn(x))
    torch.manual_seed(3)
    actual = harness.to_cpu(compiled(x))
    assert harness.compare(actual, expected, tol=TOL) is None
    # dropout's backward (native_dropout_backward) traces too.
    w = torch.ones(64, 8).to("tern").requires_grad_()
    g = torch.compile(lambda w: torch.nn.functional.dropout(w, 0.5).sum(), backend="aot_eager",
                      fullgraph=True)
    g(w).backward()
    assert set(torch.unique(w.grad.cpu()).tolist()) <= {0.0, 2.0}
    torch._dynamo.reset()


def test_integer_ops():
    def fn(a, b):
        return (a & b, a | b, a ^ b, ~a, a & 6, a | 9, a ^ 3, torch.remainder(a, 7),
                torch.floor_divide(a, 3), a.sum(), a.max())

    a = torch.randint(-50, 50, (6, 5)).to("tern")
    b = torch.randint(-50, 50, (6, 5)).to("tern")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    assert harness.compare(harness.to_cpu(compiled(a, b)), harness.to_cpu(fn(a, b))) is None
    torch._dynamo.reset()


@pytest.mark.parametrize("cell", [torch.nn.LSTMCell, torch.nn.GRUCell])
def test_rnn_cells(cell, fallback_log):
    """ATen's cells call the fused cell ops for a tern tensor: traced, they must
    keep them (their meta kernels) and match eager tern, gradients included."""
    x = torch.randn(3, 8).to("tern")
    compile_and_compare(lambda: cell(8, 16), x, steps=2)
    assert fallback_log.get_fallback_ops() == {}


def test_integer_histc():
    x = torch.randint(0, 8, (300,), dtype=torch.int32).to("tern")
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch.histc(t, bins=8, min=0, max=7), backend="aot_eager",
                             fullgraph=True)
    assert torch.equal(compiled(x).cpu(), torch.histc(x, bins=8, min=0, max=7).cpu())
    torch._dynamo.reset()


def test_foreach_and_fused_adamw():
    def fn(xs, ys):
        a = torch._foreach_add(xs, ys)
        b = torch._foreach_mul(xs, 2.0)
        torch._foreach_addcmul_(a, b, ys, value=0.5)
        torch._foreach_addcdiv_(a, b, [y.abs() + 1 for y in ys], value=0.25)
        torch._foreach_lerp_(a, b, 0.3)
        torch._foreach_div_(b, 3.0)
        c = torch._foreach_sqrt([x.abs() for x in xs])
        return a, b, c

    torch.manual_seed(0)
    xs = [torch.randn(5, 3).to("tern") for _ in range(3)]
    ys = [torch.randn(5, 3).to("tern") for _ in range(3)]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    assert harness.compare(harness.to_cpu(compiled(xs, ys)), harness.to_cpu(fn(xs, ys)),
                           tol=TOL) is None

    for fused in (False, True):
        torch.manual_seed(0)
        eager_params = [torch.randn(4, 4).to("tern").requires_grad_() for _ in range(2)]
        comp_params = [p.detach().clone().requires_grad_() for p in eager_params]
        for p in eager_params + comp_params:
            p.grad = torch.ones_like(p) * 0.1
        kwargs = {"fused": True} if fused else {"foreach": True}
        eager_opt = torch.optim.AdamW(eager_params, lr=0.01, **kwargs)
        comp_opt = torch.optim.AdamW(comp_params, lr=0.01, **kwargs)
        step = torch.compile(comp_opt.step, backend="aot_eager")
        for _ in range(2):
            eager_opt.step()
            step()
        for p_e, p_c in zip(eager_params, comp_params):
            torch.testing.assert_close(p_c.detach().cpu(), p_e.detach().cpu(), rtol=TOL, atol=TOL)
    torch._dynamo.reset()


def test_inductor_refuses_with_a_message():
    from torch_tern._inductor import MESSAGE

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to("tern")
    x = torch.randn(2, 8).to("tern")
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(model)(x)
    assert MESSAGE in str(info.value)
    assert 'backend="aot_eager"' in str(info.value) and 'backend="tern"' in str(info.value)
    # At once: inductor's compiler refuses before lowering the graph
    # (graph.py) or scheduling kernels (scheduler.py).
    import traceback

    error = info.value
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    assert type(error).__name__ == "TernInductorUnsupported"
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    assert not [f for f in files if f.endswith(("_inductor/graph.py", "_inductor/scheduler.py"))]
    torch._dynamo.reset()


def test_inductor_registration_leaves_other_devices_alone():
    from torch._inductor.codegen import common

    common.init_backend_registration()
    import torch_tern._inductor as stub

    assert common.get_scheduling_for_device("tern") is stub.Scheduling
    assert common.get_wrapper_codegen_for_device("tern") is stub.PythonWrapperCodegen
    cpu = common.get_wrapper_codegen_for_device("cpu")
    assert cpu is not None and cpu.supports_caching
