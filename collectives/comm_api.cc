// The tern_comm_* functions: argument checks, handles, and the queue
// commands that run the operations.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "bootstrap.h"
#include "comm_config.h"
#include "comm_kernels.h"
#include "common/logging.h"
#include "common/timeline.h"
#include "communicator.h"
#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"
#include "tern/comm.h"

namespace tern::comm {
namespace {

// How often rank 0 of tern_comm_init_from_env tries again to bind a busy
// bootstrap port.
constexpr uint64_t kBindRetryNs = 100'000'000;

Status LookupComm(Runtime* rt, tern_comm_t handle, std::shared_ptr<Communicator>* out) {
  auto object = rt->comm_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (!object || !object->comm) {
    return NotALiveHandle("comm", "communicator", "already destroyed or aborted",
                          "create one with tern_comm_init_rank()");
  }
  // Aliases the handle table's object: no second reference count to bump.
  Communicator* raw = object->comm.get();
  *out = std::shared_ptr<Communicator>(std::move(object), raw);
  return OkStatus();
}

// The runtime and the communicator behind `handle`.
Status GetComm(tern_comm_t handle, Runtime** rt, std::shared_ptr<Communicator>* out) {
  TERN_RETURN_IF_ERROR(GetRuntime(rt));
  return LookupComm(*rt, handle, out);
}

// Takes the communicator behind `handle` out of the handle table, for
// tern_comm_destroy and tern_comm_abort.
Status RemoveComm(tern_comm_t handle, std::shared_ptr<CommObject>* out) {
  Runtime* rt;
  TERN_RETURN_IF_ERROR(GetRuntime(&rt));
  *out = rt->comm_table.Remove(reinterpret_cast<uint64_t>(handle));
  if (!*out) {
    return NotALiveHandleToDestroy("comm", "communicator", "already destroyed or aborted",
                                   "never created");
  }
  return OkStatus();
}

tern_comm_t InsertComm(Runtime* rt, std::shared_ptr<Communicator> comm) {
  auto object = std::make_shared<CommObject>();
  object->comm = std::move(comm);
  return reinterpret_cast<tern_comm_t>(rt->comm_table.Insert(std::move(object)));
}

Status NameFromConfig(const tern_comm_config_t* config, std::string* out) {
  out->clear();
  if (config != nullptr && config->struct_size >= sizeof(tern_comm_config_t) &&
      config->name != nullptr) {
    *out = config->name;
  }
  return OkStatus();
}

// An operation's queue command holds one of these (in its keep_alive);
// whether it ran or was skipped (its queue had failed earlier), it settles
// the books when the command goes away.
struct Ticket {
  Ticket(std::shared_ptr<Communicator> c, OpDesc o, const QueueObject* q)
      : comm(std::move(c)), op(std::move(o)), queue(q) {}
  std::shared_ptr<Communicator> comm;
  OpDesc op;
  uint64_t record = 0;
  bool ran = false;
  const QueueObject* queue;  // alive while its commands are
  ~Ticket() {
    if (!ran) {
      comm->recorder().Finish(record, FlightRecorder::kSkipped, TERN_ERROR_ABORTED);
      // The other ranks would wait for this rank forever: fail the
      // communicator everywhere instead.
      comm->Fail(MakeStatus(TERN_ERROR_COMM_ABORTED,
                            "rank {} did not run operation #{} ({}): its queue '{}' had failed "
                            "earlier and skipped it, so the ranks are out of step",
                            comm->rank(), op.sequence, Describe(op), queue->name),
                 /*broadcast=*/true);
    }
    comm->RemoveInflight();
  }
};

// Tickets are allocated by the threads that enqueue and freed by the queue
// threads, one per operation: blocks come from a free list shared by the
// process rather than from malloc, whose per-thread caches do not help when
// every block crosses threads. Never destroyed (a ticket may go away during
// static destruction).
class TicketPool {
 public:
  static TicketPool& Get() {
    static TicketPool* const pool = new TicketPool();
    return *pool;
  }
  void* Allocate(size_t bytes) {
    {
      std::lock_guard<SpinLock> lock(mutex_);
      if (bytes == block_ && !free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return ::operator new(bytes);
  }
  void Release(void* p, size_t bytes) {
    {
      std::lock_guard<SpinLock> lock(mutex_);
      if (block_ == 0) block_ = bytes;
      if (bytes == block_ && free_.size() < kMaxFree) {
        free_.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  static constexpr size_t kMaxFree = 4096;  // blocks kept: a few hundred KiB at most
  TicketPool() { free_.reserve(kMaxFree); }
  SpinLock mutex_;
  size_t block_ = 0;  // all blocks have one size (a shared_ptr control block with a Ticket)
  std::vector<void*> free_;
};

template <typename T>
struct TicketAllocator {
  using value_type = T;
  TicketAllocator() = default;
  template <typename U>
  TicketAllocator(const TicketAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) { return static_cast<T*>(TicketPool::Get().Allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { TicketPool::Get().Release(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const TicketAllocator<U>&) const {
    return true;
  }
};

// The queue task of an operation: runs it, or names it (see
// driver::Command::host_task). `user_data` is the Ticket, which the command's
// keep_alive holds until the command completes.
Status RunTicket(void* user_data, std::string* name) {
  Ticket* t = static_cast<Ticket*>(user_data);
  if (name != nullptr) {
    // "all_reduce sum f32 count=1024 comm 0x.. rank 1"
    *name = fmt::format("{} comm {} rank {}", Describe(t->op), t->comm->label(), t->comm->rank());
    return OkStatus();
  }
  t->ran = true;
  return t->comm->Run(t->op, t->record);
}

Status Submit(std::shared_ptr<Communicator> comm, QueueObject& queue, OpDesc op) {
  std::shared_ptr<Ticket> ticket = std::allocate_shared<Ticket>(
      TicketAllocator<Ticket>(), std::move(comm), std::move(op), &queue);
  Ticket* t = ticket.get();
  t->record = t->comm->recorder().Add(t->op);
  t->comm->AddInflight();
  // The queue releases keep_alive (running ~Ticket) whether the command ran
  // or was skipped. The task is a plain function and the ticket: nothing to
  // allocate per operation.
  driver::Command command;
  command.kind = driver::CommandKind::kHostTask;
  command.host_task = &RunTicket;
  command.host_user_data = t;
  command.keep_alive = std::move(ticket);
  uint64_t sequence = 0;
  return queue.hw->Submit(std::move(command), &sequence);
}

Status SubmitNop(QueueObject& queue) {
  driver::Command command;
  command.kind = driver::CommandKind::kNop;
  uint64_t sequence = 0;
  return queue.hw->Submit(std::move(command), &sequence);
}

// Thread-local group of sends and receives (tern_comm_group_start/end).
struct PendingP2P {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<QueueObject> queue;
  P2P op;
};
struct GroupState {
  int depth = 0;
  std::vector<PendingP2P> ops;
};
thread_local GroupState t_group;
// t_group.depth > 0, kept apart in a trivial initial-exec thread-local: every
// collective checks it, and t_group's own access goes through a TLS wrapper
// call (libtern is a shared library, and GroupState has a destructor).
thread_local bool t_in_group __attribute__((tls_model("initial-exec"))) = false;

// What every operation checks and resolves.
struct Prepared {
  Runtime* rt = nullptr;
  std::shared_ptr<Communicator> comm;
  QueueObject* queue = nullptr;  // uncounted, as the queue calls resolve it (PeekQueue)
};

Status Prepare(tern_comm_t comm, tern_queue_t queue, Prepared* out) {
  TERN_RETURN_IF_ERROR(GetComm(comm, &out->rt, &out->comm));
  TERN_RETURN_IF_ERROR(PeekQueue(out->rt, queue, "queue", &out->queue));
  if (out->queue->core != out->comm->core()) {
    return MakeStatus(
        TERN_ERROR_INVALID_ARGUMENT,
        "queue '{}' runs on device {} core {}, but rank {} of communicator {} is core "
        "{} of device {}: enqueue the communicator's operations on a queue of its core",
        out->queue->name, out->queue->core->device->index, out->queue->core->index,
        out->comm->rank(), out->comm->label(), out->comm->core()->index,
        out->comm->core()->device->index);
  }
  if (out->comm->failed()) {
    Status why = out->comm->failure();
    return Status(why.code(),
                  fmt::format("communicator {} failed earlier and cannot run operations: "
                              "{}; destroy it and create a new one",
                              out->comm->label(), why.message()));
  }
  return OkStatus();
}

// Collectives take the dtypes the kernels reduce (IsReducible); the element
// size comes from the API's table.
Status CheckDtype(tern_dtype_t dtype_in, size_t* out_size) {
  const int32_t value = static_cast<int32_t>(dtype_in);
  if (value < 0 || value >= TERN_DTYPE_COUNT || !IsReducible(static_cast<tern_dtype_t>(value))) {
    return MakeStatus(
        TERN_ERROR_INVALID_ARGUMENT,
        "dtype {} is not supported by collectives: use f32, bf16, f16, i8, i32 or i64", value);
  }
  *out_size = tern_dtype_size(dtype_in);
  return OkStatus();
}

Status CheckRedop(tern_comm_redop_t op_in) {
  const int32_t value = static_cast<int32_t>(op_in);
  if (value < 0 || value >= TERN_COMM_REDOP_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "reduction {} is not one of TERN_COMM_SUM, PROD, MAX, MIN, AVG", value);
  }
  return OkStatus();
}

Status CheckRank(uint32_t value, uint32_t size, const char* what) {
  if (value >= size) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} {} is out of range: the communicator has {} ranks (0-{})", what, value,
                      size, size - 1);
  }
  return OkStatus();
}

// A device range as the engines see it, on the communicator's device.
Status Resolve(const Prepared& p, tern_buffer_t buffer, uint64_t offset, uint64_t bytes,
               const char* arg, uint8_t** out) {
  std::shared_ptr<BufferObject> object;
  TERN_RETURN_IF_ERROR(LookupBuffer(p.rt, buffer, arg, &object));
  TERN_RETURN_IF_ERROR(CheckBufferRange(*object, offset, bytes, arg));
  DeviceObject* device = p.comm->core()->device;
  if (object->device != device) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} lives on device {}, but rank {} of communicator {} runs on device {}: "
                      "collectives read and write the rank's own device memory",
                      arg, object->device->index, p.comm->rank(), p.comm->label(), device->index);
  }
  void* address = device->hw->EngineAddress(object->offset + offset, std::max<uint64_t>(bytes, 1));
  if (address == nullptr) {
    return MakeStatus(TERN_ERROR_UNIMPLEMENTED,
                      "the '{}' driver backend gives the host no access to device memory, which "
                      "collectives need",
                      p.rt->driver->name());
  }
  *out = static_cast<uint8_t*>(address);
  return OkStatus();
}

Status CheckBytes(uint64_t count, size_t element, uint64_t factor, uint64_t* out) {
  // Multiplications that report overflow: two divisions cost more than the
  // rest of the checks together.
  uint64_t bytes = 0, total = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(element), &bytes) ||
      __builtin_mul_overflow(bytes, std::max<uint64_t>(factor, 1), &total)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "count {} is too large", count);
  }
  *out = bytes;
  return OkStatus();
}

bool Overlap(const uint8_t* a, uint64_t a_bytes, const uint8_t* b, uint64_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

Status NotInGroup(const char* what) {
  if (t_in_group) {
    return MakeStatus(
        TERN_ERROR_FAILED_PRECONDITION,
        "{} cannot be part of a group: only tern_comm_send and tern_comm_recv can; end "
        "the group with tern_comm_group_end() first",
        what);
  }
  return OkStatus();
}

// The collectives with a send and a receive range of the same size:
// all-reduce, broadcast, reduce.
Status EnqueueSymmetric(OpKind kind, tern_comm_t comm, tern_buffer_t send, uint64_t send_offset,
                        tern_buffer_t recv, uint64_t recv_offset, uint64_t count,
                        tern_dtype_t dtype, tern_comm_redop_t redop, uint32_t root,
                        tern_queue_t queue) {
  TERN_RETURN_IF_ERROR(NotInGroup(OpKindName(kind)));
  Prepared p;
  TERN_RETURN_IF_ERROR(Prepare(comm, queue, &p));
  size_t element = 0;
  TERN_RETURN_IF_ERROR(CheckDtype(dtype, &element));
  if (kind != OpKind::kBroadcast) TERN_RETURN_IF_ERROR(CheckRedop(redop));
  if (kind != OpKind::kAllReduce) TERN_RETURN_IF_ERROR(CheckRank(root, p.comm->size(), "root"));
  uint64_t bytes = 0;
  TERN_RETURN_IF_ERROR(CheckBytes(count, element, 1, &bytes));
  const uint32_t rank = p.comm->rank();
  const bool uses_send = kind != OpKind::kBroadcast || rank == root;
  const bool uses_recv = kind != OpKind::kReduce || rank == root;
  OpDesc op;
  op.kind = kind;
  op.dtype = dtype;
  op.redop = kind == OpKind::kBroadcast ? TERN_COMM_SUM : redop;
  op.count = count;
  op.root = kind == OpKind::kAllReduce ? 0 : root;
  if (uses_send) TERN_RETURN_IF_ERROR(Resolve(p, send, send_offset, bytes, "send", &op.send));
  if (uses_recv) TERN_RETURN_IF_ERROR(Resolve(p, recv, recv_offset, bytes, "recv", &op.recv));
  if (op.send != nullptr && op.recv != nullptr && op.send != op.recv &&
      Overlap(op.send, bytes, op.recv, bytes)) {
    return MakeStatus(
        TERN_ERROR_INVALID_ARGUMENT,
        "the send and recv ranges of {} overlap without being the same: pass the same "
        "buffer and offset twice for in place, or ranges that do not overlap",
        OpKindName(kind));
  }
  if (count == 0) return SubmitNop(*p.queue);
  op.sequence = p.comm->NextCollectiveSequence();
  op.signature = Signature(kind, dtype, op.redop, count, op.root);
  return Submit(std::move(p.comm), *p.queue, std::move(op));
}

}  // namespace
}  // namespace tern::comm

extern "C" {

using namespace tern;
using namespace tern::comm;

TERN_API tern_status_t tern_comm_get_unique_id(tern_comm_unique_id_t* out_id) {
  TERN_API_CHECK_NOT_NULL(out_id);
  std::memset(out_id, 0, sizeof(*out_id));
  CommConfig config;
  TERN_API_TRY(LoadConfig(nullptr, &config));
  UniqueId id;
  TERN_API_TRY(CreateUniqueId(config.init_timeout_ns, nullptr, &id));
  return Report(EncodeUniqueId(id, out_id));
}

}  // extern "C"

// Helpers of the functions below, outside the C block: they return C++ types.
namespace {

Status InitRank(tern_core_t core, uint32_t size, const tern_comm_unique_id_t* id, uint32_t rank,
                const tern_comm_config_t* config, tern_comm_t* out_comm, const UniqueId* decoded) {
  Runtime* rt;
  TERN_RETURN_IF_ERROR(GetRuntime(&rt));
  InitParams params;
  TERN_RETURN_IF_ERROR(LookupCore(rt, core, "core", &params.core));
  params.core_handle = core;
  if (size == 0 || size > kMaxRanks) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "size {} is out of range: 1 to {} ranks", size,
                      kMaxRanks);
  }
  TERN_RETURN_IF_ERROR(CheckRank(rank, size, "rank"));
  if (decoded != nullptr) {
    params.id = *decoded;
  } else {
    if (id == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "id is NULL");
    TERN_RETURN_IF_ERROR(DecodeUniqueId(*id, &params.id));
  }
  TERN_RETURN_IF_ERROR(LoadConfig(config, &params.config));
  TERN_RETURN_IF_ERROR(NameFromConfig(config, &params.name));
  params.size = size;
  params.rank = rank;
  std::shared_ptr<Communicator> comm;
  TERN_RETURN_IF_ERROR(Communicator::Create(params, &comm));
  *out_comm = InsertComm(rt, std::move(comm));
  return OkStatus();
}

}  // namespace

extern "C" {

TERN_API tern_status_t tern_comm_init_rank(tern_core_t core, uint32_t size,
                                           const tern_comm_unique_id_t* id, uint32_t rank,
                                           const tern_comm_config_t* config,
                                           tern_comm_t* out_comm) {
  TERN_API_CLEAR_OUT(out_comm, nullptr);
  return Report(InitRank(core, size, id, rank, config, out_comm, nullptr));
}

TERN_API tern_status_t tern_comm_init_all(const tern_core_t* cores, uint32_t count,
                                          const tern_comm_config_t* config,
                                          tern_comm_t* out_comms) {
  TERN_API_CHECK_NOT_NULL(out_comms);
  TERN_API_CHECK_NOT_NULL(cores);
  if (count == 0 || count > kMaxRanks) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "count {} is out of range: 1 to {}",
                             count, kMaxRanks));
  }
  std::fill(out_comms, out_comms + count, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  for (uint32_t i = 0; i < count; ++i) {
    std::shared_ptr<CoreObject> core;
    TERN_API_TRY(LookupCore(rt, cores[i], fmt::format("cores[{}]", i).c_str(), &core));
    for (uint32_t j = 0; j < i; ++j) {
      if (cores[j] == cores[i]) {
        return Report(MakeStatus(
            TERN_ERROR_INVALID_ARGUMENT,
            "cores[{}] and cores[{}] are the same core: every rank needs its own", j, i));
      }
    }
  }
  CommConfig checked;
  TERN_API_TRY(LoadConfig(config, &checked));
  UniqueId id;
  TERN_API_TRY(CreateUniqueId(checked.init_timeout_ns, nullptr, &id));
  std::vector<Status> results(count);
  std::vector<std::thread> threads;
  for (uint32_t i = 1; i < count; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = InitRank(cores[i], count, nullptr, i, config, &out_comms[i], &id); });
  }
  results[0] = InitRank(cores[0], count, nullptr, 0, config, &out_comms[0], &id);
  for (auto& t : threads) t.join();
  Status first;
  for (const Status& s : results) {
    // A rank that failed first is the cause; the others time out on it.
    if (!s.ok() && (first.ok() || first.code() == TERN_ERROR_COMM_TIMEOUT)) first = s;
  }
  if (!first.ok()) {
    for (uint32_t i = 0; i < count; ++i) {
      if (out_comms[i] == nullptr) continue;
      if (auto object = rt->comm_table.Remove(reinterpret_cast<uint64_t>(out_comms[i])))
        object->comm->Close(false);
      out_comms[i] = nullptr;
    }
  }
  return Report(first);
}

TERN_API tern_status_t tern_comm_init_from_env(tern_core_t core, const tern_comm_config_t* config,
                                               tern_comm_t* out_comm) {
  TERN_API_CLEAR_OUT(out_comm, nullptr);
  auto env = [](const char* a, const char* b) -> const char* {
    const char* v = std::getenv(a);
    if ((v == nullptr || *v == '\0') && b != nullptr) v = std::getenv(b);
    return (v == nullptr || *v == '\0') ? nullptr : v;
  };
  auto number = [](const char* text, uint32_t* out) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(text, &end, 10);
    if (end == text || *end != '\0' || v > UINT32_MAX) return false;
    *out = static_cast<uint32_t>(v);
    return true;
  };
  std::string address;
  if (const char* id = env("TERN_COMM_ID", nullptr)) {
    address = id;
  } else if (const char* host = env("MASTER_ADDR", nullptr)) {
    const char* port_text = env("MASTER_PORT", nullptr);
    uint32_t port = 0;
    if (port_text == nullptr || !number(port_text, &port) || port == 0 || port >= 65535) {
      return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                               "MASTER_ADDR is set but MASTER_PORT is missing or not a port number "
                               "below 65535; tern serves its bootstrap on MASTER_PORT + 1"));
    }
    address = fmt::format("{}:{}", host, port + 1);
  } else {
    return Report(
        MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                   "tern_comm_init_from_env needs TERN_COMM_ID=host:port (the bootstrap root, "
                   "served by rank 0), or MASTER_ADDR and MASTER_PORT as torchrun sets them"));
  }
  uint32_t rank = 0, size = 0;
  const char* rank_text = env("TERN_COMM_RANK", "RANK");
  const char* size_text = env("TERN_COMM_WORLD_SIZE", "WORLD_SIZE");
  if (rank_text == nullptr || !number(rank_text, &rank)) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "TERN_COMM_RANK (or RANK) is {}: set it to this process's rank",
                             rank_text ? fmt::format("'{}', not a number", rank_text) : "not set"));
  }
  if (size_text == nullptr || !number(size_text, &size)) {
    return Report(
        MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                   "TERN_COMM_WORLD_SIZE (or WORLD_SIZE) is {}: set it to the number of ranks",
                   size_text ? fmt::format("'{}', not a number", size_text) : "not set"));
  }
  UniqueId id;
  Status status = ParseHostPort(address, &id.root);
  if (!status.ok()) {
    return Report(status.WithContext("TERN_COMM_ID (or MASTER_ADDR:MASTER_PORT+1)"));
  }
  // Every rank derives the same nonce from the address (it names the
  // communicator; the secret, not the nonce, keeps strangers out).
  uint64_t nonce = 1469598103934665603ull;
  for (char c : address) nonce = (nonce ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  id.nonce = nonce | 1;
  // The secret: TERN_COMM_SECRET(_FILE) on every rank, else one that rank 0
  // makes and leaves in a file of this user's for the ranks of its host.
  status = SecretFromEnvironment(&id.has_secret, &id.secret);
  if (!status.ok()) return Report(status);
  if (!id.has_secret) id.secret_file = HostSecretPath(address);
  if (rank == 0 && size > 0) {
    CommConfig checked;
    status = LoadConfig(config, &checked);
    SockAddr bind = id.root;
    if (status.ok() && !IsLocalAddress(bind)) {
      return Report(
          MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                     "rank 0 serves the bootstrap on {}, but that address does not belong to "
                     "this host ({}): run rank 0 on the host named in TERN_COMM_ID",
                     address, HostName()));
    }
    // Written before the root starts: a rank that reaches the root finds it.
    std::string remove_when_done;
    if (status.ok() && !id.has_secret) {
      status = GenerateSecret(&id.secret);
      if (status.ok()) status = WriteHostSecret(id.secret_file, id.secret);
      // The secret is what the ranks read back from the file.
      if (status.ok()) status = ReadHostSecret(id.secret_file, &id.secret);
      if (!status.ok()) {
        return Report(status.WithContext(
            "rank 0 leaving the communicator's secret for the ranks of its host (or set "
            "TERN_COMM_SECRET on every rank)"));
      }
      id.has_secret = true;
      remove_when_done = id.secret_file;
    }
    SockAddr bound;
    if (status.ok()) {
      // The port may be held by a connection in TIME_WAIT (60 s on Linux)
      // whose socket did not set SO_REUSEADDR: a bind over it fails even
      // with ours set. Client sockets of earlier torchrun launches (their
      // stores' connections) take ephemeral ports, and MASTER_PORT + 1 was
      // one of them in 1 launch in 40-80 of tern_bench_collectives. So the
      // root waits for the port, within the init timeout, instead of failing
      // the job (the other ranks keep trying to connect meanwhile).
      const uint64_t deadline = MonotonicNs() + checked.init_timeout_ns;
      bool told = false;
      while (true) {
        const uint64_t now = MonotonicNs();
        status = StartBootstrapRoot(bind, id.nonce, id.secret, deadline > now ? deadline - now : 0,
                                    remove_when_done, &bound);
        if (status.code() != TERN_ERROR_BUSY || now + kBindRetryNs >= deadline) break;
        if (!told) {
          TERN_LOG_WARN(
              "rank 0: the bootstrap port {} is in use ({}); retrying until it is free, for up "
              "to TERN_COMM_INIT_TIMEOUT ({} s): a closed connection holds its port for up to "
              "60 s, another program as long as it runs (set TERN_COMM_ID=host:port to choose "
              "another port)",
              address, status.message(), checked.init_timeout_ns / 1000000000ull);
          told = true;
        }
        usleep(static_cast<useconds_t>(kBindRetryNs / 1000));
      }
      if (status.ok() && told) TERN_LOG_INFO("rank 0: serving the bootstrap on {} now", address);
    }
    if (!status.ok())
      return Report(status.WithContext(fmt::format("serving the bootstrap on {}", address)));
  }
  return Report(InitRank(core, size, nullptr, rank, config, out_comm, &id));
}

TERN_API tern_status_t tern_comm_split(tern_comm_t comm, int32_t color, int32_t key,
                                       const tern_comm_config_t* config, tern_comm_t* out_comm) {
  TERN_API_CLEAR_OUT(out_comm, nullptr);
  Runtime* rt;
  std::shared_ptr<Communicator> parent;
  TERN_API_TRY(GetComm(comm, &rt, &parent));
  if (color < 0 && color != TERN_COMM_SPLIT_NOCOLOR) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "color {} is negative: use a color >= 0, or TERN_COMM_SPLIT_NOCOLOR",
                             color));
  }
  if (parent->failed()) return Report(parent->failure());
  CommConfig split_config = parent->config();
  if (config != nullptr) TERN_API_TRY(LoadConfig(config, &split_config));
  std::string name;
  (void)NameFromConfig(config, &name);
  std::shared_ptr<Communicator> child;
  TERN_API_TRY(parent->Split(color, key, split_config, name, &child));
  if (child) *out_comm = InsertComm(rt, std::move(child));
  return TERN_OK;
}

TERN_API tern_status_t tern_comm_destroy(tern_comm_t comm) {
  std::shared_ptr<CommObject> object;
  TERN_API_TRY(RemoveComm(comm, &object));
  object->comm->Close(/*graceful=*/true);
  return Report(object->comm->failure());
}

TERN_API tern_status_t tern_comm_abort(tern_comm_t comm) {
  std::shared_ptr<CommObject> object;
  TERN_API_TRY(RemoveComm(comm, &object));
  object->comm->Fail(
      MakeStatus(TERN_ERROR_COMM_ABORTED, "rank {} aborted communicator {} (tern_comm_abort)",
                 object->comm->rank(), object->comm->label()),
      /*broadcast=*/true);
  object->comm->Close(/*graceful=*/false);
  return TERN_OK;
}

TERN_API tern_status_t tern_comm_get_async_error(tern_comm_t comm, tern_status_t* out_error) {
  TERN_API_CLEAR_OUT(out_error, TERN_OK);
  Runtime* rt;
  std::shared_ptr<Communicator> object;
  TERN_API_TRY(GetComm(comm, &rt, &object));
  if (object->failed()) {
    Status failure = object->failure();
    *out_error = failure.code();
    (void)Report(failure);  // leaves the message for tern_last_error_message()
  }
  return TERN_OK;
}

TERN_API tern_status_t tern_comm_get_info(tern_comm_t comm, tern_comm_info_t* out_info) {
  TERN_API_CLEAR_OUT_STRUCT(out_info, tern_comm_info_t);
  Runtime* rt;
  std::shared_ptr<Communicator> object;
  TERN_API_TRY(GetComm(comm, &rt, &object));
  out_info->rank = object->rank();
  out_info->size = object->size();
  out_info->local_rank = object->local_rank();
  out_info->local_size = object->local_size();
  out_info->node_count = object->node_count();
  out_info->device = object->core()->device->handle;
  out_info->core = object->core_handle();
  std::snprintf(out_info->transport, sizeof(out_info->transport), "%s",
                object->transport().c_str());
  return TERN_OK;
}

TERN_API tern_status_t tern_comm_all_reduce(tern_comm_t comm, tern_buffer_t send,
                                            uint64_t send_offset, tern_buffer_t recv,
                                            uint64_t recv_offset, uint64_t count,
                                            tern_dtype_t dtype, tern_comm_redop_t op,
                                            tern_queue_t queue) {
  return Report(EnqueueSymmetric(OpKind::kAllReduce, comm, send, send_offset, recv, recv_offset,
                                 count, dtype, op, 0, queue));
}

TERN_API tern_status_t tern_comm_broadcast(tern_comm_t comm, tern_buffer_t send,
                                           uint64_t send_offset, tern_buffer_t recv,
                                           uint64_t recv_offset, uint64_t count, tern_dtype_t dtype,
                                           uint32_t root, tern_queue_t queue) {
  return Report(EnqueueSymmetric(OpKind::kBroadcast, comm, send, send_offset, recv, recv_offset,
                                 count, dtype, TERN_COMM_SUM, root, queue));
}

TERN_API tern_status_t tern_comm_reduce(tern_comm_t comm, tern_buffer_t send, uint64_t send_offset,
                                        tern_buffer_t recv, uint64_t recv_offset, uint64_t count,
                                        tern_dtype_t dtype, tern_comm_redop_t op, uint32_t root,
                                        tern_queue_t queue) {
  return Report(EnqueueSymmetric(OpKind::kReduce, comm, send, send_offset, recv, recv_offset, count,
                                 dtype, op, root, queue));
}

}  // extern "C"

// Helpers of the functions below, outside the C block: they return C++ types.
namespace {

// All-gather (kAllGather: send is one block, recv all of them) and
// reduce-scatter (the other way round) and all-to-all (both all of them).
Status EnqueueBlocks(OpKind kind, tern_comm_t comm, tern_buffer_t send, uint64_t send_offset,
                     tern_buffer_t recv, uint64_t recv_offset, uint64_t count, tern_dtype_t dtype,
                     tern_comm_redop_t redop, tern_queue_t queue) {
  TERN_RETURN_IF_ERROR(NotInGroup(OpKindName(kind)));
  Prepared p;
  TERN_RETURN_IF_ERROR(Prepare(comm, queue, &p));
  size_t element = 0;
  TERN_RETURN_IF_ERROR(CheckDtype(dtype, &element));
  if (kind == OpKind::kReduceScatter) TERN_RETURN_IF_ERROR(CheckRedop(redop));
  const uint32_t n = p.comm->size(), rank = p.comm->rank();
  uint64_t block = 0;
  TERN_RETURN_IF_ERROR(CheckBytes(count, element, n, &block));
  const uint64_t send_bytes = kind == OpKind::kAllGather ? block : block * n;
  const uint64_t recv_bytes = kind == OpKind::kReduceScatter ? block : block * n;
  OpDesc op;
  op.kind = kind;
  op.dtype = dtype;
  op.redop = kind == OpKind::kReduceScatter ? redop : TERN_COMM_SUM;
  op.count = count;
  TERN_RETURN_IF_ERROR(Resolve(p, send, send_offset, send_bytes, "send", &op.send));
  TERN_RETURN_IF_ERROR(Resolve(p, recv, recv_offset, recv_bytes, "recv", &op.recv));
  if (Overlap(op.send, send_bytes, op.recv, recv_bytes)) {
    bool in_place = false;
    if (kind == OpKind::kAllGather) in_place = op.send == op.recv + rank * block;
    if (kind == OpKind::kReduceScatter) in_place = op.recv == op.send + rank * block;
    if (!in_place) {
      return MakeStatus(
          TERN_ERROR_INVALID_ARGUMENT, "the send and recv ranges of {} overlap{}", OpKindName(kind),
          kind == OpKind::kAllToAll ? ": all-to-all cannot run in place; use separate ranges"
          : kind == OpKind::kAllGather
              ? ": for in place, send must be this rank's block of recv (recv "
                "offset + rank * count * element size)"
              : ": for in place, recv must be this rank's block of send (send "
                "offset + rank * count * element size)");
    }
  }
  if (count == 0) return SubmitNop(*p.queue);
  op.sequence = p.comm->NextCollectiveSequence();
  op.signature = Signature(kind, dtype, op.redop, count, 0);
  return Submit(std::move(p.comm), *p.queue, std::move(op));
}

Status EnqueueP2P(bool is_send, tern_comm_t comm, tern_buffer_t buffer, uint64_t offset,
                  uint64_t count, tern_dtype_t dtype, uint32_t peer, tern_queue_t queue) {
  Prepared p;
  TERN_RETURN_IF_ERROR(Prepare(comm, queue, &p));
  size_t element = 0;
  TERN_RETURN_IF_ERROR(CheckDtype(dtype, &element));
  TERN_RETURN_IF_ERROR(CheckRank(peer, p.comm->size(), "peer"));
  if (peer == p.comm->rank()) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "peer {} is this rank itself: send and recv exchange data with another rank; "
                      "copy with tern_queue_copy_d2d instead",
                      peer);
  }
  uint64_t bytes = 0;
  TERN_RETURN_IF_ERROR(CheckBytes(count, element, 1, &bytes));
  uint8_t* address = nullptr;
  TERN_RETURN_IF_ERROR(Resolve(p, buffer, offset, bytes, is_send ? "send" : "recv", &address));
  P2P item;
  item.is_send = is_send;
  item.peer = peer;
  item.buffer = address;
  item.count = count;
  item.dtype = dtype;
  if (t_group.depth > 0) {
    if (count == 0) return OkStatus();
    item.sequence = p.comm->NextP2PSequence(peer, is_send);
    // The group holds the queue until tern_comm_group_end: a counted reference.
    std::shared_ptr<QueueObject> counted;
    TERN_RETURN_IF_ERROR(LookupQueue(p.rt, queue, "queue", &counted));
    t_group.ops.push_back(PendingP2P{p.comm, std::move(counted), item});
    return OkStatus();
  }
  if (count == 0) return SubmitNop(*p.queue);
  OpDesc op;
  op.kind = is_send ? OpKind::kSend : OpKind::kRecv;
  op.dtype = dtype;
  op.count = count;
  op.root = peer;
  (is_send ? op.send : op.recv) = address;
  op.sequence = p.comm->NextP2PSequence(peer, is_send);
  op.signature = Signature(op.kind, dtype, TERN_COMM_SUM, count, 0);
  return Submit(std::move(p.comm), *p.queue, std::move(op));
}

}  // namespace

extern "C" {

TERN_API tern_status_t tern_comm_all_gather(tern_comm_t comm, tern_buffer_t send,
                                            uint64_t send_offset, tern_buffer_t recv,
                                            uint64_t recv_offset, uint64_t send_count,
                                            tern_dtype_t dtype, tern_queue_t queue) {
  return Report(EnqueueBlocks(OpKind::kAllGather, comm, send, send_offset, recv, recv_offset,
                              send_count, dtype, TERN_COMM_SUM, queue));
}

TERN_API tern_status_t tern_comm_reduce_scatter(tern_comm_t comm, tern_buffer_t send,
                                                uint64_t send_offset, tern_buffer_t recv,
                                                uint64_t recv_offset, uint64_t recv_count,
                                                tern_dtype_t dtype, tern_comm_redop_t op,
                                                tern_queue_t queue) {
  return Report(EnqueueBlocks(OpKind::kReduceScatter, comm, send, send_offset, recv, recv_offset,
                              recv_count, dtype, op, queue));
}

TERN_API tern_status_t tern_comm_all_to_all(tern_comm_t comm, tern_buffer_t send,
                                            uint64_t send_offset, tern_buffer_t recv,
                                            uint64_t recv_offset, uint64_t count,
                                            tern_dtype_t dtype, tern_queue_t queue) {
  return Report(EnqueueBlocks(OpKind::kAllToAll, comm, send, send_offset, recv, recv_offset, count,
                              dtype, TERN_COMM_SUM, queue));
}

TERN_API tern_status_t tern_comm_send(tern_comm_t comm, tern_buffer_t send, uint64_t send_offset,
                                      uint64_t count, tern_dtype_t dtype, uint32_t peer,
                                      tern_queue_t queue) {
  return Report(EnqueueP2P(true, comm, send, send_offset, count, dtype, peer, queue));
}

TERN_API tern_status_t tern_comm_recv(tern_comm_t comm, tern_buffer_t recv, uint64_t recv_offset,
                                      uint64_t count, tern_dtype_t dtype, uint32_t peer,
                                      tern_queue_t queue) {
  return Report(EnqueueP2P(false, comm, recv, recv_offset, count, dtype, peer, queue));
}

TERN_API tern_status_t tern_comm_recv_any(tern_comm_t comm, tern_buffer_t recv,
                                          uint64_t recv_offset, uint64_t count, tern_dtype_t dtype,
                                          uint32_t* out_peer, tern_queue_t queue) {
  TERN_API_TRY(NotInGroup("tern_comm_recv_any"));
  if (out_peer == nullptr) {
    return Report(
        MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                   "out_peer is NULL: tern_comm_recv_any writes the sender's rank there"));
  }
  if (count == 0) {
    // A send of nothing enqueues nothing, so there is nothing to find.
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "count is 0: a receive from any source needs a message to find; "
                             "sends of 0 elements send nothing"));
  }
  Prepared p;
  TERN_API_TRY(Prepare(comm, queue, &p));
  size_t element = 0;
  TERN_API_TRY(CheckDtype(dtype, &element));
  if (p.comm->size() < 2) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "communicator of one rank: there is no other rank to receive from"));
  }
  uint64_t bytes = 0;
  TERN_API_TRY(CheckBytes(count, element, 1, &bytes));
  uint8_t* address = nullptr;
  TERN_API_TRY(Resolve(p, recv, recv_offset, bytes, "recv", &address));
  OpDesc op;
  op.kind = OpKind::kRecvAny;
  op.dtype = dtype;
  op.count = count;
  op.recv = address;
  op.out_peer = out_peer;
  op.signature = Signature(op.kind, dtype, TERN_COMM_SUM, count, 0);
  // Counted before it is submitted, so that no receive enqueued meanwhile is
  // numbered ahead of it. Should the submission fail, later receives are
  // still numbered correctly (at run time, against what actually ran).
  p.comm->AddRunTimeReceive();
  return Report(Submit(std::move(p.comm), *p.queue, std::move(op)));
}

TERN_API tern_status_t tern_comm_barrier(tern_comm_t comm, tern_queue_t queue) {
  TERN_API_TRY(NotInGroup("barrier"));
  Prepared p;
  TERN_API_TRY(Prepare(comm, queue, &p));
  OpDesc op;
  op.kind = OpKind::kBarrier;
  op.dtype = TERN_DTYPE_I8;
  op.sequence = p.comm->NextCollectiveSequence();
  op.signature = Signature(op.kind, op.dtype, TERN_COMM_SUM, 0, 0);
  return Report(Submit(std::move(p.comm), *p.queue, std::move(op)));
}

TERN_API tern_status_t tern_comm_group_start(void) {
  ++t_group.depth;
  t_in_group = true;
  return TERN_OK;
}

TERN_API tern_status_t tern_comm_group_end(void) {
  if (t_group.depth == 0) {
    return Report(
        MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                   "tern_comm_group_end() without tern_comm_group_start() on this thread"));
  }
  if (--t_group.depth > 0) return TERN_OK;
  t_in_group = false;
  std::vector<PendingP2P> ops = std::move(t_group.ops);
  t_group.ops.clear();
  // One command per communicator and queue, in the order of first use.
  std::vector<std::pair<std::pair<Communicator*, QueueObject*>, OpDesc>> groups;
  std::vector<std::pair<std::shared_ptr<Communicator>, std::shared_ptr<QueueObject>>> owners;
  for (PendingP2P& pending : ops) {
    auto key = std::make_pair(pending.comm.get(), pending.queue.get());
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) {
      OpDesc op;
      op.kind = OpKind::kGroup;
      groups.emplace_back(key, std::move(op));
      owners.emplace_back(pending.comm, pending.queue);
      it = std::prev(groups.end());
    }
    it->second.group.push_back(pending.op);
  }
  Status first;
  for (size_t i = 0; i < groups.size(); ++i) {
    Status status =
        Submit(std::move(owners[i].first), *owners[i].second, std::move(groups[i].second));
    if (!status.ok() && first.ok()) first = status;
  }
  return Report(first);
}

}  // extern "C"
