// The rules of the instruction set. docs/isa.md is the prose version of what
// ValidateInstruction enforces; keep the two in step. This file holds the
// opcode table, the names, the checks every operand gets and the dispatch;
// the rules of each engine's opcodes are in isa_rules_<engine>.cc.
#include "common/isa_rules.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "common/isa_rules_internal.h"

namespace tern::isa {
namespace {

using rules::Bit;
using rules::KnownDtype;
using rules::OpInfo;

constexpr OpInfo kOps[] = {
    {TERN_OP_COPY, "copy", {"dst", "src"}, 2, 0, Bit(0)},
    {TERN_OP_CAST, "cast", {"dst", "src"}, 2, 0, Bit(0)},
    {TERN_OP_FILL, "fill", {"dst"}, 1, 0, Bit(0)},
    {TERN_OP_MATMUL, "matmul", {"out", "a", "b", "bias", "residual"}, 5, Bit(3) | Bit(4), Bit(0)},
    {TERN_OP_CONV2D,
     "conv2d",
     {"out", "input", "weight", "bias", "residual"},
     5,
     Bit(3) | Bit(4),
     Bit(0)},
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
    {TERN_OP_ELEMENTWISE,
     "elementwise",
     {"out0", "out1", "out2", "out3", "in0", "in1", "in2", "in3", "in4", "in5", "in6", "in7"},
     12,
     Bit(1) | Bit(2) | Bit(3) | Bit(5) | Bit(6) | Bit(7) | Bit(8) | Bit(9) | Bit(10) | Bit(11),
     Bit(0) | Bit(1) | Bit(2) | Bit(3)},
    {TERN_OP_SCAN, "scan", {"out", "in"}, 2, 0, Bit(0)},
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
    {TERN_OP_SORT, "sort", {"values", "indices", "in"}, 3, 0, Bit(0) | Bit(1)},
    {TERN_OP_TOPK, "topk", {"values", "indices", "in"}, 3, 0, Bit(0) | Bit(1)},
    {TERN_OP_SCATTER, "scatter", {"out", "indices", "src"}, 3, 0, Bit(0)},
    {TERN_OP_SCATTER_ALONG_AXIS, "scatter_along_axis", {"out", "indices", "src"}, 3, 0, Bit(0)},
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

constexpr const char* kScanNames[] = {"sum", "prod", "max", "min"};
static_assert(std::size(kScanNames) == TERN_SCAN_COUNT);

constexpr const char* kRandomNames[] = {"uniform", "normal", "bernoulli"};
static_assert(std::size(kRandomNames) == TERN_RANDOM_COUNT);

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

}  // namespace

namespace rules {

bool SameShape(const OperandDesc& a, const OperandDesc& b) {
  if (a.rank != b.rank) return false;
  for (uint32_t i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  return true;
}

namespace {

Status CheckOperand(const Checker& c, size_t slot, bool written) {
  const OperandDesc& d = c.Op(slot);
  const char* name = c.Name(slot);
  const int64_t segment = static_cast<int64_t>(d.segment);
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
  if (!KnownDtype(static_cast<int64_t>(d.dtype)))
    return c.Fail("{} has unknown dtype {}", name, static_cast<int64_t>(d.dtype));
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

}  // namespace

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

bool HasF64(std::span<const OperandDesc> operands) {
  for (const OperandDesc& d : operands) {
    if (d.present() && d.dtype == TERN_DTYPE_F64) return true;
  }
  return false;
}

// f64 is a storage dtype with a few exact operations, enough for host-side
// bookkeeping that stays on the device (an AMP scale's reciprocal, a
// float64 accumulator's update): the engines compute in f32 and 16-bit
// formats, and a Vector operation on f64 runs at a fraction of their rate.
Status CheckF64(Checker& c, uint32_t opcode) {
  auto refuse = [&](const char* what) {
    return c.Unsupported(
        "{} does not take f64: f64 is a storage dtype with copy, cast, fill, where and the "
        "Vector engine's add, sub, mul, div, max, min, comparisons, neg, abs, reciprocal, sqrt, "
        "rsqrt, exp, log, sin and cos (feature f64); cast to f32 first",
        what);
  };
  switch (opcode) {
    case TERN_OP_COPY:
    case TERN_OP_CAST:
    case TERN_OP_FILL:
    case TERN_OP_WHERE:
      return OkStatus();
    case TERN_OP_BINARY: {
      const int64_t fn = c.ints().empty() ? -1 : c.ints()[0];
      switch (fn) {
        case TERN_BINARY_ADD:
        case TERN_BINARY_SUB:
        case TERN_BINARY_MUL:
        case TERN_BINARY_DIV:
        case TERN_BINARY_MAX:
        case TERN_BINARY_MIN:
        case TERN_BINARY_EQ:
        case TERN_BINARY_NE:
        case TERN_BINARY_LT:
        case TERN_BINARY_LE:
        case TERN_BINARY_GT:
        case TERN_BINARY_GE:
          return OkStatus();
        default:
          return refuse(BinaryFnName(fn) ? BinaryFnName(fn) : "this binary function");
      }
    }
    case TERN_OP_UNARY: {
      const int64_t fn = c.ints().empty() ? -1 : c.ints()[0];
      switch (fn) {
        case TERN_UNARY_NEG:
        case TERN_UNARY_ABS:
        case TERN_UNARY_RECIPROCAL:
        case TERN_UNARY_SQRT:
        case TERN_UNARY_RSQRT:
        case TERN_UNARY_EXP:
        case TERN_UNARY_LOG:
        case TERN_UNARY_SIN:  // since 2026-12-04: rotary angles computed in float64
        case TERN_UNARY_COS:
          return OkStatus();
        default:
          return refuse(UnaryFnName(fn) ? UnaryFnName(fn) : "this unary function");
      }
    }
    default:
      return refuse(OpcodeName(opcode));
  }
}

}  // namespace rules

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
    case TERN_DTYPE_F64:
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
    case TERN_DTYPE_F64:
      return "f64";
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
const char* ScanFnName(int64_t fn) {
  return fn >= 0 && fn < TERN_SCAN_COUNT ? kScanNames[fn] : nullptr;
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
  if (!KnownDtype(static_cast<int64_t>(desc.dtype))) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_INVALID, "unknown dtype {}",
                      static_cast<int64_t>(desc.dtype));
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

std::string ShapeString(const int64_t* dims, uint32_t rank) {
  std::string s = "[";
  for (uint32_t i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

std::string DescribeOperand(const OperandDesc& desc) {
  const uint32_t rank = std::min<uint32_t>(desc.rank, TERN_MAX_RANK);
  std::string s =
      ShapeString(desc.shape.data(), rank) + " " +
      (KnownDtype(static_cast<int64_t>(desc.dtype)) ? DTypeName(desc.dtype) : "unknown");
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

namespace {

uint64_t OpcodeFeatures(uint32_t opcode, std::span<const OperandDesc> operands,
                        std::span<const int64_t> ints) {
  const bool residual = operands.size() > 4 && operands[4].present();
  switch (opcode) {
    case TERN_OP_ELEMENTWISE:
      return TERN_FEATURE_ELEMENTWISE_PROGRAMS;
    case TERN_OP_SCAN:
      return TERN_FEATURE_SCAN;
    case TERN_OP_SORT:
    case TERN_OP_TOPK:
      return TERN_FEATURE_SORT;
    case TERN_OP_SCATTER:
    case TERN_OP_SCATTER_ALONG_AXIS:
      return TERN_FEATURE_SCATTER;
    case TERN_OP_MATMUL:
      return (residual || (ints.size() > 2 && ints[2] != TERN_ACTIVATION_NONE))
                 ? TERN_FEATURE_TENSOR_EPILOGUES
                 : 0;
    case TERN_OP_CONV2D:
      return (residual || (ints.size() > 7 && ints[7] != TERN_ACTIVATION_NONE))
                 ? TERN_FEATURE_TENSOR_EPILOGUES
                 : 0;
    default:
      return 0;
  }
}

}  // namespace

uint64_t FeaturesOf(uint32_t opcode, std::span<const OperandDesc> operands,
                    std::span<const int64_t> ints) {
  return OpcodeFeatures(opcode, operands, ints) | (rules::HasF64(operands) ? TERN_FEATURE_F64 : 0);
}

std::string FeatureNames(uint64_t bits) {
  static constexpr struct {
    uint64_t bit;
    const char* name;
  } kFeatures[] = {{TERN_FEATURE_ELEMENTWISE_PROGRAMS, "elementwise-programs"},
                   {TERN_FEATURE_TENSOR_EPILOGUES, "tensor-epilogues"},
                   {TERN_FEATURE_SCAN, "scan"},
                   {TERN_FEATURE_SORT, "sort"},
                   {TERN_FEATURE_SCATTER, "scatter"},
                   {TERN_FEATURE_F64, "f64"}};
  std::string names;
  for (const auto& feature : kFeatures) {
    if (!(bits & feature.bit)) continue;
    if (!names.empty()) names += ", ";
    names += feature.name;
    bits &= ~feature.bit;
  }
  for (int bit = 0; bit < 64; ++bit) {
    if (!(bits & (uint64_t{1} << bit))) continue;
    if (!names.empty()) names += ", ";
    names += fmt::format("bit {}", bit);
  }
  return names.empty() ? "none" : names;
}

Status ValidateInstruction(uint32_t opcode, std::span<const OperandDesc> operands,
                           std::span<const int64_t> ints, std::span<const double> floats) {
  const OpInfo* info = FindOp(opcode);
  if (info == nullptr) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                      "unknown opcode 0x{:04x} (engine {}); this version of tern does not know it",
                      opcode, opcode >> 8);
  }
  rules::Checker c(*info, operands, ints, floats);
  TERN_RETURN_IF_ERROR(c.Structure());
  if (rules::HasF64(operands)) TERN_RETURN_IF_ERROR(rules::CheckF64(c, opcode));
  switch (opcode) {
    case TERN_OP_COPY:
      return rules::CheckCopy(c);
    case TERN_OP_CAST:
      return rules::CheckCast(c);
    case TERN_OP_FILL:
      return rules::CheckFill(c);
    case TERN_OP_MATMUL:
      return rules::CheckMatmul(c);
    case TERN_OP_CONV2D:
      return rules::CheckConv2d(c);
    case TERN_OP_CONV2D_BACKWARD_INPUT:
      return rules::CheckConv2dBackwardInput(c);
    case TERN_OP_CONV2D_BACKWARD_WEIGHT:
      return rules::CheckConv2dBackwardWeight(c);
    case TERN_OP_BINARY:
      return rules::CheckBinary(c);
    case TERN_OP_WHERE:
      return rules::CheckWhere(c);
    case TERN_OP_REDUCE:
      return rules::CheckReduce(c);
    case TERN_OP_SOFTMAX:
      return rules::CheckSoftmax(c);
    case TERN_OP_SOFTMAX_BACKWARD:
      return rules::CheckSoftmaxBackward(c);
    case TERN_OP_LAYER_NORM:
      return rules::CheckLayerNorm(c);
    case TERN_OP_LAYER_NORM_BACKWARD:
      return rules::CheckLayerNormBackward(c);
    case TERN_OP_RMS_NORM:
      return rules::CheckRmsNorm(c);
    case TERN_OP_RMS_NORM_BACKWARD:
      return rules::CheckRmsNormBackward(c);
    case TERN_OP_ELEMENTWISE:
      return rules::CheckElementwise(c);
    case TERN_OP_SCAN:
      return rules::CheckScan(c);
    case TERN_OP_UNARY:
      return rules::CheckUnary(c);
    case TERN_OP_UNARY_BACKWARD:
      return rules::CheckUnaryBackward(c);
    case TERN_OP_GATHER:
      return rules::CheckGather(c, false);
    case TERN_OP_SCATTER_ADD:
      return rules::CheckGather(c, true);
    case TERN_OP_TAKE_ALONG_AXIS:
      return rules::CheckTakeAlongAxis(c, false);
    case TERN_OP_SCATTER_ADD_ALONG_AXIS:
      return rules::CheckTakeAlongAxis(c, true);
    case TERN_OP_IOTA:
      return rules::CheckIota(c);
    case TERN_OP_RANDOM:
      return rules::CheckRandom(c);
    case TERN_OP_SORT:
      return rules::CheckSort(c, false);
    case TERN_OP_TOPK:
      return rules::CheckSort(c, true);
    case TERN_OP_SCATTER:
      return rules::CheckGather(c, true, /*accumulate=*/false);
    case TERN_OP_SCATTER_ALONG_AXIS:
      return rules::CheckTakeAlongAxis(c, true, /*accumulate=*/false);
    case TERN_OP_ALL_REDUCE:
      return rules::CheckAllReduce(c);
    case TERN_OP_SEM_SIGNAL:
      return rules::CheckSemaphore(c, false);
    case TERN_OP_SEM_WAIT:
      return rules::CheckSemaphore(c, true);
    default:
      return MakeStatus(TERN_ERROR_INTERNAL, "opcode 0x{:04x} has no rules", opcode);
  }
}

}  // namespace tern::isa
