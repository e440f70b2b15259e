// A hardware queue of the simulated device: one host thread (the engine) that
// executes its commands in order.
//
// Commands travel through a ring of fixed slots, like a real device's
// descriptor ring: a submitter (serialised by a mutex that only submitters
// touch) writes the command into the next slot and publishes it by storing
// its sequence number in the slot, then rings the doorbell (a counter); the
// engine polls the doorbell, so a command crosses between CPUs in the few
// cache lines it occupies and the doorbell's. The ring grows by whole
// segments instead of blocking a submitter, so a queue that waits on an event
// never deadlocks a thread that would record it. When idle, the engine polls
// for a bounded time, then naps (a submission does not wake it; a waiter on
// the queue does), then sleeps on the doorbell (see Loop).
//
// Whoever holds the runner role runs commands: the engine thread, or a host
// thread that is about to wait for them (RunUntil) and finds the engine not
// running any, say asleep. That host thread would otherwise wait for the
// engine to wake (15-40 us on a small virtual machine) and then be woken in
// turn; running the commands itself costs neither, and leaves one thread
// busy instead of two on a host with few CPUs. It runs only the commands
// that touch nothing but device state (copies, fills, timestamps,
// executions): callbacks, host tasks, event waits and graph launches stay on
// the engine thread, which takes over from there.
#ifndef TERN_DRIVER_SHIM_SIM_SIM_QUEUE_H_
#define TERN_DRIVER_SHIM_SIM_SIM_QUEUE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/steerable_thread.h"
#include "driver_shim/driver.h"

namespace tern::sim {

class SimDevice;
struct CoreCounters;

class SimQueue final : public driver::HwQueue {
 public:
  SimQueue(SimDevice* device, uint32_t core, std::string name);
  // Finishes every submitted command, then stops the thread.
  ~SimQueue() override;

  Status Submit(driver::Command command, uint64_t* out_sequence) override;
  uint64_t submitted() const override;
  std::shared_ptr<const Timeline> completion() const override { return completion_; }
  void ClearError() override;
  void RunUntil(uint64_t target) override;
  // Brings an engine that sleeps to its napping phase (see Loop), so that
  // the next submission rings it without a futex wake. The wake-up is paid
  // here, by the caller (a loader), instead.
  void ExpectWork() override;

 private:
  // One slot of the ring: the command and the sequence number that
  // publishes it. Aligned so that a slot never shares a line with another.
  struct alignas(64) Slot {
    std::atomic<uint64_t> published{0};
    driver::Command command;
  };
  // Two lines: the engine reads a common command in one (see driver::Command).
  static_assert(sizeof(Slot) == 128, "a ring slot grew past two cache lines");
  static constexpr uint32_t kSlotsPerSegment = 256;
  struct Segment {
    Slot slots[kSlotsPerSegment];
    // Set by the submitter of the segment's last slot, before publishing it.
    std::atomic<Segment*> next{nullptr};
  };

  void Loop();
  // Takes the runner role if nobody holds it.
  bool TryTakeRunnerRole();
  void GiveBackRunnerRole();
  // Runs the published commands from next_ on, in order, up to `last`; on a
  // host thread (`on_host`) it stops before a command HostMayRun refuses.
  // Requires the runner role.
  void RunPublished(uint64_t last, bool on_host);
  // Called before a wait (`first`): where waits on the same timeline follow
  // it (with only event records and no-ops between), sleeps once until the
  // last of them is met instead of once per wait, each a futex wake-up that
  // the signalling engine pays (a stream that waits for every collective on
  // the communication stream, 1 MiB all-reduces: 43 us each instead of 34).
  // Their points then complete together, so the run stops at the point of a
  // thread asleep on this queue, and a waiter that comes later rouses the
  // engine, which looks again. Requires the runner role.
  void SleepThroughWaits(const driver::Command& first, uint64_t last);
  // Runs one command; returns its status (OK, failure, or ABORTED).
  Status Execute(uint64_t sequence, driver::Command& command);
  // Runs `command` (not a sequence) and calls its host function, if any,
  // with the outcome.
  Status RunOne(const driver::Command& command, bool traced, tern_error_class_t* error_class);
  // Runs a kSequence command's commands in order: the first failure skips
  // the rest (host functions still run, with the error). Counts each
  // command in the core's counters.
  Status RunSequence(uint64_t sequence, const driver::Command& command, bool traced,
                     tern_error_class_t* error_class);
  void TraceCommand(uint64_t sequence, const driver::Command& command, uint64_t start, uint64_t end,
                    const Status& status) const;
  std::string Describe(uint64_t sequence, const driver::Command& command) const;

  SimDevice* const device_;
  const uint32_t core_;
  const std::string name_;

  mutable std::mutex mutex_;  // submitters, ClearError(), the destructor
  // Written under mutex_; read without it (submitted() is on every wait's path).
  std::atomic<uint64_t> submitted_{0};
  Segment* tail_;              // guarded by mutex_: the segment being filled
  uint64_t resume_after_ = 0;  // guarded by mutex_: ClearError() point
  std::atomic<bool> stopping_{false};
  // A drained segment kept for reuse (engine puts, submitters take).
  std::atomic<Segment*> spare_{nullptr};

  // The engine naps and sleeps on it; its value counts the submissions and
  // the hand backs of the runner role with commands left (guarded by mutex_;
  // UINT64_MAX once the queue stops). Shared with completion_, whose waiters
  // wake the engine from a nap (Timeline::set_producer_doorbell).
  std::shared_ptr<Timeline> doorbell_ = std::make_shared<Timeline>();
  uint64_t doorbell_rings_ = 0;  // guarded by mutex_
  // Set by the engine while it sleeps on the doorbell (not while it polls
  // or naps); ExpectWork() rouses it only then.
  std::atomic<bool> sleeping_{false};
  // Set by ExpectWork(): the engine, woken, naps at once instead of polling.
  std::atomic<bool> roused_{false};
  // The engine thread, as a thread that a submitter which goes on running
  // wakes off its own CPU (common/steerable_thread.h), where this rank has
  // CPUs to spare (HostCpusPerRank() >= 2).
  SteerableThread engine_thread_;
  const bool steer_engine_;
  // Where this host runs more ranks than it has CPUs (HostCpusPerRank() < 2)
  // and the launcher says which local rank this is: the CPU the engine of a
  // queue given collectives keeps to (SteerableThread::KeepOnCpu), else -1.
  // See CommunicationEngineCpu() (engines/run_instruction.h).
  const int rank_cpu_;
  std::shared_ptr<Timeline> completion_ = std::make_shared<Timeline>();

  // Whether the last submission was a command that a polling engine leaves
  // to a waiter for a moment (LeftToWaiter in sim_queue.cc). On a line of
  // its own: the engine spins on it, and submitters write the fields above
  // at every submission but this one only when it changes.
  alignas(64) std::atomic<bool> last_left_to_waiter_{false};

  // Set while a thread holds the runner role (an atomic rather than a mutex:
  // a host function of this queue that waits on it must find it taken, not
  // lock a mutex its own thread holds). It and the runner state start a
  // cache line of their own: the runner writes them for every command, the
  // submitters the fields above for every submission.
  alignas(64) std::atomic<bool> runner_taken_{false};
  // Runner state: read and written only by the holder of the runner role.
  Segment* head_;       // the segment being drained
  uint32_t index_ = 0;  // the next command's slot in head_
  uint64_t next_ = 1;   // the next command's sequence number
  bool halted_ = false;
  uint64_t halted_at_ = 0;

  uint32_t trace_track_ = 0;          // its track in captures (common/trace.h)
  CoreCounters* counters_ = nullptr;  // this core's live counters, in the node registry

  std::thread thread_;
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_SIM_QUEUE_H_
