#include "pending_connections.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "net.h"
#include "secret.h"

namespace tern::comm {
namespace {

// After a failed accept (EMFILE, ENFILE, ENOBUFS, ENOMEM) the connection
// stays queued and the listener stays readable: polling it again at once
// would spin. Wait this long first.
constexpr uint64_t kAcceptPauseNs = 100000000ull;
constexpr size_t kPeersNamed = 4;

int MsUntil(uint64_t deadline_ns, uint64_t now_ns) {
  if (deadline_ns <= now_ns) return 0;
  return static_cast<int>(std::min<uint64_t>((deadline_ns - now_ns + 999999) / 1000000, 1000000));
}

}  // namespace

PendingConnections::PendingConnections(int listen_fd, uint32_t magic, uint32_t version,
                                       size_t max_pending, uint32_t max_frame)
    : listen_fd_(listen_fd),
      magic_(magic),
      version_(version),
      max_pending_(max_pending),
      max_frame_(max_frame) {
  const int flags = fcntl(listen_fd_, F_GETFL);
  if (flags >= 0) fcntl(listen_fd_, F_SETFL, flags | O_NONBLOCK);
}

PendingConnections::~PendingConnections() {
  for (Connection& conn : pending_) {
    if (conn.fd >= 0) close(conn.fd);
  }
}

int PendingConnections::AddPollFds(std::vector<pollfd>* fds, uint64_t now_ns) {
  int timeout_ms = -1;
  auto earliest = [&](uint64_t deadline_ns) {
    const int ms = MsUntil(deadline_ns, now_ns);
    if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
  };
  listener_polled_ = now_ns >= accept_paused_until_ns_;
  if (listener_polled_) {
    fds->push_back({listen_fd_, POLLIN, 0});
  } else {
    earliest(accept_paused_until_ns_);
  }
  for (const Connection& conn : pending_) {
    fds->push_back({conn.fd, POLLIN, 0});
    earliest(conn.deadline_ns);
  }
  polled_ = pending_.size();
  return timeout_ms;
}

void PendingConnections::Service(const std::vector<pollfd>& fds, size_t first, uint64_t now_ns,
                                 const OnFirstFrame& on_frame) {
  size_t index = first;
  const bool listener_ready = listener_polled_ && fds[index++].revents != 0;
  for (size_t i = 0; i < polled_; ++i, ++index) {
    Connection& conn = pending_[i];
    if (conn.fd < 0) continue;
    if (fds[index].revents != 0 && Read(conn, on_frame)) continue;
    if (conn.fd >= 0 && now_ns >= conn.deadline_ns) {
      Refuse(conn, fmt::format("sent no complete hello within {} s",
                               kHandshakeTimeoutNs / 1000000000ull));
    }
  }
  std::erase_if(pending_, [](const Connection& conn) { return conn.fd < 0; });
  if (listener_ready) Accept(now_ns);
}

void PendingConnections::Accept(uint64_t now_ns) {
  // A few at a time, so that a flood of connections cannot starve the
  // connections already pending.
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length,
                           SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        return;
      }
      // Logged once accepting works again: while no descriptor is free, the
      // logger (and a sanitizer's checks) may fail for want of one too.
      ++accept_failures_;
      ++accept_failures_unlogged_;
      accept_errno_ = errno;
      accept_paused_until_ns_ = now_ns + kAcceptPauseNs;
      return;
    }
    if (accept_failures_unlogged_ > 0) {
      TERN_LOG_WARN(
          "accepting connections failed {} time(s) before this one: {} (if that is the "
          "open-file limit, raise it: ulimit -n)",
          accept_failures_unlogged_, std::strerror(accept_errno_));
      accept_failures_unlogged_ = 0;
    }
    SockAddr peer;
    std::memcpy(&peer.storage, &address, sizeof(address));
    peer.length = length;
    Connection conn;
    conn.fd = fd;
    conn.peer = peer.ToString();
    conn.deadline_ns = now_ns + kHandshakeTimeoutNs;
    if (pending_.size() >= max_pending_) {
      Refuse(conn,
             fmt::format("arrived while {} others were waiting to authenticate", max_pending_));
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Writer greeting;
    if (!NewChallenge(&conn.challenge).ok()) {
      Refuse(conn, "could not be given a challenge (getrandom failed)");
      continue;
    }
    greeting.U32(magic_).U32(version_).Str(conn.challenge);
    // A fresh socket's send buffer always takes a few dozen bytes.
    if (!SendFrame(fd, greeting.data(), now_ns + 100000000ull).ok()) {
      Refuse(conn, "closed the connection before its greeting");
      continue;
    }
    pending_.push_back(std::move(conn));
  }
}

bool PendingConnections::Read(Connection& conn, const OnFirstFrame& on_frame) {
  char chunk[4096];
  while (true) {
    size_t want = sizeof(uint32_t);
    if (conn.buffer.size() >= sizeof(uint32_t)) {
      uint32_t length = 0;
      std::memcpy(&length, conn.buffer.data(), sizeof(length));
      if (length > max_frame_) {
        Refuse(conn, fmt::format("sent a frame longer than a hello ({} bytes)", length));
        return true;
      }
      want = sizeof(uint32_t) + length;
    }
    if (conn.buffer.size() >= sizeof(uint32_t) && conn.buffer.size() == want) break;
    const size_t missing = std::min(want - conn.buffer.size(), sizeof(chunk));
    const ssize_t n = recv(conn.fd, chunk, missing, MSG_DONTWAIT);
    if (n > 0) {
      conn.buffer.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    Refuse(conn, "closed the connection before completing a hello");
    return true;
  }
  std::string reason;
  const std::string_view frame = std::string_view(conn.buffer).substr(sizeof(uint32_t));
  if (on_frame(conn, frame, &reason) == Verdict::kKeep) {
    conn.fd = -1;  // the owner's now
    return true;
  }
  Refuse(conn, reason);
  return true;
}

void PendingConnections::Refuse(Connection& conn, const std::string& reason) {
  if (conn.fd >= 0) close(conn.fd);
  conn.fd = -1;
  Refusals& r = refusals_[reason];
  ++r.count;
  if (r.peers.size() < kPeersNamed) r.peers.push_back(conn.peer);
  TERN_LOG_DEBUG("refused the connection from {}: it {}", conn.peer, reason);
}

std::string PendingConnections::Summary() const {
  std::string text;
  for (const auto& [reason, r] : refusals_) {
    std::string peers;
    for (const std::string& p : r.peers) peers += fmt::format("{}{}", peers.empty() ? "" : ", ", p);
    if (r.count > r.peers.size()) peers += ", ...";
    text += fmt::format("{}{} connection(s) {} (from {})", text.empty() ? "" : "; ", r.count,
                        reason, peers);
  }
  if (accept_failures_ > 0) {
    text += fmt::format(
        "{}accepting connections failed {} time(s): {} (if that is the open-file limit, raise "
        "it: ulimit -n)",
        text.empty() ? "" : "; ", accept_failures_, std::strerror(accept_errno_));
  }
  return text;
}

}  // namespace tern::comm
