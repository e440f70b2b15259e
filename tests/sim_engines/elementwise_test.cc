// Elementwise opcodes against naive double references: copy, cast, fill,
// binary (every function), where, unary and unary_backward (every function),
// iota. Each across dtypes, broadcasting (stride 0), transposed and spaced
// layouts, empty, odd and rank-0 shapes, and sizes that take the threaded
// path.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>

#include "driver_shim/sim/engines/kernels_internal.h"
#include "kernel_test_util.h"

namespace tern::testing {
namespace {

// The layouts every elementwise test walks: inputs contiguous, one input
// broadcast along dim 0 (stride 0), an input transposed, the output spaced.
enum class Layout { kContiguous, kBroadcast, kTransposed, kSpacedOut };
constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kBroadcast, Layout::kTransposed,
                               Layout::kSpacedOut};

const std::vector<Shape> kShapes = {{17, 33}, {3, 1, 5}, {0, 4}, {}, {1000}};

Tensor MakeInput(tern_dtype_t dtype, const Shape& shape, Layout layout, bool broadcast_this,
                 bool transpose_this) {
  if (layout == Layout::kBroadcast && broadcast_this && !shape.empty()) {
    std::vector<bool> b(shape.size(), false);
    b[0] = true;
    return Tensor::Broadcast(dtype, shape, b);
  }
  if (layout == Layout::kTransposed && transpose_this && shape.size() >= 2) {
    std::vector<int> order(shape.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
    return Tensor::Permuted(dtype, shape, order);
  }
  return Tensor(dtype, shape);
}

Tensor MakeOutput(tern_dtype_t dtype, const Shape& shape, Layout layout) {
  Tensor t = layout == Layout::kSpacedOut ? Tensor::Spaced(dtype, shape) : Tensor(dtype, shape);
  t.Poison();
  return t;
}

int64_t Wrap(tern_dtype_t dtype, int64_t v) {
  switch (dtype) {
    case TERN_DTYPE_I8:
      return static_cast<int8_t>(v);
    case TERN_DTYPE_I32:
      return static_cast<int32_t>(v);
    case TERN_DTYPE_BOOL:
      return v != 0;
    default:
      return v;
  }
}

// ----------------------------------------------------------------------------
// copy / cast / fill

TEST(CopyTest, AllDtypesAndLayouts) {
  std::mt19937_64 rng(1);
  for (tern_dtype_t dt : kAllDtypes) {
    for (const Shape& shape : kShapes) {
      for (Layout layout : kLayouts) {
        Tensor src = MakeInput(dt, shape, layout, true, true);
        src.Randomize(rng, -100, 100);
        Tensor dst = MakeOutput(dt, shape, layout);
        ASSERT_TRUE(Exec(TERN_OP_COPY, {&dst, &src}).ok());
        for (int64_t i = 0; i < dst.count(); ++i) ASSERT_EQ(dst.Bits(i), src.Bits(i)) << i;
        if (layout == Layout::kSpacedOut && dst.count() > 0) {
          // The gaps between spaced elements are untouched.
          EXPECT_EQ(dst.data()[isa::DTypeSize(dt)], 0xAB);
        }
      }
    }
  }
}

TEST(CopyTest, PermuteRank4AndParallelSize) {
  std::mt19937_64 rng(2);
  Tensor src = Tensor::Permuted(TERN_DTYPE_BF16, {4, 5, 6, 7}, {2, 0, 3, 1});
  src.Randomize(rng);
  Tensor dst(TERN_DTYPE_BF16, {4, 5, 6, 7});
  ASSERT_TRUE(Exec(TERN_OP_COPY, {&dst, &src}).ok());
  EXPECT_TRUE(Equal(dst, src.Values()));
  Tensor big = Tensor::Permuted(TERN_DTYPE_F32, {300, 400}, {1, 0});
  big.Randomize(rng);
  Tensor out(TERN_DTYPE_F32, {300, 400});
  ASSERT_TRUE(Exec(TERN_OP_COPY, {&out, &big}).ok());
  EXPECT_TRUE(Equal(out, big.Values()));
}

// Gathers of short contiguous runs (an attention head's 16 or 64 elements
// from a permuted tensor) are copied row by row inline: every element size,
// runs of 16 and 64, and a size that takes the threaded path.
TEST(CopyTest, ShortContiguousRunsEveryElementSize) {
  std::mt19937_64 rng(3);
  for (tern_dtype_t dt : {TERN_DTYPE_BOOL, TERN_DTYPE_BF16, TERN_DTYPE_F32, TERN_DTYPE_I64}) {
    for (const Shape& shape : {Shape{8, 4, 32, 16}, Shape{3, 32, 8, 64}, Shape{64, 8, 16, 16}}) {
      Tensor src = Tensor::Permuted(dt, shape, {2, 0, 1, 3});
      src.Randomize(rng, -100, 100);
      Tensor dst(dt, shape);
      dst.Poison();
      ASSERT_TRUE(Exec(TERN_OP_COPY, {&dst, &src}).ok());
      for (int64_t i = 0; i < dst.count(); ++i) {
        ASSERT_EQ(dst.Bits(i), src.Bits(i))
            << isa::DTypeName(dt) << " " << ShapeStr(shape) << " " << i;
      }
    }
  }
}

// Transposing copies run in tiles through a buffer (RunCopy): every element
// size, both directions (reading across the source's rows into a contiguous
// destination, and writing across the destination's), sizes that are not a
// multiple of the tile, a batch dimension outside the transposed pair, and
// copies too small for tiles, all bit-exact.
TEST(CopyTest, TransposesInTilesEveryElementSizeBothDirections) {
  std::mt19937_64 rng(5);
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {{{37, 45}, {1, 0}},
                                                                 {{16, 16}, {1, 0}},
                                                                 {{65, 17}, {1, 0}},
                                                                 {{3, 33, 50}, {0, 2, 1}},
                                                                 {{33, 3, 50}, {2, 1, 0}},
                                                                 {{5, 40}, {1, 0}},
                                                                 {{2, 3, 20, 18}, {1, 3, 0, 2}}};
  for (tern_dtype_t dt : {TERN_DTYPE_I8, TERN_DTYPE_BF16, TERN_DTYPE_F32, TERN_DTYPE_F64}) {
    for (const auto& [shape, order] : cases) {
      SCOPED_TRACE(fmt::format("{} {} order {}", isa::DTypeName(dt), fmt::join(shape, "x"),
                               fmt::join(order, ",")));
      // Reading across: a permuted source into a contiguous destination.
      Tensor src = Tensor::Permuted(dt, shape, order);
      src.Randomize(rng, -100, 100);
      Tensor dst(dt, shape);
      ASSERT_TRUE(Exec(TERN_OP_COPY, {&dst, &src}).ok());
      for (int64_t i = 0; i < dst.count(); ++i) ASSERT_EQ(dst.Bits(i), src.Bits(i)) << i;
      // Writing across: a contiguous source into a permuted destination.
      Tensor back = Tensor::Permuted(dt, shape, order);
      ASSERT_TRUE(Exec(TERN_OP_COPY, {&back, &dst}).ok());
      for (int64_t i = 0; i < back.count(); ++i) ASSERT_EQ(back.Bits(i), dst.Bits(i)) << i;
    }
  }
}

// The documented conversion rules, computed independently: to a float
// dtype (as double) ...
double RefCastFloat(tern_dtype_t from, tern_dtype_t to, const Tensor& src, int64_t i) {
  double v =
      isa::IsFloat(from) ? src.Get(i) : static_cast<double>(static_cast<float>(src.GetInt(i)));
  return RoundToDtype(to, v);
}

// ... and to an integer or bool dtype.
int64_t RefCastInt(tern_dtype_t from, tern_dtype_t to, const Tensor& src, int64_t i) {
  if (!isa::IsFloat(from))
    return to == TERN_DTYPE_BOOL ? src.GetInt(i) != 0 : Wrap(to, src.GetInt(i));
  const double v = src.Get(i);
  if (to == TERN_DTYPE_BOOL) return v != 0.0 || std::isnan(v);
  if (std::isnan(v)) return 0;
  const int bits = to == TERN_DTYPE_I8 ? 8 : to == TERN_DTYPE_I32 ? 32 : 64;
  const double limit = std::ldexp(1.0, bits - 1);
  if (v >= limit)
    return bits == 64 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(limit) - 1;
  if (v <= -limit)
    return bits == 64 ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(limit);
  return static_cast<int64_t>(std::trunc(v));
}

TEST(CastTest, EveryPairWithSpecialValues) {
  const std::vector<double> float_values = {0.0,      -0.0,      1.5,   -1.5, 2.5,   -2.7,   127.9,
                                            128.0,    -129.0,    300.0, 1e10, -1e10, 65504,  1e-8,
                                            INFINITY, -INFINITY, NAN,   0.1,  3.0e9, -3.0e9, 1e20};
  const std::vector<int64_t> int_values = {0,
                                           1,
                                           -1,
                                           127,
                                           -128,
                                           255,
                                           1000,
                                           -70000,
                                           2147483647,
                                           -2147483648LL,
                                           1LL << 40,
                                           16777217,
                                           (1LL << 53) + 1,
                                           std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max()};
  for (tern_dtype_t from : kAllDtypes) {
    for (tern_dtype_t to : kAllDtypes) {
      const bool ff = isa::IsFloat(from);
      const int64_t n = static_cast<int64_t>(ff ? float_values.size() : int_values.size());
      Tensor src(from, {n});
      for (int64_t i = 0; i < n; ++i) {
        if (ff) {
          src.Set(i, float_values[i]);
        } else {
          src.SetInt(i, Wrap(from, int_values[i]));
        }
      }
      Tensor dst = Tensor::Spaced(to, {n});
      ASSERT_TRUE(Exec(TERN_OP_CAST, {&dst, &src}).ok());
      for (int64_t i = 0; i < n; ++i) {
        if (!isa::IsFloat(to)) {
          EXPECT_EQ(dst.GetInt(i), RefCastInt(from, to, src, i))
              << isa::DTypeName(from) << "->" << isa::DTypeName(to) << " of " << src.Get(i);
          continue;
        }
        const double expect = RefCastFloat(from, to, src, i), got = dst.Get(i);
        if (std::isnan(expect)) {
          EXPECT_TRUE(std::isnan(got))
              << isa::DTypeName(from) << "->" << isa::DTypeName(to) << " at " << i;
        } else {
          EXPECT_EQ(got, expect) << isa::DTypeName(from) << "->" << isa::DTypeName(to) << " of "
                                 << src.Get(i);
        }
      }
    }
  }
  // int64 -> int64 stays exact beyond 2^53.
  Tensor a(TERN_DTYPE_I64, {1}), b(TERN_DTYPE_I32, {1});
  a.SetInt(0, (1LL << 53) + 1);
  ASSERT_TRUE(Exec(TERN_OP_CAST, {&b, &a}).ok());
  EXPECT_EQ(b.GetInt(0), 1);  // wraps: low 32 bits
}

TEST(CastTest, LargeBroadcastAndTransposed) {
  std::mt19937_64 rng(3);
  Tensor src = Tensor::Permuted(TERN_DTYPE_F32, {256, 300}, {1, 0});
  src.Randomize(rng, -1000, 1000);
  Tensor dst(TERN_DTYPE_BF16, {256, 300});
  ASSERT_TRUE(Exec(TERN_OP_CAST, {&dst, &src}).ok());
  std::vector<double> ref(dst.count());
  for (int64_t i = 0; i < dst.count(); ++i) ref[i] = RoundToDtype(TERN_DTYPE_BF16, src.Get(i));
  EXPECT_TRUE(Equal(dst, ref));
  Tensor bsrc = Tensor::Broadcast(TERN_DTYPE_I32, {7, 9}, {true, false});
  bsrc.Randomize(rng, -50, 50);
  Tensor bdst(TERN_DTYPE_F16, {7, 9});
  ASSERT_TRUE(Exec(TERN_OP_CAST, {&bdst, &bsrc}).ok());
  EXPECT_TRUE(Equal(bdst, bsrc.Values()));
}

TEST(FillTest, AllDtypes) {
  for (tern_dtype_t dt : kAllDtypes) {
    for (const Shape& shape : kShapes) {
      Tensor t = Tensor::Spaced(dt, shape);
      t.Poison();
      Status st = isa::IsFloat(dt) ? Exec(TERN_OP_FILL, {&t}, {}, {-2.5})
                                   : Exec(TERN_OP_FILL, {&t}, {dt == TERN_DTYPE_BOOL ? 1 : -7});
      ASSERT_TRUE(st.ok()) << st.message();
      const double v = isa::IsFloat(dt) ? -2.5 : dt == TERN_DTYPE_BOOL ? 1 : -7;
      EXPECT_TRUE(Equal(t, std::vector<double>(t.count(), v))) << isa::DTypeName(dt);
      if (t.count() > 0) {
        EXPECT_EQ(t.data()[isa::DTypeSize(dt)], 0xAB);
      }
    }
  }
  Tensor f(TERN_DTYPE_F16, {3});
  ASSERT_TRUE(Exec(TERN_OP_FILL, {&f}, {}, {1e6}).ok());  // overflows f16: Inf
  EXPECT_EQ(f.Get(0), INFINITY);
  Tensor big(TERN_DTYPE_I64, {100000});
  ASSERT_TRUE(Exec(TERN_OP_FILL, {&big}, {std::numeric_limits<int64_t>::min()}).ok());
  EXPECT_EQ(big.GetInt(99999), std::numeric_limits<int64_t>::min());
}

// ----------------------------------------------------------------------------
// binary

bool IsComparison(int fn) { return fn >= TERN_BINARY_EQ && fn <= TERN_BINARY_LOGICAL_XOR; }

double RefFloorDiv(double a, double b) {
  if (b == 0) return a / b;
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  if (div == 0) return std::copysign(0.0, a / b);
  double fl = std::floor(div);
  if (div - fl > 0.5) fl += 1;
  return fl;
}

double RefBinaryF(int fn, double a, double b) {
  switch (fn) {
    case TERN_BINARY_ADD:
      return a + b;
    case TERN_BINARY_SUB:
      return a - b;
    case TERN_BINARY_MUL:
      return a * b;
    case TERN_BINARY_DIV:
      return a / b;
    case TERN_BINARY_POW:
      return std::pow(a, b);
    case TERN_BINARY_MAX:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case TERN_BINARY_MIN:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case TERN_BINARY_EQ:
      return a == b;
    case TERN_BINARY_NE:
      return a != b;
    case TERN_BINARY_LT:
      return a < b;
    case TERN_BINARY_LE:
      return a <= b;
    case TERN_BINARY_GT:
      return a > b;
    case TERN_BINARY_GE:
      return a >= b;
    case TERN_BINARY_LOGICAL_AND:
      return a != 0 && b != 0;
    case TERN_BINARY_LOGICAL_OR:
      return a != 0 || b != 0;
    case TERN_BINARY_LOGICAL_XOR:
      return (a != 0) != (b != 0);
    case TERN_BINARY_REMAINDER:
      return a - b * std::floor(a / b);
    case TERN_BINARY_FMOD:
      return std::fmod(a, b);
    case TERN_BINARY_ATAN2:
      return std::atan2(a, b);
    case TERN_BINARY_FLOOR_DIVIDE:
      return RefFloorDiv(a, b);
    case TERN_BINARY_COPYSIGN:
      return std::copysign(a, b);
    default:
      return NAN;
  }
}

int64_t RefBinaryI(int fn, int64_t a, int64_t b) {
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  switch (fn) {
    case TERN_BINARY_ADD:
      return static_cast<int64_t>(u(a) + u(b));
    case TERN_BINARY_SUB:
      return static_cast<int64_t>(u(a) - u(b));
    case TERN_BINARY_MUL:
      return static_cast<int64_t>(u(a) * u(b));
    case TERN_BINARY_POW: {
      if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
      uint64_t r = 1;
      for (int64_t i = 0; i < b; ++i) r *= u(a);
      return static_cast<int64_t>(r);
    }
    case TERN_BINARY_MAX:
      return std::max(a, b);
    case TERN_BINARY_MIN:
      return std::min(a, b);
    case TERN_BINARY_EQ:
      return a == b;
    case TERN_BINARY_NE:
      return a != b;
    case TERN_BINARY_LT:
      return a < b;
    case TERN_BINARY_LE:
      return a <= b;
    case TERN_BINARY_GT:
      return a > b;
    case TERN_BINARY_GE:
      return a >= b;
    case TERN_BINARY_LOGICAL_AND:
      return a != 0 && b != 0;
    case TERN_BINARY_LOGICAL_OR:
      return a != 0 || b != 0;
    case TERN_BINARY_LOGICAL_XOR:
      return (a != 0) != (b != 0);
    case TERN_BINARY_REMAINDER: {
      int64_t r = a % b;
      return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
    }
    case TERN_BINARY_FMOD:
      return a % b;
    case TERN_BINARY_FLOOR_DIVIDE: {
      // floor(a / b) by exact rational comparison.
      int64_t q = a / b;
      if (q * b != a && ((a < 0) != (b < 0))) --q;
      return q;
    }
    case TERN_BINARY_BITWISE_AND:
      return a & b;
    case TERN_BINARY_BITWISE_OR:
      return a | b;
    case TERN_BINARY_BITWISE_XOR:
      return a ^ b;
    default:
      return 0;
  }
}

bool BinaryTakes(int fn, tern_dtype_t dt) {
  const bool fl = isa::IsFloat(dt), bo = dt == TERN_DTYPE_BOOL;
  switch (fn) {
    case TERN_BINARY_DIV:
    case TERN_BINARY_ATAN2:
    case TERN_BINARY_COPYSIGN:
      return fl;
    case TERN_BINARY_BITWISE_AND:
    case TERN_BINARY_BITWISE_OR:
    case TERN_BINARY_BITWISE_XOR:
      return !fl;
    case TERN_BINARY_ADD:
    case TERN_BINARY_SUB:
    case TERN_BINARY_MUL:
    case TERN_BINARY_POW:
    case TERN_BINARY_REMAINDER:
    case TERN_BINARY_FMOD:
    case TERN_BINARY_FLOOR_DIVIDE:
      return !bo;
    default:
      return true;
  }
}

// Operand values suited to each function: positive bases for pow, divisors
// away from 0, small integers.
void FillBinaryInputs(int fn, Tensor& a, Tensor& b, std::mt19937_64& rng) {
  const bool fl = isa::IsFloat(a.dtype());
  if (fn == TERN_BINARY_POW) {
    if (fl) {
      a.Randomize(rng, 0.25, 3.0);
      b.Randomize(rng, -2.0, 2.0);
    } else {
      a.Randomize(rng, -3, 3);
      b.Randomize(rng, -1, 4);
    }
    return;
  }
  a.Randomize(rng, fl ? -3.0 : -20, fl ? 3.0 : 20);
  b.Randomize(rng, fl ? -3.0 : -20, fl ? 3.0 : 20);
  const bool divides = fn == TERN_BINARY_DIV || fn == TERN_BINARY_REMAINDER ||
                       fn == TERN_BINARY_FMOD || fn == TERN_BINARY_FLOOR_DIVIDE;
  if (divides) {
    for (int64_t i = 0; i < b.count(); ++i) {
      if (fl && std::fabs(b.Get(i)) < 0.5) b.Set(i, b.Get(i) < 0 ? -0.75 : 0.75);
      if (!fl && b.GetInt(i) == 0) b.SetInt(i, 3);
    }
  }
  if (IsComparison(fn) && a.count() > 2) {
    // Some equal pairs so that ==, <= and >= see ties.
    for (int64_t i = 0; i < a.count(); i += 3) b.Set(i, a.Get(i));
  }
}

TEST(BinaryTest, EveryFunctionDtypeAndLayout) {
  std::mt19937_64 rng(4);
  for (int fn = 0; fn < TERN_BINARY_COUNT; ++fn) {
    for (tern_dtype_t dt : kAllDtypes) {
      if (!BinaryTakes(fn, dt)) continue;
      const tern_dtype_t odt = IsComparison(fn) ? TERN_DTYPE_BOOL : dt;
      for (const Shape& shape : kShapes) {
        for (Layout layout : kLayouts) {
          Tensor a = MakeInput(dt, shape, layout, false, true);
          Tensor b = MakeInput(dt, shape, layout, true, false);
          FillBinaryInputs(fn, a, b, rng);
          Tensor out = MakeOutput(odt, shape, layout);
          Status st = Exec(TERN_OP_BINARY, {&out, &a, &b}, {fn});
          ASSERT_TRUE(st.ok()) << st.message();
          std::vector<double> ref(out.count());
          for (int64_t i = 0; i < out.count(); ++i) {
            if (isa::IsFloat(dt)) {
              ref[i] = RoundToDtype(odt, RefBinaryF(fn, a.Get(i), b.Get(i)));
            } else {
              ref[i] = static_cast<double>(Wrap(odt, RefBinaryI(fn, a.GetInt(i), b.GetInt(i))));
            }
          }
          const bool exact = !isa::IsFloat(odt) || fn == TERN_BINARY_MAX || fn == TERN_BINARY_MIN ||
                             fn == TERN_BINARY_COPYSIGN || fn == TERN_BINARY_FLOOR_DIVIDE;
          ::testing::AssertionResult r =
              exact ? Equal(out, ref) : Near(out, ref, TolFor(odt, fn == TERN_BINARY_POW ? 4 : 1));
          ASSERT_TRUE(r) << "binary " << isa::BinaryFnName(fn) << " " << isa::DTypeName(dt) << " "
                         << ShapeStr(shape) << " layout " << static_cast<int>(layout);
        }
      }
    }
  }
}

TEST(BinaryTest, SpecialValues) {
  Tensor a(TERN_DTYPE_F32, {6}), b(TERN_DTYPE_F32, {6}), out(TERN_DTYPE_F32, {6});
  a.SetAll({NAN, 1.0, 1.0, -1.0, 0.0, INFINITY});
  b.SetAll({1.0, NAN, 0.0, 0.0, 0.0, 2.0});
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &b}, {TERN_BINARY_MAX}).ok());
  EXPECT_TRUE(std::isnan(out.Get(0)) && std::isnan(out.Get(1)));  // NaN propagates
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &b}, {TERN_BINARY_DIV}).ok());
  EXPECT_EQ(out.Get(2), INFINITY);
  EXPECT_EQ(out.Get(3), -INFINITY);
  EXPECT_TRUE(std::isnan(out.Get(4)));
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &b}, {TERN_BINARY_FLOOR_DIVIDE}).ok());
  EXPECT_EQ(out.Get(2), INFINITY);  // as a / b for b == 0
  Tensor c(TERN_DTYPE_BOOL, {6});
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&c, &a, &a}, {TERN_BINARY_EQ}).ok());
  EXPECT_EQ(c.GetInt(0), 0);  // NaN != NaN
  EXPECT_EQ(c.GetInt(1), 1);
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&c, &a, &b}, {TERN_BINARY_LOGICAL_AND}).ok());
  EXPECT_EQ(c.GetInt(0), 1);  // NaN is true
  // Python-style remainder and floor division on negative operands.
  Tensor x(TERN_DTYPE_I32, {4}), y(TERN_DTYPE_I32, {4}), z(TERN_DTYPE_I32, {4});
  for (int i = 0; i < 4; ++i) {
    x.SetInt(i, i % 2 ? -7 : 7);
    y.SetInt(i, i < 2 ? 2 : -2);
  }
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&z, &x, &y}, {TERN_BINARY_REMAINDER}).ok());
  EXPECT_TRUE(Equal(z, {1, 1, -1, -1}));
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&z, &x, &y}, {TERN_BINARY_FLOOR_DIVIDE}).ok());
  EXPECT_TRUE(Equal(z, {3, -4, -4, 3}));
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&z, &x, &y}, {TERN_BINARY_FMOD}).ok());
  EXPECT_TRUE(Equal(z, {1, -1, 1, -1}));
  // i8 wraps.
  Tensor p(TERN_DTYPE_I8, {2}), q(TERN_DTYPE_I8, {2}), r(TERN_DTYPE_I8, {2});
  p.SetAll({127, -128});
  q.SetAll({1, -1});
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&r, &p, &q}, {TERN_BINARY_ADD}).ok());
  EXPECT_TRUE(Equal(r, {-128, 127}));
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&r, &p, &q}, {TERN_BINARY_FLOOR_DIVIDE}).ok());
  EXPECT_TRUE(Equal(r, {127, -128}));  // -128 / -1 wraps
}

TEST(BinaryTest, IntegerDivisionByZeroFailsWithThePosition) {
  Tensor a(TERN_DTYPE_I64, {2, 3}), b(TERN_DTYPE_I64, {2, 3}), out(TERN_DTYPE_I64, {2, 3});
  a.SetAll({1, 2, 3, 4, 5, 6});
  b.SetAll({1, 1, 1, 1, 0, 1});
  for (int fn : {TERN_BINARY_FLOOR_DIVIDE, TERN_BINARY_REMAINDER, TERN_BINARY_FMOD}) {
    Status st = Exec(TERN_OP_BINARY, {&out, &a, &b}, {fn});
    EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
    EXPECT_NE(st.message().find("integer division by zero"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("[1, 1]"), std::string::npos) << st.message();
  }
}

TEST(BinaryTest, LargeTensorsTakeTheThreadedPath) {
  std::mt19937_64 rng(5);
  for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_I32}) {
    Tensor a(dt, {300, 1001}), b = Tensor::Broadcast(dt, {300, 1001}, {true, false}),
                               out(dt, {300, 1001});
    a.Randomize(rng, -100, 100);
    b.Randomize(rng, -100, 100);
    ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &b}, {TERN_BINARY_MUL}).ok());
    std::vector<double> ref(out.count());
    for (int64_t i = 0; i < out.count(); ++i) ref[i] = RoundToDtype(dt, a.Get(i) * b.Get(i));
    EXPECT_TRUE(Near(out, ref, TolFor(dt)));
  }
  // In place: out aliases a.
  Tensor a(TERN_DTYPE_F32, {100000}), b(TERN_DTYPE_F32, {100000});
  a.Randomize(rng);
  b.Randomize(rng);
  std::vector<double> ref(a.count());
  for (int64_t i = 0; i < a.count(); ++i) ref[i] = static_cast<float>(a.Get(i) + b.Get(i));
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&a, &a, &b}, {TERN_BINARY_ADD}).ok());
  EXPECT_TRUE(Equal(a, ref));
}

// A like-permuted output and input (`q.transpose(1, 2) * s` in attention)
// are walked in memory order: one contiguous run. Walked in logical order
// every element was a new cache line (57 us against PyTorch's 6 for a
// [8, 4, 16, 32] tensor).
TEST(LayoutTest, LikePermutedOperandsAreWalkedInMemoryOrder) {
  using sim::kernels::Layout;
  const int64_t shape[] = {8, 4, 16, 32};
  const int64_t permuted[] = {64, 16, 1, 512};
  const Layout logical = sim::kernels::MakeLayout(4, shape, {permuted, permuted});
  EXPECT_EQ(logical.strides[0][logical.rank - 1], 512);
  const Layout l = sim::kernels::MakeLayoutInMemoryOrder(
      4, shape, std::span<const int64_t* const>(std::array{permuted, permuted}));
  EXPECT_EQ(l.rank, 1);
  EXPECT_EQ(l.count, 8 * 4 * 16 * 32);
  EXPECT_EQ(l.strides[0][0], 1);
  EXPECT_EQ(l.strides[1][0], 1);
  // The output's order decides; an input broadcast along a dimension does
  // not, and another input's strides only break ties.
  const int64_t out_shape[] = {3, 5};
  const int64_t column_major[] = {1, 3};
  const int64_t broadcast[] = {0, 1};
  const Layout o = sim::kernels::MakeLayoutInMemoryOrder(
      2, out_shape, std::span<const int64_t* const>(std::array{column_major, broadcast}));
  ASSERT_EQ(o.rank, 2);
  EXPECT_EQ(o.shape[1], 3);  // logical dim 0 is innermost
  EXPECT_EQ(o.strides[0][1], 1);
  EXPECT_EQ(o.strides[1][1], 0);
  // Nothing decides (a stride 0 beside the other): the logical order stays.
  const int64_t repeated_rows[] = {5, 0};
  const Layout z = sim::kernels::MakeLayoutInMemoryOrder(
      2, out_shape, std::span<const int64_t* const>(std::array{repeated_rows}));
  ASSERT_EQ(z.rank, 2);
  EXPECT_EQ(z.shape[1], 5);
  EXPECT_EQ(z.strides[0][1], 0);
}

TEST(LayoutTest, OperationsOnPermutedOperandsGiveLogicalResults) {
  std::mt19937_64 rng(9);
  const Shape shape = {3, 4, 5, 6};
  const std::vector<int> order = {0, 2, 3, 1};  // dim 1 innermost in memory
  Tensor a = Tensor::Permuted(TERN_DTYPE_F32, shape, order);
  Tensor b(TERN_DTYPE_F32, shape);  // contiguous: a different order
  Tensor out = Tensor::Permuted(TERN_DTYPE_F32, shape, order);
  a.Randomize(rng);
  b.Randomize(rng);
  out.Poison();
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &b}, {TERN_BINARY_SUB}).ok());
  std::vector<double> ref(out.count());
  for (int64_t i = 0; i < out.count(); ++i) ref[i] = static_cast<float>(a.Get(i) - b.Get(i));
  EXPECT_TRUE(Equal(out, ref));
  // A broadcast input beside them, and an output in the other order.
  Tensor row = Tensor::Broadcast(TERN_DTYPE_F32, shape, {true, false, true, false});
  row.Randomize(rng);
  Tensor out2(TERN_DTYPE_F32, shape);
  out2.Poison();
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out2, &a, &row}, {TERN_BINARY_MUL}).ok());
  for (int64_t i = 0; i < out2.count(); ++i) ref[i] = static_cast<float>(a.Get(i) * row.Get(i));
  EXPECT_TRUE(Equal(out2, ref));
  // A unary function and a fill through the same walk.
  out.Poison();
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &a}, {TERN_UNARY_NEG}).ok());
  for (int64_t i = 0; i < out.count(); ++i) ref[i] = -a.Get(i);
  EXPECT_TRUE(Equal(out, ref));
  out.Poison();
  ASSERT_TRUE(Exec(TERN_OP_FILL, {&out}, {}, {1.5}).ok());
  EXPECT_TRUE(Equal(out, std::vector<double>(out.count(), 1.5)));
}

// An input broadcast along the innermost dimension (a per-row value, stride
// 0 along runs longer than a chunk) is loaded once per value: every row must
// still see its own value, in every domain and on the threaded path.
TEST(BinaryTest, ValuesBroadcastAlongTheRunChangeWithTheRow) {
  std::mt19937_64 rng(21);
  for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F64, TERN_DTYPE_I32}) {
    for (const Shape& shape : {Shape{5, 3000}, Shape{40, 1500}}) {
      Tensor a(dt, shape), out(dt, shape);
      Tensor row = Tensor::Broadcast(dt, shape, {false, true});
      a.Randomize(rng, -100, 100);
      row.Randomize(rng, -100, 100);
      out.Poison();
      ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &row}, {TERN_BINARY_SUB}).ok());
      std::vector<double> ref(out.count());
      for (int64_t i = 0; i < out.count(); ++i) {
        ref[i] = isa::IsFloat(dt) ? RoundToDtype(dt, a.Get(i) - row.Get(i))
                                  : static_cast<double>(Wrap(dt, a.GetInt(i) - row.GetInt(i)));
      }
      ASSERT_TRUE(Near(out, ref, TolFor(dt))) << isa::DTypeName(dt) << " " << ShapeStr(shape);
    }
  }
}

// ----------------------------------------------------------------------------
// where

TEST(WhereTest, DtypesAndBroadcast) {
  std::mt19937_64 rng(6);
  for (tern_dtype_t dt : kAllDtypes) {
    for (const Shape& shape : kShapes) {
      for (Layout layout : kLayouts) {
        Tensor cond = MakeInput(TERN_DTYPE_BOOL, shape, layout, true, false);
        Tensor a = MakeInput(dt, shape, layout, false, true);
        Tensor b = MakeInput(dt, shape, layout, false, false);
        cond.Randomize(rng);
        a.Randomize(rng, -9, 9);
        b.Randomize(rng, -9, 9);
        Tensor out = MakeOutput(dt, shape, layout);
        ASSERT_TRUE(Exec(TERN_OP_WHERE, {&out, &cond, &a, &b}).ok());
        std::vector<double> ref(out.count());
        for (int64_t i = 0; i < out.count(); ++i) ref[i] = cond.GetInt(i) ? a.Get(i) : b.Get(i);
        ASSERT_TRUE(Equal(out, ref)) << isa::DTypeName(dt) << " " << ShapeStr(shape);
      }
    }
  }
}

// ----------------------------------------------------------------------------
// unary

struct UnaryCase {
  int fn;
  double lo, hi;               // input range
  std::vector<double> params;  // floats
};

const std::vector<UnaryCase>& UnaryCases() {
  static const std::vector<UnaryCase> cases = {
      {TERN_UNARY_NEG, -4, 4, {}},
      {TERN_UNARY_ABS, -4, 4, {}},
      {TERN_UNARY_EXP, -10, 10, {}},
      {TERN_UNARY_LOG, 0.05, 8, {}},
      {TERN_UNARY_SQRT, 0, 9, {}},
      {TERN_UNARY_RSQRT, 0.1, 9, {}},
      {TERN_UNARY_SIN, -6, 6, {}},
      {TERN_UNARY_COS, -6, 6, {}},
      {TERN_UNARY_TANH, -5, 5, {}},
      {TERN_UNARY_SIGMOID, -12, 12, {}},
      {TERN_UNARY_RELU, -4, 4, {}},
      {TERN_UNARY_GELU, -6, 6, {}},
      {TERN_UNARY_GELU_TANH, -6, 6, {}},
      {TERN_UNARY_SILU, -8, 8, {}},
      {TERN_UNARY_ERF, -3, 3, {}},
      {TERN_UNARY_FLOOR, -4, 4, {}},
      {TERN_UNARY_CEIL, -4, 4, {}},
      {TERN_UNARY_ROUND, -4, 4, {}},
      {TERN_UNARY_TRUNC, -4, 4, {}},
      {TERN_UNARY_SIGN, -4, 4, {}},
      {TERN_UNARY_RECIPROCAL, 0.2, 5, {}},
      {TERN_UNARY_LOGICAL_NOT, -2, 2, {}},
      {TERN_UNARY_EXPM1, -3, 3, {}},
      {TERN_UNARY_LOG1P, -0.5, 5, {}},
      {TERN_UNARY_SQUARE, -4, 4, {}},
      {TERN_UNARY_LEAKY_RELU, -4, 4, {0.2}},
      {TERN_UNARY_ELU, -4, 4, {1.5}},
      {TERN_UNARY_POW_SCALAR, 0.1, 4, {1.7}},
      // The exponents computed without pow (as PyTorch's CPU kernel does).
      {TERN_UNARY_POW_SCALAR, -4, 4, {2.0}},
      {TERN_UNARY_POW_SCALAR, -4, 4, {3.0}},
      {TERN_UNARY_POW_SCALAR, 0.1, 4, {0.5}},
      {TERN_UNARY_POW_SCALAR, 0.1, 4, {-0.5}},
      {TERN_UNARY_POW_SCALAR, 0.2, 4, {-1.0}},
      {TERN_UNARY_POW_SCALAR, 0.2, 4, {-2.0}},
      {TERN_UNARY_CLAMP, -4, 4, {-1.0, 2.5}},
      {TERN_UNARY_AFFINE, -4, 4, {0.5, -1.25}},
      {TERN_UNARY_SOFTPLUS, -30, 30, {2.0, 20.0}},
      {TERN_UNARY_ISNAN, -2, 2, {}},
      {TERN_UNARY_LOG2, 0.05, 8, {}},
      {TERN_UNARY_EXP2, -8, 8, {}},
      {TERN_UNARY_TAN, -1.3, 1.3, {}},
      {TERN_UNARY_ASIN, -0.95, 0.95, {}},
      {TERN_UNARY_ACOS, -0.95, 0.95, {}},
      {TERN_UNARY_ATAN, -5, 5, {}},
      {TERN_UNARY_SINH, -4, 4, {}},
      {TERN_UNARY_COSH, -4, 4, {}},
      {TERN_UNARY_HARDSIGMOID, -5, 5, {}},
      {TERN_UNARY_HARDSWISH, -5, 5, {}},
      {TERN_UNARY_MISH, -6, 6, {}},
      {TERN_UNARY_BITWISE_NOT, -4, 4, {}},
  };
  return cases;
}

double Softplus(double x, double beta, double threshold) {
  return x * beta > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
}

double RefUnary(int fn, double x, const std::vector<double>& p) {
  const double k = std::sqrt(2.0 / M_PI);
  switch (fn) {
    case TERN_UNARY_NEG:
      return -x;
    case TERN_UNARY_ABS:
      return std::fabs(x);
    case TERN_UNARY_EXP:
      return std::exp(x);
    case TERN_UNARY_LOG:
      return std::log(x);
    case TERN_UNARY_SQRT:
      return std::sqrt(x);
    case TERN_UNARY_RSQRT:
      return 1 / std::sqrt(x);
    case TERN_UNARY_SIN:
      return std::sin(x);
    case TERN_UNARY_COS:
      return std::cos(x);
    case TERN_UNARY_TANH:
      return std::tanh(x);
    case TERN_UNARY_SIGMOID:
      return 1 / (1 + std::exp(-x));
    case TERN_UNARY_RELU:
      return x < 0 ? 0 : x;
    case TERN_UNARY_GELU:
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case TERN_UNARY_GELU_TANH:
      return x / (1 + std::exp(-2 * k * (x + 0.044715 * x * x * x)));
    case TERN_UNARY_SILU:
      return x / (1 + std::exp(-x));
    case TERN_UNARY_ERF:
      return std::erf(x);
    case TERN_UNARY_FLOOR:
      return std::floor(x);
    case TERN_UNARY_CEIL:
      return std::ceil(x);
    case TERN_UNARY_ROUND:
      return std::nearbyint(x);
    case TERN_UNARY_TRUNC:
      return std::trunc(x);
    case TERN_UNARY_SIGN:
      return (x > 0) - (x < 0);
    case TERN_UNARY_RECIPROCAL:
      return 1 / x;
    case TERN_UNARY_LOGICAL_NOT:
      return x == 0;
    case TERN_UNARY_EXPM1:
      return std::expm1(x);
    case TERN_UNARY_LOG1P:
      return std::log1p(x);
    case TERN_UNARY_SQUARE:
      return x * x;
    case TERN_UNARY_LEAKY_RELU:
      return x > 0 ? x : x * p[0];
    case TERN_UNARY_ELU:
      return x > 0 ? x : p[0] * std::expm1(x);
    case TERN_UNARY_POW_SCALAR:
      return std::pow(x, p[0]);
    case TERN_UNARY_CLAMP:
      return std::min(std::max(x, p[0]), p[1]);
    case TERN_UNARY_AFFINE:
      return p[0] * x + p[1];
    case TERN_UNARY_SOFTPLUS:
      return Softplus(x, p[0], p[1]);
    case TERN_UNARY_ISNAN:
      return std::isnan(x);
    case TERN_UNARY_LOG2:
      return std::log2(x);
    case TERN_UNARY_EXP2:
      return std::exp2(x);
    case TERN_UNARY_TAN:
      return std::tan(x);
    case TERN_UNARY_ASIN:
      return std::asin(x);
    case TERN_UNARY_ACOS:
      return std::acos(x);
    case TERN_UNARY_ATAN:
      return std::atan(x);
    case TERN_UNARY_SINH:
      return std::sinh(x);
    case TERN_UNARY_COSH:
      return std::cosh(x);
    case TERN_UNARY_HARDSIGMOID:
      return std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case TERN_UNARY_HARDSWISH:
      return x * std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case TERN_UNARY_MISH:
      return x * std::tanh(Softplus(x, 1, 20));
    default:
      return NAN;
  }
}

// d f / dx, by hand; checked against finite differences below.
double RefDerivative(int fn, double x, const std::vector<double>& p) {
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  switch (fn) {
    case TERN_UNARY_NEG:
      return -1;
    case TERN_UNARY_ABS:
      return (x > 0) - (x < 0);
    case TERN_UNARY_EXP:
      return std::exp(x);
    case TERN_UNARY_LOG:
      return 1 / x;
    case TERN_UNARY_SQRT:
      return 0.5 / std::sqrt(x);
    case TERN_UNARY_RSQRT:
      return -0.5 * std::pow(x, -1.5);
    case TERN_UNARY_SIN:
      return std::cos(x);
    case TERN_UNARY_COS:
      return -std::sin(x);
    case TERN_UNARY_TANH:
      return 1 - std::tanh(x) * std::tanh(x);
    case TERN_UNARY_SIGMOID:
      return sig(x) * (1 - sig(x));
    case TERN_UNARY_RELU:
      return x > 0;
    case TERN_UNARY_GELU:
      return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
    case TERN_UNARY_GELU_TANH: {
      double t = std::tanh(k * (x + c * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
    }
    case TERN_UNARY_SILU:
      return sig(x) * (1 + x * (1 - sig(x)));
    case TERN_UNARY_ERF:
      return 2 / std::sqrt(M_PI) * std::exp(-x * x);
    case TERN_UNARY_FLOOR:
    case TERN_UNARY_CEIL:
    case TERN_UNARY_ROUND:
    case TERN_UNARY_TRUNC:
    case TERN_UNARY_SIGN:
      return 0;
    case TERN_UNARY_RECIPROCAL:
      return -1 / (x * x);
    case TERN_UNARY_EXPM1:
      return std::exp(x);
    case TERN_UNARY_LOG1P:
      return 1 / (1 + x);
    case TERN_UNARY_SQUARE:
      return 2 * x;
    case TERN_UNARY_LEAKY_RELU:
      return x > 0 ? 1 : p[0];
    case TERN_UNARY_ELU:
      return x > 0 ? 1 : p[0] * std::exp(x);
    case TERN_UNARY_POW_SCALAR:
      return p[0] * std::pow(x, p[0] - 1);
    case TERN_UNARY_CLAMP:
      return x >= p[0] && x <= p[1];
    case TERN_UNARY_AFFINE:
      return p[0];
    case TERN_UNARY_SOFTPLUS:
      return x * p[0] > p[1] ? 1 : sig(p[0] * x);
    case TERN_UNARY_LOG2:
      return 1 / (x * std::log(2.0));
    case TERN_UNARY_EXP2:
      return std::exp2(x) * std::log(2.0);
    case TERN_UNARY_TAN:
      return 1 + std::tan(x) * std::tan(x);
    case TERN_UNARY_ASIN:
      return 1 / std::sqrt(1 - x * x);
    case TERN_UNARY_ACOS:
      return -1 / std::sqrt(1 - x * x);
    case TERN_UNARY_ATAN:
      return 1 / (1 + x * x);
    case TERN_UNARY_SINH:
      return std::cosh(x);
    case TERN_UNARY_COSH:
      return std::sinh(x);
    case TERN_UNARY_HARDSIGMOID:
      return x > -3 && x < 3 ? 1.0 / 6 : 0;
    case TERN_UNARY_HARDSWISH:
      return x < -3 ? 0 : x <= 3 ? x / 3 + 0.5 : 1;
    case TERN_UNARY_MISH: {
      double t = std::tanh(Softplus(x, 1, 20));
      return t + x * sig(x) * (1 - t * t);
    }
    default:
      return NAN;
  }
}

bool UnaryIntegerOk(int fn) {
  switch (fn) {
    case TERN_UNARY_NEG:
    case TERN_UNARY_ABS:
    case TERN_UNARY_RELU:
    case TERN_UNARY_FLOOR:
    case TERN_UNARY_CEIL:
    case TERN_UNARY_ROUND:
    case TERN_UNARY_TRUNC:
    case TERN_UNARY_SIGN:
    case TERN_UNARY_SQUARE:
    case TERN_UNARY_CLAMP:
    case TERN_UNARY_LOGICAL_NOT:
    case TERN_UNARY_ISNAN:
    case TERN_UNARY_BITWISE_NOT:
      return true;
    default:
      return false;
  }
}

int64_t RefUnaryI(int fn, int64_t x, const std::vector<double>& p, bool is_bool) {
  switch (fn) {
    case TERN_UNARY_NEG:
      return static_cast<int64_t>(0 - static_cast<uint64_t>(x));
    case TERN_UNARY_ABS:
      return x < 0 ? static_cast<int64_t>(0 - static_cast<uint64_t>(x)) : x;
    case TERN_UNARY_RELU:
      return x < 0 ? 0 : x;
    case TERN_UNARY_SIGN:
      return (x > 0) - (x < 0);
    case TERN_UNARY_SQUARE:
      return static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(x));
    case TERN_UNARY_CLAMP:
      return std::min<int64_t>(std::max<int64_t>(x, std::ceil(p[0])), std::floor(p[1]));
    case TERN_UNARY_LOGICAL_NOT:
      return x == 0;
    case TERN_UNARY_ISNAN:
      return 0;
    case TERN_UNARY_BITWISE_NOT:
      return is_bool ? x == 0 : ~x;
    default:
      return x;  // floor, ceil, round, trunc
  }
}

// The absolute error numerics.h gives for f32 gelu: 1e-6 where the kernels
// run code with FMA, 1.2e-6 where they run baseline x86-64 code.
double GeluAbsoluteTolerance() { return sim::KernelsRunWithFmaForTesting() ? 1e-6 : 1.2e-6; }

TEST(UnaryTest, EveryFunctionOnFloatDtypes) {
  std::mt19937_64 rng(7);
  for (const UnaryCase& c : UnaryCases()) {
    if (c.fn == TERN_UNARY_BITWISE_NOT) continue;
    for (tern_dtype_t dt : kFloatDtypes) {
      const tern_dtype_t odt =
          (c.fn == TERN_UNARY_ISNAN || c.fn == TERN_UNARY_LOGICAL_NOT) ? TERN_DTYPE_BOOL : dt;
      for (const Shape& shape : kShapes) {
        for (Layout layout :
             {Layout::kContiguous, Layout::kTransposed, Layout::kSpacedOut, Layout::kBroadcast}) {
          Tensor in = MakeInput(dt, shape, layout, true, true);
          in.Randomize(rng, c.lo, c.hi);
          if (c.fn == TERN_UNARY_LOGICAL_NOT || c.fn == TERN_UNARY_ROUND) {
            // Zeros for logical_not; exact halves for round-half-even.
            for (int64_t i = 0; i < in.count(); i += 4)
              in.Set(i, c.fn == TERN_UNARY_ROUND ? (i % 8) * 0.5 - 2 : 0.0);
          }
          Tensor out = MakeOutput(odt, shape, layout);
          Status st = Exec(TERN_OP_UNARY, {&out, &in}, {c.fn}, c.params);
          ASSERT_TRUE(st.ok()) << st.message();
          std::vector<double> ref(out.count());
          for (int64_t i = 0; i < out.count(); ++i)
            ref[i] = RoundToDtype(odt, RefUnary(c.fn, in.Get(i), c.params));
          // f32 results carry a few ulps from libm or our exp; 16-bit ones the
          // output rounding (plus one ulp when the f32 result sits on a tie).
          Tolerance tol = TolFor(odt, 1.0);
          if (odt == TERN_DTYPE_F32) {
            tol = {2e-6 * 8, c.fn == TERN_UNARY_GELU ? GeluAbsoluteTolerance() : 1e-6};
          }
          ASSERT_TRUE(Near(out, ref, tol))
              << "unary " << isa::UnaryFnName(c.fn) << " " << isa::DTypeName(dt) << " "
              << ShapeStr(shape) << " layout " << static_cast<int>(layout);
        }
      }
    }
  }
}

TEST(UnaryTest, IntegerAndBoolFunctions) {
  std::mt19937_64 rng(8);
  for (const UnaryCase& c : UnaryCases()) {
    if (!UnaryIntegerOk(c.fn)) continue;
    for (tern_dtype_t dt : kAllDtypes) {
      if (isa::IsFloat(dt)) continue;
      const bool bool_ok = c.fn == TERN_UNARY_LOGICAL_NOT || c.fn == TERN_UNARY_ISNAN ||
                           c.fn == TERN_UNARY_BITWISE_NOT;
      if (dt == TERN_DTYPE_BOOL && !bool_ok) continue;
      const tern_dtype_t odt =
          (c.fn == TERN_UNARY_ISNAN || c.fn == TERN_UNARY_LOGICAL_NOT) ? TERN_DTYPE_BOOL : dt;
      Tensor in = Tensor::Permuted(dt, {5, 7}, {1, 0});
      in.Randomize(rng, -128, 127);
      if (dt != TERN_DTYPE_BOOL) {
        in.SetInt(0, dt == TERN_DTYPE_I8    ? -128
                     : dt == TERN_DTYPE_I32 ? -2147483648LL
                                            : std::numeric_limits<int64_t>::min());
        in.SetInt(1, 0);
      }
      Tensor out(odt, {5, 7});
      ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {c.fn}, c.params).ok());
      std::vector<double> ref(out.count());
      for (int64_t i = 0; i < out.count(); ++i) {
        ref[i] = static_cast<double>(
            Wrap(odt, RefUnaryI(c.fn, in.GetInt(i), c.params, dt == TERN_DTYPE_BOOL)));
      }
      ASSERT_TRUE(Equal(out, ref))
          << "unary " << isa::UnaryFnName(c.fn) << " " << isa::DTypeName(dt);
    }
  }
}

TEST(UnaryTest, SpecialValues) {
  Tensor in(TERN_DTYPE_F32, {6}), out(TERN_DTYPE_F32, {6});
  in.SetAll({NAN, INFINITY, -INFINITY, -0.0, 0.5, -0.5});
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_RELU}).ok());
  EXPECT_TRUE(std::isnan(out.Get(0)));
  EXPECT_EQ(out.Get(2), 0.0);
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_EXP}).ok());
  EXPECT_EQ(out.Get(1), INFINITY);
  EXPECT_EQ(out.Get(2), 0.0);
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_ROUND}).ok());
  EXPECT_EQ(out.Get(4), 0.0);  // half to even
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_SIGN}).ok());
  EXPECT_EQ(out.Get(0), 0.0);  // sign(NaN) = 0, as PyTorch
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_TANH}).ok());
  EXPECT_EQ(out.Get(1), 1.0);
  EXPECT_TRUE(std::signbit(out.Get(3)));
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_CLAMP}, {-INFINITY, 0.25}).ok());
  EXPECT_TRUE(std::isnan(out.Get(0)));
  EXPECT_EQ(out.Get(2), -INFINITY);
  EXPECT_EQ(out.Get(4), 0.25);
  Tensor flags(TERN_DTYPE_BOOL, {6});
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&flags, &in}, {TERN_UNARY_ISNAN}).ok());
  EXPECT_TRUE(Equal(flags, {1, 0, 0, 0, 0, 0}));
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&flags, &in}, {TERN_UNARY_LOGICAL_NOT}).ok());
  EXPECT_TRUE(Equal(flags, {0, 0, 0, 1, 0, 0}));
}

TEST(UnaryBackwardTest, DerivativesMatchFiniteDifferences) {
  // Guards the hand-written reference derivatives themselves.
  for (const UnaryCase& c : UnaryCases()) {
    if (c.fn == TERN_UNARY_BITWISE_NOT || c.fn == TERN_UNARY_ISNAN ||
        c.fn == TERN_UNARY_LOGICAL_NOT)
      continue;
    for (int i = 1; i < 10; ++i) {
      double x = c.lo + (c.hi - c.lo) * (i / 10.0 + 0.0123);
      if (c.fn == TERN_UNARY_ROUND || c.fn == TERN_UNARY_FLOOR || c.fn == TERN_UNARY_CEIL ||
          c.fn == TERN_UNARY_TRUNC || c.fn == TERN_UNARY_SIGN) {
        x = std::floor(x) + 0.3;  // away from the steps
      }
      const double h = 1e-6 * std::max(1.0, std::fabs(x));
      double fd = (RefUnary(c.fn, x + h, c.params) - RefUnary(c.fn, x - h, c.params)) / (2 * h);
      EXPECT_NEAR(RefDerivative(c.fn, x, c.params), fd, 1e-5 * std::max(1.0, std::fabs(fd)))
          << isa::UnaryFnName(c.fn) << " at " << x;
    }
  }
}

TEST(UnaryBackwardTest, EveryFunctionOnFloatDtypes) {
  std::mt19937_64 rng(9);
  for (const UnaryCase& c : UnaryCases()) {
    if (c.fn == TERN_UNARY_BITWISE_NOT || c.fn == TERN_UNARY_ISNAN ||
        c.fn == TERN_UNARY_LOGICAL_NOT)
      continue;
    for (tern_dtype_t dt : kFloatDtypes) {
      for (const Shape& shape : {Shape{13, 9}, Shape{}, Shape{0}}) {
        Tensor in = shape.size() == 2 ? Tensor::Permuted(dt, shape, {1, 0}) : Tensor(dt, shape);
        in.Randomize(rng, c.lo, c.hi);
        Tensor go(dt, shape), gi = Tensor::Spaced(dt, shape);
        go.Randomize(rng, -2, 2);
        ASSERT_TRUE(Exec(TERN_OP_UNARY_BACKWARD, {&gi, &go, &in}, {c.fn}, c.params).ok());
        std::vector<double> ref(gi.count());
        for (int64_t i = 0; i < gi.count(); ++i)
          ref[i] = RoundToDtype(dt, go.Get(i) * RefDerivative(c.fn, in.Get(i), c.params));
        Tolerance tol = dt == TERN_DTYPE_F32 ? Tolerance{1e-4, 1e-5} : TolFor(dt, 2);
        ASSERT_TRUE(Near(gi, ref, tol))
            << "unary_backward " << isa::UnaryFnName(c.fn) << " " << isa::DTypeName(dt);
      }
    }
  }
}

TEST(UnaryTest, LargeGeluMatchesAcrossThreads) {
  std::mt19937_64 rng(10);
  Tensor in(TERN_DTYPE_F32, {200000}), out(TERN_DTYPE_F32, {200000});
  in.Randomize(rng, -8, 8);
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_GELU}).ok());
  std::vector<double> ref(out.count());
  for (int64_t i = 0; i < out.count(); ++i) ref[i] = RefUnary(TERN_UNARY_GELU, in.Get(i), {});
  EXPECT_TRUE(Near(out, ref, {2e-5, GeluAbsoluteTolerance()}));
}

// ----------------------------------------------------------------------------
// iota

TEST(IotaTest, AxesDtypesAndLayouts) {
  for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I8,
                          TERN_DTYPE_I32, TERN_DTYPE_I64}) {
    for (int axis : {0, 1, 2, -1}) {
      Shape shape = {3, 4, 5};
      Tensor out = Tensor::Permuted(dt, shape, {2, 0, 1});
      const double start = isa::IsFloat(dt) ? 1.5 : -3, step = isa::IsFloat(dt) ? 0.25 : 2;
      ASSERT_TRUE(Exec(TERN_OP_IOTA, {&out}, {axis}, {start, step}).ok());
      std::vector<double> ref(out.count());
      const int a = axis < 0 ? axis + 3 : axis;
      for (int64_t i = 0; i < out.count(); ++i)
        ref[i] = RoundToDtype(dt, start + step * out.Index(i)[a]);
      ASSERT_TRUE(Equal(out, ref)) << isa::DTypeName(dt) << " axis " << axis;
    }
  }
  Tensor scalar(TERN_DTYPE_F32, {});
  ASSERT_TRUE(Exec(TERN_OP_IOTA, {&scalar}, {0}, {7.0}).ok());
  EXPECT_EQ(scalar.Get(0), 7.0);
  Tensor empty(TERN_DTYPE_I32, {0, 3});
  ASSERT_TRUE(Exec(TERN_OP_IOTA, {&empty}, {1}).ok());
  Tensor big(TERN_DTYPE_I64, {100000});
  ASSERT_TRUE(Exec(TERN_OP_IOTA, {&big}, {0}).ok());
  EXPECT_EQ(big.GetInt(99999), 99999);
}

}  // namespace
}  // namespace tern::testing

namespace tern::testing {
namespace {

TEST(DispatchTest, CollectivesSyncAndBadViews) {
  Tensor a(TERN_DTYPE_F32, {4}), b(TERN_DTYPE_F32, {4});
  Status st = Exec(TERN_OP_ALL_REDUCE, {&a, &b});
  EXPECT_EQ(st.code(), TERN_ERROR_UNIMPLEMENTED);
  EXPECT_NE(st.message().find("collectives inside executables are not implemented yet"),
            std::string::npos);
  EXPECT_TRUE(Exec(TERN_OP_SEM_SIGNAL, {}, {0, 1}).ok());
  EXPECT_TRUE(Exec(TERN_OP_SEM_WAIT, {}, {0, 1}).ok());
  // One view per operand, each with memory.
  driver::Instruction ins;
  ins.opcode = TERN_OP_COPY;
  ins.operands = {a.desc(), b.desc()};
  std::vector<sim::TensorView> views = {a.View()};
  EXPECT_EQ(sim::RunInstruction(ins, views).code(), TERN_ERROR_INTERNAL);
  views = {a.View(), sim::TensorView{nullptr, &ins.operands[1]}};
  EXPECT_EQ(sim::RunInstruction(ins, views).code(), TERN_ERROR_INTERNAL);
}

}  // namespace
}  // namespace tern::testing
