// Selections whose size depends on the data: nonzero (so torch.where(cond)
// and boolean-mask indexing, which ATen turns into nonzero) and
// masked_select. As on every device, the number of selected elements is read
// on the host first (a synchronisation of the current stream); the rest runs
// on tern: an inclusive scan gives each true element its row, a scatter puts
// its flat index there, and the coordinates follow by integer division.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// Flat (row-major) indices of the true elements of `flags` (bool, 1-D), in
// order; `count` of them.
at::Tensor TrueFlatIndices(const at::Tensor& flags, int64_t count) {
  const at::TensorOptions longs = flags.options().dtype(at::kLong);
  const int64_t n = flags.numel();
  // Each true element's row; the false ones go to a spare last row.
  const at::Tensor row = at::cumsum(flags, 0, at::kLong) - 1;
  const at::Tensor slot = at::where(flags, row, at::full({}, count, longs));
  at::Tensor flat = at::empty({count + 1}, longs);
  flat.scatter_(0, slot, at::arange(n, longs));
  return flat.narrow(0, 0, count);
}

at::Tensor& NonzeroOut(const at::Tensor& self, at::Tensor& out) {
  if (!IsTern(self) || !IsTern(out) || out.scalar_type() != at::kLong || self.is_complex() ||
      self.device() != out.device()) {
    return TERN_FALLBACK(nonzero_out, self, out);
  }
  const int64_t dims = self.dim();
  const at::Tensor flags = (self != 0).reshape({-1});
  const int64_t count = flags.numel() == 0 ? 0 : flags.sum().item<int64_t>();
  at::native::resize_output(out, {count, dims});
  if (count == 0 || dims == 0) return out;
  const at::Tensor flat = TrueFlatIndices(flags, count);
  std::vector<at::Tensor> coordinates;
  int64_t stride = flags.numel();
  for (int64_t d = 0; d < dims; ++d) {
    stride /= self.size(d);
    coordinates.push_back(at::remainder(at::floor_divide(flat, stride), self.size(d)));
  }
  out.copy_(at::stack(coordinates, 1));
  return out;
}
TERN_ATEN_IMPL("nonzero.out", NonzeroOut);

at::Tensor Nonzero(const at::Tensor& self) {
  at::Tensor out = at::empty({0}, self.options().dtype(at::kLong));
  NonzeroOut(self, out);
  return out;
}
TERN_ATEN_IMPL("nonzero", Nonzero);

// self's elements where mask (broadcast against it) is true, as a 1-D tensor.
at::Tensor& MaskedSelectOut(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  if (!IsTern(self) || !IsTern(mask) || !IsTern(out) || mask.scalar_type() != at::kBool ||
      out.scalar_type() != self.scalar_type()) {
    return TERN_FALLBACK(masked_select_out, self, mask, out);
  }
  const auto [values, flags] = at::expand_outplace(self, mask);
  const at::Tensor flat_flags = flags->reshape({-1});
  const int64_t count = flat_flags.numel() == 0 ? 0 : flat_flags.sum().item<int64_t>();
  at::native::resize_output(out, {count});
  if (count == 0) return out;
  out.copy_(values->reshape({-1}).index_select(0, TrueFlatIndices(flat_flags, count)));
  return out;
}
TERN_ATEN_IMPL("masked_select.out", MaskedSelectOut);

at::Tensor MaskedSelect(const at::Tensor& self, const at::Tensor& mask) {
  at::Tensor out = at::empty({0}, self.options());
  MaskedSelectOut(self, mask, out);
  return out;
}
TERN_ATEN_IMPL("masked_select", MaskedSelect);

}  // namespace
}  // namespace torch_tern::native
