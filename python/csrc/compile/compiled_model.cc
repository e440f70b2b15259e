#include "compile/compiled_model.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "aten/minimal.h"
#include "aten/program.h"
#include "runtime/allocator.h"
#include "runtime/capture.h"
#include "runtime/runtime.h"

namespace torch_tern {
namespace {

at::ScalarType ToScalarType(tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return at::kFloat;
    case TERN_DTYPE_BF16:
      return at::kBFloat16;
    case TERN_DTYPE_F16:
      return at::kHalf;
    case TERN_DTYPE_I8:
      return at::kChar;
    case TERN_DTYPE_I32:
      return at::kInt;
    case TERN_DTYPE_I64:
      return at::kLong;
    case TERN_DTYPE_BOOL:
      return at::kBool;
    default:
      TORCH_CHECK(false, "the executable uses dtype ", tern_dtype_name(dtype),
                  ", which torch_tern cannot map to a torch dtype");
  }
}

std::vector<int64_t> ShapeOf(const tern_tensor_info_t& info) {
  return std::vector<int64_t>(info.shape, info.shape + info.rank);
}

}  // namespace

CompiledModel::CompiledModel(const std::string& path, int device) {
  EnsureInitialized();
  device_ = device < 0 ? CurrentDevice() : static_cast<c10::DeviceIndex>(device);
  CheckDeviceIndex(device_);
  TERN_CHECK(
      tern_executable_load_file(GetTernDevice(device_), path.c_str(), nullptr, &executable_));
  ReadSignature(path);
}

CompiledModel::CompiledModel(const std::vector<uint8_t>& executable, int device) {
  EnsureInitialized();
  device_ = device < 0 ? CurrentDevice() : static_cast<c10::DeviceIndex>(device);
  CheckDeviceIndex(device_);
  TERN_CHECK(tern_executable_load(GetTernDevice(device_), executable.data(), executable.size(),
                                  nullptr, &executable_));
  ReadSignature("the executable");
}

void CompiledModel::ReadSignature(const std::string& what) {
  uint32_t count = 0;
  TERN_CHECK(tern_executable_function_count(executable_, &count));
  if (tern_executable_find_function(executable_, "forward", &function_) != TERN_OK) {
    TORCH_CHECK(count == 1, what, " has ", count,
                " functions and none is named 'forward'; torch_tern.compiler.load runs "
                "executables written by torch_tern.compiler.export");
    function_ = 0;
  }
  tern_function_info_t info{};
  info.struct_size = sizeof(info);
  TERN_CHECK(tern_executable_function_info(executable_, function_, &info));
  for (int is_output = 0; is_output < 2; ++is_output) {
    const uint32_t n = is_output ? info.output_count : info.input_count;
    for (uint32_t i = 0; i < n; ++i) {
      tern_tensor_info_t tensor{};
      tensor.struct_size = sizeof(tensor);
      TERN_CHECK(tern_executable_tensor_info(executable_, function_, is_output, i, &tensor));
      (is_output ? outputs_ : inputs_).push_back(tensor);
    }
  }
}

CompiledModel::~CompiledModel() {
  // Executions still in flight keep what they need (tern_executable_unload).
  if (executable_ != nullptr) tern_executable_unload(executable_);
}

std::vector<std::string> CompiledModel::Names(const std::vector<tern_tensor_info_t>& infos) {
  std::vector<std::string> names;
  for (const auto& info : infos) names.emplace_back(info.name);
  return names;
}

namespace {

// Where a tensor lives in device memory. A tensor with no elements has no
// memory (its data pointer is null), and the executable touches none of it:
// it is bound to a one-byte tensor that `keep` holds until the execution is
// queued.
tern_binding_t Bind(const at::Tensor& tensor, std::vector<at::Tensor>* keep) {
  if (tensor.numel() == 0) {
    keep->push_back(at::empty({1}, tensor.options().dtype(at::kByte)));
    const DeviceLocation location = Locate(keep->back());
    return {location.buffer, location.offset};
  }
  const DeviceLocation location = Locate(tensor);
  return {location.buffer, location.offset};
}

}  // namespace

std::vector<at::Tensor> CompiledModel::Run(
    const std::vector<at::Tensor>& inputs,
    const std::vector<std::optional<at::Tensor>>& into) const {
  TORCH_CHECK(inputs.size() == inputs_.size(), "the compiled model takes ", inputs_.size(),
              " inputs, got ", inputs.size());
  TORCH_CHECK(into.empty() || into.size() == outputs_.size(), "the compiled model has ",
              outputs_.size(), " outputs; `into` names ", into.size());
  const c10::Device device(c10::DeviceType::PrivateUse1, device_);
  std::vector<at::Tensor> bound;
  std::vector<tern_binding_t> in, out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const tern_tensor_info_t& info = inputs_[i];
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.device() == device, "input ", i, " ('", info.name, "') is on ", t.device(),
                "; the compiled model runs on ", device, ": move it there with .to()");
    TORCH_CHECK(t.scalar_type() == ToScalarType(info.dtype), "input ", i, " ('", info.name,
                "') has dtype ", t.scalar_type(), "; the compiled model takes ",
                ToScalarType(info.dtype));
    TORCH_CHECK(t.sizes().vec() == ShapeOf(info), "input ", i, " ('", info.name, "') has shape ",
                t.sizes(), "; the compiled model takes ", ShapeOf(info),
                " (it was compiled for that shape)");
    bound.push_back(t.contiguous());
    in.push_back(Bind(bound.back(), &bound));
  }
  std::vector<at::Tensor> results;
  for (size_t j = 0; j < outputs_.size(); ++j) {
    const tern_tensor_info_t& info = outputs_[j];
    if (!into.empty() && into[j].has_value()) {
      const at::Tensor& t = *into[j];
      TORCH_CHECK(t.device() == device && t.scalar_type() == ToScalarType(info.dtype) &&
                      t.sizes().vec() == ShapeOf(info) && t.is_contiguous(),
                  "output ", j, " ('", info.name, "') is to be written into a ", t.scalar_type(),
                  " tensor of shape ", t.sizes(), " on ", t.device(), "; it must be a contiguous ",
                  ToScalarType(info.dtype), " tensor of shape ", ShapeOf(info), " on ", device);
      results.push_back(t);
    } else {
      results.push_back(at::empty(
          ShapeOf(info), at::TensorOptions().dtype(ToScalarType(info.dtype)).device(device)));
    }
    out.push_back(Bind(results.back(), &bound));
  }
  auto execute = [&] {
    // Captured (torch.tern.graph), the graph names the model's executable:
    // the model must outlive the graph's replays.
    return SubmitExecute(CurrentQueue(device_), executable_, function_, in.data(),
                         static_cast<uint32_t>(in.size()), out.data(),
                         static_cast<uint32_t>(out.size()), nullptr);
  };
  tern_status_t status = execute();
  if (status == TERN_ERROR_OUT_OF_MEMORY) {
    // The execution's scratch comes from the runtime, beside the caching
    // allocator, whose free blocks may hold the memory it needs (a model
    // run at many sizes leaves blocks of each): release them, as the
    // allocator does for its own requests, and try once more.
    TernDeviceAllocator::Get().emptyCache();
    status = execute();
  }
  if (status != TERN_OK) {
    ThrowTernError(status, "tern_queue_execute(compiled model)", __FILE__, __LINE__);
  }
  return results;
}

}  // namespace torch_tern
