/* tern/graph.h — recorded command sequences ("graphs").
 *
 * A graph records copies, fills, executions, host callbacks and event waits
 * once, for one device, and is then launched on any queue of that device as
 * many times as needed, each launch with one call (like CUDA graphs, libnrt's
 * nrt_execute_repeat and IREE's command buffers). A launch crosses from the
 * calling thread to the queue's engine once for the whole sequence and checks
 * only what can have changed since recording, so launching n recorded
 * commands costs the caller far less than submitting them one by one.
 *
 * Life of a graph:
 *   1. tern_graph_create(): an empty graph, recording.
 *   2. tern_graph_add_*(): each call checks its command as the matching
 *      queue call does (live handles, ranges, devices) and appends it; a
 *      refused command changes nothing. tern_graph_add_parameter() marks a
 *      device operand of a recorded command (a copy's dst or src, a fill's
 *      dst, an execution's input or output) as a parameter that a launch may
 *      rebind to another buffer and offset.
 *   3. tern_graph_finalize(): ends recording; the graph is now immutable and
 *      reserves the scratch memory its executions need (the largest any of
 *      them needs: they run one after another).
 *   4. tern_queue_launch_graph(): runs the commands in order, as one command
 *      of the queue (one sequence number), with the recorded bindings or the
 *      ones the launch gives for the parameters.
 *   5. tern_graph_destroy().
 *
 * Launch rules:
 *   - A launch is one command of its queue: it completes when every recorded
 *     command has; tern_queue_wait_sequence() on its sequence number waits
 *     for all of them. When a recorded command fails, the rest are skipped
 *     (their host callbacks still run, with the error), and the launch fails:
 *     the queue's sticky error names the recorded command's index.
 *   - A launch checks, before it enqueues anything, that every buffer,
 *     executable and event the graph names is still live (a freed buffer, an
 *     unloaded executable or a destroyed event fails the launch with
 *     TERN_ERROR_INVALID_HANDLE naming the recorded command) and that each
 *     argument fits its parameter; a refused launch enqueues nothing.
 *   - An event wait waits on the event's latest recording at the time of the
 *     launch (a never-recorded event: no wait), as tern_queue_wait_event()
 *     does when called.
 *   - Launches of one graph run one after another, even on different queues:
 *     a launch on another queue than the previous one first waits for that
 *     launch to complete (they share the graph's scratch memory).
 *   - Host memory that a recorded copy reads or writes must stay valid while
 *     launches of the graph may run, as for tern_queue_copy_*().
 *
 * Event records and collectives are not recorded: record an event on the
 * queue after the launch.
 */
#ifndef TERN_GRAPH_H_
#define TERN_GRAPH_H_

#include <stdint.h>

#include "tern/executable.h"
#include "tern/export.h"
#include "tern/queue.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_graph_s* tern_graph_t;

/* The most commands one graph may record. */
#define TERN_GRAPH_MAX_COMMANDS (1u << 20)

typedef struct tern_graph_params_t {
  uint32_t struct_size; /* IN: sizeof(tern_graph_params_t) */
  uint32_t flags;       /* IN: reserved, must be 0 */
  const char* name;     /* IN: optional, shown in errors and traces; copied */
} tern_graph_params_t;

/* Creates an empty graph, recording, for commands on `device`; `params` may
 * be NULL.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_graph_create(tern_device_t device, const tern_graph_params_t* params,
                                         tern_graph_t* out_graph);

/* Destroys the graph and, once its launches in flight complete, its scratch
 * memory. Launches already enqueued are not affected.
 * Thread-safety: safe from any thread; the handle is invalid afterwards, and
 * using it then returns TERN_ERROR_INVALID_HANDLE. */
TERN_API tern_status_t tern_graph_destroy(tern_graph_t graph);

/* Each tern_graph_add_*() call appends one command, checked as the queue
 * call of the same name checks it (the graph's device in place of the
 * queue's), and stores its index (0, 1, ...) in `*out_command` when that
 * pointer is not NULL. It fails with TERN_ERROR_FAILED_PRECONDITION after
 * tern_graph_finalize() or when the graph holds TERN_GRAPH_MAX_COMMANDS
 * commands. A refused command leaves the graph as it was.
 * Thread-safety: safe from any thread; the calls on one graph are
 * serialised, and the graph records them in the order they took effect. */

/* Records tern_queue_copy_h2d(): `size` bytes from host memory `src` to `dst`
 * at `dst_offset`. The host bytes are read when a launch runs the command.
 * Thread-safety: as every tern_graph_add_*() call (above). */
TERN_API tern_status_t tern_graph_add_copy_h2d(tern_graph_t graph, tern_buffer_t dst,
                                               uint64_t dst_offset, const void* src, uint64_t size,
                                               uint32_t* out_command);

/* Records tern_queue_copy_d2h(); the host bytes are written when a launch
 * runs the command.
 * Thread-safety: as every tern_graph_add_*() call (above). */
TERN_API tern_status_t tern_graph_add_copy_d2h(tern_graph_t graph, void* dst, tern_buffer_t src,
                                               uint64_t src_offset, uint64_t size,
                                               uint32_t* out_command);

/* Records tern_queue_copy_d2d(); one of the buffers must live on the graph's
 * device.
 * Thread-safety: as every tern_graph_add_*() call (above). */
TERN_API tern_status_t tern_graph_add_copy_d2d(tern_graph_t graph, tern_buffer_t dst,
                                               uint64_t dst_offset, tern_buffer_t src,
                                               uint64_t src_offset, uint64_t size,
                                               uint32_t* out_command);

/* Records tern_queue_fill().
 * Thread-safety: as every tern_graph_add_*() call (above). */
TERN_API tern_status_t tern_graph_add_fill(tern_graph_t graph, tern_buffer_t dst,
                                           uint64_t dst_offset, uint64_t size, uint32_t pattern,
                                           uint32_t* out_command);

/* Records tern_queue_execute(); the executable must be loaded on the
 * graph's device and must stay loaded while the graph is launched.
 * Thread-safety: as every tern_graph_add_*() call (above). */
TERN_API tern_status_t tern_graph_add_execute(tern_graph_t graph, tern_executable_t executable,
                                              uint32_t function, const tern_binding_t* inputs,
                                              uint32_t input_count, const tern_binding_t* outputs,
                                              uint32_t output_count, uint32_t* out_command);

/* Records tern_queue_host_callback(): each launch calls `callback` when it
 * reaches the command.
 * Thread-safety: as every tern_graph_add_*() call (above); the callback runs
 * on a runtime thread, as for tern_queue_host_callback(). */
TERN_API tern_status_t tern_graph_add_host_callback(tern_graph_t graph,
                                                    tern_host_callback_fn callback, void* user_data,
                                                    uint32_t* out_command);

/* Records tern_queue_wait_event(): each launch waits, when it reaches the
 * command, for the event's latest recording at the time of the launch.
 * Thread-safety: as every tern_graph_add_*() call (above). */
TERN_API tern_status_t tern_graph_add_wait_event(tern_graph_t graph, tern_event_t event,
                                                 uint32_t* out_command);

/* The operands of a recorded command that a parameter can name. */
typedef enum tern_graph_operand_t TERN_ENUM_BASE {
  TERN_GRAPH_OPERAND_DST = 0,    /* a copy's or fill's device destination */
  TERN_GRAPH_OPERAND_SRC = 1,    /* a D2H or D2D copy's device source */
  TERN_GRAPH_OPERAND_INPUT = 2,  /* an execution's input `index` */
  TERN_GRAPH_OPERAND_OUTPUT = 3, /* an execution's output `index` */
} tern_graph_operand_t;

/* Marks `operand` (with `index` for an execution's input or output; 0
 * otherwise) of recorded command `command` as a parameter, and stores its
 * number (0, 1, ... in marking order) in `*out_parameter`. A launch that
 * gives an argument for the parameter binds that buffer and offset instead
 * of the recorded ones; one that gives none keeps the recorded binding.
 * Fails, changing nothing, with TERN_ERROR_OUT_OF_RANGE for a command or
 * index that does not exist, TERN_ERROR_INVALID_ARGUMENT for an operand the
 * command does not have (a host callback has none; an H2D copy has no device
 * source) or one marked already, and TERN_ERROR_FAILED_PRECONDITION after
 * tern_graph_finalize().
 * Thread-safety: as the tern_graph_add_*() calls. */
TERN_API tern_status_t tern_graph_add_parameter(tern_graph_t graph, uint32_t command,
                                                tern_graph_operand_t operand, uint32_t index,
                                                uint32_t* out_parameter);

/* Ends recording: the graph becomes immutable and launchable, and reserves
 * the device scratch memory its executions need (category scratch, held
 * until the graph is destroyed). Fails with TERN_ERROR_FAILED_PRECONDITION
 * when already finalized, and with TERN_ERROR_OUT_OF_MEMORY, leaving the
 * graph recording, when the scratch does not fit.
 * Thread-safety: safe from any thread; serialised with the graph's other
 * calls. */
TERN_API tern_status_t tern_graph_finalize(tern_graph_t graph);

typedef struct tern_graph_info_t {
  uint32_t struct_size;     /* IN: sizeof(tern_graph_info_t) */
  uint32_t command_count;   /* commands recorded */
  uint32_t parameter_count; /* parameters marked */
  uint32_t finalized;       /* 1 after tern_graph_finalize(), else 0 */
  uint64_t scratch_bytes;   /* device scratch a launch uses (reserved at finalize) */
  const char* name;         /* valid until the graph is destroyed */
} tern_graph_info_t;

/* Describes the graph.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_graph_get_info(tern_graph_t graph, tern_graph_info_t* out_info);

/* One argument of a launch: parameter `parameter` binds `buffer` at
 * `offset`. The range must hold what the parameter's command needs (the
 * copy's or fill's size, the tensor's size_bytes), and the buffer must be on
 * the device the recorded one had to be on. */
typedef struct tern_graph_argument_t {
  uint32_t parameter; /* IN: from tern_graph_add_parameter() */
  uint32_t reserved;  /* IN: must be 0 */
  tern_buffer_t buffer;
  uint64_t offset; /* bytes from the start of the buffer */
} tern_graph_argument_t;

typedef struct tern_graph_launch_params_t {
  uint32_t struct_size;    /* IN: sizeof(tern_graph_launch_params_t) */
  uint32_t flags;          /* IN: reserved, must be 0 */
  uint32_t argument_count; /* IN: entries of `arguments`, each parameter at most once */
  uint32_t reserved;       /* IN: must be 0 */
  const tern_graph_argument_t* arguments;
} tern_graph_launch_params_t;

/* Launches the finalized `graph` on `queue`, which must run on the graph's
 * device, with the arguments of `params` (NULL: every recorded binding), and
 * stores the launch's sequence number in `*out_sequence` when that pointer
 * is not NULL. Fails, enqueuing nothing, with TERN_ERROR_FAILED_PRECONDITION
 * for a graph still recording, TERN_ERROR_INVALID_ARGUMENT for a queue of
 * another device, a bad argument (its parameter does not exist or is given
 * twice, a buffer of the wrong device) or params, TERN_ERROR_OUT_OF_RANGE for
 * an argument's range, and TERN_ERROR_INVALID_HANDLE when a buffer,
 * executable or event that the graph names is no longer live (the message
 * names the recorded command).
 * Thread-safety: safe from any thread (see queue.h for submission rules);
 * launches of one graph are serialised. */
TERN_API tern_status_t tern_queue_launch_graph(tern_queue_t queue, tern_graph_t graph,
                                               const tern_graph_launch_params_t* params,
                                               uint64_t* out_sequence);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_GRAPH_H_ */
