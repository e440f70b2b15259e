// libtern's process-wide state and the objects behind the public handles.
#ifndef TERN_SRC_RUNTIME_RUNTIME_STATE_H_
#define TERN_SRC_RUNTIME_RUNTIME_STATE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status_with_message.h"
#include "driver_shim/driver.h"
#include "src/memory/range_allocator.h"
#include "src/runtime/handle_table.h"
#include "tern/tern.h"

namespace tern {

// A pool of stream-ordered device memory (src/runtime/memory_pool.h).
struct MemoryPoolObject;

struct QueueObject;

struct DeviceObject {
  uint32_t index = 0;  // dense index in this process
  tern_device_t handle = nullptr;
  driver::DeviceStaticInfo info;
  std::unique_ptr<driver::Device> hw;
  std::vector<uint32_t> visible_cores;  // physical core index of each visible core
  uint32_t first_node_core = 0;         // node-wide index of physical core 0

  // Device memory of this process, placed by the sub-allocator.
  std::mutex memory_mutex;
  std::unique_ptr<RangeAllocator> allocator;                   // guarded by memory_mutex
  uint64_t used = 0;                                           // guarded by memory_mutex
  uint64_t peak = 0;                                           // guarded by memory_mutex
  uint64_t used_by_category[TERN_MEMORY_CATEGORY_COUNT] = {};  // guarded by memory_mutex

  std::mutex cores_mutex;
  std::vector<bool> core_open;  // by visible index; guarded by cores_mutex

  // The live queues of this device (tern_buffer_free waits for what they
  // were given before it). A queue leaves the list before its hardware queue
  // is destroyed.
  std::mutex queues_mutex;
  std::vector<std::weak_ptr<QueueObject>> queues;  // guarded by queues_mutex
  // The queue that last took an execution of an executable (compared with
  // the live queues above, never dereferenced): a load readies that one.
  std::atomic<const QueueObject*> last_executing_queue{nullptr};

  // The pool tern_queue_alloc uses when given none; set by tern_init.
  std::shared_ptr<MemoryPoolObject> default_pool;
  tern_memory_pool_t default_pool_handle = nullptr;
};

struct CoreObject {
  DeviceObject* device = nullptr;
  uint32_t index = 0;     // visible index within the device
  uint32_t physical = 0;  // physical index within the device
  std::atomic<uint32_t> queue_count{0};
};

struct BufferObject {
  DeviceObject* device = nullptr;
  uint64_t offset = 0;     // in the device's memory
  uint64_t size = 0;       // as requested
  uint64_t allocated = 0;  // as rounded by the allocator (what is charged)
  tern_memory_category_t category = TERN_MEMORY_TENSORS;
  // Backed by a shareable object of its own (TERN_BUFFER_FLAG_SHAREABLE, or
  // imported): the driver charges it (CreateShareable / ImportShareable) and
  // ReleaseBuffer ends it with ReleaseShareable.
  bool shared = false;
  // The pool of a buffer from tern_queue_alloc (its block returns there);
  // null for tern_buffer_alloc's buffers and the runtime's own allocations.
  std::shared_ptr<MemoryPoolObject> pool;
};

// A queue's scratch block (see QueueObject::scratch): freed with the last
// execution or queue that holds it.
struct QueueScratch {
  explicit QueueScratch(const BufferObject& block) : buffer(block) {}
  QueueScratch(const QueueScratch&) = delete;
  QueueScratch& operator=(const QueueScratch&) = delete;
  ~QueueScratch();  // ReleaseBuffer(buffer)
  BufferObject buffer;
};

struct QueueObject {
  std::shared_ptr<CoreObject> core;
  std::unique_ptr<driver::HwQueue> hw;
  const Timeline* completion = nullptr;  // hw->completion(), which hw keeps alive
  std::string name;
  // The same name, shared with the points recorded here (their error
  // messages are formatted only when needed: a record is on every
  // collective's host path).
  std::shared_ptr<const std::string> shared_name;
  // The scratch memory of this queue's executions. The queue runs one command
  // at a time, so its executions share one block, as large as the largest any
  // of them needed, and each holds it until it completes. Reusing the block
  // keeps its pages mapped: a new block per execution meant new pages for
  // every execution queued behind a running one (on the simulated device a
  // page fault each 4 KiB, a third of a GPT-2 block's time). Given back when
  // the queue is destroyed, or by an allocation that finds the device full
  // while no execution holds it (ReleaseIdleQueueScratch).
  std::mutex scratch_mutex;
  std::shared_ptr<QueueScratch> scratch;  // guarded by scratch_mutex
};

// One recording of an event: a point on a queue's timeline and the device
// time at which it was reached.
struct EventPoint {
  std::shared_ptr<const Timeline> timeline;
  uint64_t sequence = 0;
  std::atomic<uint64_t> timestamp_ns{0};
  std::shared_ptr<const std::string> queue_name;  // the queue it was recorded on

  // "the event recorded as command 7 of queue 'q'", for error messages.
  std::string Description() const;
};

struct EventObject {
  std::mutex mutex;
  std::shared_ptr<EventPoint> point;  // guarded by mutex; null until recorded
};

// A loaded executable (defined in src/runtime/api_executable.cc).
struct ExecutableObject;
// A named I/O set of an executable's function (api_executable.cc).
struct IoSetObject;
// A recorded command sequence (api_graph.cc).
struct GraphObject;
// One rank of a communicator (defined in collectives/).
struct CommObject;

class Runtime {
 public:
  std::unique_ptr<driver::Driver> driver;
  std::vector<std::unique_ptr<DeviceObject>> devices;
  uint64_t exec_timeout_ns = 0;

  HandleTable<DeviceObject> device_table{HandleKind::kDevice};  // non-owning entries
  HandleTable<CoreObject> core_table{HandleKind::kCore};
  HandleTable<BufferObject> buffer_table{HandleKind::kBuffer};
  HandleTable<QueueObject> queue_table{HandleKind::kQueue};
  HandleTable<EventObject> event_table{HandleKind::kEvent};
  HandleTable<ExecutableObject> executable_table{HandleKind::kExecutable};
  HandleTable<IoSetObject> io_set_table{HandleKind::kIoSet};
  HandleTable<MemoryPoolObject> memory_pool_table{HandleKind::kMemoryPool};
  HandleTable<GraphObject> graph_table{HandleKind::kGraph};
  // Communicators go with the runtime object, after its queues drained.
  HandleTable<CommObject> comm_table{HandleKind::kComm};

  std::mutex host_mutex;
  std::vector<std::pair<void*, uint64_t>> host_allocations;  // guarded by host_mutex
  // tern_host_register's ranges: the caller's pointer -> the page-widened
  // range locked for it.
  struct HostRegistration {
    void* ptr;
    uint64_t size;
    uintptr_t locked_begin;
    uintptr_t locked_end;
  };
  std::vector<HostRegistration> host_registrations;  // guarded by host_mutex
};

// Records `status` as the calling thread's last error (when it failed) and
// returns its code: the tail of every public function.
tern_status_t Report(const Status& status);

// The live runtime, or an error saying why there is none (not initialized,
// or this is a forked child). Thread-safety: any thread.
Status GetRuntime(Runtime** out_runtime);

// Handle <-> object helpers; each fails with a message naming the argument.
Status LookupDevice(Runtime* rt, tern_device_t handle, const char* arg, DeviceObject** out);
Status LookupCore(Runtime* rt, tern_core_t handle, const char* arg,
                  std::shared_ptr<CoreObject>* out);
Status LookupBuffer(Runtime* rt, tern_buffer_t handle, const char* arg,
                    std::shared_ptr<BufferObject>* out);
Status LookupQueue(Runtime* rt, tern_queue_t handle, const char* arg,
                   std::shared_ptr<QueueObject>* out);
// Like LookupQueue, without a reference or a lock: the queue calls, whose
// contract forbids destroying the queue while another thread uses it (see
// tern_queue_destroy), and which run on every submission and wait.
Status PeekQueue(Runtime* rt, tern_queue_t handle, const char* arg, QueueObject** out);
Status LookupEvent(Runtime* rt, tern_event_t handle, const char* arg,
                   std::shared_ptr<EventObject>* out);

// The command that waits for `event`'s latest recording, as of now (it waits
// for nothing when the event was never recorded): what
// tern_queue_wait_event submits and what a graph launch resolves its waits to.
driver::Command MakeEventWaitCommand(EventObject& event);

// Ends a queue that has left the queue table and its device's list: drains
// and destroys its hardware queue, frees its scratch block (its executions
// have completed, whoever still holds the object) and gives its core's
// queue count back. What tern_queue_destroy and runtime shutdown do.
void CloseQueue(QueueObject& queue);

// Waits until every command submitted to any queue of `device` before this
// call has completed (succeeded, failed or been aborted): what
// tern_buffer_free does before the memory can serve another allocation, so
// that no command still in flight reads or writes it.
void WaitForDeviceQueues(DeviceObject* device);

// Resolves [offset, offset + size) of `buffer` to device memory for a
// command: a live buffer, the range inside it and, when `required` is set, a
// buffer of that device; else INVALID_ARGUMENT: "<arg> lives on device 1 but
// <place> device 0; <remedy> of device 1, or copy device-to-device first".
Status ResolveDeviceRange(Runtime* rt, tern_buffer_t buffer, uint64_t offset, uint64_t size,
                          const char* arg, const DeviceObject* required, const char* place,
                          const char* remedy, driver::MemoryRef* out);

// Checks that [offset, offset + size) lies inside `buffer`.
Status CheckBufferRange(const BufferObject& buffer, uint64_t offset, uint64_t size,
                        const char* arg);

// The error for a handle table that holds the most live objects it can
// (millions: a leak in the caller, in practice). `what`: "buffers".
Status HandleTableFull(const char* what);

// Checks a caller's struct_size against the smallest size this version accepts.
Status CheckStructSize(uint32_t struct_size, size_t minimum, const char* type);

// Formats a byte count for messages: "8.00 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);

const char* MemoryCategoryName(tern_memory_category_t category);

// Frees a buffer's memory and accounting (shared by tern_buffer_free and shutdown).
void ReleaseBuffer(const BufferObject& buffer);

// Frees the scratch blocks of `dev`'s queues that no execution holds; true
// when it freed any. What an allocation that finds the device full does
// before it gives up.
bool ReleaseIdleQueueScratch(DeviceObject* dev);

// Places `size` bytes of device memory of `category` (alignment 0: the
// device minimum) and charges them: what tern_buffer_alloc does, for
// allocations the runtime makes itself (executable constants, scratch). Fills
// `out` (device, offset, size, allocated, category); free with ReleaseBuffer.
// Fails with an out-of-memory report.
Status AllocateDeviceMemory(DeviceObject* dev, uint64_t size, uint64_t alignment,
                            tern_memory_category_t category, BufferObject* out);

// What AllocateDeviceMemory does, with `charge(offset, allocated)` in place
// of the node-wide charge (ReserveMemory) once the block is placed; a failed
// charge frees the block (OUT_OF_MEMORY becomes the full report).
using ChargeFunction = std::function<Status(uint64_t offset, uint64_t allocated)>;
Status PlaceDeviceMemory(DeviceObject* dev, uint64_t size, uint64_t alignment,
                         tern_memory_category_t category, const ChargeFunction& charge,
                         BufferObject* out);

// AllocateDeviceMemory for a shareable buffer (TERN_BUFFER_FLAG_SHAREABLE):
// whole pages, backed by an object of its own that tern_buffer_export hands
// out (api_memory_share.cc).
Status AllocateSharedDeviceMemory(DeviceObject* dev, uint64_t size, uint64_t alignment,
                                  tern_memory_category_t category, BufferObject* out);

// Charges `bytes` of `category` to the device without placing them in its
// address range (constants used in place from a file mapping), and undoes it.
Status ChargeDeviceMemory(DeviceObject* dev, uint64_t bytes, tern_memory_category_t category);
void UnchargeDeviceMemory(DeviceObject* dev, uint64_t bytes, tern_memory_category_t category);

}  // namespace tern

#endif  // TERN_SRC_RUNTIME_RUNTIME_STATE_H_
