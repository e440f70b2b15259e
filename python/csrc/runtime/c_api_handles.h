// torch_tern._C's bindings that hand tern's own handles to Python (the core
// of a device, the queue of a stream, the buffer and offset of a tensor's
// data, the path of the libtern the plugin runs on), so that code which
// calls tern's C API directly (with ctypes, or a C extension of its own) can
// work on PyTorch's tensors in PyTorch's stream order: torch.cuda's
// `Stream.cuda_stream` and `Tensor.data_ptr()` for tern. torch_tern/c_api.py
// is the Python face.
#ifndef TORCH_TERN_CSRC_RUNTIME_C_API_HANDLES_H_
#define TORCH_TERN_CSRC_RUNTIME_C_API_HANDLES_H_

#include <torch/csrc/utils/pybind.h>

namespace torch_tern {

// Adds _c_api_core, _c_api_queue, _c_api_buffer and _c_api_library_path.
void RegisterCApiHandleBindings(pybind11::module& m);

}  // namespace torch_tern

#endif  // TORCH_TERN_CSRC_RUNTIME_C_API_HANDLES_H_
