// tern_comm_child: one process of the multi-process collectives tests. Public
// API only. Ranks come from the environment (tern_comm_init_from_env:
// TERN_COMM_ID, TERN_COMM_RANK, TERN_COMM_WORLD_SIZE) unless --id gives a
// unique id (hex) with --ranks and --size, in which case the process runs
// several ranks, one thread each (tern_comm_init_rank).
//
//   tern_comm_child matrix [--small]
//       Runs the exact-check matrix; prints "transport <name>", "nodes <n>"
//       and then "ok <checks>", or the failures; exits 0 when everything
//       matched.
//   tern_comm_child loop COUNT
//       All-reduces COUNT fp32 values over and over; prints "iteration <k>"
//       after each, until an operation fails: then prints
//       "failed <STATUS> <message>" and, after waiting for the
//       communicator's asynchronous error, "async <STATUS>", and exits 3.
//   tern_comm_child mismatch WHAT
//       Rank 0 enqueues all_reduce sum f32 count=64 (reduce root=0 for
//       WHAT=root); the other ranks change WHAT (kind, count, dtype, redop,
//       root). Prints "result <STATUS> <message>", then runs a barrier and
//       prints "then <STATUS> <message>"; exits 0.
//   tern_comm_child late MS
//       Three all-reduces (1, 262144 and 1 fp32 values), each after a
//       barrier, in which every rank but 0 sleeps MS milliseconds before it
//       enqueues: it prints "sent <k> <ns>" (CLOCK_MONOTONIC) just before;
//       rank 0 enqueues at once and, once its queue is done, prints
//       "done <k> <ns> switches <n> queue_cpu_us <t>" with the voluntary
//       context switches of its process and the CPU time of its queues'
//       threads (which run the collectives) during the wait. Exits 1 if a
//       result is wrong.
//   tern_comm_child idle
//       Joins, prints "ready", then enqueues nothing and waits for stdin to
//       close (a rank that never calls the collective).
//   tern_comm_child init-only
//       Joins and prints "joined" or "init <STATUS> <message>".
//   tern_comm_child root-fd-limit
//       Starts a bootstrap root (tern_comm_get_unique_id), waits until its
//       thread ("tern-bootstrap") sleeps on its socket, then lowers its
//       open-file limit so that no descriptor can be opened (accept fails
//       with EMFILE) and prints "limited"; when stdin closes, restores the
//       limit, prints "raised", serves 3 s more and exits.
//
// Rank r runs on core r % 2 of device (r / 2) % 2. Every line is flushed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <tern/tern.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm_matrix.h"

namespace {

using tern_test::LastError;

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void Die(const std::string& step, tern_status_t status) {
  Say("error " + step + ": " + LastError(status));
  std::_Exit(100 + status % 100);
}

void Check(const std::string& step, tern_status_t status) {
  if (status != TERN_OK) Die(step, status);
}

bool ParseHex(const std::string& hex, tern_comm_unique_id_t* id) {
  if (hex.size() != 2 * sizeof(id->internal)) return false;
  for (size_t i = 0; i < sizeof(id->internal); ++i) {
    id->internal[i] = static_cast<char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

struct Rank {
  uint32_t rank = 0;
  tern_device_t device = nullptr;
  tern_core_t core = nullptr;
  tern_queue_t queue = nullptr;
  tern_comm_t comm = nullptr;
};

void OpenCore(Rank* r) {
  Check("tern_device_get", tern_device_get((r->rank / 2) % 2, &r->device));
  Check("tern_core_open", tern_core_open(r->device, r->rank % 2, &r->core));
  Check("tern_queue_create", tern_queue_create(r->core, nullptr, &r->queue));
}

void WaitStdinClosed() {
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
}

int RunLoop(Rank& r, uint64_t count) {
  tern_buffer_params_t params = {sizeof(tern_buffer_params_t), 0, count * 4, 0,
                                 TERN_MEMORY_TENSORS};
  tern_buffer_t buffer = nullptr;
  Check("tern_buffer_alloc", tern_buffer_alloc(r.device, &params, &buffer));
  std::vector<float> ones(count, 1.0f);
  Check("tern_buffer_write", tern_buffer_write(buffer, 0, ones.data(), count * 4));
  for (uint64_t k = 0;; ++k) {
    tern_status_t s = tern_comm_all_reduce(r.comm, buffer, 0, buffer, 0, count, TERN_DTYPE_F32,
                                           TERN_COMM_MAX, r.queue);
    if (s == TERN_OK) s = tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE);
    if (s != TERN_OK) {
      Say("failed " + LastError(s));
      tern_status_t async = TERN_OK;
      tern_comm_get_async_error(r.comm, &async);
      Say(std::string("async ") + tern_status_string(async) + " " +
          (async != TERN_OK ? tern_last_error_message() : ""));
      return 3;
    }
    Say("iteration " + std::to_string(k));
  }
}

int RunMismatch(Rank& r, const std::string& what) {
  tern_buffer_params_t params = {sizeof(tern_buffer_params_t), 0, 1024, 0, TERN_MEMORY_TENSORS};
  tern_buffer_t send = nullptr, recv = nullptr;
  Check("tern_buffer_alloc", tern_buffer_alloc(r.device, &params, &send));
  Check("tern_buffer_alloc", tern_buffer_alloc(r.device, &params, &recv));
  const bool odd = r.rank != 0;
  tern_status_t s;
  if (what == "root") {
    s = tern_comm_reduce(r.comm, send, 0, recv, 0, 64, TERN_DTYPE_F32, TERN_COMM_SUM, odd ? 1 : 0,
                         r.queue);
  } else if (what == "kind" && odd) {
    s = tern_comm_broadcast(r.comm, send, 0, recv, 0, 64, TERN_DTYPE_F32, 1, r.queue);
  } else {
    const uint64_t count = what == "count" && odd ? 65 : 64;
    const tern_dtype_t dtype = what == "dtype" && odd ? TERN_DTYPE_I32 : TERN_DTYPE_F32;
    const tern_comm_redop_t op = what == "redop" && odd ? TERN_COMM_MAX : TERN_COMM_SUM;
    s = tern_comm_all_reduce(r.comm, send, 0, recv, 0, count, dtype, op, r.queue);
  }
  if (s == TERN_OK) s = tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE);
  Say("result " + LastError(s));
  // A rank whose own side completed (a broadcast root sends and is done)
  // learns of the mismatch through the communicator: its next operation fails.
  tern_queue_clear_error(r.queue);
  s = tern_comm_barrier(r.comm, r.queue);
  if (s == TERN_OK) s = tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE);
  Say("then " + LastError(s));
  return 0;
}

uint64_t MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The first line of a small file (under /proc), or "".
std::string FirstLine(const std::string& path) {
  char line[512] = {};
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    if (std::fgets(line, sizeof(line), f) == nullptr) line[0] = '\0';
    std::fclose(f);
  }
  return line;
}

struct Usage {
  long voluntary_switches = 0;  // all threads
  uint64_t queue_cpu_us = 0;    // the threads of tern's queues (schedstat)
};

Usage ProcessUsage() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  Usage out{usage.ru_nvcsw, 0};
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      const std::string task = std::string("/proc/self/task/") + entry->d_name;
      if (FirstLine(task + "/comm").rfind("tern-queue", 0) != 0) continue;
      out.queue_cpu_us += std::strtoull(FirstLine(task + "/schedstat").c_str(), nullptr, 10) / 1000;
    }
    closedir(dir);
  }
  return out;
}

// See "late" above.
int RunLate(Rank& r, int delay_ms) {
  tern_comm_info_t info = {};
  info.struct_size = sizeof(info);
  Check("tern_comm_get_info", tern_comm_get_info(r.comm, &info));
  const uint64_t counts[] = {1, 262144, 1};
  tern_buffer_params_t params = {sizeof(tern_buffer_params_t), 0, 262144 * 4, 0,
                                 TERN_MEMORY_TENSORS};
  tern_buffer_t buffer = nullptr;
  Check("tern_buffer_alloc", tern_buffer_alloc(r.device, &params, &buffer));
  for (int k = 0; k < 3; ++k) {
    const uint64_t count = counts[k];
    std::vector<float> values(count, static_cast<float>(r.rank + 1));
    Check("tern_buffer_write", tern_buffer_write(buffer, 0, values.data(), count * 4));
    Check("tern_comm_barrier", tern_comm_barrier(r.comm, r.queue));
    Check("tern_queue_synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
    const Usage before = ProcessUsage();
    if (r.rank != 0) {
      usleep(static_cast<useconds_t>(delay_ms) * 1000);
      Say("sent " + std::to_string(k) + " " + std::to_string(MonotonicNs()));
    }
    Check("tern_comm_all_reduce", tern_comm_all_reduce(r.comm, buffer, 0, buffer, 0, count,
                                                       TERN_DTYPE_F32, TERN_COMM_SUM, r.queue));
    Check("tern_queue_synchronize", tern_queue_synchronize(r.queue, TERN_TIMEOUT_INFINITE));
    if (r.rank == 0) {
      const uint64_t done = MonotonicNs();
      const Usage after = ProcessUsage();
      Say("done " + std::to_string(k) + " " + std::to_string(done) + " switches " +
          std::to_string(after.voluntary_switches - before.voluntary_switches) + " queue_cpu_us " +
          std::to_string(after.queue_cpu_us - before.queue_cpu_us));
    }
    Check("tern_buffer_read", tern_buffer_read(buffer, 0, values.data(), count * 4));
    const float expected = static_cast<float>(info.size * (info.size + 1) / 2);
    for (uint64_t i = 0; i < count; ++i) {
      if (values[i] != expected) {
        Say("wrong value " + std::to_string(values[i]) + " at " + std::to_string(i) + " of round " +
            std::to_string(k));
        return 1;
      }
    }
  }
  Say("ok late");
  return 0;
}

int RunScenario(Rank& r, const std::vector<std::string>& args) {
  const std::string& scenario = args[0];
  if (scenario == "matrix") {
    tern_comm_info_t info = {};
    info.struct_size = sizeof(info);
    Check("tern_comm_get_info", tern_comm_get_info(r.comm, &info));
    Say(std::string("transport ") + info.transport);
    Say("nodes " + std::to_string(info.node_count));
    tern_test::MatrixOptions options;
    if (args.size() > 1 && args[1] == "--small") {
      options.dtypes = {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I8,
                        TERN_DTYPE_I64};
      options.counts = {1, 1001};
      options.large_counts = {100003};
    }
    uint32_t size = info.size;
    tern_test::MatrixResult result =
        tern_test::RunMatrix(r.comm, r.queue, r.device, r.rank, size, options);
    if (!result.failures.empty()) {
      Say("failures\n" + result.failures);
      return 1;
    }
    Say("ok " + std::to_string(result.checks));
    return 0;
  }
  if (scenario == "loop" && args.size() > 1) return RunLoop(r, std::stoull(args[1]));
  if (scenario == "mismatch" && args.size() > 1) return RunMismatch(r, args[1]);
  if (scenario == "late" && args.size() > 1) return RunLate(r, std::stoi(args[1]));
  if (scenario == "idle") {
    Say("ready");
    WaitStdinClosed();
    return 0;
  }
  Say("unknown scenario " + scenario);
  return 2;
}

}  // namespace

// Whether a thread of this process named `name` is asleep (in a system
// call), within 10 s.
bool WaitForSleepingThread(const std::string& name) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    if (DIR* dir = opendir("/proc/self/task")) {
      bool asleep = false;
      while (dirent* entry = readdir(dir)) {
        if (entry->d_name[0] == '.') continue;
        const std::string task = std::string("/proc/self/task/") + entry->d_name;
        if (FirstLine(task + "/comm") != name + "\n") continue;
        // The state follows the ")" that ends the name: "pid (name) S ...".
        const std::string stat = FirstLine(task + "/stat");
        const size_t close_paren = stat.rfind(')');
        asleep = asleep || (close_paren != std::string::npos && stat.size() > close_paren + 2 &&
                            stat[close_paren + 1] == ' ' && stat[close_paren + 2] == 'S');
      }
      closedir(dir);
      if (asleep) return true;
    }
    usleep(10000);
  }
  return false;
}

// See root-fd-limit above.
int RootWithFdLimit() {
  tern_comm_unique_id_t id;
  Check("tern_comm_get_unique_id", tern_comm_get_unique_id(&id));
  // Limit only once the root's thread waits on its socket: a thread that
  // starts while no descriptor can be opened breaks more than accept (clang
  // 14's UBSan probes memory through a pipe before its first virtual call, and
  // reported a thread start as an invalid object).
  if (!WaitForSleepingThread("tern-bootstrap")) {
    Say("error: the bootstrap root thread never waited on its socket");
    return 1;
  }
  // Fill every free descriptor number below the highest open one, then
  // allow no more: the next accept fails with EMFILE.
  int highest = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) highest = std::max(highest, std::atoi(entry->d_name));
    closedir(dir);
  }
  std::vector<int> fillers;
  while (true) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    if (fd > highest) {
      close(fd);
      break;
    }
    fillers.push_back(fd);
  }
  rlimit original{};
  getrlimit(RLIMIT_NOFILE, &original);
  rlimit limited = original;
  limited.rlim_cur = static_cast<rlim_t>(highest + 1);
  Check("setrlimit", setrlimit(RLIMIT_NOFILE, &limited) == 0 ? TERN_OK : TERN_ERROR_IO);
  Say("limited");
  char line[64];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
  }
  setrlimit(RLIMIT_NOFILE, &original);
  for (int fd : fillers) close(fd);
  Say("raised");
  sleep(3);
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string id_hex;
  std::vector<uint32_t> ranks;
  uint32_t size = 0;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--id" && i + 1 < args.size()) {
      id_hex = args[++i];
    } else if (args[i] == "--ranks" && i + 1 < args.size()) {
      std::string list = args[++i];
      size_t pos = 0;
      while (pos < list.size()) {
        const size_t comma = list.find(',', pos);
        ranks.push_back(static_cast<uint32_t>(std::stoul(list.substr(pos, comma - pos))));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (args[i] == "--size" && i + 1 < args.size()) {
      size = static_cast<uint32_t>(std::stoul(args[++i]));
    } else {
      rest.push_back(args[i]);
    }
  }
  if (rest.empty()) {
    std::fprintf(stderr,
                 "usage: tern_comm_child [--id HEX --ranks R,.. --size N] SCENARIO [ARGS]\n");
    return 2;
  }
  if (rest[0] == "root-fd-limit") return RootWithFdLimit();
  Check("tern_init", tern_init(nullptr));
  if (id_hex.empty()) {
    // One rank, from the environment.
    const char* rank_text = std::getenv("TERN_COMM_RANK");
    Rank r;
    r.rank = rank_text ? static_cast<uint32_t>(std::atoi(rank_text)) : 0;
    OpenCore(&r);
    const tern_status_t s = tern_comm_init_from_env(r.core, nullptr, &r.comm);
    if (rest[0] == "init-only") {
      Say(s == TERN_OK ? "joined" : "init " + LastError(s));
      return 0;
    }
    Check("tern_comm_init_from_env", s);
    const int code = RunScenario(r, rest);
    tern_comm_destroy(r.comm);
    tern_queue_destroy(r.queue);
    tern_core_close(r.core);
    tern_shutdown();
    return code;
  }
  tern_comm_unique_id_t id;
  if (!ParseHex(id_hex, &id) || ranks.empty() || size == 0) {
    std::fprintf(stderr, "bad --id/--ranks/--size\n");
    return 2;
  }
  std::vector<Rank> local(ranks.size());
  std::vector<int> codes(ranks.size(), 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    local[i].rank = ranks[i];
    OpenCore(&local[i]);
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      Check("tern_comm_init_rank",
            tern_comm_init_rank(local[i].core, size, &id, local[i].rank, nullptr, &local[i].comm));
      codes[i] = RunScenario(local[i], rest);
    });
  }
  int code = 0;
  for (size_t i = 0; i < threads.size(); ++i) {
    threads[i].join();
    code = std::max(code, codes[i]);
  }
  for (Rank& r : local) {
    tern_comm_destroy(r.comm);
    tern_queue_destroy(r.queue);
    tern_core_close(r.core);
  }
  tern_shutdown();
  return code;
}
