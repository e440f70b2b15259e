// Reductions, softmax and the normalisations. Rows are independent, so the
// work is split over rows (or output elements); within a row the order of
// accumulation is fixed, so results never depend on the thread count.
// Sums of float data accumulate in double.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "driver_shim/sim/engines/kernels_internal.h"
#include "driver_shim/sim/engines/numerics.h"

namespace tern::sim::kernels {
namespace {

constexpr int64_t kChunk = 1024;

// A softmax or norm row is read and written about four times (maximum or
// mean, exponent or deviation, sum, scale), so rows split over the kernel
// threads from a quarter of the elementwise grain's elements.
constexpr int64_t kRowGrain = kParallelGrain / 4;

// The eight partial sums of the row sums below, added in a fixed tree.
TERN_INLINE double SumOfEight(const double (&acc)[8]) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Sum of n floats in double with eight interleaved partial sums (a fixed
// order: deterministic, and the compiler vectorises it).
TERN_VECTOR_CLONES
double SumF32(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += x[i];
  return SumOfEight(acc);
}

// acc[i] += x[i] in double: one row of a column sum, a vector of outputs at
// a time.
TERN_VECTOR_CLONES
void AccumulateF32(double* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

TERN_VECTOR_CLONES
double DotF32(const float* x, const float* y, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * y[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(x[i]) * y[i];
  return SumOfEight(acc);
}

// The largest of n floats, or NaN when one is NaN. Written with the
// compiler's vector types (16 lanes and a NaN mask, no branches): a loop of
// NaN-checking branches was most of a softmax's time, and GCC does not
// vectorise a select-based maximum on its own without fast-math.
using F32x16 = float __attribute__((vector_size(64)));
using I32x16 = int32_t __attribute__((vector_size(64)));

TERN_VECTOR_CLONES
float MaxOrNan(const float* x, int64_t n) {
  F32x16 lane_max;
  for (int j = 0; j < 16; ++j) lane_max[j] = -INFINITY;
  I32x16 lane_nan = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F32x16 v;
    std::memcpy(&v, x + i, sizeof v);
    lane_max = v > lane_max ? v : lane_max;
    lane_nan |= v != v;
  }
  float m = -INFINITY;
  int32_t nan = 0;
  for (int j = 0; j < 16; ++j) {
    m = lane_max[j] > m ? lane_max[j] : m;
    nan |= lane_nan[j];
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// Eight floats, and eight doubles (the partial sums below, one vector).
using F32x8 = float __attribute__((vector_size(32)));
using F64x8 = double __attribute__((vector_size(64)));

// Sum of (x[i] - mean)^2 in double, in SumF32's order of eight partial sums.
TERN_VECTOR_CLONES
double SumSquaredDeviations(const float* x, double mean, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double d = x[i + j] - mean;
      acc[j] += d * d;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double d = x[i] - mean;
    acc[j] += d * d;
  }
  return SumOfEight(acc);
}

// One row of a norm's backward (RMS norm: mean 0, no bias): x_hat gets
// (x - mean) * rstd (it may be x itself) and gw the weighted gradient g * w
// (g without a weight); returns sum(gw * x_hat) and sum(gw) in double (eight
// partial sums) and adds g * x_hat and g to the partial rows of the weight's
// and the bias's gradients where given.
TERN_VECTOR_CLONES
void NormBackwardRow(const float* g, const float* weight, float mean, float rstd, int64_t n,
                     const float* x_in, float* x, float* gw, double* weight_grad, double* bias_grad,
                     double* sum_gw_xhat, double* sum_gw) {
  for (int64_t i = 0; i < n; ++i) x[i] = (x_in[i] - mean) * rstd;
  if (weight != nullptr) {
    for (int64_t i = 0; i < n; ++i) gw[i] = g[i] * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) gw[i] = g[i];
  }
  // The eight partial sums in one vector of doubles: written as eight
  // scalars, GCC kept them in eight registers and converted and added one
  // element at a time (half of a layer-norm backward's time).
  F64x8 v1 = {}, v2 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    F32x8 g8, x8;
    std::memcpy(&g8, gw + i, sizeof g8);
    std::memcpy(&x8, x + i, sizeof x8);
    const F64x8 gd = __builtin_convertvector(g8, F64x8), xd = __builtin_convertvector(x8, F64x8);
    v1 += gd * xd;
    v2 += gd;
  }
  double a1[8], a2[8];
  std::memcpy(a1, &v1, sizeof a1);
  std::memcpy(a2, &v2, sizeof a2);
  for (int j = 0; i < n; ++i, ++j) {
    a1[j] += static_cast<double>(gw[i]) * x[i];
    a2[j] += gw[i];
  }
  *sum_gw_xhat = SumOfEight(a1);
  *sum_gw = SumOfEight(a2);
  if (weight_grad != nullptr) {
    for (int64_t k = 0; k < n; ++k) weight_grad[k] += static_cast<double>(g[k]) * x[k];
  }
  if (bias_grad != nullptr) {
    for (int64_t k = 0; k < n; ++k) bias_grad[k] += g[k];
  }
}

// The input's gradient from NormBackwardRow's results, into out (may be gw).
TERN_VECTOR_CLONES
void NormGradInput(float* out, const float* gw, const float* xhat, float rstd, float mean_gw_xhat,
                   float mean_gw, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = rstd * (gw[i] - mean_gw - xhat[i] * mean_gw_xhat);
}

// x = (x - mean) * rstd, then * weight and + bias where given (may be null),
// in one pass over the row (three passes stored and reloaded the row twice:
// a fifth of a small layer norm's time).
TERN_VECTOR_CLONES
void NormalizeRow(float* x, float mean, float rstd, const float* weight, const float* bias,
                  int64_t n) {
  if (weight != nullptr && bias != nullptr) {
    for (int64_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * rstd * weight[i] + bias[i];
  } else if (weight != nullptr) {
    for (int64_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * rstd * weight[i];
  } else if (bias != nullptr) {
    for (int64_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * rstd + bias[i];
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] = (x[i] - mean) * rstd;
  }
}

// --- reduce -------------------------------------------------------------------

// The running state of one output element. T is float (float dtypes) or
// int64_t (integer and bool dtypes).
template <typename T, int Fn>
struct State {
  static constexpr bool kWide =
      std::is_same_v<T, float> &&
      (Fn == TERN_REDUCE_SUM || Fn == TERN_REDUCE_MEAN || Fn == TERN_REDUCE_PROD);
  using Acc = std::conditional_t<kWide, double, T>;
  Acc acc;
  int64_t index;

  TERN_INLINE void Init() {
    index = 0;
    switch (Fn) {
      case TERN_REDUCE_SUM:
      case TERN_REDUCE_MEAN:
      case TERN_REDUCE_ANY:
        acc = 0;
        break;
      case TERN_REDUCE_PROD:
      case TERN_REDUCE_ALL:
        acc = 1;
        break;
      case TERN_REDUCE_MAX:
      case TERN_REDUCE_ARGMAX:
        acc = std::is_same_v<T, float> ? static_cast<Acc>(-INFINITY)
                                       : static_cast<Acc>(std::numeric_limits<int64_t>::min());
        break;
      default:  // MIN, ARGMIN
        acc = std::is_same_v<T, float> ? static_cast<Acc>(INFINITY)
                                       : static_cast<Acc>(std::numeric_limits<int64_t>::max());
        break;
    }
  }

  static TERN_INLINE bool IsNan(Acc v) {
    if constexpr (std::is_same_v<Acc, int64_t>) {
      return false;
    } else {
      return v != v;
    }
  }

  TERN_INLINE void Update(T v, int64_t r) {
    if constexpr (Fn == TERN_REDUCE_SUM || Fn == TERN_REDUCE_MEAN) {
      if constexpr (kWide) {
        acc += v;
      } else {
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v));
      }
    } else if constexpr (Fn == TERN_REDUCE_PROD) {
      if constexpr (kWide) {
        acc *= v;
      } else {
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v));
      }
    } else if constexpr (Fn == TERN_REDUCE_MAX) {
      acc = IsNan(acc) ? acc : (IsNan(v) || v > acc ? v : acc);
    } else if constexpr (Fn == TERN_REDUCE_MIN) {
      acc = IsNan(acc) ? acc : (IsNan(v) || v < acc ? v : acc);
    } else if constexpr (Fn == TERN_REDUCE_ARGMAX) {
      if (!IsNan(acc) && (v > acc || IsNan(v))) acc = v, index = r;
    } else if constexpr (Fn == TERN_REDUCE_ARGMIN) {
      if (!IsNan(acc) && (v < acc || IsNan(v))) acc = v, index = r;
    } else if constexpr (Fn == TERN_REDUCE_ANY) {
      acc = (acc != 0 || v != 0) ? 1 : 0;
    } else {
      acc = (acc != 0 && v != 0) ? 1 : 0;
    }
  }

  // Update() with n consecutive values, reduced indices r, r + 1, ...
  TERN_INLINE void UpdateRun(const T* v, int64_t n, int64_t r) {
    if constexpr (kWide && (Fn == TERN_REDUCE_SUM || Fn == TERN_REDUCE_MEAN)) {
      // SumF32's eight partial sums: one running sum is a chain of dependent
      // adds (~4 cycles an element) that cannot vectorise.
      acc += SumF32(v, n);
    } else {
      for (int64_t i = 0; i < n; ++i) Update(v[i], r + i);
    }
  }

  // Merges the state of a later block.
  TERN_INLINE void Combine(const State& o) {
    if constexpr (Fn == TERN_REDUCE_ARGMAX || Fn == TERN_REDUCE_ARGMIN) {
      if (!IsNan(acc) && ((Fn == TERN_REDUCE_ARGMAX ? o.acc > acc : o.acc < acc) || IsNan(o.acc))) {
        acc = o.acc, index = o.index;
      }
    } else if constexpr (Fn == TERN_REDUCE_SUM || Fn == TERN_REDUCE_MEAN ||
                         Fn == TERN_REDUCE_PROD) {
      if constexpr (kWide) {
        if constexpr (Fn == TERN_REDUCE_PROD) {
          acc *= o.acc;
        } else {
          acc += o.acc;
        }
      } else if constexpr (Fn == TERN_REDUCE_PROD) {
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(o.acc));
      } else {
        acc = static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(o.acc));
      }
    } else {
      Update(static_cast<T>(o.acc), 0);
    }
  }
};

struct ReduceGeometry {
  // Kept dimensions (output elements) and reduced dimensions, in in's order.
  uint32_t kept_rank = 0, red_rank = 0;
  int64_t kept_shape[TERN_MAX_RANK], kept_in[TERN_MAX_RANK], kept_out[TERN_MAX_RANK];
  int64_t red_shape[TERN_MAX_RANK], red_in[TERN_MAX_RANK];
  int64_t outputs = 1, reduced = 1;
};

// In and out element offsets of output element o.
TERN_INLINE void KeptOffsets(const ReduceGeometry& g, int64_t o, uint32_t rank, int64_t* in_off,
                             int64_t* out_off) {
  int64_t a = 0, b = 0;
  for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
    const int64_t i = o % g.kept_shape[d];
    o /= g.kept_shape[d];
    a += i * g.kept_in[d];
    b += i * g.kept_out[d];
  }
  *in_off = a;
  *out_off = b;
}

template <typename T>
TERN_INLINE void LoadT(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, T* out) {
  if constexpr (std::is_same_v<T, float>) {
    LoadF32(dtype, p, stride, n, out);
  } else {
    LoadI64(dtype, p, stride, n, out);
  }
}

// Writes the final value of state s to the output element at p.
template <typename T, int Fn>
TERN_INLINE void Finish(const State<T, Fn>& s, int64_t reduced, tern_dtype_t dtype, uint8_t* p) {
  if constexpr (Fn == TERN_REDUCE_ARGMAX || Fn == TERN_REDUCE_ARGMIN) {
    StoreI64(dtype, p, 1, 1, &s.index);
  } else if constexpr (std::is_same_v<T, float>) {
    double v = static_cast<double>(s.acc);
    if (Fn == TERN_REDUCE_MEAN) v = v / static_cast<double>(reduced);
    float f = static_cast<float>(v);
    StoreF32(dtype, p, 1, 1, &f);
  } else {
    int64_t v = s.acc;
    StoreI64(dtype, p, 1, 1, &v);
  }
}

template <typename T, int Fn>
void ReduceImpl(const ReduceGeometry& g, const TensorView& in, const TensorView& out) {
  const tern_dtype_t idt = in.desc->dtype, odt = out.desc->dtype;
  const int64_t isz = static_cast<int64_t>(isa::DTypeSize(idt)),
                osz = static_cast<int64_t>(isa::DTypeSize(odt));
  const Layout red = MakeLayout(g.red_rank, g.red_shape, {g.red_in});
  const int64_t red_stride = red.strides[0][red.rank - 1];

  // Accumulates logical reduced elements [rb, re) at in offset `base`.
  auto accumulate = [&](State<T, Fn>& s, int64_t base, int64_t rb, int64_t re, T* buf) {
    int64_t r = rb;
    ForEachRun(red, rb, re, [&](const int64_t* off, int64_t n) {
      for (int64_t done = 0; done < n; done += kChunk) {
        const int64_t m = std::min(kChunk, n - done);
        const uint8_t* p = in.data + (base + off[0] + done * red_stride) * isz;
        bool in_place = false;
        if constexpr (std::is_same_v<T, float>) {
          in_place = idt == TERN_DTYPE_F32 && red_stride == 1;
          if (in_place) s.UpdateRun(reinterpret_cast<const float*>(p), m, r);
        }
        if (!in_place) {
          LoadT<T>(idt, p, red_stride, m, buf);
          s.UpdateRun(buf, m, r);
        }
        r += m;
      }
    });
  };

  constexpr int64_t kBlock = 64 * 1024;

  // Column path: the innermost kept dimension is contiguous in `in` and the
  // reduction runs across it (e.g. summing [N, D] over N): accumulate tiles of
  // output elements side by side, in the same order per element.
  const bool column =
      g.kept_rank > 0 && g.kept_in[g.kept_rank - 1] == 1 && red_stride != 1 && g.reduced > 1;
  if (column) {
    const int64_t inner = g.kept_shape[g.kept_rank - 1];
    const int64_t inner_out = g.kept_out[g.kept_rank - 1];
    constexpr int64_t kTile = 256;
    const int64_t tiles = (inner + kTile - 1) / kTile;
    const int64_t outer = g.outputs / inner;
    const int64_t items = outer * tiles;
    const int64_t grain =
        std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, kTile * g.reduced));
    ParallelFor(items, grain, [&](int64_t begin, int64_t end) {
      State<T, Fn> states[kTile];
      alignas(64) T buf[kTile];
      for (int64_t item = begin; item < end; ++item) {
        const int64_t o = item / tiles, t = item % tiles;
        const int64_t j0 = t * kTile, m = std::min(kTile, inner - j0);
        int64_t in_off = 0, out_off = 0;
        KeptOffsets(g, o, g.kept_rank - 1, &in_off, &out_off);
        in_off += j0;
        out_off += j0 * inner_out;
        if constexpr (State<T, Fn>::kWide && Fn != TERN_REDUCE_PROD) {
          // A sum of f32 columns: the rows added straight from `in` into a
          // double per output, vectors of outputs at a time (each output's
          // additions in the same order as below, so the same bits). Through
          // the states, one loaded and converted element at a time, a bias
          // gradient's [256, 128] summed over rows took 3x PyTorch's time.
          if (idt == TERN_DTYPE_F32) {
            alignas(64) double sums[kTile] = {};
            const float* column = reinterpret_cast<const float*>(in.data) + in_off;
            ForEachRun(red, 0, g.reduced, [&](const int64_t* off, int64_t n) {
              for (int64_t k = 0; k < n; ++k) {
                AccumulateF32(sums, column + off[0] + k * red_stride, m);
              }
            });
            for (int64_t j = 0; j < m; ++j) {
              states[j].acc = sums[j];
              Finish(states[j], g.reduced, odt, out.data + (out_off + j * inner_out) * osz);
            }
            continue;
          }
        }
        for (int64_t j = 0; j < m; ++j) states[j].Init();
        int64_t r = 0;
        ForEachRun(red, 0, g.reduced, [&](const int64_t* off, int64_t n) {
          for (int64_t k = 0; k < n; ++k, ++r) {
            LoadT<T>(idt, in.data + (in_off + off[0] + k * red_stride) * isz, 1, m, buf);
            for (int64_t j = 0; j < m; ++j) states[j].Update(buf[j], r);
          }
        });
        for (int64_t j = 0; j < m; ++j)
          Finish(states[j], g.reduced, odt, out.data + (out_off + j * inner_out) * osz);
      }
    });
    return;
  }

  // Few outputs, long reductions: fixed blocks of the reduction in parallel,
  // combined in order. "Few" does not depend on the thread count, so that the
  // order of the additions (and so a float sum's last bit) does not either.
  constexpr int64_t kFewOutputs = 16;
  if (g.outputs <= kFewOutputs && g.reduced >= 2 * kBlock) {
    const int64_t blocks = (g.reduced + kBlock - 1) / kBlock;
    std::vector<State<T, Fn>> partial(g.outputs * blocks);
    ParallelFor(g.outputs * blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> buf(kChunk);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t o = item / blocks, b = item % blocks;
        int64_t in_off = 0, out_off = 0;
        KeptOffsets(g, o, g.kept_rank, &in_off, &out_off);
        State<T, Fn>& s = partial[item];
        s.Init();
        accumulate(s, in_off, b * kBlock, std::min(g.reduced, (b + 1) * kBlock), buf.data());
      }
    });
    for (int64_t o = 0; o < g.outputs; ++o) {
      State<T, Fn> s = partial[o * blocks];
      for (int64_t b = 1; b < blocks; ++b) s.Combine(partial[o * blocks + b]);
      int64_t in_off = 0, out_off = 0;
      KeptOffsets(g, o, g.kept_rank, &in_off, &out_off);
      Finish(s, g.reduced, odt, out.data + out_off * osz);
    }
    return;
  }

  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.reduced));
  ParallelFor(g.outputs, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> buf(kChunk);
    for (int64_t o = begin; o < end; ++o) {
      int64_t in_off = 0, out_off = 0;
      KeptOffsets(g, o, g.kept_rank, &in_off, &out_off);
      State<T, Fn> s;
      s.Init();
      if (g.reduced > 0) accumulate(s, in_off, 0, g.reduced, buf.data());
      Finish(s, g.reduced, odt, out.data + out_off * osz);
    }
  });
}

template <typename T>
void ReduceDispatch(int64_t fn, const ReduceGeometry& g, const TensorView& in,
                    const TensorView& out) {
  switch (fn) {
    case TERN_REDUCE_SUM:
      return ReduceImpl<T, TERN_REDUCE_SUM>(g, in, out);
    case TERN_REDUCE_MEAN:
      return ReduceImpl<T, TERN_REDUCE_MEAN>(g, in, out);
    case TERN_REDUCE_MAX:
      return ReduceImpl<T, TERN_REDUCE_MAX>(g, in, out);
    case TERN_REDUCE_MIN:
      return ReduceImpl<T, TERN_REDUCE_MIN>(g, in, out);
    case TERN_REDUCE_PROD:
      return ReduceImpl<T, TERN_REDUCE_PROD>(g, in, out);
    case TERN_REDUCE_ARGMAX:
      return ReduceImpl<T, TERN_REDUCE_ARGMAX>(g, in, out);
    case TERN_REDUCE_ARGMIN:
      return ReduceImpl<T, TERN_REDUCE_ARGMIN>(g, in, out);
    case TERN_REDUCE_ANY:
      return ReduceImpl<T, TERN_REDUCE_ANY>(g, in, out);
    default:
      return ReduceImpl<T, TERN_REDUCE_ALL>(g, in, out);
  }
}

// ANY / ALL of one-byte values (bool, i8) over innermost dimensions that are
// contiguous, into a bool output: a byte scan per output. The general path
// loads every run through int64 and locates every output by division, ~50 ns
// an output: PyTorch's attention softmax (the math path of
// scaled_dot_product_attention) asks all(isneginf(scores), -1) of every row,
// 59 us a call for 1024 rows of 32 in a small transformer's training step.
// Returns false for other cases.
bool AnyAllOfBytes(int64_t fn, const ReduceGeometry& g, const TensorView& in,
                   const TensorView& out) {
  if (fn != TERN_REDUCE_ANY && fn != TERN_REDUCE_ALL) return false;
  if (in.desc->dtype != TERN_DTYPE_BOOL && in.desc->dtype != TERN_DTYPE_I8) return false;
  if (out.desc->dtype != TERN_DTYPE_BOOL || g.red_rank == 0) return false;
  // The reduced dimensions: one contiguous run.
  const Layout red = MakeLayout(g.red_rank, g.red_shape, {g.red_in});
  if (red.rank != 1 || (red.shape[0] > 1 && red.strides[0][0] != 1)) return false;
  // One line per output: its row's offset in `in` (operand 0) and its
  // element in `out` (operand 1).
  const Layout rows = MakeLayout(g.kept_rank, g.kept_shape, {g.kept_in, g.kept_out});
  const int64_t n = g.reduced;
  const bool any = fn == TERN_REDUCE_ANY;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, n));
  ParallelFor(g.outputs, grain, [&](int64_t begin, int64_t end) {
    ForEachLine(rows, begin, end, [&](const int64_t* offsets) {
      const uint8_t* p = in.data + offsets[0];
      bool result = !any;
      for (int64_t i = 0; i < n; ++i) {
        if ((p[i] != 0) == any) {
          result = any;
          break;
        }
      }
      out.data[offsets[1]] = result ? 1 : 0;
    });
  });
  return true;
}

}  // namespace

Status RunReduce(const driver::Instruction& ins, Operands ops) {
  const isa::OperandDesc& in = *ops[1].desc;
  const isa::OperandDesc& out = *ops[0].desc;
  const int64_t fn = ins.ints[0];
  bool reduced[TERN_MAX_RANK] = {};
  if (ins.ints.size() == 1) {
    for (uint32_t d = 0; d < in.rank; ++d) reduced[d] = true;
  }
  for (size_t i = 1; i < ins.ints.size(); ++i) {
    int64_t a = ins.ints[i];
    reduced[a < 0 ? a + in.rank : a] = true;
  }
  ReduceGeometry g;
  for (uint32_t d = 0; d < in.rank; ++d) {
    if (reduced[d]) {
      g.red_shape[g.red_rank] = in.shape[d];
      g.red_in[g.red_rank++] = in.strides[d];
      g.reduced *= in.shape[d];
    } else {
      g.kept_shape[g.kept_rank] = in.shape[d];
      g.kept_in[g.kept_rank] = in.strides[d];
      g.kept_out[g.kept_rank++] = out.strides[d];
      g.outputs *= in.shape[d];
    }
  }
  if (g.outputs == 0) return OkStatus();
  if (AnyAllOfBytes(fn, g, ops[1], ops[0])) return OkStatus();
  if (isa::IsFloat(in.dtype)) {
    ReduceDispatch<float>(fn, g, ops[1], ops[0]);
  } else {
    ReduceDispatch<int64_t>(fn, g, ops[1], ops[0]);
  }
  return OkStatus();
}

// --- rows: softmax and the norms ----------------------------------------------

namespace {

// The "other" dimensions of a row operation (all but the row's), with each
// operand's strides; row r's element offsets by division.
struct Rows {
  uint32_t rank = 0;
  int64_t shape[TERN_MAX_RANK];
  int64_t strides[8][TERN_MAX_RANK];
  int64_t count = 1;

  void Offsets(int64_t r, int operands, int64_t* out) const {
    for (int o = 0; o < operands; ++o) out[o] = 0;
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      const int64_t i = r % shape[d];
      r /= shape[d];
      for (int o = 0; o < operands; ++o) out[o] += i * strides[o][d];
    }
  }
};

// The row at `base` itself when it is contiguous f32 (read or written in
// place, no copy through a buffer), else null.
float* ContiguousF32Row(const TensorView& v, int64_t base, const Layout& l) {
  if (v.desc->dtype != TERN_DTYPE_F32 || l.rank != 1 || l.strides[0][0] != 1) return nullptr;
  return reinterpret_cast<float*>(v.data) + base;
}

// Loads / stores a row of n elements (a strided layout) as floats. A
// contiguous f32 row is one memcpy (a layer norm's rows are).
void LoadRow(const TensorView& v, int64_t base, const Layout& l, float* buf) {
  if (l.count == 0) return;  // (buf may be null then)
  if (const float* row = ContiguousF32Row(v, base, l)) {
    std::memcpy(buf, row, static_cast<size_t>(l.count) * sizeof(float));
    return;
  }
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(v.desc->dtype));
  ForEachRun(l, 0, l.count, [&](const int64_t* off, int64_t n) {
    LoadF32(v.desc->dtype, v.data + (base + off[0]) * esize, l.strides[0][l.rank - 1], n, buf);
    buf += n;
  });
}

void StoreRow(const TensorView& v, int64_t base, const Layout& l, const float* buf) {
  if (l.count == 0) return;
  if (float* row = ContiguousF32Row(v, base, l)) {
    std::memcpy(row, buf, static_cast<size_t>(l.count) * sizeof(float));
    return;
  }
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(v.desc->dtype));
  ForEachRun(l, 0, l.count, [&](const int64_t* off, int64_t n) {
    StoreF32(v.desc->dtype, v.data + (base + off[0]) * esize, l.strides[0][l.rank - 1], n, buf);
    buf += n;
  });
}

// The row at `base`: in place when contiguous f32, else loaded into buf.
const float* RowOf(const TensorView& v, int64_t base, const Layout& l, float* buf) {
  if (const float* row = ContiguousF32Row(v, base, l)) return row;
  LoadRow(v, base, l, buf);
  return buf;
}

void StoreOne(const TensorView& v, int64_t offset, float value) {
  StoreF32(v.desc->dtype, At(v, offset), 1, 1, &value);
}

float LoadOne(const TensorView& v, int64_t offset) {
  float value;
  LoadF32(v.desc->dtype, At(v, offset), 1, 1, &value);
  return value;
}

// Softmax geometry: the axis is the row; every other dimension a row index.
struct AxisRows {
  Rows rows;
  int64_t length = 1;
  Layout row[3];  // per operand
};

AxisRows MakeAxisRows(std::initializer_list<const isa::OperandDesc*> descs, int64_t axis_arg) {
  AxisRows a;
  const isa::OperandDesc& ref = **descs.begin();
  const int64_t rank = ref.rank;
  const int64_t axis = rank == 0 ? -1 : (axis_arg < 0 ? axis_arg + rank : axis_arg);
  for (int64_t d = 0; d < rank; ++d) {
    if (d == axis) continue;
    int o = 0;
    for (const isa::OperandDesc* desc : descs) a.rows.strides[o++][a.rows.rank] = desc->strides[d];
    a.rows.shape[a.rows.rank++] = ref.shape[d];
    a.rows.count *= ref.shape[d];
  }
  a.length = axis >= 0 ? ref.shape[axis] : 1;
  int o = 0;
  for (const isa::OperandDesc* desc : descs) {
    const int64_t len = a.length;
    const int64_t stride = axis >= 0 ? desc->strides[axis] : 0;
    a.row[o++] = MakeLayout(1, &len, {&stride});
  }
  return a;
}

TERN_VECTOR_CLONES
void ExpShifted(const float* x, float m, float* e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) e[i] = num::Exp(x[i] - m);
}

TERN_VECTOR_CLONES
void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

TERN_VECTOR_CLONES
void SubtractScalar(const float* x, float s, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] - s;
}

// The backward rows: log-softmax gi = g - exp(y) * sum(g); softmax
// gi = y * (g - dot(g, y)).
TERN_VECTOR_CLONES
void LogSoftmaxGrad(const float* g, const float* y, float sum, float* gi, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gi[i] = g[i] - num::Exp(y[i]) * sum;
}

TERN_VECTOR_CLONES
void SoftmaxGrad(const float* g, const float* y, float dot, float* gi, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gi[i] = y[i] * (g[i] - dot);
}

}  // namespace

namespace {

// Whether every operand of `a` is f32, contiguous along the axis, and its
// rows evenly spaced: then *pitches holds each operand's row pitch.
bool RowsInPlace(const AxisRows& a, Operands ops, int operands, int64_t* pitches) {
  for (int o = 0; o < operands; ++o) {
    if (ops[o].desc->dtype != TERN_DTYPE_F32) return false;
    if (a.row[o].rank != 1 || a.row[o].strides[0][0] != 1) return false;
  }
  const int64_t* strides[3] = {a.rows.strides[0], a.rows.strides[1], a.rows.strides[2]};
  const Layout rows =
      MakeLayout(a.rows.rank, a.rows.shape, std::span<const int64_t* const>(strides, operands));
  if (rows.rank != 1) return false;
  for (int o = 0; o < operands; ++o) pitches[o] = rows.strides[o][0];
  return true;
}

// One softmax (or log-softmax) row of n floats, x to out (which may be x);
// a log-softmax's exponentials go to `scratch` (n floats, which may be out).
// Every softmax row goes through it, wherever the row was found.
TERN_INLINE void SoftmaxRow(const float* x, float* out, int64_t n, bool log, float* scratch) {
  const float m = MaxOrNan(x, n);
  // A row of -inf has no finite maximum: shifting by 0 makes the sum 0
  // and the row NaN, as in PyTorch.
  const float shift = m == -INFINITY ? 0.0f : m;
  if (log) {
    ExpShifted(x, shift, scratch, n);
    const float lse = static_cast<float>(std::log(SumF32(scratch, n))) + shift;
    SubtractScalar(x, lse, out, n);
  } else {
    ExpShifted(x, shift, out, n);
    Scale(out, static_cast<float>(1.0 / SumF32(out, n)), n);
  }
}

// Rows of f32 that are contiguous along the axis and evenly spaced in both
// operands (a softmax over the last dimension of a contiguous tensor): each
// row is computed where it lies, without the gather into a buffer, the
// scatter back and the division per row that find a row of any layout
// (they took half of a 4x4x64x64 attention softmax's time).
bool SoftmaxInPlaceRows(const AxisRows& a, Operands ops, bool log) {
  int64_t pitch[2];
  if (!RowsInPlace(a, ops, 2, pitch)) return false;
  const int64_t out_pitch = pitch[0], in_pitch = pitch[1];
  float* out = reinterpret_cast<float*>(ops[0].data);
  const float* in = reinterpret_cast<const float*>(ops[1].data);
  const int64_t n = a.length;
  ParallelFor(a.rows.count, std::max<int64_t>(1, kRowGrain / n), [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(log ? n : 0);
    for (int64_t r = begin; r < end; ++r) {
      SoftmaxRow(in + r * in_pitch, out + r * out_pitch, n, log, scratch.data());
    }
  });
  return true;
}

// One softmax (or log-softmax) backward row: gi from g (the gradient of
// the output) and y (the output), n floats; gi may be g or y.
TERN_INLINE void SoftmaxBackwardRow(const float* g, const float* y, float* gi, int64_t n,
                                    bool log) {
  if (log) {
    LogSoftmaxGrad(g, y, static_cast<float>(SumF32(g, n)), gi, n);
  } else {
    SoftmaxGrad(g, y, static_cast<float>(DotF32(g, y, n)), gi, n);
  }
}

}  // namespace

Status RunSoftmax(const driver::Instruction& ins, Operands ops) {
  const bool log = ins.ints.size() > 1 && ins.ints[1] != 0;
  const AxisRows a = MakeAxisRows({ops[0].desc, ops[1].desc}, ins.ints[0]);
  if (a.rows.count == 0 || a.length == 0) return OkStatus();
  if (SoftmaxInPlaceRows(a, ops, log)) return OkStatus();
  const int64_t grain = std::max<int64_t>(1, kRowGrain / a.length);
  ParallelFor(a.rows.count, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> x(a.length), e(a.length);
    for (int64_t r = begin; r < end; ++r) {
      int64_t off[2];
      a.rows.Offsets(r, 2, off);
      LoadRow(ops[1], off[1], a.row[1], x.data());
      SoftmaxRow(x.data(), e.data(), a.length, log, e.data());
      StoreRow(ops[0], off[0], a.row[0], e.data());
    }
  });
  return OkStatus();
}

Status RunSoftmaxBackward(const driver::Instruction& ins, Operands ops) {
  // [grad_in, grad_out, out]
  const bool log = ins.ints.size() > 1 && ins.ints[1] != 0;
  const AxisRows a = MakeAxisRows({ops[0].desc, ops[1].desc, ops[2].desc}, ins.ints[0]);
  if (a.rows.count == 0 || a.length == 0) return OkStatus();
  if (int64_t pitch[3]; RowsInPlace(a, ops, 3, pitch)) {
    // As softmax's rows in place (SoftmaxInPlaceRows): the same passes on
    // the rows where they lie.
    float* gi = reinterpret_cast<float*>(ops[0].data);
    const float* g = reinterpret_cast<const float*>(ops[1].data);
    const float* y = reinterpret_cast<const float*>(ops[2].data);
    const int64_t n = a.length;
    ParallelFor(a.rows.count, std::max<int64_t>(1, kRowGrain / n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        SoftmaxBackwardRow(g + r * pitch[1], y + r * pitch[2], gi + r * pitch[0], n, log);
      }
    });
    return OkStatus();
  }
  const int64_t grain = std::max<int64_t>(1, kRowGrain / a.length);
  ParallelFor(a.rows.count, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> g(a.length), y(a.length), gi(a.length);
    for (int64_t r = begin; r < end; ++r) {
      int64_t off[3];
      a.rows.Offsets(r, 3, off);
      LoadRow(ops[1], off[1], a.row[1], g.data());
      LoadRow(ops[2], off[2], a.row[2], y.data());
      SoftmaxBackwardRow(g.data(), y.data(), gi.data(), a.length, log);
      StoreRow(ops[0], off[0], a.row[0], gi.data());
    }
  });
  return OkStatus();
}

namespace {

// Normalisation geometry: leading dimensions are rows, the last k axes the
// normalized row. `lead` holds the slots whose leading strides are used
// (tensors of in's shape, and mean/rstd of the leading shape).
struct NormRows {
  Rows rows;
  int64_t length = 1;
};

// Leading strides: for in-shaped operands the first rank-k strides; for
// leading-shaped ones (mean, rstd) all their strides. Absent operands get 0.
NormRows MakeNormRows(const isa::OperandDesc& in, uint32_t k,
                      std::initializer_list<const TensorView*> views) {
  NormRows n;
  const uint32_t lead = in.rank - k;
  for (uint32_t d = 0; d < lead; ++d) {
    n.rows.shape[d] = in.shape[d];
    n.rows.count *= in.shape[d];
  }
  n.rows.rank = lead;
  for (uint32_t d = lead; d < in.rank; ++d) n.length *= in.shape[d];
  int o = 0;
  for (const TensorView* v : views) {
    for (uint32_t d = 0; d < lead; ++d)
      n.rows.strides[o][d] = (v && v->data) ? v->desc->strides[d] : 0;
    ++o;
  }
  return n;
}

Layout TrailingLayout(const isa::OperandDesc& d, uint32_t k) {
  return MakeLayout(k, d.shape.data() + d.rank - k, {d.strides.data() + d.rank - k});
}

bool Present(const TensorView& v) {
  return v.desc != nullptr && v.desc->present() && v.data != nullptr;
}

// weight/bias (trailing shape) as a contiguous float row; empty if absent.
std::vector<float> LoadParam(Operands ops, size_t slot) {
  std::vector<float> out;
  if (slot >= ops.size() || !Present(ops[slot])) return out;
  out.resize(ops[slot].desc->element_count());
  GatherF32(ops[slot], out.data());
  return out;
}

// Rows per block of the deterministic column sums (grad_weight, grad_bias).
int64_t ParamBlockRows(int64_t rows) { return std::max<int64_t>(16, (rows + 63) / 64); }

// Sums per-block partial rows (blocks x n, in order) into `view`.
void StoreColumnSums(const std::vector<double>& partial, int64_t blocks, int64_t n,
                     const TensorView& view) {
  std::vector<float> sums(n);
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += partial[b * n + j];
    sums[j] = static_cast<float>(s);
  }
  ScatterF32(view, sums.data());
}

// One layer-norm row: out = (x - mean) * rstd (* w) (+ b) over len floats,
// out may be x; *mean and *rstd as the kernel stores them. Every layer-norm
// row goes through it, wherever the row was found.
void LayerNormRow(const float* x, float* out, int64_t len, double eps, const float* w,
                  const float* b, float* mean, float* rstd) {
  double m = 0, var = 0;
  if (len > 0) {
    m = SumF32(x, len) / static_cast<double>(len);
    var = SumSquaredDeviations(x, m, len) / static_cast<double>(len);
  }
  *mean = static_cast<float>(m);
  *rstd = static_cast<float>(1.0 / std::sqrt(var + eps));
  if (out != x) std::memmove(out, x, static_cast<size_t>(len) * sizeof(float));
  NormalizeRow(out, *mean, *rstd, w, b, len);
}

}  // namespace

Status RunLayerNorm(const driver::Instruction& ins, Operands ops) {
  // [out, mean?, rstd?, in, weight?, bias?]
  const isa::OperandDesc& in = *ops[3].desc;
  const uint32_t k = static_cast<uint32_t>(ins.ints[0]);
  const double eps = ins.floats[0];
  const NormRows n = MakeNormRows(in, k, {&ops[0], &ops[1], &ops[2], &ops[3]});
  if (n.rows.count == 0) return OkStatus();
  const Layout lin = TrailingLayout(in, k), lout = TrailingLayout(*ops[0].desc, k);
  const std::vector<float> w = LoadParam(ops, 4), b = LoadParam(ops, 5);
  const float* weight = w.empty() ? nullptr : w.data();
  const float* bias = b.empty() ? nullptr : b.data();
  const bool has_mean = Present(ops[1]), has_rstd = ops.size() > 2 && Present(ops[2]);
  const int64_t len = n.length;
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, len));
  // f32 rows that are contiguous and evenly spaced (the last dims of a
  // contiguous tensor) are normalized where they lie: as softmax's rows
  // (SoftmaxInPlaceRows), without the division per row, the gather and the
  // scatter; the same arithmetic, so the same bits.
  const Layout rows =
      MakeLayout(n.rows.rank, n.rows.shape,
                 {n.rows.strides[0], n.rows.strides[1], n.rows.strides[2], n.rows.strides[3]});
  if (len > 0 && in.dtype == TERN_DTYPE_F32 && ops[0].desc->dtype == TERN_DTYPE_F32 &&
      lin.rank == 1 && lin.strides[0][0] == 1 && lout.rank == 1 && lout.strides[0][0] == 1 &&
      rows.rank == 1) {
    float* out = reinterpret_cast<float*>(ops[0].data);
    const float* x_all = reinterpret_cast<const float*>(ops[3].data);
    ParallelFor(n.rows.count, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float fm, fr;
        LayerNormRow(x_all + r * rows.strides[3][0], out + r * rows.strides[0][0], len, eps, weight,
                     bias, &fm, &fr);
        if (has_mean) StoreOne(ops[1], r * rows.strides[1][0], fm);
        if (has_rstd) StoreOne(ops[2], r * rows.strides[2][0], fr);
      }
    });
    return OkStatus();
  }
  ParallelFor(n.rows.count, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> x(len);
    for (int64_t r = begin; r < end; ++r) {
      int64_t off[4];
      n.rows.Offsets(r, 4, off);
      LoadRow(ops[3], off[3], lin, x.data());
      float fm, fr;
      LayerNormRow(x.data(), x.data(), len, eps, weight, bias, &fm, &fr);
      StoreRow(ops[0], off[0], lout, x.data());
      if (has_mean) StoreOne(ops[1], off[1], fm);
      if (has_rstd) StoreOne(ops[2], off[2], fr);
    }
  });
  return OkStatus();
}

Status RunLayerNormBackward(const driver::Instruction& ins, Operands ops) {
  // [grad_in, grad_weight?, grad_bias?, grad_out, in, mean, rstd, weight?]
  const isa::OperandDesc& in = *ops[4].desc;
  const uint32_t k = static_cast<uint32_t>(ins.ints[0]);
  const NormRows n = MakeNormRows(in, k, {&ops[0], &ops[3], &ops[4], &ops[5], &ops[6]});
  const int64_t len = n.length, rows = n.rows.count;
  const bool has_gw = Present(ops[1]), has_gb = Present(ops[2]);
  const int64_t block_rows = ParamBlockRows(rows);
  const int64_t blocks = rows == 0 ? 0 : (rows + block_rows - 1) / block_rows;
  std::vector<double> pw(has_gw ? blocks * len : 0), pb(has_gb ? blocks * len : 0);
  if (rows > 0 && len > 0) {
    const Layout lgi = TrailingLayout(*ops[0].desc, k), lgo = TrailingLayout(*ops[3].desc, k),
                 lin = TrailingLayout(in, k);
    const std::vector<float> w = LoadParam(ops, 7);
    ParallelFor(blocks, 1, [&](int64_t bb, int64_t be) {
      std::vector<float> g(len), x(len), gw(len);
      for (int64_t blk = bb; blk < be; ++blk) {
        double* pwb = has_gw ? &pw[blk * len] : nullptr;
        double* pbb = has_gb ? &pb[blk * len] : nullptr;
        for (int64_t r = blk * block_rows; r < std::min(rows, (blk + 1) * block_rows); ++r) {
          int64_t off[5];
          n.rows.Offsets(r, 5, off);
          // Rows are read and written in place where they are contiguous
          // f32 (a row's reads all come before its write, so grad_in may be
          // grad_out's memory).
          const float* grad_out = RowOf(ops[3], off[1], lgo, g.data());
          const float* input = RowOf(ops[4], off[2], lin, x.data());
          const float mean = LoadOne(ops[5], off[3]), rstd = LoadOne(ops[6], off[4]);
          double c1 = 0, c2 = 0;
          NormBackwardRow(grad_out, w.empty() ? nullptr : w.data(), mean, rstd, len, input,
                          x.data(), gw.data(), pwb, pbb, &c1, &c2);
          const float m1 = static_cast<float>(c1 / len), m2 = static_cast<float>(c2 / len);
          float* grad_in = ContiguousF32Row(ops[0], off[0], lgi);
          NormGradInput(grad_in ? grad_in : gw.data(), gw.data(), x.data(), rstd, m1, m2, len);
          if (!grad_in) StoreRow(ops[0], off[0], lgi, gw.data());
        }
      }
    });
  }
  if (has_gw) StoreColumnSums(pw, blocks, len, ops[1]);
  if (has_gb) StoreColumnSums(pb, blocks, len, ops[2]);
  return OkStatus();
}

Status RunRmsNorm(const driver::Instruction& ins, Operands ops) {
  // [out, rstd?, in, weight?]
  const isa::OperandDesc& in = *ops[2].desc;
  const uint32_t k = static_cast<uint32_t>(ins.ints[0]);
  const double eps = ins.floats[0];
  const NormRows n = MakeNormRows(in, k, {&ops[0], &ops[1], &ops[2]});
  if (n.rows.count == 0) return OkStatus();
  const Layout lin = TrailingLayout(in, k), lout = TrailingLayout(*ops[0].desc, k);
  const std::vector<float> w = LoadParam(ops, 3);
  const bool has_rstd = Present(ops[1]);
  const int64_t len = n.length;
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(1, len));
  ParallelFor(n.rows.count, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> x(len);
    for (int64_t r = begin; r < end; ++r) {
      int64_t off[3];
      n.rows.Offsets(r, 3, off);
      LoadRow(ops[2], off[2], lin, x.data());
      const double ms = len > 0 ? DotF32(x.data(), x.data(), len) / static_cast<double>(len) : 0.0;
      const float fr = static_cast<float>(1.0 / std::sqrt(ms + eps));
      NormalizeRow(x.data(), 0.0f, fr, w.empty() ? nullptr : w.data(), nullptr, len);
      StoreRow(ops[0], off[0], lout, x.data());
      if (has_rstd) StoreOne(ops[1], off[1], fr);
    }
  });
  return OkStatus();
}

Status RunRmsNormBackward(const driver::Instruction& ins, Operands ops) {
  // [grad_in, grad_weight?, grad_out, in, rstd, weight?]
  const isa::OperandDesc& in = *ops[3].desc;
  const uint32_t k = static_cast<uint32_t>(ins.ints[0]);
  const NormRows n = MakeNormRows(in, k, {&ops[0], &ops[2], &ops[3], &ops[4]});
  const int64_t len = n.length, rows = n.rows.count;
  const bool has_gw = Present(ops[1]);
  const int64_t block_rows = ParamBlockRows(rows);
  const int64_t blocks = rows == 0 ? 0 : (rows + block_rows - 1) / block_rows;
  std::vector<double> pw(has_gw ? blocks * len : 0);
  if (rows > 0 && len > 0) {
    const Layout lgi = TrailingLayout(*ops[0].desc, k), lgo = TrailingLayout(*ops[2].desc, k),
                 lin = TrailingLayout(in, k);
    const std::vector<float> w = LoadParam(ops, 5);
    ParallelFor(blocks, 1, [&](int64_t bb, int64_t be) {
      std::vector<float> g(len), x(len), gw(len);
      for (int64_t blk = bb; blk < be; ++blk) {
        double* pwb = has_gw ? &pw[blk * len] : nullptr;
        for (int64_t r = blk * block_rows; r < std::min(rows, (blk + 1) * block_rows); ++r) {
          int64_t off[4];
          n.rows.Offsets(r, 4, off);
          const float* grad_out = RowOf(ops[2], off[1], lgo, g.data());
          const float* input = RowOf(ops[3], off[2], lin, x.data());
          const float rstd = LoadOne(ops[4], off[3]);
          double c = 0, unused = 0;
          NormBackwardRow(grad_out, w.empty() ? nullptr : w.data(), 0.0f, rstd, len, input,
                          x.data(), gw.data(), pwb, nullptr, &c, &unused);
          const float m = static_cast<float>(c / len);
          float* grad_in = ContiguousF32Row(ops[0], off[0], lgi);
          NormGradInput(grad_in ? grad_in : gw.data(), gw.data(), x.data(), rstd, m, 0.0f, len);
          if (!grad_in) StoreRow(ops[0], off[0], lgi, gw.data());
        }
      }
    });
  }
  if (has_gw) StoreColumnSums(pw, blocks, len, ops[1]);
  return OkStatus();
}

}  // namespace tern::sim::kernels
