// One-time costs that would otherwise land on the first execution of a
// process: the first touch of the library's code pages and of a fresh
// thread's stack and malloc arena, each a page fault (several microseconds
// on a virtual machine; a first MLP execution took 20-30 of them). Paid once,
// when the driver starts and when an engine thread starts, instead.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_WARM_UP_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_WARM_UP_H_

namespace tern::sim {

// Maps in every page of the executable code of the shared object (or
// program) that holds tern's kernels, once per process. Best effort.
// Thread-safety: any thread.
void PrefaultKernelCode();

// Touches the calling thread's stack (as deep as a kernel goes) and makes its
// malloc arena, so that its first kernel does not. Call at a thread's start.
// Thread-safety: any thread (acts on the calling one).
void WarmUpThisThread();

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_WARM_UP_H_
