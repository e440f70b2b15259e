#include "common/trace.h"

#include <unistd.h>

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
  std::string path;
  std::vector<Track> tracks;  // id = index + 1
  std::vector<Event> events;
  uint64_t dropped = 0;
  bool dirty = false;
};

Recorder* GetRecorder() {
  static Recorder* recorder = [] {
    const char* path = std::getenv("TERN_TRACE");
    if (path == nullptr || *path == '\0') return static_cast<Recorder*>(nullptr);
    auto* created = new Recorder;
    created->path = path;
    std::atexit([] { Flush(); });
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

bool Enabled() { return GetRecorder() != nullptr; }

uint32_t RegisterTrack(uint32_t device, uint32_t core, std::string_view queue_name) {
  Recorder* recorder = GetRecorder();
  if (recorder == nullptr) return 0;
  std::lock_guard<std::mutex> lock(recorder->mutex);
  recorder->tracks.push_back(Track{device, core, std::string(queue_name)});
  return static_cast<uint32_t>(recorder->tracks.size());
}

void Span(uint32_t track, std::string_view name, std::string_view category, uint64_t start_ns,
          uint64_t end_ns, std::string args_json) {
  Recorder* recorder = GetRecorder();
  if (recorder == nullptr || track == 0) return;
  std::lock_guard<std::mutex> lock(recorder->mutex);
  if (recorder->events.size() >= kMaxEvents) {
    ++recorder->dropped;
    return;
  }
  recorder->events.push_back(Event{track, std::string(name), std::string(category), start_ns,
                                   end_ns, std::move(args_json)});
  recorder->dirty = true;
}

bool Flush() {
  Recorder* recorder = GetRecorder();
  if (recorder == nullptr) return true;
  std::lock_guard<std::mutex> lock(recorder->mutex);
  if (!recorder->dirty && !recorder->tracks.empty()) return true;
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
  bool ok = file != nullptr && std::fwrite(out.data(), 1, out.size(), file) == out.size();
  if (file != nullptr) ok = (std::fclose(file) == 0) && ok;
  if (ok) ok = std::rename(temp.c_str(), recorder->path.c_str()) == 0;
  if (!ok) {
    TERN_LOG_ERROR(
        "could not write the trace to TERN_TRACE={}: check the directory exists and is "
        "writable",
        recorder->path);
    return false;
  }
  recorder->dirty = false;
  return true;
}

}  // namespace tern::trace
