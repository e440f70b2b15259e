// The process-wide handle generation counter and the error of a full table.
#include "src/runtime/handle_table.h"

#include <atomic>

#include "src/runtime/runtime_state.h"

namespace tern {

uint32_t NextHandleGeneration() {
  static std::atomic<uint32_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

Status HandleTableFull(const char* what) {
  return MakeStatus(TERN_ERROR_HOST_OUT_OF_MEMORY,
                    "this process already holds the most live {} tern can track ({}); free "
                    "some: so many live at once usually means they are leaked",
                    what, kMaxLiveHandles);
}

}  // namespace tern
