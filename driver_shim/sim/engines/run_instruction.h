// The simulated engines' compute kernels: one entry point that runs a
// validated instruction on tensors in host memory (the engine view of device
// memory). Matmul and convolution go through oneDNN; elementwise, reduction,
// normalisation and index ops are vectorised loops split across the CPUs.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_RUN_INSTRUCTION_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_RUN_INSTRUCTION_H_

#include <cstdint>
#include <span>

#include "common/isa_rules.h"
#include "common/status_with_message.h"
#include "driver_shim/program.h"

namespace tern::sim {

// An operand resolved to memory. `data` points at the operand's offset in its
// segment (element [0,...,0]); absent optional operands have data == nullptr.
struct TensorView {
  uint8_t* data = nullptr;
  const isa::OperandDesc* desc = nullptr;
};

// Runs `instruction` (already validated by isa::ValidateInstruction) on
// `operands` (one per instruction operand, same order). Failures found only
// at run time, such as an index out of range, return
// TERN_ERROR_EXECUTION_FAILED with a message; the caller adds which
// instruction and graph op it was.
// Thread-safety: concurrent calls are fine (they share no state but the
// CPU thread pool).
Status RunInstruction(const driver::Instruction& instruction, std::span<const TensorView> operands);

// Does ahead of time what the first run of `instruction` would otherwise do
// before computing: makes and caches its oneDNN primitives (matmul and
// convolution; a no-op for other opcodes). Called when a program is loaded,
// so that its first execution costs about what the later ones do. The
// primitives are made for the kernels' team size (KernelThreadsForHost), as
// executions run them. Failures are left for the execution to report.
// Thread-safety: any thread; concurrent calls are fine.
void PrepareInstruction(const driver::Instruction& instruction);

// Makes the kernels that the calling thread runs from now on stay on it (no
// CPU threads of their own): for a thread that runs beside the compute
// thread, such as the DMA engine's (dma_worker.h), so that two OpenMP teams
// never compete for the host's CPUs.
// Thread-safety: affects the calling thread only.
void KeepKernelsOnThisThread();

// The size of the kernels' OpenMP team on this host: every CPU the process
// may use but one, or TERN_SIM_KERNEL_THREADS (see SizeKernelThreadsForHost).
// Decided once per process.
// Thread-safety: any thread.
int KernelThreadsForHost();

// Sizes the OpenMP team of the calling thread (the compute thread) for the
// host it runs on (KernelThreadsForHost): every CPU the process may use but one, which stays for
// the framework's own thread (the one that enqueues work) and the queues' threads; one kernel
// thread on a 2-CPU host. A team as large as the host stalled there: libgomp's workers spin, and
// when the enqueuing thread takes one of their CPUs a matmul of 50-130 us took ~7 ms, one time in
// two. TERN_SIM_KERNEL_THREADS=N overrides. Returns the team size chosen. Thread-safety: affects
// the calling thread only.
int SizeKernelThreadsForHost();

// Whether the kernels that the calling thread runs leave a host CPU free
// (they use fewer CPU threads than the process may run on), so that another
// engine's thread can run beside them without stalling their OpenMP team.
// Thread-safety: any thread; answers for the calling thread.
bool KernelsLeaveACpuFree();

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_RUN_INSTRUCTION_H_
