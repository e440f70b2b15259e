// `tern monitor --listen` serves connections concurrently with bounded
// resources (docs/tools.md, "monitor over HTTP"): idle clients do not delay a
// scrape, connections beyond --max-connections are refused at once without
// costing the server file descriptors or threads, and an idle client is
// dropped after the request deadline. Real processes and sockets: the tool
// (TERN_TOOL_PATH) on the test's own simulated node.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// `tern monitor --listen 127.0.0.1:0 EXTRA...`, stopped by the destructor.
class MonitorServer {
 public:
  explicit MonitorServer(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {TERN_TOOL_PATH, "monitor", "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    int err[2];
    if (pipe2(err, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(err[1]);
    if (rc != 0) {
      close(err[0]);
      pid_ = -1;
      return;
    }
    stderr_ = err[0];
    // "tern monitor: serving Prometheus metrics on http://127.0.0.1:PORT/metrics"
    const auto start = Clock::now();
    const std::string prefix = "http://127.0.0.1:";
    while (MsSince(start) < 30000 && text_.find("/metrics") == std::string::npos) {
      pollfd readable{stderr_, POLLIN, 0};
      if (poll(&readable, 1, 100) <= 0) continue;
      char buffer[256];
      const ssize_t n = read(stderr_, buffer, sizeof(buffer));
      if (n <= 0) break;
      text_.append(buffer, static_cast<size_t>(n));
    }
    if (const size_t at = text_.find(prefix); at != std::string::npos) {
      port_ = std::atoi(text_.c_str() + at + prefix.size());
    }
  }
  ~MonitorServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    if (stderr_ >= 0) close(stderr_);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return text_; }

  // Entries of /proc/PID/fd, and the Threads line of /proc/PID/status.
  size_t OpenFiles() const {
    size_t count = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/fd")) {
      ++count;
    }
    return count;
  }
  int Threads() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int stderr_ = -1;
  int port_ = 0;
  std::string text_;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends on `fd` until it closes, or until `timeout_ms`.
std::string ReadUntilClosed(int fd, int timeout_ms) {
  std::string text;
  const auto start = Clock::now();
  while (MsSince(start) < timeout_ms) {
    pollfd readable{fd, POLLIN, 0};
    if (poll(&readable, 1, 50) <= 0) continue;
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return text;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text + "[no end within " + std::to_string(timeout_ms) + " ms]";
}

std::string Scrape(int port, int timeout_ms) {
  const int fd = Connect(port);
  if (fd < 0) return "[connect failed]";
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response = ReadUntilClosed(fd, timeout_ms);
  close(fd);
  return response;
}

void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) close(fd);
  fds->clear();
}

TEST(MonitorHttpTest, IdleConnectionsDoNotDelayAScrape) {
  MonitorServer server;
  ASSERT_GT(server.port(), 0) << server.output();
  // 20 clients that connect and wait: half send nothing, half stop in the
  // middle of their request line.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 1) send(fd, "GET /met", 8, MSG_NOSIGNAL);
    idle.push_back(fd);
  }
  const auto start = Clock::now();
  const std::string response = Scrape(server.port(), 5000);
  const int64_t elapsed_ms = MsSince(start);
  EXPECT_EQ(response.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << response;
  EXPECT_NE(response.find("\ntern_"), std::string::npos) << response;
  EXPECT_LT(elapsed_ms, 1000) << "a scrape behind 20 idle connections took " << elapsed_ms << " ms";
  CloseAll(&idle);
}

TEST(MonitorHttpTest, ConnectionsBeyondTheCapAreRefusedAtOnce) {
  constexpr int kCap = 4;
  MonitorServer server({"--max-connections", std::to_string(kCap)});
  ASSERT_GT(server.port(), 0) << server.output();
  const size_t files_before = server.OpenFiles();
  const int threads_before = server.Threads();

  std::vector<int> idle;
  for (int i = 0; i < kCap; ++i) {
    idle.push_back(Connect(server.port()));
    ASSERT_GE(idle.back(), 0);
  }
  // Let the server accept them, so that the next ones are over the cap.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int extra = 0; extra < 3 * kCap; ++extra) {
    const auto start = Clock::now();
    const std::string response = Scrape(server.port(), 1500);
    EXPECT_EQ(response.rfind("HTTP/1.0 503 Service Unavailable\r\n", 0), 0u) << response;
    EXPECT_NE(response.find(std::to_string(kCap) + " connections are open"), std::string::npos)
        << response;
    EXPECT_LT(MsSince(start), 1000);
  }
  // The refused ones cost nothing once closed: the cap's sockets and no
  // thread more.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(server.OpenFiles(), files_before + kCap);
  EXPECT_EQ(server.Threads(), threads_before);

  // Closing them frees the slots: a scrape is served again.
  CloseAll(&idle);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string response = Scrape(server.port(), 5000);
  EXPECT_EQ(response.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << response;
}

TEST(MonitorHttpTest, AnIdleClientIsDroppedAfterTheRequestDeadline) {
  MonitorServer server({"--max-connections", "1"});
  ASSERT_GT(server.port(), 0) << server.output();
  const int idle = Connect(server.port());
  ASSERT_GE(idle, 0);
  // The server closes it (2 s request deadline) without an answer ...
  const auto start = Clock::now();
  EXPECT_EQ(ReadUntilClosed(idle, 6000), "");
  const int64_t elapsed_ms = MsSince(start);
  EXPECT_GE(elapsed_ms, 1500);
  EXPECT_LT(elapsed_ms, 4000);
  close(idle);
  // ... and its one slot serves the next scrape.
  const std::string response = Scrape(server.port(), 5000);
  EXPECT_EQ(response.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << response;
}

}  // namespace
