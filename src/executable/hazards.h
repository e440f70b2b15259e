// The static race check of a function's engine streams: which pairs of
// instructions on different streams may run at the same time (nothing in the
// semaphores orders them) and touch the same bytes, at least one of them
// writing. On hardware the engines of a core run their streams concurrently,
// so such a pair gives a result that depends on timing; the simulated device
// runs one schedule and would hide it.
//
// Happens-before comes from program order within a stream and from semaphore
// edges: a wait for semaphore k to reach v is ordered after a signal X of
// another stream when the waited-for value cannot be reached without X, that
// is, when the signals before X in X's stream plus every signal of the other
// streams that could come first (all of theirs; the waiting stream's own
// before the wait) stay below v. That rule is exact for one signalling
// stream and sound (never orders what hardware would not) for several.
// Vector clocks carry the relation transitively, through third engines too.
//
// Overlap is exact where the operands' strides make it cheap: each operand is
// cut into its contiguous runs of bytes, and two operands overlap when two
// runs do. Operands with more runs than kExactRunLimit fall back to their
// byte extents (first to last byte), which may see an overlap that the
// strides avoid; a race found that way says so.
//
// Cost: O(n * S) for the clocks (n instructions, S streams), O(m log m) to
// sort the m operand extents, and for each operand O(S log n) to find the
// open operands of the other streams that nothing orders with it (a range of
// positions per stream), plus one exact overlap test per such operand whose
// extent overlaps; that test enumerates at most kExactRunLimit runs. A
// race-free program costs O(m S log n) however its operands overlap.
#ifndef TERN_SRC_EXECUTABLE_HAZARDS_H_
#define TERN_SRC_EXECUTABLE_HAZARDS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status_with_message.h"
#include "driver_shim/program.h"
#include "src/executable/schedule.h"

namespace tern::exe {

// Runs per operand up to which overlap is decided exactly.
inline constexpr uint64_t kExactRunLimit = 1 << 14;

struct Race {
  uint32_t first = 0;   // step index (as in ScheduleInput::steps) of the earlier one
  uint32_t second = 0;  // ... of the later one in the simulated schedule
  uint32_t first_slot = 0;
  uint32_t second_slot = 0;
  bool first_writes = false;
  bool second_writes = false;
  tern_segment_t segment = TERN_SEGMENT_NONE;
  uint32_t segment_index = 0;
  uint64_t begin = 0;  // bytes of the segment that both may touch
  uint64_t end = 0;
  bool exact = true;  // false: judged from the operands' extents only
};

// Finds the races of one function. `instructions[i]` is step i of `input`
// (the loader's numbering: stream.begin + position); `order` is a schedule
// that ScheduleStreams produced for `input` (so no stream deadlocks). At most
// `max_races` are stored in `races` (the first ones in schedule order); the
// return value counts them all (one per pair of instructions), up to a floor
// of 65536 operand pairs searched in a program that races everywhere.
// Thread-safety: a pure function of its arguments.
size_t FindRaces(const ScheduleInput& input, std::span<const driver::Instruction> instructions,
                 std::span<const ScheduledStep> order, size_t max_races, std::vector<Race>* races);

// "the tensor engine of core 0, instruction 2 (matmul, graph op 'mlp.fc1')
// writes scratch bytes [0, 32768) and the scalar engine of core 0,
// instruction 0 (unary, graph op 'mlp.relu') reads them, and no semaphore
// orders the two (read-after-write race)": one race, for messages.
std::string DescribeRace(const Race& race, std::span<const driver::Instruction> instructions);

// The races FindRaces stored, joined with "; ", and "; and N more" when
// `count` (its return value) is larger: the body of the loader's and the
// builder's error.
std::string DescribeRaces(std::span<const Race> races, size_t count,
                          std::span<const driver::Instruction> instructions);

// What both errors advise.
inline constexpr char kRaceAdvice[] =
    "The engines of a core run their streams concurrently, so the result would depend on "
    "timing; order each pair with a sem_signal after the first and a sem_wait before the second";

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_HAZARDS_H_
