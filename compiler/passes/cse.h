// Common-subexpression elimination: of two nodes with the same op, the same
// inputs (after earlier merges) and equal attributes, the later one goes and
// its outputs are replaced by the earlier one's; of two constants with the
// same dtype, shape and bytes, the later one goes.
//
// Attributes are compared exactly (a double by its bits, so 0.0 and -0.0
// differ). Ops that draw random numbers or have side effects are never
// merged (MayMerge); the op table (ops.h) has no marker for them, so they
// are recognised by name. One pass in topological order merges whole
// duplicated chains: a node whose inputs were merged is compared with the
// merged inputs.
//
// Value ids: as dead_code.h, the survivors renumbered in their original
// order; nothing merged leaves the graph as it is.
#ifndef TERN_COMPILER_PASSES_CSE_H_
#define TERN_COMPILER_PASSES_CSE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <string_view>

#include "compiler/ir/graph.h"

namespace tern::compiler {

struct CseStats {
  uint32_t nodes_merged = 0;
  uint32_t constants_merged = 0;
};

// Whether two nodes of this op with equal inputs and attributes may be
// merged: false for ops that draw random numbers (rand*, dropout,
// bernoulli, normal, uniform, multinomial, ...), that leave memory
// uninitialised (empty*), that mutate (an in-place name such as add_) or
// that have other side effects (_assert*, print, ...). Every op the table
// knows today may be merged.
// Thread-safety: a pure function.
bool MayMerge(std::string_view op);

// Merges duplicate nodes and constants of `graph` (which should have passed
// VerifyGraph). Fails only on an internal inconsistency, leaving the graph
// unchanged.
// Thread-safety: touches only `graph`.
absl::StatusOr<CseStats> EliminateCommonSubexpressions(Graph* graph);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_PASSES_CSE_H_
