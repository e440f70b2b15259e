#include "compiler/lower/engine_sync.h"

#include <algorithm>

namespace tern::compiler {
namespace {

bool Overlap(const ByteExtent& a, const ByteExtent& b) {
  return a.first < a.end && b.first < b.end && a.first < b.end && b.first < a.end;
}

bool Covers(const ByteExtent& outer, const ByteExtent& inner) {
  return outer.first <= inner.first && inner.end <= outer.end;
}

}  // namespace

std::vector<SyncInstruction> EngineSynchronizer::Add(tern_engine_t engine,
                                                     const std::vector<MemoryAccess>& accesses) {
  const size_t self = static_cast<size_t>(engine);
  std::array<uint64_t, kEngines> needed{};
  for (const MemoryAccess& access : accesses) {
    auto found = records_.find(access.memory);
    if (found == records_.end()) continue;
    for (const Record& record : found->second) {
      if (record.engine == self || !(access.write || record.write)) continue;
      if (!Overlap(access.extent, record.extent)) continue;
      needed[record.engine] = std::max(needed[record.engine], record.sequence);
    }
  }

  std::vector<SyncInstruction> sync;
  std::vector<SyncInstruction> waits;
  for (size_t other = 0; other < kEngines; ++other) {
    if (other == self || needed[other] <= clock_[self][other]) continue;
    std::vector<Signal>& signals = signals_[other];
    if (signals.empty() || signals.back().covers < needed[other]) {
      Signal signal;
      signal.covers = count_[other];
      signal.clock = clock_[other];
      signals.push_back(signal);
      sync.push_back(
          {TERN_OP_SEM_SIGNAL, static_cast<tern_engine_t>(other), static_cast<uint32_t>(other), 1});
    }
    // The first signal that covers the instruction needed.
    const auto first = std::lower_bound(
        signals.begin(), signals.end(), needed[other],
        [](const Signal& signal, uint64_t sequence) { return signal.covers < sequence; });
    const uint64_t value = static_cast<uint64_t>(first - signals.begin()) + 1;
    waits.push_back({TERN_OP_SEM_WAIT, engine, static_cast<uint32_t>(other), value});
    for (size_t k = 0; k < kEngines; ++k) {
      clock_[self][k] = std::max(clock_[self][k], first->clock[k]);
    }
  }
  sync.insert(sync.end(), waits.begin(), waits.end());

  count_[self] += 1;
  clock_[self][self] = count_[self];
  for (const MemoryAccess& access : accesses) {
    if (access.extent.first >= access.extent.end) continue;
    std::vector<Record>& records = records_[access.memory];
    if (access.write) {
      // Everything this write overlaps is ordered before it now, so what
      // it covers entirely can no longer add an order of its own.
      std::erase_if(records,
                    [&](const Record& record) { return Covers(access.extent, record.extent); });
    }
    records.push_back({access.extent, static_cast<uint8_t>(self), count_[self], access.write});
  }
  return sync;
}

uint32_t EngineSynchronizer::semaphores_used() const {
  uint32_t used = 0;
  for (const std::vector<Signal>& signals : signals_) used += signals.empty() ? 0 : 1;
  return used;
}

}  // namespace tern::compiler
