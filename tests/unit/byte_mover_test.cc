// The simulated DMA engine's byte move (driver_shim/sim/byte_mover.h): the
// strategy it reports for each TERN_SIM_COPY value, and that whichever
// strategy runs, every copy is a correct memmove (sizes around the string
// move's threshold, misaligned ends, overlapping ranges both ways). ctest
// runs this binary once per TERN_SIM_COPY value (the choice is made once
// per process); TERN_TEST_EXPECT_COPY names what the strategy must start
// with.
#include "driver_shim/sim/byte_mover.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tern::sim {
namespace {

std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::vector<uint8_t> bytes(size);
  uint32_t x = seed;
  for (uint8_t& b : bytes) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return bytes;
}

TEST(ByteMover, ReportsTheStrategyChosenForThisProcess) {
  const std::string strategy = ByteMoveStrategy();
  const char* expected = std::getenv("TERN_TEST_EXPECT_COPY");
  if (expected != nullptr && *expected) {
    EXPECT_EQ(strategy.rfind(expected, 0), 0u) << strategy;
  }
  // Either way it says which move and why.
  EXPECT_TRUE(strategy.rfind("memmove (", 0) == 0 || strategy.rfind("string move from ", 0) == 0)
      << strategy;
  EXPECT_EQ(ByteMoveStrategy(), strategy) << "the choice is made once per process";
}

TEST(ByteMover, DisjointCopiesOfEverySizeClass) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{256} << 10,
                      (size_t{256} << 10) - 1, (size_t{1} << 20) + 3, size_t{5} << 20}) {
    for (size_t skew : {size_t{0}, size_t{1}, size_t{63}}) {
      const std::vector<uint8_t> src = Pattern(size + skew, static_cast<uint32_t>(size + skew));
      std::vector<uint8_t> dst(size + 2 * 64, 0xee);
      MoveBytes(dst.data() + skew, src.data() + skew, size);
      // std::equal, not memcmp: an empty vector's data() may be null.
      ASSERT_TRUE(std::equal(src.begin() + skew, src.end(), dst.begin() + skew))
          << "size " << size << " skew " << skew;
      for (size_t i = 0; i < skew; ++i) ASSERT_EQ(dst[i], 0xee) << "wrote before the range";
      for (size_t i = skew + size; i < dst.size(); ++i) {
        ASSERT_EQ(dst[i], 0xee) << "wrote past the range";
      }
    }
  }
}

TEST(ByteMover, OverlappingRangesMoveLikeMemmove) {
  for (size_t size : {size_t{1000}, size_t{1} << 20}) {
    for (ptrdiff_t shift : {ptrdiff_t{-4097}, ptrdiff_t{-1}, ptrdiff_t{1}, ptrdiff_t{4097}}) {
      std::vector<uint8_t> ours = Pattern(size + 16384, 7);
      std::vector<uint8_t> expected = ours;
      uint8_t* base = ours.data() + 8192;
      MoveBytes(base + shift, base, size);
      std::memmove(expected.data() + 8192 + shift, expected.data() + 8192, size);
      ASSERT_EQ(ours, expected) << "size " << size << " shift " << shift;
    }
  }
}

}  // namespace
}  // namespace tern::sim
