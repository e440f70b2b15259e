/* tern/profile.h — capturing a trace of device activity, and routing tern's
 * log messages, from code.
 *
 * A capture records every command the queues run (copies, fills, executions
 * with a span per instruction, event waits, host callbacks and the host tasks
 * of collectives) into a Perfetto / Chrome trace file: one track per queue,
 * grouped per core. Open it in ui.perfetto.dev or chrome://tracing. The
 * TERN_TRACE=path environment variable makes a capture that starts with the
 * process and is written at exit; these functions make one between two
 * points of a program instead (a training step, a benchmark loop).
 *
 * Log messages (warnings by default, TERN_LOG_LEVEL) go to stderr as
 * "[tern] [level] text" unless the host framework installs a callback.
 */
#ifndef TERN_PROFILE_H_
#define TERN_PROFILE_H_

#include "tern/export.h"
#include "tern/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts a capture that tern_profile_stop() writes to `path`. Commands that
 * start running after this call are recorded (up to two million events;
 * later ones are counted as dropped in the file). Fails with
 * TERN_ERROR_FAILED_PRECONDITION while a capture runs (TERN_TRACE's
 * included) and TERN_ERROR_INVALID_ARGUMENT for a NULL or empty path. Does
 * not need tern_init.
 * Thread-safety: safe from any thread; one capture at a time per process. */
TERN_API tern_status_t tern_profile_start(const char* path);

/* Ends the capture started by tern_profile_start() and writes its file
 * (written to path.tmp, then renamed, so the file is whole or absent).
 * Fails with TERN_ERROR_FAILED_PRECONDITION when no capture runs, or when
 * the capture is TERN_TRACE's (written at exit); with TERN_ERROR_IO when the
 * file cannot be written (the events are then discarded).
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_profile_stop(void);

typedef enum tern_log_level_t TERN_ENUM_BASE {
  TERN_LOG_LEVEL_TRACE = 0,
  TERN_LOG_LEVEL_DEBUG = 1,
  TERN_LOG_LEVEL_INFO = 2,
  TERN_LOG_LEVEL_WARN = 3,
  TERN_LOG_LEVEL_ERROR = 4
} tern_log_level_t;

/* Receives one log message: its level and its text (no "[tern]" prefix, no
 * newline), valid only during the call. Called on whichever thread logs, one
 * message at a time; it must not call tern functions. */
typedef void (*tern_log_callback_t)(void* user_data, tern_log_level_t level, const char* message);

/* Sends tern's log messages to `callback` instead of stderr (NULL: back to
 * stderr). Which messages are logged is still TERN_LOG_LEVEL's choice.
 * Does not need tern_init.
 * Thread-safety: safe from any thread; a message being logged while the
 * callback changes goes to the old or the new destination, never lost. */
TERN_API tern_status_t tern_set_log_callback(tern_log_callback_t callback, void* user_data);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_PROFILE_H_ */
