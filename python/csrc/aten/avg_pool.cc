// Native 2-D average pooling and its backward.
//
// The forward is one reduction: the (zero-padded) input seen through a view
// of shape [N, C, OH, OW, KH, KW] whose last two axes step through each
// window (the windows may overlap; only written operands may not), summed
// over the window axes. The divisor of each output is the same window sum of
// a plane that is 1 where an element counts (the input, or the padded input
// with count_include_pad) and 0 elsewhere, so ceil_mode's windows that hang
// over the edge and count_include_pad come out as the CPU computes them.
// The backward spreads each output gradient, divided by its window's count,
// over its window: one copy when windows do not overlap, else one add per
// window position. bfloat16 and float16 accumulate in float32.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

struct AvgPoolGeometry {
  bool ok = false;
  bool batched = false;
  int64_t kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0;
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  // The padded plane, extended where ceil_mode's last window hangs over.
  int64_t plane_h = 0, plane_w = 0;
};

int64_t Pick(at::IntArrayRef v, size_t i, int64_t fallback) {
  if (v.empty()) return fallback;
  return v.size() == 1 ? v[0] : v[i];
}

// PyTorch's pooling_output_shape: the last window must start inside the
// input or its left padding.
int64_t OutputSize(int64_t size, int64_t kernel, int64_t pad, int64_t stride, bool ceil_mode) {
  const int64_t span = size + 2 * pad - kernel;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= size + pad) --out;
  return out;
}

AvgPoolGeometry Geometry(const at::Tensor& self, at::IntArrayRef kernel, at::IntArrayRef stride,
                         at::IntArrayRef padding, bool ceil_mode) {
  AvgPoolGeometry g;
  if ((self.dim() != 3 && self.dim() != 4) || kernel.empty() || kernel.size() > 2 ||
      stride.size() > 2 || padding.size() > 2) {
    return g;
  }
  g.batched = self.dim() == 4;
  g.kh = Pick(kernel, 0, 1);
  g.kw = Pick(kernel, 1, 1);
  g.sh = Pick(stride, 0, g.kh);
  g.sw = Pick(stride, 1, g.kw);
  g.ph = Pick(padding, 0, 0);
  g.pw = Pick(padding, 1, 0);
  // The CPU's own limits (pad at most half the kernel); anything else is its error.
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.ph < 0 || g.pw < 0 || g.ph > g.kh / 2 ||
      g.pw > g.kw / 2) {
    return g;
  }
  g.n = g.batched ? self.size(0) : 1;
  g.c = self.size(-3);
  g.h = self.size(-2);
  g.w = self.size(-1);
  if (g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw) return g;
  g.oh = OutputSize(g.h, g.kh, g.ph, g.sh, ceil_mode);
  g.ow = OutputSize(g.w, g.kw, g.pw, g.sw, ceil_mode);
  g.plane_h = std::max(g.h + 2 * g.ph, (g.oh - 1) * g.sh + g.kh);
  g.plane_w = std::max(g.w + 2 * g.pw, (g.ow - 1) * g.sw + g.kw);
  g.ok = g.n * g.c * g.oh * g.ow > 0;
  return g;
}

std::vector<int64_t> OutShape(const AvgPoolGeometry& g) {
  if (g.batched) return {g.n, g.c, g.oh, g.ow};
  return {g.c, g.oh, g.ow};
}

// A contiguous [..., plane_h, plane_w] operand seen as [..., OH, OW, KH, KW]
// windows.
Operand Windows(const Operand& plane, const AvgPoolGeometry& g) {
  Operand o = plane;
  const int64_t rank = plane.dim();
  const int64_t row = plane.strides[rank - 2], col = plane.strides[rank - 1];
  o.shape.resize(rank - 2);
  o.strides.resize(rank - 2);
  o.shape.insert(o.shape.end(), {g.oh, g.ow, g.kh, g.kw});
  o.strides.insert(o.strides.end(), {g.sh * row, g.sw * col, row, col});
  return o;
}

// Each output's divisor as float32 [OH, OW]: a window sum of a plane that is
// 1 where an element counts.
Operand Divisors(Program& p, const AvgPoolGeometry& g, bool count_include_pad) {
  Operand ones = p.Temp(TERN_DTYPE_F32, {g.plane_h, g.plane_w});
  p.Emit(TERN_OP_FILL, {ones}, {}, {0.0});
  const int64_t top = count_include_pad ? 0 : g.ph, left = count_include_pad ? 0 : g.pw;
  const int64_t rows = count_include_pad ? g.h + 2 * g.ph : g.h;
  const int64_t cols = count_include_pad ? g.w + 2 * g.pw : g.w;
  p.Emit(TERN_OP_FILL, {ones.Slice(0, top, rows).Slice(1, left, cols)}, {}, {1.0});
  Operand counts = p.Temp(TERN_DTYPE_F32, {g.oh, g.ow, 1, 1});
  p.Emit(TERN_OP_REDUCE, {counts, Windows(ones, g)}, {TERN_REDUCE_SUM, 2, 3});
  return counts.View({g.oh, g.ow});
}

bool AvgPool(const at::Tensor& self, const AvgPoolGeometry& g, bool count_include_pad,
             std::optional<int64_t> divisor_override, const at::Tensor& out) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !at::isFloatingType(dtype) || !Supported(dtype) ||
      out.scalar_type() != dtype || (divisor_override && *divisor_override == 0)) {
    return false;
  }
  ResizeOut(out, OutShape(g));
  if (!OutputOk(out, {self})) return false;
  const std::vector<int64_t> o4 = {g.n, g.c, g.oh, g.ow};
  Program p("aten::avg_pool2d.out");
  Operand X = p.In(self);
  if (!g.batched) X = X.Unsqueeze(0);
  Operand plane = X;
  if (g.plane_h != g.h || g.plane_w != g.w) {
    plane = p.Temp(*TD(dtype), {g.n, g.c, g.plane_h, g.plane_w});
    p.Emit(TERN_OP_FILL, {plane}, {}, {0.0});
    p.Emit(TERN_OP_COPY, {plane.Slice(2, g.ph, g.h).Slice(3, g.pw, g.w), X});
  }
  Operand sums = p.Temp(TERN_DTYPE_F32, {g.n, g.c, g.oh, g.ow, 1, 1});
  p.Emit(TERN_OP_REDUCE, {sums, Windows(plane, g)}, {TERN_REDUCE_SUM, 4, 5});
  const Operand divisors =
      divisor_override ? p.Const(static_cast<double>(*divisor_override), TERN_DTYPE_F32).Expand(o4)
                       : Divisors(p, g, count_include_pad).Expand(o4);
  Operand O = p.Out(out);
  if (!g.batched) O = O.Unsqueeze(0);
  if (dtype == at::kFloat) {
    p.Emit(TERN_OP_BINARY, {O, sums.View(o4), divisors}, {TERN_BINARY_DIV});
  } else {
    Operand mean = p.Temp(TERN_DTYPE_F32, o4);
    p.Emit(TERN_OP_BINARY, {mean, sums.View(o4), divisors}, {TERN_BINARY_DIV});
    p.Emit(TERN_OP_CAST, {O, mean});
  }
  return p.ok() && p.Run();
}

at::Tensor& AvgPool2dOut(const at::Tensor& self, at::IntArrayRef kernel_size,
                         at::IntArrayRef stride, at::IntArrayRef padding, bool ceil_mode,
                         bool count_include_pad, std::optional<int64_t> divisor_override,
                         at::Tensor& out) {
  const AvgPoolGeometry g = Geometry(self, kernel_size, stride, padding, ceil_mode);
  if (g.ok && AvgPool(self, g, count_include_pad, divisor_override, out)) return out;
  return TERN_FALLBACK(avg_pool2d_out, self, kernel_size, stride, padding, ceil_mode,
                       count_include_pad, divisor_override, out);
}
TERN_ATEN_IMPL("avg_pool2d.out", AvgPool2dOut);

bool AvgPoolBackward(const at::Tensor& grad_output, const at::Tensor& self,
                     const AvgPoolGeometry& g, bool count_include_pad,
                     std::optional<int64_t> divisor_override, const at::Tensor& grad_input) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(grad_output) || !at::isFloatingType(dtype) || !Supported(dtype) ||
      grad_output.scalar_type() != dtype || grad_input.scalar_type() != dtype ||
      grad_output.sizes() != at::IntArrayRef(OutShape(g)) ||
      (divisor_override && *divisor_override == 0)) {
    return false;
  }
  ResizeOut(grad_input, self.sizes());
  if (!OutputOk(grad_input, {grad_output})) return false;
  const std::vector<int64_t> o4 = {g.n, g.c, g.oh, g.ow};
  Program p("aten::avg_pool2d_backward.grad_input");
  Operand GO = p.In(grad_output);
  if (!g.batched) GO = GO.Unsqueeze(0);
  // Each output's share of its gradient, in float32.
  const Operand divisors =
      divisor_override ? p.Const(static_cast<double>(*divisor_override), TERN_DTYPE_F32).Expand(o4)
                       : Divisors(p, g, count_include_pad).Expand(o4);
  Operand share = p.Temp(TERN_DTYPE_F32, o4);
  Operand go = GO;
  if (dtype != at::kFloat) {
    go = p.Temp(TERN_DTYPE_F32, o4);
    p.Emit(TERN_OP_CAST, {go, GO});
  }
  p.Emit(TERN_OP_BINARY, {share, go, divisors}, {TERN_BINARY_DIV});
  Operand plane = p.Temp(TERN_DTYPE_F32, {g.n, g.c, g.plane_h, g.plane_w});
  p.Emit(TERN_OP_FILL, {plane}, {}, {0.0});
  if (g.sh >= g.kh && g.sw >= g.kw) {
    // Disjoint windows: every element of the plane gets at most one share.
    p.Emit(TERN_OP_COPY,
           {Windows(plane, g),
            share.View({g.n, g.c, g.oh, g.ow, 1, 1}).Expand({g.n, g.c, g.oh, g.ow, g.kh, g.kw})});
  } else {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const Operand at = plane.Slice(2, i, g.oh, g.sh).Slice(3, j, g.ow, g.sw);
        p.Emit(TERN_OP_BINARY, {at, at, share}, {TERN_BINARY_ADD});
      }
    }
  }
  Operand GI = p.Out(grad_input);
  if (!g.batched) GI = GI.Unsqueeze(0);
  const Operand inside = plane.Slice(2, g.ph, g.h).Slice(3, g.pw, g.w);
  p.Emit(dtype == at::kFloat ? TERN_OP_COPY : TERN_OP_CAST, {GI, inside});
  return p.ok() && p.Run();
}

at::Tensor& AvgPool2dBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                 at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                 at::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                                 std::optional<int64_t> divisor_override, at::Tensor& grad_input) {
  const AvgPoolGeometry g = Geometry(self, kernel_size, stride, padding, ceil_mode);
  // One add per window position when windows overlap: bounded like max pool's chain.
  const bool small = g.sh >= g.kh && g.sw >= g.kw ? true : g.kh * g.kw <= 64;
  if (g.ok && small &&
      AvgPoolBackward(grad_output, self, g, count_include_pad, divisor_override, grad_input)) {
    return grad_input;
  }
  return TERN_FALLBACK(avg_pool2d_backward_grad_input, grad_output, self, kernel_size, stride,
                       padding, ceil_mode, count_include_pad, divisor_override, grad_input);
}
TERN_ATEN_IMPL("avg_pool2d_backward.grad_input", AvgPool2dBackwardOut);

}  // namespace
}  // namespace torch_tern::native
