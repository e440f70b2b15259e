#include "signal_disposition_guard.h"

#include <string.h>

#include "common/logging.h"

namespace tern::comm {
namespace {

std::recursive_mutex& GuardMutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

// The handler (or SIG_DFL / SIG_IGN) and the flags that say how it runs.
bool SameDisposition(const struct sigaction& a, const struct sigaction& b) {
  const bool a_info = (a.sa_flags & SA_SIGINFO) != 0;
  const bool b_info = (b.sa_flags & SA_SIGINFO) != 0;
  if (a_info != b_info) return false;
  if (a_info ? a.sa_sigaction != b.sa_sigaction : a.sa_handler != b.sa_handler) return false;
  return a.sa_flags == b.sa_flags;
}

}  // namespace

SignalDispositionGuard::SignalDispositionGuard() : lock_(GuardMutex()) {
  for (size_t i = 0; i < kSignals.size(); ++i) {
    recorded_[i] = sigaction(kSignals[i], nullptr, &saved_[i]) == 0;
  }
}

SignalDispositionGuard::~SignalDispositionGuard() {
  for (size_t i = 0; i < kSignals.size(); ++i) {
    if (!recorded_[i]) continue;
    struct sigaction now {};
    if (sigaction(kSignals[i], nullptr, &now) != 0 || SameDisposition(now, saved_[i])) continue;
    if (sigaction(kSignals[i], &saved_[i], nullptr) == 0) {
      TERN_LOG_DEBUG(
          "libfabric or one of its providers installed a handler for SIG{}; the "
          "program's own disposition is restored",
          sigabbrev_np(kSignals[i]));
    }
  }
}

}  // namespace tern::comm
