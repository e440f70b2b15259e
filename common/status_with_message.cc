#include "common/status_with_message.h"

#include <cstring>

namespace tern {

const std::string& Status::EmptyMessage() {
  static const std::string empty;
  return empty;
}

Status ErrnoStatus(tern_status_t code, int err, std::string_view what) {
  return Status(code, fmt::format("{} failed: {} (errno {})", what, std::strerror(err), err));
}

}  // namespace tern
