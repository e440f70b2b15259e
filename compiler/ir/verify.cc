#include "compiler/ir/verify.h"

#include <fmt/format.h>

#include <set>
#include <string>

#include "compiler/ir/ops.h"

namespace tern::compiler {
namespace {

absl::Status Invalid(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

absl::Status CheckSymbols(const Graph& graph) {
  std::set<std::string> names;
  for (size_t i = 0; i < graph.symbols.size(); ++i) {
    const Symbol& symbol = graph.symbols[i];
    if (symbol.name.empty()) return Invalid(fmt::format("symbol {} has no name", i));
    if (!names.insert(symbol.name).second) {
      return Invalid(
          fmt::format("symbol {} is named '{}' like an earlier one; names must be "
                      "unique",
                      i, symbol.name));
    }
    if (symbol.min < 0 || symbol.min > symbol.max) {
      return Invalid(fmt::format("symbol '{}' has the range [{}, {}]; it needs 0 <= min <= max",
                                 symbol.name, symbol.min, symbol.max));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckType(const Graph& graph, const TensorType& type, const std::string& what) {
  if (type.dtype >= TERN_DTYPE_COUNT) {
    return Invalid(fmt::format("{} has dtype {}, which tern does not have", what,
                               static_cast<int>(type.dtype)));
  }
  if (type.shape.size() > TERN_MAX_RANK) {
    return Invalid(fmt::format("{} has rank {}; tern supports up to {}", what, type.shape.size(),
                               TERN_MAX_RANK));
  }
  for (const Dim& dim : type.shape) {
    if (!dim.is_constant() && static_cast<size_t>(dim.symbol()) >= graph.symbols.size()) {
      return Invalid(fmt::format("{} has a dim of symbol {}, which the graph does not declare",
                                 what, dim.symbol()));
    }
    if (dim.Min(graph.symbols) < 0) {
      return Invalid(fmt::format("{} has the dim {}, negative for part of its symbol's range", what,
                                 dim.ToString(graph.symbols)));
    }
  }
  return absl::OkStatus();
}

std::string ValueName(const Graph& graph, uint32_t id) {
  return fmt::format("value {} ('{}')", id, graph.values[id].name);
}

absl::Status CheckValues(const Graph& graph) {
  for (uint32_t id = 0; id < graph.values.size(); ++id) {
    const Value& value = graph.values[id];
    if (absl::Status s = CheckType(graph, value.type, ValueName(graph, id)); !s.ok()) return s;
    switch (value.kind) {
      case Value::kInput:
        if (value.index >= graph.inputs.size() || graph.inputs[value.index] != id) {
          return Invalid(
              fmt::format("{} is an input at position {}, but the graph's inputs do "
                          "not list it there",
                          ValueName(graph, id), value.index));
        }
        break;
      case Value::kConstant: {
        if (value.index >= graph.constants.size()) {
          return Invalid(fmt::format("{} is constant {}, which does not exist",
                                     ValueName(graph, id), value.index));
        }
        const auto elements = ConstantElements(value.type.shape);
        if (!elements) {
          return Invalid(
              fmt::format("{} is a constant with a symbolic shape", ValueName(graph, id)));
        }
        const uint64_t expected =
            static_cast<uint64_t>(*elements) * tern_dtype_size(value.type.dtype);
        if (graph.constants[value.index].size() != expected) {
          return Invalid(fmt::format(
              "{} is a constant of shape {} ({} bytes of {}) but holds {} "
              "bytes",
              ValueName(graph, id), ShapeString(value.type.shape, graph.symbols), expected,
              tern_dtype_name(value.type.dtype), graph.constants[value.index].size()));
        }
        break;
      }
      case Value::kNode:
        if (value.node >= graph.nodes.size() ||
            value.index >= graph.nodes[value.node].outputs.size() ||
            graph.nodes[value.node].outputs[value.index] != id) {
          return Invalid(
              fmt::format("{} claims to be output {} of node {}, which does not list "
                          "it",
                          ValueName(graph, id), value.index, value.node));
        }
        break;
      default:
        return Invalid(fmt::format("{} has kind {}, which is not input, constant or node output",
                                   ValueName(graph, id), static_cast<int>(value.kind)));
    }
  }
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const uint32_t id = graph.inputs[i];
    if (id >= graph.values.size() || graph.values[id].kind != Value::kInput ||
        graph.values[id].index != i) {
      return Invalid(fmt::format("graph input {} is value {}, which is not input {}", i, id, i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNodes(const Graph& graph) {
  // Values defined so far: inputs and constants from the start, node
  // outputs as their node comes.
  std::vector<bool> defined(graph.values.size(), false);
  for (uint32_t id = 0; id < graph.values.size(); ++id) {
    defined[id] = graph.values[id].kind != Value::kNode;
  }
  std::vector<TensorType> inferred;
  for (uint32_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const uint32_t id = node.inputs[i];
      if (id == kNoValue) continue;
      if (id >= graph.values.size()) {
        return Invalid(fmt::format("{}: input {} is value {}, which does not exist",
                                   DescribeNode(node), i, id));
      }
      if (!defined[id]) {
        return Invalid(
            fmt::format("{}: input {} is {}, which is made later; nodes must come "
                        "after the values they use",
                        DescribeNode(node), i, ValueName(graph, id)));
      }
    }
    for (size_t a = 1; a < node.attrs.size(); ++a) {
      if (!(node.attrs[a - 1].name < node.attrs[a].name)) {
        return Invalid(
            fmt::format("{}: attribute '{}' comes after '{}'; attributes must be "
                        "sorted by name and unique",
                        DescribeNode(node), node.attrs[a].name, node.attrs[a - 1].name));
      }
    }
    if (absl::Status s = InferNode(graph, node, &inferred); !s.ok()) return s;
    if (inferred.size() != node.outputs.size()) {
      return Invalid(fmt::format("{}: it lists {} outputs; the op has {}", DescribeNode(node),
                                 node.outputs.size(), inferred.size()));
    }
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const uint32_t id = node.outputs[o];
      if (id >= graph.values.size() || graph.values[id].kind != Value::kNode ||
          graph.values[id].node != n || graph.values[id].index != o) {
        return Invalid(fmt::format("{}: output {} is value {}, which is not this node's",
                                   DescribeNode(node), o, id));
      }
      const TensorType& recorded = graph.values[id].type;
      if (recorded != inferred[o]) {
        return Invalid(fmt::format(
            "{}: output {} is recorded as {} {} but the op gives {} {}", DescribeNode(node), o,
            tern_dtype_name(recorded.dtype), ShapeString(recorded.shape, graph.symbols),
            tern_dtype_name(inferred[o].dtype), ShapeString(inferred[o].shape, graph.symbols)));
      }
      defined[id] = true;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const Graph& graph) {
  std::set<std::string> names;
  for (const Value& value : graph.values) {
    if (value.kind == Value::kInput) names.insert(value.name);
  }
  if (names.size() != graph.inputs.size()) {
    return Invalid("two inputs have the same name; inputs and outputs are bound by name");
  }
  for (size_t i = 0; i < graph.outputs.size(); ++i) {
    const Graph::Output& output = graph.outputs[i];
    if (output.name.empty()) return Invalid(fmt::format("output {} has no name", i));
    if (!names.insert(output.name).second) {
      return Invalid(
          fmt::format("output {} is named '{}' like an input or another output; "
                      "names must be unique",
                      i, output.name));
    }
    if (output.value >= graph.values.size()) {
      return Invalid(
          fmt::format("output '{}' is value {}, which does not exist", output.name, output.value));
    }
  }
  std::set<uint32_t> mutated;
  for (const Graph::Mutation& mutation : graph.mutations) {
    if (mutation.input >= graph.inputs.size() || mutation.output >= graph.outputs.size()) {
      return Invalid(
          fmt::format("a mutation pairs input {} with output {}; the graph has {} "
                      "inputs and {} outputs",
                      mutation.input, mutation.output, graph.inputs.size(), graph.outputs.size()));
    }
    if (!mutated.insert(mutation.input).second) {
      return Invalid(fmt::format("input {} is mutated twice", mutation.input));
    }
    const TensorType& in = graph.values[graph.inputs[mutation.input]].type;
    const TensorType& out = graph.values[graph.outputs[mutation.output].value].type;
    if (in != out) {
      return Invalid(fmt::format(
          "output '{}' is written back into input '{}', but their types "
          "differ ({} {} and {} {})",
          graph.outputs[mutation.output].name, graph.values[graph.inputs[mutation.input]].name,
          tern_dtype_name(out.dtype), ShapeString(out.shape, graph.symbols),
          tern_dtype_name(in.dtype), ShapeString(in.shape, graph.symbols)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyGraph(const Graph& graph) {
  if (absl::Status s = CheckSymbols(graph); !s.ok()) return s;
  if (absl::Status s = CheckValues(graph); !s.ok()) return s;
  if (absl::Status s = CheckNodes(graph); !s.ok()) return s;
  return CheckOutputs(graph);
}

}  // namespace tern::compiler
