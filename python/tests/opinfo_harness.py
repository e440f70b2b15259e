"""OpInfo harness: PyTorch's operator database run on tern against the CPU.

For every entry of ``torch.testing._internal.common_methods_invocations.op_db``
that supports float32 on the CPU, the harness draws the op's float32 sample
inputs on the CPU (seeded), runs the op on the CPU and on copies of the
inputs on tern, and compares the results (values, dtypes and shapes;
tensors with ``torch.testing.assert_close`` at rtol = atol = 1e-3, as
PyTorch's own device-versus-CPU test ``test_compare_cpu`` does, NaNs equal;
matches at 1e-5 are counted too). Each sample is counted as

- ``pass``: tern's result matches the CPU's;
- ``fail``: tern returned something else;
- ``error``: tern raised where the CPU did not;
- ``skip``: the CPU itself raised (the sample is not valid there), not counted;

and as ``native`` (no operator went through the CPU fallback while it ran on
tern) or ``fallback``. Random ops and ops whose output is uninitialized
memory are excluded (see EXCLUDED), and so are samples that draw random
numbers inside (attention with dropout).

The full run writes docs/torch-opinfo.md (a few minutes on two cores):

    .venv/bin/python -P python/tests/opinfo_harness.py --report docs/torch-opinfo.md

tests/test_opinfo.py runs the fixed subset SUBSET (well under a minute) in
the README's test command.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import math
import os
import sys
import time
import warnings

if __name__ == "__main__":
    # A private simulated node, before torch (and with it torch_tern) loads.
    os.environ.setdefault("TERN_SIM_NODE", f"opinfo-{os.getpid()}")
    os.environ.setdefault("TERN_SIM_TOPOLOGY", "2x2x2G")
    if os.environ["TERN_SIM_NODE"] == f"opinfo-{os.getpid()}":
        # Our own node: remove its shared-memory files when the process ends.
        import atexit
        import glob

        atexit.register(lambda: [os.unlink(f) for f in glob.glob(
            f"/dev/shm/tern-sim-opinfo-{os.getpid()}*")])

import torch  # noqa: E402
import torch_tern  # noqa: E402

# PyTorch's own device-versus-CPU test (test_ops.py, test_compare_cpu)
# compares at 1e-3; the report also counts how many samples match at 1e-5.
RTOL = 1e-3
ATOL = 1e-3
STRICT = 1e-5

# Ops whose results cannot be compared with the CPU's, and why.
EXCLUDED = {
    "random": "draws random numbers: tern's generator (Philox on the device) is not the CPU's",
    "uninitialized": "returns uninitialized memory",
    "storage": "reads the input's storage outside the view; the harness copies inputs to tern, "
               "which gives them a storage of their own",
}
RANDOM_OPS = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal", "uniform",
    "multinomial", "rand_like", "randn_like", "randint_like", "randint", "randn", "rand",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "randperm", "nn.functional.gumbel_softmax",
    "normal.number_mean", "normal.in_place", "svd_lowrank", "pca_lowrank",
}
UNINITIALIZED_OPS = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
}

# The fixed subset the test command runs: the ops with native tern kernels
# plus a few that take the fallback, at most SUBSET_SAMPLES samples each.
SUBSET = [
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding",
    "true_divide", "floor_divide", "remainder", "fmod", "pow", "float_power", "maximum",
    "minimum", "atan2", "copysign", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "logical_or", "logical_xor", "logical_not", "where",
    "masked_fill", "clamp", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv", "neg", "abs",
    "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
    "tan", "tanh", "sigmoid", "sinh", "cosh", "asin", "acos", "atan", "erf", "floor", "ceil",
    "round", "trunc", "sign", "square", "nn.functional.relu", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.leaky_relu", "nn.functional.elu",
    "nn.functional.softplus", "nn.functional.hardsigmoid", "nn.functional.hardswish",
    "nn.functional.mish", "nn.functional.mse_loss", "sum", "mean", "prod", "amax", "amin",
    "max.reduction_with_dim", "min.reduction_with_dim", "argmax", "argmin", "any", "all", "var",
    "std", "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.rms_norm",
    "mm", "bmm", "addmm", "baddbmm", "matmul", "mv", "addmv", "dot", "nn.functional.linear",
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.embedding", "index_select",
    "gather", "scatter_add", "index_add", "cat", "stack", "tril", "triu", "arange",
    "nn.functional.nll_loss", "nn.functional.cross_entropy", "t", "transpose", "permute",
    "view", "reshape", "expand", "narrow", "select", "squeeze", "unsqueeze", "flatten",
    "contiguous", "clone", "fill", "zeros_like", "ones_like", "full_like",
    "nn.functional.batch_norm", "nn.functional.group_norm", "nn.functional.max_pool2d",
    "linalg.vector_norm", "var_mean", "linspace", "isclose", "einsum",
    "nn.functional.scaled_dot_product_attention", "cumsum", "cumprod", "sort", "argsort",
    "topk",
    # fallbacks
    "lgamma",
]
SUBSET_SAMPLES = 6


def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def exclusion(op) -> str | None:
    key = op_key(op)
    if op.name in RANDOM_OPS or key in RANDOM_OPS:
        return "random"
    if op.name in UNINITIALIZED_OPS:
        return "uninitialized"
    if key == "as_strided.partial_views":
        return "storage"
    return None


def to_tern(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tern")
        return t.requires_grad_(x.requires_grad) if t.is_floating_point() else t
    if isinstance(x, (list, tuple)):
        return type(x)(to_tern(v) for v in x)
    if isinstance(x, dict):
        return {k: to_tern(v) for k, v in x.items()}
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [to_cpu(v) for v in x]
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    if isinstance(x, torch.device) and x.type == "tern":
        return torch.device("cpu")
    return x


def compare(actual, expected, path="result", tol=None) -> str | None:
    """None when equal (within `tol`, default RTOL/ATOL), else what differs."""
    rtol, atol = (RTOL, ATOL) if tol is None else (tol, tol)
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: a {type(actual).__name__} instead of a tensor"
        if actual.dtype != expected.dtype:
            return f"{path}: dtype {actual.dtype} instead of {expected.dtype}"
        if actual.shape != expected.shape:
            return f"{path}: shape {tuple(actual.shape)} instead of {tuple(expected.shape)}"
        try:
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                       check_device=False, check_stride=False, check_layout=False)
        except AssertionError as e:
            first = str(e).strip().splitlines()
            return f"{path}: " + " ".join(line.strip() for line in first[:3])
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: a different sequence"
        for i, (a, e) in enumerate(zip(actual, expected)):
            why = compare(a, e, f"{path}[{i}]", tol)
            if why:
                return why
        return None
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return None
        if abs(actual - expected) <= atol + rtol * abs(expected):
            return None
        return f"{path}: {actual} instead of {expected}"
    if actual != expected:
        return f"{path}: {actual!r} instead of {expected!r}"
    return None


class OpResult:
    def __init__(self, key):
        self.key = key
        self.counts = collections.Counter()  # pass/fail/error/skip x native/fallback
        self.fallback_ops = collections.Counter()
        self.first_problem = ""
        self.seconds = 0.0

    def add(self, outcome: str, native: bool, problem: str = ""):
        self.counts[outcome] += 1
        if outcome != "skip":
            self.counts[f"{outcome}_{'native' if native else 'fallback'}"] += 1
        if problem and not self.first_problem:
            self.first_problem = problem


def random_sample(op, sample) -> bool:
    """Samples that draw random numbers (attention dropout) cannot be compared."""
    if sample.kwargs.get("dropout_p", 0.0) > 0:
        return True
    if op.name == "nn.functional.multi_head_attention_forward":
        return sample.kwargs.get("training", True) and len(sample.args) > 9 and sample.args[9] > 0
    return False


def run_sample(op, sample, result: OpResult):
    if random_sample(op, sample):
        result.counts["random"] += 1
        return
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = op(sample.input, *sample.args, **sample.kwargs)
        expected = to_cpu(expected)
    except Exception:
        result.add("skip", True)
        return
    def attempt(move_args):
        tern_input = to_tern(sample.input)
        tern_args = to_tern(sample.args) if move_args else sample.args
        tern_kwargs = to_tern(sample.kwargs) if move_args else dict(sample.kwargs)
        if "device" in tern_kwargs and str(tern_kwargs["device"]).startswith("cpu"):
            tern_kwargs["device"] = "tern"
        torch_tern.clear_op_tracking()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = to_cpu(op(tern_input, *tern_args, **tern_kwargs))
            torch.tern.synchronize()
        return out

    try:
        try:
            actual = attempt(move_args=True)
        except Exception as first:  # noqa: BLE001
            # Some arguments must stay on the CPU (e.g. tensor_split's
            # indices tensor): try again with only the input on tern.
            if "cpu" not in str(first).lower():
                raise
            try:
                actual = attempt(move_args=False)
            except Exception:  # noqa: BLE001
                raise first from None
    except Exception as e:  # noqa: BLE001 - any error counts
        fell_back = bool(torch_tern.get_fallback_ops())
        result.fallback_ops.update(torch_tern.get_fallback_ops().keys())
        result.add("error", not fell_back, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return
    ops = torch_tern.get_fallback_ops()
    result.fallback_ops.update(ops.keys())
    why = compare(actual, expected)
    if not why and not compare(actual, expected, tol=STRICT):
        result.counts["strict"] += 1
    result.add("fail" if why else "pass", not ops, why or "")


def run_op(op, max_samples=None) -> OpResult:
    result = OpResult(op_key(op))
    start = time.perf_counter()
    torch.manual_seed(0)
    try:
        samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
        for i, sample in enumerate(samples):
            if max_samples is not None and i >= max_samples:
                break
            run_sample(op, sample, result)
    except Exception as e:  # noqa: BLE001 - sample generation itself failed on the CPU
        result.first_problem = result.first_problem or f"sample generation: {e}"
    result.seconds = time.perf_counter() - start
    return result


def selected_ops(keys=None):
    from torch.testing._internal.common_methods_invocations import op_db

    ops = []
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        if keys is not None and op_key(op) not in keys and op.name not in keys:
            continue
        ops.append(op)
    return ops


def summarize(results):
    total = collections.Counter()
    for r in results:
        total.update(r.counts)
    counted = total["pass"] + total["fail"] + total["error"]
    native = total["pass_native"] + total["fail_native"] + total["error_native"]
    return total, counted, native


def write_report(path, results, excluded, seconds):
    total, counted, native = summarize(results)
    lines = []
    w = lines.append
    w("# PyTorch OpInfo on tern (float32)")
    w("")
    w("Generated by `.venv/bin/python -P python/tests/opinfo_harness.py --report "
      "docs/torch-opinfo.md`")
    w("(see its docstring and docs/torch.md):")
    w("every entry of PyTorch's `op_db` that supports float32 on the CPU, all of its float32")
    w("sample inputs, run on tern and on the CPU and compared (tensors: `assert_close` with")
    w(f"rtol = atol = {RTOL:g} as PyTorch's `test_compare_cpu`, NaNs equal, dtypes and shapes")
    w("exact). A sample is *native*")
    w("when no operator took the CPU fallback while it ran on tern; samples the CPU itself")
    w("rejects are skipped.")
    w("")
    w(f"torch {torch.__version__}, torch_tern {torch_tern.__version__}; "
      f"run time {seconds / 60:.1f} min.")
    w("")
    w("| | samples | share |")
    w("| --- | ---: | ---: |")
    w(f"| compared | {counted} | 100% |")
    for name in ("pass", "fail", "error"):
        w(f"| {name} | {total[name]} | {100.0 * total[name] / max(counted, 1):.1f}% |")
    w(f"| native (no fallback) | {native} | {100.0 * native / max(counted, 1):.1f}% |")
    w(f"| pass, native | {total['pass_native']} | "
      f"{100.0 * total['pass_native'] / max(counted, 1):.1f}% |")
    w(f"| pass, fallback | {total['pass_fallback']} | "
      f"{100.0 * total['pass_fallback'] / max(counted, 1):.1f}% |")
    w(f"| pass at rtol = atol = {STRICT:g} too | {total['strict']} | "
      f"{100.0 * total['strict'] / max(counted, 1):.1f}% |")
    w(f"| skipped (the CPU raised) | {total['skip']} | |")
    w(f"| skipped (draws random numbers: attention dropout) | {total['random']} | |")
    w("")
    w(f"Ops: {len(results)} run, {len(excluded)} excluded.")
    w("")
    w("## Excluded ops")
    w("")
    for reason, text in EXCLUDED.items():
        names = sorted(k for k, r in excluded if r == reason)
        if names:
            w(f"- {text}: " + ", ".join(f"`{n}`" for n in names))
    w("")
    w("## Per op")
    w("")
    w("pass/fail/error are split as native + fallback; *fallback ops* lists the operators")
    w("that took the CPU fallback; *first problem* is the first failure or error.")
    w("")
    w("| op | samples | pass (n+f) | fail (n+f) | error (n+f) | fallback ops | first problem |")
    w("| --- | ---: | --- | --- | --- | --- | --- |")

    def nf(c, name):
        return f"{c[name]} ({c[name + '_native']}+{c[name + '_fallback']})" if c[name] else "0"

    for r in sorted(results, key=lambda r: r.key):
        c = r.counts
        n = c["pass"] + c["fail"] + c["error"]
        fb = ", ".join(sorted(r.fallback_ops))[:120]
        problem = r.first_problem.replace("|", "\\|").replace("\n", " ")[:140]
        w(f"| `{r.key}` | {n} | {nf(c, 'pass')} | {nf(c, 'fail')} | {nf(c, 'error')} | "
          f"{fb} | {problem} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", help="write the markdown report here")
    parser.add_argument("--subset", action="store_true", help="only the fixed subset")
    parser.add_argument("--ops", nargs="*", help="only these ops (names or name.variant)")
    parser.add_argument("--max-samples", type=int, default=None)
    args = parser.parse_args(argv)
    keys = set(args.ops) if args.ops else (set(SUBSET) if args.subset else None)
    max_samples = args.max_samples or (SUBSET_SAMPLES if args.subset else None)
    start = time.perf_counter()
    results, excluded = [], []
    ops = selected_ops(keys)
    for i, op in enumerate(ops):
        why = exclusion(op)
        if why:
            excluded.append((op_key(op), why))
            continue
        with contextlib.redirect_stderr(io.StringIO()):
            r = run_op(op, max_samples)
        results.append(r)
        c = r.counts
        print(f"[{i + 1}/{len(ops)}] {r.key}: pass {c['pass']} fail {c['fail']} "
              f"error {c['error']} skip {c['skip']} native "
              f"{c['pass_native'] + c['fail_native'] + c['error_native']} "
              f"({r.seconds:.1f}s) {r.first_problem[:100]}", flush=True)
    seconds = time.perf_counter() - start
    total, counted, native = summarize(results)
    print(f"samples {counted}: pass {total['pass']} ({100.0 * total['pass'] / max(counted, 1):.1f}%)"
          f" fail {total['fail']} error {total['error']}; native "
          f"{100.0 * native / max(counted, 1):.1f}%; {seconds:.0f} s")
    if args.report:
        write_report(args.report, results, excluded, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
