// libFuzzer target for the executable loader: the full validation of
// tern_executable_load() (container, checksums, FlatBuffers verification,
// signatures, every instruction and operand, the semaphore simulation) on
// arbitrary bytes, plus the dumper.
//
// Random mutations almost never keep the XXH3 checksums right, which would
// stop the fuzzer at the first check. So every input runs twice: once as
// given (the checksum and container checks), and once with its header and
// section checksums recomputed where the section table can be read, which
// lets mutations reach everything behind them.
//
// Invariants checked: no crash, hang or sanitizer report; a rejection has an
// executable error code and a message; an accepted program is consistent.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/executable/dump.h"
#include "src/executable/format.h"
#include "src/executable/loader.h"

namespace {

using tern::exe::kHeaderChecksumOffset;
using tern::exe::kHeaderSize;

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "loader_fuzzer invariant failed: %s\n", what);
    std::abort();
  }
}

void ValidateAndCheck(std::span<const uint8_t> data) {
  tern::exe::ValidatedExecutable validated;
  const tern::Status status = tern::exe::ValidateExecutable(data, &validated);
  if (!status.ok()) {
    Check(status.code() == TERN_ERROR_EXECUTABLE_INVALID ||
              status.code() == TERN_ERROR_EXECUTABLE_UNSUPPORTED ||
              status.code() == TERN_ERROR_EXECUTABLE_CHECKSUM,
          "a rejection uses an executable error code");
    Check(!status.message().empty(), "a rejection has a message");
    return;
  }
  const tern::driver::Program& program = *validated.program;
  Check(program.constants_bytes <= data.size(), "constants fit in the data");
  Check(validated.constants_offset + program.constants_bytes <= data.size() ||
            program.constants_bytes == 0,
        "constants lie in the data");
  for (const auto& function : program.functions) {
    size_t instructions = 0;
    for (const auto& stream : function.streams) {
      Check(stream.engine != TERN_ENGINE_SYNC, "no stream of the sync engine");
      instructions += stream.instructions.size();
      for (const auto& instruction : stream.instructions) {
        Check(instruction.engine == stream.engine && instruction.core == stream.core,
              "an instruction runs on its stream's engine");
        for (const auto& operand : instruction.operands) {
          if (!operand.present()) continue;
          uint64_t begin = 0, end = 0;
          Check(tern::isa::OperandExtent(operand, &begin, &end).ok(), "operand extents computable");
        }
      }
    }
    Check(instructions == function.instruction_count, "every instruction in a stream");
  }
}

// Recomputes the checksums of `data` in place where the table is readable.
void FixChecksums(std::vector<uint8_t>* data) {
  if (data->size() < kHeaderSize) return;
  const tern::exe::FileHeader header = tern::exe::DecodeHeader(data->data());
  const uint64_t size = data->size();
  if (header.header_size < kHeaderSize || header.header_size > size) return;
  if (header.section_entry_size < tern::exe::kSectionEntrySize ||
      header.section_count > tern::exe::kMaxSections) {
    return;
  }
  const uint64_t table_bytes = uint64_t{header.section_count} * header.section_entry_size;
  if (header.section_table_offset > size || table_bytes > size - header.section_table_offset)
    return;
  for (uint32_t i = 0; i < header.section_count; ++i) {
    uint8_t* entry =
        data->data() + header.section_table_offset + uint64_t{i} * header.section_entry_size;
    const tern::exe::SectionEntry section = tern::exe::DecodeSectionEntry(entry);
    if (section.offset > size || section.size > size - section.offset) continue;
    const uint64_t checksum =
        tern::exe::Checksum(std::span<const uint8_t>(data->data() + section.offset, section.size));
    std::memcpy(entry + 24, &checksum, 8);
  }
  const uint64_t checksum = tern::exe::HeaderChecksum(
      std::span<const uint8_t>(data->data(), header.header_size),
      std::span<const uint8_t>(data->data() + header.section_table_offset, table_bytes));
  std::memcpy(data->data() + kHeaderChecksumOffset, &checksum, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ValidateAndCheck({data, size});
  std::vector<uint8_t> fixed(data, data + size);
  FixChecksums(&fixed);
  ValidateAndCheck(fixed);
  std::string text;
  (void)tern::exe::DumpExecutable(fixed, &text);
  Check(!text.empty(), "the dump prints something");
  return 0;
}
