#include "compiler/ir/graph.h"

#include <fmt/format.h>

#include <algorithm>

namespace tern::compiler {

uint32_t Graph::AddInput(std::string name, TensorType type) {
  Value value;
  value.kind = Value::kInput;
  value.type = std::move(type);
  value.name = std::move(name);
  value.index = static_cast<uint32_t>(inputs.size());
  values.push_back(std::move(value));
  inputs.push_back(static_cast<uint32_t>(values.size() - 1));
  return inputs.back();
}

uint32_t Graph::AddConstant(std::string name, TensorType type, std::vector<uint8_t> bytes) {
  Value value;
  value.kind = Value::kConstant;
  value.type = std::move(type);
  value.name = std::move(name);
  value.index = static_cast<uint32_t>(constants.size());
  constants.push_back(std::move(bytes));
  values.push_back(std::move(value));
  return static_cast<uint32_t>(values.size() - 1);
}

uint32_t Graph::AddNodeWithTypes(std::string op, std::vector<uint32_t> node_inputs,
                                 std::vector<Attribute> attrs,
                                 const std::vector<TensorType>& output_types, std::string name,
                                 std::string source) {
  const uint32_t index = static_cast<uint32_t>(nodes.size());
  Node node;
  node.op = std::move(op);
  node.inputs = std::move(node_inputs);
  node.attrs = std::move(attrs);
  std::sort(node.attrs.begin(), node.attrs.end(),
            [](const Attribute& a, const Attribute& b) { return a.name < b.name; });
  node.name = name.empty() ? fmt::format("node{}", index) : std::move(name);
  node.source = std::move(source);
  for (size_t i = 0; i < output_types.size(); ++i) {
    Value value;
    value.kind = Value::kNode;
    value.type = output_types[i];
    value.name = output_types.size() == 1 ? node.name : fmt::format("{}.{}", node.name, i);
    value.node = index;
    value.index = static_cast<uint32_t>(i);
    values.push_back(std::move(value));
    node.outputs.push_back(static_cast<uint32_t>(values.size() - 1));
  }
  nodes.push_back(std::move(node));
  return index;
}

const Attribute* FindAttr(const Node& node, const std::string& name) {
  for (const Attribute& attr : node.attrs) {
    if (attr.name == name) return &attr;
  }
  return nullptr;
}

std::string DescribeNode(const Node& node) {
  return node.source.empty() ? fmt::format("node '{}' ({})", node.name, node.op)
                             : fmt::format("node '{}' ({}, {})", node.name, node.op, node.source);
}

}  // namespace tern::compiler
