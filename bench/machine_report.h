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

// Prints the machine's description to `out`, each line starting with
// "# machine: ". When `pin_copy_strategy`, it also measures the DMA engine's
// copy strategy (driver_shim/sim/byte_mover.h) and sets TERN_SIM_COPY so
// that the runtime uses the very choice printed (call it before tern_init).
// Thread-safety: call from one thread, before the benchmark starts threads.
void PrintMachine(std::FILE* out, bool pin_copy_strategy);

}  // namespace tern::bench

#endif  // TERN_BENCH_MACHINE_REPORT_H_
