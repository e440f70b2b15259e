// The tern runtime as the plugin sees it: one lazily initialized process-wide
// runtime, the current device, one opened core per device and a fixed set of
// streams per device, each stream being one tern queue on that core.
//
// Everything here goes through the public C API (include/tern/*.h) only.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/macros/Macros.h>

#include <cstdint>
#include <string>

#include "tern/tern.h"

namespace torch_tern {

// Throws c10::Error naming the failed call with tern's status and message;
// TERN_ERROR_OUT_OF_MEMORY becomes c10::OutOfMemoryError (torch.OutOfMemoryError).
[[noreturn]] void ThrowTernError(tern_status_t status, const char* call, const char* file,
                                 int line);

#define TERN_CHECK(expr)                                                      \
  do {                                                                        \
    const tern_status_t tern_status__ = (expr);                               \
    if (C10_UNLIKELY(tern_status__ != TERN_OK)) {                             \
      ::torch_tern::ThrowTernError(tern_status__, #expr, __FILE__, __LINE__); \
    }                                                                         \
  } while (0)

// "TERN_ERROR_X: <message of the last failed call on this thread>".
std::string DescribeLastError(tern_status_t status);

// ---- Runtime and devices -------------------------------------------------

// Calls tern_init() once per process; throws (every time) if it failed.
void EnsureInitialized();
// Number of tern devices; 0 when tern cannot initialize (see InitError()).
// Never throws: torch requires that of device counts.
c10::DeviceIndex DeviceCount() noexcept;
// Why initialization failed, "" if it did not (or was not tried).
std::string InitError();
// True once tern_init() succeeded in this process.
bool IsInitialized();

void CheckDeviceIndex(c10::DeviceIndex index);
tern_device_t GetTernDevice(c10::DeviceIndex index);
const tern_device_info_t& GetDeviceInfo(c10::DeviceIndex index);

// The core the plugin opened on `index`, opening it on first use: the first
// core not owned by another process (TORCH_TERN_CORE=<n> forces core n).
tern_core_t GetCore(c10::DeviceIndex index);
// Index of the opened core on `index`, -1 while none is open.
int OpenedCoreIndex(c10::DeviceIndex index);

// Per-thread current device, 0 initially (as for CUDA).
c10::DeviceIndex CurrentDevice();
void SetDevice(c10::DeviceIndex index);
c10::DeviceIndex ExchangeDevice(c10::DeviceIndex index);

// ---- Streams --------------------------------------------------------------

// Stream ids: 0 is the device's default stream; 1..kStreamsPerDevice-1 form
// the pool that new streams are handed out from, round robin (as CUDA does).
// Queues are created on first use.
constexpr int kStreamsPerDevice = 8;

c10::Stream MakeStream(c10::DeviceIndex device, c10::StreamId id);
c10::Stream GetDefaultStream(c10::DeviceIndex device);
// The calling thread's current stream on `device` (-1: current device).
c10::Stream GetCurrentStream(c10::DeviceIndex device = -1);
void SetCurrentStream(c10::Stream stream);
c10::Stream GetStreamFromPool(c10::DeviceIndex device);

tern_queue_t GetQueue(c10::Stream stream);
// The queue of the current stream of `device` (-1: current device).
tern_queue_t CurrentQueue(c10::DeviceIndex device = -1);

bool QueryStream(c10::Stream stream);
void SynchronizeStream(c10::Stream stream);
// Waits for every queue the plugin created on `device`.
void SynchronizeDevice(c10::DeviceIndex device);
// The same, but leaves a failed queue's sticky error for its next
// synchronize instead of raising it (for the allocator).
void SynchronizeDeviceQuietly(c10::DeviceIndex device);
// Waits for `sequence` (0: everything) on `queue`. A failed command is
// reported as an exception and the queue's sticky error is cleared, so that
// the stream stays usable after the error has been raised in Python.
void WaitQueue(tern_queue_t queue, uint64_t sequence = 0);

}  // namespace torch_tern
