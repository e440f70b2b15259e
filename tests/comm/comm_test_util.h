// Shared fixture pieces of the collectives tests: a runtime with its cores
// open, a queue per rank, and running one function per rank on threads.
#ifndef TERN_TESTS_COMM_COMM_TEST_UTIL_H_
#define TERN_TESTS_COMM_COMM_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/types.h>
#include <tern/tern.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_matrix.h"

namespace tern_test {

#define COMM_ASSERT_OK(expr)                                                      \
  do {                                                                            \
    const tern_status_t comm_status_ = (expr);                                    \
    ASSERT_EQ(TERN_OK, comm_status_) << #expr << ": " << LastError(comm_status_); \
  } while (0)
#define COMM_EXPECT_OK(expr)                                                      \
  do {                                                                            \
    const tern_status_t comm_status_ = (expr);                                    \
    EXPECT_EQ(TERN_OK, comm_status_) << #expr << ": " << LastError(comm_status_); \
  } while (0)

// tern initialized with the test node's 2 devices x 2 cores open; rank i
// runs on core i % 2 of device (i / 2) % 2, with a queue of its own.
class CommFixture : public ::testing::Test {
 protected:
  static constexpr uint32_t kMaxRanks = 4;
  void SetUp() override;
  void TearDown() override;

  // Creates `n` ranks with tern_comm_init_all into comms_.
  void InitAll(uint32_t n, const tern_comm_config_t* config = nullptr);
  void DestroyAll();
  // Runs fn(rank) on one thread per rank and joins them.
  static void OnRanks(uint32_t n, const std::function<void(uint32_t)>& fn);

  tern_device_t devices_[2] = {};
  tern_core_t cores_[kMaxRanks] = {};
  tern_queue_t queues_[kMaxRanks] = {};
  std::vector<tern_comm_t> comms_;
};

// Allocates `bytes` on `device`.
tern_buffer_t Alloc(tern_device_t device, uint64_t bytes);

using Env = std::vector<std::pair<std::string, std::string>>;
// As a value in Env: remove the variable.
inline constexpr char kUnset[] = "<unset>";

// A tern_comm_child (or any program) with stdin a pipe and stdout + stderr
// captured together.
class ChildProcess {
 public:
  // Runs `prefix` + [TERN_COMM_CHILD_PATH] + `args` (prefix: e.g. "ip netns
  // exec ns"); `env` adds or replaces environment variables.
  static std::unique_ptr<ChildProcess> Spawn(const std::vector<std::string>& args, const Env& env,
                                             const std::vector<std::string>& prefix = {});
  ~ChildProcess();
  pid_t pid() const { return pid_; }
  // Reads until a line contains `needle`; the line goes to `*line`.
  bool WaitForLine(const std::string& needle, int timeout_ms, std::string* line = nullptr);
  // Reads until end of output or the timeout.
  void ReadToEnd(int timeout_ms);
  // Waits for exit: the exit code, 128 + signal, or -1 (then killed).
  int Wait(int timeout_ms);
  void Signal(int sig);
  void CloseStdin();
  const std::string& output() const { return output_; }

 private:
  ChildProcess(pid_t pid, int in, int out) : pid_(pid), stdin_(in), stdout_(out) {}
  bool Fill(int timeout_ms);
  pid_t pid_;
  int stdin_;
  int stdout_;
  bool reaped_ = false;
  int status_ = 0;
  std::string output_;
  size_t scanned_ = 0;
};

// A free TCP port on 127.0.0.1 (bound and released).
uint16_t FreePort();
// The unique id as hex (for tern_comm_child --id).
std::string IdHex(const tern_comm_unique_id_t& id);

}  // namespace tern_test

#endif  // TERN_TESTS_COMM_COMM_TEST_UTIL_H_
