// Running a loaded program on the simulated engines: the process's compute
// thread (compute_worker.h) walks the function's schedule (an order of the
// engine streams that honours their semaphores, fixed at load) and runs each
// instruction's kernel on the engine view of device memory, while the queue's
// thread waits for it.
#include <fmt/format.h>

#include "common/timeline.h"
#include "common/trace.h"
#include "driver_shim/sim/compute_worker.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/sim_driver.h"

namespace tern::sim {

using driver::Command;

Status SimDevice::ExecuteProgram(uint32_t core, const Command& command,
                                 tern_error_class_t* out_class, uint32_t trace_track) {
  return RunOnComputeThread(
      [&] { return ExecuteProgramHere(core, command, out_class, trace_track); });
}

Status SimDevice::ExecuteProgramHere(uint32_t core, const Command& command,
                                     tern_error_class_t* out_class, uint32_t trace_track) {
  if (!command.details || !command.details->program ||
      command.details->function >= command.details->program->functions.size()) {
    *out_class = TERN_ERROR_CLASS_INVALID_COMMAND;
    return MakeStatus(TERN_ERROR_INTERNAL, "execute command without a valid program or function");
  }
  const driver::CommandDetails& run = *command.details;
  const driver::Function& function = run.program->functions[run.function];
  const uint64_t deadline = MonotonicNs() + exec_timeout_ns();
  Status status;
  auto segment_base = [&](const isa::OperandDesc& desc) -> uint8_t* {
    const driver::MemoryRef* ref = nullptr;
    switch (desc.segment) {
      case TERN_SEGMENT_INPUT:
        ref = desc.index < run.inputs.size() ? &run.inputs[desc.index] : nullptr;
        break;
      case TERN_SEGMENT_OUTPUT:
        ref = desc.index < run.outputs.size() ? &run.outputs[desc.index] : nullptr;
        break;
      case TERN_SEGMENT_CONSTANT:
        ref = &run.constants;
        break;
      case TERN_SEGMENT_SCRATCH:
        ref = &run.scratch;
        break;
      default:
        return nullptr;
    }
    if (ref == nullptr) return nullptr;
    // Extents were checked at load and bindings at submission: size 0 here.
    return EnginePointer(*ref, 0, &status);
  };

  std::vector<TensorView> views;
  for (size_t i = 0; i < function.schedule.size(); ++i) {
    const driver::Instruction& instruction = function.schedule[i];
    views.assign(instruction.operands.size(), TensorView{});
    for (size_t j = 0; j < instruction.operands.size(); ++j) {
      const isa::OperandDesc& desc = instruction.operands[j];
      views[j].desc = &desc;
      if (!desc.present()) continue;
      uint8_t* base = segment_base(desc);
      if (base == nullptr) {
        *out_class = TERN_ERROR_CLASS_INVALID_COMMAND;
        return MakeStatus(TERN_ERROR_INTERNAL, "operand {} of instruction {} has no memory bound",
                          j, i);
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
          fmt::format("\"instruction\": {}, \"opcode\": \"{}\"", i,
                      isa::OpcodeName(instruction.opcode)));
    }
    if (!result.ok()) {
      *out_class = result.code() == TERN_ERROR_EXECUTION_FAILED ? TERN_ERROR_CLASS_EXECUTION_FAILED
                                                                : TERN_ERROR_CLASS_OTHER;
      return Status(
          result.code(),
          fmt::format("function '{}', instruction {} ({} on the {} engine of core {}, "
                      "position {}){}: {}",
                      function.name, i, isa::OpcodeName(instruction.opcode),
                      isa::EngineName(instruction.engine), instruction.core, instruction.position,
                      instruction.debug_op.empty()
                          ? std::string()
                          : fmt::format(" from graph op '{}'", instruction.debug_op),
                      result.message()));
    }
    if (MonotonicNs() > deadline) {
      *out_class = TERN_ERROR_CLASS_EXEC_TIMEOUT;
      return MakeStatus(
          TERN_ERROR_EXEC_TIMEOUT,
          "function '{}' ran longer than TERN_EXEC_TIMEOUT ({:.3f} s); it was "
          "stopped after instruction {} of {}{}; raise TERN_EXEC_TIMEOUT if the "
          "work is legitimately this long",
          function.name, static_cast<double>(exec_timeout_ns()) / 1e9, i, function.schedule.size(),
          instruction.debug_op.empty() ? std::string()
                                       : fmt::format(" (graph op '{}')", instruction.debug_op));
    }
  }
  (void)core;
  return OkStatus();
}

}  // namespace tern::sim
