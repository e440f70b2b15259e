// One parser for the byte sizes that users write in environment variables
// and on command lines (TERN_SIM_TOPOLOGY's memory, `tern diag --hbm-bytes`).
//
// Accepted: decimal digits, then optionally one suffix. Suffixes are binary
// multiples and case-insensitive:
//   (none) or B       bytes                 "4096", "4096B"
//   K or KiB          x 2^10                "64K", "64KiB", "64k"
//   M or MiB          x 2^20                "16M", "16MiB"
//   G or GiB          x 2^30                "8G", "8gib"
//   T or TiB          x 2^40                "1T", "1TiB"
// Lowercase is accepted because every parser this one replaces accepted
// "8g". "KB", "MB", "GB" and "TB" are refused: they read as powers of 1000
// to some and of 1024 to others, and a size that is off by 2.4% (or 10% at
// T) is worse than an error. Refused as well: an empty text, a sign,
// whitespace, a fraction ("1.5G"), and any value above UINT64_MAX bytes.
// Zero is accepted; callers bound the range they allow.
#ifndef TERN_COMMON_BYTE_SIZE_H_
#define TERN_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string_view>

#include "common/status_with_message.h"

namespace tern {

// Parses `text` as described above into *out (left unchanged on failure).
// Fails with TERN_ERROR_INVALID_ARGUMENT and a message that quotes the text
// and says what is wrong ("'12X' is not a byte size: unknown suffix 'X'; ...").
Status ParseByteSize(std::string_view text, uint64_t* out);

}  // namespace tern

#endif  // TERN_COMMON_BYTE_SIZE_H_
