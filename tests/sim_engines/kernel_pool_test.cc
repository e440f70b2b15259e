// The kernel pool (driver_shim/sim/engines/kernel_pool.h): every part runs
// once, on more than one thread, and calls from several threads at once or
// from inside a part never lose or repeat a part. Runs under ThreadSanitizer.
#include "driver_shim/sim/engines/kernel_pool.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/sanitizers.h"

namespace tern::sim::kernels {
namespace {

// Pools live as long as the process: their helpers never exit.
KernelPool& PoolOf(int threads) {
  static KernelPool* two = new KernelPool(2);
  static KernelPool* three = new KernelPool(3);
  return threads == 2 ? *two : *three;
}

TEST(KernelPool, EveryPartRunsOnce) {
  KernelPool& pool = PoolOf(3);
  EXPECT_EQ(pool.threads(), 3);
  for (const int parts : {1, 2, 3, 7, 64, 1000}) {
    std::vector<std::atomic<int>> runs(parts);
    pool.Run(parts, [&](int part, int slot) {
      ASSERT_GE(slot, 0);
      ASSERT_LT(slot, 3);
      runs[part].fetch_add(1, std::memory_order_relaxed);
    });
    for (int part = 0; part < parts; ++part)
      ASSERT_EQ(runs[part].load(), 1) << part << "/" << parts;
  }
}

// The part that the calling thread runs first waits until another part has
// started on another thread: only a helper can run it (the caller is busy),
// so this fails if the helpers never come. The first round starts the
// helpers; later rounds find them asleep, past their spin, and wake them.
TEST(KernelPool, HelpersTakeParts) {
  KernelPool& pool = PoolOf(2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 3; ++round) {
    if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<bool> helper_ran{false};
    std::atomic<int> helper_slot{-1};
    pool.Run(2, [&](int /*part*/, int slot) {
      if (std::this_thread::get_id() != caller) {
        helper_slot = slot;
        helper_ran = true;
        return;
      }
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!helper_ran && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
    // (A helper may take both parts before the caller takes one.)
    EXPECT_TRUE(helper_ran) << "round " << round << ": no helper took a part within 20 s";
    EXPECT_EQ(helper_slot.load(), 1) << "round " << round;
  }
}

// Several threads call at once; one holds the pool, the others run their
// parts themselves; parts call Run again (inline while their call holds the
// pool).
TEST(KernelPool, ConcurrentAndNestedCalls) {
  KernelPool& pool = PoolOf(3);
  constexpr int kCallers = 4, kRounds = 200, kParts = 8, kInner = 3;
  std::vector<std::thread> callers;
  std::atomic<bool> failed{false};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<int> outer(kParts, 0), inner(kParts * kInner, 0);
        pool.Run(kParts, [&](int part, int /*slot*/) {
          ++outer[part];
          pool.Run(kInner, [&](int i, int /*slot*/) { ++inner[part * kInner + i]; });
        });
        for (int v : outer) failed = failed || v != 1;
        for (int v : inner) failed = failed || v != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_FALSE(failed);
}

// A forked child has none of the parent's helpers; its pool starts afresh
// and every part still runs.
TEST(KernelPool, WorksInAForkedChild) {
#if TERN_UNDER_TSAN
  GTEST_SKIP() << "ThreadSanitizer cannot start threads after a multi-threaded fork";
#endif
  KernelPool& pool = KernelPool::Instance();
  std::atomic<int> runs{0};
  pool.Run(16, [&](int, int) { runs.fetch_add(1); });
  ASSERT_EQ(runs.load(), 16);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int> child_runs{0};
    for (int round = 0; round < 50; ++round) {
      pool.Run(16, [&](int, int) { child_runs.fetch_add(1); });
    }
    _exit(child_runs.load() == 16 * 50 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace tern::sim::kernels
