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


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _graph_one(fn: Any, args: tuple, params: tuple, num_warmup_iters: int,
               allow_unused_input: bool, pool: Any):
    """Captures fn's forward and backward; returns the autograd function's
    pieces (the forward graph and its static tensors, then the backward's)."""
    static_inputs = tuple(args) + tuple(params)
    needs_grad = [t.requires_grad for t in static_inputs]
    grad_inputs = [t for t in static_inputs if t.requires_grad]
    stream = graph.default_capture_stream
    if stream is None:
        stream = graph.default_capture_stream = torch.tern.Stream()
    # Warm up on the capture stream: kernels are built, lazy state settles.
    stream.wait_stream(torch.tern.current_stream())
    with torch.tern.stream(stream):
        for _ in range(num_warmup_iters):
            outputs = [o for o in _tensors(fn(*args)) if o.requires_grad]
            if outputs and grad_inputs:
                torch.autograd.grad(outputs, grad_inputs,
                                    grad_outputs=[torch.ones_like(o) for o in outputs],
                                    allow_unused=allow_unused_input)
            del outputs
    torch.tern.current_stream().wait_stream(stream)
    fwd = TernGraph()
    with graph(fwd, pool=pool, stream=stream):
        static_out = fn(*args)
    flat_out, out_spec = torch.utils._pytree.tree_flatten(static_out)
    for leaf in flat_out:
        if not isinstance(leaf, torch.Tensor):
            raise TypeError("make_graphed_callables: outputs must be tensors (or nested "
                            f"tuples/lists/dicts of tensors), got {type(leaf).__name__}")
    diff_out = [o for o in flat_out if o.requires_grad]
    static_grad_out = [torch.empty_like(o) if o.requires_grad else None for o in flat_out]
    bwd = TernGraph()
    static_grad_in: list = [None] * len(static_inputs)
    if diff_out and grad_inputs:
        with graph(bwd, pool=pool, stream=stream):
            grads = torch.autograd.grad(diff_out, grad_inputs,
                                        grad_outputs=[g for g in static_grad_out if g is not None],
                                        allow_unused=allow_unused_input)
        it = iter(grads)
        static_grad_in = [next(it) if need else None for need in needs_grad]
    else:
        bwd = None
    # Keep the values only: the capture's autograd graph (and the parameters'
    # AccumulateGrad nodes made on the capture stream) may go.
    flat_out = [o.detach() for o in flat_out]
    del static_out, diff_out
    return static_inputs, fwd, flat_out, out_spec, static_grad_out, bwd, static_grad_in


def make_graphed_callables(callables: Any, sample_args: Any, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: Any = None) -> Any:
    """Graphed versions of callables (functions or ``nn.Module``\ s), as
    ``torch.cuda.make_graphed_callables``: each one's forward and backward are
    captured into tern graphs (sharing one pool) from ``sample_args``, and the
    returned callable copies its tensor arguments into the static inputs,
    replays the forward graph, and on backward replays the backward graph.
    Arguments must have the sample's shapes, dtypes and ``requires_grad``;
    outputs are tensors (or nested tuples/lists/dicts of them); a module
    keeps its eager forward when it is called in another training mode or
    with grad disabled than at capture."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if pool is None:
        pool = graph_pool_handle()
    results = []
    for fn, args in zip(callables, sample_args):
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError("make_graphed_callables: sample_args must be tensors")
        is_module = isinstance(fn, torch.nn.Module)
        params = tuple(fn.parameters()) if is_module else ()
        if is_module and (fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks):
            raise RuntimeError("make_graphed_callables: modules with hooks are not supported")
        (static_inputs, fwd, flat_out, out_spec, static_grad_out, bwd,
         static_grad_in) = _graph_one(fn, args, params, num_warmup_iters, allow_unused_input, pool)

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                for static, given in zip(static_inputs, inputs):
                    if static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                fwd.replay()
                return tuple(o.detach() for o in flat_out)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, *grads):
                if bwd is None:
                    return tuple(None for _ in static_inputs)
                for static, given in zip(static_grad_out, grads):
                    if static is None:
                        continue
                    if given is None:
                        static.zero_()
                    elif static.data_ptr() != given.data_ptr():
                        static.copy_(given)
                bwd.replay()
                return tuple(g.detach() if g is not None else None for g in static_grad_in)

        def run(*user_args, _graphed=Graphed, _params=params, _spec=out_spec):
            out = _graphed.apply(*(tuple(user_args) + _params))
            return torch.utils._pytree.tree_unflatten(list(out), _spec)

        run._tern_graphs = (fwd, bwd)  # keeps the graphs alive with the callable
        if is_module:
            training = fn.training
            eager_forward = fn.forward

            def forward(*user_args, _run=run, _module=fn, _training=training,
                        _eager=eager_forward):
                if _module.training == _training and torch.is_grad_enabled():
                    return _run(*user_args)
                return _eager(*user_args)

            fn.forward = forward
            results.append(fn)
        else:
            results.append(run)
    return results[0] if single else tuple(results)
