// What the algorithms see of the transports: posted sends and receives
// ("requests") of tagged messages between ranks, completed asynchronously,
// and channels that carry them. Three channels exist:
//   LocalChannel   ranks in this process: the second side to arrive copies
//                  (or reduces) straight between the two ranks' buffers;
//   ShmChannel     ranks in other processes of this host: shared-memory
//                  rings polled by the receiver;
//   FabricChannel  anything else: libfabric RDM endpoints, tagged messages.
//
// Tags: every message of an operation carries a 64-bit tag made of the
// sender's rank, the operation's sequence number, a signature of the
// operation (kind, dtype, reduction and a hash of count and root), and the
// step of the algorithm. Messages only match a receive with the same tag,
// so nothing relies on ordering between messages, and ranks that called
// different operations never exchange data (they stall, and the stall is
// diagnosed as a mismatch).
#ifndef TERN_COLLECTIVES_TRANSPORT_H_
#define TERN_COLLECTIVES_TRANSPORT_H_

#include <rdma/fabric.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/status_with_message.h"
#include "tern/comm.h"

namespace tern::comm {

// Tag layout, from the top bit: p2p (1) | sender rank (14) | sequence (16) |
// signature (12) | step (21).
constexpr uint32_t kMaxRanks = 1u << 14;
constexpr uint32_t kMaxSteps = 1u << 21;
inline uint64_t MakeTag(bool p2p, uint32_t src, uint64_t sequence, uint32_t signature,
                        uint32_t step) {
  return (static_cast<uint64_t>(p2p) << 63) | (static_cast<uint64_t>(src & 0x3fff) << 49) |
         ((sequence & 0xffff) << 33) | (static_cast<uint64_t>(signature & 0xfff) << 21) |
         (step & 0x1fffff);
}
inline uint32_t TagSource(uint64_t tag) { return static_cast<uint32_t>((tag >> 49) & 0x3fff); }
inline uint32_t TagStep(uint64_t tag) { return static_cast<uint32_t>(tag & 0x1fffff); }

// Reduction applied by a receive: dst = op(a, incoming).
struct ReduceSpec {
  tern_dtype_t dtype = TERN_DTYPE_F32;
  tern_comm_redop_t op = TERN_COMM_SUM;
  size_t element_size = 4;
};

struct Request {
  enum State : uint32_t { kPending = 0, kBusy = 1, kDone = 2, kFailed = 3 };
  std::atomic<uint32_t> state{kPending};
  bool is_send = false;
  bool reduce = false;        // receive: dst = op(reduce_a, incoming)
  bool reduce_after = false;  // receive landed in `staging`: reduce when it completes
  uint32_t peer = 0;
  uint64_t tag = 0;
  void* buffer = nullptr;  // send: source; receive: destination
  size_t bytes = 0;
  const void* reduce_a = nullptr;
  ReduceSpec spec;
  void* staging = nullptr;  // receive: where the channel puts the data for reduce_after
  Status error;             // set before state becomes kFailed
  // FabricChannel: the provider's context (must be first of its memory).
  alignas(8) fi_context2 context;
  void* channel_data = nullptr;  // channel private

  bool done() const { return state.load(std::memory_order_acquire) >= kDone; }
  void Complete() { state.store(kDone, std::memory_order_release); }
  void Fail(Status status) {
    error = std::move(status);
    state.store(kFailed, std::memory_order_release);
  }
};

class Channel {
 public:
  virtual ~Channel() = default;
  virtual const char* name() const = 0;
  // Whether receives can reduce as the data arrives (req->reduce); when not,
  // the caller gives them a staging buffer and reduces after completion.
  virtual bool FusesReduce() const = 0;
  // Post a send or receive; completion is observed through req->state.
  virtual Status PostSend(Request* req) = 0;
  virtual Status PostRecv(Request* req) = 0;
  // Advances transfers. Returns true if anything moved. A failure of the
  // channel itself is returned through `*error`.
  virtual bool Progress(Status* error) = 0;
  // A fast path for small messages, without requests, for channels that can
  // (tern-shm). SendNow sends the whole message at once and returns true, or
  // returns false (nothing done: post a send instead). RecvNow takes the
  // message `tag` if it is the next to arrive from `peer` and no receive is
  // posted there: dst = op(a, incoming) as `spec` says, or a copy when spec
  // is null; kNotYet: nothing arrived yet; kPost: nothing done, post a
  // receive instead (another message came first, or the size differs).
  enum class Now { kDone, kNotYet, kPost };
  virtual bool SendNow(uint32_t peer, uint64_t tag, const void* data, size_t bytes) {
    (void)peer, (void)tag, (void)data, (void)bytes;
    return false;
  }
  virtual Now RecvNow(uint32_t peer, uint64_t tag, void* dst, const void* a, const ReduceSpec* spec,
                      size_t bytes) {
    (void)peer, (void)tag, (void)dst, (void)a, (void)spec, (void)bytes;
    return Now::kPost;
  }
  // Sleeping until a peer writes, for channels whose peers can wake this
  // rank (tern-shm: a futex in the rank's own segment; see Exec::Spin).
  // ArmDoorbell() counts the caller as a sleeper and returns a ticket; the
  // caller then looks at the channel once more (Progress) and either calls
  // SleepOnDoorbell(ticket, ...), which returns when a peer writes to this
  // rank or frees room in a ring it fills after the ticket was taken, when
  // WakeSleepers() is called, or after `timeout_ns`; or DisarmDoorbell() if
  // that look found work. Peers ring only while someone is counted, so a
  // channel nobody sleeps on costs its writers one load.
  virtual bool CanSleep() const { return false; }
  virtual uint32_t ArmDoorbell() { return 0; }
  virtual void SleepOnDoorbell(uint32_t ticket, uint64_t timeout_ns) {
    (void)ticket, (void)timeout_ns;
  }
  virtual void DisarmDoorbell() {}
  // Ends this rank's sleeps now (a failure, an answer from the control
  // plane). Thread-safety: any thread.
  virtual void WakeSleepers() {}
  // Withdraws a pending request (its operation failed); afterwards the
  // channel never touches it or its buffers.
  virtual void Cancel(Request* req) = 0;
  // Stops the channel for good (the communicator failed): nothing posted is
  // touched afterwards.
  virtual void Shutdown() = 0;
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_TRANSPORT_H_
