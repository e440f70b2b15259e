// The operators the compiler knows: the core ATen ops it can compile, each
// with its arity, its outputs' shape and dtype inference, and whether an
// output is a view of an input.
//
// Conventions (how a PyTorch node becomes a Node, for every front end):
// - Tensor arguments are inputs, in the order of the op's schema; an absent
//   optional tensor (None) is kNoValue. A list of tensors (aten.cat's
//   `tensors`) is the inputs themselves.
// - Every other argument is an attribute named as in the schema ("alpha",
//   "dim", "keepdim", "eps", "size"), and only when it differs from the
//   schema's default: int and SymInt -> int64_t, float -> double, bool ->
//   bool, int[] -> std::vector<int64_t>, SymInt[] (view/expand sizes) ->
//   Shape, str -> std::string, ScalarType -> DTypeAttr.
// - A Python number where the schema has a tensor (x * 2 is
//   aten.mul.Tensor(x, 2)) is an attribute named after that argument
//   ("other"), double or int64_t, and the tensor input is absent (kNoValue).
// - Dims keep their sign as PyTorch wrote them (-1 is the last); inference
//   and lowering normalise them.
#ifndef TERN_COMPILER_IR_OPS_H_
#define TERN_COMPILER_IR_OPS_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"

namespace tern::compiler {

// What inference sees of a node.
struct InferContext {
  const Graph& graph;
  const Node& node;
  std::vector<const TensorType*> inputs;  // nullptr for an absent input

  // The attribute, or `fallback` (the schema's default) when absent;
  // an error when present with another kind.
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> Float(const std::string& name, double fallback) const;
  absl::StatusOr<bool> Bool(const std::string& name, bool fallback) const;
  absl::StatusOr<std::vector<int64_t>> Ints(const std::string& name,
                                            std::vector<int64_t> fallback) const;
  // A required Shape attribute (an int[] is accepted too).
  absl::StatusOr<Shape> ShapeAttr(const std::string& name) const;
  absl::StatusOr<std::string> String(const std::string& name, std::string fallback) const;
  // A required bool[] attribute of `count` flags (native_layer_norm_backward's
  // output_mask): ints 0 or 1, or a Shape of the constant dims 0 or 1 (what
  // the front end makes of a list of Python bools, which are ints there).
  absl::StatusOr<std::vector<bool>> Flags(const std::string& name, size_t count) const;
  // A dtype attribute, or nullopt when absent.
  absl::StatusOr<std::optional<tern_dtype_t>> DType(const std::string& name) const;
  // An InvalidArgument error that starts with the node's description.
  absl::Status Error(std::string_view message) const;
};

using InferFn = absl::Status (*)(const InferContext& context, std::vector<TensorType>* outputs);

inline constexpr uint32_t kAnyOutputs = 0;  // as many as inference says (split)

struct OpDef {
  std::string_view name;    // "aten.addmm.default"
  uint32_t min_inputs = 0;  // tensor inputs, optional ones included in max
  uint32_t max_inputs = 0;  // UINT32_MAX: variadic (aten.cat)
  uint32_t outputs = 1;     // or kAnyOutputs
  int32_t view_of = -1;     // every output is a view of this input (aliasing), or -1
  InferFn infer = nullptr;
};

// The op, or nullptr when the compiler does not know it.
const OpDef* FindOp(std::string_view name);
// Every op the compiler knows, sorted by name.
std::vector<std::string_view> KnownOps();

// Infers the outputs' types of a node with these inputs and attributes and
// appends it to `graph`; returns its index. Fails, with the node and the
// reason named, for an unknown op, a wrong arity, a missing or mistyped
// attribute or inputs whose shapes or dtypes the op does not accept.
absl::StatusOr<uint32_t> AddNode(Graph* graph, std::string op, std::vector<uint32_t> inputs,
                                 std::vector<Attribute> attrs, std::string name = {},
                                 std::string source = {});

// Infers the types of an existing node's outputs (the verifier compares them
// with the recorded ones).
absl::Status InferNode(const Graph& graph, const Node& node, std::vector<TensorType>* outputs);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_IR_OPS_H_
