"""``torch.tern.amp``: autocast and gradient scaling on tern, shaped like
``torch.cuda.amp`` (whose names torch now keeps under ``torch.amp`` with a
device argument; these fix the device to tern)."""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.autocast("tern", ...)``; ``dtype`` defaults to tern's autocast
    dtype (``torch.get_autocast_dtype("tern")``)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype | None = None,
                 cache_enabled: bool = True):
        if dtype is None:
            dtype = torch.get_autocast_dtype("tern")
        super().__init__("tern", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("tern", ...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("tern", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def custom_fwd(fwd: Any = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    """``torch.amp.custom_fwd(device_type="tern")``."""
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="tern", cast_inputs=cast_inputs)


def custom_bwd(bwd: Any) -> Any:
    """``torch.amp.custom_bwd(device_type="tern")``."""
    return torch.amp.custom_bwd(bwd, device_type="tern")
