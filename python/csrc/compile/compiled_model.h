// A compiled executable (torch_tern.compiler's output) loaded on a tern
// device and run on tern tensors: torch_tern.compiler.load(path)(x) runs the
// whole model as one execution on the current stream, asynchronously like
// any other tern op.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tern/executable.h"

namespace torch_tern {

class CompiledModel {
 public:
  // Loads the executable file `path` on device `device` (-1: the current
  // one); its function "forward" (or its only function) is what Run() runs.
  CompiledModel(const std::string& path, int device);
  // The same from an executable's bytes in memory (torch.compile's backend
  // keeps executables in memory and in the compile cache, not in files).
  CompiledModel(const std::vector<uint8_t>& executable, int device);
  ~CompiledModel();
  CompiledModel(const CompiledModel&) = delete;
  CompiledModel& operator=(const CompiledModel&) = delete;

  // Runs the function on `inputs` (tern tensors of the signature's dtypes
  // and shapes, in order; non-contiguous ones are made contiguous) and
  // returns new tern tensors holding its outputs. Enqueued on the current
  // stream of the model's device.
  // Thread-safety: any thread; runs on the calling thread's current stream.
  // `into` (empty, or one entry per output): where to write each output, a
  // contiguous tern tensor of its dtype and shape, or None for a new one (a
  // graph mutation's output bound to its input's memory updates the input in
  // place; the compiler made that safe). The results are those tensors.
  std::vector<at::Tensor> Run(const std::vector<at::Tensor>& inputs,
                              const std::vector<std::optional<at::Tensor>>& into = {}) const;

  std::vector<std::string> input_names() const { return Names(inputs_); }
  std::vector<std::string> output_names() const { return Names(outputs_); }

 private:
  static std::vector<std::string> Names(const std::vector<tern_tensor_info_t>& infos);
  // Finds the function to run and reads its signature; `what` names the
  // executable in messages.
  void ReadSignature(const std::string& what);

  c10::DeviceIndex device_;
  tern_executable_t executable_ = nullptr;
  uint32_t function_ = 0;
  std::vector<tern_tensor_info_t> inputs_;
  std::vector<tern_tensor_info_t> outputs_;
};

}  // namespace torch_tern
