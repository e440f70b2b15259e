// The rules of the DMA engine's instructions (copy, cast, fill): docs/isa.md,
// "Instructions", "DMA". isa_rules.cc dispatches here after the checks
// every instruction shares (operand structure, segments, extents).
#include <cstdint>
#include <limits>

#include "common/isa_rules_internal.h"

namespace tern::isa::rules {

Status CheckCopy(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  return c.SameShapeAndDtypeAs(1, 0);
}

Status CheckCast(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  return c.SameShapeAs(1, 0);
}

Status CheckFill(Checker& c) {
  tern_dtype_t dtype = c.Op(0).dtype;
  if (IsFloat(dtype) || dtype == TERN_DTYPE_F64) {
    TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "a float dtype takes its value from floats[0]"));
    return c.FloatCount(1, 1, "value");
  }
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "an integer or bool dtype takes its value from ints[0]"));
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "value"));
  int64_t v = c.ints()[0];
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  if (dtype == TERN_DTYPE_I8) lo = -128, hi = 127;
  if (dtype == TERN_DTYPE_I32)
    lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  if (dtype == TERN_DTYPE_BOOL) lo = 0, hi = 1;
  if (v < lo || v > hi) {
    return c.Fail("value {} does not fit dst's dtype {} ({} to {})", v, DTypeName(dtype), lo, hi);
  }
  return OkStatus();
}

}  // namespace tern::isa::rules
