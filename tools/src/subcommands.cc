// The list of `tern`'s subcommands, in one place (as git keeps its command
// list in one file): name, the one-line summary of `tern --help`, the long
// help at the foot of `tern <name> --help`, and the function in <name>.cc
// that adds its options and returns what runs it. main.cc reads this table.
#include "subcommands.h"

namespace tern::tools {
namespace {

// The order here is the order of `tern --help`.
constexpr SubcommandSpec kSubcommands[] = {
    {"ls", "List the devices, their cores and memory, and the processes using them",
     "List the devices of this node: cores, device memory (HBM) total and in use by every "
     "process, NUMA node and nearby CPUs, which process owns each core, and the processes "
     "using each device with their memory by category. Reads shared telemetry only: it works "
     "while workloads run and never takes a core.",
     AddLsOptions},

    {"top", "Live view of core utilization, memory and errors",
     "A live terminal view of every device: per-core utilization (share of time running "
     "commands) and commands/s, device memory by category and by process, error counters by "
     "class and ECC counters. Press q or Ctrl-C to quit.",
     AddTopOptions},

    {"monitor", "Print device counters periodically: JSON lines or Prometheus metrics",
     "Sample every device each INTERVAL and print one JSON document per line: per-core "
     "utilization, commands and executions (totals and rates over the interval), errors by "
     "class, device memory by category and by process, and ECC counters. The first line comes "
     "after one interval, so every line has rates.\n"
     "With --prometheus, print the Prometheus text exposition instead (once by default); with "
     "--listen, serve it over HTTP at /metrics until SIGINT or SIGTERM.",
     AddMonitorOptions},

    {"diag", "Check the health of the devices (exit 0 healthy, 1 degraded, 2 failed)",
     "Run health checks on every device and report them as a table or JSON. Active checks "
     "allocate a little device memory and use a core that no workload holds; when every core "
     "of a device is busy, the checks that need one are skipped (reported as degraded).\n"
     "  hbm_pattern          write address and bit patterns, fill with DMA, read back, compare\n"
     "  copy_bandwidth       H2D and D2H GB/s against memcpy (below --min-bandwidth-ratio: "
     "degraded)\n"
     "  compute_selftest     relu(a @ b) on 64x64 fp32 matrices, compared bit for bit with "
     "the host's result\n"
     "  collective_loopback  sum all-reduce across every free core of the checked devices, "
     "compared exactly\n"
     "  ecc                  uncorrected ECC errors: failed\n"
     "  error_counters       failed commands by class: degraded\n"
     "Exit code: 0 healthy, 1 degraded, 2 failed, 3 diag could not run, 64 bad usage.",
     AddDiagOptions},

    {"dump", "Inspect an executable file",
     "Print the header, sections (checksums checked), signature and the disassembly of every "
     "instruction stream of a tern executable, then the loader's verdict. Needs no device.\n"
     "Exit status: 0 the loader accepts the file, 1 it rejects it (the reason is printed), "
     "3 the file could not be read.",
     AddDumpOptions},
};

}  // namespace

std::span<const SubcommandSpec> Subcommands() { return kSubcommands; }

}  // namespace tern::tools
