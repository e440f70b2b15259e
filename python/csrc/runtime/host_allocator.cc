#include "runtime/host_allocator.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/runtime.h"

namespace torch_tern {
namespace {

constexpr size_t kMinHostBlock = 4096;

struct HostBlock {
  void* ptr = nullptr;
  size_t size = 0;
  bool allocated = false;
  std::vector<tern_event_t> events;  // copies still reading or writing it
};

std::mutex g_host_mutex;
std::map<uintptr_t, HostBlock*> g_blocks;          // every block, by address
std::map<size_t, std::vector<HostBlock*>> g_free;  // reusable, by size
std::vector<HostBlock*> g_pending;                 // freed, events outstanding
at::HostStats g_stats;

bool EventsDone(HostBlock* block, bool wait) {
  while (!block->events.empty()) {
    tern_event_t event = block->events.back();
    const tern_status_t status =
        wait ? tern_event_synchronize(event, TERN_TIMEOUT_INFINITE) : tern_event_query(event);
    if (status == TERN_ERROR_NOT_READY || status == TERN_ERROR_TIMEOUT) return false;
    tern_event_destroy(event);
    block->events.pop_back();
  }
  return true;
}

void ProcessPending(bool wait) {
  auto it = g_pending.begin();
  while (it != g_pending.end()) {
    if (EventsDone(*it, wait)) {
      g_free[(*it)->size].push_back(*it);
      it = g_pending.erase(it);
    } else {
      ++it;
    }
  }
}

// Returns every cached (free) block to tern. Callers hold g_host_mutex.
void ReleaseFreeLocked() {
  for (auto& [size, blocks] : g_free) {
    for (HostBlock* block : blocks) {
      tern_host_free(block->ptr);
      g_blocks.erase(reinterpret_cast<uintptr_t>(block->ptr));
      g_stats.allocations.decrease(1);
      g_stats.allocated_bytes.decrease(block->size);
      ++g_stats.num_host_free;
      delete block;
    }
  }
  g_free.clear();
}

void HostDeleter(void* ctx) {
  if (ctx == nullptr) return;
  auto* block = static_cast<HostBlock*>(ctx);
  std::lock_guard<std::mutex> lock(g_host_mutex);
  block->allocated = false;
  g_stats.active_requests.decrease(1);
  g_stats.active_bytes.decrease(block->size);
  if (block->events.empty()) {
    g_free[block->size].push_back(block);
  } else {
    g_pending.push_back(block);
  }
}

}  // namespace

TernHostAllocator& TernHostAllocator::Get() {
  static TernHostAllocator* allocator = new TernHostAllocator();
  return *allocator;
}

at::DataPtr TernHostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return at::DataPtr(nullptr, nullptr, &HostDeleter, at::Device(at::kCPU));
  EnsureInitialized();
  const size_t size = std::max(kMinHostBlock, std::bit_ceil(nbytes));
  std::lock_guard<std::mutex> lock(g_host_mutex);
  if (!g_pending.empty()) ProcessPending(false);
  HostBlock* block = nullptr;
  auto it = g_free.find(size);
  if (it != g_free.end() && !it->second.empty()) {
    block = it->second.back();
    it->second.pop_back();
  } else {
    void* ptr = nullptr;
    tern_status_t status = tern_host_alloc(size, &ptr);
    if (status == TERN_ERROR_HOST_OUT_OF_MEMORY && !g_free.empty()) {
      ReleaseFreeLocked();
      status = tern_host_alloc(size, &ptr);
    }
    if (status != TERN_OK) {
      const std::string detail = DescribeLastError(status);
      TORCH_CHECK(false, "tern: cannot allocate ", size, " bytes of pinned host memory: ", detail);
    }
    block = new HostBlock();
    block->ptr = ptr;
    block->size = size;
    g_blocks[reinterpret_cast<uintptr_t>(ptr)] = block;
    g_stats.allocations.increase(1);
    g_stats.allocated_bytes.increase(size);
    ++g_stats.num_host_alloc;
  }
  block->allocated = true;
  g_stats.active_requests.increase(1);
  g_stats.active_bytes.increase(size);
  return at::DataPtr(block->ptr, block, &HostDeleter, at::Device(at::kCPU));
}

c10::DeleterFnPtr TernHostAllocator::raw_deleter() const { return &HostDeleter; }

void TernHostAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool TernHostAllocator::record_event(void* ptr, void* ctx, c10::Stream stream) {
  if (ctx == nullptr) return false;
  auto* block = static_cast<HostBlock*>(ctx);
  tern_event_t event = nullptr;
  TERN_CHECK(tern_event_create(&event));
  const tern_status_t status = tern_queue_record_event(GetQueue(stream), event, nullptr);
  if (status != TERN_OK) {
    tern_event_destroy(event);
    TERN_CHECK(status);
  }
  std::lock_guard<std::mutex> lock(g_host_mutex);
  block->events.push_back(event);
  return true;
}

void TernHostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(g_host_mutex);
  ProcessPending(true);
  ReleaseFreeLocked();
}

at::HostStats TernHostAllocator::get_stats() {
  std::lock_guard<std::mutex> lock(g_host_mutex);
  return g_stats;
}

void TernHostAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(g_host_mutex);
  for (auto* stat : {&g_stats.active_requests, &g_stats.active_bytes, &g_stats.allocations,
                     &g_stats.allocated_bytes}) {
    stat->reset_accumulated();
  }
  g_stats.num_host_alloc = 0;
  g_stats.num_host_free = 0;
}

void TernHostAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(g_host_mutex);
  for (auto* stat : {&g_stats.active_requests, &g_stats.active_bytes, &g_stats.allocations,
                     &g_stats.allocated_bytes}) {
    stat->reset_peak();
  }
}

bool TernHostAllocator::IsPinned(const void* ptr) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_host_mutex);
  auto it = g_blocks.upper_bound(address);
  if (it == g_blocks.begin()) return false;
  --it;
  return it->second->allocated && address < it->first + it->second->size;
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &TernHostAllocator::Get())

}  // namespace torch_tern
