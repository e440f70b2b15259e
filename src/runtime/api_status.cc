// Status strings, the per-thread last error, the version query and small
// formatting helpers shared by the API files.
#include <string>

#include "common/isa_rules.h"
#include "src/runtime/runtime_state.h"

namespace tern {
namespace {

thread_local std::string t_last_error;

}  // namespace

tern_status_t Report(const Status& status) {
  if (!status.ok()) {
    t_last_error = fmt::format("{}: {}", tern_status_string(status.code()), status.message());
  }
  return status.code();
}

uint32_t NextHandleGeneration() {
  static std::atomic<uint32_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

Status HandleTableFull(const char* what) {
  return MakeStatus(TERN_ERROR_HOST_OUT_OF_MEMORY,
                    "this process already holds the most live {} tern can track ({}); free "
                    "some: so many live at once usually means they are leaked",
                    what, kMaxLiveHandles);
}

Status CheckStructSize(uint32_t struct_size, size_t minimum, const char* type) {
  if (struct_size < minimum) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{}.struct_size is {} but must be at least {}: set it to sizeof({})", type,
                      struct_size, minimum, type);
  }
  return OkStatus();
}

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

TERN_API const char* tern_status_string(tern_status_t status) {
  switch (status) {
#define TERN_STATUS_CASE(name) \
  case name:                   \
    return #name;
    TERN_STATUS_CASE(TERN_OK)
    TERN_STATUS_CASE(TERN_ERROR_INVALID_ARGUMENT)
    TERN_STATUS_CASE(TERN_ERROR_INVALID_HANDLE)
    TERN_STATUS_CASE(TERN_ERROR_OUT_OF_RANGE)
    TERN_STATUS_CASE(TERN_ERROR_NOT_INITIALIZED)
    TERN_STATUS_CASE(TERN_ERROR_UNAVAILABLE)
    TERN_STATUS_CASE(TERN_ERROR_UNIMPLEMENTED)
    TERN_STATUS_CASE(TERN_ERROR_BUSY)
    TERN_STATUS_CASE(TERN_ERROR_TIMEOUT)
    TERN_STATUS_CASE(TERN_ERROR_NOT_READY)
    TERN_STATUS_CASE(TERN_ERROR_FAILED_PRECONDITION)
    TERN_STATUS_CASE(TERN_ERROR_ABORTED)
    TERN_STATUS_CASE(TERN_ERROR_FORKED)
    TERN_STATUS_CASE(TERN_ERROR_INTERNAL)
    TERN_STATUS_CASE(TERN_ERROR_INCOMPATIBLE)
    TERN_STATUS_CASE(TERN_ERROR_IO)
    TERN_STATUS_CASE(TERN_ERROR_DEPENDENCY_FAILED)
    TERN_STATUS_CASE(TERN_ERROR_OUT_OF_MEMORY)
    TERN_STATUS_CASE(TERN_ERROR_HOST_OUT_OF_MEMORY)
    TERN_STATUS_CASE(TERN_ERROR_EXEC_TIMEOUT)
    TERN_STATUS_CASE(TERN_ERROR_HBM_UNCORRECTABLE)
    TERN_STATUS_CASE(TERN_ERROR_DMA_ABORT)
    TERN_STATUS_CASE(TERN_ERROR_CORE_HANG)
    TERN_STATUS_CASE(TERN_ERROR_EXECUTION_FAILED)
    TERN_STATUS_CASE(TERN_ERROR_EXECUTABLE_INVALID)
    TERN_STATUS_CASE(TERN_ERROR_EXECUTABLE_UNSUPPORTED)
    TERN_STATUS_CASE(TERN_ERROR_EXECUTABLE_CHECKSUM)
    TERN_STATUS_CASE(TERN_ERROR_COMM_PEER_LOST)
    TERN_STATUS_CASE(TERN_ERROR_COMM_TIMEOUT)
    TERN_STATUS_CASE(TERN_ERROR_COMM_MISMATCH)
    TERN_STATUS_CASE(TERN_ERROR_COMM_ABORTED)
    TERN_STATUS_CASE(TERN_ERROR_COMM_TRANSPORT)
#undef TERN_STATUS_CASE
    default:
      return "TERN_ERROR_UNKNOWN";
  }
}

TERN_API const char* tern_last_error_message(void) { return tern::t_last_error.c_str(); }

// A C caller may pass any int as the enum: the tables answer 0 or "unknown"
// for a value they do not list.
TERN_API uint64_t tern_dtype_size(tern_dtype_t dtype) { return tern::isa::DTypeSize(dtype); }

TERN_API const char* tern_dtype_name(tern_dtype_t dtype) { return tern::isa::DTypeName(dtype); }

TERN_API const char* tern_memory_category_name(tern_memory_category_t category) {
  return tern::MemoryCategoryName(category);
}

TERN_API tern_status_t tern_get_version(tern_version_t* out_version) {
  using namespace tern;
  if (out_version == nullptr) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "out_version is NULL"));
  }
  Status size_ok =
      CheckStructSize(out_version->struct_size, offsetof(tern_version_t, build), "tern_version_t");
  if (!size_ok.ok()) return Report(size_ok);
  out_version->major = TERN_VERSION_MAJOR;
  out_version->minor = TERN_VERSION_MINOR;
  out_version->patch = TERN_VERSION_PATCH;
  if (out_version->struct_size >= sizeof(tern_version_t)) {
    static const std::string build =
        fmt::format("gcc {} C++{}", __VERSION__, __cplusplus / 100 % 100);
    out_version->build = build.c_str();
  }
  return TERN_OK;
}

}  // extern "C"
