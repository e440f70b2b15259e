#include "control.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/logging.h"
#include "common/thread_name.h"
#include "common/timeline.h"
#include "pending_connections.h"

namespace tern::comm {
namespace {
constexpr uint32_t kCtrlMagic = 0x54524e43;  // "TRNC"
constexpr uint32_t kCtrlVersion = 2;         // 2: authenticated
constexpr uint32_t kMaxCtrlHello = 4096;
constexpr uint64_t kFrameDeadlineNs = 2000000000ull;
}  // namespace

ControlPlane::ControlPlane(uint32_t rank, uint32_t size, uint64_t nonce, std::string label)
    : rank_(rank), size_(size), nonce_(nonce), label_(std::move(label)), departed_(size, false) {}

ControlPlane::~ControlPlane() {
  Close(false);
  if (listen_fd_ >= 0) close(listen_fd_);
}

Status ControlPlane::OpenListener(const SockAddr& local, std::string* out_address) {
  SockAddr addr = local;
  if (addr.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&addr.storage)->sin_port = 0;
  } else if (addr.storage.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&addr.storage)->sin6_port = 0;
  }
  SockAddr bound;
  TERN_RETURN_IF_ERROR(Listen(addr, &listen_fd_, &bound));
  *out_address = bound.ToString();
  return OkStatus();
}

Status ControlPlane::Connect(const std::vector<RankIdentity>& table, const Secret& secret,
                             uint64_t deadline_ns, Callbacks callbacks) {
  callbacks_ = std::move(callbacks);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "eventfd");
  if (rank_ == 0) {
    TERN_RETURN_IF_ERROR(AcceptRanks(table, secret, deadline_ns));
  } else {
    TERN_RETURN_IF_ERROR(ConnectToRankZero(table, secret, deadline_ns));
  }
  monitor_ = std::thread([this] {
    NameThisThread("tern-comm-ctrl");
    Monitor();
  });
  return OkStatus();
}

// Rank 0: every other rank connects and proves knowledge of the secret;
// connections are served concurrently, so a stray or idle one delays no
// rank (it is dropped after kHandshakeTimeoutNs).
Status ControlPlane::AcceptRanks(const std::vector<RankIdentity>& table, const Secret& secret,
                                 uint64_t deadline_ns) {
  links_.resize(size_);
  for (auto& link : links_) link = std::make_unique<Link>();
  PendingConnections pending(listen_fd_, kCtrlMagic, kCtrlVersion, 4 * size_ + 64, kMaxCtrlHello);
  uint32_t connected = 0;
  std::vector<pollfd> fds;
  auto hello = [&](PendingConnections::Connection& conn, std::string_view frame,
                   std::string* reason) {
    using Verdict = PendingConnections::Verdict;
    auto refuse = [&](const std::string& why, const std::string& message) {
      *reason = why;
      Writer w;
      w.U32(static_cast<uint32_t>(TERN_ERROR_COMM_TRANSPORT)).Str(message);
      (void)SendFrame(conn.fd, w.data(), MonotonicNs() + 100000000ull);
      return Verdict::kRefuse;
    };
    Reader outer(frame);
    const std::string body = outer.Str();
    const std::string mac = outer.Str();
    if (!outer.ok()) {
      return refuse("sent something other than a tern control hello", "not a tern control hello");
    }
    if (!ProofMatches(Prove(secret, "ctrl", {conn.challenge, body}), mac)) {
      return refuse("failed authentication (no proof of the communicator's secret)",
                    fmt::format("rank 0 of {} refused the control connection from {}: it does not "
                                "prove knowledge of the communicator's secret",
                                label_, conn.peer));
    }
    Reader r(body);
    const uint32_t magic = r.U32();
    const uint64_t nonce = r.U64();
    const uint32_t from = r.U32();
    const std::string client_challenge = r.Str();
    if (!r.ok() || magic != kCtrlMagic || nonce != nonce_ || from == 0 || from >= size_ ||
        client_challenge.size() != kChallengeBytes) {
      return refuse("sent a malformed control hello",
                    fmt::format("malformed control hello for communicator {}", label_));
    }
    if (links_[from]->fd >= 0) {
      return refuse(fmt::format("claimed rank {}, which was connected already", from),
                    fmt::format("rank {} is connected to rank 0 already", from));
    }
    const Sha256Digest proof = Prove(secret, "ctrl-ok", {client_challenge, conn.challenge});
    Writer w;
    w.U32(0).Str(std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
    if (!SendFrame(conn.fd, w.data(), MonotonicNs() + kFrameDeadlineNs).ok()) {
      *reason = "closed the connection after its hello";
      return Verdict::kRefuse;
    }
    links_[from]->fd = conn.fd;
    ++connected;
    return Verdict::kKeep;
  };
  while (connected + 1 < size_) {
    const uint64_t now = MonotonicNs();
    if (now >= deadline_ns) {
      std::string missing;
      for (uint32_t r = 1; r < size_; ++r) {
        if (links_[r]->fd < 0)
          missing += fmt::format("{}{} ({})", missing.empty() ? "" : ", ", r, table[r].host);
      }
      const std::string refused = pending.Summary();
      return MakeStatus(
          TERN_ERROR_COMM_TIMEOUT,
          "rank 0 of {}: rank(s) {} did not connect to its control listener at {} "
          "in time{}",
          label_, missing, table[0].ctrl_address,
          refused.empty() ? std::string() : fmt::format("; meanwhile it refused: {}", refused));
    }
    fds.clear();
    int wait_ms = pending.AddPollFds(&fds, now);
    const int until_deadline =
        static_cast<int>(std::min<uint64_t>((deadline_ns - now) / 1000000 + 1, 1000));
    if (wait_ms < 0 || wait_ms > until_deadline) wait_ms = until_deadline;
    if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
      return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "poll on the control listener");
    }
    pending.Service(fds, 0, MonotonicNs(), hello);
  }
  close(listen_fd_);
  listen_fd_ = -1;
  return OkStatus();
}

// Other ranks: connect to rank 0, answer its challenge, and check that it
// proves knowledge of the secret too.
Status ControlPlane::ConnectToRankZero(const std::vector<RankIdentity>& table, const Secret& secret,
                                       uint64_t deadline_ns) {
  SockAddr addr;
  TERN_RETURN_IF_ERROR(ParseHostPort(table[0].ctrl_address, &addr));
  const std::string where = fmt::format("rank 0's control listener at {} (host {})",
                                        table[0].ctrl_address, table[0].host);
  links_.resize(1);
  links_[0] = std::make_unique<Link>();
  TERN_RETURN_IF_ERROR(comm::Connect(addr, deadline_ns, where, &links_[0]->fd));
  const int fd = links_[0]->fd;
  std::string greeting;
  Status status = RecvFrame(fd, deadline_ns, &greeting);
  Reader g(greeting);
  const uint32_t magic = g.U32();
  const uint32_t version = g.U32();
  const std::string challenge = g.Str();
  if (!status.ok() || !g.ok() || magic != kCtrlMagic || version != kCtrlVersion ||
      challenge.size() != kChallengeBytes) {
    return MakeStatus(status.ok() ? TERN_ERROR_INCOMPATIBLE : status.code(),
                      "rank {} of {}: {} sent no tern control greeting ({})", rank_, label_, where,
                      status.ok() ? "another protocol" : status.message());
  }
  std::string my_challenge;
  TERN_RETURN_IF_ERROR(NewChallenge(&my_challenge));
  Writer body;
  body.U32(kCtrlMagic).U64(nonce_).U32(rank_).Str(my_challenge);
  const Sha256Digest proof = Prove(secret, "ctrl", {challenge, body.data()});
  Writer hello;
  hello.Str(body.data())
      .Str(std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
  TERN_RETURN_IF_ERROR(SendFrame(fd, hello.data(), deadline_ns).WithContext(where));
  std::string reply;
  status = RecvFrame(fd, deadline_ns, &reply);
  if (!status.ok()) {
    return Status(status.code(), fmt::format("rank {} of {}: {} did not answer its hello: {}",
                                             rank_, label_, where, status.message()));
  }
  Reader r(reply);
  const uint32_t code = r.U32();
  if (code != 0) {
    return Status(static_cast<tern_status_t>(code),
                  fmt::format("rank {} of {}: {} refused it: {}", rank_, label_, where, r.Str()));
  }
  const std::string mac = r.Str();
  if (!r.ok() || !ProofMatches(Prove(secret, "ctrl-ok", {my_challenge, challenge}), mac)) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "rank {} of {}: {} does not prove knowledge of the communicator's secret: "
                      "something other than rank 0 listens there",
                      rank_, label_, where);
  }
  return OkStatus();
}

std::string ControlPlane::Frame(uint32_t type, uint32_t from, uint32_t to,
                                const std::string& body) const {
  Writer w;
  w.U32(type).U32(from).U32(to);
  w.data() += body;
  return w.data();
}

void ControlPlane::SendOn(uint32_t link_rank, const std::string& frame) {
  if (link_rank >= links_.size() || !links_[link_rank]) return;
  Link& link = *links_[link_rank];
  std::lock_guard<std::mutex> lock(link.write_mutex);
  if (link.fd < 0) return;
  // A failed write means the peer is gone; the monitor notices the closed
  // socket and reports it.
  (void)SendFrame(link.fd, frame, MonotonicNs() + kFrameDeadlineNs);
}

void ControlPlane::Send(uint32_t to, uint32_t type, const std::string& body) {
  const std::string frame = Frame(type, rank_, to, body);
  if (rank_ != 0) {
    SendOn(0, frame);
    return;
  }
  if (to == kEveryone) {
    for (uint32_t r = 1; r < size_; ++r) SendOn(r, frame);
  } else {
    SendOn(to, frame);
  }
}

void ControlPlane::Monitor() {
  std::vector<pollfd> fds;
  std::vector<uint32_t> which;
  while (true) {
    fds.clear();
    which.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    for (uint32_t i = 0; i < links_.size(); ++i) {
      if (!links_[i] || links_[i]->fd < 0) continue;
      fds.push_back({links_[i]->fd, POLLIN, 0});
      which.push_back(i);
    }
    const int rc = poll(fds.data(), fds.size(), -1);
    if (rc < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closing_) return;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const uint32_t link_rank = which[i - 1];
      std::string frame;
      Status status = RecvFrame(fds[i].fd, MonotonicNs() + kFrameDeadlineNs, &frame);
      if (!status.ok()) {
        LinkClosed(link_rank);
        continue;
      }
      Handle(link_rank, frame);
    }
  }
}

void ControlPlane::LinkClosed(uint32_t link_rank) {
  {
    std::lock_guard<std::mutex> write_lock(links_[link_rank]->write_mutex);
    if (links_[link_rank]->fd >= 0) close(links_[link_rank]->fd);
    links_[link_rank]->fd = -1;
  }
  const uint32_t peer = rank_ == 0 ? link_rank : 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_ || departed_[peer]) return;
  }
  TERN_LOG_DEBUG("comm {} rank {}: control connection to rank {} closed", label_, rank_, peer);
  if (rank_ == 0) {
    Writer w;
    w.U32(peer);
    Send(kEveryone, kPeerLost, w.data());
  }
  if (callbacks_.on_peer_lost) callbacks_.on_peer_lost(peer);
}

void ControlPlane::Handle(uint32_t link_rank, const std::string& frame) {
  Reader r(frame);
  const uint32_t type = r.U32();
  const uint32_t from = r.U32();
  const uint32_t to = r.U32();
  if (!r.ok() || from >= size_) return;
  if (rank_ == 0) {
    if (from != link_rank) return;  // only ranks speak for themselves
    // Route what is for others.
    if (to == kEveryone) {
      for (uint32_t k = 1; k < size_; ++k) {
        if (k != from) SendOn(k, frame);
      }
    } else if (to != 0) {
      SendOn(to, frame);
      return;
    }
  }
  switch (type) {
    case kGather: {
      if (rank_ != 0) return;
      const uint64_t id = r.U64();
      std::string data = r.Str();
      if (r.ok()) DeliverGather(id, from, std::move(data));
      return;
    }
    case kGatherResult: {
      const uint64_t id = r.U64();
      const uint32_t count = r.U32();
      std::vector<std::string> all;
      for (uint32_t i = 0; i < count && r.ok(); ++i) all.push_back(r.Str());
      if (!r.ok() || count != size_) return;
      std::lock_guard<std::mutex> lock(mutex_);
      gathered_[id] = std::move(all);
      gather_cv_.notify_all();
      return;
    }
    case kAbort: {
      const tern_status_t code = static_cast<tern_status_t>(r.U32());
      std::string message = r.Str();
      if (r.ok() && callbacks_.on_abort)
        callbacks_.on_abort(from, Status(code, std::move(message)));
      return;
    }
    case kBye: {
      // The farewell first: whoever reads departed_ then knows what it said.
      std::string farewell = r.Str();
      if (r.ok() && callbacks_.on_farewell) callbacks_.on_farewell(from, farewell);
      std::lock_guard<std::mutex> lock(mutex_);
      departed_[from] = true;
      return;
    }
    case kPeerLost: {
      const uint32_t lost = r.U32();
      if (r.ok() && lost < size_ && callbacks_.on_peer_lost) callbacks_.on_peer_lost(lost);
      return;
    }
    case kQuery: {
      const uint64_t sequence = r.U64();
      if (!r.ok() || !callbacks_.on_query) return;
      Writer w;
      w.U64(sequence).Str(callbacks_.on_query(sequence));
      Send(from, kAnswer, w.data());
      return;
    }
    case kAnswer: {
      const uint64_t sequence = r.U64();
      std::string answer = r.Str();
      if (r.ok() && callbacks_.on_answer) callbacks_.on_answer(from, sequence, answer);
      return;
    }
    default:
      return;
  }
}

void ControlPlane::DeliverGather(uint64_t id, uint32_t from, std::string data) {
  std::vector<std::string> complete;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slots = gathering_[id];
    auto& have = gathering_have_[id];
    if (slots.empty()) {
      slots.resize(size_);
      have.assign(size_, 0);
    }
    if (have[from]) return;
    have[from] = 1;
    slots[from] = std::move(data);
    for (uint8_t h : have) {
      if (!h) return;
    }
    complete = std::move(slots);
    gathering_.erase(id);
    gathering_have_.erase(id);
  }
  Writer w;
  w.U64(id).U32(size_);
  for (const std::string& s : complete) w.Str(s);
  Send(kEveryone, kGatherResult, w.data());
  std::lock_guard<std::mutex> lock(mutex_);
  gathered_[id] = std::move(complete);
  gather_cv_.notify_all();
}

Status ControlPlane::AllGather(const std::string& mine, uint64_t deadline_ns,
                               std::vector<std::string>* out) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return failure_;
    id = next_gather_++;
  }
  if (size_ == 1) {
    out->assign(1, mine);
    return OkStatus();
  }
  if (rank_ == 0) {
    DeliverGather(id, 0, mine);
  } else {
    Writer w;
    w.U64(id).Str(mine);
    Send(0, kGather, w.data());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  while (!gathered_.count(id)) {
    if (!failure_.ok()) return failure_;
    const uint64_t now = MonotonicNs();
    if (now >= deadline_ns) {
      std::string missing;
      if (rank_ == 0 && gathering_have_.count(id)) {
        for (uint32_t k = 0; k < size_; ++k) {
          if (!gathering_have_[id][k])
            missing += fmt::format("{}{}", missing.empty() ? "" : ", ", k);
        }
      }
      return MakeStatus(
          TERN_ERROR_COMM_TIMEOUT,
          "rank {} of {}: exchange #{} among the ranks did not complete in time{}; every "
          "rank must make the same calls (init, split) on the communicator",
          rank_, label_, id,
          missing.empty() ? std::string() : fmt::format(" (ranks {} did not take part)", missing));
    }
    gather_cv_.wait_for(lock,
                        std::chrono::nanoseconds(std::min<uint64_t>(deadline_ns - now, 100000000)));
  }
  *out = std::move(gathered_[id]);
  gathered_.erase(id);
  return OkStatus();
}

void ControlPlane::BroadcastAbort(const Status& status) {
  Writer w;
  w.U32(static_cast<uint32_t>(status.code())).Str(status.message());
  Send(kEveryone, kAbort, w.data());
}

void ControlPlane::SendQuery(uint32_t to, uint64_t sequence) {
  Writer w;
  w.U64(sequence);
  Send(to, kQuery, w.data());
}

void ControlPlane::FailWaiters(const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_.ok()) failure_ = status;
  gather_cv_.notify_all();
}

bool ControlPlane::Departed(uint32_t rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rank < departed_.size() && departed_[rank];
}

void ControlPlane::Close(bool graceful, const std::string& farewell) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) return;
    closing_ = true;
    if (failure_.ok())
      failure_ = MakeStatus(TERN_ERROR_COMM_ABORTED, "the communicator is closing");
    gather_cv_.notify_all();
  }
  if (graceful && !links_.empty()) {
    Writer w;
    w.Str(farewell);
    Send(kEveryone, kBye, w.data());
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (monitor_.joinable()) monitor_.join();
  for (auto& link : links_) {
    if (!link) continue;
    std::lock_guard<std::mutex> lock(link->write_mutex);
    if (link->fd >= 0) close(link->fd);
    link->fd = -1;
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

}  // namespace tern::comm
