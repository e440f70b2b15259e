// Elementwise kernels: copy, cast, fill, binary, where, unary (+ backward),
// iota and random. Every operand is walked through a merged strided layout;
// runs of the innermost dimension are processed in chunks through float (or
// int64) buffers, and f32 operands that are contiguous are used in place, so
// the common case is a plain loop over float arrays that the compiler
// vectorises. Large tensors are split across threads.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "driver_shim/sim/engines/kernels_internal.h"
#include "driver_shim/sim/engines/numerics.h"
#include "driver_shim/sim/engines/philox_blocks.h"
#include "driver_shim/sim/engines/streaming_stores.h"

namespace tern::sim::kernels {
namespace {

constexpr int64_t kChunk = 1024;

struct Arg {
  uint8_t* data;
  tern_dtype_t dtype;
  const int64_t* strides;
};

Arg ArgOf(const TensorView& view) {
  return {view.data, view.desc->dtype, view.desc->strides.data()};
}

// Calls fn(out, inputs, n) on chunks of at most kChunk elements, T being
// float, double (f64 operands) or int64_t: inputs are loaded (converted)
// into T buffers unless they are contiguous f32 (float domain), and out is
// stored from a T buffer unless it is contiguous f32.
//
// `may_stream`: an f32 output past the last-level cache is computed into a
// buffer and streamed out (streaming_stores.h), no line of it read first.
// Binary functions ask for it: a + b moved four bytes for every three it
// needs, and streamed it ran 1.20-1.23x faster on one core (AMD EPYC Zen 5).
// Unary ones do not: gelu, compute-bound on one core, ran 0.85-0.9x as fast
// streamed there, for a reason not found.
template <typename T, typename Fn>
void Elementwise(const isa::OperandDesc& shape, Arg out, std::initializer_list<Arg> inputs, Fn&& fn,
                 bool may_stream = false) {
  // (out and at most 3 inputs: where's)
  constexpr int kMaxArgs = 4;
  const int nin = static_cast<int>(inputs.size());
  Arg args[kMaxArgs];
  const int64_t* strides[kMaxArgs];
  args[0] = out;
  int k = 1;
  for (const Arg& a : inputs) args[k++] = a;
  for (int i = 0; i <= nin; ++i) strides[i] = args[i].strides;
  const Layout l = MakeLayoutInMemoryOrder(shape.rank, shape.shape.data(),
                                           std::span<const int64_t* const>(strides, nin + 1));
  if (l.count == 0) return;
  const int last = l.rank - 1;
  int64_t esize[kMaxArgs];
  for (int i = 0; i <= nin; ++i) esize[i] = static_cast<int64_t>(isa::DTypeSize(args[i].dtype));
  const bool stream = may_stream && std::is_same_v<T, float> && args[0].dtype == TERN_DTYPE_F32 &&
                      ShouldStreamOutput(l.count * esize[0]);
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    alignas(64) T buffers[kMaxArgs][kChunk];
    // A broadcast input (stride 0 along the run: a scalar operand, a bias)
    // fills its buffer once for as long as the value stays the same, not
    // once per chunk (a refill was a third of `x * 2.0`'s stores).
    const uint8_t* repeated[kMaxArgs] = {};
    ForEachRun(l, begin, end, [&](const int64_t* offsets, int64_t n) {
      // Streamed, the chunks after the first start on a cache line of the
      // output: a line that ordinary stores write too (a chunk's unaligned
      // head or tail) costs a streamed chunk most of its gain.
      const int64_t lead = stream ? StreamingLead(args[0].data + offsets[0] * esize[0]) : 0;
      for (int64_t done = 0, m = 0; done < n; done += m) {
        m = std::min(done == 0 && lead > 0 ? lead : kChunk, n - done);
        const T* in[kMaxArgs] = {};
        for (int i = 1; i <= nin; ++i) {
          const int64_t stride = l.strides[i][last];
          const uint8_t* p = args[i].data + (offsets[i] + done * stride) * esize[i];
          if (stride == 0) {
            if (repeated[i] != p) {
              if constexpr (std::is_same_v<T, float>) {
                LoadF32(args[i].dtype, p, 0, kChunk, buffers[i]);
              } else if constexpr (std::is_same_v<T, double>) {
                LoadF64(args[i].dtype, p, 0, kChunk, buffers[i]);
              } else {
                LoadI64(args[i].dtype, p, 0, kChunk, buffers[i]);
              }
              repeated[i] = p;
            }
            in[i - 1] = buffers[i];
            continue;
          }
          if constexpr (std::is_same_v<T, float>) {
            if (args[i].dtype == TERN_DTYPE_F32 && stride == 1) {
              in[i - 1] = reinterpret_cast<const float*>(p);
              continue;
            }
            LoadF32(args[i].dtype, p, stride, m, buffers[i]);
          } else if constexpr (std::is_same_v<T, double>) {
            LoadF64(args[i].dtype, p, stride, m, buffers[i]);
          } else {
            LoadI64(args[i].dtype, p, stride, m, buffers[i]);
          }
          in[i - 1] = buffers[i];
        }
        const int64_t ostride = l.strides[0][last];
        uint8_t* po = args[0].data + (offsets[0] + done * ostride) * esize[0];
        if constexpr (std::is_same_v<T, float>) {
          if (args[0].dtype == TERN_DTYPE_F32 && ostride == 1) {
            if (stream) {
              fn(buffers[0], in, m);
              StoreStreaming(reinterpret_cast<float*>(po), buffers[0], m);
              continue;
            }
            fn(reinterpret_cast<float*>(po), in, m);
            continue;
          }
          fn(buffers[0], in, m);
          StoreF32(args[0].dtype, po, ostride, m, buffers[0]);
        } else if constexpr (std::is_same_v<T, double>) {
          fn(buffers[0], in, m);
          StoreF64(args[0].dtype, po, ostride, m, buffers[0]);
        } else {
          fn(buffers[0], in, m);
          StoreI64(args[0].dtype, po, ostride, m, buffers[0]);
        }
      }
    });
    // Before the pool hears that this part is done.
    if (stream) StreamingStoresDone();
  });
}

}  // namespace

// --- copy, cast, fill ---------------------------------------------------------

namespace {

// --- transposing copies --------------------------------------------------------

// A copy that transposes: the innermost dimension is contiguous in one
// operand and strided in the other, where another dimension is contiguous
// (x.t().contiguous(), a permuted activation saved for the backward). Copied
// element by element along the innermost dimension, every access of the
// strided side is a new cache line (a 256x512 f32 transpose took 163 us,
// 2.3x PyTorch's CPU copy), and tiles walked the same way are no better: a
// power-of-two row pitch puts a tile's lines in two of the L1 cache's sets.
// So each tile goes through a buffer: read line by line along the source's
// contiguous dimension, written line by line along the destination's.
constexpr int64_t kTransposeTile = 16;

// The dimension that pairs with the innermost one in a transposing copy
// (dst = operand 0, src = operand 1), or -1 if the copy is not one.
int TransposePartner(const Layout& l) {
  if (l.rank < 2) return -1;
  const int last = l.rank - 1;
  const int64_t dst_inner = l.strides[0][last], src_inner = l.strides[1][last];
  const bool reads_across = dst_inner == 1 && src_inner != 1 && src_inner != 0;
  const bool writes_across = src_inner == 1 && dst_inner != 1;
  if (!reads_across && !writes_across) return -1;
  if (l.shape[last] < kTransposeTile) return -1;
  for (int d = last - 1; d >= 0; --d) {
    if (l.strides[reads_across ? 1 : 0][d] == 1) return l.shape[d] >= kTransposeTile ? d : -1;
  }
  return -1;
}

// Whether the bytes the two operands span meet: a transposing copy in tiles
// must not read what it already wrote.
bool Overlap(const Layout& l, const uint8_t* dst, const uint8_t* src, int64_t esize) {
  auto span = [&](int op, const uint8_t* base) {
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < l.rank; ++d) {
      const int64_t reach = (l.shape[d] - 1) * l.strides[op][d];
      (reach < 0 ? lo : hi) += reach;
    }
    return std::pair<const uint8_t*, const uint8_t*>(base + lo * esize, base + (hi + 1) * esize);
  };
  const auto [d_lo, d_hi] = span(0, dst);
  const auto [s_lo, s_hi] = span(1, src);
  return d_lo < s_hi && s_lo < d_hi;
}

// One tile of `rows` x `cols` elements: element (r, c) is s[r * s_row + c *
// s_col] and goes to d[r * d_row + c * d_col]. ReadsAcross: the source is
// contiguous along r (s_row == 1) and the destination along c (d_col == 1);
// otherwise the other way round.
template <typename E, bool ReadsAcross>
TERN_INLINE void CopyTile(E* d, int64_t d_row, int64_t d_col, const E* s, int64_t s_row,
                          int64_t s_col, int64_t rows, int64_t cols) {
  E buffer[kTransposeTile][kTransposeTile];
  if constexpr (ReadsAcross) {
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) buffer[c][r] = s[r + c * s_col];
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) d[r * d_row + c] = buffer[c][r];
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) buffer[r][c] = s[r * s_row + c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) d[r + c * d_col] = buffer[r][c];
    }
  }
}

template <typename E, bool ReadsAcross>
void TransposedCopy(const Layout& l, int row_dim, uint8_t* dst, const uint8_t* src) {
  const int last = l.rank - 1;
  const int64_t rows = l.shape[row_dim], cols = l.shape[last];
  int outer_dims[TERN_MAX_RANK];
  int outer_rank = 0;
  int64_t outer_count = 1;
  for (int d = 0; d < last; ++d) {
    if (d == row_dim) continue;
    outer_dims[outer_rank++] = d;
    outer_count *= l.shape[d];
  }
  const int64_t* ds = l.strides[0];
  const int64_t* ss = l.strides[1];
  const int64_t d_row = ds[row_dim], d_col = ds[last], s_row = ss[row_dim], s_col = ss[last];
  const int64_t row_tiles = (rows + kTransposeTile - 1) / kTransposeTile;
  // A unit of work: a strip of up to kTransposeTile rows across every column.
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (kTransposeTile * cols));
  ParallelFor(outer_count * row_tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      int64_t outer = unit / row_tiles;
      const int64_t r0 = (unit % row_tiles) * kTransposeTile;
      int64_t d_off = r0 * d_row, s_off = r0 * s_row;
      for (int k = outer_rank - 1; k >= 0; --k) {
        const int d = outer_dims[k];
        const int64_t i = outer % l.shape[d];
        outer /= l.shape[d];
        d_off += i * ds[d];
        s_off += i * ss[d];
      }
      const int64_t tile_rows = std::min(kTransposeTile, rows - r0);
      for (int64_t c0 = 0; c0 < cols; c0 += kTransposeTile) {
        CopyTile<E, ReadsAcross>(reinterpret_cast<E*>(dst) + d_off + c0 * d_col, d_row, d_col,
                                 reinterpret_cast<const E*>(src) + s_off + c0 * s_col, s_row, s_col,
                                 tile_rows, std::min(kTransposeTile, cols - c0));
      }
    }
  });
}

template <typename E>
void TransposedCopy(const Layout& l, int row_dim, uint8_t* dst, const uint8_t* src) {
  if (l.strides[0][l.rank - 1] == 1) {
    TransposedCopy<E, true>(l, row_dim, dst, src);
  } else {
    TransposedCopy<E, false>(l, row_dim, dst, src);
  }
}

// Copies in tiles if the copy transposes and its operands do not overlap.
bool CopyTransposing(const Layout& l, int64_t esize, uint8_t* dst, const uint8_t* src) {
  const int row_dim = TransposePartner(l);
  if (row_dim < 0 || Overlap(l, dst, src, esize)) return false;
  WithElementBits(esize, [&](auto e) { TransposedCopy<decltype(e)>(l, row_dim, dst, src); });
  return true;
}

}  // namespace

Status RunCopy(const driver::Instruction&, Operands ops) {
  const isa::OperandDesc& dst = *ops[0].desc;
  const isa::OperandDesc& src = *ops[1].desc;
  const Layout l = MakeLayout(dst.rank, dst.shape.data(), {dst.strides.data(), src.strides.data()});
  if (l.count == 0) return OkStatus();
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(dst.dtype));
  if (CopyTransposing(l, esize, ops[0].data, ops[1].data)) return OkStatus();
  const int last = l.rank - 1;
  // Short contiguous runs (an attention head's 16 or 64 floats, gathered
  // from a permuted tensor): a memmove call per run cost more than the
  // bytes; copied element by element inline where the operands cannot meet.
  constexpr int64_t kShortRunBytes = 256;
  if (l.rank >= 2 && l.strides[0][last] == 1 && l.strides[1][last] == 1 &&
      l.shape[last] * esize <= kShortRunBytes && !Overlap(l, ops[0].data, ops[1].data, esize)) {
    // The runs are walked as the rows of a layout without the innermost
    // dimension, so the walk's own bookkeeping is paid per row of runs.
    Layout rows = l;
    rows.rank = l.rank - 1;
    const int64_t run = l.shape[last];
    rows.count = l.count / run;
    const int row_dim = rows.rank - 1;
    WithElementBits(static_cast<size_t>(esize), [&](auto e) {
      using E = decltype(e);
      const int64_t grain = std::max<int64_t>(1, kParallelGrain / run);
      ParallelFor(rows.count, grain, [&](int64_t begin, int64_t end) {
        ForEachRun(rows, begin, end, [&](const int64_t* off, int64_t n) {
          E* d = reinterpret_cast<E*>(ops[0].data) + off[0];
          const E* s = reinterpret_cast<const E*>(ops[1].data) + off[1];
          const int64_t ds = rows.strides[0][row_dim], ss = rows.strides[1][row_dim];
          for (int64_t r = 0; r < n; ++r, d += ds, s += ss) {
            for (int64_t i = 0; i < run; ++i) d[i] = s[i];
          }
        });
      });
    });
    return OkStatus();
  }
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    ForEachRun(l, begin, end, [&](const int64_t* off, int64_t n) {
      uint8_t* d = ops[0].data + off[0] * esize;
      const uint8_t* s = ops[1].data + off[1] * esize;
      CopyStrided(esize, d, l.strides[0][last], s, l.strides[1][last], n);
    });
  });
  return OkStatus();
}

Status RunCast(const driver::Instruction&, Operands ops) {
  const isa::OperandDesc& dst = *ops[0].desc;
  const isa::OperandDesc& src = *ops[1].desc;
  if (dst.dtype == src.dtype) {
    driver::Instruction copy;
    return RunCopy(copy, ops);
  }
  auto identity = [](auto* o, const auto* const* in, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = in[0][i];
  };
  if (dst.dtype == TERN_DTYPE_F64 || src.dtype == TERN_DTYPE_F64) {
    Elementwise<double>(dst, ArgOf(ops[0]), {ArgOf(ops[1])}, identity);
  } else if (!isa::IsFloat(dst.dtype) && !isa::IsFloat(src.dtype)) {
    Elementwise<int64_t>(dst, ArgOf(ops[0]), {ArgOf(ops[1])}, identity);
  } else {
    Elementwise<float>(dst, ArgOf(ops[0]), {ArgOf(ops[1])}, identity);
  }
  return OkStatus();
}

Status RunFill(const driver::Instruction& ins, Operands ops) {
  const isa::OperandDesc& dst = *ops[0].desc;
  uint64_t pattern = 0;
  const size_t esize = isa::DTypeSize(dst.dtype);
  if (dst.dtype == TERN_DTYPE_F64) {
    const double v = ins.floats[0];
    std::memcpy(&pattern, &v, 8);
  } else if (isa::IsFloat(dst.dtype)) {
    float v = static_cast<float>(ins.floats[0]);
    if (dst.dtype == TERN_DTYPE_F32) {
      std::memcpy(&pattern, &v, 4);
    } else {
      uint16_t h = dst.dtype == TERN_DTYPE_BF16 ? num::F32ToBf16(v) : num::F32ToF16(v);
      // Round from the double directly would differ only in double-rounding
      // corner cases; f32 first matches CAST.
      std::memcpy(&pattern, &h, 2);
    }
  } else {
    int64_t v = ins.ints[0];
    switch (dst.dtype) {
      case TERN_DTYPE_I8:
      case TERN_DTYPE_BOOL: {
        int8_t b = static_cast<int8_t>(v);
        std::memcpy(&pattern, &b, 1);
        break;
      }
      case TERN_DTYPE_I32: {
        int32_t w = static_cast<int32_t>(v);
        std::memcpy(&pattern, &w, 4);
        break;
      }
      default:
        std::memcpy(&pattern, &v, 8);
        break;
    }
  }
  const int64_t* dst_strides = dst.strides.data();
  const Layout l = MakeLayoutInMemoryOrder(dst.rank, dst.shape.data(),
                                           std::span<const int64_t* const>(&dst_strides, 1));
  if (l.count == 0) return OkStatus();
  const int last = l.rank - 1;
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    ForEachRun(l, begin, end, [&](const int64_t* off, int64_t n) {
      uint8_t* d = ops[0].data + off[0] * static_cast<int64_t>(esize);
      const int64_t s = l.strides[0][last];
      switch (esize) {
        case 1: {
          uint8_t v = static_cast<uint8_t>(pattern);
          if (s == 1) {
            std::memset(d, v, n);
          } else {
            for (int64_t i = 0; i < n; ++i) d[i * s] = v;
          }
          break;
        }
        case 2: {
          uint16_t v = static_cast<uint16_t>(pattern);
          uint16_t* p = reinterpret_cast<uint16_t*>(d);
          for (int64_t i = 0; i < n; ++i) p[i * s] = v;
          break;
        }
        case 4: {
          uint32_t v = static_cast<uint32_t>(pattern);
          uint32_t* p = reinterpret_cast<uint32_t*>(d);
          for (int64_t i = 0; i < n; ++i) p[i * s] = v;
          break;
        }
        default: {
          uint64_t* p = reinterpret_cast<uint64_t*>(d);
          for (int64_t i = 0; i < n; ++i) p[i * s] = pattern;
          break;
        }
      }
    });
  });
  return OkStatus();
}

// --- binary -------------------------------------------------------------------

namespace {

TERN_INLINE float FloorDivide(float a, float b) {
  if (b == 0.0f) return a / b;
  float mod = std::fmod(a, b);
  float div = (a - mod) / b;
  if (mod != 0.0f && ((b < 0.0f) != (mod < 0.0f))) div -= 1.0f;
  float floordiv;
  if (div != 0.0f) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5f) floordiv += 1.0f;
  } else {
    floordiv = std::copysign(0.0f, a / b);
  }
  return floordiv;
}

TERN_INLINE float Remainder(float a, float b) {
  float m = std::fmod(a, b);
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m += b;
  return m;
}

TERN_INLINE float MaxNan(float a, float b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
TERN_INLINE float MinNan(float a, float b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }

#define TERN_LOOP2(expr)            \
  for (int64_t i = 0; i < n; ++i) { \
    const float x = a[i], y = b[i]; \
    o[i] = (expr);                  \
  }                                 \
  return

// An operand of a binary loop: an array, or one value for every element (a
// program's constant, kept in a register instead of a chunk buffer).
struct EachOf {
  const float* p;
  TERN_INLINE float operator[](int64_t i) const { return p[i]; }
};
struct SameFor {
  float v;
  TERN_INLINE float operator[](int64_t) const { return v; }
};

template <typename A, typename B>
TERN_INLINE void BinaryLoop(int64_t fn, float* o, A a, B b, int64_t n) {
  switch (fn) {
    case TERN_BINARY_ADD:
      TERN_LOOP2(x + y);
    case TERN_BINARY_SUB:
      TERN_LOOP2(x - y);
    case TERN_BINARY_MUL:
      TERN_LOOP2(x * y);
    case TERN_BINARY_DIV:
      TERN_LOOP2(x / y);
    case TERN_BINARY_POW:
      TERN_LOOP2(y == 2.0f ? x * x : std::pow(x, y));
    case TERN_BINARY_MAX:
      TERN_LOOP2(MaxNan(x, y));
    case TERN_BINARY_MIN:
      TERN_LOOP2(MinNan(x, y));
    case TERN_BINARY_EQ:
      TERN_LOOP2(x == y ? 1.0f : 0.0f);
    case TERN_BINARY_NE:
      TERN_LOOP2(x != y ? 1.0f : 0.0f);
    case TERN_BINARY_LT:
      TERN_LOOP2(x < y ? 1.0f : 0.0f);
    case TERN_BINARY_LE:
      TERN_LOOP2(x <= y ? 1.0f : 0.0f);
    case TERN_BINARY_GT:
      TERN_LOOP2(x > y ? 1.0f : 0.0f);
    case TERN_BINARY_GE:
      TERN_LOOP2(x >= y ? 1.0f : 0.0f);
    case TERN_BINARY_LOGICAL_AND:
      TERN_LOOP2((x != 0.0f && y != 0.0f) ? 1.0f : 0.0f);
    case TERN_BINARY_LOGICAL_OR:
      TERN_LOOP2((x != 0.0f || y != 0.0f) ? 1.0f : 0.0f);
    case TERN_BINARY_LOGICAL_XOR:
      TERN_LOOP2(((x != 0.0f) != (y != 0.0f)) ? 1.0f : 0.0f);
    case TERN_BINARY_REMAINDER:
      TERN_LOOP2(Remainder(x, y));
    case TERN_BINARY_FMOD:
      TERN_LOOP2(std::fmod(x, y));
    case TERN_BINARY_ATAN2:
      TERN_LOOP2(std::atan2(x, y));
    case TERN_BINARY_FLOOR_DIVIDE:
      TERN_LOOP2(FloorDivide(x, y));
    case TERN_BINARY_COPYSIGN:
      TERN_LOOP2(std::copysign(x, y));
    default:
      return;
  }
}
#undef TERN_LOOP2

TERN_VECTOR_CLONES
void BinaryF32(int64_t fn, float* o, const float* a, const float* b, int64_t n) {
  BinaryLoop(fn, o, EachOf{a}, EachOf{b}, n);
}

// The same functions with one operand a single value: the same roundings.
TERN_VECTOR_CLONES
void BinaryF32WithScalar(int64_t fn, float* o, const float* a, float b, int64_t n) {
  BinaryLoop(fn, o, EachOf{a}, SameFor{b}, n);
}

TERN_VECTOR_CLONES
void BinaryF32ScalarWith(int64_t fn, float* o, float a, const float* b, int64_t n) {
  BinaryLoop(fn, o, SameFor{a}, EachOf{b}, n);
}

TERN_INLINE int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
TERN_INLINE int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
TERN_INLINE int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

int64_t IntPow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp & 1) ? -1 : 1;
    return 0;
  }
  uint64_t result = 1, b = static_cast<uint64_t>(base);
  while (exp) {
    if (exp & 1) result *= b;
    b *= b;
    exp >>= 1;
  }
  return static_cast<int64_t>(result);
}

// Integer division family; b == 0 sets *zero and yields 0.
TERN_INLINE int64_t IntFloorDiv(int64_t a, int64_t b) {
  if (b == -1) return WrapSub(0, a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
TERN_INLINE int64_t IntRemainder(int64_t a, int64_t b) {
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
TERN_INLINE int64_t IntFmod(int64_t a, int64_t b) { return b == -1 ? 0 : a % b; }

#define TERN_LOOP2(expr)              \
  for (int64_t i = 0; i < n; ++i) {   \
    const int64_t x = a[i], y = b[i]; \
    o[i] = (expr);                    \
  }                                   \
  return

// Returns false when a divisor was zero (those elements are left 0).
void BinaryI64(int64_t fn, int64_t* o, const int64_t* a, const int64_t* b, int64_t n, bool* zero) {
  switch (fn) {
    case TERN_BINARY_ADD:
      TERN_LOOP2(WrapAdd(x, y));
    case TERN_BINARY_SUB:
      TERN_LOOP2(WrapSub(x, y));
    case TERN_BINARY_MUL:
      TERN_LOOP2(WrapMul(x, y));
    case TERN_BINARY_POW:
      TERN_LOOP2(IntPow(x, y));
    case TERN_BINARY_MAX:
      TERN_LOOP2(x > y ? x : y);
    case TERN_BINARY_MIN:
      TERN_LOOP2(x < y ? x : y);
    case TERN_BINARY_EQ:
      TERN_LOOP2(x == y);
    case TERN_BINARY_NE:
      TERN_LOOP2(x != y);
    case TERN_BINARY_LT:
      TERN_LOOP2(x < y);
    case TERN_BINARY_LE:
      TERN_LOOP2(x <= y);
    case TERN_BINARY_GT:
      TERN_LOOP2(x > y);
    case TERN_BINARY_GE:
      TERN_LOOP2(x >= y);
    case TERN_BINARY_LOGICAL_AND:
      TERN_LOOP2(x != 0 && y != 0);
    case TERN_BINARY_LOGICAL_OR:
      TERN_LOOP2(x != 0 || y != 0);
    case TERN_BINARY_LOGICAL_XOR:
      TERN_LOOP2((x != 0) != (y != 0));
    case TERN_BINARY_BITWISE_AND:
      TERN_LOOP2(x & y);
    case TERN_BINARY_BITWISE_OR:
      TERN_LOOP2(x | y);
    case TERN_BINARY_BITWISE_XOR:
      TERN_LOOP2(x ^ y);
    case TERN_BINARY_REMAINDER:
    case TERN_BINARY_FMOD:
    case TERN_BINARY_FLOOR_DIVIDE:
      for (int64_t i = 0; i < n; ++i) {
        if (b[i] == 0) {
          *zero = true;
          o[i] = 0;
          continue;
        }
        o[i] = fn == TERN_BINARY_REMAINDER ? IntRemainder(a[i], b[i])
               : fn == TERN_BINARY_FMOD    ? IntFmod(a[i], b[i])
                                           : IntFloorDiv(a[i], b[i]);
      }
      return;
    default:
      return;
  }
}
#undef TERN_LOOP2

// The first element (row-major) of `view` that is zero, as an index string.
// The f64 functions CheckF64 allows; comparisons write 1 or 0 (stored as bool).
void BinaryF64(int64_t fn, double* o, const double* a, const double* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    switch (fn) {
      case TERN_BINARY_ADD:
        o[i] = x + y;
        break;
      case TERN_BINARY_SUB:
        o[i] = x - y;
        break;
      case TERN_BINARY_MUL:
        o[i] = x * y;
        break;
      case TERN_BINARY_DIV:
        o[i] = x / y;
        break;
      case TERN_BINARY_MAX:  // NaN propagates, as torch.maximum
        o[i] = x != x || y != y ? std::numeric_limits<double>::quiet_NaN() : std::max(x, y);
        break;
      case TERN_BINARY_MIN:
        o[i] = x != x || y != y ? std::numeric_limits<double>::quiet_NaN() : std::min(x, y);
        break;
      case TERN_BINARY_EQ:
        o[i] = x == y;
        break;
      case TERN_BINARY_NE:
        o[i] = x != y;
        break;
      case TERN_BINARY_LT:
        o[i] = x < y;
        break;
      case TERN_BINARY_LE:
        o[i] = x <= y;
        break;
      case TERN_BINARY_GT:
        o[i] = x > y;
        break;
      case TERN_BINARY_GE:
        o[i] = x >= y;
        break;
      default:  // refused by the rules
        o[i] = std::numeric_limits<double>::quiet_NaN();
        break;
    }
  }
}

std::string FirstZero(const TensorView& view) {
  const isa::OperandDesc& d = *view.desc;
  const int64_t count = d.element_count();
  std::array<int64_t, TERN_MAX_RANK> index{};
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i, offset = 0;
    for (int k = static_cast<int>(d.rank) - 1; k >= 0; --k) {
      index[k] = rest % d.shape[k];
      rest /= d.shape[k];
      offset += index[k] * d.strides[k];
    }
    if (LoadOneI64(d.dtype, At(view, offset)) == 0) return IndexString(index.data(), d.rank);
  }
  return "?";
}

}  // namespace

Status RunBinary(const driver::Instruction& ins, Operands ops) {
  const int64_t fn = ins.ints[0];
  const isa::OperandDesc& out = *ops[0].desc;
  if (ops[1].desc->dtype == TERN_DTYPE_F64) {
    Elementwise<double>(
        out, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2])},
        [fn](double* o, const double* const* in, int64_t n) { BinaryF64(fn, o, in[0], in[1], n); });
    return OkStatus();
  }
  if (isa::IsFloat(ops[1].desc->dtype)) {
    Elementwise<float>(
        out, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2])},
        [fn](float* o, const float* const* in, int64_t n) { BinaryF32(fn, o, in[0], in[1], n); },
        /*may_stream=*/true);
    return OkStatus();
  }
  std::atomic<bool> zero{false};
  Elementwise<int64_t>(out, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2])},
                       [fn, &zero](int64_t* o, const int64_t* const* in, int64_t n) {
                         bool z = false;
                         BinaryI64(fn, o, in[0], in[1], n, &z);
                         if (z) zero.store(true, std::memory_order_relaxed);
                       });
  if (zero.load()) {
    return MakeStatus(TERN_ERROR_EXECUTION_FAILED,
                      "binary {}: integer division by zero: b is 0 at position {}",
                      isa::BinaryFnName(fn), FirstZero(ops[2]));
  }
  return OkStatus();
}

namespace {

// o = c != 0 ? a : b over f32 chunks, in the vector clones (the generic
// lambda below is compiled for the baseline ISA only: relu's backward spent
// a quarter of its time in it).
TERN_VECTOR_CLONES
void SelectF32(float* o, const float* c, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = a[i], y = b[i];
    o[i] = c[i] != 0.0f ? x : y;
  }
}

}  // namespace

Status RunWhere(const driver::Instruction&, Operands ops) {
  const isa::OperandDesc& out = *ops[0].desc;
  if (out.dtype != TERN_DTYPE_F64 && isa::IsFloat(out.dtype)) {
    Elementwise<float>(
        out, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2]), ArgOf(ops[3])},
        [](float* o, const float* const* in, int64_t n) { SelectF32(o, in[0], in[1], in[2], n); });
    return OkStatus();
  }
  auto select = [](auto* o, const auto* const* in, int64_t n) {
    const auto* c = in[0];
    const auto* a = in[1];
    const auto* b = in[2];
    // Both values loaded before the choice: a select without a branch, which
    // the compiler vectorises (a branch on a random mask, as relu's backward
    // has, mispredicts half the time).
    for (int64_t i = 0; i < n; ++i) {
      const auto x = a[i], y = b[i];
      o[i] = c[i] != 0 ? x : y;
    }
  };
  if (out.dtype == TERN_DTYPE_F64) {
    Elementwise<double>(out, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2]), ArgOf(ops[3])}, select);
  } else {
    Elementwise<int64_t>(out, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2]), ArgOf(ops[3])}, select);
  }
  return OkStatus();
}

// --- unary --------------------------------------------------------------------

namespace {

struct UnaryParams {
  float p0 = 0, p1 = 0;
};

UnaryParams ParamsOf(int64_t fn, std::span<const double> f) {
  UnaryParams p;
  auto get = [&](size_t i, double def) { return static_cast<float>(i < f.size() ? f[i] : def); };
  switch (fn) {
    case TERN_UNARY_LEAKY_RELU:
      p.p0 = get(0, 0.01);
      break;
    case TERN_UNARY_ELU:
      p.p0 = get(0, 1.0);
      break;
    case TERN_UNARY_SOFTPLUS:
      p.p0 = get(0, 1.0);
      p.p1 = get(1, 20.0);
      break;
    default:
      p.p0 = get(0, 0.0);
      p.p1 = get(1, 0.0);
      break;
  }
  return p;
}

constexpr float kLn2 = 0.69314718055994530942f;
constexpr float kTwoOverSqrtPi = 1.12837916709551257390f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

TERN_INLINE float Relu6Over6(float x) {
  float v = x + 3.0f;
  v = v < 0.0f ? 0.0f : v;
  v = v > 6.0f ? 6.0f : v;
  return v / 6.0f;
}

TERN_INLINE float Mish(float x) { return x * num::Tanh(num::Softplus(x, 1.0f, 20.0f)); }

// The last n % 16 elements go through a padded block of 16, computed by the
// same vector code as the rest: a vector loop's scalar remainder may round
// an approximation differently, and an element's bits must not depend on
// where it falls in a run (a fused program and the instruction alone cut
// runs differently; so do layouts and threads).
#define TERN_LOOP1(expr)                                            \
  {                                                                 \
    const int64_t body = n - n % 16;                                \
    for (int64_t i = 0; i < body; ++i) {                            \
      const float x = in[i];                                        \
      o[i] = (expr);                                                \
    }                                                               \
    if (body < n) {                                                 \
      alignas(64) float tail_in[16] = {}, tail_out[16];             \
      for (int64_t k = body; k < n; ++k) tail_in[k - body] = in[k]; \
      for (int k = 0; k < 16; ++k) {                                \
        const float x = tail_in[k];                                 \
        tail_out[k] = (expr);                                       \
      }                                                             \
      for (int64_t k = body; k < n; ++k) o[k] = tail_out[k - body]; \
    }                                                               \
  }                                                                 \
  return

TERN_VECTOR_CLONES
void UnaryF32(int64_t fn, UnaryParams p, float* o, const float* in, int64_t n) {
  const float p0 = p.p0, p1 = p.p1;
  switch (fn) {
    case TERN_UNARY_NEG:
      TERN_LOOP1(-x);
    case TERN_UNARY_ABS:
      TERN_LOOP1(std::fabs(x));
    case TERN_UNARY_EXP:
      TERN_LOOP1(num::Exp(x));
    case TERN_UNARY_LOG:
      TERN_LOOP1(num::Log(x));
    case TERN_UNARY_SQRT:
      TERN_LOOP1(std::sqrt(x));
    case TERN_UNARY_RSQRT:
      TERN_LOOP1(1.0f / std::sqrt(x));
    case TERN_UNARY_SIN:
      TERN_LOOP1(std::sin(x));
    case TERN_UNARY_COS:
      TERN_LOOP1(std::cos(x));
    case TERN_UNARY_TANH:
      TERN_LOOP1(num::Tanh(x));
    case TERN_UNARY_SIGMOID:
      TERN_LOOP1(num::Sigmoid(x));
    case TERN_UNARY_RELU:
      TERN_LOOP1(x < 0.0f ? 0.0f : x);
    case TERN_UNARY_GELU:
      TERN_LOOP1(num::Gelu(x));
    case TERN_UNARY_GELU_TANH:
      TERN_LOOP1(num::GeluTanh(x));
    case TERN_UNARY_SILU:
      TERN_LOOP1(num::Silu(x));
    case TERN_UNARY_ERF:
      TERN_LOOP1(num::Erf(x));
    case TERN_UNARY_FLOOR:
      TERN_LOOP1(std::floor(x));
    case TERN_UNARY_CEIL:
      TERN_LOOP1(std::ceil(x));
    case TERN_UNARY_ROUND:
      TERN_LOOP1(std::nearbyint(x));
    case TERN_UNARY_TRUNC:
      TERN_LOOP1(std::trunc(x));
    case TERN_UNARY_SIGN:
      TERN_LOOP1((x > 0.0f ? 1.0f : 0.0f) - (x < 0.0f ? 1.0f : 0.0f));
    case TERN_UNARY_RECIPROCAL:
      TERN_LOOP1(1.0f / x);
    case TERN_UNARY_LOGICAL_NOT:
      TERN_LOOP1(x == 0.0f ? 1.0f : 0.0f);
    case TERN_UNARY_EXPM1:
      TERN_LOOP1(num::Expm1(x));
    case TERN_UNARY_LOG1P:
      TERN_LOOP1(num::Log1p(x));
    case TERN_UNARY_SQUARE:
      TERN_LOOP1(x * x);
    case TERN_UNARY_LEAKY_RELU:
      TERN_LOOP1(x > 0.0f ? x : x * p0);
    case TERN_UNARY_ELU:
      TERN_LOOP1(x > 0.0f ? x : p0 * num::Expm1(x));
    case TERN_UNARY_POW_SCALAR:
      // The exponents PyTorch's CPU kernel computes without pow (the same
      // roundings as it; and pow costs ~20x a multiply: GELU's x ** 3).
      if (p0 == 2.0f) {
        TERN_LOOP1(x * x);
      }
      if (p0 == 1.0f) {
        TERN_LOOP1(x);
      }
      if (p0 == 3.0f) {
        TERN_LOOP1(x * x * x);
      }
      if (p0 == 0.5f) {
        TERN_LOOP1(std::sqrt(x));
      }
      if (p0 == -0.5f) {
        TERN_LOOP1(1.0f / std::sqrt(x));
      }
      if (p0 == -1.0f) {
        TERN_LOOP1(1.0f / x);
      }
      if (p0 == -2.0f) {
        TERN_LOOP1(1.0f / (x * x));
      }
      TERN_LOOP1(std::pow(x, p0));
    case TERN_UNARY_CLAMP: {
      TERN_LOOP1((x < p0 ? p0 : x) > p1 ? p1 : (x < p0 ? p0 : x));
    }
    case TERN_UNARY_AFFINE:
      TERN_LOOP1(p0 * x + p1);
    case TERN_UNARY_SOFTPLUS:
      TERN_LOOP1(num::Softplus(x, p0, p1));
    case TERN_UNARY_ISNAN:
      TERN_LOOP1(x != x ? 1.0f : 0.0f);
    case TERN_UNARY_LOG2:
      TERN_LOOP1(std::log2(x));
    case TERN_UNARY_EXP2:
      TERN_LOOP1(std::exp2(x));
    case TERN_UNARY_TAN:
      TERN_LOOP1(std::tan(x));
    case TERN_UNARY_ASIN:
      TERN_LOOP1(std::asin(x));
    case TERN_UNARY_ACOS:
      TERN_LOOP1(std::acos(x));
    case TERN_UNARY_ATAN:
      TERN_LOOP1(std::atan(x));
    case TERN_UNARY_SINH:
      TERN_LOOP1(std::sinh(x));
    case TERN_UNARY_COSH:
      TERN_LOOP1(std::cosh(x));
    case TERN_UNARY_HARDSIGMOID:
      TERN_LOOP1(Relu6Over6(x));
    case TERN_UNARY_HARDSWISH:
      TERN_LOOP1(x * Relu6Over6(x));
    case TERN_UNARY_MISH:
      TERN_LOOP1(Mish(x));
    default:
      return;
  }
}
#undef TERN_LOOP1

#define TERN_LOOP1(expr)            \
  for (int64_t i = 0; i < n; ++i) { \
    const int64_t x = in[i];        \
    (void)x;                        \
    o[i] = (expr);                  \
  }                                 \
  return

void UnaryI64(int64_t fn, UnaryParams p, const std::vector<double>& floats, bool is_bool,
              int64_t* o, const int64_t* in, int64_t n) {
  (void)p;
  switch (fn) {
    case TERN_UNARY_NEG:
      TERN_LOOP1(WrapSub(0, x));
    case TERN_UNARY_ABS:
      TERN_LOOP1(x < 0 ? WrapSub(0, x) : x);
    case TERN_UNARY_RELU:
      TERN_LOOP1(x < 0 ? 0 : x);
    case TERN_UNARY_FLOOR:
    case TERN_UNARY_CEIL:
    case TERN_UNARY_ROUND:
    case TERN_UNARY_TRUNC:
      TERN_LOOP1(x);
    case TERN_UNARY_SIGN:
      TERN_LOOP1((x > 0) - (x < 0));
    case TERN_UNARY_SQUARE:
      TERN_LOOP1(WrapMul(x, x));
    case TERN_UNARY_LOGICAL_NOT:
      TERN_LOOP1(x == 0);
    case TERN_UNARY_ISNAN:
      TERN_LOOP1(0);
    case TERN_UNARY_BITWISE_NOT:
      if (is_bool) {
        TERN_LOOP1(x == 0);
      }
      TERN_LOOP1(~x);
    case TERN_UNARY_CLAMP: {
      // Integer bounds: ceil(min), floor(max), saturated to int64.
      auto bound = [](double v, bool lower) -> int64_t {
        double r = lower ? std::ceil(v) : std::floor(v);
        if (r <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
        if (r >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
        return static_cast<int64_t>(r);
      };
      const int64_t lo = bound(floats[0], true), hi = bound(floats[1], false);
      TERN_LOOP1((x < lo ? lo : x) > hi ? hi : (x < lo ? lo : x));
    }
    default:
      return;
  }
}
#undef TERN_LOOP1

// d/dx of each function, times the incoming gradient g.
#define TERN_LOOP1(expr)            \
  for (int64_t i = 0; i < n; ++i) { \
    const float x = in[i];          \
    const float g = go[i];          \
    (void)x;                        \
    o[i] = (expr);                  \
  }                                 \
  return

TERN_INLINE float GeluGrad(float x) {
  float cdf = 0.5f + 0.5f * num::Erf(x * num::kSqrt1_2);
  float pdf = kInvSqrt2Pi * num::Exp(-0.5f * x * x);
  return cdf + x * pdf;
}

TERN_INLINE float GeluTanhGrad(float x) {
  const float k = num::kSqrt2OverPi, c = 0.044715f;
  float u = k * (x + c * x * x * x);
  float t = num::Tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
}

TERN_INLINE float SiluGrad(float x) {
  float s = num::Sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

TERN_INLINE float MishGrad(float x) {
  float sp = num::Softplus(x, 1.0f, 20.0f);
  float t = num::Tanh(sp);
  return t + x * num::Sigmoid(x) * (1.0f - t * t);
}

TERN_VECTOR_CLONES
void UnaryBackwardF32(int64_t fn, UnaryParams p, float* o, const float* go, const float* in,
                      int64_t n) {
  const float p0 = p.p0, p1 = p.p1;
  switch (fn) {
    case TERN_UNARY_NEG:
      TERN_LOOP1(-g);
    case TERN_UNARY_ABS:
      TERN_LOOP1(x > 0.0f ? g : (x < 0.0f ? -g : 0.0f));
    case TERN_UNARY_EXP:
    case TERN_UNARY_EXPM1:
      TERN_LOOP1(g * num::Exp(x));
    case TERN_UNARY_LOG:
      TERN_LOOP1(g / x);
    case TERN_UNARY_SQRT:
      TERN_LOOP1(g / (2.0f * std::sqrt(x)));
    case TERN_UNARY_RSQRT:
      TERN_LOOP1(-0.5f * g / (x * std::sqrt(x)));
    case TERN_UNARY_SIN:
      TERN_LOOP1(g * std::cos(x));
    case TERN_UNARY_COS:
      TERN_LOOP1(-g * std::sin(x));
    case TERN_UNARY_TANH:
      TERN_LOOP1(g * (1.0f - num::Tanh(x) * num::Tanh(x)));
    case TERN_UNARY_SIGMOID:
      TERN_LOOP1(g * num::Sigmoid(x) * (1.0f - num::Sigmoid(x)));
    case TERN_UNARY_RELU:
      TERN_LOOP1(x > 0.0f ? g : 0.0f);
    case TERN_UNARY_GELU:
      TERN_LOOP1(g * GeluGrad(x));
    case TERN_UNARY_GELU_TANH:
      TERN_LOOP1(g * GeluTanhGrad(x));
    case TERN_UNARY_SILU:
      TERN_LOOP1(g * SiluGrad(x));
    case TERN_UNARY_ERF:
      TERN_LOOP1(g * kTwoOverSqrtPi * num::Exp(-x * x));
    case TERN_UNARY_FLOOR:
    case TERN_UNARY_CEIL:
    case TERN_UNARY_ROUND:
    case TERN_UNARY_TRUNC:
    case TERN_UNARY_SIGN:
      for (int64_t i = 0; i < n; ++i) o[i] = 0.0f;
      return;
    case TERN_UNARY_RECIPROCAL:
      TERN_LOOP1(-g / (x * x));
    case TERN_UNARY_LOG1P:
      TERN_LOOP1(g / (1.0f + x));
    case TERN_UNARY_SQUARE:
      TERN_LOOP1(2.0f * x * g);
    case TERN_UNARY_LEAKY_RELU:
      TERN_LOOP1(x > 0.0f ? g : g * p0);
    case TERN_UNARY_ELU:
      TERN_LOOP1(x > 0.0f ? g : g * p0 * num::Exp(x));
    case TERN_UNARY_POW_SCALAR:
      if (p0 == 0.0f) {
        for (int64_t i = 0; i < n; ++i) o[i] = 0.0f;
        return;
      }
      if (p0 == 2.0f) {
        TERN_LOOP1(g * (2.0f * x));
      }
      if (p0 == 3.0f) {
        TERN_LOOP1(g * (3.0f * (x * x)));
      }
      TERN_LOOP1(g * p0 * std::pow(x, p0 - 1.0f));
    case TERN_UNARY_CLAMP:
      TERN_LOOP1((x >= p0 && x <= p1) ? g : 0.0f);
    case TERN_UNARY_AFFINE:
      TERN_LOOP1(g * p0);
    case TERN_UNARY_SOFTPLUS:
      TERN_LOOP1(x * p0 > p1 ? g : g * num::Sigmoid(x * p0));
    case TERN_UNARY_LOG2:
      TERN_LOOP1(g / (x * kLn2));
    case TERN_UNARY_EXP2:
      TERN_LOOP1(g * std::exp2(x) * kLn2);
    case TERN_UNARY_TAN:
      TERN_LOOP1(g * (1.0f + std::tan(x) * std::tan(x)));
    case TERN_UNARY_ASIN:
      TERN_LOOP1(g / std::sqrt(1.0f - x * x));
    case TERN_UNARY_ACOS:
      TERN_LOOP1(-g / std::sqrt(1.0f - x * x));
    case TERN_UNARY_ATAN:
      TERN_LOOP1(g / (1.0f + x * x));
    case TERN_UNARY_SINH:
      TERN_LOOP1(g * std::cosh(x));
    case TERN_UNARY_COSH:
      TERN_LOOP1(g * std::sinh(x));
    case TERN_UNARY_HARDSIGMOID:
      TERN_LOOP1((x > -3.0f && x < 3.0f) ? g / 6.0f : 0.0f);
    case TERN_UNARY_HARDSWISH:
      TERN_LOOP1(x < -3.0f ? 0.0f : (x <= 3.0f ? g * (x / 3.0f + 0.5f) : g));
    case TERN_UNARY_MISH:
      TERN_LOOP1(g * MishGrad(x));
    default:
      return;
  }
}
#undef TERN_LOOP1

}  // namespace

namespace {

// The f64 functions CheckF64 allows, correctly rounded as the C library's.
double UnaryF64(int64_t fn, double x) {
  switch (fn) {
    case TERN_UNARY_NEG:
      return -x;
    case TERN_UNARY_ABS:
      return std::fabs(x);
    case TERN_UNARY_RECIPROCAL:
      return 1.0 / x;
    case TERN_UNARY_SQRT:
      return std::sqrt(x);
    case TERN_UNARY_RSQRT:
      return 1.0 / std::sqrt(x);
    case TERN_UNARY_EXP:
      return std::exp(x);
    case TERN_UNARY_LOG:
      return std::log(x);
    case TERN_UNARY_SIN:
      return std::sin(x);
    case TERN_UNARY_COS:
      return std::cos(x);
    default:  // refused by the rules
      return std::numeric_limits<double>::quiet_NaN();
  }
}

}  // namespace

Status RunUnary(const driver::Instruction& ins, Operands ops) {
  const int64_t fn = ins.ints[0];
  const UnaryParams p = ParamsOf(fn, ins.floats);
  const isa::OperandDesc& out = *ops[0].desc;
  const tern_dtype_t in_dtype = ops[1].desc->dtype;
  if (in_dtype == TERN_DTYPE_F64) {
    Elementwise<double>(out, ArgOf(ops[0]), {ArgOf(ops[1])},
                        [fn](double* o, const double* const* in, int64_t n) {
                          for (int64_t i = 0; i < n; ++i) o[i] = UnaryF64(fn, in[0][i]);
                        });
    return OkStatus();
  }
  if (isa::IsFloat(in_dtype)) {
    Elementwise<float>(
        out, ArgOf(ops[0]), {ArgOf(ops[1])},
        [fn, p](float* o, const float* const* in, int64_t n) { UnaryF32(fn, p, o, in[0], n); });
    return OkStatus();
  }
  const bool is_bool = in_dtype == TERN_DTYPE_BOOL;
  const std::vector<double>& floats = ins.floats;
  Elementwise<int64_t>(out, ArgOf(ops[0]), {ArgOf(ops[1])},
                       [&, fn, p](int64_t* o, const int64_t* const* in, int64_t n) {
                         UnaryI64(fn, p, floats, is_bool, o, in[0], n);
                       });
  return OkStatus();
}

Status RunUnaryBackward(const driver::Instruction& ins, Operands ops) {
  const int64_t fn = ins.ints[0];
  const UnaryParams p = ParamsOf(fn, ins.floats);
  Elementwise<float>(*ops[0].desc, ArgOf(ops[0]), {ArgOf(ops[1]), ArgOf(ops[2])},
                     [fn, p](float* o, const float* const* in, int64_t n) {
                       UnaryBackwardF32(fn, p, o, in[0], in[1], n);
                     });
  return OkStatus();
}

// --- fused programs and epilogues ------------------------------------------------

namespace {

// One decoded step of an ELEMENTWISE program (validated by the loader).
struct ProgramStep {
  int64_t kind, fn, a, b, c;
  UnaryParams params;
  float constant = 0;
};

// How many registers a step reads: its operands a, b, c in that order.
int OperandsRead(const ProgramStep& step) {
  switch (step.kind) {
    case TERN_STEP_CONSTANT:
      return 0;
    case TERN_STEP_UNARY:
      return 1;
    case TERN_STEP_BINARY:
      return 2;
    default:  // TERN_STEP_WHERE
      return 3;
  }
}

// --- chains: a run of arithmetic steps computed in a register ---------------------
//
// A program's steps run one at a time over a chunk, each a pass of loads and
// stores through the L1 cache (about 3 cycles per 16 floats per step on an
// AMD EPYC Zen 4, bound by the stores). A chain is a run of arithmetic steps
// (add, subtract, multiply, divide, and the unary steps ChainableUnary names)
// in which each step takes the one before it as its running value: it runs
// as one pass over the chunk, 64 floats at a time, the running value kept in
// vector registers and each step loading only its other operand; a result
// that another step also reads, or that is an output, is stored as the chain
// passes (its tap). Every step is still the same single IEEE operation on the
// same operands in the same order (nothing is contracted into a fused
// multiply-add: ISO C++ mode, -ffp-contract=off), so a chain gives the bits
// of its steps run one by one.

// What a link does with the running value v and its other operand s.
// Each binary function as v fn s, s fn v and v fn v, in that order.
enum ChainOp : uint8_t {
  kAddVS,
  kAddSV,
  kAddVV,
  kSubVS,
  kSubSV,
  kSubVV,
  kMulVS,
  kMulSV,
  kMulVV,
  kDivVS,
  kDivSV,
  kDivVV,
  // Unary steps the same way: -v, v * v, (v * v) * v, 1 / v, sqrt(v),
  // 1 / sqrt(v), |v|.
  kNeg,
  kSquare,
  kCube,
  kReciprocal,
  kSqrt,
  kRsqrt,
  kAbs,
};

// One step of a chain: its operation, and its other operand: `side` (a chunk
// of floats, or a constant's chunk read at element 0: `side_mask` 0).
struct ChainLink {
  ChainOp op;
  const float* side;
  int64_t side_mask;     // ~0 for an array, 0 for a constant
  float* tap = nullptr;  // where the value after this link is also stored, if read elsewhere
};

// A binary function a chain can take, as the ChainOp for "v fn s".
bool ChainableBinary(int64_t fn, ChainOp* op) {
  switch (fn) {
    case TERN_BINARY_ADD:
      *op = kAddVS;
      return true;
    case TERN_BINARY_SUB:
      *op = kSubVS;
      return true;
    case TERN_BINARY_MUL:
      *op = kMulVS;
      return true;
    case TERN_BINARY_DIV:
      *op = kDivVS;
      return true;
    default:
      return false;
  }
}

// A unary step a chain can take (the operations UnaryF32 computes for it,
// in the same order), as its ChainOp.
bool ChainableUnary(int64_t fn, const UnaryParams& params, ChainOp* op) {
  switch (fn) {
    case TERN_UNARY_NEG:
      *op = kNeg;
      return true;
    case TERN_UNARY_SQUARE:
      *op = kSquare;
      return true;
    case TERN_UNARY_RECIPROCAL:
      *op = kReciprocal;
      return true;
    case TERN_UNARY_SQRT:
      *op = kSqrt;
      return true;
    case TERN_UNARY_RSQRT:
      *op = kRsqrt;
      return true;
    case TERN_UNARY_ABS:
      *op = kAbs;
      return true;
    case TERN_UNARY_POW_SCALAR:
      if (params.p0 == 2.0f || params.p0 == 3.0f) {
        *op = params.p0 == 2.0f ? kSquare : kCube;
        return true;
      }
      return false;
    default:
      return false;
  }
}

// v[q] = v[q] op s[q] for each of the N values (N vectors in flight, or one
// float). By reference: a 64-byte vector passed by value changes the calling
// convention between the clones, which GCC warns of.
template <typename V, int N>
TERN_INLINE void ApplyChainOp(ChainOp op, V (&v)[N], const V (&s)[N]) {
  switch (op) {
#define TERN_CHAIN_CASE(name, expr)            \
  case name:                                   \
    for (int q = 0; q < N; ++q) v[q] = (expr); \
    return
    TERN_CHAIN_CASE(kAddVS, v[q] + s[q]);
    TERN_CHAIN_CASE(kAddSV, s[q] + v[q]);
    TERN_CHAIN_CASE(kAddVV, v[q] + v[q]);
    TERN_CHAIN_CASE(kSubVS, v[q] - s[q]);
    TERN_CHAIN_CASE(kSubSV, s[q] - v[q]);
    TERN_CHAIN_CASE(kSubVV, v[q] - v[q]);
    TERN_CHAIN_CASE(kMulVS, v[q] * s[q]);
    TERN_CHAIN_CASE(kMulSV, s[q] * v[q]);
    TERN_CHAIN_CASE(kMulVV, v[q] * v[q]);
    TERN_CHAIN_CASE(kDivVS, v[q] / s[q]);
    TERN_CHAIN_CASE(kDivSV, s[q] / v[q]);
    TERN_CHAIN_CASE(kDivVV, v[q] / v[q]);
    TERN_CHAIN_CASE(kNeg, -v[q]);
    TERN_CHAIN_CASE(kSquare, v[q] * v[q]);
    TERN_CHAIN_CASE(kCube, v[q] * v[q] * v[q]);
    TERN_CHAIN_CASE(kReciprocal, 1.0f / v[q]);
#undef TERN_CHAIN_CASE
    default:  // kSqrt, kRsqrt, kAbs: lane by lane (GCC makes one vector
              // instruction of each loop)
      for (int q = 0; q < N; ++q) {
        if constexpr (std::is_same_v<V, float>) {
          v[q] = op == kSqrt    ? std::sqrt(v[q])
                 : op == kRsqrt ? 1.0f / std::sqrt(v[q])
                                : std::fabs(v[q]);
        } else if (op == kSqrt) {
          for (int l = 0; l < 16; ++l) v[q][l] = std::sqrt(v[q][l]);
        } else if (op == kRsqrt) {
          for (int l = 0; l < 16; ++l) v[q][l] = 1.0f / std::sqrt(v[q][l]);
        } else {
          for (int l = 0; l < 16; ++l) v[q][l] = std::fabs(v[q][l]);
        }
      }
      return;
  }
}

// 16 floats, one AVX-512 register (two AVX2 ones, four SSE ones).
typedef float ChainVector __attribute__((vector_size(64)));

TERN_INLINE void LoadChainVector(const float* p, ChainVector& v) { std::memcpy(&v, p, sizeof(v)); }

// out[0, m) = the chain: v = head (head_mask as a link's), then each link.
TERN_VECTOR_CLONES
void RunChainF32(const float* head, int64_t head_mask, const ChainLink* links, int count,
                 float* out, int64_t m) {
  int64_t j = 0;
  // Four vectors at a time: a link's operation waits for the one before it
  // (3-4 cycles), so one vector alone would wait out every link's latency.
  for (; j + 64 <= m; j += 64) {
    ChainVector v[4], s[4];
    for (int q = 0; q < 4; ++q) LoadChainVector(head + ((j + 16 * q) & head_mask), v[q]);
    for (int k = 0; k < count; ++k) {
      const ChainLink& link = links[k];
      for (int q = 0; q < 4; ++q)
        LoadChainVector(link.side + ((j + 16 * q) & link.side_mask), s[q]);
      ApplyChainOp(link.op, v, s);
      if (link.tap != nullptr) std::memcpy(link.tap + j, v, sizeof(v));
    }
    std::memcpy(out + j, v, sizeof(v));
  }
  for (; j + 16 <= m; j += 16) {
    ChainVector v[1], s[1];
    LoadChainVector(head + (j & head_mask), v[0]);
    for (int k = 0; k < count; ++k) {
      const ChainLink& link = links[k];
      LoadChainVector(link.side + (j & link.side_mask), s[0]);
      ApplyChainOp(link.op, v, s);
      if (link.tap != nullptr) std::memcpy(link.tap + j, v, sizeof(v));
    }
    std::memcpy(out + j, v, sizeof(v));
  }
  for (; j < m; ++j) {
    float v[1] = {head[j & head_mask]};
    for (int k = 0; k < count; ++k) {
      const float s[1] = {links[k].side[j & links[k].side_mask]};
      ApplyChainOp(links[k].op, v, s);
      if (links[k].tap != nullptr) links[k].tap[j] = v[0];
    }
    out[j] = v[0];
  }
}

}  // namespace

Status RunElementwiseProgram(const driver::Instruction& ins, Operands ops) {
  constexpr int kFirstInput = TERN_PROGRAM_OUTPUTS;
  const isa::OperandDesc& shape = *ops[0].desc;
  const int64_t step_count = ins.ints[0];
  std::vector<ProgramStep> steps(static_cast<size_t>(step_count));
  for (int64_t i = 0; i < step_count; ++i) {
    const int64_t* f = &ins.ints[1 + 5 * i];
    ProgramStep& step = steps[i];
    step = {f[0], f[1], f[2], f[3], f[4], {}, 0.0f};
    if (step.kind == TERN_STEP_CONSTANT) step.constant = static_cast<float>(ins.floats[step.a]);
    if (step.kind == TERN_STEP_UNARY) {
      const size_t count = isa::UnaryParameterCount(step.fn);
      step.params =
          ParamsOf(step.fn, std::span<const double>(ins.floats)
                                .subspan(count == 0 ? 0 : static_cast<size_t>(step.b), count));
    }
    // A binary step of two constants is a constant: computed here once, by
    // the function that would compute it per element (the same value), so
    // that it makes no pass and chains go past it (AdamW's 0.1 * 1.0
    // between a subtraction and the product that reads it).
    if (step.kind == TERN_STEP_BINARY && step.a >= TERN_PROGRAM_INPUTS &&
        step.b >= TERN_PROGRAM_INPUTS) {
      const ProgramStep& a = steps[static_cast<size_t>(step.a - TERN_PROGRAM_INPUTS)];
      const ProgramStep& b = steps[static_cast<size_t>(step.b - TERN_PROGRAM_INPUTS)];
      if (a.kind == TERN_STEP_CONSTANT && b.kind == TERN_STEP_CONSTANT) {
        float value = 0;
        BinaryF32(step.fn, &value, &a.constant, &b.constant, 1);
        step = {TERN_STEP_CONSTANT, 0, 0, 0, 0, {}, value};
      }
    }
  }
  // The present operands, walked together: slot[k] is operand k's slot.
  const int64_t* strides[kMaxLayoutOperands];
  int operand_of_slot[kMaxLayoutOperands];
  int count = 0;
  for (int s = 0; s < static_cast<int>(ops.size()) && s < kMaxLayoutOperands; ++s) {
    operand_of_slot[s] = -1;
    if (!ops[s].desc->present()) continue;
    operand_of_slot[s] = count;
    strides[count] = ops[s].desc->strides.data();
    ++count;
  }
  for (int s = static_cast<int>(ops.size()); s < kMaxLayoutOperands; ++s) operand_of_slot[s] = -1;
  const Layout l = MakeLayoutInMemoryOrder(shape.rank, shape.shape.data(),
                                           std::span<const int64_t* const>(strides, count));
  if (l.count == 0) return OkStatus();
  const int last = l.rank - 1;
  int64_t output_register[TERN_PROGRAM_OUTPUTS];
  for (int j = 0; j < TERN_PROGRAM_OUTPUTS; ++j)
    output_register[j] = ins.ints[1 + 5 * step_count + j];
  // Step results share chunk buffers by liveness: a step's result takes the
  // buffer of a result no later step reads (the program's outputs stay live),
  // so a long program's chunks stay in the L1 cache instead of one buffer per
  // step (a 13-step GELU backward kept 52 KiB of chunks live).
  std::vector<int> buffer_of_step(steps.size());
  int step_buffers = 0;
  // The constant step that computes register r, if one does.
  auto constant_at = [&](int64_t r) -> const ProgramStep* {
    if (r < TERN_PROGRAM_INPUTS) return nullptr;
    const ProgramStep& step = steps[static_cast<size_t>(r - TERN_PROGRAM_INPUTS)];
    return step.kind == TERN_STEP_CONSTANT ? &step : nullptr;
  };
  {
    const int64_t end_of_program = static_cast<int64_t>(steps.size());
    std::vector<int64_t> last_use(TERN_PROGRAM_INPUTS + steps.size(), -1);
    for (size_t i = 0; i < steps.size(); ++i) {
      const ProgramStep& step = steps[i];
      const int64_t operands[3] = {step.a, step.b, step.c};
      for (int k = 0; k < OperandsRead(step); ++k) last_use[operands[k]] = static_cast<int64_t>(i);
    }
    for (int j = 0; j < TERN_PROGRAM_OUTPUTS; ++j) {
      if (operand_of_slot[j] >= 0) last_use[output_register[j]] = end_of_program;
    }
    std::vector<int> free_buffers;
    std::vector<std::vector<int>> freed_after(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].kind == TERN_STEP_CONSTANT) continue;  // a buffer of its own, below
      int buffer = step_buffers;
      if (free_buffers.empty()) {
        ++step_buffers;
      } else {
        buffer = free_buffers.back();
        free_buffers.pop_back();
      }
      buffer_of_step[i] = buffer;
      const int64_t last = last_use[TERN_PROGRAM_INPUTS + i];
      if (last < 0) {
        freed_after[i].push_back(buffer);  // nothing reads it
      } else if (last < end_of_program) {
        freed_after[last].push_back(buffer);
      }
      // Freed only after this step's result has its buffer: a result never
      // shares the buffer of an operand it is computed from.
      for (int b : freed_after[i]) free_buffers.push_back(b);
    }
    // A constant's chunk is the same in every chunk: filled once per part
    // into a buffer no other step takes, and binary steps read the value
    // itself (a GELU backward's eight constants were refilled 32 KiB a chunk
    // and then read back, a fifth of its stores in a cache they overflowed).
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].kind == TERN_STEP_CONSTANT) buffer_of_step[i] = step_buffers++;
    }
  }
  // The chains (see ChainLink): chain_length[i] > 1 where step i begins a
  // chain of that many computing steps (constants in between are skipped: they
  // do nothing per chunk). A step extends the chain when it is a chainable
  // step reading the previous computing step's result as its running value;
  // tapped[i] when step i's result, inside a chain, is also read by another
  // step or is an output: the chain stores it as it passes.
  std::vector<int> chain_length(steps.size(), 1);
  std::vector<bool> tapped(steps.size(), false);
  {
    const int64_t end_of_program = static_cast<int64_t>(steps.size());
    std::vector<int64_t> readers(TERN_PROGRAM_INPUTS + steps.size(), 0);
    for (const ProgramStep& step : steps) {
      const int64_t operands[3] = {step.a, step.b, step.c};
      for (int k = 0; k < OperandsRead(step); ++k) {
        // x * x reads x once as far as the chain is concerned.
        if (k == 1 && operands[1] == operands[0]) continue;
        ++readers[operands[k]];
      }
    }
    for (int j = 0; j < TERN_PROGRAM_OUTPUTS; ++j) {
      if (operand_of_slot[j] >= 0) readers[output_register[j]] += end_of_program;
    }
    ChainOp op;
    int64_t head = -1, previous = -1;
    for (int64_t i = 0; i < end_of_program; ++i) {
      const ProgramStep& step = steps[i];
      if (step.kind == TERN_STEP_CONSTANT) continue;
      const bool unary = step.kind == TERN_STEP_UNARY;
      const bool chainable = (step.kind == TERN_STEP_BINARY && ChainableBinary(step.fn, &op)) ||
                             (unary && ChainableUnary(step.fn, step.params, &op));
      const int64_t previous_register = TERN_PROGRAM_INPUTS + previous;
      if (chainable && head >= 0 &&
          (step.a == previous_register || (!unary && step.b == previous_register))) {
        ++chain_length[head];
        tapped[previous] = readers[previous_register] > 1;
      } else {
        head = chainable ? i : -1;
      }
      previous = i;
    }
  }
  // Chunks as long as the tensor where it is shorter than kChunk (rounded up
  // to a cache line's floats): a program over a bias of 256 elements fills
  // and walks 256-element buffers, not 1024-element ones.
  const int64_t width = std::min(kChunk, (l.count + 15) / 16 * 16);
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    // A chunk per input that needs converting, per step buffer, and per
    // output that copies an input (so that an output written in place cannot
    // change it first). Left uninitialised: every element is written before
    // it is read, and a small tensor's program zeroed 50-60 KiB a call.
    const auto storage = std::make_unique_for_overwrite<float[]>(
        static_cast<size_t>(TERN_PROGRAM_INPUTS + step_buffers + TERN_PROGRAM_OUTPUTS) * width);
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].kind != TERN_STEP_CONSTANT) continue;
      float* o = &storage[(TERN_PROGRAM_INPUTS + buffer_of_step[i]) * width];
      std::fill(o, o + width, steps[i].constant);
    }
    // Runs the chain of `length` computing steps from step `first` over the
    // chunk's m elements into the last step's buffer; returns that step.
    auto RunChain = [&](size_t first, int length, int64_t m, const float** reg) {
      ChainLink links[TERN_PROGRAM_MAX_STEPS];
      const ProgramStep& head = steps[first];
      auto mask_of = [&](int64_t r) -> int64_t {
        return constant_at(r) != nullptr ? 0 : ~int64_t{0};
      };
      ChainOp op = kAddVS;
      // The buffer a link's result is stored in as well, where it is tapped.
      auto tap_of = [&](size_t step) -> float* {
        if (!tapped[step]) return nullptr;
        float* buffer = &storage[(TERN_PROGRAM_INPUTS + buffer_of_step[step]) * width];
        reg[TERN_PROGRAM_INPUTS + step] = buffer;
        return buffer;
      };
      // v = a, then v fn b (or fn v): the head is a link like the others. A
      // unary link reads no other operand: its side is any valid chunk.
      if (head.kind == TERN_STEP_UNARY) {
        ChainableUnary(head.fn, head.params, &op);
        links[0] = {op, reg[head.a], 0};
      } else {
        ChainableBinary(head.fn, &op);
        links[0] = {head.a == head.b ? static_cast<ChainOp>(op + 2) : op, reg[head.b],
                    mask_of(head.b)};
      }
      links[0].tap = tap_of(first);
      int count = 1;
      size_t i = first, last = first;
      int64_t running = TERN_PROGRAM_INPUTS + static_cast<int64_t>(first);
      while (count < length) {
        ++i;
        const ProgramStep& step = steps[i];
        if (step.kind == TERN_STEP_CONSTANT) {
          reg[TERN_PROGRAM_INPUTS + i] =
              &storage[(TERN_PROGRAM_INPUTS + buffer_of_step[i]) * width];
          continue;
        }
        if (step.kind == TERN_STEP_UNARY) {
          ChainableUnary(step.fn, step.params, &op);
          links[count] = {op, reg[head.a], 0};
        } else if (ChainableBinary(step.fn, &op); step.a == running && step.b == running) {
          links[count] = {static_cast<ChainOp>(op + 2), nullptr, 0};
          links[count].side = reg[head.a];  // read by no operation: any valid chunk
        } else if (step.a == running) {
          links[count] = {op, reg[step.b], mask_of(step.b)};
        } else {
          links[count] = {static_cast<ChainOp>(op + 1), reg[step.a], mask_of(step.a)};
        }
        links[count].tap = tap_of(i);
        ++count;
        running = TERN_PROGRAM_INPUTS + static_cast<int64_t>(i);
        last = i;
      }
      float* o = &storage[(TERN_PROGRAM_INPUTS + buffer_of_step[last]) * width];
      RunChainF32(reg[head.a], mask_of(head.a), links, count, o, m);
      reg[TERN_PROGRAM_INPUTS + last] = o;
      return last;
    };
    const uint8_t* repeated[TERN_PROGRAM_INPUTS] = {};  // see the inputs below
    ForEachRun(l, begin, end, [&](const int64_t* offsets, int64_t n) {
      for (int64_t done = 0; done < n; done += width) {
        const int64_t m = std::min(width, n - done);
        const float* reg[TERN_PROGRAM_INPUTS + TERN_PROGRAM_MAX_STEPS] = {};
        for (int i = 0; i < TERN_PROGRAM_INPUTS; ++i) {
          const int k = operand_of_slot[kFirstInput + i];
          if (k < 0) continue;
          const TensorView& view = ops[kFirstInput + i];
          const int64_t stride = l.strides[k][last];
          const uint8_t* p = At(view, offsets[k] + done * stride);
          if (view.desc->dtype == TERN_DTYPE_F32 && stride == 1) {
            reg[i] = reinterpret_cast<const float*>(p);
            continue;
          }
          float* buffer = &storage[static_cast<size_t>(i) * width];
          // A broadcast input (stride 0 along the run) is filled once per
          // value, as in Elementwise.
          if (stride == 0) {
            if (repeated[i] != p) {
              LoadF32(view.desc->dtype, p, 0, width, buffer);
              repeated[i] = p;
            }
          } else {
            LoadF32(view.desc->dtype, p, stride, m, buffer);
          }
          reg[i] = buffer;
        }
        for (size_t i = 0; i < steps.size(); ++i) {
          const ProgramStep& step = steps[i];
          if (chain_length[i] > 1) {
            i = RunChain(i, chain_length[i], m, reg);
            continue;
          }
          float* o = &storage[(TERN_PROGRAM_INPUTS + buffer_of_step[i]) * width];
          switch (step.kind) {
            case TERN_STEP_CONSTANT:
              break;  // filled when the part began
            case TERN_STEP_UNARY:
              UnaryF32(step.fn, step.params, o, reg[step.a], m);
              break;
            case TERN_STEP_BINARY: {
              const ProgramStep* a = constant_at(step.a);
              const ProgramStep* b = constant_at(step.b);
              if (b != nullptr && a == nullptr) {
                BinaryF32WithScalar(step.fn, o, reg[step.a], b->constant, m);
              } else if (a != nullptr && b == nullptr) {
                BinaryF32ScalarWith(step.fn, o, a->constant, reg[step.b], m);
              } else {
                BinaryF32(step.fn, o, reg[step.a], reg[step.b], m);
              }
              break;
            }
            default: {  // TERN_STEP_WHERE
              SelectF32(o, reg[step.a], reg[step.b], reg[step.c], m);
              break;
            }
          }
          reg[TERN_PROGRAM_INPUTS + i] = o;
        }
        // Outputs that store an input register read it before any output
        // is written (an output may be that input's memory).
        const float* source[TERN_PROGRAM_OUTPUTS] = {};
        for (int j = 0; j < TERN_PROGRAM_OUTPUTS; ++j) {
          if (operand_of_slot[j] < 0) continue;
          source[j] = reg[output_register[j]];
          if (output_register[j] < TERN_PROGRAM_INPUTS) {
            float* copy = &storage[(TERN_PROGRAM_INPUTS + step_buffers + j) * width];
            std::copy(source[j], source[j] + m, copy);
            source[j] = copy;
          }
        }
        for (int j = 0; j < TERN_PROGRAM_OUTPUTS; ++j) {
          const int k = operand_of_slot[j];
          if (k < 0) continue;
          const int64_t stride = l.strides[k][last];
          StoreF32(ops[j].desc->dtype, At(ops[j], offsets[k] + done * stride), stride, m,
                   source[j]);
        }
      }
    });
  });
  return OkStatus();
}

Status ApplyTensorEpilogue(const TensorView& out, const TensorView* residual, int64_t activation,
                           std::span<const double> parameters) {
  if (residual == nullptr && activation == TERN_ACTIVATION_NONE) return OkStatus();
  const UnaryParams p = ParamsOf(activation, parameters);
  const isa::OperandDesc& shape = *out.desc;
  if (residual == nullptr) {
    Elementwise<float>(
        shape, ArgOf(out), {ArgOf(out)},
        [&](float* o, const float* const* in, int64_t n) { UnaryF32(activation, p, o, in[0], n); });
    return OkStatus();
  }
  Elementwise<float>(shape, ArgOf(out), {ArgOf(out), ArgOf(*residual)},
                     [&](float* o, const float* const* in, int64_t n) {
                       BinaryF32(TERN_BINARY_ADD, o, in[0], in[1], n);
                       if (activation != TERN_ACTIVATION_NONE) UnaryF32(activation, p, o, o, n);
                     });
  return OkStatus();
}

// --- iota and random ----------------------------------------------------------

namespace {

// Writes generated values to `view`, the only operand (layout l), in
// row-major element order, kChunk elements at a time. Each thread's range
// calls make() once for a generator (a lambda that may keep state, such as
// random's current Philox block); gen(pos, m, fbuf, ibuf) fills elements
// [pos, pos + m) into ibuf when `integer`, else into fbuf, and they are
// stored through the dtype conversions. All templates: gen's per-element
// loop is inlined here as if written in place.
template <typename MakeGenerator>
void GenerateInto(const TensorView& view, const Layout& l, bool integer, MakeGenerator&& make) {
  const tern_dtype_t dtype = view.desc->dtype;
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(dtype));
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    auto gen = make();
    int64_t pos = begin;
    alignas(64) float fbuf[kChunk];
    alignas(64) int64_t ibuf[kChunk];
    ForEachRun(l, begin, end, [&](const int64_t* off, int64_t n) {
      const int64_t stride = l.strides[0][l.rank - 1];
      for (int64_t done = 0; done < n; done += kChunk) {
        const int64_t m = std::min(kChunk, n - done);
        uint8_t* p = view.data + (off[0] + done * stride) * esize;
        gen(pos, m, fbuf, ibuf);
        if (integer) {
          StoreI64(dtype, p, stride, m, ibuf);
        } else {
          StoreF32(dtype, p, stride, m, fbuf);
        }
        pos += m;
      }
    });
  });
}

}  // namespace

Status RunIota(const driver::Instruction& ins, Operands ops) {
  const isa::OperandDesc& out = *ops[0].desc;
  const int64_t rank = out.rank;
  const int64_t axis = rank == 0 ? 0 : (ins.ints[0] < 0 ? ins.ints[0] + rank : ins.ints[0]);
  const double start = ins.floats.size() > 0 ? ins.floats[0] : 0.0;
  const double step = ins.floats.size() > 1 ? ins.floats[1] : 1.0;
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < rank; ++d) inner *= out.shape[d];
  const int64_t size = rank == 0 ? 1 : out.shape[axis];
  const Layout l = MakeLayout(out.rank, out.shape.data(), {out.strides.data()});
  if (l.count == 0) return OkStatus();
  const bool integer = isa::IsInteger(out.dtype);
  const int64_t istart = integer ? static_cast<int64_t>(start) : 0;
  const int64_t istep = integer ? static_cast<int64_t>(step) : 0;
  GenerateInto(ops[0], l, integer, [&] {
    return [&](int64_t pos, int64_t m, float* fbuf, int64_t* ibuf) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t coord = ((pos + i) / inner) % size;
        if (integer) {
          ibuf[i] = WrapAdd(istart, WrapMul(coord, istep));
        } else {
          fbuf[i] = static_cast<float>(start + static_cast<double>(coord) * step);
        }
      }
    };
  });
  return OkStatus();
}

namespace {

// v rounded to `dtype` (a float dtype), as a float.
float RoundTo(tern_dtype_t dtype, float v) {
  switch (dtype) {
    case TERN_DTYPE_BF16:
      return num::Bf16ToF32(num::F32ToBf16(v));
    case TERN_DTYPE_F16:
      return num::F16ToF32(num::F32ToF16(v));
    default:
      return v;
  }
}

// The largest value of `dtype` below v (v representable in dtype).
float NextDown(tern_dtype_t dtype, float v) {
  if (dtype == TERN_DTYPE_F32) return std::nextafter(v, -INFINITY);
  uint16_t bits = dtype == TERN_DTYPE_BF16 ? num::F32ToBf16(v) : num::F32ToF16(v);
  if (v > 0.0f) {
    --bits;
  } else if (v == 0.0f) {
    bits = 0x8001;
  } else {
    ++bits;
  }
  return dtype == TERN_DTYPE_BF16 ? num::Bf16ToF32(bits) : num::F16ToF32(bits);
}

// Uniform f32 values in [a, b) from words: a + (b - a) * u in double,
// rounded to f32, and below_high where that rounds up to b. [0, 1) is u
// itself (exact either way), the pools' and torch.rand's case.
TERN_VECTOR_CLONES
void UniformWordsToF32(const uint32_t* w, int64_t m, double a, double b, float below_high,
                       float* out) {
  if (a == 0.0 && b == 1.0) {
    for (int64_t i = 0; i < m; ++i) out[i] = num::Uniform01(w[i]);
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    const float v = static_cast<float>(a + (b - a) * static_cast<double>(num::Uniform01(w[i])));
    out[i] = static_cast<double>(v) >= b ? below_high : v;
  }
}

// 1 where the word's uniform value is below p, else 0.
TERN_VECTOR_CLONES
void BernoulliWords(const uint32_t* w, int64_t m, double p, float* out) {
  for (int64_t i = 0; i < m; ++i)
    out[i] = static_cast<double>(num::Uniform01(w[i])) < p ? 1.0f : 0.0f;
}

}  // namespace

Status RunRandom(const driver::Instruction& ins, Operands ops) {
  const isa::OperandDesc& out = *ops[0].desc;
  const int64_t fn = ins.ints[0];
  const uint64_t seed = static_cast<uint64_t>(ins.ints[1]);
  const uint64_t offset = static_cast<uint64_t>(ins.ints[2]);
  const auto& f = ins.floats;
  const Layout l = MakeLayout(out.rank, out.shape.data(), {out.strides.data()});
  if (l.count == 0) return OkStatus();
  const bool integer = isa::IsInteger(out.dtype) && fn == TERN_RANDOM_UNIFORM;
  double a = 0, b = 1;  // uniform [low, high), normal (mean, std), bernoulli p
  if (fn == TERN_RANDOM_BERNOULLI) {
    a = f.empty() ? 0.5 : f[0];
  } else {
    a = f.size() > 0 ? f[0] : 0.0;
    b = f.size() > 1 ? f[1] : 1.0;
  }
  // Uniform: the largest value of the dtype below high, for results that
  // round up to high.
  float below_high = 0;
  if (fn == TERN_RANDOM_UNIFORM && !integer) {
    float h = RoundTo(out.dtype, static_cast<float>(b));
    while (h >= b) h = NextDown(out.dtype, h);
    below_high = std::max(h, RoundTo(out.dtype, static_cast<float>(a)));
  }
  const bool f32 = out.dtype == TERN_DTYPE_F32;
  GenerateInto(ops[0], l, integer, [&] {
    return [&](int64_t pos, int64_t m, float* fbuf, int64_t* ibuf) {
      // The words of every block the elements [pos, pos + m) fall in;
      // element e is word e % 4 of block e / 4.
      const uint64_t first = static_cast<uint64_t>(pos) / 4;
      const int64_t blocks =
          static_cast<int64_t>((static_cast<uint64_t>(pos + m - 1)) / 4 - first) + 1;
      alignas(64) uint32_t words[kChunk + 8];
      PhiloxBlocks(seed, offset, first, blocks, words);
      const uint32_t* w = words + (static_cast<uint64_t>(pos) - 4 * first);
      switch (fn) {
        case TERN_RANDOM_UNIFORM:
          if (integer) {
            const uint64_t range = static_cast<uint64_t>(b - a);
            const int64_t base = static_cast<int64_t>(a);
            for (int64_t i = 0; i < m; ++i) {
              ibuf[i] = base + static_cast<int64_t>((static_cast<uint64_t>(w[i]) * range) >> 32);
            }
          } else {
            UniformWordsToF32(w, m, a, b, below_high, fbuf);
            // In a narrower dtype a value below b may round up to it.
            if (!f32) {
              for (int64_t i = 0; i < m; ++i) {
                const float v = RoundTo(out.dtype, fbuf[i]);
                fbuf[i] = v >= b ? below_high : v;
              }
            }
          }
          break;
        case TERN_RANDOM_NORMAL:
          for (int64_t i = 0; i < m; ++i) {
            // Box-Muller on the word pair (0,1) or (2,3) of the element's block.
            const int64_t k = (pos + i) - static_cast<int64_t>(4 * first);
            const uint32_t* pair = words + (k & ~int64_t{1});
            const double u1 = (static_cast<double>(pair[0] >> 8) + 1.0) * 0x1.0p-24;
            const double u2 = static_cast<double>(pair[1] >> 8) * 0x1.0p-24;
            const double r = std::sqrt(-2.0 * std::log(u1));
            const double angle = 6.283185307179586477 * u2;
            const double z = (k & 1) ? r * std::sin(angle) : r * std::cos(angle);
            fbuf[i] = static_cast<float>(a + b * z);
          }
          break;
        default:
          BernoulliWords(w, m, a, fbuf);
          break;
      }
    };
  });
  return OkStatus();
}

}  // namespace tern::sim::kernels
