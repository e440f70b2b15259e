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
    "TernGraph",
    "graph",
    "graph_pool_handle",
    "graphs",
    "make_graphed_callables",
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
    "get_device_capability",
    "get_arch_list",
    "get_per_process_memory_fraction",
    "ipc_collect",
    "memory_snapshot",
    "memory_summary",
    "set_per_process_memory_fraction",
    "utilization",
    "TernDeviceProperties",
    "amp",
    "memory",
    "profiler",
    "random",
    "device_memory_used",
    "device_of",
    "get_allocator_backend",
    "has_half",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "is_current_stream_capturing",
    "is_tf32_supported",
    "max_memory_cached",
    "memory_cached",
    "memory_stats_as_nested_dict",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
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
        # As torch.cuda.set_device: choosing a device initializes tern, so
        # is_initialized() is True after it (DeviceMesh sets the device by
        # LOCAL_RANK only when is_initialized() says no one has).
        _lazy_init()
        _C._set_device(index)


class device_of:
    """Context manager that makes the tensor's device current (nothing for a
    tensor that is not on tern)."""

    def __init__(self, obj: torch.Tensor):
        self.idx = obj.get_device() if obj.device.type == _BACKEND else -1
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *exc):
        if self.prev_idx >= 0:
            _C._set_device(self.prev_idx)
        return False


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


class TernDeviceProperties:
    """What ``torch.tern.get_device_properties`` returns: attributes, like
    ``torch.cuda``'s device properties.

    ``name``, ``total_memory`` (bytes), ``major`` and ``minor`` (the
    architecture generation: "trn2" is 2.0), ``multi_processor_count`` (the
    cores this process sees: a core is the unit that runs a queue's work, as
    a multiprocessor is CUDA's), and tern's own: ``core_count``,
    ``physical_core_count``, ``index``, ``physical_index``, ``driver``,
    ``numa_node``, ``memory_alignment``, ``cpu_affinity``, ``opened_core``,
    ``uuid`` (stable across processes and runs), ``bus_id``, ``driver_version``.
    """

    def __init__(self, info: dict):
        self.name: str = info["name"]
        self.total_memory: int = int(info["memory_bytes"])
        self.arch: str = _architecture(self.name)
        self.major, self.minor = _capability_of(self.arch)
        self.multi_processor_count: int = int(info["core_count"])
        self.core_count: int = int(info["core_count"])
        self.physical_core_count: int = int(info["physical_core_count"])
        self.index: int = int(info["index"])
        self.physical_index: int = int(info["physical_index"])
        self.driver: str = info["driver"]
        self.numa_node: int = int(info["numa_node"])
        self.memory_alignment: int = int(info["memory_alignment"])
        self.cpu_affinity: str = info["cpu_affinity"]
        self.opened_core: int = int(info["opened_core"])
        self.uuid: str = info["uuid"]
        self.bus_id: str = info["bus_id"]
        self.driver_version: str = info["driver_version"]
        self.is_integrated: bool = False

    def __repr__(self) -> str:
        return (f"TernDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // (1 << 20)}MB, "
                f"core_count={self.core_count}, driver='{self.driver}')")


def _architecture(name: str) -> str:
    """The architecture a device name ends with ("tern-sim trn2" -> "trn2")."""
    return name.split()[-1] if name.split() else name


def _capability_of(arch: str) -> tuple[int, int]:
    digits = "".join(ch for ch in arch if ch.isdigit())
    return (int(digits), 0) if digits else (0, 0)


def get_device_properties(device: Any = None) -> TernDeviceProperties:
    """Static information about a tern device: name, memory, cores, ... as attributes."""
    _lazy_init()
    return TernDeviceProperties(dict(_C._device_info(_device_index(device))))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor) of the device's architecture generation: (2, 0) for trn2."""
    props = get_device_properties(device)
    return props.major, props.minor


def get_arch_list() -> list[str]:
    """The architectures tern's compiler and builder emit executables for."""
    return ["trn2"]


_utilization_samples: dict[int, tuple[float, int]] = {}


def utilization(device: Any = None) -> int:
    """Percent of time the device's cores ran commands (any process), like
    ``torch.cuda.utilization``: over the time since the previous call for the
    device, or over a 50 ms window sampled now when that was less than 20 ms
    ago or there was none."""
    import time

    index = _device_index(device)
    now, busy = time.monotonic(), _C._core_busy(index)
    previous = _utilization_samples.get(index)
    if previous is None or now - previous[0] < 0.02:
        previous = (now, busy["busy_ns"])
        time.sleep(0.05)
        now, busy = time.monotonic(), _C._core_busy(index)
    _utilization_samples[index] = (now, busy["busy_ns"])
    elapsed_ns = (now - previous[0]) * 1e9 * max(1, busy["core_count"])
    return max(0, min(100, round(100 * (busy["busy_ns"] - previous[1]) / elapsed_ns)))


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


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Caps what this process's caching allocator reserves on ``device`` at
    ``fraction`` of the device's memory; past it, allocations first release the
    cached blocks, then raise ``torch.OutOfMemoryError``. 1.0 removes the cap."""
    _lazy_init()
    if not isinstance(fraction, (int, float)):
        raise TypeError(f"the fraction must be a number, got {type(fraction).__name__}")
    _C._set_memory_fraction(float(fraction), _device_index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    _lazy_init()
    return _C._get_memory_fraction(_device_index(device))


def memory_snapshot() -> list[dict]:
    """The caching allocator's segments, shaped like ``torch.cuda.memory_snapshot()``:
    one segment per block (tern's allocator never splits blocks)."""
    if not _C._is_initialized():
        return []
    segments = []
    for block in _C._memory_snapshot():
        active = block["state"] == "active_allocated"
        segments.append({
            "device": block["device"],
            "address": block["address"],
            "total_size": block["size"],
            "allocated_size": block["size"] if active else 0,
            "active_size": block["size"] if active else 0,
            "requested_size": block["requested_size"],
            "stream": block["stream"],
            "segment_type": "small" if block["size"] <= (1 << 20) else "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [{
                "address": block["address"],
                "size": block["size"],
                "requested_size": block["requested_size"],
                "state": block["state"],
                "frames": [],
            }],
        })
    return segments


def _format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of the caching allocator's statistics for ``device``."""
    stats = memory_stats(device)
    index = _device_index(device)
    rows = [("Allocated memory", "allocated_bytes", True),
            ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True),
            ("Reserved memory", "reserved_bytes", True),
            ("Allocations", "allocation", False),
            ("Active allocs", "active", False),
            ("Segments (tern buffers)", "segment", False)]
    pools = ["all"] if abbreviated else ["all", "small_pool", "large_pool"]
    lines = [f"tern caching allocator, device tern:{index}",
             f"{'metric':<28}{'pool':<12}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
    for title, key, is_bytes in rows:
        for pool in pools:
            values = [stats.get(f"{key}.{pool}.{what}", 0)
                      for what in ("current", "peak", "allocated", "freed")]
            text = [_format_size(v) if is_bytes else str(v) for v in values]
            lines.append(f"{title if pool == 'all' else '':<28}{pool:<12}"
                         + "".join(f"{t:>14}" for t in text))
    lines.append(f"tern buffers allocated / freed: {stats.get('num_device_alloc', 0)} / "
                 f"{stats.get('num_device_free', 0)}; OOMs: {stats.get('num_ooms', 0)}; "
                 f"retries after releasing the cache: {stats.get('num_alloc_retries', 0)}")
    if _C._is_initialized():
        lines.append(f"per-process memory fraction: {get_per_process_memory_fraction(index)}")
    return "\n".join(lines) + "\n"


def memory_stats_as_nested_dict(device: Any = None) -> dict:
    """``memory_stats`` with its dotted keys as nested dictionaries."""
    return _nest(memory_stats(device))


def _nest(flat: dict) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def host_memory_stats() -> dict[str, int]:
    """Statistics of the pinned host-memory allocator (``pin_memory()`` on tern)."""
    return dict(_C._host_memory_stats())


def host_memory_stats_as_nested_dict() -> dict:
    return _nest(host_memory_stats())


def device_memory_used(device: Any = None) -> int:
    """Bytes of the device's memory in use by every process on the node."""
    _lazy_init()
    return int(_C._tern_memory_info(_device_index(device))["node_used_bytes"])


def get_allocator_backend() -> str:
    """tern's caching allocator is the only one ("native", as torch.cuda names its own)."""
    return "native"


# Names torch.cuda keeps for old code.
def memory_cached(device: Any = None) -> int:
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    return max_memory_reserved(device)


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def ipc_collect() -> None:
    """Nothing to collect: tern tensors are not shared between processes yet
    (device memory export is planned with the runtime's IPC handles)."""


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


def is_tf32_supported() -> bool:
    """False: tern's engines compute float32 matmuls in float32, never in TF32."""
    return False


# torch.cuda.has_half: the engines compute float16.
has_half = True


def __getattr__(name: str) -> Any:
    # torch.cuda.default_generators is a tuple made at initialisation; here it
    # is made when first asked for, which initialises tern.
    if name == "default_generators":
        return tuple(_generator(i) for i in range(device_count()))
    raise AttributeError(f"module 'torch.tern' has no attribute '{name}'")


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled(_BACKEND)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype(_BACKEND)


# ---- Submodules, as torch.cuda has them ----------------------------------------
# Imported last: they take their functions from this module.
from . import amp, graphs, memory, profiler, random  # noqa: E402,F401
from .graphs import (  # noqa: E402,F401
    TernGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)

# torch.cuda's name for the graph class, for code written against it.
CUDAGraph = TernGraph
