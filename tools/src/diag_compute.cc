// compute_selftest: a small matmul + relu on diag's core, compared bit for
// bit with the host's result.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "diag_checks.h"
#include "util.h"

namespace tern::tools::diag {
namespace {

// The compute self-test: relu(a @ b) for 64x64 fp32 matrices of small
// integers, whose products and sums are exact in fp32, so the device's result
// must equal the host's bit for bit. Built with the public builder API.
constexpr int64_t kSelfTestN = 64;
constexpr int kSelfTestRuns = 3;

float SelfTestA(int64_t i, int64_t k) { return static_cast<float>((i * 3 + k * 7) % 17 - 8); }
float SelfTestB(int64_t k, int64_t j) { return static_cast<float>((k * 5 + j * 11) % 13 - 6); }

// One instruction of the self-test; `operands` and `ints` must outlive it.
template <size_t kOperands, size_t kInts>
tern_instruction_t Instruction(tern_opcode_t opcode, const tern_operand_t (&operands)[kOperands],
                               const int64_t (&ints)[kInts], const char* debug_op) {
  return {.struct_size = sizeof(tern_instruction_t),
          .opcode = opcode,
          .operand_count = kOperands,
          .operands = operands,
          .int_count = kInts,
          .ints = ints,
          .debug_op = debug_op};
}

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
  const tern_instruction_t matmul =
      Instruction(TERN_OP_MATMUL, matmul_operands, no_transpose, "diag.selftest.matmul");
  const tern_instruction_t activation =
      Instruction(TERN_OP_UNARY, relu_operands, relu, "diag.selftest.relu");
  // The relu (scalar engine) reads what the matmul (tensor engine) writes:
  // the engines run concurrently, so semaphore 0 orders them.
  const int64_t signal_ints[3] = {0, 1, TERN_ENGINE_TENSOR};
  const int64_t wait_ints[3] = {0, 1, TERN_ENGINE_SCALAR};
  const tern_instruction_t matmul_done = {.struct_size = sizeof(tern_instruction_t),
                                          .opcode = TERN_OP_SEM_SIGNAL,
                                          .int_count = 3,
                                          .ints = signal_ints,
                                          .debug_op = "diag.selftest.matmul"};
  const tern_instruction_t wait_for_matmul = {.struct_size = sizeof(tern_instruction_t),
                                              .opcode = TERN_OP_SEM_WAIT,
                                              .int_count = 3,
                                              .ints = wait_ints,
                                              .debug_op = "diag.selftest.relu"};
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
  if (s == TERN_OK) s = tern_builder_add_instruction(builder, &matmul_done);
  if (s == TERN_OK) s = tern_builder_add_instruction(builder, &wait_for_matmul);
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

}  // namespace

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
    return check.Set(Result::kFailed, "could not build the self-test executable: " + failure);
  }
  tern_executable_t executable = nullptr;
  const tern_status_t loaded = tern_executable_load(device, data, size, nullptr, &executable);
  tern_builder_free_data(data);
  if (loaded != TERN_OK) {
    return check.Set(Result::kFailed, DescribeFailure("tern_executable_load", loaded));
  }
  DeviceBuffer a_buffer, b_buffer, c_buffer;
  tern_status_t s = a_buffer.Allocate(device, bytes);
  if (s == TERN_OK) s = b_buffer.Allocate(device, bytes);
  if (s == TERN_OK) s = c_buffer.Allocate(device, bytes);
  if (s != TERN_OK) {
    tern_executable_unload(executable);
    return check.Set(Result::kFailed, DescribeFailure("tern_buffer_alloc", s));
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

}  // namespace tern::tools::diag
