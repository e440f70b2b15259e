// A minimal HTTP/1.0 server for `tern monitor --listen`: one request per
// connection, GET and HEAD only. It exists so Prometheus can scrape a node
// without an exporter daemon; it is not a general web server.
//
// Connections are served concurrently by one thread with non-blocking
// sockets and poll(): a client that connects and sends nothing costs a slot
// (a file descriptor and a small buffer) until its request deadline, never
// the time of the clients behind it. Resources are bounded: at most
// `max_connections` served at once (the next ones get "503 Service
// Unavailable" at once, and at most as many of those linger until the
// client closes), 8 KiB of request per connection,
// kRequestTimeoutMs to send the request and kResponseTimeoutMs to take the
// answer. The handler runs on the serving thread, one request at a time.
#ifndef TERN_TOOLS_SRC_HTTP_SERVER_H_
#define TERN_TOOLS_SRC_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tern::tools {

class HttpServer {
 public:
  struct Response {
    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };
  // Called with the request path ("/metrics"); GET and HEAD requests only.
  using Handler = std::function<Response(const std::string& path)>;

  static constexpr int kRequestTimeoutMs = 2000;
  static constexpr int kResponseTimeoutMs = 5000;
  static constexpr int kDefaultMaxConnections = 64;

  // Binds to `spec`: "PORT", ":PORT", "ADDR:PORT" or "[ADDR6]:PORT"; the
  // address defaults to 127.0.0.1 and port 0 picks a free one. Throws
  // ToolError when the address cannot be bound.
  // Thread-safety: any thread.
  static std::unique_ptr<HttpServer> Listen(const std::string& spec,
                                            int max_connections = kDefaultMaxConnections);
  ~HttpServer();

  // "127.0.0.1:9464" with the port actually bound.
  const std::string& address() const { return address_; }

  // Answers requests until StopRequested() (see util.h) becomes true, then
  // closes every connection.
  // Thread-safety: one thread at a time.
  void Serve(const Handler& handler);

 private:
  struct Connection {
    int fd = -1;
    uint64_t deadline_ns = 0;
    std::string request;
    std::string response;  // non-empty once answered: being sent
    size_t sent = 0;
    // Answered and shut for writing: reading until the client closes (or
    // kLingerMs), so that closing with its bytes unread does not reset the
    // connection and destroy the answer before the client reads it.
    bool lingering = false;
    bool refused = false;  // over the cap: answered 503, not counted in it
  };
  static constexpr int kLingerMs = 1000;

  HttpServer(int fd, std::string address, int max_connections)
      : fd_(fd), address_(std::move(address)), max_connections_(max_connections) {}
  // Accepts every pending connection (refusing those beyond the cap).
  // Returns false when out of file descriptors.
  bool AcceptPending();
  // Reads or writes what the socket allows; returns true when `connection`
  // is finished (answered, failed or timed out) and must be closed.
  bool Advance(Connection* connection, const Handler& handler, uint64_t now_ns);

  int fd_;
  std::string address_;
  int max_connections_;
  std::vector<Connection> connections_;
  size_t served_ = 0;  // connections_ that are not refused: at most max_connections_
};

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_HTTP_SERVER_H_
