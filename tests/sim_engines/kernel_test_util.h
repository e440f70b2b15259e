// Helpers of the kernel tests: host tensors with any strides, an instruction
// runner that validates before it runs, and tolerance checks against double
// precision references computed by naive loops in the tests.
#ifndef TERN_TESTS_SIM_ENGINES_KERNEL_TEST_UTIL_H_
#define TERN_TESTS_SIM_ENGINES_KERNEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/isa_rules.h"
#include "driver_shim/sim/engines/kernels_testing.h"
#include "driver_shim/sim/engines/run_instruction.h"

namespace tern::testing {

using Shape = std::vector<int64_t>;
// Tests compare kernels split one way and another (kernels_testing.h).
using sim::KernelThreadsForHost;
using sim::SetKernelThreadsForTesting;

// A tensor in host memory: a desc (segment OUTPUT, offset 0) and storage
// covering its extent. Elements are addressed by their row-major logical
// index, whatever the strides.
class Tensor {
 public:
  Tensor() = default;
  // Contiguous row-major.
  Tensor(tern_dtype_t dtype, Shape shape);
  // Explicit strides (elements); storage covers the extent.
  static Tensor Strided(tern_dtype_t dtype, Shape shape, Shape strides);
  // Stored in the dimension order `order` (outermost first), so that e.g.
  // order {1, 0} of a [M, N] tensor is a transposed view of an [N, M] buffer.
  static Tensor Permuted(tern_dtype_t dtype, Shape shape, std::vector<int> order);
  // Stride 0 along the dimensions where `broadcast[d]` is true.
  static Tensor Broadcast(tern_dtype_t dtype, Shape shape, std::vector<bool> broadcast);
  // Every other element of a row-major buffer along the last dimension
  // (stride 2), a simple non-contiguous layout.
  static Tensor Spaced(tern_dtype_t dtype, Shape shape);

  const isa::OperandDesc& desc() const { return desc_; }
  isa::OperandDesc& desc() { return desc_; }
  tern_dtype_t dtype() const { return desc_.dtype; }
  const Shape& shape() const { return shape_; }
  int64_t count() const { return desc_.element_count(); }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(storage_.data()); }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(storage_.data()); }
  size_t storage_bytes() const { return storage_.size() * sizeof(uint64_t); }

  int64_t Offset(int64_t linear) const;  // elements
  std::vector<int64_t> Index(int64_t linear) const;
  // Values as double (floats widened exactly, integers converted, bool 0/1).
  double Get(int64_t linear) const;
  int64_t GetInt(int64_t linear) const;
  // Stores v rounded to the dtype (floats round to nearest even; integers
  // must fit).
  void Set(int64_t linear, double v);
  void SetInt(int64_t linear, int64_t v);
  void SetAll(const std::vector<double>& values);
  std::vector<double> Values() const;
  // Raw bits of element `linear` (for exact comparisons).
  uint64_t Bits(int64_t linear) const;

  // Random values: floats uniform in [lo, hi) rounded to the dtype,
  // integers uniform in [lo, hi] (clamped to the dtype), bool 0/1.
  void Randomize(std::mt19937_64& rng, double lo = -2.0, double hi = 2.0);
  // Fills every byte of storage (including gaps between strided elements).
  void Poison(uint8_t byte = 0xAB);

  sim::TensorView View() { return {data(), &desc_}; }

 private:
  void Allocate();
  isa::OperandDesc desc_;
  Shape shape_;
  std::vector<uint64_t> storage_;
};

// An absent optional operand.
inline Tensor* const kAbsent = nullptr;

// Builds the instruction, checks that ValidateInstruction accepts it, runs
// it. Returns RunInstruction's status (or the validation failure).
Status Exec(uint32_t opcode, std::vector<Tensor*> operands, std::vector<int64_t> ints = {},
            std::vector<double> floats = {});
// As Exec, with operands[constant] in the program's constants segment: the
// instruction is first prepared as loading a program prepares it
// (sim::PrepareInstruction, that tensor's memory being the constants), then
// run with what that kept; *prepared tells whether it kept anything.
Status ExecPrepared(uint32_t opcode, std::vector<Tensor*> operands, size_t constant,
                    std::vector<int64_t> ints, std::vector<double> floats, bool* prepared);
// Only validates.
Status Validate(uint32_t opcode, std::vector<Tensor*> operands, std::vector<int64_t> ints = {},
                std::vector<double> floats = {});

struct Tolerance {
  double rtol;
  double atol;
};
// Output-rounding tolerance of a dtype for O(1) data: f32 1e-5, f16 2e-3,
// bf16 1.6e-2 (relative), times `scale`.
Tolerance TolFor(tern_dtype_t dtype, double scale = 1.0);

// Every element of `got` within tol of ref (NaN matches NaN, infinities must
// be equal). Reports the first mismatches.
::testing::AssertionResult Near(const Tensor& got, const std::vector<double>& ref, Tolerance tol);
// Exact equality (integers, bool, copies).
::testing::AssertionResult Equal(const Tensor& got, const std::vector<double>& ref);
// The same bits in every element (and the same count) as `want`.
::testing::AssertionResult SameBits(const Tensor& got, const Tensor& want);

// The value of double v after rounding to a float dtype (identity for
// integers).
double RoundToDtype(tern_dtype_t dtype, double v);

std::string ShapeStr(const Shape& s);

inline constexpr tern_dtype_t kFloatDtypes[] = {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16};
inline constexpr tern_dtype_t kIntDtypes[] = {TERN_DTYPE_I8, TERN_DTYPE_I32, TERN_DTYPE_I64};
inline constexpr tern_dtype_t kAllDtypes[] = {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16,
                                              TERN_DTYPE_I8,  TERN_DTYPE_I32,  TERN_DTYPE_I64,
                                              TERN_DTYPE_BOOL};

}  // namespace tern::testing

#endif  // TERN_TESTS_SIM_ENGINES_KERNEL_TEST_UTIL_H_
