#include "report.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>
#include <vector>

#include "util.h"

namespace tern::tools {

Json CategoriesJson(const uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) {
  Json json = Json::object();
  for (uint32_t c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) json[CategoryName(c)] = by_category[c];
  return json;
}

Json ErrorsJson(const uint64_t by_class[TERN_ERROR_CLASS_COUNT]) {
  Json json = Json::object();
  for (uint32_t e = 0; e < TERN_ERROR_CLASS_COUNT; ++e) json[ErrorClassName(e)] = by_class[e];
  return json;
}

Json ProcessesJson(const tern_device_telemetry_t& telemetry) {
  Json processes = Json::array();
  for (uint32_t i = 0; i < ProcessCount(telemetry); ++i) {
    const tern_process_telemetry_t& p = telemetry.processes[i];
    Json process;
    process["pid"] = p.pid;
    process["command"] = FieldText(p.command);
    process["cores"] = CoreMaskToList(p.cores_owned);
    process["memory_bytes"] = TotalBytes(p.memory_by_category);
    process["memory_by_category"] = CategoriesJson(p.memory_by_category);
    processes.push_back(std::move(process));
  }
  return processes;
}

Json MonitorRecord(const NodeSample& before, const NodeSample& after) {
  Json record;
  record["timestamp"] = IsoTimestampUtc(after.unix_seconds);
  record["unix_time"] = after.unix_seconds;
  record["interval_s"] =
      static_cast<double>(after.monotonic_ns - std::min(before.monotonic_ns, after.monotonic_ns)) /
      1e9;
  Json devices = Json::array();
  for (size_t d = 0; d < after.devices.size(); ++d) {
    const DeviceSample& sample = after.devices[d];
    const tern_device_telemetry_t& t = sample.telemetry;
    Json device;
    device["device"] = sample.info.index;
    device["name"] = sample.info.name;
    Json cores = Json::array();
    for (uint32_t c = 0; c < CoreCount(t); ++c) {
      const tern_core_telemetry_t& core = t.cores[c];
      const CoreRates rates = ComputeRates(before, after, d, c);
      Json entry = {{"core", core.physical_index},
                    {"owner_pid", core.owner_pid},
                    {"owner_command", FieldText(core.owner_command)},
                    {"busy_ratio", rates.busy_ratio},
                    {"commands", core.commands},
                    {"executions", core.executions},
                    {"busy_ns", core.busy_ns},
                    {"commands_per_s", rates.commands_per_s},
                    {"executions_per_s", rates.executions_per_s},
                    {"errors", ErrorsJson(core.errors)}};
      const LatencyPercentiles latency = ComputeLatency(before, after, d, c);
      Json latency_json;
      latency_json["commands"] = latency.count;
      if (latency.count > 0) {
        latency_json["p50"] = latency.p50_us;
        latency_json["p90"] = latency.p90_us;
        latency_json["p99"] = latency.p99_us;
      } else {
        latency_json["p50"] = latency_json["p90"] = latency_json["p99"] = nullptr;
      }
      entry["latency_us"] = std::move(latency_json);
      cores.push_back(std::move(entry));
    }
    device["cores"] = std::move(cores);
    Json memory;
    memory["capacity_bytes"] = t.memory_capacity;
    memory["used_bytes"] = t.memory_used;
    memory["by_category"] = CategoriesJson(t.memory_by_category);
    device["memory"] = std::move(memory);
    device["processes"] = ProcessesJson(t);
    device["ecc"] = {{"corrected", t.ecc_corrected}, {"uncorrected", t.ecc_uncorrected}};
    devices.push_back(std::move(device));
  }
  record["devices"] = std::move(devices);
  return record;
}

namespace {

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  for (char ch : value) {
    switch (ch) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

using Labels = std::vector<std::pair<const char*, std::string>>;

// Writes metric families: HELP and TYPE once, then every sample of the family.
class Exposition {
 public:
  void Family(const char* name, const char* type, const char* help) {
    name_ = name;
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  template <typename T>
  void Sample(const Labels& labels, T value) {
    SuffixedSample("", labels, value);
  }
  // A sample of the family's name plus `suffix` ("_bucket", "_sum", "_count"
  // of a histogram).
  template <typename T>
  void SuffixedSample(const char* suffix, const Labels& labels, T value) {
    out_ += name_;
    out_ += suffix;
    if (!labels.empty()) {
      out_ += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        if (i > 0) out_ += ',';
        out_ += fmt::format("{}=\"{}\"", labels[i].first, EscapeLabelValue(labels[i].second));
      }
      out_ += '}';
    }
    out_ += fmt::format(" {}\n", value);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string name_;
  std::string out_;
};

}  // namespace

std::string PrometheusExposition(const Runtime& runtime, const NodeSample& before,
                                 const NodeSample& after) {
  Exposition e;
  const auto& devices = after.devices;
  auto dev_label = [](const DeviceSample& d) { return std::to_string(d.info.index); };

  e.Family("tern_info", "gauge", "tern library version and driver backend (always 1).");
  e.Sample({{"version", runtime.version()}, {"driver", runtime.driver()}}, 1);

  e.Family("tern_device_info", "gauge", "Static information about a device (always 1).");
  for (const auto& d : devices) {
    e.Sample({{"device", dev_label(d)},
              {"name", d.info.name},
              {"numa_node", std::to_string(d.info.numa_node)},
              {"cpu_affinity", d.info.cpu_affinity}},
             1);
  }

  e.Family("tern_monitor_window_seconds", "gauge",
           "Length of the period over which ratios in this exposition were measured.");
  e.Sample({}, static_cast<double>(after.monotonic_ns -
                                   std::min(before.monotonic_ns, after.monotonic_ns)) /
                   1e9);

  e.Family("tern_core_busy_ratio", "gauge",
           "Share of the measurement window the core spent running commands (0-1).");
  for (size_t d = 0; d < devices.size(); ++d) {
    for (uint32_t c = 0; c < CoreCount(devices[d].telemetry); ++c) {
      e.Sample({{"device", dev_label(devices[d])}, {"core", std::to_string(c)}},
               ComputeRates(before, after, d, c).busy_ratio);
    }
  }

  e.Family("tern_core_busy_seconds_total", "counter", "Time the core spent running commands.");
  for (const auto& d : devices) {
    for (uint32_t c = 0; c < CoreCount(d.telemetry); ++c) {
      e.Sample({{"device", dev_label(d)}, {"core", std::to_string(c)}},
               static_cast<double>(d.telemetry.cores[c].busy_ns) / 1e9);
    }
  }

  e.Family("tern_core_commands_total", "counter", "Commands the core completed, of any kind.");
  for (const auto& d : devices) {
    for (uint32_t c = 0; c < CoreCount(d.telemetry); ++c) {
      e.Sample({{"device", dev_label(d)}, {"core", std::to_string(c)}},
               d.telemetry.cores[c].commands);
    }
  }

  e.Family("tern_core_executions_total", "counter", "Compute commands the core completed.");
  for (const auto& d : devices) {
    for (uint32_t c = 0; c < CoreCount(d.telemetry); ++c) {
      e.Sample({{"device", dev_label(d)}, {"core", std::to_string(c)}},
               d.telemetry.cores[c].executions);
    }
  }

  e.Family("tern_core_command_duration_seconds", "histogram",
           "How long the core's commands ran (event waits excluded).");
  for (const auto& d : devices) {
    for (uint32_t c = 0; c < CoreCount(d.telemetry); ++c) {
      const std::string device = dev_label(d);
      const std::string core = std::to_string(c);
      uint64_t cumulative = 0;
      for (uint32_t b = 0; b < TERN_TELEMETRY_LATENCY_BUCKETS; ++b) {
        cumulative += d.telemetry.latency_histogram[c][b];
        const double upper_us = LatencyBucketUpperUs(b);
        e.SuffixedSample("_bucket",
                         {{"device", device},
                          {"core", core},
                          {"le", std::isinf(upper_us) ? std::string("+Inf")
                                                      : fmt::format("{}", upper_us / 1e6)}},
                         cumulative);
      }
      e.SuffixedSample("_sum", {{"device", device}, {"core", core}},
                       static_cast<double>(d.telemetry.cores[c].busy_ns) / 1e9);
      e.SuffixedSample("_count", {{"device", device}, {"core", core}}, cumulative);
    }
  }

  e.Family("tern_core_owner_pid", "gauge", "Process id owning the core; 0 when it is free.");
  for (const auto& d : devices) {
    for (uint32_t c = 0; c < CoreCount(d.telemetry); ++c) {
      const tern_core_telemetry_t& core = d.telemetry.cores[c];
      e.Sample({{"device", dev_label(d)},
                {"core", std::to_string(c)},
                {"command", FieldText(core.owner_command)}},
               core.owner_pid);
    }
  }

  e.Family("tern_core_errors_total", "counter", "Failed commands on the core, by error class.");
  for (const auto& d : devices) {
    for (uint32_t c = 0; c < CoreCount(d.telemetry); ++c) {
      for (uint32_t k = 0; k < TERN_ERROR_CLASS_COUNT; ++k) {
        e.Sample(
            {{"device", dev_label(d)}, {"core", std::to_string(c)}, {"class", ErrorClassName(k)}},
            d.telemetry.cores[c].errors[k]);
      }
    }
  }

  e.Family("tern_hbm_capacity_bytes", "gauge", "Device memory (HBM) capacity.");
  for (const auto& d : devices) e.Sample({{"device", dev_label(d)}}, d.telemetry.memory_capacity);

  e.Family("tern_hbm_used_bytes", "gauge",
           "Device memory in use by every process on the node, by category.");
  for (const auto& d : devices) {
    for (uint32_t k = 0; k < TERN_MEMORY_CATEGORY_COUNT; ++k) {
      e.Sample({{"device", dev_label(d)}, {"category", CategoryName(k)}},
               d.telemetry.memory_by_category[k]);
    }
  }

  e.Family("tern_process_hbm_used_bytes", "gauge",
           "Device memory in use by one process, by category.");
  for (const auto& d : devices) {
    for (uint32_t i = 0; i < ProcessCount(d.telemetry); ++i) {
      const tern_process_telemetry_t& p = d.telemetry.processes[i];
      for (uint32_t k = 0; k < TERN_MEMORY_CATEGORY_COUNT; ++k) {
        e.Sample({{"device", dev_label(d)},
                  {"pid", std::to_string(p.pid)},
                  {"command", FieldText(p.command)},
                  {"category", CategoryName(k)}},
                 p.memory_by_category[k]);
      }
    }
  }

  e.Family("tern_ecc_errors_total", "counter", "ECC events in device memory, by kind.");
  for (const auto& d : devices) {
    e.Sample({{"device", dev_label(d)}, {"kind", "corrected"}}, d.telemetry.ecc_corrected);
    e.Sample({{"device", dev_label(d)}, {"kind", "uncorrected"}}, d.telemetry.ecc_uncorrected);
  }
  return e.Take();
}

}  // namespace tern::tools
