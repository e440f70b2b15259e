// libFuzzer target for the graph file reader (compiler/graph_file,
// docs/graph-format.md): ReadGraph on arbitrary bytes, the container checks,
// the FlatBuffers verifier, the structural checks and VerifyGraph.
//
// Random mutations almost never keep the XXH3 checksums right, which would
// stop the fuzzer at the first check. So every input runs twice: once as
// given, and once with its header and section checksums recomputed where the
// header can be read, which lets mutations reach everything behind them.
//
// Invariants checked: no crash, hang or sanitizer report; a rejection is
// InvalidArgument, FailedPrecondition or (VerifyGraph: an operator the
// compiler does not know) Unimplemented, with a message; an accepted graph
// can be written again, and what is written reads back and writes to the
// same bytes (the writer is deterministic and the reader loses nothing).
#include <absl/status/status.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "compiler/graph_file/container.h"
#include "compiler/graph_file/graph_file.h"

namespace {

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "graph_fuzzer invariant failed: %s\n", what);
    std::abort();
  }
}

void ReadAndCheck(std::span<const uint8_t> data) {
  absl::StatusOr<tern::compiler::Graph> graph = tern::compiler::ReadGraph(data);
  if (!graph.ok()) {
    const absl::StatusCode code = graph.status().code();
    Check(code == absl::StatusCode::kInvalidArgument ||
              code == absl::StatusCode::kFailedPrecondition ||
              code == absl::StatusCode::kUnimplemented,
          "a rejection is InvalidArgument, FailedPrecondition or Unimplemented");
    Check(!graph.status().message().empty(), "a rejection has a message");
    return;
  }
  absl::StatusOr<std::vector<uint8_t>> written = tern::compiler::WriteGraph(*graph);
  Check(written.ok(), "an accepted graph can be written");
  absl::StatusOr<tern::compiler::Graph> again = tern::compiler::ReadGraph(*written);
  Check(again.ok(), "a written graph reads back");
  absl::StatusOr<std::vector<uint8_t>> rewritten = tern::compiler::WriteGraph(*again);
  Check(rewritten.ok() && *rewritten == *written, "writing is deterministic and lossless");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ReadAndCheck({data, size});
  std::vector<uint8_t> fixed(data, data + size);
  tern::compiler::RecomputeGraphFileChecksums(fixed);
  ReadAndCheck(fixed);
  return 0;
}
