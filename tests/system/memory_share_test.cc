// Multi-process system tests of shared device memory (tern_buffer_export /
// tern_buffer_import): real tern_test_child processes (posix_spawn + exec)
// receive a buffer's descriptor over a unix socket (SCM_RIGHTS) or send one,
// read and write the shared memory through queue copies, and are SIGKILLed
// mid-use, while this process checks the data and the node-wide accounting.
//
// Children inherit TERN_SIM_NODE and TERN_SIM_TOPOLOGY (2 devices x 2 cores x
// 256 MiB) from the test main(), so they join this process's node.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
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

constexpr uint64_t kSize = (1ull << 20) + 100;      // not whole pages
constexpr uint64_t kCharged = (1ull << 20) + 4096;  // kSize in whole pages
constexpr int kTimeoutMs = 30000;                   // a child under ASan starts slowly

std::string LastError() { return tern_last_error_message(); }

// The shared-buffer test pattern (child.cc has the same function).
uint8_t PatternByte(uint64_t index, uint32_t seed) {
  return static_cast<uint8_t>(index * 131 + seed * 7 + (index >> 8));
}
std::vector<uint8_t> Pattern(uint64_t size, uint32_t seed) {
  std::vector<uint8_t> bytes(size);
  for (uint64_t i = 0; i < size; ++i) bytes[i] = PatternByte(i, seed);
  return bytes;
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

int ReceiveFd(int socket, int timeout_ms) {
  struct pollfd pfd = {socket, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) != 1) return -1;
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
  if (cmsg == nullptr || cmsg->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(fd));
  return fd;
}

// A running tern_test_child: stdin and stdout are pipes to this process and,
// when asked, descriptor 3 is one end of a unix socket pair whose other end
// is socket().
class Child {
 public:
  static std::unique_ptr<Child> Spawn(const std::vector<std::string>& args, bool with_socket) {
    int in[2], out[2], sock[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
        (with_socket && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sock) != 0)) {
      ADD_FAILURE() << "pipe2/socketpair: " << std::strerror(errno);
      return nullptr;
    }
    std::vector<std::string> argv_strings = {TERN_TEST_CHILD_PATH};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 clears close-on-exec on the copies: only these survive exec.
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    if (with_socket) posix_spawn_file_actions_adddup2(&actions, sock[1], 3);
    pid_t pid = 0;
    const int err = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    if (with_socket) close(sock[1]);
    if (err != 0) {
      close(in[1]);
      close(out[0]);
      if (with_socket) close(sock[0]);
      ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(err);
      return nullptr;
    }
    return std::unique_ptr<Child>(new Child(pid, in[1], out[0], sock[0]));
  }

  ~Child() {
    if (!reaped_) Kill();
    if (stdin_ >= 0) close(stdin_);
    close(stdout_);
    if (socket_ >= 0) close(socket_);
  }

  int socket() const { return socket_; }

  bool ReadLine(std::string* line, int timeout_ms = kTimeoutMs) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      const size_t newline = buffered_.find('\n');
      if (newline != std::string::npos) {
        *line = buffered_.substr(0, newline);
        buffered_.erase(0, newline + 1);
        return true;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      struct pollfd pfd = {stdout_, POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
      char buf[4096];
      const ssize_t n = read(stdout_, buf, sizeof(buf));
      if (n <= 0) return false;
      buffered_.append(buf, static_cast<size_t>(n));
    }
  }

  // Sends a command line and returns the child's answer ("<no answer>" when
  // none came).
  std::string Ask(const std::string& command) {
    const std::string line = command + "\n";
    if (write(stdin_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return "<write failed>";
    }
    std::string answer;
    if (!ReadLine(&answer)) return "<no answer>";
    return answer;
  }

  // End-of-file on stdin, then the exit status (-1 after the timeout).
  int Finish() {
    close(stdin_);
    stdin_ = -1;
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (Clock::now() < deadline) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        reaped_ = true;
        return status;
      }
      if (done < 0) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }

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
  Child(pid_t pid, int stdin_fd, int stdout_fd, int socket_fd)
      : pid_(pid), stdin_(stdin_fd), stdout_(stdout_fd), socket_(socket_fd) {}

  pid_t pid_;
  int stdin_;
  int stdout_;
  int socket_;
  bool reaped_ = false;
  std::string buffered_;
};

class MemoryShareSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    ASSERT_EQ(tern_device_get(0, &device_), TERN_OK);
    ASSERT_EQ(tern_core_open(device_, 0, &core_), TERN_OK) << LastError();
    ASSERT_EQ(tern_queue_create(core_, nullptr, &queue_), TERN_OK) << LastError();
  }

  void TearDown() override {
    if (queue_ != nullptr) {
      EXPECT_EQ(tern_queue_destroy(queue_), TERN_OK);
    }
    if (core_ != nullptr) {
      EXPECT_EQ(tern_core_close(core_), TERN_OK);
    }
    EXPECT_EQ(tern_shutdown(), TERN_OK);
  }

  tern_buffer_t AllocShareable(uint32_t seed) {
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.flags = TERN_BUFFER_FLAG_SHAREABLE;
    params.size = kSize;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    EXPECT_EQ(tern_buffer_alloc(device_, &params, &buffer), TERN_OK) << LastError();
    if (buffer != nullptr) Write(buffer, seed);
    return buffer;
  }

  void Write(tern_buffer_t buffer, uint32_t seed) {
    const std::vector<uint8_t> bytes = Pattern(kSize, seed);
    ASSERT_EQ(tern_queue_copy_h2d(queue_, buffer, 0, bytes.data(), kSize, nullptr), TERN_OK)
        << LastError();
    ASSERT_EQ(tern_queue_synchronize(queue_, UINT64_MAX), TERN_OK) << LastError();
  }

  // True when `buffer` holds pattern `seed` (read with a queue copy).
  bool Holds(tern_buffer_t buffer, uint32_t seed) {
    std::vector<uint8_t> bytes(kSize);
    EXPECT_EQ(tern_queue_copy_d2h(queue_, bytes.data(), buffer, 0, kSize, nullptr), TERN_OK)
        << LastError();
    EXPECT_EQ(tern_queue_synchronize(queue_, UINT64_MAX), TERN_OK) << LastError();
    return bytes == Pattern(kSize, seed);
  }

  // The node's device-0 bytes in use, after the dead processes were reaped
  // (reading telemetry reaps them).
  uint64_t NodeUsed() {
    tern_device_telemetry_t telemetry = {};
    telemetry.struct_size = sizeof(telemetry);
    EXPECT_EQ(tern_device_get_telemetry(device_, &telemetry), TERN_OK) << LastError();
    tern_memory_stats_t stats = {};
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(tern_device_memory_stats(device_, &stats), TERN_OK) << LastError();
    EXPECT_EQ(telemetry.memory_used, stats.node_used_bytes);
    return stats.node_used_bytes;
  }

  // Starts a child that imports `buffer` (sent over its socket).
  std::unique_ptr<Child> SpawnImporter(tern_buffer_t buffer) {
    auto child = Child::Spawn({"share-import", "0", std::to_string(kSize)}, true);
    if (!child) return nullptr;
    int fd = -1;
    EXPECT_EQ(tern_buffer_export(buffer, &fd), TERN_OK) << LastError();
    EXPECT_TRUE(SendFd(child->socket(), fd));
    close(fd);  // the child has its own now; ours is not needed
    std::string line;
    EXPECT_TRUE(child->ReadLine(&line));
    EXPECT_EQ("imported", line);
    if (line != "imported") return nullptr;
    return child;
  }

  tern_device_t device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

// A child imports the buffer and reads and writes it through queue copies;
// each side sees the other's writes, and the node counts the memory once.
TEST_F(MemoryShareSystemTest, ChildImportsReadsAndWrites) {
  tern_buffer_t buffer = AllocShareable(1);
  ASSERT_NE(nullptr, buffer);
  auto child = SpawnImporter(buffer);
  ASSERT_TRUE(child);
  EXPECT_EQ("match", child->Ask("check 1"));
  EXPECT_EQ("written", child->Ask("write 2"));
  EXPECT_TRUE(Holds(buffer, 2)) << "the parent sees the child's write";
  Write(buffer, 3);
  EXPECT_EQ("match", child->Ask("check 3")) << "the child sees the parent's write";
  // Once on the node, under both processes.
  EXPECT_EQ(kCharged, NodeUsed());
  EXPECT_EQ("used " + std::to_string(kCharged) + " node " + std::to_string(kCharged),
            child->Ask("stats"));
  tern_device_telemetry_t telemetry = {};
  telemetry.struct_size = sizeof(telemetry);
  ASSERT_EQ(tern_device_get_telemetry(device_, &telemetry), TERN_OK);
  int holders = 0;
  for (uint32_t i = 0; i < telemetry.process_count; ++i) {
    if (telemetry.processes[i].memory_by_category[TERN_MEMORY_TENSORS] == kCharged) ++holders;
  }
  EXPECT_EQ(2, holders) << "each process's row shows the shared buffer";
  // The exporter frees while the importer still uses it.
  ASSERT_EQ(tern_buffer_free(buffer), TERN_OK);
  EXPECT_EQ(kCharged, NodeUsed()) << "the importer holds it now";
  EXPECT_EQ("written", child->Ask("write 4"));
  EXPECT_EQ("match", child->Ask("check 4"));
  EXPECT_EQ("freed", child->Ask("free"));
  EXPECT_EQ(0u, NodeUsed()) << "the last holder's free released it";
  const int status = child->Finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// The exporter is SIGKILLed while this process uses its buffer: the data
// stays, the memory stays charged (to this process) until it is freed.
TEST_F(MemoryShareSystemTest, ExporterKilledImporterKeepsData) {
  auto child = Child::Spawn({"share-export", "0", std::to_string(kSize), "5"}, true);
  ASSERT_TRUE(child);
  const int fd = ReceiveFd(child->socket(), kTimeoutMs);
  ASSERT_GE(fd, 0);
  std::string line;
  ASSERT_TRUE(child->ReadLine(&line));
  ASSERT_EQ("ready", line);
  tern_buffer_t imported = nullptr;
  ASSERT_EQ(tern_buffer_import(device_, fd, kSize, &imported), TERN_OK) << LastError();
  close(fd);
  EXPECT_TRUE(Holds(imported, 5));
  EXPECT_EQ("written", child->Ask("write 6"));
  EXPECT_TRUE(Holds(imported, 6));
  EXPECT_EQ(kCharged, NodeUsed());
  child->Kill();
  EXPECT_EQ(kCharged, NodeUsed()) << "the exporter's death does not drop what we hold";
  EXPECT_TRUE(Holds(imported, 6));
  Write(imported, 7);
  EXPECT_TRUE(Holds(imported, 7));
  ASSERT_EQ(tern_buffer_free(imported), TERN_OK);
  EXPECT_EQ(0u, NodeUsed()) << "nothing leaked";
}

// The importer is SIGKILLed in the middle of writing; the exporter freed the
// buffer before, so the importer was its only holder: its death releases the
// memory, and the exporter's process goes on.
TEST_F(MemoryShareSystemTest, ImporterKilledMidUseNoLeak) {
  tern_buffer_t buffer = AllocShareable(8);
  ASSERT_NE(nullptr, buffer);
  auto child = SpawnImporter(buffer);
  ASSERT_TRUE(child);
  ASSERT_EQ(tern_buffer_free(buffer), TERN_OK);
  EXPECT_EQ(kCharged, NodeUsed());
  EXPECT_EQ("spinning", child->Ask("spin"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  child->Kill();
  EXPECT_EQ(0u, NodeUsed()) << "the killed importer's hold was reaped";
  // A second round with the exporter still holding: the importer's death
  // leaves the exporter's buffer and charge alone.
  tern_buffer_t second = AllocShareable(9);
  ASSERT_NE(nullptr, second);
  auto importer = SpawnImporter(second);
  ASSERT_TRUE(importer);
  EXPECT_EQ("spinning", importer->Ask("spin"));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  importer->Kill();
  EXPECT_EQ(kCharged, NodeUsed());
  Write(second, 10);
  EXPECT_TRUE(Holds(second, 10));
  ASSERT_EQ(tern_buffer_free(second), TERN_OK);
  EXPECT_EQ(0u, NodeUsed());
}

// A descriptor outlives its exporter: after the exporter died (and nothing
// held the memory but the descriptor, charged to nobody), importing it gives
// the data back and charges this process.
TEST_F(MemoryShareSystemTest, DescriptorUsableAfterExporterDied) {
  auto child = Child::Spawn({"share-export", "0", std::to_string(kSize), "11"}, true);
  ASSERT_TRUE(child);
  const int fd = ReceiveFd(child->socket(), kTimeoutMs);
  ASSERT_GE(fd, 0);
  std::string line;
  ASSERT_TRUE(child->ReadLine(&line));
  ASSERT_EQ("ready", line);
  EXPECT_EQ(kCharged, NodeUsed());
  child->Kill();
  EXPECT_EQ(0u, NodeUsed()) << "a dead exporter's charge is reaped";
  tern_buffer_t imported = nullptr;
  ASSERT_EQ(tern_buffer_import(device_, fd, kSize, &imported), TERN_OK) << LastError();
  close(fd);
  EXPECT_TRUE(Holds(imported, 11));
  EXPECT_EQ(kCharged, NodeUsed());
  ASSERT_EQ(tern_buffer_free(imported), TERN_OK);
  EXPECT_EQ(0u, NodeUsed());
}

// A process that was not given the descriptor has no way to the buffer: the
// exporter's descriptor number means nothing in it, and it holds no exported
// buffer's descriptor (they are close-on-exec).
TEST_F(MemoryShareSystemTest, ProcessWithoutDescriptorCannotReachTheBuffer) {
  tern_buffer_t buffer = AllocShareable(12);
  ASSERT_NE(nullptr, buffer);
  int fd = -1;
  ASSERT_EQ(tern_buffer_export(buffer, &fd), TERN_OK) << LastError();
  auto child = Child::Spawn({"share-probe", "0", std::to_string(kSize), std::to_string(fd)}, false);
  ASSERT_TRUE(child);
  std::string status, memfds;
  ASSERT_TRUE(child->ReadLine(&status));
  ASSERT_TRUE(child->ReadLine(&memfds));
  EXPECT_EQ("TERN_ERROR_INVALID_ARGUMENT", status);
  EXPECT_EQ("tern-buffer memfds: 0", memfds);
  const int exit_status = child->Finish();
  EXPECT_TRUE(WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 0) << exit_status;
  close(fd);
  ASSERT_EQ(tern_buffer_free(buffer), TERN_OK);
  EXPECT_EQ(0u, NodeUsed());
}

}  // namespace
