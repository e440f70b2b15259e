// copy_bandwidth: H2D and D2H copies timed on the device, against memcpy on
// the host; degraded below --min-bandwidth-ratio of memcpy.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "diag_checks.h"
#include "util.h"

namespace tern::tools::diag {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr int kBandwidthRepetitions = 8;

// Host memory for the bandwidth test: pinned when the locked-memory limit
// allows, pageable otherwise (the copy path stages or reads it directly).
class HostBuffer {
 public:
  explicit HostBuffer(uint64_t size) {
    void* ptr = nullptr;
    if (tern_host_alloc(size, &ptr) == TERN_OK) {
      ptr_ = ptr;
      pinned_ = true;
    } else {
      ptr_ = std::aligned_alloc(4096, (size + 4095) & ~4095ull);
      if (ptr_ == nullptr)
        throw ToolError(fmt::format("cannot allocate {} of host memory", FormatBytes(size)));
      std::memset(ptr_, 0x5a, size);  // commit the pages before timing
    }
  }
  ~HostBuffer() {
    if (pinned_) {
      tern_host_free(ptr_);
    } else {
      std::free(ptr_);
    }
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* get() const { return ptr_; }
  bool pinned() const { return pinned_; }

 private:
  void* ptr_ = nullptr;
  bool pinned_ = false;
};

// Makes the memcpy into `p` observable, so the compiler cannot drop it.
void KeepAlive(void* p) { asm volatile("" : : "r"(p) : "memory"); }

}  // namespace

CheckResult BandwidthTest(uint32_t index, tern_device_t device, const DiagCore& core, bool all_busy,
                          uint64_t requested, double min_ratio) {
  CheckResult check{CheckId::kCopyBandwidth, static_cast<int>(index)};
  if (MissingCore(core, all_busy, &check)) return check;
  const uint64_t size = TestSize(device, requested);
  if (size < kMiB) {
    return check.Set(Result::kSkipped, "skipped (not enough free device memory)");
  }
  DeviceBuffer buffer;
  if (const tern_status_t s = buffer.Allocate(device, size); s != TERN_OK) {
    return check.Set(Result::kFailed, DescribeFailure("tern_buffer_alloc", s));
  }
  HostBuffer host(size);
  HostBuffer host_copy(size);
  tern_queue_t queue = core.queue();

  // Each copy is timed on the device, between two events around it: what the
  // engine took, not the wake-up of its thread. Copies and memcpy alternate so
  // that both see the same load on the host, and the best of several runs of
  // each counts. Run 0, untimed, commits the device pages.
  tern_event_t events[2] = {nullptr, nullptr};
  for (tern_event_t& event : events) {
    if (const tern_status_t s = tern_event_create(&event); s != TERN_OK) {
      for (tern_event_t e : events) {
        if (e != nullptr) tern_event_destroy(e);
      }
      return check.Set(Result::kFailed, DescribeFailure("tern_event_create", s));
    }
  }
  double h2d_s = 0, d2h_s = 0, memcpy_s = 0;
  auto keep_best = [](int run, double seconds, double* best) {
    if (run > 0 && seconds > 0 && (*best == 0 || seconds < *best)) *best = seconds;
  };
  tern_status_t s = TERN_OK;
  const char* direction = "H2D";
  for (int run = 0; run <= kBandwidthRepetitions && s == TERN_OK; ++run) {
    for (const bool to_device : {true, false}) {
      direction = to_device ? "H2D" : "D2H";
      s = tern_queue_record_event(queue, events[0], nullptr);
      if (s == TERN_OK) {
        s = to_device ? tern_queue_copy_h2d(queue, buffer.get(), 0, host.get(), size, nullptr)
                      : tern_queue_copy_d2h(queue, host.get(), buffer.get(), 0, size, nullptr);
      }
      if (s == TERN_OK) s = tern_queue_record_event(queue, events[1], nullptr);
      if (s == TERN_OK) s = tern_queue_synchronize(queue, kSyncTimeoutNs);
      uint64_t elapsed_ns = 0;
      if (s == TERN_OK) s = tern_event_elapsed_ns(events[0], events[1], &elapsed_ns);
      if (s != TERN_OK) break;
      keep_best(run, static_cast<double>(elapsed_ns) / 1e9, to_device ? &h2d_s : &d2h_s);
    }
    const uint64_t start = MonotonicNs();
    std::memcpy(host_copy.get(), host.get(), size);
    KeepAlive(host_copy.get());
    keep_best(run, static_cast<double>(MonotonicNs() - start) / 1e9, &memcpy_s);
  }
  for (tern_event_t e : events) tern_event_destroy(e);
  if (s != TERN_OK) {
    check.result = Result::kFailed;
    check.detail = fmt::format("{} copy on core {} failed: {}", direction, core.index(),
                               DescribeFailure("tern_queue_synchronize", s));
    tern_queue_clear_error(queue);
    return check;
  }
  auto gbps = [&](double seconds) {
    return seconds > 0 ? static_cast<double>(size) / seconds / 1e9 : 0.0;
  };
  const double h2d = gbps(h2d_s), d2h = gbps(d2h_s), host_memcpy = gbps(memcpy_s);
  const double ratio = host_memcpy > 0 ? std::min(h2d, d2h) / host_memcpy : 0.0;
  check.metrics = {
      {"bytes", size},           {"core", core.index()}, {"pinned_host_memory", host.pinned()},
      {"h2d_gbps", h2d},         {"d2h_gbps", d2h},      {"memcpy_gbps", host_memcpy},
      {"ratio_to_memcpy", ratio}};
  check.detail = fmt::format(
      "H2D {:.2f} GB/s, D2H {:.2f} GB/s, memcpy {:.2f} GB/s: {:.2f}x ({}, {} "
      "host memory, core {})",
      h2d, d2h, host_memcpy, ratio, FormatBytes(size), host.pinned() ? "pinned" : "pageable",
      core.index());
  if (ratio < min_ratio) {
    check.result = Result::kDegraded;
    check.detail += fmt::format("; below {:g}x of memcpy", min_ratio);
  }
  return check;
}

}  // namespace tern::tools::diag
