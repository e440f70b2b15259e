// Bootstrap: how the ranks of a new communicator find each other.
//
// A unique id carries the TCP address of a bootstrap root, a random nonce
// and the communicator's secret (secret.h). The root (a thread of the
// process that created the id, or of rank 0 for tern_comm_init_from_env)
// greets each connection with a challenge; a rank answers with its identity
// (rank, size, host, pid, host and process keys, and for rank 0 the address
// of its control listener), its own challenge, and an HMAC of the root's
// challenge and its hello under the secret. A connection without a valid
// proof is refused and learns nothing. When all `size` ranks have joined,
// the root sends every rank the table of identities with an HMAC over that
// rank's challenge (so a rank knows the table came from the root of its
// communicator) and exits. Connections are served concurrently without
// blocking (pending_connections.h): a client that sends nothing or half a
// hello delays nobody. The root checks that the ranks agree on the size and
// that no rank joins twice, and when its deadline passes it tells the ranks
// that did join which ones never came, and what it refused meanwhile.
// Everything after the table goes through the control plane.
#ifndef TERN_COLLECTIVES_BOOTSTRAP_H_
#define TERN_COLLECTIVES_BOOTSTRAP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status_with_message.h"
#include "net.h"
#include "secret.h"
#include "tern/comm.h"

namespace tern::comm {

struct UniqueId {
  uint64_t nonce = 0;
  SockAddr root;
  Secret secret;
  // tern_comm_init_from_env without TERN_COMM_SECRET: the secret is in this
  // file of rank 0's host (HostSecretPath), read once the root answers.
  bool has_secret = false;
  std::string secret_file;
};

// The public id's bytes: magic, nonce, root address and secret. An id of an
// older tern (magic TERNCID1, no secret) is refused as INCOMPATIBLE.
// Thread-safety: safe from any thread.
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

// Starts a root on `bind_addr` (port 0: ephemeral) that admits ranks proving
// knowledge of `secret` and serves until every rank joined or `timeout_ns`
// passed; `*out_bound` gets its address. `remove_when_done`: a file to
// delete then (the host secret file), or empty.
// Thread-safety: safe from any thread; the root runs on a thread of its own.
Status StartBootstrapRoot(const SockAddr& bind_addr, uint64_t nonce, const Secret& secret,
                          uint64_t timeout_ns, std::string remove_when_done, SockAddr* out_bound);

// Creates an id and starts its root (tern_comm_get_unique_id): the secret
// is `secret` when not null (split), else fresh from getrandom.
// Thread-safety: safe from any thread.
Status CreateUniqueId(uint64_t timeout_ns, const Secret* secret, UniqueId* out);

// Joins as `self->rank` of `size`: connects to the root (retrying until
// `deadline_ns`), reads its challenge, reads the secret file when
// `id->has_secret` is false (then sets it), calls `prepare` with the local
// address of that connection (the interface that reaches the other ranks;
// rank 0 opens its control listener there and fills self->ctrl_address),
// sends `*self` with its proof, and waits for the table and checks the
// root's proof. Thread-safety: safe from any thread.
Status JoinBootstrap(UniqueId* id, uint32_t size, RankIdentity* self, uint64_t deadline_ns,
                     const std::function<Status(const SockAddr& local)>& prepare,
                     std::vector<RankIdentity>* out_table);

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_BOOTSTRAP_H_
