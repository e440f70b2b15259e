// The simulated engines' compute kernels: one entry point that runs a
// validated instruction on tensors in host memory (the engine view of device
// memory). Matmul and convolution go through oneDNN; elementwise, reduction,
// normalisation and index ops are vectorised loops split across the CPUs.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_RUN_INSTRUCTION_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_RUN_INSTRUCTION_H_

#include <cstdint>
#include <memory>
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
// primitives are made single-threaded, as every part of a kernel runs them
// (kernel_pool.h). `constants` is the program's constants segment (null if
// it has none): a matmul whose weight lies there gets the weight laid out
// for its kernels, returned for Instruction::prepared (null when there is
// nothing to keep). Failures are left for the execution to report.
// Thread-safety: any thread; concurrent calls are fine.
std::shared_ptr<const void> PrepareInstruction(const driver::Instruction& instruction,
                                               const uint8_t* constants);

// Makes the kernels that the calling thread runs from now on stay on it (no
// other CPU threads): for a thread that runs beside the engines' own, such
// as the DMA engine's (dma_worker.h), so that it never competes with the
// kernel pool for the host's CPUs.
// Thread-safety: affects the calling thread only.
void KeepKernelsOnThisThread();

// How many CPU threads the kernels split their work across (the kernel pool,
// engines/kernel_pool.h, counting the thread that runs the kernel):
// ChooseKernelThreads for this process. Decided once per process.
// Thread-safety: any thread.
int KernelThreadsForHost();

// TERN_SIM_KERNEL_THREADS when it holds a count (`requested`), else the CPUs
// the process may use divided among the ranks a launcher started on this
// host (`local_ranks`, at least one thread). A launcher that starts N ranks
// on one host means each to have 1/N of it: torchrun also sets each rank's
// OMP_NUM_THREADS to 1 for PyTorch's own CPU kernels. Without it, two ranks
// on a 2-CPU host each ran a pool of two, and their helpers took turns with
// the other rank's host and engine threads.
// Thread-safety: any thread (a pure function).
int ChooseKernelThreads(int host_cpus, const char* requested, int local_ranks);

// The ranks a launcher started on this host, from its environment
// (LOCAL_WORLD_SIZE: torchrun; OMPI_COMM_WORLD_LOCAL_SIZE: Open MPI;
// MPI_LOCALNRANKS: MPICH), or 1.
// Thread-safety: any thread.
int LocalRanksFromEnvironment();

// This process's rank among them (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID), or -1 where no launcher says.
// Thread-safety: any thread.
int LocalRankFromEnvironment();

// The CPUs the process may use, shared among the ranks a launcher started
// on this host (LocalRanksFromEnvironment), at least 1.
// Thread-safety: any thread.
int HostCpusPerRank();

// The CPU a communication engine keeps to where ranks outnumber CPUs: the
// local rank's turn among the CPUs the process may use, so that the ranks'
// engines, which poll for each other, spread over the CPUs and leave each
// host thread a CPU shared with one engine only, whatever the scheduler does
// with the host threads. Two ranks on two CPUs, 8 B all_reduce through
// torch.distributed, blocks of 20,000: 6.3-7.5 us an operation in 24 of 25
// blocks so, against 7.2-16.4 (half the blocks over 8.5) left to the
// scheduler, whose placement changed from block to block (AMD EPYC Zen 5).
// Keeping each engine to the CPU its submitter last ran on did as well for
// small operations but could leave both engines on one CPU for a whole
// backlog of large ones (1.2 ms an operation at 1 MiB, against 30 us).
// -1 where each rank has CPUs to spare or no launcher says the local rank.
// Thread-safety: any thread.
int CommunicationEngineCpu();

// Starts the kernel pool's helper threads (at tern_init, so that no
// execution pays for creating them).
// Thread-safety: any thread.
void StartKernelPool();

// Whether the kernels that the calling thread runs leave a host CPU free
// (they use fewer CPU threads than the process may run on), so that another
// engine's thread can run beside them without stalling them.
// Thread-safety: any thread; answers for the calling thread.
bool KernelsLeaveACpuFree();

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_RUN_INSTRUCTION_H_
