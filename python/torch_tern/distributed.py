"""torch.distributed on tern: the ``tern`` c10d backend.

Importing torch_tern (``import torch`` does, through backend autoloading)
registers the backend, so that under torchrun::

    torch.tern.set_device(int(os.environ["LOCAL_RANK"]) % torch.tern.device_count())
    dist.init_process_group()                 # cpu:gloo,tern:tern
    dist.init_process_group(backend="tern")   # tern tensors; CPU ones staged through tern
    dist.init_process_group(backend="cpu:gloo,tern:tern")

The backend (C++, ``ProcessGroupTern``) runs tern's collectives
(include/tern/comm.h) on a communication stream of the group's device. Its
rendezvous goes only through the c10d store torch hands it: rank 0 creates
tern's unique id (bootstrap address and secret) and publishes it under the
group's store prefix; the other ranks read it there; rank 0 deletes it once
every rank has joined.

Sub-groups are split from their parent's communicator (``tern_comm_split``)
where torch splits, that is once the default group is bound to a device
(``init_process_group(device_id=...)``, which also connects it at once):
``split_group`` and DeviceMesh call the backend's ``split`` on every rank of
the parent; ``new_group`` calls ``perform_nocolor_split`` on the non-members
and this module's creator splits for the members. Other sub-groups (no bound
device; ``new_group(use_local_synchronization=True)`` that leaves ranks out)
make a communicator through their own store prefix, as above.

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


def _split_parent(dist_backend_opts):
    """The default group's tern backend when this new group is split from it, else None.

    Mirrors torch's own test in ``_new_process_group_helper``: once the default
    group is bound to a device, torch makes every rank that is not a member
    call ``perform_nocolor_split`` on the backend ``_get_split_source`` gives;
    the members must then enter the same split here, or both sides would
    wait for each other.
    """
    from torch.distributed import distributed_c10d as c10d

    if not c10d.is_initialized():
        return None  # this is the default group
    default = c10d._get_default_group()
    if default.bound_device_id is None:
        return None
    # new_group(use_local_synchronization=True) is the one case where the
    # non-members return before that test; torch names such a group by a hash
    # of its ranks, every other new_group by a counter. Unless every rank is a
    # member, such a group cannot split (a split is collective over the parent).
    counter_named = str(dist_backend_opts.group_id).isdecimal()
    everyone = len(dist_backend_opts.global_ranks_in_group) == default.size()
    if not (counter_named or everyone):
        return None
    source = c10d._get_split_source(default)
    return source if isinstance(source, _C._ProcessGroupTern) else None


def _create_backend(dist_backend_opts, backend_options):
    """The creator torch calls (``extended_api=True``) for each group that uses tern."""
    _C._distributed_init()
    parent = _split_parent(dist_backend_opts)
    if parent is not None:
        return parent._split_for_new_group(
            dist_backend_opts.store,
            dist_backend_opts.group_rank,
            dist_backend_opts.group_size,
            dist_backend_opts.timeout,
            dist_backend_opts.group_id,
        )
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
        # tern first: torch names the group's store prefix after the first
        # device. CPU tensors are staged through the group's tern device
        # (python/csrc/distributed/cpu_staging.h); init_process_group()
        # without a backend still gives them to gloo.
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=[BACKEND_NAME, "cpu"]
        )
    _patch_default_backend_config()


def describe(group=None) -> str:
    """Where ``group``'s tern communicator runs (rank, device, transport)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device(BACKEND_NAME))
    return backend._describe()


def comm_origin(group=None) -> str:
    """How ``group``'s tern communicator was made: ``"split"`` (from its parent's),
    ``"store"`` (a rendezvous through the c10d store), or ``""`` (not made yet)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg._get_backend(torch.device(BACKEND_NAME))._origin()
