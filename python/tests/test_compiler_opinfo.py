"""The graph compiler's numerics against PyTorch CPU eager, on PyTorch's OpInfo samples.

For every operator the compiler knows (``torch_tern._C._compiler_known_ops()``,
the list ``ternc ops`` prints), the OpInfo entries of PyTorch's ``op_db`` whose
samples reach it (OPINFOS) are run through the whole compiler path: each
sample becomes a small ``nn.Module`` whose tensors (``sample.input`` and every
tensor among its args and kwargs, lists included) are the graph's inputs and
whose other arguments are captured; ``torch_tern.compiler.export`` compiles it
into a temporary ``.tern`` file, ``torch_tern.compiler.load`` runs it on tern
copies of the inputs, and every output is compared with the CPU's (the plugin
OpInfo suite's ``opinfo_harness.compare``: ``assert_close`` at rtol = atol =
1e-3, NaNs equal, dtypes and shapes exact).

Each sample is

- passed: the compiled result matches;
- skipped: the CPU itself rejects the sample, ``torch.export`` cannot trace it
  (data-dependent arguments), or the compiler refuses it with its clear "not
  supported" error (REFUSALS: an op it does not know, an attribute or dtype it
  does not lower): counted and reported with the message;
- failed: anything else (a wrong result, an error that is not such a refusal,
  a crash); known failures are strict xfails that only their message
  satisfies (KNOWN_FAILURES).

By default the test command runs a fixed subset: the first DEFAULT_SAMPLES
float32 samples of each OpInfo in OPINFOS plus EXTRA_SAMPLES (samples that
reach an op the first ones do not), so that every compiler op is exercised by
a passing sample (test_zz_summary checks it). The full sweep, every sample in
float32, int64 and bool where the OpInfo supports them, with a summary table
per op, is a separate command (docs/torch-opinfo.md):

    TORCH_TERN_COMPILER_OPINFO=full TORCH_TERN_SKIP_BUILD=1 \\
        python/build_and_test.sh -k compiler_opinfo -rs

Executables go to pytest's temporary directories and through a compile cache
of their own (TERN_COMPILE_CACHE_DIR under the session's temporary
directory), so a stale cache entry of an older compiler never hides a change.
"""

from __future__ import annotations

import collections
import itertools
import os
import re
import sys
import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils import _pytree as pytree

import torch_tern
import torch_tern.compiler as tc
from torch_tern.compiler import _frontend

sys.path.insert(0, os.path.dirname(__file__))
import opinfo_harness as harness  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

FULL = os.environ.get("TORCH_TERN_COMPILER_OPINFO", "") == "full"
DEFAULT_SAMPLES = 1
DTYPES = {"f32": torch.float32, "i64": torch.int64, "bool": torch.bool}

# Compiler op -> the OpInfo entries (name or name.variant) whose samples
# reach it after torch.export and the core ATen decompositions.
OPINFOS = {
    "aten._log_softmax.default": ["log_softmax"],
    "aten._native_batch_norm_legit_no_training.default": ["nn.functional.batch_norm"],
    "aten._softmax.default": ["softmax", "nn.functional.softmin"],
    "aten._to_copy.default": ["bool", "long", "int", "half", "bfloat16", "to"],
    "aten.abs.default": ["abs"],
    "aten.add.Scalar": ["nn.functional.rms_norm"],
    "aten.add.Tensor": ["add", "__radd__"],
    "aten.addmm.default": ["addmm", "addmm.decomposed", "nn.functional.linear"],
    "aten.amax.default": ["amax", "logsumexp"],
    "aten.any.dim": ["any", "torch.ops.aten._safe_softmax.default"],
    "aten.bitwise_and.Tensor": ["bitwise_and", "isclose"],  # float32: isclose (bool & bool)
    "aten.bitwise_or.Tensor": ["bitwise_or", "isclose"],
    "aten.bmm.default": ["bmm", "matmul"],
    "aten.cat.default": ["cat", "stack"],
    "aten.clamp.default": ["nn.functional.hardsigmoid", "nn.functional.hardswish"],
    "aten.clone.default": ["clone"],
    "aten.alias.default": ["alias_copy"],  # detach() exports as it too
    "aten.constant_pad_nd.default": ["constant_pad_nd", "nn.functional.pad.constant"],
    "aten.convolution.default": ["nn.functional.conv2d"],
    "aten.cos.default": ["cos"],
    "aten.div.Scalar": ["gradient"],
    "aten.div.Tensor": ["div.no_rounding_mode", "true_divide"],
    "aten.embedding.default": ["nn.functional.embedding"],
    "aten.eq.Scalar": ["isposinf", "isneginf"],
    "aten.eq.Tensor": ["eq"],
    "aten.erf.default": ["erf"],
    "aten.exp.default": ["exp"],
    "aten.expand.default": ["expand", "expand_as", "broadcast_to"],
    "aten.full_like.default": ["full_like", "zeros_like", "ones_like"],
    "aten.gather.default": ["gather", "nn.functional.nll_loss"],
    "aten.ge.Scalar": ["lerp"],
    "aten.ge.Tensor": ["ge"],
    "aten.gelu.default": ["nn.functional.gelu"],
    "aten.gt.Scalar": ["nn.functional.prelu"],
    "aten.gt.Tensor": ["gt"],
    "aten.index_put.default": ["index_add", "index_put"],  # index_add: accumulate=True
    "aten.le.Scalar": ["nn.functional.threshold"],
    "aten.le.Tensor": ["le"],
    "aten.log.default": ["log"],
    "aten.logical_and.default": ["logical_and"],
    "aten.logical_not.default": ["logical_not"],
    "aten.logical_or.default": ["logical_or"],
    "aten.lt.Scalar": ["nn.functional.huber_loss"],
    "aten.lt.Tensor": ["lt"],
    "aten.max_pool2d_with_indices.default": ["nn.functional.max_pool2d"],
    "aten.maximum.default": ["maximum", "max.binary"],
    "aten.mean.dim": ["mean"],
    "aten.minimum.default": ["minimum", "min.binary"],
    "aten.mm.default": ["mm", "matmul"],
    "aten.mul.Scalar": ["special.ndtr"],
    "aten.mul.Tensor": ["mul", "__rmul__"],
    "aten.native_layer_norm.default": ["native_layer_norm", "nn.functional.layer_norm"],
    "aten.ne.Scalar": ["isfinite", "count_nonzero"],
    "aten.ne.Tensor": ["ne"],
    "aten.neg.default": ["neg"],
    "aten.permute.default": ["permute", "transpose", "t"],
    "aten.pow.Tensor_Scalar": ["square", "nn.functional.rms_norm"],
    "aten.relu.default": ["nn.functional.relu"],
    "aten.rms_norm.default": ["nn.functional.rms_norm"],
    "aten.rsqrt.default": ["rsqrt"],
    "aten.select.int": ["select"],
    "aten.sigmoid.default": ["sigmoid", "nn.functional.silu"],
    "aten.sin.default": ["sin"],
    "aten.slice.Tensor": ["narrow", "slice"],
    "aten.split_with_sizes.default": ["split", "split_with_sizes", "chunk"],
    "aten.sqrt.default": ["sqrt"],
    "aten.squeeze.dims": ["squeeze", "squeeze.multiple"],
    "aten.sub.Tensor": ["sub", "__rsub__", "rsub"],
    "aten.sum.dim_IntList": ["sum"],
    "aten.tanh.default": ["tanh"],
    "aten.unsqueeze.default": ["unsqueeze"],
    "aten.view.default": ["view", "reshape", "flatten"],
    "aten.where.self": ["where"],
}

# The reason of the backward ops (the gradients of layer_norm, softmax and the
# activations): torch.export's core ATen decompositions write them out, so no
# exported sample has them; torch.compile's backward graphs keep them when the
# backend's decompositions leave them alone.
_BACKWARD = ("a backward op: the core ATen decompositions write it out in exported graphs (it "
             "is for graphs that keep it, torch.compile's backward graphs)")

# The reason of the training-mode forward ops (batch norm updating its running
# statistics): likewise written out by the core ATen decompositions, kept in
# the forward graphs torch.compile makes of a model in training mode.
_TRAINING = ("a training-mode op: the core ATen decompositions write it out in exported graphs "
             "(it is for graphs that keep it, torch.compile's forward graphs in training mode)")

# Compiler ops no OpInfo sample reaches (the exported graph of a PyTorch
# program never has them after the core ATen decompositions, or only inside
# larger decompositions), and why; test_zz_summary checks that they stay
# unreached, so that one that becomes reachable is moved into OPINFOS.
UNREACHED = {
    "aten._log_softmax_backward_data.default": _BACKWARD + " (log_softmax's gradient)",
    "aten._native_batch_norm_legit_functional.default": _TRAINING + " (batch norm in training)",
    "aten._softmax_backward_data.default": _BACKWARD + " (softmax's gradient)",
    "aten._unsafe_view.default": "the core ATen decompositions turn it into aten.view (no "
                                 "OpInfo sample's exported graph has it)",
    "aten.bitwise_not.default": "op_db has no bitwise_not OpInfo and no float32 sample of "
                                "another reaches it (~x on an integer or bool tensor exports as "
                                "it)",
    "aten.clamp_max.default": "the core ATen decompositions turn it into aten.clamp (it is for "
                              "graphs that keep it, torch.compile's)",
    "aten.clamp_min.default": "the core ATen decompositions turn it into aten.clamp (it is for "
                              "graphs that keep it, torch.compile's)",
    "aten.convolution_backward.default": _BACKWARD + " (convolution's gradient)",
    "aten.embedding_dense_backward.default": _BACKWARD + " (embedding's gradient)",
    "aten.gelu_backward.default": _BACKWARD + " (gelu's gradient)",
    "aten.max_pool2d_with_indices_backward.default": _BACKWARD + " (max_pool2d's gradient)",
    "aten.native_batch_norm_backward.default": _BACKWARD + " (batch_norm's gradient)",
    "aten.native_layer_norm_backward.default": _BACKWARD + " (layer_norm's gradient)",
    "aten.scatter.value": "no float32 sample of scatter reaches it (they scatter tensors: "
                          "aten.scatter.src); scatter(x, dim, index, number) exports as it, as "
                          "in nll_loss's backward",
    "aten.sigmoid_backward.default": _BACKWARD + " (sigmoid's gradient)",
    "aten.silu.default": "the core ATen decompositions turn it into x * sigmoid(x) "
                         "(nn.functional.silu exports as aten.mul and aten.sigmoid)",
    "aten.silu_backward.default": _BACKWARD + " (silu's gradient)",
    "aten.sub.Scalar": "only nanquantile's decomposition has it, next to ops the compiler does "
                       "not know (sort, isnan); x - 1 exports as aten.sub.Tensor",
    "aten.tanh_backward.default": _BACKWARD + " (tanh's gradient)",
    "aten.threshold_backward.default": _BACKWARD + " (relu's gradient)",
}

# Compiler ops that the compiler's own passes form from the decomposed graph
# (compiler/passes): the front end's graph never has them, so a passing
# sample of their OpInfos counts as exercising them.
FORMED_BY_PASSES = {"aten.rms_norm.default"}

# Samples of the default subset beyond the first DEFAULT_SAMPLES: (OpInfo,
# dtype) -> sample indices, each reaching a compiler op (or a lowering
# path) that the first samples do not.
EXTRA_SAMPLES = {
    # The first samples use ceil_mode=True (refused): plain, and padding with dilation.
    ("nn.functional.max_pool2d", "f32"): [13, 19],
    ("nn.functional.conv2d", "f32"): [2],  # groups=2, dilation, asymmetric stride and padding
    ("lerp", "f32"): [4],  # a tensor weight: aten.ge.Scalar on an input (a number weight folds)
    # The first sample has training=True (a training-mode op); the second is eval mode.
    ("nn.functional.batch_norm", "f32"): [1],
}

# Known bugs: (OpInfo, dtype, sample index) -> (what is wrong, a piece of
# the failure's message). Strict xfails that only a failure with that message
# satisfies: another failure fails the test, and so does a pass (remove the
# entry then).
KNOWN_FAILURES: dict = {}

class KnownFailure(AssertionError):
    """A sample failing as its entry in KNOWN_FAILURES says."""


# The compiler's clear refusals (its "not supported" errors and the front
# end's): a sample refused with one of these is a skip, any other error a
# failure.
REFUSALS = [
    "not supported by the compiler yet",  # lowering: an op it knows but does not lower
    "the compiler does not know this operator",  # not in `ternc ops`
    "does not lower yet",  # an attribute value (ceil_mode, transposed convolution)
    "not lowered yet",  # Conv1d/Conv3d, symbolic shapes
    "is lowered for float tensors only",  # pow, max pooling on integers
    "this op takes f32, bf16 or f16",  # a float-only op on an integer or bool tensor
    "which the compiler does not compute",  # the indices of max pooling
    "which are empty; use only output 0",  # the saved statistics of an eval batch norm
    "has no tern equivalent",  # front end: a dtype tern does not have (float64)
    "which tern does not have",  # an attribute's dtype tern does not have
    "has no compiler attribute kind",  # front end: an argument it cannot represent
    "which the compiler does not produce",  # front end: mutated inputs (batch norm training)
    "which the compiler does not take",  # front end: an input kind
    "executables take at most rank",
]


def refusal(message: str) -> str | None:
    """The compiler's refusal in `message` (without the node's description), or None."""
    for phrase in REFUSALS:
        if phrase in message:
            first = message.strip().splitlines()[0]
            # "node 'x' (aten.op, file:line): why" -> "aten.op: why"
            m = re.match(r"node '[^']*' \(([^,)]+)[^)]*\)(.*)", first)
            return f"{m.group(1)}{m.group(2)}" if m else first
    return None


# ---- the samples ---------------------------------------------------------------------------

_OPS = None
_SAMPLES: dict = {}


def opinfo(key: str):
    global _OPS
    if _OPS is None:
        from torch.testing._internal.common_methods_invocations import op_db

        _OPS = {harness.op_key(op): op for op in op_db}
    return _OPS[key]


def opinfo_keys() -> list[str]:
    keys = []
    for names in OPINFOS.values():
        keys += [k for k in names if k not in keys]
    return keys


def samples(key: str, dtype: str, count: int | None = None) -> list:
    """The first `count` (all: None) samples of OpInfo `key`, drawn on the CPU
    with a fixed seed (the same ones whenever asked)."""
    cached = _SAMPLES.get((key, dtype))
    if cached is None or (not cached[1] and (count is None or count > len(cached[0]))):
        torch.manual_seed(0)
        generator = opinfo(key).sample_inputs("cpu", DTYPES[dtype], requires_grad=False)
        drawn = list(itertools.islice(generator, count))
        cached = (drawn, count is None or len(drawn) < count)
        _SAMPLES[(key, dtype)] = cached
    return cached[0] if count is None else cached[0][:count]


def expected_failure(key: str, dtype: str, index: int):
    """(reason, message piece) when the sample is a known failure, else None."""
    if (key, dtype, index) in KNOWN_FAILURES:
        return KNOWN_FAILURES[(key, dtype, index)]
    return None


def cases() -> list:
    params = []
    for key in opinfo_keys():
        if FULL:
            op = opinfo(key)
            for dtype, torch_dtype in DTYPES.items():
                if torch_dtype not in op.supported_dtypes("cpu"):
                    continue
                params += [(key, dtype, i) for i in range(len(samples(key, dtype)))]
        else:
            extra = EXTRA_SAMPLES.get((key, "f32"), [])
            first = range(len(samples(key, "f32", DEFAULT_SAMPLES)))
            params += [(key, "f32", i) for i in sorted(set(first) | set(extra))]
    result = []
    for case in params:
        known = expected_failure(*case)
        marks = ([pytest.mark.xfail(strict=True, raises=KnownFailure, reason=known[0])]
                 if known else [])
        result.append(pytest.param(*case, id=f"{case[0]}-{case[1]}-{case[2]}", marks=marks))
    return result


CASES = cases()


# ---- the module under export -------------------------------------------------------------

class _Slot:
    """Where graph input `index` goes in the sample's arguments."""

    def __init__(self, index):
        self.index = index


def _split_tensors(value, tensors):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_split_tensors(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _split_tensors(v, tensors) for k, v in value.items()}
    return value


def _fill(value, tensors):
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return type(value)(_fill(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    return value


class SampleModule(nn.Module):
    """forward(*tensors) = op(sample.input, *sample.args, **sample.kwargs) with
    the sample's tensors as inputs and everything else captured."""

    def __init__(self, op, template):
        super().__init__()
        self.op = op
        self.template = template

    def forward(self, *tensors):
        input, args, kwargs = _fill(self.template, tensors)
        return self.op(input, *args, **kwargs)


# ---- one sample ----------------------------------------------------------------------------

RESULTS: dict = {}  # (key, dtype, index) -> (outcome, reason, compiler ops in the graph)


@pytest.fixture(scope="module")
def compile_env(tmp_path_factory):
    """A compile cache of this module's own, no export-level cache, and a spy
    on the front end that records each graph's compiler ops (for the
    coverage check)."""
    cache = tmp_path_factory.mktemp("compile-cache")
    graph_ops = []
    original = _frontend.to_graph_spec

    def recording(program):
        spec = original(program)
        graph_ops[:] = [node[0] for node in spec["nodes"]]
        return spec

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TERN_COMPILE_CACHE_DIR", str(cache))
        # Every sample is a SampleModule: export each one (no export-level
        # cache, docs/compiler.md "Export cache"); the compile cache stays.
        patch.setenv("TORCH_TERN_EXPORT_CACHE", "0")
        patch.setattr(_frontend, "to_graph_spec", recording)
        yield graph_ops


def run_case(key, dtype, index, tmp_path, graph_ops):
    """(outcome, reason): 'pass', 'skip' or 'fail'."""
    sample = samples(key, dtype, index + 1)[index]
    op = opinfo(key)
    tensors: list = []
    template = _split_tensors((sample.input, tuple(sample.args), dict(sample.kwargs)), tensors)
    model = SampleModule(op.op, template).eval()
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            expected = model(*tensors)
    except Exception as e:  # noqa: BLE001
        return "skip", f"the CPU raised {type(e).__name__}"
    leaves, _ = pytree.tree_flatten(expected)
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        return "skip", "an output is not a tensor"
    expected = [x.detach().clone() for x in leaves]

    graph_ops.clear()
    path = tmp_path / "sample.tern"
    try:
        tc.export(model, tuple(tensors), path)
    except Exception as e:  # noqa: BLE001
        message = str(e)
        why = refusal(message) if isinstance(e, ValueError) else None
        if why:
            return "skip", why
        if not graph_ops and not isinstance(e, ValueError):
            # torch.export itself did not trace it (data-dependent arguments):
            # the compiler never saw a graph.
            return "skip", f"torch.export: {type(e).__name__}: {message.splitlines()[0][:100]}"
        return "fail", f"export raised {type(e).__name__}: {message[:2000]}"
    ops = list(graph_ops)
    try:
        compiled = tc.load(path)
        outputs = compiled(*[t.to("tern") for t in tensors])
        torch.tern.synchronize()
    except Exception as e:  # noqa: BLE001
        return "fail", f"running the executable raised {type(e).__name__}: {str(e)[:2000]}"
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    actual = [x.cpu() for x in outputs]
    why = harness.compare(actual, expected)
    if why:
        return "fail", f"{why} (graph: {', '.join(ops)})"
    return "pass", ""


@pytest.mark.parametrize("key,dtype,index", CASES)
def test_compiler_matches_cpu(key, dtype, index, tmp_path, compile_env):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome, reason = run_case(key, dtype, index, tmp_path, compile_env)
    known = expected_failure(key, dtype, index) if outcome == "fail" else None
    if known and known[1] in reason:
        outcome = "xfail"
    RESULTS[(key, dtype, index)] = (outcome, reason, list(compile_env) if outcome == "pass"
                                    else [])
    if outcome == "skip":
        pytest.skip(reason)
    if outcome == "xfail":
        raise KnownFailure(f"{known[0]}: {reason}")
    if outcome == "fail":
        pytest.fail(reason, pytrace=False)


# ---- the mapping and the summary -----------------------------------------------------------

def test_every_compiler_op_is_mapped():
    known = set(torch_tern._C._compiler_known_ops())
    missing = sorted(known - set(OPINFOS) - set(UNREACHED))
    assert not missing, f"compiler ops without OpInfo entries (map them in OPINFOS): {missing}"
    for key in opinfo_keys():
        opinfo(key)  # KeyError: renamed in op_db


def _table(rows):
    lines = ["| op | dtype | samples | passed | skipped | failed | xfail | skip reasons |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for (key, dtype), c in rows:
        reasons = "; ".join(f"{n}x {r}" for r, n in c["reasons"].most_common(3))
        lines.append(f"| `{key}` | {dtype} | {c['run']} | {c['pass']} | {c['skip']} | "
                     f"{c['fail']} | {c['xfail']} | {reasons.replace('|', '/')[:200]} |")
    return "\n".join(lines)


def test_zz_summary(capsys):
    """Runs last: the totals (the table per op in the full sweep) and, when
    every sample ran, that every compiler op was exercised by a passing one."""
    if not RESULTS:
        pytest.skip("no sample ran")
    per_op = collections.defaultdict(
        lambda: {"run": 0, "pass": 0, "skip": 0, "fail": 0, "xfail": 0,
                 "reasons": collections.Counter()})
    exercised = set()
    for (key, dtype, index), (outcome, reason, ops) in RESULTS.items():
        c = per_op[(key, dtype)]
        c["run"] += 1
        c[outcome] += 1
        if outcome == "skip":
            c["reasons"][reason] += 1
        exercised |= set(ops)
        if outcome == "pass":
            exercised |= {op for op in FORMED_BY_PASSES if key in OPINFOS.get(op, [])}
    totals = collections.Counter()
    for c in per_op.values():
        totals.update({k: v for k, v in c.items() if k != "reasons"})
    with capsys.disabled():
        if FULL:
            print("\n" + _table(sorted(per_op.items())))
        print(f"\ncompiler OpInfo ({'full sweep' if FULL else 'default subset'}): "
              f"{len({k for k, _ in per_op})} OpInfos, {totals['run']} samples: "
              f"{totals['pass']} passed, {totals['skip']} skipped, {totals['fail']} failed, "
              f"{totals['xfail']} xfail")
    if len(RESULTS) < len(CASES):
        return  # a selection (-k): the coverage needs every sample
    known = set(torch_tern._C._compiler_known_ops())
    missing = sorted(known - exercised - set(UNREACHED))
    assert not missing, f"compiler ops no passing sample exercised: {missing}"
    reached = sorted(set(UNREACHED) & exercised)
    assert not reached, f"ops in UNREACHED that a sample now exercises (map them): {reached}"
