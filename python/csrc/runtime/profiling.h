// torch_tern._C's bindings to tern/profile.h: trace capture from Python and
// tern's log messages forwarded to Python (profiling.cc).
#ifndef TORCH_TERN_CSRC_RUNTIME_PROFILING_H_
#define TORCH_TERN_CSRC_RUNTIME_PROFILING_H_

#include <torch/csrc/utils/pybind.h>

namespace torch_tern {

// Adds _profile_start, _profile_stop, _forward_logs, _stop_forwarding_logs
// and _forwarding_logs to the module.
void RegisterProfilingBindings(pybind11::module& m);

}  // namespace torch_tern

#endif  // TORCH_TERN_CSRC_RUNTIME_PROFILING_H_
