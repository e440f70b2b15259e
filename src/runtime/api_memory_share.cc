// Device memory shared between processes: shareable buffers
// (TERN_BUFFER_FLAG_SHAREABLE), tern_buffer_export and tern_buffer_import.
// The driver backs each shareable buffer with an object of its own and does
// the node-wide accounting of shared memory; this file places the ranges in
// the process's device address space and keeps the process's own figures.
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"

namespace tern {

namespace {

constexpr uint64_t kGranule = driver::Device::kShareGranule;

uint64_t RoundUpToGranule(uint64_t size) { return (size + kGranule - 1) & ~(kGranule - 1); }

}  // namespace

Status AllocateSharedDeviceMemory(DeviceObject* dev, uint64_t size, uint64_t alignment,
                                  tern_memory_category_t category, BufferObject* out) {
  if (size > dev->info.memory_bytes) {
    // Let the ordinary path write the out-of-memory report.
    return AllocateDeviceMemory(dev, size, alignment, category, out);
  }
  // Whole pages: the range is mapped from an object of its own.
  const uint64_t bytes = RoundUpToGranule(size);
  TERN_RETURN_IF_ERROR(PlaceDeviceMemory(
      dev, bytes, std::max(alignment, kGranule), category,
      [&](uint64_t offset, uint64_t allocated) {
        return dev->hw->CreateShareable(offset, allocated, size, category);
      },
      out));
  out->size = size;
  out->shared = true;
  return OkStatus();
}

namespace {

Status ExportBuffer(Runtime* rt, tern_buffer_t buffer, int* out_fd) {
  std::shared_ptr<BufferObject> object;
  TERN_RETURN_IF_ERROR(LookupBuffer(rt, buffer, "buffer", &object));
  if (!object->shared) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "buffer ({} bytes on device {}) was allocated without "
                      "TERN_BUFFER_FLAG_SHAREABLE, so it cannot be exported; allocate the "
                      "buffers you will share with that flag in tern_buffer_params_t.flags",
                      object->size, object->device->index);
  }
  return object->device->hw->ExportShareable(object->offset, out_fd);
}

Status ImportBuffer(Runtime* rt, tern_device_t device, int fd, uint64_t size,
                    tern_buffer_t* out_buffer) {
  DeviceObject* dev;
  TERN_RETURN_IF_ERROR(LookupDevice(rt, device, "device", &dev));
  if (fd < 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd is {}; pass the descriptor that tern_buffer_export() returned", fd);
  }
  if (size == 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "size is 0; pass the size the exported buffer was allocated with");
  }
  driver::Device::SharedMemoryDesc desc;
  TERN_RETURN_IF_ERROR(dev->hw->InspectShareable(fd, &desc));
  if (desc.size != size) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "size is {}, but the buffer that fd {} stands for has {} bytes; pass the "
                      "size it was allocated with",
                      size, fd, desc.size);
  }
  auto buffer = std::make_shared<BufferObject>();
  TERN_RETURN_IF_ERROR(PlaceDeviceMemory(
      dev, desc.bytes, kGranule, desc.category,
      [&](uint64_t offset, uint64_t allocated) {
        if (allocated != desc.bytes) {
          return MakeStatus(TERN_ERROR_INTERNAL,
                            "the allocator placed {} bytes for an imported buffer of {}", allocated,
                            desc.bytes);
        }
        return dev->hw->ImportShareable(fd, offset, desc);
      },
      buffer.get()));
  buffer->size = desc.size;
  buffer->shared = true;
  const uint64_t handle = rt->buffer_table.Insert(buffer);
  if (handle == 0) {
    ReleaseBuffer(*buffer);
    return HandleTableFull("buffers");
  }
  *out_buffer = reinterpret_cast<tern_buffer_t>(handle);
  return OkStatus();
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_buffer_export(tern_buffer_t buffer, int* out_fd) {
  TERN_API_CLEAR_OUT(out_fd, -1);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(ExportBuffer(rt, buffer, out_fd));
}

TERN_API tern_status_t tern_buffer_import(tern_device_t device, int fd, uint64_t size,
                                          tern_buffer_t* out_buffer) {
  TERN_API_CLEAR_OUT(out_buffer, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(ImportBuffer(rt, device, fd, size, out_buffer));
}

}  // extern "C"
