// One execution of a function on the simulated engines: each engine of a core
// runs its own stream, in order, and the streams order themselves only
// through their semaphores (docs/isa.md, "Sync"), as on hardware.
//
// The compute engines (tensor, vector, scalar, gpsimd) take turns on the
// calling thread, one instruction at a time, round robin, each round after
// the DMA engines have taken their step: their kernels
// share the kernel pool (engines/kernel_pool.h). A DMA instruction runs on the DMA
// thread (dma_worker.h) whenever another engine has work it could overlap
// and the compute kernels leave a host CPU free for it, so copies and
// compute really run at once; otherwise it runs here, which saves the
// hand-off and never slows the compute kernels down.
//
// With ScheduleMode::kRandom every engine (DMA included) takes one
// instruction at a time on the calling thread, picked by a generator seeded
// from the mode's seed and the execution's number in the process: the
// interleaving is reproducible and adversarial. A correct program gives the
// same bits under every schedule.
//
// When every unfinished engine waits on a semaphore that no running
// instruction can signal, the execution stops at once as a hang naming each
// waiting instruction, instead of running into TERN_EXEC_TIMEOUT. (The
// loader refuses programs that can deadlock, so this guards against a
// driver or loader bug, and against programs that reach the driver by
// another path.)
#ifndef TERN_DRIVER_SHIM_SIM_ENGINE_STREAMS_H_
#define TERN_DRIVER_SHIM_SIM_ENGINE_STREAMS_H_

#include <cstdint>
#include <functional>

#include "common/status_with_message.h"
#include "driver_shim/program.h"
#include "driver_shim/sim/sim_topology.h"
#include "tern/types.h"

namespace tern::sim {

// Runs one instruction that is not a sync instruction: resolves its operands
// and runs its kernel. Called on the calling thread, and for DMA
// instructions also on the DMA thread, concurrently.
using RunOneInstruction = std::function<Status(const driver::Instruction&)>;

// Runs every stream of `function` to its end under `mode`. Returns the first
// failure, with which instruction of which engine it was, and sets
// `*out_class`: an instruction's own failure, TERN_ERROR_EXEC_TIMEOUT when
// `deadline_ns` (CLOCK_MONOTONIC) passes or the engines hang. Returns only
// when no instruction of this execution is still running anywhere.
// Thread-safety: one call at a time per process (the compute thread's).
Status RunEngineStreams(const driver::Function& function, const ScheduleMode& mode,
                        uint64_t deadline_ns, const RunOneInstruction& run,
                        tern_error_class_t* out_class);

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_ENGINE_STREAMS_H_
