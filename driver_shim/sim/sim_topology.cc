#include "driver_shim/sim/sim_topology.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <fmt/format.h>
#include <hwloc.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "common/byte_size.h"

namespace tern::sim {

Status ParseTopology(const std::string& text, SimConfig* config) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, 'x');
  uint32_t devices = 0, cores = 0;
  uint64_t bytes = 0;
  const Status bad = MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                                "TERN_SIM_TOPOLOGY='{}' is not DEVICESxCORESxMEMORY; write it like "
                                "'2x2x8G' (1-{} devices, 1-{} cores each, memory 1M-1T per device)",
                                text, kMaxDevices, kMaxCoresPerDevice);
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &devices) ||
      !absl::SimpleAtoi(parts[1], &cores) ||
      !ParseByteSize(std::string_view(parts[2].data(), parts[2].size()), &bytes).ok()) {
    return bad;
  }
  if (devices < 1 || devices > kMaxDevices || cores < 1 || cores > kMaxCoresPerDevice ||
      bytes < (1ull << 20) || bytes > (1ull << 40)) {
    return bad;
  }
  config->device_count = devices;
  config->cores_per_device = cores;
  // Whole pages, so that discarding freed memory works on page boundaries.
  config->hbm_bytes = (bytes + 4095) & ~4095ull;
  return OkStatus();
}

Status ParseScheduleMode(const std::string& text, ScheduleMode* mode) {
  constexpr std::string_view kRandom = "random:";
  if (text == "concurrent") {
    *mode = ScheduleMode{};
    return OkStatus();
  }
  if (text.starts_with(kRandom)) {
    const std::string digits = text.substr(kRandom.size());
    uint64_t seed = 0;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), seed);
    if (!digits.empty() && error == std::errc() && end == digits.data() + digits.size()) {
      mode->kind = ScheduleMode::kRandom;
      mode->seed = seed;
      return OkStatus();
    }
  }
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                    "TERN_SIM_SCHEDULE='{}' is neither 'concurrent' (the default: the engines "
                    "run their streams at once) nor 'random:SEED' with SEED a decimal number "
                    "(a seeded random interleaving, e.g. random:42); unset it or write one of them",
                    text);
}

std::string DefaultNodeName() { return fmt::format("default-{}", getuid()); }

Status ConfigFromEnvironment(SimConfig* config) {
  if (const char* topology = std::getenv("TERN_SIM_TOPOLOGY"); topology && *topology) {
    TERN_RETURN_IF_ERROR(ParseTopology(topology, config));
    config->topology_explicit = true;
  }
  if (const char* node = std::getenv("TERN_SIM_NODE"); node && *node) {
    config->node_name = node;
  }
  if (const char* schedule = std::getenv("TERN_SIM_SCHEDULE"); schedule && *schedule) {
    TERN_RETURN_IF_ERROR(ParseScheduleMode(schedule, &config->schedule));
  }
  if (const char* copy = std::getenv("TERN_SIM_COPY"); copy && *copy) {
    const std::string_view value(copy);
    if (value != "auto" && value != "memmove" && value != "string-move") {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_SIM_COPY='{}' must be auto (the default: measure which copy is "
                        "faster on this machine), memmove or string-move; unset it or write one "
                        "of them",
                        value);
    }
  }
  if (const char* streaming = std::getenv("TERN_SIM_STREAMING_STORES"); streaming && *streaming) {
    const std::string_view value(streaming);
    if (value != "auto" && value != "off") {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_SIM_STREAMING_STORES='{}' must be auto (the default: kernel "
                        "outputs past the last-level cache bypass it) or off; unset it or write "
                        "one of them",
                        value);
    }
  }
  if (const char* protect = std::getenv("TERN_SIM_PROTECT"); protect && *protect) {
    std::string_view value(protect);
    if (value == "1") {
      config->protect = true;
    } else if (value == "0") {
      config->protect = false;
    } else {
      return MakeStatus(
          TERN_ERROR_INVALID_ARGUMENT,
          "TERN_SIM_PROTECT='{}' must be 1 (device memory is not host-accessible) or 0", value);
    }
  }
  return OkStatus();
}

std::vector<DevicePlacement> PlaceDevices(uint32_t device_count) {
  std::vector<DevicePlacement> placements(device_count);
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return placements;
  if (hwloc_topology_load(topology) != 0) {
    hwloc_topology_destroy(topology);
    return placements;
  }
  int numa_count = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  for (uint32_t i = 0; i < device_count; ++i) {
    hwloc_const_bitmap_t cpuset = hwloc_topology_get_topology_cpuset(topology);
    if (numa_count > 0) {
      hwloc_obj_t numa = hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE,
                                               static_cast<unsigned>(i % numa_count));
      if (numa != nullptr) {
        placements[i].numa_node = static_cast<int32_t>(numa->os_index);
        if (numa->cpuset != nullptr) cpuset = numa->cpuset;
      }
    }
    char buffer[256];
    if (hwloc_bitmap_list_snprintf(buffer, sizeof(buffer), cpuset) >= 0) {
      placements[i].cpu_affinity = buffer;
    }
  }
  hwloc_topology_destroy(topology);
  return placements;
}

}  // namespace tern::sim
