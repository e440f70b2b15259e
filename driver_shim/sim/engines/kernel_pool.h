// The CPU threads the simulated engines' kernels split their work across.
//
// Why tern's own threads and not OpenMP: the kernels used to parallelise with
// OpenMP (tern's loops and oneDNN's), and libgomp gives every thread that
// opens a parallel region a team of workers that spin for a long while after
// each region. A framework in the same process (PyTorch) shares that libgomp,
// and once tern's team existed PyTorch's own CPU ops ran 2.3x slower (libgomp
// throttles every team when more OpenMP threads exist than CPUs); on a 2-CPU
// host a team as large as the host stalled whenever the enqueuing thread took
// one of its CPUs. So the kernels had one thread on a 2-CPU host, half of it.
//
// This pool has one helper thread per CPU but one; the thread that runs the
// kernel is the last. Work is handed out in parts, taken dynamically, so a
// helper that the OS preempts delays the kernel by at most the parts it holds,
// and a caller whose helpers never come (a forked child, a busy machine) runs
// every part itself. Helpers look for the next kernel for a while after one
// (2-64 us, adapted to how soon kernels have been coming), then sleep on a
// futex: an idle device costs the host nothing. oneDNN runs single-threaded inside each part
// (its OpenMP team is never opened), so tern never starts an OpenMP team.
//
// A thread of the process that polls for a completion (tern_queue_synchronize,
// an event's wait: PollAtLeast) takes parts too (HelpWithOpenJob, registered as
// the process's idle work, common/idle_work.h): it is the hand already awake.
// A kernel too short to be worth a helper's wake-up opens its job for the
// hands that are awake only (Wake::kAwakeHandsOnly); whatever they do not
// take, the caller runs. One a little longer wakes the helpers only when no
// thread polls (Wake::kPollersElseSleepingHelpers).
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_KERNEL_POOL_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_KERNEL_POOL_H_

#include <atomic>
#include <climits>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace tern {
class SteerableThread;
}

namespace tern::sim::kernels {

class KernelPool {
 public:
  // The process's pool, sized by KernelThreadsForHost() (run_instruction.h);
  // its helpers start on the first call.
  // Thread-safety: any thread.
  static KernelPool& Instance();

  explicit KernelPool(int threads);
  ~KernelPool();
  KernelPool(const KernelPool&) = delete;
  KernelPool& operator=(const KernelPool&) = delete;

  // Starts the helpers now rather than in the first kernel that splits (an
  // execution would pay for creating the threads). Idempotent.
  // Thread-safety: any thread.
  void Start();

  // CPU threads a kernel may use: the helpers and the calling thread.
  // Thread-safety: any thread.
  int threads() const { return threads_; }

  // Who a job calls on besides the caller: the helpers, woken if they sleep
  // (a futex wake-up, 5-20 us until a sleeping helper runs on a small
  // virtual machine), or only the hands awake now (helpers still looking
  // for work, threads polling for a completion), for kernels shorter than a
  // wake-up; or every hand awake, the helpers woken only if no thread is
  // polling for a completion once the caller has run its first part: for
  // kernels a little longer than a wake-up, which a host thread waiting on
  // each execution helps with sooner than a woken helper could.
  enum class Wake { kSleepingHelpers, kAwakeHandsOnly, kPollersElseSleepingHelpers };

  // Calls fn(part) once for every part in [0, parts) and returns when all
  // have returned. Parts run on the calling thread, the helpers and threads
  // polling for a completion (HelpWithOpenJob), so a part must not depend on
  // the thread it runs on. When another call holds the pool (another engine,
  // or a part calling Run), every part runs on the calling thread. fn must
  // not throw.
  // Thread-safety: any thread.
  template <typename Fn>
  void Run(int parts, Fn&& fn, Wake wake = Wake::kSleepingHelpers) {
    using Callable = std::remove_reference_t<Fn>;
    if (parts <= 0) return;
    RunParts(
        parts, [](void* callable, int part) { (*static_cast<Callable*>(callable))(part); },
        const_cast<void*>(static_cast<const void*>(&fn)), wake);
  }

  // Runs parts of the open job, if there is one and it was not opened for
  // the helpers alone (Wake::kSleepingHelpers), on the calling thread, and
  // returns whether it ran any.
  // For a thread that would otherwise poll. A job that woke the helpers has
  // its hands: a poller taking its parts too gained nothing when the host's
  // CPUs were free, and lost half the speed of a large product when a
  // framework's OpenMP workers (PyTorch's, spinning after its CPU ops) held
  // one of them.
  // Thread-safety: any thread.
  bool HelpWithOpenJob();

  // How many times a job has woken sleeping helpers (for tests and
  // diagnostics). Thread-safety: any thread.
  uint64_t helper_wake_ups() const { return wake_ups_.load(std::memory_order_relaxed); }

 private:
  using PartFn = void (*)(void* context, int part);

  void RunParts(int parts, PartFn call, void* context, Wake wake);
  void ResetInForkedChild();
  void HelperLoop(SteerableThread* self);
  // Runs parts of the current job until none is left (or `at_most` ran);
  // returns how many.
  int TakeParts(PartFn call, void* context, int parts, int at_most = INT_MAX);
  // Wakes the helpers that sleep, if any.
  void WakeSleepers();
  // Enters, takes parts of the job if one is open (and, `as_poller`, if
  // pollers may take its parts), leaves.
  int TakePartsOfOpenJob(bool as_poller);
  // Waits for the next job (looking for it for *spin_ns, then asleep).
  uint32_t WaitForJob(uint32_t seen, int64_t* spin_ns, SteerableThread* self);

  const int threads_;
  // The helpers, in order (threads_ - 1 of them), as threads that a caller
  // steers off its CPU when it wakes them.
  std::unique_ptr<SteerableThread[]> helper_threads_;
  std::atomic<bool> started_{false};
  std::atomic<bool> starting_{false};  // one caller of Start() creates the threads
  std::atomic<bool> held_{false};      // a call owns the job fields below

  // The current job, written by the call that holds the pool before it
  // opens the job; atomics because a helper that woke for an older job may
  // read them while the next call writes them (it then finds the job closed).
  std::atomic<PartFn> call_{nullptr};
  std::atomic<void*> context_{nullptr};
  std::atomic<int> parts_{0};
  std::atomic<bool> pollers_take_parts_{false};  // the job was not opened for the helpers alone
  std::atomic<int> next_part_{0};
  std::atomic<int> parts_done_{0};
  std::atomic<bool> open_{false};
  std::atomic<int> helpers_inside_{0};  // helpers (and pollers) that may be reading the job

  std::atomic<uint32_t> generation_{0};  // bumped per job; the helpers' futex word
  std::atomic<int> sleepers_{0};         // helpers asleep (or about to be) on generation_
  std::atomic<uint64_t> wake_ups_{0};    // futex wake-ups of sleeping helpers
};

}  // namespace tern::sim::kernels

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_KERNEL_POOL_H_
