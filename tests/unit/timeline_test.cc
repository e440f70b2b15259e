// Timeline::Wait (common/timeline.h): reaches what is signalled, times out
// on what is not, and once its waits have been long it sleeps through most
// of the next one instead of polling all along (the waiting thread's CPU
// time stays well under the wait's length). Timeline::Nap: a signal does not
// end a nap, WakeNappers() does, and so does a waiter on the timeline whose
// producer naps. Runs under ThreadSanitizer.
#include "common/timeline.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <memory>
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

// Returns once a thread naps on `timeline`.
void AwaitNapper(const Timeline& timeline) {
  while (timeline.nappers() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

TEST(Timeline, ANapEndsAtItsTimeoutNotAtASignal) {
  Timeline doorbell;
  constexpr uint64_t kNapNs = 300'000'000;  // 0.3 s
  bool reached = false;
  uint64_t took = 0;
  std::thread napper([&] {
    const uint64_t start = WallNs();
    reached = doorbell.Nap(1, kNapNs);
    took = WallNs() - start;
  });
  AwaitNapper(doorbell);
  doorbell.Signal(1);  // a submission: the napping engine is not woken
  napper.join();
  EXPECT_TRUE(reached);
  EXPECT_GE(took, kNapNs * 9 / 10) << "the nap ended after " << took / 1000 << " us";
  // A nap for a value already reached returns at once; one for a value
  // never reached returns false at its timeout.
  EXPECT_TRUE(doorbell.Nap(1, kNapNs));
  EXPECT_FALSE(doorbell.Nap(2, 1'000'000));
}

TEST(Timeline, WakeNappersEndsANapAtOnce) {
  Timeline doorbell;
  bool reached = false;
  uint64_t took = 0;
  std::thread napper([&] {
    const uint64_t start = WallNs();
    reached = doorbell.Nap(1, 20'000'000'000ull);  // 20 s
    took = WallNs() - start;
  });
  AwaitNapper(doorbell);
  doorbell.Signal(1);
  doorbell.WakeNappers();
  napper.join();
  EXPECT_TRUE(reached);
  EXPECT_LT(took, 10'000'000'000ull) << "the nap ran to its timeout";
}

// The queue's arrangement: an engine naps on its doorbell and advances the
// completion timeline; a submission rings the doorbell without waking it,
// and a thread that waits for the completion ends the nap.
TEST(Timeline, AWaiterEndsTheNapOfTheEngineItWaitsFor) {
  auto doorbell = std::make_shared<Timeline>();
  Timeline completion;
  completion.set_producer_doorbell(doorbell);
  uint64_t napped = 0;
  std::thread engine([&] {
    const uint64_t start = WallNs();
    if (doorbell->Nap(1, 20'000'000'000ull)) completion.Signal(1);
    napped = WallNs() - start;
  });
  AwaitNapper(*doorbell);
  doorbell->Signal(1);
  EXPECT_TRUE(completion.Wait(1, 10'000'000'000ull)) << "the waiter did not end the nap";
  engine.join();
  EXPECT_LT(napped, 10'000'000'000ull);
}

}  // namespace
}  // namespace tern
