// `tern ls`: the devices of the node, their cores and memory, and the
// processes using them; a table, or JSON with --json.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "node.h"
#include "report.h"
#include "subcommands.h"
#include "util.h"

namespace tern::tools {
namespace {

struct LsOptions {
  bool json = false;
};

Json LsJson(const Runtime& runtime, const NodeSample& sample) {
  Json root;
  root["tern_version"] = runtime.version();
  root["tern_build"] = runtime.build();
  root["driver"] = runtime.driver();
  Json devices = Json::array();
  for (const DeviceSample& d : sample.devices) {
    const tern_device_telemetry_t& t = d.telemetry;
    Json device;
    device["device"] = d.info.index;
    device["physical_index"] = d.info.physical_index;
    device["uuid"] = d.info.uuid;
    device["bus_id"] = d.info.bus_id;
    device["driver_version"] = d.info.driver_version;
    device["name"] = d.info.name;
    device["driver"] = d.info.driver;
    device["tern_version"] = runtime.version();
    device["core_count"] = d.info.core_count;
    device["physical_core_count"] = d.info.physical_core_count;
    device["memory_total_bytes"] = d.info.memory_bytes;
    device["memory_used_bytes"] = t.memory_used;
    device["memory_free_bytes"] = d.memory.free_bytes;
    device["memory_used_by_category"] = CategoriesJson(t.memory_by_category);
    device["numa_node"] = d.info.numa_node;
    device["cpu_affinity"] = d.info.cpu_affinity;
    Json cores = Json::array();
    for (uint32_t c = 0; c < CoreCount(t); ++c) {
      const tern_core_telemetry_t& core = t.cores[c];
      cores.push_back({{"core", core.physical_index},
                       {"owner_pid", core.owner_pid},
                       {"owner_command", FieldText(core.owner_command)}});
    }
    device["cores"] = std::move(cores);
    device["ecc"] = {{"corrected", t.ecc_corrected}, {"uncorrected", t.ecc_uncorrected}};
    device["processes"] = ProcessesJson(t);
    devices.push_back(std::move(device));
  }
  root["devices"] = std::move(devices);
  return root;
}

std::string LsTable(const Runtime& runtime, const NodeSample& sample) {
  std::string out =
      fmt::format("tern {}, driver {}, {} device{}\n\n", runtime.version(), runtime.driver(),
                  sample.devices.size(), sample.devices.size() == 1 ? "" : "s");
  // DEVICE is the index this process sees (TERN_VISIBLE_CORES renumbers),
  // PHYS the node's; core owners are listed by physical core.
  Table devices({"DEVICE", "PHYS", "NAME", "UUID", "CORES", "HBM USED", "HBM TOTAL", "NUMA",
                 "CPU AFFINITY", "OWNERS (PHYS CORE:PID)"},
                {true, true, false, false, true, true, true, true, false, false});
  Table processes({"DEVICE", "PID", "COMMAND", "CORES", "HBM USED", "BY CATEGORY"},
                  {true, true, false, false, true, false});
  for (const DeviceSample& d : sample.devices) {
    const tern_device_telemetry_t& t = d.telemetry;
    std::string owners;
    for (uint32_t c = 0; c < CoreCount(t); ++c) {
      if (!owners.empty()) owners += ' ';
      owners += t.cores[c].owner_pid != 0 ? fmt::format("{}:{}", c, t.cores[c].owner_pid)
                                          : fmt::format("{}:free", c);
    }
    devices.AddRow({std::to_string(d.info.index), std::to_string(d.info.physical_index),
                    d.info.name, d.info.uuid[0] != '\0' ? d.info.uuid : "-",
                    std::to_string(d.info.core_count), FormatBytes(t.memory_used),
                    FormatBytes(d.info.memory_bytes),
                    d.info.numa_node >= 0 ? std::to_string(d.info.numa_node) : "-",
                    d.info.cpu_affinity[0] != '\0' ? d.info.cpu_affinity : "-", owners});
    for (uint32_t i = 0; i < ProcessCount(t); ++i) {
      const tern_process_telemetry_t& p = t.processes[i];
      const std::string by_category = DescribeCategories(p.memory_by_category, ", ");
      processes.AddRow({std::to_string(d.info.index), std::to_string(p.pid), FieldText(p.command),
                        FormatCoreMask(p.cores_owned),
                        FormatBytes(TotalBytes(p.memory_by_category)),
                        by_category.empty() ? "-" : by_category});
    }
  }
  out += devices.Render();
  out += '\n';
  if (processes.empty()) {
    out += "No process is using a device.\n";
  } else {
    out += processes.Render();
  }
  return out;
}

}  // namespace

Runner AddLsOptions(CLI::App* app) {
  auto options = std::make_shared<LsOptions>();
  AddJsonFlag(app, &options->json);
  return [options]() {
    Runtime runtime;
    const NodeSample sample = TakeSample(runtime);
    if (options->json) {
      std::cout << LsJson(runtime, sample).dump(2) << '\n';
    } else {
      std::cout << LsTable(runtime, sample);
    }
    std::cout.flush();
    return kExitOk;
  };
}

}  // namespace tern::tools
