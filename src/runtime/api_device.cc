// Devices, cores, telemetry and fault injection.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>

#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"

namespace tern {
namespace {

void CopyString(char* dst, size_t capacity, const std::string& src) {
  size_t n = std::min(capacity - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_device_count(uint32_t* out_count) {
  TERN_API_CLEAR_OUT(out_count, 0);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  *out_count = static_cast<uint32_t>(rt->devices.size());
  return TERN_OK;
}

TERN_API tern_status_t tern_device_get(uint32_t index, tern_device_t* out_device) {
  TERN_API_CLEAR_OUT(out_device, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  if (index >= rt->devices.size()) {
    return Report(MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                             "device index {} does not exist: this process sees {} devices (check "
                             "tern_device_count() and TERN_VISIBLE_CORES)",
                             index, rt->devices.size()));
  }
  *out_device = rt->devices[index]->handle;
  return TERN_OK;
}

static_assert(offsetof(tern_device_info_t, uuid) == TERN_DEVICE_INFO_MIN_SIZE,
              "TERN_DEVICE_INFO_MIN_SIZE is the size before the first added field");

TERN_API tern_status_t tern_device_get_info(tern_device_t device, tern_device_info_t* out_info) {
  TERN_API_TRY(ClearOutStruct<tern_device_info_t>(out_info, "out_info", "tern_device_info_t",
                                                  TERN_DEVICE_INFO_MIN_SIZE));
  Runtime* rt;
  DeviceObject* dev;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupDevice(rt, device, "device", &dev));
  out_info->index = dev->index;
  out_info->physical_index = dev->info.physical_index;
  out_info->core_count = static_cast<uint32_t>(dev->visible_cores.size());
  out_info->physical_core_count = dev->info.core_count;
  out_info->numa_node = dev->info.numa_node;
  out_info->memory_bytes = dev->info.memory_bytes;
  out_info->memory_alignment = std::max<uint64_t>(64, dev->info.memory_alignment);
  CopyString(out_info->name, sizeof(out_info->name), dev->info.name);
  CopyString(out_info->driver, sizeof(out_info->driver), rt->driver->name());
  CopyString(out_info->cpu_affinity, sizeof(out_info->cpu_affinity), dev->info.cpu_affinity);
  if (out_info->struct_size >= sizeof(tern_device_info_t)) {
    CopyString(out_info->uuid, sizeof(out_info->uuid), dev->info.uuid);
    CopyString(out_info->bus_id, sizeof(out_info->bus_id), dev->info.bus_id);
    CopyString(out_info->driver_version, sizeof(out_info->driver_version),
               dev->info.driver_version);
  }
  return TERN_OK;
}

TERN_API tern_status_t tern_core_open(tern_device_t device, uint32_t core_index,
                                      tern_core_t* out_core) {
  TERN_API_CLEAR_OUT(out_core, nullptr);
  Runtime* rt;
  DeviceObject* dev;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupDevice(rt, device, "device", &dev));
  if (core_index >= dev->visible_cores.size()) {
    return Report(MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                             "core {} does not exist on device {}: it has {} cores visible to this "
                             "process (0-{})",
                             core_index, dev->index, dev->visible_cores.size(),
                             dev->visible_cores.size() - 1));
  }
  std::lock_guard<std::mutex> lock(dev->cores_mutex);
  if (dev->core_open[core_index]) {
    return Report(MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                             "core {} of device {} is already open in this process; use the handle "
                             "you have, or close it first",
                             core_index, dev->index));
  }
  auto core = std::make_shared<CoreObject>();
  core->device = dev;
  core->index = core_index;
  core->physical = dev->visible_cores[core_index];
  TERN_API_TRY(dev->hw->OpenCore(core->physical));
  dev->core_open[core_index] = true;
  *out_core = reinterpret_cast<tern_core_t>(rt->core_table.Insert(std::move(core)));
  return TERN_OK;
}

TERN_API tern_status_t tern_core_close(tern_core_t core) {
  Runtime* rt;
  std::shared_ptr<CoreObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupCore(rt, core, "core", &object));
  DeviceObject* dev = object->device;
  std::lock_guard<std::mutex> lock(dev->cores_mutex);
  if (object->queue_count.load() != 0) {
    return Report(
        MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                   "core {} of device {} still has {} queues: destroy them before closing "
                   "the core",
                   object->index, dev->index, object->queue_count.load()));
  }
  if (!rt->core_table.Remove(reinterpret_cast<uint64_t>(core))) {
    return Report(MakeStatus(TERN_ERROR_INVALID_HANDLE, "core was closed concurrently"));
  }
  dev->hw->CloseCore(object->physical);
  dev->core_open[object->index] = false;
  return TERN_OK;
}

TERN_API tern_status_t tern_core_get_info(tern_core_t core, tern_core_info_t* out_info) {
  TERN_API_CLEAR_OUT_STRUCT(out_info, tern_core_info_t);
  Runtime* rt;
  std::shared_ptr<CoreObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupCore(rt, core, "core", &object));
  out_info->index = object->index;
  out_info->physical_index = object->physical;
  out_info->node_index = object->device->first_node_core + object->physical;
  out_info->device = object->device->handle;
  return TERN_OK;
}

static_assert(offsetof(tern_device_telemetry_t, latency_histogram) ==
                  TERN_DEVICE_TELEMETRY_MIN_SIZE,
              "TERN_DEVICE_TELEMETRY_MIN_SIZE is the size before the first added field");

TERN_API tern_status_t tern_device_get_telemetry(tern_device_t device,
                                                 tern_device_telemetry_t* out_telemetry) {
  TERN_API_CHECK_NOT_NULL(out_telemetry);
  TERN_API_TRY(CheckStructSize(out_telemetry->struct_size, TERN_DEVICE_TELEMETRY_MIN_SIZE,
                               "tern_device_telemetry_t"));
  // A caller built against an older header passes a smaller structure: fill
  // what it has room for, and keep its struct_size.
  const uint32_t struct_size = out_telemetry->struct_size;
  const size_t filled = std::min<size_t>(struct_size, sizeof(tern_device_telemetry_t));
  auto snapshot = std::make_unique<tern_device_telemetry_t>();
  Runtime* rt;
  DeviceObject* dev;
  Status status = GetRuntime(&rt);
  if (status.ok()) status = LookupDevice(rt, device, "device", &dev);
  if (status.ok()) status = dev->hw->GetTelemetry(snapshot.get());
  std::memcpy(out_telemetry, snapshot.get(), filled);
  out_telemetry->struct_size = struct_size;
  return Report(status);
}

TERN_API tern_status_t tern_debug_inject_fault(const tern_fault_params_t* params) {
  TERN_API_CHECK_NOT_NULL(params);
  TERN_API_TRY(
      CheckStructSize(params->struct_size, sizeof(tern_fault_params_t), "tern_fault_params_t"));
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  // A C caller may pass any value (the enum holds any int32_t in C++).
  const int32_t kind_value = static_cast<int32_t>(params->kind);
  if (kind_value < TERN_FAULT_HBM_UNCORRECTABLE || kind_value > TERN_FAULT_CORE_HANG) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "fault kind {} is unknown; use a tern_fault_kind_t value",
                             kind_value));
  }
  driver::Device::Fault fault{};
  fault.kind = static_cast<tern_fault_kind_t>(kind_value);
  fault.after_commands = params->after_commands;
  DeviceObject* dev = nullptr;
  if (fault.kind == TERN_FAULT_HBM_UNCORRECTABLE && params->buffer != nullptr) {
    std::shared_ptr<BufferObject> buffer;
    TERN_API_TRY(LookupBuffer(rt, params->buffer, "params->buffer", &buffer));
    dev = buffer->device;
    fault.has_range = true;
    fault.offset = buffer->offset;
    fault.size = buffer->allocated;
  } else {
    std::shared_ptr<CoreObject> core;
    TERN_API_TRY(LookupCore(rt, params->core, "params->core", &core));
    dev = core->device;
    fault.core = core->physical;
  }
  return Report(dev->hw->InjectFault(fault));
}

}  // extern "C"
