"""The CPU fallback's op log and TORCH_TERN_FALLBACK."""

import subprocess
import sys
import warnings

import pytest
import torch


def test_log_counts_fallback_ops(fallback_log):
    a = torch.full((4,), 3.0, device="tern")
    b = a.lgamma()
    b = b.lgamma()
    torch.cumsum(b, 0)  # native: not logged
    ops = fallback_log.get_fallback_ops()
    assert ops == {"aten::lgamma.out": 2}, ops
    assert torch.equal(b.cpu(), torch.full((4,), 3.0).lgamma().lgamma())
    fallback_log.clear_op_tracking()
    assert fallback_log.get_fallback_ops() == {}


def test_declined_native_op_is_logged(fallback_log):
    # add has a native kernel, but tern has no int16: the kernel declines
    # and the op runs (and is counted) on the CPU.
    a = torch.ones(4, device="tern")
    assert torch.equal((a + a).cpu(), torch.full((4,), 2.0))
    assert fallback_log.get_fallback_ops() == {}
    d = torch.ones(4, dtype=torch.int16, device="tern")
    assert torch.equal((d + d).cpu(), torch.full((4,), 2, dtype=torch.int16))
    assert fallback_log.get_fallback_ops() == {"aten::add.out": 1}


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
    with pytest.raises(NotImplementedError,
                       match=r"operator 'aten::lgamma\.out' has no native tern kernel"):
        a.lgamma()
    # native paths still work in error mode
    b = torch.zeros(4, device="tern").fill_(2)
    assert torch.equal(b.cpu(), torch.full((4,), 2.0))
    assert torch.equal((a * 2).cpu(), torch.full((4,), 2.0))
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "allow")
    assert torch.equal(a.lgamma().cpu(), torch.zeros(4))


def test_op_without_a_cpu_kernel_says_so_for_tern(fallback_log):
    # _masked_scale has CUDA kernels only: the fallback cannot run it, and
    # says so about the tern tensors rather than PyTorch's "from the 'CPU'
    # backend", which reads as if the tensors were the CPU's.
    x = torch.ones(4, device="tern")
    mask = torch.ones(4, dtype=torch.uint8, device="tern")
    with pytest.raises(NotImplementedError) as caught:
        torch.ops.aten._masked_scale(x, mask, 2.0)
    message = str(caught.value)
    assert "operator 'aten::_masked_scale' has no tern kernel, and PyTorch has no CPU kernel" \
        in message, message
    assert "from the 'CPU' backend" not in message, message


@pytest.mark.parametrize("make", [
    lambda: torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), device="tern"),
    lambda: torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2)).to("tern"),
    lambda: torch.ones(2, 2, device="tern").to_sparse(),
    lambda: torch.nn.Embedding(4, 2, sparse=True).to("tern")(
        torch.tensor([1], device="tern")).sum().backward(),
], ids=["factory", "to", "to_sparse", "embedding_sparse_grad"])
def test_sparse_coo_on_tern_is_a_clear_error(make, fallback_log):
    # tern tensors are strided only; PyTorch's own message named a
    # 'Sparsetern' backend and said nothing of what to do.
    with pytest.raises(NotImplementedError) as caught:
        make()
    message = str(caught.value)
    assert "sparse COO tensor on tern" in message and "strided (dense) only" in message, message
    assert ".to_dense()" in message and "sparse=False" in message, message
    assert "Sparsetern" not in message, message
    # (to_sparse computes on the CPU fallback; its result cannot come back)
    assert set(fallback_log.get_fallback_ops()) <= {"aten::_to_sparse"}
    # Sparse tensors on the CPU are untouched.
    cpu = torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))
    assert torch.equal(cpu.to_dense(), torch.tensor([[0.0, 1.0], [2.0, 0.0]]))


@pytest.mark.parametrize("layout, make", [
    ("CSR", lambda: torch.eye(3, device="tern").to_sparse_csr()),
    ("CSC", lambda: torch.eye(3, device="tern").to_sparse_csc()),
    ("BSR", lambda: torch.eye(4, device="tern").to_sparse_bsr((2, 2))),
    ("CSR", lambda: torch.eye(3).to_sparse_csr().to("tern")),
    ("CSR", lambda: torch.sparse_csr_tensor([0, 1, 2], [1, 0], [1.0, 2.0], (2, 2),
                                            device="tern")),
    ("CSR", lambda: torch.empty((2, 2), layout=torch.sparse_csr, device="tern")),
], ids=["to_sparse_csr", "to_sparse_csc", "to_sparse_bsr", "to", "factory", "empty"])
def test_compressed_sparse_on_tern_is_a_clear_error(layout, make, fallback_log):
    # A compressed sparse tensor on tern used to be made from its parts (the CPU
    # fallback's result, or a factory), and then every operator on it failed
    # with PyTorch's "Could not run ... from the 'SparseCsrtern' backend".
    try:
        made = make()
    except NotImplementedError as caught:
        message = str(caught)
    else:
        with pytest.raises(NotImplementedError) as caught:
            made.to_dense()
        message = str(caught.value)
    assert f"sparse {layout} tensor on tern" in message, message
    assert "strided (dense) only" in message and ".to_dense()" in message, message
    assert "SparseCsrtern" not in message, message
    cpu = torch.eye(3).to_sparse_csr()  # on the CPU, untouched
    assert torch.equal(cpu.to_dense(), torch.eye(3))


def test_warn_mode_warns_once(fallback_log, monkeypatch):
    monkeypatch.setenv("TORCH_TERN_FALLBACK", "warn")
    a = torch.ones(4, device="tern")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a.lgamma()
        a.lgamma()
    messages = [str(w.message) for w in caught if "aten::lgamma.out" in str(w.message)]
    assert len(messages) == 1


def test_error_mode_from_process_start(node_env):
    env = dict(node_env, TORCH_TERN_FALLBACK="error")
    code = ("import torch\n"
            "x = torch.ones(3, device='tern')\n"
            "try:\n"
            "    torch.lgamma(x)\n"
            "except NotImplementedError as e:\n"
            "    print('raised', 'aten::lgamma.out' in str(e))\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "raised True"


def test_fallback_out_on_another_device_is_the_same_device_error(fallback_log):
    # As on CUDA (PyTorch's test_shape_ops.py test_nonzero): an out= tensor on
    # the CPU for tern inputs is the same-device error, not cpu_fallback's
    # failed copy back ("Could not run 'aten::_copy_from_and_resize' ... CPU").
    x = torch.tensor([0.0, 1.0, 2.0], device="tern")
    with pytest.raises(RuntimeError, match="on the same device"):
        torch.nonzero(x, out=torch.empty(0, dtype=torch.long))
    assert "aten::nonzero.out" in fallback_log.get_fallback_ops()
    # A tern out= tensor still works through the fallback.
    out = torch.empty(0, dtype=torch.long, device="tern")
    torch.nonzero(x, out=out)
    assert out.cpu().tolist() == [[1], [2]]
