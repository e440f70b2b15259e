#include "algorithms.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "comm_kernels.h"
#include "communicator.h"

namespace tern::comm {
namespace {

// count elements split into n near-equal blocks (the first count % n get one more).
struct Blocks {
  uint64_t count;
  uint32_t n;
  uint64_t start(uint64_t i) const { return i * (count / n) + std::min<uint64_t>(i, count % n); }
  uint64_t size(uint64_t i) const { return count / n + (i < count % n ? 1 : 0); }
};

uint32_t Mod(int64_t a, uint32_t n) { return static_cast<uint32_t>(((a % n) + n) % n); }

void CopyIfNeeded(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
}

void DivideIfAvg(Exec& e, void* data, uint64_t count) {
  if (e.op().redop == TERN_COMM_AVG && e.size() > 1 && count > 0) {
    DivideBy(data, data, count, e.op().dtype, e.size());
  }
}

// Non-power-of-two rank counts: the first 2 * rem ranks pair up, the odd
// one of each pair takes part for both (MPICH's fold).
struct Fold {
  uint32_t p = 1;    // power of two taking part
  uint32_t rem = 0;  // n - p
  int64_t newrank = -1;
  uint32_t log2p = 0;
  uint32_t Real(uint32_t nr) const { return nr < rem ? nr * 2 + 1 : nr + rem; }
};
Fold MakeFold(uint32_t n, uint32_t r) {
  Fold f;
  f.p = std::bit_floor(n);
  f.rem = n - f.p;
  f.log2p = static_cast<uint32_t>(std::countr_zero(f.p));
  if (r < 2 * f.rem) {
    f.newrank = (r % 2 == 1) ? static_cast<int64_t>(r / 2) : int64_t{-1};
  } else {
    f.newrank = static_cast<int64_t>(r - f.rem);
  }
  return f;
}

// Fold-in: even ranks of the first pairs hand their data to the odd ones.
// `*cur` is where this rank's current values are (the send buffer until the
// first reduction lands in recv).
Status FoldIn(Exec& e, const Fold& f, const uint8_t** cur, uint8_t* recv, size_t bytes) {
  const uint32_t r = e.rank();
  if (r >= 2 * f.rem) return OkStatus();
  if (r % 2 == 0) return e.Wait(e.Send(r + 1, 0, *cur, bytes));
  TERN_RETURN_IF_ERROR(e.Wait(e.RecvReduce(r - 1, 0, recv, *cur, bytes)));
  *cur = recv;
  return OkStatus();
}

Status FoldOut(Exec& e, const Fold& f, uint8_t* recv, size_t bytes, uint32_t step) {
  const uint32_t r = e.rank();
  if (r >= 2 * f.rem) return OkStatus();
  if (r % 2 == 1) return e.Wait(e.Send(r - 1, step, recv, bytes));
  return e.Wait(e.Recv(r + 1, step, recv, bytes));
}

// --- direct: every peer's device memory is mapped here ---------------------
//
// The ranks tell each other where their buffers are (offsets in their device
// memory), then read and write each other's buffers directly. Small messages
// order the phases: "ready" when a rank's part of the result is final,
// "done" when it no longer reads anyone's buffers (after which the others
// may leave the operation and reuse theirs).

constexpr uint32_t kStepWhere = 0, kStepReady = 1, kStepDone = 2;
constexpr uint64_t kNoBuffer = ~uint64_t{0};

struct Where {
  uint64_t send;
  uint64_t recv;
};

class Direct {
 public:
  explicit Direct(Exec& e) : e_(e), n_(e.size()), r_(e.rank()) {}

  // Exchanges buffer offsets with every peer.
  Status Start() {
    uint8_t* own = e_.PeerBase(r_);
    auto offset = [own](const uint8_t* p) {
      return p == nullptr ? kNoBuffer : static_cast<uint64_t>(p - own);
    };
    where_ = reinterpret_cast<Where*>(e_.Scratch(sizeof(Where) * n_));
    where_[r_] = Where{offset(e_.op().send), offset(e_.op().recv)};
    for (uint32_t p = 0; p < n_; ++p) {
      if (p == r_) continue;
      e_.Recv(p, kStepWhere, &where_[p], sizeof(Where));
      e_.Send(p, kStepWhere, &where_[r_], sizeof(Where));
    }
    TERN_RETURN_IF_ERROR(e_.WaitAll());
    for (uint32_t p = 0; p < n_; ++p) {
      if (p != r_) TERN_RETURN_IF_ERROR(CheckWhere(p));
    }
    return OkStatus();
  }
  uint8_t* Send(uint32_t p) const {
    return p == r_ ? e_.op().send : e_.PeerBase(p) + where_[p].send;
  }
  uint8_t* Recv(uint32_t p) const {
    return p == r_ ? e_.op().recv : e_.PeerBase(p) + where_[p].recv;
  }

  // Tells every peer this rank reached `step`; PostWait posts the receipt
  // of theirs, Wait(p) waits for peer p's.
  void Signal(uint32_t step) {
    static const uint8_t kNothing = 0;
    for (uint32_t p = 0; p < n_; ++p) {
      if (p != r_) e_.Send(p, step, &kNothing, 0);
    }
  }
  void PostWait(uint32_t step) {
    arrived_.assign(n_, nullptr);
    for (uint32_t p = 0; p < n_; ++p) {
      if (p != r_) arrived_[p] = e_.Recv(p, step, &sink_, 0);
    }
  }
  Status Wait(uint32_t p) { return p == r_ ? OkStatus() : e_.Wait(arrived_[p]); }

  // Ends the operation: nobody leaves before everyone stopped reading.
  Status Finish() {
    PostWait(kStepDone);
    Signal(kStepDone);
    return e_.WaitAll();
  }

  // The send buffers of every rank at `offset`, this rank's first: in place,
  // dst is this rank's own source, so it must be read before it is written.
  std::vector<const uint8_t*> Sources(uint64_t offset) const {
    std::vector<const uint8_t*> src;
    for (uint32_t i = 0; i < n_; ++i) src.push_back(Send((r_ + i) % n_) + offset);
    return src;
  }

  // dst[0, count) = op over k of src[k][0, count), in the order given, a
  // chunk at a time so that dst stays in cache across the passes.
  void ReduceAll(uint8_t* dst, const std::vector<const uint8_t*>& src, uint64_t count) const {
    const size_t es = e_.element_size();
    const uint64_t chunk = std::max<uint64_t>(1, (128u << 10) / es);
    for (uint64_t i = 0; i < count; i += chunk) {
      const uint64_t len = std::min(chunk, count - i);
      e_.ReduceLocal(dst + i * es, src[0] + i * es, src[1] + i * es, len);
      for (size_t k = 2; k < src.size(); ++k)
        e_.ReduceLocal(dst + i * es, dst + i * es, src[k] + i * es, len);
    }
  }

 private:
  // The offsets come from the peer: every range of its memory that this
  // operation reads or writes must lie inside what is mapped of it.
  Status CheckWhere(uint32_t p) const {
    const OpDesc& op = e_.op();
    const uint64_t block = op.count * e_.element_size();
    const uint64_t all = block * n_;
    uint64_t send_extent = block, recv_extent = 0;  // recv: only all-reduce reads peers'
    switch (op.kind) {
      case OpKind::kAllReduce:
        recv_extent = block;
        break;
      case OpKind::kReduceScatter:
      case OpKind::kAllToAll:
        send_extent = all;
        break;
      case OpKind::kBroadcast:
        if (p != op.root) send_extent = 0;
        break;
      default:
        break;
    }
    const uint64_t limit = e_.PeerBytes(p);
    auto fits = [limit](uint64_t offset, uint64_t extent) {
      return extent == 0 || (offset != kNoBuffer && offset <= limit && extent <= limit - offset);
    };
    if (!fits(where_[p].send, send_extent) || !fits(where_[p].recv, recv_extent)) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "rank {} placed its buffers of {} at offsets {:#x} (send) and {:#x} "
                        "(recv) of its device memory, outside the {} bytes mapped here (the "
                        "operation uses {} and {} bytes of them): refusing to use them",
                        p, Describe(op), where_[p].send, where_[p].recv, limit, send_extent,
                        recv_extent);
    }
    return OkStatus();
  }

  Exec& e_;
  const uint32_t n_, r_;
  Where* where_ = nullptr;
  std::vector<Request*> arrived_;
  uint8_t sink_ = 0;
};

Status DirectAllReduce(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t es = e.element_size();
  Direct d(e);
  TERN_RETURN_IF_ERROR(d.Start());
  d.PostWait(kStepReady);
  // This rank's segment, from everyone's send buffer.
  const Blocks seg{op.count, n};
  const uint64_t start = seg.start(r) * es;
  if (seg.size(r) > 0) {
    d.ReduceAll(op.recv + start, d.Sources(start), seg.size(r));
    DivideIfAvg(e, op.recv + start, seg.size(r));
  }
  d.Signal(kStepReady);
  // The others' segments, from their receive buffers once final.
  for (uint32_t i = 1; i < n; ++i) {
    const uint32_t p = (r + i) % n;
    TERN_RETURN_IF_ERROR(d.Wait(p));
    CopyIfNeeded(op.recv + seg.start(p) * es, d.Recv(p) + seg.start(p) * es, seg.size(p) * es);
  }
  return d.Finish();
}

Status DirectReduceScatter(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t r = e.rank();
  const size_t es = e.element_size();
  Direct d(e);
  TERN_RETURN_IF_ERROR(d.Start());
  d.ReduceAll(op.recv, d.Sources(r * op.count * es), op.count);
  DivideIfAvg(e, op.recv, op.count);
  return d.Finish();
}

// Block p of recv from every rank p's send range, at block `send_block` of
// it (all-gather: its only block, 0; all-to-all: this rank's), starting with
// this rank so that the ranks do not all read one peer at once. In place
// (all-gather), this rank's block is already where it belongs.
Status DirectCollectBlocks(Exec& e, uint32_t send_block) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t block = op.count * e.element_size();
  Direct d(e);
  TERN_RETURN_IF_ERROR(d.Start());
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t p = (r + i) % n;
    CopyIfNeeded(op.recv + p * block, d.Send(p) + send_block * block, block);
  }
  return d.Finish();
}

Status DirectAllGather(Exec& e) { return DirectCollectBlocks(e, 0); }

// The ranges never overlap (comm_api refuses that), so nothing is in place.
Status DirectAllToAll(Exec& e) { return DirectCollectBlocks(e, e.rank()); }

Status DirectBroadcast(Exec& e) {
  const OpDesc& op = e.op();
  Direct d(e);
  TERN_RETURN_IF_ERROR(d.Start());
  CopyIfNeeded(op.recv, d.Send(op.root), op.count * e.element_size());
  return d.Finish();
}

Status DirectReduce(Exec& e) {
  const OpDesc& op = e.op();
  Direct d(e);
  TERN_RETURN_IF_ERROR(d.Start());
  if (e.rank() == op.root) {
    d.ReduceAll(op.recv, d.Sources(0), op.count);
    DivideIfAvg(e, op.recv, op.count);
  }
  return d.Finish();
}

bool UseDirect(Exec& e, uint64_t bytes) { return e.direct() && bytes >= e.config().direct_min; }

// --- all-reduce ---------------------------------------------------------------

Status AllReduceRecursiveDoubling(Exec& e) {
  const OpDesc& op = e.op();
  const size_t bytes = op.count * e.element_size();
  const Fold f = MakeFold(e.size(), e.rank());
  const uint8_t* cur = op.send;
  TERN_RETURN_IF_ERROR(FoldIn(e, f, &cur, op.recv, bytes));
  if (f.newrank >= 0) {
    uint8_t* tmp = nullptr;
    uint32_t step = 1;
    for (uint32_t mask = 1; mask < f.p; mask <<= 1, ++step) {
      const uint32_t partner = f.Real(static_cast<uint32_t>(f.newrank) ^ mask);
      // Small messages over tern-shm: one slot each way, no requests.
      if (e.SendNow(partner, step, cur, bytes)) {
        if (!e.RecvReduceNow(partner, step, op.recv, cur, bytes)) {
          TERN_RETURN_IF_ERROR(e.Wait(e.RecvReduce(partner, step, op.recv, cur, bytes)));
        }
        cur = op.recv;
        continue;
      }
      Request* send = e.Send(partner, step, cur, bytes);
      if (send->done()) {
        // The data already left `cur` (copied into a ring or an inject
        // buffer): reduce the partner's straight into recv.
        TERN_RETURN_IF_ERROR(e.Wait(send));
        TERN_RETURN_IF_ERROR(e.Wait(e.RecvReduce(partner, step, op.recv, cur, bytes)));
      } else {
        if (tmp == nullptr) tmp = e.Scratch(bytes);
        Request* recv = e.Recv(partner, step, tmp, bytes);
        TERN_RETURN_IF_ERROR(e.Wait(recv));
        TERN_RETURN_IF_ERROR(e.Wait(send));
        e.ReduceLocal(op.recv, cur, tmp, op.count);
      }
      cur = op.recv;
    }
  }
  TERN_RETURN_IF_ERROR(FoldOut(e, f, op.recv, bytes, f.log2p + 1));
  DivideIfAvg(e, op.recv, op.count);
  return OkStatus();
}

Status AllReduceRabenseifner(Exec& e) {
  const OpDesc& op = e.op();
  const size_t es = e.element_size();
  const size_t bytes = op.count * es;
  const Fold f = MakeFold(e.size(), e.rank());
  const uint8_t* cur = op.send;
  TERN_RETURN_IF_ERROR(FoldIn(e, f, &cur, op.recv, bytes));
  if (f.newrank >= 0) {
    const uint32_t nr = static_cast<uint32_t>(f.newrank);
    const Blocks blocks{op.count, f.p};
    uint32_t lo = 0, hi = f.p;
    uint32_t step = 1;
    // Recursive halving: keep half of the range, hand the other half over.
    for (uint32_t mask = f.p >> 1; mask >= 1; mask >>= 1, ++step) {
      const uint32_t partner = f.Real(nr ^ mask);
      const uint32_t mid = lo + (hi - lo) / 2;
      const bool lower = (nr & mask) == 0;
      const uint32_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
      const uint32_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
      const size_t keep_off = blocks.start(keep_lo) * es;
      const size_t keep_bytes = (blocks.start(keep_hi) - blocks.start(keep_lo)) * es;
      const size_t give_off = blocks.start(give_lo) * es;
      const size_t give_bytes = (blocks.start(give_hi) - blocks.start(give_lo)) * es;
      Request* send = e.Send(partner, step, cur + give_off, give_bytes);
      Request* recv = e.RecvReduce(partner, step, op.recv + keep_off, cur + keep_off, keep_bytes);
      TERN_RETURN_IF_ERROR(e.Wait(recv));
      TERN_RETURN_IF_ERROR(e.Wait(send));
      cur = op.recv;
      lo = keep_lo;
      hi = keep_hi;
      if (mask == 1) break;
    }
    if (f.p == 1) CopyIfNeeded(op.recv, cur, bytes);
    if (op.redop == TERN_COMM_AVG) {
      DivideBy(op.recv + blocks.start(nr) * es, op.recv + blocks.start(nr) * es, blocks.size(nr),
               op.dtype, e.size());
    }
    // Recursive doubling all-gather of the reduced blocks.
    step = 1 + f.log2p;
    for (uint32_t mask = 1; mask < f.p; mask <<= 1, ++step) {
      const uint32_t partner_nr = nr ^ mask;
      const uint32_t partner = f.Real(partner_nr);
      const uint32_t own_lo = nr & ~(mask - 1), their_lo = partner_nr & ~(mask - 1);
      const size_t own_off = blocks.start(own_lo) * es;
      const size_t own_bytes = (blocks.start(own_lo + mask) - blocks.start(own_lo)) * es;
      const size_t their_off = blocks.start(their_lo) * es;
      const size_t their_bytes = (blocks.start(their_lo + mask) - blocks.start(their_lo)) * es;
      Request* send = e.Send(partner, step, op.recv + own_off, own_bytes);
      Request* recv = e.Recv(partner, step, op.recv + their_off, their_bytes);
      TERN_RETURN_IF_ERROR(e.Wait(recv));
      TERN_RETURN_IF_ERROR(e.Wait(send));
    }
  }
  TERN_RETURN_IF_ERROR(FoldOut(e, f, op.recv, bytes, 2 * f.log2p + 1));
  return OkStatus();
}

// The pipelined ring: items (step, chunk) in order; the receive of item j
// is posted up to one step ahead, and the send of item j waits for the
// receive of the same chunk one step earlier. `recv_item` and `send_item`
// post one item each.
template <typename RecvItem, typename SendItem, typename BeforeSend>
Status RingPipeline(Exec& e, uint32_t steps, uint32_t chunks, RecvItem recv_item,
                    SendItem send_item, BeforeSend before_send) {
  const uint32_t items = steps * chunks;
  std::vector<Request*> recvs(items, nullptr);
  std::vector<Request*> sends;
  sends.reserve(items);
  uint32_t posted = 0;
  for (uint32_t j = 0; j < items; ++j) {
    while (posted < items && posted <= j + chunks) {
      recvs[posted] = recv_item(posted);
      ++posted;
    }
    if (j >= chunks) {
      TERN_RETURN_IF_ERROR(e.Wait(recvs[j - chunks]));
      before_send(j);
    }
    sends.push_back(send_item(j));
  }
  for (uint32_t j = items >= chunks ? items - chunks : 0; j < items; ++j) {
    TERN_RETURN_IF_ERROR(e.Wait(recvs[j]));
  }
  for (Request* s : sends) TERN_RETURN_IF_ERROR(e.Wait(s));
  return OkStatus();
}

constexpr uint32_t kMaxRingChunks = 16;  // per segment and round

Status AllReduceRing(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t es = e.element_size();
  const uint32_t left = Mod(static_cast<int64_t>(r) - 1, n), right = (r + 1) % n;
  const uint64_t chunk_elems = std::max<uint64_t>(1, e.config().chunk_bytes / es);
  const uint64_t round_elems = static_cast<uint64_t>(n) * kMaxRingChunks * chunk_elems;
  uint32_t step_base = 0;
  for (uint64_t round = 0; round < op.count; round += round_elems) {
    const uint64_t rc = std::min(round_elems, op.count - round);
    const Blocks seg{rc, n};
    const uint64_t max_seg = seg.size(0);
    const uint32_t chunks =
        static_cast<uint32_t>(std::max<uint64_t>(1, (max_seg + chunk_elems - 1) / chunk_elems));
    const uint64_t ce = (max_seg + chunks - 1) / chunks;
    // Elements of chunk c of segment s: [start, start + len).
    auto chunk = [&](uint32_t s, uint32_t c, uint64_t* start, uint64_t* len) {
      const uint64_t begin = std::min(seg.size(s), c * ce);
      const uint64_t end = std::min(seg.size(s), (c + 1) * ce);
      *start = round + seg.start(s) + begin;
      *len = end - begin;
    };
    const uint32_t steps = 2 * (n - 1);
    auto recv_item = [&](uint32_t j) {
      const uint32_t s = j / chunks, c = j % chunks;
      uint64_t start, len;
      if (s < n - 1) {
        chunk(Mod(static_cast<int64_t>(r) - s - 1, n), c, &start, &len);
        return e.RecvReduce(left, step_base + j, op.recv + start * es, op.send + start * es,
                            len * es);
      }
      chunk(Mod(static_cast<int64_t>(r) - (s - (n - 1)), n), c, &start, &len);
      return e.Recv(left, step_base + j, op.recv + start * es, len * es);
    };
    auto send_item = [&](uint32_t j) {
      const uint32_t s = j / chunks, c = j % chunks;
      uint64_t start, len;
      if (s < n - 1) {
        chunk(Mod(static_cast<int64_t>(r) - s, n), c, &start, &len);
        const uint8_t* src = s == 0 ? op.send : op.recv;
        return e.Send(right, step_base + j, src + start * es, len * es);
      }
      chunk(Mod(static_cast<int64_t>(r) + 1 - (s - (n - 1)), n), c, &start, &len);
      return e.Send(right, step_base + j, op.recv + start * es, len * es);
    };
    auto before_send = [&](uint32_t j) {
      // The first all-gather step sends this rank's fully reduced segment:
      // AVG divides it once here.
      if (op.redop != TERN_COMM_AVG || j / chunks != n - 1) return;
      uint64_t start, len;
      chunk((r + 1) % n, j % chunks, &start, &len);
      DivideBy(op.recv + start * es, op.recv + start * es, len, op.dtype, n);
    };
    TERN_RETURN_IF_ERROR(RingPipeline(e, steps, chunks, recv_item, send_item, before_send));
    step_base += steps * chunks;
  }
  return OkStatus();
}

Status AllReduce(Exec& e) {
  const OpDesc& op = e.op();
  const size_t bytes = op.count * e.element_size();
  if (e.size() == 1) {
    CopyIfNeeded(op.recv, op.send, bytes);
    return OkStatus();
  }
  if (UseDirect(e, bytes)) return DirectAllReduce(e);
  AllReduceAlgo algo = e.config().allreduce_algo;
  if (algo == AllReduceAlgo::kAuto) {
    if (bytes <= e.config().allreduce_rd_max)
      algo = AllReduceAlgo::kRecursiveDoubling;
    else if (bytes < e.config().allreduce_ring_min)
      algo = AllReduceAlgo::kRabenseifner;
    else
      algo = AllReduceAlgo::kRing;
  }
  // Halving needs an element per block.
  if (algo == AllReduceAlgo::kRabenseifner && op.count < std::bit_floor(e.size())) {
    algo = AllReduceAlgo::kRecursiveDoubling;
  }
  switch (algo) {
    case AllReduceAlgo::kRabenseifner:
      return AllReduceRabenseifner(e);
    case AllReduceAlgo::kRing:
      return AllReduceRing(e);
    default:
      return AllReduceRecursiveDoubling(e);
  }
}

// --- reduce-scatter -------------------------------------------------------------

Status ReduceScatter(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t es = e.element_size();
  const uint64_t rc = op.count;  // per rank
  if (n == 1) {
    CopyIfNeeded(op.recv, op.send, rc * es);
    return OkStatus();
  }
  if (UseDirect(e, rc * es * n)) return DirectReduceScatter(e);
  const uint32_t left = Mod(static_cast<int64_t>(r) - 1, n), right = (r + 1) % n;
  const uint64_t chunk_elems = std::max<uint64_t>(1, e.config().chunk_bytes / es);
  const uint64_t round_elems = kMaxRingChunks * chunk_elems;  // of each block
  uint8_t* partial =
      n > 2 ? e.Scratch(static_cast<size_t>(n) * std::min(round_elems, rc) * es) : nullptr;
  uint32_t step_base = 0;
  for (uint64_t round = 0; round < rc; round += round_elems) {
    const uint64_t len_round = std::min(round_elems, rc - round);
    const uint32_t chunks =
        static_cast<uint32_t>(std::max<uint64_t>(1, (len_round + chunk_elems - 1) / chunk_elems));
    const uint64_t ce = (len_round + chunks - 1) / chunks;
    auto span = [&](uint32_t c, uint64_t* begin, uint64_t* len) {
      const uint64_t b = std::min(len_round, c * ce);
      *begin = b;
      *len = std::min(len_round, (c + 1) * ce) - b;
    };
    const uint32_t steps = n - 1;
    auto recv_item = [&](uint32_t j) {
      const uint32_t s = j / chunks, c = j % chunks;
      const uint32_t block = Mod(static_cast<int64_t>(r) - s - 2, n);
      uint64_t b, len;
      span(c, &b, &len);
      const uint8_t* a = op.send + (block * rc + round + b) * es;
      uint8_t* dst =
          s == n - 2 ? op.recv + (round + b) * es : partial + (block * len_round + b) * es;
      return e.RecvReduce(left, step_base + j, dst, a, len * es);
    };
    auto send_item = [&](uint32_t j) {
      const uint32_t s = j / chunks, c = j % chunks;
      const uint32_t block = Mod(static_cast<int64_t>(r) - s - 1, n);
      uint64_t b, len;
      span(c, &b, &len);
      const uint8_t* src =
          s == 0 ? op.send + (block * rc + round + b) * es : partial + (block * len_round + b) * es;
      return e.Send(right, step_base + j, src, len * es);
    };
    TERN_RETURN_IF_ERROR(RingPipeline(e, steps, chunks, recv_item, send_item, [](uint32_t) {}));
    step_base += steps * chunks;
  }
  DivideIfAvg(e, op.recv, rc);
  return OkStatus();
}

// --- all-gather -----------------------------------------------------------------

Status AllGather(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t block = op.count * e.element_size();
  if (n > 1 && UseDirect(e, block * n)) return DirectAllGather(e);
  CopyIfNeeded(op.recv + r * block, op.send, block);
  if (n == 1) return OkStatus();
  if (std::has_single_bit(n) && block * n <= e.config().allgather_rd_max) {
    uint32_t step = 0;
    for (uint32_t mask = 1; mask < n; mask <<= 1, ++step) {
      const uint32_t partner = r ^ mask;
      const uint32_t own_lo = r & ~(mask - 1), their_lo = partner & ~(mask - 1);
      Request* send = e.Send(partner, step, op.recv + own_lo * block, mask * block);
      Request* recv = e.Recv(partner, step, op.recv + their_lo * block, mask * block);
      TERN_RETURN_IF_ERROR(e.Wait(recv));
      TERN_RETURN_IF_ERROR(e.Wait(send));
    }
    return OkStatus();
  }
  const uint32_t left = Mod(static_cast<int64_t>(r) - 1, n), right = (r + 1) % n;
  // Received straight into place: no staging, so chunks only bound latency.
  const size_t chunk = std::max<size_t>(e.config().chunk_bytes, (block + 255) / 256);
  const uint32_t chunks = static_cast<uint32_t>(std::max<size_t>(1, (block + chunk - 1) / chunk));
  auto piece = [&](uint32_t c, size_t* off, size_t* len) {
    *off = std::min(block, c * chunk);
    *len = std::min(block, (c + 1) * chunk) - *off;
  };
  auto recv_item = [&](uint32_t j) {
    const uint32_t s = j / chunks, c = j % chunks;
    const uint32_t b = Mod(static_cast<int64_t>(r) - s - 1, n);
    size_t off, len;
    piece(c, &off, &len);
    return e.Recv(left, j, op.recv + b * block + off, len);
  };
  auto send_item = [&](uint32_t j) {
    const uint32_t s = j / chunks, c = j % chunks;
    const uint32_t b = Mod(static_cast<int64_t>(r) - s, n);
    size_t off, len;
    piece(c, &off, &len);
    return e.Send(right, j, op.recv + b * block + off, len);
  };
  return RingPipeline(e, n - 1, chunks, recv_item, send_item, [](uint32_t) {});
}

// --- broadcast and reduce ---------------------------------------------------------

struct Tree {
  int64_t parent = -1;             // real rank
  std::vector<uint32_t> children;  // real ranks, farthest first
};

Tree MakeTree(uint32_t n, uint32_t r, uint32_t root, bool chain) {
  Tree t;
  const uint32_t vr = Mod(static_cast<int64_t>(r) - root, n);
  auto real = [&](uint32_t v) { return (v + root) % n; };
  if (chain) {
    if (vr > 0) t.parent = real(vr - 1);
    if (vr + 1 < n) t.children.push_back(real(vr + 1));
    return t;
  }
  uint32_t top;
  if (vr == 0) {
    top = std::bit_ceil(n);
  } else {
    top = vr & (~vr + 1);  // lowest set bit
    t.parent = real(vr - top);
  }
  for (uint32_t mask = top >> 1; mask >= 1; mask >>= 1) {
    if (vr + mask < n) t.children.push_back(real(vr + mask));
    if (mask == 1) break;
  }
  return t;
}

Status Broadcast(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t bytes = op.count * e.element_size();
  const bool is_root = r == op.root;
  if (n == 1) {
    CopyIfNeeded(op.recv, op.send, bytes);
    return OkStatus();
  }
  if (UseDirect(e, bytes)) return DirectBroadcast(e);
  const bool chain = bytes > e.config().tree_max;
  const Tree tree = MakeTree(n, r, op.root, chain);
  const size_t chunk = chain ? std::max<size_t>(e.config().chunk_bytes, (bytes + 1023) / 1024)
                             : std::max<size_t>(bytes, 1);
  const uint32_t chunks = static_cast<uint32_t>(std::max<size_t>(1, (bytes + chunk - 1) / chunk));
  auto piece = [&](uint32_t c, size_t* off, size_t* len) {
    *off = std::min(bytes, c * chunk);
    *len = std::min(bytes, (c + 1) * chunk) - *off;
  };
  const uint8_t* src = is_root ? op.send : op.recv;
  std::vector<Request*> recvs(chunks, nullptr);
  if (!is_root) {
    for (uint32_t c = 0; c < chunks; ++c) {
      size_t off, len;
      piece(c, &off, &len);
      recvs[c] = e.Recv(static_cast<uint32_t>(tree.parent), c, op.recv + off, len);
    }
  }
  for (uint32_t c = 0; c < chunks; ++c) {
    if (!is_root) TERN_RETURN_IF_ERROR(e.Wait(recvs[c]));
    size_t off, len;
    piece(c, &off, &len);
    for (uint32_t child : tree.children) e.Send(child, c, src + off, len);
  }
  TERN_RETURN_IF_ERROR(e.WaitAll());
  if (is_root) CopyIfNeeded(op.recv, op.send, bytes);
  return OkStatus();
}

Status ReduceOp(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t es = e.element_size();
  const size_t bytes = op.count * es;
  const bool is_root = r == op.root;
  if (n == 1) {
    CopyIfNeeded(op.recv, op.send, bytes);
    return OkStatus();
  }
  if (UseDirect(e, bytes)) return DirectReduce(e);
  const bool chain = bytes > e.config().tree_max;
  const Tree tree = MakeTree(n, r, op.root, chain);
  const size_t chunk_elems =
      chain ? std::max<size_t>(e.config().chunk_bytes / es, 1) : std::max<size_t>(op.count, 1);
  const uint32_t chunks =
      static_cast<uint32_t>(std::max<size_t>(1, (op.count + chunk_elems - 1) / chunk_elems));
  auto piece = [&](uint32_t c, size_t* off, size_t* len) {
    *off = std::min(op.count, c * chunk_elems) * es;
    *len = std::min(op.count, (c + 1) * chunk_elems) * es - *off;
  };
  uint8_t* acc = nullptr;
  if (!tree.children.empty()) acc = is_root ? op.recv : e.Scratch(bytes);
  // With one child (the chain), the next chunk's receive is posted before
  // waiting for the current one.
  Request* next = nullptr;
  for (uint32_t c = 0; c < chunks; ++c) {
    size_t off, len;
    piece(c, &off, &len);
    if (tree.children.empty()) {
      e.Send(static_cast<uint32_t>(tree.parent), c, op.send + off, len);
      continue;
    }
    for (size_t k = 0; k < tree.children.size(); ++k) {
      Request* req;
      if (k == 0 && next != nullptr) {
        req = next;
        next = nullptr;
      } else {
        req = e.RecvReduce(tree.children[k], c, acc + off, (k == 0 ? op.send : acc) + off, len);
      }
      if (tree.children.size() == 1 && c + 1 < chunks) {
        size_t noff, nlen;
        piece(c + 1, &noff, &nlen);
        next = e.RecvReduce(tree.children[0], c + 1, acc + noff, op.send + noff, nlen);
      }
      TERN_RETURN_IF_ERROR(e.Wait(req));
    }
    if (tree.parent >= 0) e.Send(static_cast<uint32_t>(tree.parent), c, acc + off, len);
  }
  TERN_RETURN_IF_ERROR(e.WaitAll());
  if (is_root) DivideIfAvg(e, op.recv, op.count);
  return OkStatus();
}

// --- all-to-all, point to point, barrier -------------------------------------------

Status AllToAll(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t n = e.size(), r = e.rank();
  const size_t block = op.count * e.element_size();
  if (n > 1 && UseDirect(e, block * n)) return DirectAllToAll(e);
  CopyIfNeeded(op.recv + r * block, op.send + r * block, block);
  constexpr uint32_t kWindow = 16;
  for (uint32_t first = 1; first < n; first += kWindow) {
    const uint32_t last = std::min(n, first + kWindow);
    for (uint32_t s = first; s < last; ++s) {
      const uint32_t from = Mod(static_cast<int64_t>(r) - s, n), to = (r + s) % n;
      e.Recv(from, s, op.recv + from * block, block);
      e.Send(to, s, op.send + to * block, block);
    }
    TERN_RETURN_IF_ERROR(e.WaitAll());
  }
  return OkStatus();
}

Status Barrier(Exec& e) {
  const uint32_t n = e.size(), r = e.rank();
  static const uint8_t kNothing = 0;
  uint8_t sink = 0;
  uint32_t step = 0;
  for (uint32_t d = 1; d < n; d <<= 1, ++step) {
    Request* send = e.Send((r + d) % n, step, &kNothing, 0);
    Request* recv = e.Recv(Mod(static_cast<int64_t>(r) - d, n), step, &sink, 0);
    TERN_RETURN_IF_ERROR(e.Wait(recv));
    TERN_RETURN_IF_ERROR(e.Wait(send));
  }
  return OkStatus();
}

Status PointToPoint(Exec& e) {
  const OpDesc& op = e.op();
  const uint32_t sig = op.signature;
  // Receives enqueued behind a receive from any source are numbered now
  // that those before them (that one included) have run.
  auto recv_sequence = [&](uint32_t peer, uint64_t sequence) {
    return sequence == kSequenceAtRunTime ? e.comm()->TakeRecvSequence(peer) : sequence;
  };
  if (op.kind == OpKind::kSend) {
    return e.Wait(e.SendTagged(op.root, MakeTag(true, e.rank(), op.sequence, sig, 0), op.send,
                               op.count * e.element_size()));
  }
  if (op.kind == OpKind::kRecv) {
    const uint64_t sequence = recv_sequence(op.root, op.sequence);
    return e.Wait(e.RecvTagged(op.root, MakeTag(true, op.root, sequence, sig, 0), op.recv,
                               op.count * e.element_size()));
  }
  if (op.kind == OpKind::kRecvAny) {
    uint32_t peer = 0;
    uint64_t sequence = 0;
    TERN_RETURN_IF_ERROR(e.comm()->FindSender(&peer, &sequence));
    *op.out_peer = peer;
    return e.Wait(e.RecvTagged(peer, MakeTag(true, peer, sequence, sig, 0), op.recv,
                               op.count * e.element_size()));
  }
  // A group: everything posted, then everything awaited.
  for (const P2P& p : op.group) {
    const size_t bytes = p.count * tern_dtype_size(p.dtype);
    const uint32_t psig = Signature(OpKind::kSend, p.dtype, TERN_COMM_SUM, p.count, 0);
    if (p.is_send) {
      e.SendTagged(p.peer, MakeTag(true, e.rank(), p.sequence, psig, 0), p.buffer, bytes);
    } else {
      e.RecvTagged(p.peer, MakeTag(true, p.peer, recv_sequence(p.peer, p.sequence), psig, 0),
                   p.buffer, bytes);
    }
  }
  return e.WaitAll();
}

}  // namespace

Status RunAlgorithm(Exec& e) {
  switch (e.op().kind) {
    case OpKind::kAllReduce:
      return AllReduce(e);
    case OpKind::kReduceScatter:
      return ReduceScatter(e);
    case OpKind::kAllGather:
      return AllGather(e);
    case OpKind::kBroadcast:
      return Broadcast(e);
    case OpKind::kReduce:
      return ReduceOp(e);
    case OpKind::kAllToAll:
      return AllToAll(e);
    case OpKind::kBarrier:
      return Barrier(e);
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kGroup:
    case OpKind::kRecvAny:
      return PointToPoint(e);
  }
  return MakeStatus(TERN_ERROR_INTERNAL, "unknown collective kind {}",
                    static_cast<int>(e.op().kind));
}

}  // namespace tern::comm
