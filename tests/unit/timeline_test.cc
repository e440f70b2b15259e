// Timeline::Wait (common/timeline.h): reaches what is signalled, times out
// on what is not, and once its waits have been long it sleeps through most
// of the next one instead of polling all along (the waiting thread's CPU
// time stays well under the wait's length). Runs under ThreadSanitizer.
#include "common/timeline.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <thread>

namespace tern {
namespace {

uint64_t ThreadCpuNs() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t WallNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

TEST(Timeline, WaitReachesWhatIsSignalledAndTimesOutOtherwise) {
  Timeline timeline;
  EXPECT_TRUE(timeline.Wait(0, 0));
  EXPECT_FALSE(timeline.Wait(1, 1'000'000));  // 1 ms, nothing signals
  std::thread signaler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    timeline.Signal(1);
  });
  EXPECT_TRUE(timeline.Wait(1, UINT64_MAX));
  signaler.join();
  EXPECT_EQ(timeline.value(), 1u);
}

// Waits of about 0.6 ms each, one after another (longer than
// the 400 us from which a wait sleeps first): after the first few the waiter
// sleeps until shortly before the value is due, so it spends a small part
// of each wait on its CPU. Polling all along, it would spend about all of
// it (it yields, but a yield returns at once on an idle CPU).
TEST(Timeline, LongWaitsSleepInsteadOfPolling) {
  Timeline timeline;
  constexpr int kWaits = 16;
  constexpr auto kGap = std::chrono::microseconds(600);
  std::thread signaler([&] {
    for (uint64_t v = 1; v <= kWaits; ++v) {
      std::this_thread::sleep_for(kGap);
      timeline.Signal(v);
    }
  });
  uint64_t cpu_late = 0, wall_late = 0;
  for (uint64_t v = 1; v <= kWaits; ++v) {
    const uint64_t cpu0 = ThreadCpuNs(), wall0 = WallNs();
    ASSERT_TRUE(timeline.Wait(v, 10'000'000'000ull)) << "wait " << v;
    if (v > kWaits / 2) {  // the typical wait has been learnt
      cpu_late += ThreadCpuNs() - cpu0;
      wall_late += WallNs() - wall0;
    }
  }
  signaler.join();
  EXPECT_LT(cpu_late, wall_late / 3)
      << "CPU " << cpu_late / 1000 << " us over " << wall_late / 1000 << " us of waiting";
}

}  // namespace
}  // namespace tern
