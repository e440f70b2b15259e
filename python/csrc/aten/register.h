// Where the native operators are registered: beside their kernels. Right
// after a kernel's definition its file names the schema it implements,
//
//   at::Tensor& AddOut(...) { ... }
//   TERN_ATEN_IMPL("add.out", AddOut);
//
// which, during the extension's static initialisation, adds the pair to one
// process-wide list (nothing is registered with torch yet). RegisterNativeOps()
// then registers the whole list with the dispatcher; module.cc calls it first
// thing when torch_tern._C is imported, after every translation unit's static
// initialisers have run and before any Python code can reach a tern tensor.
// The other dispatch keys' registrations (CPU fallback, Conjugate/Negative,
// autocast) are TORCH_LIBRARY_IMPL blocks in register.cc.
#pragma once

#include <c10/core/DispatchKey.h>
#include <c10/macros/Macros.h>
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

namespace torch_tern::native {

// Adds one kernel to the list; only TERN_ATEN_IMPL_FOR constructs it.
struct OpRegistrar {
  OpRegistrar(c10::DispatchKey key, const char* name, torch::CppFunction kernel, const char* file,
              int line);
};

// Registers every listed kernel (namespace aten) with the dispatcher, one
// torch::Library per dispatch key, kept for the life of the process. Runs
// once; later calls do nothing. Throws before registering anything if a
// schema name is listed twice for one key (torch itself would only warn and
// let the later kernel win). Returns how many kernels the list holds.
size_t RegisterNativeOps();

// The list as (dispatch key, schema name), in registration order.
std::vector<std::pair<std::string, std::string>> NativeOps();

}  // namespace torch_tern::native

// Registers `kernel` for aten::<name> under dispatch key `key` (a
// c10::DispatchKey enumerator, e.g. AutogradPrivateUse1). At namespace scope.
#define TERN_ATEN_IMPL_FOR(key, name, kernel)                                               \
  static const ::torch_tern::native::OpRegistrar C10_CONCATENATE(tern_aten_impl_, C10_UID)( \
      ::c10::DispatchKey::key, name, ::torch::CppFunction(kernel), __FILE__, __LINE__)

// Registers `kernel` for aten::<name> on tern tensors (PrivateUse1).
#define TERN_ATEN_IMPL(name, kernel) TERN_ATEN_IMPL_FOR(PrivateUse1, name, kernel)
