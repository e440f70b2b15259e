// Work that a thread polling for a value (PollAtLeast) does instead of
// yielding its CPU. The simulated engines register a function that runs a
// part of a kernel split across their kernel pool: on a host with few CPUs,
// a thread waiting for an execution otherwise holds (or yields back and
// forth) a CPU that the execution's kernels need, and a sleeping pool helper
// costs a futex wake-up of 5-20 us on a small virtual machine. The waiting
// thread is the hand that is already awake.
#ifndef TERN_COMMON_IDLE_WORK_H_
#define TERN_COMMON_IDLE_WORK_H_

namespace tern {

// Runs some pending work to completion and returns true, or returns false at
// once when there is none. Must not block, and must not wait for anything
// the polling thread might be the one to provide (it may hold locks).
using IdleWorkFn = bool (*)();

// Registers the process's idle work (null: none). The simulated driver
// registers its kernel pool's when the pool starts.
// Thread-safety: any thread; the last registration wins.
void SetIdleWork(IdleWorkFn fn);

// Runs the registered idle work once; false when none is registered or it
// found nothing to do.
// Thread-safety: any thread.
bool RunIdleWork();

// Threads polling now that run the idle work between their looks: a poller
// counts from the start of its poll until the poll ends (IdlePoller in
// PollAtLeast). Work that a poller would take at once need not wake a
// sleeping thread for it.
// Thread-safety: any thread (a snapshot).
int IdlePollers();

// Counts the constructing thread among IdlePollers() until destruction.
// Thread-safety: one object per polling thread.
class IdlePoller {
 public:
  IdlePoller();
  IdlePoller(const IdlePoller&) = delete;
  IdlePoller& operator=(const IdlePoller&) = delete;
  ~IdlePoller();
};

}  // namespace tern

#endif  // TERN_COMMON_IDLE_WORK_H_
