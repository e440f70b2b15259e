#include "net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "common/timeline.h"

namespace tern::comm {
namespace {

constexpr uint32_t kMaxFrame = 64u << 20;

int RemainingMs(uint64_t deadline_ns) {
  const uint64_t now = MonotonicNs();
  if (now >= deadline_ns) return 0;
  const uint64_t ms = (deadline_ns - now + 999999) / 1000000;
  return ms > 1000000 ? 1000000 : static_cast<int>(ms);
}

void SetCommonOptions(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits until `fd` is ready for `events` or the deadline passes.
bool WaitFd(int fd, short events, uint64_t deadline_ns) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, RemainingMs(deadline_ns));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the read or write report it
  }
}

Status WriteAll(int fd, const char* data, size_t size, uint64_t deadline_ns) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFd(fd, POLLOUT, deadline_ns)) {
        return MakeStatus(TERN_ERROR_COMM_TIMEOUT, "sending on a socket did not finish in time");
      }
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return ErrnoStatus(TERN_ERROR_COMM_PEER_LOST, errno, "send (the other end closed)");
    }
    return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "send");
  }
  return OkStatus();
}

Status ReadAll(int fd, char* data, size_t size, uint64_t deadline_ns, bool* eof) {
  while (size > 0) {
    const ssize_t n = recv(fd, data, size, MSG_DONTWAIT);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (eof) *eof = true;
      return MakeStatus(TERN_ERROR_COMM_PEER_LOST, "the other end closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!WaitFd(fd, POLLIN, deadline_ns)) {
        return MakeStatus(TERN_ERROR_COMM_TIMEOUT, "no data arrived on the socket in time");
      }
      continue;
    }
    if (errno == ECONNRESET) {
      if (eof) *eof = true;
      return ErrnoStatus(TERN_ERROR_COMM_PEER_LOST, errno,
                         "recv (the other end reset the connection)");
    }
    return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "recv");
  }
  return OkStatus();
}

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string SockAddr::ToString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return fmt::format("{}:{}", host, ntohs(a->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return fmt::format("[{}]:{}", host, ntohs(a->sin6_port));
  }
  return "unknown-address";
}

uint16_t SockAddr::port() const {
  if (storage.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

Status ParseHostPort(const std::string& text, SockAddr* out) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "'{}' is not '[ipv6]:port'", text);
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size()) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "'{}' is not 'host:port'", text);
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  const long number = std::strtol(port.c_str(), &end, 10);
  if (end == port.c_str() || *end != '\0' || number <= 0 || number > 65535) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "'{}': port '{}' is not a number in 1-65535",
                      text, port);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "'{}': cannot resolve host '{}': {}", text, host,
                      gai_strerror(rc));
  }
  // Prefer IPv4 when a name resolves to both.
  const addrinfo* pick = result;
  for (const addrinfo* a = result; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  std::memcpy(&out->storage, pick->ai_addr, pick->ai_addrlen);
  out->length = pick->ai_addrlen;
  freeaddrinfo(result);
  return OkStatus();
}

Status PickInterfaceAddress(SockAddr* out, std::string* out_ifname) {
  const char* wanted = std::getenv("TERN_COMM_SOCKET_IFNAME");
  if (wanted != nullptr && *wanted == '\0') wanted = nullptr;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "getifaddrs");
  const ifaddrs* best = nullptr;
  const ifaddrs* loopback = nullptr;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP)) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6) {
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;  // needs a scope id: skip
    }
    if (wanted != nullptr) {
      if (std::strcmp(i->ifa_name, wanted) != 0) continue;
      if (best == nullptr || (family == AF_INET && best->ifa_addr->sa_family != AF_INET)) best = i;
      continue;
    }
    if (i->ifa_flags & IFF_LOOPBACK) {
      if (loopback == nullptr || (family == AF_INET && loopback->ifa_addr->sa_family != AF_INET)) {
        loopback = i;
      }
      continue;
    }
    if (best == nullptr || (family == AF_INET && best->ifa_addr->sa_family != AF_INET)) best = i;
  }
  if (best == nullptr && wanted == nullptr) best = loopback;
  if (best == nullptr) {
    freeifaddrs(list);
    if (wanted != nullptr) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "TERN_COMM_SOCKET_IFNAME='{}' names no interface that is up with an IP "
                        "address; list them with 'ip addr' and pick one, or unset the variable",
                        wanted);
    }
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT, "this host has no network interface that is up");
  }
  const socklen_t length =
      best->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memset(&out->storage, 0, sizeof(out->storage));
  std::memcpy(&out->storage, best->ifa_addr, length);
  out->length = length;
  if (out_ifname != nullptr) *out_ifname = best->ifa_name;
  freeifaddrs(list);
  return OkStatus();
}

bool IsLocalAddress(const SockAddr& addr) {
  if (addr.storage.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr.storage);
    if (a->sin_addr.s_addr == htonl(INADDR_ANY)) return true;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (const ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != addr.storage.ss_family) continue;
    if (addr.storage.ss_family == AF_INET) {
      found = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
              reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_addr.s_addr;
    } else {
      found = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_addr,
                          sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(list);
  return found;
}

Status Listen(const SockAddr& addr, int* out_fd, SockAddr* out_bound) {
  *out_fd = -1;
  const int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err == EADDRINUSE ? TERN_ERROR_BUSY : TERN_ERROR_COMM_TRANSPORT, err,
                       fmt::format("bind to {}", addr.ToString()));
  }
  if (listen(fd, 1024) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, err, "listen");
  }
  if (out_bound != nullptr) {
    out_bound->length = sizeof(out_bound->storage);
    getsockname(fd, reinterpret_cast<sockaddr*>(&out_bound->storage), &out_bound->length);
  }
  *out_fd = fd;
  return OkStatus();
}

Status Connect(const SockAddr& addr, uint64_t deadline_ns, std::string_view what, int* out_fd) {
  *out_fd = -1;
  int last_error = 0;
  uint64_t pause_ns = 5000000;
  while (true) {
    const int fd = socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "socket");
    int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.length);
    if (rc != 0 && errno == EINPROGRESS) {
      if (WaitFd(fd, POLLOUT, deadline_ns)) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      SetCommonOptions(fd);
      *out_fd = fd;
      return OkStatus();
    }
    last_error = errno;
    close(fd);
    const bool retry = last_error == ECONNREFUSED || last_error == ENETUNREACH ||
                       last_error == EHOSTUNREACH || last_error == ETIMEDOUT ||
                       last_error == ECONNRESET || last_error == EAGAIN;
    const uint64_t now = MonotonicNs();
    if (!retry || now >= deadline_ns) break;
    const uint64_t sleep_ns = std::min(pause_ns, deadline_ns - now);
    usleep(static_cast<useconds_t>(sleep_ns / 1000));
    pause_ns = std::min<uint64_t>(pause_ns * 2, 100000000);
  }
  const tern_status_t code =
      MonotonicNs() >= deadline_ns ? TERN_ERROR_COMM_TIMEOUT : TERN_ERROR_COMM_TRANSPORT;
  return MakeStatus(code, "could not connect to {} at {}: {}", what, addr.ToString(),
                    std::strerror(last_error));
}

Status Accept(int listen_fd, uint64_t deadline_ns, int* out_fd) {
  *out_fd = -1;
  while (true) {
    if (!WaitFd(listen_fd, POLLIN, deadline_ns)) {
      return MakeStatus(TERN_ERROR_COMM_TIMEOUT, "no connection arrived in time");
    }
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      SetCommonOptions(fd);
      *out_fd = fd;
      return OkStatus();
    }
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
    return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "accept");
  }
}

Status LocalAddress(int fd, SockAddr* out) {
  out->length = sizeof(out->storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&out->storage), &out->length) != 0) {
    return ErrnoStatus(TERN_ERROR_COMM_TRANSPORT, errno, "getsockname");
  }
  return OkStatus();
}

Status SendFrame(int fd, std::string_view payload, uint64_t deadline_ns) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::string frame(sizeof(length) + payload.size(), '\0');
  std::memcpy(frame.data(), &length, sizeof(length));
  std::memcpy(frame.data() + sizeof(length), payload.data(), payload.size());
  return WriteAll(fd, frame.data(), frame.size(), deadline_ns);
}

Status RecvFrame(int fd, uint64_t deadline_ns, std::string* payload, bool* out_eof) {
  if (out_eof) *out_eof = false;
  uint32_t length = 0;
  TERN_RETURN_IF_ERROR(
      ReadAll(fd, reinterpret_cast<char*>(&length), sizeof(length), deadline_ns, out_eof));
  if (length > kMaxFrame) {
    return MakeStatus(TERN_ERROR_COMM_TRANSPORT,
                      "received a frame of {} bytes (more than {}): the other end does not speak "
                      "tern's bootstrap protocol",
                      length, kMaxFrame);
  }
  payload->resize(length);
  return ReadAll(fd, payload->data(), length, deadline_ns, out_eof);
}

Writer& Writer::U32(uint32_t v) {
  data_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return *this;
}
Writer& Writer::U64(uint64_t v) {
  data_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return *this;
}
Writer& Writer::Str(std::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  data_.append(s.data(), s.size());
  return *this;
}

bool Reader::Take(void* out, size_t bytes) {
  if (!ok_ || remaining() < bytes) {
    ok_ = false;
    return false;
  }
  std::memcpy(out, data_.data() + offset_, bytes);
  offset_ += bytes;
  return true;
}
uint32_t Reader::U32() {
  uint32_t v = 0;
  Take(&v, sizeof(v));
  return v;
}
uint64_t Reader::U64() {
  uint64_t v = 0;
  Take(&v, sizeof(v));
  return v;
}
std::string Reader::Str() {
  const uint32_t length = U32();
  if (!ok_ || remaining() < length) {
    ok_ = false;
    return std::string();
  }
  std::string s(data_.substr(offset_, length));
  offset_ += length;
  return s;
}

const std::string& HostName() {
  static const std::string name = [] {
    char buffer[256] = {};
    if (gethostname(buffer, sizeof(buffer) - 1) != 0) return std::string("unknown-host");
    return std::string(buffer);
  }();
  return name;
}

const std::string& NodeKey() {
  static const std::string key = [] {
    std::string boot = ReadFirstLine("/proc/sys/kernel/random/boot_id");
    if (boot.empty()) boot = HostName();
    struct stat st {};
    uint64_t netns = 0;
    if (stat("/proc/self/ns/net", &st) == 0) netns = st.st_ino;
    return fmt::format("{}/net:{}", boot, netns);
  }();
  return key;
}

uint64_t RandomU64() {
  static std::mutex mutex;
  static std::mt19937_64 engine{std::random_device{}()};
  static pid_t seeded_pid = getpid();
  std::lock_guard<std::mutex> lock(mutex);
  if (getpid() != seeded_pid) {  // a forked child must not repeat its parent's numbers
    engine.seed(std::random_device{}() ^ static_cast<uint64_t>(getpid()));
    seeded_pid = getpid();
  }
  return engine();
}

uint64_t ProcessKey() {
  static std::mutex mutex;
  static uint64_t key = 0;
  static pid_t key_pid = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (key == 0 || key_pid != getpid()) {
    key_pid = getpid();
    key = RandomU64() ^ static_cast<uint64_t>(key_pid);
  }
  return key;
}

}  // namespace tern::comm
