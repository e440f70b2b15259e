#include "common/status.h"

#include <cstring>

namespace tern {

Status ErrnoStatus(tern_status_t code, int err, std::string_view what) {
  return Status(code, fmt::format("{} failed: {} (errno {})", what, std::strerror(err), err));
}

}  // namespace tern
