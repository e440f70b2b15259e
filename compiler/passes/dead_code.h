// Dead-code elimination: drops every node none of whose outputs reaches a
// graph output, and every constant nothing reads.
//
// Roots are Graph::outputs; a mutation (Graph::mutations) names an output,
// so whatever a mutation writes back is live too. A node with several
// outputs stays whole when one of them is live. Graph inputs always stay:
// they are the executable's signature. Nodes have no side effects in core
// ATen graphs (graph.h), so reachability is the whole criterion.
//
// Value ids: the graph is rebuilt with the survivors in their original
// order and renumbered densely (values, nodes, constants); a graph with
// nothing dead is left as it is.
#ifndef TERN_COMPILER_PASSES_DEAD_CODE_H_
#define TERN_COMPILER_PASSES_DEAD_CODE_H_

#include <absl/status/statusor.h>

#include <cstdint>

#include "compiler/ir/graph.h"

namespace tern::compiler {

struct DeadCodeStats {
  uint32_t nodes_removed = 0;
  uint32_t constants_removed = 0;
};

// Removes dead nodes and unread constants from `graph` (which should have
// passed VerifyGraph). Fails only on an internal inconsistency, leaving the
// graph unchanged.
// Thread-safety: touches only `graph`.
absl::StatusOr<DeadCodeStats> EliminateDeadCode(Graph* graph);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_PASSES_DEAD_CODE_H_
