// The rules of the Scalar engine's instructions (unary, unary_backward): docs/isa.md,
// "Instructions", "Scalar". isa_rules.cc dispatches here after the checks
// every instruction shares (operand structure, segments, extents).
#include <cmath>

#include "common/isa_rules_internal.h"

namespace tern::isa::rules {
namespace {

enum class UnaryKind { kFloat, kNumeric, kAny, kIntegerOrBool };

UnaryKind UnaryKindOf(int64_t fn) {
  switch (fn) {
    case TERN_UNARY_NEG:
    case TERN_UNARY_ABS:
    case TERN_UNARY_RELU:
    case TERN_UNARY_FLOOR:
    case TERN_UNARY_CEIL:
    case TERN_UNARY_ROUND:
    case TERN_UNARY_TRUNC:
    case TERN_UNARY_SIGN:
    case TERN_UNARY_SQUARE:
    case TERN_UNARY_CLAMP:
      return UnaryKind::kNumeric;
    case TERN_UNARY_LOGICAL_NOT:
    case TERN_UNARY_ISNAN:
      return UnaryKind::kAny;
    case TERN_UNARY_BITWISE_NOT:
      return UnaryKind::kIntegerOrBool;
    default:
      return UnaryKind::kFloat;
  }
}

}  // namespace

// The floats of a unary function: [min, max] count; whether they must be
// finite.
Status CheckUnaryFloats(Checker& c, int64_t fn) {
  switch (fn) {
    case TERN_UNARY_LEAKY_RELU:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 1, "negative_slope, default 0.01"));
      return c.FiniteFloats("negative_slope");
    case TERN_UNARY_ELU:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 1, "alpha, default 1"));
      return c.FiniteFloats("alpha");
    case TERN_UNARY_POW_SCALAR:
      TERN_RETURN_IF_ERROR(c.FloatCount(1, 1, "exponent"));
      return c.FiniteFloats("exponent");
    case TERN_UNARY_CLAMP:
      TERN_RETURN_IF_ERROR(c.FloatCount(2, 2, "min, max"));
      for (size_t i = 0; i < 2; ++i) {
        if (std::isnan(c.floats()[i]))
          return c.Fail("floats[{}] ({}) is NaN", i, i == 0 ? "min" : "max");
      }
      return OkStatus();
    case TERN_UNARY_AFFINE:
      TERN_RETURN_IF_ERROR(c.FloatCount(2, 2, "scale, shift"));
      return c.FiniteFloats("scale, shift");
    case TERN_UNARY_SOFTPLUS:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "beta, threshold; default 1, 20"));
      TERN_RETURN_IF_ERROR(c.FiniteFloats("beta, threshold"));
      if (!c.floats().empty() && !(c.floats()[0] > 0)) {
        return c.Fail("beta (floats[0]) is {}; it must be > 0", c.floats()[0]);
      }
      return OkStatus();
    default:
      return c.FloatCount(0, 0, "none");
  }
}

Status CheckActivation(const Checker& c, int64_t fn, std::span<const double> parameters) {
  if (fn == TERN_ACTIVATION_NONE) {
    if (!parameters.empty()) {
      return c.Fail("has {} activation parameter floats but no activation (ints say -1)",
                    parameters.size());
    }
    return OkStatus();
  }
  if (UnaryFnName(fn) == nullptr) return c.Unsupported("unknown activation function {}", fn);
  if (fn == TERN_UNARY_ISNAN || fn == TERN_UNARY_LOGICAL_NOT || fn == TERN_UNARY_BITWISE_NOT) {
    return c.Fail("activation {} is not an activation: it does not map floats to floats",
                  UnaryFnName(fn));
  }
  if (parameters.size() != UnaryParameterCount(fn)) {
    return c.Fail("activation {} takes {} parameter floats after the instruction's own, got {}",
                  UnaryFnName(fn), UnaryParameterCount(fn), parameters.size());
  }
  Checker sub =
      c.WithFloats(parameters, fmt::format("{} activation {}", c.prefix(), UnaryFnName(fn)));
  return CheckUnaryFloats(sub, fn);
}

Status CheckUnary(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "tern_unary_fn_t"));
  const int64_t fn = c.ints()[0];
  if (UnaryFnName(fn) == nullptr) return c.Unsupported("unknown unary function {}", fn);
  c.SetPrefix(fmt::format("unary {}", UnaryFnName(fn)));
  TERN_RETURN_IF_ERROR(CheckUnaryFloats(c, fn));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  const tern_dtype_t dtype = c.Op(1).dtype;
  switch (UnaryKindOf(fn)) {
    case UnaryKind::kFloat:
      if (!IsFloat(dtype) && dtype != TERN_DTYPE_F64) {  // f64: CheckF64's functions
        return c.Fail("in is {}; {} takes float dtypes (f32, bf16, f16): cast first", c.Describe(1),
                      UnaryFnName(fn));
      }
      break;
    case UnaryKind::kNumeric:
      TERN_RETURN_IF_ERROR(c.NotBool(1));
      break;
    case UnaryKind::kIntegerOrBool:
      if (IsFloat(dtype))
        return c.Fail("in is {}; bitwise_not takes integer or bool dtypes", c.Describe(1));
      break;
    case UnaryKind::kAny:
      break;
  }
  if (fn == TERN_UNARY_LOGICAL_NOT || fn == TERN_UNARY_ISNAN) return c.DtypeIs(0, TERN_DTYPE_BOOL);
  return c.SameDtypeAs(0, 1);
}

Status CheckUnaryBackward(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "tern_unary_fn_t"));
  const int64_t fn = c.ints()[0];
  if (UnaryFnName(fn) == nullptr) return c.Unsupported("unknown unary function {}", fn);
  c.SetPrefix(fmt::format("unary_backward {}", UnaryFnName(fn)));
  if (fn == TERN_UNARY_LOGICAL_NOT || fn == TERN_UNARY_ISNAN || fn == TERN_UNARY_BITWISE_NOT) {
    return c.Fail("{} has no gradient", UnaryFnName(fn));
  }
  TERN_RETURN_IF_ERROR(CheckUnaryFloats(c, fn));
  TERN_RETURN_IF_ERROR(c.FloatDtype(2));
  for (size_t slot : {size_t{0}, size_t{1}}) {
    TERN_RETURN_IF_ERROR(c.SameShapeAndDtypeAs(slot, 2));
  }
  return OkStatus();
}

}  // namespace tern::isa::rules

namespace tern::isa {

size_t UnaryParameterCount(int64_t fn) {
  switch (fn) {
    case TERN_UNARY_LEAKY_RELU:
    case TERN_UNARY_ELU:
    case TERN_UNARY_POW_SCALAR:
      return 1;
    case TERN_UNARY_CLAMP:
    case TERN_UNARY_AFFINE:
    case TERN_UNARY_SOFTPLUS:
      return 2;
    default:
      return 0;
  }
}

}  // namespace tern::isa
