/* tern — runtime lifetime.
 *
 * tern_init() loads the driver backend (TERN_DRIVER, default "sim"), discovers
 * devices and registers this process on the node. Calls are reference-counted:
 * every successful tern_init() needs one tern_shutdown(); the last shutdown
 * destroys every object the process still holds (queues drain first) and
 * releases its cores and device memory.
 *
 * A child created by fork() from an initialized process must not use the
 * parent's runtime: every call in it fails with TERN_ERROR_FORKED. Exec a new
 * program, or initialize tern only after forking.
 *
 * Environment (read at the first tern_init):
 *   TERN_DRIVER          driver backend: "sim" (default) or "null"
 *   TERN_VISIBLE_CORES   node-wide core indices this process may see: "0", "0-3", "0,2,5-7"
 *   TERN_EXEC_TIMEOUT    seconds a command may run before it fails (default 30)
 *   TERN_LOG_LEVEL       trace, debug, info, warn (default), error, off
 *   TERN_SIM_TOPOLOGY    sim only: "DxCxSIZE", e.g. "2x2x8G" (default)
 *   TERN_SIM_NODE        sim only: name of the simulated node (default "default")
 *   TERN_SIM_PROTECT     sim only: 1 (default) maps device memory PROT_NONE for the host
 */
#ifndef TERN_RUNTIME_H_
#define TERN_RUNTIME_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_init_options_t {
  uint32_t struct_size; /* IN: sizeof(tern_init_options_t) */
  uint32_t flags;       /* IN: reserved, must be 0 */
  /* IN: driver backend name; NULL means TERN_DRIVER or "sim". Only the first
   * successful tern_init() of a process chooses; later ones must match or be NULL. */
  const char* driver;
} tern_init_options_t;

/* Initializes the runtime, or adds a reference if it already is.
 * `options` may be NULL for defaults.
 * Thread-safety: safe from any thread; concurrent calls are serialized. */
TERN_API tern_status_t tern_init(const tern_init_options_t* options);

/* Drops one reference taken by tern_init(); the last one tears the runtime
 * down. Returns TERN_ERROR_NOT_INITIALIZED when there is no reference left.
 * Thread-safety: safe from any thread, but no other thread may be using tern
 * objects when the last reference goes. */
TERN_API tern_status_t tern_shutdown(void);

/* Returns the name of the active driver backend ("sim", "null"), or NULL if
 * the runtime is not initialized.
 * Thread-safety: safe from any thread. */
TERN_API const char* tern_driver_name(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_RUNTIME_H_ */
