// Memory planning for the scratch segment: every scratch buffer is live from
// the first instruction that touches it to the last one; buffers are placed
// best-fit into blocks freed by dead buffers, 64-byte aligned.
#ifndef TERN_COMPILER_LOWER_MEMORY_PLANNER_H_
#define TERN_COMPILER_LOWER_MEMORY_PLANNER_H_

#include <cstdint>
#include <vector>

namespace tern::compiler {

inline constexpr uint64_t kScratchAlignment = 64;

struct ScratchBuffer {
  uint64_t bytes = 0;
  uint32_t first_use = 0;  // instruction position (program order)
  uint32_t last_use = 0;   // inclusive
};

struct MemoryPlan {
  std::vector<uint64_t> offsets;  // per buffer, bytes into the scratch segment
  uint64_t peak = 0;              // scratch bytes the function needs
  uint64_t naive_sum = 0;         // every buffer its own (aligned) region
  uint64_t max_live = 0;          // max over positions of the live aligned sizes: a lower bound
};

// Places `buffers`. At each position, the buffers first used there are
// placed (in id order) before those last used there are freed, so an
// instruction never writes over its own operands. A request takes the
// smallest free block that holds it (lowest offset on ties), or grows the
// segment, reusing a free block at its top. Deterministic.
// Thread-safety: a pure function of its argument.
MemoryPlan PlanScratch(const std::vector<ScratchBuffer>& buffers);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_LOWER_MEMORY_PLANNER_H_
