// ProcessGroupTern: torch.distributed's c10d::Backend over tern's collectives
// (include/tern/comm.h).
//
// One communicator per process group, created lazily by the group's first
// operation on the tern device that operation names (torch.tern.set_device
// before it, or init_process_group(device_id=...), which connects eagerly).
// Rendezvous goes only through the c10d store the group is given: rank 0
// creates tern's unique id (bootstrap address + 256-bit secret) and publishes
// it under a key of the group's prefix store; the other ranks read it from
// there. Sub-groups come from a split of their parent's communicator
// (tern_comm_split) where torch splits: split_group and DeviceMesh call
// split() on every rank of the parent, and new_group, once the default group
// is bound to a device, calls SplitForNewGroup (members, from the Python
// creator) or PerformNocolorSplit (non-members, from torch). Other sub-groups
// rendezvous through their own prefix store as above.
//
// Streams: every operation runs on one communication stream per device (a
// stream of the plugin's pool, taken when the communicator is created). The
// stream first waits for the caller's current stream (an event), so the
// inputs are ready; the returned Work holds an event recorded after the
// operation: Work::wait() makes the caller's current stream wait for it (the
// host does not block, except for barrier), and Work::getFuture() is
// completed with the outputs on the communication stream, so callbacks that
// wait on it are ordered after the collective (DDP's comm hooks).
//
// Errors: a failed operation (peer lost, timeout, mismatch, abort) fails its
// event; Work::wait(), isCompleted() and the next operation raise it with the
// communicator's own message (which names the lost rank).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "distributed/cpu_staging.h"
#include "tern/tern.h"

namespace torch_tern::distributed {

// The communicator of one process group and the device it is bound to.
// Shared by the backend and its Work objects so that a Work can still report
// the communicator's error; Destroy()/Abort() release it once.
class CommState {
 public:
  // Takes `comm` (counted as live until Destroy/Abort) on `device`, with a
  // communication stream of the plugin's pool; `origin` says how it was made.
  CommState(tern_comm_t comm, c10::DeviceIndex device, const char* origin);
  ~CommState();
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  tern_comm_t comm = nullptr;
  c10::DeviceIndex device = -1;
  std::optional<c10::Stream> stream;  // the communication stream
  const char* origin = "";            // "store" or "split"

  // The communicator's asynchronous error as text ("" when healthy or gone).
  // Thread-safety: any thread.
  std::string AsyncError();
  // Waits for the communicator's work and destroys it; returns its error text.
  // Thread-safety: any thread; idempotent.
  std::string Destroy();
  // Aborts the communicator (operations in flight fail at once, peers are told).
  // Thread-safety: any thread; idempotent.
  void Abort();

  // Orders the communication queue `comm` after the work queued so far on the
  // caller's `compute` queue (an event recorded on one, waited for on the
  // other), unless the communication queue's own order already implies it:
  // when everything `compute` was given since the last such point is a wait
  // for this communicator's earlier operations (NoteComputeWait), it adds no
  // work the collective could read. That is the loop of synchronous
  // collectives (each Work.wait() makes the compute stream wait for the
  // last): waiting there too made every operation wait for the compute
  // queue's thread to see the previous one end, a hand-off per operation.
  // When nothing at all was queued on `compute` since that point (its last
  // submitted sequence is the covered one), not even the event is recorded.
  // Thread-safety: any thread.
  void OrderAfter(tern_queue_t compute, tern_queue_t comm);
  // Tells the state that command `sequence` of `compute` is a wait for an
  // event recorded on this communicator's stream.
  // Thread-safety: any thread.
  void NoteComputeWait(tern_queue_t compute, uint64_t sequence);

 private:
  std::mutex mutex_;
  std::mutex order_mutex_;
  tern_event_t ready_ = nullptr;          // guarded by order_mutex_
  tern_queue_t covered_queue_ = nullptr;  // guarded by order_mutex_
  uint64_t covered_ = 0;                  // guarded by order_mutex_: the communication
                                          // stream is ordered after covered_queue_'s
                                          // commands up to this sequence
};

// Communicators of this process's tern process groups: how many exist now and
// how many were made each way since the process started (the tests use them
// to tell a split from a store rendezvous and to see teardown free them).
// Thread-safety: any thread.
struct CommCounts {
  int64_t live = 0;
  int64_t from_store = 0;
  int64_t from_split = 0;
};
CommCounts GetCommCounts();

// The group's options as torch sees them (Backend.options): c10d's plain
// options, copyable, because split_group deep-copies the parent's.
struct TernBackendOptions final : c10d::Backend::Options {
  explicit TernBackendOptions(std::chrono::milliseconds timeout) : Options("tern", timeout) {}
  TernBackendOptions(const TernBackendOptions&) = default;
};

class ProcessGroupTern final : public c10d::Backend {
 public:
  // Thread-safety: construction does no communication; operations of one
  // group must be issued in the same order on every rank (c10d's contract).
  ProcessGroupTern(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   std::chrono::milliseconds timeout, std::string group_name);
  ~ProcessGroupTern() override;

  const std::string getBackendName() const override { return "tern"; }
  bool supportsCoalescing() const override { return true; }
  // True once the group has a communicator or is bound to a device (then
  // torch connects it eagerly: init_process_group(device_id=...)), until it
  // is shut down. Thread-safety: any thread.
  bool supportsSplitting() const override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override;

  // Between the two, sends and receives are held and enqueued as one tern
  // group by endCoalescing (collectives run at once); the returned Work
  // covers everything issued in between.
  // Thread-safety: one coalescing block per group at a time.
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // The operations (c10d's semantics; see the file comment for streams and
  // errors). Each validates its tensors (tern, contiguous, this group's
  // device; reductions: a dtype tern reduces), enqueues on the communication
  // stream and returns a Work without waiting.
  // Thread-safety: any thread, but c10d's rule holds: every rank issues the
  // group's operations in the same order, so threads that share a group
  // must order their calls themselves.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  // dist.recv / irecv without a source: tern_comm_recv_any; the Work's
  // sourceRank() waits for the receive and names the sender (group rank).
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void eagerConnectSingleDevice(at::Device device) override;

  // Splitting (torch's split_group, DeviceMesh): every rank of this group
  // calls it with the same sorted `ranks` (ranks of this group); members get
  // a backend whose communicator is split from this group's
  // (tern_comm_split, same core), the others nullptr. Connects this group
  // first if it has no communicator yet (every rank is here, so that is
  // collective too). Thread-safety: collective; no other thread may issue
  // this group's operations meanwhile.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // new_group while torch splits from this (the default) group: members call
  // SplitForNewGroup (from the creator torch_tern.distributed registers),
  // the other ranks PerformNocolorSplit (torch calls it by that name), all in
  // the same order. `group_rank` orders the members. Thread-safety: as split.
  c10::intrusive_ptr<ProcessGroupTern> SplitForNewGroup(
      const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
      std::chrono::milliseconds timeout, const std::string& group_name);
  void PerformNocolorSplit(at::Device device);
  // Communicators split from this group so far.
  int64_t SplitCount() const { return split_count_.load(); }

  // Operations issued on this group (torch reads it for its flight recorder).
  void setSequenceNumberForGroup() override { sequence_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequence_.load(); }
  c10d::ErrorType getError() override;
  // Releases the communicator (waiting for its operations); later operations
  // raise. Thread-safety: any thread, once no operation is being issued.
  void shutdown() override;
  // Aborts the communicator: in-flight operations fail at once on every rank.
  // Thread-safety: any thread, also while another thread waits on a Work.
  void abort() override;

  // "rank/size on tern:<d> core <c> via <transport>" once connected, else
  // "not connected". Thread-safety: any thread.
  std::string Describe();
  // How the communicator was made: "store", "split", or "" (none yet).
  // Thread-safety: any thread.
  std::string Origin();
  // The stream the group's asynchronous operations run on (synchronous ones
  // run on the caller's stream), or none before the communicator exists.
  // Thread-safety: any thread.
  std::optional<c10::Stream> CommunicationStream();

 private:
  struct Launch;  // one operation being enqueued (streams, events, outputs)

  // The communicator for `device`, created (rendezvous through the store)
  // on first use. Throws if the group is bound to another device, was shut
  // down, or its communicator failed.
  std::shared_ptr<CommState> Connect(c10::DeviceIndex device);
  // The device this group's communicator is (or will be) on: the bound
  // device, else the connected one, else the current one.
  c10::DeviceIndex SplitDevice();
  // tern_comm_split of this group's communicator with `color` (or
  // TERN_COMM_SPLIT_NOCOLOR) and `key`. Members get the child's backend,
  // checked to be rank `want_rank` of `want_size`; non-members nullptr.
  c10::intrusive_ptr<ProcessGroupTern> SplitChild(c10::DeviceIndex device, int32_t color,
                                                  int32_t key, int want_rank, int want_size,
                                                  const c10::intrusive_ptr<c10d::Store>& store,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& name);
  // All-gathers each input: outputs[i][rank] receives rank's inputs[i]
  // (allgather's layout; allgather_coalesced's lists are per rank).
  c10::intrusive_ptr<c10d::Work> AllgatherEachInput(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    bool on_current_stream);
  // Whether an operation with torch's `asyncOp` runs on the caller's stream
  // (synchronous, outside a coalescing block) rather than the communication
  // stream. See Launch.
  bool OnCurrentStream(bool async_op);
  c10::DeviceIndex DeviceOf(const std::vector<at::Tensor>& tensors, const char* op);
  // CPU tensors (cpu_staging.h): a staging for operation `op` on this
  // group's device, and the Work of a staged send or receive (kept for the
  // end of a coalescing block when one is open).
  CpuStaging Staging(const char* op);
  c10::intrusive_ptr<c10d::Work> StagedP2P(CpuStaging& staging, c10::intrusive_ptr<c10d::Work> work,
                                           std::vector<at::Tensor>& cpu_tensors);
  // `source`: recvAnysource's slot for the sender's rank, written by the queue.
  c10::intrusive_ptr<c10d::Work> Finish(Launch& launch, c10d::OpType op_type,
                                        std::vector<at::Tensor> outputs, bool host_blocking,
                                        std::shared_ptr<uint32_t> source = nullptr);

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::string group_name_;
  mutable std::mutex mutex_;  // guards state_ creation and the coalescing state
  std::shared_ptr<CommState> state_;
  bool shut_down_ = false;
  std::atomic<int64_t> split_count_{0};
  std::atomic<uint64_t> sequence_{0};

  // Coalescing (torch's _coalescing_manager, batch_isend_irecv): collectives
  // are enqueued at once; sends and receives are kept and enqueued together
  // as one tern group at endCoalescing, so that pairs that send to each
  // other cannot deadlock.
  bool coalescing_ = false;
  struct PendingP2P {
    at::Tensor tensor;
    int peer = 0;
    bool is_send = false;
  };
  std::vector<PendingP2P> pending_p2p_;
  std::vector<c10::intrusive_ptr<c10d::Work>> staged_p2p_;  // their CPU tensors' Works
  std::vector<at::Tensor> coalesced_outputs_;
  std::shared_ptr<c10::Event> coalesced_event_;
};

}  // namespace torch_tern::distributed
