#include "kernel_test_util.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "driver_shim/sim/engines/numerics.h"

namespace tern::testing {

std::string ShapeStr(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor::Tensor(tern_dtype_t dtype, Shape shape) : shape_(std::move(shape)) {
  desc_.segment = TERN_SEGMENT_OUTPUT;
  desc_.dtype = dtype;
  desc_.rank = static_cast<uint32_t>(shape_.size());
  for (size_t i = 0; i < shape_.size(); ++i) desc_.shape[i] = shape_[i];
  isa::SetContiguousStrides(&desc_);
  Allocate();
}

Tensor Tensor::Strided(tern_dtype_t dtype, Shape shape, Shape strides) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.desc_.segment = TERN_SEGMENT_OUTPUT;
  t.desc_.dtype = dtype;
  t.desc_.rank = static_cast<uint32_t>(t.shape_.size());
  for (size_t i = 0; i < t.shape_.size(); ++i) {
    t.desc_.shape[i] = t.shape_[i];
    t.desc_.strides[i] = strides[i];
  }
  t.Allocate();
  return t;
}

Tensor Tensor::Permuted(tern_dtype_t dtype, Shape shape, std::vector<int> order) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(order.size()) - 1; i >= 0; --i) {
    strides[order[i]] = s;
    s *= shape[order[i]];
  }
  return Strided(dtype, std::move(shape), std::move(strides));
}

Tensor Tensor::Broadcast(tern_dtype_t dtype, Shape shape, std::vector<bool> broadcast) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (broadcast[i]) {
      strides[i] = 0;
    } else {
      strides[i] = s;
      s *= shape[i];
    }
  }
  return Strided(dtype, std::move(shape), std::move(strides));
}

Tensor Tensor::Spaced(tern_dtype_t dtype, Shape shape) {
  Shape strides(shape.size());
  int64_t s = 2;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return Strided(dtype, std::move(shape), std::move(strides));
}

void Tensor::Allocate() {
  uint64_t begin = 0, end = 0;
  Status st = isa::OperandExtent(desc_, &begin, &end);
  EXPECT_TRUE(st.ok()) << st.message();
  storage_.assign((end + 7) / 8 + 1, 0);
}

void Tensor::Poison(uint8_t byte) { std::memset(storage_.data(), byte, storage_.size() * 8); }

std::vector<int64_t> Tensor::Index(int64_t linear) const {
  std::vector<int64_t> idx(shape_.size());
  for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
    idx[d] = linear % shape_[d];
    linear /= shape_[d];
  }
  return idx;
}

int64_t Tensor::Offset(int64_t linear) const {
  int64_t off = 0;
  for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
    off += (linear % shape_[d]) * desc_.strides[d];
    linear /= shape_[d];
  }
  return off;
}

uint64_t Tensor::Bits(int64_t linear) const {
  uint64_t v = 0;
  const size_t size = isa::DTypeSize(desc_.dtype);
  std::memcpy(&v, data() + Offset(linear) * size, size);
  return v;
}

double Tensor::Get(int64_t linear) const {
  const uint8_t* p = data() + Offset(linear) * isa::DTypeSize(desc_.dtype);
  switch (desc_.dtype) {
    case TERN_DTYPE_F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case TERN_DTYPE_BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return sim::num::Bf16ToF32(h);
    }
    case TERN_DTYPE_F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return sim::num::F16ToF32(h);
    }
    case TERN_DTYPE_F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    default:
      return static_cast<double>(GetInt(linear));
  }
}

int64_t Tensor::GetInt(int64_t linear) const {
  const uint8_t* p = data() + Offset(linear) * isa::DTypeSize(desc_.dtype);
  switch (desc_.dtype) {
    case TERN_DTYPE_I8:
      return *reinterpret_cast<const int8_t*>(p);
    case TERN_DTYPE_I32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case TERN_DTYPE_I64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case TERN_DTYPE_BOOL:
      return *p;
    default: {
      // A float element read as an integer (a test's reference over mixed
      // dtypes): truncated, and NaN or out of int64's range as INT64_MIN,
      // which is what x86's conversion gives, without the undefined cast.
      double v = Get(linear);
      if (!(v >= -9.2233720368547758e18 && v < 9.2233720368547758e18)) return INT64_MIN;
      return static_cast<int64_t>(v);
    }
  }
}

void Tensor::Set(int64_t linear, double v) {
  uint8_t* p = data() + Offset(linear) * isa::DTypeSize(desc_.dtype);
  switch (desc_.dtype) {
    case TERN_DTYPE_F32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case TERN_DTYPE_BF16: {
      uint16_t h = sim::num::F32ToBf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case TERN_DTYPE_F16: {
      uint16_t h = sim::num::F32ToF16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case TERN_DTYPE_F64:
      std::memcpy(p, &v, 8);
      return;
    default:
      SetInt(linear, static_cast<int64_t>(v));
  }
}

void Tensor::SetInt(int64_t linear, int64_t v) {
  uint8_t* p = data() + Offset(linear) * isa::DTypeSize(desc_.dtype);
  switch (desc_.dtype) {
    case TERN_DTYPE_I8:
      *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(v);
      return;
    case TERN_DTYPE_I32: {
      int32_t w = static_cast<int32_t>(v);
      std::memcpy(p, &w, 4);
      return;
    }
    case TERN_DTYPE_I64:
      std::memcpy(p, &v, 8);
      return;
    case TERN_DTYPE_BOOL:
      *p = v != 0;
      return;
    default:
      Set(linear, static_cast<double>(v));
  }
}

void Tensor::SetAll(const std::vector<double>& values) {
  for (int64_t i = 0; i < count(); ++i) Set(i, values[i]);
}

std::vector<double> Tensor::Values() const {
  std::vector<double> v(count());
  for (int64_t i = 0; i < count(); ++i) v[i] = Get(i);
  return v;
}

void Tensor::Randomize(std::mt19937_64& rng, double lo, double hi) {
  for (int64_t i = 0; i < count(); ++i) {
    if (isa::IsFloat(dtype())) {
      Set(i, std::uniform_real_distribution<double>(lo, hi)(rng));
    } else if (dtype() == TERN_DTYPE_BOOL) {
      SetInt(i, static_cast<int64_t>(rng() & 1));
    } else {
      int64_t a = static_cast<int64_t>(std::ceil(lo)), b = static_cast<int64_t>(std::floor(hi));
      if (dtype() == TERN_DTYPE_I8) a = std::max<int64_t>(a, -128), b = std::min<int64_t>(b, 127);
      SetInt(i, std::uniform_int_distribution<int64_t>(a, b)(rng));
    }
  }
}

namespace {

driver::Instruction MakeInstruction(uint32_t opcode, const std::vector<Tensor*>& operands,
                                    std::vector<int64_t> ints, std::vector<double> floats) {
  driver::Instruction ins;
  ins.opcode = opcode;
  ins.engine = isa::OpcodeEngine(opcode);
  for (Tensor* t : operands) {
    if (t == nullptr) {
      ins.operands.emplace_back();  // segment NONE
    } else {
      ins.operands.push_back(t->desc());
    }
  }
  ins.ints = std::move(ints);
  ins.floats = std::move(floats);
  return ins;
}

}  // namespace

Status Validate(uint32_t opcode, std::vector<Tensor*> operands, std::vector<int64_t> ints,
                std::vector<double> floats) {
  driver::Instruction ins = MakeInstruction(opcode, operands, std::move(ints), std::move(floats));
  return isa::ValidateInstruction(opcode, ins.operands, ins.ints, ins.floats);
}

namespace {

// Validates `ins`; a failure fails the test.
Status ValidateOrFail(const driver::Instruction& ins) {
  Status valid = isa::ValidateInstruction(ins.opcode, ins.operands, ins.ints, ins.floats);
  if (!valid.ok()) {
    ADD_FAILURE() << "validation rejected the instruction: " << valid.message();
  }
  return valid;
}

// Runs `ins` on `operands` (one tensor, or null, per operand).
Status RunOn(const driver::Instruction& ins, const std::vector<Tensor*>& operands) {
  std::vector<sim::TensorView> views(operands.size());
  for (size_t i = 0; i < operands.size(); ++i) {
    views[i].desc = &ins.operands[i];
    views[i].data = operands[i] ? operands[i]->data() : nullptr;
  }
  return sim::RunInstruction(ins, views);
}

}  // namespace

Status Exec(uint32_t opcode, std::vector<Tensor*> operands, std::vector<int64_t> ints,
            std::vector<double> floats) {
  const driver::Instruction ins =
      MakeInstruction(opcode, operands, std::move(ints), std::move(floats));
  TERN_RETURN_IF_ERROR(ValidateOrFail(ins));
  return RunOn(ins, operands);
}

Status ExecPrepared(uint32_t opcode, std::vector<Tensor*> operands, size_t constant,
                    std::vector<int64_t> ints, std::vector<double> floats, bool* prepared) {
  driver::Instruction ins = MakeInstruction(opcode, operands, std::move(ints), std::move(floats));
  ins.operands[constant].segment = TERN_SEGMENT_CONSTANT;
  ins.operands[constant].index = 0;
  TERN_RETURN_IF_ERROR(ValidateOrFail(ins));
  // The constants segment is the tensor's storage (its desc's offset is 0).
  ins.prepared = sim::PrepareInstruction(ins, operands[constant]->data());
  *prepared = ins.prepared != nullptr;
  return RunOn(ins, operands);
}

Tolerance TolFor(tern_dtype_t dtype, double scale) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return {2e-5 * scale, 1e-5 * scale};
    case TERN_DTYPE_F16:
      return {2e-3 * scale, 2e-3 * scale};
    case TERN_DTYPE_BF16:
      return {1.6e-2 * scale, 1.6e-2 * scale};
    default:
      return {0, 0};
  }
}

double RoundToDtype(tern_dtype_t dtype, double v) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return static_cast<float>(v);
    case TERN_DTYPE_BF16:
      return sim::num::Bf16ToF32(sim::num::F32ToBf16(static_cast<float>(v)));
    case TERN_DTYPE_F16:
      return sim::num::F16ToF32(sim::num::F32ToF16(static_cast<float>(v)));
    default:
      return v;
  }
}

namespace {

::testing::AssertionResult Compare(const Tensor& got, const std::vector<double>& ref, Tolerance tol,
                                   bool exact) {
  if (static_cast<int64_t>(ref.size()) != got.count()) {
    return ::testing::AssertionFailure()
           << "reference has " << ref.size() << " elements, tensor " << got.count();
  }
  int failures = 0;
  std::string report;
  for (int64_t i = 0; i < got.count(); ++i) {
    const double g = got.Get(i), r = ref[i];
    bool ok;
    if (std::isnan(r)) {
      ok = std::isnan(g);
    } else if (std::isinf(r) || exact) {
      ok = g == r;
    } else {
      ok = std::fabs(g - r) <= tol.atol + tol.rtol * std::fabs(r);
    }
    if (!ok) {
      if (++failures <= 5) {
        report += fmt::format("\n  at {} (linear {}): got {:.9g}, expected {:.9g}",
                              ShapeStr(got.Index(i)), i, g, r);
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << got.count() << " elements of " << ShapeStr(got.shape()) << " "
         << isa::DTypeName(got.dtype()) << " differ (rtol " << tol.rtol << ", atol " << tol.atol
         << "):" << report;
}

}  // namespace

::testing::AssertionResult Near(const Tensor& got, const std::vector<double>& ref, Tolerance tol) {
  return Compare(got, ref, tol, false);
}

::testing::AssertionResult Equal(const Tensor& got, const std::vector<double>& ref) {
  return Compare(got, ref, {0, 0}, true);
}

::testing::AssertionResult SameBits(const Tensor& got, const Tensor& want) {
  if (got.count() != want.count()) return ::testing::AssertionFailure() << "counts differ";
  for (int64_t i = 0; i < got.count(); ++i) {
    if (got.Bits(i) != want.Bits(i)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got.Get(i) << ", want " << want.Get(i);
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tern::testing
