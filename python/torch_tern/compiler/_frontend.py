"""torch.export -> tern compiler graph (docs/compiler.md, "Front ends").

The graph handed to the compiler is plain Python data (a "graph spec") that
torch_tern._C turns into the compiler's C++ graph, checking every node with
the compiler's own shape and dtype inference:

- ``symbols``: ``(name, min, max)`` of each symbolic size;
- ``inputs``: ``(name, dtype, shape)``; a dim is an int or
  ``(symbol, factor, offset)`` meaning factor * symbol + offset;
- ``constants``: ``(name, dtype, shape, bytes)``: parameters, buffers and
  tensors the program captured;
- ``nodes``: ``(op, inputs, attrs, name, source)``; an input is ``("in", i)``,
  ``("const", i)``, ``("node", n, k)`` or ``None``; attrs map names to ints,
  floats, bools, lists of ints, strings, ``("shape", [dims])`` or
  ``("dtype", name)``;
- ``outputs``: ``(name, input reference)``; ``mutations``: ``(input, output)``.

Tensor arguments of an op become node inputs in the order of its schema;
every other argument an attribute, when it differs from the schema's
default; a Python number where the schema has a tensor becomes an attribute
named after that argument.
"""

from __future__ import annotations

import operator
import os
import re
from typing import Any, Sequence

import torch

_DTYPES = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "bool",
}


# Arguments that say where a result lives and in what memory layout, not what
# it holds: the compiled program places every tensor itself.
_PLACEMENT_ARGUMENTS = {"layout", "device", "pin_memory", "memory_format", "non_blocking"}


def _bytes_of(tensor: torch.Tensor) -> bytes:
    """A contiguous CPU tensor's bytes, row-major (rank 0 included)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


class UnsupportedGraph(ValueError):
    """The model uses something the compiler cannot take (the message says what)."""


def _where(node: torch.fx.Node) -> str:
    """'model.py:42 in forward': the first frame of the node's stack trace
    outside torch itself (the user's line), or ''."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', trace)
    torch_dir = os.path.dirname(torch.__file__)
    for path, line, function in frames:
        if not path.startswith(torch_dir):
            return f"{os.path.basename(path)}:{line} in {function}"
    if frames:
        path, line, function = frames[-1]
        return f"{os.path.basename(path)}:{line} in {function}"
    return ""


class _Converter:
    def __init__(self, program: torch.export.ExportedProgram):
        self.program = program
        self.symbols: list[tuple[str, int, int]] = []
        self.symbol_index: dict[str, int] = {}
        self.refs: dict[str, Any] = {}  # fx node name -> reference (or tuple of them)
        # Values known when compiling: lifted constant tensors and what the
        # constant folding computed from them (fx node name -> tensor, or a
        # tuple for several outputs). Parameters and buffers are not here:
        # folding them would store a second copy of the weights.
        self.known: dict[str, Any] = {}
        self.spec: dict[str, list] = {
            "symbols": self.symbols,
            "inputs": [],
            "constants": [],
            "nodes": [],
            "outputs": [],
            "mutations": [],
        }

    # --- dims, dtypes, types --------------------------------------------------

    def _symbol(self, name: str) -> int:
        if name not in self.symbol_index:
            low, high = 1, 2**31 - 1
            for sym, constraint in self.program.range_constraints.items():
                if str(sym) == name:
                    low = int(constraint.lower)
                    upper = constraint.upper
                    high = int(upper) if upper.is_finite else 2**31 - 1
            self.symbol_index[name] = len(self.symbols)
            self.symbols.append((name, low, high))
        return self.symbol_index[name]

    def _dim(self, dim, where: str):
        if isinstance(dim, int):
            return dim
        expr = dim.node.expr if isinstance(dim, torch.SymInt) else dim
        if getattr(expr, "is_number", False):
            return int(expr)
        free = list(expr.free_symbols)
        if len(free) == 1:
            symbol = free[0]
            poly = expr.as_poly(symbol) if hasattr(expr, "as_poly") else None
            if poly is not None and poly.degree() <= 1:
                coeffs = poly.all_coeffs()
                factor = int(coeffs[0]) if len(coeffs) == 2 else 0
                offset = int(coeffs[-1])
                if all(c == int(c) for c in coeffs):
                    return (self._symbol(str(symbol)), factor, offset)
        raise UnsupportedGraph(
            f"{where}: the dimension {expr} is not of the form a*s+b of one symbolic size, "
            "which is all the compiler represents; export with fewer dynamic dimensions")

    def _shape(self, shape, where: str) -> list:
        return [self._dim(d, where) for d in shape]

    def _dtype(self, dtype: torch.dtype, where: str) -> str:
        if dtype not in _DTYPES:
            raise UnsupportedGraph(f"{where}: dtype {dtype} has no tern equivalent")
        return _DTYPES[dtype]

    # --- placeholders ----------------------------------------------------------

    def _placeholders(self) -> None:
        signature = self.program.graph_signature
        kinds = torch.export.graph_signature.InputKind
        values = dict(self.program.state_dict)
        values.update(getattr(self.program, "constants", {}) or {})
        for spec in signature.input_specs:
            name = spec.arg.name
            if spec.kind == kinds.USER_INPUT:
                val = self._node(name).meta["val"]
                if not isinstance(val, torch.Tensor):
                    raise UnsupportedGraph(
                        f"input '{name}' is a {type(val).__name__}, not a tensor; pass "
                        "tensors only (the compiled executable takes tensors)")
                self.refs[name] = ("in", len(self.spec["inputs"]))
                self.spec["inputs"].append(
                    (name, self._dtype(val.dtype, f"input '{name}'"),
                     self._shape(val.shape, f"input '{name}'")))
            elif spec.kind in (kinds.PARAMETER, kinds.BUFFER, kinds.CONSTANT_TENSOR):
                tensor = values[spec.target].detach().to("cpu").contiguous()
                where = f"{spec.kind.name.lower()} '{spec.target}'"
                if spec.kind == kinds.CONSTANT_TENSOR:
                    self.known[name] = tensor
                self.refs[name] = ("const", len(self.spec["constants"]))
                self.spec["constants"].append(
                    (spec.target, self._dtype(tensor.dtype, where), list(tensor.shape),
                     _bytes_of(tensor)))
            else:
                raise UnsupportedGraph(
                    f"input '{name}' is of kind {spec.kind.name}, which the compiler does not "
                    "take (only tensors, parameters, buffers and constant tensors)")

    def _node(self, name: str) -> torch.fx.Node:
        for node in self.program.graph.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    # --- nodes -----------------------------------------------------------------

    def _attr(self, value, where: str):
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float, str)):
            return value
        if isinstance(value, torch.dtype):
            return ("dtype", self._dtype(value, where))
        if isinstance(value, torch.SymInt):
            dim = self._dim(value, where)
            return dim if isinstance(dim, int) else ("shape", [dim])
        if isinstance(value, (list, tuple)):
            if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return list(value)
            if all(isinstance(v, (int, torch.SymInt)) for v in value):
                return ("shape", [self._dim(v, where) for v in value])
        raise UnsupportedGraph(f"{where}: an argument of type {type(value).__name__} "
                               f"({value!r}) has no compiler attribute kind")

    def _ref(self, name: str):
        """The reference to fx node `name`'s value; a folded value becomes a
        constant the first time a compiled node (or an output) uses it."""
        if name not in self.refs and name in self.known:
            tensor = self.known[name]
            if not isinstance(tensor, torch.Tensor):
                raise UnsupportedGraph(f"value '{name}' is a {type(tensor).__name__}, not a tensor")
            tensor = tensor.detach().contiguous()
            where = f"folded value '{name}'"
            self.refs[name] = ("const", len(self.spec["constants"]))
            self.spec["constants"].append(
                (name, self._dtype(tensor.dtype, where), list(tensor.shape),
                 _bytes_of(tensor)))
        return self.refs[name]

    def _fold(self, node: torch.fx.Node) -> bool:
        """Constant folding: a node whose tensor arguments are all known at
        compile time (attention masks built from arange and full, position
        ids) is computed here, with PyTorch on the CPU, instead of compiled.
        Not when a dimension is symbolic: the example's size would be baked in."""
        used = node.all_input_nodes
        if any(arg.name not in self.known for arg in used):
            return False
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape):
                return False
        args = torch.fx.node.map_arg(node.args, lambda n: self.known[n.name])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.known[n.name])
        kwargs = {k: (torch.device("cpu") if k == "device" and v is not None else v)
                  for k, v in kwargs.items()}
        with torch.no_grad():
            self.known[node.name] = node.target(*args, **kwargs)
        return True

    def _call(self, node: torch.fx.Node) -> None:
        where = f"node '{node.name}' ({node.target}{', ' + _where(node) if _where(node) else ''})"
        if node.target is operator.getitem:
            source, index = node.args
            if source.name in self.known:
                self.known[node.name] = self.known[source.name][index]
            else:
                self.refs[node.name] = self.refs[source.name][index]
            return
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            return  # export's check of a dtype and shape that the graph's types already fix
        if self._fold(node):
            return
        if not isinstance(node.target, torch._ops.OpOverload):
            raise UnsupportedGraph(f"{where}: it calls {node.target}, not an ATen operator")
        schema = node.target._schema
        inputs: list = []
        attrs: dict = {}
        bound = list(node.args) + [None] * (len(schema.arguments) - len(node.args))
        for i, argument in enumerate(schema.arguments):
            if argument.name in node.kwargs:
                value = node.kwargs[argument.name]
                given = True
            elif i < len(node.args):
                value = bound[i]
                given = True
            else:
                value, given = None, False
            type_text = str(argument.type)
            is_tensor = type_text.startswith("Tensor") or type_text.startswith("Optional[Tensor]")
            is_tensor_list = type_text in ("List[Tensor]", "Tensor[]", "List[Optional[Tensor]]")
            if is_tensor_list:
                for item in value or []:
                    inputs.append(self._ref(item.name) if item is not None else None)
                continue
            if is_tensor:
                if isinstance(value, torch.fx.Node):
                    inputs.append(self._ref(value.name))
                elif value is None:
                    inputs.append(None)
                else:  # a Python number where the schema has a tensor
                    inputs.append(None)
                    attrs[argument.name] = self._attr(value, where)
                continue
            if not given or value is None:
                continue
            if argument.name in _PLACEMENT_ARGUMENTS:
                if argument.name == "layout" and value != torch.strided:
                    raise UnsupportedGraph(f"{where}: layout {value} is not supported "
                                           "(dense tensors only)")
                continue  # where a tensor lives and how it is laid out: not computation
            if argument.has_default_value() and value == argument.default_value:
                continue
            attrs[argument.name] = self._attr(value, f"{where}, argument '{argument.name}'")
        # Trailing absent optional tensors are left out.
        while inputs and inputs[-1] is None:
            inputs.pop()
        index = len(self.spec["nodes"])
        self.spec["nodes"].append(
            (str(node.target), inputs, attrs, node.name, _where(node)))
        outputs = node.meta.get("val")
        if isinstance(outputs, (list, tuple)):
            self.refs[node.name] = tuple(("node", index, k) for k in range(len(outputs)))
        else:
            self.refs[node.name] = ("node", index, 0)

    def _outputs(self, node: torch.fx.Node) -> None:
        signature = self.program.graph_signature
        kinds = torch.export.graph_signature.OutputKind
        results = node.args[0]
        for k, (spec, value) in enumerate(zip(signature.output_specs, results)):
            if not isinstance(value, torch.fx.Node):
                raise UnsupportedGraph(f"output {k} is {value!r}, not a tensor")
            name = spec.arg.name
            if spec.kind == kinds.BUFFER_MUTATION:
                raise UnsupportedGraph(
                    f"the model writes its buffer '{spec.target}' (output '{name}'); the "
                    "compiler takes buffers as constants, so export the model in eval mode or "
                    "pass the buffer as an input")
            if spec.kind != kinds.USER_OUTPUT:
                raise UnsupportedGraph(f"output '{name}' is of kind {spec.kind.name}, which the "
                                       "compiler does not produce")
            self.spec["outputs"].append((name, self._ref(value.name)))

    def convert(self) -> dict:
        self._placeholders()
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                self._outputs(node)
            elif node.op != "placeholder":
                raise UnsupportedGraph(f"node '{node.name}' is a {node.op} node, which the "
                                       "compiler does not take")
        return self.spec


def to_graph_spec(program: torch.export.ExportedProgram) -> dict:
    """The compiler graph of an exported program already decomposed to core ATen."""
    return _Converter(program).convert()


def _export_program(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                    dynamic_shapes=None) -> torch.export.ExportedProgram:
    inputs = tuple(t.to("cpu") if isinstance(t, torch.Tensor) else t for t in example_inputs)
    program = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    return program.run_decompositions()  # the core ATen decompositions


def export_graph(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], path: str,
                 *, dynamic_shapes=None) -> None:
    """Writes the model's compiler graph file (docs/graph-format.md) to `path`,
    for `ternc compile`."""
    from torch_tern import _C

    spec = to_graph_spec(_export_program(model, example_inputs, dynamic_shapes))
    _C._compiler_write_graph(spec, os.fspath(path))


def export(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], path: str, *,
           dynamic_shapes=None, graph_path: str | None = None) -> dict:
    """Compiles `model` (called as model(*example_inputs)) into the tern
    executable `path`. Returns the compiler's statistics (nodes, instructions
    per engine, scratch peak, compile time). `graph_path` also keeps the
    compiler graph file."""
    from torch_tern import _C

    spec = to_graph_spec(_export_program(model, example_inputs, dynamic_shapes))
    return _C._compiler_compile(spec, os.fspath(path),
                                os.fspath(graph_path) if graph_path else "")


class CompiledModel:
    """A compiled executable loaded on a tern device: ``model(*inputs)`` runs
    the whole graph as one execution on the current stream and returns its
    outputs as tern tensors (one tensor, or a tuple when there are several)."""

    def __init__(self, path: str, device=None):
        from torch_tern import _C

        index = -1 if device is None else torch.device(device).index
        self._model = _C._CompiledModel(os.fspath(path), -1 if index is None else index)
        self.input_names = self._model.input_names
        self.output_names = self._model.output_names

    def __call__(self, *inputs: torch.Tensor):
        outputs = self._model.run(list(inputs))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def load(path: str, device=None) -> CompiledModel:
    """Loads an executable written by `export` on `device` (default: the
    current tern device)."""
    return CompiledModel(path, device)
