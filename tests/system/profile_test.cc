// Captures and log routing from code (include/tern/profile.h): a capture
// holds what ran between start and stop and nothing else, is valid Chrome
// trace JSON with copies, fills, executions and their instructions; the
// misuse cases fail with their reasons; a log callback receives the runtime's
// warnings instead of stderr, and NULL puts stderr back.
#include <gtest/gtest.h>
#include <tern/tern.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using Json = nlohmann::json;

std::string LastError() { return tern_last_error_message(); }

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "profile_" + name + "_" + std::to_string(getpid()) + ".json";
}

// Span names of a trace file's complete ("X") events, in file order.
std::vector<std::string> SpanNames(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << "no trace at " << path;
  const Json trace = Json::parse(file, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(trace.is_discarded()) << path << " is not valid JSON";
  std::vector<std::string> names;
  if (trace.is_discarded()) return names;
  for (const Json& event : trace.at("traceEvents")) {
    if (event.value("ph", "") != "X") continue;
    EXPECT_TRUE(event.contains("ts") && event.contains("dur")) << event.dump();
    names.push_back(event.at("name").get<std::string>());
  }
  return names;
}

size_t Count(const std::vector<std::string>& names, const std::string& part) {
  size_t n = 0;
  for (const std::string& name : names) n += name.find(part) != std::string::npos;
  return n;
}

class ProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    ASSERT_EQ(tern_device_get(0, &device_), TERN_OK) << LastError();
    ASSERT_EQ(tern_core_open(device_, 0, &core_), TERN_OK) << LastError();
    ASSERT_EQ(tern_queue_create(core_, nullptr, &queue_), TERN_OK) << LastError();
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = 4096;
    params.category = TERN_MEMORY_TENSORS;
    ASSERT_EQ(tern_buffer_alloc(device_, &params, &buffer_), TERN_OK) << LastError();
  }
  void TearDown() override {
    tern_buffer_free(buffer_);
    tern_queue_destroy(queue_);
    tern_core_close(core_);
    tern_shutdown();
  }

  // A one-instruction executable: out = a + b on 16 floats, instruction
  // named "profiled.add".
  tern_executable_t AddExecutable() {
    const int64_t shape[1] = {16};
    tern_builder_t builder = nullptr;
    EXPECT_EQ(tern_builder_create(nullptr, &builder), TERN_OK);
    EXPECT_EQ(tern_builder_begin_function(builder, "add", nullptr), TERN_OK);
    EXPECT_EQ(tern_builder_add_input(builder, "a", TERN_DTYPE_F32, 1, shape, nullptr), TERN_OK);
    EXPECT_EQ(tern_builder_add_input(builder, "b", TERN_DTYPE_F32, 1, shape, nullptr), TERN_OK);
    EXPECT_EQ(tern_builder_add_output(builder, "c", TERN_DTYPE_F32, 1, shape, nullptr), TERN_OK);
    tern_operand_t operands[3] = {};
    const tern_segment_t segments[3] = {TERN_SEGMENT_OUTPUT, TERN_SEGMENT_INPUT,
                                        TERN_SEGMENT_INPUT};
    const uint32_t indices[3] = {0, 0, 1};
    for (int i = 0; i < 3; ++i) {
      operands[i].segment = segments[i];
      operands[i].index = indices[i];
      operands[i].dtype = TERN_DTYPE_F32;
      operands[i].rank = 1;
      operands[i].shape = shape;
    }
    const int64_t add[1] = {TERN_BINARY_ADD};
    tern_instruction_t ins{};
    ins.struct_size = sizeof(ins);
    ins.opcode = TERN_OP_BINARY;
    ins.operand_count = 3;
    ins.operands = operands;
    ins.int_count = 1;
    ins.ints = add;
    ins.debug_op = "profiled.add";
    EXPECT_EQ(tern_builder_add_instruction(builder, &ins), TERN_OK) << LastError();
    EXPECT_EQ(tern_builder_end_function(builder), TERN_OK) << LastError();
    void* data = nullptr;
    uint64_t size = 0;
    EXPECT_EQ(tern_builder_finish(builder, &data, &size), TERN_OK) << LastError();
    tern_builder_destroy(builder);
    tern_executable_t executable = nullptr;
    EXPECT_EQ(tern_executable_load(device_, data, size, nullptr, &executable), TERN_OK)
        << LastError();
    tern_builder_free_data(data);
    return executable;
  }

  tern_device_t device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  tern_buffer_t buffer_ = nullptr;
};

TEST_F(ProfileTest, CaptureHoldsWhatRanBetweenStartAndStop) {
  const std::string path = TempPath("capture");
  std::remove(path.c_str());
  // Before the capture: three fills, not recorded.
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(tern_queue_fill(queue_, buffer_, 0, 4096, 0, nullptr), TERN_OK) << LastError();
  }
  ASSERT_EQ(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), TERN_OK) << LastError();

  ASSERT_EQ(tern_profile_start(path.c_str()), TERN_OK) << LastError();
  tern_executable_t executable = AddExecutable();
  ASSERT_NE(executable, nullptr);
  ASSERT_EQ(tern_queue_fill(queue_, buffer_, 0, 4096, 0x3f800000u, nullptr), TERN_OK);
  std::vector<float> host(16, 2.0f);
  ASSERT_EQ(tern_queue_copy_h2d(queue_, buffer_, 64, host.data(), 64, nullptr), TERN_OK);
  const tern_binding_t inputs[2] = {{buffer_, 0}, {buffer_, 64}};
  const tern_binding_t outputs[1] = {{buffer_, 128}};
  ASSERT_EQ(tern_queue_execute(queue_, executable, 0, inputs, 2, outputs, 1, nullptr), TERN_OK)
      << LastError();
  ASSERT_EQ(tern_queue_copy_d2h(queue_, host.data(), buffer_, 128, 64, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), TERN_OK) << LastError();
  EXPECT_EQ(host[0], 3.0f);
  ASSERT_EQ(tern_profile_stop(), TERN_OK) << LastError();

  // After the capture: not recorded either.
  ASSERT_EQ(tern_queue_fill(queue_, buffer_, 0, 4096, 0, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), TERN_OK);
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);

  const std::vector<std::string> names = SpanNames(path);
  std::string all;
  for (const std::string& name : names) all += name + "; ";
  EXPECT_EQ(Count(names, "fill"), 1u) << all;
  EXPECT_EQ(Count(names, "copy H2D"), 1u) << all;
  EXPECT_EQ(Count(names, "copy D2H"), 1u) << all;
  EXPECT_EQ(Count(names, "execute add"), 1u) << all;
  EXPECT_EQ(Count(names, "profiled.add"), 1u) << "the instruction's span, by its graph op: " << all;
  // The load ran the small function once (a span of its own, no instruction
  // spans: see ExecuteTest.ASmallFunctionIsRehearsedAtLoadOnMemoryOfItsOwn).
  EXPECT_EQ(Count(names, "rehearse add"), 1u) << all;
  std::remove(path.c_str());
}

TEST_F(ProfileTest, MisuseFailsWithItsReason) {
  EXPECT_EQ(tern_profile_start(nullptr), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_profile_start(""), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("empty"), std::string::npos) << LastError();
  EXPECT_EQ(tern_profile_stop(), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_NE(LastError().find("no capture is running"), std::string::npos) << LastError();

  const std::string path = TempPath("twice");
  ASSERT_EQ(tern_profile_start(path.c_str()), TERN_OK) << LastError();
  EXPECT_EQ(tern_profile_start(path.c_str()), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_NE(LastError().find("already running"), std::string::npos) << LastError();
  EXPECT_NE(LastError().find(path), std::string::npos) << LastError();
  ASSERT_EQ(tern_profile_stop(), TERN_OK) << LastError();
  std::remove(path.c_str());

  // A file that cannot be written: the stop says so, and the next capture
  // starts afresh.
  const std::string unwritable = ::testing::TempDir() + "no-such-directory/trace.json";
  ASSERT_EQ(tern_profile_start(unwritable.c_str()), TERN_OK) << LastError();
  ASSERT_EQ(tern_queue_nop(queue_, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), TERN_OK);
  EXPECT_EQ(tern_profile_stop(), TERN_ERROR_IO);
  EXPECT_NE(LastError().find("no-such-directory"), std::string::npos) << LastError();
  ASSERT_EQ(tern_profile_start(path.c_str()), TERN_OK) << LastError();
  ASSERT_EQ(tern_profile_stop(), TERN_OK) << LastError();
  EXPECT_TRUE(SpanNames(path).empty()) << "the failed capture's events leaked into the next";
  std::remove(path.c_str());
}

struct Received {
  std::mutex mutex;
  std::vector<std::pair<tern_log_level_t, std::string>> messages;
};

void Collect(void* user_data, tern_log_level_t level, const char* message) {
  auto* received = static_cast<Received*>(user_data);
  std::lock_guard<std::mutex> lock(received->mutex);
  received->messages.emplace_back(level, message);
}

TEST_F(ProfileTest, LogCallbackReceivesWarningsUntilReset) {
  Received received;
  ASSERT_EQ(tern_set_log_callback(Collect, &received), TERN_OK);
  // A command that fails logs a warning naming it.
  tern_fault_params_t fault{};
  fault.struct_size = sizeof(fault);
  fault.kind = TERN_FAULT_DMA_ABORT;
  fault.core = core_;
  ASSERT_EQ(tern_debug_inject_fault(&fault), TERN_OK) << LastError();
  ASSERT_EQ(tern_queue_fill(queue_, buffer_, 0, 4096, 0, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), TERN_ERROR_DMA_ABORT);
  size_t warnings = 0;
  {
    std::lock_guard<std::mutex> lock(received.mutex);
    for (const auto& [level, text] : received.messages) {
      if (level != TERN_LOG_LEVEL_WARN) continue;
      ++warnings;
      EXPECT_NE(text.find("failed"), std::string::npos) << text;
      EXPECT_EQ(text.find("[tern]"), std::string::npos) << "no prefix: " << text;
    }
  }
  EXPECT_EQ(warnings, 1u);

  ASSERT_EQ(tern_set_log_callback(nullptr, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_clear_error(queue_), TERN_ERROR_DMA_ABORT) << "returns the error it cleared";
  ASSERT_EQ(tern_debug_inject_fault(&fault), TERN_OK) << LastError();
  ASSERT_EQ(tern_queue_fill(queue_, buffer_, 0, 4096, 0, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE), TERN_ERROR_DMA_ABORT);
  std::lock_guard<std::mutex> lock(received.mutex);
  EXPECT_EQ(received.messages.size(), warnings) << "the callback was called after its removal";
}

}  // namespace
