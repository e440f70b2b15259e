#include "control.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "common/logging.h"
#include "common/timeline.h"

namespace tern::comm {
namespace {
constexpr uint32_t kCtrlMagic = 0x54524e43;  // "TRNC"
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

Status ControlPlane::Connect(const std::vector<RankIdentity>& table, uint64_t deadline_ns,
                             Callbacks callbacks) {
  callbacks_ = std::move(callbacks);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "eventfd");
  if (rank_ == 0) {
    links_.resize(size_);
    for (auto& link : links_) link = std::make_unique<Link>();
    uint32_t connected = 0;
    while (connected + 1 < size_) {
      int fd = -1;
      Status status = Accept(listen_fd_, deadline_ns, &fd);
      if (!status.ok()) {
        std::string missing;
        for (uint32_t r = 1; r < size_; ++r) {
          if (links_[r]->fd < 0)
            missing += fmt::format("{}{} ({})", missing.empty() ? "" : ", ", r, table[r].host);
        }
        return MakeStatus(status.code(),
                          "rank 0 of {}: rank(s) {} did not connect to its control listener at {} "
                          "in time: {}",
                          label_, missing, table[0].ctrl_address, status.message());
      }
      std::string hello;
      status = RecvFrame(fd, deadline_ns, &hello);
      Reader r(hello);
      const uint32_t magic = r.U32();
      const uint64_t nonce = r.U64();
      const uint32_t from = r.U32();
      if (!status.ok() || magic != kCtrlMagic || nonce != nonce_ || from == 0 || from >= size_ ||
          links_[from]->fd >= 0) {
        close(fd);  // a stray or duplicate connection: ignore it
        continue;
      }
      links_[from]->fd = fd;
      ++connected;
    }
    close(listen_fd_);
    listen_fd_ = -1;
  } else {
    SockAddr addr;
    TERN_RETURN_IF_ERROR(ParseHostPort(table[0].ctrl_address, &addr));
    links_.resize(1);
    links_[0] = std::make_unique<Link>();
    TERN_RETURN_IF_ERROR(comm::Connect(
        addr, deadline_ns, fmt::format("rank 0's control listener (host {})", table[0].host),
        &links_[0]->fd));
    Writer w;
    w.U32(kCtrlMagic).U64(nonce_).U32(rank_);
    TERN_RETURN_IF_ERROR(SendFrame(links_[0]->fd, w.data(), deadline_ns));
  }
  monitor_ = std::thread([this] { Monitor(); });
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

void ControlPlane::Close(bool graceful) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_) return;
    closing_ = true;
    if (failure_.ok())
      failure_ = MakeStatus(TERN_ERROR_COMM_ABORTED, "the communicator is closing");
    gather_cv_.notify_all();
  }
  if (graceful && !links_.empty()) Send(kEveryone, kBye, std::string());
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
