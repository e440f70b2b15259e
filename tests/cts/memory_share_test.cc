// CTS: device memory shared through file descriptors (tern_buffer_export,
// tern_buffer_import, TERN_BUFFER_FLAG_SHAREABLE), within one process: the
// imported buffer aliases the exported one, lifetimes and accounting, and
// descriptors that are not an intact exported buffer. The multi-process side
// (a real second process, SIGKILL) is in tests/system/memory_share_test.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cts_fixture.h"

namespace tern::cts {
namespace {

constexpr uint64_t kPage = 4096;

class MemoryShareTest : public RuntimeTest {
 protected:
  tern_buffer_t AllocShareable(uint32_t device_index, uint64_t size,
                               tern_memory_category_t category = TERN_MEMORY_TENSORS) {
    tern_buffer_params_t params = BufferParams(size, category);
    params.flags = TERN_BUFFER_FLAG_SHAREABLE;
    tern_buffer_t buffer = nullptr;
    CTS_EXPECT_OK(tern_buffer_alloc(device(device_index), &params, &buffer));
    return buffer;
  }
  int Export(tern_buffer_t buffer) {
    int fd = -1;
    CTS_EXPECT_OK(tern_buffer_export(buffer, &fd));
    return fd;
  }
  tern_buffer_t Import(uint32_t device_index, int fd, uint64_t size) {
    tern_buffer_t buffer = nullptr;
    CTS_EXPECT_OK(tern_buffer_import(device(device_index), fd, size, &buffer));
    return buffer;
  }
  std::vector<uint8_t> Read(tern_buffer_t buffer, uint64_t size) {
    std::vector<uint8_t> bytes(size);
    CTS_EXPECT_OK(tern_buffer_read(buffer, 0, bytes.data(), size));
    return bytes;
  }
};

TEST_P(MemoryShareTest, ShareableBufferIsAnOrdinaryBuffer) {
  const uint64_t kSize = 10000;  // not whole pages
  tern_buffer_t buffer = AllocShareable(0, kSize, TERN_MEMORY_CONSTANTS);
  ASSERT_NE(nullptr, buffer);
  const tern_buffer_info_t info = BufferInfo(buffer);
  EXPECT_EQ(kSize, info.size);
  EXPECT_EQ(TERN_MEMORY_CONSTANTS, info.category);
  EXPECT_EQ(0u, info.device_address % kPage) << "a shareable buffer starts on a page";
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(3 * kPage, stats.used_bytes) << "whole pages are charged";
  EXPECT_EQ(3 * kPage, stats.used_by_category[TERN_MEMORY_CONSTANTS]);
  EXPECT_EQ(3 * kPage, stats.node_used_bytes);
  EXPECT_EQ(3 * kPage, stats.node_used_by_category[TERN_MEMORY_CONSTANTS]);
  const std::vector<uint8_t> data = Pattern(kSize, 1);
  CTS_ASSERT_OK(tern_buffer_write(buffer, 0, data.data(), kSize));
  EXPECT_EQ(data, Read(buffer, kSize));
  // Queue copies and fills reach it like any buffer.
  tern_core_t core = OpenCore(0, 0);
  tern_queue_t queue = CreateQueue(core);
  ASSERT_NE(nullptr, queue);
  tern_buffer_t other = Alloc(0, kSize);
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue, other, 0, buffer, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_fill(queue, buffer, 0, 4096, 0x01020304u, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue, kLongTimeout));
  EXPECT_EQ(data, Read(other, kSize));
  const std::vector<uint8_t> filled = Read(buffer, 8);
  EXPECT_EQ((std::vector<uint8_t>{4, 3, 2, 1, 4, 3, 2, 1}), filled);
  CTS_EXPECT_OK(tern_buffer_free(other));
  CTS_EXPECT_OK(tern_queue_destroy(queue));
  CTS_EXPECT_OK(tern_core_close(core));
  CTS_EXPECT_OK(tern_buffer_free(buffer));
  EXPECT_EQ(0u, MemoryStats(0).node_used_bytes);
}

TEST_P(MemoryShareTest, ImportedBufferAliasesTheExportedOne) {
  const uint64_t kSize = 3 * kPage + 100;
  tern_buffer_t exported = AllocShareable(0, kSize);
  ASSERT_NE(nullptr, exported);
  const int fd = Export(exported);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(FD_CLOEXEC, fcntl(fd, F_GETFD) & FD_CLOEXEC) << "the descriptor is close-on-exec";
  tern_buffer_t imported = Import(0, fd, kSize);
  ASSERT_NE(nullptr, imported);
  const tern_buffer_info_t a = BufferInfo(exported), b = BufferInfo(imported);
  EXPECT_NE(a.device_address, b.device_address) << "each handle has its own address";
  EXPECT_EQ(kSize, b.size);
  EXPECT_EQ(device(0), b.device);
  EXPECT_EQ(a.category, b.category);

  const std::vector<uint8_t> one = Pattern(kSize, 11), two = Pattern(kSize, 12);
  CTS_ASSERT_OK(tern_buffer_write(exported, 0, one.data(), kSize));
  EXPECT_EQ(one, Read(imported, kSize));
  tern_core_t core = OpenCore(0, 1);
  tern_queue_t queue = CreateQueue(core);
  ASSERT_NE(nullptr, queue);
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue, imported, 0, two.data(), kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue, kLongTimeout));
  EXPECT_EQ(two, Read(exported, kSize));

  // Counted once on the node; under this process for each handle.
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(4 * kPage, stats.node_used_bytes);
  EXPECT_EQ(8 * kPage, stats.used_bytes);
  EXPECT_EQ(2u, stats.allocation_count);

  // The exporter frees: the imported buffer keeps the memory and its data.
  CTS_ASSERT_OK(tern_buffer_free(exported));
  EXPECT_EQ(two, Read(imported, kSize));
  EXPECT_EQ(4 * kPage, MemoryStats(0).node_used_bytes);
  // A new allocation does not land on the shared memory.
  tern_buffer_t fresh = Alloc(0, kSize);
  ASSERT_NE(nullptr, fresh);
  const std::vector<uint8_t> three = Pattern(kSize, 13);
  CTS_ASSERT_OK(tern_buffer_write(fresh, 0, three.data(), kSize));
  EXPECT_EQ(two, Read(imported, kSize));
  CTS_EXPECT_OK(tern_buffer_free(fresh));

  // Re-export of the imported buffer, and import of that descriptor.
  const int again = Export(imported);
  ASSERT_GE(again, 0);
  tern_buffer_t second = Import(0, again, kSize);
  ASSERT_NE(nullptr, second);
  EXPECT_EQ(two, Read(second, kSize));
  CTS_EXPECT_OK(tern_buffer_free(imported));
  EXPECT_EQ(two, Read(second, kSize));
  EXPECT_EQ(4 * kPage, MemoryStats(0).node_used_bytes);
  CTS_EXPECT_OK(tern_buffer_free(second));
  EXPECT_EQ(0u, MemoryStats(0).node_used_bytes) << "the last holder's free releases it";
  EXPECT_EQ(0u, MemoryStats(0).used_bytes);

  // Only descriptors keep it alive now: importing charges again, data intact.
  tern_buffer_t revived = Import(0, fd, kSize);
  ASSERT_NE(nullptr, revived);
  EXPECT_EQ(two, Read(revived, kSize));
  EXPECT_EQ(4 * kPage, MemoryStats(0).node_used_bytes);
  CTS_EXPECT_OK(tern_buffer_free(revived));
  CTS_EXPECT_OK(tern_queue_destroy(queue));
  CTS_EXPECT_OK(tern_core_close(core));
  close(fd);
  close(again);
}

TEST_P(MemoryShareTest, DoubleImportGivesTwoHandles) {
  tern_buffer_t exported = AllocShareable(0, kPage);
  const int fd = Export(exported);
  ASSERT_GE(fd, 0);
  tern_buffer_t first = Import(0, fd, kPage);
  tern_buffer_t second = Import(0, fd, kPage);
  ASSERT_TRUE(first && second);
  EXPECT_NE(first, second);
  const std::vector<uint8_t> data = Pattern(kPage, 21);
  CTS_ASSERT_OK(tern_buffer_write(first, 0, data.data(), kPage));
  EXPECT_EQ(data, Read(second, kPage));
  EXPECT_EQ(kPage, MemoryStats(0).node_used_bytes);
  CTS_EXPECT_OK(tern_buffer_free(exported));
  CTS_EXPECT_OK(tern_buffer_free(first));
  EXPECT_EQ(data, Read(second, kPage));
  EXPECT_EQ(kPage, MemoryStats(0).node_used_bytes);
  CTS_EXPECT_OK(tern_buffer_free(second));
  EXPECT_EQ(0u, MemoryStats(0).node_used_bytes);
  close(fd);
}

TEST_P(MemoryShareTest, ExportedDescriptorHoldsOnlyItsBuffer) {
  // Two buffers with different contents; the descriptor of one is exactly
  // that buffer's pages, nothing of the other or of the rest of the device.
  tern_buffer_t neighbour = Alloc(0, 4 * kPage);
  tern_buffer_t shared = AllocShareable(0, 2 * kPage);
  ASSERT_TRUE(neighbour && shared);
  const std::vector<uint8_t> secret(4 * kPage, 0xee);
  CTS_ASSERT_OK(tern_buffer_write(neighbour, 0, secret.data(), secret.size()));
  const std::vector<uint8_t> data = Pattern(2 * kPage, 31);
  CTS_ASSERT_OK(tern_buffer_write(shared, 0, data.data(), data.size()));
  const int fd = Export(shared);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(0, fstat(fd, &st));
  EXPECT_EQ(static_cast<off_t>(2 * kPage), st.st_size);
  // Sealed: nobody can grow or shrink it under an importer.
  EXPECT_NE(0, ftruncate(fd, static_cast<off_t>(kPage)));
  EXPECT_NE(0, ftruncate(fd, static_cast<off_t>(64 * kPage)));
  void* mapped = mmap(nullptr, 2 * kPage, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(MAP_FAILED, mapped);
  EXPECT_EQ(0, std::memcmp(mapped, data.data(), data.size()));
  munmap(mapped, 2 * kPage);
  close(fd);
  CTS_EXPECT_OK(tern_buffer_free(shared));
  CTS_EXPECT_OK(tern_buffer_free(neighbour));
}

TEST_P(MemoryShareTest, ImportRefusesForeignAndDamagedDescriptors) {
  tern_buffer_t exported = AllocShareable(0, 2 * kPage);
  const int fd = Export(exported);
  ASSERT_GE(fd, 0);
  tern_buffer_t buffer = nullptr;
  // Another device.
  if (device_count() > 1) {
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_buffer_import(device(1), fd, 2 * kPage, &buffer), "device", "UUID");
    EXPECT_EQ(nullptr, buffer);
  }
  // The wrong size names the right one.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_import(device(0), fd, kPage, &buffer),
                   "size", "8192");
  // A memfd of someone else's.
  const int plain = memfd_create("not-tern", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(0, ftruncate(plain, 2 * kPage));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_buffer_import(device(0), plain, 2 * kPage, &buffer), "not a device buffer");
  close(plain);
  // A memfd named like an exported buffer of this device: unsealed, then
  // sealed but truncated.
  tern_device_info_t info = DeviceInfo(0);
  const std::string name = std::string("tern-buffer:") + info.uuid + ":0123456789abcdef:8192:0";
  const int forged = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(forged, 0);
  ASSERT_EQ(0, ftruncate(forged, kPage));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_buffer_import(device(0), forged, 2 * kPage, &buffer), "sealed");
  ASSERT_EQ(0, fcntl(forged, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_buffer_import(device(0), forged, 2 * kPage, &buffer), "truncated");
  close(forged);
  const std::string garbled = std::string("tern-buffer:") + info.uuid + ":xyz:8192";
  const int bad_name = memfd_create(garbled.c_str(), MFD_CLOEXEC);
  ASSERT_GE(bad_name, 0);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_buffer_import(device(0), bad_name, 2 * kPage, &buffer), "parse");
  close(bad_name);
  EXPECT_EQ(nullptr, buffer);
  EXPECT_EQ(1u, MemoryStats(0).allocation_count) << "a refused import placed nothing";
  // The descriptor still works after all that.
  buffer = Import(0, fd, 2 * kPage);
  EXPECT_NE(nullptr, buffer);
  CTS_EXPECT_OK(tern_buffer_free(buffer));
  CTS_EXPECT_OK(tern_buffer_free(exported));
  close(fd);
}

TEST_P(MemoryShareTest, ShutdownReleasesSharedBuffers) {
  tern_buffer_t exported = AllocShareable(0, kPage);
  const int fd = Export(exported);
  ASSERT_GE(fd, 0);
  ASSERT_NE(nullptr, Import(0, fd, kPage));
  const std::vector<uint8_t> data = Pattern(kPage, 41);
  CTS_ASSERT_OK(tern_buffer_write(exported, 0, data.data(), kPage));
  RestartRuntime();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(0u, MemoryStats(0).node_used_bytes) << "shutdown freed both handles";
  // The descriptor outlived the runtime and its memory.
  tern_buffer_t revived = Import(0, fd, kPage);
  ASSERT_NE(nullptr, revived);
  EXPECT_EQ(data, Read(revived, kPage));
  CTS_EXPECT_OK(tern_buffer_free(revived));
  close(fd);
}

TEST_P(MemoryShareTest, ProtectModeImportedAddressIsNotHostMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The child of the death test re-runs this test from the start, so it
  // dereferences an address of its own imported buffer.
  tern_buffer_t exported = AllocShareable(0, kPage);
  const int fd = Export(exported);
  ASSERT_GE(fd, 0);
  tern_buffer_t imported = Import(0, fd, kPage);
  ASSERT_NE(nullptr, imported);
  const uint64_t address = BufferInfo(imported).device_address;
  EXPECT_DEATH(
      {
        const volatile uint8_t* p =
            reinterpret_cast<const volatile uint8_t*>(static_cast<uintptr_t>(address));
        std::fprintf(stderr, "read %d\n", *p);
      },
      "");
  CTS_EXPECT_OK(tern_buffer_free(imported));
  CTS_EXPECT_OK(tern_buffer_free(exported));
  close(fd);
}

TEST_P(MemoryShareTest, ProtectModeOffImportedAddressShowsTheData) {
  ShutdownAll();
  ScopedEnv env("TERN_SIM_PROTECT", "0");
  CTS_INIT_OR_SKIP();
  RefreshDevices();
  tern_buffer_t exported = AllocShareable(0, kPage);
  const int fd = Export(exported);
  ASSERT_GE(fd, 0);
  tern_buffer_t imported = Import(0, fd, kPage);
  ASSERT_NE(nullptr, imported);
  const std::vector<uint8_t> data = Pattern(kPage, 51);
  CTS_ASSERT_OK(tern_buffer_write(exported, 0, data.data(), kPage));
  const auto* host =
      reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(BufferInfo(imported).device_address));
  EXPECT_EQ(0, std::memcmp(host, data.data(), kPage));
  CTS_EXPECT_OK(tern_buffer_free(imported));
  CTS_EXPECT_OK(tern_buffer_free(exported));
  close(fd);
}

TEST_P(MemoryShareTest, SharedBufferLimitOfTheSimulatedDevice) {
  // 256 shared buffers per process (the node registry's per-process list);
  // one more is refused by name, and a free makes room again.
  constexpr int kLimit = 256;
  std::vector<tern_buffer_t> buffers;
  for (int i = 0; i < kLimit; ++i) {
    tern_buffer_t buffer = AllocShareable(0, 64);
    ASSERT_NE(nullptr, buffer) << "buffer " << i;
    buffers.push_back(buffer);
  }
  tern_buffer_params_t params = BufferParams(64);
  params.flags = TERN_BUFFER_FLAG_SHAREABLE;
  tern_buffer_t extra = nullptr;
  CTS_EXPECT_ERROR(TERN_ERROR_UNAVAILABLE, tern_buffer_alloc(device(0), &params, &extra), "256");
  const int fd = Export(buffers[0]);
  ASSERT_GE(fd, 0);
  CTS_EXPECT_ERROR(TERN_ERROR_UNAVAILABLE, tern_buffer_import(device(0), fd, 64, &extra), "256");
  EXPECT_EQ(nullptr, extra);
  EXPECT_EQ(static_cast<uint32_t>(kLimit), MemoryStats(0).allocation_count);
  CTS_ASSERT_OK(tern_buffer_free(buffers.back()));
  buffers.pop_back();
  extra = Import(0, fd, 64);
  EXPECT_NE(nullptr, extra);
  if (extra != nullptr) buffers.push_back(extra);
  close(fd);
  for (tern_buffer_t buffer : buffers) CTS_EXPECT_OK(tern_buffer_free(buffer));
  EXPECT_EQ(0u, MemoryStats(0).node_used_bytes);
}

TEST_P(MemoryShareTest, ConcurrentAllocExportImportFree) {
  // Threads share buffers among themselves while others allocate ordinary
  // ones over the ranges that freed shared buffers give back: every import
  // must see its exporter's data, and the accounting must end at zero.
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const uint64_t size = kPage * (1 + (t + round) % 3) - 7 * round;
        const std::vector<uint8_t> data = Pattern(size, static_cast<uint32_t>(t * 1000 + round));
        tern_buffer_params_t params = BufferParams(size);
        params.flags = (round % 2 == 0) ? TERN_BUFFER_FLAG_SHAREABLE : 0;
        tern_buffer_t buffer = nullptr;
        int fd = -1;
        tern_buffer_t imported = nullptr;
        std::vector<uint8_t> back(size);
        bool ok = tern_buffer_alloc(device(0), &params, &buffer) == TERN_OK &&
                  tern_buffer_write(buffer, 0, data.data(), size) == TERN_OK;
        if (ok && params.flags != 0) {
          ok = tern_buffer_export(buffer, &fd) == TERN_OK &&
               tern_buffer_import(device(0), fd, size, &imported) == TERN_OK &&
               tern_buffer_free(buffer) == TERN_OK;
          buffer = imported;
        }
        ok = ok && tern_buffer_read(buffer, 0, back.data(), size) == TERN_OK && back == data;
        if (buffer != nullptr && tern_buffer_free(buffer) != TERN_OK) ok = false;
        if (fd >= 0) close(fd);
        if (!ok) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(0, failures.load()) << tern_last_error_message();
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(0u, stats.used_bytes);
  EXPECT_EQ(0u, stats.node_used_bytes);
  EXPECT_EQ(0u, stats.allocation_count);
}

CTS_INSTANTIATE(MemoryShareTest);

}  // namespace
}  // namespace tern::cts
