// The rules of the Vector engine's instructions (binary, where, reduce, softmax and the
// normalisations): docs/isa.md, "Instructions", "Vector". isa_rules.cc dispatches here after the
// checks every instruction shares (operand structure, segments, extents).
#include <array>
#include <cmath>
#include <initializer_list>

#include "common/isa_rules_internal.h"

namespace tern::isa::rules {
namespace {

bool IsComparison(int64_t fn) { return fn >= TERN_BINARY_EQ && fn <= TERN_BINARY_GE; }
bool IsLogical(int64_t fn) {
  return fn >= TERN_BINARY_LOGICAL_AND && fn <= TERN_BINARY_LOGICAL_XOR;
}

Status CheckSoftmaxInts(Checker& c, uint32_t rank) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 2, "axis, log"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], rank, "axis", true, &axis));
  if (c.ints().size() > 1 && c.ints()[1] != 0 && c.ints()[1] != 1) {
    return c.Fail("log (ints[1]) is {}; it must be 0 (softmax) or 1 (log-softmax)", c.ints()[1]);
  }
  return OkStatus();
}

// Normalisation over the last k axes of `in` (slot): checks ints[0] and
// returns k.
Status NormAxes(Checker& c, size_t in, uint32_t* k) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "number of normalized trailing axes"));
  const int64_t v = c.ints()[0];
  const uint32_t rank = c.Op(in).rank;
  if (v < 1 || v > rank) {
    return c.Fail("ints[0] (normalized axes) is {} but in is {}: it must be in [1, {}]", v,
                  c.Describe(in), rank);
  }
  *k = static_cast<uint32_t>(v);
  return OkStatus();
}

Status CheckEps(Checker& c) {
  TERN_RETURN_IF_ERROR(c.FloatCount(1, 1, "eps"));
  double eps = c.floats()[0];
  if (!(eps > 0) || !std::isfinite(eps))
    return c.Fail("eps (floats[0]) is {}; it must be finite and > 0", eps);
  return OkStatus();
}

// `slot` must have in's leading shape (all but the last k axes).
Status LeadingShape(const Checker& c, size_t slot, size_t in, uint32_t k) {
  if (!c.Has(slot)) return OkStatus();
  const OperandDesc& d = c.Op(slot);
  const OperandDesc& x = c.Op(in);
  bool ok = d.rank == x.rank - k;
  for (uint32_t i = 0; ok && i < d.rank; ++i) ok = d.shape[i] == x.shape[i];
  if (!ok) {
    return c.Fail("{} is {} but {} is {}: {} must have the leading shape {}", c.Name(slot),
                  c.Describe(slot), c.Name(in), c.Describe(in), c.Name(slot),
                  ShapeString(x.shape.data(), x.rank - k));
  }
  return c.FloatDtype(slot);
}

// `slot` must have in's trailing (normalized) shape.
Status TrailingShape(const Checker& c, size_t slot, size_t in, uint32_t k) {
  if (!c.Has(slot)) return OkStatus();
  const OperandDesc& d = c.Op(slot);
  const OperandDesc& x = c.Op(in);
  bool ok = d.rank == k;
  for (uint32_t i = 0; ok && i < k; ++i) ok = d.shape[i] == x.shape[x.rank - k + i];
  if (!ok) {
    return c.Fail("{} is {} but {} is {}: {} must have the normalized shape {}", c.Name(slot),
                  c.Describe(slot), c.Name(in), c.Describe(in), c.Name(slot),
                  ShapeString(x.shape.data() + x.rank - k, k));
  }
  return c.FloatDtype(slot);
}

// The four normalisations differ only in where their operands are:
//   layer_norm           [out, mean?, rstd?, in, weight?, bias?]
//   layer_norm_backward  [grad_in, grad_weight?, grad_bias?, grad_out, in, mean, rstd, weight?]
//   rms_norm             [out, rstd?, in, weight?]
//   rms_norm_backward    [grad_in, grad_weight?, grad_out, in, rstd, weight?]
// Slot 0 (out or grad_in) and the `like_in` slots (grad_out) are shaped and
// typed like `in`; `leading` slots (statistics) have in's leading shape,
// `trailing` ones (parameters and their gradients) its normalized shape.
struct NormSlots {
  size_t in;
  bool forward;  // takes eps in floats[0]; the backward ops take no floats
  std::initializer_list<size_t> like_in;
  std::initializer_list<size_t> leading;
  std::initializer_list<size_t> trailing;
};

Status CheckNorm(Checker& c, const NormSlots& slots) {
  uint32_t k = 0;
  TERN_RETURN_IF_ERROR(NormAxes(c, slots.in, &k));
  TERN_RETURN_IF_ERROR(slots.forward ? CheckEps(c) : c.FloatCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatDtype(slots.in));
  TERN_RETURN_IF_ERROR(c.SameShapeAndDtypeAs(0, slots.in));
  for (size_t slot : slots.like_in) TERN_RETURN_IF_ERROR(c.SameShapeAndDtypeAs(slot, slots.in));
  for (size_t slot : slots.leading) TERN_RETURN_IF_ERROR(LeadingShape(c, slot, slots.in, k));
  for (size_t slot : slots.trailing) TERN_RETURN_IF_ERROR(TrailingShape(c, slot, slots.in, k));
  return OkStatus();
}

}  // namespace

Status CheckBinary(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "tern_binary_fn_t"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t fn = c.ints()[0];
  if (BinaryFnName(fn) == nullptr) return c.Unsupported("unknown binary function {}", fn);
  c.SetPrefix(fmt::format("binary {}", BinaryFnName(fn)));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(2, 0));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 1));
  const tern_dtype_t dtype = c.Op(1).dtype;
  if (IsComparison(fn) || IsLogical(fn)) {
    TERN_RETURN_IF_ERROR(c.DtypeIs(0, TERN_DTYPE_BOOL));
  } else if (c.Op(0).dtype != dtype) {
    return c.Fail("out is {} but a is {}: out must have the inputs' dtype", c.Describe(0),
                  c.Describe(1));
  }
  switch (fn) {
    case TERN_BINARY_DIV:
    case TERN_BINARY_ATAN2:
    case TERN_BINARY_COPYSIGN:
      if (!IsFloat(dtype) && dtype != TERN_DTYPE_F64) {  // f64: CheckF64's functions
        return c.Fail(
            "a is {}; {} takes float dtypes (f32, bf16, f16){}", c.Describe(1), BinaryFnName(fn),
            fn == TERN_BINARY_DIV ? "; use floor_divide for integers or cast to a float dtype"
                                  : "");
      }
      break;
    case TERN_BINARY_BITWISE_AND:
    case TERN_BINARY_BITWISE_OR:
    case TERN_BINARY_BITWISE_XOR:
      if (IsFloat(dtype)) {
        return c.Fail("a is {}; {} takes integer or bool dtypes", c.Describe(1), BinaryFnName(fn));
      }
      break;
    case TERN_BINARY_ADD:
    case TERN_BINARY_SUB:
    case TERN_BINARY_MUL:
    case TERN_BINARY_POW:
    case TERN_BINARY_REMAINDER:
    case TERN_BINARY_FMOD:
    case TERN_BINARY_FLOOR_DIVIDE:
      if (IsBool(dtype)) {
        return c.Fail("a is {}; {} does not take bool (use the logical functions, or cast)",
                      c.Describe(1), BinaryFnName(fn));
      }
      break;
    default:
      break;
  }
  return OkStatus();
}

Status CheckWhere(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  for (size_t slot : {size_t{1}, size_t{2}, size_t{3}})
    TERN_RETURN_IF_ERROR(c.SameShapeAs(slot, 0));
  TERN_RETURN_IF_ERROR(c.DtypeIs(1, TERN_DTYPE_BOOL));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 0));
  return c.SameDtypeAs(3, 0);
}

Status CheckReduce(Checker& c) {
  if (c.ints().empty()) return c.Fail("takes ints [tern_reduce_fn_t, axes...], got none");
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t fn = c.ints()[0];
  if (ReduceFnName(fn) == nullptr) return c.Unsupported("unknown reduce function {}", fn);
  c.SetPrefix(fmt::format("reduce {}", ReduceFnName(fn)));
  const OperandDesc& out = c.Op(0);
  const OperandDesc& in = c.Op(1);
  if (c.ints().size() - 1 > in.rank) {
    return c.Fail("{} axes given but in is {} (rank {})", c.ints().size() - 1, c.Describe(1),
                  in.rank);
  }
  std::array<bool, TERN_MAX_RANK> reduced{};
  for (size_t i = 1; i < c.ints().size(); ++i) {
    uint32_t axis = 0;
    TERN_RETURN_IF_ERROR(c.Axis(c.ints()[i], in.rank, "axis", false, &axis));
    if (reduced[axis]) return c.Fail("axis {} is given twice", axis);
    reduced[axis] = true;
  }
  if (c.ints().size() == 1) reduced.fill(true);  // no axes: all of them
  if (out.rank != in.rank) {
    return c.Fail("out is {} but in is {}: out keeps in's rank with reduced axes of size 1",
                  c.Describe(0), c.Describe(1));
  }
  int64_t reduced_count = 1;
  for (uint32_t i = 0; i < in.rank; ++i) {
    int64_t expect = reduced[i] ? 1 : in.shape[i];
    if (out.shape[i] != expect) {
      return c.Fail("out is {} but in is {}: dimension {} must be {} ({})", c.Describe(0),
                    c.Describe(1), i, expect, reduced[i] ? "reduced" : "kept");
    }
    if (reduced[i]) reduced_count *= in.shape[i] == 0 ? 0 : 1;
  }
  switch (fn) {
    case TERN_REDUCE_SUM:
    case TERN_REDUCE_PROD:
    case TERN_REDUCE_MEAN:
      TERN_RETURN_IF_ERROR(c.NotBool(1));
      if (fn == TERN_REDUCE_MEAN) TERN_RETURN_IF_ERROR(c.FloatDtype(1));
      if (out.dtype != in.dtype && !(out.dtype == TERN_DTYPE_F32 && IsFloat(in.dtype))) {
        return c.Fail("out is {} but in is {}: out must have in's dtype (or f32 for bf16/f16)",
                      c.Describe(0), c.Describe(1));
      }
      break;
    case TERN_REDUCE_MAX:
    case TERN_REDUCE_MIN:
      TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 1));
      break;
    case TERN_REDUCE_ARGMAX:
    case TERN_REDUCE_ARGMIN:
      TERN_RETURN_IF_ERROR(c.DtypeIs(0, TERN_DTYPE_I64));
      break;
    default:  // ANY, ALL
      TERN_RETURN_IF_ERROR(c.DtypeIs(0, TERN_DTYPE_BOOL));
      break;
  }
  if (reduced_count == 0 && (fn == TERN_REDUCE_MAX || fn == TERN_REDUCE_MIN ||
                             fn == TERN_REDUCE_ARGMAX || fn == TERN_REDUCE_ARGMIN)) {
    return c.Fail("in is {}: a reduced axis has size 0 and {} of an empty set is undefined",
                  c.Describe(1), ReduceFnName(fn));
  }
  return OkStatus();
}

Status CheckSoftmax(Checker& c) {
  TERN_RETURN_IF_ERROR(CheckSoftmaxInts(c, c.Op(1).rank));
  TERN_RETURN_IF_ERROR(c.FloatDtype(1));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  return c.SameDtypeAs(0, 1);
}

Status CheckSoftmaxBackward(Checker& c) {
  TERN_RETURN_IF_ERROR(CheckSoftmaxInts(c, c.Op(0).rank));
  TERN_RETURN_IF_ERROR(c.FloatDtype(0));
  for (size_t slot : {size_t{1}, size_t{2}}) {
    TERN_RETURN_IF_ERROR(c.SameShapeAndDtypeAs(slot, 0));
  }
  return OkStatus();
}

Status CheckLayerNorm(Checker& c) {
  return CheckNorm(c, {.in = 3, .forward = true, .leading = {1, 2}, .trailing = {4, 5}});
}

Status CheckLayerNormBackward(Checker& c) {
  return CheckNorm(
      c, {.in = 4, .forward = false, .like_in = {3}, .leading = {5, 6}, .trailing = {1, 2, 7}});
}

Status CheckRmsNorm(Checker& c) {
  return CheckNorm(c, {.in = 2, .forward = true, .leading = {1}, .trailing = {3}});
}

Status CheckRmsNormBackward(Checker& c) {
  return CheckNorm(c,
                   {.in = 3, .forward = false, .like_in = {2}, .leading = {4}, .trailing = {1, 5}});
}

}  // namespace tern::isa::rules

namespace tern::isa::rules {

// ELEMENTWISE: slots 0..3 are out0..out3, slots 4..11 in0..in7; registers
// 0..7 are the inputs and 8 + i step i's result.
Status CheckElementwise(Checker& c) {
  constexpr size_t kFirstInput = TERN_PROGRAM_OUTPUTS;
  std::span<const int64_t> ints = c.ints();
  if (ints.empty())
    return c.Fail("takes ints [steps, steps x 5 ints, 4 output registers], got none");
  const int64_t steps = ints[0];
  if (steps < 1 || steps > TERN_PROGRAM_MAX_STEPS) {
    return c.Fail("has {} steps (ints[0]); a program has 1 to {}", steps, TERN_PROGRAM_MAX_STEPS);
  }
  const size_t expected = 1 + 5 * static_cast<size_t>(steps) + TERN_PROGRAM_OUTPUTS;
  if (ints.size() != expected) {
    return c.Fail(
        "has {} steps, so it takes {} ints (1 + 5 per step + {} output registers), got {}", steps,
        expected, TERN_PROGRAM_OUTPUTS, ints.size());
  }
  if (c.floats().size() > TERN_PROGRAM_MAX_FLOATS) {
    return c.Fail("has {} floats; a program has at most {}", c.floats().size(),
                  TERN_PROGRAM_MAX_FLOATS);
  }
  for (size_t slot = 1; slot < kFirstInput + TERN_PROGRAM_INPUTS; ++slot) {
    if (c.Has(slot)) TERN_RETURN_IF_ERROR(c.SameShapeAs(slot, 0));
  }
  for (size_t slot = 0; slot < kFirstInput + TERN_PROGRAM_INPUTS; ++slot) {
    if (c.Has(slot) && !IsFloat(c.Op(slot).dtype) && !IsBool(c.Op(slot).dtype)) {
      return c.Fail("{} is {}; programs take float (f32, bf16, f16) and bool tensors", c.Name(slot),
                    c.Describe(slot));
    }
  }
  // defined[r]: register r holds a value before the current step.
  std::array<bool, TERN_PROGRAM_INPUTS + TERN_PROGRAM_MAX_STEPS> defined{};
  for (size_t i = 0; i < TERN_PROGRAM_INPUTS; ++i) defined[i] = c.Has(kFirstInput + i);
  const size_t float_count = c.floats().size();
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t* step = &ints[1 + 5 * static_cast<size_t>(i)];
    const int64_t kind = step[0], fn = step[1];
    std::string name;
    switch (kind) {
      case TERN_STEP_CONSTANT:
        name = "constant";
        break;
      case TERN_STEP_UNARY:
        name = UnaryFnName(fn) ? fmt::format("unary {}", UnaryFnName(fn)) : "unary";
        break;
      case TERN_STEP_BINARY:
        name = BinaryFnName(fn) ? fmt::format("binary {}", BinaryFnName(fn)) : "binary";
        break;
      case TERN_STEP_WHERE:
        name = "where";
        break;
      default:
        return c.Unsupported(
            "step {} has kind {}, which this version does not know (0 constant, "
            "1 unary, 2 binary, 3 where)",
            i, kind);
    }
    const std::string where = fmt::format("step {} ({})", i, name);
    const int64_t registers = TERN_PROGRAM_INPUTS + i;
    auto reads = [&](int64_t field) -> Status {
      const int64_t r = step[field];
      if (r < 0 || r >= registers || !defined[static_cast<size_t>(r)]) {
        if (r >= 0 && r < TERN_PROGRAM_INPUTS) {
          return c.Fail("{} reads register {}, input in{}, which is absent", where, r, r);
        }
        return c.Fail(
            "{} reads register {} but only registers 0..{} exist before it "
            "(0..{} the inputs, then one per step)",
            where, r, registers - 1, TERN_PROGRAM_INPUTS - 1);
      }
      return OkStatus();
    };
    auto zero = [&](std::initializer_list<int> fields) -> Status {
      for (int field : fields) {
        if (step[field] != 0) {
          return c.Fail("{}: ints field {} of the step is {}; it must be 0", where, field,
                        step[field]);
        }
      }
      return OkStatus();
    };
    switch (kind) {
      case TERN_STEP_CONSTANT:
        TERN_RETURN_IF_ERROR(zero({1, 3, 4}));
        if (step[2] < 0 || static_cast<size_t>(step[2]) >= float_count) {
          return c.Fail("{} takes floats[{}] but the instruction has {} floats", where, step[2],
                        float_count);
        }
        break;
      case TERN_STEP_UNARY: {
        if (UnaryFnName(fn) == nullptr) {
          return c.Unsupported("{}: unknown unary function {}", where, fn);
        }
        if (fn == TERN_UNARY_BITWISE_NOT) {
          return c.Fail("{}: bitwise_not takes integers; programs compute in f32", where);
        }
        TERN_RETURN_IF_ERROR(reads(2));
        TERN_RETURN_IF_ERROR(zero({4}));
        const size_t params = UnaryParameterCount(fn);
        const int64_t first = step[3];
        if (params == 0) {
          TERN_RETURN_IF_ERROR(zero({3}));
        } else if (first < 0 || static_cast<size_t>(first) + params > float_count) {
          return c.Fail(
              "{} takes its {} parameters from floats[{}] but the instruction has {} "
              "floats",
              where, params, first, float_count);
        }
        Checker sub =
            c.WithFloats(c.floats().subspan(params == 0 ? 0 : static_cast<size_t>(first), params),
                         fmt::format("{}: {}", c.prefix(), where));
        TERN_RETURN_IF_ERROR(CheckUnaryFloats(sub, fn));
        break;
      }
      case TERN_STEP_BINARY:
        if (BinaryFnName(fn) == nullptr) {
          return c.Unsupported("{}: unknown binary function {}", where, fn);
        }
        if (fn == TERN_BINARY_BITWISE_AND || fn == TERN_BINARY_BITWISE_OR ||
            fn == TERN_BINARY_BITWISE_XOR) {
          return c.Fail("{}: bitwise functions take integers; programs compute in f32", where);
        }
        TERN_RETURN_IF_ERROR(reads(2));
        TERN_RETURN_IF_ERROR(reads(3));
        TERN_RETURN_IF_ERROR(zero({4}));
        break;
      case TERN_STEP_WHERE:
        TERN_RETURN_IF_ERROR(zero({1}));
        for (int field : {2, 3, 4}) TERN_RETURN_IF_ERROR(reads(field));
        break;
    }
    defined[static_cast<size_t>(registers)] = true;
  }
  const int64_t registers = TERN_PROGRAM_INPUTS + steps;
  for (size_t j = 0; j < TERN_PROGRAM_OUTPUTS; ++j) {
    const int64_t r = ints[1 + 5 * static_cast<size_t>(steps) + j];
    if (!c.Has(j)) {
      if (r != -1) {
        return c.Fail("out{} is absent but its register (ints[{}]) is {}; it must be -1", j,
                      1 + 5 * steps + static_cast<int64_t>(j), r);
      }
      continue;
    }
    if (r < 0 || r >= registers || !defined[static_cast<size_t>(r)]) {
      return c.Fail(
          "out{} is stored from register {}, which holds no value (registers 0..{}; "
          "absent inputs hold none)",
          j, r, registers - 1);
    }
  }
  return OkStatus();
}

Status CheckScan(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(2, 2, "tern_scan_fn_t, axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t fn = c.ints()[0];
  if (ScanFnName(fn) == nullptr) return c.Unsupported("unknown scan function {}", fn);
  c.SetPrefix(fmt::format("scan {}", ScanFnName(fn)));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[1], c.Op(1).rank, "axis", true, &axis));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(0, 1));
  TERN_RETURN_IF_ERROR(c.NotBool(0));
  const tern_dtype_t out = c.Op(0).dtype, in = c.Op(1).dtype;
  if (out == in) return OkStatus();
  // PyTorch sums and multiplies integers and bools into int64.
  const bool promotes = fn == TERN_SCAN_SUM || fn == TERN_SCAN_PROD;
  if (promotes && out == TERN_DTYPE_I64 && (IsInteger(in) || IsBool(in))) return OkStatus();
  return c.Fail("out is {} but in is {}: dtypes must be equal{} (CAST first)", c.Describe(0),
                c.Describe(1), promotes ? ", or out i64 with an integer or bool in" : "");
}

}  // namespace tern::isa::rules
