// Configuration of the simulated node: how many devices, cores and how much
// device memory, which node it is, and where each device sits (NUMA node and
// nearby CPUs, from hwloc).
#ifndef TERN_DRIVER_SHIM_SIM_SIM_TOPOLOGY_H_
#define TERN_DRIVER_SHIM_SIM_SIM_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status_with_message.h"

namespace tern::sim {

inline constexpr uint32_t kMaxDevices = 16;
inline constexpr uint32_t kMaxCoresPerDevice = 16;

// How the engines of a core interleave their streams (TERN_SIM_SCHEDULE,
// docs/sim.md). kConcurrent: every engine runs its stream as soon as its
// semaphores let it, the DMA engines on a thread of their own beside the
// compute engines. kRandom: one instruction at a time, the engine picked by a
// generator seeded with `seed` among those that can go on, to expose
// programs that depend on an order nothing in them guarantees.
struct ScheduleMode {
  // kOneThread is not a TERN_SIM_SCHEDULE value: the order of kConcurrent
  // with every instruction on the calling thread, DMA included (the
  // loader's rehearsal of a function, which may be a racy one loaded with
  // TERN_EXECUTABLE_LOAD_ALLOW_RACES, on memory of its own).
  enum Kind : uint8_t { kConcurrent = 0, kRandom = 1, kOneThread = 2 };
  Kind kind = kConcurrent;
  uint64_t seed = 0;
};

// Parses "concurrent" or "random:SEED" (SEED a decimal number below 2^64).
Status ParseScheduleMode(const std::string& text, ScheduleMode* mode);

// "default-<uid>" for the calling process's real user id.
std::string DefaultNodeName();

struct SimConfig {
  uint32_t device_count = 2;
  uint32_t cores_per_device = 2;
  // Lazily committed: untouched device memory costs nothing.
  uint64_t hbm_bytes = 8ull << 30;
  // TERN_SIM_NODE, or "default-<uid>": the node file is its creator's alone
  // (docs/sim.md, security model), so each user has a default node of their own.
  std::string node_name = DefaultNodeName();
  bool protect = true;
  // True when TERN_SIM_TOPOLOGY chose the topology. Otherwise a process that
  // finds the node already set up adopts its topology (an administrator's
  // `tern ls` sees the node as the workload configured it).
  bool topology_explicit = false;
  ScheduleMode schedule;
};

// Parses "DxCxSIZE" (SIZE as common/byte_size.h reads it: bytes with an
// optional K, M, G or T (or KiB..TiB) suffix, powers of 1024), e.g. "2x2x8G".
Status ParseTopology(const std::string& text, SimConfig* config);

// Reads TERN_SIM_TOPOLOGY, TERN_SIM_NODE, TERN_SIM_PROTECT and
// TERN_SIM_SCHEDULE.
Status ConfigFromEnvironment(SimConfig* config);

struct DevicePlacement {
  int32_t numa_node = -1;
  std::string cpu_affinity;
};

// Places simulated devices on the host's NUMA nodes round-robin, as hwloc
// reports them.
std::vector<DevicePlacement> PlaceDevices(uint32_t device_count);

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_SIM_TOPOLOGY_H_
