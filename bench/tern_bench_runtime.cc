// tern_bench_runtime: what the runtime's hot paths cost, each figure beside a
// baseline measured in the same run on the same machine.
//
//   (a) round trip of an empty command (submit a nop, wait for its sequence)
//       beside a bare two-thread ping-pong that uses the same wake mechanism
//       as the runtime (spin briefly, then futex), written out here;
//   (b) H2D, D2H and D2D copy bandwidth, pipelined, beside memcpy between two
//       host buffers of the same size;
//   (c) device alloc + free of 256 B with 10,000 live allocations, beside
//       malloc + free with 10,000 live mallocs;
//   (d) stream-ordered alloc + free (tern_queue_alloc + tern_queue_free) of
//       256 B to 16 MiB, beside tern_buffer_alloc + tern_buffer_free;
//   (e) H2D and D2H copies from and to host memory the caller allocated and
//       registered (tern_host_register), beside the same copies with
//       tern_host_alloc memory.
//
// Tern and its baseline are measured alternately (A B A B ...) because the
// speed of a shared or virtual machine drifts over seconds; bandwidth is
// judged on the median of the rounds' ratios (each side warmed by one untimed
// copy first), latency on pooled samples. A missed target is
// reported, not an error: the program exits 1 only when something fails
// (unless --fail-on-miss).
//
// Uses the public C API only.
#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_relax.h"
#include "machine_report.h"
#include "tern/tern.h"

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// --- Options -----------------------------------------------------------------

struct Options {
  bool quick = false;         // fewer iterations and sizes (the CI smoke test)
  bool fail_on_miss = false;  // exit 2 when a target is missed
  std::string json_path;      // also write the figures as JSON here
  std::string only;  // run one section: round_trip, bandwidth, alloc, stream_ordered, host_register
};

void Usage(FILE* out) {
  std::fprintf(
      out,
      "usage: tern_bench_runtime [--quick] [--json FILE] [--fail-on-miss] [--only SECTION]\n"
      "  --quick         fewer iterations and sizes (a smoke test, not a measurement)\n"
      "  --only SECTION  run one section: round_trip, bandwidth, alloc, stream_ordered or\n"
      "                  host_register\n"
      "  --json FILE     also write every figure to FILE as JSON\n"
      "  --fail-on-miss  exit 2 when a target is missed (default: report only)\n"
      "Environment: TERN_SIM_TOPOLOGY defaults to 2x2x2G here, so that 256 MiB\n"
      "copies fit; TERN_SIM_NODE defaults to a private node, removed at exit.\n");
}

// --- Errors --------------------------------------------------------------------

// A failed tern call: the benchmark stops and reports it.
class TernFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void Check(tern_status_t status, const char* what) {
  if (status == TERN_OK) return;
  // The message is only valid until the next tern call: take it first.
  std::string message = tern_last_error_message();
  throw TernFailure(std::string(what) + " failed with " + tern_status_string(status) + "\n  " +
                    message);
}

// --- Time and statistics ---------------------------------------------------------

inline uint64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Keeps the compiler from dropping or merging work whose result is unused.
inline void Clobber() { asm volatile("" ::: "memory"); }
inline void Escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

struct Latency {
  double median_ns = 0;
  double p99_ns = 0;
  size_t samples = 0;
};

Latency Summarize(std::vector<uint64_t> samples) {
  Latency out;
  out.samples = samples.size();
  if (samples.empty()) return out;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  out.median_ns = n % 2 ? static_cast<double>(samples[n / 2])
                        : (static_cast<double>(samples[n / 2 - 1]) + samples[n / 2]) / 2.0;
  const size_t p99_index = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1;
  out.p99_ns = static_cast<double>(samples[std::min(p99_index, n - 1)]);
  return out;
}

std::string FormatSize(uint64_t bytes) {
  char text[32];
  if (bytes >= kMiB && bytes % kMiB == 0) {
    std::snprintf(text, sizeof(text), "%" PRIu64 " MiB", bytes / kMiB);
  } else if (bytes >= kKiB && bytes % kKiB == 0) {
    std::snprintf(text, sizeof(text), "%" PRIu64 " KiB", bytes / kKiB);
  } else {
    std::snprintf(text, sizeof(text), "%" PRIu64 " B", bytes);
  }
  return text;
}

// --- The bare handoff --------------------------------------------------------------
//
// The wake mechanism of the runtime's timelines (common/timeline.cc),
// reimplemented so the benchmark stays on the public API: a 64-bit value,
// waiters spin with pause instructions for 1 us, then yield the CPU in a loop
// until 50 us have passed, then sleep on a 32-bit futex word that the
// signaler bumps and wakes only when a sleeper's target is reached. The
// ping-pong of two of these is the floor under a queue's submit -> engine ->
// completion -> waiter round trip.

class BareTimeline {
 public:
  void Signal(uint64_t value) {
    value_.store(value, std::memory_order_seq_cst);
    // Either the waiter sees the new value, or we see its target and wake it.
    if (value >= sleeper_target_.load(std::memory_order_seq_cst)) {
      sleeper_target_.store(UINT64_MAX, std::memory_order_seq_cst);
      wake_word_.fetch_add(1, std::memory_order_seq_cst);
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_word_), FUTEX_WAKE_PRIVATE, INT_MAX,
              nullptr, nullptr, 0);
    }
  }

  void Wait(uint64_t target) {
    if (value_.load(std::memory_order_acquire) >= target) return;
    const uint64_t spin_start = NowNs();
    for (uint32_t i = 1;; ++i) {
      tern::CpuRelax();
      if (value_.load(std::memory_order_acquire) >= target) return;
      if (i % 16 != 0) continue;
      const uint64_t waited = NowNs() - spin_start;
      if (waited >= kYieldNs) break;
      if (waited >= kSpinNs) sched_yield();
    }
    while (true) {
      const uint32_t word = wake_word_.load(std::memory_order_seq_cst);
      uint64_t current = sleeper_target_.load(std::memory_order_seq_cst);
      while (target < current && !sleeper_target_.compare_exchange_weak(current, target)) {
      }
      if (value_.load(std::memory_order_seq_cst) >= target) return;
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_word_), FUTEX_WAIT_PRIVATE, word,
              nullptr, nullptr, 0);
      if (value_.load(std::memory_order_acquire) >= target) return;
    }
  }

 private:
  // As in common/timeline.cc.
  static constexpr uint64_t kSpinNs = 1'000;
  static constexpr uint64_t kYieldNs = 50'000;
  std::atomic<uint64_t> value_{0};
  std::atomic<uint32_t> wake_word_{0};
  std::atomic<uint64_t> sleeper_target_{UINT64_MAX};
};

// Two threads bounce a counter: the caller signals `ping`, the partner waits
// for it and signals `pong`, the caller waits for that. Runs in blocks so it
// can be interleaved with the runtime's measurement.
class BarePingPong {
 public:
  BarePingPong() : partner_([this] { Partner(); }) {}
  ~BarePingPong() {
    stop_.store(true, std::memory_order_relaxed);
    ping_.Signal(++round_);  // one more round lets the partner see stop_
    partner_.join();
  }

  // Runs `count` round trips, appending each one's time when `out` is set.
  void Run(int count, std::vector<uint64_t>* out) {
    for (int i = 0; i < count; ++i) {
      const uint64_t start = NowNs();
      const uint64_t round = ++round_;
      ping_.Signal(round);
      pong_.Wait(round);
      const uint64_t end = NowNs();
      if (out) out->push_back(end - start);
    }
  }

 private:
  void Partner() {
    for (uint64_t round = 1;; ++round) {
      ping_.Wait(round);
      if (stop_.load(std::memory_order_relaxed)) return;
      pong_.Signal(round);
    }
  }

  BareTimeline ping_;
  BareTimeline pong_;
  uint64_t round_ = 0;  // caller thread only
  std::atomic<bool> stop_{false};
  std::thread partner_;
};

// --- Results -------------------------------------------------------------------------

struct Row {
  std::string section;  // "round_trip", "bandwidth", "alloc", "stream_ordered", "host_register"
  std::string name;
  std::string text;  // the printed line
  bool has_target = false;
  bool pass = true;
  std::string json;  // the row's JSON object
};

struct Report {
  std::vector<Row> rows;
  int misses = 0;

  void Add(Row row) {
    if (row.has_target && !row.pass) ++misses;
    std::printf("%s\n", row.text.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(row));
  }
};

const char* Verdict(bool pass) { return pass ? "PASS" : "MISS"; }

std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  return text;
}

// --- The runtime under test ------------------------------------------------------------

struct Setup {
  tern_device_t device = nullptr;
  tern_core_t core = nullptr;
  tern_queue_t queue = nullptr;
  tern_event_t marks[2] = {nullptr, nullptr};  // around timed copies
};

// --- (a) Round trip of an empty command -------------------------------------------------

void BenchRoundTrip(const Setup& setup, const Options& options, Report* report) {
  const int warmup = options.quick ? 200 : 2000;
  const int iterations = options.quick ? 2000 : 20000;
  const int block = options.quick ? 500 : 1000;

  BarePingPong bare;
  auto tern_block = [&](int count, std::vector<uint64_t>* out) {
    for (int i = 0; i < count; ++i) {
      const uint64_t start = NowNs();
      uint64_t sequence = 0;
      Check(tern_queue_nop(setup.queue, &sequence), "tern_queue_nop");
      Check(tern_queue_wait_sequence(setup.queue, sequence, TERN_TIMEOUT_INFINITE),
            "tern_queue_wait_sequence");
      const uint64_t end = NowNs();
      if (out) out->push_back(end - start);
    }
  };

  tern_block(warmup, nullptr);
  bare.Run(warmup, nullptr);
  std::vector<uint64_t> tern_samples, bare_samples;
  tern_samples.reserve(iterations);
  bare_samples.reserve(iterations);
  for (int done = 0; done < iterations; done += block) {
    const int count = std::min(block, iterations - done);
    tern_block(count, &tern_samples);
    bare.Run(count, &bare_samples);
  }
  const Latency tern = Summarize(tern_samples);
  const Latency base = Summarize(bare_samples);
  const double ratio = base.median_ns > 0 ? tern.median_ns / base.median_ns : 0;
  const bool pass = ratio <= 2.0 && tern.median_ns <= 10000.0;

  Row row;
  row.section = "round_trip";
  row.name = "empty command";
  row.has_target = true;
  row.pass = pass;
  row.text = Format(
      "round trip (empty command)  median %6.2f us  p99 %6.2f us | bare handoff median %6.2f us  "
      "p99 %6.2f us | ratio %.2f (target <= 2.0, median <= 10 us) %s",
      tern.median_ns / 1e3, tern.p99_ns / 1e3, base.median_ns / 1e3, base.p99_ns / 1e3, ratio,
      Verdict(pass));
  row.json = Format(
      "{\"name\": \"empty command\", \"samples\": %zu, \"median_ns\": %.0f, \"p99_ns\": %.0f, "
      "\"baseline\": \"bare futex handoff\", \"baseline_median_ns\": %.0f, \"baseline_p99_ns\": "
      "%.0f, \"ratio\": %.3f, \"target\": \"ratio <= 2.0 and median <= 10000 ns\", \"pass\": %s}",
      tern.samples, tern.median_ns, tern.p99_ns, base.median_ns, base.p99_ns, ratio,
      pass ? "true" : "false");
  report->Add(std::move(row));

  // Informational: what one empty command costs when commands are pipelined
  // (submission plus execution, no waiting in between).
  const int pipelined = options.quick ? 2000 : 20000;
  double best_ns = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const uint64_t start = NowNs();
    for (int i = 0; i < pipelined; ++i) {
      Check(tern_queue_nop(setup.queue, nullptr), "tern_queue_nop");
    }
    Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
    best_ns = std::min(best_ns, static_cast<double>(NowNs() - start) / pipelined);
  }
  Row info;
  info.section = "round_trip";
  info.name = "pipelined empty commands";
  info.text = Format(
      "pipelined empty commands    %6.0f ns per command (%d nops, one synchronize; "
      "best of 3; no target)",
      best_ns, pipelined);
  info.json =
      Format("{\"name\": \"pipelined empty commands\", \"commands\": %d, \"ns_per_command\": %.1f}",
             pipelined, best_ns);
  report->Add(std::move(info));
}

// --- (b) Copy bandwidth ----------------------------------------------------------------------

enum class Direction { kH2D, kD2H, kD2D };

const char* DirectionName(Direction d) {
  switch (d) {
    case Direction::kH2D:
      return "H2D";
    case Direction::kD2H:
      return "D2H";
    case Direction::kD2D:
      return "D2D";
  }
  return "?";
}

struct CopyBuffers {
  uint64_t capacity = 0;
  tern_buffer_t device_a = nullptr;
  tern_buffer_t device_b = nullptr;
  tern_buffer_t spacer = nullptr;  // between device_a and device_b (see AllocateCopyBuffers)
  void* pinned_a = nullptr;        // tern_host_alloc
  void* pinned_b = nullptr;
  void* plain_block = nullptr;  // holds plain_a and plain_b
  void* plain_a = nullptr;      // malloc'ed and touched: the memcpy baseline
  void* plain_b = nullptr;
};

// Pinned memory may be limited (RLIMIT_MEMLOCK without CAP_IPC_LOCK): shrink
// the largest size by 4 (the size steps) until two pinned buffers fit, and
// say so.
uint64_t AllocatePinned(uint64_t wanted, CopyBuffers* buffers) {
  uint64_t size = wanted;
  while (true) {
    tern_status_t a = tern_host_alloc(size, &buffers->pinned_a);
    tern_status_t b = a == TERN_OK ? tern_host_alloc(size, &buffers->pinned_b) : a;
    if (a == TERN_OK && b == TERN_OK) break;
    if (b != TERN_ERROR_HOST_OUT_OF_MEMORY || size <= kMiB) {
      Check(b, "tern_host_alloc");
    }
    if (buffers->pinned_a != nullptr) Check(tern_host_free(buffers->pinned_a), "tern_host_free");
    buffers->pinned_a = nullptr;
    size /= 4;
  }
  if (size < wanted) {
    std::printf(
        "note: could not pin 2 x %s of host memory (raise `ulimit -l`); copies stop at %s\n",
        FormatSize(wanted).c_str(), FormatSize(size).c_str());
  }
  return size;
}

void AllocateCopyBuffers(const Setup& setup, uint64_t wanted, CopyBuffers* buffers) {
  buffers->capacity = AllocatePinned(wanted, buffers);
  tern_buffer_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.size = buffers->capacity;
  params.category = TERN_MEMORY_TENSORS;
  Check(tern_buffer_alloc(setup.device, &params, &buffers->device_a), "tern_buffer_alloc");
  // Two buffers of 2^n bytes placed back to back are exactly 2^n bytes apart,
  // and copies between them run 10-25% slower at 1-16 MiB than one page
  // further apart (measured with memmove alone; every source page and its
  // destination share a TLB set). Both sides get the same layout: a 4 KiB
  // spacer between the device buffers, and the baseline's two buffers
  // capacity + 4 KiB apart in one host block.
  tern_buffer_params_t spacer = params;
  spacer.size = 4 * kKiB;
  Check(tern_buffer_alloc(setup.device, &spacer, &buffers->spacer), "tern_buffer_alloc");
  Check(tern_buffer_alloc(setup.device, &params, &buffers->device_b), "tern_buffer_alloc");
  buffers->plain_block = std::aligned_alloc(4096, 2 * buffers->capacity + 4 * kKiB);
  buffers->plain_a = buffers->plain_block;
  buffers->plain_b = buffers->plain_block == nullptr
                         ? nullptr
                         : static_cast<char*>(buffers->plain_block) + buffers->capacity + 4 * kKiB;
  if (buffers->plain_block == nullptr) {
    throw TernFailure("aligned_alloc of the memcpy baseline buffers failed");
  }
  // Touch every page of every buffer, device memory included (the simulated
  // device commits its memory on first write): page faults are not copies.
  std::memset(buffers->pinned_a, 0x5a, buffers->capacity);
  std::memset(buffers->pinned_b, 0x00, buffers->capacity);
  std::memset(buffers->plain_a, 0x5a, buffers->capacity);
  std::memset(buffers->plain_b, 0x00, buffers->capacity);
  Check(tern_queue_copy_h2d(setup.queue, buffers->device_a, 0, buffers->pinned_a, buffers->capacity,
                            nullptr),
        "tern_queue_copy_h2d");
  Check(tern_queue_copy_h2d(setup.queue, buffers->device_b, 0, buffers->pinned_b, buffers->capacity,
                            nullptr),
        "tern_queue_copy_h2d");
  Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
}

void FreeCopyBuffers(CopyBuffers* buffers) {
  Check(tern_buffer_free(buffers->device_a), "tern_buffer_free");
  Check(tern_buffer_free(buffers->device_b), "tern_buffer_free");
  Check(tern_buffer_free(buffers->spacer), "tern_buffer_free");
  Check(tern_host_free(buffers->pinned_a), "tern_host_free");
  Check(tern_host_free(buffers->pinned_b), "tern_host_free");
  std::free(buffers->plain_block);
}

struct CopyTime {
  double wall_s = 0;    // first submission to synchronize returning: what a program sees
  double device_s = 0;  // between events around the copies: the engine's own time
};

void EnqueueCopy(const Setup& setup, const CopyBuffers& b, Direction d, uint64_t size) {
  switch (d) {
    case Direction::kH2D:
      Check(tern_queue_copy_h2d(setup.queue, b.device_a, 0, b.pinned_a, size, nullptr),
            "tern_queue_copy_h2d");
      break;
    case Direction::kD2H:
      Check(tern_queue_copy_d2h(setup.queue, b.pinned_b, b.device_a, 0, size, nullptr),
            "tern_queue_copy_d2h");
      break;
    case Direction::kD2D:
      Check(tern_queue_copy_d2d(setup.queue, b.device_b, 0, b.device_a, 0, size, nullptr),
            "tern_queue_copy_d2d");
      break;
  }
}

// One untimed copy of the same bytes just before a timed batch, on both sides:
// each side then starts with its own buffers as warm as the other's. Without
// it, a side's first copy finds what the previous measurement left in the
// shared L3 (32 MiB here), and at 4 MiB the baseline, which ran right after
// the caller-thread memcpy of the same host buffers, started warm while tern
// started cold: 0.7-0.9x that was the order, not the engine.
void WarmTernCopy(const Setup& setup, const CopyBuffers& b, Direction d, uint64_t size) {
  EnqueueCopy(setup, b, d, size);
  Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
}

// Submits `count` copies of `size` bytes between two events and waits once.
CopyTime TernCopies(const Setup& setup, const CopyBuffers& b, Direction d, uint64_t size,
                    uint64_t count) {
  WarmTernCopy(setup, b, d, size);
  const uint64_t start = NowNs();
  Check(tern_queue_record_event(setup.queue, setup.marks[0], nullptr), "tern_queue_record_event");
  for (uint64_t i = 0; i < count; ++i) EnqueueCopy(setup, b, d, size);
  Check(tern_queue_record_event(setup.queue, setup.marks[1], nullptr), "tern_queue_record_event");
  Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  CopyTime time;
  time.wall_s = static_cast<double>(NowNs() - start) / 1e9;
  uint64_t device_ns = 0;
  Check(tern_event_elapsed_ns(setup.marks[0], setup.marks[1], &device_ns), "tern_event_elapsed_ns");
  time.device_s = static_cast<double>(device_ns) / 1e9;
  return time;
}

double MemcpyCopies(const CopyBuffers& b, uint64_t size, uint64_t count) {
  const uint64_t start = NowNs();
  for (uint64_t i = 0; i < count; ++i) {
    std::memcpy(b.plain_b, b.plain_a, size);
    Clobber();
  }
  return static_cast<double>(NowNs() - start) / 1e9;
}

// The same memcpy loop run by the queue's own thread (a host callback), timed
// inside the callback: what the engine's CPU does with plain memcpy. The
// VM's two CPUs drift between a fast and a slow state independently, so a
// baseline on the calling thread's CPU can be faster or slower than the
// engine's CPU for minutes at a time.
struct EngineMemcpyJob {
  const CopyBuffers* buffers;
  uint64_t size;
  uint64_t count;
  double seconds = 0;
};

void RunEngineMemcpy(void* user_data, tern_status_t status) {
  auto* job = static_cast<EngineMemcpyJob*>(user_data);
  if (status != TERN_OK) return;
  MemcpyCopies(*job->buffers, job->size, 1);  // warm-up, untimed (see WarmTernCopy)
  job->seconds = MemcpyCopies(*job->buffers, job->size, job->count);
}

double EngineThreadMemcpyCopies(const Setup& setup, const CopyBuffers& b, uint64_t size,
                                uint64_t count) {
  EngineMemcpyJob job{&b, size, count};
  Check(tern_queue_host_callback(setup.queue, RunEngineMemcpy, &job, nullptr),
        "tern_queue_host_callback");
  Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  return job.seconds;
}

void BenchBandwidth(const Setup& setup, const Options& options, Report* report) {
  const uint64_t wanted_max = options.quick ? 1 * kMiB : 256 * kMiB;
  CopyBuffers buffers;
  AllocateCopyBuffers(setup, wanted_max, &buffers);

  std::vector<uint64_t> sizes;
  for (uint64_t size = 4 * kKiB; size <= buffers.capacity; size *= options.quick ? 16 : 4) {
    sizes.push_back(size);
  }
  // Each repetition moves at least this much, so small copies are timed over
  // many commands; large ones still run at least twice (pipelined).
  const uint64_t bytes_per_rep = options.quick ? 4 * kMiB : 64 * kMiB;
  const int reps = options.quick ? 3 : 21;

  std::printf(
      "\ncopy bandwidth (GB/s = 1e9 B/s), %d rounds of tern and memcpy, the order alternating:\n"
      "  every side first makes one untimed copy of its own, so that each starts as warm;\n"
      "  tern: K copies submitted, then one synchronize, timed by the host (best round);\n"
      "  engine: the same copies timed by events on the device (excludes submission and wake-up);\n"
      "  memcpy: K memcpy between two touched host buffers, run by the queue's thread in a host\n"
      "  callback (the engine's CPU) and timed there (best round); caller: the same on the\n"
      "  calling thread, for reference (the VM's CPUs drift between states independently);\n"
      "  ratio: the median of the rounds' tern/memcpy ratios (the target; a disturbance slows\n"
      "  both sides of a round), then the ratio of the bests\n",
      reps);
  for (Direction d : {Direction::kH2D, Direction::kD2H, Direction::kD2D}) {
    for (uint64_t size : sizes) {
      const uint64_t count = std::max<uint64_t>(2, bytes_per_rep / size);
      const double bytes = static_cast<double>(size) * static_cast<double>(count);
      // One untimed pass of each side, then A B A B ...
      TernCopies(setup, buffers, d, size, std::min<uint64_t>(count, 4));
      EngineThreadMemcpyCopies(setup, buffers, size, std::min<uint64_t>(count, 4));
      MemcpyCopies(buffers, size, std::min<uint64_t>(count, 4));
      double tern_best = 0, device_best = 0, base_best = 0, caller_best = 0;
      std::vector<double> tern_all, base_all, round_ratios;
      for (int rep = 0; rep < reps; ++rep) {
        // Alternate which side goes first, so neither always finds the
        // caches as the other left them.
        double base_s = 0;
        if (rep % 2 == 1) base_s = EngineThreadMemcpyCopies(setup, buffers, size, count);
        const CopyTime time = TernCopies(setup, buffers, d, size, count);
        if (rep % 2 == 0) base_s = EngineThreadMemcpyCopies(setup, buffers, size, count);
        MemcpyCopies(buffers, size, 1);  // warm-up, as on the other sides
        caller_best = std::max(caller_best, bytes / MemcpyCopies(buffers, size, count) / 1e9);
        const double tern_gbs = bytes / time.wall_s / 1e9;
        const double device_gbs = time.device_s > 0 ? bytes / time.device_s / 1e9 : 0;
        const double base_gbs = bytes / base_s / 1e9;
        tern_all.push_back(tern_gbs);
        base_all.push_back(base_gbs);
        round_ratios.push_back(tern_gbs / base_gbs);
        tern_best = std::max(tern_best, tern_gbs);
        device_best = std::max(device_best, device_gbs);
        base_best = std::max(base_best, base_gbs);
      }
      std::sort(tern_all.begin(), tern_all.end());
      std::sort(base_all.begin(), base_all.end());
      std::sort(round_ratios.begin(), round_ratios.end());
      const double best_ratio = base_best > 0 ? tern_best / base_best : 0;
      const double ratio = round_ratios[round_ratios.size() / 2];
      const bool has_target = size >= kMiB;
      const bool pass = !has_target || ratio >= 0.9;

      Row row;
      row.section = "bandwidth";
      row.name = std::string(DirectionName(d)) + " " + FormatSize(size);
      row.has_target = has_target;
      row.pass = pass;
      row.text = Format("%s %-8s x%-6" PRIu64
                        " tern %6.2f GB/s (engine %6.2f) | memcpy %6.2f GB/s (caller %6.2f) | "
                        "ratio %.2f (bests %.2f) %s",
                        DirectionName(d), FormatSize(size).c_str(), count, tern_best, device_best,
                        base_best, caller_best, ratio, best_ratio,
                        has_target ? (pass ? "(target >= 0.90) PASS" : "(target >= 0.90) MISS")
                                   : "(no target below 1 MiB)");
      row.json = Format(
          "{\"direction\": \"%s\", \"size\": %" PRIu64 ", \"copies\": %" PRIu64
          ", \"reps\": %d, \"gbps_best\": %.3f, \"gbps_median\": %.3f, \"engine_gbps_best\": %.3f, "
          "\"baseline\": \"memcpy on the queue's thread\", \"caller_memcpy_gbps_best\": %.3f, "
          "\"baseline_gbps_best\": %.3f, \"baseline_gbps_median\": %.3f, \"ratio\": %.3f, "
          "\"ratio_of_bests\": %.3f, "
          "\"target\": %s, \"pass\": %s}",
          DirectionName(d), size, count, reps, tern_best, tern_all[tern_all.size() / 2],
          device_best, caller_best, base_best, base_all[base_all.size() / 2], ratio, best_ratio,
          has_target ? "\">= 0.9\"" : "null", has_target ? (pass ? "true" : "false") : "null");
      report->Add(std::move(row));
    }
  }
  FreeCopyBuffers(&buffers);
}

// --- (e) Copies with registered host memory ---------------------------------------------------
//
// A data loader's buffers are its own (malloc, numpy, a framework's pinned
// pool); tern_host_register lets the DMA engine use them as it uses
// tern_host_alloc memory. Both sides copy the same sizes to and from the same
// device buffer, alternating, each warmed by one untimed copy. Each round
// copies another window of the buffers (the same window on both sides and on
// the device): where source and destination together are the L3's size,
// which physical pages a window has decides how they share the cache's sets,
// and one fixed window measured its pages, not the kind of memory.

double HostCopies(const Setup& setup, tern_buffer_t device, uint8_t* host, bool to_device,
                  uint64_t size, uint64_t count, uint64_t offset) {
  auto enqueue = [&] {
    if (to_device) {
      Check(tern_queue_copy_h2d(setup.queue, device, offset, host + offset, size, nullptr),
            "tern_queue_copy_h2d");
    } else {
      Check(tern_queue_copy_d2h(setup.queue, host + offset, device, offset, size, nullptr),
            "tern_queue_copy_d2h");
    }
  };
  enqueue();
  Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  const uint64_t start = NowNs();
  for (uint64_t i = 0; i < count; ++i) enqueue();
  Check(tern_queue_synchronize(setup.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  return static_cast<double>(NowNs() - start) / 1e9;
}

void BenchHostRegister(const Setup& setup, const Options& options, Report* report) {
  const uint64_t capacity = options.quick ? 1 * kMiB : 64 * kMiB;
  // 21 rounds of at least 128 MiB each: at 16 MiB, where a copy's source and
  // destination fill a 32 MiB L3, rounds of 64 MiB (four copies) scattered
  // so that 15 of them gave a median ratio of 0.85-0.90 between two kinds of
  // the same private memory whose best rounds agreed within 4%.
  const int reps = options.quick ? 3 : 21;
  void* pinned = nullptr;
  Check(tern_host_alloc(capacity, &pinned), "tern_host_alloc");
  void* registered = std::aligned_alloc(4096, capacity);
  if (registered == nullptr) throw TernFailure("aligned_alloc of the registered buffer failed");
  std::memset(pinned, 0x5a, capacity);
  std::memset(registered, 0x5a, capacity);
  Check(tern_host_register(registered, capacity), "tern_host_register");
  auto* registered_bytes = static_cast<uint8_t*>(registered);
  auto* pinned_bytes = static_cast<uint8_t*>(pinned);
  tern_buffer_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.size = capacity;
  params.category = TERN_MEMORY_TENSORS;
  tern_buffer_t device = nullptr;
  Check(tern_buffer_alloc(setup.device, &params, &device), "tern_buffer_alloc");
  HostCopies(setup, device, pinned_bytes, true, capacity, 1, 0);  // commits the device pages

  std::printf(
      "\ncopies with registered host memory (tern_host_register on aligned_alloc memory) vs "
      "tern_host_alloc memory,\n  %d rounds alternating; ratio: median of the rounds' "
      "registered/pinned bandwidth ratios\n",
      reps);
  for (bool to_device : {true, false}) {
    for (uint64_t size = 256 * kKiB; size <= capacity; size *= 4) {
      const uint64_t count = std::max<uint64_t>(2, (options.quick ? 4 : 128) * kMiB / size);
      const double bytes = static_cast<double>(size) * static_cast<double>(count);
      std::vector<double> ratios;
      double registered_best = 0, pinned_best = 0;
      const uint64_t windows = capacity / size;
      for (int rep = 0; rep < reps; ++rep) {
        const uint64_t offset = (static_cast<uint64_t>(rep) % windows) * size;
        double registered_s = 0, pinned_s = 0;
        if (rep % 2 == 0)
          registered_s =
              HostCopies(setup, device, registered_bytes, to_device, size, count, offset);
        pinned_s = HostCopies(setup, device, pinned_bytes, to_device, size, count, offset);
        if (rep % 2 == 1)
          registered_s =
              HostCopies(setup, device, registered_bytes, to_device, size, count, offset);
        ratios.push_back(pinned_s / registered_s);
        registered_best = std::max(registered_best, bytes / registered_s / 1e9);
        pinned_best = std::max(pinned_best, bytes / pinned_s / 1e9);
      }
      std::sort(ratios.begin(), ratios.end());
      const double ratio = ratios[ratios.size() / 2];
      const bool has_target = size >= kMiB;
      const bool pass = !has_target || ratio >= 0.9;
      const char* direction = to_device ? "H2D" : "D2H";
      Row row;
      row.section = "host_register";
      row.name = std::string(direction) + " " + FormatSize(size);
      row.has_target = has_target;
      row.pass = pass;
      row.text =
          Format("%s %-8s x%-5" PRIu64
                 " registered %6.2f GB/s | tern_host_alloc %6.2f GB/s (bests) | "
                 "ratio %.2f %s",
                 direction, FormatSize(size).c_str(), count, registered_best, pinned_best, ratio,
                 has_target ? (pass ? "(target >= 0.90) PASS" : "(target >= 0.90) MISS")
                            : "(no target below 1 MiB)");
      row.json = Format("{\"direction\": \"%s\", \"size\": %" PRIu64 ", \"copies\": %" PRIu64
                        ", \"reps\": %d, \"registered_gbps_best\": %.3f, "
                        "\"baseline\": \"tern_host_alloc memory\", \"baseline_gbps_best\": %.3f, "
                        "\"ratio\": %.3f, \"target\": %s, \"pass\": %s}",
                        direction, size, count, reps, registered_best, pinned_best, ratio,
                        has_target ? "\">= 0.9\"" : "null",
                        has_target ? (pass ? "true" : "false") : "null");
      report->Add(std::move(row));
    }
  }
  Check(tern_buffer_free(device), "tern_buffer_free");
  Check(tern_host_unregister(registered), "tern_host_unregister");
  std::free(registered);
  Check(tern_host_free(pinned), "tern_host_free");
}

// --- (c) Allocation latency -----------------------------------------------------------------

void BenchAlloc(const Setup& setup, const Options& options, Report* report) {
  const int live_count = options.quick ? 1000 : 10000;
  const int iterations = options.quick ? 2000 : 20000;
  const int block = options.quick ? 500 : 1000;
  constexpr uint64_t kProbeSize = 256;

  // Live allocations of log-uniform random sizes, 64 B .. 64 KiB, the same
  // sizes for both sides (fixed seed: runs are comparable).
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> log_size(std::log(64.0), std::log(65536.0));
  std::vector<uint64_t> sizes(live_count);
  for (auto& size : sizes) size = static_cast<uint64_t>(std::exp(log_size(rng)));

  tern_buffer_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.category = TERN_MEMORY_TENSORS;
  std::vector<tern_buffer_t> live_buffers(live_count, nullptr);
  std::vector<void*> live_mallocs(live_count, nullptr);
  for (int i = 0; i < live_count; ++i) {
    params.size = sizes[i];
    Check(tern_buffer_alloc(setup.device, &params, &live_buffers[i]), "tern_buffer_alloc");
    live_mallocs[i] = std::malloc(sizes[i]);
    if (live_mallocs[i] == nullptr) throw TernFailure("malloc failed");
    Escape(live_mallocs[i]);
  }

  params.size = kProbeSize;
  auto tern_block = [&](int count, std::vector<uint64_t>* out) {
    for (int i = 0; i < count; ++i) {
      const uint64_t start = NowNs();
      tern_buffer_t buffer = nullptr;
      Check(tern_buffer_alloc(setup.device, &params, &buffer), "tern_buffer_alloc");
      Check(tern_buffer_free(buffer), "tern_buffer_free");
      const uint64_t end = NowNs();
      if (out) out->push_back(end - start);
    }
  };
  auto malloc_block = [&](int count, std::vector<uint64_t>* out) {
    for (int i = 0; i < count; ++i) {
      const uint64_t start = NowNs();
      void* p = std::malloc(kProbeSize);
      Escape(p);  // or the compiler may drop the pair
      std::free(p);
      const uint64_t end = NowNs();
      if (out) out->push_back(end - start);
    }
  };

  tern_block(block, nullptr);
  malloc_block(block, nullptr);
  std::vector<uint64_t> tern_samples, base_samples;
  for (int done = 0; done < iterations; done += block) {
    const int count = std::min(block, iterations - done);
    tern_block(count, &tern_samples);
    malloc_block(count, &base_samples);
  }
  const Latency tern = Summarize(tern_samples);
  const Latency base = Summarize(base_samples);
  const bool pass = tern.median_ns <= 1000.0;

  Row row;
  row.section = "alloc";
  row.name = "alloc+free 256 B";
  row.has_target = true;
  row.pass = pass;
  row.text = Format(
      "alloc+free 256 B, %5d live  median %6.3f us  p99 %6.3f us | malloc+free median %6.3f us  "
      "p99 %6.3f us | ratio %.1f (target median <= 1 us) %s",
      live_count, tern.median_ns / 1e3, tern.p99_ns / 1e3, base.median_ns / 1e3, base.p99_ns / 1e3,
      base.median_ns > 0 ? tern.median_ns / base.median_ns : 0, Verdict(pass));
  row.json = Format(
      "{\"name\": \"alloc+free 256 B\", \"live_allocations\": %d, \"samples\": %zu, \"median_ns\": "
      "%.0f, \"p99_ns\": %.0f, \"baseline\": \"malloc+free\", \"baseline_median_ns\": %.0f, "
      "\"baseline_p99_ns\": %.0f, \"target\": \"median <= 1000 ns\", \"pass\": %s}",
      live_count, tern.samples, tern.median_ns, tern.p99_ns, base.median_ns, base.p99_ns,
      pass ? "true" : "false");
  report->Add(std::move(row));

  for (int i = 0; i < live_count; ++i) {
    Check(tern_buffer_free(live_buffers[i]), "tern_buffer_free");
    std::free(live_mallocs[i]);
  }
}

// --- (d) Stream-ordered allocation ----------------------------------------------------------
//
// tern_queue_alloc + tern_queue_free on an idle queue, beside the synchronous
// tern_buffer_alloc + tern_buffer_free of the same size, for a few sizes:
// from a pool that keeps its freed blocks (release threshold UINT64_MAX, the
// setting for a training loop) and from the device's default pool
// (threshold 0: a block freed on an idle queue goes back to the device at
// once). The three sides run in alternating blocks, latency on pooled
// samples.

void BenchStreamOrdered(const Setup& setup, const Options& options, Report* report) {
  const int iterations = options.quick ? 2000 : 20000;
  const int block = options.quick ? 500 : 1000;
  const uint64_t sizes[] = {256, 64 * kKiB, kMiB, 16 * kMiB};

  tern_memory_pool_params_t pool_params;
  std::memset(&pool_params, 0, sizeof(pool_params));
  pool_params.struct_size = sizeof(pool_params);
  pool_params.release_threshold = UINT64_MAX;
  pool_params.category = TERN_MEMORY_TENSORS;
  tern_memory_pool_t cached_pool = nullptr;
  Check(tern_memory_pool_create(setup.device, &pool_params, &cached_pool),
        "tern_memory_pool_create");

  for (uint64_t size : sizes) {
    tern_buffer_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.struct_size = sizeof(params);
    params.category = TERN_MEMORY_TENSORS;
    params.size = size;
    auto sync_block = [&](int count, std::vector<uint64_t>* out) {
      for (int i = 0; i < count; ++i) {
        const uint64_t start = NowNs();
        tern_buffer_t buffer = nullptr;
        Check(tern_buffer_alloc(setup.device, &params, &buffer), "tern_buffer_alloc");
        Check(tern_buffer_free(buffer), "tern_buffer_free");
        const uint64_t end = NowNs();
        if (out) out->push_back(end - start);
      }
    };
    auto queue_block = [&](tern_memory_pool_t pool, int count, std::vector<uint64_t>* out) {
      for (int i = 0; i < count; ++i) {
        const uint64_t start = NowNs();
        tern_buffer_t buffer = nullptr;
        Check(tern_queue_alloc(setup.queue, size, pool, &buffer), "tern_queue_alloc");
        Check(tern_queue_free(setup.queue, buffer), "tern_queue_free");
        const uint64_t end = NowNs();
        if (out) out->push_back(end - start);
      }
    };

    sync_block(block, nullptr);
    queue_block(cached_pool, block, nullptr);
    queue_block(nullptr, block, nullptr);
    std::vector<uint64_t> sync_samples, cached_samples, default_samples;
    for (int done = 0, round = 0; done < iterations; done += block, ++round) {
      const int count = std::min(block, iterations - done);
      // Rotate which side goes first.
      for (int k = 0; k < 3; ++k) {
        switch ((round + k) % 3) {
          case 0:
            sync_block(count, &sync_samples);
            break;
          case 1:
            queue_block(cached_pool, count, &cached_samples);
            break;
          default:
            queue_block(nullptr, count, &default_samples);
            break;
        }
      }
    }
    const Latency sync = Summarize(sync_samples);
    const Latency cached = Summarize(cached_samples);
    const Latency by_default = Summarize(default_samples);
    const double cached_ratio = sync.median_ns > 0 ? cached.median_ns / sync.median_ns : 0;
    const double default_ratio = sync.median_ns > 0 ? by_default.median_ns / sync.median_ns : 0;
    const bool pass = cached_ratio <= 2.0 && default_ratio <= 2.0;

    Row row;
    row.section = "stream_ordered";
    row.name = "queue alloc+free " + FormatSize(size);
    row.has_target = true;
    row.pass = pass;
    row.text = Format(
        "queue alloc+free %-7s pool median %6.3f us p99 %6.3f | default pool %6.3f p99 %6.3f | "
        "buffer alloc+free %6.3f p99 %6.3f | ratios %.2f %.2f (target <= 2.0) %s",
        FormatSize(size).c_str(), cached.median_ns / 1e3, cached.p99_ns / 1e3,
        by_default.median_ns / 1e3, by_default.p99_ns / 1e3, sync.median_ns / 1e3,
        sync.p99_ns / 1e3, cached_ratio, default_ratio, Verdict(pass));
    row.json =
        Format("{\"name\": \"queue alloc+free\", \"size\": %" PRIu64
               ", \"samples\": %zu, \"pool_median_ns\": %.0f, \"pool_p99_ns\": %.0f, "
               "\"default_pool_median_ns\": %.0f, \"default_pool_p99_ns\": %.0f, \"baseline\": "
               "\"tern_buffer_alloc+tern_buffer_free\", \"baseline_median_ns\": %.0f, "
               "\"baseline_p99_ns\": %.0f, \"pool_ratio\": %.3f, \"default_pool_ratio\": %.3f, "
               "\"target\": \"ratios <= 2.0\", \"pass\": %s}",
               size, cached.samples, cached.median_ns, cached.p99_ns, by_default.median_ns,
               by_default.p99_ns, sync.median_ns, sync.p99_ns, cached_ratio, default_ratio,
               pass ? "true" : "false");
    report->Add(std::move(row));
  }
  tern_memory_pool_stats_t stats;
  std::memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  Check(tern_memory_pool_get_stats(cached_pool, &stats), "tern_memory_pool_get_stats");
  std::printf("  (pool: %" PRIu64 " allocations, %" PRIu64 " reused on the same queue, %" PRIu64
              " blocks taken from the device)\n",
              stats.allocations, stats.reused_same_queue, stats.device_allocations);
  Check(tern_memory_pool_destroy(cached_pool), "tern_memory_pool_destroy");
}

// --- Driver ------------------------------------------------------------------------------------

// CPU time of the whole machine and of this process, to tell how much of
// the machine other programs used while the benchmark ran.
struct CpuSample {
  double machine_busy_s = 0;   // all CPUs, not idle
  double machine_total_s = 0;  // all CPUs
  double self_s = 0;           // this process, user + system
};

CpuSample SampleCpu() {
  CpuSample sample;
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    unsigned long long v[8] = {};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                    &v[4], &v[5], &v[6], &v[7]) == 8) {
      const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
      unsigned long long total = 0;
      for (unsigned long long x : v) total += x;
      sample.machine_total_s = static_cast<double>(total) / tick;
      sample.machine_busy_s = static_cast<double>(total - v[3] - v[4]) / tick;  // - idle, iowait
    }
    std::fclose(f);
  }
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    sample.self_s = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                    static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  }
  return sample;
}

// Share of the machine's CPU time that other programs used between two
// samples, 0..1.
double OthersShare(const CpuSample& before, const CpuSample& after) {
  const double total = after.machine_total_s - before.machine_total_s;
  if (total <= 0) return 0;
  const double others =
      (after.machine_busy_s - before.machine_busy_s) - (after.self_s - before.self_s);
  return std::clamp(others / total, 0.0, 1.0);
}

std::string LoadAverage() {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) != 3) return "unknown";
  return Format("%.2f %.2f %.2f", load[0], load[1], load[2]);
}

void WriteJson(const std::string& path, const Options& options, const Report& report,
               const std::string& header_json) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    throw TernFailure("cannot open " + path + " for writing: " + std::strerror(errno));
  }
  std::fprintf(f, "{\n  %s,\n  \"quick\": %s,\n  \"misses\": %d", header_json.c_str(),
               options.quick ? "true" : "false", report.misses);
  for (const char* section :
       {"round_trip", "bandwidth", "alloc", "stream_ordered", "host_register"}) {
    std::fprintf(f, ",\n  \"%s\": [", section);
    bool first = true;
    for (const Row& row : report.rows) {
      if (row.section != section) continue;
      std::fprintf(f, "%s\n    %s", first ? "" : ",", row.json.c_str());
      first = false;
    }
    std::fprintf(f, "\n  ]");
  }
  std::fprintf(f, "\n}\n");
  if (std::fclose(f) != 0) throw TernFailure("writing " + path + " failed");
}

int Run(const Options& options) {
  tern_version_t version;
  std::memset(&version, 0, sizeof(version));
  version.struct_size = sizeof(version);
  Check(tern_get_version(&version), "tern_get_version");
  tern::bench::PrintMachine(stdout, /*pin_copy_strategy=*/true);
  Check(tern_init(nullptr), "tern_init");

  Setup setup;
  Check(tern_device_get(0, &setup.device), "tern_device_get(0)");
  Check(tern_core_open(setup.device, 0, &setup.core), "tern_core_open(device 0, core 0)");
  tern_queue_params_t queue_params;
  std::memset(&queue_params, 0, sizeof(queue_params));
  queue_params.struct_size = sizeof(queue_params);
  queue_params.name = "bench";
  Check(tern_queue_create(setup.core, &queue_params, &setup.queue), "tern_queue_create");
  for (tern_event_t& mark : setup.marks) Check(tern_event_create(&mark), "tern_event_create");

  const std::string load_before = LoadAverage();
  const CpuSample cpu_before = SampleCpu();
  std::printf(
      "tern_bench_runtime%s: tern %u.%u.%u (%s), driver %s, topology %s, %u CPUs, "
      "load average %s\n\n",
      options.quick ? " --quick (smoke test: figures are not meaningful)" : "", version.major,
      version.minor, version.patch, version.build ? version.build : "?", tern_driver_name(),
      std::getenv("TERN_SIM_TOPOLOGY"), std::thread::hardware_concurrency(), load_before.c_str());

  Report report;
  auto selected = [&](const char* section) {
    return options.only.empty() || options.only == section;
  };
  if (selected("round_trip")) BenchRoundTrip(setup, options, &report);
  if (selected("bandwidth")) BenchBandwidth(setup, options, &report);
  if (selected("alloc")) {
    std::printf("\n");
    BenchAlloc(setup, options, &report);
  }
  if (selected("stream_ordered")) {
    std::printf("\n");
    BenchStreamOrdered(setup, options, &report);
  }
  if (selected("host_register")) BenchHostRegister(setup, options, &report);

  const std::string load_after = LoadAverage();
  const double others = OthersShare(cpu_before, SampleCpu());
  std::printf(
      "\n%d target%s missed; load average now %s; other programs used %.0f%% of the "
      "CPUs meanwhile%s\n",
      report.misses, report.misses == 1 ? "" : "s", load_after.c_str(), others * 100,
      others > 0.10 ? " (figures are disturbed: rerun on a quiet machine)" : "");

  for (tern_event_t mark : setup.marks) Check(tern_event_destroy(mark), "tern_event_destroy");
  Check(tern_queue_destroy(setup.queue), "tern_queue_destroy");
  Check(tern_core_close(setup.core), "tern_core_close");
  Check(tern_shutdown(), "tern_shutdown");

  if (!options.json_path.empty()) {
    const std::string header = Format(
        "\"version\": \"%u.%u.%u\", \"build\": \"%s\", \"cpus\": %u, \"load_before\": \"%s\", "
        "\"load_after\": \"%s\", \"others_cpu_share\": %.3f",
        version.major, version.minor, version.patch, version.build ? version.build : "",
        std::thread::hardware_concurrency(), load_before.c_str(), load_after.c_str(), others);
    WriteJson(options.json_path, options, report, header);
  }
  return report.misses > 0 && options.fail_on_miss ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--fail-on-miss") {
      options.fail_on_miss = true;
    } else if (arg == "--json" && i + 1 < argc) {
      options.json_path = argv[++i];
    } else if (arg == "--only" && i + 1 < argc) {
      options.only = argv[++i];
      if (options.only != "round_trip" && options.only != "bandwidth" && options.only != "alloc" &&
          options.only != "stream_ordered" && options.only != "host_register") {
        std::fprintf(stderr,
                     "tern_bench_runtime: --only takes round_trip, bandwidth, alloc, "
                     "stream_ordered or host_register\n");
        return 1;
      }
    } else if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "tern_bench_runtime: unknown or incomplete argument '%s'\n", argv[i]);
      Usage(stderr);
      return 1;
    }
  }

  // Devices large enough for two 256 MiB buffers, unless the caller chose.
  // The simulated memory is committed lazily, so a large topology is free.
  setenv("TERN_SIM_TOPOLOGY", "2x2x2G", /*overwrite=*/0);
  // A private node, so the benchmark neither meets nor disturbs other tern
  // programs (a shared node's topology may not match ours either).
  std::string private_node;
  const char* node = std::getenv("TERN_SIM_NODE");
  if (node == nullptr || *node == '\0') {
    private_node = "bench-" + std::to_string(getpid());
    setenv("TERN_SIM_NODE", private_node.c_str(), 1);
  }

  int exit_code;
  try {
    exit_code = Run(options);
  } catch (const TernFailure& failure) {
    std::fprintf(stderr, "tern_bench_runtime: %s\n", failure.what());
    tern_shutdown();  // releases whatever is still held; may fail if never initialized
    exit_code = 1;
  }
  // The simulated node's shared state lives in this file (see
  // driver_shim/sim/node_registry.h); a private node dies with us.
  if (!private_node.empty()) std::remove(("/dev/shm/tern-sim-" + private_node).c_str());
  return exit_code;
}
