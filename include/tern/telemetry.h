/* tern — live device telemetry.
 *
 * Every device publishes counters that any process on the node can read
 * without owning a core: per core (owner, commands, executions, busy time,
 * errors by class, a histogram of command run times) and per device (memory
 * used by category and by process, ECC counters). Administrative tools are
 * built on this call.
 */
#ifndef TERN_TELEMETRY_H_
#define TERN_TELEMETRY_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TERN_TELEMETRY_MAX_CORES 16
#define TERN_TELEMETRY_MAX_PROCESSES 64
/* Buckets of the command run-time histogram: bucket 0 counts commands that
 * ran less than 1 us, bucket i (1 <= i < 23) those that ran [2^(i-1), 2^i) us,
 * and bucket 23 those that ran 2^22 us (about 4.2 s) or longer. */
#define TERN_TELEMETRY_LATENCY_BUCKETS 24

/* The per-core and per-process records have a fixed layout (no struct_size):
 * they sit in arrays inside tern_device_telemetry_t, whose struct_size
 * versions the whole snapshot. Figures added later go into new arrays at the
 * end of tern_device_telemetry_t, filled when struct_size covers them (as
 * latency_histogram was). */
typedef struct tern_core_telemetry_t {
  uint32_t physical_index;
  int32_t owner_pid;                       /* 0 when no process owns the core */
  char owner_command[32];                  /* the owner's command name, "" when none */
  uint64_t commands;                       /* commands completed, any kind */
  uint64_t executions;                     /* compute commands completed */
  uint64_t busy_ns;                        /* time spent running commands */
  uint64_t errors[TERN_ERROR_CLASS_COUNT]; /* failed commands by class */
} tern_core_telemetry_t;

typedef struct tern_process_telemetry_t {
  int32_t pid;
  uint32_t cores_owned; /* bit i set: physical core i of this device is owned */
  char command[32];
  uint64_t memory_by_category[TERN_MEMORY_CATEGORY_COUNT];
} tern_process_telemetry_t;

typedef struct tern_device_telemetry_t {
  uint32_t struct_size; /* IN: sizeof(tern_device_telemetry_t) */
  uint32_t core_count;  /* physical cores; entries of cores[] that are filled */
  uint64_t memory_capacity;
  uint64_t memory_used; /* by every process */
  uint64_t memory_by_category[TERN_MEMORY_CATEGORY_COUNT];
  uint64_t ecc_corrected;
  uint64_t ecc_uncorrected;
  tern_core_telemetry_t cores[TERN_TELEMETRY_MAX_CORES];
  uint32_t process_count; /* live processes using the device; entries of processes[] filled */
  uint32_t reserved;
  tern_process_telemetry_t processes[TERN_TELEMETRY_MAX_PROCESSES];
  /* Added in 0.1: how long each core's commands ran (event waits excluded;
   * counts only grow): latency_histogram[c] belongs to cores[c]. Filled
   * when struct_size covers it. */
  uint64_t latency_histogram[TERN_TELEMETRY_MAX_CORES][TERN_TELEMETRY_LATENCY_BUCKETS];
} tern_device_telemetry_t;

/* The smallest struct_size tern_device_get_telemetry() accepts: the structure
 * without the fields added after it first appeared. */
#define TERN_DEVICE_TELEMETRY_MIN_SIZE 7520

/* Takes a snapshot of `device`'s counters; set `out_telemetry->struct_size`
 * first. Counters cover every process on the node.
 * Thread-safety: safe from any thread; never blocks on other processes. */
TERN_API tern_status_t tern_device_get_telemetry(tern_device_t device,
                                                 tern_device_telemetry_t* out_telemetry);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_TELEMETRY_H_ */
