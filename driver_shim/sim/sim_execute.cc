// Running a loaded program on the simulated engines: on the queue's thread,
// the engines run the function's streams (engine_streams.h), each
// instruction's kernel on the engine view of device memory, split across the
// kernel pool's threads (engines/kernel_pool.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/logging.h"
#include "common/timeline.h"
#include "common/trace.h"
#include "driver_shim/sim/engine_streams.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/sim_driver.h"

namespace tern::sim {

using driver::Command;

namespace {

// Where one execution's operands live: a base address per segment.
struct SegmentBases {
  std::span<uint8_t* const> inputs;
  std::span<uint8_t* const> outputs;
  uint8_t* constants = nullptr;
  uint8_t* scratch = nullptr;

  uint8_t* Of(const isa::OperandDesc& desc) const {
    switch (desc.segment) {
      case TERN_SEGMENT_INPUT:
        return desc.index < inputs.size() ? inputs[desc.index] : nullptr;
      case TERN_SEGMENT_OUTPUT:
        return desc.index < outputs.size() ? outputs[desc.index] : nullptr;
      case TERN_SEGMENT_CONSTANT:
        return constants;
      case TERN_SEGMENT_SCRATCH:
        return scratch;
      default:
        return nullptr;
    }
  }
};

// Resolves `instruction`'s operands against `bases` and runs its kernel,
// recording a span on `trace_track` (0: none).
Status RunResolved(const driver::Instruction& instruction, const SegmentBases& bases,
                   uint32_t trace_track) {
  // Most instructions have a few operands: no allocation for them.
  constexpr size_t kInlineViews = 8;
  TensorView inline_views[kInlineViews];
  std::vector<TensorView> more_views;
  const size_t count = instruction.operands.size();
  if (count > kInlineViews) more_views.resize(count);
  const std::span<TensorView> views = count > kInlineViews
                                          ? std::span<TensorView>(more_views)
                                          : std::span<TensorView>(inline_views, count);
  for (size_t j = 0; j < instruction.operands.size(); ++j) {
    const isa::OperandDesc& desc = instruction.operands[j];
    views[j].desc = &desc;
    if (!desc.present()) continue;
    uint8_t* base = bases.Of(desc);
    if (base == nullptr) {
      return MakeStatus(TERN_ERROR_INTERNAL, "operand {} has no memory bound", j);
    }
    views[j].data = base + desc.offset;
  }
  const uint64_t started = trace_track != 0 ? MonotonicNs() : 0;
  Status result = RunInstruction(instruction, views);
  if (trace_track != 0) {
    trace::Span(
        trace_track,
        instruction.debug_op.empty() ? isa::OpcodeName(instruction.opcode) : instruction.debug_op,
        isa::EngineName(instruction.engine), started, MonotonicNs(),
        fmt::format("\"core\": {}, \"position\": {}, \"opcode\": \"{}\"", instruction.core,
                    instruction.position, isa::OpcodeName(instruction.opcode)));
  }
  return result;
}

// A function is rehearsed at load when one run of it costs the loader about
// as much as an execution's own overhead: at most this many multiply-adds
// (products and convolutions; ~10-40 us on one core) and this many bytes of
// operands in all, and no collective (its peers would wait for it).
constexpr uint64_t kRehearsalMaxMacs = uint64_t{4} << 20;
constexpr uint64_t kRehearsalMaxBytes = uint64_t{1} << 20;

bool WorthRehearsing(const driver::Function& function) {
  uint64_t macs = 0, bytes = function.scratch_bytes;
  for (const driver::TensorSignature& t : function.inputs) bytes += t.size_bytes;
  for (const driver::TensorSignature& t : function.outputs) bytes += t.size_bytes;
  if (bytes > kRehearsalMaxBytes) return false;
  for (const driver::Stream& stream : function.streams) {
    if (stream.engine == TERN_ENGINE_COLLECTIVE) return false;
    for (const driver::Instruction& instruction : stream.instructions) {
      if (instruction.operands.empty() || !instruction.operands[0].present()) continue;
      const isa::OperandDesc& out = instruction.operands[0];
      const uint64_t out_elements = static_cast<uint64_t>(out.element_count());
      if (instruction.opcode == TERN_OP_MATMUL && instruction.operands.size() > 1 &&
          instruction.operands[1].rank > 0) {
        const isa::OperandDesc& a = instruction.operands[1];
        macs += out_elements * static_cast<uint64_t>(a.shape[a.rank - 1]);
      } else if (instruction.opcode == TERN_OP_CONV2D ||
                 instruction.opcode == TERN_OP_CONV2D_BACKWARD_INPUT ||
                 instruction.opcode == TERN_OP_CONV2D_BACKWARD_WEIGHT) {
        return false;  // rarely small; not estimated
      }
      bytes += out_elements * isa::DTypeSize(out.dtype);
      if (macs > kRehearsalMaxMacs || bytes > kRehearsalMaxBytes) return false;
    }
  }
  return true;
}

// Zeroed host memory of at least `bytes` (never null), 4096-aligned as
// device allocations are.
std::unique_ptr<uint8_t, decltype(&std::free)> ZeroedHostMemory(uint64_t bytes) {
  const size_t size = (std::max<uint64_t>(bytes, 1) + 4095) / 4096 * 4096;
  auto* memory = static_cast<uint8_t*>(std::aligned_alloc(4096, size));
  if (memory != nullptr) std::memset(memory, 0, size);
  return {memory, &std::free};
}

}  // namespace

void SimDevice::PrepareProgram(driver::Program& program, const driver::MemoryRef& constants) {
  Status status;
  const uint8_t* constants_base =
      program.constants_bytes > 0 ? EnginePointer(constants, 0, &status) : nullptr;
  if (!status.ok()) constants_base = nullptr;  // prepared without them; executions report
  for (driver::Function& function : program.functions) {
    for (driver::Stream& stream : function.streams) {
      for (driver::Instruction& instruction : stream.instructions) {
        instruction.prepared = PrepareInstruction(instruction, constants_base);
      }
    }
  }
  // A small function's first execution in a process used to cost 2.5-4x a
  // warm one (a 16x256->512->10 MLP: 55-80 us against 16-24): the first
  // pass through its kernels' code and state (a relu's first call took
  // 6.7 us, its later ones 0.5) and through the engines' bookkeeping. The
  // loader runs it once now on zeroed memory of its own.
  if (constants_base != nullptr || program.constants_bytes == 0) {
    for (const driver::Function& function : program.functions) {
      if (WorthRehearsing(function)) Rehearse(function, constants_base);
    }
  }
}

void SimDevice::Rehearse(const driver::Function& function, const uint8_t* constants) {
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> memory;
  std::vector<uint8_t*> inputs, outputs;
  for (const driver::TensorSignature& t : function.inputs) {
    memory.push_back(ZeroedHostMemory(t.size_bytes));
    inputs.push_back(memory.back().get());
  }
  for (const driver::TensorSignature& t : function.outputs) {
    memory.push_back(ZeroedHostMemory(t.size_bytes));
    outputs.push_back(memory.back().get());
  }
  memory.push_back(ZeroedHostMemory(function.scratch_bytes));
  for (const auto& m : memory) {
    if (m == nullptr) return;  // no memory for it: the first execution pays instead
  }
  SegmentBases bases{inputs, outputs, const_cast<uint8_t*>(constants), memory.back().get()};
  // In a capture, on a track of its own: "rehearse <function>".
  uint32_t track = 0;
  if (trace::Recording()) {
    std::call_once(loader_track_once_,
                   [&] { loader_track_ = trace::RegisterTrack(index(), 0, "loader"); });
    track = loader_track_;
  }
  const uint64_t started = track != 0 ? MonotonicNs() : 0;
  // One span for the whole rehearsal, none per instruction: a profile's
  // per-op sums count executions only.
  const RunOneInstruction run_one = [&](const driver::Instruction& instruction) {
    return RunResolved(instruction, bases, /*trace_track=*/0);
  };
  // Every engine on this thread, in the concurrent schedule's order,
  // whatever the device's schedule: a random one numbers its executions (a
  // rehearsal is not one), and the DMA thread beside this one would race on
  // the rehearsal's memory in a racy program loaded anyway.
  tern_error_class_t ignored;
  const Status status = RunEngineStreams(function, ScheduleMode{ScheduleMode::kOneThread, 0},
                                         MonotonicNs() + exec_timeout_ns(), run_one, &ignored);
  if (track != 0) {
    trace::Span(track, "rehearse " + function.name, "load", started, MonotonicNs(),
                fmt::format("\"ok\": {}", status.ok()));
  }
  if (!status.ok()) {
    TERN_LOG_DEBUG("rehearsing function '{}' at load: {} (its executions report their own)",
                   function.name, status.message());
  }
}

Status SimDevice::ExecuteProgram(uint32_t core, const Command& command,
                                 tern_error_class_t* out_class, uint32_t trace_track) {
  if (!command.details || !command.details->program ||
      command.details->function >= command.details->program->functions.size()) {
    *out_class = TERN_ERROR_CLASS_INVALID_COMMAND;
    return MakeStatus(TERN_ERROR_INTERNAL, "execute command without a valid program or function");
  }
  const driver::CommandDetails& run = *command.details;
  const driver::Function& function = run.program->functions[run.function];
  const uint64_t deadline = MonotonicNs() + exec_timeout_ns();

  // Each segment's engine address, once per execution. Extents were checked
  // at load and bindings at submission: size 0 here.
  Status status;
  std::vector<uint8_t*> inputs(run.inputs.size()), outputs(run.outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = EnginePointer(run.inputs[i], 0, &status);
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i] = EnginePointer(run.outputs[i], 0, &status);
  }
  uint8_t* constants = EnginePointer(run.constants, 0, &status);
  uint8_t* scratch = EnginePointer(run.scratch, 0, &status);
  if (!status.ok()) {
    *out_class = TERN_ERROR_CLASS_INVALID_COMMAND;
    return status;
  }
  const SegmentBases bases{inputs, outputs, constants, scratch};
  // Called on this thread and, for DMA instructions, on the DMA thread.
  const RunOneInstruction run_one = [&](const driver::Instruction& instruction) {
    return RunResolved(instruction, bases, trace_track);
  };
  (void)core;
  return RunEngineStreams(function, driver_->config().schedule, deadline, run_one, out_class);
}

}  // namespace tern::sim
