// Multi-process system tests: tern_test_child processes (real executables,
// started with posix_spawn) hold cores and device memory of the test's
// simulated node while this process checks ownership, node-wide accounting,
// telemetry, recovery from SIGKILL and the fork-without-exec rule.
//
// Children inherit TERN_SIM_NODE and TERN_SIM_TOPOLOGY (2 devices x 2 cores x
// 256 MiB) from the test main(), so they join this process's node.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <tern/tern.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr int kReadyTimeoutMs = 30000;  // a child under ASan starts slowly
constexpr char kChildCommand[] = "tern_test_child";

std::string LastError() { return tern_last_error_message(); }

// A running tern_test_child whose stdin and stdout are pipes to this process.
class Child {
 public:
  // Starts tern_test_child with `args`; fails the test (returns null) when it
  // cannot.
  static std::unique_ptr<Child> Spawn(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return nullptr;
    }
    std::vector<std::string> argv_strings = {TERN_TEST_CHILD_PATH};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 clears close-on-exec on the copies, so only these two survive exec.
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    pid_t pid = 0;
    const int err = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    if (err != 0) {
      close(in[1]);
      close(out[0]);
      ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(err);
      return nullptr;
    }
    return std::unique_ptr<Child>(new Child(pid, in[1], out[0]));
  }

  ~Child() {
    if (!reaped_) Kill();
    CloseStdin();
    close(stdout_);
  }

  pid_t pid() const { return pid_; }

  // Reads one line of the child's stdout (without the newline). Returns
  // false on end-of-file or when nothing complete arrived in `timeout_ms`.
  bool ReadLine(std::string* line, int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      const size_t newline = buffered_.find('\n');
      if (newline != std::string::npos) {
        *line = buffered_.substr(0, newline);
        buffered_.erase(0, newline + 1);
        return true;
      }
      if (!Fill(deadline)) return false;
    }
  }

  // Everything the child writes until it closes stdout (exits).
  std::string ReadAll(int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Fill(deadline)) {
    }
    std::string all = std::move(buffered_);
    buffered_.clear();
    return all;
  }

  // Waits for "ready"; on anything else returns what the child said.
  ::testing::AssertionResult WaitReady() {
    std::string line;
    if (!ReadLine(&line, kReadyTimeoutMs)) {
      return ::testing::AssertionFailure()
             << "child " << pid_ << " never said ready; it wrote: " << ReadAll(1000);
    }
    if (line != "ready") {
      return ::testing::AssertionFailure()
             << "child " << pid_ << " said: " << line << " " << ReadAll(1000);
    }
    return ::testing::AssertionSuccess();
  }

  // End-of-file on the child's stdin: a hold-core child then shuts down.
  void CloseStdin() {
    if (stdin_ >= 0) close(stdin_);
    stdin_ = -1;
  }

  // Waits for the child to exit; returns its wait status, or -1 after
  // `timeout_ms` (the child is then still running).
  int Wait(int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        reaped_ = true;
        return status;
      }
      if (done < 0 || Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // SIGKILL and reap; returns the wait status.
  int Kill() {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status;
  }

 private:
  using Clock = std::chrono::steady_clock;

  Child(pid_t pid, int stdin_fd, int stdout_fd) : pid_(pid), stdin_(stdin_fd), stdout_(stdout_fd) {}

  // Appends what is readable before `deadline`; false on EOF or timeout.
  bool Fill(Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    struct pollfd pfd = {stdout_, POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready <= 0) return false;
    char buf[4096];
    const ssize_t n = read(stdout_, buf, sizeof(buf));
    if (n <= 0) return false;
    buffered_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_;
  int stdin_;
  int stdout_;
  bool reaped_ = false;
  std::string buffered_;
};

struct TryResult {
  int exit_code = -1;
  std::string status_name;
  std::string message;
};

// Runs `tern_test_child try-core DEV CORE` to completion.
TryResult TryCoreInChild(uint32_t device, uint32_t core) {
  TryResult result;
  auto child = Child::Spawn({"try-core", std::to_string(device), std::to_string(core)});
  if (!child) return result;
  std::string output = child->ReadAll(kReadyTimeoutMs);
  const int status = child->Wait(kReadyTimeoutMs);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  const size_t newline = output.find('\n');
  result.status_name = output.substr(0, newline);
  if (newline != std::string::npos) result.message = output.substr(newline + 1);
  return result;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    uint32_t count = 0;
    ASSERT_EQ(tern_device_count(&count), TERN_OK);
    ASSERT_EQ(count, 2u) << "the tests expect TERN_SIM_TOPOLOGY=2x2x256M";
    for (uint32_t i = 0; i < 2; ++i) ASSERT_EQ(tern_device_get(i, &devices_[i]), TERN_OK);
    tern_device_info_t info = {};
    info.struct_size = sizeof(info);
    ASSERT_EQ(tern_device_get_info(devices_[0], &info), TERN_OK);
    ASSERT_EQ(info.memory_bytes, 256 * kMiB);
    ASSERT_EQ(info.core_count, 2u);
  }

  void TearDown() override {
    for (tern_buffer_t buffer : buffers_) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    for (tern_core_t core : cores_) EXPECT_EQ(tern_core_close(core), TERN_OK) << LastError();
    EXPECT_EQ(tern_shutdown(), TERN_OK);
  }

  tern_status_t Alloc(tern_device_t device, uint64_t size, tern_buffer_t* out) {
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_TENSORS;
    return tern_buffer_alloc(device, &params, out);
  }

  tern_memory_stats_t Stats(tern_device_t device) {
    tern_memory_stats_t stats = {};
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(tern_device_memory_stats(device, &stats), TERN_OK) << LastError();
    return stats;
  }

  tern_device_telemetry_t Telemetry(tern_device_t device) {
    tern_device_telemetry_t telemetry = {};
    telemetry.struct_size = sizeof(telemetry);
    EXPECT_EQ(tern_device_get_telemetry(device, &telemetry), TERN_OK) << LastError();
    return telemetry;
  }

  // Opens a core and closes it in TearDown.
  tern_core_t OpenCore(tern_device_t device, uint32_t index) {
    tern_core_t core = nullptr;
    EXPECT_EQ(tern_core_open(device, index, &core), TERN_OK) << LastError();
    if (core != nullptr) cores_.push_back(core);
    return core;
  }

  tern_device_t devices_[2] = {};
  std::vector<tern_core_t> cores_;
  std::vector<tern_buffer_t> buffers_;
};

// (a) A core owned by another process is refused with BUSY, and the message
// names the owner; the other cores are unaffected.
TEST_F(MultiProcessTest, CoreIsExclusiveAcrossProcesses) {
  auto child = Child::Spawn({"hold-core", "0", "0", "0"});
  ASSERT_TRUE(child);
  ASSERT_TRUE(child->WaitReady());

  tern_core_t core = reinterpret_cast<tern_core_t>(0x1);
  EXPECT_EQ(tern_core_open(devices_[0], 0, &core), TERN_ERROR_BUSY);
  EXPECT_EQ(core, nullptr);
  const std::string message = LastError();
  EXPECT_NE(message.find(std::to_string(child->pid())), std::string::npos) << message;
  EXPECT_NE(message.find(kChildCommand), std::string::npos) << message;
  EXPECT_NE(message.find("TERN_VISIBLE_CORES"), std::string::npos)
      << "the message should say what to do: " << message;

  // Every other core of the node is free for us.
  EXPECT_NE(OpenCore(devices_[0], 1), nullptr);
  tern_core_t d1c0 = OpenCore(devices_[1], 0);
  EXPECT_NE(d1c0, nullptr);
  EXPECT_NE(OpenCore(devices_[1], 1), nullptr);

  // A third process is refused too, by the child (0:0) and by us (0:1).
  TryResult third = TryCoreInChild(0, 0);
  EXPECT_EQ(third.exit_code, TERN_ERROR_BUSY);
  EXPECT_EQ(third.status_name, "TERN_ERROR_BUSY");
  EXPECT_NE(third.message.find(std::to_string(child->pid())), std::string::npos) << third.message;
  third = TryCoreInChild(0, 1);
  EXPECT_EQ(third.exit_code, TERN_ERROR_BUSY);
  EXPECT_NE(third.message.find("process " + std::to_string(getpid())), std::string::npos)
      << third.message;

  // When the owner shuts down cleanly the core is ours to take.
  child->CloseStdin();
  const int status = child->Wait(kReadyTimeoutMs);
  ASSERT_TRUE(status != -1 && WIFEXITED(status)) << "child did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0) << child->ReadAll(1000);
  EXPECT_NE(OpenCore(devices_[0], 0), nullptr);

  // And a free core opens in another process: try-core exits 0.
  third = TryCoreInChild(1, 0);
  EXPECT_EQ(third.exit_code, TERN_ERROR_BUSY) << "1:0 is ours";
  EXPECT_EQ(tern_core_close(d1c0), TERN_OK);
  std::erase(cores_, d1c0);
  third = TryCoreInChild(1, 0);
  EXPECT_EQ(third.exit_code, 0) << third.status_name << " " << third.message;
  EXPECT_EQ(third.status_name, "TERN_OK");
}

// (b) A SIGKILLed owner leaves nothing stuck: its cores and its device memory
// are available at once.
TEST_F(MultiProcessTest, KilledOwnerReleasesCoresAndMemoryAtOnce) {
  auto child = Child::Spawn({"hold-core", "0", "0,1", std::to_string(200 * kMiB)});
  ASSERT_TRUE(child);
  ASSERT_TRUE(child->WaitReady());

  // The child really holds both cores and its memory.
  EXPECT_GE(Stats(devices_[0]).node_used_bytes, 200 * kMiB);
  tern_core_t core = nullptr;
  EXPECT_EQ(tern_core_open(devices_[0], 0, &core), TERN_ERROR_BUSY);
  EXPECT_EQ(tern_core_open(devices_[0], 1, &core), TERN_ERROR_BUSY);
  tern_buffer_t buffer = nullptr;
  EXPECT_EQ(Alloc(devices_[0], 250 * kMiB, &buffer), TERN_ERROR_OUT_OF_MEMORY);

  const int status = child->Kill();
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  const auto start = std::chrono::steady_clock::now();

  core = OpenCore(devices_[0], 0);
  ASSERT_NE(core, nullptr);
  ASSERT_NE(OpenCore(devices_[0], 1), nullptr);
  ASSERT_EQ(Alloc(devices_[0], 250 * kMiB, &buffer), TERN_OK) << LastError();
  buffers_.push_back(buffer);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0) << "recovering the dead owner's cores and memory took " << seconds
                          << " s";
  RecordProperty("recovery_ms", static_cast<int>(seconds * 1000));

  // The dead process's share is gone from the node totals.
  const tern_memory_stats_t stats = Stats(devices_[0]);
  EXPECT_EQ(stats.node_used_bytes, stats.used_bytes);
  EXPECT_GE(stats.used_bytes, 250 * kMiB);

  // The recovered memory works.
  tern_queue_t queue = nullptr;
  ASSERT_EQ(tern_queue_create(core, nullptr, &queue), TERN_OK) << LastError();
  std::vector<uint8_t> in(1 << 16), out(1 << 16, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 3);
  const uint64_t offset = 240 * kMiB;
  EXPECT_EQ(tern_queue_copy_h2d(queue, buffer, offset, in.data(), in.size(), nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_copy_d2h(queue, out.data(), buffer, offset, out.size(), nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(queue, UINT64_MAX), TERN_OK) << LastError();
  EXPECT_EQ(in, out);
  EXPECT_EQ(tern_queue_destroy(queue), TERN_OK);
}

// (c) Device memory is accounted node-wide: what another process holds is not
// available here, and comes back when it exits.
TEST_F(MultiProcessTest, MemoryIsAccountedAcrossProcesses) {
  auto child = Child::Spawn({"hold-core", "0", "1", std::to_string(128 * kMiB)});
  ASSERT_TRUE(child);
  ASSERT_TRUE(child->WaitReady());

  tern_memory_stats_t stats = Stats(devices_[0]);
  EXPECT_EQ(stats.capacity_bytes, 256 * kMiB);
  EXPECT_GE(stats.node_used_bytes, 128 * kMiB);
  EXPECT_LT(stats.node_used_bytes, 129 * kMiB) << "nobody else uses this node";
  EXPECT_GE(stats.node_used_by_category[TERN_MEMORY_TENSORS], 128 * kMiB);
  EXPECT_EQ(stats.used_bytes, 0u);
  EXPECT_EQ(stats.allocation_count, 0u);
  for (uint64_t used : stats.used_by_category) EXPECT_EQ(used, 0u);
  EXPECT_EQ(stats.free_bytes, stats.capacity_bytes - stats.node_used_bytes);
  EXPECT_LE(stats.largest_free_block, stats.free_bytes);

  // One byte more than the node has left fails, and says who holds the rest.
  const uint64_t available = stats.capacity_bytes - stats.node_used_bytes;
  tern_buffer_t buffer = nullptr;
  EXPECT_EQ(Alloc(devices_[0], available + 1, &buffer), TERN_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(buffer, nullptr);
  const std::string message = LastError();
  EXPECT_NE(message.find("other processes 128"), std::string::npos) << message;
  EXPECT_NE(message.find("this process uses 0 B"), std::string::npos) << message;
  EXPECT_NE(message.find("tensors 128"), std::string::npos) << message;

  // Exactly what is left succeeds; the node is then full for both of us.
  ASSERT_EQ(Alloc(devices_[0], available, &buffer), TERN_OK) << LastError();
  stats = Stats(devices_[0]);
  EXPECT_EQ(stats.used_bytes, available);
  EXPECT_EQ(stats.node_used_bytes, stats.capacity_bytes);
  EXPECT_EQ(stats.free_bytes, 0u);
  tern_buffer_t extra = nullptr;
  EXPECT_EQ(Alloc(devices_[0], 4096, &extra), TERN_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);

  // The other device is not affected by the child.
  ASSERT_EQ(Alloc(devices_[1], 250 * kMiB, &buffer), TERN_OK) << LastError();
  EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);

  // The child exits cleanly: its memory is back.
  child->CloseStdin();
  const int status = child->Wait(kReadyTimeoutMs);
  ASSERT_TRUE(status != -1 && WIFEXITED(status)) << "child did not exit";
  EXPECT_EQ(WEXITSTATUS(status), 0) << child->ReadAll(1000);
  EXPECT_EQ(Stats(devices_[0]).node_used_bytes, 0u);
  ASSERT_EQ(Alloc(devices_[0], 250 * kMiB, &buffer), TERN_OK) << LastError();
  buffers_.push_back(buffer);
  stats = Stats(devices_[0]);
  EXPECT_EQ(stats.node_used_bytes, stats.used_bytes);
}

// (d) Telemetry shows another process's core, activity and memory without
// this process owning anything.
TEST_F(MultiProcessTest, TelemetryShowsAnotherProcess) {
  auto child = Child::Spawn({"hold-core", "0", "0", std::to_string(64 * kMiB), "--constants",
                             std::to_string(16 * kMiB), "--busy"});
  ASSERT_TRUE(child);
  ASSERT_TRUE(child->WaitReady());
  const int32_t pid = child->pid();

  tern_device_telemetry_t telemetry = Telemetry(devices_[0]);
  ASSERT_EQ(telemetry.core_count, 2u);
  EXPECT_EQ(telemetry.memory_capacity, 256 * kMiB);
  EXPECT_GE(telemetry.memory_used, 80 * kMiB);
  EXPECT_GE(telemetry.memory_by_category[TERN_MEMORY_TENSORS], 64 * kMiB);
  EXPECT_GE(telemetry.memory_by_category[TERN_MEMORY_CONSTANTS], 16 * kMiB);
  const tern_core_telemetry_t& busy_core = telemetry.cores[0];
  EXPECT_EQ(busy_core.physical_index, 0u);
  EXPECT_EQ(busy_core.owner_pid, pid);
  EXPECT_STREQ(busy_core.owner_command, kChildCommand);
  EXPECT_GE(busy_core.commands, 64u) << "the child ran a batch before saying ready";
  EXPECT_GT(busy_core.busy_ns, 0u);
  for (uint64_t errors : busy_core.errors) EXPECT_EQ(errors, 0u);
  EXPECT_EQ(telemetry.cores[1].owner_pid, 0);
  EXPECT_STREQ(telemetry.cores[1].owner_command, "");

  const tern_process_telemetry_t* entry = nullptr;
  for (uint32_t i = 0; i < telemetry.process_count; ++i) {
    if (telemetry.processes[i].pid == pid) entry = &telemetry.processes[i];
  }
  ASSERT_NE(entry, nullptr) << "the child is missing from " << telemetry.process_count
                            << " process entries";
  EXPECT_STREQ(entry->command, kChildCommand);
  EXPECT_EQ(entry->cores_owned, 1u);
  EXPECT_EQ(entry->memory_by_category[TERN_MEMORY_TENSORS], 64 * kMiB);
  EXPECT_EQ(entry->memory_by_category[TERN_MEMORY_CONSTANTS], 16 * kMiB);
  EXPECT_EQ(entry->memory_by_category[TERN_MEMORY_SCRATCH], 0u);

  // The command counter keeps moving while the child works.
  const uint64_t first = busy_core.commands;
  uint64_t later = first;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (later <= first && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    later = Telemetry(devices_[0]).cores[0].commands;
  }
  EXPECT_GT(later, first);

  // Reading telemetry took nothing: the parent owns no core and no memory.
  EXPECT_EQ(Stats(devices_[0]).used_bytes, 0u);
  for (uint32_t i = 0; i < telemetry.process_count; ++i) {
    if (telemetry.processes[i].pid == getpid()) {
      EXPECT_EQ(telemetry.processes[i].cores_owned, 0u);
    }
  }

  // Once the child is gone, so are its core record and its process entry.
  child->Kill();
  telemetry = Telemetry(devices_[0]);
  EXPECT_EQ(telemetry.cores[0].owner_pid, 0);
  EXPECT_STREQ(telemetry.cores[0].owner_command, "");
  EXPECT_EQ(telemetry.memory_used, 0u);
  for (uint32_t i = 0; i < telemetry.process_count; ++i) {
    EXPECT_NE(telemetry.processes[i].pid, pid);
  }
  // Counters are the device's, not the process's: they stay.
  EXPECT_GE(telemetry.cores[0].commands, later);
}

// What one call in a forked child returned.
struct ForkedCall {
  std::string name;
  tern_status_t status;
  std::string message;
};

// (e) A child forked (without exec) from an initialized process cannot use
// tern at all; the parent is unaffected and keeps its core.
TEST_F(MultiProcessTest, ForkedChildGetsForkedErrorAndParentKeepsWorking) {
  tern_core_t core = OpenCore(devices_[0], 0);
  ASSERT_NE(core, nullptr);
  tern_queue_t queue = nullptr;
  ASSERT_EQ(tern_queue_create(core, nullptr, &queue), TERN_OK) << LastError();
  tern_buffer_t buffer = nullptr;
  ASSERT_EQ(Alloc(devices_[0], 1 << 20, &buffer), TERN_OK);
  buffers_.push_back(buffer);
  auto round_trip = [&](uint8_t seed) {
    std::vector<uint8_t> in(4096), out(4096, 0);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i + seed);
    EXPECT_EQ(tern_queue_copy_h2d(queue, buffer, 0, in.data(), in.size(), nullptr), TERN_OK);
    EXPECT_EQ(tern_queue_copy_d2h(queue, out.data(), buffer, 0, out.size(), nullptr), TERN_OK);
    EXPECT_EQ(tern_queue_synchronize(queue, UINT64_MAX), TERN_OK) << LastError();
    EXPECT_EQ(in, out);
  };
  round_trip(1);

  int report[2], release[2];
  ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(release, O_CLOEXEC), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: only async-signal-tolerant work and tern calls, then _exit
    // (never return into gtest).
    close(report[0]);
    close(release[1]);
    std::string out;
    auto note = [&](const char* name, tern_status_t status) {
      out += std::string(name) + "\t" + std::to_string(status) + "\t" + tern_last_error_message() +
             "\n";
    };
    uint32_t count = 77;
    note("tern_device_count", tern_device_count(&count));
    if (count != 0) out += "count\t-1\tout_count was not zeroed\n";
    note("tern_init", tern_init(nullptr));
    tern_device_t device = nullptr;
    note("tern_device_get", tern_device_get(0, &device));
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = 4096;
    tern_buffer_t child_buffer = nullptr;
    note("tern_buffer_alloc", tern_buffer_alloc(devices_[0], &params, &child_buffer));
    uint8_t byte = 0;
    note("tern_buffer_read", tern_buffer_read(buffer, 0, &byte, 1));
    note("tern_queue_nop", tern_queue_nop(queue, nullptr));
    note("tern_queue_synchronize", tern_queue_synchronize(queue, 0));
    tern_core_t child_core = nullptr;
    note("tern_core_open", tern_core_open(devices_[1], 0, &child_core));
    tern_device_telemetry_t telemetry = {};
    telemetry.struct_size = sizeof(telemetry);
    note("tern_device_get_telemetry", tern_device_get_telemetry(devices_[0], &telemetry));
    note("tern_shutdown", tern_shutdown());
    (void)!write(report[1], out.data(), out.size());
    close(report[1]);
    char wait_byte;
    (void)!read(release[0], &wait_byte, 1);  // until the parent lets go
    _exit(0);
  }
  close(report[1]);
  close(release[0]);

  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(report[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  close(report[0]);

  std::vector<ForkedCall> calls;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    const std::string line = text.substr(begin, end - begin);
    begin = end == std::string::npos ? text.size() : end + 1;
    const size_t tab1 = line.find('\t');
    const size_t tab2 = line.find('\t', tab1 + 1);
    calls.push_back({line.substr(0, tab1), std::stoi(line.substr(tab1 + 1, tab2 - tab1 - 1)),
                     line.substr(tab2 + 1)});
  }
  EXPECT_EQ(calls.size(), 10u) << text;
  for (const ForkedCall& call : calls) {
    EXPECT_EQ(call.status, TERN_ERROR_FORKED) << call.name << ": " << call.message;
    EXPECT_NE(call.message.find("TERN_ERROR_FORKED"), std::string::npos) << call.name;
    EXPECT_NE(call.message.find("exec"), std::string::npos) << call.name << ": " << call.message;
    EXPECT_NE(call.message.find("after fork"), std::string::npos)
        << call.name << ": " << call.message;
  }

  // While the forked child lives, the parent works and still owns its core.
  round_trip(2);
  TryResult other = TryCoreInChild(0, 0);
  EXPECT_EQ(other.exit_code, TERN_ERROR_BUSY) << other.status_name << " " << other.message;
  EXPECT_NE(other.message.find("process " + std::to_string(getpid())), std::string::npos)
      << other.message;

  close(release[1]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);

  // The child's exit released nothing of the parent's.
  other = TryCoreInChild(0, 0);
  EXPECT_EQ(other.exit_code, TERN_ERROR_BUSY) << other.status_name << " " << other.message;
  EXPECT_NE(other.message.find("process " + std::to_string(getpid())), std::string::npos)
      << other.message;
  round_trip(3);
  EXPECT_GE(Stats(devices_[0]).node_used_bytes, 1u << 20);
  EXPECT_EQ(tern_queue_destroy(queue), TERN_OK);
}

}  // namespace
