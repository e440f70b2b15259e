"""``torch.tern.graphs``: stream capture into tern graphs, shaped like
``torch.cuda.graphs``.

While a stream captures, the plugin records what it would have queued on that
stream (executions, device copies and fills, small host-to-device copies kept
by value) into a tern graph (``tern/graph.h``) instead of running it;
``replay()`` launches the whole recording on the current stream with one
call. What a graph cannot replay (a device-to-host copy, a synchronization,
events across streams, a CPU fallback, random numbers) raises at once and
ends the capture. docs/torch.md, "Graphs", has the rules.
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from . import _C

__all__ = [
    "TernGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]


def is_current_stream_capturing() -> bool:
    """True while the current tern stream of the current device is capturing."""
    if not _C._is_initialized():
        return False
    stream = torch.tern.current_stream()
    return bool(_C._is_stream_capturing(stream.stream_id, stream.device_index))


def graph_pool_handle() -> tuple[int, int]:
    """A new memory pool id to share between graphs (``pool=`` of
    ``TernGraph.capture_begin`` and ``torch.tern.graph``)."""
    return (0, int(_C._graph_pool_handle()))


def _pool_id(pool: Any) -> int:
    if pool is None:
        return 0
    if isinstance(pool, tuple):
        return int(pool[1])
    return int(pool)


class TernGraph:
    """A tern graph captured from a stream (``torch.cuda.CUDAGraph``'s shape).

    ``capture_begin(pool=None)`` starts capturing the current stream;
    ``capture_end()`` finalizes the graph; ``replay()`` launches it on the
    current stream; ``reset()`` waits for the device and releases the graph,
    the executables it pinned and its memory pool.
    """

    def __init__(self, keep_graph: bool = False) -> None:
        self._graph = _C._TernGraph()

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self._graph.capture_begin(_pool_id(pool))

    def capture_end(self) -> None:
        self._graph.capture_end()

    def _abort_capture(self, reason: str) -> None:
        self._graph.abort_capture(reason)

    def instantiate(self) -> None:
        """Nothing to do: capture_end() finalizes the graph."""

    def replay(self) -> None:
        self._graph.replay()

    def reset(self) -> None:
        self._graph.reset()

    def pool(self) -> tuple[int, int]:
        return (0, int(self._graph.pool()))

    def command_count(self) -> int:
        """Commands the graph recorded (tern_graph_get_info)."""
        return int(self._graph.command_count())


class graph:
    """``with torch.tern.graph(g):`` captures the block into ``g`` on a side
    stream (or ``stream``), as ``torch.cuda.graph`` does: the device is
    synchronized and the allocator's cache emptied first."""

    default_capture_stream: torch.Stream | None = None

    def __init__(self, tern_graph: TernGraph, pool: Any = None, stream: torch.Stream | None = None,
                 capture_error_mode: str = "global") -> None:
        if stream is None:
            if self.__class__.default_capture_stream is None:
                self.__class__.default_capture_stream = torch.tern.Stream()
            stream = self.__class__.default_capture_stream
        self.pool = pool
        self.capture_stream = stream
        self.stream_ctx = torch.tern.stream(self.capture_stream)
        self.tern_graph = tern_graph

    def __enter__(self) -> None:
        torch.tern.synchronize()
        gc.collect()
        torch.tern.empty_cache()
        self.stream_ctx.__enter__()
        try:
            self.tern_graph.capture_begin(self.pool)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        try:
            if exc_type is None:
                self.tern_graph.capture_end()
            else:
                # Keep the block's own exception: end the capture quietly.
                self.tern_graph._abort_capture(f"an exception left the capture ({exc_type.__name__})")
        finally:
            self.stream_ctx.__exit__(exc_type, exc_value, traceback)


def make_graphed_callables(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(
        "torch.tern.make_graphed_callables is not implemented yet; capture the forward with "
        "torch.tern.graph and replay it (docs/torch.md, 'Graphs')")
