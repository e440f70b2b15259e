#include "comm_kernels.h"

#include <bit>
#include <cstring>
#include <limits>

#include "common/half_float.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace tern::comm {
namespace {

// Symmetric MAX/MIN of floats (see the header): NaN wins, and for equal
// values (+0 and -0 included) the bits are combined so the order of the
// operands cannot matter.
inline float MaxF(float a, float b) {
  const uint32_t ab = std::bit_cast<uint32_t>(a), bb = std::bit_cast<uint32_t>(b);
  const float equal = std::bit_cast<float>(ab & bb);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return a > b ? a : (b > a ? b : (a == b ? equal : nan));
}
inline float MinF(float a, float b) {
  const uint32_t ab = std::bit_cast<uint32_t>(a), bb = std::bit_cast<uint32_t>(b);
  const float equal = std::bit_cast<float>(ab | bb);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  return a < b ? a : (b < a ? b : (a == b ? equal : nan));
}

template <tern_comm_redop_t Op>
inline float CombineF(float a, float b) {
  if constexpr (Op == TERN_COMM_SUM || Op == TERN_COMM_AVG) return a + b;
  if constexpr (Op == TERN_COMM_PROD) return a * b;
  if constexpr (Op == TERN_COMM_MAX) return MaxF(a, b);
  if constexpr (Op == TERN_COMM_MIN) return MinF(a, b);
}

// Integers: SUM and PROD in the unsigned type, so overflow wraps without
// undefined behaviour.
template <tern_comm_redop_t Op, typename T>
inline T CombineI(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if constexpr (Op == TERN_COMM_SUM || Op == TERN_COMM_AVG) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  if constexpr (Op == TERN_COMM_PROD) {
    // Promote through uint64_t: uint8/uint16 products would become int.
    return static_cast<T>(static_cast<U>(static_cast<uint64_t>(static_cast<U>(a)) *
                                         static_cast<uint64_t>(static_cast<U>(b))));
  }
  if constexpr (Op == TERN_COMM_MAX) return a > b ? a : b;
  if constexpr (Op == TERN_COMM_MIN) return a < b ? a : b;
}

template <tern_comm_redop_t Op>
void ReduceF32(float* dst, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = CombineF<Op>(a[i], b[i]);
}

template <tern_comm_redop_t Op, typename T>
void ReduceInt(T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = CombineI<Op, T>(a[i], b[i]);
}

template <tern_comm_redop_t Op>
void ReduceBf16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToBf16(CombineF<Op>(Bf16ToF32(a[i]), Bf16ToF32(b[i])));
}

// fp16 in portable code (common/half_float.h); with F16C the hardware
// converts eight at a time (ReduceFp16F16c), and this is its tail.
template <tern_comm_redop_t Op>
void ReduceFp16Scalar(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToF16(CombineF<Op>(F16ToF32(a[i]), F16ToF32(b[i])));
}

#if defined(__x86_64__)
template <tern_comm_redop_t Op>
__attribute__((target("avx2,f16c"))) void ReduceFp16F16c(uint16_t* dst, const uint16_t* a,
                                                         const uint16_t* b, size_t n) {
  size_t i = 0;
  float fa[8], fb[8], fr[8];
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(fa, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))));
    _mm256_storeu_ps(fb, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i))));
    for (int k = 0; k < 8; ++k) fr[k] = CombineF<Op>(fa[k], fb[k]);
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(fr), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  ReduceFp16Scalar<Op>(dst + i, a + i, b + i, n - i);
}
bool HaveF16c() {
  // F16C through CPUID (leaf 1, ECX bit 29): clang before 15 has no "f16c"
  // for __builtin_cpu_supports. AVX2's check covers the OS's YMM state.
  static const bool have = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
  }();
  return have;
}
#endif

template <tern_comm_redop_t Op>
void ReduceFp16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
#if defined(__x86_64__)
  if (HaveF16c()) return ReduceFp16F16c<Op>(dst, a, b, n);
#endif
  ReduceFp16Scalar<Op>(dst, a, b, n);
}

template <tern_comm_redop_t Op>
void ReduceOp(void* dst, const void* a, const void* b, size_t n, tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return ReduceF32<Op>(static_cast<float*>(dst), static_cast<const float*>(a),
                           static_cast<const float*>(b), n);
    case TERN_DTYPE_BF16:
      return ReduceBf16<Op>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                            static_cast<const uint16_t*>(b), n);
    case TERN_DTYPE_F16:
      return ReduceFp16<Op>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                            static_cast<const uint16_t*>(b), n);
    case TERN_DTYPE_I8:
      return ReduceInt<Op, int8_t>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(a),
                                   static_cast<const int8_t*>(b), n);
    case TERN_DTYPE_I32:
      return ReduceInt<Op, int32_t>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                                    static_cast<const int32_t*>(b), n);
    case TERN_DTYPE_I64:
      return ReduceInt<Op, int64_t>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                                    static_cast<const int64_t*>(b), n);
    default:
      return;
  }
}

// The 16-bit floats: widened, divided in float, rounded back.
template <float (*Widen)(uint16_t), uint16_t (*Round)(float)>
void DivideHalf(uint16_t* dst, const uint16_t* src, size_t n, uint32_t divisor) {
  const float f = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) dst[i] = Round(Widen(src[i]) / f);
}

template <typename T>
void DivideInt(T* dst, const T* src, size_t n, uint32_t divisor) {
  // In 64 bits: a divisor above the type's maximum must not wrap.
  const int64_t d = static_cast<int64_t>(divisor);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<int64_t>(src[i]) / d);
}

}  // namespace

bool IsReducible(tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
    case TERN_DTYPE_BF16:
    case TERN_DTYPE_F16:
    case TERN_DTYPE_I8:
    case TERN_DTYPE_I32:
    case TERN_DTYPE_I64:
      return true;
    case TERN_DTYPE_BOOL:  // no arithmetic on it
    default:
      return false;
  }
}

const char* RedopName(tern_comm_redop_t op) {
  switch (op) {
    case TERN_COMM_SUM:
      return "sum";
    case TERN_COMM_PROD:
      return "prod";
    case TERN_COMM_MAX:
      return "max";
    case TERN_COMM_MIN:
      return "min";
    case TERN_COMM_AVG:
      return "avg";
    default:
      return "unknown-op";
  }
}

void Reduce(void* dst, const void* a, const void* b, size_t count, tern_dtype_t dtype,
            tern_comm_redop_t op) {
  switch (op) {
    case TERN_COMM_SUM:
    case TERN_COMM_AVG:
      return ReduceOp<TERN_COMM_SUM>(dst, a, b, count, dtype);
    case TERN_COMM_PROD:
      return ReduceOp<TERN_COMM_PROD>(dst, a, b, count, dtype);
    case TERN_COMM_MAX:
      return ReduceOp<TERN_COMM_MAX>(dst, a, b, count, dtype);
    case TERN_COMM_MIN:
      return ReduceOp<TERN_COMM_MIN>(dst, a, b, count, dtype);
    default:
      return;
  }
}

void DivideBy(void* dst, const void* src, size_t n, tern_dtype_t dtype, uint32_t divisor) {
  switch (dtype) {
    case TERN_DTYPE_F32: {
      auto* d = static_cast<float*>(dst);
      const auto* s = static_cast<const float*>(src);
      const float f = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) d[i] = s[i] / f;
      return;
    }
    case TERN_DTYPE_BF16:
      return DivideHalf<Bf16ToF32, F32ToBf16>(static_cast<uint16_t*>(dst),
                                              static_cast<const uint16_t*>(src), n, divisor);
    case TERN_DTYPE_F16:
      return DivideHalf<F16ToF32, F32ToF16>(static_cast<uint16_t*>(dst),
                                            static_cast<const uint16_t*>(src), n, divisor);
    case TERN_DTYPE_I8:
      return DivideInt(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, divisor);
    case TERN_DTYPE_I32:
      return DivideInt(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, divisor);
    case TERN_DTYPE_I64:
      return DivideInt(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, divisor);
    default:
      return;
  }
}

}  // namespace tern::comm
