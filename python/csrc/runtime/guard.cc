// DeviceGuardImpl for tern: current device, streams (tern queues) and events
// (tern events) as torch.Stream / torch.Event and the generic device guards
// see them.
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/capture.h"
#include "runtime/runtime.h"

namespace torch_tern {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

tern_event_t AsEvent(void* event) { return static_cast<tern_event_t>(event); }

// Events given back by torch.Event / c10::Event, kept for the next record: a
// collective's Work makes and drops one per operation, and creating and
// destroying a tern event takes the runtime's handle table lock twice.
// A pooled event is handed out only to record() with a null event, which
// records it at once, so its previous recording is never seen again.
// Thread-safety: any thread.
class EventPool {
 public:
  static EventPool& Get() {
    static auto* pool = new EventPool();  // never destroyed: events may die at exit
    return *pool;
  }
  tern_event_t Take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        tern_event_t event = free_.back();
        free_.pop_back();
        return event;
      }
    }
    tern_event_t created = nullptr;
    TERN_CHECK(tern_event_create(&created));
    return created;
  }
  void Give(tern_event_t event) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (free_.size() < kMaxPooled) {
        free_.push_back(event);
        return;
      }
    }
    tern_event_destroy(event);
  }

 private:
  // Enough for the Works a DDP step or an FSDP prefetch keeps in flight.
  static constexpr size_t kMaxPooled = 256;
  std::mutex mutex_;
  std::vector<tern_event_t> free_;
};

struct TernGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  TernGuardImpl() = default;
  explicit TernGuardImpl(c10::DeviceType t) {
    TORCH_CHECK(t == kType, "TernGuardImpl made for ", t);
  }

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a tern device, got ", d);
    return c10::Device(kType, ExchangeDevice(d.index()));
  }

  c10::Device getDevice() const override { return c10::Device(kType, CurrentDevice()); }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a tern device, got ", d);
    SetDevice(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      SetDevice(d.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override { return GetCurrentStream(d.index()); }

  c10::Stream getDefaultStream(c10::Device d) const override { return GetDefaultStream(d.index()); }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return GetStreamFromPool(d.index());
  }

  c10::Stream getNewStream(c10::Device d, int) const override {
    return GetStreamFromPool(d.index());
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream previous = GetCurrentStream(s.device_index());
    SetCurrentStream(s);
    return previous;
  }

  c10::DeviceIndex deviceCount() const noexcept override { return DeviceCount(); }

  // Every dtype: tensors of any dtype live on tern (kernels may still fall back).
  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    return c10::DeviceCapability();
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event != nullptr) EventPool::Get().Give(AsEvent(event));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "event of device ",
                static_cast<int>(device_index), " recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    tern_queue_t queue = GetQueue(stream);
    RefuseIfCapturing(queue, "recording an event on the capturing stream (events across streams)");
    if (*event == nullptr) *event = EventPool::Get().Take();
    // tern events always carry a device timestamp, so timing is always on.
    TERN_CHECK(tern_queue_record_event(queue, AsEvent(*event), nullptr));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    tern_queue_t queue = GetQueue(stream);
    RefuseIfCapturing(queue,
                      "waiting for an event on the capturing stream (events across streams)");
    TERN_CHECK(tern_queue_wait_event(queue, AsEvent(event), nullptr));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    const tern_status_t status = tern_event_query(AsEvent(event));
    if (status == TERN_ERROR_NOT_READY) return false;
    TERN_CHECK(status);
    return true;
  }

  bool queryStream(const c10::Stream& stream) const override { return QueryStream(stream); }

  void synchronizeStream(const c10::Stream& stream) const override { SynchronizeStream(stream); }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    TERN_CHECK(tern_event_synchronize(AsEvent(event), TERN_TIMEOUT_INFINITE));
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    SynchronizeDevice(device_index);
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    TernDeviceAllocator::Get().recordStream(data_ptr, stream);
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "both events must be recorded before elapsed_time");
    uint64_t ns = 0;
    TERN_CHECK(tern_event_elapsed_ns(AsEvent(start), AsEvent(end), &ns));
    return static_cast<double>(ns) / 1e6;  // milliseconds, as torch expects
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TernGuardImpl);

}  // namespace
}  // namespace torch_tern
