#include "compile/compile_binding.h"

#include <torch/csrc/autograd/python_variable.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compile/compiled_model.h"
#include "compiler/cache/compile_cache.h"
#include "compiler/graph_file/graph_file.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/verify.h"
#include "compiler/lower/compile.h"
#include "compiler/passes/bind_symbols.h"
#include "compiler/passes/pipeline.h"

namespace py = pybind11;

namespace torch_tern {
namespace {

using tern::compiler::Attribute;
using tern::compiler::Dim;
using tern::compiler::DTypeAttr;
using tern::compiler::Graph;
using tern::compiler::Shape;
using tern::compiler::TensorType;

[[noreturn]] void Fail(const std::string& message) { throw py::value_error(message); }

tern_dtype_t DType(const std::string& name) {
  for (int d = 0; d < TERN_DTYPE_COUNT; ++d) {
    if (name == tern_dtype_name(static_cast<tern_dtype_t>(d))) return static_cast<tern_dtype_t>(d);
  }
  Fail("dtype '" + name + "' is not a tern dtype");
}

// An int, or (symbol, factor, offset).
Dim ToDim(const py::handle& dim) {
  if (py::isinstance<py::int_>(dim)) return Dim::Constant(dim.cast<int64_t>());
  const auto parts = dim.cast<py::tuple>();
  if (parts.size() != 3) Fail("a symbolic dim must be (symbol, factor, offset)");
  return Dim::Affine(parts[0].cast<int32_t>(), parts[1].cast<int64_t>(), parts[2].cast<int64_t>());
}

Shape ToShape(const py::handle& dims) {
  Shape shape;
  for (const py::handle& dim : dims) shape.push_back(ToDim(dim));
  return shape;
}

Attribute ToAttribute(const std::string& name, const py::handle& value) {
  Attribute attr{name, int64_t{0}};
  if (py::isinstance<py::bool_>(value)) {
    attr.value = value.cast<bool>();
  } else if (py::isinstance<py::int_>(value)) {
    attr.value = value.cast<int64_t>();
  } else if (py::isinstance<py::float_>(value)) {
    attr.value = value.cast<double>();
  } else if (py::isinstance<py::str>(value)) {
    attr.value = value.cast<std::string>();
  } else if (py::isinstance<py::list>(value)) {
    attr.value = value.cast<std::vector<int64_t>>();
  } else if (py::isinstance<py::tuple>(value) && py::len(value) == 2) {
    const auto pair = value.cast<py::tuple>();
    const auto kind = pair[0].cast<std::string>();
    if (kind == "shape") {
      attr.value = ToShape(pair[1]);
    } else if (kind == "dtype") {
      attr.value = DTypeAttr{DType(pair[1].cast<std::string>())};
    } else {
      Fail("attribute '" + name + "' has the unknown kind '" + kind + "'");
    }
  } else {
    Fail("attribute '" + name + "' has a value of an unsupported type");
  }
  return attr;
}

// The spec (see _frontend.py) as a verified graph.
Graph ToGraph(const py::dict& spec) {
  Graph graph;
  for (const py::handle& symbol : spec["symbols"]) {
    const auto t = symbol.cast<py::tuple>();
    graph.symbols.push_back({t[0].cast<std::string>(), t[1].cast<int64_t>(), t[2].cast<int64_t>()});
  }
  for (const py::handle& input : spec["inputs"]) {
    const auto t = input.cast<py::tuple>();
    graph.AddInput(t[0].cast<std::string>(), {DType(t[1].cast<std::string>()), ToShape(t[2])});
  }
  std::vector<uint32_t> constants;
  for (const py::handle& constant : spec["constants"]) {
    const auto t = constant.cast<py::tuple>();
    const std::string bytes = t[3].cast<std::string>();
    constants.push_back(graph.AddConstant(t[0].cast<std::string>(),
                                          {DType(t[1].cast<std::string>()), ToShape(t[2])},
                                          std::vector<uint8_t>(bytes.begin(), bytes.end())));
  }
  auto resolve = [&](const py::handle& ref) -> uint32_t {
    if (ref.is_none()) return tern::compiler::kNoValue;
    const auto t = ref.cast<py::tuple>();
    const auto kind = t[0].cast<std::string>();
    const size_t i = t[1].cast<size_t>();
    if (kind == "in" && i < graph.inputs.size()) return graph.inputs[i];
    if (kind == "const" && i < constants.size()) return constants[i];
    if (kind == "node" && i < graph.nodes.size()) {
      const size_t k = t[2].cast<size_t>();
      if (k < graph.nodes[i].outputs.size()) return graph.nodes[i].outputs[k];
    }
    Fail("a node refers to a value that does not exist");
  };
  for (const py::handle& item : spec["nodes"]) {
    const auto t = item.cast<py::tuple>();
    std::vector<uint32_t> inputs;
    for (const py::handle& ref : t[1]) inputs.push_back(resolve(ref));
    std::vector<Attribute> attrs;
    for (const auto& [key, value] : t[2].cast<py::dict>()) {
      attrs.push_back(ToAttribute(key.cast<std::string>(), value));
    }
    auto added = tern::compiler::AddNode(&graph, t[0].cast<std::string>(), std::move(inputs),
                                         std::move(attrs), t[3].cast<std::string>(),
                                         t[4].cast<std::string>());
    if (!added.ok()) {
      Fail(std::string(added.status().message()) +
           (added.status().code() == absl::StatusCode::kUnimplemented
                ? " (torch_tern.compiler.export compiles whole graphs only; run this model "
                  "eagerly on the tern device, or with torch.compile, until the compiler "
                  "supports the op)"
                : ""));
    }
  }
  for (const py::handle& output : spec["outputs"]) {
    const auto t = output.cast<py::tuple>();
    graph.AddOutput(t[0].cast<std::string>(), resolve(t[1]));
  }
  for (const py::handle& mutation : spec["mutations"]) {
    const auto t = mutation.cast<py::tuple>();
    graph.mutations.push_back({t[0].cast<uint32_t>(), t[1].cast<uint32_t>()});
  }
  if (absl::Status verified = tern::compiler::VerifyGraph(graph); !verified.ok()) {
    Fail(std::string(verified.message()));
  }
  return graph;
}

void WriteGraph(const py::dict& spec, const std::string& path) {
  const Graph graph = ToGraph(spec);
  if (absl::Status written = tern::compiler::WriteGraphFile(graph, path); !written.ok()) {
    throw std::runtime_error(std::string(written.message()));
  }
}

// Written to a temporary file and renamed: a reader never sees half a file.
void WriteAtomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temporary = path + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out.good()) throw std::runtime_error("cannot write " + temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw std::runtime_error("cannot rename " + temporary + " to " + path);
  }
}

py::dict Compile(const py::dict& spec, const std::string& path, const std::string& graph_path,
                 bool use_cache, const std::map<std::string, int64_t>& bindings,
                 const std::string& cache_dir) {
  Graph graph = ToGraph(spec);
  if (!graph_path.empty()) {
    if (absl::Status written = tern::compiler::WriteGraphFile(graph, graph_path); !written.ok()) {
      throw std::runtime_error(std::string(written.message()));
    }
  }
  // Symbolic sizes given values (torch.compile's dynamic dims, bound per
  // size at run time): the rest of the pipeline sees a static graph.
  if (!bindings.empty()) {
    tern::compiler::SymbolBindings values(bindings.begin(), bindings.end());
    if (absl::Status bound = tern::compiler::BindSymbolsInPlace(&graph, values); !bound.ok()) {
      Fail(std::string(bound.message()));
    }
  }
  // The graph passes (compiler/passes), in place: the graph owns the weights.
  tern::compiler::PassStats passes{};
  if (absl::Status optimized =
          tern::compiler::OptimizeGraphInPlace(&graph, tern::compiler::PassOptions{}, &passes);
      !optimized.ok()) {
    Fail(std::string(optimized.message()));
  }
  tern::compiler::CompileStats stats{};
  // Through the persistent compile cache (compiler/cache/compile_cache.h)
  // unless the caller turns it off.
  tern::compiler::CacheReport cache;
  tern::compiler::CacheConfig cache_config;
  cache_config.directory = cache_dir;
  auto executable =
      use_cache ? tern::compiler::CompileCached(graph, tern::compiler::CompileOptions{}, &stats,
                                                &cache, cache_config)
                : tern::compiler::CompileGraph(graph, tern::compiler::CompileOptions{}, &stats);
  if (!executable.ok()) {
    const std::string message(executable.status().message());
    // A cache problem (directory refused, lock timeout, I/O) is not the
    // graph's fault: a RuntimeError that says how to bypass the cache.
    if (message.rfind("compile cache:", 0) == 0) {
      throw std::runtime_error(message + "; or pass use_cache=False to compile without it");
    }
    Fail(message);
  }
  py::dict out;
  if (path.empty()) {
    // The caller keeps the executable in memory (torch.compile's backend).
    out["executable"] =
        py::bytes(reinterpret_cast<const char*>(executable->data()), executable->size());
  } else {
    WriteAtomically(path, *executable);
  }
  out["nodes"] = stats.nodes;
  out["instructions"] = stats.instructions;
  out["semaphores"] = stats.semaphores;
  out["scratch_peak"] = stats.scratch_peak;
  out["scratch_naive_sum"] = stats.scratch_naive_sum;
  out["scratch_max_live"] = stats.scratch_max_live;
  out["compile_ms"] = stats.compile_ms;
  out["compute_instructions"] = stats.compute_instructions;
  out["compute_instructions_unfused"] = stats.compute_instructions_unfused;
  out["epilogues"] = stats.epilogues;
  out["fused_groups"] = stats.fused_groups;
  out["fused_members"] = stats.fused_members;
  out["mutations_in_place"] = stats.mutations_in_place;
  out["mutations_copied"] = stats.mutations_copied;
  out["nodes_optimized"] = passes.nodes_after;
  out["optimize_ms"] = passes.optimize_ms;
  out["bytes"] = executable->size();
  out["cache"] = std::string(tern::compiler::CacheOutcomeName(cache.outcome));
  if (!cache.store_error.empty()) out["cache_store_error"] = cache.store_error;
  return out;
}

}  // namespace

void RegisterCompilerBindings(py::module& module) {
  module.def("_compiler_write_graph", &WriteGraph, py::arg("spec"), py::arg("path"),
             "Writes a graph spec (torch_tern.compiler) as a compiler graph file.");
  module.def("_compiler_compile", &Compile, py::arg("spec"), py::arg("path"),
             py::arg("graph_path") = "", py::arg("use_cache") = true,
             py::arg("bindings") = std::map<std::string, int64_t>{}, py::arg("cache_dir") = "",
             "Compiles a graph spec (its symbols bound to `bindings` first) into the "
             "executable `path` through the compile cache in `cache_dir` (\"\": the default "
             "one) unless use_cache is False; returns the statistics, with \"cache\": "
             "\"hit\", \"miss\", \"waited\", \"repaired\" or \"disabled\". An empty `path` "
             "returns the executable's bytes as \"executable\" instead of writing a file.");
  py::class_<CompiledModel>(module, "_CompiledModel")
      .def(py::init<const std::string&, int>(), py::arg("path"), py::arg("device") = -1)
      .def_static(
          "from_bytes",
          [](const py::bytes& executable, int device) {
            const std::string_view view(executable);
            return std::make_unique<CompiledModel>(std::vector<uint8_t>(view.begin(), view.end()),
                                                   device);
          },
          py::arg("executable"), py::arg("device") = -1)
      .def("run", &CompiledModel::Run, py::arg("inputs"),
           py::arg("into") = std::vector<std::optional<at::Tensor>>{})
      .def_property_readonly("input_names", &CompiledModel::input_names)
      .def_property_readonly("output_names", &CompiledModel::output_names);
  module.def(
      "_compiler_cache_clear",
      [](const std::string& cache_dir) {
        tern::compiler::CacheConfig config;
        config.directory = cache_dir;
        auto cleared = tern::compiler::ClearCache(config);
        if (!cleared.ok()) throw std::runtime_error(std::string(cleared.status().message()));
        py::dict out;
        out["entries_removed"] = cleared->entries_removed;
        out["bytes_removed"] = cleared->bytes_removed;
        out["other_files_removed"] = cleared->other_files_removed;
        return out;
      },
      py::arg("cache_dir") = "",
      "Removes every entry of the compile cache in `cache_dir` (\"\": the default one).");
  module.def("_compiler_known_ops", [] {
    std::vector<std::string> names;
    for (std::string_view name : tern::compiler::KnownOps()) names.emplace_back(name);
    return names;
  });
}

}  // namespace torch_tern
