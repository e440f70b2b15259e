#include "src/executable/format.h"

#include <algorithm>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tern::exe {
namespace {

template <typename T>
void LoadInto(const uint8_t* p, T* value) {
  std::memcpy(value, p, sizeof(T));
}

template <typename T>
void Store(uint8_t* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

// The header's fields after the magic, and a section entry's fields, with
// their offsets in the file (docs/executable-format.md): one list that the
// encoder and the decoder both walk, so the layout is written once.
// `fn(offset, field)` gets each field by reference (const when H is).
template <typename H, typename Fn>
void ForEachHeaderField(H& h, Fn&& fn) {
  fn(8, h.format_major);
  fn(10, h.format_minor);
  fn(12, h.header_size);
  fn(16, h.file_size);
  fn(24, h.section_table_offset);
  fn(32, h.section_count);
  fn(36, h.section_entry_size);
  fn(40, h.required_features);
  fn(48, h.optional_features);
  fn(kHeaderChecksumOffset, h.header_checksum);
}

template <typename E, typename Fn>
void ForEachSectionField(E& e, Fn&& fn) {
  fn(0, e.kind);
  fn(4, e.flags);
  fn(8, e.offset);
  fn(16, e.size);
  fn(24, e.checksum);
}

std::string HexBytes(std::span<const uint8_t> bytes) {
  std::string text;
  for (uint8_t b : bytes) {
    if (!text.empty()) text += ' ';
    text += fmt::format("{:02x}", b);
  }
  return text;
}

std::string DescribeBits(uint64_t bits) {
  std::string text;
  for (int bit = 0; bit < 64; ++bit) {
    if ((bits >> bit) & 1) {
      if (!text.empty()) text += ", ";
      text += fmt::format("{}", bit);
    }
  }
  return text;
}

std::string DescribeSection(size_t index, const SectionEntry& entry) {
  return fmt::format("section {} ({}, kind {}, offset {}, {} bytes)", index,
                     SectionKindName(entry.kind), entry.kind, entry.offset, entry.size);
}

constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

}  // namespace

const char* SectionKindName(uint32_t kind) {
  switch (kind) {
    case kSectionModule:
      return "module";
    case kSectionConstants:
      return "constants";
    case kSectionDebug:
      return "debug";
    default:
      return "unknown";
  }
}

uint64_t Checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t HeaderChecksum(std::span<const uint8_t> header, std::span<const uint8_t> table) {
  // Hash the header with its checksum field zeroed, without copying it all.
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  const size_t field = kHeaderChecksumOffset;
  const uint8_t zeros[8] = {};
  XXH3_64bits_update(&state, header.data(), std::min(field, header.size()));
  if (header.size() > field) {
    XXH3_64bits_update(&state, zeros, std::min<size_t>(8, header.size() - field));
  }
  if (header.size() > field + 8) {
    XXH3_64bits_update(&state, header.data() + field + 8, header.size() - field - 8);
  }
  const uint64_t seed = XXH3_64bits_digest(&state);
  return XXH3_64bits_withSeed(table.data(), table.size(), seed);
}

void EncodeHeader(const FileHeader& header, uint8_t out[kHeaderSize]) {
  std::memset(out, 0, kHeaderSize);
  std::memcpy(out, kMagic, sizeof(kMagic));
  ForEachHeaderField(header, [&](size_t offset, const auto& field) { Store(out + offset, field); });
}

void EncodeSectionEntry(const SectionEntry& entry, uint8_t out[kSectionEntrySize]) {
  ForEachSectionField(entry, [&](size_t offset, const auto& field) { Store(out + offset, field); });
}

FileHeader DecodeHeader(const uint8_t in[kHeaderSize]) {
  FileHeader header;
  ForEachHeaderField(header, [&](size_t offset, auto& field) { LoadInto(in + offset, &field); });
  return header;
}

SectionEntry DecodeSectionEntry(const uint8_t* in) {
  SectionEntry entry;
  ForEachSectionField(entry, [&](size_t offset, auto& field) { LoadInto(in + offset, &field); });
  return entry;
}

namespace {

// --- ParseContainer's steps, in the order it takes them ------------------------
// Each is one rule of the spec's loader checks; the first that fails decides
// the error.

constexpr tern_status_t kInvalid = TERN_ERROR_EXECUTABLE_INVALID;

// The fixed part: long enough, the magic, a version this tern reads.
Status CheckMagicAndVersion(std::span<const uint8_t> data, FileHeader* header) {
  const uint64_t size = data.size();
  if (size < kHeaderSize) {
    return MakeStatus(kInvalid,
                      "the executable is {} bytes, less than its {}-byte header: the data is "
                      "truncated or is not a tern executable",
                      size, kHeaderSize);
  }
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return MakeStatus(kInvalid,
                      "the data does not start with the magic \"TERNEXE\\0\" (it starts with {}): "
                      "it is not a tern executable; build one with the tern builder",
                      HexBytes(data.first(8)));
  }
  *header = DecodeHeader(data.data());
  if (header->format_major > kFormatMajor) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                      "the executable has format version {}.{}, but this tern reads format {}.x "
                      "only: it was built by a newer tern; upgrade tern or rebuild the executable "
                      "with this version's builder",
                      header->format_major, header->format_minor, kFormatMajor);
  }
  if (header->format_major < kFormatMajor) {
    return MakeStatus(kInvalid,
                      "the executable claims format version {}.{}, which never existed (the first "
                      "is 1.0): the header is damaged; rebuild the executable",
                      header->format_major, header->format_minor);
  }
  return OkStatus();
}

// The header's sizes and counts agree with the data.
Status CheckHeaderSizes(const FileHeader& header, uint64_t size) {
  if (header.header_size < kHeaderSize || header.header_size > size) {
    return MakeStatus(kInvalid,
                      "the header says it is {} bytes, but it must be at least {} and fit in the "
                      "{}-byte executable: the header is damaged; rebuild the executable",
                      header.header_size, kHeaderSize, size);
  }
  if (header.file_size != size) {
    return MakeStatus(kInvalid,
                      "the header says the executable is {} bytes but {} bytes were given: {}; "
                      "pass the whole file, or rebuild it",
                      header.file_size, size,
                      header.file_size > size ? "it is truncated" : "there are trailing bytes");
  }
  if (header.section_count == 0 || header.section_count > kMaxSections) {
    return MakeStatus(kInvalid,
                      "the header says there are {} sections, but there must be 1 to {}: the "
                      "header is damaged; rebuild the executable",
                      header.section_count, kMaxSections);
  }
  if (header.section_entry_size < kSectionEntrySize || header.section_entry_size > 4096) {
    return MakeStatus(kInvalid,
                      "the header says section table entries are {} bytes, but they must be {} to "
                      "4096: the header is damaged; rebuild the executable",
                      header.section_entry_size, kSectionEntrySize);
  }
  return OkStatus();
}

// The section table lies after the header, 8-aligned, inside the data.
Status LocateSectionTable(std::span<const uint8_t> data, const FileHeader& header,
                          std::span<const uint8_t>* table) {
  const uint64_t size = data.size();
  const uint64_t table_bytes = uint64_t{header.section_count} * header.section_entry_size;
  if (header.section_table_offset < header.header_size || header.section_table_offset % 8 != 0 ||
      header.section_table_offset > size || table_bytes > size - header.section_table_offset) {
    return MakeStatus(kInvalid,
                      "the section table ({} entries of {} bytes at offset {}) does not lie after "
                      "the {}-byte header, 8-aligned and inside the {}-byte executable: the file "
                      "is truncated or damaged; rebuild it",
                      header.section_count, header.section_entry_size, header.section_table_offset,
                      header.header_size, size);
  }
  *table = data.subspan(header.section_table_offset, table_bytes);
  return OkStatus();
}

Status VerifyHeaderChecksum(std::span<const uint8_t> data, const FileHeader& header,
                            std::span<const uint8_t> table) {
  const uint64_t actual = HeaderChecksum(data.first(header.header_size), table);
  if (actual != header.header_checksum) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_CHECKSUM,
                      "the header and section table checksum is {:#018x} but the header says "
                      "{:#018x}: the file was modified or damaged after it was written; copy "
                      "it again or rebuild it",
                      actual, header.header_checksum);
  }
  return OkStatus();
}

Status CheckRequiredFeatures(const FileHeader& header) {
  const uint64_t unknown_required = header.required_features & ~kKnownRequiredFeatures;
  if (unknown_required != 0) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                      "the executable requires feature bits {} ({:#x}) that this tern (format "
                      "{}.{}) does not know: it was built for a newer tern; upgrade tern or "
                      "rebuild the executable without those features",
                      DescribeBits(unknown_required), unknown_required, kFormatMajor, kFormatMinor);
  }
  return OkStatus();
}

// Section i lies between the end of the table and the end of the data.
Status CheckSectionBounds(size_t i, const SectionEntry& entry, uint64_t table_end, uint64_t size) {
  if (entry.offset < table_end || entry.offset > size || entry.size > size - entry.offset) {
    return MakeStatus(kInvalid,
                      "{} does not lie between the end of the section table (offset {}) and the "
                      "end of the {}-byte executable: the file is truncated or damaged; rebuild "
                      "it",
                      DescribeSection(i, entry), table_end, size);
  }
  return OkStatus();
}

// Records where section i is in the container if its kind is known (at most
// one of each, aligned as the kind requires); skips an unknown optional one.
Status PlaceSection(std::span<const uint8_t> data, size_t i, const SectionEntry& entry,
                    bool* has_module, Container* container) {
  const std::span<const uint8_t> bytes = data.subspan(entry.offset, entry.size);
  switch (entry.kind) {
    case kSectionModule:
    case kSectionDebug: {
      const bool is_module = entry.kind == kSectionModule;
      if ((is_module && *has_module) || (!is_module && container->has_debug)) {
        return MakeStatus(kInvalid, "{}: the executable has more than one {} section",
                          DescribeSection(i, entry), SectionKindName(entry.kind));
      }
      if (entry.offset % kFlatBufferAlignment != 0) {
        return MakeStatus(kInvalid, "{}: its offset is not a multiple of {}",
                          DescribeSection(i, entry), kFlatBufferAlignment);
      }
      if (is_module) {
        *has_module = true;
        container->module = bytes;
      } else {
        container->has_debug = true;
        container->debug = bytes;
      }
      return OkStatus();
    }
    case kSectionConstants:
      if (container->has_constants) {
        return MakeStatus(kInvalid, "{}: the executable has more than one constants section",
                          DescribeSection(i, entry));
      }
      if (entry.offset % kConstantsFileAlignment != 0) {
        return MakeStatus(kInvalid,
                          "{}: its offset is not a multiple of {}, so it cannot be mapped "
                          "from the file; rebuild the executable",
                          DescribeSection(i, entry), kConstantsFileAlignment);
      }
      container->has_constants = true;
      container->constants_offset = entry.offset;
      container->constants_size = entry.size;
      return OkStatus();
    default:
      if ((entry.flags & kSectionFlagOptional) == 0) {
        return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                          "{} is of a kind this tern does not know and is not marked optional: "
                          "the executable needs a newer tern; upgrade tern or rebuild it",
                          DescribeSection(i, entry));
      }
      return OkStatus();  // unknown optional section: skipped (its checksum is still checked)
  }
}

// Every section in bounds and placed, in table order; then the module.
Status PlaceSections(std::span<const uint8_t> data, uint64_t table_end, Container* container) {
  bool has_module = false;
  for (size_t i = 0; i < container->sections.size(); ++i) {
    const SectionEntry& entry = container->sections[i];
    TERN_RETURN_IF_ERROR(CheckSectionBounds(i, entry, table_end, data.size()));
    TERN_RETURN_IF_ERROR(PlaceSection(data, i, entry, &has_module, container));
  }
  if (!has_module) {
    return MakeStatus(kInvalid,
                      "the executable has no module section (kind 1), so it has no program: the "
                      "file is damaged; rebuild it");
  }
  return OkStatus();
}

// No two non-empty sections share bytes.
Status CheckNoOverlap(const std::vector<SectionEntry>& sections) {
  std::vector<uint32_t> order(sections.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return sections[a].offset < sections[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const SectionEntry& prev = sections[order[k - 1]];
    const SectionEntry& next = sections[order[k]];
    if (prev.size != 0 && next.size != 0 && prev.offset + prev.size > next.offset) {
      return MakeStatus(kInvalid,
                        "{} overlaps {}: the section table is damaged; rebuild the "
                        "executable",
                        DescribeSection(order[k - 1], prev), DescribeSection(order[k], next));
    }
  }
  return OkStatus();
}

Status VerifySectionChecksums(std::span<const uint8_t> data,
                              const std::vector<SectionEntry>& sections) {
  for (size_t i = 0; i < sections.size(); ++i) {
    const SectionEntry& entry = sections[i];
    const uint64_t actual = Checksum(data.subspan(entry.offset, entry.size));
    if (actual != entry.checksum) {
      return MakeStatus(TERN_ERROR_EXECUTABLE_CHECKSUM,
                        "{}: its checksum is {:#018x} but the section table says {:#018x}: the "
                        "file was modified or damaged after it was written; copy it again or "
                        "rebuild it",
                        DescribeSection(i, entry), actual, entry.checksum);
    }
  }
  return OkStatus();
}

}  // namespace

Status ParseContainer(std::span<const uint8_t> data, const ContainerOptions& options,
                      Container* out) {
  FileHeader header;
  TERN_RETURN_IF_ERROR(CheckMagicAndVersion(data, &header));
  TERN_RETURN_IF_ERROR(CheckHeaderSizes(header, data.size()));
  std::span<const uint8_t> table;
  TERN_RETURN_IF_ERROR(LocateSectionTable(data, header, &table));
  if (options.verify_checksums) TERN_RETURN_IF_ERROR(VerifyHeaderChecksum(data, header, table));
  TERN_RETURN_IF_ERROR(CheckRequiredFeatures(header));

  Container container;
  container.header = header;
  container.sections.reserve(header.section_count);
  for (uint32_t i = 0; i < header.section_count; ++i) {
    container.sections.push_back(
        DecodeSectionEntry(table.data() + uint64_t{i} * header.section_entry_size));
  }
  const uint64_t table_end = header.section_table_offset + table.size();
  TERN_RETURN_IF_ERROR(PlaceSections(data, table_end, &container));
  TERN_RETURN_IF_ERROR(CheckNoOverlap(container.sections));
  if (options.verify_checksums)
    TERN_RETURN_IF_ERROR(VerifySectionChecksums(data, container.sections));
  *out = std::move(container);
  return OkStatus();
}

ContainerPlan PlanContainer(std::span<const SectionSource> sections, uint64_t required_features) {
  ContainerPlan plan;
  FileHeader header;
  header.required_features = required_features;
  header.section_count = static_cast<uint32_t>(sections.size());
  const uint64_t table_bytes = uint64_t{header.section_count} * kSectionEntrySize;
  uint64_t cursor = AlignUp(kHeaderSize + table_bytes, kFlatBufferAlignment);
  std::vector<SectionEntry> entries;
  for (const SectionSource& source : sections) {
    SectionEntry entry;
    entry.kind = source.kind;
    entry.flags = source.flags;
    entry.offset = AlignUp(
        cursor, source.kind == kSectionConstants ? kConstantsFileAlignment : kFlatBufferAlignment);
    entry.size = source.bytes.size();
    entry.checksum = Checksum(source.bytes);
    cursor = entry.offset + entry.size;
    entries.push_back(entry);
    plan.pieces.push_back({entry.offset, source.bytes});
  }
  header.file_size = cursor;
  plan.file_size = cursor;
  plan.head.assign(kHeaderSize + table_bytes, 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    EncodeSectionEntry(entries[i], plan.head.data() + kHeaderSize + i * kSectionEntrySize);
  }
  EncodeHeader(header, plan.head.data());
  header.header_checksum = HeaderChecksum(std::span<const uint8_t>(plan.head).first(kHeaderSize),
                                          std::span<const uint8_t>(plan.head).subspan(kHeaderSize));
  EncodeHeader(header, plan.head.data());
  return plan;
}

}  // namespace tern::exe
