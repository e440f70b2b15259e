// The static race check (src/executable/hazards.h) on small programs written
// step by step: the missing semaphore of a matmul followed by a relu, each
// kind of race, strided views that interleave or overlap, orders carried
// through a third engine, and waits that several engines signal.
#include "src/executable/hazards.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/isa_rules.h"
#include "src/executable/schedule.h"

namespace tern::exe {
namespace {

isa::OperandDesc Operand(tern_segment_t segment, uint64_t offset, std::vector<int64_t> shape,
                         std::vector<int64_t> strides = {}, uint32_t index = 0) {
  isa::OperandDesc desc;
  desc.segment = segment;
  desc.index = index;
  desc.offset = offset;
  desc.dtype = TERN_DTYPE_F32;
  desc.rank = static_cast<uint32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) desc.shape[d] = shape[d];
  if (strides.empty()) {
    EXPECT_TRUE(isa::SetContiguousStrides(&desc));
  } else {
    for (size_t d = 0; d < strides.size(); ++d) desc.strides[d] = strides[d];
  }
  return desc;
}

isa::OperandDesc Scratch(uint64_t offset, std::vector<int64_t> shape,
                         std::vector<int64_t> strides = {}) {
  return Operand(TERN_SEGMENT_SCRATCH, offset, std::move(shape), std::move(strides));
}

driver::Instruction Op(uint32_t opcode, std::vector<isa::OperandDesc> operands,
                       std::string debug_op = "") {
  driver::Instruction instruction;
  instruction.opcode = opcode;
  instruction.operands = std::move(operands);
  instruction.debug_op = std::move(debug_op);
  return instruction;
}

driver::Instruction Signal(int64_t semaphore, int64_t increment = 1) {
  driver::Instruction instruction = Op(TERN_OP_SEM_SIGNAL, {});
  instruction.ints = {semaphore, increment};
  return instruction;
}

driver::Instruction Wait(int64_t semaphore, int64_t value) {
  driver::Instruction instruction = Op(TERN_OP_SEM_WAIT, {});
  instruction.ints = {semaphore, value};
  return instruction;
}

// A function's streams, as the loader hands them to the check.
class Program {
 public:
  Program& Stream(tern_engine_t engine, std::vector<driver::Instruction> list, uint32_t core = 0) {
    ScheduleInput::Stream stream;
    stream.core = core;
    stream.engine = engine;
    stream.begin = static_cast<uint32_t>(input_.steps.size());
    uint32_t position = 0;
    for (driver::Instruction instruction : list) {
      instruction.engine = engine;
      instruction.core = core;
      instruction.position = position++;
      SyncStep step;
      if (instruction.opcode == TERN_OP_SEM_SIGNAL || instruction.opcode == TERN_OP_SEM_WAIT) {
        step.kind = instruction.opcode == TERN_OP_SEM_WAIT ? SyncStep::kWait : SyncStep::kSignal;
        step.semaphore = instruction.ints[0];
        step.value = instruction.ints[1];
      }
      input_.steps.push_back(step);
      instructions_.push_back(std::move(instruction));
    }
    stream.end = static_cast<uint32_t>(input_.steps.size());
    input_.streams.push_back(stream);
    return *this;
  }

  // The races, and their descriptions in `text`.
  std::vector<Race> Races(std::string* text = nullptr) {
    std::vector<ScheduledStep> order;
    Status scheduled = ScheduleStreams(input_, &order);
    EXPECT_TRUE(scheduled.ok()) << scheduled.message();
    std::vector<Race> races;
    const size_t count = FindRaces(input_, instructions_, order, 16, &races);
    EXPECT_EQ(count, races.size());
    if (text != nullptr) {
      text->clear();
      for (const Race& race : races) *text += DescribeRace(race, instructions_) + "\n";
    }
    return races;
  }

 private:
  ScheduleInput input_;
  std::vector<driver::Instruction> instructions_;
};

const driver::Instruction kMatmulIntoScratch =
    Op(TERN_OP_MATMUL,
       {Scratch(0, {4, 8}), Operand(TERN_SEGMENT_INPUT, 0, {4, 2}),
        Operand(TERN_SEGMENT_CONSTANT, 0, {2, 8})},
       "mlp.fc1");
const driver::Instruction kReluInPlace =
    Op(TERN_OP_UNARY, {Scratch(0, {4, 8}), Scratch(0, {4, 8})}, "mlp.relu");

TEST(Hazards, MatmulThenReluWithoutSemaphoreRaces) {
  Program program;
  program.Stream(TERN_ENGINE_TENSOR, {kMatmulIntoScratch})
      .Stream(TERN_ENGINE_SCALAR, {kReluInPlace});
  std::string text;
  const std::vector<Race> races = program.Races(&text);
  ASSERT_EQ(1u, races.size()) << text;
  EXPECT_TRUE(races[0].first_writes);
  EXPECT_TRUE(races[0].second_writes);
  EXPECT_TRUE(races[0].exact);
  EXPECT_EQ(0u, races[0].begin);
  EXPECT_EQ(128u, races[0].end);
  EXPECT_NE(std::string::npos, text.find("the tensor engine of core 0, instruction 0 (matmul, "
                                         "graph op 'mlp.fc1') writes scratch bytes [0, 128)"))
      << text;
  EXPECT_NE(std::string::npos, text.find("the scalar engine of core 0, instruction 0 (unary, "
                                         "graph op 'mlp.relu')"))
      << text;
  EXPECT_NE(std::string::npos, text.find("no semaphore orders the two")) << text;
}

TEST(Hazards, SemaphoreOrdersThem) {
  Program program;
  program.Stream(TERN_ENGINE_TENSOR, {kMatmulIntoScratch, Signal(0)})
      .Stream(TERN_ENGINE_SCALAR, {Wait(0, 1), kReluInPlace});
  EXPECT_TRUE(program.Races().empty());
}

TEST(Hazards, SignalBeforeTheWriteDoesNotOrderIt) {
  Program program;
  program.Stream(TERN_ENGINE_TENSOR, {Signal(0), kMatmulIntoScratch})
      .Stream(TERN_ENGINE_SCALAR, {Wait(0, 1), kReluInPlace});
  EXPECT_EQ(1u, program.Races().size());
}

TEST(Hazards, EachKindIsNamed) {
  const auto read = Op(TERN_OP_COPY, {Scratch(512, {16}), Scratch(0, {16})});
  const auto write = Op(TERN_OP_FILL, {Scratch(0, {16})});
  (void)read;
  std::string text;
  Program war;
  war.Stream(TERN_ENGINE_VECTOR, {Op(TERN_OP_UNARY, {Scratch(512, {16}), Scratch(0, {16})})})
      .Stream(TERN_ENGINE_DMA, {write});
  ASSERT_EQ(1u, war.Races(&text).size());
  EXPECT_NE(std::string::npos, text.find("write-after-read race")) << text;
  Program raw;
  raw.Stream(TERN_ENGINE_DMA, {write})
      .Stream(TERN_ENGINE_SCALAR, {Op(TERN_OP_UNARY, {Scratch(512, {16}), Scratch(0, {16})})});
  ASSERT_EQ(1u, raw.Races(&text).size());
  EXPECT_NE(std::string::npos, text.find("read-after-write race")) << text;
  Program waw;
  waw.Stream(TERN_ENGINE_DMA, {write}).Stream(TERN_ENGINE_SCALAR, {kReluInPlace});
  ASSERT_EQ(1u, waw.Races(&text).size());
  EXPECT_NE(std::string::npos, text.find("write-after-write race")) << text;
}

TEST(Hazards, ReadsNeverRaceAndDisjointBytesNeverRace) {
  Program reads;
  reads.Stream(TERN_ENGINE_DMA, {Op(TERN_OP_COPY, {Scratch(512, {16}), Scratch(0, {16})})})
      .Stream(TERN_ENGINE_SCALAR, {Op(TERN_OP_UNARY, {Scratch(1024, {16}), Scratch(0, {16})})});
  EXPECT_TRUE(reads.Races().empty());
  Program disjoint;
  disjoint.Stream(TERN_ENGINE_DMA, {Op(TERN_OP_FILL, {Scratch(0, {16})})})
      .Stream(TERN_ENGINE_SCALAR, {Op(TERN_OP_FILL, {Scratch(64, {16})})});
  EXPECT_TRUE(disjoint.Races().empty());
  // Same offsets of different segments (and of different outputs) are
  // different memory.
  Program segments;
  segments.Stream(TERN_ENGINE_DMA, {Op(TERN_OP_FILL, {Operand(TERN_SEGMENT_OUTPUT, 0, {16})})})
      .Stream(TERN_ENGINE_SCALAR,
              {Op(TERN_OP_FILL, {Operand(TERN_SEGMENT_OUTPUT, 0, {16}, {}, /*index=*/1)}),
               Op(TERN_OP_FILL, {Scratch(0, {16})})});
  EXPECT_TRUE(segments.Races().empty());
}

TEST(Hazards, StridedViewsAreComparedExactly) {
  // Even and odd columns of one [4, 8] f32 buffer: interleaved, disjoint.
  const auto even = Scratch(0, {4, 4}, {8, 2});
  const auto odd = Scratch(4, {4, 4}, {8, 2});
  Program interleaved;
  interleaved.Stream(TERN_ENGINE_DMA, {Op(TERN_OP_FILL, {even})})
      .Stream(TERN_ENGINE_VECTOR, {Op(TERN_OP_FILL, {odd})});
  EXPECT_TRUE(interleaved.Races().empty());
  // Columns 0..3 and 2..5 of each row share columns 2 and 3.
  Program partial;
  partial.Stream(TERN_ENGINE_DMA, {Op(TERN_OP_FILL, {Scratch(0, {4, 4}, {8, 1})})})
      .Stream(TERN_ENGINE_VECTOR, {Op(TERN_OP_FILL, {Scratch(8, {4, 4}, {8, 1})})});
  const std::vector<Race> races = partial.Races();
  ASSERT_EQ(1u, races.size());
  EXPECT_TRUE(races[0].exact);
}

TEST(Hazards, OrderCarriesThroughAThirdEngine) {
  Program program;
  program.Stream(TERN_ENGINE_TENSOR, {kMatmulIntoScratch, Signal(0)})
      .Stream(TERN_ENGINE_VECTOR, {Wait(0, 1), Signal(1)})
      .Stream(TERN_ENGINE_SCALAR, {Wait(1, 1), kReluInPlace});
  EXPECT_TRUE(program.Races().empty());
}

TEST(Hazards, AWaitThatEitherOfTwoSignalsSatisfiesOrdersNeither) {
  // Both engines signal semaphore 0 once; a wait for 1 passes after either.
  Program either;
  either.Stream(TERN_ENGINE_TENSOR, {kMatmulIntoScratch, Signal(0)})
      .Stream(TERN_ENGINE_DMA, {Signal(0)})
      .Stream(TERN_ENGINE_SCALAR, {Wait(0, 1), kReluInPlace});
  EXPECT_EQ(1u, either.Races().size());
  // A wait for 2 needs both.
  Program both;
  both.Stream(TERN_ENGINE_TENSOR, {kMatmulIntoScratch, Signal(0)})
      .Stream(TERN_ENGINE_DMA, {Signal(0)})
      .Stream(TERN_ENGINE_SCALAR, {Wait(0, 2), kReluInPlace});
  EXPECT_TRUE(both.Races().empty());
}

TEST(Hazards, OneSemaphoreHandedFromEngineToEngineOrdersTheChain) {
  // The plugin's scheme: one semaphore; at each change of engine the engine
  // that ran signals it and the next waits for the running count. Here
  // vector -> scalar -> dma -> vector -> scalar, each step reading and writing
  // the same scratch. The vector engine's second signal could satisfy the
  // dma engine's wait by count, but it only comes after that wait: the order
  // is a chain, and no race may be reported.
  const tern_engine_t chain[] = {TERN_ENGINE_VECTOR, TERN_ENGINE_SCALAR, TERN_ENGINE_DMA,
                                 TERN_ENGINE_VECTOR, TERN_ENGINE_SCALAR};
  const auto touch = [](tern_engine_t engine) {
    return engine == TERN_ENGINE_DMA ? Op(TERN_OP_COPY, {Scratch(0, {16}), Scratch(0, {16})})
                                     : Op(TERN_OP_UNARY, {Scratch(0, {16}), Scratch(0, {16})});
  };
  std::map<tern_engine_t, std::vector<driver::Instruction>> streams;
  int64_t count = 0;
  for (size_t i = 0; i < std::size(chain); ++i) {
    if (i > 0) {
      streams[chain[i - 1]].push_back(Signal(0));
      streams[chain[i]].push_back(Wait(0, ++count));
    }
    streams[chain[i]].push_back(touch(chain[i]));
  }
  Program program;
  for (auto& [engine, list] : streams) program.Stream(engine, list);
  std::string text;
  EXPECT_TRUE(program.Races(&text).empty()) << text;
  // Without the last hand-over, the scalar engine's second step races with
  // the vector engine's second.
  std::map<tern_engine_t, std::vector<driver::Instruction>> cut = streams;
  cut[TERN_ENGINE_VECTOR].erase(cut[TERN_ENGINE_VECTOR].end() - 1);  // its last signal
  cut[TERN_ENGINE_SCALAR][cut[TERN_ENGINE_SCALAR].size() - 2] = Wait(0, 3);
  Program broken;
  for (auto& [engine, list] : cut) broken.Stream(engine, list);
  EXPECT_EQ(1u, broken.Races(&text).size()) << text;
}

TEST(Hazards, SemaphoresBelongToTheirCore) {
  // Semaphore 0 of core 1 does not order core 0's engines.
  Program program;
  program.Stream(TERN_ENGINE_TENSOR, {kMatmulIntoScratch, Signal(0)}, /*core=*/0)
      .Stream(TERN_ENGINE_DMA, {Signal(0)}, /*core=*/1)
      .Stream(TERN_ENGINE_SCALAR, {Wait(0, 1), kReluInPlace}, /*core=*/1);
  EXPECT_EQ(1u, program.Races().size());
}

TEST(Hazards, ManyInstructionsCheckQuickly) {
  // 10,000 steps: two engines hand one buffer back and forth, each turn
  // ordered by a semaphore handshake. No race; and the check stays far below
  // a second (the clocks are linear, the overlap sweep sees each ordered pair
  // once). Timing is printed, not asserted: speed targets live in benchmarks.
  std::vector<driver::Instruction> tensor, scalar;
  constexpr int kTurns = 1250;
  for (int i = 0; i < kTurns; ++i) {
    tensor.push_back(Wait(1, i));
    tensor.push_back(kMatmulIntoScratch);
    tensor.push_back(Signal(0));
    scalar.push_back(Wait(0, i + 1));
    scalar.push_back(kReluInPlace);
    scalar.push_back(Signal(1));
  }
  Program program;
  program.Stream(TERN_ENGINE_TENSOR, tensor).Stream(TERN_ENGINE_SCALAR, scalar);
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(program.Races().empty());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("10,000 steps scheduled and checked in %.3f s\n", seconds);
  // Drop one handshake in the middle: exactly the two neighbours race.
  scalar[3 * 600] = Wait(0, 0);  // the scalar engine's turn 600 waits for nothing new
  Program broken;
  broken.Stream(TERN_ENGINE_TENSOR, tensor).Stream(TERN_ENGINE_SCALAR, scalar);
  EXPECT_EQ(1u, broken.Races().size());
}

}  // namespace
}  // namespace tern::exe
