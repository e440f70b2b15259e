// Fusion of lowered instructions, before memory planning (compile.h):
//   0. a `copy` that only permutes a result nothing else reads (attention's
//      heads merged back) is dropped: the producer writes in that layout;
//   1. epilogues: a matmul or conv2d followed by the `binary add` of a
//      residual and/or a `unary` activation of its result becomes one
//      instruction with an epilogue (docs/isa.md, "matmul");
//   2. elementwise chains: runs of consecutive float `binary`, `unary` and
//      `where` instructions over one shape become one `elementwise` program
//      whose intermediates live in registers, never in scratch memory.
// Only results read after the fused instruction (or that are graph outputs)
// are stored. For f32 data the results have the same bits as unfused (the
// ISA promises it); for bf16/f16 intermediates stay f32 (rounded once).
// docs/compiler.md, "Fusion", gives the rules and what is not fused.
#ifndef TERN_COMPILER_LOWER_FUSION_H_
#define TERN_COMPILER_LOWER_FUSION_H_

#include <cstdint>

#include "compiler/lower/lowering.h"

namespace tern::compiler {

struct FusionStats {
  uint32_t instructions_before = 0;  // compute instructions lowering made
  uint32_t instructions_after = 0;
  uint32_t epilogues = 0;       // matmul/conv2d that took an add and/or activation
  uint32_t fused_groups = 0;    // elementwise programs made
  uint32_t fused_members = 0;   // instructions those programs replaced
  uint32_t copies_removed = 0;  // producers that write in their copy's layout instead
};

// Rewrites `program` in place. Deterministic: the same program gives the
// same result.
// Thread-safety: touches only its arguments.
void FuseInstructions(LoweredProgram* program, FusionStats* stats);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_FUSION_H_
