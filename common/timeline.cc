#include "common/timeline.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include "common/cpu_relax.h"
#include "common/idle_work.h"

namespace tern {
namespace {

// How a waiter waits (see PollAtLeast and Timeline::Wait): first it spins on
// the value for kSpinNs, then it yields its CPU in a loop (or runs idle work,
// common/idle_work.h) until kYieldNs have passed, then it sleeps on the
// futex. On small virtual machines a futex wake costs 5-20 us (the sleeping
// vCPU is woken through the hypervisor), so a short completion is caught by
// polling; yielding lets the thread we wait for run when it shares our CPU.
// Both phases are bounded, so an idle waiter soon costs nothing.
constexpr uint64_t kSpinNs = 1'000;
constexpr uint64_t kYieldNs = 50'000;
// The longest a wait polls when this timeline's recent waits were long
// (Timeline::Wait): past it, sleeping costs a wake-up that is small beside
// the wait itself.
constexpr uint64_t kMaxPollNs = 500'000;
// Waits like recent ones of this long or longer sleep first and poll from
// kWakeAheadNs before the value is due (Timeline::Wait); the lead is more
// than a sleeping vCPU's wake-up (15-80 us on the VMs measured). Shorter
// waits (an eager training step's loss.item(), 100-300 us) keep polling:
// a wake-up is a large part of them.
constexpr uint64_t kLongWaitNs = 400'000;
constexpr uint64_t kWakeAheadNs = 80'000;

long FutexWait(std::atomic<uint32_t>* word, uint32_t expected, const struct timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
                 timeout, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

struct timespec Timespec(uint64_t ns) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(ns / 1000000000ull);
  ts.tv_nsec = static_cast<long>(ns % 1000000000ull);
  return ts;
}

}  // namespace

uint64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void Timeline::Signal(uint64_t value) {
  value_.store(value, std::memory_order_seq_cst);
  // Dekker pairing with Sleep(): either the sleeper sees the new value, or we
  // see its registered target and wake it. Sleepers whose target is still
  // ahead are left alone: a futex wake costs microseconds of CPU on a small
  // VM, and a queue signals on every command.
  if (value >= sleeper_target_.load(std::memory_order_seq_cst)) {
    // Every sleeper is woken (one futex word for all); those whose target is
    // not reached register again. Clearing before bumping the word means a
    // registration cleared here belongs to a sleeper that read the old word,
    // so its futex wait cannot miss this wake.
    sleeper_target_.store(UINT64_MAX, std::memory_order_seq_cst);
    wake_word_.fetch_add(1, std::memory_order_seq_cst);
    FutexWakeAll(&wake_word_);
  }
}

void Timeline::RegisterSleeper(uint64_t target) const {
  uint64_t current = sleeper_target_.load(std::memory_order_seq_cst);
  while (target < current &&
         !sleeper_target_.compare_exchange_weak(current, target, std::memory_order_seq_cst)) {
  }
}

bool PollAtLeast(const std::atomic<uint64_t>& value, uint64_t target, uint64_t budget_ns) {
  if (value.load(std::memory_order_acquire) >= target) return true;
  if (budget_ns == 0) return false;
  budget_ns = std::min(budget_ns, kMaxPollNs);
  const uint64_t start = MonotonicNs();
  // Counted from now: a kernel that opens before this thread's first look
  // then leaves its parts to it rather than waking a sleeping thread.
  const IdlePoller poller;
  for (uint32_t i = 1;; ++i) {
    CpuRelax();
    if (value.load(std::memory_order_acquire) >= target) return true;
    if (i % 16 != 0) continue;  // read the clock now and then only
    const uint64_t waited = MonotonicNs() - start;
    if (waited >= budget_ns) return value.load(std::memory_order_acquire) >= target;
    // Past the first microsecond: help with the engines' split kernels
    // (common/idle_work.h), else give the CPU to whoever shares it.
    if (waited >= kSpinNs && !RunIdleWork()) sched_yield();
  }
}

bool Timeline::Wait(uint64_t target, uint64_t timeout_ns) const {
  if (value_.load(std::memory_order_acquire) >= target) return true;
  WakeProducer();
  // Poll for as long as recent waits took, twice over (at least kYieldNs):
  // an execution of 45-60 us outlasted a fixed 50 us about half the time,
  // and each of those waits then paid a vCPU wake-up too.
  const uint64_t typical = typical_wait_ns_.load(std::memory_order_relaxed);
  const uint64_t start = MonotonicNs();
  // A wait like recent ones that took kLongWaitNs or more sleeps first,
  // until kWakeAheadNs before the value is due, and polls from there. Polled
  // all along, it held one of the CPUs that the work it waited for needed:
  // the host thread of a compiled GPT-2 block polled through 500 of each
  // forward's 600 us, beside products that split across both CPUs of the
  // VM. The timer's wake-up lands before the completion, where it costs
  // nothing; a completion that comes sooner wakes the sleeper as always.
  uint64_t slept = 0;
  if (typical >= kLongWaitNs) {
    slept = std::min(timeout_ns, typical - kWakeAheadNs);
    if (Sleep(target, slept)) {
      NoteWait(typical, MonotonicNs() - start);
      return true;
    }
  }
  const uint64_t left = timeout_ns - slept;
  const uint64_t polling =
      slept > 0 ? std::min(left, 2 * kWakeAheadNs)
                : std::min(left, std::clamp<uint64_t>(2 * typical, kYieldNs, kMaxPollNs));
  bool reached = PollAtLeast(value_, target, polling);
  if (!reached && left > polling) reached = Sleep(target, left - polling);
  if (reached) NoteWait(typical, MonotonicNs() - start);
  return reached;
}

bool Timeline::Poll(uint64_t target, uint64_t budget_ns) const {
  return PollAtLeast(value_, target, budget_ns);
}

void Timeline::NoteWait(uint64_t typical, uint64_t took) const {
  typical_wait_ns_.store((3 * typical + std::min(took, 4 * kMaxPollNs)) / 4,
                         std::memory_order_relaxed);
}

bool Timeline::Sleep(uint64_t target, uint64_t timeout_ns) const {
  if (value_.load(std::memory_order_acquire) >= target) return true;
  if (timeout_ns == 0) return false;
  const uint64_t now = MonotonicNs();
  // Timeouts too long to represent as a deadline (UINT64_MAX included) wait forever.
  const bool infinite = timeout_ns >= UINT64_MAX - now;
  const uint64_t deadline = infinite ? 0 : now + timeout_ns;
  while (true) {
    const uint32_t word = wake_word_.load(std::memory_order_seq_cst);
    RegisterSleeper(target);
    if (value_.load(std::memory_order_seq_cst) >= target) return true;
    // Registered first: an engine sleeping through a run of waits that
    // looked for sleepers before this registration is roused here (see
    // set_wake_relay). Two loads when nobody naps and no relay is set.
    WakeProducer();
    struct timespec ts;
    struct timespec* tsp = nullptr;
    if (!infinite) {
      uint64_t now = MonotonicNs();
      // A registration left behind costs one needless wake at most.
      if (now >= deadline) return false;
      ts = Timespec(deadline - now);
      tsp = &ts;
    }
    FutexWait(const_cast<std::atomic<uint32_t>*>(&wake_word_), word, tsp);
    if (value_.load(std::memory_order_acquire) >= target) return true;
  }
}

bool Timeline::Nap(uint64_t target, uint64_t timeout_ns) const {
  // Dekker pairing with WakeNappers(): either its caller sees this thread
  // counted, or this thread sees the value it stored before calling.
  nappers_.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t word = wake_word_.load(std::memory_order_seq_cst);
  bool reached = value_.load(std::memory_order_seq_cst) >= target;
  if (!reached && timeout_ns > 0) {
    const struct timespec ts = Timespec(timeout_ns);
    FutexWait(&wake_word_, word, &ts);
    reached = value_.load(std::memory_order_acquire) >= target;
  }
  nappers_.fetch_sub(1, std::memory_order_seq_cst);
  return reached;
}

void Timeline::WakeNappers() const {
  if (has_wake_relay_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(wake_relay_mutex_);
    if (wake_relay_) {
      // Counted before the wake-up: a SleepOnce() that read the relay's word
      // after this sees the count changed (see SleepOnce).
      relayed_wakes_.fetch_add(1, std::memory_order_seq_cst);
      wake_relay_->wake_word_.fetch_add(1, std::memory_order_seq_cst);
      FutexWakeAll(&wake_relay_->wake_word_);
    }
  }
  if (nappers_.load(std::memory_order_seq_cst) == 0) return;
  wake_word_.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&wake_word_);
}

void Timeline::set_wake_relay(std::shared_ptr<const Timeline> relay) const {
  std::lock_guard<std::mutex> lock(wake_relay_mutex_);
  has_wake_relay_.store(relay != nullptr, std::memory_order_seq_cst);
  wake_relay_ = std::move(relay);
}

bool Timeline::SleepOnce(uint64_t target, uint64_t timeout_ns,
                         const std::atomic<uint64_t>& unless_changed, uint64_t seen) const {
  const uint32_t word = wake_word_.load(std::memory_order_seq_cst);
  RegisterSleeper(target);
  if (value_.load(std::memory_order_seq_cst) >= target) return true;
  if (timeout_ns == 0 || unless_changed.load(std::memory_order_seq_cst) != seen) return false;
  const struct timespec ts = Timespec(timeout_ns);
  FutexWait(const_cast<std::atomic<uint32_t>*>(&wake_word_), word, &ts);
  return value_.load(std::memory_order_acquire) >= target;
}

void Timeline::Fail(uint64_t sequence, const Status& status) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (has_failure_.load(std::memory_order_relaxed) && cleared_at_ == UINT64_MAX) return;
  failed_from_ = sequence;
  cleared_at_ = UINT64_MAX;
  failure_ = status;
  has_failure_.store(true, std::memory_order_release);
}

void Timeline::ClearFailure(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (has_failure_.load(std::memory_order_relaxed) && cleared_at_ == UINT64_MAX) {
    cleared_at_ = sequence + 1;
  }
}

Status Timeline::FailureAt(uint64_t point) const {
  if (!has_failure_.load(std::memory_order_acquire)) return OkStatus();
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (point >= failed_from_ && point < cleared_at_) return failure_;
  return OkStatus();
}

Status Timeline::CurrentFailure(uint64_t* out_sequence) const {
  if (!has_failure_.load(std::memory_order_acquire)) return OkStatus();
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (cleared_at_ != UINT64_MAX) return OkStatus();
  if (out_sequence) *out_sequence = failed_from_;
  return failure_;
}

}  // namespace tern
