// ternc: the compiler's command line.
//
//   ternc compile GRAPH.ternir -o OUT.tern [--stats]
//   ternc inspect GRAPH.ternir
//   ternc --help
//
// Exit status: 0 ok, 1 the graph did not compile (or the output could not
// be written), 3 the input could not be read as a graph file, 64 bad usage.
#include <absl/status/status.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "compiler/graph_file/graph_file.h"
#include "compiler/ir/graph.h"
#include "compiler/lower/compile.h"
#include "tern/isa.h"

namespace tern::compiler {
namespace {

enum ExitCode { kOk = 0, kCompileError = 1, kUnreadableInput = 3, kUsage = 64 };

constexpr std::string_view kUsageText =
    "usage: ternc compile GRAPH.ternir -o OUT.tern [--stats]\n"
    "       ternc inspect GRAPH.ternir\n"
    "       ternc --help\n";

constexpr std::string_view kHelpText =
    "ternc compiles a model graph (a .ternir graph file, docs/graph-format.md) into one\n"
    "tern executable (docs/executable-format.md) with a function \"forward\" whose inputs\n"
    "and outputs are the graph's. Run it with examples/run_model.\n"
    "\n"
    "commands:\n"
    "  compile GRAPH -o OUT   compile GRAPH and write the executable to OUT (replaced\n"
    "                         atomically); --stats prints instructions per engine,\n"
    "                         semaphores, scratch memory and the compile time\n"
    "  inspect GRAPH          print the graph: symbols, inputs, outputs, nodes\n"
    "\n"
    "exit status: 0 ok, 1 the graph did not compile, 3 the input could not be read,\n"
    "64 bad usage. docs/compiler.md describes what is compiled and how.\n";

int Usage(std::string_view problem) {
  fmt::print(stderr, "ternc: {}\n{}", problem, kUsageText);
  return kUsage;
}

std::string TypeText(const Graph& graph, const TensorType& type) {
  return fmt::format("{} {}", tern_dtype_name(type.dtype), ShapeString(type.shape, graph.symbols));
}

std::string AttrText(const Graph& graph, const Attribute& attr) {
  struct Visitor {
    const Graph& graph;
    std::string operator()(int64_t v) const { return fmt::format("{}", v); }
    std::string operator()(double v) const { return fmt::format("{}", v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::vector<int64_t>& v) const {
      return fmt::format("[{}]", fmt::join(v, ", "));
    }
    std::string operator()(const Shape& v) const { return ShapeString(v, graph.symbols); }
    std::string operator()(const std::string& v) const { return fmt::format("\"{}\"", v); }
    std::string operator()(const DTypeAttr& v) const { return tern_dtype_name(v.dtype); }
  };
  return fmt::format("{}={}", attr.name, std::visit(Visitor{graph}, attr.value));
}

absl::StatusOr<Graph> Read(const std::string& path) { return ReadGraphFile(path); }

int Inspect(const std::string& path) {
  absl::StatusOr<Graph> graph = Read(path);
  if (!graph.ok()) {
    fmt::print(stderr, "ternc: cannot read the graph file '{}': {}\n", path,
               std::string(graph.status().message()));
    return kUnreadableInput;
  }
  const Graph& g = *graph;
  fmt::print("graph {}: {} nodes, {} values, {} constants\n", path, g.nodes.size(), g.values.size(),
             g.constants.size());
  fmt::print("symbols ({}):\n", g.symbols.size());
  for (const Symbol& symbol : g.symbols) {
    fmt::print("  {} in [{}, {}]\n", symbol.name, symbol.min, symbol.max);
  }
  fmt::print("inputs ({}):\n", g.inputs.size());
  for (uint32_t id : g.inputs) {
    fmt::print("  %{} {}: {}\n", id, g.values[id].name, TypeText(g, g.values[id].type));
  }
  fmt::print("outputs ({}):\n", g.outputs.size());
  for (const Graph::Output& output : g.outputs) {
    fmt::print("  {} = %{}: {}\n", output.name, output.value,
               TypeText(g, g.values[output.value].type));
  }
  for (const Graph::Mutation& mutation : g.mutations) {
    fmt::print("  (output {} is written back into input {})\n", mutation.output, mutation.input);
  }
  uint64_t constant_bytes = 0;
  for (const std::vector<uint8_t>& bytes : g.constants) constant_bytes += bytes.size();
  fmt::print("constants ({}, {} bytes):\n", g.constants.size(), constant_bytes);
  for (uint32_t id = 0; id < g.values.size(); ++id) {
    if (g.values[id].kind != Value::kConstant) continue;
    fmt::print("  %{} {}: {}\n", id, g.values[id].name, TypeText(g, g.values[id].type));
  }
  fmt::print("nodes ({}):\n", g.nodes.size());
  for (const Node& node : g.nodes) {
    std::vector<std::string> outputs, inputs, attrs;
    for (uint32_t id : node.outputs) {
      outputs.push_back(fmt::format("%{}: {}", id, TypeText(g, g.values[id].type)));
    }
    for (uint32_t id : node.inputs) {
      inputs.push_back(id == kNoValue ? "None" : fmt::format("%{}", id));
    }
    for (const Attribute& attr : node.attrs) attrs.push_back(AttrText(g, attr));
    fmt::print("  {} = {}({}{}{})  # {}{}\n", fmt::join(outputs, ", "), node.op,
               fmt::join(inputs, ", "), attrs.empty() || inputs.empty() ? "" : ", ",
               fmt::join(attrs, ", "), node.name,
               node.source.empty() ? "" : fmt::format(" @ {}", node.source));
  }
  return kOk;
}

// Writes `bytes` to `path` through a temporary file renamed over it.
absl::Status WriteAtomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, getpid());
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) {
    return absl::PermissionDeniedError(fmt::format("cannot create '{}'", temporary));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::UnavailableError(fmt::format("cannot write '{}' (is the disk full?)", path));
  }
  return absl::OkStatus();
}

void PrintStats(const CompileStats& stats, uint64_t bytes) {
  static constexpr std::string_view kEngineNames[8] = {"",       "dma",    "tensor",     "vector",
                                                       "scalar", "gpsimd", "collective", "sync"};
  fmt::print("nodes:          {}\n", stats.nodes);
  fmt::print("instructions:   {}\n", stats.instructions);
  for (size_t engine = 1; engine < 8; ++engine) {
    if (stats.instructions_per_engine[engine] == 0) continue;
    fmt::print("  {:<12}  {}\n", kEngineNames[engine], stats.instructions_per_engine[engine]);
  }
  fmt::print("semaphores:     {}\n", stats.semaphores);
  fmt::print("scratch peak:   {} bytes\n", stats.scratch_peak);
  fmt::print("scratch naive:  {} bytes (every buffer its own region)\n", stats.scratch_naive_sum);
  fmt::print("scratch live:   {} bytes (most bytes live at once: the lower bound)\n",
             stats.scratch_max_live);
  fmt::print("constants:      {} bytes\n", stats.constant_bytes);
  fmt::print("executable:     {} bytes\n", bytes);
  fmt::print("compile time:   {:.2f} ms\n", stats.compile_ms);
}

int Compile(const std::string& input, const std::string& output, bool print_stats) {
  absl::StatusOr<Graph> graph = Read(input);
  if (!graph.ok()) {
    fmt::print(stderr, "ternc: cannot read the graph file '{}': {}\n", input,
               std::string(graph.status().message()));
    return kUnreadableInput;
  }
  CompileStats stats;
  absl::StatusOr<std::vector<uint8_t>> executable = CompileGraph(*graph, CompileOptions{}, &stats);
  if (!executable.ok()) {
    fmt::print(stderr, "ternc: {} did not compile: {}\n", input,
               std::string(executable.status().message()));
    return kCompileError;
  }
  if (absl::Status status = WriteAtomically(output, *executable); !status.ok()) {
    fmt::print(stderr, "ternc: {}; nothing was written\n", std::string(status.message()));
    return kCompileError;
  }
  if (print_stats) PrintStats(stats, executable->size());
  return kOk;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return Usage("no command given");
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    fmt::print("{}\n{}", kUsageText, kHelpText);
    return kOk;
  }
  const std::string command = args[0];
  std::vector<std::string> paths;
  std::string output;
  bool stats = false;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "-o" || args[i] == "--output") {
      if (i + 1 >= args.size()) return Usage(fmt::format("{} needs a file name", args[i]));
      output = args[++i];
    } else if (args[i] == "--stats" && command == "compile") {
      stats = true;
    } else if (args[i] == "--help" || args[i] == "-h") {
      fmt::print("{}\n{}", kUsageText, kHelpText);
      return kOk;
    } else if (args[i].size() > 1 && args[i][0] == '-') {
      return Usage(fmt::format("unknown option '{}' for '{}'", args[i], command));
    } else {
      paths.push_back(args[i]);
    }
  }
  if (command == "compile") {
    if (paths.size() != 1) return Usage("compile takes exactly one graph file");
    if (output.empty()) return Usage("compile needs -o OUT.tern, the executable to write");
    return Compile(paths[0], output, stats);
  }
  if (command == "inspect") {
    if (paths.size() != 1) return Usage("inspect takes exactly one graph file");
    if (!output.empty()) return Usage("inspect prints to standard output; it takes no -o");
    return Inspect(paths[0]);
  }
  return Usage(fmt::format("unknown command '{}'", command));
}

}  // namespace
}  // namespace tern::compiler

int main(int argc, char** argv) { return tern::compiler::Main(argc, argv); }
