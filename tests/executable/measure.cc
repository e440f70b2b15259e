// Prints the executable figures of the P2 issue:
//   - single-op build+load latency: median (and p90) over 10,000 runs of
//     building an `add` executable with the builder and loading it;
//   - the time to load an executable with 256 MiB of constants from a file,
//     as GB/s of constants (the file is in the page cache, as after a build);
//   - the time to build and to load a program of 10,000 instructions whose
//     two engines hand one scratch buffer back and forth (the race check's
//     worst kind of program: every pair overlaps, each ordered by a
//     semaphore handshake), beside the same count of instructions on
//     disjoint buffers of one engine.
// Usage: tern_exe_measure [constants MiB, default 256] [iterations, default 10000]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "exe_test_util.h"

namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

int Fail(const char* what) {
  std::fprintf(stderr, "%s failed: %s\n", what, tern_last_error_message());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 10000;
  // Devices large enough for the constants.
  setenv("TERN_SIM_NODE", ("exe-measure-" + std::to_string(getpid())).c_str(), 0);
  setenv("TERN_SIM_TOPOLOGY", "1x1x2G", 0);
  if (tern_init(nullptr) != TERN_OK) return Fail("tern_init");
  tern_device_t device = nullptr;
  if (tern_device_get(0, &device) != TERN_OK) return Fail("tern_device_get");

  // Single-op build+load.
  std::vector<double> build_load, load_only;
  for (int i = 0; i < iterations; ++i) {
    const auto start = Clock::now();
    const exetest::Bytes data = exetest::BuildAdd();
    const auto built = Clock::now();
    tern_executable_t executable = nullptr;
    if (tern_executable_load(device, data.data(), data.size(), nullptr, &executable) != TERN_OK) {
      return Fail("tern_executable_load");
    }
    const auto end = Clock::now();
    tern_executable_unload(executable);
    build_load.push_back(Micros(end - start));
    load_only.push_back(Micros(end - built));
  }
  std::sort(build_load.begin(), build_load.end());
  std::sort(load_only.begin(), load_only.end());
  std::printf(
      "single-op build+load: median %.2f us, p90 %.2f us (load alone: median %.2f us) "
      "over %d runs; target <= 50 us\n",
      build_load[build_load.size() / 2], build_load[build_load.size() * 9 / 10],
      load_only[load_only.size() / 2], iterations);

  // 10,000 instructions.
  for (const bool handshakes : {true, false}) {
    constexpr int kTurns = 1250;  // x 8 instructions
    static const int64_t shape[2] = {16, 16};
    tern_builder_t builder = nullptr;
    if (tern_builder_create(nullptr, &builder) != TERN_OK) return Fail("tern_builder_create");
    tern_builder_begin_function(builder, "turns", nullptr);
    tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, shape, nullptr);
    tern_builder_set_scratch(builder, handshakes ? 1024 : 1024ull * 4 * kTurns);
    auto add = [&](tern_opcode_t opcode, std::vector<tern_operand_t> operands,
                   std::vector<int64_t> ints) {
      tern_instruction_t ins{};
      ins.struct_size = sizeof(ins);
      ins.opcode = opcode;
      ins.operand_count = static_cast<uint32_t>(operands.size());
      ins.operands = operands.data();
      ins.int_count = static_cast<uint32_t>(ints.size());
      ins.ints = ints.data();
      return tern_builder_add_instruction(builder, &ins);
    };
    const auto build_start = Clock::now();
    for (int i = 0; i < kTurns; ++i) {
      // Handshakes: one buffer, the engines take turns. Otherwise: the scalar
      // engine alone, each turn on a buffer of its own.
      const uint64_t base = handshakes ? 0 : 4096ull * i;
      const auto buffer = exetest::Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 2, shape, base);
      const auto input = exetest::Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, shape);
      bool ok = true;
      if (handshakes) {
        ok &= add(TERN_OP_SEM_WAIT, {}, {1, i, TERN_ENGINE_TENSOR}) == TERN_OK;
        ok &= add(TERN_OP_MATMUL, {buffer, input, input}, {}) == TERN_OK;
        ok &= add(TERN_OP_MATMUL, {buffer, input, input}, {}) == TERN_OK;
        ok &= add(TERN_OP_SEM_SIGNAL, {}, {0, 1, TERN_ENGINE_TENSOR}) == TERN_OK;
        ok &= add(TERN_OP_SEM_WAIT, {}, {0, i + 1, TERN_ENGINE_SCALAR}) == TERN_OK;
        ok &= add(TERN_OP_UNARY, {buffer, buffer}, {TERN_UNARY_RELU}) == TERN_OK;
        ok &= add(TERN_OP_UNARY, {buffer, buffer}, {TERN_UNARY_RELU}) == TERN_OK;
        ok &= add(TERN_OP_SEM_SIGNAL, {}, {1, 1, TERN_ENGINE_SCALAR}) == TERN_OK;
      } else {
        for (int k = 0; k < 8; ++k) {
          ok &= add(TERN_OP_UNARY, {buffer, buffer}, {TERN_UNARY_RELU}) == TERN_OK;
        }
      }
      if (!ok) return Fail("add_instruction");
    }
    if (tern_builder_end_function(builder) != TERN_OK) return Fail("end_function");
    const double build_ms = Micros(Clock::now() - build_start) / 1e3;
    void* data = nullptr;
    uint64_t size = 0;
    if (tern_builder_finish(builder, &data, &size) != TERN_OK) return Fail("finish");
    tern_builder_destroy(builder);
    std::vector<double> load_ms;
    for (int i = 0; i < 5; ++i) {
      tern_executable_t executable = nullptr;
      const auto start = Clock::now();
      if (tern_executable_load(device, data, size, nullptr, &executable) != TERN_OK) {
        return Fail("tern_executable_load");
      }
      load_ms.push_back(Micros(Clock::now() - start) / 1e3);
      tern_executable_unload(executable);
    }
    tern_builder_free_data(data);
    std::sort(load_ms.begin(), load_ms.end());
    std::printf(
        "10,000 instructions, %s: built in %.1f ms, loaded in %.1f ms (median of 5)\n",
        handshakes ? "two engines taking turns on one buffer" : "one engine, disjoint buffers",
        build_ms, load_ms[2]);
  }

  // Large constants from a file.
  const uint64_t bytes = mib << 20;
  tern_builder_t builder = nullptr;
  if (tern_builder_create(nullptr, &builder) != TERN_OK) return Fail("tern_builder_create");
  {
    std::vector<uint8_t> constants(bytes);
    for (uint64_t i = 0; i < bytes; i += 8) constants[i] = static_cast<uint8_t>(i >> 12);
    uint64_t offset = 0;
    if (tern_builder_add_constants(builder, constants.data(), bytes, 4096, &offset) != TERN_OK) {
      return Fail("tern_builder_add_constants");
    }
  }
  const int64_t shape[1] = {static_cast<int64_t>(bytes / 4)};
  tern_builder_begin_function(builder, "copy", nullptr);
  tern_builder_add_output(builder, "out", TERN_DTYPE_F32, 1, shape, nullptr);
  tern_operand_t operands[2] = {
      exetest::Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 1, shape),
      exetest::Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 1, shape)};
  tern_instruction_t instruction{};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_COPY;
  instruction.operand_count = 2;
  instruction.operands = operands;
  if (tern_builder_add_instruction(builder, &instruction) != TERN_OK)
    return Fail("add_instruction");
  tern_builder_end_function(builder);
  const std::string path = "/tmp/tern-exe-measure-" + std::to_string(getpid()) + ".tern";
  const auto write_start = Clock::now();
  if (tern_builder_write_file(builder, path.c_str()) != TERN_OK)
    return Fail("tern_builder_write_file");
  const double write_us = Micros(Clock::now() - write_start);
  tern_builder_destroy(builder);

  std::vector<double> loads, memory_loads;
  for (int i = 0; i < 5; ++i) {
    tern_executable_t executable = nullptr;
    const auto start = Clock::now();
    if (tern_executable_load_file(device, path.c_str(), nullptr, &executable) != TERN_OK) {
      return Fail("tern_executable_load_file");
    }
    loads.push_back(Micros(Clock::now() - start));
    tern_executable_unload(executable);
  }
  std::sort(loads.begin(), loads.end());
  const double median = loads[loads.size() / 2];
  std::printf(
      "load_file with %llu MiB of constants: median %.1f ms = %.2f GB/s (best %.1f ms); "
      "target >= 2 GB/s; write_file took %.1f ms\n",
      static_cast<unsigned long long>(mib), median / 1e3, bytes / (median * 1e3),
      loads.front() / 1e3, write_us / 1e3);
  std::remove(path.c_str());
  tern_shutdown();
  std::remove(("/dev/shm/tern-sim-exe-measure-" + std::to_string(getpid())).c_str());
  return 0;
}
