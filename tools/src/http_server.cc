#include "http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util.h"

namespace tern::tools {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 503:
      return "Service Unavailable";
    case 500:
      return "Internal Server Error";
    default:
      return "Unknown";
  }
}

bool HeadComplete(const std::string& request) {
  return request.find("\r\n\r\n") != std::string::npos ||
         request.find("\n\n") != std::string::npos || request.size() >= kMaxRequestBytes;
}

std::string Format(const HttpServer::Response& response, bool head_only) {
  std::string text = fmt::format(
      "HTTP/1.0 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
      response.status, ReasonPhrase(response.status), response.content_type, response.body.size());
  if (!head_only) text += response.body;
  return text;
}

// The whole answer to `request` (its head; a body, if any, is ignored).
std::string Answer(const std::string& request, const HttpServer::Handler& handler) {
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t first_space = line.find(' ');
  const size_t second_space =
      first_space == std::string::npos ? std::string::npos : line.find(' ', first_space + 1);
  if (first_space == std::string::npos) {
    return Format({400, "text/plain; charset=utf-8", "bad request\n"}, false);
  }
  const std::string method = line.substr(0, first_space);
  std::string path = line.substr(first_space + 1, second_space == std::string::npos
                                                      ? std::string::npos
                                                      : second_space - first_space - 1);
  if (const size_t query = path.find('?'); query != std::string::npos) path.resize(query);
  if (method != "GET" && method != "HEAD") {
    return Format({405, "text/plain; charset=utf-8", "only GET is supported\n"}, false);
  }
  HttpServer::Response response;
  try {
    response = handler(path);
  } catch (const std::exception& e) {
    response = {500, "text/plain; charset=utf-8", std::string(e.what()) + "\n"};
  }
  return Format(response, method == "HEAD");
}

std::string FormatAddress(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
  }
  const auto* in4 = reinterpret_cast<const sockaddr_in*>(&addr);
  inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
  return fmt::format("{}:{}", host, ntohs(in4->sin_port));
}

}  // namespace

std::unique_ptr<HttpServer> HttpServer::Listen(const std::string& spec, int max_connections) {
  std::string host = "127.0.0.1";
  std::string port = spec;
  if (!spec.empty() && spec.front() == '[') {
    const size_t close = spec.find("]:");
    if (close == std::string::npos) {
      throw ToolError(fmt::format("--listen '{}': write an IPv6 address as [ADDR]:PORT", spec),
                      kExitUsage);
    }
    host = spec.substr(1, close - 1);
    port = spec.substr(close + 2);
  } else if (const size_t colon = spec.rfind(':'); colon != std::string::npos) {
    if (colon > 0) host = spec.substr(0, colon);
    port = spec.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535) {
    throw ToolError(
        fmt::format("--listen '{}': expected [ADDR:]PORT with PORT 0-65535 (0 picks a free port)",
                    spec),
        kExitUsage);
  }

  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &results); rc != 0) {
    throw ToolError(
        fmt::format("--listen '{}': cannot resolve '{}': {}", spec, host, gai_strerror(rc)),
        kExitUsage);
  }
  std::string last_error = "no address";
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound = {};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    freeaddrinfo(results);
    return std::unique_ptr<HttpServer>(
        new HttpServer(fd, FormatAddress(bound), std::max(max_connections, 1)));
  }
  freeaddrinfo(results);
  throw ToolError(
      fmt::format("--listen '{}': cannot listen on {}:{}: {}", spec, host, port, last_error));
}

HttpServer::~HttpServer() {
  for (const Connection& connection : connections_) close(connection.fd);
  close(fd_);
}

bool HttpServer::AcceptPending() {
  // Bounded per call, so that a flood of connections cannot starve the
  // clients already in.
  for (int accepted = 0; accepted < 2 * max_connections_; ++accepted) {
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {
      if (errno == EINTR) continue;
      return errno != EMFILE && errno != ENFILE;  // else EAGAIN: none left
    }
    Connection connection;
    connection.fd = client;
    if (served_ >= static_cast<size_t>(max_connections_)) {
      // Refused at once rather than left in the backlog, where a scraper
      // would only see its timeout. One non-blocking send: best effort.
      const std::string refusal =
          Format({503, "text/plain; charset=utf-8",
                  fmt::format("tern monitor: {} connections are open, the most it serves at once; "
                              "retry later\n",
                              max_connections_)},
                 false);
      send(client, refusal.data(), refusal.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      shutdown(client, SHUT_WR);
      if (connections_.size() - served_ >= static_cast<size_t>(max_connections_)) {
        close(client);  // too many refusals lingering already
        continue;
      }
      connection.refused = true;
      connection.lingering = true;
      connection.deadline_ns = MonotonicNs() + kLingerMs * 1000000ull;
    } else {
      connection.deadline_ns = MonotonicNs() + kRequestTimeoutMs * 1000000ull;
      ++served_;
    }
    connections_.push_back(std::move(connection));
  }
  return true;
}

bool HttpServer::Advance(Connection* connection, const Handler& handler, uint64_t now_ns) {
  if (connection->lingering) {
    char buffer[1024];
    while (true) {
      const ssize_t n = recv(connection->fd, buffer, sizeof(buffer), 0);
      if (n > 0) continue;  // discarded
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return now_ns >= connection->deadline_ns;
      }
      return true;  // closed by the client, or reset
    }
  }
  if (connection->response.empty()) {
    bool closed = false;
    while (!HeadComplete(connection->request)) {
      char buffer[1024];
      const size_t room = std::min(sizeof(buffer), kMaxRequestBytes - connection->request.size());
      const ssize_t n = recv(connection->fd, buffer, room, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) return true;  // reset by the client
      if (n == 0) {
        closed = true;  // the client closed its side: answer what it sent
        break;
      }
      connection->request.append(buffer, static_cast<size_t>(n));
    }
    if (!HeadComplete(connection->request) && !closed) return now_ns >= connection->deadline_ns;
    if (connection->request.empty()) return true;
    connection->response = Answer(connection->request, handler);
    connection->deadline_ns = MonotonicNs() + kResponseTimeoutMs * 1000000ull;
  }
  while (connection->sent < connection->response.size()) {
    const ssize_t n = send(connection->fd, connection->response.data() + connection->sent,
                           connection->response.size() - connection->sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return MonotonicNs() >= connection->deadline_ns;
    }
    if (n <= 0) return true;  // the client went away; nothing to do
    connection->sent += static_cast<size_t>(n);
  }
  shutdown(connection->fd, SHUT_WR);
  connection->lingering = true;
  connection->deadline_ns = MonotonicNs() + kLingerMs * 1000000ull;
  return false;
}

void HttpServer::Serve(const Handler& handler) {
  std::vector<pollfd> polled;
  uint64_t accept_paused_until_ns = 0;  // out of file descriptors: retry later
  while (!StopRequested()) {
    uint64_t now = MonotonicNs();
    // The timeout bounds how late a stop request that raced with poll() is
    // seen, and how late a deadline is noticed.
    int timeout_ms = 200;
    polled.clear();
    polled.push_back({fd_, static_cast<short>(now >= accept_paused_until_ns ? POLLIN : 0), 0});
    for (const Connection& connection : connections_) {
      const bool reading = connection.lingering || connection.response.empty();
      polled.push_back({connection.fd, static_cast<short>(reading ? POLLIN : POLLOUT), 0});
      const uint64_t left_ms =
          connection.deadline_ns > now ? (connection.deadline_ns - now) / 1000000ull + 1 : 0;
      timeout_ms = static_cast<int>(std::min<uint64_t>(timeout_ms, left_ms));
    }
    if (poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) continue;
    now = MonotonicNs();
    // Connections first (a slot freed here can take a pending client).
    size_t kept = 0;
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection& connection = connections_[i];
      const bool ready = polled[i + 1].revents != 0;
      const bool finished =
          ready ? Advance(&connection, handler, now) : now >= connection.deadline_ns;
      if (finished) {
        close(connection.fd);
        if (!connection.refused) --served_;
      } else {
        if (kept != i) connections_[kept] = std::move(connection);
        ++kept;
      }
    }
    connections_.resize(kept);
    if ((polled[0].revents & POLLIN) != 0 && !AcceptPending()) {
      accept_paused_until_ns = now + 100 * 1000000ull;
    }
  }
  for (const Connection& connection : connections_) close(connection.fd);
  connections_.clear();
  served_ = 0;
}

}  // namespace tern::tools
