// Native cumulative operators: cumsum, cumprod, cummax and cummin (the SCAN
// instruction, docs/isa.md). Their functional and in-place forms are generated on top of
// the `.out` kernels (structured kernels), so those are the ones registered.
// As on the CPU, self is first converted to out's dtype (an integer or bool
// self sums straight into an i64 out: SCAN promotes), then accumulated: f32 in
// f64, bf16/f16 in f32, integers in i64.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// out = the inclusive scan `fn` of self along dim.
bool Scan(const char* name, tern_scan_fn_t fn, const at::Tensor& self, int64_t dim,
          const at::Tensor& out) {
  if (!IsTern(self) || !IsTern(out) || !Supported(self.scalar_type())) return false;
  const at::ScalarType out_type = out.scalar_type();
  if (out_type == at::kBool || !Supported(out_type)) return false;
  dim = c10::maybe_wrap_dim(dim, self.dim());
  ResizeOut(out, self.sizes());
  if (!OutputOk(out, {self})) return false;
  if (out.numel() == 0) return true;
  Program p(name);
  const bool promotes = out_type == at::kLong && at::isIntegralType(self.scalar_type(), true);
  Operand X = promotes ? p.In(self) : Input(p, self, out_type, self.sizes());
  if (!p.ok()) return false;
  p.Emit(TERN_OP_SCAN, {p.Out(out), X}, {fn, dim});
  return p.Run();
}

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& CumsumOut(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                      at::Tensor& out) {
  if (Scan("aten::cumsum.out", TERN_SCAN_SUM, self, dim, out)) return out;
  return TERN_FALLBACK(cumsum_out, self, dim, dtype, out);
}
TERN_ATEN_IMPL("cumsum.out", CumsumOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& CumprodOut(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype,
                       at::Tensor& out) {
  if (Scan("aten::cumprod.out", TERN_SCAN_PROD, self, dim, out)) return out;
  return TERN_FALLBACK(cumprod_out, self, dim, dtype, out);
}
TERN_ATEN_IMPL("cumprod.out", CumprodOut);

// cummax / cummin's values and indices (the kernel under cummax, cummax.out
// and cummin's forms, which size the outputs and handle rank 0 and empty
// selves). Values: a SCAN max / min. Indices as the CPU's loop, which moves
// the index to position i when x[i] >= the running maximum (<= for the
// minimum) or x[i] is NaN: there x[i] equals the running value at i (NaN
// sticks in both), so the index is the last such position so far, a SCAN
// max over where(x == value or isnan(x), position, -1).
bool CumulativeExtreme(const char* name, bool max, const at::Tensor& self, const at::Tensor& values,
                       const at::Tensor& indices, int64_t dim) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || dtype == at::kBool || !Supported(dtype) || values.scalar_type() != dtype ||
      indices.scalar_type() != at::kLong || self.dim() == 0 || values.sizes() != self.sizes() ||
      indices.sizes() != self.sizes() || !OutputOk(values, {self}) || !OutputOk(indices, {}) ||
      values.storage().is_alias_of(indices.storage()) ||
      values.storage().is_alias_of(self.storage()) ||
      indices.storage().is_alias_of(self.storage())) {
    return false;
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  if (self.numel() == 0) return true;
  Program p(name);
  Operand X = p.In(self);
  Operand V = p.Out(values);
  p.Emit(TERN_OP_SCAN, {V, X}, {max ? TERN_SCAN_MAX : TERN_SCAN_MIN, dim});
  Operand hit = p.Temp(TERN_DTYPE_BOOL, self.sizes());
  p.Emit(TERN_OP_BINARY, {hit, X, V}, {TERN_BINARY_EQ});
  if (at::isFloatingType(dtype)) {
    Operand nan = p.Temp(TERN_DTYPE_BOOL, self.sizes());
    p.Emit(TERN_OP_UNARY, {nan, X}, {TERN_UNARY_ISNAN});
    p.Emit(TERN_OP_BINARY, {hit, hit, nan}, {TERN_BINARY_LOGICAL_OR});
  }
  Operand position = p.Temp(TERN_DTYPE_I64, self.sizes());
  p.Emit(TERN_OP_IOTA, {position}, {dim});
  Operand candidate = p.Temp(TERN_DTYPE_I64, self.sizes());
  p.Emit(TERN_OP_WHERE,
         {candidate, hit, position, p.ConstInt(-1, TERN_DTYPE_I64).Expand(self.sizes())});
  p.Emit(TERN_OP_SCAN, {p.Out(indices), candidate}, {TERN_SCAN_MAX, dim});
  return p.ok() && p.Run();
}

// Thread-safety: any thread (the current stream's queue orders the work).
void CummaxHelper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  if (CumulativeExtreme("aten::_cummax_helper", true, self, values, indices, dim)) return;
  TERN_FALLBACK(_cummax_helper, self, values, indices, dim);
}
TERN_ATEN_IMPL("_cummax_helper", CummaxHelper);

// Thread-safety: any thread (the current stream's queue orders the work).
void CumminHelper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  if (CumulativeExtreme("aten::_cummin_helper", false, self, values, indices, dim)) return;
  TERN_FALLBACK(_cummin_helper, self, values, indices, dim);
}
TERN_ATEN_IMPL("_cummin_helper", CumminHelper);

}  // namespace
}  // namespace torch_tern::native
