// `tern diag`: health checks of the node's devices, with an exit code for
// scripts: 0 healthy, 1 degraded, 2 failed.
//
// Active checks (HBM patterns, copy bandwidth, compute) allocate device memory and, for
// commands that need a queue, open a core that no workload holds; they never
// wait for a busy core. Passive checks read the shared counters after the
// active ones ran, so errors those provoked are counted too.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "node.h"
#include "report.h"
#include "subcommands.h"
#include "util.h"

namespace tern::tools {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
// Bound on one synchronize; a hung command fails earlier, at TERN_EXEC_TIMEOUT.
constexpr uint64_t kSyncTimeoutNs = 300ull * 1000000000ull;
constexpr int kBandwidthRepetitions = 8;

enum class Result { kPass, kDegraded, kFailed, kSkipped, kUnavailable };

const char* ResultName(Result result) {
  switch (result) {
    case Result::kPass:
      return "pass";
    case Result::kDegraded:
      return "degraded";
    case Result::kFailed:
      return "failed";
    case Result::kSkipped:
      return "skipped";
    case Result::kUnavailable:
      return "not_available";
  }
  return "?";
}

const char* ResultLabel(Result result) {
  return result == Result::kUnavailable ? "n/a" : ResultName(result);
}

// The order of checks in the report.
enum class CheckId { kRuntime, kHbmPattern, kCopyBandwidth, kCompute, kCollective, kEcc, kErrors };

struct CheckResult {
  CheckId id;
  int device = -1;  // -1: the node as a whole
  Result result = Result::kPass;
  std::string detail;
  Json metrics = Json::object();
};

const char* CheckName(CheckId id) {
  switch (id) {
    case CheckId::kRuntime:
      return "runtime";
    case CheckId::kHbmPattern:
      return "hbm_pattern";
    case CheckId::kCopyBandwidth:
      return "copy_bandwidth";
    case CheckId::kCompute:
      return "compute_selftest";
    case CheckId::kCollective:
      return "collective_loopback";
    case CheckId::kEcc:
      return "ecc";
    case CheckId::kErrors:
      return "error_counters";
  }
  return "?";
}

const char* CheckTitle(CheckId id) {
  switch (id) {
    case CheckId::kRuntime:
      return "Runtime starts and lists devices";
    case CheckId::kHbmPattern:
      return "HBM pattern test";
    case CheckId::kCopyBandwidth:
      return "Copy bandwidth (H2D, D2H)";
    case CheckId::kCompute:
      return "Compute self-test";
    case CheckId::kCollective:
      return "Collective loopback";
    case CheckId::kEcc:
      return "ECC counters";
    case CheckId::kErrors:
      return "Error counters";
  }
  return "?";
}

struct DiagOptions {
  bool json = false;
  std::string inject;
  std::vector<uint32_t> devices;
  std::string hbm_bytes = "16M";
  std::string bandwidth_bytes = "16M";
  double min_bandwidth_ratio = 0.25;
};

// A core diag opened for its active checks, with one queue; closed on scope exit.
class DiagCore {
 public:
  DiagCore() = default;
  ~DiagCore() {
    if (queue_ != nullptr) tern_queue_destroy(queue_);
    if (core_ != nullptr) tern_core_close(core_);
  }
  DiagCore(const DiagCore&) = delete;
  DiagCore& operator=(const DiagCore&) = delete;

  // Opens the first core of `device` that no process holds. Returns false
  // when every core is busy; throws nothing, records other failures in error().
  bool Open(tern_device_t device, uint32_t core_count) {
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

class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (buffer_ != nullptr) tern_buffer_free(buffer_);
  }
  tern_status_t Allocate(tern_device_t device, uint64_t size) {
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_SCRATCH;
    return tern_buffer_alloc(device, &params, &buffer_);
  }
  tern_buffer_t get() const { return buffer_; }

 private:
  tern_buffer_t buffer_ = nullptr;
};

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

// How much device memory an active test may take: what it asked for, but no
// more than half of what is free on the node, in whole pages.
uint64_t TestSize(tern_device_t device, uint64_t requested) {
  tern_memory_stats_t stats = {};
  stats.struct_size = sizeof(stats);
  if (tern_device_memory_stats(device, &stats) != TERN_OK) return 0;
  return std::min(requested, stats.free_bytes / 2) & ~4095ull;
}

struct Mismatch {
  uint64_t count = 0;
  uint64_t first_offset = 0;
};

Mismatch Compare(const std::vector<uint64_t>& expected, const std::vector<uint64_t>& got) {
  Mismatch m;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == got[i]) continue;
    if (m.count == 0) m.first_offset = i * sizeof(uint64_t);
    ++m.count;
  }
  return m;
}

CheckResult HbmPatternTest(uint32_t index, tern_device_t device, const DiagCore& core,
                           bool all_busy, uint64_t requested) {
  CheckResult check{CheckId::kHbmPattern, static_cast<int>(index)};
  const uint64_t size = TestSize(device, requested) & ~7ull;
  if (size < 64 * 1024) {
    check.result = Result::kSkipped;
    check.detail = "skipped (not enough free device memory)";
    return check;
  }
  DeviceBuffer buffer;
  if (const tern_status_t s = buffer.Allocate(device, size); s != TERN_OK) {
    check.result = Result::kFailed;
    check.detail = DescribeFailure("tern_buffer_alloc", s);
    return check;
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
    const Mismatch m = Compare(expected, got);
    if (m.count > 0 && total.count == 0) total.first_offset = m.first_offset;
    total.count += m.count;
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
      const Mismatch m = Compare(expected, got);
      if (m.count > 0 && total.count == 0) total.first_offset = m.first_offset;
      total.count += m.count;
      ++queue_patterns;
    }
  }

  check.metrics = {{"bytes", size},
                   {"host_patterns", host_patterns},
                   {"queue_patterns", queue_patterns},
                   {"mismatched_words", total.count}};
  if (core.queue() != nullptr) check.metrics["core"] = core.index();
  if (!failure.empty()) {
    check.result = Result::kFailed;
    check.detail = failure;
  } else if (total.count > 0) {
    check.result = Result::kFailed;
    check.detail = fmt::format(
        "{} words differ from what was written (first at offset {:#x} of "
        "{}); the device memory is faulty",
        total.count, total.first_offset, FormatBytes(size));
  } else if (core.queue() == nullptr) {
    check.result = Result::kSkipped;
    check.detail =
        fmt::format("{} host-written patterns over {} passed; queue-fill patterns {}",
                    host_patterns, FormatBytes(size),
                    all_busy ? "skipped (all cores busy)"
                             : "skipped (no core could be opened: " + core.error() + ")");
    if (!all_busy) check.result = Result::kFailed;
  } else {
    check.detail = fmt::format("{} patterns over {} (core {}), 0 mismatches",
                               host_patterns + queue_patterns, FormatBytes(size), core.index());
  }
  return check;
}

// For checks that need a core: when diag has none, records why (skipped
// when every core is busy, failed otherwise) and returns true.
bool MissingCore(const DiagCore& core, bool all_busy, CheckResult* check) {
  if (core.queue() != nullptr) return false;
  check->result = all_busy ? Result::kSkipped : Result::kFailed;
  check->detail =
      all_busy ? "skipped (all cores busy)" : "no core could be opened: " + core.error();
  return true;
}

void KeepAlive(void* p) { asm volatile("" : : "r"(p) : "memory"); }

CheckResult BandwidthTest(uint32_t index, tern_device_t device, const DiagCore& core, bool all_busy,
                          uint64_t requested, double min_ratio) {
  CheckResult check{CheckId::kCopyBandwidth, static_cast<int>(index)};
  if (MissingCore(core, all_busy, &check)) return check;
  const uint64_t size = TestSize(device, requested);
  if (size < kMiB) {
    check.result = Result::kSkipped;
    check.detail = "skipped (not enough free device memory)";
    return check;
  }
  DeviceBuffer buffer;
  if (const tern_status_t s = buffer.Allocate(device, size); s != TERN_OK) {
    check.result = Result::kFailed;
    check.detail = DescribeFailure("tern_buffer_alloc", s);
    return check;
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
      check.result = Result::kFailed;
      check.detail = DescribeFailure("tern_event_create", s);
      return check;
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

// The compute self-test: relu(a @ b) for 64x64 fp32 matrices of small
// integers, whose products and sums are exact in fp32, so the device's result
// must equal the host's bit for bit. Built with the public builder API.
constexpr int64_t kSelfTestN = 64;
constexpr int kSelfTestRuns = 3;

float SelfTestA(int64_t i, int64_t k) { return static_cast<float>((i * 3 + k * 7) % 17 - 8); }
float SelfTestB(int64_t k, int64_t j) { return static_cast<float>((k * 5 + j * 11) % 13 - 6); }

// Builds the self-test executable into `*data` (freed with tern_builder_free_data).
tern_status_t BuildSelfTest(void** data, uint64_t* size, std::string* failure) {
  tern_builder_t builder = nullptr;
  tern_status_t s = tern_builder_create(nullptr, &builder);
  if (s != TERN_OK) {
    *failure = DescribeFailure("tern_builder_create", s);
    return s;
  }
  const int64_t shape[2] = {kSelfTestN, kSelfTestN};
  const tern_operand_t out = {TERN_SEGMENT_OUTPUT, 0, 0, TERN_DTYPE_F32, 2, shape, nullptr};
  const tern_operand_t a = {TERN_SEGMENT_INPUT, 0, 0, TERN_DTYPE_F32, 2, shape, nullptr};
  const tern_operand_t b = {TERN_SEGMENT_INPUT, 1, 0, TERN_DTYPE_F32, 2, shape, nullptr};
  const tern_operand_t matmul_operands[3] = {out, a, b};
  const tern_operand_t relu_operands[2] = {out, out};
  const int64_t no_transpose[2] = {0, 0};
  const int64_t relu[1] = {TERN_UNARY_RELU};
  tern_instruction_t matmul = {};
  matmul.struct_size = sizeof(matmul);
  matmul.opcode = TERN_OP_MATMUL;
  matmul.operand_count = 3;
  matmul.operands = matmul_operands;
  matmul.int_count = 2;
  matmul.ints = no_transpose;
  matmul.debug_op = "diag.selftest.matmul";
  tern_instruction_t activation = {};
  activation.struct_size = sizeof(activation);
  activation.opcode = TERN_OP_UNARY;
  activation.operand_count = 2;
  activation.operands = relu_operands;
  activation.int_count = 1;
  activation.ints = relu;
  activation.debug_op = "diag.selftest.relu";
  const char* step = "tern_builder_begin_function";
  s = tern_builder_begin_function(builder, "selftest", nullptr);
  if (s == TERN_OK) {
    step = "tern_builder_add_input";
    s = tern_builder_add_input(builder, "a", TERN_DTYPE_F32, 2, shape, nullptr);
  }
  if (s == TERN_OK) s = tern_builder_add_input(builder, "b", TERN_DTYPE_F32, 2, shape, nullptr);
  if (s == TERN_OK) {
    step = "tern_builder_add_output";
    s = tern_builder_add_output(builder, "c", TERN_DTYPE_F32, 2, shape, nullptr);
  }
  if (s == TERN_OK) {
    step = "tern_builder_add_instruction";
    s = tern_builder_add_instruction(builder, &matmul);
  }
  if (s == TERN_OK) s = tern_builder_add_instruction(builder, &activation);
  if (s == TERN_OK) {
    step = "tern_builder_end_function";
    s = tern_builder_end_function(builder);
  }
  if (s == TERN_OK) {
    step = "tern_builder_finish";
    s = tern_builder_finish(builder, data, size);
  }
  if (s != TERN_OK) *failure = DescribeFailure(step, s);
  tern_builder_destroy(builder);
  return s;
}

CheckResult ComputeSelfTest(uint32_t index, tern_device_t device, const DiagCore& core,
                            bool all_busy) {
  CheckResult check{CheckId::kCompute, static_cast<int>(index)};
  if (MissingCore(core, all_busy, &check)) return check;
  constexpr int64_t n = kSelfTestN;
  constexpr uint64_t bytes = n * n * sizeof(float);
  std::vector<float> a(n * n), b(n * n), expected(n * n), got(n * n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      a[i * n + j] = SelfTestA(i, j);
      b[i * n + j] = SelfTestB(i, j);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += a[i * n + k] * b[k * n + j];
      expected[i * n + j] = std::max(sum, 0.0f);
    }
  }

  std::string failure;
  void* data = nullptr;
  uint64_t size = 0;
  if (BuildSelfTest(&data, &size, &failure) != TERN_OK) {
    check.result = Result::kFailed;
    check.detail = "could not build the self-test executable: " + failure;
    return check;
  }
  tern_executable_t executable = nullptr;
  const tern_status_t loaded = tern_executable_load(device, data, size, nullptr, &executable);
  tern_builder_free_data(data);
  if (loaded != TERN_OK) {
    check.result = Result::kFailed;
    check.detail = DescribeFailure("tern_executable_load", loaded);
    return check;
  }
  DeviceBuffer a_buffer, b_buffer, c_buffer;
  tern_status_t s = a_buffer.Allocate(device, bytes);
  if (s == TERN_OK) s = b_buffer.Allocate(device, bytes);
  if (s == TERN_OK) s = c_buffer.Allocate(device, bytes);
  if (s != TERN_OK) {
    tern_executable_unload(executable);
    check.result = Result::kFailed;
    check.detail = DescribeFailure("tern_buffer_alloc", s);
    return check;
  }
  const tern_binding_t inputs[2] = {{a_buffer.get(), 0}, {b_buffer.get(), 0}};
  const tern_binding_t outputs[1] = {{c_buffer.get(), 0}};
  tern_queue_t queue = core.queue();
  uint64_t mismatches = 0;
  int64_t first_mismatch = -1;
  uint64_t best_ns = 0;
  for (int run = 0; run < kSelfTestRuns && s == TERN_OK; ++run) {
    std::fill(got.begin(), got.end(), -1.0f);
    s = tern_queue_copy_h2d(queue, a_buffer.get(), 0, a.data(), bytes, nullptr);
    if (s == TERN_OK) s = tern_queue_copy_h2d(queue, b_buffer.get(), 0, b.data(), bytes, nullptr);
    if (s == TERN_OK) s = tern_queue_fill(queue, c_buffer.get(), 0, bytes, 0xffffffffu, nullptr);
    const uint64_t start = MonotonicNs();
    if (s == TERN_OK) s = tern_queue_execute(queue, executable, 0, inputs, 2, outputs, 1, nullptr);
    if (s == TERN_OK) s = tern_queue_synchronize(queue, kSyncTimeoutNs);
    const uint64_t elapsed = MonotonicNs() - start;
    if (s == TERN_OK) s = tern_queue_copy_d2h(queue, got.data(), c_buffer.get(), 0, bytes, nullptr);
    if (s == TERN_OK) s = tern_queue_synchronize(queue, kSyncTimeoutNs);
    if (s != TERN_OK) break;
    if (best_ns == 0 || elapsed < best_ns) best_ns = elapsed;
    for (int64_t i = 0; i < n * n; ++i) {
      if (std::memcmp(&got[i], &expected[i], sizeof(float)) == 0) continue;
      if (first_mismatch < 0) first_mismatch = i;
      ++mismatches;
    }
  }
  tern_executable_unload(executable);
  if (s != TERN_OK) {
    check.result = Result::kFailed;
    check.detail = fmt::format("the self-test on core {} failed: {}", core.index(),
                               DescribeFailure("tern_queue_synchronize", s));
    tern_queue_clear_error(queue);
    return check;
  }
  check.metrics = {{"core", core.index()},
                   {"runs", kSelfTestRuns},
                   {"mismatched_elements", mismatches},
                   {"best_us", static_cast<double>(best_ns) / 1e3}};
  if (mismatches > 0) {
    check.result = Result::kFailed;
    const int64_t i = first_mismatch;
    check.detail = fmt::format(
        "relu(a @ b) 64x64 fp32 on core {}: {} of {} results wrong over {} runs (first at "
        "[{}, {}]: {} instead of {}); the core computes wrong results: drain and reset it",
        core.index(), mismatches, kSelfTestRuns * n * n, kSelfTestRuns, i / n, i % n, got[i],
        expected[i]);
  } else {
    check.detail = fmt::format(
        "relu(a @ b) 64x64 fp32 on core {}: exact in {} runs (best {:.0f} us, submit to "
        "completion)",
        core.index(), kSelfTestRuns, static_cast<double>(best_ns) / 1e3);
  }
  return check;
}

// The collective loopback: one communicator over every free core of the
// checked devices (all ranks in this process), an in-place fp32 sum
// all-reduce of small integers, compared exactly with the host's sum.
constexpr uint64_t kLoopbackElements = 64 * 1024;

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
    check.result = Result::kSkipped;
    check.detail = fmt::format("skipped (needs 2 free cores, {} free)", ranks.size());
    return check;
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
  for (uint32_t c = 0; c < std::min<uint32_t>(t.core_count, TERN_TELEMETRY_MAX_CORES); ++c) {
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
      entry["check"] = CheckName(c.id);
      entry["title"] = CheckTitle(c.id);
      entry["device"] = c.device >= 0 ? Json(c.device) : Json(nullptr);
      entry["result"] = ResultName(c.result);
      entry["detail"] = c.detail;
      entry["metrics"] = c.metrics;
      list.push_back(std::move(entry));
    }
    root["checks"] = std::move(list);
    std::cout << root.dump(2) << '\n';
  } else {
    Table table({"CHECK", "DEVICE", "RESULT", "DETAIL"});
    for (const CheckResult& c : checks) {
      table.AddRow({CheckName(c.id), c.device >= 0 ? std::to_string(c.device) : "-",
                    ResultLabel(c.result), c.detail});
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
    DiagCore core;
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
    checks.push_back(HbmPatternTest(index, device, core, all_busy, hbm_bytes));
    checks.push_back(
        BandwidthTest(index, device, core, all_busy, bandwidth_bytes, options.min_bandwidth_ratio));
    checks.push_back(ComputeSelfTest(index, device, core, all_busy));
  }
  if (fault && !injected) {
    throw ToolError("--inject " + options.inject +
                    ": no core could be opened to arm the fault on (every core is busy)");
  }

  checks.push_back(CollectiveLoopback(*runtime, devices));

  const NodeSample sample = TakeSample(*runtime);
  for (uint32_t index : devices) {
    checks.push_back(EccCheck(sample.devices[index]));
    checks.push_back(ErrorCountersCheck(sample.devices[index]));
  }

  const int code = Verdict(checks);
  Print(options, checks, runtime->version(), runtime->driver(), code);
  return code;
}

}  // namespace

Subcommand AddDiagCommand(CLI::App& parent) {
  auto options = std::make_shared<DiagOptions>();
  CLI::App* app = parent.add_subcommand(
      "diag", "Check the health of the devices (exit 0 healthy, 1 degraded, 2 failed)");
  app->footer(
      "Run health checks on every device and report them as a table or JSON. Active checks "
      "allocate a little device memory and use a core that no workload holds; when every core "
      "of a device is busy, the checks that need one are skipped (reported as degraded).\n"
      "  hbm_pattern          write address and bit patterns, fill with DMA, read back, compare\n"
      "  copy_bandwidth       H2D and D2H GB/s against memcpy (below --min-bandwidth-ratio: "
      "degraded)\n"
      "  compute_selftest     relu(a @ b) on 64x64 fp32 matrices, compared bit for bit with "
      "the host's result\n"
      "  collective_loopback  sum all-reduce across every free core of the checked devices, "
      "compared exactly\n"
      "  ecc                  uncorrected ECC errors: failed\n"
      "  error_counters       failed commands by class: degraded\n"
      "Exit code: 0 healthy, 1 degraded, 2 failed, 3 diag could not run, 64 bad usage.");
  app->add_flag("-j,--json", options->json, "Print one JSON document instead of a table");
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
  return {app, [options]() { return RunDiag(*options); }};
}

}  // namespace tern::tools
