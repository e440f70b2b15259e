#include "src/memory/range_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

namespace tern {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(RangeAllocatorTest, BasicAllocateAndFree) {
  RangeAllocator ra(1 * kMiB, 64);
  EXPECT_EQ(ra.capacity(), 1 * kMiB);
  EXPECT_EQ(ra.free_bytes(), 1 * kMiB);
  EXPECT_EQ(ra.largest_free_block(), 1 * kMiB);

  uint64_t a = 1, b = 1;
  ASSERT_TRUE(ra.Allocate(100, 0, &a));
  ASSERT_TRUE(ra.Allocate(64, 0, &b));
  EXPECT_NE(a, b);
  EXPECT_EQ(a % 64, 0u);
  EXPECT_EQ(b % 64, 0u);
  EXPECT_EQ(ra.AllocationSize(a), 128u);  // rounded up to min_alignment
  EXPECT_EQ(ra.AllocationSize(b), 64u);
  EXPECT_EQ(ra.AllocationSize(a + 64), 0u);
  EXPECT_EQ(ra.used_bytes(), 192u);
  EXPECT_EQ(ra.free_bytes(), 1 * kMiB - 192);
  EXPECT_EQ(ra.allocation_count(), 2u);
  EXPECT_EQ(ra.largest_free_block(), 1 * kMiB - 192);
  EXPECT_TRUE(ra.Validate());

  uint64_t size = 0;
  ASSERT_TRUE(ra.Free(a, &size));
  EXPECT_EQ(size, 128u);
  EXPECT_EQ(ra.AllocationSize(a), 0u);
  EXPECT_EQ(ra.used_bytes(), 64u);
  EXPECT_EQ(ra.allocation_count(), 1u);
  ASSERT_TRUE(ra.Free(b));
  EXPECT_EQ(ra.used_bytes(), 0u);
  EXPECT_EQ(ra.allocation_count(), 0u);
  EXPECT_EQ(ra.largest_free_block(), 1 * kMiB);
  EXPECT_EQ(ra.free_block_count(), 1u);
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, CapacityAndMinAlignmentAreNormalized) {
  RangeAllocator ra(1000, 64);
  EXPECT_EQ(ra.capacity(), 960u);  // rounded down to min_alignment
  EXPECT_EQ(ra.largest_free_block(), 960u);
  RangeAllocator odd(4096, 100);
  EXPECT_EQ(odd.min_alignment(), 128u);
  RangeAllocator tiny(4096, 8);
  EXPECT_EQ(tiny.min_alignment(), 64u);
  RangeAllocator empty(0, 64);
  uint64_t offset;
  EXPECT_FALSE(empty.Allocate(64, 0, &offset));
  EXPECT_EQ(empty.largest_free_block(), 0u);
  EXPECT_TRUE(empty.Validate());
}

TEST(RangeAllocatorTest, InvalidArgumentsFail) {
  RangeAllocator ra(1 * kMiB, 256);
  uint64_t offset = 12345;
  EXPECT_FALSE(ra.Allocate(0, 0, &offset));
  EXPECT_FALSE(ra.Allocate(64, 3 * 256, &offset));  // not a power of two
  EXPECT_FALSE(ra.Allocate(1 * kMiB + 1, 0, &offset));
  EXPECT_FALSE(ra.Allocate(UINT64_MAX, 0, &offset));
  EXPECT_FALSE(ra.Allocate(64, 0, nullptr));
  EXPECT_EQ(offset, 12345u);
  EXPECT_EQ(ra.used_bytes(), 0u);
  EXPECT_TRUE(ra.Validate());

  // A huge alignment is legal: only offset 0 satisfies it.
  ASSERT_TRUE(ra.Allocate(64, uint64_t{1} << 63, &offset));
  EXPECT_EQ(offset, 0u);
  EXPECT_FALSE(ra.Allocate(64, uint64_t{1} << 63, &offset));
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, SmallAlignmentIsRaisedToMinimum) {
  RangeAllocator ra(1 * kMiB, 256);
  uint64_t a, b;
  ASSERT_TRUE(ra.Allocate(1, 1, &a));
  ASSERT_TRUE(ra.Allocate(1, 16, &b));
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(b % 256, 0u);
  EXPECT_EQ(ra.used_bytes(), 512u);
}

TEST(RangeAllocatorTest, Alignment) {
  RangeAllocator ra(64 * kMiB, 64);
  std::vector<uint64_t> offsets;
  for (uint64_t align = 64; align <= 1 * kMiB; align <<= 1) {
    uint64_t skew, offset;
    ASSERT_TRUE(ra.Allocate(64, 0, &skew));  // knock the next free offset off alignment
    offsets.push_back(skew);
    ASSERT_TRUE(ra.Allocate(1000, align, &offset)) << align;
    EXPECT_EQ(offset % align, 0u) << align;
    EXPECT_EQ(ra.AllocationSize(offset), 1024u);
    offsets.push_back(offset);
    ASSERT_TRUE(ra.Validate());
  }
  // Gaps split off for alignment are free and count as free bytes.
  EXPECT_EQ(ra.used_bytes(), offsets.size() / 2 * (64 + 1024));
  EXPECT_EQ(ra.free_bytes(), ra.capacity() - ra.used_bytes());
  for (uint64_t offset : offsets) ASSERT_TRUE(ra.Free(offset));
  EXPECT_EQ(ra.largest_free_block(), ra.capacity());
  EXPECT_EQ(ra.free_block_count(), 1u);
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, AlignedRequestUsesWholeRangeWhenItFits) {
  // The fast path wants size + alignment - min_alignment bytes; the exact fallback
  // must still find a block that fits only thanks to its offset.
  RangeAllocator ra(2 * kMiB, 64);
  uint64_t offset;
  ASSERT_TRUE(ra.Allocate(2 * kMiB, 1 * kMiB, &offset));
  EXPECT_EQ(offset, 0u);
  EXPECT_EQ(ra.free_bytes(), 0u);
  EXPECT_EQ(ra.largest_free_block(), 0u);
  ASSERT_TRUE(ra.Free(offset));

  uint64_t first, second;
  ASSERT_TRUE(ra.Allocate(1 * kMiB, 0, &first));
  ASSERT_TRUE(ra.Allocate(1 * kMiB, 1 * kMiB, &second));
  EXPECT_EQ(second, 1 * kMiB);
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, ExactFitInsideSizeClass) {
  // 65 units lies inside a class [64, 66) units; the rounded-up search misses it
  // but the request must still succeed.
  RangeAllocator ra(65 * 64, 64);
  uint64_t offset;
  ASSERT_TRUE(ra.Allocate(65 * 64, 0, &offset));
  EXPECT_EQ(offset, 0u);
  EXPECT_FALSE(ra.Allocate(64, 0, &offset));
  EXPECT_TRUE(ra.Free(0));
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, ExhaustionAndRecovery) {
  RangeAllocator ra(1 * kMiB, 64);
  std::vector<uint64_t> offsets;
  uint64_t offset;
  while (ra.Allocate(4 * kKiB, 0, &offset)) offsets.push_back(offset);
  EXPECT_EQ(offsets.size(), 256u);
  EXPECT_EQ(ra.used_bytes(), 1 * kMiB);
  EXPECT_EQ(ra.free_bytes(), 0u);
  EXPECT_EQ(ra.largest_free_block(), 0u);
  EXPECT_FALSE(ra.Allocate(64, 0, &offset));
  EXPECT_EQ(ra.allocation_count(), 256u);

  uint64_t hole = offsets[100];
  ASSERT_TRUE(ra.Free(hole));
  EXPECT_EQ(ra.largest_free_block(), 4 * kKiB);
  EXPECT_FALSE(ra.Allocate(4 * kKiB + 1, 0, &offset));
  ASSERT_TRUE(ra.Allocate(4 * kKiB, 0, &offset));
  EXPECT_EQ(offset, hole);
  EXPECT_FALSE(ra.Allocate(64, 0, &offset));

  // Two adjacent holes merge and hold a double-size block.
  ASSERT_TRUE(ra.Free(offsets[10]));
  ASSERT_TRUE(ra.Free(offsets[11]));
  EXPECT_EQ(ra.largest_free_block(), 8 * kKiB);
  ASSERT_TRUE(ra.Allocate(8 * kKiB, 0, &offset));
  EXPECT_EQ(offset, offsets[10]);
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, FreeInRandomOrderCoalescesEverything) {
  std::mt19937_64 rng(42);
  RangeAllocator ra(256 * kMiB, 128);
  std::vector<uint64_t> offsets;
  uint64_t offset;
  for (int i = 0; i < 5000; ++i) {
    uint64_t size = 1 + rng() % (32 * kKiB);
    uint64_t align = uint64_t{1} << (rng() % 14);
    ASSERT_TRUE(ra.Allocate(size, align, &offset));
    offsets.push_back(offset);
  }
  std::shuffle(offsets.begin(), offsets.end(), rng);
  for (size_t i = 0; i < offsets.size(); ++i) {
    ASSERT_TRUE(ra.Free(offsets[i]));
    if (i % 500 == 0) {
      ASSERT_TRUE(ra.Validate());
    }
  }
  EXPECT_EQ(ra.used_bytes(), 0u);
  EXPECT_EQ(ra.allocation_count(), 0u);
  EXPECT_EQ(ra.free_block_count(), 1u);
  EXPECT_EQ(ra.largest_free_block(), ra.capacity());
  EXPECT_TRUE(ra.Validate());
}

TEST(RangeAllocatorTest, DoubleFreeAndBogusOffsetChangeNothing) {
  RangeAllocator ra(1 * kMiB, 64);
  uint64_t a, b;
  ASSERT_TRUE(ra.Allocate(1000, 0, &a));
  ASSERT_TRUE(ra.Allocate(3000, 0, &b));
  ASSERT_TRUE(ra.Free(a));

  const uint64_t used = ra.used_bytes();
  const uint32_t count = ra.allocation_count();
  const uint64_t largest = ra.largest_free_block();
  const uint32_t free_blocks = ra.free_block_count();
  uint64_t size = 777;
  EXPECT_FALSE(ra.Free(a, &size));          // double free
  EXPECT_FALSE(ra.Free(b + 64, &size));     // inside a live block
  EXPECT_FALSE(ra.Free(b + 1, &size));      // misaligned
  EXPECT_FALSE(ra.Free(10 * kMiB, &size));  // past the end
  EXPECT_FALSE(ra.Free(UINT64_MAX, &size));
  EXPECT_EQ(size, 777u);
  EXPECT_EQ(ra.used_bytes(), used);
  EXPECT_EQ(ra.allocation_count(), count);
  EXPECT_EQ(ra.largest_free_block(), largest);
  EXPECT_EQ(ra.free_block_count(), free_blocks);
  EXPECT_TRUE(ra.Validate());

  ASSERT_TRUE(ra.Free(b, &size));
  EXPECT_EQ(size, 3008u);
  EXPECT_FALSE(ra.Free(b));
  EXPECT_EQ(ra.largest_free_block(), 1 * kMiB);
}

TEST(RangeAllocatorTest, EightGiBWithLargeAndTinyBlocks) {
  RangeAllocator ra(8 * kGiB, 256);
  uint64_t big, huge, tiny, offset;
  ASSERT_TRUE(ra.Allocate(4 * kGiB, 0, &big));
  ASSERT_TRUE(ra.Allocate(1, 0, &tiny));
  ASSERT_TRUE(ra.Allocate(2 * kGiB, 1 * kGiB, &huge));
  EXPECT_EQ(huge % kGiB, 0u);
  EXPECT_EQ(ra.AllocationSize(big), 4 * kGiB);
  EXPECT_EQ(ra.AllocationSize(tiny), 256u);
  EXPECT_EQ(ra.used_bytes(), 6 * kGiB + 256);

  std::vector<uint64_t> tinies;
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(ra.Allocate(1 + i % 300, 0, &offset));
    tinies.push_back(offset);
  }
  EXPECT_EQ(ra.allocation_count(), 10003u);
  EXPECT_FALSE(ra.Allocate(3 * kGiB, 0, &offset));
  EXPECT_TRUE(ra.Validate());

  ASSERT_TRUE(ra.Free(big));
  EXPECT_GE(ra.largest_free_block(), 4 * kGiB);
  ASSERT_TRUE(ra.Allocate(4 * kGiB, 0, &offset));
  EXPECT_EQ(offset, big);
  ASSERT_TRUE(ra.Free(offset));

  for (uint64_t t : tinies) ASSERT_TRUE(ra.Free(t));
  ASSERT_TRUE(ra.Free(tiny));
  ASSERT_TRUE(ra.Free(huge));
  EXPECT_EQ(ra.used_bytes(), 0u);
  EXPECT_EQ(ra.largest_free_block(), 8 * kGiB);
  // The whole range in one piece.
  ASSERT_TRUE(ra.Allocate(8 * kGiB, 0, &offset));
  EXPECT_EQ(offset, 0u);
  EXPECT_TRUE(ra.Validate());
}

// Reference model: live blocks by offset; gaps between them are free.
class Reference {
 public:
  explicit Reference(uint64_t capacity) : capacity_(capacity) {}

  // Checks that [offset, offset + size) is free, then records it.
  bool Insert(uint64_t offset, uint64_t size) {
    if (offset + size > capacity_ || offset + size < offset) return false;
    auto next = blocks_.lower_bound(offset);
    if (next != blocks_.end() && next->first < offset + size) return false;
    if (next != blocks_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second > offset) return false;
    }
    blocks_.emplace(offset, size);
    used_ += size;
    return true;
  }

  void Erase(uint64_t offset) {
    auto it = blocks_.find(offset);
    used_ -= it->second;
    blocks_.erase(it);
  }

  // Calls fn(offset, size) for every maximal gap.
  template <typename Fn>
  void ForEachGap(Fn fn) const {
    uint64_t cursor = 0;
    for (const auto& [offset, size] : blocks_) {
      if (offset > cursor) fn(cursor, offset - cursor);
      cursor = offset + size;
    }
    if (capacity_ > cursor) fn(cursor, capacity_ - cursor);
  }

  uint64_t LargestGap() const {
    uint64_t largest = 0;
    ForEachGap([&](uint64_t, uint64_t size) { largest = std::max(largest, size); });
    return largest;
  }

  bool AnyGapFits(uint64_t size, uint64_t align) const {
    bool fits = false;
    ForEachGap([&](uint64_t offset, uint64_t gap_size) {
      uint64_t skip = (0 - offset) & (align - 1);
      if (skip <= gap_size && size <= gap_size - skip) fits = true;
    });
    return fits;
  }

  const std::map<uint64_t, uint64_t>& blocks() const { return blocks_; }
  uint64_t used() const { return used_; }

 private:
  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> blocks_;
};

TEST(RangeAllocatorTest, RandomizedAgainstReference) {
  constexpr uint64_t kCapacity = 64 * kMiB;
  constexpr uint64_t kMinAlign = 256;
  constexpr int kOps = 200000;
  std::mt19937_64 rng(0x7e57);
  RangeAllocator ra(kCapacity, kMinAlign);
  Reference ref(kCapacity);
  std::vector<uint64_t> live;  // offsets, for picking a random victim
  int failures = 0;

  for (int op = 0; op < kOps; ++op) {
    // Alternate phases that fill the range towards exhaustion and drain it.
    const bool filling = (op / 10000) % 2 == 0;
    const bool allocate = live.empty() || rng() % 100 < (filling ? 70u : 30u);
    if (allocate) {
      // Log-uniform sizes 1 B .. 1 MiB, sometimes with a large alignment.
      uint64_t size = 1 + (rng() % (uint64_t{1} << (rng() % 21)));
      uint64_t align = 0;
      if (rng() % 4 == 0) align = uint64_t{1} << (rng() % 21);
      uint64_t effective_align = std::max(align, kMinAlign);
      uint64_t rounded = (size + kMinAlign - 1) / kMinAlign * kMinAlign;
      uint64_t offset;
      if (ra.Allocate(size, align, &offset)) {
        ASSERT_EQ(offset % effective_align, 0u) << "op " << op;
        ASSERT_EQ(ra.AllocationSize(offset), rounded) << "op " << op;
        ASSERT_TRUE(ref.Insert(offset, rounded)) << "overlap at op " << op;
        live.push_back(offset);
      } else {
        ++failures;
        ASSERT_FALSE(ref.AnyGapFits(rounded, effective_align))
            << "op " << op << ": refused " << rounded << " @" << effective_align;
      }
    } else {
      size_t pick = rng() % live.size();
      uint64_t offset = live[pick];
      live[pick] = live.back();
      live.pop_back();
      uint64_t size = 0;
      ASSERT_TRUE(ra.Free(offset, &size)) << "op " << op;
      ASSERT_EQ(size, ref.blocks().at(offset));
      ref.Erase(offset);
      ASSERT_FALSE(ra.Free(offset)) << "double free accepted at op " << op;
    }
    ASSERT_EQ(ra.used_bytes(), ref.used()) << "op " << op;
    ASSERT_EQ(ra.free_bytes(), kCapacity - ref.used());
    ASSERT_EQ(ra.allocation_count(), ref.blocks().size());
    if (op % 64 == 0) {
      ASSERT_EQ(ra.largest_free_block(), ref.LargestGap()) << "op " << op;
    }
    if (op % 5000 == 0) {
      ASSERT_TRUE(ra.Validate()) << "op " << op;
    }
  }
  EXPECT_GT(failures, 0);  // the fill phases must reach exhaustion

  for (uint64_t offset : live) ASSERT_TRUE(ra.Free(offset));
  EXPECT_EQ(ra.used_bytes(), 0u);
  EXPECT_EQ(ra.largest_free_block(), kCapacity);
  EXPECT_TRUE(ra.Validate());
}

}  // namespace
}  // namespace tern
