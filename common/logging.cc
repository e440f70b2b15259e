#include "common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace tern {
namespace {

spdlog::level::level_enum LevelFromEnvironment() {
  const char* value = std::getenv("TERN_LOG_LEVEL");
  if (value == nullptr || *value == '\0') return spdlog::level::warn;
  std::string level(value);
  if (level == "warning") level = "warn";
  spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept an explicit "off".
  if (parsed == spdlog::level::off && level != "off") {
    std::fprintf(stderr,
                 "[tern] [warning] TERN_LOG_LEVEL=%s is not a level; use trace, debug, info, warn, "
                 "error or off. Using warn.\n",
                 value);
    return spdlog::level::warn;
  }
  return parsed;
}

}  // namespace

spdlog::logger& Log() {
  // Not registered in spdlog's global registry, so an application's own
  // spdlog configuration neither sees nor changes ours.
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* created = new spdlog::logger("tern", sink);
    created->set_pattern("[tern] [%l] %v");
    created->set_level(LevelFromEnvironment());
    created->flush_on(spdlog::level::warn);
    return created;
  }();
  return *logger;
}

}  // namespace tern
