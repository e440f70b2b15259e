// Executions under the engines' schedules (TERN_SIM_SCHEDULE, docs/sim.md),
// through the public API: race-free programs give the same bits under every
// schedule; a racy program loaded anyway, and an ordering bug the static
// check cannot see (an output bound to an input's memory), give results that
// depend on the seed, which is what the random schedule is for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "exe_test_util.h"

namespace {

using exetest::Bytes;
using exetest::LastError;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

constexpr int kSeeds = 16;

// One tern_init under a TERN_SIM_SCHEDULE value, with a queue on core 0 of
// device 0; shut down (and the variable restored) on destruction.
class Session {
 public:
  explicit Session(const std::string& schedule) {
    setenv("TERN_SIM_SCHEDULE", schedule.c_str(), 1);
    status_ = tern_init(nullptr);
    unsetenv("TERN_SIM_SCHEDULE");
    if (status_ != TERN_OK) return;
    EXPECT_EQ(tern_device_get(0, &device_), TERN_OK);
    EXPECT_EQ(tern_core_open(device_, 0, &core_), TERN_OK) << LastError();
    EXPECT_EQ(tern_queue_create(core_, nullptr, &queue_), TERN_OK) << LastError();
  }
  ~Session() {
    if (status_ != TERN_OK) return;
    for (tern_buffer_t buffer : buffers_) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    for (tern_executable_t executable : executables_) {
      EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
    }
    EXPECT_EQ(tern_queue_destroy(queue_), TERN_OK);
    EXPECT_EQ(tern_core_close(core_), TERN_OK);
    EXPECT_EQ(tern_shutdown(), TERN_OK);
  }
  tern_status_t status() const { return status_; }

  tern_executable_t Load(const Bytes& data, uint32_t flags = 0) {
    tern_executable_load_params_t params{};
    params.struct_size = sizeof(params);
    params.flags = flags;
    tern_executable_t executable = nullptr;
    EXPECT_EQ(tern_executable_load(device_, data.data(), data.size(), &params, &executable),
              TERN_OK)
        << LastError();
    executables_.push_back(executable);
    return executable;
  }

  tern_buffer_t Floats(const std::vector<float>& values) {
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = values.size() * sizeof(float);
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    EXPECT_EQ(tern_buffer_alloc(device_, &params, &buffer), TERN_OK) << LastError();
    EXPECT_EQ(tern_buffer_write(buffer, 0, values.data(), params.size), TERN_OK);
    buffers_.push_back(buffer);
    return buffer;
  }

  std::vector<float> Read(tern_buffer_t buffer, size_t count) {
    std::vector<float> values(count);
    EXPECT_EQ(tern_buffer_read(buffer, 0, values.data(), count * sizeof(float)), TERN_OK);
    return values;
  }

  void Execute(tern_executable_t executable, std::vector<tern_buffer_t> inputs,
               std::vector<tern_buffer_t> outputs) {
    std::vector<tern_binding_t> in, out;
    for (tern_buffer_t buffer : inputs) in.push_back({buffer, 0});
    for (tern_buffer_t buffer : outputs) out.push_back({buffer, 0});
    ASSERT_EQ(tern_queue_execute(queue_, executable, 0, in.data(), static_cast<uint32_t>(in.size()),
                                 out.data(), static_cast<uint32_t>(out.size()), nullptr),
              TERN_OK)
        << LastError();
    ASSERT_EQ(tern_queue_synchronize(queue_, 30ull * 1000000000ull), TERN_OK) << LastError();
  }

 private:
  tern_status_t status_ = TERN_OK;
  tern_device_t device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  std::vector<tern_buffer_t> buffers_;
  std::vector<tern_executable_t> executables_;
};

std::vector<std::string> Schedules() {
  std::vector<std::string> schedules = {"concurrent"};
  for (int seed = 1; seed <= kSeeds; ++seed) schedules.push_back("random:" + std::to_string(seed));
  return schedules;
}

std::vector<float> Input() {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i) - 5.5f;
  return x;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

TEST(Schedules, RaceFreeProgramsGiveTheSameBitsUnderEverySchedule) {
  std::vector<std::pair<std::string, Bytes>> programs = {{"pipeline", exetest::BuildPipeline()}};
  for (const auto& program : exetest::HazardCorpus()) {
    if (program.race == nullptr) programs.emplace_back(program.name, program.bytes);
  }
  ASSERT_GE(programs.size(), 3u);
  std::vector<std::vector<uint32_t>> reference(programs.size());
  for (const std::string& schedule : Schedules()) {
    Session session(schedule);
    ASSERT_EQ(session.status(), TERN_OK) << LastError();
    for (size_t p = 0; p < programs.size(); ++p) {
      tern_executable_t executable = session.Load(programs[p].second);
      tern_buffer_t x = session.Floats(Input());
      tern_buffer_t y = session.Floats(std::vector<float>(16, 0.0f));
      session.Execute(executable, {x}, {y});
      const std::vector<uint32_t> bits = Bits(session.Read(y, 16));
      if (reference[p].empty()) {
        reference[p] = bits;
      } else {
        EXPECT_EQ(bits, reference[p]) << programs[p].first << " under " << schedule;
      }
    }
  }
  // And the right bits: the pipeline doubles its input.
  std::vector<float> doubled = Input();
  for (float& v : doubled) v *= 2.0f;
  EXPECT_EQ(reference[0], Bits(doubled));
}

TEST(Schedules, RandomScheduleExposesARaceLoadedAnyway) {
  // The DMA engine stages x in scratch while the vector engine doubles the
  // scratch, unordered: whether y sees x depends on the interleaving.
  Bytes racy;
  for (const auto& program : exetest::HazardCorpus()) {
    if (std::string(program.name) == "race_read_after_write") racy = program.bytes;
  }
  ASSERT_FALSE(racy.empty());
  std::set<std::vector<uint32_t>> results;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    Session session("random:" + std::to_string(seed));
    ASSERT_EQ(session.status(), TERN_OK) << LastError();
    tern_executable_t executable = session.Load(racy, TERN_EXECUTABLE_LOAD_ALLOW_RACES);
    tern_buffer_t x = session.Floats(Input());
    tern_buffer_t y = session.Floats(std::vector<float>(16, 0.0f));
    session.Execute(executable, {x}, {y});
    results.insert(Bits(session.Read(y, 16)));
  }
  EXPECT_GE(results.size(), 2u) << "no seed of " << kSeeds << " reordered the racing pair";
}

// f(a, b) -> (p, q): the vector engine computes p = a + a, the DMA engine
// copies b to q. Nothing in the program relates the two, and the static
// check rightly finds no race: the segments are different memory, unless the
// caller binds q to a's buffer.
Bytes BuildDoubleAndCopy() {
  static const int64_t shape[1] = {16};
  tern_builder_t builder = nullptr;
  EXPECT_EQ(tern_builder_create(nullptr, &builder), TERN_OK);
  EXPECT_EQ(tern_builder_begin_function(builder, "double_and_copy", nullptr), TERN_OK);
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(tern_builder_add_input(builder, name, TERN_DTYPE_F32, 1, shape, nullptr), TERN_OK);
  }
  for (const char* name : {"p", "q"}) {
    EXPECT_EQ(tern_builder_add_output(builder, name, TERN_DTYPE_F32, 1, shape, nullptr), TERN_OK);
  }
  auto add = [&](tern_opcode_t opcode, std::vector<tern_operand_t> operands,
                 std::vector<int64_t> ints) {
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = opcode;
    instruction.operand_count = static_cast<uint32_t>(operands.size());
    instruction.operands = operands.data();
    instruction.int_count = static_cast<uint32_t>(ints.size());
    instruction.ints = ints.data();
    EXPECT_EQ(tern_builder_add_instruction(builder, &instruction), TERN_OK) << LastError();
  };
  using exetest::Tensor;
  add(TERN_OP_COPY,
      {Tensor(TERN_SEGMENT_OUTPUT, 1, TERN_DTYPE_F32, 1, shape),
       Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 1, shape)},
      {});
  add(TERN_OP_BINARY,
      {Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 1, shape),
       Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 1, shape),
       Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 1, shape)},
      {TERN_BINARY_ADD});
  EXPECT_EQ(tern_builder_end_function(builder), TERN_OK) << LastError();
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(tern_builder_finish(builder, &data, &size), TERN_OK);
  Bytes bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  EXPECT_EQ(tern_builder_destroy(builder), TERN_OK);
  return bytes;
}

TEST(Schedules, RandomScheduleFindsAnOrderingBugTheStaticCheckCannotSee) {
  const Bytes program = BuildDoubleAndCopy();
  std::set<std::vector<uint32_t>> results;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    Session session("random:" + std::to_string(seed));
    ASSERT_EQ(session.status(), TERN_OK) << LastError();
    tern_executable_t executable = session.Load(program);  // no race flag needed
    tern_buffer_t a = session.Floats(Input());
    tern_buffer_t b = session.Floats(std::vector<float>(16, 100.0f));
    tern_buffer_t p = session.Floats(std::vector<float>(16, 0.0f));
    session.Execute(executable, {a, b}, {p, a});  // the planted bug: q is a
    results.insert(Bits(session.Read(p, 16)));
  }
  EXPECT_GE(results.size(), 2u) << "no seed of " << kSeeds << " reordered the aliased pair";
}

TEST(Schedules, UnknownScheduleFailsInitWithTheChoices) {
  Session session("fastest");
  EXPECT_EQ(session.status(), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "TERN_SIM_SCHEDULE='fastest'");
  EXPECT_CONTAINS(LastError(), "random:SEED");
}

// tern_init with `variable` set to `value`: its status; the variable is
// unset again and a successful init shut down.
tern_status_t InitWith(const char* variable, const char* value) {
  setenv(variable, value, 1);
  const tern_status_t status = tern_init(nullptr);
  unsetenv(variable);
  if (status == TERN_OK) tern_shutdown();
  return status;
}

TEST(Schedules, UnknownCopyModeFailsInitWithTheChoices) {
  // (The DMA engine's copy strategy is set beside the schedule.)
  EXPECT_EQ(InitWith("TERN_SIM_COPY", "fastest"), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "TERN_SIM_COPY='fastest'");
  EXPECT_CONTAINS(LastError(), "string-move");
}

TEST(Schedules, UnknownStreamingStoresModeFailsInitWithTheChoices) {
  EXPECT_EQ(InitWith("TERN_SIM_STREAMING_STORES", "0"), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "TERN_SIM_STREAMING_STORES='0'");
  EXPECT_CONTAINS(LastError(), "auto");
  EXPECT_CONTAINS(LastError(), "off");
}

}  // namespace
