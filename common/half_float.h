// bfloat16 and IEEE binary16 (fp16) <-> float, as bit patterns: round to
// nearest even, NaN stays NaN (quiet, sign kept), Inf and subnormals exact.
// One copy of the rules for every layer that converts: the simulated engines,
// the collectives' reductions and the compiler's constants round alike.
// Written with integer and float operations only (no _Float16, which clang
// before 15 lacks on x86), branch-free so that loops over them vectorise;
// tests/sim_engines/numerics_test.cc checks them against references in
// double over every binary16 pattern and a dense sample of floats.
// Thread-safety: pure functions.
#ifndef TERN_COMMON_HALF_FLOAT_H_
#define TERN_COMMON_HALF_FLOAT_H_

#include <bit>
#include <cstdint>

namespace tern {

[[gnu::always_inline]] inline float Bf16ToF32(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// Overflow rounds to Inf as IEEE rounding does.
[[gnu::always_inline]] inline uint16_t F32ToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

[[gnu::always_inline]] inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa in place
  const uint32_t exp = bits & 0x0f800000u;
  // Normal: rebias the exponent by 112. Inf/NaN: by 224 (to 255).
  const uint32_t normal = bits + (112u << 23);
  const uint32_t special = bits + (224u << 23);
  // Subnormal (and zero): the mantissa as a float of exponent 113 minus 2^-14.
  const float subnormal =
      std::bit_cast<float>(bits + (113u << 23)) - std::bit_cast<float>(113u << 23);
  uint32_t out = exp == 0x0f800000u ? special : normal;
  out = exp == 0 ? std::bit_cast<uint32_t>(subnormal) : out;
  return std::bit_cast<float>(out | sign);
}

[[gnu::always_inline]] inline uint16_t F32ToF16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  // At or above 65536: Inf (NaN stays NaN). 65520..65536 round up to Inf below.
  const uint32_t big = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Subnormals and zero: add 0.5 so that the float adder rounds the mantissa
  // (nearest even) into the low bits.
  const float d = std::bit_cast<float>(u) + 0.5f;
  const uint32_t small = std::bit_cast<uint32_t>(d) - std::bit_cast<uint32_t>(0.5f);
  // Normals: rebias and round to nearest even on the 13 dropped bits.
  const uint32_t mant_odd = (u >> 13) & 1u;
  const uint32_t normal = (u + 0xc8000fffu + mant_odd) >> 13;  // 0xc8000000 = (15 - 127) << 23
  const uint32_t out = u >= 0x47800000u ? big : (u < 0x38800000u ? small : normal);
  return static_cast<uint16_t>(out | sign);
}

}  // namespace tern

#endif  // TERN_COMMON_HALF_FLOAT_H_
