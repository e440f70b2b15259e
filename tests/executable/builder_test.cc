// The builder's C API: round trips through the loader, the checks it makes
// as instructions are added, files, and handle misuse. Builders need no
// runtime; the round trips initialize one to load what was built.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "exe_test_util.h"

namespace {

using exetest::Bytes;
using exetest::LastError;
using exetest::Tensor;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

const int64_t kShape[2] = {4, 8};

class BuilderTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(tern_builder_create(nullptr, &builder_), TERN_OK); }
  void TearDown() override {
    if (builder_ != nullptr) {
      EXPECT_EQ(tern_builder_destroy(builder_), TERN_OK);
    }
  }

  // A function "f" with input 'x' and output 'y', f32 [4, 8].
  void BeginUnary() {
    ASSERT_EQ(tern_builder_begin_function(builder_, "f", nullptr), TERN_OK) << LastError();
    ASSERT_EQ(tern_builder_add_input(builder_, "x", TERN_DTYPE_F32, 2, kShape, nullptr), TERN_OK);
    ASSERT_EQ(tern_builder_add_output(builder_, "y", TERN_DTYPE_F32, 2, kShape, nullptr), TERN_OK);
  }

  tern_status_t Add(tern_opcode_t opcode, std::vector<tern_operand_t> operands,
                    std::vector<int64_t> ints = {}, std::vector<double> floats = {},
                    uint32_t core = 0) {
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = opcode;
    instruction.core = core;
    instruction.operand_count = static_cast<uint32_t>(operands.size());
    instruction.operands = operands.data();
    instruction.int_count = static_cast<uint32_t>(ints.size());
    instruction.ints = ints.data();
    instruction.float_count = static_cast<uint32_t>(floats.size());
    instruction.floats = floats.data();
    return tern_builder_add_instruction(builder_, &instruction);
  }

  tern_status_t AddRelu(tern_operand_t out, tern_operand_t in) {
    return Add(TERN_OP_UNARY, {out, in}, {TERN_UNARY_RELU});
  }

  Bytes Finish() {
    void* data = nullptr;
    uint64_t size = 0;
    EXPECT_EQ(tern_builder_finish(builder_, &data, &size), TERN_OK) << LastError();
    Bytes bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
    tern_builder_free_data(data);
    return bytes;
  }

  tern_builder_t builder_ = nullptr;
};

TEST_F(BuilderTest, RoundTripsThroughTheLoader) {
  // Constants, two functions, scratch, sync between engines, strides.
  std::vector<float> weights(32, 2.0f);
  uint64_t offset = 1;
  ASSERT_EQ(tern_builder_add_constants(builder_, "abc", 3, 0, &offset), TERN_OK);
  EXPECT_EQ(offset, 0u);
  ASSERT_EQ(tern_builder_add_constants(builder_, weights.data(), 128, 256, &offset), TERN_OK);
  EXPECT_EQ(offset, 256u);
  uint32_t function = 9;
  ASSERT_EQ(tern_builder_begin_function(builder_, "first", &function), TERN_OK);
  EXPECT_EQ(function, 0u);
  ASSERT_EQ(tern_builder_add_input(builder_, "x", TERN_DTYPE_F32, 2, kShape, nullptr), TERN_OK);
  ASSERT_EQ(tern_builder_add_output(builder_, "y", TERN_DTYPE_F32, 2, kShape, nullptr), TERN_OK);
  ASSERT_EQ(tern_builder_set_scratch(builder_, 128), TERN_OK);
  ASSERT_EQ(Add(TERN_OP_BINARY,
                {Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 2, kShape),
                 Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape),
                 Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 2, kShape, 256)},
                {TERN_BINARY_MUL}),
            TERN_OK)
      << LastError();
  ASSERT_EQ(Add(TERN_OP_SEM_SIGNAL, {}, {2, 1, TERN_ENGINE_VECTOR}), TERN_OK) << LastError();
  ASSERT_EQ(Add(TERN_OP_SEM_WAIT, {}, {2, 1, TERN_ENGINE_SCALAR}), TERN_OK) << LastError();
  // A transposed read: [8, 4] view with strides [1, 8] of the [4, 8] scratch.
  const int64_t transposed[2] = {8, 4};
  const int64_t strides[2] = {1, 8};
  tern_operand_t view = Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 2, transposed);
  view.strides = strides;
  ASSERT_EQ(AddRelu(Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, transposed), view), TERN_OK)
      << LastError();
  ASSERT_EQ(tern_builder_end_function(builder_), TERN_OK) << LastError();
  const int64_t scalar_shape[1] = {1};
  ASSERT_EQ(tern_builder_begin_function(builder_, "second", &function), TERN_OK);
  EXPECT_EQ(function, 1u);
  ASSERT_EQ(tern_builder_add_output(builder_, "ones", TERN_DTYPE_I32, 1, scalar_shape, nullptr),
            TERN_OK);
  ASSERT_EQ(
      Add(TERN_OP_FILL, {Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_I32, 1, scalar_shape)}, {1}),
      TERN_OK)
      << LastError();
  ASSERT_EQ(tern_builder_end_function(builder_), TERN_OK);
  const Bytes data = Finish();
  // The builder stays usable and is deterministic.
  EXPECT_EQ(Finish(), data);

  ASSERT_EQ(tern_init(nullptr), TERN_OK);
  tern_device_t device = nullptr;
  ASSERT_EQ(tern_device_get(0, &device), TERN_OK);
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load(device, data.data(), data.size(), nullptr, &executable), TERN_OK)
      << LastError();
  uint32_t count = 0;
  ASSERT_EQ(tern_executable_function_count(executable, &count), TERN_OK);
  EXPECT_EQ(count, 2u);
  tern_function_info_t info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(tern_executable_function_info(executable, 0, &info), TERN_OK);
  EXPECT_STREQ(info.name, "first");
  EXPECT_EQ(info.instruction_count, 4u);
  EXPECT_EQ(info.scratch_bytes, 128u);
  EXPECT_EQ(info.input_count, 1u);
  ASSERT_EQ(tern_executable_function_info(executable, 1, &info), TERN_OK);
  EXPECT_STREQ(info.name, "second");
  EXPECT_EQ(info.instruction_count, 1u);
  EXPECT_EQ(info.input_count, 0u);
  tern_tensor_info_t tensor{};
  tensor.struct_size = sizeof(tensor);
  ASSERT_EQ(tern_executable_tensor_info(executable, 1, 1, 0, &tensor), TERN_OK);
  EXPECT_STREQ(tensor.name, "ones");
  EXPECT_EQ(tensor.dtype, TERN_DTYPE_I32);
  EXPECT_EQ(tensor.size_bytes, 4u);
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
  EXPECT_EQ(tern_shutdown(), TERN_OK);
}

TEST_F(BuilderTest, WritesFilesAtomically) {
  BeginUnary();
  ASSERT_EQ(AddRelu(Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, kShape),
                    Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape)),
            TERN_OK);
  ASSERT_EQ(tern_builder_end_function(builder_), TERN_OK);
  char dir_template[] = "/tmp/tern-builder-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string path = dir + "/relu.tern";
  {
    std::ofstream old(path);
    old << "an older file";
  }
  ASSERT_EQ(tern_builder_write_file(builder_, path.c_str()), TERN_OK) << LastError();
  std::ifstream in(path, std::ios::binary);
  const Bytes written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(written, Finish());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  // No temporary file is left behind.
  int entries = 0;
  DIR* handle = opendir(dir.c_str());
  while (dirent* entry = readdir(handle)) entries += entry->d_name[0] != '.';
  closedir(handle);
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(tern_builder_write_file(builder_, (dir + "/missing/x.tern").c_str()), TERN_ERROR_IO);
  EXPECT_CONTAINS(LastError(), "missing");
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST_F(BuilderTest, ChecksInstructionsAsTheyAreAdded) {
  const tern_operand_t out = Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, kShape);
  const tern_operand_t in = Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape);
  // No function yet.
  EXPECT_EQ(AddRelu(out, in), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_CONTAINS(LastError(), "tern_builder_begin_function");
  BeginUnary();
  // An opcode this version does not know.
  EXPECT_EQ(Add(static_cast<tern_opcode_t>(0x0377), {out, in}), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "0x0377");
  // An operand outside its input.
  EXPECT_EQ(AddRelu(out, Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape, 64)),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "operand 1 (input 0 'x')");
  EXPECT_CONTAINS(LastError(), "[64, 192)");
  // An input that was not declared.
  EXPECT_EQ(AddRelu(out, Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 2, kShape)),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "declare inputs and outputs before");
  // Constants not added yet.
  EXPECT_EQ(AddRelu(out, Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 2, kShape)),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "add constants before");
  // Writing the constants.
  uint64_t offset = 0;
  std::vector<uint8_t> bytes(128);
  ASSERT_EQ(tern_builder_add_constants(builder_, bytes.data(), bytes.size(), 64, &offset), TERN_OK);
  EXPECT_EQ(AddRelu(Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 2, kShape), in),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "constants segment");
  // The opcode's own rules.
  EXPECT_EQ(AddRelu(out, Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_I32, 2, kShape)),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "instruction 0 (unary) of function 'f'");
  EXPECT_EQ(Add(TERN_OP_UNARY, {out, in}, {}), TERN_ERROR_INVALID_ARGUMENT);
  // Unknown dtype, rank too high, NULL shape.
  tern_operand_t bad = in;
  bad.dtype = static_cast<tern_dtype_t>(77);
  EXPECT_EQ(AddRelu(out, bad), TERN_ERROR_INVALID_ARGUMENT);
  bad = in;
  bad.rank = 9;
  EXPECT_EQ(AddRelu(out, bad), TERN_ERROR_INVALID_ARGUMENT);
  bad = in;
  bad.shape = nullptr;
  EXPECT_EQ(AddRelu(out, bad), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "shape is NULL");
  // Cores beyond the limit.
  EXPECT_EQ(Add(TERN_OP_UNARY, {out, in}, {TERN_UNARY_RELU}, {}, 4096),
            TERN_ERROR_INVALID_ARGUMENT);
  // Sync instructions need their engine as a third int.
  EXPECT_EQ(Add(TERN_OP_SEM_SIGNAL, {}, {0, 1}), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "3 ints");
  EXPECT_EQ(Add(TERN_OP_SEM_SIGNAL, {}, {0, 1, TERN_ENGINE_SYNC}), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Add(TERN_OP_SEM_WAIT, {}, {-1, 1, TERN_ENGINE_DMA}), TERN_ERROR_INVALID_ARGUMENT);
  // A struct_size from an older caller, NULL arrays.
  tern_instruction_t instruction{};
  instruction.struct_size = 8;
  EXPECT_EQ(tern_builder_add_instruction(builder_, &instruction), TERN_ERROR_INVALID_ARGUMENT);
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_UNARY;
  instruction.operand_count = 2;
  EXPECT_EQ(tern_builder_add_instruction(builder_, &instruction), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_add_instruction(builder_, nullptr), TERN_ERROR_INVALID_ARGUMENT);
  // None of the failures left anything behind: the function is still empty.
  ASSERT_EQ(tern_builder_end_function(builder_), TERN_OK);
  ASSERT_EQ(tern_init(nullptr), TERN_OK);
  tern_device_t device = nullptr;
  ASSERT_EQ(tern_device_get(0, &device), TERN_OK);
  const Bytes data = Finish();
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load(device, data.data(), data.size(), nullptr, &executable), TERN_OK);
  tern_function_info_t info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(tern_executable_function_info(executable, 0, &info), TERN_OK);
  EXPECT_EQ(info.instruction_count, 0u);
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
  EXPECT_EQ(tern_shutdown(), TERN_OK);
}

TEST_F(BuilderTest, ChecksScratchAndDeadlocksAtEndOfFunction) {
  BeginUnary();
  ASSERT_EQ(AddRelu(Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 2, kShape),
                    Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape)),
            TERN_OK);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "use 128 bytes of scratch but it has 0");
  ASSERT_EQ(tern_builder_set_scratch(builder_, 128), TERN_OK);
  ASSERT_EQ(Add(TERN_OP_SEM_WAIT, {}, {1, 2, TERN_ENGINE_SCALAR}), TERN_OK);
  ASSERT_EQ(Add(TERN_OP_SEM_SIGNAL, {}, {1, 1, TERN_ENGINE_VECTOR}), TERN_OK);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "deadlock");
  EXPECT_CONTAINS(LastError(), "scalar engine of core 0");
  ASSERT_EQ(Add(TERN_OP_SEM_SIGNAL, {}, {1, 1, TERN_ENGINE_DMA}), TERN_OK);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_OK) << LastError();
}

TEST_F(BuilderTest, RefusesRacingStreamsAtEndOfFunctionUnlessAllowed) {
  // The program: a result written on one engine and rewritten in
  // place on another, with no semaphore between them.
  BeginUnary();
  ASSERT_EQ(tern_builder_set_scratch(builder_, 128), TERN_OK);
  const tern_operand_t in = Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape);
  const tern_operand_t out = Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, kShape);
  ASSERT_EQ(Add(TERN_OP_COPY, {out, in}, {}), TERN_OK);
  ASSERT_EQ(AddRelu(out, out), TERN_OK);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_ERROR_INVALID_ARGUMENT);
  const std::string message = LastError();
  EXPECT_CONTAINS(message, "function 'f': its engine streams race");
  EXPECT_CONTAINS(message, "the dma engine of core 0, instruction 0 (copy) writes output 0");
  EXPECT_CONTAINS(message, "the scalar engine of core 0, instruction 0 (unary)");
  EXPECT_CONTAINS(message, "TERN_BUILDER_ALLOW_RACES");

  // The function stays open; with the flag it ends.
  EXPECT_EQ(tern_builder_set_flags(builder_, 0x6), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "bits 0x6 are not defined");
  ASSERT_EQ(tern_builder_set_flags(builder_, TERN_BUILDER_ALLOW_RACES), TERN_OK);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_OK) << LastError();
  EXPECT_EQ(tern_builder_set_flags(nullptr, 0), TERN_ERROR_INVALID_HANDLE);
}

TEST_F(BuilderTest, OrderedStreamsEndWithoutFlags) {
  BeginUnary();
  const tern_operand_t in = Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, kShape);
  const tern_operand_t out = Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, kShape);
  ASSERT_EQ(Add(TERN_OP_COPY, {out, in}, {}), TERN_OK);
  ASSERT_EQ(Add(TERN_OP_SEM_SIGNAL, {}, {3, 1, TERN_ENGINE_DMA}), TERN_OK);
  ASSERT_EQ(Add(TERN_OP_SEM_WAIT, {}, {3, 1, TERN_ENGINE_SCALAR}), TERN_OK);
  ASSERT_EQ(AddRelu(out, out), TERN_OK);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_OK) << LastError();
}

TEST_F(BuilderTest, ChecksSignaturesAndLifecycle) {
  EXPECT_EQ(tern_builder_add_input(builder_, "x", TERN_DTYPE_F32, 2, kShape, nullptr),
            TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(tern_builder_set_scratch(builder_, 1), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(tern_builder_end_function(builder_), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(tern_builder_begin_function(builder_, "", nullptr), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_begin_function(builder_, nullptr, nullptr), TERN_ERROR_INVALID_ARGUMENT);
  BeginUnary();
  EXPECT_EQ(tern_builder_begin_function(builder_, "g", nullptr), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_CONTAINS(LastError(), "'f' is still open");
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(tern_builder_finish(builder_, &data, &size), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(data, nullptr);
  EXPECT_EQ(tern_builder_add_input(builder_, "x", TERN_DTYPE_F32, 2, kShape, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "named 'x'");
  EXPECT_EQ(
      tern_builder_add_output(builder_, "z", static_cast<tern_dtype_t>(50), 2, kShape, nullptr),
      TERN_ERROR_INVALID_ARGUMENT);
  const int64_t negative[1] = {-3};
  EXPECT_EQ(tern_builder_add_output(builder_, "z", TERN_DTYPE_F32, 1, negative, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "-3");
  EXPECT_EQ(tern_builder_add_output(builder_, "z", TERN_DTYPE_F32, 9, kShape, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_add_output(builder_, "z", TERN_DTYPE_F32, 2, nullptr, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(tern_builder_end_function(builder_), TERN_OK);
  EXPECT_EQ(tern_builder_begin_function(builder_, "f", nullptr), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "'f' already exists");
  uint64_t offset = 0;
  EXPECT_EQ(tern_builder_add_constants(builder_, "abc", 3, 48, &offset),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_add_constants(builder_, "abc", 3, 8192, &offset),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_add_constants(builder_, nullptr, 3, 64, &offset),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_add_constants(builder_, "abc", 3, 64, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_finish(builder_, nullptr, &size), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_write_file(builder_, nullptr), TERN_ERROR_INVALID_ARGUMENT);
}

TEST(BuilderHandles, AreChecked) {
  tern_builder_t builder = nullptr;
  EXPECT_EQ(tern_builder_create(nullptr, nullptr), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_builder_create("", &builder), TERN_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(tern_builder_create("trn2", &builder), TERN_OK);
  ASSERT_EQ(tern_builder_destroy(builder), TERN_OK);
  EXPECT_EQ(tern_builder_destroy(builder), TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_builder_begin_function(builder, "f", nullptr), TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_builder_destroy(nullptr), TERN_ERROR_INVALID_HANDLE);
  EXPECT_CONTAINS(LastError(), "tern_builder_create");
  tern_builder_free_data(nullptr);
}

TEST(BuilderTargets, OtherTargetsBuildButDoNotLoad) {
  tern_builder_t builder = nullptr;
  ASSERT_EQ(tern_builder_create("trn3", &builder), TERN_OK);
  void* data = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(tern_builder_finish(builder, &data, &size), TERN_OK);
  ASSERT_EQ(tern_init(nullptr), TERN_OK);
  tern_device_t device = nullptr;
  ASSERT_EQ(tern_device_get(0, &device), TERN_OK);
  tern_executable_t executable = nullptr;
  EXPECT_EQ(tern_executable_load(device, data, size, nullptr, &executable),
            TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  EXPECT_CONTAINS(LastError(), "'trn3'");
  tern_builder_free_data(data);
  EXPECT_EQ(tern_builder_destroy(builder), TERN_OK);
  EXPECT_EQ(tern_shutdown(), TERN_OK);
}

}  // namespace
