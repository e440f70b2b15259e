/* tern/io_set.h — named input/output sets for executions.
 *
 * An I/O set binds device buffers to one function's inputs and outputs by
 * name, once, and is then executed any number of times (like libnrt's
 * tensor sets): a serving loop builds a set per request slot instead of
 * resolving names and rebuilding binding arrays for every execution. Each
 * bind is validated when it is made (the name exists, the buffer is live and
 * on the executable's device, the range holds the tensor); an execution
 * checks that every tensor is bound and that the buffers are still live.
 */
#ifndef TERN_IO_SET_H_
#define TERN_IO_SET_H_

#include <stdint.h>

#include "tern/executable.h"
#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_io_set_s* tern_io_set_t;

/* Creates an empty set for function `function` (its name; NULL for the
 * executable's first function) of `executable`. Fails with
 * TERN_ERROR_INVALID_ARGUMENT, listing the functions, for an unknown name. The set
 * does not keep the executable loaded: executing it after the executable was
 * unloaded fails with TERN_ERROR_INVALID_HANDLE.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_io_set_create(tern_executable_t executable, const char* function,
                                          tern_io_set_t* out_set);

/* Binds input (`is_output` 0) or output (1) `name` to `buffer` at `offset`
 * (replacing an earlier bind of that name). Fails, changing nothing, with
 * TERN_ERROR_INVALID_ARGUMENT for an unknown name (the message lists the function's
 * names), TERN_ERROR_INVALID_HANDLE for a dead buffer,
 * TERN_ERROR_INVALID_ARGUMENT for a buffer of another device, and
 * TERN_ERROR_OUT_OF_RANGE when the range cannot hold the tensor.
 * Thread-safety: safe from any thread; binds and executions of one set are
 * serialised (an execution uses the binds made before it). */
TERN_API tern_status_t tern_io_set_bind(tern_io_set_t set, int is_output, const char* name,
                                        tern_buffer_t buffer, uint64_t offset);

/* Runs the set's function on `queue` with its bound buffers, like
 * tern_queue_execute(). Fails with TERN_ERROR_FAILED_PRECONDITION, naming the
 * tensors, while any input or output is unbound (an empty tensor may stay
 * unbound).
 * Thread-safety: as tern_queue_execute(). */
TERN_API tern_status_t tern_queue_execute_io_set(tern_queue_t queue, tern_io_set_t set,
                                                 uint64_t* out_sequence);

/* Destroys the set; executions already submitted are not affected.
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_io_set_destroy(tern_io_set_t set);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_IO_SET_H_ */
