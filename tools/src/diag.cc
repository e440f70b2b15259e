// `tern diag`: health checks of the node's devices, with an exit code for
// scripts: 0 healthy, 1 degraded, 2 failed. This file runs the checks and
// prints the report; each check is in diag_<check>.cc (see diag_checks.h).
//
// Active checks (HBM patterns, copy bandwidth, compute) allocate device memory and, for
// commands that need a queue, open a core that no workload holds; they never
// wait for a busy core. Passive checks read the shared counters after the
// active ones ran, so errors those provoked are counted too.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "diag_checks.h"
#include "node.h"
#include "report.h"
#include "subcommands.h"
#include "util.h"

namespace tern::tools {
namespace {

using diag::CheckId;
using diag::CheckResult;
using diag::Result;

struct DiagOptions {
  bool json = false;
  std::string inject;
  std::vector<uint32_t> devices;
  std::string hbm_bytes = "16M";
  std::string bandwidth_bytes = "16M";
  double min_bandwidth_ratio = 0.25;
};

std::optional<tern_fault_kind_t> ParseFault(const std::string& name) {
  if (name == "dma_abort") return TERN_FAULT_DMA_ABORT;
  if (name == "hbm_ue") return TERN_FAULT_HBM_UNCORRECTABLE;
  if (name == "hang") return TERN_FAULT_CORE_HANG;
  return std::nullopt;
}

int Verdict(const std::vector<CheckResult>& checks) {
  int code = 0;
  for (const CheckResult& c : checks) {
    if (c.result == Result::kFailed) code = std::max(code, 2);
    if (c.result == Result::kDegraded || c.result == Result::kSkipped) code = std::max(code, 1);
  }
  return code;
}

const char* VerdictName(int code) {
  return code == 0 ? "healthy" : code == 1 ? "degraded" : "failed";
}

void Print(const DiagOptions& options, std::vector<CheckResult> checks, const std::string& version,
           const std::string& driver, int code) {
  std::stable_sort(checks.begin(), checks.end(),
                   [](const CheckResult& a, const CheckResult& b) { return a.id < b.id; });
  if (options.json) {
    Json root;
    root["status"] = VerdictName(code);
    root["exit_code"] = code;
    root["tern_version"] = version;
    root["driver"] = driver;
    Json list = Json::array();
    for (const CheckResult& c : checks) {
      Json entry;
      entry["check"] = diag::CheckName(c.id);
      entry["title"] = diag::CheckTitle(c.id);
      entry["device"] = c.device >= 0 ? Json(c.device) : Json(nullptr);
      entry["result"] = diag::ResultName(c.result);
      entry["detail"] = c.detail;
      entry["metrics"] = c.metrics;
      list.push_back(std::move(entry));
    }
    root["checks"] = std::move(list);
    std::cout << root.dump(2) << '\n';
  } else {
    Table table({"CHECK", "DEVICE", "RESULT", "DETAIL"});
    for (const CheckResult& c : checks) {
      table.AddRow({diag::CheckName(c.id), c.device >= 0 ? std::to_string(c.device) : "-",
                    diag::ResultLabel(c.result), c.detail});
    }
    std::cout << table.Render() << '\n'
              << fmt::format("Result: {} (exit {})\n", VerdictName(code), code);
  }
  std::cout.flush();
}

int RunDiag(const DiagOptions& options) {
  uint64_t hbm_bytes = 0, bandwidth_bytes = 0;
  if (!ParseByteSize(options.hbm_bytes, &hbm_bytes) || hbm_bytes == 0 ||
      !ParseByteSize(options.bandwidth_bytes, &bandwidth_bytes) || bandwidth_bytes == 0) {
    throw ToolError("--hbm-bytes and --bandwidth-bytes take a size > 0 like 4096, 64K, 16M or 1G",
                    kExitUsage);
  }
  std::optional<tern_fault_kind_t> fault;
  if (!options.inject.empty()) {
    fault = ParseFault(options.inject);
    if (!fault) {
      throw ToolError("--inject takes dma_abort, hbm_ue or hang, not '" + options.inject + "'",
                      kExitUsage);
    }
    // An injected hang ends at the execution timeout: keep it short unless
    // the caller chose one.
    if (*fault == TERN_FAULT_CORE_HANG) setenv("TERN_EXEC_TIMEOUT", "2", 0);
  }
  // Failures diag provokes are in its report; the runtime's warnings about
  // them on stderr would only repeat it.
  setenv("TERN_LOG_LEVEL", "error", 0);

  std::vector<CheckResult> checks;
  std::unique_ptr<Runtime> runtime;
  try {
    runtime = std::make_unique<Runtime>();
  } catch (const ToolError& e) {
    checks.push_back({CheckId::kRuntime, -1, Result::kFailed, e.what()});
    Print(options, checks, "", "", 2);
    return 2;
  }
  {
    CheckResult check{CheckId::kRuntime};
    check.detail =
        fmt::format("driver {}, {} device{}, tern {}", runtime->driver(), runtime->device_count(),
                    runtime->device_count() == 1 ? "" : "s", runtime->version());
    if (runtime->device_count() == 0) {
      check.result = Result::kFailed;
      check.detail += ": no device is visible (check TERN_VISIBLE_CORES)";
    }
    checks.push_back(std::move(check));
  }

  std::vector<uint32_t> devices = options.devices;
  if (devices.empty()) {
    for (uint32_t i = 0; i < runtime->device_count(); ++i) devices.push_back(i);
  }
  for (uint32_t index : devices) {
    if (index >= runtime->device_count()) {
      throw ToolError(
          fmt::format("--device {}: this node has {} devices", index, runtime->device_count()),
          kExitUsage);
    }
  }

  bool injected = false;
  for (uint32_t index : devices) {
    const tern_device_t device = runtime->device(index);
    diag::DiagCore core;
    const bool opened = core.Open(device, runtime->info(index).core_count);
    const bool all_busy = !opened && core.error().empty();
    if (fault && !injected && opened) {
      tern_fault_params_t params = {};
      params.struct_size = sizeof(params);
      params.kind = *fault;
      params.core = core.core();
      params.after_commands = 0;
      Check("tern_debug_inject_fault", tern_debug_inject_fault(&params));
      injected = true;
    }
    checks.push_back(diag::HbmPatternTest(index, device, core, all_busy, hbm_bytes));
    checks.push_back(diag::BandwidthTest(index, device, core, all_busy, bandwidth_bytes,
                                         options.min_bandwidth_ratio));
    checks.push_back(diag::ComputeSelfTest(index, device, core, all_busy));
  }
  if (fault && !injected) {
    throw ToolError("--inject " + options.inject +
                    ": no core could be opened to arm the fault on (every core is busy)");
  }

  checks.push_back(diag::CollectiveLoopback(*runtime, devices));

  const NodeSample sample = TakeSample(*runtime);
  for (uint32_t index : devices) {
    checks.push_back(diag::EccCheck(sample.devices[index]));
    checks.push_back(diag::ErrorCountersCheck(sample.devices[index]));
  }

  const int code = Verdict(checks);
  Print(options, checks, runtime->version(), runtime->driver(), code);
  return code;
}

}  // namespace

Runner AddDiagOptions(CLI::App* app) {
  auto options = std::make_shared<DiagOptions>();
  AddJsonFlag(app, &options->json);
  app->add_option("--device", options->devices, "Check only these devices (repeatable)")
      ->type_name("INDEX");
  app->add_option("--hbm-bytes", options->hbm_bytes,
                  "Device memory the pattern test covers per device (at most half of what is "
                  "free)")
      ->type_name("SIZE")
      ->default_str("16M");
  app->add_option("--bandwidth-bytes", options->bandwidth_bytes, "Size of each timed copy")
      ->type_name("SIZE")
      ->default_str("16M");
  app->add_option("--min-bandwidth-ratio", options->min_bandwidth_ratio,
                  "Copy bandwidth below this fraction of memcpy's is degraded (0 disables; "
                  "timings on a loaded host vary)")
      ->type_name("RATIO")
      ->default_val(0.25)
      ->check(CLI::NonNegativeNumber);
  app->add_option("--inject", options->inject,
                  "Test hook: arm a fault on the first core diag opens before the checks run: "
                  "dma_abort, hbm_ue or hang (hang sets TERN_EXEC_TIMEOUT=2 unless set)")
      ->type_name("FAULT");
  return [options]() { return RunDiag(*options); };
}

}  // namespace tern::tools
