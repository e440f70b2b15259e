// Memory pools: blocks handed out and taken back as points of queues (see
// memory_pool.h).
#include "src/runtime/memory_pool.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace tern {
namespace {

constexpr uint64_t kMinBlock = 512;

// Gives `blocks` back to the device (outside the pool's lock).
void ReleaseBlocks(const MemoryPoolObject& pool,
                   const std::vector<MemoryPoolObject::CachedBlock>& blocks) {
  for (const MemoryPoolObject::CachedBlock& block : blocks) {
    BufferObject buffer;
    buffer.device = pool.device;
    buffer.offset = block.offset;
    buffer.size = block.allocated;
    buffer.allocated = block.allocated;
    buffer.category = pool.category;
    ReleaseBuffer(buffer);
  }
}

// Moves idle cached blocks to `out` until at most `keep_bytes` are cached.
// The caller holds pool.mutex.
void CollectIdle(MemoryPoolObject& pool, uint64_t keep_bytes,
                 std::vector<MemoryPoolObject::CachedBlock>* out) {
  for (auto& [size_class, blocks] : pool.cached) {
    // Oldest first: the most recently freed blocks are the likeliest reused.
    for (size_t i = 0; i < blocks.size() && pool.cached_bytes > keep_bytes;) {
      if (!blocks[i].Idle()) {
        ++i;
        continue;
      }
      pool.cached_bytes -= blocks[i].allocated;
      ++pool.device_releases;
      out->push_back(std::move(blocks[i]));
      blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (pool.cached_bytes <= keep_bytes) break;
  }
}

// The bytes the pool holds from the device. The caller holds pool.mutex.
uint64_t Reserved(const MemoryPoolObject& pool) { return pool.used_bytes + pool.cached_bytes; }

// Counts a block handed out for `size` bytes. The caller holds pool.mutex.
void CountLive(MemoryPoolObject& pool, uint64_t size, uint64_t allocated) {
  ++pool.live_count;
  ++pool.allocations;
  pool.used_bytes += allocated;
  pool.requested_bytes += size;
  pool.peak_used_bytes = std::max(pool.peak_used_bytes, pool.used_bytes);
  pool.peak_reserved_bytes = std::max(pool.peak_reserved_bytes, Reserved(pool));
}

Status PoolDestroyed() {
  return MakeStatus(TERN_ERROR_INVALID_HANDLE,
                    "the memory pool was destroyed while this call used it; allocate from a live "
                    "pool");
}

}  // namespace

uint64_t PoolSizeClass(uint64_t size) {
  if (size <= kMinBlock) return kMinBlock;
  const uint64_t step = std::max(kMinBlock, std::bit_floor(size - 1) / 4);
  return (size + step - 1) / step * step;
}

Status PoolAllocate(const std::shared_ptr<MemoryPoolObject>& pool_ptr,
                    const Timeline* queue_timeline, uint64_t size, BufferObject* out) {
  MemoryPoolObject& pool = *pool_ptr;
  DeviceObject* dev = pool.device;
  const uint64_t size_class = PoolSizeClass(size);
  std::vector<MemoryPoolObject::CachedBlock> release;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (pool.destroyed) return PoolDestroyed();
    auto it = pool.cached.find(size_class);
    if (it != pool.cached.end()) {
      std::vector<MemoryPoolObject::CachedBlock>& blocks = it->second;
      // Most recently freed first: its lines are the likeliest still cached.
      for (size_t i = blocks.size(); i-- > 0;) {
        MemoryPoolObject::CachedBlock& block = blocks[i];
        if (block.allocated < size) continue;  // an exact-size block (see below)
        const bool same_queue = block.timeline.get() == queue_timeline;
        if (!same_queue && !block.Idle()) continue;
        out->device = dev;
        out->offset = block.offset;
        out->size = size;
        out->allocated = block.allocated;
        out->category = pool.category;
        out->pool = pool_ptr;
        pool.cached_bytes -= block.allocated;
        if (same_queue) {
          ++pool.reused_same_queue;
        } else {
          ++pool.reused_other_queue;
        }
        if (i + 1 != blocks.size()) blocks[i] = std::move(blocks.back());
        blocks.pop_back();
        CountLive(pool, size, out->allocated);
        found = true;
        break;
      }
    }
    if (found && pool.cached_bytes > pool.release_threshold) {
      CollectIdle(pool, pool.release_threshold, &release);
    }
  }
  if (found) {
    ReleaseBlocks(pool, release);
    return OkStatus();
  }

  // A new block from the device.
  BufferObject block;
  Status status = AllocateDeviceMemory(dev, size_class, 0, pool.category, &block);
  if (status.code() == TERN_ERROR_OUT_OF_MEMORY) {
    // Give the idle blocks back, and try again; a class larger than what is
    // left may still fit as the exact size.
    PoolTrim(pool, 0);
    status = AllocateDeviceMemory(dev, size_class, 0, pool.category, &block);
    if (status.code() == TERN_ERROR_OUT_OF_MEMORY && size_class > size) {
      status = AllocateDeviceMemory(dev, size, 0, pool.category, &block);
    }
  }
  if (!status.ok()) {
    if (status.code() != TERN_ERROR_OUT_OF_MEMORY) return status;
    std::lock_guard<std::mutex> lock(pool.mutex);
    return Status(status.code(),
                  fmt::format("{} (tern_queue_alloc: the pool holds {} of which {} in {} live "
                              "allocations; it gave its idle cached blocks back and tried again)",
                              status.message(), FormatBytes(Reserved(pool)),
                              FormatBytes(pool.used_bytes), pool.live_count));
  }
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (!pool.destroyed) {
      ++pool.device_allocations;
      CountLive(pool, size, block.allocated);
      if (pool.cached_bytes > pool.release_threshold) {
        CollectIdle(pool, pool.release_threshold, &release);
      }
      found = true;
    }
  }
  if (!found) {
    ReleaseBuffer(block);
    return PoolDestroyed();
  }
  ReleaseBlocks(pool, release);
  block.size = size;
  block.pool = pool_ptr;
  *out = std::move(block);
  return OkStatus();
}

void PoolFree(const BufferObject& buffer, std::shared_ptr<const Timeline> timeline,
              uint64_t point) {
  MemoryPoolObject& pool = *buffer.pool;
  std::vector<MemoryPoolObject::CachedBlock> release;
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    --pool.live_count;
    pool.used_bytes -= buffer.allocated;
    pool.requested_bytes -= buffer.size;
    pool.cached_bytes += buffer.allocated;
    MemoryPoolObject::CachedBlock block;
    block.offset = buffer.offset;
    block.allocated = buffer.allocated;
    block.timeline = std::move(timeline);
    block.point = point;
    pool.cached[PoolSizeClass(buffer.size)].push_back(std::move(block));
    if (pool.cached_bytes > pool.release_threshold) {
      CollectIdle(pool, pool.release_threshold, &release);
    }
  }
  ReleaseBlocks(pool, release);
}

void PoolTrim(MemoryPoolObject& pool, uint64_t keep_bytes) {
  std::vector<MemoryPoolObject::CachedBlock> release;
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (pool.cached_bytes > keep_bytes) CollectIdle(pool, keep_bytes, &release);
  }
  ReleaseBlocks(pool, release);
}

void PoolReleaseAll(MemoryPoolObject& pool) {
  std::vector<MemoryPoolObject::CachedBlock> release;
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    pool.destroyed = true;
    for (auto& [size_class, blocks] : pool.cached) {
      for (MemoryPoolObject::CachedBlock& block : blocks) release.push_back(std::move(block));
    }
    pool.cached.clear();
    pool.device_releases += release.size();
    pool.cached_bytes = 0;
  }
  // A queue may still use a block freed on it: wait until it reached the free.
  for (const MemoryPoolObject::CachedBlock& block : release) {
    if (block.timeline) block.timeline->Wait(block.point, UINT64_MAX);
  }
  ReleaseBlocks(pool, release);
}

void CreateDefaultMemoryPool(Runtime* rt, DeviceObject* dev) {
  auto pool = std::make_shared<MemoryPoolObject>(dev, TERN_MEMORY_TENSORS, 0, /*is_default=*/true);
  dev->default_pool = pool;
  dev->default_pool_handle =
      reinterpret_cast<tern_memory_pool_t>(rt->memory_pool_table.Insert(std::move(pool)));
}

}  // namespace tern
