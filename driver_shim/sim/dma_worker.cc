#include "driver_shim/sim/dma_worker.h"

#include <unistd.h>

#include <thread>

#include "common/thread_name.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/engines/warm_up.h"

namespace tern::sim {

DmaWorker& DmaWorker::Get() {
  // Never destroyed: the thread lives as long as the process, and
  // executions may still be finishing while static destructors run.
  static DmaWorker* worker = new DmaWorker();
  return *worker;
}

DmaWorker::DmaWorker() : owner_pid_(getpid()) {
  std::thread([this] {
    NameThisThread("tern-sim-dma");
    Loop();
  }).detach();
}

bool DmaWorker::TryStart(std::function<Status()> job) {
  if (getpid() != owner_pid_) return false;  // a forked child: the thread stayed behind
  if (held_.exchange(true, std::memory_order_acquire)) return false;
  job_ = std::move(job);
  doorbell_.Signal(++started_);
  return true;
}

void DmaWorker::Loop() {
  KeepKernelsOnThisThread();
  WarmUpThisThread();
  for (uint64_t next = 1;; ++next) {
    doorbell_.Wait(next, UINT64_MAX);
    result_ = job_();
    done_.Signal(next);
  }
}

}  // namespace tern::sim
