// The collective algorithms, written against Exec (communicator.h):
//   all-reduce      recursive doubling (small), Rabenseifner: recursive
//                   halving reduce-scatter + recursive doubling all-gather
//                   (medium), ring reduce-scatter + all-gather with chunked
//                   pipelining (large); non-power-of-two rank counts fold the
//                   extra ranks into their neighbours first;
//   all-gather      recursive doubling (power-of-two counts, small), ring;
//   reduce-scatter  ring with chunked pipelining;
//   broadcast       binomial tree (small), pipelined chain (large);
//   reduce          binomial tree (small), pipelined chain (large);
//   all-to-all      pairwise exchange;
//   barrier         dissemination;
//   send / recv     one message.
// Thresholds: CommConfig (comm_config.h), documented in docs/collectives.md.
#ifndef TERN_COLLECTIVES_ALGORITHMS_H_
#define TERN_COLLECTIVES_ALGORITHMS_H_

#include "common/status_with_message.h"

namespace tern::comm {

class Exec;

// Runs exec.op() to completion (or failure).
Status RunAlgorithm(Exec& exec);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_ALGORITHMS_H_
