// Machine-readable views of a node sample, shared by `ls --json`, `monitor`
// (JSON lines) and `monitor --prometheus`.
#ifndef TERN_TOOLS_SRC_REPORT_H_
#define TERN_TOOLS_SRC_REPORT_H_

#include <nlohmann/json.hpp>
#include <string>

#include "node.h"

namespace tern::tools {

using Json = nlohmann::ordered_json;

// {"tensors": N, "constants": N, ...} in category order.
Json CategoriesJson(const uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]);
// {"exec_timeout": N, "hbm_uncorrectable": N, ...} in class order.
Json ErrorsJson(const uint64_t by_class[TERN_ERROR_CLASS_COUNT]);
// [{"pid", "command", "cores", "memory_bytes", "memory_by_category"}] of a device.
Json ProcessesJson(const tern_device_telemetry_t& telemetry);

// The monitor's record of one period: counters of `after`, rates between the
// two samples. `before` may be `after` itself (rates are then zero).
Json MonitorRecord(const NodeSample& before, const NodeSample& after);

// Prometheus text exposition format (version 0.0.4) of `after`; busy ratio
// and command rate over the period since `before`.
std::string PrometheusExposition(const Runtime& runtime, const NodeSample& before,
                                 const NodeSample& after);

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_REPORT_H_
