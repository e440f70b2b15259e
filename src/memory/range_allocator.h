// TLSF (two-level segregated fit) sub-allocator of offsets within [0, capacity).
//
// The allocator only does bookkeeping: it never reads or writes the memory it
// describes, so it can manage ranges far larger than host memory (e.g. 8+ GiB of
// device address space). Block metadata lives in a host-side node pool; free
// blocks sit in size-class lists indexed by two bitmaps, and freed blocks are
// merged with free neighbours immediately, so no two free blocks are ever adjacent.
//
// Cost: Allocate and Free are O(1) (bitmap scans plus a hash lookup). Only when
// the O(1) good-fit search finds nothing (the range is nearly full or badly
// fragmented for the request) does Allocate fall back to scanning the free
// blocks of the classes that might still hold it, so that it returns false only
// when no free block can hold the request.
//
// Thread safety: not thread-safe; the caller must serialize all calls.
#ifndef TERN_SRC_MEMORY_RANGE_ALLOCATOR_H_
#define TERN_SRC_MEMORY_RANGE_ALLOCATOR_H_

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <vector>

namespace tern {

class RangeAllocator {
 public:
  // capacity: bytes managed (rounded down to a multiple of min_alignment).
  // min_alignment: power of two >= 64 (other values are raised to the next power of
  // two >= 64); every offset returned is a multiple of it and sizes are rounded up
  // to it.
  RangeAllocator(uint64_t capacity, uint64_t min_alignment);

  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;
  // A moved-from allocator may only be destroyed or assigned to.
  RangeAllocator(RangeAllocator&&) = default;
  RangeAllocator& operator=(RangeAllocator&&) = default;

  // Finds a block of `size` bytes (> 0) whose offset is a multiple of `alignment`
  // (power of two; 0 = min_alignment) and stores its offset in *out_offset.
  // Returns false when the arguments are invalid or no free block can hold it.
  bool Allocate(uint64_t size, uint64_t alignment, uint64_t* out_offset);

  // Frees the block that starts at `offset`. Returns false (and changes nothing)
  // if no live allocation starts there (double free, bad offset). On success
  // stores the block's rounded size in *out_size if non-null.
  bool Free(uint64_t offset, uint64_t* out_size = nullptr);

  uint64_t capacity() const { return capacity_; }
  uint64_t min_alignment() const { return uint64_t{1} << unit_shift_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return capacity_ - used_bytes_; }
  uint32_t allocation_count() const { return static_cast<uint32_t>(live_.size()); }

  // Exact size of the largest free block (0 if none). Scans only the highest
  // non-empty size class, whose blocks are within a factor 1 + 1/32 of each other.
  uint64_t largest_free_block() const;

  // Number of free blocks (fragmentation indicator).
  uint32_t free_block_count() const { return free_block_count_; }

  // Rounded size of the live allocation starting at `offset`, or 0.
  uint64_t AllocationSize(uint64_t offset) const;

  // Walks every block and free list and checks the internal invariants
  // (tiling of the range, coalescing, class membership, counters). O(n); for tests.
  bool Validate() const;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  // Second-level classes per power of two: 2^5 = 32, so a class spans ~3% of sizes.
  static constexpr int kSlLog2 = 5;
  static constexpr int kSlCount = 1 << kSlLog2;
  // Sizes are kept in units of min_alignment (< 2^58 units), so fl <= 54 fits.
  static constexpr int kFlCount = 64;

  struct Block {
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t prev_phys = kNone;  // address-order neighbours
    uint32_t next_phys = kNone;
    uint32_t prev_free = kNone;  // size-class list links (free blocks only)
    uint32_t next_free = kNone;
    bool free = false;
  };

  // Size class of a block of `units` min_alignment units (units > 0).
  static void Mapping(uint64_t units, int* fl, int* sl);
  // First non-empty class at or above (*fl, *sl); false if none.
  bool FindNonEmpty(int* fl, int* sl) const;
  // Searches for a free block able to hold `size` bytes at `alignment`.
  uint32_t FindFit(uint64_t size, uint64_t alignment) const;

  uint32_t NewNode();
  void ReleaseNode(uint32_t index);
  // Shrinks block `index` to `size` bytes and returns a new node for the rest.
  uint32_t Split(uint32_t index, uint64_t size);
  void InsertFree(uint32_t index);
  void RemoveFree(uint32_t index);
  // Absorbs the (free, already unlinked) physical successor of `index` into it.
  void MergeNext(uint32_t index);

  uint64_t capacity_ = 0;
  int unit_shift_ = 0;  // log2(min_alignment)
  uint64_t used_bytes_ = 0;
  uint32_t free_block_count_ = 0;

  std::vector<Block> nodes_;
  std::vector<uint32_t> spare_nodes_;  // recycled indices into nodes_

  uint64_t fl_bitmap_ = 0;                   // bit fl: some sl list of fl non-empty
  uint32_t sl_bitmap_[kFlCount] = {};        // bit sl: list (fl, sl) non-empty
  uint32_t free_heads_[kFlCount][kSlCount];  // list heads, kNone when empty

  absl::flat_hash_map<uint64_t, uint32_t> live_;  // offset -> node of live allocations
};

}  // namespace tern

#endif  // TERN_SRC_MEMORY_RANGE_ALLOCATOR_H_
