"""PyTorch's distributed test suite (distributed_test.py) with BACKEND=tern.

torch ships the suite as ``torch.testing._internal.distributed.distributed_test``:
``DistributedTest._DistTestBase`` holds the tests, ``TestDistBackend`` the
multi-process harness (each test spawns WORLD_SIZE processes that join a
group with ``init_process_group(backend=BACKEND)`` through a file:// init
method). PyTorch's own test/distributed/test_distributed_spawn.py combines the
two into a class only for gloo, nccl and ucc; this module makes the same class
for tern. It is not collected by the plugin's test command (its name does not
start with ``test_``): run_distributed_suite.py runs it, all of it or a subset,
and python/tests/test_upstream_distributed.py runs the CI subset.

The suite picks devices by backend name: its tensors are CPU tensors unless
the backend is in ``DistTestCases.backend_feature["gpu"]`` / ``["cuda"]``, and
then it puts them on CUDA (``.cuda(rank_to_GPU[rank][0])``,
``torch.cuda.set_device``, ``device="cuda"``). The placement layer below makes
that device tern, and nothing else. Each patch, and why:

1. ``DistTestCases.backend_feature``: "tern" added to "plugin" (the suite's
   set for out-of-tree backends: ``require_backend_is_available`` accepts it),
   "gpu" and "cuda" (run the device variants: ``test_*_cuda``,
   ``test_*_multigpu``), "ddp" and "subgroup" (run the DDP and sub-group
   tests). ``skip_collective`` is left alone: what tern does not support
   fails, with tern's error, instead of being skipped.
2. ``init_multigpu_helper``, ``skip_if_lt_x_gpu``, ``skip_if_no_gpu``
   (common_distributed): count tern devices instead of CUDA devices. Replaced
   before distributed_test imports them, since it binds them by name and
   applies the decorators at import.
3. The name ``torch`` inside distributed_test (only there) is a view of torch
   whose ``torch.cuda`` is ``torch.tern`` (which mirrors torch.cuda:
   set_device, current_device, device_count, synchronize, manual_seed,
   Stream, stream), and whose ``torch.device("cuda:i")`` and ``device="cuda"``
   arguments of torch functions mean tern. torch itself, DDP included, is
   not touched.
4. In each rank process: ``Tensor.cuda(i)`` and ``Module.cuda(i)`` move to
   ``tern:i`` (the suite's way to place tensors and models), and the rank's
   tern device is set (``rank % device_count``).
5. Placement of the suite's "CPU" tests (the ones NCCL skips because it takes
   no CPU tensors): with ``TERN_SUITE_PLACEMENT=tern`` (the default) each rank
   also runs with ``torch.set_default_device("tern:<device>")``, so the
   tensors they make without a device are tern tensors and the tests exercise
   tern's collectives; with ``TERN_SUITE_PLACEMENT=cpu`` they stay on the CPU
   as shipped (tern then refuses them: a group made with ``backend="tern"``
   has no backend for CPU tensors). Tensors a test puts on the CPU explicitly
   (``device="cpu"``, ``.cpu()``) stay there in both modes.
6. The name ``dist`` inside distributed_test (only there) is a view of
   torch.distributed whose ``new_group(backend="nccl")`` makes a group of
   BACKEND: the suite names NCCL where it means the backend of its CUDA
   tensors (``test_average_parameters``, the monitored-barrier tests), and
   its CUDA tensors are tern tensors here (3.).

Environment: BACKEND (default tern), WORLD_SIZE (default 2),
TERN_SUITE_PLACEMENT (tern or cpu), DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (the
harness's per-test limit, seconds; the runner sets it).
"""

from __future__ import annotations

import functools
import os
import sys
import types

os.environ.setdefault("BACKEND", "tern")
os.environ.setdefault("WORLD_SIZE", "2")

import torch  # noqa: E402  (torch_tern loads through torch's backend autoloading)
import torch.testing._internal.common_distributed as common_distributed  # noqa: E402

BACKEND = os.environ["BACKEND"]
PLACEMENT = os.environ.get("TERN_SUITE_PLACEMENT", "tern")
if PLACEMENT not in ("tern", "cpu"):
    raise ValueError(f"TERN_SUITE_PLACEMENT must be 'tern' or 'cpu', not {PLACEMENT!r}")

# 1. The suite's capability sets.
for _feature in ("plugin", "gpu", "cuda", "ddp", "subgroup"):
    common_distributed.DistTestCases.backend_feature[_feature].add(BACKEND)

# The harness's per-test limit applies to every test (the suite raises it to
# 400-500 s for three DDP tests).
for _name in list(common_distributed.TIMEOUT_OVERRIDE):
    common_distributed.TIMEOUT_OVERRIDE[_name] = min(
        common_distributed.TIMEOUT_OVERRIDE[_name], common_distributed.TIMEOUT_DEFAULT)


# 2. Device counting helpers, on tern.
def _tern_count() -> int:
    return torch.tern.device_count() if torch.tern.is_available() else 0


def _init_multigpu_helper(world_size: int, backend: str):
    """Rank i gets tern device i (the upstream helper's layout, tern's count)."""
    n = _tern_count()
    per_process = 1 if world_size <= n else n // world_size
    return {i: list(range(n))[i * per_process:(i + 1) * per_process] for i in range(world_size)}


def _exit_skip(x: int):
    sys.exit(common_distributed.TEST_SKIPS[f"multi-gpu-{x}"].exit_code)


def _skip_if_lt_x_gpu(x, *, allow_cpu=False):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if _tern_count() >= x:
                return func(*args, **kwargs)
            _exit_skip(x)

        return wrapper

    return decorator


def _skip_if_no_gpu(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        world_size = int(os.environ["WORLD_SIZE"])
        if _tern_count() < world_size:
            _exit_skip(world_size)
        return func(*args, **kwargs)

    return wrapper


common_distributed.init_multigpu_helper = _init_multigpu_helper
common_distributed.skip_if_lt_x_gpu = _skip_if_lt_x_gpu
common_distributed.skip_if_no_gpu = _skip_if_no_gpu

import torch.testing._internal.distributed.distributed_test as distributed_test  # noqa: E402


# 3. The suite's view of torch: "cuda" means tern.
def _tern_device(spec):
    if isinstance(spec, str) and spec.startswith("cuda"):
        return spec.replace("cuda", "tern", 1)
    if isinstance(spec, torch.device) and spec.type == "cuda":
        return torch.device("tern", spec.index)
    return spec


def _device(*args, **kwargs):
    if args:
        args = (_tern_device(args[0]),) + args[1:]
    return torch.device(*args, **kwargs)


class _SuiteTorch(types.ModuleType):
    """torch, as distributed_test sees it."""

    def __init__(self):
        super().__init__("torch")
        self.__dict__["cuda"] = torch.tern
        self.__dict__["device"] = _device
        self.__dict__["_wrapped"] = {}

    def __getattr__(self, name):
        value = getattr(torch, name)
        if not isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            return value
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            @functools.wraps(value)
            def wrapped(*args, **kwargs):
                if "device" in kwargs:
                    kwargs["device"] = _tern_device(kwargs["device"])
                return value(*args, **kwargs)

            self._wrapped[name] = wrapped
        return wrapped


distributed_test.torch = _SuiteTorch()


# 6. The suite's view of torch.distributed: NCCL groups are groups of BACKEND.
def _new_group(*args, **kwargs):
    if len(args) > 2 and args[2] == "nccl":  # new_group(ranks, timeout, backend, ...)
        args = args[:2] + (BACKEND,) + args[3:]
    if kwargs.get("backend") == "nccl":  # dist.Backend.NCCL is the string "nccl"
        kwargs["backend"] = BACKEND
    return torch.distributed.new_group(*args, **kwargs)


class _SuiteDist(types.ModuleType):
    """torch.distributed, as distributed_test sees it."""

    def __init__(self):
        super().__init__("torch.distributed")
        self.__dict__["new_group"] = _new_group

    def __getattr__(self, name):
        return getattr(torch.distributed, name)


distributed_test.dist = _SuiteDist()


# 4. and 5. In each rank process.
def _tern_index(device) -> int:
    if device is None:
        return torch.tern.current_device()
    if isinstance(device, int):
        return device
    return torch.device(_tern_device(device)).index or 0


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    return self.to(torch.device("tern", _tern_index(device)), non_blocking=non_blocking,
                   memory_format=memory_format)


def _module_cuda(self, device=None):
    return self.to(torch.device("tern", _tern_index(device)))


def setup_rank(rank: int) -> None:
    torch.Tensor.cuda = _tensor_cuda
    torch.nn.Module.cuda = _module_cuda
    index = rank % max(_tern_count(), 1)
    torch.tern.set_device(index)
    if PLACEMENT == "tern":
        torch.set_default_device(f"tern:{index}")


class TestDistBackendWithSpawn(distributed_test.TestDistBackend,
                               distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        setup_rank(rank)
        super()._run(rank, test_name, file_name, pipe, **kwargs)


if __name__ == "__main__":
    from torch.testing._internal.common_utils import run_tests

    run_tests()
