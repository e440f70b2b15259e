#include "comm_test_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>

extern char** environ;

namespace tern_test {

void CommFixture::SetUp() {
  COMM_ASSERT_OK(tern_init(nullptr));
  for (uint32_t d = 0; d < 2; ++d) COMM_ASSERT_OK(tern_device_get(d, &devices_[d]));
  for (uint32_t i = 0; i < kMaxRanks; ++i) {
    COMM_ASSERT_OK(tern_core_open(devices_[(i / 2) % 2], i % 2, &cores_[i]));
    COMM_ASSERT_OK(tern_queue_create(cores_[i], nullptr, &queues_[i]));
  }
}

void CommFixture::TearDown() {
  DestroyAll();
  for (uint32_t i = 0; i < kMaxRanks; ++i) {
    if (queues_[i] != nullptr) tern_queue_destroy(queues_[i]);
    if (cores_[i] != nullptr) tern_core_close(cores_[i]);
  }
  tern_shutdown();
}

void CommFixture::InitAll(uint32_t n, const tern_comm_config_t* config) {
  comms_.assign(n, nullptr);
  COMM_ASSERT_OK(tern_comm_init_all(cores_, n, config, comms_.data()));
}

void CommFixture::DestroyAll() {
  for (tern_comm_t& comm : comms_) {
    if (comm != nullptr) tern_comm_destroy(comm);
    comm = nullptr;
  }
  comms_.clear();
}

void CommFixture::OnRanks(uint32_t n, const std::function<void(uint32_t)>& fn) {
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < n; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

tern_buffer_t Alloc(tern_device_t device, uint64_t bytes) {
  tern_buffer_params_t params = {sizeof(tern_buffer_params_t), 0, bytes, 0, TERN_MEMORY_TENSORS};
  tern_buffer_t buffer = nullptr;
  const tern_status_t s = tern_buffer_alloc(device, &params, &buffer);
  EXPECT_EQ(TERN_OK, s) << LastError(s);
  return buffer;
}

std::unique_ptr<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& args,
                                                  const Env& env,
                                                  const std::vector<std::string>& prefix) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return nullptr;
  }
  std::vector<std::string> argv_strings = prefix;
  argv_strings.push_back(TERN_COMM_CHILD_PATH);
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) vars[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& [k, v] : env) {
    if (v == kUnset) {
      vars.erase(k);
    } else {
      vars[k] = v;
    }
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  if (err != 0) {
    close(in[1]);
    close(out[0]);
    ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(err);
    return nullptr;
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, in[1], out[0]));
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  CloseStdin();
  close(stdout_);
}

void ChildProcess::CloseStdin() {
  if (stdin_ >= 0) close(stdin_);
  stdin_ = -1;
}

void ChildProcess::Signal(int sig) { kill(pid_, sig); }

bool ChildProcess::Fill(int timeout_ms) {
  pollfd p{stdout_, POLLIN, 0};
  const int rc = poll(&p, 1, timeout_ms);
  if (rc <= 0) return false;
  char buffer[4096];
  const ssize_t n = read(stdout_, buffer, sizeof(buffer));
  if (n <= 0) return false;
  output_.append(buffer, static_cast<size_t>(n));
  return true;
}

bool ChildProcess::WaitForLine(const std::string& needle, int timeout_ms, std::string* line) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    size_t end;
    while ((end = output_.find('\n', scanned_)) != std::string::npos) {
      const std::string text = output_.substr(scanned_, end - scanned_);
      scanned_ = end + 1;
      if (text.find(needle) != std::string::npos) {
        if (line != nullptr) *line = text;
        return true;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 || !Fill(static_cast<int>(left))) return false;
  }
}

void ChildProcess::ReadToEnd(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 || !Fill(static_cast<int>(left))) return;
  }
}

int ChildProcess::Wait(int timeout_ms) {
  if (!reaped_) {
    ReadToEnd(timeout_ms);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      const pid_t rc = waitpid(pid_, &status_, WNOHANG);
      if (rc == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        reaped_ = true;
        return -1;
      }
      usleep(10000);
    }
    reaped_ = true;
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string IdHex(const tern_comm_unique_id_t& id) {
  std::string hex;
  char two[3];
  for (char c : id.internal) {
    std::snprintf(two, sizeof(two), "%02x", static_cast<unsigned char>(c));
    hex += two;
  }
  return hex;
}

}  // namespace tern_test
