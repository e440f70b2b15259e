#include "diag_checks.h"

#include <algorithm>
#include <iterator>

#include "util.h"

namespace tern::tools::diag {
namespace {

// Indexed by Result and by CheckId: a new value needs its entry here.
constexpr const char* kResultNames[] = {"pass", "degraded", "failed", "skipped", "not_available"};
static_assert(std::size(kResultNames) == static_cast<size_t>(Result::kUnavailable) + 1);

struct CheckNames {
  const char* name;
  const char* title;
};
constexpr CheckNames kCheckNames[] = {
    {"runtime", "Runtime starts and lists devices"},
    {"hbm_pattern", "HBM pattern test"},
    {"copy_bandwidth", "Copy bandwidth (H2D, D2H)"},
    {"compute_selftest", "Compute self-test"},
    {"collective_loopback", "Collective loopback"},
    {"ecc", "ECC counters"},
    {"error_counters", "Error counters"},
};
static_assert(std::size(kCheckNames) == static_cast<size_t>(CheckId::kErrors) + 1);

}  // namespace

const char* ResultName(Result result) { return kResultNames[static_cast<size_t>(result)]; }

const char* ResultLabel(Result result) {
  return result == Result::kUnavailable ? "n/a" : ResultName(result);
}

const char* CheckName(CheckId id) { return kCheckNames[static_cast<size_t>(id)].name; }
const char* CheckTitle(CheckId id) { return kCheckNames[static_cast<size_t>(id)].title; }

DiagCore::~DiagCore() {
  if (queue_ != nullptr) tern_queue_destroy(queue_);
  if (core_ != nullptr) tern_core_close(core_);
}

bool DiagCore::Open(tern_device_t device, uint32_t core_count) {
  for (uint32_t c = 0; c < core_count; ++c) {
    const tern_status_t status = tern_core_open(device, c, &core_);
    if (status == TERN_ERROR_BUSY) continue;
    if (status != TERN_OK) {
      error_ = DescribeFailure("tern_core_open", status);
      return false;
    }
    tern_queue_params_t params = {};
    params.struct_size = sizeof(params);
    params.name = "tern-diag";
    if (const tern_status_t q = tern_queue_create(core_, &params, &queue_); q != TERN_OK) {
      error_ = DescribeFailure("tern_queue_create", q);
      tern_core_close(core_);
      core_ = nullptr;
      return false;
    }
    index_ = c;
    return true;
  }
  return false;
}

DeviceBuffer::~DeviceBuffer() {
  if (buffer_ != nullptr) tern_buffer_free(buffer_);
}

tern_status_t DeviceBuffer::Allocate(tern_device_t device, uint64_t size) {
  tern_buffer_params_t params = {};
  params.struct_size = sizeof(params);
  params.size = size;
  params.category = TERN_MEMORY_SCRATCH;
  return tern_buffer_alloc(device, &params, &buffer_);
}

uint64_t TestSize(tern_device_t device, uint64_t requested) {
  tern_memory_stats_t stats = {};
  stats.struct_size = sizeof(stats);
  if (tern_device_memory_stats(device, &stats) != TERN_OK) return 0;
  return std::min(requested, stats.free_bytes / 2) & ~4095ull;
}

bool MissingCore(const DiagCore& core, bool all_busy, CheckResult* check) {
  if (core.queue() != nullptr) return false;
  check->Set(all_busy ? Result::kSkipped : Result::kFailed,
             all_busy ? "skipped (all cores busy)" : "no core could be opened: " + core.error());
  return true;
}

}  // namespace tern::tools::diag
