"""PyTorch's OpInfo samples on tern against the CPU: the fixed subset.

The full run over every op (and docs/torch-opinfo.md) is
`python -P python/tests/opinfo_harness.py --report docs/torch-opinfo.md`;
this test runs opinfo_harness.SUBSET, at most SUBSET_SAMPLES samples per op,
so that the README's test command stays within a few minutes.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import opinfo_harness as harness  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def subset_results():
    ops = harness.selected_ops(set(harness.SUBSET))
    found = {harness.op_key(op) for op in ops} | {op.name for op in ops}
    missing = [k for k in harness.SUBSET if k not in found]
    assert not missing, f"not in op_db (renamed?): {missing}"
    return [harness.run_op(op, harness.SUBSET_SAMPLES) for op in ops
            if not harness.exclusion(op)]


def test_subset_passes(subset_results):
    problems = [f"{r.key}: {r.first_problem}" for r in subset_results
                if r.counts["fail"] or r.counts["error"]]
    assert not problems, "\n".join(problems)
    total, counted, native = harness.summarize(subset_results)
    assert counted >= 500  # the subset really ran
    print(f"\nOpInfo subset: {counted} samples, {total['pass']} pass, "
          f"{100.0 * native / counted:.1f}% native")


def test_native_kernels_take_no_fallback(subset_results):
    # Ops whose float32 samples all have native kernels.
    expected_native = {
        "add", "sub", "mul", "div.no_rounding_mode", "atan2", "eq", "lt", "where", "exp", "log",
        "tanh", "sigmoid", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
        "sum", "mean", "amax", "argmax", "softmax", "log_softmax", "mm", "addmm", "bmm",
        "matmul", "nn.functional.linear", "nn.functional.conv2d", "scatter_add", "tril",
        "nn.functional.nll_loss", "nn.functional.mse_loss", "stack", "transpose", "view",
        "cumsum", "sort", "topk",
    }
    by_key = {r.key: r for r in subset_results}
    not_native = {k: sorted(by_key[k].fallback_ops) for k in expected_native
                  if by_key[k].fallback_ops}
    assert not not_native, not_native
    fallback_only = [r for r in subset_results if r.key in ("lgamma",)]
    assert fallback_only and all(r.counts["pass_fallback"] == r.counts["pass"]
                                 for r in fallback_only)
