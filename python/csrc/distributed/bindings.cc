// Python bindings of ProcessGroupTern (see bindings.h).
#include "distributed/bindings.h"

#include <pybind11/chrono.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "distributed/process_group_tern.h"
#include "runtime/runtime.h"

namespace torch_tern::distributed {

namespace py = pybind11;

namespace {

// Cores of this node's tern devices that no process owns (any user's): how
// many more ranks can start here.
int FreeCores() {
  EnsureInitialized();
  int free = 0;
  auto telemetry = std::make_unique<tern_device_telemetry_t>();
  for (c10::DeviceIndex d = 0; d < DeviceCount(); ++d) {
    *telemetry = {};
    telemetry->struct_size = sizeof(tern_device_telemetry_t);
    TERN_CHECK(tern_device_get_telemetry(GetTernDevice(d), telemetry.get()));
    for (uint32_t c = 0; c < telemetry->core_count; ++c) {
      if (telemetry->cores[c].owner_pid == 0) ++free;
    }
  }
  return free;
}

}  // namespace

void RegisterDistributedBindings(py::module& module) {
  module.def("_distributed_free_cores", &FreeCores,
             "Cores of this node's tern devices that no process owns.");
  module.def("_distributed_init", [module]() mutable {
    if (py::hasattr(module, "_ProcessGroupTern")) return;
    // The base class c10d.Backend must be known to pybind11 first.
    py::module::import("torch.distributed");
    py::class_<ProcessGroupTern, c10d::Backend, c10::intrusive_ptr<ProcessGroupTern>>(
        module, "_ProcessGroupTern",
        "torch.distributed backend over tern collectives (torch_tern.distributed)")
        .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::string group_name) {
               return c10::make_intrusive<ProcessGroupTern>(store, rank, size, timeout,
                                                            std::move(group_name));
             }),
             py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::arg("group_name") = "")
        .def("_describe", &ProcessGroupTern::Describe,
             "Where the group's communicator runs, or 'not connected'.",
             py::call_guard<py::gil_scoped_release>());
  });
}

}  // namespace torch_tern::distributed
