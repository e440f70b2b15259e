// torch_tern._C: the Python face of the plugin. Importing it registers
// everything C++ registers statically (allocators, guard, hooks, fallback,
// autocast) and, first thing in the module's init, the native operators
// (aten/register.h); these functions serve the Python device module
// (torch.tern), collect_env and the tests.
#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>

#include "aten/fallback.h"
#include "aten/program.h"
#include "aten/register.h"
#include "compile/compile_binding.h"
#include "distributed/bindings.h"
#include "runtime/allocator.h"
#include "runtime/c_api_handles.h"
#include "runtime/capture.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/profiling.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torch_tern {
namespace {

using c10::CachingAllocator::StatType;

void Init() {
  torch::utils::register_fork_handler_for_device_init(at::kPrivateUse1);
  EnsureInitialized();
}

c10::DeviceIndex Resolve(int device) {
  return device < 0 ? CurrentDevice() : static_cast<c10::DeviceIndex>(device);
}

void AddStat(py::dict& out, const std::string& name, const c10::CachingAllocator::StatArray& stat) {
  static const char* kTypes[] = {"all", "small_pool", "large_pool"};
  for (size_t t = 0; t < 3; ++t) {
    const std::string prefix = name + "." + kTypes[t] + ".";
    out[py::str(prefix + "current")] = stat[t].current;
    out[py::str(prefix + "peak")] = stat[t].peak;
    out[py::str(prefix + "allocated")] = stat[t].allocated;
    out[py::str(prefix + "freed")] = stat[t].freed;
  }
}

py::dict MemoryStats(int device) {
  py::dict out;
  if (!IsInitialized()) return out;
  const auto s = TernDeviceAllocator::Get().getDeviceStats(Resolve(device));
  AddStat(out, "allocation", s.allocation);
  AddStat(out, "segment", s.segment);
  AddStat(out, "active", s.active);
  AddStat(out, "allocated_bytes", s.allocated_bytes);
  AddStat(out, "reserved_bytes", s.reserved_bytes);
  AddStat(out, "active_bytes", s.active_bytes);
  AddStat(out, "requested_bytes", s.requested_bytes);
  out["num_alloc_retries"] = s.num_alloc_retries;
  out["num_ooms"] = s.num_ooms;
  out["num_device_alloc"] = s.num_device_alloc;
  out["num_device_free"] = s.num_device_free;
  return out;
}

py::dict TernMemoryInfo(int device) {
  Init();
  tern_memory_stats_t stats{};
  stats.struct_size = sizeof(stats);
  TERN_CHECK(tern_device_memory_stats(GetTernDevice(Resolve(device)), &stats));
  py::dict out;
  out["capacity_bytes"] = stats.capacity_bytes;
  out["used_bytes"] = stats.used_bytes;
  out["peak_used_bytes"] = stats.peak_used_bytes;
  out["node_used_bytes"] = stats.node_used_bytes;
  out["free_bytes"] = stats.free_bytes;
  out["largest_free_block"] = stats.largest_free_block;
  out["allocation_count"] = stats.allocation_count;
  return out;
}

py::dict DeviceInfo(int device) {
  Init();
  const tern_device_info_t& info = GetDeviceInfo(Resolve(device));
  py::dict out;
  out["index"] = info.index;
  out["physical_index"] = info.physical_index;
  out["name"] = std::string(info.name);
  out["driver"] = std::string(info.driver);
  out["core_count"] = info.core_count;
  out["physical_core_count"] = info.physical_core_count;
  out["numa_node"] = info.numa_node;
  out["memory_bytes"] = info.memory_bytes;
  out["memory_alignment"] = info.memory_alignment;
  out["cpu_affinity"] = std::string(info.cpu_affinity);
  out["uuid"] = std::string(info.uuid);
  out["bus_id"] = std::string(info.bus_id);
  out["driver_version"] = std::string(info.driver_version);
  out["opened_core"] = OpenedCoreIndex(Resolve(device));
  return out;
}

// The device's cores as the node's telemetry sees them: busy time summed
// over every core (any process), the core count, and the monotonic clock.
py::dict CoreBusy(int device) {
  Init();
  tern_device_telemetry_t telemetry{};
  telemetry.struct_size = sizeof(telemetry);
  TERN_CHECK(tern_device_get_telemetry(GetTernDevice(Resolve(device)), &telemetry));
  uint64_t busy_ns = 0;
  for (uint32_t c = 0; c < telemetry.core_count && c < TERN_TELEMETRY_MAX_CORES; ++c) {
    busy_ns += telemetry.cores[c].busy_ns;
  }
  py::dict out;
  out["busy_ns"] = busy_ns;
  out["core_count"] = telemetry.core_count;
  return out;
}

py::list MemorySnapshot() {
  py::list out;
  for (const TernDeviceAllocator::BlockSnapshot& block : TernDeviceAllocator::Get().Snapshot()) {
    py::dict entry;
    entry["device"] = static_cast<int>(block.device);
    entry["address"] = block.address;
    entry["size"] = block.size;
    entry["requested_size"] = block.requested;
    entry["stream"] = block.stream;
    entry["state"] = std::string(block.state);
    out.append(entry);
  }
  return out;
}

py::dict Version() {
  tern_version_t version{};
  version.struct_size = sizeof(version);
  TERN_CHECK(tern_get_version(&version));
  py::dict out;
  out["major"] = version.major;
  out["minor"] = version.minor;
  out["patch"] = version.patch;
  out["build"] = std::string(version.build != nullptr ? version.build : "");
  out["headers"] = std::to_string(TERN_VERSION_MAJOR) + "." + std::to_string(TERN_VERSION_MINOR) +
                   "." + std::to_string(TERN_VERSION_PATCH);
  return out;
}

py::tuple StreamTuple(const c10::Stream& stream) {
  return py::make_tuple(stream.id(), static_cast<int>(stream.device_index()),
                        static_cast<int>(stream.device_type()));
}

}  // namespace
}  // namespace torch_tern

PYBIND11_MODULE(_C, m) {
  using namespace torch_tern;
  // Every static initialiser of the extension has run by now (the loader ran
  // them before calling this), so the list of native operators is complete.
  // A failure here (a schema listed twice) makes the import fail.
  native::RegisterNativeOps();
  m.doc() = "torch_tern native extension (PyTorch PrivateUse1 backend for tern)";
  m.attr("__version__") = TORCH_TERN_VERSION;

  m.def("_init", &Init, "Initialize tern (tern_init) for torch; raises if not usable.");
  // Stream capture into tern graphs (torch_tern/graphs.py).
  py::class_<CaptureGraph>(m, "_TernGraph")
      .def(py::init<>())
      .def("capture_begin", &CaptureGraph::CaptureBegin, py::arg("pool") = 0)
      .def("capture_end", &CaptureGraph::CaptureEnd, py::call_guard<py::gil_scoped_release>())
      .def("abort_capture", &CaptureGraph::AbortCapture)
      .def("replay", &CaptureGraph::Replay, py::call_guard<py::gil_scoped_release>())
      .def("reset", &CaptureGraph::Reset, py::call_guard<py::gil_scoped_release>())
      .def("pool", &CaptureGraph::Pool)
      .def("command_count", &CaptureGraph::CommandCount);
  m.def("_graph_pool_handle", &CaptureGraph::NewPoolId);
  m.def("_is_stream_capturing", [](int64_t stream_id, int device) {
    if (!IsInitialized()) return false;
    return IsStreamCapturing(MakeStream(Resolve(device), static_cast<c10::StreamId>(stream_id)));
  });
  RegisterCompilerBindings(m);
  distributed::RegisterDistributedBindings(m);
  RegisterProfilingBindings(m);
  RegisterCApiHandleBindings(m);
  m.def("_is_initialized", &IsInitialized);
  m.def("_is_in_bad_fork", [] { return torch::utils::is_device_in_bad_fork(at::kPrivateUse1); });
  m.def("_init_error", &InitError);
  m.def("_device_count", [] { return static_cast<int>(DeviceCount()); });
  m.def("_current_device", [] { return static_cast<int>(CurrentDevice()); });
  m.def("_set_device", [](int device) {
    Init();
    SetDevice(static_cast<c10::DeviceIndex>(device));
  });
  m.def("_exchange_device", [](int device) {
    if (device < 0) return -1;
    Init();
    return static_cast<int>(ExchangeDevice(static_cast<c10::DeviceIndex>(device)));
  });
  m.def("_synchronize", [](int device) {
    Init();
    py::gil_scoped_release release;
    SynchronizeDevice(Resolve(device));
  });
  m.def("_get_default_generator", [](int device) {
    Init();
    const at::Generator& gen = GetDefaultGenerator(Resolve(device));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });
  m.def("_current_stream",
        [](int device) { return StreamTuple(GetCurrentStream(Resolve(device))); });
  m.def("_default_stream",
        [](int device) { return StreamTuple(GetDefaultStream(Resolve(device))); });

  m.def("_memory_stats", &MemoryStats, py::arg("device") = -1);
  m.def("_tern_memory_info", &TernMemoryInfo, py::arg("device") = -1);
  m.def("_reset_peak_memory_stats",
        [](int device) { TernDeviceAllocator::Get().resetPeakStats(Resolve(device)); });
  m.def("_reset_accumulated_memory_stats",
        [](int device) { TernDeviceAllocator::Get().resetAccumulatedStats(Resolve(device)); });
  m.def("_empty_cache", [] {
    py::gil_scoped_release release;
    TernDeviceAllocator::Get().emptyCache();
  });
  m.def("_set_memory_fraction", [](double fraction, int device) {
    TernDeviceAllocator::Get().SetMemoryFraction(Resolve(device), fraction);
  });
  m.def("_get_memory_fraction",
        [](int device) { return TernDeviceAllocator::Get().GetMemoryFraction(Resolve(device)); });
  m.def("_memory_snapshot", &MemorySnapshot,
        "Every block of the caching allocator: device, address, size, requested_size, stream, "
        "state.");
  m.def("_core_busy", &CoreBusy, py::arg("device") = -1);
  m.def("_host_empty_cache", [] { TernHostAllocator::Get().empty_cache(); });
  m.def("_host_memory_stats", [] {
    const at::HostStats s = TernHostAllocator::Get().get_stats();
    py::dict out;
    out["allocated_bytes.current"] = s.allocated_bytes.current;
    out["active_bytes.current"] = s.active_bytes.current;
    out["num_host_alloc"] = s.num_host_alloc;
    out["num_host_free"] = s.num_host_free;
    return out;
  });

  m.def("_get_fallback_ops", [] {
    py::dict out;
    for (const auto& [name, count] : FallbackOps()) out[py::str(name)] = count;
    return out;
  });
  m.def("_clear_fallback_ops", &ClearFallbackOps);
  m.def("_native_ops", &native::NativeOps,
        "(dispatch key, aten schema name) of every native kernel, as registered at import.");

  m.def("_tern_version", &Version);
  m.def("_driver_name", [] {
    Init();
    const char* name = tern_driver_name();
    return std::string(name != nullptr ? name : "");
  });
  m.def("_device_info", &DeviceInfo, py::arg("device") = -1);

  m.def("_kernel_cache_info", [] {
    const program::CacheInfo info = program::GetCacheInfo();
    py::dict out;
    out["executables_available"] = info.executables_available;
    out["entries"] = info.entries;
    out["hits"] = info.hits;
    out["misses"] = info.misses;
    out["failures"] = info.failures;
    out["evictions"] = info.evictions;
    out["launches"] = info.launches;
    out["last_error"] = info.last_error;
    return out;
  });
  m.def("_kernel_cache_clear", &program::ClearCache);
}
