"""Test setup: every pytest process gets its own simulated tern node.

The environment must be set before torch (whose backend autoloading imports
torch_tern) initializes tern, so it happens here, at import time. Child
processes started by the tests inherit it and join the same node.
"""

import glob
import os

_NODE = f"pytest-{os.getpid()}"
os.environ["TERN_SIM_NODE"] = _NODE
os.environ["TERN_SIM_TOPOLOGY"] = "2x2x2G"
os.environ.pop("TORCH_TERN_FALLBACK", None)
os.environ.pop("TORCH_TERN_CORE", None)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_tern  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
    for path in glob.glob(f"/dev/shm/tern-sim-{_NODE}*"):
        try:
            os.unlink(path)
        except OSError:
            pass


@pytest.fixture
def fallback_log():
    """A clean fallback log before and after the test."""
    torch_tern.clear_op_tracking()
    yield torch_tern
    torch_tern.clear_op_tracking()


@pytest.fixture
def node_env():
    """The environment a child process needs to join this process's node."""
    env = dict(os.environ)
    env["TERN_SIM_NODE"] = _NODE
    return env
