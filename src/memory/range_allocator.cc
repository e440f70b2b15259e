#include "src/memory/range_allocator.h"

#include <algorithm>
#include <bit>

namespace tern {

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t min_alignment) {
  if (min_alignment < 64) min_alignment = 64;
  if (!std::has_single_bit(min_alignment)) {
    // bit_ceil of a value above 2^63 is undefined; clamp to the largest power of two.
    min_alignment =
        min_alignment > (uint64_t{1} << 63) ? uint64_t{1} << 63 : std::bit_ceil(min_alignment);
  }
  unit_shift_ = std::countr_zero(min_alignment);
  capacity_ = capacity & ~(min_alignment - 1);
  for (auto& row : free_heads_) std::fill(std::begin(row), std::end(row), kNone);
  if (capacity_ > 0) {
    uint32_t index = NewNode();
    nodes_[index].offset = 0;
    nodes_[index].size = capacity_;
    InsertFree(index);
  }
}

void RangeAllocator::Mapping(uint64_t units, int* fl, int* sl) {
  if (units < kSlCount) {
    // Small sizes get one exact class each in first level 0.
    *fl = 0;
    *sl = static_cast<int>(units);
    return;
  }
  int log2 = std::bit_width(units) - 1;
  *fl = log2 - kSlLog2 + 1;
  *sl = static_cast<int>((units >> (log2 - kSlLog2)) - kSlCount);
}

bool RangeAllocator::FindNonEmpty(int* fl, int* sl) const {
  if (*fl >= kFlCount) return false;
  uint32_t sl_map = sl_bitmap_[*fl] & (~uint32_t{0} << *sl);
  if (sl_map == 0) {
    if (*fl + 1 >= kFlCount) return false;
    uint64_t fl_map = fl_bitmap_ & (~uint64_t{0} << (*fl + 1));
    if (fl_map == 0) return false;
    *fl = std::countr_zero(fl_map);
    sl_map = sl_bitmap_[*fl];
  }
  *sl = std::countr_zero(sl_map);
  return true;
}

uint32_t RangeAllocator::FindFit(uint64_t size, uint64_t alignment) const {
  const uint64_t min_alignment = uint64_t{1} << unit_shift_;
  // Fast path: any block of at least size + (alignment - min_alignment) bytes holds
  // the request whatever its offset. Rounding the request up to the next class
  // boundary makes every block of the first non-empty class at or above it big
  // enough, so the head of that list is taken without looking further.
  const uint64_t slack = alignment - min_alignment;
  if (slack <= capacity_ - size) {
    uint64_t units = (size + slack) >> unit_shift_;
    if (units >= kSlCount) {
      int log2 = std::bit_width(units) - 1;
      units += (uint64_t{1} << (log2 - kSlLog2)) - 1;
    }
    int fl, sl;
    Mapping(units, &fl, &sl);
    if (FindNonEmpty(&fl, &sl)) return free_heads_[fl][sl];
  }

  // Slow path: every class at or above the rounded request was empty. Blocks
  // that can still fit sit in the classes from the request's own class up;
  // check them one by one so that failure means nothing fits.
  int fl, sl;
  Mapping(size >> unit_shift_, &fl, &sl);
  while (FindNonEmpty(&fl, &sl)) {
    for (uint32_t i = free_heads_[fl][sl]; i != kNone; i = nodes_[i].next_free) {
      const Block& block = nodes_[i];
      // Distance from the block start to the next multiple of alignment.
      uint64_t gap = (0 - block.offset) & (alignment - 1);
      if (gap <= block.size && size <= block.size - gap) return i;
    }
    if (++sl == kSlCount) {
      sl = 0;
      ++fl;
    }
  }
  return kNone;
}

bool RangeAllocator::Allocate(uint64_t size, uint64_t alignment, uint64_t* out_offset) {
  const uint64_t min_alignment = uint64_t{1} << unit_shift_;
  if (size == 0 || size > capacity_ || out_offset == nullptr) return false;
  if (alignment == 0) alignment = min_alignment;
  if (!std::has_single_bit(alignment)) return false;
  // Every block offset is a multiple of min_alignment, hence of any smaller power of two.
  alignment = std::max(alignment, min_alignment);
  size = (size + min_alignment - 1) & ~(min_alignment - 1);  // no overflow: size <= capacity_

  uint32_t index = FindFit(size, alignment);
  if (index == kNone) return false;
  RemoveFree(index);

  uint64_t gap = (0 - nodes_[index].offset) & (alignment - 1);
  if (gap > 0) {
    // The leading gap stays free under the original node. Its predecessor is in
    // use (free blocks are never adjacent), so it needs no merging.
    uint32_t rest = Split(index, gap);
    InsertFree(index);
    index = rest;
  }
  if (nodes_[index].size > size) {
    // Likewise the successor of a free block is in use, so the tail stays as is.
    InsertFree(Split(index, size));
  }

  Block& block = nodes_[index];
  block.free = false;
  used_bytes_ += block.size;
  live_.emplace(block.offset, index);
  *out_offset = block.offset;
  return true;
}

bool RangeAllocator::Free(uint64_t offset, uint64_t* out_size) {
  auto it = live_.find(offset);
  if (it == live_.end()) return false;
  uint32_t index = it->second;
  live_.erase(it);

  const uint64_t size = nodes_[index].size;
  used_bytes_ -= size;
  if (out_size != nullptr) *out_size = size;

  uint32_t next = nodes_[index].next_phys;
  if (next != kNone && nodes_[next].free) {
    RemoveFree(next);
    MergeNext(index);
  }
  uint32_t prev = nodes_[index].prev_phys;
  if (prev != kNone && nodes_[prev].free) {
    RemoveFree(prev);
    MergeNext(prev);
    index = prev;
  }
  InsertFree(index);
  return true;
}

uint64_t RangeAllocator::largest_free_block() const {
  if (fl_bitmap_ == 0) return 0;
  int fl = std::bit_width(fl_bitmap_) - 1;
  int sl = std::bit_width(sl_bitmap_[fl]) - 1;
  uint64_t largest = 0;
  for (uint32_t i = free_heads_[fl][sl]; i != kNone; i = nodes_[i].next_free) {
    largest = std::max(largest, nodes_[i].size);
  }
  return largest;
}

uint64_t RangeAllocator::AllocationSize(uint64_t offset) const {
  auto it = live_.find(offset);
  return it == live_.end() ? 0 : nodes_[it->second].size;
}

uint32_t RangeAllocator::NewNode() {
  if (!spare_nodes_.empty()) {
    uint32_t index = spare_nodes_.back();
    spare_nodes_.pop_back();
    nodes_[index] = Block{};
    return index;
  }
  nodes_.emplace_back();
  return static_cast<uint32_t>(nodes_.size() - 1);
}

void RangeAllocator::ReleaseNode(uint32_t index) { spare_nodes_.push_back(index); }

uint32_t RangeAllocator::Split(uint32_t index, uint64_t size) {
  uint32_t rest = NewNode();  // may reallocate nodes_: take references only after
  Block& block = nodes_[index];
  Block& tail = nodes_[rest];
  tail.offset = block.offset + size;
  tail.size = block.size - size;
  tail.prev_phys = index;
  tail.next_phys = block.next_phys;
  if (block.next_phys != kNone) nodes_[block.next_phys].prev_phys = rest;
  block.next_phys = rest;
  block.size = size;
  return rest;
}

void RangeAllocator::MergeNext(uint32_t index) {
  Block& block = nodes_[index];
  uint32_t next = block.next_phys;
  Block& absorbed = nodes_[next];
  block.size += absorbed.size;
  block.next_phys = absorbed.next_phys;
  if (absorbed.next_phys != kNone) nodes_[absorbed.next_phys].prev_phys = index;
  ReleaseNode(next);
}

void RangeAllocator::InsertFree(uint32_t index) {
  int fl, sl;
  Mapping(nodes_[index].size >> unit_shift_, &fl, &sl);
  Block& block = nodes_[index];
  uint32_t head = free_heads_[fl][sl];
  block.free = true;
  block.prev_free = kNone;
  block.next_free = head;
  if (head != kNone) nodes_[head].prev_free = index;
  free_heads_[fl][sl] = index;
  sl_bitmap_[fl] |= uint32_t{1} << sl;
  fl_bitmap_ |= uint64_t{1} << fl;
  ++free_block_count_;
}

void RangeAllocator::RemoveFree(uint32_t index) {
  int fl, sl;
  Mapping(nodes_[index].size >> unit_shift_, &fl, &sl);
  Block& block = nodes_[index];
  if (block.prev_free != kNone) {
    nodes_[block.prev_free].next_free = block.next_free;
  } else {
    free_heads_[fl][sl] = block.next_free;
    if (block.next_free == kNone) {
      sl_bitmap_[fl] &= ~(uint32_t{1} << sl);
      if (sl_bitmap_[fl] == 0) fl_bitmap_ &= ~(uint64_t{1} << fl);
    }
  }
  if (block.next_free != kNone) nodes_[block.next_free].prev_free = block.prev_free;
  block.free = false;
  block.prev_free = block.next_free = kNone;
  --free_block_count_;
}

bool RangeAllocator::Validate() const {
  const uint64_t min_alignment = uint64_t{1} << unit_shift_;
  if (capacity_ == 0) return nodes_.size() == spare_nodes_.size() && fl_bitmap_ == 0;

  // Address order: blocks tile [0, capacity) and no two free blocks touch.
  // The node for offset 0 is created first and never released.
  uint64_t expected_offset = 0, used = 0;
  uint32_t free_blocks = 0, used_blocks = 0;
  uint32_t prev = kNone;
  bool prev_free = false;
  for (uint32_t i = 0; i != kNone; prev = i, i = nodes_[i].next_phys) {
    const Block& block = nodes_[i];
    if (block.offset != expected_offset || block.prev_phys != prev) return false;
    if (block.size == 0 || (block.size & (min_alignment - 1)) != 0) return false;
    if (block.free) {
      if (prev_free) return false;
      ++free_blocks;
    } else {
      auto it = live_.find(block.offset);
      if (it == live_.end() || it->second != i) return false;
      used += block.size;
      ++used_blocks;
    }
    prev_free = block.free;
    expected_offset += block.size;
    if (used_blocks + free_blocks > nodes_.size()) return false;  // cycle
  }
  if (expected_offset != capacity_ || used != used_bytes_) return false;
  if (used_blocks != live_.size() || free_blocks != free_block_count_) return false;
  if (used_blocks + free_blocks + spare_nodes_.size() != nodes_.size()) return false;

  // Size-class lists: each free block is in the list of its class, bitmaps agree.
  uint32_t listed = 0;
  for (int fl = 0; fl < kFlCount; ++fl) {
    if (((fl_bitmap_ >> fl) & 1) != (sl_bitmap_[fl] != 0 ? 1u : 0u)) return false;
    for (int sl = 0; sl < kSlCount; ++sl) {
      uint32_t head = free_heads_[fl][sl];
      if (((sl_bitmap_[fl] >> sl) & 1) != (head != kNone ? 1u : 0u)) return false;
      uint32_t prev_link = kNone;
      for (uint32_t i = head; i != kNone; prev_link = i, i = nodes_[i].next_free) {
        const Block& block = nodes_[i];
        int block_fl, block_sl;
        Mapping(block.size >> unit_shift_, &block_fl, &block_sl);
        if (!block.free || block.prev_free != prev_link) return false;
        if (block_fl != fl || block_sl != sl) return false;
        if (++listed > free_blocks) return false;
      }
    }
  }
  return listed == free_blocks;
}

}  // namespace tern
