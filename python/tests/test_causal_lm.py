"""The causal-LM sweep's fixed subset (causal_lm_harness.SUBSET) in the test
command: each architecture, built from a small config, matches the CPU
forward and backward on tern. The full sweep over every architecture of the
installed transformers is its own command (causal_lm_harness.py --report)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import causal_lm_harness as harness  # noqa: E402

pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", harness.SUBSET)
def test_architecture_matches_cpu(model_type):
    result = harness.check(model_type)
    assert result["status"] == "pass", f"{model_type}: {result['status']}: {result['detail']}"


def test_subset_covers_what_it_claims():
    """The subset holds a mixture of experts (the router's integer histc) and
    architectures that run with no CPU fallback at all."""
    results = {m: harness.check(m) for m in ("mixtral", "bert", "bart")}
    assert all(r["status"] == "pass" for r in results.values())
    assert "aten::histc" not in results["mixtral"]["fallbacks"]
    assert not results["bert"]["fallbacks"] and not results["bart"]["fallbacks"]
