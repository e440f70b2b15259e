// Tracing of device activity to a Perfetto / Chrome trace file.
//
// While a capture runs, every command a queue runs (copies, fills,
// executions and their instructions, event waits, host callbacks) is
// recorded as a complete event. A capture either comes from TERN_TRACE=path
// (it starts with the process; the file is written when the runtime shuts
// down and at process exit) or from Start/Stop (tern_profile_start/stop,
// include/tern/profile.h). Tracks: one "process" per core ("tern device 0
// core 1"), one "thread" per queue; every queue has its track whether or not
// a capture runs. Open the file in ui.perfetto.dev or chrome://tracing.
#ifndef TERN_COMMON_TRACE_H_
#define TERN_COMMON_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status_with_message.h"

namespace tern::trace {

// True while a capture runs. Cheap (an atomic load): checked per command.
// Thread-safety: any thread.
bool Recording();

// Registers a queue's track and returns its id (never 0).
// Thread-safety: any thread.
uint32_t RegisterTrack(uint32_t device, uint32_t core, std::string_view queue_name);

// Records one span on `track`. `args_json` is a JSON object's members without
// braces ("\"bytes\": 4096") or empty. Thread-safety: any thread.
void Span(uint32_t track, std::string_view name, std::string_view category, uint64_t start_ns,
          uint64_t end_ns, std::string args_json = {});

// Writes TERN_TRACE's file now (also done at exit; nothing for a capture
// made by Start). Returns false on I/O error, which is logged.
// Thread-safety: any thread.
bool Flush();

// Starts a capture to be written to `path` by Stop. Fails (FAILED_PRECONDITION)
// while another capture runs, TERN_TRACE's included.
// Thread-safety: any thread.
Status Start(const std::string& path);

// Ends the capture Start began and writes its file.
// Thread-safety: any thread.
Status Stop();

}  // namespace tern::trace

#endif  // TERN_COMMON_TRACE_H_
