// The validating loader (docs/executable-format.md, "What the loader
// checks"): checks an executable completely and turns it into the program the
// driver runs. Device-independent: the public API (src/runtime/
// api_executable.cc) places the constants; the fuzzer calls this directly.
#ifndef TERN_SRC_EXECUTABLE_LOADER_H_
#define TERN_SRC_EXECUTABLE_LOADER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "common/status_with_message.h"
#include "driver_shim/program.h"

namespace tern::exe {

struct ValidatedExecutable {
  std::shared_ptr<driver::Program> program;
  // Where the constants segment (program->constants_bytes) lies in the data.
  uint64_t constants_offset = 0;
};

struct LoadOptions {
  // Races between engine streams (hazards.h) are logged, not refused.
  bool allow_races = false;
  // The memory of the device the executable is loaded on: no segment
  // (constants, a function's scratch, an input or output) may be larger.
  // 0 when no device is known (the fuzzer, the dumper): then only the
  // format's limit, kMaxSegmentBytes, applies.
  uint64_t device_memory_bytes = 0;
};

// Validates `data` (every rule of the spec, and the static race check of each
// function's engine streams) and builds the program: names, signatures and
// the schedule are copied out of `data`. Fails with
// TERN_ERROR_EXECUTABLE_INVALID, _UNSUPPORTED or _CHECKSUM.
// Thread-safety: any thread.
Status ValidateExecutable(std::span<const uint8_t> data, ValidatedExecutable* out,
                          const LoadOptions& options = {});

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_LOADER_H_
