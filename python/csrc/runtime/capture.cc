#include "runtime/capture.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>

#include "runtime/allocator.h"
#include "runtime/runtime.h"

// As in aten/program.cc: bound weakly so that the plugin still loads against
// a libtern without executables or graphs (capture_begin then refuses).
#pragma weak tern_queue_execute
#pragma weak tern_graph_create
#pragma weak tern_graph_destroy
#pragma weak tern_graph_add_copy_h2d
#pragma weak tern_graph_add_copy_d2d
#pragma weak tern_graph_add_fill
#pragma weak tern_graph_add_execute
#pragma weak tern_graph_finalize
#pragma weak tern_graph_get_info
#pragma weak tern_queue_launch_graph

namespace torch_tern {
namespace {

struct Active {
  tern_queue_t queue;
  c10::DeviceIndex device;
  c10::StreamId stream;
  CaptureGraph* graph;
};

// The captures in progress. Few (one per capturing stream), so a vector.
std::mutex g_mutex;
std::vector<Active>* g_active = new std::vector<Active>();
std::atomic<int> g_count{0};
std::atomic<uint64_t> g_next_pool{1};
std::atomic<uint64_t> g_next_graph{1};

// Under g_mutex.
Active* Find(tern_queue_t queue) {
  for (Active& a : *g_active) {
    if (a.queue == queue) return &a;
  }
  return nullptr;
}

// Under g_mutex: removes `queue`'s capture and invalidates its graph.
std::string EndInvalid(tern_queue_t queue, const std::string& reason) {
  auto it = std::find_if(g_active->begin(), g_active->end(),
                         [&](const Active& a) { return a.queue == queue; });
  if (it == g_active->end()) return "";
  const std::string where = "tern:" + std::to_string(static_cast<int>(it->device)) + " stream " +
                            std::to_string(static_cast<int>(it->stream));
  CaptureGraph* graph = it->graph;
  g_active->erase(it);
  g_count.fetch_sub(1, std::memory_order_release);
  graph->Invalidate(reason);
  return where;
}

[[noreturn]] void ThrowRefused(const std::string& what, const std::string& where) {
  TORCH_CHECK(false, what, " is not allowed while stream ", where,
              " is being captured into a tern graph (torch.tern.graph / TernGraph.capture_begin): "
              "a graph records device work only (executions, device copies and fills, small "
              "host-to-device copies) and cannot replay this. The capture was ended and its graph "
              "invalidated (capture_end() raises, reset() releases it); the stream runs normally "
              "again.");
}

// Under g_mutex: a failed tern_graph_add_*() ends the capture and raises.
void CheckAdd(tern_status_t status, tern_queue_t queue, const char* call) {
  if (C10_LIKELY(status == TERN_OK)) return;
  const std::string detail = DescribeLastError(status);
  EndInvalid(queue, std::string(call) + " failed: " + detail);
  TORCH_CHECK(false, "tern: recording into the capturing graph failed (", call, "): ", detail,
              "; the capture was ended and its graph invalidated");
}

}  // namespace

bool IsCapturing(tern_queue_t queue) {
  if (C10_LIKELY(g_count.load(std::memory_order_acquire) == 0)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  return Find(queue) != nullptr;
}

bool IsStreamCapturing(c10::Stream stream) {
  if (C10_LIKELY(g_count.load(std::memory_order_acquire) == 0)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Active& a : *g_active) {
    if (a.device == stream.device_index() && a.stream == stream.id()) return true;
  }
  return false;
}

bool IsDeviceCapturing(c10::DeviceIndex device) {
  if (C10_LIKELY(g_count.load(std::memory_order_acquire) == 0)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Active& a : *g_active) {
    if (a.device == device) return true;
  }
  return false;
}

void RefuseIfCapturing(tern_queue_t queue, const std::string& what) {
  if (C10_LIKELY(g_count.load(std::memory_order_acquire) == 0)) return;
  std::string where;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    where = EndInvalid(queue, what);
  }
  if (!where.empty()) ThrowRefused(what, where);
}

void RefuseIfCurrentStreamCapturing(const std::string& what) {
  if (C10_LIKELY(g_count.load(std::memory_order_acquire) == 0)) return;
  const c10::Stream stream = GetCurrentStream();
  std::string where;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const Active& a : *g_active) {
      if (a.device == stream.device_index() && a.stream == stream.id()) {
        where = EndInvalid(a.queue, what);
        break;
      }
    }
  }
  if (!where.empty()) ThrowRefused(what, where);
}

void RefuseIfDeviceCapturing(c10::DeviceIndex device, const std::string& what) {
  if (C10_LIKELY(g_count.load(std::memory_order_acquire) == 0)) return;
  std::string where;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (;;) {
      auto it = std::find_if(g_active->begin(), g_active->end(),
                             [&](const Active& a) { return a.device == device; });
      if (it == g_active->end()) break;
      const std::string one = EndInvalid(it->queue, what);
      where += where.empty() ? one : ", " + one;
    }
  }
  if (!where.empty()) ThrowRefused(what, where);
}

void SubmitCopyD2D(tern_queue_t queue, tern_buffer_t dst, uint64_t dst_offset, tern_buffer_t src,
                   uint64_t src_offset, uint64_t size) {
  if (C10_UNLIKELY(g_count.load(std::memory_order_acquire) != 0)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Active* a = Find(queue)) {
      CheckAdd(tern_graph_add_copy_d2d(a->graph->graph(), dst, dst_offset, src, src_offset, size,
                                       nullptr),
               queue, "tern_graph_add_copy_d2d");
      return;
    }
  }
  TERN_CHECK(tern_queue_copy_d2d(queue, dst, dst_offset, src, src_offset, size, nullptr));
}

void SubmitFill(tern_queue_t queue, tern_buffer_t dst, uint64_t offset, uint64_t size,
                uint32_t pattern) {
  if (C10_UNLIKELY(g_count.load(std::memory_order_acquire) != 0)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Active* a = Find(queue)) {
      CheckAdd(tern_graph_add_fill(a->graph->graph(), dst, offset, size, pattern, nullptr), queue,
               "tern_graph_add_fill");
      return;
    }
  }
  TERN_CHECK(tern_queue_fill(queue, dst, offset, size, pattern, nullptr));
}

namespace {

void FreeOwnedBytes(void* user_data, tern_status_t) {
  delete static_cast<std::vector<uint8_t>*>(user_data);
}

}  // namespace

void SubmitOwnedH2D(tern_queue_t queue, tern_buffer_t buffer, uint64_t offset,
                    std::vector<uint8_t> bytes) {
  if (C10_UNLIKELY(g_count.load(std::memory_order_acquire) != 0)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Active* a = Find(queue)) {
      // The graph keeps the bytes: every replay writes these values.
      auto kept = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
      CheckAdd(tern_graph_add_copy_h2d(a->graph->graph(), buffer, offset, kept->data(),
                                       kept->size(), nullptr),
               queue, "tern_graph_add_copy_h2d");
      a->graph->Hold(std::move(kept));
      return;
    }
  }
  auto* owned = new std::vector<uint8_t>(std::move(bytes));
  tern_status_t status =
      tern_queue_copy_h2d(queue, buffer, offset, owned->data(), owned->size(), nullptr);
  if (status == TERN_OK) status = tern_queue_host_callback(queue, &FreeOwnedBytes, owned, nullptr);
  if (status != TERN_OK) {
    // Nothing (or only the copy) was queued: wait for the copy, then free.
    const std::string detail = DescribeLastError(status);
    tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE);
    delete owned;
    TORCH_CHECK(false, "tern: queueing a host-to-device copy failed: ", detail);
  }
}

tern_status_t SubmitExecute(tern_queue_t queue, tern_executable_t executable, uint32_t function,
                            const tern_binding_t* inputs, uint32_t input_count,
                            const tern_binding_t* outputs, uint32_t output_count,
                            const std::shared_ptr<void>& keep_alive) {
  if (C10_UNLIKELY(g_count.load(std::memory_order_acquire) != 0)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Active* a = Find(queue)) {
      CheckAdd(tern_graph_add_execute(a->graph->graph(), executable, function, inputs, input_count,
                                      outputs, output_count, nullptr),
               queue, "tern_graph_add_execute");
      if (keep_alive) a->graph->Hold(keep_alive);
      return TERN_OK;
    }
  }
  return tern_queue_execute(queue, executable, function, inputs, input_count, outputs, output_count,
                            nullptr);
}

// ---- CaptureGraph -------------------------------------------------------------

uint64_t CaptureGraph::NewPoolId() { return g_next_pool.fetch_add(1); }

CaptureGraph::~CaptureGraph() {
  try {
    Reset();
  } catch (const std::exception&) {
    // Destructors do not throw; Reset() leaves nothing half done that matters.
  }
}

void CaptureGraph::CaptureBegin(uint64_t pool) {
  TORCH_CHECK(state_ == State::kEmpty,
              "TernGraph.capture_begin: this graph holds a capture already; call reset() first");
  TORCH_CHECK(tern_graph_create != nullptr && tern_queue_launch_graph != nullptr,
              "TernGraph.capture_begin: the loaded libtern has no graphs (tern/graph.h)");
  EnsureInitialized();
  const c10::DeviceIndex device = CurrentDevice();
  const c10::Stream stream = GetCurrentStream(device);
  tern_queue_t queue = GetQueue(stream);
  TORCH_CHECK(!IsCapturing(queue), "TernGraph.capture_begin: stream ", stream,
              " is already capturing into another graph");
  const uint64_t pool_id = pool != 0 ? pool : NewPoolId();
  const std::string name = "torch tern graph " + std::to_string(g_next_graph.fetch_add(1));
  tern_graph_params_t params{};
  params.struct_size = sizeof(params);
  params.name = name.c_str();
  tern_graph_t graph = nullptr;
  TERN_CHECK(tern_graph_create(GetTernDevice(device), &params, &graph));
  auto& allocator = TernDeviceAllocator::Get();
  allocator.RetainPool(device, pool_id);
  try {
    allocator.BeginCapture(device, stream.id(), pool_id);
  } catch (...) {
    allocator.ReleasePool(device, pool_id);
    tern_graph_destroy(graph);
    throw;
  }
  device_ = device;
  stream_ = stream.id();
  queue_ = queue;
  pool_ = pool_id;
  pool_retained_ = true;
  graph_ = graph;
  invalid_reason_.clear();
  state_ = State::kCapturing;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_active->push_back(Active{queue, device, stream.id(), this});
  g_count.fetch_add(1, std::memory_order_release);
}

void CaptureGraph::Invalidate(const std::string& reason) {
  // Under g_mutex, already removed from the captures in progress.
  TernDeviceAllocator::Get().EndCapture(device_, stream_);
  state_ = State::kInvalid;
  invalid_reason_ = reason;
}

void CaptureGraph::CaptureEnd() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    TORCH_CHECK(state_ != State::kInvalid,
                "TernGraph.capture_end: the capture was invalidated: ", invalid_reason_,
                " is not allowed during capture (the capture ended there); reset() the graph and "
                "capture again without it");
    TORCH_CHECK(state_ == State::kCapturing, "TernGraph.capture_end: no capture in progress");
    auto it = std::find_if(g_active->begin(), g_active->end(),
                           [&](const Active& a) { return a.graph == this; });
    if (it != g_active->end()) {
      g_active->erase(it);
      g_count.fetch_sub(1, std::memory_order_release);
    }
    TernDeviceAllocator::Get().EndCapture(device_, stream_);
  }
  tern_status_t status = tern_graph_finalize(graph_);
  if (status == TERN_ERROR_OUT_OF_MEMORY) {
    // The graph's scratch comes from tern beside the caching allocator.
    TernDeviceAllocator::Get().emptyCache();
    status = tern_graph_finalize(graph_);
  }
  if (status != TERN_OK) {
    state_ = State::kInvalid;
    invalid_reason_ = "finalizing the graph";
    ThrowTernError(status, "tern_graph_finalize", __FILE__, __LINE__);
  }
  state_ = State::kReady;
}

void CaptureGraph::AbortCapture(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = std::find_if(g_active->begin(), g_active->end(),
                         [&](const Active& a) { return a.graph == this; });
  if (it != g_active->end()) EndInvalid(it->queue, reason);
}

void CaptureGraph::Replay() {
  TORCH_CHECK(state_ == State::kReady,
              state_ == State::kCapturing ? "TernGraph.replay: the graph is still capturing"
              : state_ == State::kInvalid ? "TernGraph.replay: the capture was invalidated"
                                          : "TernGraph.replay: nothing captured");
  const c10::Stream stream = GetCurrentStream(device_);
  tern_queue_t queue = GetQueue(stream);
  RefuseIfCapturing(queue, "replaying a tern graph");
  TERN_CHECK(tern_queue_launch_graph(queue, graph_, nullptr, nullptr));
}

uint32_t CaptureGraph::CommandCount() const {
  if (graph_ == nullptr) return 0;
  tern_graph_info_t info{};
  info.struct_size = sizeof(info);
  TERN_CHECK(tern_graph_get_info(graph_, &info));
  return info.command_count;
}

void CaptureGraph::Reset() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = std::find_if(g_active->begin(), g_active->end(),
                           [&](const Active& a) { return a.graph == this; });
    if (it != g_active->end()) EndInvalid(it->queue, "reset() during capture");
  }
  if (graph_ != nullptr) {
    // Launches in flight read the held bytes and run the held executables.
    SynchronizeDeviceQuietly(device_);
    tern_graph_destroy(graph_);
    graph_ = nullptr;
  }
  held_.clear();
  if (pool_retained_) {
    pool_retained_ = false;
    TernDeviceAllocator::Get().ReleasePool(device_, pool_);
  }
  pool_ = 0;
  state_ = State::kEmpty;
  invalid_reason_.clear();
}

}  // namespace torch_tern
