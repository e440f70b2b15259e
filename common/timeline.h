// A 64-bit timeline semaphore living in host memory: the completion counter of
// a queue and the thing events point at. Signalers advance the value;
// waiters block until it reaches a target (spin, then yield, each for a
// bounded time, then sleep on a futex).
//
// A timeline can also carry a failure: the range of points [first_failed,
// cleared_at) whose commands failed or were aborted. A waiter that reaches a
// point inside that range learns the failure instead of success.
#ifndef TERN_COMMON_TIMELINE_H_
#define TERN_COMMON_TIMELINE_H_

#include <atomic>
#include <cstdint>
#include <mutex>

#include "common/status_with_message.h"

namespace tern {

class Timeline {
 public:
  Timeline() = default;
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  uint64_t value() const { return value_.load(std::memory_order_acquire); }

  // Advances the value to `value` (must not go backwards) and wakes waiters.
  // Thread-safety: one signaler at a time per timeline.
  void Signal(uint64_t value);

  // Waits until value() >= target or `timeout_ns` passes. Returns true when
  // reached. Polls first (see PollAtLeast), then sleeps. The polling lasts
  // 50 us, or twice as long as this timeline's recent waits took, up to
  // 500 us: a waiter that gave up polling just before the completion came
  // paid a wake-up of its sleeping vCPU (60-70 us on the Xeon VMs) on top.
  // Where recent waits took 400 us or more, it sleeps first instead, until
  // 80 us before the value is due, then polls (see timeline.cc).
  // Thread-safety: any number of concurrent waiters.
  bool Wait(uint64_t target, uint64_t timeout_ns) const;
  // Like Wait(), without the polling phase: for a waiter that has polled
  // something else already.
  bool Sleep(uint64_t target, uint64_t timeout_ns) const;
  // Only the polling phase, for `budget_ns` (see PollAtLeast): for a waiter
  // that chooses its own polling. Thread-safety: any thread.
  bool Poll(uint64_t target, uint64_t budget_ns) const;

  // Marks points from `sequence` on as failed with `status` (only the first
  // failure of an error epoch is kept). Thread-safety: any thread.
  void Fail(uint64_t sequence, const Status& status);
  // Ends the current error epoch: points after `sequence` succeed again.
  void ClearFailure(uint64_t sequence);
  // The failure that covers `point`, or OK.
  Status FailureAt(uint64_t point) const;
  // The current failure (uncleared), or OK; `out_sequence` gets its point.
  Status CurrentFailure(uint64_t* out_sequence) const;

 private:
  // Lowers sleeper_target_ to `target` if it is higher.
  void RegisterSleeper(uint64_t target) const;
  // Folds a wait that took `took` into typical_wait_ns_ (read as `typical`).
  void NoteWait(uint64_t typical, uint64_t took) const;

  std::atomic<uint64_t> value_{0};
  mutable std::atomic<uint32_t> wake_word_{0};
  // The lowest target of a sleeping waiter, UINT64_MAX when none: Signal()
  // wakes sleepers only once it reaches it.
  mutable std::atomic<uint64_t> sleeper_target_{UINT64_MAX};
  // How long waits on this timeline have recently taken (a moving average,
  // updated without ordering: a rough figure is all Wait needs).
  mutable std::atomic<uint64_t> typical_wait_ns_{0};
  std::atomic<bool> has_failure_{false};
  mutable std::mutex failure_mutex_;
  uint64_t failed_from_ = 0;
  uint64_t cleared_at_ = UINT64_MAX;
  Status failure_;
};

// Polls until value >= target, for at most `budget_ns` (capped at 500 us): it
// spins for the first microsecond and then, between looks, runs idle work
// (common/idle_work.h) or yields the CPU, so a thread it waits for that
// shares its CPU gets to run. Returns true when reached. This is the first
// phase of every wait in tern: on small virtual machines a futex wake-up
// costs 5-20 us, far more than most waits.
bool PollAtLeast(const std::atomic<uint64_t>& value, uint64_t target, uint64_t budget_ns);

// Nanoseconds on CLOCK_MONOTONIC.
uint64_t MonotonicNs();

}  // namespace tern

#endif  // TERN_COMMON_TIMELINE_H_
