#include "compiler/passes/dead_code.h"

#include <vector>

#include "compiler/passes/graph_edit.h"

namespace tern::compiler {

absl::StatusOr<DeadCodeStats> EliminateDeadCode(Graph* graph) {
  std::vector<bool> live(graph->values.size(), false);
  for (const Graph::Output& output : graph->outputs) {
    if (output.value < live.size()) live[output.value] = true;
  }
  passes_internal::GraphEdit edit(*graph);
  DeadCodeStats stats;
  // Nodes are topological: walking them backwards sees every use of a value
  // before the node that makes it.
  for (size_t n = graph->nodes.size(); n-- > 0;) {
    const Node& node = graph->nodes[n];
    bool used = false;
    for (uint32_t id : node.outputs) used = used || live[id];
    if (!used) {
      edit.DropNode(static_cast<uint32_t>(n));
      ++stats.nodes_removed;
      continue;
    }
    for (uint32_t id : node.inputs) {
      if (id != kNoValue) live[id] = true;
    }
  }
  for (uint32_t id = 0; id < graph->values.size(); ++id) {
    if (graph->values[id].kind == Value::kConstant && !live[id]) {
      edit.DropConstant(id);
      ++stats.constants_removed;
    }
  }
  if (absl::Status status = edit.Apply(graph); !status.ok()) return status;
  return stats;
}

}  // namespace tern::compiler
