#include "http_server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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
    case 500:
      return "Internal Server Error";
    default:
      return "Unknown";
  }
}

void SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR && !StopRequested()) continue;
    if (n <= 0) return;  // the client went away; nothing to do
    sent += static_cast<size_t>(n);
  }
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

std::unique_ptr<HttpServer> HttpServer::Listen(const std::string& spec) {
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
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    sockaddr_storage bound = {};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    freeaddrinfo(results);
    return std::unique_ptr<HttpServer>(new HttpServer(fd, FormatAddress(bound)));
  }
  freeaddrinfo(results);
  throw ToolError(
      fmt::format("--listen '{}': cannot listen on {}:{}: {}", spec, host, port, last_error));
}

HttpServer::~HttpServer() { close(fd_); }

void HttpServer::Serve(const Handler& handler) {
  while (!StopRequested()) {
    pollfd pfd = {fd_, POLLIN, 0};
    // The timeout bounds how late a stop request that raced with poll() is seen.
    const int ready = poll(&pfd, 1, 200);
    if (ready <= 0) continue;  // timeout or EINTR: check the stop flag
    const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    HandleConnection(client, handler);
    close(client);
  }
}

void HttpServer::HandleConnection(int client, const Handler& handler) {
  std::string request;
  const uint64_t deadline = MonotonicNs() + kClientTimeoutMs * 1000000ull;
  // Read the request head (up to the blank line); the body, if any, is ignored.
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const uint64_t now = MonotonicNs();
    if (now >= deadline || StopRequested()) return;
    pollfd pfd = {client, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>((deadline - now) / 1000000ull) + 1) <= 0) continue;
    char buffer[1024];
    const ssize_t n = recv(client, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the client closed: answer what we have
    request.append(buffer, static_cast<size_t>(n));
  }

  Response response;
  bool head_only = false;
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t first_space = line.find(' ');
  const size_t second_space =
      first_space == std::string::npos ? std::string::npos : line.find(' ', first_space + 1);
  if (first_space == std::string::npos) {
    response = {400, "text/plain; charset=utf-8", "bad request\n"};
  } else {
    const std::string method = line.substr(0, first_space);
    std::string path = line.substr(first_space + 1, second_space == std::string::npos
                                                        ? std::string::npos
                                                        : second_space - first_space - 1);
    if (const size_t query = path.find('?'); query != std::string::npos) path.resize(query);
    if (method != "GET" && method != "HEAD") {
      response = {405, "text/plain; charset=utf-8", "only GET is supported\n"};
    } else {
      try {
        response = handler(path);
      } catch (const std::exception& e) {
        response = {500, "text/plain; charset=utf-8", std::string(e.what()) + "\n"};
      }
      head_only = method == "HEAD";
    }
  }
  std::string head = fmt::format(
      "HTTP/1.0 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
      response.status, ReasonPhrase(response.status), response.content_type, response.body.size());
  SendAll(client, head_only ? head : head + response.body);
}

}  // namespace tern::tools
