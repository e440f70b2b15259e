// SignalDispositionGuard: keeps the host program's handling of fatal and
// terminating signals across code that may change it behind tern's back.
//
// Loading libfabric (and initialising some of its providers) runs library
// constructors that install their own handlers: libfabric's psm provider
// pulls in libinfinipath, which catches SIGSEGV, SIGBUS, SIGILL, SIGABRT,
// SIGINT and SIGTERM to write a backtrace file into the working directory and
// exit(1). A runtime must not change how its host program crashes or stops,
// so the guard records the dispositions of those signals when it is created
// and puts back, when it is destroyed, any that changed meanwhile.
//
// Signals a provider may rely on (SIGPIPE, SIGCHLD, SIGUSR1/2, real-time
// signals) are left as the provider set them.
#ifndef TERN_COLLECTIVES_SIGNAL_DISPOSITION_GUARD_H_
#define TERN_COLLECTIVES_SIGNAL_DISPOSITION_GUARD_H_

#include <signal.h>

#include <array>
#include <mutex>

namespace tern::comm {

class SignalDispositionGuard {
 public:
  // Records the current dispositions. Guards are serialised process-wide (a
  // guard holds a lock for its lifetime; nesting in one thread is allowed),
  // so two threads opening fabric channels cannot record each other's
  // foreign handlers as the program's own.
  // Thread-safety: any thread.
  SignalDispositionGuard();
  // Restores every recorded disposition that changed (logged at debug level).
  ~SignalDispositionGuard();

  SignalDispositionGuard(const SignalDispositionGuard&) = delete;
  SignalDispositionGuard& operator=(const SignalDispositionGuard&) = delete;

  // The signals kept: those whose default action ends the process.
  static constexpr std::array<int, 13> kSignals = {SIGHUP,  SIGINT,  SIGQUIT, SIGILL,  SIGTRAP,
                                                   SIGABRT, SIGBUS,  SIGFPE,  SIGSEGV, SIGTERM,
                                                   SIGSYS,  SIGXCPU, SIGXFSZ};

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  std::array<struct sigaction, kSignals.size()> saved_{};
  std::array<bool, kSignals.size()> recorded_{};
};

}  // namespace tern::comm

#endif  // TERN_COLLECTIVES_SIGNAL_DISPOSITION_GUARD_H_
