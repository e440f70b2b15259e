// A hardware queue of the simulated device: one host thread that executes
// its commands in order, sleeping on a futex doorbell when there is nothing
// to do. Submission takes an uncontended mutex and, only when the thread
// sleeps, one futex wake.
#ifndef TERN_DRIVER_SHIM_SIM_SIM_QUEUE_H_
#define TERN_DRIVER_SHIM_SIM_SIM_QUEUE_H_

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "driver.h"

namespace tern::sim {

class SimDevice;

class SimQueue final : public driver::HwQueue {
 public:
  SimQueue(SimDevice* device, uint32_t core, std::string name);
  // Finishes every submitted command, then stops the thread.
  ~SimQueue() override;

  Status Submit(driver::Command command, uint64_t* out_sequence) override;
  uint64_t submitted() const override;
  std::shared_ptr<const Timeline> completion() const override { return completion_; }
  void ClearError() override;

 private:
  void Loop();
  // Runs one command; returns its status (OK, failure, or ABORTED).
  Status Execute(uint64_t sequence, driver::Command& command);
  void TraceCommand(uint64_t sequence, const driver::Command& command, uint64_t start, uint64_t end,
                    const Status& status) const;
  std::string Describe(uint64_t sequence, const driver::Command& command) const;

  SimDevice* const device_;
  const uint32_t core_;
  const std::string name_;

  mutable std::mutex mutex_;
  std::deque<driver::Command> pending_;  // guarded by mutex_
  uint64_t submitted_ = 0;               // guarded by mutex_
  uint64_t resume_after_ = 0;            // guarded by mutex_: ClearError() point
  bool stopping_ = false;                // guarded by mutex_

  Timeline doorbell_;  // value = last submitted sequence; the thread waits on it
  std::shared_ptr<Timeline> completion_ = std::make_shared<Timeline>();

  // Engine-thread state.
  uint32_t trace_track_ = 0;  // 0: tracing off
  bool halted_ = false;
  uint64_t halted_at_ = 0;

  std::thread thread_;
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_SIM_QUEUE_H_
