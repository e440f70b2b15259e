// The simulated engines running a function's streams (engine_streams.h):
// semaphores honoured under every schedule, the DMA engine really beside the
// compute engines, seeded random interleavings, and hangs, failures and
// timeouts reported with where each engine stands. The instructions here are
// recorded, not computed: the kernels have their own tests.
#include "driver_shim/sim/engine_streams.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/sanitizers.h"
#include "common/timeline.h"
#include "driver_shim/sim/engines/kernels_testing.h"
#include "driver_shim/sim/engines/run_instruction.h"

namespace tern::sim {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

constexpr uint64_t kMinute = 60ull * 1000000000ull;

// A compute instruction for `engine`, named by its debug op.
driver::Instruction Work(tern_engine_t engine, const std::string& name) {
  driver::Instruction instruction;
  switch (engine) {
    case TERN_ENGINE_DMA:
      instruction.opcode = TERN_OP_COPY;
      break;
    case TERN_ENGINE_TENSOR:
      instruction.opcode = TERN_OP_MATMUL;
      break;
    case TERN_ENGINE_VECTOR:
      instruction.opcode = TERN_OP_BINARY;
      break;
    default:
      instruction.opcode = TERN_OP_UNARY;
      break;
  }
  instruction.engine = engine;
  instruction.debug_op = name;
  return instruction;
}

driver::Instruction Signal(tern_engine_t engine, int64_t semaphore, int64_t increment = 1) {
  driver::Instruction instruction;
  instruction.opcode = TERN_OP_SEM_SIGNAL;
  instruction.engine = engine;
  instruction.ints = {semaphore, increment};
  return instruction;
}

driver::Instruction Wait(tern_engine_t engine, int64_t semaphore, int64_t value = 1) {
  driver::Instruction instruction;
  instruction.opcode = TERN_OP_SEM_WAIT;
  instruction.engine = engine;
  instruction.ints = {semaphore, value};
  return instruction;
}

// Adds a stream and numbers its instructions' positions.
void AddStream(driver::Function* function, tern_engine_t engine,
               std::vector<driver::Instruction> instructions) {
  driver::Stream& stream = function->streams.emplace_back();
  stream.engine = engine;
  stream.instructions = std::move(instructions);
  for (size_t i = 0; i < stream.instructions.size(); ++i) {
    stream.instructions[i].position = static_cast<uint32_t>(i);
    function->instruction_count++;
  }
}

// Records which instructions ran, in order, and on which thread.
struct Recorder {
  std::mutex mutex;
  std::vector<std::string> order;
  std::set<std::thread::id> threads_of_dma;

  RunOneInstruction Runner() {
    return [this](const driver::Instruction& instruction) {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(instruction.debug_op);
      if (instruction.engine == TERN_ENGINE_DMA) threads_of_dma.insert(std::this_thread::get_id());
      return OkStatus();
    };
  }
  size_t At(const std::string& name) const {
    return static_cast<size_t>(std::find(order.begin(), order.end(), name) - order.begin());
  }
};

ScheduleMode Random(uint64_t seed) { return ScheduleMode{ScheduleMode::kRandom, seed}; }

// Load, compute, store with the tile pipelined: the DMA engine loads tile 1
// while the tensor engine works on tile 0; the vector engine finishes each.
driver::Function Pipeline() {
  driver::Function function;
  function.name = "pipeline";
  AddStream(
      &function, TERN_ENGINE_DMA,
      {Work(TERN_ENGINE_DMA, "load0"), Signal(TERN_ENGINE_DMA, 0), Work(TERN_ENGINE_DMA, "load1"),
       Signal(TERN_ENGINE_DMA, 0), Wait(TERN_ENGINE_DMA, 2, 2), Work(TERN_ENGINE_DMA, "store")});
  AddStream(&function, TERN_ENGINE_TENSOR,
            {Wait(TERN_ENGINE_TENSOR, 0, 1), Work(TERN_ENGINE_TENSOR, "mm0"),
             Signal(TERN_ENGINE_TENSOR, 1), Wait(TERN_ENGINE_TENSOR, 0, 2),
             Work(TERN_ENGINE_TENSOR, "mm1"), Signal(TERN_ENGINE_TENSOR, 1)});
  AddStream(&function, TERN_ENGINE_VECTOR,
            {Wait(TERN_ENGINE_VECTOR, 1, 1), Work(TERN_ENGINE_VECTOR, "act0"),
             Signal(TERN_ENGINE_VECTOR, 2), Wait(TERN_ENGINE_VECTOR, 1, 2),
             Work(TERN_ENGINE_VECTOR, "act1"), Signal(TERN_ENGINE_VECTOR, 2)});
  return function;
}

TEST(EngineStreams, HonourEverySemaphoreUnderEverySchedule) {
  const driver::Function function = Pipeline();
  std::vector<ScheduleMode> modes = {ScheduleMode{}};
  for (uint64_t seed = 1; seed <= 64; ++seed) modes.push_back(Random(seed));
  for (const ScheduleMode& mode : modes) {
    Recorder recorder;
    tern_error_class_t error_class = TERN_ERROR_CLASS_COUNT;
    ASSERT_TRUE(
        RunEngineStreams(function, mode, MonotonicNs() + kMinute, recorder.Runner(), &error_class)
            .ok());
    ASSERT_EQ(recorder.order.size(), 7u);
    // Each edge of the pipeline.
    EXPECT_LT(recorder.At("load0"), recorder.At("mm0")) << mode.seed;
    EXPECT_LT(recorder.At("load1"), recorder.At("mm1")) << mode.seed;
    EXPECT_LT(recorder.At("mm0"), recorder.At("act0")) << mode.seed;
    EXPECT_LT(recorder.At("mm1"), recorder.At("act1")) << mode.seed;
    EXPECT_LT(recorder.At("act1"), recorder.At("store")) << mode.seed;
    EXPECT_LT(recorder.At("act0"), recorder.At("store")) << mode.seed;
  }
}

TEST(EngineStreams, RandomSchedulesInterleaveIndependentStreamsInManyOrders) {
  driver::Function function;
  function.name = "independent";
  AddStream(&function, TERN_ENGINE_DMA, {Work(TERN_ENGINE_DMA, "a0"), Work(TERN_ENGINE_DMA, "a1")});
  AddStream(&function, TERN_ENGINE_VECTOR,
            {Work(TERN_ENGINE_VECTOR, "b0"), Work(TERN_ENGINE_VECTOR, "b1")});
  std::set<std::vector<std::string>> orders;
  for (uint64_t seed = 1; seed <= 32; ++seed) {
    Recorder recorder;
    tern_error_class_t error_class;
    ASSERT_TRUE(RunEngineStreams(function, Random(seed), MonotonicNs() + kMinute, recorder.Runner(),
                                 &error_class)
                    .ok());
    EXPECT_LT(recorder.At("a0"), recorder.At("a1"));  // program order holds
    EXPECT_LT(recorder.At("b0"), recorder.At("b1"));
    // One thread: the interleaving is the generator's alone.
    EXPECT_EQ(recorder.threads_of_dma, std::set<std::thread::id>{std::this_thread::get_id()});
    orders.insert(recorder.order);
  }
  // Six interleavings exist; 32 seeds find most of them.
  EXPECT_GE(orders.size(), 4u);
}

// A copy and a matmul on independent streams. The DMA engine runs beside the
// compute engines exactly when their kernels leave a CPU free: with one
// kernel thread on a host of two CPUs or more, and never when the kernels
// use every CPU (the DMA thread would take a CPU from them).
TEST(EngineStreams, DmaEngineRunsBesideTheComputeEnginesWhenACpuIsFree) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one CPU: nothing can overlap";
  driver::Function function;
  function.name = "overlap";
  AddStream(&function, TERN_ENGINE_DMA, {Work(TERN_ENGINE_DMA, "copy")});
  AddStream(&function, TERN_ENGINE_TENSOR, {Work(TERN_ENGINE_TENSOR, "matmul")});
  for (const int threads : {1, static_cast<int>(std::thread::hardware_concurrency())}) {
    SetKernelThreadsForTesting(threads);
    const bool overlaps = KernelsLeaveACpuFree();
    if (threads == 1) {
      EXPECT_TRUE(overlaps);
    }
    // The copy waits until the matmul has started: it can only see that if
    // the two really run at once.
    std::atomic<bool> matmul_started{false};
    std::atomic<bool> copy_saw_matmul{false};
    std::atomic<bool> copy_on_other_thread{false};
    const std::thread::id caller = std::this_thread::get_id();
    const RunOneInstruction run = [&](const driver::Instruction& instruction) {
      if (instruction.engine == TERN_ENGINE_DMA) {
        copy_on_other_thread = std::this_thread::get_id() != caller;
        const auto until =
            std::chrono::steady_clock::now() +
            (copy_on_other_thread ? std::chrono::seconds(10) : std::chrono::seconds(0));
        while (!matmul_started && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        copy_saw_matmul = matmul_started.load();
      } else {
        matmul_started = true;
      }
      return OkStatus();
    };
    tern_error_class_t error_class;
    ASSERT_TRUE(
        RunEngineStreams(function, ScheduleMode{}, MonotonicNs() + kMinute, run, &error_class)
            .ok());
    EXPECT_EQ(copy_on_other_thread, overlaps) << threads << " threads";
    EXPECT_EQ(copy_saw_matmul, overlaps) << threads << " threads";
  }
  SetKernelThreadsForTesting(0);
}

// The loader's rehearsal schedule (ScheduleMode::kOneThread): where the
// concurrent schedule hands the copy to the DMA thread (a CPU left free), it
// runs on the calling thread, and the streams' semaphores still order it.
TEST(EngineStreams, OneThreadScheduleRunsEveryEngineOnTheCallingThread) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one CPU: no DMA thread anyway";
  driver::Function function;
  function.name = "one_thread";
  AddStream(&function, TERN_ENGINE_DMA, {Work(TERN_ENGINE_DMA, "copy")});
  AddStream(&function, TERN_ENGINE_TENSOR, {Work(TERN_ENGINE_TENSOR, "matmul")});
  SetKernelThreadsForTesting(1);  // a CPU left free: the concurrent schedule hands off
  ASSERT_TRUE(KernelsLeaveACpuFree());
  const std::thread::id caller = std::this_thread::get_id();
  for (const ScheduleMode::Kind kind : {ScheduleMode::kConcurrent, ScheduleMode::kOneThread}) {
    std::atomic<bool> copy_on_other_thread{false};
    const RunOneInstruction run = [&](const driver::Instruction& instruction) {
      if (instruction.engine == TERN_ENGINE_DMA) {
        copy_on_other_thread = std::this_thread::get_id() != caller;
      }
      return OkStatus();
    };
    tern_error_class_t error_class;
    ASSERT_TRUE(RunEngineStreams(function, ScheduleMode{kind, 0}, MonotonicNs() + kMinute, run,
                                 &error_class)
                    .ok());
    EXPECT_EQ(copy_on_other_thread.load(), kind == ScheduleMode::kConcurrent)
        << "schedule kind " << static_cast<int>(kind);
  }
  Recorder recorder;
  tern_error_class_t error_class;
  ASSERT_TRUE(RunEngineStreams(Pipeline(), ScheduleMode{ScheduleMode::kOneThread, 0},
                               MonotonicNs() + kMinute, recorder.Runner(), &error_class)
                  .ok());
  EXPECT_EQ(recorder.threads_of_dma, std::set<std::thread::id>{caller});
  EXPECT_LT(recorder.At("load0"), recorder.At("mm0"));
  EXPECT_LT(recorder.At("mm1"), recorder.At("act1"));
  EXPECT_LT(recorder.At("act1"), recorder.At("store"));
  SetKernelThreadsForTesting(0);
}

// A forked child of a process whose DMA thread has started has no such
// thread: its copies run on the executing thread instead of waiting for one
// that never comes.
TEST(EngineStreams, ForkedChildRunsCopiesItself) {
#if TERN_UNDER_TSAN
  GTEST_SKIP() << "ThreadSanitizer cannot run a multi-threaded fork's child";
#endif
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one CPU: nothing overlaps";
  driver::Function function;
  function.name = "overlap";
  AddStream(&function, TERN_ENGINE_DMA, {Work(TERN_ENGINE_DMA, "copy")});
  AddStream(&function, TERN_ENGINE_TENSOR, {Work(TERN_ENGINE_TENSOR, "matmul")});
  SetKernelThreadsForTesting(1);  // a CPU left free: copies go to the DMA thread
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> copy_elsewhere{false};
  const RunOneInstruction run = [&](const driver::Instruction& instruction) {
    if (instruction.engine == TERN_ENGINE_DMA) {
      copy_elsewhere = std::this_thread::get_id() != caller;
    }
    return OkStatus();
  };
  tern_error_class_t error_class;
  ASSERT_TRUE(
      RunEngineStreams(function, ScheduleMode{}, MonotonicNs() + kMinute, run, &error_class).ok());
  ASSERT_TRUE(copy_elsewhere) << "the parent's copy did not start the DMA thread";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    copy_elsewhere = true;
    const Status status = RunEngineStreams(function, ScheduleMode{},
                                           MonotonicNs() + 5ull * 1000000000ull, run, &error_class);
    _exit(status.ok() && !copy_elsewhere ? 0 : 1);
  }
  // (Before the fix the child waited forever for the DMA thread.)
  int wait_status = 0;
  pid_t waited = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((waited = waitpid(child, &wait_status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  SetKernelThreadsForTesting(0);
  if (waited == 0) {
    kill(child, SIGKILL);
    waitpid(child, &wait_status, 0);
    FAIL() << "the child's execution hung: it handed its copy to a DMA thread it does not have";
  }
  ASSERT_TRUE(WIFEXITED(wait_status));
  EXPECT_EQ(WEXITSTATUS(wait_status), 0)
      << "the child's execution failed or handed its copy to a thread it does not have";
}

TEST(EngineStreams, DmaEngineRunsOnTheCallingThreadWhenNothingCouldOverlap) {
  driver::Function function;
  function.name = "load_then_compute";
  AddStream(&function, TERN_ENGINE_DMA,
            {Work(TERN_ENGINE_DMA, "load"), Signal(TERN_ENGINE_DMA, 0)});
  AddStream(&function, TERN_ENGINE_VECTOR,
            {Wait(TERN_ENGINE_VECTOR, 0), Work(TERN_ENGINE_VECTOR, "add")});
  Recorder recorder;
  tern_error_class_t error_class;
  ASSERT_TRUE(RunEngineStreams(function, ScheduleMode{}, MonotonicNs() + kMinute, recorder.Runner(),
                               &error_class)
                  .ok());
  EXPECT_EQ(recorder.order, (std::vector<std::string>{"load", "add"}));
  EXPECT_EQ(recorder.threads_of_dma, std::set<std::thread::id>{std::this_thread::get_id()});
}

TEST(EngineStreams, HangIsReportedAtOnceWithEachWaitNamed) {
  // Each engine waits for the other's signal first: a cycle (the loader
  // refuses it; this program comes straight to the engines).
  driver::Function function;
  function.name = "cycle";
  AddStream(&function, TERN_ENGINE_VECTOR,
            {Work(TERN_ENGINE_VECTOR, "first"), Wait(TERN_ENGINE_VECTOR, 1),
             Signal(TERN_ENGINE_VECTOR, 2)});
  AddStream(&function, TERN_ENGINE_SCALAR,
            {Wait(TERN_ENGINE_SCALAR, 2), Signal(TERN_ENGINE_SCALAR, 1)});
  for (const ScheduleMode& mode : {ScheduleMode{}, Random(7)}) {
    Recorder recorder;
    tern_error_class_t error_class = TERN_ERROR_CLASS_COUNT;
    const uint64_t started = MonotonicNs();
    const Status status =
        RunEngineStreams(function, mode, started + kMinute, recorder.Runner(), &error_class);
    EXPECT_LT(MonotonicNs() - started, kMinute / 2);  // not at the deadline
    EXPECT_EQ(status.code(), TERN_ERROR_EXEC_TIMEOUT);
    EXPECT_EQ(error_class, TERN_ERROR_CLASS_EXEC_TIMEOUT);
    EXPECT_CONTAINS(status.message(), "function 'cycle' hangs after 1 of 5 instructions");
    EXPECT_CONTAINS(status.message(),
                    "the vector engine of core 0, position 1 (sem_wait) waits for semaphore 1 "
                    "to reach 1 and it is 0");
    EXPECT_CONTAINS(status.message(),
                    "the scalar engine of core 0, position 0 (sem_wait) waits for semaphore 2 "
                    "to reach 1 and it is 0");
    EXPECT_EQ(recorder.order, std::vector<std::string>{"first"});
  }
}

TEST(EngineStreams, FailureNamesTheInstructionAndWaitsForTheDmaEngine) {
  driver::Function function;
  function.name = "failing";
  AddStream(&function, TERN_ENGINE_DMA, {Work(TERN_ENGINE_DMA, "slow_copy")});
  AddStream(&function, TERN_ENGINE_VECTOR,
            {Work(TERN_ENGINE_VECTOR, "fine"), Work(TERN_ENGINE_VECTOR, "bad_index")});
  std::atomic<bool> copy_finished{false};
  const RunOneInstruction run = [&](const driver::Instruction& instruction) -> Status {
    if (instruction.engine == TERN_ENGINE_DMA) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      copy_finished = true;
      return OkStatus();
    }
    if (instruction.debug_op == "bad_index") {
      return MakeStatus(TERN_ERROR_EXECUTION_FAILED, "index 9 is out of range [0, 4)");
    }
    return OkStatus();
  };
  tern_error_class_t error_class = TERN_ERROR_CLASS_COUNT;
  const Status status =
      RunEngineStreams(function, ScheduleMode{}, MonotonicNs() + kMinute, run, &error_class);
  EXPECT_TRUE(copy_finished);  // nothing of the execution still runs
  EXPECT_EQ(status.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_EQ(error_class, TERN_ERROR_CLASS_EXECUTION_FAILED);
  EXPECT_EQ(status.message(),
            "function 'failing', the vector engine of core 0, position 1 (binary, graph op "
            "'bad_index'): index 9 is out of range [0, 4)");
}

TEST(EngineStreams, DmaFailureIsReportedLikeAnyOther) {
  driver::Function function;
  function.name = "dma_fails";
  AddStream(&function, TERN_ENGINE_DMA, {Work(TERN_ENGINE_DMA, "copy")});
  AddStream(&function, TERN_ENGINE_VECTOR, {Work(TERN_ENGINE_VECTOR, "add")});
  const RunOneInstruction run = [&](const driver::Instruction& instruction) -> Status {
    if (instruction.engine == TERN_ENGINE_DMA) return MakeStatus(TERN_ERROR_INTERNAL, "broken");
    return OkStatus();
  };
  tern_error_class_t error_class = TERN_ERROR_CLASS_COUNT;
  const Status status =
      RunEngineStreams(function, ScheduleMode{}, MonotonicNs() + kMinute, run, &error_class);
  EXPECT_EQ(status.code(), TERN_ERROR_INTERNAL);
  EXPECT_EQ(error_class, TERN_ERROR_CLASS_OTHER);
  EXPECT_CONTAINS(status.message(), "the dma engine of core 0, position 0 (copy, graph op 'copy')");
}

TEST(EngineStreams, TimeoutSaysWhereEachEngineStands) {
  driver::Function function = Pipeline();
  Recorder recorder;
  tern_error_class_t error_class = TERN_ERROR_CLASS_COUNT;
  const Status status =
      RunEngineStreams(function, ScheduleMode{}, MonotonicNs(), recorder.Runner(), &error_class);
  EXPECT_EQ(status.code(), TERN_ERROR_EXEC_TIMEOUT);
  EXPECT_EQ(error_class, TERN_ERROR_CLASS_EXEC_TIMEOUT);
  EXPECT_CONTAINS(status.message(), "function 'pipeline' ran longer than TERN_EXEC_TIMEOUT");
  EXPECT_CONTAINS(status.message(), "the tensor engine of core 0");
  EXPECT_CONTAINS(status.message(), "raise TERN_EXEC_TIMEOUT");
}

TEST(EngineStreams, SemaphoresBelongToTheirCore) {
  // Semaphore 0 of core 1 does not release a wait on semaphore 0 of core 0.
  driver::Function function;
  function.name = "two_cores";
  AddStream(&function, TERN_ENGINE_VECTOR, {Wait(TERN_ENGINE_VECTOR, 0)});
  AddStream(&function, TERN_ENGINE_VECTOR, {Signal(TERN_ENGINE_VECTOR, 0)});
  function.streams[1].core = 1;
  function.streams[1].instructions[0].core = 1;
  Recorder recorder;
  tern_error_class_t error_class;
  const Status status = RunEngineStreams(function, ScheduleMode{}, MonotonicNs() + kMinute,
                                         recorder.Runner(), &error_class);
  EXPECT_EQ(status.code(), TERN_ERROR_EXEC_TIMEOUT);
  EXPECT_CONTAINS(status.message(), "hangs");
}

TEST(ScheduleMode, ParsesConcurrentAndRandomSeeds) {
  ScheduleMode mode;
  ASSERT_TRUE(ParseScheduleMode("random:42", &mode).ok());
  EXPECT_EQ(mode.kind, ScheduleMode::kRandom);
  EXPECT_EQ(mode.seed, 42u);
  ASSERT_TRUE(ParseScheduleMode("random:18446744073709551615", &mode).ok());
  EXPECT_EQ(mode.seed, UINT64_MAX);
  ASSERT_TRUE(ParseScheduleMode("concurrent", &mode).ok());
  EXPECT_EQ(mode.kind, ScheduleMode::kConcurrent);
  for (const char* bad : {"random:", "random:x", "random:-1", "random:18446744073709551616",
                          "random", "serial", "random:1 "}) {
    const Status status = ParseScheduleMode(bad, &mode);
    EXPECT_EQ(status.code(), TERN_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_CONTAINS(status.message(), "random:SEED");
  }
}

}  // namespace
}  // namespace tern::sim
