#include "driver_shim/sim/engines/kernel_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <string>
#include <thread>

#include "common/cpu_relax.h"
#include "common/idle_work.h"
#include "common/steerable_thread.h"
#include "common/thread_name.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/engines/warm_up.h"

namespace tern::sim::kernels {
namespace {

// How long a helper keeps looking for the next kernel before it sleeps,
// adapted per helper: doubled when a kernel came while it looked, halved
// when none did. Within an execution the next split kernel usually follows in
// microseconds (the engines' bookkeeping, a small kernel in between), and
// looking saves a futex wake-up; after an execution's last one, looking only
// takes a CPU from the framework's thread, so a helper that keeps finding
// nothing soon looks for 2 us. A late helper costs little: the caller takes
// the parts it has not started.
constexpr int64_t kMinHelperSpinNs = 2'000;
constexpr int64_t kMaxHelperSpinNs = 64'000;
// How long the calling thread spins for parts held by helpers before it
// yields its CPU to them (a helper the OS preempted needs that CPU back).
constexpr auto kCallerSpin = std::chrono::microseconds(50);
// Sleeping helpers a wake-up steers off the caller's CPU (SteerableThread):
// each costs the caller two system calls, and the placement that steering
// undoes puts the woken helpers on the caller's CPU, of which a few moved
// elsewhere suffice.
constexpr int kMaxSteeredHelpers = 3;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace

KernelPool& KernelPool::Instance() {
  // Never destroyed: helpers live as long as the process, and kernels may
  // still run while static destructors do.
  static KernelPool* pool = [] {
    auto* made = new KernelPool(KernelThreadsForHost());
    // Threads polling for a completion take parts (common/idle_work.h).
    if (made->threads() > 1) SetIdleWork([] { return Instance().HelpWithOpenJob(); });
    // A forked child has none of the helpers, and its copy of the pool may
    // say that one was inside a job: it starts afresh.
    pthread_atfork(nullptr, nullptr, [] { Instance().ResetInForkedChild(); });
    return made;
  }();
  return *pool;
}

void KernelPool::ResetInForkedChild() {
  started_.store(false, std::memory_order_relaxed);
  starting_.store(false, std::memory_order_relaxed);
  held_.store(false, std::memory_order_relaxed);
  open_.store(false, std::memory_order_relaxed);
  helpers_inside_.store(0, std::memory_order_relaxed);
  sleepers_.store(0, std::memory_order_relaxed);
  for (int helper = 0; helper < threads_ - 1; ++helper) helper_threads_[helper].Unbind();
}

KernelPool::KernelPool(int threads)
    : threads_(threads < 1 ? 1 : threads),
      helper_threads_(std::make_unique<SteerableThread[]>(threads_ - 1)) {}

KernelPool::~KernelPool() = default;

void KernelPool::Start() {
  if (started_.load(std::memory_order_acquire) || threads_ == 1) return;
  if (starting_.exchange(true, std::memory_order_acq_rel)) {
    while (!started_.load(std::memory_order_acquire)) CpuRelax();
    return;
  }
  for (int helper = 1; helper < threads_; ++helper) {
    std::thread([this, helper] {
      const std::string name = "tern-kernel-" + std::to_string(helper);
      NameThisThread(name.c_str());
      HelperLoop(&helper_threads_[helper - 1]);
    }).detach();
  }
  started_.store(true, std::memory_order_release);
}

void KernelPool::RunParts(int parts, PartFn call, void* context, Wake wake) {
  if (parts == 1 || threads_ == 1 || held_.exchange(true, std::memory_order_acquire)) {
    for (int part = 0; part < parts; ++part) call(context, part);
    return;
  }
  Start();
  call_.store(call, std::memory_order_relaxed);
  context_.store(context, std::memory_order_relaxed);
  parts_.store(parts, std::memory_order_relaxed);
  // Pollers take parts of every job but those that woke the helpers for
  // their hands (see HelpWithOpenJob).
  pollers_take_parts_.store(wake != Wake::kSleepingHelpers, std::memory_order_relaxed);
  next_part_.store(0, std::memory_order_relaxed);
  parts_done_.store(0, std::memory_order_relaxed);
  open_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (wake == Wake::kSleepingHelpers) WakeSleepers();
  if (wake == Wake::kPollersElseSleepingHelpers) {
    // Decided after the caller's first part: a host thread that submitted
    // the execution is often a few microseconds from its wait when the
    // first kernel opens. Woken while that thread polled on one CPU, a
    // helper was placed on the caller's CPU and the two took turns there
    // (the compiled batch-1 MLP: 45-55 us a forward, 39-46 without).
    // A poller that took no part while the caller ran its first one is not
    // running beside it (it shares the caller's CPU, or waits for one): the
    // helpers are woken then too. With the queue's polling engine on the
    // host thread's CPU, the compiled MLP's products ran on that one CPU:
    // 44-45 us a forward against 23-24.
    if (TakeParts(call, context, parts, /*at_most=*/1) > 0) {
      const int next = next_part_.load(std::memory_order_relaxed);
      if (next < parts && (IdlePollers() == 0 || next == 1)) WakeSleepers();
    }
  }

  TakeParts(call, context, parts);

  // Parts that helpers took may still be running.
  const auto spin_until = std::chrono::steady_clock::now() + kCallerSpin;
  for (int i = 0; parts_done_.load(std::memory_order_acquire) != parts; ++i) {
    if ((i & 31) == 31 && std::chrono::steady_clock::now() > spin_until) {
      sched_yield();
    } else {
      CpuRelax();
    }
  }
  // Close the job, then wait until no helper can still read its fields: a
  // helper enters (helpers_inside_) before it checks open_, so either this
  // sees it inside or it sees the job closed.
  open_.store(false, std::memory_order_seq_cst);
  while (helpers_inside_.load(std::memory_order_seq_cst) != 0) CpuRelax();
  held_.store(false, std::memory_order_release);
}

void KernelPool::WakeSleepers() {
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    wake_ups_.fetch_add(1, std::memory_order_relaxed);
    // The caller goes on taking parts: a helper woken onto its CPU would
    // take turns with it there.
    for (int helper = 0; helper < std::min(threads_ - 1, kMaxSteeredHelpers); ++helper) {
      helper_threads_[helper].SteerOffCallingCpu();
    }
    FutexWakeAll(&generation_);
  }
}

int KernelPool::TakeParts(PartFn call, void* context, int parts, int at_most) {
  int taken = 0;
  while (taken < at_most) {
    const int part = next_part_.fetch_add(1, std::memory_order_relaxed);
    if (part >= parts) break;
    call(context, part);
    parts_done_.fetch_add(1, std::memory_order_release);
    ++taken;
  }
  return taken;
}

int KernelPool::TakePartsOfOpenJob(bool as_poller) {
  // Entered before the job is checked (see RunParts: the caller waits for
  // helpers_inside_ to drop before it reuses the job's fields).
  helpers_inside_.fetch_add(1, std::memory_order_seq_cst);
  int taken = 0;
  if (open_.load(std::memory_order_seq_cst) &&
      (!as_poller || pollers_take_parts_.load(std::memory_order_relaxed))) {
    taken =
        TakeParts(call_.load(std::memory_order_relaxed), context_.load(std::memory_order_relaxed),
                  parts_.load(std::memory_order_relaxed));
  }
  helpers_inside_.fetch_sub(1, std::memory_order_seq_cst);
  return taken;
}

bool KernelPool::HelpWithOpenJob() {
  // Cheap when there is nothing: pollers call this between their looks.
  if (!open_.load(std::memory_order_acquire)) return false;
  return TakePartsOfOpenJob(/*as_poller=*/true) > 0;
}

uint32_t KernelPool::WaitForJob(uint32_t seen, int64_t* spin_ns, SteerableThread* self) {
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(*spin_ns);
  for (int i = 0;; ++i) {
    const uint32_t now = generation_.load(std::memory_order_acquire);
    if (now != seen) {
      *spin_ns = std::min(*spin_ns * 2, kMaxHelperSpinNs);
      return now;
    }
    if ((i & 31) == 31 && std::chrono::steady_clock::now() > spin_until) break;
    CpuRelax();
  }
  *spin_ns = std::max(*spin_ns / 2, kMinHelperSpinNs);
  self->BeforeSleep();
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  uint32_t now = generation_.load(std::memory_order_seq_cst);
  while (now == seen) {
    FutexWait(&generation_, seen);
    now = generation_.load(std::memory_order_seq_cst);
  }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  self->AfterWake();
  return now;
}

void KernelPool::HelperLoop(SteerableThread* self) {
  self->BindToCallingThread();
  WarmUpThisThread();
  uint32_t seen = 0;
  int64_t spin_ns = kMaxHelperSpinNs / 4;
  for (;;) {
    seen = WaitForJob(seen, &spin_ns, self);
    TakePartsOfOpenJob(/*as_poller=*/false);
  }
}

}  // namespace tern::sim::kernels
