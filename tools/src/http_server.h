// A minimal HTTP/1.0 server for `tern monitor --listen`: single-threaded, one
// request per connection, GET only. It exists so Prometheus can scrape a
// node without an exporter daemon; it is not a general web server.
#ifndef TERN_TOOLS_SRC_HTTP_SERVER_H_
#define TERN_TOOLS_SRC_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

namespace tern::tools {

class HttpServer {
 public:
  struct Response {
    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };
  // Called with the request path ("/metrics"); GET requests only.
  using Handler = std::function<Response(const std::string& path)>;

  // Binds to `spec`: "PORT", ":PORT", "ADDR:PORT" or "[ADDR6]:PORT"; the
  // address defaults to 127.0.0.1 and port 0 picks a free one. Throws
  // ToolError when the address cannot be bound.
  static std::unique_ptr<HttpServer> Listen(const std::string& spec);
  ~HttpServer();

  // "127.0.0.1:9464" with the port actually bound.
  const std::string& address() const { return address_; }

  // Answers requests until StopRequested() (see util.h) becomes true.
  // A client gets `kClientTimeoutMs` to send its request.
  void Serve(const Handler& handler);

  static constexpr int kClientTimeoutMs = 2000;

 private:
  HttpServer(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  void HandleConnection(int client, const Handler& handler);

  int fd_;
  std::string address_;
};

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_HTTP_SERVER_H_
