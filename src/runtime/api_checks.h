// The checks that open the C entry points, each written once, in the manner
// of ROCr's TRY / IS_BAD_PTR / IS_OPEN:
//
//   TERN_API_TRY(status)                   report a failed Status and return its code
//   TERN_API_CHECK_NOT_NULL(arg)           fail with "arg is NULL"
//   TERN_API_CLEAR_OUT(out, empty)         an out parameter: not NULL, then cleared
//   TERN_API_CLEAR_OUT_STRUCT(out, Type)   an out struct: not NULL, struct_size
//                                          checked, everything else zeroed
//
// and the errors for a handle that is not live, for lookups and for destroys,
// and the check of a reserved flags field (CheckNoFlags).
// Thread-safety: all of them may be used from any thread.
// The macros return a tern_status_t from the function they are written in:
// they belong in the entry points (and in helpers that return what an entry
// point returns); code below them returns a Status instead.
#ifndef TERN_SRC_RUNTIME_API_CHECKS_H_
#define TERN_SRC_RUNTIME_API_CHECKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "src/runtime/runtime_state.h"

namespace tern {

// "out_info is NULL": the error for a NULL pointer argument.
Status NullArgument(const char* arg);

// The error of a lookup that found nothing: "queue is not a live queue handle
// (NULL, already destroyed, or another kind of handle); create one with
// tern_queue_create()". `gone`: how a handle of this kind stops being live
// ("already destroyed"); `hint`: how to get one.
Status NotALiveHandle(const char* arg, const char* what, const char* gone, const char* hint);

// The error of destroying a handle that is not live: "queue is not a live
// queue handle: already destroyed, never created, or another kind of handle".
// `gone` as for NotALiveHandle; `never`: how a handle was never made live.
Status NotALiveHandleToDestroy(const char* arg, const char* what, const char* gone,
                               const char* never);

// Fails unless `flags`, the flags field of the struct `type`, sets only bits
// of `defined`, which `defined_names` lists for the message
// ("tern_executable_load_params_t.flags is 0x6: bits 0x6 are not defined; the
// defined flags are TERN_EXECUTABLE_LOAD_ALLOW_RACES (0x1)").
Status CheckFlags(uint32_t flags, uint32_t defined, const char* type, const char* defined_names);

// A reserved flags field: fails with "tern_queue_params_t.flags is 0x4; no
// flags are defined yet: pass 0" unless `flags` is 0.
inline Status CheckNoFlags(uint32_t flags, const char* type) {
  return CheckFlags(flags, 0, type, "");
}

// Checks an out struct that starts with struct_size (at least `minimum`
// bytes) and zeroes it all but struct_size, so that it holds nothing stale
// when the call fails later. `arg` and `type` name it in messages.
template <typename T>
Status ClearOutStruct(T* out, const char* arg, const char* type, size_t minimum = sizeof(T)) {
  if (out == nullptr) return NullArgument(arg);
  TERN_RETURN_IF_ERROR(CheckStructSize(out->struct_size, minimum, type));
  const uint32_t struct_size = out->struct_size;
  // A caller built against an older header has a smaller struct: clear only
  // what it has.
  std::memset(out, 0, std::min<size_t>(struct_size, sizeof(T)));
  out->struct_size = struct_size;
  return OkStatus();
}

}  // namespace tern

// When `expr` (a Status) failed: records it as the calling thread's last
// error and returns its code from the entry point.
#define TERN_API_TRY(expr)                                               \
  do {                                                                   \
    const ::tern::Status tern_api_status_ = (expr);                      \
    if (!tern_api_status_.ok()) return ::tern::Report(tern_api_status_); \
  } while (0)

// Fails the entry point with "<arg> is NULL" when the pointer `arg` is NULL.
#define TERN_API_CHECK_NOT_NULL(arg)                                         \
  do {                                                                       \
    if ((arg) == nullptr) return ::tern::Report(::tern::NullArgument(#arg)); \
  } while (0)

// An out parameter: fails with "<out> is NULL" when it is NULL, and
// otherwise sets *out to `empty`, so that it holds nothing stale when the
// call fails later (tern.h).
#define TERN_API_CLEAR_OUT(out, empty) \
  do {                                 \
    TERN_API_CHECK_NOT_NULL(out);      \
    *(out) = (empty);                  \
  } while (0)

// An out struct of type `Type` (see ClearOutStruct).
#define TERN_API_CLEAR_OUT_STRUCT(out, Type) \
  TERN_API_TRY(::tern::ClearOutStruct<Type>(out, #out, #Type))

#endif  // TERN_SRC_RUNTIME_API_CHECKS_H_
