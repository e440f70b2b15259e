#include "comm_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/half_float.h"

namespace tern_test {

std::string LastError(tern_status_t status) {
  return std::string(tern_status_string(status)) + ": " + tern_last_error_message();
}

namespace {

enum class Kind {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kP2PGroup,
  kP2POrdered,
  kP2PAnySource  // every other rank sends to rank 0, which receives from any source
};

bool IsPointToPoint(Kind k) {
  return k == Kind::kP2PGroup || k == Kind::kP2POrdered || k == Kind::kP2PAnySource;
}

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kP2PGroup:
      return "send/recv group";
    case Kind::kP2POrdered:
      return "send/recv ordered";
    case Kind::kP2PAnySource:
      return "send/recv from any source";
  }
  return "?";
}

const char* DtypeText(tern_dtype_t d) { return tern_dtype_name(d); }

const char* RedopText(tern_comm_redop_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return kNames[op];
}

size_t Size(tern_dtype_t d) {
  switch (d) {
    case TERN_DTYPE_F32:
    case TERN_DTYPE_I32:
      return 4;
    case TERN_DTYPE_BF16:
    case TERN_DTYPE_F16:
      return 2;
    case TERN_DTYPE_I8:
      return 1;
    default:
      return 8;
  }
}

bool HasRedop(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter;
}

// Small integers, exact in every dtype, chosen per reduction so that the
// combination of up to 16 ranks stays exact.
int64_t Value(bool reducing, tern_comm_redop_t redop, uint32_t salt, uint32_t rank, uint64_t i) {
  const uint64_t h = rank * 7919u + i * 104729u + salt * 1299709u;
  if (!reducing) return static_cast<int64_t>(h % 120) - 60;
  switch (redop) {
    case TERN_COMM_SUM:
    case TERN_COMM_AVG:
      return static_cast<int64_t>(h % 7) - 3;
    case TERN_COMM_PROD: {
      static const int64_t kFactors[] = {1, -1, 2, -1, 1, 1, -1, 1};
      return kFactors[h % 8];
    }
    default:
      return static_cast<int64_t>(h % 23) - 11;
  }
}

void PutFloat(tern_dtype_t d, uint8_t* base, uint64_t i, float v) {
  switch (d) {
    case TERN_DTYPE_F32:
      std::memcpy(base + i * 4, &v, 4);
      return;
    case TERN_DTYPE_BF16: {
      const uint16_t b = tern::F32ToBf16(v);
      std::memcpy(base + i * 2, &b, 2);
      return;
    }
    case TERN_DTYPE_F16: {
      const uint16_t b = tern::F32ToF16(v);
      std::memcpy(base + i * 2, &b, 2);
      return;
    }
    default:
      return;
  }
}

void Put(tern_dtype_t d, uint8_t* base, uint64_t i, int64_t v) {
  switch (d) {
    case TERN_DTYPE_I8:
      base[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
      return;
    case TERN_DTYPE_I32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(base + i * 4, &x, 4);
      return;
    }
    case TERN_DTYPE_I64:
      std::memcpy(base + i * 8, &v, 8);
      return;
    default:
      PutFloat(d, base, i, static_cast<float>(v));
      return;
  }
}

// The combination of every rank's value, stored as the dtype stores it.
void PutCombined(tern_dtype_t d, uint8_t* base, uint64_t i, tern_comm_redop_t op,
                 const std::vector<int64_t>& v) {
  int64_t acc = v[0];
  for (size_t k = 1; k < v.size(); ++k) {
    switch (op) {
      case TERN_COMM_SUM:
      case TERN_COMM_AVG:
        acc += v[k];
        break;
      case TERN_COMM_PROD:
        acc *= v[k];
        break;
      case TERN_COMM_MAX:
        acc = std::max(acc, v[k]);
        break;
      case TERN_COMM_MIN:
        acc = std::min(acc, v[k]);
        break;
      default:
        break;
    }
  }
  if (op == TERN_COMM_AVG) {
    const int64_t n = static_cast<int64_t>(v.size());
    if (d == TERN_DTYPE_F32 || d == TERN_DTYPE_BF16 || d == TERN_DTYPE_F16) {
      PutFloat(d, base, i, static_cast<float>(acc) / static_cast<float>(n));
    } else {
      Put(d, base, i, acc / n);
    }
    return;
  }
  Put(d, base, i, acc);
}

struct Buffers {
  tern_buffer_t send = nullptr;
  tern_buffer_t recv = nullptr;
  uint64_t bytes = 0;
};

class Runner {
 public:
  Runner(tern_comm_t comm, tern_queue_t queue, uint32_t rank, uint32_t size, Buffers buffers)
      : comm_(comm), queue_(queue), rank_(rank), size_(size), b_(buffers) {}

  void Run(Kind kind, tern_dtype_t dtype, uint64_t count, tern_comm_redop_t redop, uint32_t root,
           bool in_place);
  MatrixResult result;

 private:
  void Fail(const std::string& what) {
    if (result.failures.size() < 4000) result.failures += what + "\n";
  }
  bool Write(tern_buffer_t buffer, uint64_t offset, const std::vector<uint8_t>& data) {
    const tern_status_t s = tern_buffer_write(buffer, offset, data.data(), data.size());
    if (s != TERN_OK) Fail("tern_buffer_write: " + LastError(s));
    return s == TERN_OK;
  }
  bool Read(tern_buffer_t buffer, uint64_t offset, std::vector<uint8_t>* data) {
    const tern_status_t s = tern_buffer_read(buffer, offset, data->data(), data->size());
    if (s != TERN_OK) Fail("tern_buffer_read: " + LastError(s));
    return s == TERN_OK;
  }
  void Compare(const std::string& label, const std::vector<uint8_t>& got,
               const std::vector<uint8_t>& want, size_t element) {
    if (got == want) return;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] == want[i]) continue;
      const size_t e = i / element;
      std::string g, w;
      char hex[8];
      for (size_t k = 0; k < element; ++k) {
        std::snprintf(hex, sizeof(hex), "%02x", got[e * element + element - 1 - k]);
        g += hex;
        std::snprintf(hex, sizeof(hex), "%02x", want[e * element + element - 1 - k]);
        w += hex;
      }
      Fail(label + ": element " + std::to_string(e) + " is 0x" + g + ", expected 0x" + w);
      return;
    }
  }

  tern_comm_t comm_;
  tern_queue_t queue_;
  uint32_t rank_, size_;
  Buffers b_;
  uint32_t salt_ = 0;
};

void Runner::Run(Kind kind, tern_dtype_t dtype, uint64_t count, tern_comm_redop_t redop,
                 uint32_t root, bool in_place) {
  const size_t es = Size(dtype);
  const uint32_t n = size_;
  const uint32_t r = rank_;
  const uint32_t salt = ++salt_;
  const bool reducing = HasRedop(kind);
  char label_buffer[200];
  std::snprintf(
      label_buffer, sizeof(label_buffer), "rank %u of %u: %s%s%s %s count=%llu root=%u %s", r, n,
      KindName(kind), reducing ? " " : "", reducing ? RedopText(redop) : "", DtypeText(dtype),
      static_cast<unsigned long long>(count), root, in_place ? "in-place" : "out-of-place");
  const std::string label = label_buffer;
  auto value = [&](uint32_t rank, uint64_t i) { return Value(reducing, redop, salt, rank, i); };

  // Inputs: `send_elems` values of this rank.
  uint64_t send_elems = count, recv_elems = count;
  if (kind == Kind::kAllGather) recv_elems = count * n;
  if (kind == Kind::kReduceScatter) send_elems = count * n;
  if (kind == Kind::kAllToAll) send_elems = recv_elems = count * n;
  // Rank 0 receives the other ranks' messages one after the other.
  if (kind == Kind::kP2PAnySource) recv_elems = count * (n - 1);
  std::vector<uint8_t> input(send_elems * es);
  for (uint64_t i = 0; i < send_elems; ++i) Put(dtype, input.data(), i, value(r, i));
  std::vector<uint8_t> sentinel(std::max(send_elems, recv_elems) * es, 0xA5);

  // Where the data goes and where the result is read from.
  tern_buffer_t send = b_.send, recv = b_.recv;
  uint64_t send_off = 0, recv_off = 0, result_off = 0;
  tern_buffer_t result_buffer = b_.recv;
  if (!Write(b_.recv, 0,
             std::vector<uint8_t>(sentinel.begin(), sentinel.begin() + recv_elems * es)))
    return;
  if (in_place) {
    switch (kind) {
      case Kind::kAllGather:
        send = b_.recv;
        send_off = r * count * es;
        if (!Write(b_.recv, send_off, input)) return;
        break;
      case Kind::kReduceScatter:
        if (!Write(b_.send, 0, input)) return;
        recv = b_.send;
        recv_off = r * count * es;
        result_buffer = b_.send;
        result_off = recv_off;
        break;
      default:
        send = b_.recv;
        if (!Write(b_.recv, 0, input)) return;
        break;
    }
  } else {
    if (!Write(b_.send, 0, input)) return;
  }

  tern_status_t status = TERN_OK;
  // kP2PAnySource: the sender of each of rank 0's receives, as tern reports it.
  std::vector<uint32_t> senders(n, UINT32_MAX);
  switch (kind) {
    case Kind::kAllReduce:
      status =
          tern_comm_all_reduce(comm_, send, send_off, recv, recv_off, count, dtype, redop, queue_);
      break;
    case Kind::kBroadcast:
      status =
          tern_comm_broadcast(comm_, send, send_off, recv, recv_off, count, dtype, root, queue_);
      break;
    case Kind::kReduce:
      status = tern_comm_reduce(comm_, send, send_off, recv, recv_off, count, dtype, redop, root,
                                queue_);
      break;
    case Kind::kAllGather:
      status = tern_comm_all_gather(comm_, send, send_off, recv, recv_off, count, dtype, queue_);
      break;
    case Kind::kReduceScatter:
      status = tern_comm_reduce_scatter(comm_, send, send_off, recv, recv_off, count, dtype, redop,
                                        queue_);
      break;
    case Kind::kAllToAll:
      status = tern_comm_all_to_all(comm_, send, send_off, recv, recv_off, count, dtype, queue_);
      break;
    case Kind::kBarrier:
      status = tern_comm_barrier(comm_, queue_);
      break;
    case Kind::kP2PGroup: {
      tern_comm_group_start();
      status = tern_comm_send(comm_, send, 0, count, dtype, (r + 1) % n, queue_);
      if (status == TERN_OK)
        status = tern_comm_recv(comm_, recv, 0, count, dtype, (r + n - 1) % n, queue_);
      const tern_status_t end = tern_comm_group_end();
      if (status == TERN_OK) status = end;
      break;
    }
    case Kind::kP2POrdered: {
      // Pairs (0,1), (2,3): the even rank sends first, the odd one receives first.
      const uint32_t partner = r ^ 1u;
      if (partner >= n) break;
      if (r % 2 == 0) {
        status = tern_comm_send(comm_, send, 0, count, dtype, partner, queue_);
        if (status == TERN_OK)
          status = tern_comm_recv(comm_, recv, 0, count, dtype, partner, queue_);
      } else {
        status = tern_comm_recv(comm_, recv, 0, count, dtype, partner, queue_);
        if (status == TERN_OK)
          status = tern_comm_send(comm_, send, 0, count, dtype, partner, queue_);
      }
      break;
    }
    case Kind::kP2PAnySource:
      if (r == 0) {
        for (uint32_t k = 0; k + 1 < n && status == TERN_OK; ++k) {
          status =
              tern_comm_recv_any(comm_, recv, k * count * es, count, dtype, &senders[k], queue_);
        }
      } else {
        status = tern_comm_send(comm_, send, 0, count, dtype, 0, queue_);
      }
      break;
  }
  if (status != TERN_OK) {
    Fail(label + ": enqueue: " + LastError(status));
    return;
  }
  status = tern_queue_synchronize(queue_, 120ull * 1000000000ull);
  if (status != TERN_OK) {
    Fail(label + ": synchronize: " + LastError(status));
    tern_queue_clear_error(queue_);
    return;
  }
  ++result.checks;
  if (kind == Kind::kBarrier) return;

  // Expected bytes of the result range.
  uint64_t check_elems = recv_elems;
  std::vector<uint8_t> want(check_elems * es);
  std::vector<int64_t> values(n);
  switch (kind) {
    case Kind::kAllReduce:
      for (uint64_t i = 0; i < count; ++i) {
        for (uint32_t k = 0; k < n; ++k) values[k] = value(k, i);
        PutCombined(dtype, want.data(), i, redop, values);
      }
      break;
    case Kind::kReduce:
      if (r == root) {
        for (uint64_t i = 0; i < count; ++i) {
          for (uint32_t k = 0; k < n; ++k) values[k] = value(k, i);
          PutCombined(dtype, want.data(), i, redop, values);
        }
      } else {
        // Untouched: the sentinel, or the input when in place.
        want = in_place ? input
                        : std::vector<uint8_t>(sentinel.begin(), sentinel.begin() + count * es);
      }
      break;
    case Kind::kBroadcast:
      for (uint64_t i = 0; i < count; ++i) Put(dtype, want.data(), i, value(root, i));
      break;
    case Kind::kAllGather:
      for (uint32_t k = 0; k < n; ++k) {
        for (uint64_t i = 0; i < count; ++i) Put(dtype, want.data(), k * count + i, value(k, i));
      }
      break;
    case Kind::kReduceScatter:
      for (uint64_t i = 0; i < count; ++i) {
        for (uint32_t k = 0; k < n; ++k) values[k] = value(k, r * count + i);
        PutCombined(dtype, want.data(), i, redop, values);
      }
      break;
    case Kind::kAllToAll:
      for (uint32_t k = 0; k < n; ++k) {
        for (uint64_t i = 0; i < count; ++i)
          Put(dtype, want.data(), k * count + i, value(k, r * count + i));
      }
      break;
    case Kind::kP2PGroup:
      for (uint64_t i = 0; i < count; ++i) Put(dtype, want.data(), i, value((r + n - 1) % n, i));
      break;
    case Kind::kP2POrdered:
      if ((r ^ 1u) >= n) {
        want.assign(sentinel.begin(), sentinel.begin() + count * es);
      } else {
        for (uint64_t i = 0; i < count; ++i) Put(dtype, want.data(), i, value(r ^ 1u, i));
      }
      break;
    case Kind::kP2PAnySource:
      if (r != 0) {
        want.assign(sentinel.begin(), sentinel.begin() + recv_elems * es);
        break;
      }
      // Each other rank exactly once, each message where its receive put it.
      for (uint32_t k = 0; k + 1 < n; ++k) {
        const uint32_t from = senders[k];
        if (from == 0 || from >= n ||
            std::count(senders.begin(), senders.begin() + (n - 1), from) != 1) {
          Fail(label + ": receive " + std::to_string(k) + " reports sender " +
               std::to_string(from) + " (each of ranks 1.." + std::to_string(n - 1) +
               " should be reported once)");
          return;
        }
        for (uint64_t i = 0; i < count; ++i) Put(dtype, want.data(), k * count + i, value(from, i));
      }
      break;
    case Kind::kBarrier:
      break;
  }
  std::vector<uint8_t> got(want.size());
  if (!Read(result_buffer, result_off, &got)) return;
  Compare(label, got, want, es);
}

}  // namespace

MatrixResult RunMatrix(tern_comm_t comm, tern_queue_t queue, tern_device_t device, uint32_t rank,
                       uint32_t size, const MatrixOptions& options) {
  uint64_t max_count = 1;
  for (uint64_t c : options.counts) max_count = std::max(max_count, c);
  for (uint64_t c : options.large_counts) max_count = std::max(max_count, c);
  Buffers buffers;
  buffers.bytes = max_count * size * 8;
  tern_buffer_params_t params = {sizeof(tern_buffer_params_t), 0, buffers.bytes, 0,
                                 TERN_MEMORY_TENSORS};
  MatrixResult failed;
  tern_status_t s = tern_buffer_alloc(device, &params, &buffers.send);
  if (s == TERN_OK) s = tern_buffer_alloc(device, &params, &buffers.recv);
  if (s != TERN_OK) {
    failed.failures = "tern_buffer_alloc: " + LastError(s);
    return failed;
  }
  Runner runner(comm, queue, rank, size, buffers);
  const Kind kinds[] = {Kind::kAllReduce,   Kind::kReduce,    Kind::kReduceScatter,
                        Kind::kBroadcast,   Kind::kAllGather, Kind::kAllToAll,
                        Kind::kBarrier,     Kind::kP2PGroup,  Kind::kP2POrdered,
                        Kind::kP2PAnySource};
  const tern_comm_redop_t redops[] = {TERN_COMM_SUM, TERN_COMM_PROD, TERN_COMM_MAX, TERN_COMM_MIN,
                                      TERN_COMM_AVG};
  uint32_t variant = 0;
  for (tern_dtype_t dtype : options.dtypes) {
    std::vector<uint64_t> counts = options.counts;
    if (dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_I8) {
      counts.insert(counts.end(), options.large_counts.begin(), options.large_counts.end());
    }
    for (uint64_t count : counts) {
      const bool large = count > 2000;
      for (Kind kind : kinds) {
        if (IsPointToPoint(kind) && (!options.point_to_point || size < 2)) continue;
        if (kind == Kind::kBarrier && count != options.counts.front()) continue;
        for (int place = 0; place < 2; ++place) {
          const bool in_place = place == 1;
          if (in_place &&
              (kind == Kind::kAllToAll || kind == Kind::kBarrier || IsPointToPoint(kind))) {
            continue;
          }
          ++variant;
          const uint32_t root = variant % size;
          if (HasRedop(kind)) {
            // Large counts: every reduction once, alternating in and out of place.
            for (tern_comm_redop_t op : redops) {
              if (large && ((static_cast<int>(op) + place) % 2 == 1) && op != TERN_COMM_SUM)
                continue;
              runner.Run(kind, dtype, count, op, root, in_place);
            }
          } else {
            runner.Run(kind, dtype, count, TERN_COMM_SUM, root, in_place);
          }
        }
      }
    }
  }
  tern_buffer_free(buffers.send);
  tern_buffer_free(buffers.recv);
  return runner.result;
}

}  // namespace tern_test
