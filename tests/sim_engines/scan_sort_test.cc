// scan, sort and topk against naive references: every function and dtype,
// strided and permuted layouts, negative axes, empty and size-1 axes, i64
// beyond what doubles hold exactly, NaN and ties (sort is stable, topk takes
// sort's order), and results that do not depend on the thread count.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

// The logical indices of the line of `shape` along `axis` that holds `linear`.
std::vector<int64_t> LineOf(const Shape& shape, int axis, int64_t linear) {
  int64_t inner = 1;
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t length = shape.empty() ? 1 : shape[axis];
  const int64_t start = linear - (linear / inner % length) * inner;
  std::vector<int64_t> line(length);
  for (int64_t i = 0; i < length; ++i) line[i] = start + i * inner;
  return line;
}

// Every line along `axis`, each as its logical element indices.
std::vector<std::vector<int64_t>> Lines(const Shape& shape, int axis) {
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<std::vector<int64_t>> lines;
  const int64_t length = shape.empty() ? 1 : shape[axis];
  if (count == 0) return lines;
  std::vector<bool> seen(count);
  for (int64_t i = 0; i < count; ++i) {
    if (seen[i]) continue;
    lines.push_back(LineOf(shape, axis, i));
    for (int64_t j : lines.back()) seen[j] = true;
  }
  EXPECT_EQ(static_cast<int64_t>(lines.size()) * length, count);
  return lines;
}

// PyTorch CPU's scan of one line: f32 accumulates in double, bf16/f16 in
// float, integers in int64 (wrapping); each output rounded to out's dtype.
std::vector<double> ScanRef(int64_t fn, tern_dtype_t out, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  double dacc = fn == TERN_SCAN_PROD ? 1.0 : 0.0;
  float facc = static_cast<float>(dacc);
  for (size_t i = 0; i < x.size(); ++i) {
    if (fn == TERN_SCAN_MAX || fn == TERN_SCAN_MIN) {
      const double prev = i == 0 ? x[0] : y[i - 1];
      const bool take =
          i == 0 || (!std::isnan(prev) &&
                     (std::isnan(x[i]) || (fn == TERN_SCAN_MAX ? x[i] > prev : x[i] < prev)));
      y[i] = take ? x[i] : prev;
    } else if (out == TERN_DTYPE_F32) {
      dacc = fn == TERN_SCAN_SUM ? dacc + x[i] : dacc * x[i];
      y[i] = static_cast<float>(dacc);
    } else {
      facc =
          fn == TERN_SCAN_SUM ? facc + static_cast<float>(x[i]) : facc * static_cast<float>(x[i]);
      y[i] = RoundToDtype(out, facc);
    }
  }
  return y;
}

std::vector<int64_t> ScanRefInt(int64_t fn, const std::vector<int64_t>& x) {
  std::vector<int64_t> y(x.size());
  uint64_t acc = fn == TERN_SCAN_PROD ? 1 : 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (fn == TERN_SCAN_SUM) acc += static_cast<uint64_t>(x[i]);
    if (fn == TERN_SCAN_PROD) acc *= static_cast<uint64_t>(x[i]);
    if (fn == TERN_SCAN_MAX) acc = static_cast<uint64_t>(i == 0 ? x[0] : std::max(y[i - 1], x[i]));
    if (fn == TERN_SCAN_MIN) acc = static_cast<uint64_t>(i == 0 ? x[0] : std::min(y[i - 1], x[i]));
    y[i] = static_cast<int64_t>(acc);
  }
  return y;
}

// Runs a scan of `in` into a fresh `out_dtype` tensor laid out with stride 2
// and checks it element by element against the references.
void CheckScan(int64_t fn, Tensor& in, tern_dtype_t out_dtype, int axis) {
  const Shape& shape = in.shape();
  Tensor out = shape.empty() ? Tensor(out_dtype, shape) : Tensor::Spaced(out_dtype, shape);
  out.Poison();
  Status st = Exec(TERN_OP_SCAN, {&out, &in}, {fn, axis});
  ASSERT_TRUE(st.ok()) << st.message();
  const int norm = shape.empty() ? 0 : (axis < 0 ? axis + static_cast<int>(shape.size()) : axis);
  for (const std::vector<int64_t>& line : Lines(shape, norm)) {
    if (isa::IsFloat(out_dtype)) {
      std::vector<double> x;
      for (int64_t i : line) x.push_back(in.Get(i));
      const std::vector<double> y = ScanRef(fn, out_dtype, x);
      for (size_t i = 0; i < line.size(); ++i) {
        const double got = out.Get(line[i]);
        ASSERT_TRUE(got == y[i] || (std::isnan(got) && std::isnan(y[i])))
            << isa::ScanFnName(fn) << " " << isa::DTypeName(out_dtype) << " axis " << axis
            << " shape " << ShapeStr(shape) << " element " << line[i] << ": " << got
            << " != " << y[i];
      }
    } else {
      std::vector<int64_t> x;
      for (int64_t i : line) x.push_back(in.GetInt(i));
      const std::vector<int64_t> y = ScanRefInt(fn, x);
      for (size_t i = 0; i < line.size(); ++i) {
        // Stores wrap to out's width, as the reference's cast would.
        int64_t want = y[i];
        if (out_dtype == TERN_DTYPE_I32) want = static_cast<int32_t>(want);
        if (out_dtype == TERN_DTYPE_I8) want = static_cast<int8_t>(want);
        ASSERT_EQ(out.GetInt(line[i]), want)
            << isa::ScanFnName(fn) << " " << isa::DTypeName(out_dtype) << " axis " << axis
            << " shape " << ShapeStr(shape) << " element " << line[i];
      }
    }
  }
}

TEST(ScanTest, FunctionsDtypesAxesLayouts) {
  std::mt19937_64 rng(31);
  for (int64_t fn = 0; fn < TERN_SCAN_COUNT; ++fn) {
    for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I8,
                            TERN_DTYPE_I32, TERN_DTYPE_I64}) {
      for (int axis : {0, 1, 2, -1, -3}) {
        const Shape shape = {3, 7, 5};
        Tensor in = axis == 1 ? Tensor::Permuted(dt, shape, {2, 0, 1}) : Tensor(dt, shape);
        if (isa::IsFloat(dt)) {
          in.Randomize(rng, fn == TERN_SCAN_PROD ? 0.5 : -2.0, fn == TERN_SCAN_PROD ? 1.5 : 2.0);
        } else {
          in.Randomize(rng, -9, 9);
        }
        CheckScan(fn, in, dt, axis);
      }
    }
  }
}

TEST(ScanTest, EmptySizeOneAndScalar) {
  std::mt19937_64 rng(32);
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{4, 0, 3}, Shape{4, 1, 3}, Shape{1}}) {
    for (int axis : {0, -1}) {
      Tensor in(TERN_DTYPE_F32, shape);
      in.Randomize(rng);
      CheckScan(TERN_SCAN_SUM, in, TERN_DTYPE_F32, axis);
      CheckScan(TERN_SCAN_MAX, in, TERN_DTYPE_F32, axis);
    }
  }
  Tensor in(TERN_DTYPE_I64, {4, 0, 3});
  CheckScan(TERN_SCAN_PROD, in, TERN_DTYPE_I64, 1);
}

TEST(ScanTest, IntegersPromoteAndStayExact) {
  // Position ids from an attention mask: cumsum of bool and i32 into i64.
  std::mt19937_64 rng(33);
  for (tern_dtype_t dt : {TERN_DTYPE_BOOL, TERN_DTYPE_I8, TERN_DTYPE_I32}) {
    Tensor in(dt, {5, 300});
    in.Randomize(rng, -50, 50);
    CheckScan(TERN_SCAN_SUM, in, TERN_DTYPE_I64, 1);
    CheckScan(TERN_SCAN_PROD, in, TERN_DTYPE_I64, 0);
  }
  // Sums far beyond 2^53, and a product that wraps, as int64 arithmetic does.
  Tensor big(TERN_DTYPE_I64, {2, 9});
  for (int64_t i = 0; i < big.count(); ++i) big.SetInt(i, (int64_t{1} << 58) + 3 * i + 1);
  CheckScan(TERN_SCAN_SUM, big, TERN_DTYPE_I64, 1);
  CheckScan(TERN_SCAN_PROD, big, TERN_DTYPE_I64, 1);
  Tensor out(TERN_DTYPE_I64, {2, 9});
  ASSERT_TRUE(Exec(TERN_OP_SCAN, {&out, &big}, {TERN_SCAN_SUM, 1}).ok());
  EXPECT_EQ(out.GetInt(1), (int64_t{1} << 59) + 5);  // 2^58 + 1 + 2^58 + 4
}

TEST(ScanTest, MaxMinPropagateNaN) {
  Tensor in(TERN_DTYPE_F32, {6});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  in.SetAll({1.0, 3.0, nan, 5.0, -1.0, 7.0});
  for (int64_t fn : {TERN_SCAN_MAX, TERN_SCAN_MIN, TERN_SCAN_SUM}) {
    Tensor out(TERN_DTYPE_F32, {6});
    ASSERT_TRUE(Exec(TERN_OP_SCAN, {&out, &in}, {fn, 0}).ok());
    EXPECT_EQ(out.Get(1), fn == TERN_SCAN_MIN ? 1.0 : (fn == TERN_SCAN_MAX ? 3.0 : 4.0));
    for (int64_t i = 2; i < 6; ++i) EXPECT_TRUE(std::isnan(out.Get(i))) << i;
  }
  CheckScan(TERN_SCAN_MAX, in, TERN_DTYPE_F32, 0);
}

TEST(ScanTest, InPlaceAndThreadCountIndependent) {
  std::mt19937_64 rng(34);
  Tensor in(TERN_DTYPE_BF16, {512, 129});
  in.Randomize(rng);
  Tensor one(TERN_DTYPE_BF16, {512, 129});
  const int threads = KernelThreadsForHost();
  SetKernelThreadsForTesting(1);
  ASSERT_TRUE(Exec(TERN_OP_SCAN, {&one, &in}, {TERN_SCAN_SUM, 1}).ok());
  SetKernelThreadsForTesting(std::max(threads, 4));
  Tensor many(TERN_DTYPE_BF16, {512, 129});
  ASSERT_TRUE(Exec(TERN_OP_SCAN, {&many, &in}, {TERN_SCAN_SUM, 1}).ok());
  // In place: out is in.
  ASSERT_TRUE(Exec(TERN_OP_SCAN, {&in, &in}, {TERN_SCAN_SUM, 1}).ok());
  SetKernelThreadsForTesting(0);
  for (int64_t i = 0; i < in.count(); ++i) {
    ASSERT_EQ(one.Bits(i), many.Bits(i)) << i;
    ASSERT_EQ(one.Bits(i), in.Bits(i)) << i;
  }
}

// a before b in PyTorch's order: NaN above everything.
bool SortLess(double a, double b) {
  if (std::isnan(b)) return !std::isnan(a);
  return a < b;
}

// The stable order of one line: positions, best first.
std::vector<int64_t> StableOrder(const std::vector<double>& x, bool descending) {
  std::vector<int64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return descending ? SortLess(x[b], x[a]) : SortLess(x[a], x[b]);
  });
  return order;
}

// Runs sort (k < 0) or topk (k >= 0) and checks values and indices exactly
// against the first k of the stable order.
void CheckSort(Tensor& in, int axis, bool descending, int64_t k = -1) {
  const Shape& shape = in.shape();
  const int norm = shape.empty() ? 0 : (axis < 0 ? axis + static_cast<int>(shape.size()) : axis);
  Shape out_shape = shape;
  if (k >= 0 && !shape.empty()) out_shape[norm] = k;
  Tensor values =
      out_shape.empty() ? Tensor(in.dtype(), out_shape) : Tensor::Spaced(in.dtype(), out_shape);
  Tensor indices = out_shape.size() >= 2 ? Tensor::Permuted(TERN_DTYPE_I64, out_shape, {1, 0})
                                         : Tensor(TERN_DTYPE_I64, out_shape);
  if (out_shape.size() > 2) indices = Tensor(TERN_DTYPE_I64, out_shape);
  values.Poison();
  indices.Poison();
  Status st = Exec(k < 0 ? TERN_OP_SORT : TERN_OP_TOPK, {&values, &indices, &in},
                   {axis, descending ? 1 : 0});
  ASSERT_TRUE(st.ok()) << st.message();
  const std::vector<std::vector<int64_t>> out_lines = Lines(out_shape, norm);
  const std::vector<std::vector<int64_t>> in_lines = Lines(shape, norm);
  if (k == 0 || values.count() == 0) return;
  ASSERT_EQ(out_lines.size(), in_lines.size());
  for (size_t l = 0; l < in_lines.size(); ++l) {
    std::vector<double> x;
    for (int64_t i : in_lines[l]) x.push_back(in.Get(i));
    const std::vector<int64_t> order = StableOrder(x, descending);
    for (size_t i = 0; i < out_lines[l].size(); ++i) {
      const int64_t o = out_lines[l][i];
      ASSERT_EQ(indices.GetInt(o), order[i])
          << (k < 0 ? "sort " : "topk ") << isa::DTypeName(in.dtype()) << " axis " << axis
          << (descending ? " descending" : "") << " shape " << ShapeStr(shape) << " line " << l
          << " rank " << i;
      ASSERT_EQ(values.Bits(o), in.Bits(in_lines[l][order[i]]));
    }
  }
}

// Random values with many ties (a few distinct values), some NaN, -0.0 and 0.0.
void TiedValues(Tensor& t, std::mt19937_64& rng, bool specials) {
  std::uniform_int_distribution<int> pick(-4, 4);
  for (int64_t i = 0; i < t.count(); ++i) {
    const int v = pick(rng);
    double x = v;
    if (specials && isa::IsFloat(t.dtype())) {
      if (v == 4) x = std::numeric_limits<double>::quiet_NaN();
      if (v == -4) x = std::numeric_limits<double>::infinity();
      if (v == 0 && (i & 1)) x = -0.0;
      if (v == 1) x = 0.5;
    }
    if (t.dtype() == TERN_DTYPE_BOOL) x = v > 0;
    t.Set(i, x);
  }
}

TEST(SortTest, StableWithTiesNaNAndLayouts) {
  std::mt19937_64 rng(41);
  for (tern_dtype_t dt : kAllDtypes) {
    for (int axis : {0, 1, -1}) {
      for (bool descending : {false, true}) {
        const Shape shape = {9, 13};
        Tensor in = axis == 0 ? Tensor::Permuted(dt, shape, {1, 0}) : Tensor::Spaced(dt, shape);
        TiedValues(in, rng, true);
        CheckSort(in, axis, descending);
      }
    }
  }
}

TEST(SortTest, EmptySizeOneScalarAndLongLines) {
  std::mt19937_64 rng(42);
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{3, 0}, Shape{3, 1}, Shape{1, 5}}) {
    Tensor in(TERN_DTYPE_F32, shape);
    in.Randomize(rng);
    CheckSort(in, -1, false);
    CheckSort(in, 0, true);
  }
  Tensor wide(TERN_DTYPE_F32, {2, 3, 5000});
  TiedValues(wide, rng, true);
  CheckSort(wide, 2, true);
  Tensor many(TERN_DTYPE_BF16, {2000, 3, 17});
  many.Randomize(rng);
  CheckSort(many, 1, false);
}

TEST(SortTest, I64BeyondDoublePrecision) {
  // Keys that differ below a double's resolution must still sort exactly.
  Tensor in(TERN_DTYPE_I64, {6});
  const int64_t base = int64_t{1} << 60;
  const int64_t keys[] = {base + 3, base + 1, base + 2, base + 1, -base, base};
  for (int64_t i = 0; i < 6; ++i) in.SetInt(i, keys[i]);
  Tensor values(TERN_DTYPE_I64, {6}), indices(TERN_DTYPE_I64, {6});
  ASSERT_TRUE(Exec(TERN_OP_SORT, {&values, &indices, &in}, {0, 0}).ok());
  const int64_t want_order[] = {4, 5, 1, 3, 2, 0};
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(indices.GetInt(i), want_order[i]) << i;
    EXPECT_EQ(values.GetInt(i), keys[want_order[i]]) << i;
  }
}

TEST(TopkTest, LargestSmallestAnyKTiesNaN) {
  std::mt19937_64 rng(51);
  for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I32,
                          TERN_DTYPE_I64, TERN_DTYPE_BOOL}) {
    for (int axis : {0, -1}) {
      for (bool largest : {true, false}) {
        for (int64_t k : {0, 1, 3, 11}) {
          const Shape shape = {11, 7};
          if (k > shape[axis < 0 ? 1 : 0]) continue;
          Tensor in = Tensor::Permuted(dt, shape, {1, 0});
          TiedValues(in, rng, true);
          CheckSort(in, axis, largest, k);
        }
      }
    }
  }
  // A router's shape: many rows, k of 2 among 64 experts.
  Tensor logits(TERN_DTYPE_F32, {3000, 64});
  logits.Randomize(rng);
  CheckSort(logits, 1, true, 2);
  Tensor scalar(TERN_DTYPE_F32, {});
  scalar.Set(0, 2.5);
  CheckSort(scalar, 0, true, 1);
}

TEST(ScanSortRulesTest, FeatureBitsAndNames) {
  Tensor a(TERN_DTYPE_F32, {2, 3}), b(TERN_DTYPE_F32, {2, 3}), i(TERN_DTYPE_I64, {2, 3});
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_SCAN, {&a.desc(), 1}, {}), TERN_FEATURE_SCAN);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_SORT, {&a.desc(), 1}, {}), TERN_FEATURE_SORT);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_TOPK, {&a.desc(), 1}, {}), TERN_FEATURE_SORT);
  EXPECT_EQ(isa::FeatureNames(TERN_FEATURE_SCAN | TERN_FEATURE_SORT), "scan, sort");
  EXPECT_STREQ(isa::OpcodeName(TERN_OP_SCAN), "scan");
  EXPECT_STREQ(isa::OpcodeName(TERN_OP_TOPK), "topk");
  EXPECT_EQ(isa::OpcodeEngine(TERN_OP_SCAN), TERN_ENGINE_VECTOR);
  EXPECT_EQ(isa::OpcodeEngine(TERN_OP_SORT), TERN_ENGINE_GPSIMD);
  EXPECT_STREQ(isa::ScanFnName(TERN_SCAN_PROD), "prod");
  EXPECT_EQ(isa::ScanFnName(TERN_SCAN_COUNT), nullptr);
  EXPECT_TRUE(isa::OperandIsWritten(TERN_OP_SORT, 1));
  EXPECT_FALSE(isa::OperandIsWritten(TERN_OP_SORT, 2));
  EXPECT_TRUE(Validate(TERN_OP_SORT, {&b, &i, &a}, {1, 0}).ok());
}

}  // namespace
}  // namespace tern::testing
