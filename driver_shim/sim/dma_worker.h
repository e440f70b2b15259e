// The host thread that plays the simulated DMA engines while an execution's
// thread runs the other engines' streams (engine_streams.h): a copy on the
// DMA engine overlaps a matmul on the tensor engine, as on hardware.
//
// It serves one execution at a time (TryStart fails while another holds it;
// that execution's copies then run on its own thread). Kernels run here on
// this thread alone: the kernel pool keeps the host's other cores.
#ifndef TERN_DRIVER_SHIM_SIM_DMA_WORKER_H_
#define TERN_DRIVER_SHIM_SIM_DMA_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>

#include "common/status_with_message.h"
#include "common/timeline.h"

namespace tern::sim {

class DmaWorker {
 public:
  // The process's worker, started on first use and never destroyed.
  static DmaWorker& Get();

  // Starts `job` on the DMA thread unless another caller holds the worker
  // or the worker's thread does not exist in this process (a forked child of
  // the process that started it): false. A caller that started a job holds the worker until it
  // calls Release(), after the job finished (Finished() or Wait() said so) and its result() was
  // read. Thread-safety: any thread; the calls below only by the holder.
  bool TryStart(std::function<Status()> job);
  void Release() { held_.store(false, std::memory_order_release); }
  // Whether the job started last has finished.
  bool Finished() const { return done_.value() == started_; }
  // Waits for the job started last until `timeout_ns` passes; true when it
  // finished.
  bool Wait(uint64_t timeout_ns) const { return done_.Wait(started_, timeout_ns); }
  // The finished job's status.
  const Status& result() const { return result_; }

 private:
  DmaWorker();
  void Loop();

  std::function<Status()> job_;  // written before doorbell_ advances
  Status result_;                // written before done_ advances
  const int owner_pid_;          // the process whose thread plays the engine
  std::atomic<bool> held_{false};
  uint64_t started_ = 0;  // jobs started (by the holder)
  Timeline doorbell_;     // value: jobs started
  Timeline done_;         // value: jobs finished
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_DMA_WORKER_H_
