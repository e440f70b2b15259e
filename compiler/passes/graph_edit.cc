#include "compiler/passes/graph_edit.h"

#include <fmt/format.h>

#include <utility>

namespace tern::compiler::passes_internal {

void GraphEdit::Replace(uint32_t from, uint32_t to) {
  if (from >= replace_.size()) replace_.resize(from + 1, kNoValue);
  replace_[from] = to;
  changed_ = true;
}

void GraphEdit::DropNode(uint32_t node) {
  if (node >= drop_node_.size()) drop_node_.resize(node + 1, false);
  drop_node_[node] = true;
  changed_ = true;
}

void GraphEdit::DropConstant(uint32_t value) {
  if (value >= drop_value_.size()) drop_value_.resize(value + 1, false);
  drop_value_[value] = true;
  changed_ = true;
}

uint32_t GraphEdit::Resolve(uint32_t value) const {
  // Replacements always point at a value defined earlier or at a new
  // constant, so chains are short and end.
  while (value != kNoValue && value < replace_.size() && replace_[value] != kNoValue) {
    value = replace_[value];
  }
  return value;
}

absl::Status GraphEdit::Apply(Graph* graph) const {
  if (!changed_) return absl::OkStatus();
  const size_t value_count = graph->values.size();
  auto node_dropped = [&](uint32_t n) { return n < drop_node_.size() && drop_node_[n]; };
  auto value_dropped = [&](uint32_t id) {
    const Value& value = graph->values[id];
    switch (value.kind) {
      case Value::kInput:
        return false;
      case Value::kConstant:
        return id < drop_value_.size() && drop_value_[id];
      default:
        return node_dropped(value.node);
    }
  };

  // New ids: surviving values, nodes and constants in their original order.
  std::vector<uint32_t> new_id(value_count, kNoValue);
  std::vector<uint32_t> new_node(graph->nodes.size(), kNoValue);
  std::vector<uint32_t> new_constant(graph->constants.size(), kNoValue);
  uint32_t next_value = 0, next_node = 0, next_constant = 0;
  for (uint32_t n = 0; n < graph->nodes.size(); ++n) {
    if (!node_dropped(n)) new_node[n] = next_node++;
  }
  for (uint32_t id = 0; id < value_count; ++id) {
    if (value_dropped(id)) continue;
    new_id[id] = next_value++;
    const Value& value = graph->values[id];
    if (value.kind == Value::kConstant && new_constant[value.index] == kNoValue) {
      new_constant[value.index] = next_constant++;
    }
  }
  // A use's new id; false when it resolves to a dropped value.
  auto map = [&](uint32_t id, uint32_t* out) {
    if (id == kNoValue) {
      *out = kNoValue;
      return true;
    }
    const uint32_t resolved = Resolve(id);
    if (resolved >= value_count || new_id[resolved] == kNoValue) return false;
    *out = new_id[resolved];
    return true;
  };
  auto dangling = [&](const std::string& user, uint32_t id) {
    const uint32_t resolved = Resolve(id);
    return absl::InternalError(fmt::format(
        "graph pass: {} still uses value {} ('{}'), which the pass dropped", user, resolved,
        resolved < value_count ? graph->values[resolved].name : std::string("?")));
  };

  // Check and map every use before touching the graph.
  std::vector<std::vector<uint32_t>> node_inputs;
  node_inputs.reserve(next_node);
  for (uint32_t n = 0; n < graph->nodes.size(); ++n) {
    if (node_dropped(n)) continue;
    const Node& node = graph->nodes[n];
    std::vector<uint32_t> inputs(node.inputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!map(node.inputs[i], &inputs[i])) return dangling(DescribeNode(node), node.inputs[i]);
    }
    node_inputs.push_back(std::move(inputs));
  }
  std::vector<uint32_t> output_values(graph->outputs.size());
  for (size_t i = 0; i < graph->outputs.size(); ++i) {
    const Graph::Output& output = graph->outputs[i];
    if (!map(output.value, &output_values[i])) {
      return dangling(fmt::format("output '{}'", output.name), output.value);
    }
  }

  std::vector<Value> values;
  values.reserve(next_value);
  for (uint32_t id = 0; id < value_count; ++id) {
    if (new_id[id] == kNoValue) continue;
    Value value = std::move(graph->values[id]);
    if (value.kind == Value::kNode) value.node = new_node[value.node];
    if (value.kind == Value::kConstant) value.index = new_constant[value.index];
    values.push_back(std::move(value));
  }
  std::vector<Node> nodes;
  nodes.reserve(next_node);
  size_t kept = 0;
  for (uint32_t n = 0; n < graph->nodes.size(); ++n) {
    if (node_dropped(n)) continue;
    Node node = std::move(graph->nodes[n]);
    node.inputs = std::move(node_inputs[kept++]);
    for (uint32_t& id : node.outputs) id = new_id[id];
    nodes.push_back(std::move(node));
  }
  std::vector<std::vector<uint8_t>> constants(next_constant);
  for (uint32_t c = 0; c < graph->constants.size(); ++c) {
    if (new_constant[c] != kNoValue) constants[new_constant[c]] = std::move(graph->constants[c]);
  }
  for (uint32_t& id : graph->inputs) id = new_id[id];
  for (size_t i = 0; i < graph->outputs.size(); ++i) graph->outputs[i].value = output_values[i];
  graph->values = std::move(values);
  graph->nodes = std::move(nodes);
  graph->constants = std::move(constants);
  return absl::OkStatus();
}

}  // namespace tern::compiler::passes_internal
