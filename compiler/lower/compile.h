// The compiler's back end: a whole graph becomes one tern executable with a
// function "forward" whose inputs and outputs are the graph's (same names,
// same order). docs/compiler.md describes the method:
//   1. lowering (lowering.h): each node becomes ISA instructions over
//      buffers; view ops become strided operands, not instructions;
//      fusion (fusion.h) then merges epilogues and elementwise chains;
//   2. memory planning (memory_planner.h): scratch buffers are placed
//      best-fit by liveness; graph outputs are computed in place;
//   3. engine ordering (engine_sync.h): semaphores only where two engines
//      touch the same bytes;
//   4. emission through the builder, which checks every instruction and
//      that no engines race.
// Identical graphs give identical bytes.
#ifndef TERN_COMPILER_LOWER_COMPILE_H_
#define TERN_COMPILER_LOWER_COMPILE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace tern::compiler {

struct CompileOptions {
  std::string target = "trn2";  // the device kind the executable is for
  // Fusion (fusion.h): matmul/conv2d epilogues and elementwise programs.
  // Off gives one instruction per operation: the baseline the fusion
  // figures are measured against, and executables an older tern loads.
  bool fusion = true;
};

struct CompileStats {
  uint32_t nodes = 0;         // nodes of the graph (those lowered and those unused)
  uint32_t instructions = 0;  // all of them, sync instructions included
  // By tern_engine_t: compute instructions on DMA (1) to Collective (6);
  // [TERN_ENGINE_SYNC] (7) counts the semaphore signals and waits, which sit
  // in the streams they order.
  uint32_t instructions_per_engine[8] = {};
  uint32_t semaphores = 0;         // distinct semaphores used
  uint64_t scratch_peak = 0;       // scratch bytes per execution
  uint64_t scratch_naive_sum = 0;  // if every buffer had its own region
  uint64_t scratch_max_live = 0;   // lower bound: most bytes live at once
  uint64_t constant_bytes = 0;     // constants stored, after deduplication
  // Fusion: compute instructions lowering made and those emitted (sync
  // instructions not counted in either), matmul/conv2d that took an
  // epilogue, elementwise programs and the instructions they replaced.
  uint32_t compute_instructions_unfused = 0;
  uint32_t compute_instructions = 0;
  uint32_t epilogues = 0;
  uint32_t fused_groups = 0;
  uint32_t fused_members = 0;
  // Graph mutations (mutations.h): written straight into the input, or
  // computed into scratch and copied there by a last instruction.
  uint32_t mutations_in_place = 0;
  uint32_t mutations_copied = 0;
  double compile_ms = 0.0;
};

// Compiles a graph (verified first) into an executable. `stats` may be null.
// Errors name the node, its op and source, and what to do: an op not lowered
// yet, symbolic shapes, an invalid graph.
// Thread-safety: a pure function of its arguments; callable concurrently.
absl::StatusOr<std::vector<uint8_t>> CompileGraph(const Graph& graph, const CompileOptions& options,
                                                  CompileStats* stats);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_COMPILE_H_
