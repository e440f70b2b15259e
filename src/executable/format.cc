#include "src/executable/format.h"

#include <algorithm>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tern::exe {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void Store(uint8_t* p, T value) {
  std::memcpy(p, &value, sizeof(T));
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
  Store<uint16_t>(out + 8, header.format_major);
  Store<uint16_t>(out + 10, header.format_minor);
  Store<uint32_t>(out + 12, header.header_size);
  Store<uint64_t>(out + 16, header.file_size);
  Store<uint64_t>(out + 24, header.section_table_offset);
  Store<uint32_t>(out + 32, header.section_count);
  Store<uint32_t>(out + 36, header.section_entry_size);
  Store<uint64_t>(out + 40, header.required_features);
  Store<uint64_t>(out + 48, header.optional_features);
  Store<uint64_t>(out + 56, header.header_checksum);
}

void EncodeSectionEntry(const SectionEntry& entry, uint8_t out[kSectionEntrySize]) {
  Store<uint32_t>(out + 0, entry.kind);
  Store<uint32_t>(out + 4, entry.flags);
  Store<uint64_t>(out + 8, entry.offset);
  Store<uint64_t>(out + 16, entry.size);
  Store<uint64_t>(out + 24, entry.checksum);
}

FileHeader DecodeHeader(const uint8_t in[kHeaderSize]) {
  FileHeader header;
  header.format_major = Load<uint16_t>(in + 8);
  header.format_minor = Load<uint16_t>(in + 10);
  header.header_size = Load<uint32_t>(in + 12);
  header.file_size = Load<uint64_t>(in + 16);
  header.section_table_offset = Load<uint64_t>(in + 24);
  header.section_count = Load<uint32_t>(in + 32);
  header.section_entry_size = Load<uint32_t>(in + 36);
  header.required_features = Load<uint64_t>(in + 40);
  header.optional_features = Load<uint64_t>(in + 48);
  header.header_checksum = Load<uint64_t>(in + 56);
  return header;
}

SectionEntry DecodeSectionEntry(const uint8_t* in) {
  SectionEntry entry;
  entry.kind = Load<uint32_t>(in + 0);
  entry.flags = Load<uint32_t>(in + 4);
  entry.offset = Load<uint64_t>(in + 8);
  entry.size = Load<uint64_t>(in + 16);
  entry.checksum = Load<uint64_t>(in + 24);
  return entry;
}

Status ParseContainer(std::span<const uint8_t> data, const ContainerOptions& options,
                      Container* out) {
  constexpr tern_status_t kInvalid = TERN_ERROR_EXECUTABLE_INVALID;
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
  const FileHeader header = DecodeHeader(data.data());
  if (header.format_major > kFormatMajor) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                      "the executable has format version {}.{}, but this tern reads format {}.x "
                      "only: it was built by a newer tern; upgrade tern or rebuild the executable "
                      "with this version's builder",
                      header.format_major, header.format_minor, kFormatMajor);
  }
  if (header.format_major < kFormatMajor) {
    return MakeStatus(kInvalid,
                      "the executable claims format version {}.{}, which never existed (the first "
                      "is 1.0): the header is damaged; rebuild the executable",
                      header.format_major, header.format_minor);
  }
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
  const uint64_t table_end = header.section_table_offset + table_bytes;
  const std::span<const uint8_t> table = data.subspan(header.section_table_offset, table_bytes);
  if (options.verify_checksums) {
    const uint64_t actual = HeaderChecksum(data.first(header.header_size), table);
    if (actual != header.header_checksum) {
      return MakeStatus(TERN_ERROR_EXECUTABLE_CHECKSUM,
                        "the header and section table checksum is {:#018x} but the header says "
                        "{:#018x}: the file was modified or damaged after it was written; copy "
                        "it again or rebuild it",
                        actual, header.header_checksum);
    }
  }
  const uint64_t unknown_required = header.required_features & ~kKnownRequiredFeatures;
  if (unknown_required != 0) {
    return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                      "the executable requires feature bits {} ({:#x}) that this tern (format "
                      "{}.{}) does not know: it was built for a newer tern; upgrade tern or "
                      "rebuild the executable without those features",
                      DescribeBits(unknown_required), unknown_required, kFormatMajor, kFormatMinor);
  }

  Container container;
  container.header = header;
  container.sections.reserve(header.section_count);
  for (uint32_t i = 0; i < header.section_count; ++i) {
    container.sections.push_back(
        DecodeSectionEntry(table.data() + uint64_t{i} * header.section_entry_size));
  }
  bool has_module = false;
  std::vector<uint32_t> order;
  order.reserve(container.sections.size());
  for (uint32_t i = 0; i < container.sections.size(); ++i) {
    const SectionEntry& entry = container.sections[i];
    if (entry.offset < table_end || entry.offset > size || entry.size > size - entry.offset) {
      return MakeStatus(kInvalid,
                        "{} does not lie between the end of the section table (offset {}) and the "
                        "end of the {}-byte executable: the file is truncated or damaged; rebuild "
                        "it",
                        DescribeSection(i, entry), table_end, size);
    }
    order.push_back(i);
    const std::span<const uint8_t> bytes = data.subspan(entry.offset, entry.size);
    switch (entry.kind) {
      case kSectionModule:
      case kSectionDebug: {
        const bool is_module = entry.kind == kSectionModule;
        if ((is_module && has_module) || (!is_module && container.has_debug)) {
          return MakeStatus(kInvalid, "{}: the executable has more than one {} section",
                            DescribeSection(i, entry), SectionKindName(entry.kind));
        }
        if (entry.offset % kFlatBufferAlignment != 0) {
          return MakeStatus(kInvalid, "{}: its offset is not a multiple of {}",
                            DescribeSection(i, entry), kFlatBufferAlignment);
        }
        if (is_module) {
          has_module = true;
          container.module = bytes;
        } else {
          container.has_debug = true;
          container.debug = bytes;
        }
        break;
      }
      case kSectionConstants:
        if (container.has_constants) {
          return MakeStatus(kInvalid, "{}: the executable has more than one constants section",
                            DescribeSection(i, entry));
        }
        if (entry.offset % kConstantsFileAlignment != 0) {
          return MakeStatus(kInvalid,
                            "{}: its offset is not a multiple of {}, so it cannot be mapped "
                            "from the file; rebuild the executable",
                            DescribeSection(i, entry), kConstantsFileAlignment);
        }
        container.has_constants = true;
        container.constants_offset = entry.offset;
        container.constants_size = entry.size;
        break;
      default:
        if ((entry.flags & kSectionFlagOptional) == 0) {
          return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                            "{} is of a kind this tern does not know and is not marked optional: "
                            "the executable needs a newer tern; upgrade tern or rebuild it",
                            DescribeSection(i, entry));
        }
        break;  // unknown optional section: skipped (its checksum is still checked)
    }
  }
  if (!has_module) {
    return MakeStatus(kInvalid,
                      "the executable has no module section (kind 1), so it has no program: the "
                      "file is damaged; rebuild it");
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return container.sections[a].offset < container.sections[b].offset;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const SectionEntry& prev = container.sections[order[k - 1]];
    const SectionEntry& next = container.sections[order[k]];
    if (prev.size != 0 && next.size != 0 && prev.offset + prev.size > next.offset) {
      return MakeStatus(kInvalid,
                        "{} overlaps {}: the section table is damaged; rebuild the "
                        "executable",
                        DescribeSection(order[k - 1], prev), DescribeSection(order[k], next));
    }
  }
  if (options.verify_checksums) {
    for (uint32_t i = 0; i < container.sections.size(); ++i) {
      const SectionEntry& entry = container.sections[i];
      const uint64_t actual = Checksum(data.subspan(entry.offset, entry.size));
      if (actual != entry.checksum) {
        return MakeStatus(TERN_ERROR_EXECUTABLE_CHECKSUM,
                          "{}: its checksum is {:#018x} but the section table says {:#018x}: the "
                          "file was modified or damaged after it was written; copy it again or "
                          "rebuild it",
                          DescribeSection(i, entry), actual, entry.checksum);
      }
    }
  }
  *out = std::move(container);
  return OkStatus();
}

ContainerPlan PlanContainer(std::span<const SectionSource> sections) {
  ContainerPlan plan;
  FileHeader header;
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
