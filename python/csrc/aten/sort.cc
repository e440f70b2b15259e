// Native sort and topk (the SORT and TOPK instructions, docs/isa.md).
// torch.sort, Tensor.sort(stable=...), argsort and msort all reach
// sort.values_stable (their functional forms are generated on top of it, or
// are composites calling it); topk's functional form is generated on top of
// topk.values. SORT is always stable, which is a valid result of an unstable
// sort too; NaN orders above every number, as on the CPU. TOPK selects the k
// best along the axis without sorting the whole of it, and returns them
// sorted (a valid result when sorted=False too).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// values and indices of `opcode` over self along dim; `k` along dim (topk)
// or self's size (sort).
bool SortOrSelect(const char* name, tern_opcode_t opcode, const at::Tensor& self, int64_t dim,
                  int64_t k, bool descending, const at::Tensor& values, const at::Tensor& indices) {
  if (!IsTern(self) || !IsTern(values) || !IsTern(indices) || !Supported(self.scalar_type()) ||
      values.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong) {
    return false;
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> shape = self.sizes().vec();
  if (self.dim() > 0) {
    if (k < 0 || k > shape[dim]) return false;  // ATen's checks raise first
    shape[dim] = k;
  }
  ResizeOut(values, shape);
  ResizeOut(indices, shape);
  if (!OutputOk(values, {self, indices}) || !OutputOk(indices, {self, values})) return false;
  if (values.numel() == 0) return true;
  Program p(name);
  p.Emit(opcode, {p.Out(values), p.Out(indices), p.In(self)}, {dim, descending ? 1 : 0});
  return p.Run();
}

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor&, at::Tensor&> SortStableOut(const at::Tensor& self,
                                                   std::optional<bool> stable, int64_t dim,
                                                   bool descending, at::Tensor& values,
                                                   at::Tensor& indices) {
  const int64_t size = self.dim() == 0 ? 1 : self.size(c10::maybe_wrap_dim(dim, self.dim()));
  if (SortOrSelect("aten::sort.values_stable", TERN_OP_SORT, self, dim, size, descending, values,
                   indices)) {
    return {values, indices};
  }
  return TERN_FALLBACK2(sort, values_stable, self, stable, dim, descending, values, indices);
}
TERN_ATEN_IMPL("sort.values_stable", SortStableOut);

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor&, at::Tensor&> TopkOut(const at::Tensor& self, c10::SymInt k, int64_t dim,
                                             bool largest, bool sorted, at::Tensor& values,
                                             at::Tensor& indices) {
  const int64_t count = k.expect_int();  // a concrete tensor: k is known
  if (SortOrSelect("aten::topk.values", TERN_OP_TOPK, self, dim, count, largest, values, indices)) {
    return {values, indices};
  }
  return TERN_FALLBACK2(topk, values, self, count, dim, largest, sorted, values, indices);
}
TERN_ATEN_IMPL("topk.values", TopkOut);

}  // namespace
}  // namespace torch_tern::native
