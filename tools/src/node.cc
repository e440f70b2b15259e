#include "node.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "util.h"

namespace tern::tools {

Runtime::Runtime() {
  tern_version_t version = {};
  version.struct_size = sizeof(version);
  if (tern_get_version(&version) == TERN_OK) {
    version_ = fmt::format("{}.{}.{}", version.major, version.minor, version.patch);
    build_ = version.build != nullptr ? version.build : "";
  }
  const tern_status_t status = tern_init(nullptr);
  if (status != TERN_OK) {
    throw ToolError(DescribeFailure("tern_init", status) +
                    "\n(tools join the node named by TERN_SIM_NODE with the topology of "
                    "TERN_SIM_TOPOLOGY: use the same values as the workload)");
  }
  try {
    const char* driver = tern_driver_name();
    driver_ = driver != nullptr ? driver : "";
    uint32_t count = 0;
    Check("tern_device_count", tern_device_count(&count));
    for (uint32_t i = 0; i < count; ++i) {
      tern_device_t device = nullptr;
      Check("tern_device_get", tern_device_get(i, &device));
      tern_device_info_t info = {};
      info.struct_size = sizeof(info);
      Check("tern_device_get_info", tern_device_get_info(device, &info));
      devices_.push_back(device);
      infos_.push_back(info);
    }
  } catch (...) {
    tern_shutdown();
    throw;
  }
}

Runtime::~Runtime() { tern_shutdown(); }

NodeSample TakeSample(const Runtime& runtime) {
  NodeSample sample;
  sample.devices.resize(runtime.device_count());
  for (uint32_t i = 0; i < runtime.device_count(); ++i) {
    DeviceSample& d = sample.devices[i];
    d.info = runtime.info(i);
    d.telemetry = {};
    d.telemetry.struct_size = sizeof(d.telemetry);
    Check("tern_device_get_telemetry", tern_device_get_telemetry(runtime.device(i), &d.telemetry));
    d.memory = {};
    d.memory.struct_size = sizeof(d.memory);
    Check("tern_device_memory_stats", tern_device_memory_stats(runtime.device(i), &d.memory));
  }
  // One timestamp for the whole sample; reading the counters takes microseconds.
  sample.monotonic_ns = MonotonicNs();
  sample.unix_seconds = UnixTimeSeconds();
  return sample;
}

CoreRates ComputeRates(const NodeSample& before, const NodeSample& after, size_t device,
                       size_t core) {
  CoreRates rates;
  if (device >= before.devices.size() || device >= after.devices.size()) return rates;
  if (after.monotonic_ns <= before.monotonic_ns) return rates;
  const tern_core_telemetry_t& a = before.devices[device].telemetry.cores[core];
  const tern_core_telemetry_t& b = after.devices[device].telemetry.cores[core];
  const double wall_ns = static_cast<double>(after.monotonic_ns - before.monotonic_ns);
  // Counters only grow; a decrease means the node was recreated: no rate.
  auto delta = [](uint64_t x, uint64_t y) { return y >= x ? static_cast<double>(y - x) : 0.0; };
  // Several queues of a core run concurrently, so busy time can exceed wall
  // time; utilization is the share of time the core had work, at most 100%.
  rates.busy_ratio = std::clamp(delta(a.busy_ns, b.busy_ns) / wall_ns, 0.0, 1.0);
  rates.commands_per_s = delta(a.commands, b.commands) * 1e9 / wall_ns;
  rates.executions_per_s = delta(a.executions, b.executions) * 1e9 / wall_ns;
  return rates;
}

double LatencyBucketUpperUs(uint32_t bucket) {
  if (bucket + 1 >= TERN_TELEMETRY_LATENCY_BUCKETS) return std::numeric_limits<double>::infinity();
  return std::ldexp(1.0, static_cast<int>(bucket));
}

LatencyPercentiles ComputeLatency(const NodeSample& before, const NodeSample& after, size_t device,
                                  size_t core) {
  LatencyPercentiles result;
  if (device >= before.devices.size() || device >= after.devices.size()) return result;
  const uint64_t* a = before.devices[device].telemetry.latency_histogram[core];
  const uint64_t* b = after.devices[device].telemetry.latency_histogram[core];
  uint64_t counts[TERN_TELEMETRY_LATENCY_BUCKETS];
  for (uint32_t i = 0; i < TERN_TELEMETRY_LATENCY_BUCKETS; ++i) {
    counts[i] = b[i] >= a[i] ? b[i] - a[i] : 0;  // a decrease: the node was recreated
    result.count += counts[i];
  }
  if (result.count == 0) return result;
  auto percentile = [&](double q) {
    // The smallest bucket whose cumulative count reaches q of the total.
    const double rank = q * static_cast<double>(result.count);
    uint64_t cumulative = 0;
    for (uint32_t i = 0; i < TERN_TELEMETRY_LATENCY_BUCKETS; ++i) {
      cumulative += counts[i];
      if (static_cast<double>(cumulative) >= rank && counts[i] > 0) {
        return i + 1 < TERN_TELEMETRY_LATENCY_BUCKETS ? LatencyBucketUpperUs(i)
                                                      : std::ldexp(1.0, static_cast<int>(i) - 1);
      }
    }
    return std::ldexp(1.0, TERN_TELEMETRY_LATENCY_BUCKETS - 2);
  };
  result.p50_us = percentile(0.50);
  result.p90_us = percentile(0.90);
  result.p99_us = percentile(0.99);
  return result;
}

uint64_t TotalErrors(const tern_core_telemetry_t& core) {
  uint64_t total = 0;
  for (uint32_t e = 0; e < TERN_ERROR_CLASS_COUNT; ++e) total += core.errors[e];
  return total;
}

uint64_t TotalBytes(const uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) {
  uint64_t total = 0;
  for (uint32_t k = 0; k < TERN_MEMORY_CATEGORY_COUNT; ++k) total += by_category[k];
  return total;
}

std::string DescribeCategories(const uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT],
                               const char* separator) {
  std::string text;
  for (uint32_t k = 0; k < TERN_MEMORY_CATEGORY_COUNT; ++k) {
    if (by_category[k] == 0) continue;
    if (!text.empty()) text += separator;
    text += fmt::format("{} {}", CategoryName(k), FormatBytes(by_category[k]));
  }
  return text;
}

}  // namespace tern::tools
