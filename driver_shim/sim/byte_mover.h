// The simulated DMA engine's byte move, and how it chose to move bytes on
// this machine.
//
// Two ways to copy large ranges compete on x86: glibc's memcpy (which picks
// its own strategy per CPU at start-up: a vector loop, `rep movsb`, or
// non-temporal stores above a threshold of its own) and the CPU's string
// move (`rep movsb`, fast where the CPU has ERMS). Which is faster depends on
// the CPU and on glibc, not on the vendor alone: on the Zen 4 machines the
// string move copied 16-256 MiB 1.3-1.9x faster than glibc (whose vector
// loop reads every destination line first), while on the Intel Xeon machines
// glibc already uses the string move up to its non-temporal threshold
// (99 MiB there) and its non-temporal stores beat the string move 1.6x
// beyond it. So the choice is measured: the first large copy of the process
// times both on 32 MiB (past any L2 and most L3 shares) and uses the string
// move only if it wins clearly there; otherwise every copy is glibc's.
// TERN_SIM_COPY=auto (default), memmove or string-move overrides.
#ifndef TERN_DRIVER_SHIM_SIM_BYTE_MOVER_H_
#define TERN_DRIVER_SHIM_SIM_BYTE_MOVER_H_

#include <cstdint>
#include <string>

namespace tern::sim {

// Copies `size` bytes with memmove semantics (the ranges may overlap).
// Thread-safety: any thread; the first large copy of the process may take
// ~30 ms longer while it measures (once, under a lock).
void MoveBytes(uint8_t* dst, const uint8_t* src, uint64_t size);

// What MoveBytes does with large copies and why, e.g. "string move from
// 256 KiB (measured 1.52x memmove on 32 MiB)"; measures first if no large
// copy has yet.
// Thread-safety: any thread.
std::string ByteMoveStrategy();

// Reads TERN_SIM_COPY, once per process. The simulator calls it while
// tern_init runs, so that no engine thread reads the environment later:
// getenv may crash while another thread of the program calls setenv.
// Thread-safety: any thread.
void ReadByteMoverEnvironment();

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_BYTE_MOVER_H_
