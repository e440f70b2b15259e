// Stream capture into tern graphs (torch.tern.graph, torch.tern.TernGraph).
//
// While a stream captures, every submission the plugin makes on that
// stream's queue goes through the Submit*() functions below, which record it
// into the capturing tern graph (tern/graph.h) instead of enqueueing it:
// executions, device-to-device copies, fills, and host-to-device copies of
// bytes the graph keeps (small owned bytes: scalars, kernel arguments,
// small host tensors, whose values at capture time are what every replay
// writes). What a graph cannot hold (a device-to-host copy, a
// synchronization, an event across streams, a CPU fallback, random numbers)
// is refused with RefuseInCapture(): the capture ends at once, the graph is
// invalidated (capture_end() then raises with the reason) and the stream
// submits normally again. Memory: see TernDeviceAllocator's graph pools.
#pragma once

#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tern/tern.h"

namespace torch_tern {

// True while `queue` is being captured. Cheap when nothing captures.
// Thread-safety: any thread.
bool IsCapturing(tern_queue_t queue);
// True while `stream` is being captured (without creating its queue).
// Thread-safety: any thread.
bool IsStreamCapturing(c10::Stream stream);
// True while any stream of `device` is being captured.
// Thread-safety: any thread.
bool IsDeviceCapturing(c10::DeviceIndex device);

// Ends the capture of `queue` (if any), invalidating its graph, and throws
// "<what> is not allowed while ... captures ...". Returns normally (does
// nothing) when `queue` is not capturing.
// Thread-safety: any thread.
void RefuseIfCapturing(tern_queue_t queue, const std::string& what);
// The same for the calling thread's current stream of the current device.
// Thread-safety: any thread.
void RefuseIfCurrentStreamCapturing(const std::string& what);
// The same for every capture on `device` (a device-wide synchronization).
// Thread-safety: any thread.
void RefuseIfDeviceCapturing(c10::DeviceIndex device, const std::string& what);

// Submissions: each enqueues on `queue`, or records into the graph that
// captures it. They throw c10::Error on failure.
// Thread-safety: any thread.
void SubmitCopyD2D(tern_queue_t queue, tern_buffer_t dst, uint64_t dst_offset, tern_buffer_t src,
                   uint64_t src_offset, uint64_t size);
// Thread-safety: any thread.
void SubmitFill(tern_queue_t queue, tern_buffer_t dst, uint64_t offset, uint64_t size,
                uint32_t pattern);
// Copies `bytes` (owned from now on) to (buffer, offset); the bytes live
// until the copy ran, or, captured, as long as the graph.
// Thread-safety: any thread.
void SubmitOwnedH2D(tern_queue_t queue, tern_buffer_t buffer, uint64_t offset,
                    std::vector<uint8_t> bytes);
// tern_queue_execute, or its recording; `keep_alive` (may be null) is held
// by the graph when captured (an executable's pin). Returns tern's status
// (the caller raises it).
// Thread-safety: any thread.
tern_status_t SubmitExecute(tern_queue_t queue, tern_executable_t executable, uint32_t function,
                            const tern_binding_t* inputs, uint32_t input_count,
                            const tern_binding_t* outputs, uint32_t output_count,
                            const std::shared_ptr<void>& keep_alive);

// The object behind torch.tern.TernGraph.
class CaptureGraph {
 public:
  CaptureGraph() = default;
  ~CaptureGraph();
  CaptureGraph(const CaptureGraph&) = delete;
  CaptureGraph& operator=(const CaptureGraph&) = delete;

  // Starts capturing the current stream of the current device into a new
  // graph; `pool` 0: a new private pool. Thread-safety: one thread per graph.
  void CaptureBegin(uint64_t pool);
  // Ends the capture and finalizes the graph; raises if it was invalidated.
  // Thread-safety: one thread per graph.
  void CaptureEnd();
  // Ends a capture in progress without raising (an exception left the
  // capturing block): the graph is invalidated. Thread-safety: any thread.
  void AbortCapture(const std::string& reason);
  // Launches the graph on the current stream's queue.
  // Thread-safety: one thread per graph.
  void Replay();
  // Waits for the device, destroys the graph, releases its executables,
  // bytes and pool. Thread-safety: one thread per graph.
  void Reset();
  // Thread-safety: any thread.
  uint64_t Pool() const { return pool_; }
  // Thread-safety: one thread per graph.
  uint32_t CommandCount() const;

  // A new pool id (torch.tern.graph_pool_handle()). Thread-safety: any thread.
  static uint64_t NewPoolId();

  // For capture.cc (the Submit*() functions and the refusals): the tern
  // graph recording, what the graph keeps alive until Reset() (owned host
  // bytes, executable pins), and ending the capture as invalid.
  // Thread-safety: only under the capture registry's lock (capture.cc).
  tern_graph_t graph() const { return graph_; }
  // Thread-safety: only under the capture registry's lock (capture.cc).
  void Hold(std::shared_ptr<void> thing) { held_.push_back(std::move(thing)); }
  // Thread-safety: only under the capture registry's lock (capture.cc).
  void Invalidate(const std::string& reason);

 private:
  enum class State { kEmpty, kCapturing, kReady, kInvalid };
  State state_ = State::kEmpty;
  c10::DeviceIndex device_ = 0;
  c10::StreamId stream_ = 0;
  tern_queue_t queue_ = nullptr;
  uint64_t pool_ = 0;
  bool pool_retained_ = false;
  tern_graph_t graph_ = nullptr;
  std::vector<std::shared_ptr<void>> held_;
  std::string invalid_reason_;
};

}  // namespace torch_tern
