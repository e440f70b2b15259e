// A thread that others wake to work beside them, whose wake-ups can be kept
// off the waker's CPU.
//
// Why: the kernels of some virtual machines place a woken thread that has
// used little CPU lately on the CPU of the thread that woke it, rather than
// wake an idle virtual CPU (seen on the project's 2-vCPU guests, Linux 6.18
// booted with `sched_vcpu_pack`: after 1 ms or more asleep, 90% of wake-ups
// landed on the waker's CPU, the other CPU idle). A kernel-pool helper woken
// to split a product with its caller then takes turns with the caller on one
// CPU until the load balancer moves one of them, milliseconds later: a
// 512x512 product ran at half speed in most calls (0.57x oneDNN's). The
// waker, which knows that it goes on running, excludes its own CPU from the
// sleeper's allowed CPUs just before the wake, and the sleeper takes back
// every CPU it had before it next sleeps, so the scheduler stays free to move
// it at any other time.
//
// Steering costs the waker two system calls (2-6 us) and the sleeper one, and
// an idle virtual CPU's wake-up (20-60 us) replaces a preemption of the
// waker (3-5 us): it is worth it only where wake-ups are seen to land on the
// waker's CPU. So by default it starts in a process once a wake-up has been
// seen landing on its waker's CPU while the sleeper could have run elsewhere
// (TERN_WAKE_STEERING=auto); `on` steers from the start, `off` never.
//
// Only a thread asleep for kMinSleepToSteer or longer is steered: the same
// guests never placed a thread woken after less than 0.8 ms asleep on its
// waker's CPU, so steering it bought nothing and cost the waker its two
// system calls, on the critical path of every small command. An eager
// forward of a 512-1024-512 MLP at batch 1 (three commands, each waking an
// engine that had napped for tens of microseconds) took 59-68 us with every
// sleeper steered against 46-58 us with this rule, and 46-74 us with
// steering off, while 512x512 products (helpers asleep for milliseconds
// between calls) kept their 0.95-0.99x oneDNN (0.56-0.60x off).
#ifndef TERN_COMMON_STEERABLE_THREAD_H_
#define TERN_COMMON_STEERABLE_THREAD_H_

#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>

namespace tern {

class SteerableThread {
 public:
  // How long a thread must have been asleep for a wake-up to steer it.
  static constexpr std::chrono::microseconds kMinSleepToSteer{500};

  SteerableThread() = default;
  SteerableThread(const SteerableThread&) = delete;
  SteerableThread& operator=(const SteerableThread&) = delete;

  // Binds this object to the calling thread, the one that will sleep and be
  // woken. Call once, from that thread, before its first sleep.
  // Thread-safety: the bound thread only.
  void BindToCallingThread();

  // Forgets the bound thread (in a forked child, whose copy names a thread of
  // the parent): nothing steers it until a thread binds again.
  // Thread-safety: not with the other calls.
  void Unbind();

  // Call just before sleeping: gives back the CPUs a steered wake-up took
  // away, and marks the thread as one a waker may steer.
  // Thread-safety: the bound thread only.
  void BeforeSleep();

  // Call once woken (whatever woke it): the thread is no longer steerable,
  // and a wake-up that landed on its waker's CPU, unsteered, turns steering
  // on for the process (in `auto`).
  // Thread-safety: the bound thread only.
  void AfterWake();

  // For a thread about to wake this one and go on running: when steering is
  // on and the thread has slept for kMinSleepToSteer or longer, keeps it off
  // the calling thread's CPU until it next sleeps. Call just before the
  // wake-up. A thread allowed on the caller's CPU alone, or a failed system
  // call, leaves it where it is.
  // Thread-safety: any thread.
  void SteerOffCallingCpu();

  // Keeps the bound thread on `cpu` alone until kept elsewhere, if `cpu` is
  // one of the CPUs it was allowed when first kept. Returns whether it is
  // now kept there (false: no bound thread, another CPU, or a failed system
  // call, which leave it where it is; after a failed call, every later keep
  // returns false without trying). Not for a thread that wake-ups steer:
  // the two would undo each other.
  // Thread-safety: any thread.
  bool KeepOnCpu(int cpu);

  // Steered wake-ups so far (for tests and diagnostics).
  // Thread-safety: any thread.
  uint64_t steered() const { return steered_.load(std::memory_order_relaxed); }

 private:
  enum State : int { kAwake, kAsleep, kSteering, kSteered };

  std::atomic<int> tid_{0};
  std::atomic<int> state_{kAwake};
  std::atomic<int> waker_cpu_{-1};  // the last waker's CPU, to see where wake-ups land
  std::atomic<uint64_t> steered_{0};
  std::atomic<int64_t> asleep_since_ns_{0};  // when BeforeSleep last ran (steady clock)
  // The thread's allowed CPUs before a steering; written by the steering
  // waker between kSteering and kSteered, read by the thread after kSteered.
  cpu_set_t home_{};
  // KeepOnCpu's record: the CPU kept to (-1: none), and the allowed CPUs
  // before the first keep (guarded by keep_mutex_).
  std::atomic<int> kept_cpu_{-1};
  std::atomic<bool> keep_refused_{false};  // a system call failed: keep nothing more
  std::mutex keep_mutex_;
  bool kept_before_ = false;
  cpu_set_t kept_from_{};
};

// Whether wake-ups are steered in this process now (TERN_WAKE_STEERING, and
// in `auto` whether a wake-up was seen landing on its waker's CPU).
// Thread-safety: any thread.
bool WakeSteeringOn();

enum class WakeSteering { kAuto, kOn, kOff };
// Replaces TERN_WAKE_STEERING's choice, and in `auto` forgets the landings
// seen (for tests). Thread-safety: any thread.
void SetWakeSteering(WakeSteering mode);

}  // namespace tern

#endif  // TERN_COMMON_STEERABLE_THREAD_H_
