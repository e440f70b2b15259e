// CTS: negative tests for every public function of executable.h and
// builder.h. Each bad input must give its exact code and a message of its
// own (CTS_EXPECT_ERROR checks both), clear the function's out parameters,
// and leave the objects involved usable.
//
// tests/executable/ checks the loader's validation rules, the builder's
// instruction checks and the binding checks one by one; this file checks the
// API surface the same way for every function: handles (NULL, destroyed,
// from an earlier runtime session, of another kind, forged), NULL and
// too-small out structs, indices, names, sizes, and calls in the wrong
// state or before tern_init().
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "cts_fixture.h"
#include "cts_negative_util.h"

namespace tern::cts {
namespace {

using Bytes = std::vector<uint8_t>;

const int64_t kShape[2] = {4, 8};  // 128 bytes of f32
constexpr uint64_t kTensorBytes = 128;

tern_operand_t Operand(tern_segment_t segment, uint32_t index) {
  tern_operand_t operand{};
  operand.segment = segment;
  operand.index = index;
  operand.dtype = TERN_DTYPE_F32;
  operand.rank = 2;
  operand.shape = kShape;
  return operand;
}

// An executable with one function "add": out 'z' = 'x' + 'y', f32 [4, 8].
Bytes BuildAdd() {
  tern_builder_t builder = nullptr;
  EXPECT_EQ(TERN_OK, tern_builder_create(nullptr, &builder));
  EXPECT_EQ(TERN_OK, tern_builder_begin_function(builder, "add", nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, kShape, nullptr));
  const tern_operand_t operands[3] = {Operand(TERN_SEGMENT_OUTPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 1)};
  const int64_t ints[1] = {TERN_BINARY_ADD};
  tern_instruction_t instruction{};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_BINARY;
  instruction.operand_count = 3;
  instruction.operands = operands;
  instruction.int_count = 1;
  instruction.ints = ints;
  EXPECT_EQ(TERN_OK, tern_builder_add_instruction(builder, &instruction))
      << tern_last_error_message();
  EXPECT_EQ(TERN_OK, tern_builder_end_function(builder));
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(TERN_OK, tern_builder_finish(builder, &data, &size));
  Bytes bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  EXPECT_EQ(TERN_OK, tern_builder_destroy(builder));
  return bytes;
}

// A file of the test's own, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const Bytes& bytes) {
    char name[] = "/tmp/tern-cts-exe-XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    if (fd >= 0) {
      EXPECT_EQ(static_cast<ssize_t>(bytes.size()), write(fd, bytes.data(), bytes.size()));
      close(fd);
    }
    path_ = name;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const char* path() const { return path_.c_str(); }

 private:
  std::string path_;
};

// --- Before tern_init --------------------------------------------------------------

class NegativeExecutableBeforeInitTest : public BackendTest {};

// Every function of executable.h needs the runtime; every function of
// builder.h works without one.
TEST_P(NegativeExecutableBeforeInitTest, ExecutablesNeedTheRuntimeBuildersDoNot) {
  const Bytes data = BuildAdd();
  const tern_executable_t forged = Forge<tern_executable_t>(0x0600000600000001);
  const tern_device_t device = Forge<tern_device_t>(0x0100000100000001);
  tern_executable_t executable = Forge<tern_executable_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED,
                   tern_executable_load(device, data.data(), data.size(), nullptr, &executable),
                   "tern_init");
  EXPECT_EQ(nullptr, executable);
  TempFile file(data);
  executable = Forge<tern_executable_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED,
                   tern_executable_load_file(device, file.path(), nullptr, &executable),
                   "tern_init");
  EXPECT_EQ(nullptr, executable);
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_executable_unload(forged), "tern_init");
  uint32_t count = 7;
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_executable_function_count(forged, &count),
                   "tern_init");
  EXPECT_EQ(0u, count);
  uint32_t function = 7;
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED,
                   tern_executable_find_function(forged, "add", &function), "tern_init");
  EXPECT_EQ(0u, function);
  tern_function_info_t info;
  std::memset(&info, 0xcd, sizeof(info));
  info.struct_size = sizeof(info);
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_executable_function_info(forged, 0, &info),
                   "tern_init");
  EXPECT_EQ(nullptr, info.name);
  tern_tensor_info_t tensor;
  std::memset(&tensor, 0xcd, sizeof(tensor));
  tensor.struct_size = sizeof(tensor);
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED,
                   tern_executable_tensor_info(forged, 0, 0, 0, &tensor), "tern_init");
  EXPECT_EQ(nullptr, tensor.name);
  EXPECT_EQ(0u, tensor.size_bytes);
  const tern_binding_t bindings[2] = {{Forge<tern_buffer_t>(0x0300000300000001), 0},
                                      {Forge<tern_buffer_t>(0x0300000300000002), 0}};
  uint64_t sequence = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED,
                   tern_queue_execute(Forge<tern_queue_t>(0x0400000400000001), forged, 0, bindings,
                                      2, bindings, 1, &sequence),
                   "tern_init");
  EXPECT_EQ(0u, sequence);
  // BuildAdd() above ran every builder function without a runtime.
}

CTS_INSTANTIATE(NegativeExecutableBeforeInitTest);

// --- The builder (needs no runtime) -------------------------------------------------

class NegativeBuilderTest : public BackendTest {
 protected:
  void SetUp() override {
    CTS_ASSERT_OK(tern_builder_create(nullptr, &builder_));
    CTS_ASSERT_OK(tern_builder_create(nullptr, &dead_));
    CTS_ASSERT_OK(tern_builder_destroy(dead_));
  }
  void TearDown() override {
    if (builder_ != nullptr) {
      CTS_EXPECT_OK(tern_builder_destroy(builder_));
    }
    BackendTest::TearDown();
  }

  // Labelled values that are not live builder handles.
  std::vector<std::pair<std::string, tern_builder_t>> BadBuilders() {
    return {{"NULL", nullptr},
            {"destroyed", dead_},
            {"an executable handle", Forge<tern_builder_t>(0x0600000600000001)},
            {"a device handle", Forge<tern_builder_t>(0x0100000100000001)},
            {"forged 0x1", Forge<tern_builder_t>(1)},
            {"forged 0xdeadbeef", Forge<tern_builder_t>(0xdeadbeef)},
            {"forged all ones", Forge<tern_builder_t>(~uintptr_t{0})},
            {"forged: live + 8", Forge<tern_builder_t>(Bits(builder_) + 8)},
            {"forged: live + 4096", Forge<tern_builder_t>(Bits(builder_) + 4096)}};
  }

  void BeginFunction(const char* name = "f") {
    CTS_ASSERT_OK(tern_builder_begin_function(builder_, name, nullptr));
  }

  tern_instruction_t Relu(const tern_operand_t* operands) {
    static const int64_t kRelu[1] = {TERN_UNARY_RELU};
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = TERN_OP_UNARY;
    instruction.operand_count = 2;
    instruction.operands = operands;
    instruction.int_count = 1;
    instruction.ints = kRelu;
    return instruction;
  }

  // The failures left the builder usable: it still produces an executable.
  void ExpectBuilderUsable() {
    void* data = nullptr;
    uint64_t size = 0;
    CTS_EXPECT_OK(tern_builder_finish(builder_, &data, &size));
    EXPECT_GT(size, 0u);
    tern_builder_free_data(data);
  }

  tern_builder_t builder_ = nullptr;
  tern_builder_t dead_ = nullptr;
};

TEST_P(NegativeBuilderTest, Create) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_create(nullptr, nullptr),
                   "out_builder");
  tern_builder_t builder = Forge<tern_builder_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_create("", &builder), "target");
  EXPECT_EQ(nullptr, builder);
}

TEST_P(NegativeBuilderTest, Destroy) {
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_destroy(bad), "tern_builder_create");
  }
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, AddConstants) {
  const uint8_t bytes[16] = {1, 2, 3};
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    uint64_t offset = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_builder_add_constants(bad, bytes, sizeof(bytes), 64, &offset),
                     "tern_builder_create");
    EXPECT_EQ(0u, offset);
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_builder_add_constants(builder_, bytes, sizeof(bytes), 64, nullptr),
                   "out_offset");
  uint64_t offset = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_builder_add_constants(builder_, nullptr, 16, 64, &offset), "data is NULL");
  EXPECT_EQ(0u, offset);
  for (uint64_t alignment : {3ull, 48ull, 96ull, 8192ull, 1ull << 40, ~0ull}) {
    SCOPED_TRACE(alignment);
    offset = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_builder_add_constants(builder_, bytes, sizeof(bytes), alignment, &offset),
                     "power of two");
    EXPECT_EQ(0u, offset);
  }
  // More than the format holds, without reading any of it (data is not
  // dereferenced before the size check).
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_builder_add_constants(builder_, bytes, UINT64_MAX - 4, 64, &offset),
                   "limit");
  // None of the failures added anything: the next constants go at 0.
  CTS_EXPECT_OK(tern_builder_add_constants(builder_, bytes, sizeof(bytes), 64, &offset));
  EXPECT_EQ(0u, offset);
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, BeginFunction) {
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    uint32_t function = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_begin_function(bad, "f", &function),
                     "tern_builder_create");
    EXPECT_EQ(0u, function);
  }
  uint32_t function = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_builder_begin_function(builder_, nullptr, &function), "name");
  EXPECT_EQ(0u, function);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_begin_function(builder_, "", nullptr),
                   "name");
  BeginFunction("f");
  function = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_builder_begin_function(builder_, "g", &function), "'f' is still open",
                   "tern_builder_end_function");
  EXPECT_EQ(0u, function);
  CTS_ASSERT_OK(tern_builder_end_function(builder_));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_begin_function(builder_, "f", nullptr),
                   "'f' already exists");
  CTS_EXPECT_OK(tern_builder_begin_function(builder_, "g", &function));
  EXPECT_EQ(1u, function);
  CTS_EXPECT_OK(tern_builder_end_function(builder_));
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, AddInputAndOutput) {
  for (int output = 0; output <= 1; ++output) {
    SCOPED_TRACE(output ? "add_output" : "add_input");
    auto add = [&](tern_builder_t builder, const char* name, tern_dtype_t dtype, uint32_t rank,
                   const int64_t* shape, uint32_t* out_index) {
      return output ? tern_builder_add_output(builder, name, dtype, rank, shape, out_index)
                    : tern_builder_add_input(builder, name, dtype, rank, shape, out_index);
    };
    for (const auto& [label, handle] : BadBuilders()) {
      SCOPED_TRACE(label);
      tern_builder_t bad = handle;
      uint32_t index = 99;
      CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, add(bad, "x", TERN_DTYPE_F32, 2, kShape, &index),
                       "tern_builder_create");
      EXPECT_EQ(0u, index);
    }
    // No function open.
    uint32_t index = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                     add(builder_, "x", TERN_DTYPE_F32, 2, kShape, &index),
                     "tern_builder_begin_function");
    EXPECT_EQ(0u, index);
  }
  BeginFunction();
  CTS_ASSERT_OK(tern_builder_add_input(builder_, "x", TERN_DTYPE_F32, 2, kShape, nullptr));
  for (int output = 0; output <= 1; ++output) {
    SCOPED_TRACE(output ? "add_output" : "add_input");
    // The dtype travels as an int until the call, as it would from C: a
    // tern_dtype_t variable holding 1000 is undefined behaviour in C++.
    auto add = [&](const char* name, int32_t dtype, uint32_t rank, const int64_t* shape) {
      uint32_t index = 99;
      const tern_status_t status =
          output ? tern_builder_add_output(builder_, name, static_cast<tern_dtype_t>(dtype), rank,
                                           shape, &index)
                 : tern_builder_add_input(builder_, name, static_cast<tern_dtype_t>(dtype), rank,
                                          shape, &index);
      EXPECT_EQ(0u, index);
      return status;
    };
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add(nullptr, TERN_DTYPE_F32, 2, kShape),
                     "name is NULL");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("", TERN_DTYPE_F32, 2, kShape), "name");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("x", TERN_DTYPE_F32, 2, kShape), "named 'x'");
    for (int32_t dtype : {-1, static_cast<int32_t>(TERN_DTYPE_COUNT), 1000}) {
      SCOPED_TRACE(dtype);
      CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("d", dtype, 2, kShape),
                       std::to_string(dtype < 0 ? UINT32_MAX : dtype).c_str());
    }
    const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("r", TERN_DTYPE_F32, 9, nine), "rank 9");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("s", TERN_DTYPE_F32, 2, nullptr),
                     "shape is NULL");
    const int64_t negative[2] = {4, -1};
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("n", TERN_DTYPE_F32, 2, negative), "-1");
    const int64_t huge[2] = {INT64_MAX, 4};
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, add("h", TERN_DTYPE_F32, 2, huge), "overflows");
  }
  // The failures declared nothing: the next output is output 0.
  uint32_t index = 99;
  CTS_EXPECT_OK(tern_builder_add_output(builder_, "y", TERN_DTYPE_F32, 2, kShape, &index));
  EXPECT_EQ(0u, index);
  CTS_EXPECT_OK(tern_builder_end_function(builder_));
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, SetScratch) {
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_set_scratch(bad, 64),
                     "tern_builder_create");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_builder_set_scratch(builder_, 64),
                   "tern_builder_begin_function");
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, AddInstruction) {
  const tern_operand_t operands[2] = {Operand(TERN_SEGMENT_OUTPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 0)};
  const tern_instruction_t relu = Relu(operands);
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_add_instruction(bad, &relu),
                     "tern_builder_create");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_builder_add_instruction(builder_, &relu),
                   "tern_builder_begin_function");
  BeginFunction();
  CTS_ASSERT_OK(tern_builder_add_input(builder_, "x", TERN_DTYPE_F32, 2, kShape, nullptr));
  CTS_ASSERT_OK(tern_builder_add_output(builder_, "y", TERN_DTYPE_F32, 2, kShape, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, nullptr),
                   "instruction is NULL");
  for (uint32_t size : TooSmallStructSizes<decltype(relu)>()) {
    SCOPED_TRACE(size);
    tern_instruction_t small = relu;
    small.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &small),
                     "struct_size");
  }
  tern_instruction_t bad = relu;
  bad.operands = nullptr;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "operands is NULL");
  bad = relu;
  bad.ints = nullptr;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "ints is NULL");
  bad = relu;
  bad.float_count = 2;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "floats is NULL");
  bad = relu;
  bad.operand_count = 1000;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "operand_count is 1000");
  for (int32_t opcode : {0, 0x0377, 0x0800, 0xffff, 0x10000, -1}) {
    SCOPED_TRACE(opcode);
    bad = relu;
    SetRawEnum(&bad.opcode, opcode);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                     "opcode");
  }
  tern_operand_t bad_operands[2] = {operands[0], operands[1]};
  bad = relu;
  bad.operands = bad_operands;
  SetRawEnum(&bad_operands[1].segment, 7);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "segment 7");
  bad_operands[1] = operands[1];
  SetRawEnum(&bad_operands[1].dtype, 99);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "dtype 99");
  bad_operands[1] = operands[1];
  bad_operands[1].index = 5;  // the function has one input
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "input 5");
  bad_operands[1] = operands[1];
  bad_operands[1].offset = UINT64_MAX - 8;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "in:", "overflows");
  bad = relu;
  bad.core = 100000;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &bad),
                   "core 100000");
  // Sync instructions take their stream's engine as a third int.
  const int64_t two[2] = {0, 1};
  tern_instruction_t sync{};
  sync.struct_size = sizeof(sync);
  sync.opcode = TERN_OP_SEM_SIGNAL;
  sync.int_count = 2;
  sync.ints = two;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &sync),
                   "3 ints", "engine");
  for (int64_t engine : {0ll, static_cast<long long>(TERN_ENGINE_SYNC), 8ll, -1ll}) {
    SCOPED_TRACE(engine);
    const int64_t three[3] = {0, 1, engine};
    sync.int_count = 3;
    sync.ints = three;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_add_instruction(builder_, &sync),
                     "ints[2]");
  }
  // None of the failures added an instruction.
  CTS_EXPECT_OK(tern_builder_end_function(builder_));
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, EndFunction) {
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_end_function(bad),
                     "tern_builder_create");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_builder_end_function(builder_),
                   "tern_builder_begin_function");
  BeginFunction();
  CTS_ASSERT_OK(tern_builder_end_function(builder_));
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_builder_end_function(builder_));
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, Finish) {
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    void* data = Forge<void*>(0x1234);
    uint64_t size = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_finish(bad, &data, &size),
                     "tern_builder_create");
    EXPECT_EQ(nullptr, data);
    EXPECT_EQ(0u, size);
  }
  void* data = Forge<void*>(0x1234);
  uint64_t size = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_finish(builder_, nullptr, &size),
                   "out_data");
  EXPECT_EQ(0u, size);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_finish(builder_, &data, nullptr),
                   "out_size");
  EXPECT_EQ(nullptr, data);
  BeginFunction();
  data = Forge<void*>(0x1234);
  size = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_builder_finish(builder_, &data, &size),
                   "'f'");
  EXPECT_EQ(nullptr, data);
  EXPECT_EQ(0u, size);
  CTS_ASSERT_OK(tern_builder_end_function(builder_));
  ExpectBuilderUsable();
}

TEST_P(NegativeBuilderTest, WriteFile) {
  for (const auto& [label, handle] : BadBuilders()) {
    SCOPED_TRACE(label);
    tern_builder_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_builder_write_file(bad, "/tmp/x.tern"),
                     "tern_builder_create");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_write_file(builder_, nullptr),
                   "path is NULL");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_builder_write_file(builder_, ""), "empty");
  CTS_EXPECT_ERROR(TERN_ERROR_IO,
                   tern_builder_write_file(builder_, "/nonexistent-tern-dir/model.tern"),
                   "/nonexistent-tern-dir/model.tern");
  // A directory cannot be replaced by a file; the temporary file goes.
  char dir[] = "/tmp/tern-cts-dir-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(dir));
  CTS_EXPECT_ERROR(TERN_ERROR_IO, tern_builder_write_file(builder_, dir), dir);
  BeginFunction();
  const std::string path = std::string(dir) + "/open.tern";
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_builder_write_file(builder_, path.c_str()),
                   "'f'");
  EXPECT_NE(0, access(path.c_str(), F_OK)) << "a failed write left " << path;
  EXPECT_EQ(0, rmdir(dir)) << "a failed write left a file in " << dir;
  CTS_ASSERT_OK(tern_builder_end_function(builder_));
  ExpectBuilderUsable();
}

CTS_INSTANTIATE(NegativeBuilderTest);

// --- Loaded executables --------------------------------------------------------------

class NegativeExecutableTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    data_ = BuildAdd();
    // One from an earlier runtime session.
    CTS_ASSERT_OK(tern_executable_load(device(0), data_.data(), data_.size(), nullptr, &stale_));
    RestartRuntime();
    if (HasFatalFailure()) return;
    CTS_ASSERT_OK(
        tern_executable_load(device(0), data_.data(), data_.size(), nullptr, &executable_));
    CTS_ASSERT_OK(tern_executable_load(device(0), data_.data(), data_.size(), nullptr, &dead_));
    CTS_ASSERT_OK(tern_executable_unload(dead_));
    core_ = OpenCore(0, 0);
    queue_ = CreateQueue(core_, "cts-executable-negative");
    for (tern_buffer_t& buffer : buffers_) buffer = Alloc(0, kTensorBytes);
    small_ = Alloc(0, kTensorBytes / 2);
    if (device_count() > 1) remote_ = Alloc(1, kTensorBytes);
    ASSERT_TRUE(core_ && queue_ && buffers_[0] && buffers_[1] && buffers_[2] && small_);
    CTS_ASSERT_OK(tern_builder_create(nullptr, &builder_));
  }
  void TearDown() override {
    if (builder_ != nullptr) {
      CTS_EXPECT_OK(tern_builder_destroy(builder_));
    }
    RuntimeTest::TearDown();
  }

  // Labelled values that are not live executable handles.
  std::vector<std::pair<std::string, tern_executable_t>> BadExecutables() {
    std::vector<std::pair<std::string, tern_executable_t>> bad = {
        {"NULL", nullptr},
        {"unloaded", dead_},
        {"from before a shutdown+init cycle", stale_},
        {"a device handle", Forge<tern_executable_t>(Bits(device(0)))},
        {"a core handle", Forge<tern_executable_t>(Bits(core_))},
        {"a buffer handle", Forge<tern_executable_t>(Bits(buffers_[0]))},
        {"a queue handle", Forge<tern_executable_t>(Bits(queue_))},
        {"a builder handle", Forge<tern_executable_t>(Bits(builder_))},
        {"forged 0x1", Forge<tern_executable_t>(1)},
        {"forged 0xdeadbeef", Forge<tern_executable_t>(0xdeadbeef)},
        {"forged all ones", Forge<tern_executable_t>(~uintptr_t{0})},
        {"forged: live + 1", Forge<tern_executable_t>(Bits(executable_) + 1)},
        {"forged: live ^ bit 40", Forge<tern_executable_t>(Bits(executable_) ^ (1ull << 40))},
        {"forged: live ^ bit 60", Forge<tern_executable_t>(Bits(executable_) ^ (1ull << 60))}};
    return bad;
  }

  // Bindings of buffers_: x, y and z.
  const tern_binding_t* Inputs() {
    inputs_[0] = {buffers_[0], 0};
    inputs_[1] = {buffers_[1], 0};
    return inputs_;
  }
  const tern_binding_t* Outputs() {
    outputs_[0] = {buffers_[2], 0};
    return outputs_;
  }

  // The failed submissions enqueued nothing, and the executable still runs.
  void ExpectQueueUntouchedAndExecutableUsable() {
    ExpectNoSubmissionTaken(queue_, [&](uint64_t* sequence) {
      return tern_queue_execute(queue_, executable_, 0, Inputs(), 2, Outputs(), 1, sequence);
    });
  }

  Bytes data_;
  tern_executable_t executable_ = nullptr;
  tern_executable_t dead_ = nullptr;
  tern_executable_t stale_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  tern_buffer_t buffers_[3] = {};
  tern_buffer_t small_ = nullptr;
  tern_buffer_t remote_ = nullptr;
  tern_builder_t builder_ = nullptr;
  tern_binding_t inputs_[2] = {};
  tern_binding_t outputs_[1] = {};
};

TEST_P(NegativeExecutableTest, Load) {
  tern_executable_t executable = Forge<tern_executable_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_load(device(0), data_.data(), data_.size(), nullptr, nullptr),
                   "out_executable");
  const std::vector<std::pair<std::string, tern_device_t>> bad_devices = {
      {"NULL", nullptr},
      {"a core handle", Forge<tern_device_t>(Bits(core_))},
      {"an executable handle", Forge<tern_device_t>(Bits(executable_))},
      {"forged 0xdeadbeef", Forge<tern_device_t>(0xdeadbeef)}};
  for (const auto& [label, handle] : bad_devices) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    executable = Forge<tern_executable_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_executable_load(bad, data_.data(), data_.size(), nullptr, &executable),
                     "device");
    EXPECT_EQ(nullptr, executable);
  }
  executable = Forge<tern_executable_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_load(device(0), nullptr, 64, nullptr, &executable),
                   "data is NULL");
  EXPECT_EQ(nullptr, executable);
  CTS_EXPECT_ERROR(TERN_ERROR_EXECUTABLE_INVALID,
                   tern_executable_load(device(0), nullptr, 0, nullptr, &executable), "0 bytes");
  tern_executable_load_params_t params{};
  for (uint32_t size : TooSmallStructSizes<decltype(params)>()) {
    SCOPED_TRACE(size);
    params.struct_size = size;
    CTS_EXPECT_ERROR(
        TERN_ERROR_INVALID_ARGUMENT,
        tern_executable_load(device(0), data_.data(), data_.size(), &params, &executable),
        "struct_size");
  }
  params.struct_size = sizeof(params);
  for (uint32_t flags : {2u, 0x80000000u}) {  // 0x1 is TERN_EXECUTABLE_LOAD_ALLOW_RACES
    SCOPED_TRACE(flags);
    params.flags = flags;
    CTS_EXPECT_ERROR(
        TERN_ERROR_INVALID_ARGUMENT,
        tern_executable_load(device(0), data_.data(), data_.size(), &params, &executable), "flags");
    EXPECT_EQ(nullptr, executable);
  }
  // Sizes that do not match the data: shorter, and text that is no container.
  CTS_EXPECT_ERROR(
      TERN_ERROR_EXECUTABLE_INVALID,
      tern_executable_load(device(0), data_.data(), data_.size() - 1, nullptr, &executable),
      "truncated");
  const char text[] = "this is not an executable, but it is longer than a header........";
  CTS_EXPECT_ERROR(TERN_ERROR_EXECUTABLE_INVALID,
                   tern_executable_load(device(0), text, sizeof(text), nullptr, &executable),
                   "magic");
  EXPECT_EQ(nullptr, executable);
  // Nothing was left loaded: the constants category is empty.
  EXPECT_EQ(0u, MemoryStats(0).used_by_category[TERN_MEMORY_CONSTANTS]);
}

TEST_P(NegativeExecutableTest, LoadFile) {
  tern_executable_t executable = Forge<tern_executable_t>(0x1234);
  TempFile good(data_);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_load_file(device(0), good.path(), nullptr, nullptr),
                   "out_executable");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_executable_load_file(nullptr, good.path(), nullptr, &executable), "device");
  EXPECT_EQ(nullptr, executable);
  executable = Forge<tern_executable_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_load_file(device(0), nullptr, nullptr, &executable),
                   "path is NULL");
  EXPECT_EQ(nullptr, executable);
  CTS_EXPECT_ERROR(
      TERN_ERROR_IO,
      tern_executable_load_file(device(0), "/nonexistent/model.tern", nullptr, &executable),
      "/nonexistent/model.tern");
  CTS_EXPECT_ERROR(TERN_ERROR_IO, tern_executable_load_file(device(0), "", nullptr, &executable));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_load_file(device(0), "/tmp", nullptr, &executable),
                   "not a regular file");
  tern_executable_load_params_t params{};
  params.struct_size = sizeof(params);
  params.flags = 2;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_load_file(device(0), good.path(), &params, &executable),
                   "flags");
  TempFile empty(Bytes{});
  CTS_EXPECT_ERROR(TERN_ERROR_EXECUTABLE_INVALID,
                   tern_executable_load_file(device(0), empty.path(), nullptr, &executable),
                   empty.path());
  Bytes cut(data_.begin(), data_.begin() + data_.size() / 2);
  TempFile truncated(cut);
  CTS_EXPECT_ERROR(TERN_ERROR_EXECUTABLE_INVALID,
                   tern_executable_load_file(device(0), truncated.path(), nullptr, &executable),
                   truncated.path());
  EXPECT_EQ(nullptr, executable);
}

TEST_P(NegativeExecutableTest, Unload) {
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_unload(bad), "executable");
  }
  ExpectQueueUntouchedAndExecutableUsable();
  CTS_ASSERT_OK(tern_executable_unload(executable_));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_unload(executable_), "executable");
}

TEST_P(NegativeExecutableTest, FunctionCount) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_function_count(executable_, nullptr), "out_count");
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    uint32_t count = 7;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_function_count(bad, &count),
                     "executable");
    EXPECT_EQ(0u, count);
  }
}

TEST_P(NegativeExecutableTest, FindFunction) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_function(executable_, "add", nullptr), "out_function");
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    uint32_t function = 7;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_executable_find_function(bad, "add", &function), "executable");
    EXPECT_EQ(0u, function);
  }
  uint32_t function = 7;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_function(executable_, nullptr, &function), "name is NULL");
  EXPECT_EQ(0u, function);
  for (const char* name : {"", "ad", "add ", "ADD", "x", "z"}) {
    SCOPED_TRACE(name);
    function = 7;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_executable_find_function(executable_, name, &function),
                     (std::string("'") + name + "'").c_str(), "'add'");
    EXPECT_EQ(0u, function);
  }
}

TEST_P(NegativeExecutableTest, FindTensor) {
  // The positive cases first: names map to the positions execute binds.
  uint32_t index = 7;
  CTS_ASSERT_OK(tern_executable_find_tensor(executable_, 0, 0, "y", &index));
  EXPECT_EQ(1u, index);
  CTS_ASSERT_OK(tern_executable_find_tensor(executable_, 0, 1, "z", &index));
  EXPECT_EQ(0u, index);

  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_tensor(executable_, 0, 0, "x", nullptr), "out_index");
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    index = 7;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_find_tensor(bad, 0, 0, "x", &index),
                     "executable");
    EXPECT_EQ(0u, index);
  }
  index = 7;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_tensor(executable_, 0, 0, nullptr, &index), "name is NULL");
  EXPECT_EQ(0u, index);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_tensor(executable_, 0, 2, "x", &index), "is_output is 2");
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_executable_find_tensor(executable_, 1, 0, "x", &index), "function 1");
  // An output's name is not an input's, and the other way round.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_tensor(executable_, 0, 0, "z", &index), "'z'", "'x', 'y'");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_find_tensor(executable_, 0, 1, "x", &index), "'x'", "'z'");
  EXPECT_EQ(0u, index);
}

TEST_P(NegativeExecutableTest, FunctionInfo) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_function_info(executable_, 0, nullptr), "out_info");
  tern_function_info_t info;
  for (uint32_t size : TooSmallStructSizes<decltype(info)>()) {
    SCOPED_TRACE(size);
    std::memset(&info, 0, sizeof(info));
    info.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_executable_function_info(executable_, 0, &info), "struct_size");
  }
  std::string kept_stale;
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_function_info(bad, 0, &info),
                     "executable");
    if (info.name != nullptr || info.input_count != 0) kept_stale += " [" + label + "]";
  }
  for (uint32_t function : {1u, 2u, UINT32_MAX}) {
    SCOPED_TRACE(function);
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_executable_function_info(executable_, function, &info),
                     std::to_string(function).c_str(), "1 functions");
    if (info.name != nullptr || info.input_count != 0) {
      kept_stale += " [function " + std::to_string(function) + "]";
    }
  }
  // tern.h: "out_ parameters are set to zero/NULL on entry".
  EXPECT_EQ("", kept_stale) << "out_info kept stale contents after failing for these";
}

TEST_P(NegativeExecutableTest, TensorInfo) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_executable_tensor_info(executable_, 0, 0, 0, nullptr), "out_info");
  tern_tensor_info_t info;
  for (uint32_t size : TooSmallStructSizes<decltype(info)>()) {
    SCOPED_TRACE(size);
    std::memset(&info, 0, sizeof(info));
    info.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_executable_tensor_info(executable_, 0, 0, 0, &info), "struct_size");
  }
  std::string kept_stale;
  auto stale = [&](const tern_tensor_info_t& i) {
    return i.name != nullptr || i.size_bytes != 0 || i.rank != 0 || i.shape[0] != 0;
  };
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_tensor_info(bad, 0, 0, 0, &info),
                     "executable");
    if (stale(info)) kept_stale += " [" + label + "]";
  }
  for (int is_output : {-1, 2, 1000}) {
    SCOPED_TRACE(is_output);
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_executable_tensor_info(executable_, 0, is_output, 0, &info), "is_output");
    if (stale(info)) kept_stale += " [is_output " + std::to_string(is_output) + "]";
  }
  for (uint32_t function : {1u, UINT32_MAX}) {
    SCOPED_TRACE(function);
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_executable_tensor_info(executable_, function, 0, 0, &info),
                     "does not exist");
    if (stale(info)) kept_stale += " [function " + std::to_string(function) + "]";
  }
  struct Case {
    int is_output;
    uint32_t index;
    const char* needle;
  } cases[] = {{0, 2, "has 2 inputs; there is no input 2"},
               {0, UINT32_MAX, "no input 4294967295"},
               {1, 1, "has 1 outputs; there is no output 1"},
               {1, 7, "no output 7"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needle);
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_executable_tensor_info(executable_, 0, c.is_output, c.index, &info),
                     c.needle);
    if (stale(info)) kept_stale += std::string(" [") + c.needle + "]";
  }
  EXPECT_EQ("", kept_stale) << "out_info kept stale contents after failing for these";
}

TEST_P(NegativeExecutableTest, QueueExecuteHandles) {
  const std::vector<std::pair<std::string, tern_queue_t>> bad_queues = {
      {"NULL", nullptr},
      {"an executable handle", Forge<tern_queue_t>(Bits(executable_))},
      {"a buffer handle", Forge<tern_queue_t>(Bits(buffers_[0]))},
      {"forged 0xdeadbeef", Forge<tern_queue_t>(0xdeadbeef)},
      {"forged: live + 1", Forge<tern_queue_t>(Bits(queue_) + 1)}};
  for (const auto& [label, handle] : bad_queues) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    uint64_t sequence = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_execute(bad, executable_, 0, Inputs(), 2, Outputs(), 1, &sequence),
                     "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadExecutables()) {
    SCOPED_TRACE(label);
    tern_executable_t bad = handle;
    uint64_t sequence = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_execute(queue_, bad, 0, Inputs(), 2, Outputs(), 1, &sequence),
                     "executable");
    EXPECT_EQ(0u, sequence);
  }
  // Buffers that are not live buffers, in each binding.
  const std::vector<std::pair<std::string, tern_buffer_t>> bad_buffers = {
      {"an executable handle", Forge<tern_buffer_t>(Bits(executable_))},
      {"a queue handle", Forge<tern_buffer_t>(Bits(queue_))},
      {"forged 0xdeadbeef", Forge<tern_buffer_t>(0xdeadbeef)},
      {"NULL (the tensor is not empty)", nullptr}};
  for (const auto& [label, handle] : bad_buffers) {
    for (int slot = 0; slot < 3; ++slot) {
      SCOPED_TRACE(label + " in slot " + std::to_string(slot));
      tern_binding_t inputs[2] = {{buffers_[0], 0}, {buffers_[1], 0}};
      tern_binding_t outputs[1] = {{buffers_[2], 0}};
      (slot < 2 ? inputs[slot] : outputs[0]).buffer = handle;
      const std::string needle = slot == 0   ? "inputs[0] ('x')"
                                 : slot == 1 ? "inputs[1] ('y')"
                                             : "outputs[0] ('z')";
      CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                       tern_queue_execute(queue_, executable_, 0, inputs, 2, outputs, 1, nullptr),
                       needle.c_str());
    }
  }
  // A freed buffer.
  tern_buffer_t freed = Alloc(0, kTensorBytes);
  CTS_ASSERT_OK(tern_buffer_free(freed));
  tern_binding_t inputs[2] = {{freed, 0}, {buffers_[1], 0}};
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_execute(queue_, executable_, 0, inputs, 2, Outputs(), 1, nullptr),
                   "inputs[0]");
  ExpectQueueUntouchedAndExecutableUsable();
}

TEST_P(NegativeExecutableTest, QueueExecuteBindings) {
  uint64_t sequence = 99;
  for (uint32_t function : {1u, UINT32_MAX}) {
    SCOPED_TRACE(function);
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_queue_execute(queue_, executable_, function, Inputs(), 2, Outputs(), 1, &sequence),
        "does not exist");
    EXPECT_EQ(0u, sequence);
  }
  // Counts that do not match the signature.
  const struct {
    uint32_t inputs, outputs;
  } counts[] = {{0, 1}, {1, 1}, {3, 1}, {2, 0}, {2, 2}, {UINT32_MAX, 1}};
  tern_binding_t many[4] = {{buffers_[0], 0}, {buffers_[1], 0}, {buffers_[2], 0}, {small_, 0}};
  for (const auto& c : counts) {
    SCOPED_TRACE(std::to_string(c.inputs) + " inputs, " + std::to_string(c.outputs) + " outputs");
    CTS_EXPECT_ERROR(
        TERN_ERROR_INVALID_ARGUMENT,
        tern_queue_execute(queue_, executable_, 0, many, c.inputs, many, c.outputs, &sequence),
        "2 inputs and 1 outputs", "bind every input and output");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_execute(queue_, executable_, 0, nullptr, 2, Outputs(), 1, &sequence),
                   "inputs is NULL");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_execute(queue_, executable_, 0, Inputs(), 2, nullptr, 1, &sequence),
                   "outputs is NULL");
  // Ranges that do not hold the tensor: too small, past the end, overflowing.
  const struct {
    const char* label;
    tern_buffer_t buffer;
    uint64_t offset;
  } ranges[] = {{"a buffer half the size", small_, 0},
                {"an offset of 4", buffers_[0], 4},
                {"an offset at the end", buffers_[0], kTensorBytes},
                {"an offset past the end", buffers_[0], kTensorBytes + 64},
                {"an offset of UINT64_MAX", buffers_[0], UINT64_MAX},
                {"an offset of UINT64_MAX - 64", buffers_[0], UINT64_MAX - 64}};
  for (const auto& r : ranges) {
    for (int slot = 0; slot < 3; ++slot) {
      SCOPED_TRACE(std::string(r.label) + " in slot " + std::to_string(slot));
      tern_binding_t inputs[2] = {{buffers_[0], 0}, {buffers_[1], 0}};
      tern_binding_t outputs[1] = {{buffers_[2], 0}};
      (slot < 2 ? inputs[slot] : outputs[0]) = {r.buffer, r.offset};
      CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                       tern_queue_execute(queue_, executable_, 0, inputs, 2, outputs, 1, &sequence),
                       slot == 2   ? "outputs[0] ('z')"
                       : slot == 1 ? "inputs[1] ('y')"
                                   : "inputs[0] ('x')",
                       "128 bytes");
      EXPECT_EQ(0u, sequence);
    }
  }
  // A buffer of another device, and an executable loaded on another device.
  if (device_count() > 1) {
    tern_binding_t inputs[2] = {{buffers_[0], 0}, {remote_, 0}};
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_execute(queue_, executable_, 0, inputs, 2, Outputs(), 1, nullptr),
                     "inputs[1] ('y')", "device 1");
    tern_executable_t remote = nullptr;
    CTS_ASSERT_OK(tern_executable_load(device(1), data_.data(), data_.size(), nullptr, &remote));
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_execute(queue_, remote, 0, Inputs(), 2, Outputs(), 1, nullptr),
                     "loaded on device 1");
    CTS_EXPECT_OK(tern_executable_unload(remote));
  }
  ExpectQueueUntouchedAndExecutableUsable();
}

// After unload, every function refuses the handle, and executions already
// submitted still complete.
TEST_P(NegativeExecutableTest, UseAfterUnload) {
  const std::vector<float> ones(32, 1.0f);
  CTS_ASSERT_OK(tern_buffer_write(buffers_[0], 0, ones.data(), kTensorBytes));
  CTS_ASSERT_OK(tern_buffer_write(buffers_[1], 0, ones.data(), kTensorBytes));
  CTS_ASSERT_OK(tern_queue_execute(queue_, executable_, 0, Inputs(), 2, Outputs(), 1, nullptr));
  CTS_ASSERT_OK(tern_executable_unload(executable_));
  uint32_t count = 7, function = 7;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_function_count(executable_, &count),
                   "executable");
  EXPECT_EQ(0u, count);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_executable_find_function(executable_, "add", &function), "executable");
  EXPECT_EQ(0u, function);
  tern_function_info_t info{};
  info.struct_size = sizeof(info);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_function_info(executable_, 0, &info),
                   "executable");
  tern_tensor_info_t tensor{};
  tensor.struct_size = sizeof(tensor);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_executable_tensor_info(executable_, 0, 0, 0, &tensor), "executable");
  uint64_t sequence = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_execute(queue_, executable_, 0, Inputs(), 2, Outputs(), 1, &sequence),
                   "executable");
  EXPECT_EQ(0u, sequence);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_executable_unload(executable_), "executable");
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<float> result(32);
  CTS_ASSERT_OK(tern_buffer_read(buffers_[2], 0, result.data(), kTensorBytes));
  EXPECT_EQ(std::vector<float>(32, 2.0f), result);
  EXPECT_EQ(0u, MemoryStats(0).used_by_category[TERN_MEMORY_SCRATCH]);
}

CTS_INSTANTIATE(NegativeExecutableTest);

}  // namespace
}  // namespace tern::cts
