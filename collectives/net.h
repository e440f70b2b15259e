// TCP sockets for the bootstrap and the control plane: addresses, listening,
// connecting with retries, length-prefixed frames, all bounded by deadlines;
// a small binary writer/reader; and the identity of this host and process.
#ifndef TERN_COLLECTIVES_NET_H_
#define TERN_COLLECTIVES_NET_H_

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status_with_message.h"

namespace tern::comm {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
  std::string ToString() const;  // "10.0.0.1:5000", "[::1]:5000"
  uint16_t port() const;
};

// Parses "host:port" or "[v6]:port"; the host may be a name.
Status ParseHostPort(const std::string& text, SockAddr* out);
// The address to serve a bootstrap on (port 0): TERN_COMM_SOCKET_IFNAME's
// address, else the first interface that is up and not loopback, else
// loopback. `*out_ifname` gets the interface name.
Status PickInterfaceAddress(SockAddr* out, std::string* out_ifname);
// Whether `addr` belongs to an interface of this host (or is a wildcard).
bool IsLocalAddress(const SockAddr& addr);

// Listens on `addr` (port 0: an ephemeral port); `*out_bound` gets the
// address actually bound. Close-on-exec, SO_REUSEADDR.
Status Listen(const SockAddr& addr, int* out_fd, SockAddr* out_bound);
// Connects, retrying refused or unreachable attempts until `deadline_ns`
// (MonotonicNs). `what` names the other end in errors.
Status Connect(const SockAddr& addr, uint64_t deadline_ns, std::string_view what, int* out_fd);
// Accepts one connection before `deadline_ns`; TIMEOUT if none came.
Status Accept(int listen_fd, uint64_t deadline_ns, int* out_fd);
// The local address of a connected socket.
Status LocalAddress(int fd, SockAddr* out);

// Frames: a 32-bit length and that many bytes. A peer that closed its end
// gives TERN_ERROR_COMM_PEER_LOST with `*out_eof` set (when not NULL).
Status SendFrame(int fd, std::string_view payload, uint64_t deadline_ns);
Status RecvFrame(int fd, uint64_t deadline_ns, std::string* payload, bool* out_eof = nullptr);

// Little-endian binary encoding of the frames' contents.
class Writer {
 public:
  Writer& U32(uint32_t v);
  Writer& U64(uint64_t v);
  Writer& I32(int32_t v) { return U32(static_cast<uint32_t>(v)); }
  Writer& Str(std::string_view s);
  const std::string& data() const { return data_; }
  std::string& data() { return data_; }

 private:
  std::string data_;
};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  uint32_t U32();
  uint64_t U64();
  int32_t I32() { return static_cast<int32_t>(U32()); }
  std::string Str();
  // False once a read ran past the end (values read then are 0 / empty).
  bool ok() const { return ok_; }
  size_t remaining() const { return data_.size() - offset_; }

 private:
  // Copies the next `bytes` to `out`; false (and ok() false) past the end.
  bool Take(void* out, size_t bytes);
  std::string_view data_;
  size_t offset_ = 0;
  bool ok_ = true;
};

// This host's name (for messages).
const std::string& HostName();
// Identifies the host for transport choice: kernel boot id and network
// namespace (processes in different network namespaces count as different
// hosts, as they would be if the namespaces were machines).
const std::string& NodeKey();
// Random per process (recomputed after fork).
uint64_t ProcessKey();
uint64_t RandomU64();

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_NET_H_
