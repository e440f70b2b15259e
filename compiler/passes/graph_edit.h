// The rewrite every pass ends with (internal to compiler/passes): replace
// values by others, drop nodes and constants, and renumber what is left.
//
// Value ids are kept dense: a rewrite rebuilds the value, node and constant
// tables in their original relative order, skipping what was dropped, and
// appends nothing. So a pass's output numbers values 0..n-1 with inputs,
// constants and node outputs where they were, which keeps the result a
// deterministic function of the input graph. An edit that changes nothing
// leaves the graph untouched (same ids, same order).
#ifndef TERN_COMPILER_PASSES_GRAPH_EDIT_H_
#define TERN_COMPILER_PASSES_GRAPH_EDIT_H_

#include <absl/status/status.h>

#include <cstdint>
#include <vector>

#include "compiler/ir/graph.h"

namespace tern::compiler::passes_internal {

class GraphEdit {
 public:
  explicit GraphEdit(const Graph& graph)
      : replace_(graph.values.size(), kNoValue),
        drop_node_(graph.nodes.size(), false),
        drop_value_(graph.values.size(), false) {}

  // Every use of `from` (node inputs, graph outputs) becomes a use of `to`.
  // `to` may itself be replaced; chains are followed.
  void Replace(uint32_t from, uint32_t to);
  // Drops the node and its outputs (which nothing kept may still use).
  void DropNode(uint32_t node);
  // Drops a constant value (which nothing kept may still use).
  void DropConstant(uint32_t value);
  // The value that replaces `value` in the end (itself when not replaced).
  uint32_t Resolve(uint32_t value) const;
  bool changed() const { return changed_; }

  // Applies the edit to `graph` (the one the edit was made for, with any
  // values appended since). Fails, leaving the graph unchanged, when a kept
  // node or output would use a dropped value: a bug in the pass.
  absl::Status Apply(Graph* graph) const;

 private:
  std::vector<uint32_t> replace_;
  std::vector<bool> drop_node_;
  std::vector<bool> drop_value_;
  bool changed_ = false;
};

}  // namespace tern::compiler::passes_internal

#endif  // TERN_COMPILER_PASSES_GRAPH_EDIT_H_
