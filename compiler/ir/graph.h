// The compiler's graph: a typed tensor graph over the core ATen operator set
// (the ops left after torch._decomp.core_aten_decompositions(), named as
// torch names their overloads: "aten.mm.default", "aten.add.Tensor").
//
// A graph is plain data: values (the graph's inputs, its constants, and the
// outputs of nodes), nodes in a topological order, and the graph's outputs.
// Every value has a dtype and a shape whose dimensions may be symbolic
// (dim.h). Operators are described in ops.h (arity, attributes, shape and
// dtype inference, whether an output is a view of an input); verify.h checks
// a whole graph; hash.h gives its canonical hash.
//
// Aliasing and mutation: core ATen graphs are functional, so the only
// aliasing is that of view ops (an output that is a view of an input, marked
// by its OpDef), and the only mutation is the graph's own: Graph::mutations
// says which outputs the caller writes back into which inputs (a module's
// buffers, such as batch-norm running statistics or a KV cache).
#ifndef TERN_COMPILER_IR_GRAPH_H_
#define TERN_COMPILER_IR_GRAPH_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "compiler/ir/dim.h"
#include "tern/isa.h"

namespace tern::compiler {

inline constexpr uint32_t kNoValue = UINT32_MAX;  // an absent optional input

struct TensorType {
  tern_dtype_t dtype = TERN_DTYPE_F32;
  Shape shape;
  bool operator==(const TensorType& other) const = default;
};

// A dtype-valued attribute (aten._to_copy's dtype).
struct DTypeAttr {
  tern_dtype_t dtype = TERN_DTYPE_F32;
  bool operator==(const DTypeAttr& other) const = default;
};

// A node's non-tensor argument: alpha, dims, keepdim, eps, a view's size.
struct Attribute {
  std::string name;
  std::variant<int64_t, double, bool, std::vector<int64_t>, Shape, std::string, DTypeAttr> value;
  bool operator==(const Attribute& other) const = default;
};

struct Value {
  enum Kind : uint8_t { kInput = 0, kConstant = 1, kNode = 2 };
  Kind kind = kInput;
  TensorType type;
  std::string name;    // inputs: the name callers bind; others: for messages
  uint32_t node = 0;   // kNode: the producing node's index
  uint32_t index = 0;  // kNode: which of its outputs; kInput: position among
                       // the inputs; kConstant: index in Graph::constants
};

struct Node {
  std::string op;                 // "aten.addmm.default"
  std::vector<uint32_t> inputs;   // value ids, kNoValue for an absent optional
  std::vector<uint32_t> outputs;  // value ids
  std::vector<Attribute> attrs;   // sorted by name, names unique
  std::string name;               // "linear_1": for messages and debug info
  std::string source;             // "model.py:42 in forward", or ""
};

struct Graph {
  std::vector<Symbol> symbols;
  std::vector<Value> values;
  std::vector<Node> nodes;       // topological: a node uses values made before it
  std::vector<uint32_t> inputs;  // value ids, in the order callers pass them
  struct Output {
    std::string name;
    uint32_t value = 0;
  };
  std::vector<Output> outputs;
  std::vector<std::vector<uint8_t>> constants;  // row-major bytes of each constant
  struct Mutation {
    uint32_t input = 0;   // position in `inputs`
    uint32_t output = 0;  // position in `outputs`: written back into that input
  };
  std::vector<Mutation> mutations;

  // Appends an input and returns its value id.
  uint32_t AddInput(std::string name, TensorType type);
  // Appends a constant (its bytes, row-major) and returns its value id.
  uint32_t AddConstant(std::string name, TensorType type, std::vector<uint8_t> bytes);
  // Appends a node whose outputs have the given types and returns its index
  // (ops.h's AddNode infers the types).
  uint32_t AddNodeWithTypes(std::string op, std::vector<uint32_t> inputs,
                            std::vector<Attribute> attrs, const std::vector<TensorType>& outputs,
                            std::string name = {}, std::string source = {});
  void AddOutput(std::string name, uint32_t value) { outputs.push_back({std::move(name), value}); }
};

// The attribute named `name`, or nullptr.
const Attribute* FindAttr(const Node& node, const std::string& name);

// A name for messages: "node 'linear_1' (aten.addmm.default, model.py:42 in
// forward)".
std::string DescribeNode(const Node& node);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_IR_GRAPH_H_
