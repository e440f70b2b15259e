// Logging through spdlog. The level comes from TERN_LOG_LEVEL (trace, debug,
// info, warn, error, off; default warn); messages go to stderr as
// "[tern] [level] text", or to a callback (tern_set_log_callback).
#ifndef TERN_COMMON_LOGGING_H_
#define TERN_COMMON_LOGGING_H_

#include <spdlog/spdlog.h>

namespace tern {

// The process-wide tern logger, created on first use.
spdlog::logger& Log();

// Receives each message instead of stderr: `level` is spdlog's level number
// (trace 0 ... error 4), `message` the text without prefix or newline.
using LogCallback = void (*)(void* user_data, int level, const char* message);

// Routes messages to `callback` (nullptr: back to stderr).
// Thread-safety: any thread; each message goes wholly to one destination.
void SetLogCallback(LogCallback callback, void* user_data);

}  // namespace tern

#define TERN_LOG_TRACE(...) ::tern::Log().trace(__VA_ARGS__)
#define TERN_LOG_DEBUG(...) ::tern::Log().debug(__VA_ARGS__)
#define TERN_LOG_INFO(...) ::tern::Log().info(__VA_ARGS__)
#define TERN_LOG_WARN(...) ::tern::Log().warn(__VA_ARGS__)
#define TERN_LOG_ERROR(...) ::tern::Log().error(__VA_ARGS__)

#endif  // TERN_COMMON_LOGGING_H_
