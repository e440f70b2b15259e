// Native matrix products (mm, bmm, addmm, baddbmm, mv, dot) and 1-D/2-D
// convolutions with their backward. Transposed operands are strided views:
// the MATMUL instruction takes any strides, so `x @ w.t()` copies nothing.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

bool MatmulDtypeOk(at::ScalarType t) { return Supported(t) && t != at::kBool; }

bool AllTern(std::initializer_list<at::Tensor> ts, at::ScalarType dtype) {
  for (const at::Tensor& t : ts) {
    if (!IsTern(t) || t.scalar_type() != dtype) return false;
  }
  return MatmulDtypeOk(dtype);
}

// Scalars of an integer matmul must be integral.
bool ScalarOk(const at::Scalar& s, at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return std::isfinite(s.toDouble());
  return s.toDouble() == std::trunc(s.toDouble());
}

// out = alpha * a @ b + beta * self (self broadcast to out), batched when rank 3.
bool Gemm(const char* name, const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
          const at::Tensor& self, const at::Scalar& beta, const at::Scalar& alpha) {
  const at::ScalarType dtype = a.scalar_type();
  if (!AllTern({a, b, out}, dtype) || (self.defined() && !AllTern({self}, dtype))) return false;
  const int64_t rank = a.dim();
  if ((rank != 2 && rank != 3) || b.dim() != rank) return false;
  if (a.size(-1) != b.size(-2) || (rank == 3 && a.size(0) != b.size(0))) return false;
  std::vector<int64_t> shape = {a.size(-2), b.size(-1)};
  if (rank == 3) shape.insert(shape.begin(), a.size(0));
  if (self.defined() && at::infer_size(self.sizes(), shape) != shape) return false;
  if (!ScalarOk(alpha, dtype) || !ScalarOk(beta, dtype)) return false;
  ResizeOut(out, shape);
  if (!OutputOk(out, {a, b, self})) return false;
  const double alpha_v = alpha.toDouble();
  const double beta_v = self.defined() ? beta.toDouble() : 0.0;
  Program p(name);
  if (a.size(-1) == 1 && a.numel() > 0 && b.numel() > 0) {
    // K = 1: an outer product, computed elementwise (the simulated device's
    // oneDNN path rejects batched K = 1 layouts: reported as a library bug).
    const tern_dtype_t d = *TD(dtype);
    auto scalar = [&](double v) {
      return at::isFloatingType(dtype) ? p.Const(v, d) : p.ConstInt(static_cast<int64_t>(v), d);
    };
    Operand O = p.Out(out);
    Operand prod = p.Temp(d, shape);
    p.Emit(TERN_OP_BINARY, {prod, p.In(a).Expand(shape), p.In(b).Expand(shape)}, {TERN_BINARY_MUL});
    if (alpha_v != 1.0) {
      Operand scaled = p.Temp(d, shape);
      p.Emit(TERN_OP_BINARY, {scaled, prod, scalar(alpha_v).Expand(shape)}, {TERN_BINARY_MUL});
      prod = scaled;
    }
    if (beta_v == 0.0) {
      p.Emit(TERN_OP_COPY, {O, prod});
    } else {
      Operand base = p.In(self).Expand(shape);
      if (beta_v != 1.0) {
        Operand t = p.Temp(d, shape);
        p.Emit(TERN_OP_BINARY, {t, base, scalar(beta_v).Expand(shape)}, {TERN_BINARY_MUL});
        base = t;
      }
      p.Emit(TERN_OP_BINARY, {O, base, prod}, {TERN_BINARY_ADD});
    }
    return p.ok() && p.Run();
  }
  // Layout fixes for the simulated device's oneDNN path, which derives
  // layouts from strides and mishandles size-1 and stride-0 dimensions
  // (reported as library bugs): a batch of one is dropped, a batch-broadcast
  // operand (stride 0) is copied dense first, and a product with one row
  // (M = 1, N > 1) is computed transposed, out^T = b^T @ a^T.
  const bool drop_batch = rank == 3 && shape[0] == 1;
  const int64_t r = drop_batch ? 2 : rank;
  auto squeeze = [&](Operand o) { return drop_batch ? o.Select(0, 0) : o; };
  auto dense = [&](Operand o) {
    // Row- or column-major matrices, the batch outermost; anything else
    // (a broadcast batch, a batch interleaved with the rows) is copied.
    const int64_t rows = o.shape[r - 2], cols = o.shape[r - 1];
    const int64_t rs = o.strides[r - 2], cs = o.strides[r - 1];
    const bool row_major = (cols == 1 || cs == 1) && (rows == 1 || rs >= cols);
    const bool col_major = (rows == 1 || rs == 1) && (cols == 1 || cs >= rows);
    bool ok = row_major || col_major;
    if (r == 3 && o.shape[0] > 1) ok = ok && o.strides[0] >= rows * cols;
    if (!ok) {
      Operand t = p.Temp(o.dtype, o.shape);
      p.Emit(TERN_OP_COPY, {t, o});
      return t;
    }
    return o;
  };
  Operand O = squeeze(p.Out(out));
  Operand A = dense(squeeze(p.In(a).Expand(a.sizes())));
  Operand B = dense(squeeze(p.In(b)));
  const std::vector<int64_t> rshape(shape.end() - r, shape.end());
  const bool swap = rshape[r - 2] == 1 && rshape[r - 1] > 1;
  auto maybe_t = [&](Operand o) { return swap ? o.Transpose(-1, -2) : o; };
  if (swap) {
    const Operand a_t = B.Transpose(-1, -2);
    B = A.Transpose(-1, -2);
    A = a_t;
    O = O.Transpose(-1, -2);
  }
  if (beta_v == 0.0) {
    p.Emit(TERN_OP_MATMUL, {O, A, B}, {0, 0}, {alpha_v, 0.0});
  } else if (beta_v == 1.0 &&
             (self.dim() == rank ? self.size(-1) : self.numel()) == shape[rank - 1]) {
    // A bias operand (the simulated device misreads a bias whose last dim
    // is broadcast, stride 0: reported as a library bug; those go below).
    Operand bias = (self.dim() == 1 && r == 2 && !swap)
                       ? p.In(self)
                       : maybe_t(squeeze(p.In(self).Expand(shape)));
    p.Emit(TERN_OP_MATMUL, {O, A, B, bias}, {0, 0}, {alpha_v, 0.0});
  } else {
    const bool in_place = self.data_ptr() == out.data_ptr() && self.sizes() == out.sizes() &&
                          self.strides() == out.strides();
    if (!in_place) {
      if (self.storage().is_alias_of(out.storage())) return false;
      p.Emit(TERN_OP_COPY, {O, maybe_t(squeeze(p.In(self).Expand(shape)))});
    }
    p.Emit(TERN_OP_MATMUL, {O, A, B}, {0, 0}, {alpha_v, beta_v});
  }
  return p.ok() && p.Run();
}

at::Tensor& MmOut(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  if (self.dim() == 2 && Gemm("aten::mm.out", self, mat2, out, at::Tensor(), 0, 1)) return out;
  return TERN_FALLBACK(mm_out, self, mat2, out);
}
TERN_ATEN_IMPL("mm.out", MmOut);

at::Tensor& BmmOut(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  if (self.dim() == 3 && Gemm("aten::bmm.out", self, mat2, out, at::Tensor(), 0, 1)) return out;
  return TERN_FALLBACK(bmm_out, self, mat2, out);
}
TERN_ATEN_IMPL("bmm.out", BmmOut);

at::Tensor& AddmmOut(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                     const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  if (mat1.dim() == 2 && Gemm("aten::addmm.out", mat1, mat2, out, self, beta, alpha)) return out;
  return TERN_FALLBACK(addmm_out, self, mat1, mat2, beta, alpha, out);
}
TERN_ATEN_IMPL("addmm.out", AddmmOut);

at::Tensor& BaddbmmOut(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                       const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  if (batch1.dim() == 3 && Gemm("aten::baddbmm.out", batch1, batch2, out, self, beta, alpha)) {
    return out;
  }
  return TERN_FALLBACK(baddbmm_out, self, batch1, batch2, beta, alpha, out);
}
TERN_ATEN_IMPL("baddbmm.out", BaddbmmOut);

// Matrix-vector and dot products as [M,K] @ [K,1].
bool MatVec(const char* name, const at::Tensor& a, const at::Tensor& v, const at::Tensor& out) {
  const at::ScalarType dtype = a.scalar_type();
  if (!AllTern({a, v, out}, dtype) || v.dim() != 1) return false;
  const bool dot = a.dim() == 1;
  if ((a.dim() != 1 && a.dim() != 2) || a.size(-1) != v.size(0)) return false;
  const std::vector<int64_t> shape = dot ? std::vector<int64_t>{} : std::vector<int64_t>{a.size(0)};
  ResizeOut(out, shape);
  if (!OutputOk(out, {a, v})) return false;
  Program p(name);
  Operand A = dot ? p.In(a).Unsqueeze(0) : p.In(a);
  Operand O = dot ? p.Out(out).Unsqueeze(0).Unsqueeze(1) : p.Out(out).Unsqueeze(1);
  p.Emit(TERN_OP_MATMUL, {O, A, p.In(v).Unsqueeze(1)});
  return p.ok() && p.Run();
}

at::Tensor& AddmvOut(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec,
                     const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  if (IsTern(mat) && IsTern(vec) && IsTern(out) && mat.dim() == 2 && vec.dim() == 1 &&
      self.dim() <= 1) {
    ResizeOut(out, {mat.size(0)});
    const at::Tensor bias = self.dim() == 1 ? self.unsqueeze(1) : self;
    if (Gemm("aten::addmv.out", mat, vec.unsqueeze(1), out.unsqueeze(1), bias, beta, alpha)) {
      return out;
    }
  }
  return TERN_FALLBACK(addmv_out, self, mat, vec, beta, alpha, out);
}
TERN_ATEN_IMPL("addmv.out", AddmvOut);

at::Tensor& MvOut(const at::Tensor& self, const at::Tensor& vec, at::Tensor& out) {
  if (self.dim() == 2 && MatVec("aten::mv.out", self, vec, out)) return out;
  return TERN_FALLBACK(mv_out, self, vec, out);
}
TERN_ATEN_IMPL("mv.out", MvOut);

at::Tensor Dot(const at::Tensor& self, const at::Tensor& other) {
  if (IsTern(self) && self.dim() == 1 && other.dim() == 1) {
    at::Tensor out = at::empty({}, self.options());
    if (MatVec("aten::dot", self, other, out)) return out;
  }
  return TERN_FALLBACK(dot, self, other);
}
TERN_ATEN_IMPL("dot", Dot);

// ---- Convolution ---------------------------------------------------------------------------

struct ConvGeometry {
  bool ok = false;
  bool one_d = false;              // a 1-D convolution run as 2-D with H = 1
  std::vector<int64_t> ints;       // stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups
  std::vector<int64_t> out_shape;  // in the caller's rank
  bool depthwise = false;          // groups == channels == outputs: one filter per channel
};

ConvGeometry Geometry(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                      int64_t groups) {
  ConvGeometry g;
  const int64_t rank = weight.dim();
  if (transposed || (rank != 3 && rank != 4) || input.dim() != rank || groups < 1) return g;
  const int64_t spatial = rank - 2;
  auto param = [&](at::IntArrayRef v, int64_t i, int64_t dflt) {
    if (v.empty()) return dflt;
    return v.size() == 1 ? v[0] : (i < static_cast<int64_t>(v.size()) ? v[i] : -1);
  };
  if (static_cast<int64_t>(stride.size()) > spatial ||
      static_cast<int64_t>(padding.size()) > spatial ||
      static_cast<int64_t>(dilation.size()) > spatial) {
    return g;
  }
  const int64_t n = input.size(0), c = input.size(1), o = weight.size(0);
  if (c != weight.size(1) * groups || o % groups != 0) return g;
  g.one_d = spatial == 1;
  int64_t sh = 1, sw, ph = 0, pw, dh = 1, dw;
  if (g.one_d) {
    sw = param(stride, 0, 1);
    pw = param(padding, 0, 0);
    dw = param(dilation, 0, 1);
  } else {
    sh = param(stride, 0, 1);
    sw = param(stride, 1, 1);
    ph = param(padding, 0, 0);
    pw = param(padding, 1, 0);
    dh = param(dilation, 0, 1);
    dw = param(dilation, 1, 1);
  }
  if (sh < 1 || sw < 1 || ph < 0 || pw < 0 || dh < 1 || dw < 1) return g;
  const int64_t h = g.one_d ? 1 : input.size(2), w = input.size(-1);
  const int64_t kh = g.one_d ? 1 : weight.size(2), kw = weight.size(-1);
  const int64_t oh = (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
  const int64_t ow = (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  if (h + 2 * ph - dh * (kh - 1) - 1 < 0 || w + 2 * pw - dw * (kw - 1) - 1 < 0 || oh < 1 ||
      ow < 1) {
    return g;
  }
  g.ints = {sh, sw, ph, pw, dh, dw, groups};
  g.depthwise = groups > 1 && groups == c && o == c && weight.size(1) == 1;
  // Grouped convolutions other than depthwise take one instruction per
  // group (GroupSlices): up to 64.
  if (!g.depthwise && groups > 64) return g;
  g.out_shape = g.one_d ? std::vector<int64_t>{n, o, ow} : std::vector<int64_t>{n, o, oh, ow};
  g.ok = true;
  return g;
}

// Grouped convolutions run as one instruction per group over channel slices
// (groups = 1 each): the simulated device's oneDNN path fails to execute
// grouped primitives (reported as a library bug), and a group count is small.
struct GroupSlice {
  int64_t c_start, c_count, o_start, o_count;  // input channels, outputs
  std::vector<int64_t> ints;
  // `o` narrowed along `dim` to this group's input channels or outputs.
  Operand Channels(const Operand& o, int64_t dim) const { return o.Slice(dim, c_start, c_count); }
  Operand Outputs(const Operand& o, int64_t dim) const { return o.Slice(dim, o_start, o_count); }
};

std::vector<GroupSlice> GroupSlices(const ConvGeometry& g, int64_t channels, int64_t outputs) {
  const int64_t groups = g.ints[6];
  std::vector<GroupSlice> slices;
  for (int64_t i = 0; i < groups; ++i) {
    GroupSlice s{i * (channels / groups), channels / groups, i * (outputs / groups),
                 outputs / groups, g.ints};
    s.ints[6] = 1;
    slices.push_back(std::move(s));
  }
  return slices;
}

// A new tensor of `sizes` with `like`'s options, in the memory format it suggests.
at::Tensor EmptyIn(at::IntArrayRef sizes, const at::Tensor& like) {
  return at::empty(sizes, like.options().memory_format(like.suggest_memory_format()));
}

// A tensor as a 4-D NCHW operand (1-D convolutions: H = 1).
Operand Nchw(Program& p, const at::Tensor& t, bool output, bool one_d) {
  Operand o = output ? p.Out(t) : p.In(t);
  return one_d ? o.Unsqueeze(2) : o;
}

// Depthwise convolutions (one filter per channel: Mamba's causal conv1d,
// MobileNet's 3x3) as elementwise products of shifted views, one per filter
// tap, instead of one CONV2D per channel: with 128 or more channels that was
// 128 instructions, and the plugin fell back to the CPU. All in NCHW (1-D as
// H = 1), float32.
struct DepthwiseTaps {
  int64_t kh, kw, oh, ow, sh, sw, ph, pw, dh, dw;

  DepthwiseTaps(const ConvGeometry& g, const at::Tensor& weight)
      : kh(g.one_d ? 1 : weight.size(2)),
        kw(weight.size(-1)),
        oh(g.one_d ? 1 : g.out_shape[2]),
        ow(g.out_shape.back()),
        sh(g.ints[0]),
        sw(g.ints[1]),
        ph(g.ints[2]),
        pw(g.ints[3]),
        dh(g.ints[4]),
        dw(g.ints[5]) {}

  // The input elements tap (i, j) multiplies, from the padded input.
  Operand Window(const Operand& padded, int64_t i, int64_t j) const {
    return padded.Slice(2, i * dh, oh, sh).Slice(3, j * dw, ow, sw);
  }
  // Weight [C, 1, kh, kw] at tap (i, j) as [1, C, 1, 1], broadcast to `shape`.
  static Operand Tap(const Operand& weight, int64_t i, int64_t j, c10::IntArrayRef shape) {
    return weight.Select(1, 0)
        .Select(2, j)
        .Select(1, i)
        .Unsqueeze(0)
        .Unsqueeze(2)
        .Unsqueeze(3)
        .Expand(shape);
  }
};

// A zero-padded copy of `x` (NCHW operand) in scratch, or `x` itself.
Operand Padded(Program& p, const Operand& x, int64_t ph, int64_t pw) {
  if (ph == 0 && pw == 0) return x;
  Operand padded =
      p.Temp(x.dtype, {x.shape[0], x.shape[1], x.shape[2] + 2 * ph, x.shape[3] + 2 * pw});
  p.Emit(TERN_OP_FILL, {padded}, {}, {0.0});
  p.Emit(TERN_OP_COPY, {padded.Slice(2, ph, x.shape[2]).Slice(3, pw, x.shape[3]), x});
  return padded;
}

void EmitDepthwiseForward(Program& p, const ConvGeometry& g, const at::Tensor& weight,
                          const Operand& out, const Operand& x, const Operand& w,
                          const Operand& bias) {
  const DepthwiseTaps t(g, weight);
  const Operand padded = Padded(p, x, t.ph, t.pw);
  const Operand product = p.Temp(out.dtype, out.shape);
  if (bias.present()) {
    p.Emit(TERN_OP_COPY, {out, bias.Unsqueeze(0).Unsqueeze(2).Unsqueeze(3).Expand(out.shape)});
  } else {
    p.Emit(TERN_OP_FILL, {out}, {}, {0.0});
  }
  for (int64_t i = 0; i < t.kh; ++i) {
    for (int64_t j = 0; j < t.kw; ++j) {
      p.Emit(TERN_OP_BINARY,
             {product, t.Window(padded, i, j), DepthwiseTaps::Tap(w, i, j, out.shape)},
             {TERN_BINARY_MUL});
      p.Emit(TERN_OP_BINARY, {out, out, product}, {TERN_BINARY_ADD});
    }
  }
}

at::Tensor Convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  const at::ScalarType dtype = input.scalar_type();
  const bool has_bias = bias.has_value() && bias->defined();
  if (AllTern({input, weight}, dtype) && at::isFloatingType(dtype) &&
      (!has_bias || (AllTern({*bias}, dtype) && bias->dim() == 1))) {
    const ConvGeometry g = Geometry(input, weight, stride, padding, dilation, transposed, groups);
    if (g.ok && (!has_bias || bias->size(0) == weight.size(0))) {
      at::Tensor out = EmptyIn(g.out_shape, input);
      Program p("aten::convolution");
      const Operand O = Nchw(p, out, true, g.one_d), X = Nchw(p, input, false, g.one_d),
                    W = Nchw(p, weight, false, g.one_d);
      const Operand B = has_bias ? p.In(*bias) : program::None();
      if (g.depthwise && dtype == at::kFloat) {
        EmitDepthwiseForward(p, g, weight, O, X, W, B);
        if (p.ok() && p.Run()) return out;
        return TERN_FALLBACK(convolution, input, weight, bias, stride, padding, dilation,
                             transposed, output_padding, groups);
      }
      if (groups > 64) {
        return TERN_FALLBACK(convolution, input, weight, bias, stride, padding, dilation,
                             transposed, output_padding, groups);
      }
      // One instruction per group (see GroupSlices).
      for (const GroupSlice& s : GroupSlices(g, input.size(1), weight.size(0))) {
        p.Emit(TERN_OP_CONV2D,
               {s.Outputs(O, 1), s.Channels(X, 1), s.Outputs(W, 0),
                has_bias ? s.Outputs(B, 0) : program::None()},
               s.ints);
      }
      if (p.ok() && p.Run()) return out;
    }
  }
  return TERN_FALLBACK(convolution, input, weight, bias, stride, padding, dilation, transposed,
                       output_padding, groups);
}
TERN_ATEN_IMPL("convolution", Convolution);

// A convolution's bias gradient: grad_output summed over batch and positions.
at::Tensor EmitGradBias(Program& p, const Operand& grad_output, const at::Tensor& weight) {
  at::Tensor grad_bias = at::empty({weight.size(0)}, weight.options());
  p.Emit(TERN_OP_REDUCE, {p.Out(grad_bias).View({1, weight.size(0), 1, 1}), grad_output},
         {TERN_REDUCE_SUM, 0, 2, 3});
  return grad_bias;
}

// The depthwise backward, tap by tap: grad_input accumulates each tap's
// grad_output * weight into its window of a padded gradient; grad_weight's
// tap is the sum of grad_output * window over batch and positions.
std::tuple<at::Tensor, at::Tensor, at::Tensor> DepthwiseBackward(
    Program& p, const ConvGeometry& g, const Operand& go, const at::Tensor& input,
    const at::Tensor& weight, std::array<bool, 3> output_mask, const at::Tensor& grad_output,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, at::OptionalIntArrayRef bias_sizes) {
  const DepthwiseTaps t(g, weight);
  at::Tensor grad_input, grad_weight, grad_bias;
  const Operand X = Nchw(p, input, false, g.one_d), W = Nchw(p, weight, false, g.one_d);
  const Operand product = p.Temp(go.dtype, go.shape);
  if (output_mask[0]) {
    grad_input = EmptyIn(input.sizes(), input);
    const Operand GI = Nchw(p, grad_input, true, g.one_d);
    Operand padded = GI;
    if (t.ph != 0 || t.pw != 0) {
      padded = p.Temp(GI.dtype,
                      {GI.shape[0], GI.shape[1], GI.shape[2] + 2 * t.ph, GI.shape[3] + 2 * t.pw});
    }
    p.Emit(TERN_OP_FILL, {padded}, {}, {0.0});
    for (int64_t i = 0; i < t.kh; ++i) {
      for (int64_t j = 0; j < t.kw; ++j) {
        const Operand window = t.Window(padded, i, j);
        p.Emit(TERN_OP_BINARY, {product, go, DepthwiseTaps::Tap(W, i, j, go.shape)},
               {TERN_BINARY_MUL});
        p.Emit(TERN_OP_BINARY, {window, window, product}, {TERN_BINARY_ADD});
      }
    }
    if (t.ph != 0 || t.pw != 0) {
      p.Emit(TERN_OP_COPY, {GI, padded.Slice(2, t.ph, GI.shape[2]).Slice(3, t.pw, GI.shape[3])});
    }
  }
  if (output_mask[1]) {
    grad_weight = EmptyIn(weight.sizes(), weight);
    const Operand GW = Nchw(p, grad_weight, true, g.one_d);
    const Operand padded = Padded(p, X, t.ph, t.pw);
    for (int64_t i = 0; i < t.kh; ++i) {
      for (int64_t j = 0; j < t.kw; ++j) {
        p.Emit(TERN_OP_BINARY, {product, go, t.Window(padded, i, j)}, {TERN_BINARY_MUL});
        const Operand tap =
            GW.Select(1, 0).Select(2, j).Select(1, i).Unsqueeze(0).Unsqueeze(2).Unsqueeze(3);
        p.Emit(TERN_OP_REDUCE, {tap, product}, {TERN_REDUCE_SUM, 0, 2, 3});
      }
    }
  }
  if (output_mask[2]) grad_bias = EmitGradBias(p, go, weight);
  if (!output_mask[0] && !output_mask[1] && !output_mask[2]) return {};
  if (p.ok() && p.Run()) return {grad_input, grad_weight, grad_bias};
  return TERN_FALLBACK(convolution_backward, grad_output, input, weight, bias_sizes, stride,
                       padding, dilation, transposed, output_padding, weight.size(0), output_mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ConvolutionBackward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool transposed, at::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  const at::ScalarType dtype = input.scalar_type();
  if (AllTern({grad_output, input, weight}, dtype) && at::isFloatingType(dtype)) {
    const ConvGeometry g = Geometry(input, weight, stride, padding, dilation, transposed, groups);
    if (g.ok && grad_output.sizes() == at::IntArrayRef(g.out_shape)) {
      at::Tensor grad_input, grad_weight, grad_bias;
      Program p("aten::convolution_backward");
      const Operand go = Nchw(p, grad_output, false, g.one_d);
      if (g.depthwise && dtype == at::kFloat) {
        return DepthwiseBackward(p, g, go, input, weight, output_mask, grad_output, stride, padding,
                                 dilation, transposed, output_padding, bias_sizes);
      }
      if (groups > 64) {
        return TERN_FALLBACK(convolution_backward, grad_output, input, weight, bias_sizes, stride,
                             padding, dilation, transposed, output_padding, groups, output_mask);
      }
      const std::vector<GroupSlice> slices = GroupSlices(g, input.size(1), weight.size(0));
      if (output_mask[0]) {
        grad_input = EmptyIn(input.sizes(), input);
        const Operand GI = Nchw(p, grad_input, true, g.one_d), W = Nchw(p, weight, false, g.one_d);
        for (const GroupSlice& s : slices) {
          p.Emit(TERN_OP_CONV2D_BACKWARD_INPUT,
                 {s.Channels(GI, 1), s.Outputs(go, 1), s.Outputs(W, 0)}, s.ints);
        }
      }
      if (output_mask[1]) {
        grad_weight = EmptyIn(weight.sizes(), weight);
        const Operand GW = Nchw(p, grad_weight, true, g.one_d), X = Nchw(p, input, false, g.one_d);
        for (const GroupSlice& s : slices) {
          p.Emit(TERN_OP_CONV2D_BACKWARD_WEIGHT,
                 {s.Outputs(GW, 0), s.Outputs(go, 1), s.Channels(X, 1)}, s.ints);
        }
      }
      if (output_mask[2]) grad_bias = EmitGradBias(p, go, weight);
      if (!output_mask[0] && !output_mask[1] && !output_mask[2]) return {};
      if (p.ok() && p.Run()) return {grad_input, grad_weight, grad_bias};
    }
  }
  return TERN_FALLBACK(convolution_backward, grad_output, input, weight, bias_sizes, stride,
                       padding, dilation, transposed, output_padding, groups, output_mask);
}
TERN_ATEN_IMPL("convolution_backward", ConvolutionBackward);

}  // namespace

}  // namespace torch_tern::native
