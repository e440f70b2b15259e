// The queue engine's policy for a small command's grace
// (driver_shim/sim/waiter_grace.h): granted while waiters use it, paused
// after misses in a row, tried again after the pause.
#include "driver_shim/sim/waiter_grace.h"

#include <gtest/gtest.h>

namespace tern::sim {
namespace {

TEST(WaiterGrace, StaysGrantedWhileWaitersUseIt) {
  WaiterGrace grace;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(grace.Allowed()) << "grant " << i;
    grace.Note(/*used=*/true);
  }
}

TEST(WaiterGrace, PausesAfterMissesInARowThenTriesAgain) {
  WaiterGrace grace;
  for (int i = 0; i < WaiterGrace::kMissesToPause; ++i) {
    ASSERT_TRUE(grace.Allowed()) << "miss " << i << " should not pause yet";
    grace.Note(/*used=*/false);
  }
  for (int i = 0; i < WaiterGrace::kPausedGrants; ++i) {
    EXPECT_FALSE(grace.Allowed()) << "skipped grant " << i;
  }
  EXPECT_TRUE(grace.Allowed()) << "the pause never ended";
  // A use resets the count: misses must again come in a row.
  grace.Note(/*used=*/false);
  EXPECT_TRUE(grace.Allowed());
  grace.Note(/*used=*/true);
  for (int i = 0; i < WaiterGrace::kMissesToPause - 1; ++i) {
    ASSERT_TRUE(grace.Allowed());
    grace.Note(/*used=*/false);
  }
  EXPECT_TRUE(grace.Allowed()) << "paused after misses that a use interrupted";
}

}  // namespace
}  // namespace tern::sim
