// A human-readable description of an executable: header, sections (with
// their checksums verified), signature, and the disassembly of every stream
// with operands and debug ops. Behind `tern dump`.
#ifndef TERN_SRC_EXECUTABLE_DUMP_H_
#define TERN_SRC_EXECUTABLE_DUMP_H_

#include <cstdint>
#include <span>
#include <string>

#include "common/status_with_message.h"

namespace tern::exe {

struct DumpOptions {
  bool disassemble = true;  // list every instruction
};

// Appends the description of `data` to `*text`. Prints as much as the data
// allows: checksum mismatches are reported in the text, not as failures. The
// result is the loader's verdict (OK, or why tern_executable_load() would
// reject the data); structural damage that stops printing is returned too.
Status DumpExecutable(std::span<const uint8_t> data, std::string* text,
                      const DumpOptions& options = {});

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_DUMP_H_
