#include "aten/program.h"

#include <ATen/TensorUtils.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "aten/minimal.h"
#include "runtime/allocator.h"
#include "runtime/capture.h"
#include "runtime/runtime.h"

// The executable API is new in libtern; bind it weakly so that the plugin
// also loads against a libtern that does not export it yet (then every op
// takes its fallback path). Once every supported libtern has it, these lines
// can go.
#pragma weak tern_builder_create
#pragma weak tern_builder_destroy
#pragma weak tern_builder_add_constants
#pragma weak tern_builder_begin_function
#pragma weak tern_builder_add_input
#pragma weak tern_builder_add_output
#pragma weak tern_builder_set_scratch
#pragma weak tern_builder_add_instruction
#pragma weak tern_builder_end_function
#pragma weak tern_builder_finish
#pragma weak tern_builder_free_data
#pragma weak tern_executable_load
#pragma weak tern_executable_unload
#pragma weak tern_queue_execute

namespace torch_tern::program {

constexpr size_t kMaxElementwiseInputs = 3;

struct ElementwiseKey {
  const char* name = nullptr;
  int32_t opcode = 0;
  int32_t dtype = 0;
  int64_t fn = 0;
  int64_t numel = 0;
  int32_t device = 0;
  int32_t inputs = 0;
  // Input i is input same_as[i] again (bound once), or -1.
  std::array<int8_t, kMaxElementwiseInputs> same_as{-1, -1, -1};
  ElementwiseScalar scalar = ElementwiseScalar::kNone;  // a run-time scalar, and its use
  uint8_t single = 0;  // bit i: input i is one element (0-dim), broadcast to out's count

  bool operator==(const ElementwiseKey&) const = default;
};

namespace {

struct ElementwiseKeyHash {
  size_t operator()(const ElementwiseKey& k) const noexcept {
    size_t h = std::hash<const void*>()(k.name);
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ULL + (h >> 29); };
    mix(static_cast<uint64_t>(k.opcode) << 32 | static_cast<uint32_t>(k.dtype));
    mix(static_cast<uint64_t>(k.fn));
    mix(static_cast<uint64_t>(k.numel));
    mix(static_cast<uint64_t>(k.device) << 32 | static_cast<uint32_t>(k.inputs));
    for (int8_t s : k.same_as) mix(static_cast<uint8_t>(s));
    return h;
  }
};

// Executables kept loaded; the least recently used one beyond this is
// unloaded (executions already queued keep what they need; a run about to
// submit it defers that, see SubmitWindow).
constexpr size_t kCacheCapacity = 4096;

struct Entry {
  tern_executable_t executable = nullptr;  // nullptr: refused, see error
  uint32_t function = 0;
  std::string error;
  std::list<std::string>::iterator lru;
  // The key RunElementwise also finds it by, if any.
  std::optional<ElementwiseKey> elementwise_key;
};

std::mutex g_mutex;
auto* g_cache = new std::unordered_map<std::string, Entry>();
// RunElementwise's index into g_cache (entries are stable in the map).
auto* g_elementwise = new std::unordered_map<ElementwiseKey, Entry*, ElementwiseKeyHash>();
auto* g_lru = new std::list<std::string>();  // front: most recently used
CacheInfo g_info;                            // launches aside: g_launches
// Counted without g_mutex: every native op's run adds one.
std::atomic<int64_t> g_launches{0};

template <typename T>
void Append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void AppendOperand(std::string& key, const Operand& o) {
  Append(key, static_cast<uint8_t>(o.segment));
  if (!o.present()) return;
  Append(key, static_cast<uint8_t>(o.dtype));
  Append(key, o.index);
  Append(key, o.offset);
  Append(key, static_cast<uint8_t>(o.shape.size()));
  for (size_t d = 0; d < o.shape.size(); ++d) {
    Append(key, o.shape[d]);
    Append(key, o.strides[d]);
  }
}

Dims ContiguousStrides(c10::IntArrayRef shape) {
  Dims strides(shape.size());
  int64_t s = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

int64_t WrapDim(int64_t dim, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  if (dim < 0) dim += r;
  TORCH_CHECK(dim >= 0 && dim < r, "kernels: dimension out of range");
  return dim;
}

void UnloadNow(tern_executable_t executable) {
  if (executable != nullptr) tern_executable_unload(executable);
}

// Executables that captured graphs use (torch.tern.graph) stay loaded while
// those graphs live: a pinned executable that the cache evicts (or a one-off
// one) is unloaded when its last pin goes. Guarded by g_pin_mutex, which is
// never held while taking g_mutex.
std::mutex g_pin_mutex;
auto* g_pins = new std::unordered_map<tern_executable_t, int64_t>();
auto* g_unload_when_unpinned = new std::unordered_map<tern_executable_t, bool>();

void Unload(tern_executable_t executable) {
  if (executable == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_pin_mutex);
    if (g_pins->count(executable) != 0) {
      (*g_unload_when_unpinned)[executable] = true;
      return;
    }
  }
  UnloadNow(executable);
}

void Unpin(void* pinned) {
  auto* executable = static_cast<tern_executable_t>(pinned);
  bool unload = false;
  {
    std::lock_guard<std::mutex> lock(g_pin_mutex);
    auto it = g_pins->find(executable);
    if (it == g_pins->end() || --it->second > 0) return;
    g_pins->erase(it);
    unload = g_unload_when_unpinned->erase(executable) != 0;
  }
  if (unload) UnloadNow(executable);
}

// A pin of `executable` that lasts as long as the returned pointer.
std::shared_ptr<void> Pin(tern_executable_t executable) {
  {
    std::lock_guard<std::mutex> lock(g_pin_mutex);
    ++(*g_pins)[executable];
  }
  return std::shared_ptr<void>(static_cast<void*>(executable), &Unpin);
}

// Between its lookup under g_mutex and its submission, a run holds a bare
// executable handle that another thread's eviction or ClearCache() could
// unload (the autograd device thread runs ops while Python clears the cache).
// Runs in that window are counted (incremented under g_mutex), and what the
// cache drops while any is in it is retired rather than unloaded: whoever ends
// the last such run unloads the retired ones. Queued executions keep their
// executable alive themselves, so nothing waits for the device.
std::atomic<int64_t> g_submitting{0};
auto* g_retired = new std::vector<tern_executable_t>();  // guarded by g_mutex
std::atomic<bool> g_any_retired{false};

// Under g_mutex: drops `executable` from the cache's keeping.
void RetireLocked(tern_executable_t executable) {
  if (executable == nullptr) return;
  g_retired->push_back(executable);
  // Sequentially consistent, as are the counter's decrement and both loads:
  // each side stores, then loads what the other stored (with weaker orders
  // both could read the old values and the unload would wait for a later run).
  g_any_retired.store(true);
}

// Without g_mutex: unloads the retired executables unless a run is between
// its lookup and its submission (that run's end does it).
void UnloadRetired() {
  std::vector<tern_executable_t> retired;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_submitting.load() != 0) return;
    retired.swap(*g_retired);
    g_any_retired.store(false, std::memory_order_relaxed);
  }
  for (tern_executable_t executable : retired) Unload(executable);
}

// One run's stay between lookup and submission: Enter() under g_mutex, the
// end when this goes out of scope (after the submission, or on an error).
class SubmitWindow {
 public:
  SubmitWindow() = default;
  SubmitWindow(const SubmitWindow&) = delete;
  SubmitWindow& operator=(const SubmitWindow&) = delete;
  ~SubmitWindow() {
    if (entered_ && g_submitting.fetch_sub(1) == 1 && g_any_retired.load()) {
      UnloadRetired();
    }
  }
  void Enter() {  // under g_mutex
    g_submitting.fetch_add(1, std::memory_order_relaxed);
    entered_ = true;
  }

 private:
  bool entered_ = false;
};

}  // namespace

bool ExecutablesAvailable() {
  static const bool available = [] {
    const char* env = std::getenv("TORCH_TERN_KERNELS");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return tern_builder_create != nullptr && tern_builder_destroy != nullptr &&
           tern_builder_add_constants != nullptr && tern_builder_begin_function != nullptr &&
           tern_builder_add_input != nullptr && tern_builder_add_output != nullptr &&
           tern_builder_set_scratch != nullptr && tern_builder_add_instruction != nullptr &&
           tern_builder_end_function != nullptr && tern_builder_finish != nullptr &&
           tern_builder_free_data != nullptr && tern_executable_load != nullptr &&
           tern_executable_unload != nullptr && tern_queue_execute != nullptr;
  }();
  return available;
}

std::optional<tern_dtype_t> ToTernDtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return TERN_DTYPE_F32;
    case at::kBFloat16:
      return TERN_DTYPE_BF16;
    case at::kHalf:
      return TERN_DTYPE_F16;
    case at::kChar:
      return TERN_DTYPE_I8;
    case at::kInt:
      return TERN_DTYPE_I32;
    case at::kLong:
      return TERN_DTYPE_I64;
    case at::kBool:
      return TERN_DTYPE_BOOL;
    default:
      return std::nullopt;
  }
}

int64_t DtypeSize(tern_dtype_t dtype) {
  const uint64_t size = tern_dtype_size(dtype);
  TORCH_CHECK(size > 0, "kernels: dtype ", static_cast<int>(dtype), " is unknown to libtern");
  return static_cast<int64_t>(size);
}

// ---- Operand views ----------------------------------------------------------

int64_t Operand::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool Operand::IsContiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

Operand Operand::Expand(c10::IntArrayRef to) const {
  TORCH_CHECK(static_cast<int64_t>(to.size()) >= dim(), "kernels: cannot expand rank ", dim(),
              " to rank ", to.size());
  Operand o = *this;
  const int64_t lead = static_cast<int64_t>(to.size()) - dim();
  o.shape.assign(to.begin(), to.end());
  o.strides.assign(to.size(), 0);
  for (int64_t d = 0; d < dim(); ++d) {
    if (shape[d] == to[lead + d]) {
      o.strides[lead + d] = strides[d];
    } else {
      TORCH_CHECK(shape[d] == 1, "kernels: cannot expand size ", shape[d], " to ", to[lead + d]);
    }
  }
  return o;
}

Operand Operand::View(c10::IntArrayRef to) const {
  Operand o = *this;
  auto strides_opt = at::detail::computeStride(shape, strides, to);
  TORCH_CHECK(strides_opt.has_value(), "kernels: view of a non-viewable layout");
  o.shape.assign(to.begin(), to.end());
  o.strides.assign(strides_opt->begin(), strides_opt->end());
  return o;
}

Operand Operand::Permute(c10::IntArrayRef dims) const {
  TORCH_CHECK(static_cast<int64_t>(dims.size()) == dim(), "kernels: permute rank mismatch");
  Operand o = *this;
  for (int64_t d = 0; d < dim(); ++d) {
    o.shape[d] = shape[dims[d]];
    o.strides[d] = strides[dims[d]];
  }
  return o;
}

Operand Operand::Transpose(int64_t a, int64_t b) const {
  Operand o = *this;
  a = WrapDim(a, dim());
  b = WrapDim(b, dim());
  std::swap(o.shape[a], o.shape[b]);
  std::swap(o.strides[a], o.strides[b]);
  return o;
}

Operand Operand::Slice(int64_t d, int64_t start, int64_t length, int64_t step) const {
  Operand o = *this;
  d = WrapDim(d, dim());
  o.offset += start * strides[d];
  o.shape[d] = length;
  o.strides[d] = strides[d] * step;
  return o;
}

Operand Operand::Select(int64_t d, int64_t i) const {
  Operand o = *this;
  d = WrapDim(d, dim());
  o.offset += i * strides[d];
  o.shape.erase(o.shape.begin() + d);
  o.strides.erase(o.strides.begin() + d);
  return o;
}

Operand Operand::Unsqueeze(int64_t d) const {
  Operand o = *this;
  if (d < 0) d += dim() + 1;
  o.shape.insert(o.shape.begin() + d, 1);
  o.strides.insert(o.strides.begin() + d, 0);
  return o;
}

Operand Operand::Reinterpret(tern_dtype_t to) const {
  TORCH_CHECK(DtypeSize(to) == DtypeSize(dtype), "kernels: reinterpret needs equal sizes");
  Operand o = *this;
  o.dtype = to;
  return o;
}

Operand None() { return Operand{}; }

// ---- Program ------------------------------------------------------------------

Program::Program(std::string name) : name_(std::move(name)) {
  bindings_.reserve(6);
  instructions_.reserve(4);
}

Operand Program::Bind(const at::Tensor& t, bool output) {
  Operand o;
  auto dtype = ToTernDtype(t.scalar_type());
  if (!dtype && allow_f64_ && t.scalar_type() == at::kDouble) dtype = TERN_DTYPE_F64;
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 || !dtype ||
      t.dim() > TERN_MAX_RANK || t.is_conj() || t.is_neg()) {
    ok_ = false;
    return o;
  }
  if (device_.index() < 0) {
    device_ = t.device();
  } else if (t.device() != device_) {
    ok_ = false;
    return o;
  }
  const int64_t span = SpanElements(t);
  o.dtype = *dtype;
  o.shape.assign(t.sizes().begin(), t.sizes().end());
  o.strides.assign(t.strides().begin(), t.strides().end());
  o.segment = output ? TERN_SEGMENT_OUTPUT : TERN_SEGMENT_INPUT;
  uint32_t index = 0;
  for (const Binding& b : bindings_) {
    if (b.output != output) continue;
    if (b.is_tensor && b.dtype == *dtype && b.span == span && b.data == t.data_ptr()) {
      o.index = index;
      return o;
    }
    ++index;
  }
  o.index = output ? outputs_++ : inputs_++;
  Binding b{true, output, *dtype, span};
  b.data = t.data_ptr();
  b.storage = t.storage();
  bindings_.push_back(std::move(b));
  return o;
}

Operand Program::BindRaw(tern_buffer_t buffer, uint64_t offset, tern_dtype_t dtype,
                         int64_t elements, bool output) {
  Operand o;
  o.dtype = dtype;
  o.shape = {elements};
  o.strides = {1};
  o.segment = output ? TERN_SEGMENT_OUTPUT : TERN_SEGMENT_INPUT;
  o.index = output ? outputs_++ : inputs_++;
  Binding b{false, output, dtype, elements};
  b.raw_buffer = buffer;
  b.raw_offset = offset;
  bindings_.push_back(b);
  return o;
}

void Program::SetDevice(c10::DeviceIndex device) {
  if (device_.index() < 0) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, device);
  } else if (device_.index() != device) {
    ok_ = false;
  }
}

Operand Program::InRaw(tern_buffer_t buffer, uint64_t offset, tern_dtype_t dtype,
                       int64_t elements) {
  return BindRaw(buffer, offset, dtype, elements, false);
}

Operand Program::OutRaw(tern_buffer_t buffer, uint64_t offset, tern_dtype_t dtype,
                        int64_t elements) {
  return BindRaw(buffer, offset, dtype, elements, true);
}

Operand Program::In(const at::Tensor& t) { return Bind(t, false); }
Operand Program::Out(const at::Tensor& t) { return Bind(t, true); }

Operand Program::Temp(tern_dtype_t dtype, c10::IntArrayRef shape) {
  Operand o;
  o.segment = TERN_SEGMENT_SCRATCH;
  o.dtype = dtype;
  const int64_t start = (scratch_bytes_ + 63) / 64 * 64;
  o.offset = start / DtypeSize(dtype);
  o.shape.assign(shape.begin(), shape.end());
  o.strides = ContiguousStrides(shape);
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  scratch_bytes_ = start + std::max<int64_t>(n, 1) * DtypeSize(dtype);
  return o;
}

namespace {

// `value` as the bytes of one element of `dtype`.
void EncodeFloat(double value, tern_dtype_t dtype, uint8_t* out) {
  switch (dtype) {
    case TERN_DTYPE_F32: {
      const float v = static_cast<float>(value);
      std::memcpy(out, &v, 4);
      return;
    }
    case TERN_DTYPE_BF16: {
      const c10::BFloat16 v(static_cast<float>(value));
      std::memcpy(out, &v, 2);
      return;
    }
    case TERN_DTYPE_F16: {
      const c10::Half v(static_cast<float>(value));
      std::memcpy(out, &v, 2);
      return;
    }
    case TERN_DTYPE_F64:  // only in programs that allow f64 (AllowF64)
      std::memcpy(out, &value, 8);
      return;
    default:
      TORCH_CHECK(false, "kernels: a float constant needs a float dtype");
  }
}

void EncodeInt(int64_t value, tern_dtype_t dtype, uint8_t* out) {
  switch (dtype) {
    case TERN_DTYPE_I8:
    case TERN_DTYPE_BOOL: {
      const int8_t v = static_cast<int8_t>(dtype == TERN_DTYPE_BOOL ? value != 0 : value);
      std::memcpy(out, &v, 1);
      return;
    }
    case TERN_DTYPE_I32: {
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(out, &v, 4);
      return;
    }
    case TERN_DTYPE_I64:
      std::memcpy(out, &value, 8);
      return;
    default:
      EncodeFloat(static_cast<double>(value), dtype, out);
  }
}

bool IsFloatDtype(tern_dtype_t d) {
  return d == TERN_DTYPE_F32 || d == TERN_DTYPE_BF16 || d == TERN_DTYPE_F16 || d == TERN_DTYPE_F64;
}

using Slot = std::array<uint8_t, 8>;

// `value` as one element of `dtype`: a float for a float dtype, else an
// integer (truncated).
Slot Encoded(double value, tern_dtype_t dtype) {
  Slot bytes{};
  if (IsFloatDtype(dtype)) {
    EncodeFloat(value, dtype, bytes.data());
  } else {
    EncodeInt(static_cast<int64_t>(value), dtype, bytes.data());
  }
  return bytes;
}

Slot EncodedInt(int64_t value, tern_dtype_t dtype) {
  Slot bytes{};
  EncodeInt(value, dtype, bytes.data());
  return bytes;
}

// Appends one element of `dtype` to `blob` in its own 8-byte slot; returns
// the operand for it, in the executable's segment `segment` number `index`.
Operand AppendSlot(std::vector<uint8_t>& blob, tern_segment_t segment, uint32_t index,
                   const void* bytes, tern_dtype_t dtype) {
  const size_t at = (blob.size() + 7) / 8 * 8;
  blob.resize(at + 8, 0);
  std::memcpy(blob.data() + at, bytes, DtypeSize(dtype));
  Operand o;
  o.segment = segment;
  o.index = index;
  o.dtype = dtype;
  o.offset = static_cast<int64_t>(at) / DtypeSize(dtype);
  return o;
}

}  // namespace

Operand Program::AddConstant(const void* bytes, tern_dtype_t dtype) {
  return AppendSlot(constants_, TERN_SEGMENT_CONSTANT, 0, bytes, dtype);
}

Operand Program::Const(double value, tern_dtype_t dtype) {
  return AddConstant(Encoded(value, dtype).data(), dtype);
}

Operand Program::ConstInt(int64_t value, tern_dtype_t dtype) {
  return AddConstant(EncodedInt(value, dtype).data(), dtype);
}

Operand Program::AddArg(const void* bytes, tern_dtype_t dtype) {
  if (args_input_ < 0) {
    args_input_ = static_cast<int32_t>(inputs_++);
    bindings_.push_back({false, false, TERN_DTYPE_I8, 0});
  }
  return AppendSlot(args_, TERN_SEGMENT_INPUT, static_cast<uint32_t>(args_input_), bytes, dtype);
}

Operand Program::Arg(double value, tern_dtype_t dtype) {
  return AddArg(Encoded(value, dtype).data(), dtype);
}

Operand Program::ArgInt(int64_t value, tern_dtype_t dtype) {
  return AddArg(EncodedInt(value, dtype).data(), dtype);
}

namespace {

// Size-1 dimensions get the stride a row-major layout would give them: their
// stride never moves, and engines that derive layouts from strides (oneDNN in
// the simulated device) reject odd ones such as a [1, K] transpose with
// strides [1, 1]. Equivalent layouts then also share one cache key.
void CanonicalStrides(Operand& o) {
  int64_t outer = 1;
  for (int64_t d = o.dim() - 1; d >= 0; --d) {
    if (o.shape[d] == 1) {
      o.strides[d] = outer;
    } else if (o.shape[d] > 1) {
      outer = std::max(outer, o.strides[d] * o.shape[d]);
    }
  }
}

}  // namespace

void Program::Emit(tern_opcode_t opcode, std::vector<Operand> operands, std::vector<int64_t> ints,
                   std::vector<double> floats) {
  for (Operand& o : operands) {
    if (o.present()) CanonicalStrides(o);
  }
  instructions_.push_back({opcode, std::move(operands), std::move(ints), std::move(floats)});
}

void Program::EmitFused(Operand out, std::vector<Operand> inputs,
                        const std::vector<std::array<int64_t, 5>>& steps) {
  std::vector<Operand> operands(TERN_PROGRAM_OUTPUTS, None());
  operands[0] = out;
  operands.insert(operands.end(), inputs.begin(), inputs.end());
  std::vector<int64_t> ints = {static_cast<int64_t>(steps.size())};
  for (const auto& step : steps) ints.insert(ints.end(), step.begin(), step.end());
  ints.push_back(kFirstStep + static_cast<int64_t>(steps.size()) - 1);
  for (int j = 1; j < TERN_PROGRAM_OUTPUTS; ++j) ints.push_back(-1);
  Emit(TERN_OP_ELEMENTWISE, std::move(operands), std::move(ints));
}

namespace {

struct Built {
  tern_executable_t executable = nullptr;
  uint32_t function = 0;
};

// Builds and loads the program. Returns "" or why not.
std::string Build(c10::DeviceIndex device, const std::string& name,
                  const std::vector<Program::Binding>& bindings, int64_t args_bytes,
                  int64_t scratch_bytes, const std::vector<uint8_t>& constants,
                  const std::vector<Program::Instruction>& instructions, Built* out) {
  tern_builder_t builder = nullptr;
  tern_status_t status = tern_builder_create(nullptr, &builder);
  if (status != TERN_OK) return "tern_builder_create: " + DescribeLastError(status);
  std::string error;
  auto check = [&](tern_status_t s, const char* what) {
    if (s != TERN_OK && error.empty()) error = std::string(what) + ": " + DescribeLastError(s);
    return s == TERN_OK;
  };
  uint64_t constants_offset = 0;
  bool ok = true;
  if (!constants.empty()) {
    ok = check(tern_builder_add_constants(builder, constants.data(), constants.size(), 64,
                                          &constants_offset),
               "add_constants");
  }
  uint32_t function = 0;
  ok = ok && check(tern_builder_begin_function(builder, "main", &function), "begin_function");
  for (int pass = 0; ok && pass < 2; ++pass) {
    const bool outputs = pass == 1;
    uint32_t index = 0;
    for (const Program::Binding& b : bindings) {
      if (b.output != outputs) continue;
      const int64_t span = (b.is_tensor || b.raw_buffer != nullptr) ? b.span : args_bytes;
      const std::string tensor_name = (outputs ? "out" : "in") + std::to_string(index++);
      uint32_t declared = 0;
      ok = outputs ? check(tern_builder_add_output(builder, tensor_name.c_str(), b.dtype, 1, &span,
                                                   &declared),
                           "add_output")
                   : check(tern_builder_add_input(builder, tensor_name.c_str(), b.dtype, 1, &span,
                                                  &declared),
                           "add_input");
      if (!ok) break;
    }
  }
  if (ok && scratch_bytes > 0) {
    ok = check(tern_builder_set_scratch(builder, static_cast<uint64_t>(scratch_bytes)),
               "set_scratch");
  }
  int engine = -1;
  int64_t semaphore_value = 0;
  auto add = [&](tern_opcode_t opcode, const std::vector<tern_operand_t>& operands,
                 const std::vector<int64_t>& ints, const std::vector<double>& floats) {
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = opcode;
    instruction.operand_count = static_cast<uint32_t>(operands.size());
    instruction.operands = operands.data();
    instruction.int_count = static_cast<uint32_t>(ints.size());
    instruction.ints = ints.data();
    instruction.float_count = static_cast<uint32_t>(floats.size());
    instruction.floats = floats.data();
    instruction.debug_op = name.c_str();
    return check(tern_builder_add_instruction(builder, &instruction), "add_instruction");
  };
  for (size_t i = 0; ok && i < instructions.size(); ++i) {
    const Program::Instruction& ins = instructions[i];
    const int this_engine = static_cast<int>(ins.opcode) >> 8;
    if (engine >= 0 && this_engine != engine) {
      // Order this engine's stream after everything before (see header).
      ++semaphore_value;
      ok = add(TERN_OP_SEM_SIGNAL, {}, {0, 1, engine}, {}) &&
           add(TERN_OP_SEM_WAIT, {}, {0, semaphore_value, this_engine}, {});
      if (!ok) break;
    }
    engine = this_engine;
    std::vector<tern_operand_t> operands;
    operands.reserve(ins.operands.size());
    for (const Operand& o : ins.operands) {
      tern_operand_t operand{};
      operand.segment = o.segment;
      if (o.present()) {
        operand.index = o.index;
        operand.offset = static_cast<uint64_t>(o.offset * DtypeSize(o.dtype));
        if (o.segment == TERN_SEGMENT_CONSTANT) operand.offset += constants_offset;
        operand.dtype = o.dtype;
        operand.rank = static_cast<uint32_t>(o.shape.size());
        operand.shape = o.shape.data();
        operand.strides = o.strides.data();
      }
      operands.push_back(operand);
    }
    ok = add(ins.opcode, operands, ins.ints, ins.floats);
  }
  ok = ok && check(tern_builder_end_function(builder), "end_function");
  void* data = nullptr;
  uint64_t size = 0;
  if (ok) ok = check(tern_builder_finish(builder, &data, &size), "finish");
  tern_builder_destroy(builder);
  if (!ok) return error;
  tern_executable_t executable = nullptr;
  status = tern_executable_load(GetTernDevice(device), data, size, nullptr, &executable);
  tern_builder_free_data(data);
  if (status != TERN_OK) return "tern_executable_load: " + DescribeLastError(status);
  out->executable = executable;
  out->function = function;
  return "";
}

}  // namespace

namespace {

// Run-time arguments (Program::Arg) without an allocation per run. Each queue
// has a ring of slots, in host memory and in one device buffer of its device:
// a run's bytes go into the next slot and a host-to-device copy queued before
// the execution reads them from there when the queue reaches it. So a run
// needs no device tensor, no owned copy of its bytes and no host callback to
// free them (three queue commands become two). A slot is written again only
// once the queue has completed the copy that last read it (tern_queue_query);
// the device slot is safe in queue order, as g_args_mutex is held from the
// copy to the execution's submission, so any later copy into that slot is
// queued behind the execution that reads it. Like the RNG pools, the rings
// live as long as the process (64 KiB of device memory per queue).
constexpr size_t kArgSlotBytes = 256;
constexpr size_t kArgSlots = 256;

struct ArgsRing {
  tern_buffer_t buffer = nullptr;
  std::unique_ptr<uint8_t[]> host;
  std::array<uint64_t, kArgSlots> read_by{};  // sequence of the copy that last read a slot; 0: none
  size_t next = 0;
  uint64_t completed = 0;  // the queue's completed sequence, as last asked
};

std::mutex g_args_mutex;
auto* g_args_rings = new std::unordered_map<tern_queue_t, ArgsRing>();

// Queues the copy of `bytes` into the next slot of `queue`'s ring, sets
// `*binding` to that slot and hands back g_args_mutex, held, in `*lock`.
// False (nothing queued, nothing held) when the bytes do not fit a slot, the
// ring's next slot is still to be read (the queue is a whole ring behind) or
// its buffer cannot be allocated: the caller then takes the general way.
bool StageArgs(tern_queue_t queue, c10::DeviceIndex device, const uint8_t* bytes, size_t size,
               tern_binding_t* binding, std::unique_lock<std::mutex>* lock) {
  if (size > kArgSlotBytes) return false;
  std::unique_lock<std::mutex> held(g_args_mutex);
  ArgsRing& ring = (*g_args_rings)[queue];
  if (ring.buffer == nullptr) {
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = kArgSlots * kArgSlotBytes;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    if (tern_buffer_alloc(GetTernDevice(device), &params, &buffer) != TERN_OK) return false;
    ring.buffer = buffer;
    ring.host = std::make_unique<uint8_t[]>(kArgSlots * kArgSlotBytes);
  }
  const size_t slot = ring.next;
  if (ring.read_by[slot] > ring.completed) {
    uint64_t completed = 0;
    tern_queue_query(queue, &completed);  // NOT_READY or a sticky error: only the value counts
    ring.completed = completed;
    if (ring.read_by[slot] > completed) return false;
  }
  uint8_t* host = ring.host.get() + slot * kArgSlotBytes;
  std::memcpy(host, bytes, size);
  uint64_t sequence = 0;
  TERN_CHECK(tern_queue_copy_h2d(queue, ring.buffer, slot * kArgSlotBytes, host, size, &sequence));
  ring.read_by[slot] = sequence;
  ring.next = (slot + 1) % kArgSlots;
  *binding = {ring.buffer, slot * kArgSlotBytes};
  *lock = std::move(held);
  return true;
}

}  // namespace

bool Program::Run(bool cache) {
  if (!ok_ || !ExecutablesAvailable() || instructions_.empty() || device_.index() < 0) {
    return false;
  }
  bool any_output = false;
  for (const Binding& b : bindings_) any_output = any_output || (b.output && b.span > 0);
  if (!any_output) return true;  // nothing to write

  // One buffer per thread: the key is rebuilt for every run of every op.
  thread_local std::string key;
  key.assign(name_);
  key.push_back('\0');
  Append(key, static_cast<int32_t>(device_.index()));
  Append(key, static_cast<int32_t>(bindings_.size()));
  for (const Binding& b : bindings_) {
    Append(key, static_cast<uint8_t>(b.output));
    Append(key, static_cast<uint8_t>(b.dtype));
    Append(key,
           (b.is_tensor || b.raw_buffer != nullptr) ? b.span : static_cast<int64_t>(args_.size()));
  }
  Append(key, scratch_bytes_);
  Append(key, static_cast<int32_t>(constants_.size()));
  key.append(reinterpret_cast<const char*>(constants_.data()), constants_.size());
  for (const Instruction& ins : instructions_) {
    Append(key, static_cast<int32_t>(ins.opcode));
    Append(key, static_cast<uint8_t>(ins.operands.size()));
    for (const Operand& o : ins.operands) AppendOperand(key, o);
    Append(key, static_cast<uint8_t>(ins.ints.size()));
    for (int64_t v : ins.ints) Append(key, v);
    Append(key, static_cast<uint8_t>(ins.floats.size()));
    for (double v : ins.floats) Append(key, v);
  }

  tern_executable_t executable = nullptr;
  uint32_t function = 0;
  bool one_off = false;
  SubmitWindow window;
  const c10::DeviceIndex device = device_.index();
  tern_queue_t queue = CurrentQueue(device);
  const bool capturing = IsCapturing(queue);
  std::shared_ptr<void> pin;  // while capturing: held by the graph
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cache->find(key);
    if (it == g_cache->end()) {
      ++g_info.misses;
      Built built;
      std::string error =
          Build(device_.index(), name_, bindings_, static_cast<int64_t>(args_.size()),
                scratch_bytes_, constants_, instructions_, &built);
      if (built.executable == nullptr) {
        ++g_info.failures;
        g_info.last_error = name_ + ": " + error;
      }
      if (!cache && built.executable != nullptr) {
        executable = built.executable;
        function = built.function;
        one_off = true;
      } else {
        if (built.executable != nullptr) ++g_info.entries;
        g_lru->push_front(key);
        Entry entry;
        entry.executable = built.executable;
        entry.function = built.function;
        entry.error = std::move(error);
        entry.lru = g_lru->begin();
        it = g_cache->emplace(key, std::move(entry)).first;
        if (g_cache->size() > kCacheCapacity) {
          auto victim = g_cache->find(g_lru->back());
          if (victim->second.elementwise_key) g_elementwise->erase(*victim->second.elementwise_key);
          RetireLocked(victim->second.executable);
          if (victim->second.executable != nullptr) --g_info.entries;
          ++g_info.evictions;
          g_lru->pop_back();
          g_cache->erase(victim);
        }
      }
    } else {
      ++g_info.hits;
      g_lru->splice(g_lru->begin(), *g_lru, it->second.lru);
    }
    if (!one_off) {
      executable = it->second.executable;
      function = it->second.function;
      if (elementwise_key_ != nullptr) {
        // A refused program too: its key's later calls then decline at once.
        // One key per entry (another op name may have built the same program).
        const auto& previous = it->second.elementwise_key;
        if (previous && !(*previous == *elementwise_key_)) g_elementwise->erase(*previous);
        it->second.elementwise_key = *elementwise_key_;
        (*g_elementwise)[*elementwise_key_] = &it->second;
      }
    }
    // Pinned under g_mutex, before any other thread can evict it.
    if (capturing && executable != nullptr) pin = Pin(executable);
    window.Enter();  // also ends this run's own evictions when nothing else is in flight
  }
  if (executable == nullptr) return false;

  // The per-run values: one small host-to-device copy, in queue order.
  tern_binding_t args_binding{nullptr, 0};
  std::unique_lock<std::mutex> args_lock;  // from the values' copy to the execution's submission
  at::Tensor args_tensor;                  // (kept until the execution is queued)
  if (args_input_ >= 0 && (capturing || !StageArgs(queue, device, args_.data(), args_.size(),
                                                   &args_binding, &args_lock))) {
    // Captured (the graph keeps the bytes), or the queue's ring is busy: a
    // device tensor of the caching allocator and a copy that owns the bytes.
    args_tensor = at::empty({static_cast<int64_t>(args_.size())},
                            at::TensorOptions().dtype(at::kByte).device(device_));
    const DeviceLocation loc = Locate(args_tensor);
    EnqueueOwnedH2D(queue, loc.buffer, loc.offset, args_);
    args_binding = {loc.buffer, loc.offset};
  }
  c10::SmallVector<tern_binding_t, 8> in, out;
  for (const Binding& b : bindings_) {
    tern_binding_t binding{nullptr, 0};
    if (b.raw_buffer != nullptr) {
      binding = {b.raw_buffer, b.raw_offset};
    } else if (!b.is_tensor) {
      binding = args_binding;
    } else if (b.span > 0) {
      const DeviceLocation loc = TernDeviceAllocator::Get().Resolve(b.storage, b.data, device);
      binding = {loc.buffer, loc.offset};
    }
    (b.output ? out : in).push_back(binding);
  }
  const tern_status_t status =
      SubmitExecute(queue, executable, function, in.data(), static_cast<uint32_t>(in.size()),
                    out.data(), static_cast<uint32_t>(out.size()), pin);
  pin.reset();  // the graph holds its own reference
  if (one_off) Unload(executable);
  TERN_CHECK(status);
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool LaunchSingleOp(const std::string& op, tern_opcode_t opcode,
                    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                    const std::vector<int64_t>& ints, const std::vector<double>& floats) {
  Program p(op);
  std::vector<Operand> operands;
  for (const at::Tensor& t : outputs) operands.push_back(p.Out(t));
  for (const at::Tensor& t : inputs) operands.push_back(p.In(t));
  p.Emit(opcode, std::move(operands), ints, floats);
  return p.Run();
}

bool RunElementwise(const char* name, tern_opcode_t opcode, int64_t fn, const at::Tensor& out,
                    std::initializer_list<at::Tensor> inputs, ElementwiseScalar scalar_use,
                    double scalar, ElementwiseEmitter emit) {
  if (inputs.size() > kMaxElementwiseInputs || !ExecutablesAvailable() || !out.defined() ||
      out.device().type() != c10::DeviceType::PrivateUse1 || out.is_conj() || out.is_neg() ||
      !out.is_contiguous()) {
    return false;
  }
  const std::optional<tern_dtype_t> dtype = ToTernDtype(out.scalar_type());
  const int64_t numel = out.numel();
  if (!dtype || numel == 0) return false;
  ElementwiseKey key;
  key.name = name;
  key.opcode = static_cast<int32_t>(opcode);
  key.dtype = static_cast<int32_t>(*dtype);
  key.fn = fn;
  key.numel = numel;
  key.device = out.device().index();
  key.scalar = scalar_use;
  const auto out_begin = reinterpret_cast<uintptr_t>(out.data_ptr());
  const auto out_end = out_begin + static_cast<uintptr_t>(numel) * out.element_size();
  std::array<const at::Tensor*, kMaxElementwiseInputs> input{};
  for (const at::Tensor& t : inputs) {
    // One element (a 0-dim tensor: clip_grad_norm_'s clip coefficient, a
    // device-side scale) broadcasts to every element of out.
    const bool single = t.defined() && t.dim() == 0 && out.dim() > 0;
    if (!t.defined() || t.device() != out.device() || t.scalar_type() != out.scalar_type() ||
        (!single && t.sizes() != out.sizes()) || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
      return false;
    }
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    if (single) {
      // Not inside out: out[0] may be written before another part reads it.
      if (begin >= out_begin && begin < out_end) return false;
    } else if (begin != out_begin && begin < out_end &&
               begin + static_cast<uintptr_t>(numel) * t.element_size() > out_begin) {
      return false;  // the same elements as out (in place), or none of them
    }
    for (int32_t j = 0; j < key.inputs; ++j) {
      if (input[j]->data_ptr() == t.data_ptr()) {
        // A one-element input shares no address with another input: the
        // general path binds the two ranges apart, this path would bind
        // them once.
        if (single || (key.single & (1u << j)) != 0) return false;
        key.same_as[key.inputs] = static_cast<int8_t>(j);
        break;
      }
    }
    if (single) key.single |= static_cast<uint8_t>(1u << key.inputs);
    input[key.inputs++] = &t;
  }
  // out's shape must be an input's: one-element inputs only broadcast to it
  // (`torch.relu(s, out=v)` resizes v in the general path).
  if (key.single != 0 && std::popcount(static_cast<unsigned>(key.single)) == key.inputs) {
    return false;
  }
  const c10::DeviceIndex device = out.device().index();
  tern_queue_t queue = CurrentQueue(device);
  // A capture pins what it records: the general path does that.
  if (IsCapturing(queue)) return false;

  tern_executable_t executable = nullptr;
  uint32_t function = 0;
  SubmitWindow window;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_elementwise->find(key);
    if (it != g_elementwise->end()) {
      ++g_info.hits;
      g_lru->splice(g_lru->begin(), *g_lru, it->second->lru);
      if (it->second->executable == nullptr) return false;  // refused: the general path
      executable = it->second->executable;
      function = it->second->function;
      window.Enter();
    }
  }
  if (executable == nullptr) {
    // The key's first call: the 1-D program, built and filed under the key by Run().
    Program p(name);
    std::vector<Operand> operands{p.Out(out)};
    for (int32_t i = 0; i < key.inputs; ++i) operands.push_back(p.In(*input[i]));
    if (!p.ok()) return false;
    for (size_t i = 0; i < operands.size(); ++i) {
      const bool single = i > 0 && (key.single & (1u << (i - 1))) != 0;
      operands[i] = single ? operands[i].Expand({numel}) : operands[i].View({numel});
    }
    // The scalar's binding follows the tensors' (Arg after every In), which
    // the runs below rely on. Scaling the last input is what Binary's general
    // path does for an alpha, instruction for instruction.
    if (scalar_use == ElementwiseScalar::kLastOperand) {
      operands.push_back(p.Arg(scalar, *dtype).Expand({numel}));
    } else if (scalar_use == ElementwiseScalar::kScalesLastInput) {
      const Operand scaled = p.Temp(*dtype, {numel});
      p.Emit(TERN_OP_BINARY, {scaled, operands.back(), p.Arg(scalar, *dtype).Expand({numel})},
             {TERN_BINARY_MUL});
      operands.back() = scaled;
    }
    if (emit != nullptr) {
      emit(p, operands, fn);
    } else {
      p.Emit(opcode, std::move(operands), {fn});
    }
    p.elementwise_key_ = &key;
    return p.Run();
  }

  const TernDeviceAllocator& allocator = TernDeviceAllocator::Get();
  auto bind = [&](const at::Tensor& t) {
    const DeviceLocation loc = allocator.Resolve(t.storage(), t.data_ptr(), device);
    return tern_binding_t{loc.buffer, loc.offset};
  };
  const tern_binding_t out_binding = bind(out);
  std::array<tern_binding_t, kMaxElementwiseInputs + 1> in{};
  uint32_t in_count = 0;
  for (int32_t i = 0; i < key.inputs; ++i) {
    if (key.same_as[i] < 0) in[in_count++] = bind(*input[i]);
  }
  // Held from the scalar's copy to the execution's submission (StageArgs).
  std::unique_lock<std::mutex> args_lock;
  if (scalar_use != ElementwiseScalar::kNone) {
    const Slot bytes = Encoded(scalar, *dtype);
    // The ring is busy: the general path stages the value its own way.
    if (!StageArgs(queue, device, bytes.data(), bytes.size(), &in[in_count], &args_lock)) {
      return false;
    }
    ++in_count;
  }
  static const std::shared_ptr<void> kNoPin;
  TERN_CHECK(
      SubmitExecute(queue, executable, function, in.data(), in_count, &out_binding, 1, kNoPin));
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool TryCopyKernel(const at::Tensor& src, const at::Tensor& dst) {
  // float64 too: .double() and .float() of a tern tensor stay on the device.
  Program p("aten::copy_");
  p.AllowF64();
  const Operand out = p.Out(dst);
  const Operand in = p.In(src);
  p.Emit(src.scalar_type() == dst.scalar_type() ? TERN_OP_COPY : TERN_OP_CAST, {out, in});
  return p.Run();
}

CacheInfo GetCacheInfo() {
  std::lock_guard<std::mutex> lock(g_mutex);
  CacheInfo info = g_info;
  info.launches = g_launches.load(std::memory_order_relaxed);
  info.executables_available = ExecutablesAvailable();
  return info;
}

void ClearCache() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (auto& [key, entry] : *g_cache) RetireLocked(entry.executable);
    g_cache->clear();
    g_elementwise->clear();
    g_lru->clear();
    g_info = CacheInfo();
    g_launches.store(0, std::memory_order_relaxed);
  }
  UnloadRetired();  // now, unless runs are in flight: the last of them does it
}

}  // namespace torch_tern::program
