// Device memory (buffers), synchronous reads and writes, statistics and
// pinned host memory.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "src/runtime/api_checks.h"
#include "src/runtime/memory_pool.h"
#include "src/runtime/runtime_state.h"

namespace tern {

void ReleaseBuffer(const BufferObject& buffer) {
  DeviceObject* dev = buffer.device;
  if (buffer.shared) {
    // The range becomes the device's own memory again before the allocator
    // may hand it out; the driver drops this process's hold (and charge).
    dev->hw->ReleaseShareable(buffer.offset);
    {
      std::lock_guard<std::mutex> lock(dev->memory_mutex);
      dev->allocator->Free(buffer.offset);
      dev->used -= buffer.allocated;
      dev->used_by_category[buffer.category] -= buffer.allocated;
    }
    dev->hw->MemoryFreed(buffer.offset, buffer.allocated, buffer.category);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(dev->memory_mutex);
    dev->allocator->Free(buffer.offset);
    dev->used -= buffer.allocated;
    dev->used_by_category[buffer.category] -= buffer.allocated;
  }
  dev->hw->ReleaseMemory(buffer.allocated, buffer.category);
  dev->hw->MemoryFreed(buffer.offset, buffer.allocated, buffer.category);
}

namespace {

// The out-of-memory report: what was asked, what is free, and who uses it.
Status OutOfMemory(DeviceObject* dev, uint64_t size, tern_memory_category_t category,
                   const std::string& reason) {
  uint64_t node_by_category[TERN_MEMORY_CATEGORY_COUNT] = {};
  const uint64_t node_used = dev->hw->NodeMemoryUsed(node_by_category);
  const uint64_t capacity = dev->info.memory_bytes;
  const uint64_t free_bytes = capacity > node_used ? capacity - node_used : 0;
  uint64_t largest;
  uint64_t process_used;
  {
    std::lock_guard<std::mutex> lock(dev->memory_mutex);
    largest = std::min(dev->allocator->largest_free_block(), free_bytes);
    process_used = dev->used;
  }
  std::vector<int> order(TERN_MEMORY_CATEGORY_COUNT);
  for (int i = 0; i < TERN_MEMORY_CATEGORY_COUNT; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return node_by_category[a] > node_by_category[b]; });
  std::string top;
  for (int i : order) {
    if (node_by_category[i] == 0) break;
    if (!top.empty()) top += ", ";
    top += fmt::format("{} {}", MemoryCategoryName(static_cast<tern_memory_category_t>(i)),
                       FormatBytes(node_by_category[i]));
  }
  if (top.empty()) top = "none";
  return MakeStatus(TERN_ERROR_OUT_OF_MEMORY,
                    "device {} cannot allocate {} for {}: {}. Free: {} of {} (largest free block "
                    "{}); this process uses {}, other processes {}. Top users by category on the "
                    "node: {}. Free buffers you no longer need, use smaller allocations, or run "
                    "fewer processes on this device",
                    dev->index, FormatBytes(size), MemoryCategoryName(category), reason,
                    FormatBytes(free_bytes), FormatBytes(capacity), FormatBytes(largest),
                    FormatBytes(process_used),
                    FormatBytes(node_used > process_used ? node_used - process_used : 0), top);
}

// A failed ReserveMemory() as the caller reports it: the out-of-memory
// report (for `size`, what the caller asked) when the node's memory is used
// up. Undo what the attempt took first, so that the report counts it free.
Status ReserveFailed(DeviceObject* dev, uint64_t size, tern_memory_category_t category,
                     const Status& reserved) {
  if (reserved.code() == TERN_ERROR_OUT_OF_MEMORY) {
    return OutOfMemory(dev, size, category, "the node's device memory is used up");
  }
  return reserved;
}

// Counts `bytes` of `category` as used by this process.
void AddToUsed(DeviceObject* dev, uint64_t bytes, tern_memory_category_t category) {
  std::lock_guard<std::mutex> lock(dev->memory_mutex);
  dev->used += bytes;
  dev->peak = std::max(dev->peak, dev->used);
  dev->used_by_category[category] += bytes;
}

}  // namespace

QueueScratch::~QueueScratch() { ReleaseBuffer(buffer); }

bool ReleaseIdleQueueScratch(DeviceObject* dev) {
  std::vector<std::shared_ptr<QueueScratch>> idle;
  {
    std::lock_guard<std::mutex> lock(dev->queues_mutex);
    for (const std::weak_ptr<QueueObject>& weak : dev->queues) {
      std::shared_ptr<QueueObject> queue = weak.lock();
      if (!queue) continue;
      std::lock_guard<std::mutex> scratch_lock(queue->scratch_mutex);
      // Only the queue holds it: every execution that ran in it completed,
      // and a new one would take it under scratch_mutex.
      if (queue->scratch && queue->scratch.use_count() == 1) {
        idle.push_back(std::move(queue->scratch));
      }
    }
  }
  return !idle.empty();  // freed here, outside the locks
}

namespace {

Status PlaceDeviceMemoryOnce(DeviceObject* dev, uint64_t size, uint64_t alignment,
                             tern_memory_category_t category, const ChargeFunction& charge,
                             BufferObject* out) {
  if (size > dev->info.memory_bytes) {
    return OutOfMemory(dev, size, category, "that is more than the device's whole memory");
  }
  BufferObject buffer;
  buffer.device = dev;
  buffer.size = size;
  buffer.category = category;
  {
    std::lock_guard<std::mutex> lock(dev->memory_mutex);
    if (!dev->allocator->Allocate(size, alignment, &buffer.offset)) {
      // Fall through to the report outside the lock.
      buffer.offset = UINT64_MAX;
    } else {
      buffer.allocated = dev->allocator->AllocationSize(buffer.offset);
    }
  }
  if (buffer.offset == UINT64_MAX) {
    return OutOfMemory(dev, size, category,
                       "no free block of this process's device address space is large enough");
  }
  Status reserved = charge(buffer.offset, buffer.allocated);
  if (!reserved.ok()) {
    {
      std::lock_guard<std::mutex> lock(dev->memory_mutex);
      dev->allocator->Free(buffer.offset);
    }
    return ReserveFailed(dev, size, category, reserved);
  }
  AddToUsed(dev, buffer.allocated, category);
  *out = buffer;
  return OkStatus();
}

}  // namespace

Status PlaceDeviceMemory(DeviceObject* dev, uint64_t size, uint64_t alignment,
                         tern_memory_category_t category, const ChargeFunction& charge,
                         BufferObject* out) {
  Status status = PlaceDeviceMemoryOnce(dev, size, alignment, category, charge, out);
  // The queues' idle scratch blocks are a cache: memory for a caller comes first.
  if (status.code() == TERN_ERROR_OUT_OF_MEMORY && ReleaseIdleQueueScratch(dev)) {
    status = PlaceDeviceMemoryOnce(dev, size, alignment, category, charge, out);
  }
  return status;
}

Status AllocateDeviceMemory(DeviceObject* dev, uint64_t size, uint64_t alignment,
                            tern_memory_category_t category, BufferObject* out) {
  return PlaceDeviceMemory(
      dev, size, alignment, category,
      [&](uint64_t, uint64_t allocated) { return dev->hw->ReserveMemory(allocated, category); },
      out);
}

Status ChargeDeviceMemory(DeviceObject* dev, uint64_t bytes, tern_memory_category_t category) {
  if (bytes == 0) return OkStatus();
  if (bytes > dev->info.memory_bytes) {
    return OutOfMemory(dev, bytes, category, "that is more than the device's whole memory");
  }
  Status reserved = dev->hw->ReserveMemory(bytes, category);
  if (!reserved.ok()) return ReserveFailed(dev, bytes, category, reserved);
  AddToUsed(dev, bytes, category);
  return OkStatus();
}

void UnchargeDeviceMemory(DeviceObject* dev, uint64_t bytes, tern_memory_category_t category) {
  if (bytes == 0) return;
  {
    std::lock_guard<std::mutex> lock(dev->memory_mutex);
    dev->used -= bytes;
    dev->used_by_category[category] -= bytes;
  }
  dev->hw->ReleaseMemory(bytes, category);
}

namespace {

// Buffers up to this size have their pages mapped when allocated (see
// AllocateBuffer).
constexpr uint64_t kMappedAtAllocationBytes = 64 << 10;

Status AllocateBuffer(Runtime* rt, tern_device_t device, const tern_buffer_params_t* params,
                      tern_buffer_t* out_buffer) {
  DeviceObject* dev;
  TERN_RETURN_IF_ERROR(LookupDevice(rt, device, "device", &dev));
  if (params == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "params is NULL");
  TERN_RETURN_IF_ERROR(
      CheckStructSize(params->struct_size, sizeof(tern_buffer_params_t), "tern_buffer_params_t"));
  TERN_RETURN_IF_ERROR(CheckFlags(params->flags, TERN_BUFFER_FLAG_SHAREABLE, "tern_buffer_params_t",
                                  "TERN_BUFFER_FLAG_SHAREABLE (0x1)"));
  if (params->size == 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "cannot allocate 0 bytes: size must be > 0");
  }
  if (params->alignment != 0 && (params->alignment & (params->alignment - 1)) != 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "alignment {} is not a power of two (use 0 for the device minimum)",
                      params->alignment);
  }
  const uint32_t category_value = static_cast<uint32_t>(params->category);
  if (category_value >= TERN_MEMORY_CATEGORY_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "memory category {} is unknown; use a tern_memory_category_t value",
                      category_value);
  }
  if (params->alignment > std::bit_ceil(dev->info.memory_bytes)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "alignment {} is larger than device {}'s whole memory ({}); ask for at most "
                      "{}",
                      params->alignment, dev->index, FormatBytes(dev->info.memory_bytes),
                      std::bit_ceil(dev->info.memory_bytes));
  }
  auto buffer = std::make_shared<BufferObject>();
  if ((params->flags & TERN_BUFFER_FLAG_SHAREABLE) != 0) {
    TERN_RETURN_IF_ERROR(AllocateSharedDeviceMemory(dev, params->size, params->alignment,
                                                    params->category, buffer.get()));
  } else {
    TERN_RETURN_IF_ERROR(
        AllocateDeviceMemory(dev, params->size, params->alignment, params->category, buffer.get()));
    // A small buffer's pages are mapped now, as a real device's memory is
    // always there: the first execution that wrote a fresh output buffer
    // paid its page fault (a 640-byte output of an MLP). Larger buffers stay
    // lazily committed (a large allocation mapped at once would cost a
    // millisecond per few megabytes, for memory it may never touch).
    if (params->size <= kMappedAtAllocationBytes)
      dev->hw->PrefaultMemory(buffer->offset, params->size);
  }
  const uint64_t handle = rt->buffer_table.Insert(buffer);
  if (handle == 0) {
    ReleaseBuffer(*buffer);
    return HandleTableFull("buffers");
  }
  *out_buffer = reinterpret_cast<tern_buffer_t>(handle);
  return OkStatus();
}

Status SyncTransfer(Runtime* rt, tern_buffer_t buffer, uint64_t offset, void* host, uint64_t size,
                    bool write) {
  std::shared_ptr<BufferObject> object;
  TERN_RETURN_IF_ERROR(LookupBuffer(rt, buffer, "buffer", &object));
  if (host == nullptr && size > 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{} is NULL", write ? "src" : "dst");
  }
  TERN_RETURN_IF_ERROR(CheckBufferRange(*object, offset, size, "buffer"));
  if (size == 0) return OkStatus();
  driver::Command command;
  command.kind = driver::CommandKind::kCopy;
  command.size = size;
  driver::MemoryRef device_ref{nullptr, object->device->hw.get(), object->offset + offset};
  driver::MemoryRef host_ref{host, nullptr, 0};
  command.dst = write ? device_ref : host_ref;
  command.src = write ? host_ref : device_ref;
  return object->device->hw->ExecuteSync(command);
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_buffer_alloc(tern_device_t device, const tern_buffer_params_t* params,
                                         tern_buffer_t* out_buffer) {
  TERN_API_CLEAR_OUT(out_buffer, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(AllocateBuffer(rt, device, params, out_buffer));
}

TERN_API tern_status_t tern_buffer_free(tern_buffer_t buffer) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<BufferObject> object =
      rt->buffer_table.Remove(reinterpret_cast<uint64_t>(buffer));
  if (!object) {
    return Report(NotALiveHandleToDestroy("buffer", "buffer", "already freed", "never allocated"));
  }
  // Commands already given to the device's queues may still use the memory:
  // it serves no other allocation before they have completed.
  WaitForDeviceQueues(object->device);
  if (object->pool) {
    // From tern_queue_alloc: idle now, so the block goes back to its pool,
    // reusable by every queue.
    PoolFree(*object, nullptr, 0);
    return TERN_OK;
  }
  ReleaseBuffer(*object);
  return TERN_OK;
}

TERN_API tern_status_t tern_buffer_get_info(tern_buffer_t buffer, tern_buffer_info_t* out_info) {
  TERN_API_CLEAR_OUT_STRUCT(out_info, tern_buffer_info_t);
  Runtime* rt;
  std::shared_ptr<BufferObject> object;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupBuffer(rt, buffer, "buffer", &object));
  out_info->size = object->size;
  out_info->device_address = object->device->hw->device_base() + object->offset;
  out_info->category = object->category;
  out_info->device = object->device->handle;
  return TERN_OK;
}

TERN_API tern_status_t tern_buffer_write(tern_buffer_t buffer, uint64_t offset, const void* src,
                                         uint64_t size) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(SyncTransfer(rt, buffer, offset, const_cast<void*>(src), size, true));
}

TERN_API tern_status_t tern_buffer_read(tern_buffer_t buffer, uint64_t offset, void* dst,
                                        uint64_t size) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(SyncTransfer(rt, buffer, offset, dst, size, false));
}

TERN_API tern_status_t tern_device_memory_stats(tern_device_t device,
                                                tern_memory_stats_t* out_stats) {
  TERN_API_CLEAR_OUT_STRUCT(out_stats, tern_memory_stats_t);
  Runtime* rt;
  DeviceObject* dev;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_TRY(LookupDevice(rt, device, "device", &dev));
  out_stats->capacity_bytes = dev->info.memory_bytes;
  out_stats->node_used_bytes = dev->hw->NodeMemoryUsed(out_stats->node_used_by_category);
  out_stats->free_bytes = out_stats->capacity_bytes > out_stats->node_used_bytes
                              ? out_stats->capacity_bytes - out_stats->node_used_bytes
                              : 0;
  std::lock_guard<std::mutex> lock(dev->memory_mutex);
  out_stats->allocation_count = dev->allocator->allocation_count();
  out_stats->used_bytes = dev->used;
  out_stats->peak_used_bytes = dev->peak;
  out_stats->largest_free_block =
      std::min(dev->allocator->largest_free_block(), out_stats->free_bytes);
  std::memcpy(out_stats->used_by_category, dev->used_by_category, sizeof(dev->used_by_category));
  return TERN_OK;
}

TERN_API tern_status_t tern_host_alloc(uint64_t size, void** out_ptr) {
  TERN_API_CLEAR_OUT(out_ptr, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  if (size == 0) {
    return Report(
        MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "cannot allocate 0 bytes of host memory"));
  }
  void* ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (ptr == MAP_FAILED) {
    return Report(ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, errno,
                              fmt::format("mapping {} of pinned host memory", FormatBytes(size))));
  }
  if (mlock(ptr, size) != 0) {
    const int err = errno;
    munmap(ptr, size);
    return Report(Status(TERN_ERROR_HOST_OUT_OF_MEMORY,
                         fmt::format("cannot pin {} of host memory: mlock failed: {}; raise the "
                                     "locked-memory limit (ulimit -l, RLIMIT_MEMLOCK) or pin less",
                                     FormatBytes(size), std::strerror(err))));
  }
  {
    std::lock_guard<std::mutex> lock(rt->host_mutex);
    rt->host_allocations.emplace_back(ptr, size);
  }
  *out_ptr = ptr;
  return TERN_OK;
}

TERN_API tern_status_t tern_host_free(void* ptr) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(rt->host_mutex);
    auto it = std::find_if(rt->host_allocations.begin(), rt->host_allocations.end(),
                           [&](const auto& entry) { return entry.first == ptr; });
    if (it == rt->host_allocations.end()) {
      return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                               "{} was not allocated by tern_host_alloc() (or was already freed)",
                               ptr));
    }
    size = it->second;
    rt->host_allocations.erase(it);
  }
  munmap(ptr, size);
  return TERN_OK;
}

}  // extern "C"

// Helpers of the functions below, outside the C block: they return C++ types.
namespace {

using tern::Runtime;

// The first registration or tern_host_alloc() block that overlaps
// [begin, end), described for an error message; empty when none does.
std::string HostOverlap(const Runtime& rt, uintptr_t begin, uintptr_t end) {
  for (const Runtime::HostRegistration& r : rt.host_registrations) {
    if (begin < r.locked_end && r.locked_begin < end) {
      return fmt::format("the range registered at {} ({} bytes)", r.ptr, r.size);
    }
  }
  for (const auto& [ptr, size] : rt.host_allocations) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    if (begin < a + size && a < end) {
      return fmt::format("pinned memory from tern_host_alloc() at {} ({} bytes)", ptr, size);
    }
  }
  return "";
}

}  // namespace

extern "C" {

TERN_API tern_status_t tern_host_register(void* ptr, uint64_t size) {
  using namespace tern;
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  TERN_API_CHECK_NOT_NULL(ptr);
  if (size == 0) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "cannot register 0 bytes at {}; pass the buffer's size", ptr));
  }
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  if (size > UINTPTR_MAX - begin - page) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "{} bytes at {} run past the end of the address space", size, ptr));
  }
  const uintptr_t locked_begin = begin & ~(page - 1);
  const uintptr_t locked_end = (begin + size + page - 1) & ~(page - 1);
  std::lock_guard<std::mutex> lock(rt->host_mutex);
  // Whole pages are locked, so two ranges that share a page would unlock
  // each other's: they are refused like any overlap.
  if (const std::string other = HostOverlap(*rt, locked_begin, locked_end); !other.empty()) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "cannot register {} bytes at {}: its pages overlap {}; unregister "
                             "that first, or register one range that covers both",
                             size, ptr, other));
  }
  if (mlock(reinterpret_cast<void*>(locked_begin), locked_end - locked_begin) != 0) {
    const int err = errno;
    if (err == ENOMEM || err == EPERM || err == EAGAIN) {
      return Report(Status(TERN_ERROR_HOST_OUT_OF_MEMORY,
                           fmt::format("cannot register {} at {}: locking its pages failed: {}; "
                                       "raise the locked-memory limit (ulimit -l, "
                                       "RLIMIT_MEMLOCK), register less, or check that the "
                                       "whole range is mapped",
                                       FormatBytes(size), ptr, std::strerror(err))));
    }
    return Report(ErrnoStatus(TERN_ERROR_INVALID_ARGUMENT, err,
                              fmt::format("registering {} at {}", FormatBytes(size), ptr)));
  }
  rt->host_registrations.push_back(Runtime::HostRegistration{ptr, size, locked_begin, locked_end});
  return TERN_OK;
}

TERN_API tern_status_t tern_host_unregister(void* ptr) {
  using namespace tern;
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::lock_guard<std::mutex> lock(rt->host_mutex);
  auto it = std::find_if(rt->host_registrations.begin(), rt->host_registrations.end(),
                         [&](const Runtime::HostRegistration& r) { return r.ptr == ptr; });
  if (it == rt->host_registrations.end()) {
    std::string inside;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (const Runtime::HostRegistration& r : rt->host_registrations) {
      const uintptr_t start = reinterpret_cast<uintptr_t>(r.ptr);
      if (p > start && p < start + r.size) {
        inside =
            fmt::format(" (it lies inside the range registered at {}: pass that pointer)", r.ptr);
      }
    }
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "{} starts no range registered with tern_host_register(){}", ptr,
                             inside));
  }
  munlock(reinterpret_cast<void*>(it->locked_begin), it->locked_end - it->locked_begin);
  rt->host_registrations.erase(it);
  return TERN_OK;
}

}  // extern "C"
