// One rank of a communicator: its peers and the channels that reach them,
// its control plane, its failure state, the flight recorder of its last
// operations, and the execution of an operation (Exec) that the algorithms
// drive.
#ifndef TERN_COLLECTIVES_COMMUNICATOR_H_
#define TERN_COLLECTIVES_COMMUNICATOR_H_

#include <absl/container/inlined_vector.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap.h"
#include "comm_config.h"
#include "control.h"
#include "local_channel.h"
#include "spin_lock.h"
#include "src/runtime/runtime_state.h"
#include "transport.h"

namespace tern::comm {

enum class OpKind : uint8_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kReduce = 3,
  kAllGather = 4,
  kReduceScatter = 5,
  kAllToAll = 6,
  kSend = 7,
  kRecv = 8,
  kBarrier = 9,
  kGroup = 10,    // sends and receives of one group
  kRecvAny = 11,  // a receive from whichever rank sends (tern_comm_recv_any)
};
const char* OpKindName(OpKind kind);
// Sends and receives (numbered per peer), as opposed to collectives
// (numbered per communicator).
inline bool IsPointToPoint(OpKind kind) {
  return kind == OpKind::kSend || kind == OpKind::kRecv || kind == OpKind::kGroup ||
         kind == OpKind::kRecvAny;
}

// The sequence of a receive enqueued while a receive from any source is
// pending: it is numbered when it runs (Communicator::TakeRecvSequence).
constexpr uint64_t kSequenceAtRunTime = UINT64_MAX;

// A send or receive inside a group.
struct P2P {
  bool is_send = false;
  uint32_t peer = 0;
  uint8_t* buffer = nullptr;
  uint64_t count = 0;
  tern_dtype_t dtype = TERN_DTYPE_F32;
  uint64_t sequence = 0;  // per peer and direction
};

struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  tern_dtype_t dtype = TERN_DTYPE_F32;
  tern_comm_redop_t redop = TERN_COMM_SUM;
  uint64_t count = 0;
  uint32_t root = 0;        // root, or peer of send/recv
  uint8_t* send = nullptr;  // engine addresses of the device ranges
  uint8_t* recv = nullptr;
  uint64_t sequence = 0;  // collectives: per communicator; send/recv: per peer and direction
  uint32_t signature = 0;
  std::vector<P2P> group;        // kGroup
  uint32_t* out_peer = nullptr;  // kRecvAny: where the sender's rank goes (host memory)
};

// "all_reduce sum f32 count=1024", "broadcast f32 count=4 root=1", ...
std::string Describe(const OpDesc& op);
// Signature bits of the tags (see transport.h).
uint32_t Signature(OpKind kind, tern_dtype_t dtype, tern_comm_redop_t redop, uint64_t count,
                   uint32_t root);

// The last operations of a communicator, for diagnosis: dumped to the log
// when an operation times out, and read by peers asking what this rank did.
class FlightRecorder {
 public:
  enum State : uint8_t { kEnqueued, kRunning, kDone, kFailed, kSkipped };
  struct Record {
    OpKind kind;
    tern_dtype_t dtype;
    tern_comm_redop_t redop;
    uint64_t count;
    uint32_t root;
    uint64_t sequence;
    uint64_t id;  // position in the recorder, for updates
    State state;
    tern_status_t code;
    uint64_t enqueued_ns, started_ns, finished_ns;
  };
  static constexpr size_t kCapacity = 128;

  uint64_t Add(const OpDesc& op);
  void Start(uint64_t id);
  // When the operation first read the clock (it does only once it waits).
  void SetStartTime(uint64_t id, uint64_t now_ns);
  void Finish(uint64_t id, State state, tern_status_t code);
  // The collective with this sequence, if still recorded.
  bool FindCollective(uint64_t sequence, Record* out) const;
  // Last collective sequence enqueued and completed (UINT64_MAX: none).
  void Progress(uint64_t* last_enqueued, uint64_t* last_completed) const;
  std::string Dump() const;

 private:
  mutable SpinLock mutex_;
  Record records_[kCapacity];
  uint64_t next_ = 0;
  uint64_t last_enqueued_ = UINT64_MAX;
  uint64_t last_completed_ = UINT64_MAX;
};

class Communicator;

// Runs one operation: posts sends and receives, waits for them while
// driving the channels, and turns stalls into diagnoses and timeouts.
class Exec {
 public:
  // `record`: the operation's entry in the flight recorder.
  Exec(Communicator* comm, const OpDesc& op, uint64_t record);
  ~Exec();
  Exec(const Exec&) = delete;
  Exec& operator=(const Exec&) = delete;

  uint32_t rank() const;
  uint32_t size() const;
  Communicator* comm() const { return comm_; }
  const OpDesc& op() const { return op_; }
  const CommConfig& config() const;
  size_t element_size() const { return element_size_; }

  // Posts a message of `bytes` to / from `peer`; `step` tells the messages
  // of one operation between two ranks apart (both sides use the same).
  Request* Send(uint32_t peer, uint32_t step, const void* buffer, size_t bytes);
  Request* Recv(uint32_t peer, uint32_t step, void* buffer, size_t bytes);
  // Receives and reduces: dst = op(a, incoming), where a may be dst.
  Request* RecvReduce(uint32_t peer, uint32_t step, void* dst, const void* a, size_t bytes);
  // P2P messages carry their own tag.
  Request* SendTagged(uint32_t peer, uint64_t tag, const void* buffer, size_t bytes);
  Request* RecvTagged(uint32_t peer, uint64_t tag, void* buffer, size_t bytes);

  // The fast path for small messages (Channel::SendNow, RecvNow): SendNow
  // returns true when the message left at once, without a request.
  // RecvReduceNow polls the peer's channel alone for a short while and
  // returns true once the message was received and reduced (dst = op(a,
  // incoming)); false: nothing happened, use RecvReduce and Wait.
  bool SendNow(uint32_t peer, uint32_t step, const void* buffer, size_t bytes);
  bool RecvReduceNow(uint32_t peer, uint32_t step, void* dst, const void* a, size_t bytes);

  Status Wait(Request* req);
  Status WaitAll();
  // Memory for the operation's temporaries; valid until the Exec ends.
  uint8_t* Scratch(size_t bytes);
  // Direct access (every peer's device memory is mapped here): where device
  // memory offset 0 of `rank` is in this process.
  bool direct() const;
  uint8_t* PeerBase(uint32_t rank) const;
  uint64_t PeerBytes(uint32_t rank) const;
  void ReduceLocal(void* dst, const void* a, const void* b, uint64_t count) const;

 private:
  friend class Communicator;
  Request* NewRequest();
  Request* Post(Request* req);
  template <typename Done>
  Status Spin(Done done);
  // The clock is read only once the operation waits (most small ones never
  // do long enough): its first reading starts the timeout and stall checks.
  void StartClock(uint64_t now);
  Status CheckStall(uint64_t now);
  Status TimeoutStatus();
  std::string WaitingFor() const;
  uint64_t YieldAfterNs() const;
  // The channel to sleep on until a peer writes (Spin), or null: only when
  // every pending request can be woken that way.
  Channel* SleepChannel() const;
  void ReleaseStaging(Request* req);

  Communicator* comm_;
  const OpDesc& op_;
  size_t element_size_;
  bool p2p_;
  uint64_t record_;
  uint64_t start_ns_ = 0;  // 0 until StartClock
  uint64_t deadline_ns_ = UINT64_MAX;
  uint64_t next_stall_check_ns_ = UINT64_MAX;
  uint32_t answers_seen_ = 0;
  Status failure_;
  absl::InlinedVector<Request*, 8> requests_;
  std::vector<std::pair<void*, size_t>> staging_;  // held for reduce_after receives
};

struct InitParams {
  std::shared_ptr<CoreObject> core;
  tern_core_t core_handle = nullptr;
  uint32_t size = 0;
  uint32_t rank = 0;
  UniqueId id;
  CommConfig config;
  std::string name;
};

class Communicator {
 public:
  static Status Create(const InitParams& params, std::shared_ptr<Communicator>* out);
  ~Communicator();

  uint32_t rank() const { return rank_; }
  uint32_t size() const { return size_; }
  uint64_t nonce() const { return nonce_; }
  const std::string& label() const { return label_; }
  const CommConfig& config() const { return config_; }
  const std::shared_ptr<CoreObject>& core() const { return core_; }
  tern_core_t core_handle() const { return core_handle_; }
  const std::vector<RankIdentity>& peers() const { return peers_; }
  std::string PeerName(uint32_t rank) const;  // "rank 2 (host h, pid 123)"
  const std::string& transport() const { return transport_; }
  // Whether every peer's device memory is reachable from here (ranks of
  // this process, and ranks of this host over tern-shm with their device
  // memory mapped); TERN_COMM_DIRECT=0 turns it off.
  bool direct() const { return direct_; }
  uint8_t* peer_base(uint32_t rank) const { return peer_base_[rank]; }
  // The bytes of `rank`'s device memory reachable at peer_base(rank).
  uint64_t peer_bytes(uint32_t rank) const { return peer_bytes_[rank]; }
  uint32_t local_rank() const { return local_rank_; }
  uint64_t yield_after_ns() const { return yield_after_ns_; }
  uint32_t local_size() const { return local_size_; }
  uint32_t node_count() const { return node_count_; }

  // Enqueue-time numbering (called in enqueue order).
  uint64_t NextCollectiveSequence() {
    return next_sequence_.fetch_add(1, std::memory_order_relaxed);
  }
  // The sequence of the next send to / receive from `peer`; for a receive,
  // kSequenceAtRunTime while a receive from any source is pending.
  uint64_t NextP2PSequence(uint32_t peer, bool send);
  // Enqueue time of a receive from any source: receives enqueued after it
  // (until it and they have run) are numbered when they run.
  void AddRunTimeReceive();
  // Run time, in queue order: the sequence of a receive from `peer` that was
  // enqueued as kSequenceAtRunTime (or of a receive from any source that
  // found `peer`).
  uint64_t TakeRecvSequence(uint32_t peer);
  // Run time: finds a rank with a send for this one that no receive has
  // taken, asking the peers over the control plane until one has or the
  // timeout passes; numbers the receive (TakeRecvSequence) and returns the
  // rank in `*out_peer` and the sequence in `*out_sequence`.
  Status FindSender(uint32_t* out_peer, uint64_t* out_sequence);

  // Runs an operation: the body of its queue command.
  Status Run(const OpDesc& op, uint64_t record);
  FlightRecorder& recorder() { return recorder_; }

  // Marks the communicator failed (first failure wins), stops its channels,
  // and with `broadcast` tells the other ranks.
  void Fail(const Status& status, bool broadcast);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status failure() const;

  // Operations enqueued and not yet finished.
  void AddInflight() { inflight_.fetch_add(1, std::memory_order_relaxed); }
  void RemoveInflight();
  // Waits for in-flight operations, then says goodbye (or not) and stops.
  void Close(bool graceful);

  // Split: the control-plane exchange of colors and keys, then the new
  // communicator's own bootstrap.
  Status Split(int32_t color, int32_t key, const CommConfig& config, const std::string& name,
               std::shared_ptr<Communicator>* out);

 private:
  friend class Exec;
  Communicator() = default;
  Status Init(const InitParams& params);
  // Channels to every peer (communicator.cc): SetUpChannels runs the steps.
  enum class Reach : uint8_t;
  struct PeerLayout;
  struct Transports;
  struct PeerRecord;
  Status SetUpChannels(uint64_t deadline_ns);
  PeerLayout LocatePeers();  // and local_rank_, local_size_, node_count_
  Status OpenChannels(const PeerLayout& layout, Transports* out);
  Status ExchangeAddresses(const Transports& transports, uint64_t deadline_ns,
                           std::vector<std::string>* records);
  Status MapPeerMemory(uint32_t peer, Reach reach, const Transports& transports,
                       const PeerRecord& record, bool direct);
  void SettleTransport(bool direct);  // direct_, transport_, progress_, yield_after_ns_
  std::string AnswerQuery(uint64_t sequence);
  void OnAnswer(uint32_t from, uint64_t sequence, const std::string& answer);
  void OnPeerLost(uint32_t rank);
  // TakeRecvSequence with p2p_mutex_ held.
  uint64_t TakeRecvSequenceLocked(uint32_t peer);
  // `from` has enqueued `sends` sends to this rank (an answer or a farewell):
  // keeps the largest count heard and wakes FindSender.
  void NoteSendsToMe(uint32_t from, uint64_t sends);

  uint32_t rank_ = 0;
  uint32_t size_ = 0;
  uint64_t nonce_ = 0;
  Secret secret_;  // authenticates the control connections; split derives from it
  std::string label_;
  CommConfig config_;
  std::shared_ptr<CoreObject> core_;
  tern_core_t core_handle_ = nullptr;
  std::vector<RankIdentity> peers_;
  std::string transport_;
  uint32_t local_rank_ = 0, local_size_ = 1, node_count_ = 1;
  uint64_t yield_after_ns_ = 20000;

  std::unique_ptr<ControlPlane> control_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<Channel*> channel_of_;  // by rank
  std::vector<Channel*> progress_;    // channels that need polling
  Channel* local_channel_ = nullptr;
  // progress_'s only channel when its peers can wake a sleeping rank
  // (tern-shm); null otherwise (libfabric needs polling).
  Channel* sleep_channel_ = nullptr;
  // How long Exec::Spin's recent waits took (a moving average): where they
  // were long, a waiter sleeps early.
  std::atomic<uint64_t> typical_wait_ns_{0};
  bool direct_ = false;
  std::vector<uint8_t*> peer_base_;                  // by rank; null when not reachable
  std::vector<uint64_t> peer_bytes_;                 // by rank: what peer_base_ reaches
  std::vector<std::pair<void*, size_t>> peer_maps_;  // other processes' device memory

  std::atomic<uint64_t> next_sequence_{0};
  std::mutex p2p_mutex_;
  std::vector<uint64_t> p2p_send_, p2p_recv_;  // guarded by p2p_mutex_
  // Receives (from any source, and those enqueued after one) not yet
  // numbered; while > 0, new receives are numbered at run time.
  uint64_t run_time_receives_ = 0;  // guarded by p2p_mutex_
  // What each peer last said about its sends to this rank (FindSender): how
  // many it has enqueued. Guarded by p2p_mutex_.
  std::vector<uint64_t> peer_sends_to_me_;
  std::condition_variable peer_sends_cv_;  // with p2p_mutex_: a new answer

  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mutex_;
  Status failure_;  // guarded by failure_mutex_

  FlightRecorder recorder_;

  std::mutex inflight_mutex_;
  std::condition_variable inflight_cv_;
  std::atomic<int64_t> inflight_{0};
  std::atomic<bool> closing_{false};  // someone waits on inflight_cv_
  bool closed_ = false;               // guarded by inflight_mutex_

  // Answers of peers to our diagnosis queries: by peer, the latest one.
  mutable std::mutex answers_mutex_;
  struct Answer {
    uint64_t sequence = 0;
    std::string data;
  };
  std::map<uint32_t, Answer> answers_;  // guarded by answers_mutex_
  std::atomic<uint32_t> answers_version_{0};
};

}  // namespace tern::comm

namespace tern {
// What the runtime's handle table holds for a communicator handle.
struct CommObject {
  std::shared_ptr<comm::Communicator> comm;
};
}  // namespace tern

#endif  // TERN_COLLECTIVES_COMMUNICATOR_H_
