// Native cumulative operators: cumsum and cumprod (the SCAN instruction,
// docs/isa.md). Their functional and in-place forms are generated on top of
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

}  // namespace
}  // namespace torch_tern::native
