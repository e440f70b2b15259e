/* tern — devices and cores.
 *
 * A node has devices; each device has cores and one device memory (HBM).
 * Devices are listed at tern_init() and their handles stay valid until the
 * last tern_shutdown(). Device indices are dense (0..count-1) over the devices
 * that have at least one core visible to this process (TERN_VISIBLE_CORES).
 *
 * A core is owned by one process at a time. tern_core_open() takes ownership;
 * it fails with TERN_ERROR_BUSY, naming the owner's pid and command, when
 * another process holds it. Ownership ends with tern_core_close(), the last
 * tern_shutdown(), or the death of the process (SIGKILL included).
 * Reading a device's information never needs ownership.
 */
#ifndef TERN_DEVICE_H_
#define TERN_DEVICE_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_device_info_t {
  uint32_t struct_size;         /* IN: sizeof(tern_device_info_t) */
  uint32_t index;               /* dense index in this process */
  uint32_t physical_index;      /* index on the node, as the driver numbers devices */
  uint32_t core_count;          /* cores visible to this process */
  uint32_t physical_core_count; /* cores the device has */
  int32_t numa_node;            /* NUMA node the device is attached to, -1 if unknown */
  uint64_t memory_bytes;        /* device memory (HBM) capacity */
  uint64_t memory_alignment;    /* minimum alignment of device allocations */
  char name[64];                /* e.g. "tern-sim trn2" */
  char driver[16];              /* backend name, e.g. "sim" */
  char cpu_affinity[128];       /* CPUs near the device, as a list "0-15,32-47" */
  /* Added in 0.1, filled when struct_size covers all three (a caller built
   * against an older header passes TERN_DEVICE_INFO_MIN_SIZE and gets the
   * fields above only): */
  char uuid[40];           /* the device's stable identity, "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx":
                              the same in every process and across restarts */
  char bus_id[64];         /* where the device sits: a PCI address ("0000:10:1c.0") on
                              hardware; "sim:<node>:<physical index>" on the simulator */
  char driver_version[32]; /* the backend's version, e.g. "sim 0.1.0" */
} tern_device_info_t;

/* The size of tern_device_info_t before the fields added in 0.1: the smallest
 * struct_size tern_device_get_info() accepts. */
#define TERN_DEVICE_INFO_MIN_SIZE 248

/* Stores the number of visible devices in `*out_count`.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_device_count(uint32_t* out_count);

/* Stores the handle of device `index` (0..count-1) in `*out_device`.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_device_get(uint32_t index, tern_device_t* out_device);

/* Fills `out_info`; set `out_info->struct_size` first.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_device_get_info(tern_device_t device, tern_device_info_t* out_info);

/* Takes exclusive ownership of core `core_index` (0..core_count-1) of
 * `device` and stores its handle in `*out_core`. Fails with TERN_ERROR_BUSY
 * when another process owns it (the message names that process) and with
 * TERN_ERROR_FAILED_PRECONDITION when this process already has it open.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_core_open(tern_device_t device, uint32_t core_index,
                                      tern_core_t* out_core);

/* Gives up ownership of `core`. Fails with TERN_ERROR_FAILED_PRECONDITION
 * while queues created on it still exist: destroy them first.
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_core_close(tern_core_t core);

typedef struct tern_core_info_t {
  uint32_t struct_size;    /* IN: sizeof(tern_core_info_t) */
  uint32_t index;          /* index within the device, as passed to tern_core_open */
  uint32_t physical_index; /* index within the device as the driver numbers cores */
  uint32_t node_index;     /* node-wide index (what TERN_VISIBLE_CORES names) */
  tern_device_t device;
} tern_core_info_t;

/* Fills `out_info` for an open core; set `out_info->struct_size` first.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_core_get_info(tern_core_t core, tern_core_info_t* out_info);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_DEVICE_H_ */
