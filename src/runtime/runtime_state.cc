// Runtime lifetime: tern_init / tern_shutdown, fork detection, visible cores,
// handle lookups.
#include "src/runtime/runtime_state.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <pthread.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <set>

#include "common/logging.h"
#include "common/trace.h"
#include "src/runtime/api_checks.h"
#include "src/runtime/memory_pool.h"

namespace tern {
namespace {

std::mutex g_lifetime_mutex;
int g_refcount = 0;                        // guarded by g_lifetime_mutex
Runtime* g_runtime_owned = nullptr;        // guarded by g_lifetime_mutex
std::atomic<Runtime*> g_runtime{nullptr};  // what API calls read
std::atomic<bool> g_forked{false};

void ChildAfterFork() {
  // The child has one thread and a copy of our state whose engine threads do
  // not exist; it must not touch it. Every call now fails with FORKED.
  Runtime* runtime = g_runtime.load();
  if (runtime == nullptr) return;
  g_forked.store(true);
  if (runtime->driver) runtime->driver->AfterForkInChild();
}

Status ParseExecTimeout(uint64_t* out_ns) {
  *out_ns = 30ull * 1000000000ull;
  const char* text = std::getenv("TERN_EXEC_TIMEOUT");
  if (text == nullptr || *text == '\0') return OkStatus();
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 1e6) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "TERN_EXEC_TIMEOUT='{}' is not a number of seconds > 0 (e.g. 30 or 0.5)",
                      text);
  }
  *out_ns = static_cast<uint64_t>(std::llround(seconds * 1e9));
  return OkStatus();
}

// Parses "0,2,4-7" into node-wide core indices, each < total.
Status ParseVisibleCores(const char* text, uint32_t total, std::set<uint32_t>* out) {
  const std::string hint = fmt::format(
      "write TERN_VISIBLE_CORES as a list of node-wide core indices and ranges, e.g. '0', '0-3' or "
      "'0,2,5-7'; this node has {} cores (0-{})",
      total, total - 1);
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (part.empty()) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_VISIBLE_CORES='{}' has an empty item; {}", text, hint);
    }
    uint32_t first = 0, last = 0;
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    if (ends.size() == 1 && absl::SimpleAtoi(ends[0], &first)) {
      last = first;
    } else if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &first) ||
               !absl::SimpleAtoi(ends[1], &last) || last < first) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_VISIBLE_CORES='{}': cannot read '{}'; {}", text, std::string(part),
                        hint);
    }
    if (last >= total) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_VISIBLE_CORES='{}' names core {} which does not exist; {}", text,
                        last, hint);
    }
    for (uint32_t core = first; core <= last; ++core) out->insert(core);
  }
  return OkStatus();
}

Status CreateRuntime(const tern_init_options_t* options, std::unique_ptr<Runtime>* out) {
  auto runtime = std::make_unique<Runtime>();
  std::string driver_name = "sim";
  if (const char* env = std::getenv("TERN_DRIVER"); env != nullptr && *env != '\0')
    driver_name = env;
  if (options != nullptr && options->driver != nullptr) driver_name = options->driver;

  TERN_RETURN_IF_ERROR(ParseExecTimeout(&runtime->exec_timeout_ns));
  driver::DriverOptions driver_options;
  driver_options.exec_timeout_ns = runtime->exec_timeout_ns;
  TERN_RETURN_IF_ERROR(
      driver::CreateDriver(driver_name, driver_options, &runtime->driver)
          .WithContext(fmt::format("starting the '{}' driver backend", driver_name)));

  std::vector<driver::DeviceStaticInfo> infos;
  TERN_RETURN_IF_ERROR(runtime->driver->Enumerate(&infos));

  // Node-wide core numbering: devices in physical order, cores within each.
  uint32_t total_cores = 0;
  for (const auto& info : infos) total_cores += info.core_count;
  std::set<uint32_t> visible;
  const char* visible_text = std::getenv("TERN_VISIBLE_CORES");
  if (visible_text != nullptr && total_cores > 0) {
    if (*visible_text == '\0') {
      return MakeStatus(
          TERN_ERROR_INVALID_ARGUMENT,
          "TERN_VISIBLE_CORES is set but empty, which would hide every core; unset it "
          "to see all {} cores, or list cores such as '0' or '0-{}'",
          total_cores, total_cores - 1);
    }
    TERN_RETURN_IF_ERROR(ParseVisibleCores(visible_text, total_cores, &visible));
  } else {
    for (uint32_t i = 0; i < total_cores; ++i) visible.insert(i);
  }

  uint32_t first_core = 0;
  for (const auto& info : infos) {
    std::vector<uint32_t> cores;
    for (uint32_t c = 0; c < info.core_count; ++c) {
      if (visible.count(first_core + c)) cores.push_back(c);
    }
    const uint32_t device_first_core = first_core;
    first_core += info.core_count;
    if (cores.empty()) continue;
    auto device = std::make_unique<DeviceObject>();
    device->first_node_core = device_first_core;
    device->index = static_cast<uint32_t>(runtime->devices.size());
    device->info = info;
    device->visible_cores = std::move(cores);
    device->core_open.assign(device->visible_cores.size(), false);
    TERN_RETURN_IF_ERROR(runtime->driver->OpenDevice(info.physical_index, &device->hw)
                             .WithContext(fmt::format("opening device {}", info.physical_index)));
    device->allocator = std::make_unique<RangeAllocator>(
        info.memory_bytes, std::max<uint64_t>(64, info.memory_alignment));
    runtime->devices.push_back(std::move(device));
  }
  for (auto& device : runtime->devices) {
    // Device handles do not own their objects: the runtime does.
    device->handle = reinterpret_cast<tern_device_t>(runtime->device_table.Insert(
        std::shared_ptr<DeviceObject>(device.get(), [](DeviceObject*) {})));
    CreateDefaultMemoryPool(runtime.get(), device.get());
  }
  TERN_LOG_INFO("initialized: driver '{}', {} devices, exec timeout {} ns", driver_name,
                runtime->devices.size(), runtime->exec_timeout_ns);
  *out = std::move(runtime);
  return OkStatus();
}

void DestroyRuntime(Runtime* runtime) {
  // Queues first (they drain), then events, buffers, memory pools, cores,
  // devices, driver.
  for (auto& queue : runtime->queue_table.Clear()) CloseQueue(*queue);
  runtime->event_table.Clear();
  // Executables release their constants through their device: before devices go.
  // Graphs hold constants and scratch memory of their executions.
  runtime->graph_table.Clear();
  runtime->io_set_table.Clear();
  runtime->executable_table.Clear();
  for (auto& buffer : runtime->buffer_table.Clear()) ReleaseBuffer(*buffer);
  // Memory pools give their cached blocks back (the queues have drained).
  for (auto& pool : runtime->memory_pool_table.Clear()) PoolReleaseAll(*pool);
  for (auto& core : runtime->core_table.Clear()) core->device->hw->CloseCore(core->physical);
  runtime->device_table.Clear();
  {
    std::lock_guard<std::mutex> lock(runtime->host_mutex);
    for (auto& [ptr, size] : runtime->host_allocations) munmap(ptr, size);
    for (const Runtime::HostRegistration& r : runtime->host_registrations) {
      munlock(reinterpret_cast<void*>(r.locked_begin), r.locked_end - r.locked_begin);
    }
    runtime->host_registrations.clear();
    runtime->host_allocations.clear();
  }
  runtime->devices.clear();
  runtime->driver.reset();
  delete runtime;
  trace::Flush();
}

}  // namespace

Status GetRuntime(Runtime** out_runtime) {
  if (g_forked.load(std::memory_order_relaxed)) {
    return MakeStatus(TERN_ERROR_FORKED,
                      "this process was forked from one that had initialized tern; a forked child "
                      "cannot use its parent's devices: exec a new program, or initialize tern "
                      "only after fork()");
  }
  Runtime* runtime = g_runtime.load(std::memory_order_acquire);
  if (runtime == nullptr) {
    return MakeStatus(
        TERN_ERROR_NOT_INITIALIZED,
        "the runtime is not initialized: call tern_init() first (or it was shut down)");
  }
  *out_runtime = runtime;
  return OkStatus();
}

Status LookupDevice(Runtime* rt, tern_device_t handle, const char* arg, DeviceObject** out) {
  auto object = rt->device_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (!object) {
    return MakeStatus(TERN_ERROR_INVALID_HANDLE,
                      "{} is not a device handle of this runtime (NULL, from an earlier tern_init, "
                      "or another kind of handle); get one with tern_device_get()",
                      arg);
  }
  *out = object.get();
  return OkStatus();
}

#define TERN_DEFINE_LOOKUP(Name, HandleType, Object, table, what, hint)              \
  Status Lookup##Name(Runtime* rt, HandleType handle, const char* arg,               \
                      std::shared_ptr<Object>* out) {                                \
    *out = rt->table.Lookup(reinterpret_cast<uint64_t>(handle));                     \
    return *out ? OkStatus() : NotALiveHandle(arg, what, "already destroyed", hint); \
  }

TERN_DEFINE_LOOKUP(Core, tern_core_t, CoreObject, core_table, "core",
                   "open one with tern_core_open()")
TERN_DEFINE_LOOKUP(Buffer, tern_buffer_t, BufferObject, buffer_table, "buffer",
                   "allocate one with tern_buffer_alloc()")
TERN_DEFINE_LOOKUP(Queue, tern_queue_t, QueueObject, queue_table, "queue",
                   "create one with tern_queue_create()")
TERN_DEFINE_LOOKUP(Event, tern_event_t, EventObject, event_table, "event",
                   "create one with tern_event_create()")
#undef TERN_DEFINE_LOOKUP

Status PeekQueue(Runtime* rt, tern_queue_t handle, const char* arg, QueueObject** out) {
  *out = rt->queue_table.Peek(reinterpret_cast<uint64_t>(handle));
  return *out ? OkStatus()
              : NotALiveHandle(arg, "queue", "already destroyed",
                               "create one with tern_queue_create()");
}

void CloseQueue(QueueObject& queue) {
  queue.hw.reset();  // drains
  {
    std::lock_guard<std::mutex> lock(queue.scratch_mutex);
    queue.scratch.reset();
  }
  queue.core->queue_count.fetch_sub(1);
}

void WaitForDeviceQueues(DeviceObject* device) {
  std::vector<std::pair<std::shared_ptr<const Timeline>, uint64_t>> points;
  {
    std::lock_guard<std::mutex> lock(device->queues_mutex);
    for (const std::weak_ptr<QueueObject>& weak : device->queues) {
      std::shared_ptr<QueueObject> queue = weak.lock();
      if (!queue || !queue->hw) continue;
      const uint64_t submitted = queue->hw->submitted();
      if (queue->completion->value() >= submitted) continue;  // idle: the common case
      points.emplace_back(queue->hw->completion(), submitted);
    }
  }
  // Every command completes (a failed or aborted one too; a destroyed queue
  // drains), so these waits end.
  for (const auto& [timeline, target] : points) (void)timeline->Wait(target, UINT64_MAX);
}

std::string EventPoint::Description() const {
  return driver::DescribeEventRecord(sequence, queue_name.get());
}

driver::Command MakeEventWaitCommand(EventObject& event) {
  std::shared_ptr<EventPoint> point;
  {
    std::lock_guard<std::mutex> lock(event.mutex);
    point = event.point;
  }
  driver::Command command;
  command.kind = driver::CommandKind::kWait;
  if (point) {
    driver::CommandDetails& wait = command.Details();
    wait.wait_timeline = point->timeline;
    wait.wait_value = point->sequence;
    wait.wait_queue_name = point->queue_name;
  }
  return command;
}

Status ResolveDeviceRange(Runtime* rt, tern_buffer_t buffer, uint64_t offset, uint64_t size,
                          const char* arg, const DeviceObject* required, const char* place,
                          const char* remedy, driver::MemoryRef* out) {
  std::shared_ptr<BufferObject> object;
  TERN_RETURN_IF_ERROR(LookupBuffer(rt, buffer, arg, &object));
  TERN_RETURN_IF_ERROR(CheckBufferRange(*object, offset, size, arg));
  if (required != nullptr && object->device != required) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} lives on device {} but {} device {}; {} of device {}, or copy "
                      "device-to-device first",
                      arg, object->device->index, place, required->index, remedy,
                      object->device->index);
  }
  *out = driver::MemoryRef{nullptr, object->device->hw.get(), object->offset + offset};
  return OkStatus();
}

Status CheckBufferRange(const BufferObject& buffer, uint64_t offset, uint64_t size,
                        const char* arg) {
  if (offset > buffer.size || size > buffer.size - offset) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                      "{}: range [{}, {}+{}) does not fit in the buffer's {} bytes; check the "
                      "offset and size",
                      arg, offset, offset, size, buffer.size);
  }
  return OkStatus();
}

}  // namespace tern

extern "C" {

TERN_API tern_status_t tern_init(const tern_init_options_t* options) {
  using namespace tern;
  if (g_forked.load()) {
    Runtime* ignored;
    return Report(GetRuntime(&ignored));
  }
  if (options != nullptr) {
    TERN_API_TRY(
        CheckStructSize(options->struct_size, sizeof(tern_init_options_t), "tern_init_options_t"));
    TERN_API_TRY(CheckNoFlags(options->flags, "tern_init_options_t"));
  }
  std::lock_guard<std::mutex> lock(g_lifetime_mutex);
  if (g_refcount > 0) {
    if (options != nullptr && options->driver != nullptr &&
        std::string(options->driver) != g_runtime_owned->driver->name()) {
      return Report(
          MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                     "tern is already initialized with driver '{}'; cannot switch to '{}' "
                     "until every tern_init() has its tern_shutdown()",
                     g_runtime_owned->driver->name(), options->driver));
    }
    ++g_refcount;
    return TERN_OK;
  }
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, ChildAfterFork); });
  std::unique_ptr<Runtime> runtime;
  Status status = CreateRuntime(options, &runtime);
  if (!status.ok()) {
    if (runtime) DestroyRuntime(runtime.release());
    return Report(status);
  }
  g_runtime_owned = runtime.release();
  g_refcount = 1;
  g_runtime.store(g_runtime_owned, std::memory_order_release);
  return TERN_OK;
}

TERN_API tern_status_t tern_shutdown(void) {
  using namespace tern;
  Runtime* ignored;
  if (g_forked.load()) return Report(GetRuntime(&ignored));
  std::lock_guard<std::mutex> lock(g_lifetime_mutex);
  if (g_refcount == 0) {
    return Report(
        MakeStatus(TERN_ERROR_NOT_INITIALIZED,
                   "tern_shutdown() without a matching tern_init(): nothing to shut down"));
  }
  if (--g_refcount > 0) return TERN_OK;
  g_runtime.store(nullptr, std::memory_order_release);
  DestroyRuntime(g_runtime_owned);
  g_runtime_owned = nullptr;
  return TERN_OK;
}

TERN_API const char* tern_driver_name(void) {
  tern::Runtime* runtime = nullptr;
  if (!tern::GetRuntime(&runtime).ok()) return nullptr;
  return runtime->driver->name();
}

}  // extern "C"
