// The optimisation pipeline: symbol binding (when asked), then pattern
// replacement (patterns.h: written-out GELU, RMSNorm, softmax and LayerNorm
// become single ops), constant folding, common-subexpression elimination and
// dead-code elimination, repeated until nothing changes (at most
// `max_iterations` rounds).
//
// ternc compile runs it before CompileGraph (--bind, --no-optimize); it is
// meant to be callable from CompileGraph too, so it is idempotent: the
// output of OptimizeGraph optimised again is the same graph. Deterministic:
// the same graph and options give the same output graph (same GraphHash),
// whatever the process. The output passes VerifyGraph (checked before it is
// returned).
#ifndef TERN_COMPILER_PASSES_PIPELINE_H_
#define TERN_COMPILER_PASSES_PIPELINE_H_

#include <absl/status/statusor.h>

#include <cstdint>

#include "compiler/ir/graph.h"
#include "compiler/passes/bind_symbols.h"
#include "compiler/passes/constant_fold.h"

namespace tern::compiler {

struct PassOptions {
  SymbolBindings bindings;      // bound first, when not empty
  bool require_static = false;  // fail when a used symbol stays unbound
  bool patterns = true;         // pattern replacement (patterns.h)
  bool fold = true;             // constant folding
  bool cse = true;              // common-subexpression elimination
  bool dce = true;              // dead-code elimination
  FoldOptions fold_options;
  uint32_t max_iterations = 4;  // rounds of patterns, fold, CSE, DCE
};

struct PassStats {
  uint32_t symbols_bound = 0;
  uint32_t patterns_replaced = 0;  // chains replaced by one op (patterns.h)
  uint32_t nodes_folded = 0;       // replaced by constants
  uint32_t folds_declined = 0;     // all-constant nodes left: size limits or inexact
  uint32_t nodes_merged = 0;       // by CSE
  uint32_t constants_merged = 0;   // by CSE
  uint32_t nodes_removed = 0;      // by DCE
  uint32_t constants_removed = 0;  // by DCE
  uint32_t iterations = 0;         // rounds run (the last one changed nothing, or the bound)
  uint32_t nodes_before = 0, nodes_after = 0;
  uint64_t constant_bytes_before = 0, constant_bytes_after = 0;
  double optimize_ms = 0.0;
};

// Verifies `graph`, runs the pipeline on a copy and verifies the result.
// Errors: the graph's own (VerifyGraph's message), a binding error
// (bind_symbols.h), or an internal error naming the pass. `stats` may be
// null.
// Thread-safety: a pure function of its arguments; callable concurrently.
absl::StatusOr<Graph> OptimizeGraph(const Graph& graph, const PassOptions& options,
                                    PassStats* stats);

// The same on `graph` itself, without copying its constants (for a caller
// that owns the graph, such as CompileGraph). On a verification or binding
// error the graph is unchanged; after an internal error it may be partly
// optimised.
// Thread-safety: touches only `graph` and `stats`.
absl::Status OptimizeGraphInPlace(Graph* graph, const PassOptions& options, PassStats* stats);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_PASSES_PIPELINE_H_
