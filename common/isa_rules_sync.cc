// The rules of the Sync engine's instructions (sem_signal, sem_wait): docs/isa.md,
// "Instructions", "Sync". isa_rules.cc dispatches here after the checks
// every instruction shares (operand structure, segments, extents).
#include "common/isa_rules_internal.h"

namespace tern::isa::rules {

Status CheckSemaphore(Checker& c, bool wait) {
  TERN_RETURN_IF_ERROR(c.IntCount(2, 2, wait ? "semaphore, value" : "semaphore, increment"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t sem = c.ints()[0], v = c.ints()[1];
  if (sem < 0 || sem >= kMaxSemaphores) {
    return c.Fail("semaphore {} is out of range (0 to {})", sem, kMaxSemaphores - 1);
  }
  if (wait && (v < 0 || v > (int64_t{1} << 40))) return c.Fail("value {} must be in [0, 2^40]", v);
  if (!wait && (v < 1 || v > (int64_t{1} << 32)))
    return c.Fail("increment {} must be in [1, 2^32]", v);
  return OkStatus();
}

}  // namespace tern::isa::rules
