// A lock for a few instructions of work, taken in polling loops: cheaper than
// a mutex when uncontended, and never sleeps.
#ifndef TERN_COLLECTIVES_SPIN_LOCK_H_
#define TERN_COLLECTIVES_SPIN_LOCK_H_

#include <atomic>

namespace tern::comm {

class SpinLock {
 public:
  void lock() {
    while (flag_.test_and_set(std::memory_order_acquire)) {
      while (flag_.test(std::memory_order_relaxed)) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  void unlock() { flag_.clear(std::memory_order_release); }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_SPIN_LOCK_H_
