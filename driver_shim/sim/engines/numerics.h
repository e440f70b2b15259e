// Scalar numerics of the simulated engines: bf16/f16 conversions (from
// common/half_float.h), branch-free float math that the
// compiler vectorises (exp, expm1, log, log1p, tanh, erf, erfc and the
// activations built on them), and the Philox4x32-10 counter-based generator.
//
// Accuracy of the float math, measured against double-precision libm over
// every float (or a dense sample) by tests/sim_engines/numerics_test.cc:
//   Exp < 2 ulp; Log, Log1p, Expm1 < 2 ulp; Tanh, Sigmoid < 4 ulp;
//   Erf: absolute error < 4e-7, and < 2 ulp where |x| < 1;
//   Gelu (exact, erf form): absolute error < 1e-6 with FMA (the engines'
//   vector clones), < 1.2e-6 without, largest near x = -5.4 (results near 1 and
//   beyond carry a few ulps; the far negative tail, where gelu is below
//   1e-7, is exact in absolute terms only, as in PyTorch's CPU kernel);
//   Erfc: relative error ~1e-7 near 0, growing to ~1e-5 in the far tail.
//
// Everything here is header-only and branch-free where it sits in hot loops:
// both sides of a select are computed, so loops over these functions
// vectorise.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_NUMERICS_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_NUMERICS_H_

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/half_float.h"

#define TERN_INLINE inline __attribute__((always_inline))

namespace tern::sim::num {

TERN_INLINE uint32_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }
TERN_INLINE float BitsFloat(uint32_t u) { return std::bit_cast<float>(u); }

// --- bf16 and f16: common/half_float.h ------------------------------------

using tern::Bf16ToF32;
using tern::F16ToF32;
using tern::F32ToBf16;
using tern::F32ToF16;

// --- vectorisable float math ------------------------------------------------

TERN_INLINE float Select(bool c, float a, float b) { return c ? a : b; }

// exp(x), within about 1 ulp; Inf, 0 and NaN at the edges.
TERN_INLINE float Exp(float x) {
  // Clamped so that NaN becomes a bound too (the result is NaN below): the
  // conversion of n to an integer must never see NaN. The bounds also give
  // the edges without a test of their own: from 88.8, e 2^n overflows to Inf
  // (above exp's float range, 88.7228), and from -104 it rounds to 0 (below
  // -103.972, where exp(x) is under half the smallest denormal).
  float xc = x < 88.8f ? x : 88.8f;
  xc = xc > -104.0f ? xc : -104.0f;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (no rounding instruction needed).
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // p(r) = c0 + c1 r + ... + c5 r^5 in Estrin's form: three short chains
  // instead of Horner's one chain of five; the same coefficients.
  const float r2 = r * r;
  const float p01 = 1.6666665459e-1f * r + 5.0000001201e-1f;
  const float p23 = 8.3334519073e-3f * r + 4.1665795894e-2f;
  const float p45 = 1.9875691500e-4f * r + 1.3981999507e-3f;
  const float p = (p45 * r2 + p23) * r2 + p01;
  float e = p * r2 + r + 1.0f;
  // 2^n as two factors so that results in the denormal range stay exact.
  int32_t ni = static_cast<int32_t>(n);
  int32_t n1 = ni >> 1;
  int32_t n2 = ni - n1;
  float s1 = BitsFloat(static_cast<uint32_t>(n1 + 127) << 23);
  float s2 = BitsFloat(static_cast<uint32_t>(n2 + 127) << 23);
  const float result = e * s1 * s2;
  return x != x ? x : result;
}

// tanh(x): an odd polynomial near 0, 1 - 2 / (exp(2|x|) + 1) elsewhere;
// the sign is applied last so that tanh(-0) = -0.
TERN_INLINE float Tanh(float x) {
  float ax = std::fabs(x);
  float z = ax * ax;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                  1.33314422036e-1f) *
                     z -
                 3.33332819422e-1f) *
                    z * ax +
                ax;
  float e = Exp(2.0f * ax);
  float large = 1.0f - 2.0f / (e + 1.0f);
  return std::copysign(ax < 0.625f ? small : large, x);
}

TERN_INLINE float Sigmoid(float x) { return 1.0f / (1.0f + Exp(-x)); }

// exp(x) - 1: a polynomial where |x| < 0.5 (no cancellation near 0),
// Exp(x) - 1 elsewhere.
TERN_INLINE float Expm1(float x) {
  float x2 = x * x;
  float p = 2.481609948960e-05f;
  p = p * x + 1.997168903724e-04f;
  p = p * x + 1.388914435037e-03f;
  p = p * x + 8.333149416423e-03f;
  p = p * x + 4.166666347429e-02f;
  p = p * x + 1.666666738557e-01f;
  float small = x + (0.5f * x2 + x2 * x * p);
  small = x == 0.0f ? x : small;  // expm1(-0) = -0
  float large = Exp(x) - 1.0f;
  return std::fabs(x) < 0.5f ? small : large;
}

// log(x): x = 2^e m with m in [sqrt(1/2), sqrt(2)), then
// e ln 2 + log1p(m - 1) with log1p(f) = f - f^2/2 + f^3 P(f) (a minimax fit
// of ours). Denormals are scaled up first; log(0) = -Inf, log(x < 0) = NaN.
TERN_INLINE float Log(float x) {
  const bool tiny = x < 0x1.0p-126f;
  const float xs = tiny ? x * 0x1.0p23f : x;
  // Subtracting the bits of sqrt(1/2) moves the exponent boundary there.
  const uint32_t shifted = FloatBits(xs) - 0x3f3504f3u;
  const int32_t e = static_cast<int32_t>(shifted) >> 23;
  const float m = BitsFloat((shifted & 0x007fffffu) + 0x3f3504f3u);
  const float f = m - 1.0f;
  const float ef = static_cast<float>(e) - (tiny ? 23.0f : 0.0f);
  float p = -7.634500724480e-02f;
  p = p * f + 1.276158217868e-01f;
  p = p * f - 1.316018326107e-01f;
  p = p * f + 1.420175737593e-01f;
  p = p * f - 1.662335720000e-01f;
  p = p * f + 2.000122689725e-01f;
  p = p * f - 2.500082103847e-01f;
  p = p * f + 3.333333170753e-01f;
  const float f2 = f * f;
  // ln 2 = 0.693359375 - 2.12194440e-4; the first part has few bits, so
  // ef * 0.693359375 is exact.
  float y = f2 * f * p + ef * -2.12194440e-4f;
  y = y - 0.5f * f2;
  float r = (f + y) + ef * 0.693359375f;
  r = x == INFINITY ? x : r;
  r = x == 0.0f ? -INFINITY : r;
  return x >= 0.0f ? r : NAN;  // NaN for x < 0 and for NaN (not -0)
}

// log(1 + x) without cancellation: with u = 1 + x rounded, log(u) * x /
// (u - 1) corrects for the rounding of u (Goldberg's method).
TERN_INLINE float Log1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  float r = Log(u) * (x / d);
  r = d == 0.0f ? x : r;
  return x == INFINITY ? x : r;
}

// erfc(x) with a relative error of about 1e-7 for all x (a Chebyshev fit of
// exp(z^2) erfc(z)); the product form keeps the tail exact.
TERN_INLINE float Erfc(float x) {
  float z = std::fabs(x);
  float t = 1.0f / (1.0f + 0.5f * z);
  float poly = -0.82215223f + t * 0.17087277f;
  poly = 1.48851587f + t * poly;
  poly = -1.13520398f + t * poly;
  poly = 0.27886807f + t * poly;
  poly = -0.18628806f + t * poly;
  poly = 0.09678418f + t * poly;
  poly = 0.37409196f + t * poly;
  poly = 1.00002368f + t * poly;
  float r = t * Exp(-z * z - 1.26551223f + t * poly);
  return x >= 0.0f ? r : 2.0f - r;
}

constexpr float kSqrt1_2 = 0.70710678118654752440f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;

// erf(x): x P(x^2) / Q(x^2), a minimax rational fit of ours (degrees 6 and
// 5; relative error 2e-9 before float rounding) on |x| < 3.92, and +-1
// beyond, where erf rounds to 1 in float. No exp and one division, so it
// vectorises well. NaN stays NaN; erf(-0) = -0.
TERN_INLINE float Erf(float x) {
  const float ax = std::fabs(x);
  const float xc = ax < 3.92f ? ax : 3.92f;  // also keeps Inf and NaN out
  const float t = xc * xc;
  float p = -1.280059208166e-08f;
  p = p * t + 4.609389967993e-06f;
  p = p * t + 3.767648897673e-04f;
  p = p * t + 3.838639305556e-03f;
  p = p * t + 5.424411460438e-02f;
  p = p * t + 1.851352539223e-01f;
  p = p * t + 1.128379169140e+00f;
  float q = 6.240066720324e-05f;
  q = q * t + 1.301536371473e-03f;
  q = q * t + 1.543010107295e-02f;
  q = q * t + 1.138738661479e-01f;
  q = q * t + 4.974052531203e-01f;
  q = q * t + 1.0f;
  float r = xc * p / q;
  r = ax < 3.92f ? r : 1.0f;
  r = std::copysign(r, x);
  return x != x ? x : r;
}

// gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the form PyTorch
// computes: accurate in absolute terms (< 1e-6 with FMA), so where gelu is tiny (x
// below about -4) the relative error grows; below -5.55 erf is -1 and the
// result is -0. gelu(-Inf) = -0, gelu(Inf) = Inf.
TERN_INLINE float Gelu(float x) {
  const float r = 0.5f * x * (1.0f + Erf(x * kSqrt1_2));
  return x == -INFINITY ? -0.0f : r;
}

// The tanh approximation, written as x * sigmoid(2u) (the same function)
// so that the negative tail does not cancel.
TERN_INLINE float GeluTanh(float x) {
  float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  return x / (1.0f + Exp(-2.0f * u));
}

TERN_INLINE float Silu(float x) { return x / (1.0f + Exp(-x)); }

// log(1 + exp(beta x)) / beta, linear above the threshold (as PyTorch).
TERN_INLINE float Softplus(float x, float beta, float threshold) {
  const float bx = beta * x;
  const float r = Log1p(Exp(bx)) / beta;
  return bx > threshold ? x : r;
}

// --- Philox4x32-10 ----------------------------------------------------------

struct Philox4 {
  uint32_t v[4];
};

// The Philox4x32 generator with 10 rounds (Salmon et al., SC'11).
TERN_INLINE Philox4 Philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    Philox4 next;
    next.v[0] = static_cast<uint32_t>(p1 >> 32) ^ ctr.v[1] ^ k0;
    next.v[1] = static_cast<uint32_t>(p1);
    next.v[2] = static_cast<uint32_t>(p0 >> 32) ^ ctr.v[3] ^ k1;
    next.v[3] = static_cast<uint32_t>(p0);
    ctr = next;
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Block `block` of the stream of (seed, offset): four 32-bit words.
TERN_INLINE Philox4 RandomBlock(uint64_t seed, uint64_t offset, uint64_t block) {
  uint64_t c = offset + block;
  Philox4 ctr{{static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0u, 0u}};
  return Philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A 32-bit word to a float in [0, 1) with 24 random bits.
TERN_INLINE float Uniform01(uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }

}  // namespace tern::sim::num

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_NUMERICS_H_
