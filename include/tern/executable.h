/* tern — executables: load, inspect, execute.
 *
 * An executable is a compiled program in tern's container format
 * (docs/executable-format.md): functions with named inputs and outputs, the
 * instructions that compute them (docs/isa.md), constants and debug info.
 * Loading validates everything once: a malformed or hostile file is rejected
 * with a clear error and never executed. Executing binds device buffers to a
 * function's inputs and outputs and runs it, in order, on a queue.
 */
#ifndef TERN_EXECUTABLE_H_
#define TERN_EXECUTABLE_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/isa.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_executable_s* tern_executable_t;

/* Load even when the static race check finds instructions of different
 * engine streams that may run at the same time and touch the same bytes (at
 * least one writing) with no semaphore ordering them: each race is logged as
 * a warning instead. On hardware such a program computes a result that
 * depends on timing; the flag is for experiments, never for production. */
#define TERN_EXECUTABLE_LOAD_ALLOW_RACES 0x1u

typedef struct tern_executable_load_params_t {
  uint32_t struct_size; /* IN: sizeof(tern_executable_load_params_t) */
  uint32_t flags;       /* IN: 0 or TERN_EXECUTABLE_LOAD_ALLOW_RACES */
} tern_executable_load_params_t;

/* Validates the executable in `data` (`size` bytes) and loads it on
 * `device`: its constants are copied to device memory (category constants).
 * `data` may be freed when the call returns. `params` may be NULL.
 * So that the first execution costs about what a later one does, the load
 * also readies the queue likely to run it (the device's last executing
 * queue, else its first): that queue's engine is roused and it takes the
 * program's scratch (up to 16 MiB, category scratch, kept by the queue as
 * its executions' scratch is); and the simulated device runs each small
 * function once on memory of its own (no command of any queue; see
 * docs/sim.md).
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_executable_load(tern_device_t device, const void* data, uint64_t size,
                                            const tern_executable_load_params_t* params,
                                            tern_executable_t* out_executable);

/* Like tern_executable_load(), from a file. The constants are mapped from the
 * file, not copied (they are still charged to the device as constants).
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_executable_load_file(tern_device_t device, const char* path,
                                                 const tern_executable_load_params_t* params,
                                                 tern_executable_t* out_executable);

/* Unloads `executable` and frees everything it holds. Executions already
 * submitted keep what they need until they complete.
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_executable_unload(tern_executable_t executable);

typedef struct tern_function_info_t {
  uint32_t struct_size; /* IN: sizeof(tern_function_info_t) */
  uint32_t input_count;
  uint32_t output_count;
  uint32_t instruction_count;
  uint64_t scratch_bytes; /* device memory each execution needs for temporaries */
  const char* name;       /* valid until the executable is unloaded */
} tern_function_info_t;

typedef struct tern_tensor_info_t {
  uint32_t struct_size; /* IN: sizeof(tern_tensor_info_t) */
  tern_dtype_t dtype;
  uint32_t rank;
  uint32_t reserved;
  int64_t shape[TERN_MAX_RANK];
  uint64_t size_bytes; /* bytes a bound buffer range must hold */
  const char* name;    /* valid until the executable is unloaded */
} tern_tensor_info_t;

/* Stores the number of functions in `*out_count`. Thread-safety: any thread. */
TERN_API tern_status_t tern_executable_function_count(tern_executable_t executable,
                                                      uint32_t* out_count);

/* Finds a function by name. Thread-safety: any thread. */
TERN_API tern_status_t tern_executable_find_function(tern_executable_t executable, const char* name,
                                                     uint32_t* out_function);

/* Describes function `function`. Thread-safety: any thread. */
TERN_API tern_status_t tern_executable_function_info(tern_executable_t executable,
                                                     uint32_t function,
                                                     tern_function_info_t* out_info);

/* Describes input (`is_output` 0) or output (1) `index` of `function`.
 * Thread-safety: any thread. */
TERN_API tern_status_t tern_executable_tensor_info(tern_executable_t executable, uint32_t function,
                                                   int is_output, uint32_t index,
                                                   tern_tensor_info_t* out_info);

/* Finds input (`is_output` 0) or output (1) `name` of `function` and stores
 * its index, the position at which tern_queue_execute() binds it; this is
 * how callers bind by name. Thread-safety: any thread. */
TERN_API tern_status_t tern_executable_find_tensor(tern_executable_t executable, uint32_t function,
                                                   int is_output, const char* name,
                                                   uint32_t* out_index);

/* A device buffer range bound to an input or output. Its layout is fixed
 * (it has no struct_size): callers pass arrays of it, and a binding that
 * needs more will come as a new structure and entry point, as the named I/O
 * sets (tern/io_set.h) did. */
typedef struct tern_binding_t {
  tern_buffer_t buffer;
  uint64_t offset; /* bytes from the start of the buffer */
} tern_binding_t;

/* Runs `function` of `executable` on `queue`, in order with the queue's other
 * commands. `inputs` and `outputs` bind every input and output, by index;
 * each range must hold the tensor's size_bytes, on the queue's device. A
 * failure during execution (an index out of range, a fault) becomes the
 * queue's sticky error and its message names the instruction and the graph
 * op it came from.
 * Ownership: the runtime copies `inputs` and `outputs` during the call; the
 * arrays may be reused or freed as soon as it returns (the buffers must stay
 * allocated until the execution ran, which tern_buffer_free ensures). The
 * function's scratch (tern_function_info_t.scratch_bytes) belongs to the
 * runtime: each queue keeps one scratch block, as large as the largest its
 * executions have needed, and runs every execution in it (a queue runs one
 * command at a time). An execution that needs more than the queue holds
 * allocates a larger block from the device when it is submitted (category
 * scratch; TERN_ERROR_OUT_OF_MEMORY if it does not fit). The block is
 * returned when the queue is destroyed, or earlier when an allocation finds
 * the device full while no execution is using it. The caller neither
 * provides nor sees it.
 * Thread-safety: safe from any thread (see queue.h for submission rules). */
TERN_API tern_status_t tern_queue_execute(tern_queue_t queue, tern_executable_t executable,
                                          uint32_t function, const tern_binding_t* inputs,
                                          uint32_t input_count, const tern_binding_t* outputs,
                                          uint32_t output_count, uint64_t* out_sequence);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_EXECUTABLE_H_ */
