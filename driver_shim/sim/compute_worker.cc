#include "driver_shim/sim/compute_worker.h"

#include <deque>
#include <mutex>
#include <thread>

#include "common/timeline.h"
#include "driver_shim/sim/engines/run_instruction.h"

namespace tern::sim {
namespace {

class ComputeWorker {
 public:
  ComputeWorker() {
    std::thread([this] { Loop(); }).detach();
  }

  Status Run(const std::function<Status()>& work) {
    Status result;
    uint64_t ticket = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ticket = ++submitted_;
      jobs_.push_back(Job{&work, &result});
      doorbell_.Signal(ticket);
    }
    // Jobs complete in ticket order, and `result` is written before the
    // worker signals the ticket.
    done_.Wait(ticket, UINT64_MAX);
    return result;
  }

 private:
  struct Job {
    const std::function<Status()>* work;
    Status* result;
  };

  void Loop() {
    SizeKernelThreadsForHost();
    for (uint64_t next = 1;; ++next) {
      doorbell_.Wait(next, UINT64_MAX);
      Job job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        job = jobs_.front();
        jobs_.pop_front();
      }
      *job.result = (*job.work)();
      done_.Signal(next);
    }
  }

  std::mutex mutex_;
  std::deque<Job> jobs_;    // guarded by mutex_
  uint64_t submitted_ = 0;  // guarded by mutex_
  Timeline doorbell_;       // value: the last ticket handed out
  Timeline done_;           // value: the last ticket completed
};

}  // namespace

bool ExecutionsStayOnQueueThreads() {
  static const bool stay = KernelThreadsForHost() == 1;
  return stay;
}

Status RunOnComputeThread(const std::function<Status()>& work) {
  // Never destroyed: the thread lives as long as the process, and executions
  // may still be finishing while static destructors run.
  static ComputeWorker* worker = new ComputeWorker();
  return worker->Run(work);
}

}  // namespace tern::sim
