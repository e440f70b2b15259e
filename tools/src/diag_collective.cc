// collective_loopback: a sum all-reduce across every free core of the
// checked devices, all ranks in this process.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "diag_checks.h"
#include "util.h"

namespace tern::tools::diag {
namespace {

// The collective loopback: one communicator over every free core of the
// checked devices (all ranks in this process), an in-place fp32 sum
// all-reduce of small integers, compared exactly with the host's sum.
constexpr uint64_t kLoopbackElements = 64 * 1024;

}  // namespace

CheckResult CollectiveLoopback(const Runtime& runtime, const std::vector<uint32_t>& devices) {
  CheckResult check{CheckId::kCollective};
  struct Rank {
    tern_core_t core = nullptr;
    tern_queue_t queue = nullptr;
    tern_buffer_t buffer = nullptr;
    tern_comm_t comm = nullptr;
    uint32_t device = 0;
    uint32_t core_index = 0;
  };
  std::vector<Rank> ranks;
  std::string failure;
  for (uint32_t index : devices) {
    for (uint32_t c = 0; c < runtime.info(index).core_count && failure.empty(); ++c) {
      Rank rank;
      const tern_status_t s = tern_core_open(runtime.device(index), c, &rank.core);
      if (s == TERN_ERROR_BUSY) continue;
      if (s != TERN_OK) {
        failure = DescribeFailure("tern_core_open", s);
        break;
      }
      rank.device = index;
      rank.core_index = c;
      ranks.push_back(rank);
    }
  }
  const uint64_t bytes = kLoopbackElements * sizeof(float);
  auto release = [&] {
    for (Rank& r : ranks) {
      if (r.comm != nullptr) tern_comm_destroy(r.comm);
      if (r.queue != nullptr) tern_queue_destroy(r.queue);
      if (r.buffer != nullptr) tern_buffer_free(r.buffer);
      if (r.core != nullptr) tern_core_close(r.core);
    }
  };
  if (failure.empty() && ranks.size() < 2) {
    release();
    return check.Set(Result::kSkipped,
                     fmt::format("skipped (needs 2 free cores, {} free)", ranks.size()));
  }
  const uint32_t n = static_cast<uint32_t>(ranks.size());
  std::vector<float> data(kLoopbackElements);
  for (uint32_t r = 0; r < n && failure.empty(); ++r) {
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = bytes;
    params.category = TERN_MEMORY_SCRATCH;
    tern_status_t s = tern_buffer_alloc(runtime.device(ranks[r].device), &params, &ranks[r].buffer);
    if (s == TERN_OK) s = tern_queue_create(ranks[r].core, nullptr, &ranks[r].queue);
    for (uint64_t i = 0; i < kLoopbackElements; ++i) data[i] = static_cast<float>(r + 1 + i % 7);
    if (s == TERN_OK) s = tern_buffer_write(ranks[r].buffer, 0, data.data(), bytes);
    if (s != TERN_OK) failure = fmt::format("rank {}: {}", r, DescribeFailure("setting it up", s));
  }
  if (failure.empty()) {
    std::vector<tern_core_t> cores;
    std::vector<tern_comm_t> comms(n, nullptr);
    for (const Rank& r : ranks) cores.push_back(r.core);
    const tern_status_t s = tern_comm_init_all(cores.data(), n, nullptr, comms.data());
    if (s != TERN_OK) failure = DescribeFailure("tern_comm_init_all", s);
    for (uint32_t r = 0; r < n; ++r) ranks[r].comm = comms[r];
  }
  uint64_t elapsed_ns = 0;
  if (failure.empty()) {
    const uint64_t start = MonotonicNs();
    tern_status_t s = TERN_OK;
    for (uint32_t r = 0; r < n && s == TERN_OK; ++r) {
      s = tern_comm_all_reduce(ranks[r].comm, ranks[r].buffer, 0, ranks[r].buffer, 0,
                               kLoopbackElements, TERN_DTYPE_F32, TERN_COMM_SUM, ranks[r].queue);
    }
    if (s != TERN_OK) failure = DescribeFailure("tern_comm_all_reduce", s);
    for (uint32_t r = 0; r < n; ++r) {
      const tern_status_t sync = tern_queue_synchronize(ranks[r].queue, kSyncTimeoutNs);
      if (sync != TERN_OK && failure.empty()) {
        failure = fmt::format("rank {} (device {} core {}): {}", r, ranks[r].device,
                              ranks[r].core_index, DescribeFailure("tern_queue_synchronize", sync));
      }
    }
    elapsed_ns = MonotonicNs() - start;
  }
  uint64_t mismatches = 0;
  if (failure.empty()) {
    const float rank_sum = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0f;
    for (uint32_t r = 0; r < n && failure.empty(); ++r) {
      const tern_status_t s = tern_buffer_read(ranks[r].buffer, 0, data.data(), bytes);
      if (s != TERN_OK) {
        failure = DescribeFailure("tern_buffer_read", s);
        break;
      }
      for (uint64_t i = 0; i < kLoopbackElements; ++i) {
        const float expected = rank_sum + static_cast<float>(n * (i % 7));
        if (data[i] != expected) ++mismatches;
      }
    }
  }
  std::string cores_text;
  for (const Rank& r : ranks) {
    cores_text += fmt::format("{}{}:{}", cores_text.empty() ? "" : " ", r.device, r.core_index);
  }
  release();
  check.metrics = {{"ranks", n},
                   {"bytes", bytes},
                   {"mismatched_elements", mismatches},
                   {"us", static_cast<double>(elapsed_ns) / 1e3}};
  if (!failure.empty()) {
    check.result = Result::kFailed;
    check.detail = "all-reduce across the node's cores failed: " + failure;
  } else if (mismatches > 0) {
    check.result = Result::kFailed;
    check.detail = fmt::format("sum all-reduce over {} ranks: {} wrong elements", n, mismatches);
  } else {
    check.detail =
        fmt::format("sum all-reduce of {} over {} ranks (cores {}): exact, {:.0f} us",
                    FormatBytes(bytes), n, cores_text, static_cast<double>(elapsed_ns) / 1e3);
  }
  return check;
}

}  // namespace tern::tools::diag
