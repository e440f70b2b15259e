"""``torch.tern``: the device module of the tern backend.

Devices, the current device, streams and events, memory statistics, random
number generators and autocast helpers, shaped like ``torch.cuda``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from . import _C

# What inductor registers for the device (see _inductor.py): code generators
# that refuse with a message saying which backend to pass instead.
from ._inductor import (  # noqa: F401
    CppWrapperCodegen,
    PythonWrapperCodegen,
    Scheduling,
    WrapperFxCodegen,
)

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_BACKEND = "tern"
_init_lock = threading.Lock()
_initialized = False


# ---- Devices ----------------------------------------------------------------


def _device_index(device: Any = None, optional: bool = True) -> int:
    """Normalizes None / int / "tern" / "tern:1" / torch.device to an index."""
    if device is None:
        if not optional:
            raise ValueError("a tern device is required")
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != _BACKEND:
            raise ValueError(f"expected a tern device, got {device}")
        return current_device() if device.index is None else device.index
    raise TypeError(f"cannot interpret {device!r} as a tern device")


def is_available() -> bool:
    """True if tern initializes and has at least one device."""
    return device_count() > 0


def device_count() -> int:
    return _C._device_count()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def init() -> None:
    """Initializes tern now (it happens on first use otherwise)."""
    _lazy_init()


def _lazy_init() -> None:
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "cannot use tern in a child process forked after tern was initialized; "
                "use the 'spawn' start method"
            )
        _C._init()
        _initialized = True


def is_initialized() -> bool:
    return _initialized and not _is_in_bad_fork()


def current_device() -> int:
    return _C._current_device()


def set_device(device: Any) -> None:
    index = _device_index(device)
    if index >= 0:
        _C._set_device(index)


class device:
    """Context manager that makes ``device`` the current tern device."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *exc):
        if self.prev_idx >= 0:
            _C._set_device(self.prev_idx)
        return False


def synchronize(device: Any = None) -> None:
    """Waits for all work queued on every stream of ``device``."""
    _lazy_init()
    _C._synchronize(_device_index(device))


def get_device_properties(device: Any = None) -> dict:
    """Static information about a tern device (name, cores, HBM, ...)."""
    _lazy_init()
    return dict(_C._device_info(_device_index(device)))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device)["name"]


# ---- Streams and events -----------------------------------------------------


class Stream:
    """``torch.tern.Stream()``: a ``torch.Stream`` of a tern device.

    A tern stream is an in-order tern queue on the device's core; new streams
    come from a fixed pool per device, round robin. Returns a plain
    ``torch.Stream`` (torch's stream/event methods accept no subclasses).
    """

    def __new__(cls, device: Any = None, priority: int = 0) -> torch.Stream:
        return torch.Stream(device=torch.device(_BACKEND, _device_index(device)), priority=priority)


class Event:
    """``torch.tern.Event()``: a ``torch.Event`` on a tern device.

    tern stamps every completed event, so elapsed_time works whether or not
    ``enable_timing`` was asked for.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, device: Any = None) -> torch.Event:
        return torch.Event(device=torch.device(_BACKEND, _device_index(device)),
                           enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def _make_stream(parts) -> torch.Stream:
    stream_id, device_index, device_type = parts
    return torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device: Any = None) -> torch.Stream:
    if torch.compiler.is_compiling():
        # Dynamo traces torch.accelerator's stream calls (a stream variable
        # in the graph, ordered by its stream state); it cannot trace _C's.
        if device is None:
            return torch.accelerator.current_stream()
        return torch.accelerator.current_stream(torch.device(_BACKEND, _device_index(device)))
    _lazy_init()
    return _make_stream(_C._current_stream(_device_index(device)))


def default_stream(device: Any = None) -> torch.Stream:
    _lazy_init()
    return _make_stream(_C._default_stream(_device_index(device)))


def set_stream(stream: torch.Stream) -> None:
    if stream is None:
        return
    _lazy_init()
    torch._C._accelerator_setStream(stream)


class StreamContext:
    """Makes ``stream`` current (and its device) inside a ``with`` block."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.prev_stream = None
        self.prev_device = -1

    def __enter__(self):
        if self.stream is None:
            return self
        self.prev_device = _C._exchange_device(self.stream.device_index)
        self.prev_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)
        return self

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        set_stream(self.prev_stream)
        if self.prev_device >= 0:
            _C._set_device(self.prev_device)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


# ---- Memory -----------------------------------------------------------------


def memory_stats(device: Any = None) -> dict[str, int]:
    """Caching-allocator statistics, with torch.cuda's key names."""
    if not _C._is_initialized():
        return {}
    return dict(_C._memory_stats(_device_index(device)))


def _stat(name: str, device: Any) -> int:
    return memory_stats(device).get(name, 0)


def memory_allocated(device: Any = None) -> int:
    """Bytes of device memory held by live tensors (rounded to block sizes)."""
    return _stat("allocated_bytes.all.current", device)


def max_memory_allocated(device: Any = None) -> int:
    return _stat("allocated_bytes.all.peak", device)


def memory_reserved(device: Any = None) -> int:
    """Bytes the caching allocator holds from tern (live + cached blocks)."""
    return _stat("reserved_bytes.all.current", device)


def max_memory_reserved(device: Any = None) -> int:
    return _stat("reserved_bytes.all.peak", device)


def reset_peak_memory_stats(device: Any = None) -> None:
    if _C._is_initialized():
        _C._reset_peak_memory_stats(_device_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    if _C._is_initialized():
        _C._reset_accumulated_memory_stats(_device_index(device))


def empty_cache() -> None:
    """Returns cached, unused blocks to tern (synchronizes the devices)."""
    if _C._is_initialized():
        _C._empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory, as tern accounts it node-wide."""
    _lazy_init()
    info = _C._tern_memory_info(_device_index(device))
    return info["free_bytes"], info["capacity_bytes"]


# ---- Random numbers -----------------------------------------------------------


def _generator(device: Any = None) -> torch.Generator:
    _lazy_init()
    return _C._get_default_generator(_device_index(device))


def manual_seed(seed: int) -> None:
    """Seeds the current tern device's default generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every tern device's default generator (torch.manual_seed calls this)."""
    if device_count() == 0:
        return
    for index in range(device_count()):
        _generator(index).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for index in range(device_count()):
        _generator(index).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: Any = "tern") -> torch.Tensor:
    """The generator state: 16 bytes, seed and offset (uint64, little endian)."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "tern") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


# ---- Autocast -----------------------------------------------------------------


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled(_BACKEND)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype(_BACKEND)
