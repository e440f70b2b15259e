#include "driver_shim/sim/byte_mover.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "common/logging.h"
#include "common/timeline.h"

namespace tern::sim {
namespace {

// Copies at least this large may use the string move. Below it the two
// were equal within noise on both kinds of machine (glibc uses the string
// move itself for much of that range).
constexpr uint64_t kStringMoveThreshold = 256ull << 10;
// The calibration's copy: large enough that source and destination leave
// the private caches and the L3 (32 MiB on the Zen 5 machines). At 32 MiB,
// half in the L3, the gain there measured 1.16-1.32x from one process to
// the next, so the choice flipped around the 1.20x bar and copies of 16 MiB
// ran 0.87-0.90x memcpy in the processes that chose memmove; at 64 MiB it
// measured 1.33-1.43x.
constexpr uint64_t kCalibrationBytes = 64ull << 20;
// The string move is chosen only when it is at least this much faster.
// Where glibc itself copies with the string move at this size (Intel, below
// its non-temporal threshold) the two measure alike, and a noisy 1.1x must
// not switch the large copies away from glibc's non-temporal stores; where
// the string move really wins (Zen 4) it wins by 1.3x and more.
constexpr double kRequiredGain = 1.20;

// The ERMS feature (CPUID leaf 7, EBX bit 9): the microcoded string move
// writes whole lines without reading them first.
bool HaveFastStringMove() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ebx & (1u << 9)) != 0;
#else
  return false;
#endif
}

void StringMove(uint8_t* dst, const uint8_t* src, uint64_t size) {
#if defined(__x86_64__)
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(size) : : "memory");
#else
  std::memmove(dst, src, size);
#endif
}

struct Choice {
  bool use_string_move = false;
  std::string why;
};

// Times both moves on kCalibrationBytes, interleaved, best of three each.
Choice Measure() {
  if (!HaveFastStringMove()) return {false, "memmove (the CPU has no ERMS)"};
  // Two buffers a few pages apart from a power-of-two distance (copies
  // between addresses 2^n apart ran 10-20% slower on some machines).
  const uint64_t span = 2 * kCalibrationBytes + 17 * 4096;
  void* block = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (block == MAP_FAILED) return {false, "memmove (no memory to measure the string move)"};
  uint8_t* src = static_cast<uint8_t*>(block);
  uint8_t* dst = src + kCalibrationBytes + 17 * 4096;
  // The source is written (untouched pages all read one zero page); the
  // destination's pages are faulted in by the first copy, which the best
  // of three leaves out.
  std::memset(src, 1, kCalibrationBytes);
  uint64_t best_memmove = UINT64_MAX, best_string = UINT64_MAX;
  for (int round = 0; round < 3; ++round) {
    for (int which = 0; which < 2; ++which) {
      const bool string_first = round % 2 == 1;
      const bool string = (which == 0) == string_first;
      const uint64_t start = MonotonicNs();
      if (string) {
        StringMove(dst, src, kCalibrationBytes);
      } else {
        std::memmove(dst, src, kCalibrationBytes);
      }
      const uint64_t took = MonotonicNs() - start;
      uint64_t& best = string ? best_string : best_memmove;
      best = std::min(best, took);
    }
  }
  munmap(block, span);
  const double gain = static_cast<double>(best_memmove) / static_cast<double>(best_string);
  Choice choice;
  choice.use_string_move = gain >= kRequiredGain;
  choice.why = choice.use_string_move
                   ? fmt::format("string move from {} KiB (measured {:.2f}x memmove on {} MiB)",
                                 kStringMoveThreshold >> 10, gain, kCalibrationBytes >> 20)
                   : fmt::format(
                         "memmove (the string move measured {:.2f}x memmove on {} MiB, "
                         "under the {:.2f}x it must gain)",
                         gain, kCalibrationBytes >> 20, kRequiredGain);
  return choice;
}

std::once_flag g_environment_read;
std::string g_forced_mode;  // TERN_SIM_COPY; written once under g_environment_read

Choice Choose() {
  ReadByteMoverEnvironment();
  const std::string& mode = g_forced_mode;
  if (mode == "memmove") return {false, "memmove (TERN_SIM_COPY=memmove)"};
  if (mode == "string-move") {
    if (HaveFastStringMove()) {
      return {true, fmt::format("string move from {} KiB (TERN_SIM_COPY=string-move)",
                                kStringMoveThreshold >> 10)};
    }
    return {false, "memmove (TERN_SIM_COPY=string-move, but the CPU has no ERMS)"};
  }
  if (!mode.empty() && mode != "auto") {
    TERN_LOG_WARN(
        "TERN_SIM_COPY='{}' is not one of auto, memmove, string-move; measuring (auto) instead",
        mode);
  }
  return Measure();
}

std::once_flag g_chosen;
Choice g_choice;  // written once under g_chosen

const Choice& Chosen() {
  std::call_once(g_chosen, [] { g_choice = Choose(); });
  return g_choice;
}

}  // namespace

void ReadByteMoverEnvironment() {
  std::call_once(g_environment_read, [] {
    const char* forced = std::getenv("TERN_SIM_COPY");
    g_forced_mode = forced != nullptr ? forced : "";
  });
}

void MoveBytes(uint8_t* dst, const uint8_t* src, uint64_t size) {
  if (size == 0) return;  // (either pointer may then be null, which memmove must not see)
  if (size >= kStringMoveThreshold && (dst + size <= src || src + size <= dst) &&
      Chosen().use_string_move) {
    StringMove(dst, src, size);
    return;
  }
  std::memmove(dst, src, size);
}

std::string ByteMoveStrategy() { return Chosen().why; }

}  // namespace tern::sim
