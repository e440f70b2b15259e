// CTS: device memory (allocation, alignment, statistics, out-of-memory,
// synchronous transfers), pinned host memory and protect mode.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cts_fixture.h"

namespace tern::cts {
namespace {

const tern_memory_category_t kCategories[] = {
    TERN_MEMORY_TENSORS, TERN_MEMORY_CONSTANTS,   TERN_MEMORY_CODE,
    TERN_MEMORY_SCRATCH, TERN_MEMORY_COLLECTIVES, TERN_MEMORY_RUNTIME,
};

const char* const kCategoryNames[] = {"tensors", "constants",   "code",
                                      "scratch", "collectives", "runtime"};

class MemoryTest : public RuntimeTest {};

TEST_P(MemoryTest, AllocFreeEveryCategoryAndAlignment) {
  const uint64_t kAlignments[] = {0, 1, 2, 64, 128, 256, 4096, 65536};
  const uint64_t kSizes[] = {1, 63, 64, 65, 4097, 100000};
  const uint64_t minimum = DeviceInfo(0).memory_alignment;
  std::string misaligned;
  for (tern_memory_category_t category : kCategories) {
    for (uint64_t alignment : kAlignments) {
      for (uint64_t size : kSizes) {
        SCOPED_TRACE("category " + std::to_string(category) + " alignment " +
                     std::to_string(alignment) + " size " + std::to_string(size));
        tern_buffer_t buffer = Alloc(0, size, category, alignment);
        ASSERT_NE(nullptr, buffer);
        const tern_buffer_info_t info = BufferInfo(buffer);
        EXPECT_EQ(size, info.size) << "size is reported as requested";
        EXPECT_EQ(category, info.category);
        EXPECT_EQ(device(0), info.device);
        EXPECT_NE(0u, info.device_address);
        const uint64_t expected_alignment = std::max(alignment, minimum);
        if (info.device_address % expected_alignment != 0) {
          misaligned += " [category " + std::to_string(category) + ", alignment " +
                        std::to_string(alignment) + ", size " + std::to_string(size) +
                        ": address " + std::to_string(info.device_address) + "]";
        }
        CTS_EXPECT_OK(tern_buffer_free(buffer));
      }
    }
  }
  EXPECT_EQ("", misaligned) << "device addresses not aligned as requested";
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(0u, stats.used_bytes);
  EXPECT_EQ(0u, stats.allocation_count);
}

TEST_P(MemoryTest, DeviceAddressHonoursLargeAlignments) {
  // Alignments beyond a page, up to the whole device: the device address
  // itself must be aligned, not only the buffer's offset inside the device's
  // memory.
  const uint64_t capacity = DeviceInfo(0).memory_bytes;
  for (uint64_t alignment = 1ull << 20; alignment <= capacity; alignment <<= 1) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    std::vector<tern_buffer_t> buffers;
    // Two where they fit, so that one does not start at the memory's base.
    const uint64_t count = std::min<uint64_t>(2, capacity / alignment);
    for (uint64_t i = 0; i < count; ++i) {
      tern_buffer_t buffer = Alloc(0, 4096, TERN_MEMORY_TENSORS, alignment);
      ASSERT_NE(nullptr, buffer);
      const tern_buffer_info_t info = BufferInfo(buffer);
      EXPECT_EQ(0u, info.device_address % alignment)
          << "device_address 0x" << std::hex << info.device_address;
      buffers.push_back(buffer);
    }
    for (tern_buffer_t buffer : buffers) CTS_EXPECT_OK(tern_buffer_free(buffer));
  }
}

TEST_P(MemoryTest, BuffersDoNotOverlap) {
  const uint64_t kSizes[] = {1, 100, 4096, 65, 1 << 20, 3, 12345, 64, 8191, 2};
  struct Range {
    uint64_t begin, end;
  };
  std::vector<Range> ranges;
  std::vector<tern_buffer_t> buffers;
  for (uint64_t size : kSizes) {
    tern_buffer_t buffer = Alloc(0, size);
    ASSERT_NE(nullptr, buffer);
    const tern_buffer_info_t info = BufferInfo(buffer);
    for (const Range& other : ranges) {
      EXPECT_TRUE(info.device_address + size <= other.begin || other.end <= info.device_address)
          << "buffer at 0x" << std::hex << info.device_address << " overlaps one at 0x"
          << other.begin;
    }
    ranges.push_back({info.device_address, info.device_address + size});
    buffers.push_back(buffer);
  }
  for (tern_buffer_t buffer : buffers) CTS_EXPECT_OK(tern_buffer_free(buffer));
}

void ExpectCategories(const tern_memory_stats_t& stats,
                      const uint64_t (&expected)[TERN_MEMORY_CATEGORY_COUNT]) {
  for (int c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) {
    EXPECT_EQ(expected[c], stats.used_by_category[c]) << kCategoryNames[c];
    EXPECT_EQ(expected[c], stats.node_used_by_category[c]) << kCategoryNames[c] << " (node)";
  }
}

TEST_P(MemoryTest, StatsExactAfterKnownSequenceTestTopology) {
  tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(sizeof(stats), stats.struct_size);
  EXPECT_EQ(kTestMemoryBytes, stats.capacity_bytes);
  EXPECT_EQ(0u, stats.used_bytes);
  EXPECT_EQ(0u, stats.peak_used_bytes);
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(0u, stats.node_used_bytes);
  EXPECT_EQ(kTestMemoryBytes, stats.free_bytes);
  EXPECT_EQ(kTestMemoryBytes, stats.largest_free_block);
  ExpectCategories(stats, {0, 0, 0, 0, 0, 0});

  // Sizes are multiples of the device's minimum alignment, so nothing is
  // rounded and every figure is exact. (This process is alone on its node.)
  constexpr uint64_t kTensors = 1 << 20, kConstants = 64 << 10, kCode = 4096, kScratch = 256,
                     kCollectives = 2 << 20, kRuntime = 128 << 10;
  tern_buffer_t tensors = Alloc(0, kTensors, TERN_MEMORY_TENSORS);
  tern_buffer_t constants = Alloc(0, kConstants, TERN_MEMORY_CONSTANTS);
  tern_buffer_t code = Alloc(0, kCode, TERN_MEMORY_CODE, 4096);
  tern_buffer_t scratch = Alloc(0, kScratch, TERN_MEMORY_SCRATCH);
  tern_buffer_t collectives = Alloc(0, kCollectives, TERN_MEMORY_COLLECTIVES);
  tern_buffer_t runtime = Alloc(0, kRuntime, TERN_MEMORY_RUNTIME);
  constexpr uint64_t kAll = kTensors + kConstants + kCode + kScratch + kCollectives + kRuntime;
  stats = MemoryStats(0);
  EXPECT_EQ(kAll, stats.used_bytes);
  EXPECT_EQ(kAll, stats.peak_used_bytes);
  EXPECT_EQ(6u, stats.allocation_count);
  EXPECT_EQ(kAll, stats.node_used_bytes);
  EXPECT_EQ(kTestMemoryBytes - kAll, stats.free_bytes);
  EXPECT_GT(stats.largest_free_block, 0u);
  EXPECT_LE(stats.largest_free_block, stats.free_bytes);
  ExpectCategories(stats, {kTensors, kConstants, kCode, kScratch, kCollectives, kRuntime});
  // The other device is untouched.
  const tern_memory_stats_t other = MemoryStats(1);
  EXPECT_EQ(0u, other.used_bytes);
  EXPECT_EQ(0u, other.node_used_bytes);

  CTS_EXPECT_OK(tern_buffer_free(tensors));
  CTS_EXPECT_OK(tern_buffer_free(collectives));
  stats = MemoryStats(0);
  const uint64_t remaining = kConstants + kCode + kScratch + kRuntime;
  EXPECT_EQ(remaining, stats.used_bytes);
  EXPECT_EQ(kAll, stats.peak_used_bytes) << "the peak stays";
  EXPECT_EQ(4u, stats.allocation_count);
  EXPECT_EQ(remaining, stats.node_used_bytes);
  EXPECT_EQ(kTestMemoryBytes - remaining, stats.free_bytes);
  ExpectCategories(stats, {0, kConstants, kCode, kScratch, 0, kRuntime});

  // Below the old peak: the peak does not move.
  tern_buffer_t more = Alloc(0, 512 << 10, TERN_MEMORY_TENSORS);
  stats = MemoryStats(0);
  EXPECT_EQ(remaining + (512 << 10), stats.used_bytes);
  EXPECT_EQ(kAll, stats.peak_used_bytes);
  // Above it: the peak follows.
  tern_buffer_t big = Alloc(0, 8 << 20, TERN_MEMORY_SCRATCH);
  stats = MemoryStats(0);
  EXPECT_EQ(remaining + (512 << 10) + (8 << 20), stats.used_bytes);
  EXPECT_EQ(stats.used_bytes, stats.peak_used_bytes);
  const uint64_t peak = stats.peak_used_bytes;

  for (tern_buffer_t buffer : {constants, code, scratch, runtime, more, big}) {
    CTS_EXPECT_OK(tern_buffer_free(buffer));
  }
  stats = MemoryStats(0);
  EXPECT_EQ(0u, stats.used_bytes);
  EXPECT_EQ(peak, stats.peak_used_bytes);
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(0u, stats.node_used_bytes);
  EXPECT_EQ(kTestMemoryBytes, stats.free_bytes);
  EXPECT_EQ(kTestMemoryBytes, stats.largest_free_block) << "freed blocks must coalesce";
  ExpectCategories(stats, {0, 0, 0, 0, 0, 0});
}

TEST_P(MemoryTest, SmallAllocationChargesAtMostOneAlignmentUnit) {
  const uint64_t minimum = DeviceInfo(0).memory_alignment;
  tern_buffer_t buffer = Alloc(0, 100, TERN_MEMORY_SCRATCH);
  ASSERT_NE(nullptr, buffer);
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_GE(stats.used_bytes, 100u);
  EXPECT_LT(stats.used_bytes, 100u + minimum);
  EXPECT_EQ(stats.used_bytes, stats.used_by_category[TERN_MEMORY_SCRATCH]);
  EXPECT_EQ(100u, BufferInfo(buffer).size);
  CTS_EXPECT_OK(tern_buffer_free(buffer));
}

TEST_P(MemoryTest, LargestFreeBlockCanBeAllocated) {
  // Fragment the memory, then check the promise of largest_free_block: an
  // allocation of exactly that size succeeds, one byte-block more fails.
  std::vector<tern_buffer_t> buffers;
  for (int i = 0; i < 8; ++i) buffers.push_back(Alloc(0, 16 << 20));
  for (int i = 0; i < 8; i += 2) CTS_EXPECT_OK(tern_buffer_free(buffers[i]));
  const tern_memory_stats_t stats = MemoryStats(0);
  ASSERT_GT(stats.largest_free_block, 0u);
  const uint64_t unit = DeviceInfo(0).memory_alignment;
  tern_buffer_t too_big = nullptr;
  const tern_buffer_params_t params = BufferParams(stats.largest_free_block + unit);
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_buffer_alloc(device(0), &params, &too_big));
  EXPECT_EQ(nullptr, too_big);
  tern_buffer_t exact = Alloc(0, stats.largest_free_block);
  EXPECT_NE(nullptr, exact);
  CTS_EXPECT_OK(tern_buffer_free(exact));
  for (int i = 1; i < 8; i += 2) CTS_EXPECT_OK(tern_buffer_free(buffers[i]));
}

TEST_P(MemoryTest, OutOfMemoryMessageAndRecoveryTestTopology) {
  // 200 MiB of constants, a hole of 8 MiB, 40 MiB of code: 16 MiB stay free,
  // in more than one block when the allocator places buffers in order.
  tern_buffer_t constants = Alloc(0, 200 << 20, TERN_MEMORY_CONSTANTS);
  tern_buffer_t hole = Alloc(0, 8 << 20, TERN_MEMORY_CODE);
  tern_buffer_t code = Alloc(0, 40 << 20, TERN_MEMORY_CODE);
  ASSERT_NE(nullptr, constants);
  ASSERT_NE(nullptr, code);
  ASSERT_NE(nullptr, hole);
  CTS_ASSERT_OK(tern_buffer_free(hole));
  const tern_memory_stats_t before = MemoryStats(0);
  const uint64_t free_bytes = before.free_bytes;
  EXPECT_EQ(kTestMemoryBytes - (240u << 20), free_bytes);
  EXPECT_LE(before.largest_free_block, free_bytes);

  const uint64_t request = 100 << 20;
  tern_buffer_t buffer = reinterpret_cast<tern_buffer_t>(uintptr_t{0x1234});
  const tern_buffer_params_t params = BufferParams(request, TERN_MEMORY_SCRATCH);
  CTS_ASSERT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_buffer_alloc(device(0), &params, &buffer),
                   "scratch", "constants", "code");
  EXPECT_EQ(nullptr, buffer);
  const std::string message = tern_last_error_message();
  EXPECT_TRUE(MentionsBytes(message, request)) << "requested size: " << message;
  EXPECT_TRUE(MentionsBytes(message, free_bytes)) << "free bytes: " << message;
  EXPECT_TRUE(MentionsBytes(message, before.largest_free_block))
      << "largest free block " << before.largest_free_block << ": " << message;
  EXPECT_TRUE(MentionsBytes(message, 200 << 20)) << "the top category's usage: " << message;
  // The failure changed nothing.
  const tern_memory_stats_t after = MemoryStats(0);
  EXPECT_EQ(before.used_bytes, after.used_bytes);
  EXPECT_EQ(before.allocation_count, after.allocation_count);
  EXPECT_EQ(before.node_used_bytes, after.node_used_bytes);

  // Memory still works: allocations that fit succeed, and data moves.
  tern_buffer_t fits = Alloc(0, 4 << 20, TERN_MEMORY_SCRATCH);
  ASSERT_NE(nullptr, fits);
  const std::vector<uint8_t> data = Pattern(4 << 20, 7);
  std::vector<uint8_t> back(data.size());
  CTS_EXPECT_OK(tern_buffer_write(fits, 0, data.data(), data.size()));
  CTS_EXPECT_OK(tern_buffer_read(fits, 0, back.data(), back.size()));
  EXPECT_TRUE(data == back);
  CTS_EXPECT_OK(tern_buffer_free(fits));
  CTS_EXPECT_OK(tern_buffer_free(constants));
  tern_buffer_t now_fits = Alloc(0, request, TERN_MEMORY_SCRATCH);
  EXPECT_NE(nullptr, now_fits) << "after freeing, the same request must succeed";
  CTS_EXPECT_OK(tern_buffer_free(now_fits));
  CTS_EXPECT_OK(tern_buffer_free(code));
  EXPECT_EQ(0u, MemoryStats(0).used_bytes);
}

TEST_P(MemoryTest, RequestLargerThanDeviceIsOutOfMemory) {
  const uint64_t capacity = DeviceInfo(0).memory_bytes;
  for (uint64_t size : {capacity + 1, capacity * 2, uint64_t{1} << 62, UINT64_MAX}) {
    SCOPED_TRACE(size);
    tern_buffer_t buffer = nullptr;
    const tern_buffer_params_t params = BufferParams(size);
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_buffer_alloc(device(0), &params, &buffer));
    EXPECT_TRUE(MentionsBytes(tern_last_error_message(), size)) << tern_last_error_message();
  }
  // The whole device at once is fine.
  tern_buffer_t whole = Alloc(0, capacity);
  EXPECT_NE(nullptr, whole);
  CTS_EXPECT_OK(tern_buffer_free(whole));
}

TEST_P(MemoryTest, SyncWriteReadRoundTripWithOffsets) {
  for (uint32_t d = 0; d < device_count(); ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    constexpr uint64_t kSize = (1 << 20) + 3;
    tern_buffer_t buffer = Alloc(d, kSize);
    ASSERT_NE(nullptr, buffer);
    std::vector<uint8_t> expected = Pattern(kSize, 1 + d);
    CTS_ASSERT_OK(tern_buffer_write(buffer, 0, expected.data(), kSize));
    std::vector<uint8_t> actual(kSize);
    CTS_ASSERT_OK(tern_buffer_read(buffer, 0, actual.data(), kSize));
    ASSERT_TRUE(expected == actual);

    // Patches at odd offsets and sizes, including the very end.
    struct Patch {
      uint64_t offset, size;
    };
    for (Patch patch : {Patch{777, 1234}, Patch{1, 1}, Patch{kSize - 5, 5}, Patch{4095, 4098},
                        Patch{kSize - 1, 1}}) {
      const std::vector<uint8_t> bytes = Pattern(patch.size, static_cast<uint32_t>(patch.offset));
      CTS_ASSERT_OK(tern_buffer_write(buffer, patch.offset, bytes.data(), patch.size));
      std::memcpy(expected.data() + patch.offset, bytes.data(), patch.size);
      std::vector<uint8_t> part(patch.size + 2);
      CTS_ASSERT_OK(tern_buffer_read(buffer, patch.offset, part.data(), patch.size));
      EXPECT_EQ(0, std::memcmp(bytes.data(), part.data(), patch.size));
    }
    CTS_ASSERT_OK(tern_buffer_read(buffer, 0, actual.data(), kSize));
    EXPECT_TRUE(expected == actual) << "a patch spilled outside its range";
    CTS_EXPECT_OK(tern_buffer_free(buffer));
  }
}

TEST_P(MemoryTest, BuffersKeepTheirOwnContents) {
  tern_buffer_t a = Alloc(0, 4096);
  tern_buffer_t b = Alloc(0, 4096);
  tern_buffer_t c = Alloc(1, 4096);
  const std::vector<uint8_t> pa = Pattern(4096, 10), pb = Pattern(4096, 11), pc = Pattern(4096, 12);
  CTS_ASSERT_OK(tern_buffer_write(a, 0, pa.data(), 4096));
  CTS_ASSERT_OK(tern_buffer_write(b, 0, pb.data(), 4096));
  CTS_ASSERT_OK(tern_buffer_write(c, 0, pc.data(), 4096));
  std::vector<uint8_t> back(4096);
  CTS_ASSERT_OK(tern_buffer_read(a, 0, back.data(), 4096));
  EXPECT_TRUE(pa == back);
  CTS_ASSERT_OK(tern_buffer_read(b, 0, back.data(), 4096));
  EXPECT_TRUE(pb == back);
  CTS_ASSERT_OK(tern_buffer_read(c, 0, back.data(), 4096));
  EXPECT_TRUE(pc == back);
}

// What a free does to work still in flight (tern/memory.h): it returns only
// once every command already given to the device's queues has completed, so
// a copy queued behind a slow callback still reads the data, and the range
// serves a new buffer only afterwards.
TEST_P(MemoryTest, FreeWaitsForCommandsInFlight) {
  tern_queue_t queue = CreateQueue(OpenCore(0, 0));
  constexpr uint64_t kSize = 1 << 20;
  tern_buffer_t buffer = Alloc(0, kSize);
  const std::vector<uint8_t> data = Pattern(kSize, 21);
  CTS_ASSERT_OK(tern_buffer_write(buffer, 0, data.data(), kSize));

  std::atomic<bool> callback_done{false};
  struct Nap {
    std::atomic<bool>* done;
  } nap{&callback_done};
  CTS_ASSERT_OK(tern_queue_host_callback(
      queue,
      [](void* user_data, tern_status_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        static_cast<Nap*>(user_data)->done->store(true);
      },
      &nap, nullptr));
  std::vector<uint8_t> back(kSize, 0);
  uint64_t copy_sequence = 0;
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue, back.data(), buffer, 0, kSize, &copy_sequence));

  CTS_ASSERT_OK(tern_buffer_free(buffer));
  EXPECT_TRUE(callback_done.load()) << "the free returned before the queue ran its callback";
  uint64_t completed = 0;
  CTS_ASSERT_OK(tern_queue_query(queue, &completed));
  EXPECT_GE(completed, copy_sequence) << "the free returned before the copy that reads the buffer";
  EXPECT_EQ(back, data);

  // The range is free for the next buffer, and the finished copy cannot
  // touch it: what is written there stays.
  tern_buffer_t next = Alloc(0, kSize);
  const std::vector<uint8_t> other = Pattern(kSize, 22);
  CTS_ASSERT_OK(tern_buffer_write(next, 0, other.data(), kSize));
  CTS_ASSERT_OK(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE));
  std::vector<uint8_t> read(kSize, 0);
  CTS_ASSERT_OK(tern_buffer_read(next, 0, read.data(), kSize));
  EXPECT_EQ(read, other);
}

TEST_P(MemoryTest, HostAllocFree) {
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<void*> pointers;
  for (uint64_t size : {uint64_t{1}, uint64_t{4096}, uint64_t{3 * 4096 + 5}, uint64_t{1 << 20}}) {
    SCOPED_TRACE(size);
    void* ptr = nullptr;
    CTS_ASSERT_OK(tern_host_alloc(size, &ptr));
    ASSERT_NE(nullptr, ptr);
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(page));
    // Ordinary host memory: readable and writable through the pointer.
    std::memset(ptr, 0x5a, size);
    EXPECT_EQ(0x5a, static_cast<uint8_t*>(ptr)[size - 1]);
    pointers.push_back(ptr);
  }
  // Pinned memory works as a source and destination of transfers.
  tern_buffer_t buffer = Alloc(0, 1 << 20);
  auto* src = static_cast<uint8_t*>(pointers[3]);
  const std::vector<uint8_t> data = Pattern(1 << 20, 3);
  std::memcpy(src, data.data(), data.size());
  CTS_ASSERT_OK(tern_buffer_write(buffer, 0, src, data.size()));
  std::memset(src, 0, data.size());
  CTS_ASSERT_OK(tern_buffer_read(buffer, 0, src, data.size()));
  EXPECT_EQ(0, std::memcmp(src, data.data(), data.size()));
  for (void* ptr : pointers) CTS_EXPECT_OK(tern_host_free(ptr));
}

// The suite uses the public headers alone, so it tells sanitizer builds
// apart itself (GCC's macros, clang's __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CTS_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CTS_UNDER_SANITIZER 1
#endif
#endif
#ifndef CTS_UNDER_SANITIZER
#define CTS_UNDER_SANITIZER 0
#endif

// Registered host memory: a caller's buffer (not page aligned) copies to and
// from a device through a queue; its pages are locked while registered; the
// misuse cases fail by name and change nothing.
TEST_P(MemoryTest, HostRegisterUnregister) {
  auto LastError = [] { return std::string(tern_last_error_message()); };
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<uint8_t> storage((3 << 20) + 2 * page);
  uint8_t* host = storage.data() + 100;  // deliberately not page aligned
  const uint64_t size = 3 << 20;
  CTS_ASSERT_OK(tern_host_register(host, size));
#if !CTS_UNDER_SANITIZER
  // (AddressSanitizer and ThreadSanitizer turn mlock into a no-op: it would
  // lock their shadow memory too.)
  // Locked: /proc/self/status counts the pages (VmLck).
  auto locked_kib = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1L;
  };
  EXPECT_GE(locked_kib(), static_cast<long>(size >> 10));
#endif

  tern_queue_t queue = CreateQueue(OpenCore(0, 0));
  tern_buffer_t buffer = Alloc(0, size);
  const std::vector<uint8_t> data = Pattern(size, 9);
  std::memcpy(host, data.data(), size);
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue, buffer, 0, host, size, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE));
  std::memset(host, 0, size);
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue, host, buffer, 0, size, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE));
  EXPECT_EQ(0, std::memcmp(host, data.data(), size));

  // Overlaps: the same range, one sharing its last page, pinned memory.
  EXPECT_EQ(tern_host_register(host, 16), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("overlap"), std::string::npos) << LastError();
  EXPECT_EQ(tern_host_register(host + size, 16), TERN_ERROR_INVALID_ARGUMENT);
  void* pinned = nullptr;
  CTS_ASSERT_OK(tern_host_alloc(4096, &pinned));
  EXPECT_EQ(tern_host_register(pinned, 4096), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("tern_host_alloc"), std::string::npos) << LastError();
  CTS_EXPECT_OK(tern_host_free(pinned));
  // Bad arguments.
  EXPECT_EQ(tern_host_register(nullptr, 16), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_host_register(host, 0), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_host_unregister(host + 8), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("pass that pointer"), std::string::npos) << LastError();
  EXPECT_EQ(tern_host_unregister(storage.data()), TERN_ERROR_INVALID_ARGUMENT);
  // tern_host_free is for tern_host_alloc memory only.
  EXPECT_EQ(tern_host_free(host), TERN_ERROR_INVALID_ARGUMENT);

  CTS_ASSERT_OK(tern_host_unregister(host));
  EXPECT_EQ(tern_host_unregister(host), TERN_ERROR_INVALID_ARGUMENT) << "unregistered twice";
  // Registered again after its end: the range is free.
  CTS_ASSERT_OK(tern_host_register(host, size));
  CTS_ASSERT_OK(tern_host_unregister(host));
}

// --- Protect mode (sim) -----------------------------------------------------------------

TEST_P(MemoryTest, ProtectModeHostDereferenceCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // In the threadsafe style the child re-runs this test from the start, so it
  // dereferences an address of its own buffer.
  tern_buffer_t buffer = Alloc(0, 4096);
  ASSERT_NE(nullptr, buffer);
  const std::vector<uint8_t> data = Pattern(4096, 5);
  CTS_ASSERT_OK(tern_buffer_write(buffer, 0, data.data(), data.size()));
  const tern_buffer_info_t info = BufferInfo(buffer);
  ASSERT_NE(0u, info.device_address);
  EXPECT_DEATH(
      {
        const volatile uint8_t* address =
            reinterpret_cast<const volatile uint8_t*>(static_cast<uintptr_t>(info.device_address));
        std::fprintf(stderr, "read %d\n", *address);
      },
      "");
  // The parent's buffer is still fine through the API.
  std::vector<uint8_t> back(4096);
  CTS_EXPECT_OK(tern_buffer_read(buffer, 0, back.data(), back.size()));
  EXPECT_TRUE(data == back);
}

TEST_P(MemoryTest, ProtectModeOffMakesDeviceMemoryHostVisible) {
  ShutdownAll();
  ScopedEnv env("TERN_SIM_PROTECT", "0");
  CTS_INIT_OR_SKIP();
  RefreshDevices();
  tern_buffer_t buffer = Alloc(0, 4096);
  ASSERT_NE(nullptr, buffer);
  const std::vector<uint8_t> data = Pattern(4096, 9);
  CTS_ASSERT_OK(tern_buffer_write(buffer, 0, data.data(), data.size()));
  const tern_buffer_info_t info = BufferInfo(buffer);
  const auto* host = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(info.device_address));
  EXPECT_EQ(0, std::memcmp(host, data.data(), data.size()));
}

CTS_INSTANTIATE(MemoryTest);

}  // namespace
}  // namespace tern::cts
