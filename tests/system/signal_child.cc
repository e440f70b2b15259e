// tern_signal_child: a tern program for tern_signal_test, which checks that
// linking and using libtern leaves the program's signal handling alone.
// Public API only.
//
//   tern_signal_child plain ACTION
//       tern_init(), then ACTION.
//   tern_signal_child fabric ACTION
//       Forks a second process first; the two join a two-rank communicator
//       (rank r on core r of device 0) over libfabric (the caller sets
//       FI_PROVIDER), the second one leaves, then this one does ACTION.
//
// Before ACTION it prints "ready libfabric=<0|1> transport=<name>" (whether
// libfabric is mapped into this process; the communicator's transport, "-"
// without one) and flushes. ACTION: "segv" writes through a NULL pointer;
// "wait" waits to be signalled (the test sends SIGTERM or SIGINT). A failed
// step prints "error: <step>: <status> <message>" and exits 2.
#include <sys/wait.h>
#include <tern/tern.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {

[[noreturn]] void Fail(const char* step, tern_status_t status) {
  std::printf("error: %s: %s %s\n", step, tern_status_string(status), tern_last_error_message());
  std::fflush(stdout);
  std::_Exit(2);
}

void Check(const char* step, tern_status_t status) {
  if (status != TERN_OK) Fail(step, status);
}

bool LibfabricMapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libfabric") != std::string::npos) return true;
  }
  return false;
}

// Not instrumented: under ASan+UBSan the write must reach the kernel as a
// plain fault, not a sanitizer report.
__attribute__((no_sanitize("address", "undefined"), noinline)) void WriteThroughNull() {
  // The pointer itself is volatile: the compiler cannot see that it is NULL
  // and so cannot drop the write as undefined behaviour.
  volatile int* volatile pointer = nullptr;
  *pointer = 1;
}

[[noreturn]] void Act(const char* action, const std::string& transport) {
  std::printf("ready libfabric=%d transport=%s\n", LibfabricMapped() ? 1 : 0, transport.c_str());
  std::fflush(stdout);
  if (std::strcmp(action, "segv") == 0) WriteThroughNull();
  for (;;) pause();  // "wait", and "segv" if the write were survived
}

tern_core_t OpenCore(uint32_t index) {
  Check("tern_init", tern_init(nullptr));
  tern_device_t device = nullptr;
  Check("tern_device_get", tern_device_get(0, &device));
  tern_core_t core = nullptr;
  Check("tern_core_open", tern_core_open(device, index, &core));
  return core;
}

tern_comm_t Join(uint32_t rank, const tern_comm_unique_id_t& id) {
  const tern_core_t core = OpenCore(rank);
  tern_comm_config_t config{};
  config.struct_size = sizeof(config);
  config.init_timeout_ns = 30'000'000'000ull;
  tern_comm_t comm = nullptr;
  Check("tern_comm_init_rank", tern_comm_init_rank(core, 2, &id, rank, &config, &comm));
  return comm;
}

// Rank 1 runs in a child forked before anything of tern exists; it gets the
// unique id through a pipe, joins, and leaves.
[[noreturn]] void Fabric(const char* action) {
  int id_pipe[2];
  if (pipe(id_pipe) != 0) Fail("pipe", TERN_ERROR_IO);
  const pid_t peer = fork();
  if (peer < 0) Fail("fork", TERN_ERROR_IO);
  tern_comm_unique_id_t id{};
  if (peer == 0) {
    close(id_pipe[1]);
    if (read(id_pipe[0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
      Fail("reading the unique id", TERN_ERROR_IO);
    }
    tern_comm_t comm = Join(1, id);
    Check("tern_comm_destroy", tern_comm_destroy(comm));
    Check("tern_shutdown", tern_shutdown());
    std::fflush(stdout);
    std::_Exit(0);
  }
  close(id_pipe[0]);
  Check("tern_comm_get_unique_id", tern_comm_get_unique_id(&id));
  if (write(id_pipe[1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
    Fail("writing the unique id", TERN_ERROR_IO);
  }
  close(id_pipe[1]);
  tern_comm_t comm = Join(0, id);
  int peer_status = 0;
  if (waitpid(peer, &peer_status, 0) != peer || !WIFEXITED(peer_status) ||
      WEXITSTATUS(peer_status) != 0) {
    Fail("rank 1", TERN_ERROR_INTERNAL);
  }
  tern_comm_info_t info{};
  info.struct_size = sizeof(info);
  Check("tern_comm_get_info", tern_comm_get_info(comm, &info));
  Act(action, info.transport);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tern_signal_child plain|fabric segv|wait\n");
    return 2;
  }
  if (std::strcmp(argv[1], "fabric") == 0) Fabric(argv[2]);
  OpenCore(0);
  Act(argv[2], "-");
}
