// The ISA rules: names, sizes, operand extents, and ValidateInstruction:
// every rule accepts a good instruction and rejects a bad one with the code
// and a message that names the problem.
#include "common/isa_rules.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace tern::isa {
namespace {

using Shape = std::vector<int64_t>;

OperandDesc D(tern_dtype_t dtype, Shape shape, Shape strides = {},
              tern_segment_t segment = TERN_SEGMENT_OUTPUT) {
  OperandDesc d;
  d.segment = segment;
  d.dtype = dtype;
  d.rank = static_cast<uint32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  if (strides.empty()) {
    SetContiguousStrides(&d);
  } else {
    for (size_t i = 0; i < strides.size(); ++i) d.strides[i] = strides[i];
  }
  return d;
}

OperandDesc None() { return OperandDesc{}; }

Status V(uint32_t op, std::vector<OperandDesc> ops, std::vector<int64_t> ints = {},
         std::vector<double> floats = {}) {
  return ValidateInstruction(op, ops, ints, floats);
}

::testing::AssertionResult Rejects(const Status& s, const std::vector<std::string>& words,
                                   tern_status_t code = TERN_ERROR_EXECUTABLE_INVALID) {
  if (s.ok()) return ::testing::AssertionFailure() << "accepted";
  if (s.code() != code) {
    return ::testing::AssertionFailure()
           << "code " << s.code() << " (expected " << code << "): " << s.message();
  }
  for (const std::string& w : words) {
    if (s.message().find(w) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << w << "\": " << s.message();
    }
  }
  return ::testing::AssertionSuccess() << s.message();
}

#define EXPECT_OK(expr)                   \
  do {                                    \
    Status s_ = (expr);                   \
    EXPECT_TRUE(s_.ok()) << s_.message(); \
  } while (0)

constexpr auto F32 = TERN_DTYPE_F32;
constexpr auto BF16 = TERN_DTYPE_BF16;
constexpr auto I32 = TERN_DTYPE_I32;
constexpr auto I64 = TERN_DTYPE_I64;
constexpr auto BOOL = TERN_DTYPE_BOOL;

TEST(IsaNamesTest, NamesEnginesAndSizes) {
  EXPECT_STREQ(OpcodeName(TERN_OP_MATMUL), "matmul");
  EXPECT_STREQ(OpcodeName(TERN_OP_SCATTER_ADD_ALONG_AXIS), "scatter_add_along_axis");
  EXPECT_EQ(OpcodeName(0x0299), nullptr);
  EXPECT_EQ(OpcodeEngine(TERN_OP_CONV2D), TERN_ENGINE_TENSOR);
  EXPECT_EQ(OpcodeEngine(TERN_OP_UNARY), TERN_ENGINE_SCALAR);
  EXPECT_EQ(OpcodeEngine(TERN_OP_SEM_WAIT), TERN_ENGINE_SYNC);
  EXPECT_EQ(OpcodeEngine(0x0999), 0);
  EXPECT_STREQ(EngineName(TERN_ENGINE_GPSIMD), "gpsimd");
  EXPECT_STREQ(UnaryFnName(TERN_UNARY_GELU_TANH), "gelu_tanh");
  EXPECT_STREQ(UnaryFnName(TERN_UNARY_BITWISE_NOT), "bitwise_not");
  EXPECT_EQ(UnaryFnName(TERN_UNARY_COUNT), nullptr);
  EXPECT_EQ(UnaryFnName(-1), nullptr);
  EXPECT_STREQ(BinaryFnName(TERN_BINARY_COPYSIGN), "copysign");
  EXPECT_STREQ(ReduceFnName(TERN_REDUCE_ARGMIN), "argmin");
  EXPECT_STREQ(RandomFnName(TERN_RANDOM_BERNOULLI), "bernoulli");
  EXPECT_EQ(DTypeSize(TERN_DTYPE_BF16), 2u);
  EXPECT_EQ(DTypeSize(TERN_DTYPE_I64), 8u);
  EXPECT_EQ(DTypeSize(TERN_DTYPE_BOOL), 1u);
  EXPECT_EQ(DTypeSize(static_cast<tern_dtype_t>(42)), 0u);
  EXPECT_STREQ(DTypeName(static_cast<tern_dtype_t>(42)), "unknown");
  EXPECT_TRUE(IsFloat(TERN_DTYPE_F16));
  EXPECT_FALSE(IsInteger(TERN_DTYPE_BOOL));
  EXPECT_EQ(DescribeOperand(D(F32, {4, 8})), "[4, 8] f32");
  EXPECT_EQ(DescribeOperand(D(F32, {4, 8}, {1, 4})), "[4, 8] f32 strides [1, 4]");
  EXPECT_EQ(DescribeOperand(D(I64, {})), "[] i64");
  EXPECT_EQ(MaxOperands(TERN_OP_LAYER_NORM), 6u);
  EXPECT_STREQ(OperandName(TERN_OP_MATMUL, 3), "bias");
  EXPECT_TRUE(OperandIsOptional(TERN_OP_MATMUL, 3));
  EXPECT_FALSE(OperandIsOptional(TERN_OP_MATMUL, 2));
  EXPECT_TRUE(OperandIsWritten(TERN_OP_LAYER_NORM, 2));
  EXPECT_FALSE(OperandIsWritten(TERN_OP_LAYER_NORM, 3));
}

TEST(IsaExtentTest, ExtentsAndOverflow) {
  uint64_t b = 0, e = 0;
  OperandDesc d = D(F32, {4, 8});
  d.offset = 64;
  ASSERT_TRUE(OperandExtent(d, &b, &e).ok());
  EXPECT_EQ(b, 64u);
  EXPECT_EQ(e, 64u + 128u);
  // Transposed view: same bytes.
  ASSERT_TRUE(OperandExtent(D(F32, {8, 4}, {1, 8}), &b, &e).ok());
  EXPECT_EQ(e - b, 128u);
  // Broadcast: one row.
  ASSERT_TRUE(OperandExtent(D(BF16, {1000, 3}, {0, 1}), &b, &e).ok());
  EXPECT_EQ(e - b, 6u);
  // Empty: nothing.
  ASSERT_TRUE(OperandExtent(D(F32, {0, 1000000}), &b, &e).ok());
  EXPECT_EQ(e, b);
  // Rank 0: one element.
  ASSERT_TRUE(OperandExtent(D(I64, {}), &b, &e).ok());
  EXPECT_EQ(e - b, 8u);
  EXPECT_FALSE(OperandExtent(D(F32, {1LL << 40, 1LL << 40}, {1LL << 40, 1}), &b, &e).ok());
  OperandDesc near_end = D(F32, {2});
  near_end.offset = std::numeric_limits<uint64_t>::max() - 4;
  EXPECT_FALSE(OperandExtent(near_end, &b, &e).ok());
  EXPECT_FALSE(OperandExtent(D(F32, {4}, {-1}), &b, &e).ok());
  EXPECT_FALSE(OperandExtent(D(F32, {-4}), &b, &e).ok());
  EXPECT_FALSE(OperandExtent(D(static_cast<tern_dtype_t>(9), {4}), &b, &e).ok());
  OperandDesc big_rank = D(F32, {1});
  big_rank.rank = 9;
  EXPECT_FALSE(OperandExtent(big_rank, &b, &e).ok());
}

// Hostile shapes: strides that do not fit saturate instead of overflowing
// (UBSan checks the arithmetic in the ASan build), and the element count is
// never formed, so shapes whose strides fit are exact up to the last bit.
TEST(IsaExtentTest, ContiguousStridesNeverOverflow) {
  OperandDesc d;
  d.rank = 3;
  d.shape = {1LL << 40, 1LL << 40, 1LL << 40};
  EXPECT_FALSE(SetContiguousStrides(&d));
  EXPECT_EQ(d.strides[2], 1);
  EXPECT_EQ(d.strides[1], 1LL << 40);
  EXPECT_EQ(d.strides[0], std::numeric_limits<int64_t>::max());
  // Empty, with huge dimensions: the stride of dimension 1 does not fit;
  // dimension 0's is 0 times it, which is exact again.
  d.rank = 4;
  d.shape = {3, 0, 1LL << 62, 1LL << 62};
  EXPECT_FALSE(SetContiguousStrides(&d));
  EXPECT_EQ(d.strides[3], 1);
  EXPECT_EQ(d.strides[2], 1LL << 62);
  EXPECT_EQ(d.strides[1], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(d.strides[0], 0);
  // The largest strides that fit: [2, 2^62] has strides [2^62, 1] although
  // its 2^63 elements do not fit in int64.
  d.rank = 2;
  d.shape = {2, 1LL << 62};
  EXPECT_TRUE(SetContiguousStrides(&d));
  EXPECT_EQ(d.strides[0], 1LL << 62);
  EXPECT_EQ(d.strides[1], 1);
  d.rank = 8;
  d.shape = {std::numeric_limits<int64_t>::max(), 1, 1, 1, 1, 1, 1, 1};
  EXPECT_TRUE(SetContiguousStrides(&d));
  EXPECT_EQ(d.strides[0], 1);
  d.shape = {1, 1, 1, 1, 1, 1, 3, std::numeric_limits<int64_t>::max()};
  EXPECT_FALSE(SetContiguousStrides(&d));
  EXPECT_EQ(d.strides[6], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(d.strides[5], std::numeric_limits<int64_t>::max());
  // Negative dimensions (a hostile file) are reported, not trusted.
  d.rank = 2;
  d.shape = {4, -3};
  EXPECT_FALSE(SetContiguousStrides(&d));
  // Ordinary shapes, and rank 0.
  d.rank = 3;
  d.shape = {2, 3, 4};
  EXPECT_TRUE(SetContiguousStrides(&d));
  EXPECT_EQ(d.strides[0], 12);
  EXPECT_EQ(d.strides[1], 4);
  EXPECT_EQ(d.strides[2], 1);
  d.rank = 0;
  EXPECT_TRUE(SetContiguousStrides(&d));
}

TEST(IsaValidateTest, StructureOfOperands) {
  EXPECT_TRUE(Rejects(V(0x0250, {}), {"unknown opcode 0x0250"}, TERN_ERROR_EXECUTABLE_UNSUPPORTED));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_COPY, {D(F32, {2})}), {"copy", "takes 2 operands [dst, src], got 1"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {2, 2}), D(F32, {2, 2})}),
                      {"matmul: takes 3 to 5 operands [out, a, b, bias?, residual?], got 2"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_COPY, {D(F32, {2}), None()}), {"operand 1 (src) is required but absent"}));
  // Operand sanity.
  OperandDesc neg = D(F32, {2, -1}, {1, 1});
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {2}), neg}), {"src has negative dimension 1"}));
  OperandDesc rank9 = D(F32, {1});
  rank9.rank = 9;
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {2}), rank9}), {"src has rank 9", "maximum is 8"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {2}), D(F32, {2}, {-1})}), {"negative stride"}));
  OperandDesc bad_dtype = D(F32, {2});
  bad_dtype.dtype = static_cast<tern_dtype_t>(17);
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {2}), bad_dtype}), {"unknown dtype 17"}));
  OperandDesc bad_segment = D(F32, {2});
  bad_segment.segment = static_cast<tern_segment_t>(7);
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {2}), bad_segment}), {"unknown segment 7"}));
  OperandDesc constant = D(F32, {2}, {}, TERN_SEGMENT_CONSTANT);
  constant.index = 3;
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {2}), constant}), {"index must be 0"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {1LL << 32, 1LL << 32}, {0, 0}),
                                       D(F32, {1LL << 32, 1LL << 32}, {0, 0})}),
                      {"element count overflows"}));
  // Written operands: not inputs or constants, no broadcasting.
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(F32, {2}, {}, TERN_SEGMENT_CONSTANT)}, {}, {1.0}),
                      {"dst is written but lies in the constants segment"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(F32, {2}, {}, TERN_SEGMENT_INPUT)}, {}, {1.0}),
                      {"input segment"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(F32, {4, 3}, {0, 1})}, {}, {1.0}),
                      {"overlap", "cannot broadcast"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(F32, {4, 3}, {2, 1})}, {}, {1.0}), {"overlap"}));
  EXPECT_OK(V(TERN_OP_FILL, {D(F32, {4, 3}, {1, 4})}, {}, {1.0}));  // transposed is fine
  EXPECT_OK(V(TERN_OP_FILL, {D(F32, {1, 3}, {0, 1}, TERN_SEGMENT_SCRATCH)}, {},
              {1.0}));  // size-1 dims any stride
  // Sync: no operands.
  EXPECT_OK(V(TERN_OP_SEM_SIGNAL, {}, {3, 1}));
  EXPECT_OK(V(TERN_OP_SEM_WAIT, {}, {3, 2}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SEM_WAIT, {D(F32, {1})}, {3, 2}), {"takes no operands, got 1"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_SEM_SIGNAL, {}, {kMaxSemaphores, 1}), {"semaphore 256 is out of range"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SEM_SIGNAL, {}, {0, 0}), {"increment 0"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SEM_WAIT, {}, {0}), {"takes 2 ints"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SEM_WAIT, {}, {0, -1}), {"value -1"}));
}

TEST(IsaValidateTest, CopyCastFill) {
  EXPECT_OK(V(TERN_OP_COPY, {D(F32, {3, 4}), D(F32, {3, 4}, {1, 3})}));
  EXPECT_OK(V(TERN_OP_COPY, {D(F32, {3, 4}), D(F32, {3, 4}, {0, 1})}));
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {3, 4}), D(F32, {4, 3})}),
                      {"src is [4, 3] f32 but dst is [3, 4] f32"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {3}), D(I32, {3})}), {"dtypes must be equal"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_COPY, {D(F32, {3}), D(F32, {3})}, {1}), {"takes 0 ints"}));
  EXPECT_OK(V(TERN_OP_CAST, {D(BOOL, {3}), D(BF16, {3})}));
  EXPECT_TRUE(Rejects(V(TERN_OP_CAST, {D(BOOL, {3}), D(BF16, {2})}), {"shapes must be equal"}));
  EXPECT_OK(V(TERN_OP_FILL, {D(I32, {3})}, {-7}));
  EXPECT_OK(V(TERN_OP_FILL, {D(BF16, {3})}, {}, {0.5}));
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(I32, {3})}, {}, {1.0}), {"ints[0]"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(F32, {3})}, {1}), {"floats[0]"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_FILL, {D(TERN_DTYPE_I8, {3})}, {200}), {"value 200 does not fit", "i8"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_FILL, {D(BOOL, {3})}, {2}), {"does not fit"}));
}

TEST(IsaValidateTest, Matmul) {
  EXPECT_OK(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2})}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {9, 2})}),
              {"matmul: a is [4, 8] f32 but b is [9, 2] f32: inner dimensions 8 and 9 differ"}));
  // Transposes.
  EXPECT_OK(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {8, 4}), D(F32, {2, 8})}, {1, 1}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {8, 4}), D(F32, {2, 8})}, {1, 0}),
                      {"(transposed)", "inner dimensions"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {5, 2}), D(F32, {4, 8}), D(F32, {8, 2})}),
                      {"a has 4 rows, out has 5"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 3}), D(F32, {4, 8}), D(F32, {8, 2})}),
                      {"b has 2 columns"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2})}, {2}),
                      {"0 or 1"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_MATMUL, {D(F32, {4}), D(F32, {4}), D(F32, {4})}), {"rank 2 or more"}));
  // Batches: equal shapes, broadcast by stride 0.
  EXPECT_OK(
      V(TERN_OP_MATMUL, {D(F32, {3, 4, 2}), D(F32, {3, 4, 8}), D(F32, {3, 8, 2}, {0, 2, 1})}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {3, 4, 2}), D(F32, {3, 4, 8}), D(F32, {1, 8, 2})}),
                      {"batch dimension 0 is 1 in b and 3 in out"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {3, 4, 2}), D(F32, {4, 8}), D(F32, {3, 8, 2})}),
                      {"out's rank"}));
  // Dtypes.
  EXPECT_OK(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(BF16, {4, 8}), D(BF16, {8, 2})}));
  EXPECT_OK(V(TERN_OP_MATMUL, {D(I32, {4, 2}), D(I32, {4, 8}), D(I32, {8, 2})}, {}, {2.0, 1.0}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_MATMUL, {D(I32, {4, 2}), D(I32, {4, 8}), D(I32, {8, 2})}, {}, {0.5}),
              {"integral"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(BF16, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2})}),
                      {"out must have a's dtype"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(BF16, {8, 2})}),
                      {"dtypes must be equal"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_MATMUL, {D(BOOL, {4, 2}), D(BOOL, {4, 8}), D(BOOL, {8, 2})}), {"bool"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2})}, {}, {1.0, NAN}),
              {"must be finite"}));
  // Bias: [N] or out's shape.
  EXPECT_OK(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2}), D(F32, {2})}));
  EXPECT_OK(
      V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2}), D(F32, {4, 2}, {1, 0})}));
  EXPECT_OK(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2}), None()}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_MATMUL, {D(F32, {4, 2}), D(F32, {4, 8}), D(F32, {8, 2}), D(F32, {4})}),
              {"bias is [4] f32", "N = 2"}));
}

TEST(IsaValidateTest, Conv2d) {
  const std::vector<int64_t> p = {1, 1, 1, 1, 1, 1, 1};
  EXPECT_OK(V(TERN_OP_CONV2D,
              {D(F32, {2, 8, 5, 5}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3}), D(F32, {8})}, p));
  EXPECT_OK(V(TERN_OP_CONV2D,
              {D(F32, {2, 8, 3, 3}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})}));  // defaults
  EXPECT_TRUE(Rejects(
      V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})}, {1, 1}),
      {"takes 7 ints"}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_CONV2D, {D(F32, {2, 8, 4, 4}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})}, p),
      {"spatial size [5, 5]"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 6, 5, 5}), D(F32, {8, 3, 3, 3})},
                {1, 1, 1, 1, 1, 1, 4}),
              {"6 channels are not divisible by groups = 4"}));
  EXPECT_OK(V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 6, 5, 5}), D(F32, {8, 3, 3, 3})},
              {1, 1, 1, 1, 1, 1, 2}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 6, 5, 5}), D(F32, {8, 6, 3, 3})},
                {1, 1, 1, 1, 1, 1, 2}),
              {"C / groups = 3"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})},
                {0, 1, 1, 1, 1, 1, 1}),
              {"stride_h (ints[0]) is 0"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})},
                {1, 1, -1, 1, 1, 1, 1}),
              {"pad_h"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 5, 5}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})},
                {1, 1, 1, 1, 0, 1, 1}),
              {"dilation_h"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 1, 1}), D(F32, {2, 3, 2, 2}), D(F32, {8, 3, 3, 3})}),
              {"does not fit the padded input"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(I32, {2, 8, 3, 3}), D(I32, {2, 3, 5, 5}), D(I32, {8, 3, 3, 3})}),
              {"float dtype"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_CONV2D, {D(F32, {2, 8, 3, 3}), D(F32, {2, 3, 5, 5}),
                                         D(F32, {8, 3, 3, 3}), D(F32, {3})}),
                      {"one element per output channel"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_CONV2D, {D(F32, {3, 8, 3, 3}), D(F32, {2, 3, 5, 5}), D(F32, {8, 3, 3, 3})}),
              {"batch sizes differ"}));
  // Backward forms: grad_input/grad_weight take the roles of input/weight.
  EXPECT_OK(V(TERN_OP_CONV2D_BACKWARD_INPUT,
              {D(F32, {2, 3, 6, 6}), D(F32, {2, 8, 3, 3}), D(F32, {8, 3, 3, 3})},
              {2, 2, 1, 1, 1, 1, 1}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_CONV2D_BACKWARD_INPUT,
        {D(F32, {2, 3, 9, 9}), D(F32, {2, 8, 3, 3}), D(F32, {8, 3, 3, 3})}, {2, 2, 1, 1, 1, 1, 1}),
      {"grad_out is [2, 8, 3, 3]", "spatial size [5, 5]"}));
  EXPECT_OK(V(TERN_OP_CONV2D_BACKWARD_WEIGHT,
              {D(F32, {8, 3, 3, 3}), D(F32, {2, 8, 3, 3}), D(F32, {2, 3, 5, 5})}));
}

TEST(IsaValidateTest, BinaryWhere) {
  EXPECT_OK(V(TERN_OP_BINARY, {D(F32, {3, 4}), D(F32, {3, 4}), D(F32, {3, 4}, {0, 1})},
              {TERN_BINARY_ADD}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_BINARY, {D(F32, {3, 4}), D(F32, {3, 4}), D(F32, {1, 4})}, {TERN_BINARY_ADD}),
      {"binary add: b is [1, 4] f32 but out is [3, 4] f32", "stride 0"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_BINARY, {D(F32, {3}), D(F32, {3}), D(F32, {3})}, {99}),
                      {"unknown binary function 99"}, TERN_ERROR_EXECUTABLE_UNSUPPORTED));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_BINARY, {D(F32, {3}), D(F32, {3}), D(F32, {3})}, {}), {"takes 1 int"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_BINARY, {D(F32, {3}), D(F32, {3}), D(F32, {3})}, {TERN_BINARY_LT}),
                      {"binary lt: out is [3] f32; it must be bool"}));
  EXPECT_OK(V(TERN_OP_BINARY, {D(BOOL, {3}), D(I64, {3}), D(I64, {3})}, {TERN_BINARY_GE}));
  EXPECT_OK(V(TERN_OP_BINARY, {D(BOOL, {3}), D(F32, {3}), D(F32, {3})}, {TERN_BINARY_LOGICAL_XOR}));
  EXPECT_TRUE(Rejects(V(TERN_OP_BINARY, {D(I32, {3}), D(I32, {3}), D(I32, {3})}, {TERN_BINARY_DIV}),
                      {"binary div: a is [3] i32; div takes float dtypes", "floor_divide"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_BINARY, {D(F32, {3}), D(F32, {3}), D(F32, {3})}, {TERN_BINARY_BITWISE_AND}),
              {"integer or bool"}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_BINARY, {D(BOOL, {3}), D(BOOL, {3}), D(BOOL, {3})}, {TERN_BINARY_ADD}), {"bool"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_BINARY, {D(F32, {3}), D(F32, {3}), D(BF16, {3})}, {TERN_BINARY_MUL}),
              {"dtypes must be equal"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_BINARY, {D(BF16, {3}), D(F32, {3}), D(F32, {3})}, {TERN_BINARY_MUL}),
              {"out must have the inputs' dtype"}));
  EXPECT_OK(V(TERN_OP_WHERE, {D(F32, {3}), D(BOOL, {3}), D(F32, {3}), D(F32, {3}, {0})}));
  EXPECT_TRUE(Rejects(V(TERN_OP_WHERE, {D(F32, {3}), D(F32, {3}), D(F32, {3}), D(F32, {3})}),
                      {"cond", "bool"}));
}

TEST(IsaValidateTest, UnaryAndBackward) {
  EXPECT_OK(V(TERN_OP_UNARY, {D(BF16, {3}), D(BF16, {3})}, {TERN_UNARY_GELU}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(I32, {3}), D(I32, {3})}, {TERN_UNARY_EXP}),
                      {"unary exp: in is [3] i32; exp takes float dtypes"}));
  EXPECT_OK(V(TERN_OP_UNARY, {D(I32, {3}), D(I32, {3})}, {TERN_UNARY_ABS}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(BOOL, {3}), D(BOOL, {3})}, {TERN_UNARY_NEG}), {"bool"}));
  EXPECT_OK(V(TERN_OP_UNARY, {D(BOOL, {3}), D(F32, {3})}, {TERN_UNARY_ISNAN}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_ISNAN}), {"must be bool"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_BITWISE_NOT}),
                      {"integer or bool"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_COUNT}),
                      {"unknown unary function"}, TERN_ERROR_EXECUTABLE_UNSUPPORTED));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_CLAMP}, {0.0}),
                      {"takes 2 floats"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_CLAMP}, {0.0, NAN}),
                      {"NaN"}));
  EXPECT_OK(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_CLAMP}, {-INFINITY, 1.0}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_EXP}, {1.0}),
                      {"takes 0 floats"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_SOFTPLUS}, {0.0}),
                      {"beta"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(F32, {3})}, {TERN_UNARY_POW_SCALAR}), {"exponent"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_UNARY, {D(F32, {3}), D(BF16, {3})}, {TERN_UNARY_RELU}),
                      {"dtypes must be equal"}));
  EXPECT_OK(V(TERN_OP_UNARY_BACKWARD, {D(F32, {3}), D(F32, {3}), D(F32, {3})}, {TERN_UNARY_SILU}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_UNARY_BACKWARD, {D(BOOL, {3}), D(F32, {3}), D(F32, {3})}, {TERN_UNARY_ISNAN}),
      {"isnan has no gradient"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_UNARY_BACKWARD, {D(I32, {3}), D(I32, {3}), D(I32, {3})}, {TERN_UNARY_ABS}),
              {"float dtype"}));
}

TEST(IsaValidateTest, Reduce) {
  EXPECT_OK(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {TERN_REDUCE_SUM, 1}));
  EXPECT_OK(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {TERN_REDUCE_SUM, -1}));
  EXPECT_OK(V(TERN_OP_REDUCE, {D(F32, {1, 1}), D(F32, {3, 4})}, {TERN_REDUCE_MAX}));  // all axes
  EXPECT_OK(V(TERN_OP_REDUCE, {D(F32, {}), D(F32, {})}, {TERN_REDUCE_SUM}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3}), D(F32, {3, 4})}, {TERN_REDUCE_SUM, 1}),
                      {"reduce sum: out is [3] f32 but in is [3, 4] f32", "keeps in's rank"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 4}), D(F32, {3, 4})}, {TERN_REDUCE_SUM, 1}),
                      {"dimension 1 must be 1 (reduced)"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {TERN_REDUCE_SUM, 2}),
                      {"axis 2 is out of range for rank 2"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {TERN_REDUCE_SUM, 1, -1}),
                      {"axis 1 is given twice"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {TERN_REDUCE_ARGMAX, 1}),
                      {"reduce argmax: out is [3, 1] f32; it must be i64"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {TERN_REDUCE_ANY, 1}),
                      {"must be bool"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(I32, {3, 1}), D(I32, {3, 4})}, {TERN_REDUCE_MEAN, 1}),
                      {"float dtype"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 0})}, {TERN_REDUCE_MAX, 1}),
                      {"has size 0", "empty set"}));
  EXPECT_OK(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 0})}, {TERN_REDUCE_SUM, 1}));
  EXPECT_OK(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(BF16, {3, 4})}, {TERN_REDUCE_SUM, 1}));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {12, 1}),
                      {"unknown reduce function 12"}, TERN_ERROR_EXECUTABLE_UNSUPPORTED));
  EXPECT_TRUE(Rejects(V(TERN_OP_REDUCE, {D(F32, {3, 1}), D(F32, {3, 4})}, {}), {"takes ints"}));
}

TEST(IsaValidateTest, SoftmaxAndNorms) {
  EXPECT_OK(V(TERN_OP_SOFTMAX, {D(F32, {3, 4}), D(F32, {3, 4})}, {-1, 1}));
  EXPECT_OK(V(TERN_OP_SOFTMAX, {D(F32, {}), D(F32, {})}, {0}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SOFTMAX, {D(F32, {3, 4}), D(F32, {3, 4})}, {2}),
                      {"axis 2 is out of range"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SOFTMAX, {D(F32, {3, 4}), D(F32, {3, 4})}, {1, 2}),
                      {"log (ints[1]) is 2"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SOFTMAX, {D(I32, {3, 4}), D(I32, {3, 4})}, {1}), {"float dtype"}));
  EXPECT_OK(V(TERN_OP_SOFTMAX_BACKWARD, {D(F32, {3, 4}), D(F32, {3, 4}), D(F32, {3, 4})}, {1, 0}));
  // layer norm [out, mean?, rstd?, in, weight?, bias?]
  EXPECT_OK(V(TERN_OP_LAYER_NORM,
              {D(F32, {2, 3, 4}), D(F32, {2, 3}), D(F32, {2, 3}), D(F32, {2, 3, 4}), D(F32, {4}),
               D(F32, {4})},
              {1}, {1e-5}));
  EXPECT_OK(
      V(TERN_OP_LAYER_NORM, {D(F32, {2, 3, 4}), None(), None(), D(F32, {2, 3, 4})}, {2}, {1e-5}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_LAYER_NORM, {D(F32, {2, 3, 4}), None(), None(), D(F32, {2, 3, 4})}, {1}, {0.0}),
      {"eps (floats[0]) is 0"}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_LAYER_NORM, {D(F32, {2, 3, 4}), None(), None(), D(F32, {2, 3, 4})}, {1}, {}),
      {"takes 1 float"}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_LAYER_NORM, {D(F32, {2, 3, 4}), None(), None(), D(F32, {2, 3, 4})}, {4}, {1e-5}),
      {"must be in [1, 3]"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_LAYER_NORM,
                {D(F32, {2, 3, 4}), D(F32, {2, 3, 1}), None(), D(F32, {2, 3, 4})}, {1}, {1e-5}),
              {"mean is [2, 3, 1] f32", "leading shape [2, 3]"}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_LAYER_NORM, {D(F32, {2, 3, 4}), None(), None(), D(F32, {2, 3, 4}), D(F32, {3, 4})},
        {1}, {1e-5}),
      {"weight is [3, 4] f32", "normalized shape [4]"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_LAYER_NORM, {D(F32, {2, 3, 4})}, {1}, {1e-5}), {"takes 4 to 6 operands"}));
  EXPECT_OK(V(TERN_OP_LAYER_NORM_BACKWARD,
              {D(F32, {2, 4}), D(F32, {4}), None(), D(F32, {2, 4}), D(F32, {2, 4}), D(F32, {2}),
               D(F32, {2}), D(F32, {4})},
              {1}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_LAYER_NORM_BACKWARD,
        {D(F32, {2, 4}), None(), None(), D(F32, {2, 4}), D(F32, {2, 4}), None(), D(F32, {2})}, {1}),
      {"operand 5 (mean) is required"}));
  EXPECT_OK(V(TERN_OP_RMS_NORM, {D(BF16, {2, 4}), D(F32, {2}), D(BF16, {2, 4}), D(BF16, {4})}, {1},
              {1e-6}));
  EXPECT_OK(V(TERN_OP_RMS_NORM_BACKWARD,
              {D(F32, {2, 4}), D(F32, {4}), D(F32, {2, 4}), D(F32, {2, 4}), D(F32, {2})}, {1}));
}

TEST(IsaValidateTest, IndexOps) {
  // gather [out, table, indices]
  EXPECT_OK(V(TERN_OP_GATHER, {D(F32, {2, 3, 8}), D(F32, {10, 8}), D(I64, {2, 3})}, {0}));
  EXPECT_OK(V(TERN_OP_GATHER, {D(F32, {10}), D(F32, {10, 8}), D(I32, {})}, {1}));
  EXPECT_TRUE(Rejects(V(TERN_OP_GATHER, {D(F32, {2, 8}), D(F32, {10, 8}), D(F32, {2})}, {0}),
                      {"indices must be i32 or i64"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_GATHER, {D(F32, {3, 8}), D(F32, {10, 8}), D(I64, {2})}, {0}),
                      {"out must be [2, 8]"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_GATHER, {D(F32, {2, 8}), D(F32, {10, 8}), D(I64, {2})}, {2}),
                      {"axis 2 is out of range"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_GATHER, {D(I32, {2, 8}), D(F32, {10, 8}), D(I64, {2})}, {0}),
                      {"dtypes must be equal"}));
  // scatter_add [out, indices, src]
  EXPECT_OK(V(TERN_OP_SCATTER_ADD, {D(F32, {10, 8}), D(I64, {2, 3}), D(F32, {2, 3, 8})}, {0}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_SCATTER_ADD, {D(F32, {10, 8}), D(I64, {2, 3}), D(F32, {6, 8})}, {0}),
              {"src must be [2, 3, 8]"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_SCATTER_ADD, {D(BOOL, {10}), D(I64, {2}), D(BOOL, {2})}, {0}), {"bool"}));
  // take_along_axis [out, in, indices]
  EXPECT_OK(V(TERN_OP_TAKE_ALONG_AXIS, {D(F32, {3, 2}), D(F32, {3, 5}), D(I64, {3, 2})}, {1}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_TAKE_ALONG_AXIS, {D(F32, {4, 2}), D(F32, {3, 5}), D(I64, {4, 2})}, {1}),
              {"dimension 0 of the indices (4) exceeds in (3)"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_TAKE_ALONG_AXIS, {D(F32, {3}), D(F32, {3, 5}), D(I64, {3})}, {1}),
                      {"ranks must be equal"}));
  EXPECT_OK(
      V(TERN_OP_SCATTER_ADD_ALONG_AXIS, {D(F32, {3, 5}), D(I64, {3, 7}), D(F32, {3, 7})}, {1}));
  EXPECT_TRUE(Rejects(
      V(TERN_OP_SCATTER_ADD_ALONG_AXIS, {D(F32, {3, 5}), D(I64, {3, 7}), D(F32, {3, 6})}, {1}),
      {"shapes must be equal"}));
}

TEST(IsaValidateTest, Scan) {
  EXPECT_OK(V(TERN_OP_SCAN, {D(F32, {3, 5}), D(F32, {3, 5}, {1, 3})}, {TERN_SCAN_SUM, 1}));
  EXPECT_OK(V(TERN_OP_SCAN, {D(I64, {3, 5}), D(TERN_DTYPE_BOOL, {3, 5})}, {TERN_SCAN_SUM, -1}));
  EXPECT_OK(V(TERN_OP_SCAN, {D(I64, {3, 5}), D(TERN_DTYPE_I32, {3, 5})}, {TERN_SCAN_PROD, 0}));
  EXPECT_OK(V(TERN_OP_SCAN, {D(BF16, {}), D(BF16, {})}, {TERN_SCAN_MAX, 0}));
  EXPECT_OK(V(TERN_OP_SCAN, {D(F32, {0, 5}), D(F32, {0, 5})}, {TERN_SCAN_MIN, 0}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(F32, {3, 5}), D(F32, {3, 5})}, {TERN_SCAN_SUM}),
                      {"scan: takes 2 ints (tern_scan_fn_t, axis), got 1"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(F32, {3, 5}), D(F32, {3, 5})}, {9, 0}),
                      {"unknown scan function 9"}, TERN_ERROR_EXECUTABLE_UNSUPPORTED));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(F32, {3, 5}), D(F32, {3, 5})}, {TERN_SCAN_SUM, 2}),
                      {"scan sum", "axis 2 is out of range for rank 2"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(F32, {3, 5}), D(F32, {5, 3})}, {TERN_SCAN_SUM, 0}),
                      {"shapes must be equal"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(F32, {3}), D(BF16, {3})}, {TERN_SCAN_SUM, 0}),
                      {"dtypes must be equal", "CAST first"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(I64, {3}), D(TERN_DTYPE_I32, {3})}, {TERN_SCAN_MAX, 0}),
                      {"scan max", "dtypes must be equal"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SCAN, {D(TERN_DTYPE_BOOL, {3}), D(TERN_DTYPE_BOOL, {3})}, {0, 0}),
                      {"bool is not allowed"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_SCAN, {D(F32, {3}), D(F32, {3})}, {0, 0}, {1.0}), {"takes 0 floats"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_SCAN, {D(F32, {2, 2}, {1, 1}), D(F32, {2, 2})}, {0, 0}), {"overlap"}));
}

TEST(IsaValidateTest, SortAndTopk) {
  EXPECT_OK(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I64, {3, 5}), D(F32, {3, 5}, {1, 3})}, {1, 0}));
  EXPECT_OK(V(TERN_OP_SORT, {D(I32, {}), D(I64, {}), D(I32, {})}, {-1, 1}));
  EXPECT_OK(V(TERN_OP_TOPK, {D(F32, {3, 2}), D(I64, {3, 2}), D(F32, {3, 5})}, {-1, 1}));
  EXPECT_OK(V(TERN_OP_TOPK, {D(F32, {0, 5}), D(I64, {0, 5}), D(F32, {3, 5})}, {0, 0}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I64, {3, 5})}, {1, 0}),
                      {"sort: takes 3 operands [values, indices, in], got 2"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I64, {3, 5}), D(F32, {3, 5})}, {1}),
                      {"takes 2 ints (axis, descending)"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I64, {3, 5}), D(F32, {3, 5})}, {-3, 0}),
                      {"axis -3 is out of range for rank 2"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I64, {3, 5}), D(F32, {3, 5})}, {0, 2}),
                      {"ints[1] (descending) is 2; it must be 0 or 1"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I32, {3, 5}), D(F32, {3, 5})}, {0, 0}),
                      {"indices is [3, 5] i32; it must be i64"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(BF16, {3, 5}), D(I64, {3, 5}), D(F32, {3, 5})}, {0, 0}),
                      {"dtypes must be equal"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 4}), D(I64, {3, 4}), D(F32, {3, 5})}, {0, 0}),
                      {"values is [3, 4] f32 but in is [3, 5] f32"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_SORT, {D(F32, {3, 5}), D(I64, {3, 4}), D(F32, {3, 5})}, {0, 0}),
                      {"indices is [3, 4] i64 but values is [3, 5] f32"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_TOPK, {D(F32, {3, 6}), D(I64, {3, 6}), D(F32, {3, 5})}, {1, 1}),
                      {"topk: values is [3, 6] f32 but in is [3, 5] f32", "k <= 5"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_TOPK, {D(F32, {2, 2}), D(I64, {2, 2}), D(F32, {3, 5})}, {1, 1}),
                      {"except along axis 1"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_TOPK, {D(F32, {3, 2}), D(I64, {3, 2}), D(F32, {3, 5})}, {1, 3}),
                      {"ints[1] (largest) is 3"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_TOPK, {D(F32, {3, 2}), D(I64, {3, 2}, {0, 1}), D(F32, {3, 5})}, {1, 1}),
              {"indices is written", "overlap"}));
}

TEST(IsaValidateTest, IotaRandomAllReduce) {
  EXPECT_OK(V(TERN_OP_IOTA, {D(I64, {3, 4})}, {1}, {5, -2}));
  EXPECT_OK(V(TERN_OP_IOTA, {D(F32, {})}, {0}));
  EXPECT_TRUE(Rejects(V(TERN_OP_IOTA, {D(I64, {3, 4})}, {1}, {0.5}), {"integral"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_IOTA, {D(I64, {3, 4})}, {2}), {"axis 2"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_IOTA, {D(BOOL, {3})}, {0}), {"bool"}));
  EXPECT_OK(V(TERN_OP_RANDOM, {D(BF16, {3})}, {TERN_RANDOM_NORMAL, 7, 0}, {0.0, 2.0}));
  EXPECT_OK(V(TERN_OP_RANDOM, {D(BOOL, {3})}, {TERN_RANDOM_BERNOULLI, 7, 0}, {0.3}));
  EXPECT_OK(V(TERN_OP_RANDOM, {D(I64, {3})}, {TERN_RANDOM_UNIFORM, -1, 5}, {-10, 10}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_RANDOM, {D(F32, {3})}, {TERN_RANDOM_UNIFORM, 1}), {"takes 3 ints"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_RANDOM, {D(F32, {3})}, {TERN_RANDOM_UNIFORM, 1, -1}),
                      {"offset (ints[2]) is -1"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_RANDOM, {D(F32, {3})}, {TERN_RANDOM_UNIFORM, 1, 0}, {2.0, 1.0}),
                      {"low 2 must be <= high 1"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_RANDOM, {D(F32, {3})}, {TERN_RANDOM_NORMAL, 1, 0}, {0.0, -1.0}),
                      {"std -1"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_RANDOM, {D(I32, {3})}, {TERN_RANDOM_NORMAL, 1, 0}), {"float dtype"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_RANDOM, {D(F32, {3})}, {TERN_RANDOM_BERNOULLI, 1, 0}, {1.5}), {"p 1.5"}));
  EXPECT_TRUE(
      Rejects(V(TERN_OP_RANDOM, {D(TERN_DTYPE_I8, {3})}, {TERN_RANDOM_UNIFORM, 1, 0}, {0, 300}),
              {"does not fit"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_RANDOM, {D(I64, {3})}, {TERN_RANDOM_UNIFORM, 1, 0}, {0, 1e12}),
                      {"wider than 2^32"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_RANDOM, {D(F32, {3})}, {5, 1, 0}), {"unknown random function 5"},
                      TERN_ERROR_EXECUTABLE_UNSUPPORTED));
  EXPECT_OK(V(TERN_OP_ALL_REDUCE, {D(F32, {3}), D(F32, {3})}));
  EXPECT_OK(V(TERN_OP_ALL_REDUCE, {D(F32, {3}), D(F32, {3})}, {TERN_REDUCE_MAX}));
  EXPECT_TRUE(Rejects(V(TERN_OP_ALL_REDUCE, {D(F32, {3}), D(F32, {4})}), {"shapes must be equal"}));
  EXPECT_TRUE(Rejects(V(TERN_OP_ALL_REDUCE, {D(F32, {3}), D(F32, {3})}, {TERN_REDUCE_ARGMAX}),
                      {"not a collective reduction"}));
}

}  // namespace
}  // namespace tern::isa
