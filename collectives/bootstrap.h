// Bootstrap: how the ranks of a new communicator find each other.
//
// A unique id carries the TCP address of a bootstrap root and a random
// nonce. The root (a thread of the process that created the id, or of rank 0
// for tern_comm_init_from_env) accepts one connection per rank; each rank
// sends its identity (rank, size, host, pid, host and process keys, and for
// rank 0 the address of its control listener). When all `size` ranks have
// joined, the root sends every rank the table of identities and exits. It
// checks that the ranks agree on the size and that no rank joins twice, and
// when its deadline passes it tells the ranks that did join which ones never
// came. Everything after the table goes through the control plane.
#ifndef TERN_COLLECTIVES_BOOTSTRAP_H_
#define TERN_COLLECTIVES_BOOTSTRAP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status_with_message.h"
#include "net.h"
#include "tern/comm.h"

namespace tern::comm {

struct UniqueId {
  uint64_t nonce = 0;
  SockAddr root;
};

Status EncodeUniqueId(const UniqueId& id, tern_comm_unique_id_t* out);
Status DecodeUniqueId(const tern_comm_unique_id_t& in, UniqueId* out);

// Who a rank is; exchanged through the root.
struct RankIdentity {
  uint32_t rank = 0;
  uint32_t pid = 0;
  uint64_t process_key = 0;
  std::string host;
  std::string node_key;
  std::string ctrl_address;  // rank 0 only: where its control listener is

  void Write(Writer& w) const;
  bool Read(Reader& r);
};

// Starts a root on `bind_addr` (port 0: ephemeral) that serves until every
// rank joined or `timeout_ns` passed; `*out_bound` gets its address.
Status StartBootstrapRoot(const SockAddr& bind_addr, uint64_t nonce, uint64_t timeout_ns,
                          SockAddr* out_bound);

// Creates an id and starts its root (tern_comm_get_unique_id).
Status CreateUniqueId(uint64_t timeout_ns, UniqueId* out);

// Joins as `self->rank` of `size`: connects to the root (retrying until
// `deadline_ns`), calls `prepare` with the local address of that connection
// (the interface that reaches the other ranks; rank 0 opens its control
// listener there and fills self->ctrl_address), sends `*self`, and waits for
// the table.
Status JoinBootstrap(const UniqueId& id, uint32_t size, RankIdentity* self, uint64_t deadline_ns,
                     const std::function<Status(const SockAddr& local)>& prepare,
                     std::vector<RankIdentity>* out_table);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_BOOTSTRAP_H_
