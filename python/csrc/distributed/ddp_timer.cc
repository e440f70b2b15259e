// DDP's runtime statistics on tern: the c10d::Timer that DDP's reducer makes
// for its parameters' device (TimerRegistry, keyed by device type). Without
// one for PrivateUse1 the reducer times tern work with host clocks, which
// see only how long the host took to enqueue it, and
// _get_ddp_logging_data() reported forward, backward and communication times
// of 0 (PyTorch's distributed suite, test_ddp_logging_data_*).
//
// As CUDA's timer: each event is also a tern event recorded on the current
// stream, and a difference is the device time between two of them, read when
// DDP asks (at the start of a sampled iteration, when the previous one's
// work has finished).
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <array>
#include <optional>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "runtime/runtime.h"

namespace torch_tern {
namespace {

class TernTimer final : public c10d::Timer {
 public:
  explicit TernTimer(c10::Device device) : device_(device) {}

  // Thread-safety: the reducer's (one iteration at a time).
  void record(Event event) override {
    Timer::record(event);  // the host's timestamp
    events_[Index(event)].record(GetCurrentStream(device_.index()));
  }

  // Nanoseconds of device time from `start` to `end`, or nullopt when either
  // was not recorded (no backward, no_sync) or `end` came before `start` (it
  // is the previous iteration's).
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& from = events_[Index(start)];
    c10::Event& to = events_[Index(end)];
    if (from.eventId() == nullptr || to.eventId() == nullptr) return std::nullopt;
    try {
      from.synchronize();
      to.synchronize();
      const double milliseconds = from.elapsedTime(to);
      if (milliseconds < 0) return std::nullopt;
      return static_cast<int64_t>(milliseconds * 1e6);
    } catch (const c10::Error&) {
      return std::nullopt;  // e.g. the end was recorded before the start
    }
  }

 private:
  static size_t Index(Event event) { return static_cast<size_t>(event); }

  c10::Device device_;
  // BACKEND_DEFAULT: timing enabled (c10::Event refuses elapsedTime otherwise;
  // tern events always carry a device timestamp).
  static c10::Event Timed() {
    return c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  }
  std::array<c10::Event, 5> events_{Timed(), Timed(), Timed(), Timed(), Timed()};
};

}  // namespace
}  // namespace torch_tern

namespace c10d {
// (In the registry's namespace, which the macro's names assume.)
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, torch_tern::TernTimer);
}  // namespace c10d
