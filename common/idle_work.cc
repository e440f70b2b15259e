#include "common/idle_work.h"

#include <atomic>

namespace tern {
namespace {

std::atomic<IdleWorkFn> g_idle_work{nullptr};
std::atomic<int> g_idle_pollers{0};

}  // namespace

void SetIdleWork(IdleWorkFn fn) { g_idle_work.store(fn, std::memory_order_release); }

bool RunIdleWork() {
  const IdleWorkFn fn = g_idle_work.load(std::memory_order_acquire);
  return fn != nullptr && fn();
}

int IdlePollers() { return g_idle_pollers.load(std::memory_order_seq_cst); }

IdlePoller::IdlePoller() { g_idle_pollers.fetch_add(1, std::memory_order_seq_cst); }

IdlePoller::~IdlePoller() { g_idle_pollers.fetch_sub(1, std::memory_order_seq_cst); }

}  // namespace tern
