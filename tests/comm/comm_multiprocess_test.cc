// Collectives across processes: a tern_comm_child per rank (or per pair of
// ranks), over libfabric's tcp provider on loopback, libfabric's shm
// provider, and tern's shared-memory channel; joined through the
// environment (as torchrun would) or through a unique id made here.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <tern/tern.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "comm_test_util.h"

namespace tern_test {
namespace {

constexpr int kTimeoutMs = 120000;

struct Transport {
  const char* name;
  Env env;
  const char* expect;  // in the transport line
};

// Runs `size` children joined through TERN_COMM_ID; each runs `args`.
void RunEnvRanks(uint32_t size, const Env& extra, const std::vector<std::string>& args,
                 const char* expect_transport) {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (uint32_t r = 0; r < size; ++r) {
    Env env = extra;
    env.push_back({"TERN_COMM_ID", address});
    env.push_back({"TERN_COMM_RANK", std::to_string(r)});
    env.push_back({"TERN_COMM_WORLD_SIZE", std::to_string(size)});
    children.push_back(ChildProcess::Spawn(args, env));
    ASSERT_NE(nullptr, children.back());
  }
  for (uint32_t r = 0; r < size; ++r) {
    const int code = children[r]->Wait(kTimeoutMs);
    const std::string& out = children[r]->output();
    EXPECT_EQ(0, code) << "rank " << r << " of " << size << ":\n" << out;
    EXPECT_NE(std::string::npos, out.find("\nok ")) << out;
    if (expect_transport != nullptr) {
      EXPECT_NE(std::string::npos, out.find(std::string("transport ") + expect_transport + "\n"))
          << out;
    }
  }
}

const Env kTcp = {{"FI_PROVIDER", "tcp"}, {"FI_TCP_IFACE", "lo"}};
const Env kFabricShm = {{"FI_PROVIDER", "shm"}};
const Env kTernShm = {};

TEST(CommMultiprocessTest, TcpTwoRanks) { RunEnvRanks(2, kTcp, {"matrix"}, "tcp;ofi_rxm"); }
TEST(CommMultiprocessTest, TcpThreeRanks) {
  RunEnvRanks(3, kTcp, {"matrix", "--small"}, "tcp;ofi_rxm");
}
TEST(CommMultiprocessTest, FabricShmTwoRanks) { RunEnvRanks(2, kFabricShm, {"matrix"}, "shm"); }
TEST(CommMultiprocessTest, FabricShmFourRanks) {
  RunEnvRanks(4, kFabricShm, {"matrix", "--small"}, "shm");
}
TEST(CommMultiprocessTest, TernShmTwoRanks) { RunEnvRanks(2, kTernShm, {"matrix"}, "tern-shm"); }
// Direct access to the other processes' device memory from 1 KiB on.
TEST(CommMultiprocessTest, TernShmThreeRanksDirect) {
  RunEnvRanks(3, {{"TERN_COMM_DIRECT_MIN", "1K"}}, {"matrix"}, "tern-shm");
}
// Tiny rings and chunks, no direct access: messages span many fragments,
// rings fill up, fragments wait aside for their receive, and the ring
// algorithms run several rounds.
TEST(CommMultiprocessTest, TernShmFourRanksSmallRings) {
  RunEnvRanks(4,
              {{"TERN_COMM_SHM_SLOT", "1024"},
               {"TERN_COMM_SHM_SLOTS", "4"},
               {"TERN_COMM_CHUNK", "4096"},
               {"TERN_COMM_DIRECT", "0"}},
              {"matrix", "--small"}, "tern-shm");
}

// Two processes with two ranks each: ranks of one process use the local
// channel between them and shared memory (or tcp) to the other process.
void RunTwoByTwo(const Env& env, const char* expect) {
  tern_comm_unique_id_t id;
  ASSERT_EQ(TERN_OK, tern_comm_get_unique_id(&id)) << tern_last_error_message();
  const std::string hex = IdHex(id);
  auto a =
      ChildProcess::Spawn({"--id", hex, "--ranks", "0,1", "--size", "4", "matrix", "--small"}, env);
  auto b =
      ChildProcess::Spawn({"--id", hex, "--ranks", "2,3", "--size", "4", "matrix", "--small"}, env);
  ASSERT_NE(nullptr, a);
  ASSERT_NE(nullptr, b);
  for (ChildProcess* child : {a.get(), b.get()}) {
    EXPECT_EQ(0, child->Wait(kTimeoutMs)) << child->output();
    EXPECT_NE(std::string::npos,
              child->output().find(std::string("transport local+") + expect + "\n"))
        << child->output();
  }
}

TEST(CommMultiprocessTest, TwoProcessesTwoRanksEachShm) { RunTwoByTwo({}, "tern-shm"); }
TEST(CommMultiprocessTest, TwoProcessesTwoRanksEachTcp) { RunTwoByTwo(kTcp, "tcp;ofi_rxm"); }

// A rank that reaches an all-reduce first sleeps until its late peer
// writes, rather than polling for it: over the 250 ms that the peer is late
// its process switches context a few times (a sleep of the queue thread,
// which the peer's write ends), where one that naps wakes every 50 us (some
// 3,000 switches). The peer's write wakes it: it finishes within
// milliseconds of the peer's enqueue, where an unrung sleep would end only at
// its 100 ms bound (about 50 ms late at this delay). And once its waits have
// been long, it sleeps early: the last wait costs its queue's thread well
// under the 2 ms that the first one polls.
TEST(CommMultiprocessTest, ARankWaitingForALatePeerSleepsUntilItWrites) {
  std::vector<std::unique_ptr<ChildProcess>> children;
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  for (uint32_t r = 0; r < 2; ++r) {
    children.push_back(ChildProcess::Spawn({"late", "250"}, {{"TERN_COMM_ID", address},
                                                             {"TERN_COMM_RANK", std::to_string(r)},
                                                             {"TERN_COMM_WORLD_SIZE", "2"}}));
    ASSERT_NE(nullptr, children.back());
  }
  for (uint32_t r = 0; r < 2; ++r) {
    ASSERT_EQ(0, children[r]->Wait(kTimeoutMs)) << "rank " << r << ":\n" << children[r]->output();
    ASSERT_NE(std::string::npos, children[r]->output().find("ok late")) << children[r]->output();
  }
  std::vector<double> late_ms;
  for (int k = 0; k < 3; ++k) {
    const std::string round = std::to_string(k) + " ";
    std::string sent, done;
    const std::string& out1 = children[1]->output();
    const std::string& out0 = children[0]->output();
    const size_t s = out1.find("sent " + round);
    const size_t d = out0.find("done " + round);
    ASSERT_NE(std::string::npos, s) << out1;
    ASSERT_NE(std::string::npos, d) << out0;
    unsigned long long sent_ns = 0, done_ns = 0;
    long switches = -1;
    unsigned long long cpu_us = 0;
    ASSERT_EQ(1, std::sscanf(out1.c_str() + s, "sent %*d %llu", &sent_ns));
    ASSERT_EQ(3, std::sscanf(out0.c_str() + d, "done %*d %llu switches %ld queue_cpu_us %llu",
                             &done_ns, &switches, &cpu_us));
    EXPECT_LT(switches, 500) << "round " << k << ": rank 0 did not sleep through its wait\n"
                             << out0;
    if (k == 2) {
      EXPECT_LT(cpu_us, 1300u) << "rank 0 polled through the start of its last wait\n" << out0;
    }
    ASSERT_GT(done_ns, sent_ns);
    late_ms.push_back(static_cast<double>(done_ns - sent_ns) / 1e6);
  }
  std::sort(late_ms.begin(), late_ms.end());
  EXPECT_LT(late_ms[1], 25.0) << "rank 0 finished " << late_ms[0] << ", " << late_ms[1] << " and "
                              << late_ms[2]
                              << " ms after its peer enqueued: the peer's write did not wake it";
}

// Rank 0 finds its bootstrap port taken (here by a socket bound to it and
// not listening; in the field by a closed connection's TIME_WAIT, which a
// bind fails over for up to 60 s unless that connection's socket had set
// SO_REUSEADDR too): it waits for the port, within the init timeout, and
// says so, instead of failing the job. The other rank's connections are
// refused meanwhile, and it keeps trying.
TEST(CommMultiprocessTest, RootWaitsForItsBusyPort) {
  const uint16_t port = FreePort();
  const int blocker = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(blocker, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  ASSERT_EQ(0, bind(blocker, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)))
      << "port " << port << " was taken before the test held it";
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (uint32_t r = 0; r < 2; ++r) {
    children.push_back(
        ChildProcess::Spawn({"init-only"}, {{"TERN_COMM_ID", "127.0.0.1:" + std::to_string(port)},
                                            {"TERN_COMM_RANK", std::to_string(r)},
                                            {"TERN_COMM_WORLD_SIZE", "2"},
                                            {"TERN_COMM_INIT_TIMEOUT", "60"}}));
    ASSERT_NE(nullptr, children.back());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  close(blocker);
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(0, children[r]->Wait(kTimeoutMs));
    EXPECT_NE(std::string::npos, children[r]->output().find("joined")) << "rank " << r << ":\n"
                                                                       << children[r]->output();
  }
  EXPECT_NE(std::string::npos, children[0]->output().find("is in use"))
      << "rank 0 did not say that it waited for the port:\n"
      << children[0]->output();
}

}  // namespace
}  // namespace tern_test
