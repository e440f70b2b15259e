/* tern — status codes and error reporting.
 *
 * Every tern function returns a tern_status_t. Codes are stable numbers that
 * only ever grow; they are grouped in ranges so a caller can classify an
 * error without knowing every code:
 *     0        success
 *     1–99     general (bad arguments, handles, lifecycle)
 *   100–199    memory
 *   200–299    queues and execution
 *   300–399    hardware faults reported by the device
 *   400–499    executables (loader, validation)
 *   500–599    collectives
 *
 * When a call fails it also leaves a message for the calling thread that says
 * what failed, why, and what to do; read it with tern_last_error_message().
 */
#ifndef TERN_STATUS_H_
#define TERN_STATUS_H_

#include <stdint.h>

#include "tern/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t tern_status_t;

enum {
  TERN_OK = 0,

  /* 1–99: general. */
  TERN_ERROR_INVALID_ARGUMENT = 1,     /* a pointer is NULL, a size is zero, a flag is unknown */
  TERN_ERROR_INVALID_HANDLE = 2,       /* NULL, destroyed, or of the wrong kind */
  TERN_ERROR_OUT_OF_RANGE = 3,         /* an index, offset or size falls outside its object */
  TERN_ERROR_NOT_INITIALIZED = 4,      /* tern_init() was not called, or shutdown already ran */
  TERN_ERROR_UNAVAILABLE = 5,          /* the driver backend has no usable device */
  TERN_ERROR_UNIMPLEMENTED = 6,        /* the driver backend does not implement this */
  TERN_ERROR_BUSY = 7,                 /* owned by another process (the message names it) */
  TERN_ERROR_TIMEOUT = 8,              /* a host-side wait ran out of time */
  TERN_ERROR_NOT_READY = 9,            /* a query: the work has not completed yet (not a failure) */
  TERN_ERROR_FAILED_PRECONDITION = 10, /* the object is in the wrong state for this call */
  TERN_ERROR_ABORTED = 11,             /* skipped because an earlier command on the queue failed */
  TERN_ERROR_FORKED = 12,              /* called in a child forked from an initialized process */
  TERN_ERROR_INTERNAL = 13,            /* a tern bug: please report it with the message */
  TERN_ERROR_INCOMPATIBLE = 14,        /* a version or layout does not match */
  TERN_ERROR_IO = 15,                  /* an operating-system call failed (the message has errno) */
  TERN_ERROR_DEPENDENCY_FAILED = 16,   /* waited on an event whose queue failed */

  /* 100–199: memory. */
  TERN_ERROR_OUT_OF_MEMORY = 100,      /* device memory exhausted (the message has a breakdown) */
  TERN_ERROR_HOST_OUT_OF_MEMORY = 101, /* host memory could not be allocated or pinned */

  /* 200–299: queues and execution. */
  TERN_ERROR_EXEC_TIMEOUT = 200,     /* a command ran longer than TERN_EXEC_TIMEOUT */
  TERN_ERROR_EXECUTION_FAILED = 201, /* an instruction failed (e.g. an index out of range);
                                        the message names the instruction and its graph op */

  /* 300–399: hardware faults. */
  TERN_ERROR_HBM_UNCORRECTABLE = 300, /* uncorrectable ECC error in device memory */
  TERN_ERROR_DMA_ABORT = 301,         /* a DMA transfer was aborted by the engine */
  TERN_ERROR_CORE_HANG = 302,         /* reserved: a core stopped responding and needs reset */

  /* 400–499: executables. */
  TERN_ERROR_EXECUTABLE_INVALID = 400,     /* malformed or inconsistent: rejected at load */
  TERN_ERROR_EXECUTABLE_UNSUPPORTED = 401, /* newer format, unknown feature, target or opcode */
  TERN_ERROR_EXECUTABLE_CHECKSUM = 402,    /* the contents do not match their checksum */

  /* 500–599: collectives. */
  TERN_ERROR_COMM_PEER_LOST = 500, /* a peer rank's process died or its connection broke;
                                      the message names its rank, host and pid */
  TERN_ERROR_COMM_TIMEOUT = 501,   /* an operation or the bootstrap did not complete in time;
                                      the message names the ranks waited for */
  TERN_ERROR_COMM_MISMATCH = 502,  /* ranks called different operations (op, count, dtype,
                                      reduction or root), or joined with different sizes */
  TERN_ERROR_COMM_ABORTED = 503,   /* the communicator was aborted, here or by a peer */
  TERN_ERROR_COMM_TRANSPORT = 504, /* the network or shared-memory transport failed */
};

/* Returns the symbolic name of `status` ("TERN_ERROR_OUT_OF_MEMORY"), or
 * "TERN_ERROR_UNKNOWN" for a code this version does not know. Never NULL.
 * Thread-safety: safe from any thread; callable before tern_init(). */
TERN_API const char* tern_status_string(tern_status_t status);

/* Returns the message left by the most recent failed tern call on the calling
 * thread: what failed, why, and what to do. Successful calls do not clear it.
 * The string stays valid until the next tern call on this thread. Returns ""
 * when no call on this thread has failed.
 * Thread-safety: per thread; safe from any thread; callable before tern_init(). */
TERN_API const char* tern_last_error_message(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_STATUS_H_ */
