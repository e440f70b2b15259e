// Running a loaded program on the simulated engines: on the queue's thread,
// the engines run the function's streams (engine_streams.h), each
// instruction's kernel on the engine view of device memory, split across the
// kernel pool's threads (engines/kernel_pool.h).
#include <fmt/format.h>

#include <span>
#include <vector>

#include "common/timeline.h"
#include "common/trace.h"
#include "driver_shim/sim/engine_streams.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/sim_driver.h"

namespace tern::sim {

using driver::Command;

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
  auto segment_base = [&](const isa::OperandDesc& desc) -> uint8_t* {
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
  };

  // Called on this thread and, for DMA instructions, on the DMA thread.
  const RunOneInstruction run_one = [&](const driver::Instruction& instruction) -> Status {
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
      uint8_t* base = segment_base(desc);
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
  };
  (void)core;
  return RunEngineStreams(function, driver_->config().schedule, deadline, run_one, out_class);
}

}  // namespace tern::sim
