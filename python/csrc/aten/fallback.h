// The CPU fallback for every operator without a native tern kernel, and the
// log of which operators took it.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <map>
#include <string>

namespace torch_tern {

// The boxed CPU fallback: counts the operator, honours TORCH_TERN_FALLBACK,
// runs it on the CPU. Native kernels that decline call it (native.h).
void CpuFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Every operator on a sparse tern tensor (any sparse layout): a NotImplementedError that says
// tern tensors are strided only and what to do instead.
void SparseRefusal(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Operator name ("aten::add.Tensor") -> times it ran through the fallback.
std::map<std::string, int64_t> FallbackOps();
void ClearFallbackOps();

}  // namespace torch_tern
