#include "runtime/runtime.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/capture.h"

namespace torch_tern {

std::string DescribeLastError(tern_status_t status) {
  std::string text = tern_status_string(status);
  const char* message = tern_last_error_message();
  if (message != nullptr && message[0] != '\0') {
    text += ": ";
    text += message;
  }
  return text;
}

void ThrowTernError(tern_status_t status, const char* call, const char* file, int line) {
  // Read the message first: anything else may overwrite it.
  std::string detail = DescribeLastError(status);
  std::string text = "tern: " + detail + " (in " + call + ")";
  if (status == TERN_ERROR_OUT_OF_MEMORY) {
    throw c10::OutOfMemoryError({__func__, file, static_cast<uint32_t>(line)}, text);
  }
  throw c10::Error({__func__, file, static_cast<uint32_t>(line)}, text);
}

namespace {

struct DeviceState {
  tern_device_t device = nullptr;
  tern_device_info_t info{};
  std::mutex mutex;  // guards core opening and queue creation
  tern_core_t core = nullptr;
  std::atomic<int> core_index{-1};
  std::array<std::atomic<tern_queue_t>, kStreamsPerDevice> queues{};
  std::atomic<uint32_t> next_pool_stream{0};
};

struct Runtime {
  std::mutex mutex;
  bool tried = false;
  bool ok = false;
  std::string error;
  // Fixed after a successful init; never destroyed (tern tears itself down
  // when the process exits, and tensors may be freed late in interpreter
  // shutdown).
  std::vector<DeviceState*> devices;
};

Runtime& GetRuntime() {
  static Runtime* runtime = new Runtime();
  return *runtime;
}

// Fast path flag: set once init succeeded.
std::atomic<bool> g_initialized{false};

bool TryInit(std::string* error) {
  Runtime& rt = GetRuntime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  if (rt.tried) {
    *error = rt.error;
    return rt.ok;
  }
  rt.tried = true;
  tern_status_t status = tern_init(nullptr);
  if (status != TERN_OK) {
    rt.error = "tern_init failed: " + DescribeLastError(status);
    *error = rt.error;
    return false;
  }
  uint32_t count = 0;
  status = tern_device_count(&count);
  if (status != TERN_OK) {
    rt.error = "tern_device_count failed: " + DescribeLastError(status);
    *error = rt.error;
    return false;
  }
  for (uint32_t i = 0; i < count; ++i) {
    auto* state = new DeviceState();
    status = tern_device_get(i, &state->device);
    if (status == TERN_OK) {
      state->info.struct_size = sizeof(state->info);
      status = tern_device_get_info(state->device, &state->info);
    }
    if (status != TERN_OK) {
      rt.error =
          "querying tern device " + std::to_string(i) + " failed: " + DescribeLastError(status);
      *error = rt.error;
      delete state;
      return false;
    }
    rt.devices.push_back(state);
  }
  rt.ok = true;
  g_initialized.store(true, std::memory_order_release);
  return true;
}

DeviceState& State(c10::DeviceIndex index) {
  EnsureInitialized();
  CheckDeviceIndex(index);
  return *GetRuntime().devices[index];
}

thread_local c10::DeviceIndex t_current_device = 0;
thread_local std::array<c10::StreamId, 64> t_current_streams{};  // all default (0)

}  // namespace

void EnsureInitialized() {
  if (C10_LIKELY(g_initialized.load(std::memory_order_acquire))) return;
  std::string error;
  TORCH_CHECK(TryInit(&error), "tern device is not usable: ", error);
}

bool IsInitialized() { return g_initialized.load(std::memory_order_acquire); }

c10::DeviceIndex DeviceCount() noexcept {
  try {
    std::string error;
    if (!TryInit(&error)) return 0;
    return static_cast<c10::DeviceIndex>(GetRuntime().devices.size());
  } catch (...) {
    return 0;
  }
}

std::string InitError() {
  Runtime& rt = GetRuntime();
  std::lock_guard<std::mutex> lock(rt.mutex);
  return rt.error;
}

void CheckDeviceIndex(c10::DeviceIndex index) {
  const auto count = static_cast<int64_t>(GetRuntime().devices.size());
  TORCH_CHECK(index >= 0 && index < count, "tern device index ", static_cast<int>(index),
              " is out of range: this process sees ", count, " tern device(s)");
}

tern_device_t GetTernDevice(c10::DeviceIndex index) { return State(index).device; }

const tern_device_info_t& GetDeviceInfo(c10::DeviceIndex index) { return State(index).info; }

tern_core_t GetCore(c10::DeviceIndex index) {
  DeviceState& state = State(index);
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.core != nullptr) return state.core;
  std::string failures;
  const char* forced = std::getenv("TORCH_TERN_CORE");
  if (forced != nullptr && forced[0] != '\0') {
    const int core = std::atoi(forced);
    tern_core_t handle = nullptr;
    TERN_CHECK(tern_core_open(state.device, static_cast<uint32_t>(core), &handle));
    state.core = handle;
    state.core_index.store(core);
    return handle;
  }
  for (uint32_t core = 0; core < state.info.core_count; ++core) {
    tern_core_t handle = nullptr;
    const tern_status_t status = tern_core_open(state.device, core, &handle);
    if (status == TERN_OK) {
      state.core = handle;
      state.core_index.store(static_cast<int>(core));
      return handle;
    }
    failures += "\n  core " + std::to_string(core) + ": " + DescribeLastError(status);
    if (status != TERN_ERROR_BUSY) break;
  }
  TORCH_CHECK(false, "tern: cannot open a core on device tern:", static_cast<int>(index), failures);
}

int OpenedCoreIndex(c10::DeviceIndex index) { return State(index).core_index.load(); }

c10::DeviceIndex CurrentDevice() { return t_current_device; }

void SetDevice(c10::DeviceIndex index) {
  EnsureInitialized();
  CheckDeviceIndex(index);
  t_current_device = index;
}

c10::DeviceIndex ExchangeDevice(c10::DeviceIndex index) {
  const c10::DeviceIndex previous = t_current_device;
  if (index != previous) SetDevice(index);
  return previous;
}

c10::Stream MakeStream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

c10::Stream GetDefaultStream(c10::DeviceIndex device) {
  if (device < 0) device = CurrentDevice();
  return MakeStream(device, 0);
}

c10::Stream GetCurrentStream(c10::DeviceIndex device) {
  if (device < 0) device = CurrentDevice();
  TORCH_CHECK(device < static_cast<c10::DeviceIndex>(t_current_streams.size()),
              "tern device index too large");
  return MakeStream(device, t_current_streams[device]);
}

void SetCurrentStream(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "not a tern stream: ", stream);
  TORCH_CHECK(stream.id() >= 0 && stream.id() < kStreamsPerDevice, "invalid tern stream id ",
              stream.id());
  EnsureInitialized();
  CheckDeviceIndex(stream.device_index());
  t_current_streams[stream.device_index()] = stream.id();
}

c10::Stream GetStreamFromPool(c10::DeviceIndex device) {
  if (device < 0) device = CurrentDevice();
  DeviceState& state = State(device);
  const uint32_t n = state.next_pool_stream.fetch_add(1) % (kStreamsPerDevice - 1);
  return MakeStream(device, static_cast<c10::StreamId>(n + 1));
}

tern_queue_t GetQueue(c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "not a tern stream: ", stream);
  TORCH_CHECK(stream.id() >= 0 && stream.id() < kStreamsPerDevice, "invalid tern stream id ",
              stream.id());
  DeviceState& state = State(stream.device_index());
  auto& slot = state.queues[stream.id()];
  tern_queue_t queue = slot.load(std::memory_order_acquire);
  if (C10_LIKELY(queue != nullptr)) return queue;
  tern_core_t core = GetCore(stream.device_index());
  std::lock_guard<std::mutex> lock(state.mutex);
  queue = slot.load(std::memory_order_acquire);
  if (queue != nullptr) return queue;
  const std::string name = "torch tern:" + std::to_string(stream.device_index()) + " stream " +
                           std::to_string(stream.id());
  tern_queue_params_t params{};
  params.struct_size = sizeof(params);
  params.name = name.c_str();
  TERN_CHECK(tern_queue_create(core, &params, &queue));
  slot.store(queue, std::memory_order_release);
  return queue;
}

tern_queue_t CurrentQueue(c10::DeviceIndex device) { return GetQueue(GetCurrentStream(device)); }

void WaitQueue(tern_queue_t queue, uint64_t sequence) {
  RefuseIfCapturing(queue,
                    "waiting for the stream's work on the host (a synchronization: "
                    "Stream.synchronize(), a device-to-host copy, .item())");
  const tern_status_t status =
      sequence == 0 ? tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE)
                    : tern_queue_wait_sequence(queue, sequence, TERN_TIMEOUT_INFINITE);
  if (C10_LIKELY(status == TERN_OK)) return;
  const std::string detail = DescribeLastError(status);
  tern_queue_clear_error(queue);
  if (status == TERN_ERROR_OUT_OF_MEMORY) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "tern: ", detail);
  }
  TORCH_CHECK(false, "tern: a command on the stream failed: ", detail);
}

bool QueryStream(c10::Stream stream) {
  DeviceState& state = State(stream.device_index());
  tern_queue_t queue = state.queues[stream.id()].load(std::memory_order_acquire);
  if (queue == nullptr) return true;  // never used
  if (C10_UNLIKELY(IsCapturing(queue))) RefuseIfCapturing(queue, "Stream.query()");
  const tern_status_t status = tern_queue_query(queue, nullptr);
  if (status == TERN_OK) return true;
  if (status == TERN_ERROR_NOT_READY) return false;
  WaitQueue(queue);  // raises the sticky error
  return true;
}

void SynchronizeStream(c10::Stream stream) {
  DeviceState& state = State(stream.device_index());
  if (C10_UNLIKELY(IsStreamCapturing(stream))) {
    RefuseIfCapturing(GetQueue(stream), "Stream.synchronize()");
  }
  tern_queue_t queue = state.queues[stream.id()].load(std::memory_order_acquire);
  if (queue != nullptr) WaitQueue(queue);
}

void SynchronizeDevice(c10::DeviceIndex device) {
  if (device < 0) device = CurrentDevice();
  DeviceState& state = State(device);
  RefuseIfDeviceCapturing(device, "torch.tern.synchronize() (a device-wide synchronization)");
  for (auto& slot : state.queues) {
    tern_queue_t queue = slot.load(std::memory_order_acquire);
    if (queue != nullptr) WaitQueue(queue);
  }
}

void SynchronizeDeviceQuietly(c10::DeviceIndex device) {
  DeviceState& state = State(device);
  for (auto& slot : state.queues) {
    tern_queue_t queue = slot.load(std::memory_order_acquire);
    if (queue != nullptr) tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE);
  }
}

}  // namespace torch_tern
