/* tern — collectives: communicators and collective operations.
 *
 * A communicator joins `size` ranks; each rank is one core, in this process
 * or in another process on this or another host. Collective operations are
 * enqueued on tern queues of the rank's core: they run in order with the
 * copies, executions and events of that queue, and every rank of the
 * communicator must enqueue the same collectives in the same order (with the
 * same operation, count, dtype, reduction and root). The shape follows NCCL:
 *
 *   rank 0:   tern_comm_get_unique_id(&id);  ...send id to the other ranks...
 *   rank r:   tern_comm_init_rank(core, size, &id, r, NULL, &comm);
 *             tern_comm_all_reduce(comm, buf, 0, buf, 0, n, TERN_DTYPE_F32,
 *                                  TERN_COMM_SUM, queue);
 *             tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE);
 *             tern_comm_destroy(comm);
 *
 * Data lives in device buffers (a buffer handle plus a byte offset). An
 * operation is in place when its send and receive ranges are the same bytes
 * (for all-gather: when the send range is this rank's block of the receive
 * range; for reduce-scatter: when the receive range is this rank's block of
 * the send range). All-to-all is never in place: its ranges must not overlap.
 *
 * Transport: ranks in one process copy between their buffers directly; ranks
 * in different processes of one host use a shared-memory channel; ranks on
 * different hosts use libfabric (provider efa, else tcp). FI_PROVIDER forces
 * one libfabric provider for every rank outside this process. See
 * docs/collectives.md.
 *
 * Faults: an operation that does not complete within the communicator's
 * timeout (TERN_COMM_TIMEOUT, default 300 s) fails with
 * TERN_ERROR_COMM_TIMEOUT naming the ranks it waited for; a peer process that
 * dies makes the operations of every other rank fail with
 * TERN_ERROR_COMM_PEER_LOST naming its rank and host; ranks that call
 * different operations get TERN_ERROR_COMM_MISMATCH. A failed operation fails
 * its queue like any command (a sticky error naming the operation) and marks
 * the communicator as failed: later operations on it fail at once, and
 * tern_comm_get_async_error() reports the cause. Abort or destroy it, then
 * create a new one.
 *
 * Environment (read when a communicator is created):
 *   TERN_COMM_TIMEOUT         seconds an operation may take (default 300)
 *   TERN_COMM_INIT_TIMEOUT    seconds the bootstrap may take (default 120)
 *   TERN_COMM_ID              "host:port" of the bootstrap root, for
 *                             tern_comm_init_from_env()
 *   TERN_COMM_RANK, TERN_COMM_WORLD_SIZE (or RANK, WORLD_SIZE)
 *   TERN_COMM_SECRET          the communicator's secret for
 *                             tern_comm_init_from_env(): 32 or more hex digits,
 *                             the same on every rank (required across hosts)
 *   TERN_COMM_SECRET_FILE     a file of the user's, mode 600, holding it
 *   TERN_COMM_SOCKET_IFNAME   network interface for the bootstrap
 *   TERN_COMM_LIBFABRIC       the libfabric library to load (default
 *                             libfabric.so.1; loaded only when a channel needs it)
 *   TERN_COMM_SHM             0: ranks of one host use libfabric's shm
 *                             provider instead of tern's shared-memory channel
 *   FI_PROVIDER               libfabric provider for ranks outside the process
 * and the algorithm thresholds listed in docs/collectives.md.
 */
#ifndef TERN_COMM_H_
#define TERN_COMM_H_

#include <stdint.h>

#include "tern/export.h"
#include "tern/isa.h" /* tern_dtype_t */
#include "tern/status.h"
#include "tern/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_comm_s* tern_comm_t; /* one rank's view of a communicator */

/* Names a communicator being created: the address of its bootstrap root and
 * its 256-bit secret (from the OS's random source), which every rank proves it
 * holds when it joins (docs/collectives.md, "Security model"). Plain bytes, but
 * a credential: copy it to the other ranks over a channel only they can read
 * (a file of mode 600, an authenticated socket, MPI, the c10d store). */
#define TERN_COMM_UNIQUE_ID_BYTES 128
typedef struct tern_comm_unique_id_t {
  char internal[TERN_COMM_UNIQUE_ID_BYTES];
} tern_comm_unique_id_t;

/* Reductions. Only grows. */
typedef enum tern_comm_redop_t TERN_ENUM_BASE {
  TERN_COMM_SUM = 0,
  TERN_COMM_PROD = 1,
  TERN_COMM_MAX = 2,
  TERN_COMM_MIN = 3,
  TERN_COMM_AVG = 4, /* the sum divided by the rank count (integers: truncated) */
  TERN_COMM_REDOP_COUNT = 5
} tern_comm_redop_t;

/* Data types: every tern_dtype_t except TERN_DTYPE_BOOL. bf16 and fp16 are
 * reduced in fp32 and rounded to nearest even after each reduction step;
 * integer sums and products wrap around. */

typedef struct tern_comm_config_t {
  uint32_t struct_size;     /* IN: sizeof(tern_comm_config_t) */
  uint32_t flags;           /* IN: reserved, must be 0 */
  uint64_t timeout_ns;      /* IN: per operation; 0: TERN_COMM_TIMEOUT or 300 s */
  uint64_t init_timeout_ns; /* IN: bootstrap; 0: TERN_COMM_INIT_TIMEOUT or 120 s */
  const char* name;         /* IN: optional, shown in errors and logs; copied */
} tern_comm_config_t;

/* Creates the unique id of a new communicator and starts its bootstrap root
 * in this process: a listening TCP socket (on TERN_COMM_SOCKET_IFNAME, else
 * the first interface that is up and not loopback, else loopback) served by
 * a background thread until every rank has joined or the init timeout ran
 * out. Call it once per communicator, in one process, and give the id to
 * every rank. Needs no tern_init().
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_comm_get_unique_id(tern_comm_unique_id_t* out_id);

/* Joins communicator `id` as rank `rank` (0..size-1) of `size`, on `core`
 * (an open core of this process). Blocks until every rank has joined and the
 * transports are connected, or fails with TERN_ERROR_COMM_TIMEOUT after the
 * init timeout naming the ranks that never joined. Ranks of one process must
 * join from different threads (or use tern_comm_init_all). `config` may be
 * NULL.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_comm_init_rank(tern_core_t core, uint32_t size,
                                           const tern_comm_unique_id_t* id, uint32_t rank,
                                           const tern_comm_config_t* config, tern_comm_t* out_comm);

/* Creates a communicator of `count` ranks that all live in this process:
 * rank i runs on cores[i]. Stores the handles in out_comms[0..count-1].
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_comm_init_all(const tern_core_t* cores, uint32_t count,
                                          const tern_comm_config_t* config, tern_comm_t* out_comms);

/* Joins a communicator described by the environment, for launchers such as
 * torchrun: the bootstrap root is TERN_COMM_ID ("host:port"; else
 * MASTER_ADDR and MASTER_PORT + 1), the rank TERN_COMM_RANK (else RANK) and
 * the size TERN_COMM_WORLD_SIZE (else WORLD_SIZE). Rank 0 serves the
 * bootstrap on that port; the others connect to it, retrying until the init
 * timeout. Fails with TERN_ERROR_INVALID_ARGUMENT naming a missing or
 * malformed variable.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_comm_init_from_env(tern_core_t core, const tern_comm_config_t* config,
                                               tern_comm_t* out_comm);

/* Value of `color` for ranks that join no new communicator. */
#define TERN_COMM_SPLIT_NOCOLOR (-1)

/* Splits `comm`: every rank calls it (collectively, from the threads that
 * own the ranks, with no operation of `comm` in flight); ranks with the same
 * `color` (>= 0) form a new communicator, ordered by `key` then by their rank
 * in `comm`. A rank passing TERN_COMM_SPLIT_NOCOLOR gets NULL. The new
 * communicator runs on the same core. `config` may be NULL (the parent's
 * timeouts are used).
 * Thread-safety: safe from any thread; collective over `comm`. */
TERN_API tern_status_t tern_comm_split(tern_comm_t comm, int32_t color, int32_t key,
                                       const tern_comm_config_t* config, tern_comm_t* out_comm);

/* Waits for the operations enqueued on `comm` to finish (each ends by
 * completing, failing or timing out), tells the other ranks this one left,
 * and destroys the communicator. Returns TERN_OK, or the communicator's
 * asynchronous error if it had one.
 * Thread-safety: safe from any thread; the handle is invalid afterwards and
 * no other thread may enqueue on it meanwhile. */
TERN_API tern_status_t tern_comm_destroy(tern_comm_t comm);

/* Aborts `comm`: operations in flight fail at once with
 * TERN_ERROR_COMM_ABORTED, later ones are not run, the other ranks are told
 * (their operations fail with TERN_ERROR_COMM_ABORTED naming this rank), and
 * the communicator is destroyed without waiting for peers.
 * Thread-safety: safe from any thread, including while another thread
 * waits on a queue that runs an operation of `comm`; the handle is invalid
 * afterwards. */
TERN_API tern_status_t tern_comm_abort(tern_comm_t comm);

/* Stores TERN_OK in `*out_error` if `comm` is healthy, or the error that
 * broke it (a peer lost, a timeout, a mismatch, an abort by some rank). When
 * it is not TERN_OK, tern_last_error_message() gives its message. The call
 * itself returns TERN_OK unless `comm` is not a valid handle. Does not block.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_comm_get_async_error(tern_comm_t comm, tern_status_t* out_error);

typedef struct tern_comm_info_t {
  uint32_t struct_size; /* IN: sizeof(tern_comm_info_t) */
  uint32_t rank;        /* this rank, 0..size-1 */
  uint32_t size;        /* ranks in the communicator */
  uint32_t local_rank;  /* index among the ranks on this host */
  uint32_t local_size;  /* ranks on this host */
  uint32_t node_count;  /* hosts the communicator spans */
  tern_core_t core;     /* the core this rank runs on */
  tern_device_t device; /* its device */
  char transport[64];   /* channels in use, e.g. "local+tern-shm", "tcp;ofi_rxm", "efa" */
} tern_comm_info_t;

/* Fills `out_info`; set `out_info->struct_size` first.
 * Thread-safety: safe from any thread. */
TERN_API tern_status_t tern_comm_get_info(tern_comm_t comm, tern_comm_info_t* out_info);

/* Operations. Each validates its arguments (handles, ranges, dtype, root,
 * that `queue` runs on the communicator's core and the buffers live on its
 * device), enqueues one command on `queue` and returns; the command runs when
 * the queue reaches it. Counts are in elements; a count of 0 enqueues an
 * empty command and communicates nothing. Every rank must pass the same
 * count, dtype, reduction and root. A buffer argument that the operation
 * does not use on this rank (the receive buffer of reduce on a non-root rank)
 * may be NULL.
 * Thread-safety (all of them): safe from any thread; the operations of one
 * communicator must be enqueued in the same order on every rank, so callers
 * that enqueue from several threads must order those calls themselves. */

/* recv[i] = op over ranks of send[i], for i < count, on every rank. */
TERN_API tern_status_t tern_comm_all_reduce(tern_comm_t comm, tern_buffer_t send,
                                            uint64_t send_offset, tern_buffer_t recv,
                                            uint64_t recv_offset, uint64_t count,
                                            tern_dtype_t dtype, tern_comm_redop_t op,
                                            tern_queue_t queue);

/* recv = send of rank `root`, count elements, on every rank (send is read on
 * the root only; in place when the root passes the same range twice). */
TERN_API tern_status_t tern_comm_broadcast(tern_comm_t comm, tern_buffer_t send,
                                           uint64_t send_offset, tern_buffer_t recv,
                                           uint64_t recv_offset, uint64_t count, tern_dtype_t dtype,
                                           uint32_t root, tern_queue_t queue);

/* recv on rank `root` = op over ranks of send; recv is not touched elsewhere. */
TERN_API tern_status_t tern_comm_reduce(tern_comm_t comm, tern_buffer_t send, uint64_t send_offset,
                                        tern_buffer_t recv, uint64_t recv_offset, uint64_t count,
                                        tern_dtype_t dtype, tern_comm_redop_t op, uint32_t root,
                                        tern_queue_t queue);

/* recv[r * send_count + i] = send of rank r [i]: recv holds size * send_count
 * elements. */
TERN_API tern_status_t tern_comm_all_gather(tern_comm_t comm, tern_buffer_t send,
                                            uint64_t send_offset, tern_buffer_t recv,
                                            uint64_t recv_offset, uint64_t send_count,
                                            tern_dtype_t dtype, tern_queue_t queue);

/* recv[i] = op over ranks of send[rank * recv_count + i]: send holds
 * size * recv_count elements. */
TERN_API tern_status_t tern_comm_reduce_scatter(tern_comm_t comm, tern_buffer_t send,
                                                uint64_t send_offset, tern_buffer_t recv,
                                                uint64_t recv_offset, uint64_t recv_count,
                                                tern_dtype_t dtype, tern_comm_redop_t op,
                                                tern_queue_t queue);

/* Block j of send (count elements) goes to rank j, and arrives as block r of
 * recv on rank j when sent by rank r: both hold size * count elements. */
TERN_API tern_status_t tern_comm_all_to_all(tern_comm_t comm, tern_buffer_t send,
                                            uint64_t send_offset, tern_buffer_t recv,
                                            uint64_t recv_offset, uint64_t count,
                                            tern_dtype_t dtype, tern_queue_t queue);

/* Point to point: count elements to rank `peer`, or from it. A send may
 * wait until the peer's matching receive runs, so two ranks that send to
 * each other must put their send and receive in one group (below). Sends and
 * receives between two ranks match in the order they are enqueued. */
TERN_API tern_status_t tern_comm_send(tern_comm_t comm, tern_buffer_t send, uint64_t send_offset,
                                      uint64_t count, tern_dtype_t dtype, uint32_t peer,
                                      tern_queue_t queue);
TERN_API tern_status_t tern_comm_recv(tern_comm_t comm, tern_buffer_t recv, uint64_t recv_offset,
                                      uint64_t count, tern_dtype_t dtype, uint32_t peer,
                                      tern_queue_t queue);

/* A receive from whichever rank sends to this one (MPI's any source): count
 * elements of the first rank found to have a send for this rank enqueued
 * that no receive has taken yet. `*out_peer` (host memory that must stay
 * valid until the command completes) gets that rank before the command
 * completes. The sender uses tern_comm_send as for any receive; its count
 * and dtype must match. Finding the sender costs control-plane round trips
 * (tens to hundreds of microseconds): use tern_comm_recv when the peer is
 * known. Receives enqueued after it on this communicator take their place in
 * each peer's order when they run, so enqueue the receives of a
 * communicator that uses it on one queue. count must be > 0; not allowed in
 * a group. Fails with TERN_ERROR_COMM_TIMEOUT when no rank sends within the
 * communicator's timeout.
 * Thread-safety: as the other operations. */
TERN_API tern_status_t tern_comm_recv_any(tern_comm_t comm, tern_buffer_t recv,
                                          uint64_t recv_offset, uint64_t count, tern_dtype_t dtype,
                                          uint32_t* out_peer, tern_queue_t queue);

/* Completes on each rank once every rank has reached it. */
TERN_API tern_status_t tern_comm_barrier(tern_comm_t comm, tern_queue_t queue);

/* Groups: sends and receives enqueued by this thread between group_start and
 * group_end run together (all posted, then all awaited), as one command per
 * communicator and queue, enqueued by tern_comm_group_end. Groups nest; the
 * outermost end enqueues. Only tern_comm_send and tern_comm_recv may be
 * grouped: a collective inside a group fails with
 * TERN_ERROR_FAILED_PRECONDITION. An argument error inside a group is
 * returned at once and the operation is left out.
 * Thread-safety: per thread. */
TERN_API tern_status_t tern_comm_group_start(void);
TERN_API tern_status_t tern_comm_group_end(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TERN_COMM_H_ */
