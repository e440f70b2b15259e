// The errors of the checks that open the C entry points (api_checks.h).
#include "src/runtime/api_checks.h"

namespace tern {

Status NullArgument(const char* arg) {
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{} is NULL", arg);
}

Status NotALiveHandle(const char* arg, const char* what, const char* gone, const char* hint) {
  return MakeStatus(TERN_ERROR_INVALID_HANDLE,
                    "{} is not a live {} handle (NULL, {}, or another kind of handle); {}", arg,
                    what, gone, hint);
}

Status NotALiveHandleToDestroy(const char* arg, const char* what, const char* gone,
                               const char* never) {
  return MakeStatus(TERN_ERROR_INVALID_HANDLE,
                    "{} is not a live {} handle: {}, {}, or another kind of handle", arg, what,
                    gone, never);
}

Status CheckFlags(uint32_t flags, uint32_t defined, const char* type, const char* defined_names) {
  const uint32_t unknown = flags & ~defined;
  if (unknown == 0) return OkStatus();
  if (defined == 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{}.flags is {:#x}; no flags are defined yet: pass 0", type, flags);
  }
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                    "{}.flags is {:#x}: bits {:#x} are not defined; the defined flags are {}", type,
                    flags, unknown, defined_names);
}

Status CheckStructSize(uint32_t struct_size, size_t minimum, const char* type) {
  if (struct_size < minimum) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{}.struct_size is {} but must be at least {}: set it to sizeof({})", type,
                      struct_size, minimum, type);
  }
  return OkStatus();
}

}  // namespace tern
