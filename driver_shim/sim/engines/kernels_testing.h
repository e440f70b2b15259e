// Test hooks of the simulated engines' kernels. Not for production use.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_TESTING_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_TESTING_H_

namespace tern::sim {

// With `disabled` true, matmul and the convolutions skip oneDNN and run the
// portable loops (which otherwise only take what oneDNN does not), so tests
// cover both. Returns the previous setting. Thread-safety: any thread; takes
// effect for instructions started afterwards.
bool SetOneDnnDisabledForTesting(bool disabled);

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_TESTING_H_
