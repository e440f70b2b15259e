// Internals of the ISA rules, shared by isa_rules.cc (the opcode table, the
// checks every operand gets, ValidateInstruction's dispatch) and the
// per-engine rule files isa_rules_<engine>.cc, one per section of docs/isa.md.
// Not for use outside common/isa_rules*.cc.
#ifndef TERN_COMMON_ISA_RULES_INTERNAL_H_
#define TERN_COMMON_ISA_RULES_INTERNAL_H_

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "common/isa_rules.h"

namespace tern::isa::rules {

constexpr uint32_t Bit(size_t slot) { return 1u << slot; }

inline bool KnownDtype(int64_t raw) { return raw >= 0 && raw < TERN_DTYPE_COUNT; }

struct OpInfo {
  uint32_t opcode;
  const char* name;
  std::array<const char*, 12> operands;  // slot names
  size_t count;                          // slots
  uint32_t optional_mask;
  uint32_t written_mask;
};

inline bool IsBool(tern_dtype_t dtype) { return dtype == TERN_DTYPE_BOOL; }

bool SameShape(const OperandDesc& a, const OperandDesc& b);

// Everything ValidateInstruction needs while it checks one instruction.
class Checker {
 public:
  Checker(const OpInfo& info, std::span<const OperandDesc> operands, std::span<const int64_t> ints,
          std::span<const double> floats)
      : info_(info), operands_(operands), ints_(ints), floats_(floats), prefix_(info.name) {}

  template <typename... Args>
  Status Fail(fmt::format_string<Args...> format, Args&&... args) const {
    return Status(TERN_ERROR_EXECUTABLE_INVALID,
                  prefix_ + ": " + fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  Status Unsupported(fmt::format_string<Args...> format, Args&&... args) const {
    return Status(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                  prefix_ + ": " + fmt::format(format, std::forward<Args>(args)...));
  }

  void SetPrefix(std::string prefix) { prefix_ = std::move(prefix); }
  const std::string& prefix() const { return prefix_; }

  bool Has(size_t slot) const { return slot < operands_.size() && operands_[slot].present(); }
  const OperandDesc& Op(size_t slot) const { return operands_[slot]; }
  const char* Name(size_t slot) const { return info_.operands[slot]; }
  std::string Describe(size_t slot) const { return DescribeOperand(operands_[slot]); }
  std::span<const int64_t> ints() const { return ints_; }
  std::span<const double> floats() const { return floats_; }

  Status Structure() const;

  // The same instruction seen with other floats: a fused step's or an
  // epilogue's parameters, checked by the rules of the function they belong to.
  Checker WithFloats(std::span<const double> floats, std::string prefix) const {
    Checker sub(info_, operands_, ints_, floats);
    sub.SetPrefix(std::move(prefix));
    return sub;
  }

  Status IntCount(size_t min, size_t max, const char* what) const {
    if (ints_.size() < min || ints_.size() > max) {
      if (min == max)
        return Fail("takes {} int{} ({}), got {}", min, min == 1 ? "" : "s", what, ints_.size());
      return Fail("takes {} to {} ints ({}), got {}", min, max, what, ints_.size());
    }
    return OkStatus();
  }
  Status FloatCount(size_t min, size_t max, const char* what) const {
    if (floats_.size() < min || floats_.size() > max) {
      if (min == max) {
        return Fail("takes {} float{} ({}), got {}", min, min == 1 ? "" : "s", what,
                    floats_.size());
      }
      return Fail("takes {} to {} floats ({}), got {}", min, max, what, floats_.size());
    }
    return OkStatus();
  }
  Status FiniteFloats(const char* what) const {
    for (size_t i = 0; i < floats_.size(); ++i) {
      if (!std::isfinite(floats_[i]))
        return Fail("floats[{}] ({}) is {}; it must be finite", i, what, floats_[i]);
    }
    return OkStatus();
  }

  Status SameShapeAs(size_t slot, size_t ref) const {
    if (!SameShape(Op(slot), Op(ref))) {
      return Fail("{} is {} but {} is {}: shapes must be equal (broadcast with stride 0)",
                  Name(slot), Describe(slot), Name(ref), Describe(ref));
    }
    return OkStatus();
  }
  Status SameDtypeAs(size_t slot, size_t ref) const {
    if (Op(slot).dtype != Op(ref).dtype) {
      return Fail("{} is {} but {} is {}: dtypes must be equal (CAST first)", Name(slot),
                  Describe(slot), Name(ref), Describe(ref));
    }
    return OkStatus();
  }
  // Shape, then dtype: the pair of checks most rules make.
  Status SameShapeAndDtypeAs(size_t slot, size_t ref) const {
    TERN_RETURN_IF_ERROR(SameShapeAs(slot, ref));
    return SameDtypeAs(slot, ref);
  }
  Status DtypeIs(size_t slot, tern_dtype_t dtype) const {
    if (Op(slot).dtype != dtype)
      return Fail("{} is {}; it must be {}", Name(slot), Describe(slot), DTypeName(dtype));
    return OkStatus();
  }
  Status FloatDtype(size_t slot) const {
    if (!IsFloat(Op(slot).dtype)) {
      return Fail("{} is {}; it must be a float dtype (f32, bf16, f16)", Name(slot),
                  Describe(slot));
    }
    return OkStatus();
  }
  Status NotBool(size_t slot) const {
    if (IsBool(Op(slot).dtype)) {
      return Fail("{} is {}; bool is not allowed here (cast to an integer dtype)", Name(slot),
                  Describe(slot));
    }
    return OkStatus();
  }
  Status IndexDtype(size_t slot) const {
    tern_dtype_t dtype = Op(slot).dtype;
    if (dtype != TERN_DTYPE_I32 && dtype != TERN_DTYPE_I64) {
      return Fail("{} is {}; indices must be i32 or i64", Name(slot), Describe(slot));
    }
    return OkStatus();
  }
  Status RankIs(size_t slot, uint32_t rank) const {
    if (Op(slot).rank != rank)
      return Fail("{} is {}; it must have rank {}", Name(slot), Describe(slot), rank);
    return OkStatus();
  }
  // Axis `value` of a tensor of rank `rank` (negative counts from the end;
  // rank-0 tensors accept -1 and 0 where `scalar_ok`).
  Status Axis(int64_t value, uint32_t rank, const char* what, bool scalar_ok, uint32_t* out) const {
    int64_t r = rank;
    if (rank == 0 && scalar_ok) {
      if (value == 0 || value == -1) {
        *out = 0;
        return OkStatus();
      }
      return Fail("{} {} is out of range for a rank-0 tensor (use 0 or -1)", what, value);
    }
    if (value < -r || value >= r) {
      if (rank == 0) return Fail("{} {} is out of range: the tensor has rank 0", what, value);
      return Fail("{} {} is out of range for rank {} (valid: {} to {})", what, value, rank, -r,
                  r - 1);
    }
    *out = static_cast<uint32_t>(value < 0 ? value + r : value);
    return OkStatus();
  }

 private:
  const OpInfo& info_;
  std::span<const OperandDesc> operands_;
  std::span<const int64_t> ints_;
  std::span<const double> floats_;
  std::string prefix_;
};

// --- per-engine rules (isa_rules_<engine>.cc) --------------------------------
// Each runs after Checker::Structure() passed, so every required operand is
// present and well formed.

// DMA
// Whether an operand is f64, and the rule for instructions that have one
// (before the opcode's own rule).
bool HasF64(std::span<const OperandDesc> operands);
Status CheckF64(Checker& c, uint32_t opcode);
Status CheckCopy(Checker& c);
Status CheckCast(Checker& c);
Status CheckFill(Checker& c);
// Tensor
Status CheckMatmul(Checker& c);
Status CheckConv2d(Checker& c);
Status CheckConv2dBackwardInput(Checker& c);
Status CheckConv2dBackwardWeight(Checker& c);
// Vector
Status CheckBinary(Checker& c);
Status CheckWhere(Checker& c);
Status CheckReduce(Checker& c);
Status CheckSoftmax(Checker& c);
Status CheckSoftmaxBackward(Checker& c);
Status CheckLayerNorm(Checker& c);
Status CheckLayerNormBackward(Checker& c);
Status CheckRmsNorm(Checker& c);
Status CheckRmsNormBackward(Checker& c);
Status CheckElementwise(Checker& c);
Status CheckScan(Checker& c);
// Scalar
Status CheckUnary(Checker& c);
Status CheckUnaryBackward(Checker& c);
// Checks c.floats() as the parameters of unary function `fn`.
Status CheckUnaryFloats(Checker& c, int64_t fn);
// Checks an activation (a MATMUL or CONV2D epilogue): TERN_ACTIVATION_NONE
// with no parameters, or a float unary function with all its parameters.
Status CheckActivation(const Checker& c, int64_t fn, std::span<const double> parameters);
// GpSimd: gather and scatter_add share one rule (`scatter` picks the slots),
// as do take_along_axis and scatter_add_along_axis.
// `scatter`: the written forms [out, indices, src]; `accumulate`: the adding
// ones (scatter_add*, not bool) rather than the overwriting ones (scatter*).
Status CheckGather(Checker& c, bool scatter, bool accumulate = true);
Status CheckTakeAlongAxis(Checker& c, bool scatter, bool accumulate = true);
Status CheckIota(Checker& c);
Status CheckRandom(Checker& c);
// sort and topk share one rule (`topk`: values and indices may be shorter
// along the axis).
Status CheckSort(Checker& c, bool topk);
// Collective
Status CheckAllReduce(Checker& c);
// Sync
Status CheckSemaphore(Checker& c, bool wait);

}  // namespace tern::isa::rules

#endif  // TERN_COMMON_ISA_RULES_INTERNAL_H_
