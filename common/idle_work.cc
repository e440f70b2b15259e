#include "common/idle_work.h"

#include <atomic>

namespace tern {
namespace {

std::atomic<IdleWorkFn> g_idle_work{nullptr};

}  // namespace

void SetIdleWork(IdleWorkFn fn) { g_idle_work.store(fn, std::memory_order_release); }

bool RunIdleWork() {
  const IdleWorkFn fn = g_idle_work.load(std::memory_order_acquire);
  return fn != nullptr && fn();
}

}  // namespace tern
