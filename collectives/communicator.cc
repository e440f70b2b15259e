#include "communicator.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "algorithms.h"
#include "comm_kernels.h"
#include "common/logging.h"
#include "common/timeline.h"
#include "fabric_channel.h"
#include "shm_channel.h"

namespace tern::comm {

// --- Names and signatures ---------------------------------------------------

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kGroup:
      return "group";
    case OpKind::kRecvAny:
      return "recv_any";
  }
  return "unknown";
}

namespace {

bool HasRedop(OpKind kind) {
  return kind == OpKind::kAllReduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
}
bool HasRoot(OpKind kind) { return kind == OpKind::kBroadcast || kind == OpKind::kReduce; }

std::string DescribeFields(OpKind kind, tern_dtype_t dtype, tern_comm_redop_t redop, uint64_t count,
                           uint32_t root) {
  std::string text = OpKindName(kind);
  if (kind == OpKind::kBarrier || kind == OpKind::kGroup) return text;
  if (HasRedop(kind)) text += fmt::format(" {}", RedopName(redop));
  text += fmt::format(" {} count={}", tern_dtype_name(dtype), count);
  if (HasRoot(kind)) text += fmt::format(" root={}", root);
  if (kind == OpKind::kSend || kind == OpKind::kRecv) text += fmt::format(" peer={}", root);
  if (kind == OpKind::kRecvAny) text += " peer=any";
  return text;
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

}  // namespace

std::string Describe(const OpDesc& op) {
  if (op.kind == OpKind::kGroup)
    return fmt::format("group of {} sends and receives", op.group.size());
  return DescribeFields(op.kind, op.dtype, op.redop, op.count, op.root);
}

uint32_t Signature(OpKind kind, tern_dtype_t dtype, tern_comm_redop_t redop, uint64_t count,
                   uint32_t root) {
  // Sends and receives must carry the same signature to match.
  const uint32_t k = (kind == OpKind::kSend || kind == OpKind::kRecv || kind == OpKind::kRecvAny)
                         ? 7u
                         : static_cast<uint32_t>(kind);
  const uint32_t r =
      HasRedop(kind)
          ? (static_cast<uint32_t>(redop) == TERN_COMM_AVG ? 0u : static_cast<uint32_t>(redop))
          : 0u;
  const uint32_t hash =
      static_cast<uint32_t>(Mix(count * 1000003u + (HasRoot(kind) ? root : 0u)) & 3u);
  return ((k & 0xf) << 8) | ((static_cast<uint32_t>(dtype) & 0x7) << 5) | ((r & 0x7) << 2) | hash;
}

// --- FlightRecorder -----------------------------------------------------------

uint64_t FlightRecorder::Add(const OpDesc& op) {
  std::lock_guard<SpinLock> lock(mutex_);
  const uint64_t id = next_++;
  Record& r = records_[id % kCapacity];
  r = Record{op.kind, op.dtype,  op.redop, op.count, op.root, op.sequence,
             id,      kEnqueued, TERN_OK,  0,        0};
  if (!IsPointToPoint(op.kind)) last_enqueued_ = op.sequence;
  return id;
}

void FlightRecorder::Start(uint64_t id) {
  std::lock_guard<SpinLock> lock(mutex_);
  Record& r = records_[id % kCapacity];
  if (r.id != id) return;
  r.state = kRunning;
}

void FlightRecorder::SetStartTime(uint64_t id, uint64_t now_ns) {
  std::lock_guard<SpinLock> lock(mutex_);
  Record& r = records_[id % kCapacity];
  if (r.id == id) r.started_ns = now_ns;
}

void FlightRecorder::Finish(uint64_t id, State state, tern_status_t code) {
  std::lock_guard<SpinLock> lock(mutex_);
  Record& r = records_[id % kCapacity];
  if (r.id != id) return;
  r.state = state;
  r.code = code;
  // How long an operation took matters in the dump when it failed; a clock
  // read per successful operation is not worth it.
  if (state != kDone) r.finished_ns = MonotonicNs();
  if (state == kDone && !IsPointToPoint(r.kind)) {
    if (last_completed_ == UINT64_MAX || r.sequence > last_completed_) last_completed_ = r.sequence;
  }
}

bool FlightRecorder::FindCollective(uint64_t sequence, Record* out) const {
  std::lock_guard<SpinLock> lock(mutex_);
  const uint64_t first = next_ > kCapacity ? next_ - kCapacity : 0;
  for (uint64_t id = first; id < next_; ++id) {
    const Record& r = records_[id % kCapacity];
    if (IsPointToPoint(r.kind)) continue;
    if (r.sequence == sequence) {
      *out = r;
      return true;
    }
  }
  return false;
}

void FlightRecorder::Progress(uint64_t* last_enqueued, uint64_t* last_completed) const {
  std::lock_guard<SpinLock> lock(mutex_);
  *last_enqueued = last_enqueued_;
  *last_completed = last_completed_;
}

std::string FlightRecorder::Dump() const {
  std::lock_guard<SpinLock> lock(mutex_);
  static const char* const kStates[] = {"enqueued", "running", "done", "failed", "skipped"};
  std::string text;
  const uint64_t first = next_ > kCapacity ? next_ - kCapacity : 0;
  const uint64_t now = MonotonicNs();
  for (uint64_t id = first; id < next_; ++id) {
    const Record& r = records_[id % kCapacity];
    const bool p2p = r.kind == OpKind::kSend || r.kind == OpKind::kRecv;
    const bool any = r.kind == OpKind::kRecvAny;
    text +=
        fmt::format("\n  {}#{} {}: {}", p2p ? "p2p " : "",
                    any ? std::string("?") : fmt::format("{}", r.sequence),
                    DescribeFields(r.kind, r.dtype, r.redop, r.count, r.root), kStates[r.state]);
    if (r.state == kRunning && r.started_ns != 0) {
      text += fmt::format(" ({:.3f} ms so far)", static_cast<double>(now - r.started_ns) / 1e6);
    } else if (r.state == kFailed && r.started_ns != 0 && r.finished_ns >= r.started_ns) {
      text += fmt::format(" (after {:.3f} ms)",
                          static_cast<double>(r.finished_ns - r.started_ns) / 1e6);
    }
    if (r.code != TERN_OK) text += fmt::format(" {}", tern_status_string(r.code));
  }
  return text.empty() ? std::string("\n  (no operations)") : text;
}

// --- Exec ---------------------------------------------------------------------

namespace {

// Per thread: requests and staging memory are reused from one operation to
// the next (an operation runs on one queue thread).
struct ThreadPools;
// initial-exec: libtern is a shared library, and the default TLS model costs
// a __tls_get_addr call per access on the hot path. The pools are reached
// through a plain pointer: a thread_local with a destructor is reached
// through a guard variable that the default model looks up with that call.
thread_local ThreadPools* t_pools_ptr __attribute__((tls_model("initial-exec"))) = nullptr;
struct ThreadPools {
  std::vector<Request*> free_requests;
  std::vector<std::pair<void*, size_t>> free_memory;
  ~ThreadPools() {
    t_pools_ptr = nullptr;
    for (Request* r : free_requests) delete r;
    for (auto& [p, n] : free_memory) std::free(p);
  }
};
thread_local std::unique_ptr<ThreadPools> t_pools_owner;  // frees them at thread exit

[[gnu::noinline]] ThreadPools& CreatePools() {
  t_pools_owner = std::make_unique<ThreadPools>();
  t_pools_ptr = t_pools_owner.get();
  return *t_pools_ptr;
}

ThreadPools& Pools() {
  ThreadPools* pools = t_pools_ptr;
  return pools != nullptr ? *pools : CreatePools();
}

void* AcquireMemory(size_t bytes) {
  auto& pool = Pools().free_memory;
  size_t best = pool.size();
  for (size_t i = 0; i < pool.size(); ++i) {
    if (pool[i].second >= bytes && (best == pool.size() || pool[i].second < pool[best].second))
      best = i;
  }
  if (best != pool.size()) {
    void* p = pool[best].first;
    pool.erase(pool.begin() + static_cast<ptrdiff_t>(best));
    return p;
  }
  const size_t rounded = std::max<size_t>(4096, (bytes + 4095) & ~size_t{4095});
  void* p = std::aligned_alloc(64, rounded);
  return p;
}

size_t AllocatedSize(size_t bytes) {
  return std::max<size_t>(4096, (bytes + 4095) & ~size_t{4095});
}

void ReleaseMemory(void* p, size_t bytes) {
  if (p == nullptr) return;
  // Cap what a thread keeps: 256 MiB.
  size_t kept = 0;
  ThreadPools& pools = Pools();
  for (auto& [q, n] : pools.free_memory) kept += n;
  if (kept + bytes > (256u << 20)) {
    std::free(p);
    return;
  }
  pools.free_memory.emplace_back(p, bytes);
}

}  // namespace

Exec::Exec(Communicator* comm, const OpDesc& op, uint64_t record)
    : comm_(comm),
      op_(op),
      element_size_(std::max<size_t>(1, tern_dtype_size(op.dtype))),
      p2p_(IsPointToPoint(op.kind)),
      record_(record) {
  answers_seen_ = comm->answers_version_.load(std::memory_order_acquire);
}

void Exec::StartClock(uint64_t now) {
  start_ns_ = now;
  deadline_ns_ = now + comm_->config().timeout_ns;
  next_stall_check_ns_ = now + comm_->config().stall_check_ns;
  comm_->recorder_.SetStartTime(record_, now);
}

Exec::~Exec() {
  bool pending = false;
  for (Request* r : requests_) pending |= !r->done();
  if (pending) {
    if (!comm_->failed()) {
      comm_->Fail(failure_.ok() ? MakeStatus(TERN_ERROR_INTERNAL,
                                             "an operation ended with messages in flight")
                                : failure_,
                  /*broadcast=*/true);
    }
    for (Request* r : requests_) {
      if (!r->done()) comm_->channel_of_[r->peer]->Cancel(r);
    }
  }
  for (auto& [p, n] : staging_) ReleaseMemory(p, n);
  if (requests_.empty()) return;
  ThreadPools& pools = Pools();
  for (Request* r : requests_) {
    if (r->staging != nullptr && r->reduce_after)
      ReleaseMemory(r->staging, AllocatedSize(r->bytes));
    pools.free_requests.push_back(r);
  }
}

uint32_t Exec::rank() const { return comm_->rank(); }
uint32_t Exec::size() const { return comm_->size(); }
const CommConfig& Exec::config() const { return comm_->config(); }

Request* Exec::NewRequest() {
  Request* r;
  ThreadPools& pools = Pools();
  if (!pools.free_requests.empty()) {
    r = pools.free_requests.back();
    pools.free_requests.pop_back();
    r->state.store(Request::kPending, std::memory_order_relaxed);
    r->is_send = false;
    r->reduce = false;
    r->reduce_after = false;
    r->reduce_a = nullptr;
    r->staging = nullptr;
    if (!r->error.ok()) r->error = Status();
    r->channel_data = nullptr;
  } else {
    r = new Request();
  }
  requests_.push_back(r);
  return r;
}

Request* Exec::Post(Request* req) {
  Channel* channel = comm_->channel_of_[req->peer];
  if (channel == nullptr) {
    req->Fail(MakeStatus(TERN_ERROR_INTERNAL, "no channel to rank {}", req->peer));
    return req;
  }
  Status status = req->is_send ? channel->PostSend(req) : channel->PostRecv(req);
  if (!status.ok()) req->Fail(status);
  return req;
}

Request* Exec::SendTagged(uint32_t peer, uint64_t tag, const void* buffer, size_t bytes) {
  Request* r = NewRequest();
  r->is_send = true;
  r->peer = peer;
  r->tag = tag;
  r->buffer = const_cast<void*>(buffer);
  r->bytes = bytes;
  return Post(r);
}

Request* Exec::RecvTagged(uint32_t peer, uint64_t tag, void* buffer, size_t bytes) {
  Request* r = NewRequest();
  r->peer = peer;
  r->tag = tag;
  r->buffer = buffer;
  r->bytes = bytes;
  return Post(r);
}

Request* Exec::Send(uint32_t peer, uint32_t step, const void* buffer, size_t bytes) {
  return SendTagged(peer, MakeTag(false, rank(), op_.sequence, op_.signature, step), buffer, bytes);
}

Request* Exec::Recv(uint32_t peer, uint32_t step, void* buffer, size_t bytes) {
  return RecvTagged(peer, MakeTag(false, peer, op_.sequence, op_.signature, step), buffer, bytes);
}

Request* Exec::RecvReduce(uint32_t peer, uint32_t step, void* dst, const void* a, size_t bytes) {
  Request* r = NewRequest();
  r->peer = peer;
  r->tag = MakeTag(false, peer, op_.sequence, op_.signature, step);
  r->buffer = dst;
  r->bytes = bytes;
  r->reduce_a = a;
  r->spec = ReduceSpec{op_.dtype, op_.redop, element_size_};
  Channel* channel = comm_->channel_of_[peer];
  if (channel != nullptr && channel->FusesReduce()) {
    r->reduce = true;
  } else {
    r->reduce_after = true;
    r->staging = AcquireMemory(bytes);
  }
  return Post(r);
}

bool Exec::SendNow(uint32_t peer, uint32_t step, const void* buffer, size_t bytes) {
  Channel* channel = comm_->channel_of_[peer];
  return channel != nullptr &&
         channel->SendNow(peer, MakeTag(false, rank(), op_.sequence, op_.signature, step), buffer,
                          bytes);
}

bool Exec::RecvReduceNow(uint32_t peer, uint32_t step, void* dst, const void* a, size_t bytes) {
  Channel* channel = comm_->channel_of_[peer];
  if (channel == nullptr) return false;
  const uint64_t tag = MakeTag(false, peer, op_.sequence, op_.signature, step);
  const ReduceSpec spec{op_.dtype, op_.redop, element_size_};
  // A few microseconds at most: a peer that is late (or gone, or failed) is
  // left to the general path, which watches for all of that, and yields the
  // CPU soon where ranks share CPUs (so polls less here too).
  const int budget = comm_->yield_after_ns() < 1000000 ? 256 : 4096;
  for (int polls = 0; polls < budget; ++polls) {
    switch (channel->RecvNow(peer, tag, dst, a, &spec, bytes)) {
      case Channel::Now::kDone:
        return true;
      case Channel::Now::kPost:
        return false;
      case Channel::Now::kNotYet:
        break;
    }
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  return false;
}

uint8_t* Exec::Scratch(size_t bytes) {
  const size_t n = AllocatedSize(bytes);
  void* p = AcquireMemory(bytes);
  staging_.emplace_back(p, n);
  return static_cast<uint8_t*>(p);
}

bool Exec::direct() const { return comm_->direct(); }
uint8_t* Exec::PeerBase(uint32_t rank) const { return comm_->peer_base(rank); }
uint64_t Exec::PeerBytes(uint32_t rank) const { return comm_->peer_bytes(rank); }

void Exec::ReduceLocal(void* dst, const void* a, const void* b, uint64_t count) const {
  Reduce(dst, a, b, count, op_.dtype, op_.redop);
}

uint64_t Exec::YieldAfterNs() const {
  // Ranks of this process may share our CPU (their queue threads and the
  // threads that enqueue): yield soon when waiting for one of them.
  for (const Request* r : requests_) {
    if (!r->done() && comm_->channel_of_[r->peer] == comm_->local_channel_) return 20000;
  }
  return comm_->yield_after_ns();
}

Channel* Exec::SleepChannel() const {
  if (comm_->sleep_channel_ == nullptr) return nullptr;
  // Ranks of this process complete requests without ringing anything.
  for (const Request* r : requests_) {
    if (!r->done() && comm_->channel_of_[r->peer] == comm_->local_channel_) return nullptr;
  }
  return comm_->sleep_channel_;
}

std::string Exec::WaitingFor() const {
  std::set<uint32_t> peers;
  for (const Request* r : requests_) {
    if (!r->done()) peers.insert(r->peer);
  }
  std::string text;
  size_t shown = 0;
  for (uint32_t p : peers) {
    if (++shown > 8) {
      text += fmt::format(" and {} more", peers.size() - 8);
      break;
    }
    text += fmt::format("{}{}", text.empty() ? "" : ", ", comm_->PeerName(p));
  }
  return text;
}

// When a waiter sleeps on a channel that can ring it (Spin). A
// communicator's waits are short (a peer answering a small message, the
// chunks of a pipelined transfer: microseconds) or long (a rank that
// reached the operation first waiting for the last one: a good part of a
// millisecond in a training step, where it used to poll on a CPU that the
// late rank's host and engine threads needed). Where its recent waits were
// long, a waiter sleeps after kSleepAfterNs; otherwise it polls for
// kPollForNs first, as it did before it could sleep: sleeping early in a
// loop of 8-byte all-reduces (two ranks on two shared CPUs) took each one
// from 17 to 200 us, every sleep making the other rank late and every
// wake-up of a sleeping virtual CPU costing as much. The longest sleep is
// bounded too, though a peer's write, a failure or a control-plane answer
// ends it: the bound is what a peer that never rings can cost.
constexpr uint64_t kSleepAfterNs = 50000;
constexpr uint64_t kLongWaitNs = 400000;
constexpr uint64_t kPollForNs = 2000000;
constexpr uint64_t kLongestDoorbellSleepNs = 100000000;

template <typename Done>
Status Exec::Spin(Done done) {
  uint32_t spins = 0;
  uint64_t idle_since = 0;
  uint64_t first_look = 0;  // the clock's first reading in this wait
  const uint64_t sleep_after =
      comm_->typical_wait_ns_.load(std::memory_order_relaxed) >= kLongWaitNs ? kSleepAfterNs
                                                                             : kPollForNs;
  while (!done()) {
    bool progressed = false;
    for (Channel* channel : comm_->progress_) {
      Status error;
      progressed |= channel->Progress(&error);
      if (!error.ok()) {
        failure_ = error;
        comm_->Fail(error, true);
        return error;
      }
    }
    if (done()) break;
    if (progressed) {
      idle_since = 0;
      continue;
    }
    if ((++spins & 63) != 0) continue;
    if (comm_->failed()) {
      Status why = comm_->failure();
      const std::string waiting = WaitingFor();
      failure_ = waiting.empty()
                     ? why
                     : Status(why.code(), fmt::format("{} (this rank was waiting for {})",
                                                      why.message(), waiting));
      return failure_;
    }
    const uint64_t now = MonotonicNs();
    if (start_ns_ == 0) StartClock(now);
    if (first_look == 0) first_look = now;
    if (now >= deadline_ns_) return TimeoutStatus();
    if (now >= next_stall_check_ns_ ||
        comm_->answers_version_.load(std::memory_order_acquire) != answers_seen_) {
      Status stall = CheckStall(now);
      if (!stall.ok()) return stall;
    }
    // Back off when nothing moves: yield the CPU to the ranks we wait for
    // (soon when this host has more ranks than CPUs, so a rank sharing our
    // CPU can run; late otherwise, since yielding to an unrelated thread
    // costs a whole time slice), then sleep: until a peer writes where the
    // channel can ring us, else briefly.
    if (idle_since == 0) idle_since = now;
    const uint64_t idle = now - idle_since;
    Channel* sleep_channel = idle > sleep_after ? SleepChannel() : nullptr;
    if (sleep_channel != nullptr) {
      const uint32_t ticket = sleep_channel->ArmDoorbell();
      // The last look, after the ticket: a write before it is seen here, a
      // write after it ends the sleep.
      Status error;
      const bool moved = sleep_channel->Progress(&error);
      if (moved || !error.ok() || done() || comm_->failed() ||
          comm_->answers_version_.load(std::memory_order_acquire) != answers_seen_) {
        sleep_channel->DisarmDoorbell();
        continue;  // the loop's next round handles it
      }
      const uint64_t until =
          std::min({deadline_ns_, next_stall_check_ns_, now + kLongestDoorbellSleepNs});
      sleep_channel->SleepOnDoorbell(ticket, until > now ? until - now : 1);
    } else if (idle > kPollForNs) {
      const timespec pause{0, 50000};
      nanosleep(&pause, nullptr);
    } else if (idle > YieldAfterNs()) {
      sched_yield();
    }
  }
  // A moving average, updated without ordering (the communicator's
  // operations run one at a time; a rough figure is all Spin needs). A wait
  // that ended before the clock was read counts as none.
  const uint64_t took = first_look == 0 ? 0 : MonotonicNs() - first_look;
  const uint64_t typical = comm_->typical_wait_ns_.load(std::memory_order_relaxed);
  comm_->typical_wait_ns_.store((3 * typical + std::min(took, 2 * kPollForNs)) / 4,
                                std::memory_order_relaxed);
  return OkStatus();
}

Status Exec::Wait(Request* req) {
  if (!req->done()) {
    Status status = Spin([req] { return req->done(); });
    if (!status.ok()) return status;
  }
  if (req->state.load(std::memory_order_acquire) == Request::kFailed) {
    Status error = req->error;
    if (error.code() != TERN_ERROR_COMM_MISMATCH && !comm_->failed()) {
      // A transfer that breaks usually means the peer died; its control
      // connection tells which within moments, and that is the better error.
      const uint64_t until = MonotonicNs() + 1000000000ull;
      while (!comm_->failed() && MonotonicNs() < until) {
        const timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
      }
    }
    if (comm_->failed()) {
      Status why = comm_->failure();
      failure_ = Status(why.code(), fmt::format("{} (this rank was waiting for {})", why.message(),
                                                comm_->PeerName(req->peer)));
      return failure_;
    }
    failure_ =
        Status(error.code(), fmt::format("{} ({})", error.message(), comm_->PeerName(req->peer)));
    comm_->Fail(failure_, true);
    return failure_;
  }
  if (req->reduce_after) {
    Reduce(req->buffer, req->reduce_a, req->staging, req->bytes / element_size_, op_.dtype,
           op_.redop);
    ReleaseMemory(req->staging, AllocatedSize(req->bytes));
    req->staging = nullptr;
    req->reduce_after = false;
  }
  return OkStatus();
}

Status Exec::WaitAll() {
  for (Request* r : requests_) TERN_RETURN_IF_ERROR(Wait(r));
  return OkStatus();
}

Status Exec::CheckStall(uint64_t now) {
  next_stall_check_ns_ = now + comm_->config().stall_check_ns;
  std::set<uint32_t> peers;
  for (const Request* r : requests_) {
    if (!r->done()) peers.insert(r->peer);
  }
  // A peer that destroyed its communicator will never come.
  for (uint32_t p : peers) {
    if (comm_->control_ && comm_->control_->Departed(p)) {
      failure_ = MakeStatus(TERN_ERROR_COMM_MISMATCH,
                            "{} destroyed its communicator while this rank still waits for it in "
                            "operation #{} ({}): the ranks did not enqueue the same operations",
                            comm_->PeerName(p), op_.sequence, Describe(op_));
      comm_->Fail(failure_, true);
      return failure_;
    }
  }
  if (p2p_) return OkStatus();
  // Compare what the peers answered about this sequence number.
  answers_seen_ = comm_->answers_version_.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> lock(comm_->answers_mutex_);
    for (uint32_t p : peers) {
      auto it = comm_->answers_.find(p);
      if (it == comm_->answers_.end() || it->second.sequence != op_.sequence) continue;
      Reader r(it->second.data);
      const uint32_t found = r.U32();
      if (!found) continue;
      const auto kind = static_cast<OpKind>(r.U32());
      const auto dtype = static_cast<tern_dtype_t>(r.U32());
      const auto redop = static_cast<tern_comm_redop_t>(r.U32());
      const uint64_t count = r.U64();
      const uint32_t root = r.U32();
      if (!r.ok()) continue;
      const bool same = kind == op_.kind && dtype == op_.dtype && count == op_.count &&
                        (!HasRedop(kind) || redop == op_.redop) &&
                        (!HasRoot(kind) || root == op_.root);
      if (same) continue;
      failure_ = MakeStatus(TERN_ERROR_COMM_MISMATCH,
                            "mismatched collectives: {} enqueued '{}' as operation #{} of the "
                            "communicator, but rank {} enqueued '{}'; every rank must enqueue the "
                            "same collectives in the same order, with the same count, dtype, "
                            "reduction and root",
                            comm_->PeerName(p), DescribeFields(kind, dtype, redop, count, root),
                            op_.sequence, comm_->rank(), Describe(op_));
    }
  }
  if (!failure_.ok()) {
    comm_->Fail(failure_, true);
    return failure_;
  }
  if (comm_->control_) {
    size_t asked = 0;
    for (uint32_t p : peers) {
      if (++asked > 16) break;
      comm_->control_->SendQuery(p, op_.sequence);
    }
  }
  return OkStatus();
}

Status Exec::TimeoutStatus() {
  const double seconds = static_cast<double>(comm_->config().timeout_ns) / 1e9;
  std::set<uint32_t> peers;
  for (const Request* r : requests_) {
    if (!r->done()) peers.insert(r->peer);
  }
  std::string detail;
  {
    std::lock_guard<std::mutex> lock(comm_->answers_mutex_);
    for (uint32_t p : peers) {
      auto it = comm_->answers_.find(p);
      if (p2p_ || it == comm_->answers_.end() || it->second.sequence != op_.sequence) continue;
      Reader r(it->second.data);
      const uint32_t found = r.U32();
      if (found) {
        r.U32(), r.U32(), r.U32(), r.U64(), r.U32();
        const uint32_t state = r.U32();
        static const char* const kStates[] = {
            "enqueued but not started (its queue has not reached it)",
            "running it too (and waiting in turn)", "done with it", "failed in it", "skipped it"};
        detail += fmt::format("; rank {} has it {}", p, kStates[std::min<uint32_t>(state, 4)]);
      } else {
        const uint64_t last_enqueued = r.U64();
        const uint64_t last_completed = r.U64();
        auto seq = [](uint64_t s) {
          return s == UINT64_MAX ? std::string("none") : fmt::format("#{}", s);
        };
        detail += fmt::format(
            "; rank {} has not enqueued it (its last enqueued collective is {}, last "
            "completed {})",
            p, seq(last_enqueued), seq(last_completed));
      }
    }
  }
  failure_ = MakeStatus(TERN_ERROR_COMM_TIMEOUT,
                        "operation #{} ({}) of communicator {} did not complete within "
                        "TERN_COMM_TIMEOUT ({:.3f} s) on rank {}: it waits for {}{}; the last "
                        "operations of the communicator are in the log (flight recorder)",
                        op_.sequence, Describe(op_), comm_->label(), seconds, comm_->rank(),
                        WaitingFor(), detail);
  TERN_LOG_ERROR("{}\nflight recorder of communicator {} rank {} (oldest first):{}",
                 failure_.message(), comm_->label(), comm_->rank(), comm_->recorder().Dump());
  comm_->Fail(failure_, true);
  return failure_;
}

// --- Communicator ---------------------------------------------------------------

std::string Communicator::PeerName(uint32_t rank) const {
  if (rank >= peers_.size()) return fmt::format("rank {}", rank);
  const RankIdentity& p = peers_[rank];
  return fmt::format("rank {} (host {}, pid {})", rank, p.host, p.pid);
}

uint64_t Communicator::NextP2PSequence(uint32_t peer, bool send) {
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  if (send) return p2p_send_[peer]++;
  // Behind a receive from any source, nobody knows yet which peer's count
  // it will advance: this one is numbered when it runs, after it.
  if (run_time_receives_ > 0) {
    ++run_time_receives_;
    return kSequenceAtRunTime;
  }
  return p2p_recv_[peer]++;
}

void Communicator::AddRunTimeReceive() {
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  ++run_time_receives_;
}

uint64_t Communicator::TakeRecvSequence(uint32_t peer) {
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  return TakeRecvSequenceLocked(peer);
}

uint64_t Communicator::TakeRecvSequenceLocked(uint32_t peer) {
  if (run_time_receives_ > 0) --run_time_receives_;
  return p2p_recv_[peer]++;
}

void Communicator::NoteSendsToMe(uint32_t from, uint64_t sends) {
  {
    std::lock_guard<std::mutex> lock(p2p_mutex_);
    peer_sends_to_me_[from] = std::max(peer_sends_to_me_[from], sends);
  }
  peer_sends_cv_.notify_all();
}

namespace {
// A control-plane query with this bit set asks how many sends the peer has
// enqueued to the asking rank (the low 14 bits); without it, it asks about a
// collective (diagnosis).
constexpr uint64_t kSendsQuery = uint64_t{1} << 63;
// How often FindSender asks again while nobody has a send for it: from
// kFirstAskNs, doubling, up to kMaxAskNs.
constexpr uint64_t kFirstAskNs = 50'000;
constexpr uint64_t kMaxAskNs = 20'000'000;
}  // namespace

Status Communicator::FindSender(uint32_t* out_peer, uint64_t* out_sequence) {
  const uint64_t start = MonotonicNs();
  const uint64_t timeout = config_.timeout_ns;
  uint64_t next_ask = start, interval = kFirstAskNs;
  std::unique_lock<std::mutex> lock(p2p_mutex_);
  while (true) {
    // A peer has a send for us that no receive has taken when it enqueued
    // more sends to us than we have numbered receives from it. The lowest
    // such rank wins (any would do).
    for (uint32_t p = 0; p < size_; ++p) {
      if (p == rank_ || peer_sends_to_me_[p] <= p2p_recv_[p]) continue;
      *out_peer = p;
      *out_sequence = TakeRecvSequenceLocked(p);
      return OkStatus();
    }
    lock.unlock();
    if (failed()) {
      Status why = failure();
      return Status(why.code(), fmt::format("{} (this rank was waiting to receive from any rank)",
                                            why.message()));
    }
    const uint64_t now = MonotonicNs();
    if (timeout != 0 && now - start >= timeout) {
      std::string counts;
      {
        std::lock_guard<std::mutex> relock(p2p_mutex_);
        for (uint32_t p = 0; p < size_ && p < 16; ++p) {
          if (p == rank_) continue;
          counts += fmt::format("{}rank {} sent {}, received {}", counts.empty() ? "" : "; ", p,
                                peer_sends_to_me_[p], p2p_recv_[p]);
        }
      }
      return MakeStatus(TERN_ERROR_COMM_TIMEOUT,
                        "communicator {}: rank {} waited {:.1f} s to receive from any rank, and "
                        "no rank had enqueued a send to it that a receive had not taken ({}); "
                        "every receive needs a send (raise the timeout, TERN_COMM_TIMEOUT in "
                        "seconds, if the senders are slow)",
                        label_, rank_, static_cast<double>(now - start) / 1e9, counts);
    }
    if (now >= next_ask) {
      for (uint32_t p = 0; p < size_; ++p) {
        if (p != rank_ && !control_->Departed(p)) control_->SendQuery(p, kSendsQuery | rank_);
      }
      next_ask = now + interval;
      interval = std::min(interval * 2, kMaxAskNs);
    }
    lock.lock();
    peer_sends_cv_.wait_for(lock, std::chrono::nanoseconds(next_ask - std::min(next_ask, now)));
  }
}

Status Communicator::Create(const InitParams& params, std::shared_ptr<Communicator>* out) {
  std::shared_ptr<Communicator> comm(new Communicator());
  Status status = comm->Init(params);
  if (!status.ok()) {
    comm->Close(false);
    return status;
  }
  *out = std::move(comm);
  return OkStatus();
}

Status Communicator::Init(const InitParams& params) {
  rank_ = params.rank;
  size_ = params.size;
  nonce_ = params.id.nonce;
  config_ = params.config;
  core_ = params.core;
  core_handle_ = params.core_handle;
  label_ = params.name.empty() ? fmt::format("{:#x}", nonce_) : fmt::format("'{}'", params.name);
  p2p_send_.assign(size_, 0);
  p2p_recv_.assign(size_, 0);
  peer_sends_to_me_.assign(size_, 0);
  channel_of_.assign(size_, nullptr);
  const uint64_t deadline = MonotonicNs() + config_.init_timeout_ns;
  control_ = std::make_unique<ControlPlane>(rank_, size_, nonce_, label_);

  RankIdentity self;
  self.rank = rank_;
  self.pid = static_cast<uint32_t>(getpid());
  self.process_key = ProcessKey();
  self.host = HostName();
  self.node_key = NodeKey();
  UniqueId id = params.id;
  TERN_RETURN_IF_ERROR(JoinBootstrap(
      &id, size_, &self, deadline,
      [&](const SockAddr& local) {
        return rank_ == 0 ? control_->OpenListener(local, &self.ctrl_address) : OkStatus();
      },
      &peers_));
  secret_ = id.secret;

  ControlPlane::Callbacks callbacks;
  callbacks.on_peer_lost = [this](uint32_t rank) { OnPeerLost(rank); };
  callbacks.on_abort = [this](uint32_t origin, const Status& status) {
    Fail(Status(status.code(),
                fmt::format("{} failed the communicator: {}", PeerName(origin), status.message())),
         false);
  };
  callbacks.on_query = [this](uint64_t sequence) { return AnswerQuery(sequence); };
  callbacks.on_answer = [this](uint32_t from, uint64_t sequence, const std::string& answer) {
    OnAnswer(from, sequence, answer);
  };
  // A rank that leaves says how many sends it enqueued to each rank, so that
  // a receive from any source still finds its last messages (FindSender).
  callbacks.on_farewell = [this](uint32_t from, const std::string& farewell) {
    Reader r(farewell);
    const uint32_t count = r.U32();
    uint64_t sends_to_me = 0;
    for (uint32_t k = 0; k < count && r.ok(); ++k) {
      const uint64_t sends = r.U64();
      if (k == rank_) sends_to_me = sends;
    }
    if (r.ok() && count == size_ && from < size_) NoteSendsToMe(from, sends_to_me);
  };
  TERN_RETURN_IF_ERROR(control_->Connect(peers_, secret_, deadline, std::move(callbacks)));
  TERN_RETURN_IF_ERROR(SetUpChannels(deadline));
  // Everyone has its channels ready before the first message flies.
  std::vector<std::string> ignored;
  TERN_RETURN_IF_ERROR(control_->AllGather(std::string(), deadline, &ignored));
  for (auto& channel : channels_) {
    if (auto* shm = dynamic_cast<ShmChannel*>(channel.get())) shm->Unlink();
  }
  TERN_LOG_INFO("communicator {} rank {} of {} ready on core {}: transport {}", label_, rank_,
                size_, core_ ? core_->index : 0, transport_);
  return OkStatus();
}

// --- Channels: how this rank reaches each peer ------------------------------

// Where a peer is, seen from this rank.
enum class Communicator::Reach : uint8_t {
  kLocal,  // in this process: a LocalChannel, device memory addressable directly
  kNode,   // another process of this host: shared memory, or fabric
  kNet,    // another host: fabric
};

// Where the peers are (by rank; this rank counts as kLocal), and which kinds
// occur among the others.
struct Communicator::PeerLayout {
  std::vector<Reach> reach;
  bool any_local = false, any_node = false, any_net = false;
};

// The channels this rank opened, and the slots of the address exchange, each
// a provider, an address and the channel behind it: 0 fabric for this host,
// 1 fabric for other hosts (with FI_PROVIDER: for every peer outside the
// process), 2 shared memory.
struct Communicator::Transports {
  static constexpr int kSlots = 3;
  bool fabric_forced = false;  // FI_PROVIDER is set: fabric for every peer outside the process
  bool node_by_shm = false;    // peers of this host over tern-shm
  Channel* local = nullptr;
  FabricChannel* fabric_node = nullptr;
  FabricChannel* fabric_net = nullptr;
  ShmChannel* shm = nullptr;
  std::string provider[kSlots], address[kSlots];
  Channel* channel[kSlots] = {nullptr, nullptr, nullptr};

  int SlotOf(Reach reach) const {
    if (fabric_forced || reach == Reach::kNet) return 1;
    return node_by_shm ? 2 : 0;
  }
};

// What a peer published in the exchange (ExchangeAddresses writes it).
struct Communicator::PeerRecord {
  std::string provider[Transports::kSlots], address[Transports::kSlots];
  bool slots_ok = false;  // the slots were all there
  // For direct access: where its device memory is in its process, and the
  // descriptor through which processes of its host map it.
  uint64_t base = 0;
  uint32_t pid = 0;
  int32_t fd = -1;
  uint64_t bytes = 0;
  bool ok = false;  // the whole record was there

  explicit PeerRecord(const std::string& data) {
    Reader r(data);
    for (int s = 0; s < Transports::kSlots; ++s) {
      provider[s] = r.Str();
      address[s] = r.Str();
    }
    slots_ok = r.ok();
    base = r.U64();
    pid = r.U32();
    fd = r.I32();
    bytes = r.U64();
    ok = r.ok();
  }
};

Status Communicator::SetUpChannels(uint64_t deadline_ns) {
  const PeerLayout layout = LocatePeers();
  Transports transports;
  TERN_RETURN_IF_ERROR(OpenChannels(layout, &transports));
  std::vector<std::string> records;
  TERN_RETURN_IF_ERROR(ExchangeAddresses(transports, deadline_ns, &records));

  // Peers by slot, for the channels to add.
  std::vector<std::pair<uint32_t, std::string>> by_slot[Transports::kSlots];
  std::vector<ShmChannel::PeerSegment> segments;
  const bool direct = config_.use_direct && peer_base_[rank_] != nullptr;
  for (uint32_t p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const PeerRecord record(records[p]);
    TERN_RETURN_IF_ERROR(MapPeerMemory(p, layout.reach[p], transports, record, direct));
    if (layout.reach[p] == Reach::kLocal) {
      channel_of_[p] = transports.local;
      continue;
    }
    const int slot = transports.SlotOf(layout.reach[p]);
    if (!record.slots_ok || record.address[slot].empty() ||
        record.provider[slot] != transports.provider[slot]) {
      return MakeStatus(
          TERN_ERROR_COMM_TRANSPORT,
          "rank {} reaches {} through '{}', but that rank offers '{}' for it: set the "
          "same FI_PROVIDER and TERN_COMM_SHM on every rank",
          rank_, PeerName(p), transports.provider[slot],
          record.provider[slot].empty() ? std::string("nothing") : record.provider[slot]);
    }
    channel_of_[p] = transports.channel[slot];
    by_slot[slot].emplace_back(p, record.address[slot]);
    if (slot == 2) segments.push_back({p, peers_[p].pid, record.address[slot]});
  }
  if (transports.fabric_node) TERN_RETURN_IF_ERROR(transports.fabric_node->AddPeers(by_slot[0]));
  if (transports.fabric_net) TERN_RETURN_IF_ERROR(transports.fabric_net->AddPeers(by_slot[1]));
  if (transports.shm) TERN_RETURN_IF_ERROR(transports.shm->Attach(segments));
  SettleTransport(direct);
  return OkStatus();
}

Communicator::PeerLayout Communicator::LocatePeers() {
  const RankIdentity& self = peers_[rank_];
  PeerLayout layout;
  layout.reach.assign(size_, Reach::kLocal);
  std::set<std::string> nodes;
  local_rank_ = 0;
  local_size_ = 0;
  for (uint32_t p = 0; p < size_; ++p) {
    const RankIdentity& peer = peers_[p];
    const bool same_node = peer.node_key == self.node_key;
    nodes.insert(peer.node_key);
    if (same_node) {
      if (p < rank_) ++local_rank_;
      ++local_size_;
    }
    if (p == rank_) continue;
    if (same_node && peer.process_key == self.process_key && peer.pid == self.pid) {
      layout.any_local = true;
    } else if (same_node) {
      layout.reach[p] = Reach::kNode;
      layout.any_node = true;
    } else {
      layout.reach[p] = Reach::kNet;
      layout.any_net = true;
    }
  }
  node_count_ = static_cast<uint32_t>(nodes.size());
  return layout;
}

Status Communicator::OpenChannels(const PeerLayout& layout, Transports* out) {
  const char* forced = std::getenv("FI_PROVIDER");
  out->fabric_forced = forced != nullptr && *forced != '\0';
  out->node_by_shm = layout.any_node && config_.use_shm && !out->fabric_forced;
  if (layout.any_local) {
    channels_.push_back(std::make_unique<LocalChannel>(LocalGroup::Get(nonce_, size_), rank_));
    out->local = channels_.back().get();
  }
  local_channel_ = out->local;
  auto open_fabric = [&](bool same_host, FabricChannel** opened) -> Status {
    std::unique_ptr<FabricChannel> channel;
    TERN_RETURN_IF_ERROR(FabricChannel::Open(same_host, size_, &channel));
    *opened = channel.get();
    channels_.push_back(std::move(channel));
    return OkStatus();
  };
  if (out->fabric_forced) {
    if (layout.any_node || layout.any_net) {
      TERN_RETURN_IF_ERROR(open_fabric(!layout.any_net, &out->fabric_net));
    }
  } else {
    if (layout.any_node && !out->node_by_shm) {
      TERN_RETURN_IF_ERROR(open_fabric(true, &out->fabric_node));
    }
    if (layout.any_net) TERN_RETURN_IF_ERROR(open_fabric(false, &out->fabric_net));
  }
  if (out->node_by_shm) {
    std::vector<uint32_t> node_peers;
    for (uint32_t p = 0; p < size_; ++p) {
      if (p != rank_ && layout.reach[p] == Reach::kNode) node_peers.push_back(p);
    }
    std::unique_ptr<ShmChannel> channel;
    TERN_RETURN_IF_ERROR(ShmChannel::Create(nonce_, rank_, size_, node_peers, &channel));
    out->shm = channel.get();
    channels_.push_back(std::move(channel));
  }
  auto fill_slot = [&](int slot, Channel* channel, std::string provider, std::string address) {
    out->provider[slot] = std::move(provider);
    out->address[slot] = std::move(address);
    out->channel[slot] = channel;
  };
  if (out->fabric_node) {
    fill_slot(0, out->fabric_node, out->fabric_node->name(), out->fabric_node->address());
  }
  if (out->fabric_net) {
    fill_slot(1, out->fabric_net, out->fabric_net->name(), out->fabric_net->address());
  }
  if (out->shm) fill_slot(2, out->shm, "tern-shm", out->shm->segment_name());
  return OkStatus();
}

Status Communicator::ExchangeAddresses(const Transports& transports, uint64_t deadline_ns,
                                       std::vector<std::string>* records) {
  Writer w;
  for (int s = 0; s < Transports::kSlots; ++s) {
    w.Str(transports.provider[s]).Str(transports.address[s]);
  }
  // For direct access: where this rank's device memory is in this process,
  // and the descriptor through which other processes of the host map it.
  DeviceObject* device = core_->device;
  auto* my_base = static_cast<uint8_t*>(device->hw->EngineAddress(0, 1));
  peer_base_.assign(size_, nullptr);
  peer_base_[rank_] = my_base;
  peer_bytes_.assign(size_, 0);
  peer_bytes_[rank_] = device->info.memory_bytes;
  w.U64(reinterpret_cast<uintptr_t>(my_base))
      .U32(static_cast<uint32_t>(getpid()))
      .I32(device->hw->SharedMemoryFd())
      .U64(device->info.memory_bytes);
  return control_->AllGather(w.data(), deadline_ns, records);
}

Status Communicator::MapPeerMemory(uint32_t p, Reach reach, const Transports& transports,
                                   const PeerRecord& record, bool direct) {
  if (reach == Reach::kLocal) {
    // A rank of this process (the same process key and pid): its device
    // memory is in this address space.
    peer_base_[p] = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(record.base));
    peer_bytes_[p] = record.bytes;
    return OkStatus();
  }
  if (!direct || !record.ok || reach != Reach::kNode || !transports.node_by_shm || record.fd < 0 ||
      record.bytes == 0) {
    return OkStatus();
  }
  // The peer names a descriptor of its process; nothing of it is mapped on
  // its word alone. It must be the process of its authenticated identity,
  // and the descriptor this user's shared memory (a memfd or dma-buf) with
  // at least the bytes it claims (mapping past the end would fault later).
  if (record.pid != peers_[p].pid) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "{} names its device memory as a descriptor of process {}, not its own: "
                      "refusing to map another process's memory",
                      PeerName(p), record.pid);
  }
  const std::string path = fmt::format("/proc/{}/fd/{}", record.pid, record.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    TERN_LOG_INFO(
        "communicator {} rank {}: cannot map the device memory of {} ({}): {}; large "
        "operations go through the shared-memory rings",
        label_, rank_, PeerName(p), path, std::strerror(errno));
    return OkStatus();
  }
  auto closer =
      std::unique_ptr<const int, void (*)(const int*)>(&fd, [](const int* f) { close(*f); });
  // What was opened, named by this process's own descriptor (the peer
  // cannot swap it any more).
  char target[256] = {};
  const std::string self_path = fmt::format("/proc/self/fd/{}", fd);
  const ssize_t length = readlink(self_path.c_str(), target, sizeof(target) - 1);
  const std::string_view what(target, length > 0 ? static_cast<size_t>(length) : 0);
  const bool shared_memory = what.starts_with("/memfd:") || what.starts_with("/dmabuf:") ||
                             what.starts_with("anon_inode:dmabuf");
  struct stat st {};
  const bool stat_ok = fstat(fd, &st) == 0;
  if (!shared_memory || !stat_ok || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<uint64_t>(st.st_size) < record.bytes) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "{} names {} as its device memory of {} bytes, but that is '{}' (owner {}, "
                      "{} bytes), not shared memory of this user (uid {}) that large: refusing "
                      "to map it",
                      PeerName(p), path, record.bytes, what, stat_ok ? st.st_uid : 0,
                      stat_ok ? st.st_size : 0, geteuid());
  }
  void* base =
      mmap(nullptr, record.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    TERN_LOG_INFO(
        "communicator {} rank {}: cannot map the device memory of {} ({}): {}; large "
        "operations go through the shared-memory rings",
        label_, rank_, PeerName(p), path, std::strerror(errno));
    return OkStatus();
  }
  peer_maps_.emplace_back(base, record.bytes);
  peer_base_[p] = static_cast<uint8_t*>(base);
  peer_bytes_[p] = record.bytes;
  return OkStatus();
}

void Communicator::SettleTransport(bool direct) {
  // Ranks of this host that outnumber its CPUs take turns: waiting ranks
  // yield soon. Otherwise every rank has a CPU and polls like MPI does.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  yield_after_ns_ = local_size_ > cpus ? 20000 : 1000000;
  for (uint32_t p = 0; p < size_; ++p) direct = direct && peer_base_[p] != nullptr;
  direct_ = direct && size_ > 1;
  std::string names;
  for (auto& channel : channels_) {
    names += fmt::format("{}{}", names.empty() ? "" : "+", channel->name());
    if (channel.get() != local_channel_) progress_.push_back(channel.get());
  }
  sleep_channel_ =
      progress_.size() == 1 && progress_.front()->CanSleep() ? progress_.front() : nullptr;
  transport_ = names.empty() ? "none" : names;
}

Communicator::~Communicator() {
  Close(false);
  control_.reset();
  channels_.clear();
  for (auto& [base, bytes] : peer_maps_) munmap(base, bytes);
}

void Communicator::RemoveInflight() {
  inflight_.fetch_sub(1, std::memory_order_seq_cst);
  // Only Close() waits, and it sets closing_ before reading inflight_.
  if (closing_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(inflight_mutex_);
    inflight_cv_.notify_all();
  }
}

void Communicator::Close(bool graceful) {
  {
    std::unique_lock<std::mutex> lock(inflight_mutex_);
    if (closed_) return;
    closed_ = true;
    closing_.store(true, std::memory_order_seq_cst);
    if (graceful) {
      inflight_cv_.wait(lock, [this] { return inflight_.load(std::memory_order_relaxed) <= 0; });
    }
  }
  if (control_) {
    Writer farewell;
    {
      std::lock_guard<std::mutex> lock(p2p_mutex_);
      farewell.U32(size_);
      for (uint64_t sends : p2p_send_) farewell.U64(sends);
    }
    control_->Close(graceful && !failed(), farewell.data());
  }
  for (auto& channel : channels_) channel->Shutdown();
}

Status Communicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void Communicator::Fail(const Status& status, bool broadcast) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failed_.load(std::memory_order_relaxed)) return;
    failure_ = status;
    failed_.store(true, std::memory_order_release);
  }
  TERN_LOG_WARN("communicator {} rank {} of {} failed: {}", label_, rank_, size_, status.message());
  if (control_) {
    if (broadcast) control_->BroadcastAbort(status);
    control_->FailWaiters(status);
  }
  for (auto& channel : channels_) channel->Shutdown();
}

void Communicator::OnPeerLost(uint32_t rank) {
  Fail(MakeStatus(
           TERN_ERROR_COMM_PEER_LOST,
           "{} is gone: its process exited or was killed before destroying the communicator "
           "(its control connection closed); communicator {} cannot be used any more: destroy "
           "it, and restart the job or re-create the communicator without that rank",
           PeerName(rank), label_),
       false);
}

std::string Communicator::AnswerQuery(uint64_t sequence) {
  FlightRecorder::Record record;
  Writer w;
  if (sequence & kSendsQuery) {
    const uint32_t asker = static_cast<uint32_t>(sequence & (kMaxRanks - 1));
    std::lock_guard<std::mutex> lock(p2p_mutex_);
    w.U64(asker < size_ ? p2p_send_[asker] : 0);
    return w.data();
  }
  if (recorder_.FindCollective(sequence, &record)) {
    w.U32(1)
        .U32(static_cast<uint32_t>(record.kind))
        .U32(static_cast<uint32_t>(record.dtype))
        .U32(static_cast<uint32_t>(record.redop))
        .U64(record.count)
        .U32(record.root)
        .U32(static_cast<uint32_t>(record.state));
  } else {
    uint64_t last_enqueued, last_completed;
    recorder_.Progress(&last_enqueued, &last_completed);
    w.U32(0).U64(last_enqueued).U64(last_completed);
  }
  return w.data();
}

void Communicator::OnAnswer(uint32_t from, uint64_t sequence, const std::string& answer) {
  if (sequence & kSendsQuery) {
    Reader r(answer);
    const uint64_t sends = r.U64();
    if (r.ok() && from < size_) NoteSendsToMe(from, sends);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(answers_mutex_);
    answers_[from] = Answer{sequence, answer};
  }
  answers_version_.fetch_add(1, std::memory_order_release);
  // A waiter asleep in Exec::Spin reads the answers (CheckStall).
  if (sleep_channel_ != nullptr) sleep_channel_->WakeSleepers();
}

Status Communicator::Run(const OpDesc& op, uint64_t record) {
  recorder_.Start(record);
  Status status;
  if (failed()) {
    Status why = failure();
    status = Status(why.code(), fmt::format("not run: communicator {} had already failed: {}",
                                            label_, why.message()));
  } else {
    Exec exec(this, op, record);
    status = RunAlgorithm(exec);
  }
  recorder_.Finish(record, status.ok() ? FlightRecorder::kDone : FlightRecorder::kFailed,
                   status.code());
  return status;
}

Status Communicator::Split(int32_t color, int32_t key, const CommConfig& config,
                           const std::string& name, std::shared_ptr<Communicator>* out) {
  out->reset();
  const uint64_t deadline = MonotonicNs() + config.init_timeout_ns;
  Writer mine;
  mine.I32(color).I32(key);
  std::vector<std::string> all;
  TERN_RETURN_IF_ERROR(control_->AllGather(mine.data(), deadline, &all));
  struct Member {
    int32_t key;
    uint32_t rank;
  };
  std::vector<Member> members;
  for (uint32_t p = 0; p < size_; ++p) {
    Reader r(all[p]);
    const int32_t c = r.I32();
    const int32_t k = r.I32();
    if (c == color && color >= 0) members.push_back({k, p});
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  // The leader's id travels through the control plane with a random salt
  // where the secret goes: each member derives the child's secret from the
  // salt and this communicator's secret, so the secret itself never travels.
  std::string id_bytes;
  if (color >= 0 && members.front().rank == rank_) {
    Secret salt;
    TERN_RETURN_IF_ERROR(GenerateSecret(&salt));
    const Secret child_secret = DeriveSecret(secret_, salt.view());
    UniqueId id;
    TERN_RETURN_IF_ERROR(CreateUniqueId(config.init_timeout_ns, &child_secret, &id));
    id.secret = salt;
    tern_comm_unique_id_t packed;
    TERN_RETURN_IF_ERROR(EncodeUniqueId(id, &packed));
    id_bytes.assign(packed.internal, sizeof(packed.internal));
  }
  TERN_RETURN_IF_ERROR(control_->AllGather(id_bytes, deadline, &all));
  if (color < 0) return OkStatus();
  uint32_t new_rank = 0;
  for (uint32_t i = 0; i < members.size(); ++i) {
    if (members[i].rank == rank_) new_rank = i;
  }
  tern_comm_unique_id_t packed;
  const std::string& leader_id = all[members.front().rank];
  if (leader_id.size() != sizeof(packed.internal)) {
    return MakeStatus(TERN_ERROR_INTERNAL, "split: the leader sent no unique id");
  }
  std::memcpy(packed.internal, leader_id.data(), sizeof(packed.internal));
  InitParams params;
  params.core = core_;
  params.core_handle = core_handle_;
  params.size = static_cast<uint32_t>(members.size());
  params.rank = new_rank;
  params.config = config;
  params.name = name;
  TERN_RETURN_IF_ERROR(DecodeUniqueId(packed, &params.id));
  params.id.secret = DeriveSecret(secret_, params.id.secret.view());
  return Create(params, out);
}

}  // namespace tern::comm
