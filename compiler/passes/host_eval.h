// Host evaluation of the ops constant folding knows (internal to
// compiler/passes; constant_fold.h says which and how exactly). Every
// function returns nullopt when it declines: an attribute it does not
// expect, a dtype it does not evaluate, or an element whose conversion
// would not be exact.
#ifndef TERN_COMPILER_PASSES_HOST_EVAL_H_
#define TERN_COMPILER_PASSES_HOST_EVAL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "compiler/ir/graph.h"
#include "tern/isa.h"

namespace tern::compiler::passes_internal {

// A constant's bytes (row-major) with its dtype and static shape.
struct HostTensor {
  tern_dtype_t dtype = TERN_DTYPE_F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t size = 0;  // bytes
};

// Whether the op is one the evaluator knows.
bool CanEvaluate(const std::string& op);
// Whether its result only rearranges its input's elements, which lowering
// already does for free with strided operands (views): such a node is
// folded only when a folded node reads it.
bool IsLayoutOnly(const Node& node, const Graph& graph);

// Evaluates `node` of `graph` on `inputs` (one per node input; an absent
// optional input has data == nullptr) into a row-major result of type
// `output` (whose shape is static).
std::optional<std::vector<uint8_t>> Evaluate(const Graph& graph, const Node& node,
                                             const std::vector<HostTensor>& inputs,
                                             const TensorType& output);

// Converts `count` elements from `from` to `to` as PyTorch's _to_copy:
// between float dtypes with round-to-nearest-even (declining a NaN when
// narrowing: PyTorch's own scalar and vector paths disagree on its bits);
// to or from an integer or bool only when every value is exact.
bool ConvertElements(tern_dtype_t from, const uint8_t* in, tern_dtype_t to, uint8_t* out,
                     size_t count);

// The IEEE binary16 and bfloat16 bits nearest to `value` (ties to even).
uint16_t FloatToHalfBits(float value);
uint16_t FloatToBFloat16Bits(float value);
float HalfBitsToFloat(uint16_t bits);
float BFloat16BitsToFloat(uint16_t bits);

}  // namespace tern::compiler::passes_internal

#endif  // TERN_COMPILER_PASSES_HOST_EVAL_H_
