#include "sim/sim_queue.h"

#include "common/logging.h"
#include "common/trace.h"
#include "sim/sim_driver.h"

namespace tern::sim {

using driver::Command;
using driver::CommandKind;

SimQueue::SimQueue(SimDevice* device, uint32_t core, std::string name)
    : device_(device), core_(core), name_(std::move(name)) {
  trace_track_ = trace::RegisterTrack(device_->index(), core_, name_);
  thread_ = std::thread([this] { Loop(); });
}

SimQueue::~SimQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // Wake the thread even if nothing is pending: UINT64_MAX means "stop
    // when drained".
    doorbell_.Signal(UINT64_MAX);
  }
  thread_.join();
}

Status SimQueue::Submit(Command command, uint64_t* out_sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION, "queue '{}' is being destroyed", name_);
  }
  pending_.push_back(std::move(command));
  const uint64_t sequence = ++submitted_;
  // Signalled under the lock so the doorbell never goes backwards.
  doorbell_.Signal(sequence);
  *out_sequence = sequence;
  return OkStatus();
}

uint64_t SimQueue::submitted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_;
}

void SimQueue::ClearError() {
  std::lock_guard<std::mutex> lock(mutex_);
  resume_after_ = submitted_;
  completion_->ClearFailure(submitted_);
}

std::string SimQueue::Describe(uint64_t sequence, const Command& command) const {
  return fmt::format("command {} ({}) on queue '{}' of device {} core {}", sequence,
                     driver::CommandKindName(command.kind), name_, device_->index(), core_);
}

Status SimQueue::Execute(uint64_t sequence, Command& command) {
  if (halted_) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (resume_after_ >= halted_at_ && sequence > resume_after_) halted_ = false;
  }
  if (halted_) {
    uint64_t failed_at = 0;
    Status failure = completion_->CurrentFailure(&failed_at);
    if (command.kind == CommandKind::kHostFunction) {
      command.host_function(command.host_user_data, failure.ok() ? TERN_ERROR_ABORTED : failure.code());
    }
    return MakeStatus(TERN_ERROR_ABORTED, "{} was skipped because command {} failed", Describe(sequence, command),
                      failed_at);
  }

  const uint64_t start = MonotonicNs();
  Status status;
  tern_error_class_t error_class = TERN_ERROR_CLASS_OTHER;
  if (command.kind == CommandKind::kWait) {
    if (command.wait_timeline) {
      command.wait_timeline->Wait(command.wait_value, UINT64_MAX);
      Status dependency = command.wait_timeline->FailureAt(command.wait_value);
      if (!dependency.ok()) {
        status = MakeStatus(TERN_ERROR_DEPENDENCY_FAILED, "it waited on {}, which failed: {}",
                            command.wait_description, dependency.message());
      }
    }
  } else {
    status = device_->Run(core_, command, &error_class, trace_track_);
    // A callback always runs, even when its own command failed, so that the
    // caller can release what it holds.
    if (command.kind == CommandKind::kHostFunction) {
      command.host_function(command.host_user_data, status.ok() ? TERN_OK : status.code());
    }
  }
  const uint64_t end = MonotonicNs();
  if (trace_track_ != 0) TraceCommand(sequence, command, start, end, status);

  CoreCounters& counters = device_->registry().core_counters(device_->index(), core_);
  counters.commands.fetch_add(1, std::memory_order_relaxed);
  if (command.kind != CommandKind::kWait) {
    counters.busy_ns.fetch_add(end - start, std::memory_order_relaxed);
  }
  if (command.kind == CommandKind::kExecute && status.ok()) {
    counters.executions.fetch_add(1, std::memory_order_relaxed);
  }
  if (!status.ok()) {
    counters.errors[error_class].fetch_add(1, std::memory_order_relaxed);
    status = Status(status.code(), fmt::format("{} failed: {}", Describe(sequence, command), status.message()));
    TERN_LOG_WARN("{}", status.message());
    halted_ = true;
    halted_at_ = sequence;
    completion_->Fail(sequence, status);
  }
  return status;
}

void SimQueue::TraceCommand(uint64_t sequence, const Command& command, uint64_t start, uint64_t end,
                            const Status& status) const {
  std::string name = driver::CommandKindName(command.kind);
  std::string args = fmt::format("\"sequence\": {}", sequence);
  switch (command.kind) {
    case CommandKind::kCopy: {
      const char* direction = command.src.device == nullptr   ? "H2D"
                              : command.dst.device == nullptr ? "D2H"
                                                              : "D2D";
      name = fmt::format("copy {}", direction);
      args += fmt::format(", \"bytes\": {}", command.size);
      break;
    }
    case CommandKind::kFill:
      args += fmt::format(", \"bytes\": {}", command.size);
      break;
    case CommandKind::kExecute:
      if (command.program && command.function < command.program->functions.size()) {
        name = fmt::format("execute {}", command.program->functions[command.function].name);
      }
      break;
    default:
      break;
  }
  if (!status.ok()) args += fmt::format(", \"error\": \"{}\"", tern_status_string(status.code()));
  trace::Span(trace_track_, name, "queue", start, end, std::move(args));
}

void SimQueue::Loop() {
  uint64_t next = 1;
  while (true) {
    doorbell_.Wait(next, UINT64_MAX);
    Command command;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pending_.empty()) {
        if (stopping_) return;
        continue;
      }
      command = std::move(pending_.front());
      pending_.pop_front();
    }
    (void)Execute(next, command);
    // Release what the command kept alive before the waiter wakes up.
    command = Command();
    completion_->Signal(next);
    ++next;
  }
}

}  // namespace tern::sim
