#include "machine_report.h"

#include <gnu/libc-version.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "driver_shim/sim/byte_mover.h"

namespace tern::bench {
namespace {

// The first /proc/cpuinfo line that starts with `key`, after its colon.
std::string CpuInfoField(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(value.begin());
    return value;
  }
  return "";
}

// glibc's x86 tunables that decide how memcpy copies (from the dynamic
// loader's --list-tunables, glibc 2.33 and later), as "name=value ...".
std::string GlibcCopyTunables() {
  std::string found;
  for (const char* loader : {"/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"}) {
    const std::string command = std::string(loader) + " --list-tunables 2>/dev/null";
    std::FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) continue;
    char line[512];
    while (std::fgets(line, sizeof(line), pipe) != nullptr) {
      std::string text(line);
      for (const char* wanted : {"x86_non_temporal_threshold", "x86_rep_movsb_threshold",
                                 "x86_rep_movsb_stop_threshold", "x86_rep_stosb_threshold"}) {
        if (text.find(wanted) == std::string::npos) continue;
        // "glibc.cpu.x86_non_temporal_threshold: 0x6300000 (min: ...)"
        const size_t colon = text.find(':');
        std::string value = colon == std::string::npos ? "" : text.substr(colon + 1);
        std::istringstream(value) >> value;
        const unsigned long long bytes = std::strtoull(value.c_str(), nullptr, 0);
        found += std::string(found.empty() ? "" : ", ") + wanted + " " +
                 (bytes >= (1ull << 20) ? std::to_string(bytes >> 20) + " MiB"
                                        : std::to_string(bytes >> 10) + " KiB");
      }
    }
    pclose(pipe);
    if (!found.empty()) break;
  }
  return found.empty() ? "not reported (glibc older than 2.33?)" : found;
}

}  // namespace

std::string CpuModelName() {
  const std::string model = CpuInfoField("model name");
  return model.empty() ? "unknown" : model;
}

double CrossCpuRoundTripNs() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) < 2) return -1;
  int first = -1, second = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && second < 0; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    (first < 0 ? first : second) = cpu;
  }
  auto pin = [](int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
  };
  constexpr int kRounds = 2000, kBatches = 9;
  alignas(64) std::atomic<int64_t> flag{0};
  std::thread echo([&] {
    pin(second);
    for (int64_t i = 0; i < int64_t{kRounds} * kBatches; ++i) {
      while (flag.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      flag.store(2 * i + 2, std::memory_order_release);
    }
  });
  pin(first);
  std::vector<double> batches;
  for (int b = 0; b < kBatches; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = int64_t{b} * kRounds; i < int64_t{b + 1} * kRounds; ++i) {
      flag.store(2 * i + 1, std::memory_order_release);
      while (flag.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    batches.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
        kRounds);
  }
  echo.join();
  sched_setaffinity(0, sizeof(allowed), &allowed);
  std::sort(batches.begin(), batches.end());
  return batches[kBatches / 2];
}

void PrintMachine(std::FILE* out, bool pin_copy_strategy) {
  const std::string flags = " " + CpuInfoField("flags") + " ";
  std::string features;
  for (const char* flag : {"erms", "fsrm", "avx2", "avx512f", "avx512_bf16", "amx_tile"}) {
    if (flags.find(std::string(" ") + flag + " ") == std::string::npos) continue;
    features += std::string(features.empty() ? "" : " ") + flag;
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cpu_count = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  std::fprintf(out, "# machine: %s (family %s, model %s), %d CPUs, features: %s\n",
               CpuModelName().c_str(), CpuInfoField("cpu family").c_str(),
               CpuInfoField("model").c_str(), cpu_count,
               features.empty() ? "none" : features.c_str());
  std::fprintf(out, "# machine: glibc %s; memcpy: %s\n", gnu_get_libc_version(),
               GlibcCopyTunables().c_str());
#if defined(TERN_BUILD_TYPE)
  std::fprintf(out, "# machine: build type %s\n", TERN_BUILD_TYPE);
#endif
  std::fprintf(out,
               "# machine: round trip between two CPUs %.0f ns (moves with the host's placement of "
               "virtual CPUs)\n",
               CrossCpuRoundTripNs());
  if (pin_copy_strategy) {
    const std::string strategy = sim::ByteMoveStrategy();
    std::fprintf(out, "# machine: the DMA engine's copies: %s\n", strategy.c_str());
    // The runtime would measure again and might decide otherwise within noise:
    // it uses the choice printed here.
    setenv("TERN_SIM_COPY", strategy.rfind("string move", 0) == 0 ? "string-move" : "memmove", 1);
  }
}

}  // namespace tern::bench
