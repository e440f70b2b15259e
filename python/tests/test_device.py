"""Device registration, copies between host and tern, views, fills, resize/set_."""

import subprocess
import sys

import pytest
import torch
import torch_tern

ALL_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
              torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]


def sample(dtype, shape=(5, 7)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)


def test_backend_registered():
    assert torch._C._get_privateuse1_backend_name() == "tern"
    assert torch.tern is torch_tern.device_module
    assert torch.tern.is_available()
    assert torch.tern.device_count() == 2
    t = torch.empty(3, device="tern")
    assert t.device == torch.device("tern", 0)
    assert t.is_tern  # generated property
    assert torch.empty(2).tern().device.type == "tern"  # generated method


def test_current_device_and_guard():
    assert torch.tern.current_device() == 0
    with torch.tern.device(1):
        assert torch.tern.current_device() == 1
        assert torch.empty(1, device="tern").device == torch.device("tern:1")
    assert torch.tern.current_device() == 0
    torch.tern.set_device("tern:1")
    try:
        assert torch.tern.current_device() == 1
    finally:
        torch.tern.set_device(0)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.tern.set_device(5)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_round_trip(dtype):
    host = sample(dtype)
    dev = host.to("tern")
    assert dev.dtype == dtype and dev.device.type == "tern"
    assert torch.equal(dev.cpu(), host)


def test_non_contiguous_copies():
    host = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    dev = host.to("tern")
    # device -> host from strided views
    for view in (lambda t: t.transpose(0, 2), lambda t: t[:, ::2, 1:4], lambda t: t[1],
                 lambda t: t.permute(2, 0, 1), lambda t: t[..., 0].expand(2, 3, 4)):
        assert torch.equal(view(dev).cpu(), view(host))
    # host -> device into strided views (gaps must survive)
    target = torch.zeros(6, 8, device="tern")
    target[::2, 1::3] = torch.ones(3, 3)
    expected = torch.zeros(6, 8)
    expected[::2, 1::3] = 1
    assert torch.equal(target.cpu(), expected)
    # device -> device, other layout and other dtype
    t = dev.transpose(1, 2).contiguous()
    assert torch.equal(t.cpu(), host.transpose(1, 2).contiguous())
    assert torch.equal(dev.to(torch.int32).cpu(), host.to(torch.int32))
    assert torch.equal(dev.to(torch.bfloat16).cpu(), host.to(torch.bfloat16))
    # broadcast copy
    b = torch.empty(4, 5, device="tern")
    b.copy_(torch.arange(5.0, device="tern"))
    assert torch.equal(b.cpu(), torch.arange(5.0).expand(4, 5))


def test_cross_device_copy():
    host = torch.randn(1000)
    a = host.to("tern:0")
    b = a.to("tern:1")
    assert b.device == torch.device("tern:1")
    assert torch.equal(b.cpu(), host)
    c = b[::2].to("tern:0")
    assert torch.equal(c.cpu(), host[::2])


def test_views_share_storage():
    dev = torch.zeros(4, 6, device="tern")
    views = [dev.view(24), dev.reshape(2, 12), dev.t(), dev[1:3], dev.unsqueeze(0),
             dev.as_strided((2, 2), (6, 1), 1), dev.unfold(1, 2, 2), dev.view(torch.int32)]
    for v in views:
        assert v.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    dev.view(24)[5] = 7.0
    assert dev[0, 5].item() == 7.0
    dev.t()[2, 3] = 9.0
    assert dev[3, 2].item() == 9.0


def test_views_do_not_fall_back(fallback_log):
    dev = torch.zeros(4, 6, device="tern")
    dev.view(24), dev.reshape(2, 12), dev.t(), dev[1:3], dev.unsqueeze(0), dev.unfold(1, 2, 2)
    dev.as_strided((2, 2), (6, 1), 1), dev.permute(1, 0), dev.expand(3, 4, 6), dev.narrow(0, 1, 2)
    dev.squeeze(), dev.flatten(), dev.select(0, 1), dev.diagonal(), dev.view(torch.int32)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("value", [0, 1, -3, 7.5, 12345678901])
def test_fill(dtype, value):
    if dtype == torch.bool:
        value = bool(value)
    elif not dtype.is_floating_point and not dtype.is_complex:
        value = int(value)
        if dtype in (torch.int8, torch.uint8, torch.int16, torch.int32) and abs(value) > 100:
            value = 100
        if dtype == torch.uint8 and value < 0:
            value = 3
    # odd lengths and offsets exercise the unaligned head/tail of queue fills
    for n, start in ((1, 0), (5, 1), (33, 3), (1000, 7)):
        base = torch.full((n + start + 2,), 0, dtype=dtype).to("tern")
        base[start:start + n].fill_(value)
        expected = torch.zeros(n + start + 2, dtype=dtype)
        expected[start:start + n] = value
        assert torch.equal(base.cpu(), expected), (n, start)


def test_fill_zero_native(fallback_log):
    t = torch.empty(3, 5, device="tern", dtype=torch.bfloat16)
    t.fill_(2.5)
    t[:, 1::2].zero_()  # non-dense view
    expected = torch.full((3, 5), 2.5, dtype=torch.bfloat16)
    expected[:, 1::2] = 0
    assert torch.equal(t.cpu(), expected)
    ones = torch.ones(4, device="tern")
    zeros = torch.zeros(4, dtype=torch.int64, device="tern")
    assert torch.equal(ones.cpu(), torch.ones(4)) and torch.equal(zeros.cpu(), torch.zeros(4, dtype=torch.int64))
    t.fill_(torch.tensor(1.0, device="tern"))
    assert torch.equal(t.cpu(), torch.ones(3, 5, dtype=torch.bfloat16))
    assert fallback_log.get_fallback_ops() == {}


def test_item_resize_set():
    t = torch.tensor([1.5, 2.5, 3.5]).to("tern")
    assert t[1].item() == 2.5
    t.resize_(10)
    assert t.shape == (10,) and torch.equal(t[:3].cpu(), torch.tensor([1.5, 2.5, 3.5]))
    t.resize_(2, 2)
    assert t.shape == (2, 2)
    s = torch.empty(0, device="tern")
    s.set_(t)
    assert s.data_ptr() == t.data_ptr() and s.shape == t.shape
    u = torch.empty(0, device="tern")
    u.set_(t.untyped_storage(), 1, (2,), (1,))
    assert torch.equal(u.cpu(), torch.tensor([2.5, 3.5]))
    st = t.untyped_storage()
    st.resize_(64)
    assert st.nbytes() == 64
    v = torch.empty(0, device="tern").set_()
    assert v.numel() == 0


def test_module_to_keeps_its_parameters():
    """Module.to("tern") moves each parameter's data in place, as it does for CUDA:
    the Parameter objects stay, so an optimizer built before the move updates the
    moved model, and attributes set on a parameter survive; `p.data = t` moves
    data between the CPU and tern, both ways."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    weight = model.weight
    weight.tag = "kept"
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = weight.detach().clone()
    model.to("tern")
    assert model.weight is weight and weight.device.type == "tern"
    assert weight.tag == "kept"
    model(torch.ones(2, 4, device="tern")).sum().backward()
    assert weight.grad.device.type == "tern"
    opt.step()  # steps the tern parameter the model now uses
    assert not torch.equal(weight.detach().cpu(), before)
    model.to("cpu")
    assert model.weight is weight and weight.device.type == "cpu"
    assert weight.grad.device.type == "cpu"
    # A parameter shared by two modules (tied embeddings) stays shared.
    tied = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2), "b": torch.nn.Linear(2, 2)})
    tied["b"].weight = tied["a"].weight
    tied.to("tern")
    assert tied["b"].weight is tied["a"].weight and tied["a"].weight.device.type == "tern"
    p = torch.nn.Parameter(torch.arange(4.0))
    p.data = p.data.to("tern")
    assert p.device.type == "tern" and torch.equal(p.detach().cpu(), torch.arange(4.0))
    p.data = torch.zeros(2)
    assert p.device.type == "cpu" and p.shape == (2,)


def test_accelerator_api():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tern")
    assert torch.accelerator.device_count() == 2
    torch.accelerator.set_device_index(1)
    try:
        assert torch.accelerator.current_device_index() == 1
    finally:
        torch.accelerator.set_device_index(0)
    x = torch.ones(256, device="tern")
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() == torch.tern.memory_allocated() > 0
    assert torch.accelerator.memory_reserved() == torch.tern.memory_reserved()
    free, total = torch.accelerator.get_memory_info()
    assert total == 2 << 30 and 0 < free <= total
    del x


def test_device_properties():
    props = torch.tern.get_device_properties(0)
    assert props.core_count == 2 and props.total_memory == 2 << 30
    assert props.driver == "sim"
    assert torch.tern.get_device_name(1) == props.name


def test_autoload_in_fresh_process(node_env):
    # `import torch` alone loads the plugin, native kernels included (the last number).
    # The plugin's registrations are aten's: other namespaces come and go with
    # what a process imports (torch.export brings fsdp:: ops of its own).
    code = ("import torch; t = torch.ones(3, device='tern'); "
            "print(torch.tern.device_count(), t.cpu().sum().item(), "
            "len([r for r in torch._C._dispatch_get_registrations_for_dispatch_key('PrivateUse1')"
            " if r.startswith('aten::')]))")
    out = subprocess.run([sys.executable, "-c", code], env=node_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    here = [r for r in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
            if r.startswith("aten::")]
    assert out.stdout.split() == ["2", "3.0", str(len(here))]


def test_set_device_initializes_like_cuda(node_env):
    # DeviceMesh calls set_device(LOCAL_RANK) itself unless is_initialized():
    # a device the user chose must count, as torch.cuda.set_device does.
    code = ("import torch, torch_tern; "
            "before = torch.tern.is_initialized(); torch.tern.set_device(1); "
            "print(before, torch.tern.is_initialized(), torch.tern.current_device())")
    out = subprocess.run([sys.executable, "-c", code], env=node_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "1"], out.stdout


# Backward on every device from its own thread, the script's last line: each
# device's autograd thread finishes its task while the interpreter exits.
_BACKWARD_THEN_EXIT = """
import threading, torch, torch_tern
n = torch.tern.device_count()
xs = [torch.randn(4096, device=f"tern:{i}", requires_grad=True) for i in range(n)]
losses = [(x * 2).tanh().sum() for x in xs]
barrier = threading.Barrier(n)
def run(i):
    barrier.wait()
    losses[i].backward()
threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print("done")
"""


def test_exit_right_after_backward_does_not_abort(node_env):
    # Without torch_tern's exit hook (torch_tern/_exit.py) about half of these
    # processes aborted after printing "done" ("terminate called without an
    # active exception", status -6): an autograd thread released its finished
    # task's Python objects while the interpreter finalized.
    for run in range(8):
        out = subprocess.run([sys.executable, "-c", _BACKWARD_THEN_EXIT], env=node_env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.split() == ["done"], (
            run, out.returncode, out.stderr[-2000:])


# Where a backward of tern tensors runs: each hook prints the name of its thread.
_BACKWARD_THREAD = """
import threading, torch, torch_tern
def backward_thread_name():
    names = []
    x = torch.randn(8, device="tern", requires_grad=True)
    y = x * 3
    y.register_hook(lambda g: names.append(threading.current_thread().name))
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((8,), 3.0)), x.grad
    return names[0]
print(backward_thread_name())
other = []
t = threading.Thread(target=lambda: other.append(backward_thread_name()), name="worker")
t.start(); t.join()
print(other[0])
"""


def test_backward_runs_on_the_calling_thread(node_env):
    # The importing thread runs its tern backward itself (no hand-off to
    # torch's per-device autograd thread, which the hook would see as a
    # thread Python did not start: "Dummy-N"). Another thread keeps torch's
    # default, and both compute the same gradient.
    out = subprocess.run([sys.executable, "-c", _BACKWARD_THREAD], env=node_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    main, worker = out.stdout.split()
    assert main == "MainThread"
    assert worker.startswith("Dummy"), worker
    # And in this process (the test's thread imported torch_tern).
    assert not torch.autograd.is_multithreading_enabled()


def test_autograd_threads_environment(node_env):
    env = dict(node_env, TORCH_TERN_AUTOGRAD_THREADS="device")
    out = subprocess.run([sys.executable, "-c", _BACKWARD_THREAD], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(name.startswith("Dummy") for name in out.stdout.split()), out.stdout
    env["TORCH_TERN_AUTOGRAD_THREADS"] = "sometimes"
    out = subprocess.run([sys.executable, "-c", "import torch_tern"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "TORCH_TERN_AUTOGRAD_THREADS='sometimes': expected 'calling'" in out.stderr


# Products that oneDNN runs with its gemm kernels ("gemm:jit", every float32
# matmul on an AVX2 CPU), a matmul with bias and a convolution.
_ONEDNN_PRODUCTS = """
import torch, torch_tern
a = torch.randn(64, 256, device="tern")
b = torch.randn(256, 32, device="tern")
bias = torch.randn(32, device="tern")
x = torch.randn(2, 3, 16, 16, device="tern")
w = torch.randn(8, 3, 3, 3, device="tern")
out = [torch.mm(a, b), torch.addmm(bias, a, b), torch.nn.functional.conv2d(x, w, padding=1)]
for _ in range(2):  # the first run of a program's primitive is at load, the next on the queue
    out = [torch.mm(a, b), torch.addmm(bias, a, b), torch.nn.functional.conv2d(x, w, padding=1)]
ref = [a.cpu() @ b.cpu(), torch.addmm(bias.cpu(), a.cpu(), b.cpu()),
       torch.nn.functional.conv2d(x.cpu(), w.cpu(), padding=1)]
print(all(torch.allclose(o.cpu(), r, rtol=1e-4, atol=1e-4) for o, r in zip(out, ref)))
"""


def test_onednn_runs_the_products_in_a_pytorch_process(node_env):
    # libtorch_cpu exports oneDNN internals under the system libdnnl's names;
    # before torch_tern loaded libtern first, libdnnl's references bound to
    # them, libdnnl's gemm kernels were never made, and oneDNN refused every
    # such product at execution: the products ran on tern's loops, 2-12x
    # slower, with the same results, and libtern now says so once (warning).
    env = dict(node_env, TERN_LOG_LEVEL="info")
    out = subprocess.run([sys.executable, "-c", _ONEDNN_PRODUCTS], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"], out.stdout
    assert "refused to run it" not in out.stderr, out.stderr[-3000:]


def test_collect_env(node_env):
    out = subprocess.run([sys.executable, "-m", "torch_tern.collect_env"], env=node_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for needle in ("CPU: ", "torch: 2.13.0", "torch_tern: 0.1.0", "libtern: 0.1.0",
                   "driver backend: sim", "devices: 2", "cores 2/2", "HBM 2.00 GiB", "tern usable from torch: yes"):
        assert needle in text, text


def test_collect_env_unusable():
    env = {"PATH": "/usr/bin:/bin", "TERN_DRIVER": "null", "TERN_SIM_NODE": "unused"}
    out = subprocess.run([sys.executable, "-m", "torch_tern.collect_env"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tern usable from torch: no (" in out.stdout, out.stdout


def test_native_copy_kernels_cached():
    info0 = torch_tern.kernel_cache_info()
    if not info0["executables_available"]:
        pytest.skip("this libtern has no executables")
    a = torch.arange(12.0).reshape(3, 4).to("tern")
    for _ in range(3):
        assert torch.equal(a.t().contiguous().cpu(), torch.arange(12.0).reshape(3, 4).t())
    info = torch_tern.kernel_cache_info()
    assert info["launches"] >= info0["launches"] + 3
    assert info["hits"] >= info0["hits"] + 2
    assert info["failures"] == info0["failures"]


# The native kernels, registered from the TERN_ATEN_IMPL lines beside them
# (csrc/aten/register.h) when torch_tern._C is imported. The counts are those
# of the per-family lists they replaced; change them with the kernels: a
# source file left out of the build would otherwise lose its kernels silently.
NATIVE_KERNELS = {"PrivateUse1": 281, "AutogradPrivateUse1": 1}


def test_native_kernels_registered():
    listed = torch_tern._C._native_ops()
    assert len(set(listed)) == len(listed)
    for key, count in NATIVE_KERNELS.items():
        names = {f"aten::{name}" for k, name in listed if k == key}
        assert len(names) == count, key
        assert names <= set(torch._C._dispatch_get_registrations_for_dispatch_key(key)), key
    assert {k for k, _ in listed} == set(NATIVE_KERNELS)

