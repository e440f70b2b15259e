// The kernel pool (driver_shim/sim/engines/kernel_pool.h): every part runs
// once, on more than one thread, and calls from several threads at once or
// from inside a part never lose or repeat a part. Runs under ThreadSanitizer.
#include "driver_shim/sim/engines/kernel_pool.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/idle_work.h"
#include "common/sanitizers.h"
#include "common/timeline.h"
#include "driver_shim/sim/engines/run_instruction.h"

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
    pool.Run(parts, [&](int part) { runs[part].fetch_add(1, std::memory_order_relaxed); });
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
    pool.Run(2, [&](int /*part*/) {
      if (std::this_thread::get_id() != caller) {
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
        pool.Run(kParts, [&](int part) {
          ++outer[part];
          pool.Run(kInner, [&](int i) { ++inner[part * kInner + i]; });
        });
        for (int v : outer) failed = failed || v != 1;
        for (int v : inner) failed = failed || v != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_FALSE(failed);
}

// A thread polling for a value (PollAtLeast, as tern_queue_synchronize
// polls) takes a part of a job opened for the awake hands only: the caller's
// part waits until another thread ran one, and the pool's helpers are never
// woken for such a job, so only the poller can.
TEST(KernelPool, APollingThreadTakesParts) {
  KernelPool& pool = KernelPool::Instance();
  ASSERT_GT(pool.threads(), 1) << "this host gives the pool one thread (TERN_SIM_KERNEL_THREADS?)";
  std::atomic<uint64_t> never{0};
  std::atomic<bool> stop{false};
  // The process's pool registers itself as the idle work when it is made.
  std::thread poller([&] {
    while (!stop) (void)PollAtLeast(never, 1, 200'000);
  });
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 20; ++round) {
    std::atomic<bool> other_ran{false};
    std::atomic<int> runs{0};
    pool.Run(
        2,
        [&](int /*part*/) {
          runs.fetch_add(1);
          if (std::this_thread::get_id() != caller) {
            other_ran = true;
            return;
          }
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!other_ran && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        },
        KernelPool::Wake::kAwakeHandsOnly);
    EXPECT_EQ(runs.load(), 2) << "round " << round;
    ASSERT_TRUE(other_ran) << "round " << round << ": the polling thread took no part in 10 s";
  }
  stop = true;
  poller.join();
}

// A job that woke the helpers is theirs: a poller takes none of its parts.
TEST(KernelPool, PollersLeaveAJobThatWokeTheHelpers) {
  KernelPool& pool = PoolOf(2);
  std::atomic<int> helped{0};
  pool.Run(
      4, [&](int) { helped.fetch_add(pool.HelpWithOpenJob() ? 1 : 0); },
      KernelPool::Wake::kSleepingHelpers);
  EXPECT_EQ(helped.load(), 0);
}

// With no hand awake, a job for the awake hands only runs every part on the
// calling thread, and nothing else takes one.
TEST(KernelPool, AJobForAwakeHandsRunsWithoutThem) {
  KernelPool& pool = PoolOf(2);
  pool.Run(2, [](int) {});                                     // starts the helpers
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past their spin: asleep
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> runs{0}, elsewhere{0};
    pool.Run(
        8,
        [&](int) {
          runs.fetch_add(1);
          if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
        },
        KernelPool::Wake::kAwakeHandsOnly);
    EXPECT_EQ(runs.load(), 8);
    EXPECT_EQ(elsewhere.load(), 0) << "a sleeping helper was woken";
  }
}

// A job for "pollers, else the sleeping helpers" goes to a thread polling
// for a completion when one takes a part while the caller runs its first,
// without waking the helpers (they sleep here: the other parts are the
// poller's every round); it wakes the helpers when nobody polls, and when
// the pollers took nothing meanwhile (one that shares the caller's CPU, or
// waits for a CPU, is no second hand).
TEST(KernelPool, AJobForPollersElseHelpersWakesTheHelpersOnlyWithoutAPollerThatHelps) {
  KernelPool& pool = KernelPool::Instance();
  ASSERT_GT(pool.threads(), 1) << "this host gives the pool one thread (TERN_SIM_KERNEL_THREADS?)";
  pool.Run(2, [](int) {});  // starts the helpers
  const std::thread::id caller = std::this_thread::get_id();
  // Runs a job of three parts whose first part on the caller lasts until
  // another thread ran a part, or `first_part_at_most`; returns the thread
  // that ran a part the caller did not (the caller's id if none did). Any
  // later part of the caller's waits until another thread ran one (so this
  // fails if nobody comes).
  auto other_thread = [&](std::chrono::milliseconds first_part_at_most) {
    std::atomic<bool> other_ran{false};
    std::atomic<std::thread::id> other{caller};
    int callers_parts = 0;  // the caller's own
    pool.Run(
        3,
        [&](int) {
          if (std::this_thread::get_id() != caller) {
            other = std::this_thread::get_id();
            other_ran = true;
            return;
          }
          const auto until = std::chrono::steady_clock::now() +
                             (callers_parts++ == 0 ? std::chrono::milliseconds(first_part_at_most)
                                                   : std::chrono::milliseconds(10'000));
          while (!other_ran && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        },
        KernelPool::Wake::kPollersElseSleepingHelpers);
    return other.load();
  };
  std::atomic<uint64_t> never{0};
  std::atomic<bool> stop{false};
  std::atomic<std::thread::id> poller_id{};
  std::thread poller([&] {
    poller_id = std::this_thread::get_id();
    // Counted as a poller from here on, not only inside each PollAtLeast:
    // between two of them it counted as none, and a caller that looked just
    // then woke the helpers (seen once under ThreadSanitizer, a test beside).
    const IdlePoller counted;
    while (!stop) (void)PollAtLeast(never, 1, 500'000);
  });
  for (int round = 0; round < 10; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the helpers sleep
    while (IdlePollers() == 0) std::this_thread::yield();
    const uint64_t wake_ups = pool.helper_wake_ups();
    const std::thread::id other = other_thread(std::chrono::milliseconds(10'000));
    ASSERT_NE(other, caller) << "round " << round << ": no other thread took a part in 10 s";
    EXPECT_EQ(pool.helper_wake_ups(), wake_ups) << "round " << round << ": a helper was woken";
    EXPECT_EQ(other, poller_id.load()) << "round " << round << ": a helper took a part";
  }
  stop = true;
  poller.join();
  {
    // Counted as a poller but taking nothing, as one without a CPU would.
    std::atomic<bool> counted{false}, release{false};
    std::thread stalled([&] {
      const IdlePoller idle;
      counted = true;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    while (!counted) std::this_thread::yield();
    for (int round = 0; round < 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const uint64_t wake_ups = pool.helper_wake_ups();
      const std::thread::id other = other_thread(std::chrono::milliseconds(2));
      EXPECT_NE(other, caller) << "round " << round << ": the sleeping helpers were not woken";
      EXPECT_GT(pool.helper_wake_ups(), wake_ups) << "round " << round;
    }
    release = true;
    stalled.join();
  }
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(IdlePollers(), 0);
    const uint64_t wake_ups = pool.helper_wake_ups();
    EXPECT_NE(other_thread(std::chrono::milliseconds(0)), caller)
        << "round " << round << ": the sleeping helpers were not woken";
    EXPECT_GT(pool.helper_wake_ups(), wake_ups) << "round " << round;
  }
}

// PollAtLeast runs the registered idle work between its looks, and none once
// it is unregistered.
TEST(IdleWork, PollAtLeastRunsTheRegisteredWork) {
  static std::atomic<int> calls{0};
  (void)KernelPool::Instance();  // registers the pool's work, replaced below
  SetIdleWork([] {
    calls.fetch_add(1);
    return false;
  });
  std::atomic<uint64_t> never{0};
  EXPECT_FALSE(PollAtLeast(never, 1, 100'000));
  EXPECT_GT(calls.load(), 0);
  SetIdleWork(nullptr);
  const int before = calls.load();
  EXPECT_FALSE(PollAtLeast(never, 1, 100'000));
  EXPECT_EQ(calls.load(), before);
  SetIdleWork([] { return KernelPool::Instance().HelpWithOpenJob(); });  // as the pool does
}

// A forked child has none of the parent's helpers; its pool starts afresh
// and every part still runs.
// The pool's size: TERN_SIM_KERNEL_THREADS when it holds a count, else the
// host's CPUs shared among the ranks a launcher started on the host.
TEST(KernelThreads, RanksALauncherStartedShareTheHost) {
  EXPECT_EQ(ChooseKernelThreads(2, nullptr, 1), 2);
  EXPECT_EQ(ChooseKernelThreads(2, nullptr, 2), 1);
  EXPECT_EQ(ChooseKernelThreads(16, nullptr, 4), 4);
  EXPECT_EQ(ChooseKernelThreads(16, nullptr, 3), 5);
  EXPECT_EQ(ChooseKernelThreads(2, nullptr, 8), 1) << "never fewer than one";
  EXPECT_EQ(ChooseKernelThreads(2, "3", 2), 3) << "an explicit count wins";
  EXPECT_EQ(ChooseKernelThreads(2, "three", 2), 1) << "not a count: the default";
  EXPECT_EQ(ChooseKernelThreads(2, "", 1), 2);
  EXPECT_EQ(ChooseKernelThreads(2, "0", 1), 2);
}

// Unsets the launchers' variables for a test and puts back what they held.
class LauncherEnvironmentCleared {
 public:
  LauncherEnvironmentCleared() {
    for (const char* name : kNames) {
      if (const char* value = std::getenv(name)) saved_.emplace_back(name, value);
      unsetenv(name);
    }
  }
  ~LauncherEnvironmentCleared() {
    for (const char* name : kNames) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  LauncherEnvironmentCleared(const LauncherEnvironmentCleared&) = delete;
  LauncherEnvironmentCleared& operator=(const LauncherEnvironmentCleared&) = delete;

 private:
  static constexpr const char* kNames[] = {
      "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
      "LOCAL_RANK",       "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST(KernelThreads, LocalRanksComeFromTheLaunchersEnvironment) {
  const LauncherEnvironmentCleared cleared;
  EXPECT_EQ(LocalRanksFromEnvironment(), 1);
  setenv("MPI_LOCALNRANKS", "3", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 3);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 4);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 2) << "torchrun's first";
  setenv("LOCAL_WORLD_SIZE", "two", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 4) << "not a count: the next launcher's";
  // The CPUs each rank may call its own (a queue steers the engine it wakes
  // only where they are two or more: sim_queue.cc).
  unsetenv("LOCAL_WORLD_SIZE");
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsetenv("MPI_LOCALNRANKS");
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  EXPECT_EQ(HostCpusPerRank(), cpus);
  setenv("LOCAL_WORLD_SIZE", std::to_string(cpus).c_str(), 1);
  EXPECT_EQ(HostCpusPerRank(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(2 * cpus).c_str(), 1);
  EXPECT_EQ(HostCpusPerRank(), 1) << "at least one";
}

TEST(KernelThreads, CommunicationEnginesSpreadOverTheCpusWhereRanksOutnumberThem) {
  const LauncherEnvironmentCleared cleared;
  EXPECT_EQ(LocalRankFromEnvironment(), -1);
  setenv("MPI_LOCALRANKID", "0", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), 0) << "rank 0 is a rank";
  setenv("LOCAL_RANK", "3", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), 3) << "torchrun's first";
  setenv("LOCAL_RANK", "-1", 1);
  EXPECT_EQ(LocalRankFromEnvironment(), 0) << "not a rank: the next launcher's";
  unsetenv("MPI_LOCALRANKID");

  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  const int count = static_cast<int>(cpus.size());
  // Twice as many ranks as CPUs: each rank's engine on its turn of the CPUs.
  setenv("LOCAL_WORLD_SIZE", std::to_string(2 * count).c_str(), 1);
  for (int rank = 0; rank < 2 * count; ++rank) {
    setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
    EXPECT_EQ(CommunicationEngineCpu(), cpus[rank % count]) << "rank " << rank;
  }
  unsetenv("LOCAL_RANK");
  EXPECT_EQ(CommunicationEngineCpu(), -1) << "no local rank: left to the scheduler";
  setenv("LOCAL_RANK", "0", 1);
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(CommunicationEngineCpu(), -1) << "one rank: left to the scheduler";
  if (count >= 4) {
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    EXPECT_EQ(CommunicationEngineCpu(), -1) << "CPUs to spare: left to the scheduler";
  }
}

TEST(KernelPool, WorksInAForkedChild) {
#if TERN_UNDER_TSAN
  GTEST_SKIP() << "ThreadSanitizer cannot start threads after a multi-threaded fork";
#endif
  KernelPool& pool = KernelPool::Instance();
  std::atomic<int> runs{0};
  pool.Run(16, [&](int) { runs.fetch_add(1); });
  ASSERT_EQ(runs.load(), 16);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int> child_runs{0};
    for (int round = 0; round < 50; ++round) {
      pool.Run(16, [&](int) { child_runs.fetch_add(1); });
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
