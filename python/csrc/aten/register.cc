// Everything the plugin registers with the dispatcher, by dispatch key, in
// one place. The native operators are listed per family (register.h), at the
// end of each family's file; everything else is here.
#include "aten/register.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "aten/fallback.h"

namespace torch_tern {
namespace {

// Native operators on tern.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  native::RegisterMinimalOps(m);      // allocation, views, copies, resize_, set_, fills
  native::RegisterElementwiseOps(m);  // arithmetic, activations, where, clamps, losses
  native::RegisterReduceOps(m);       // reductions, var/std, softmax, norms
  native::RegisterMatmulOps(m);       // matrix products, convolutions
  native::RegisterIndexOps(m);        // index/gather/scatter, cat, tril/triu, arange
  native::RegisterPoolOps(m);         // max pooling
  native::RegisterRandomOps(m);       // random ops on the tern generator
  native::RegisterForeachOps(m);      // the optimizers' _foreach_* and _fused_adam(w)_
}

// Every other operator: the logged CPU fallback (fallback.cc).
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&CpuFallback>());
}

// rms_norm as one native op in forward and backward (reduce.cc).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { native::RegisterReduceAutogradOps(m); }

// _copy_from handles conjugate and negative bits itself (copy.cc). Without
// these fallthroughs the Conjugate/Negative fallbacks would materialize the
// source with clone(), whose copy_ calls _copy_from again, forever.
void RegisterCopyFallthroughs(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { RegisterCopyFallthroughs(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { RegisterCopyFallthroughs(m); }

// Autocast: the policy lists torch shares between backends, bound to the
// AutocastPrivateUse1 key. Ops in the lower-precision list run in the
// autocast dtype (bfloat16 by default on tern, see torch_tern/__init__.py),
// the fp32 list runs in float32, the promote list in the widest input type.
// The casts happen above the backend, so this holds for ops that take the
// CPU fallback too.
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
