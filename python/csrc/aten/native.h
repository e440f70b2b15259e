// Shared helpers of the native operators (elementwise.cc, reduce.cc, ...):
// how an ATen argument becomes a program operand, dtype rules, output
// checks, and the CPU fallback an operator takes when it declines.
//
// Every native operator follows one pattern: check what it supports, build a
// program::Program, Run() it, and if anything says no (a dtype tern lacks, an
// aliasing it cannot express, the builder refusing the shape) call the CPU
// fallback with the same arguments, which logs the operator like any other
// fallback. Results match the CPU's (same formulas, same order of
// operations where it matters, f32 opmath for bf16/f16).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

#include "aten/fallback.h"
#include "aten/program.h"

namespace torch_tern::native {

using program::ElementwiseScalar;
using program::Operand;
using program::Program;
using program::RunElementwise;

// Runs ATen operator `op` (e.g. add_out) through the logged CPU fallback.
#define TERN_FALLBACK(op, ...) \
  ::at::native::call_fallback_fn<&::torch_tern::CpuFallback, ATEN_OP(op)>::call(__VA_ARGS__)
#define TERN_FALLBACK2(op, overload, ...)                                                   \
  ::at::native::call_fallback_fn<&::torch_tern::CpuFallback, ATEN_OP2(op, overload)>::call( \
      __VA_ARGS__)

inline bool IsTern(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}
// Whether `t` is being traced rather than computed: a tensor with a Python
// subclass's dispatch (FakeTensor, FunctionalTensor, a tracer's proxy), a C++
// functional wrapper, or any tensor while a Python dispatch mode is active
// (FakeTensorMode, make_fx). Such a tensor has no data a kernel may read, and
// a tracer records only operators that go through the dispatcher. Kernels
// above the backend key (autograd) see these tensors; a native override of an
// op that ATen implements as a composite runs ATen's composite for them, so
// Dynamo and AOTAutograd trace (and fake tensors compute) ATen's
// decomposition. Kernels at the PrivateUse1 key never see them: the Python
// and Functionalize keys sit above it and hand fake tensors to meta kernels.
inline bool Traced(const at::Tensor& t) {
  constexpr c10::DispatchKeySet kTracing(
      {c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  return (t.defined() && t.key_set().has_any(kTracing)) ||
         c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::Python);
}
inline bool Traced(const std::optional<at::Tensor>& t) { return t.has_value() && Traced(*t); }
// A 0-dim CPU tensor (Python scalars arrive as such "wrapped numbers").
inline bool IsCpuScalar(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.dim() == 0;
}
inline std::optional<tern_dtype_t> TD(at::ScalarType t) { return program::ToTernDtype(t); }
inline bool Supported(at::ScalarType t) { return TD(t).has_value(); }
inline bool IsReducedFloat(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// The dtype computations run in for `t`: f32 for bf16/f16 (PyTorch's opmath).
inline at::ScalarType OpMath(at::ScalarType t) { return IsReducedFloat(t) ? at::kFloat : t; }

// An operand holding `t` as `dtype` with shape `shape` (broadcast): a CPU
// scalar becomes a run-time argument (or a constant when `constant`), a tern
// tensor of another dtype is cast into scratch first.
Operand Input(Program& p, const at::Tensor& t, at::ScalarType dtype, c10::IntArrayRef shape,
              bool constant = false);
// A scalar as a run-time argument of `dtype`.
Operand ScalarArg(Program& p, const c10::Scalar& s, at::ScalarType dtype);
Operand ScalarConst(Program& p, const c10::Scalar& s, at::ScalarType dtype);

// Where an instruction producing `dtype` should write `out`: out itself when
// the dtypes agree, else a scratch temporary that Finish() casts into out.
struct Target {
  Operand write;  // write the result here
  Operand out;
  bool cast = false;
};
Target BeginOut(Program& p, const at::Tensor& out, at::ScalarType dtype);
Target BeginOut(Program& p, const at::Tensor& out, at::ScalarType dtype, c10::IntArrayRef shape,
                const Operand& out_view);
void Finish(Program& p, const Target& t);

// `out` can be written natively: on tern, a supported dtype, no internal
// overlap, and every input either disjoint from it or the very same elements
// (an in-place op).
bool OutputOk(const at::Tensor& out, std::initializer_list<at::Tensor> inputs);
// Resizes `out` (an out= argument) to `shape` as ATen does.
void ResizeOut(const at::Tensor& out, c10::IntArrayRef shape);
// The common dtype of the inputs, as PyTorch's type promotion decides it.
at::ScalarType ResultType(const at::Tensor& a, const at::Tensor& b);
// Normalises reduction dims (none: all), sorted and unique; empty for rank 0.
std::vector<int64_t> ReduceDims(const at::Tensor& self, at::OptionalIntArrayRef dims);
// The reduced shape keeping (or dropping) the reduced dims.
std::vector<int64_t> ReducedShape(c10::IntArrayRef sizes, const std::vector<int64_t>& dims,
                                  bool keepdim);
// `out` (of the reduced shape, keepdim or not) as an operand of keepdim shape.
Operand KeepdimView(Program& p, const Operand& out, const std::vector<int64_t>& dims, bool keepdim);

}  // namespace torch_tern::native
