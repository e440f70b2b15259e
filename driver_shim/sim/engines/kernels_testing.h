// Test hooks of the simulated engines' kernels. Not for production use.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_TESTING_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_TESTING_H_

#include "tern/isa.h"

namespace tern::sim {

// With `disabled` true, matmul and the convolutions skip oneDNN and run the
// portable loops (which otherwise only take what oneDNN does not), so tests
// cover both. Returns the previous setting. Thread-safety: any thread; takes
// effect for instructions started afterwards.
bool SetOneDnnDisabledForTesting(bool disabled);

// Makes the kernels that the calling thread runs split their work as if the
// kernel pool had `threads` threads (the pool's real threads run the parts),
// so tests can check that results do not depend on the split; 0 restores
// the pool's own count. Returns the previous setting (0: none).
// Thread-safety: affects the calling thread only.
int SetKernelThreadsForTesting(int threads);

// Whether oneDNN, on this CPU, has more than its slow reference code for a
// plain matmul from `in` to `out` (bf16 has none on CPUs without AVX-512,
// for example); only then do the kernels use oneDNN for it, constant weights
// laid out at load included. Thread-safety: any thread.
bool OneDnnHasFastMatmulForTesting(tern_dtype_t in, tern_dtype_t out);

// Whether the vector kernels run code with fused multiply-adds here: a clone
// for AVX-512 or for AVX2 with FMA, built by GCC and picked at load; baseline
// x86-64 code otherwise (clang builds, CPUs without AVX2). numerics.h gives
// the accuracy of each. Thread-safety: any thread.
bool KernelsRunWithFmaForTesting();

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_TESTING_H_
