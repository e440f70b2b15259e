// How the API names things in text: dtypes (and their sizes), memory
// categories, and byte counts in messages.
#include <string>

#include "common/isa_rules.h"
#include "src/runtime/runtime_state.h"

namespace tern {

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

const char* MemoryCategoryName(tern_memory_category_t category) {
  switch (category) {
    case TERN_MEMORY_TENSORS:
      return "tensors";
    case TERN_MEMORY_CONSTANTS:
      return "constants";
    case TERN_MEMORY_CODE:
      return "code";
    case TERN_MEMORY_SCRATCH:
      return "scratch";
    case TERN_MEMORY_COLLECTIVES:
      return "collectives";
    case TERN_MEMORY_RUNTIME:
      return "runtime";
    default:
      return "unknown";
  }
}

}  // namespace tern

extern "C" {

// A C caller may pass any int as the enum: the tables answer 0 or "unknown"
// for a value they do not list.
TERN_API uint64_t tern_dtype_size(tern_dtype_t dtype) { return tern::isa::DTypeSize(dtype); }

TERN_API const char* tern_dtype_name(tern_dtype_t dtype) { return tern::isa::DTypeName(dtype); }

TERN_API const char* tern_memory_category_name(tern_memory_category_t category) {
  return tern::MemoryCategoryName(category);
}

}  // extern "C"
