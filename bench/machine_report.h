// What a benchmark ran on, printed before its figures: the CPU model, the
// CPU features that change which code paths run (copies and vector units),
// glibc's version and its copy thresholds, the build type, and the copy
// strategy the simulated DMA engine chose on this machine. Figures measured
// on one machine do not hold on another (docs/runtime-bench.md).
#ifndef TERN_BENCH_MACHINE_REPORT_H_
#define TERN_BENCH_MACHINE_REPORT_H_

#include <cstdio>
#include <string>

namespace tern::bench {

// "Intel(R) Xeon(R) Processor" (/proc/cpuinfo's model name), or "unknown".
std::string CpuModelName();

// The median time, in ns, of a round trip between two CPUs of this process's
// affinity set (an atomic flag passed back and forth by two threads pinned to
// them), or -1 with fewer than two CPUs. On a virtual machine the host may
// place the virtual CPUs close (one core complex: ~60 ns on an AMD EPYC) or
// far apart (~350 ns), and it changes with time: every figure that moves
// data between threads moves with it, up to 5x, so benchmarks print it
// beside their figures. Takes a few milliseconds.
// Thread-safety: any thread; it pins a helper thread and, for the
// measurement, the calling thread (restored after).
double CrossCpuRoundTripNs();

// Prints the machine's description to `out`, each line starting with
// "# machine: ". When `pin_copy_strategy`, it also measures the DMA engine's
// copy strategy (driver_shim/sim/byte_mover.h) and sets TERN_SIM_COPY so
// that the runtime uses the very choice printed (call it before tern_init).
// Thread-safety: call from one thread, before the benchmark starts threads.
void PrintMachine(std::FILE* out, bool pin_copy_strategy);

}  // namespace tern::bench

#endif  // TERN_BENCH_MACHINE_REPORT_H_
