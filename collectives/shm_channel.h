// ShmChannel: ranks in other processes of this host, through shared memory
// (tern's own channel, used instead of libfabric's shm provider; see
// docs/collectives.md for why).
//
// Each rank creates one POSIX shared-memory segment with an incoming ring
// per peer on the host; the peers map it after the bootstrap and it is
// unlinked once everyone has (so nothing is left behind, even after a
// crash). A ring has single-producer single-consumer slots: a 64-byte header
// (sequence word, tag, message size, fragment offset and size) followed by
// payload; the first 24 payload bytes share the header's cache line, so a
// small message costs one cache line transfer. The sender copies fragments
// in and publishes each with a release store of its sequence word; the
// receiver polls the next slot's sequence word, and copies (or reduces)
// the fragment straight into the destination. A fragment whose receive is
// not posted stays in the ring until the ring fills up; then it is moved
// aside so that later messages can pass. Sends complete as soon as their
// last fragment is in the ring.
//
// A rank that has waited a while sleeps instead of polling: the last cache
// line of its segment's header is its doorbell, a futex word shared with
// the peers and a count of its sleeping threads. A peer that publishes a
// fragment into one of the rank's rings, or frees room in a ring the rank
// fills, rings the doorbell when the count is not zero (a load and a fence
// otherwise).
#ifndef TERN_COLLECTIVES_SHM_CHANNEL_H_
#define TERN_COLLECTIVES_SHM_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "spin_lock.h"
#include "transport.h"

namespace tern::comm {

class ShmChannel final : public Channel {
 public:
  // Creates this rank's segment with a ring for each of `peers`.
  static Status Create(uint64_t nonce, uint32_t rank, uint32_t size,
                       const std::vector<uint32_t>& peers, std::unique_ptr<ShmChannel>* out);
  ~ShmChannel() override;

  const std::string& segment_name() const { return name_; }
  // A peer's segment as its record names it, with the pid of its
  // authenticated identity (the bootstrap table).
  struct PeerSegment {
    uint32_t rank = 0;
    uint32_t pid = 0;
    std::string name;
  };
  // Maps the peers' segments after checking them: the name must be the one
  // the peer's rank and pid imply, the segment this user's and closed to
  // others, its header this communicator's, and the ring for this rank
  // inside it. Thread-safety: before the channel is used.
  Status Attach(const std::vector<PeerSegment>& peers);
  // Removes this rank's segment name (the mappings stay).
  void Unlink();

  const char* name() const override { return "tern-shm"; }
  bool FusesReduce() const override { return true; }
  Status PostSend(Request* req) override;
  Status PostRecv(Request* req) override;
  bool SendNow(uint32_t peer, uint64_t tag, const void* data, size_t bytes) override;
  Now RecvNow(uint32_t peer, uint64_t tag, void* dst, const void* a, const ReduceSpec* spec,
              size_t bytes) override;
  bool Progress(Status* error) override;
  void Cancel(Request* req) override;
  void Shutdown() override;
  bool CanSleep() const override { return true; }
  uint32_t ArmDoorbell() override;
  void SleepOnDoorbell(uint32_t ticket, uint64_t timeout_ns) override;
  void DisarmDoorbell() override;
  void WakeSleepers() override;

  struct Slot;
  struct Ring;
  struct Doorbell;

 private:
  struct Mapping {
    void* base = nullptr;
    size_t bytes = 0;
  };
  struct Unexpected {
    uint64_t message_bytes = 0;
    std::vector<uint8_t> data;  // the fragments received so far, in order
  };
  struct Incoming {
    Ring* ring = nullptr;
    Doorbell* sender = nullptr;  // rung when this side frees room in `ring`
    uint64_t position = 0;
    std::vector<Request*> posted;
    std::map<uint64_t, Unexpected> unexpected;
  };
  struct Outgoing {
    Ring* ring = nullptr;
    Doorbell* receiver = nullptr;  // rung when a fragment is published in `ring`
    uint64_t position = 0;
    uint64_t tail = 0;  // the consumer's position when last read
    std::deque<Request*> queue;
    uint64_t front_sent = 0;
  };

  ShmChannel() = default;
  bool PollIncoming(Incoming& in, uint32_t peer, Status* error);  // caller holds mutex_
  bool PushOutgoing(Outgoing& out);                               // caller holds mutex_
  // Writes one fragment into the next slot and publishes it; the caller
  // holds mutex_ and checked that the slot is free.
  void WriteSlot(Outgoing& out, uint64_t tag, uint64_t message_bytes, uint64_t offset,
                 const uint8_t* data, uint64_t bytes);
  void Deliver(Request* req, uint64_t offset, const uint8_t* data, uint64_t bytes);

  SpinLock mutex_;  // held for a few copies at most; polled in a loop
  std::string name_;
  bool unlinked_ = true;
  bool shut_ = false;
  uint32_t rank_ = 0;
  uint64_t nonce_ = 0;
  uint32_t slots_ = 0;
  uint32_t slot_bytes_ = 0;
  Mapping own_;
  Doorbell* own_doorbell_ = nullptr;  // in own_
  std::vector<Mapping> mapped_;
  std::vector<Incoming> in_;   // by rank (empty for ranks not on this channel)
  std::vector<Outgoing> out_;  // by rank
  std::vector<uint32_t> peers_;
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_SHM_CHANNEL_H_
