// The control plane of a communicator: a TCP star centred on rank 0, used
// after the bootstrap for everything that is not data:
// - gathers (each rank contributes bytes, every rank gets all of them): the
//   exchange of transport addresses at init, the colors and keys of split;
// - liveness: every rank holds a connection to rank 0, so the kernel tells
//   rank 0 at once when a rank's process dies (its socket closes) and rank 0
//   tells the others; the others learn of rank 0's death the same way. A
//   rank that leaves cleanly says goodbye first;
// - aborts: a rank that aborts, or that detects a mismatch, tells everyone;
// - diagnosis: a rank stuck in an operation asks a peer what that peer's
//   operation with the same sequence number was (the answer comes from the
//   peer's flight recorder), which tells a mismatch from a slow peer.
// Rank 0 routes messages between the other ranks. A monitor thread per rank
// reads the sockets (blocking in poll, no busy wait).
#ifndef TERN_COLLECTIVES_CONTROL_H_
#define TERN_COLLECTIVES_CONTROL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "common/status_with_message.h"
#include "secret.h"

namespace tern::comm {

class ControlPlane {
 public:
  struct Callbacks {
    // A peer's process is gone (monitor thread).
    std::function<void(uint32_t rank)> on_peer_lost;
    // Some rank failed the communicator on purpose (abort, mismatch).
    std::function<void(uint32_t origin, const Status& status)> on_abort;
    // A peer asks about our collective operation `sequence`; returns the
    // answer (monitor thread).
    std::function<std::string(uint64_t sequence)> on_query;
    // The answer of `from` to our query.
    std::function<void(uint32_t from, uint64_t sequence, const std::string& answer)> on_answer;
    // `from` left the communicator cleanly, saying `farewell` (Close).
    std::function<void(uint32_t from, const std::string& farewell)> on_farewell;
  };

  ControlPlane(uint32_t rank, uint32_t size, uint64_t nonce, std::string label);
  ~ControlPlane();

  // Rank 0, before the bootstrap: listens on `local` (port 0) and returns
  // the address for its identity.
  Status OpenListener(const SockAddr& local, std::string* out_address);
  // Builds the star (rank 0 accepts the other ranks, the others connect to
  // rank 0) and starts the monitor thread. Every connection is
  // authenticated both ways: the rank proves knowledge of `secret` with an
  // HMAC over rank 0's challenge, and rank 0 with one over the rank's.
  // Rank 0 serves connections concurrently and drops those that do not
  // prove themselves within kHandshakeTimeoutNs; the error of a deadline
  // that passes names what it refused meanwhile.
  Status Connect(const std::vector<RankIdentity>& table, const Secret& secret, uint64_t deadline_ns,
                 Callbacks callbacks);

  // Every rank contributes `mine`; `*out` gets all contributions by rank.
  // Calls are matched in order across ranks. Fails when the deadline
  // passes or the communicator failed meanwhile.
  Status AllGather(const std::string& mine, uint64_t deadline_ns, std::vector<std::string>* out);

  // Tells every other rank that this one failed the communicator.
  void BroadcastAbort(const Status& status);
  // Asks `to` about its collective operation `sequence`.
  void SendQuery(uint32_t to, uint64_t sequence);
  // Wakes AllGather waiters with `status` (the communicator failed).
  void FailWaiters(const Status& status);

  // Says goodbye (graceful) or not, closes the sockets, stops the monitor.
  // `farewell` goes with the goodbye (to on_farewell of every other rank).
  void Close(bool graceful, const std::string& farewell = std::string());

  // Whether `rank` said goodbye (destroyed its communicator).
  bool Departed(uint32_t rank) const;

 private:
  enum Type : uint32_t {
    kHello = 1,
    kGather = 2,
    kGatherResult = 3,
    kAbort = 4,
    kBye = 5,
    kQuery = 6,
    kAnswer = 7,
    kPeerLost = 8,
  };
  static constexpr uint32_t kEveryone = 0xffffffffu;

  struct Link {
    int fd = -1;
    std::mutex write_mutex;
  };

  Status AcceptRanks(const std::vector<RankIdentity>& table, const Secret& secret,
                     uint64_t deadline_ns);
  Status ConnectToRankZero(const std::vector<RankIdentity>& table, const Secret& secret,
                           uint64_t deadline_ns);
  void Monitor();
  void Handle(uint32_t link_rank, const std::string& frame);
  void LinkClosed(uint32_t link_rank);
  // Sends a message to `to` (rank 0: directly; others: through rank 0).
  void Send(uint32_t to, uint32_t type, const std::string& body);
  void SendOn(uint32_t link_rank, const std::string& frame);
  std::string Frame(uint32_t type, uint32_t from, uint32_t to, const std::string& body) const;
  void DeliverGather(uint64_t id, uint32_t from, std::string data);  // rank 0

  const uint32_t rank_;
  const uint32_t size_;
  const uint64_t nonce_;
  const std::string label_;
  Callbacks callbacks_;

  int listen_fd_ = -1;
  std::vector<std::unique_ptr<Link>> links_;  // rank 0: one per rank; others: [0] = to rank 0
  int wake_fd_ = -1;
  std::thread monitor_;

  mutable std::mutex mutex_;
  std::condition_variable gather_cv_;
  uint64_t next_gather_ = 0;                                 // guarded by mutex_
  std::map<uint64_t, std::vector<std::string>> gathering_;   // rank 0; guarded by mutex_
  std::map<uint64_t, std::vector<uint8_t>> gathering_have_;  // rank 0; guarded by mutex_
  std::map<uint64_t, std::vector<std::string>> gathered_;    // guarded by mutex_
  std::vector<bool> departed_;                               // guarded by mutex_
  Status failure_;                                           // guarded by mutex_
  bool closing_ = false;                                     // guarded by mutex_
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_CONTROL_H_
