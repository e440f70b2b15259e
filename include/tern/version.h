/* tern — API version.
 *
 * The compile-time macros describe the headers you built against; the run-time
 * query describes the library you loaded. A program built against MAJOR.MINOR
 * runs on any library with the same MAJOR and a MINOR at least as large.
 */
#ifndef TERN_VERSION_H_
#define TERN_VERSION_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_VERSION_MAJOR 0
#define TERN_VERSION_MINOR 1
#define TERN_VERSION_PATCH 0
/* One comparable number: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define TERN_VERSION (TERN_VERSION_MAJOR * 10000 + TERN_VERSION_MINOR * 100 + TERN_VERSION_PATCH)

typedef struct tern_version_t {
  uint32_t struct_size; /* IN: sizeof(tern_version_t) as the caller knows it */
  uint32_t major;
  uint32_t minor;
  uint32_t patch;
  const char* build; /* free-form build string (compiler, build type); static storage */
} tern_version_t;

/* Fills `out_version` with the version of the loaded library. Set
 * `out_version->struct_size` first; fields beyond it are left alone.
 * Thread-safety: safe from any thread; callable before tern_init(). */
TERN_API tern_status_t tern_get_version(tern_version_t* out_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_VERSION_H_ */
