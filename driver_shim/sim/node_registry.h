// The node registry of the simulated device: state that every process on the
// node shares through one file, /dev/shm/tern-sim-<node_name>, mapped
// MAP_SHARED. A node belongs to the user who created it: the file is created
// with O_EXCL and mode 0600, and a file that another user owns, that others
// may open, or that is not a plain file is refused (docs/sim.md, "Security
// model of the simulated node"). It holds
//   - core ownership: exactly one process owns a core at a time;
//   - device-memory (HBM) accounting: each process counts its memory, by
//     device and category, only in its own slot; node usage is the sum over
//     slots, so a process killed at any instant leaves nothing to reconcile;
//   - live counters (per core: commands, executions, busy time, errors by class;
//     per device: ECC events) that tools read without owning anything.
//
// Liveness comes from the kernel, never from pids: each process slot and each
// core is guarded by an open-file-description (OFD) lock on one byte of the
// file, past the end of the data. The kernel drops those locks when the owning
// process dies, SIGKILL included, so a dead process never keeps a core, and
// whoever next needs its memory or its slot "reaps" it: takes the slot's lock
// and zeroes the dead process's slot.
//
// Fork: the file descriptor is O_CLOEXEC, so exec drops it. A child that
// forks without exec must call AfterForkInChild(); until it does, its copy of
// the descriptor keeps the parent's locks alive even after the parent dies.
#ifndef TERN_DRIVER_SHIM_SIM_NODE_REGISTRY_H_
#define TERN_DRIVER_SHIM_SIM_NODE_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/status_with_message.h"
#include "tern/telemetry.h"
#include "tern/types.h"

namespace tern::sim {

struct SharedNodeState;  // the layout of the shared file; node_registry.cc

// Per-core live counters. They live in the shared mapping: the core's owner
// adds to them and any process reads them. They only grow.
struct CoreCounters {
  std::atomic<uint64_t> commands;                        // commands completed, any kind
  std::atomic<uint64_t> executions;                      // compute commands completed
  std::atomic<uint64_t> busy_ns;                         // time spent running commands
  std::atomic<uint64_t> errors[TERN_ERROR_CLASS_COUNT];  // failed commands by class
  // Commands by run time (TERN_TELEMETRY_LATENCY_BUCKETS in telemetry.h).
  std::atomic<uint64_t> latency[TERN_TELEMETRY_LATENCY_BUCKETS];

  // Counts one command that ran `ns` nanoseconds in its latency bucket.
  void CountLatency(uint64_t ns);
};

class NodeRegistry {
 public:
  static constexpr uint32_t kMaxDevices = 16;
  static constexpr uint32_t kMaxCoresPerDevice = TERN_TELEMETRY_MAX_CORES;
  static constexpr uint32_t kMaxProcesses = TERN_TELEMETRY_MAX_PROCESSES;
  static constexpr uint64_t kMaxHbmBytes = uint64_t{1} << 40;  // per device, as TERN_SIM_TOPOLOGY
  // Shared allocations (ReserveShared) one process may hold at once.
  static constexpr uint32_t kMaxSharedPerProcess = 256;

  struct Topology {
    uint32_t device_count = 0;      // 1..kMaxDevices
    uint32_t cores_per_device = 0;  // 1..kMaxCoresPerDevice
    uint64_t hbm_bytes = 0;         // per device, 1..kMaxHbmBytes
    bool operator==(const Topology&) const = default;
  };

  enum class Role {
    kParticipant,  // claims a process slot: may own cores and reserve memory
    kObserver,     // claims nothing (admin tools): reads counters, may reap dead processes
  };

  // Opens (creating and formatting when needed) the state of node
  // `node_name` ([A-Za-z0-9._-], 1..64 characters). A file that this user
  // did not create, that others may open (mode wider than 0600), or that is
  // not a plain file fails with TERN_ERROR_FAILED_PRECONDITION saying what
  // to remove. When the file holds another layout or topology, or a header
  // outside the limits, it is reformatted if no process is live, and the call
  // fails with TERN_ERROR_INCOMPATIBLE naming the live processes otherwise; a
  // file truncated under live processes is grown back (so they do not die of
  // SIGBUS) and the call fails with TERN_ERROR_FAILED_PRECONDITION. Slots of
  // dead processes, and garbage in free slots, are cleared. A participant
  // claims one of kMaxProcesses slots (TERN_ERROR_UNAVAILABLE when all are
  // live). An observer may pass an all-zero `topology` to adopt whatever the
  // file holds; it then fails with TERN_ERROR_UNAVAILABLE when no process has
  // created the node yet.
  // Thread-safety: safe from any thread; waits while another process opens
  // the same node (a short critical section), at most 5 s
  // (TERN_SIM_NODE_LOCK_TIMEOUT_MS), then fails with TERN_ERROR_TIMEOUT naming
  // the processes that have the file open.
  static Status Open(const std::string& node_name, const Topology& topology, Role role,
                     std::unique_ptr<NodeRegistry>* out);

  // Unlinks the node's file (tests and admin cleanup). Processes that still
  // have it open keep using the old file; a later Open creates a new one.
  // OK when the file does not exist.
  // Thread-safety: safe from any thread.
  static Status RemoveNode(const std::string& node_name);

  // Releases this process's cores, memory and slot. Does not unlink the file.
  ~NodeRegistry();
  NodeRegistry(const NodeRegistry&) = delete;
  NodeRegistry& operator=(const NodeRegistry&) = delete;

  // Takes exclusive node-wide ownership of `core` of `device`. Fails with
  // TERN_ERROR_BUSY naming the owner's pid and command when another process
  // (or another NodeRegistry of this process) holds it, and with
  // TERN_ERROR_FAILED_PRECONDITION when this registry already holds it or is
  // an observer. Thread-safety: safe from any thread; never blocks on other
  // processes.
  Status AcquireCore(uint32_t device, uint32_t core);
  // Gives up a core taken with AcquireCore(); does nothing if not owned.
  // Thread-safety: safe from any thread.
  void ReleaseCore(uint32_t device, uint32_t core);

  // Charges `bytes` of `category` on `device` to this process, failing with
  // TERN_ERROR_OUT_OF_MEMORY (requested, node usage and capacity in the
  // message) when the node-wide capacity would be exceeded. Dead processes
  // are reaped before giving up. Zero bytes is a no-op. Only this process's
  // slot is written, so the accounting stays exact whenever it is killed.
  // Thread-safety: safe from any thread; takes no lock unless it must reap.
  Status ReserveMemory(uint32_t device, uint64_t bytes, tern_memory_category_t category);
  // Returns bytes charged with ReserveMemory(). Never releases more than this
  // process holds in `category`. Thread-safety: safe from any thread; lock-free.
  void ReleaseMemory(uint32_t device, uint64_t bytes, tern_memory_category_t category);
  // Charges a shared allocation: `bytes` of `category` on `device` that
  // several processes may map (an exported buffer and its imports), named
  // node-wide by `id` (not 0; the same id in every process that holds it).
  // Each holder lists the id in its own slot, and the node's sum counts each
  // id once, so the memory stays charged while any live process holds it and
  // leaves the sum when the last holder releases it or is reaped (SIGKILL
  // included). Holding an id that a live process already holds costs no
  // capacity; otherwise fails with TERN_ERROR_OUT_OF_MEMORY like
  // ReserveMemory(). Fails with TERN_ERROR_UNAVAILABLE when this process holds
  // kMaxSharedPerProcess shared allocations already. A process may hold the
  // same id more than once (each ReleaseShared() drops one).
  // Thread-safety: safe from any thread.
  Status ReserveShared(uint32_t device, uint64_t id, uint64_t bytes,
                       tern_memory_category_t category);
  // Drops one hold of `id` taken with ReserveShared(); nothing when this
  // process holds none. Thread-safety: safe from any thread.
  void ReleaseShared(uint32_t device, uint64_t id);

  // Node-wide bytes in use on `device` by every process; fills `by_category`
  // (TERN_MEMORY_CATEGORY_COUNT entries) when not null. 0 for a bad device.
  // Thread-safety: safe from any thread; lock-free.
  uint64_t NodeMemoryUsed(uint32_t device, uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) const;

  // Frees the slots of dead processes (and clears garbage in free slots):
  // their memory leaves the node's sum and their core records are cleared.
  // Safe when several processes reap at once (only the holder of a slot's
  // lock reaps it).
  // Thread-safety: safe from any thread; never blocks on other processes.
  void ReapDeadProcesses();

  // The live counters of a core, in shared memory. `device` and `core` must
  // be in range; out-of-range indices (and calls after fork) get a private
  // sink so that a bug cannot corrupt another core's counters.
  // Thread-safety: safe from any thread; the counters are atomics.
  CoreCounters& core_counters(uint32_t device, uint32_t core);
  // Counts one ECC event on `device`. Thread-safety: safe from any thread.
  void CountEcc(uint32_t device, bool uncorrected);

  // Fills `*out` (every field; struct_size is set to sizeof) from the shared
  // state: memory, ECC and core counters, core owners (only where the core's
  // lock is really held) and the live processes that use the device. Dead
  // processes are reaped first. Fails with TERN_ERROR_INCOMPATIBLE when the
  // node was reformatted since this (observer) registry opened it.
  // Thread-safety: safe from any thread; never blocks on other processes.
  Status Snapshot(uint32_t device, tern_device_telemetry_t* out) const;

  // Call in a child right after fork(), before anything else uses this
  // registry: closes the child's copy of the descriptor without unlocking
  // anything the parent holds, and makes every later call fail with
  // TERN_ERROR_FORKED (void calls do nothing). The destructor then only
  // unmaps. Thread-safety: call from the forking thread while the child has
  // no other threads.
  void AfterForkInChild();

  const std::string& node_name() const { return node_name_; }
  const std::string& path() const { return path_; }
  const Topology& topology() const { return topology_; }
  Role role() const { return role_; }

 private:
  NodeRegistry(std::string node_name, std::string path, Role role);

  Status AttachLocked(const Topology& wanted, bool adopt);
  Status MapLocked();
  Status FormatLocked(const Topology& topology, uint64_t file_size);
  Status ClaimSlotLocked();
  Status IncompatibleLocked(const Topology& wanted, bool layout_known) const;
  bool SlotIsClear(uint32_t slot) const;
  Status OutOfMemoryError(uint32_t device, uint64_t bytes, tern_memory_category_t category) const;
  void ReapImpl() const;
  void ReapSlotLocked(uint32_t slot) const;
  void ReleaseCoreLocked(uint32_t device, uint32_t core);  // needs mu_
  int32_t CoreOwner(uint32_t device, uint32_t core, char command[32]) const;
  Status CheckUsable(const char* what) const;
  Status CheckIndex(uint32_t device, uint32_t core, bool check_core) const;

  const std::string node_name_;
  const std::string path_;
  const Role role_;
  Topology topology_;
  uint64_t generation_ = 0;  // the format generation this registry attached to
  int fd_ = -1;
  int32_t pid_ = 0;
  std::string command_;
  SharedNodeState* state_ = nullptr;  // the shared mapping
  int32_t slot_ = -1;                 // this process's slot; -1 for observers
  std::atomic<bool> forked_{false};

  // OFD locks are per open file description: a second lock through our own
  // descriptor succeeds silently, so ownership is also tracked here.
  mutable std::mutex mu_;
  uint32_t owned_cores_[kMaxDevices] = {};  // GUARDED_BY(mu_); bit c: core c owned

  // Serializes this process's changes to its shared holds (its slot's
  // `shared` entries); readers in any process need no lock.
  mutable std::mutex shared_mu_;

  // Serializes this process's reapers: they share one descriptor, so the
  // kernel lock alone would let two threads reap the same slot.
  mutable std::mutex reap_mu_;

  CoreCounters sink_counters_{};
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_NODE_REGISTRY_H_
