// The fusion extensions of the ISA (docs/isa.md, "elementwise" and the
// matmul/conv2d epilogues): a fused program gives the same bits as its steps
// run one instruction at a time (f32), rounds once for bf16/f16, handles
// broadcasting, strides, bool and in-place operands, and its rules reject
// malformed programs naming the step. The epilogues give the same bits as the
// instruction followed by `binary add` and `unary`.
#include <algorithm>
#include <cmath>
#include <random>

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

constexpr int64_t kNone = -1;

// ints of an ELEMENTWISE program: steps, then the registers of out0..out3.
std::vector<int64_t> Program(const std::vector<std::array<int64_t, 5>>& steps,
                             std::array<int64_t, 4> outputs) {
  std::vector<int64_t> ints = {static_cast<int64_t>(steps.size())};
  for (const auto& step : steps) ints.insert(ints.end(), step.begin(), step.end());
  ints.insert(ints.end(), outputs.begin(), outputs.end());
  return ints;
}

// Operands [out0..out3, in0..in7] from the given outputs and inputs.
std::vector<Tensor*> Operands(std::vector<Tensor*> outputs, std::vector<Tensor*> inputs) {
  std::vector<Tensor*> operands(4, kAbsent);
  for (size_t i = 0; i < outputs.size(); ++i) operands[i] = outputs[i];
  operands.insert(operands.end(), inputs.begin(), inputs.end());
  return operands;
}

// The program of the tests below, over a [rows, cols] a, a row-broadcast b and
// a transposed c:
//   r8 = a * b; r9 = 0.5; r10 = r8 + r9; r11 = gelu(r10); r12 = a > r9;
//   r13 = tanh(c); r14 = where(r12, r11, r13); r15 = clamp(r14, -0.75, 0.6)
// out0 = r15, out1 = r10, out2 = r12 (bool).
const std::vector<std::array<int64_t, 5>> kSteps = {
    {TERN_STEP_BINARY, TERN_BINARY_MUL, 0, 1, 0},
    {TERN_STEP_CONSTANT, 0, 0, 0, 0},
    {TERN_STEP_BINARY, TERN_BINARY_ADD, 8, 9, 0},
    {TERN_STEP_UNARY, TERN_UNARY_GELU, 10, 0, 0},
    {TERN_STEP_BINARY, TERN_BINARY_GT, 0, 9, 0},
    {TERN_STEP_UNARY, TERN_UNARY_TANH, 2, 0, 0},
    {TERN_STEP_WHERE, 0, 12, 11, 13},
    {TERN_STEP_UNARY, TERN_UNARY_CLAMP, 14, 1, 0},
};
const std::vector<double> kFloats = {0.5, -0.75, 0.6};

struct Inputs {
  Tensor a, b, c;
};

Inputs MakeInputs(tern_dtype_t dtype, int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in{Tensor(dtype, {rows, cols}), Tensor::Broadcast(dtype, {rows, cols}, {true, false}),
            Tensor::Permuted(dtype, {rows, cols}, {1, 0})};
  in.a.Randomize(rng, -3, 3);
  in.b.Randomize(rng, -2, 2);
  in.c.Randomize(rng, -2, 2);
  return in;
}

// Runs kSteps one instruction at a time on f32 tensors.
void RunUnfused(Inputs& in, Tensor* out0, Tensor* out1, Tensor* out2) {
  const Shape shape = in.a.shape();
  Tensor half = Tensor::Broadcast(TERN_DTYPE_F32, shape, {true, true});
  half.Set(0, 0.5);
  Tensor product(TERN_DTYPE_F32, shape), gelu(TERN_DTYPE_F32, shape), tanh(TERN_DTYPE_F32, shape),
      picked(TERN_DTYPE_F32, shape);
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&product, &in.a, &in.b}, {TERN_BINARY_MUL}).ok());
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {out1, &product, &half}, {TERN_BINARY_ADD}).ok());
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&gelu, out1}, {TERN_UNARY_GELU}).ok());
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {out2, &in.a, &half}, {TERN_BINARY_GT}).ok());
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&tanh, &in.c}, {TERN_UNARY_TANH}).ok());
  ASSERT_TRUE(Exec(TERN_OP_WHERE, {&picked, out2, &gelu, &tanh}).ok());
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {out0, &picked}, {TERN_UNARY_CLAMP}, {-0.75, 0.6}).ok());
}

// Runs kSteps as one program into out0 and out1 (any layouts; out2 is a
// bool [rows, cols]) and checks every output's bits against the steps run
// one instruction at a time.
void ExpectProgramMatchesTheSteps(Inputs& in, Tensor& out0, Tensor& out1) {
  const Shape shape = in.a.shape();
  Tensor out2(TERN_DTYPE_BOOL, shape);
  for (Tensor* t : {&out0, &out1, &out2}) t->Poison();
  ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&out0, &out1, &out2}, {&in.a, &in.b, &in.c}),
                   Program(kSteps, {15, 10, 12, kNone}), kFloats)
                  .ok());
  Tensor want0(TERN_DTYPE_F32, shape), want1(TERN_DTYPE_F32, shape), want2(TERN_DTYPE_BOOL, shape);
  RunUnfused(in, &want0, &want1, &want2);
  EXPECT_TRUE(SameBits(out0, want0));
  EXPECT_TRUE(SameBits(out1, want1));
  EXPECT_TRUE(SameBits(out2, want2));
}

TEST(ElementwiseProgram, SameBitsAsTheStepsOneByOne) {
  // 7 x 300 walks a few chunks per row; 300 x 700 takes the threaded path.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 300}, {300, 700}, {1, 1}}) {
    SCOPED_TRACE(ShapeStr({rows, cols}));
    Inputs in = MakeInputs(TERN_DTYPE_F32, rows, cols, 11);
    Tensor out0 = Tensor::Spaced(TERN_DTYPE_F32, {rows, cols}), out1(TERN_DTYPE_F32, {rows, cols});
    ExpectProgramMatchesTheSteps(in, out0, out1);
  }
}

// Outputs laid out transposed, like the permuted input c: the program walks
// the elements in the first output's memory order and gives the same bits.
TEST(ElementwiseProgram, TransposedOutputsSameBits) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 300}, {300, 700}}) {
    SCOPED_TRACE(ShapeStr({rows, cols}));
    Inputs in = MakeInputs(TERN_DTYPE_F32, rows, cols, 12);
    Tensor out0 = Tensor::Permuted(TERN_DTYPE_F32, {rows, cols}, {1, 0}),
           out1 = Tensor::Permuted(TERN_DTYPE_F32, {rows, cols}, {1, 0});
    ExpectProgramMatchesTheSteps(in, out0, out1);
  }
}

// An input broadcast along the rows' runs (a value per row, runs longer
// than a chunk, so the value is loaded once and kept while it repeats).
TEST(ElementwiseProgram, PerRowValuesSameBits) {
  const int64_t rows = 9, cols = 2500;
  Inputs in = MakeInputs(TERN_DTYPE_F32, rows, cols, 13);
  std::mt19937_64 rng(14);
  in.b = Tensor::Broadcast(TERN_DTYPE_F32, {rows, cols}, {false, true});
  in.b.Randomize(rng, -2, 2);
  Tensor out0(TERN_DTYPE_F32, {rows, cols}), out1(TERN_DTYPE_F32, {rows, cols});
  ExpectProgramMatchesTheSteps(in, out0, out1);
}

TEST(ElementwiseProgram, HalfPrecisionRoundsOnceAtTheEnd) {
  for (tern_dtype_t dtype : {TERN_DTYPE_BF16, TERN_DTYPE_F16}) {
    Inputs in = MakeInputs(dtype, 5, 40, 3);
    Tensor out0(dtype, {5, 40}), out1(dtype, {5, 40}), out2(TERN_DTYPE_BOOL, {5, 40});
    ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&out0, &out1, &out2}, {&in.a, &in.b, &in.c}),
                     Program(kSteps, {15, 10, 12, kNone}), kFloats)
                    .ok());
    // The same program on the values widened to f32, rounded once.
    Inputs wide = MakeInputs(TERN_DTYPE_F32, 5, 40, 3);
    for (int64_t i = 0; i < in.a.count(); ++i) {
      wide.a.Set(i, in.a.Get(i));
      wide.b.Set(i, in.b.Get(i));
      wide.c.Set(i, in.c.Get(i));
    }
    Tensor want0(TERN_DTYPE_F32, {5, 40}), want1(TERN_DTYPE_F32, {5, 40}),
        want2(TERN_DTYPE_BOOL, {5, 40});
    RunUnfused(wide, &want0, &want1, &want2);
    for (int64_t i = 0; i < out0.count(); ++i) {
      ASSERT_EQ(out0.Get(i), RoundToDtype(dtype, want0.Get(i))) << i;
      ASSERT_EQ(out1.Get(i), RoundToDtype(dtype, want1.Get(i))) << i;
      ASSERT_EQ(out2.Get(i), want2.Get(i)) << i;
    }
  }
}

TEST(ElementwiseProgram, InPlaceOutputsAndCopiesOfInputs) {
  // out0 is in0's memory (x * 2 in place); out1 stores register 0 itself,
  // which must still be the original x.
  std::mt19937_64 rng(5);
  Tensor x(TERN_DTYPE_F32, {3, 50}), copy(TERN_DTYPE_F32, {3, 50});
  x.Randomize(rng);
  const std::vector<double> original = x.Values();
  ASSERT_TRUE(
      Exec(TERN_OP_ELEMENTWISE, Operands({&x, &copy}, {&x}),
           Program({{TERN_STEP_CONSTANT, 0, 0, 0, 0}, {TERN_STEP_BINARY, TERN_BINARY_MUL, 0, 8, 0}},
                   {9, 0, kNone, kNone}),
           {2.0})
          .ok());
  for (int64_t i = 0; i < x.count(); ++i) {
    ASSERT_EQ(x.Get(i), 2 * original[i]);
    ASSERT_EQ(copy.Get(i), original[i]);
  }
}

// Step results share buffers by liveness: a long chain whose steps read
// results from several steps back, an output taken from the middle, and a
// result nobody reads must all keep their values while later steps reuse
// the buffers of dead ones.
TEST(ElementwiseProgram, LongChainsReuseDeadBuffers) {
  // The register an even step adds: three back, not before r9, and r19 (not
  // the unread r20) for r22.
  auto Back = [](int64_t k) -> int64_t { return k == 22 ? 19 : std::max<int64_t>(9, k - 3); };
  std::mt19937_64 rng(8);
  Tensor a(TERN_DTYPE_F32, {4, 2500}), mid(TERN_DTYPE_F32, {4, 2500}),
      last(TERN_DTYPE_F32, {4, 2500});
  a.Randomize(rng, -1, 1);
  // r8 = 0.5; r9 = a * r8; then for k = 10..39 an even step adds r(Back(k))
  // to r(k-1) and an odd step scales r(k-1) by r8, except r20 = neg(r19),
  // which no step reads; out0 = r25, out1 = r39.
  std::vector<std::array<int64_t, 5>> steps = {{TERN_STEP_CONSTANT, 0, 0, 0, 0},
                                               {TERN_STEP_BINARY, TERN_BINARY_MUL, 0, 8, 0}};
  for (int64_t k = 10; k < 40; ++k) {
    if (k == 20) {
      steps.push_back({TERN_STEP_UNARY, TERN_UNARY_NEG, k - 1, 0, 0});
      continue;
    }
    if (k % 2 == 0) {
      steps.push_back({TERN_STEP_BINARY, TERN_BINARY_ADD, k - 1, Back(k), 0});
    } else {
      steps.push_back({TERN_STEP_BINARY, TERN_BINARY_MUL, k - 1, 8, 0});
    }
  }
  ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&mid, &last}, {&a}),
                   Program(steps, {25, 39, kNone, kNone}), {0.5})
                  .ok());
  for (int64_t i = 0; i < a.count(); ++i) {
    std::vector<float> r(40);
    r[0] = static_cast<float>(a.Get(i));
    r[8] = 0.5f;
    r[9] = r[0] * r[8];
    for (int64_t k = 10; k < 40; ++k) {
      if (k == 20) {
        r[k] = -r[k - 1];
      } else if (k % 2 == 0) {
        r[k] = r[k - 1] + r[Back(k)];
      } else {
        r[k] = r[k - 1] * r[8];
      }
    }
    ASSERT_EQ(static_cast<float>(mid.Get(i)), r[25]) << i;
    ASSERT_EQ(static_cast<float>(last.Get(i)), r[39]) << i;
  }
}

// Runs of arithmetic steps that each take the step before them run as one
// pass in registers (a chain): every orientation (the running value on the
// left, on the right, on both sides), constants and inputs as the other
// operand, a constant step in the middle of a chain, the unary steps a chain
// takes, and results that other steps read too or that are outputs (stored
// as the chain passes: r12, r16, r18, r29, read by later chains, by their
// own chain and as an output). Lengths around the 16- and 64-element blocks,
// so the vector blocks and the scalar tail all run; the same bits as the
// operations one by one.
TEST(ElementwiseProgram, ChainsOfArithmeticGiveTheStepsBits) {
  // r8 = a - b; r9 = r8 * r8; r10 = 0.75; r11 = r10 / r9; r12 = r11 + a;
  // r13 = b - r12; r14 = r13 + r13; r15 = r10 * r14; r16 = r15 / b;
  // r17 = r16 - r16; r18 = r16 * a (not r17's: a new chain);
  // r19 = r18 / r18; r20 = r18 + r19 (r18 an output, read twice);
  // r21 = 2; r22 = r21 - r20; r23 = r22 / a; r24 = r12 + r17;
  // then unary steps: r25 = r24 ** 2; r26 = r25 ** 3; r27 = 1 / r26;
  // r28 = square(r27); r29 = -r28; r30 = abs(r29); r31 = r30 * r29;
  // r32 = -r31; r33 = sqrt(r32); r34 = rsqrt(r33).
  // out0 = r17, out1 = r18, out2 = r23, out3 = r34.
  const std::vector<std::array<int64_t, 5>> steps = {
      {TERN_STEP_BINARY, TERN_BINARY_SUB, 0, 1, 0},        // r8
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 8, 8, 0},        // r9
      {TERN_STEP_CONSTANT, 0, 0, 0, 0},                    // r10
      {TERN_STEP_BINARY, TERN_BINARY_DIV, 10, 9, 0},       // r11
      {TERN_STEP_BINARY, TERN_BINARY_ADD, 11, 0, 0},       // r12
      {TERN_STEP_BINARY, TERN_BINARY_SUB, 1, 12, 0},       // r13
      {TERN_STEP_BINARY, TERN_BINARY_ADD, 13, 13, 0},      // r14
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 10, 14, 0},      // r15
      {TERN_STEP_BINARY, TERN_BINARY_DIV, 15, 1, 0},       // r16
      {TERN_STEP_BINARY, TERN_BINARY_SUB, 16, 16, 0},      // r17
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 16, 0, 0},       // r18
      {TERN_STEP_BINARY, TERN_BINARY_DIV, 18, 18, 0},      // r19
      {TERN_STEP_BINARY, TERN_BINARY_ADD, 18, 19, 0},      // r20
      {TERN_STEP_CONSTANT, 0, 1, 0, 0},                    // r21 = 2
      {TERN_STEP_BINARY, TERN_BINARY_SUB, 21, 20, 0},      // r22
      {TERN_STEP_BINARY, TERN_BINARY_DIV, 22, 0, 0},       // r23
      {TERN_STEP_BINARY, TERN_BINARY_ADD, 12, 17, 0},      // r24
      {TERN_STEP_UNARY, TERN_UNARY_POW_SCALAR, 24, 3, 0},  // r25 = r24 ** 2
      {TERN_STEP_UNARY, TERN_UNARY_POW_SCALAR, 25, 2, 0},  // r26 = r25 ** 3
      {TERN_STEP_UNARY, TERN_UNARY_RECIPROCAL, 26, 0, 0},  // r27
      {TERN_STEP_UNARY, TERN_UNARY_SQUARE, 27, 0, 0},      // r28
      {TERN_STEP_UNARY, TERN_UNARY_NEG, 28, 0, 0},         // r29
      {TERN_STEP_UNARY, TERN_UNARY_ABS, 29, 0, 0},         // r30
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 30, 29, 0},      // r31
      {TERN_STEP_UNARY, TERN_UNARY_NEG, 31, 0, 0},         // r32
      {TERN_STEP_UNARY, TERN_UNARY_SQRT, 32, 0, 0},        // r33
      {TERN_STEP_UNARY, TERN_UNARY_RSQRT, 33, 0, 0},       // r34
  };
  std::mt19937_64 rng(21);
  for (int64_t cols : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{63}, int64_t{64}, int64_t{100},
                       int64_t{1000}, int64_t{5000}}) {
    SCOPED_TRACE(cols);
    const Shape shape = {3, cols};
    Tensor a(TERN_DTYPE_F32, shape), b = Tensor::Broadcast(TERN_DTYPE_F32, shape, {false, true});
    a.Randomize(rng, -3, 3);
    b.Randomize(rng, 0.5, 2);
    Tensor out0(TERN_DTYPE_F32, shape), out1(TERN_DTYPE_F32, shape), out2(TERN_DTYPE_F32, shape),
        out3(TERN_DTYPE_F32, shape);
    ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&out0, &out1, &out2, &out3}, {&a, &b}),
                     Program(steps, {17, 18, 23, 34}), {0.75, 2.0, 3.0, 2.0})
                    .ok());
    for (int64_t i = 0; i < a.count(); ++i) {
      const float x = static_cast<float>(a.Get(i)), y = static_cast<float>(b.Get(i));
      const float r8 = x - y, r9 = r8 * r8, r11 = 0.75f / r9, r12 = r11 + x, r13 = y - r12,
                  r14 = r13 + r13, r15 = 0.75f * r14, r16 = r15 / y, r17 = r16 - r16, r18 = r16 * x,
                  r19 = r18 / r18, r20 = r18 + r19, r22 = 2.0f - r20, r23 = r22 / x,
                  r24 = r12 + r17, r25 = r24 * r24, r26 = r25 * r25 * r25, r27 = 1.0f / r26,
                  r28 = r27 * r27, r29 = -r28, r31 = std::fabs(r29) * r29, r32 = -r31,
                  r33 = std::sqrt(r32), r34 = 1.0f / std::sqrt(r33);
      ASSERT_EQ(static_cast<float>(out0.Get(i)), r17) << i;
      ASSERT_EQ(static_cast<float>(out1.Get(i)), r18) << i;
      ASSERT_EQ(static_cast<float>(out2.Get(i)), r23) << i;
      ASSERT_EQ(static_cast<float>(out3.Get(i)), r34) << i;
    }
  }
}

// A binary step of two constants is a constant (computed once): a chain goes
// past it, as past any constant, and as an output it is stored like one.
TEST(ElementwiseProgram, AStepOfTwoConstantsIsAConstant) {
  // r8 = a - b; r9 = 0.1; r10 = 3; r11 = r9 * r10; r12 = r11 * r8;
  // r13 = a + r12; out0 = r13, out1 = r11.
  const std::vector<std::array<int64_t, 5>> steps = {
      {TERN_STEP_BINARY, TERN_BINARY_SUB, 0, 1, 0},
      {TERN_STEP_CONSTANT, 0, 0, 0, 0},
      {TERN_STEP_CONSTANT, 0, 1, 0, 0},
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 9, 10, 0},
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 11, 8, 0},
      {TERN_STEP_BINARY, TERN_BINARY_ADD, 0, 12, 0},
  };
  std::mt19937_64 rng(22);
  Tensor a(TERN_DTYPE_F32, {5, 70}), b(TERN_DTYPE_F32, {5, 70});
  a.Randomize(rng, -3, 3);
  b.Randomize(rng, -3, 3);
  Tensor out0(TERN_DTYPE_F32, {5, 70}), out1(TERN_DTYPE_F32, {5, 70});
  ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&out0, &out1}, {&a, &b}),
                   Program(steps, {13, 11, kNone, kNone}), {0.1, 3.0})
                  .ok());
  const float scale = 0.1f * 3.0f;
  for (int64_t i = 0; i < a.count(); ++i) {
    const float x = static_cast<float>(a.Get(i)), y = static_cast<float>(b.Get(i));
    ASSERT_EQ(static_cast<float>(out0.Get(i)), x + scale * (x - y)) << i;
    ASSERT_EQ(static_cast<float>(out1.Get(i)), scale) << i;
  }
}

// A binary step with a constant operand reads the value itself, on either
// side; a step of two constants, and a constant that is an output, read the
// constant's buffer. Over enough elements for several chunks and parts.
TEST(ElementwiseProgram, ConstantsOnEitherSideOfABinaryStep) {
  std::mt19937_64 rng(9);
  Tensor a(TERN_DTYPE_F32, {300, 700}), out0(TERN_DTYPE_F32, {300, 700}),
      out1(TERN_DTYPE_F32, {300, 700}), out2(TERN_DTYPE_F32, {300, 700});
  a.Randomize(rng, -3, 3);
  // r8 = 2; r9 = -0.5; r10 = r8 - a; r11 = a / r9; r12 = r8 * r9;
  // r13 = r10 + r12; r14 = max(r11, r13); r15 = a < r9
  // out0 = r14, out1 = r15, out2 = r8.
  const std::vector<std::array<int64_t, 5>> steps = {
      {TERN_STEP_CONSTANT, 0, 0, 0, 0},
      {TERN_STEP_CONSTANT, 0, 1, 0, 0},
      {TERN_STEP_BINARY, TERN_BINARY_SUB, 8, 0, 0},
      {TERN_STEP_BINARY, TERN_BINARY_DIV, 0, 9, 0},
      {TERN_STEP_BINARY, TERN_BINARY_MUL, 8, 9, 0},
      {TERN_STEP_BINARY, TERN_BINARY_ADD, 10, 12, 0},
      {TERN_STEP_BINARY, TERN_BINARY_MAX, 11, 13, 0},
      {TERN_STEP_BINARY, TERN_BINARY_LT, 0, 9, 0},
  };
  ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&out0, &out1, &out2}, {&a}),
                   Program(steps, {14, 15, 8, kNone}), {2.0, -0.5})
                  .ok());
  for (int64_t i = 0; i < a.count(); ++i) {
    const float x = static_cast<float>(a.Get(i));
    const float r10 = 2.0f - x, r11 = x / -0.5f, r13 = r10 + 2.0f * -0.5f;
    ASSERT_EQ(static_cast<float>(out0.Get(i)), std::max(r11, r13)) << i;
    ASSERT_EQ(out1.Get(i), x < -0.5f ? 1.0 : 0.0) << i;
    ASSERT_EQ(out2.Get(i), 2.0) << i;
  }
}

TEST(ElementwiseProgram, BoolInputsAndParametersFromFloats) {
  // where(mask, leaky_relu(x, 0.2), affine(x, 3, -1)) with a bool mask.
  std::mt19937_64 rng(9);
  Tensor x(TERN_DTYPE_F32, {64}), mask(TERN_DTYPE_BOOL, {64}), out(TERN_DTYPE_F32, {64});
  x.Randomize(rng);
  mask.Randomize(rng);
  ASSERT_TRUE(Exec(TERN_OP_ELEMENTWISE, Operands({&out}, {&x, &mask}),
                   Program({{TERN_STEP_UNARY, TERN_UNARY_LEAKY_RELU, 0, 2, 0},
                            {TERN_STEP_UNARY, TERN_UNARY_AFFINE, 0, 0, 0},
                            {TERN_STEP_WHERE, 0, 1, 8, 9}},
                           {10, kNone, kNone, kNone}),
                   {3.0, -1.0, 0.2})
                  .ok());
  for (int64_t i = 0; i < x.count(); ++i) {
    const float v = static_cast<float>(x.Get(i));
    const float want = mask.Get(i) != 0 ? (v > 0 ? v : 0.2f * v) : 3.0f * v + -1.0f;
    ASSERT_FLOAT_EQ(static_cast<float>(out.Get(i)), want) << i;
  }
}

TEST(ElementwiseProgram, RulesNameTheStep) {
  Tensor a(TERN_DTYPE_F32, {4}), out(TERN_DTYPE_F32, {4}), wide(TERN_DTYPE_F32, {5}),
      ints(TERN_DTYPE_I32, {4});
  auto check = [&](std::vector<Tensor*> operands, std::vector<int64_t> program,
                   std::vector<double> floats, tern_status_t code, const char* text) {
    Status status = Validate(TERN_OP_ELEMENTWISE, operands, program, floats);
    EXPECT_EQ(status.code(), code) << status.message();
    EXPECT_NE(status.message().find(text), std::string::npos) << status.message();
  };
  const std::array<int64_t, 4> one = {8, kNone, kNone, kNone};
  check(Operands({&out}, {&a}), Program({{TERN_STEP_BINARY, TERN_BINARY_ADD, 0, 9, 0}}, one), {},
        TERN_ERROR_EXECUTABLE_INVALID, "step 0 (binary add) reads register 9");
  check(Operands({&out}, {&a}), Program({{TERN_STEP_UNARY, TERN_UNARY_EXP, 1, 0, 0}}, one), {},
        TERN_ERROR_EXECUTABLE_INVALID, "input in1, which is absent");
  check(Operands({&out}, {&a}), Program({{7, 0, 0, 0, 0}}, one), {},
        TERN_ERROR_EXECUTABLE_UNSUPPORTED, "kind 7");
  check(Operands({&out}, {&a}), Program({{TERN_STEP_UNARY, TERN_UNARY_COUNT + 3, 0, 0, 0}}, one),
        {}, TERN_ERROR_EXECUTABLE_UNSUPPORTED, "unknown unary function");
  check(Operands({&out}, {&a}),
        Program({{TERN_STEP_BINARY, TERN_BINARY_BITWISE_AND, 0, 0, 0}}, one), {},
        TERN_ERROR_EXECUTABLE_INVALID, "bitwise");
  check(Operands({&out}, {&a}), Program({{TERN_STEP_CONSTANT, 0, 2, 0, 0}}, one), {1.0},
        TERN_ERROR_EXECUTABLE_INVALID, "floats[2]");
  check(Operands({&out}, {&a}), Program({{TERN_STEP_UNARY, TERN_UNARY_CLAMP, 0, 1, 0}}, one),
        {0.0, 1.0}, TERN_ERROR_EXECUTABLE_INVALID, "2 parameters from floats[1]");
  check(Operands({&out}, {&a}),
        Program({{TERN_STEP_UNARY, TERN_UNARY_EXP, 0, 0, 0}}, {8, 8, -1, -1}), {},
        TERN_ERROR_EXECUTABLE_INVALID, "out1 is absent");
  check(Operands({&out}, {&a}),
        Program({{TERN_STEP_UNARY, TERN_UNARY_EXP, 0, 0, 0}}, {9, -1, -1, -1}), {},
        TERN_ERROR_EXECUTABLE_INVALID, "register 9, which holds no value");
  check(Operands({&out}, {&wide}), Program({{TERN_STEP_UNARY, TERN_UNARY_EXP, 0, 0, 0}}, one), {},
        TERN_ERROR_EXECUTABLE_INVALID, "shapes must be equal");
  check(Operands({&out}, {&ints}), Program({{TERN_STEP_UNARY, TERN_UNARY_EXP, 0, 0, 0}}, one), {},
        TERN_ERROR_EXECUTABLE_INVALID, "float (f32, bf16, f16) and bool");
  check(Operands({&out}, {&a}), {1, TERN_STEP_UNARY, TERN_UNARY_EXP, 0, 0, 0, 8}, {},
        TERN_ERROR_EXECUTABLE_INVALID, "takes 10 ints");
  check(Operands({&out}, {&a}), {0, -1, -1, -1, -1}, {}, TERN_ERROR_EXECUTABLE_INVALID,
        "has 0 steps");
}

TEST(ElementwiseProgram, NeedsItsFeatureBit) {
  Tensor a(TERN_DTYPE_F32, {4}), out(TERN_DTYPE_F32, {4});
  std::vector<isa::OperandDesc> descs(5);
  descs[0] = out.desc();
  descs[4] = a.desc();
  for (size_t i = 1; i < 4; ++i) descs[i].segment = TERN_SEGMENT_NONE;
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_ELEMENTWISE, descs, {}), TERN_FEATURE_ELEMENTWISE_PROGRAMS);
  EXPECT_EQ(isa::FeatureNames(TERN_FEATURE_ELEMENTWISE_PROGRAMS | TERN_FEATURE_TENSOR_EPILOGUES |
                              (uint64_t{1} << 9)),
            "elementwise-programs, tensor-epilogues, bit 9");
}

// --- matmul and conv2d epilogues -------------------------------------------------

TEST(TensorEpilogue, MatmulSameBitsAsMatmulThenAddThenActivation) {
  std::mt19937_64 rng(21);
  for (int64_t activation : {int64_t{TERN_UNARY_GELU}, int64_t{TERN_UNARY_RELU}, kNone}) {
    for (bool residual : {true, false}) {
      if (activation == kNone && !residual) continue;
      SCOPED_TRACE(::testing::Message() << "activation " << activation << " residual " << residual);
      Tensor a(TERN_DTYPE_F32, {33, 40}), b(TERN_DTYPE_F32, {40, 20}), bias(TERN_DTYPE_F32, {20}),
          res(TERN_DTYPE_F32, {33, 20});
      for (Tensor* t : {&a, &b, &bias, &res}) t->Randomize(rng);
      Tensor fused(TERN_DTYPE_F32, {33, 20}), want(TERN_DTYPE_F32, {33, 20});
      ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&fused, &a, &b, &bias, residual ? &res : kAbsent},
                       {0, 0, activation})
                      .ok());
      ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&want, &a, &b, &bias}).ok());
      if (residual) {
        ASSERT_TRUE(Exec(TERN_OP_BINARY, {&want, &want, &res}, {TERN_BINARY_ADD}).ok());
      }
      if (activation != kNone) {
        ASSERT_TRUE(Exec(TERN_OP_UNARY, {&want, &want}, {activation}).ok());
      }
      EXPECT_TRUE(SameBits(fused, want));
    }
  }
}

TEST(TensorEpilogue, MatmulActivationWithParametersAfterAlphaBeta) {
  std::mt19937_64 rng(2);
  Tensor a(TERN_DTYPE_F32, {4, 6}), b(TERN_DTYPE_F32, {6, 5}), out(TERN_DTYPE_F32, {4, 5}),
      want(TERN_DTYPE_F32, {4, 5});
  for (Tensor* t : {&a, &b}) t->Randomize(rng);
  ASSERT_TRUE(
      Exec(TERN_OP_MATMUL, {&out, &a, &b}, {0, 0, TERN_UNARY_LEAKY_RELU}, {0.5, 0.0, 0.1}).ok());
  ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&want, &a, &b}, {0, 0}, {0.5, 0.0}).ok());
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&want, &want}, {TERN_UNARY_LEAKY_RELU}, {0.1}).ok());
  EXPECT_TRUE(SameBits(out, want));
}

TEST(TensorEpilogue, Conv2dResidualThenRelu) {
  std::mt19937_64 rng(8);
  Tensor input(TERN_DTYPE_F32, {2, 3, 9, 9}), weight(TERN_DTYPE_F32, {4, 3, 3, 3}),
      bias(TERN_DTYPE_F32, {4}), res(TERN_DTYPE_F32, {2, 4, 9, 9});
  for (Tensor* t : {&input, &weight, &bias, &res}) t->Randomize(rng);
  Tensor out(TERN_DTYPE_F32, {2, 4, 9, 9}), want(TERN_DTYPE_F32, {2, 4, 9, 9});
  const std::vector<int64_t> geometry = {1, 1, 1, 1, 1, 1, 1};
  std::vector<int64_t> fused_ints = geometry;
  fused_ints.push_back(TERN_UNARY_RELU);
  ASSERT_TRUE(Exec(TERN_OP_CONV2D, {&out, &input, &weight, &bias, &res}, fused_ints).ok());
  ASSERT_TRUE(Exec(TERN_OP_CONV2D, {&want, &input, &weight, &bias}, geometry).ok());
  ASSERT_TRUE(Exec(TERN_OP_BINARY, {&want, &want, &res}, {TERN_BINARY_ADD}).ok());
  ASSERT_TRUE(Exec(TERN_OP_UNARY, {&want, &want}, {TERN_UNARY_RELU}).ok());
  EXPECT_TRUE(SameBits(out, want));
}

TEST(TensorEpilogue, Rules) {
  Tensor a(TERN_DTYPE_F32, {4, 6}), b(TERN_DTYPE_F32, {6, 5}), out(TERN_DTYPE_F32, {4, 5}),
      bad_res(TERN_DTYPE_F32, {4, 4});
  auto message = [](Status status) { return status.message(); };
  EXPECT_NE(message(Validate(TERN_OP_MATMUL, {&out, &a, &b}, {0, 0, TERN_UNARY_ISNAN}))
                .find("is not an activation"),
            std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_MATMUL, {&out, &a, &b}, {0, 0, TERN_UNARY_LEAKY_RELU}, {1, 0}))
                .find("takes 1 parameter floats"),
            std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_MATMUL, {&out, &a, &b, kAbsent, &bad_res}, {0, 0}))
                .find("residual is [4, 4]"),
            std::string::npos);
  EXPECT_EQ(Validate(TERN_OP_MATMUL, {&out, &a, &b}, {0, 0, TERN_UNARY_COUNT}).code(),
            TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  Tensor input(TERN_DTYPE_F32, {1, 1, 3, 3}), weight(TERN_DTYPE_F32, {1, 1, 3, 3}),
      conv_out(TERN_DTYPE_F32, {1, 1, 1, 1});
  EXPECT_TRUE(
      Validate(TERN_OP_CONV2D, {&conv_out, &input, &weight}, {1, 1, 0, 0, 1, 1, 1, -1}).ok());
  EXPECT_NE(message(Validate(TERN_OP_CONV2D, {&conv_out, &input, &weight},
                             {1, 1, 0, 0, 1, 1, 1, -1}, {0.5}))
                .find("no activation"),
            std::string::npos);
  // The backward convolutions take no activation.
  EXPECT_NE(message(Validate(TERN_OP_CONV2D_BACKWARD_INPUT, {&input, &conv_out, &weight},
                             {1, 1, 0, 0, 1, 1, 1, -1}))
                .find("takes 7 ints"),
            std::string::npos);
  // Feature bits: only with an activation or a residual.
  std::vector<isa::OperandDesc> descs = {out.desc(), a.desc(), b.desc()};
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_MATMUL, descs, std::vector<int64_t>{0, 0, -1}), 0u);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_MATMUL, descs, std::vector<int64_t>{0, 0, TERN_UNARY_RELU}),
            TERN_FEATURE_TENSOR_EPILOGUES);
}

}  // namespace
}  // namespace tern::testing

namespace tern::testing {
namespace {

// `rows` ([count, k], row-major) seen as its transpose: [k, count] with
// strides [1, k], as a linear layer's weight reaches the matmul.
Tensor Transposed(const Tensor& rows, int64_t k, int64_t count) {
  Tensor t = rows;
  t.desc().shape[0] = k;
  t.desc().shape[1] = count;
  t.desc().strides[0] = 1;
  t.desc().strides[1] = k;
  return t;
}

// alpha * a @ weight^T + bias in double: element (i, j) of [m, n] at i * n + j.
std::vector<double> LinearReference(const Tensor& a, const Tensor& weight, const Tensor& bias,
                                    int64_t m, int64_t n, int64_t k, double alpha) {
  std::vector<double> want(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t l = 0; l < k; ++l) sum += a.Get(i * k + l) * weight.Get(j * k + l);
      want[i * n + j] = alpha * sum + bias.Get(j);
    }
  }
  return want;
}

// The matrix-vector path (M <= 4, f32, a linear layer's [N, K] weight seen
// transposed): against a double reference, with alpha, a row bias and a
// strided output, and split over several threads for N = 3000.
TEST(SmallMatmul, LinearLayerShapesMatchTheReference) {
  std::mt19937_64 rng(31);
  for (int64_t m : {1, 3, 4}) {
    for (int64_t n : {50, 3000}) {
      const int64_t k = 37;
      SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n);
      Tensor a(TERN_DTYPE_F32, {m, k}), weight(TERN_DTYPE_F32, {n, k}), bias(TERN_DTYPE_F32, {n});
      for (Tensor* t : {&a, &weight, &bias}) t->Randomize(rng);
      Tensor b = Transposed(weight, k, n);
      Tensor out = Tensor::Spaced(TERN_DTYPE_F32, {m, n});
      out.Poison();
      ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&out, &a, &b, &bias}, {0, 0}, {0.5, 0.0}).ok());
      EXPECT_TRUE(
          Near(out, LinearReference(a, weight, bias, m, n, k, 0.5), TolFor(TERN_DTYPE_F32, 4)));
    }
  }
}

// The same product computed transposed, out^T = W @ a^T with the bias
// along the rows (as the PyTorch plugin computes a one-row linear layer):
// few columns, many rows. Each output is bit for bit the one of the
// linear-layer form, and both match the reference.
TEST(SmallMatmul, TransposedFormGivesTheSameBits) {
  std::mt19937_64 rng(41);
  for (int64_t m : {1, 3}) {
    const int64_t n = 3000, k = 45;
    SCOPED_TRACE(::testing::Message() << "m " << m);
    Tensor a(TERN_DTYPE_F32, {m, k}), weight(TERN_DTYPE_F32, {n, k}), bias(TERN_DTYPE_F32, {n});
    for (Tensor* t : {&a, &weight, &bias}) t->Randomize(rng);
    // The linear-layer form: out [m, n] = a @ weight^T + bias.
    Tensor b = Transposed(weight, k, n);
    Tensor out(TERN_DTYPE_F32, {m, n});
    ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&out, &a, &b, &bias}, {0, 0}, {0.5, 0.0}).ok());
    // The transposed form: out_t [n, m] = weight @ a^T + bias (along n).
    Tensor a_t = Transposed(a, k, m);
    Tensor column_bias = bias;
    column_bias.desc().rank = 2;
    column_bias.desc().shape[0] = n;
    column_bias.desc().shape[1] = m;
    column_bias.desc().strides[0] = 1;
    column_bias.desc().strides[1] = 0;
    Tensor out_t = Tensor::Spaced(TERN_DTYPE_F32, {n, m});
    out_t.Poison();
    ASSERT_TRUE(
        Exec(TERN_OP_MATMUL, {&out_t, &weight, &a_t, &column_bias}, {0, 0}, {0.5, 0.0}).ok());
    const std::vector<double> reference = LinearReference(a, weight, bias, m, n, k, 0.5);
    std::vector<double> want(reference.size());
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) want[j * m + i] = reference[i * n + j];
    }
    EXPECT_TRUE(Near(out_t, want, TolFor(TERN_DTYPE_F32, 4)));
    int64_t differ = 0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) differ += out.Get(i * n + j) != out_t.Get(j * m + i);
    }
    EXPECT_EQ(differ, 0) << "outputs differ between the two forms";
  }
}

// The path sums four columns at a time: each output is bit for bit the
// product of its column alone (N = 1), whatever group it fell in.
TEST(SmallMatmul, AColumnsResultDoesNotDependOnItsNeighbours) {
  std::mt19937_64 rng(37);
  const int64_t m = 2, n = 11, k = 53;
  Tensor a(TERN_DTYPE_F32, {m, k}), weight(TERN_DTYPE_F32, {n, k});
  for (Tensor* t : {&a, &weight}) t->Randomize(rng);
  Tensor b = Transposed(weight, k, n);
  Tensor out(TERN_DTYPE_F32, {m, n});
  ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&out, &a, &b}, {0, 0}, {1.0, 0.0}).ok());
  for (int64_t j = 0; j < n; ++j) {
    Tensor column(TERN_DTYPE_F32, {1, k});
    for (int64_t l = 0; l < k; ++l) column.Set(l, weight.Get(j * k + l));
    Tensor b1 = Transposed(column, k, 1);
    Tensor alone(TERN_DTYPE_F32, {m, 1});
    ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&alone, &a, &b1}, {0, 0}, {1.0, 0.0}).ok());
    for (int64_t i = 0; i < m; ++i) {
      EXPECT_EQ(out.Get(i * n + j), alone.Get(i)) << "row " << i << " column " << j;
    }
  }
}

}  // namespace
}  // namespace tern::testing
