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
  return tern::StatusCodeName(status);
}

TERN_API const char* tern_last_error_message(void) { return tern::t_last_error.c_str(); }

}  // extern "C"
