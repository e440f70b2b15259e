// hbm_pattern: writes patterns to device memory, reads them back and
// compares. Host-written patterns need no core; DMA fills need diag's core.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "diag_checks.h"
#include "util.h"

namespace tern::tools::diag {
namespace {

// Words that differ between what was written and what was read back.
struct Mismatch {
  uint64_t count = 0;
  uint64_t first_offset = 0;  // in bytes, of the first word that differs

  // Counts the words of `got` that differ from `expected`.
  void Add(const std::vector<uint64_t>& expected, const std::vector<uint64_t>& got) {
    for (size_t i = 0; i < expected.size(); ++i) {
      if (expected[i] == got[i]) continue;
      if (count == 0) first_offset = i * sizeof(uint64_t);
      ++count;
    }
  }
};

}  // namespace

CheckResult HbmPatternTest(uint32_t index, tern_device_t device, const DiagCore& core,
                           bool all_busy, uint64_t requested) {
  CheckResult check{CheckId::kHbmPattern, static_cast<int>(index)};
  const uint64_t size = TestSize(device, requested) & ~7ull;
  if (size < 64 * 1024) {
    return check.Set(Result::kSkipped, "skipped (not enough free device memory)");
  }
  DeviceBuffer buffer;
  if (const tern_status_t s = buffer.Allocate(device, size); s != TERN_OK) {
    return check.Set(Result::kFailed, DescribeFailure("tern_buffer_alloc", s));
  }
  const size_t words = size / sizeof(uint64_t);
  std::vector<uint64_t> expected(words), got(words);
  int host_patterns = 0, queue_patterns = 0;
  Mismatch total;
  std::string failure;

  // Host-written patterns through the synchronous DMA path (no core needed):
  // an address-derived pattern catches aliased or stuck address lines, its
  // complement catches stuck bits.
  for (const bool inverted : {false, true}) {
    for (size_t i = 0; i < words; ++i) {
      const uint64_t value = (i * 0x9E3779B97F4A7C15ull) ^ 0x7465726E64696167ull;
      expected[i] = inverted ? ~value : value;
    }
    std::fill(got.begin(), got.end(), 0);
    if (const tern_status_t s = tern_buffer_write(buffer.get(), 0, expected.data(), size);
        s != TERN_OK) {
      failure = DescribeFailure("tern_buffer_write", s);
      break;
    }
    if (const tern_status_t s = tern_buffer_read(buffer.get(), 0, got.data(), size); s != TERN_OK) {
      failure = DescribeFailure("tern_buffer_read", s);
      break;
    }
    total.Add(expected, got);
    ++host_patterns;
  }

  // Fills by the core's DMA engine, read back with a queue copy.
  if (failure.empty() && core.queue() != nullptr) {
    for (const uint32_t pattern :
         {0x00000000u, 0xFFFFFFFFu, 0x55555555u, 0xAAAAAAAAu, 0x5A5AA5A5u}) {
      const uint64_t word = (static_cast<uint64_t>(pattern) << 32) | pattern;
      std::fill(expected.begin(), expected.end(), word);
      std::fill(got.begin(), got.end(), ~word);
      tern_status_t s = tern_queue_fill(core.queue(), buffer.get(), 0, size, pattern, nullptr);
      if (s == TERN_OK)
        s = tern_queue_copy_d2h(core.queue(), got.data(), buffer.get(), 0, size, nullptr);
      if (s == TERN_OK) s = tern_queue_synchronize(core.queue(), kSyncTimeoutNs);
      if (s != TERN_OK) {
        failure = fmt::format("DMA fill with {:#010x} on core {} failed: {}", pattern, core.index(),
                              DescribeFailure("tern_queue_synchronize", s));
        tern_queue_clear_error(core.queue());
        break;
      }
      total.Add(expected, got);
      ++queue_patterns;
    }
  }

  check.metrics = {{"bytes", size},
                   {"host_patterns", host_patterns},
                   {"queue_patterns", queue_patterns},
                   {"mismatched_words", total.count}};
  if (core.queue() != nullptr) check.metrics["core"] = core.index();
  if (!failure.empty()) {
    check.Set(Result::kFailed, failure);
  } else if (total.count > 0) {
    check.Set(Result::kFailed, fmt::format("{} words differ from what was written (first at "
                                           "offset {:#x} of {}); the device memory is faulty",
                                           total.count, total.first_offset, FormatBytes(size)));
  } else if (core.queue() == nullptr) {
    // The host patterns passed; without a core the check is incomplete:
    // skipped when every core is busy, failed when opening one failed.
    check.Set(all_busy ? Result::kSkipped : Result::kFailed,
              fmt::format("{} host-written patterns over {} passed; queue-fill patterns {}",
                          host_patterns, FormatBytes(size),
                          all_busy ? "skipped (all cores busy)"
                                   : "skipped (no core could be opened: " + core.error() + ")"));
  } else {
    check.detail = fmt::format("{} patterns over {} (core {}), 0 mismatches",
                               host_patterns + queue_patterns, FormatBytes(size), core.index());
  }
  return check;
}

}  // namespace tern::tools::diag
