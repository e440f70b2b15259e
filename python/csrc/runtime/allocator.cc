#include "runtime/allocator.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/capture.h"
#include "runtime/runtime.h"

namespace torch_tern {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB: small pool up to here

struct Block {
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;  // the stream it was allocated on
  size_t size = 0;           // size class (what tern allocated)
  size_t requested = 0;
  tern_buffer_t buffer = nullptr;
  uintptr_t address = 0;
  std::vector<c10::Stream> used_on;  // other streams (record_stream)
  uint64_t pool = 0;                 // graph pool that allocated it; 0: none
};

// A graph pool (see allocator.h).
struct GraphPool {
  int uses = 0;
  std::map<size_t, std::vector<Block*>> free;  // by size class
  std::vector<Block*> deferred;                // freed during a capture
};

struct PendingFree {
  Block* block;
  std::vector<tern_event_t> events;
};

struct DeviceCache {
  std::map<uintptr_t, Block*> live;  // allocated blocks by address
  std::map<std::pair<c10::StreamId, size_t>, std::vector<Block*>> free;
  std::vector<PendingFree> pending;
  DeviceStats stats;
  std::map<uint64_t, GraphPool> pools;
  std::map<c10::StreamId, uint64_t> capturing;  // capturing stream -> its pool
  double fraction = 1.0;                        // set_per_process_memory_fraction
  uint64_t reserve_cap = 0;                     // fraction x capacity in bytes; 0: no cap
};

std::mutex g_mutex;
std::vector<DeviceCache> g_caches;  // one per device, sized on first use

DeviceCache& Cache(c10::DeviceIndex device) {
  if (g_caches.empty()) g_caches.resize(std::max<c10::DeviceIndex>(DeviceCount(), 1));
  TORCH_CHECK(device >= 0 && static_cast<size_t>(device) < g_caches.size(),
              "tern allocator: bad device index ", static_cast<int>(device));
  return g_caches[device];
}

void Update(c10::CachingAllocator::StatArray& stat, size_t block_size, int64_t amount) {
  const auto pool = block_size <= kSmallLimit ? StatType::SMALL_POOL : StatType::LARGE_POOL;
  for (auto type : {StatType::AGGREGATE, pool}) {
    auto& s = stat[static_cast<size_t>(type)];
    if (amount >= 0) {
      s.increase(static_cast<size_t>(amount));
    } else {
      s.decrease(static_cast<size_t>(-amount));
    }
  }
}

void OnLive(DeviceCache& cache, Block* block, bool add) {
  const int64_t sign = add ? 1 : -1;
  Update(cache.stats.allocation, block->size, sign);
  Update(cache.stats.active, block->size, sign);
  Update(cache.stats.allocated_bytes, block->size, sign * static_cast<int64_t>(block->size));
  Update(cache.stats.active_bytes, block->size, sign * static_cast<int64_t>(block->size));
  Update(cache.stats.requested_bytes, block->size, sign * static_cast<int64_t>(block->requested));
}

void OnSegment(DeviceCache& cache, Block* block, bool add) {
  const int64_t sign = add ? 1 : -1;
  Update(cache.stats.segment, block->size, sign);
  Update(cache.stats.reserved_bytes, block->size, sign * static_cast<int64_t>(block->size));
  if (add) {
    ++cache.stats.num_device_alloc;
  } else {
    ++cache.stats.num_device_free;
  }
}

void DestroyEvents(std::vector<tern_event_t>& events) {
  for (tern_event_t event : events) tern_event_destroy(event);
  events.clear();
}

// Moves blocks whose record_stream events completed back to the free lists.
void ProcessPending(DeviceCache& cache, bool wait) {
  auto it = cache.pending.begin();
  while (it != cache.pending.end()) {
    bool done = true;
    for (tern_event_t event : it->events) {
      const tern_status_t status =
          wait ? tern_event_synchronize(event, TERN_TIMEOUT_INFINITE) : tern_event_query(event);
      // A failed queue is reported on that stream; the memory is free anyway.
      if (status == TERN_ERROR_NOT_READY || status == TERN_ERROR_TIMEOUT) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++it;
      continue;
    }
    DestroyEvents(it->events);
    Block* block = it->block;
    block->used_on.clear();
    cache.free[{block->stream, block->size}].push_back(block);
    it = cache.pending.erase(it);
  }
}

// Returns every cached block of `device` to tern. Waits for the device first:
// tern requires that no submitted command still uses a freed buffer.
void ReleaseCached(c10::DeviceIndex device, DeviceCache& cache) {
  SynchronizeDeviceQuietly(device);
  ProcessPending(cache, /*wait=*/true);
  for (auto& [key, blocks] : cache.free) {
    for (Block* block : blocks) {
      tern_buffer_free(block->buffer);
      OnSegment(cache, block, false);
      delete block;
    }
  }
  cache.free.clear();
}

void FreeBlock(Block* block) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceCache& cache = Cache(block->device);
  cache.live.erase(block->address);
  OnLive(cache, block, false);
  if (!cache.capturing.empty() && (block->pool == 0 || !block->used_on.empty())) {
    // Freed while a stream of the device captures: the recording may name
    // it (its address is baked into the graph), so nobody gets it until the
    // pool of a capture in progress is released.
    auto own = cache.pools.find(block->pool);
    GraphPool& pool =
        own != cache.pools.end() ? own->second : cache.pools[cache.capturing.begin()->second];
    block->used_on.clear();
    pool.deferred.push_back(block);
    return;
  }
  if (block->pool != 0) {
    auto own = cache.pools.find(block->pool);
    if (own != cache.pools.end()) {
      if (block->used_on.empty()) {
        own->second.free[block->size].push_back(block);
      } else {
        block->used_on.clear();
        own->second.deferred.push_back(block);  // kept simple: no events
      }
      return;
    }
    block->pool = 0;  // the pool was released: an ordinary block again
  }
  if (block->used_on.empty()) {
    cache.free[{block->stream, block->size}].push_back(block);
    return;
  }
  PendingFree pending{block, {}};
  for (const c10::Stream& stream : block->used_on) {
    tern_event_t event = nullptr;
    if (tern_event_create(&event) != TERN_OK) continue;
    try {
      if (tern_queue_record_event(GetQueue(stream), event, nullptr) == TERN_OK) {
        pending.events.push_back(event);
        continue;
      }
    } catch (const std::exception&) {
    }
    tern_event_destroy(event);
  }
  cache.pending.push_back(std::move(pending));
}

void Deleter(void* ctx) {
  if (ctx == nullptr) return;
  try {
    FreeBlock(static_cast<Block*>(ctx));
  } catch (const std::exception& e) {
    LOG(WARNING) << "torch_tern: freeing device memory failed: " << e.what();
  }
}

std::string FormatBytes(size_t bytes) {
  char text[64];
  if (bytes >= (size_t{1} << 30)) {
    snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (size_t{1} << 20)) {
    snprintf(text, sizeof(text), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    snprintf(text, sizeof(text), "%.2f KiB", static_cast<double>(bytes) / 1024);
  } else {
    snprintf(text, sizeof(text), "%zu bytes", bytes);
  }
  return text;
}

size_t Reserved(const DeviceCache& cache) {
  return cache.stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
}

// Keeps a new segment of `size` bytes within the per-process cap: releases
// the cached blocks when that makes room, raises OutOfMemoryError otherwise.
void EnforceReserveCap(c10::DeviceIndex device, DeviceCache& cache, size_t nbytes, size_t size) {
  if (Reserved(cache) + size <= cache.reserve_cap) return;
  if (!cache.free.empty() || !cache.pending.empty()) {
    ++cache.stats.num_alloc_retries;
    ReleaseCached(device, cache);
    if (Reserved(cache) + size <= cache.reserve_cap) return;
  }
  ++cache.stats.num_ooms;
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "tern out of memory on device tern:", static_cast<int>(device),
      ": tried to allocate ", FormatBytes(nbytes), " (rounded to ", FormatBytes(size),
      "), and this process may reserve only ", FormatBytes(cache.reserve_cap),
      " (torch.tern.set_per_process_memory_fraction(", cache.fraction,
      ")), of which live tensors hold ",
      FormatBytes(cache.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current),
      "; free tensors or raise the fraction");
}

}  // namespace

TernDeviceAllocator& TernDeviceAllocator::Get() {
  static TernDeviceAllocator* allocator = new TernDeviceAllocator();
  return *allocator;
}

size_t TernDeviceAllocator::RoundSize(size_t nbytes) {
  if (nbytes <= kSmallLimit) {
    return std::max(kMinBlock, (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock);
  }
  const size_t power = std::bit_floor(nbytes);
  const size_t step = power / 4;
  return (nbytes + step - 1) / step * step;
}

c10::DataPtr TernDeviceAllocator::allocate(size_t nbytes) {
  EnsureInitialized();
  const c10::DeviceIndex device = CurrentDevice();
  const c10::Device torch_device(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) return c10::DataPtr(nullptr, nullptr, &Deleter, torch_device);
  const size_t size = RoundSize(nbytes);
  const c10::StreamId stream = GetCurrentStream(device).id();

  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceCache& cache = Cache(device);
  if (!cache.pending.empty()) ProcessPending(cache, /*wait=*/false);
  Block* block = nullptr;
  uint64_t pool = 0;
  if (!cache.capturing.empty()) {
    auto capture = cache.capturing.find(stream);
    if (capture != cache.capturing.end()) pool = capture->second;
  }
  std::vector<Block*>* reuse = nullptr;
  if (pool != 0) {
    auto& pool_free = cache.pools[pool].free;
    auto it = pool_free.find(size);
    if (it != pool_free.end()) reuse = &it->second;
  } else {
    auto it = cache.free.find({stream, size});
    if (it != cache.free.end()) reuse = &it->second;
  }
  if (reuse != nullptr && !reuse->empty()) {
    block = reuse->back();
    reuse->pop_back();
  } else {
    if (cache.reserve_cap != 0) EnforceReserveCap(device, cache, nbytes, size);
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    tern_status_t status = tern_buffer_alloc(GetTernDevice(device), &params, &buffer);
    if (status == TERN_ERROR_OUT_OF_MEMORY && !cache.free.empty()) {
      ++cache.stats.num_alloc_retries;
      ReleaseCached(device, cache);
      status = tern_buffer_alloc(GetTernDevice(device), &params, &buffer);
    }
    if (status != TERN_OK) {
      const std::string detail = DescribeLastError(status);
      if (status == TERN_ERROR_OUT_OF_MEMORY) {
        ++cache.stats.num_ooms;
        const auto& s = cache.stats;
        TORCH_CHECK_WITH(
            OutOfMemoryError, false, "tern out of memory on device tern:", static_cast<int>(device),
            ": tried to allocate ", FormatBytes(nbytes), " (rounded to ", FormatBytes(size),
            "); PyTorch holds ",
            FormatBytes(s.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current),
            " allocated and ",
            FormatBytes(s.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current),
            " reserved by the caching allocator (torch.tern.empty_cache() releases the "
            "difference). tern reports: ",
            detail);
      }
      TORCH_CHECK(false, "tern: allocating ", FormatBytes(size),
                  " on tern:", static_cast<int>(device), " failed: ", detail);
    }
    tern_buffer_info_t info{};
    info.struct_size = sizeof(info);
    status = tern_buffer_get_info(buffer, &info);
    if (status != TERN_OK) {
      const std::string detail = DescribeLastError(status);
      tern_buffer_free(buffer);
      TORCH_CHECK(false, "tern: tern_buffer_get_info failed: ", detail);
    }
    block = new Block();
    block->device = device;
    block->stream = stream;
    block->size = size;
    block->buffer = buffer;
    block->address = static_cast<uintptr_t>(info.device_address);
    block->pool = pool;
    OnSegment(cache, block, true);
  }
  block->requested = nbytes;
  cache.live[block->address] = block;
  OnLive(cache, block, true);
  void* data = reinterpret_cast<void*>(block->address);
  return c10::DataPtr(data, block, &Deleter, torch_device);
}

c10::DeleterFnPtr TernDeviceAllocator::raw_deleter() const { return &Deleter; }

void TernDeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count == 0) return;
  const DeviceLocation dst = Resolve(dest);
  const DeviceLocation from = Resolve(src);
  TORCH_CHECK(dst.available >= count && from.available >= count, "tern copy_data out of range");
  tern_queue_t queue = CurrentQueue(dst.device);
  RefuseIfCapturing(queue, "Allocator::copy_data (a synchronous device copy)");
  uint64_t sequence = 0;
  TERN_CHECK(tern_queue_copy_d2d(queue, dst.buffer, dst.offset, from.buffer, from.offset, count,
                                 &sequence));
  WaitQueue(queue, sequence);
}

bool TernDeviceAllocator::initialized() { return IsInitialized(); }

void TernDeviceAllocator::emptyCache(c10::MempoolId_t) {
  if (!IsInitialized()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t device = 0; device < g_caches.size(); ++device) {
    ReleaseCached(static_cast<c10::DeviceIndex>(device), g_caches[device]);
  }
}

void TernDeviceAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get_deleter() != &Deleter || ptr.get_context() == nullptr) return;
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream: expected a tern stream, got ", stream);
  auto* block = static_cast<Block*>(ptr.get_context());
  std::lock_guard<std::mutex> lock(g_mutex);
  if (stream.device_index() == block->device && stream.id() == block->stream) return;
  if (std::find(block->used_on.begin(), block->used_on.end(), stream) == block->used_on.end()) {
    block->used_on.push_back(stream);
  }
}

namespace {

// Returns `fn(stats)` for `device`'s statistics (the current device when
// negative), called under the allocator's lock; before tern is initialized
// there are none, and it returns what `fn` returns, default-constructed.
template <typename Fn>
auto WithStats(c10::DeviceIndex device, Fn fn) {
  using Result = decltype(fn(std::declval<DeviceStats&>()));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!IsInitialized()) return Result();
  if (device < 0) device = CurrentDevice();
  return fn(Cache(device).stats);
}

// Calls `fn` on every Stat of `s` (each array: all, small pool, large pool).
template <typename Fn>
void ForEachStat(DeviceStats& s, Fn fn) {
  for (auto* array :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) fn(stat);
  }
}

}  // namespace

DeviceStats TernDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  return WithStats(device, [](DeviceStats& s) { return s; });
}

void TernDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  WithStats(device, [](DeviceStats& s) {
    ForEachStat(s, [](auto& stat) { stat.reset_accumulated(); });
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  });
}

void TernDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  WithStats(device, [](DeviceStats& s) { ForEachStat(s, [](auto& stat) { stat.reset_peak(); }); });
}

std::pair<size_t, size_t> TernDeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  EnsureInitialized();
  if (device < 0) device = CurrentDevice();
  tern_memory_stats_t stats{};
  stats.struct_size = sizeof(stats);
  TERN_CHECK(tern_device_memory_stats(GetTernDevice(device), &stats));
  return {stats.free_bytes, stats.capacity_bytes};
}

DeviceLocation TernDeviceAllocator::Resolve(const void* ptr, c10::DeviceIndex device) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t d = 0; d < g_caches.size(); ++d) {
    if (device >= 0 && static_cast<size_t>(device) != d) continue;
    const auto& live = g_caches[d].live;
    auto it = live.upper_bound(address);
    if (it == live.begin()) continue;
    --it;
    const Block* block = it->second;
    if (address <= block->address + block->size) {
      DeviceLocation location;
      location.buffer = block->buffer;
      location.offset = address - block->address;
      location.available = block->size - location.offset;
      location.device = static_cast<c10::DeviceIndex>(d);
      return location;
    }
  }
  TORCH_CHECK(false, "torch_tern: pointer ", ptr,
              " is not in tern device memory allocated by this process");
}

DeviceLocation TernDeviceAllocator::Resolve(const c10::Storage& storage, const void* ptr,
                                            c10::DeviceIndex device) const {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() == &Deleter && data.get_context() != nullptr) {
    const auto* block = static_cast<const Block*>(data.get_context());
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    if ((device < 0 || block->device == device) && address >= block->address &&
        address <= block->address + block->size) {
      DeviceLocation location;
      location.buffer = block->buffer;
      location.offset = address - block->address;
      location.available = block->size - location.offset;
      location.device = block->device;
      return location;
    }
  }
  return Resolve(ptr, device);
}

std::optional<c10::DeviceIndex> TernDeviceAllocator::FindDevice(const void* ptr) const {
  try {
    return Resolve(ptr).device;
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

void TernDeviceAllocator::SetMemoryFraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK(fraction > 0.0 && fraction <= 1.0,
              "set_per_process_memory_fraction: the fraction must be in (0, 1], got ", fraction);
  EnsureInitialized();
  if (device < 0) device = CurrentDevice();
  tern_memory_stats_t stats{};
  stats.struct_size = sizeof(stats);
  TERN_CHECK(tern_device_memory_stats(GetTernDevice(device), &stats));
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceCache& cache = Cache(device);
  cache.fraction = fraction;
  cache.reserve_cap =
      fraction >= 1.0 ? 0
                      : static_cast<uint64_t>(static_cast<double>(stats.capacity_bytes) * fraction);
}

double TernDeviceAllocator::GetMemoryFraction(c10::DeviceIndex device) {
  EnsureInitialized();
  if (device < 0) device = CurrentDevice();
  std::lock_guard<std::mutex> lock(g_mutex);
  return Cache(device).fraction;
}

std::vector<TernDeviceAllocator::BlockSnapshot> TernDeviceAllocator::Snapshot() {
  std::vector<BlockSnapshot> out;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t d = 0; d < g_caches.size(); ++d) {
    const DeviceCache& cache = g_caches[d];
    auto add = [&](const Block& block, const char* state) {
      BlockSnapshot snap;
      snap.device = static_cast<c10::DeviceIndex>(d);
      snap.address = block.address;
      snap.size = block.size;
      snap.requested = state[0] == 'a' ? block.requested : 0;
      snap.stream = block.stream;
      snap.state = state;
      out.push_back(snap);
    };
    for (const auto& [address, block] : cache.live) add(*block, "active_allocated");
    for (const auto& [key, blocks] : cache.free) {
      for (const Block* block : blocks) add(*block, "inactive");
    }
    for (const PendingFree& pending : cache.pending) add(*pending.block, "pending_free");
    for (const auto& [id, pool] : cache.pools) {
      for (const auto& [size, blocks] : pool.free) {
        for (const Block* block : blocks) add(*block, "graph_pool_inactive");
      }
      for (const Block* block : pool.deferred) add(*block, "graph_pool_deferred");
    }
  }
  std::sort(out.begin(), out.end(), [](const BlockSnapshot& a, const BlockSnapshot& b) {
    return a.device != b.device ? a.device < b.device : a.address < b.address;
  });
  return out;
}

void TernDeviceAllocator::RetainPool(c10::DeviceIndex device, uint64_t pool) {
  TORCH_CHECK(pool != 0, "tern graph pool 0 is not a pool");
  std::lock_guard<std::mutex> lock(g_mutex);
  ++Cache(device).pools[pool].uses;
}

void TernDeviceAllocator::ReleasePool(c10::DeviceIndex device, uint64_t pool) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceCache& cache = Cache(device);
  auto it = cache.pools.find(pool);
  if (it == cache.pools.end() || --it->second.uses > 0) return;
  for (const auto& [stream, capturing_pool] : cache.capturing) {
    if (capturing_pool == pool) return;  // a capture still uses it (EndCapture first)
  }
  // Replays of the pool's graphs and any work on its deferred blocks must be
  // over before anyone else may get them.
  SynchronizeDeviceQuietly(device);
  auto give_back = [&](Block* block) {
    block->pool = 0;
    block->used_on.clear();
    cache.free[{block->stream, block->size}].push_back(block);
  };
  for (auto& [size, blocks] : it->second.free) {
    for (Block* block : blocks) give_back(block);
  }
  for (Block* block : it->second.deferred) give_back(block);
  cache.pools.erase(it);
}

void TernDeviceAllocator::BeginCapture(c10::DeviceIndex device, c10::StreamId stream,
                                       uint64_t pool) {
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceCache& cache = Cache(device);
  TORCH_CHECK(cache.capturing.count(stream) == 0, "tern stream ", stream, " is already capturing");
  cache.capturing[stream] = pool;
}

void TernDeviceAllocator::EndCapture(c10::DeviceIndex device, c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(g_mutex);
  Cache(device).capturing.erase(stream);
}

// The allocator torch uses for every tern tensor (and torch.accelerator's
// memory statistics, through c10::DeviceAllocator).
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &TernDeviceAllocator::Get())

}  // namespace torch_tern
