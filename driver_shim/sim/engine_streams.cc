#include "driver_shim/sim/engine_streams.h"

#include <fmt/format.h>

#include <atomic>
#include <string>
#include <vector>

#include "common/timeline.h"
#include "driver_shim/sim/dma_worker.h"
#include "driver_shim/sim/engines/run_instruction.h"

namespace tern::sim {
namespace {

// Executions started in this process: with the mode's seed, the random
// schedule's generator state, so each execution interleaves differently and
// a process that runs the same executions again sees the same interleavings.
std::atomic<uint64_t> g_executions{0};

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// "the tensor engine of core 0, position 3 (matmul, graph op 'fc1')"
std::string DescribeInstruction(const driver::Instruction& instruction) {
  return fmt::format(
      "the {} engine of core {}, position {} ({}{})", isa::EngineName(instruction.engine),
      instruction.core, instruction.position, isa::OpcodeName(instruction.opcode),
      instruction.debug_op.empty() ? std::string()
                                   : fmt::format(", graph op '{}'", instruction.debug_op));
}

class StreamRunner {
 public:
  StreamRunner(const driver::Function& function, const ScheduleMode& mode, uint64_t deadline_ns,
               const RunOneInstruction& run, tern_error_class_t* out_class)
      : function_(function),
        mode_(mode),
        deadline_ns_(deadline_ns),
        run_(run),
        out_class_(out_class),
        started_ns_(MonotonicNs()) {
    std::vector<uint32_t> cores;
    engines_.reserve(function.streams.size());
    for (const driver::Stream& stream : function.streams) {
      size_t c = 0;
      while (c < cores.size() && cores[c] != stream.core) ++c;
      if (c == cores.size()) cores.push_back(stream.core);
      engines_.push_back(Engine{&stream, 0, c * isa::kMaxSemaphores});
    }
    core_count_ = cores.size();
    if (mode.kind == ScheduleMode::kRandom) {
      random_state_ = mode.seed ^ (g_executions.fetch_add(1, std::memory_order_relaxed) *
                                   0xd1b54a32d192ed03ull);
    }
  }

  Status Run() {
    Status failure;
    while (failure.ok()) {
      if (on_dma_thread_ != nullptr && DmaWorker::Get().Finished()) failure = CollectDma();
      if (!failure.ok()) break;
      if (on_dma_thread_ == nullptr && AllFinished()) return OkStatus();
      bool progressed = false;
      if (mode_.kind == ScheduleMode::kRandom) {
        if (Engine* engine = PickRandom(); engine != nullptr) {
          failure = Step(*engine, /*may_hand_off=*/false);
          progressed = true;
        }
      } else {
        // DMA engines first, so that their work is on its way before the
        // compute engines' take the compute thread.
        for (bool dma : {true, false}) {
          for (Engine& engine : engines_) {
            if ((engine.stream->engine == TERN_ENGINE_DMA) != dma || !CanGo(engine)) continue;
            failure = Step(engine, /*may_hand_off=*/mode_.kind != ScheduleMode::kOneThread);
            progressed = true;
            if (!failure.ok()) break;
          }
          if (!failure.ok()) break;
        }
      }
      if (!failure.ok()) break;
      const uint64_t now = MonotonicNs();
      if (now > deadline_ns_) {
        failure = Timeout();
      } else if (!progressed) {
        // Nothing can go on here: either the DMA engine's instruction is what
        // the others wait for, or nothing will ever signal them.
        if (on_dma_thread_ == nullptr) {
          failure = Hang();
        } else if (!DmaWorker::Get().Wait(deadline_ns_ - now)) {
          failure = Timeout();
        }
      }
    }
    // The DMA thread may still work on this execution's memory: never
    // return before it is done.
    if (on_dma_thread_ != nullptr) {
      DmaWorker::Get().Wait(UINT64_MAX);
      on_dma_thread_ = nullptr;
      DmaWorker::Get().Release();
    }
    return failure;
  }

 private:
  struct Engine {
    const driver::Stream* stream;
    size_t next;            // index of its next instruction
    size_t semaphore_base;  // its core's semaphores in semaphores_
    bool finished() const { return next == stream->instructions.size(); }
    const driver::Instruction& instruction() const { return stream->instructions[next]; }
  };

  int64_t& Semaphore(const Engine& engine, int64_t index) {
    // Made at the first sync instruction: most programs of one instruction
    // have none.
    if (semaphores_.empty()) semaphores_.assign(core_count_ * isa::kMaxSemaphores, 0);
    return semaphores_[engine.semaphore_base + static_cast<size_t>(index)];
  }

  // Whether `engine` can take its next step now.
  bool CanGo(const Engine& engine) {
    if (engine.finished() || &engine == on_dma_thread_) return false;
    const driver::Instruction& next = engine.instruction();
    return next.opcode != TERN_OP_SEM_WAIT || Semaphore(engine, next.ints[0]) >= next.ints[1];
  }

  bool AllFinished() const {
    for (const Engine& engine : engines_) {
      if (!engine.finished()) return false;
    }
    return true;
  }

  Engine* PickRandom() {
    ready_.clear();
    for (Engine& engine : engines_) {
      if (CanGo(engine)) ready_.push_back(&engine);
    }
    if (ready_.empty()) return nullptr;
    return ready_[SplitMix64(&random_state_) % ready_.size()];
  }

  // Takes `engine`'s next step: a semaphore operation, or an instruction run
  // here or handed to the DMA thread.
  Status Step(Engine& engine, bool may_hand_off) {
    const driver::Instruction& instruction = engine.instruction();
    if (instruction.opcode == TERN_OP_SEM_SIGNAL) {
      Semaphore(engine, instruction.ints[0]) += instruction.ints[1];
      ++engine.next;
      ++done_;
      return OkStatus();
    }
    if (instruction.opcode == TERN_OP_SEM_WAIT) {  // CanGo() saw it satisfied
      ++engine.next;
      ++done_;
      return OkStatus();
    }
    // (The DMA thread serves one execution at a time: when another queue's
    // execution holds it, this one's copies run here.)
    if (may_hand_off && instruction.engine == TERN_ENGINE_DMA && on_dma_thread_ == nullptr &&
        dma_thread_has_a_cpu_ && OthersCanGo(engine) &&
        DmaWorker::Get().TryStart([this, &instruction] { return run_(instruction); })) {
      on_dma_thread_ = &engine;
      return OkStatus();
    }
    Status status = run_(instruction);
    if (!status.ok()) return Failed(instruction, status);
    ++engine.next;
    ++done_;
    return OkStatus();
  }

  bool OthersCanGo(const Engine& engine) {
    for (const Engine& other : engines_) {
      if (&other != &engine && CanGo(other)) return true;
    }
    return false;
  }

  Status CollectDma() {
    Engine& engine = *on_dma_thread_;
    on_dma_thread_ = nullptr;
    const Status status = DmaWorker::Get().result();
    DmaWorker::Get().Release();
    if (!status.ok()) return Failed(engine.instruction(), status);
    ++engine.next;
    ++done_;
    return OkStatus();
  }

  Status Failed(const driver::Instruction& instruction, const Status& status) {
    *out_class_ = status.code() == TERN_ERROR_EXECUTION_FAILED ? TERN_ERROR_CLASS_EXECUTION_FAILED
                                                               : TERN_ERROR_CLASS_OTHER;
    return Status(status.code(), fmt::format("function '{}', {}: {}", function_.name,
                                             DescribeInstruction(instruction), status.message()));
  }

  // Where each unfinished engine stands, for the messages below.
  std::string Positions(bool with_semaphores) {
    std::string text;
    for (Engine& engine : engines_) {
      if (engine.finished()) continue;
      const driver::Instruction& next = engine.instruction();
      if (!text.empty()) text += "; ";
      text += DescribeInstruction(next);
      if (with_semaphores && next.opcode == TERN_OP_SEM_WAIT) {
        text += fmt::format(" waits for semaphore {} to reach {} and it is {}", next.ints[0],
                            next.ints[1], Semaphore(engine, next.ints[0]));
      } else if (&engine == on_dma_thread_) {
        text += " is running";
      } else {
        text += " is next";
      }
    }
    return text;
  }

  Status Timeout() {
    *out_class_ = TERN_ERROR_CLASS_EXEC_TIMEOUT;
    return MakeStatus(TERN_ERROR_EXEC_TIMEOUT,
                      "function '{}' ran longer than TERN_EXEC_TIMEOUT ({:.3f} s); it was stopped "
                      "after {} of {} instructions ({}); raise TERN_EXEC_TIMEOUT if the work is "
                      "legitimately this long",
                      function_.name, static_cast<double>(deadline_ns_ - started_ns_) / 1e9, done_,
                      function_.instruction_count, Positions(false));
  }

  Status Hang() {
    *out_class_ = TERN_ERROR_CLASS_EXEC_TIMEOUT;
    return MakeStatus(
        TERN_ERROR_EXEC_TIMEOUT,
        "function '{}' hangs after {} of {} instructions: every engine that has not finished "
        "waits on a semaphore that no engine can signal any more ({}); it was stopped at once "
        "instead of at TERN_EXEC_TIMEOUT. The loader refuses programs whose semaphores can "
        "deadlock, so this program reached the device without that check; fix its semaphores",
        function_.name, done_, function_.instruction_count, Positions(true));
  }

  const driver::Function& function_;
  const ScheduleMode mode_;
  const uint64_t deadline_ns_;
  const RunOneInstruction& run_;
  tern_error_class_t* out_class_;
  const uint64_t started_ns_;
  std::vector<Engine> engines_;
  size_t core_count_ = 0;
  std::vector<int64_t> semaphores_;  // kMaxSemaphores per core of the function
  Engine* on_dma_thread_ = nullptr;  // whose instruction the DMA thread runs
  // On a host whose CPUs the compute thread's kernels all use, a DMA thread
  // beside them would only slow them down (their OpenMP team stalls when
  // one of its threads loses its CPU): measured 1.35x the time of running
  // the two one after the other on 2 CPUs. The DMA engine then takes its
  // turn on the compute thread.
  const bool dma_thread_has_a_cpu_ = KernelsLeaveACpuFree();
  uint64_t done_ = 0;  // instructions finished, sync included
  uint64_t random_state_ = 0;
  std::vector<Engine*> ready_;  // PickRandom()'s scratch
};

}  // namespace

Status RunEngineStreams(const driver::Function& function, const ScheduleMode& mode,
                        uint64_t deadline_ns, const RunOneInstruction& run,
                        tern_error_class_t* out_class) {
  return StreamRunner(function, mode, deadline_ns, run, out_class).Run();
}

}  // namespace tern::sim
