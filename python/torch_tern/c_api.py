"""tern's own handles for PyTorch's tern objects, to call tern's C API on them.

What ``Stream.cuda_stream`` and ``Tensor.data_ptr()`` are to a CUDA extension:
code that calls tern's C API directly (through ctypes, or a C extension of its
own linked to libtern) gets the core of a device, the queue behind a stream and
the buffer behind a tensor, and works in PyTorch's stream order::

    import ctypes, torch, torch_tern.c_api as c_api
    lib = c_api.library()                      # the libtern the plugin runs on
    t = torch.zeros(4, device="tern")
    buf, offset = c_api.buffer(t)
    q = c_api.queue()                          # the current stream's queue
    lib.tern_queue_fill(ctypes.c_void_p(q), ctypes.c_void_p(buf), ctypes.c_uint64(offset),
                        ctypes.c_uint64(16), ctypes.c_uint32(0x3F800000), None)
    print(t)                                   # ones: the fill ran in the stream's order

The handles belong to PyTorch's objects: they stay valid while the tensor's
storage (or the process's device) lives, and must not be freed, destroyed or
closed through the C API. Work put on a stream's queue is ordered with
PyTorch's work on that stream like any kernel; on another queue, order it with
tern events yourself. Use ``library()`` rather than loading a libtern of your
own: a second copy of the library has a handle table of its own, in which
these handles mean nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from . import _C
from .device_module import _device_index, _lazy_init

__all__ = ["library", "library_path", "core", "queue", "buffer"]


def library_path() -> str:
    """The file of the libtern the plugin was loaded with."""
    return _C._c_api_library_path()


@functools.cache
def library() -> ctypes.CDLL:
    """ctypes handle of the plugin's own libtern (the same loaded copy)."""
    return ctypes.CDLL(library_path())


def core(device: Any = None) -> int:
    """``tern_core_t`` of the core this process runs ``device``'s work on (default:
    the current device), as an integer."""
    _lazy_init()
    return _C._c_api_core(_device_index(device))


def queue(stream: torch.Stream | None = None) -> int:
    """``tern_queue_t`` behind ``stream`` (default: the current stream of the
    current device), as an integer."""
    _lazy_init()
    if stream is None:
        stream = torch.tern.current_stream()
    if stream.device.type != "tern":
        raise ValueError(f"tern: expected a tern stream, got one of {stream.device}")
    return _C._c_api_queue(stream.stream_id, stream.device_index)


def buffer(tensor: torch.Tensor) -> tuple[int, int]:
    """(``tern_buffer_t``, byte offset of the tensor's first element) of a tern
    tensor's data. The tensor's elements lie where its strides say from that
    offset on; (0, 0) for a tensor without storage bytes."""
    return _C._c_api_buffer(tensor)
