// ProcessGroupTern: see process_group_tern.h.
#include "distributed/process_group_tern.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/ivalue_inl.h>
#include <ATen/record_function.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <utility>

#include "aten/program.h"
#include "distributed/cpu_staging.h"
#include "runtime/allocator.h"
#include "runtime/capture.h"
#include "runtime/runtime.h"

namespace torch_tern::distributed {
namespace {

// The store key of a group's unique id: "tern_comm_unique_id/<n>", n
// counting the communicators this process created for that group name. Every
// rank creates the same groups in the same order (c10d's rule), so the ranks
// agree on n; a name used again (init_process_group after
// destroy_process_group, on the same store) gets a new key, so no rank can
// read the id of an earlier communicator before rank 0 has replaced it.
std::string UniqueIdKey(const std::string& group_name) {
  static std::mutex mutex;
  static std::map<std::string, uint64_t> generations;
  std::lock_guard<std::mutex> lock(mutex);
  return "tern_comm_unique_id/" + std::to_string(generations[group_name]++);
}

[[noreturn]] void ThrowDist(const std::string& message) {
  C10_THROW_ERROR(DistBackendError, message);
}

std::string StatusText(tern_status_t status) { return DescribeLastError(status); }

// A communicator's configuration: the group's timeout for its operations and
// for joining, and its name (`name` must outlive the call that uses it).
tern_comm_config_t CommConfig(std::chrono::milliseconds timeout, const std::string& name) {
  tern_comm_config_t config{};
  config.struct_size = sizeof(config);
  const auto ns =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
  config.timeout_ns = ns;
  config.init_timeout_ns = ns;
  config.name = name.c_str();
  return config;
}

// How a tensor travels: its tern dtype and the bytes of one wire element.
struct Wire {
  tern_dtype_t dtype = TERN_DTYPE_I8;
  int64_t unit = 1;
  uint64_t Count(const at::Tensor& t) const {
    return static_cast<uint64_t>(t.numel() * static_cast<int64_t>(t.element_size()) / unit);
  }
};

// Reductions need the element type; tern reduces f32, bf16, f16, i8, i32, i64.
Wire ReductionWire(const at::Tensor& t, const char* op) {
  const auto dtype = program::ToTernDtype(t.scalar_type());
  if (!dtype || *dtype == TERN_DTYPE_BOOL) {
    ThrowDist(std::string("tern ") + op + ": cannot reduce tensors of dtype " +
              std::string(c10::toString(t.scalar_type())) +
              ": tern collectives reduce float32, bfloat16, float16, int8, int32 and int64. "
              "Cast the tensor to one of them first.");
  }
  return {*dtype, static_cast<int64_t>(t.element_size())};
}

// Data movement (broadcast, gathers, all-to-all, send/recv) works for every
// dtype: those tern cannot name travel as bytes.
Wire MoveWire(const at::Tensor& t) {
  const auto dtype = program::ToTernDtype(t.scalar_type());
  if (dtype && *dtype != TERN_DTYPE_BOOL) return {*dtype, static_cast<int64_t>(t.element_size())};
  return {TERN_DTYPE_I8, 1};
}

tern_comm_redop_t ToRedop(const c10d::ReduceOp& op, const char* name) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PREMUL_SUM:  // the multiplication is done before
      return TERN_COMM_SUM;
    case c10d::ReduceOp::AVG:
      return TERN_COMM_AVG;
    case c10d::ReduceOp::PRODUCT:
      return TERN_COMM_PROD;
    case c10d::ReduceOp::MIN:
      return TERN_COMM_MIN;
    case c10d::ReduceOp::MAX:
      return TERN_COMM_MAX;
    default:
      ThrowDist(std::string("tern ") + name +
                ": reduction BAND, BOR and BXOR are not supported by tern collectives "
                "(SUM, AVG, PRODUCT, MIN, MAX and PREMUL_SUM are).");
  }
}

// PREMUL_SUM: `dst` = `src` * factor, on the current (communication) stream.
void PremulInto(const c10d::ReduceOp& op, const at::Tensor& src, at::Tensor& dst) {
  auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(supplement != nullptr, "tern: PREMUL_SUM without its factor");
  if (supplement->tensor_factor.defined()) {
    at::mul_out(dst, src, supplement->tensor_factor.to(src.device()).to(src.scalar_type()));
  } else {
    at::mul_out(dst, src, at::Scalar(supplement->double_factor));
  }
}

void CheckTensor(const at::Tensor& t, c10::DeviceIndex device, const char* op) {
  TORCH_CHECK(t.defined(), "tern ", op, ": undefined tensor");
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "tern ", op,
              ": the tern backend takes tern tensors (and CPU tensors, through the device), "
              "got one on ",
              t.device(), ". Move it with .to('tern').");
  TORCH_CHECK(t.device().index() == device, "tern ", op,
              ": tensors on tern:", static_cast<int>(t.device().index()),
              " and tern:", static_cast<int>(device),
              " in one operation; use one device per process.");
  TORCH_CHECK(!t.is_sparse(), "tern ", op, ": sparse tensors are not supported");
  TORCH_CHECK(t.is_contiguous(), "tern ", op,
              ": the tensor must be contiguous (call .contiguous() first)");
}

struct Range {
  tern_buffer_t buffer = nullptr;
  uint64_t offset = 0;
};

Range Locate(const at::Tensor& t) {
  if (t.numel() == 0) return {};
  const DeviceLocation loc = TernDeviceAllocator::Get().Resolve(t.data_ptr(), t.device().index());
  TORCH_CHECK(loc.available >= t.nbytes(), "tern: tensor of ", t.nbytes(),
              " bytes extends past its device block (", loc.available, " bytes)");
  return {loc.buffer, loc.offset};
}

// Ends a tern group even when an argument error is thrown inside it.
class GroupScope {
 public:
  GroupScope() { TERN_CHECK(tern_comm_group_start()); }
  ~GroupScope() {
    if (open_) tern_comm_group_end();
  }
  void End() {
    open_ = false;
    TERN_CHECK(tern_comm_group_end());
  }
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;

 private:
  bool open_ = true;
};

// The profiler's name for an operation, as gloo and NCCL name theirs
// ("<backend>:<op>"): what torch.profiler shows for each collective, and what
// DDP's profiling test counts.
const char* ProfilingTitle(c10d::OpType op_type) {
  switch (op_type) {
    case c10d::OpType::ALLREDUCE:
      return "tern:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED:
      return "tern:all_reduce_coalesced";
    case c10d::OpType::BROADCAST:
      return "tern:broadcast";
    case c10d::OpType::REDUCE:
      return "tern:reduce";
    case c10d::OpType::ALLGATHER:
      return "tern:all_gather";
    case c10d::OpType::_ALLGATHER_BASE:
      return "tern:_allgather_base";
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      return "tern:_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE:
      return "tern:all_to_all_base";
    case c10d::OpType::ALLTOALL:
      return "tern:all_to_all";
    case c10d::OpType::GATHER:
      return "tern:gather";
    case c10d::OpType::SCATTER:
      return "tern:scatter";
    case c10d::OpType::SEND:
      return "tern:send";
    case c10d::OpType::RECV:
      return "tern:recv";
    case c10d::OpType::RECVANYSOURCE:
      return "tern:recvAnySource";
    case c10d::OpType::BARRIER:
      return "tern:barrier";
    case c10d::OpType::COALESCED:
      return "tern:coalesced";
    default:
      return "tern:collective";
  }
}

class WorkTern final : public c10d::Work {
 public:
  WorkTern(int rank, c10d::OpType op_type, std::vector<at::Tensor> outputs,
           std::shared_ptr<c10::Event> event, std::shared_ptr<CommState> state,
           std::optional<c10::Stream> comm_stream, bool host_blocking, c10::Device device)
      // Without a RecordFunction callback (no profiler) the title would
      // only make c10d::Work allocate a RecordFunction to find it inactive.
      : c10d::Work(rank, op_type, at::hasCallbacks() ? ProfilingTitle(op_type) : nullptr,
                   std::optional<std::vector<at::Tensor>>(outputs)),
        outputs_(std::move(outputs)),
        event_(std::move(event)),
        state_(std::move(state)),
        comm_stream_(comm_stream),
        host_blocking_(host_blocking),
        device_(device) {}

  bool isCompleted() override { return Poll() != TERN_ERROR_NOT_READY; }

  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return exception_ == nullptr;
  }

  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return exception_;
  }

  std::vector<at::Tensor> result() override { return outputs_; }

  void synchronize() override { BlockCurrentStream(); }

  bool wait(std::chrono::milliseconds timeout) override {
    RethrowIfFailed(Poll());
    if (host_blocking_ || timeout != kNoTimeout) {
      const uint64_t ns = timeout == kNoTimeout
                              ? TERN_TIMEOUT_INFINITE
                              : static_cast<uint64_t>(timeout.count()) * 1000000ull;
      const tern_status_t status = tern_event_synchronize(RawEvent(), ns);
      if (status == TERN_ERROR_TIMEOUT) {
        // "caught collective operation timeout" is NCCL's phrase for this,
        // which job monitors and tests look for.
        ThrowDist("tern " + c10d::opTypeToString(opType_) +
                  ": Work.wait caught collective operation timeout after " +
                  std::to_string(timeout.count()) +
                  " ms: the operation is still running (has every rank of the group called it?)");
      }
      RethrowIfFailed(Poll());
    }
    BlockCurrentStream();
    return true;
  }

  void blockCurrentStream() override { BlockCurrentStream(); }

  // A receive from any source: where the queue writes the sender's rank.
  void SetSource(std::shared_ptr<uint32_t> source) { source_ = std::move(source); }

  // The sender of a receive from any source (torch asks after wait(), which
  // only orders the current stream): waits for the receive itself.
  int sourceRank() const override {
    if (!source_) return c10d::Work::sourceRank();
    const tern_status_t status = tern_event_synchronize(RawEvent(), TERN_TIMEOUT_INFINITE);
    TORCH_CHECK(status == TERN_OK, "tern recv from any source failed: ", StatusText(status));
    return static_cast<int>(*source_);
  }

  // Ends the operation's profiler range (opened by c10d::Work for its title
  // while torch's profiler records) once the operation is queued, as NCCL's
  // ends when its future completes on the stream: the range is the host's
  // share, and it closes inside the profiler's window even when nothing
  // waits for the device (tern's own trace has the device's side).
  // Thread-safety: the caller's (the work is not shared yet).
  void EndProfilingRange() {
    if (!recordFunctionEndCallback_) return;
    recordFunctionEndCallback_();
    recordFunctionEndCallback_ = nullptr;
  }

  void abort() override {
    if (state_) state_->Abort();
  }

  // Made on first use (plain collectives never ask for it): completed on the
  // communication stream, so whoever waits on it is ordered after this
  // operation (and after any later one already queued there, which only
  // makes the wait longer).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (!future_) {
      TORCH_CHECK(comm_stream_.has_value(), "tern: ", c10d::opTypeToString(opType_),
                  " inside a coalescing block has no future of its own; use the Work (or the "
                  "future) that the end of the block returns.");
      auto future = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device_});
      c10::StreamGuard guard(*comm_stream_);
      future->markCompleted(c10::IValue(outputs_));
      future_ = std::move(future);
    }
    return future_;
  }

 private:
  tern_event_t RawEvent() const { return static_cast<tern_event_t>(event_->eventId()); }

  // TERN_OK, TERN_ERROR_NOT_READY, or the failure (also kept in exception_).
  tern_status_t Poll() {
    if (event_->eventId() == nullptr) return TERN_OK;
    const tern_status_t status = tern_event_query(RawEvent());
    if (status == TERN_OK || status == TERN_ERROR_NOT_READY) return status;
    std::string message =
        "tern " + c10d::opTypeToString(opType_) + " failed: " + StatusText(status);
    const std::string cause = state_ ? state_->AsyncError() : std::string();
    if (!cause.empty()) message += "; the communicator reports: " + cause;
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_ == nullptr) {
      try {
        ThrowDist(message);
      } catch (...) {
        exception_ = std::current_exception();
      }
    }
    return status;
  }

  void RethrowIfFailed(tern_status_t status) {
    if (status == TERN_OK || status == TERN_ERROR_NOT_READY) return;
    std::rethrow_exception(exception());
  }

  void BlockCurrentStream() {
    if (event_->eventId() == nullptr) return;
    const c10::Stream current = GetCurrentStream(device_.index());
    // Recorded on this very stream (a synchronous operation): already ordered.
    if (comm_stream_.has_value() && *comm_stream_ == current) return;
    tern_queue_t queue = GetQueue(current);
    RefuseIfCapturing(queue, "waiting for a collective on the capturing stream");
    uint64_t sequence = 0;
    TERN_CHECK(tern_queue_wait_event(queue, RawEvent(), &sequence));
    // The event is this communicator's (Finish records it on its stream).
    if (state_) state_->NoteComputeWait(queue, sequence);
  }

  std::vector<at::Tensor> outputs_;
  std::shared_ptr<c10::Event> event_;
  std::shared_ptr<CommState> state_;
  std::optional<c10::Stream> comm_stream_;  // unset for operations inside a coalescing block
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool host_blocking_;
  c10::Device device_;
  std::shared_ptr<uint32_t> source_;  // recvAnysource only
};

}  // namespace

// ---- CommState --------------------------------------------------------------

namespace {
std::atomic<int64_t> live_comms{0};
std::atomic<int64_t> store_comms{0};
std::atomic<int64_t> split_comms{0};
}  // namespace

CommCounts GetCommCounts() { return {live_comms.load(), store_comms.load(), split_comms.load()}; }

CommState::CommState(tern_comm_t c, c10::DeviceIndex d, const char* o)
    : comm(c), device(d), stream(GetStreamFromPool(d)), origin(o) {
  live_comms.fetch_add(1);
  (std::strcmp(o, "split") == 0 ? split_comms : store_comms).fetch_add(1);
}

CommState::~CommState() {
  Destroy();
  if (ready_ != nullptr) tern_event_destroy(ready_);
}

void CommState::OrderAfter(tern_queue_t compute, tern_queue_t comm) {
  std::lock_guard<std::mutex> lock(order_mutex_);
  if (compute == covered_queue_) {
    // Nothing queued there since the covered point: no event to record.
    uint64_t last = 0;
    TERN_CHECK(tern_queue_last_submitted(compute, &last));
    if (last == covered_) return;
  }
  if (ready_ == nullptr) TERN_CHECK(tern_event_create(&ready_));
  // Recorded either way: its sequence tells whether anything else came in.
  uint64_t sequence = 0;
  TERN_CHECK(tern_queue_record_event(compute, ready_, &sequence));
  const bool implied = compute == covered_queue_ && sequence == covered_ + 1;
  if (!implied) TERN_CHECK(tern_queue_wait_event(comm, ready_, nullptr));
  covered_queue_ = compute;
  covered_ = sequence;
}

void CommState::NoteComputeWait(tern_queue_t compute, uint64_t sequence) {
  std::lock_guard<std::mutex> lock(order_mutex_);
  // A wait right behind the covered point waits only for this stream's own
  // earlier work, which everything queued here later follows anyway.
  if (compute == covered_queue_ && sequence == covered_ + 1) covered_ = sequence;
}

std::string CommState::AsyncError() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm == nullptr) return "";
  tern_status_t error = TERN_OK;
  if (tern_comm_get_async_error(comm, &error) != TERN_OK || error == TERN_OK) return "";
  return StatusText(error);
}

std::string CommState::Destroy() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm == nullptr) return "";
  const tern_status_t status = tern_comm_destroy(comm);
  comm = nullptr;
  live_comms.fetch_sub(1);
  return status == TERN_OK ? "" : StatusText(status);
}

void CommState::Abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm == nullptr) return;
  tern_comm_abort(comm);
  comm = nullptr;
  live_comms.fetch_sub(1);
}

// ---- ProcessGroupTern --------------------------------------------------------

struct ProcessGroupTern::Launch {
  std::shared_ptr<CommState> state;
  c10::Stream compute;
  c10::Stream comm;
  tern_queue_t queue = nullptr;
  std::optional<c10::StreamGuard> guard;  // the communication stream is current meanwhile
  std::vector<at::Tensor> used;           // kept alive on the communication stream

  // `on_current_stream`: a synchronous operation (async_op=False), which runs
  // on the caller's stream itself, as NCCL's do since PyTorch 2.7: nothing to
  // order, no hand-off between two queues' threads, and Work.wait() has
  // nothing left to wait for. Otherwise it runs on the communication stream
  // after the work already queued on the caller's.
  Launch(std::shared_ptr<CommState> s, c10::DeviceIndex device, bool on_current_stream = false)
      : state(std::move(s)),
        compute(GetCurrentStream(device)),
        comm(on_current_stream ? compute : *state->stream) {
    queue = GetQueue(compute);
    RefuseIfCapturing(queue, "a collective (torch.distributed on tern)");
    if (on_current_stream) return;
    tern_queue_t compute_queue = queue;
    queue = GetQueue(comm);
    state->OrderAfter(compute_queue, queue);
    guard.emplace(comm);
  }
  tern_comm_t comm_handle() const { return state->comm; }
  void Use(const at::Tensor& t) { used.push_back(t); }
};

ProcessGroupTern::ProcessGroupTern(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                   std::chrono::milliseconds timeout, std::string group_name)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      timeout_(timeout),
      group_name_(std::move(group_name)) {}

ProcessGroupTern::~ProcessGroupTern() {
  std::shared_ptr<CommState> state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state = std::move(state_);
  }
  if (state) state->Destroy();
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupTern::getBackendOptions() {
  auto options = c10::make_intrusive<TernBackendOptions>(timeout_);
  options->group_name = group_name_;
  return options;
}

void ProcessGroupTern::setTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ = timeout;  // for communicators created from now on
}

std::shared_ptr<CommState> ProcessGroupTern::Connect(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!shut_down_, "tern process group '", group_name_,
              "' was shut down (destroy_process_group); create a new one.");
  if (state_) {
    TORCH_CHECK(state_->device == device, "tern process group '", group_name_,
                "' is bound to tern:", static_cast<int>(state_->device),
                " (its first operation ran there) and was now given tensors on tern:",
                static_cast<int>(device),
                ". Use one device per process: torch.tern.set_device(local_rank) before "
                "init_process_group, or init_process_group(device_id=...).");
    if (state_->comm == nullptr) {
      ThrowDist("tern process group '" + group_name_ +
                "': its communicator was aborted; create a new process group.");
    }
    const std::string error = state_->AsyncError();
    if (!error.empty()) {
      ThrowDist("tern process group '" + group_name_ + "' is broken by an earlier failure: " +
                error + ". Destroy it (destroy_process_group) and create a new one.");
    }
    return state_;
  }
  tern_core_t core = GetCore(device);
  tern_comm_unique_id_t id{};
  const std::string key = UniqueIdKey(group_name_);
  if (getRank() == 0) {
    TERN_CHECK(tern_comm_get_unique_id(&id));
    std::vector<uint8_t> bytes(reinterpret_cast<const uint8_t*>(id.internal),
                               reinterpret_cast<const uint8_t*>(id.internal) + sizeof(id.internal));
    store_->set(key, bytes);
  } else {
    std::vector<uint8_t> bytes = store_->get(key);
    TORCH_CHECK(bytes.size() == sizeof(id.internal), "tern process group '", group_name_,
                "': the unique id in the store has ", bytes.size(), " bytes, expected ",
                sizeof(id.internal), " (ranks running different tern versions?)");
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  const tern_comm_config_t config = CommConfig(timeout_, group_name_);
  tern_comm_t comm = nullptr;
  const tern_status_t status =
      tern_comm_init_rank(core, static_cast<uint32_t>(getSize()), &id,
                          static_cast<uint32_t>(getRank()), &config, &comm);
  if (status != TERN_OK) {
    ThrowDist("tern process group '" + group_name_ + "': rank " + std::to_string(getRank()) +
              " of " + std::to_string(getSize()) +
              " could not join its communicator: " + StatusText(status));
  }
  if (getRank() == 0) {
    // Every rank has joined: the secret need not stay readable in the store.
    try {
      store_->deleteKey(key);
    } catch (const std::exception&) {  // stores without delete keep it; harmless
    }
  }
  state_ = std::make_shared<CommState>(comm, device, "store");
  return state_;
}

bool ProcessGroupTern::supportsSplitting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !shut_down_ && (state_ != nullptr || getBoundDeviceId().has_value());
}

c10::DeviceIndex ProcessGroupTern::SplitDevice() {
  const std::optional<at::Device> bound = getBoundDeviceId();
  if (bound && bound->type() == c10::DeviceType::PrivateUse1) return bound->index();
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ ? state_->device : CurrentDevice();
}

c10::intrusive_ptr<ProcessGroupTern> ProcessGroupTern::SplitChild(
    c10::DeviceIndex device, int32_t color, int32_t key, int want_rank, int want_size,
    const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout,
    const std::string& name) {
  const std::shared_ptr<CommState> parent = Connect(device);
  const std::string what = "tern process group '" + group_name_ + "' (rank " +
                           std::to_string(getRank()) + " of " + std::to_string(getSize()) +
                           "): splitting off group '" + name + "'";
  const tern_comm_config_t config = CommConfig(timeout, name);
  tern_comm_t child = nullptr;
  const tern_status_t status = tern_comm_split(parent->comm, color, key, &config, &child);
  if (status != TERN_OK) {
    ThrowDist(what + " failed: " + StatusText(status) +
              ". Every rank of the parent group must create the same sub-groups in the same "
              "order (split_group, new_group and DeviceMesh are collective over the parent, "
              "non-members included).");
  }
  split_count_.fetch_add(1);
  if (child == nullptr) {
    TORCH_CHECK(color == TERN_COMM_SPLIT_NOCOLOR, what, ": tern_comm_split gave no communicator");
    return {};
  }
  auto state = std::make_shared<CommState>(child, device, "split");
  tern_comm_info_t info{};
  info.struct_size = sizeof(info);
  TERN_CHECK(tern_comm_get_info(child, &info));
  if (static_cast<int>(info.rank) != want_rank || static_cast<int>(info.size) != want_size) {
    state->Abort();  // the peers' operations on it fail instead of hanging
    ThrowDist(what + ": this rank expected to be rank " + std::to_string(want_rank) + " of " +
              std::to_string(want_size) + " and is rank " + std::to_string(info.rank) + " of " +
              std::to_string(info.size) +
              ": the ranks passed different groups. Pass the same, non-overlapping groups on "
              "every rank of the parent.");
  }
  auto backend = c10::make_intrusive<ProcessGroupTern>(store, want_rank, want_size, timeout, name);
  backend->state_ = std::move(state);
  return backend;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupTern::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  TORCH_CHECK(!ranks.empty(), "tern split of group '", group_name_, "': no ranks given");
  const auto mine = std::find(ranks.begin(), ranks.end(), getRank());
  const bool member = mine != ranks.end();
  // Disjoint groups have different smallest ranks: that is the color; the
  // position in `ranks` (sorted by torch) is the key, so child ranks follow
  // the parent's order.
  const int32_t color = member ? ranks.front() : TERN_COMM_SPLIT_NOCOLOR;
  const int index = member ? static_cast<int>(mine - ranks.begin()) : -1;
  const std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
  const std::string name = opts && !opts->group_name.empty()
                               ? std::string(opts->group_name)
                               : group_name_ + ":split:" + std::to_string(SplitCount());
  return SplitChild(SplitDevice(), color, index, index, static_cast<int>(ranks.size()), store,
                    timeout, name);
}

c10::intrusive_ptr<ProcessGroupTern> ProcessGroupTern::SplitForNewGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
    std::chrono::milliseconds timeout, const std::string& group_name) {
  TORCH_CHECK(group_rank >= 0 && group_rank < group_size, "tern new_group '", group_name,
              "': rank ", group_rank, " outside a group of ", group_size);
  // One group per call: every member has color 0, the others none.
  return SplitChild(SplitDevice(), 0, group_rank, group_rank, group_size, store, timeout,
                    group_name);
}

void ProcessGroupTern::PerformNocolorSplit(at::Device device) {
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1,
              "tern process group: perform_nocolor_split needs a tern device, got ", device);
  SplitChild(device.has_index() ? device.index() : SplitDevice(), TERN_COMM_SPLIT_NOCOLOR, 0, -1, 0,
             {}, timeout_, group_name_ + ":nocolor");
}

c10::DeviceIndex ProcessGroupTern::DeviceOf(const std::vector<at::Tensor>& tensors,
                                            const char* op) {
  for (const auto& t : tensors) {
    if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) {
      return t.device().index();
    }
  }
  if (!tensors.empty() && tensors[0].defined()) {
    CheckTensor(tensors[0], -1, op);  // raises the "not a tern tensor" error
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ ? state_->device : CurrentDevice();
}

bool ProcessGroupTern::OnCurrentStream(bool async_op) {
  if (async_op) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  return !coalescing_;  // a coalescing block's operations share one Work
}

CpuStaging ProcessGroupTern::Staging(const char* op) { return {getRank(), DeviceOf({}, op)}; }

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::StagedP2P(CpuStaging& staging,
                                                           c10::intrusive_ptr<c10d::Work> work,
                                                           std::vector<at::Tensor>& cpu_tensors) {
  auto staged = staging.Wrap(std::move(work), cpu_tensors);
  std::lock_guard<std::mutex> lock(mutex_);
  // Inside a coalescing block the operation runs at its end: that Work
  // copies the result back too.
  if (coalescing_) staged_p2p_.push_back(staged);
  return staged;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::Finish(Launch& launch, c10d::OpType op_type,
                                                        std::vector<at::Tensor> outputs,
                                                        bool host_blocking,
                                                        std::shared_ptr<uint32_t> source) {
  for (const auto& t : launch.used) {
    if (t.defined() && t.numel() > 0) {
      TernDeviceAllocator::Get().recordStream(t.storage().data_ptr(), launch.comm);
    }
  }
  auto event = std::make_shared<c10::Event>(c10::DeviceType::PrivateUse1);
  event->record(launch.comm);
  const c10::Device device(c10::DeviceType::PrivateUse1, launch.comm.device_index());
  launch.guard.reset();
  sequence_.fetch_add(1);
  auto work =
      c10::make_intrusive<WorkTern>(getRank(), op_type, std::move(outputs), std::move(event),
                                    launch.state, launch.comm, host_blocking, device);
  if (source) work->SetSource(std::move(source));
  work->EndProfilingRange();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "tern allreduce: one tensor per call (got ", tensors.size(),
              ")");
  const c10d::AllreduceCoalescedOptions coalesced{opts};
  return allreduce_coalesced(tensors, coalesced);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (AnyOnCpu(tensors)) {
    CpuStaging staging = Staging("allreduce");
    auto staged = staging.Stage(tensors, CpuStaging::Role::kInOut);
    return staging.Wrap(allreduce_coalesced(staged, opts), tensors);
  }
  const c10::DeviceIndex device = DeviceOf(tensors, "allreduce");
  for (const auto& t : tensors) CheckTensor(t, device, "allreduce");
  const tern_comm_redop_t redop = ToRedop(opts.reduceOp, "allreduce");
  std::vector<Wire> wires;
  for (const auto& t : tensors) wires.push_back(ReductionWire(t, "allreduce"));
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor& t = tensors[i];
    launch.Use(t);
    if (opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM) PremulInto(opts.reduceOp, t, t);
    const Range r = Locate(t);
    if (t.numel() > 0) {  // empty on every rank: nothing to communicate
      TERN_CHECK(tern_comm_all_reduce(launch.comm_handle(), r.buffer, r.offset, r.buffer, r.offset,
                                      wires[i].Count(t), wires[i].dtype, redop, launch.queue));
    }
  }
  return Finish(launch,
                tensors.size() == 1 ? c10d::OpType::ALLREDUCE : c10d::OpType::ALLREDUCE_COALESCED,
                tensors, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "tern broadcast: one tensor per call");
  if (AnyOnCpu(tensors)) {
    CpuStaging staging = Staging("broadcast");
    auto staged = staging.Stage(tensors, CpuStaging::Role::kInOut);
    return staging.Wrap(broadcast(staged, opts), tensors);
  }
  const c10::DeviceIndex device = DeviceOf(tensors, "broadcast");
  at::Tensor& t = tensors[0];
  CheckTensor(t, device, "broadcast");
  const Wire wire = MoveWire(t);
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  launch.Use(t);
  const Range r = Locate(t);
  if (t.numel() > 0) {  // empty on every rank: nothing to communicate
    TERN_CHECK(tern_comm_broadcast(launch.comm_handle(), r.buffer, r.offset, r.buffer, r.offset,
                                   wire.Count(t), wire.dtype, static_cast<uint32_t>(opts.rootRank),
                                   launch.queue));
  }
  return Finish(launch, c10d::OpType::BROADCAST, tensors, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "tern reduce: one tensor per call");
  if (AnyOnCpu(tensors)) {
    CpuStaging staging = Staging("reduce");
    auto staged = staging.Stage(tensors, CpuStaging::Role::kInOut);
    return staging.Wrap(reduce(staged, opts), tensors);
  }
  const c10::DeviceIndex device = DeviceOf(tensors, "reduce");
  at::Tensor& t = tensors[0];
  CheckTensor(t, device, "reduce");
  const tern_comm_redop_t redop = ToRedop(opts.reduceOp, "reduce");
  const Wire wire = ReductionWire(t, "reduce");
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  launch.Use(t);
  at::Tensor send = t;
  if (opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM) {
    send = at::empty_like(t);  // non-root ranks keep their input unchanged
    PremulInto(opts.reduceOp, t, send);
    launch.Use(send);
  }
  const Range s = Locate(send);
  const bool root = opts.rootRank == getRank();
  const Range r = root ? Locate(t) : Range{};
  if (t.numel() > 0) {  // empty on every rank: nothing to communicate
    TERN_CHECK(tern_comm_reduce(launch.comm_handle(), s.buffer, s.offset, r.buffer, r.offset,
                                wire.Count(t), wire.dtype, redop,
                                static_cast<uint32_t>(opts.rootRank), launch.queue));
  }
  return Finish(launch, c10d::OpType::REDUCE, tensors, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  auto work = allgather_into_tensor_coalesced(outputs, inputs, opts);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "tern all_gather_into_tensor: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("all_gather_into_tensor");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    return staging.Wrap(
        allgather_into_tensor_coalesced(staged_out, staged_in, c10d::AllgatherOptions{}), outputs);
  }
  const c10::DeviceIndex device = DeviceOf(inputs, "all_gather_into_tensor");
  for (size_t i = 0; i < inputs.size(); ++i) {
    CheckTensor(inputs[i], device, "all_gather_into_tensor");
    CheckTensor(outputs[i], device, "all_gather_into_tensor");
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(),
                "tern all_gather_into_tensor: output dtype ", outputs[i].scalar_type(),
                " differs from input dtype ", inputs[i].scalar_type());
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * getSize(),
                "tern all_gather_into_tensor: the output must hold world_size (", getSize(),
                ") x the input's ", inputs[i].numel(), " elements, it holds ", outputs[i].numel());
  }
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  for (size_t i = 0; i < inputs.size(); ++i) {
    launch.Use(inputs[i]);
    launch.Use(outputs[i]);
    const Wire wire = MoveWire(inputs[i]);
    const Range s = Locate(inputs[i]);
    const Range r = Locate(outputs[i]);
    if (inputs[i].numel() > 0) {  // empty on every rank: nothing to communicate
      TERN_CHECK(tern_comm_all_gather(launch.comm_handle(), s.buffer, s.offset, r.buffer, r.offset,
                                      wire.Count(inputs[i]), wire.dtype, launch.queue));
    }
  }
  return Finish(launch, c10d::OpType::_ALLGATHER_BASE, outputs, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return AllgatherEachInput(outputs, inputs, OnCurrentStream(opts.asyncOp));
}

// c10d's coalesced all-gather takes one output list per rank, each with a
// tensor per input (outputs[rank][i]), the transpose of allgather's.
c10::intrusive_ptr<c10d::Work> ProcessGroupTern::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == getSize(),
              "tern allgather_coalesced: ", outputs.size(), " output lists for a group of ",
              getSize(), " ranks: pass one list per rank, each with a tensor per input");
  std::vector<std::vector<at::Tensor>> per_input(inputs.size());
  for (size_t rank = 0; rank < outputs.size(); ++rank) {
    TORCH_CHECK(outputs[rank].size() == inputs.size(),
                "tern allgather_coalesced: the output list of rank ", rank, " has ",
                outputs[rank].size(), " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) per_input[i].push_back(outputs[rank][i]);
  }
  return AllgatherEachInput(per_input, inputs, OnCurrentStream(opts.asyncOp));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::AllgatherEachInput(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    bool on_current_stream) {
  TORCH_CHECK(outputs.size() == inputs.size(), "tern allgather: ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("allgather");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    std::vector<at::Tensor> results;
    for (const auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    return staging.Wrap(AllgatherEachInput(staged_out, staged_in, on_current_stream),
                        std::move(results));
  }
  const c10::DeviceIndex device = DeviceOf(inputs, "allgather");
  for (size_t i = 0; i < inputs.size(); ++i) {
    CheckTensor(inputs[i], device, "allgather");
    TORCH_CHECK(static_cast<int>(outputs[i].size()) == getSize(),
                "tern allgather: the output list must have world_size (", getSize(),
                ") tensors, it has ", outputs[i].size());
    for (const auto& o : outputs[i]) {
      TORCH_CHECK(o.numel() == inputs[i].numel() && o.scalar_type() == inputs[i].scalar_type(),
                  "tern allgather: every output tensor must match the input's size and dtype");
      TORCH_CHECK(o.device() == inputs[i].device(), "tern allgather: outputs on ", o.device(),
                  ", input on ", inputs[i].device());
    }
  }
  Launch launch(Connect(device), device, on_current_stream);
  std::vector<at::Tensor> results;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    launch.Use(in);
    launch.Use(flat);
    const Wire wire = MoveWire(in);
    const Range s = Locate(in);
    const Range r = Locate(flat);
    if (in.numel() > 0) {  // empty on every rank: nothing to communicate
      TERN_CHECK(tern_comm_all_gather(launch.comm_handle(), s.buffer, s.offset, r.buffer, r.offset,
                                      wire.Count(in), wire.dtype, launch.queue));
    }
    for (int rank = 0; rank < getSize(); ++rank) {
      at::Tensor& o = outputs[i][rank];
      o.copy_(flat.narrow(0, rank * in.numel(), in.numel()).view(o.sizes()));
      launch.Use(o);
      results.push_back(o);
    }
  }
  return Finish(launch, c10d::OpType::ALLGATHER, std::move(results), false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "tern reduce_scatter_tensor: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("reduce_scatter_tensor");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    return staging.Wrap(reduce_scatter_tensor_coalesced(staged_out, staged_in, opts), outputs);
  }
  const c10::DeviceIndex device = DeviceOf(inputs, "reduce_scatter_tensor");
  const tern_comm_redop_t redop = ToRedop(opts.reduceOp, "reduce_scatter_tensor");
  for (size_t i = 0; i < inputs.size(); ++i) {
    CheckTensor(inputs[i], device, "reduce_scatter_tensor");
    CheckTensor(outputs[i], device, "reduce_scatter_tensor");
    ReductionWire(inputs[i], "reduce_scatter_tensor");
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(),
                "tern reduce_scatter_tensor: output dtype differs from input dtype");
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * getSize(),
                "tern reduce_scatter_tensor: the input must hold world_size (", getSize(),
                ") x the output's ", outputs[i].numel(), " elements, it holds ", inputs[i].numel());
  }
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor send = inputs[i];
    if (opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM) {
      send = at::empty_like(inputs[i]);  // the input stays unchanged
      PremulInto(opts.reduceOp, inputs[i], send);
    }
    launch.Use(inputs[i]);
    launch.Use(send);
    launch.Use(outputs[i]);
    const Wire wire = ReductionWire(outputs[i], "reduce_scatter_tensor");
    const Range s = Locate(send);
    const Range r = Locate(outputs[i]);
    if (outputs[i].numel() > 0) {  // empty on every rank: nothing to communicate
      TERN_CHECK(tern_comm_reduce_scatter(launch.comm_handle(), s.buffer, s.offset, r.buffer,
                                          r.offset, wire.Count(outputs[i]), wire.dtype, redop,
                                          launch.queue));
    }
  }
  return Finish(launch, c10d::OpType::_REDUCE_SCATTER_BASE, outputs, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "tern reduce_scatter: one output and one input list per call");
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("reduce_scatter");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    return staging.Wrap(reduce_scatter(staged_out, staged_in, opts), outputs);
  }
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == getSize(),
              "tern reduce_scatter: the input list must have world_size (", getSize(),
              ") tensors, it has ", inputs[0].size());
  const c10::DeviceIndex device = DeviceOf(outputs, "reduce_scatter");
  for (const auto& t : inputs[0]) {
    TORCH_CHECK(t.numel() == outputs[0].numel() && t.device() == outputs[0].device() &&
                    t.scalar_type() == outputs[0].scalar_type(),
                "tern reduce_scatter: every input must match the output's size, device and "
                "dtype");
  }
  at::Tensor flat;
  {
    // Packed where the operation runs (see Launch).
    Launch pack(Connect(device), device, OnCurrentStream(opts.asyncOp));
    std::vector<at::Tensor> pieces;
    for (const auto& t : inputs[0]) pieces.push_back(t.reshape({-1}));
    flat = at::cat(pieces);
    for (const auto& t : inputs[0]) pack.Use(t);
    pack.Use(flat);
    for (const auto& t : pack.used) {
      TernDeviceAllocator::Get().recordStream(t.storage().data_ptr(), pack.comm);
    }
  }
  // Allocated on the stream the collective below runs on.
  return _reduce_scatter_base(outputs[0], flat, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  if (AnyOnCpu({output, input})) {
    CpuStaging staging = Staging("all_to_all_single");
    at::Tensor staged_out = staging.Stage(output, CpuStaging::Role::kOut);
    at::Tensor staged_in = staging.Stage(input, CpuStaging::Role::kIn);
    return staging.Wrap(alltoall_base(staged_out, staged_in, output_split_sizes, input_split_sizes,
                                      c10d::AllToAllOptions{}),
                        {output});
  }
  const c10::DeviceIndex device = DeviceOf({input}, "all_to_all_single");
  CheckTensor(input, device, "all_to_all_single");
  CheckTensor(output, device, "all_to_all_single");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(),
              "tern all_to_all_single: input and output dtypes differ");
  const int n = getSize();
  const Wire wire = MoveWire(input);
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  launch.Use(input);
  launch.Use(output);
  const Range s = Locate(input);
  const Range r = Locate(output);
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    TORCH_CHECK(input.numel() == output.numel() && input.numel() % n == 0,
                "tern all_to_all_single: input (", input.numel(), ") and output (", output.numel(),
                ") must have the same number of elements, divisible by ", n);
    TORCH_CHECK(input.numel() == 0 || s.buffer != r.buffer || s.offset != r.offset,
                "tern all_to_all_single: input and output must be different tensors");
    if (input.numel() > 0) {  // empty on every rank: nothing to communicate
      TERN_CHECK(tern_comm_all_to_all(launch.comm_handle(), s.buffer, s.offset, r.buffer, r.offset,
                                      wire.Count(input) / n, wire.dtype, launch.queue));
    }
    return Finish(launch, c10d::OpType::ALLTOALL_BASE, {output}, false);
  }
  // Uneven splits (along dim 0): one send and one receive per peer, grouped.
  auto splits = [n](const at::Tensor& t, std::vector<int64_t> sizes, const char* what) {
    if (sizes.empty()) {
      TORCH_CHECK(t.size(0) % n == 0, "tern all_to_all_single: ", what, " dim 0 (", t.size(0),
                  ") is not divisible by ", n);
      sizes.assign(n, t.size(0) / n);
    }
    TORCH_CHECK(static_cast<int>(sizes.size()) == n, "tern all_to_all_single: ", what,
                " split sizes have ", sizes.size(), " entries, expected ", n);
    int64_t total = 0;
    for (int64_t v : sizes) total += v;
    TORCH_CHECK(total == (t.dim() == 0 ? 1 : t.size(0)), "tern all_to_all_single: ", what,
                " split sizes sum to ", total, ", dim 0 is ", t.size(0));
    return sizes;
  };
  const auto in_sizes = splits(input, input_split_sizes, "input");
  const auto out_sizes = splits(output, output_split_sizes, "output");
  const int64_t row_in = input.size(0) == 0 ? 0 : input.nbytes() / input.size(0);
  const int64_t row_out = output.size(0) == 0 ? 0 : output.nbytes() / output.size(0);
  TORCH_CHECK(row_in == row_out || row_in == 0 || row_out == 0,
              "tern all_to_all_single: input and output rows differ in size");
  const int64_t row = row_in != 0 ? row_in : row_out;
  const int64_t units_per_row = row / wire.unit;
  int64_t in_off = 0, out_off = 0;
  std::vector<int64_t> in_offsets(n), out_offsets(n);
  for (int p = 0; p < n; ++p) {
    in_offsets[p] = in_off;
    out_offsets[p] = out_off;
    in_off += in_sizes[p];
    out_off += out_sizes[p];
  }
  const int self = getRank();
  if (in_sizes[self] > 0) {
    TORCH_CHECK(in_sizes[self] == out_sizes[self], "tern all_to_all_single: this rank sends ",
                in_sizes[self], " rows to itself but expects ", out_sizes[self]);
    TERN_CHECK(tern_queue_copy_d2d(launch.queue, r.buffer, r.offset + out_offsets[self] * row,
                                   s.buffer, s.offset + in_offsets[self] * row,
                                   in_sizes[self] * row, nullptr));
  }
  GroupScope group;
  for (int p = 0; p < n; ++p) {
    if (p == self) continue;
    if (in_sizes[p] > 0) {
      TERN_CHECK(tern_comm_send(launch.comm_handle(), s.buffer, s.offset + in_offsets[p] * row,
                                in_sizes[p] * units_per_row, wire.dtype, p, launch.queue));
    }
    if (out_sizes[p] > 0) {
      TERN_CHECK(tern_comm_recv(launch.comm_handle(), r.buffer, r.offset + out_offsets[p] * row,
                                out_sizes[p] * units_per_row, wire.dtype, p, launch.queue));
    }
  }
  group.End();
  return Finish(launch, c10d::OpType::ALLTOALL_BASE, {output}, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("all_to_all");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    return staging.Wrap(alltoall(staged_out, staged_in, c10d::AllToAllOptions{}), outputs);
  }
  const int n = getSize();
  TORCH_CHECK(static_cast<int>(outputs.size()) == n && static_cast<int>(inputs.size()) == n,
              "tern all_to_all: lists of world_size (", n, ") tensors expected");
  const c10::DeviceIndex device = DeviceOf(inputs, "all_to_all");
  for (int p = 0; p < n; ++p) {
    CheckTensor(inputs[p], device, "all_to_all");
    CheckTensor(outputs[p], device, "all_to_all");
  }
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  const int self = getRank();
  if (inputs[self].numel() > 0) {
    TORCH_CHECK(inputs[self].nbytes() == outputs[self].nbytes(),
                "tern all_to_all: the block this rank sends itself differs in size");
    const Range s = Locate(inputs[self]);
    const Range r = Locate(outputs[self]);
    TERN_CHECK(tern_queue_copy_d2d(launch.queue, r.buffer, r.offset, s.buffer, s.offset,
                                   inputs[self].nbytes(), nullptr));
  }
  GroupScope group;
  for (int p = 0; p < n; ++p) {
    launch.Use(inputs[p]);
    launch.Use(outputs[p]);
    if (p == self) continue;
    if (inputs[p].numel() > 0) {
      const Wire w = MoveWire(inputs[p]);
      const Range s = Locate(inputs[p]);
      TERN_CHECK(tern_comm_send(launch.comm_handle(), s.buffer, s.offset, w.Count(inputs[p]),
                                w.dtype, p, launch.queue));
    }
    if (outputs[p].numel() > 0) {
      const Wire w = MoveWire(outputs[p]);
      const Range r = Locate(outputs[p]);
      TERN_CHECK(tern_comm_recv(launch.comm_handle(), r.buffer, r.offset, w.Count(outputs[p]),
                                w.dtype, p, launch.queue));
    }
  }
  group.End();
  return Finish(launch, c10d::OpType::ALLTOALL, outputs, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1, "tern gather: one input tensor per call");
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("gather");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    std::vector<at::Tensor> results;
    for (const auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    return staging.Wrap(gather(staged_out, staged_in, opts), std::move(results));
  }
  const c10::DeviceIndex device = DeviceOf(inputs, "gather");
  at::Tensor& in = inputs[0];
  CheckTensor(in, device, "gather");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "tern gather: the root needs a gather_list of world_size (", getSize(),
                ") tensors");
    for (const auto& o : outputs[0]) {
      CheckTensor(o, device, "gather");
      TORCH_CHECK(o.nbytes() == in.nbytes() && o.scalar_type() == in.scalar_type(),
                  "tern gather: every gather_list tensor must match the input's size and dtype");
    }
  }
  const Wire wire = MoveWire(in);
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  launch.Use(in);
  const Range s = Locate(in);
  std::vector<at::Tensor> results;
  if (is_root) {
    GroupScope group;
    for (int p = 0; p < getSize(); ++p) {
      at::Tensor& o = outputs[0][p];
      launch.Use(o);
      results.push_back(o);
      if (o.numel() == 0) continue;
      const Range r = Locate(o);
      if (p == root) {
        TERN_CHECK(tern_queue_copy_d2d(launch.queue, r.buffer, r.offset, s.buffer, s.offset,
                                       in.nbytes(), nullptr));
      } else {
        TERN_CHECK(tern_comm_recv(launch.comm_handle(), r.buffer, r.offset, wire.Count(o),
                                  wire.dtype, p, launch.queue));
      }
    }
    group.End();
  } else if (in.numel() > 0) {
    TERN_CHECK(tern_comm_send(launch.comm_handle(), s.buffer, s.offset, wire.Count(in), wire.dtype,
                              root, launch.queue));
  }
  return Finish(launch, c10d::OpType::GATHER, std::move(results), false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "tern scatter: one output tensor per call");
  if (AnyOnCpu(outputs) || AnyOnCpu(inputs)) {
    CpuStaging staging = Staging("scatter");
    auto staged_out = staging.Stage(outputs, CpuStaging::Role::kOut);
    auto staged_in = staging.Stage(inputs, CpuStaging::Role::kIn);
    return staging.Wrap(scatter(staged_out, staged_in, opts), outputs);
  }
  const c10::DeviceIndex device = DeviceOf(outputs, "scatter");
  at::Tensor& out = outputs[0];
  CheckTensor(out, device, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "tern scatter: the root needs a scatter_list of world_size (", getSize(),
                ") tensors");
    for (const auto& t : inputs[0]) {
      CheckTensor(t, device, "scatter");
      TORCH_CHECK(t.nbytes() == out.nbytes() && t.scalar_type() == out.scalar_type(),
                  "tern scatter: every scatter_list tensor must match the output's size and dtype");
    }
  }
  const Wire wire = MoveWire(out);
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  launch.Use(out);
  const Range r = Locate(out);
  if (is_root) {
    GroupScope group;
    for (int p = 0; p < getSize(); ++p) {
      const at::Tensor& t = inputs[0][p];
      launch.Use(t);
      if (t.numel() == 0) continue;
      const Range s = Locate(t);
      if (p == root) {
        TERN_CHECK(tern_queue_copy_d2d(launch.queue, r.buffer, r.offset, s.buffer, s.offset,
                                       t.nbytes(), nullptr));
      } else {
        TERN_CHECK(tern_comm_send(launch.comm_handle(), s.buffer, s.offset, wire.Count(t),
                                  wire.dtype, p, launch.queue));
      }
    }
    group.End();
  } else if (out.numel() > 0) {
    TERN_CHECK(tern_comm_recv(launch.comm_handle(), r.buffer, r.offset, wire.Count(out), wire.dtype,
                              root, launch.queue));
  }
  return Finish(launch, c10d::OpType::SCATTER, outputs, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::send(std::vector<at::Tensor>& tensors,
                                                      int dst_rank, int tag) {
  TORCH_CHECK(tensors.size() == 1, "tern send: one tensor per call");
  if (AnyOnCpu(tensors)) {
    CpuStaging staging = Staging("send");
    auto staged = staging.Stage(tensors, CpuStaging::Role::kIn);
    return StagedP2P(staging, send(staged, dst_rank, tag), tensors);
  }
  const c10::DeviceIndex device = DeviceOf(tensors, "send");
  CheckTensor(tensors[0], device, "send");
  TORCH_CHECK(dst_rank >= 0 && dst_rank < getSize() && dst_rank != getRank(),
              "tern send: invalid destination rank ", dst_rank);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (coalescing_) {
      pending_p2p_.push_back({tensors[0], dst_rank, true});
      return c10::make_intrusive<WorkTern>(getRank(), c10d::OpType::SEND, tensors, coalesced_event_,
                                           state_ ? state_ : nullptr, std::nullopt, false,
                                           tensors[0].device());
    }
  }
  const Wire wire = MoveWire(tensors[0]);
  Launch launch(Connect(device), device);
  launch.Use(tensors[0]);
  const Range s = Locate(tensors[0]);
  if (tensors[0].numel() > 0) {
    TERN_CHECK(tern_comm_send(launch.comm_handle(), s.buffer, s.offset, wire.Count(tensors[0]),
                              wire.dtype, static_cast<uint32_t>(dst_rank), launch.queue));
  }
  return Finish(launch, c10d::OpType::SEND, tensors, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::recv(std::vector<at::Tensor>& tensors,
                                                      int src_rank, int tag) {
  TORCH_CHECK(tensors.size() == 1, "tern recv: one tensor per call");
  if (AnyOnCpu(tensors)) {
    CpuStaging staging = Staging("recv");
    auto staged = staging.Stage(tensors, CpuStaging::Role::kOut);
    return StagedP2P(staging, recv(staged, src_rank, tag), tensors);
  }
  const c10::DeviceIndex device = DeviceOf(tensors, "recv");
  CheckTensor(tensors[0], device, "recv");
  TORCH_CHECK(src_rank >= 0 && src_rank < getSize() && src_rank != getRank(),
              "tern recv: invalid source rank ", src_rank,
              " (receiving from any source is not supported)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (coalescing_) {
      pending_p2p_.push_back({tensors[0], src_rank, false});
      return c10::make_intrusive<WorkTern>(getRank(), c10d::OpType::RECV, tensors, coalesced_event_,
                                           state_ ? state_ : nullptr, std::nullopt, false,
                                           tensors[0].device());
    }
  }
  const Wire wire = MoveWire(tensors[0]);
  Launch launch(Connect(device), device);
  launch.Use(tensors[0]);
  const Range r = Locate(tensors[0]);
  if (tensors[0].numel() > 0) {
    TERN_CHECK(tern_comm_recv(launch.comm_handle(), r.buffer, r.offset, wire.Count(tensors[0]),
                              wire.dtype, static_cast<uint32_t>(src_rank), launch.queue));
  }
  return Finish(launch, c10d::OpType::RECV, tensors, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::recvAnysource(std::vector<at::Tensor>& tensors,
                                                               int tag) {
  TORCH_CHECK(tensors.size() == 1, "tern recv: one tensor per call");
  if (AnyOnCpu(tensors)) {
    CpuStaging staging = Staging("recv");
    auto staged = staging.Stage(tensors, CpuStaging::Role::kOut);
    return StagedP2P(staging, recvAnysource(staged, tag), tensors);
  }
  const c10::DeviceIndex device = DeviceOf(tensors, "recv");
  CheckTensor(tensors[0], device, "recv");
  TORCH_CHECK(getSize() > 1, "tern recv from any source: the group has no other rank");
  TORCH_CHECK(tensors[0].numel() > 0,
              "tern recv from any source: the tensor is empty, and an empty send sends nothing "
              "to find; name the source (src=...) for empty tensors");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!coalescing_,
                "tern recv from any source inside a coalescing block (batch_isend_irecv): "
                "name the source of each receive there");
  }
  const Wire wire = MoveWire(tensors[0]);
  Launch launch(Connect(device), device);
  launch.Use(tensors[0]);
  const Range r = Locate(tensors[0]);
  // The queue writes the sender's rank here when the receive runs; the slot
  // lives until a callback queued behind it, whatever becomes of the Work.
  auto source = std::make_shared<uint32_t>(UINT32_MAX);
  auto* keeper = new std::shared_ptr<uint32_t>(source);
  const tern_status_t enqueued =
      tern_comm_recv_any(launch.comm_handle(), r.buffer, r.offset, wire.Count(tensors[0]),
                         wire.dtype, source.get(), launch.queue);
  if (enqueued != TERN_OK) delete keeper;
  TERN_CHECK(enqueued);
  // Should the callback not be queued, the slot stays (leaked) rather than
  // be written after it is freed.
  TERN_CHECK(tern_queue_host_callback(
      launch.queue,
      [](void* slot, tern_status_t) { delete static_cast<std::shared_ptr<uint32_t>*>(slot); },
      keeper, nullptr));
  (void)tag;  // as for recv: messages between two ranks match in order
  return Finish(launch, c10d::OpType::RECVANYSOURCE, tensors, false, std::move(source));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::barrier(const c10d::BarrierOptions& opts) {
  c10::DeviceIndex device = -1;
  if (opts.device.has_value() && opts.device->type() == c10::DeviceType::PrivateUse1) {
    device = opts.device->index();
  } else if (!opts.device_ids.empty()) {
    device = static_cast<c10::DeviceIndex>(opts.device_ids[0]);
  }
  if (device < 0) device = DeviceOf({}, "barrier");
  Launch launch(Connect(device), device, OnCurrentStream(opts.asyncOp));
  TERN_CHECK(tern_comm_barrier(launch.comm_handle(), launch.queue));
  return Finish(launch, c10d::OpType::BARRIER, {}, /*host_blocking=*/true);
}

void ProcessGroupTern::startCoalescing() {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!coalescing_, "tern: coalescing already started on this process group");
  coalescing_ = true;
  pending_p2p_.clear();
  staged_p2p_.clear();
  coalesced_event_ = std::make_shared<c10::Event>(c10::DeviceType::PrivateUse1);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTern::endCoalescing() {
  std::vector<PendingP2P> pending;
  std::vector<c10::intrusive_ptr<c10d::Work>> staged_p2p;
  std::shared_ptr<c10::Event> shared_event;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(coalescing_, "tern: endCoalescing without startCoalescing");
    coalescing_ = false;
    pending.swap(pending_p2p_);
    staged_p2p.swap(staged_p2p_);
    shared_event = std::move(coalesced_event_);
  }
  std::vector<at::Tensor> tensors;
  for (const auto& p : pending) tensors.push_back(p.tensor);
  const c10::DeviceIndex device = DeviceOf(tensors, "coalesced operations");
  Launch launch(Connect(device), device);
  if (!pending.empty()) {
    GroupScope group;
    for (const auto& p : pending) {
      launch.Use(p.tensor);
      if (p.tensor.numel() == 0) continue;
      const Wire wire = MoveWire(p.tensor);
      const Range range = Locate(p.tensor);
      if (p.is_send) {
        TERN_CHECK(tern_comm_send(launch.comm_handle(), range.buffer, range.offset,
                                  wire.Count(p.tensor), wire.dtype, static_cast<uint32_t>(p.peer),
                                  launch.queue));
      } else {
        TERN_CHECK(tern_comm_recv(launch.comm_handle(), range.buffer, range.offset,
                                  wire.Count(p.tensor), wire.dtype, static_cast<uint32_t>(p.peer),
                                  launch.queue));
      }
    }
    group.End();
  }
  // The per-operation Works handed out meanwhile complete with this event.
  if (shared_event) shared_event->record(launch.comm);
  auto work = Finish(launch, c10d::OpType::COALESCED, tensors, false);
  if (staged_p2p.empty()) return work;
  // CPU tensors among them: the block's Work copies their results back too.
  std::vector<at::Tensor> cpu_tensors;
  for (const auto& staged : staged_p2p) {
    for (const auto& t : staged->result()) cpu_tensors.push_back(t);
  }
  return Staging("coalesced operations").Wrap(work, std::move(cpu_tensors), std::move(staged_p2p));
}

void ProcessGroupTern::eagerConnectSingleDevice(at::Device device) {
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1,
              "tern process group: eager connection needs a tern device, got ", device);
  Connect(device.has_index() ? device.index() : CurrentDevice());
}

c10d::ErrorType ProcessGroupTern::getError() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!state_) return c10d::ErrorType::SUCCESS;
  return state_->AsyncError().empty() ? c10d::ErrorType::SUCCESS : c10d::ErrorType::COMM_ERROR;
}

void ProcessGroupTern::shutdown() {
  std::shared_ptr<CommState> state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    state = state_;
  }
  if (state) state->Destroy();
}

void ProcessGroupTern::abort() {
  std::shared_ptr<CommState> state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shut_down_ = true;
    state = state_;
  }
  if (state) state->Abort();
}

std::optional<c10::Stream> ProcessGroupTern::CommunicationStream() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!state_) return std::nullopt;
  return state_->stream;
}

std::string ProcessGroupTern::Describe() {
  std::shared_ptr<CommState> state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state = state_;
  }
  if (!state || state->comm == nullptr) return "not connected";
  tern_comm_info_t info{};
  info.struct_size = sizeof(info);
  TERN_CHECK(tern_comm_get_info(state->comm, &info));
  return "rank " + std::to_string(info.rank) + "/" + std::to_string(info.size) +
         " on tern:" + std::to_string(state->device) + " via " + info.transport;
}

std::string ProcessGroupTern::Origin() {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_ ? state_->origin : "";
}

}  // namespace torch_tern::distributed
