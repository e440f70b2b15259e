#include "exe_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace exetest {
namespace {

template <typename T>
T Get(const Bytes& data, size_t offset) {
  T value;
  std::memcpy(&value, data.data() + offset, sizeof(T));
  return value;
}

template <typename T>
void Put(Bytes* data, size_t offset, T value) {
  std::memcpy(data->data() + offset, &value, sizeof(T));
}

size_t AlignUp(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace

Section* Image::Find(uint32_t kind) {
  for (auto& section : sections) {
    if (section.kind == kind) return &section;
  }
  return nullptr;
}

uint64_t Xxh3(const uint8_t* data, size_t size) { return XXH3_64bits(data, size); }

Image Decode(const Bytes& data) {
  Image image;
  EXPECT_GE(data.size(), 64u);
  if (data.size() < 64) return image;
  EXPECT_EQ(std::memcmp(data.data(), "TERNEXE\0", 8), 0);
  image.major = Get<uint16_t>(data, 8);
  image.minor = Get<uint16_t>(data, 10);
  image.required_features = Get<uint64_t>(data, 40);
  image.optional_features = Get<uint64_t>(data, 48);
  const uint64_t table = Get<uint64_t>(data, 24);
  const uint32_t count = Get<uint32_t>(data, 32);
  const uint32_t entry_size = Get<uint32_t>(data, 36);
  for (uint32_t i = 0; i < count; ++i) {
    const size_t at = table + size_t{i} * entry_size;
    Section section;
    section.kind = Get<uint32_t>(data, at);
    section.flags = Get<uint32_t>(data, at + 4);
    const uint64_t offset = Get<uint64_t>(data, at + 8);
    const uint64_t size = Get<uint64_t>(data, at + 16);
    section.bytes.assign(data.begin() + offset, data.begin() + offset + size);
    image.sections.push_back(std::move(section));
  }
  return image;
}

Bytes Encode(const Image& image) {
  const uint32_t header_size = 64 + image.extra_header_bytes;
  const uint32_t entry_size = 32 + image.extra_entry_bytes;
  const size_t table = AlignUp(header_size, 8);
  const size_t count = image.sections.size();
  size_t cursor = table + count * entry_size;
  std::vector<size_t> offsets;
  for (const auto& section : image.sections) {
    cursor = AlignUp(cursor, section.kind == kConstants ? 4096 : 8);
    offsets.push_back(cursor);
    cursor += section.bytes.size();
  }
  Bytes data(cursor, 0);
  std::memcpy(data.data(), "TERNEXE\0", 8);
  Put<uint16_t>(&data, 8, image.major);
  Put<uint16_t>(&data, 10, image.minor);
  Put<uint32_t>(&data, 12, header_size);
  Put<uint64_t>(&data, 16, data.size());
  Put<uint64_t>(&data, 24, table);
  Put<uint32_t>(&data, 32, static_cast<uint32_t>(count));
  Put<uint32_t>(&data, 36, entry_size);
  Put<uint64_t>(&data, 40, image.required_features);
  Put<uint64_t>(&data, 48, image.optional_features);
  for (size_t i = 0; i < count; ++i) {
    const Section& section = image.sections[i];
    const size_t at = table + i * entry_size;
    Put<uint32_t>(&data, at, section.kind);
    Put<uint32_t>(&data, at + 4, section.flags);
    Put<uint64_t>(&data, at + 8, offsets[i]);
    Put<uint64_t>(&data, at + 16, section.bytes.size());
    Put<uint64_t>(&data, at + 24, Xxh3(section.bytes.data(), section.bytes.size()));
    if (!section.bytes.empty()) {
      std::memcpy(data.data() + offsets[i], section.bytes.data(), section.bytes.size());
    }
  }
  FixHeaderChecksum(&data);
  return data;
}

void FixHeaderChecksum(Bytes* data) {
  const uint32_t header_size = Get<uint32_t>(*data, 12);
  const uint64_t table = Get<uint64_t>(*data, 24);
  uint64_t table_bytes = uint64_t{Get<uint32_t>(*data, 32)} * Get<uint32_t>(*data, 36);
  // A deliberately broken table may reach past the end: hash what exists.
  if (table > data->size()) table_bytes = 0;
  table_bytes =
      std::min<uint64_t>(table_bytes, data->size() - std::min<uint64_t>(table, data->size()));
  Bytes header(data->begin(), data->begin() + header_size);
  std::memset(header.data() + 56, 0, 8);
  const uint64_t seed = Xxh3(header.data(), header.size());
  Put<uint64_t>(data, 56, XXH3_64bits_withSeed(data->data() + table, table_bytes, seed));
}

void FixSectionChecksum(Bytes* data, uint32_t index) {
  const uint64_t table = Get<uint64_t>(*data, 24);
  const size_t at = table + size_t{index} * Get<uint32_t>(*data, 36);
  const uint64_t offset = Get<uint64_t>(*data, at + 8);
  const uint64_t size = Get<uint64_t>(*data, at + 16);
  Put<uint64_t>(data, at + 24, Xxh3(data->data() + offset, size));
  FixHeaderChecksum(data);
}

std::unique_ptr<tern::format::ModuleT> UnpackModule(const Image& image) {
  const Section* section = const_cast<Image&>(image).Find(kModule);
  EXPECT_NE(section, nullptr);
  // Copy to an aligned buffer for reading.
  std::vector<uint64_t> aligned((section->bytes.size() + 7) / 8);
  std::memcpy(aligned.data(), section->bytes.data(), section->bytes.size());
  return std::unique_ptr<tern::format::ModuleT>(
      flatbuffers::GetRoot<tern::format::Module>(aligned.data())->UnPack());
}

void PackModule(const tern::format::ModuleT& module, Image* image) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(tern::format::Module::Pack(fbb, &module));
  image->Find(kModule)->bytes.assign(fbb.GetBufferPointer(),
                                     fbb.GetBufferPointer() + fbb.GetSize());
}

std::unique_ptr<tern::format::DebugInfoT> UnpackDebug(const Image& image) {
  const Section* section = const_cast<Image&>(image).Find(kDebug);
  EXPECT_NE(section, nullptr);
  std::vector<uint64_t> aligned((section->bytes.size() + 7) / 8);
  std::memcpy(aligned.data(), section->bytes.data(), section->bytes.size());
  return std::unique_ptr<tern::format::DebugInfoT>(
      flatbuffers::GetRoot<tern::format::DebugInfo>(aligned.data())->UnPack());
}

void PackDebug(const tern::format::DebugInfoT& debug, Image* image) {
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(tern::format::DebugInfo::Pack(fbb, &debug));
  image->Find(kDebug)->bytes.assign(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

tern_operand_t Tensor(tern_segment_t segment, uint32_t index, tern_dtype_t dtype, uint32_t rank,
                      const int64_t* shape, uint64_t offset) {
  tern_operand_t operand{};
  operand.segment = segment;
  operand.index = index;
  operand.offset = offset;
  operand.dtype = dtype;
  operand.rank = rank;
  operand.shape = shape;
  operand.strides = nullptr;
  return operand;
}

std::string LastError() { return tern_last_error_message(); }

#define EXPECT_TERN_OK(expr) EXPECT_EQ((expr), TERN_OK) << LastError()

namespace {

// Ends `builder`'s open function, destroys the builder and returns the
// executable's bytes.
Bytes EndFunctionAndFinish(tern_builder_t builder) {
  EXPECT_TERN_OK(tern_builder_end_function(builder));
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_TERN_OK(tern_builder_finish(builder, &data, &size));
  Bytes bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  EXPECT_TERN_OK(tern_builder_destroy(builder));
  return bytes;
}

}  // namespace

Bytes BuildAdd(bool y_from_constants) {
  static const int64_t shape[2] = {4, 8};
  tern_builder_t builder = nullptr;
  EXPECT_TERN_OK(tern_builder_create(nullptr, &builder));
  uint64_t constants_offset = 0;
  if (y_from_constants) {
    float values[32];
    for (int i = 0; i < 32; ++i) values[i] = static_cast<float>(i);
    EXPECT_TERN_OK(
        tern_builder_add_constants(builder, values, sizeof(values), 64, &constants_offset));
  }
  uint32_t function = 99, index = 99;
  EXPECT_TERN_OK(tern_builder_begin_function(builder, "add", &function));
  EXPECT_EQ(function, 0u);
  EXPECT_TERN_OK(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, shape, &index));
  EXPECT_EQ(index, 0u);
  if (!y_from_constants) {
    EXPECT_TERN_OK(tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, shape, &index));
    EXPECT_EQ(index, 1u);
  }
  EXPECT_TERN_OK(tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, shape, &index));
  EXPECT_EQ(index, 0u);
  tern_operand_t operands[3] = {
      Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, shape),
      Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, shape),
      y_from_constants
          ? Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 2, shape, constants_offset)
          : Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 2, shape)};
  const int64_t ints[1] = {TERN_BINARY_ADD};
  tern_instruction_t instruction{};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_BINARY;
  instruction.operand_count = 3;
  instruction.operands = operands;
  instruction.int_count = 1;
  instruction.ints = ints;
  instruction.debug_op = "aten::add";
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &instruction));
  return EndFunctionAndFinish(builder);
}

Bytes BuildScanTopk() {
  static const int64_t shape[2] = {4, 8}, top[2] = {4, 3};
  tern_builder_t builder = nullptr;
  EXPECT_TERN_OK(tern_builder_create(nullptr, &builder));
  EXPECT_TERN_OK(tern_builder_begin_function(builder, "order", nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(builder, "cumsum", TERN_DTYPE_F32, 2, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(builder, "values", TERN_DTYPE_F32, 2, top, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(builder, "indices", TERN_DTYPE_I64, 2, top, nullptr));
  tern_operand_t scan_operands[2] = {Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, shape),
                                     Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, shape)};
  const int64_t scan_ints[2] = {TERN_SCAN_SUM, 1};
  tern_instruction_t scan{};
  scan.struct_size = sizeof(scan);
  scan.opcode = TERN_OP_SCAN;
  scan.operand_count = 2;
  scan.operands = scan_operands;
  scan.int_count = 2;
  scan.ints = scan_ints;
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &scan));
  tern_operand_t topk_operands[3] = {Tensor(TERN_SEGMENT_OUTPUT, 1, TERN_DTYPE_F32, 2, top),
                                     Tensor(TERN_SEGMENT_OUTPUT, 2, TERN_DTYPE_I64, 2, top),
                                     Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, shape)};
  const int64_t topk_ints[2] = {1, 1};
  tern_instruction_t topk{};
  topk.struct_size = sizeof(topk);
  topk.opcode = TERN_OP_TOPK;
  topk.operand_count = 3;
  topk.operands = topk_operands;
  topk.int_count = 2;
  topk.ints = topk_ints;
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &topk));
  return EndFunctionAndFinish(builder);
}

Bytes BuildScatter() {
  static const int64_t out_shape[2] = {5, 3}, rows_shape[1] = {4}, src_shape[2] = {4, 3},
                       along_shape[2] = {2, 3};
  tern_builder_t builder = nullptr;
  EXPECT_TERN_OK(tern_builder_create(nullptr, &builder));
  EXPECT_TERN_OK(tern_builder_begin_function(builder, "assign", nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(builder, "rows", TERN_DTYPE_I64, 1, rows_shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(builder, "src", TERN_DTYPE_F32, 2, src_shape, nullptr));
  EXPECT_TERN_OK(
      tern_builder_add_input(builder, "index2", TERN_DTYPE_I64, 2, along_shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(builder, "src2", TERN_DTYPE_F32, 2, along_shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(builder, "y", TERN_DTYPE_F32, 2, out_shape, nullptr));
  const int64_t axis[1] = {0};
  tern_operand_t scatter_operands[3] = {
      Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, out_shape),
      Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_I64, 1, rows_shape),
      Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 2, src_shape)};
  tern_instruction_t scatter{};
  scatter.struct_size = sizeof(scatter);
  scatter.opcode = TERN_OP_SCATTER;
  scatter.operand_count = 3;
  scatter.operands = scatter_operands;
  scatter.int_count = 1;
  scatter.ints = axis;
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &scatter));
  tern_operand_t along_operands[3] = {
      Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, out_shape),
      Tensor(TERN_SEGMENT_INPUT, 2, TERN_DTYPE_I64, 2, along_shape),
      Tensor(TERN_SEGMENT_INPUT, 3, TERN_DTYPE_F32, 2, along_shape)};
  tern_instruction_t along = scatter;
  along.opcode = TERN_OP_SCATTER_ALONG_AXIS;
  along.operands = along_operands;
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &along));
  return EndFunctionAndFinish(builder);
}

Bytes BuildFused() {
  static const int64_t shape[2] = {4, 8}, square[2] = {4, 4};
  tern_builder_t builder = nullptr;
  EXPECT_TERN_OK(tern_builder_create(nullptr, &builder));
  EXPECT_TERN_OK(tern_builder_begin_function(builder, "fused", nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(builder, "w", TERN_DTYPE_F32, 2, square, nullptr));
  tern_operand_t absent{};
  absent.segment = TERN_SEGMENT_NONE;
  tern_operand_t program_operands[6] = {Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, shape),
                                        absent,
                                        absent,
                                        absent,
                                        Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, shape),
                                        Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 2, shape)};
  // r8 = x * y; r9 = 1; r10 = r8 + r9; out0 = r10.
  const int64_t program[] = {3,
                             TERN_STEP_BINARY,
                             TERN_BINARY_MUL,
                             0,
                             1,
                             0,
                             TERN_STEP_CONSTANT,
                             0,
                             0,
                             0,
                             0,
                             TERN_STEP_BINARY,
                             TERN_BINARY_ADD,
                             8,
                             9,
                             0,
                             10,
                             -1,
                             -1,
                             -1};
  const double one[] = {1.0};
  tern_instruction_t fused{};
  fused.struct_size = sizeof(fused);
  fused.opcode = TERN_OP_ELEMENTWISE;
  fused.operand_count = 6;
  fused.operands = program_operands;
  fused.int_count = static_cast<uint32_t>(std::size(program));
  fused.ints = program;
  fused.float_count = 1;
  fused.floats = one;
  fused.debug_op = "mul_add";
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &fused));
  tern_operand_t matmul_operands[3] = {Tensor(TERN_SEGMENT_OUTPUT, 1, TERN_DTYPE_F32, 2, square),
                                       Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, shape),
                                       Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 2, shape)};
  const int64_t transpose_b_relu[3] = {0, 1, TERN_UNARY_RELU};
  tern_instruction_t matmul{};
  matmul.struct_size = sizeof(matmul);
  matmul.opcode = TERN_OP_MATMUL;
  matmul.operand_count = 3;
  matmul.operands = matmul_operands;
  matmul.int_count = 3;
  matmul.ints = transpose_b_relu;
  matmul.debug_op = "linear_relu";
  EXPECT_TERN_OK(tern_builder_add_instruction(builder, &matmul));
  return EndFunctionAndFinish(builder);
}

namespace {

// Writes one function's instructions and the executable around them.
struct ProgramWriter {
  tern_builder_t builder = nullptr;

  void Add(tern_opcode_t opcode, std::vector<tern_operand_t> operands, std::vector<int64_t> ints,
           const char* debug_op = nullptr) {
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = opcode;
    instruction.operand_count = static_cast<uint32_t>(operands.size());
    instruction.operands = operands.data();
    instruction.int_count = static_cast<uint32_t>(ints.size());
    instruction.ints = ints.data();
    instruction.debug_op = debug_op;
    EXPECT_TERN_OK(tern_builder_add_instruction(builder, &instruction));
  }
  void Signal(tern_engine_t engine, int64_t semaphore) {
    Add(TERN_OP_SEM_SIGNAL, {}, {semaphore, 1, engine});
  }
  void Wait(tern_engine_t engine, int64_t semaphore) {
    Add(TERN_OP_SEM_WAIT, {}, {semaphore, 1, engine});
  }
  // Ends the function and returns the executable's bytes.
  Bytes Finish() { return EndFunctionAndFinish(builder); }
};

// A program on 'x' (input, f32 [16]), 'y' (output, f32 [16]) and 64 bytes of
// scratch, made of the instructions `body` adds.
template <typename Body>
Bytes WriteProgram(const char* name, bool allow_races, Body body) {
  static const int64_t shape[1] = {16};
  ProgramWriter writer;
  EXPECT_TERN_OK(tern_builder_create("trn2", &writer.builder));
  if (allow_races) {
    EXPECT_TERN_OK(tern_builder_set_flags(writer.builder, TERN_BUILDER_ALLOW_RACES));
  }
  EXPECT_TERN_OK(tern_builder_begin_function(writer.builder, name, nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(writer.builder, "x", TERN_DTYPE_F32, 1, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_output(writer.builder, "y", TERN_DTYPE_F32, 1, shape, nullptr));
  EXPECT_TERN_OK(tern_builder_set_scratch(writer.builder, 64));
  body(writer);
  return writer.Finish();
}

// A strided f32 view of `count` elements, `stride` apart, from element
// `first` of a segment.
tern_operand_t View(tern_segment_t segment, const int64_t* count, const int64_t* stride,
                    int64_t first) {
  tern_operand_t operand =
      Tensor(segment, 0, TERN_DTYPE_F32, 1, count, static_cast<uint64_t>(first) * 4);
  operand.strides = stride;
  return operand;
}

}  // namespace

Bytes BuildMatmul(int64_t rows, int64_t k, int64_t cols) {
  const int64_t a_shape[2] = {rows, k}, b_shape[2] = {k, cols}, out_shape[2] = {rows, cols};
  ProgramWriter writer;
  EXPECT_TERN_OK(tern_builder_create(nullptr, &writer.builder));
  EXPECT_TERN_OK(tern_builder_begin_function(writer.builder, "matmul", nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(writer.builder, "a", TERN_DTYPE_F32, 2, a_shape, nullptr));
  EXPECT_TERN_OK(tern_builder_add_input(writer.builder, "b", TERN_DTYPE_F32, 2, b_shape, nullptr));
  EXPECT_TERN_OK(
      tern_builder_add_output(writer.builder, "out", TERN_DTYPE_F32, 2, out_shape, nullptr));
  writer.Add(TERN_OP_MATMUL,
             {Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 2, out_shape),
              Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 2, a_shape),
              Tensor(TERN_SEGMENT_INPUT, 1, TERN_DTYPE_F32, 2, b_shape)},
             {});
  return writer.Finish();
}

Bytes BuildPipeline(bool with_semaphore) {
  static const int64_t n16[1] = {16};
  const auto x = Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 1, n16);
  const auto y = Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 1, n16);
  const auto scratch = Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 1, n16);
  return WriteProgram("pipeline", !with_semaphore, [&](ProgramWriter& w) {
    // Vector first in program order: the schedule must still put the copy first.
    if (with_semaphore) w.Wait(TERN_ENGINE_VECTOR, 0);
    w.Add(TERN_OP_BINARY, {y, scratch, scratch}, {TERN_BINARY_ADD}, "model.double");
    w.Add(TERN_OP_COPY, {scratch, x}, {}, "model.stage");
    if (with_semaphore) w.Signal(TERN_ENGINE_DMA, 0);
  });
}

std::vector<HazardProgram> HazardCorpus() {
  static const int64_t n16[1] = {16}, n8[1] = {8}, n5[1] = {5};
  static const int64_t s1[1] = {1}, s2[1] = {2}, s3[1] = {3};
  const auto x = Tensor(TERN_SEGMENT_INPUT, 0, TERN_DTYPE_F32, 1, n16);
  const auto y = Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 1, n16);
  const auto scratch = Tensor(TERN_SEGMENT_SCRATCH, 0, TERN_DTYPE_F32, 1, n16);
  const int64_t add = TERN_BINARY_ADD;
  std::vector<HazardProgram> corpus;
  corpus.push_back({"race_read_after_write", "read-after-write",
                    WriteProgram("raw", true, [&](ProgramWriter& w) {
                      w.Add(TERN_OP_COPY, {scratch, x}, {}, "stage");
                      w.Add(TERN_OP_BINARY, {y, scratch, scratch}, {add}, "double");
                    })});
  corpus.push_back({"race_write_after_read", "write-after-read",
                    WriteProgram("war", true, [&](ProgramWriter& w) {
                      w.Add(TERN_OP_BINARY, {y, scratch, scratch}, {add}, "double");
                      w.Add(TERN_OP_COPY, {scratch, x}, {}, "stage");
                    })});
  corpus.push_back({"race_write_after_write", "write-after-write",
                    WriteProgram("waw", true, [&](ProgramWriter& w) {
                      w.Add(TERN_OP_COPY, {y, x}, {}, "copy");
                      w.Add(TERN_OP_BINARY, {y, x, x}, {add}, "double");
                    })});
  // Even elements written, every third read: elements 0, 6 and 12 are both.
  corpus.push_back(
      {"race_strided_partial", "read-after-write",
       WriteProgram("strided_partial", true, [&](ProgramWriter& w) {
         w.Add(TERN_OP_COPY,
               {View(TERN_SEGMENT_SCRATCH, n8, s2, 0), View(TERN_SEGMENT_INPUT, n8, s1, 0)}, {},
               "evens");
         w.Add(TERN_OP_BINARY,
               {View(TERN_SEGMENT_OUTPUT, n5, s1, 0), View(TERN_SEGMENT_SCRATCH, n5, s3, 0),
                View(TERN_SEGMENT_SCRATCH, n5, s3, 0)},
               {add}, "thirds");
       })});
  // Even elements written, odd ones read: the extents overlap, the bytes do not.
  corpus.push_back(
      {"ordered_strided_interleaved", nullptr,
       WriteProgram("strided_interleaved", false, [&](ProgramWriter& w) {
         w.Add(TERN_OP_COPY,
               {View(TERN_SEGMENT_SCRATCH, n8, s2, 0), View(TERN_SEGMENT_INPUT, n8, s1, 0)}, {},
               "evens");
         w.Add(TERN_OP_BINARY,
               {View(TERN_SEGMENT_OUTPUT, n8, s1, 0), View(TERN_SEGMENT_SCRATCH, n8, s2, 1),
                View(TERN_SEGMENT_SCRATCH, n8, s2, 1)},
               {add}, "odds");
       })});
  // DMA -> scalar -> vector: the vector engine is ordered after the copy only
  // through the scalar engine.
  auto chain = [&](bool broken) {
    return [&, broken](ProgramWriter& w) {
      w.Add(TERN_OP_COPY,
            {View(TERN_SEGMENT_SCRATCH, n8, s1, 0), View(TERN_SEGMENT_INPUT, n8, s1, 0)}, {},
            "stage");
      w.Signal(TERN_ENGINE_DMA, 0);
      if (broken) w.Signal(TERN_ENGINE_SCALAR, 1);
      w.Wait(TERN_ENGINE_SCALAR, 0);
      w.Add(TERN_OP_UNARY,
            {View(TERN_SEGMENT_OUTPUT, n8, s1, 8), View(TERN_SEGMENT_INPUT, n8, s1, 8)},
            {TERN_UNARY_RELU}, "relu");
      if (!broken) w.Signal(TERN_ENGINE_SCALAR, 1);
      w.Wait(TERN_ENGINE_VECTOR, 1);
      w.Add(TERN_OP_BINARY,
            {View(TERN_SEGMENT_OUTPUT, n8, s1, 0), View(TERN_SEGMENT_SCRATCH, n8, s1, 0),
             View(TERN_SEGMENT_SCRATCH, n8, s1, 0)},
            {add}, "double");
    };
  };
  corpus.push_back(
      {"ordered_chain_through_third_engine", nullptr, WriteProgram("chain", false, chain(false))});
  corpus.push_back({"race_chain_signalled_too_early", "read-after-write",
                    WriteProgram("chain_broken", true, chain(true))});
  return corpus;
}

std::string WriteTemp(const std::string& name, const Bytes& data) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/tern-exe-test-" +
                     std::to_string(getpid()) + "-" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

}  // namespace exetest
