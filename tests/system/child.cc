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
// A failed setup step prints "error: <step>: <status> <message>" and exits
// with 100 + status code % 100.
#include <poll.h>
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
               "       tern_test_child try-core DEV CORE\n");
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Usage();
  if (std::strcmp(argv[1], "hold-core") == 0) return HoldCore(argc, argv);
  if (std::strcmp(argv[1], "try-core") == 0) return TryCore(argc, argv);
  Usage();
}
