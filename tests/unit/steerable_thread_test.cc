// SteerableThread against the real scheduler: a sleeping thread's allowed
// CPUs while a waker steers it, after it wakes, and once it sleeps again.
#include "common/steerable_thread.h"

#include <gtest/gtest.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <thread>

namespace tern {
namespace {

cpu_set_t AllowedCpus(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(tid, sizeof(set), &set), 0);
  return set;
}

void PinCallingThread(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
}

// The first CPU of `set` other than `not_this` (-1: none).
int AnotherCpu(const cpu_set_t& set, int not_this) {
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set) && cpu != not_this) return cpu;
  }
  return -1;
}

// A thread that sleeps on a futex word as a pool helper does, binding a
// SteerableThread, and records its allowed CPUs each time it wakes.
class Sleeper {
 public:
  explicit Sleeper(SteerableThread* steer) : steer_(steer) {
    thread_ = std::thread([this] {
      tid_.store(static_cast<pid_t>(syscall(SYS_gettid)));
      steer_->BindToCallingThread();
      uint32_t seen = 0;
      for (;;) {
        steer_->BeforeSleep();
        asleep_.store(true);
        while (word_.load() == seen) {
          syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, seen, nullptr,
                  nullptr, 0);
        }
        asleep_.store(false);
        steer_->AfterWake();
        seen = word_.load();
        if (seen == kStop) return;
        awake_cpus_ = AllowedCpus(0);
        wakes_.fetch_add(1);
      }
    });
    while (!asleep_.load()) std::this_thread::yield();
  }
  ~Sleeper() {
    Wake(kStop);
    thread_.join();
  }
  pid_t tid() const { return tid_.load(); }
  // Wakes the thread and waits until it recorded its CPUs.
  void Wake(uint32_t value = 0) {
    const int before = wakes_.load();
    word_.store(value == 0 ? word_.load() + 1 : value);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
            nullptr, 0);
    if (value == kStop) return;
    while (wakes_.load() == before) std::this_thread::yield();
  }
  // Waits until the thread sleeps again (after BeforeSleep).
  void WaitAsleep() {
    while (!asleep_.load()) std::this_thread::yield();
  }
  // Waits until the thread has slept long enough to be steered.
  void WaitAsleepLongEnough() {
    WaitAsleep();
    std::this_thread::sleep_for(SteerableThread::kMinSleepToSteer);
  }
  cpu_set_t awake_cpus() const { return awake_cpus_; }

 private:
  static constexpr uint32_t kStop = 0xffffffffu;
  SteerableThread* steer_;
  std::atomic<uint32_t> word_{0};
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> asleep_{false};
  std::atomic<int> wakes_{0};
  cpu_set_t awake_cpus_{};
  std::thread thread_;
};

class SteerableThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = AllowedCpus(0);
    if (CPU_COUNT(&home_) < 2) GTEST_SKIP() << "steering needs two allowed CPUs";
  }
  void TearDown() override {
    sched_setaffinity(0, sizeof(home_), &home_);
    SetWakeSteering(WakeSteering::kAuto);
  }
  cpu_set_t home_;
};

TEST_F(SteerableThreadTest, ASteeredSleeperWakesOffTheWakersCpuAndGetsItsCpusBackBeforeSleeping) {
  SetWakeSteering(WakeSteering::kOn);
  SteerableThread steer;
  Sleeper sleeper(&steer);
  const int waker_cpu = AnotherCpu(home_, -1);
  PinCallingThread(waker_cpu);

  sleeper.WaitAsleepLongEnough();
  steer.SteerOffCallingCpu();
  EXPECT_EQ(steer.steered(), 1u);
  // Asleep, it may not run on the waker's CPU; every other CPU it had, it has.
  cpu_set_t expected = home_;
  CPU_CLR(waker_cpu, &expected);
  cpu_set_t now = AllowedCpus(sleeper.tid());
  EXPECT_TRUE(CPU_EQUAL(&now, &expected));

  sleeper.Wake();
  cpu_set_t awake = sleeper.awake_cpus();
  EXPECT_TRUE(CPU_EQUAL(&awake, &expected)) << "awake, it still runs off the waker's CPU";
  sleeper.WaitAsleep();
  now = AllowedCpus(sleeper.tid());
  EXPECT_TRUE(CPU_EQUAL(&now, &home_)) << "before its next sleep it takes back every CPU";

  // A second steering while it is steered already (not asleep since) is a no-op.
  sleeper.WaitAsleepLongEnough();
  steer.SteerOffCallingCpu();
  EXPECT_EQ(steer.steered(), 2u);
  steer.SteerOffCallingCpu();
  EXPECT_EQ(steer.steered(), 2u);
  sleeper.Wake();
  sleeper.WaitAsleep();
  now = AllowedCpus(sleeper.tid());
  EXPECT_TRUE(CPU_EQUAL(&now, &home_));
}

TEST_F(SteerableThreadTest, ASleeperAllowedOnTheWakersCpuAloneStaysThere) {
  SetWakeSteering(WakeSteering::kOn);
  SteerableThread steer;
  Sleeper sleeper(&steer);
  const int waker_cpu = AnotherCpu(home_, -1);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(waker_cpu, &one);
  ASSERT_EQ(sched_setaffinity(sleeper.tid(), sizeof(one), &one), 0);  // as `taskset` would
  PinCallingThread(waker_cpu);

  sleeper.WaitAsleepLongEnough();
  steer.SteerOffCallingCpu();
  EXPECT_EQ(steer.steered(), 0u);
  cpu_set_t now = AllowedCpus(sleeper.tid());
  EXPECT_TRUE(CPU_EQUAL(&now, &one));
  sleeper.Wake();
  sleeper.WaitAsleep();
  now = AllowedCpus(sleeper.tid());
  EXPECT_TRUE(CPU_EQUAL(&now, &one)) << "the user's placement is kept";
}

// A wake-up of a thread that went to sleep moments ago is left to the
// scheduler (it does not land on its waker's CPU); once the thread has slept
// kMinSleepToSteer, the same wake-up is steered.
TEST_F(SteerableThreadTest, AShortSleeperIsNotSteered) {
  SetWakeSteering(WakeSteering::kOn);
  SteerableThread steer;
  Sleeper sleeper(&steer);
  PinCallingThread(AnotherCpu(home_, -1));
  // Woken and asleep again just now: well under kMinSleepToSteer. The clock
  // is read before the wake-up: the sleeper's BeforeSleep may run before
  // Wake() returns (this thread preempted), and its sleep must not start
  // before the window that this test measures.
  const auto asleep_from = std::chrono::steady_clock::now();
  sleeper.Wake();
  sleeper.WaitAsleep();
  steer.SteerOffCallingCpu();
  if (std::chrono::steady_clock::now() - asleep_from < SteerableThread::kMinSleepToSteer) {
    EXPECT_EQ(steer.steered(), 0u);
    cpu_set_t now = AllowedCpus(sleeper.tid());
    EXPECT_TRUE(CPU_EQUAL(&now, &home_));
  }
  std::this_thread::sleep_for(SteerableThread::kMinSleepToSteer);
  steer.SteerOffCallingCpu();
  EXPECT_EQ(steer.steered(), 1u);
}

TEST_F(SteerableThreadTest, OffNeverSteers) {
  SetWakeSteering(WakeSteering::kOff);
  SteerableThread steer;
  Sleeper sleeper(&steer);
  PinCallingThread(AnotherCpu(home_, -1));
  sleeper.WaitAsleepLongEnough();
  steer.SteerOffCallingCpu();
  EXPECT_EQ(steer.steered(), 0u);
  EXPECT_FALSE(WakeSteeringOn());
  cpu_set_t now = AllowedCpus(sleeper.tid());
  EXPECT_TRUE(CPU_EQUAL(&now, &home_));
}

// In `auto`, nothing is steered until a wake-up lands on its waker's CPU
// while the woken thread could have run elsewhere. The landing is arranged:
// the woken thread moves itself to the waker's CPU before it looks.
TEST_F(SteerableThreadTest, AutoStartsSteeringOnceAWakeUpLandsOnItsWakersCpu) {
  SetWakeSteering(WakeSteering::kAuto);
  const int waker_cpu = AnotherCpu(home_, -1);
  SteerableThread steer;
  std::atomic<int> step{0};
  std::thread woken([&] {
    steer.BindToCallingThread();
    steer.BeforeSleep();
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
    // On the waker's CPU, with every CPU allowed again (no migration: the
    // CPU it runs on stays allowed).
    PinCallingThread(waker_cpu);
    ASSERT_EQ(sched_setaffinity(0, sizeof(home_), &home_), 0);
    ASSERT_EQ(sched_getcpu(), waker_cpu);
    steer.AfterWake();
    step.store(3);
  });
  while (step.load() != 1) std::this_thread::yield();
  PinCallingThread(waker_cpu);
  steer.SteerOffCallingCpu();  // records the waker's CPU; off so far
  EXPECT_EQ(steer.steered(), 0u);
  EXPECT_FALSE(WakeSteeringOn());
  step.store(2);
  while (step.load() != 3) std::this_thread::yield();
  woken.join();
  EXPECT_TRUE(WakeSteeringOn());
}

TEST_F(SteerableThreadTest, AKeptThreadRunsOnTheOneCpuItIsKeptTo) {
  SteerableThread steer;
  EXPECT_FALSE(steer.KeepOnCpu(AnotherCpu(home_, -1))) << "no thread bound yet";
  // The kept thread answers each question (asked > answered) with the CPU it
  // runs on, until asked to stop (asked < 0).
  std::atomic<int> asked{0}, answered{0}, ran_on{-1};
  std::atomic<pid_t> tid{0};
  std::thread kept([&] {
    steer.BindToCallingThread();
    tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
    for (int question; (question = asked.load()) >= 0;) {
      if (question != answered.load()) {
        ran_on.store(sched_getcpu());
        answered.store(question);
      }
      std::this_thread::yield();
    }
  });
  while (tid.load() == 0) std::this_thread::yield();
  const int first = AnotherCpu(home_, -1), second = AnotherCpu(home_, first);
  for (const int cpu : {first, second, first}) {
    ASSERT_TRUE(steer.KeepOnCpu(cpu));
    cpu_set_t only = AllowedCpus(tid.load());
    EXPECT_EQ(CPU_COUNT(&only), 1);
    EXPECT_TRUE(CPU_ISSET(cpu, &only));
    // Once kept, the scheduler runs it there only.
    const int question = asked.load() + 1;
    asked.store(question);
    while (answered.load() != question) std::this_thread::yield();
    EXPECT_EQ(ran_on.load(), cpu);
  }
  // Only CPUs it was allowed before the first keep, and only real CPUs.
  EXPECT_FALSE(steer.KeepOnCpu(-1));
  EXPECT_FALSE(steer.KeepOnCpu(CPU_SETSIZE));
  int outside = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && outside < 0; ++cpu) {
    if (!CPU_ISSET(cpu, &home_)) outside = cpu;
  }
  if (outside >= 0) {
    EXPECT_FALSE(steer.KeepOnCpu(outside));
  }
  cpu_set_t still = AllowedCpus(tid.load());
  EXPECT_TRUE(CPU_ISSET(first, &still)) << "a refused keep moved it";
  asked.store(-1);
  kept.join();
}

}  // namespace
}  // namespace tern
