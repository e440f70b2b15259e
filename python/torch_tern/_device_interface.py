"""Dynamo's device interface for tern (torch._dynamo.device_interface).

Dynamo asks a device's interface how to handle its tensors, streams, events
and synchronisation when it traces code that touches them (``torch.tern.
current_stream()``, ``with torch.tern.stream(s)``, ``torch.tern.synchronize()``
inside a compiled function); CUDA's, XPU's and MTIA's are built in, an
out-of-tree device registers its own. Registered by the "tern" Dynamo
backend's module (torch_tern.compiler._dynamo), which Dynamo imports when a
model is compiled with backend="tern"; importing torch_tern does not import
Dynamo.
"""

from __future__ import annotations

from typing import Any

import torch

from . import device_module as _tern

__all__ = ["TernInterface", "register"]

# What the parent process recorded for compile workers (Worker below).
_worker_device: dict[str, int] = {}
_worker_properties: dict[str, list] = {}


def _index(device: Any) -> int:
    if device is None:
        return _tern.current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tern":
            raise ValueError(f"{device} is not a tern device")
        return _tern.current_device() if device.index is None else device.index
    return int(device)


def _make_interface():
    from torch._dynamo.device_interface import DeviceInterface

    class TernInterface(DeviceInterface):
        device = _tern.device
        Event = torch.Event
        Stream = torch.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                _worker_device["tern"] = device

            @staticmethod
            def current_device() -> int:
                return _worker_device.get("tern", _tern.current_device())

            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                if "tern" not in _worker_properties:
                    _worker_properties["tern"] = [
                        _tern.get_device_properties(i) for i in range(_tern.device_count())]
                index = TernInterface.Worker.current_device() if device is None else _index(device)
                return _worker_properties["tern"][index]

        current_device = staticmethod(_tern.current_device)
        set_device = staticmethod(_tern.set_device)
        device_count = staticmethod(_tern.device_count)
        is_available = staticmethod(_tern.is_available)
        # `stream` stays DeviceInterface's: Dynamo turns every registered
        # interface's `stream` function into a stream context it traces, and
        # with torch.tern.stream that left the stream of a `with` block with
        # a graph break inside it current after the block. Unregistered,
        # Dynamo runs such a block eagerly, correctly.
        current_stream = staticmethod(_tern.current_stream)
        set_stream = staticmethod(_tern.set_stream)
        synchronize = staticmethod(_tern.synchronize)
        get_device_properties = staticmethod(_tern.get_device_properties)
        memory_allocated = staticmethod(_tern.memory_allocated)

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True  # the engines compute bf16 natively

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            _tern.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                          device_type=device_type))

        @staticmethod
        def get_raw_stream(device_index: int) -> int:
            return _tern.current_stream(device_index).stream_id

        @staticmethod
        def exchange_device(device: int) -> int:
            previous = _tern.current_device()
            if device >= 0 and device != previous:
                _tern.set_device(device)
            return previous

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return TernInterface.exchange_device(device)

        @staticmethod
        def get_compute_capability(device: Any = None) -> Any:
            return _tern.get_device_properties(_index(device)).arch

    return TernInterface


TernInterface = None


def _run_stream_contexts_eagerly() -> None:
    """`with torch.tern.stream(s):` inside a compiled function: Dynamo traced
    into the context's __enter__ and __exit__ and left `s` current after the
    block. They run eagerly now (a graph break at each, the stream switch
    exact); Dynamo is imported by now, so this costs importing torch_tern
    nothing."""
    from torch._dynamo import disable

    context = _tern.StreamContext
    if not getattr(context.__enter__, "_tern_eager", False):
        for name in ("__enter__", "__exit__"):
            method = disable(getattr(context, name))
            method._tern_eager = True
            setattr(context, name, method)


def register() -> None:
    """Registers the interface for "tern" and every "tern:N" (idempotent)."""
    global TernInterface
    from torch._dynamo.device_interface import register_interface_for_device

    _run_stream_contexts_eagerly()
    if TernInterface is None:
        TernInterface = _make_interface()
    register_interface_for_device("tern", TernInterface)
    for i in range(_tern.device_count()):
        register_interface_for_device(f"tern:{i}", TernInterface)
