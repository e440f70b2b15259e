// Whether a polling queue engine grants a newly submitted small command's
// grace (kWaiterGraceNs in sim_queue.cc: a moment in which a host thread on
// its way to wait for the command may run it itself, on its own CPU). The
// grace is granted only while waiters come: after kMissesToPause grants in
// a row that no waiter used (a framework that submits small copies and
// fills and goes on with its own work), the next kPausedGrants are skipped,
// and then it tries again. So a program that waits after each submission
// keeps the grace, and one that never waits pays it about once in every
// kPausedGrants + kMissesToPause small commands that find the engine idle.
//
// Thread safety: none; one engine thread owns each.
#ifndef TERN_DRIVER_SHIM_SIM_WAITER_GRACE_H_
#define TERN_DRIVER_SHIM_SIM_WAITER_GRACE_H_

namespace tern::sim {

class WaiterGrace {
 public:
  static constexpr int kMissesToPause = 4;
  static constexpr int kPausedGrants = 64;

  // Asked when a grace could be granted; false while paused (and counts the
  // skipped grant).
  bool Allowed() {
    if (paused_left_ == 0) return true;
    --paused_left_;
    return false;
  }
  // After a granted grace: whether a waiter ran the command (or held the
  // runner role) rather than the engine.
  void Note(bool used) {
    if (used) {
      misses_in_a_row_ = 0;
    } else if (++misses_in_a_row_ == kMissesToPause) {
      misses_in_a_row_ = 0;
      paused_left_ = kPausedGrants;
    }
  }

 private:
  int misses_in_a_row_ = 0;
  int paused_left_ = 0;
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_WAITER_GRACE_H_
