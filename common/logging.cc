#include "common/logging.h"

#include <spdlog/sinks/base_sink.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
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

// stderr, or the host framework's callback (tern_set_log_callback). spdlog's
// base sink takes its mutex around each message, and SetCallback takes the
// same one: a message goes wholly to one destination.
class SwitchableSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void SetCallback(LogCallback callback, void* user_data) {
    std::lock_guard<std::mutex> lock(mutex_);
    callback_ = callback;
    user_data_ = user_data;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (callback_ != nullptr) {
      const std::string text(msg.payload.data(), msg.payload.size());
      callback_(user_data_, static_cast<int>(msg.level), text.c_str());
      return;
    }
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    std::fwrite(formatted.data(), 1, formatted.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  LogCallback callback_ = nullptr;  // guarded by mutex_
  void* user_data_ = nullptr;       // guarded by mutex_
};

// Never destroyed: messages may be logged while static destructors run.
const std::shared_ptr<SwitchableSink>& Sink() {
  static auto* sink = new std::shared_ptr<SwitchableSink>(std::make_shared<SwitchableSink>());
  return *sink;
}

}  // namespace

void SetLogCallback(LogCallback callback, void* user_data) {
  Sink()->SetCallback(callback, user_data);
}

spdlog::logger& Log() {
  // Not registered in spdlog's global registry, so an application's own
  // spdlog configuration neither sees nor changes ours.
  static spdlog::logger* logger = [] {
    auto* created = new spdlog::logger("tern", Sink());
    created->set_pattern("[tern] [%l] %v");
    created->set_level(LevelFromEnvironment());
    created->flush_on(spdlog::level::warn);
    return created;
  }();
  return *logger;
}

}  // namespace tern
