// tern never changes its host program's signal handling (docs/runtime.md,
// "Signals and libfabric loading"): a tern program that writes through NULL
// dies of SIGSEGV, and one sent SIGTERM or SIGINT dies of it, both before
// and after a communicator loaded libfabric, and nothing (such as the
// backtrace file libinfinipath's handlers write) appears in its working
// directory. Real processes: tern_signal_child, run in a fresh directory.
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Outcome {
  std::string output;                   // everything the child printed
  int wait_status = 0;                  // from waitpid
  std::vector<std::string> files_left;  // in its working directory
};

std::vector<std::string> ListDirectory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

// The environment of the child: ours, with the sanitizers told to leave
// fatal signals to the program (as an uninstrumented build would), plus
// `extra`.
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, "ASAN_OPTIONS=", 13) == 0) continue;
    if (std::strncmp(*entry, "TSAN_OPTIONS=", 13) == 0) continue;
    env.emplace_back(*entry);
  }
  const char* asan = std::getenv("ASAN_OPTIONS");
  const char* tsan = std::getenv("TSAN_OPTIONS");
  constexpr const char* kLeaveSignals =
      "handle_segv=0:handle_sigbus=0:handle_sigill=0:handle_sigfpe=0:handle_abort=0";
  env.push_back(std::string("ASAN_OPTIONS=") + (asan ? std::string(asan) + ":" : "") +
                kLeaveSignals);
  env.push_back(std::string("TSAN_OPTIONS=") + (tsan ? std::string(tsan) + ":" : "") +
                kLeaveSignals);
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Runs tern_signal_child MODE ACTION in a fresh directory. Once it printed
// its "ready" line, sends it `send` (0: none) and waits for it to end.
Outcome RunChild(const char* mode, const char* action, int send,
                 const std::vector<std::string>& extra_env = {}) {
  Outcome outcome;
  char dir_template[] = "/tmp/tern-signal-test-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  EXPECT_NE(dir, nullptr);
  if (dir == nullptr) return outcome;

  const std::vector<std::string> env_strings = ChildEnvironment(extra_env);
  std::vector<char*> env;
  for (const auto& entry : env_strings) env.push_back(const_cast<char*>(entry.c_str()));
  env.push_back(nullptr);
  const char* argv[] = {TERN_SIGNAL_CHILD_PATH, mode, action, nullptr};

  int out[2];
  EXPECT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    if (chdir(dir) != 0) _exit(126);
    const rlimit no_core{0, 0};  // a core file would be "a file left behind"
    setrlimit(RLIMIT_CORE, &no_core);
    execve(argv[0], const_cast<char* const*>(argv), env.data());
    _exit(127);
  }
  close(out[1]);

  // Read until end of file (the child and its rank-1 process are gone),
  // signalling it once the ready line is in; 60 s at most.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool signalled = false;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd readable{out[0], POLLIN, 0};
    if (poll(&readable, 1, 100) <= 0) continue;
    char buffer[512];
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    outcome.output.append(buffer, static_cast<size_t>(n));
    if (!signalled && send != 0 && outcome.output.find("ready") != std::string::npos) {
      kill(pid, send);
      signalled = true;
    }
  }
  close(out[0]);
  pid_t waited = 0;
  while ((waited = waitpid(pid, &outcome.wait_status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (waited != pid) {
    ADD_FAILURE() << "tern_signal_child " << mode << " " << action << " did not end; output:\n"
                  << outcome.output;
    kill(pid, SIGKILL);
    waitpid(pid, &outcome.wait_status, 0);
  }
  outcome.files_left = ListDirectory(dir);
  for (const auto& name : outcome.files_left) std::remove((std::string(dir) + "/" + name).c_str());
  rmdir(dir);
  return outcome;
}

std::string Describe(const Outcome& outcome) {
  std::string text;
  if (WIFSIGNALED(outcome.wait_status)) {
    text = "died of signal " + std::to_string(WTERMSIG(outcome.wait_status)) + " (" +
           strsignal(WTERMSIG(outcome.wait_status)) + ")";
  } else if (WIFEXITED(outcome.wait_status)) {
    text = "exited with status " + std::to_string(WEXITSTATUS(outcome.wait_status));
  }
  return text + "; output:\n" + outcome.output;
}

void ExpectDiedOf(const Outcome& outcome, int signal) {
  ASSERT_TRUE(WIFSIGNALED(outcome.wait_status)) << Describe(outcome);
  EXPECT_EQ(WTERMSIG(outcome.wait_status), signal) << Describe(outcome);
  EXPECT_TRUE(outcome.files_left.empty())
      << "left in its working directory: " << outcome.files_left[0] << "; " << Describe(outcome);
}

// Peers in other processes, forced onto libfabric's tcp provider over
// loopback (as tests/comm does): the fabric channel loads libfabric.
const std::vector<std::string> kFabricEnv = {"FI_PROVIDER=tcp", "FI_TCP_IFACE=lo"};

TEST(SignalTest, NullWriteDiesOfSigsegv) {
  const Outcome outcome = RunChild("plain", "segv", 0);
  ExpectDiedOf(outcome, SIGSEGV);
  // Creating no communicator, the program never loads libfabric.
  EXPECT_NE(outcome.output.find("ready libfabric=0"), std::string::npos) << outcome.output;
}

TEST(SignalTest, SigtermKills) { ExpectDiedOf(RunChild("plain", "wait", SIGTERM), SIGTERM); }

TEST(SignalTest, SigintKills) { ExpectDiedOf(RunChild("plain", "wait", SIGINT), SIGINT); }

TEST(SignalTest, NullWriteDiesOfSigsegvAfterLibfabricLoaded) {
  const Outcome outcome = RunChild("fabric", "segv", 0, kFabricEnv);
  EXPECT_NE(outcome.output.find("ready libfabric=1 transport=tcp"), std::string::npos)
      << outcome.output;
  ExpectDiedOf(outcome, SIGSEGV);
}

TEST(SignalTest, SigtermKillsAfterLibfabricLoaded) {
  const Outcome outcome = RunChild("fabric", "wait", SIGTERM, kFabricEnv);
  EXPECT_NE(outcome.output.find("ready libfabric=1"), std::string::npos) << outcome.output;
  ExpectDiedOf(outcome, SIGTERM);
}

// libfabric is loaded only when needed, so a missing one fails the
// communicator that needs it, with what to install.
TEST(SignalTest, MissingLibfabricFailsTheCommunicatorClearly) {
  std::vector<std::string> env = kFabricEnv;
  env.push_back("TERN_COMM_LIBFABRIC=/nonexistent/libfabric.so.1");
  const Outcome outcome = RunChild("fabric", "segv", 0, env);
  ASSERT_TRUE(WIFEXITED(outcome.wait_status)) << Describe(outcome);
  EXPECT_EQ(WEXITSTATUS(outcome.wait_status), 2) << Describe(outcome);
  EXPECT_NE(outcome.output.find("error: tern_comm_init_rank: TERN_ERROR_COMM_TRANSPORT"),
            std::string::npos)
      << outcome.output;
  EXPECT_NE(outcome.output.find("/nonexistent/libfabric.so.1 (TERN_COMM_LIBFABRIC) could not be "
                                "loaded"),
            std::string::npos)
      << outcome.output;
  EXPECT_NE(outcome.output.find("apt install libfabric1"), std::string::npos) << outcome.output;
}

}  // namespace
