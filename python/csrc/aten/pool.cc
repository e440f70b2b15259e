// Native 2-D max pooling with indices, and its backward.
//
// The ISA has no pooling instruction; a max pool is a chain over the kernel
// window: every window position is a strided view of the (padded) input, and
// each one updates the running maximum and its index where it is larger (or
// NaN), in row-major window order, exactly as the CPU kernel scans. The
// backward adds each output gradient at its index (SCATTER_ADD_ALONG_AXIS
// over the flattened planes).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

struct PoolGeometry {
  bool ok = false;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  int64_t n, c, h, w, oh, ow;
  bool batched;
};

int64_t Param(at::IntArrayRef v, size_t i, int64_t dflt) {
  if (v.empty()) return dflt;
  return v.size() == 1 ? v[0] : v[i];
}

PoolGeometry Geometry(const at::Tensor& self, at::IntArrayRef kernel, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  PoolGeometry g;
  if ((self.dim() != 3 && self.dim() != 4) || ceil_mode || kernel.empty() || kernel.size() > 2 ||
      stride.size() > 2 || padding.size() > 2 || dilation.size() > 2) {
    return g;
  }
  g.batched = self.dim() == 4;
  g.kh = Param(kernel, 0, 1);
  g.kw = Param(kernel, 1, 1);
  g.sh = Param(stride, 0, g.kh);
  g.sw = Param(stride, 1, g.kw);
  g.ph = Param(padding, 0, 0);
  g.pw = Param(padding, 1, 0);
  g.dh = Param(dilation, 0, 1);
  g.dw = Param(dilation, 1, 1);
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.ph < 0 || g.pw < 0 || g.dh < 1 ||
      g.dw < 1 || g.ph > g.kh / 2 || g.pw > g.kw / 2 || g.kh * g.kw > 64) {
    return g;
  }
  g.n = g.batched ? self.size(0) : 1;
  g.c = self.size(-3);
  g.h = self.size(-2);
  g.w = self.size(-1);
  const int64_t span_h = g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1;
  const int64_t span_w = g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1;
  if (span_h < 0 || span_w < 0) return g;
  g.oh = span_h / g.sh + 1;
  g.ow = span_w / g.sw + 1;
  g.ok = g.n * g.c * g.oh * g.ow > 0;
  return g;
}

std::vector<int64_t> OutShape(const PoolGeometry& g) {
  if (g.batched) return {g.n, g.c, g.oh, g.ow};
  return {g.c, g.oh, g.ow};
}

bool MaxPool(const at::Tensor& self, const PoolGeometry& g, const at::Tensor& out,
             const at::Tensor& indices) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !at::isFloatingType(dtype) || !Supported(dtype) ||
      out.scalar_type() != dtype || indices.scalar_type() != at::kLong) {
    return false;
  }
  ResizeOut(out, OutShape(g));
  ResizeOut(indices, OutShape(g));
  if (!OutputOk(out, {self}) || !OutputOk(indices, {self})) return false;
  const tern_dtype_t d = *TD(dtype);
  const std::vector<int64_t> o4 = {g.n, g.c, g.oh, g.ow};
  Program p("aten::max_pool2d_with_indices.out");
  Operand X = p.In(self);
  if (!g.batched) X = X.Unsqueeze(0);
  Operand src = X;
  if (g.ph > 0 || g.pw > 0) {
    src = p.Temp(d, {g.n, g.c, g.h + 2 * g.ph, g.w + 2 * g.pw});
    p.Emit(TERN_OP_FILL, {src}, {}, {-INFINITY});
    p.Emit(TERN_OP_COPY, {src.Slice(2, g.ph, g.h).Slice(3, g.pw, g.w), X});
  }
  Operand O = p.Out(out), I = p.Out(indices);
  if (!g.batched) {
    O = O.Unsqueeze(0);
    I = I.Unsqueeze(0);
  }
  // Index of window position (0, 0) in the unpadded plane: oh*sh*W + ow*sw - ph*W - pw.
  Operand rows = p.Temp(TERN_DTYPE_I64, {g.oh, 1}), cols = p.Temp(TERN_DTYPE_I64, {1, g.ow});
  p.Emit(TERN_OP_IOTA, {rows}, {0}, {0.0, static_cast<double>(g.sh * g.w)});
  p.Emit(TERN_OP_IOTA, {cols}, {1}, {0.0, static_cast<double>(g.sw)});
  Operand base = p.Temp(TERN_DTYPE_I64, {g.oh, g.ow});
  p.Emit(TERN_OP_BINARY, {base, rows.Expand({g.oh, g.ow}), cols.Expand({g.oh, g.ow})},
         {TERN_BINARY_ADD});
  Operand cur = p.Temp(TERN_DTYPE_I64, {g.oh, g.ow});
  Operand bigger = p.Temp(TERN_DTYPE_BOOL, o4), nan = p.Temp(TERN_DTYPE_BOOL, o4);
  Operand take = p.Temp(TERN_DTYPE_BOOL, o4);
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j) {
      const Operand v = src.Slice(2, i * g.dh, g.oh, g.sh).Slice(3, j * g.dw, g.ow, g.sw);
      const int64_t shift = (i * g.dh - g.ph) * g.w + (j * g.dw - g.pw);
      p.Emit(TERN_OP_BINARY, {cur, base, p.ConstInt(shift, TERN_DTYPE_I64).Expand({g.oh, g.ow})},
             {TERN_BINARY_ADD});
      const Operand cur4 = cur.Expand(o4);
      if (i == 0 && j == 0) {
        p.Emit(TERN_OP_COPY, {O, v});
        p.Emit(TERN_OP_COPY, {I, cur4});
        continue;
      }
      // take = v > best || isnan(v)
      p.Emit(TERN_OP_BINARY, {bigger, v, O}, {TERN_BINARY_GT});
      p.Emit(TERN_OP_BINARY, {nan, v, v}, {TERN_BINARY_NE});
      p.Emit(TERN_OP_BINARY, {take, bigger, nan}, {TERN_BINARY_LOGICAL_OR});
      p.Emit(TERN_OP_WHERE, {O, take, v, O});
      p.Emit(TERN_OP_WHERE, {I, take, cur4, I});
    }
  }
  return p.ok() && p.Run();
}

std::tuple<at::Tensor&, at::Tensor&> MaxPool2dWithIndicesOut(
    const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, at::Tensor& out,
    at::Tensor& indices) {
  const PoolGeometry g = Geometry(self, kernel_size, stride, padding, dilation, ceil_mode);
  if (g.ok && MaxPool(self, g, out, indices)) return {out, indices};
  return TERN_FALLBACK(max_pool2d_with_indices_out, self, kernel_size, stride, padding, dilation,
                       ceil_mode, out, indices);
}
TERN_ATEN_IMPL("max_pool2d_with_indices.out", MaxPool2dWithIndicesOut);

at::Tensor& MaxPool2dWithIndicesBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                            bool ceil_mode, const at::Tensor& indices,
                                            at::Tensor& grad_input) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  const PoolGeometry g = Geometry(self, kernel_size, stride, padding, dilation, ceil_mode);
  if (g.ok && IsTern(grad_output) && IsTern(indices) && at::isFloatingType(dtype) &&
      Supported(dtype) && grad_output.scalar_type() == dtype && grad_input.scalar_type() == dtype &&
      indices.scalar_type() == at::kLong && grad_output.sizes() == at::IntArrayRef(OutShape(g)) &&
      indices.sizes() == grad_output.sizes()) {
    ResizeOut(grad_input, self.sizes());
    if (OutputOk(grad_input, {grad_output, indices}) && grad_input.is_contiguous() &&
        grad_output.is_contiguous() && indices.is_contiguous()) {
      const int64_t planes = g.n * g.c;
      Program p("aten::max_pool2d_with_indices_backward.grad_input");
      Operand GI = p.Out(grad_input).View({planes, g.h * g.w});
      p.Emit(TERN_OP_FILL, {GI}, {}, {0.0});
      p.Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS,
             {GI, p.In(indices).View({planes, g.oh * g.ow}),
              p.In(grad_output).View({planes, g.oh * g.ow})},
             {1});
      done = p.ok() && p.Run();
    }
  }
  if (done) return grad_input;
  return TERN_FALLBACK(max_pool2d_with_indices_backward_grad_input, grad_output, self, kernel_size,
                       stride, padding, dilation, ceil_mode, indices, grad_input);
}
TERN_ATEN_IMPL("max_pool2d_with_indices_backward.grad_input", MaxPool2dWithIndicesBackwardOut);

}  // namespace

}  // namespace torch_tern::native
