"""torch.distributed on tern: the ``tern`` c10d backend.

Importing torch_tern (``import torch`` does, through backend autoloading)
registers the backend, so that under torchrun::

    torch.tern.set_device(int(os.environ["LOCAL_RANK"]) % torch.tern.device_count())
    dist.init_process_group()                 # cpu:gloo,tern:tern
    dist.init_process_group(backend="tern")   # tern tensors only
    dist.init_process_group(backend="cpu:gloo,tern:tern")

The backend (C++, ``ProcessGroupTern``) runs tern's collectives
(include/tern/comm.h) on a communication stream of the group's device. Its
rendezvous goes only through the c10d store torch hands it: rank 0 creates
tern's unique id (bootstrap address and secret) and publishes it under the
group's store prefix; the other ranks read it there; rank 0 deletes it once
every rank has joined. ``new_group`` and DeviceMesh groups get their own
communicator the same way.

The default case: torch 2.13 resolves ``init_process_group()`` without a
backend to the accelerator's backend only (``tern``), which leaves CPU tensors
without one. :func:`register` adds gloo for ``cpu`` in that case, as torch does
for CUDA (``cpu:gloo,cuda:nccl``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _C

BACKEND_NAME = "tern"

__all__ = ["BACKEND_NAME", "is_available", "register"]


def is_available() -> bool:
    """True when torch was built with torch.distributed (the backend needs it)."""
    return dist.is_available()


def _create_backend(dist_backend_opts, backend_options):
    """The creator torch calls (``extended_api=True``) for each group that uses tern."""
    _C._distributed_init()
    return _C._ProcessGroupTern(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
        dist_backend_opts.group_id,
    )


def _patch_default_backend_config() -> None:
    """``init_process_group()`` on a tern machine gets ``cpu:gloo,tern:tern``.

    torch's BackendConfig maps an undefined backend to the accelerator's
    default backend alone; this adds gloo for CPU tensors when that default
    is tern and gloo is built in. Nothing else changes.
    """
    from torch.distributed import distributed_c10d as c10d

    original = c10d.BackendConfig.__init__
    if getattr(original, "_torch_tern_wrapped", False):
        return

    def __init__(self, backend):
        original(self, backend)
        if (
            str(backend) == c10d.Backend.UNDEFINED
            and set(self.device_backend_map) == {BACKEND_NAME}
            and c10d.is_gloo_available()
        ):
            self.device_backend_map = {
                "cpu": c10d.Backend(c10d.Backend.GLOO),
                BACKEND_NAME: c10d.Backend(BACKEND_NAME),
            }

    __init__._torch_tern_wrapped = True
    c10d.BackendConfig.__init__ = __init__


def register() -> None:
    """Registers the ``tern`` backend with torch.distributed (idempotent).

    Called when torch_tern is imported; does nothing when torch has no
    distributed support.
    """
    if not is_available():
        return
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=[BACKEND_NAME]
        )
    _patch_default_backend_config()


def describe(group=None) -> str:
    """Where ``group``'s tern communicator runs (rank, device, transport)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device(BACKEND_NAME))
    return backend._describe()
