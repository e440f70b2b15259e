// The rules of the instruction set. docs/isa.md is the prose version of what
// ValidateInstruction enforces; keep the two in step.
#include "common/isa_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace tern::isa {
namespace {

constexpr uint32_t Bit(size_t slot) { return 1u << slot; }

// The integer stored in an enum field, read without loading it as the enum:
// a hostile file can hold any value there, and loading an out-of-range
// value as the enum type is undefined behaviour.
template <typename E>
int64_t Raw(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int64_t>(v);
}

bool KnownDtype(int64_t raw) { return raw >= 0 && raw < TERN_DTYPE_COUNT; }

struct OpInfo {
  uint32_t opcode;
  const char* name;
  std::array<const char*, 8> operands;  // slot names
  size_t count;                         // slots
  uint32_t optional_mask;
  uint32_t written_mask;
};

constexpr OpInfo kOps[] = {
    {TERN_OP_COPY, "copy", {"dst", "src"}, 2, 0, Bit(0)},
    {TERN_OP_CAST, "cast", {"dst", "src"}, 2, 0, Bit(0)},
    {TERN_OP_FILL, "fill", {"dst"}, 1, 0, Bit(0)},
    {TERN_OP_MATMUL, "matmul", {"out", "a", "b", "bias"}, 4, Bit(3), Bit(0)},
    {TERN_OP_CONV2D, "conv2d", {"out", "input", "weight", "bias"}, 4, Bit(3), Bit(0)},
    {TERN_OP_CONV2D_BACKWARD_INPUT,
     "conv2d_backward_input",
     {"grad_input", "grad_out", "weight"},
     3,
     0,
     Bit(0)},
    {TERN_OP_CONV2D_BACKWARD_WEIGHT,
     "conv2d_backward_weight",
     {"grad_weight", "grad_out", "input"},
     3,
     0,
     Bit(0)},
    {TERN_OP_BINARY, "binary", {"out", "a", "b"}, 3, 0, Bit(0)},
    {TERN_OP_WHERE, "where", {"out", "cond", "a", "b"}, 4, 0, Bit(0)},
    {TERN_OP_REDUCE, "reduce", {"out", "in"}, 2, 0, Bit(0)},
    {TERN_OP_SOFTMAX, "softmax", {"out", "in"}, 2, 0, Bit(0)},
    {TERN_OP_SOFTMAX_BACKWARD, "softmax_backward", {"grad_in", "grad_out", "out"}, 3, 0, Bit(0)},
    {TERN_OP_LAYER_NORM,
     "layer_norm",
     {"out", "mean", "rstd", "in", "weight", "bias"},
     6,
     Bit(1) | Bit(2) | Bit(4) | Bit(5),
     Bit(0) | Bit(1) | Bit(2)},
    {TERN_OP_LAYER_NORM_BACKWARD,
     "layer_norm_backward",
     {"grad_in", "grad_weight", "grad_bias", "grad_out", "in", "mean", "rstd", "weight"},
     8,
     Bit(1) | Bit(2) | Bit(7),
     Bit(0) | Bit(1) | Bit(2)},
    {TERN_OP_RMS_NORM,
     "rms_norm",
     {"out", "rstd", "in", "weight"},
     4,
     Bit(1) | Bit(3),
     Bit(0) | Bit(1)},
    {TERN_OP_RMS_NORM_BACKWARD,
     "rms_norm_backward",
     {"grad_in", "grad_weight", "grad_out", "in", "rstd", "weight"},
     6,
     Bit(1) | Bit(5),
     Bit(0) | Bit(1)},
    {TERN_OP_UNARY, "unary", {"out", "in"}, 2, 0, Bit(0)},
    {TERN_OP_UNARY_BACKWARD, "unary_backward", {"grad_in", "grad_out", "in"}, 3, 0, Bit(0)},
    {TERN_OP_GATHER, "gather", {"out", "table", "indices"}, 3, 0, Bit(0)},
    {TERN_OP_SCATTER_ADD, "scatter_add", {"out", "indices", "src"}, 3, 0, Bit(0)},
    {TERN_OP_TAKE_ALONG_AXIS, "take_along_axis", {"out", "in", "indices"}, 3, 0, Bit(0)},
    {TERN_OP_SCATTER_ADD_ALONG_AXIS,
     "scatter_add_along_axis",
     {"out", "indices", "src"},
     3,
     0,
     Bit(0)},
    {TERN_OP_IOTA, "iota", {"out"}, 1, 0, Bit(0)},
    {TERN_OP_RANDOM, "random", {"out"}, 1, 0, Bit(0)},
    {TERN_OP_ALL_REDUCE, "all_reduce", {"out", "in"}, 2, 0, Bit(0)},
    {TERN_OP_SEM_SIGNAL, "sem_signal", {}, 0, 0, 0},
    {TERN_OP_SEM_WAIT, "sem_wait", {}, 0, 0, 0},
};

const OpInfo* FindOp(uint32_t opcode) {
  for (const OpInfo& info : kOps) {
    if (info.opcode == opcode) return &info;
  }
  return nullptr;
}

constexpr const char* kUnaryNames[] = {
    "neg",         "abs",        "exp",      "log",    "sqrt",       "rsqrt",       "sin",
    "cos",         "tanh",       "sigmoid",  "relu",   "gelu",       "gelu_tanh",   "silu",
    "erf",         "floor",      "ceil",     "round",  "trunc",      "sign",        "reciprocal",
    "logical_not", "expm1",      "log1p",    "square", "leaky_relu", "elu",         "pow_scalar",
    "clamp",       "affine",     "softplus", "isnan",  "log2",       "exp2",        "tan",
    "asin",        "acos",       "atan",     "sinh",   "cosh",       "hardsigmoid", "hardswish",
    "mish",        "bitwise_not"};
static_assert(std::size(kUnaryNames) == TERN_UNARY_COUNT);

constexpr const char* kBinaryNames[] = {
    "add",   "sub",         "mul",        "div",         "pow",          "max",
    "min",   "eq",          "ne",         "lt",          "le",           "gt",
    "ge",    "logical_and", "logical_or", "logical_xor", "remainder",    "fmod",
    "atan2", "bitwise_and", "bitwise_or", "bitwise_xor", "floor_divide", "copysign"};
static_assert(std::size(kBinaryNames) == TERN_BINARY_COUNT);

constexpr const char* kReduceNames[] = {"sum",    "mean",   "max", "min", "prod",
                                        "argmax", "argmin", "any", "all"};
static_assert(std::size(kReduceNames) == TERN_REDUCE_COUNT);

constexpr const char* kRandomNames[] = {"uniform", "normal", "bernoulli"};
static_assert(std::size(kRandomNames) == TERN_RANDOM_COUNT);

bool IsBool(tern_dtype_t dtype) { return dtype == TERN_DTYPE_BOOL; }

std::string ShapeString(const int64_t* dims, uint32_t rank) {
  std::string s = "[";
  for (uint32_t i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

bool SameShape(const OperandDesc& a, const OperandDesc& b) {
  if (a.rank != b.rank) return false;
  for (uint32_t i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  return true;
}

bool IsContiguous(const OperandDesc& desc) {
  int64_t expected = 1;
  for (int i = static_cast<int>(desc.rank) - 1; i >= 0; --i) {
    if (desc.shape[i] != 1 && desc.strides[i] != expected) return false;
    if (__builtin_mul_overflow(expected, desc.shape[i], &expected)) return false;
  }
  return true;
}

// True when the strides guarantee that no two elements share memory: with
// the dimensions sorted by stride, each stride exceeds the span of all the
// smaller ones. Conservative (some exotic non-overlapping layouts fail).
bool NonOverlapping(const OperandDesc& desc) {
  std::array<std::pair<int64_t, int64_t>, TERN_MAX_RANK> dims{};  // (stride, size)
  size_t n = 0;
  for (uint32_t i = 0; i < desc.rank; ++i) {
    if (desc.shape[i] == 0) return true;
    if (desc.shape[i] > 1) dims[n++] = {desc.strides[i], desc.shape[i]};
  }
  for (size_t i = 1; i < n; ++i) {  // insertion sort: at most 8 entries
    for (size_t j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  __int128 span = 0;  // largest offset reachable with the dimensions so far
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<__int128>(dims[i].first) <= span) return false;
    span += static_cast<__int128>(dims[i].first) * (dims[i].second - 1);
  }
  return true;
}

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

Status CheckOperand(const Checker& c, size_t slot, bool written) {
  const OperandDesc& d = c.Op(slot);
  const char* name = c.Name(slot);
  const int64_t segment = Raw(d.segment);
  switch (segment) {
    case TERN_SEGMENT_INPUT:
    case TERN_SEGMENT_OUTPUT:
      break;
    case TERN_SEGMENT_CONSTANT:
    case TERN_SEGMENT_SCRATCH:
      if (d.index != 0) {
        return c.Fail("{} is in the {} segment with index {}; the index must be 0 there", name,
                      d.segment == TERN_SEGMENT_CONSTANT ? "constants" : "scratch", d.index);
      }
      break;
    default:
      return c.Fail("{} names unknown segment {}", name, segment);
  }
  if (!KnownDtype(Raw(d.dtype))) return c.Fail("{} has unknown dtype {}", name, Raw(d.dtype));
  if (d.rank > TERN_MAX_RANK)
    return c.Fail("{} has rank {}; the maximum is {}", name, d.rank, TERN_MAX_RANK);
  int64_t count = 1;
  for (uint32_t i = 0; i < d.rank; ++i) {
    if (d.shape[i] < 0) return c.Fail("{} has negative dimension {} ({})", name, i, d.shape[i]);
    if (d.strides[i] < 0)
      return c.Fail("{} has negative stride {} ({}) in dimension {}", name, d.strides[i], i, i);
    if (__builtin_mul_overflow(count, d.shape[i], &count)) {
      return c.Fail("{} has shape {}: the element count overflows", name,
                    ShapeString(d.shape.data(), d.rank));
    }
  }
  uint64_t begin = 0, end = 0;
  Status extent = OperandExtent(d, &begin, &end);
  if (!extent.ok()) return extent.WithContext(fmt::format("{}: {}", c.prefix(), name));
  if (written) {
    if (d.segment == TERN_SEGMENT_INPUT || d.segment == TERN_SEGMENT_CONSTANT) {
      return c.Fail("{} is written but lies in the {} segment; write to an output or the scratch",
                    name, d.segment == TERN_SEGMENT_INPUT ? "input" : "constants");
    }
    if (!NonOverlapping(d)) {
      return c.Fail(
          "{} is written but its strides make elements overlap ({} with strides {}); written "
          "operands cannot broadcast",
          name, DescribeOperand(d), ShapeString(d.strides.data(), d.rank));
    }
  }
  return OkStatus();
}

Status Checker::Structure() const {
  size_t min = 0;
  for (size_t i = 0; i < info_.count; ++i) {
    if (!(info_.optional_mask & Bit(i))) min = i + 1;
  }
  if (operands_.size() < min || operands_.size() > info_.count) {
    std::string list;
    for (size_t i = 0; i < info_.count; ++i) {
      if (i) list += ", ";
      list += info_.operands[i];
      if (info_.optional_mask & Bit(i)) list += "?";
    }
    if (info_.count == 0) return Fail("takes no operands, got {}", operands_.size());
    if (min == info_.count) {
      return Fail("takes {} operands [{}], got {}", info_.count, list, operands_.size());
    }
    return Fail("takes {} to {} operands [{}], got {}", min, info_.count, list, operands_.size());
  }
  for (size_t i = 0; i < operands_.size(); ++i) {
    if (!operands_[i].present()) {
      if (!(info_.optional_mask & Bit(i))) {
        return Fail("operand {} ({}) is required but absent", i, info_.operands[i]);
      }
      continue;
    }
    TERN_RETURN_IF_ERROR(CheckOperand(*this, i, (info_.written_mask & Bit(i)) != 0));
  }
  return OkStatus();
}

// --- per-opcode rules -------------------------------------------------------

Status CheckCopy(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  return c.SameDtypeAs(1, 0);
}

Status CheckCast(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  return c.SameShapeAs(1, 0);
}

Status CheckFill(Checker& c) {
  tern_dtype_t dtype = c.Op(0).dtype;
  if (IsFloat(dtype)) {
    TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "a float dtype takes its value from floats[0]"));
    return c.FloatCount(1, 1, "value");
  }
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "an integer or bool dtype takes its value from ints[0]"));
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "value"));
  int64_t v = c.ints()[0];
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  if (dtype == TERN_DTYPE_I8) lo = -128, hi = 127;
  if (dtype == TERN_DTYPE_I32)
    lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  if (dtype == TERN_DTYPE_BOOL) lo = 0, hi = 1;
  if (v < lo || v > hi) {
    return c.Fail("value {} does not fit dst's dtype {} ({} to {})", v, DTypeName(dtype), lo, hi);
  }
  return OkStatus();
}

Status CheckMatmul(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 2, "transpose_a, transpose_b"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "alpha, beta"));
  TERN_RETURN_IF_ERROR(c.FiniteFloats("alpha, beta"));
  for (size_t i = 0; i < c.ints().size(); ++i) {
    if (c.ints()[i] != 0 && c.ints()[i] != 1) {
      return c.Fail("ints[{}] ({}) is {}; it must be 0 or 1", i,
                    i == 0 ? "transpose_a" : "transpose_b", c.ints()[i]);
    }
  }
  const bool ta = c.ints().size() > 0 && c.ints()[0];
  const bool tb = c.ints().size() > 1 && c.ints()[1];
  const OperandDesc& out = c.Op(0);
  const OperandDesc& a = c.Op(1);
  const OperandDesc& b = c.Op(2);
  // dtypes: a and b equal; out equal to them, or f32 when they are bf16/f16.
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 1));
  TERN_RETURN_IF_ERROR(c.NotBool(1));
  if (out.dtype != a.dtype && !(out.dtype == TERN_DTYPE_F32 && IsFloat(a.dtype))) {
    return c.Fail("out is {} but a is {}: out must have a's dtype (or f32 for bf16/f16 inputs)",
                  c.Describe(0), c.Describe(1));
  }
  if (IsInteger(a.dtype)) {
    for (size_t i = 0; i < c.floats().size(); ++i) {
      if (c.floats()[i] != std::trunc(c.floats()[i])) {
        return c.Fail("floats[{}] ({}) is {}; integer matmul takes integral alpha and beta", i,
                      i == 0 ? "alpha" : "beta", c.floats()[i]);
      }
    }
  }
  if (out.rank < 2)
    return c.Fail("out is {}; it must have rank 2 or more ([..., M, N])", c.Describe(0));
  for (size_t slot : {size_t{1}, size_t{2}}) {
    if (c.Op(slot).rank != out.rank) {
      return c.Fail(
          "{} is {} but out is {}: operands must have out's rank (batch dimensions broadcast with "
          "stride 0)",
          c.Name(slot), c.Describe(slot), c.Describe(0));
    }
  }
  const uint32_t r = out.rank;
  const int64_t m = out.shape[r - 2], n = out.shape[r - 1];
  const int64_t a_m = ta ? a.shape[r - 1] : a.shape[r - 2];
  const int64_t a_k = ta ? a.shape[r - 2] : a.shape[r - 1];
  const int64_t b_k = tb ? b.shape[r - 1] : b.shape[r - 2];
  const int64_t b_n = tb ? b.shape[r - 2] : b.shape[r - 1];
  if (a_k != b_k) {
    return c.Fail("a is {}{} but b is {}{}: inner dimensions {} and {} differ", c.Describe(1),
                  ta ? " (transposed)" : "", c.Describe(2), tb ? " (transposed)" : "", a_k, b_k);
  }
  if (a_m != m) {
    return c.Fail("a is {}{} but out is {}: a has {} rows, out has {}", c.Describe(1),
                  ta ? " (transposed)" : "", c.Describe(0), a_m, m);
  }
  if (b_n != n) {
    return c.Fail("b is {}{} but out is {}: b has {} columns, out has {}", c.Describe(2),
                  tb ? " (transposed)" : "", c.Describe(0), b_n, n);
  }
  for (uint32_t i = 0; i + 2 < r; ++i) {
    for (size_t slot : {size_t{1}, size_t{2}}) {
      if (c.Op(slot).shape[i] != out.shape[i]) {
        return c.Fail(
            "{} is {} but out is {}: batch dimension {} is {} in {} and {} in out (broadcast with "
            "stride 0)",
            c.Name(slot), c.Describe(slot), c.Describe(0), i, c.Op(slot).shape[i], c.Name(slot),
            out.shape[i]);
      }
    }
  }
  if (c.Has(3)) {
    const OperandDesc& bias = c.Op(3);
    TERN_RETURN_IF_ERROR(c.SameDtypeAs(3, 0));
    if (bias.rank == 1) {
      if (bias.shape[0] != n) {
        return c.Fail("bias is {} but out is {}: a rank-1 bias has N = {} elements", c.Describe(3),
                      c.Describe(0), n);
      }
    } else if (!SameShape(bias, out)) {
      return c.Fail(
          "bias is {} but out is {}: bias must be [N] or have out's shape (broadcast with stride "
          "0)",
          c.Describe(3), c.Describe(0));
    }
  }
  return OkStatus();
}

struct ConvParams {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
};

Status ConvInts(const Checker& c, ConvParams* p) {
  if (c.ints().size() != 0 && c.ints().size() != 7) {
    return c.Fail(
        "takes 7 ints (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups) or none "
        "for the defaults, got {}",
        c.ints().size());
  }
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  if (c.ints().empty()) return OkStatus();
  static constexpr const char* kNames[] = {"stride_h",   "stride_w",   "pad_h", "pad_w",
                                           "dilation_h", "dilation_w", "groups"};
  constexpr int64_t kLimit = int64_t{1} << 31;
  for (size_t i = 0; i < 7; ++i) {
    int64_t v = c.ints()[i];
    int64_t min = (i == 2 || i == 3) ? 0 : 1;
    if (v < min || v > kLimit)
      return c.Fail("{} (ints[{}]) is {}; it must be in [{}, 2^31]", kNames[i], i, v, min);
  }
  *p = {c.ints()[0], c.ints()[1], c.ints()[2], c.ints()[3], c.ints()[4], c.ints()[5], c.ints()[6]};
  return OkStatus();
}

// Output size of one spatial dimension, or -1 if the kernel does not fit.
int64_t ConvOutSize(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  __int128 span = static_cast<__int128>(in) + 2 * static_cast<__int128>(pad);
  __int128 eff = static_cast<__int128>(dil) * (k - 1) + 1;
  if (k == 0 || span < eff) return -1;
  return static_cast<int64_t>((span - eff) / stride + 1);
}

// Checks the geometry of input [N,C,H,W], weight [O,C/g,KH,KW], out [N,O,OH,OW]
// given as slots of the instruction.
Status CheckConvGeometry(const Checker& c, const ConvParams& p, size_t input, size_t weight,
                         size_t out) {
  for (size_t slot : {input, weight, out}) TERN_RETURN_IF_ERROR(c.RankIs(slot, 4));
  for (size_t slot : {input, weight, out}) TERN_RETURN_IF_ERROR(c.FloatDtype(slot));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(weight, input));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(out, input));
  const auto& in = c.Op(input).shape;
  const auto& w = c.Op(weight).shape;
  const auto& o = c.Op(out).shape;
  if (in[1] % p.groups != 0) {
    return c.Fail("{} is {}: its {} channels are not divisible by groups = {}", c.Name(input),
                  c.Describe(input), in[1], p.groups);
  }
  if (w[0] % p.groups != 0) {
    return c.Fail("{} is {}: its {} output channels are not divisible by groups = {}",
                  c.Name(weight), c.Describe(weight), w[0], p.groups);
  }
  if (w[1] != in[1] / p.groups) {
    return c.Fail("{} is {} but {} is {}: weight must have C / groups = {} input channels",
                  c.Name(weight), c.Describe(weight), c.Name(input), c.Describe(input),
                  in[1] / p.groups);
  }
  if (o[0] != in[0]) {
    return c.Fail("{} is {} but {} is {}: batch sizes differ", c.Name(out), c.Describe(out),
                  c.Name(input), c.Describe(input));
  }
  if (o[1] != w[0]) {
    return c.Fail("{} is {} but {} is {}: {} must have {} channels (weight's O)", c.Name(out),
                  c.Describe(out), c.Name(weight), c.Describe(weight), c.Name(out), w[0]);
  }
  int64_t oh = ConvOutSize(in[2], w[2], p.stride_h, p.pad_h, p.dil_h);
  int64_t ow = ConvOutSize(in[3], w[3], p.stride_w, p.pad_w, p.dil_w);
  if (oh < 0 || ow < 0) {
    return c.Fail("{} is {} and {} is {}: the (dilated) kernel does not fit the padded input",
                  c.Name(weight), c.Describe(weight), c.Name(input), c.Describe(input));
  }
  if (o[2] != oh || o[3] != ow) {
    return c.Fail(
        "{} is {} but {} and {} with stride ({}, {}), padding ({}, {}), dilation ({}, {}) give "
        "spatial size [{}, {}]",
        c.Name(out), c.Describe(out), c.Name(input), c.Name(weight), p.stride_h, p.stride_w,
        p.pad_h, p.pad_w, p.dil_h, p.dil_w, oh, ow);
  }
  return OkStatus();
}

Status CheckConv2d(Checker& c) {
  ConvParams p;
  TERN_RETURN_IF_ERROR(ConvInts(c, &p));
  TERN_RETURN_IF_ERROR(CheckConvGeometry(c, p, 1, 2, 0));
  if (c.Has(3)) {
    TERN_RETURN_IF_ERROR(c.RankIs(3, 1));
    if (c.Op(3).shape[0] != c.Op(0).shape[1]) {
      return c.Fail("bias is {} but out is {}: bias must have one element per output channel",
                    c.Describe(3), c.Describe(0));
    }
    TERN_RETURN_IF_ERROR(c.SameDtypeAs(3, 0));
  }
  return OkStatus();
}

Status CheckConv2dBackwardInput(Checker& c) {
  ConvParams p;
  TERN_RETURN_IF_ERROR(ConvInts(c, &p));
  // grad_input plays the input, grad_out the output.
  return CheckConvGeometry(c, p, 0, 2, 1);
}

Status CheckConv2dBackwardWeight(Checker& c) {
  ConvParams p;
  TERN_RETURN_IF_ERROR(ConvInts(c, &p));
  return CheckConvGeometry(c, p, 2, 0, 1);
}

bool IsComparison(int64_t fn) { return fn >= TERN_BINARY_EQ && fn <= TERN_BINARY_GE; }
bool IsLogical(int64_t fn) {
  return fn >= TERN_BINARY_LOGICAL_AND && fn <= TERN_BINARY_LOGICAL_XOR;
}

Status CheckBinary(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "tern_binary_fn_t"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t fn = c.ints()[0];
  if (BinaryFnName(fn) == nullptr) return c.Unsupported("unknown binary function {}", fn);
  c.SetPrefix(fmt::format("binary {}", BinaryFnName(fn)));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(2, 0));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 1));
  const tern_dtype_t dtype = c.Op(1).dtype;
  if (IsComparison(fn) || IsLogical(fn)) {
    TERN_RETURN_IF_ERROR(c.DtypeIs(0, TERN_DTYPE_BOOL));
  } else if (c.Op(0).dtype != dtype) {
    return c.Fail("out is {} but a is {}: out must have the inputs' dtype", c.Describe(0),
                  c.Describe(1));
  }
  switch (fn) {
    case TERN_BINARY_DIV:
    case TERN_BINARY_ATAN2:
    case TERN_BINARY_COPYSIGN:
      if (!IsFloat(dtype)) {
        return c.Fail(
            "a is {}; {} takes float dtypes (f32, bf16, f16){}", c.Describe(1), BinaryFnName(fn),
            fn == TERN_BINARY_DIV ? "; use floor_divide for integers or cast to a float dtype"
                                  : "");
      }
      break;
    case TERN_BINARY_BITWISE_AND:
    case TERN_BINARY_BITWISE_OR:
    case TERN_BINARY_BITWISE_XOR:
      if (IsFloat(dtype)) {
        return c.Fail("a is {}; {} takes integer or bool dtypes", c.Describe(1), BinaryFnName(fn));
      }
      break;
    case TERN_BINARY_ADD:
    case TERN_BINARY_SUB:
    case TERN_BINARY_MUL:
    case TERN_BINARY_POW:
    case TERN_BINARY_REMAINDER:
    case TERN_BINARY_FMOD:
    case TERN_BINARY_FLOOR_DIVIDE:
      if (IsBool(dtype)) {
        return c.Fail("a is {}; {} does not take bool (use the logical functions, or cast)",
                      c.Describe(1), BinaryFnName(fn));
      }
      break;
    default:
      break;
  }
  return OkStatus();
}

Status CheckWhere(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  for (size_t slot : {size_t{1}, size_t{2}, size_t{3}})
    TERN_RETURN_IF_ERROR(c.SameShapeAs(slot, 0));
  TERN_RETURN_IF_ERROR(c.DtypeIs(1, TERN_DTYPE_BOOL));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 0));
  return c.SameDtypeAs(3, 0);
}

Status CheckReduce(Checker& c) {
  if (c.ints().empty()) return c.Fail("takes ints [tern_reduce_fn_t, axes...], got none");
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t fn = c.ints()[0];
  if (ReduceFnName(fn) == nullptr) return c.Unsupported("unknown reduce function {}", fn);
  c.SetPrefix(fmt::format("reduce {}", ReduceFnName(fn)));
  const OperandDesc& out = c.Op(0);
  const OperandDesc& in = c.Op(1);
  if (c.ints().size() - 1 > in.rank) {
    return c.Fail("{} axes given but in is {} (rank {})", c.ints().size() - 1, c.Describe(1),
                  in.rank);
  }
  std::array<bool, TERN_MAX_RANK> reduced{};
  for (size_t i = 1; i < c.ints().size(); ++i) {
    uint32_t axis = 0;
    TERN_RETURN_IF_ERROR(c.Axis(c.ints()[i], in.rank, "axis", false, &axis));
    if (reduced[axis]) return c.Fail("axis {} is given twice", axis);
    reduced[axis] = true;
  }
  if (c.ints().size() == 1) reduced.fill(true);  // no axes: all of them
  if (out.rank != in.rank) {
    return c.Fail("out is {} but in is {}: out keeps in's rank with reduced axes of size 1",
                  c.Describe(0), c.Describe(1));
  }
  int64_t reduced_count = 1;
  for (uint32_t i = 0; i < in.rank; ++i) {
    int64_t expect = reduced[i] ? 1 : in.shape[i];
    if (out.shape[i] != expect) {
      return c.Fail("out is {} but in is {}: dimension {} must be {} ({})", c.Describe(0),
                    c.Describe(1), i, expect, reduced[i] ? "reduced" : "kept");
    }
    if (reduced[i]) reduced_count *= in.shape[i] == 0 ? 0 : 1;
  }
  switch (fn) {
    case TERN_REDUCE_SUM:
    case TERN_REDUCE_PROD:
    case TERN_REDUCE_MEAN:
      TERN_RETURN_IF_ERROR(c.NotBool(1));
      if (fn == TERN_REDUCE_MEAN) TERN_RETURN_IF_ERROR(c.FloatDtype(1));
      if (out.dtype != in.dtype && !(out.dtype == TERN_DTYPE_F32 && IsFloat(in.dtype))) {
        return c.Fail("out is {} but in is {}: out must have in's dtype (or f32 for bf16/f16)",
                      c.Describe(0), c.Describe(1));
      }
      break;
    case TERN_REDUCE_MAX:
    case TERN_REDUCE_MIN:
      TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 1));
      break;
    case TERN_REDUCE_ARGMAX:
    case TERN_REDUCE_ARGMIN:
      TERN_RETURN_IF_ERROR(c.DtypeIs(0, TERN_DTYPE_I64));
      break;
    default:  // ANY, ALL
      TERN_RETURN_IF_ERROR(c.DtypeIs(0, TERN_DTYPE_BOOL));
      break;
  }
  if (reduced_count == 0 && (fn == TERN_REDUCE_MAX || fn == TERN_REDUCE_MIN ||
                             fn == TERN_REDUCE_ARGMAX || fn == TERN_REDUCE_ARGMIN)) {
    return c.Fail("in is {}: a reduced axis has size 0 and {} of an empty set is undefined",
                  c.Describe(1), ReduceFnName(fn));
  }
  return OkStatus();
}

Status CheckSoftmaxInts(Checker& c, uint32_t rank) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 2, "axis, log"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], rank, "axis", true, &axis));
  if (c.ints().size() > 1 && c.ints()[1] != 0 && c.ints()[1] != 1) {
    return c.Fail("log (ints[1]) is {}; it must be 0 (softmax) or 1 (log-softmax)", c.ints()[1]);
  }
  return OkStatus();
}

Status CheckSoftmax(Checker& c) {
  TERN_RETURN_IF_ERROR(CheckSoftmaxInts(c, c.Op(1).rank));
  TERN_RETURN_IF_ERROR(c.FloatDtype(1));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  return c.SameDtypeAs(0, 1);
}

Status CheckSoftmaxBackward(Checker& c) {
  TERN_RETURN_IF_ERROR(CheckSoftmaxInts(c, c.Op(0).rank));
  TERN_RETURN_IF_ERROR(c.FloatDtype(0));
  for (size_t slot : {size_t{1}, size_t{2}}) {
    TERN_RETURN_IF_ERROR(c.SameShapeAs(slot, 0));
    TERN_RETURN_IF_ERROR(c.SameDtypeAs(slot, 0));
  }
  return OkStatus();
}

// Normalisation over the last k axes of `in` (slot): checks ints[0] and
// returns k.
Status NormAxes(Checker& c, size_t in, uint32_t* k) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "number of normalized trailing axes"));
  const int64_t v = c.ints()[0];
  const uint32_t rank = c.Op(in).rank;
  if (v < 1 || v > rank) {
    return c.Fail("ints[0] (normalized axes) is {} but in is {}: it must be in [1, {}]", v,
                  c.Describe(in), rank);
  }
  *k = static_cast<uint32_t>(v);
  return OkStatus();
}

Status CheckEps(Checker& c) {
  TERN_RETURN_IF_ERROR(c.FloatCount(1, 1, "eps"));
  double eps = c.floats()[0];
  if (!(eps > 0) || !std::isfinite(eps))
    return c.Fail("eps (floats[0]) is {}; it must be finite and > 0", eps);
  return OkStatus();
}

// `slot` must have in's leading shape (all but the last k axes).
Status LeadingShape(const Checker& c, size_t slot, size_t in, uint32_t k) {
  if (!c.Has(slot)) return OkStatus();
  const OperandDesc& d = c.Op(slot);
  const OperandDesc& x = c.Op(in);
  bool ok = d.rank == x.rank - k;
  for (uint32_t i = 0; ok && i < d.rank; ++i) ok = d.shape[i] == x.shape[i];
  if (!ok) {
    return c.Fail("{} is {} but {} is {}: {} must have the leading shape {}", c.Name(slot),
                  c.Describe(slot), c.Name(in), c.Describe(in), c.Name(slot),
                  ShapeString(x.shape.data(), x.rank - k));
  }
  return c.FloatDtype(slot);
}

// `slot` must have in's trailing (normalized) shape.
Status TrailingShape(const Checker& c, size_t slot, size_t in, uint32_t k) {
  if (!c.Has(slot)) return OkStatus();
  const OperandDesc& d = c.Op(slot);
  const OperandDesc& x = c.Op(in);
  bool ok = d.rank == k;
  for (uint32_t i = 0; ok && i < k; ++i) ok = d.shape[i] == x.shape[x.rank - k + i];
  if (!ok) {
    return c.Fail("{} is {} but {} is {}: {} must have the normalized shape {}", c.Name(slot),
                  c.Describe(slot), c.Name(in), c.Describe(in), c.Name(slot),
                  ShapeString(x.shape.data() + x.rank - k, k));
  }
  return c.FloatDtype(slot);
}

Status CheckLayerNorm(Checker& c) {
  // [out, mean?, rstd?, in, weight?, bias?]
  uint32_t k = 0;
  TERN_RETURN_IF_ERROR(NormAxes(c, 3, &k));
  TERN_RETURN_IF_ERROR(CheckEps(c));
  TERN_RETURN_IF_ERROR(c.FloatDtype(3));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(0, 3));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 3));
  TERN_RETURN_IF_ERROR(LeadingShape(c, 1, 3, k));
  TERN_RETURN_IF_ERROR(LeadingShape(c, 2, 3, k));
  TERN_RETURN_IF_ERROR(TrailingShape(c, 4, 3, k));
  return TrailingShape(c, 5, 3, k);
}

Status CheckLayerNormBackward(Checker& c) {
  // [grad_in, grad_weight?, grad_bias?, grad_out, in, mean, rstd, weight?]
  uint32_t k = 0;
  TERN_RETURN_IF_ERROR(NormAxes(c, 4, &k));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatDtype(4));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(0, 4));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 4));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(3, 4));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(3, 4));
  TERN_RETURN_IF_ERROR(LeadingShape(c, 5, 4, k));
  TERN_RETURN_IF_ERROR(LeadingShape(c, 6, 4, k));
  TERN_RETURN_IF_ERROR(TrailingShape(c, 1, 4, k));
  TERN_RETURN_IF_ERROR(TrailingShape(c, 2, 4, k));
  return TrailingShape(c, 7, 4, k);
}

Status CheckRmsNorm(Checker& c) {
  // [out, rstd?, in, weight?]
  uint32_t k = 0;
  TERN_RETURN_IF_ERROR(NormAxes(c, 2, &k));
  TERN_RETURN_IF_ERROR(CheckEps(c));
  TERN_RETURN_IF_ERROR(c.FloatDtype(2));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(0, 2));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 2));
  TERN_RETURN_IF_ERROR(LeadingShape(c, 1, 2, k));
  return TrailingShape(c, 3, 2, k);
}

Status CheckRmsNormBackward(Checker& c) {
  // [grad_in, grad_weight?, grad_out, in, rstd, weight?]
  uint32_t k = 0;
  TERN_RETURN_IF_ERROR(NormAxes(c, 3, &k));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  TERN_RETURN_IF_ERROR(c.FloatDtype(3));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(0, 3));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(0, 3));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(2, 3));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(2, 3));
  TERN_RETURN_IF_ERROR(LeadingShape(c, 4, 3, k));
  TERN_RETURN_IF_ERROR(TrailingShape(c, 1, 3, k));
  return TrailingShape(c, 5, 3, k);
}

enum class UnaryKind { kFloat, kNumeric, kAny, kIntegerOrBool };

UnaryKind UnaryKindOf(int64_t fn) {
  switch (fn) {
    case TERN_UNARY_NEG:
    case TERN_UNARY_ABS:
    case TERN_UNARY_RELU:
    case TERN_UNARY_FLOOR:
    case TERN_UNARY_CEIL:
    case TERN_UNARY_ROUND:
    case TERN_UNARY_TRUNC:
    case TERN_UNARY_SIGN:
    case TERN_UNARY_SQUARE:
    case TERN_UNARY_CLAMP:
      return UnaryKind::kNumeric;
    case TERN_UNARY_LOGICAL_NOT:
    case TERN_UNARY_ISNAN:
      return UnaryKind::kAny;
    case TERN_UNARY_BITWISE_NOT:
      return UnaryKind::kIntegerOrBool;
    default:
      return UnaryKind::kFloat;
  }
}

// The floats of a unary function: [min, max] count; whether they must be
// finite.
Status CheckUnaryFloats(Checker& c, int64_t fn) {
  switch (fn) {
    case TERN_UNARY_LEAKY_RELU:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 1, "negative_slope, default 0.01"));
      return c.FiniteFloats("negative_slope");
    case TERN_UNARY_ELU:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 1, "alpha, default 1"));
      return c.FiniteFloats("alpha");
    case TERN_UNARY_POW_SCALAR:
      TERN_RETURN_IF_ERROR(c.FloatCount(1, 1, "exponent"));
      return c.FiniteFloats("exponent");
    case TERN_UNARY_CLAMP:
      TERN_RETURN_IF_ERROR(c.FloatCount(2, 2, "min, max"));
      for (size_t i = 0; i < 2; ++i) {
        if (std::isnan(c.floats()[i]))
          return c.Fail("floats[{}] ({}) is NaN", i, i == 0 ? "min" : "max");
      }
      return OkStatus();
    case TERN_UNARY_AFFINE:
      TERN_RETURN_IF_ERROR(c.FloatCount(2, 2, "scale, shift"));
      return c.FiniteFloats("scale, shift");
    case TERN_UNARY_SOFTPLUS:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "beta, threshold; default 1, 20"));
      TERN_RETURN_IF_ERROR(c.FiniteFloats("beta, threshold"));
      if (!c.floats().empty() && !(c.floats()[0] > 0)) {
        return c.Fail("beta (floats[0]) is {}; it must be > 0", c.floats()[0]);
      }
      return OkStatus();
    default:
      return c.FloatCount(0, 0, "none");
  }
}

Status CheckUnary(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "tern_unary_fn_t"));
  const int64_t fn = c.ints()[0];
  if (UnaryFnName(fn) == nullptr) return c.Unsupported("unknown unary function {}", fn);
  c.SetPrefix(fmt::format("unary {}", UnaryFnName(fn)));
  TERN_RETURN_IF_ERROR(CheckUnaryFloats(c, fn));
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  const tern_dtype_t dtype = c.Op(1).dtype;
  switch (UnaryKindOf(fn)) {
    case UnaryKind::kFloat:
      if (!IsFloat(dtype)) {
        return c.Fail("in is {}; {} takes float dtypes (f32, bf16, f16): cast first", c.Describe(1),
                      UnaryFnName(fn));
      }
      break;
    case UnaryKind::kNumeric:
      TERN_RETURN_IF_ERROR(c.NotBool(1));
      break;
    case UnaryKind::kIntegerOrBool:
      if (IsFloat(dtype))
        return c.Fail("in is {}; bitwise_not takes integer or bool dtypes", c.Describe(1));
      break;
    case UnaryKind::kAny:
      break;
  }
  if (fn == TERN_UNARY_LOGICAL_NOT || fn == TERN_UNARY_ISNAN) return c.DtypeIs(0, TERN_DTYPE_BOOL);
  return c.SameDtypeAs(0, 1);
}

Status CheckUnaryBackward(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "tern_unary_fn_t"));
  const int64_t fn = c.ints()[0];
  if (UnaryFnName(fn) == nullptr) return c.Unsupported("unknown unary function {}", fn);
  c.SetPrefix(fmt::format("unary_backward {}", UnaryFnName(fn)));
  if (fn == TERN_UNARY_LOGICAL_NOT || fn == TERN_UNARY_ISNAN || fn == TERN_UNARY_BITWISE_NOT) {
    return c.Fail("{} has no gradient", UnaryFnName(fn));
  }
  TERN_RETURN_IF_ERROR(CheckUnaryFloats(c, fn));
  TERN_RETURN_IF_ERROR(c.FloatDtype(2));
  for (size_t slot : {size_t{0}, size_t{1}}) {
    TERN_RETURN_IF_ERROR(c.SameShapeAs(slot, 2));
    TERN_RETURN_IF_ERROR(c.SameDtypeAs(slot, 2));
  }
  return OkStatus();
}

// out.shape == table[:axis] + indices.shape + table[axis+1:]
Status CheckIndexedShape(const Checker& c, size_t table, size_t indices, size_t gathered,
                         uint32_t axis) {
  const OperandDesc& t = c.Op(table);
  const OperandDesc& idx = c.Op(indices);
  const OperandDesc& g = c.Op(gathered);
  std::array<int64_t, 3 * TERN_MAX_RANK> expect{};
  uint32_t n = 0;
  for (uint32_t i = 0; i < axis; ++i) expect[n++] = t.shape[i];
  for (uint32_t i = 0; i < idx.rank; ++i) expect[n++] = idx.shape[i];
  for (uint32_t i = axis + 1; i < t.rank; ++i) expect[n++] = t.shape[i];
  bool ok = g.rank == n;
  for (uint32_t i = 0; ok && i < n; ++i) ok = g.shape[i] == expect[i];
  if (!ok) {
    return c.Fail("{} is {} but {} is {} and {} is {} along axis {}: {} must be {}",
                  c.Name(gathered), c.Describe(gathered), c.Name(table), c.Describe(table),
                  c.Name(indices), c.Describe(indices), axis, c.Name(gathered),
                  ShapeString(expect.data(), n));
  }
  return OkStatus();
}

Status CheckGather(Checker& c, bool scatter) {
  // gather [out, table, indices]; scatter_add [out, indices, src] (out is the table).
  const size_t table = scatter ? 0 : 1, indices = scatter ? 1 : 2, gathered = scatter ? 2 : 0;
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  if (c.Op(table).rank == 0)
    return c.Fail("{} is {}; it must have rank 1 or more", c.Name(table), c.Describe(table));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], c.Op(table).rank, "axis", false, &axis));
  TERN_RETURN_IF_ERROR(c.IndexDtype(indices));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(gathered, table));
  if (scatter) TERN_RETURN_IF_ERROR(c.NotBool(0));
  return CheckIndexedShape(c, table, indices, gathered, axis);
}

Status CheckTakeAlongAxis(Checker& c, bool scatter) {
  // take [out, in, indices]: out.shape == indices.shape.
  // scatter [out, indices, src]: src.shape == indices.shape.
  const size_t table = scatter ? 0 : 1, indices = scatter ? 1 : 2, values = scatter ? 2 : 0;
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const OperandDesc& t = c.Op(table);
  const OperandDesc& idx = c.Op(indices);
  if (t.rank == 0)
    return c.Fail("{} is {}; it must have rank 1 or more", c.Name(table), c.Describe(table));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], t.rank, "axis", false, &axis));
  TERN_RETURN_IF_ERROR(c.IndexDtype(indices));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(values, table));
  if (scatter) TERN_RETURN_IF_ERROR(c.NotBool(0));
  if (idx.rank != t.rank) {
    return c.Fail("{} is {} but {} is {}: ranks must be equal", c.Name(indices),
                  c.Describe(indices), c.Name(table), c.Describe(table));
  }
  TERN_RETURN_IF_ERROR(c.SameShapeAs(values, indices));
  for (uint32_t d = 0; d < t.rank; ++d) {
    if (d != axis && idx.shape[d] > t.shape[d]) {
      return c.Fail("{} is {} but {} is {}: dimension {} of the indices ({}) exceeds {} ({})",
                    c.Name(indices), c.Describe(indices), c.Name(table), c.Describe(table), d,
                    idx.shape[d], c.Name(table), t.shape[d]);
    }
  }
  return OkStatus();
}

Status CheckIota(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(1, 1, "axis"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "start, step; default 0, 1"));
  TERN_RETURN_IF_ERROR(c.FiniteFloats("start, step"));
  TERN_RETURN_IF_ERROR(c.NotBool(0));
  uint32_t axis = 0;
  TERN_RETURN_IF_ERROR(c.Axis(c.ints()[0], c.Op(0).rank, "axis", true, &axis));
  if (IsInteger(c.Op(0).dtype)) {
    for (size_t i = 0; i < c.floats().size(); ++i) {
      double v = c.floats()[i];
      if (v != std::trunc(v) || std::fabs(v) > 9007199254740992.0) {
        return c.Fail(
            "floats[{}] is {}; an integer iota takes integral start and step (|v| <= 2^53)", i, v);
      }
    }
  }
  return OkStatus();
}

Status CheckRandom(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(3, 3, "tern_random_fn_t, seed, offset"));
  const int64_t fn = c.ints()[0];
  if (RandomFnName(fn) == nullptr) return c.Unsupported("unknown random function {}", fn);
  c.SetPrefix(fmt::format("random {}", RandomFnName(fn)));
  if (c.ints()[2] < 0) return c.Fail("offset (ints[2]) is {}; it must be >= 0", c.ints()[2]);
  const tern_dtype_t dtype = c.Op(0).dtype;
  switch (fn) {
    case TERN_RANDOM_UNIFORM: {
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "low, high; default 0, 1"));
      TERN_RETURN_IF_ERROR(c.FiniteFloats("low, high"));
      TERN_RETURN_IF_ERROR(c.NotBool(0));
      double low = c.floats().size() > 0 ? c.floats()[0] : 0.0;
      double high = c.floats().size() > 1 ? c.floats()[1] : 1.0;
      if (IsInteger(dtype)) {
        if (low != std::trunc(low) || high != std::trunc(high)) {
          return c.Fail("an integer uniform takes integral low and high, got [{}, {})", low, high);
        }
        if (!(low < high)) return c.Fail("low {} must be < high {}", low, high);
        if (high - low > 4294967296.0) {
          return c.Fail(
              "the range [{}, {}) is wider than 2^32 values, the most an integer uniform draws",
              low, high);
        }
        double lo = dtype == TERN_DTYPE_I8    ? -128.0
                    : dtype == TERN_DTYPE_I32 ? -2147483648.0
                                              : -9223372036854775808.0;
        double hi = dtype == TERN_DTYPE_I8    ? 128.0
                    : dtype == TERN_DTYPE_I32 ? 2147483648.0
                                              : 9223372036854775808.0;
        if (low < lo || high > hi) {
          return c.Fail("the range [{}, {}) does not fit out's dtype {}", low, high,
                        DTypeName(dtype));
        }
      } else if (!(low <= high)) {
        return c.Fail("low {} must be <= high {}", low, high);
      }
      return OkStatus();
    }
    case TERN_RANDOM_NORMAL:
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 2, "mean, std; default 0, 1"));
      TERN_RETURN_IF_ERROR(c.FiniteFloats("mean, std"));
      TERN_RETURN_IF_ERROR(c.FloatDtype(0));
      if (c.floats().size() > 1 && !(c.floats()[1] >= 0))
        return c.Fail("std {} must be >= 0", c.floats()[1]);
      return OkStatus();
    default: {  // BERNOULLI
      TERN_RETURN_IF_ERROR(c.FloatCount(0, 1, "p; default 0.5"));
      double p = c.floats().empty() ? 0.5 : c.floats()[0];
      if (!(p >= 0 && p <= 1)) return c.Fail("p {} must be in [0, 1]", p);
      return OkStatus();
    }
  }
}

Status CheckAllReduce(Checker& c) {
  TERN_RETURN_IF_ERROR(c.IntCount(0, 1, "tern_reduce_fn_t, default sum"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  if (!c.ints().empty()) {
    int64_t fn = c.ints()[0];
    if (ReduceFnName(fn) == nullptr) return c.Unsupported("unknown reduce function {}", fn);
    if (fn != TERN_REDUCE_SUM && fn != TERN_REDUCE_MEAN && fn != TERN_REDUCE_MAX &&
        fn != TERN_REDUCE_MIN && fn != TERN_REDUCE_PROD) {
      return c.Fail("reduce function {} is not a collective reduction (sum, mean, max, min, prod)",
                    ReduceFnName(fn));
    }
  }
  TERN_RETURN_IF_ERROR(c.SameShapeAs(1, 0));
  TERN_RETURN_IF_ERROR(c.SameDtypeAs(1, 0));
  return c.NotBool(0);
}

Status CheckSemaphore(Checker& c, bool wait) {
  TERN_RETURN_IF_ERROR(c.IntCount(2, 2, wait ? "semaphore, value" : "semaphore, increment"));
  TERN_RETURN_IF_ERROR(c.FloatCount(0, 0, "none"));
  const int64_t sem = c.ints()[0], v = c.ints()[1];
  if (sem < 0 || sem >= kMaxSemaphores) {
    return c.Fail("semaphore {} is out of range (0 to {})", sem, kMaxSemaphores - 1);
  }
  if (wait && (v < 0 || v > (int64_t{1} << 40))) return c.Fail("value {} must be in [0, 2^40]", v);
  if (!wait && (v < 1 || v > (int64_t{1} << 32)))
    return c.Fail("increment {} must be in [1, 2^32]", v);
  return OkStatus();
}

}  // namespace

int64_t OperandDesc::element_count() const {
  int64_t n = 1;
  for (uint32_t i = 0; i < rank && i < TERN_MAX_RANK; ++i) n *= shape[i];
  return n;
}

size_t DTypeSize(tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
    case TERN_DTYPE_I32:
      return 4;
    case TERN_DTYPE_BF16:
    case TERN_DTYPE_F16:
      return 2;
    case TERN_DTYPE_I8:
    case TERN_DTYPE_BOOL:
      return 1;
    case TERN_DTYPE_I64:
      return 8;
    default:
      return 0;
  }
}

const char* DTypeName(tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return "f32";
    case TERN_DTYPE_BF16:
      return "bf16";
    case TERN_DTYPE_F16:
      return "f16";
    case TERN_DTYPE_I8:
      return "i8";
    case TERN_DTYPE_I32:
      return "i32";
    case TERN_DTYPE_I64:
      return "i64";
    case TERN_DTYPE_BOOL:
      return "bool";
    default:
      return "unknown";
  }
}

bool IsFloat(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16;
}

bool IsInteger(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_I8 || dtype == TERN_DTYPE_I32 || dtype == TERN_DTYPE_I64;
}

const char* OpcodeName(uint32_t opcode) {
  const OpInfo* info = FindOp(opcode);
  return info ? info->name : nullptr;
}

tern_engine_t OpcodeEngine(uint32_t opcode) {
  if (FindOp(opcode) == nullptr) return static_cast<tern_engine_t>(0);
  return static_cast<tern_engine_t>(opcode >> 8);
}

const char* EngineName(tern_engine_t engine) {
  switch (engine) {
    case TERN_ENGINE_DMA:
      return "dma";
    case TERN_ENGINE_TENSOR:
      return "tensor";
    case TERN_ENGINE_VECTOR:
      return "vector";
    case TERN_ENGINE_SCALAR:
      return "scalar";
    case TERN_ENGINE_GPSIMD:
      return "gpsimd";
    case TERN_ENGINE_COLLECTIVE:
      return "collective";
    case TERN_ENGINE_SYNC:
      return "sync";
    default:
      return "unknown";
  }
}

const char* UnaryFnName(int64_t fn) {
  return fn >= 0 && fn < TERN_UNARY_COUNT ? kUnaryNames[fn] : nullptr;
}
const char* BinaryFnName(int64_t fn) {
  return fn >= 0 && fn < TERN_BINARY_COUNT ? kBinaryNames[fn] : nullptr;
}
const char* ReduceFnName(int64_t fn) {
  return fn >= 0 && fn < TERN_REDUCE_COUNT ? kReduceNames[fn] : nullptr;
}
const char* RandomFnName(int64_t fn) {
  return fn >= 0 && fn < TERN_RANDOM_COUNT ? kRandomNames[fn] : nullptr;
}

bool SetContiguousStrides(OperandDesc* desc) {
  // Each stride is the product of the dimensions inside it. The product of
  // them all (the element count) is not a stride and is not computed, so a
  // shape whose strides fit never overflows; those that do not fit (only
  // possible with a dimension of 0 beside huge ones, or more elements than
  // int64 counts) saturate at INT64_MAX instead of overflowing (undefined).
  int64_t stride = 1;
  bool exact = true;
  for (int i = static_cast<int>(std::min<uint32_t>(desc->rank, TERN_MAX_RANK)) - 1; i >= 0; --i) {
    desc->strides[i] = stride;
    if (i == 0) break;
    if (desc->shape[i] < 0) exact = false;
    if (__builtin_mul_overflow(stride, desc->shape[i], &stride)) {
      stride = INT64_MAX;
      exact = false;
    }
  }
  return exact;
}

Status OperandExtent(const OperandDesc& desc, uint64_t* begin, uint64_t* end) {
  if (!KnownDtype(Raw(desc.dtype))) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "unknown dtype {}", Raw(desc.dtype));
  }
  const size_t size = DTypeSize(desc.dtype);
  if (size == 0) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "unknown dtype {}",
                      static_cast<int>(desc.dtype));
  }
  if (desc.rank > TERN_MAX_RANK) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "rank {} exceeds the maximum {}", desc.rank,
                      TERN_MAX_RANK);
  }
  bool empty = false;
  for (uint32_t i = 0; i < desc.rank; ++i) {
    if (desc.shape[i] < 0) {
      return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "dimension {} is negative ({})", i,
                        desc.shape[i]);
    }
    if (desc.strides[i] < 0) {
      return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "stride {} is negative ({})", i,
                        desc.strides[i]);
    }
    if (desc.shape[i] == 0) empty = true;
  }
  if (empty) {
    *begin = *end = desc.offset;
    return OkStatus();
  }
  uint64_t last = 0;  // element offset of the last element
  for (uint32_t i = 0; i < desc.rank; ++i) {
    uint64_t step = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(desc.shape[i] - 1),
                               static_cast<uint64_t>(desc.strides[i]), &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "{}: the extent overflows",
                        DescribeOperand(desc));
    }
  }
  uint64_t bytes = 0, stop = 0;
  if (__builtin_add_overflow(last, uint64_t{1}, &bytes) ||
      __builtin_mul_overflow(bytes, uint64_t{size}, &bytes) ||
      __builtin_add_overflow(desc.offset, bytes, &stop)) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "{} at offset {}: the extent overflows",
                      DescribeOperand(desc), desc.offset);
  }
  *begin = desc.offset;
  *end = stop;
  return OkStatus();
}

std::string DescribeOperand(const OperandDesc& desc) {
  const uint32_t rank = std::min<uint32_t>(desc.rank, TERN_MAX_RANK);
  std::string s = ShapeString(desc.shape.data(), rank) + " " +
                  (KnownDtype(Raw(desc.dtype)) ? DTypeName(desc.dtype) : "unknown");
  OperandDesc contiguous = desc;
  contiguous.rank = rank;
  if (!IsContiguous(contiguous)) s += " strides " + ShapeString(desc.strides.data(), rank);
  return s;
}

size_t MaxOperands(uint32_t opcode) {
  const OpInfo* info = FindOp(opcode);
  return info ? info->count : 0;
}

const char* OperandName(uint32_t opcode, size_t slot) {
  const OpInfo* info = FindOp(opcode);
  return info && slot < info->count ? info->operands[slot] : nullptr;
}

bool OperandIsOptional(uint32_t opcode, size_t slot) {
  const OpInfo* info = FindOp(opcode);
  return info && slot < info->count && (info->optional_mask & Bit(slot));
}

bool OperandIsWritten(uint32_t opcode, size_t slot) {
  const OpInfo* info = FindOp(opcode);
  return info && slot < info->count && (info->written_mask & Bit(slot));
}

Status ValidateInstruction(uint32_t opcode, std::span<const OperandDesc> operands,
                           std::span<const int64_t> ints, std::span<const double> floats) {
  const OpInfo* info = FindOp(opcode);
  if (info == nullptr) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                      "unknown opcode 0x{:04x} (engine {}); this version of tern does not know it",
                      opcode, opcode >> 8);
  }
  Checker c(*info, operands, ints, floats);
  TERN_RETURN_IF_ERROR(c.Structure());
  switch (opcode) {
    case TERN_OP_COPY:
      return CheckCopy(c);
    case TERN_OP_CAST:
      return CheckCast(c);
    case TERN_OP_FILL:
      return CheckFill(c);
    case TERN_OP_MATMUL:
      return CheckMatmul(c);
    case TERN_OP_CONV2D:
      return CheckConv2d(c);
    case TERN_OP_CONV2D_BACKWARD_INPUT:
      return CheckConv2dBackwardInput(c);
    case TERN_OP_CONV2D_BACKWARD_WEIGHT:
      return CheckConv2dBackwardWeight(c);
    case TERN_OP_BINARY:
      return CheckBinary(c);
    case TERN_OP_WHERE:
      return CheckWhere(c);
    case TERN_OP_REDUCE:
      return CheckReduce(c);
    case TERN_OP_SOFTMAX:
      return CheckSoftmax(c);
    case TERN_OP_SOFTMAX_BACKWARD:
      return CheckSoftmaxBackward(c);
    case TERN_OP_LAYER_NORM:
      return CheckLayerNorm(c);
    case TERN_OP_LAYER_NORM_BACKWARD:
      return CheckLayerNormBackward(c);
    case TERN_OP_RMS_NORM:
      return CheckRmsNorm(c);
    case TERN_OP_RMS_NORM_BACKWARD:
      return CheckRmsNormBackward(c);
    case TERN_OP_UNARY:
      return CheckUnary(c);
    case TERN_OP_UNARY_BACKWARD:
      return CheckUnaryBackward(c);
    case TERN_OP_GATHER:
      return CheckGather(c, false);
    case TERN_OP_SCATTER_ADD:
      return CheckGather(c, true);
    case TERN_OP_TAKE_ALONG_AXIS:
      return CheckTakeAlongAxis(c, false);
    case TERN_OP_SCATTER_ADD_ALONG_AXIS:
      return CheckTakeAlongAxis(c, true);
    case TERN_OP_IOTA:
      return CheckIota(c);
    case TERN_OP_RANDOM:
      return CheckRandom(c);
    case TERN_OP_ALL_REDUCE:
      return CheckAllReduce(c);
    case TERN_OP_SEM_SIGNAL:
      return CheckSemaphore(c, false);
    case TERN_OP_SEM_WAIT:
      return CheckSemaphore(c, true);
    default:
      return MakeStatus(TERN_ERROR_INTERNAL, "opcode 0x{:04x} has no rules", opcode);
  }
}

}  // namespace tern::isa
