// Philox4x32-10 blocks in bulk: the words behind RANDOM (and the PyTorch
// plugin's random pools), bit for bit num::RandomBlock (numerics.h) of each
// block, sixteen or eight blocks per pass in vector lanes where the CPU has
// AVX-512 or AVX2.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_PHILOX_BLOCKS_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_PHILOX_BLOCKS_H_

#include <cstdint>

namespace tern::sim::kernels {

// Which code computes the blocks: the best this CPU runs, or one in
// particular (tests compare them).
enum class PhiloxCode { kBest, kPortable, kAvx2, kAvx512 };

// Whether `code` runs on this CPU (kBest and kPortable always do).
// Thread-safety: any thread.
bool PhiloxCodeRuns(PhiloxCode code);

// Writes the four words of blocks first .. first + count - 1 of the stream
// (seed, offset) to words[4 * j + w], j counted from `first`.
// Thread-safety: any thread.
void PhiloxBlocks(uint64_t seed, uint64_t offset, uint64_t first, int64_t count, uint32_t* words,
                  PhiloxCode code = PhiloxCode::kBest);

}  // namespace tern::sim::kernels

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_PHILOX_BLOCKS_H_
