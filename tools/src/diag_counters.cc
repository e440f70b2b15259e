// The passive checks: ECC and failed-command counters of the shared
// telemetry, read after the active checks ran (so what they provoked counts).
#include <fmt/format.h>

#include <string>

#include "diag_checks.h"
#include "util.h"

namespace tern::tools::diag {

CheckResult EccCheck(const DeviceSample& sample) {
  const tern_device_telemetry_t& t = sample.telemetry;
  CheckResult check{CheckId::kEcc, static_cast<int>(sample.info.index)};
  check.metrics = {{"corrected", t.ecc_corrected}, {"uncorrected", t.ecc_uncorrected}};
  if (t.ecc_uncorrected > 0) {
    check.result = Result::kFailed;
    check.detail = fmt::format(
        "{} uncorrected ECC error{} ({} corrected): device memory lost "
        "data; drain the device's workloads and reset or replace it",
        t.ecc_uncorrected, t.ecc_uncorrected == 1 ? "" : "s", t.ecc_corrected);
  } else {
    check.detail = fmt::format("0 uncorrected, {} corrected", t.ecc_corrected);
  }
  return check;
}

CheckResult ErrorCountersCheck(const DeviceSample& sample) {
  const tern_device_telemetry_t& t = sample.telemetry;
  CheckResult check{CheckId::kErrors, static_cast<int>(sample.info.index)};
  uint64_t by_class[TERN_ERROR_CLASS_COUNT] = {};
  std::string detail;
  for (uint32_t c = 0; c < CoreCount(t); ++c) {
    for (uint32_t e = 0; e < TERN_ERROR_CLASS_COUNT; ++e) {
      const uint64_t n = t.cores[c].errors[e];
      by_class[e] += n;
      if (n == 0) continue;
      if (!detail.empty()) detail += ", ";
      detail += fmt::format("core {} {} {}", c, ErrorClassName(e), n);
    }
  }
  check.metrics = ErrorsJson(by_class);
  if (detail.empty()) {
    check.detail = "no failed commands";
  } else {
    check.result = Result::kDegraded;
    check.detail = "failed commands: " + detail;
  }
  return check;
}

}  // namespace tern::tools::diag
