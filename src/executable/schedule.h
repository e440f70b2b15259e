// The semaphore simulation of a function's engine streams
// (docs/executable-format.md, "Synchronisation between engines"): proves that
// the streams cannot deadlock and produces the sequential schedule the driver
// runs. Shared by the builder (early errors) and the loader.
#ifndef TERN_SRC_EXECUTABLE_SCHEDULE_H_
#define TERN_SRC_EXECUTABLE_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "common/status_with_message.h"
#include "tern/isa.h"

namespace tern::exe {

struct SyncStep {
  enum Kind : uint8_t { kCompute = 0, kSignal = 1, kWait = 2 };
  Kind kind = kCompute;
  int64_t semaphore = 0;  // kSignal/kWait
  int64_t value = 0;      // kSignal: increment (>= 0); kWait: value to reach (>= 0)
};

struct ScheduleInput {
  struct Stream {
    uint32_t core = 0;
    tern_engine_t engine = TERN_ENGINE_DMA;
    uint32_t begin = 0;  // [begin, end) in steps
    uint32_t end = 0;
  };
  std::vector<Stream> streams;
  std::vector<SyncStep> steps;
};

struct ScheduledStep {
  uint32_t stream = 0;
  uint32_t position = 0;  // index in its stream
};

// Runs the streams as the engines would (each up to its next unsatisfied wait;
// a signal wakes the waits it satisfies) and stores the order in `order`
// (every step, sync included). When streams remain blocked, fails with
// TERN_ERROR_EXECUTABLE_INVALID naming each stuck wait (the caller adds which
// function). Negative semaphores, increments or values must have been
// rejected before.
Status ScheduleStreams(const ScheduleInput& input, std::vector<ScheduledStep>* order);

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_SCHEDULE_H_
