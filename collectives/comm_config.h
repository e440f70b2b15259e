// Settings of a communicator: timeouts from the config struct or the
// environment, and the algorithm thresholds (environment only). Read once
// when a communicator is created.
#ifndef TERN_COLLECTIVES_COMM_CONFIG_H_
#define TERN_COLLECTIVES_COMM_CONFIG_H_

#include <cstdint>
#include <string>

#include "common/status_with_message.h"
#include "tern/comm.h"

namespace tern::comm {

enum class AllReduceAlgo : uint8_t { kAuto, kRecursiveDoubling, kRabenseifner, kRing };

struct CommConfig {
  uint64_t timeout_ns = 300ull * 1000000000ull;       // TERN_COMM_TIMEOUT
  uint64_t init_timeout_ns = 120ull * 1000000000ull;  // TERN_COMM_INIT_TIMEOUT
  // When an operation stalls this long, ask the peers it waits for what
  // they are doing (mismatch diagnosis); min(1 s, timeout / 8) by default.
  uint64_t stall_check_ns = 1000000000ull;
  // All-reduce: recursive doubling up to rd_max bytes, Rabenseifner up to
  // ring_min, ring from ring_min (TERN_COMM_ALLREDUCE_ALGO forces one).
  uint64_t allreduce_rd_max = 16u << 10;     // TERN_COMM_ALLREDUCE_RD_MAX
  uint64_t allreduce_ring_min = 256u << 10;  // TERN_COMM_ALLREDUCE_RING_MIN
  AllReduceAlgo allreduce_algo = AllReduceAlgo::kAuto;
  // All-gather: recursive doubling (power-of-two rank counts) up to this
  // many bytes received, ring above.
  uint64_t allgather_rd_max = 64u << 10;  // TERN_COMM_ALLGATHER_RD_MAX
  // Broadcast and reduce: binomial tree up to this many bytes, pipelined
  // chain above.
  uint64_t tree_max = 64u << 10;  // TERN_COMM_TREE_MAX
  // Pipelining chunk of ring and chain algorithms.
  uint64_t chunk_bytes = 128u << 10;  // TERN_COMM_CHUNK
  bool use_shm = true;                // TERN_COMM_SHM
  // Ranks whose device memory is mapped here (same process, or same host
  // over tern-shm) move operations of at least direct_min bytes straight
  // between each other's buffers (TERN_COMM_DIRECT=0: never).
  bool use_direct = true;           // TERN_COMM_DIRECT
  uint64_t direct_min = 64u << 10;  // TERN_COMM_DIRECT_MIN
};

// Defaults, then the environment, then `config` (may be NULL). Fails with a
// message naming a malformed variable or field.
Status LoadConfig(const tern_comm_config_t* config, CommConfig* out);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_COMM_CONFIG_H_
