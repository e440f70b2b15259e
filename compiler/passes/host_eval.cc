#include "compiler/passes/host_eval.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include "compiler/ir/ops.h"

namespace tern::compiler::passes_internal {
namespace {

uint32_t Bits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, 4);
  return bits;
}

float FromBits(uint32_t bits) {
  float value = 0;
  std::memcpy(&value, &bits, 4);
  return value;
}

bool IsFloat(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16;
}

bool IsInteger(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_I8 || dtype == TERN_DTYPE_I32 || dtype == TERN_DTYPE_I64 ||
         dtype == TERN_DTYPE_BOOL;
}

float LoadFloat(tern_dtype_t dtype, const uint8_t* p) {
  if (dtype == TERN_DTYPE_F32) {
    float value = 0;
    std::memcpy(&value, p, 4);
    return value;
  }
  uint16_t bits = 0;
  std::memcpy(&bits, p, 2);
  return dtype == TERN_DTYPE_BF16 ? BFloat16BitsToFloat(bits) : HalfBitsToFloat(bits);
}

// Stores `value` rounded to nearest even; false for a NaN into a 16-bit
// float (see ConvertElements).
bool StoreFloat(tern_dtype_t dtype, float value, uint8_t* p) {
  if (dtype == TERN_DTYPE_F32) {
    std::memcpy(p, &value, 4);
    return true;
  }
  if (std::isnan(value)) return false;
  const uint16_t bits =
      dtype == TERN_DTYPE_BF16 ? FloatToBFloat16Bits(value) : FloatToHalfBits(value);
  std::memcpy(p, &bits, 2);
  return true;
}

int64_t LoadInt(tern_dtype_t dtype, const uint8_t* p) {
  switch (dtype) {
    case TERN_DTYPE_I8: {
      int8_t v = 0;
      std::memcpy(&v, p, 1);
      return v;
    }
    case TERN_DTYPE_I32: {
      int32_t v = 0;
      std::memcpy(&v, p, 4);
      return v;
    }
    case TERN_DTYPE_I64: {
      int64_t v = 0;
      std::memcpy(&v, p, 8);
      return v;
    }
    default:
      return *p != 0 ? 1 : 0;  // bool
  }
}

// Stores `value` when the dtype holds it exactly.
bool StoreInt(tern_dtype_t dtype, int64_t value, uint8_t* p) {
  switch (dtype) {
    case TERN_DTYPE_I8: {
      if (value < INT8_MIN || value > INT8_MAX) return false;
      const int8_t v = static_cast<int8_t>(value);
      std::memcpy(p, &v, 1);
      return true;
    }
    case TERN_DTYPE_I32: {
      if (value < INT32_MIN || value > INT32_MAX) return false;
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(p, &v, 4);
      return true;
    }
    case TERN_DTYPE_I64:
      std::memcpy(p, &value, 8);
      return true;
    case TERN_DTYPE_BOOL:
      if (value != 0 && value != 1) return false;
      *p = static_cast<uint8_t>(value);
      return true;
    default:
      return false;
  }
}

// The float of `dtype` equal to `value`, when there is one.
bool ExactIntToFloat(int64_t value, tern_dtype_t dtype, float* out) {
  const float f = static_cast<float>(value);
  if (f >= 0x1p63f || static_cast<int64_t>(f) != value) return false;
  if (dtype == TERN_DTYPE_BF16 && BFloat16BitsToFloat(FloatToBFloat16Bits(f)) != f) return false;
  if (dtype == TERN_DTYPE_F16 && HalfBitsToFloat(FloatToHalfBits(f)) != f) return false;
  *out = f;
  return true;
}

// The integer equal to `value`, when there is one in int64's range.
bool ExactFloatToInt(float value, int64_t* out) {
  const double d = value;
  if (!std::isfinite(d) || d != std::trunc(d) || d < -0x1p63 || d >= 0x1p63) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

int64_t Count(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

std::vector<int64_t> StaticShape(const Shape& shape) {
  std::vector<int64_t> dims;
  dims.reserve(shape.size());
  for (const Dim& d : shape) dims.push_back(d.constant().value_or(0));
  return dims;
}

// Walks every index of `shape` in row-major order, calling visit(offsets)
// with one offset per stride set (in elements).
template <size_t N, typename Visit>
void Walk(const std::vector<int64_t>& shape, const std::array<std::vector<int64_t>, N>& strides,
          std::array<int64_t, N> offsets, Visit visit) {
  const int64_t count = Count(shape);
  if (count == 0) return;
  const size_t rank = shape.size();
  std::vector<int64_t> index(rank, 0);
  for (int64_t done = 0; done < count; ++done) {
    visit(offsets);
    for (size_t d = rank; d-- > 0;) {
      for (size_t k = 0; k < N; ++k) offsets[k] += strides[k][d];
      if (++index[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
  }
}

// The row-major bytes of a strided view of `input`.
std::vector<uint8_t> Gather(const HostTensor& input, const std::vector<int64_t>& shape,
                            const std::vector<int64_t>& strides, int64_t offset) {
  const size_t element = tern_dtype_size(input.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(Count(shape)) * element);
  uint8_t* write = out.data();
  Walk<1>(shape, {strides}, {offset}, [&](const std::array<int64_t, 1>& at) {
    std::memcpy(write, input.data + static_cast<size_t>(at[0]) * element, element);
    write += element;
  });
  return out;
}

// Strides that read `in_shape` broadcast to `out_shape` (aligned right;
// stride 0 along broadcast dims).
std::vector<int64_t> BroadcastStrides(const std::vector<int64_t>& in_shape,
                                      const std::vector<int64_t>& out_shape) {
  const std::vector<int64_t> contiguous = ContiguousStrides(in_shape);
  std::vector<int64_t> strides(out_shape.size(), 0);
  const size_t lead = out_shape.size() - in_shape.size();
  for (size_t i = 0; i < in_shape.size(); ++i) {
    strides[lead + i] = in_shape[i] == out_shape[lead + i] ? contiguous[i] : 0;
  }
  return strides;
}

std::optional<int64_t> Dimension(int64_t dim, size_t rank, size_t extra = 0) {
  const int64_t r = std::max<int64_t>(static_cast<int64_t>(rank + extra), 1);
  if (dim < -r || dim >= r) return std::nullopt;
  return dim < 0 ? dim + r : dim;
}

using Result = std::optional<std::vector<uint8_t>>;

struct Evaluation {
  const Graph& graph;
  const Node& node;
  const std::vector<HostTensor>& inputs;
  const TensorType& output;
  InferContext context;

  std::optional<int64_t> Int(const char* name, int64_t fallback) const {
    absl::StatusOr<int64_t> v = context.Int(name, fallback);
    return v.ok() ? std::optional<int64_t>(*v) : std::nullopt;
  }
  bool Has(const char* name) const { return FindAttr(node, name) != nullptr; }
  std::vector<int64_t> OutShape() const { return StaticShape(output.shape); }
  size_t OutBytes() const {
    return static_cast<size_t>(Count(OutShape())) * tern_dtype_size(output.dtype);
  }

  // Ops that keep the elements in row-major order.
  Result Relabel() const {
    const HostTensor& in = inputs[0];
    if (in.dtype != output.dtype || in.size != OutBytes()) return std::nullopt;
    return std::vector<uint8_t>(in.data, in.data + in.size);
  }

  Result Permuted(const std::vector<int64_t>& order) const {
    const HostTensor& in = inputs[0];
    const std::vector<int64_t> contiguous = ContiguousStrides(in.shape);
    std::vector<int64_t> shape, strides;
    for (int64_t d : order) {
      shape.push_back(in.shape[static_cast<size_t>(d)]);
      strides.push_back(contiguous[static_cast<size_t>(d)]);
    }
    if (shape != OutShape()) return std::nullopt;
    return Gather(in, shape, strides, 0);
  }

  Result Permute() const {
    absl::StatusOr<std::vector<int64_t>> dims = context.Ints("dims", {});
    if (!dims.ok() || dims->size() != inputs[0].shape.size()) return std::nullopt;
    std::vector<int64_t> order;
    for (int64_t d : *dims) {
      const std::optional<int64_t> n = Dimension(d, dims->size());
      if (!n) return std::nullopt;
      order.push_back(*n);
    }
    return Permuted(order);
  }

  Result Transpose(int64_t a, int64_t b) const {
    const size_t rank = inputs[0].shape.size();
    if (rank < 2) return Relabel();  // t() of a vector or a scalar
    std::vector<int64_t> order(rank);
    for (size_t i = 0; i < rank; ++i) order[i] = static_cast<int64_t>(i);
    const std::optional<int64_t> na = Dimension(a, rank), nb = Dimension(b, rank);
    if (!na || !nb) return std::nullopt;
    std::swap(order[static_cast<size_t>(*na)], order[static_cast<size_t>(*nb)]);
    return Permuted(order);
  }

  Result Expand() const {
    const HostTensor& in = inputs[0];
    const std::vector<int64_t> shape = OutShape();
    if (in.shape.size() > shape.size()) return std::nullopt;
    return Gather(in, shape, BroadcastStrides(in.shape, shape), 0);
  }

  Result Slice() const {
    const HostTensor& in = inputs[0];
    const std::optional<int64_t> dim = Int("dim", 0), start = Int("start", 0),
                                 end = Int("end", std::numeric_limits<int64_t>::max()),
                                 step = Int("step", 1);
    if (!dim || !start || !end || !step || *step < 1) return std::nullopt;
    const std::optional<int64_t> n = Dimension(*dim, in.shape.size());
    if (!n || in.shape.empty()) return std::nullopt;
    const size_t axis = static_cast<size_t>(*n);
    const int64_t length = in.shape[axis];
    auto clamp = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + length : v, 0, length); };
    const int64_t b = clamp(*start), e = clamp(*end);
    std::vector<int64_t> shape = in.shape, strides = ContiguousStrides(in.shape);
    shape[axis] = e > b ? (e - b - 1) / *step + 1 : 0;
    const int64_t offset = b * strides[axis];
    strides[axis] *= *step;
    if (shape != OutShape()) return std::nullopt;
    return Gather(in, shape, strides, shape[axis] == 0 ? 0 : offset);
  }

  Result Select() const {
    const HostTensor& in = inputs[0];
    const std::optional<int64_t> dim = Int("dim", 0), index = Int("index", 0);
    if (!dim || !index || in.shape.empty()) return std::nullopt;
    const std::optional<int64_t> n = Dimension(*dim, in.shape.size());
    if (!n) return std::nullopt;
    const size_t axis = static_cast<size_t>(*n);
    const int64_t i = *index < 0 ? *index + in.shape[axis] : *index;
    if (i < 0 || i >= in.shape[axis]) return std::nullopt;
    std::vector<int64_t> shape = in.shape, strides = ContiguousStrides(in.shape);
    const int64_t offset = i * strides[axis];
    shape.erase(shape.begin() + static_cast<ptrdiff_t>(axis));
    strides.erase(strides.begin() + static_cast<ptrdiff_t>(axis));
    if (shape != OutShape()) return std::nullopt;
    return Gather(in, shape, strides, offset);
  }

  Result ToCopy() const {
    const HostTensor& in = inputs[0];
    if (static_cast<size_t>(Count(in.shape)) != static_cast<size_t>(Count(OutShape()))) {
      return std::nullopt;
    }
    std::vector<uint8_t> out(OutBytes());
    if (!ConvertElements(in.dtype, in.data, output.dtype, out.data(),
                         static_cast<size_t>(Count(in.shape)))) {
      return std::nullopt;
    }
    return out;
  }

  Result Cat() const {
    const std::vector<int64_t> shape = OutShape();
    const std::optional<int64_t> dim = Int("dim", 0);
    if (!dim || inputs.empty()) return std::nullopt;
    const std::optional<int64_t> n = Dimension(*dim, shape.size());
    if (!n) return std::nullopt;
    const size_t axis = static_cast<size_t>(*n);
    const size_t element = tern_dtype_size(output.dtype);
    int64_t outer = 1;
    for (size_t d = 0; d < axis; ++d) outer *= shape[d];
    // Each piece in the output's dtype, then interleaved along the axis.
    std::vector<std::vector<uint8_t>> pieces;
    std::vector<size_t> inner_bytes;
    for (const HostTensor& in : inputs) {
      if (in.data == nullptr || in.shape.size() != shape.size()) return std::nullopt;
      const size_t count = static_cast<size_t>(Count(in.shape));
      std::vector<uint8_t> piece(count * element);
      if (!ConvertElements(in.dtype, in.data, output.dtype, piece.data(), count)) {
        return std::nullopt;
      }
      inner_bytes.push_back(outer == 0 ? 0 : piece.size() / static_cast<size_t>(outer));
      pieces.push_back(std::move(piece));
    }
    std::vector<uint8_t> out(OutBytes());
    uint8_t* write = out.data();
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t p = 0; p < pieces.size(); ++p) {
        if (write + inner_bytes[p] > out.data() + out.size()) return std::nullopt;
        std::memcpy(write, pieces[p].data() + static_cast<size_t>(o) * inner_bytes[p],
                    inner_bytes[p]);
        write += inner_bytes[p];
      }
    }
    if (write != out.data() + out.size()) return std::nullopt;
    return out;
  }

  // f32 add, sub, mul, div (a tensor or a Python number as `other`), neg.
  Result Arithmetic(char op) const {
    if (output.dtype != TERN_DTYPE_F32) return std::nullopt;
    for (const Attribute& attr : node.attrs) {
      if (attr.name == "alpha") {
        // PyTorch computes self + alpha * other with a fused multiply-add
        // on some paths and not on others; only alpha 1 is exact either way.
        const int64_t* i = std::get_if<int64_t>(&attr.value);
        const double* d = std::get_if<double>(&attr.value);
        if (!(i != nullptr && *i == 1) && !(d != nullptr && *d == 1.0)) return std::nullopt;
      } else if (attr.name != "other") {
        return std::nullopt;
      }
    }
    const HostTensor& a = inputs[0];
    if (a.dtype != TERN_DTYPE_F32) return std::nullopt;
    const std::vector<int64_t> shape = OutShape();
    std::vector<float> out(static_cast<size_t>(Count(shape)));
    auto load = [](const HostTensor& t, int64_t i) {
      return LoadFloat(TERN_DTYPE_F32, t.data + static_cast<size_t>(i) * 4);
    };
    if (op == 'n') {
      if (a.size != out.size() * 4) return std::nullopt;
      for (size_t i = 0; i < out.size(); ++i) out[i] = -load(a, static_cast<int64_t>(i));
      return Bytes(out);
    }
    // The other operand: a tensor (broadcast), or a number the scalar
    // kernels convert to float first.
    std::vector<float> number;
    HostTensor b;
    if (inputs.size() > 1 && inputs[1].data != nullptr) {
      b = inputs[1];
      if (b.dtype != TERN_DTYPE_F32) return std::nullopt;
    } else {
      const Attribute* other = FindAttr(node, "other");
      if (other == nullptr) return std::nullopt;
      if (const double* d = std::get_if<double>(&other->value)) {
        number.push_back(static_cast<float>(*d));
      } else if (const int64_t* i = std::get_if<int64_t>(&other->value)) {
        number.push_back(static_cast<float>(*i));
      } else if (const bool* flag = std::get_if<bool>(&other->value)) {
        number.push_back(*flag ? 1.0f : 0.0f);
      } else {
        return std::nullopt;
      }
      b.dtype = TERN_DTYPE_F32;
      b.data = reinterpret_cast<const uint8_t*>(number.data());
      b.size = 4;
    }
    if (a.shape.size() > shape.size() || b.shape.size() > shape.size()) return std::nullopt;
    float* write = out.data();
    Walk<2>(shape, {BroadcastStrides(a.shape, shape), BroadcastStrides(b.shape, shape)}, {0, 0},
            [&](const std::array<int64_t, 2>& at) {
              const float l = load(a, at[0]), r = load(b, at[1]);
              *write++ = op == '+' ? l + r : op == '-' ? l - r : op == '*' ? l * r : l / r;
            });
    return Bytes(out);
  }

  static std::vector<uint8_t> Bytes(const std::vector<float>& values) {
    std::vector<uint8_t> bytes(values.size() * 4);
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
};

const std::set<std::string_view>& RelabelOps() {
  static const std::set<std::string_view> ops = {
      "aten.view.default",      "aten._unsafe_view.default", "aten.reshape.default",
      "aten.unsqueeze.default", "aten.squeeze.dims",         "aten.squeeze.dim",
      "aten.squeeze.default",   "aten.clone.default",        "aten.alias.default",
  };
  return ops;
}

const std::set<std::string_view>& StridedOps() {
  static const std::set<std::string_view> ops = {
      "aten.permute.default", "aten.t.default",    "aten.transpose.int",
      "aten.expand.default",  "aten.slice.Tensor", "aten.select.int",
  };
  return ops;
}

const std::set<std::string_view>& ComputeOps() {
  static const std::set<std::string_view> ops = {
      "aten._to_copy.default", "aten.cat.default", "aten.add.Tensor",  "aten.add.Scalar",
      "aten.sub.Tensor",       "aten.sub.Scalar",  "aten.mul.Tensor",  "aten.mul.Scalar",
      "aten.div.Tensor",       "aten.div.Scalar",  "aten.neg.default",
  };
  return ops;
}

}  // namespace

uint16_t FloatToBFloat16Bits(float value) {
  uint32_t bits = Bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float BFloat16BitsToFloat(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToHalfBits(float value) {
  const uint32_t bits = Bits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  uint32_t half = 0;
  if (magnitude > 0x7F800000u) {
    half = 0x7E00u;  // NaN
  } else if (magnitude >= 0x477FF000u) {
    half = 0x7C00u;  // 65520 and above round to infinity
  } else if (magnitude >= 0x38800000u) {
    // A normal half: rebias the exponent, round the 13 dropped bits.
    const uint32_t mantissa = magnitude & 0x7FFFFFu;
    half = (((magnitude >> 23) - 112u) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
  } else {
    // A subnormal half (units of 2^-24) or zero.
    const int32_t exponent = static_cast<int32_t>(magnitude >> 23) - 127;
    if (exponent >= -25) {
      const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
      const uint32_t shift = static_cast<uint32_t>(-(exponent + 1));  // 14 to 24
      half = mantissa >> shift;
      const uint32_t rest = mantissa & ((1u << shift) - 1u), midway = 1u << (shift - 1u);
      if (rest > midway || (rest == midway && (half & 1u) != 0)) ++half;
    }
  }
  return static_cast<uint16_t>(sign | half);
}

float HalfBitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  if (exponent == 0x1F) return FromBits(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact
    return sign != 0 ? -magnitude : magnitude;
  }
  return FromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

bool ConvertElements(tern_dtype_t from, const uint8_t* in, tern_dtype_t to, uint8_t* out,
                     size_t count) {
  const size_t in_size = tern_dtype_size(from), out_size = tern_dtype_size(to);
  if (in_size == 0 || out_size == 0) return false;
  if (from == to) {
    if (count > 0) std::memcpy(out, in, count * in_size);
    return true;
  }
  for (size_t i = 0; i < count; ++i, in += in_size, out += out_size) {
    if (IsFloat(from)) {
      const float value = LoadFloat(from, in);
      if (IsFloat(to)) {
        if (!StoreFloat(to, value, out)) return false;
        continue;
      }
      int64_t integer = 0;
      if (!ExactFloatToInt(value, &integer) || !StoreInt(to, integer, out)) return false;
    } else if (IsInteger(from)) {
      const int64_t value = LoadInt(from, in);
      if (IsFloat(to)) {
        float f = 0;
        if (!ExactIntToFloat(value, to, &f) || !StoreFloat(to, f, out)) return false;
      } else if (!StoreInt(to, value, out)) {
        return false;
      }
    } else {
      return false;
    }
  }
  return true;
}

bool CanEvaluate(const std::string& op) {
  return RelabelOps().count(op) > 0 || StridedOps().count(op) > 0 || ComputeOps().count(op) > 0;
}

bool IsLayoutOnly(const Node& node, const Graph& graph) {
  if (RelabelOps().count(node.op) > 0 || StridedOps().count(node.op) > 0) return true;
  if (node.op == "aten._to_copy.default" && !node.inputs.empty() && node.inputs[0] != kNoValue &&
      node.outputs.size() == 1) {
    return graph.values[node.inputs[0]].type.dtype == graph.values[node.outputs[0]].type.dtype;
  }
  return false;
}

std::optional<std::vector<uint8_t>> Evaluate(const Graph& graph, const Node& node,
                                             const std::vector<HostTensor>& inputs,
                                             const TensorType& output) {
  if (inputs.empty() || inputs[0].data == nullptr || inputs.size() != node.inputs.size()) {
    return std::nullopt;
  }
  for (const HostTensor& in : inputs) {
    if (in.data != nullptr &&
        in.size != static_cast<size_t>(Count(in.shape)) * tern_dtype_size(in.dtype)) {
      return std::nullopt;  // bytes that do not match the type: never read past them
    }
  }
  InferContext context{graph, node, {}};
  for (uint32_t id : node.inputs) {
    context.inputs.push_back(id == kNoValue ? nullptr : &graph.values[id].type);
  }
  const Evaluation e{graph, node, inputs, output, std::move(context)};
  const std::string& op = node.op;
  if (RelabelOps().count(op) > 0) return e.Relabel();
  if (op == "aten.permute.default") return e.Permute();
  if (op == "aten.t.default") return e.Transpose(0, 1);
  if (op == "aten.transpose.int") {
    if (!e.Has("dim0") || !e.Has("dim1")) return std::nullopt;
    const std::optional<int64_t> a = e.Int("dim0", 0), b = e.Int("dim1", 0);
    if (!a || !b) return std::nullopt;
    return e.Transpose(*a, *b);
  }
  if (op == "aten.expand.default") return e.Expand();
  if (op == "aten.slice.Tensor") return e.Slice();
  if (op == "aten.select.int") return e.Select();
  if (op == "aten._to_copy.default") return e.ToCopy();
  if (op == "aten.cat.default") return e.Cat();
  if (op == "aten.add.Tensor" || op == "aten.add.Scalar") return e.Arithmetic('+');
  if (op == "aten.sub.Tensor" || op == "aten.sub.Scalar") return e.Arithmetic('-');
  if (op == "aten.mul.Tensor" || op == "aten.mul.Scalar") return e.Arithmetic('*');
  if (op == "aten.div.Tensor" || op == "aten.div.Scalar") return e.Arithmetic('/');
  if (op == "aten.neg.default") return e.Arithmetic('n');
  return std::nullopt;
}

}  // namespace tern::compiler::passes_internal
