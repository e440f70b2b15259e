// Hostile clients against real jobs (real processes, real sockets): forged
// bootstrap hellos without the communicator's secret or with a wrong one are
// refused and learn nothing while the real rank joins; connections that send
// half a frame or nothing, to the bootstrap root and to rank 0's control
// listener, do not stall the job; a bootstrap root whose accept fails with
// EMFILE does not spin and recovers. See "Security model" in
// docs/collectives.md.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "comm_test_util.h"

namespace tern_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutMs = 60000;
constexpr uint32_t kHelloMagic = 0x54524e42;  // "TRNB", the bootstrap's
const char kSecret[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Little-endian fields and length-prefixed strings, as the frames carry them.
std::string U32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof(v)); }
std::string U64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof(v)); }
std::string Str(const std::string& s) { return U32(static_cast<uint32_t>(s.size())) + s; }
std::string Frame(const std::string& payload) { return Str(payload); }

// `ip` in network byte order (default: loopback).
int ConnectTo(uint16_t port, uint32_t ip = htonl(INADDR_LOOPBACK)) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = ip;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool WaitListening(uint16_t port, int timeout_ms) {
  const auto start = Clock::now();
  while (SecondsSince(start) * 1000 < timeout_ms) {
    const int fd = ConnectTo(port);
    if (fd >= 0) {
      close(fd);
      return true;
    }
    usleep(20000);
  }
  return false;
}

// The IPv4 TCP ports process `pid` listens on (its socket inodes in LISTEN
// state), with the address of each (network byte order).
std::map<uint16_t, uint32_t> ListeningPorts(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = opendir(fd_dir.c_str())) {
    while (dirent* entry = readdir(dir)) {
      char target[128] = {};
      const std::string link = fd_dir + "/" + entry->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::strncmp(target, "socket:[", 8) == 0) {
        inodes.insert(std::string(target + 8, std::strlen(target) - 9));
      }
    }
    closedir(dir);
  }
  std::map<uint16_t, uint32_t> ports;
  std::ifstream tcp("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    in >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
        inode;
    if (state == "0A" && inodes.count(inode)) {
      const size_t colon = local.find(':');
      // The address is the in-memory s_addr printed as a host integer.
      ports[static_cast<uint16_t>(std::stoul(local.substr(colon + 1), nullptr, 16))] =
          static_cast<uint32_t>(std::stoul(local.substr(0, colon), nullptr, 16));
    }
  }
  return ports;
}

// Everything `fd` receives until the other end closes or `timeout_ms` passes.
std::string ReadUntilClosed(int fd, int timeout_ms) {
  std::string data;
  const auto start = Clock::now();
  while (true) {
    const int left = timeout_ms - static_cast<int>(SecondsSince(start) * 1000);
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) break;
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  return data;
}

// One frame (without its length), or empty when none arrives in time.
std::string ReadFrame(int fd, int timeout_ms) {
  std::string data;
  const auto start = Clock::now();
  while (true) {
    if (data.size() >= 4) {
      uint32_t length = 0;
      std::memcpy(&length, data.data(), 4);
      if (data.size() >= 4 + length) return data.substr(4, length);
    }
    const int left = timeout_ms - static_cast<int>(SecondsSince(start) * 1000);
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) return std::string();
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return std::string();
    data.append(buffer, static_cast<size_t>(n));
  }
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// A rank identity as the bootstrap carries it, claiming rank 1.
std::string ForgedIdentity() {
  return U32(1) + U32(static_cast<uint32_t>(getpid())) + U64(0x1234) + Str("forger") +
         Str("forged-node") + Str("");
}

Env RankEnv(const std::string& address, uint32_t rank, const std::string& init_timeout) {
  return {{"TERN_COMM_ID", address},
          {"TERN_COMM_RANK", std::to_string(rank)},
          {"TERN_COMM_WORLD_SIZE", "2"},
          {"TERN_COMM_INIT_TIMEOUT", init_timeout},
          {"TERN_COMM_SECRET", kSecret}};
}

void ExpectJoined(ChildProcess* child, const char* who) {
  EXPECT_TRUE(child->WaitForLine("joined", kTimeoutMs)) << who << ": " << child->output();
  EXPECT_EQ(0, child->Wait(kTimeoutMs)) << who << ": " << child->output();
}

// Two forgers try to join a 2-rank job as rank 1 before the real rank 1:
// one sends the hello that the address alone used to make valid (no
// secret), the other answers the root's challenge with a proof under a
// wrong key. Neither receives the rank table (it holds the host's boot id);
// the real rank 1 then joins.
TEST(CommSecurityTest, ForgedHellosAreRefusedAndTheRealRankJoins) {
  const uint16_t port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto rank0 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 0, "20"));
  ASSERT_TRUE(WaitListening(port, kTimeoutMs)) << rank0->output();

  // Without the secret: protocol 1's hello, whose nonce is a hash of the
  // public address.
  uint64_t nonce = 1469598103934665603ull;
  for (char c : address) nonce = (nonce ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  nonce |= 1;
  const int no_secret = ConnectTo(port);
  ASSERT_GE(no_secret, 0);
  const std::string old_hello = U32(kHelloMagic) + U32(1) + U64(nonce) + U32(2) + ForgedIdentity();
  ASSERT_EQ(static_cast<ssize_t>(old_hello.size() + 4),
            send(no_secret, Frame(old_hello).data(), old_hello.size() + 4, MSG_NOSIGNAL));

  // With a wrong secret: reads the challenge, proves nothing.
  const int wrong_secret = ConnectTo(port);
  ASSERT_GE(wrong_secret, 0);
  const std::string greeting = ReadFrame(wrong_secret, 2000);
  const std::string body = U32(kHelloMagic) + U32(2) + U64(nonce) + U32(2) + ForgedIdentity() +
                           Str(std::string(16, 'c'));
  const std::string hello = Str(body) + Str(std::string(32, '\x55'));
  ASSERT_EQ(static_cast<ssize_t>(hello.size() + 4),
            send(wrong_secret, Frame(hello).data(), hello.size() + 4, MSG_NOSIGNAL));

  const std::string boot_id = BootId();
  ASSERT_FALSE(boot_id.empty());
  const std::string reply_no_secret = ReadUntilClosed(no_secret, 3000);
  const std::string reply_wrong_secret = ReadUntilClosed(wrong_secret, 3000);
  close(no_secret);
  close(wrong_secret);
  EXPECT_EQ(std::string::npos, reply_no_secret.find(boot_id)) << "the forger got the rank table";
  EXPECT_EQ(std::string::npos, reply_wrong_secret.find(boot_id)) << "the forger got the rank table";
  EXPECT_NE(std::string::npos, reply_wrong_secret.find("does not prove knowledge"))
      << reply_wrong_secret;

  auto rank1 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 1, "20"));
  ExpectJoined(rank0.get(), "rank 0");
  ExpectJoined(rank1.get(), "rank 1");
}

// A rank whose secret differs is refused by name, and the root says so.
TEST(CommSecurityTest, RankWithAnotherSecretIsRefused) {
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  auto rank0 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 0, "2"));
  Env env = RankEnv(address, 1, "2");
  env.back().second = std::string(kSecret).replace(0, 2, "ff");
  auto rank1 = ChildProcess::Spawn({"init-only"}, env);
  EXPECT_TRUE(rank1->WaitForLine("init ", kTimeoutMs)) << rank1->output();
  EXPECT_NE(std::string::npos, rank1->output().find("does not prove knowledge of this "
                                                    "communicator's secret"))
      << rank1->output();
  EXPECT_TRUE(rank0->WaitForLine("init ", kTimeoutMs)) << rank0->output();
  EXPECT_NE(std::string::npos, rank0->output().find("failed authentication")) << rank0->output();
}

// While rank 0 waits for rank 1: 25 connections send half a frame to the
// bootstrap root, two stay idle there, and more do the same to rank 0's
// control listener. The job still joins, within seconds rather than at its
// init timeout.
TEST(CommSecurityTest, SlowAndIdleClientsDoNotStallTheJob) {
  const uint16_t port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto rank0 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 0, "10"));
  ASSERT_TRUE(WaitListening(port, kTimeoutMs)) << rank0->output();
  // Rank 0's control listener opens when it joins its own root.
  uint16_t control_port = 0;
  const auto wait_start = Clock::now();
  while (control_port == 0 && SecondsSince(wait_start) < 20) {
    for (const auto& [p, ip] : ListeningPorts(rank0->pid())) {
      if (p != port) control_port = p;
    }
    if (control_port == 0) usleep(20000);
  }
  ASSERT_NE(0, control_port) << "rank 0 opened no control listener: " << rank0->output();

  std::vector<int> hostile;
  const std::string half_frame("\x40\x00", 2);  // half of a frame's length
  for (int i = 0; i < 25; ++i) {
    hostile.push_back(ConnectTo(port));
    ASSERT_GE(hostile.back(), 0);
    send(hostile.back(), half_frame.data(), half_frame.size(), MSG_NOSIGNAL);
  }
  for (int i = 0; i < 2; ++i) hostile.push_back(ConnectTo(port));
  for (int i = 0; i < 5; ++i) {
    hostile.push_back(ConnectTo(control_port));
    ASSERT_GE(hostile.back(), 0);
    if (i % 2 == 0) send(hostile.back(), half_frame.data(), half_frame.size(), MSG_NOSIGNAL);
  }

  const auto start = Clock::now();
  auto rank1 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 1, "10"));
  ExpectJoined(rank0.get(), "rank 0");
  ExpectJoined(rank1.get(), "rank 1");
  EXPECT_LT(SecondsSince(start), 8.0) << "the hostile clients delayed the job";
  for (int fd : hostile) close(fd);
}

// CPU time (user + system) of process `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A bootstrap root whose process may open no more descriptors (accept fails
// with EMFILE) while connections wait: it must not spin on the listener, and
// once descriptors are available again it serves them.
TEST(CommSecurityTest, AcceptFailingWithEmfileDoesNotSpinAndRecovers) {
  auto root = ChildProcess::Spawn({"root-fd-limit"}, {{"TERN_COMM_INIT_TIMEOUT", "30"}});
  ASSERT_TRUE(root->WaitForLine("limited", kTimeoutMs)) << root->output();
  const std::map<uint16_t, uint32_t> ports = ListeningPorts(root->pid());
  ASSERT_EQ(1u, ports.size()) << root->output();
  std::vector<int> clients;
  for (int i = 0; i < 3; ++i) {
    // Completes in the kernel's backlog.
    clients.push_back(ConnectTo(ports.begin()->first, ports.begin()->second));
    ASSERT_GE(clients.back(), 0);
  }
  usleep(200000);
  const double before = CpuSeconds(root->pid());
  usleep(1000000);
  const double busy = CpuSeconds(root->pid()) - before;
  EXPECT_LT(busy, 0.2) << "the root used " << busy << " s of CPU in 1 s while accept failed";

  root->CloseStdin();
  ASSERT_TRUE(root->WaitForLine("raised", kTimeoutMs)) << root->output();
  const std::string greeting = ReadFrame(clients[0], 3000);
  ASSERT_GE(greeting.size(), 4u) << "the root did not serve the waiting connection";
  uint32_t magic = 0;
  std::memcpy(&magic, greeting.data(), 4);
  EXPECT_EQ(kHelloMagic, magic);
  for (int fd : clients) close(fd);
  EXPECT_EQ(0, root->Wait(kTimeoutMs)) << root->output();
}

}  // namespace
}  // namespace tern_test
