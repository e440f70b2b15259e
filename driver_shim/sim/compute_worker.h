// The host thread that runs every simulated execution of the process.
//
// The engines' kernels (oneDNN and tern's own) parallelise with OpenMP, and
// libgomp gives each thread that opens a parallel region its own team of
// worker threads, which spin for a while after each region. Were executions
// run on the queues' own threads, every queue that executes would bring a
// team, and on a small host those teams starve each other: a 64x64 matmul
// measured 7 ms instead of 50 us with two devices in use. Running every
// execution on this one thread keeps one team sized to the host; executions
// from different queues take turns, which is what sharing the host's CPUs
// amounts to anyway.
//
// A team of one thread (a host with two CPUs, or TERN_SIM_KERNEL_THREADS=1)
// is no team: its kernels start no threads, so nothing can starve, and the
// hand-off to this thread and back (two thread wake-ups, polling threads
// competing with the kernels for the CPUs) is pure cost, a quarter of a
// small MLP's execution. Executions then run on the queue's own thread
// (ExecutionsStayOnQueueThreads), decided once per process from the team
// size.
#ifndef TERN_DRIVER_SHIM_SIM_COMPUTE_WORKER_H_
#define TERN_DRIVER_SHIM_SIM_COMPUTE_WORKER_H_

#include <functional>

#include "common/status_with_message.h"

namespace tern::sim {

// Runs `work` on the process's compute thread and returns its status; the
// caller waits (polling first, as every tern wait). Jobs run one at a time,
// in the order they arrive.
// Thread-safety: any thread; must not be called from `work` itself.
Status RunOnComputeThread(const std::function<Status()>& work);

// Whether executions run on the queue's own thread instead of the compute
// thread: when the kernels' team is a single thread (see above).
// Thread-safety: any thread; the answer is fixed for the process.
bool ExecutionsStayOnQueueThreads();

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_COMPUTE_WORKER_H_
