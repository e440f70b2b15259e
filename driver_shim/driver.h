// The driver shim: everything device-specific that libtern needs, behind one
// interface. libtern (src/) talks to a device only through these classes and
// never knows which backend it runs on. Backends:
//   sim/   the simulated device (default): a functional model in host memory
//   null/  a skeleton that reports UNAVAILABLE / UNIMPLEMENTED everywhere;
//          copy it to start a backend for real hardware.
// TERN_DRIVER (or tern_init_options_t.driver) selects one.
//
// The shape follows a kernel-driver user-space library: enumerate devices,
// open a device, take per-core ownership, account device memory by category,
// submit copy and compute commands to hardware queues, learn of completions
// through a timeline, read live counters, inject faults.
//
// Ownership of memory layout: the device exposes one contiguous device
// address range (its HBM); libtern's sub-allocator places allocations in it
// and the driver charges their bytes to this process node-wide through
// ReserveMemory()/ReleaseMemory() (the way a kernel driver charges pages).
#ifndef TERN_DRIVER_SHIM_DRIVER_H_
#define TERN_DRIVER_SHIM_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status_with_message.h"
#include "common/timeline.h"
#include "program.h"
#include "tern/debug.h"
#include "tern/telemetry.h"
#include "tern/types.h"

namespace tern::driver {

struct DeviceStaticInfo {
  uint32_t physical_index = 0;
  uint32_t core_count = 0;
  uint64_t memory_bytes = 0;
  uint64_t memory_alignment = 64;
  int32_t numa_node = -1;
  std::string name;
  std::string cpu_affinity;  // CPU list near the device, "0-1"
  std::string uuid;          // stable identity, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string bus_id;        // PCI address on hardware, "sim:<node>:<index>" on the simulator
  std::string driver_version;
};

class Device;

// One end of a copy: host memory, or an offset in some device's memory.
struct MemoryRef {
  void* host = nullptr;      // set for host memory
  Device* device = nullptr;  // set for device memory
  uint64_t offset = 0;       // offset in the device's memory
};

enum class CommandKind : uint8_t {
  kNop,
  kCopy,          // size bytes from src to dst
  kFill,          // size bytes of dst with the 32-bit pattern
  kHostFunction,  // host_function(host_user_data, status)
  kWait,          // block until details->wait_timeline reaches wait_value
  kTimestamp,     // store the device clock (ns) into *timestamp_out
  kExecute,       // run details->program->functions[function] on the bound segments
  // Runs host_task(host_user_data, nullptr) on the queue's thread, in order;
  // its status is the command's (a failure halts the queue like any failed
  // command). For work the host does on the device's behalf, such as a
  // collective's transfers. On a queue halted by an earlier failure it is
  // skipped, not run.
  kHostTask,
  // Runs a recorded sequence of commands (details->launch: a graph launch) in
  // order, as this one command of the queue: the submitter crosses to the
  // engine once for the whole sequence. The sequence holds kNop, kCopy,
  // kFill, kExecute, kHostFunction and kWait commands. When details->
  // wait_timeline is set, the engine first waits until it reaches wait_value
  // (the previous launch of the same sequence; its failure does not matter).
  // When a command of the sequence fails, the rest are skipped (host
  // functions still run, with the error) and the sequence command fails
  // with a message naming the failing command's index.
  kSequence,
};

const char* CommandKindName(CommandKind kind);

struct SequenceLaunch;

// "the event recorded as command 7 of queue 'q'": how error messages name the
// point of a queue's timeline that a wait is for (`queue_name` may be null).
// Thread-safety: any thread.
std::string DescribeEventRecord(uint64_t sequence, const std::string* queue_name);

// The parts of a command that only waits, executions and sequences need,
// kept out of line so that the common commands (copies, fills, event records,
// callbacks) fit in two cache lines: a queue's engine reads each command from
// the submitting thread's cache, one line at a time.
struct CommandDetails {
  // kWait: the timeline to wait on and the value to wait for, and the name
  // of the queue whose timeline it is (error messages).
  std::shared_ptr<const Timeline> wait_timeline;
  std::shared_ptr<const std::string> wait_queue_name;
  uint64_t wait_value = 0;
  // kExecute: the program and where each segment starts. Constants are host
  // memory (a file mapping) or device memory; scratch is device memory.
  std::shared_ptr<const Program> program;
  uint32_t function = 0;
  std::vector<MemoryRef> inputs;
  std::vector<MemoryRef> outputs;
  MemoryRef constants;
  MemoryRef scratch;
  // kSequence: what to run (defined below Command).
  std::shared_ptr<const SequenceLaunch> launch;
  // Keeps alive what `constants` points into (an executable's constants);
  // released with the other references when the command completes.
  std::shared_ptr<const void> constants_owner;

  // Back to a new object's state: drops every reference, keeps the vectors'
  // and the string's capacity, so that a completed command's details can
  // serve a later one (RecycleCommandDetails).
  void Clear();
};

// Details for a new command: one this thread recycled, else a new one.
// Why: the submitting thread allocates a command's details and the queue
// thread used to free them, so every execution met the allocator's lock from
// both sides; recycled on the submitting side, they cost no allocation.
std::unique_ptr<CommandDetails> NewCommandDetails();
// Clears `details` and keeps it for this thread's NewCommandDetails (a few
// dozen at most; beyond that it is freed). A queue calls it where a new
// command takes the place of a completed one.
void RecycleCommandDetails(std::unique_ptr<CommandDetails> details);

struct Command {
  // Field order matters: in a queue's ring a command follows an 8-byte
  // sequence number, so the first line holds these four fields and dst, and
  // the engine touches the second line only for commands that use its fields.
  CommandKind kind = CommandKind::kNop;
  uint32_t pattern = 0;
  std::unique_ptr<CommandDetails> details;  // kWait, kExecute
  std::shared_ptr<void> keep_alive;         // released when the command completes
  MemoryRef dst;
  MemoryRef src;
  uint64_t size = 0;
  void (*host_function)(void* user_data, tern_status_t status) = nullptr;
  void* host_user_data = nullptr;
  std::atomic<uint64_t>* timestamp_out = nullptr;
  // kHostTask, in the command itself (no allocation: collectives enqueue one
  // per operation): with `name` NULL runs the task; with `name` set stores
  // the task's name for errors and traces instead, and runs nothing.
  Status (*host_task)(void* user_data, std::string* name) = nullptr;

  // The details, created on first use.
  CommandDetails& Details() {
    if (!details) details = NewCommandDetails();
    return *details;
  }
};

// A recorded sequence of commands (a graph), immutable once recorded and
// shared by every launch of it that is in flight.
struct CommandSequence {
  std::string name;  // for errors and traces: "graph 'g'"
  std::vector<Command> commands;
};

// One launch of a sequence: the recorded commands, and the ones this launch
// runs instead (new bindings, event waits resolved at launch), ascending by
// index, each index at most once.
struct SequenceLaunch {
  std::shared_ptr<const CommandSequence> sequence;
  std::vector<std::pair<uint32_t, Command>> replacements;
};

// A hardware queue: executes commands in submission order on one core.
// Command n (from 1) signals completion() to n when done, whether it
// succeeded, failed or was aborted. When a command fails, the queue records
// the failure on completion() (Timeline::Fail) and completes every later
// command as TERN_ERROR_ABORTED (host functions still run, with the error)
// until ClearError().
class HwQueue {
 public:
  virtual ~HwQueue() = default;
  // Appends `command`; stores its sequence number in `*out_sequence`.
  // Thread-safety: any number of concurrent submitters.
  virtual Status Submit(Command command, uint64_t* out_sequence) = 0;
  // Number of commands submitted so far (the last sequence number).
  virtual uint64_t submitted() const = 0;
  // The completion timeline; its value is the last completed sequence. Shared
  // so that events can outlive the queue.
  virtual std::shared_ptr<const Timeline> completion() const = 0;
  // Ends the current error epoch: commands submitted from now on run.
  virtual void ClearError() = 0;
  // Called by a host thread about to wait for command `target`: runs the
  // queue's pending commands up to `target` on the calling thread, if the
  // queue's own engine is not running commands and for as long as they are
  // ones a host thread may run; returns when it cannot go on (the wait then
  // waits as always). Queues whose engine is hardware do nothing.
  // Thread-safety: any thread; not from a host function of this queue.
  virtual void RunUntil(uint64_t target) { (void)target; }
  // A hint that commands are likely to come soon (an executable was just
  // loaded for this queue's device): a queue whose engine sleeps when idle
  // may get it ready, so that the next submission does not pay to wake it.
  // Queues with nothing to prepare do nothing.
  // Thread-safety: any thread.
  virtual void ExpectWork() {}
};

// An open device. Thread-safety: every method may be called concurrently.
class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceStaticInfo& info() const = 0;

  // Takes exclusive node-wide ownership of a core. Fails with BUSY naming the
  // owner's pid and command when another process holds it.
  virtual Status OpenCore(uint32_t core) = 0;
  virtual void CloseCore(uint32_t core) = 0;

  // Device address of offset 0 of this device's memory: what users see.
  virtual uint64_t device_base() const = 0;
  // Charges `bytes` of `category` to this process, failing with
  // OUT_OF_MEMORY if the node's capacity would be exceeded.
  virtual Status ReserveMemory(uint64_t bytes, tern_memory_category_t category) = 0;
  virtual void ReleaseMemory(uint64_t bytes, tern_memory_category_t category) = 0;
  // Node-wide usage (bytes, all processes), for statistics and OOM reports.
  virtual uint64_t NodeMemoryUsed(uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) const = 0;
  // Tells the device an allocation of `category` ended: drop any poison, and
  // backing pages unless the category's memory is about to be used again
  // (an execution's scratch: the next execution gets the same block).
  virtual void MemoryFreed(uint64_t offset, uint64_t size, tern_memory_category_t category) = 0;

  // Creates a hardware queue on an open core.
  virtual Status CreateQueue(uint32_t core, const std::string& name,
                             std::unique_ptr<HwQueue>* out_queue) = 0;
  // Called once per loaded program, before its first execution and before
  // the program is shared: does what the backend would otherwise do at the
  // first execution (the simulated device makes its oneDNN primitives), and
  // may leave per-instruction state in Instruction::prepared (the simulated
  // device lays constant matmul weights out for its kernels). `constants`
  // is where the program's constants lie, already in place; every execution
  // of the program reads those same constants. Best effort: what it cannot do
  // is left for the execution, which reports any error.
  virtual void PrepareProgram(Program& program, const MemoryRef& constants) {
    (void)program;
    (void)constants;
  }
  // Makes the engines' first touch of device memory [offset, offset + bytes)
  // cost what a later one does. A real device's memory is always there; the
  // simulated device's pages are mapped into its engines' view at the first
  // touch (several microseconds each on a virtual machine), which would land
  // on an executable's first execution. Cheap for a range it mapped before
  // (no system call). Best effort; a no-op by default.
  virtual void PrefaultMemory(uint64_t offset, uint64_t bytes) {
    (void)offset;
    (void)bytes;
  }
  // Runs a copy or fill at once on the calling thread (the internal DMA path).
  virtual Status ExecuteSync(const Command& command) = 0;
  // The host address through which the engines reach device memory
  // [offset, offset + size), for work the host does on the device's behalf
  // (a collective's transfers, registration with a network provider); it
  // stays valid while the device is open. nullptr when the backend has no
  // such view or the range is outside the memory.
  virtual void* EngineAddress(uint64_t offset, uint64_t size) const {
    (void)offset;
    (void)size;
    return nullptr;
  }
  // A file descriptor of this process through which other processes of the
  // host can map this device's memory (opening /proc/<pid>/fd/<fd>); offsets
  // in the file are device-memory offsets. For peer-to-peer transfers of
  // collectives, the way a real device would export a dma-buf. -1 when the
  // backend has none.
  virtual int SharedMemoryFd() const { return -1; }

  // --- Memory shared between processes (tern_buffer_export / _import) ----
  // A shareable range is backed by an object of its own (a memfd on the
  // simulator, a dma-buf on hardware) placed at the range in this device's
  // memory: exporting it hands out that object only, never the rest of the
  // device's memory. The backend charges shareable memory node-wide itself
  // (instead of ReserveMemory): once, however many processes hold it, for as
  // long as any live process does. Ranges start and end on kShareGranule
  // boundaries. The defaults fail with TERN_ERROR_UNIMPLEMENTED.
  static constexpr uint64_t kShareGranule = 4096;

  // What an exported object holds, read from its descriptor.
  struct SharedMemoryDesc {
    uint64_t size = 0;   // bytes the exporter asked for
    uint64_t bytes = 0;  // bytes of the object (size rounded up to kShareGranule)
    tern_memory_category_t category = TERN_MEMORY_TENSORS;
    uint64_t id = 0;  // names the object node-wide, for the accounting
  };

  // Backs [offset, offset + bytes) with a new shareable object for a buffer
  // of `size` bytes of `category`, and charges it to this process.
  virtual Status CreateShareable(uint64_t offset, uint64_t bytes, uint64_t size,
                                 tern_memory_category_t category) {
    (void)offset;
    (void)bytes;
    (void)size;
    (void)category;
    return Unshareable();
  }
  // A new descriptor (close-on-exec, the caller's to close) of the object
  // at `offset` (made by CreateShareable or ImportShareable).
  virtual Status ExportShareable(uint64_t offset, int* out_fd) {
    (void)offset;
    *out_fd = -1;
    return Unshareable();
  }
  // Checks that `fd` is an exported object of this device, intact, and
  // describes it. Fails with TERN_ERROR_INVALID_ARGUMENT saying what is wrong.
  virtual Status InspectShareable(int fd, SharedMemoryDesc* out_desc) {
    (void)fd;
    *out_desc = SharedMemoryDesc{};
    return Unshareable();
  }
  // Maps the object of `fd` (as InspectShareable described it) at
  // [offset, offset + desc.bytes), keeping a descriptor of its own, and
  // charges it to this process as a holder.
  virtual Status ImportShareable(int fd, uint64_t offset, const SharedMemoryDesc& desc) {
    (void)fd;
    (void)offset;
    (void)desc;
    return Unshareable();
  }
  // Ends this process's use of the object at `offset`: the range is device
  // memory of its own again, and this process stops holding the object.
  virtual void ReleaseShareable(uint64_t offset) { (void)offset; }

  virtual Status GetTelemetry(tern_device_telemetry_t* out) const = 0;

  struct Fault {
    tern_fault_kind_t kind;
    uint32_t core = 0;
    bool has_range = false;
    uint64_t offset = 0;  // device memory range for a buffer fault
    uint64_t size = 0;
    uint64_t after_commands = 0;
  };
  virtual Status InjectFault(const Fault& fault) = 0;

 protected:
  static Status Unshareable() {
    return MakeStatus(TERN_ERROR_UNIMPLEMENTED,
                      "this driver backend cannot share device memory between processes "
                      "(tern_buffer_export / tern_buffer_import); use the simulated device "
                      "(TERN_DRIVER=sim), or copy through host memory");
  }
};

struct DriverOptions {
  // A command running longer than this fails with TERN_ERROR_EXEC_TIMEOUT.
  uint64_t exec_timeout_ns = 30ull * 1000000000ull;
};

class Driver {
 public:
  virtual ~Driver() = default;
  virtual const char* name() const = 0;
  virtual Status Enumerate(std::vector<DeviceStaticInfo>* out_devices) = 0;
  virtual Status OpenDevice(uint32_t physical_index, std::unique_ptr<Device>* out_device) = 0;
  // Called in a child process right after fork(): drop whatever the child
  // must not share with its parent, without touching the parent's state.
  virtual void AfterForkInChild() {}
};

// Creates the backend called `name` ("sim", "null").
Status CreateDriver(const std::string& name, const DriverOptions& options,
                    std::unique_ptr<Driver>* out_driver);

}  // namespace tern::driver

#endif  // TERN_DRIVER_SHIM_DRIVER_H_
