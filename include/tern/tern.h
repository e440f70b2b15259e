/* tern — the public C API, all of it.
 *
 * tern is a device runtime for Trainium-class ML accelerators: device
 * discovery, device memory, queues, events, executables and collectives.
 * Include this header, link libtern (pkg-config tern, or find_package(tern)).
 *
 * Conventions:
 * - Every function that can fail returns a tern_status_t (status.h); on
 *   failure tern_last_error_message() says what failed, why, and what to do.
 *   The few that cannot fail return their answer directly: the lookups
 *   tern_status_string, tern_dtype_name, tern_dtype_size,
 *   tern_memory_category_name and tern_driver_name (which answer an unknown
 *   value with a name or size that says so), tern_last_error_message, and
 *   tern_builder_free_data.
 * - `out_` parameters are set to zero/NULL on entry, so they hold nothing
 *   stale when a call fails.
 * - Structs that may grow start with `struct_size`: set it to sizeof(T).
 * - Handles are opaque and checked: a destroyed or wrong handle gives
 *   TERN_ERROR_INVALID_HANDLE, never a crash.
 * - Thread safety: unless a function says otherwise, every function may be
 *   called from any thread concurrently; each declaration states its rule.
 */
#ifndef TERN_TERN_H_
#define TERN_TERN_H_

#include "tern/builder.h"
#include "tern/comm.h"
#include "tern/debug.h"
#include "tern/device.h"
#include "tern/event.h"
#include "tern/executable.h"
#include "tern/export.h"
#include "tern/graph.h"
#include "tern/io_set.h"
#include "tern/isa.h"
#include "tern/memory.h"
#include "tern/memory_pool.h"
#include "tern/profile.h"
#include "tern/queue.h"
#include "tern/runtime.h"
#include "tern/status.h"
#include "tern/telemetry.h"
#include "tern/types.h"
#include "tern/version.h"

#endif /* TERN_TERN_H_ */
