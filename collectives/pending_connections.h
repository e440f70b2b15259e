// PendingConnections: the connections a listening socket accepted that have
// not yet proven who they are (the bootstrap root's, rank 0's control
// listener's). Each is served without blocking: on accept it gets a greeting
// with a fresh challenge, then its first frame is assembled from whatever
// bytes arrive, and only a complete frame reaches the owner, who checks the
// proof in it. A connection that sends nothing, half a frame or an oversized
// one is closed after a short handshake timeout without delaying anyone
// else; a listener whose accept fails (EMFILE: the open-file limit) is left
// alone for a moment instead of being polled in a busy loop. What was
// refused, and why, is summarized for the errors of the owner.
#ifndef TERN_COLLECTIVES_PENDING_CONNECTIONS_H_
#define TERN_COLLECTIVES_PENDING_CONNECTIONS_H_

#include <poll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tern::comm {

// How long an unauthenticated connection may take to send its first frame.
constexpr uint64_t kHandshakeTimeoutNs = 3000000000ull;

class PendingConnections {
 public:
  struct Connection {
    int fd = -1;
    std::string peer;       // "10.0.0.2:40512"
    std::string challenge;  // sent in the greeting
    std::string buffer;     // the first frame so far
    uint64_t deadline_ns = 0;
  };
  enum class Verdict { kKeep, kRefuse };
  // Called with a connection's complete first frame. kKeep: the owner takes
  // conn.fd. kRefuse: the connection is closed (the owner may have sent an
  // error reply first) and counted under `*reason` ("failed
  // authentication").
  using OnFirstFrame =
      std::function<Verdict(Connection& conn, std::string_view frame, std::string* reason)>;

  // `listen_fd` (made non-blocking; not owned) greets each connection with
  // a frame of magic, version and its challenge. At most `max_pending`
  // connections wait at once; first frames are limited to `max_frame` bytes.
  PendingConnections(int listen_fd, uint32_t magic, uint32_t version, size_t max_pending,
                     uint32_t max_frame);
  ~PendingConnections();  // closes the connections still pending
  PendingConnections(const PendingConnections&) = delete;
  PendingConnections& operator=(const PendingConnections&) = delete;

  // Appends the descriptors to poll (the listener unless accepting is
  // paused, and the pending connections) and returns the poll timeout they
  // need in ms (-1: none).
  int AddPollFds(std::vector<pollfd>* fds, uint64_t now_ns);
  // Handles what poll reported for the descriptors AddPollFds appended,
  // starting at fds[first]: accepts, reads, expires, and calls `on_frame`.
  void Service(const std::vector<pollfd>& fds, size_t first, uint64_t now_ns,
               const OnFirstFrame& on_frame);
  // "25 connections sent no complete hello within 3 s (from 127.0.0.1:4000,
  // ...); accepting connections failed 12 times: Too many open files ...";
  // empty when nothing was refused.
  std::string Summary() const;

  // Thread-safety: an object belongs to one thread.

 private:
  void Accept(uint64_t now_ns);
  // Reads what arrived; true when the connection is finished with (handed
  // over or refused).
  bool Read(Connection& conn, const OnFirstFrame& on_frame);
  void Refuse(Connection& conn, const std::string& reason);

  struct Refusals {
    size_t count = 0;
    std::vector<std::string> peers;  // the first few
  };

  int listen_fd_;
  uint32_t magic_, version_;
  size_t max_pending_;
  uint32_t max_frame_;
  std::vector<Connection> pending_;
  size_t polled_ = 0;  // how many pending connections the last AddPollFds listed
  bool listener_polled_ = false;
  uint64_t accept_paused_until_ns_ = 0;
  uint64_t accept_failures_ = 0;
  uint64_t accept_failures_unlogged_ = 0;
  int accept_errno_ = 0;
  std::map<std::string, Refusals> refusals_;
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_PENDING_CONNECTIONS_H_
