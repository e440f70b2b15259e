#include "compiler/graph_file/container.h"

#include <absl/status/status.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tern::compiler {
namespace {

// Every field after the magic with its byte offset (docs/graph-format.md):
// one list that the encoder and the decoder both walk.
template <typename H, typename Fn>
void ForEachHeaderField(H& h, Fn&& fn) {
  fn(8, h.format_major);
  fn(10, h.format_minor);
  fn(12, h.header_size);
  fn(16, h.file_size);
  fn(24, h.required_features);
  fn(32, h.optional_features);
  fn(40, h.graph_offset);
  fn(48, h.graph_size);
  fn(56, h.graph_checksum);
  fn(64, h.constants_offset);
  fn(72, h.constants_size);
  fn(80, h.constants_checksum);
  fn(kGraphFileHeaderChecksumOffset, h.header_checksum);
}

constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

std::string HexBytes(std::span<const uint8_t> bytes) {
  std::string text;
  for (uint8_t b : bytes) {
    if (!text.empty()) text += ' ';
    text += fmt::format("{:02x}", b);
  }
  return text;
}

constexpr const char* kRewrite = "write the graph file again";

absl::Status CheckMagicAndVersion(std::span<const uint8_t> bytes, GraphFileHeader* header) {
  if (bytes.size() < sizeof(kGraphFileMagic) ||
      std::memcmp(bytes.data(), kGraphFileMagic, sizeof(kGraphFileMagic)) != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 0: the data does not start with the magic \"TERNGRPH\" (it starts with {}): it is "
        "not a tern graph file; write one with tern::compiler::WriteGraph",
        bytes.empty() ? std::string("nothing")
                      : HexBytes(bytes.first(std::min<size_t>(8, bytes.size())))));
  }
  if (bytes.size() < kGraphFileHeaderSize) {
    return absl::InvalidArgumentError(
        fmt::format("the graph file is {} bytes, less than its {}-byte header: it is truncated; {}",
                    bytes.size(), kGraphFileHeaderSize, kRewrite));
  }
  *header = DecodeGraphFileHeader(bytes.data());
  if (header->format_major > kGraphFormatMajor) {
    return absl::FailedPreconditionError(fmt::format(
        "byte 8: the graph file has format version {}.{}, but this reader reads format {}.x "
        "only: it was written by a newer tern; upgrade tern, or have the writer produce format "
        "{}.{}",
        header->format_major, header->format_minor, kGraphFormatMajor, kGraphFormatMajor,
        kGraphFormatMinor));
  }
  if (header->format_major < kGraphFormatMajor) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 8: the graph file claims format version {}.{}, which never existed (the first is "
        "1.0): the header is damaged; {}",
        header->format_major, header->format_minor, kRewrite));
  }
  return absl::OkStatus();
}

absl::Status CheckHeaderSizes(const GraphFileHeader& header, uint64_t size) {
  if (header.header_size < kGraphFileHeaderSize || header.header_size % 8 != 0 ||
      header.header_size > size) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 12: the header says it is {} bytes, but it must be a multiple of 8, at least {}, "
        "and fit in the {}-byte file: the header is damaged; {}",
        header.header_size, kGraphFileHeaderSize, size, kRewrite));
  }
  if (header.file_size != size) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 16: the header says the file is {} bytes but {} bytes were given: {}; pass the "
        "whole file, or {}",
        header.file_size, size,
        header.file_size > size ? "it is truncated" : "there are trailing bytes", kRewrite));
  }
  return absl::OkStatus();
}

absl::Status CheckHeaderChecksum(std::span<const uint8_t> bytes, const GraphFileHeader& header) {
  const uint64_t actual = GraphHeaderChecksum(bytes.first(header.header_size));
  if (actual != header.header_checksum) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 88: the header checksum is {:#018x} but the header says {:#018x}: the file was "
        "modified or damaged after it was written; copy it again or {}",
        actual, header.header_checksum, kRewrite));
  }
  return absl::OkStatus();
}

absl::Status CheckRequiredFeatures(const GraphFileHeader& header) {
  const uint64_t unknown = header.required_features & ~kKnownRequiredGraphFeatures;
  if (unknown != 0) {
    return absl::FailedPreconditionError(fmt::format(
        "byte 24: the graph file requires feature bits {:#x} that this reader (format {}.{}) "
        "does not know: it was written for a newer tern; upgrade tern, or write the graph "
        "without those features",
        unknown, kGraphFormatMajor, kGraphFormatMinor));
  }
  return absl::OkStatus();
}

// The graph section lies after the header, the constants section after the
// graph section, both aligned and inside the file (overflow-safe: every sum
// is compared as a difference against the size).
absl::Status CheckSectionBounds(const GraphFileHeader& header, uint64_t size) {
  if (header.graph_offset < header.header_size ||
      header.graph_offset % kGraphSectionAlignment != 0 || header.graph_offset > size ||
      header.graph_size > size - header.graph_offset) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 40: the graph section ({} bytes at offset {}) must start after the {}-byte header "
        "at a multiple of {} and end inside the {}-byte file: the file is truncated or "
        "damaged; {}",
        header.graph_size, header.graph_offset, header.header_size, kGraphSectionAlignment, size,
        kRewrite));
  }
  const uint64_t graph_end = header.graph_offset + header.graph_size;
  if (header.constants_offset < graph_end || header.constants_offset % kConstantAlignment != 0 ||
      header.constants_offset > size || header.constants_size > size - header.constants_offset) {
    return absl::InvalidArgumentError(fmt::format(
        "byte 64: the constants section ({} bytes at offset {}) must start after the graph "
        "section (which ends at {}) at a multiple of {} and end inside the {}-byte file: the "
        "file is truncated or damaged; {}",
        header.constants_size, header.constants_offset, graph_end, kConstantAlignment, size,
        kRewrite));
  }
  return absl::OkStatus();
}

absl::Status CheckSectionChecksum(std::span<const uint8_t> section, uint64_t expected,
                                  const char* name, uint64_t offset, int field_byte) {
  const uint64_t actual = GraphSectionChecksum(section);
  if (actual != expected) {
    return absl::InvalidArgumentError(fmt::format(
        "byte {}: the {} section ({} bytes at offset {}) has checksum {:#018x} but the header "
        "says {:#018x}: the file was modified or damaged after it was written; copy it again "
        "or {}",
        field_byte, name, section.size(), offset, actual, expected, kRewrite));
  }
  return absl::OkStatus();
}

}  // namespace

void EncodeGraphFileHeader(const GraphFileHeader& header, uint8_t* out) {
  std::memset(out, 0, kGraphFileHeaderSize);
  std::memcpy(out, kGraphFileMagic, sizeof(kGraphFileMagic));
  ForEachHeaderField(header, [&](size_t offset, const auto& field) {
    std::memcpy(out + offset, &field, sizeof(field));  // little-endian host (checked below)
  });
}

GraphFileHeader DecodeGraphFileHeader(const uint8_t* in) {
  GraphFileHeader header;
  ForEachHeaderField(
      header, [&](size_t offset, auto& field) { std::memcpy(&field, in + offset, sizeof(field)); });
  return header;
}

static_assert(std::endian::native == std::endian::little,
              "the graph file is little-endian and is read and written with memcpy");

uint64_t GraphSectionChecksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t GraphHeaderChecksum(std::span<const uint8_t> header) {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  const size_t field = kGraphFileHeaderChecksumOffset;
  const uint8_t zeros[8] = {};
  XXH3_64bits_update(&state, header.data(), std::min(field, header.size()));
  if (header.size() > field) {
    XXH3_64bits_update(&state, zeros, std::min<size_t>(8, header.size() - field));
  }
  if (header.size() > field + 8) {
    XXH3_64bits_update(&state, header.data() + field + 8, header.size() - field - 8);
  }
  return XXH3_64bits_digest(&state);
}

std::vector<uint8_t> AssembleGraphFile(std::span<const uint8_t> graph_section,
                                       uint64_t constants_size,
                                       std::span<const ConstantPiece> constants) {
  GraphFileHeader header;
  header.graph_offset = AlignUp(kGraphFileHeaderSize, kGraphSectionAlignment);
  header.graph_size = graph_section.size();
  header.constants_offset = AlignUp(header.graph_offset + header.graph_size, kConstantAlignment);
  header.constants_size = constants_size;
  header.file_size = header.constants_offset + header.constants_size;

  // The constants are copied once, straight to their place in the file.
  std::vector<uint8_t> file(header.file_size, 0);
  if (!graph_section.empty()) {
    std::memcpy(file.data() + header.graph_offset, graph_section.data(), graph_section.size());
  }
  for (const ConstantPiece& piece : constants) {
    if (!piece.bytes.empty()) {
      std::memcpy(file.data() + header.constants_offset + piece.offset, piece.bytes.data(),
                  piece.bytes.size());
    }
  }
  const std::span<const uint8_t> bytes(file);
  header.graph_checksum =
      GraphSectionChecksum(bytes.subspan(header.graph_offset, header.graph_size));
  header.constants_checksum =
      GraphSectionChecksum(bytes.subspan(header.constants_offset, header.constants_size));
  EncodeGraphFileHeader(header, file.data());
  header.header_checksum = GraphHeaderChecksum(bytes.first(kGraphFileHeaderSize));
  EncodeGraphFileHeader(header, file.data());
  return file;
}

absl::StatusOr<GraphFileSections> ParseGraphFileContainer(std::span<const uint8_t> bytes) {
  GraphFileSections sections;
  GraphFileHeader& header = sections.header;
  if (absl::Status s = CheckMagicAndVersion(bytes, &header); !s.ok()) return s;
  if (absl::Status s = CheckHeaderSizes(header, bytes.size()); !s.ok()) return s;
  if (absl::Status s = CheckHeaderChecksum(bytes, header); !s.ok()) return s;
  if (absl::Status s = CheckRequiredFeatures(header); !s.ok()) return s;
  if (absl::Status s = CheckSectionBounds(header, bytes.size()); !s.ok()) return s;
  sections.graph = bytes.subspan(header.graph_offset, header.graph_size);
  sections.constants = bytes.subspan(header.constants_offset, header.constants_size);
  if (absl::Status s = CheckSectionChecksum(sections.graph, header.graph_checksum, "graph",
                                            header.graph_offset, 56);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckSectionChecksum(sections.constants, header.constants_checksum,
                                            "constants", header.constants_offset, 80);
      !s.ok()) {
    return s;
  }
  return sections;
}

void RecomputeGraphFileChecksums(std::span<uint8_t> bytes) {
  if (bytes.size() < kGraphFileHeaderSize) return;
  GraphFileHeader header = DecodeGraphFileHeader(bytes.data());
  const uint64_t size = bytes.size();
  auto store = [&](size_t offset, uint64_t value) {
    std::memcpy(bytes.data() + offset, &value, sizeof(value));
  };
  if (header.graph_offset <= size && header.graph_size <= size - header.graph_offset) {
    store(56, GraphSectionChecksum(bytes.subspan(header.graph_offset, header.graph_size)));
  }
  if (header.constants_offset <= size && header.constants_size <= size - header.constants_offset) {
    store(80, GraphSectionChecksum(bytes.subspan(header.constants_offset, header.constants_size)));
  }
  const uint64_t header_bytes =
      header.header_size >= kGraphFileHeaderSize && header.header_size <= size
          ? header.header_size
          : kGraphFileHeaderSize;
  store(kGraphFileHeaderChecksumOffset, GraphHeaderChecksum(bytes.first(header_bytes)));
}

}  // namespace tern::compiler
