// RANDOM: the documented Philox stream layout, reproducibility (same seed
// and offset, same bits, whatever the thread count or layout), distinct
// streams, ranges, and the moments of the distributions.

#include <cmath>
#include <set>

#include "driver_shim/sim/engines/numerics.h"
#include "driver_shim/sim/engines/philox_blocks.h"
#include "kernel_test_util.h"

namespace tern::testing {
namespace {

constexpr int64_t kSeed = 0x1234567890abcdefLL;

Status Random(Tensor& out, int fn, int64_t seed, int64_t offset, std::vector<double> floats = {}) {
  return Exec(TERN_OP_RANDOM, {&out}, {fn, seed, offset}, std::move(floats));
}

TEST(RandomTest, StreamLayoutIsTheDocumentedOne) {
  // Element i uses word i % 4 of Philox4x32-10 with counter (offset + i / 4)
  // and key (seed low, seed high); uniform keeps the top 24 bits.
  Tensor out(TERN_DTYPE_F32, {10});
  ASSERT_TRUE(Random(out, TERN_RANDOM_UNIFORM, kSeed, 77).ok());
  for (int64_t i = 0; i < 10; ++i) {
    const uint64_t c = 77 + i / 4;
    sim::num::Philox4 r =
        sim::num::Philox4x32_10({{static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}},
                                static_cast<uint32_t>(kSeed), static_cast<uint32_t>(kSeed >> 32));
    EXPECT_EQ(out.Get(i), (r.v[i % 4] >> 8) * 0x1.0p-24) << i;
  }
}

// Every code the CPU runs (AVX-512, AVX2, portable) computes each block as
// the per-block definition does: counts that leave tails after the vector
// passes, counters whose low word wraps inside a pass, a 64-bit offset, and
// a key with both halves set.
TEST(RandomTest, EveryPhiloxCodeMatchesTheBlockDefinition) {
  using sim::kernels::PhiloxCode;
  struct Case {
    uint64_t seed, offset, first;
    int64_t count;
  };
  const Case cases[] = {{0, 0, 0, 1},
                        {static_cast<uint64_t>(kSeed), 13, 0, 16},
                        {static_cast<uint64_t>(kSeed), 13, 5, 37},
                        {~0ull, 0xfffffff0ull, 3, 40},  // low word wraps mid-pass
                        {0x0123456789abcdefull, 0x7fffffffffffff00ull, 1000, 257}};
  int codes_run = 0;
  for (PhiloxCode code :
       {PhiloxCode::kBest, PhiloxCode::kPortable, PhiloxCode::kAvx2, PhiloxCode::kAvx512}) {
    if (!sim::kernels::PhiloxCodeRuns(code)) continue;
    ++codes_run;
    for (const Case& c : cases) {
      std::vector<uint32_t> words(static_cast<size_t>(4 * c.count) + 4, 0xdeadbeefu);
      sim::kernels::PhiloxBlocks(c.seed, c.offset, c.first, c.count, words.data(), code);
      for (int64_t j = 0; j < c.count; ++j) {
        const sim::num::Philox4 block =
            sim::num::RandomBlock(c.seed, c.offset, c.first + static_cast<uint64_t>(j));
        for (int w = 0; w < 4; ++w) {
          ASSERT_EQ(block.v[w], words[4 * j + w]) << "code " << static_cast<int>(code) << ", first "
                                                  << c.first << ", block " << j << ", word " << w;
        }
      }
      EXPECT_EQ(0xdeadbeefu, words[4 * c.count]) << "wrote past the last block";
    }
  }
  EXPECT_GE(codes_run, 2);
}

TEST(RandomTest, EveryFunctionMatchesTheElementByElementDefinition) {
  // Several chunks and threads' worth of elements, from an offset that is
  // not a block boundary of the output: each element as the ISA defines it,
  // from its own Philox block (the kernel computes blocks in batches).
  const int64_t rows = 3, cols = 1701, offset = 13;
  auto word = [&](int64_t i) {
    const sim::num::Philox4 r = sim::num::RandomBlock(static_cast<uint64_t>(kSeed), offset, i / 4);
    return r.v[i % 4];
  };
  Tensor uniform(TERN_DTYPE_F32, {rows, cols}), unit(TERN_DTYPE_F32, {rows, cols}),
      normal(TERN_DTYPE_F32, {rows, cols}), bernoulli(TERN_DTYPE_F32, {rows, cols}),
      integers(TERN_DTYPE_I32, {rows, cols});
  ASSERT_TRUE(Random(uniform, TERN_RANDOM_UNIFORM, kSeed, offset, {-1.0, 3.0}).ok());
  ASSERT_TRUE(Random(unit, TERN_RANDOM_UNIFORM, kSeed, offset, {0.0, 1.0}).ok());
  ASSERT_TRUE(Random(normal, TERN_RANDOM_NORMAL, kSeed, offset, {0.5, 2.0}).ok());
  ASSERT_TRUE(Random(bernoulli, TERN_RANDOM_BERNOULLI, kSeed, offset, {0.7}).ok());
  ASSERT_TRUE(Random(integers, TERN_RANDOM_UNIFORM, kSeed, offset, {-5, 100}).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint32_t w = word(i);
    const float u = static_cast<float>(-1.0 + 4.0 * static_cast<double>((w >> 8) * 0x1.0p-24f));
    wrong += uniform.Get(i) != (u >= 3.0 ? std::nextafter(3.0f, 0.0f) : u);
    wrong += unit.Get(i) != (w >> 8) * 0x1.0p-24;
    const int64_t pair = i & ~int64_t{1};
    const uint32_t w1 = word(pair), w2 = word(pair + 1);
    const double u1 = (static_cast<double>(w1 >> 8) + 1.0) * 0x1.0p-24;
    const double u2 = static_cast<double>(w2 >> 8) * 0x1.0p-24;
    const double r = std::sqrt(-2.0 * std::log(u1)), angle = 6.283185307179586477 * u2;
    const double z = (i & 1) ? r * std::sin(angle) : r * std::cos(angle);
    wrong += normal.Get(i) != static_cast<float>(0.5 + 2.0 * z);
    wrong += bernoulli.Get(i) != (static_cast<double>((w >> 8) * 0x1.0p-24f) < 0.7 ? 1.0 : 0.0);
    wrong += integers.Get(i) != -5 + static_cast<int64_t>((static_cast<uint64_t>(w) * 105) >> 32);
  }
  EXPECT_EQ(wrong, 0);
}

TEST(RandomTest, SameSeedAndOffsetGiveTheSameBits) {
  for (tern_dtype_t dt : kAllDtypes) {
    for (int fn = 0; fn < TERN_RANDOM_COUNT; ++fn) {
      if (fn == TERN_RANDOM_NORMAL && !isa::IsFloat(dt)) continue;
      if (fn == TERN_RANDOM_UNIFORM && dt == TERN_DTYPE_BOOL) continue;
      std::vector<double> params = fn == TERN_RANDOM_BERNOULLI ? std::vector<double>{0.5}
                                   : isa::IsFloat(dt)          ? std::vector<double>{-1.0, 3.0}
                                                               : std::vector<double>{-5, 100};
      Tensor a(dt, {37, 11}), b(dt, {37, 11}), c(dt, {37, 11});
      ASSERT_TRUE(Random(a, fn, kSeed, 5, params).ok());
      ASSERT_TRUE(Random(b, fn, kSeed, 5, params).ok());
      ASSERT_TRUE(Random(c, fn, kSeed + 1, 5, params).ok());
      int differ = 0;
      for (int64_t i = 0; i < a.count(); ++i) {
        ASSERT_EQ(a.Bits(i), b.Bits(i));
        differ += a.Bits(i) != c.Bits(i);
      }
      if (fn != TERN_RANDOM_BERNOULLI && dt != TERN_DTYPE_BOOL) {
        EXPECT_GT(differ, a.count() * 3 / 4) << "another seed, another stream";
      }
    }
  }
}

TEST(RandomTest, OffsetsAdvanceByBlocksOfFour) {
  for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_I32}) {
    for (int fn = 0; fn < TERN_RANDOM_COUNT; ++fn) {
      if (fn == TERN_RANDOM_NORMAL && !isa::IsFloat(dt)) continue;
      std::vector<double> params = fn == TERN_RANDOM_BERNOULLI ? std::vector<double>{0.4}
                                   : isa::IsFloat(dt)          ? std::vector<double>{0.0, 1.0}
                                                               : std::vector<double>{0, 1000};
      Tensor a(dt, {400}), b(dt, {400});
      ASSERT_TRUE(Random(a, fn, kSeed, 10, params).ok());
      ASSERT_TRUE(Random(b, fn, kSeed, 11, params).ok());
      // Offset + 1 is the same stream, four elements on.
      for (int64_t i = 0; i + 4 < 400; ++i) ASSERT_EQ(a.Bits(i + 4), b.Bits(i)) << i;
      // Disjoint ranges: offset + n/4 continues where n elements ended.
      Tensor tail(dt, {100});
      ASSERT_TRUE(Random(tail, fn, kSeed, 10 + 300 / 4, params).ok());
      for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(a.Bits(300 + i), tail.Bits(i));
      if (fn != TERN_RANDOM_BERNOULLI) {
        int same = 0;
        for (int64_t i = 0; i < 400; ++i) same += a.Bits(i) == b.Bits(i);
        EXPECT_LT(same, 40);
      }
    }
  }
}

TEST(RandomTest, IndependentOfThreadsAndLayout) {
  const int64_t n = 1 << 20;
  Tensor one(TERN_DTYPE_F32, {n}), two(TERN_DTYPE_F32, {n});
  const int threads = KernelThreadsForHost();
  SetKernelThreadsForTesting(1);
  ASSERT_TRUE(Random(one, TERN_RANDOM_NORMAL, kSeed, 3).ok());
  SetKernelThreadsForTesting(std::max(2, threads));
  ASSERT_TRUE(Random(two, TERN_RANDOM_NORMAL, kSeed, 3).ok());
  SetKernelThreadsForTesting(0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(one.Bits(i), two.Bits(i)) << i;
  // Element i is the logical (row-major) element, whatever the strides.
  Tensor contiguous(TERN_DTYPE_BF16, {33, 65}),
      transposed = Tensor::Permuted(TERN_DTYPE_BF16, {33, 65}, {1, 0});
  ASSERT_TRUE(Random(contiguous, TERN_RANDOM_UNIFORM, kSeed, 9, {-2, 2}).ok());
  ASSERT_TRUE(Random(transposed, TERN_RANDOM_UNIFORM, kSeed, 9, {-2, 2}).ok());
  for (int64_t i = 0; i < contiguous.count(); ++i)
    ASSERT_EQ(contiguous.Bits(i), transposed.Bits(i));
  Tensor scalar(TERN_DTYPE_F32, {}), first(TERN_DTYPE_F32, {3}), empty(TERN_DTYPE_F32, {0, 3});
  ASSERT_TRUE(Random(scalar, TERN_RANDOM_UNIFORM, kSeed, 77).ok());
  ASSERT_TRUE(Random(first, TERN_RANDOM_UNIFORM, kSeed, 77).ok());
  EXPECT_EQ(scalar.Bits(0), first.Bits(0));
  ASSERT_TRUE(Random(empty, TERN_RANDOM_UNIFORM, kSeed, 77).ok());
}

TEST(RandomTest, UniformStaysInRange) {
  const int64_t n = 1 << 20;
  for (tern_dtype_t dt : kFloatDtypes) {
    Tensor t(dt, {n});
    ASSERT_TRUE(Random(t, TERN_RANDOM_UNIFORM, kSeed, 0, {0.0, 1.0}).ok());
    double sum = 0, lo = 1, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = t.Get(i);
      sum += v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GE(lo, 0.0);
    EXPECT_LT(hi, 1.0) << isa::DTypeName(dt) << ": values that round up to high are stepped down";
    EXPECT_NEAR(sum / n, 0.5, 2e-3);
    Tensor shifted(dt, {1000});
    ASSERT_TRUE(Random(shifted, TERN_RANDOM_UNIFORM, kSeed, 0, {-3.0, -2.5}).ok());
    for (int64_t i = 0; i < 1000; ++i) {
      ASSERT_GE(shifted.Get(i), -3.0);
      ASSERT_LT(shifted.Get(i), -2.5);
    }
  }
  // Integers: every value of a small range, none outside.
  for (tern_dtype_t dt : kIntDtypes) {
    Tensor t(dt, {10000});
    ASSERT_TRUE(Random(t, TERN_RANDOM_UNIFORM, kSeed, 0, {-3, 4}).ok());
    std::set<int64_t> seen;
    for (int64_t i = 0; i < t.count(); ++i) seen.insert(t.GetInt(i));
    EXPECT_EQ(seen, (std::set<int64_t>{-3, -2, -1, 0, 1, 2, 3})) << isa::DTypeName(dt);
  }
  Tensor wide(TERN_DTYPE_I64, {1000});
  ASSERT_TRUE(Random(wide, TERN_RANDOM_UNIFORM, kSeed, 0, {-2147483648.0, 2147483648.0}).ok());
  int64_t big = 0;
  for (int64_t i = 0; i < 1000; ++i) big += std::llabs(wide.GetInt(i)) > (1LL << 30);
  EXPECT_GT(big, 300);
}

TEST(RandomTest, NormalMoments) {
  const int64_t n = 1 << 20;
  Tensor t(TERN_DTYPE_F32, {n});
  ASSERT_TRUE(Random(t, TERN_RANDOM_NORMAL, kSeed, 1, {3.0, 2.0}).ok());
  double sum = 0, sq = 0;
  int64_t beyond3 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = t.Get(i);
    sum += v;
    sq += v * v;
    beyond3 += std::fabs(v - 3.0) > 6.0;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 3.0, 2.0 * 5 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(sd, 2.0, 0.01);
  EXPECT_NEAR(static_cast<double>(beyond3) / n, 0.0027, 0.0005);  // P(|z| > 3)
  Tensor b(TERN_DTYPE_BF16, {100000});
  ASSERT_TRUE(Random(b, TERN_RANDOM_NORMAL, kSeed, 1).ok());
  double bs = 0;
  for (int64_t i = 0; i < b.count(); ++i) bs += b.Get(i);
  EXPECT_NEAR(bs / b.count(), 0.0, 0.02);
}

TEST(RandomTest, BernoulliRateInEveryDtype) {
  const int64_t n = 1 << 20;
  for (tern_dtype_t dt : {TERN_DTYPE_BOOL, TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_I32}) {
    Tensor t(dt, {n});
    ASSERT_TRUE(Random(t, TERN_RANDOM_BERNOULLI, kSeed, 2, {0.9}).ok());  // a dropout keep-mask
    int64_t ones = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = t.Get(i);
      ASSERT_TRUE(v == 0.0 || v == 1.0) << v;
      ones += v == 1.0;
    }
    EXPECT_NEAR(static_cast<double>(ones) / n, 0.9, 5 * std::sqrt(0.09 / n)) << isa::DTypeName(dt);
  }
  Tensor never(TERN_DTYPE_BOOL, {1000}), always(TERN_DTYPE_BOOL, {1000});
  ASSERT_TRUE(Random(never, TERN_RANDOM_BERNOULLI, kSeed, 0, {0.0}).ok());
  ASSERT_TRUE(Random(always, TERN_RANDOM_BERNOULLI, kSeed, 0, {1.0}).ok());
  for (int64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(never.GetInt(i), 0);
    ASSERT_EQ(always.GetInt(i), 1);
  }
}

}  // namespace
}  // namespace tern::testing
