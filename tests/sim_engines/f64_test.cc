// f64 (TERN_DTYPE_F64, feature f64): the storage dtype's copies, casts to
// and from every dtype, fills, where, and the Vector functions the rules
// allow, all exact against double references; every other use refused by
// name; the feature bit set for any instruction with an f64 operand.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

const std::vector<double> kValues = {
    0.0,  -0.0,     1.0 / 3.0, -2.5, 1e300, -1e-300, 3e9,  -3e10,
    1e20, INFINITY, -INFINITY, NAN,  0.1,   65504,   1e-8, 9007199254740993.0};

Tensor F64(const std::vector<double>& values) {
  Tensor t(TERN_DTYPE_F64, {static_cast<int64_t>(values.size())});
  t.SetAll(values);
  return t;
}

bool SameDouble(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

TEST(F64Test, CopyKeepsEveryBitAndFillIsExact) {
  Tensor src = F64(kValues);
  Tensor dst = Tensor::Spaced(TERN_DTYPE_F64, {static_cast<int64_t>(kValues.size())});
  ASSERT_TRUE(Exec(TERN_OP_COPY, {&dst, &src}).ok());
  for (int64_t i = 0; i < src.count(); ++i) EXPECT_EQ(dst.Bits(i), src.Bits(i)) << i;
  Tensor filled(TERN_DTYPE_F64, {3, 5});
  ASSERT_TRUE(Exec(TERN_OP_FILL, {&filled}, {}, {1.0 / 3.0}).ok());
  for (int64_t i = 0; i < filled.count(); ++i) EXPECT_EQ(filled.Get(i), 1.0 / 3.0);
}

TEST(F64Test, CastsToAndFromEveryDtype) {
  const Tensor src = F64(kValues);
  const int64_t n = src.count();
  for (tern_dtype_t to : kAllDtypes) {
    Tensor dst = Tensor::Spaced(to, {n});
    Tensor from = src;
    ASSERT_TRUE(Exec(TERN_OP_CAST, {&dst, &from}).ok()) << isa::DTypeName(to);
    for (int64_t i = 0; i < n; ++i) {
      const double v = kValues[i];
      if (to == TERN_DTYPE_BOOL) {
        EXPECT_EQ(dst.GetInt(i), v != 0.0) << v;
      } else if (isa::IsFloat(to)) {
        // Through f32, as PyTorch rounds a double to bfloat16 and half.
        EXPECT_TRUE(SameDouble(dst.Get(i), RoundToDtype(to, static_cast<float>(v))))
            << isa::DTypeName(to) << " of " << v << ": " << dst.Get(i);
      } else if (std::isfinite(v) && std::fabs(v) < 1e9) {  // truncates, saturates to the type
        const double lo = to == TERN_DTYPE_I8    ? -128.0
                          : to == TERN_DTYPE_I32 ? -2147483648.0
                                                 : -1e18;
        const double hi = to == TERN_DTYPE_I8 ? 127.0 : to == TERN_DTYPE_I32 ? 2147483647.0 : 1e18;
        EXPECT_EQ(dst.GetInt(i), static_cast<int64_t>(std::clamp(std::trunc(v), lo, hi)))
            << isa::DTypeName(to) << " of " << v;
      }
    }
    // And back: every value of `to` is exact in f64.
    Tensor back(TERN_DTYPE_F64, {n});
    ASSERT_TRUE(Exec(TERN_OP_CAST, {&back, &dst}).ok());
    for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(SameDouble(back.Get(i), dst.Get(i))) << i;
  }
  // int64 beyond 2^53 rounds to the nearest double, as a C cast does.
  Tensor big(TERN_DTYPE_I64, {2});
  big.SetInt(0, (int64_t{1} << 53) + 1);
  big.SetInt(1, std::numeric_limits<int64_t>::max());
  Tensor wide(TERN_DTYPE_F64, {2});
  ASSERT_TRUE(Exec(TERN_OP_CAST, {&wide, &big}).ok());
  EXPECT_EQ(wide.Get(0), static_cast<double>((int64_t{1} << 53) + 1));
  EXPECT_EQ(wide.Get(1), static_cast<double>(std::numeric_limits<int64_t>::max()));
  // f64 to i64 saturates and maps NaN to 0 (the f32 rules).
  Tensor extremes = F64({1e300, -1e300, NAN, -7.9});
  Tensor ints(TERN_DTYPE_I64, {4});
  ASSERT_TRUE(Exec(TERN_OP_CAST, {&ints, &extremes}).ok());
  EXPECT_EQ(ints.GetInt(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ints.GetInt(1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(ints.GetInt(2), 0);
  EXPECT_EQ(ints.GetInt(3), -7);
}

TEST(F64Test, BinaryFunctionsAreExactInDouble) {
  const std::vector<double> a_values = {1.0 / 3.0, -2.5, 1e300, 7.0, NAN, 0.1, -0.0, 3.0};
  const std::vector<double> b_values = {3.0, 1e-300, 1e10, 7.0, 1.0, 0.2, 0.0, NAN};
  const int64_t n = static_cast<int64_t>(a_values.size());
  struct Case {
    tern_binary_fn_t fn;
    double (*ref)(double, double);
  };
  const Case cases[] = {
      {TERN_BINARY_ADD, [](double x, double y) { return x + y; }},
      {TERN_BINARY_SUB, [](double x, double y) { return x - y; }},
      {TERN_BINARY_MUL, [](double x, double y) { return x * y; }},
      {TERN_BINARY_DIV, [](double x, double y) { return x / y; }},
      {TERN_BINARY_MAX,
       [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::max(x, y); }},
      {TERN_BINARY_MIN,
       [](double x, double y) { return std::isnan(x) || std::isnan(y) ? NAN : std::min(x, y); }},
  };
  for (const Case& c : cases) {
    Tensor a = F64(a_values), b = F64(b_values);
    Tensor out = Tensor::Spaced(TERN_DTYPE_F64, {n});
    ASSERT_TRUE(Exec(TERN_OP_BINARY, {&out, &a, &b}, {c.fn}).ok()) << isa::BinaryFnName(c.fn);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_TRUE(SameDouble(out.Get(i), c.ref(a_values[i], b_values[i])))
          << isa::BinaryFnName(c.fn) << " at " << i << ": " << out.Get(i);
    }
  }
  Tensor a = F64(a_values), b = F64(b_values);
  Tensor lt(TERN_DTYPE_BOOL, {n});
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&lt, &a, &b}, {TERN_BINARY_LT}).ok());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(lt.GetInt(i), a_values[i] < b_values[i]) << i;
  // A broadcast operand (stride 0).
  Tensor row = Tensor::Broadcast(TERN_DTYPE_F64, {4, 3}, {true, false});
  for (int64_t i = 0; i < 3; ++i) row.Set(i, std::vector<double>{1.0 / 7.0, 2.0, -3.0}[i]);
  Tensor full(TERN_DTYPE_F64, {4, 3}), sum(TERN_DTYPE_F64, {4, 3});
  for (int64_t i = 0; i < 12; ++i) full.Set(i, 1e-17 * static_cast<double>(i));
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&sum, &full, &row}, {TERN_BINARY_ADD}).ok());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(sum.Get(i), full.Get(i) + row.Get(i % 3)) << i;
}

TEST(F64Test, UnaryFunctionsAndWhere) {
  const std::vector<double> values = {4.0, 1.0 / 3.0, 1e-300, 2.0, 1e300, -0.0};
  const int64_t n = static_cast<int64_t>(values.size());
  struct Case {
    tern_unary_fn_t fn;
    double (*ref)(double);
  };
  const Case cases[] = {
      {TERN_UNARY_NEG, [](double x) { return -x; }},
      {TERN_UNARY_ABS, [](double x) { return std::fabs(x); }},
      {TERN_UNARY_RECIPROCAL, [](double x) { return 1.0 / x; }},
      {TERN_UNARY_SQRT, [](double x) { return std::sqrt(x); }},
      {TERN_UNARY_RSQRT, [](double x) { return 1.0 / std::sqrt(x); }},
      {TERN_UNARY_EXP, [](double x) { return std::exp(x); }},
      {TERN_UNARY_LOG, [](double x) { return std::log(x); }},
      {TERN_UNARY_SIN, [](double x) { return std::sin(x); }},
      {TERN_UNARY_COS, [](double x) { return std::cos(x); }},
  };
  for (const Case& c : cases) {
    Tensor in = F64(values);
    Tensor out(TERN_DTYPE_F64, {n});
    ASSERT_TRUE(Exec(TERN_OP_UNARY, {&out, &in}, {c.fn}).ok()) << isa::UnaryFnName(c.fn);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_TRUE(SameDouble(out.Get(i), c.ref(values[i])))
          << isa::UnaryFnName(c.fn) << " of " << values[i] << ": " << out.Get(i);
    }
  }
  Tensor cond(TERN_DTYPE_BOOL, {n});
  for (int64_t i = 0; i < n; ++i) cond.SetInt(i, i % 2);
  Tensor a = F64(values), b = F64(std::vector<double>(values.rbegin(), values.rend()));
  Tensor out(TERN_DTYPE_F64, {n});
  ASSERT_TRUE(Exec(TERN_OP_WHERE, {&out, &cond, &a, &b}).ok());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(SameDouble(out.Get(i), i % 2 ? values[i] : values[n - 1 - i])) << i;
  }
}

isa::OperandDesc Desc(tern_dtype_t dtype, std::vector<int64_t> shape) {
  return Tensor(dtype, shape).desc();
}

TEST(F64Test, EveryOtherUseIsRefusedByName) {
  const isa::OperandDesc d = Desc(TERN_DTYPE_F64, {4, 4});
  const isa::OperandDesc f = Desc(TERN_DTYPE_F32, {4, 4});
  struct Refused {
    uint32_t opcode;
    std::vector<isa::OperandDesc> operands;
    std::vector<int64_t> ints;
    const char* named;
  };
  const std::vector<Refused> refused = {
      {TERN_OP_MATMUL, {d, d, d}, {}, "matmul"},
      {TERN_OP_BINARY, {d, d, d}, {TERN_BINARY_POW}, "pow"},
      {TERN_OP_UNARY, {d, d}, {TERN_UNARY_TANH}, "tanh"},
      {TERN_OP_REDUCE, {Desc(TERN_DTYPE_F64, {4, 1}), d}, {TERN_REDUCE_SUM, 1}, "reduce"},
      {TERN_OP_SOFTMAX, {d, d}, {1, 0}, "softmax"},
      {TERN_OP_BINARY, {f, d, d}, {TERN_BINARY_ADD}, "out must have"},  // its own rule
  };
  for (const Refused& r : refused) {
    const Status st = isa::ValidateInstruction(r.opcode, r.operands, r.ints, {});
    ASSERT_FALSE(st.ok()) << r.named;
    EXPECT_NE(st.message().find(r.named), std::string::npos) << st.message();
    if (r.opcode != TERN_OP_BINARY || r.ints[0] != TERN_BINARY_ADD) {
      EXPECT_NE(st.message().find("f64"), std::string::npos) << st.message();
    }
  }
}

TEST(F64Test, AnyF64OperandRequiresTheFeature) {
  const isa::OperandDesc d = Desc(TERN_DTYPE_F64, {8});
  const isa::OperandDesc f = Desc(TERN_DTYPE_F32, {8});
  const std::vector<isa::OperandDesc> cast_in = {f, d}, cast_out = {d, f}, plain = {f, f};
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_CAST, cast_in, {}), TERN_FEATURE_F64);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_CAST, cast_out, {}), TERN_FEATURE_F64);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_CAST, plain, {}), 0u);
  EXPECT_EQ(isa::FeatureNames(TERN_FEATURE_F64), "f64");
  EXPECT_EQ(isa::DTypeSize(TERN_DTYPE_F64), 8u);
  EXPECT_STREQ(isa::DTypeName(TERN_DTYPE_F64), "f64");
}

}  // namespace
}  // namespace tern::testing
