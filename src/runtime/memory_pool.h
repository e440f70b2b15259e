// The object behind tern_memory_pool_t (tern/memory_pool.h): a cache of
// device blocks of one device and category, handed out and taken back as
// points of queues.
//
// Every block is one device allocation (AllocateDeviceMemory), so the
// device's sub-allocator, accounting and statistics see the pool's memory as
// they see tern_buffer_alloc's. A freed block is kept, by size class, with
// the point where it was freed: the queue's completion timeline and the
// queue's last submitted sequence at the time. It is reusable by the same
// queue at once (queue order protects it), and by any other queue, or given
// back to the device, once the timeline has reached the point (one atomic
// load: no host wait). A block freed by tern_buffer_free carries no point:
// it is idle at once.
//
// Thread-safety: every function may be called from any thread; the pool's
// state is guarded by its mutex, which is taken before the device's
// memory_mutex and never held across a call into the driver.
#ifndef TERN_SRC_RUNTIME_MEMORY_POOL_H_
#define TERN_SRC_RUNTIME_MEMORY_POOL_H_

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status_with_message.h"
#include "common/timeline.h"
#include "src/runtime/runtime_state.h"

namespace tern {

// The size class of a request of `size` bytes (> 0): at least 512 bytes,
// then four classes per power of two, so a block is at most 25% larger than
// its request.
uint64_t PoolSizeClass(uint64_t size);

struct MemoryPoolObject {
  MemoryPoolObject(DeviceObject* dev, tern_memory_category_t category, uint64_t release_threshold,
                   bool is_default)
      : device(dev),
        category(category),
        is_default(is_default),
        release_threshold(release_threshold) {}

  DeviceObject* const device;
  const tern_memory_category_t category;
  const bool is_default;  // a device's default pool: not destroyable

  // A freed block waiting for reuse.
  struct CachedBlock {
    uint64_t offset = 0;     // in the device's memory
    uint64_t allocated = 0;  // bytes charged (the device allocation's size)
    // The queue point of the free: reusable by other queues once `timeline`
    // reaches `point`; a null timeline is idle at once.
    std::shared_ptr<const Timeline> timeline;
    uint64_t point = 0;

    bool Idle() const { return timeline == nullptr || timeline->value() >= point; }
  };

  std::mutex mutex;
  bool destroyed = false;      // guarded by mutex
  uint64_t release_threshold;  // guarded by mutex
  // Freed blocks by size class, most recently freed last; guarded by mutex.
  absl::flat_hash_map<uint64_t, std::vector<CachedBlock>> cached;

  // Statistics (tern_memory_pool_stats_t); guarded by mutex.
  uint32_t live_count = 0;
  uint64_t used_bytes = 0;
  uint64_t requested_bytes = 0;
  uint64_t cached_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t peak_used_bytes = 0;
  uint64_t allocations = 0;
  uint64_t reused_same_queue = 0;
  uint64_t reused_other_queue = 0;
  uint64_t device_allocations = 0;
  uint64_t device_releases = 0;
};

// Takes a block of at least `size` bytes from `pool` for use on the queue
// whose completion timeline is `queue_timeline`: a cached block of the
// request's class freed on that queue or idle, else a new device block (on
// out-of-memory, after giving the pool's idle blocks back, once more). Fills
// `out` (device, offset, size, allocated, category, pool). Fails with
// INVALID_HANDLE when the pool was destroyed meanwhile, and with the
// device's out-of-memory report.
Status PoolAllocate(const std::shared_ptr<MemoryPoolObject>& pool, const Timeline* queue_timeline,
                    uint64_t size, BufferObject* out);

// Takes back the block of `buffer` (whose handle the caller removed), freed
// at `point` of `timeline` (null: idle now, as tern_buffer_free vouches).
// Then gives idle memory above the release threshold back to the device.
void PoolFree(const BufferObject& buffer, std::shared_ptr<const Timeline> timeline, uint64_t point);

// Gives idle cached blocks back to the device until at most `keep_bytes`
// are cached (pending blocks stay). Does not wait.
void PoolTrim(MemoryPoolObject& pool, uint64_t keep_bytes);

// Marks the pool destroyed and gives every cached block back, waiting for the
// queues to reach the pending ones. For tern_memory_pool_destroy (after it
// checked that nothing is live) and shutdown (after the queues drained).
void PoolReleaseAll(MemoryPoolObject& pool);

// The default pool of a device, made by tern_init: inserts it in the
// runtime's table and stores it and its handle in `dev`.
void CreateDefaultMemoryPool(Runtime* rt, DeviceObject* dev);

}  // namespace tern

#endif  // TERN_SRC_RUNTIME_MEMORY_POOL_H_
