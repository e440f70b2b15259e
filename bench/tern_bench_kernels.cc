// Micro-benchmark of the simulated engines' kernels, each figure beside a
// baseline measured in the same run, the contenders interleaved round by
// round (see Rounds):
//   matmul f32 and bf16 (512..4096): GFLOP/s of the engine kernel
//     (RunInstruction, on the calling thread), of a whole execution through
//     the public API (tern_queue_execute + tern_queue_synchronize, which runs
//     on the runtime's compute thread), and of a direct oneDNN matmul of the
//     same shape (target >= 0.9x);
//   elementwise add and gelu f32 on 16M elements: GB/s (bytes read + written)
//     beside memcpy moving the same bytes (target >= 0.7x), and the same on
//     one core in CPU time.
//   --unary: every f32 unary function on one core (CPU time) beside memcpy,
//     to find the transcendental functions that are still slow.
//   overlap: one execution that copies on the DMA engine while the tensor
//     engine multiplies (independent streams), beside the copy alone and the
//     matmul alone: its time against their sum (no overlap) and their maximum
//     (full overlap).
//   mlp: the MLP of examples/mlp_gen.c (16x256->512->10) executed from C
//     beside the same two oneDNN matmuls and relu called directly (target
//     <= 1.15x), in blocks of back-to-back calls (see BlockRounds;
//     TERN_BENCH_BLOCKS=1 prints every block), and its first execution after
//     a load (target <= 3x warm).
//   gemv: matrix-vector products as linear layers at batch 1..4 make them,
//     beside oneDNN's on the same layout: the bandwidth at which each streams
//     the weight (info).
// Usage: tern_bench_kernels [--quick] [--matmul | --size N | --elementwise | --unary |
//                            --overlap | --mlp | --gemv]
//   --quick: small sizes, for a smoke run; --matmul / --elementwise /
//   --unary / --overlap: one part (--unary only runs when asked for);
//   --size N: matmul of that size only.
#include <dirent.h>
#include <fmt/format.h>
#include <sched.h>
#include <tern/builder.h>
#include <tern/tern.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/isa_rules.h"
#include "driver_shim/sim/engines/kernels_testing.h"
#include "driver_shim/sim/engines/numerics.h"
#include "driver_shim/sim/engines/openmp_runtime.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "machine_report.h"

namespace {

using Clock = std::chrono::steady_clock;
using tern::isa::OperandDesc;

double WallSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best CPU time of fn on the calling thread (fn must not start threads):
// what the work costs a core, whatever else the machine runs.
template <typename Fn>
double BestCpuTime(Fn&& fn, int reps) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = ThreadCpuSeconds();
    fn();
    best = std::min(best, ThreadCpuSeconds() - t0);
  }
  return best;
}

// Whether a thread of this process other than the caller is running or
// waiting for a CPU (state R in /proc/self/task/<tid>/stat).
bool AnotherThreadRunnable() {
  const long self = static_cast<long>(gettid());
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return false;
  bool runnable = false;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.' || std::atol(entry->d_name) == self) continue;
    const std::string path = std::string("/proc/self/task/") + entry->d_name + "/stat";
    FILE* file = std::fopen(path.c_str(), "r");
    if (file == nullptr) continue;  // the thread ended meanwhile
    char line[512];
    const size_t n = std::fread(line, 1, sizeof(line) - 1, file);
    std::fclose(file);
    line[n] = '\0';
    const char* name_end = std::strrchr(line, ')');  // the name may hold spaces
    if (name_end != nullptr && name_end[1] == ' ' && name_end[2] == 'R') {
      runnable = true;
      break;
    }
  }
  closedir(dir);
  return runnable;
}

// Waits until the process's other threads have gone quiet: none of them
// runnable in eight looks 0.25 ms apart, at most `cap` seconds. Returns the
// seconds waited. A contender's helper threads keep spinning after its call
// returns (libgomp's workers spin for GOMP_SPINCOUNT pauses after each
// parallel region, about 7 ms on the AMD Zen 5; the runtime's queue and
// kernel-pool threads poll for tens of microseconds), and a contender timed
// while another's helpers spin shares the CPUs with them. The threads'
// states, not the process's CPU clock: a thread that runs without a break
// has its time added only at the scheduler's tick (every 1-4 ms), so a
// spinning worker could look idle over a 2 ms window, and the 1024 f32
// product timed right after a direct oneDNN call shared the CPUs with
// oneDNN's worker in most such rounds (6.6-8.5 ms of its CPU time during an
// 8-10 ms kernel; 5 ms alone).
double SettleOtherThreads(double cap = 0.5) {
  const double start = WallSeconds();
  int quiet_looks = 0;
  while (quiet_looks < 8 && WallSeconds() - start < cap) {
    quiet_looks = AnotherThreadRunnable() ? 0 : quiet_looks + 1;
    usleep(250);
  }
  return WallSeconds() - start;
}

// Times several contenders round by round: every round runs each contender
// once, the order rotating from one round to the next (A B, B A, A B, ... for
// two), so that each contender meets the same machine (other jobs, cache and
// frequency state) and neither always runs first. At least `min_rounds`
// rounds and `min_seconds` in all, at most `max_rounds`; every contender runs
// once beforehand as a warm-up (primitive creation, page faults). With
// `settle`, each call waits first until the other contenders' helper threads
// have gone quiet (SettleOtherThreads): for contenders long enough that a
// wake-up is small beside them, whose helpers (libgomp's spinning workers)
// would otherwise share the CPUs with the next contender.
// times[c][r] is contender c's time in round r, from `clock`.
struct Timed {
  std::vector<std::vector<double>> times;
};
Timed Rounds(const std::vector<std::function<void()>>& fns, int min_rounds, double min_seconds,
             int max_rounds = 400, double (*clock)() = WallSeconds, bool settle = false) {
  const size_t k = fns.size();
  for (const auto& fn : fns) fn();
  Timed t;
  t.times.resize(k);
  const double start = WallSeconds();
  for (int r = 0; r < max_rounds && (r < min_rounds || WallSeconds() - start < min_seconds); ++r) {
    for (size_t j = 0; j < k; ++j) {
      const size_t c = (j + r) % k;
      if (settle) SettleOtherThreads();
      const double t0 = clock();
      fns[c]();
      t.times[c].push_back(clock() - t0);
    }
  }
  return t;
}

double Best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

// Times contenders in blocks: each block runs one contender `calls` times
// back to back (the first two untimed: they pay the wake-ups of threads that
// slept while the other contenders ran), after the other contenders' helper
// threads have gone quiet (SettleOtherThreads). Each contender meets the
// machine as a program calling only it would, and the blocks alternate (the
// order rotating) so that drift in the machine reaches all of them.
// medians[c][b]: contender c's median call in block round b; all[c]: every
// timed call.
struct Blocked {
  std::vector<std::vector<double>> medians, all;
  double settle_max = 0;
};
Blocked BlockRounds(const std::vector<std::function<void()>>& fns, int calls, int block_rounds) {
  const size_t k = fns.size();
  Blocked b;
  b.medians.resize(k);
  b.all.resize(k);
  std::vector<double> block;
  for (int r = 0; r < block_rounds; ++r) {
    for (size_t j = 0; j < k; ++j) {
      const size_t c = (j + r) % k;
      b.settle_max = std::max(b.settle_max, SettleOtherThreads());
      fns[c]();
      fns[c]();
      block.clear();
      for (int i = 0; i < calls; ++i) {
        const double t0 = WallSeconds();
        fns[c]();
        block.push_back(WallSeconds() - t0);
      }
      b.all[c].insert(b.all[c].end(), block.begin(), block.end());
      b.medians[c].push_back(Quantile(block, 0.5));
    }
  }
  return b;
}

// Per-round ratios of throughput, ours / baseline (= base time / our time).
std::vector<double> RoundRatios(const std::vector<double>& ours, const std::vector<double>& base) {
  std::vector<double> r;
  for (size_t i = 0; i < ours.size(); ++i) r.push_back(base[i] / ours[i]);
  return r;
}

OperandDesc Desc(tern_dtype_t dtype, std::vector<int64_t> shape) {
  OperandDesc d;
  d.segment = TERN_SEGMENT_OUTPUT;
  d.dtype = dtype;
  d.rank = static_cast<uint32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) d.shape[i] = shape[i];
  tern::isa::SetContiguousStrides(&d);
  return d;
}

// Runs an instruction whose operands are host buffers.
struct Op {
  tern::driver::Instruction ins;
  std::vector<tern::sim::TensorView> views;
  Op(uint32_t opcode, std::vector<OperandDesc> descs, std::vector<void*> data,
     std::vector<int64_t> ints = {}, std::vector<double> floats = {}) {
    ins.opcode = opcode;
    ins.engine = tern::isa::OpcodeEngine(opcode);
    ins.operands = std::move(descs);
    ins.ints = std::move(ints);
    ins.floats = std::move(floats);
    tern::Status valid = tern::isa::ValidateInstruction(opcode, ins.operands, ins.ints, ins.floats);
    if (!valid.ok()) {
      std::fprintf(stderr, "invalid instruction: %s\n", valid.message().c_str());
      std::exit(1);
    }
    for (size_t i = 0; i < data.size(); ++i)
      views.push_back({static_cast<uint8_t*>(data[i]), &ins.operands[i]});
  }
  // Puts operand `index` in the program's constants and prepares the
  // instruction as loading a program does (a matmul's weight laid out).
  void PrepareWithConstant(size_t index) {
    ins.operands[index].segment = TERN_SEGMENT_CONSTANT;
    ins.operands[index].index = 0;
    ins.prepared = tern::sim::PrepareInstruction(ins, views[index].data);
  }
  void Run() {
    tern::Status st = tern::sim::RunInstruction(ins, views);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      std::exit(1);
    }
  }
};

std::vector<std::string> missed;  // rows below their target

// One row: throughput of ours and of the baseline from the same rounds, as
// the best of each, the ratio of the bests, and the median (and the 10th and
// 90th percentiles) of the per-round ratios. The target is judged on the
// median round ratio: one round that another process disturbed moves it
// little, while a best-of figure takes its value from a single round.
void Report(const char* what, double work, const char* unit, const std::vector<double>& ours,
            const std::vector<double>& base, double target) {
  const double best_ours = work / Best(ours), best_base = work / Best(base);
  const std::vector<double> ratios = RoundRatios(ours, base);
  const double median = Quantile(ratios, 0.5);
  const bool ok = median >= target;
  if (!ok) missed.push_back(what);
  std::printf(
      "%-30s %8.1f %-7s base %8.1f  best/best %.2f  median round %.2f [p10 %.2f, p90 %.2f] "
      "n=%zu; median us %.0f, base %.0f%s%s\n",
      what, best_ours / 1e9, unit, best_base / 1e9, best_ours / best_base, median,
      Quantile(ratios, 0.1), Quantile(ratios, 0.9), ratios.size(), Quantile(ours, 0.5) * 1e6,
      Quantile(base, 0.5) * 1e6, target > 0 ? (ok ? "  ok" : "  MISSED") : "",
      target > 0 ? "" : "  (info)");
}

// `count` floats drawn uniformly from [-scale, scale].
std::vector<float> UniformFloats(std::mt19937& rng, int64_t count, float scale) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& f : v) f = std::uniform_real_distribution<float>(-scale, scale)(rng);
  return v;
}

// One linear layer through a oneDNN matmul with a bias (dst = src @ weights +
// bias), waited for.
void ExecuteLinear(dnnl::matmul& prim, dnnl::stream& stream, dnnl::memory& src,
                   dnnl::memory& weights, dnnl::memory& bias, dnnl::memory& dst) {
  prim.execute(stream, {{DNNL_ARG_SRC, src},
                        {DNNL_ARG_WEIGHTS, weights},
                        {DNNL_ARG_BIAS, bias},
                        {DNNL_ARG_DST, dst}});
  stream.wait();
}

void Check(tern_status_t status, const char* what) {
  if (status == TERN_OK) return;
  std::fprintf(stderr, "%s failed: %s\n", what, tern_last_error_message());
  std::exit(1);
}

// A whole execution through the public API: a one-instruction matmul
// executable loaded on a simulated device, run with tern_queue_execute and
// waited for with tern_queue_synchronize. The kernel runs on the queue's
// thread and the kernel pool (driver_shim/sim/engines/kernel_pool.h).
class PublicMatmul {
 public:
  static void Init() {
    // A node of our own, large enough for three 4096 x 4096 f32 matrices.
    node_ = "kbench-" + std::to_string(getpid());
    setenv("TERN_SIM_NODE", node_.c_str(), 0);
    setenv("TERN_SIM_TOPOLOGY", "1x1x1G", 0);
    Check(tern_init(nullptr), "tern_init");
    Check(tern_device_get(0, &device_), "tern_device_get");
    Check(tern_core_open(device_, 0, &core_), "tern_core_open");
    Check(tern_queue_create(core_, nullptr, &queue_), "tern_queue_create");
  }
  static void Shutdown() {
    tern_queue_destroy(queue_);
    tern_core_close(core_);
    tern_shutdown();
    std::remove(("/dev/shm/tern-sim-" + node_).c_str());
  }

  PublicMatmul(tern_dtype_t dtype, int64_t n, const void* a, const void* b) {
    const int64_t shape[2] = {n, n};
    tern_builder_t builder = nullptr;
    Check(tern_builder_create(nullptr, &builder), "tern_builder_create");
    Check(tern_builder_begin_function(builder, "matmul", nullptr), "begin_function");
    Check(tern_builder_add_input(builder, "a", dtype, 2, shape, nullptr), "add_input");
    Check(tern_builder_add_input(builder, "b", dtype, 2, shape, nullptr), "add_input");
    Check(tern_builder_add_output(builder, "c", dtype, 2, shape, nullptr), "add_output");
    tern_operand_t operands[3] = {};
    const tern_segment_t segments[3] = {TERN_SEGMENT_OUTPUT, TERN_SEGMENT_INPUT,
                                        TERN_SEGMENT_INPUT};
    const uint32_t indices[3] = {0, 0, 1};
    for (int i = 0; i < 3; ++i) {
      operands[i].segment = segments[i];
      operands[i].index = indices[i];
      operands[i].dtype = dtype;
      operands[i].rank = 2;
      operands[i].shape = shape;
    }
    tern_instruction_t ins{};
    ins.struct_size = sizeof(ins);
    ins.opcode = TERN_OP_MATMUL;
    ins.operand_count = 3;
    ins.operands = operands;
    Check(tern_builder_add_instruction(builder, &ins), "add_instruction");
    Check(tern_builder_end_function(builder), "end_function");
    void* data = nullptr;
    uint64_t size = 0;
    Check(tern_builder_finish(builder, &data, &size), "tern_builder_finish");
    tern_builder_destroy(builder);
    Check(tern_executable_load(device_, data, size, nullptr, &executable_), "executable_load");
    tern_builder_free_data(data);
    const uint64_t bytes = static_cast<uint64_t>(n * n) * tern::isa::DTypeSize(dtype);
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = bytes;
    params.category = TERN_MEMORY_TENSORS;
    for (tern_buffer_t& buffer : buffers_)
      Check(tern_buffer_alloc(device_, &params, &buffer), "alloc");
    Check(tern_buffer_write(buffers_[0], 0, a, bytes), "tern_buffer_write");
    Check(tern_buffer_write(buffers_[1], 0, b, bytes), "tern_buffer_write");
  }
  ~PublicMatmul() {
    for (tern_buffer_t buffer : buffers_) tern_buffer_free(buffer);
    tern_executable_unload(executable_);
  }
  void Run() {
    const tern_binding_t inputs[2] = {{buffers_[0], 0}, {buffers_[1], 0}};
    const tern_binding_t outputs[1] = {{buffers_[2], 0}};
    Check(tern_queue_execute(queue_, executable_, 0, inputs, 2, outputs, 1, nullptr),
          "tern_queue_execute");
    Check(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  }

 private:
  static inline std::string node_;
  static inline tern_device_t device_ = nullptr;
  static inline tern_core_t core_ = nullptr;
  static inline tern_queue_t queue_ = nullptr;
  tern_executable_t executable_ = nullptr;
  tern_buffer_t buffers_[3] = {};

 public:
  static tern_device_t device() { return device_; }
  static tern_queue_t queue() { return queue_; }
};

void BenchMatmul(tern_dtype_t dtype, int64_t n) {
  const size_t esize = tern::isa::DTypeSize(dtype);
  std::vector<uint8_t> a(n * n * esize), b(n * n * esize), c(n * n * esize);
  std::mt19937 rng(1);
  for (int64_t i = 0; i < n * n; ++i) {
    float v = std::uniform_real_distribution<float>(-1, 1)(rng);
    if (dtype == TERN_DTYPE_F32) {
      std::memcpy(&a[i * 4], &v, 4);
      std::memcpy(&b[i * 4], &v, 4);
    } else {
      uint16_t h = tern::sim::num::F32ToBf16(v);
      std::memcpy(&a[i * 2], &h, 2);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  Op op(TERN_OP_MATMUL, {Desc(dtype, {n, n}), Desc(dtype, {n, n}), Desc(dtype, {n, n})},
        {c.data(), a.data(), b.data()});
  PublicMatmul exec(dtype, n, a.data(), b.data());

  // The same product straight through oneDNN, called from this thread: the
  // thread (and so the OpenMP team) that RunInstruction runs on here.
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const memory::data_type dt =
      dtype == TERN_DTYPE_F32 ? memory::data_type::f32 : memory::data_type::bf16;
  memory::desc md({n, n}, dt, memory::format_tag::ab);
  const double flop = 2.0 * n * n * n;
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng);
  } catch (const dnnl::error&) {
    // oneDNN has no matmul at all for this dtype on some CPUs (bf16 without
    // AVX-512 in the system's oneDNN): no baseline, so no ratio and no target;
    // the engine's own loops run the product, and their speed is still shown.
    const Timed t = Rounds({[&] { op.Run(); }, [&] { exec.Run(); }}, 3, 1.0);
    std::printf(
        "matmul %s %lld: kernel %.1f, execute %.1f GFLOP/s (best); no baseline: oneDNN has no "
        "%s matmul on this CPU\n",
        tern::isa::DTypeName(dtype), static_cast<long long>(n), flop / Best(t.times[0]) / 1e9,
        flop / Best(t.times[1]) / 1e9, tern::isa::DTypeName(dtype));
    return;
  }
  dnnl::matmul prim(pd);
  // Operands of its own, like the execution's device buffers: each contender
  // finds in the caches what it left there itself, one round earlier.
  std::vector<uint8_t> a2 = a, b2 = b, c2(c.size());
  memory ma(md, eng, a2.data()), mb(md, eng, b2.data()), mc(md, eng, c2.data());
  auto direct = [&] {
    prim.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
  };
  const int rounds = n >= 2048 ? 6 : 10;
  const double min_seconds = n >= 4096 ? 5.0 : 1.5;
  // Settled calls: oneDNN's libgomp worker spins for milliseconds after each
  // direct call (GOMP_SPINCOUNT), and tern's kernels timed while it spins
  // ran at 0.57x on the AMD Zen 4 at 1024, 1.00x once it slept.
  const Timed t = Rounds({[&] { op.Run(); }, [&] { exec.Run(); }, direct}, rounds, min_seconds, 400,
                         WallSeconds, /*settle=*/true);
  char what[64];
  std::snprintf(what, sizeof(what), "matmul %s %lld kernel", tern::isa::DTypeName(dtype),
                static_cast<long long>(n));
  Report(what, flop, "GFLOP/s", t.times[0], t.times[2], 0.9);
  std::snprintf(what, sizeof(what), "matmul %s %lld execute", tern::isa::DTypeName(dtype),
                static_cast<long long>(n));
  Report(what, flop, "GFLOP/s", t.times[1], t.times[2], 0.9);
}

// Matrix-vector products as a linear layer at batch 1..4 makes them: x
// [M, K] times a weight stored [N, K] (B = its transpose, columns contiguous),
// plus a bias. The weight is read once per call and is larger than a core's
// L2 cache, so the figure is the bandwidth at which the product streams it:
// the engine kernel (RunInstruction on this thread, the kernel pool's
// threads) beside oneDNN's matmul on the same layout with as many threads
// (info: no issue states a target for it; the compiled batch-1 MLP of
// python/benchmarks/compiled_models.py is made of such products).
void BenchGemv(int64_t m, int64_t k, int64_t n) {
  std::mt19937 rng(5);
  std::vector<float> x = UniformFloats(rng, m * k, 1.0f);
  std::vector<float> w = UniformFloats(rng, n * k, 1.0f);
  std::vector<float> bias = UniformFloats(rng, n, 1.0f);
  std::vector<float> out(m * n), out_direct(m * n);
  OperandDesc b = Desc(TERN_DTYPE_F32, {k, n});
  b.strides[0] = 1;
  b.strides[1] = k;
  Op op(TERN_OP_MATMUL,
        {Desc(TERN_DTYPE_F32, {m, n}), Desc(TERN_DTYPE_F32, {m, k}), b, Desc(TERN_DTYPE_F32, {n})},
        {out.data(), x.data(), w.data(), bias.data()});
  using dnnl::memory;
  const int threads = tern::sim::KernelThreadsForHost();
  const int caller_threads = omp_get_max_threads();
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const memory::desc x_md({m, k}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc w_md({k, n}, memory::data_type::f32, memory::format_tag::ba);
  const memory::desc bias_md({1, n}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc out_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  omp_set_num_threads(threads);
  dnnl::matmul prim(
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(x_md, w_md, bias_md, out_md), eng));
  std::vector<float> w2 = w;
  memory x_mem(x_md, eng, x.data()), w_mem(w_md, eng, w2.data()), b_mem(bias_md, eng, bias.data()),
      o_mem(out_md, eng, out_direct.data());
  auto direct = [&] {
    omp_set_num_threads(threads);
    ExecuteLinear(prim, stream, x_mem, w_mem, b_mem, o_mem);
    omp_set_num_threads(caller_threads);
  };
  const Blocked blocked = BlockRounds({[&] { op.Run(); }, direct}, 200, 9);
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    worst = std::max<double>(
        worst, std::fabs(out[i] - out_direct[i]) / std::max(1.0f, std::fabs(out_direct[i])));
  }
  const double bytes = static_cast<double>(n * k) * 4;
  const std::vector<double> ratio = RoundRatios(blocked.medians[0], blocked.medians[1]);
  std::printf(
      "gemv %lldx%lld by a [%lld, %lld] weight: kernel median %.1f us (%.1f GB/s of weight), "
      "direct oneDNN %.1f us (%.1f GB/s) on %d thread(s); kernel / direct, median block round "
      "%.2fx faster [min %.2f, max %.2f] (info); max relative difference %.2g\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
      static_cast<long long>(k), Quantile(blocked.all[0], 0.5) * 1e6,
      bytes / Quantile(blocked.all[0], 0.5) / 1e9, Quantile(blocked.all[1], 0.5) * 1e6,
      bytes / Quantile(blocked.all[1], 0.5) / 1e9, threads, Quantile(ratio, 0.5),
      Quantile(ratio, 0), Quantile(ratio, 1), worst);
}

// An executable of the public API whose one function has f32 inputs and
// outputs of the given shapes and the instructions `add` appends, run on
// PublicMatmul's queue. Buffers are filled with `fill`.
class PublicProgram {
 public:
  using Shapes = std::vector<std::vector<int64_t>>;
  PublicProgram(const Shapes& inputs, const Shapes& outputs,
                const std::function<void(tern_builder_t)>& add, float fill)
      : inputs_(inputs.size()), outputs_(outputs.size()) {
    tern_builder_t builder = nullptr;
    Check(tern_builder_create(nullptr, &builder), "tern_builder_create");
    Check(tern_builder_begin_function(builder, "f", nullptr), "begin_function");
    auto declare = [&](const Shapes& shapes, bool input, std::vector<tern_buffer_t>* buffers) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        const std::string name = (input ? "in" : "out") + std::to_string(i);
        const uint32_t rank = static_cast<uint32_t>(shapes[i].size());
        Check(input ? tern_builder_add_input(builder, name.c_str(), TERN_DTYPE_F32, rank,
                                             shapes[i].data(), nullptr)
                    : tern_builder_add_output(builder, name.c_str(), TERN_DTYPE_F32, rank,
                                              shapes[i].data(), nullptr),
              "declare");
        int64_t count = 1;
        for (int64_t d : shapes[i]) count *= d;
        tern_buffer_params_t params{};
        params.struct_size = sizeof(params);
        params.size = static_cast<uint64_t>(count) * 4;
        params.category = TERN_MEMORY_TENSORS;
        Check(tern_buffer_alloc(PublicMatmul::device(), &params, &(*buffers)[i]), "alloc");
        std::vector<float> values(static_cast<size_t>(count), fill);
        Check(tern_buffer_write((*buffers)[i], 0, values.data(), params.size), "write");
      }
    };
    declare(inputs, true, &inputs_);
    declare(outputs, false, &outputs_);
    add(builder);
    Check(tern_builder_end_function(builder), "end_function");
    void* data = nullptr;
    uint64_t size = 0;
    Check(tern_builder_finish(builder, &data, &size), "tern_builder_finish");
    tern_builder_destroy(builder);
    Check(tern_executable_load(PublicMatmul::device(), data, size, nullptr, &executable_),
          "executable_load");
    tern_builder_free_data(data);
  }
  ~PublicProgram() {
    for (tern_buffer_t buffer : inputs_) tern_buffer_free(buffer);
    for (tern_buffer_t buffer : outputs_) tern_buffer_free(buffer);
    tern_executable_unload(executable_);
  }
  void Run() {
    std::vector<tern_binding_t> in, out;
    for (tern_buffer_t buffer : inputs_) in.push_back({buffer, 0});
    for (tern_buffer_t buffer : outputs_) out.push_back({buffer, 0});
    Check(tern_queue_execute(PublicMatmul::queue(), executable_, 0, in.data(),
                             static_cast<uint32_t>(in.size()), out.data(),
                             static_cast<uint32_t>(out.size()), nullptr),
          "tern_queue_execute");
    Check(tern_queue_synchronize(PublicMatmul::queue(), TERN_TIMEOUT_INFINITE),
          "tern_queue_synchronize");
  }

 private:
  std::vector<tern_buffer_t> inputs_, outputs_;
  tern_executable_t executable_ = nullptr;
};

// Appends one instruction on f32 operands (segment, index, shape) each.
void AddF32(tern_builder_t builder, tern_opcode_t opcode,
            const std::vector<std::pair<tern_segment_t, uint32_t>>& places,
            const std::vector<int64_t>& shape) {
  std::vector<tern_operand_t> operands(places.size());
  for (size_t i = 0; i < places.size(); ++i) {
    operands[i].segment = places[i].first;
    operands[i].index = places[i].second;
    operands[i].dtype = TERN_DTYPE_F32;
    operands[i].rank = static_cast<uint32_t>(shape.size());
    operands[i].shape = shape.data();
  }
  tern_instruction_t ins{};
  ins.struct_size = sizeof(ins);
  ins.opcode = opcode;
  ins.operand_count = static_cast<uint32_t>(operands.size());
  ins.operands = operands.data();
  Check(tern_builder_add_instruction(builder, &ins), "add_instruction");
}

// A copy of `copy_bytes` on the DMA engine and an n x n f32 matmul on the
// tensor engine, alone and in one execution whose two streams nothing
// orders (they touch different tensors).
void BenchOverlap(int64_t n, int64_t copy_bytes) {
  const std::vector<int64_t> square = {n, n}, line = {copy_bytes / 4};
  auto add_matmul = [&](tern_builder_t builder, uint32_t first_input) {
    AddF32(builder, TERN_OP_MATMUL,
           {{TERN_SEGMENT_OUTPUT, 0},
            {TERN_SEGMENT_INPUT, first_input},
            {TERN_SEGMENT_INPUT, first_input + 1}},
           square);
  };
  auto add_copy = [&](tern_builder_t builder, uint32_t output) {
    AddF32(builder, TERN_OP_COPY, {{TERN_SEGMENT_OUTPUT, output}, {TERN_SEGMENT_INPUT, 0}}, line);
  };
  PublicProgram copy(
      {line}, {line}, [&](tern_builder_t b) { add_copy(b, 0); }, 1.0f);
  PublicProgram matmul(
      {square, square}, {square}, [&](tern_builder_t b) { add_matmul(b, 0); }, 0.5f);
  PublicProgram both(
      {line, square, square}, {square, line},
      [&](tern_builder_t b) {
        add_matmul(b, 1);
        add_copy(b, 1);
      },
      0.5f);
  const Timed t =
      Rounds({[&] { copy.Run(); }, [&] { matmul.Run(); }, [&] { both.Run(); }}, 10, 3.0);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  sched_getaffinity(0, sizeof(cpus), &cpus);
  const int threads = tern::sim::KernelThreadsForHost(), host_cpus = CPU_COUNT(&cpus);
  std::printf("overlap: the compute kernels use %d threads on %d CPUs: %s\n", threads, host_cpus,
              threads < host_cpus
                  ? "a CPU is free, the DMA engine runs beside them"
                  : "no CPU is free, the DMA engine takes turns with them (docs/sim.md); "
                    "run with TERN_SIM_KERNEL_THREADS below the CPU count to see the "
                    "overlap");
  std::vector<double> sum_ratio, max_ratio;
  for (size_t r = 0; r < t.times[2].size(); ++r) {
    sum_ratio.push_back(t.times[2][r] / (t.times[0][r] + t.times[1][r]));
    max_ratio.push_back(t.times[2][r] / std::max(t.times[0][r], t.times[1][r]));
  }
  std::printf(
      "overlap: copy %lld MiB alone %.0f us, matmul f32 %lld alone %.0f us, both in one "
      "execution %.0f us (medians, n=%zu)\n"
      "  both / (copy + matmul), median round %.2f [p10 %.2f, p90 %.2f]  (1.00: no overlap)\n"
      "  both / max(copy, matmul), median round %.2f [p10 %.2f, p90 %.2f]  (1.00: full "
      "overlap)\n",
      static_cast<long long>(copy_bytes >> 20), Quantile(t.times[0], 0.5) * 1e6,
      static_cast<long long>(n), Quantile(t.times[1], 0.5) * 1e6, Quantile(t.times[2], 0.5) * 1e6,
      t.times[2].size(), Quantile(sum_ratio, 0.5), Quantile(sum_ratio, 0.1),
      Quantile(sum_ratio, 0.9), Quantile(max_ratio, 0.5), Quantile(max_ratio, 0.1),
      Quantile(max_ratio, 0.9));
}

// The MLP of examples/mlp_gen.c (y = relu(x W1 + b1) W2 + b2, f32, two
// matmuls on the Tensor engine and the relu on the Scalar engine ordered by
// semaphores) run from C through the public API, beside the same work as
// direct oneDNN calls on this thread: two matmul primitives with their bias
// and the same relu loop, primitives and memory objects made once (what a
// hand-written program would do). The direct side runs with as many OpenMP
// threads as the runtime's kernel pool has (KernelThreadsForHost). Target: the
// execution at most 1.15x the direct calls; the first execution of a freshly
// loaded executable at most 3x a warm one.
void BenchMlp(int64_t batch, int64_t in, int64_t hidden, int64_t out) {
  std::mt19937 rng(3);
  std::vector<float> x = UniformFloats(rng, batch * in, 1.0f);
  std::vector<float> w1 = UniformFloats(rng, in * hidden, 0.1f);
  std::vector<float> b1 = UniformFloats(rng, hidden, 0.1f);
  std::vector<float> w2 = UniformFloats(rng, hidden * out, 0.1f);
  std::vector<float> b2 = UniformFloats(rng, out, 0.1f);
  std::vector<float> h(batch * hidden), y_direct(batch * out), y_exec(batch * out);

  // The executable, built as mlp_gen builds it.
  const int64_t x_shape[2] = {batch, in}, h_shape[2] = {batch, hidden}, y_shape[2] = {batch, out};
  const int64_t w1_shape[2] = {in, hidden}, b1_shape[1] = {hidden};
  const int64_t w2_shape[2] = {hidden, out}, b2_shape[1] = {out};
  tern_builder_t builder = nullptr;
  Check(tern_builder_create(nullptr, &builder), "tern_builder_create");
  uint64_t w1_at = 0, b1_at = 0, w2_at = 0, b2_at = 0;
  Check(tern_builder_add_constants(builder, w1.data(), w1.size() * 4, 64, &w1_at), "constants");
  Check(tern_builder_add_constants(builder, b1.data(), b1.size() * 4, 64, &b1_at), "constants");
  Check(tern_builder_add_constants(builder, w2.data(), w2.size() * 4, 64, &w2_at), "constants");
  Check(tern_builder_add_constants(builder, b2.data(), b2.size() * 4, 64, &b2_at), "constants");
  Check(tern_builder_begin_function(builder, "mlp", nullptr), "begin_function");
  Check(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, x_shape, nullptr), "add_input");
  Check(tern_builder_add_output(builder, "y", TERN_DTYPE_F32, 2, y_shape, nullptr), "add_output");
  Check(tern_builder_set_scratch(builder, h.size() * 4), "set_scratch");
  auto tensor = [](tern_segment_t segment, uint64_t offset, uint32_t rank, const int64_t* shape) {
    tern_operand_t t{};
    t.segment = segment;
    t.offset = offset;
    t.dtype = TERN_DTYPE_F32;
    t.rank = rank;
    t.shape = shape;
    return t;
  };
  auto add = [&](tern_opcode_t opcode, std::vector<tern_operand_t> operands,
                 std::vector<int64_t> ints) {
    tern_instruction_t ins{};
    ins.struct_size = sizeof(ins);
    ins.opcode = opcode;
    ins.operand_count = static_cast<uint32_t>(operands.size());
    ins.operands = operands.data();
    ins.int_count = static_cast<uint32_t>(ints.size());
    ins.ints = ints.data();
    Check(tern_builder_add_instruction(builder, &ins), "add_instruction");
  };
  add(TERN_OP_MATMUL,
      {tensor(TERN_SEGMENT_SCRATCH, 0, 2, h_shape), tensor(TERN_SEGMENT_INPUT, 0, 2, x_shape),
       tensor(TERN_SEGMENT_CONSTANT, w1_at, 2, w1_shape),
       tensor(TERN_SEGMENT_CONSTANT, b1_at, 1, b1_shape)},
      {});
  add(TERN_OP_SEM_SIGNAL, {}, {0, 1, TERN_ENGINE_TENSOR});
  add(TERN_OP_SEM_WAIT, {}, {0, 1, TERN_ENGINE_SCALAR});
  add(TERN_OP_UNARY,
      {tensor(TERN_SEGMENT_SCRATCH, 0, 2, h_shape), tensor(TERN_SEGMENT_SCRATCH, 0, 2, h_shape)},
      {TERN_UNARY_RELU});
  add(TERN_OP_SEM_SIGNAL, {}, {1, 1, TERN_ENGINE_SCALAR});
  add(TERN_OP_SEM_WAIT, {}, {1, 1, TERN_ENGINE_TENSOR});
  add(TERN_OP_MATMUL,
      {tensor(TERN_SEGMENT_OUTPUT, 0, 2, y_shape), tensor(TERN_SEGMENT_SCRATCH, 0, 2, h_shape),
       tensor(TERN_SEGMENT_CONSTANT, w2_at, 2, w2_shape),
       tensor(TERN_SEGMENT_CONSTANT, b2_at, 1, b2_shape)},
      {});
  Check(tern_builder_end_function(builder), "end_function");
  void* image = nullptr;
  uint64_t image_size = 0;
  Check(tern_builder_finish(builder, &image, &image_size), "tern_builder_finish");
  tern_builder_destroy(builder);

  tern_device_t device = PublicMatmul::device();
  tern_queue_t queue = PublicMatmul::queue();
  tern_buffer_params_t params{};
  params.struct_size = sizeof(params);
  params.category = TERN_MEMORY_TENSORS;
  tern_buffer_t x_buffer = nullptr, y_buffer = nullptr;
  params.size = x.size() * 4;
  Check(tern_buffer_alloc(device, &params, &x_buffer), "alloc");
  params.size = y_exec.size() * 4;
  Check(tern_buffer_alloc(device, &params, &y_buffer), "alloc");
  Check(tern_buffer_write(x_buffer, 0, x.data(), x.size() * 4), "tern_buffer_write");
  const tern_binding_t inputs[1] = {{x_buffer, 0}};
  const tern_binding_t outputs[1] = {{y_buffer, 0}};
  auto execute = [&](tern_executable_t executable) {
    Check(tern_queue_execute(queue, executable, 0, inputs, 1, outputs, 1, nullptr),
          "tern_queue_execute");
    Check(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  };

  // First executions: a fresh load each time, its first execution timed.
  // Alternated with the control: right after a load of another copy, an
  // execution of an executable this queue has already run. A load leaves
  // the queue idle long enough for its thread (and the kernel pool's) to
  // sleep, so both pay the wake-ups; what the first execution costs beyond
  // the control is the new executable's own.
  std::vector<double> first, after_load;
  tern_executable_t executable = nullptr;
  Check(tern_executable_load(device, image, image_size, nullptr, &executable), "executable_load");
  for (int i = 0; i < 10; ++i) {
    tern_executable_t fresh = nullptr;
    Check(tern_executable_load(device, image, image_size, nullptr, &fresh), "executable_load");
    const bool control = i % 2 == 1;
    const double t0 = WallSeconds();
    execute(control ? executable : fresh);
    (control ? after_load : first).push_back(WallSeconds() - t0);
    tern_executable_unload(fresh);
    // The control runs an executable this queue has run before.
    if (i == 0) execute(executable);
  }
  tern_builder_free_data(image);

  // The direct side.
  using dnnl::memory;
  // The direct calls get as many threads as tern's kernels (the kernel pool).
  const int threads = tern::sim::KernelThreadsForHost();
  const int caller_threads = omp_get_max_threads();
  omp_set_num_threads(threads);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  auto md = [](int64_t rows, int64_t cols) {
    return memory::desc({rows, cols}, memory::data_type::f32, memory::format_tag::ab);
  };
  auto bias_md = [](int64_t cols) {
    return memory::desc({1, cols}, memory::data_type::f32, memory::format_tag::ab);
  };
  dnnl::matmul fc1(dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(md(batch, in), md(in, hidden), bias_md(hidden), md(batch, hidden)), eng));
  dnnl::matmul fc2(dnnl::matmul::primitive_desc(
      dnnl::matmul::desc(md(batch, hidden), md(hidden, out), bias_md(out), md(batch, out)), eng));
  memory x_mem(md(batch, in), eng, x.data()), w1_mem(md(in, hidden), eng, w1.data()),
      b1_mem(bias_md(hidden), eng, b1.data()), h_mem(md(batch, hidden), eng, h.data()),
      w2_mem(md(hidden, out), eng, w2.data()), b2_mem(bias_md(out), eng, b2.data()),
      y_mem(md(batch, out), eng, y_direct.data());
  auto direct = [&] {
    omp_set_num_threads(threads);
    ExecuteLinear(fc1, stream, x_mem, w1_mem, b1_mem, h_mem);
    for (float& v : h) v = v < 0.0f ? 0.0f : v;
    ExecuteLinear(fc2, stream, h_mem, w2_mem, b2_mem, y_mem);
    omp_set_num_threads(caller_threads);
  };
  // The three instructions' kernels called directly on this thread
  // (RunInstruction on host buffers): the engines' share of the difference.
  std::vector<float> h_kernels(h.size()), y_kernels(y_exec.size());
  Op fc1_op(TERN_OP_MATMUL,
            {Desc(TERN_DTYPE_F32, {batch, hidden}), Desc(TERN_DTYPE_F32, {batch, in}),
             Desc(TERN_DTYPE_F32, {in, hidden}), Desc(TERN_DTYPE_F32, {hidden})},
            {h_kernels.data(), x.data(), w1.data(), b1.data()});
  Op relu_op(TERN_OP_UNARY,
             {Desc(TERN_DTYPE_F32, {batch, hidden}), Desc(TERN_DTYPE_F32, {batch, hidden})},
             {h_kernels.data(), h_kernels.data()}, {TERN_UNARY_RELU});
  Op fc2_op(TERN_OP_MATMUL,
            {Desc(TERN_DTYPE_F32, {batch, out}), Desc(TERN_DTYPE_F32, {batch, hidden}),
             Desc(TERN_DTYPE_F32, {hidden, out}), Desc(TERN_DTYPE_F32, {out})},
            {y_kernels.data(), h_kernels.data(), w2.data(), b2.data()});
  // The weights are constants of the executable (as in mlp_gen.c): prepared
  // as loading it prepares them.
  fc1_op.PrepareWithConstant(2);
  fc2_op.PrepareWithConstant(2);
  auto kernels = [&] {
    omp_set_num_threads(threads);
    fc1_op.Run();
    relu_op.Run();
    fc2_op.Run();
    omp_set_num_threads(caller_threads);
  };
  // The target's figure: blocks of back-to-back calls, each contender after
  // the others' helper threads went quiet (BlockRounds). Call by call, the
  // direct side's OpenMP worker spins on one of the CPUs through the
  // execution's calls (libgomp's default spin is milliseconds), which a
  // program running only executions never meets: that figure is printed too.
  const std::function<void()> execution = [&] { execute(executable); };
  constexpr int kCallsPerBlock = 100;
  const Blocked blocked = BlockRounds({execution, direct, kernels}, kCallsPerBlock, 15);
  Check(tern_buffer_read(y_buffer, 0, y_exec.data(), y_exec.size() * 4), "tern_buffer_read");
  double worst = 0;
  for (size_t i = 0; i < y_exec.size(); ++i) {
    worst = std::max<double>(worst, std::fabs(y_exec[i] - y_direct[i]));
  }
  const double warm = Quantile(blocked.all[0], 0.5);
  if (std::getenv("TERN_BENCH_BLOCKS") != nullptr) {
    for (size_t r = 0; r < blocked.medians[0].size(); ++r) {
      std::printf("block round %zu: execution %.1f us, direct %.1f us, kernels %.1f us\n", r,
                  blocked.medians[0][r] * 1e6, blocked.medians[1][r] * 1e6,
                  blocked.medians[2][r] * 1e6);
    }
  }
  const std::vector<double> slowdown = RoundRatios(blocked.medians[1], blocked.medians[0]);
  const double median_slowdown = Quantile(slowdown, 0.5);
  std::printf(
      "mlp %lldx%lld->%lld->%lld from C: execution median %.1f us (best %.1f), direct oneDNN "
      "median %.1f us (best %.1f) on %d thread(s), blocks of %d back-to-back calls; execution "
      "/ direct median block round %.2f [min %.2f, max %.2f] n=%zu (target <= 1.15)%s; max "
      "|difference| %.2g; waited at most %.0f ms for other threads to go quiet\n",
      static_cast<long long>(batch), static_cast<long long>(in), static_cast<long long>(hidden),
      static_cast<long long>(out), warm * 1e6, Best(blocked.all[0]) * 1e6,
      Quantile(blocked.all[1], 0.5) * 1e6, Best(blocked.all[1]) * 1e6, threads, kCallsPerBlock,
      median_slowdown, Quantile(slowdown, 0), Quantile(slowdown, 1), slowdown.size(),
      median_slowdown <= 1.15 ? "  ok" : "  MISSED", worst, blocked.settle_max * 1e3);
  if (median_slowdown > 1.15) missed.push_back("mlp from C");
  const std::vector<double> kernel_slowdown = RoundRatios(blocked.medians[1], blocked.medians[2]);
  std::printf(
      "mlp kernels alone (RunInstruction on this thread): median %.1f us, %.2fx direct (median "
      "block round) (info)\n",
      Quantile(blocked.all[2], 0.5) * 1e6, Quantile(kernel_slowdown, 0.5));
  const Timed t = Rounds({execution, direct}, 200, 1.0, 20000);
  const std::vector<double> call_slowdown = RoundRatios(t.times[1], t.times[0]);
  std::printf(
      "mlp interleaved call by call (the direct side's OpenMP worker still spinning through the "
      "execution's calls): execution median %.1f us, direct %.1f us, median round %.2f (info)\n",
      Quantile(t.times[0], 0.5) * 1e6, Quantile(t.times[1], 0.5) * 1e6,
      Quantile(call_slowdown, 0.5));
  // first[0] is the process's first execution: it pays for whatever no load
  // did (the later loads also find the primitives cached).
  const double worst_first = *std::max_element(first.begin(), first.end());
  auto list = [](const std::vector<double>& times) {
    std::string each;
    for (double f : times) each += fmt::format("{}{:.1f}", each.empty() ? "" : " ", f * 1e6);
    return each;
  };
  std::printf(
      "mlp first execution after a load: %.1f us the process's first execution, %.1f us median "
      "of 5 loads (each: %s us); the worst %.1fx the warm median (target <= 3)%s\n",
      first[0] * 1e6, Quantile(first, 0.5) * 1e6, list(first).c_str(), worst_first / warm,
      worst_first / warm <= 3 ? "  ok" : "  MISSED");
  std::printf(
      "mlp control: an executable the queue has run, right after a load (the same idle "
      "queue): %.1f us median (each: %s us); first execution / control, median %.2f (info)\n",
      Quantile(after_load, 0.5) * 1e6, list(after_load).c_str(),
      Quantile(first, 0.5) / Quantile(after_load, 0.5));
  if (worst_first / warm > 3) missed.push_back("mlp first execution");
  tern_executable_unload(executable);
  tern_buffer_free(x_buffer);
  tern_buffer_free(y_buffer);
}

// memcpy of `bytes` on `threads` (all of them split the range).
void Memcpy(uint8_t* dst, const uint8_t* src, size_t bytes, int threads) {
  if (threads == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const size_t t = omp_get_thread_num(), count = omp_get_num_threads();
    const size_t begin = bytes * t / count, end = bytes * (t + 1) / count;
    std::memcpy(dst + begin, src + begin, end - begin);
  }
}

void BenchElementwise(int64_t n) {
  std::vector<float> a(n), b(n), out(n);
  std::mt19937 rng(2);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = std::uniform_real_distribution<float>(-4, 4)(rng);
    b[i] = std::uniform_real_distribution<float>(-4, 4)(rng);
  }
  Op add(TERN_OP_BINARY,
         {Desc(TERN_DTYPE_F32, {n}), Desc(TERN_DTYPE_F32, {n}), Desc(TERN_DTYPE_F32, {n})},
         {out.data(), a.data(), b.data()}, {TERN_BINARY_ADD});
  Op gelu(TERN_OP_UNARY, {Desc(TERN_DTYPE_F32, {n}), Desc(TERN_DTYPE_F32, {n})},
          {out.data(), a.data()}, {TERN_UNARY_GELU});
  const int threads = tern::sim::KernelThreadsForHost();
  // memcpy buffers big enough for the add's 3 * 4n bytes moved (1.5 * 4n copied).
  std::vector<uint8_t> src(n * 6), dst(n * 6);
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 0, dst.size());
  struct Case {
    const char* name;
    Op* op;
    double bytes;  // read + written
  } cases[] = {{"add f32", &add, 12.0 * n}, {"gelu f32", &gelu, 8.0 * n}};
  for (const Case& c : cases) {
    const size_t copy = static_cast<size_t>(c.bytes / 2);
    // Contenders: the kernel on all threads, memcpy on one thread and split
    // over all threads; a round's baseline is the faster memcpy of the round.
    const Timed t = Rounds({[&] { c.op->Run(); }, [&] { Memcpy(dst.data(), src.data(), copy, 1); },
                            [&] { Memcpy(dst.data(), src.data(), copy, threads); }},
                           10, 2.0);
    std::vector<double> base(t.times[1].size());
    for (size_t r = 0; r < base.size(); ++r) base[r] = std::min(t.times[1][r], t.times[2][r]);
    char what[64];
    std::printf("  (memcpy of the same bytes, best: %.1f GB/s on 1 thread, %.1f GB/s on %d)\n",
                c.bytes / Best(t.times[1]) / 1e9, c.bytes / Best(t.times[2]) / 1e9, threads);
    std::snprintf(what, sizeof(what), "%s %lldM", c.name, static_cast<long long>(n >> 20));
    Report(what, c.bytes, "GB/s", t.times[0], base, 0.7);
    // The same on one core in CPU time, which a loaded machine distorts less.
    const Timed cpu = Rounds({[&] {
                                tern::sim::SetKernelThreadsForTesting(1);
                                c.op->Run();
                                tern::sim::SetKernelThreadsForTesting(0);
                              },
                              [&] { std::memcpy(dst.data(), src.data(), copy); }},
                             10, 1.0, 400, ThreadCpuSeconds);
    std::snprintf(what, sizeof(what), "%s %lldM 1 core CPU", c.name,
                  static_cast<long long>(n >> 20));
    Report(what, c.bytes, "GB/s", cpu.times[0], cpu.times[1], 0.0);
  }
}

// Every f32 unary function (inputs in a range where it is defined) on one
// core in CPU time, beside memcpy of the same bytes.
void BenchUnary(int64_t n) {
  std::vector<float> in(n), out(n);
  std::vector<uint8_t> src(n * 4), dst(n * 4);
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 0, dst.size());
  const double bytes = 8.0 * n;
  const double copy_cpu = BestCpuTime([&] { std::memcpy(dst.data(), src.data(), n * 4); }, 10);
  std::printf("unary f32 %lldM on 1 core (CPU time); memcpy of the same bytes: %.1f GB/s\n",
              static_cast<long long>(n >> 20), bytes / copy_cpu / 1e9);
  tern::sim::SetKernelThreadsForTesting(1);
  for (int64_t fn = 0; fn < TERN_UNARY_COUNT; ++fn) {
    if (fn == TERN_UNARY_BITWISE_NOT) continue;  // integers only
    // Arguments inside every function's domain: (0, 1) for asin/acos/log,
    // (-4, 4) otherwise.
    const bool unit = fn == TERN_UNARY_ASIN || fn == TERN_UNARY_ACOS || fn == TERN_UNARY_LOG ||
                      fn == TERN_UNARY_LOG2 || fn == TERN_UNARY_LOG1P || fn == TERN_UNARY_SQRT ||
                      fn == TERN_UNARY_RSQRT;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(unit ? 0.001f : -4.0f, unit ? 0.999f : 4.0f);
    for (int64_t i = 0; i < n; ++i) in[i] = dist(rng);
    std::vector<double> floats;
    if (fn == TERN_UNARY_CLAMP) floats = {-1.0, 1.0};
    if (fn == TERN_UNARY_POW_SCALAR) floats = {1.5};
    if (fn == TERN_UNARY_AFFINE) floats = {2.0, 1.0};
    const tern_dtype_t odt =
        fn == TERN_UNARY_ISNAN || fn == TERN_UNARY_LOGICAL_NOT ? TERN_DTYPE_BOOL : TERN_DTYPE_F32;
    Op op(TERN_OP_UNARY, {Desc(odt, {n}), Desc(TERN_DTYPE_F32, {n})}, {out.data(), in.data()}, {fn},
          floats);
    const double ours = BestCpuTime([&] { op.Run(); }, 5);
    std::printf("  %-12s %7.1f GB/s  ratio %.2f\n", tern::isa::UnaryFnName(fn), bytes / ours / 1e9,
                copy_cpu / ours);
  }
  tern::sim::SetKernelThreadsForTesting(0);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, matmul = true, elementwise = true, unary = false, overlap = true, mlp = true,
       gemv = true;
  int64_t only_size = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
      only_size = std::atoll(argv[++i]);
      elementwise = overlap = mlp = gemv = false;
    } else if (std::strcmp(argv[i], "--matmul") == 0) {
      elementwise = overlap = mlp = gemv = false;
    } else if (std::strcmp(argv[i], "--elementwise") == 0) {
      matmul = overlap = mlp = gemv = false;
    } else if (std::strcmp(argv[i], "--unary") == 0) {
      matmul = elementwise = overlap = mlp = gemv = false;
      unary = true;
    } else if (std::strcmp(argv[i], "--overlap") == 0) {
      matmul = elementwise = mlp = gemv = false;
    } else if (std::strcmp(argv[i], "--mlp") == 0) {
      matmul = elementwise = overlap = gemv = false;
    } else if (std::strcmp(argv[i], "--gemv") == 0) {
      matmul = elementwise = overlap = mlp = false;
    } else {
      std::fprintf(
          stderr,
          "usage: %s [--quick] [--matmul | --size N | --elementwise | --unary | --overlap | "
          "--mlp | --gemv]\n",
          argv[0]);
      return 2;
    }
  }
  tern::bench::PrintMachine(stdout, /*pin_copy_strategy=*/true);
  std::printf("tern simulated-engine kernels, %d threads (the kernel pool)\n",
              tern::sim::KernelThreadsForHost());
  const std::vector<int64_t> sizes = only_size > 0 ? std::vector<int64_t>{only_size}
                                     : quick       ? std::vector<int64_t>{256}
                                                   : std::vector<int64_t>{512, 1024, 2048, 4096};
  if (matmul || overlap || mlp) PublicMatmul::Init();
  if (matmul) {
    for (tern_dtype_t dtype : {TERN_DTYPE_F32, TERN_DTYPE_BF16}) {
      for (int64_t n : sizes) BenchMatmul(dtype, n);
    }
  }
  if (overlap) BenchOverlap(quick ? 256 : 1024, quick ? (int64_t{4} << 20) : (int64_t{64} << 20));
  if (mlp) BenchMlp(16, 256, 512, 10);
  if (gemv) {
    BenchGemv(1, 512, 1024);
    BenchGemv(1, 1024, 512);
    if (!quick) {
      BenchGemv(1, 768, 3072);
      BenchGemv(4, 1024, 4096);
    }
  }
  if (matmul || overlap || mlp) PublicMatmul::Shutdown();
  if (elementwise) BenchElementwise(quick ? (int64_t{1} << 20) : (int64_t{16} << 20));
  if (unary) BenchUnary(quick ? (int64_t{1} << 20) : (int64_t{4} << 20));
  if (missed.empty()) std::printf("all targets met\n");
  for (const std::string& row : missed) std::printf("target missed: %s\n", row.c_str());
  return 0;
}
