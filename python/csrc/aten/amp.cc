// The two operators of torch.amp.GradScaler's step: unscaling gradients while
// looking for infs and NaNs, and updating the scale. The CPU has kernels for
// both, but through the fallback every optimizer step copied every gradient
// to the host and back. Here both are tern operators and nothing leaves the
// device or waits for it (no .item(): the decisions are `where`s), with the
// semantics of CUDA's kernels.
#include <ATen/ATen.h>

#include <vector>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// found_inf (one float) becomes 1 when any tensor holds a non-finite value;
// every tensor is multiplied by inv_scale (one float) in place.
void NonFiniteCheckAndUnscale(at::TensorList tensors, at::Tensor& found_inf,
                              const at::Tensor& inv_scale) {
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat,
              "_amp_foreach_non_finite_check_and_unscale_: found_inf must be one float, got ",
              found_inf.numel(), " elements of ", found_inf.scalar_type());
  TORCH_CHECK(inv_scale.numel() == 1 && inv_scale.scalar_type() == at::kFloat,
              "_amp_foreach_non_finite_check_and_unscale_: inv_scale must be one float, got ",
              inv_scale.numel(), " elements of ", inv_scale.scalar_type());
  if (tensors.empty()) return;
  std::vector<at::Tensor> flags;
  flags.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device() == found_inf.device(),
                "_amp_foreach_non_finite_check_and_unscale_: every tensor must be on ",
                found_inf.device(), ", found one on ", t.device());
    if (t.numel() == 0) continue;
    flags.push_back(t.isfinite().logical_not().any().reshape({1}));
  }
  if (!flags.empty()) {
    const at::Tensor any_non_finite =
        at::cat(flags).any().to(at::kFloat).reshape(found_inf.sizes());
    found_inf.copy_(at::maximum(found_inf, any_non_finite));
  }
  const at::Tensor scale = inv_scale.reshape({});
  for (const at::Tensor& t : tensors) {
    if (t.numel() > 0) const_cast<at::Tensor&>(t).mul_(scale);
  }
}
TERN_ATEN_IMPL("_amp_foreach_non_finite_check_and_unscale_", NonFiniteCheckAndUnscale);

// After a step with non-finite gradients the scale backs off and the tracker
// restarts; after growth_interval good steps in a row it grows (unless that
// would overflow float32) and the tracker restarts.
at::Tensor& UpdateScale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                        double growth_factor, double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat,
              "_amp_update_scale_: the scale must be one float");
  TORCH_CHECK(growth_tracker.numel() == 1 && growth_tracker.scalar_type() == at::kInt,
              "_amp_update_scale_: growth_tracker must be one int32");
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.scalar_type() == at::kFloat,
              "_amp_update_scale_: found_inf must be one float");
  const at::Tensor found = found_inf.reshape(scale.sizes()).gt(0);
  const at::Tensor successful = growth_tracker + 1;
  const at::Tensor grown = scale * growth_factor;
  const at::Tensor grow =
      found.logical_not().logical_and(successful.eq(growth_interval)).logical_and(grown.isfinite());
  const at::Tensor restart = found.logical_or(successful.eq(growth_interval));
  const at::Tensor new_scale =
      at::where(found, scale * backoff_factor, at::where(grow, grown, scale));
  const at::Tensor new_tracker = at::where(restart, at::zeros_like(successful), successful);
  scale.copy_(new_scale);
  growth_tracker.copy_(new_tracker);
  return scale;
}
TERN_ATEN_IMPL("_amp_update_scale_", UpdateScale);

}  // namespace
}  // namespace torch_tern::native
