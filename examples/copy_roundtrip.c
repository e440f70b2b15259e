/* copy_roundtrip: move data to a device, across it, and back.
 *
 * The steps are the ones every tern program takes before it runs anything:
 *   1. start the runtime and open a core (cores are owned by one process);
 *   2. create a queue on the core: an in-order stream of commands;
 *   3. allocate device memory, and pinned host memory to copy from and to;
 *   4. submit H2D, D2D and D2H copies, with events between them that take
 *      device timestamps, then wait once for the whole chain;
 *   5. check every byte came back and print what each copy cost;
 *   6. clean up.
 *
 * Run:   ./copy_roundtrip          (copies 2 MiB)
 *        ./copy_roundtrip 64       (copies 64 MiB; pinning that much may need
 *                                   a larger `ulimit -l`)
 *
 * Exit status: 0 when the data came back intact, 1 when a tern call failed
 * (the message says which and why), 2 when the data came back wrong, 3 on a
 * bad command line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tern/tern.h>

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_MISMATCH = 2, EXIT_USAGE = 3 };

#define MIB (1024ull * 1024ull)

/* Prints a failed call with its status name and the runtime's message, and
 * returns 1 so that callers can write `if (failed(...)) goto out;`. */
static int failed(tern_status_t status, const char* what) {
  const char* name;
  const char* message;
  if (status == TERN_OK) return 0;
  /* Read the message last: it stays valid only until the next tern call on
   * this thread, and tern_status_string() is a tern call too. */
  name = tern_status_string(status);
  message = tern_last_error_message();
  fprintf(stderr, "copy_roundtrip: %s failed with %s\n  %s\n", what, name, message);
  return 1;
}

/* A pattern that differs from byte to byte and from one 64 KiB block to the
 * next, so that a copy landing at the wrong offset is caught, not only a
 * copy that did not happen. */
static unsigned char pattern_byte(uint64_t i) { return (unsigned char)((i * 131u) ^ (i >> 16)); }

/* Prints one line: "H2D   2.00 MiB in   0.312 ms =   6.72 GB/s". */
static int print_copy(const char* what, uint64_t bytes, tern_event_t start, tern_event_t end) {
  uint64_t ns = 0;
  /* Events are timestamped by the device when the queue reaches them, so the
   * difference is the time the copy took on the device, not host overhead. */
  if (failed(tern_event_elapsed_ns(start, end, &ns), "tern_event_elapsed_ns")) return 1;
  if (ns == 0) {
    printf("  %-4s %8.2f MiB in  < 1 ns (too small to time)\n", what, (double)bytes / MIB);
  } else {
    /* bytes per nanosecond is GB/s (decimal gigabytes). */
    printf("  %-4s %8.2f MiB in %9.3f ms = %7.2f GB/s\n", what, (double)bytes / MIB, ns / 1e6,
           (double)bytes / (double)ns);
  }
  return 0;
}

/* Steps 4 and 5: copies host -> first -> second -> host, checks the bytes
 * and prints the time of each copy. Returns an exit code. */
static int round_trip(tern_queue_t queue, tern_buffer_t first, tern_buffer_t second,
                      const unsigned char* host_src, unsigned char* host_dst, uint64_t size,
                      tern_event_t marks[4], const char* label) {
  uint64_t i;

  /* Anything but the pattern: a D2H copy that silently did nothing must not
   * pass the check below. */
  memset(host_dst, 0xA5, size);

  /* Submit everything, then wait once. Each call returns as soon as the
   * command is queued; the queue runs them in order, so the D2D copy cannot
   * start before the H2D copy is done. Events in between timestamp the
   * boundaries (recording an event again moves it to the new point).
   * host_src must stay valid and unchanged until the H2D copy completes. */
  if (failed(tern_queue_record_event(queue, marks[0], NULL), "tern_queue_record_event") ||
      failed(tern_queue_copy_h2d(queue, first, 0, host_src, size, NULL), "tern_queue_copy_h2d") ||
      failed(tern_queue_record_event(queue, marks[1], NULL), "tern_queue_record_event") ||
      failed(tern_queue_copy_d2d(queue, second, 0, first, 0, size, NULL), "tern_queue_copy_d2d") ||
      failed(tern_queue_record_event(queue, marks[2], NULL), "tern_queue_record_event") ||
      failed(tern_queue_copy_d2h(queue, host_dst, second, 0, size, NULL), "tern_queue_copy_d2h") ||
      failed(tern_queue_record_event(queue, marks[3], NULL), "tern_queue_record_event")) {
    return EXIT_TERN_FAILED;
  }

  /* A copy that fails makes the queue's error sticky: synchronize returns it
   * with a message naming the command that failed. */
  if (failed(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE), "tern_queue_synchronize")) {
    return EXIT_TERN_FAILED;
  }

  /* The bytes must have made the whole round trip unchanged. */
  for (i = 0; i < size; ++i) {
    if (host_dst[i] != pattern_byte(i)) {
      fprintf(stderr,
              "copy_roundtrip: data mismatch at byte %llu of %llu: expected 0x%02x, got 0x%02x\n",
              (unsigned long long)i, (unsigned long long)size, pattern_byte(i), host_dst[i]);
      return EXIT_MISMATCH;
    }
  }
  printf("%s: %.2f MiB went host -> device -> device -> host intact\n", label, (double)size / MIB);
  if (print_copy("H2D", size, marks[0], marks[1]) || print_copy("D2D", size, marks[1], marks[2]) ||
      print_copy("D2H", size, marks[2], marks[3])) {
    return EXIT_TERN_FAILED;
  }
  return EXIT_OK;
}

int main(int argc, char** argv) {
  uint64_t size = 2 * MIB;
  tern_device_t device = NULL;
  tern_core_t core = NULL;
  tern_queue_t queue = NULL;
  tern_buffer_t first = NULL, second = NULL;
  unsigned char* host_src = NULL;
  unsigned char* host_dst = NULL;
  void* pinned = NULL;
  tern_event_t marks[4] = {NULL, NULL, NULL, NULL};
  tern_buffer_params_t params;
  tern_queue_params_t queue_params;
  uint64_t i;
  long mib;
  char* end;
  int m;
  int exit_code = EXIT_TERN_FAILED; /* until every step has succeeded */

  if (argc > 2) {
    fprintf(stderr, "usage: %s [MiB to copy, 1-4096; default 2]\n", argv[0]);
    return EXIT_USAGE;
  }
  if (argc == 2) {
    mib = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || mib < 1 || mib > 4096) {
      fprintf(stderr, "usage: %s [MiB to copy, 1-4096; default 2]\n", argv[0]);
      return EXIT_USAGE;
    }
    size = (uint64_t)mib * MIB;
  }

  if (failed(tern_init(NULL), "tern_init")) return EXIT_TERN_FAILED;

  /* 1. Device 0, core 0. Opening a core takes it for this process alone;
   * TERN_ERROR_BUSY names the process that holds it already. */
  if (failed(tern_device_get(0, &device), "tern_device_get(0)")) goto out;
  if (failed(tern_core_open(device, 0, &core), "tern_core_open(device 0, core 0)")) goto out;

  /* 2. A queue runs its commands in order, so the three copies below need
   * no synchronization between them. The name shows up in error messages. */
  memset(&queue_params, 0, sizeof(queue_params));
  queue_params.struct_size = sizeof(queue_params);
  queue_params.name = "copy_roundtrip";
  if (failed(tern_queue_create(core, &queue_params, &queue), "tern_queue_create")) goto out;

  /* 3. Two device buffers (the D2D copy needs a destination), tagged as
   * tensors for the memory accounting that tools and OOM errors show. */
  memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.size = size;
  params.alignment = 0; /* the device minimum */
  params.category = TERN_MEMORY_TENSORS;
  if (failed(tern_buffer_alloc(device, &params, &first), "tern_buffer_alloc(first)")) goto out;
  if (failed(tern_buffer_alloc(device, &params, &second), "tern_buffer_alloc(second)")) goto out;

  /* Pinned host memory: the device copies straight from and to it. Ordinary
   * malloc'ed memory works too, but a real device has to stage it through a
   * bounce buffer first. */
  if (failed(tern_host_alloc(size, &pinned), "tern_host_alloc(source)")) goto out;
  host_src = pinned;
  if (failed(tern_host_alloc(size, &pinned), "tern_host_alloc(destination)")) goto out;
  host_dst = pinned;
  for (i = 0; i < size; ++i) host_src[i] = pattern_byte(i);

  for (m = 0; m < 4; ++m) {
    if (failed(tern_event_create(&marks[m]), "tern_event_create")) goto out;
  }

  /* 4 and 5, twice. The first pass is cold: the simulated device commits
   * its memory when it is first written, as the OS does for host memory, so
   * that pass also pays for page faults. The second pass shows what copies
   * cost in a program that reuses its buffers. */
  exit_code =
      round_trip(queue, first, second, host_src, host_dst, size, marks, "first pass (cold)");
  if (exit_code == EXIT_OK) {
    exit_code = round_trip(queue, first, second, host_src, host_dst, size, marks, "second pass");
  }

out:
  /* 6. Clean up in reverse order, whatever happened above. A queue must be
   * destroyed before its core is closed (destroy waits for its commands),
   * and buffers should be freed only when no command uses them any more.
   * The last tern_shutdown() would release all of this anyway; doing it
   * explicitly shows the order and reports anything that went wrong. */
  for (m = 3; m >= 0; --m) {
    if (marks[m] != NULL && failed(tern_event_destroy(marks[m]), "tern_event_destroy")) {
      exit_code = EXIT_TERN_FAILED;
    }
  }
  if (queue != NULL && failed(tern_queue_destroy(queue), "tern_queue_destroy")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (host_dst != NULL && failed(tern_host_free(host_dst), "tern_host_free")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (host_src != NULL && failed(tern_host_free(host_src), "tern_host_free")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (second != NULL && failed(tern_buffer_free(second), "tern_buffer_free")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (first != NULL && failed(tern_buffer_free(first), "tern_buffer_free")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (core != NULL && failed(tern_core_close(core), "tern_core_close")) {
    exit_code = EXIT_TERN_FAILED;
  }
  if (failed(tern_shutdown(), "tern_shutdown")) exit_code = EXIT_TERN_FAILED;
  return exit_code;
}
