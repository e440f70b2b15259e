/* tern — events.
 *
 * An event is a point on a queue's timeline, set by tern_queue_record_event().
 * Other queues (on any core or device) can wait for it on the device side
 * with tern_queue_wait_event(); the host can query it or block on it. When it
 * completes the device takes a timestamp, so two events give elapsed time.
 */
#ifndef TERN_EVENT_H_
#define TERN_EVENT_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates an event that has never been recorded (it counts as complete).
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_event_create(tern_event_t* out_event);

/* Destroys `event`. Commands already submitted that wait on it still work.
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_event_destroy(tern_event_t event);

/* Returns TERN_OK if the event has completed (or was never recorded),
 * TERN_ERROR_NOT_READY if not yet, or the error of its failed queue.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_event_query(tern_event_t event);

/* Blocks until the event completes or `timeout_ns` passed; returns like
 * tern_event_query() with TERN_ERROR_TIMEOUT in place of NOT_READY.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_event_synchronize(tern_event_t event, uint64_t timeout_ns);

/* Stores the device time between two completed events in nanoseconds.
 * Fails with TERN_ERROR_NOT_READY if either has not completed and
 * TERN_ERROR_FAILED_PRECONDITION if either was never recorded.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_event_elapsed_ns(tern_event_t start, tern_event_t end,
                                             uint64_t* out_ns);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_EVENT_H_ */
