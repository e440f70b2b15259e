// Autocast on tern: the policy lists torch shares between backends, bound to
// the AutocastPrivateUse1 key. Ops in the lower-precision list run in the
// autocast dtype (bfloat16 by default on tern, see torch_tern/__init__.py),
// the fp32 list runs in float32, the promote list in the widest input type.
// The casts happen above the backend, so this holds for ops that take the
// CPU fallback too.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torch_tern {
namespace {

using at::Tensor;
using at::autocast::CastPolicy;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#define TERN_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TERN_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TERN_AUTOCAST_FP32_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TERN_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TERN_AUTOCAST_LOWER)
  AT_FORALL_FP32(TERN_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TERN_AUTOCAST_FP32_OPT_DTYPE)
  AT_FORALL_PROMOTE(TERN_AUTOCAST_PROMOTE)
}

}  // namespace
}  // namespace torch_tern
