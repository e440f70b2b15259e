#include "bootstrap.h"

#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "common/logging.h"
#include "common/thread_name.h"
#include "common/timeline.h"
#include "pending_connections.h"

namespace tern::comm {
namespace {

constexpr char kIdMagic[8] = {'T', 'E', 'R', 'N', 'C', 'I', 'D', '2'};
constexpr char kOldIdMagic[8] = {'T', 'E', 'R', 'N', 'C', 'I', 'D', '1'};
constexpr uint32_t kHelloMagic = 0x54524e42;  // "TRNB"
constexpr uint32_t kProtocolVersion = 2;      // 2: authenticated (challenge and proofs)
constexpr uint32_t kReplyTable = 0;
// A hello is an identity of a few short strings.
constexpr uint32_t kMaxHello = 64u << 10;
// Connections that may wait to authenticate at once (more are closed).
constexpr size_t kMaxPending = 1024;

struct PackedId {
  char magic[8];
  uint64_t nonce;
  uint32_t address_length;
  uint32_t reserved;
  unsigned char address[sizeof(sockaddr_in6)];
  unsigned char secret[32];
};
static_assert(sizeof(PackedId) <= TERN_COMM_UNIQUE_ID_BYTES);

std::string ErrorReply(const Status& status) {
  Writer w;
  w.U32(static_cast<uint32_t>(status.code())).Str(status.message());
  return w.data();
}

// The root's state, owned by its thread.
class Root {
 public:
  Root(int listen_fd, uint64_t nonce, const Secret& secret, uint64_t deadline_ns,
       std::string address, std::string remove_when_done)
      : listen_fd_(listen_fd),
        nonce_(nonce),
        secret_(secret),
        deadline_ns_(deadline_ns),
        address_(std::move(address)),
        remove_when_done_(std::move(remove_when_done)),
        pending_(listen_fd, kHelloMagic, kProtocolVersion, kMaxPending, kMaxHello) {}
  ~Root() {
    for (auto& client : clients_) {
      if (client.fd >= 0) close(client.fd);
    }
    close(listen_fd_);
    if (!remove_when_done_.empty()) unlink(remove_when_done_.c_str());
  }
  void Run();

 private:
  struct Client {
    int fd = -1;
    RankIdentity identity;
    std::string challenge;         // ours, sent in the greeting
    std::string client_challenge;  // theirs, from the hello
  };
  PendingConnections::Verdict Hello(PendingConnections::Connection& conn, std::string_view frame,
                                    std::string* reason);
  void ReadJoined(size_t index);
  void Fail(const Status& status);
  void SendTables();
  std::string Joined() const;

  int listen_fd_;
  uint64_t nonce_;
  Secret secret_;
  uint64_t deadline_ns_;
  std::string address_;
  std::string remove_when_done_;
  PendingConnections pending_;
  uint32_t size_ = 0;  // from the first rank that joins
  uint32_t first_rank_ = 0;
  std::vector<Client> clients_;  // ranks that joined (authenticated)
  std::map<uint32_t, size_t> by_rank_;
  Status failure_;
  bool done_ = false;
};

void Root::Run() {
  std::vector<pollfd> fds;
  while (!done_) {
    const uint64_t now = MonotonicNs();
    if (now >= deadline_ns_) {
      if (failure_.ok()) {
        std::string missing;
        uint32_t missing_count = 0;
        for (uint32_t r = 0; r < size_; ++r) {
          if (by_rank_.count(r)) continue;
          if (++missing_count <= 16) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
        }
        if (missing_count > 16) missing += fmt::format(" and {} more", missing_count - 16);
        const std::string refused = pending_.Summary();
        Fail(MakeStatus(
            TERN_ERROR_COMM_TIMEOUT,
            "the bootstrap root at {} gave up waiting: rank(s) {} of {} never joined "
            "(joined: {}){}; start every rank with the same unique id and size, or raise "
            "TERN_COMM_INIT_TIMEOUT",
            address_, missing, size_, Joined(),
            refused.empty() ? std::string() : fmt::format("; meanwhile it refused: {}", refused)));
      }
      return;
    }
    // Joined clients keep their index for the root's lifetime (by_rank_
    // refers to them); closed ones stay as fd -1 and are skipped.
    fds.clear();
    int wait_ms = pending_.AddPollFds(&fds, now);
    const size_t first_joined = fds.size();
    std::vector<size_t> which;
    for (size_t i = 0; i < clients_.size(); ++i) {
      if (clients_[i].fd < 0) continue;
      fds.push_back({clients_[i].fd, POLLIN, 0});
      which.push_back(i);
    }
    const int until_deadline =
        static_cast<int>(std::min<uint64_t>((deadline_ns_ - now) / 1000000 + 1, 1000));
    if (wait_ms < 0 || wait_ms > until_deadline) wait_ms = until_deadline;
    const int rc = poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) {
      Fail(ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno,
                       fmt::format("poll in the bootstrap root at {}", address_)));
      return;
    }
    for (size_t i = 0; rc > 0 && i < which.size() && !done_; ++i) {
      if (fds[first_joined + i].revents != 0) ReadJoined(which[i]);
    }
    if (done_) break;
    pending_.Service(fds, 0, MonotonicNs(),
                     [this](PendingConnections::Connection& conn, std::string_view frame,
                            std::string* reason) { return Hello(conn, frame, reason); });
  }
}

// A rank that joined sends nothing more before the table; a readable socket
// means it went away.
void Root::ReadJoined(size_t index) {
  Client& client = clients_[index];
  char scratch[256];
  const ssize_t n = recv(client.fd, scratch, sizeof(scratch), MSG_DONTWAIT);
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) return;
  // A rank that joined and went away before the table: the others cannot
  // complete; say so instead of waiting for the deadline.
  Fail(MakeStatus(TERN_ERROR_COMM_PEER_LOST,
                  "rank {} (host {}, pid {}) disconnected from the bootstrap root at {} before "
                  "every rank joined (the process exited or was killed)",
                  client.identity.rank, client.identity.host, client.identity.pid, address_));
  if (client.fd >= 0) close(client.fd);
  client.fd = -1;
}

PendingConnections::Verdict Root::Hello(PendingConnections::Connection& conn,
                                        std::string_view frame, std::string* reason) {
  using Verdict = PendingConnections::Verdict;
  auto reject = [&](const Status& why) {
    (void)SendFrame(conn.fd, ErrorReply(why), MonotonicNs() + 100000000ull);
    return Verdict::kRefuse;
  };
  Reader outer(frame);
  const std::string body = outer.Str();
  const std::string mac = outer.Str();
  Reader r(body);
  const uint32_t magic = r.U32();
  const uint32_t version = r.U32();
  if (!outer.ok() || magic != kHelloMagic) {
    *reason = "sent something other than a tern bootstrap hello";
    return reject(MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                             "not a tern bootstrap hello (bootstrap protocol {} with a challenge "
                             "and proof): is this tern version the root's?",
                             kProtocolVersion));
  }
  if (version != kProtocolVersion) {
    *reason = fmt::format("spoke bootstrap protocol {}", version);
    return reject(MakeStatus(TERN_ERROR_INCOMPATIBLE,
                             "the rank speaks bootstrap protocol {} but the root at {} speaks {}: "
                             "use the same tern version on every rank",
                             version, address_, kProtocolVersion));
  }
  // The proof first: nothing of a hello without it is believed or answered
  // beyond the refusal.
  if (!ProofMatches(Prove(secret_, "join", {conn.challenge, body}), mac)) {
    *reason = "failed authentication (no proof of the communicator's secret)";
    return reject(MakeStatus(
        TERN_ERROR_COMM_TRANSPORT,
        "the bootstrap root at {} refused the connection from {}: its hello does not prove "
        "knowledge of this communicator's secret (a stale or foreign unique id, or a different "
        "TERN_COMM_SECRET): give every rank the same unique id, or the same TERN_COMM_SECRET",
        address_, conn.peer));
  }
  const uint64_t nonce = r.U64();
  const uint32_t size = r.U32();
  RankIdentity identity;
  const bool identity_ok = identity.Read(r);
  const std::string client_challenge = r.Str();
  if (!identity_ok || !r.ok() || client_challenge.size() != kChallengeBytes) {
    *reason = "sent a malformed hello";
    return reject(
        MakeStatus(TERN_ERROR_COMM_TRANSPORT, "malformed bootstrap hello from {}", conn.peer));
  }
  if (nonce != nonce_) {
    *reason = "named another communicator";
    return reject(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "the unique id does not match the communicator the bootstrap root "
                             "at {} serves (a stale or foreign id): use the id of this "
                             "communicator",
                             address_));
  }
  if (!failure_.ok()) {
    *reason = "came after the bootstrap had failed";
    return reject(failure_);
  }
  if (done_) {
    *reason = "came after every rank had joined";
    return reject(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                             "rank {} came to the bootstrap root at {} after all {} ranks had "
                             "joined: give every process its own rank",
                             identity.rank, address_, size_));
  }
  if (size == 0) {
    *reason = "joined with size 0";
    return reject(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "size 0 is not a communicator size"));
  }
  if (size_ == 0) {
    size_ = size;
    first_rank_ = identity.rank;
  } else if (size != size_) {
    Fail(
        MakeStatus(TERN_ERROR_COMM_MISMATCH,
                   "rank {} (host {}, pid {}) joined with size {} but rank {} joined with size {}: "
                   "every rank must pass the same size",
                   identity.rank, identity.host, identity.pid, size, first_rank_, size_));
    *reason = "joined with another size";
    return reject(failure_);
  }
  if (identity.rank >= size_) {
    *reason = "joined with a rank out of range";
    return reject(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "rank {} is out of range for size {}",
                             identity.rank, size_));
  }
  if (auto it = by_rank_.find(identity.rank); it != by_rank_.end()) {
    const RankIdentity& first = clients_[it->second].identity;
    Fail(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                    "rank {} joined twice: from host {} pid {} and from host {} pid {}; give every "
                    "process its own rank",
                    identity.rank, first.host, first.pid, identity.host, identity.pid));
    *reason = "joined as a rank that had joined already";
    return reject(failure_);
  }
  Client client;
  client.fd = conn.fd;
  client.identity = std::move(identity);
  client.challenge = conn.challenge;
  client.client_challenge = client_challenge;
  clients_.push_back(std::move(client));
  by_rank_[clients_.back().identity.rank] = clients_.size() - 1;
  if (by_rank_.size() == size_) SendTables();
  return Verdict::kKeep;
}

std::string Root::Joined() const {
  std::string text;
  for (const auto& [rank, index] : by_rank_) {
    const RankIdentity& id = clients_[index].identity;
    text += fmt::format("{}rank {} from host {} pid {}", text.empty() ? "" : ", ", rank, id.host,
                        id.pid);
  }
  return text.empty() ? "none" : text;
}

void Root::Fail(const Status& status) {
  if (!failure_.ok()) return;
  failure_ = status;
  const std::string reply = ErrorReply(status);
  for (Client& client : clients_) {
    if (client.fd >= 0) {
      (void)SendFrame(client.fd, reply, MonotonicNs() + 1000000000ull);
      close(client.fd);
      client.fd = -1;
    }
  }
  by_rank_.clear();
}

void Root::SendTables() {
  Writer table;
  table.U32(size_);
  for (const auto& [rank, index] : by_rank_) clients_[index].identity.Write(table);
  const uint64_t deadline = MonotonicNs() + 5000000000ull;
  for (const auto& [rank, index] : by_rank_) {
    const Client& client = clients_[index];
    const Sha256Digest proof =
        Prove(secret_, "table", {client.client_challenge, client.challenge, table.data()});
    Writer w;
    w.U32(kReplyTable)
        .Str(table.data())
        .Str(std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
    (void)SendFrame(client.fd, w.data(), deadline);
  }
  done_ = true;
}

}  // namespace

void RankIdentity::Write(Writer& w) const {
  w.U32(rank).U32(pid).U64(process_key).Str(host).Str(node_key).Str(ctrl_address);
}

bool RankIdentity::Read(Reader& r) {
  rank = r.U32();
  pid = r.U32();
  process_key = r.U64();
  host = r.Str();
  node_key = r.Str();
  ctrl_address = r.Str();
  return r.ok();
}

Status EncodeUniqueId(const UniqueId& id, tern_comm_unique_id_t* out) {
  std::memset(out, 0, sizeof(*out));
  PackedId packed{};
  std::memcpy(packed.magic, kIdMagic, sizeof(kIdMagic));
  packed.nonce = id.nonce;
  if (id.root.length > sizeof(packed.address)) {
    return MakeStatus(TERN_ERROR_INTERNAL, "bootstrap address of {} bytes does not fit a unique id",
                      id.root.length);
  }
  packed.address_length = id.root.length;
  std::memcpy(packed.address, &id.root.storage, id.root.length);
  std::memcpy(packed.secret, id.secret.bytes.data(), sizeof(packed.secret));
  std::memcpy(out->internal, &packed, sizeof(packed));
  return OkStatus();
}

Status DecodeUniqueId(const tern_comm_unique_id_t& in, UniqueId* out) {
  PackedId packed;
  std::memcpy(&packed, in.internal, sizeof(packed));
  if (std::memcmp(packed.magic, kOldIdMagic, sizeof(kOldIdMagic)) == 0) {
    return MakeStatus(TERN_ERROR_INCOMPATIBLE,
                      "the unique id was made by an older tern (one without a secret, whose "
                      "bootstrap accepts anyone): make the id with this version's "
                      "tern_comm_get_unique_id() and use the same tern version on every rank");
  }
  if (std::memcmp(packed.magic, kIdMagic, sizeof(kIdMagic)) != 0 || packed.address_length == 0 ||
      packed.address_length > sizeof(packed.address)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "the unique id is not one tern_comm_get_unique_id() made (wrong magic or "
                      "address): pass the id bytes unchanged to every rank");
  }
  out->nonce = packed.nonce;
  out->root = SockAddr{};
  std::memcpy(&out->root.storage, packed.address, packed.address_length);
  out->root.length = packed.address_length;
  std::memcpy(out->secret.bytes.data(), packed.secret, sizeof(packed.secret));
  out->has_secret = true;
  out->secret_file.clear();
  return OkStatus();
}

Status StartBootstrapRoot(const SockAddr& bind_addr, uint64_t nonce, const Secret& secret,
                          uint64_t timeout_ns, std::string remove_when_done, SockAddr* out_bound) {
  int fd = -1;
  SockAddr bound;
  TERN_RETURN_IF_ERROR(Listen(bind_addr, &fd, &bound));
  // A wildcard bind still needs a connectable address in the id.
  *out_bound = bound;
  auto root = std::make_shared<Root>(fd, nonce, secret, MonotonicNs() + timeout_ns,
                                     bound.ToString(), std::move(remove_when_done));
  std::thread([root] {
    NameThisThread("tern-bootstrap");
    root->Run();
  }).detach();
  return OkStatus();
}

Status CreateUniqueId(uint64_t timeout_ns, const Secret* secret, UniqueId* out) {
  SockAddr addr;
  std::string ifname;
  TERN_RETURN_IF_ERROR(PickInterfaceAddress(&addr, &ifname));
  TERN_RETURN_IF_ERROR(RandomBytes(&out->nonce, sizeof(out->nonce)));
  out->nonce |= 1;  // never 0
  if (secret != nullptr) {
    out->secret = *secret;
  } else {
    TERN_RETURN_IF_ERROR(GenerateSecret(&out->secret));
  }
  out->has_secret = true;
  TERN_RETURN_IF_ERROR(
      StartBootstrapRoot(addr, out->nonce, out->secret, timeout_ns, std::string(), &out->root)
          .WithContext(fmt::format("starting the bootstrap root on {}", ifname)));
  TERN_LOG_DEBUG("bootstrap root for nonce {:#x} at {} ({})", out->nonce, out->root.ToString(),
                 ifname);
  return OkStatus();
}

Status JoinBootstrap(UniqueId* id, uint32_t size, RankIdentity* self, uint64_t deadline_ns,
                     const std::function<Status(const SockAddr& local)>& prepare,
                     std::vector<RankIdentity>* out_table) {
  const std::string root = id->root.ToString();
  int fd = -1;
  Status status = Connect(id->root, deadline_ns, "the bootstrap root", &fd);
  if (!status.ok()) {
    return Status(
        status.code(),
        fmt::format("{}; the root runs in the process that called "
                    "tern_comm_get_unique_id() (or in rank 0 for tern_comm_init_from_env) "
                    "and serves until every rank joined or its init timeout passed: is it "
                    "running, and is {} reachable from host {}?",
                    status.message(), root, HostName()));
  }
  auto closer = std::unique_ptr<int, void (*)(int*)>(&fd, [](int* f) { close(*f); });
  std::string greeting;
  status = RecvFrame(fd, deadline_ns, &greeting);
  Reader g(greeting);
  const uint32_t magic = g.U32();
  const uint32_t version = g.U32();
  const std::string challenge = g.Str();
  if (!status.ok() || !g.ok() || magic != kHelloMagic || version != kProtocolVersion ||
      challenge.size() != kChallengeBytes) {
    return MakeStatus(
        status.ok() ? TERN_ERROR_INCOMPATIBLE : status.code(),
        "rank {} connected to {} but got no greeting of tern bootstrap protocol {} ({}): is "
        "that the bootstrap root of this communicator, running this tern version?",
        self->rank, root, kProtocolVersion,
        status.ok() ? fmt::format("got magic {:#x} protocol {}", magic, version)
                    : status.message());
  }
  if (!id->has_secret) {
    // The root is up, so rank 0 wrote its secret before starting it.
    status = ReadHostSecret(id->secret_file, &id->secret);
    if (!status.ok()) {
      return MakeStatus(
          TERN_ERROR_INVALID_ARGUMENT,
          "rank {} has no secret for the bootstrap root at {}: set TERN_COMM_SECRET (or "
          "TERN_COMM_SECRET_FILE) to the same value on every rank (at least 32 hex digits, e.g. "
          "from 'openssl rand -hex 32'); without it only ranks on rank 0's host can join, "
          "reading the secret rank 0 leaves in {} ({})",
          self->rank, root, id->secret_file, status.message());
    }
    id->has_secret = true;
  }
  SockAddr local;
  TERN_RETURN_IF_ERROR(LocalAddress(fd, &local));
  TERN_RETURN_IF_ERROR(prepare(local));
  std::string my_challenge;
  TERN_RETURN_IF_ERROR(NewChallenge(&my_challenge));
  Writer body;
  body.U32(kHelloMagic).U32(kProtocolVersion).U64(id->nonce).U32(size);
  self->Write(body);
  body.Str(my_challenge);
  const Sha256Digest proof = Prove(id->secret, "join", {challenge, body.data()});
  Writer hello;
  hello.Str(body.data())
      .Str(std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
  TERN_RETURN_IF_ERROR(SendFrame(fd, hello.data(), deadline_ns)
                           .WithContext(fmt::format("joining the bootstrap root at {}", root)));
  // The root explains a timeout itself when its own deadline passes; give
  // its message a moment to arrive before reporting ours.
  std::string reply;
  bool eof = false;
  status = RecvFrame(fd, deadline_ns + 2000000000ull, &reply, &eof);
  if (!status.ok()) {
    if (status.code() == TERN_ERROR_COMM_TIMEOUT) {
      return MakeStatus(TERN_ERROR_COMM_TIMEOUT,
                        "rank {} of {} joined the bootstrap root at {} but the other ranks did not "
                        "all join in time; start every rank with the same unique id and size, or "
                        "raise TERN_COMM_INIT_TIMEOUT",
                        self->rank, size, root);
    }
    return MakeStatus(status.code(),
                      "the bootstrap root at {} went away before sending the rank table ({}); the "
                      "process that serves it exited or was killed",
                      root, status.message());
  }
  Reader r(reply);
  const uint32_t code = r.U32();
  if (code != kReplyTable) {
    std::string message = r.Str();
    return Status(static_cast<tern_status_t>(code), message);
  }
  const std::string table = r.Str();
  const std::string mac = r.Str();
  if (!r.ok() || !ProofMatches(Prove(id->secret, "table", {my_challenge, challenge, table}), mac)) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "the rank table from {} does not prove knowledge of this communicator's "
                      "secret: something other than this communicator's bootstrap root answered "
                      "there; rank {} does not trust it",
                      root, self->rank);
  }
  Reader t(table);
  const uint32_t count = t.U32();
  if (count != size) {
    return MakeStatus(TERN_ERROR_INTERNAL, "bootstrap table has {} ranks, expected {}", count,
                      size);
  }
  out_table->assign(count, RankIdentity{});
  std::vector<bool> seen(count, false);
  for (uint32_t i = 0; i < count; ++i) {
    RankIdentity identity;
    if (!identity.Read(t) || identity.rank >= count || seen[identity.rank]) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "malformed rank table from the bootstrap root at {}", root);
    }
    seen[identity.rank] = true;
    (*out_table)[identity.rank] = std::move(identity);
  }
  return OkStatus();
}

}  // namespace tern::comm
