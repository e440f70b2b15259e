// Status codes as text and the per-thread last error: tern_status_string,
// tern_last_error_message, and Report(), which every entry point ends with.
#include <string>

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

}  // extern "C"
