/* tern/memory_pool.h — stream-ordered device memory and memory pools.
 *
 * tern_queue_alloc() and tern_queue_free() allocate and free device memory
 * as points of a queue, like cuMemAllocAsync / cuMemFreeAsync: an
 * allocation is usable by the commands submitted to its queue after the
 * call, and a free takes effect when the queue reaches the point where it
 * was called. Neither call waits for the device, and neither enqueues a
 * command: the runtime places the memory on the host at once and uses the
 * queue's timeline to know when a freed block is idle.
 *
 * The memory comes from a pool (one device, one memory category). A pool
 * keeps freed blocks for reuse:
 * - a block freed on a queue is reusable at once by later allocations on the
 *   same queue (queue order protects it: the commands that used it were
 *   submitted before those that will);
 * - by another queue, or by tern_buffer_alloc(), only once the first queue
 *   has reached the free (the pool looks at the queue's timeline; it never
 *   hands a block that a queue may still use to another queue).
 * Blocks are rounded up to size classes (at least 512 bytes, then four
 * classes per power of two: at most 25% more than asked) and a freed block
 * serves later requests of its class. Freed memory that is idle and above
 * the pool's release threshold goes back to the device at the pool's
 * synchronisation points: every tern_queue_alloc() and tern_queue_free() on
 * the pool (each looks at the timelines of the queues its pending blocks were
 * freed on: no host wait is needed to learn that a block is idle),
 * tern_memory_pool_trim_to() and tern_memory_pool_destroy(). A pool left
 * alone keeps what it holds until one of them. When the device cannot supply
 * a block, the pool gives back its idle blocks and tries once more.
 *
 * Ordering contract (as for other runtimes' stream-ordered allocators): a
 * queue-allocated buffer may be used, and freed, on another queue only after
 * that queue is ordered after the allocation (an event recorded on the
 * allocating queue after tern_queue_alloc(), waited on by the other queue),
 * and every command that uses a buffer must be ordered before its free.
 * Synchronous tern_buffer_read()/tern_buffer_write() of a queue-allocated
 * buffer are valid once the allocating queue has been synchronized.
 *
 * Mixing the two ways of freeing:
 * - tern_buffer_free() of a queue-allocated buffer is defined: as always
 *   with tern_buffer_free(), it first waits for the commands already given
 *   to the device's queues, and the block goes back to its pool, idle,
 *   reusable by every queue at once.
 * - tern_queue_free() of a buffer from tern_buffer_alloc() fails with
 *   TERN_ERROR_INVALID_ARGUMENT and changes nothing: such a buffer has no
 *   pool to return to; free it with tern_buffer_free().
 *
 * Accounting: every block a pool holds (in use or cached) is device memory
 * of the pool's category, counted in tern_device_memory_stats() as used by
 * this process, so that the tools show what the pool keeps from others.
 */
#ifndef TERN_MEMORY_POOL_H_
#define TERN_MEMORY_POOL_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_memory_pool_s* tern_memory_pool_t; /* stream-ordered memory of one device */

typedef struct tern_memory_pool_params_t {
  uint32_t struct_size;            /* IN: sizeof(tern_memory_pool_params_t) */
  uint32_t flags;                  /* IN: reserved, must be 0 */
  uint64_t release_threshold;      /* IN: bytes of idle freed memory the pool may keep cached;
                                      idle memory above it goes back to the device at the pool's
                                      synchronisation points. 0 keeps none; UINT64_MAX keeps all
                                      (until tern_memory_pool_trim_to) */
  tern_memory_category_t category; /* IN: what the pool's memory is for (accounting) */
  uint32_t reserved;               /* IN: must be 0 */
} tern_memory_pool_params_t;

/* Creates a pool of device memory on `device` and stores its handle in
 * `*out_pool` (set to NULL on entry). The pool holds no memory until its
 * first allocation. Fails with TERN_ERROR_INVALID_ARGUMENT for a bad
 * struct_size, flags, reserved field or category.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_memory_pool_create(tern_device_t device,
                                               const tern_memory_pool_params_t* params,
                                               tern_memory_pool_t* out_pool);

/* Destroys `pool`, returning its cached memory to the device. Fails with
 * TERN_ERROR_FAILED_PRECONDITION, naming how many allocations and bytes are
 * outstanding, while buffers allocated from it are live (free them first),
 * and for a device's default pool (it lives as long as the runtime); the pool
 * is then unchanged. Blocks freed on queues that have not reached the free
 * yet are returned once the queues reach it: destroy waits for that.
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_memory_pool_destroy(tern_memory_pool_t pool);

/* Stores the default pool of `device` in `*out_pool`: the pool that
 * tern_queue_alloc() uses when given none. It exists from tern_init() to
 * tern_shutdown(), holds TERN_MEMORY_TENSORS memory, and starts with a
 * release threshold of 0 (change it with tern_memory_pool_set_attribute).
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_device_default_memory_pool(tern_device_t device,
                                                       tern_memory_pool_t* out_pool);

/* Pool attributes. Only grows. */
typedef enum tern_memory_pool_attribute_t TERN_ENUM_BASE {
  /* uint64_t bytes, read and write: see tern_memory_pool_params_t. Lowering
   * it takes effect at the pool's next synchronisation point. */
  TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD = 0,
  /* uint64_t, read only: the pool's tern_memory_category_t. */
  TERN_MEMORY_POOL_ATTR_CATEGORY = 1,
  TERN_MEMORY_POOL_ATTR_COUNT = 2
} tern_memory_pool_attribute_t;

/* Sets `attribute` of `pool` to `value`. Fails with
 * TERN_ERROR_INVALID_ARGUMENT for an unknown or read-only attribute.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_memory_pool_set_attribute(tern_memory_pool_t pool,
                                                      tern_memory_pool_attribute_t attribute,
                                                      uint64_t value);

/* Stores the value of `attribute` of `pool` in `*out_value` (set to 0 on
 * entry). Fails with TERN_ERROR_INVALID_ARGUMENT for an unknown attribute.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_memory_pool_get_attribute(tern_memory_pool_t pool,
                                                      tern_memory_pool_attribute_t attribute,
                                                      uint64_t* out_value);

/* Returns idle cached memory to the device until the pool holds at most
 * `keep_bytes` of it (0: all of it). Blocks whose free a queue has not
 * reached yet, and live allocations, are kept; the call does not wait.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_memory_pool_trim_to(tern_memory_pool_t pool, uint64_t keep_bytes);

typedef struct tern_memory_pool_stats_t {
  uint32_t struct_size;         /* IN: sizeof(tern_memory_pool_stats_t) */
  uint32_t allocation_count;    /* live allocations from the pool */
  uint64_t reserved_bytes;      /* device memory the pool holds: used + cached */
  uint64_t used_bytes;          /* held by live allocations (block sizes) */
  uint64_t requested_bytes;     /* what the live allocations asked for */
  uint64_t cached_bytes;        /* freed blocks kept for reuse */
  uint64_t pending_bytes;       /* of cached_bytes: freed on a queue that has not reached the
                                   free yet (reusable only by that queue) */
  uint64_t peak_reserved_bytes; /* highest reserved_bytes since creation */
  uint64_t peak_used_bytes;     /* highest used_bytes since creation */
  uint64_t release_threshold;   /* the attribute's current value */
  uint64_t allocations;         /* tern_queue_alloc() calls served since creation */
  uint64_t reused_same_queue;   /* of which by a block freed on the same queue */
  uint64_t reused_other_queue;  /* of which by an idle block freed elsewhere */
  uint64_t device_allocations;  /* blocks taken from the device since creation */
  uint64_t device_releases;     /* blocks given back to the device since creation */
} tern_memory_pool_stats_t;

/* Fills `out_stats` for `pool`; set `out_stats->struct_size` first. Changes
 * nothing in the pool.
 * Thread-safety: safe from any thread; the figures are a snapshot. */
TERN_API tern_status_t tern_memory_pool_get_stats(tern_memory_pool_t pool,
                                                  tern_memory_pool_stats_t* out_stats);

/* Allocates `size` bytes (> 0) of device memory from `pool` (NULL: the
 * default pool of the queue's device) as a point of `queue`, and stores the
 * buffer in `*out_buffer` (set to NULL on entry). The buffer is usable by the
 * commands submitted to `queue` after this call (see the ordering contract
 * above); its device address is aligned to at least 64 bytes and its
 * contents are unspecified. Nothing is enqueued. Fails with
 * TERN_ERROR_INVALID_ARGUMENT for a size of 0 or a pool of another device
 * than the queue's, and with TERN_ERROR_OUT_OF_MEMORY (the report of
 * tern_buffer_alloc, after the pool gave back its idle memory) when the
 * device cannot supply the block.
 * Thread-safety: safe from any thread; several threads may allocate from one
 * pool on one or several queues. */
TERN_API tern_status_t tern_queue_alloc(tern_queue_t queue, uint64_t size, tern_memory_pool_t pool,
                                        tern_buffer_t* out_buffer);

/* Frees `buffer`, which tern_queue_alloc() returned, as a point of `queue`:
 * the handle is invalid at once (later use fails with
 * TERN_ERROR_INVALID_HANDLE), and the memory returns to its pool when the
 * queue reaches this point, which is reusable by `queue` at once (see
 * above). Commands that use the buffer must be ordered before the free.
 * Nothing is enqueued and nothing waits. Fails, changing nothing, with
 * TERN_ERROR_INVALID_HANDLE for a buffer already freed, with
 * TERN_ERROR_INVALID_ARGUMENT for a buffer from tern_buffer_alloc() or a
 * queue of another device than the buffer's.
 * Thread-safety: safe from any thread; as for tern_buffer_free, the handle is
 * invalid afterwards. */
TERN_API tern_status_t tern_queue_free(tern_queue_t queue, tern_buffer_t buffer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_MEMORY_POOL_H_ */
