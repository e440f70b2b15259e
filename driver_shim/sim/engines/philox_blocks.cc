#include "driver_shim/sim/engines/philox_blocks.h"

#include "driver_shim/sim/engines/numerics.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TERN_PHILOX_VECTOR_CODE 1
#endif

namespace tern::sim::kernels {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

void PortableBlocks(uint64_t seed, uint64_t offset, uint64_t first, int64_t count,
                    uint32_t* words) {
  for (int64_t j = 0; j < count; ++j) {
    const num::Philox4 block = num::RandomBlock(seed, offset, first + static_cast<uint64_t>(j));
    for (int w = 0; w < 4; ++w) words[4 * j + w] = block.v[w];
  }
}

#if defined(TERN_PHILOX_VECTOR_CODE)
// The rounds on vectors of 32-bit lanes, one block per lane (c0..c3 its four
// words). Auto-vectorised, the per-block loop reached 1.6 ns a word on a Zen 4
// (it shuffled the four words of each block between lanes at every round);
// here a round is the two 32x32->64 products of the even lanes and of the
// odd lanes (shifted down), whose halves are blended back into place: 0.6 ns
// a word with AVX-512, the words then transposed into block order.

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as the unused
// merge source of their masked builtins, which its own flow analysis then
// reports as maybe used uninitialised (a false positive under -Werror).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f"))) void Avx512Blocks(uint64_t seed, uint64_t offset, uint64_t first,
                                                     int64_t count, uint32_t* words) {
  const __m512i m0 = _mm512_set1_epi64(kM0), m1 = _mm512_set1_epi64(kM1);
  const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    // The sixteen 64-bit counters, split into their low and high words.
    const uint64_t base = offset + first + static_cast<uint64_t>(j);
    const __m512i low8 = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(base)), lane);
    const __m512i high8 = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(base + 8)), lane);
    __m512i c0 = _mm512_permutex2var_epi32(low8, even, high8);
    __m512i c1 = _mm512_permutex2var_epi32(low8, odd, high8);
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
      const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
      const __m512i p0e = _mm512_mul_epu32(c0, m0);
      const __m512i p0o = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      const __m512i p1e = _mm512_mul_epu32(c2, m1);
      const __m512i p1o = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      const __m512i high0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(p0e, 32), p0o);
      const __m512i low0 = _mm512_mask_blend_epi32(0xAAAA, p0e, _mm512_slli_epi64(p0o, 32));
      const __m512i high1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(p1e, 32), p1o);
      const __m512i low1 = _mm512_mask_blend_epi32(0xAAAA, p1e, _mm512_slli_epi64(p1o, 32));
      c0 = _mm512_ternarylogic_epi32(high1, c1, key0, 0x96);  // 0x96: a ^ b ^ c
      c1 = low1;
      c2 = _mm512_ternarylogic_epi32(high0, c3, key1, 0x96);
      c3 = low0;
      k0 += kW0;
      k1 += kW1;
    }
    // Lanes to blocks: u0 holds blocks 0, 4, 8, 12 (one per 128-bit lane),
    // u1 1, 5, 9, 13, u2 2, 6, 10, 14 and u3 3, 7, 11, 15.
    const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpackhi_epi32(c0, c1);
    const __m512i t2 = _mm512_unpacklo_epi32(c2, c3), t3 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
    const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
    const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44);
    const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE);
    _mm512_storeu_si512(words + 4 * j, _mm512_shuffle_i32x4(v0, v1, 0x88));
    _mm512_storeu_si512(words + 4 * j + 16, _mm512_shuffle_i32x4(v0, v1, 0xDD));
    _mm512_storeu_si512(words + 4 * j + 32, _mm512_shuffle_i32x4(v2, v3, 0x88));
    _mm512_storeu_si512(words + 4 * j + 48, _mm512_shuffle_i32x4(v2, v3, 0xDD));
  }
  PortableBlocks(seed, offset, first + static_cast<uint64_t>(j), count - j, words + 4 * j);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

__attribute__((target("avx2"))) void Avx2Blocks(uint64_t seed, uint64_t offset, uint64_t first,
                                                int64_t count, uint32_t* words) {
  const __m256i m0 = _mm256_set1_epi64x(kM0), m1 = _mm256_set1_epi64x(kM1);
  int64_t j = 0;
  for (; j + 8 <= count; j += 8) {
    const uint64_t base = offset + first + static_cast<uint64_t>(j);
    alignas(32) uint32_t low[8], high[8];
    for (int i = 0; i < 8; ++i) {
      const uint64_t counter = base + static_cast<uint64_t>(i);
      low[i] = static_cast<uint32_t>(counter);
      high[i] = static_cast<uint32_t>(counter >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(low));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(high));
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0));
      const __m256i key1 = _mm256_set1_epi32(static_cast<int>(k1));
      const __m256i p0e = _mm256_mul_epu32(c0, m0);
      const __m256i p0o = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i p1e = _mm256_mul_epu32(c2, m1);
      const __m256i p1o = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i high0 = _mm256_blend_epi32(_mm256_srli_epi64(p0e, 32), p0o, 0xAA);
      const __m256i low0 = _mm256_blend_epi32(p0e, _mm256_slli_epi64(p0o, 32), 0xAA);
      const __m256i high1 = _mm256_blend_epi32(_mm256_srli_epi64(p1e, 32), p1o, 0xAA);
      const __m256i low1 = _mm256_blend_epi32(p1e, _mm256_slli_epi64(p1o, 32), 0xAA);
      c0 = _mm256_xor_si256(_mm256_xor_si256(high1, c1), key0);
      c1 = low1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(high0, c3), key1);
      c3 = low0;
      k0 += kW0;
      k1 += kW1;
    }
    // Lanes to blocks: u0 holds blocks 0 and 4 (one per 128-bit lane), u1
    // 1 and 5, u2 2 and 6, u3 3 and 7.
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i* out = reinterpret_cast<__m256i*>(words + 4 * j);
    _mm256_storeu_si256(out, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
  PortableBlocks(seed, offset, first + static_cast<uint64_t>(j), count - j, words + 4 * j);
}
#endif

PhiloxCode BestCode() {
#if defined(TERN_PHILOX_VECTOR_CODE)
  static const PhiloxCode best = __builtin_cpu_supports("avx512f") ? PhiloxCode::kAvx512
                                 : __builtin_cpu_supports("avx2")  ? PhiloxCode::kAvx2
                                                                   : PhiloxCode::kPortable;
  return best;
#else
  return PhiloxCode::kPortable;
#endif
}

}  // namespace

bool PhiloxCodeRuns(PhiloxCode code) {
#if defined(TERN_PHILOX_VECTOR_CODE)
  if (code == PhiloxCode::kAvx512) return __builtin_cpu_supports("avx512f");
  if (code == PhiloxCode::kAvx2) return __builtin_cpu_supports("avx2");
#else
  if (code == PhiloxCode::kAvx512 || code == PhiloxCode::kAvx2) return false;
#endif
  return true;
}

void PhiloxBlocks(uint64_t seed, uint64_t offset, uint64_t first, int64_t count, uint32_t* words,
                  PhiloxCode code) {
  if (code == PhiloxCode::kBest || !PhiloxCodeRuns(code)) code = BestCode();
#if defined(TERN_PHILOX_VECTOR_CODE)
  if (code == PhiloxCode::kAvx512) return Avx512Blocks(seed, offset, first, count, words);
  if (code == PhiloxCode::kAvx2) return Avx2Blocks(seed, offset, first, count, words);
#endif
  PortableBlocks(seed, offset, first, count, words);
}

}  // namespace tern::sim::kernels
