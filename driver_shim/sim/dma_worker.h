// The host thread that plays the simulated DMA engines while the compute
// thread runs the other engines' streams (engine_streams.h): a copy on the
// DMA engine overlaps a matmul on the tensor engine, as on hardware.
//
// Every execution runs on the process's one compute thread
// (compute_worker.h), which is this worker's only client, so it holds one
// job at a time. Kernels run here on this thread alone: the compute thread's
// OpenMP team keeps the host's other cores.
#ifndef TERN_DRIVER_SHIM_SIM_DMA_WORKER_H_
#define TERN_DRIVER_SHIM_SIM_DMA_WORKER_H_

#include <cstdint>
#include <functional>

#include "common/status_with_message.h"
#include "common/timeline.h"

namespace tern::sim {

class DmaWorker {
 public:
  // The process's worker, started on first use and never destroyed.
  static DmaWorker& Get();

  // Starts `job` on the DMA thread. The previous job must have finished
  // (Finished() or Wait() said so).
  // Thread-safety: the compute thread only.
  void Start(std::function<Status()> job);
  // Whether the job started last has finished.
  bool Finished() const { return done_.value() == started_; }
  // Waits for the job started last until `timeout_ns` passes; true when it
  // finished.
  bool Wait(uint64_t timeout_ns) const { return done_.Wait(started_, timeout_ns); }
  // The finished job's status. Thread-safety: the compute thread only.
  const Status& result() const { return result_; }

 private:
  DmaWorker();
  void Loop();

  std::function<Status()> job_;  // written before doorbell_ advances
  Status result_;                // written before done_ advances
  uint64_t started_ = 0;         // jobs started (compute thread)
  Timeline doorbell_;            // value: jobs started
  Timeline done_;                // value: jobs finished
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_DMA_WORKER_H_
