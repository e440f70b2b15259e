// Native elementwise operators: arithmetic with broadcasting and scalars,
// comparisons, where, activations and their backward functions, clamps,
// lerp/addcmul/addcdiv (the optimizers' foreach ops reach these per tensor),
// mse_loss and dropout's backward.
//
// Most ATen functional and in-place variants of these ops are generated on
// top of their `.out` kernel (structured kernels), so registering `.out`
// covers all three; the others are registered one by one.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ScalarOps.h>
#include <torch/library.h>

#include <cmath>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

enum class Kind {
  kArith,    // computes and writes the common dtype
  kFloat,    // integers promote to the default float dtype (true division, atan2)
  kCompare,  // writes bool
};

at::Tensor Wrap(const c10::Scalar& s) {
  at::Tensor t = c10::scalar_to_tensor(s);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

bool Operable(const at::Tensor& t) { return IsTern(t) || IsCpuScalar(t); }

// The value of a CPU scalar of a real dtype, read where it lies (Python
// numbers arrive as float64, int64 or bool scalars); false for anything else.
// What the general path's t.item().toDouble() gives, without a dispatch.
bool CpuScalarValue(const at::Tensor& t, double* value) {
  if (!IsCpuScalar(t) || t.is_conj() || t.is_neg()) return false;
  switch (t.scalar_type()) {
    case at::kDouble:
      *value = *t.const_data_ptr<double>();
      return true;
    case at::kFloat:
      *value = *t.const_data_ptr<float>();
      return true;
    case at::kLong:
      *value = static_cast<double>(*t.const_data_ptr<int64_t>());
      return true;
    case at::kBool:
      *value = *t.const_data_ptr<bool>() ? 1.0 : 0.0;
      return true;
    default:
      return false;
  }
}

// The dtype the instruction computes in: bf16/f16 with a CPU scalar (or an
// alpha) computes in f32, as PyTorch's opmath does (the scalar is not rounded).
at::ScalarType ComputeDtype(at::ScalarType common, bool scalar_involved) {
  return scalar_involved && IsReducedFloat(common) ? at::kFloat : common;
}

bool BinaryF64(const char* name, tern_binary_fn_t fn, Kind kind, const at::Tensor& a,
               const at::Tensor& b, const at::Tensor& out, const c10::Scalar& alpha);

// alpha == 1: no scaling.
bool IsOne(const c10::Scalar& alpha) {
  return (alpha.isIntegral(false) && alpha.toLong() == 1) ||
         (alpha.isFloatingPoint() && alpha.toDouble() == 1.0);
}

// out = fn(a, alpha * b), broadcasting.
bool Binary(const char* name, tern_binary_fn_t fn, Kind kind, const at::Tensor& a,
            const at::Tensor& b, const at::Tensor& out, const c10::Scalar& alpha = c10::Scalar(1)) {
  // A float64 tern tensor (not a Python number, which arrives as a wrapped
  // float64 CPU scalar).
  if ((IsTern(a) && a.scalar_type() == at::kDouble) ||
      (IsTern(b) && b.scalar_type() == at::kDouble)) {
    return BinaryF64(name, fn, kind, a, b, out, alpha);
  }
  if (!Operable(a) || !Operable(b) || (!IsTern(a) && !IsTern(b)) || !IsTern(out)) return false;
  // The commonest call (same shapes and dtype, contiguous: RunElementwise
  // checks the rest) skips the type promotion, broadcasting and Program below.
  // Not bool (its + and * become or and and) nor comparisons (they write bool).
  const at::ScalarType out_type = out.scalar_type();
  if (kind != Kind::kCompare && out_type != at::kBool && IsTern(a) && IsTern(b) &&
      a.scalar_type() == out_type && b.scalar_type() == out_type && IsOne(alpha) &&
      (kind == Kind::kArith || at::isFloatingType(out_type)) && Supported(out_type) &&
      RunElementwise(name, TERN_OP_BINARY, fn, out, {a, b})) {
    return true;
  }
  // The next commonest, in float32 with the value passed at run time: a
  // tensor and a Python number (`x * 0.5`, an optimizer's `p.mul_(beta)`), and
  // two tensors with an alpha (`p.add_(buf, alpha=-lr)`).
  if (kind != Kind::kCompare && out_type == at::kFloat && IsTern(a) &&
      a.scalar_type() == at::kFloat) {
    double value = 0.0;
    if (IsOne(alpha) && CpuScalarValue(b, &value) &&
        // (two 0-dim operands promote by dtype alone: f32 and f64 give f64)
        (a.dim() > 0 || b.unsafeGetTensorImpl()->is_wrapped_number()) &&
        RunElementwise(name, TERN_OP_BINARY, fn, out, {a}, ElementwiseScalar::kLastOperand,
                       value)) {
      return true;
    }
    if (!IsOne(alpha) && (alpha.isFloatingPoint() || alpha.isIntegral(false)) && IsTern(b) &&
        b.scalar_type() == at::kFloat &&
        RunElementwise(name, TERN_OP_BINARY, fn, out, {a, b}, ElementwiseScalar::kScalesLastInput,
                       alpha.toDouble())) {
      return true;
    }
  }
  at::ScalarType common = ResultType(a, b);
  if (kind == Kind::kFloat && at::isIntegralType(common, /*includeBool=*/true)) {
    common = c10::typeMetaToScalarType(c10::get_default_dtype());
  }
  // An output that cannot hold the result (true division into an integer
  // out=): the fallback raises PyTorch's own error.
  if (kind != Kind::kCompare && !c10::canCast(common, out.scalar_type())) return false;
  const std::vector<int64_t> shape = at::infer_size(a.sizes(), b.sizes());
  ResizeOut(out, shape);
  if (!OutputOk(out, {a, b})) return false;
  const bool has_alpha = !IsOne(alpha);
  const at::ScalarType cd = ComputeDtype(common, IsCpuScalar(a) || IsCpuScalar(b) || has_alpha);
  Program p(name);
  Operand A = Input(p, a, cd, shape);
  Operand B = Input(p, b, cd, shape);
  if (!p.ok()) return false;
  if (has_alpha) {
    Operand scaled = p.Temp(*TD(cd), shape);
    p.Emit(TERN_OP_BINARY, {scaled, B, ScalarArg(p, alpha, cd).Expand(shape)}, {TERN_BINARY_MUL});
    B = scaled;
  }
  if (cd == at::kBool) {
    // bool arithmetic is logical: a * b is and, a + b is or (as on the CPU).
    if (has_alpha) return false;
    if (fn == TERN_BINARY_MUL) fn = TERN_BINARY_LOGICAL_AND;
    if (fn == TERN_BINARY_ADD) fn = TERN_BINARY_LOGICAL_OR;
  }
  const Target t = BeginOut(p, out, kind == Kind::kCompare ? at::kBool : cd);
  p.Emit(TERN_OP_BINARY, {t.write, A, B}, {fn});
  Finish(p, t);
  return p.Run();
}

// out = fn(self) (floats: the function's parameters).
bool Unary(const char* name, tern_unary_fn_t fn, const at::Tensor& self, const at::Tensor& out,
           std::vector<double> floats = {}, bool bool_out = false) {
  if (!IsTern(self) || !IsTern(out)) return false;
  // The commonest call (see Binary).
  if (floats.empty() && !bool_out && self.scalar_type() == out.scalar_type() &&
      Supported(out.scalar_type()) && RunElementwise(name, TERN_OP_UNARY, fn, out, {self})) {
    return true;
  }
  ResizeOut(out, self.sizes());
  if (!OutputOk(out, {self})) return false;
  const at::ScalarType cd = bool_out ? self.scalar_type() : out.scalar_type();
  Program p(name);
  Operand A = Input(p, self, cd, self.sizes());
  if (!p.ok()) return false;
  const Target t = BeginOut(p, out, bool_out ? at::kBool : cd);
  p.Emit(TERN_OP_UNARY, {t.write, A}, {fn}, std::move(floats));
  Finish(p, t);
  return p.Run();
}

// float64 tensors, where the ISA's f64 functions cover the op (docs/isa.md):
// a mixed-precision loop's float64 bookkeeping (GradScaler takes the
// reciprocal of its scale in float64) stays on the device instead of taking
// the CPU fallback. The ISA's validation decides which functions: a refused
// program is cached as refused and the op falls back. BinaryF64 also checks
// its function against a copy of CheckF64's binary list first (common/ is
// below the plugin's layer and libtern has no query for it), so that a
// float64 op with a Python number does not build a refused program per
// shape; if the two lists drift apart, either side only falls back.
bool OutputOkF64(const at::Tensor& out, std::initializer_list<at::Tensor> inputs) {
  if (out.numel() > 1 && at::has_internal_overlap(out) != at::MemOverlap::No) return false;
  for (const at::Tensor& t : inputs) {
    if (!t.storage().is_alias_of(out.storage())) continue;
    // In place is fine; any other overlap is not.
    if (t.data_ptr() != out.data_ptr() || t.strides() != out.strides()) return false;
  }
  return true;
}

bool UnaryF64(const char* name, tern_unary_fn_t fn, const at::Tensor& self, const at::Tensor& out) {
  if (!IsTern(self) || !IsTern(out) || self.scalar_type() != at::kDouble ||
      out.scalar_type() != at::kDouble) {
    return false;
  }
  ResizeOut(out, self.sizes());
  if (!OutputOkF64(out, {self})) return false;
  Program p(name);
  p.AllowF64();
  const Operand o = p.Out(out);
  p.Emit(TERN_OP_UNARY, {o, p.In(self)}, {fn});
  return p.ok() && p.Run();
}

bool BinaryF64(const char* name, tern_binary_fn_t fn, Kind kind, const at::Tensor& a,
               const at::Tensor& b, const at::Tensor& out, const c10::Scalar& alpha) {
  const at::ScalarType want_out = kind == Kind::kCompare ? at::kBool : at::kDouble;
  // The ISA's f64 binary functions (docs/isa.md; a copy of the list in
  // common/isa_rules.cc CheckF64, see above); others decline at once.
  switch (fn) {
    case TERN_BINARY_ADD:
    case TERN_BINARY_SUB:
    case TERN_BINARY_MUL:
    case TERN_BINARY_DIV:
    case TERN_BINARY_MAX:
    case TERN_BINARY_MIN:
    case TERN_BINARY_EQ:
    case TERN_BINARY_NE:
    case TERN_BINARY_LT:
    case TERN_BINARY_LE:
    case TERN_BINARY_GT:
    case TERN_BINARY_GE:
      break;
    default:
      return false;
  }
  // A Python number (a wrapped CPU scalar: `x * 0.5` of a float64 x) is a
  // run-time argument in float64, so each value does not build a program.
  auto operable = [](const at::Tensor& t) {
    return (IsTern(t) && t.scalar_type() == at::kDouble) ||
           (IsCpuScalar(t) &&
            (t.is_floating_point() || t.scalar_type() == at::kLong || t.scalar_type() == at::kInt));
  };
  if (!operable(a) || !operable(b) || !IsTern(out) || out.scalar_type() != want_out ||
      !(alpha.isIntegral(false) ? alpha.toLong() == 1 : alpha.toDouble() == 1.0)) {
    return false;
  }
  const std::vector<int64_t> shape = at::infer_size(a.sizes(), b.sizes());
  ResizeOut(out, shape);
  if (!OutputOkF64(out, {a, b})) return false;
  Program p(name);
  p.AllowF64();
  const Operand o = p.Out(out);
  auto input = [&p](const at::Tensor& t) {
    return IsCpuScalar(t) ? p.Arg(t.item().toDouble(), TERN_DTYPE_F64) : p.In(t);
  };
  const Operand A = input(a), B = input(b);
  if (!p.ok()) return false;
  p.Emit(TERN_OP_BINARY, {o, A.Expand(shape), B.Expand(shape)}, {fn});
  return p.Run();
}

// grad_input = grad_output * f'(self).
bool UnaryBackward(const char* name, tern_unary_fn_t fn, const at::Tensor& grad_output,
                   const at::Tensor& self, const at::Tensor& grad_input,
                   std::vector<double> floats = {}) {
  if (!IsTern(grad_output) || !IsTern(self) || !IsTern(grad_input)) return false;
  const std::vector<int64_t> shape = at::infer_size(grad_output.sizes(), self.sizes());
  ResizeOut(grad_input, shape);
  if (!OutputOk(grad_input, {grad_output, self})) return false;
  const at::ScalarType cd = grad_input.scalar_type();
  Program p(name);
  Operand G = Input(p, grad_output, cd, shape);
  Operand X = Input(p, self, cd, shape);
  if (!p.ok()) return false;
  p.Emit(TERN_OP_UNARY_BACKWARD, {p.Out(grad_input), G, X}, {fn}, std::move(floats));
  return p.Run();
}

// at::<op>_<overload>, registered for aten::<op>.<overload>.
#define TERN_BINARY_OUT(fname, op, overload, fn, kind)                                  \
  at::Tensor& fname(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) { \
    if (Binary("aten::" #op "_" #overload, fn, kind, self, other, out)) return out;     \
    return TERN_FALLBACK2(op, overload, self, other, out);                              \
  }                                                                                     \
  TERN_ATEN_IMPL(#op "." #overload, fname);
#define TERN_BINARY_SCALAR_OUT(fname, op, overload, fn, kind)                             \
  at::Tensor& fname(const at::Tensor& self, const at::Scalar& other, at::Tensor& out) {   \
    if (Binary("aten::" #op "_" #overload, fn, kind, self, Wrap(other), out)) return out; \
    return TERN_FALLBACK2(op, overload, self, other, out);                                \
  }                                                                                       \
  TERN_ATEN_IMPL(#op "." #overload, fname);

at::Tensor& AddOut(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                   at::Tensor& out) {
  if (Binary("aten::add.out", TERN_BINARY_ADD, Kind::kArith, self, other, out, alpha)) return out;
  return TERN_FALLBACK(add_out, self, other, alpha, out);
}
TERN_ATEN_IMPL("add.out", AddOut);

// other - alpha * self
at::Tensor Rsub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (Operable(self) && Operable(other) && (IsTern(self) || IsTern(other)) &&
      ResultType(self, other) != at::kBool) {
    const at::Tensor& like = IsTern(self) ? self : other;
    at::Tensor out = at::empty({0}, like.options().dtype(ResultType(self, other)));
    if (Binary("aten::rsub.Tensor", TERN_BINARY_SUB, Kind::kArith, other, self, out, alpha)) {
      return out;
    }
  }
  return TERN_FALLBACK2(rsub, Tensor, self, other, alpha);
}
TERN_ATEN_IMPL("rsub.Tensor", Rsub);

at::Tensor& SubOut(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                   at::Tensor& out) {
  if (ResultType(self, other) != at::kBool &&
      Binary("aten::sub.out", TERN_BINARY_SUB, Kind::kArith, self, other, out, alpha)) {
    return out;
  }
  return TERN_FALLBACK(sub_out, self, other, alpha, out);
}
TERN_ATEN_IMPL("sub.out", SubOut);

TERN_BINARY_OUT(MulOut, mul, out, TERN_BINARY_MUL, Kind::kArith)
TERN_BINARY_OUT(DivOut, div, out, TERN_BINARY_DIV, Kind::kFloat)
TERN_BINARY_OUT(MaximumOut, maximum, out, TERN_BINARY_MAX, Kind::kArith)
TERN_BINARY_OUT(MinimumOut, minimum, out, TERN_BINARY_MIN, Kind::kArith)
TERN_BINARY_OUT(Atan2Out, atan2, out, TERN_BINARY_ATAN2, Kind::kFloat)
TERN_BINARY_OUT(CopysignOut, copysign, out, TERN_BINARY_COPYSIGN, Kind::kFloat)
TERN_BINARY_OUT(FloorDivideOut, floor_divide, out, TERN_BINARY_FLOOR_DIVIDE, Kind::kArith)
TERN_BINARY_OUT(LogicalAndOut, logical_and, out, TERN_BINARY_LOGICAL_AND, Kind::kCompare)
TERN_BINARY_OUT(LogicalOrOut, logical_or, out, TERN_BINARY_LOGICAL_OR, Kind::kCompare)
TERN_BINARY_OUT(LogicalXorOut, logical_xor, out, TERN_BINARY_LOGICAL_XOR, Kind::kCompare)

#define TERN_BINARY_PAIR(name, fn, kind)                       \
  TERN_BINARY_OUT(name##TensorOut, name, Tensor_out, fn, kind) \
  TERN_BINARY_SCALAR_OUT(name##ScalarOut, name, Scalar_out, fn, kind)
TERN_BINARY_PAIR(eq, TERN_BINARY_EQ, Kind::kCompare)
TERN_BINARY_PAIR(ne, TERN_BINARY_NE, Kind::kCompare)
TERN_BINARY_PAIR(lt, TERN_BINARY_LT, Kind::kCompare)
TERN_BINARY_PAIR(le, TERN_BINARY_LE, Kind::kCompare)
TERN_BINARY_PAIR(gt, TERN_BINARY_GT, Kind::kCompare)
TERN_BINARY_PAIR(ge, TERN_BINARY_GE, Kind::kCompare)
TERN_BINARY_PAIR(remainder, TERN_BINARY_REMAINDER, Kind::kArith)
TERN_BINARY_PAIR(fmod, TERN_BINARY_FMOD, Kind::kArith)
TERN_BINARY_PAIR(bitwise_and, TERN_BINARY_BITWISE_AND, Kind::kArith)
TERN_BINARY_PAIR(bitwise_or, TERN_BINARY_BITWISE_OR, Kind::kArith)
TERN_BINARY_PAIR(bitwise_xor, TERN_BINARY_BITWISE_XOR, Kind::kArith)

at::Tensor& DivModeOut(const at::Tensor& self, const at::Tensor& other,
                       std::optional<c10::string_view> mode, at::Tensor& out) {
  bool done = false;
  if (!mode.has_value()) {
    done = Binary("aten::div.out", TERN_BINARY_DIV, Kind::kFloat, self, other, out);
  } else if (*mode == "floor") {
    done = Binary("aten::div.out_mode", TERN_BINARY_FLOOR_DIVIDE, Kind::kArith, self, other, out);
  } else if (*mode == "trunc" && at::isFloatingType(ResultType(self, other)) &&
             at::isFloatingType(out.scalar_type())) {
    // trunc(a / b), as the CPU computes it for floats.
    at::Tensor quotient = at::empty_like(out);
    done = Binary("aten::div.out_mode", TERN_BINARY_DIV, Kind::kArith, self, other, quotient) &&
           Unary("aten::div.out_mode", TERN_UNARY_TRUNC, quotient, out);
  } else if (*mode == "trunc" && IsTern(self) &&
             at::isIntegralType(ResultType(self, other), /*includeBool=*/false) &&
             out.scalar_type() == ResultType(self, other)) {
    // Integers: the floor quotient, plus one where it was rounded down past
    // zero (a remainder, and operands of opposite signs).
    at::Tensor quotient = at::empty_like(out);
    if (Binary("aten::div.out_mode", TERN_BINARY_FLOOR_DIVIDE, Kind::kArith, self, other,
               quotient)) {
      const at::Tensor rounded_down =
          at::remainder(self, other).ne(0).logical_and(self.lt(0).logical_xor(other.lt(0)));
      ResizeOut(out, quotient.sizes());
      at::add_out(out, quotient, rounded_down.to(quotient.scalar_type()));
      done = true;
    }
  }
  if (done) return out;
  return TERN_FALLBACK(div_out_mode, self, other, mode, out);
}
TERN_ATEN_IMPL("div.out_mode", DivModeOut);

at::Tensor& PowTensorTensorOut(const at::Tensor& self, const at::Tensor& exponent,
                               at::Tensor& out) {
  if (Binary("aten::pow.Tensor_Tensor_out", TERN_BINARY_POW, Kind::kArith, self, exponent, out)) {
    return out;
  }
  return TERN_FALLBACK(pow_Tensor_Tensor_out, self, exponent, out);
}
TERN_ATEN_IMPL("pow.Tensor_Tensor_out", PowTensorTensorOut);

at::Tensor& PowScalarOut(const at::Scalar& self, const at::Tensor& exponent, at::Tensor& out) {
  if (Binary("aten::pow.Scalar_out", TERN_BINARY_POW, Kind::kArith, Wrap(self), exponent, out)) {
    return out;
  }
  return TERN_FALLBACK(pow_Scalar_out, self, exponent, out);
}
TERN_ATEN_IMPL("pow.Scalar_out", PowScalarOut);

// x ** e with the CPU's special cases (x*x, x*x*x, sqrt, 1/x, ...).
bool PowTensorScalar(const at::Tensor& self, const at::Scalar& exponent, const at::Tensor& out) {
  if (!IsTern(self) || !IsTern(out) || exponent.isComplex()) return false;
  ResizeOut(out, self.sizes());
  if (!OutputOk(out, {self})) return false;
  const char* name = "aten::pow.Tensor_Scalar_out";
  const at::ScalarType cd = out.scalar_type();
  if (!at::isFloatingType(cd)) {
    if (exponent.isFloatingPoint() || exponent.toLong() < 0) return false;
    return Binary(name, TERN_BINARY_POW, Kind::kArith, self, Wrap(exponent), out);
  }
  const double e = exponent.toDouble();
  Program p(name);
  Operand X = Input(p, self, cd, self.sizes());
  if (!p.ok()) return false;
  Operand O = p.Out(out);
  const tern_dtype_t d = *TD(cd);
  auto unary = [&](Operand dst, Operand src, tern_unary_fn_t fn, std::vector<double> f = {}) {
    p.Emit(TERN_OP_UNARY, {dst, src}, {fn}, std::move(f));
  };
  if (e == 0) {
    p.Emit(TERN_OP_FILL, {O}, {}, {1.0});
  } else if (e == 1) {
    p.Emit(TERN_OP_COPY, {O, X});
  } else if (e == 2) {
    p.Emit(TERN_OP_BINARY, {O, X, X}, {TERN_BINARY_MUL});
  } else if (e == 3) {
    Operand sq = p.Temp(d, self.sizes());
    p.Emit(TERN_OP_BINARY, {sq, X, X}, {TERN_BINARY_MUL});
    p.Emit(TERN_OP_BINARY, {O, sq, X}, {TERN_BINARY_MUL});
  } else if (e == -2) {
    Operand sq = p.Temp(d, self.sizes());
    p.Emit(TERN_OP_BINARY, {sq, X, X}, {TERN_BINARY_MUL});
    unary(O, sq, TERN_UNARY_RECIPROCAL);
  } else if (e == 0.5) {
    unary(O, X, TERN_UNARY_SQRT);
  } else if (e == -0.5) {
    unary(O, X, TERN_UNARY_RSQRT);
  } else if (e == -1) {
    unary(O, X, TERN_UNARY_RECIPROCAL);
  } else if (std::isfinite(e)) {
    unary(O, X, TERN_UNARY_POW_SCALAR, {e});
  } else {
    return false;
  }
  return p.Run();
}

at::Tensor& PowTensorScalarOut(const at::Tensor& self, const at::Scalar& exponent,
                               at::Tensor& out) {
  if (PowTensorScalar(self, exponent, out)) return out;
  return TERN_FALLBACK(pow_Tensor_Scalar_out, self, exponent, out);
}
TERN_ATEN_IMPL("pow.Tensor_Scalar_out", PowTensorScalarOut);

// ---- Unary ------------------------------------------------------------------------

// at::<op>_out, registered for aten::<op>.out.
#define TERN_UNARY_OUT(fname, op, fn)                             \
  at::Tensor& fname(const at::Tensor& self, at::Tensor& out) {    \
    if (Unary("aten::" #op "_out", fn, self, out)) return out;    \
    if (UnaryF64("aten::" #op "_out", fn, self, out)) return out; \
    return TERN_FALLBACK2(op, out, self, out);                    \
  }                                                               \
  TERN_ATEN_IMPL(#op ".out", fname);

// Float functions: integer inputs promote (out is float), bool is not taken.
TERN_UNARY_OUT(ExpOut, exp, TERN_UNARY_EXP)
TERN_UNARY_OUT(LogOut, log, TERN_UNARY_LOG)
TERN_UNARY_OUT(SqrtOut, sqrt, TERN_UNARY_SQRT)
TERN_UNARY_OUT(RsqrtOut, rsqrt, TERN_UNARY_RSQRT)
TERN_UNARY_OUT(SinOut, sin, TERN_UNARY_SIN)
TERN_UNARY_OUT(CosOut, cos, TERN_UNARY_COS)
TERN_UNARY_OUT(TanOut, tan, TERN_UNARY_TAN)
TERN_UNARY_OUT(TanhOut, tanh, TERN_UNARY_TANH)
TERN_UNARY_OUT(SigmoidOut, sigmoid, TERN_UNARY_SIGMOID)
TERN_UNARY_OUT(SiluOut, silu, TERN_UNARY_SILU)
TERN_UNARY_OUT(ErfOut, erf, TERN_UNARY_ERF)
TERN_UNARY_OUT(ReciprocalOut, reciprocal, TERN_UNARY_RECIPROCAL)
TERN_UNARY_OUT(Expm1Out, expm1, TERN_UNARY_EXPM1)
TERN_UNARY_OUT(Log1pOut, log1p, TERN_UNARY_LOG1P)
TERN_UNARY_OUT(Log2Out, log2, TERN_UNARY_LOG2)
TERN_UNARY_OUT(Exp2Out, exp2, TERN_UNARY_EXP2)
TERN_UNARY_OUT(AsinOut, asin, TERN_UNARY_ASIN)
TERN_UNARY_OUT(AcosOut, acos, TERN_UNARY_ACOS)
TERN_UNARY_OUT(AtanOut, atan, TERN_UNARY_ATAN)
TERN_UNARY_OUT(SinhOut, sinh, TERN_UNARY_SINH)
TERN_UNARY_OUT(CoshOut, cosh, TERN_UNARY_COSH)
TERN_UNARY_OUT(HardsigmoidOut, hardsigmoid, TERN_UNARY_HARDSIGMOID)
TERN_UNARY_OUT(HardswishOut, hardswish, TERN_UNARY_HARDSWISH)
TERN_UNARY_OUT(MishOut, mish, TERN_UNARY_MISH)
// Numeric functions (integers keep their dtype).
TERN_UNARY_OUT(NegOut, neg, TERN_UNARY_NEG)
TERN_UNARY_OUT(AbsOut, abs, TERN_UNARY_ABS)
TERN_UNARY_OUT(FloorOut, floor, TERN_UNARY_FLOOR)
TERN_UNARY_OUT(CeilOut, ceil, TERN_UNARY_CEIL)
TERN_UNARY_OUT(RoundOut, round, TERN_UNARY_ROUND)
TERN_UNARY_OUT(TruncOut, trunc, TERN_UNARY_TRUNC)
TERN_UNARY_OUT(SignOut, sign, TERN_UNARY_SIGN)
TERN_UNARY_OUT(SgnOut, sgn, TERN_UNARY_SIGN)
TERN_UNARY_OUT(BitwiseNotOut, bitwise_not, TERN_UNARY_BITWISE_NOT)

at::Tensor IsNan(const at::Tensor& self) {
  if (IsTern(self)) {
    at::Tensor out = at::empty_like(self, self.options().dtype(at::kBool));
    if (Unary("aten::isnan", TERN_UNARY_ISNAN, self, out, {}, /*bool_out=*/true)) return out;
  }
  return TERN_FALLBACK(isnan, self);
}
TERN_ATEN_IMPL("isnan", IsNan);

at::Tensor& LogicalNotOut(const at::Tensor& self, at::Tensor& out) {
  if (Unary("aten::logical_not.out", TERN_UNARY_LOGICAL_NOT, self, out, {}, /*bool_out=*/true)) {
    return out;
  }
  return TERN_FALLBACK(logical_not_out, self, out);
}
TERN_ATEN_IMPL("logical_not.out", LogicalNotOut);

at::Tensor& RoundDecimalsOut(const at::Tensor& self, int64_t decimals, at::Tensor& out) {
  if (decimals == 0 && Unary("aten::round.decimals_out", TERN_UNARY_ROUND, self, out)) return out;
  return TERN_FALLBACK(round_decimals_out, self, decimals, out);
}
TERN_ATEN_IMPL("round.decimals_out", RoundDecimalsOut);

at::Tensor& GeluOut(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  const tern_unary_fn_t fn = approximate == "tanh" ? TERN_UNARY_GELU_TANH : TERN_UNARY_GELU;
  if (Unary("aten::gelu.out", fn, self, out)) return out;
  return TERN_FALLBACK(gelu_out, self, approximate, out);
}
TERN_ATEN_IMPL("gelu.out", GeluOut);

at::Tensor& LeakyReluOut(const at::Tensor& self, const at::Scalar& slope, at::Tensor& out) {
  if (Unary("aten::leaky_relu.out", TERN_UNARY_LEAKY_RELU, self, out, {slope.toDouble()})) {
    return out;
  }
  return TERN_FALLBACK(leaky_relu_out, self, slope, out);
}
TERN_ATEN_IMPL("leaky_relu.out", LeakyReluOut);

at::Tensor& EluOut(const at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale,
                   const at::Scalar& input_scale, at::Tensor& out) {
  if (scale.toDouble() == 1.0 && input_scale.toDouble() == 1.0 &&
      Unary("aten::elu.out", TERN_UNARY_ELU, self, out, {alpha.toDouble()})) {
    return out;
  }
  return TERN_FALLBACK(elu_out, self, alpha, scale, input_scale, out);
}
TERN_ATEN_IMPL("elu.out", EluOut);

at::Tensor& SoftplusOut(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold,
                        at::Tensor& out) {
  if (beta.toDouble() > 0 && Unary("aten::softplus.out", TERN_UNARY_SOFTPLUS, self, out,
                                   {beta.toDouble(), threshold.toDouble()})) {
    return out;
  }
  return TERN_FALLBACK(softplus_out, self, beta, threshold, out);
}
TERN_ATEN_IMPL("softplus.out", SoftplusOut);

at::Tensor Hardswish(const at::Tensor& self) {
  if (IsTern(self) && at::isFloatingType(self.scalar_type())) {
    at::Tensor out = at::empty_like(self);
    if (Unary("aten::hardswish", TERN_UNARY_HARDSWISH, self, out)) return out;
  }
  return TERN_FALLBACK(hardswish, self);
}
TERN_ATEN_IMPL("hardswish", Hardswish);

at::Tensor& Hardswish_(at::Tensor& self) {
  if (Unary("aten::hardswish_", TERN_UNARY_HARDSWISH, self, self)) return self;
  return TERN_FALLBACK(hardswish_, self);
}
TERN_ATEN_IMPL("hardswish_", Hardswish_);

at::Tensor FloorDivide(const at::Tensor& self, const at::Tensor& other) {
  if (IsTern(self) && Operable(other)) {
    at::Tensor out = at::empty({0}, self.options().dtype(ResultType(self, other)));
    if (Binary("aten::floor_divide", TERN_BINARY_FLOOR_DIVIDE, Kind::kArith, self, other, out)) {
      return out;
    }
  }
  return TERN_FALLBACK(floor_divide, self, other);
}
TERN_ATEN_IMPL("floor_divide", FloorDivide);

at::Tensor& FloorDivide_(at::Tensor& self, const at::Tensor& other) {
  if (Binary("aten::floor_divide_.Tensor", TERN_BINARY_FLOOR_DIVIDE, Kind::kArith, self, other,
             self)) {
    return self;
  }
  return TERN_FALLBACK2(floor_divide_, Tensor, self, other);
}
TERN_ATEN_IMPL("floor_divide_.Tensor", FloorDivide_);

at::Tensor Relu(const at::Tensor& self) {
  if (IsTern(self) && self.scalar_type() != at::kBool) {
    at::Tensor out = at::empty_like(self);
    if (Unary("aten::relu", TERN_UNARY_RELU, self, out)) return out;
  }
  return TERN_FALLBACK(relu, self);
}
TERN_ATEN_IMPL("relu", Relu);

at::Tensor& Relu_(at::Tensor& self) {
  if (self.scalar_type() != at::kBool && Unary("aten::relu_", TERN_UNARY_RELU, self, self)) {
    return self;
  }
  return TERN_FALLBACK(relu_, self);
}
TERN_ATEN_IMPL("relu_", Relu_);

// clamp with scalar bounds: one CLAMP instruction (bounds not NaN).
bool ClampScalars(const char* name, const at::Tensor& self, std::optional<double> lo,
                  std::optional<double> hi, const at::Tensor& out) {
  if (!IsTern(self) || out.scalar_type() != self.scalar_type() || self.scalar_type() == at::kBool) {
    return false;
  }
  if ((lo && std::isnan(*lo)) || (hi && std::isnan(*hi))) return false;
  return Unary(name, TERN_UNARY_CLAMP, self, out, {lo.value_or(-INFINITY), hi.value_or(INFINITY)});
}

std::optional<double> OptDouble(const std::optional<at::Scalar>& s) {
  if (!s.has_value()) return std::nullopt;
  return s->toDouble();
}

at::Tensor& ClampOut(const at::Tensor& self, const std::optional<at::Scalar>& min,
                     const std::optional<at::Scalar>& max, at::Tensor& out) {
  if ((min || max) && ClampScalars("aten::clamp.out", self, OptDouble(min), OptDouble(max), out)) {
    return out;
  }
  return TERN_FALLBACK(clamp_out, self, min, max, out);
}
TERN_ATEN_IMPL("clamp.out", ClampOut);

at::Tensor& ClampMinOut(const at::Tensor& self, const at::Scalar& min, at::Tensor& out) {
  if (ClampScalars("aten::clamp_min.out", self, min.toDouble(), std::nullopt, out)) return out;
  return TERN_FALLBACK(clamp_min_out, self, min, out);
}
TERN_ATEN_IMPL("clamp_min.out", ClampMinOut);

at::Tensor& ClampMaxOut(const at::Tensor& self, const at::Scalar& max, at::Tensor& out) {
  if (ClampScalars("aten::clamp_max.out", self, std::nullopt, max.toDouble(), out)) return out;
  return TERN_FALLBACK(clamp_max_out, self, max, out);
}
TERN_ATEN_IMPL("clamp_max.out", ClampMaxOut);

at::Tensor& ClampMinTensorOut(const at::Tensor& self, const at::Tensor& min, at::Tensor& out) {
  if (Binary("aten::clamp_min.Tensor_out", TERN_BINARY_MAX, Kind::kArith, self, min, out)) {
    return out;
  }
  return TERN_FALLBACK(clamp_min_Tensor_out, self, min, out);
}
TERN_ATEN_IMPL("clamp_min.Tensor_out", ClampMinTensorOut);

at::Tensor& ClampMaxTensorOut(const at::Tensor& self, const at::Tensor& max, at::Tensor& out) {
  if (Binary("aten::clamp_max.Tensor_out", TERN_BINARY_MIN, Kind::kArith, self, max, out)) {
    return out;
  }
  return TERN_FALLBACK(clamp_max_Tensor_out, self, max, out);
}
TERN_ATEN_IMPL("clamp_max.Tensor_out", ClampMaxTensorOut);

// clamp with tensor bounds: min(max(x, lo), hi), NaN propagating.
bool ClampTensors(const at::Tensor& self, const at::Tensor& min, const at::Tensor& max,
                  const at::Tensor& out) {
  if ((!min.defined() && !max.defined()) || !IsTern(self)) return false;
  std::vector<int64_t> shape = self.sizes().vec();
  at::ScalarType dtype = self.scalar_type();
  for (const at::Tensor& bound : {min, max}) {
    if (!bound.defined()) continue;
    shape = at::infer_size(shape, bound.sizes());
    dtype = at::promote_types(dtype, bound.scalar_type());
  }
  ResizeOut(out, shape);
  if (dtype != out.scalar_type() || (min.defined() && !Operable(min)) ||
      (max.defined() && !Operable(max)) || !OutputOk(out, {self, min, max})) {
    return false;
  }
  Program p("aten::clamp.Tensor_out");
  Operand X = Input(p, self, dtype, shape);
  Operand O = p.Out(out);
  if (min.defined() && max.defined()) {
    Operand tmp = p.Temp(*TD(dtype), shape);
    p.Emit(TERN_OP_BINARY, {tmp, X, Input(p, min, dtype, shape)}, {TERN_BINARY_MAX});
    p.Emit(TERN_OP_BINARY, {O, tmp, Input(p, max, dtype, shape)}, {TERN_BINARY_MIN});
  } else if (min.defined()) {
    p.Emit(TERN_OP_BINARY, {O, X, Input(p, min, dtype, shape)}, {TERN_BINARY_MAX});
  } else {
    p.Emit(TERN_OP_BINARY, {O, X, Input(p, max, dtype, shape)}, {TERN_BINARY_MIN});
  }
  return p.ok() && p.Run();
}

at::Tensor& ClampTensorOut(const at::Tensor& self, const std::optional<at::Tensor>& min,
                           const std::optional<at::Tensor>& max, at::Tensor& out) {
  // An absent bound and an undefined one mean the same: no bound.
  if (ClampTensors(self, min.value_or(at::Tensor()), max.value_or(at::Tensor()), out)) return out;
  return TERN_FALLBACK(clamp_Tensor_out, self, min, max, out);
}
TERN_ATEN_IMPL("clamp.Tensor_out", ClampTensorOut);

bool IsInf(const char* name, const at::Tensor& self, double value, const at::Tensor& out) {
  if (!IsTern(self) || !at::isFloatingType(self.scalar_type())) return false;
  return Binary(name, TERN_BINARY_EQ, Kind::kCompare, self,
                Wrap(c10::Scalar(value)).to(self.scalar_type()), out);
}

at::Tensor& IsneginfOut(const at::Tensor& self, at::Tensor& out) {
  if (IsInf("aten::isneginf.out", self, -INFINITY, out)) return out;
  return TERN_FALLBACK(isneginf_out, self, out);
}
TERN_ATEN_IMPL("isneginf.out", IsneginfOut);

at::Tensor& IsposinfOut(const at::Tensor& self, at::Tensor& out) {
  if (IsInf("aten::isposinf.out", self, INFINITY, out)) return out;
  return TERN_FALLBACK(isposinf_out, self, out);
}
TERN_ATEN_IMPL("isposinf.out", IsposinfOut);

// ---- where, masked_fill ------------------------------------------------------------

bool Where(const char* name, const at::Tensor& cond, const at::Tensor& a, const at::Tensor& b,
           const at::Tensor& out) {
  if (!IsTern(cond) || cond.scalar_type() != at::kBool || !Operable(a) || !Operable(b) ||
      !IsTern(out)) {
    return false;
  }
  const at::ScalarType dtype = ResultType(a, b);
  const std::vector<int64_t> shape =
      at::infer_size(cond.sizes(), at::infer_size(a.sizes(), b.sizes()));
  ResizeOut(out, shape);
  if (!OutputOk(out, {cond, a, b})) return false;
  Program p(name);
  Operand C = p.In(cond).Expand(shape);
  Operand A = Input(p, a, dtype, shape);
  Operand B = Input(p, b, dtype, shape);
  if (!p.ok()) return false;
  const Target t = BeginOut(p, out, dtype);
  p.Emit(TERN_OP_WHERE, {t.write, C, A, B});
  Finish(p, t);
  return p.Run();
}

at::Tensor& WhereSelfOut(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other,
                         at::Tensor& out) {
  if (Where("aten::where.self_out", cond, self, other, out)) return out;
  return TERN_FALLBACK(where_self_out, cond, self, other, out);
}
TERN_ATEN_IMPL("where.self_out", WhereSelfOut);

at::Tensor WhereSelf(const at::Tensor& cond, const at::Tensor& self, const at::Tensor& other) {
  if (IsTern(cond) && Operable(self) && Operable(other)) {
    const std::vector<int64_t> shape =
        at::infer_size(cond.sizes(), at::infer_size(self.sizes(), other.sizes()));
    at::Tensor out = at::empty(shape, cond.options().dtype(ResultType(self, other)));
    if (Where("aten::where.self", cond, self, other, out)) return out;
  }
  return TERN_FALLBACK(where_self, cond, self, other);
}
TERN_ATEN_IMPL("where.self", WhereSelf);

bool MaskedFill(const char* name, at::Tensor& self, const at::Tensor& mask,
                const at::Tensor& value) {
  if (!IsTern(self) || !IsTern(mask) || mask.scalar_type() != at::kBool || value.dim() != 0 ||
      !Operable(value) || !OutputOk(self, {mask})) {
    return false;
  }
  // mask must broadcast to self without changing self's shape.
  if (at::infer_size(self.sizes(), mask.sizes()) != self.sizes()) return false;
  const at::ScalarType dtype = self.scalar_type();
  Program p(name);
  Operand X = p.In(self);
  Operand V = Input(p, value, dtype, self.sizes());
  if (!p.ok()) return false;
  p.Emit(TERN_OP_WHERE, {p.Out(self), p.In(mask).Expand(self.sizes()), V, X});
  return p.Run();
}

at::Tensor& MaskedFillScalar(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  if (MaskedFill("aten::masked_fill_.Scalar", self, mask, c10::scalar_to_tensor(value))) {
    return self;
  }
  return TERN_FALLBACK2(masked_fill_, Scalar, self, mask, value);
}
TERN_ATEN_IMPL("masked_fill_.Scalar", MaskedFillScalar);

at::Tensor& MaskedFillTensor(at::Tensor& self, const at::Tensor& mask, const at::Tensor& value) {
  if (MaskedFill("aten::masked_fill_.Tensor", self, mask, value)) return self;
  return TERN_FALLBACK2(masked_fill_, Tensor, self, mask, value);
}
TERN_ATEN_IMPL("masked_fill_.Tensor", MaskedFillTensor);

// ---- Float ops (one frame), lerp, addcmul, addcdiv ---------------------------------

bool FloatTernAll(std::initializer_list<at::Tensor> ts, at::ScalarType dtype) {
  for (const at::Tensor& t : ts) {
    if (!IsTern(t) || t.scalar_type() != dtype) return false;
  }
  return at::isFloatingType(dtype) && Supported(dtype);
}

// A float op's program as RunFloatOp hands it to the op: the broadcast shape
// of its tensors and the dtype it computes in (PyTorch's opmath: f32 for
// bf16/f16, the tensors' dtype otherwise).
struct FloatOp {
  FloatOp(const char* name, const at::Tensor& out, std::vector<int64_t> broadcast,
          at::ScalarType dtype)
      : p(name), out(out), shape(std::move(broadcast)), cd(OpMath(dtype)), d(*TD(cd)) {}

  // `t` in the compute dtype, broadcast to the shape.
  Operand In(const at::Tensor& t) { return Input(p, t, cd, shape); }
  // A scratch temporary of the compute dtype and the shape.
  Operand Temp() { return p.Temp(d, shape); }
  // A constant / run-time argument of the compute dtype, broadcast to the shape.
  Operand Const(double value) { return p.Const(value, d).Expand(shape); }
  Operand Arg(double value) { return p.Arg(value, d).Expand(shape); }
  // The op's last instruction: `operands` follow the output, which is `out`
  // itself, or a scratch cast into `out` when out is bf16/f16.
  void EmitOut(tern_opcode_t opcode, std::vector<Operand> operands, std::vector<int64_t> ints,
               std::vector<double> floats = {}) {
    const Target t = BeginOut(p, out, cd);
    operands.insert(operands.begin(), t.write);
    p.Emit(opcode, std::move(operands), std::move(ints), std::move(floats));
    Finish(p, t);
  }
  // The op's instructions as `emit` writes them (the same function the
  // elementwise fast path builds the op with), writing out as EmitOut does.
  void EmitOutBy(program::ElementwiseEmitter emit, std::vector<Operand> operands, int64_t fn) {
    const Target t = BeginOut(p, out, cd);
    operands.insert(operands.begin(), t.write);
    emit(p, operands, fn);
    Finish(p, t);
  }

  Program p;
  const at::Tensor& out;
  const std::vector<int64_t> shape;
  const at::ScalarType cd;
  const tern_dtype_t d;
};

// The decline-or-run frame of the float ops below (lerp, addcmul/addcdiv,
// activation backwards, mse_loss, dropout's backward). They run natively when
// `out` and every tensor of `inputs` are tern tensors of one float dtype tern
// supports (the first input's) and every tensor of `others` (a bool mask, the
// input a threshold compares) is on tern. `out` is resized to the broadcast
// shape of them all (0-dim when `scalar_out`: a reduced loss) and may share
// memory with none of them except in place. `emit(FloatOp&)` then writes the
// program. False when any of that declines or the program cannot run: the
// caller takes its CPU fallback.
template <typename Emit>
bool RunFloatOp(const char* name, const at::Tensor& out, std::initializer_list<at::Tensor> inputs,
                Emit&& emit, std::initializer_list<at::Tensor> others = {},
                bool scalar_out = false) {
  const at::ScalarType dtype = inputs.begin()->scalar_type();
  if (!FloatTernAll(inputs, dtype) || !FloatTernAll({out}, dtype)) return false;
  for (const at::Tensor& t : others) {
    if (!IsTern(t)) return false;
  }
  std::vector<c10::IntArrayRef> sizes;
  for (const at::Tensor& t : inputs) sizes.push_back(t.sizes());
  for (const at::Tensor& t : others) sizes.push_back(t.sizes());
  // Folded from the right, infer_size(a, infer_size(b, c)), as each op did
  // before: a shape mismatch raises the same message.
  std::vector<int64_t> shape = sizes.back().vec();
  for (size_t i = sizes.size() - 1; i-- > 0;) shape = at::infer_size(sizes[i], shape);
  ResizeOut(out, scalar_out ? std::vector<int64_t>{} : shape);
  if (!OutputOk(out, inputs) || !OutputOk(out, others)) return false;
  FloatOp f(name, out, std::move(shape), dtype);
  emit(f);
  return f.p.ok() && f.p.Run();
}

// lerp's instructions, for the fast path (float32, 1-D operands) and the
// general one alike: operands out, a, b, the weight (w, or 1 - w when fn is 1).
void EmitLerp(Program& p, const std::vector<Operand>& o, int64_t fn) {
  const Operand diff = p.Temp(o[0].dtype, o[0].shape), scaled = p.Temp(o[0].dtype, o[0].shape);
  p.Emit(TERN_OP_BINARY, {diff, o[2], o[1]}, {TERN_BINARY_SUB});
  p.Emit(TERN_OP_BINARY, {scaled, diff, o[3]}, {TERN_BINARY_MUL});
  if (fn == 0) {
    p.Emit(TERN_OP_BINARY, {o[0], o[1], scaled}, {TERN_BINARY_ADD});
  } else {
    p.Emit(TERN_OP_BINARY, {o[0], o[2], scaled}, {TERN_BINARY_SUB});
  }
}

// The CPU's lerp: w < 0.5 ? a + w * (b - a) : b - (b - a) * (1 - w).
at::Tensor& LerpScalarOut(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight,
                          at::Tensor& out) {
  const double w = weight.toDouble();
  const bool low = std::abs(w) < 0.5;
  // An optimizer's `exp_avg.lerp_(grad, 1 - beta1)`: the same instructions
  // as below, without building the program (RunElementwise).
  if (FloatTernAll({out, self, end}, at::kFloat) &&
      RunElementwise("aten::lerp.Scalar_out", TERN_OP_BINARY, low ? 0 : 1, out, {self, end},
                     ElementwiseScalar::kLastOperand, low ? w : 1.0 - w, EmitLerp)) {
    return out;
  }
  if (RunFloatOp("aten::lerp.Scalar_out", out, {self, end}, [&](FloatOp& f) {
        f.EmitOutBy(EmitLerp, {f.In(self), f.In(end), f.Arg(low ? w : 1.0 - w)}, low ? 0 : 1);
      })) {
    return out;
  }
  return TERN_FALLBACK(lerp_Scalar_out, self, end, weight, out);
}
TERN_ATEN_IMPL("lerp.Scalar_out", LerpScalarOut);

// lerp with a weight tensor: the CPU's formula, both branches and a select.
at::Tensor& LerpTensorOut(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight,
                          at::Tensor& out) {
  if (RunFloatOp("aten::lerp.Tensor_out", out, {self, end, weight}, [&](FloatOp& f) {
        Program& p = f.p;
        Operand A = f.In(self), B = f.In(end), W = f.In(weight);
        Operand diff = f.Temp(), t1 = f.Temp(), low = f.Temp();
        Operand one_minus = f.Temp(), high = f.Temp();
        Operand magnitude = f.Temp(), small = p.Temp(TERN_DTYPE_BOOL, f.shape);
        p.Emit(TERN_OP_BINARY, {diff, B, A}, {TERN_BINARY_SUB});
        p.Emit(TERN_OP_BINARY, {t1, W, diff}, {TERN_BINARY_MUL});
        p.Emit(TERN_OP_BINARY, {low, A, t1}, {TERN_BINARY_ADD});
        p.Emit(TERN_OP_UNARY, {one_minus, W}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
        p.Emit(TERN_OP_BINARY, {t1, diff, one_minus}, {TERN_BINARY_MUL});
        p.Emit(TERN_OP_BINARY, {high, B, t1}, {TERN_BINARY_SUB});
        p.Emit(TERN_OP_UNARY, {magnitude, W}, {TERN_UNARY_ABS});
        p.Emit(TERN_OP_BINARY, {small, magnitude, f.Const(0.5)}, {TERN_BINARY_LT});
        f.EmitOut(TERN_OP_WHERE, {small, low, high}, {});
      })) {
    return out;
  }
  return TERN_FALLBACK(lerp_Tensor_out, self, end, weight, out);
}
TERN_ATEN_IMPL("lerp.Tensor_out", LerpTensorOut);

// addcmul/addcdiv's instructions, for the fast path (float32, 1-D operands)
// and the general one alike: operands out, self, t1, t2, value; fn is the op
// between t1 and t2.
void EmitAddc(Program& p, const std::vector<Operand>& o, int64_t fn) {
  const Operand tmp = p.Temp(o[0].dtype, o[0].shape), tmp2 = p.Temp(o[0].dtype, o[0].shape);
  p.Emit(TERN_OP_BINARY, {tmp, o[2], o[4]}, {TERN_BINARY_MUL});
  p.Emit(TERN_OP_BINARY, {tmp2, tmp, o[3]}, {fn});
  p.Emit(TERN_OP_BINARY, {o[0], o[1], tmp2}, {TERN_BINARY_ADD});
}

// self + value * t1 (op) t2, as the CPU orders it: (value * t1) op t2.
bool AddcOp(const char* name, tern_binary_fn_t op, const at::Tensor& self, const at::Tensor& t1,
            const at::Tensor& t2, const at::Scalar& value, const at::Tensor& out) {
  // An optimizer's `exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)` and
  // `p.addcdiv_(exp_avg, denom, value=-step_size)`: the instructions below,
  // without building the program (RunElementwise).
  if (FloatTernAll({out, self, t1, t2}, at::kFloat) &&
      (value.isFloatingPoint() || value.isIntegral(false)) &&
      RunElementwise(name, TERN_OP_BINARY, op, out, {self, t1, t2}, ElementwiseScalar::kLastOperand,
                     value.toDouble(), EmitAddc)) {
    return true;
  }
  return RunFloatOp(name, out, {self, t1, t2}, [&](FloatOp& f) {
    f.EmitOutBy(EmitAddc, {f.In(self), f.In(t1), f.In(t2), f.Arg(value.toDouble())}, op);
  });
}

at::Tensor& AddcmulOut(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                       const at::Scalar& value, at::Tensor& out) {
  if (AddcOp("aten::addcmul.out", TERN_BINARY_MUL, self, t1, t2, value, out)) return out;
  return TERN_FALLBACK(addcmul_out, self, t1, t2, value, out);
}
TERN_ATEN_IMPL("addcmul.out", AddcmulOut);

at::Tensor& AddcdivOut(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                       const at::Scalar& value, at::Tensor& out) {
  if (AddcOp("aten::addcdiv.out", TERN_BINARY_DIV, self, t1, t2, value, out)) return out;
  return TERN_FALLBACK(addcdiv_out, self, t1, t2, value, out);
}
TERN_ATEN_IMPL("addcdiv.out", AddcdivOut);

// ---- Backward functions of activations -----------------------------------------------

// at::<op>_<overload>, registered for aten::<op>.<overload>.
#define TERN_UNARY_BACKWARD_OUT(fname, op, overload, fn)                                \
  at::Tensor& fname(const at::Tensor& grad_output, const at::Tensor& self,              \
                    at::Tensor& grad_input) {                                           \
    if (UnaryBackward("aten::" #op "_" #overload, fn, grad_output, self, grad_input)) { \
      return grad_input;                                                                \
    }                                                                                   \
    return TERN_FALLBACK2(op, overload, grad_output, self, grad_input);                 \
  }                                                                                     \
  TERN_ATEN_IMPL(#op "." #overload, fname);
TERN_UNARY_BACKWARD_OUT(SiluBackwardOut, silu_backward, grad_input, TERN_UNARY_SILU)
TERN_UNARY_BACKWARD_OUT(HardsigmoidBackwardOut, hardsigmoid_backward, grad_input,
                        TERN_UNARY_HARDSIGMOID)
TERN_UNARY_BACKWARD_OUT(HardswishBackwardOut, hardswish_backward, out, TERN_UNARY_HARDSWISH)

at::Tensor MishBackward(const at::Tensor& grad_output, const at::Tensor& self) {
  if (IsTern(grad_output) && IsTern(self)) {
    at::Tensor out =
        at::empty(at::infer_size(grad_output.sizes(), self.sizes()), grad_output.options());
    if (UnaryBackward("aten::mish_backward", TERN_UNARY_MISH, grad_output, self, out)) return out;
  }
  return TERN_FALLBACK(mish_backward, grad_output, self);
}
TERN_ATEN_IMPL("mish_backward", MishBackward);

at::Tensor& GeluBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                            c10::string_view approximate, at::Tensor& grad_input) {
  const tern_unary_fn_t fn = approximate == "tanh" ? TERN_UNARY_GELU_TANH : TERN_UNARY_GELU;
  if (UnaryBackward("aten::gelu_backward.grad_input", fn, grad_output, self, grad_input)) {
    return grad_input;
  }
  return TERN_FALLBACK(gelu_backward_grad_input, grad_output, self, approximate, grad_input);
}
TERN_ATEN_IMPL("gelu_backward.grad_input", GeluBackwardOut);

at::Tensor& LeakyReluBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                 const at::Scalar& slope, bool self_is_result,
                                 at::Tensor& grad_input) {
  if ((!self_is_result || slope.toDouble() >= 0) &&
      UnaryBackward("aten::leaky_relu_backward.grad_input", TERN_UNARY_LEAKY_RELU, grad_output,
                    self, grad_input, {slope.toDouble()})) {
    return grad_input;
  }
  return TERN_FALLBACK(leaky_relu_backward_grad_input, grad_output, self, slope, self_is_result,
                       grad_input);
}
TERN_ATEN_IMPL("leaky_relu_backward.grad_input", LeakyReluBackwardOut);

at::Tensor& SoftplusBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                const at::Scalar& beta, const at::Scalar& threshold,
                                at::Tensor& grad_input) {
  if (beta.toDouble() > 0 &&
      UnaryBackward("aten::softplus_backward.grad_input", TERN_UNARY_SOFTPLUS, grad_output, self,
                    grad_input, {beta.toDouble(), threshold.toDouble()})) {
    return grad_input;
  }
  return TERN_FALLBACK(softplus_backward_grad_input, grad_output, self, beta, threshold,
                       grad_input);
}
TERN_ATEN_IMPL("softplus_backward.grad_input", SoftplusBackwardOut);

at::Tensor& EluBackwardOut(const at::Tensor& grad_output, const at::Scalar& alpha,
                           const at::Scalar& scale, const at::Scalar& input_scale, bool is_result,
                           const at::Tensor& self_or_result, at::Tensor& grad_input) {
  if (!is_result && scale.toDouble() == 1.0 && input_scale.toDouble() == 1.0 &&
      UnaryBackward("aten::elu_backward.grad_input", TERN_UNARY_ELU, grad_output, self_or_result,
                    grad_input, {alpha.toDouble()})) {
    return grad_input;
  }
  return TERN_FALLBACK(elu_backward_grad_input, grad_output, alpha, scale, input_scale, is_result,
                       self_or_result, grad_input);
}
TERN_ATEN_IMPL("elu_backward.grad_input", EluBackwardOut);

// x <= threshold ? 0 : grad (relu's backward with threshold 0; NaN passes grad).
at::Tensor& ThresholdBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                                 const at::Scalar& threshold, at::Tensor& grad_input) {
  // Computed in grad's own dtype (a select needs no opmath); self compared in its own.
  if (IsTern(self) && Supported(self.scalar_type()) &&
      RunFloatOp("aten::threshold_backward.grad_input", grad_input, {grad_output},
                 [&](FloatOp& f) {
                   Program& p = f.p;
                   const tern_dtype_t sd = *TD(self.scalar_type());
                   Operand mask = p.Temp(TERN_DTYPE_BOOL, f.shape);
                   Operand th = at::isFloatingType(self.scalar_type())
                                    ? p.Const(threshold.toDouble(), sd)
                                    : p.ConstInt(threshold.toLong(), sd);
                   p.Emit(TERN_OP_BINARY, {mask, p.In(self).Expand(f.shape), th.Expand(f.shape)},
                          {TERN_BINARY_LE});
                   p.Emit(TERN_OP_WHERE,
                          {p.Out(grad_input), mask,
                           p.Const(0.0, *TD(grad_output.scalar_type())).Expand(f.shape),
                           p.In(grad_output).Expand(f.shape)});
                 },
                 {self})) {
    return grad_input;
  }
  return TERN_FALLBACK(threshold_backward_grad_input, grad_output, self, threshold, grad_input);
}
TERN_ATEN_IMPL("threshold_backward.grad_input", ThresholdBackwardOut);

// grad * (1 - y) * y, in the CPU's order.
at::Tensor& SigmoidBackwardOut(const at::Tensor& grad_output, const at::Tensor& output,
                               at::Tensor& grad_input) {
  if (RunFloatOp("aten::sigmoid_backward.grad_input", grad_input, {grad_output, output},
                 [&](FloatOp& f) {
                   Operand G = f.In(grad_output), Y = f.In(output);
                   Operand one_minus = f.Temp(), prod = f.Temp();
                   f.p.Emit(TERN_OP_UNARY, {one_minus, Y}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
                   f.p.Emit(TERN_OP_BINARY, {prod, G, one_minus}, {TERN_BINARY_MUL});
                   f.EmitOut(TERN_OP_BINARY, {prod, Y}, {TERN_BINARY_MUL});
                 })) {
    return grad_input;
  }
  return TERN_FALLBACK(sigmoid_backward_grad_input, grad_output, output, grad_input);
}
TERN_ATEN_IMPL("sigmoid_backward.grad_input", SigmoidBackwardOut);

// grad * (1 - y * y).
at::Tensor& TanhBackwardOut(const at::Tensor& grad_output, const at::Tensor& output,
                            at::Tensor& grad_input) {
  if (RunFloatOp("aten::tanh_backward.grad_input", grad_input, {grad_output, output},
                 [&](FloatOp& f) {
                   Operand G = f.In(grad_output), Y = f.In(output);
                   Operand sq = f.Temp(), one_minus = f.Temp();
                   f.p.Emit(TERN_OP_BINARY, {sq, Y, Y}, {TERN_BINARY_MUL});
                   f.p.Emit(TERN_OP_UNARY, {one_minus, sq}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
                   f.EmitOut(TERN_OP_BINARY, {G, one_minus}, {TERN_BINARY_MUL});
                 })) {
    return grad_input;
  }
  return TERN_FALLBACK(tanh_backward_grad_input, grad_output, output, grad_input);
}
TERN_ATEN_IMPL("tanh_backward.grad_input", TanhBackwardOut);

// ---- Losses and dropout's backward -------------------------------------------------------

// (x - y)^2, reduced (reduction: 0 none, 1 mean, 2 sum).
at::Tensor& MseLossOut(const at::Tensor& self, const at::Tensor& target, int64_t reduction,
                       at::Tensor& out) {
  if (RunFloatOp(
          "aten::mse_loss.out", out, {self, target},
          [&](FloatOp& f) {
            Operand X = f.In(self), Y = f.In(target);
            Operand diff = f.Temp();
            f.p.Emit(TERN_OP_BINARY, {diff, X, Y}, {TERN_BINARY_SUB});
            if (reduction == 0) {
              f.EmitOut(TERN_OP_BINARY, {diff, diff}, {TERN_BINARY_MUL});
              return;
            }
            Operand sq = f.Temp();
            f.p.Emit(TERN_OP_BINARY, {sq, diff, diff}, {TERN_BINARY_MUL});
            // The 0-dim out as a keepdim view, the shape REDUCE writes.
            std::vector<int64_t> ones(f.shape.size(), 1);
            const Target t = BeginOut(f.p, out, f.cd, ones, f.p.Out(out).View(ones));
            f.p.Emit(TERN_OP_REDUCE, {t.write, sq},
                     {reduction == 1 ? TERN_REDUCE_MEAN : TERN_REDUCE_SUM});
            Finish(f.p, t);
          },
          {}, /*scalar_out=*/reduction != 0)) {
    return out;
  }
  return TERN_FALLBACK(mse_loss_out, self, target, reduction, out);
}
TERN_ATEN_IMPL("mse_loss.out", MseLossOut);

// norm * (x - y) * grad, norm = 2 / numel for the mean and 2 otherwise.
at::Tensor& MseLossBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                               const at::Tensor& target, int64_t reduction,
                               at::Tensor& grad_input) {
  const double norm = reduction == 1 ? 2.0 / static_cast<double>(self.numel()) : 2.0;
  if (RunFloatOp("aten::mse_loss_backward.grad_input", grad_input, {self, target, grad_output},
                 [&](FloatOp& f) {
                   Operand X = f.In(self), Y = f.In(target), G = f.In(grad_output);
                   Operand diff = f.Temp(), scaled = f.Temp();
                   f.p.Emit(TERN_OP_BINARY, {diff, X, Y}, {TERN_BINARY_SUB});
                   f.p.Emit(TERN_OP_BINARY, {scaled, f.Const(norm), diff}, {TERN_BINARY_MUL});
                   f.EmitOut(TERN_OP_BINARY, {scaled, G}, {TERN_BINARY_MUL});
                 })) {
    return grad_input;
  }
  return TERN_FALLBACK(mse_loss_backward_grad_input, grad_output, self, target, reduction,
                       grad_input);
}
TERN_ATEN_IMPL("mse_loss_backward.grad_input", MseLossBackwardOut);

at::Tensor MseLossBackward(const at::Tensor& grad_output, const at::Tensor& self,
                           const at::Tensor& target, int64_t reduction) {
  at::Tensor grad_input = at::empty_like(self);
  return MseLossBackwardOut(grad_output, self, target, reduction, grad_input);
}
TERN_ATEN_IMPL("mse_loss_backward", MseLossBackward);

// log_sigmoid, with the CPU's formula min(x, 0) - log1p(exp(-|x|)). The
// buffer the CPU's forward fills for its backward is empty here, as CUDA's:
// the backward below reads only x.
std::tuple<at::Tensor, at::Tensor> LogSigmoidForward(const at::Tensor& self) {
  at::Tensor out = at::empty_like(self);
  if (RunFloatOp("aten::log_sigmoid_forward", out, {self}, [&](FloatOp& f) {
        Operand X = f.In(self), low = f.Temp(), tail = f.Temp();
        f.p.Emit(TERN_OP_BINARY, {low, X, f.Const(0.0)}, {TERN_BINARY_MIN});
        f.p.Emit(TERN_OP_UNARY, {tail, X}, {TERN_UNARY_ABS});
        f.p.Emit(TERN_OP_UNARY, {tail, tail}, {TERN_UNARY_NEG});
        f.p.Emit(TERN_OP_UNARY, {tail, tail}, {TERN_UNARY_EXP});
        f.p.Emit(TERN_OP_UNARY, {tail, tail}, {TERN_UNARY_LOG1P});
        f.EmitOut(TERN_OP_BINARY, {low, tail}, {TERN_BINARY_SUB});
      })) {
    return {out, at::empty({0}, self.options())};
  }
  return TERN_FALLBACK(log_sigmoid_forward, self);
}
TERN_ATEN_IMPL("log_sigmoid_forward", LogSigmoidForward);

// d/dx log_sigmoid(x) = sigmoid(-x).
at::Tensor LogSigmoidBackward(const at::Tensor& grad_output, const at::Tensor& self,
                              const at::Tensor& buffer) {
  at::Tensor out = at::empty_like(self);
  if (RunFloatOp("aten::log_sigmoid_backward", out, {grad_output, self}, [&](FloatOp& f) {
        Operand G = f.In(grad_output), X = f.In(self), slope = f.Temp();
        f.p.Emit(TERN_OP_UNARY, {slope, X}, {TERN_UNARY_NEG});
        f.p.Emit(TERN_OP_UNARY, {slope, slope}, {TERN_UNARY_SIGMOID});
        f.EmitOut(TERN_OP_BINARY, {G, slope}, {TERN_BINARY_MUL});
      })) {
    return out;
  }
  return TERN_FALLBACK(log_sigmoid_backward, grad_output, self, buffer);
}
TERN_ATEN_IMPL("log_sigmoid_backward", LogSigmoidBackward);

// grad * mask * scale.
at::Tensor& NativeDropoutBackwardOut(const at::Tensor& grad_output, const at::Tensor& mask,
                                     double scale, at::Tensor& out) {
  if (IsTern(mask) && mask.scalar_type() == at::kBool &&
      RunFloatOp("aten::native_dropout_backward.out", out, {grad_output},
                 [&](FloatOp& f) {
                   Operand G = f.In(grad_output), M = f.In(mask);
                   Operand masked = f.Temp();
                   f.p.Emit(TERN_OP_BINARY, {masked, G, M}, {TERN_BINARY_MUL});
                   f.EmitOut(TERN_OP_BINARY, {masked, f.Const(scale)}, {TERN_BINARY_MUL});
                 },
                 {mask})) {
    return out;
  }
  return TERN_FALLBACK(native_dropout_backward_out, grad_output, mask, scale, out);
}
TERN_ATEN_IMPL("native_dropout_backward.out", NativeDropoutBackwardOut);

at::Tensor NativeDropoutBackward(const at::Tensor& grad_output, const at::Tensor& mask,
                                 double scale) {
  at::Tensor out = at::empty_like(grad_output);
  return NativeDropoutBackwardOut(grad_output, mask, scale, out);
}
TERN_ATEN_IMPL("native_dropout_backward", NativeDropoutBackward);

}  // namespace

}  // namespace torch_tern::native
