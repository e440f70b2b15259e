// Native reductions (sum, mean, prod, max/min with and without indices,
// argmax/argmin, any/all, var/std), softmax and log-softmax with their
// backward functions, and layer/RMS normalisation forward and backward.
#include <ATen/ATen.h>
#include <ATen/ops/rms_norm_compositeimplicitautograd_dispatch.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// out = fn over `dims` of self, converted to `in_dtype` first; the
// instruction writes `result_dtype` (cast into out when that differs).
bool Reduce(const char* name, tern_reduce_fn_t fn, const at::Tensor& self,
            const std::vector<int64_t>& dims, bool keepdim, const at::Tensor& out,
            at::ScalarType in_dtype, at::ScalarType result_dtype) {
  if (!IsTern(self) || !IsTern(out)) return false;
  ResizeOut(out, ReducedShape(self.sizes(), dims, keepdim));
  if (!OutputOk(out, {self})) return false;
  Program p(name);
  Operand X = Input(p, self, in_dtype, self.sizes());
  if (!p.ok()) return false;
  const Operand O = KeepdimView(p, p.Out(out), dims, keepdim);
  const std::vector<int64_t> kept = ReducedShape(self.sizes(), dims, true);
  const Target t = BeginOut(p, out, result_dtype, kept, O);
  std::vector<int64_t> ints = {fn};
  if (self.dim() > 0) ints.insert(ints.end(), dims.begin(), dims.end());
  p.Emit(TERN_OP_REDUCE, {t.write, X}, std::move(ints));
  Finish(p, t);
  return p.Run();
}

bool EmptyReduction(const at::Tensor& self, const std::vector<int64_t>& dims) {
  if (self.dim() == 0) return false;
  for (int64_t d : dims) {
    if (self.size(d) == 0) return true;
  }
  return false;
}

at::Tensor& SumOut(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype, at::Tensor& out) {
  const std::vector<int64_t> dims = ReduceDims(self, dim);
  const at::ScalarType out_type = out.scalar_type();
  // Integers and bool sum as int64; bf16/f16 accumulate in f32.
  const at::ScalarType in_type = at::isIntegralType(out_type, true) ? at::kLong : out_type;
  if (in_type != at::kBool &&
      Reduce("aten::sum.IntList_out", TERN_REDUCE_SUM, self, dims, keepdim, out, in_type,
             IsReducedFloat(in_type) ? at::kFloat : in_type)) {
    return out;
  }
  return TERN_FALLBACK(sum_IntList_out, self, dim, keepdim, dtype, out);
}
TERN_ATEN_IMPL("sum.IntList_out", SumOut);

at::Tensor& MeanOut(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<at::ScalarType> dtype, at::Tensor& out) {
  const std::vector<int64_t> dims = ReduceDims(self, dim);
  const at::ScalarType out_type = out.scalar_type();
  if (at::isFloatingType(out_type) && Reduce("aten::mean.out", TERN_REDUCE_MEAN, self, dims,
                                             keepdim, out, out_type, OpMath(out_type))) {
    return out;
  }
  return TERN_FALLBACK(mean_out, self, dim, keepdim, dtype, out);
}
TERN_ATEN_IMPL("mean.out", MeanOut);

at::Tensor& ProdIntOut(const at::Tensor& self, int64_t dim, bool keepdim,
                       std::optional<at::ScalarType> dtype, at::Tensor& out) {
  const std::vector<int64_t> dims = ReduceDims(self, std::vector<int64_t>{dim});
  const at::ScalarType out_type = out.scalar_type();
  const at::ScalarType in_type = at::isIntegralType(out_type, true) ? at::kLong : out_type;
  if (self.dim() > 0 && Reduce("aten::prod.int_out", TERN_REDUCE_PROD, self, dims, keepdim, out,
                               in_type, IsReducedFloat(in_type) ? at::kFloat : in_type)) {
    return out;
  }
  return TERN_FALLBACK(prod_int_out, self, dim, keepdim, dtype, out);
}
TERN_ATEN_IMPL("prod.int_out", ProdIntOut);

at::Tensor Prod(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  if (IsTern(self)) {
    const at::ScalarType out_type = dtype.value_or(
        at::isIntegralType(self.scalar_type(), true) ? at::kLong : self.scalar_type());
    at::Tensor out = at::empty({}, self.options().dtype(out_type));
    const at::ScalarType in_type = at::isIntegralType(out_type, true) ? at::kLong : out_type;
    if (Reduce("aten::prod", TERN_REDUCE_PROD, self, ReduceDims(self, std::nullopt), false, out,
               in_type, IsReducedFloat(in_type) ? at::kFloat : in_type)) {
      return out;
    }
  }
  return TERN_FALLBACK(prod, self, dtype);
}
TERN_ATEN_IMPL("prod", Prod);

// max/min over `dim` (none: all) without indices, into `out` of self's dtype
// (rejected on empty reductions: the CPU raises for those).
bool Extreme(const char* name, tern_reduce_fn_t fn, const at::Tensor& self,
             at::OptionalIntArrayRef dim, bool keepdim, const at::Tensor& out) {
  if (out.scalar_type() != self.scalar_type()) return false;
  const std::vector<int64_t> dims = ReduceDims(self, dim);
  if (!IsTern(self) || EmptyReduction(self, dims) || self.numel() == 0) return false;
  return Reduce(name, fn, self, dims, keepdim, out, self.scalar_type(), self.scalar_type());
}

at::Tensor& AmaxOut(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  if (Extreme("aten::amax.out", TERN_REDUCE_MAX, self, dim, keepdim, out)) return out;
  return TERN_FALLBACK(amax_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("amax.out", AmaxOut);

at::Tensor& AminOut(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  if (Extreme("aten::amin.out", TERN_REDUCE_MIN, self, dim, keepdim, out)) return out;
  return TERN_FALLBACK(amin_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("amin.out", AminOut);

// max()/min() of all elements as a new 0-dim tensor; undefined when declined.
at::Tensor ExtremeAll(const char* name, tern_reduce_fn_t fn, const at::Tensor& self) {
  if (!IsTern(self)) return at::Tensor();
  at::Tensor out = at::empty({}, self.options());
  return Extreme(name, fn, self, std::nullopt, false, out) ? out : at::Tensor();
}

at::Tensor MaxAll(const at::Tensor& self) {
  at::Tensor out = ExtremeAll("aten::max", TERN_REDUCE_MAX, self);
  return out.defined() ? out : TERN_FALLBACK(max, self);
}
TERN_ATEN_IMPL("max", MaxAll);

at::Tensor MinAll(const at::Tensor& self) {
  at::Tensor out = ExtremeAll("aten::min", TERN_REDUCE_MIN, self);
  return out.defined() ? out : TERN_FALLBACK(min, self);
}
TERN_ATEN_IMPL("min", MinAll);

bool ArgExtreme(const char* name, tern_reduce_fn_t fn, const at::Tensor& self,
                std::optional<int64_t> dim, bool keepdim, const at::Tensor& out) {
  if (!IsTern(self) || out.scalar_type() != at::kLong || self.numel() == 0) return false;
  if (!dim.has_value()) {
    // Over all elements: the row-major index, shaped [] (or all ones with keepdim).
    const std::vector<int64_t> dims = ReduceDims(self, std::nullopt);
    return Reduce(name, fn, self, dims, keepdim, out, self.scalar_type(), at::kLong);
  }
  const std::vector<int64_t> dims = ReduceDims(self, std::vector<int64_t>{*dim});
  return Reduce(name, fn, self, dims, keepdim, out, self.scalar_type(), at::kLong);
}

at::Tensor& ArgmaxOut(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim,
                      at::Tensor& out) {
  if (ArgExtreme("aten::argmax.out", TERN_REDUCE_ARGMAX, self, dim, keepdim, out)) return out;
  return TERN_FALLBACK(argmax_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("argmax.out", ArgmaxOut);

at::Tensor& ArgminOut(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim,
                      at::Tensor& out) {
  if (ArgExtreme("aten::argmin.out", TERN_REDUCE_ARGMIN, self, dim, keepdim, out)) return out;
  return TERN_FALLBACK(argmin_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("argmin.out", ArgminOut);

// values and indices along one dim: one program, two reductions.
bool ExtremeDim(const char* name, tern_reduce_fn_t fn, tern_reduce_fn_t arg_fn,
                const at::Tensor& self, int64_t dim, bool keepdim, const at::Tensor& values,
                const at::Tensor& indices) {
  if (!IsTern(self) || !IsTern(values) || !IsTern(indices) || self.numel() == 0 ||
      values.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong) {
    return false;
  }
  const std::vector<int64_t> dims = ReduceDims(self, std::vector<int64_t>{dim});
  const std::vector<int64_t> shape = ReducedShape(self.sizes(), dims, keepdim);
  ResizeOut(values, shape);
  ResizeOut(indices, shape);
  if (!OutputOk(values, {self}) || !OutputOk(indices, {self})) return false;
  Program p(name);
  Operand X = p.In(self);
  std::vector<int64_t> ints = {fn}, arg_ints = {arg_fn};
  if (self.dim() > 0) {
    ints.insert(ints.end(), dims.begin(), dims.end());
    arg_ints.insert(arg_ints.end(), dims.begin(), dims.end());
  }
  p.Emit(TERN_OP_REDUCE, {KeepdimView(p, p.Out(values), dims, keepdim), X}, ints);
  p.Emit(TERN_OP_REDUCE, {KeepdimView(p, p.Out(indices), dims, keepdim), X}, arg_ints);
  return p.Run();
}

std::tuple<at::Tensor&, at::Tensor&> MaxDimOut(const at::Tensor& self, int64_t dim, bool keepdim,
                                               at::Tensor& values, at::Tensor& indices) {
  if (ExtremeDim("aten::max.dim_max", TERN_REDUCE_MAX, TERN_REDUCE_ARGMAX, self, dim, keepdim,
                 values, indices)) {
    return {values, indices};
  }
  return TERN_FALLBACK2(max, dim_max, self, dim, keepdim, values, indices);
}
TERN_ATEN_IMPL("max.dim_max", MaxDimOut);

std::tuple<at::Tensor&, at::Tensor&> MinDimOut(const at::Tensor& self, int64_t dim, bool keepdim,
                                               at::Tensor& values, at::Tensor& indices) {
  if (ExtremeDim("aten::min.dim_min", TERN_REDUCE_MIN, TERN_REDUCE_ARGMIN, self, dim, keepdim,
                 values, indices)) {
    return {values, indices};
  }
  return TERN_FALLBACK2(min, dim_min, self, dim, keepdim, values, indices);
}
TERN_ATEN_IMPL("min.dim_min", MinDimOut);

bool AnyAll(const char* name, tern_reduce_fn_t fn, const at::Tensor& self,
            at::OptionalIntArrayRef dim, bool keepdim, const at::Tensor& out) {
  if (out.scalar_type() != at::kBool && out.scalar_type() != at::kByte) return false;
  if (out.scalar_type() != at::kBool) return false;
  return Reduce(name, fn, self, ReduceDims(self, dim), keepdim, out, self.scalar_type(), at::kBool);
}

at::Tensor& AnyDimsOut(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                       at::Tensor& out) {
  if (AnyAll("aten::any.dims_out", TERN_REDUCE_ANY, self, dim, keepdim, out)) return out;
  return TERN_FALLBACK2(any, dims_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("any.dims_out", AnyDimsOut);

at::Tensor& AllDimsOut(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                       at::Tensor& out) {
  if (AnyAll("aten::all.dims_out", TERN_REDUCE_ALL, self, dim, keepdim, out)) return out;
  return TERN_FALLBACK2(all, dims_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("all.dims_out", AllDimsOut);

at::Tensor& AnyOut(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  if (AnyAll("aten::any.out", TERN_REDUCE_ANY, self, std::vector<int64_t>{dim}, keepdim, out)) {
    return out;
  }
  return TERN_FALLBACK(any_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("any.out", AnyOut);

at::Tensor& AllOut(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  if (AnyAll("aten::all.out", TERN_REDUCE_ALL, self, std::vector<int64_t>{dim}, keepdim, out)) {
    return out;
  }
  return TERN_FALLBACK(all_out, self, dim, keepdim, out);
}
TERN_ATEN_IMPL("all.out", AllOut);

at::Tensor& AnyAllOut(const at::Tensor& self, at::Tensor& out) {
  if (AnyAll("aten::any.all_out", TERN_REDUCE_ANY, self, std::nullopt, false, out)) return out;
  return TERN_FALLBACK(any_all_out, self, out);
}
TERN_ATEN_IMPL("any.all_out", AnyAllOut);

at::Tensor& AllAllOut(const at::Tensor& self, at::Tensor& out) {
  if (AnyAll("aten::all.all_out", TERN_REDUCE_ALL, self, std::nullopt, false, out)) return out;
  return TERN_FALLBACK(all_all_out, self, out);
}
TERN_ATEN_IMPL("all.all_out", AllAllOut);

// var/std: mean, squared deviations, their sum / (N - correction); a
// two-pass formula in f64 accumulation (the CPU uses Welford, equal within
// rounding).
bool VarStd(const char* name, bool take_sqrt, const at::Tensor& self, at::OptionalIntArrayRef dim,
            const std::optional<c10::Scalar>& correction, bool keepdim, const at::Tensor& out,
            const at::Tensor* mean_out = nullptr) {
  if (!IsTern(self) || !IsTern(out) || !at::isFloatingType(self.scalar_type()) ||
      out.scalar_type() != self.scalar_type() || self.numel() == 0) {
    return false;
  }
  const std::vector<int64_t> dims = ReduceDims(self, dim);
  const std::vector<int64_t> kept = ReducedShape(self.sizes(), dims, true);
  ResizeOut(out, ReducedShape(self.sizes(), dims, keepdim));
  if (!OutputOk(out, {self})) return false;
  int64_t n = 1;
  for (int64_t d : dims) n *= self.size(d);
  const double c = correction.has_value() ? correction->toDouble() : 1.0;
  const double denom = std::max(0.0, static_cast<double>(n) - c);
  const at::ScalarType cd = OpMath(self.scalar_type());
  const tern_dtype_t d = *TD(cd);
  Program p(name);
  Operand X = Input(p, self, cd, self.sizes());
  std::vector<int64_t> dims_ints(dims.begin(), dims.end());
  auto reduce_ints = [&](tern_reduce_fn_t fn) {
    std::vector<int64_t> ints = {fn};
    if (self.dim() > 0) ints.insert(ints.end(), dims_ints.begin(), dims_ints.end());
    return ints;
  };
  Operand mean = p.Temp(d, kept);
  p.Emit(TERN_OP_REDUCE, {mean, X}, reduce_ints(TERN_REDUCE_MEAN));
  if (mean_out != nullptr) {
    ResizeOut(*mean_out, ReducedShape(self.sizes(), dims, keepdim));
    if (!OutputOk(*mean_out, {self}) || mean_out->scalar_type() != self.scalar_type()) {
      return false;
    }
    p.Emit(mean_out->scalar_type() == cd ? TERN_OP_COPY : TERN_OP_CAST,
           {KeepdimView(p, p.Out(*mean_out), dims, keepdim), mean});
  }
  Operand dev = p.Temp(d, self.sizes());
  p.Emit(TERN_OP_BINARY, {dev, X, mean.Expand(self.sizes())}, {TERN_BINARY_SUB});
  Operand sq = p.Temp(d, self.sizes());
  p.Emit(TERN_OP_BINARY, {sq, dev, dev}, {TERN_BINARY_MUL});
  Operand total = p.Temp(d, kept);
  p.Emit(TERN_OP_REDUCE, {total, sq}, reduce_ints(TERN_REDUCE_SUM));
  const Target t = BeginOut(p, out, cd, kept, KeepdimView(p, p.Out(out), dims, keepdim));
  if (take_sqrt) {
    Operand var = p.Temp(d, kept);
    p.Emit(TERN_OP_BINARY, {var, total, p.Const(denom, d).Expand(kept)}, {TERN_BINARY_DIV});
    p.Emit(TERN_OP_UNARY, {t.write, var}, {TERN_UNARY_SQRT});
  } else {
    p.Emit(TERN_OP_BINARY, {t.write, total, p.Const(denom, d).Expand(kept)}, {TERN_BINARY_DIV});
  }
  Finish(p, t);
  return p.ok() && p.Run();
}

at::Tensor& VarCorrectionOut(const at::Tensor& self, at::OptionalIntArrayRef dim,
                             const std::optional<c10::Scalar>& correction, bool keepdim,
                             at::Tensor& out) {
  if (VarStd("aten::var.correction_out", false, self, dim, correction, keepdim, out)) return out;
  return TERN_FALLBACK(var_correction_out, self, dim, correction, keepdim, out);
}
TERN_ATEN_IMPL("var.correction_out", VarCorrectionOut);

at::Tensor& StdCorrectionOut(const at::Tensor& self, at::OptionalIntArrayRef dim,
                             const std::optional<c10::Scalar>& correction, bool keepdim,
                             at::Tensor& out) {
  if (VarStd("aten::std.correction_out", true, self, dim, correction, keepdim, out)) return out;
  return TERN_FALLBACK(std_correction_out, self, dim, correction, keepdim, out);
}
TERN_ATEN_IMPL("std.correction_out", StdCorrectionOut);

at::Tensor VarCorrection(const at::Tensor& self, at::OptionalIntArrayRef dim,
                         const std::optional<c10::Scalar>& correction, bool keepdim) {
  at::Tensor out = at::empty({0}, self.options());
  if (VarStd("aten::var.correction", false, self, dim, correction, keepdim, out)) return out;
  return TERN_FALLBACK(var_correction, self, dim, correction, keepdim);
}
TERN_ATEN_IMPL("var.correction", VarCorrection);

at::Tensor StdCorrection(const at::Tensor& self, at::OptionalIntArrayRef dim,
                         const std::optional<c10::Scalar>& correction, bool keepdim) {
  at::Tensor out = at::empty({0}, self.options());
  if (VarStd("aten::std.correction", true, self, dim, correction, keepdim, out)) return out;
  return TERN_FALLBACK(std_correction, self, dim, correction, keepdim);
}
TERN_ATEN_IMPL("std.correction", StdCorrection);

std::tuple<at::Tensor, at::Tensor> VarMeanCorrection(const at::Tensor& self,
                                                     at::OptionalIntArrayRef dim,
                                                     const std::optional<c10::Scalar>& correction,
                                                     bool keepdim) {
  if (IsTern(self)) {
    at::Tensor var = at::empty({0}, self.options());
    at::Tensor mean = at::empty({0}, self.options());
    if (VarStd("aten::var_mean.correction", false, self, dim, correction, keepdim, var, &mean)) {
      return {var, mean};
    }
  }
  return TERN_FALLBACK2(var_mean, correction, self, dim, correction, keepdim);
}
TERN_ATEN_IMPL("var_mean.correction", VarMeanCorrection);

// ||x||_ord over dims: 2, 1, +-inf, 0 and other p, as (sum |x|^p)^(1/p).
at::Tensor& LinalgVectorNormOut(const at::Tensor& self, const at::Scalar& ord,
                                at::OptionalIntArrayRef dim, bool keepdim,
                                std::optional<at::ScalarType> dtype, at::Tensor& out) {
  bool done = false;
  const at::ScalarType out_type = out.scalar_type();
  if (IsTern(self) && IsTern(out) && at::isFloatingType(self.scalar_type()) &&
      Supported(self.scalar_type()) && at::isFloatingType(out_type) && Supported(out_type) &&
      !ord.isComplex()) {
    const double p_ord = ord.toDouble();
    const std::vector<int64_t> dims = ReduceDims(self, dim);
    const bool extreme = std::isinf(p_ord);
    if (!(extreme && (self.numel() == 0 || EmptyReduction(self, dims)))) {
      const std::vector<int64_t> kept = ReducedShape(self.sizes(), dims, true);
      ResizeOut(out, ReducedShape(self.sizes(), dims, keepdim));
      if (OutputOk(out, {self})) {
        const at::ScalarType cd = at::kFloat;
        const tern_dtype_t d = TERN_DTYPE_F32;
        Program p("aten::linalg_vector_norm.out");
        Operand X = Input(p, self, cd, self.sizes());
        auto reduce = [&](Operand dst, Operand src, tern_reduce_fn_t fn) {
          std::vector<int64_t> ints = {fn};
          if (self.dim() > 0) ints.insert(ints.end(), dims.begin(), dims.end());
          p.Emit(TERN_OP_REDUCE, {dst, src}, ints);
        };
        const Target t = BeginOut(p, out, cd, kept, KeepdimView(p, p.Out(out), dims, keepdim));
        Operand mag = p.Temp(d, self.sizes());
        if (p_ord == 2.0) {
          Operand sq = p.Temp(d, self.sizes()), total = p.Temp(d, kept);
          p.Emit(TERN_OP_BINARY, {sq, X, X}, {TERN_BINARY_MUL});
          reduce(total, sq, TERN_REDUCE_SUM);
          p.Emit(TERN_OP_UNARY, {t.write, total}, {TERN_UNARY_SQRT});
        } else if (p_ord == 0.0) {
          Operand nz = p.Temp(TERN_DTYPE_BOOL, self.sizes());
          p.Emit(TERN_OP_BINARY, {nz, X, p.Const(0.0, d).Expand(self.sizes())}, {TERN_BINARY_NE});
          p.Emit(TERN_OP_CAST, {mag, nz});
          reduce(t.write, mag, TERN_REDUCE_SUM);
        } else {
          p.Emit(TERN_OP_UNARY, {mag, X}, {TERN_UNARY_ABS});
          if (extreme) {
            reduce(t.write, mag, p_ord > 0 ? TERN_REDUCE_MAX : TERN_REDUCE_MIN);
          } else if (p_ord == 1.0) {
            reduce(t.write, mag, TERN_REDUCE_SUM);
          } else {
            Operand powed = p.Temp(d, self.sizes()), total = p.Temp(d, kept);
            p.Emit(TERN_OP_UNARY, {powed, mag}, {TERN_UNARY_POW_SCALAR}, {p_ord});
            reduce(total, powed, TERN_REDUCE_SUM);
            p.Emit(TERN_OP_UNARY, {t.write, total}, {TERN_UNARY_POW_SCALAR}, {1.0 / p_ord});
          }
        }
        Finish(p, t);
        done = p.ok() && p.Run();
      }
    }
  }
  if (done) return out;
  return TERN_FALLBACK(linalg_vector_norm_out, self, ord, dim, keepdim, dtype, out);
}
TERN_ATEN_IMPL("linalg_vector_norm.out", LinalgVectorNormOut);

// ---- Softmax ----------------------------------------------------------------------------

bool Softmax(const char* name, bool log, const at::Tensor& self, int64_t dim, bool half_to_float,
             const at::Tensor& out) {
  if (!IsTern(self) || !IsTern(out) || !at::isFloatingType(self.scalar_type())) return false;
  ResizeOut(out, self.sizes());
  if (!OutputOk(out, {self})) return false;
  const at::ScalarType dtype = out.scalar_type();
  if (!half_to_float && dtype != self.scalar_type()) return false;
  const int64_t axis = self.dim() == 0 ? 0 : c10::maybe_wrap_dim(dim, self.dim());
  Program p(name);
  Operand X = Input(p, self, dtype, self.sizes());
  if (!p.ok()) return false;
  p.Emit(TERN_OP_SOFTMAX, {p.Out(out), X}, {axis, log ? 1 : 0});
  return p.Run();
}

at::Tensor& SoftmaxOut(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  if (Softmax("aten::_softmax.out", false, self, dim, half_to_float, out)) return out;
  return TERN_FALLBACK(_softmax_out, self, dim, half_to_float, out);
}
TERN_ATEN_IMPL("_softmax.out", SoftmaxOut);

at::Tensor& LogSoftmaxOut(const at::Tensor& self, int64_t dim, bool half_to_float,
                          at::Tensor& out) {
  if (Softmax("aten::_log_softmax.out", true, self, dim, half_to_float, out)) return out;
  return TERN_FALLBACK(_log_softmax_out, self, dim, half_to_float, out);
}
TERN_ATEN_IMPL("_log_softmax.out", LogSoftmaxOut);

bool SoftmaxBackward(const char* name, bool log, const at::Tensor& grad_output,
                     const at::Tensor& output, int64_t dim, at::ScalarType input_dtype,
                     const at::Tensor& grad_input) {
  const at::ScalarType dtype = grad_output.scalar_type();
  if (!IsTern(grad_output) || !IsTern(output) || !IsTern(grad_input) ||
      output.scalar_type() != dtype || input_dtype != dtype || grad_input.scalar_type() != dtype ||
      !at::isFloatingType(dtype) || grad_output.sizes() != output.sizes()) {
    return false;
  }
  ResizeOut(grad_input, output.sizes());
  if (!OutputOk(grad_input, {grad_output, output})) return false;
  const int64_t axis = output.dim() == 0 ? 0 : c10::maybe_wrap_dim(dim, output.dim());
  Program p(name);
  p.Emit(TERN_OP_SOFTMAX_BACKWARD, {p.Out(grad_input), p.In(grad_output), p.In(output)},
         {axis, log ? 1 : 0});
  return p.Run();
}

at::Tensor& SoftmaxBackwardOut(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                               at::ScalarType input_dtype, at::Tensor& grad_input) {
  if (SoftmaxBackward("aten::_softmax_backward_data.out", false, grad_output, output, dim,
                      input_dtype, grad_input)) {
    return grad_input;
  }
  return TERN_FALLBACK(_softmax_backward_data_out, grad_output, output, dim, input_dtype,
                       grad_input);
}
TERN_ATEN_IMPL("_softmax_backward_data.out", SoftmaxBackwardOut);

at::Tensor& LogSoftmaxBackwardOut(const at::Tensor& grad_output, const at::Tensor& output,
                                  int64_t dim, at::ScalarType input_dtype, at::Tensor& grad_input) {
  if (SoftmaxBackward("aten::_log_softmax_backward_data.out", true, grad_output, output, dim,
                      input_dtype, grad_input)) {
    return grad_input;
  }
  return TERN_FALLBACK(_log_softmax_backward_data_out, grad_output, output, dim, input_dtype,
                       grad_input);
}
TERN_ATEN_IMPL("_log_softmax_backward_data.out", LogSoftmaxBackwardOut);

// ---- Layer norm ----------------------------------------------------------------------------

bool OptionalOk(const std::optional<at::Tensor>& t, at::IntArrayRef shape) {
  if (!t.has_value() || !t->defined()) return true;
  return IsTern(*t) && at::isFloatingType(t->scalar_type()) && Supported(t->scalar_type()) &&
         t->sizes() == shape;
}

bool Defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeLayerNorm(
    const at::Tensor& input, at::IntArrayRef normalized_shape,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const int64_t rank = input.dim();
  if (IsTern(input) && at::isFloatingType(input.scalar_type()) && Supported(input.scalar_type()) &&
      k >= 1 && k <= rank && input.sizes().slice(rank - k) == normalized_shape &&
      OptionalOk(weight, normalized_shape) && OptionalOk(bias, normalized_shape) && eps > 0) {
    // mean and rstd keep input's rank with size-1 normalised dims, in
    // input's dtype, as the CPU gives them.
    std::vector<int64_t> stat_shape = input.sizes().vec();
    for (int64_t d = rank - k; d < rank; ++d) stat_shape[d] = 1;
    const at::ScalarType stat_type = input.scalar_type();
    at::Tensor out = at::empty(input.sizes(), input.options(), at::MemoryFormat::Contiguous);
    at::Tensor mean = at::empty(stat_shape, input.options().dtype(stat_type));
    at::Tensor rstd = at::empty(stat_shape, input.options().dtype(stat_type));
    const std::vector<int64_t> lead(input.sizes().begin(), input.sizes().end() - k);
    Program p("aten::native_layer_norm");
    p.Emit(TERN_OP_LAYER_NORM,
           {p.Out(out), p.Out(mean).View(lead), p.Out(rstd).View(lead), p.In(input),
            Defined(weight) ? p.In(*weight) : program::None(),
            Defined(bias) ? p.In(*bias) : program::None()},
           {k}, {eps});
    if (p.ok() && p.Run()) return {out, mean, rstd};
  }
  return TERN_FALLBACK(native_layer_norm, input, normalized_shape, weight, bias, eps);
}
TERN_ATEN_IMPL("native_layer_norm", NativeLayerNorm);

std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeLayerNormBackward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const int64_t rank = input.dim();
  const at::ScalarType dtype = input.scalar_type();
  if (IsTern(input) && IsTern(grad_out) && IsTern(mean) && IsTern(rstd) &&
      at::isFloatingType(dtype) && Supported(dtype) && grad_out.scalar_type() == dtype &&
      grad_out.sizes() == input.sizes() && k >= 1 && k <= rank &&
      input.sizes().slice(rank - k) == normalized_shape && OptionalOk(weight, normalized_shape) &&
      Supported(mean.scalar_type()) && Supported(rstd.scalar_type()) &&
      at::isFloatingType(mean.scalar_type()) && at::isFloatingType(rstd.scalar_type())) {
    const std::vector<int64_t> lead(input.sizes().begin(), input.sizes().end() - k);
    int64_t lead_numel = 1;
    for (int64_t s : lead) lead_numel *= s;
    if (mean.numel() == lead_numel && rstd.numel() == lead_numel) {
      at::Tensor grad_input, grad_weight, grad_bias;
      Program p("aten::native_layer_norm_backward");
      Operand gi = program::None(), gw = program::None(), gb = program::None();
      if (output_mask[0]) {
        grad_input = at::empty(input.sizes(), input.options(), at::MemoryFormat::Contiguous);
        gi = p.Out(grad_input);
      }
      const bool has_weight = Defined(weight);
      if (output_mask[1] && has_weight) {
        grad_weight = at::empty(normalized_shape, weight->options());
        gw = p.Out(grad_weight);
      }
      if (output_mask[2] && Defined(bias)) {
        grad_bias = at::empty(normalized_shape, bias->options());
        gb = p.Out(grad_bias);
      }
      if (!gi.present() && !gw.present() && !gb.present()) return {};
      // grad_in is not optional in the instruction: write it to scratch when unwanted.
      if (!gi.present()) gi = p.Temp(*TD(dtype), input.sizes());
      p.Emit(TERN_OP_LAYER_NORM_BACKWARD,
             {gi, gw, gb, p.In(grad_out), p.In(input), p.In(mean).View(lead), p.In(rstd).View(lead),
              has_weight ? p.In(*weight) : program::None()},
             {k});
      if (p.ok() && p.Run()) return {grad_input, grad_weight, grad_bias};
    }
  }
  return TERN_FALLBACK(native_layer_norm_backward, grad_out, input, normalized_shape, mean, rstd,
                       weight, bias, output_mask);
}
TERN_ATEN_IMPL("native_layer_norm_backward", NativeLayerNormBackward);

// ---- Batch norm ------------------------------------------------------------------------
// Statistics per channel (dim 1) over every other dim, float32 throughout.

struct BatchNormShape {
  std::vector<int64_t> kept;  // [1, C, 1, ...]
  std::vector<int64_t> axes;  // every dim but 1
  int64_t channels = 0;
  int64_t count = 0;  // elements per channel
};

BatchNormShape BnShape(const at::Tensor& input) {
  BatchNormShape s;
  s.kept.assign(input.dim(), 1);
  s.channels = input.size(1);
  s.kept[1] = s.channels;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d != 1) s.axes.push_back(d);
  }
  s.count = s.channels > 0 ? input.numel() / s.channels : 0;
  return s;
}

bool F32Tern(const std::optional<at::Tensor>& t, int64_t channels) {
  return !Defined(t) ||
         (IsTern(*t) && t->scalar_type() == at::kFloat && t->dim() == 1 && t->size(0) == channels);
}

// bf16/f16 activations with float32 parameters: what batch norm gets under
// autocast (it is on no autocast list, so the convolution's bf16 output
// arrives as is). As the CPU's mixed-dtype kernel, it computes in float32 and
// rounds the output once; the saved statistics and the parameters' gradients
// stay float32.
bool MixedBatchNorm(const at::Tensor& input,
                    std::initializer_list<const std::optional<at::Tensor>*> params) {
  if (!IsTern(input) ||
      (input.scalar_type() != at::kBFloat16 && input.scalar_type() != at::kHalf) ||
      input.dim() < 2) {
    return false;
  }
  for (const std::optional<at::Tensor>* t : params) {
    if (!F32Tern(*t, input.size(1))) return false;
  }
  return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeBatchNorm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps) {
  if (MixedBatchNorm(input, {&weight, &bias, &running_mean, &running_var})) {
    auto [out, mean, invstd] = NativeBatchNorm(input.to(at::kFloat), weight, bias, running_mean,
                                               running_var, training, momentum, eps);
    return {out.to(input.scalar_type()), mean, invstd};
  }
  if (IsTern(input) && input.scalar_type() == at::kFloat && input.dim() >= 2 && input.numel() > 0) {
    const BatchNormShape s = BnShape(input);
    const bool stats = Defined(running_mean) && Defined(running_var);
    if (F32Tern(weight, s.channels) && F32Tern(bias, s.channels) &&
        F32Tern(running_mean, s.channels) && F32Tern(running_var, s.channels) &&
        (training || stats) && (!training || s.count > 0)) {
      const tern_dtype_t d = TERN_DTYPE_F32;
      const at::IntArrayRef shape = input.sizes();
      const std::vector<int64_t> c = {s.channels};
      at::Tensor out = at::empty(shape, input.options(), input.suggest_memory_format());
      at::Tensor save_mean = at::empty({training ? s.channels : 0}, input.options());
      at::Tensor save_invstd = at::empty({training ? s.channels : 0}, input.options());
      Program p("aten::native_batch_norm");
      Operand X = p.In(input);
      std::vector<int64_t> reduce_mean = {TERN_REDUCE_MEAN};
      reduce_mean.insert(reduce_mean.end(), s.axes.begin(), s.axes.end());
      Operand mean, invstd = p.Temp(d, s.kept), dev = p.Temp(d, shape);
      Operand var = p.Temp(d, s.kept);
      if (training) {
        mean = p.Temp(d, s.kept);
        p.Emit(TERN_OP_REDUCE, {mean, X}, reduce_mean);
        p.Emit(TERN_OP_BINARY, {dev, X, mean.Expand(shape)}, {TERN_BINARY_SUB});
        Operand sq = p.Temp(d, shape);
        p.Emit(TERN_OP_BINARY, {sq, dev, dev}, {TERN_BINARY_MUL});
        p.Emit(TERN_OP_REDUCE, {var, sq}, reduce_mean);
      } else {
        mean = p.In(*running_mean).View(s.kept);
        p.Emit(TERN_OP_BINARY, {dev, X, mean.Expand(shape)}, {TERN_BINARY_SUB});
        p.Emit(TERN_OP_COPY, {var, p.In(*running_var).View(s.kept)});
      }
      Operand shifted = p.Temp(d, s.kept);
      p.Emit(TERN_OP_BINARY, {shifted, var, p.Const(eps, d).Expand(s.kept)}, {TERN_BINARY_ADD});
      p.Emit(TERN_OP_UNARY, {invstd, shifted}, {TERN_UNARY_RSQRT});
      Operand O = p.Out(out);
      const bool affine = Defined(weight) || Defined(bias);
      Operand normed = affine ? p.Temp(d, shape) : O;
      p.Emit(TERN_OP_BINARY, {normed, dev, invstd.Expand(shape)}, {TERN_BINARY_MUL});
      if (affine) {
        Operand scaled = normed;
        if (Defined(weight)) {
          scaled = Defined(bias) ? p.Temp(d, shape) : O;
          p.Emit(TERN_OP_BINARY, {scaled, normed, p.In(*weight).View(s.kept).Expand(shape)},
                 {TERN_BINARY_MUL});
        }
        if (Defined(bias)) {
          p.Emit(TERN_OP_BINARY, {O, scaled, p.In(*bias).View(s.kept).Expand(shape)},
                 {TERN_BINARY_ADD});
        }
      }
      if (training) {
        p.Emit(TERN_OP_COPY, {p.Out(save_mean), mean.View(c)});
        p.Emit(TERN_OP_COPY, {p.Out(save_invstd), invstd.View(c)});
        if (stats) {
          // running = (1 - momentum) * running + momentum * batch (variance unbiased)
          const double unbias =
              s.count > 1 ? static_cast<double>(s.count) / static_cast<double>(s.count - 1) : 1.0;
          Operand a = p.Temp(d, c), b = p.Temp(d, c);
          const Operand RM = p.Out(*running_mean), RV = p.Out(*running_var);
          p.Emit(TERN_OP_UNARY, {a, mean.View(c)}, {TERN_UNARY_AFFINE}, {momentum, 0.0});
          p.Emit(TERN_OP_UNARY, {b, p.In(*running_mean)}, {TERN_UNARY_AFFINE},
                 {1.0 - momentum, 0.0});
          p.Emit(TERN_OP_BINARY, {RM, a, b}, {TERN_BINARY_ADD});
          p.Emit(TERN_OP_UNARY, {a, var.View(c)}, {TERN_UNARY_AFFINE}, {momentum * unbias, 0.0});
          p.Emit(TERN_OP_UNARY, {b, p.In(*running_var)}, {TERN_UNARY_AFFINE},
                 {1.0 - momentum, 0.0});
          p.Emit(TERN_OP_BINARY, {RV, a, b}, {TERN_BINARY_ADD});
        }
      }
      if (p.ok() && p.Run()) return {out, save_mean, save_invstd};
    }
  }
  return TERN_FALLBACK(native_batch_norm, input, weight, bias, running_mean, running_var, training,
                       momentum, eps);
}
TERN_ATEN_IMPL("native_batch_norm", NativeBatchNorm);

std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeBatchNormBackward(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd,
    bool train, double eps, std::array<bool, 3> output_mask) {
  auto saved_f32 = [](const std::optional<at::Tensor>& t) {
    return !Defined(t) || (IsTern(*t) && t->scalar_type() == at::kFloat);
  };
  if (MixedBatchNorm(input, {&weight, &running_mean, &running_var}) && saved_f32(save_mean) &&
      saved_f32(save_invstd) && IsTern(grad_out) && grad_out.scalar_type() == input.scalar_type()) {
    auto [grad_input, grad_weight, grad_bias] =
        NativeBatchNormBackward(grad_out.to(at::kFloat), input.to(at::kFloat), weight, running_mean,
                                running_var, save_mean, save_invstd, train, eps, output_mask);
    if (grad_input.defined()) grad_input = grad_input.to(input.scalar_type());
    return {grad_input, grad_weight, grad_bias};
  }
  if (IsTern(input) && IsTern(grad_out) && input.scalar_type() == at::kFloat &&
      grad_out.scalar_type() == at::kFloat && grad_out.sizes() == input.sizes() &&
      input.dim() >= 2 && input.numel() > 0) {
    const BatchNormShape s = BnShape(input);
    const bool have_saved = Defined(save_mean) && Defined(save_invstd) &&
                            save_mean->numel() == s.channels && save_invstd->numel() == s.channels;
    const bool have_running = Defined(running_mean) && Defined(running_var);
    if (F32Tern(weight, s.channels) && F32Tern(running_mean, s.channels) &&
        F32Tern(running_var, s.channels) && (train ? have_saved : have_running) &&
        (!have_saved || (F32Tern(save_mean, s.channels) && F32Tern(save_invstd, s.channels)))) {
      const tern_dtype_t d = TERN_DTYPE_F32;
      const at::IntArrayRef shape = input.sizes();
      const std::vector<int64_t> c = {s.channels};
      std::vector<int64_t> reduce_sum = {TERN_REDUCE_SUM};
      reduce_sum.insert(reduce_sum.end(), s.axes.begin(), s.axes.end());
      Program p("aten::native_batch_norm_backward");
      Operand X = p.In(input), G = p.In(grad_out);
      Operand mean, invstd;
      if (train) {
        mean = p.In(*save_mean).View(s.kept);
        invstd = p.In(*save_invstd).View(s.kept);
      } else {
        mean = p.In(*running_mean).View(s.kept);
        Operand shifted = p.Temp(d, s.kept);
        invstd = p.Temp(d, s.kept);
        p.Emit(TERN_OP_BINARY,
               {shifted, p.In(*running_var).View(s.kept), p.Const(eps, d).Expand(s.kept)},
               {TERN_BINARY_ADD});
        p.Emit(TERN_OP_UNARY, {invstd, shifted}, {TERN_UNARY_RSQRT});
      }
      Operand xhat = p.Temp(d, shape), t = p.Temp(d, shape);
      p.Emit(TERN_OP_BINARY, {t, X, mean.Expand(shape)}, {TERN_BINARY_SUB});
      p.Emit(TERN_OP_BINARY, {xhat, t, invstd.Expand(shape)}, {TERN_BINARY_MUL});
      Operand gsum = p.Temp(d, s.kept), gxsum = p.Temp(d, s.kept);
      p.Emit(TERN_OP_REDUCE, {gsum, G}, reduce_sum);
      p.Emit(TERN_OP_BINARY, {t, G, xhat}, {TERN_BINARY_MUL});
      p.Emit(TERN_OP_REDUCE, {gxsum, t}, reduce_sum);
      at::Tensor grad_input, grad_weight, grad_bias;
      if (output_mask[0]) {
        grad_input = at::empty(shape, input.options(), input.suggest_memory_format());
        // scale = invstd * weight (per channel)
        Operand scale = invstd;
        if (Defined(weight)) {
          scale = p.Temp(d, s.kept);
          p.Emit(TERN_OP_BINARY, {scale, invstd, p.In(*weight).View(s.kept)}, {TERN_BINARY_MUL});
        }
        const Operand GI = p.Out(grad_input);
        if (train) {
          // (g - sum(g)/n - xhat * sum(g*xhat)/n) * scale
          const double inv_n = 1.0 / static_cast<double>(s.count);
          Operand mg = p.Temp(d, s.kept), mgx = p.Temp(d, s.kept);
          p.Emit(TERN_OP_UNARY, {mg, gsum}, {TERN_UNARY_AFFINE}, {inv_n, 0.0});
          p.Emit(TERN_OP_UNARY, {mgx, gxsum}, {TERN_UNARY_AFFINE}, {inv_n, 0.0});
          Operand u = p.Temp(d, shape);
          p.Emit(TERN_OP_BINARY, {u, G, mg.Expand(shape)}, {TERN_BINARY_SUB});
          p.Emit(TERN_OP_BINARY, {t, xhat, mgx.Expand(shape)}, {TERN_BINARY_MUL});
          p.Emit(TERN_OP_BINARY, {u, u, t}, {TERN_BINARY_SUB});
          p.Emit(TERN_OP_BINARY, {GI, u, scale.Expand(shape)}, {TERN_BINARY_MUL});
        } else {
          p.Emit(TERN_OP_BINARY, {GI, G, scale.Expand(shape)}, {TERN_BINARY_MUL});
        }
      }
      if (output_mask[1] && Defined(weight)) {
        grad_weight = at::empty(c, input.options());
        p.Emit(TERN_OP_COPY, {p.Out(grad_weight), gxsum.View(c)});
      }
      if (output_mask[2]) {
        grad_bias = at::empty(c, input.options());
        p.Emit(TERN_OP_COPY, {p.Out(grad_bias), gsum.View(c)});
      }
      if (p.ok() && p.Run()) return {grad_input, grad_weight, grad_bias};
    }
  }
  return TERN_FALLBACK(native_batch_norm_backward, grad_out, input, weight, running_mean,
                       running_var, save_mean, save_invstd, train, eps, output_mask);
}
TERN_ATEN_IMPL("native_batch_norm_backward", NativeBatchNormBackward);

// ---- RMS norm -------------------------------------------------------------------------------
// aten::rms_norm is a composite in ATen; on tern it runs as one RMS_NORM
// instruction forward and one RMS_NORM_BACKWARD backward, through an autograd
// function registered for AutogradPrivateUse1. Traced (fake or functional
// tensors, a dispatch mode: torch.compile, make_fx, export) it runs ATen's
// composite instead, so the graph holds ATen operators with ATen's meta
// functions and derivatives (docs/torch.md, "torch.compile").

bool RmsNormSupported(const at::Tensor& input, at::IntArrayRef normalized_shape,
                      const std::optional<at::Tensor>& weight) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const int64_t rank = input.dim();
  return IsTern(input) && at::isFloatingType(input.scalar_type()) &&
         Supported(input.scalar_type()) && k >= 1 && k <= rank &&
         input.sizes().slice(rank - k) == normalized_shape &&
         (!Defined(weight) || (IsTern(*weight) && weight->scalar_type() == input.scalar_type() &&
                               weight->sizes() == normalized_shape));
}

// ATen's default: the machine epsilon of the opmath type (f32 for every float dtype).
double RmsEps(std::optional<double> eps) {
  return eps.value_or(static_cast<double>(std::numeric_limits<float>::epsilon()));
}

std::tuple<at::Tensor, at::Tensor> RmsNormForward(const at::Tensor& input, int64_t k,
                                                  const at::Tensor& weight, double eps) {
  const std::vector<int64_t> lead(input.sizes().begin(), input.sizes().end() - k);
  at::Tensor out = at::empty(input.sizes(), input.options(), at::MemoryFormat::Contiguous);
  at::Tensor rstd = at::empty(lead, input.options().dtype(at::kFloat));
  Program p("aten::rms_norm");
  p.Emit(TERN_OP_RMS_NORM,
         {p.Out(out), p.Out(rstd), p.In(input), weight.defined() ? p.In(weight) : program::None()},
         {k}, {eps});
  TORCH_CHECK(p.Run(), "tern: rms_norm kernel refused: ", program::GetCacheInfo().last_error);
  return {out, rstd};
}

// kWeight: whether the norm has a weight (autograd functions take only
// defined tensors as differentiable inputs).
template <bool kWeight>
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction<kWeight>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t k, const at::Tensor& weight, double eps) {
    auto [out, rstd] = RmsNormForward(input, k, weight, eps);
    ctx->save_for_backward({input, kWeight ? weight : rstd, rstd});
    ctx->saved_data["k"] = k;
    return out;
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            int64_t k, double eps) {
    return forward(ctx, input, k, at::Tensor(), eps);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor weight = kWeight ? saved[1] : at::Tensor();
    const at::Tensor& rstd = saved[2];
    const int64_t k = ctx->saved_data["k"].toInt();
    at::Tensor grad_out = grads[0].contiguous();
    at::Tensor grad_input = at::empty(input.sizes(), input.options(), at::MemoryFormat::Contiguous);
    at::Tensor grad_weight;
    Program p("aten::rms_norm_backward");
    Operand gw = program::None();
    if (weight.defined() && ctx->needs_input_grad(1)) {
      grad_weight = at::empty(weight.sizes(), weight.options());
      gw = p.Out(grad_weight);
    }
    p.Emit(TERN_OP_RMS_NORM_BACKWARD,
           {p.Out(grad_input), gw, p.In(grad_out), p.In(input), p.In(rstd),
            weight.defined() ? p.In(weight) : program::None()},
           {k});
    TORCH_CHECK(p.Run(),
                "tern: rms_norm backward kernel refused: ", program::GetCacheInfo().last_error);
    if (kWeight) return {grad_input, at::Tensor(), grad_weight, at::Tensor()};
    return {grad_input, at::Tensor(), at::Tensor()};
  }
};

at::Tensor RmsNormAutograd(const at::Tensor& input, c10::SymIntArrayRef normalized_shape_sym,
                           const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  // Before anything reads sizes: a traced tensor's may be symbolic.
  if (Traced(input) || Traced(weight)) {
    return at::compositeimplicitautograd::rms_norm_symint(input, normalized_shape_sym, weight, eps);
  }
  const std::vector<int64_t> normalized_shape = C10_AS_INTARRAYREF_SLOW(normalized_shape_sym).vec();
  const double e = RmsEps(eps);
  if (RmsNormSupported(input, normalized_shape, weight) && program::ExecutablesAvailable() &&
      input.sizes().size() <= TERN_MAX_RANK && input.numel() > 0 && e > 0 && std::isfinite(e)) {
    const int64_t k = static_cast<int64_t>(normalized_shape.size());
    if (Defined(weight)) return RmsNormFunction<true>::apply(input, k, *weight, e);
    return RmsNormFunction<false>::apply(input, k, e);
  }
  // The composite (pow, mean, rsqrt, mul): each piece native or logged.
  return at::compositeimplicitautograd::rms_norm_symint(input, normalized_shape_sym, weight, eps);
}
TERN_ATEN_IMPL_FOR(AutogradPrivateUse1, "rms_norm", RmsNormAutograd);

// Without autograd (inference mode, or below the autograd key): real tensors
// only, as every PrivateUse1 kernel (see Traced).
at::Tensor RmsNorm(const at::Tensor& input, c10::SymIntArrayRef normalized_shape_sym,
                   const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  const std::vector<int64_t> normalized_shape = C10_AS_INTARRAYREF_SLOW(normalized_shape_sym).vec();
  if (RmsNormSupported(input, normalized_shape, weight) && program::ExecutablesAvailable() &&
      input.numel() > 0 && RmsEps(eps) > 0 && std::isfinite(RmsEps(eps))) {
    return std::get<0>(RmsNormForward(input, static_cast<int64_t>(normalized_shape.size()),
                                      Defined(weight) ? *weight : at::Tensor(), RmsEps(eps)));
  }
  return at::compositeimplicitautograd::rms_norm_symint(input, normalized_shape_sym, weight, eps);
}
TERN_ATEN_IMPL("rms_norm", RmsNorm);

}  // namespace

}  // namespace torch_tern::native
