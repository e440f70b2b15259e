#include "driver_shim/sim/sim_queue.h"

#include <sched.h>
#include <sys/prctl.h>

#include "common/cpu_relax.h"
#include "common/cycle_clock.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "common/trace.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/engines/warm_up.h"
#include "driver_shim/sim/sim_driver.h"
#include "driver_shim/sim/waiter_grace.h"

namespace tern::sim {

using driver::Command;
using driver::CommandKind;

namespace {
// How long an idle engine polls its ring before it naps, how long each nap
// lasts, and how long it naps in all before it sleeps on the doorbell (see
// Loop).
constexpr uint64_t kEnginePollNs = 50'000;
constexpr uint64_t kEngineNapNs = 50'000;
constexpr uint64_t kEngineNapsForNs = 1'000'000;
// How long a polling engine leaves a newly submitted small command (see
// LeftToWaiter) to a host thread that may be on its way to wait for it. A
// C program that submits and then waits reaches RunUntil 0.1-0.3 us after
// its submission returns; with the engine taking the command at once, the
// two threads bounced the ring's lines between their CPUs (an empty
// command's round trip 0.23-0.29 us against 0.11-0.14 when the waiter ran
// it, on an AMD EPYC Zen 5). A time, not a count of spins: it holds on any
// CPU.
constexpr uint64_t kWaiterGraceNs = 1'000;

// The longest an engine sleeps through a run of waits (SleepThroughWaits)
// before it looks again for a waiter on one of the run's points that did not
// rouse it (one that only polled, or went to sleep as the engine did).
constexpr uint64_t kRunOfWaitsLookAgainNs = 1'000'000;
// How far ahead an engine looks for the end of a run of waits.
constexpr uint32_t kRunOfWaitsLookAhead = 256;
// The engine thread's timer slack (Linux's default for a thread is 50 us,
// which would double each nap).
constexpr unsigned long kEngineTimerSlackNs = 5'000;
}  // namespace

SimQueue::SimQueue(SimDevice* device, uint32_t core, std::string name)
    : device_(device),
      core_(core),
      name_(std::move(name)),
      steer_engine_(HostCpusPerRank() >= 2),
      rank_cpu_(CommunicationEngineCpu()) {
  tail_ = head_ = new Segment;
  counters_ = &device_->registry().core_counters(device_->index(), core_);
  trace_track_ = trace::RegisterTrack(device_->index(), core_, name_);
  CycleClock::Init();
  completion_->set_producer_doorbell(doorbell_);
  thread_ = std::thread([this] {
    const std::string name =
        "tern-queue" + std::to_string(device_->index()) + "." + std::to_string(core_);
    NameThisThread(name.c_str());
    prctl(PR_SET_TIMERSLACK, kEngineTimerSlackNs, 0, 0, 0);
    Loop();
  });
}

SimQueue::~SimQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true, std::memory_order_release);
    // Wake the engine even if nothing is pending: UINT64_MAX means "stop
    // when drained".
    doorbell_->Signal(UINT64_MAX);
    doorbell_->WakeNappers();
  }
  thread_.join();
  for (Segment* segment = head_; segment != nullptr;) {
    Segment* next = segment->next.load(std::memory_order_relaxed);
    delete segment;
    segment = next;
  }
  delete spare_.load(std::memory_order_relaxed);
}

namespace {

// The commands a host thread may run for the queue (see sim_queue.h): those
// that touch only device state and host buffers handed to the copy.
bool HostMayRun(const Command& command) {
  switch (command.kind) {
    case CommandKind::kNop:
    case CommandKind::kCopy:
    case CommandKind::kFill:
    case CommandKind::kTimestamp:
    case CommandKind::kExecute:
      return true;
    default:
      return false;
  }
}

// Whether `command` exchanges data with other ranks: a host task (the
// collectives' transfers) or an execution whose program has collective
// instructions.
bool HasCollectives(const Command& command) {
  if (command.kind == CommandKind::kHostTask) return true;
  if (command.kind != CommandKind::kExecute || !command.details || !command.details->program) {
    return false;
  }
  const auto& functions = command.details->program->functions;
  if (command.details->function >= functions.size()) return false;
  for (const driver::Stream& stream : functions[command.details->function].streams) {
    if (stream.engine == TERN_ENGINE_COLLECTIVE) return true;
  }
  return false;
}

// Whether a napping engine must start `command` at once (see Loop): a
// command no waiting host thread could run, or an execution whose program
// exchanges data with other ranks, which may be waiting for it already.
bool WakesNappingEngine(const Command& command, bool has_collectives) {
  return !HostMayRun(command) || has_collectives;
}

// Whether a polling engine leaves `command` to a waiter for a moment (see
// kWaiterGraceNs): the small commands a host thread may run, whose cost is
// of the order of a hand-off between CPUs. Not executions: a framework
// submits them and goes on with its own work, and they start when the
// engine takes them. Not large copies and fills: the hand-off is nothing
// beside them, and which CPU moves the bytes is the engine's business (on
// a VM whose CPUs drift in speed apart, a copy benchmark compares the
// engine's CPU with itself).
constexpr uint64_t kLeftToWaiterBytes = 64 << 10;

bool LeftToWaiter(const Command& command) {
  switch (command.kind) {
    case CommandKind::kNop:
    case CommandKind::kTimestamp:
      return true;
    case CommandKind::kCopy:
    case CommandKind::kFill:
      return command.size <= kLeftToWaiterBytes;
    default:
      return false;
  }
}

}  // namespace

Status SimQueue::Submit(Command command, uint64_t* out_sequence) {
  // Decided before the command is published: from then on the engine may
  // run it and clear its details.
  const bool has_collectives = HasCollectives(command);
  const bool wakes_napping_engine = WakesNappingEngine(command, has_collectives);
  const bool left_to_waiter = LeftToWaiter(command);
  // The submitter goes on running (a waiter runs the command itself): an
  // engine woken onto its CPU would take turns with it there. Not where this
  // rank has no CPU to spare, nor for a command with collectives: the other
  // CPUs are the other ranks', and an engine pushed beside another rank's
  // polling thread made an 8 B all_reduce of two ranks on two CPUs take
  // 628 us instead of 18.
  if (steer_engine_ &&
      (sleeping_.load(std::memory_order_acquire) || (wakes_napping_engine && !has_collectives))) {
    engine_thread_.SteerOffCallingCpu();
  }
  if (rank_cpu_ >= 0 && has_collectives) (void)engine_thread_.KeepOnCpu(rank_cpu_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_.load(std::memory_order_relaxed)) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION, "queue '{}' is being destroyed", name_);
  }
  const uint64_t sequence = submitted_.load(std::memory_order_relaxed) + 1;
  submitted_.store(sequence, std::memory_order_release);
  const uint32_t index = static_cast<uint32_t>((sequence - 1) % kSlotsPerSegment);
  Slot& slot = tail_->slots[index];
  // The completed command that held this slot left its (cleared) details for
  // this thread to reuse.
  if (slot.command.details) driver::RecycleCommandDetails(std::move(slot.command.details));
  slot.command = std::move(command);
  if (index == kSlotsPerSegment - 1) {
    // The engine moves on to the next segment as soon as it has run this
    // slot's command, so the next segment is linked before it is published.
    Segment* next = spare_.exchange(nullptr, std::memory_order_acquire);
    if (next == nullptr) next = new Segment;
    tail_->next.store(next, std::memory_order_release);
    tail_ = next;
  }
  // Written only when it changes: the engine reads it while it spins, and a
  // store would take the line from it at every submission.
  if (last_left_to_waiter_.load(std::memory_order_relaxed) != left_to_waiter) {
    last_left_to_waiter_.store(left_to_waiter, std::memory_order_relaxed);
  }
  slot.published.store(sequence, std::memory_order_release);
  // Rung under the lock so the doorbell never goes backwards; costs a futex
  // wake only when the engine sleeps. A napping engine is woken at once only
  // for a command no waiting host thread could run for it (a callback, a
  // collective whose peers wait, an event wait): see Loop.
  doorbell_->Signal(++doorbell_rings_);
  if (wakes_napping_engine) doorbell_->WakeNappers();
  *out_sequence = sequence;
  return OkStatus();
}

uint64_t SimQueue::submitted() const { return submitted_.load(std::memory_order_acquire); }

void SimQueue::ClearError() {
  std::lock_guard<std::mutex> lock(mutex_);
  resume_after_ = submitted_.load(std::memory_order_relaxed);
  completion_->ClearFailure(resume_after_);
}

namespace {

// What a host task is called in errors and traces; empty if it has no name.
std::string HostTaskName(const Command& command) {
  std::string name;
  if (command.host_task != nullptr) (void)command.host_task(command.host_user_data, &name);
  return name;
}

// A skipped graph launch: its host functions still run, with `code`.
void CallHostFunctions(const Command& command, tern_status_t code) {
  if (!command.details || !command.details->launch || !command.details->launch->sequence) return;
  const driver::SequenceLaunch& launch = *command.details->launch;
  const std::vector<Command>& commands = launch.sequence->commands;
  auto replacement = launch.replacements.begin();
  for (uint32_t index = 0; index < commands.size(); ++index) {
    const Command* sub = &commands[index];
    if (replacement != launch.replacements.end() && replacement->first == index) {
      sub = &replacement->second;
      ++replacement;
    }
    if (sub->kind == CommandKind::kHostFunction) sub->host_function(sub->host_user_data, code);
  }
}

}  // namespace

std::string SimQueue::Describe(uint64_t sequence, const Command& command) const {
  std::string what;
  if (command.kind == CommandKind::kHostTask) what = HostTaskName(command);
  if (what.empty()) what = driver::CommandKindName(command.kind);
  return fmt::format("command {} ({}) on queue '{}' of device {} core {}", sequence, what, name_,
                     device_->index(), core_);
}

Status SimQueue::Execute(uint64_t sequence, Command& command) {
  if (halted_) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (resume_after_ >= halted_at_ && sequence > resume_after_) halted_ = false;
  }
  if (halted_) {
    uint64_t failed_at = 0;
    Status failure = completion_->CurrentFailure(&failed_at);
    const tern_status_t code = failure.ok() ? TERN_ERROR_ABORTED : failure.code();
    if (command.kind == CommandKind::kHostFunction) {
      command.host_function(command.host_user_data, code);
    } else if (command.kind == CommandKind::kSequence) {
      CallHostFunctions(command, code);
    }
    return MakeStatus(TERN_ERROR_ABORTED, "{} was skipped because command {} failed",
                      Describe(sequence, command), failed_at);
  }

  // Traced commands need timestamps on the trace's clock; the others only a
  // duration, from the cheaper cycle clock.
  const bool traced = trace::Recording();
  const uint64_t start = traced ? MonotonicNs() : CycleClock::Now();
  Status status;
  tern_error_class_t error_class = TERN_ERROR_CLASS_OTHER;
  if (command.kind == CommandKind::kSequence) {
    status = RunSequence(sequence, command, traced, &error_class);
  } else {
    status = RunOne(command, traced, &error_class);
  }
  const uint64_t end = traced ? MonotonicNs() : CycleClock::Now();
  const uint64_t run_ns = traced ? end - start : CycleClock::ToNs(end - start);
  if (traced) TraceCommand(sequence, command, start, end, status);

  CoreCounters& counters = *counters_;
  if (command.kind == CommandKind::kSequence) {
    // Its commands were counted one by one, like commands of the queue.
  } else {
    counters.commands.fetch_add(1, std::memory_order_relaxed);
  }
  if (command.kind != CommandKind::kWait && command.kind != CommandKind::kSequence) {
    counters.busy_ns.fetch_add(run_ns, std::memory_order_relaxed);
    counters.CountLatency(run_ns);
  }
  if (command.kind == CommandKind::kExecute && status.ok()) {
    counters.executions.fetch_add(1, std::memory_order_relaxed);
  }
  if (!status.ok()) {
    counters.errors[error_class].fetch_add(1, std::memory_order_relaxed);
    status = Status(status.code(),
                    fmt::format("{} failed: {}", Describe(sequence, command), status.message()));
    TERN_LOG_WARN("{}", status.message());
    halted_ = true;
    halted_at_ = sequence;
    completion_->Fail(sequence, status);
  }
  return status;
}

Status SimQueue::RunOne(const Command& command, bool traced, tern_error_class_t* error_class) {
  Status status;
  if (command.kind == CommandKind::kWait) {
    if (command.details && command.details->wait_timeline) {
      const driver::CommandDetails& wait = *command.details;
      wait.wait_timeline->Wait(wait.wait_value, UINT64_MAX);
      Status dependency = wait.wait_timeline->FailureAt(wait.wait_value);
      if (!dependency.ok()) {
        status =
            MakeStatus(TERN_ERROR_DEPENDENCY_FAILED, "it waited on {}, which failed: {}",
                       driver::DescribeEventRecord(wait.wait_value, wait.wait_queue_name.get()),
                       dependency.message());
      }
    }
    return status;
  }
  status = device_->Run(core_, command, error_class, traced ? trace_track_ : 0);
  if (status.ok() && command.kind == CommandKind::kHostTask && command.host_task != nullptr) {
    status = command.host_task(command.host_user_data, nullptr);
  }
  // A callback always runs, even when its own command failed, so that the
  // caller can release what it holds.
  if (command.kind == CommandKind::kHostFunction) {
    command.host_function(command.host_user_data, status.ok() ? TERN_OK : status.code());
  }
  return status;
}

Status SimQueue::RunSequence(uint64_t sequence, const Command& command, bool traced,
                             tern_error_class_t* error_class) {
  if (!command.details || !command.details->launch || !command.details->launch->sequence) {
    *error_class = TERN_ERROR_CLASS_INVALID_COMMAND;
    return MakeStatus(TERN_ERROR_INTERNAL, "graph launch command without a sequence");
  }
  const driver::CommandDetails& details = *command.details;
  // The previous launch of the same graph, on another queue: the graph's
  // commands share its scratch memory. Its outcome is its own queue's.
  if (details.wait_timeline) details.wait_timeline->Wait(details.wait_value, UINT64_MAX);
  const driver::SequenceLaunch& launch = *details.launch;
  const std::vector<Command>& commands = launch.sequence->commands;
  auto replacement = launch.replacements.begin();
  CoreCounters& counters = *counters_;
  Status failure;
  uint64_t failed_index = 0;
  for (uint32_t index = 0; index < commands.size(); ++index) {
    const Command* sub = &commands[index];
    if (replacement != launch.replacements.end() && replacement->first == index) {
      sub = &replacement->second;
      ++replacement;
    }
    counters.commands.fetch_add(1, std::memory_order_relaxed);
    if (!failure.ok()) {
      if (sub->kind == CommandKind::kHostFunction) {
        sub->host_function(sub->host_user_data, failure.code());
      }
      continue;
    }
    const uint64_t start = traced ? MonotonicNs() : CycleClock::Now();
    Status status = RunOne(*sub, traced, error_class);
    const uint64_t end = traced ? MonotonicNs() : CycleClock::Now();
    if (traced) TraceCommand(sequence, *sub, start, end, status);
    if (sub->kind != CommandKind::kWait) {
      const uint64_t run_ns = traced ? end - start : CycleClock::ToNs(end - start);
      counters.busy_ns.fetch_add(run_ns, std::memory_order_relaxed);
      counters.CountLatency(run_ns);
    }
    if (sub->kind == CommandKind::kExecute && status.ok()) {
      counters.executions.fetch_add(1, std::memory_order_relaxed);
    }
    if (!status.ok()) {
      failure = std::move(status);
      failed_index = index;
    }
  }
  if (failure.ok()) return failure;
  return Status(failure.code(), fmt::format("command {} ({}) of {} failed: {}", failed_index,
                                            driver::CommandKindName(commands[failed_index].kind),
                                            launch.sequence->name, failure.message()));
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
    case CommandKind::kHostTask: {
      std::string task_name = HostTaskName(command);
      if (!task_name.empty()) name = std::move(task_name);
      break;
    }
    case CommandKind::kExecute:
      if (command.details && command.details->program &&
          command.details->function < command.details->program->functions.size()) {
        name = fmt::format("execute {}",
                           command.details->program->functions[command.details->function].name);
      }
      break;
    default:
      break;
  }
  if (!status.ok()) args += fmt::format(", \"error\": \"{}\"", tern_status_string(status.code()));
  trace::Span(trace_track_, name, "queue", start, end, std::move(args));
}

bool SimQueue::TryTakeRunnerRole() {
  // A look first: a waiter that finds the engine busy must not write the
  // line the engine reads.
  if (runner_taken_.load(std::memory_order_relaxed)) return false;
  bool expected = false;
  return runner_taken_.compare_exchange_strong(expected, true, std::memory_order_acquire,
                                               std::memory_order_relaxed);
}

void SimQueue::GiveBackRunnerRole() { runner_taken_.store(false, std::memory_order_release); }

void SimQueue::RunPublished(uint64_t last, bool on_host) {
  while (next_ <= last) {
    Slot& slot = head_->slots[index_];
    if (slot.published.load(std::memory_order_acquire) < next_) return;
    if (on_host && !HostMayRun(slot.command)) return;
    if (slot.command.kind == CommandKind::kWait) SleepThroughWaits(slot.command, last);
    (void)Execute(next_, slot.command);
    // Release what the command kept alive before the waiter wakes up. The
    // other fields stay: the next submitter to use the slot overwrites them,
    // and reuses the details object (driver::RecycleCommandDetails).
    if (slot.command.keep_alive) slot.command.keep_alive.reset();
    if (slot.command.details) slot.command.details->Clear();
    completion_->Signal(next_);
    ++next_;
    if (++index_ == kSlotsPerSegment) {
      Segment* drained = head_;
      head_ = drained->next.load(std::memory_order_acquire);
      index_ = 0;
      for (Slot& used : drained->slots) used.published.store(0, std::memory_order_relaxed);
      drained->next.store(nullptr, std::memory_order_relaxed);
      delete spare_.exchange(drained, std::memory_order_acq_rel);
    }
  }
}

void SimQueue::SleepThroughWaits(const Command& first, uint64_t last) {
  if (!first.details || !first.details->wait_timeline || halted_) return;
  const std::shared_ptr<const Timeline>& timeline = first.details->wait_timeline;
  if (timeline->value() >= first.details->wait_value) return;
  const std::atomic<uint64_t>& relayed = doorbell_->relayed_wakes();
  bool relaying = false;
  while (true) {
    // Seen before the sleepers are looked at: a waiter that registers later
    // and finds the relay set changes it (Timeline::Sleep).
    const uint64_t seen = relayed.load(std::memory_order_seq_cst);
    // The run: waits on the same timeline, with event records and no-ops
    // between them, published behind this wait and not past the point of
    // any thread asleep on this queue (that point needs every wait before
    // it anyway; one past it would be held back).
    const uint64_t limit =
        std::min({last, next_ + kRunOfWaitsLookAhead, completion_->lowest_sleeper_target()});
    uint64_t furthest = first.details->wait_value;
    uint64_t run_end = next_;
    const Segment* segment = head_;
    uint32_t index = index_;
    for (uint64_t sequence = next_ + 1; sequence <= limit; ++sequence) {
      if (++index == kSlotsPerSegment) {
        segment = segment->next.load(std::memory_order_acquire);
        index = 0;
        if (segment == nullptr) break;
      }
      const Slot& slot = segment->slots[index];
      if (slot.published.load(std::memory_order_acquire) < sequence) break;
      const Command& command = slot.command;
      if (command.kind == CommandKind::kTimestamp || command.kind == CommandKind::kNop) continue;
      if (command.kind != CommandKind::kWait || !command.details ||
          command.details->wait_timeline != timeline) {
        break;
      }
      furthest = std::max(furthest, command.details->wait_value);
      run_end = sequence;
    }
    // A lone wait is Wait()'s: it polls, then sleeps.
    if (run_end == next_ || timeline->value() >= furthest) break;
    if (!relaying) {
      // Set, then look again: a waiter that registered before it was set
      // is in the next look at the sleepers.
      doorbell_->set_wake_relay(timeline);
      relaying = true;
      continue;
    }
    // Roused early (a waiter on this queue, a signal for another sleeper,
    // or the time to look again): look again.
    if (timeline->SleepOnce(furthest, kRunOfWaitsLookAgainNs, relayed, seen)) break;
  }
  if (relaying) doorbell_->set_wake_relay(nullptr);
}

void SimQueue::RunUntil(uint64_t target) {
  if (completion_->value() >= target || !TryTakeRunnerRole()) return;
  RunPublished(target, /*on_host=*/true);
  GiveBackRunnerRole();
  // The engine may have found the role taken and gone to sleep: ring for it
  // if commands are left.
  std::lock_guard<std::mutex> lock(mutex_);
  if (completion_->value() < submitted_.load(std::memory_order_relaxed) &&
      !stopping_.load(std::memory_order_relaxed)) {
    doorbell_->Signal(++doorbell_rings_);
  }
}

void SimQueue::ExpectWork() {
  if (steer_engine_ && sleeping_.load(std::memory_order_acquire)) {
    engine_thread_.SteerOffCallingCpu();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_.load(std::memory_order_relaxed) || !sleeping_.load(std::memory_order_acquire)) {
    return;
  }
  roused_.store(true, std::memory_order_release);
  doorbell_->Signal(++doorbell_rings_);
}

void SimQueue::Loop() {
  engine_thread_.BindToCallingThread();
  WarmUpThisThread();
  // After ExpectWork() woke the engine: straight to the naps. Polling, it
  // took the first execution after a load and ran it on its own thread,
  // whose caches the load (done by the host thread that then waits and
  // would run it) had not warmed.
  bool nap_at_once = false;
  WaiterGrace grace;
  bool granted = false;
  while (true) {
    // Read before looking for commands: a submission or hand back after
    // this point rings past it, so the wait below cannot miss it.
    const uint64_t rings = doorbell_->value();
    uint64_t ran = 0;
    if (TryTakeRunnerRole()) {
      const uint64_t first = next_;
      RunPublished(UINT64_MAX, /*on_host=*/false);
      ran = next_ - first;
      const bool done = stopping_.load(std::memory_order_acquire) &&
                        next_ > submitted_.load(std::memory_order_acquire);
      GiveBackRunnerRole();
      if (done) return;
    }
    // A waiter used the grace if it ran the commands (or holds the role).
    if (granted) grace.Note(/*used=*/ran == 0);
    granted = false;
    if (!nap_at_once && doorbell_->Poll(rings + 1, kEnginePollNs)) {
      // The flag is a hint (a later submission may have rung too): at worst
      // a command starts kWaiterGraceNs later. Not while a thread sleeps on
      // this queue's completion: it waits for the engine, not for itself.
      if (last_left_to_waiter_.load(std::memory_order_relaxed) &&
          completion_->lowest_sleeper_target() == UINT64_MAX && grace.Allowed()) {
        granted = true;
        // Ended early by a submission that is not left to a waiter.
        const uint64_t until = MonotonicNs() + kWaiterGraceNs;
        while (MonotonicNs() < until && last_left_to_waiter_.load(std::memory_order_relaxed)) {
          CpuRelax();
        }
      }
      continue;
    }
    nap_at_once = false;
    // Then it naps for a while before it sleeps: a submitter rings a
    // napping engine without a futex wake (5-20 us of the submitter's time
    // on a small VM, for a wake-up that lands 15-25 us later), which is what
    // a host thread that submits and then waits would pay before running the
    // command itself (RunUntil). A command nobody waits for starts when the
    // nap ends; a waiter on the queue ends the nap at once
    // (Timeline::set_producer_doorbell).
    bool rung = false;
    engine_thread_.BeforeSleep();
    for (uint64_t napped = 0; !rung && napped < kEngineNapsForNs; napped += kEngineNapNs) {
      rung = doorbell_->Nap(rings + 1, kEngineNapNs);
    }
    // UINT64_MAX (stopping) wraps to 0: no waiting, the loop drains and ends.
    if (!rung) {
      sleeping_.store(true, std::memory_order_release);
      doorbell_->Sleep(rings + 1, UINT64_MAX);
      sleeping_.store(false, std::memory_order_relaxed);
      nap_at_once = roused_.exchange(false, std::memory_order_acq_rel);
    }
    engine_thread_.AfterWake();
  }
}

}  // namespace tern::sim
