// Native foreach and fused optimizer operators: one program per call over a
// whole list of tensors, instead of one launch per tensor.
//
// The _foreach_* ops that torch.optim's foreach implementations call (SGD,
// Adam/AdamW) run as one executable per list: per tensor the same
// instructions the single-tensor op would run, in the same order, with the
// per-call scalars (learning rates, bias corrections) as run-time arguments
// so that a new step reuses the program. _fused_adam_/_fused_adamw_
// (torch.optim.Adam/AdamW(fused=True)) compute the bias corrections from the
// step tensors on the device, without synchronizing. Lists that are not all
// float32 tern tensors of matching shapes take PyTorch's per-tensor path
// (whose single-tensor ops are native as well).
#include <ATen/ATen.h>
#include <ATen/ops/_foreach_add_native.h>
#include <ATen/ops/_foreach_addcdiv_native.h>
#include <ATen/ops/_foreach_addcmul_native.h>
#include <ATen/ops/_foreach_div_native.h>
#include <ATen/ops/_foreach_lerp_native.h>
#include <ATen/ops/_foreach_mul_native.h>
#include <ATen/ops/_foreach_sqrt_native.h>
#include <ATen/ops/_foreach_zero_native.h>
#include <torch/library.h>

#include <array>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

constexpr tern_dtype_t kF32 = TERN_DTYPE_F32;

// Operands of tensor i of a foreach program.
struct Item {
  Operand out;               // written (self for in-place ops)
  std::vector<Operand> in;   // self, then the other lists' tensors
  std::vector<Operand> tmp;  // scratch of the tensor's shape, shared across items
  std::vector<int64_t> shape;
};

// Builds and runs one program over lists[0][i], lists[1][i], ... for every
// i; `emit(p, i, item)` appends tensor i's instructions. `outs` (functional
// ops) receives new tensors; in-place ops write lists[0]. False when the
// lists are not float32 tern tensors of pairwise equal shapes (nothing ran).
template <typename Emit>
bool Foreach(const char* name, const std::vector<at::TensorList>& lists, bool in_place, int temps,
             std::vector<at::Tensor>* outs, Emit&& emit) {
  if (!program::ExecutablesAvailable() || lists.empty()) return false;
  const at::TensorList self = lists[0];
  int64_t max_numel = 1;
  for (size_t i = 0; i < self.size(); ++i) {
    for (const at::TensorList& list : lists) {
      if (list.size() != self.size()) return false;
      const at::Tensor& t = list[i];
      if (!IsTern(t) || t.scalar_type() != at::kFloat || t.sizes() != self[i].sizes() ||
          t.device() != self[0].device()) {
        return false;
      }
    }
    if (in_place) {
      std::vector<at::Tensor> others;
      for (size_t k = 1; k < lists.size(); ++k) others.push_back(lists[k][i]);
      if (!OutputOk(self[i], {})) return false;
      for (const at::Tensor& o : others) {
        if (!OutputOk(self[i], {o})) return false;
      }
    }
    max_numel = std::max<int64_t>(max_numel, self[i].numel());
  }
  if (self.empty()) return true;
  if (outs != nullptr) {
    outs->clear();
    for (const at::Tensor& t : self) outs->push_back(at::empty_like(t));
  }
  Program p(name);
  std::vector<Operand> scratch;
  for (int k = 0; k < temps; ++k) scratch.push_back(p.Temp(kF32, {max_numel}));
  for (size_t i = 0; i < self.size(); ++i) {
    if (self[i].numel() == 0) continue;
    Item item;
    item.shape = self[i].sizes().vec();
    item.out = in_place ? p.Out(self[i]) : p.Out((*outs)[i]);
    for (const at::TensorList& list : lists) item.in.push_back(p.In(list[i]));
    for (const Operand& s : scratch) {
      item.tmp.push_back(s.Slice(0, 0, self[i].numel()).View(item.shape));
    }
    emit(p, i, item);
  }
  return p.ok() && p.Run();
}

void Bin(Program& p, Operand out, Operand a, Operand b, tern_binary_fn_t fn) {
  p.Emit(TERN_OP_BINARY, {out, a, b}, {fn});
}

Operand ScalarF(Program& p, double v, const std::vector<int64_t>& shape) {
  return p.Arg(v, kF32).Expand(shape);
}

// The foreach ops below that are several steps per tensor (lerp, addcmul,
// addcdiv, add with alpha) run them as one ELEMENTWISE instruction
// (Program::EmitFused): one pass over the tensor instead of one per step, no
// scratch, the same bits (an AdamW step's lerp, addcmul and addcdiv were
// three passes each).
using program::BinaryStep;
constexpr int64_t kStep0 = program::kFirstStep;

bool IsOne(const at::Scalar& s) {
  return (s.isIntegral(false) && s.toLong() == 1) || (s.isFloatingPoint() && s.toDouble() == 1.0);
}

// ---- _foreach_add / mul / div ------------------------------------------------------------

// self + alpha * other
bool AddList(at::TensorList self, at::TensorList other, const at::Scalar& alpha,
             std::vector<at::Tensor>* outs) {
  if (alpha.isComplex()) return false;
  const double a = alpha.toDouble();
  return Foreach("aten::_foreach_add.List", {self, other}, outs == nullptr, 0, outs,
                 [&](Program& p, size_t, Item& it) {
                   if (IsOne(alpha)) {
                     Bin(p, it.out, it.in[0], it.in[1], TERN_BINARY_ADD);
                     return;
                   }
                   // self + other * alpha
                   p.EmitFused(
                       it.out, {it.in[0], it.in[1], ScalarF(p, a, it.shape)},
                       {BinaryStep(TERN_BINARY_MUL, 1, 2), BinaryStep(TERN_BINARY_ADD, 0, kStep0)});
                 });
}

void ForeachAddList_(at::TensorList self, at::TensorList other, const at::Scalar& alpha) {
  if (!AddList(self, other, alpha, nullptr)) {
    at::native::foreach_tensor_add_list_kernel_slow_(self, other, alpha);
  }
}
TERN_ATEN_IMPL("_foreach_add_.List", ForeachAddList_);

std::vector<at::Tensor> ForeachAddList(at::TensorList self, at::TensorList other,
                                       const at::Scalar& alpha) {
  std::vector<at::Tensor> outs;
  if (AddList(self, other, alpha, &outs)) return outs;
  return at::native::foreach_tensor_add_list_kernel_slow(self, other, alpha);
}
TERN_ATEN_IMPL("_foreach_add.List", ForeachAddList);

// self (op) scalar_i
bool ScalarOp(const char* name, tern_binary_fn_t fn, at::TensorList self,
              const std::vector<double>& scalars, std::vector<at::Tensor>* outs) {
  return Foreach(name, {self}, outs == nullptr, 0, outs, [&](Program& p, size_t i, Item& it) {
    Bin(p, it.out, it.in[0], ScalarF(p, scalars[scalars.size() == 1 ? 0 : i], it.shape), fn);
  });
}

std::vector<double> Doubles(at::ArrayRef<at::Scalar> scalars, bool* ok) {
  std::vector<double> v;
  for (const at::Scalar& s : scalars) {
    if (s.isComplex()) *ok = false;
    v.push_back(s.isComplex() ? 0.0 : s.toDouble());
  }
  return v;
}

// _foreach_<op>_.Scalar and _foreach_<op>.Scalar (in place and functional):
// self (op) s, or the slow per-tensor kernels (a complex s, or declined).
#define TERN_FOREACH_SCALAR(Name, op, fn)                                                   \
  void Foreach##Name##Scalar_(at::TensorList self, const at::Scalar& s) {                   \
    if (s.isComplex() ||                                                                    \
        !ScalarOp("aten::_foreach_" #op "_.Scalar", fn, self, {s.toDouble()}, nullptr)) {   \
      at::native::foreach_tensor_##op##_scalar_kernel_slow_(self, s);                       \
    }                                                                                       \
  }                                                                                         \
  std::vector<at::Tensor> Foreach##Name##Scalar(at::TensorList self, const at::Scalar& s) { \
    std::vector<at::Tensor> outs;                                                           \
    if (!s.isComplex() &&                                                                   \
        ScalarOp("aten::_foreach_" #op ".Scalar", fn, self, {s.toDouble()}, &outs)) {       \
      return outs;                                                                          \
    }                                                                                       \
    return at::native::foreach_tensor_##op##_scalar_kernel_slow(self, s);                   \
  }                                                                                         \
  TERN_ATEN_IMPL("_foreach_" #op "_.Scalar", Foreach##Name##Scalar_);                       \
  TERN_ATEN_IMPL("_foreach_" #op ".Scalar", Foreach##Name##Scalar);
TERN_FOREACH_SCALAR(Add, add, TERN_BINARY_ADD)
TERN_FOREACH_SCALAR(Mul, mul, TERN_BINARY_MUL)

void ForeachMulList_(at::TensorList self, at::TensorList other) {
  if (!Foreach("aten::_foreach_mul_.List", {self, other}, true, 0, nullptr,
               [&](Program& p, size_t, Item& it) {
                 Bin(p, it.out, it.in[0], it.in[1], TERN_BINARY_MUL);
               })) {
    at::native::foreach_tensor_mul_list_kernel_slow_(self, other);
  }
}
TERN_ATEN_IMPL("_foreach_mul_.List", ForeachMulList_);

void ForeachDivScalarList_(at::TensorList self, at::ArrayRef<at::Scalar> scalars) {
  bool ok = scalars.size() == self.size();
  const std::vector<double> v = Doubles(scalars, &ok);
  if (!ok || !ScalarOp("aten::_foreach_div_.ScalarList", TERN_BINARY_DIV, self, v, nullptr)) {
    at::native::foreach_tensor_div_scalarlist_kernel_slow_(self, scalars);
  }
}
TERN_ATEN_IMPL("_foreach_div_.ScalarList", ForeachDivScalarList_);

void ForeachDivScalar_(at::TensorList self, const at::Scalar& s) {
  if (s.isComplex() ||
      !ScalarOp("aten::_foreach_div_.Scalar", TERN_BINARY_DIV, self, {s.toDouble()}, nullptr)) {
    at::native::foreach_tensor_div_scalar_kernel_slow_(self, s);
  }
}
TERN_ATEN_IMPL("_foreach_div_.Scalar", ForeachDivScalar_);

// ---- lerp, addcmul, addcdiv, sqrt, zero ------------------------------------------------

// The CPU's lerp: w < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w).
void ForeachLerpScalar_(at::TensorList self, at::TensorList end, const at::Scalar& weight) {
  const double w = weight.isComplex() ? 0.0 : weight.toDouble();
  if (weight.isComplex() ||
      !Foreach("aten::_foreach_lerp_.Scalar", {self, end}, true, 0, nullptr,
               [&](Program& p, size_t, Item& it) {
                 // d = end - self; self + d * w, or end - d * (1 - w)
                 const bool low = std::abs(w) < 0.5;
                 p.EmitFused(
                     it.out, {it.in[0], it.in[1], ScalarF(p, low ? w : 1.0 - w, it.shape)},
                     {BinaryStep(TERN_BINARY_SUB, 1, 0), BinaryStep(TERN_BINARY_MUL, kStep0, 2),
                      low ? BinaryStep(TERN_BINARY_ADD, 0, kStep0 + 1)
                          : BinaryStep(TERN_BINARY_SUB, 1, kStep0 + 1)});
               })) {
    at::native::foreach_tensor_lerp_list_kernel_slow_(self, end, weight);
  }
}
TERN_ATEN_IMPL("_foreach_lerp_.Scalar", ForeachLerpScalar_);

// self + (value_i * t1) (op) t2
bool Addc(const char* name, tern_binary_fn_t op, at::TensorList self, at::TensorList t1,
          at::TensorList t2, const std::vector<double>& values) {
  return Foreach(name, {self, t1, t2}, true, 0, nullptr, [&](Program& p, size_t i, Item& it) {
    // self + (t1 * value) op t2
    p.EmitFused(
        it.out,
        {it.in[0], it.in[1], it.in[2], ScalarF(p, values[values.size() == 1 ? 0 : i], it.shape)},
        {BinaryStep(TERN_BINARY_MUL, 1, 3), BinaryStep(op, kStep0, 2),
         BinaryStep(TERN_BINARY_ADD, 0, kStep0 + 1)});
  });
}

// Addc with one value per tensor; false if their count differs or one is
// complex (the caller then takes the slow kernel).
bool AddcScalarList(const char* name, tern_binary_fn_t op, at::TensorList self, at::TensorList t1,
                    at::TensorList t2, at::ArrayRef<at::Scalar> scalars) {
  bool ok = scalars.size() == self.size();
  const std::vector<double> v = Doubles(scalars, &ok);
  return ok && Addc(name, op, self, t1, t2, v);
}

void ForeachAddcmulScalar_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                           const at::Scalar& value) {
  if (value.isComplex() ||
      !Addc("aten::_foreach_addcmul_.Scalar", TERN_BINARY_MUL, self, t1, t2, {value.toDouble()})) {
    at::native::foreach_tensor_addcmul_scalar_slow_(self, t1, t2, value);
  }
}
TERN_ATEN_IMPL("_foreach_addcmul_.Scalar", ForeachAddcmulScalar_);

void ForeachAddcdivScalar_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                           const at::Scalar& value) {
  if (value.isComplex() ||
      !Addc("aten::_foreach_addcdiv_.Scalar", TERN_BINARY_DIV, self, t1, t2, {value.toDouble()})) {
    at::native::foreach_tensor_addcdiv_scalar_slow_(self, t1, t2, value);
  }
}
TERN_ATEN_IMPL("_foreach_addcdiv_.Scalar", ForeachAddcdivScalar_);

void ForeachAddcdivScalarList_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                               at::ArrayRef<at::Scalar> scalars) {
  if (!AddcScalarList("aten::_foreach_addcdiv_.ScalarList", TERN_BINARY_DIV, self, t1, t2,
                      scalars)) {
    at::native::foreach_tensor_addcdiv_scalarlist_slow_(self, t1, t2, scalars);
  }
}
TERN_ATEN_IMPL("_foreach_addcdiv_.ScalarList", ForeachAddcdivScalarList_);

void ForeachAddcmulScalarList_(at::TensorList self, at::TensorList t1, at::TensorList t2,
                               at::ArrayRef<at::Scalar> scalars) {
  if (!AddcScalarList("aten::_foreach_addcmul_.ScalarList", TERN_BINARY_MUL, self, t1, t2,
                      scalars)) {
    at::native::foreach_tensor_addcmul_scalarlist_slow_(self, t1, t2, scalars);
  }
}
TERN_ATEN_IMPL("_foreach_addcmul_.ScalarList", ForeachAddcmulScalarList_);

bool Sqrt(at::TensorList self, std::vector<at::Tensor>* outs) {
  return Foreach("aten::_foreach_sqrt", {self}, outs == nullptr, 0, outs,
                 [&](Program& p, size_t, Item& it) {
                   p.Emit(TERN_OP_UNARY, {it.out, it.in[0]}, {TERN_UNARY_SQRT});
                 });
}

std::vector<at::Tensor> ForeachSqrt(at::TensorList self) {
  std::vector<at::Tensor> outs;
  if (Sqrt(self, &outs)) return outs;
  return at::native::foreach_tensor_sqrt_slow(self);
}
TERN_ATEN_IMPL("_foreach_sqrt", ForeachSqrt);

void ForeachSqrt_(at::TensorList self) {
  if (!Sqrt(self, nullptr)) at::native::foreach_tensor_sqrt_slow_(self);
}
TERN_ATEN_IMPL("_foreach_sqrt_", ForeachSqrt_);

void ForeachZero_(at::TensorList self) {
  if (!Foreach("aten::_foreach_zero_", {self}, true, 0, nullptr,
               [&](Program& p, size_t, Item& it) { p.Emit(TERN_OP_FILL, {it.out}, {}, {0.0}); })) {
    at::native::foreach_tensor_zero_slow_(self);
  }
}
TERN_ATEN_IMPL("_foreach_zero_", ForeachZero_);

// ---- _fused_adam_ / _fused_adamw_ ---------------------------------------------------------
// The CPU's fused Adam, per element in f32, with the bias corrections of
// each parameter computed on the device from its step tensor:
//   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step, step_size = lr / bc1
//   grad = maximize ? -grad : grad
//   AdamW: param -= lr * weight_decay * param;  Adam: grad += weight_decay * param
//   exp_avg = lerp(exp_avg, grad, 1 - beta1)
//   exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
//   denom = sqrt(amsgrad ? max_exp_avg_sq := max(max_exp_avg_sq, exp_avg_sq) : exp_avg_sq)
//           / sqrt(bc2) + eps
//   param -= step_size * exp_avg / denom
bool FusedAdam(const char* name, bool adamw, at::TensorList params, at::TensorList grads,
               at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
               at::TensorList state_steps, double lr, double beta1, double beta2,
               double weight_decay, double eps, bool amsgrad, bool maximize,
               const std::optional<at::Tensor>& grad_scale,
               const std::optional<at::Tensor>& found_inf) {
  if ((grad_scale.has_value() && grad_scale->defined()) ||
      (found_inf.has_value() && found_inf->defined())) {
    return false;
  }
  const size_t n = params.size();
  if (state_steps.size() != n) return false;
  for (const at::Tensor& s : state_steps) {
    if (!IsTern(s) || s.scalar_type() != at::kFloat || s.numel() != 1) return false;
  }
  std::vector<at::TensorList> lists = {params, grads, exp_avgs, exp_avg_sqs};
  if (amsgrad) lists.push_back(max_exp_avg_sqs);
  Program* program = nullptr;
  std::vector<Operand> steps;
  const double w1 = 1.0 - beta1;
  return Foreach(name, lists, true, 3, nullptr, [&](Program& p, size_t i, Item& it) {
    if (program != &p) {
      program = &p;
      for (const at::Tensor& s : state_steps) steps.push_back(p.In(s).View({}));
    }
    const std::vector<int64_t>& sh = it.shape;
    const Operand P = it.out, G = it.in[1], M = it.in[2], V = it.in[3];
    const Operand Mo = p.Out(exp_avgs[i]), Vo = p.Out(exp_avg_sqs[i]);
    Operand T0 = it.tmp[0], T1 = it.tmp[1], T2 = it.tmp[2];
    // Scalars of this parameter.
    Operand pw1 = p.Temp(kF32, {}), bc1 = p.Temp(kF32, {}), pw2 = p.Temp(kF32, {});
    Operand bc2 = p.Temp(kF32, {}), bc2s = p.Temp(kF32, {}), step_size = p.Temp(kF32, {});
    Bin(p, pw1, p.Arg(beta1, kF32), steps[i], TERN_BINARY_POW);
    p.Emit(TERN_OP_UNARY, {bc1, pw1}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
    Bin(p, pw2, p.Arg(beta2, kF32), steps[i], TERN_BINARY_POW);
    p.Emit(TERN_OP_UNARY, {bc2, pw2}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
    p.Emit(TERN_OP_UNARY, {bc2s, bc2}, {TERN_UNARY_SQRT});
    Bin(p, step_size, p.Arg(lr, kF32), bc1, TERN_BINARY_DIV);
    Operand g = G;
    if (maximize) {
      p.Emit(TERN_OP_UNARY, {T0, G}, {TERN_UNARY_NEG});
      g = T0;
    }
    if (weight_decay != 0) {
      if (adamw) {
        Bin(p, T1, P, ScalarF(p, lr * weight_decay, sh), TERN_BINARY_MUL);
        Bin(p, P, P, T1, TERN_BINARY_SUB);
      } else {
        Bin(p, T1, P, ScalarF(p, weight_decay, sh), TERN_BINARY_MUL);
        Bin(p, T0, g, T1, TERN_BINARY_ADD);
        g = T0;
      }
    }
    // exp_avg = lerp(exp_avg, grad, 1 - beta1)
    Bin(p, T1, g, M, TERN_BINARY_SUB);
    if (std::abs(w1) < 0.5) {
      Bin(p, T1, T1, ScalarF(p, w1, sh), TERN_BINARY_MUL);
      Bin(p, Mo, M, T1, TERN_BINARY_ADD);
    } else {
      Bin(p, T1, T1, ScalarF(p, 1.0 - w1, sh), TERN_BINARY_MUL);
      Bin(p, Mo, g, T1, TERN_BINARY_SUB);
    }
    // exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
    Bin(p, T1, g, ScalarF(p, 1.0 - beta2, sh), TERN_BINARY_MUL);
    Bin(p, T1, T1, g, TERN_BINARY_MUL);
    Bin(p, T2, V, ScalarF(p, beta2, sh), TERN_BINARY_MUL);
    Bin(p, Vo, T2, T1, TERN_BINARY_ADD);
    Operand second = Vo;
    if (amsgrad) {
      const Operand Xo = p.Out(max_exp_avg_sqs[i]);
      Bin(p, Xo, it.in[4], Vo, TERN_BINARY_MAX);
      second = Xo;
    }
    // denom = sqrt(second) / sqrt(bc2) + eps
    p.Emit(TERN_OP_UNARY, {T1, second}, {TERN_UNARY_SQRT});
    Bin(p, T1, T1, bc2s.Expand(sh), TERN_BINARY_DIV);
    Bin(p, T1, T1, ScalarF(p, eps, sh), TERN_BINARY_ADD);
    // param -= step_size * exp_avg / denom
    Bin(p, T2, Mo, step_size.Expand(sh), TERN_BINARY_MUL);
    Bin(p, T2, T2, T1, TERN_BINARY_DIV);
    Bin(p, P, P, T2, TERN_BINARY_SUB);
  });
}

#define TERN_FUSED_ADAM(fname, aten_op, adamw)                                                     \
  void fname(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,                 \
             at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,                           \
             at::TensorList state_steps, double lr, double beta1, double beta2,                    \
             double weight_decay, double eps, bool amsgrad, bool maximize,                         \
             const std::optional<at::Tensor>& grad_scale,                                          \
             const std::optional<at::Tensor>& found_inf) {                                         \
    if (FusedAdam("aten::" #aten_op, adamw, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, \
                  state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, \
                  found_inf)) {                                                                    \
      return;                                                                                      \
    }                                                                                              \
    TERN_FALLBACK(aten_op, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, \
                  beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf);      \
  }                                                                                                \
  TERN_ATEN_IMPL(#aten_op, fname);
TERN_FUSED_ADAM(FusedAdamw_, _fused_adamw_, true)
TERN_FUSED_ADAM(FusedAdam_, _fused_adam_, false)

}  // namespace

}  // namespace torch_tern::native
