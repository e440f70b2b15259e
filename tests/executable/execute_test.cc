// tern_queue_execute: binding checks, scratch memory for each execution,
// results computed by the simulated engines, and unload while executions are
// in flight.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "exe_test_util.h"
#include "tern/debug.h"
#include "tern/profile.h"
#include "tests/common/thread_switches.h"

namespace {

using exetest::Bytes;
using exetest::LastError;
using tern::testing::WhenAsleep;
using tern::testing::WhenRunning;
using tern::testing::WhenSwitched;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

constexpr uint64_t kTimeout = 30ull * 1000000000ull;

class ExecuteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    ASSERT_EQ(tern_device_get(0, &device_), TERN_OK);
    ASSERT_EQ(tern_device_get(1, &other_device_), TERN_OK);
    ASSERT_EQ(tern_core_open(device_, 0, &core_), TERN_OK) << LastError();
    ASSERT_EQ(tern_queue_create(core_, nullptr, &queue_), TERN_OK) << LastError();
  }
  void TearDown() override {
    for (tern_buffer_t buffer : buffers_) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    for (const auto& path : temp_files_) std::remove(path.c_str());
    EXPECT_EQ(tern_queue_destroy(queue_), TERN_OK) << LastError();
    EXPECT_EQ(tern_core_close(core_), TERN_OK);
    EXPECT_EQ(tern_shutdown(), TERN_OK);
  }

  tern_buffer_t Buffer(uint64_t size, tern_device_t device = nullptr) {
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    EXPECT_EQ(tern_buffer_alloc(device ? device : device_, &params, &buffer), TERN_OK)
        << LastError();
    buffers_.push_back(buffer);
    return buffer;
  }

  tern_buffer_t Floats(const std::vector<float>& values) {
    tern_buffer_t buffer = Buffer(values.size() * sizeof(float));
    EXPECT_EQ(tern_buffer_write(buffer, 0, values.data(), values.size() * sizeof(float)), TERN_OK);
    return buffer;
  }

  std::vector<float> Read(tern_buffer_t buffer, size_t count) {
    std::vector<float> values(count);
    EXPECT_EQ(tern_buffer_read(buffer, 0, values.data(), count * sizeof(float)), TERN_OK)
        << LastError();
    return values;
  }

  tern_executable_t Load(const Bytes& data) {
    tern_executable_t executable = nullptr;
    EXPECT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, &executable),
              TERN_OK)
        << LastError();
    return executable;
  }

  tern_executable_t LoadFile(const std::string& name, const Bytes& data) {
    temp_files_.push_back(exetest::WriteTemp(name, data));
    tern_executable_t executable = nullptr;
    EXPECT_EQ(tern_executable_load_file(device_, temp_files_.back().c_str(), nullptr, &executable),
              TERN_OK)
        << LastError();
    return executable;
  }

  uint64_t ScratchUsed() {
    tern_memory_stats_t stats{};
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(tern_device_memory_stats(device_, &stats), TERN_OK);
    return stats.used_by_category[TERN_MEMORY_SCRATCH];
  }

  tern_device_t device_ = nullptr;
  tern_device_t other_device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  std::vector<tern_buffer_t> buffers_;
  std::vector<std::string> temp_files_;
};

std::vector<float> Iota(size_t count, float start) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = start + static_cast<float>(i);
  return values;
}

TEST_F(ExecuteTest, AddsTwoInputs) {
  tern_executable_t executable = Load(exetest::BuildAdd());
  tern_buffer_t x = Floats(Iota(32, 0.0f));
  tern_buffer_t y = Floats(Iota(32, 100.0f));
  tern_buffer_t z = Buffer(128);
  const tern_binding_t inputs[2] = {{x, 0}, {y, 0}};
  const tern_binding_t outputs[1] = {{z, 0}};
  uint64_t sequence = 0;
  ASSERT_EQ(tern_queue_execute(queue_, executable, 0, inputs, 2, outputs, 1, &sequence), TERN_OK)
      << LastError();
  EXPECT_GT(sequence, 0u);
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  const std::vector<float> result = Read(z, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(result[i], 100.0f + 2.0f * i) << i;
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

// A load readies the queue that ran the device's last execution, and only
// that one (each sleeping engine woken costs the loader a futex wake-up): its
// engine naps after the load (a context switch per nap), the other queue's
// stays asleep. Seen from the engines' threads in /proc, both named
// tern-queue0.0 (device 0, core 0), told apart by thread id.
TEST_F(ExecuteTest, ALoadReadiesTheQueueThatRanTheLastExecution) {
  const std::string name = "tern-queue0.0";
  const std::map<int, long> first_only = WhenRunning(name, 1);
  ASSERT_EQ(first_only.size(), 1u);
  tern_queue_t second = nullptr;
  ASSERT_EQ(tern_queue_create(core_, nullptr, &second), TERN_OK) << LastError();
  const std::map<int, long> both = WhenRunning(name, 2);
  ASSERT_EQ(both.size(), 2u);
  const int first_thread = first_only.begin()->first;
  int second_thread = 0;
  for (const auto& [thread, count] : both) {
    if (thread != first_thread) second_thread = thread;
  }
  const Bytes add = exetest::BuildAdd();
  tern_executable_t executable = Load(add);
  tern_buffer_t x = Floats(Iota(32, 0.0f));
  tern_buffer_t z = Buffer(128);
  const tern_binding_t inputs[2] = {{x, 0}, {x, 0}};
  const tern_binding_t outputs[1] = {{z, 0}};
  for (tern_queue_t ran : {second, queue_}) {
    ASSERT_EQ(tern_queue_execute(ran, executable, 0, inputs, 2, outputs, 1, nullptr), TERN_OK)
        << LastError();
    ASSERT_EQ(tern_queue_synchronize(ran, kTimeout), TERN_OK) << LastError();
    const int readied = ran == second ? second_thread : first_thread;
    const int left = ran == second ? first_thread : second_thread;
    const std::map<int, long> asleep = WhenAsleep(name);
    ASSERT_EQ(asleep, WhenAsleep(name)) << "the engines did not go to sleep";
    tern_executable_t loaded = Load(add);
    // About 20 naps of 50 us for the readied engine; none for the other.
    const std::map<int, long> after = WhenSwitched(name, readied, asleep, 5);
    EXPECT_GE(after.at(readied) - asleep.at(readied), 5)
        << "the queue that ran the last execution was not readied";
    EXPECT_EQ(after.at(left), asleep.at(left)) << "another queue was woken too";
    EXPECT_EQ(tern_executable_unload(loaded), TERN_OK);
  }
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
  EXPECT_EQ(tern_queue_destroy(second), TERN_OK) << LastError();
}

std::string ReadWholeFile(const std::string& path) {
  std::string text;
  if (FILE* file = std::fopen(path.c_str(), "rb")) {
    char chunk[4096];
    for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), file)) > 0;) text.append(chunk, n);
    std::fclose(file);
  }
  return text;
}

// A small function is run once when it is loaded (driver_shim/sim/
// sim_execute.cc, PrepareProgram), so that its first execution finds its
// kernels warm: on memory of its own, not the user's, and not as a command
// of any queue (the queue's numbering and an armed fault are untouched). A
// capture shows it on the device's "loader" track; a function whose
// products exceed the rehearsal's bound is not rehearsed.
TEST_F(ExecuteTest, ASmallFunctionIsRehearsedAtLoadOnMemoryOfItsOwn) {
  tern_buffer_t x = Floats(Iota(32, 0.0f));
  tern_buffer_t z = Floats(std::vector<float>(32, 7.0f));
  tern_fault_params_t fault{};
  fault.struct_size = sizeof(fault);
  fault.kind = TERN_FAULT_HBM_UNCORRECTABLE;
  fault.core = core_;
  fault.after_commands = 0;  // the core's next command
  ASSERT_EQ(tern_debug_inject_fault(&fault), TERN_OK) << LastError();

  const std::string trace = exetest::WriteTemp("rehearsal.json", {});
  temp_files_.push_back(trace);
  ASSERT_EQ(tern_profile_start(trace.c_str()), TERN_OK) << LastError();
  tern_executable_t add = Load(exetest::BuildAdd());
  tern_executable_t big = Load(exetest::BuildMatmul(64, 512, 256));  // 8M multiply-adds
  ASSERT_EQ(tern_profile_stop(), TERN_OK) << LastError();
  const std::string captured = ReadWholeFile(trace);
  EXPECT_CONTAINS(captured, "\"rehearse add\"");
  EXPECT_CONTAINS(captured, "loader");
  EXPECT_EQ(captured.find("rehearse matmul"), std::string::npos) << "too large to rehearse";
  for (float v : Read(z, 32)) EXPECT_EQ(v, 7.0f) << "the rehearsal wrote the user's memory";

  // The fault armed for the core's next command meets the first execution.
  const tern_binding_t inputs[2] = {{x, 0}, {x, 0}};
  const tern_binding_t outputs[1] = {{z, 0}};
  uint64_t sequence = 0;
  ASSERT_EQ(tern_queue_execute(queue_, add, 0, inputs, 2, outputs, 1, &sequence), TERN_OK)
      << LastError();
  EXPECT_EQ(sequence, 1u) << "the rehearsal took a place in the queue";
  EXPECT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_ERROR_HBM_UNCORRECTABLE);
  // Returns the error it cleared.
  ASSERT_EQ(tern_queue_clear_error(queue_), TERN_ERROR_HBM_UNCORRECTABLE);
  ASSERT_EQ(tern_queue_execute(queue_, add, 0, inputs, 2, outputs, 1, nullptr), TERN_OK)
      << LastError();
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  const std::vector<float> result = Read(z, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(result[i], 2.0f * i) << i;
  EXPECT_EQ(tern_executable_unload(big), TERN_OK);
  EXPECT_EQ(tern_executable_unload(add), TERN_OK);
}

// Named I/O sets (tern/io_set.h): bound once by name, executed many times
// with the results of tern_queue_execute; every bind is checked when made.
TEST_F(ExecuteTest, IoSetBindsByNameOnceAndRunsManyTimes) {
  tern_executable_t executable = Load(exetest::BuildAdd());
  tern_buffer_t x = Floats(Iota(32, 0.0f));
  tern_buffer_t y = Floats(Iota(32, 100.0f));
  tern_buffer_t z = Buffer(128);
  tern_io_set_t set = nullptr;
  ASSERT_EQ(tern_io_set_create(executable, "add", &set), TERN_OK) << LastError();
  ASSERT_EQ(tern_io_set_bind(set, 0, "y", y, 0), TERN_OK) << LastError();
  ASSERT_EQ(tern_io_set_bind(set, 1, "z", z, 0), TERN_OK) << LastError();
  // Not everything is bound yet: the execution names what is missing.
  EXPECT_EQ(tern_queue_execute_io_set(queue_, set, nullptr), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_CONTAINS(LastError(), "input 'x'");
  ASSERT_EQ(tern_io_set_bind(set, 0, "x", x, 0), TERN_OK) << LastError();
  for (int run = 0; run < 3; ++run) {
    uint64_t sequence = 0;
    ASSERT_EQ(tern_queue_execute_io_set(queue_, set, &sequence), TERN_OK) << LastError();
    EXPECT_GT(sequence, 0u);
  }
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  std::vector<float> result = Read(z, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(result[i], 100.0f + 2.0f * i) << i;
  // A later bind replaces the earlier one for the next execution.
  ASSERT_EQ(tern_io_set_bind(set, 0, "y", x, 0), TERN_OK) << LastError();
  ASSERT_EQ(tern_queue_execute_io_set(queue_, set, nullptr), TERN_OK) << LastError();
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  result = Read(z, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(result[i], 2.0f * i) << i;
  EXPECT_EQ(tern_io_set_destroy(set), TERN_OK);
  EXPECT_EQ(tern_io_set_destroy(set), TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(ExecuteTest, IoSetRefusesBadBindsWhenTheyAreMade) {
  tern_executable_t executable = Load(exetest::BuildAdd());
  tern_io_set_t set = nullptr;
  EXPECT_EQ(tern_io_set_create(executable, "mul", &set), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "'add'");
  EXPECT_EQ(set, nullptr);
  ASSERT_EQ(tern_io_set_create(executable, nullptr, &set), TERN_OK) << LastError();
  tern_buffer_t small = Buffer(64);
  tern_buffer_t big = Buffer(128);
  EXPECT_EQ(tern_io_set_bind(set, 0, "w", big, 0), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "'x', 'y'");
  EXPECT_EQ(tern_io_set_bind(set, 1, "x", big, 0), TERN_ERROR_INVALID_ARGUMENT) << "x is an input";
  EXPECT_EQ(tern_io_set_bind(set, 2, "x", big, 0), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_io_set_bind(set, 0, nullptr, big, 0), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_io_set_bind(set, 0, "x", small, 0), TERN_ERROR_OUT_OF_RANGE);
  EXPECT_CONTAINS(LastError(), "needs 128 bytes");
  EXPECT_EQ(tern_io_set_bind(set, 0, "x", big, 8), TERN_ERROR_OUT_OF_RANGE);
  tern_buffer_t elsewhere = Buffer(128, other_device_);
  EXPECT_EQ(tern_io_set_bind(set, 0, "x", elsewhere, 0), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "device 1");
  EXPECT_EQ(tern_io_set_bind(set, 0, "x", nullptr, 0), TERN_ERROR_INVALID_HANDLE);
  // Binds that failed changed nothing: x is still unbound.
  ASSERT_EQ(tern_io_set_bind(set, 0, "y", big, 0), TERN_OK) << LastError();
  ASSERT_EQ(tern_io_set_bind(set, 1, "z", big, 0), TERN_OK) << LastError();
  EXPECT_EQ(tern_queue_execute_io_set(queue_, set, nullptr), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_CONTAINS(LastError(), "input 'x'");
  // A buffer freed after its bind fails the execution, naming it.
  tern_buffer_t doomed = Buffer(128);
  ASSERT_EQ(tern_io_set_bind(set, 0, "x", doomed, 0), TERN_OK) << LastError();
  ASSERT_EQ(tern_buffer_free(doomed), TERN_OK);
  buffers_.erase(std::find(buffers_.begin(), buffers_.end(), doomed));
  EXPECT_EQ(tern_queue_execute_io_set(queue_, set, nullptr), TERN_ERROR_INVALID_HANDLE);
  EXPECT_CONTAINS(LastError(), "'x'");
  // The set does not keep its executable loaded.
  ASSERT_EQ(tern_io_set_bind(set, 0, "x", big, 0), TERN_OK) << LastError();
  ASSERT_EQ(tern_executable_unload(executable), TERN_OK);
  EXPECT_EQ(tern_queue_execute_io_set(queue_, set, nullptr), TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_io_set_destroy(set), TERN_OK);
  EXPECT_EQ(tern_queue_execute_io_set(queue_, set, nullptr), TERN_ERROR_INVALID_HANDLE);
}

TEST_F(ExecuteTest, ReadsConstantsMappedFromAFile) {
  tern_executable_t executable = LoadFile("constants.bin", exetest::BuildAdd(true));
  tern_buffer_t x = Floats(Iota(32, 1.0f));
  tern_buffer_t z = Buffer(256);
  const tern_binding_t inputs[1] = {{x, 0}};
  const tern_binding_t outputs[1] = {{z, 128}};  // at an offset
  ASSERT_EQ(tern_queue_execute(queue_, executable, 0, inputs, 1, outputs, 1, nullptr), TERN_OK)
      << LastError();
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  std::vector<float> result(32);
  ASSERT_EQ(tern_buffer_read(z, 128, result.data(), 128), TERN_OK);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(result[i], 1.0f + 2.0f * i) << i;
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(ExecuteTest, QueuedExecutionsShareTheQueuesScratchBlock) {
  tern_executable_t executable = Load(exetest::BuildPipeline());
  tern_buffer_t x = Floats(Iota(16, -4.0f));
  std::vector<tern_buffer_t> ys;
  for (int k = 0; k < 8; ++k) ys.push_back(Buffer(64));
  const tern_binding_t inputs[1] = {{x, 0}};
  tern_queue_t queue = nullptr;
  ASSERT_EQ(tern_queue_create(core_, nullptr, &queue), TERN_OK) << LastError();
  const uint64_t before = ScratchUsed();
  // Hold the queue in a host callback so that the eight executions are all
  // queued at once, as a framework queues them ahead.
  static std::atomic<bool> release{false};
  release = false;
  ASSERT_EQ(tern_queue_host_callback(
                queue,
                [](void*, tern_status_t) {
                  while (!release.load()) usleep(1000);
                },
                nullptr, nullptr),
            TERN_OK);
  for (tern_buffer_t y : ys) {
    const tern_binding_t outputs[1] = {{y, 0}};
    ASSERT_EQ(tern_queue_execute(queue, executable, 0, inputs, 1, outputs, 1, nullptr), TERN_OK)
        << LastError();
  }
  // One block for all of them (it used to be one per queued execution).
  EXPECT_EQ(ScratchUsed(), before + 64);
  release = true;
  ASSERT_EQ(tern_queue_synchronize(queue, kTimeout), TERN_OK) << LastError();
  for (tern_buffer_t y : ys) {
    const std::vector<float> result = Read(y, 16);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(result[i], 2.0f * (i - 4.0f)) << i;
  }
  // The queue keeps it for its next executions, and gives it back when it goes.
  EXPECT_EQ(ScratchUsed(), before + 64);
  EXPECT_EQ(tern_queue_destroy(queue), TERN_OK);
  EXPECT_EQ(ScratchUsed(), before);
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(ExecuteTest, AFullDeviceTakesTheIdleScratchBack) {
  const uint64_t before = ScratchUsed();
  tern_executable_t executable = Load(exetest::BuildPipeline());
  // The load gave its scratch to the queue likely to run it, this one.
  ASSERT_EQ(ScratchUsed(), before + 64);
  tern_buffer_t x = Floats(Iota(16, -4.0f));
  tern_buffer_t y = Buffer(64);
  const tern_binding_t inputs[1] = {{x, 0}};
  const tern_binding_t outputs[1] = {{y, 0}};
  ASSERT_EQ(tern_queue_execute(queue_, executable, 0, inputs, 1, outputs, 1, nullptr), TERN_OK)
      << LastError();
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  ASSERT_EQ(ScratchUsed(), before + 64);
  // Fill every free block of the device: only the queue's idle scratch is left.
  std::vector<tern_buffer_t> fill;
  for (int k = 0; k < 64; ++k) {
    tern_memory_stats_t stats{};
    stats.struct_size = sizeof(stats);
    ASSERT_EQ(tern_device_memory_stats(device_, &stats), TERN_OK);
    if (stats.largest_free_block < 64) break;
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = stats.largest_free_block;
    tern_buffer_t block = nullptr;
    if (tern_buffer_alloc(device_, &params, &block) != TERN_OK) break;
    fill.push_back(block);
  }
  ASSERT_FALSE(fill.empty());
  // This allocation fits only where the scratch is: it takes it back.
  tern_buffer_params_t params{};
  params.struct_size = sizeof(params);
  params.size = 64;
  tern_buffer_t small = nullptr;
  ASSERT_EQ(tern_buffer_alloc(device_, &params, &small), TERN_OK) << LastError();
  EXPECT_EQ(ScratchUsed(), before);
  // The next execution needs a block again, and the device is full.
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, inputs, 1, outputs, 1, nullptr),
            TERN_ERROR_OUT_OF_MEMORY);
  const std::string message = LastError();
  EXPECT_NE(message.find("allocating the scratch of function 'pipeline'"), std::string::npos)
      << message;
  // Memory back: it runs.
  EXPECT_EQ(tern_buffer_free(small), TERN_OK);
  for (tern_buffer_t block : fill) EXPECT_EQ(tern_buffer_free(block), TERN_OK);
  ASSERT_EQ(tern_queue_execute(queue_, executable, 0, inputs, 1, outputs, 1, nullptr), TERN_OK)
      << LastError();
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  const std::vector<float> result = Read(y, 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(result[i], 2.0f * (i - 4.0f)) << i;
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(ExecuteTest, RacyProgramIsRefusedAtLoadUnlessRacesAreAllowed) {
  // The pipeline without its semaphore: the vector engine reads the scratch
  // that the DMA engine writes, and nothing orders the two. The sequential
  // schedule would compute the right answer; hardware would not, reliably.
  const Bytes racy = exetest::BuildPipeline(/*with_semaphore=*/false);
  tern_executable_t executable = nullptr;
  EXPECT_EQ(tern_executable_load(device_, racy.data(), racy.size(), nullptr, &executable),
            TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_EQ(executable, nullptr);
  const std::string message = LastError();
  EXPECT_NE(message.find("function 'pipeline' (0): its engine streams race"), std::string::npos)
      << message;
  EXPECT_NE(message.find("the vector engine of core 0, instruction 0 (binary, graph op "
                         "'model.double') reads scratch bytes [0, 64)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("the dma engine of core 0, instruction 0 (copy, graph op "
                         "'model.stage') writes them"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("write-after-read"), std::string::npos) << message;
  EXPECT_NE(message.find("TERN_EXECUTABLE_LOAD_ALLOW_RACES"), std::string::npos) << message;

  // For an experiment it loads with the flag (the races go to the log).
  tern_executable_load_params_t params{};
  params.struct_size = sizeof(params);
  params.flags = TERN_EXECUTABLE_LOAD_ALLOW_RACES;
  ASSERT_EQ(tern_executable_load(device_, racy.data(), racy.size(), &params, &executable), TERN_OK)
      << LastError();
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(ExecuteTest, UnloadWhileExecutionsAreInFlight) {
  tern_executable_t executable = LoadFile("inflight.bin", exetest::BuildAdd(true));
  tern_buffer_t x = Floats(Iota(32, 0.0f));
  std::vector<tern_buffer_t> outputs;
  for (int i = 0; i < 8; ++i) {
    outputs.push_back(Buffer(128));
    const tern_binding_t in[1] = {{x, 0}};
    const tern_binding_t out[1] = {{outputs.back(), 0}};
    ASSERT_EQ(tern_queue_execute(queue_, executable, 0, in, 1, out, 1, nullptr), TERN_OK);
  }
  ASSERT_EQ(tern_executable_unload(executable), TERN_OK);
  ASSERT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  for (tern_buffer_t out : outputs) {
    const std::vector<float> result = Read(out, 32);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(result[i], 2.0f * i);
  }
  tern_memory_stats_t stats{};
  stats.struct_size = sizeof(stats);
  ASSERT_EQ(tern_device_memory_stats(device_, &stats), TERN_OK);
  EXPECT_EQ(stats.used_by_category[TERN_MEMORY_CONSTANTS], 0u);
}

TEST_F(ExecuteTest, ChecksBindings) {
  tern_executable_t executable = Load(exetest::BuildAdd());
  tern_buffer_t x = Buffer(128);
  tern_buffer_t small = Buffer(64);
  tern_buffer_t remote = Buffer(128, other_device_);
  const tern_binding_t two[2] = {{x, 0}, {x, 0}};
  const tern_binding_t out[1] = {{x, 0}};
  uint64_t sequence = 1;
  // Counts.
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, two, 1, out, 1, &sequence),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sequence, 0u);
  EXPECT_CONTAINS(LastError(), "2 inputs and 1 outputs, but 1 and 1");
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, nullptr, 2, out, 1, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_queue_execute(queue_, executable, 3, two, 2, out, 1, nullptr),
            TERN_ERROR_OUT_OF_RANGE);
  // A buffer too small, at an offset, and of another device.
  const tern_binding_t too_small[2] = {{x, 0}, {small, 0}};
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, too_small, 2, out, 1, nullptr),
            TERN_ERROR_OUT_OF_RANGE);
  EXPECT_CONTAINS(LastError(), "inputs[1] ('y')");
  const tern_binding_t offset[1] = {{x, 8}};
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, two, 2, offset, 1, nullptr),
            TERN_ERROR_OUT_OF_RANGE);
  EXPECT_CONTAINS(LastError(), "outputs[0] ('z')");
  const tern_binding_t elsewhere[2] = {{x, 0}, {remote, 0}};
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, elsewhere, 2, out, 1, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "device 1");
  // Handles.
  const tern_binding_t null_buffer[2] = {{x, 0}, {nullptr, 0}};
  EXPECT_EQ(tern_queue_execute(queue_, executable, 0, null_buffer, 2, out, 1, nullptr),
            TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_queue_execute(nullptr, executable, 0, two, 2, out, 1, nullptr),
            TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_queue_execute(queue_, nullptr, 0, two, 2, out, 1, nullptr),
            TERN_ERROR_INVALID_HANDLE);
  // An executable of the other device.
  const Bytes data = exetest::BuildAdd();
  tern_executable_t remote_executable = nullptr;
  ASSERT_EQ(
      tern_executable_load(other_device_, data.data(), data.size(), nullptr, &remote_executable),
      TERN_OK);
  EXPECT_EQ(tern_queue_execute(queue_, remote_executable, 0, two, 2, out, 1, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "loaded on device 1");
  // Nothing was submitted by the failed calls.
  uint64_t completed = 0;
  ASSERT_EQ(tern_queue_query(queue_, &completed), TERN_OK);
  EXPECT_EQ(completed, 0u);
  EXPECT_EQ(tern_executable_unload(remote_executable), TERN_OK);
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(ExecuteTest, EmptyTensorsMayBeBoundToNothing) {
  tern_builder_t builder = nullptr;
  ASSERT_EQ(tern_builder_create(nullptr, &builder), TERN_OK);
  const int64_t empty[2] = {0, 8};
  ASSERT_EQ(tern_builder_begin_function(builder, "empty", nullptr), TERN_OK);
  ASSERT_EQ(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, empty, nullptr), TERN_OK);
  ASSERT_EQ(tern_builder_add_output(builder, "y", TERN_DTYPE_F32, 2, empty, nullptr), TERN_OK);
  tern_operand_t operands[2] = {exetest::Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, empty),
                                exetest::Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, empty)};
  tern_instruction_t instruction{};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_COPY;
  instruction.operand_count = 2;
  instruction.operands = operands;
  ASSERT_EQ(tern_builder_add_instruction(builder, &instruction), TERN_OK) << LastError();
  ASSERT_EQ(tern_builder_end_function(builder), TERN_OK);
  void* data = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(tern_builder_finish(builder, &data, &size), TERN_OK);
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load(device_, data, size, nullptr, &executable), TERN_OK)
      << LastError();
  tern_builder_free_data(data);
  tern_builder_destroy(builder);
  const tern_binding_t none[1] = {{nullptr, 0}};
  ASSERT_EQ(tern_queue_execute(queue_, executable, 0, none, 1, none, 1, nullptr), TERN_OK)
      << LastError();
  EXPECT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << LastError();
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

}  // namespace
