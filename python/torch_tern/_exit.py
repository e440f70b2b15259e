"""What torch_tern does when the interpreter exits.

PyTorch's autograd engine runs a tensor's backward on a thread of its own per
device (for tern as for CUDA), except where a thread turned that off
(``torch.autograd.set_multithreading_enabled(False)``, which torch_tern does
for the thread that imports it). That thread releases a finished backward's
bookkeeping (the graph task: its nodes, its saved thread-local state) after
the caller's ``backward()`` has returned. When the graph held Python objects
(a custom ``autograd.Function``, every ``torch.compile`` training graph, a
saved-tensor hook or dispatch mode active at ``backward()``), releasing them
takes the GIL. A script whose last line is a backward can reach interpreter
finalization first: the main thread holds the GIL while it finalizes, the
autograd thread blocks on it, and Python ends that thread inside a C++
destructor, which aborts the whole process ("terminate called without an
active exception", exit status -6), after the script's work is done.

In torch 2.13 every graph task holds a Python object: ``backward()`` stashes
a copy of the caller's ``contextvars`` context in the thread-local state that
the task carries to the device threads.

At exit, while threads still run, ``drain_autograd_threads`` sends one small
backward through each tern device's autograd thread and waits for it. The
thread handles its work in order and releases each task before taking the
next, so once that backward returns, everything earlier is released. That
backward must not leave a Python object of its own to be released last: it
calls the engine directly (no stashed context), and its tensors stay in
``_KEPT`` until finalization frees them on the main thread.
"""

from __future__ import annotations

import atexit
import logging
import os

import torch

_log = logging.getLogger("torch_tern")
_KEPT: list = []


def _autograd_threads_started() -> bool:
    """Whether this process ran a backward: the engine starts its device
    threads (named pt_autograd_<index>) at the first one. True when the
    threads' names cannot be read."""
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("pt_autograd_"):
                    return True
        return False
    except OSError:
        return True


def drain_autograd_threads() -> None:
    """Waits until the autograd thread of every tern device this process
    holds memory on has released the work it was given (see the module's
    docstring). Does nothing when tern was never initialized in this process
    (or was, before a fork), or when the process ran no backward."""
    from . import _C

    if not _C._is_initialized() or _C._is_in_bad_fork() or not _autograd_threads_started():
        return
    for index in range(_C._device_count()):
        # A device this process never allocated on ran none of its backwards
        # (and may be another process's, as a distributed rank's neighbour).
        if torch.tern.memory_reserved(index) == 0:
            continue
        try:
            # Grad mode is per thread: the main thread may have it off. And
            # the main thread runs its own backwards (torch_tern's
            # _backward_on_calling_thread): this one must go to the device's
            # thread.
            with torch.inference_mode(False), torch.enable_grad(), \
                    torch.autograd.set_multithreading_enabled(True):
                leaf = torch.zeros(1, dtype=torch.float32, device=torch.device("tern", index),
                                   requires_grad=True)
                total = leaf.sum()
                _KEPT.append((leaf, total))
                # Not total.backward(): that stashes a context (a Python
                # object) in the graph task, which the autograd thread may
                # release last.
                torch.autograd.Variable._execution_engine.run_backward(
                    (total,), (torch.ones_like(total),), False, False, (), True, True)
        except Exception as err:  # a device in an error state: nothing more to do there
            _log.debug("tern: draining device %d's autograd thread at exit failed: %s", index,
                       err)


def register() -> None:
    atexit.register(drain_autograd_threads)
