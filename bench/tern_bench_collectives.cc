// tern_bench_collectives: collective performance in the manner of
// nccl-tests. Public API only.
//
// Ranks: one per process, joined through the environment (TERN_COMM_ID,
// TERN_COMM_RANK, TERN_COMM_WORLD_SIZE, or torchrun's variables), or -g N
// ranks in this one process (tern_comm_init_all). Rank r runs on node core
// r (TERN_BENCH_CORE overrides), or with TERN_BENCH_PLACEMENT=device on core
// 0 of device r (one rank per device, as the PyTorch plugin places the ranks
// of a process group). Rank 0 prints the table:
//
//   size (B), count (elements), type, redop, root, then out-of-place and
//   in-place: time (us), algbw (GB/s), busbw (GB/s), #wrong
//
// time is the mean of -n operations enqueued back to back and synchronized
// once (the slowest rank's); algbw = size / time; busbw = algbw x the
// nccl-tests factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
// all-to-all (n-1)/n, with size the total bytes across ranks; broadcast and
// reduce 1. #wrong counts elements that differ from the expected result of
// one checked run (-c 1), summed over ranks.
//
// Flags: -b min bytes (8), -e max bytes (64M), -f factor (2), -n iterations
// (20), -w warm-up iterations (5), -c check (1), -d dtype (float, bfloat16,
// half, int8, int32, int64), -o op (sum, prod, max, min, avg), -r root (0),
// -t collective (all_reduce, all_gather, reduce_scatter, broadcast, reduce,
// all_to_all), -g ranks in this process, -i in-place only / -p out-of-place
// only, --csv for machine-readable rows, --round-trip to print only the round
// trip between two CPUs in ns (bench/machine_report.h), --device-time to also measure the
// device's view (CSV rows "tern-device"): events recorded around the -n
// operations, all enqueued while the queue is held at a gate, so that where
// the simulated device's engine thread shares a CPU with the enqueuing
// thread the enqueuing does not count (on hardware, the device executes
// while the host enqueues); it also reports the enqueuing alone per
// operation (CSV rows "tern-enqueue", time only).
#include <tern/tern.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/byte_size.h"
#include "common/half_float.h"
#include "machine_report.h"

namespace {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll };

struct Options {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 64ull << 20;
  double factor = 2;
  int iterations = 20;
  int warmup = 5;
  bool check = true;
  tern_dtype_t dtype = TERN_DTYPE_F32;
  tern_comm_redop_t op = TERN_COMM_SUM;
  uint32_t root = 0;
  std::string collective = "all_reduce";
  Collective kind = Collective::kAllReduce;  // resolved once: the timed loop compares nothing
  uint32_t ranks_here = 0;                   // -g
  bool out_of_place = true;
  bool in_place = true;
  bool csv = false;
  bool device_time = false;
  bool round_trip_only = false;  // --round-trip
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(
      stderr,
      "%s\nusage: tern_bench_collectives [-b BYTES] [-e BYTES] [-f FACTOR] [-n ITERS] [-w WARMUP] "
      "[-c 0|1] [-d DTYPE] [-o OP] [-r ROOT] [-t COLLECTIVE] [-g RANKS] [-i|-p] [--csv] "
      "[--device-time] "
      "[--round-trip]\n",
      why);
  std::exit(2);
}

// Sizes as everywhere in tern (common/byte_size.h): "8", "64K", "16M", "1G".
uint64_t ParseBytes(const char* text) {
  uint64_t bytes = 0;
  const tern::Status status = tern::ParseByteSize(text, &bytes);
  if (!status.ok()) Usage(status.message().c_str());
  return bytes;
}

// The type names of nccl-tests' output ("float", "bfloat16", ...), which the
// collectives comparison (scripts/bench-collectives.sh) lines up with the MPI and
// gloo peers' rows: a format of the benchmark's output, not tern's dtype names.
const char* DtypeName(tern_dtype_t d) {
  switch (d) {
    case TERN_DTYPE_F32:
      return "float";
    case TERN_DTYPE_BF16:
      return "bfloat16";
    case TERN_DTYPE_F16:
      return "half";
    case TERN_DTYPE_I8:
      return "int8";
    case TERN_DTYPE_I32:
      return "int32";
    default:
      return "int64";
  }
}

const char* OpName(tern_comm_redop_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return kNames[op];
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "-b")
      o.min_bytes = ParseBytes(next());
    else if (a == "-e")
      o.max_bytes = ParseBytes(next());
    else if (a == "-f")
      o.factor = std::atof(next());
    else if (a == "-n")
      o.iterations = std::atoi(next());
    else if (a == "-w")
      o.warmup = std::atoi(next());
    else if (a == "-c")
      o.check = std::atoi(next()) != 0;
    else if (a == "-r")
      o.root = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "-t")
      o.collective = next();
    else if (a == "-g")
      o.ranks_here = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "-i")
      o.out_of_place = false;
    else if (a == "-p")
      o.in_place = false;
    else if (a == "--csv")
      o.csv = true;
    else if (a == "--device-time")
      o.device_time = true;
    else if (a == "--round-trip")
      o.round_trip_only = true;
    else if (a == "-d") {
      const std::string d = next();
      if (d == "float" || d == "fp32")
        o.dtype = TERN_DTYPE_F32;
      else if (d == "bfloat16" || d == "bf16")
        o.dtype = TERN_DTYPE_BF16;
      else if (d == "half" || d == "fp16")
        o.dtype = TERN_DTYPE_F16;
      else if (d == "int8")
        o.dtype = TERN_DTYPE_I8;
      else if (d == "int32")
        o.dtype = TERN_DTYPE_I32;
      else if (d == "int64")
        o.dtype = TERN_DTYPE_I64;
      else
        Usage("unknown dtype");
    } else if (a == "-o") {
      const std::string op = next();
      if (op == "sum")
        o.op = TERN_COMM_SUM;
      else if (op == "prod")
        o.op = TERN_COMM_PROD;
      else if (op == "max")
        o.op = TERN_COMM_MAX;
      else if (op == "min")
        o.op = TERN_COMM_MIN;
      else if (op == "avg")
        o.op = TERN_COMM_AVG;
      else
        Usage("unknown op");
    } else {
      Usage(("unknown flag " + a).c_str());
    }
  }
  if (o.factor <= 1 || o.iterations < 1 || o.min_bytes == 0 || o.max_bytes < o.min_bytes)
    Usage("bad sizes");
  if (o.collective == "all_reduce")
    o.kind = Collective::kAllReduce;
  else if (o.collective == "all_gather")
    o.kind = Collective::kAllGather;
  else if (o.collective == "reduce_scatter")
    o.kind = Collective::kReduceScatter;
  else if (o.collective == "broadcast")
    o.kind = Collective::kBroadcast;
  else if (o.collective == "reduce")
    o.kind = Collective::kReduce;
  else if (o.collective == "all_to_all")
    o.kind = Collective::kAllToAll;
  else
    Usage("unknown collective (-t)");
  return o;
}

void Check(const char* what, tern_status_t s) {
  if (s == TERN_OK) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, tern_status_string(s), tern_last_error_message());
  std::exit(1);
}

struct Rank {
  uint32_t rank = 0, size = 1;
  tern_device_t device = nullptr;
  tern_core_t core = nullptr;
  tern_queue_t queue = nullptr;
  tern_comm_t comm = nullptr;
  tern_buffer_t send = nullptr, recv = nullptr, stat = nullptr;
};

// Small integers: every reduction of every dtype stays exact.
double Value(uint32_t rank, uint64_t i) {
  return static_cast<double>((rank * 7 + i * 3) % 5) - 2.0;
}

void Store(tern_dtype_t d, std::vector<uint8_t>& out, uint64_t i, double v) {
  switch (d) {
    case TERN_DTYPE_F32: {
      float f = static_cast<float>(v);
      std::memcpy(&out[i * 4], &f, 4);
      break;
    }
    case TERN_DTYPE_BF16: {
      const uint16_t b = tern::F32ToBf16(static_cast<float>(v));
      std::memcpy(&out[i * 2], &b, 2);
      break;
    }
    case TERN_DTYPE_F16: {
      const uint16_t h = tern::F32ToF16(static_cast<float>(v));
      std::memcpy(&out[i * 2], &h, 2);
      break;
    }
    case TERN_DTYPE_I8:
      out[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
      break;
    case TERN_DTYPE_I32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(&out[i * 4], &x, 4);
      break;
    }
    default: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(&out[i * 8], &x, 8);
      break;
    }
  }
}

double Combine(tern_comm_redop_t op, uint32_t n, const std::vector<double>& v) {
  double acc = v[0];
  for (uint32_t k = 1; k < n; ++k) {
    if (op == TERN_COMM_SUM || op == TERN_COMM_AVG)
      acc += v[k];
    else if (op == TERN_COMM_PROD)
      acc *= v[k];
    else if (op == TERN_COMM_MAX)
      acc = std::max(acc, v[k]);
    else
      acc = std::min(acc, v[k]);
  }
  if (op == TERN_COMM_AVG)
    acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  return acc;
}

// Elements of each side of one operation: (send, recv).
void Counts(const std::string& c, uint64_t total, uint32_t n, uint64_t* send, uint64_t* recv,
            uint64_t* arg) {
  if (c == "all_gather") {
    *arg = total / n;
    *send = *arg;
    *recv = *arg * n;
    return;
  }
  if (c == "reduce_scatter") {
    *arg = total / n;
    *send = *arg * n;
    *recv = *arg;
    return;
  }
  if (c == "all_to_all") {
    *arg = total / n;
    *send = *arg * n;
    *recv = *arg * n;
    return;
  }
  *arg = total;
  *send = total;
  *recv = total;
}

double BusFactor(const std::string& c, uint32_t n) {
  if (c == "all_reduce") return 2.0 * (n - 1) / n;
  if (c == "all_gather" || c == "reduce_scatter" || c == "all_to_all")
    return static_cast<double>(n - 1) / n;
  return 1.0;
}

tern_status_t Enqueue(const Options& o, Rank& r, bool in_place, uint64_t arg) {
  const size_t es = tern_dtype_size(o.dtype);
  tern_buffer_t send = in_place ? r.recv : r.send;
  uint64_t send_off = 0, recv_off = 0;
  if (in_place && o.kind == Collective::kAllGather) send_off = r.rank * arg * es;
  if (in_place && o.kind == Collective::kReduceScatter) {
    send = r.recv;
    recv_off = r.rank * arg * es;
  }
  switch (o.kind) {
    case Collective::kAllReduce:
      return tern_comm_all_reduce(r.comm, send, send_off, r.recv, recv_off, arg, o.dtype, o.op,
                                  r.queue);
    case Collective::kAllGather:
      return tern_comm_all_gather(r.comm, send, send_off, r.recv, recv_off, arg, o.dtype, r.queue);
    case Collective::kReduceScatter:
      return tern_comm_reduce_scatter(r.comm, send, send_off, r.recv, recv_off, arg, o.dtype, o.op,
                                      r.queue);
    case Collective::kBroadcast:
      return tern_comm_broadcast(r.comm, send, send_off, r.recv, recv_off, arg, o.dtype, o.root,
                                 r.queue);
    case Collective::kReduce:
      return tern_comm_reduce(r.comm, send, send_off, r.recv, recv_off, arg, o.dtype, o.op, o.root,
                              r.queue);
    case Collective::kAllToAll:
      return tern_comm_all_to_all(r.comm, r.send, 0, r.recv, 0, arg, o.dtype, r.queue);
  }
  Usage("unknown collective (-t)");
}

// The largest (or summed) int64 over ranks, through the communicator.
int64_t AcrossRanks(Rank& r, int64_t value, tern_comm_redop_t op) {
  Check("write", tern_buffer_write(r.stat, 0, &value, 8));
  Check("all_reduce",
        tern_comm_all_reduce(r.comm, r.stat, 0, r.stat, 0, 1, TERN_DTYPE_I64, op, r.queue));
  Check("synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
  Check("read", tern_buffer_read(r.stat, 0, &value, 8));
  return value;
}

// Fills the inputs, runs once, counts wrong elements of this rank.
int64_t CheckOnce(const Options& o, Rank& r, bool in_place, uint64_t arg, uint64_t send_elems,
                  uint64_t recv_elems) {
  const size_t es = tern_dtype_size(o.dtype);
  const uint32_t n = r.size;
  const std::string& c = o.collective;
  std::vector<uint8_t> input(send_elems * es);
  for (uint64_t i = 0; i < send_elems; ++i) Store(o.dtype, input, i, Value(r.rank, i));
  if (in_place && c == "all_gather") {
    Check("write", tern_buffer_write(r.recv, r.rank * arg * es, input.data(), input.size()));
  } else {
    Check("write", tern_buffer_write(in_place ? r.recv : r.send, 0, input.data(), input.size()));
  }
  Check("enqueue", Enqueue(o, r, in_place, arg));
  Check("synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
  uint64_t out_elems = recv_elems, out_off = 0;
  if (c == "reduce_scatter" && in_place) out_off = r.rank * arg * es;
  if (c == "reduce" && r.rank != o.root) return 0;
  std::vector<uint8_t> got(out_elems * es), want(out_elems * es);
  Check("read", tern_buffer_read(r.recv, out_off, got.data(), got.size()));
  std::vector<double> v(n);
  for (uint64_t i = 0; i < out_elems; ++i) {
    double expected = 0;
    if (c == "all_reduce" || c == "reduce") {
      for (uint32_t k = 0; k < n; ++k) v[k] = Value(k, i);
      expected = Combine(o.op, n, v);
    } else if (c == "reduce_scatter") {
      for (uint32_t k = 0; k < n; ++k) v[k] = Value(k, r.rank * arg + i);
      expected = Combine(o.op, n, v);
    } else if (c == "all_gather") {
      expected = Value(static_cast<uint32_t>(i / arg), i % arg);
    } else if (c == "broadcast") {
      expected = Value(o.root, i);
    } else if (c == "all_to_all") {
      expected = Value(static_cast<uint32_t>(i / arg), r.rank * arg + i % arg);
    }
    if (o.op == TERN_COMM_AVG &&
        (o.dtype == TERN_DTYPE_I8 || o.dtype == TERN_DTYPE_I32 || o.dtype == TERN_DTYPE_I64)) {
      expected = std::trunc(expected);
    }
    Store(o.dtype, want, i, expected);
  }
  int64_t wrong = 0;
  for (uint64_t i = 0; i < out_elems; ++i) {
    if (std::memcmp(&got[i * es], &want[i * es], es) != 0) ++wrong;
  }
  return wrong;
}

struct Result {
  double us = 0;
  double device_us = 0;
  double enqueue_us = 0;  // --device-time: enqueuing alone, per operation
  int64_t wrong = 0;
};

// The device's view: events recorded around the operations, which are all
// enqueued while the queue is held at a gate (a host callback that sleeps),
// so that on a machine where the simulated device's engine thread and this
// thread share a CPU, enqueuing does not take the engine's CPU time.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
  bool done = false;
  static void Hold(void* self, tern_status_t) {
    auto* g = static_cast<Gate*>(self);
    std::unique_lock<std::mutex> lock(g->mutex);
    g->cv.wait(lock, [g] { return g->open; });
  }
  static void Done(void* self, tern_status_t) {
    auto* g = static_cast<Gate*>(self);
    std::lock_guard<std::mutex> lock(g->mutex);
    g->done = true;
    g->cv.notify_all();
  }
};

int64_t DeviceTimeNs(const Options& o, Rank& r, bool in_place, uint64_t arg, int64_t* enqueue_ns) {
  Gate gate;
  tern_event_t start = nullptr, end = nullptr;
  Check("event", tern_event_create(&start));
  Check("event", tern_event_create(&end));
  Check("barrier", tern_comm_barrier(r.comm, r.queue));
  Check("synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
  Check("callback", tern_queue_host_callback(r.queue, &Gate::Hold, &gate, nullptr));
  Check("record", tern_queue_record_event(r.queue, start, nullptr));
  const auto enqueue_start = std::chrono::steady_clock::now();
  for (int k = 0; k < o.iterations; ++k) Check("enqueue", Enqueue(o, r, in_place, arg));
  *enqueue_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - enqueue_start)
                    .count();
  Check("record", tern_queue_record_event(r.queue, end, nullptr));
  // This thread learns of the end through a callback, not by waiting on the
  // queue's timeline: a timeline waiter is woken at every completed command.
  Check("callback", tern_queue_host_callback(r.queue, &Gate::Done, &gate, nullptr));
  {
    std::unique_lock<std::mutex> lock(gate.mutex);
    gate.open = true;
    gate.cv.notify_all();
    gate.cv.wait(lock, [&gate] { return gate.done; });
  }
  Check("synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
  uint64_t ns = 0;
  Check("elapsed", tern_event_elapsed_ns(start, end, &ns));
  tern_event_destroy(start);
  tern_event_destroy(end);
  return static_cast<int64_t>(ns);
}

Result Measure(const Options& o, Rank& r, bool in_place, uint64_t arg, uint64_t send_elems,
               uint64_t recv_elems) {
  Result result;
  if (o.check)
    result.wrong =
        AcrossRanks(r, CheckOnce(o, r, in_place, arg, send_elems, recv_elems), TERN_COMM_SUM);
  for (int k = 0; k < o.warmup; ++k) Check("enqueue", Enqueue(o, r, in_place, arg));
  Check("barrier", tern_comm_barrier(r.comm, r.queue));
  Check("synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < o.iterations; ++k) Check("enqueue", Enqueue(o, r, in_place, arg));
  Check("synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
  const auto end = std::chrono::steady_clock::now();
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
  result.us = static_cast<double>(AcrossRanks(r, ns, TERN_COMM_MAX)) / 1e3 / o.iterations;
  if (o.device_time) {
    int64_t enqueue_ns = 0;
    result.device_us = static_cast<double>(AcrossRanks(
                           r, DeviceTimeNs(o, r, in_place, arg, &enqueue_ns), TERN_COMM_MAX)) /
                       1e3 / o.iterations;
    result.enqueue_us =
        static_cast<double>(AcrossRanks(r, enqueue_ns, TERN_COMM_MAX)) / 1e3 / o.iterations;
  }
  return result;
}

void RunRank(const Options& o, Rank& r) {
  const size_t es = tern_dtype_size(o.dtype);
  const uint32_t n = r.size;
  const std::string& c = o.collective;
  uint64_t max_send = 0, max_recv = 0, arg = 0;
  Counts(c, std::max<uint64_t>(o.max_bytes / es, n), n, &max_send, &max_recv, &arg);
  tern_buffer_params_t p = {sizeof(p), 0, std::max<uint64_t>(max_send * es, 64), 0,
                            TERN_MEMORY_TENSORS};
  Check("alloc", tern_buffer_alloc(r.device, &p, &r.send));
  p.size = std::max<uint64_t>(std::max(max_recv, max_send) * es, 64);
  Check("alloc", tern_buffer_alloc(r.device, &p, &r.recv));
  p.size = 64;
  Check("alloc", tern_buffer_alloc(r.device, &p, &r.stat));
  std::vector<uint8_t> zeros(std::max(max_send, max_recv) * es, 0);
  Check("write", tern_buffer_write(r.send, 0, zeros.data(), max_send * es));
  Check("write", tern_buffer_write(r.recv, 0, zeros.data(), std::max(max_recv, max_send) * es));
  const bool print = r.rank == 0;
  if (print && !o.csv) {
    tern_comm_info_t info = {};
    info.struct_size = sizeof(info);
    tern_comm_get_info(r.comm, &info);
    std::printf("# tern_bench_collectives: %s, %u ranks on %u host(s), transport %s\n", c.c_str(),
                n, info.node_count, info.transport);
    std::printf("#%64s%30s\n", "out-of-place", "in-place");
    std::printf("#%11s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type",
                "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                "#wrong");
    std::printf("#%11s %12s %8s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  } else if (print) {
    std::printf(
        "impl,collective,ranks,size,count,type,redop,placement,time_us,algbw,busbw,wrong\n");
  }
  double bus_sum = 0;
  int rows = 0;
  for (double size = static_cast<double>(o.min_bytes);
       size <= static_cast<double>(o.max_bytes) * 1.0000001; size *= o.factor) {
    uint64_t total = static_cast<uint64_t>(size) / es;
    if (c == "all_gather" || c == "reduce_scatter" || c == "all_to_all") total = total / n * n;
    if (total == 0) continue;
    uint64_t send_elems, recv_elems;
    Counts(c, total, n, &send_elems, &recv_elems, &arg);
    const uint64_t bytes = total * es;
    Result results[2];
    bool ran[2] = {false, false};
    if (o.out_of_place) {
      results[0] = Measure(o, r, false, arg, send_elems, recv_elems);
      ran[0] = true;
    }
    if (o.in_place && c != "all_to_all") {
      results[1] = Measure(o, r, true, arg, send_elems, recv_elems);
      ran[1] = true;
    }
    if (!print) continue;
    const bool rooted = c == "broadcast" || c == "reduce";
    const bool reducing = c == "all_reduce" || c == "reduce" || c == "reduce_scatter";
    if (o.csv) {
      for (int k = 0; k < 2; ++k) {
        if (!ran[k]) continue;
        const double algbw = bytes / results[k].us / 1e3;
        std::printf("tern,%s,%u,%llu,%llu,%s,%s,%s,%.3f,%.3f,%.3f,%lld\n", c.c_str(), n,
                    static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(total),
                    DtypeName(o.dtype), reducing ? OpName(o.op) : "none", k ? "in" : "out",
                    results[k].us, algbw, algbw * BusFactor(c, n),
                    static_cast<long long>(o.check ? results[k].wrong : -1));
        if (o.device_time) {
          const double dev_algbw = bytes / results[k].device_us / 1e3;
          std::printf("tern-device,%s,%u,%llu,%llu,%s,%s,%s,%.3f,%.3f,%.3f,%lld\n", c.c_str(), n,
                      static_cast<unsigned long long>(bytes),
                      static_cast<unsigned long long>(total), DtypeName(o.dtype),
                      reducing ? OpName(o.op) : "none", k ? "in" : "out", results[k].device_us,
                      dev_algbw, dev_algbw * BusFactor(c, n),
                      static_cast<long long>(o.check ? results[k].wrong : -1));
          // Enqueuing alone (the host's cost per operation, while the queue
          // is held): time only, so the bandwidth columns are 0.
          std::printf("tern-enqueue,%s,%u,%llu,%llu,%s,%s,%s,%.3f,0,0,-1\n", c.c_str(), n,
                      static_cast<unsigned long long>(bytes),
                      static_cast<unsigned long long>(total), DtypeName(o.dtype),
                      reducing ? OpName(o.op) : "none", k ? "in" : "out", results[k].enqueue_us);
        }
      }
    } else {
      std::printf(" %11llu %12llu %8s %6s %6d", static_cast<unsigned long long>(bytes),
                  static_cast<unsigned long long>(total), DtypeName(o.dtype),
                  reducing ? OpName(o.op) : "none", rooted ? static_cast<int>(o.root) : -1);
      for (int k = 0; k < 2; ++k) {
        if (!ran[k]) {
          std::printf(" %9s %7s %7s %6s", "-", "-", "-", "-");
          continue;
        }
        const double algbw = bytes / results[k].us / 1e3;
        std::printf(" %9.2f %7.2f %7.2f %6s", results[k].us, algbw, algbw * BusFactor(c, n),
                    o.check ? std::to_string(results[k].wrong).c_str() : "N/A");
        bus_sum += algbw * BusFactor(c, n);
        ++rows;
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  if (print && !o.csv) std::printf("# Avg bus bandwidth    : %g\n#\n", rows ? bus_sum / rows : 0.0);
  tern_buffer_free(r.send);
  tern_buffer_free(r.recv);
  tern_buffer_free(r.stat);
}

// Opens core `index` of `device` and a queue on it for rank r.
void OpenCoreOf(Rank& r, tern_device_t device, uint32_t index) {
  r.device = device;
  Check("tern_core_open", tern_core_open(device, index, &r.core));
  Check("tern_queue_create", tern_queue_create(r.core, nullptr, &r.queue));
}

// Opens core 0 of device `index` modulo the device count.
void OpenFirstCoreOfDevice(Rank& r, uint32_t index) {
  uint32_t devices = 0;
  Check("tern_device_count", tern_device_count(&devices));
  tern_device_t device;
  Check("tern_device_get", tern_device_get(index % devices, &device));
  OpenCoreOf(r, device, 0);
}

void OpenCore(Rank& r, uint32_t node_core) {
  uint32_t devices = 0;
  Check("tern_device_count", tern_device_count(&devices));
  uint32_t index = node_core;
  for (uint32_t d = 0; d < devices; ++d) {
    tern_device_t device;
    Check("tern_device_get", tern_device_get(d, &device));
    tern_device_info_t info = {};
    info.struct_size = sizeof(info);
    Check("tern_device_get_info", tern_device_get_info(device, &info));
    if (index < info.core_count) {
      OpenCoreOf(r, device, index);
      return;
    }
    index -= info.core_count;
  }
  std::fprintf(stderr, "node core %u does not exist\n", node_core);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  if (o.round_trip_only) {
    // The machine's state alone: a round trip between two CPUs, in ns.
    std::printf("%.0f\n", tern::bench::CrossCpuRoundTripNs());
    return 0;
  }
  if (!o.csv) tern::bench::PrintMachine(stdout, /*pin_copy_strategy=*/false);
  Check("tern_init", tern_init(nullptr));
  if (o.ranks_here > 0) {
    std::vector<Rank> ranks(o.ranks_here);
    std::vector<tern_core_t> cores(o.ranks_here);
    std::vector<tern_comm_t> comms(o.ranks_here);
    for (uint32_t i = 0; i < o.ranks_here; ++i) {
      OpenCore(ranks[i], i);
      cores[i] = ranks[i].core;
    }
    Check("tern_comm_init_all",
          tern_comm_init_all(cores.data(), o.ranks_here, nullptr, comms.data()));
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < o.ranks_here; ++i) {
      ranks[i].rank = i;
      ranks[i].size = o.ranks_here;
      ranks[i].comm = comms[i];
      threads.emplace_back([&, i] { RunRank(o, ranks[i]); });
    }
    for (auto& t : threads) t.join();
    for (Rank& r : ranks) tern_comm_destroy(r.comm);
  } else {
    Rank r;
    const char* rank_text = std::getenv("TERN_COMM_RANK");
    if (rank_text == nullptr) rank_text = std::getenv("RANK");
    r.rank = rank_text ? static_cast<uint32_t>(std::atoi(rank_text)) : 0;
    const char* core_text = std::getenv("TERN_BENCH_CORE");
    const char* placement = std::getenv("TERN_BENCH_PLACEMENT");
    if (placement != nullptr && std::strcmp(placement, "device") == 0) {
      OpenFirstCoreOfDevice(r, r.rank);
    } else {
      OpenCore(r, core_text ? static_cast<uint32_t>(std::atoi(core_text)) : r.rank);
    }
    Check("tern_comm_init_from_env", tern_comm_init_from_env(r.core, nullptr, &r.comm));
    tern_comm_info_t info = {};
    info.struct_size = sizeof(info);
    Check("tern_comm_get_info", tern_comm_get_info(r.comm, &info));
    r.size = info.size;
    RunRank(o, r);
    tern_comm_destroy(r.comm);
  }
  tern_shutdown();
  return 0;
}
