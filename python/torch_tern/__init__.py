"""torch_tern: PyTorch on tern devices.

Importing this package (or just ``import torch``, through torch's backend
autoloading) registers the PrivateUse1 backend under the name ``tern``:
``torch.device("tern")``, ``tensor.to("tern")``, ``tensor.tern()``, the device
module ``torch.tern`` and the ``torch.accelerator`` calls.

Operators without a native tern kernel run on the CPU through a logged
fallback: ``get_fallback_ops()`` lists them with their counts,
``clear_op_tracking()`` resets the log, and the environment variable
``TORCH_TERN_FALLBACK=error`` turns a fallback into an error naming the op
(``warn`` warns once per op).
"""

from __future__ import annotations

import os

import torch


def _load_libtern_first() -> None:
    """Loads libtern (and with it the system's oneDNN) before the extension.

    PyTorch's libtorch_cpu carries a copy of oneDNN and exports some of its
    internal symbols under the names the system's libdnnl uses (the call_once
    trampolines of its gemm set-up). Loaded as a dependency of torch_tern's
    extension, whose dependencies list libtorch_cpu first, libdnnl's
    references to those resolved to libtorch_cpu's: libdnnl's gemm kernels
    were never generated, every "gemm:jit" matmul and convolution failed at
    execution, and ran on tern's loops instead (2-12x slower on an AVX2 CPU).
    Loaded here on its own, libtern's dependencies resolve among themselves
    first; the extension then finds libtern already loaded. docs/sim.md,
    "One oneDNN per process"."""
    import ctypes

    bundled = os.path.join(os.path.dirname(__file__), "lib", "libtern.so.0")
    try:
        # The wheel's copy; else (a package built on an installed libtern)
        # the one the dynamic linker finds, as the extension would.
        ctypes.CDLL(bundled if os.path.exists(bundled) else "libtern.so.0")
    except OSError:
        pass  # the extension's import below says what is missing


_load_libtern_first()

try:
    from . import _C  # noqa: F401  (loads libtern and the C++ registrations)
except ImportError as err:  # e.g. the source folder python/ shadows the installed package
    raise ImportError(
        f"torch_tern's native extension did not load from {__path__[0]}: {err}. Build and "
        "install it with python/build_and_test.sh (or pip install --no-build-isolation ./python), "
        "and do not run Python from inside python/ (its torch_tern folder has no compiled _C)."
    ) from err
from . import device_module

__version__ = _C.__version__
BACKEND_NAME = "tern"

__all__ = [
    "BACKEND_NAME",
    "clear_op_tracking",
    "device_module",
    "get_fallback_ops",
    "kernel_cache_info",
]


def get_fallback_ops() -> dict[str, int]:
    """Operators that ran through the CPU fallback since the last clear, with counts.

    Names are full ATen names with overload, e.g. ``"aten::add.Tensor"``.
    """
    return dict(_C._get_fallback_ops())


def clear_op_tracking() -> None:
    """Forget the fallback operators recorded so far."""
    _C._clear_fallback_ops()


def kernel_cache_info() -> dict:
    """State of the native kernel cache (single-op tern executables)."""
    return dict(_C._kernel_cache_info())


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() == BACKEND_NAME and hasattr(torch, BACKEND_NAME):
        return  # already registered (autoload, then an explicit import)
    torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    torch._register_device_module(BACKEND_NAME, device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    # Autocast on tern means bfloat16 unless a dtype is given. torch keeps the
    # autocast dtype per thread: this sets it for the importing thread;
    # torch.autocast("tern", dtype=...) works everywhere.
    torch.set_autocast_dtype(BACKEND_NAME, torch.bfloat16)
    _backward_on_calling_thread()


def _backward_on_calling_thread() -> None:
    """Backward of tern tensors runs on the thread that calls it, as on the CPU.

    torch's autograd engine gives every accelerator device a worker thread
    and hands each backward to it (the caller waits): two thread hand-offs per
    backward, which an asynchronous tern queue does not need (its operators
    only enqueue; the order is the stream's). On a 2-CPU AMD EPYC (Zen 1) they
    cost 40-45 us of host time of a 64x64 -> 256 -> 1 MLP's backward (290-350
    us), measured with both modes alternated in one process. The switch is torch's own
    (``torch.autograd.set_multithreading_enabled``), per thread like the
    autocast dtype above: this sets it for the importing thread; another
    thread that wants it calls ``torch.autograd.set_multithreading_enabled(False)``.
    ``TORCH_TERN_AUTOGRAD_THREADS=device`` keeps torch's default."""
    choice = os.environ.get("TORCH_TERN_AUTOGRAD_THREADS", "calling").strip().lower()
    if choice not in ("calling", "device"):
        raise ValueError(f"TORCH_TERN_AUTOGRAD_THREADS={choice!r}: expected 'calling' (backward "
                         "on the thread that calls it, the default) or 'device' (torch's "
                         "per-device autograd threads)")
    if choice == "calling":
        torch.autograd.set_multithreading_enabled(False)


_register()

from . import distributed as _distributed  # noqa: E402  (the "tern" torch.distributed backend)

_distributed.register()

from . import _exit  # noqa: E402

_exit.register()
