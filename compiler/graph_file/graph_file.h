// The versioned graph file (docs/graph-format.md): a compiler Graph in one
// file, so that a C program or another framework can hand a graph to the
// compiler without Python. A small checksummed container holds the graph as
// a FlatBuffer (tern_graph.fbs) and the constants' bytes, 64-byte aligned,
// in a section of their own.
//
// Reading validates everything before it trusts anything: the container
// (sizes, offsets, version, checksums), the FlatBuffer (its verifier), the
// graph's structure (ids, kinds, topological order, attributes, constants)
// and finally the operators' rules (VerifyGraph). Writing is deterministic:
// equal graphs give identical bytes.
#ifndef TERN_COMPILER_GRAPH_FILE_GRAPH_FILE_H_
#define TERN_COMPILER_GRAPH_FILE_GRAPH_FILE_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace tern::compiler {

// The graph in the graph file `bytes`. Never reads outside `bytes`, whatever
// they hold. Errors are InvalidArgument, saying what is wrong, where (byte
// offset, node or value) and what to do; FailedPrecondition for a file of a
// newer major format version, or with a required feature, dtype or kind this
// reader does not know; VerifyGraph's own code for a graph it rejects
// (Unimplemented for an operator the compiler does not know). `bytes` need
// not be aligned.
// Thread-safety: a pure function of its argument.
absl::StatusOr<Graph> ReadGraph(std::span<const uint8_t> bytes);

// ReadGraph on the contents of the file at `path`; a file that cannot be
// read gives the error of the system call (NotFound, PermissionDenied, ...).
// Thread-safety: safe from any thread; the file must not change meanwhile.
absl::StatusOr<Graph> ReadGraphFile(const std::string& path);

// The graph file of `graph`, which must pass VerifyGraph (else its error).
// Deterministic: equal graphs give identical bytes.
// Thread-safety: a pure function of its argument.
absl::StatusOr<std::vector<uint8_t>> WriteGraph(const Graph& graph);

// Writes WriteGraph(graph) to `path`, replacing any file there atomically:
// the bytes go to a temporary file in the same directory, which is synced
// and then renamed over `path`. On failure `path` is unchanged and no
// temporary file is left.
// Thread-safety: safe from any thread; concurrent writers of one path leave
// one of their files whole.
absl::Status WriteGraphFile(const Graph& graph, const std::string& path);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_GRAPH_FILE_GRAPH_FILE_H_
