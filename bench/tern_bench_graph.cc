// tern_bench_graph: what a command costs when a recorded graph replays it,
// beside submitting the same command directly, for sequences of 1, 10 and
// 100 executions of a small executable (z = x + y over 32 floats).
//
// For each length n, rounds alternate (direct, replay, replay with
// arguments, direct, ...) in this one process, because the speed of a
// shared or virtual machine drifts over seconds. Each side of a round runs
// its n commands `reps` times and measures two figures per command:
//   submit   the time the calling thread spends in the API (n calls of
//            tern_queue_execute, or one tern_queue_launch_graph), / n;
//   total    submission plus tern_queue_synchronize, / n: what a caller
//            waits for per command when the engine is the bottleneck.
// "replay+args" launches a graph whose n executions each have their output
// marked as a parameter, rebinding all n of them at every launch.
// Medians over the rounds are printed, with replay/direct ratios. The
// target (docs/runtime.md): for 100 executions, replay's submit cost per
// command at most 0.3x direct submission's. A missed target is reported, not
// an error (exit 2 only with --fail-on-miss); a failed call exits 1.
//
// Uses the public C API only.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "machine_report.h"
#include "tern/tern.h"

namespace {

constexpr double kTargetRatio = 0.3;  // replay / direct, submit cost, 100 executions
const int64_t kShape[2] = {4, 8};
constexpr uint64_t kTensorBytes = 32 * sizeof(float);

struct TernFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void Check(tern_status_t status, const char* what) {
  if (status != TERN_OK) {
    throw TernFailure(std::string(what) + " failed: " + tern_status_string(status) + ": " +
                      tern_last_error_message());
  }
}

double NowNs() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

tern_operand_t Operand(tern_segment_t segment, uint32_t index) {
  tern_operand_t operand;
  std::memset(&operand, 0, sizeof(operand));
  operand.segment = segment;
  operand.index = index;
  operand.dtype = TERN_DTYPE_F32;
  operand.rank = 2;
  operand.shape = kShape;
  return operand;
}

// z = x + y, f32 [4, 8].
tern_executable_t LoadAdd(tern_device_t device) {
  tern_builder_t builder = nullptr;
  Check(tern_builder_create(nullptr, &builder), "tern_builder_create");
  Check(tern_builder_begin_function(builder, "add", nullptr), "tern_builder_begin_function");
  Check(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, kShape, nullptr), "add_input x");
  Check(tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, kShape, nullptr), "add_input y");
  Check(tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, kShape, nullptr), "add_output");
  const tern_operand_t operands[3] = {Operand(TERN_SEGMENT_OUTPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 1)};
  const int64_t ints[1] = {TERN_BINARY_ADD};
  tern_instruction_t instruction;
  std::memset(&instruction, 0, sizeof(instruction));
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_BINARY;
  instruction.operand_count = 3;
  instruction.operands = operands;
  instruction.int_count = 1;
  instruction.ints = ints;
  Check(tern_builder_add_instruction(builder, &instruction), "tern_builder_add_instruction");
  Check(tern_builder_end_function(builder), "tern_builder_end_function");
  void* data = nullptr;
  uint64_t size = 0;
  Check(tern_builder_finish(builder, &data, &size), "tern_builder_finish");
  tern_executable_t executable = nullptr;
  const tern_status_t status = tern_executable_load(device, data, size, nullptr, &executable);
  tern_builder_free_data(data);
  Check(tern_builder_destroy(builder), "tern_builder_destroy");
  Check(status, "tern_executable_load");
  return executable;
}

struct Setup {
  tern_device_t device = nullptr;
  tern_core_t core = nullptr;
  tern_queue_t queue = nullptr;
  tern_executable_t add = nullptr;
  tern_buffer_t x = nullptr, y = nullptr, z = nullptr;
  tern_buffer_t outputs = nullptr;  // 100 output slots, for the arguments
};

// One sequence length's graphs: recorded bindings, and every output a parameter.
struct Graphs {
  tern_graph_t plain = nullptr;
  tern_graph_t parameterized = nullptr;
  std::vector<tern_graph_argument_t> arguments;
  tern_graph_launch_params_t params;
};

Graphs Record(const Setup& s, uint32_t n) {
  Graphs g;
  const tern_binding_t inputs[2] = {{s.x, 0}, {s.y, 0}};
  const tern_binding_t outputs[1] = {{s.z, 0}};
  Check(tern_graph_create(s.device, nullptr, &g.plain), "tern_graph_create");
  Check(tern_graph_create(s.device, nullptr, &g.parameterized), "tern_graph_create");
  for (uint32_t i = 0; i < n; ++i) {
    Check(tern_graph_add_execute(g.plain, s.add, 0, inputs, 2, outputs, 1, nullptr),
          "tern_graph_add_execute");
    uint32_t command = 0, parameter = 0;
    Check(tern_graph_add_execute(g.parameterized, s.add, 0, inputs, 2, outputs, 1, &command),
          "tern_graph_add_execute");
    Check(tern_graph_add_parameter(g.parameterized, command, TERN_GRAPH_OPERAND_OUTPUT, 0,
                                   &parameter),
          "tern_graph_add_parameter");
    tern_graph_argument_t argument;
    std::memset(&argument, 0, sizeof(argument));
    argument.parameter = parameter;
    argument.buffer = s.outputs;
    argument.offset = i * kTensorBytes;
    g.arguments.push_back(argument);
  }
  Check(tern_graph_finalize(g.plain), "tern_graph_finalize");
  Check(tern_graph_finalize(g.parameterized), "tern_graph_finalize");
  std::memset(&g.params, 0, sizeof(g.params));
  g.params.struct_size = sizeof(g.params);
  g.params.argument_count = n;
  g.params.arguments = g.arguments.data();
  return g;
}

struct Sample {
  double submit_ns = 0;  // per command
  double total_ns = 0;   // per command
};

enum class Mode { kDirect, kReplay, kReplayArgs };

// Runs n commands `reps` times in `mode`; returns the per-command figures.
Sample Measure(const Setup& s, const Graphs& g, Mode mode, uint32_t n, uint32_t reps) {
  const tern_binding_t inputs[2] = {{s.x, 0}, {s.y, 0}};
  const tern_binding_t outputs[1] = {{s.z, 0}};
  double submit = 0;
  const double start = NowNs();
  for (uint32_t r = 0; r < reps; ++r) {
    const double t0 = NowNs();
    switch (mode) {
      case Mode::kDirect:
        for (uint32_t i = 0; i < n; ++i) {
          Check(tern_queue_execute(s.queue, s.add, 0, inputs, 2, outputs, 1, nullptr),
                "tern_queue_execute");
        }
        break;
      case Mode::kReplay:
        Check(tern_queue_launch_graph(s.queue, g.plain, nullptr, nullptr),
              "tern_queue_launch_graph");
        break;
      case Mode::kReplayArgs:
        Check(tern_queue_launch_graph(s.queue, g.parameterized, &g.params, nullptr),
              "tern_queue_launch_graph");
        break;
    }
    submit += NowNs() - t0;
    Check(tern_queue_synchronize(s.queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize");
  }
  const double total = NowNs() - start;
  const double commands = static_cast<double>(n) * reps;
  return Sample{submit / commands, total / commands};
}

int Run(bool quick, bool fail_on_miss) {
  tern::bench::PrintMachine(stdout, /*pin_copy_strategy=*/true);
  Check(tern_init(nullptr), "tern_init");
  Setup s;
  Check(tern_device_get(0, &s.device), "tern_device_get(0)");
  Check(tern_core_open(s.device, 0, &s.core), "tern_core_open");
  Check(tern_queue_create(s.core, nullptr, &s.queue), "tern_queue_create");
  s.add = LoadAdd(s.device);
  tern_buffer_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.size = kTensorBytes;
  params.category = TERN_MEMORY_TENSORS;
  Check(tern_buffer_alloc(s.device, &params, &s.x), "tern_buffer_alloc");
  Check(tern_buffer_alloc(s.device, &params, &s.y), "tern_buffer_alloc");
  Check(tern_buffer_alloc(s.device, &params, &s.z), "tern_buffer_alloc");
  params.size = 100 * kTensorBytes;
  Check(tern_buffer_alloc(s.device, &params, &s.outputs), "tern_buffer_alloc");
  std::vector<float> values(32, 1.0f);
  Check(tern_buffer_write(s.x, 0, values.data(), kTensorBytes), "tern_buffer_write");
  Check(tern_buffer_write(s.y, 0, values.data(), kTensorBytes), "tern_buffer_write");

  std::printf("tern_bench_graph%s: driver %s, %u CPUs\n",
              quick ? " --quick (smoke test: figures are not meaningful)" : "", tern_driver_name(),
              std::thread::hardware_concurrency());
  std::printf("per command, median of %s rounds (ns; ratio = replay / direct)\n",
              quick ? "3" : "25");
  std::printf("%5s | %9s %9s %9s %6s %6s | %9s %9s %9s %6s %6s\n", "n", "direct", "replay",
              "rp+args", "ratio", "r+args", "direct", "replay", "rp+args", "ratio", "r+args");
  std::printf("%5s | %-46s | %-46s\n", "", "submit (caller's time in the API)",
              "total (submit + synchronize)");

  bool missed = false;
  const uint32_t rounds = quick ? 3 : 25;
  for (uint32_t n : {1u, 10u, 100u}) {
    Graphs g = Record(s, n);
    // About 2000 commands per measurement, at least 20 repetitions.
    const uint32_t reps = quick ? 2 : std::max(20u, 2000u / n);
    std::vector<double> submit[3], total[3];
    const Mode modes[3] = {Mode::kDirect, Mode::kReplay, Mode::kReplayArgs};
    for (const Mode mode : modes) (void)Measure(s, g, mode, n, 2);  // warm-up
    for (uint32_t round = 0; round < rounds; ++round) {
      for (int m = 0; m < 3; ++m) {
        // Alternate the order so that no mode always follows another.
        const int which = round % 2 == 0 ? m : 2 - m;
        const Sample sample = Measure(s, g, modes[which], n, reps);
        submit[which].push_back(sample.submit_ns);
        total[which].push_back(sample.total_ns);
      }
    }
    double ms[3], mt[3];
    for (int m = 0; m < 3; ++m) {
      ms[m] = Median(submit[m]);
      mt[m] = Median(total[m]);
    }
    std::printf("%5u | %9.0f %9.0f %9.0f %6.3f %6.3f | %9.0f %9.0f %9.0f %6.3f %6.3f\n", n, ms[0],
                ms[1], ms[2], ms[1] / ms[0], ms[2] / ms[0], mt[0], mt[1], mt[2], mt[1] / mt[0],
                mt[2] / mt[0]);
    if (n == 100 && ms[1] / ms[0] > kTargetRatio) missed = true;
    Check(tern_graph_destroy(g.plain), "tern_graph_destroy");
    Check(tern_graph_destroy(g.parameterized), "tern_graph_destroy");
  }
  std::printf("\ntarget: replay of 100 executions, submit cost per command <= %.1fx direct: %s\n",
              kTargetRatio, missed ? "MISSED" : "met");

  for (tern_buffer_t buffer : {s.x, s.y, s.z, s.outputs}) {
    Check(tern_buffer_free(buffer), "tern_buffer_free");
  }
  Check(tern_executable_unload(s.add), "tern_executable_unload");
  Check(tern_queue_destroy(s.queue), "tern_queue_destroy");
  Check(tern_core_close(s.core), "tern_core_close");
  Check(tern_shutdown(), "tern_shutdown");
  return missed && fail_on_miss ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, fail_on_miss = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--fail-on-miss") {
      fail_on_miss = true;
    } else {
      std::fprintf(stderr, "usage: tern_bench_graph [--quick] [--fail-on-miss]\n");
      return arg == "--help" || arg == "-h" ? 0 : 1;
    }
  }
  // A private node, so the benchmark neither meets nor disturbs other tern
  // programs.
  std::string private_node;
  const char* node = std::getenv("TERN_SIM_NODE");
  if (node == nullptr || *node == '\0') {
    private_node = "bench-graph-" + std::to_string(getpid());
    setenv("TERN_SIM_NODE", private_node.c_str(), 1);
  }
  int exit_code;
  try {
    exit_code = Run(quick, fail_on_miss);
  } catch (const TernFailure& failure) {
    std::fprintf(stderr, "tern_bench_graph: %s\n", failure.what());
    tern_shutdown();
    exit_code = 1;
  }
  if (!private_node.empty()) std::remove(("/dev/shm/tern-sim-" + private_node).c_str());
  return exit_code;
}
