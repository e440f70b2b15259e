// Collectives across processes: a tern_comm_child per rank (or per pair of
// ranks), over libfabric's tcp provider on loopback, libfabric's shm
// provider, and tern's shared-memory channel; joined through the
// environment (as torchrun would) or through a unique id made here.
#include <tern/tern.h>

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

}  // namespace
}  // namespace tern_test
