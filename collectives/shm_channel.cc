#include "shm_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "comm_kernels.h"
#include "common/logging.h"

namespace tern::comm {

// One slot: the header shares its cache line with the first payload bytes.
struct ShmChannel::Slot {
  std::atomic<uint64_t> sequence;  // position + 1 once published
  uint64_t tag;
  uint64_t message_bytes;
  uint64_t offset;  // of this fragment in the message
  uint32_t bytes;   // of this fragment
  uint32_t reserved;
  // payload follows (24 bytes in this line, the rest after it)
};
static_assert(sizeof(ShmChannel::Slot) == 40);

struct ShmChannel::Ring {
  alignas(64) std::atomic<uint64_t> tail;  // written by the consumer: slots consumed
  char pad[56];
  // slots follow, each slot_bytes long
};
static_assert(sizeof(ShmChannel::Ring) == 64);

// A rank's doorbell (see shm_channel.h). `word` is a futex shared between
// the processes that map the segment: the peers bump it to wake the owner,
// whose threads count themselves in `sleepers` while they sleep. A peer can
// write either field, so neither is trusted: a wrong value costs the owner a
// wake-up, or a sleep until its timeout, nothing else.
struct ShmChannel::Doorbell {
  alignas(64) std::atomic<uint32_t> word;
  std::atomic<uint32_t> sleepers;
  char pad[56];
};
static_assert(sizeof(ShmChannel::Doorbell) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

namespace {

constexpr uint64_t kMagic = 0x5445524e53484d32ull;  // "TERNSHM2"
constexpr size_t kHeaderBytes = 4096;
// The doorbell takes the header's last cache line.
constexpr size_t kDoorbellOffset = kHeaderBytes - sizeof(ShmChannel::Doorbell);
constexpr size_t kSlotHeader = sizeof(ShmChannel::Slot);

struct SegmentHeader {
  uint64_t magic;
  uint64_t nonce;
  uint32_t owner;
  uint32_t ring_count;
  uint32_t slots;
  uint32_t slot_bytes;
  // followed by ring_count entries
};
struct RingEntry {
  uint32_t sender;
  uint32_t reserved;
  uint64_t offset;
};
constexpr size_t kMaxRingsInHeader = (kDoorbellOffset - sizeof(SegmentHeader)) / sizeof(RingEntry);

ShmChannel::Doorbell* DoorbellOf(void* segment_base) {
  return reinterpret_cast<ShmChannel::Doorbell*>(static_cast<uint8_t*>(segment_base) +
                                                 kDoorbellOffset);
}

// A full barrier between the caller's earlier stores and its later loads,
// for the doorbell's pairing (RingDoorbell against ArmDoorbell). GCC's
// ThreadSanitizer does not model fences (-Wtsan refuses them); under it, a
// sequentially consistent read-modify-write of the doorbell's count, which
// both sides then perform on the same word, gives the same order.
inline void FullBarrier(std::atomic<uint32_t>& sleepers) {
#if defined(__SANITIZE_THREAD__)
  sleepers.fetch_add(0, std::memory_order_seq_cst);
#else
  (void)sleepers;
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Ends every sleep on `doorbell` now, and any that starts with an older
// ticket.
void WakeDoorbell(ShmChannel::Doorbell* doorbell) {
  doorbell->word.fetch_add(1, std::memory_order_seq_cst);
  // Not FUTEX_PRIVATE: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&doorbell->word), FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}

// Called after publishing a fragment (release) or freeing room: the barrier
// pairs with the one in ArmDoorbell, so either the sleeper's last look sees
// what was published, or this load sees the sleeper and wakes it.
void RingDoorbell(ShmChannel::Doorbell* doorbell) {
  if (doorbell == nullptr) return;
  FullBarrier(doorbell->sleepers);
  if (doorbell->sleepers.load(std::memory_order_relaxed) == 0) return;
  WakeDoorbell(doorbell);
}

uint64_t EnvBytes(const char* name, uint64_t fallback, uint64_t minimum, uint64_t maximum) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (end != text && (*end == 'K' || *end == 'k')) value <<= 10;
  return std::clamp<uint64_t>(value, minimum, maximum);
}

ShmChannel::Slot* SlotAt(ShmChannel::Ring* ring, uint32_t slot_bytes, uint32_t slots,
                         uint64_t position) {
  auto* base = reinterpret_cast<uint8_t*>(ring) + sizeof(ShmChannel::Ring);
  return reinterpret_cast<ShmChannel::Slot*>(base + (position % slots) * slot_bytes);
}
uint8_t* Payload(ShmChannel::Slot* slot) { return reinterpret_cast<uint8_t*>(slot) + kSlotHeader; }
// The bytes of a message one slot carries (whole 8-byte words).
uint64_t PayloadCapacity(uint32_t slot_bytes) { return (slot_bytes - kSlotHeader) & ~uint64_t{7}; }

size_t RingBytes(uint32_t slots, uint32_t slot_bytes) {
  return sizeof(ShmChannel::Ring) + static_cast<size_t>(slots) * slot_bytes;
}

// The name of rank `rank`'s segment, in process `pid`: peers open only the
// name that the peer's authenticated identity implies.
std::string SegmentName(uint64_t nonce, uint32_t rank, uint32_t pid) {
  return fmt::format("/tern-comm-{:016x}-{}-{}", nonce, rank, pid);
}

}  // namespace

Status ShmChannel::Create(uint64_t nonce, uint32_t rank, uint32_t size,
                          const std::vector<uint32_t>& peers, std::unique_ptr<ShmChannel>* out) {
  std::unique_ptr<ShmChannel> channel(new ShmChannel());
  channel->rank_ = rank;
  channel->nonce_ = nonce;
  // TERN_COMM_SHM_SLOT: bytes per slot (a multiple of 64); TERN_COMM_SHM_SLOTS: slots per ring.
  channel->slot_bytes_ = static_cast<uint32_t>(
      EnvBytes("TERN_COMM_SHM_SLOT", 64u << 10, 256, 16u << 20) & ~uint64_t{63});
  channel->slots_ = static_cast<uint32_t>(EnvBytes("TERN_COMM_SHM_SLOTS", 16, 2, 4096));
  channel->in_.resize(size);
  channel->out_.resize(size);
  channel->peers_ = peers;
  if (peers.size() > kMaxRingsInHeader) {
    return MakeStatus(
        TERN_ERROR_UNIMPLEMENTED,
        "{} ranks share this host with rank {}; the shared-memory channel supports {}: "
        "set TERN_COMM_SHM=0 to use libfabric's shm provider",
        peers.size() + 1, rank, kMaxRingsInHeader + 1);
  }
  channel->name_ = SegmentName(nonce, rank, static_cast<uint32_t>(getpid()));
  const size_t ring_bytes = RingBytes(channel->slots_, channel->slot_bytes_);
  const size_t total = kHeaderBytes + peers.size() * ring_bytes;
  const int fd = shm_open(channel->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno,
                       fmt::format("shm_open({}) for the shared-memory channel", channel->name_));
  }
  channel->unlinked_ = false;
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, err,
                       fmt::format("sizing the shared-memory channel to {} bytes", total));
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    return ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, errno, "mapping the shared-memory channel");
  }
  channel->own_ = Mapping{base, total};
  channel->own_doorbell_ = new (DoorbellOf(base)) Doorbell();
  auto* header = static_cast<SegmentHeader*>(base);
  header->nonce = nonce;
  header->owner = rank;
  header->ring_count = static_cast<uint32_t>(peers.size());
  header->slots = channel->slots_;
  header->slot_bytes = channel->slot_bytes_;
  auto* entries = reinterpret_cast<RingEntry*>(header + 1);
  for (size_t i = 0; i < peers.size(); ++i) {
    const uint64_t offset = kHeaderBytes + i * ring_bytes;
    entries[i] = RingEntry{peers[i], 0, offset};
    auto* ring = reinterpret_cast<Ring*>(static_cast<uint8_t*>(base) + offset);
    new (ring) Ring();
    ring->tail.store(0, std::memory_order_relaxed);
    channel->in_[peers[i]].ring = ring;
  }
  // Peers map the segment only after learning its name through the control
  // plane (a socket round trip), which orders these writes before theirs.
  header->magic = kMagic;
  *out = std::move(channel);
  return OkStatus();
}

ShmChannel::~ShmChannel() {
  Unlink();
  if (own_.base != nullptr) munmap(own_.base, own_.bytes);
  for (const Mapping& m : mapped_) munmap(m.base, m.bytes);
}

void ShmChannel::Unlink() {
  if (unlinked_) return;
  shm_unlink(name_.c_str());
  unlinked_ = true;
}

Status ShmChannel::Attach(const std::vector<PeerSegment>& peers) {
  std::lock_guard<SpinLock> lock(mutex_);
  for (const PeerSegment& peer_segment : peers) {
    const uint32_t peer = peer_segment.rank;
    const std::string& name = peer_segment.name;
    // The name comes from the peer; open only the one its identity implies
    // (never a path of its choosing).
    const std::string expected = SegmentName(nonce_, peer, peer_segment.pid);
    if (name != expected) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "rank {} (pid {}) offers the shared-memory segment '{}', but its segment "
                        "is '{}': refusing to open it (a tern rank of another version, or not a "
                        "tern rank)",
                        peer, peer_segment.pid, name, expected);
    }
    const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0) {
      return ErrnoStatus(
          TERN_ERROR_COMM_TRANSPORT, errno,
          fmt::format("opening rank {}'s shared-memory channel {} (is /dev/shm shared "
                      "between the processes?)",
                      peer, name));
    }
    struct stat st {};
    const bool stat_ok = fstat(fd, &st) == 0;
    const uint64_t size = stat_ok ? static_cast<uint64_t>(st.st_size) : 0;
    if (!stat_ok || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0 ||
        size < kHeaderBytes) {
      close(fd);
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "rank {}'s shared-memory channel {} is not a segment of this user (uid "
                        "{}) closed to others and at least {} bytes long (owner {}, mode {:o}, "
                        "{} bytes): refusing to map it",
                        peer, name, geteuid(), kHeaderBytes, st.st_uid, st.st_mode & 07777, size);
    }
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
      return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno,
                         fmt::format("mapping rank {}'s channel", peer));
    }
    mapped_.push_back(Mapping{base, static_cast<size_t>(size)});
    // The peer can write its header at any time: read each value once, and
    // check it before use.
    SegmentHeader header;
    std::memcpy(&header, base, sizeof(header));
    if (header.magic != kMagic || header.owner != peer || header.nonce != nonce_) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "rank {}'s shared-memory channel {} is not valid (its header names another "
                        "rank or communicator)",
                        peer, name);
    }
    if (header.slots != slots_ || header.slot_bytes != slot_bytes_) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "rank {}'s shared-memory channel has another geometry ({} slots of {} "
                        "bytes, here {} of {}): set the same TERN_COMM_SHM_SLOT(S) on every rank",
                        peer, header.slots, header.slot_bytes, slots_, slot_bytes_);
    }
    const uint32_t ring_count = std::min<uint32_t>(header.ring_count, kMaxRingsInHeader);
    const size_t ring_bytes = RingBytes(slots_, slot_bytes_);
    Ring* ring = nullptr;
    for (uint32_t i = 0; i < ring_count; ++i) {
      RingEntry entry;
      std::memcpy(&entry,
                  static_cast<const uint8_t*>(base) + sizeof(SegmentHeader) + i * sizeof(RingEntry),
                  sizeof(entry));
      if (entry.sender != rank_) continue;
      if (entry.offset < kHeaderBytes || entry.offset % alignof(Ring) != 0 || entry.offset > size ||
          size - entry.offset < ring_bytes) {
        return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                          "rank {}'s shared-memory channel {} places the ring for rank {} at "
                          "offset {}, outside its {} bytes (a ring takes {}): refusing to use it",
                          peer, name, rank_, entry.offset, size, ring_bytes);
      }
      ring = reinterpret_cast<Ring*>(static_cast<uint8_t*>(base) + entry.offset);
    }
    if (ring == nullptr) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "rank {}'s shared-memory channel has no ring for rank {}", peer, rank_);
    }
    out_[peer].ring = ring;
    out_[peer].receiver = DoorbellOf(base);
    in_[peer].sender = DoorbellOf(base);
  }
  return OkStatus();
}

void ShmChannel::Deliver(Request* req, uint64_t offset, const uint8_t* data, uint64_t bytes) {
  if (bytes == 0) return;
  auto* dst = static_cast<uint8_t*>(req->buffer) + offset;
  if (req->reduce) {
    const size_t es = req->spec.element_size;
    Reduce(dst, static_cast<const uint8_t*>(req->reduce_a) + offset, data, bytes / es,
           req->spec.dtype, req->spec.op);
  } else {
    std::memcpy(dst, data, bytes);
  }
}

void ShmChannel::WriteSlot(Outgoing& out, uint64_t tag, uint64_t message_bytes, uint64_t offset,
                           const uint8_t* data, uint64_t bytes) {
  Slot* slot = SlotAt(out.ring, slot_bytes_, slots_, out.position);
  slot->tag = tag;
  slot->message_bytes = message_bytes;
  slot->offset = offset;
  slot->bytes = static_cast<uint32_t>(bytes);
  if (bytes > 0) std::memcpy(Payload(slot), data, bytes);
  slot->sequence.store(out.position + 1, std::memory_order_release);
  ++out.position;
}

bool ShmChannel::PushOutgoing(Outgoing& out) {
  bool progressed = false;
  const uint64_t payload_capacity = PayloadCapacity(slot_bytes_);
  while (!out.queue.empty()) {
    if (out.position - out.tail >= slots_) {
      out.tail = out.ring->tail.load(std::memory_order_acquire);
      if (out.position - out.tail >= slots_) break;
    }
    Request* req = out.queue.front();
    const uint64_t offset = out.front_sent;
    const uint64_t bytes = std::min<uint64_t>(req->bytes - offset, payload_capacity);
    WriteSlot(out, req->tag, req->bytes, offset, static_cast<const uint8_t*>(req->buffer) + offset,
              bytes);
    progressed = true;
    out.front_sent += bytes;
    if (out.front_sent >= req->bytes) {
      out.queue.pop_front();
      out.front_sent = 0;
      req->Complete();
    }
  }
  if (progressed) RingDoorbell(out.receiver);
  return progressed;
}

bool ShmChannel::PollIncoming(Incoming& in, uint32_t peer, Status* error) {
  bool progressed = false;
  const uint64_t capacity = PayloadCapacity(slot_bytes_);
  while (true) {
    Slot* slot = SlotAt(in.ring, slot_bytes_, slots_, in.position);
    if (slot->sequence.load(std::memory_order_acquire) != in.position + 1) break;
    // The peer writes the slot: each value is read once and checked before
    // it places or sizes a copy.
    const uint64_t tag = slot->tag;
    const uint64_t message_bytes = slot->message_bytes;
    const uint64_t offset = slot->offset;
    const uint64_t bytes = slot->bytes;
    auto invalid = [&](std::string_view why) {
      *error = MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                          "rank {} wrote an invalid fragment into its shared-memory ring ({}: "
                          "offset {}, {} bytes of a {}-byte message, {} bytes fit a slot); nothing "
                          "of it was used: its process is corrupt or not a tern rank",
                          peer, why, offset, bytes, message_bytes, capacity);
      return progressed;
    };
    if (bytes > capacity || offset > message_bytes || bytes > message_bytes - offset) {
      return invalid("the fragment exceeds its slot or its message");
    }
    Request* req = nullptr;
    for (size_t i = 0; i < in.posted.size(); ++i) {
      if (in.posted[i]->tag == tag) {
        req = in.posted[i];
        if (message_bytes == req->bytes &&
            offset != reinterpret_cast<uintptr_t>(req->channel_data)) {
          return invalid("the fragment is out of order");
        }
        if (message_bytes != req->bytes) {
          req->Fail(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                               "rank {} sent {} bytes where {} were expected: the ranks called the "
                               "operation with different counts",
                               peer, message_bytes, req->bytes));
          in.posted.erase(in.posted.begin() + static_cast<ptrdiff_t>(i));
          req = nullptr;
          break;  // the fragment is dropped below
        }
        Deliver(req, offset, Payload(slot), bytes);
        const uint64_t received = reinterpret_cast<uintptr_t>(req->channel_data) + bytes;
        req->channel_data = reinterpret_cast<void*>(static_cast<uintptr_t>(received));
        if (received >= req->bytes) {
          in.posted.erase(in.posted.begin() + static_cast<ptrdiff_t>(i));
          req->Complete();
        }
        break;
      }
    }
    if (req == nullptr) {
      auto it = in.unexpected.find(tag);
      const bool started = it != in.unexpected.end();
      // Leave an unmatched message in the ring until the ring is full (its
      // receive is usually about to be posted); then set it aside.
      const bool full = SlotAt(in.ring, slot_bytes_, slots_, in.position + slots_ - 1)
                            ->sequence.load(std::memory_order_acquire) == in.position + slots_;
      if (!started && !full && offset == 0) break;
      if (started ? (message_bytes != it->second.message_bytes || offset != it->second.data.size())
                  : offset != 0) {
        return invalid("the fragment does not continue its message");
      }
      Unexpected& u = in.unexpected[tag];
      u.message_bytes = message_bytes;
      const uint8_t* payload = Payload(slot);
      u.data.insert(u.data.end(), payload, payload + bytes);
    }
    ++in.position;
    in.ring->tail.store(in.position, std::memory_order_release);
    progressed = true;
  }
  if (progressed) RingDoorbell(in.sender);  // it may wait for room
  return progressed;
}

Status ShmChannel::PostSend(Request* req) {
  std::lock_guard<SpinLock> lock(mutex_);
  if (shut_) return MakeStatus(TERN_ERROR_COMM_ABORTED, "the shared-memory channel was closed");
  Outgoing& out = out_[req->peer];
  out.queue.push_back(req);
  if (out.queue.size() == 1) PushOutgoing(out);
  return OkStatus();
}

Status ShmChannel::PostRecv(Request* req) {
  std::lock_guard<SpinLock> lock(mutex_);
  if (shut_) return MakeStatus(TERN_ERROR_COMM_ABORTED, "the shared-memory channel was closed");
  Incoming& in = in_[req->peer];
  req->channel_data = nullptr;
  auto it = in.unexpected.find(req->tag);
  if (it != in.unexpected.end()) {
    Unexpected& u = it->second;
    if (u.message_bytes != req->bytes) {
      req->Fail(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                           "rank {} sent {} bytes where {} were expected: the ranks called the "
                           "operation with different counts",
                           req->peer, u.message_bytes, req->bytes));
      in.unexpected.erase(it);
      return OkStatus();
    }
    Deliver(req, 0, u.data.data(), u.data.size());
    req->channel_data = reinterpret_cast<void*>(static_cast<uintptr_t>(u.data.size()));
    const bool complete = u.data.size() >= req->bytes;
    in.unexpected.erase(it);
    if (complete) {
      req->Complete();
      return OkStatus();
    }
  }
  in.posted.push_back(req);
  Status ignored;
  PollIncoming(in, req->peer, &ignored);
  return OkStatus();
}

bool ShmChannel::SendNow(uint32_t peer, uint64_t tag, const void* data, size_t bytes) {
  std::lock_guard<SpinLock> lock(mutex_);
  Outgoing& out = out_[peer];
  // Behind queued messages it would only wait its turn: let PostSend queue it.
  if (shut_ || out.ring == nullptr || !out.queue.empty() || bytes > PayloadCapacity(slot_bytes_)) {
    return false;
  }
  if (out.position - out.tail >= slots_) {
    out.tail = out.ring->tail.load(std::memory_order_acquire);
    if (out.position - out.tail >= slots_) return false;
  }
  WriteSlot(out, tag, bytes, 0, static_cast<const uint8_t*>(data), bytes);
  RingDoorbell(out.receiver);
  return true;
}

Channel::Now ShmChannel::RecvNow(uint32_t peer, uint64_t tag, void* dst, const void* a,
                                 const ReduceSpec* spec, size_t bytes) {
  std::lock_guard<SpinLock> lock(mutex_);
  Incoming& in = in_[peer];
  // Posted receives and messages set aside come first: the general path
  // keeps their order.
  if (shut_ || in.ring == nullptr || !in.posted.empty() || !in.unexpected.empty()) {
    return Now::kPost;
  }
  Slot* slot = SlotAt(in.ring, slot_bytes_, slots_, in.position);
  if (slot->sequence.load(std::memory_order_acquire) != in.position + 1) return Now::kNotYet;
  if (slot->tag != tag || slot->message_bytes != bytes || slot->offset != 0 ||
      slot->bytes != bytes) {
    return Now::kPost;  // another message first, or a size mismatch to report
  }
  if (bytes > 0) {
    if (spec != nullptr) {
      Reduce(dst, a, Payload(slot), bytes / spec->element_size, spec->dtype, spec->op);
    } else {
      std::memcpy(dst, Payload(slot), bytes);
    }
  }
  ++in.position;
  in.ring->tail.store(in.position, std::memory_order_release);
  RingDoorbell(in.sender);
  return Now::kDone;
}

bool ShmChannel::Progress(Status* error) {
  std::lock_guard<SpinLock> lock(mutex_);
  if (shut_) return false;
  bool progressed = false;
  for (uint32_t peer : peers_) {
    Outgoing& out = out_[peer];
    if (!out.queue.empty()) progressed |= PushOutgoing(out);
    Incoming& in = in_[peer];
    // Also without posted receives: a full ring must be drained aside.
    progressed |= PollIncoming(in, peer, error);
    if (!error->ok()) return progressed;
  }
  return progressed;
}

void ShmChannel::Cancel(Request* req) {
  std::lock_guard<SpinLock> lock(mutex_);
  if (req->is_send) {
    Outgoing& out = out_[req->peer];
    auto it = std::find(out.queue.begin(), out.queue.end(), req);
    if (it != out.queue.end()) {
      if (it == out.queue.begin()) out.front_sent = 0;
      out.queue.erase(it);
    }
  } else {
    Incoming& in = in_[req->peer];
    std::erase(in.posted, req);
  }
}

void ShmChannel::Shutdown() {
  {
    std::lock_guard<SpinLock> lock(mutex_);
    shut_ = true;
    for (Outgoing& out : out_) out.queue.clear();
    for (Incoming& in : in_) in.posted.clear();
  }
  WakeSleepers();
}

uint32_t ShmChannel::ArmDoorbell() {
  own_doorbell_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  FullBarrier(own_doorbell_->sleepers);  // pairs with RingDoorbell's
  return own_doorbell_->word.load(std::memory_order_seq_cst);
}

void ShmChannel::SleepOnDoorbell(uint32_t ticket, uint64_t timeout_ns) {
  // Returns at once if the word moved since the ticket: a ring in between.
  const timespec timeout{static_cast<time_t>(timeout_ns / 1000000000ull),
                         static_cast<long>(timeout_ns % 1000000000ull)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&own_doorbell_->word), FUTEX_WAIT, ticket,
          &timeout, nullptr, 0);
  DisarmDoorbell();
}

void ShmChannel::DisarmDoorbell() {
  own_doorbell_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmChannel::WakeSleepers() {
  if (own_doorbell_ != nullptr) WakeDoorbell(own_doorbell_);
}

}  // namespace tern::comm
