#include "src/executable/schedule.h"

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <string>
#include <utility>

#include "common/isa_rules.h"

namespace tern::exe {
namespace {

struct Semaphore {
  int64_t value = 0;
  // Streams blocked on this semaphore, smallest needed value first.
  std::priority_queue<std::pair<int64_t, uint32_t>, std::vector<std::pair<int64_t, uint32_t>>,
                      std::greater<>>
      waiters;
};

}  // namespace

Status ScheduleStreams(const ScheduleInput& input, std::vector<ScheduledStep>* order) {
  order->clear();
  order->reserve(input.steps.size());
  bool has_sync = false;
  for (const SyncStep& step : input.steps) {
    if (step.kind != SyncStep::kCompute) {
      has_sync = true;
      break;
    }
  }
  if (!has_sync) {
    // Nothing orders the streams: run them one after the other.
    for (uint32_t s = 0; s < input.streams.size(); ++s) {
      const auto& stream = input.streams[s];
      for (uint32_t i = stream.begin; i < stream.end; ++i) order->push_back({s, i - stream.begin});
    }
    return OkStatus();
  }

  std::map<std::pair<uint32_t, int64_t>, Semaphore> semaphores;
  std::vector<uint32_t> position(input.streams.size(), 0);
  std::queue<uint32_t> runnable;
  for (uint32_t s = 0; s < input.streams.size(); ++s) runnable.push(s);
  while (!runnable.empty()) {
    const uint32_t s = runnable.front();
    runnable.pop();
    const auto& stream = input.streams[s];
    const uint32_t count = stream.end - stream.begin;
    while (position[s] < count) {
      const SyncStep& step = input.steps[stream.begin + position[s]];
      if (step.kind == SyncStep::kWait) {
        Semaphore& sem = semaphores[{stream.core, step.semaphore}];
        if (sem.value < step.value) {
          sem.waiters.push({step.value, s});
          break;
        }
      } else if (step.kind == SyncStep::kSignal) {
        Semaphore& sem = semaphores[{stream.core, step.semaphore}];
        // Saturate: a semaphore at INT64_MAX satisfies every wait anyway.
        sem.value = step.value > INT64_MAX - sem.value ? INT64_MAX : sem.value + step.value;
        while (!sem.waiters.empty() && sem.waiters.top().first <= sem.value) {
          runnable.push(sem.waiters.top().second);
          sem.waiters.pop();
        }
      }
      order->push_back({s, position[s]});
      ++position[s];
    }
  }

  std::string stuck;
  size_t stuck_count = 0;
  for (uint32_t s = 0; s < input.streams.size(); ++s) {
    const auto& stream = input.streams[s];
    if (position[s] >= stream.end - stream.begin) continue;
    const SyncStep& step = input.steps[stream.begin + position[s]];
    ++stuck_count;
    if (stuck_count > 8) continue;
    if (!stuck.empty()) stuck += "; ";
    stuck += fmt::format(
        "the {} engine of core {} at instruction {} waits for semaphore {} to reach {}, but it "
        "only ever reaches {}",
        isa::EngineName(stream.engine), stream.core, position[s], step.semaphore, step.value,
        semaphores[{stream.core, step.semaphore}].value);
  }
  if (stuck_count == 0) return OkStatus();
  if (stuck_count > 8) stuck += fmt::format("; and {} more", stuck_count - 8);
  return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID,
                    "its engine streams deadlock: {}. Every execution would hang; add the "
                    "missing sem_signal instructions or lower the waited-for values",
                    stuck);
}

}  // namespace tern::exe
