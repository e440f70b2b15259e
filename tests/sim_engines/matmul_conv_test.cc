// Matmul and the convolutions against naive double references: dtypes
// (f32, bf16, f16, bf16 -> f32, integers), transposes, batch broadcasting by
// stride 0, bias forms, alpha/beta, strided operands, empty dimensions; each
// through oneDNN and through the portable loops.
#include <cmath>

#include "driver_shim/sim/engines/kernels_testing.h"
#include "kernel_test_util.h"

namespace tern::testing {
namespace {

class OneDnnParam : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { previous_ = sim::SetOneDnnDisabledForTesting(!GetParam()); }
  void TearDown() override { sim::SetOneDnnDisabledForTesting(previous_); }
  bool previous_ = false;
};

// ----------------------------------------------------------------------------
// matmul

struct MatmulCase {
  Shape batch;
  int64_t m, n, k;
  bool ta = false, tb = false;
  int bias = 0;  // 0 none, 1 [N], 2 out-shaped with stride 0 rows
  double alpha = 1, beta = 0;
  bool broadcast_a = false;  // a's first batch dim stride 0
  bool broadcast_b = false;
  bool spaced_out = false;
  bool transposed_view = false;  // a given as a transposed view (strides), not via ta
};

std::vector<MatmulCase> MatmulCases() {
  return {
      {{}, 1, 1, 1},
      {{}, 3, 5, 7},
      {{}, 17, 33, 65, true, false},
      {{}, 17, 33, 65, false, true},
      {{}, 16, 24, 40, true, true, 1},
      {{}, 9, 10, 11, false, false, 2, 0.5, 2.0},
      {{}, 9, 10, 11, false, false, 1, 1.0, 1.0, false, false, true},
      {{2}, 5, 6, 7, false, false, 1},
      {{2, 3}, 4, 5, 6, false, true, 0, 1.0, 0.0, false, true},
      {{3}, 8, 8, 8, true, false, 0, 2.0, 0.0, true, false},
      {{}, 13, 7, 29, false, false, 0, 1, 0, false, false, false, true},
      {{}, 64, 48, 128},
      {{}, 4, 5, 0, false, false, 1, 1.0, 0.5},  // K = 0: out = beta * out + bias
      {{}, 0, 5, 3},
      {{2, 0}, 3, 3, 3},
  };
}

// How CheckMatmul runs the product: b as any operand, or b as one of the
// program's constants (prepared first, as a load does), expecting the
// kernels to keep a laid-out weight for it or not.
enum class Weight { kOperand, kConstantKept, kConstantNotKept };

void CheckMatmul(const MatmulCase& c, tern_dtype_t in_dt, tern_dtype_t out_dt, std::mt19937_64& rng,
                 Weight weight = Weight::kOperand) {
  Shape a_shape = c.batch, b_shape = c.batch, o_shape = c.batch;
  a_shape.insert(a_shape.end(), {c.ta ? c.k : c.m, c.ta ? c.m : c.k});
  b_shape.insert(b_shape.end(), {c.tb ? c.n : c.k, c.tb ? c.k : c.n});
  o_shape.insert(o_shape.end(), {c.m, c.n});
  const size_t r = o_shape.size();
  auto make = [&](const Shape& shape, bool broadcast, bool transposed) {
    if (broadcast) {
      std::vector<bool> b(shape.size(), false);
      b[0] = true;
      return Tensor::Broadcast(in_dt, shape, b);
    }
    if (transposed) {
      std::vector<int> order(shape.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::swap(order[r - 2], order[r - 1]);
      return Tensor::Permuted(in_dt, shape, order);
    }
    return Tensor(in_dt, shape);
  };
  Tensor a = make(a_shape, c.broadcast_a, c.transposed_view);
  Tensor b = make(b_shape, c.broadcast_b, false);
  const bool integer = isa::IsInteger(in_dt);
  a.Randomize(rng, integer ? -5 : -1, integer ? 5 : 1);
  b.Randomize(rng, integer ? -5 : -1, integer ? 5 : 1);
  Tensor out = c.spaced_out ? Tensor::Spaced(out_dt, o_shape) : Tensor(out_dt, o_shape);
  out.Randomize(rng, integer ? -5 : -1, integer ? 5 : 1);
  Tensor bias;
  if (c.bias == 1) {
    bias = Tensor(out_dt, {c.n});
  } else if (c.bias == 2) {
    std::vector<bool> bc(r, true);
    bc[r - 1] = false;
    bias = Tensor::Broadcast(out_dt, o_shape, bc);
  }
  if (c.bias) bias.Randomize(rng, integer ? -5 : -1, integer ? 5 : 1);
  // Reference, on the values in row-major order.
  const std::vector<double> av = a.Values(), bv = b.Values(), ov = out.Values();
  const std::vector<double> biasv = c.bias ? bias.Values() : std::vector<double>();
  Shape as(r), bs(r);
  for (int64_t d = static_cast<int64_t>(r) - 1, sa = 1, sb = 1; d >= 0; --d) {
    as[d] = sa;
    bs[d] = sb;
    sa *= a_shape[d];
    sb *= b_shape[d];
  }
  std::vector<double> ref(out.count());
  for (int64_t o = 0; o < out.count(); ++o) {
    std::vector<int64_t> idx = out.Index(o);
    const int64_t m = idx[r - 2], n = idx[r - 1];
    int64_t abase = 0, bbase = 0;
    for (size_t d = 0; d + 2 < r; ++d) {
      abase += idx[d] * as[d];
      bbase += idx[d] * bs[d];
    }
    double acc = 0;
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const int64_t al =
          abase + (c.ta ? kk * as[r - 2] + m * as[r - 1] : m * as[r - 2] + kk * as[r - 1]);
      const int64_t bl =
          bbase + (c.tb ? n * bs[r - 2] + kk * bs[r - 1] : kk * bs[r - 2] + n * bs[r - 1]);
      acc += av[al] * bv[bl];
    }
    double v = c.alpha * acc + (c.beta != 0 ? c.beta * ov[o] : 0.0);
    if (c.bias == 1) v += biasv[n];
    if (c.bias == 2) v += biasv[o];
    ref[o] = integer ? static_cast<double>(static_cast<int64_t>(v)) : RoundToDtype(out_dt, v);
  }
  std::vector<Tensor*> ops = {&out, &a, &b};
  if (c.bias) ops.push_back(&bias);
  std::vector<int64_t> ints = {c.ta, c.tb};
  std::vector<double> floats = {c.alpha, c.beta};
  const std::string what =
      fmt::format("matmul {}->{} out {} k {} ta {} tb {} bias {} alpha {} beta {}{}",
                  isa::DTypeName(in_dt), isa::DTypeName(out_dt), ShapeStr(o_shape), c.k, c.ta, c.tb,
                  c.bias, c.alpha, c.beta, weight == Weight::kOperand ? "" : " (constant weight)");
  if (weight == Weight::kOperand) {
    Status st = Exec(TERN_OP_MATMUL, ops, ints, floats);
    ASSERT_TRUE(st.ok()) << st.message();
  } else {
    bool prepared = false;
    Status st = ExecPrepared(TERN_OP_MATMUL, ops, 2, ints, floats, &prepared);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(prepared, weight == Weight::kConstantKept) << what;
  }
  if (integer) {
    if (in_dt == TERN_DTYPE_I8) {
      for (double& v : ref) v = static_cast<int8_t>(static_cast<int64_t>(v));
    }
    EXPECT_TRUE(Equal(out, ref)) << what;
    return;
  }
  const double mag = std::sqrt(static_cast<double>(std::max<int64_t>(c.k, 1)));
  Tolerance tol = out_dt == TERN_DTYPE_F32   ? Tolerance{1e-4, 1e-5 * mag}
                  : out_dt == TERN_DTYPE_F16 ? Tolerance{2e-3, 2e-3 * mag}
                                             : Tolerance{1.6e-2, 1.6e-2 * mag};
  EXPECT_TRUE(Near(out, ref, tol)) << what;
}

TEST_P(OneDnnParam, MatmulFloatDtypes) {
  std::mt19937_64 rng(31);
  const std::pair<tern_dtype_t, tern_dtype_t> dtypes[] = {{TERN_DTYPE_F32, TERN_DTYPE_F32},
                                                          {TERN_DTYPE_BF16, TERN_DTYPE_BF16},
                                                          {TERN_DTYPE_BF16, TERN_DTYPE_F32},
                                                          {TERN_DTYPE_F16, TERN_DTYPE_F16},
                                                          {TERN_DTYPE_F16, TERN_DTYPE_F32}};
  for (auto [in_dt, out_dt] : dtypes) {
    for (const MatmulCase& c : MatmulCases()) CheckMatmul(c, in_dt, out_dt, rng);
  }
}

TEST_P(OneDnnParam, MatmulIntegerDtypes) {
  std::mt19937_64 rng(32);
  for (tern_dtype_t dt : kIntDtypes) {
    for (MatmulCase c : MatmulCases()) {
      c.alpha = std::round(c.alpha * 2);  // integral alpha/beta
      c.beta = std::round(c.beta);
      CheckMatmul(c, dt, dt, rng);
    }
  }
}

TEST_P(OneDnnParam, MatmulLargeBatchedBf16) {
  std::mt19937_64 rng(33);
  MatmulCase c{{4}, 96, 80, 192, false, true, 1};
  CheckMatmul(c, TERN_DTYPE_BF16, TERN_DTYPE_BF16, rng);
  MatmulCase d{{2, 2}, 33, 65, 70, true, false, 0, 1.0, 0.0, true, false};
  CheckMatmul(d, TERN_DTYPE_F32, TERN_DTYPE_F32, rng);
}

// A weight in the program's constants is laid out for oneDNN when the
// program is loaded (kernels_dnnl.cc, ConstantWeightMatmul): the product is
// the same whole or split (by rows, by columns), transposed or not, with a
// bias or alpha, in every dtype oneDNN takes directly; what it does not
// take so (beta, a weight per matrix, alpha with a bias, oneDNN disabled)
// runs as before.
TEST_P(OneDnnParam, MatmulWithAConstantWeight) {
  std::mt19937_64 rng(35);
  const bool onednn = GetParam();
  const MatmulCase kept[] = {
      {{}, 16, 48, 40},                        // whole
      {{}, 16, 48, 40, false, false, 0, 0.5},  // alpha
      {{}, 64, 512, 256, false, false, 1},     // split by rows from 4M multiply-adds
      {{}, 64, 384, 256, false, true, 1},      // a linear layer's [N, K] weight
      {{}, 2, 4096, 1024, false, false, 1},    // split by columns (few rows)
      // One weight for every matrix of a batch (stride 0), split by matrix.
      {{2}, 40, 48, 2048, false, false, 1, 1.0, 0.0, false, true},
  };
  const MatmulCase not_kept[] = {
      {{}, 9, 10, 11, false, false, 1, 1.0, 1.0},  // beta: accumulates into out
      {{2}, 5, 6, 7},                              // a weight per matrix
      {{}, 16, 48, 40, false, false, 1, 0.5},      // alpha with a bias: packed to f32
  };
  const std::pair<tern_dtype_t, tern_dtype_t> dtypes[] = {{TERN_DTYPE_F32, TERN_DTYPE_F32},
                                                          {TERN_DTYPE_BF16, TERN_DTYPE_BF16},
                                                          {TERN_DTYPE_BF16, TERN_DTYPE_F32}};
  for (int threads : {1, 2}) {
    const int previous = SetKernelThreadsForTesting(threads);
    for (auto [in_dt, out_dt] : dtypes) {
      // bf16 has only oneDNN's reference code on CPUs without AVX-512 (an
      // AMD Zen 1 here): the kernels then run their own loops, as disabled.
      const bool kept_here = onednn && sim::OneDnnHasFastMatmulForTesting(in_dt, out_dt);
      if (in_dt == TERN_DTYPE_F32) {
        EXPECT_TRUE(sim::OneDnnHasFastMatmulForTesting(in_dt, out_dt));
      }
      for (const MatmulCase& c : kept) {
        // f32 products with few rows keep their weight in panels, oneDNN or not.
        const bool panels = in_dt == TERN_DTYPE_F32 && out_dt == TERN_DTYPE_F32 && c.m <= 4;
        CheckMatmul(c, in_dt, out_dt, rng,
                    kept_here || panels ? Weight::kConstantKept : Weight::kConstantNotKept);
      }
      for (const MatmulCase& c : not_kept) {
        CheckMatmul(c, in_dt, out_dt, rng, Weight::kConstantNotKept);
      }
    }
    SetKernelThreadsForTesting(previous);
  }
}

// An f32 product with at most four rows (a linear layer at batch 1-4) keeps
// its constant weight in column panels (panel_weight.h), with oneDNN or
// without: every row count, widths that are not a multiple of the panel's
// 64 columns, one or many panels per thread, the weight as [K, N] or as an
// [N, K] weight seen transposed, a bias by column or out-shaped, alpha, and
// an output with spaced rows.
TEST_P(OneDnnParam, MatmulWithFewRowsKeepsItsConstantWeightInPanels) {
  std::mt19937_64 rng(37);
  const MatmulCase panels[] = {
      {{}, 1, 1, 1},
      {{}, 1, 64, 16},
      {{}, 1, 100, 7, false, true, 1},
      {{}, 2, 1024, 512, false, true, 1},
      {{}, 3, 130, 513, false, false, 2},
      {{}, 4, 65, 33, false, true, 1, 0.5},
      {{}, 4, 300, 40, false, false, 0, 2.0},
      {{}, 2, 70, 20, false, true, 1, 1.0, 0.0, false, false, true},
  };
  for (int threads : {1, 2}) {
    const int previous = SetKernelThreadsForTesting(threads);
    for (const MatmulCase& c : panels) {
      CheckMatmul(c, TERN_DTYPE_F32, TERN_DTYPE_F32, rng, Weight::kConstantKept);
    }
    // Five rows, or beta, take the other paths.
    CheckMatmul({{}, 5, 64, 16}, TERN_DTYPE_F32, TERN_DTYPE_F32, rng,
                GetParam() ? Weight::kConstantKept : Weight::kConstantNotKept);
    CheckMatmul({{}, 2, 64, 16, false, false, 0, 1.0, 1.0}, TERN_DTYPE_F32, TERN_DTYPE_F32, rng,
                Weight::kConstantNotKept);
    SetKernelThreadsForTesting(previous);
  }
}

// The laid-out weight is used only for the memory it was made from: an
// instruction run on another weight computes with that one.
TEST_P(OneDnnParam, MatmulPreparedForOneWeightRunsAnotherAsItLies) {
  std::mt19937_64 rng(36);
  Tensor a(TERN_DTYPE_F32, {16, 64}), w(TERN_DTYPE_F32, {64, 32}), other(TERN_DTYPE_F32, {64, 32});
  Tensor out(TERN_DTYPE_F32, {16, 32}), expected(TERN_DTYPE_F32, {16, 32});
  a.Randomize(rng);
  w.Randomize(rng);
  other.Randomize(rng);
  ASSERT_TRUE(Exec(TERN_OP_MATMUL, {&expected, &a, &other}, {0, 0}, {1.0, 0.0}).ok());
  driver::Instruction ins;
  ins.opcode = TERN_OP_MATMUL;
  ins.engine = isa::OpcodeEngine(TERN_OP_MATMUL);
  ins.operands = {out.desc(), a.desc(), w.desc()};
  ins.operands[2].segment = TERN_SEGMENT_CONSTANT;
  ins.ints = {0, 0};
  ins.floats = {1.0, 0.0};
  ins.prepared = sim::PrepareInstruction(ins, w.data());
  EXPECT_EQ(ins.prepared != nullptr, GetParam());
  const sim::TensorView views[3] = {out.View(), a.View(), other.View()};
  ASSERT_TRUE(sim::RunInstruction(ins, views).ok());
  for (int64_t i = 0; i < out.count(); ++i) ASSERT_EQ(out.Bits(i), expected.Bits(i)) << i;
}

// ----------------------------------------------------------------------------
// convolution

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  bool bias = false;
  bool channels_last = false;  // input stored NHWC (a strided NCHW view)
};

std::vector<ConvCase> ConvCases() {
  return {
      {1, 1, 3, 3, 1, 1, 1},
      {2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},
      {2, 4, 8, 7, 6, 3, 2, 2, 1, 0, 2, 1, 1, 2, true},
      {1, 3, 9, 9, 5, 3, 3, 2, 2, 1, 1, 2, 2, 1, false, true},
      {3, 6, 5, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6},  // depthwise
      {2, 2, 6, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, true, true},
      {0, 3, 5, 5, 4, 3, 3},                             // empty batch
      {2, 0, 5, 5, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, true},  // no input channels: out = bias
  };
}

struct ConvTensors {
  Tensor input, weight, out;
};

int64_t OutSize(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

std::vector<int64_t> ConvInts(const ConvCase& c) {
  return {c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.groups};
}

// Calls fn(n, o, y, x, ci, ky, kx, iy, ix) for every in-bounds product term.
template <typename Fn>
void ForEachTerm(const ConvCase& c, Fn fn) {
  const int64_t oh = OutSize(c.h, c.kh, c.sh, c.ph, c.dh),
                ow = OutSize(c.w, c.kw, c.sw, c.pw, c.dw);
  const int64_t cg = c.c / c.groups, og = c.o / c.groups;
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t o = 0; o < c.o; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x)
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ky = 0; ky < c.kh; ++ky)
              for (int64_t kx = 0; kx < c.kw; ++kx) {
                const int64_t iy = y * c.sh - c.ph + ky * c.dh, ix = x * c.sw - c.pw + kx * c.dw;
                if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                fn(n, o, y, x, (o / og) * cg + ci, ci, ky, kx, iy, ix);
              }
}

Tolerance ConvTol(tern_dtype_t dt, const ConvCase& c) {
  const double mag =
      std::sqrt(static_cast<double>(std::max<int64_t>(1, c.c / c.groups * c.kh * c.kw)));
  return dt == TERN_DTYPE_F32   ? Tolerance{1e-4, 1e-5 * mag}
         : dt == TERN_DTYPE_F16 ? Tolerance{2e-3, 2e-3 * mag}
                                : Tolerance{1.6e-2, 1.6e-2 * mag};
}

TEST_P(OneDnnParam, Conv2dForwardAndBackward) {
  std::mt19937_64 rng(34);
  for (tern_dtype_t dt : kFloatDtypes) {
    for (const ConvCase& c : ConvCases()) {
      const int64_t oh = OutSize(c.h, c.kh, c.sh, c.ph, c.dh),
                    ow = OutSize(c.w, c.kw, c.sw, c.pw, c.dw);
      const Shape in_shape = {c.n, c.c, c.h, c.w}, w_shape = {c.o, c.c / c.groups, c.kh, c.kw},
                  o_shape = {c.n, c.o, oh, ow};
      Tensor input =
          c.channels_last ? Tensor::Permuted(dt, in_shape, {0, 2, 3, 1}) : Tensor(dt, in_shape);
      Tensor weight(dt, w_shape), bias(dt, {c.o});
      input.Randomize(rng, -1, 1);
      weight.Randomize(rng, -1, 1);
      bias.Randomize(rng, -1, 1);
      const std::vector<double> iv = input.Values(), wv = weight.Values();
      auto in_at = [&](int64_t n, int64_t ch, int64_t y, int64_t x) {
        return ((n * c.c + ch) * c.h + y) * c.w + x;
      };
      auto w_at = [&](int64_t o, int64_t ci, int64_t y, int64_t x) {
        return ((o * (c.c / c.groups) + ci) * c.kh + y) * c.kw + x;
      };
      auto o_at = [&](int64_t n, int64_t o, int64_t y, int64_t x) {
        return ((n * c.o + o) * oh + y) * ow + x;
      };
      const std::string what = fmt::format(
          "conv2d {} in {} w {} stride {}x{} pad {}x{} dil {}x{} groups {}", isa::DTypeName(dt),
          ShapeStr(in_shape), ShapeStr(w_shape), c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.groups);
      // Forward.
      Tensor out = Tensor::Spaced(dt, o_shape);
      std::vector<double> ref(out.count(), 0.0);
      if (c.bias) {
        for (int64_t i = 0; i < out.count(); ++i) ref[i] = bias.Get(out.Index(i)[1]);
      }
      ForEachTerm(c, [&](int64_t n, int64_t o, int64_t y, int64_t x, int64_t ch, int64_t ci,
                         int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
        ref[o_at(n, o, y, x)] += iv[in_at(n, ch, iy, ix)] * wv[w_at(o, ci, ky, kx)];
      });
      for (double& v : ref) v = RoundToDtype(dt, v);
      std::vector<Tensor*> ops = {&out, &input, &weight};
      if (c.bias) ops.push_back(&bias);
      Status st = Exec(TERN_OP_CONV2D, ops, ConvInts(c));
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_TRUE(Near(out, ref, ConvTol(dt, c))) << what;
      // Backward input: grad_input = conv_transpose(grad_out, weight).
      Tensor go(dt, o_shape);
      go.Randomize(rng, -1, 1);
      const std::vector<double> gov = go.Values();
      Tensor gi =
          c.channels_last ? Tensor::Permuted(dt, in_shape, {0, 2, 3, 1}) : Tensor(dt, in_shape);
      gi.Poison();
      std::vector<double> gi_ref(gi.count(), 0.0);
      ForEachTerm(c, [&](int64_t n, int64_t o, int64_t y, int64_t x, int64_t ch, int64_t ci,
                         int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
        gi_ref[in_at(n, ch, iy, ix)] += gov[o_at(n, o, y, x)] * wv[w_at(o, ci, ky, kx)];
      });
      for (double& v : gi_ref) v = RoundToDtype(dt, v);
      st = Exec(TERN_OP_CONV2D_BACKWARD_INPUT, {&gi, &go, &weight}, ConvInts(c));
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_TRUE(Near(gi, gi_ref, ConvTol(dt, c))) << "backward input " << what;
      // Backward weight.
      Tensor gw = Tensor::Spaced(dt, w_shape);
      gw.Poison();
      std::vector<double> gw_ref(gw.count(), 0.0);
      ForEachTerm(c, [&](int64_t n, int64_t o, int64_t y, int64_t x, int64_t ch, int64_t ci,
                         int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
        gw_ref[w_at(o, ci, ky, kx)] += gov[o_at(n, o, y, x)] * iv[in_at(n, ch, iy, ix)];
      });
      for (double& v : gw_ref) v = RoundToDtype(dt, v);
      st = Exec(TERN_OP_CONV2D_BACKWARD_WEIGHT, {&gw, &go, &input}, ConvInts(c));
      ASSERT_TRUE(st.ok()) << st.message();
      ConvCase wide = c;
      wide.c =
          c.groups * std::max<int64_t>(1, c.n * oh * ow);  // the sum runs over N * OH * OW terms
      wide.kh = wide.kw = 1;
      EXPECT_TRUE(Near(gw, gw_ref, ConvTol(dt, wide))) << "backward weight " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, OneDnnParam, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("OneDnn") : std::string("Loops");
                         });

}  // namespace
}  // namespace tern::testing

namespace tern::testing {
namespace {

// Products large enough to split across the kernel pool (4M multiply-adds
// and up) give what they give whole, split any way: by whole batch
// matrices, by rows, by columns (a row-major B: strided slabs), with a bias;
// convolutions by batch slabs, forward and backward.
double MaxRelativeDifference(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = a.Values(), bv = b.Values();
  double worst = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    worst = std::max(worst, std::fabs(av[i] - bv[i]) / std::max(1.0, std::fabs(bv[i])));
  }
  return worst;
}

TEST(KernelPoolSplits, LargeProductsMatchWhole) {
  std::mt19937_64 rng(91);
  struct Case {
    Shape a, b, out;
    bool bias;
  };
  const Case cases[] = {
      {{4, 64, 128}, {4, 128, 128}, {4, 64, 128}, false},  // by batch
      {{64, 256}, {256, 320}, {64, 320}, true},            // by rows
      {{4, 512}, {512, 2100}, {4, 2100}, true},            // by columns, a short last slab
  };
  for (const Case& c : cases) {
    Tensor a(TERN_DTYPE_F32, c.a), b(TERN_DTYPE_F32, c.b), bias(TERN_DTYPE_F32, {c.out.back()});
    a.Randomize(rng, -1, 1);
    b.Randomize(rng, -1, 1);
    bias.Randomize(rng, -1, 1);
    Tensor whole(TERN_DTYPE_F32, c.out);
    auto run = [&](Tensor* out, int threads) {
      SetKernelThreadsForTesting(threads);
      std::vector<Tensor*> ops = {out, &a, &b};
      if (c.bias) ops.push_back(&bias);
      const Status st = Exec(TERN_OP_MATMUL, ops);
      SetKernelThreadsForTesting(0);
      ASSERT_TRUE(st.ok()) << st.message();
    };
    run(&whole, 1);
    for (int threads : {2, 3}) {
      Tensor split(TERN_DTYPE_F32, c.out);
      split.Poison();
      run(&split, threads);
      // (Slabs may take other oneDNN kernels: another summation order.)
      EXPECT_LT(MaxRelativeDifference(split, whole), 1e-4)
          << ShapeStr(c.out) << " split " << threads << " ways";
    }
  }
}

TEST(KernelPoolSplits, ConvolutionsMatchWhole) {
  std::mt19937_64 rng(92);
  const Shape in_shape = {5, 16, 24, 24}, w_shape = {32, 16, 3, 3}, o_shape = {5, 32, 24, 24};
  const std::vector<int64_t> ints = {1, 1, 1, 1, 1, 1, 1};  // stride, padding, dilation, groups
  Tensor input(TERN_DTYPE_F32, in_shape), weight(TERN_DTYPE_F32, w_shape),
      go(TERN_DTYPE_F32, o_shape);
  input.Randomize(rng, -1, 1);
  weight.Randomize(rng, -1, 1);
  go.Randomize(rng, -1, 1);
  // Forward writes the output from the input; backward input the input's
  // gradient from the output's.
  auto run = [&](uint32_t opcode, int threads) {
    const bool forward = opcode == TERN_OP_CONV2D;
    Tensor result(TERN_DTYPE_F32, forward ? o_shape : in_shape);
    result.Poison();
    SetKernelThreadsForTesting(threads);
    const Status st = Exec(opcode, {&result, forward ? &input : &go, &weight}, ints);
    SetKernelThreadsForTesting(0);
    EXPECT_TRUE(st.ok()) << st.message();
    return result;
  };
  for (const uint32_t opcode : {TERN_OP_CONV2D, TERN_OP_CONV2D_BACKWARD_INPUT}) {
    const Tensor whole = run(opcode, 1);
    for (int threads : {2, 3}) {
      EXPECT_LT(MaxRelativeDifference(run(opcode, threads), whole), 1e-5)
          << isa::OpcodeName(opcode) << ", " << threads << " ways";
    }
  }
}

}  // namespace
}  // namespace tern::testing
