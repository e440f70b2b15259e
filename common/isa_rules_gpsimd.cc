// The rules of the GpSimd engine's instructions (the index ops, iota, random): docs/isa.md,
// "Instructions", "GpSimd". isa_rules.cc dispatches here after the checks
// every instruction shares (operand structure, segments, extents).
#include <array>
#include <cmath>

#include "common/isa_rules_internal.h"

namespace tern::isa::rules {
namespace {

// out.shape == table[:axis] + indices.shape + table[axis+1:]
Status CheckIndexedShape(const Checker& c, size_t table, size_t indices, size_t gathered,
                         uint32_t axis) {
  const OperandDesc& t = c.Op(table);
  const OperandDesc& idx = c.Op(indices);
  const OperandDesc& g = c.Op(gathered);
  std::array<int64_t, 3 * TERN_MAX_RANK> expect{};
  uint32_t n = 0;
  for (uint32_t i = 0; i < axis; ++i) expect[n++] = t.shape[i];
  for (uint32_t i = 0; i < idx.rank; ++i) expect[n++] = idx.shape[i];
  for (uint32_t i = axis + 1; i < t.rank; ++i) expect[n++] = t.shape[i];
  bool ok = g.rank == n;
  for (uint32_t i = 0; ok && i < n; ++i) ok = g.shape[i] == expect[i];
  if (!ok) {
    return c.Fail("{} is {} but {} is {} and {} is {} along axis {}: {} must be {}",
                  c.Name(gathered), c.Describe(gathered), c.Name(table), c.Describe(table),
                  c.Name(indices), c.Describe(indices), axis, c.Name(gathered),
                  ShapeString(expect.data(), n));
  }
  return OkStatus();
}

}  // namespace

Status CheckGather(Checker& c, bool scatter, bool accumulate) {
  // gather [out, table, indices]; scatter(_add) [out, indices, src] (out is the table).
  const size_t table = scatter ? 0 : 1, indices = scatter ? 1 : 2, gathered = scatter ? 2 : 0;
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  if (c.Op(table).rank == 0)
    return c.Fail("{} is {}; it must have rank 1 or more", c.Name(table), c.Describe(table));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], c.Op(table).rank, "axis", false, &axis));
  TERN_RETURN_IF_ERROR(c.IndexDtype(indices));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(gathered, table));
  if (scatter && accumulate) TERN_RETURN_IF_ERROR(c.NotBool(0));
  return CheckIndexedShape(c, table, indices, gathered, axis);
}

Status CheckTakeAlongAxis(Checker& c, bool scatter, bool accumulate) {
  // take [out, in, indices]: out.shape == indices.shape.
  // scatter [out, indices, src]: src.shape == indices.shape.
  const size_t table = scatter ? 0 : 1, indices = scatter ? 1 : 2, values = scatter ? 2 : 0;
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const OperandDesc& t = c.Op(table);
  const OperandDesc& idx = c.Op(indices);
  if (t.rank == 0)
    return c.Fail("{} is {}; it must have rank 1 or more", c.Name(table), c.Describe(table));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], t.rank, "axis", false, &axis));
  TERN_RETURN_IF_ERROR(c.IndexDtype(indices));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(values, table));
  if (scatter && accumulate) TERN_RETURN_IF_ERROR(c.NotBool(0));
  if (idx.rank != t.rank) {
    return c.Fail("{} is {} but {} is {}: ranks must be equal", c.Name(indices),
                  c.Describe(indices), c.Name(table), c.Describe(table));
  }
  TERN_RETURN_IF_ERROR(c.SameShapeAs(values, indices));
  for (uint32_t d = 0; d < t.rank; ++d) {
    if (d != axis && idx.shape[d] > t.shape[d]) {
      return c.Fail("{} is {} but {} is {}: dimension {} of the indices ({}) exceeds {} ({})",
                    c.Name(indices), c.Describe(indices), c.Name(table), c.Describe(table), d,
                    idx.shape[d], c.Name(table), t.shape[d]);
    }
  }
  return OkStatus();
}

Status CheckIota(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "start, step; default 0, 1"));
  TERN_RETURN_IF_ERROR(c.FiniteFloats("start, step"));
  TERN_RETURN_IF_ERROR(c.NotBool(0));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], c.Op(0).rank, "axis", true, &axis));
  if (IsInteger(c.Op(0).dtype)) {
    for (size_t i = 0; i < c.floats().size(); ++i) {
      double v = c.floats()[i];
      if (v != std::trunc(v) || std::fabs(v) > 9007199254740992.0) {
        return c.Fail(
            "floats[{}] is {}; an integer iota takes integral start and step (|v| <= 2^53)", i, v);
      }
    }
  }
  return OkStatus();
}

Status CheckRandom(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(3, 3, "tern_random_fn_t, seed, offset"));
  const int64_t fn = c.ints()[0];
  if (RandomFnName(fn) == nullptr) return c.Unsupported("unknown random function {}", fn);
  c.SetPrefix(fmt::format("random {}", RandomFnName(fn)));
  if (c.ints()[2] < 0) return c.Fail("offset (ints[2]) is {}; it must be >= 0", c.ints()[2]);
  const tern_dtype_t dtype = c.Op(0).dtype;
  switch (fn) {
    case TERN_RANDOM_UNIFORM: {
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "low, high; default 0, 1"));
      TERN_RETURN_IF_ERROR(c.FiniteFloats("low, high"));
      TERN_RETURN_IF_ERROR(c.NotBool(0));
      double low = c.floats().size() > 0 ? c.floats()[0] : 0.0;
      double high = c.floats().size() > 1 ? c.floats()[1] : 1.0;
      if (IsInteger(dtype)) {
        if (low != std::trunc(low) || high != std::trunc(high)) {
          return c.Fail("an integer uniform takes integral low and high, got [{}, {})", low, high);
        }
        if (!(low < high)) return c.Fail("low {} must be < high {}", low, high);
        if (high - low > 4294967296.0) {
          return c.Fail(
              "the range [{}, {}) is wider than 2^32 values, the most an integer uniform draws",
              low, high);
        }
        double lo = dtype == TERN_DTYPE_I8    ? -128.0
                    : dtype == TERN_DTYPE_I32 ? -2147483648.0
                                              : -9223372036854775808.0;
        double hi = dtype == TERN_DTYPE_I8    ? 128.0
                    : dtype == TERN_DTYPE_I32 ? 2147483648.0
                                              : 9223372036854775808.0;
        if (low < lo || high > hi) {
          return c.Fail("the range [{}, {}) does not fit out's dtype {}", low, high,
                        DTypeName(dtype));
        }
      } else if (!(low <= high)) {
        return c.Fail("low {} must be <= high {}", low, high);
      }
      return OkStatus();
    }
    case TERN_RANDOM_NORMAL:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "mean, std; default 0, 1"));
      TERN_RETURN_IF_ERROR(c.FiniteFloats("mean, std"));
      TERN_RETURN_IF_ERROR(c.FloatDtype(0));
      if (c.floats().size() > 1 && !(c.floats()[1] >= 0))
        return c.Fail("std {} must be >= 0", c.floats()[1]);
      return OkStatus();
    default: {  // BERNOULLI
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 1, "p; default 0.5"));
      double p = c.floats().empty() ? 0.5 : c.floats()[0];
      if (!(p >= 0 && p <= 1)) return c.Fail("p {} must be in [0, 1]", p);
      return OkStatus();
    }
  }
}

Status CheckSort(Checker& c, bool topk) {
  // [values, indices, in]
  TERN_RETURN_IF_ERROR(c.IntCount(2, 2, topk ? "axis, largest" : "axis, descending"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const OperandDesc& in = c.Op(2);
  const OperandDesc& values = c.Op(0);
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], in.rank, "axis", true, &axis));
  const int64_t order = c.ints()[1];
  if (order != 0 && order != 1) {
    return c.Fail("ints[1] ({}) is {}; it must be 0 or 1", topk ? "largest" : "descending", order);
  }
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 2));
  TERN_RETURN_IF_ERROR(c.DtypeIs(1, TERN_DTYPE_I64));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  if (!topk || in.rank == 0) return c.SameShapeAs(0, 2);
  bool ok = values.rank == in.rank;
  for (uint32_t d = 0; ok && d < in.rank; ++d) {
    ok = d == axis ? values.shape[d] <= in.shape[d] : values.shape[d] == in.shape[d];
  }
  if (!ok) {
    return c.Fail(
        "values is {} but in is {}: values must have in's shape except along axis {}, where it "
        "holds k <= {} elements",
        c.Describe(0), c.Describe(2), axis, in.shape[axis]);
  }
  return OkStatus();
}

}  // namespace tern::isa::rules
