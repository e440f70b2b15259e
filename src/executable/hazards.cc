#include "src/executable/hazards.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "common/isa_rules.h"

namespace tern::exe {
namespace {

// Signals of one stream on one semaphore, in program order.
struct SignalList {
  std::vector<uint32_t> positions;  // in the stream
  std::vector<uint32_t> steps;      // step index
  std::vector<int64_t> before;      // sum of the increments of the earlier ones
  int64_t total = 0;                // of all of them (saturating)
};

int64_t SaturatingAdd(int64_t a, int64_t b) { return b > INT64_MAX - a ? INT64_MAX : a + b; }

// Per step: how many steps of each stream happen before it (itself included
// for its own stream). A step x of stream A at position p happens before y
// when clock(y)[A] > p.
//
// A wait is ordered after a signal X of stream A when the waited-for value
// cannot be reached without X: A's signals before X, plus what the other
// streams can signal before the wait, stay below it. "What the others can
// signal before the wait" excludes their signals already known to come after
// the wait (a stream that signals again only after waiting on this one's
// progress, as a single shared semaphore handed from engine to engine does).
// Knowing more of the order excludes more, which orders more: the clocks are
// recomputed until nothing changes. Every round is sound on its own.
class Clocks {
 public:
  Clocks(const ScheduleInput& input, std::span<const ScheduledStep> order)
      : input_(input), order_(order), streams_(input.streams.size()) {
    for (uint32_t s = 0; s < streams_; ++s) {
      const auto& stream = input.streams[s];
      for (uint32_t i = stream.begin; i < stream.end; ++i) {
        const SyncStep& step = input.steps[i];
        if (step.kind != SyncStep::kSignal) continue;
        SignalList& list = signals_[{stream.core, step.semaphore}][s];
        list.positions.push_back(i - stream.begin);
        list.steps.push_back(i);
        list.before.push_back(list.total);
        list.total = SaturatingAdd(list.total, step.value);
      }
    }
    constexpr int kMaxRounds = 16;  // each round only adds order; stop early when stable
    std::vector<uint32_t> previous;
    for (int round = 0; round < kMaxRounds; ++round) {
      std::vector<uint32_t> next = Compute(previous);
      const bool stable = next == previous;
      previous = std::move(next);
      if (stable) break;
    }
    clock_ = std::move(previous);
  }

  // Whether step x (of stream `x_stream`, at `x_position`) happens before y.
  bool Before(uint32_t x_stream, uint32_t x_position, uint32_t y) const {
    return clock_[static_cast<size_t>(y) * streams_ + x_stream] > x_position;
  }

 private:
  // One round; `known` is the previous round's clocks (empty: none yet).
  std::vector<uint32_t> Compute(const std::vector<uint32_t>& known) const {
    std::vector<uint32_t> clock(input_.steps.size() * streams_, 0);
    auto of = [&](uint32_t step) { return clock.data() + static_cast<size_t>(step) * streams_; };
    // What stream `list` can signal without anything known to come after the
    // wait at `position` of stream `waiter`.
    auto possible_before = [&](const SignalList& list, uint32_t waiter, uint32_t position) {
      if (known.empty()) return list.total;
      // Its signals after the wait form a suffix (order grows along a stream).
      const auto after =
          std::partition_point(list.steps.begin(), list.steps.end(), [&](uint32_t step) {
            return known[static_cast<size_t>(step) * streams_ + waiter] <= position;
          });
      const size_t n = static_cast<size_t>(after - list.steps.begin());
      return n == list.steps.size() ? list.total : list.before[n];
    };

    std::vector<int64_t> last_step(streams_, -1);  // previous step of each stream
    for (const ScheduledStep& scheduled : order_) {
      const auto& stream = input_.streams[scheduled.stream];
      const uint32_t index = stream.begin + scheduled.position;
      uint32_t* here = of(index);
      if (last_step[scheduled.stream] >= 0) {
        std::copy_n(of(static_cast<uint32_t>(last_step[scheduled.stream])), streams_, here);
      }
      here[scheduled.stream] = scheduled.position + 1;
      last_step[scheduled.stream] = index;

      const SyncStep& step = input_.steps[index];
      if (step.kind != SyncStep::kWait) continue;
      auto found = signals_.find({stream.core, step.semaphore});
      if (found == signals_.end()) continue;
      const auto& by_stream = found->second;
      // What the waiting stream itself signalled before the wait.
      int64_t own_before = 0;
      auto own = by_stream.find(scheduled.stream);
      if (own != by_stream.end()) {
        const SignalList& list = own->second;
        const size_t n = static_cast<size_t>(
            std::lower_bound(list.positions.begin(), list.positions.end(), scheduled.position) -
            list.positions.begin());
        own_before = n == list.positions.size() ? list.total : list.before[n];
      }
      for (const auto& [s, list] : by_stream) {
        if (s == scheduled.stream) continue;
        // Without its signal j and later ones, stream s contributes at most
        // before[j]; the others at most what they can signal first.
        int64_t others = own_before;
        for (const auto& [t, other] : by_stream) {
          if (t != s && t != scheduled.stream) {
            others =
                SaturatingAdd(others, possible_before(other, scheduled.stream, scheduled.position));
          }
        }
        if (others >= step.value) continue;  // reachable without s at all
        const int64_t need = step.value - others;
        // The last j with before[j] < need: signals 0..j must all have run.
        const size_t count = static_cast<size_t>(
            std::lower_bound(list.before.begin(), list.before.end(), need) - list.before.begin());
        if (count == 0) continue;
        const uint32_t* signal_clock = of(list.steps[count - 1]);
        for (uint32_t k = 0; k < streams_; ++k) here[k] = std::max(here[k], signal_clock[k]);
      }
    }
    return clock;
  }

  const ScheduleInput& input_;
  const std::span<const ScheduledStep> order_;
  const uint32_t streams_;
  // Who signals what: (core, semaphore) -> stream -> its signals.
  std::map<std::pair<uint32_t, int64_t>, std::map<uint32_t, SignalList>> signals_;
  std::vector<uint32_t> clock_;
};

// One operand's bytes in its segment.
struct Touch {
  tern_segment_t segment;
  uint32_t segment_index;
  uint64_t begin;
  uint64_t end;
  uint32_t step;
  uint32_t slot;
  bool writes;
};

// The contiguous byte runs of an operand: [start, start + run_bytes) offsets
// of its segment, sorted; `exact` false when there are more than
// kExactRunLimit of them (then only the extent is known).
struct RunSet {
  bool exact = false;
  uint64_t run_bytes = 0;
  std::vector<uint64_t> starts;
};

RunSet Runs(const isa::OperandDesc& desc) {
  RunSet runs;
  const uint64_t size = isa::DTypeSize(desc.dtype);
  // Dimensions that add addresses: size > 1 and stride != 0.
  int64_t shape[TERN_MAX_RANK];
  int64_t strides[TERN_MAX_RANK];
  uint32_t rank = 0;
  for (uint32_t d = 0; d < desc.rank; ++d) {
    if (desc.shape[d] == 0) {
      runs.exact = true;  // no element at all
      return runs;
    }
    if (desc.shape[d] == 1 || desc.strides[d] == 0) continue;
    shape[rank] = desc.shape[d];
    strides[rank] = desc.strides[d];
    ++rank;
  }
  // Fold the innermost dimensions that are contiguous into one run.
  uint64_t run_elements = 1;
  while (rank > 0 && strides[rank - 1] == static_cast<int64_t>(run_elements)) {
    run_elements *= static_cast<uint64_t>(shape[rank - 1]);
    --rank;
  }
  uint64_t count = 1;
  for (uint32_t d = 0; d < rank; ++d) {
    if (static_cast<uint64_t>(shape[d]) > kExactRunLimit / count) return runs;
    count *= static_cast<uint64_t>(shape[d]);
  }
  runs.exact = true;
  runs.run_bytes = run_elements * size;
  runs.starts.reserve(count);
  int64_t index[TERN_MAX_RANK] = {};
  for (uint64_t r = 0; r < count; ++r) {
    uint64_t offset = desc.offset;
    for (uint32_t d = 0; d < rank; ++d)
      offset += static_cast<uint64_t>(index[d] * strides[d]) * size;
    runs.starts.push_back(offset);
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  std::sort(runs.starts.begin(), runs.starts.end());
  return runs;
}

// Whether two operands, whose extents overlap, share a byte; *exact false
// when only their extents could be compared.
bool Overlap(const RunSet& a, const RunSet& b, bool* exact) {
  if (!a.exact || !b.exact) {
    *exact = false;
    return true;
  }
  *exact = true;
  // Two sorted lists of runs of one length each: walk them together.
  size_t i = 0, j = 0;
  while (i < a.starts.size() && j < b.starts.size()) {
    const uint64_t a_begin = a.starts[i], a_end = a_begin + a.run_bytes;
    const uint64_t b_begin = b.starts[j], b_end = b_begin + b.run_bytes;
    if (a_begin < b_end && b_begin < a_end) return true;
    if (a_end <= b_begin) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

// A racy program can have a race for almost every pair of its instructions:
// the search stops after this many operand pairs (the count is then a floor).
constexpr size_t kMaxRacesSearched = 1 << 16;

const char* SegmentName(tern_segment_t segment) {
  switch (segment) {
    case TERN_SEGMENT_INPUT:
      return "input";
    case TERN_SEGMENT_OUTPUT:
      return "output";
    case TERN_SEGMENT_CONSTANT:
      return "constants";
    case TERN_SEGMENT_SCRATCH:
      return "scratch";
    default:
      return "no";
  }
}

}  // namespace

size_t FindRaces(const ScheduleInput& input, std::span<const driver::Instruction> instructions,
                 std::span<const ScheduledStep> order, size_t max_races, std::vector<Race>* races) {
  races->clear();
  if (input.streams.size() < 2) return 0;  // one stream is ordered by itself
  std::vector<uint32_t> stream_of(input.steps.size(), 0);
  std::vector<uint32_t> rank_in_order(input.steps.size(), 0);
  for (uint32_t s = 0; s < input.streams.size(); ++s) {
    for (uint32_t i = input.streams[s].begin; i < input.streams[s].end; ++i) stream_of[i] = s;
  }
  for (uint32_t k = 0; k < order.size(); ++k) {
    rank_in_order[input.streams[order[k].stream].begin + order[k].position] = k;
  }
  const Clocks clocks(input, order);

  std::vector<Touch> touches;
  for (uint32_t i = 0; i < instructions.size(); ++i) {
    const driver::Instruction& instruction = instructions[i];
    if (isa::OpcodeEngine(instruction.opcode) == TERN_ENGINE_SYNC) continue;
    for (uint32_t k = 0; k < instruction.operands.size(); ++k) {
      const isa::OperandDesc& desc = instruction.operands[k];
      // Constants are never written (the loader refuses it), so never race.
      if (!desc.present() || desc.segment == TERN_SEGMENT_CONSTANT) continue;
      uint64_t begin = 0, end = 0;
      if (!isa::OperandExtent(desc, &begin, &end).ok() || begin == end) continue;
      touches.push_back({desc.segment, desc.index, begin, end, i, k,
                         isa::OperandIsWritten(instruction.opcode, k)});
    }
  }
  std::sort(touches.begin(), touches.end(), [](const Touch& x, const Touch& y) {
    return std::tie(x.segment, x.segment_index, x.begin) <
           std::tie(y.segment, y.segment_index, y.begin);
  });

  // Each operand's runs, computed the first time a pair needs them.
  std::vector<std::optional<RunSet>> runs(touches.size());
  auto runs_of = [&](size_t t) -> const RunSet& {
    if (!runs[t]) runs[t] = Runs(instructions[touches[t].step].operands[touches[t].slot]);
    return *runs[t];
  };

  // The sweep over each segment's touches in order of their first byte keeps
  // the touches whose extent is still open, per stream and by position,
  // writers apart from readers. A new touch y is compared only with the open
  // touches of another stream that neither happen before y nor after it:
  // along a stream, "happens before y" holds for a prefix of the positions
  // and "y happens before it" for a suffix (program order), so those touches
  // lie in one range of positions per stream, found by binary search. Reads
  // are not compared with reads. A race-free program thus costs
  // O(log n) per touch and stream, even when every instruction touches one
  // buffer.
  struct OpenTouches {
    std::multimap<uint32_t, size_t> writers;  // position -> touch
    std::multimap<uint32_t, size_t> readers;
  };
  std::vector<OpenTouches> open(input.streams.size());
  std::vector<Race> found;
  // Compares y with the touches of `list` at positions [lo, hi); drops the
  // ones whose extent closed before y begins (the sweep never reopens them).
  auto compare = [&](std::multimap<uint32_t, size_t>& list, uint32_t lo, uint32_t hi, size_t t) {
    const Touch& y = touches[t];
    for (auto it = list.lower_bound(lo); it != list.end() && it->first < hi;) {
      const Touch& x = touches[it->second];
      if (x.end <= y.begin) {
        it = list.erase(it);
        continue;
      }
      bool exact = true;
      if (Overlap(runs_of(it->second), runs_of(t), &exact)) {
        if (found.size() >= kMaxRacesSearched) return;
        const bool x_first = rank_in_order[x.step] < rank_in_order[y.step];
        const Touch& first = x_first ? x : y;
        const Touch& second = x_first ? y : x;
        found.push_back({first.step, second.step, first.slot, second.slot, first.writes,
                         second.writes, y.segment, y.segment_index, std::max(x.begin, y.begin),
                         std::min(x.end, y.end), exact});
      }
      ++it;
    }
  };
  for (size_t t = 0; t < touches.size() && found.size() < kMaxRacesSearched; ++t) {
    const Touch& y = touches[t];
    if (t > 0 &&
        (touches[t - 1].segment != y.segment || touches[t - 1].segment_index != y.segment_index)) {
      for (OpenTouches& list : open) {
        list.writers.clear();
        list.readers.clear();
      }
    }
    const uint32_t sy = stream_of[y.step];
    const uint32_t py = y.step - input.streams[sy].begin;
    for (uint32_t s = 0; s < input.streams.size(); ++s) {
      if (s == sy || (open[s].writers.empty() && (!y.writes || open[s].readers.empty()))) {
        continue;
      }
      const uint32_t begin = input.streams[s].begin;
      const uint32_t length = input.streams[s].end - begin;
      // [lo, hi): the positions of stream s that y is not ordered with.
      uint32_t lo = 0, hi = length;
      for (uint32_t count = length; count > 0;) {  // first p not before y
        const uint32_t half = count / 2;
        if (clocks.Before(s, lo + half, y.step)) {
          lo += half + 1;
          count -= half + 1;
        } else {
          count = half;
        }
      }
      uint32_t first_after = lo;
      for (uint32_t count = hi - lo; count > 0;) {  // first p that y is before
        const uint32_t half = count / 2;
        if (!clocks.Before(sy, py, begin + first_after + half)) {
          first_after += half + 1;
          count -= half + 1;
        } else {
          count = half;
        }
      }
      hi = first_after;
      if (lo >= hi) continue;
      compare(open[s].writers, lo, hi, t);
      if (y.writes) compare(open[s].readers, lo, hi, t);
    }
    (y.writes ? open[sy].writers : open[sy].readers).emplace(py, t);
  }
  // One race per pair of instructions (the first slot pair found), the
  // earliest in schedule order first.
  std::sort(found.begin(), found.end(), [&](const Race& a, const Race& b) {
    return std::make_pair(rank_in_order[a.first], rank_in_order[a.second]) <
           std::make_pair(rank_in_order[b.first], rank_in_order[b.second]);
  });
  found.erase(std::unique(found.begin(), found.end(),
                          [](const Race& a, const Race& b) {
                            return a.first == b.first && a.second == b.second;
                          }),
              found.end());
  const size_t total = found.size();
  if (found.size() > max_races) found.resize(max_races);
  *races = std::move(found);
  return total;
}

std::string DescribeRace(const Race& race, std::span<const driver::Instruction> instructions) {
  auto place = [&](uint32_t step) {
    const driver::Instruction& instruction = instructions[step];
    std::string text = fmt::format("the {} engine of core {}, instruction {} ({}",
                                   isa::EngineName(instruction.engine), instruction.core,
                                   instruction.position, isa::OpcodeName(instruction.opcode));
    if (!instruction.debug_op.empty()) text += fmt::format(", graph op '{}'", instruction.debug_op);
    return text + ")";
  };
  const char* kind = race.first_writes && race.second_writes ? "write-after-write"
                     : race.first_writes                     ? "read-after-write"
                                                             : "write-after-read";
  std::string segment = SegmentName(race.segment);
  if (race.segment == TERN_SEGMENT_INPUT || race.segment == TERN_SEGMENT_OUTPUT) {
    segment += fmt::format(" {}", race.segment_index);
  }
  return fmt::format(
      "{} {} {} bytes [{}, {}) and {} {} them, and no semaphore orders the two ({} race{})",
      place(race.first), race.first_writes ? "writes" : "reads", segment, race.begin, race.end,
      place(race.second), race.second_writes ? "writes" : "reads", kind,
      race.exact ? "" : "; judged from the operands' extents, their strides may avoid it");
}

std::string DescribeRaces(std::span<const Race> races, size_t count,
                          std::span<const driver::Instruction> instructions) {
  std::string named;
  for (const Race& race : races) {
    if (!named.empty()) named += "; ";
    named += DescribeRace(race, instructions);
  }
  if (count > races.size()) named += fmt::format("; and {} more", count - races.size());
  return named;
}

}  // namespace tern::exe
