"""torch.compile(model, backend="tern"): Dynamo -> AOTAutograd -> tern's compiler.

Dynamo traces the Python code into FX graphs; AOTAutograd turns each into a
forward and a backward graph (or one inference graph) of core ATen operators,
decomposed with PyTorch's core ATen table. For each such graph the backend

1. splits it with a capability-based partitioner: nodes tern's compiler
   takes (its op table, tern dtypes) form partitions, the others stay in the
   FX graph and run on the eager tern device, logged like the eager CPU
   fallback (``TORCH_TERN_FALLBACK=error`` makes them an error);
2. turns each partition into a compiler graph (the front end's converter)
   with the graph's dynamic sizes as compiler symbols;
3. compiles a partition, the first time it runs with given sizes, through
   the persistent compile cache (``TORCH_TERN_CACHE_DIR``), into one
   executable, and runs that executable as one submission.

A dynamic dimension (``dynamic=True``, ``mark_dynamic``, or Dynamo's
automatic dynamic shapes after a recompile) stays one Dynamo trace and one
backend compile: the partition's executables are specialisations of the one
symbolic compiler graph, one per distinct size, made by binding the symbols
(milliseconds, no tracing; docs/torch.md, "torch.compile").

``torch_tern.compiler.stats()`` reports what happened; docs/torch.md.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import operator
import os
import re
import threading
import time
import types
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx

from ._frontend import _DTYPES, UnsupportedGraph, _compile_cache_directory, _Converter

__all__ = ["backend", "clear_cache", "reset_stats", "stats"]

_log = logging.getLogger("torch_tern.compiler")

# Operators that only rearrange or name values: a partition of nothing else is
# left to the eager graph (a view there costs nothing; compiled it is a copy).
_NON_COMPUTE = {
    "aten.view.default", "aten._unsafe_view.default", "aten.permute.default",
    "aten.expand.default", "aten.squeeze.dims", "aten.unsqueeze.default",
    "aten.select.int", "aten.slice.Tensor", "aten.split_with_sizes.default",
    "aten.clone.default", "_operator.getitem",
}

# Nodes outside partitions that are not a fallback: size arithmetic and the
# bookkeeping Dynamo and AOTAutograd leave in graphs.
_SIZE_OPS = {
    "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
    "aten.sym_storage_offset.default", "_operator.getitem",
}


def _name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', target)}"


class _Stats:
    """Counters of this process's torch.compile(backend="tern") work."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.graphs_by_kind: collections.Counter = collections.Counter()
        self.partitions = 0
        self.compiled_nodes = 0
        self.fallback_nodes: collections.Counter = collections.Counter()
        self.fallback_reasons: dict[str, str] = {}
        # Graphs AOTAutograd handed over (forward, backward, inference), by kind.
        self.backend_compiles = 0
        self.executables = 0  # executables made (one per partition and size)
        self.specializations = 0  # of those, for a size seen after the first
        self.cache_hits = 0
        self.cache_misses = 0
        self.backend_seconds = 0.0  # in the backend: partitioning, conversion, compiles
        self.trial_seconds = 0.0  # of which: trial compiles of proposed partitions
        self.compile_seconds = 0.0  # the tern compiler (and cache lookups), at run time too
        self.recompile_ids: set = set()  # Dynamo compile ids of recompiled frames
        self.recompile_reasons: list = []

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "graphs_by_kind": dict(self.graphs_by_kind),
                "partitions": self.partitions,
                "compiled_nodes": self.compiled_nodes,
                "fallback_nodes": dict(self.fallback_nodes),
                "fallback_reasons": dict(self.fallback_reasons),
                "backend_compiles": self.backend_compiles,
                "executables": self.executables,
                "specializations": self.specializations,
                "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
                "backend_seconds": self.backend_seconds,
                "trial_compile_seconds": self.trial_seconds,
                "compile_seconds": self.compile_seconds,
                "recompiles": {"count": len(self.recompile_reasons),
                               "reasons": list(self.recompile_reasons)},
            }


_STATS = _Stats()


def _note_compile_id() -> None:
    """Records a recompile when Dynamo hands over a graph of a frame it
    compiled before (its compile id's frame_compile_id > 0; a frame's
    several graphs, split by graph breaks, share one id), with the guard
    failure that caused it (Dynamo's newest message for the frame's code)."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    if compile_id is None or not getattr(compile_id, "frame_compile_id", 0):
        return
    key = (compile_id.frame_id, compile_id.frame_compile_id)
    with _STATS.lock:
        if key in _STATS.recompile_ids:
            return
        _STATS.recompile_ids.add(key)
    reason = "(Dynamo gave no reason)"
    try:
        from torch._dynamo.utils import guard_failures

        newest = [failures[-1] for failures in list(guard_failures.values()) if failures]
        if newest:
            reason = str(newest[-1])
    except ImportError:  # pragma: no cover - a torch without the table
        pass
    with _STATS.lock:
        _STATS.recompile_reasons.append(reason)





def stats() -> dict:
    """What torch.compile(backend="tern") did in this process since the last
    reset_stats(): backend compiles (graphs handed over, also by kind),
    partitions compiled, nodes compiled, fallback nodes by operator (with the
    first reason for each), executables made and how many were size
    specialisations, compile cache hits and misses, seconds in the backend
    (partitioning, conversion and the trial compiles that find what the
    compiler refuses) and in the compiler, and the recompiles: frames Dynamo
    compiled again for this backend, each with the guard failure that caused
    it."""
    return _STATS.snapshot()


def reset_stats() -> None:
    """Zeroes stats(), the recompiles included."""
    with _STATS.lock:
        _STATS.reset()


def clear_cache() -> dict:
    """Removes every executable from the persistent compile cache
    (TORCH_TERN_CACHE_DIR, else the compiler's default folder); executables
    already loaded keep running. Returns what was removed."""
    from torch_tern import _C

    return dict(_C._compiler_cache_clear(_compile_cache_directory()))


# --- what the compiler takes ----------------------------------------------------


def _known_ops() -> frozenset:
    from torch_tern import _C

    global _KNOWN
    if _KNOWN is None:
        _KNOWN = frozenset(_C._compiler_known_ops())
    return _KNOWN


_KNOWN: frozenset | None = None


def _values(node: torch.fx.Node) -> list:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (list, tuple)) else [val]


def _is_factory(node: torch.fx.Node) -> bool:
    """An ATen tensor factory (full, arange, scalar_tensor) of tern dtypes
    whose arguments are numbers or sizes, no tensors."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    if any(isinstance(v, torch.Tensor) for a in node.all_input_nodes for v in _values(a)):
        return False
    vals = _values(node)
    return bool(vals) and all(isinstance(v, torch.Tensor) and v.dtype in _DTYPES for v in vals)


# A factory folds into a constant of the executable up to this many elements;
# a larger one (the zeros an embedding's gradient is summed into: vocabulary x
# width) is made eagerly each call and passed in, not stored in every
# executable and cache entry.
_MAX_FOLDED_FACTORY = 1 << 16
_LARGE_FACTORY = "a large tensor factory: made on the device each call, not stored as a constant"


def _factory_elements(node: torch.fx.Node) -> int:
    total = 0
    for v in _values(node):
        count = 1
        for d in v.shape:
            count *= int(d.node.hint) if isinstance(d, torch.SymInt) and d.node.has_hint() else (
                int(d) if not isinstance(d, torch.SymInt) else 1 << 30)
        total += count
    return total


def _has_symbolic_factory(module: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and _is_factory(n) and any(
        isinstance(d, torch.SymInt) for v in _values(n) for d in v.shape)
        for n in module.graph.nodes)


def _is_size_arithmetic(node: torch.fx.Node) -> bool:
    """The node computes a size or a Python number (s0 * 4, sym_size), not a tensor."""
    return all(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))
               for v in _values(node))


# The reason for a node whose result lives on another device (a CPU scalar
# tensor in the graph): not tern's to compile, and not a fallback either.
_OFF_DEVICE = "its result is not on a tern device"


def _aliases() -> dict:
    """Operators the decompositions leave in graphs that are another operator
    of the compiler's table under another name (same arguments)."""
    aten, prims = torch.ops.aten, torch.ops.prims
    return {
        aten.true_divide.Tensor: aten.div.Tensor,
        aten.lift_fresh_copy.default: aten.clone.default,
        # convert_element_type(x, dtype): _to_copy(x, dtype=dtype)
        prims.convert_element_type.default: aten._to_copy.default,
    }


def _canonical_target(node: torch.fx.Node):
    return _aliases().get(node.target, node.target)


_COPY_INTO_INPUT = torch.ops.aten.copy_.default
# The reason for a copy_ into an input that no partition takes (a CPU step
# counter's, or an update whose value is computed eagerly): the copy
# AOTAutograd would otherwise make after the graph, not a fallback.
_INPUT_UPDATE = "an input's update, copied eagerly"


def _is_input_mutation(node: torch.fx.Node) -> bool:
    """`copy_(input, value)` that AOTAutograd leaves at the end of an
    inference graph (keep_inference_input_mutations): an input updated in
    place, such as an optimizer's parameters and states. In a partition it
    is a mutation of the compiler graph, whose output the partition binds to
    the input's own memory."""
    if node.op != "call_function" or node.target is not _COPY_INTO_INPUT or node.users:
        return False
    target, value = node.args[0], node.args[1]
    if not (isinstance(target, torch.fx.Node) and target.op == "placeholder"
            and isinstance(value, torch.fx.Node)):
        return False
    dst, src = target.meta.get("val"), value.meta.get("val")
    return (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor)
            and dst.device.type == "tern" and src.device.type == "tern"
            and dst.dtype == src.dtype and dst.dtype in _DTYPES
            and list(dst.shape) == list(src.shape) and dst.is_contiguous()
            and not any(isinstance(d, torch.SymInt) for d in dst.shape))


def _unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why tern's compiler cannot take `node` (None: it can)."""
    if node.target is _COPY_INTO_INPUT:
        return None if _is_input_mutation(node) else _INPUT_UPDATE
    name = _name(_canonical_target(node))
    if node.target is operator.getitem:
        source = node.args[0]
        return _unsupported_reason(source) if isinstance(source, torch.fx.Node) else "getitem"
    if name not in _known_ops():
        tensors = [v for v in _values(node) if isinstance(v, torch.Tensor)]
        if tensors and all(v.device.type != "tern" for v in tensors):
            return _OFF_DEVICE  # CPU work in the graph (an optimizer's step counters)
        if _is_factory(node):
            if _factory_elements(node) > _MAX_FOLDED_FACTORY:
                return _LARGE_FACTORY
            return None  # the front end folds it into a constant (per size when dynamic)
        return "the compiler has no lowering for it"
    for arg in node.all_input_nodes:
        for v in _values(arg):
            if isinstance(v, torch.Tensor) and v.dtype not in _DTYPES:
                return f"an input is {v.dtype}, which tern has no type for"
    for v in _values(node):
        if isinstance(v, torch.Tensor):
            if v.device.type != "tern":
                return _OFF_DEVICE
            if v.dtype not in _DTYPES:
                return f"its result is {v.dtype}, which tern has no type for"
            if v.layout != torch.strided:
                return f"its result's layout is {v.layout}"
        elif v is None or not isinstance(v, (torch.SymInt, int, float, bool)):
            if v is None and node.meta.get("val", 0) is None:
                return "it has no traced value"
    return None


class _TernSupport:
    """The partitioner's question: can tern's compiler take this node?"""

    def __init__(self, refused: dict):
        self.reasons: dict[torch.fx.Node, str] = {}
        self.refused = refused  # node -> why the compiler refused it before

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        reason = self.refused.get(node) or _unsupported_reason(node)
        if reason is not None:
            self.reasons[node] = reason
        return reason is None


# --- one partition ------------------------------------------------------------------


def _symbolic_sizes(module: torch.fx.GraphModule):
    """Every symbolic size among the graph's values: SymInt values and the
    SymInt dims of tensor values."""
    for node in module.graph.nodes:
        for v in _values(node):
            sizes = [v] if isinstance(v, torch.SymInt) else (
                list(v.shape) if isinstance(v, torch.Tensor) else [])
            yield from (d for d in sizes if isinstance(d, torch.SymInt))


def _shape_env(module: torch.fx.GraphModule):
    """The ShapeEnv of the graph's symbolic sizes (None: all sizes static)."""
    return next((d.node.shape_env for d in _symbolic_sizes(module)), None)


def _dense_order(val) -> tuple | None:
    """The order of a tensor input's dims in memory, outermost first, when the
    traced tensor is a dense permutation of a contiguous one but not
    contiguous itself (a transposed activation the forward saved for the
    backward); None otherwise (contiguous, not dense, or symbolic strides).
    The partition takes such an input as it lies in memory and permutes it
    in the graph, where the compiler folds the permute into its users'
    operand strides, instead of copying it into a contiguous tensor first."""
    if not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    shape, strides = list(val.shape), list(val.stride())
    if any(isinstance(x, torch.SymInt) for x in shape + strides):
        return None

    def dense_in(dims) -> bool:
        """Contiguous when its dims are taken in this order (outermost
        first); a dim of size 1 may have any stride."""
        expected = 1
        for d in reversed(dims):
            if shape[d] != 1 and strides[d] != expected:
                return False
            expected *= shape[d]
        return True

    order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
    if not dense_in(order) or dense_in(range(len(shape))):
        return None
    return tuple(order)


def _input_orders(module: torch.fx.GraphModule) -> dict:
    """{position among the tensor inputs: _dense_order} for the partition's
    inputs that are dense permutations."""
    orders, position = {}, 0
    for node in module.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        order = _dense_order(val)
        if order is not None:
            orders[position] = order
        position += 1
    return orders


class _PartitionConverter(_Converter):
    """The front end's converter for a partition's FX graph: every tensor
    placeholder is an input, every SymInt placeholder a size the executable is
    specialised for, every output a result.

    `values` (sympy symbol -> int) converts the graph for those sizes: every
    dim is then a number. Without it, symbolic dims become compiler symbols,
    which works while each dim is a*s+b of one size."""

    def __init__(self, module: torch.fx.GraphModule, values: dict | None = None):
        env = _shape_env(module)
        ranges = env.var_to_range if env is not None else {}
        super().__init__(types.SimpleNamespace(graph=module.graph, range_constraints=ranges))
        self.pending_mutations: list = []  # (input index, copy_ node, value node)
        if values is not None:
            import sympy

            values = {symbol: sympy.Integer(v) for symbol, v in values.items()}
        self.values = values

    def _dim(self, dim, where: str):
        if self.values is not None and isinstance(dim, torch.SymInt):
            value = dim.node.expr.xreplace(self.values)
            if not getattr(value, "is_number", False):
                raise UnsupportedGraph(f"{where}: the size {dim.node.expr} depends on sizes "
                                       "the partition's inputs do not give")
            return int(value)
        return super()._dim(dim, where)

    def _placeholders(self) -> None:
        for node in self.program.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta.get("val")
            where = f"input '{node.name}'"
            if isinstance(val, torch.SymInt) and self.values is not None:
                self.known[node.name] = self._dim(val, where)
                continue
            if isinstance(val, (torch.SymInt, int, float, bool)):
                self.known[node.name] = val
                continue
            if not isinstance(val, torch.Tensor):
                raise UnsupportedGraph(f"{where} is a {type(val).__name__}, not a tensor")
            index = len(self.spec["inputs"])
            order = _dense_order(val)
            if order is None:
                self.refs[node.name] = ("in", index)
                self.spec["inputs"].append(
                    (node.name, self._dtype(val.dtype, where), self._shape(val.shape, where)))
                continue
            # Taken as it lies in memory, then permuted back to its traced
            # dims (see _dense_order).
            self.spec["inputs"].append((node.name, self._dtype(val.dtype, where),
                                        self._shape([val.shape[d] for d in order], where)))
            back = sorted(range(len(order)), key=lambda k: order[k])
            self.refs[node.name] = ("node", len(self.spec["nodes"]), 0)
            self.spec["nodes"].append(("aten.permute.default", [("in", index)],
                                       {"dims": back}, f"{node.name}_as_traced", ""))

    def _sizes_known(self, node: torch.fx.Node) -> bool:
        return self.values is not None or super()._sizes_known(node)

    def _fold(self, node: torch.fx.Node) -> bool:
        # Symbolic sizes given as inputs are known to the converter (for
        # _attr), not values to compute with.
        if any(isinstance(self.known.get(arg.name), torch.SymInt)
               for arg in node.all_input_nodes):
            return False
        return super()._fold(node)

    def _call(self, node: torch.fx.Node) -> None:
        if node.target is _COPY_INTO_INPUT:
            self._mutation(node)
            return
        canonical = _canonical_target(node)
        if canonical is not node.target:
            node.target = canonical  # the same computation, under the compiler's name
        super()._call(node)

    def _mutation(self, node: torch.fx.Node) -> None:
        """copy_(input, value): value becomes an output after the partition's
        own, paired with the input in the graph's mutations."""
        target, value = node.args[0], node.args[1]
        ref = self.refs.get(target.name)
        if not (isinstance(ref, tuple) and ref[0] == "in"):
            raise UnsupportedGraph(f"node '{node.name}': copy_ into '{target.name}', which is "
                                   "not an input taken as it lies")
        self.pending_mutations.append((ref[1], node.name, value.name))

    def _attr(self, value, where: str):
        # A size computed outside the partition is a placeholder whose traced
        # value is a SymInt.
        value = torch.fx.node.map_arg(value, lambda n: n.meta.get("val"))
        return super()._attr(value, where)

    def _outputs(self, node: torch.fx.Node) -> None:
        results = node.args[0]
        results = results if isinstance(results, (list, tuple)) else (results,)
        for k, value in enumerate(results):
            if not isinstance(value, torch.fx.Node):
                raise UnsupportedGraph(f"output {k} is {value!r}, not a tensor")
            self.spec["outputs"].append((f"output_{k}", self._ref(value.name)))
        for input_index, name, value in self.pending_mutations:
            self.spec["mutations"].append((input_index, len(self.spec["outputs"])))
            self.spec["outputs"].append((name, self._ref(value)))


def _symbols_used(module: torch.fx.GraphModule) -> set:
    """The symbolic sizes any value of the graph depends on."""
    used: set = set()
    for d in _symbolic_sizes(module):
        used.update(d.node.expr.free_symbols)
    return used


def _linear(expr):
    """(symbol, a, b) when `expr` is a*symbol + b with integers a != 0, b; else None."""
    free = list(getattr(expr, "free_symbols", ()))
    if len(free) != 1:
        return None
    symbol = free[0]
    poly = expr.as_poly(symbol) if hasattr(expr, "as_poly") else None
    if poly is None or poly.degree() != 1:
        return None
    a, b = poly.all_coeffs()
    if a != int(a) or b != int(b):
        return None
    return symbol, int(a), int(b)


def _size_finders(module: torch.fx.GraphModule) -> dict:
    """How to read each symbolic size from a call's arguments: symbol ->
    (argument position, dim or None, a, b), where the argument's dim (or the
    argument itself, a SymInt, when dim is None) is a*symbol + b. A plain
    occurrence (a = 1, b = 0) is preferred."""
    finders: dict = {}
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for position, node in enumerate(placeholders):
        val = node.meta.get("val")
        found = []
        if isinstance(val, torch.SymInt):
            found.append((val.node.expr, None))
        elif isinstance(val, torch.Tensor):
            found.extend((d.node.expr, k) for k, d in enumerate(val.shape)
                         if isinstance(d, torch.SymInt))
        for expr, dim in found:
            linear = _linear(expr)
            if linear is None:
                continue
            symbol, a, b = linear
            if symbol not in finders or (a, b) == (1, 0) and finders[symbol][2:] != (1, 0):
                finders[symbol] = (position, dim, a, b)
    return finders


def _read_sizes(finders: dict, args) -> dict:
    sizes = {}
    for symbol, (position, dim, a, b) in finders.items():
        value = args[position] if dim is None else args[position].shape[dim]
        sizes[symbol] = (int(value) - b) // a
    return sizes


# The symbolic sizes of the graph call in progress (symbol -> int), set by the
# graph's wrapper for its partitions: a partition's own inputs may not show
# every size it depends on (a labels tensor of s0 - 1 elements does, a
# reshape to s0 * s1 rows does not).
_CALL_SIZES: contextvars.ContextVar = contextvars.ContextVar("tern_call_sizes", default=None)


def _count_executable(seconds: float, cache: str, specialization: bool) -> None:
    with _STATS.lock:
        _STATS.executables += 1
        _STATS.specializations += int(specialization)
        _STATS.compile_seconds += seconds
        if cache in ("hit", "waited"):
            _STATS.cache_hits += 1
        else:
            _STATS.cache_misses += 1


def _move_cpu_inputs(tensors: list, device: torch.device) -> None:
    """CPU tensors among a partition's inputs, moved to `device` in place in
    the list. A CPU scalar tensor may feed tern operators (PyTorch allows
    it): the executable reads it from device memory. An optimizer's bias
    corrections are two such scalars per parameter, computed on the CPU from
    its step counters: scalars of one dtype go as one tensor (one copy to
    the device), and each input is a view of it."""
    on_cpu = [i for i, t in enumerate(tensors) if t.device.type != "tern"]
    by_dtype: dict = collections.defaultdict(list)
    for i in on_cpu:
        if tensors[i].dim() == 0:
            by_dtype[tensors[i].dtype].append(i)
    for positions in by_dtype.values():
        if len(positions) < 2:
            continue
        moved = torch.stack([tensors[i] for i in positions]).to(device)
        for row, i in zip(moved.unbind(), positions):
            tensors[i] = row
    for i in on_cpu:
        if tensors[i].device.type != "tern":
            tensors[i] = tensors[i].to(device)


class _CompiledPartition(torch.nn.Module):
    """A partition of a graph, run as tern executables: one per set of values
    of its symbolic sizes, compiled the first time those sizes come.

    With static sizes, or dynamic sizes the compiler can represent (each dim
    a*s+b of one size), the partition is converted once and each size binds
    the compiler graph's symbols; otherwise (a dim like s0*s1) each size
    converts the partition again with its sizes filled in."""

    def __init__(self, module: torch.fx.GraphModule, name: str, kind: str, trial: bool = False):
        super().__init__()
        self.module = module
        self.trial = trial  # a trial compile: not counted in stats()
        self.name = name
        self.kind = kind
        self.symbols = _symbols_used(module)
        self.finders = _size_finders(module)  # used when no graph wrapper gives the sizes
        self.size_positions = {
            i for i, n in enumerate(n for n in module.graph.nodes if n.op == "placeholder")
            if isinstance(n.meta.get("val"), (torch.SymInt, int, float, bool))}
        try:
            if _has_symbolic_factory(module):
                # arange(s0): folded per size, so converted per size.
                raise UnsupportedGraph("a tensor factory of symbolic size")
            self.spec = _PartitionConverter(module).convert()
        except UnsupportedGraph:
            if not self.symbols:
                raise
            # Sizes the compiler cannot keep symbolic: convert per size. Try
            # the traced sizes now, so that a refusal comes at compile time.
            self.spec = None
        output = next(n for n in module.graph.nodes if n.op == "output")
        self.returns_tuple = isinstance(output.args[0], (list, tuple))
        # Inputs updated in place (copy_ at the end of an inference graph):
        # (input position, output index) of the compiler graph's mutations,
        # whose outputs follow the partition's own. Taken from the converted
        # graph (_executable, which the end of __init__ calls).
        self.mutations: list = []
        self.own_outputs = len(output.args[0]) if self.returns_tuple else 1
        self.input_orders = _input_orders(module)
        self.executables: dict[tuple, Any] = {}
        self.lock = threading.Lock()
        devices = [v.device for n in module.graph.nodes for v in _values(n)
                   if isinstance(v, torch.Tensor) and v.device.type == "tern"]
        self.device = devices[0] if devices else torch.device("tern", torch.tern.current_device())
        # Compiled now for the traced sizes (the first call's, usually), so
        # that the compiler's refusals come while the graph can still be
        # partitioned around them.
        self._executable(self._traced_sizes(module))

    def adopt(self, module: torch.fx.GraphModule, name: str) -> "_CompiledPartition":
        """The trial becomes the graph's partition `name`, whose submodule
        `module` holds the same nodes; its executable is counted now."""
        self.module, self.name, self.trial = module, name, False
        _count_executable(*self.first_compile, False)
        return self

    def _traced_sizes(self, module: torch.fx.GraphModule) -> dict:
        if not self.symbols:
            return {}
        env = _shape_env(module)
        hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
        return {symbol: int(hints[symbol]) for symbol in self.symbols}

    def _sizes(self, args) -> dict:
        """This call's values of the sizes the partition depends on."""
        given = _CALL_SIZES.get()
        if given is not None and self.symbols.issubset(given):
            return {symbol: given[symbol] for symbol in self.symbols}
        sizes = _read_sizes(self.finders, args)
        missing = sorted(str(symbol) for symbol in self.symbols - sizes.keys())
        if missing:
            raise RuntimeError(f"tern partition {self.name}: the sizes {missing} of this call "
                               "are not known (neither the graph's arguments nor the "
                               "partition's give them)")
        return {symbol: sizes[symbol] for symbol in self.symbols}

    def _executable(self, sizes: dict):
        from torch_tern import _C

        key = tuple(sorted((str(s), v) for s, v in sizes.items()))
        model = self.executables.get(key)
        if model is not None:
            return model
        with self.lock:
            model = self.executables.get(key)
            if model is not None:
                return model
            started = time.perf_counter()
            if self.spec is not None:
                spec, bindings = self.spec, {str(s): v for s, v in sizes.items()}
                declared = {entry[0] for entry in spec["symbols"]}
                bindings = {k: v for k, v in bindings.items() if k in declared}
            else:
                spec, bindings = _PartitionConverter(self.module, sizes).convert(), {}
            self.mutations = [tuple(m) for m in spec["mutations"]]  # the same for every size
            result = _C._compiler_compile(spec, "", "", True, bindings=bindings,
                                          cache_dir=_compile_cache_directory())
            model = _C._CompiledModel.from_bytes(result["executable"])
            elapsed = time.perf_counter() - started
            if self.trial:
                # Counted when the graph adopts the partition (adopt()).
                self.first_compile = (elapsed, result["cache"])
                with _STATS.lock:
                    _STATS.trial_seconds += elapsed
            else:
                _count_executable(elapsed, result["cache"], bool(self.executables))
            _log.debug("%s graph, partition %s: compiled for %s in %.1f ms (cache %s)",
                       self.kind, self.name, key or "its static sizes", elapsed * 1e3,
                       result["cache"])
            self.executables[key] = model
            return model

    def forward(self, *args):
        model = self._executable(self._sizes(args) if self.symbols else {})
        tensors = [a for i, a in enumerate(args) if i not in self.size_positions]
        _move_cpu_inputs(tensors, self.device)
        for position, order in self.input_orders.items():
            # In memory order: contiguous when laid out as traced (if not,
            # the model copies it, as any non-contiguous input).
            tensors[position] = tensors[position].permute(order)
        into = None
        if self.mutations:
            # Each mutated input's output is bound to the input's memory: the
            # execution updates it in place (the compiler ordered its reads
            # before that output's writes). A non-contiguous input gets a new
            # output, copied into it afterwards.
            into = [None] * len(model.output_names)
            for position, output in self.mutations:
                if tensors[position].is_contiguous():
                    into[output] = tensors[position]
        outputs = model.run(tensors, into) if into is not None else model.run(tensors)
        for position, output in self.mutations:
            if outputs[output] is not tensors[position]:
                tensors[position].copy_(outputs[output])
        outputs = outputs[:self.own_outputs]
        return tuple(outputs) if self.returns_tuple else outputs[0]


# --- a graph ----------------------------------------------------------------------------


def _fallback_mode() -> str:
    return os.environ.get("TORCH_TERN_FALLBACK", "").strip().lower()


_WARNED: set = set()


def _report_fallbacks(kind: str, nodes: list, reasons: dict) -> None:
    """Logs the nodes left to eager tern; an error under TORCH_TERN_FALLBACK=error."""
    if not nodes:
        return
    by_op = collections.Counter(_name(n.target) for n in nodes)
    first_reason = {}
    for n in nodes:
        first_reason.setdefault(_name(n.target), reasons.get(n, "not in a compiled partition"))
    with _STATS.lock:
        _STATS.fallback_nodes.update(by_op)
        for op, reason in first_reason.items():
            _STATS.fallback_reasons.setdefault(op, reason)
    listing = ", ".join(f"{op} x{count} ({first_reason[op]})" for op, count in by_op.items())
    mode = _fallback_mode()
    if mode == "error":
        raise RuntimeError(
            f"torch.compile(backend=\"tern\"): the {kind} graph has operators that tern's "
            f"compiler cannot take and TORCH_TERN_FALLBACK=error forbids running them "
            f"eagerly: {listing}. Unset TORCH_TERN_FALLBACK to run them on the eager tern "
            "device, or change the model to avoid them")
    if mode == "warn":
        fresh = [op for op in by_op if op not in _WARNED]
        _WARNED.update(fresh)
        if fresh:
            warnings.warn(f"torch.compile(backend=\"tern\"): these operators run on the eager "
                          f"tern device, outside compiled partitions: {listing}", stacklevel=2)
    _log.info("%s graph: %d node(s) run eagerly outside compiled partitions: %s", kind,
              len(nodes), listing)


def _is_compute(node: torch.fx.Node) -> bool:
    """Worth an executable: an operator on tensors that computes (not a view,
    not a factory without inputs, which the front end folds into a constant)."""
    return (node.op == "call_function" and _name(node.target) not in _NON_COMPUTE
            and not _is_factory(node))


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence, kind: str) -> Callable:
    """The callable AOTAutograd runs for graph `gm` (boxed: it takes one list
    of arguments, which it may clear)."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # AOTAutograd calls its compilers inside its fake mode; the front end
    # folds constants with real tensors.
    with unset_fake_temporarily():
        return make_boxed_func(_partitioned(gm, kind))


def _refused_node(message: str, nodes) -> torch.fx.Node | None:
    """The node of `nodes` that a front end or compiler message names."""
    by_name = {n.name: n for n in nodes}
    for name in re.findall(r"node '([^']+)'", message):
        if name in by_name:
            return by_name[name]
    return None


# Views that cost nothing in the graph and a copy in an executable (whose
# outputs are new contiguous tensors), and that see all of their base: a
# slice or select left to the graph would keep its whole base alive (a
# tensor saved for the backward then holds more memory than the partitioner
# counted), so those stay copies.
_VIEW_OPS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.permute.default",
    "aten.expand.default", "aten.squeeze.dims", "aten.unsqueeze.default",
}
_VIEW_TAIL = "a view of a result that only leaves the graph: made there, without a copy"


def _view_tails(gm: torch.fx.GraphModule) -> set:
    """The views whose results only leave the graph (its outputs, directly or
    through more such views): left out of the partitions, so that a partition
    returns the value itself and the graph makes the view, as eager PyTorch
    would. In an executable such a view was a copy: the transposed
    activations a training forward saves for its backward cost a
    transposing copy each."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    tails: set = set()
    for node in reversed(gm.graph.nodes):
        if (node.op == "call_function" and _name(node.target) in _VIEW_OPS and node.users
                and all(user is output or user in tails for user in node.users)):
            tails.add(node)
    return tails


def _misplaced_updates(partitions) -> list:
    """The input updates (copy_ into a placeholder) in `partitions` whose
    input some node outside that partition reads."""
    misplaced = []
    for partition in partitions:
        for node in partition.nodes:
            if node.target is _COPY_INTO_INPUT and any(
                    user is not node and user not in partition.nodes
                    for user in node.args[0].users):
                misplaced.append(node)
    return misplaced


# A graph is partitioned again without the node the compiler refused, at most
# this many times; then the rest of the refused partition runs eagerly.
_MAX_REPARTITIONS = 16


def _partitioned(gm: torch.fx.GraphModule, kind: str) -> Callable:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule, topo_sort

    started = time.perf_counter()
    with _STATS.lock:
        _STATS.backend_compiles += 1
        _STATS.graphs_by_kind[kind] += 1
    # Nodes the front end or compiler refused, and views left to the graph.
    refused: dict[torch.fx.Node, str] = {n: _VIEW_TAIL for n in _view_tails(gm)}
    for attempt in range(_MAX_REPARTITIONS + 1):
        while True:
            support = _TernSupport(refused)
            partitioner = CapabilityBasedPartitioner(gm, support,
                                                     allows_single_node_partition=True)
            partitions = [p for p in partitioner.propose_partitions()
                          if any(_is_compute(n) for n in p.nodes)]
            # An input's update runs in place inside its partition's
            # execution: only where that partition is the input's only reader
            # (any other would read it after the update, or race with it).
            misplaced = _misplaced_updates(partitions)
            if not misplaced:
                break
            for n in misplaced:
                refused[n] = _INPUT_UPDATE
        # Each partition is converted and compiled (for its traced sizes)
        # before the graph is changed: a refusal names a node, which is then
        # left out and the graph partitioned again.
        retry = False
        trials: dict[frozenset, _CompiledPartition] = {}
        for partition in partitions:
            nodes = topo_sort(list(partition.nodes))
            trial, _, _ = fuse_as_graphmodule(gm, nodes, "trial")
            try:
                trials[frozenset(n.name for n in nodes)] = _CompiledPartition(
                    trial, "trial", kind, trial=True)
            except (UnsupportedGraph, ValueError) as err:
                node = _refused_node(str(err), nodes)
                last = attempt == _MAX_REPARTITIONS
                for n in ([node] if node is not None and not last else nodes):
                    refused[n] = f"the compiler refused it: {err}"
                retry = True
                break
        if not retry:
            break
    in_partitions = {n for p in partitions for n in p.nodes}
    fallbacks = [n for n in gm.graph.nodes
                 if n.op == "call_function" and n not in in_partitions
                 and _name(n.target) not in _SIZE_OPS and not _is_size_arithmetic(n)
                 and n in support.reasons
                 and support.reasons[n] not in (_OFF_DEVICE, _LARGE_FACTORY, _INPUT_UPDATE)
                 and _is_compute(n)]
    _report_fallbacks(kind, fallbacks, support.reasons)
    if not partitions:
        return gm.forward
    fused = partitioner.fuse_partitions(partitions)
    compiled_nodes = 0
    for index in range(len(partitions)):
        name = f"fused_{index}"  # fuse_partitions names partition i so
        submodule = getattr(fused, name)
        names = frozenset(n.name for n in submodule.graph.nodes
                          if n.op not in ("placeholder", "output"))
        setattr(fused, name, trials[names].adopt(submodule, name))
        compiled_nodes += sum(1 for n in submodule.graph.nodes if n.op == "call_function")
    fused.recompile()
    outer_finders = _size_finders(gm)
    if outer_finders:
        inner = fused.forward

        def run(*args):
            token = _CALL_SIZES.set(_read_sizes(outer_finders, args))
            try:
                return inner(*args)
            finally:
                _CALL_SIZES.reset(token)

        call = run
    else:
        call = fused.forward
    with _STATS.lock:
        _STATS.partitions += len(partitions)
        _STATS.compiled_nodes += compiled_nodes
        _STATS.backend_seconds += time.perf_counter() - started
    return call


def _decompositions() -> dict:
    """PyTorch's core ATen decompositions, less the operators tern's compiler
    lowers itself: a layer norm's backward stays one node (one instruction)
    instead of a dozen elementwise operators and reductions; and the foreach
    operators of optimizers, as the per-tensor operators they stand for."""
    from torch._decomp import core_aten_decompositions

    from ._foreach import foreach_decompositions

    known = _known_ops()
    table = {op: fn for op, fn in core_aten_decompositions().items() if str(op) not in known}
    # Optimizers' foreach operators, per tensor (see _foreach.py).
    table.update(foreach_decompositions(known))
    return table


def _make_backend():
    from torch._dynamo.backends.common import aot_autograd

    def forward(gm, example_inputs):
        return _compile_graph(gm, example_inputs, "forward")

    def backward(gm, example_inputs):
        return _compile_graph(gm, example_inputs, "backward")

    def inference(gm, example_inputs):
        return _compile_graph(gm, example_inputs, "inference")

    from torch._functorch.partitioners import min_cut_rematerialization_partition

    # keep_inference_input_mutations: an inference graph (an optimizer's
    # step) ends with copy_(input, value) for each input it updates, which a
    # partition takes as a mutation and runs in place, instead of returning
    # the values for AOTAutograd to copy back one tensor at a time.
    return aot_autograd(fw_compiler=forward, bw_compiler=backward,
                        inference_compiler=inference, decompositions=_decompositions(),
                        partition_fn=min_cut_rematerialization_partition,
                        keep_inference_input_mutations=True)


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence):
    """The Dynamo backend registered as "tern" (torch.compile(model, backend="tern"))."""
    global _BACKEND
    _note_compile_id()
    if _BACKEND is None:
        _BACKEND = _make_backend()
    return _BACKEND(gm, example_inputs)


_BACKEND = None


# Dynamo imports this module when a model is compiled with backend="tern" (the
# "torch_dynamo_backends" entry point), before it traces: tern's device
# interface must be there by then.
from .. import _device_interface  # noqa: E402
from ._optimizers import keep_step_counters_on_device  # noqa: E402

_device_interface.register()
keep_step_counters_on_device()
