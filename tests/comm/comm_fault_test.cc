// Collectives under faults: a rank SIGKILLed in the middle of all-reduces,
// a rank that never enqueues (timeout, flight recorder), mismatched calls,
// bootstraps that never complete, abort, a rank whose queue skipped the
// operation, a rank that left. Every case must end in a clear error on every
// surviving rank, never in a hang.
#include <tern/tern.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "comm_test_util.h"

namespace tern_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutMs = 60000;

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Starts `size` env-joined children running `args`.
std::vector<std::unique_ptr<ChildProcess>> StartRanks(
    uint32_t size, const Env& extra, const std::vector<std::vector<std::string>>& args) {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (uint32_t r = 0; r < size; ++r) {
    Env env = extra;
    env.push_back({"TERN_COMM_ID", address});
    env.push_back({"TERN_COMM_RANK", std::to_string(r)});
    env.push_back({"TERN_COMM_WORLD_SIZE", std::to_string(size)});
    children.push_back(ChildProcess::Spawn(args[r < args.size() ? r : args.size() - 1], env));
    EXPECT_NE(nullptr, children.back());
  }
  return children;
}

// SIGKILL one rank while every rank loops on all-reduces: the others fail
// with PEER_LOST naming the dead rank's rank, host and pid, well within the
// operation timeout.
void KillMidAllReduce(const Env& transport, uint32_t size, uint32_t victim) {
  Env env = transport;
  env.push_back({"TERN_COMM_TIMEOUT", "20"});
  auto children = StartRanks(size, env, {{"loop", "65536"}});
  for (auto& child : children) {
    ASSERT_TRUE(child->WaitForLine("iteration 3", kTimeoutMs)) << child->output();
  }
  const pid_t victim_pid = children[victim]->pid();
  const auto killed_at = Clock::now();
  children[victim]->Signal(SIGKILL);
  EXPECT_EQ(128 + SIGKILL, children[victim]->Wait(kTimeoutMs));
  const std::string expected_peer = "rank " + std::to_string(victim) + " (host " + HostName() +
                                    ", pid " + std::to_string(victim_pid) + ")";
  for (uint32_t r = 0; r < size; ++r) {
    if (r == victim) continue;
    std::string line;
    ASSERT_TRUE(children[r]->WaitForLine("failed ", kTimeoutMs, &line)) << children[r]->output();
    const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
    EXPECT_LT(seconds, 20.0) << "rank " << r << " took " << seconds << " s";
    EXPECT_NE(std::string::npos, line.find("TERN_ERROR_COMM_PEER_LOST")) << children[r]->output();
    EXPECT_NE(std::string::npos, line.find(expected_peer)) << line;
    ASSERT_TRUE(children[r]->WaitForLine("async ", kTimeoutMs, &line)) << children[r]->output();
    EXPECT_NE(std::string::npos, line.find("TERN_ERROR_COMM_PEER_LOST")) << line;
    EXPECT_EQ(3, children[r]->Wait(kTimeoutMs)) << children[r]->output();
  }
}

const Env kTcp = {{"FI_PROVIDER", "tcp"}, {"FI_TCP_IFACE", "lo"}};

TEST(CommFaultTest, KillRankMidAllReduceTcp) { KillMidAllReduce(kTcp, 3, 1); }
TEST(CommFaultTest, KillRankMidAllReduceTernShm) { KillMidAllReduce({}, 3, 2); }
TEST(CommFaultTest, KillRankZeroMidAllReduce) { KillMidAllReduce({}, 3, 0); }

// A rank that joins but never enqueues: the others time out after
// TERN_COMM_TIMEOUT, naming it and what it last did, and dump the flight
// recorder to the log.
TEST(CommFaultTest, SilentRankTimesOutWithFlightRecorder) {
  auto children = StartRanks(2, {{"TERN_COMM_TIMEOUT", "1.5"}}, {{"loop", "16"}, {"idle"}});
  ASSERT_TRUE(children[1]->WaitForLine("ready", kTimeoutMs)) << children[1]->output();
  const auto start = Clock::now();
  std::string line;
  ASSERT_TRUE(children[0]->WaitForLine("failed ", kTimeoutMs, &line)) << children[0]->output();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(std::string::npos, line.find("TERN_ERROR_COMM_TIMEOUT")) << line;
  EXPECT_NE(std::string::npos, line.find("it waits for rank 1 (host " + HostName())) << line;
  EXPECT_NE(std::string::npos, line.find("rank 1 has not enqueued it")) << line;
  EXPECT_EQ(3, children[0]->Wait(kTimeoutMs));
  // The log has the flight recorder: the operation that hung, still running.
  const std::string& log = children[0]->output();
  EXPECT_NE(std::string::npos, log.find("flight recorder of communicator")) << log;
  EXPECT_NE(std::string::npos, log.find("#0 all_reduce max f32 count=16: running")) << log;
  children[1]->CloseStdin();
  EXPECT_EQ(0, children[1]->Wait(kTimeoutMs)) << children[1]->output();
}

// Mismatched calls: every rank ends with TERN_ERROR_COMM_MISMATCH (in the
// operation itself or, for a rank whose side completed, in the next one),
// and the message names both calls.
void Mismatch(const std::string& what, const std::string& ours, const std::string& theirs) {
  auto children = StartRanks(2, {{"TERN_COMM_TIMEOUT", "30"}}, {{"mismatch", what}});
  const auto start = Clock::now();
  bool saw_both = false;
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(0, children[r]->Wait(kTimeoutMs)) << children[r]->output();
    const std::string& out = children[r]->output();
    EXPECT_NE(std::string::npos, out.find("TERN_ERROR_COMM_MISMATCH"))
        << "rank " << r << ": " << out;
    EXPECT_EQ(std::string::npos, out.find("TERN_ERROR_COMM_TIMEOUT")) << out;
    if (out.find(ours) != std::string::npos && out.find(theirs) != std::string::npos)
      saw_both = true;
  }
  EXPECT_TRUE(saw_both) << "no message names both '" << ours << "' and '" << theirs << "'";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 25.0);
}

TEST(CommFaultTest, MismatchedKind) {
  Mismatch("kind", "all_reduce sum f32 count=64", "broadcast f32 count=64 root=1");
}
TEST(CommFaultTest, MismatchedCount) { Mismatch("count", "count=64", "count=65"); }
TEST(CommFaultTest, MismatchedDtype) {
  Mismatch("dtype", "all_reduce sum f32", "all_reduce sum i32");
}
TEST(CommFaultTest, MismatchedReduction) {
  Mismatch("redop", "all_reduce sum f32", "all_reduce max f32");
}
TEST(CommFaultTest, MismatchedRoot) { Mismatch("root", "root=0", "root=1"); }

// A bootstrap with a rank missing: the ranks that came fail with
// COMM_TIMEOUT after the init timeout, naming the missing rank.
TEST(CommFaultTest, BootstrapWithMissingRankTimesOut) {
  setenv("TERN_COMM_INIT_TIMEOUT", "1.5", 1);
  tern_comm_unique_id_t id;
  const tern_status_t s = tern_comm_get_unique_id(&id);
  unsetenv("TERN_COMM_INIT_TIMEOUT");
  ASSERT_EQ(TERN_OK, s) << LastError(s);
  const std::string hex = IdHex(id);
  const Env env = {{"TERN_COMM_INIT_TIMEOUT", "1.5"}};
  const auto start = Clock::now();
  auto a = ChildProcess::Spawn({"--id", hex, "--ranks", "0", "--size", "3", "init-only"}, env);
  auto b = ChildProcess::Spawn({"--id", hex, "--ranks", "1", "--size", "3", "init-only"}, env);
  for (ChildProcess* child : {a.get(), b.get()}) {
    child->Wait(kTimeoutMs);
    const std::string& out = child->output();
    EXPECT_NE(std::string::npos, out.find("TERN_ERROR_COMM_TIMEOUT")) << out;
    EXPECT_NE(std::string::npos, out.find("rank(s) 2 of 3 never joined")) << out;
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
}

// torchrun-style: rank 1 of 2 starts but rank 0 (the bootstrap root) never
// does: rank 1 gives up after the init timeout and says where it looked.
TEST(CommFaultTest, EnvBootstrapWithoutRootTimesOut) {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  auto child = ChildProcess::Spawn({"init-only"}, {{"TERN_COMM_ID", address},
                                                   {"TERN_COMM_RANK", "1"},
                                                   {"TERN_COMM_WORLD_SIZE", "2"},
                                                   {"TERN_COMM_INIT_TIMEOUT", "1"}});
  child->Wait(kTimeoutMs);
  EXPECT_NE(std::string::npos, child->output().find("TERN_ERROR_COMM_TIMEOUT")) << child->output();
  EXPECT_NE(std::string::npos, child->output().find(address)) << child->output();
}

// --- In one process --------------------------------------------------------

class CommFaultInProcessTest : public CommFixture {
 protected:
  void SetUp() override {
    setenv("TERN_COMM_TIMEOUT", "20", 1);
    CommFixture::SetUp();
  }
  void TearDown() override {
    CommFixture::TearDown();
    unsetenv("TERN_COMM_TIMEOUT");
  }
};

TEST_F(CommFaultInProcessTest, MismatchedCountsInProcess) {
  InitAll(2);
  tern_buffer_t b0 = Alloc(devices_[0], 1024), b1 = Alloc(devices_[0], 1024);
  COMM_ASSERT_OK(
      tern_comm_all_reduce(comms_[0], b0, 0, b0, 0, 8, TERN_DTYPE_F32, TERN_COMM_SUM, queues_[0]));
  COMM_ASSERT_OK(
      tern_comm_all_reduce(comms_[1], b1, 0, b1, 0, 9, TERN_DTYPE_F32, TERN_COMM_SUM, queues_[1]));
  for (int r = 0; r < 2; ++r) {
    const tern_status_t s = tern_queue_synchronize(queues_[r], 30ull * 1000000000ull);
    EXPECT_EQ(TERN_ERROR_COMM_MISMATCH, s) << LastError(s);
    const std::string message = tern_last_error_message();
    EXPECT_NE(std::string::npos, message.find("all_reduce sum f32 count=")) << message;
    tern_status_t async = TERN_OK;
    COMM_EXPECT_OK(tern_comm_get_async_error(comms_[r], &async));
    EXPECT_EQ(TERN_ERROR_COMM_MISMATCH, async);
  }
  // A failed communicator refuses new work at once.
  const tern_status_t s = tern_comm_barrier(comms_[0], queues_[0]);
  EXPECT_EQ(TERN_ERROR_COMM_MISMATCH, s);
  EXPECT_NE(std::string::npos, std::string(tern_last_error_message()).find("failed earlier"));
  EXPECT_EQ(TERN_ERROR_COMM_MISMATCH, tern_comm_destroy(comms_[0]));
  comms_[0] = nullptr;
  tern_buffer_free(b0);
  tern_buffer_free(b1);
}

TEST_F(CommFaultInProcessTest, AbortWakesTheOtherRanks) {
  InitAll(3);
  tern_buffer_t b = Alloc(devices_[0], 4096);
  COMM_ASSERT_OK(
      tern_comm_all_reduce(comms_[0], b, 0, b, 0, 16, TERN_DTYPE_F32, TERN_COMM_SUM, queues_[0]));
  usleep(100000);  // rank 0 is waiting now
  const auto start = Clock::now();
  COMM_ASSERT_OK(tern_comm_abort(comms_[1]));
  comms_[1] = nullptr;
  const tern_status_t s = tern_queue_synchronize(queues_[0], 30ull * 1000000000ull);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
  EXPECT_EQ(TERN_ERROR_COMM_ABORTED, s) << LastError(s);
  EXPECT_NE(std::string::npos, std::string(tern_last_error_message()).find("rank 1 aborted"))
      << LastError(s);
  // Rank 2 waits for nothing, but learns of the abort too (asynchronously).
  tern_status_t async = TERN_OK;
  for (int i = 0; i < 500 && async == TERN_OK; ++i) {
    COMM_EXPECT_OK(tern_comm_get_async_error(comms_[2], &async));
    if (async == TERN_OK) usleep(10000);
  }
  EXPECT_EQ(TERN_ERROR_COMM_ABORTED, async);
  // The aborted handle is gone.
  EXPECT_EQ(TERN_ERROR_INVALID_HANDLE, tern_comm_get_async_error(comms_[1], &async));
  tern_buffer_free(b);
}

TEST_F(CommFaultInProcessTest, SkippedOperationFailsTheOtherRanks) {
  InitAll(2);
  tern_buffer_t b0 = Alloc(devices_[0], 4096), b1 = Alloc(devices_[0], 4096);
  // Rank 1's queue fails on a copy, so it skips the all-reduce behind it.
  tern_fault_params_t fault = {sizeof(fault), TERN_FAULT_DMA_ABORT, cores_[1], nullptr, 0};
  COMM_ASSERT_OK(tern_debug_inject_fault(&fault));
  float host[16] = {};
  COMM_ASSERT_OK(tern_queue_copy_h2d(queues_[1], b1, 0, host, sizeof(host), nullptr));
  COMM_ASSERT_OK(
      tern_comm_all_reduce(comms_[1], b1, 0, b1, 0, 16, TERN_DTYPE_F32, TERN_COMM_SUM, queues_[1]));
  // Rank 1's queue may fail and skip its part before rank 0 enqueues (about
  // once in a hundred runs): then the communicator has failed already and
  // the enqueue itself reports it; otherwise rank 0's queue does.
  const tern_status_t enqueued =
      tern_comm_all_reduce(comms_[0], b0, 0, b0, 0, 16, TERN_DTYPE_F32, TERN_COMM_SUM, queues_[0]);
  std::string error = enqueued == TERN_OK ? "" : tern_last_error_message();
  EXPECT_EQ(TERN_ERROR_DMA_ABORT, tern_queue_synchronize(queues_[1], 30ull * 1000000000ull));
  tern_status_t s = enqueued;
  if (enqueued == TERN_OK) {
    s = tern_queue_synchronize(queues_[0], 30ull * 1000000000ull);
    error = tern_last_error_message();
  }
  EXPECT_EQ(TERN_ERROR_COMM_ABORTED, s) << error;
  EXPECT_NE(std::string::npos, error.find("rank 1 did not run operation #0")) << error;
  tern_buffer_free(b0);
  tern_buffer_free(b1);
}

TEST_F(CommFaultInProcessTest, RankThatLeftIsReported) {
  InitAll(2);
  tern_buffer_t b = Alloc(devices_[0], 4096);
  COMM_ASSERT_OK(tern_comm_destroy(comms_[1]));
  comms_[1] = nullptr;
  COMM_ASSERT_OK(
      tern_comm_all_reduce(comms_[0], b, 0, b, 0, 16, TERN_DTYPE_F32, TERN_COMM_SUM, queues_[0]));
  const tern_status_t s = tern_queue_synchronize(queues_[0], 30ull * 1000000000ull);
  EXPECT_EQ(TERN_ERROR_COMM_MISMATCH, s) << LastError(s);
  EXPECT_NE(std::string::npos,
            std::string(tern_last_error_message()).find("destroyed its communicator"))
      << LastError(s);
  tern_buffer_free(b);
}

TEST_F(CommFaultInProcessTest, StaleUniqueIdFailsFast) {
  setenv("TERN_COMM_INIT_TIMEOUT", "0.3", 1);
  tern_comm_unique_id_t id;
  COMM_ASSERT_OK(tern_comm_get_unique_id(&id));
  usleep(600000);  // the root gave up
  tern_comm_t comm = nullptr;
  const auto start = Clock::now();
  const tern_status_t s = tern_comm_init_rank(cores_[0], 2, &id, 0, nullptr, &comm);
  unsetenv("TERN_COMM_INIT_TIMEOUT");
  EXPECT_TRUE(s == TERN_ERROR_COMM_TIMEOUT || s == TERN_ERROR_COMM_TRANSPORT) << LastError(s);
  EXPECT_NE(std::string::npos, std::string(tern_last_error_message()).find("bootstrap root"))
      << LastError(s);
  EXPECT_EQ(nullptr, comm);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
}

}  // namespace
}  // namespace tern_test
