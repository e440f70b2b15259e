#include "compiler/passes/pipeline.h"

#include <fmt/format.h>

#include <chrono>

#include "compiler/ir/verify.h"
#include "compiler/passes/cse.h"
#include "compiler/passes/dead_code.h"
#include "compiler/passes/patterns.h"

namespace tern::compiler {
namespace {

uint64_t ConstantBytes(const Graph& graph) {
  uint64_t bytes = 0;
  for (const std::vector<uint8_t>& constant : graph.constants) bytes += constant.size();
  return bytes;
}

absl::Status Internal(const char* pass, const absl::Status& status) {
  return absl::InternalError(fmt::format("{} (in the {} pass; please report this graph)",
                                         std::string(status.message()), pass));
}

}  // namespace

absl::StatusOr<Graph> OptimizeGraph(const Graph& graph, const PassOptions& options,
                                    PassStats* stats) {
  Graph g = graph;
  if (absl::Status status = OptimizeGraphInPlace(&g, options, stats); !status.ok()) return status;
  return g;
}

absl::Status OptimizeGraphInPlace(Graph* graph, const PassOptions& options, PassStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  PassStats local;
  PassStats& s = stats != nullptr ? *stats : local;
  s = PassStats{};
  Graph& g = *graph;
  s.nodes_before = static_cast<uint32_t>(g.nodes.size());
  s.constant_bytes_before = ConstantBytes(g);
  if (absl::Status status = VerifyGraph(g); !status.ok()) return status;
  if (!options.bindings.empty() || options.require_static) {
    const size_t symbols = g.symbols.size();
    BindOptions bind;
    bind.require_static = options.require_static;
    if (absl::Status status = BindSymbolsInPlace(&g, options.bindings, bind); !status.ok()) {
      return status;
    }
    s.symbols_bound = static_cast<uint32_t>(symbols - g.symbols.size());
  }
  for (uint32_t round = 0; round < options.max_iterations; ++round) {
    ++s.iterations;
    bool changed = false;
    if (options.patterns) {
      absl::StatusOr<PatternStats> patterns = ReplacePatterns(&g);
      if (!patterns.ok()) return Internal("pattern replacement", patterns.status());
      s.patterns_replaced += patterns->replaced();
      changed = changed || patterns->replaced() > 0;
    }
    if (options.fold) {
      absl::StatusOr<FoldStats> fold = FoldConstants(&g, options.fold_options);
      if (!fold.ok()) return Internal("constant folding", fold.status());
      s.nodes_folded += fold->nodes_folded;
      // A declined node is declined again each round: count the last.
      s.folds_declined = fold->declined_too_large + fold->declined_inexact;
      changed = changed || fold->nodes_folded > 0;
    }
    if (options.cse) {
      absl::StatusOr<CseStats> cse = EliminateCommonSubexpressions(&g);
      if (!cse.ok()) return Internal("common-subexpression elimination", cse.status());
      s.nodes_merged += cse->nodes_merged;
      s.constants_merged += cse->constants_merged;
      changed = changed || cse->nodes_merged > 0 || cse->constants_merged > 0;
    }
    if (options.dce) {
      absl::StatusOr<DeadCodeStats> dce = EliminateDeadCode(&g);
      if (!dce.ok()) return Internal("dead-code elimination", dce.status());
      s.nodes_removed += dce->nodes_removed;
      s.constants_removed += dce->constants_removed;
      changed = changed || dce->nodes_removed > 0 || dce->constants_removed > 0;
    }
    if (!changed) break;
  }
  if (absl::Status status = VerifyGraph(g); !status.ok()) {
    return Internal("graph optimisation", status);
  }
  s.nodes_after = static_cast<uint32_t>(g.nodes.size());
  s.constant_bytes_after = ConstantBytes(g);
  s.optimize_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

}  // namespace tern::compiler
