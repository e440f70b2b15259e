// The version query: tern_get_version.
#include <cstddef>
#include <string>

#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"

extern "C" {

TERN_API tern_status_t tern_get_version(tern_version_t* out_version) {
  using namespace tern;
  // `build` is the field added last: a caller's struct may end before it.
  TERN_API_CHECK_NOT_NULL(out_version);
  TERN_API_TRY(
      CheckStructSize(out_version->struct_size, offsetof(tern_version_t, build), "tern_version_t"));
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
