#include "kernels.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "ops.h"
#include "runtime.h"

// The executable API is new in libtern; bind it weakly so that the plugin
// also loads against a libtern that does not export it yet (then every op
// takes its fallback path). Once every supported libtern has it, these lines
// can go.
#pragma weak tern_builder_create
#pragma weak tern_builder_destroy
#pragma weak tern_builder_begin_function
#pragma weak tern_builder_add_input
#pragma weak tern_builder_add_output
#pragma weak tern_builder_add_instruction
#pragma weak tern_builder_end_function
#pragma weak tern_builder_finish
#pragma weak tern_builder_free_data
#pragma weak tern_executable_load
#pragma weak tern_executable_unload
#pragma weak tern_queue_execute

namespace torch_tern::kernels {
namespace {

struct Entry {
  tern_executable_t executable = nullptr;  // nullptr: refused, see error
  uint32_t function = 0;
  std::string error;
};

std::mutex g_mutex;
std::unordered_map<std::string, Entry>* g_cache = new std::unordered_map<std::string, Entry>();
CacheInfo g_info;

template <typename T>
void Append(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void AppendTensor(std::string& key, const at::Tensor& t) {
  Append(key, static_cast<int32_t>(t.scalar_type()));
  Append(key, static_cast<int32_t>(t.dim()));
  for (int64_t d = 0; d < t.dim(); ++d) {
    Append(key, t.size(d));
    Append(key, t.stride(d));
  }
}

struct OperandShape {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

// Builds and loads the single-instruction executable. Returns "" or why not.
std::string Build(c10::DeviceIndex device, const std::string& op, tern_opcode_t opcode,
                  const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                  const std::vector<int64_t>& ints, const std::vector<double>& floats,
                  Entry* entry) {
  tern_builder_t builder = nullptr;
  tern_status_t status = tern_builder_create(nullptr, &builder);
  if (status != TERN_OK) return "tern_builder_create: " + DescribeLastError(status);
  std::string error;
  auto check = [&](tern_status_t s, const char* what) {
    if (s != TERN_OK && error.empty()) error = std::string(what) + ": " + DescribeLastError(s);
    return s == TERN_OK;
  };
  uint32_t function = 0;
  std::vector<OperandShape> shapes;
  std::vector<tern_operand_t> operands;
  bool ok = check(tern_builder_begin_function(builder, "main", &function), "begin_function");
  auto declare = [&](const at::Tensor& t, bool is_output, uint32_t index) {
    const tern_dtype_t dtype = *ToTernDtype(t.scalar_type());
    const int64_t span = SpanElements(t);
    uint32_t declared = 0;
    const std::string name = (is_output ? "out" : "in") + std::to_string(index);
    return is_output
               ? check(tern_builder_add_output(builder, name.c_str(), dtype, 1, &span, &declared),
                       "add_output")
               : check(tern_builder_add_input(builder, name.c_str(), dtype, 1, &span, &declared),
                       "add_input");
  };
  for (size_t i = 0; ok && i < inputs.size(); ++i) ok = declare(inputs[i], false, i);
  for (size_t i = 0; ok && i < outputs.size(); ++i) ok = declare(outputs[i], true, i);
  if (ok) {
    // Operands: outputs first, then inputs, each with its own sizes/strides.
    shapes.reserve(outputs.size() + inputs.size());
    auto add_operand = [&](const at::Tensor& t, tern_segment_t segment, uint32_t index) {
      shapes.push_back({t.sizes().vec(), t.strides().vec()});
      tern_operand_t operand{};
      operand.segment = segment;
      operand.index = index;
      operand.offset = 0;
      operand.dtype = *ToTernDtype(t.scalar_type());
      operand.rank = static_cast<uint32_t>(t.dim());
      operand.shape = shapes.back().shape.data();
      operand.strides = shapes.back().strides.data();
      operands.push_back(operand);
    };
    for (size_t i = 0; i < outputs.size(); ++i) add_operand(outputs[i], TERN_SEGMENT_OUTPUT, i);
    for (size_t i = 0; i < inputs.size(); ++i) add_operand(inputs[i], TERN_SEGMENT_INPUT, i);
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = opcode;
    instruction.operand_count = static_cast<uint32_t>(operands.size());
    instruction.operands = operands.data();
    instruction.int_count = static_cast<uint32_t>(ints.size());
    instruction.ints = ints.data();
    instruction.float_count = static_cast<uint32_t>(floats.size());
    instruction.floats = floats.data();
    instruction.debug_op = op.c_str();
    ok = check(tern_builder_add_instruction(builder, &instruction), "add_instruction") &&
         check(tern_builder_end_function(builder), "end_function");
  }
  void* data = nullptr;
  uint64_t size = 0;
  if (ok) ok = check(tern_builder_finish(builder, &data, &size), "finish");
  tern_builder_destroy(builder);
  if (!ok) return error;
  tern_executable_t executable = nullptr;
  status = tern_executable_load(GetTernDevice(device), data, size, nullptr, &executable);
  tern_builder_free_data(data);
  if (status != TERN_OK) return "tern_executable_load: " + DescribeLastError(status);
  entry->executable = executable;
  entry->function = function;
  return "";
}

}  // namespace

bool ExecutablesAvailable() {
  static const bool available = [] {
    const char* env = std::getenv("TORCH_TERN_KERNELS");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    return tern_builder_create != nullptr && tern_builder_destroy != nullptr &&
           tern_builder_begin_function != nullptr && tern_builder_add_input != nullptr &&
           tern_builder_add_output != nullptr && tern_builder_add_instruction != nullptr &&
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

bool LaunchSingleOp(const std::string& op, tern_opcode_t opcode,
                    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                    const std::vector<int64_t>& ints, const std::vector<double>& floats) {
  if (!ExecutablesAvailable()) return false;
  TORCH_CHECK(!outputs.empty(), "LaunchSingleOp(", op, ") needs an output");
  const c10::Device device = outputs[0].device();
  bool empty = false;
  for (const auto* list : {&outputs, &inputs}) {
    for (const at::Tensor& t : *list) {
      if (t.device() != device || !ToTernDtype(t.scalar_type()) || t.dim() > TERN_MAX_RANK ||
          t.is_conj() || t.is_neg()) {
        return false;
      }
      empty = empty || t.numel() == 0;
    }
  }
  if (empty) return true;  // nothing to compute

  std::string key = op;
  key.push_back('\0');
  Append(key, static_cast<int32_t>(opcode));
  Append(key, static_cast<int32_t>(device.index()));
  Append(key, static_cast<int32_t>(outputs.size()));
  for (const at::Tensor& t : outputs) AppendTensor(key, t);
  Append(key, static_cast<int32_t>(inputs.size()));
  for (const at::Tensor& t : inputs) AppendTensor(key, t);
  Append(key, static_cast<int32_t>(ints.size()));
  for (int64_t v : ints) Append(key, v);
  Append(key, static_cast<int32_t>(floats.size()));
  for (double v : floats) Append(key, v);

  tern_executable_t executable = nullptr;
  uint32_t function = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cache->find(key);
    if (it == g_cache->end()) {
      ++g_info.misses;
      Entry entry;
      entry.error = Build(device.index(), op, opcode, outputs, inputs, ints, floats, &entry);
      if (entry.executable == nullptr) {
        ++g_info.failures;
        g_info.last_error = op + ": " + entry.error;
      } else {
        ++g_info.entries;
      }
      it = g_cache->emplace(std::move(key), std::move(entry)).first;
    } else {
      ++g_info.hits;
    }
    executable = it->second.executable;
    function = it->second.function;
  }
  if (executable == nullptr) return false;

  auto bind = [](const std::vector<at::Tensor>& tensors) {
    std::vector<tern_binding_t> bindings;
    bindings.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      const DeviceLocation loc = Locate(t);
      bindings.push_back({loc.buffer, loc.offset});
    }
    return bindings;
  };
  const std::vector<tern_binding_t> in = bind(inputs);
  const std::vector<tern_binding_t> out = bind(outputs);
  TERN_CHECK(tern_queue_execute(CurrentQueue(device.index()), executable, function, in.data(),
                                static_cast<uint32_t>(in.size()), out.data(),
                                static_cast<uint32_t>(out.size()), nullptr));
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_info.launches;
  return true;
}

bool TryCopyKernel(const at::Tensor& src, const at::Tensor& dst) {
  if (src.scalar_type() == dst.scalar_type()) {
    return LaunchSingleOp("aten::copy_", TERN_OP_COPY, {dst}, {src}, {}, {});
  }
  return LaunchSingleOp("aten::copy_", TERN_OP_CAST, {dst}, {src}, {}, {});
}

CacheInfo GetCacheInfo() {
  std::lock_guard<std::mutex> lock(g_mutex);
  CacheInfo info = g_info;
  info.executables_available = ExecutablesAvailable();
  return info;
}

void ClearCache() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [key, entry] : *g_cache) {
    if (entry.executable != nullptr) tern_executable_unload(entry.executable);
  }
  g_cache->clear();
  g_info = CacheInfo();
}

}  // namespace torch_tern::kernels
