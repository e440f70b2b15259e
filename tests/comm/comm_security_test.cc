// Hostile clients against real jobs (real processes, real sockets): forged
// bootstrap hellos without the communicator's secret or with a wrong one are
// refused and learn nothing while the real rank joins; connections that send
// half a frame or nothing, to the bootstrap root and to rank 0's control
// listener, do not stall the job; a bootstrap root whose accept fails with
// EMFILE does not spin and recovers. See "Security model" in
// docs/collectives.md.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>

#include "collectives/sha256.h"
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
  // (A root that already handed the table to the first forger may have
  // closed this connection: what matters is what each forger read.)
  (void)send(wrong_secret, Frame(hello).data(), hello.size() + 4, MSG_NOSIGNAL);

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

// --- A rank that holds the secret and lies -----------------------------------
//
// The test process joins a real rank 0 as rank 1, speaking the protocols
// itself (bootstrap and control handshakes, the address exchange), and then
// names shared memory that is not its own. Rank 0 must refuse to map or use
// it, with an error naming rank 1 and what was wrong, instead of mapping it.

// The communicator secret TERN_COMM_SECRET=kSecret stands for, and the
// proof of it over `parts` (the wire format of collectives/secret.cc).
std::string SecretKey() {
  std::string bytes;
  const std::string hex = kSecret;
  for (size_t i = 0; i < hex.size(); i += 2) {
    bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  const tern::comm::Sha256Digest digest = tern::comm::Sha256Of(bytes);
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}
std::string Prove(const std::string& purpose, std::initializer_list<std::string> parts) {
  std::string message = "tern-comm/" + purpose;
  for (const std::string& part : parts) message += U32(static_cast<uint32_t>(part.size())) + part;
  const tern::comm::Sha256Digest mac = tern::comm::HmacSha256(SecretKey(), message);
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

// A little-endian reader of frames.
struct Fields {
  std::string data;
  size_t at = 0;
  bool ok = true;
  uint32_t U32() {
    uint32_t v = 0;
    if (at + 4 > data.size()) return ok = false, 0;
    std::memcpy(&v, data.data() + at, 4);
    at += 4;
    return v;
  }
  uint64_t U64() {
    uint64_t v = 0;
    if (at + 8 > data.size()) return ok = false, 0;
    std::memcpy(&v, data.data() + at, 8);
    at += 8;
    return v;
  }
  std::string Str() {
    const uint32_t n = U32();
    if (!ok || at + n > data.size()) return ok = false, std::string();
    std::string v = data.substr(at, n);
    at += n;
    return v;
  }
};

bool SendAll(int fd, const std::string& payload) {
  const std::string frame = Frame(payload);
  return send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size());
}

std::string NodeKey() {
  struct stat st {};
  stat("/proc/self/ns/net", &st);
  return BootId() + "/net:" + std::to_string(st.st_ino);
}

// What the lying rank 1 publishes in the address exchange.
struct Lie {
  std::string segment;  // its tern-shm segment name
  int32_t fd = -1;      // the descriptor of its "device memory"
  uint64_t bytes = 0;   // and its size
};

// Joins rank 0 (bootstrap root on `port`) as rank 1 and publishes `lie` in
// the address exchange. `*out_control`: the control connection (open), or
// -1 when a step failed.
void JoinAndLie(uint16_t port, const std::string& address, const Lie& lie, int* out_control) {
  *out_control = -1;
  uint64_t nonce = 1469598103934665603ull;
  for (char c : address) nonce = (nonce ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  nonce |= 1;
  const int boot = ConnectTo(port);
  ASSERT_GE(boot, 0);
  Fields greeting{ReadFrame(boot, 5000)};
  ASSERT_EQ(kHelloMagic, greeting.U32());
  ASSERT_EQ(2u, greeting.U32());
  const std::string challenge = greeting.Str();
  const std::string mine(16, 'm');
  const std::string body = U32(kHelloMagic) + U32(2) + U64(nonce) + U32(2) + U32(1) +
                           U32(static_cast<uint32_t>(getpid())) + U64(0x7777) + Str("liar") +
                           Str(NodeKey()) + Str("") + Str(mine);
  ASSERT_TRUE(SendAll(boot, Str(body) + Str(Prove("join", {challenge, body}))));
  Fields reply{ReadFrame(boot, 10000)};
  ASSERT_EQ(0u, reply.U32()) << reply.data;
  Fields table{reply.Str()};
  ASSERT_EQ(2u, table.U32());
  std::string control_address;
  for (int i = 0; i < 2; ++i) {
    const uint32_t rank = table.U32();
    table.U32();
    table.U64();
    table.Str();
    table.Str();
    const std::string ctrl = table.Str();
    if (rank == 0) control_address = ctrl;
  }
  ASSERT_TRUE(table.ok);
  const uint16_t control_port =
      static_cast<uint16_t>(std::stoul(control_address.substr(control_address.rfind(':') + 1)));
  sockaddr_in control_addr{};
  inet_pton(AF_INET, control_address.substr(0, control_address.rfind(':')).c_str(),
            &control_addr.sin_addr);
  const int control = ConnectTo(control_port, control_addr.sin_addr.s_addr);
  ASSERT_GE(control, 0);
  constexpr uint32_t kCtrlMagic = 0x54524e43;
  Fields control_greeting{ReadFrame(control, 5000)};
  ASSERT_EQ(kCtrlMagic, control_greeting.U32());
  control_greeting.U32();
  const std::string control_challenge = control_greeting.Str();
  const std::string control_body = U32(kCtrlMagic) + U64(nonce) + U32(1) + Str(mine);
  ASSERT_TRUE(
      SendAll(control, Str(control_body) + Str(Prove("ctrl", {control_challenge, control_body}))));
  Fields accepted{ReadFrame(control, 5000)};
  ASSERT_EQ(0u, accepted.U32());
  // The address exchange (gather #0): slots fabric-node, fabric-net, tern-shm,
  // then where its device memory is.
  const std::string record =
      Str("") + Str("") + Str("") + Str("") + Str("tern-shm") + Str(lie.segment) + U64(0x10000000) +
      U32(static_cast<uint32_t>(getpid())) + U32(static_cast<uint32_t>(lie.fd)) + U64(lie.bytes);
  ASSERT_TRUE(SendAll(control, U32(2) + U32(1) + U32(0) + U64(0) + Str(record)));
  close(boot);
  *out_control = control;
}

// JoinAndLie, then waits for rank 0 to report on its init.
void JoinLieAndWait(uint16_t port, const std::string& address, const Lie& lie,
                    ChildProcess* rank0) {
  int control = -1;
  JoinAndLie(port, address, lie, &control);
  EXPECT_TRUE(rank0->WaitForLine("init ", kTimeoutMs)) << rank0->output();
  if (control >= 0) close(control);
}

std::string SegmentName(const std::string& address, pid_t pid) {
  uint64_t nonce = 1469598103934665603ull;
  for (char c : address) nonce = (nonce ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof(name), "/tern-comm-%016llx-1-%d",
                static_cast<unsigned long long>(nonce | 1), static_cast<int>(pid));
  return name;
}

// Rank 1 names a plain file of 4 KiB as 1 MiB of device memory: not shared
// memory, and smaller than claimed. Rank 0 refuses to map it.
TEST(CommSecurityTest, PeerDescriptorThatIsNotItsMemoryIsNotMapped) {
  const uint16_t port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto rank0 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 0, "20"));
  ASSERT_TRUE(WaitListening(port, kTimeoutMs)) << rank0->output();
  char path[] = "/tmp/tern-comm-security-XXXXXX";
  const int file = mkstemp(path);
  ASSERT_GE(file, 0);
  unlink(path);
  ASSERT_EQ(0, ftruncate(file, 4096));
  JoinLieAndWait(port, address, {SegmentName(address, getpid()), file, 1u << 20}, rank0.get());
  close(file);
  const std::string& out = rank0->output();
  EXPECT_NE(std::string::npos, out.find("init TERN_ERROR_COMM_TRANSPORT")) << out;
  EXPECT_NE(std::string::npos, out.find("rank 1 (host liar")) << out;
  EXPECT_NE(std::string::npos, out.find("refusing to map it")) << out;
  rank0->Wait(kTimeoutMs);
}

// Rank 1 names a shared-memory segment of another process: rank 0 does not
// open it.
TEST(CommSecurityTest, PeerSegmentOfAnotherProcessIsNotOpened) {
  const uint16_t port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto rank0 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 0, "20"));
  ASSERT_TRUE(WaitListening(port, kTimeoutMs)) << rank0->output();
  JoinLieAndWait(port, address, {SegmentName(address, 1), -1, 0}, rank0.get());
  const std::string& out = rank0->output();
  EXPECT_NE(std::string::npos, out.find("init TERN_ERROR_COMM_TRANSPORT")) << out;
  EXPECT_NE(std::string::npos, out.find("refusing to open it")) << out;
  rank0->Wait(kTimeoutMs);
}

// The first word of a tern-shm segment (shm_channel.cc: "TERNSHM2").
constexpr uint64_t kShmSegmentMagic = 0x5445524e53484d32ull;

// Rank 1's own segment places rank 0's ring far outside the segment: rank 0
// refuses to use it.
TEST(CommSecurityTest, PeerRingOutsideItsSegmentIsRejected) {
  const uint16_t port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto rank0 = ChildProcess::Spawn({"init-only"}, RankEnv(address, 0, "20"));
  ASSERT_TRUE(WaitListening(port, kTimeoutMs)) << rank0->output();
  const std::string name = SegmentName(address, getpid());
  const int segment = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(segment, 0) << name;
  ASSERT_EQ(0, ftruncate(segment, 8192));
  uint64_t nonce = 1469598103934665603ull;
  for (char c : address) nonce = (nonce ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  // magic, nonce, owner, ring count, slots, slot bytes (the defaults), then
  // the ring entry for rank 0: sender, reserved, offset.
  const std::string header = U64(kShmSegmentMagic) + U64(nonce | 1) + U32(1) + U32(1) + U32(16) +
                             U32(65536) + U32(0) + U32(0) + U64(1ull << 30);
  ASSERT_EQ(static_cast<ssize_t>(header.size()), pwrite(segment, header.data(), header.size(), 0));
  JoinLieAndWait(port, address, {name, -1, 0}, rank0.get());
  close(segment);
  shm_unlink(name.c_str());
  const std::string& out = rank0->output();
  EXPECT_NE(std::string::npos, out.find("init TERN_ERROR_COMM_TRANSPORT")) << out;
  EXPECT_NE(std::string::npos, out.find("outside its 8192 bytes")) << out;
  rank0->Wait(kTimeoutMs);
}

// Rank 1 completes init with a valid segment, then writes a fragment into
// rank 0's ring that is larger than a slot. Rank 0's all-reduce fails with
// an error naming rank 1 instead of copying past the slot.
TEST(CommSecurityTest, RingFragmentLargerThanItsSlotIsRejected) {
  const uint16_t port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  Env env = RankEnv(address, 0, "20");
  env.push_back({"TERN_COMM_TIMEOUT", "20"});
  auto rank0 = ChildProcess::Spawn({"loop", "16"}, env);
  ASSERT_TRUE(WaitListening(port, kTimeoutMs)) << rank0->output();
  // A valid segment of rank 1, with a ring for rank 0 (default geometry).
  constexpr uint64_t kRingBytes = 64 + 16 * 65536;
  const std::string name = SegmentName(address, getpid());
  const int segment = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(segment, 0) << name;
  ASSERT_EQ(0, ftruncate(segment, static_cast<off_t>(4096 + kRingBytes)));
  uint64_t nonce = 1469598103934665603ull;
  for (char c : address) nonce = (nonce ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  const std::string header = U64(kShmSegmentMagic) + U64(nonce | 1) + U32(1) + U32(1) + U32(16) +
                             U32(65536) + U32(0) + U32(0) + U64(4096);
  ASSERT_EQ(static_cast<ssize_t>(header.size()), pwrite(segment, header.data(), header.size(), 0));
  int control = -1;
  JoinAndLie(port, address, {name, -1, 0}, &control);
  ASSERT_GE(control, 0);
  // Rank 0's record (gather #0's result) names its segment.
  Fields result{ReadFrame(control, 10000)};
  ASSERT_EQ(3u, result.U32());  // kGatherResult
  result.U32();
  result.U32();
  result.U64();
  ASSERT_EQ(2u, result.U32());
  Fields rank0_record{result.Str()};
  for (int i = 0; i < 5; ++i) rank0_record.Str();
  const std::string rank0_segment = rank0_record.Str();
  ASSERT_TRUE(rank0_record.ok);
  const int theirs = shm_open(rank0_segment.c_str(), O_RDWR | O_CLOEXEC, 0);
  ASSERT_GE(theirs, 0) << rank0_segment;
  struct stat st {};
  ASSERT_EQ(0, fstat(theirs, &st));
  auto* base = static_cast<uint8_t*>(mmap(nullptr, static_cast<size_t>(st.st_size),
                                          PROT_READ | PROT_WRITE, MAP_SHARED, theirs, 0));
  close(theirs);
  ASSERT_NE(MAP_FAILED, base);
  // Find the ring rank 0 keeps for rank 1; its first slot: sequence 1, a
  // 100000-byte fragment (a slot holds 65496).
  uint64_t ring = 0;
  for (uint32_t i = 0; i < 1; ++i) {
    uint32_t sender = 0;
    std::memcpy(&sender, base + 32 + 16 * i, 4);
    if (sender == 1) std::memcpy(&ring, base + 32 + 16 * i + 8, 8);
  }
  ASSERT_NE(0u, ring);
  uint8_t* slot = base + ring + 64;
  const std::string fragment = U64(0) + U64(100000) + U64(0) + U32(100000) + U32(0);
  std::memcpy(slot + 8, fragment.data(), fragment.size());
  const uint64_t one = 1;
  std::memcpy(slot, &one, sizeof(one));
  // The barrier that ends init (gather #1).
  ASSERT_TRUE(SendAll(control, U32(2) + U32(1) + U32(0) + U64(1) + Str("")));
  std::string line;
  EXPECT_TRUE(rank0->WaitForLine("failed ", kTimeoutMs, &line)) << rank0->output();
  EXPECT_NE(std::string::npos, line.find("TERN_ERROR_COMM_TRANSPORT")) << line;
  EXPECT_NE(std::string::npos, line.find("rank 1 wrote an invalid fragment")) << line;
  munmap(base, static_cast<size_t>(st.st_size));
  close(control);
  close(segment);
  shm_unlink(name.c_str());
  rank0->Wait(kTimeoutMs);
}

}  // namespace
}  // namespace tern_test
