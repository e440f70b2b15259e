#include "bootstrap.h"

#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "common/logging.h"
#include "common/timeline.h"

namespace tern::comm {
namespace {

constexpr char kIdMagic[8] = {'T', 'E', 'R', 'N', 'C', 'I', 'D', '1'};
constexpr uint32_t kHelloMagic = 0x54524e42;  // "TRNB"
constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kReplyTable = 0;

struct PackedId {
  char magic[8];
  uint64_t nonce;
  uint32_t address_length;
  uint32_t reserved;
  unsigned char address[sizeof(sockaddr_in6)];
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
  Root(int listen_fd, uint64_t nonce, uint64_t deadline_ns, std::string address)
      : listen_fd_(listen_fd),
        nonce_(nonce),
        deadline_ns_(deadline_ns),
        address_(std::move(address)) {}
  ~Root() {
    for (auto& client : clients_) {
      if (client.fd >= 0) close(client.fd);
    }
    close(listen_fd_);
  }
  void Run();

 private:
  struct Client {
    int fd = -1;
    bool joined = false;
    RankIdentity identity;
  };
  void Accept();
  void Receive(size_t index);
  void Fail(const Status& status);
  void SendTables();
  std::string Joined() const;

  int listen_fd_;
  uint64_t nonce_;
  uint64_t deadline_ns_;
  std::string address_;
  uint32_t size_ = 0;  // from the first rank that joins
  uint32_t first_rank_ = 0;
  std::vector<Client> clients_;
  std::map<uint32_t, size_t> by_rank_;
  Status failure_;
  bool done_ = false;
};

void Root::Run() {
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
        Fail(MakeStatus(TERN_ERROR_COMM_TIMEOUT,
                        "the bootstrap root at {} gave up waiting: rank(s) {} of {} never joined "
                        "(joined: {}); start every rank with the same unique id and size, or raise "
                        "TERN_COMM_INIT_TIMEOUT",
                        address_, missing, size_, Joined()));
      }
      return;
    }
    // Clients keep their index for the root's lifetime (by_rank_ refers to
    // them); closed ones stay as fd -1 and are skipped.
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    fds.push_back({listen_fd_, POLLIN, 0});
    for (size_t i = 0; i < clients_.size(); ++i) {
      if (clients_[i].fd < 0) continue;
      fds.push_back({clients_[i].fd, POLLIN, 0});
      which.push_back(i);
    }
    const uint64_t wait_ms = std::min<uint64_t>((deadline_ns_ - now) / 1000000 + 1, 1000);
    const int rc = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (rc <= 0) continue;
    for (size_t i = 1; i < fds.size() && !done_; ++i) {
      if (fds[i].revents != 0) Receive(which[i - 1]);
    }
    if (fds[0].revents != 0 && !done_) Accept();
  }
}

void Root::Accept() {
  int fd = -1;
  if (!comm::Accept(listen_fd_, MonotonicNs(), &fd).ok()) return;
  clients_.push_back(Client{fd});
}

void Root::Receive(size_t index) {
  Client& client = clients_[index];
  std::string frame;
  bool eof = false;
  Status status = RecvFrame(client.fd, MonotonicNs() + 1000000000ull, &frame, &eof);
  if (!status.ok()) {
    if (client.joined) {
      // A rank that joined and went away before the table: the others cannot
      // complete; say so instead of waiting for the deadline.
      Fail(MakeStatus(TERN_ERROR_COMM_PEER_LOST,
                      "rank {} (host {}, pid {}) disconnected from the bootstrap root at {} before "
                      "every rank joined (the process exited or was killed)",
                      client.identity.rank, client.identity.host, client.identity.pid, address_));
    }
    close(client.fd);
    client.fd = -1;
    return;
  }
  if (client.joined) return;  // nothing else is expected before the table
  Reader r(frame);
  const uint32_t magic = r.U32();
  const uint32_t version = r.U32();
  const uint64_t nonce = r.U64();
  const uint32_t size = r.U32();
  RankIdentity identity;
  const bool read_ok = identity.Read(r) && r.ok();
  auto reject = [&](const Status& why) {
    (void)SendFrame(client.fd, ErrorReply(why), MonotonicNs() + 1000000000ull);
    close(client.fd);
    client.fd = -1;
  };
  if (magic != kHelloMagic || !read_ok) {
    reject(MakeStatus(TERN_ERROR_COMM_TRANSPORT, "not a tern bootstrap message"));
    return;
  }
  if (version != kProtocolVersion) {
    reject(MakeStatus(TERN_ERROR_INCOMPATIBLE,
                      "the rank speaks bootstrap protocol {} but the root at {} speaks {}: use the "
                      "same tern version on every rank",
                      version, address_, kProtocolVersion));
    return;
  }
  if (nonce != nonce_) {
    reject(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "the unique id does not match the communicator the bootstrap root at {} "
                      "serves (a stale or foreign id): use the id of this communicator",
                      address_));
    return;
  }
  if (!failure_.ok()) {
    reject(failure_);
    return;
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
    reject(failure_);
    return;
  }
  if (identity.rank >= size_) {
    reject(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "rank {} is out of range for size {}",
                      identity.rank, size_));
    return;
  }
  if (auto it = by_rank_.find(identity.rank); it != by_rank_.end()) {
    const RankIdentity& first = clients_[it->second].identity;
    Fail(MakeStatus(TERN_ERROR_COMM_MISMATCH,
                    "rank {} joined twice: from host {} pid {} and from host {} pid {}; give every "
                    "process its own rank",
                    identity.rank, first.host, first.pid, identity.host, identity.pid));
    reject(failure_);
    return;
  }
  client.joined = true;
  client.identity = std::move(identity);
  by_rank_[client.identity.rank] = index;
  if (by_rank_.size() == size_) SendTables();
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
    if (client.fd >= 0 && client.joined) {
      (void)SendFrame(client.fd, reply, MonotonicNs() + 1000000000ull);
      close(client.fd);
      client.fd = -1;
    }
  }
  by_rank_.clear();
}

void Root::SendTables() {
  Writer w;
  w.U32(kReplyTable).U32(size_);
  for (const auto& [rank, index] : by_rank_) clients_[index].identity.Write(w);
  const uint64_t deadline = MonotonicNs() + 5000000000ull;
  for (const auto& [rank, index] : by_rank_)
    (void)SendFrame(clients_[index].fd, w.data(), deadline);
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
  std::memcpy(out->internal, &packed, sizeof(packed));
  return OkStatus();
}

Status DecodeUniqueId(const tern_comm_unique_id_t& in, UniqueId* out) {
  PackedId packed;
  std::memcpy(&packed, in.internal, sizeof(packed));
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
  return OkStatus();
}

Status StartBootstrapRoot(const SockAddr& bind_addr, uint64_t nonce, uint64_t timeout_ns,
                          SockAddr* out_bound) {
  int fd = -1;
  SockAddr bound;
  TERN_RETURN_IF_ERROR(Listen(bind_addr, &fd, &bound));
  // A wildcard bind still needs a connectable address in the id.
  *out_bound = bound;
  auto root = std::make_shared<Root>(fd, nonce, MonotonicNs() + timeout_ns, bound.ToString());
  std::thread([root] { root->Run(); }).detach();
  return OkStatus();
}

Status CreateUniqueId(uint64_t timeout_ns, UniqueId* out) {
  SockAddr addr;
  std::string ifname;
  TERN_RETURN_IF_ERROR(PickInterfaceAddress(&addr, &ifname));
  out->nonce = RandomU64() | 1;  // never 0
  TERN_RETURN_IF_ERROR(StartBootstrapRoot(addr, out->nonce, timeout_ns, &out->root)
                           .WithContext(fmt::format("starting the bootstrap root on {}", ifname)));
  TERN_LOG_DEBUG("bootstrap root for nonce {:#x} at {} ({})", out->nonce, out->root.ToString(),
                 ifname);
  return OkStatus();
}

Status JoinBootstrap(const UniqueId& id, uint32_t size, RankIdentity* self, uint64_t deadline_ns,
                     const std::function<Status(const SockAddr& local)>& prepare,
                     std::vector<RankIdentity>* out_table) {
  const std::string root = id.root.ToString();
  int fd = -1;
  Status status = Connect(id.root, deadline_ns, "the bootstrap root", &fd);
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
  SockAddr local;
  TERN_RETURN_IF_ERROR(LocalAddress(fd, &local));
  TERN_RETURN_IF_ERROR(prepare(local));
  Writer w;
  w.U32(kHelloMagic).U32(kProtocolVersion).U64(id.nonce).U32(size);
  self->Write(w);
  TERN_RETURN_IF_ERROR(SendFrame(fd, w.data(), deadline_ns)
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
  const uint32_t count = r.U32();
  if (count != size) {
    return MakeStatus(TERN_ERROR_INTERNAL, "bootstrap table has {} ranks, expected {}", count,
                      size);
  }
  out_table->assign(count, RankIdentity{});
  for (uint32_t i = 0; i < count; ++i) {
    RankIdentity identity;
    if (!identity.Read(r) || identity.rank >= count) {
      return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                        "malformed rank table from the bootstrap root at {}", root);
    }
    (*out_table)[identity.rank] = std::move(identity);
  }
  return OkStatus();
}

}  // namespace tern::comm
