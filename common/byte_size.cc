#include "common/byte_size.h"

#include <cstddef>

namespace tern {
namespace {

constexpr const char* kForm =
    "write digits with an optional binary suffix: K, M, G, T or KiB, MiB, GiB, TiB (powers of "
    "1024), e.g. 4096, 64K, 16MiB, 8G";

// ASCII only, whatever the locale.
char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }
char Upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c; }

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

// The shift of a suffix ("" and "b": 0, "k" and "kib": 10, ...); -1 when
// unknown, -2 for the decimal-or-binary "kb", "mb", "gb", "tb".
int SuffixShift(std::string_view suffix) {
  if (suffix.empty() || EqualsIgnoringCase(suffix, "b")) return 0;
  static constexpr struct {
    char letter;
    int shift;
  } kUnits[] = {{'k', 10}, {'m', 20}, {'g', 30}, {'t', 40}};
  for (const auto& unit : kUnits) {
    if (Lower(suffix[0]) != unit.letter) continue;
    const std::string_view rest = suffix.substr(1);
    if (rest.empty() || EqualsIgnoringCase(rest, "ib")) return unit.shift;
    if (EqualsIgnoringCase(rest, "b")) return -2;
  }
  return -1;
}

}  // namespace

Status ParseByteSize(std::string_view text, uint64_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "'{}' is not a byte size: {}", text,
                      text.empty() ? "it is empty" : "it does not start with a digit");
  }
  const std::string_view suffix = text.substr(digits);
  const int shift = SuffixShift(suffix);
  if (shift == -2) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "'{}' is not a byte size: '{}' is ambiguous (powers of 1000 or 1024?); "
                      "write '{}' or '{}iB' for powers of 1024",
                      text, suffix, Upper(suffix[0]), Upper(suffix[0]));
  }
  if (shift < 0 && suffix[0] == '.') {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "'{}' is not a byte size: fractions are not accepted; write a whole number "
                      "of a smaller unit (1536M, not 1.5G)",
                      text);
  }
  if (shift < 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "'{}' is not a byte size: unknown suffix '{}'; {}", text, suffix, kForm);
  }
  uint64_t value = 0;
  bool overflow = false;  // __builtin_*_overflow keep wrapping; the flag remembers
  for (size_t i = 0; i < digits; ++i) {
    overflow |= __builtin_mul_overflow(value, uint64_t{10}, &value);
    overflow |= __builtin_add_overflow(value, static_cast<uint64_t>(text[i] - '0'), &value);
  }
  if (overflow || value > (UINT64_MAX >> shift)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "'{}' is not a byte size: it is more than 2^64 - 1 bytes", text);
  }
  *out = value << shift;
  return OkStatus();
}

}  // namespace tern
