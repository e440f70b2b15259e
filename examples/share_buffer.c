/* share_buffer: share one device buffer between two processes.
 *
 * The parent allocates a buffer with TERN_BUFFER_FLAG_SHAREABLE, fills it,
 * exports it as a file descriptor and starts a child (this same program, run
 * again with "child FD SIZE") that inherits the descriptor. The child imports
 * it on the same device, checks what the parent wrote, and writes an answer
 * into the same memory; the parent reads the answer once the child has
 * exited. No bytes travel through host memory between the two processes:
 * both use the same device memory.
 *
 * The steps:
 *   1. parent: allocate a shareable buffer, write it, export it (a descriptor
 *      of that buffer only; it is close-on-exec, so it is passed on purpose);
 *   2. parent: fork and exec the child with the descriptor's number;
 *   3. child: import the descriptor on device 0, read, check, write;
 *   4. parent: wait for the child, read the buffer, check the answer.
 *
 * Run:   ./share_buffer
 *
 * Exit status: 0 when both processes saw each other's data, 1 when a tern
 * call failed (the message says which and why), 2 when the data was wrong,
 * 3 on a bad command line or when the child could not be started.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <tern/tern.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_TERN_FAILED = 1, EXIT_MISMATCH = 2, EXIT_USAGE = 3 };

#define SIZE (256u * 1024u)

static int failed(tern_status_t status, const char* who, const char* what) {
  const char* name;
  const char* message;
  if (status == TERN_OK) return 0;
  name = tern_status_string(status);
  message = tern_last_error_message();
  fprintf(stderr, "share_buffer (%s): %s failed with %s\n  %s\n", who, what, name, message);
  return 1;
}

/* The byte at `i` of what the parent writes (seed 1) and the child answers
 * (seed 2). */
static unsigned char pattern(uint64_t i, unsigned seed) {
  return (unsigned char)(i * 31u + seed * 101u + (i >> 9));
}

static int check(const unsigned char* bytes, unsigned seed) {
  uint64_t i;
  for (i = 0; i < SIZE; ++i) {
    if (bytes[i] != pattern(i, seed)) return 0;
  }
  return 1;
}

static int run_child(int fd, uint64_t size) {
  int rc = EXIT_TERN_FAILED;
  tern_device_t device = NULL;
  tern_buffer_t buffer = NULL;
  unsigned char* host = malloc(SIZE);
  uint64_t i;
  if (host == NULL) return EXIT_USAGE;
  if (failed(tern_init(NULL), "child", "tern_init")) goto out_free;
  if (failed(tern_device_get(0, &device), "child", "tern_device_get")) goto out;
  /* The memory is the parent's buffer; this handle is the child's own. */
  if (failed(tern_buffer_import(device, fd, size, &buffer), "child", "tern_buffer_import")) {
    goto out;
  }
  close(fd); /* tern keeps a descriptor of its own */
  if (failed(tern_buffer_read(buffer, 0, host, SIZE), "child", "tern_buffer_read")) goto out;
  if (!check(host, 1)) {
    fprintf(stderr, "share_buffer (child): the buffer does not hold what the parent wrote\n");
    rc = EXIT_MISMATCH;
    goto out;
  }
  for (i = 0; i < SIZE; ++i) host[i] = pattern(i, 2);
  if (failed(tern_buffer_write(buffer, 0, host, SIZE), "child", "tern_buffer_write")) goto out;
  printf("child:  read the parent's %u bytes and wrote an answer\n", SIZE);
  rc = EXIT_OK;
out:
  if (buffer != NULL) tern_buffer_free(buffer);
  tern_shutdown();
out_free:
  free(host);
  return rc;
}

int main(int argc, char** argv) {
  int rc = EXIT_TERN_FAILED;
  tern_device_t device = NULL;
  tern_buffer_t buffer = NULL;
  tern_buffer_params_t params;
  unsigned char* host;
  int fd = -1;
  int status = 0;
  pid_t pid;
  uint64_t i;

  if (argc == 4 && strcmp(argv[1], "child") == 0) {
    return run_child(atoi(argv[2]), strtoull(argv[3], NULL, 10));
  }
  if (argc != 1) {
    fprintf(stderr, "usage: share_buffer\n");
    return EXIT_USAGE;
  }
  host = malloc(SIZE);
  if (host == NULL) return EXIT_USAGE;
  if (failed(tern_init(NULL), "parent", "tern_init")) goto out_free;
  if (failed(tern_device_get(0, &device), "parent", "tern_device_get")) goto out;

  /* 1. A buffer that may be shared: asked for at allocation. */
  memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.flags = TERN_BUFFER_FLAG_SHAREABLE;
  params.size = SIZE;
  params.category = TERN_MEMORY_TENSORS;
  if (failed(tern_buffer_alloc(device, &params, &buffer), "parent", "tern_buffer_alloc")) goto out;
  for (i = 0; i < SIZE; ++i) host[i] = pattern(i, 1);
  if (failed(tern_buffer_write(buffer, 0, host, SIZE), "parent", "tern_buffer_write")) goto out;
  if (failed(tern_buffer_export(buffer, &fd), "parent", "tern_buffer_export")) goto out;

  /* 2. The child gets the descriptor by inheritance: clear close-on-exec on
   * its copy only, after fork. (A unix socket with SCM_RIGHTS passes one to
   * a process that is already running.) */
  fflush(stdout);
  pid = fork();
  if (pid < 0) {
    perror("share_buffer: fork");
    rc = EXIT_USAGE;
    goto out;
  }
  if (pid == 0) {
    char fd_text[16], size_text[24];
    snprintf(fd_text, sizeof(fd_text), "%d", fd);
    snprintf(size_text, sizeof(size_text), "%u", SIZE);
    fcntl(fd, F_SETFD, 0);
    /* Only exec after fork: the child must not use the parent's runtime. */
    execl("/proc/self/exe", argv[0], "child", fd_text, size_text, (char*)NULL);
    perror("share_buffer: exec");
    _exit(EXIT_USAGE);
  }
  close(fd);
  fd = -1;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      perror("share_buffer: waitpid");
      rc = EXIT_USAGE;
      goto out;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "share_buffer: the child failed (wait status %d)\n", status);
    rc = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_USAGE;
    goto out;
  }

  /* 4. The child's answer is in our buffer. */
  if (failed(tern_buffer_read(buffer, 0, host, SIZE), "parent", "tern_buffer_read")) goto out;
  if (!check(host, 2)) {
    fprintf(stderr, "share_buffer (parent): the buffer does not hold the child's answer\n");
    rc = EXIT_MISMATCH;
    goto out;
  }
  printf("parent: the child's answer arrived through the shared device buffer\n");
  rc = EXIT_OK;
out:
  if (fd >= 0) close(fd);
  if (buffer != NULL) tern_buffer_free(buffer);
  tern_shutdown();
out_free:
  free(host);
  return rc;
}
