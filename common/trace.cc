#include "common/trace.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "common/logging.h"

namespace tern::trace {
namespace {

// Past this many events the oldest are kept and later ones dropped (counted).
constexpr size_t kMaxEvents = 2'000'000;

struct Track {
  uint32_t device;
  uint32_t core;
  std::string name;
};

struct Event {
  uint32_t track;
  std::string name;
  std::string category;
  uint64_t start_ns;
  uint64_t end_ns;
  std::string args;
};

struct Recorder {
  std::mutex mutex;
  std::string path;               // where the running (or last) capture goes
  bool from_environment = false;  // TERN_TRACE's capture: written by Flush at exit
  std::vector<Track> tracks;      // id = index + 1; kept across captures
  std::vector<Event> events;
  uint64_t dropped = 0;
  bool dirty = false;
};

// Whether a capture runs: read on every command, so an atomic beside the
// recorder's lock.
std::atomic<bool> g_recording{false};

Recorder* GetRecorder() {
  static Recorder* recorder = [] {
    auto* created = new Recorder;  // never destroyed: queues may record at exit
    const char* path = std::getenv("TERN_TRACE");
    if (path != nullptr && *path != '\0') {
      created->path = path;
      created->from_environment = true;
      g_recording.store(true, std::memory_order_release);
      std::atexit([] { Flush(); });
    }
    return created;
  }();
  return recorder;
}

void AppendEscaped(std::string* out, std::string_view text) {
  for (char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          *out += buffer;
        } else {
          *out += c;
        }
    }
  }
}

// Perfetto groups tracks by pid: one per (device, core) gives per-core lanes.
uint32_t CorePid(const Track& track) { return 1000 + track.device * 100 + track.core; }

}  // namespace

bool Recording() {
  static Recorder* const recorder = GetRecorder();  // reads TERN_TRACE once
  (void)recorder;
  return g_recording.load(std::memory_order_acquire);
}

uint32_t RegisterTrack(uint32_t device, uint32_t core, std::string_view queue_name) {
  Recorder* recorder = GetRecorder();
  std::lock_guard<std::mutex> lock(recorder->mutex);
  recorder->tracks.push_back(Track{device, core, std::string(queue_name)});
  return static_cast<uint32_t>(recorder->tracks.size());
}

void Span(uint32_t track, std::string_view name, std::string_view category, uint64_t start_ns,
          uint64_t end_ns, std::string args_json) {
  if (track == 0 || !Recording()) return;
  Recorder* recorder = GetRecorder();
  std::lock_guard<std::mutex> lock(recorder->mutex);
  if (recorder->events.size() >= kMaxEvents) {
    ++recorder->dropped;
    return;
  }
  recorder->events.push_back(Event{track, std::string(name), std::string(category), start_ns,
                                   end_ns, std::move(args_json)});
  recorder->dirty = true;
}

namespace {

// Writes the recorder's events to its path (temporary file, then rename).
// Called with the recorder's lock held.
Status WriteLocked(Recorder* recorder) {
  std::string out = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  bool first = true;
  auto begin_event = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  std::vector<bool> named_core(1 << 16, false);
  for (size_t i = 0; i < recorder->tracks.size(); ++i) {
    const Track& track = recorder->tracks[i];
    const uint32_t pid = CorePid(track);
    if (pid < named_core.size() && !named_core[pid]) {
      named_core[pid] = true;
      begin_event();
      out += fmt::format(
          "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},"
          "\"args\":{{\"name\":\"tern device {} core {}\"}}}}",
          pid, track.device, track.core);
    }
    begin_event();
    out += fmt::format(
        "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"", pid,
        i + 1);
    AppendEscaped(&out, "queue " + track.name);
    out += "\"}}";
  }
  for (const Event& event : recorder->events) {
    const Track& track = recorder->tracks[event.track - 1];
    begin_event();
    out += "{\"ph\":\"X\",\"name\":\"";
    AppendEscaped(&out, event.name);
    out += "\",\"cat\":\"";
    AppendEscaped(&out, event.category);
    // Microseconds with nanosecond precision, as the format expects.
    out += fmt::format("\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f}", CorePid(track),
                       event.track, static_cast<double>(event.start_ns) / 1e3,
                       static_cast<double>(event.end_ns - event.start_ns) / 1e3);
    out += ",\"args\":{";
    out += event.args;
    out += "}}";
  }
  out += fmt::format(
      "\n],\"otherData\":{{\"producer\":\"tern\",\"pid\":{},\"dropped_events\":{}}}}}\n", getpid(),
      recorder->dropped);
  const std::string temp = recorder->path + ".tmp";
  FILE* file = std::fopen(temp.c_str(), "w");
  if (file == nullptr) {
    return ErrnoStatus(TERN_ERROR_IO, errno,
                       fmt::format("writing the trace to {}: check the directory exists and is "
                                   "writable",
                                   temp));
  }
  bool ok = std::fwrite(out.data(), 1, out.size(), file) == out.size();
  const int write_errno = errno;
  ok = (std::fclose(file) == 0) && ok;
  if (!ok) {
    std::remove(temp.c_str());
    return ErrnoStatus(
        TERN_ERROR_IO, write_errno,
        fmt::format("writing {} bytes of trace to {} (is the disk full?)", out.size(), temp));
  }
  if (std::rename(temp.c_str(), recorder->path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp.c_str());
    return ErrnoStatus(TERN_ERROR_IO, rename_errno,
                       fmt::format("renaming the trace {} to {}", temp, recorder->path));
  }
  recorder->dirty = false;
  return OkStatus();
}

}  // namespace

bool Flush() {
  Recorder* recorder = GetRecorder();
  std::lock_guard<std::mutex> lock(recorder->mutex);
  if (!recorder->from_environment) return true;
  if (!recorder->dirty && !recorder->tracks.empty()) return true;
  const Status written = WriteLocked(recorder);
  if (!written.ok()) {
    TERN_LOG_ERROR("could not write the trace of TERN_TRACE={}: {}", recorder->path,
                   written.message());
    return false;
  }
  return true;
}

Status Start(const std::string& path) {
  if (path.empty()) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "the trace's path is empty; pass the file the capture should be written to");
  }
  Recorder* recorder = GetRecorder();
  std::lock_guard<std::mutex> lock(recorder->mutex);
  if (g_recording.load(std::memory_order_acquire)) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "a capture into {} is already running{}; stop it first (one capture at a "
                      "time)",
                      recorder->path,
                      recorder->from_environment ? " (from TERN_TRACE: it lasts until exit)" : "");
  }
  recorder->path = path;
  recorder->events.clear();
  recorder->dropped = 0;
  recorder->dirty = true;
  g_recording.store(true, std::memory_order_release);
  return OkStatus();
}

Status Stop() {
  Recorder* recorder = GetRecorder();
  std::lock_guard<std::mutex> lock(recorder->mutex);
  if (!g_recording.load(std::memory_order_acquire)) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "no capture is running; start one with tern_profile_start()");
  }
  if (recorder->from_environment) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "the running capture is TERN_TRACE's ({}), which is written at exit; unset "
                      "TERN_TRACE to make captures with tern_profile_start() and _stop()",
                      recorder->path);
  }
  g_recording.store(false, std::memory_order_release);
  const Status written = WriteLocked(recorder);
  recorder->events.clear();
  recorder->events.shrink_to_fit();
  return written;
}

}  // namespace tern::trace
