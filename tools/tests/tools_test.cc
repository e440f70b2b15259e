// Tests of the `tern` command. Everything here is a real process: the tool
// (TERN_TOOL_PATH) and a workload (tern_workload, TERN_WORKLOAD_PATH) that
// holds cores and memory and runs commands in another process. They share
// the test's simulated node through TERN_SIM_NODE=test-<pid>, which the test
// main() sets (with TERN_SIM_TOPOLOGY=2x2x256M) and children inherit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tern/tern.h"

extern char** environ;

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kWorkloadBytes = 8 * kMiB;
constexpr int kStartTimeoutMs = 30000;  // a process under ASan starts slowly
constexpr int kRunTimeoutMs = 60000;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Environment of this process plus `extra` ("NAME=value", overriding).
std::vector<std::string> MakeEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& x : extra) overridden |= x.substr(0, x.find('=')) == name;
    if (!overridden) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// A child process with pipes on stdin, stdout and stderr.
class Process {
 public:
  static std::unique_ptr<Process> Start(std::vector<std::string> argv,
                                        const std::vector<std::string>& extra_env = {}) {
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return nullptr;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    std::vector<std::string> env = MakeEnvironment(extra_env);
    std::vector<char*> argv_ptrs = Pointers(argv);
    std::vector<char*> env_ptrs = Pointers(env);
    pid_t pid = 0;
    const int rc =
        posix_spawn(&pid, argv_ptrs[0], &actions, nullptr, argv_ptrs.data(), env_ptrs.data());
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
      ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << std::strerror(rc);
      close(in[1]);
      close(out[0]);
      close(err[0]);
      return nullptr;
    }
    auto process = std::unique_ptr<Process>(new Process());
    process->pid_ = pid;
    process->stdin_ = in[1];
    process->fds_[0] = out[0];
    process->fds_[1] = err[0];
    return process;
  }

  ~Process() {
    if (stdin_ >= 0) close(stdin_);
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  pid_t pid() const { return pid_; }
  void Signal(int sig) { kill(pid_, sig); }
  void CloseStdin() {
    if (stdin_ >= 0) close(stdin_);
    stdin_ = -1;
  }

  // Reads one line of stdout (stream 0) or stderr (1); false on timeout or EOF.
  bool ReadLine(int stream, std::string* line, int timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    while (true) {
      const size_t newline = buffers_[stream].find('\n');
      if (newline != std::string::npos) {
        *line = buffers_[stream].substr(0, newline);
        buffers_[stream].erase(0, newline + 1);
        return true;
      }
      const int64_t left = deadline - NowMs();
      if (left <= 0 || !Pump(static_cast<int>(left))) return false;
    }
  }

  // Reads both streams until both end (or the timeout); returns stdout.
  std::string ReadToEnd(int timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    while (fds_[0] >= 0 || fds_[1] >= 0) {
      const int64_t left = deadline - NowMs();
      if (left <= 0 || !Pump(static_cast<int>(left))) break;
    }
    return buffers_[0];
  }
  const std::string& stderr_text() const { return buffers_[1]; }

  // Waits for exit: the exit code, 128 + signal, or -1 on timeout.
  int Wait(int timeout_ms) {
    const int64_t deadline = NowMs() + timeout_ms;
    while (!exited_) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (NowMs() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return status_;
  }

 private:
  Process() = default;

  // Moves whatever is readable into the buffers; false when nothing is left
  // to read or the wait timed out.
  bool Pump(int timeout_ms) {
    pollfd pfds[2];
    int n = 0;
    int which[2];
    for (int s = 0; s < 2; ++s) {
      if (fds_[s] < 0) continue;
      pfds[n] = {fds_[s], POLLIN, 0};
      which[n++] = s;
    }
    if (n == 0) return false;
    const int ready = poll(pfds, n, timeout_ms);
    if (ready <= 0) return ready < 0 && errno == EINTR;
    for (int i = 0; i < n; ++i) {
      if (pfds[i].revents == 0) continue;
      char chunk[4096];
      const ssize_t got = read(pfds[i].fd, chunk, sizeof(chunk));
      if (got > 0) {
        buffers_[which[i]].append(chunk, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds_[which[i]]);
        fds_[which[i]] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = 0;
  int stdin_ = -1;
  int fds_[2] = {-1, -1};
  std::string buffers_[2];
  bool exited_ = false;
  int status_ = -1;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `tern ARGS...` to completion.
RunResult RunTern(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {TERN_TOOL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  RunResult result;
  auto process = Process::Start(argv, env);
  if (!process) return result;
  process->CloseStdin();
  result.out = process->ReadToEnd(kRunTimeoutMs);
  result.err = process->stderr_text();
  result.exit_code = process->Wait(5000);
  return result;
}

std::string Describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

// A tern_workload process that is ready (its cores open, memory allocated).
class Workload {
 public:
  explicit Workload(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {TERN_WORKLOAD_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    process_ = Process::Start(argv, env);
    if (!process_) return;
    std::string line;
    if (!process_->ReadLine(0, &line, kStartTimeoutMs)) {
      ADD_FAILURE() << "the workload did not get ready; stderr: " << process_->stderr_text();
      return;
    }
    EXPECT_EQ(line, "ready " + std::to_string(process_->pid()));
    ready_ = line == "ready " + std::to_string(process_->pid());
  }
  ~Workload() {
    if (!process_) return;
    process_->CloseStdin();
    process_->Signal(SIGTERM);
    EXPECT_EQ(process_->Wait(kStartTimeoutMs), 0)
        << process_->ReadToEnd(1000) << process_->stderr_text();
  }
  bool ready() const { return ready_; }
  int pid() const { return process_->pid(); }

 private:
  std::unique_ptr<Process> process_;
  bool ready_ = false;
};

const Json* FindProcess(const Json& device, int pid) {
  for (const Json& p : device.at("processes")) {
    if (p.at("pid").get<int>() == pid) return &p;
  }
  return nullptr;
}

// --- Prometheus text format -------------------------------------------------

bool IsNameChar(char c, bool first, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
         (!first && c >= '0' && c <= '9');
}

// Reads a metric name (colons allowed) or label name at `*pos`; "" if none.
std::string ReadName(const std::string& line, size_t* pos, bool colon) {
  const size_t begin = *pos;
  while (*pos < line.size() && IsNameChar(line[*pos], *pos == begin, colon)) ++*pos;
  return line.substr(begin, *pos - begin);
}

// Parses `name{label="value",...} value`; false if malformed.
bool ParseSample(const std::string& line, std::string* name, std::string* value) {
  size_t pos = 0;
  *name = ReadName(line, &pos, true);
  if (name->empty()) return false;
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    while (true) {
      if (ReadName(line, &pos, false).empty()) return false;
      if (line.compare(pos, 2, "=\"") != 0) return false;
      pos += 2;
      while (pos < line.size() && line[pos] != '"') {
        if (line[pos] == '\\') {
          if (pos + 1 >= line.size() ||
              std::string("\\\"n").find(line[pos + 1]) == std::string::npos) {
            return false;
          }
          ++pos;
        }
        ++pos;
      }
      if (pos >= line.size()) return false;
      ++pos;  // the closing quote
      if (pos < line.size() && line[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < line.size() && line[pos] == '}') {
        ++pos;
        break;
      }
      return false;
    }
  }
  if (pos >= line.size() || line[pos] != ' ') return false;
  *value = line.substr(pos + 1);
  return !value->empty() && value->find(' ') == std::string::npos;
}

// Checks `text` against the text exposition format (0.0.4) and the
// conventions this tool promises: HELP and TYPE once per family, before its
// samples; counters end in _total; label values escaped; numeric values.
// Fills `samples` with "name{labels}" -> value. Returns "" or the problem.
std::string ValidateExposition(const std::string& text, std::map<std::string, double>* samples) {
  static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                               "untyped"};
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  if (text.empty() || text.back() != '\n') return "the exposition must end with a newline";
  while (std::getline(lines, line)) {
    ++number;
    const std::string where = "line " + std::to_string(number) + " '" + line + "': ";
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      size_t pos = 7;
      const std::string name = ReadName(line, &pos, true);
      if (name.empty() || pos >= line.size() || line[pos] != ' ' || pos + 1 >= line.size()) {
        return where + "malformed HELP or TYPE";
      }
      const std::string rest = line.substr(pos + 1);
      if (line[2] == 'H') {
        if (!helped.insert(name).second) return where + "second HELP for the family";
        continue;
      }
      if (!kTypes.count(rest)) return where + "unknown type";
      if (types.count(name)) return where + "second TYPE for the family";
      if (rest == "counter" && !name.ends_with("_total"))
        return where + "counter names end in _total";
      types[name] = rest;
    } else if (line.empty() || line[0] == '#') {
      return where + "unexpected comment or blank line";
    } else {
      std::string name, value;
      if (!ParseSample(line, &name, &value)) return where + "malformed sample";
      // A histogram's samples are its name plus _bucket, _sum or _count.
      std::string family = name;
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string base =
            name.substr(0, name.size() - std::min(name.size(), strlen(suffix)));
        if (name.ends_with(suffix) && types.count(base) && types[base] == "histogram")
          family = base;
      }
      if (!types.count(family)) return where + "sample before its family's TYPE";
      if (types[family] == "histogram" && family == name) {
        return where + "histogram samples end in _bucket, _sum or _count";
      }
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0') return where + "value is not a number";
      const std::string key = line.substr(0, line.rfind(' '));
      if (!samples->emplace(key, v).second) return where + "duplicate series";
    }
  }
  for (const auto& [name, type] : types) {
    if (!helped.count(name)) return "family " + name + " has no HELP";
  }
  return "";
}

TEST(ExpositionValidatorTest, RejectsMalformedText) {
  std::map<std::string, double> samples;
  const std::string good =
      "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\\\\\"} 3\n";
  EXPECT_EQ(ValidateExposition(good, &samples), "");
  EXPECT_EQ(samples.at("a_total{x=\"1\",y=\"q\\\"\\\\\"}"), 3.0);
  for (const char* bad : {
           "# TYPE a_total counter\na_total 1\n",            // no HELP
           "# HELP a A.\n# TYPE a counter\na 1\n",           // counter without _total
           "# HELP a A.\n# TYPE a gauge\na{x=1} 1\n",        // unquoted label
           "# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n",  // bad escape
           "# HELP a A.\n# TYPE a gauge\na one\n",           // not a number
           "# HELP a A.\n# TYPE a gauge\nb 1\n",             // no TYPE for b
           "# HELP a A.\n# TYPE a gauge\na 1\na 2\n",        // duplicate series
           "# HELP a A.\n# TYPE a gauge\na 1",               // no final newline
       }) {
    samples.clear();
    EXPECT_NE(ValidateExposition(bad, &samples), "") << bad;
  }
}

// --- HTTP -------------------------------------------------------------------

// Sends `request` to 127.0.0.1:port and returns the whole response.
std::string HttpExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "socket failed";
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return std::string("connect failed: ") + std::strerror(errno);
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  const int64_t deadline = NowMs() + kRunTimeoutMs;
  while (NowMs() < deadline) {
    pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, 1000) <= 0) continue;
    char chunk[4096];
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    response.append(chunk, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

// --- the command line ---------------------------------------------------------

TEST(TernCliTest, HelpListsEverySubcommand) {
  const RunResult r = RunTern({"--help"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  for (const char* sub : {"ls", "top", "monitor", "diag", "dump"}) {
    EXPECT_NE(r.out.find(std::string("\n  ") + sub + " "), std::string::npos) << sub << "\n"
                                                                              << r.out;
  }
  const RunResult diag_help = RunTern({"diag", "--help"});
  ASSERT_EQ(diag_help.exit_code, 0) << Describe(diag_help);
  EXPECT_NE(diag_help.out.find("--inject"), std::string::npos);
  EXPECT_NE(diag_help.out.find("0 healthy, 1 degraded, 2 failed"), std::string::npos);
}

TEST(TernCliTest, BadUsageExits64WithAMessage) {
  const RunResult none = RunTern({});
  EXPECT_EQ(none.exit_code, 64) << Describe(none);
  EXPECT_NE(none.err.find("subcommand"), std::string::npos) << none.err;

  const RunResult unknown = RunTern({"ls", "--bogus"});
  EXPECT_EQ(unknown.exit_code, 64) << Describe(unknown);
  EXPECT_NE(unknown.err.find("--bogus"), std::string::npos) << unknown.err;

  const RunResult fault = RunTern({"diag", "--inject", "meteor"});
  EXPECT_EQ(fault.exit_code, 64) << Describe(fault);
  EXPECT_NE(fault.err.find("dma_abort, hbm_ue or hang"), std::string::npos) << fault.err;

  const RunResult port = RunTern({"monitor", "--listen", "127.0.0.1:70000"});
  EXPECT_EQ(port.exit_code, 64) << Describe(port);
  EXPECT_NE(port.err.find("PORT 0-65535"), std::string::npos) << port.err;
}

// --- dump ---------------------------------------------------------------------

// Writes a one-function executable (z = x + y, f32[4, 8]) with the public
// builder API and returns its path.
std::string WriteAddExecutable(const std::string& name) {
  tern_builder_t builder = nullptr;
  EXPECT_EQ(tern_builder_create(nullptr, &builder), TERN_OK) << tern_last_error_message();
  const int64_t shape[2] = {4, 8};
  EXPECT_EQ(tern_builder_begin_function(builder, "add_xy", nullptr), TERN_OK)
      << tern_last_error_message();
  EXPECT_EQ(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, shape, nullptr), TERN_OK);
  EXPECT_EQ(tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, shape, nullptr), TERN_OK);
  EXPECT_EQ(tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, shape, nullptr), TERN_OK);
  const tern_operand_t operands[3] = {
      {TERN_SEGMENT_OUTPUT, 0, 0, TERN_DTYPE_F32, 2, shape, nullptr},
      {TERN_SEGMENT_INPUT, 0, 0, TERN_DTYPE_F32, 2, shape, nullptr},
      {TERN_SEGMENT_INPUT, 1, 0, TERN_DTYPE_F32, 2, shape, nullptr},
  };
  const int64_t ints[1] = {TERN_BINARY_ADD};
  tern_instruction_t add = {};
  add.struct_size = sizeof(add);
  add.opcode = TERN_OP_BINARY;
  add.operand_count = 3;
  add.operands = operands;
  add.int_count = 1;
  add.ints = ints;
  add.debug_op = "model.residual_add";
  EXPECT_EQ(tern_builder_add_instruction(builder, &add), TERN_OK) << tern_last_error_message();
  EXPECT_EQ(tern_builder_end_function(builder), TERN_OK) << tern_last_error_message();
  const std::string path = ::testing::TempDir() + name;
  EXPECT_EQ(tern_builder_write_file(builder, path.c_str()), TERN_OK) << tern_last_error_message();
  EXPECT_EQ(tern_builder_destroy(builder), TERN_OK);
  return path;
}

TEST(TernDumpTest, DisassemblesAnExecutable) {
  const std::string path = WriteAddExecutable("tools_dump_add.tern");
  const RunResult r = RunTern({"dump", path});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  for (const char* expected :
       {"function 0 'add_xy'", "input  0 'x': f32[4, 8]", "output 0 'z': f32[4, 8]", "binary",
        "fn=add", "# model.residual_add", "loader verdict: accepted"}) {
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
  }

  const RunResult summary = RunTern({"dump", "--summary", path});
  ASSERT_EQ(summary.exit_code, 0) << Describe(summary);
  EXPECT_NE(summary.out.find("input  1 'y'"), std::string::npos) << summary.out;
  EXPECT_EQ(summary.out.find("fn=add"), std::string::npos) << summary.out;
  std::remove(path.c_str());
}

TEST(TernDumpTest, DamagedFileIsShownAndRejected) {
  const std::string path = WriteAddExecutable("tools_dump_damaged.tern");
  {
    // Flip one byte near the end (inside a section): its checksum no longer
    // matches, which the dump shows and the loader refuses.
    FILE* file = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(std::fseek(file, -8, SEEK_END), 0);
    const int byte = std::fgetc(file);
    ASSERT_EQ(std::fseek(file, -8, SEEK_END), 0);
    std::fputc(byte ^ 0x5a, file);
    std::fclose(file);
  }
  const RunResult r = RunTern({"dump", path});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_NE(r.out.find("MISMATCH"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("would not load"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
  std::remove(path.c_str());
}

TEST(TernDumpTest, UnreadableFileIsAnError) {
  const RunResult missing = RunTern({"dump", "/nonexistent/model.tern"});
  EXPECT_EQ(missing.exit_code, 3) << Describe(missing);
  EXPECT_NE(missing.err.find("cannot open '/nonexistent/model.tern'"), std::string::npos)
      << missing.err;

  const RunResult directory = RunTern({"dump", "/tmp"});
  EXPECT_EQ(directory.exit_code, 3) << Describe(directory);
  EXPECT_NE(directory.err.find("directory"), std::string::npos) << directory.err;

  const std::string garbage = ::testing::TempDir() + "tools_dump_garbage.tern";
  FILE* file = std::fopen(garbage.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  std::fputs("this is not an executable", file);
  std::fclose(file);
  const RunResult r = RunTern({"dump", garbage});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_NE(r.err.find("would not load"), std::string::npos) << r.err;
  std::remove(garbage.c_str());
}

// --- ls -----------------------------------------------------------------------

TEST(TernLsTest, JsonDescribesAnIdleNode) {
  const RunResult r = RunTern({"ls", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const Json root = Json::parse(r.out);
  EXPECT_EQ(root.at("tern_version"), "0.1.0");
  EXPECT_EQ(root.at("driver"), "sim");
  ASSERT_EQ(root.at("devices").size(), 2u);
  for (int d = 0; d < 2; ++d) {
    const Json& device = root.at("devices")[d];
    EXPECT_EQ(device.at("device"), d);
    EXPECT_EQ(device.at("name"), "tern-sim trn2");
    EXPECT_EQ(device.at("driver"), "sim");
    EXPECT_EQ(device.at("tern_version"), "0.1.0");
    EXPECT_EQ(device.at("core_count"), 2);
    EXPECT_EQ(device.at("memory_total_bytes"), 256 * kMiB);
    EXPECT_EQ(device.at("memory_used_bytes"), 0u);
    EXPECT_TRUE(device.at("numa_node").is_number_integer());
    EXPECT_TRUE(device.at("cpu_affinity").is_string());
    EXPECT_EQ(device.at("memory_used_by_category").at("tensors"), 0u);
    ASSERT_EQ(device.at("cores").size(), 2u);
    EXPECT_EQ(device.at("cores")[1].at("owner_pid"), 0);
    EXPECT_EQ(device.at("ecc").at("uncorrected"), 0u);
    EXPECT_TRUE(device.at("processes").empty());
  }
}

TEST(TernLsTest, TableListsDevicesAndSaysWhenNoProcessRuns) {
  const RunResult r = RunTern({"ls"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_NE(r.out.find("tern 0.1.0, driver sim, 2 devices"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("HBM TOTAL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("256.0 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0:free 1:free"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No process is using a device."), std::string::npos) << r.out;
}

// An administrator does not know the workload's TERN_SIM_TOPOLOGY: without
// one, the tool adopts the topology of the node it finds.
TEST(TernLsTest, WithoutATopologyAdoptsTheNodes) {
  Workload workload({"--device", "0", "--cores", "1"});
  ASSERT_TRUE(workload.ready());
  const RunResult r = RunTern({"ls", "--json"}, {"TERN_SIM_TOPOLOGY="});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const Json root = Json::parse(r.out);
  ASSERT_EQ(root.at("devices").size(), 2u);
  for (const Json& device : root.at("devices")) {
    EXPECT_EQ(device.at("memory_total_bytes"), 256 * kMiB) << device.dump();
  }
  EXPECT_EQ(root.at("devices")[0].at("cores")[1].at("owner_pid"), workload.pid());

  // An explicit topology that differs is still refused, naming the workload.
  const RunResult other = RunTern({"ls", "--json"}, {"TERN_SIM_TOPOLOGY=1x1x64M"});
  EXPECT_EQ(other.exit_code, 3) << Describe(other);
  EXPECT_NE(other.err.find("TERN_SIM_TOPOLOGY"), std::string::npos) << other.err;
  EXPECT_NE(other.err.find(std::to_string(workload.pid())), std::string::npos) << other.err;
}

TEST(TernLsTest, SeesAWorkloadInAnotherProcess) {
  Workload workload({"--device", "1", "--cores", "0"});
  ASSERT_TRUE(workload.ready());
  const RunResult r = RunTern({"ls", "--json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const Json root = Json::parse(r.out);
  const Json& idle = root.at("devices")[0];
  const Json& busy = root.at("devices")[1];
  EXPECT_TRUE(idle.at("processes").empty());
  EXPECT_EQ(busy.at("memory_used_bytes"), kWorkloadBytes);
  EXPECT_EQ(busy.at("memory_used_by_category").at("tensors"), kWorkloadBytes);
  EXPECT_EQ(busy.at("cores")[0].at("owner_pid"), workload.pid());
  EXPECT_EQ(busy.at("cores")[0].at("owner_command"), "tern_workload");
  EXPECT_EQ(busy.at("cores")[1].at("owner_pid"), 0);
  const Json* process = FindProcess(busy, workload.pid());
  ASSERT_NE(process, nullptr) << busy.dump(2);
  EXPECT_EQ(process->at("command"), "tern_workload");
  EXPECT_EQ(process->at("cores"), Json::array({0}));
  EXPECT_EQ(process->at("memory_bytes"), kWorkloadBytes);
  EXPECT_EQ(process->at("memory_by_category").at("tensors"), kWorkloadBytes);

  const RunResult table = RunTern({"ls"});
  ASSERT_EQ(table.exit_code, 0) << Describe(table);
  EXPECT_NE(table.out.find("0:" + std::to_string(workload.pid()) + " 1:free"), std::string::npos)
      << table.out;
  EXPECT_NE(table.out.find("tensors 8.0 MiB"), std::string::npos) << table.out;
}

// --- tracing ------------------------------------------------------------------

// TERN_TRACE: the workload's trace is valid JSON (Chrome trace format, as
// Perfetto loads it) with a span for each kind of queue activity.
TEST(TernTraceTest, WorkloadTraceHasEveryKindOfActivity) {
  const std::string path =
      ::testing::TempDir() + "tools_trace_" + std::to_string(getpid()) + ".json";
  std::remove(path.c_str());
  {
    Workload workload({"--device", "0", "--cores", "0"}, {"TERN_TRACE=" + path});
    ASSERT_TRUE(workload.ready());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }  // the workload exits: the trace is written
  std::ifstream file(path);
  ASSERT_TRUE(file.good()) << "no trace at " << path;
  const Json trace = Json::parse(file, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(trace.is_discarded()) << "the trace is not valid JSON";
  const Json& events = trace.is_object() ? trace.at("traceEvents") : trace;
  ASSERT_TRUE(events.is_array());
  std::set<std::string> names;
  for (const Json& event : events) {
    if (!event.contains("name")) continue;
    names.insert(event.at("name").get<std::string>());
    if (event.value("ph", "") == "X") {
      EXPECT_TRUE(event.contains("ts") && event.contains("dur")) << event.dump();
    }
  }
  std::string all;
  for (const std::string& name : names) all += name + "; ";
  auto has = [&](const std::string& part) {
    for (const std::string& name : names) {
      if (name.find(part) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("fill")) << all;
  EXPECT_TRUE(has("execute add")) << all;
  EXPECT_TRUE(has("workload.add")) << all;  // the instruction, by its graph op
  EXPECT_TRUE(has("event wait")) << all;
  EXPECT_TRUE(has("all_reduce")) << all;
  std::remove(path.c_str());
}

// --- monitor ------------------------------------------------------------------

TEST(TernMonitorTest, JsonLinesShowAWorkloadsCommandsGrowing) {
  Workload workload({"--device", "1", "--cores", "0"});
  ASSERT_TRUE(workload.ready());
  const RunResult r = RunTern({"monitor", "-n", "3", "-i", "0.2"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::istringstream lines(r.out);
  std::string line;
  std::vector<Json> records;
  while (std::getline(lines, line)) records.push_back(Json::parse(line));
  ASSERT_EQ(records.size(), 3u) << r.out;
  uint64_t previous_commands = 0;
  uint64_t previous_executions = 0;
  double previous_time = 0;
  for (const Json& record : records) {
    EXPECT_TRUE(record.at("timestamp").is_string());
    EXPECT_GT(record.at("unix_time").get<double>(), previous_time);
    previous_time = record.at("unix_time").get<double>();
    // At least the interval; more when the machine is loaded.
    EXPECT_GE(record.at("interval_s").get<double>(), 0.19);
    EXPECT_LT(record.at("interval_s").get<double>(), 10.0);
    ASSERT_EQ(record.at("devices").size(), 2u);
    const Json& device = record.at("devices")[1];
    const Json& core = device.at("cores")[0];
    EXPECT_EQ(core.at("owner_pid"), workload.pid());
    const uint64_t commands = core.at("commands").get<uint64_t>();
    EXPECT_GT(commands, previous_commands) << "commands must grow between samples";
    previous_commands = commands;
    const uint64_t executions = core.at("executions").get<uint64_t>();
    EXPECT_GT(executions, previous_executions) << "executions must grow between samples";
    previous_executions = executions;
    EXPECT_GT(core.at("executions_per_s").get<double>(), 0.0);
    EXPECT_GT(core.at("commands_per_s").get<double>(), 0.0);
    EXPECT_GT(core.at("busy_ratio").get<double>(), 0.0);
    EXPECT_LE(core.at("busy_ratio").get<double>(), 1.0);
    EXPECT_EQ(core.at("errors").at("dma_abort"), 0u);
    // Run-time percentiles of the window's commands: ordered, within the
    // histogram's range; null on a core that ran nothing.
    const Json& latency = core.at("latency_us");
    EXPECT_GT(latency.at("commands").get<uint64_t>(), 0u) << latency.dump();
    const double p50 = latency.at("p50").get<double>();
    EXPECT_GE(p50, 1.0) << latency.dump();
    EXPECT_LE(p50, latency.at("p90").get<double>()) << latency.dump();
    EXPECT_LE(latency.at("p90").get<double>(), latency.at("p99").get<double>()) << latency.dump();
    EXPECT_LT(latency.at("p99").get<double>(), 5e6) << latency.dump();
    EXPECT_EQ(device.at("cores")[1].at("latency_us").at("commands"), 0u);
    EXPECT_TRUE(device.at("cores")[1].at("latency_us").at("p50").is_null());
    EXPECT_EQ(device.at("cores")[1].at("commands"), 0u);
    EXPECT_EQ(device.at("memory").at("used_bytes"), kWorkloadBytes);
    EXPECT_EQ(device.at("memory").at("by_category").at("tensors"), kWorkloadBytes);
    EXPECT_EQ(device.at("ecc").at("uncorrected"), 0u);
    const Json* process = FindProcess(device, workload.pid());
    ASSERT_NE(process, nullptr) << device.dump(2);
    EXPECT_EQ(process->at("memory_by_category").at("tensors"), kWorkloadBytes);
    EXPECT_TRUE(record.at("devices")[0].at("processes").empty());
  }
}

TEST(TernMonitorTest, PrometheusOnStdoutParses) {
  Workload workload({"--device", "1", "--cores", "0"});
  ASSERT_TRUE(workload.ready());
  const RunResult r = RunTern({"monitor", "--prometheus", "-i", "0.2"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::map<std::string, double> samples;
  ASSERT_EQ(ValidateExposition(r.out, &samples), "") << r.out;
  auto value = [&](const std::string& key) {
    auto it = samples.find(key);
    EXPECT_NE(it, samples.end()) << "missing " << key;
    return it == samples.end() ? NAN : it->second;
  };
  EXPECT_GT(value(R"(tern_core_busy_ratio{device="1",core="0"})"), 0.0);
  EXPECT_EQ(value(R"(tern_core_busy_ratio{device="0",core="1"})"), 0.0);
  EXPECT_GT(value(R"(tern_core_commands_total{device="1",core="0"})"), 0.0);
  // The command-duration histogram: cumulative buckets ending at +Inf = count.
  const double count = value(R"(tern_core_command_duration_seconds_count{device="1",core="0"})");
  EXPECT_GT(count, 0.0);
  EXPECT_EQ(value(R"(tern_core_command_duration_seconds_bucket{device="1",core="0",le="+Inf"})"),
            count);
  double previous = 0;
  for (int b = 0; b < TERN_TELEMETRY_LATENCY_BUCKETS - 1; ++b) {
    char le[32];
    *std::to_chars(le, le + sizeof(le) - 1, std::ldexp(1.0, b) / 1e6).ptr = '\0';
    const double cumulative =
        value("tern_core_command_duration_seconds_bucket{device=\"1\",core=\"0\",le=\"" +
              std::string(le) + "\"}");
    EXPECT_GE(cumulative, previous) << "le=" << le;
    previous = cumulative;
  }
  EXPECT_LE(previous, count);
  EXPECT_GT(value(R"(tern_core_command_duration_seconds_sum{device="1",core="0"})"), 0.0);
  EXPECT_EQ(value(R"(tern_core_command_duration_seconds_count{device="0",core="1"})"), 0.0);
  EXPECT_EQ(value(R"(tern_hbm_used_bytes{device="1",category="tensors"})"), kWorkloadBytes);
  EXPECT_EQ(value(R"(tern_hbm_used_bytes{device="0",category="tensors"})"), 0.0);
  EXPECT_EQ(value(R"(tern_hbm_capacity_bytes{device="0"})"), 256.0 * kMiB);
  EXPECT_EQ(value(R"(tern_core_errors_total{device="1",core="0",class="dma_abort"})"), 0.0);
  EXPECT_EQ(value(R"(tern_ecc_errors_total{device="1",kind="uncorrected"})"), 0.0);
  EXPECT_EQ(
      value("tern_process_hbm_used_bytes{device=\"1\",pid=\"" + std::to_string(workload.pid()) +
            "\",command=\"tern_workload\",category=\"tensors\"}"),
      kWorkloadBytes);
  EXPECT_EQ(value("tern_core_owner_pid{device=\"1\",core=\"0\",command=\"tern_workload\"}"),
            workload.pid());
}

TEST(TernMonitorTest, PrometheusCountsInjectedFaults) {
  // diag leaves a DMA abort and an uncorrected ECC error in the counters.
  ASSERT_EQ(RunTern({"diag", "--inject", "dma_abort", "--device", "0"}).exit_code, 2);
  ASSERT_EQ(RunTern({"diag", "--inject", "hbm_ue", "--device", "1"}).exit_code, 2);
  const RunResult r = RunTern({"monitor", "--prometheus", "-i", "0.05"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  std::map<std::string, double> samples;
  ASSERT_EQ(ValidateExposition(r.out, &samples), "") << r.out;
  EXPECT_EQ(samples[R"(tern_core_errors_total{device="0",core="0",class="dma_abort"})"], 1.0);
  EXPECT_EQ(samples[R"(tern_core_errors_total{device="1",core="0",class="hbm_uncorrectable"})"],
            1.0);
  EXPECT_EQ(samples[R"(tern_ecc_errors_total{device="1",kind="uncorrected"})"], 1.0);
  EXPECT_EQ(samples[R"(tern_ecc_errors_total{device="0",kind="uncorrected"})"], 0.0);
}

class TernMonitorHttpTest : public ::testing::TestWithParam<int> {};

TEST_P(TernMonitorHttpTest, ServesMetricsAndStopsOnSignal) {
  Workload workload({"--device", "0", "--cores", "1"});
  ASSERT_TRUE(workload.ready());
  auto server = Process::Start({TERN_TOOL_PATH, "monitor", "--listen", "127.0.0.1:0"});
  ASSERT_NE(server, nullptr);
  std::string line;
  ASSERT_TRUE(server->ReadLine(1, &line, kStartTimeoutMs)) << server->stderr_text();
  const std::string prefix = "serving Prometheus metrics on http://127.0.0.1:";
  const size_t at = line.find(prefix);
  ASSERT_NE(at, std::string::npos) << line;
  ASSERT_TRUE(line.ends_with("/metrics")) << line;
  const int port = std::atoi(line.c_str() + at + prefix.size());
  ASSERT_GT(port, 0) << line;

  for (int scrape = 0; scrape < 2; ++scrape) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string response = HttpExchange(port, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    ASSERT_EQ(response.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << response;
    const size_t body_at = response.find("\r\n\r\n");
    ASSERT_NE(body_at, std::string::npos);
    const std::string head = response.substr(0, body_at);
    const std::string body = response.substr(body_at + 4);
    EXPECT_NE(head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << head;
    EXPECT_NE(head.find("Content-Length: " + std::to_string(body.size())), std::string::npos)
        << head;
    std::map<std::string, double> samples;
    ASSERT_EQ(ValidateExposition(body, &samples), "") << body;
    EXPECT_GT(samples[R"(tern_core_busy_ratio{device="0",core="1"})"], 0.0);
    EXPECT_EQ(samples[R"(tern_hbm_used_bytes{device="0",category="tensors"})"], kWorkloadBytes);
  }
  EXPECT_EQ(HttpExchange(port, "GET /nothing HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 404 Not Found", 0),
            0u);
  EXPECT_EQ(HttpExchange(port, "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);

  server->Signal(GetParam());
  EXPECT_EQ(server->Wait(10000), 0) << "the server must exit cleanly on signal " << GetParam();
  // The port is closed: a new connection is refused.
  EXPECT_EQ(HttpExchange(port, "GET /metrics HTTP/1.0\r\n\r\n").rfind("connect failed", 0), 0u);
}

INSTANTIATE_TEST_SUITE_P(Signals, TernMonitorHttpTest, ::testing::Values(SIGINT, SIGTERM),
                         [](const auto& info) {
                           return info.param == SIGINT ? "SIGINT" : "SIGTERM";
                         });

// --- diag ---------------------------------------------------------------------

const Json* FindCheck(const Json& report, const std::string& name, int device) {
  for (const Json& check : report.at("checks")) {
    if (check.at("check") != name) continue;
    if (device < 0 ? check.at("device").is_null() : check.at("device") == device) return &check;
  }
  return nullptr;
}

// Copy bandwidth against memcpy is a timing: on a loaded 2-CPU machine (or
// under a sanitizer) the simulated DMA engine's thread can lose the CPU for
// most of a copy. The tests that expect a healthy node therefore turn the
// ratio check off (--min-bandwidth-ratio 0), and BandwidthBelowTheRatioIsDegraded
// checks the threshold logic deterministically.
TEST(TernDiagTest, HealthyOnACleanNode) {
  const RunResult r = RunTern({"diag", "--json", "--min-bandwidth-ratio", "0"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  const Json report = Json::parse(r.out);
  EXPECT_EQ(report.at("status"), "healthy");
  EXPECT_EQ(report.at("exit_code"), 0);
  for (int d = 0; d < 2; ++d) {
    for (const char* name :
         {"hbm_pattern", "copy_bandwidth", "compute_selftest", "ecc", "error_counters"}) {
      const Json* check = FindCheck(report, name, d);
      ASSERT_NE(check, nullptr) << name << " " << d;
      EXPECT_EQ(check->at("result"), "pass") << check->dump();
    }
    const Json& hbm = *FindCheck(report, "hbm_pattern", d);
    EXPECT_EQ(hbm.at("metrics").at("mismatched_words"), 0u);
    EXPECT_EQ(hbm.at("metrics").at("queue_patterns"), 5);
    const Json& bandwidth = *FindCheck(report, "copy_bandwidth", d);
    EXPECT_GT(bandwidth.at("metrics").at("h2d_gbps").get<double>(), 0.0);
    EXPECT_GT(bandwidth.at("metrics").at("d2h_gbps").get<double>(), 0.0);
    EXPECT_GT(bandwidth.at("metrics").at("memcpy_gbps").get<double>(), 0.0);
    EXPECT_GT(bandwidth.at("metrics").at("ratio_to_memcpy").get<double>(), 0.0);
    const Json& compute = *FindCheck(report, "compute_selftest", d);
    EXPECT_EQ(compute.at("metrics").at("mismatched_elements"), 0u) << compute.dump();
    EXPECT_EQ(compute.at("metrics").at("runs"), 3) << compute.dump();
    EXPECT_NE(compute.at("detail").get<std::string>().find("exact in 3 runs"), std::string::npos)
        << compute.dump();
  }
  // Every core of the node is free: one rank each.
  const Json* collective = FindCheck(report, "collective_loopback", -1);
  ASSERT_NE(collective, nullptr);
  EXPECT_EQ(collective->at("result"), "pass") << collective->dump();
  EXPECT_EQ(collective->at("metrics").at("ranks"), 4) << collective->dump();
  EXPECT_EQ(collective->at("metrics").at("mismatched_elements"), 0u) << collective->dump();

  // Diag leaves nothing behind: no memory, no core, no process entry.
  const Json ls = Json::parse(RunTern({"ls", "--json"}).out);
  for (const Json& device : ls.at("devices")) {
    EXPECT_EQ(device.at("memory_used_bytes"), 0u);
    EXPECT_TRUE(device.at("processes").empty());
  }
}

TEST(TernDiagTest, BandwidthBelowTheRatioIsDegraded) {
  // No copy reaches a million times memcpy's bandwidth.
  const RunResult r = RunTern({"diag", "--json", "--device", "1", "--min-bandwidth-ratio", "1e6"});
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  const Json report = Json::parse(r.out);
  EXPECT_EQ(report.at("status"), "degraded");
  const Json& bandwidth = *FindCheck(report, "copy_bandwidth", 1);
  EXPECT_EQ(bandwidth.at("result"), "degraded");
  EXPECT_NE(bandwidth.at("detail").get<std::string>().find("below 1e+06x of memcpy"),
            std::string::npos)
      << bandwidth.dump();
  EXPECT_EQ(FindCheck(report, "copy_bandwidth", 0), nullptr) << "--device 1 checks device 1 only";
  EXPECT_EQ(FindCheck(report, "hbm_pattern", 1)->at("result"), "pass");
}

TEST(TernDiagTest, TableEndsWithTheVerdict) {
  const RunResult r = RunTern({"diag", "--min-bandwidth-ratio", "0"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out.rfind("CHECK", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("compute_selftest     0       pass"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("collective_loopback  -       pass"), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.ends_with("Result: healthy (exit 0)\n")) << r.out;
}

struct InjectCase {
  const char* fault;
  const char* status;       // what the failing check reports
  const char* error_class;  // counted on core 0 of device 0
  bool ecc_failed;
};

void PrintTo(const InjectCase& c, std::ostream* os) { *os << c.fault; }

class TernDiagInjectTest : public ::testing::TestWithParam<InjectCase> {};

TEST_P(TernDiagInjectTest, DetectsTheFaultAndExits2) {
  const InjectCase& c = GetParam();
  const RunResult r = RunTern({"diag", "--json", "--inject", c.fault}, {"TERN_EXEC_TIMEOUT=1"});
  ASSERT_EQ(r.exit_code, 2) << Describe(r);
  const Json report = Json::parse(r.out);
  EXPECT_EQ(report.at("status"), "failed");
  const Json& hbm = *FindCheck(report, "hbm_pattern", 0);
  EXPECT_EQ(hbm.at("result"), "failed");
  EXPECT_NE(hbm.at("detail").get<std::string>().find(c.status), std::string::npos) << hbm.dump();
  // The fault fires once, on device 0: device 1 stays healthy.
  EXPECT_EQ(FindCheck(report, "hbm_pattern", 1)->at("result"), "pass");
  const Json& errors = *FindCheck(report, "error_counters", 0);
  EXPECT_EQ(errors.at("result"), "degraded");
  EXPECT_EQ(errors.at("metrics").at(c.error_class), 1u) << errors.dump();
  EXPECT_EQ(FindCheck(report, "ecc", 0)->at("result"), c.ecc_failed ? "failed" : "pass");
  EXPECT_EQ(FindCheck(report, "ecc", 1)->at("result"), "pass");
}

INSTANTIATE_TEST_SUITE_P(
    Faults, TernDiagInjectTest,
    ::testing::Values(InjectCase{"dma_abort", "TERN_ERROR_DMA_ABORT", "dma_abort", false},
                      InjectCase{"hbm_ue", "TERN_ERROR_HBM_UNCORRECTABLE", "hbm_uncorrectable",
                                 true},
                      InjectCase{"hang", "TERN_ERROR_EXEC_TIMEOUT", "exec_timeout", false}),
    [](const auto& info) { return std::string(info.param.fault); });

TEST(TernDiagTest, AllCoresBusyIsDegradedAndSaysSo) {
  Workload workload({"--all"});
  ASSERT_TRUE(workload.ready());
  const RunResult r = RunTern({"diag", "--json"});
  ASSERT_EQ(r.exit_code, 1) << Describe(r);
  const Json report = Json::parse(r.out);
  EXPECT_EQ(report.at("status"), "degraded");
  for (int d = 0; d < 2; ++d) {
    for (const char* name : {"hbm_pattern", "copy_bandwidth", "compute_selftest"}) {
      const Json& check = *FindCheck(report, name, d);
      EXPECT_EQ(check.at("result"), "skipped") << check.dump();
      EXPECT_NE(check.at("detail").get<std::string>().find("skipped (all cores busy)"),
                std::string::npos)
          << check.dump();
    }
    // The host-written patterns still ran.
    EXPECT_EQ(FindCheck(report, "hbm_pattern", d)->at("metrics").at("host_patterns"), 2);
    EXPECT_EQ(FindCheck(report, "ecc", d)->at("result"), "pass");
  }
  EXPECT_EQ(FindCheck(report, "collective_loopback", -1)->at("result"), "skipped");
  const RunResult with_inject = RunTern({"diag", "--inject", "dma_abort"});
  EXPECT_EQ(with_inject.exit_code, 3) << Describe(with_inject);
  EXPECT_NE(with_inject.err.find("every core is busy"), std::string::npos) << with_inject.err;
}

// --- top ----------------------------------------------------------------------

TEST(TernTopTest, OnceRendersAFrame) {
  Workload workload({"--device", "1", "--cores", "1"});
  ASSERT_TRUE(workload.ready());
  const RunResult r = RunTern({"top", "--once", "-d", "0.2"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_EQ(r.out.rfind("tern top - driver sim, tern 0.1.0, 2 devices", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("DEVICE 0  tern-sim trn2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DEVICE 1  tern-sim trn2  NUMA"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("HBM 8.0 MiB / 256.0 MiB"), std::string::npos) << r.out;
  // Core 1 of device 1 is owned by the workload and busy.
  const std::string owner = "     1  " + std::to_string(workload.pid()) + " tern_workload  [";
  const size_t row = r.out.find(owner);
  ASSERT_NE(row, std::string::npos) << r.out;
  const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
  EXPECT_NE(line.find("%"), std::string::npos) << line;
  EXPECT_GT(r.out.find(owner), r.out.find("DEVICE 1")) << "the row belongs to device 1";
  EXPECT_NE(r.out.find("tensors 8.0 MiB"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\x1b"), std::string::npos) << "no terminal codes without a terminal";
}

TEST(TernTopTest, LiveViewNeedsATerminal) {
  const RunResult r = RunTern({"top"});
  EXPECT_EQ(r.exit_code, 3) << Describe(r);
  EXPECT_NE(r.err.find("--once"), std::string::npos) << r.err;
}

// Runs `tern top` in a pseudo-terminal, waits for a frame, sends `keys` and
// expects a clean exit that restores the terminal.
void DriveTopInPty(const std::string& keys) {
  Workload workload({"--device", "0", "--cores", "0"});
  ASSERT_TRUE(workload.ready());
  std::vector<std::string> env = MakeEnvironment({"TERM=xterm", "LINES=", "COLUMNS="});
  std::vector<std::string> argv = {TERN_TOOL_PATH, "top", "-d", "0.2"};
  std::vector<char*> argv_ptrs = Pointers(argv);
  std::vector<char*> env_ptrs = Pointers(env);
  winsize size = {};
  size.ws_row = 40;
  size.ws_col = 120;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    execve(argv_ptrs[0], argv_ptrs.data(), env_ptrs.data());
    _exit(127);
  }
  std::string screen;
  auto read_some = [&](int timeout_ms) {
    pollfd pfd = {master, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return false;
    char chunk[4096];
    const ssize_t n = read(master, chunk, sizeof(chunk));
    if (n <= 0) return false;  // EIO once the child closed the terminal
    screen.append(chunk, static_cast<size_t>(n));
    return true;
  };
  // Wait for a frame with rates (after the first refresh) of the workload's core.
  const std::string owner = std::to_string(workload.pid()) + " tern_workload";
  int64_t deadline = NowMs() + kStartTimeoutMs;
  while (NowMs() < deadline &&
         (screen.find("tern top") == std::string::npos || screen.find(owner) == std::string::npos ||
          screen.find("%") == std::string::npos)) {
    read_some(200);
  }
  EXPECT_NE(screen.find("tern top - driver sim"), std::string::npos) << screen;
  EXPECT_NE(screen.find(owner), std::string::npos) << screen;
  const size_t before_keys = screen.size();
  ASSERT_EQ(write(master, keys.data(), keys.size()), static_cast<ssize_t>(keys.size()));

  int status = 0;
  pid_t waited = 0;
  deadline = NowMs() + 10000;
  while (NowMs() < deadline && (waited = waitpid(pid, &status, WNOHANG)) == 0) read_some(50);
  while (read_some(100)) {
  }
  close(master);
  if (waited != pid) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "tern top did not quit within 10 s after the keys";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // endwin() left the alternate screen (xterm's rmcup) after the keys.
  EXPECT_NE(screen.find("\x1b[?1049l", before_keys), std::string::npos)
      << "terminal not restored; output after the keys: " << screen.substr(before_keys);
}

TEST(TernTopTest, QuitsOnQInAPseudoTerminal) { DriveTopInPty("q"); }

TEST(TernTopTest, QuitsOnCtrlCInAPseudoTerminal) { DriveTopInPty("\x03"); }

}  // namespace
