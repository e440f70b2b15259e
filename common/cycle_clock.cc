#include "common/cycle_clock.h"

#include <fstream>
#include <mutex>
#include <string>

namespace tern {
namespace {

// The kernel picks "tsc" as its clocksource only after checking that the
// counter runs at a constant rate, keeps running in sleep states and agrees
// across CPUs: then it is safe for us too.
bool KernelClocksourceIsTsc() {
  std::ifstream file("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(file >> name) && name == "tsc";
}

}  // namespace

void CycleClock::Init() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__x86_64__)
    if (!KernelClocksourceIsTsc()) return;
    // Spin for 200 us reading both clocks; the error is about the jitter of
    // one clock_gettime call (~25 ns) over the window: ~1e-4.
    const uint64_t ns_start = MonotonicNs();
    const uint64_t ticks_start = __rdtsc();
    uint64_t ns_end = ns_start;
    uint64_t ticks_end = ticks_start;
    while (ns_end - ns_start < 200'000) {
      ticks_end = __rdtsc();
      ns_end = MonotonicNs();
    }
    if (ticks_end <= ticks_start) return;
    ns_per_tick_ =
        static_cast<double>(ns_end - ns_start) / static_cast<double>(ticks_end - ticks_start);
    use_tsc_ = true;
#endif
  });
}

}  // namespace tern
