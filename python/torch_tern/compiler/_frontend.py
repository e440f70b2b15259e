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

import enum
import functools
import operator
import os
import re
import struct
import sys
import time
import types
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
                    low = max(int(constraint.lower), 0)
                    upper = constraint.upper
                    # Unbounded (sympy's oo, or torch's int_oo, whose
                    # is_finite is not False): the compiler's int32 limit.
                    bounded = getattr(upper, "is_number", False) and str(upper) not in (
                        "oo", "int_oo")
                    high = min(int(upper), 2**31 - 1) if bounded else 2**31 - 1
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
        if not self._sizes_known(node):
            return False
        args = torch.fx.node.map_arg(node.args, lambda n: self.known[n.name])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.known[n.name])
        kwargs = {k: (torch.device("cpu") if k == "device" and v is not None else v)
                  for k, v in kwargs.items()}
        with torch.no_grad():
            self.known[node.name] = node.target(*args, **kwargs)
        return True

    def _sizes_known(self, node: torch.fx.Node) -> bool:
        """The node's results have sizes known now (none symbolic)."""
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        return not any(isinstance(v, torch.Tensor)
                       and any(isinstance(d, torch.SymInt) for d in v.shape) for v in vals)

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
            # A model that returns an input (or one value twice) would give two
            # names alike; the executable's names must be unique.
            taken = {entry[0] for entry in self.spec["inputs"]}
            taken.update(entry[0] for entry in self.spec["outputs"])
            if name in taken:
                name = f"output_{k}"
                while name in taken:
                    name = "_" + name
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


def _needs_decompositions(program: torch.export.ExportedProgram) -> bool:
    """Whether the core ATen decompositions would change the exported
    program: an operator they decompose or that the compiler does not take
    as it is, or a mutated buffer or input. They trace the whole program
    again (1.7 s of a 1,000-node elementwise chain's 2.6 s, AMD EPYC Zen 4);
    a graph they would leave as it is, made of the compiler's (functional)
    operators, is taken as exported: the same graph, without the trace."""
    from torch._decomp import core_aten_decompositions

    from torch_tern import _C

    signature = program.graph_signature
    if signature.buffers_to_mutate or getattr(signature, "user_inputs_to_mutate", None):
        return True
    known = frozenset(_C._compiler_known_ops())
    decomposed = core_aten_decompositions()
    for node in program.graph.nodes:
        if node.op == "get_attr":
            return True
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            continue
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            continue
        if (not isinstance(node.target, torch._ops.OpOverload) or str(node.target) not in known
                or node.target in decomposed):
            return True
    return False


def _export_program(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor],
                    dynamic_shapes=None) -> torch.export.ExportedProgram:
    inputs = tuple(t.to("cpu") if isinstance(t, torch.Tensor) else t for t in example_inputs)
    program = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    if not _needs_decompositions(program):
        return program
    return program.run_decompositions()  # the core ATen decompositions


def export_graph(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], path: str,
                 *, dynamic_shapes=None) -> None:
    """Writes the model's compiler graph file (docs/graph-format.md) to `path`,
    for `ternc compile`."""
    from torch_tern import _C

    spec = to_graph_spec(_export_program(model, example_inputs, dynamic_shapes))
    _C._compiler_write_graph(spec, os.fspath(path))


# --- the export-level cache (docs/compiler.md, "Export cache") ----------------
#
# Key: a SHA-256 over a description of everything the exported graph depends
# on that is cheap to get without torch.export: the versions (Python, torch,
# torch_tern, the native extension's files, the front end's source, numpy,
# transformers when imported), a few global torch settings, the module tree
# (class names, the defining files' bytes, the classes' code, every plain
# attribute, hooks refused), the parameters and buffers (names, dtypes,
# shapes, strides, a digest of their bytes), the example inputs' specs and the
# values of non-tensor inputs. The entry is a small index file
# <compile cache>/export/<key>.json naming the compile cache's entry that holds
# the executable and the SHA-256 of the executable's bytes; a hit reads the
# executable from that entry and checks it against the digest.

_EXPORT_CACHE_FORMAT = "tern export cache 1"
_HASH_CHUNK = 8 << 20  # tensors are hashed in 8 MiB chunks, on threads
_ENTRY_HEADER = 48  # compiler/cache/compile_cache.cc, "Entry file layout"
_ENTRY_MAGIC = b"TERNCCE\0"
_LOCK_TIMEOUT_S = 300.0
_MAX_ITEMS = 200_000  # described values per key; more: not cached


class _Uncacheable(Exception):
    """The model or the call uses something the key does not cover."""


def _compile_cache_directory() -> str:
    """The compile cache's directory: TORCH_TERN_CACHE_DIR, else what
    compiler/cache resolves (TERN_COMPILE_CACHE_DIR, XDG_CACHE_HOME, HOME)."""
    for variable in ("TORCH_TERN_CACHE_DIR", "TERN_COMPILE_CACHE_DIR"):
        directory = os.environ.get(variable)
        if directory:
            return directory
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "tern", "compile")
    return os.path.join(os.path.expanduser("~"), ".cache", "tern", "compile")


def _private_directory(path: str) -> None:
    """Refuses (as the compile cache does) a directory another user could write."""
    import stat

    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise _Uncacheable(f"{path} is not a directory of this user that only it can write")


def _file_digest(path: str, files: dict) -> str:
    if path not in files:
        import hashlib

        try:
            with open(path, "rb") as f:
                files[path] = hashlib.sha256(f.read()).hexdigest()
        except OSError as error:
            raise _Uncacheable(f"cannot read the source file {path}: {error}") from None
    return files[path]


def _versioned_directories() -> tuple:
    """Directories whose files the key covers by a version instead of walking
    their code: torch, transformers (when imported), torch_tern, Python's own."""
    import sysconfig

    dirs = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))]
    transformers = sys.modules.get("transformers")
    if transformers is not None and getattr(transformers, "__file__", None):
        dirs.append(os.path.dirname(transformers.__file__))
    for name in ("stdlib", "platstdlib"):
        if sysconfig.get_paths().get(name):
            dirs.append(sysconfig.get_paths()[name])
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


class _KeyBuilder:
    """Builds the key's description: nested tuples of strings and numbers
    (repr'd and hashed), with the tensors' bytes hashed last, on threads."""

    def __init__(self):
        self.files: dict[str, str] = {}  # source file -> SHA-256 of its bytes
        self.objects: dict[int, int] = {}  # id -> index of first description (sharing, cycles)
        self.keep: list = []  # keeps described objects alive (ids stay unique)
        self.tensors: list[torch.Tensor] = []  # hashed later, by index
        self.items = 0
        self.modules: dict[int, str] = {}  # id of each module of the tree -> its name
        self.code_done: set[int] = set()
        self.versioned = _versioned_directories()

    def _count(self) -> None:
        self.items += 1
        if self.items > _MAX_ITEMS:
            raise _Uncacheable(f"more than {_MAX_ITEMS} values to describe")

    def _user_file(self, filename: str) -> bool:
        return not os.path.realpath(filename).startswith(self.versioned)

    def tensor(self, t: torch.Tensor, where: str):
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise _Uncacheable(f"{where} is a {type(t).__name__}, a tensor subclass")
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta" or (
                hasattr(torch._C, "_functorch") and torch._C._functorch.is_functorch_wrapped_tensor(t)):
            raise _Uncacheable(f"{where} is not a plain dense tensor")
        seen = self.objects.get(id(t))
        if seen is not None:
            return ("same", seen)
        self.objects[id(t)] = len(self.objects)
        self.keep.append(t)
        self.tensors.append(t)
        return ("tensor", str(t.dtype), tuple(t.shape), tuple(t.stride()), t.storage_offset(),
                str(t.device), t.requires_grad, len(self.tensors) - 1)

    def code(self, func, where: str):
        """The function's code (marshalled: constants, names, nested code,
        lines), its file's bytes, and, for code outside the versioned
        directories, the globals it names (their values, or recursively their
        code)."""
        import marshal

        code = func.__code__
        filename = code.co_filename
        if not os.path.isfile(filename):
            raise _Uncacheable(f"{where}: {func.__qualname__} has no source file ({filename})")
        described = ["code", func.__module__, func.__qualname__, _digest_bytes(marshal.dumps(code)),
                     _file_digest(filename, self.files)]
        described.append(self.value(func.__defaults__, where, 1))
        described.append(self.value(func.__kwdefaults__, where, 1))
        if func.__closure__:
            described.append(tuple(self.value(cell.cell_contents, f"{where} (closure)", 1)
                                   for cell in func.__closure__))
        if id(code) in self.code_done or not self._user_file(filename):
            return tuple(described)
        self.code_done.add(id(code))
        self.keep.append(code)
        names: list[str] = []
        stack = [code]
        while stack:
            c = stack.pop()
            names.extend(c.co_names)
            stack.extend(k for k in c.co_consts if isinstance(k, type(code)))
        globals_ = getattr(func, "__globals__", {})
        for name in sorted(set(names)):
            if name not in globals_:
                continue
            value = globals_[name]
            if isinstance(value, type(sys)):
                file = getattr(value, "__file__", None)
                if file and self._user_file(file) and os.path.isfile(file):
                    described.append((name, "module", value.__name__,
                                      _file_digest(file, self.files)))
                continue
            try:
                described.append((name, self.value(value, f"{where} (global {name})", 1)))
            except _Uncacheable:
                # A global the description cannot take (a logger, a lock):
                # only its type. docs/compiler.md lists this limit.
                described.append((name, "opaque", type(value).__qualname__))
        return tuple(described)

    def klass(self, cls: type, where: str):
        """A class: its name, its file's bytes and (outside the versioned
        directories) the code of every function it defines."""
        seen = self.objects.get(id(cls))
        if seen is not None:
            return ("same", seen)
        self.objects[id(cls)] = len(self.objects)
        self.keep.append(cls)
        if cls.__module__ == "builtins":
            return ("class", "builtins", cls.__qualname__)
        module = sys.modules.get(cls.__module__)
        file = getattr(module, "__file__", None)
        if not file:  # a module imported without sys.modules: its methods' file
            files = {m.__code__.co_filename for m in cls.__dict__.values()
                     if isinstance(m, types.FunctionType)}
            file = files.pop() if len(files) == 1 else None
        if not file or not os.path.isfile(file):
            raise _Uncacheable(f"{where}: the class {cls.__qualname__} has no source file")
        described = ["class", cls.__module__, cls.__qualname__, _file_digest(file, self.files)]
        if self._user_file(file):
            for name, member in cls.__dict__.items():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                if isinstance(member, types.FunctionType):
                    described.append((name, self.code(member, f"{where}: {cls.__qualname__}.{name}")))
                elif not name.startswith("__"):
                    try:  # class attributes: their values now, not only their source
                        described.append((name, self.value(member, where, 1)))
                    except _Uncacheable:
                        described.append((name, "opaque", type(member).__qualname__))
        return tuple(described)

    def value(self, v, where: str, depth: int):
        """A plain value, recursively; _Uncacheable for what it cannot describe."""
        self._count()
        if depth > 8:
            raise _Uncacheable(f"{where}: values nested too deeply")
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            return (type(v).__name__, repr(v))
        if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return (type(v).__name__, str(v))
        if isinstance(v, torch.Tensor):
            return self.tensor(v, where)
        if isinstance(v, enum.Enum):
            return ("enum", self.klass(type(v), where), v.name)
        if isinstance(v, (tuple, list)):
            return (type(v).__name__,) + tuple(self.value(x, where, depth + 1) for x in v)
        if isinstance(v, (set, frozenset)):
            return (type(v).__name__,) + tuple(sorted((repr(self.value(x, where, depth + 1))
                                                       for x in v)))
        if isinstance(v, dict):
            return ("dict",) + tuple((self.value(k, where, depth + 1),
                                      self.value(x, where, depth + 1)) for k, x in v.items())
        if isinstance(v, torch.nn.Module):
            if id(v) in self.modules:
                return ("module", self.modules[id(v)])
            raise _Uncacheable(f"{where} holds a module outside the module tree")
        if isinstance(v, type):
            return self.klass(v, where)
        if isinstance(v, type(sys)):
            return ("pymodule", v.__name__)
        if isinstance(v, types.FunctionType):
            return self.code(v, where)
        if isinstance(v, types.MethodType):
            return ("method", self.value(v.__func__, where, depth + 1),
                    self.value(v.__self__, where, depth + 1))
        if isinstance(v, functools.partial):
            return ("partial", self.value(v.func, where, depth + 1),
                    self.value(v.args, where, depth + 1), self.value(v.keywords, where, depth + 1))
        if isinstance(v, (types.BuiltinFunctionType, torch._ops.OpOverload,
                          torch._ops.OpOverloadPacket)):
            return ("builtin", getattr(v, "__module__", None) or "", str(getattr(v, "__qualname__", v)))
        seen = self.objects.get(id(v))
        if seen is not None:
            return ("same", seen)
        state = getattr(v, "__dict__", None)
        slots = {s for c in type(v).__mro__ for s in getattr(c, "__slots__", ())
                 if isinstance(getattr(c, "__slots__", ()), (tuple, list))}
        if not isinstance(state, dict) or slots - {"__dict__", "__weakref__"}:
            raise _Uncacheable(f"{where}: a {type(v).__qualname__} cannot be described")
        self.objects[id(v)] = len(self.objects)
        self.keep.append(v)
        return ("object", self.klass(type(v), where),
                self.value(dict(sorted(state.items(), key=lambda kv: str(kv[0]))), where,
                           depth + 1))

    def model(self, model: torch.nn.Module):
        if not isinstance(model, torch.nn.Module):
            raise _Uncacheable(f"the model is a {type(model).__name__}, not a torch.nn.Module")
        hooks = torch.nn.modules.module
        for name in dir(hooks):
            if name.startswith("_global_") and name.endswith("hooks") and getattr(hooks, name):
                raise _Uncacheable(f"global module hooks are registered ({name})")
        tree = list(model.named_modules(remove_duplicate=False))
        for name, module in tree:
            self.modules.setdefault(id(module), name)
        internals = set(torch.nn.Module().__dict__)
        described = []
        done: set[int] = set()
        for name, module in tree:
            where = f"module '{name or type(model).__name__}'"
            if id(module) in done:
                described.append((name, "same", self.modules[id(module)]))
                continue
            done.add(id(module))
            if isinstance(module, torch.jit.ScriptModule) or type(module).__name__ in (
                    "GraphModule", "OptimizedModule") or isinstance(module, torch.fx.GraphModule):
                raise _Uncacheable(f"{where} is a {type(module).__name__}")
            state = module.__dict__
            for key in state:
                if "hook" in key and state[key]:
                    raise _Uncacheable(f"{where} has hooks ({key})")
            if "forward" in state or "__call__" in state:
                raise _Uncacheable(f"{where}: its forward is patched on the instance")
            classes = [self.klass(cls, where) for cls in type(module).__mro__
                       if issubclass(cls, torch.nn.Module) and cls is not torch.nn.Module]
            params = tuple((k, None if p is None else self.tensor(p, f"parameter '{name}.{k}'"))
                           for k, p in state["_parameters"].items())
            buffers = tuple((k, None if b is None else self.tensor(b, f"buffer '{name}.{k}'"))
                            for k, b in state["_buffers"].items())
            children = tuple((k, self.modules[id(m)] if m is not None else None)
                             for k, m in state["_modules"].items())
            attributes = tuple(
                (k, self.value(v, f"{where}, attribute '{k}'", 1))
                for k, v in sorted(state.items())
                if k not in internals or k in ("training", "_non_persistent_buffers_set"))
            described.append((name, tuple(classes), params, buffers, children, attributes))
        return tuple(described)


def _digest_bytes(data) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _tensor_digests(tensors: list) -> list[str]:
    """SHA-256 of each tensor's bytes (row-major), big ones in chunks on
    threads (hashlib releases the GIL)."""
    import hashlib

    jobs: list = []  # (tensor index, memoryview chunk)
    for i, t in enumerate(tensors):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.contiguous()
        if t.numel() == 0:
            continue
        if t.dim() == 0:
            t = t.reshape(1)
        data = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(data), _HASH_CHUNK):
            jobs.append((i, data[start:start + _HASH_CHUNK]))
    sha = lambda chunk: hashlib.sha256(chunk).digest()  # noqa: E731
    total = sum(len(chunk) for _, chunk in jobs)
    if total >= 2 * _HASH_CHUNK and (os.cpu_count() or 1) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            digests = list(pool.map(sha, (chunk for _, chunk in jobs)))
    else:
        digests = [sha(chunk) for _, chunk in jobs]
    per_tensor = [hashlib.sha256() for _ in tensors]
    for (i, _), digest in zip(jobs, digests):
        per_tensor[i].update(digest)
    return [h.hexdigest() for h in per_tensor]


def _environment() -> tuple:
    """Versions and global settings: what changes the graph or the bytes for
    the same model. The native extension (which holds the compiler, its
    kCompilerVersion and the tern version) by its files' identity: any rebuild
    misses once."""
    import glob

    import numpy
    import torch_tern

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    native = []
    for file in sorted(glob.glob(os.path.join(package, "_C*")) +
                       glob.glob(os.path.join(package, "lib", "*"))):
        st = os.stat(file)
        native.append((os.path.basename(file), st.st_size, st.st_mtime_ns, st.st_ino))
    files: dict[str, str] = {}
    frontend = tuple(
        (os.path.basename(f), _file_digest(f, files))
        for f in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))))
    transformers = sys.modules.get("transformers")
    return (_EXPORT_CACHE_FORMAT, sys.version, torch.__version__,
            getattr(torch.version, "git_version", ""), getattr(torch_tern, "__version__", ""),
            tuple(native), frontend, numpy.__version__,
            getattr(transformers, "__version__", None) if transformers else None,
            str(torch.get_default_dtype()), torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(), torch.are_deterministic_algorithms_enabled())


def _export_key(model, example_inputs, dynamic_shapes, graph_path) -> str:
    if dynamic_shapes is not None:
        raise _Uncacheable("dynamic_shapes is not part of the key")
    if graph_path:
        raise _Uncacheable("graph_path asks for the graph file, which only an export makes")
    builder = _KeyBuilder()
    described_model = builder.model(model)
    if not isinstance(example_inputs, (tuple, list)):
        raise _Uncacheable("example_inputs is not a tuple or list")
    inputs = []
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            if type(x) is not torch.Tensor:
                raise _Uncacheable(f"input {i} is a {type(x).__name__}, a tensor subclass")
            # Inputs are moved to the CPU before export; their values are not
            # part of the graph.
            inputs.append(("tensor", str(x.dtype), tuple(x.shape), tuple(x.stride()),
                           x.requires_grad))
        else:
            inputs.append(builder.value(x, f"input {i}", 1))
    digests = _tensor_digests(builder.tensors)
    description = repr((_environment(), described_model, tuple(inputs), tuple(digests)))
    return _digest_bytes(description.encode())


def _read_entry_executable(directory: str, entry: str, size: int, digest: str) -> bytes | None:
    """The executable of compile cache entry `entry` if it is `size` bytes
    whose SHA-256 is `digest`; else None."""
    if "/" in entry or not entry.endswith(".entry"):
        return None
    try:
        with open(os.path.join(directory, entry), "rb") as f:
            header = f.read(_ENTRY_HEADER)
            if len(header) != _ENTRY_HEADER or header[:8] != _ENTRY_MAGIC:
                return None
            key_size, stats_size = struct.unpack_from("<II", header, 12)
            (executable_size,) = struct.unpack_from("<Q", header, 24)
            if executable_size != size:
                return None
            f.seek(_ENTRY_HEADER + key_size + stats_size)
            executable = f.read(size + 1)
    except OSError:
        return None
    if len(executable) != size or _digest_bytes(executable) != digest:
        return None
    return executable


def _find_entry(directory: str, executable: bytes) -> str | None:
    """The compile cache entry that holds `executable` (any with these bytes)."""
    digest = _digest_bytes(executable)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".entry"))
    except OSError:
        return None
    # Newest first: the entry this export just stored or hit.
    def modified(name):
        try:
            return -os.stat(os.path.join(directory, name)).st_mtime_ns
        except OSError:
            return 0
    for name in sorted(names, key=modified):
        if _read_entry_executable(directory, name, len(executable), digest) is not None:
            return name
    return None


def _write_atomically(path: str, data: bytes, sync: bool) -> None:
    """Temporary file (O_EXCL) in the same directory, [fsync,] rename[, fsync
    of the directory]: readers see the old file or the whole new one."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = f"{path}.tmp.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    if sync:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _look_up(index_path: str, directory: str, path: str, started: float) -> dict | None:
    """Serves a hit: writes the executable to `path` and returns the stats."""
    import json

    try:
        with open(index_path, "rb") as f:
            index = json.loads(f.read())
        if index.get("format") != _EXPORT_CACHE_FORMAT:
            return None
        executable = _read_entry_executable(directory, index["entry"],
                                            int(index["executable_bytes"]),
                                            index["executable_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if executable is None:
        return None  # the compile cache's entry is gone (cleared) or was replaced
    _write_atomically(os.fspath(path), executable, sync=False)
    stats = dict(index.get("stats", {}))
    elapsed_ms = (time.perf_counter() - started) * 1e3
    stats.update(bytes=len(executable), cache="hit", export_cache="hit", export_skipped=True,
                 compile_ms=elapsed_ms, export_cache_ms=elapsed_ms)
    return stats


def _cached_export(model, example_inputs, path, dynamic_shapes, graph_path) -> dict:
    import json

    started = time.perf_counter()
    try:
        key = _export_key(model, example_inputs, dynamic_shapes, graph_path)
        directory = _compile_cache_directory()
        index_directory = os.path.join(directory, "export")
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.makedirs(index_directory, mode=0o700, exist_ok=True)
        except OSError as error:
            raise _Uncacheable(f"cannot create {index_directory}: {error}") from None
        try:
            _private_directory(directory)
            _private_directory(index_directory)
        except OSError as error:
            raise _Uncacheable(f"cannot check {index_directory}: {error}") from None
    except _Uncacheable as reason:
        stats = _export_full(model, example_inputs, path, dynamic_shapes, graph_path, True)
        stats.update(export_skipped=False, export_cache=f"bypassed: {reason}")
        return stats
    key_ms = (time.perf_counter() - started) * 1e3
    index_path = os.path.join(index_directory, key + ".json")
    hit = _look_up(index_path, directory, path, started)
    if hit is not None:
        hit["export_key_ms"] = key_ms
        return hit
    # A miss: one process exports while the others exporting the same model
    # wait for it and then hit (the lock is released when its holder dies).
    lock_fd, waited = _lock(os.path.join(index_directory, key + ".lock"))
    try:
        hit = _look_up(index_path, directory, path, started)  # stored meanwhile?
        if hit is not None:
            hit.update(export_key_ms=key_ms, export_cache="waited" if waited else "hit")
            return hit
        stats = _export_full(model, example_inputs, path, dynamic_shapes, graph_path, True)
        stats.update(export_skipped=False, export_cache="miss", export_key_ms=key_ms)
        try:
            with open(os.fspath(path), "rb") as f:
                executable = f.read()
            entry = _find_entry(directory, executable)
            if entry is None:
                stats["export_cache"] = "miss (not stored: no compile cache entry)"
                return stats
            kept = {k: v for k, v in stats.items()
                    if k not in ("cache", "cache_store_error", "compile_ms", "bytes")
                    and not k.startswith("export")}
            index = {"format": _EXPORT_CACHE_FORMAT, "entry": entry,
                     "executable_bytes": len(executable),
                     "executable_sha256": _digest_bytes(executable), "stats": kept}
            _write_atomically(index_path, json.dumps(index).encode(), sync=True)
        except OSError as error:
            stats["export_cache"] = f"miss (not stored: {error})"
        return stats
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _lock(path: str) -> tuple:
    """An exclusive flock of `path`, waiting up to _LOCK_TIMEOUT_S: (fd or
    None when it could not be had, whether it had to wait)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None, False
    deadline = time.monotonic() + _LOCK_TIMEOUT_S
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, waited
        except BlockingIOError:
            waited = True
            if time.monotonic() > deadline:
                os.close(fd)  # export without it
                return None, waited
            time.sleep(0.02)
        except OSError:
            os.close(fd)
            return None, waited


def _export_full(model, example_inputs, path, dynamic_shapes, graph_path, use_cache) -> dict:
    """torch.export, decompositions, conversion and the compiler (through the
    compile cache unless `use_cache` is False)."""
    from torch_tern import _C

    spec = to_graph_spec(_export_program(model, example_inputs, dynamic_shapes))
    return _C._compiler_compile(spec, os.fspath(path),
                                os.fspath(graph_path) if graph_path else "", use_cache,
                                cache_dir=_compile_cache_directory())


def export(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor], path: str, *,
           dynamic_shapes=None, graph_path: str | None = None, cache: str = "export") -> dict:
    """Compiles `model` (called as model(*example_inputs)) into the tern
    executable `path`. Returns the compiler's statistics (nodes, instructions
    per engine, scratch peak, compile time, the compile cache's outcome).
    `graph_path` also keeps the compiler graph file.

    `cache`: "export" (default) first looks the model up in the export-level
    cache, which recognises a model exported before without running
    torch.export (docs/compiler.md, "Export cache"; a hit's statistics have
    "export_skipped": True), then uses the compile cache; "graph" always
    exports and uses only the compile cache (so does TORCH_TERN_EXPORT_CACHE=0);
    "off" uses neither."""
    if cache not in ("export", "graph", "off"):
        raise ValueError(f"cache={cache!r}: use \"export\", \"graph\" or \"off\"")
    if cache == "export" and os.environ.get("TORCH_TERN_EXPORT_CACHE", "1").lower() in (
            "0", "off", "false", "no"):
        cache = "graph"
    if cache != "export":
        stats = _export_full(model, example_inputs, path, dynamic_shapes, graph_path,
                             cache == "graph")
        stats.update(export_skipped=False, export_cache="off")
        return stats
    return _cached_export(model, example_inputs, path, dynamic_shapes, graph_path)


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
