// histc of integer tensors. PyTorch's CPU kernel takes floating types only,
// CUDA's takes integers too, and transformers' mixture-of-experts routers call
// torch.histc on an integer tensor of expert indices on every device but the
// CPU; through the CPU fallback that failed ("histogram_cpu" not implemented
// for 'Int'). Here integer histc runs on the device with CUDA's semantics:
// bounds and bin arithmetic in 64-bit integers, bin = (x - min) * bins /
// (max - min) (the last edge belongs to the last bin), values outside
// [min, max] ignored, min == max == 0 meaning the data's range, and the counts
// in the input's dtype. Floating histc keeps the CPU kernel (the fallback).
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>

#include <algorithm>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// Elements of the one-hot comparison made at once: bounds the temporary
// [elements, bins] boolean tensor to 4 MiB.
constexpr int64_t kOneHotElements = int64_t{1} << 22;

bool IntegerInput(const at::Tensor& self) {
  return at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
}

// Counts of `self` (integer) per bin, as int64, on self's device.
at::Tensor IntegerHistogram(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                            const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins);
  const at::Tensor values = self.reshape({-1}).to(at::kLong);
  int64_t lo = min.toLong(), hi = max.toLong();
  if (lo == hi && values.numel() > 0) {
    lo = values.min().item<int64_t>();
    hi = values.max().item<int64_t>();
  }
  if (lo == hi) {  // as CUDA's: widen an empty range
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(lo < hi, "torch.histc: max must be larger than min; got min ", lo, " and max ", hi);
  at::Tensor counts = at::zeros({bins}, values.options());
  if (values.numel() == 0) return counts;
  // Values outside [lo, hi] get bin `bins`, which no bin's index matches.
  const at::Tensor inside = values.ge(lo).logical_and(values.le(hi));
  at::Tensor bin = (values - lo).mul(bins).div(hi - lo, "floor").clamp_max(bins - 1);
  bin = at::where(inside, bin, at::full({}, bins, bin.options()));
  const at::Tensor bin_index = at::arange(bins, values.options()).unsqueeze(0);
  const int64_t step = std::max<int64_t>(1, kOneHotElements / bins);
  for (int64_t begin = 0; begin < bin.numel(); begin += step) {
    const at::Tensor part = bin.narrow(0, begin, std::min(step, bin.numel() - begin));
    counts += part.unsqueeze(1).eq(bin_index).sum(0);
  }
  return counts;
}

at::Tensor Histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                 const c10::Scalar& max) {
  if (!IntegerInput(self)) return TERN_FALLBACK(histc, self, bins, min, max);
  return IntegerHistogram(self, bins, min, max).to(self.scalar_type());
}
TERN_ATEN_IMPL("histc", Histc);

at::Tensor& HistcOut(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                     const c10::Scalar& max, at::Tensor& out) {
  if (!IntegerInput(self)) return TERN_FALLBACK(histc_out, self, bins, min, max, out);
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: the out tensor's dtype (",
              out.scalar_type(), ") must be the input's (", self.scalar_type(), ")");
  const at::Tensor counts = IntegerHistogram(self, bins, min, max);
  at::native::resize_output(out, {bins});
  out.copy_(counts);
  return out;
}
TERN_ATEN_IMPL("histc.out", HistcOut);

}  // namespace
}  // namespace torch_tern::native
