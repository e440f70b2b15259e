// The container of tern executables (docs/executable-format.md): the file
// header, the section table and their checksums. Shared by the builder (which
// writes it), the loader and the dumper (which read it).
#ifndef TERN_SRC_EXECUTABLE_FORMAT_H_
#define TERN_SRC_EXECUTABLE_FORMAT_H_

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status_with_message.h"
#include "tern/isa.h"

namespace tern::exe {

static_assert(std::endian::native == std::endian::little,
              "the executable format is little-endian; add byte swapping for this host");

inline constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'E', 'X', 'E', '\0'};
inline constexpr uint16_t kFormatMajor = 1;
inline constexpr uint16_t kFormatMinor = 0;
inline constexpr uint32_t kHeaderSize = 64;        // what this version writes
inline constexpr uint32_t kSectionEntrySize = 32;  // what this version writes
inline constexpr uint32_t kMaxSections = 4096;
inline constexpr uint64_t kConstantsFileAlignment = 4096;
inline constexpr uint64_t kFlatBufferAlignment = 8;
// The largest segment (constants, scratch, an input or output) any device can
// hold: 48-bit device addresses. The loader also holds each one to the
// memory of the device it loads on (LoadOptions::device_memory_bytes).
inline constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 48;
inline constexpr uint64_t kHeaderChecksumOffset = 56;
// Required-feature bits this loader understands (TERN_FEATURE_*, isa.h).
inline constexpr uint64_t kKnownRequiredFeatures =
    TERN_FEATURE_ELEMENTWISE_PROGRAMS | TERN_FEATURE_TENSOR_EPILOGUES | TERN_FEATURE_SCAN |
    TERN_FEATURE_SORT | TERN_FEATURE_SCATTER | TERN_FEATURE_F64;
// Compile-time limits of the contents (documented in the format spec).
inline constexpr uint32_t kMaxCores = 256;
inline constexpr uint64_t kMaxConstantAlignment = 4096;
inline constexpr char kTarget[] = "trn2";

enum SectionKind : uint32_t {
  kSectionModule = 1,
  kSectionConstants = 2,
  kSectionDebug = 3,
};
inline constexpr uint32_t kSectionFlagOptional = 1u << 0;

const char* SectionKindName(uint32_t kind);  // "module"; "unknown" otherwise

struct FileHeader {
  uint16_t format_major = kFormatMajor;
  uint16_t format_minor = kFormatMinor;
  uint32_t header_size = kHeaderSize;
  uint64_t file_size = 0;
  uint64_t section_table_offset = kHeaderSize;
  uint32_t section_count = 0;
  uint32_t section_entry_size = kSectionEntrySize;
  uint64_t required_features = 0;
  uint64_t optional_features = 0;
  uint64_t header_checksum = 0;
};

struct SectionEntry {
  uint32_t kind = 0;
  uint32_t flags = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// XXH3-64 of `bytes` (seed 0): the section checksum.
uint64_t Checksum(std::span<const uint8_t> bytes);
// The header checksum over the header's first `header_size` bytes (its
// checksum field read as zero) and the section table.
uint64_t HeaderChecksum(std::span<const uint8_t> header, std::span<const uint8_t> table);

// Serializes a 1.0 header (64 bytes) / a 1.0 section entry (32 bytes).
void EncodeHeader(const FileHeader& header, uint8_t out[kHeaderSize]);
void EncodeSectionEntry(const SectionEntry& entry, uint8_t out[kSectionEntrySize]);
// Reads the fields of the first 64 bytes (no checks).
FileHeader DecodeHeader(const uint8_t in[kHeaderSize]);
SectionEntry DecodeSectionEntry(const uint8_t* in);

// A checked container: header, table, and where the known sections are.
struct Container {
  FileHeader header;
  std::vector<SectionEntry> sections;  // every entry, in table order
  std::span<const uint8_t> module;
  std::span<const uint8_t> debug;  // empty when has_debug is false
  bool has_debug = false;
  bool has_constants = false;
  uint64_t constants_offset = 0;  // in the file
  uint64_t constants_size = 0;
};

struct ContainerOptions {
  // Off only for the dumper, which reports mismatches instead of failing.
  bool verify_checksums = true;
};

// Checks rules 1 and 2 of the spec's loader checks (header, version,
// features, section table, checksums) and locates the sections.
Status ParseContainer(std::span<const uint8_t> data, const ContainerOptions& options,
                      Container* out);

// Lays out and writes a container whose sections are given as byte spans.
// Used by the builder: `Plan` assigns offsets, the writer streams the bytes.
struct SectionSource {
  uint32_t kind = 0;
  uint32_t flags = 0;
  std::span<const uint8_t> bytes;
};
struct ContainerPlan {
  std::vector<uint8_t> head;  // header + section table (+ padding up to the first section)
  struct Piece {
    uint64_t offset;
    std::span<const uint8_t> bytes;
  };
  std::vector<Piece> pieces;  // in file order, after `head`
  uint64_t file_size = 0;
};
// Sections are placed in the given order; CONSTANTS at a 4096 multiple, the
// others at multiples of 8. Checksums are computed here. `required_features`
// goes into the header.
ContainerPlan PlanContainer(std::span<const SectionSource> sections,
                            uint64_t required_features = 0);

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_FORMAT_H_
