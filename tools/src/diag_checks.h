// The health checks of `tern diag`, one file each (diag_<check>.cc), and
// what they share: their result record, the core diag opens for the active
// checks, and device buffers. diag.cc runs them and prints the report.
#ifndef TERN_TOOLS_SRC_DIAG_CHECKS_H_
#define TERN_TOOLS_SRC_DIAG_CHECKS_H_

#include <tern/tern.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "node.h"
#include "report.h"

namespace tern::tools::diag {

// Bound on one synchronize; a hung command fails earlier, at TERN_EXEC_TIMEOUT.
inline constexpr uint64_t kSyncTimeoutNs = 300ull * 1000000000ull;

enum class Result { kPass, kDegraded, kFailed, kSkipped, kUnavailable };

// "pass", "degraded", ..., "not_available": the JSON value.
const char* ResultName(Result result);
// The table's: "n/a" for kUnavailable, ResultName() otherwise.
const char* ResultLabel(Result result);

// The order of checks in the report.
enum class CheckId { kRuntime, kHbmPattern, kCopyBandwidth, kCompute, kCollective, kEcc, kErrors };

// "hbm_pattern" and "HBM pattern test".
const char* CheckName(CheckId id);
const char* CheckTitle(CheckId id);

struct CheckResult {
  CheckId id;
  int device = -1;  // -1: the node as a whole
  Result result = Result::kPass;
  std::string detail;
  Json metrics = Json::object();

  // Sets the result and why; returns *this, for `return check.Set(...)`.
  CheckResult& Set(Result new_result, std::string new_detail) {
    result = new_result;
    detail = std::move(new_detail);
    return *this;
  }
};

// A core diag opened for its active checks, with one queue; closed on scope exit.
class DiagCore {
 public:
  DiagCore() = default;
  ~DiagCore();
  DiagCore(const DiagCore&) = delete;
  DiagCore& operator=(const DiagCore&) = delete;

  // Opens the first core of `device` that no process holds. Returns false
  // when every core is busy; throws nothing, records other failures in error().
  bool Open(tern_device_t device, uint32_t core_count);

  tern_core_t core() const { return core_; }
  tern_queue_t queue() const { return queue_; }
  uint32_t index() const { return index_; }
  // Why no core could be opened when that was not because all were busy.
  const std::string& error() const { return error_; }

 private:
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  uint32_t index_ = 0;
  std::string error_;
};

// A scratch buffer of device memory, freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  tern_status_t Allocate(tern_device_t device, uint64_t size);
  tern_buffer_t get() const { return buffer_; }

 private:
  tern_buffer_t buffer_ = nullptr;
};

// How much device memory an active test may take: what it asked for, but no
// more than half of what is free on the node, in whole pages.
uint64_t TestSize(tern_device_t device, uint64_t requested);

// For checks that need a core: when diag has none, records why (skipped
// when every core is busy, failed otherwise) and returns true.
bool MissingCore(const DiagCore& core, bool all_busy, CheckResult* check);

// The active checks of one device, on `core` (which may have no queue:
// `all_busy` says whether that is because every core was busy).
CheckResult HbmPatternTest(uint32_t index, tern_device_t device, const DiagCore& core,
                           bool all_busy, uint64_t requested);
CheckResult BandwidthTest(uint32_t index, tern_device_t device, const DiagCore& core, bool all_busy,
                          uint64_t requested, double min_ratio);
CheckResult ComputeSelfTest(uint32_t index, tern_device_t device, const DiagCore& core,
                            bool all_busy);
// The active check of the node: every free core of `devices` together.
CheckResult CollectiveLoopback(const Runtime& runtime, const std::vector<uint32_t>& devices);
// The passive checks, on the counters after the active checks ran.
CheckResult EccCheck(const DeviceSample& sample);
CheckResult ErrorCountersCheck(const DeviceSample& sample);

}  // namespace tern::tools::diag

#endif  // TERN_TOOLS_SRC_DIAG_CHECKS_H_
