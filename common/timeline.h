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
#include <memory>
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
  // something else already. It wakes the producer once it is registered as
  // a sleeper, so that an engine sleeping through a run of waits sees it.
  bool Sleep(uint64_t target, uint64_t timeout_ns) const;
  // Only the polling phase, for `budget_ns` (see PollAtLeast): for a waiter
  // that chooses its own polling. Thread-safety: any thread.
  bool Poll(uint64_t target, uint64_t budget_ns) const;

  // Sleeps until value() >= target or `timeout_ns` passes, like Sleep(),
  // except that Signal() does not end it: only its timeout, or
  // WakeNappers(). For an idle engine between polling its doorbell and
  // sleeping on it: a submitter then rings without a futex wake (5-20 us of
  // its own time on a small VM), and the engine finds the command when its
  // nap ends, or sooner if someone waits for the work (set_producer_doorbell).
  // Returns true when reached. Thread-safety: any thread.
  bool Nap(uint64_t target, uint64_t timeout_ns) const;
  // Ends every Nap() in progress, and the SleepOnce() of the wake relay's
  // sleepers (below). Call after the value it should find. Costs two atomic
  // loads when nobody naps and no relay is set. Thread-safety: any thread.
  void WakeNappers() const;
  // While set, WakeNappers() also ends every SleepOnce() on `relay`: for an
  // engine that sleeps on another queue's timeline through a run of waits
  // (SimQueue), where a waiter on the engine's own queue, which wakes this
  // doorbell, must rouse it. nullptr unsets it. Thread-safety: any thread.
  void set_wake_relay(std::shared_ptr<const Timeline> relay) const;
  // Sleeps until value() >= target, `timeout_ns` passes, or any wake-up on
  // this timeline (a Signal() that wakes its sleepers, a relayed
  // WakeNappers() of another timeline), whichever comes first: one futex
  // wait, not a loop. It also returns at once (false) when `unless_changed`
  // no longer holds `seen` (read after it registered as a sleeper). Returns
  // true when the value is reached. Thread-safety: any thread.
  bool SleepOnce(uint64_t target, uint64_t timeout_ns, const std::atomic<uint64_t>& unless_changed,
                 uint64_t seen) const;
  // How many times WakeNappers() has woken the relay's sleepers.
  // Thread-safety: any thread.
  const std::atomic<uint64_t>& relayed_wakes() const { return relayed_wakes_; }
  // The lowest target of a thread asleep on this timeline now, UINT64_MAX
  // when none (a thread that polls is not counted). Thread-safety: any thread.
  uint64_t lowest_sleeper_target() const { return sleeper_target_.load(std::memory_order_seq_cst); }
  // Threads inside Nap() now (for tests and diagnostics).
  uint32_t nappers() const { return nappers_.load(std::memory_order_acquire); }
  // `doorbell` is the doorbell of the engine that advances this timeline: a
  // waiter that finds this timeline short of its target wakes that engine
  // from a nap, since the submission it waits for did not. Set before the
  // timeline is shared. Thread-safety: not with concurrent waiters.
  void set_producer_doorbell(std::shared_ptr<const Timeline> doorbell) {
    producer_doorbell_ = std::move(doorbell);
  }
  // Wakes the producer's engine from a nap: what Wait() and Sleep() do for a
  // target not reached yet, for a caller that only looks (a query).
  // Thread-safety: any thread.
  void WakeProducer() const {
    if (producer_doorbell_) producer_doorbell_->WakeNappers();
  }

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
  // Threads inside Nap().
  mutable std::atomic<uint32_t> nappers_{0};
  std::shared_ptr<const Timeline> producer_doorbell_;
  // See set_wake_relay().
  mutable std::atomic<bool> has_wake_relay_{false};
  mutable std::mutex wake_relay_mutex_;
  mutable std::shared_ptr<const Timeline> wake_relay_;
  mutable std::atomic<uint64_t> relayed_wakes_{0};
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
