// The rules of the Collective engine's instructions (all_reduce): docs/isa.md,
// "Instructions", "Collective". isa_rules.cc dispatches here after the checks
// every instruction shares (operand structure, segments, extents).
#include "common/isa_rules_internal.h"

namespace tern::isa::rules {

Status CheckAllReduce(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 1, "tern_reduce_fn_t, default sum"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  if (!c.ints().empty()) {
    int64_t fn = c.ints()[0];
    if (ReduceFnName(fn) == nullptr) return c.Unsupported("unknown reduce function {}", fn);
    if (fn != TERN_REDUCE_SUM && fn != TERN_REDUCE_MEAN && fn != TERN_REDUCE_MAX &&
        fn != TERN_REDUCE_MIN && fn != TERN_REDUCE_PROD) {
      return c.Fail("reduce function {} is not a collective reduction (sum, mean, max, min, prod)",
                    ReduceFnName(fn));
    }
  }
  TERN_RETURN_IF_ERROR(c.SameShapeAndDtypeAs(1, 0));
  return c.NotBool(0);
}

}  // namespace tern::isa::rules
