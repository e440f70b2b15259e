/* tern — queues.
 *
 * A queue is an in-order stream of commands bound to one open core. A core may
 * have several queues; they run independently. Submitting a command returns
 * at once; it completes later, in submission order. Each queue has a 64-bit
 * timeline: the n-th command submitted gets sequence number n (starting at 1)
 * and the timeline reaches n when it completes.
 *
 * Errors: when a command fails, the queue records the error and skips the
 * commands after it (they complete with TERN_ERROR_ABORTED). The error is
 * sticky: tern_queue_synchronize() and tern_queue_query() return it, with a
 * message naming the failing command, until tern_queue_clear_error(). Other
 * queues go on. A command that runs longer than TERN_EXEC_TIMEOUT fails with
 * TERN_ERROR_EXEC_TIMEOUT.
 *
 * Host memory passed to a copy must stay valid, and for H2D unchanged, until
 * the command completes.
 */
#ifndef TERN_QUEUE_H_
#define TERN_QUEUE_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_queue_params_t {
  uint32_t struct_size; /* IN: sizeof(tern_queue_params_t) */
  uint32_t flags;       /* IN: reserved, must be 0 */
  const char* name;     /* IN: optional, shown in errors and traces; copied */
} tern_queue_params_t;

/* Creates a queue on `core`; `params` may be NULL.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_queue_create(tern_core_t core, const tern_queue_params_t* params,
                                         tern_queue_t* out_queue);

/* Waits for the queue's commands to finish and destroys it. Returns the
 * queue's sticky error, if any, after destroying it.
 * Thread-safety: safe from any thread; no other thread may use the queue
 * meanwhile (submit, wait, query: as with the streams of other runtimes, the
 * queue calls do not take a reference, which keeps them cheap); the handle
 * is invalid afterwards, and using it then returns TERN_ERROR_INVALID_HANDLE. */
TERN_API tern_status_t tern_queue_destroy(tern_queue_t queue);

/* Every submission below is thread-safe: several threads may submit to one
 * queue; their commands are ordered as their calls are. Each stores the
 * command's sequence number in `*out_sequence` when that pointer is not NULL.
 * A submission that fails validation (bad handle, offset or size) enqueues
 * nothing and leaves the queue's state alone.
 *
 * Which device a buffer may be on: the device buffers of a copy to or from
 * the host, of a fill and of an execution must be buffers of the queue's
 * device (TERN_ERROR_INVALID_ARGUMENT otherwise, naming both devices); a
 * device-to-device copy may join two devices, and one of its two buffers must
 * be on the queue's device. Host memory is read (H2D) or written (D2H) when
 * the queue runs the copy, not during the call: keep it valid until then.
 * Freeing a buffer waits for the commands already submitted (see
 * tern_buffer_free). */

/* An empty command: completes as soon as the queue reaches it. */
TERN_API tern_status_t tern_queue_nop(tern_queue_t queue, uint64_t* out_sequence);

/* Copies `size` bytes from host memory `src` to `dst` at `dst_offset`. */
TERN_API tern_status_t tern_queue_copy_h2d(tern_queue_t queue, tern_buffer_t dst,
                                           uint64_t dst_offset, const void* src, uint64_t size,
                                           uint64_t* out_sequence);

/* Copies `size` bytes of `src` from `src_offset` to host memory `dst`. */
TERN_API tern_status_t tern_queue_copy_d2h(tern_queue_t queue, void* dst, tern_buffer_t src,
                                           uint64_t src_offset, uint64_t size,
                                           uint64_t* out_sequence);

/* Copies `size` bytes between device buffers, on the same or different
 * devices. Overlapping ranges of one buffer are allowed (memmove semantics). */
TERN_API tern_status_t tern_queue_copy_d2d(tern_queue_t queue, tern_buffer_t dst,
                                           uint64_t dst_offset, tern_buffer_t src,
                                           uint64_t src_offset, uint64_t size,
                                           uint64_t* out_sequence);

/* Fills `size` bytes of `dst` from `dst_offset` with the repeated 32-bit
 * `pattern`; `dst_offset` and `size` must be multiples of 4. */
TERN_API tern_status_t tern_queue_fill(tern_queue_t queue, tern_buffer_t dst, uint64_t dst_offset,
                                       uint64_t size, uint32_t pattern, uint64_t* out_sequence);

/* A host function the queue calls, in order, when it reaches the command.
 * `status` is TERN_OK, or the queue's sticky error when an earlier command
 * failed. The callback runs on a runtime thread: it must not block for long
 * and must not synchronize or destroy its own queue. */
typedef void (*tern_host_callback_fn)(void* user_data, tern_status_t status);
TERN_API tern_status_t tern_queue_host_callback(tern_queue_t queue, tern_host_callback_fn callback,
                                                void* user_data, uint64_t* out_sequence);

/* Records `event` at this point of the queue: the event completes when every
 * command submitted before it has. Re-recording an event moves it. */
TERN_API tern_status_t tern_queue_record_event(tern_queue_t queue, tern_event_t event,
                                               uint64_t* out_sequence);

/* Makes the queue wait, on the device side, until `event` completes; the
 * event may belong to a queue on any core or device. If the event's queue
 * fails, the waiting command fails with TERN_ERROR_DEPENDENCY_FAILED. Waiting
 * on an event that was never recorded completes at once. */
TERN_API tern_status_t tern_queue_wait_event(tern_queue_t queue, tern_event_t event,
                                             uint64_t* out_sequence);

/* Blocks until every command submitted so far has completed or `timeout_ns`
 * passed (TERN_TIMEOUT_INFINITE: no limit). Returns TERN_OK, the queue's
 * sticky error, or TERN_ERROR_TIMEOUT.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_queue_synchronize(tern_queue_t queue, uint64_t timeout_ns);

/* Blocks until the command with sequence number `sequence` has completed, or
 * `timeout_ns` passed. Returns like tern_queue_synchronize().
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_queue_wait_sequence(tern_queue_t queue, uint64_t sequence,
                                                uint64_t timeout_ns);

/* Returns TERN_OK when every submitted command has completed,
 * TERN_ERROR_NOT_READY while some are pending, or the sticky error. Does not
 * block. Stores the completed timeline value in `*out_completed` if not NULL.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_queue_query(tern_queue_t queue, uint64_t* out_completed);

/* Stores in `*out_sequence` the sequence number of the last command submitted
 * to the queue so far (0 before the first). Does not block. A framework uses
 * it to tell whether anything was queued since a point it already ordered
 * another queue after (and so skip recording a new event).
 * Thread-safety: safe from any thread; a command another thread submits
 * after this returns gets a higher number. */
TERN_API tern_status_t tern_queue_last_submitted(tern_queue_t queue, uint64_t* out_sequence);

/* Clears the queue's sticky error so that new commands run again. Returns the
 * error that was cleared (TERN_OK if none), with its message.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_queue_clear_error(tern_queue_t queue);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_QUEUE_H_ */
