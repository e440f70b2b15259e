// Python bindings of ProcessGroupTern (see bindings.h).
#include "distributed/bindings.h"

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

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
  module.def(
      "_distributed_comm_counts",
      []() {
        const CommCounts counts = GetCommCounts();
        py::dict out;
        out["live"] = counts.live;
        out["store"] = counts.from_store;
        out["split"] = counts.from_split;
        return out;
      },
      "Communicators of this process's tern groups: live now, and made through the store "
      "or by a split since the process started.");
  module.def("_distributed_init", [module]() mutable {
    if (py::hasattr(module, "_ProcessGroupTern")) return;
    // The base class c10d.Backend must be known to pybind11 first.
    py::module::import("torch.distributed");
    auto group = py::class_<ProcessGroupTern, c10d::Backend, c10::intrusive_ptr<ProcessGroupTern>>(
        module, "_ProcessGroupTern",
        "torch.distributed backend over tern collectives (torch_tern.distributed)");
    py::class_<TernBackendOptions, c10d::Backend::Options, c10::intrusive_ptr<TernBackendOptions>>(
        group, "Options", "The options of a tern group (its timeout and name); copyable.")
        .def("__copy__",
             [](const TernBackendOptions& self) {
               return c10::make_intrusive<TernBackendOptions>(self);
             })
        .def("__deepcopy__", [](const TernBackendOptions& self, const py::dict&) {
          return c10::make_intrusive<TernBackendOptions>(self);
        });
    group
        .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout, std::string group_name) {
               return c10::make_intrusive<ProcessGroupTern>(store, rank, size, timeout,
                                                            std::move(group_name));
             }),
             py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
             py::arg("group_name") = "")
        .def_property_readonly(
            "options",
            [](ProcessGroupTern& self) {
              return c10::static_intrusive_pointer_cast<TernBackendOptions>(
                  self.getBackendOptions());
            },
            "The group's options (split_group copies them for the sub-groups).")
        .def("_describe", &ProcessGroupTern::Describe,
             "Where the group's communicator runs, or 'not connected'.",
             py::call_guard<py::gil_scoped_release>())
        .def("_communication_stream", &ProcessGroupTern::CommunicationStream,
             "The stream its async_op=True operations run on (None until connected); "
             "synchronous ones run on the caller's current stream.")
        .def("_origin", &ProcessGroupTern::Origin,
             "How the group's communicator was made: 'store', 'split', or '' (none yet).",
             py::call_guard<py::gil_scoped_release>())
        .def("_split_for_new_group", &ProcessGroupTern::SplitForNewGroup, py::arg("store"),
             py::arg("group_rank"), py::arg("group_size"), py::arg("timeout"),
             py::arg("group_name"),
             "new_group's member side of a split of this group (collective over it).",
             py::call_guard<py::gil_scoped_release>())
        .def("perform_nocolor_split", &ProcessGroupTern::PerformNocolorSplit, py::arg("device"),
             "new_group's non-member side of a split of this group (torch calls it).",
             py::call_guard<py::gil_scoped_release>())
        .def("comm_split_count", &ProcessGroupTern::SplitCount,
             "Communicators split from this group so far (members' and non-members' calls).");
  });
}

}  // namespace torch_tern::distributed
