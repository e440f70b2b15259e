// The one-time costs the simulated device pays early so that an executable's
// first execution does not (driver_shim/sim/engines/warm_up.h,
// Device::PrefaultMemory and HwQueue::ExpectWork): checked through
// /proc/self/pagemap, whose bit 63 says whether a virtual page is mapped, and
// through the context switches of the queue's thread in /proc/self/task.
#include "driver_shim/sim/engines/warm_up.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "driver_shim/driver.h"
#include "src/runtime/runtime_state.h"
#include "tern/tern.h"
#include "tests/common/thread_switches.h"

namespace tern {
namespace {

// How many of the pages in [begin, end) are mapped into this process.
size_t MappedPages(uintptr_t begin, uintptr_t end) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << "cannot open /proc/self/pagemap";
  if (fd < 0) return 0;
  size_t mapped = 0;
  for (uintptr_t at = begin / page * page; at < end; at += page) {
    uint64_t entry = 0;
    if (pread(fd, &entry, sizeof(entry), static_cast<off_t>(at / page * sizeof(entry))) ==
            static_cast<ssize_t>(sizeof(entry)) &&
        (entry >> 63) != 0) {
      ++mapped;
    }
  }
  close(fd);
  return mapped;
}

struct CodeSegments {
  uintptr_t inside;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // executable PT_LOAD segments
};

int FindCode(struct dl_phdr_info* info, size_t, void* data) {
  auto* code = static_cast<CodeSegments*>(data);
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr, end = begin + ph.p_memsz;
    if (code->inside >= begin && code->inside < end) holds = true;
    if ((ph.p_flags & PF_X) != 0) ranges.emplace_back(begin, end);
  }
  if (!holds) return 0;
  code->ranges = ranges;
  return 1;
}

TEST(WarmUp, EveryPageOfTheKernelsCodeIsMapped) {
  CodeSegments code{reinterpret_cast<uintptr_t>(&sim::PrefaultKernelCode), {}};
  dl_iterate_phdr(FindCode, &code);
  ASSERT_FALSE(code.ranges.empty()) << "no executable segment holds PrefaultKernelCode";
  size_t pages = 0, before = 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& [begin, end] : code.ranges) {
    pages += (end - begin / page * page + page - 1) / page;
    before += MappedPages(begin, end);
  }
  sim::PrefaultKernelCode();
  size_t after = 0;
  for (const auto& [begin, end] : code.ranges) after += MappedPages(begin, end);
  // Megabytes of kernels: most were never run by this test before the call.
  EXPECT_LT(before, pages);
  EXPECT_EQ(after, pages) << "of the code's " << pages << " pages, " << before
                          << " were mapped before the call";
}

TEST(WarmUp, AFreshThreadsStackIsMappedAsDeepAsKernelsGo) {
  // Below the caller's frame, a new thread's stack has never been touched;
  // WarmUpThisThread maps 64 KiB of it (and makes the thread's malloc arena
  // and oneDNN stream, which leave nothing to check from here).
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  size_t before = 0, after = 0, pages = 0;
  std::thread([&] {
    uint8_t here = 0;
    asm volatile("" : : "r"(&here) : "memory");
    // Pages wholly below this frame and the warm-up's own, within its reach.
    const uintptr_t top = reinterpret_cast<uintptr_t>(&here) / page * page - 2 * page;
    const uintptr_t bottom = top - 12 * page;
    pages = (top - bottom) / page;
    before = MappedPages(bottom, top);
    sim::WarmUpThisThread();
    after = MappedPages(bottom, top);
  }).join();
  EXPECT_LT(before, pages);
  EXPECT_EQ(after, pages);
}

TEST(WarmUp, PrefaultMemoryMapsTheEnginesView) {
  std::unique_ptr<driver::Driver> sim;
  ASSERT_TRUE(driver::CreateDriver("sim", driver::DriverOptions{}, &sim).ok());
  std::unique_ptr<driver::Device> device;
  ASSERT_TRUE(sim->OpenDevice(0, &device).ok());
  // The last megabyte of the device's memory: nothing has touched it.
  const uint64_t bytes = 1 << 20;
  const uint64_t offset = device->info().memory_bytes - bytes;
  const auto begin = reinterpret_cast<uintptr_t>(device->EngineAddress(offset, bytes));
  ASSERT_NE(begin, 0u);
  const size_t pages = bytes / static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(MappedPages(begin, begin + bytes), 0u);
  // Half the range, from an offset that is not page-aligned: the pages it
  // overlaps are mapped, the rest stay as they were.
  device->PrefaultMemory(offset + 100, bytes / 2);
  EXPECT_EQ(MappedPages(begin, begin + bytes), pages / 2 + 1);
  device->PrefaultMemory(offset, bytes);
  EXPECT_EQ(MappedPages(begin, begin + bytes), pages);
  // Out of range: ignored.
  device->PrefaultMemory(device->info().memory_bytes, 4096);
  device->PrefaultMemory(offset, 2 * bytes);
}

// A range PrefaultMemory mapped and the device then gave back (a large
// block's free punches its pages out) is mapped again by the next call: the
// record of what was mapped forgets the pages given back.
TEST(WarmUp, PrefaultMemoryMapsAgainWhatAFreeGaveBack) {
  std::unique_ptr<driver::Driver> sim;
  ASSERT_TRUE(driver::CreateDriver("sim", driver::DriverOptions{}, &sim).ok());
  std::unique_ptr<driver::Device> device;
  ASSERT_TRUE(sim->OpenDevice(0, &device).ok());
  const uint64_t bytes = 2 << 20;
  const uint64_t offset = device->info().memory_bytes - 4 * bytes;
  const auto begin = reinterpret_cast<uintptr_t>(device->EngineAddress(offset, bytes));
  ASSERT_NE(begin, 0u);
  const size_t pages = bytes / static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  device->PrefaultMemory(offset, bytes);
  ASSERT_EQ(MappedPages(begin, begin + bytes), pages);
  device->MemoryFreed(offset, bytes, TERN_MEMORY_TENSORS);
  ASSERT_EQ(MappedPages(begin, begin + bytes), 0u) << "the free gave no page back";
  device->PrefaultMemory(offset, bytes);
  EXPECT_EQ(MappedPages(begin, begin + bytes), pages);
}

// tern_buffer_alloc maps a small buffer's pages (its first execution would
// otherwise fault them in) and leaves a large one to its first touch.
TEST(WarmUp, ASmallBufferIsMappedWhenAllocated) {
  ASSERT_EQ(tern_init(nullptr), TERN_OK);
  tern_device_t device = nullptr;
  ASSERT_EQ(tern_device_get(0, &device), TERN_OK);
  auto pages_of = [&](uint64_t size, tern_buffer_t* out, size_t* total) {
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_TENSORS;
    EXPECT_EQ(tern_buffer_alloc(device, &params, out), TERN_OK);
    Runtime* rt = nullptr;
    std::shared_ptr<BufferObject> object;
    EXPECT_TRUE(GetRuntime(&rt).ok());
    EXPECT_TRUE(LookupBuffer(rt, *out, "buffer", &object).ok());
    if (!object) return size_t{0};
    const auto begin =
        reinterpret_cast<uintptr_t>(object->device->hw->EngineAddress(object->offset, size));
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    *total = (begin + size + page - 1) / page - begin / page;
    return MappedPages(begin, begin + size);
  };
  tern_buffer_t small = nullptr, large = nullptr;
  size_t small_pages = 0, large_pages = 0;
  // The large one first, so that the small one's page is not one of its.
  EXPECT_EQ(pages_of(8 << 20, &large, &large_pages), 0u) << "of " << large_pages;
  EXPECT_EQ(pages_of(640, &small, &small_pages), small_pages);
  EXPECT_EQ(tern_buffer_free(small), TERN_OK);
  EXPECT_EQ(tern_buffer_free(large), TERN_OK);
  EXPECT_EQ(tern_shutdown(), TERN_OK);
}

// A sleeping engine, told that work is coming, wakes into its naps (each
// nap a futex wait with a timeout: a context switch), so that the next
// submission rings it without a futex wake-up; left alone it stays asleep.
TEST(WarmUp, ExpectWorkBringsASleepingEngineToItsNaps) {
  std::unique_ptr<driver::Driver> sim;
  ASSERT_TRUE(driver::CreateDriver("sim", driver::DriverOptions{}, &sim).ok());
  std::unique_ptr<driver::Device> device;
  ASSERT_TRUE(sim->OpenDevice(0, &device).ok());
  std::unique_ptr<driver::HwQueue> queue;
  ASSERT_TRUE(device->CreateQueue(0, "expect-work", &queue).ok());
  const std::string thread = "tern-queue" + std::to_string(device->info().physical_index) + ".0";
  // The engine's thread names itself once it runs; then it polls for 50 us
  // and naps for 1 ms before it sleeps.
  ASSERT_EQ(testing::WhenRunning(thread, 1).size(), 1u) << "no thread named " << thread;
  const std::map<int, long> asleep = testing::WhenAsleep(thread);
  ASSERT_EQ(asleep, testing::WhenAsleep(thread)) << "the engine never went to sleep";
  queue->ExpectWork();
  // About 20 naps of 50 us; asleep, it would not have switched at all.
  ASSERT_EQ(asleep.size(), 1u);
  const std::map<int, long> roused =
      testing::WhenSwitched(thread, asleep.begin()->first, asleep, 5);
  ASSERT_EQ(roused.size(), 1u);
  EXPECT_GE(roused.begin()->second - asleep.begin()->second, 5)
      << "the engine did not nap after ExpectWork()";
  queue.reset();
}

}  // namespace
}  // namespace tern
