// The node as the tools see it: the runtime (initialized for reading, never
// owning a core unless a subcommand asks), and snapshots of every device's
// shared telemetry taken through the public C API.
#ifndef TERN_TOOLS_SRC_NODE_H_
#define TERN_TOOLS_SRC_NODE_H_

#include <tern/tern.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace tern::tools {

// tern_init() on construction, tern_shutdown() on destruction. Throws
// ToolError when the runtime cannot start (the message says why).
class Runtime {
 public:
  Runtime();
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  uint32_t device_count() const { return static_cast<uint32_t>(devices_.size()); }
  tern_device_t device(uint32_t index) const { return devices_[index]; }
  const tern_device_info_t& info(uint32_t index) const { return infos_[index]; }
  const std::string& driver() const { return driver_; }
  // "0.1.0", from tern_get_version() (the library loaded, not the headers).
  const std::string& version() const { return version_; }
  const std::string& build() const { return build_; }

 private:
  std::vector<tern_device_t> devices_;
  std::vector<tern_device_info_t> infos_;
  std::string driver_;
  std::string version_;
  std::string build_;
};

struct DeviceSample {
  tern_device_info_t info;
  tern_device_telemetry_t telemetry;
  tern_memory_stats_t memory;
};

struct NodeSample {
  uint64_t monotonic_ns = 0;
  double unix_seconds = 0;
  std::vector<DeviceSample> devices;
};

// Reads every device's telemetry and memory statistics. Throws ToolError.
NodeSample TakeSample(const Runtime& runtime);

// Rates of one core between two samples of the same node.
struct CoreRates {
  double busy_ratio = 0;  // busy_ns delta / wall delta, clamped to [0, 1]
  double commands_per_s = 0;
  double executions_per_s = 0;
};
CoreRates ComputeRates(const NodeSample& before, const NodeSample& after, size_t device,
                       size_t core);

uint64_t TotalErrors(const tern_core_telemetry_t& core);

// The filled-in entries of a telemetry snapshot's fixed-size arrays: the
// counts say what the device has, which may be more than the arrays hold.
inline uint32_t CoreCount(const tern_device_telemetry_t& t) {
  return std::min<uint32_t>(t.core_count, TERN_TELEMETRY_MAX_CORES);
}
inline uint32_t ProcessCount(const tern_device_telemetry_t& t) {
  return std::min<uint32_t>(t.process_count, TERN_TELEMETRY_MAX_PROCESSES);
}

// A fixed-size text field of the telemetry (a command name), which is not
// NUL-terminated when the text fills it.
template <size_t N>
std::string FieldText(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

// Device memory of all categories together.
uint64_t TotalBytes(const uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]);
// "tensors 1.0 MiB<separator>scratch 64.0 KiB": the categories that hold
// memory, in category order; "" when none does.
std::string DescribeCategories(const uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT],
                               const char* separator);

// The upper bound, in microseconds, of latency-histogram bucket `bucket`
// (telemetry.h): 1 for bucket 0, 2^bucket after; infinity for the last.
double LatencyBucketUpperUs(uint32_t bucket);

// Run-time percentiles of the commands a core completed between two samples,
// from the deltas of its latency histogram. Each percentile is the upper
// bound of the bucket that holds it (the last bucket reports its lower
// bound, 2^22 us), so it is exact to within a factor of two.
struct LatencyPercentiles {
  uint64_t count = 0;  // commands in the window; the percentiles are 0 when none
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
};
LatencyPercentiles ComputeLatency(const NodeSample& before, const NodeSample& after, size_t device,
                                  size_t core);

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_NODE_H_
