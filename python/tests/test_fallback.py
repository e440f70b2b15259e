"""The CPU fallback's op log and TORCH_TERN_FALLBACK."""

import subprocess
import sys
import warnings

import pytest
import torch


def test_log_counts_fallback_ops(fallback_log):
    a = torch.ones(4, device="tern")
    b = a + a
    b = b + a
    torch.exp(b)
    ops = fallback_log.get_fallback_ops()
    assert ops.get("aten::add.out") == 2, ops
    assert ops.get("aten::exp.out") == 1, ops
    assert all(name.startswith("aten::") for name in ops)
    assert torch.equal(b.cpu(), torch.full((4,), 3.0))
    fallback_log.clear_op_tracking()
    assert fallback_log.get_fallback_ops() == {}


def test_native_ops_are_not_logged(fallback_log):
    t = torch.zeros(3, 3, device="tern")
    t.fill_(1.0)
    u = t.t().contiguous().to(torch.bfloat16).cpu()
    t.view(9)[0].item()
    assert torch.equal(u, torch.ones(3, 3, dtype=torch.bfloat16))
    assert fallback_log.get_fallback_ops() == {}


def test_error_mode_names_the_op(fallback_log, monkeypatch):
    a = torch.ones(4, device="tern")
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "error")
    with pytest.raises(NotImplementedError, match=r"operator 'aten::mul\.out' has no native tern kernel"):
        a * 2
    # native paths still work in error mode
    b = torch.zeros(4, device="tern").fill_(2)
    assert torch.equal(b.cpu(), torch.full((4,), 2.0))
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "allow")
    assert torch.equal((a * 2).cpu(), torch.full((4,), 2.0))


def test_warn_mode_warns_once(fallback_log, monkeypatch):
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "warn")
    a = torch.ones(4, device="tern")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a.sin()
        a.sin()
    messages = [str(w.message) for w in caught if "aten::sin.out" in str(w.message)]
    assert len(messages) == 1


def test_error_mode_from_process_start(node_env):
    env = dict(node_env, TORCH_TERN_FALLBACK="error")
    code = ("import torch\n"
            "x = torch.ones(3, device='tern')\n"
            "try:\n"
            "    torch.cos(x)\n"
            "except NotImplementedError as e:\n"
            "    print('raised', 'aten::cos.out' in str(e))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised True"
