// Stores that go around the caches (non-temporal stores) for kernel outputs
// too large to stay in them.
//
// A kernel that writes an output larger than the last-level cache gains
// nothing from caching it: the lines are evicted before anyone reads them.
// With ordinary stores each output line is first read from memory (the
// write-allocate), so an `a + b` over arrays past the cache moves four bytes
// for every three it needs; streaming stores move three. Whether an output
// is that large is decided from this machine's last-level cache size (read
// at run time), so the rule holds on either vendor's CPUs; glibc's memcpy
// switches to the same kind of stores for the same reason.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_STREAMING_STORES_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_STREAMING_STORES_H_

#include <cstdint>

namespace tern::sim::kernels {

// Whether a kernel writing `output_bytes` should store them streaming: at
// least the last-level cache's size (never when the size is unknown, or with
// TERN_SIM_STREAMING_STORES=off).
// Thread-safety: any thread.
bool ShouldStreamOutput(int64_t output_bytes);

// Tests: streams outputs of at least `bytes` instead (0: the machine's rule
// again). Thread-safety: any thread; kernels running meanwhile may see either.
void SetStreamingThresholdForTesting(int64_t bytes);

// The last-level cache size the rule uses, in bytes (0: unknown).
// Thread-safety: any thread.
int64_t LastLevelCacheBytes();

// Copies `n` floats from `src` (a small buffer, in cache) to `dst` with
// streaming stores where `dst` is aligned for them, ordinary ones at its
// unaligned head and tail. The stores are weakly ordered: call
// StreamingStoresDone() before anything tells another thread the output is
// written.
// Thread-safety: any thread.
void StoreStreaming(float* dst, const float* src, int64_t n);

// Floats from `dst` to the next cache line (0 when it starts one, or when
// `dst` is not float-aligned): a run of outputs split into chunks after this
// many streams every later chunk in whole lines.
// Thread-safety: any thread.
int64_t StreamingLead(const void* dst);

// Orders this thread's streaming stores before its later stores (sfence).
// Thread-safety: any thread.
void StreamingStoresDone();

// Reads TERN_SIM_STREAMING_STORES once (the simulator calls it while
// tern_init runs, before any engine thread could; tern_init has checked that
// it is auto or off).
// Thread-safety: any thread.
void ReadStreamingStoresEnvironment();

}  // namespace tern::sim::kernels

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_STREAMING_STORES_H_
