// ternc: the compiler's command line.
//
//   ternc compile GRAPH.ternir -o OUT.tern [--stats] [--no-cache]
//                 [--bind NAME=VALUE[,NAME=VALUE...]] [--no-optimize]
//   ternc inspect GRAPH.ternir
//   ternc cache ls|stats|clear|verify
//   ternc --help
//
// Exit status: 0 ok, 1 the graph did not compile (or the output could not
// be written, or a cache command failed or found bad entries), 3 the input
// could not be read as a graph file, 64 bad usage.
#include <absl/status/status.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "compiler/cache/compile_cache.h"
#include "compiler/graph_file/graph_file.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/ops.h"
#include "compiler/lower/compile.h"
#include "compiler/passes/pipeline.h"
#include "tern/isa.h"

namespace tern::compiler {
namespace {

enum ExitCode { kOk = 0, kCompileError = 1, kUnreadableInput = 3, kUsage = 64 };

constexpr std::string_view kUsageText =
    "usage: ternc compile GRAPH.ternir -o OUT.tern [--stats] [--no-cache]\n"
    "                     [--bind NAME=VALUE[,NAME=VALUE...]] [--no-optimize] [--no-fusion]\n"
    "       ternc inspect GRAPH.ternir\n"
    "       ternc cache ls|stats|clear|verify\n"
    "       ternc ops\n"
    "       ternc --help\n";

constexpr std::string_view kHelpText =
    "ternc compiles a model graph (a .ternir graph file, docs/graph-format.md) into one\n"
    "tern executable (docs/executable-format.md) with a function \"forward\" whose inputs\n"
    "and outputs are the graph's. Run it with examples/run_model.\n"
    "\n"
    "commands:\n"
    "  compile GRAPH -o OUT   compile GRAPH and write the executable to OUT (replaced\n"
    "                         atomically); --stats prints instructions per engine,\n"
    "                         semaphores, scratch memory, the compile time and whether\n"
    "                         the compile cache had it; --no-cache compiles without\n"
    "                         the cache. The graph is optimised first (decomposed\n"
    "                         GELU and norms made single ops again, constant\n"
    "                         folding, common-subexpression and dead-code\n"
    "                         elimination); --no-optimize compiles it as it is.\n"
    "                         --no-fusion emits one instruction per operation (no\n"
    "                         epilogues, no elementwise programs): executables that a\n"
    "                         tern without those ISA features loads\n"
    "                         --bind s0=128,s1=4 (repeatable) gives symbolic sizes\n"
    "                         their values (then every symbol the graph uses must be\n"
    "                         bound)\n"
    "  inspect GRAPH          print the graph: symbols, inputs, outputs, nodes\n"
    "  cache ls               list the compile cache's entries\n"
    "  cache stats            entries, bytes, and hits and misses since the last clear\n"
    "  cache clear            remove every entry\n"
    "  cache verify           check every entry; remove (and list) the bad ones\n"
    "  ops                    list the operators the compiler knows, one per line\n"
    "\n"
    "The compile cache lives in $TERN_COMPILE_CACHE_DIR, else\n"
    "$XDG_CACHE_HOME/tern/compile, else ~/.cache/tern/compile.\n"
    "\n"
    "exit status: 0 ok, 1 the graph did not compile (or a cache command failed, or\n"
    "verify found bad entries), 3 the input could not be read, 64 bad usage.\n"
    "docs/compiler.md describes what is compiled and how.\n";

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

void PrintStats(const CompileStats& stats, uint64_t bytes, CacheOutcome cache) {
  static constexpr std::string_view kEngineNames[8] = {"",       "dma",    "tensor",     "vector",
                                                       "scalar", "gpsimd", "collective", "sync"};
  fmt::print("nodes:          {}\n", stats.nodes);
  fmt::print("instructions:   {}\n", stats.instructions);
  for (size_t engine = 1; engine < 8; ++engine) {
    if (stats.instructions_per_engine[engine] == 0) continue;
    fmt::print("  {:<12}  {}\n", kEngineNames[engine], stats.instructions_per_engine[engine]);
  }
  fmt::print(
      "fusion:         {} compute instructions from {} ({} matmul/conv epilogues, {} "
      "elementwise programs of {} instructions)\n",
      stats.compute_instructions, stats.compute_instructions_unfused, stats.epilogues,
      stats.fused_groups, stats.fused_members);
  if (stats.mutations_in_place + stats.mutations_copied > 0) {
    fmt::print("mutations:      {} written in place, {} copied into their inputs at the end\n",
               stats.mutations_in_place, stats.mutations_copied);
  }
  fmt::print("semaphores:     {}\n", stats.semaphores);
  fmt::print("scratch peak:   {} bytes\n", stats.scratch_peak);
  fmt::print("scratch naive:  {} bytes (every buffer its own region)\n", stats.scratch_naive_sum);
  fmt::print("scratch live:   {} bytes (most bytes live at once: the lower bound)\n",
             stats.scratch_max_live);
  fmt::print("constants:      {} bytes\n", stats.constant_bytes);
  fmt::print("executable:     {} bytes\n", bytes);
  fmt::print("compile time:   {:.2f} ms\n", stats.compile_ms);
  fmt::print("cache: {}\n", CacheOutcomeName(cache));
}

void PrintPassStats(const PassStats& stats, bool optimized) {
  if (!optimized) {
    fmt::print("passes:         off (--no-optimize); {} symbols bound\n", stats.symbols_bound);
    return;
  }
  fmt::print(
      "passes:         {} -> {} nodes: {} patterns replaced, {} folded, {} merged, {} removed; {} "
      "constants merged, {} removed ({} -> {} bytes); {} symbols bound; {:.2f} ms\n",
      stats.nodes_before, stats.nodes_after, stats.patterns_replaced, stats.nodes_folded,
      stats.nodes_merged, stats.nodes_removed, stats.constants_merged, stats.constants_removed,
      stats.constant_bytes_before, stats.constant_bytes_after, stats.symbols_bound,
      stats.optimize_ms);
}

struct CompileArgs {
  std::string input, output;
  bool print_stats = false;
  bool use_cache = true;
  bool optimize = true;
  bool fusion = true;
  SymbolBindings bindings;
};

int Compile(const CompileArgs& args) {
  const std::string& input = args.input;
  absl::StatusOr<Graph> graph = Read(input);
  if (!graph.ok()) {
    fmt::print(stderr, "ternc: cannot read the graph file '{}': {}\n", input,
               std::string(graph.status().message()));
    return kUnreadableInput;
  }
  // Bind (every used symbol, when --bind is given), then optimise.
  PassOptions passes;
  passes.bindings = args.bindings;
  passes.require_static = !args.bindings.empty();
  passes.patterns = passes.fold = passes.cse = passes.dce = args.optimize;
  PassStats pass_stats;
  if (absl::Status status = OptimizeGraphInPlace(&*graph, passes, &pass_stats); !status.ok()) {
    fmt::print(stderr, "ternc: {} did not compile: {}\n", input, std::string(status.message()));
    return kCompileError;
  }
  CompileOptions options;
  options.fusion = args.fusion;
  CompileStats stats;
  CacheReport cache;
  absl::StatusOr<std::vector<uint8_t>> executable =
      args.use_cache ? CompileCached(*graph, options, &stats, &cache)
                     : CompileGraph(*graph, options, &stats);
  if (!executable.ok()) {
    const std::string message(executable.status().message());
    if (message.starts_with("compile cache:")) {
      fmt::print(stderr, "ternc: {}; --no-cache compiles {} without the cache\n", message, input);
    } else if (!graph->symbols.empty()) {
      std::vector<std::string> symbols;
      for (const Symbol& symbol : graph->symbols) {
        symbols.push_back(fmt::format("{} in [{}, {}]", symbol.name, symbol.min, symbol.max));
      }
      fmt::print(stderr,
                 "ternc: {} did not compile: {}; --bind NAME=VALUE gives the graph's symbolic "
                 "sizes ({}) values\n",
                 input, message, fmt::join(symbols, ", "));
    } else {
      fmt::print(stderr, "ternc: {} did not compile: {}\n", input, message);
    }
    return kCompileError;
  }
  if (!cache.store_error.empty()) {
    fmt::print(stderr, "ternc: warning: the executable was not stored in the compile cache: {}\n",
               cache.store_error);
  }
  if (absl::Status status = WriteAtomically(args.output, *executable); !status.ok()) {
    fmt::print(stderr, "ternc: {}; nothing was written\n", std::string(status.message()));
    return kCompileError;
  }
  if (args.print_stats) {
    PrintPassStats(pass_stats, args.optimize);
    PrintStats(stats, executable->size(), cache.outcome);
  }
  return kOk;
}

// Adds "s0=128,s1=4" to `bindings`; an error for usage otherwise.
absl::Status ParseBindings(const std::string& text, SymbolBindings* bindings) {
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t equals = item.find('=');
    int64_t value = 0;
    const char* digits = item.data() + (equals == std::string::npos ? 0 : equals + 1);
    const char* end = item.data() + item.size();
    const auto parsed = std::from_chars(digits, end, value);
    if (equals == std::string::npos || equals == 0 || digits == end || parsed.ec != std::errc() ||
        parsed.ptr != end) {
      return absl::InvalidArgumentError(fmt::format(
          "--bind takes NAME=VALUE pairs separated by commas (s0=128,s1=4); '{}' is not one",
          item));
    }
    if (!bindings->emplace(item.substr(0, equals), value).second) {
      return absl::InvalidArgumentError(
          fmt::format("--bind gives '{}' a value twice", item.substr(0, equals)));
    }
    start = comma + 1;
  }
  return absl::OkStatus();
}

// "3 min", for an entry's age.
std::string AgeText(int64_t modified) {
  const int64_t seconds = std::max<int64_t>(0, static_cast<int64_t>(std::time(nullptr)) - modified);
  if (seconds < 120) return fmt::format("{} s", seconds);
  if (seconds < 2 * 3600) return fmt::format("{} min", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{} h", seconds / 3600);
  return fmt::format("{} days", seconds / 86400);
}

int CacheFailure(const absl::Status& status) {
  fmt::print(stderr, "ternc: {}\n", std::string(status.message()));
  return kCompileError;
}

int CacheList() {
  absl::StatusOr<std::string> directory = OpenCacheDirectory({});
  if (!directory.ok()) return CacheFailure(directory.status());
  absl::StatusOr<std::vector<CacheEntryInfo>> entries = ListEntries();
  if (!entries.ok()) return CacheFailure(entries.status());
  if (entries->empty()) {
    fmt::print("the compile cache {} is empty\n", *directory);
    return kOk;
  }
  fmt::print("{} entries in {}:\n", entries->size(), *directory);
  for (const CacheEntryInfo& entry : *entries) {
    if (!entry.readable) {
      fmt::print("  {}  {} bytes  {} old  unreadable header (ternc cache verify removes it)\n",
                 entry.file, entry.bytes, AgeText(entry.modified_unix_seconds));
      continue;
    }
    fmt::print("  {}  {} bytes  {} old  {}  graph {:016x}  ({}) -> ({}){}\n", entry.file,
               entry.bytes, AgeText(entry.modified_unix_seconds), entry.target, entry.graph_hash,
               fmt::join(entry.input_names, ", "), fmt::join(entry.output_names, ", "),
               entry.compiler_version == kCompilerVersion
                   ? ""
                   : fmt::format("  from '{}', never served", entry.compiler_version));
  }
  return kOk;
}

int CacheSummaryCommand() {
  absl::StatusOr<CacheSummary> summary = CacheStats();
  if (!summary.ok()) return CacheFailure(summary.status());
  fmt::print("directory:   {}\n", summary->directory);
  fmt::print("entries:     {} ({} bytes)\n", summary->entries, summary->bytes);
  fmt::print("outcomes:    {} hits, {} misses, {} waited, {} repaired (since the last clear)\n",
             summary->hits, summary->misses, summary->waited, summary->repaired);
  fmt::print("temporary:   {} files (left by killed writers; removed when ten minutes old)\n",
             summary->temporary_files);
  fmt::print("lock files:  {}\n", summary->lock_files);
  return kOk;
}

int CacheClear() {
  absl::StatusOr<std::string> directory = OpenCacheDirectory({});
  if (!directory.ok()) return CacheFailure(directory.status());
  absl::StatusOr<ClearResult> cleared = ClearCache();
  if (!cleared.ok()) return CacheFailure(cleared.status());
  fmt::print("removed {} entries ({} bytes) and {} other files from {}\n", cleared->entries_removed,
             cleared->bytes_removed, cleared->other_files_removed, *directory);
  return kOk;
}

int CacheVerify() {
  absl::StatusOr<VerifyResult> verified = VerifyCache();
  if (!verified.ok()) return CacheFailure(verified.status());
  for (const VerifyResult::Bad& bad : verified->removed) {
    fmt::print("removed {}: {}\n", bad.file, bad.problem);
  }
  fmt::print("checked {} entries: {} good, {} bad (removed); {} stale temporary files removed\n",
             verified->entries_checked, verified->entries_good, verified->removed.size(),
             verified->stale_temporaries_removed);
  return verified->removed.empty() ? kOk : kCompileError;
}

int Cache(const std::vector<std::string>& args) {
  if (args.size() != 2) return Usage("cache takes one of ls, stats, clear, verify");
  if (args[1] == "ls") return CacheList();
  if (args[1] == "stats") return CacheSummaryCommand();
  if (args[1] == "clear") return CacheClear();
  if (args[1] == "verify") return CacheVerify();
  return Usage(fmt::format("unknown cache command '{}' (ls, stats, clear, verify)", args[1]));
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return Usage("no command given");
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    fmt::print("{}\n{}", kUsageText, kHelpText);
    return kOk;
  }
  const std::string command = args[0];
  if (command == "cache") return Cache(args);
  if (command == "ops") {
    if (args.size() != 1) return Usage("ops takes no arguments");
    for (std::string_view name : tern::compiler::KnownOps()) fmt::print("{}\n", name);
    return kOk;
  }
  std::vector<std::string> paths;
  std::string output;
  CompileArgs compile;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "-o" || args[i] == "--output") {
      if (i + 1 >= args.size()) return Usage(fmt::format("{} needs a file name", args[i]));
      output = args[++i];
    } else if (args[i] == "--stats" && command == "compile") {
      compile.print_stats = true;
    } else if (args[i] == "--no-cache" && command == "compile") {
      compile.use_cache = false;
    } else if (args[i] == "--no-optimize" && command == "compile") {
      compile.optimize = false;
    } else if (args[i] == "--no-fusion" && command == "compile") {
      compile.fusion = false;
    } else if (args[i] == "--bind" && command == "compile") {
      if (i + 1 >= args.size()) return Usage("--bind needs NAME=VALUE (s0=128,s1=4)");
      if (absl::Status status = ParseBindings(args[++i], &compile.bindings); !status.ok()) {
        return Usage(std::string(status.message()));
      }
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
    compile.input = paths[0];
    compile.output = output;
    return Compile(compile);
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
