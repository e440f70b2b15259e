// The reduction kernels of the collectives: rounding of bf16 and fp16
// (common/half_float.h, which they use),
// symmetric MAX/MIN with NaN and signed zeros, wrap-around of integer SUM
// and PROD, and AVG's final division.
#include "collectives/comm_kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half_float.h"

namespace tern::comm {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

TEST(CommKernels, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7): ties to even (1).
  EXPECT_EQ(0x3f80, F32ToBf16(std::bit_cast<float>(0x3f808000u)));
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(0x3f82, F32ToBf16(std::bit_cast<float>(0x3f818000u)));
  // Just above halfway rounds up.
  EXPECT_EQ(0x3f81, F32ToBf16(std::bit_cast<float>(0x3f808001u)));
  // NaN stays NaN (quiet), infinities stay.
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(0x7f80, F32ToBf16(std::numeric_limits<float>::infinity()));
  // Overflow to infinity when rounding up the largest finite.
  EXPECT_EQ(0x7f80, F32ToBf16(std::bit_cast<float>(0x7f7fffffu)));
}

TEST(CommKernels, Fp16RoundsToNearestEven) {
  EXPECT_EQ(0x3c00, F32ToF16(1.0f));
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(0x3c00, F32ToF16(1.0f + std::ldexp(1.0f, -11)));
  EXPECT_EQ(0x3c02, F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)));
  EXPECT_EQ(0x7c00, F32ToF16(70000.0f));  // overflow
  EXPECT_EQ(1.5f, F16ToF32(0x3e00));
}

TEST(CommKernels, Bf16SumRoundsEachStep) {
  // 256 + 1 is not representable in bf16 (8 bits of mantissa): rounds to 256.
  const uint16_t a[2] = {F32ToBf16(256.0f), F32ToBf16(256.0f)};
  const uint16_t b[2] = {F32ToBf16(1.0f), F32ToBf16(3.0f)};
  uint16_t out[2];
  Reduce(out, a, b, 2, TERN_DTYPE_BF16, TERN_COMM_SUM);
  EXPECT_EQ(256.0f, Bf16ToF32(out[0]));  // 257 ties to even: 256
  EXPECT_EQ(260.0f, Bf16ToF32(out[1]));  // 259 rounds to 260
}

TEST(CommKernels, Fp16SumOfEveryLength) {
  // Lengths around the eight-wide hardware path.
  for (size_t n : {1u, 7u, 8u, 9u, 31u}) {
    std::vector<uint16_t> a(n), b(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = F32ToF16(static_cast<float>(i) * 0.5f);
      b[i] = F32ToF16(static_cast<float>(i) * 0.25f + 1.0f);
    }
    Reduce(out.data(), a.data(), b.data(), n, TERN_DTYPE_F16, TERN_COMM_SUM);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(F32ToF16(static_cast<float>(i) * 0.75f + 1.0f), out[i]) << n << " " << i;
    }
  }
}

TEST(CommKernels, MaxMinAreSymmetric) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float values[] = {-0.0f, 0.0f, 1.0f, -1.0f, nan, std::numeric_limits<float>::infinity()};
  for (float x : values) {
    for (float y : values) {
      for (tern_comm_redop_t op : {TERN_COMM_MAX, TERN_COMM_MIN}) {
        float xy, yx;
        Reduce(&xy, &x, &y, 1, TERN_DTYPE_F32, op);
        Reduce(&yx, &y, &x, 1, TERN_DTYPE_F32, op);
        EXPECT_EQ(Bits(xy), Bits(yx)) << x << " " << y << " op " << op;
        if (std::isnan(x) || std::isnan(y)) {
          EXPECT_TRUE(std::isnan(xy));
        }
      }
    }
  }
  float zero = 0.0f, minus_zero = -0.0f, out;
  Reduce(&out, &zero, &minus_zero, 1, TERN_DTYPE_F32, TERN_COMM_MAX);
  EXPECT_EQ(Bits(0.0f), Bits(out));
  Reduce(&out, &zero, &minus_zero, 1, TERN_DTYPE_F32, TERN_COMM_MIN);
  EXPECT_EQ(Bits(-0.0f), Bits(out));
}

TEST(CommKernels, IntegersWrapAround) {
  const int8_t a[3] = {120, -128, 100};
  const int8_t b[3] = {10, -1, 3};
  int8_t out[3];
  Reduce(out, a, b, 3, TERN_DTYPE_I8, TERN_COMM_SUM);
  EXPECT_EQ(static_cast<int8_t>(-126), out[0]);
  EXPECT_EQ(static_cast<int8_t>(127), out[1]);
  Reduce(out, a, b, 3, TERN_DTYPE_I8, TERN_COMM_PROD);
  EXPECT_EQ(static_cast<int8_t>(120 * 10), out[0]);
  EXPECT_EQ(static_cast<int8_t>(-128), out[1]);  // -128 * -1 wraps to -128
  const int64_t big[1] = {INT64_MAX}, one[1] = {1};
  int64_t out64[1];
  Reduce(out64, big, one, 1, TERN_DTYPE_I64, TERN_COMM_SUM);
  EXPECT_EQ(INT64_MIN, out64[0]);
}

TEST(CommKernels, AverageDividesOnce) {
  const int32_t sums[3] = {7, -7, 9};
  int32_t out[3];
  DivideBy(out, sums, 3, TERN_DTYPE_I32, 2);
  EXPECT_EQ(3, out[0]);
  EXPECT_EQ(-3, out[1]);  // truncated toward zero
  EXPECT_EQ(4, out[2]);
  const int8_t small[1] = {-100};
  int8_t out8[1];
  DivideBy(out8, small, 1, TERN_DTYPE_I8, 300);  // a divisor beyond int8
  EXPECT_EQ(0, out8[0]);
  const float f[1] = {1.0f};
  float g[1];
  DivideBy(g, f, 1, TERN_DTYPE_F32, 3);
  EXPECT_EQ(1.0f / 3.0f, g[0]);
  const uint16_t h[1] = {F32ToBf16(1.0f)};
  uint16_t hb[1];
  DivideBy(hb, h, 1, TERN_DTYPE_BF16, 3);
  EXPECT_EQ(F32ToBf16(1.0f / 3.0f), hb[0]);
}

TEST(CommKernels, InPlaceAliasing) {
  std::vector<float> a(1000), b(1000);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 2.0f;
  }
  Reduce(a.data(), a.data(), b.data(), a.size(), TERN_DTYPE_F32, TERN_COMM_PROD);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(static_cast<float>(2 * i), a[i]);
}

TEST(CommKernels, ReducibleDtypesAndNames) {
  for (tern_dtype_t d : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I8,
                         TERN_DTYPE_I32, TERN_DTYPE_I64}) {
    EXPECT_TRUE(IsReducible(d)) << d;
  }
  EXPECT_FALSE(IsReducible(TERN_DTYPE_BOOL));
  EXPECT_FALSE(IsReducible(TERN_DTYPE_COUNT));
  EXPECT_STREQ("avg", RedopName(TERN_COMM_AVG));
}

}  // namespace
}  // namespace tern::comm
