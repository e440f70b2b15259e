"""PyTorch's own distributed test suite against tern: the fixed subset.

torch's ``distributed_test.py`` (in the wheel) with BACKEND=tern on 2 ranks,
placed on tern by python/tests/upstream_distributed/tern_distributed_suite.py;
the subset is ``SUBSET`` in run_distributed_suite.py (12 tests, about 2
minutes on two cores), each test with the outcome it must have. The whole
suite is its own command and its figures are in docs/torch-distributed-suite.md.
"""

import os
import subprocess
import sys

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream_distributed",
                      "run_distributed_suite.py")


def test_upstream_distributed_suite_subset(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-P", RUNNER, "--subset", "--timeout", "90", "--total-timeout", "420"],
        cwd=tmp_path, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
