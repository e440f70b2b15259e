/* tern — handle types and enums shared by several objects.
 *
 * Handles are opaque. They are never dereferenced by tern: each encodes a slot
 * and a generation, so a destroyed, forged or wrong-kind handle is reported as
 * TERN_ERROR_INVALID_HANDLE instead of crashing. NULL is never a valid handle.
 */
#ifndef TERN_TYPES_H_
#define TERN_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#include "tern/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_device_s* tern_device_t; /* a device; valid from tern_init to shutdown */
typedef struct tern_core_s* tern_core_t;     /* a core this process owns exclusively */
typedef struct tern_buffer_s* tern_buffer_t; /* a device memory allocation */
typedef struct tern_queue_s* tern_queue_t;   /* an in-order command stream on one core */
typedef struct tern_event_s* tern_event_t;   /* a point on a queue's timeline */

/* What a device allocation is for; feeds the per-category accounting that
 * memory statistics, out-of-memory errors and the tools report. Only grows. */
typedef enum tern_memory_category_t TERN_ENUM_BASE {
  TERN_MEMORY_TENSORS = 0,     /* inputs, outputs, activations */
  TERN_MEMORY_CONSTANTS = 1,   /* weights and other constants of executables */
  TERN_MEMORY_CODE = 2,        /* instruction streams */
  TERN_MEMORY_SCRATCH = 3,     /* temporaries of executions */
  TERN_MEMORY_COLLECTIVES = 4, /* collective staging buffers */
  TERN_MEMORY_RUNTIME = 5,     /* the runtime's own bookkeeping */
  TERN_MEMORY_CATEGORY_COUNT = 6
} tern_memory_category_t;

/* Errors counted per core, by class. Only grows. */
typedef enum tern_error_class_t TERN_ENUM_BASE {
  TERN_ERROR_CLASS_EXEC_TIMEOUT = 0,
  TERN_ERROR_CLASS_HBM_UNCORRECTABLE = 1,
  TERN_ERROR_CLASS_DMA_ABORT = 2,
  TERN_ERROR_CLASS_INVALID_COMMAND = 3,
  TERN_ERROR_CLASS_OTHER = 4,
  TERN_ERROR_CLASS_EXECUTION_FAILED = 5, /* an instruction failed on its inputs */
  TERN_ERROR_CLASS_COUNT = 6
} tern_error_class_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_TYPES_H_ */
