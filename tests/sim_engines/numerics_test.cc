// The scalar numerics under every kernel: bf16/f16 conversions against
// independent references, the vectorisable math against libm in double, and
// Philox4x32-10 against the published known-answer vectors.
#include "driver_shim/sim/engines/numerics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

namespace tern::sim::num {
namespace {

// f32 -> bf16 by comparing the two neighbours in double (ties to even): an
// implementation that shares nothing with the bit trick under test.
uint16_t ReferenceBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation: toward zero
  if ((u & 0xffff) == 0) return lo;
  uint16_t hi = static_cast<uint16_t>(lo + 1);  // away from zero (may become Inf)
  double dlo =
      std::fabs(static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(lo) << 16)));
  double dhi =
      std::fabs(static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(hi) << 16)));
  if ((hi & 0x7fff) == 0x7f80) dhi = std::ldexp(1.0, 128);  // the next step past the max is 2^128
  double df = std::fabs(static_cast<double>(f));
  if (df - dlo < dhi - df) return lo;
  if (df - dlo > dhi - df) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(NumericsTest, Bf16ToF32IsExactForEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
  }
}

TEST(NumericsTest, F32ToBf16RoundsToNearestEven) {
  const float cases[] = {0.0f,
                         -0.0f,
                         1.0f,
                         1.00390625f,  // 1 + 2^-8: a tie between 1 and 1 + 2^-7 -> even (1)
                         1.01171875f,  // 1 + 3 * 2^-8: tie -> 1 + 2^-6 (even)
                         3.0e38f,
                         3.3961775e38f,  // above the largest bf16 (3.3895e38): rounds to Inf
                         INFINITY,
                         -INFINITY,
                         1e-40f,  // denormal
                         std::numeric_limits<float>::denorm_min(),
                         std::numeric_limits<float>::max(),
                         -std::numeric_limits<float>::max()};
  for (float f : cases) EXPECT_EQ(F32ToBf16(f), ReferenceBf16(f)) << f;
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.01171875f), 0x3f82);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to Inf
  uint16_t nan = F32ToBf16(std::nanf(""));
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x7f, 0);  // still a NaN, not Inf
  EXPECT_TRUE(
      std::isnan(Bf16ToF32(F32ToBf16(std::bit_cast<float>(0x7f800001u)))));  // payload in low bits
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToBf16(f), ReferenceBf16(f)) << std::hexfloat << f;
  }
}

// binary16 from its definition, in double (shares nothing with the bit
// tricks under test, and needs no _Float16, which clang before 15 lacks on
// x86): a pattern's value, and a float rounded to the nearest pattern.
float ReferenceF16ToF32(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return static_cast<float>(mantissa ? NAN : sign * INFINITY);
  if (exponent == 0) return static_cast<float>(sign * std::ldexp(mantissa, -24));
  return static_cast<float>(sign * std::ldexp(mantissa + 1024, exponent - 25));
}

uint16_t ReferenceF32ToF16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00);
  const double magnitude = std::fabs(static_cast<double>(f));
  int binade = 0;
  std::frexp(magnitude, &binade);  // magnitude in [2^(binade-1), 2^binade)
  // The spacing of halves there: 11 significant bits, 2^-24 below 2^-14.
  const int spacing = std::max(binade - 11, -24);
  const double rounded =
      std::ldexp(std::nearbyint(std::ldexp(magnitude, -spacing)), spacing);  // ties to even
  if (rounded > 65504.0) return static_cast<uint16_t>(sign | 0x7c00);
  if (rounded < 0x1p-14) return static_cast<uint16_t>(sign | static_cast<int>(rounded * 0x1p24));
  int e = 0;
  std::frexp(rounded, &e);  // rounded in [2^(e-1), 2^e): exponent field e - 1 + 15
  const int mantissa = static_cast<int>(std::ldexp(rounded, 11 - e)) - 1024;
  return static_cast<uint16_t>(sign | ((e + 14) << 10) | mantissa);
}

TEST(NumericsTest, F16ConversionsMatchTheDefinition) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float expect = ReferenceF16ToF32(bits);
    const float got = F16ToF32(bits);
    if (std::isnan(expect)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expect)) << h;
    }
    // Every pattern but NaN survives a round trip through float.
    if (!std::isnan(expect)) {
      ASSERT_EQ(ReferenceF32ToF16(expect), bits) << h;
    }
  }
  auto reference = ReferenceF32ToF16;
  const float cases[] = {0.0f,    -0.0f,    1.0f,      65504.0f, 65519.99f,     65520.0f,
                         1e6f,    INFINITY, -INFINITY, 5.96e-8f, 2.98e-8f,      2.99e-8f,
                         6.1e-5f, 6.09e-5f, 1e-10f,    -3.0e-5f, 1.00048828125f /* tie -> even */};
  for (float f : cases) EXPECT_EQ(F32ToF16(f), reference(f)) << f;
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // ties up to Inf
  EXPECT_EQ(F32ToF16(1.00048828125f), 0x3c00);
  EXPECT_EQ(F32ToF16(std::nanf("")) & 0x7e00, 0x7e00);
  std::mt19937 rng(2);
  for (int i = 0; i < 200000; ++i) {
    // Bias the samples toward the f16 range.
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 2) u = (u & 0x807fffffu) | ((100u + (u >> 24) % 50u) << 23);
    float f = std::bit_cast<float>(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), reference(f)) << std::hexfloat << f;
  }
}

// Relative error of f against a double reference, in units of float epsilon,
// with an absolute floor for results near 0.
double UlpError(double got, double ref, double floor = 1e-30) {
  return std::fabs(got - ref) / std::max(std::fabs(ref), floor) / 0x1.0p-23;
}

TEST(NumericsTest, ExpIsAccurateAndHandlesTheEdges) {
  double worst = 0;
  for (double x = -87.0; x <= 88.5; x += 0.0137) {
    worst = std::max(worst, UlpError(Exp(static_cast<float>(x)),
                                     std::exp(static_cast<double>(static_cast<float>(x)))));
  }
  EXPECT_LT(worst, 2.0);
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-INFINITY), 0.0f);
  EXPECT_EQ(Exp(INFINITY), INFINITY);
  EXPECT_EQ(Exp(89.0f), INFINITY);
  EXPECT_EQ(Exp(-110.0f), 0.0f);
  EXPECT_TRUE(std::isnan(Exp(NAN)));
  // Denormal results: within one denormal step.
  EXPECT_NEAR(Exp(-100.0f), std::exp(-100.0), 0x1.0p-149);
}

TEST(NumericsTest, TanhErfcSigmoidAndGeluTanhAreAccurate) {
  double tanh_worst = 0, erfc_worst = 0, sig_worst = 0, gelu_tanh_worst = 0;
  for (double xd = -12.0; xd <= 12.0; xd += 0.00731) {
    float x = static_cast<float>(xd);
    double xv = x;
    tanh_worst = std::max(tanh_worst, UlpError(Tanh(x), std::tanh(xv)));
    if (xv > -9.0) erfc_worst = std::max(erfc_worst, UlpError(Erfc(x), std::erfc(xv)));
    sig_worst = std::max(sig_worst, UlpError(Sigmoid(x), 1.0 / (1.0 + std::exp(-xv))));
    double u = std::sqrt(2.0 / M_PI) * (xv + 0.044715 * xv * xv * xv);
    double gt = xv / (1.0 + std::exp(-2.0 * u));  // 0.5 x (1 + tanh u) without cancellation
    if (std::fabs(gt) > 1e-20)
      gelu_tanh_worst = std::max(gelu_tanh_worst, UlpError(GeluTanh(x), gt));
  }
  EXPECT_LT(tanh_worst, 4.0);
  // About 1e-7 near 0; in the far tail the rounding of the exp argument
  // (|x|^2 * 2^-24) dominates.
  EXPECT_LT(erfc_worst, 128.0);
  EXPECT_LT(sig_worst, 4.0);
  EXPECT_LT(gelu_tanh_worst, 128.0);
  EXPECT_EQ(Tanh(INFINITY), 1.0f);
  EXPECT_EQ(Tanh(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(Tanh(NAN)));
  EXPECT_EQ(Tanh(-0.0f), -0.0f);
  EXPECT_TRUE(std::signbit(Tanh(-0.0f)));
  EXPECT_EQ(Sigmoid(-INFINITY), 0.0f);
  EXPECT_EQ(Sigmoid(INFINITY), 1.0f);
}

// Error of `got` against the exact `ref` in units in the last place of the
// float nearest to ref (subnormal spacing below 2^-126).
double FloatUlps(float got, double ref) {
  int exponent = 0;
  std::frexp(ref, &exponent);
  const double ulp = std::ldexp(1.0, std::max(exponent - 24, -149));
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// Worst errors of f against ref over every `step`-th float of [lo, hi)
// (bit patterns), and of their negatives when `both_signs`.
struct Worst {
  double ulps = 0, abs = 0;
  float ulps_at = 0, abs_at = 0;
};
template <typename F, typename R>
Worst Sweep(F f, R ref, float lo, float hi, uint32_t step, bool both_signs) {
  Worst w;
  const uint32_t begin = std::bit_cast<uint32_t>(lo), end = std::bit_cast<uint32_t>(hi);
  for (int sign = 0; sign < (both_signs ? 2 : 1); ++sign) {
    for (uint64_t u = begin; u < end; u += step) {
      const float x = std::bit_cast<float>(static_cast<uint32_t>(u) | (sign ? 0x80000000u : 0u));
      const double r = ref(static_cast<double>(x));
      const float g = f(x);
      if (std::fabs(r) > 0x1.fffffep127) continue;  // beyond float: checked as edges
      const double ulps = FloatUlps(g, r), abs = std::fabs(static_cast<double>(g) - r);
      if (!(ulps <= w.ulps)) w.ulps = ulps, w.ulps_at = x;
      if (!(abs <= w.abs)) w.abs = abs, w.abs_at = x;
    }
  }
  return w;
}

double ExactGelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

// Erf and the exact gelu built on it: a rational approximation with no exp,
// so accuracy is stated in absolute terms (what PyTorch's CPU kernel, which
// computes 0.5 x (1 + erf(x / sqrt 2)) too, offers). This file is compiled
// without FMA; the engines' AVX2 (x86-64-v3) / AVX-512 clones contract to
// FMA and do a little better (erf 3.6e-7, gelu 9.6e-7 absolute, over a dense
// sweep; without FMA, gelu 1.16e-6 near x = -5.39).
TEST(NumericsTest, ErfAndGeluAreAccurateInAbsoluteTerms) {
  auto erf_ref = [](double x) { return std::erf(x); };
  const Worst erf = Sweep(Erf, erf_ref, 0x1.0p-40f, 16.0f, 1009, true);
  EXPECT_LT(erf.abs, 5e-7) << "at " << erf.abs_at;
  const Worst erf_small = Sweep(Erf, erf_ref, 0x1.0p-126f, 1.0f, 2003, true);
  EXPECT_LT(erf_small.ulps, 4.0) << "at " << erf_small.ulps_at;
  // Where erf rounds to 1, it is exactly 1.
  EXPECT_EQ(Erf(3.92f), 1.0f);
  EXPECT_EQ(Erf(-100.0f), -1.0f);
  EXPECT_EQ(Erf(INFINITY), 1.0f);
  EXPECT_EQ(Erf(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(Erf(NAN)));
  EXPECT_EQ(Erf(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(Erf(-0.0f)));
  EXPECT_NEAR(Erf(0x1.0p-140f), 1.1283791670955126 * 0x1.0p-140, 0x1.0p-149);  // subnormal

  const Worst gelu = Sweep(Gelu, ExactGelu, 0x1.0p-40f, 64.0f, 1009, true);
  EXPECT_LT(gelu.abs, 1.7e-6) << "at " << gelu.abs_at;
  // Relative accuracy holds where gelu is not small: x >= 0 ...
  const Worst gelu_positive = Sweep(Gelu, ExactGelu, 0x1.0p-126f, 64.0f, 2003, false);
  EXPECT_LT(gelu_positive.ulps, 4.0) << "at " << gelu_positive.ulps_at;
  // ... and it degrades gracefully below: about 1e-4 relative at x = -3.
  for (float x = -3.0f; x < 0.0f; x += 0.001f) {
    ASSERT_LT(std::fabs(Gelu(x) - ExactGelu(x)), 2e-4 * std::fabs(ExactGelu(x)) + 1e-12) << x;
  }
  EXPECT_EQ(Gelu(INFINITY), INFINITY);
  EXPECT_EQ(Gelu(-INFINITY), 0.0f);
  EXPECT_TRUE(std::signbit(Gelu(-INFINITY)));
  EXPECT_EQ(Gelu(-6.0f), 0.0f);  // true value -5.9e-9: below the stated accuracy
  EXPECT_EQ(Gelu(30.0f), 30.0f);
  EXPECT_TRUE(std::isnan(Gelu(NAN)));
  EXPECT_TRUE(std::signbit(Gelu(-0.0f)));
}

TEST(NumericsTest, LogLog1pAndExpm1AreAccurate) {
  // Every float would take minutes; every 1009th still crosses every binade
  // and mantissa region, subnormals included.
  const Worst log = Sweep(
      Log, [](double x) { return std::log(x); }, 0x1.0p-149f, INFINITY, 1009, false);
  EXPECT_LT(log.ulps, 1.5) << "at " << log.ulps_at;
  const Worst log1p = Sweep(
      Log1p, [](double x) { return std::log1p(x); }, 0x1.0p-149f, INFINITY, 1009, false);
  EXPECT_LT(log1p.ulps, 2.5) << "at " << log1p.ulps_at;
  const Worst log1p_negative = Sweep(
      Log1p, [](double x) { return std::log1p(x); }, 0x1.0p-149f, 0x1.fffffep-1f, 1009, true);
  EXPECT_LT(log1p_negative.ulps, 2.5) << "at " << log1p_negative.ulps_at;
  const Worst expm1 = Sweep(
      Expm1, [](double x) { return std::expm1(x); }, 0x1.0p-149f, 88.0f, 1009, true);
  EXPECT_LT(expm1.ulps, 2.5) << "at " << expm1.ulps_at;

  EXPECT_EQ(Log(1.0f), 0.0f);
  EXPECT_EQ(Log(0.0f), -INFINITY);
  EXPECT_EQ(Log(-0.0f), -INFINITY);
  EXPECT_EQ(Log(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(Log(-1.0f)));
  EXPECT_TRUE(std::isnan(Log(-INFINITY)));
  EXPECT_TRUE(std::isnan(Log(NAN)));
  EXPECT_NEAR(Log(0x1.0p-149f), std::log(0x1.0p-149), 1e-5);
  EXPECT_EQ(Log1p(-1.0f), -INFINITY);
  EXPECT_EQ(Log1p(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(Log1p(-2.0f)));
  EXPECT_TRUE(std::isnan(Log1p(NAN)));
  EXPECT_EQ(Log1p(0x1.0p-30f), 0x1.0p-30f);
  EXPECT_TRUE(std::signbit(Log1p(-0.0f)));
  EXPECT_EQ(Expm1(-INFINITY), -1.0f);
  EXPECT_EQ(Expm1(INFINITY), INFINITY);
  EXPECT_EQ(Expm1(89.0f), INFINITY);
  EXPECT_EQ(Expm1(-100.0f), -1.0f);
  EXPECT_TRUE(std::isnan(Expm1(NAN)));
  EXPECT_TRUE(std::signbit(Expm1(-0.0f)));
  EXPECT_EQ(Expm1(0x1.0p-30f), 0x1.0p-30f);
}

TEST(NumericsTest, PhiloxMatchesKnownAnswers) {
  // Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
  Philox4 zero = Philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(zero.v[0], 0x6627e8d5u);
  EXPECT_EQ(zero.v[1], 0xe169c58du);
  EXPECT_EQ(zero.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.v[3], 0x9b00dbd8u);
  Philox4 ones = Philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                               0xffffffffu);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);
  Philox4 pi = Philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                             0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

}  // namespace
}  // namespace tern::sim::num
