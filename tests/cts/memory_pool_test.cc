// CTS: memory pools and stream-ordered allocation (tern/memory_pool.h):
// reuse in queue order, no early handoff to another queue, release
// threshold, accounting, out-of-memory, destroy, and concurrent use.
#include <random>
#include <thread>

#include "cts_fixture.h"
#include "cts_negative_util.h"

namespace tern::cts {
namespace {

constexpr auto kEnterTimeout = std::chrono::milliseconds(10000);
constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

class MemoryPoolTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    core_ = OpenCore(0, 0);
    ASSERT_NE(nullptr, core_);
    queue_ = CreateQueue(core_, "cts-pool-a");
    other_ = CreateQueue(core_, "cts-pool-b");
    ASSERT_TRUE(queue_ && other_);
  }

  tern_memory_pool_t CreatePool(uint64_t release_threshold,
                                tern_memory_category_t category = TERN_MEMORY_TENSORS,
                                uint32_t device_index = 0) {
    tern_memory_pool_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.struct_size = sizeof(params);
    params.release_threshold = release_threshold;
    params.category = category;
    tern_memory_pool_t pool = nullptr;
    CTS_EXPECT_OK(tern_memory_pool_create(device(device_index), &params, &pool));
    return pool;
  }

  tern_memory_pool_stats_t Stats(tern_memory_pool_t pool) {
    tern_memory_pool_stats_t stats;
    std::memset(&stats, 0, sizeof(stats));
    stats.struct_size = sizeof(stats);
    CTS_EXPECT_OK(tern_memory_pool_get_stats(pool, &stats));
    return stats;
  }

  tern_buffer_t QueueAlloc(tern_queue_t queue, uint64_t size, tern_memory_pool_t pool) {
    tern_buffer_t buffer = nullptr;
    CTS_EXPECT_OK(tern_queue_alloc(queue, size, pool, &buffer));
    return buffer;
  }

  uint64_t Address(tern_buffer_t buffer) { return BufferInfo(buffer).device_address; }

  // Blocks `queue` in a host callback until the returned gate opens.
  Gate* Block(tern_queue_t queue) {
    Gate* gate = NewGate();
    CTS_EXPECT_OK(tern_queue_host_callback(queue, Gate::Callback, gate, nullptr));
    EXPECT_TRUE(gate->WaitEntered(kEnterTimeout));
    return gate;
  }

  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  tern_queue_t other_ = nullptr;
};

TEST_P(MemoryPoolTest, DefaultPoolPerDevice) {
  std::vector<tern_memory_pool_t> pools;
  for (uint32_t d = 0; d < device_count(); ++d) {
    tern_memory_pool_t pool = nullptr;
    CTS_ASSERT_OK(tern_device_default_memory_pool(device(d), &pool));
    ASSERT_NE(nullptr, pool);
    tern_memory_pool_t again = nullptr;
    CTS_ASSERT_OK(tern_device_default_memory_pool(device(d), &again));
    EXPECT_EQ(pool, again);
    for (tern_memory_pool_t other : pools) EXPECT_NE(other, pool);
    pools.push_back(pool);
    uint64_t value = 99;
    CTS_EXPECT_OK(
        tern_memory_pool_get_attribute(pool, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, &value));
    EXPECT_EQ(0u, value);
    CTS_EXPECT_OK(tern_memory_pool_get_attribute(pool, TERN_MEMORY_POOL_ATTR_CATEGORY, &value));
    EXPECT_EQ(static_cast<uint64_t>(TERN_MEMORY_TENSORS), value);
    CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_memory_pool_destroy(pool), "default");
  }
  // NULL in tern_queue_alloc is the queue's device's default pool.
  tern_buffer_t buffer = QueueAlloc(queue_, 1000, nullptr);
  ASSERT_NE(nullptr, buffer);
  const tern_memory_pool_stats_t stats = Stats(pools[0]);
  EXPECT_EQ(1u, stats.allocation_count);
  EXPECT_EQ(1000u, stats.requested_bytes);
  CTS_EXPECT_OK(tern_queue_free(queue_, buffer));
  EXPECT_EQ(0u, Stats(pools[0]).allocation_count);
}

TEST_P(MemoryPoolTest, AllocUseFreeInQueueOrder) {
  constexpr uint64_t kSize = 100000;
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  tern_buffer_t buffer = QueueAlloc(queue_, kSize, pool);
  ASSERT_NE(nullptr, buffer);
  const tern_buffer_info_t info = BufferInfo(buffer);
  EXPECT_EQ(kSize, info.size);
  EXPECT_EQ(device(0), info.device);
  EXPECT_EQ(TERN_MEMORY_TENSORS, info.category);
  EXPECT_EQ(0u, info.device_address % 64);
  auto* input = Make<std::vector<uint8_t>>(Pattern(kSize, 1));
  auto* output = HostBytes(kSize);
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, buffer, 0, input->data(), kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, output->data(), buffer, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_free(queue_, buffer));
  // The handle is dead at once; the commands before the free still run.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_fill(queue_, buffer, 0, 4, 0, nullptr),
                   "buffer");
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_TRUE(*input == *output);
  const tern_memory_pool_stats_t stats = Stats(pool);
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(0u, stats.used_bytes);
  EXPECT_EQ(1u, stats.allocations);
  EXPECT_EQ(1u, stats.device_allocations);
  EXPECT_GE(stats.cached_bytes, kSize);
  EXPECT_EQ(stats.cached_bytes, stats.reserved_bytes);
  EXPECT_EQ(0u, stats.pending_bytes);
  CTS_EXPECT_OK(tern_memory_pool_destroy(pool));
}

TEST_P(MemoryPoolTest, SizeClasses) {
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  // At least 512 bytes, then four classes per power of two.
  const std::pair<uint64_t, uint64_t> kClasses[] = {{1, 512},          {512, 512},   {513, 1024},
                                                    {4096, 4096},      {4097, 5120}, {5121, 6144},
                                                    {1000000, 1 << 20}};
  uint64_t used = 0, requested = 0;
  std::vector<tern_buffer_t> buffers;
  for (const auto& [size, block] : kClasses) {
    SCOPED_TRACE(size);
    buffers.push_back(QueueAlloc(queue_, size, pool));
    used += block;
    requested += size;
    const tern_memory_pool_stats_t stats = Stats(pool);
    EXPECT_EQ(used, stats.used_bytes);
    EXPECT_EQ(requested, stats.requested_bytes);
    EXPECT_LE(stats.used_bytes, requested + requested / 4 + 512 * buffers.size());
  }
  for (tern_buffer_t buffer : buffers) CTS_EXPECT_OK(tern_queue_free(queue_, buffer));
  // A freed 5000-byte block (class 5120) serves 4500 bytes, not 6000.
  tern_buffer_t a = QueueAlloc(queue_, 5000, pool);
  const uint64_t address = Address(a);
  CTS_ASSERT_OK(tern_queue_free(queue_, a));
  tern_buffer_t b = QueueAlloc(queue_, 6000, pool);
  EXPECT_NE(address, Address(b));
  tern_buffer_t c = QueueAlloc(queue_, 4500, pool);
  EXPECT_EQ(address, Address(c));
  CTS_EXPECT_OK(tern_queue_free(queue_, b));
  CTS_EXPECT_OK(tern_queue_free(queue_, c));
}

TEST_P(MemoryPoolTest, SameQueueReusesAFreedBlockAtOnce) {
  constexpr uint64_t kSize = 64 * kKiB;
  tern_memory_pool_t pool = CreatePool(0);
  Gate* gate = Block(queue_);
  // Nothing below runs until the gate opens: the first owner's commands are
  // still pending when the block is handed out again on the same queue.
  tern_buffer_t first = QueueAlloc(queue_, kSize, pool);
  ASSERT_NE(nullptr, first);
  const uint64_t address = Address(first);
  auto* first_out = HostBytes(kSize);
  CTS_ASSERT_OK(tern_queue_fill(queue_, first, 0, kSize, 0x11111111u, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, first_out->data(), first, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_free(queue_, first));
  EXPECT_EQ(kSize, Stats(pool).pending_bytes);
  tern_buffer_t second = QueueAlloc(queue_, kSize, pool);
  ASSERT_NE(nullptr, second);
  EXPECT_EQ(address, Address(second)) << "the same queue did not reuse its freed block";
  auto* second_out = HostBytes(kSize);
  CTS_ASSERT_OK(tern_queue_fill(queue_, second, 0, kSize, 0x22222222u, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, second_out->data(), second, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_free(queue_, second));
  const tern_memory_pool_stats_t stats = Stats(pool);
  EXPECT_EQ(1u, stats.reused_same_queue);
  EXPECT_EQ(1u, stats.device_allocations);
  gate->Open();
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_TRUE(*first_out == std::vector<uint8_t>(kSize, 0x11));
  EXPECT_TRUE(*second_out == std::vector<uint8_t>(kSize, 0x22));
}

struct Sleeper {
  std::chrono::milliseconds duration;
  std::atomic<bool> done{false};
  static void Callback(void* user_data, tern_status_t) {
    auto* self = static_cast<Sleeper*>(user_data);
    std::this_thread::sleep_for(self->duration);
    self->done.store(true);
  }
};

TEST_P(MemoryPoolTest, AnotherQueueNeverGetsABlockBeforeTheFreeIsReached) {
  constexpr uint64_t kSize = 256 * kKiB;
  constexpr int kMaxTaken = 200;  // 50 MiB: a slow machine may keep queue A asleep long
  tern_core_t core1 = OpenCore(0, 1);
  tern_queue_t queues[] = {other_, CreateQueue(core1, "cts-pool-core1")};
  ASSERT_NE(nullptr, queues[1]);
  for (tern_queue_t thief : queues) {
    // A fresh pool: queue A's block is the only one it will cache.
    tern_memory_pool_t pool = CreatePool(UINT64_MAX);
    // Queue A sleeps in a host callback, then writes its block and frees it.
    auto* sleeper = Make<Sleeper>();
    sleeper->duration = std::chrono::milliseconds(150);
    CTS_ASSERT_OK(tern_queue_host_callback(queue_, Sleeper::Callback, sleeper, nullptr));
    tern_buffer_t block = QueueAlloc(queue_, kSize, pool);
    ASSERT_NE(nullptr, block);
    const uint64_t address = Address(block);
    auto* out = HostBytes(kSize);
    CTS_ASSERT_OK(tern_queue_fill(queue_, block, 0, kSize, 0xa5a5a5a5u, nullptr));
    CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, out->data(), block, 0, kSize, nullptr));
    uint64_t free_point = 0;
    CTS_ASSERT_OK(tern_queue_nop(queue_, &free_point));
    CTS_ASSERT_OK(tern_queue_free(queue_, block));
    // The other queue allocates (and overwrites what it gets) while queue A
    // sleeps; it may get A's block only once A is past its free.
    std::vector<tern_buffer_t> taken;
    bool got_it = false;
    auto take = [&] {
      tern_buffer_t buffer = QueueAlloc(thief, kSize, pool);
      if (buffer == nullptr) return;
      taken.push_back(buffer);
      if (Address(buffer) == address) {
        got_it = true;
        uint64_t completed = 0;
        (void)tern_queue_query(queue_, &completed);
        EXPECT_GE(completed, free_point) << "block handed to another queue before the free";
        EXPECT_TRUE(sleeper->done.load());
      }
      CTS_EXPECT_OK(tern_queue_fill(thief, buffer, 0, kSize, 0x5a5a5a5au, nullptr));
    };
    for (int i = 0; i < kMaxTaken && !got_it && !HasFailure(); ++i) {
      take();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!got_it) {
      // Queue A is slow here: once it has passed the free, its block is the
      // pool's only cached one and goes to the next allocation.
      CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
      take();
    }
    EXPECT_TRUE(got_it) << "the block was not reused after queue A reached the free";
    CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
    CTS_EXPECT_OK(tern_queue_synchronize(thief, kLongTimeout));
    EXPECT_TRUE(*out == std::vector<uint8_t>(kSize, 0xa5)) << "queue A's data was overwritten";
    EXPECT_EQ(1u, Stats(pool).reused_other_queue);
    for (tern_buffer_t buffer : taken) CTS_EXPECT_OK(tern_queue_free(thief, buffer));
    CTS_EXPECT_OK(tern_memory_pool_destroy(pool));
  }
}

TEST_P(MemoryPoolTest, PendingBlockGoesToAnotherQueueOnceReached) {
  constexpr uint64_t kSize = 4096;
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  Gate* gate = Block(queue_);
  tern_buffer_t block = QueueAlloc(queue_, kSize, pool);
  const uint64_t address = Address(block);
  CTS_ASSERT_OK(tern_queue_free(queue_, block));
  tern_buffer_t early = QueueAlloc(other_, kSize, pool);
  EXPECT_NE(address, Address(early));
  EXPECT_EQ(kSize, Stats(pool).pending_bytes);  // 4096 is a size class
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(0u, Stats(pool).pending_bytes);
  tern_buffer_t late = QueueAlloc(other_, kSize, pool);
  EXPECT_EQ(address, Address(late));
  EXPECT_EQ(1u, Stats(pool).reused_other_queue);
  CTS_EXPECT_OK(tern_queue_free(other_, early));
  CTS_EXPECT_OK(tern_queue_free(other_, late));
}

TEST_P(MemoryPoolTest, BufferFreeOfAQueueAllocationIsIdleAtOnce) {
  constexpr uint64_t kSize = 8192;
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  tern_buffer_t block = QueueAlloc(queue_, kSize, pool);
  const uint64_t address = Address(block);
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_ASSERT_OK(tern_buffer_free(block));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_free(queue_, block), "buffer");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_free(block), "freed");
  tern_memory_pool_stats_t stats = Stats(pool);
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(kSize, stats.cached_bytes);
  // Any queue may take it, even while the first one is busy.
  Gate* gate = Block(queue_);
  tern_buffer_t again = QueueAlloc(other_, kSize, pool);
  EXPECT_EQ(address, Address(again));
  EXPECT_EQ(1u, Stats(pool).reused_other_queue);
  gate->Open();
  CTS_EXPECT_OK(tern_queue_free(other_, again));
}

TEST_P(MemoryPoolTest, ReleaseThreshold) {
  const tern_memory_stats_t before = MemoryStats(0);
  // Threshold 0: a block freed on an idle queue goes back at once.
  tern_memory_pool_t none = CreatePool(0);
  tern_buffer_t buffer = QueueAlloc(queue_, kMiB, none);
  EXPECT_EQ(before.used_bytes + kMiB, MemoryStats(0).used_bytes);
  CTS_ASSERT_OK(tern_queue_free(queue_, buffer));
  tern_memory_pool_stats_t stats = Stats(none);
  EXPECT_EQ(0u, stats.reserved_bytes);
  EXPECT_EQ(1u, stats.device_releases);
  EXPECT_EQ(kMiB, stats.peak_reserved_bytes);
  EXPECT_EQ(before.used_bytes, MemoryStats(0).used_bytes);

  // Threshold 2 MiB: three idle MiB freed, two kept.
  tern_memory_pool_t some = CreatePool(2 * kMiB);
  std::vector<tern_buffer_t> buffers;
  for (int i = 0; i < 3; ++i) buffers.push_back(QueueAlloc(queue_, kMiB, some));
  for (tern_buffer_t b : buffers) CTS_ASSERT_OK(tern_queue_free(queue_, b));
  stats = Stats(some);
  EXPECT_EQ(2 * kMiB, stats.cached_bytes);
  EXPECT_EQ(2 * kMiB, stats.reserved_bytes);
  EXPECT_EQ(before.used_bytes + 2 * kMiB, MemoryStats(0).used_bytes);
  // Lowering the threshold acts at the pool's next synchronisation point.
  CTS_ASSERT_OK(
      tern_memory_pool_set_attribute(some, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, kMiB / 2));
  uint64_t value = 0;
  CTS_ASSERT_OK(
      tern_memory_pool_get_attribute(some, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, &value));
  EXPECT_EQ(kMiB / 2, value);
  EXPECT_EQ(kMiB / 2, Stats(some).release_threshold);
  EXPECT_EQ(2 * kMiB, Stats(some).cached_bytes);
  tern_buffer_t small = QueueAlloc(queue_, 4096, some);
  EXPECT_EQ(0u, Stats(some).cached_bytes);
  CTS_ASSERT_OK(tern_queue_free(queue_, small));
  EXPECT_EQ(4096u, Stats(some).cached_bytes);
  CTS_ASSERT_OK(tern_memory_pool_trim_to(some, 0));
  EXPECT_EQ(0u, Stats(some).reserved_bytes);
  EXPECT_EQ(before.used_bytes, MemoryStats(0).used_bytes);

  // Pending blocks are kept until their queue reaches the free, whatever
  // the threshold; the next synchronisation point after that returns them.
  Gate* gate = Block(queue_);
  tern_buffer_t pending = QueueAlloc(queue_, kMiB, none);
  CTS_ASSERT_OK(tern_queue_free(queue_, pending));
  CTS_ASSERT_OK(tern_memory_pool_trim_to(none, 0));
  stats = Stats(none);
  EXPECT_EQ(kMiB, stats.pending_bytes);
  EXPECT_EQ(kMiB, stats.reserved_bytes);
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(kMiB, Stats(none).reserved_bytes) << "stats must not change the pool";
  tern_buffer_t other_size = QueueAlloc(other_, 4096, none);
  EXPECT_EQ(4096u, Stats(none).reserved_bytes);
  CTS_ASSERT_OK(tern_queue_free(other_, other_size));
  EXPECT_EQ(0u, Stats(none).reserved_bytes);
  EXPECT_EQ(before.used_bytes, MemoryStats(0).used_bytes);
}

TEST_P(MemoryPoolTest, ReservedMemoryIsChargedToTheDeviceByCategory) {
  const tern_memory_stats_t before = MemoryStats(0);
  tern_memory_pool_t pool = CreatePool(UINT64_MAX, TERN_MEMORY_SCRATCH);
  uint64_t category = 0;
  CTS_ASSERT_OK(tern_memory_pool_get_attribute(pool, TERN_MEMORY_POOL_ATTR_CATEGORY, &category));
  EXPECT_EQ(static_cast<uint64_t>(TERN_MEMORY_SCRATCH), category);
  tern_buffer_t buffer = QueueAlloc(queue_, 3 * kMiB, pool);
  EXPECT_EQ(TERN_MEMORY_SCRATCH, BufferInfo(buffer).category);
  tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(before.used_by_category[TERN_MEMORY_SCRATCH] + 3 * kMiB,
            stats.used_by_category[TERN_MEMORY_SCRATCH]);
  EXPECT_EQ(before.node_used_by_category[TERN_MEMORY_SCRATCH] + 3 * kMiB,
            stats.node_used_by_category[TERN_MEMORY_SCRATCH]);
  EXPECT_EQ(before.allocation_count + 1, stats.allocation_count);
  CTS_ASSERT_OK(tern_queue_free(queue_, buffer));
  // Cached, still reserved: still charged.
  stats = MemoryStats(0);
  EXPECT_EQ(before.used_by_category[TERN_MEMORY_SCRATCH] + 3 * kMiB,
            stats.used_by_category[TERN_MEMORY_SCRATCH]);
  CTS_ASSERT_OK(tern_memory_pool_destroy(pool));
  stats = MemoryStats(0);
  EXPECT_EQ(before.used_bytes, stats.used_bytes);
  EXPECT_EQ(before.used_by_category[TERN_MEMORY_SCRATCH],
            stats.used_by_category[TERN_MEMORY_SCRATCH]);
  EXPECT_EQ(before.allocation_count, stats.allocation_count);
}

TEST_P(MemoryPoolTest, OutOfMemoryGivesIdleBlocksBackFirst) {
  const uint64_t capacity = DeviceInfo(0).memory_bytes;
  const uint64_t quarter = capacity / 4;
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  std::vector<tern_buffer_t> buffers;
  for (int i = 0; i < 3; ++i) buffers.push_back(QueueAlloc(queue_, quarter, pool));
  for (tern_buffer_t b : buffers) CTS_ASSERT_OK(tern_queue_free(queue_, b));
  EXPECT_EQ(3 * quarter, Stats(pool).cached_bytes);
  // Half the device is more than is free next to the cached blocks: the pool
  // gives them back and tries again.
  tern_buffer_t half = QueueAlloc(queue_, capacity / 2, pool);
  ASSERT_NE(nullptr, half);
  tern_memory_pool_stats_t stats = Stats(pool);
  EXPECT_EQ(capacity / 2, stats.used_bytes);
  EXPECT_GE(stats.device_releases, 2u);
  // More than the device holds in all: the device's report, naming the pool.
  tern_buffer_t too_big = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_queue_alloc(queue_, capacity, pool, &too_big),
                   "pool", "largest free block");
  EXPECT_EQ(nullptr, too_big);
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_queue_alloc(queue_, capacity + 1, pool, &too_big),
                   "whole memory");
  CTS_EXPECT_OK(tern_queue_free(queue_, half));
}

TEST_P(MemoryPoolTest, DestroyWaitsForPendingFrees) {
  const tern_memory_stats_t before = MemoryStats(0);
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  tern_buffer_t live = QueueAlloc(queue_, kMiB, pool);
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_memory_pool_destroy(pool),
                   "1 live allocation");
  EXPECT_EQ(1u, Stats(pool).allocation_count) << "a refused destroy changed the pool";
  Gate* gate = Block(queue_);
  auto* out = HostBytes(kMiB);
  CTS_ASSERT_OK(tern_queue_fill(queue_, live, 0, kMiB, 0x01020304u, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, out->data(), live, 0, kMiB, nullptr));
  CTS_ASSERT_OK(tern_queue_free(queue_, live));
  std::thread opener([gate] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gate->Open();
  });
  CTS_EXPECT_OK(tern_memory_pool_destroy(pool));
  // The destroy returned the block only after the queue was past its free.
  CTS_EXPECT_OK(tern_queue_query(queue_, nullptr));
  opener.join();
  EXPECT_EQ(0x04, (*out)[0]);
  EXPECT_EQ(before.used_bytes, MemoryStats(0).used_bytes);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_memory_pool_destroy(pool), "destroyed");
  tern_buffer_t buffer = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_alloc(queue_, 64, pool, &buffer), "pool");
}

TEST_P(MemoryPoolTest, CrossQueueUseThroughAnEvent) {
  // The documented contract: another queue uses the buffer after an event
  // recorded after the allocation, and the free follows that queue's use.
  constexpr uint64_t kSize = 32 * kKiB;
  tern_memory_pool_t pool = CreatePool(UINT64_MAX);
  tern_event_t allocated = CreateEvent();
  tern_event_t used = CreateEvent();
  tern_buffer_t buffer = QueueAlloc(queue_, kSize, pool);
  auto* input = Make<std::vector<uint8_t>>(Pattern(kSize, 7));
  auto* output = HostBytes(kSize);
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, buffer, 0, input->data(), kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, allocated, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(other_, allocated, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(other_, output->data(), buffer, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_free(other_, buffer));
  CTS_ASSERT_OK(tern_queue_record_event(other_, used, nullptr));
  CTS_EXPECT_OK(tern_event_synchronize(used, kLongTimeout));
  EXPECT_TRUE(*input == *output);
}

TEST_P(MemoryPoolTest, PoolsOfEachDevice) {
  CTS_NEED_DEVICES(2);
  tern_core_t core = OpenCore(1, 0);
  tern_queue_t queue = CreateQueue(core, "cts-pool-d1");
  tern_memory_pool_t pool = CreatePool(UINT64_MAX, TERN_MEMORY_TENSORS, 1);
  tern_buffer_t buffer = QueueAlloc(queue, 4096, pool);
  EXPECT_EQ(device(1), BufferInfo(buffer).device);
  tern_buffer_t by_default = QueueAlloc(queue, 4096, nullptr);
  EXPECT_EQ(device(1), BufferInfo(by_default).device);
  // A pool of device 1 cannot serve a queue of device 0.
  tern_buffer_t refused = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_alloc(queue_, 4096, pool, &refused),
                   "device 1", "device 0");
  EXPECT_EQ(nullptr, refused);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_free(queue_, buffer), "device 1");
  CTS_EXPECT_OK(tern_queue_free(queue, buffer));
  CTS_EXPECT_OK(tern_queue_free(queue, by_default));
  CTS_EXPECT_OK(tern_memory_pool_destroy(pool));
}

void Nap(void*, tern_status_t) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }

// Several threads allocate, use and free on their own queues from one pool,
// hand buffers across queues through events, while another thread changes
// the threshold, trims and reads statistics. Every buffer's contents are
// checked: a block handed out early would be overwritten by its next owner.
TEST_P(MemoryPoolTest, ConcurrentQueuesShareAPool) {
  tern_core_t core1 = OpenCore(0, 1);
  ASSERT_NE(nullptr, core1);
  const tern_core_t cores[] = {core_, core1};
  tern_memory_pool_t pool = CreatePool(256 * kKiB);
  constexpr int kThreads = 4;
  const int iterations = 400;
  std::vector<tern_queue_t> queues;
  for (int t = 0; t < kThreads; ++t) queues.push_back(CreateQueue(cores[t % 2]));
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  auto worker = [&](int t) {
    std::mt19937 rng(static_cast<uint32_t>(t));
    tern_queue_t queue = queues[t];
    tern_queue_t next = queues[(t + 1) % kThreads];
    tern_event_t event = nullptr;
    if (tern_event_create(&event) != TERN_OK) {
      ++failures;
      return;
    }
    std::vector<std::pair<std::vector<uint32_t>, uint32_t>> checks;
    for (int i = 0; i < iterations; ++i) {
      const uint64_t words = 16 + rng() % 4096;
      const uint32_t pattern = (static_cast<uint32_t>(t) << 24) | static_cast<uint32_t>(i);
      tern_buffer_t buffer = nullptr;
      if (tern_queue_alloc(queue, words * 4, pool, &buffer) != TERN_OK) {
        ++failures;
        break;
      }
      checks.emplace_back(std::vector<uint32_t>(words), pattern);
      std::vector<uint32_t>& out = checks.back().first;
      bool ok = tern_queue_fill(queue, buffer, 0, words * 4, pattern, nullptr) == TERN_OK;
      // Now and then the queue sleeps between writing and reading the block,
      // while the other threads allocate: a block handed to them before this
      // queue passed its free would be overwritten before it is read back.
      if (i % 4 == 0) {
        ok = ok && tern_queue_host_callback(queue, Nap, nullptr, nullptr) == TERN_OK;
      }
      ok = ok && tern_queue_copy_d2h(queue, out.data(), buffer, 0, words * 4, nullptr) == TERN_OK;
      if (i % 3 == 0) {
        // Hand the buffer to the next thread's queue, which frees it.
        ok = ok && tern_queue_record_event(queue, event, nullptr) == TERN_OK &&
             tern_queue_wait_event(next, event, nullptr) == TERN_OK &&
             tern_queue_free(next, buffer) == TERN_OK;
      } else {
        ok = ok && tern_queue_free(queue, buffer) == TERN_OK;
      }
      if (!ok) ++failures;
      if (i % 50 == 49) {
        if (tern_queue_synchronize(queue, kLongTimeout) != TERN_OK) ++failures;
        for (const auto& [bytes, expected] : checks) {
          for (uint32_t word : bytes) {
            if (word != expected) {
              ++failures;
              break;
            }
          }
        }
        checks.clear();
      }
    }
    if (tern_queue_synchronize(queue, kLongTimeout) != TERN_OK) ++failures;
    for (const auto& [bytes, expected] : checks) {
      for (uint32_t word : bytes) {
        if (word != expected) {
          ++failures;
          break;
        }
      }
    }
    (void)tern_event_destroy(event);
  };
  std::thread meddler([&] {
    uint64_t round = 0;
    while (!stop.load()) {
      tern_memory_pool_stats_t stats{};
      stats.struct_size = sizeof(stats);
      if (tern_memory_pool_get_stats(pool, &stats) != TERN_OK) ++failures;
      if (stats.pending_bytes > stats.cached_bytes) ++failures;
      const uint64_t threshold = (round++ % 2) ? 0 : UINT64_MAX;
      if (tern_memory_pool_set_attribute(pool, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD,
                                         threshold) != TERN_OK ||
          tern_memory_pool_trim_to(pool, 64 * kKiB) != TERN_OK) {
        ++failures;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& thread : threads) thread.join();
  stop.store(true);
  meddler.join();
  EXPECT_EQ(0, failures.load()) << tern_last_error_message();
  for (tern_queue_t queue : queues) CTS_EXPECT_OK(tern_queue_synchronize(queue, kLongTimeout));
  const tern_memory_pool_stats_t stats = Stats(pool);
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(static_cast<uint64_t>(kThreads * iterations), stats.allocations);
  EXPECT_GT(stats.reused_same_queue + stats.reused_other_queue, 0u);
  CTS_EXPECT_OK(tern_memory_pool_destroy(pool));
}

CTS_INSTANTIATE(MemoryPoolTest);

}  // namespace
}  // namespace tern::cts
