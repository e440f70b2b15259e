"""``torch.tern.profiler``: tern's device trace and log messages from Python.

A capture records what the tern queues run (copies, fills, executions with a
span per instruction, event waits, host callbacks, collectives) into a
Perfetto / Chrome trace file, one track per queue::

    with torch.tern.profiler.profile("step.json"):
        loss = model(x).sum(); loss.backward(); torch.tern.synchronize()

Open the file in ui.perfetto.dev or chrome://tracing. Commands that start
running between ``start`` and ``stop`` are recorded; synchronise before
``stop`` to catch the work still queued. ``TERN_TRACE=path`` makes a capture
of the whole process instead (it then owns the capture and ``start`` refuses).

``forward_logs()`` routes tern's own messages (warnings by default,
``TERN_LOG_LEVEL``) into Python's ``logging`` (logger ``torch_tern.runtime``)
instead of stderr, so an application's logging configuration applies to them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
from typing import Callable, Iterator

from . import _C

__all__ = ["forward_logs", "forwarding_logs", "profile", "start", "stop", "stop_forwarding_logs"]

# tern_log_level_t -> logging levels.
_LEVELS = {0: 5, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


def start(path: str | os.PathLike) -> None:
    """Starts a capture that ``stop()`` writes to ``path`` (Chrome trace JSON).

    Raises if a capture already runs (one at a time per process, ``TERN_TRACE``'s
    included)."""
    _C._profile_start(os.fspath(path))


def stop() -> None:
    """Ends the capture and writes its file (whole or not at all)."""
    _C._profile_stop()


@contextlib.contextmanager
def profile(path: str | os.PathLike) -> Iterator[None]:
    """A capture around a block: ``start(path)`` on entry, ``stop()`` on exit
    (also when the block raises)."""
    start(path)
    try:
        yield
    finally:
        stop()


def forward_logs(logger: logging.Logger | Callable[[int, str], None] | None = None) -> None:
    """Sends tern's log messages to ``logger`` instead of stderr.

    ``logger`` is a ``logging.Logger`` (default: ``logging.getLogger(
    "torch_tern.runtime")``) or a callable ``(level, message)`` with a
    ``logging`` level. Messages are delivered on a thread of the plugin, in
    order, shortly after tern logs them (tern may log on its queue threads,
    where taking the GIL could deadlock). Calling it again replaces the
    destination; ``stop_forwarding_logs()`` restores stderr."""
    if logger is None:
        logger = logging.getLogger("torch_tern.runtime")
    if isinstance(logger, logging.Logger):
        target = logger

        def sink(level: int, message: str) -> None:
            target.log(_LEVELS.get(level, logging.WARNING), message)
    else:
        callback = logger

        def sink(level: int, message: str) -> None:
            callback(_LEVELS.get(level, logging.WARNING), message)

    _C._forward_logs(sink)


def stop_forwarding_logs() -> None:
    """Delivers the messages already received, then sends tern's messages to
    stderr again."""
    _C._stop_forwarding_logs()


def forwarding_logs() -> bool:
    """Whether tern's messages go to Python (``forward_logs``)."""
    return _C._forwarding_logs()


# The forwarding thread needs the interpreter: end it before Python finalises.
atexit.register(stop_forwarding_logs)
