// Native 2-D and 3-D max pooling with indices, and their backward.
//
// The ISA has no pooling instruction; a max pool is a chain over the kernel
// window: every window position is a strided view of the (padded) input, and
// each one updates the running maximum and its index where it is larger (or
// NaN), in row-major window order, exactly as the CPU kernel scans. As there,
// the maximum starts at -inf and the index at the window's first position
// inside the input, so padding (and, with ceil_mode, the part of the last
// windows past the input's end), filled with -inf, is never taken. The
// backward adds each output gradient at its index (SCATTER_ADD_ALONG_AXIS
// over the flattened planes).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

constexpr int kMaxDims = 3;
constexpr int64_t kMaxWindow = 64;  // window positions: one instruction group each

struct PoolGeometry {
  bool ok = false;
  int nd = 0;  // spatial dims: 2 or 3
  bool batched = false;
  int64_t n = 0, c = 0;
  int64_t k[kMaxDims], s[kMaxDims], pad[kMaxDims], dil[kMaxDims];
  int64_t in[kMaxDims], out[kMaxDims];
  int64_t padded[kMaxDims];     // extent of the -inf padded copy of the input
  int64_t in_stride[kMaxDims];  // element stride of a spatial dim in one input plane

  int64_t InPlane() const { return in[0] * in_stride[0]; }
  int64_t OutPlane() const {
    int64_t v = 1;
    for (int i = 0; i < nd; ++i) v *= out[i];
    return v;
  }
  bool NeedsPadding() const {
    for (int i = 0; i < nd; ++i) {
      if (padded[i] != in[i]) return true;
    }
    return false;
  }
};

int64_t Param(at::IntArrayRef v, size_t i, int64_t dflt) {
  if (v.empty()) return dflt;
  return v.size() == 1 ? v[0] : v[i];
}

// PyTorch's pooling_output_shape: with ceil_mode the last window must start
// inside the input or its left padding.
int64_t OutputSize(int64_t in, int64_t k, int64_t pad, int64_t s, int64_t d, bool ceil_mode) {
  const int64_t span = in + 2 * pad - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  if (span < 0) return -1;
  int64_t out = span / s + 1;
  if (ceil_mode && (out - 1) * s >= in + pad) --out;
  return out;
}

PoolGeometry Geometry(int nd, const at::Tensor& self, at::IntArrayRef kernel,
                      at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                      bool ceil_mode) {
  PoolGeometry g;
  const auto fits = [nd](at::IntArrayRef v) { return v.size() == 1 || v.size() == size_t(nd); };
  if ((self.dim() != nd + 1 && self.dim() != nd + 2) || !fits(kernel) ||
      (!stride.empty() && !fits(stride)) || !fits(padding) || !fits(dilation)) {
    return g;
  }
  g.nd = nd;
  g.batched = self.dim() == nd + 2;
  g.n = g.batched ? self.size(0) : 1;
  g.c = self.size(-nd - 1);
  int64_t window = 1;
  for (int i = 0; i < nd; ++i) {
    g.k[i] = Param(kernel, i, 1);
    g.s[i] = Param(stride, i, g.k[i]);
    g.pad[i] = Param(padding, i, 0);
    g.dil[i] = Param(dilation, i, 1);
    g.in[i] = self.size(i - nd);
    if (g.k[i] < 1 || g.s[i] < 1 || g.pad[i] < 0 || g.dil[i] < 1 || g.pad[i] > g.k[i] / 2) {
      return g;
    }
    window *= g.k[i];
    g.out[i] = OutputSize(g.in[i], g.k[i], g.pad[i], g.s[i], g.dil[i], ceil_mode);
    if (g.out[i] < 1) return g;
    g.padded[i] =
        std::max(g.in[i] + 2 * g.pad[i], (g.out[i] - 1) * g.s[i] + g.dil[i] * (g.k[i] - 1) + 1);
  }
  int64_t stride_in = 1;
  for (int i = nd - 1; i >= 0; --i) {
    g.in_stride[i] = stride_in;
    stride_in *= g.in[i];
  }
  g.ok = window <= kMaxWindow && g.n * g.c > 0 && stride_in > 0;
  return g;
}

std::vector<int64_t> OutShape(const PoolGeometry& g) {
  std::vector<int64_t> shape;
  if (g.batched) shape.push_back(g.n);
  shape.push_back(g.c);
  shape.insert(shape.end(), g.out, g.out + g.nd);
  return shape;
}

// The operand of a [N, C, spatial...] view of `t` (a batch dim added when
// the tensor has none).
Operand Batched(const PoolGeometry& g, Operand t) { return g.batched ? t : t.Unsqueeze(0); }

bool MaxPool(const char* name, const at::Tensor& self, const PoolGeometry& g, const at::Tensor& out,
             const at::Tensor& indices) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !at::isFloatingType(dtype) || !Supported(dtype) ||
      out.scalar_type() != dtype || indices.scalar_type() != at::kLong) {
    return false;
  }
  ResizeOut(out, OutShape(g));
  ResizeOut(indices, OutShape(g));
  if (!OutputOk(out, {self}) || !OutputOk(indices, {self})) return false;
  const int nd = g.nd;
  const tern_dtype_t d = *TD(dtype);
  const std::vector<int64_t> spatial(g.out, g.out + nd);
  std::vector<int64_t> full = {g.n, g.c};
  full.insert(full.end(), spatial.begin(), spatial.end());
  Program p(name);
  const Operand X = Batched(g, p.In(self));
  Operand src = X;
  if (g.NeedsPadding()) {
    std::vector<int64_t> shape = {g.n, g.c};
    shape.insert(shape.end(), g.padded, g.padded + nd);
    src = p.Temp(d, shape);
    p.Emit(TERN_OP_FILL, {src}, {}, {-INFINITY});
    Operand inner = src;
    for (int i = 0; i < nd; ++i) inner = inner.Slice(2 + i, g.pad[i], g.in[i]);
    p.Emit(TERN_OP_COPY, {inner, X});
  }
  const Operand O = Batched(g, p.Out(out)), I = Batched(g, p.Out(indices));
  // Per output position, in the unpadded plane: `base`, the index of window
  // position 0 (sum over dims of (o*s - pad) * in_stride), and `first`, the
  // index of the window's first position inside the input (a negative start
  // moves up by whole dilation steps: start mod dil).
  const Operand base = p.Temp(TERN_DTYPE_I64, spatial), first = p.Temp(TERN_DTYPE_I64, spatial);
  for (int i = 0; i < nd; ++i) {
    std::vector<int64_t> shape(nd, 1);
    shape[i] = g.out[i];
    const Operand start = p.Temp(TERN_DTYPE_I64, shape), neg = p.Temp(TERN_DTYPE_BOOL, shape);
    const Operand wrapped = p.Temp(TERN_DTYPE_I64, shape), valid = p.Temp(TERN_DTYPE_I64, shape);
    p.Emit(TERN_OP_IOTA, {start}, {i},
           {static_cast<double>(-g.pad[i]), static_cast<double>(g.s[i])});
    p.Emit(TERN_OP_BINARY, {neg, start, p.ConstInt(0, TERN_DTYPE_I64).Expand(shape)},
           {TERN_BINARY_LT});
    p.Emit(TERN_OP_BINARY, {wrapped, start, p.ConstInt(g.dil[i], TERN_DTYPE_I64).Expand(shape)},
           {TERN_BINARY_REMAINDER});
    p.Emit(TERN_OP_WHERE, {valid, neg, wrapped, start});
    const Operand scale = p.ConstInt(g.in_stride[i], TERN_DTYPE_I64).Expand(shape);
    for (const auto& [acc, term] : {std::pair{base, start}, std::pair{first, valid}}) {
      if (i == 0) {
        p.Emit(TERN_OP_BINARY, {acc, term.Expand(spatial), scale.Expand(spatial)},
               {TERN_BINARY_MUL});
      } else {
        p.Emit(TERN_OP_BINARY, {term, term, scale}, {TERN_BINARY_MUL});
        p.Emit(TERN_OP_BINARY, {acc, acc, term.Expand(spatial)}, {TERN_BINARY_ADD});
      }
    }
  }
  p.Emit(TERN_OP_FILL, {O}, {}, {-INFINITY});
  p.Emit(TERN_OP_COPY, {I, first.Expand(full)});
  const Operand cur = p.Temp(TERN_DTYPE_I64, spatial);
  const Operand bigger = p.Temp(TERN_DTYPE_BOOL, full), nan = p.Temp(TERN_DTYPE_BOOL, full);
  const Operand take = p.Temp(TERN_DTYPE_BOOL, full);
  int64_t window = 1;
  for (int i = 0; i < nd; ++i) window *= g.k[i];
  for (int64_t w = 0; w < window; ++w) {
    // Window position w in row-major order: offset j[i] along each dim.
    Operand v = src;
    int64_t shift = 0, rest = w;
    for (int i = nd - 1; i >= 0; --i) {
      const int64_t j = rest % g.k[i];
      rest /= g.k[i];
      v = v.Slice(2 + i, j * g.dil[i], g.out[i], g.s[i]);
      shift += j * g.dil[i] * g.in_stride[i];
    }
    p.Emit(TERN_OP_BINARY, {cur, base, p.ConstInt(shift, TERN_DTYPE_I64).Expand(spatial)},
           {TERN_BINARY_ADD});
    // take = v > best || isnan(v)
    p.Emit(TERN_OP_BINARY, {bigger, v, O}, {TERN_BINARY_GT});
    p.Emit(TERN_OP_BINARY, {nan, v, v}, {TERN_BINARY_NE});
    p.Emit(TERN_OP_BINARY, {take, bigger, nan}, {TERN_BINARY_LOGICAL_OR});
    p.Emit(TERN_OP_WHERE, {O, take, v, O});
    p.Emit(TERN_OP_WHERE, {I, take, cur.Expand(full), I});
  }
  return p.ok() && p.Run();
}

// grad_input = 0, then each output gradient added at its index within its
// plane. Non-contiguous tensors (channels-last) go through contiguous
// temporaries.
bool MaxPoolBackward(const char* name, const at::Tensor& grad_output, const at::Tensor& self,
                     const PoolGeometry& g, const at::Tensor& indices,
                     const at::Tensor& grad_input) {
  const at::ScalarType dtype = self.scalar_type();
  if (!g.ok || !IsTern(grad_output) || !IsTern(indices) || !at::isFloatingType(dtype) ||
      !Supported(dtype) || grad_output.scalar_type() != dtype ||
      grad_input.scalar_type() != dtype || indices.scalar_type() != at::kLong ||
      grad_output.sizes() != at::IntArrayRef(OutShape(g)) ||
      indices.sizes() != grad_output.sizes()) {
    return false;
  }
  ResizeOut(grad_input, self.sizes());
  if (!OutputOk(grad_input, {grad_output, indices})) return false;
  const tern_dtype_t d = *TD(dtype);
  const int64_t planes = g.n * g.c, in_plane = g.InPlane(), out_plane = g.OutPlane();
  Program p(name);
  const auto contiguous = [&](const at::Tensor& t, tern_dtype_t dt) {
    Operand o = p.In(t);
    if (o.IsContiguous()) return o.View({planes, out_plane});
    const Operand tmp = p.Temp(dt, t.sizes());
    p.Emit(TERN_OP_COPY, {tmp, o});
    return tmp.View({planes, out_plane});
  };
  const Operand go = contiguous(grad_output, d), idx = contiguous(indices, TERN_DTYPE_I64);
  const Operand GI = p.Out(grad_input);
  const Operand acc = GI.IsContiguous() ? GI : p.Temp(d, grad_input.sizes());
  const Operand flat = acc.View({planes, in_plane});
  p.Emit(TERN_OP_FILL, {flat}, {}, {0.0});
  p.Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS, {flat, idx, go}, {1});
  if (!GI.IsContiguous()) p.Emit(TERN_OP_COPY, {GI, acc});
  return p.ok() && p.Run();
}

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor&, at::Tensor&> MaxPool2dWithIndicesOut(
    const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, at::Tensor& out,
    at::Tensor& indices) {
  const PoolGeometry g = Geometry(2, self, kernel_size, stride, padding, dilation, ceil_mode);
  if (g.ok && MaxPool("aten::max_pool2d_with_indices.out", self, g, out, indices)) {
    return {out, indices};
  }
  return TERN_FALLBACK(max_pool2d_with_indices_out, self, kernel_size, stride, padding, dilation,
                       ceil_mode, out, indices);
}
TERN_ATEN_IMPL("max_pool2d_with_indices.out", MaxPool2dWithIndicesOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& MaxPool2dWithIndicesBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                            bool ceil_mode, const at::Tensor& indices,
                                            at::Tensor& grad_input) {
  const PoolGeometry g = Geometry(2, self, kernel_size, stride, padding, dilation, ceil_mode);
  if (MaxPoolBackward("aten::max_pool2d_with_indices_backward.grad_input", grad_output, self, g,
                      indices, grad_input)) {
    return grad_input;
  }
  return TERN_FALLBACK(max_pool2d_with_indices_backward_grad_input, grad_output, self, kernel_size,
                       stride, padding, dilation, ceil_mode, indices, grad_input);
}
TERN_ATEN_IMPL("max_pool2d_with_indices_backward.grad_input", MaxPool2dWithIndicesBackwardOut);

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor&, at::Tensor&> MaxPool3dWithIndicesOut(
    const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode, at::Tensor& out,
    at::Tensor& indices) {
  const PoolGeometry g = Geometry(3, self, kernel_size, stride, padding, dilation, ceil_mode);
  if (g.ok && MaxPool("aten::max_pool3d_with_indices.out", self, g, out, indices)) {
    return {out, indices};
  }
  return TERN_FALLBACK2(max_pool3d_with_indices, out, self, kernel_size, stride, padding, dilation,
                        ceil_mode, out, indices);
}
TERN_ATEN_IMPL("max_pool3d_with_indices.out", MaxPool3dWithIndicesOut);

// The functional form allocates as the CPU does (in the input's memory format).
// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor, at::Tensor> MaxPool3dWithIndices(const at::Tensor& self,
                                                        at::IntArrayRef kernel_size,
                                                        at::IntArrayRef stride,
                                                        at::IntArrayRef padding,
                                                        at::IntArrayRef dilation, bool ceil_mode) {
  const PoolGeometry g = Geometry(3, self, kernel_size, stride, padding, dilation, ceil_mode);
  if (g.ok && IsTern(self)) {
    const auto format =
        self.dim() == 5 ? self.suggest_memory_format() : at::MemoryFormat::Contiguous;
    at::Tensor out = at::empty(OutShape(g), self.options().memory_format(format));
    at::Tensor indices =
        at::empty(OutShape(g), self.options().dtype(at::kLong).memory_format(format));
    if (MaxPool("aten::max_pool3d_with_indices.out", self, g, out, indices)) {
      return {out, indices};
    }
  }
  return TERN_FALLBACK(max_pool3d_with_indices, self, kernel_size, stride, padding, dilation,
                       ceil_mode);
}
TERN_ATEN_IMPL("max_pool3d_with_indices", MaxPool3dWithIndices);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& MaxPool3dWithIndicesBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                            bool ceil_mode, const at::Tensor& indices,
                                            at::Tensor& grad_input) {
  const PoolGeometry g = Geometry(3, self, kernel_size, stride, padding, dilation, ceil_mode);
  if (MaxPoolBackward("aten::max_pool3d_with_indices_backward.grad_input", grad_output, self, g,
                      indices, grad_input)) {
    return grad_input;
  }
  return TERN_FALLBACK2(max_pool3d_with_indices_backward, grad_input, grad_output, self,
                        kernel_size, stride, padding, dilation, ceil_mode, indices, grad_input);
}
TERN_ATEN_IMPL("max_pool3d_with_indices_backward.grad_input", MaxPool3dWithIndicesBackwardOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor MaxPool3dWithIndicesBackward(const at::Tensor& grad_output, const at::Tensor& self,
                                        at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                        at::IntArrayRef padding, at::IntArrayRef dilation,
                                        bool ceil_mode, const at::Tensor& indices) {
  const PoolGeometry g = Geometry(3, self, kernel_size, stride, padding, dilation, ceil_mode);
  if (IsTern(self)) {
    at::Tensor grad_input = at::empty_like(self, at::MemoryFormat::Preserve);
    if (MaxPoolBackward("aten::max_pool3d_with_indices_backward.grad_input", grad_output, self, g,
                        indices, grad_input)) {
      return grad_input;
    }
  }
  return TERN_FALLBACK(max_pool3d_with_indices_backward, grad_output, self, kernel_size, stride,
                       padding, dilation, ceil_mode, indices);
}
TERN_ATEN_IMPL("max_pool3d_with_indices_backward", MaxPool3dWithIndicesBackward);

// ---- max_unpool --------------------------------------------------------------------------

// max_unpool{2,3}d: out = 0, then out[plane][indices[i]] = self[i] within each
// plane (SCATTER_ALONG_AXIS: a repeated index keeps the last value, as the
// CPU's scan does). An index outside the output plane is an execution error.
bool MaxUnpool(int nd, const at::Tensor& self, const at::Tensor& indices,
               at::IntArrayRef output_size, const at::Tensor& out) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !IsTern(indices) || !Supported(dtype) || out.scalar_type() != dtype ||
      indices.scalar_type() != at::kLong || indices.sizes() != self.sizes() ||
      (self.dim() != nd + 1 && self.dim() != nd + 2) ||
      output_size.size() != static_cast<size_t>(nd)) {
    return false;
  }
  const bool batched = self.dim() == nd + 2;
  const int64_t n = batched ? self.size(0) : 1, c = self.size(-nd - 1);
  int64_t in_plane = 1, out_plane = 1;
  for (int i = 0; i < nd; ++i) {
    in_plane *= self.size(i - nd);
    if (output_size[i] < 0) return false;
    out_plane *= output_size[i];
  }
  std::vector<int64_t> shape;
  if (batched) shape.push_back(n);
  shape.push_back(c);
  shape.insert(shape.end(), output_size.begin(), output_size.end());
  ResizeOut(out, shape);
  if (n * c * out_plane == 0) return true;
  if (!OutputOk(out, {self, indices})) return false;
  const tern_dtype_t d = *TD(dtype);
  const int64_t planes = n * c;
  Program p(nd == 2 ? "aten::max_unpool2d.out" : "aten::max_unpool3d.out");
  // [planes, elements of a plane] views, through contiguous temporaries where
  // the tensor is not contiguous (channels-last).
  const auto flat = [&](const Operand& o, int64_t plane) {
    if (o.IsContiguous()) return o.View({planes, plane});
    const Operand tmp = p.Temp(o.dtype, o.shape);
    p.Emit(TERN_OP_COPY, {tmp, o});
    return tmp.View({planes, plane});
  };
  const Operand src = flat(p.In(self), in_plane), idx = flat(p.In(indices), in_plane);
  const Operand O = p.Out(out);
  const Operand acc = O.IsContiguous() ? O : p.Temp(d, shape);
  const Operand acc_flat = acc.View({planes, out_plane});
  if (at::isFloatingType(dtype)) {
    p.Emit(TERN_OP_FILL, {acc_flat}, {}, {0.0});
  } else {
    p.Emit(TERN_OP_FILL, {acc_flat}, {0});
  }
  if (in_plane > 0) p.Emit(TERN_OP_SCATTER_ALONG_AXIS, {acc_flat, idx, src}, {1});
  if (!O.IsContiguous()) p.Emit(TERN_OP_COPY, {O, acc});
  return p.ok() && p.Run();
}

// The output as the CPU allocates it: the input's memory format when batched.
at::Tensor UnpoolOutput(const at::Tensor& self, int nd, at::IntArrayRef output_size) {
  if (self.dim() < nd + 1 || output_size.size() != static_cast<size_t>(nd)) {
    return at::empty({0}, self.options());
  }
  std::vector<int64_t> shape = self.sizes().slice(0, self.dim() - nd).vec();
  shape.insert(shape.end(), output_size.begin(), output_size.end());
  const auto format =
      self.dim() == nd + 2 ? self.suggest_memory_format() : at::MemoryFormat::Contiguous;
  return at::empty(shape, self.options().memory_format(format));
}

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& MaxUnpool2dOut(const at::Tensor& self, const at::Tensor& indices,
                           at::IntArrayRef output_size, at::Tensor& out) {
  if (MaxUnpool(2, self, indices, output_size, out)) return out;
  return TERN_FALLBACK2(max_unpool2d, out, self, indices, output_size, out);
}
TERN_ATEN_IMPL("max_unpool2d.out", MaxUnpool2dOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor MaxUnpool2d(const at::Tensor& self, const at::Tensor& indices,
                       at::IntArrayRef output_size) {
  at::Tensor out = UnpoolOutput(self, 2, output_size);
  if (MaxUnpool(2, self, indices, output_size, out)) return out;
  return TERN_FALLBACK(max_unpool2d, self, indices, output_size);
}
TERN_ATEN_IMPL("max_unpool2d", MaxUnpool2d);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& MaxUnpool3dOut(const at::Tensor& self, const at::Tensor& indices,
                           at::IntArrayRef output_size, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::Tensor& out) {
  if (MaxUnpool(3, self, indices, output_size, out)) return out;
  return TERN_FALLBACK2(max_unpool3d, out, self, indices, output_size, stride, padding, out);
}
TERN_ATEN_IMPL("max_unpool3d.out", MaxUnpool3dOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor MaxUnpool3d(const at::Tensor& self, const at::Tensor& indices,
                       at::IntArrayRef output_size, at::IntArrayRef stride,
                       at::IntArrayRef padding) {
  at::Tensor out = UnpoolOutput(self, 3, output_size);
  if (MaxUnpool(3, self, indices, output_size, out)) return out;
  return TERN_FALLBACK(max_unpool3d, self, indices, output_size, stride, padding);
}
TERN_ATEN_IMPL("max_unpool3d", MaxUnpool3d);

}  // namespace

}  // namespace torch_tern::native
