// `tern monitor`: periodic samples of every device as JSON lines, or as
// Prometheus text exposition on stdout or over HTTP (--listen).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <mutex>

#include "http_server.h"
#include "node.h"
#include "report.h"
#include "subcommands.h"
#include "util.h"

namespace tern::tools {
namespace {

struct MonitorOptions {
  double interval_s = 1.0;
  int64_t count = -1;  // -1: not given
  bool prometheus = false;
  std::string listen;
  int max_connections = HttpServer::kDefaultMaxConnections;
};

int RunStdout(const MonitorOptions& options) {
  Runtime runtime;
  // JSON lines run until stopped by default; a Prometheus exposition is
  // usually wanted once (a textfile collector, a cron job).
  const int64_t count = options.count >= 0 ? options.count : (options.prometheus ? 1 : 0);
  NodeSample before = TakeSample(runtime);
  for (int64_t emitted = 0; count == 0 || emitted < count; ++emitted) {
    if (!SleepUnlessStopped(options.interval_s)) break;
    NodeSample after = TakeSample(runtime);
    if (options.prometheus) {
      if (emitted > 0) std::cout << '\n';
      std::cout << PrometheusExposition(runtime, before, after);
    } else {
      std::cout << MonitorRecord(before, after).dump() << '\n';
    }
    std::cout.flush();
    before = std::move(after);
  }
  return kExitOk;
}

int RunHttp(const MonitorOptions& options) {
  std::unique_ptr<HttpServer> server = HttpServer::Listen(options.listen, options.max_connections);
  Runtime runtime;
  // Ratios in a scrape cover the time since the previous scrape (or since
  // the server started, for the first one).
  NodeSample previous = TakeSample(runtime);
  std::fprintf(stderr, "tern monitor: serving Prometheus metrics on http://%s/metrics\n",
               server->address().c_str());
  std::fflush(stderr);
  server->Serve([&](const std::string& path) -> HttpServer::Response {
    if (path == "/metrics") {
      NodeSample now = TakeSample(runtime);
      std::string body = PrometheusExposition(runtime, previous, now);
      previous = std::move(now);
      return {200, "text/plain; version=0.0.4; charset=utf-8", std::move(body)};
    }
    if (path == "/") {
      return {200, "text/plain; charset=utf-8",
              "tern monitor: Prometheus metrics are at /metrics\n"};
    }
    return {404, "text/plain; charset=utf-8", "not found: try /metrics\n"};
  });
  std::fprintf(stderr, "tern monitor: stopped\n");
  return kExitOk;
}

}  // namespace

Runner AddMonitorOptions(CLI::App* app) {
  auto options = std::make_shared<MonitorOptions>();
  AddPeriodOption(app, "-i,--interval", &options->interval_s, "Seconds between samples", 0.01,
                  86400.0);
  app->add_option("-n,--count", options->count,
                  "Samples to print, then exit (default: until stopped; 1 with --prometheus)")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--prometheus", options->prometheus,
                "Print Prometheus text exposition format instead of JSON lines");
  app->add_option("--listen", options->listen,
                  "Serve Prometheus metrics over HTTP on [ADDR:]PORT (ADDR defaults to "
                  "127.0.0.1; port 0 picks a free one, printed on stderr)")
      ->type_name("[ADDR:]PORT");
  app->add_option("--max-connections", options->max_connections,
                  "With --listen: connections served at once; more get 503 (default 64)")
      ->check(CLI::Range(1, 4096));
  return [options]() {
    InstallStopHandlers();
    if (!options->listen.empty()) {
      if (options->count >= 0) {
        throw ToolError(
            "--count does not apply to --listen (the server runs until "
            "SIGINT or SIGTERM)",
            kExitUsage);
      }
      return RunHttp(*options);
    }
    return RunStdout(*options);
  };
}

}  // namespace tern::tools
