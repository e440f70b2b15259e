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

/* tern_buffer_params_t.flags: the buffer may be exported to other processes
 * with tern_buffer_export(). A shareable buffer is backed by memory of its
 * own (whole pages: its device address is page aligned and it occupies its
 * size rounded up to a page); ask for it only for buffers you will share. */
#define TERN_BUFFER_FLAG_SHAREABLE 0x1u

typedef struct tern_buffer_params_t {
  uint32_t struct_size;            /* IN: sizeof(tern_buffer_params_t) */
  uint32_t flags;                  /* IN: 0 or TERN_BUFFER_FLAG_SHAREABLE */
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

/* Frees `buffer`. Commands that were submitted before this call and may use
 * it are not cut short: the call first waits until every command already
 * given to any queue of the buffer's device has completed (as cudaFree
 * does), so the memory serves no other allocation while they could still read
 * or write it. Do not call it from a host callback of that device's queues
 * (the callback would wait for itself). With nothing in flight it does not
 * wait. A second free of the same handle fails with TERN_ERROR_INVALID_HANDLE.
 * For a shared buffer (exported, or imported) this ends only this process's
 * use: the memory lives on while another process holds it (see
 * tern_buffer_export()). A buffer from tern_queue_alloc() goes back to its
 * pool, idle (tern/memory_pool.h).
 * Thread-safety: safe from any thread; the handle is invalid afterwards. */
TERN_API tern_status_t tern_buffer_free(tern_buffer_t buffer);

/* Sharing device memory between processes.
 *
 * tern_buffer_export() returns a file descriptor for one buffer allocated
 * with TERN_BUFFER_FLAG_SHAREABLE; another process that receives the
 * descriptor (over a unix socket with SCM_RIGHTS, or by inheritance) passes it
 * to tern_buffer_import() and gets a buffer of its own on the same device,
 * backed by the same memory: what one process writes (with copies,
 * executions or tern_buffer_write) the other reads once its work has
 * completed; order work across processes yourself (for example by a
 * message after tern_queue_synchronize()). The descriptor gives access to
 * that buffer only, never to the rest of the device's memory; a process
 * that was not given it cannot import the buffer. (On the simulated device
 * it is a sealed memfd; a hardware backend exports a dma-buf.)
 *
 * Lifetime: the memory lives while any process holds it: a live buffer
 * handle (exported or imported) or an open descriptor. The exporter may free
 * its buffer, or die (SIGKILL included), while an importer goes on using the
 * memory; a descriptor stays importable after its exporter died.
 *
 * Accounting: a shared buffer counts once in the node's device memory
 * (tern_memory_stats_t.node_used_bytes, tools' totals) while any live
 * process holds a handle to it, and under each such process in its own
 * figures (used_bytes, per-process telemetry). When the last holder frees it
 * or dies, the node's count drops. Memory that only open descriptors keep
 * alive counts nowhere; importing it charges the importer, and fails with
 * TERN_ERROR_OUT_OF_MEMORY when the node has no room for it.
 *
 * A process holds at most 256 shared buffers (exported or imported) at once
 * on the simulated device; allocating or importing one more fails with
 * TERN_ERROR_UNAVAILABLE. Backends that cannot share memory fail these calls
 * with TERN_ERROR_UNIMPLEMENTED. */

/* Exports `buffer`, which must have been allocated with
 * TERN_BUFFER_FLAG_SHAREABLE (or imported), and stores a new file descriptor
 * for it in `*out_fd` (set to -1 on entry). The descriptor is close-on-exec
 * and the caller's: close() it when it has been handed on; each call makes a
 * new one. Fails with TERN_ERROR_FAILED_PRECONDITION for a buffer allocated
 * without the flag.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_buffer_export(tern_buffer_t buffer, int* out_fd);

/* Imports the buffer that `fd` (from tern_buffer_export(), in this or
 * another process) stands for into `device`, which must be the device it was
 * allocated on, and stores a new handle in `*out_buffer` (set to NULL on
 * entry). `size` must be the buffer's size as allocated. The new buffer has
 * its own device address in this process; use it as any buffer (copies,
 * executions, tern_buffer_get_info, export) and free it with
 * tern_buffer_free(). `fd` stays the caller's (tern keeps a descriptor of its
 * own). Importing the same descriptor twice gives two handles to the same
 * memory, each to be freed. Fails with TERN_ERROR_INVALID_ARGUMENT when `fd`
 * is not an open descriptor, is not an exported tern buffer (another file,
 * an unsealed or truncated memfd), belongs to another device, or `size` is
 * not the buffer's size (the message gives the real one); with
 * TERN_ERROR_OUT_OF_MEMORY when no process holds the memory any more and the
 * node has no room for it, or this process's device address space has no
 * free block large enough.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_buffer_import(tern_device_t device, int fd, uint64_t size,
                                          tern_buffer_t* out_buffer);

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
