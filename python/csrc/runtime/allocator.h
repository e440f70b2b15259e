// The caching device allocator: tensors' memory on tern devices.
//
// Every block is one tern buffer (category "tensors"); blocks are never split.
// Requests are rounded to a size class (512 B steps up to 1 MiB, then four
// steps per power of two, so at most 25% is wasted) and a freed block goes
// back to a free list keyed by (device, stream, size class), from which only
// allocations of the same class on the same stream take it: work queued on
// one stream runs in order, so reuse there needs no synchronization.
//
// record_stream: a block used on other streams (Tensor.record_stream) is not
// reusable when the tensor dies; the allocator records a tern event on each
// of those streams and keeps the block aside until every event completed.
//
// Out of memory: the allocator first releases its cached blocks (after
// synchronizing the device) and retries; if tern still refuses, it raises
// torch.OutOfMemoryError with tern's own message (asked, free, largest free
// block, top users by category).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "tern/tern.h"

namespace torch_tern {

// Where a device pointer lives.
struct DeviceLocation {
  tern_buffer_t buffer = nullptr;
  uint64_t offset = 0;     // bytes from the start of the buffer
  uint64_t available = 0;  // bytes of the buffer from `offset` on
  c10::DeviceIndex device = -1;
};

class TernDeviceAllocator final : public c10::DeviceAllocator {
 public:
  static TernDeviceAllocator& Get();

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Resolves a pointer into a live block of `device` (-1: any device); throws
  // if no live block contains it.
  DeviceLocation Resolve(const void* ptr, c10::DeviceIndex device = -1) const;
  // As Resolve, for `ptr` inside `storage`: without the allocator's lock when
  // this allocator made the storage (its block is its DataPtr's context, and
  // a live block's buffer and address never change), the per-op case.
  // Thread-safety: any thread, while the storage lives.
  DeviceLocation Resolve(const c10::Storage& storage, const void* ptr,
                         c10::DeviceIndex device = -1) const;
  std::optional<c10::DeviceIndex> FindDevice(const void* ptr) const;

  // The size class a request of `nbytes` is rounded to.
  static size_t RoundSize(size_t nbytes);

  // Caps what this process's caching allocator reserves on `device` at
  // `fraction` (0..1] of the device's memory (torch.cuda's
  // set_per_process_memory_fraction): an allocation that would reserve more
  // first releases the cached blocks, then raises OutOfMemoryError naming
  // the cap. 1 removes the cap. Thread-safety: any thread.
  void SetMemoryFraction(c10::DeviceIndex device, double fraction);
  // The cap set with SetMemoryFraction (1.0 when none). Thread-safety: any thread.
  double GetMemoryFraction(c10::DeviceIndex device);

  // One block of the caching allocator (each block is one tern buffer: no
  // splitting, so a segment is one block).
  struct BlockSnapshot {
    c10::DeviceIndex device = 0;
    uintptr_t address = 0;
    size_t size = 0;       // the size class tern allocated
    size_t requested = 0;  // what the tensor asked for (0 when cached)
    c10::StreamId stream = 0;
    // "active_allocated" (a live tensor), "inactive" (cached, reusable) or
    // "pending_free" (freed, waiting for other streams' work: record_stream);
    // blocks of graph pools: "graph_pool_inactive" (reusable by captures
    // into the pool) or "graph_pool_deferred" (freed during a capture, held
    // until the pool is released).
    const char* state = "";
  };
  // Every block of every device, by device and address.
  // Thread-safety: any thread (a consistent view under the allocator's lock).
  std::vector<BlockSnapshot> Snapshot();

  // ---- Graph pools (torch.tern.graph) ----
  // A graph pool holds the blocks that captures into it allocated: while
  // stream `stream` of `device` captures into pool `pool`, that stream's
  // allocations come from the pool (its own free blocks, else new ones), and
  // a block of the pool, once freed, is reused only by captures into the
  // same pool. A block freed on the device while any of its streams captures
  // and not allocated by a capture (or used on other streams) is deferred:
  // no one reuses it until the pool is released. RetainPool/ReleasePool
  // count the pool's users (graphs); the last release synchronizes the
  // device and returns the pool's free and deferred blocks to the ordinary
  // free lists (its blocks still live join them when freed).
  // Thread-safety: any thread (under the allocator's lock).
  void RetainPool(c10::DeviceIndex device, uint64_t pool);
  // Thread-safety: any thread; may synchronize the device (not under a lock
  // that work on the device's queues needs).
  void ReleasePool(c10::DeviceIndex device, uint64_t pool);
  // Starts or ends routing `stream`'s allocations to `pool` (retained).
  // Thread-safety: any thread.
  void BeginCapture(c10::DeviceIndex device, c10::StreamId stream, uint64_t pool);
  // Thread-safety: any thread.
  void EndCapture(c10::DeviceIndex device, c10::StreamId stream);

 private:
  TernDeviceAllocator() = default;
};

}  // namespace torch_tern
