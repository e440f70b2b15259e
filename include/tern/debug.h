/* tern — fault injection, for tests.
 *
 * Makes the simulated device fail the way hardware does, so that tests can
 * check each fault surfaces as its documented error on the right queue while
 * other queues go on. Backends without fault injection return
 * TERN_ERROR_UNIMPLEMENTED.
 */
#ifndef TERN_DEBUG_H_
#define TERN_DEBUG_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tern_fault_kind_t TERN_ENUM_BASE {
  /* With `buffer`: every command that reads or writes the buffer fails with
   * TERN_ERROR_HBM_UNCORRECTABLE until the buffer is freed. Without: the
   * (after_commands+1)-th command on `core` fails with it, once. Both count an
   * uncorrected ECC error on the device. */
  TERN_FAULT_HBM_UNCORRECTABLE = 1,
  /* The (after_commands+1)-th copy or fill on `core` fails with
   * TERN_ERROR_DMA_ABORT, once. */
  TERN_FAULT_DMA_ABORT = 2,
  /* The (after_commands+1)-th command on `core` hangs; the execution timeout
   * turns it into TERN_ERROR_EXEC_TIMEOUT, once. */
  TERN_FAULT_CORE_HANG = 3,
} tern_fault_kind_t;

typedef struct tern_fault_params_t {
  uint32_t struct_size;   /* IN: sizeof(tern_fault_params_t) */
  tern_fault_kind_t kind; /* IN */
  tern_core_t core;     /* IN: the core whose commands are counted (all kinds but a buffer fault) */
  tern_buffer_t buffer; /* IN: HBM_UNCORRECTABLE only; NULL to count commands instead */
  uint64_t after_commands; /* IN: commands on `core` that still succeed first */
} tern_fault_params_t;

/* Arms a fault. Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_debug_inject_fault(const tern_fault_params_t* params);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_DEBUG_H_ */
