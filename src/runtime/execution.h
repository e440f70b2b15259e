// Preparing an execution command, shared by tern_queue_execute (and the I/O
// sets, in api_executable.cc) and by the graphs that record executions
// (api_graph.cc): every check of the executable, the function and the
// bindings, written once.
#ifndef TERN_SRC_RUNTIME_EXECUTION_H_
#define TERN_SRC_RUNTIME_EXECUTION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "driver_shim/driver.h"
#include "src/runtime/runtime_state.h"
#include "tern/executable.h"

namespace tern {

struct PreparedExecution {
  // kExecute with program, function, inputs, outputs and constants set; the
  // scratch is the caller's to place (scratch_bytes of it).
  driver::Command command;
  uint64_t scratch_bytes = 0;
  // Keeps the executable's constants alive while the command may run.
  std::shared_ptr<void> constants;
};

// Checks `executable` (live, loaded on `device`), `function` and every
// binding (live buffer of `device`, range large enough) as
// tern_queue_execute() does, and fills `out`. `place` ends the sentence
// about a device mismatch: "the queue runs on device 1", "the graph records
// for device 1" ("the queue runs on", "the graph records for").
Status PrepareExecution(Runtime* rt, DeviceObject* device, const char* place,
                        tern_executable_t executable, uint32_t function,
                        const tern_binding_t* inputs, uint32_t input_count,
                        const tern_binding_t* outputs, uint32_t output_count,
                        PreparedExecution* out);

// OK when `executable` is a live executable handle, else the error
// tern_queue_execute() gives (INVALID_HANDLE, "already unloaded"). `arg`
// names it. Lock-free; for checks at every launch.
Status CheckExecutableLive(Runtime* rt, tern_executable_t executable, const char* arg);

}  // namespace tern

#endif  // TERN_SRC_RUNTIME_EXECUTION_H_
