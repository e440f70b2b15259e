// The fixed binary container of a tern graph file (docs/graph-format.md,
// "Container"): a 96-byte little-endian header, then the graph section (a
// FlatBuffer, tern_graph.fbs) and the constants section (raw bytes), each
// with its own XXH3-64 checksum. This header is the one place that knows
// the byte layout; graph_file.cc, the tests and the fuzzer use it.
#ifndef TERN_COMPILER_GRAPH_FILE_CONTAINER_H_
#define TERN_COMPILER_GRAPH_FILE_CONTAINER_H_

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tern::compiler {

inline constexpr uint8_t kGraphFileMagic[8] = {'T', 'E', 'R', 'N', 'G', 'R', 'P', 'H'};
inline constexpr uint16_t kGraphFormatMajor = 1;
inline constexpr uint16_t kGraphFormatMinor = 0;
inline constexpr uint32_t kGraphFileHeaderSize = 96;  // what 1.0 writes; at least this
inline constexpr size_t kGraphFileHeaderChecksumOffset = 88;
// Feature bits this reader understands (none in 1.0).
inline constexpr uint64_t kKnownRequiredGraphFeatures = 0;
// The graph section's offset (FlatBuffers' largest scalar) and the constants
// section's and each constant's (vector loads of weights mapped in place).
inline constexpr uint64_t kGraphSectionAlignment = 8;
inline constexpr uint64_t kConstantAlignment = 64;

// The header's fields after the magic, as 1.0 defines them.
struct GraphFileHeader {
  uint16_t format_major = kGraphFormatMajor;
  uint16_t format_minor = kGraphFormatMinor;
  uint32_t header_size = kGraphFileHeaderSize;
  uint64_t file_size = 0;
  uint64_t required_features = 0;
  uint64_t optional_features = 0;
  uint64_t graph_offset = 0;
  uint64_t graph_size = 0;
  uint64_t graph_checksum = 0;
  uint64_t constants_offset = 0;
  uint64_t constants_size = 0;
  uint64_t constants_checksum = 0;
  uint64_t header_checksum = 0;
};

// Writes the magic and the fields into the first kGraphFileHeaderSize bytes
// of `out`. Thread-safety: a pure function of its arguments.
void EncodeGraphFileHeader(const GraphFileHeader& header, uint8_t* out);
// Reads the fields from the first kGraphFileHeaderSize bytes of `in` (the
// magic is not checked). Thread-safety: a pure function of its argument.
GraphFileHeader DecodeGraphFileHeader(const uint8_t* in);

// XXH3-64 (seed 0) of a section's bytes. Thread-safety: pure.
uint64_t GraphSectionChecksum(std::span<const uint8_t> bytes);
// XXH3-64 (seed 0) of the whole header, `header_size` bytes, with the
// checksum field (bytes 88..95) taken as zero. Thread-safety: pure.
uint64_t GraphHeaderChecksum(std::span<const uint8_t> header);

// One constant's bytes and where they go in the constants section.
struct ConstantPiece {
  uint64_t offset = 0;  // from the start of the constants section
  std::span<const uint8_t> bytes;
};

// A whole file: the header, the graph section at offset 96 and the
// constants section (`constants_size` bytes holding `constants`, zeros
// elsewhere) at the next multiple of 64, all checksums filled in. Every
// piece must lie inside the constants section.
// Thread-safety: a pure function of its arguments.
std::vector<uint8_t> AssembleGraphFile(std::span<const uint8_t> graph_section,
                                       uint64_t constants_size,
                                       std::span<const ConstantPiece> constants);

// The two sections of a file whose container checks passed.
struct GraphFileSections {
  GraphFileHeader header;
  std::span<const uint8_t> graph;      // the FlatBuffer
  std::span<const uint8_t> constants;  // raw bytes
};

// Checks the container (magic, version, sizes, bounds, alignment, feature
// bits, checksums) and locates the sections inside `bytes`. Errors are
// InvalidArgument, or FailedPrecondition for a newer major version or an
// unknown required feature. Thread-safety: a pure function of its argument.
absl::StatusOr<GraphFileSections> ParseGraphFileContainer(std::span<const uint8_t> bytes);

// Recomputes the header and section checksums of `bytes` in place wherever
// the header can be read and a section lies inside the data: for tests and
// the fuzzer, which alter files and still want to get past the checksums.
// Thread-safety: the caller owns `bytes`.
void RecomputeGraphFileChecksums(std::span<uint8_t> bytes);

}  // namespace tern::compiler

#endif  // TERN_COMPILER_GRAPH_FILE_CONTAINER_H_
