// Internal status type shared by libtern and the driver shim: a code from
// tern/status.h plus a message that says what failed, why and what to do.
#ifndef TERN_COMMON_STATUS_WITH_MESSAGE_H_
#define TERN_COMMON_STATUS_WITH_MESSAGE_H_

#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>

#include "tern/status.h"

namespace tern {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(tern_status_t code, std::string message)
      : code_(code),
        message_(message.empty() ? nullptr
                                 : std::make_shared<const std::string>(std::move(message))) {}

  bool ok() const { return code_ == TERN_OK; }
  tern_status_t code() const { return code_; }
  const std::string& message() const { return message_ ? *message_ : EmptyMessage(); }

  // Prefixes context to the message ("opening core 0: ..."), keeping the code.
  Status WithContext(std::string_view context) const {
    if (ok()) return *this;
    return Status(code_, fmt::format("{}: {}", context, message()));
  }

 private:
  static const std::string& EmptyMessage();

  tern_status_t code_ = TERN_OK;
  // Out of line and shared (a message never changes), so that an OK status
  // (on every call's path) is three words and costs nothing to make, copy,
  // move or drop.
  std::shared_ptr<const std::string> message_;
};

inline Status OkStatus() { return Status(); }

template <typename... Args>
Status MakeStatus(tern_status_t code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// "TERN_ERROR_INVALID_HANDLE": the name of a status code, "TERN_ERROR_UNKNOWN"
// for a number this version does not know. The one table of names: the public
// tern_status_string() returns it, and code below libtern (the executable
// dumper, the fuzzer) prints it. Thread-safety: any thread.
const char* StatusCodeName(tern_status_t status);

// Formats errno into a Status with the failing call named.
Status ErrnoStatus(tern_status_t code, int err, std::string_view what);

}  // namespace tern

#define TERN_RETURN_IF_ERROR(expr)                       \
  do {                                                   \
    ::tern::Status tern_status_tmp_ = (expr);            \
    if (!tern_status_tmp_.ok()) return tern_status_tmp_; \
  } while (0)

#endif  // TERN_COMMON_STATUS_WITH_MESSAGE_H_
