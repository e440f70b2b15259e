// torch_tern's bridge to tern's profiling and logging API (tern/profile.h):
// a trace capture started and stopped from Python, and tern's log messages
// forwarded to a Python callable (torch_tern routes them into the `logging`
// module).
//
// Why a forwarding thread: tern calls its log callback on whichever thread
// logs, often a queue or engine thread. Taking the GIL there could deadlock:
// a Python thread that holds the GIL may be waiting for that very queue. So
// the callback only appends to a list, and a thread of the plugin, which
// holds no tern lock, takes the GIL and hands each message to Python.
#include "runtime/profiling.h"

#include <torch/csrc/utils/pybind.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/runtime.h"
#include "tern/profile.h"

namespace py = pybind11;

namespace torch_tern {
namespace {

class LogForwarder {
 public:
  static LogForwarder& Get() {
    // Leaked on purpose: tern may log from its own threads while the process
    // exits, after static destructors would have run.
    static LogForwarder* forwarder = new LogForwarder();
    return *forwarder;
  }

  // Starts forwarding to `sink` (a callable taking (level: int, message:
  // str)); replaces an earlier sink. Called with the GIL held.
  void Start(py::object sink) {
    Stop();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sink_ = std::move(sink);
      stopping_ = false;
    }
    thread_ = std::thread([this] { Run(); });
    TERN_CHECK(tern_set_log_callback(&LogForwarder::OnMessage, this));
  }

  // Sends tern's messages back to stderr, hands the ones already received to
  // the sink, and ends the thread. Called with the GIL held.
  void Stop() {
    TERN_CHECK(tern_set_log_callback(nullptr, nullptr));
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    {
      // The thread needs the GIL to deliver what is left.
      py::gil_scoped_release release;
      thread_.join();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sink_ = py::object();
  }

  bool Active() {
    std::lock_guard<std::mutex> lock(mutex_);
    return thread_.joinable() && !stopping_;
  }

 private:
  struct Message {
    int level;
    std::string text;
  };

  static void OnMessage(void* user_data, tern_log_level_t level, const char* message) {
    auto* self = static_cast<LogForwarder*>(user_data);
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      self->pending_.push_back(Message{static_cast<int>(level), message});
    }
    self->wake_.notify_one();
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
      if (pending_.empty() && stopping_) return;
      std::deque<Message> batch;
      batch.swap(pending_);
      lock.unlock();
      {
        py::gil_scoped_acquire gil;
        for (const Message& m : batch) {
          try {
            sink_(m.level, m.text);
          } catch (py::error_already_set& e) {
            // A failing sink must not end the forwarding; Python prints it.
            e.discard_as_unraisable("torch_tern's tern log sink");
          }
        }
      }
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Message> pending_;  // guarded by mutex_
  bool stopping_ = false;        // guarded by mutex_
  py::object sink_;              // set and cleared with the thread stopped
  std::thread thread_;
};

}  // namespace

void RegisterProfilingBindings(py::module& m) {
  m.def(
      "_profile_start",
      [](const std::string& path) { TERN_CHECK(tern_profile_start(path.c_str())); },
      py::arg("path"));
  m.def("_profile_stop", [] { TERN_CHECK(tern_profile_stop()); });
  m.def(
      "_forward_logs", [](py::object sink) { LogForwarder::Get().Start(std::move(sink)); },
      py::arg("sink"));
  m.def("_stop_forwarding_logs", [] { LogForwarder::Get().Stop(); });
  m.def("_forwarding_logs", [] { return LogForwarder::Get().Active(); });
}

}  // namespace torch_tern
