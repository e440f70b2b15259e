// Lowering proper: a graph becomes a list of ISA instructions over buffers
// (inputs, outputs, constants, scratch buffers not yet placed), before
// memory planning and engine ordering (compile.h runs those).
#ifndef TERN_COMPILER_LOWER_LOWERING_H_
#define TERN_COMPILER_LOWER_LOWERING_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/lower/constant_pool.h"
#include "compiler/lower/tensor_ref.h"
#include "tern/isa.h"

namespace tern::compiler {

inline constexpr uint32_t kNoNode = UINT32_MAX;

struct LoweredInstruction {
  tern_opcode_t opcode = TERN_OP_COPY;
  std::vector<TensorRef> operands;  // outputs first, as the ISA lists them
  uint32_t written = 1;             // the first `written` operands are written
  std::vector<int64_t> ints;
  std::vector<double> floats;
  uint32_t node = kNoNode;  // the graph node it comes from
  uint32_t output = 0;      // with kNoNode: the graph output it copies
  // Fusion: the other nodes whose instructions this one took in, in program
  // order (debug info names them all).
  std::vector<uint32_t> fused_nodes;
};

struct LoweredProgram {
  std::vector<LoweredInstruction> instructions;  // program order
  std::vector<uint64_t> scratch_bytes;           // per scratch buffer id
  ConstantPool constants;
};

// Lowers a verified graph with static shapes. Fails, naming the node and its
// source, for an op the compiler does not lower yet, a symbolic shape, or
// attributes it does not support.
// Thread-safety: a pure function of its argument.
absl::StatusOr<LoweredProgram> LowerGraph(const Graph& graph);

// The engine that runs `opcode` (its high byte).
inline tern_engine_t EngineOf(tern_opcode_t opcode) {
  return static_cast<tern_engine_t>(static_cast<uint32_t>(opcode) >> 8);
}

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_LOWERING_H_
