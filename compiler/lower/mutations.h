// Graph mutations made safe to run in place: a Graph::mutations entry
// (input j, output k) says that output k's value is written back into input
// j after a call. The caller may do that by binding output k to input j's
// own memory (the same buffer and offset), so that the execution updates the
// input where it is: an optimizer's step then writes its parameters and
// states in place instead of returning new tensors copied back one by one.
// This pass orders the program so that binding is correct (docs/compiler.md,
// "Mutations"); bound to memory of its own, output k is an ordinary output.
#ifndef TERN_COMPILER_LOWER_MUTATIONS_H_
#define TERN_COMPILER_LOWER_MUTATIONS_H_

#include <cstdint>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/lower/lowering.h"

namespace tern::compiler {

// No input shares an output's memory.
inline constexpr uint32_t kNoSharedInput = UINT32_MAX;

struct MutationStats {
  uint32_t in_place = 0;  // the value's instructions may write the input's memory directly
  uint32_t copied = 0;    // computed into scratch, copied into the output at the end
};

// Rewrites `program` (lowered and fused) for `graph`'s mutations. Where
// every read of input j comes before the first write of output k (or is
// that write, elementwise in the same layout), nothing changes; otherwise
// output k is computed into scratch and copied into it by a last
// instruction. Returns, per graph output, the input whose memory it may
// share (kNoSharedInput for most): the engines' synchronisation must treat
// the two as one memory.
// Thread-safety: touches only its arguments.
std::vector<uint32_t> MakeMutationsSafeInPlace(const Graph& graph, LoweredProgram* program,
                                               MutationStats* stats);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_MUTATIONS_H_
