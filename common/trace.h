// Tracing of device activity to a Perfetto / Chrome trace file.
//
// With TERN_TRACE=path set, every command a queue runs (copies, fills,
// executions and their instructions, event waits, host callbacks) is recorded
// as a complete event; the file is written when the runtime shuts down (and
// at process exit). Tracks: one "process" per core ("tern device 0 core 1"),
// one "thread" per queue. Open the file in ui.perfetto.dev or chrome://tracing.
#ifndef TERN_COMMON_TRACE_H_
#define TERN_COMMON_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace tern::trace {

// True when TERN_TRACE names a file. Cheap: read once.
bool Enabled();

// Registers a queue's track and returns its id (0 when tracing is off).
// Thread-safety: any thread.
uint32_t RegisterTrack(uint32_t device, uint32_t core, std::string_view queue_name);

// Records one span on `track`. `args_json` is a JSON object's members without
// braces ("\"bytes\": 4096") or empty. Thread-safety: any thread.
void Span(uint32_t track, std::string_view name, std::string_view category, uint64_t start_ns,
          uint64_t end_ns, std::string args_json = {});

// Writes the trace file now (also done at exit). Returns false on I/O error,
// which is logged. Thread-safety: any thread.
bool Flush();

}  // namespace tern::trace

#endif  // TERN_COMMON_TRACE_H_
