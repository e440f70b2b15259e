// Streaming (non-temporal) stores for large kernel outputs; see the header.
#include "driver_shim/sim/engines/streaming_stores.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tern::sim::kernels {
namespace {

std::once_flag g_environment_read;
bool g_disabled = false;  // TERN_SIM_STREAMING_STORES=off; written once
std::atomic<int64_t> g_testing_threshold{0};

// The size of one instance of the highest cache level, as the kernel
// describes this CPU's caches (what lscpu prints).
int64_t ReadSysfsLastLevelCache() {
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level"), size_file(dir + "/size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || size.empty()) continue;
    int64_t bytes = std::strtoll(size.c_str(), nullptr, 10);
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    if (level > best_level && bytes > 0) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return best_bytes;
}

int64_t ReadLastLevelCache() {
  // The kernel's description first: glibc's sysconf decodes CPUID itself,
  // and under a hypervisor that can name a cache many times the one this CPU
  // has (384 MiB for the 32 MiB L3 of the Zen 5 machines here). A machine
  // that reports neither gives 0, and then nothing streams.
  if (const int64_t bytes = ReadSysfsLastLevelCache(); bytes > 0) return bytes;
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(name);
    if (bytes > 0) return bytes;
  }
  return 0;
}

#if defined(__x86_64__)
// The widest streaming store the CPU has. Each stores whole aligned vectors;
// the CPU's write-combining buffers join them into full lines either way, so
// the width only sets the instruction count.
__attribute__((target("avx512f"))) void StreamAvx512(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
}
__attribute__((target("avx"))) void StreamAvx(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
}
void StreamSse(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
}

struct Streamer {
  void (*store)(float*, const float*, int64_t);
  int64_t width;  // floats per store; dst must be aligned to width * 4 bytes
};

Streamer PickStreamer() {
  if (__builtin_cpu_supports("avx512f")) return {StreamAvx512, 16};
  if (__builtin_cpu_supports("avx")) return {StreamAvx, 8};
  return {StreamSse, 4};
}
#endif

}  // namespace

void ReadStreamingStoresEnvironment() {
  std::call_once(g_environment_read, [] {
    const char* value = std::getenv("TERN_SIM_STREAMING_STORES");
    g_disabled = value != nullptr && std::strcmp(value, "off") == 0;
  });
}

int64_t LastLevelCacheBytes() {
  static const int64_t bytes = ReadLastLevelCache();
  return bytes;
}

void SetStreamingThresholdForTesting(int64_t bytes) { g_testing_threshold.store(bytes); }

bool ShouldStreamOutput(int64_t output_bytes) {
#if defined(__x86_64__)
  ReadStreamingStoresEnvironment();
  const int64_t testing = g_testing_threshold.load(std::memory_order_relaxed);
  if (testing > 0) return output_bytes >= testing;
  const int64_t cache = LastLevelCacheBytes();
  return !g_disabled && cache > 0 && output_bytes >= cache;
#else
  (void)output_bytes;
  return false;
#endif
}

#if defined(__x86_64__)
const Streamer& ChosenStreamer() {
  static const Streamer streamer = PickStreamer();
  return streamer;
}
#endif

int64_t StreamingLead(const void* dst) {
#if defined(__x86_64__)
  constexpr uintptr_t kLine = 64;  // x86's cache line (and AVX-512's widest store)
  const auto address = reinterpret_cast<uintptr_t>(dst);
  if (address % 4 != 0 || address % kLine == 0) return 0;
  return static_cast<int64_t>((kLine - address % kLine) / 4);
#else
  (void)dst;
  return 0;
#endif
}

void StoreStreaming(float* dst, const float* src, int64_t n) {
#if defined(__x86_64__)
  const Streamer& streamer = ChosenStreamer();
  const int64_t align_bytes = streamer.width * 4;
  int64_t head = 0;
  const auto address = reinterpret_cast<uintptr_t>(dst);
  if (address % 4 != 0) {  // not even float-aligned: no vector store lines up
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  if (address % align_bytes != 0) {
    head = std::min<int64_t>(n, static_cast<int64_t>((align_bytes - address % align_bytes) / 4));
  }
  std::memcpy(dst, src, static_cast<size_t>(head) * 4);
  const int64_t body = (n - head) / streamer.width * streamer.width;
  if (body > 0) streamer.store(dst + head, src + head, body);
  const int64_t done = head + body;
  std::memcpy(dst + done, src + done, static_cast<size_t>(n - done) * 4);
#else
  std::memcpy(dst, src, static_cast<size_t>(n) * 4);
#endif
}

void StreamingStoresDone() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace tern::sim::kernels
