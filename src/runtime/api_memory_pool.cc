// Memory pools and stream-ordered allocation (tern/memory_pool.h).

#include "src/runtime/api_checks.h"
#include "src/runtime/memory_pool.h"
#include "src/runtime/runtime_state.h"

namespace tern {
namespace {

Status LookupMemoryPool(Runtime* rt, tern_memory_pool_t handle, const char* arg,
                        std::shared_ptr<MemoryPoolObject>* out) {
  *out = rt->memory_pool_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (*out) return OkStatus();
  return NotALiveHandle(arg, "memory pool", "already destroyed",
                        "create one with tern_memory_pool_create(), or use the device's default "
                        "pool (tern_device_default_memory_pool(), or NULL in tern_queue_alloc())");
}

Status CreatePool(Runtime* rt, tern_device_t device, const tern_memory_pool_params_t* params,
                  tern_memory_pool_t* out_pool) {
  DeviceObject* dev;
  TERN_RETURN_IF_ERROR(LookupDevice(rt, device, "device", &dev));
  if (params == nullptr) return NullArgument("params");
  TERN_RETURN_IF_ERROR(CheckStructSize(params->struct_size, sizeof(tern_memory_pool_params_t),
                                       "tern_memory_pool_params_t"));
  TERN_RETURN_IF_ERROR(CheckNoFlags(params->flags, "tern_memory_pool_params_t"));
  if (params->reserved != 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "tern_memory_pool_params_t.reserved is {}; it must be 0", params->reserved);
  }
  const uint32_t category = static_cast<uint32_t>(params->category);
  if (category >= TERN_MEMORY_CATEGORY_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "memory category {} is unknown; use a tern_memory_category_t value",
                      category);
  }
  auto pool =
      std::make_shared<MemoryPoolObject>(dev, params->category, params->release_threshold, false);
  const uint64_t handle = rt->memory_pool_table.Insert(std::move(pool));
  if (handle == 0) return HandleTableFull("memory pools");
  *out_pool = reinterpret_cast<tern_memory_pool_t>(handle);
  return OkStatus();
}

Status DestroyPool(Runtime* rt, tern_memory_pool_t handle) {
  std::shared_ptr<MemoryPoolObject> pool =
      rt->memory_pool_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (!pool) {
    return NotALiveHandleToDestroy("pool", "memory pool", "already destroyed", "never created");
  }
  if (pool->is_default) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "pool is the default memory pool of device {}, which lives until "
                      "tern_shutdown(); give its memory back with tern_memory_pool_trim_to()",
                      pool->device->index);
  }
  {
    std::lock_guard<std::mutex> lock(pool->mutex);
    if (pool->destroyed) {
      return NotALiveHandleToDestroy("pool", "memory pool", "already destroyed", "never created");
    }
    if (pool->live_count > 0) {
      return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                        "cannot destroy a memory pool with {} live allocation{} ({} requested); "
                        "free them first with tern_queue_free() (or tern_buffer_free() once "
                        "their commands completed)",
                        pool->live_count, pool->live_count == 1 ? "" : "s",
                        FormatBytes(pool->requested_bytes));
    }
    // From here on, allocations from this pool fail: nothing can become live.
    pool->destroyed = true;
  }
  rt->memory_pool_table.Remove(reinterpret_cast<uint64_t>(handle));
  PoolReleaseAll(*pool);
  return OkStatus();
}

Status CheckAttribute(uint32_t attribute) {
  if (attribute >= TERN_MEMORY_POOL_ATTR_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "memory pool attribute {} is unknown; use a tern_memory_pool_attribute_t "
                      "value",
                      attribute);
  }
  return OkStatus();
}

Status QueueAlloc(Runtime* rt, tern_queue_t queue, uint64_t size, tern_memory_pool_t pool_handle,
                  tern_buffer_t* out_buffer) {
  QueueObject* q;
  TERN_RETURN_IF_ERROR(PeekQueue(rt, queue, "queue", &q));
  DeviceObject* dev = q->core->device;
  std::shared_ptr<MemoryPoolObject> pool;
  if (pool_handle == nullptr) {
    pool = dev->default_pool;
  } else {
    TERN_RETURN_IF_ERROR(LookupMemoryPool(rt, pool_handle, "pool", &pool));
    if (pool->device != dev) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "pool belongs to device {} but queue '{}' runs on device {}; allocate "
                        "from a pool of device {} (NULL: its default pool)",
                        pool->device->index, q->name, dev->index, dev->index);
    }
  }
  if (size == 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "cannot allocate 0 bytes: size must be > 0");
  }
  auto buffer = std::make_shared<BufferObject>();
  if (size > dev->info.memory_bytes) {
    // The device's own report (what is free, who uses it), before a size
    // class that could overflow: AllocateDeviceMemory refuses such a size.
    Status status = AllocateDeviceMemory(dev, size, 0, pool->category, buffer.get());
    if (status.ok()) ReleaseBuffer(*buffer);
    return status.ok() ? MakeStatus(TERN_ERROR_INTERNAL, "allocated more than the device holds")
                       : status;
  }
  TERN_RETURN_IF_ERROR(PoolAllocate(pool, q->completion, size, buffer.get()));
  const uint64_t handle = rt->buffer_table.Insert(buffer);
  if (handle == 0) {
    PoolFree(*buffer, nullptr, 0);
    return HandleTableFull("buffers");
  }
  *out_buffer = reinterpret_cast<tern_buffer_t>(handle);
  return OkStatus();
}

Status QueueFree(Runtime* rt, tern_queue_t queue, tern_buffer_t buffer) {
  QueueObject* q;
  TERN_RETURN_IF_ERROR(PeekQueue(rt, queue, "queue", &q));
  std::shared_ptr<BufferObject> object;
  TERN_RETURN_IF_ERROR(LookupBuffer(rt, buffer, "buffer", &object));
  if (!object->pool) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "buffer was allocated with tern_buffer_alloc(), not tern_queue_alloc(): it "
                      "has no pool to return to; free it with tern_buffer_free() once the "
                      "commands that use it have completed");
  }
  if (object->device != q->core->device) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "buffer lives on device {} but queue '{}' runs on device {}; free it on a "
                      "queue of device {}",
                      object->device->index, q->name, q->core->device->index,
                      object->device->index);
  }
  // Removing the handle decides between concurrent frees of one buffer.
  if (rt->buffer_table.Remove(reinterpret_cast<uint64_t>(buffer)) != object) {
    return NotALiveHandleToDestroy("buffer", "buffer", "already freed", "never allocated");
  }
  // Every command submitted so far, those that use the buffer included, has
  // a sequence number at most this one.
  PoolFree(*object, q->hw->completion(), q->hw->submitted());
  return OkStatus();
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_memory_pool_create(tern_device_t device,
                                               const tern_memory_pool_params_t* params,
                                               tern_memory_pool_t* out_pool) {
  TERN_API_CLEAR_OUT(out_pool, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(CreatePool(rt, device, params, out_pool));
}

TERN_API tern_status_t tern_memory_pool_destroy(tern_memory_pool_t pool) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(DestroyPool(rt, pool));
}

TERN_API tern_status_t tern_device_default_memory_pool(tern_device_t device,
                                                       tern_memory_pool_t* out_pool) {
  TERN_API_CLEAR_OUT(out_pool, nullptr);
  Runtime* rt;
  DeviceObject* dev;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupDevice(rt, device, "device", &dev));
  *out_pool = dev->default_pool_handle;
  return TERN_OK;
}

TERN_API tern_status_t tern_memory_pool_set_attribute(tern_memory_pool_t pool,
                                                      tern_memory_pool_attribute_t attribute,
                                                      uint64_t value) {
  Runtime* rt;
  std::shared_ptr<MemoryPoolObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupMemoryPool(rt, pool, "pool", &object));
  const uint32_t raw = static_cast<uint32_t>(attribute);
  TERN_API_TRY(CheckAttribute(raw));
  if (raw != TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "memory pool attribute {} (the category) is read-only; it is set "
                             "when the pool is created",
                             raw));
  }
  std::lock_guard<std::mutex> lock(object->mutex);
  object->release_threshold = value;
  return TERN_OK;
}

TERN_API tern_status_t tern_memory_pool_get_attribute(tern_memory_pool_t pool,
                                                      tern_memory_pool_attribute_t attribute,
                                                      uint64_t* out_value) {
  TERN_API_CLEAR_OUT(out_value, 0);
  Runtime* rt;
  std::shared_ptr<MemoryPoolObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupMemoryPool(rt, pool, "pool", &object));
  const uint32_t raw = static_cast<uint32_t>(attribute);
  TERN_API_TRY(CheckAttribute(raw));
  if (raw == TERN_MEMORY_POOL_ATTR_CATEGORY) {
    *out_value = static_cast<uint64_t>(object->category);
    return TERN_OK;
  }
  std::lock_guard<std::mutex> lock(object->mutex);
  *out_value = object->release_threshold;
  return TERN_OK;
}

TERN_API tern_status_t tern_memory_pool_trim_to(tern_memory_pool_t pool, uint64_t keep_bytes) {
  Runtime* rt;
  std::shared_ptr<MemoryPoolObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupMemoryPool(rt, pool, "pool", &object));
  PoolTrim(*object, keep_bytes);
  return TERN_OK;
}

TERN_API tern_status_t tern_memory_pool_get_stats(tern_memory_pool_t pool,
                                                  tern_memory_pool_stats_t* out_stats) {
  TERN_API_CLEAR_OUT_STRUCT(out_stats, tern_memory_pool_stats_t);
  Runtime* rt;
  std::shared_ptr<MemoryPoolObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupMemoryPool(rt, pool, "pool", &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  const MemoryPoolObject& p = *object;
  out_stats->allocation_count = p.live_count;
  out_stats->reserved_bytes = p.used_bytes + p.cached_bytes;
  out_stats->used_bytes = p.used_bytes;
  out_stats->requested_bytes = p.requested_bytes;
  out_stats->cached_bytes = p.cached_bytes;
  for (const auto& [size_class, blocks] : p.cached) {
    for (const MemoryPoolObject::CachedBlock& block : blocks) {
      if (!block.Idle()) out_stats->pending_bytes += block.allocated;
    }
  }
  out_stats->peak_reserved_bytes = p.peak_reserved_bytes;
  out_stats->peak_used_bytes = p.peak_used_bytes;
  out_stats->release_threshold = p.release_threshold;
  out_stats->allocations = p.allocations;
  out_stats->reused_same_queue = p.reused_same_queue;
  out_stats->reused_other_queue = p.reused_other_queue;
  out_stats->device_allocations = p.device_allocations;
  out_stats->device_releases = p.device_releases;
  return TERN_OK;
}

TERN_API tern_status_t tern_queue_alloc(tern_queue_t queue, uint64_t size, tern_memory_pool_t pool,
                                        tern_buffer_t* out_buffer) {
  TERN_API_CLEAR_OUT(out_buffer, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(QueueAlloc(rt, queue, size, pool, out_buffer));
}

TERN_API tern_status_t tern_queue_free(tern_queue_t queue, tern_buffer_t buffer) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(QueueFree(rt, queue, buffer));
}

}  // extern "C"
