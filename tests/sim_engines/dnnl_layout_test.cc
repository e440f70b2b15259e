// Layouts that the oneDNN path of matmul and conv2d once got wrong or
// refused without falling back: size-1 dimensions with any stride, batch
// broadcasts by stride 0, a bias broadcast along N, K = 1 and interleaved
// batches, grouped convolutions. Each against a naive double reference,
// through oneDNN (with its fallbacks) and through the portable loops.
#include <cmath>

#include "driver_shim/sim/engines/kernels_testing.h"
#include "kernel_test_util.h"

namespace tern::testing {
namespace {

class DnnlLayout : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { previous_ = sim::SetOneDnnDisabledForTesting(!GetParam()); }
  void TearDown() override { sim::SetOneDnnDisabledForTesting(previous_); }
  bool previous_ = false;
};

Shape RowMajor(const Shape& shape) {
  Shape s(shape.size());
  int64_t v = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    s[i] = v;
    v *= shape[i];
  }
  return s;
}

// out = a @ b (+ bias) with a [..., M, K], b [..., K, N] of out's rank (any
// strides), bias null, [N] or out-shaped (any strides). f32.
// `prepared`: the instruction is prepared first, as loading a program
// prepares it (oneDNN's primitive made and run once, which is where it may
// refuse a layout), with b in the constants.
void CheckMatmulWith(Tensor& a, Tensor& b, Tensor* bias, const std::string& what, uint64_t seed,
                     double alpha, double beta, bool prepared = false) {
  std::mt19937_64 rng(seed);
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const size_t r = as.size();
  ASSERT_EQ(bs.size(), r);
  const int64_t m = as[r - 2], k = as[r - 1], n = bs[r - 1];
  Shape o_shape(as.begin(), as.end() - 2);
  o_shape.insert(o_shape.end(), {m, n});
  a.Randomize(rng, -1, 1);
  b.Randomize(rng, -1, 1);
  if (bias) bias->Randomize(rng, -1, 1);
  Tensor out(TERN_DTYPE_F32, o_shape);
  out.Randomize(rng, -1, 1);
  const std::vector<double> ov = out.Values();
  const std::vector<double> av = a.Values(), bv = b.Values();
  const std::vector<double> biasv = bias ? bias->Values() : std::vector<double>();
  const Shape ast = RowMajor(as), bst = RowMajor(bs);
  std::vector<double> ref(out.count());
  for (int64_t o = 0; o < out.count(); ++o) {
    const std::vector<int64_t> idx = out.Index(o);
    int64_t abase = 0, bbase = 0;
    for (size_t d = 0; d + 2 < r; ++d) {
      abase += idx[d] * ast[d];
      bbase += idx[d] * bst[d];
    }
    double acc = 0;
    for (int64_t kk = 0; kk < k; ++kk) {
      acc += av[abase + idx[r - 2] * ast[r - 2] + kk] * bv[bbase + kk * bst[r - 2] + idx[r - 1]];
    }
    acc = alpha * acc + beta * ov[o];
    if (bias) acc += bias->desc().rank == 1 ? biasv[idx[r - 1]] : biasv[o];
    ref[o] = RoundToDtype(TERN_DTYPE_F32, acc);
  }
  std::vector<Tensor*> ops = {&out, &a, &b};
  if (bias) ops.push_back(bias);
  bool kept = false;
  Status st = prepared ? ExecPrepared(TERN_OP_MATMUL, ops, 2, {0, 0}, {alpha, beta}, &kept)
                       : Exec(TERN_OP_MATMUL, ops, {0, 0}, {alpha, beta});
  ASSERT_TRUE(st.ok()) << what << ": " << st.message();
  const double mag = std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)));
  EXPECT_TRUE(Near(out, ref, Tolerance{1e-4, 1e-5 * mag}))
      << what << " alpha " << alpha << " beta " << beta;
}

// Plain, then with alpha and beta (oneDNN output scales and a sum post-op),
// on fresh copies of the operands' layouts.
void CheckMatmul(Tensor& a, Tensor& b, Tensor* bias, const std::string& what, uint64_t seed) {
  CheckMatmulWith(a, b, bias, what, seed, 1.0, 0.0);
  CheckMatmulWith(a, b, bias, what, seed + 100, 1.0, 1.0);
  CheckMatmulWith(a, b, bias, what, seed + 200, 0.5, 2.0);
}

constexpr tern_dtype_t kF32 = TERN_DTYPE_F32;

// Bug 1: size-1 dimensions, whatever their stride (PyTorch gives a size-1
// dimension any stride, 1 and 0 included).
TEST_P(DnnlLayout, MatmulSizeOneDimensions) {
  {
    Tensor a(kF32, {1, 8}), b(kF32, {8, 4});
    CheckMatmul(a, b, nullptr, "[1,8] @ [8,4]", 1);
  }
  {
    Tensor a = Tensor::Strided(kF32, {1, 8}, {1, 1}), b(kF32, {8, 4});
    CheckMatmul(a, b, nullptr, "[1,8] (strides 1,1) @ [8,4]", 2);
  }
  {
    Tensor a = Tensor::Strided(kF32, {1, 8}, {0, 1}), b(kF32, {8, 4});
    CheckMatmul(a, b, nullptr, "[1,8] (strides 0,1) @ [8,4]", 3);
  }
  {
    Tensor a(kF32, {6, 8}), b = Tensor::Strided(kF32, {8, 1}, {1, 1});
    CheckMatmul(a, b, nullptr, "[6,8] @ [8,1] (strides 1,1)", 4);
  }
  {
    // A single row times a [8,4] transposed view of a [4,8] buffer.
    Tensor a = Tensor::Strided(kF32, {1, 8}, {8, 1});
    Tensor b = Tensor::Permuted(kF32, {8, 4}, {1, 0});
    CheckMatmul(a, b, nullptr, "[1,8] @ [8,4]^T view", 5);
  }
  {
    Tensor a(kF32, {1, 1, 8}), b(kF32, {1, 8, 4});
    Tensor bias(kF32, {4});
    CheckMatmul(a, b, &bias, "[1,1,8] @ [1,8,4] + [4]", 6);
  }
  {
    Tensor a = Tensor::Strided(kF32, {3, 1, 8}, {8, 1, 1}), b(kF32, {3, 8, 5});
    CheckMatmul(a, b, nullptr, "[3,1,8] (strides 8,1,1) @ [3,8,5]", 7);
  }
}

// Bug 2: stride-0 batch broadcasts and a batch of one.
TEST_P(DnnlLayout, MatmulBatchBroadcastAndBatchOfOne) {
  {
    // torch.matmul([5,10], [5,10,5]): a expanded to [5,5,10] with stride 0.
    Tensor a = Tensor::Broadcast(kF32, {5, 5, 10}, {true, false, false}), b(kF32, {5, 10, 5});
    CheckMatmul(a, b, nullptr, "[5,10] expanded @ [5,10,5]", 11);
  }
  {
    Tensor a(kF32, {5, 5, 10}), b = Tensor::Broadcast(kF32, {5, 10, 5}, {true, false, false});
    CheckMatmul(a, b, nullptr, "[5,5,10] @ [10,5] expanded", 12);
  }
  {
    Tensor a = Tensor::Broadcast(kF32, {2, 3, 4, 6}, {false, true, false, false});
    Tensor b = Tensor::Broadcast(kF32, {2, 3, 6, 5}, {true, false, false, false});
    CheckMatmul(a, b, nullptr, "[2,1->3,4,6] @ [1->2,3,6,5]", 13);
  }
  {
    Tensor a(kF32, {1, 512, 1}), b(kF32, {1, 1, 128});
    CheckMatmul(a, b, nullptr, "[1,512,1] @ [1,1,128]", 14);
  }
  {
    Tensor a = Tensor::Strided(kF32, {1, 512, 1}, {1, 1, 1});
    Tensor b = Tensor::Strided(kF32, {1, 1, 128}, {0, 0, 1});
    CheckMatmul(a, b, nullptr, "[1,512,1] @ [1,1,128] (degenerate strides)", 15);
  }
}

// Bug 3: a bias broadcast along N too (addmm with a 0-d self), and a
// stride-0 rank-1 bias.
TEST_P(DnnlLayout, MatmulFullyBroadcastBias) {
  {
    Tensor a(kF32, {4, 6}), b(kF32, {6, 7});
    Tensor bias = Tensor::Broadcast(kF32, {4, 7}, {true, true});
    CheckMatmul(a, b, &bias, "[4,6] @ [6,7] + scalar expanded to [4,7]", 21);
  }
  {
    Tensor a(kF32, {4, 6}), b(kF32, {6, 7});
    Tensor bias = Tensor::Strided(kF32, {7}, {0});
    CheckMatmul(a, b, &bias, "[4,6] @ [6,7] + [7] stride 0", 22);
  }
  {
    Tensor a(kF32, {2, 3, 6}), b(kF32, {2, 6, 5});
    Tensor bias = Tensor::Broadcast(kF32, {2, 3, 5}, {true, true, true});
    CheckMatmul(a, b, &bias, "[2,3,6] @ [2,6,5] + scalar expanded", 23);
  }
  {
    // N = 1: a stride-0 last dimension is just a size-1 dimension.
    Tensor a(kF32, {4, 6}), b(kF32, {6, 1});
    Tensor bias = Tensor::Broadcast(kF32, {4, 1}, {true, true});
    CheckMatmul(a, b, &bias, "[4,6] @ [6,1] + scalar expanded", 24);
  }
  {
    // Row bias still through the direct path.
    Tensor a(kF32, {4, 6}), b(kF32, {6, 7});
    Tensor bias = Tensor::Broadcast(kF32, {4, 7}, {true, false});
    CheckMatmul(a, b, &bias, "[4,6] @ [6,7] + row bias", 25);
  }
}

// Bug 4: K = 1 batched, and a batch dimension interleaved with the rows.
TEST_P(DnnlLayout, MatmulKOneAndInterleavedBatch) {
  {
    Tensor a(kF32, {3, 4, 1}), b(kF32, {3, 1, 5});
    CheckMatmul(a, b, nullptr, "[3,4,1] @ [3,1,5]", 31);
  }
  {
    Tensor a(kF32, {2, 3, 4, 1}), b(kF32, {2, 3, 1, 6});
    Tensor bias(kF32, {6});
    CheckMatmul(a, b, &bias, "[2,3,4,1] @ [2,3,1,6] + [6]", 32);
  }
  {
    // a [B, M, K] stored as [M, B, K] (e.g. a transpose(0, 1) of attention).
    Tensor a = Tensor::Permuted(kF32, {4, 6, 8}, {1, 0, 2}), b(kF32, {4, 8, 5});
    CheckMatmul(a, b, nullptr, "[4,6,8] stored [6,4,8] @ [4,8,5]", 33);
  }
  {
    Tensor a(kF32, {4, 6, 8}), b = Tensor::Permuted(kF32, {4, 8, 5}, {2, 0, 1});
    CheckMatmul(a, b, nullptr, "[4,6,8] @ [4,8,5] stored [5,4,8]", 34);
  }
  {
    // Attention's scores: per-head views of one [tokens, 3 x width] QKV
    // buffer, q [heads, tokens, 16] and k^T [heads, 16, tokens] (K
    // contiguous), whose batch stride is smaller than their row stride.
    Tensor a = Tensor::Strided(kF32, {4, 12, 16}, {16, 192, 1});
    Tensor b = Tensor::Strided(kF32, {4, 16, 12}, {16, 1, 192});
    CheckMatmul(a, b, nullptr, "attention scores: q [4,12,16] @ k^T [4,16,12], heads of one buffer",
                35);
  }
  {
    // GPT-2's (4 heads of 64, 64 tokens), scaled by 1/sqrt(64), direct and
    // prepared. (In a PyTorch process oneDNN refused this layout when loading
    // ran its primitive once, dnnl_unimplemented, and the product took the
    // gathered path; in this process it runs direct. Cases 39 and 40 take
    // the gathered path by construction.)
    Tensor a = Tensor::Strided(kF32, {4, 64, 64}, {64, 768, 1});
    Tensor b = Tensor::Strided(kF32, {4, 64, 64}, {64, 1, 768});
    CheckMatmulWith(a, b, nullptr, "GPT-2's attention scores", 37, 0.125, 0.0);
    CheckMatmulWith(a, b, nullptr, "GPT-2's attention scores, prepared", 38, 0.125, 0.0,
                    /*prepared=*/true);
  }
  {
    // A row broadcast (stride 0 along M) takes the gathered path whatever
    // oneDNN would say, with a B whose K dimension is contiguous: gathered
    // as N x K and handed to oneDNN (or the loops) as such.
    Tensor a = Tensor::Strided(kF32, {4, 12, 16}, {16, 0, 1});
    Tensor b = Tensor::Strided(kF32, {4, 16, 12}, {16, 1, 192});
    CheckMatmul(a, b, nullptr, "[4,12 (stride 0),16] @ k^T [4,16,12]", 39);
    Tensor b3 = Tensor::Permuted(kF32, {3, 16, 12}, {0, 2, 1});
    Tensor a3 = Tensor::Strided(kF32, {3, 12, 16}, {16, 0, 1});
    CheckMatmul(a3, b3, nullptr, "[3,12 (stride 0),16] @ [3,16,12] stored [3,12,16]", 40);
  }
  {
    // ... and its values: probs [heads, tokens, tokens] @ v [heads, tokens, 16].
    Tensor a(kF32, {4, 12, 12});
    Tensor b = Tensor::Strided(kF32, {4, 12, 16}, {16, 192, 1});
    CheckMatmul(a, b, nullptr, "attention values: [4,12,12] @ v [4,12,16], heads of one buffer",
                36);
  }
}

// Bug 5: grouped convolutions (groups neither 1 nor C), forward and both
// backwards.
struct GroupedCase {
  int64_t n, c, h, w, o, kh, kw, pad, groups;
};

TEST_P(DnnlLayout, GroupedConv2d) {
  const GroupedCase cases[] = {
      {2, 6, 5, 5, 6, 3, 3, 0, 3},  // the reproducer
      {2, 6, 5, 5, 6, 3, 3, 1, 3},
      {1, 4, 6, 5, 8, 3, 2, 1, 2},
  };
  std::mt19937_64 rng(51);
  for (const GroupedCase& c : cases) {
    const int64_t oh = c.h + 2 * c.pad - c.kh + 1, ow = c.w + 2 * c.pad - c.kw + 1;
    const int64_t cg = c.c / c.groups, og = c.o / c.groups;
    const Shape in_shape = {c.n, c.c, c.h, c.w}, w_shape = {c.o, cg, c.kh, c.kw},
                o_shape = {c.n, c.o, oh, ow};
    const std::vector<int64_t> ints = {1, 1, c.pad, c.pad, 1, 1, c.groups};
    Tensor input(kF32, in_shape), weight(kF32, w_shape), bias(kF32, {c.o}), go(kF32, o_shape);
    input.Randomize(rng, -1, 1);
    weight.Randomize(rng, -1, 1);
    bias.Randomize(rng, -1, 1);
    go.Randomize(rng, -1, 1);
    const std::vector<double> iv = input.Values(), wv = weight.Values(), bv = bias.Values(),
                              gov = go.Values();
    std::vector<double> out_ref(c.n * c.o * oh * ow), gi_ref(input.count(), 0.0),
        gw_ref(weight.count(), 0.0);
    for (int64_t n = 0; n < c.n; ++n)
      for (int64_t o = 0; o < c.o; ++o)
        for (int64_t y = 0; y < oh; ++y)
          for (int64_t x = 0; x < ow; ++x) {
            const int64_t oi = ((n * c.o + o) * oh + y) * ow + x;
            double acc = bv[o];
            for (int64_t ci = 0; ci < cg; ++ci)
              for (int64_t ky = 0; ky < c.kh; ++ky)
                for (int64_t kx = 0; kx < c.kw; ++kx) {
                  const int64_t iy = y - c.pad + ky, ix = x - c.pad + kx;
                  if (iy < 0 || iy >= c.h || ix < 0 || ix >= c.w) continue;
                  const int64_t ch = (o / og) * cg + ci;
                  const int64_t ii = ((n * c.c + ch) * c.h + iy) * c.w + ix;
                  const int64_t wi = ((o * cg + ci) * c.kh + ky) * c.kw + kx;
                  acc += iv[ii] * wv[wi];
                  gi_ref[ii] += gov[oi] * wv[wi];
                  gw_ref[wi] += gov[oi] * iv[ii];
                }
            out_ref[oi] = acc;
          }
    const std::string what = fmt::format("conv2d in {} w {} pad {} groups {}", ShapeStr(in_shape),
                                         ShapeStr(w_shape), c.pad, c.groups);
    const double mag = std::sqrt(static_cast<double>(cg * c.kh * c.kw));
    const double wide = std::sqrt(static_cast<double>(c.n * oh * ow));
    Tensor out(kF32, o_shape), gi(kF32, in_shape), gw(kF32, w_shape);
    out.Poison();
    gi.Poison();
    gw.Poison();
    Status st = Exec(TERN_OP_CONV2D, {&out, &input, &weight, &bias}, ints);
    ASSERT_TRUE(st.ok()) << what << ": " << st.message();
    EXPECT_TRUE(Near(out, out_ref, Tolerance{1e-4, 1e-5 * mag})) << what;
    st = Exec(TERN_OP_CONV2D_BACKWARD_INPUT, {&gi, &go, &weight}, ints);
    ASSERT_TRUE(st.ok()) << what << ": " << st.message();
    EXPECT_TRUE(Near(gi, gi_ref, Tolerance{1e-4, 1e-5 * mag})) << "backward input " << what;
    st = Exec(TERN_OP_CONV2D_BACKWARD_WEIGHT, {&gw, &go, &input}, ints);
    ASSERT_TRUE(st.ok()) << what << ": " << st.message();
    EXPECT_TRUE(Near(gw, gw_ref, Tolerance{1e-4, 1e-5 * wide})) << "backward weight " << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, DnnlLayout, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("OneDnn") : std::string("Loops");
                         });

}  // namespace
}  // namespace tern::testing
