#include "common/steerable_thread.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"

namespace tern {
namespace {

using Mode = WakeSteering;

Mode ModeFromEnvironment() {
  const char* value = std::getenv("TERN_WAKE_STEERING");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return Mode::kAuto;
  if (std::strcmp(value, "on") == 0 || std::strcmp(value, "1") == 0) return Mode::kOn;
  if (std::strcmp(value, "off") == 0 || std::strcmp(value, "0") == 0) return Mode::kOff;
  TERN_LOG_WARN(
      "TERN_WAKE_STEERING='{}' is not one of auto, on, off: using auto (wake-ups are steered "
      "off their waker's CPU once one is seen landing there)",
      value);
  return Mode::kAuto;
}

std::atomic<Mode> g_mode{ModeFromEnvironment()};
// In `auto`: set once a wake-up is seen landing on its waker's CPU.
std::atomic<bool> g_landing_seen{false};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool WakeSteeringOn() {
  const Mode mode = g_mode.load(std::memory_order_relaxed);
  return mode == Mode::kOn ||
         (mode == Mode::kAuto && g_landing_seen.load(std::memory_order_relaxed));
}

void SetWakeSteering(WakeSteering mode) {
  g_landing_seen.store(false, std::memory_order_relaxed);
  g_mode.store(mode, std::memory_order_relaxed);
}

void SteerableThread::BindToCallingThread() {
  tid_.store(static_cast<int>(syscall(SYS_gettid)), std::memory_order_relaxed);
  state_.store(kAwake, std::memory_order_relaxed);
}

void SteerableThread::Unbind() {
  tid_.store(0, std::memory_order_relaxed);
  state_.store(kAwake, std::memory_order_relaxed);
}

void SteerableThread::BeforeSleep() {
  int state = state_.load(std::memory_order_acquire);
  // A waker in the middle of steering finishes within two system calls; it
  // may have been preempted on this very CPU, so the wait yields.
  while (state == kSteering) {
    sched_yield();
    state = state_.load(std::memory_order_acquire);
  }
  if (state == kSteered) sched_setaffinity(0, sizeof(home_), &home_);
  asleep_since_ns_.store(NowNs(), std::memory_order_relaxed);
  state_.store(kAsleep, std::memory_order_release);
}

void SteerableThread::AfterWake() {
  int state = kAsleep;
  if (!state_.compare_exchange_strong(state, kAwake, std::memory_order_acq_rel)) {
    return;  // steered (or being steered): BeforeSleep gives the CPUs back
  }
  if (g_mode.load(std::memory_order_relaxed) != Mode::kAuto ||
      g_landing_seen.load(std::memory_order_relaxed))
    return;
  const int waker_cpu = waker_cpu_.exchange(-1, std::memory_order_relaxed);
  if (waker_cpu < 0 || sched_getcpu() != waker_cpu) return;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  if (!g_landing_seen.exchange(true, std::memory_order_relaxed)) {
    TERN_LOG_DEBUG(
        "a woken thread ran on its waker's CPU while others were allowed: wake-ups of threads "
        "that work beside their waker are steered off its CPU from now on "
        "(TERN_WAKE_STEERING=off to keep the scheduler's placement)");
  }
}

void SteerableThread::SteerOffCallingCpu() {
  if (g_mode.load(std::memory_order_relaxed) == Mode::kOff ||
      state_.load(std::memory_order_relaxed) != kAsleep) {
    return;  // awake already: no wake-up to place, nor to learn from
  }
  const int cpu = sched_getcpu();
  waker_cpu_.store(cpu, std::memory_order_relaxed);
  if (cpu < 0 || !WakeSteeringOn()) return;
  // A short sleeper is not placed on its waker's CPU (see kMinSleepToSteer).
  const int64_t asleep_ns = NowNs() - asleep_since_ns_.load(std::memory_order_relaxed);
  if (asleep_ns < std::chrono::nanoseconds(kMinSleepToSteer).count()) return;
  int state = kAsleep;
  if (!state_.compare_exchange_strong(state, kSteering, std::memory_order_acq_rel)) return;
  const pid_t tid = tid_.load(std::memory_order_relaxed);
  bool steered = false;
  if (tid != 0 && sched_getaffinity(tid, sizeof(home_), &home_) == 0 && CPU_ISSET(cpu, &home_) &&
      CPU_COUNT(&home_) >= 2) {
    cpu_set_t elsewhere = home_;
    CPU_CLR(cpu, &elsewhere);
    steered = sched_setaffinity(tid, sizeof(elsewhere), &elsewhere) == 0;
  }
  if (steered) steered_.fetch_add(1, std::memory_order_relaxed);
  state_.store(steered ? kSteered : kAsleep, std::memory_order_release);
}

bool SteerableThread::KeepOnCpu(int cpu) {
  const pid_t tid = tid_.load(std::memory_order_relaxed);
  if (tid == 0 || cpu < 0 || cpu >= CPU_SETSIZE) return false;
  if (kept_cpu_.load(std::memory_order_relaxed) == cpu) return true;
  // A refused system call is not retried: callers ask on every submission.
  if (keep_refused_.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(keep_mutex_);
  if (!kept_before_) {
    if (sched_getaffinity(tid, sizeof(kept_from_), &kept_from_) != 0) {
      keep_refused_.store(true, std::memory_order_relaxed);
      return false;
    }
    kept_before_ = true;
  }
  if (!CPU_ISSET(cpu, &kept_from_)) return false;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(tid, sizeof(one), &one) != 0) {
    keep_refused_.store(true, std::memory_order_relaxed);
    return false;
  }
  kept_cpu_.store(cpu, std::memory_order_relaxed);
  return true;
}

}  // namespace tern
