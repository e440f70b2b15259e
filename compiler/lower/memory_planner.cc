#include "compiler/lower/memory_planner.h"

#include <algorithm>
#include <iterator>
#include <map>

namespace tern::compiler {
namespace {

uint64_t Aligned(uint64_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

// Free blocks by offset, coalesced; the segment grows at `top`.
class Arena {
 public:
  uint64_t Allocate(uint64_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    }
    if (best != free_.end()) {
      const uint64_t offset = best->first;
      const uint64_t left = best->second - bytes;
      free_.erase(best);
      if (left > 0) free_[offset + bytes] = left;
      return offset;
    }
    // Nothing fits: grow, starting inside a free block that ends at the top.
    uint64_t offset = top_;
    if (!free_.empty()) {
      auto last = std::prev(free_.end());
      if (last->first + last->second == top_) {
        offset = last->first;
        free_.erase(last);
      }
    }
    top_ = offset + bytes;
    peak_ = std::max(peak_, top_);
    return offset;
  }

  void Free(uint64_t offset, uint64_t bytes) {
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && offset + bytes == next->first) {
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == offset) {
        previous->second += bytes;
        return;
      }
    }
    free_[offset] = bytes;
  }

  uint64_t peak() const { return peak_; }

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> size
  uint64_t top_ = 0;
  uint64_t peak_ = 0;
};

}  // namespace

MemoryPlan PlanScratch(const std::vector<ScratchBuffer>& buffers) {
  MemoryPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  uint32_t positions = 0;
  for (const ScratchBuffer& buffer : buffers) {
    plan.naive_sum += Aligned(buffer.bytes);
    positions = std::max(positions, buffer.last_use + 1);
  }
  std::vector<std::vector<uint32_t>> starting(positions), ending(positions);
  for (uint32_t id = 0; id < buffers.size(); ++id) {
    if (buffers[id].bytes == 0) continue;
    starting[buffers[id].first_use].push_back(id);
    ending[buffers[id].last_use].push_back(id);
  }
  Arena arena;
  uint64_t live = 0;
  for (uint32_t position = 0; position < positions; ++position) {
    for (uint32_t id : starting[position]) {
      plan.offsets[id] = arena.Allocate(Aligned(buffers[id].bytes));
      live += Aligned(buffers[id].bytes);
    }
    plan.max_live = std::max(plan.max_live, live);
    for (uint32_t id : ending[position]) {
      arena.Free(plan.offsets[id], Aligned(buffers[id].bytes));
      live -= Aligned(buffers[id].bytes);
    }
  }
  plan.peak = arena.peak();
  return plan;
}

}  // namespace tern::compiler
