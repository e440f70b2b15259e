// Captures and log routing from code: tern_profile_start/stop and
// tern_set_log_callback (include/tern/profile.h). Neither needs tern_init:
// a framework sets its logger up before it initialises devices.
#include <mutex>
#include <string>

#include "common/logging.h"
#include "common/trace.h"
#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"
#include "tern/profile.h"

namespace tern {
namespace {

// The caller's callback, behind the internal one (which takes spdlog's level
// number). Replaced ones are freed once the logger no longer uses them.
struct LogRoute {
  tern_log_callback_t callback;
  void* user_data;
};

void ForwardLog(void* route, int level, const char* message) {
  const auto* to = static_cast<const LogRoute*>(route);
  // spdlog's trace..err are 0..4 as tern_log_level_t; "critical" is not used.
  const tern_log_level_t tern_level =
      level <= 0 ? TERN_LOG_LEVEL_TRACE
                 : (level >= 4 ? TERN_LOG_LEVEL_ERROR : static_cast<tern_log_level_t>(level));
  to->callback(to->user_data, tern_level, message);
}

std::mutex g_route_mutex;
LogRoute* g_route = nullptr;  // guarded by g_route_mutex

}  // namespace
}  // namespace tern

extern "C" {

TERN_API tern_status_t tern_profile_start(const char* path) {
  using namespace tern;
  if (path == nullptr) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "path is NULL; pass the file the capture should be written to"));
  }
  TERN_API_TRY(trace::Start(path));
  return TERN_OK;
}

TERN_API tern_status_t tern_profile_stop(void) {
  using namespace tern;
  TERN_API_TRY(trace::Stop());
  return TERN_OK;
}

TERN_API tern_status_t tern_set_log_callback(tern_log_callback_t callback, void* user_data) {
  using namespace tern;
  std::lock_guard<std::mutex> lock(g_route_mutex);
  LogRoute* old = g_route;
  g_route = callback != nullptr ? new LogRoute{callback, user_data} : nullptr;
  SetLogCallback(g_route != nullptr ? ForwardLog : nullptr, g_route);
  // The sink switched under its own lock: no message uses `old` any more.
  delete old;
  return TERN_OK;
}

}  // extern "C"
