#include "compiler/passes/constant_fold.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "compiler/passes/graph_edit.h"
#include "compiler/passes/host_eval.h"

namespace tern::compiler {
namespace {

using passes_internal::HostTensor;

// Bytes of a value of static shape.
uint64_t TypeBytes(const TensorType& type) {
  const std::optional<int64_t> elements = ConstantElements(type.shape);
  return elements ? static_cast<uint64_t>(*elements) * tern_dtype_size(type.dtype) : UINT64_MAX;
}

}  // namespace

absl::StatusOr<FoldStats> FoldConstants(Graph* graph, const FoldOptions& options) {
  const Graph& g = *graph;
  const size_t node_count = g.nodes.size();
  FoldStats stats;

  // 1. Which nodes could fold, from types alone: an op the evaluator knows,
  //    one output of static shape, every input a constant or the output of
  //    such a node, within the size limits.
  std::vector<bool> constant_like(g.values.size(), false);
  for (uint32_t id = 0; id < g.values.size(); ++id) {
    constant_like[id] = g.values[id].kind == Value::kConstant;
  }
  std::vector<bool> candidate(node_count, false);
  for (uint32_t n = 0; n < node_count; ++n) {
    const Node& node = g.nodes[n];
    if (node.outputs.size() != 1 || !passes_internal::CanEvaluate(node.op)) continue;
    const TensorType& out = g.values[node.outputs[0]].type;
    if (!ConstantElements(out.shape)) continue;
    bool all_constant = !node.inputs.empty() && node.inputs[0] != kNoValue;
    uint64_t input_bytes = 0;
    for (size_t i = 0; i < node.inputs.size() && all_constant; ++i) {
      const uint32_t id = node.inputs[i];
      if (id == kNoValue) continue;
      all_constant = constant_like[id];
      const bool repeated =
          std::find(node.inputs.begin(), node.inputs.begin() + i, id) != node.inputs.begin() + i;
      if (!repeated) input_bytes += TypeBytes(g.values[id].type);
    }
    if (!all_constant) continue;
    const uint64_t bytes = TypeBytes(out);
    const unsigned __int128 limit =
        static_cast<unsigned __int128>(options.max_growth) * input_bytes;
    if (bytes > options.max_bytes || bytes > limit) {
      ++stats.declined_too_large;
      continue;
    }
    candidate[n] = true;
    constant_like[node.outputs[0]] = true;
  }

  // 2. Which to replace by a constant (computing nodes; layout-only ones
  //    too with fold_layout_leaves), and which to evaluate: those and the
  //    candidates they read.
  std::vector<bool> replace(node_count, false), evaluate(node_count, false);
  for (size_t n = node_count; n-- > 0;) {
    if (!candidate[n]) continue;
    const Node& node = g.nodes[n];
    replace[n] = options.fold_layout_leaves || !passes_internal::IsLayoutOnly(node, g);
    evaluate[n] = evaluate[n] || replace[n];
    if (!evaluate[n]) continue;
    for (uint32_t id : node.inputs) {
      if (id != kNoValue && g.values[id].kind == Value::kNode) evaluate[g.values[id].node] = true;
    }
  }

  // 3. Evaluate in order. Results of nodes that are only read by folded
  //    nodes live in `results`; a declined evaluation leaves its readers
  //    unfolded.
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> results(g.values.size());
  std::vector<std::pair<uint32_t, std::shared_ptr<const std::vector<uint8_t>>>> folded;
  std::vector<HostTensor> inputs;
  for (uint32_t n = 0; n < node_count; ++n) {
    if (!evaluate[n]) continue;
    const Node& node = g.nodes[n];
    inputs.assign(node.inputs.size(), HostTensor{});
    bool ready = true;
    for (size_t i = 0; i < node.inputs.size() && ready; ++i) {
      const uint32_t id = node.inputs[i];
      if (id == kNoValue) continue;
      const Value& value = g.values[id];
      HostTensor& in = inputs[i];
      in.dtype = value.type.dtype;
      for (const Dim& d : value.type.shape) in.shape.push_back(*d.constant());
      if (value.kind == Value::kConstant) {
        in.data = g.constants[value.index].data();
        in.size = g.constants[value.index].size();
      } else if (results[id] != nullptr) {
        in.data = results[id]->data();
        in.size = results[id]->size();
      } else {
        ready = false;  // its producer declined
      }
    }
    if (!ready) continue;
    const TensorType& out = g.values[node.outputs[0]].type;
    std::optional<std::vector<uint8_t>> result = passes_internal::Evaluate(g, node, inputs, out);
    if (!result || result->size() != TypeBytes(out)) {
      if (replace[n]) ++stats.declined_inexact;
      continue;
    }
    auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(*result));
    results[node.outputs[0]] = shared;
    if (replace[n]) folded.emplace_back(n, std::move(shared));
  }
  if (folded.empty()) return stats;

  // 4. Each folded node becomes a constant named after its value.
  passes_internal::GraphEdit edit(*graph);
  const size_t values_before = graph->values.size(), constants_before = graph->constants.size();
  for (auto& [n, bytes] : folded) {
    const uint32_t output = graph->nodes[n].outputs[0];
    const Value value = graph->values[output];
    const uint32_t constant = graph->AddConstant(value.name, value.type, *bytes);
    edit.Replace(output, constant);
    edit.DropNode(n);
    ++stats.nodes_folded;
  }
  if (absl::Status status = edit.Apply(graph); !status.ok()) {
    graph->values.resize(values_before);
    graph->constants.resize(constants_before);
    return status;
  }
  return stats;
}

}  // namespace tern::compiler
