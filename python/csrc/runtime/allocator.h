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

#include <cstdint>
#include <optional>

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
  std::optional<c10::DeviceIndex> FindDevice(const void* ptr) const;

  // The size class a request of `nbytes` is rounded to.
  static size_t RoundSize(size_t nbytes);

 private:
  TernDeviceAllocator() = default;
};

}  // namespace torch_tern
