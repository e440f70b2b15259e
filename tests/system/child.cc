// tern_test_child: the helper process of the multi-process system tests. It
// uses only the public C API and is driven by argv:
//
//   tern_test_child hold-core DEV CORES BYTES [--constants BYTES] [--busy]
//       Initializes tern, opens every core in CORES ("0" or "0,1") of device
//       DEV, allocates BYTES of tensor memory (and BYTES of constants with
//       --constants) and writes all of it so that it is committed, prints
//       "ready\n", then holds everything until it is killed or its stdin
//       reaches end-of-file; then it shuts tern down and exits 0. With --busy
//       it keeps running batches of commands on a queue of the first core
//       meanwhile (telemetry tests watch the counters grow).
//   tern_test_child try-core DEV CORE
//       Initializes tern and tries to open the core. Prints the status name
//       and the last error message on two lines and exits with the status
//       code (0 when the core opened).
//
//   tern_test_child share-import DEV SIZE
//       Receives a descriptor from tern_buffer_export() over the unix socket
//       that is its descriptor 3 (SCM_RIGHTS), imports it on device DEV as a
//       buffer of SIZE bytes, prints "imported", then runs the commands of
//       memory_share_test.cc read from stdin, one a line, answering one line
//       each (see ShareCommands); shuts down at end-of-file.
//   tern_test_child share-export DEV SIZE SEED
//       Allocates a shareable buffer of SIZE bytes on device DEV, fills it
//       with the test pattern SEED, sends its descriptor over the unix socket
//       that is its descriptor 3, prints "ready" and runs commands as above.
//   tern_test_child share-probe DEV SIZE FD
//       A process that was given no descriptor: tries to import FD (a number
//       that is a buffer's descriptor in its parent) and prints the status
//       name, then the number of exported tern buffers among its own
//       descriptors ("tern-buffer memfds: N").
//
// A failed setup step prints "error: <step>: <status> <message>" and exits
// with 100 + status code % 100.
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <tern/tern.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kWriteChunk = 4ull << 20;

[[noreturn]] void Fail(const char* step, tern_status_t status) {
  std::printf("error: %s: %s %s\n", step, tern_status_string(status), tern_last_error_message());
  std::fflush(stdout);
  std::_Exit(100 + status % 100);
}

void Check(const char* step, tern_status_t status) {
  if (status != TERN_OK) Fail(step, status);
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: tern_test_child hold-core DEV CORES BYTES [--constants BYTES] [--busy]\n"
               "       tern_test_child try-core DEV CORE\n"
               "       tern_test_child share-import DEV SIZE     (socket on fd 3)\n"
               "       tern_test_child share-export DEV SIZE SEED (socket on fd 3)\n"
               "       tern_test_child share-probe DEV SIZE FD\n");
  std::_Exit(2);
}

uint64_t ParseNumber(const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0') Usage();
  return value;
}

std::vector<uint32_t> ParseCores(const char* text) {
  std::vector<uint32_t> cores;
  std::string list(text);
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t comma = list.find(',', begin);
    if (comma == std::string::npos) comma = list.size();
    cores.push_back(static_cast<uint32_t>(ParseNumber(list.substr(begin, comma - begin).c_str())));
    begin = comma + 1;
  }
  return cores;
}

tern_buffer_t AllocateCommitted(tern_device_t device, uint64_t bytes,
                                tern_memory_category_t category) {
  tern_buffer_params_t params = {};
  params.struct_size = sizeof(params);
  params.size = bytes;
  params.category = category;
  tern_buffer_t buffer = nullptr;
  Check("tern_buffer_alloc", tern_buffer_alloc(device, &params, &buffer));
  // Writing every page commits the simulated device memory for real.
  std::vector<unsigned char> chunk(std::min(bytes, kWriteChunk), 0x5a);
  for (uint64_t offset = 0; offset < bytes; offset += chunk.size()) {
    const uint64_t size = std::min<uint64_t>(chunk.size(), bytes - offset);
    Check("tern_buffer_write", tern_buffer_write(buffer, offset, chunk.data(), size));
  }
  return buffer;
}

// Returns true once stdin has reached end-of-file (the parent let go of us),
// waiting at most `timeout_ms` (-1: forever).
bool StdinClosed(int timeout_ms) {
  struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return false;
  char buf[64];
  const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
  return n <= 0;
}

int HoldCore(int argc, char** argv) {
  if (argc < 5) Usage();
  const uint32_t device_index = static_cast<uint32_t>(ParseNumber(argv[2]));
  const std::vector<uint32_t> cores = ParseCores(argv[3]);
  const uint64_t tensor_bytes = ParseNumber(argv[4]);
  uint64_t constant_bytes = 0;
  bool busy = false;
  for (int i = 5; i < argc; ++i) {
    if (std::strcmp(argv[i], "--constants") == 0 && i + 1 < argc) {
      constant_bytes = ParseNumber(argv[++i]);
    } else if (std::strcmp(argv[i], "--busy") == 0) {
      busy = true;
    } else {
      Usage();
    }
  }

  Check("tern_init", tern_init(nullptr));
  tern_device_t device = nullptr;
  Check("tern_device_get", tern_device_get(device_index, &device));
  std::vector<tern_core_t> opened;
  for (uint32_t core : cores) {
    tern_core_t handle = nullptr;
    Check("tern_core_open", tern_core_open(device, core, &handle));
    opened.push_back(handle);
  }
  std::vector<tern_buffer_t> buffers;
  if (tensor_bytes > 0)
    buffers.push_back(AllocateCommitted(device, tensor_bytes, TERN_MEMORY_TENSORS));
  if (constant_bytes > 0) {
    buffers.push_back(AllocateCommitted(device, constant_bytes, TERN_MEMORY_CONSTANTS));
  }

  tern_queue_t queue = nullptr;
  if (busy) {
    Check("tern_queue_create", tern_queue_create(opened.front(), nullptr, &queue));
  }
  auto run_batch = [&] {
    for (int i = 0; i < 64; ++i) Check("tern_queue_nop", tern_queue_nop(queue, nullptr));
    Check("tern_queue_synchronize", tern_queue_synchronize(queue, UINT64_MAX));
  };
  if (busy) run_batch();  // counters have moved before the parent looks

  std::printf("ready\n");
  std::fflush(stdout);
  if (busy) {
    while (!StdinClosed(2)) run_batch();
  } else {
    while (!StdinClosed(-1)) {
    }
  }

  if (queue != nullptr) Check("tern_queue_destroy", tern_queue_destroy(queue));
  for (tern_buffer_t buffer : buffers) Check("tern_buffer_free", tern_buffer_free(buffer));
  for (tern_core_t core : opened) Check("tern_core_close", tern_core_close(core));
  Check("tern_shutdown", tern_shutdown());
  return 0;
}

int TryCore(int argc, char** argv) {
  if (argc != 4) Usage();
  const uint32_t device_index = static_cast<uint32_t>(ParseNumber(argv[2]));
  const uint32_t core_index = static_cast<uint32_t>(ParseNumber(argv[3]));
  tern_status_t status = tern_init(nullptr);
  tern_device_t device = nullptr;
  tern_core_t core = nullptr;
  if (status == TERN_OK) status = tern_device_get(device_index, &device);
  if (status == TERN_OK) status = tern_core_open(device, core_index, &core);
  std::printf("%s\n%s\n", tern_status_string(status),
              status == TERN_OK ? "" : tern_last_error_message());
  std::fflush(stdout);
  if (core != nullptr) tern_core_close(core);
  tern_shutdown();
  return status;
}

// The byte at `index` of the shared-buffer test pattern `seed`
// (memory_share_test.cc has the same function).
uint8_t PatternByte(uint64_t index, uint32_t seed) {
  return static_cast<uint8_t>(index * 131 + seed * 7 + (index >> 8));
}

constexpr int kSocketFd = 3;

int ReceiveFd(int socket) {
  char byte = 0;
  struct iovec iov = {&byte, 1};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(socket, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg == nullptr || cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(fd));
  return fd;
}

bool SendFd(int socket, int fd) {
  char byte = 'f';
  struct iovec iov = {&byte, 1};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(fd));
  return sendmsg(socket, &msg, 0) == 1;
}

// One line of stdin, without the newline; false at end-of-file.
bool ReadCommand(std::string* line) {
  line->clear();
  char c;
  while (true) {
    const ssize_t n = read(STDIN_FILENO, &c, 1);
    if (n <= 0) return !line->empty();
    if (c == '\n') return true;
    line->push_back(c);
  }
}

// Commands on a shared buffer, one a line, each answered by one line:
//   check SEED   read it (a queue copy) and print "match" or "mismatch at I"
//   write SEED   write the pattern (a queue copy), print "written"
//   spin         write patterns in a loop until killed (never answers after
//                "spinning")
//   stats        print "used U node N" (this process's and the node's bytes)
//   free         free the buffer, print "freed"
void ShareCommands(tern_device_t device, tern_buffer_t buffer, uint64_t size) {
  tern_core_t core = nullptr;
  // Either core: the parent may hold the other.
  if (tern_core_open(device, 1, &core) != TERN_OK)
    Check("tern_core_open", tern_core_open(device, 0, &core));
  tern_queue_t queue = nullptr;
  Check("tern_queue_create", tern_queue_create(core, nullptr, &queue));
  std::vector<uint8_t> host(size);
  std::string line;
  while (ReadCommand(&line)) {
    unsigned seed = 0;
    if (std::sscanf(line.c_str(), "check %u", &seed) == 1) {
      Check("tern_queue_copy_d2h",
            tern_queue_copy_d2h(queue, host.data(), buffer, 0, size, nullptr));
      Check("tern_queue_synchronize", tern_queue_synchronize(queue, UINT64_MAX));
      uint64_t bad = size;
      for (uint64_t i = 0; i < size && bad == size; ++i) {
        if (host[i] != PatternByte(i, seed)) bad = i;
      }
      if (bad == size) {
        std::printf("match\n");
      } else {
        std::printf("mismatch at %llu\n", static_cast<unsigned long long>(bad));
      }
    } else if (std::sscanf(line.c_str(), "write %u", &seed) == 1) {
      for (uint64_t i = 0; i < size; ++i) host[i] = PatternByte(i, seed);
      Check("tern_queue_copy_h2d",
            tern_queue_copy_h2d(queue, buffer, 0, host.data(), size, nullptr));
      Check("tern_queue_synchronize", tern_queue_synchronize(queue, UINT64_MAX));
      std::printf("written\n");
    } else if (line == "spin") {
      std::printf("spinning\n");
      std::fflush(stdout);
      for (uint32_t round = 0;; ++round) {
        for (uint64_t i = 0; i < size; ++i) host[i] = PatternByte(i, round);
        Check("tern_queue_copy_h2d",
              tern_queue_copy_h2d(queue, buffer, 0, host.data(), size, nullptr));
        Check("tern_queue_synchronize", tern_queue_synchronize(queue, UINT64_MAX));
      }
    } else if (line == "stats") {
      tern_memory_stats_t stats = {};
      stats.struct_size = sizeof(stats);
      Check("tern_device_memory_stats", tern_device_memory_stats(device, &stats));
      std::printf("used %llu node %llu\n", static_cast<unsigned long long>(stats.used_bytes),
                  static_cast<unsigned long long>(stats.node_used_bytes));
    } else if (line == "free") {
      Check("tern_buffer_free", tern_buffer_free(buffer));
      buffer = nullptr;
      std::printf("freed\n");
    } else {
      std::printf("unknown command: %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  Check("tern_queue_destroy", tern_queue_destroy(queue));
  Check("tern_core_close", tern_core_close(core));
  if (buffer != nullptr) Check("tern_buffer_free", tern_buffer_free(buffer));
}

int ShareImport(int argc, char** argv) {
  if (argc != 4) Usage();
  const uint32_t device_index = static_cast<uint32_t>(ParseNumber(argv[2]));
  const uint64_t size = ParseNumber(argv[3]);
  Check("tern_init", tern_init(nullptr));
  tern_device_t device = nullptr;
  Check("tern_device_get", tern_device_get(device_index, &device));
  const int fd = ReceiveFd(kSocketFd);
  if (fd < 0) {
    std::printf("error: no descriptor received\n");
    return 1;
  }
  tern_buffer_t buffer = nullptr;
  Check("tern_buffer_import", tern_buffer_import(device, fd, size, &buffer));
  close(fd);  // tern keeps its own
  std::printf("imported\n");
  std::fflush(stdout);
  ShareCommands(device, buffer, size);
  Check("tern_shutdown", tern_shutdown());
  return 0;
}

int ShareExport(int argc, char** argv) {
  if (argc != 5) Usage();
  const uint32_t device_index = static_cast<uint32_t>(ParseNumber(argv[2]));
  const uint64_t size = ParseNumber(argv[3]);
  const uint32_t seed = static_cast<uint32_t>(ParseNumber(argv[4]));
  Check("tern_init", tern_init(nullptr));
  tern_device_t device = nullptr;
  Check("tern_device_get", tern_device_get(device_index, &device));
  tern_buffer_params_t params = {};
  params.struct_size = sizeof(params);
  params.flags = TERN_BUFFER_FLAG_SHAREABLE;
  params.size = size;
  params.category = TERN_MEMORY_TENSORS;
  tern_buffer_t buffer = nullptr;
  Check("tern_buffer_alloc", tern_buffer_alloc(device, &params, &buffer));
  std::vector<uint8_t> host(size);
  for (uint64_t i = 0; i < size; ++i) host[i] = PatternByte(i, seed);
  Check("tern_buffer_write", tern_buffer_write(buffer, 0, host.data(), size));
  int fd = -1;
  Check("tern_buffer_export", tern_buffer_export(buffer, &fd));
  if (!SendFd(kSocketFd, fd)) {
    std::printf("error: sending the descriptor failed\n");
    return 1;
  }
  close(fd);
  std::printf("ready\n");
  std::fflush(stdout);
  ShareCommands(device, buffer, size);
  Check("tern_shutdown", tern_shutdown());
  return 0;
}

int ShareProbe(int argc, char** argv) {
  if (argc != 5) Usage();
  const uint32_t device_index = static_cast<uint32_t>(ParseNumber(argv[2]));
  const uint64_t size = ParseNumber(argv[3]);
  const int fd = static_cast<int>(ParseNumber(argv[4]));
  Check("tern_init", tern_init(nullptr));
  tern_device_t device = nullptr;
  Check("tern_device_get", tern_device_get(device_index, &device));
  tern_buffer_t buffer = nullptr;
  const tern_status_t status = tern_buffer_import(device, fd, size, &buffer);
  std::printf("%s\n", tern_status_string(status));
  if (buffer != nullptr) tern_buffer_free(buffer);
  int found = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (struct dirent* entry = readdir(dir)) {
      char target[256] = {};
      const std::string path = std::string("/proc/self/fd/") + entry->d_name;
      if (readlink(path.c_str(), target, sizeof(target) - 1) > 0 &&
          std::strncmp(target, "/memfd:tern-buffer:", 19) == 0) {
        ++found;
      }
    }
    closedir(dir);
  }
  std::printf("tern-buffer memfds: %d\n", found);
  std::fflush(stdout);
  Check("tern_shutdown", tern_shutdown());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Usage();
  if (std::strcmp(argv[1], "hold-core") == 0) return HoldCore(argc, argv);
  if (std::strcmp(argv[1], "try-core") == 0) return TryCore(argc, argv);
  if (std::strcmp(argv[1], "share-import") == 0) return ShareImport(argc, argv);
  if (std::strcmp(argv[1], "share-export") == 0) return ShareExport(argc, argv);
  if (std::strcmp(argv[1], "share-probe") == 0) return ShareProbe(argc, argv);
  Usage();
}
