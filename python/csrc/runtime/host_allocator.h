// Pinned host memory (tensor.pin_memory(), torch.empty(..., pin_memory=True))
// from tern_host_alloc, cached: blocks are rounded to a power of two (at least
// a page) and reused; a block that a non-blocking copy still reads
// (record_event) is reused only after that copy's event completed.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torch_tern {

class TernHostAllocator final : public at::HostAllocator {
 public:
  static TernHostAllocator& Get();

  at::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override;
  void empty_cache() override;
  at::HostStats get_stats() override;
  void reset_accumulated_stats() override;
  void reset_peak_stats() override;

  // True if `ptr` points into a live pinned block of this allocator.
  bool IsPinned(const void* ptr) const;

 private:
  TernHostAllocator() = default;
};

}  // namespace torch_tern
