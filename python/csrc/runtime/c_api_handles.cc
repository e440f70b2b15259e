#include "runtime/c_api_handles.h"

#include <dlfcn.h>

#include <cstdint>
#include <string>

#include "aten/minimal.h"
#include "runtime/runtime.h"
#include "tern/tern.h"

namespace py = pybind11;

namespace torch_tern {
namespace {

uint64_t HandleValue(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }

c10::DeviceIndex DeviceOrCurrent(int device) {
  EnsureInitialized();
  const auto index = device < 0 ? CurrentDevice() : static_cast<c10::DeviceIndex>(device);
  CheckDeviceIndex(index);
  return index;
}

// The file libtern was loaded from: the one library whose handles the other
// bindings return (a second copy loaded elsewhere would have a handle table
// of its own, in which these handles mean nothing).
std::string LibraryPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&tern_init), &info) == 0 || info.dli_fname == nullptr) {
    throw std::runtime_error(
        "tern: cannot tell which file libtern was loaded from (dladdr failed)");
  }
  return info.dli_fname;
}

}  // namespace

void RegisterCApiHandleBindings(py::module& m) {
  m.def(
      "_c_api_core", [](int device) { return HandleValue(GetCore(DeviceOrCurrent(device))); },
      py::arg("device") = -1,
      "tern_core_t of the core this process runs `device`'s work on, as an integer.");
  m.def(
      "_c_api_queue",
      [](int64_t stream_id, int device) {
        const c10::Stream stream =
            MakeStream(DeviceOrCurrent(device), static_cast<c10::StreamId>(stream_id));
        return HandleValue(GetQueue(stream));
      },
      py::arg("stream_id"), py::arg("device"), "tern_queue_t behind a tern stream, as an integer.");
  m.def(
      "_c_api_buffer",
      [](const at::Tensor& tensor) -> py::tuple {
        TORCH_CHECK(tensor.defined(), "tern: expected a tern tensor, got an undefined tensor");
        TORCH_CHECK(tensor.device().type() == c10::DeviceType::PrivateUse1,
                    "tern: expected a tern tensor, got one on ", tensor.device(),
                    "; move it with .to('tern') first");
        if (tensor.storage().nbytes() == 0) return py::make_tuple(uint64_t{0}, uint64_t{0});
        const DeviceLocation where = Locate(tensor);
        return py::make_tuple(HandleValue(where.buffer), where.offset);
      },
      py::arg("tensor"),
      "(tern_buffer_t, byte offset of the tensor's first element) of a tern tensor; (0, 0) "
      "when it has no storage bytes.");
  m.def("_c_api_library_path", &LibraryPath);
}

}  // namespace torch_tern
