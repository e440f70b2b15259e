/* tern — device memory and pinned host memory.
 *
 * Device memory is allocated from a device's HBM by category. A buffer's
 * device address is an address in the device's address space: on the
 * simulated device in protect mode (the default) the host cannot read or
 * write through it (a stray dereference faults at once); move data with the
 * copy commands in queue.h or the synchronous helpers below.
 *
 * Capacity is shared by every process on the node: an allocation fails with
 * TERN_ERROR_OUT_OF_MEMORY when the node's device memory is used up, and the
 * message says how much was asked, how much is free, the largest free block
 * and the top users by category.
 */
#ifndef TERN_MEMORY_H_
#define TERN_MEMORY_H_

#include <stddef.h>
#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_buffer_params_t {
  uint32_t struct_size;            /* IN: sizeof(tern_buffer_params_t) */
  uint32_t flags;                  /* IN: reserved, must be 0 */
  uint64_t size;                   /* IN: bytes, > 0 */
  uint64_t alignment;              /* IN: power of two, or 0 for the device minimum (64);
                                      at most the device memory size rounded up to a power
                                      of two (else TERN_ERROR_INVALID_ARGUMENT) */
  tern_memory_category_t category; /* IN: what the memory is for */
} tern_buffer_params_t;

/* The name of `category` as the tools print it ("tensors", "constants",
 * "code", "scratch", "collectives", "runtime"), or "unknown" for a value this
 * version does not know. Never NULL.
 * Thread-safety: safe from any thread; callable before tern_init(). */
TERN_API const char* tern_memory_category_name(tern_memory_category_t category);

/* Allocates device memory on `device` and stores the handle in `*out_buffer`
 * (set to NULL on entry). The contents are unspecified.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_buffer_alloc(tern_device_t device, const tern_buffer_params_t* params,
                                         tern_buffer_t* out_buffer);

/* Frees `buffer`. Commands already submitted that use it must have completed;
 * a second free of the same handle fails with TERN_ERROR_INVALID_HANDLE. A
 * buffer from tern_queue_alloc() goes back to its pool, idle
 * (tern/memory_pool.h).
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_buffer_free(tern_buffer_t buffer);

typedef struct tern_buffer_info_t {
  uint32_t struct_size; /* IN: sizeof(tern_buffer_info_t) */
  uint32_t reserved;
  uint64_t size;           /* bytes requested */
  uint64_t device_address; /* where the buffer starts in the device's address space */
  tern_memory_category_t category;
  tern_device_t device;
} tern_buffer_info_t;

/* Fills `out_info`; set `out_info->struct_size` first.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_buffer_get_info(tern_buffer_t buffer, tern_buffer_info_t* out_info);

/* Copies `size` bytes from host memory `src` into `buffer` at `offset` and
 * returns when they have arrived. Runs on the device's internal DMA path, not
 * on a queue; use the queue commands to order copies with other work.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_buffer_write(tern_buffer_t buffer, uint64_t offset, const void* src,
                                         uint64_t size);

/* Copies `size` bytes of `buffer` from `offset` into host memory `dst` and
 * returns when they have arrived.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_buffer_read(tern_buffer_t buffer, uint64_t offset, void* dst,
                                        uint64_t size);

typedef struct tern_memory_stats_t {
  uint32_t struct_size;        /* IN: sizeof(tern_memory_stats_t) */
  uint32_t allocation_count;   /* live allocations of this process */
  uint64_t capacity_bytes;     /* device memory capacity */
  uint64_t used_bytes;         /* used by this process */
  uint64_t peak_used_bytes;    /* highest used_bytes since tern_init */
  uint64_t node_used_bytes;    /* used by every process on the node */
  uint64_t free_bytes;         /* capacity - node_used_bytes */
  uint64_t largest_free_block; /* largest single allocation that could succeed now */
  uint64_t used_by_category[TERN_MEMORY_CATEGORY_COUNT];      /* this process */
  uint64_t node_used_by_category[TERN_MEMORY_CATEGORY_COUNT]; /* every process */
} tern_memory_stats_t;

/* Fills `out_stats` for `device`; set `out_stats->struct_size` first.
 * Thread-safety: safe from any thread; the figures are a snapshot. */
TERN_API tern_status_t tern_device_memory_stats(tern_device_t device,
                                                tern_memory_stats_t* out_stats);

/* Allocates `size` bytes of pinned (page-locked) host memory, page aligned,
 * and stores its address in `*out_ptr`. Copies between pinned memory and a
 * device run without staging.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_host_alloc(uint64_t size, void** out_ptr);

/* Frees memory from tern_host_alloc(). A pointer tern did not allocate fails
 * with TERN_ERROR_INVALID_ARGUMENT and is left alone.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_host_free(void* ptr);

/* Registers an existing host range [ptr, ptr + size) for DMA, as pinned
 * memory from tern_host_alloc() is: its pages are faulted in and locked
 * (mlock), so copies between it and a device never wait on a page fault (a
 * data loader's buffers copy as fast as tern_host_alloc()'s). The range is
 * widened to whole pages. Fails with TERN_ERROR_INVALID_ARGUMENT for a NULL
 * pointer, a size of 0, or a range that overlaps a registered one or memory
 * from tern_host_alloc() (the message names it), and with
 * TERN_ERROR_HOST_OUT_OF_MEMORY when the pages cannot be locked (the
 * locked-memory limit: ulimit -l). Copies from unregistered host memory stay
 * valid; they may be slower. The memory must stay mapped until unregistered;
 * tern_shutdown() unregisters what is left.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_host_register(void* ptr, uint64_t size);

/* Ends the registration that tern_host_register(ptr, ...) made (pass the
 * same pointer): its pages are unlocked; the memory itself stays the
 * caller's. A pointer that starts no registration fails with
 * TERN_ERROR_INVALID_ARGUMENT and changes nothing. Copies still queued from
 * the range must have completed (synchronize first), as for tern_host_free().
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_host_unregister(void* ptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_MEMORY_H_ */
