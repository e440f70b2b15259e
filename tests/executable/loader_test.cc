// The loader: introspection, every validation rule against crafted files,
// the regression corpus of malformed files, loading from files (constants
// mapped, not copied), unload, and the single-op build+load latency.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "exe_test_util.h"

namespace {

using exetest::Bytes;
using exetest::LastError;

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    ASSERT_EQ(tern_device_get(0, &device_), TERN_OK) << LastError();
  }
  void TearDown() override {
    for (const auto& path : temp_files_) std::remove(path.c_str());
    EXPECT_EQ(tern_shutdown(), TERN_OK) << LastError();
  }

  // Loads `data` from memory, expecting `code`; on success unloads it.
  // Returns the error message.
  std::string ExpectLoad(const Bytes& data, tern_status_t code) {
    tern_executable_t executable = nullptr;
    const tern_status_t status =
        tern_executable_load(device_, data.data(), data.size(), nullptr, &executable);
    EXPECT_EQ(status, code) << tern_status_string(status) << ": " << LastError();
    if (status == TERN_OK) {
      EXPECT_NE(executable, nullptr);
      EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
      return "";
    }
    EXPECT_EQ(executable, nullptr);
    const std::string message = LastError();
    EXPECT_FALSE(message.empty());
    return message;
  }

  std::string Temp(const std::string& name, const Bytes& data) {
    temp_files_.push_back(exetest::WriteTemp(name, data));
    return temp_files_.back();
  }

  tern_memory_stats_t Stats() {
    tern_memory_stats_t stats{};
    stats.struct_size = sizeof(stats);
    EXPECT_EQ(tern_device_memory_stats(device_, &stats), TERN_OK) << LastError();
    return stats;
  }

  tern_device_t device_ = nullptr;
  std::vector<std::string> temp_files_;
};

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// --- Introspection -----------------------------------------------------------

TEST_F(LoaderTest, IntrospectsFunctionsAndTensors) {
  const Bytes data = exetest::BuildAdd();
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, &executable), TERN_OK)
      << LastError();
  uint32_t count = 0;
  ASSERT_EQ(tern_executable_function_count(executable, &count), TERN_OK);
  EXPECT_EQ(count, 1u);
  uint32_t function = 7;
  ASSERT_EQ(tern_executable_find_function(executable, "add", &function), TERN_OK);
  EXPECT_EQ(function, 0u);
  EXPECT_EQ(tern_executable_find_function(executable, "sub", &function),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "'add'");

  tern_function_info_t info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(tern_executable_function_info(executable, 0, &info), TERN_OK);
  EXPECT_STREQ(info.name, "add");
  EXPECT_EQ(info.input_count, 2u);
  EXPECT_EQ(info.output_count, 1u);
  EXPECT_EQ(info.instruction_count, 1u);
  EXPECT_EQ(info.scratch_bytes, 0u);
  EXPECT_EQ(tern_executable_function_info(executable, 1, &info), TERN_ERROR_OUT_OF_RANGE);

  const char* names[] = {"x", "y"};
  for (uint32_t i = 0; i < 3; ++i) {
    const bool output = i == 2;
    tern_tensor_info_t tensor{};
    tensor.struct_size = sizeof(tensor);
    ASSERT_EQ(tern_executable_tensor_info(executable, 0, output, output ? 0 : i, &tensor), TERN_OK);
    EXPECT_STREQ(tensor.name, output ? "z" : names[i]);
    EXPECT_EQ(tensor.dtype, TERN_DTYPE_F32);
    EXPECT_EQ(tensor.rank, 2u);
    EXPECT_EQ(tensor.shape[0], 4);
    EXPECT_EQ(tensor.shape[1], 8);
    EXPECT_EQ(tensor.shape[2], 0);
    EXPECT_EQ(tensor.size_bytes, 128u);
  }
  tern_tensor_info_t tensor{};
  tensor.struct_size = sizeof(tensor);
  EXPECT_EQ(tern_executable_tensor_info(executable, 0, 1, 1, &tensor), TERN_ERROR_OUT_OF_RANGE);
  EXPECT_EQ(tern_executable_tensor_info(executable, 0, 2, 0, &tensor), TERN_ERROR_INVALID_ARGUMENT);
  tensor.struct_size = 4;
  EXPECT_EQ(tern_executable_tensor_info(executable, 0, 0, 0, &tensor), TERN_ERROR_INVALID_ARGUMENT);

  ASSERT_EQ(tern_executable_unload(executable), TERN_OK);
  EXPECT_EQ(tern_executable_unload(executable), TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(tern_executable_function_count(executable, &count), TERN_ERROR_INVALID_HANDLE);
  EXPECT_CONTAINS(LastError(), "executable");
}

TEST_F(LoaderTest, RejectsBadArguments) {
  const Bytes data = exetest::BuildAdd();
  tern_executable_t executable = nullptr;
  EXPECT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, nullptr),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_executable_load(device_, nullptr, 100, nullptr, &executable),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(tern_executable_load(nullptr, data.data(), data.size(), nullptr, &executable),
            TERN_ERROR_INVALID_HANDLE);
  tern_executable_load_params_t params{};
  params.struct_size = sizeof(params);
  params.flags = 2;  // undefined (0x1 is TERN_EXECUTABLE_LOAD_ALLOW_RACES)
  EXPECT_EQ(tern_executable_load(device_, data.data(), data.size(), &params, &executable),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(LastError(), "flags");
  EXPECT_EQ(tern_executable_load_file(device_, "/nonexistent/tern.exe", nullptr, &executable),
            TERN_ERROR_IO);
  EXPECT_CONTAINS(LastError(), "/nonexistent/tern.exe");
  EXPECT_EQ(tern_executable_load_file(device_, "/tmp", nullptr, &executable),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(executable, nullptr);
}

TEST_F(LoaderTest, LoadsFromUnalignedMemory) {
  const Bytes data = exetest::BuildAdd(true);
  Bytes shifted(data.size() + 1);
  std::memcpy(shifted.data() + 1, data.data(), data.size());
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load(device_, shifted.data() + 1, data.size(), nullptr, &executable),
            TERN_OK)
      << LastError();
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

// --- Container rules -----------------------------------------------------------

TEST_F(LoaderTest, RejectsTruncatedData) {
  const Bytes data = exetest::BuildAdd();
  EXPECT_CONTAINS(ExpectLoad(Bytes(data.begin(), data.end() - 1), TERN_ERROR_EXECUTABLE_INVALID),
                  "truncated");
  EXPECT_CONTAINS(ExpectLoad(Bytes(data.begin(), data.begin() + 40), TERN_ERROR_EXECUTABLE_INVALID),
                  "64-byte header");
  EXPECT_CONTAINS(ExpectLoad(Bytes(), TERN_ERROR_EXECUTABLE_INVALID), "0 bytes");
  Bytes longer = data;
  longer.push_back(0);
  EXPECT_CONTAINS(ExpectLoad(longer, TERN_ERROR_EXECUTABLE_INVALID), "trailing");
}

TEST_F(LoaderTest, RejectsBadMagic) {
  Bytes data = exetest::BuildAdd();
  data[0] = 0x7f;
  data[1] = 'E';
  EXPECT_CONTAINS(ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID), "not a tern executable");
}

TEST_F(LoaderTest, RejectsNewerMajorVersion) {
  exetest::Image image = exetest::Decode(exetest::BuildAdd());
  image.major = 2;
  const std::string message = ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  EXPECT_CONTAINS(message, "2.0");
  EXPECT_CONTAINS(message, "newer tern");
  image.major = 0;
  ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_INVALID);
}

TEST_F(LoaderTest, AcceptsNewerMinorVersionWithLongerHeaderAndEntries) {
  exetest::Image image = exetest::Decode(exetest::BuildAdd(true));
  image.minor = 7;
  image.extra_header_bytes = 24;
  image.extra_entry_bytes = 16;
  image.optional_features = 1ull << 9;  // unknown optional features are ignored
  ExpectLoad(exetest::Encode(image), TERN_OK);
}

TEST_F(LoaderTest, RejectsUnknownRequiredFeature) {
  exetest::Image image = exetest::Decode(exetest::BuildAdd());
  image.required_features = (1ull << 6) | (1ull << 40);
  const std::string message = ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  EXPECT_CONTAINS(message, "6, 40");
  EXPECT_CONTAINS(message, "0x10000000040");
}

TEST_F(LoaderTest, FusedInstructionsDeclareTheirFeatures) {
  const Bytes data = exetest::BuildFused();
  exetest::Image image = exetest::Decode(data);
  EXPECT_EQ(image.required_features,
            TERN_FEATURE_ELEMENTWISE_PROGRAMS | TERN_FEATURE_TENSOR_EPILOGUES);
  ExpectLoad(data, TERN_OK);
  // A producer that forgets the bit: the loader names the feature.
  image.required_features = TERN_FEATURE_TENSOR_EPILOGUES;
  const std::string message = ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "elementwise-programs");
  EXPECT_CONTAINS(message, "does not declare it");
  // Files without fused instructions keep the header of tern 1.0: no bits.
  EXPECT_EQ(exetest::Decode(exetest::BuildAdd()).required_features, 0u);
}

TEST_F(LoaderTest, ScanAndSortDeclareTheirFeatures) {
  const Bytes data = exetest::BuildScanTopk();
  exetest::Image image = exetest::Decode(data);
  EXPECT_EQ(image.required_features, TERN_FEATURE_SCAN | TERN_FEATURE_SORT);
  ExpectLoad(data, TERN_OK);
  image.required_features = TERN_FEATURE_SCAN;
  const std::string message = ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "needs the feature sort");
  image.required_features = TERN_FEATURE_SORT;
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_INVALID),
                  "needs the feature scan");
}

TEST_F(LoaderTest, ScatterDeclaresItsFeatureAndRefusesMalformedOperands) {
  const Bytes data = exetest::BuildScatter();
  exetest::Image image = exetest::Decode(data);
  EXPECT_EQ(image.required_features, TERN_FEATURE_SCATTER);
  ExpectLoad(data, TERN_OK);
  image.required_features = 0;
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_INVALID),
                  "needs the feature scatter");
  // Files without the new instructions keep loading with no feature bits.
  EXPECT_EQ(exetest::Decode(exetest::BuildAdd()).required_features, 0u);
  ExpectLoad(exetest::BuildAdd(), TERN_OK);
  // src's rows disagree with the indices.
  const Bytes rows = exetest::EditModule(data, [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[2]->shape = {3, 3};
  });
  std::string message = ExpectLoad(rows, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "instruction 0 (scatter)");
  EXPECT_CONTAINS(message, "src must be [4, 3]");
  // Float indices.
  const Bytes dtype = exetest::EditModule(data, [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[1]->dtype = TERN_DTYPE_F32;
  });
  EXPECT_CONTAINS(ExpectLoad(dtype, TERN_ERROR_EXECUTABLE_INVALID), "i32 or i64");
  // An axis the output does not have; two ints.
  const Bytes axis = exetest::EditModule(data, [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[1]->ints = {2};
  });
  message = ExpectLoad(axis, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "instruction 1 (scatter_along_axis)");
  EXPECT_CONTAINS(message, "axis 2");
  const Bytes ints = exetest::EditModule(data, [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->ints = {0, 0};
  });
  EXPECT_CONTAINS(ExpectLoad(ints, TERN_ERROR_EXECUTABLE_INVALID), "takes 1 int (axis), got 2");
  // Indices wider than the output along a dimension that is not the axis.
  const Bytes wide = exetest::EditModule(data, [](tern::format::ModuleT* m) {
    auto& operands = m->functions[0]->streams[0]->instructions[1]->operands;
    operands[1]->strides = {0, 1};
    operands[1]->shape = {2, 4};
    operands[2]->strides = {0, 1};
    operands[2]->shape = {2, 4};
  });
  EXPECT_CONTAINS(ExpectLoad(wide, TERN_ERROR_EXECUTABLE_INVALID), "exceeds");
}

TEST_F(LoaderTest, DetectsFlippedBytes) {
  const Bytes data = exetest::BuildAdd(true);
  const exetest::Image image = exetest::Decode(data);
  // A header byte no other check reads (optional_features).
  Bytes header = data;
  header[50] ^= 0x01;
  EXPECT_CONTAINS(ExpectLoad(header, TERN_ERROR_EXECUTABLE_CHECKSUM), "header");
  // The last byte of the file: in the constants.
  Bytes constants = data;
  constants.back() ^= 0x80;
  EXPECT_CONTAINS(ExpectLoad(constants, TERN_ERROR_EXECUTABLE_CHECKSUM), "constants");
  // Every byte of the module section.
  uint64_t table = 0, module_offset = 0;
  std::memcpy(&table, data.data() + 24, 8);
  std::memcpy(&module_offset, data.data() + table + 8, 8);
  const size_t module_size = image.sections[0].bytes.size();
  ASSERT_EQ(image.sections[0].kind, exetest::kModule);
  for (size_t i = 0; i < module_size; i += 7) {
    Bytes flipped = data;
    flipped[module_offset + i] ^= 0x10;
    tern_executable_t executable = nullptr;
    ASSERT_EQ(tern_executable_load(device_, flipped.data(), flipped.size(), nullptr, &executable),
              TERN_ERROR_EXECUTABLE_CHECKSUM)
        << "byte " << i;
  }
}

TEST_F(LoaderTest, SkipsUnknownOptionalSectionsOnly) {
  exetest::Image image = exetest::Decode(exetest::BuildAdd());
  image.sections.push_back({77, exetest::kOptional, Bytes(100, 0xab)});
  ExpectLoad(exetest::Encode(image), TERN_OK);
  image.sections.back().flags = 0;
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_UNSUPPORTED), "kind 77");
}

TEST_F(LoaderTest, RejectsBadSectionTables) {
  exetest::Image image = exetest::Decode(exetest::BuildAdd());
  // Two module sections.
  exetest::Image twice = image;
  twice.sections.push_back(twice.sections[0]);
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(twice), TERN_ERROR_EXECUTABLE_INVALID),
                  "more than one module");
  // No module section.
  exetest::Image none = image;
  none.sections.erase(none.sections.begin());
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(none), TERN_ERROR_EXECUTABLE_INVALID), "no module");
  // A section that overlaps another (same offset), checksums fixed up.
  Bytes data = exetest::Encode(image);
  uint64_t table = 0;
  std::memcpy(&table, data.data() + 24, 8);
  uint64_t module_offset = 0;
  std::memcpy(&module_offset, data.data() + table + 8, 8);
  std::memcpy(data.data() + table + 32 + 8, &module_offset, 8);  // debug at module's offset
  exetest::FixSectionChecksum(&data, 1);
  EXPECT_CONTAINS(ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID), "overlaps");
  // A section past the end of the file.
  data = exetest::Encode(image);
  const uint64_t huge = data.size();
  std::memcpy(data.data() + table + 32 + 16, &huge, 8);
  exetest::FixHeaderChecksum(&data);
  EXPECT_CONTAINS(ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID), "section 1");
  // A module section that is not a FlatBuffer.
  exetest::Image garbage = image;
  garbage.sections[0].bytes.assign(256, 0xff);
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(garbage), TERN_ERROR_EXECUTABLE_INVALID),
                  "FlatBuffers");
}

TEST_F(LoaderTest, RejectsConstantsSizeMismatch) {
  const Bytes data = exetest::BuildAdd(true);
  exetest::Image image = exetest::Decode(data);
  image.Find(exetest::kConstants)->bytes.resize(64);
  EXPECT_CONTAINS(ExpectLoad(exetest::Encode(image), TERN_ERROR_EXECUTABLE_INVALID),
                  "constants section has 64");
}

// --- Module rules -------------------------------------------------------------------

TEST_F(LoaderTest, RejectsOtherTargets) {
  const Bytes data = exetest::EditModule(exetest::BuildAdd(),
                                         [](tern::format::ModuleT* m) { m->target = "trn9"; });
  EXPECT_CONTAINS(ExpectLoad(data, TERN_ERROR_EXECUTABLE_UNSUPPORTED), "'trn9'");
}

TEST_F(LoaderTest, RejectsOperandOutsideItsSegment) {
  const Bytes data = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[1]->offset = 4;
  });
  const std::string message = ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "function 'add'");
  EXPECT_CONTAINS(message, "instruction 0 (binary)");
  EXPECT_CONTAINS(message, "operand 1 (input 0 'x')");
  EXPECT_CONTAINS(message, "[4, 132)");
  EXPECT_CONTAINS(message, "128 bytes");

  // Strides that reach past the end.
  const Bytes strided = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[2]->strides = {16, 1};
  });
  EXPECT_CONTAINS(ExpectLoad(strided, TERN_ERROR_EXECUTABLE_INVALID), "input 1 'y'");

  // Constants beyond the constants segment.
  const Bytes constants =
      exetest::EditModule(exetest::BuildAdd(true), [](tern::format::ModuleT* m) {
        m->functions[0]->streams[0]->instructions[0]->operands[2]->offset = 64;
      });
  EXPECT_CONTAINS(ExpectLoad(constants, TERN_ERROR_EXECUTABLE_INVALID),
                  "the constants is only 128");

  // Scratch that the function does not have.
  const Bytes scratch = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[0]->segment = TERN_SEGMENT_SCRATCH;
    m->functions[0]->streams[0]->instructions[0]->operands[0]->index = 0;
  });
  EXPECT_CONTAINS(ExpectLoad(scratch, TERN_ERROR_EXECUTABLE_INVALID), "scratch is only 0");

  // An input index the function does not have.
  const Bytes index = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[1]->index = 5;
  });
  EXPECT_CONTAINS(ExpectLoad(index, TERN_ERROR_EXECUTABLE_INVALID), "names input 5");

  // Writing the constants.
  const Bytes write = exetest::EditModule(exetest::BuildAdd(true), [](tern::format::ModuleT* m) {
    auto& operands = m->functions[0]->streams[0]->instructions[0]->operands;
    operands[0]->segment = TERN_SEGMENT_CONSTANT;
    operands[0]->index = 0;
  });
  EXPECT_CONTAINS(ExpectLoad(write, TERN_ERROR_EXECUTABLE_INVALID), "constants segment");
}

TEST_F(LoaderTest, RejectsBadShapesAndSignatures) {
  // Operand shapes that disagree (the ISA rules).
  const Bytes shapes = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[2]->shape = {2, 8};
  });
  EXPECT_CONTAINS(ExpectLoad(shapes, TERN_ERROR_EXECUTABLE_INVALID), "instruction 0 (binary)");
  // Rank above the maximum.
  const Bytes rank = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[1]->shape.assign(9, 1);
  });
  EXPECT_CONTAINS(ExpectLoad(rank, TERN_ERROR_EXECUTABLE_INVALID), "rank 9");
  // Wrong number of strides.
  const Bytes strides = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->operands[1]->strides = {1};
  });
  EXPECT_CONTAINS(ExpectLoad(strides, TERN_ERROR_EXECUTABLE_INVALID), "1 strides for rank 2");
  // size_bytes inconsistent with the shape.
  const Bytes size = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->inputs[0]->size_bytes = 256;
  });
  EXPECT_CONTAINS(ExpectLoad(size, TERN_ERROR_EXECUTABLE_INVALID),
                  "size_bytes is 256 instead of 128");
  // A negative dimension.
  const Bytes negative = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->inputs[0]->shape = {-4, -8};
    m->functions[0]->inputs[0]->size_bytes = 128;
  });
  EXPECT_CONTAINS(ExpectLoad(negative, TERN_ERROR_EXECUTABLE_INVALID), "dimension 0 is -4");
  // A dtype from the future.
  const Bytes dtype = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->outputs[0]->dtype = 42;
  });
  EXPECT_CONTAINS(ExpectLoad(dtype, TERN_ERROR_EXECUTABLE_UNSUPPORTED), "dtype 42");
  // Overflowing sizes.
  const Bytes overflow = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->inputs[0]->shape = {1ll << 40, 1ll << 40};
  });
  EXPECT_CONTAINS(ExpectLoad(overflow, TERN_ERROR_EXECUTABLE_INVALID), "overflows");
}

TEST_F(LoaderTest, RejectsDuplicateAndMissingNames) {
  const Bytes tensors = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->outputs[0]->name = "x";
  });
  EXPECT_CONTAINS(ExpectLoad(tensors, TERN_ERROR_EXECUTABLE_INVALID), "named 'x'");
  const Bytes functions = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions.push_back(std::make_unique<tern::format::FunctionT>(*m->functions[0]));
  });
  EXPECT_CONTAINS(ExpectLoad(functions, TERN_ERROR_EXECUTABLE_INVALID), "named 'add'");
  const Bytes unnamed = exetest::EditModule(
      exetest::BuildAdd(), [](tern::format::ModuleT* m) { m->functions[0]->name.clear(); });
  EXPECT_CONTAINS(ExpectLoad(unnamed, TERN_ERROR_EXECUTABLE_INVALID), "no name");
}

TEST_F(LoaderTest, RejectsUnknownOpcodeNamingIt) {
  const Bytes data = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->opcode = 0x0399;
  });
  const std::string message = ExpectLoad(data, TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  EXPECT_CONTAINS(message, "0x0399");
  EXPECT_CONTAINS(message, "instruction 0");
}

TEST_F(LoaderTest, RejectsInstructionsInTheWrongStream) {
  const Bytes engine = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->engine = TERN_ENGINE_SCALAR;
  });
  EXPECT_CONTAINS(ExpectLoad(engine, TERN_ERROR_EXECUTABLE_INVALID), "runs on the vector engine");
  const Bytes sync = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->engine = TERN_ENGINE_SYNC;
  });
  EXPECT_CONTAINS(ExpectLoad(sync, TERN_ERROR_EXECUTABLE_INVALID), "has no stream");
  const Bytes future = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->engine = 12;
  });
  EXPECT_CONTAINS(ExpectLoad(future, TERN_ERROR_EXECUTABLE_UNSUPPORTED), "engine 12");
  const Bytes twice = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    auto& streams = m->functions[0]->streams;
    streams.push_back(std::make_unique<tern::format::StreamT>(*streams[0]));
  });
  EXPECT_CONTAINS(ExpectLoad(twice, TERN_ERROR_EXECUTABLE_INVALID), "more than one stream");
  const Bytes core = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->core = 1000;
  });
  EXPECT_CONTAINS(ExpectLoad(core, TERN_ERROR_EXECUTABLE_INVALID), "core 1000");
}

TEST_F(LoaderTest, RejectsDeadlockingSemaphores) {
  const Bytes good = exetest::BuildPipeline();
  ExpectLoad(good, TERN_OK);
  // The wait asks for 2 but only one signal of 1 exists.
  const Bytes data = exetest::EditModule(good, [](tern::format::ModuleT* m) {
    for (auto& stream : m->functions[0]->streams) {
      for (auto& instruction : stream->instructions) {
        if (instruction->opcode == TERN_OP_SEM_WAIT) instruction->ints[1] = 2;
      }
    }
  });
  const std::string message = ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "function 'pipeline'");
  EXPECT_CONTAINS(message, "deadlock");
  EXPECT_CONTAINS(message, "vector engine of core 0 at instruction 0");
  EXPECT_CONTAINS(message, "semaphore 0 to reach 2, but it only ever reaches 1");

  // Two streams waiting on each other.
  const Bytes cycle = exetest::EditModule(good, [](tern::format::ModuleT* m) {
    for (auto& stream : m->functions[0]->streams) {
      if (stream->engine != TERN_ENGINE_DMA) continue;
      auto wait = std::make_unique<tern::format::InstructionT>();
      wait->opcode = TERN_OP_SEM_WAIT;
      wait->ints = {1, 1};
      stream->instructions.insert(stream->instructions.begin(), std::move(wait));
    }
    for (auto& stream : m->functions[0]->streams) {
      if (stream->engine != TERN_ENGINE_VECTOR) continue;
      auto signal = std::make_unique<tern::format::InstructionT>();
      signal->opcode = TERN_OP_SEM_SIGNAL;
      signal->ints = {1, 1};
      stream->instructions.push_back(std::move(signal));
    }
  });
  const std::string cycle_message = ExpectLoad(cycle, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(cycle_message, "dma engine of core 0 at instruction 0 waits for semaphore 1");
  EXPECT_CONTAINS(cycle_message, "vector engine of core 0 at instruction 0 waits for semaphore 0");
}

TEST_F(LoaderTest, RejectsBadSyncParameters) {
  const Bytes data = exetest::EditModule(exetest::BuildPipeline(), [](tern::format::ModuleT* m) {
    for (auto& stream : m->functions[0]->streams) {
      for (auto& instruction : stream->instructions) {
        if (instruction->opcode == TERN_OP_SEM_SIGNAL) instruction->ints[0] = 100000;
      }
    }
  });
  EXPECT_CONTAINS(ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID), "semaphore 100000");
}

// The builder takes sync instructions as [semaphore, value, engine] and
// files hold [semaphore, value] in that engine's stream (isa.h, docs/isa.md).
TEST_F(LoaderTest, SyncInstructionsHoldTwoIntsInTheirEnginesStream) {
  const Bytes data = exetest::BuildPipeline();
  const auto module = exetest::UnpackModule(exetest::Decode(data));
  int found = 0;
  for (const auto& stream : module->functions[0]->streams) {
    for (const auto& instruction : stream->instructions) {
      if (instruction->opcode == TERN_OP_SEM_SIGNAL) {
        EXPECT_EQ(stream->engine, TERN_ENGINE_DMA);
        EXPECT_EQ(instruction->ints, (std::vector<int64_t>{0, 1}));
        ++found;
      } else if (instruction->opcode == TERN_OP_SEM_WAIT) {
        EXPECT_EQ(stream->engine, TERN_ENGINE_VECTOR);
        EXPECT_EQ(instruction->ints, (std::vector<int64_t>{0, 1}));
        ++found;
      }
    }
  }
  EXPECT_EQ(found, 2);
  // A file that carries the builder's third int is malformed.
  const Bytes three = exetest::EditModule(data, [](tern::format::ModuleT* m) {
    for (auto& stream : m->functions[0]->streams) {
      for (auto& instruction : stream->instructions) {
        if (instruction->opcode == TERN_OP_SEM_WAIT)
          instruction->ints.push_back(TERN_ENGINE_VECTOR);
      }
    }
  });
  const std::string message = ExpectLoad(three, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "sem_wait");
  EXPECT_CONTAINS(message, "takes 2 ints");
}

TEST_F(LoaderTest, RejectsDebugIndexOutOfRange) {
  const Bytes data = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->debug_op = 1;
  });
  EXPECT_CONTAINS(ExpectLoad(data, TERN_ERROR_EXECUTABLE_INVALID),
                  "debug op index 1 is out of range");
  const Bytes negative = exetest::EditModule(exetest::BuildAdd(), [](tern::format::ModuleT* m) {
    m->functions[0]->streams[0]->instructions[0]->debug_op = -5;
  });
  EXPECT_CONTAINS(ExpectLoad(negative, TERN_ERROR_EXECUTABLE_INVALID), "-5");
  // A stripped file (no debug section) is fine: debug indices are ignored.
  exetest::Image image = exetest::Decode(exetest::BuildAdd());
  image.sections.erase(image.sections.begin() + 1);
  ASSERT_EQ(image.sections.size(), 1u);
  ExpectLoad(exetest::Encode(image), TERN_OK);
}

// --- The checked-in regression corpus -------------------------------------------

// The race corpus (exe_test_util.h): each racy program is refused with the
// kind of its race named, each ordered one loads; also with the flag that
// loads racy ones.
TEST_F(LoaderTest, RefusesEachRaceOfTheCorpusAndLoadsItsOrderedPrograms) {
  const auto corpus = exetest::HazardCorpus();
  ASSERT_GE(corpus.size(), 7u);
  tern_executable_load_params_t allow{};
  allow.struct_size = sizeof(allow);
  allow.flags = TERN_EXECUTABLE_LOAD_ALLOW_RACES;
  for (const auto& program : corpus) {
    tern_executable_t executable = nullptr;
    const tern_status_t status = tern_executable_load(device_, program.bytes.data(),
                                                      program.bytes.size(), nullptr, &executable);
    if (program.race == nullptr) {
      EXPECT_EQ(status, TERN_OK) << program.name << ": " << LastError();
    } else {
      EXPECT_EQ(status, TERN_ERROR_EXECUTABLE_INVALID) << program.name;
      EXPECT_CONTAINS(LastError(), "its engine streams race");
      EXPECT_CONTAINS(LastError(), std::string(program.race) + " race");
    }
    if (status == TERN_OK) {
      EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
    }
    ASSERT_EQ(tern_executable_load(device_, program.bytes.data(), program.bytes.size(), &allow,
                                   &executable),
              TERN_OK)
        << program.name << ": " << LastError();
    EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
  }
}

TEST_F(LoaderTest, RejectsEveryFileOfTheRegressionCorpus) {
  const std::string dir = TERN_EXE_CORPUS_DIR;
  DIR* handle = opendir(dir.c_str());
  ASSERT_NE(handle, nullptr) << dir;
  std::vector<std::string> names;
  while (dirent* entry = readdir(handle)) {
    const std::string name = entry->d_name;
    if (name.size() > 4 && name.substr(name.size() - 4) == ".bin") names.push_back(name);
  }
  closedir(handle);
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 20u);
  for (const std::string& name : names) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    const Bytes data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Names end in ".<code>.bin": the status the loader must return.
    const size_t dot = name.rfind('.', name.size() - 5);
    ASSERT_NE(dot, std::string::npos) << name;
    const int expected = std::stoi(name.substr(dot + 1));
    tern_executable_t executable = nullptr;
    const tern_status_t status =
        tern_executable_load(device_, data.data(), data.size(), nullptr, &executable);
    EXPECT_EQ(status, expected) << name << ": " << LastError();
    if (status == TERN_OK) {
      tern_executable_unload(executable);
    } else {
      EXPECT_FALSE(LastError().empty()) << name;
    }
    // And through a file (the mapped path).
    const std::string path = Temp("corpus.bin", data);
    EXPECT_EQ(tern_executable_load_file(device_, path.c_str(), nullptr, &executable), expected)
        << name << ": " << LastError();
    if (expected == TERN_OK) tern_executable_unload(executable);
  }
}

// --- Files, memory and unload ---------------------------------------------------

uint64_t ProcStatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  }
  return 0;
}

bool Mapped(const std::string& path) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(path) != std::string::npos) return true;
  }
  return false;
}

// Builds "copy": out = the constants (f32). With `path`, writes the file
// with tern_builder_write_file() and returns nothing.
Bytes BuildWithConstants(uint64_t bytes, const std::string& path = "") {
  std::vector<uint8_t> constants(bytes);
  for (uint64_t i = 0; i < bytes; i += 64) constants[i] = static_cast<uint8_t>(i * 31 + 7);
  tern_builder_t builder = nullptr;
  EXPECT_EQ(tern_builder_create(nullptr, &builder), TERN_OK);
  uint64_t offset = 0;
  EXPECT_EQ(tern_builder_add_constants(builder, constants.data(), bytes, 4096, &offset), TERN_OK);
  const int64_t shape[1] = {static_cast<int64_t>(bytes / 4)};
  EXPECT_EQ(tern_builder_begin_function(builder, "copy", nullptr), TERN_OK);
  EXPECT_EQ(tern_builder_add_output(builder, "out", TERN_DTYPE_F32, 1, shape, nullptr), TERN_OK);
  tern_operand_t operands[2] = {
      exetest::Tensor(TERN_SEGMENT_OUTPUT, 0, TERN_DTYPE_F32, 1, shape),
      exetest::Tensor(TERN_SEGMENT_CONSTANT, 0, TERN_DTYPE_F32, 1, shape, offset)};
  tern_instruction_t instruction{};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_COPY;
  instruction.operand_count = 2;
  instruction.operands = operands;
  EXPECT_EQ(tern_builder_add_instruction(builder, &instruction), TERN_OK) << LastError();
  EXPECT_EQ(tern_builder_end_function(builder), TERN_OK);
  if (!path.empty()) {
    EXPECT_EQ(tern_builder_write_file(builder, path.c_str()), TERN_OK) << LastError();
    tern_builder_destroy(builder);
    return {};
  }
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(tern_builder_finish(builder, &data, &size), TERN_OK);
  Bytes result(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  tern_builder_destroy(builder);
  return result;
}

TEST_F(LoaderTest, LoadFromFileMapsConstantsInsteadOfCopying) {
  constexpr uint64_t kConstants = 32ull << 20;
  const std::string path = Temp("mapped.bin", BuildWithConstants(kConstants));
  const tern_memory_stats_t before = Stats();
  const uint64_t anon_before = ProcStatusKb("RssAnon:");
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load_file(device_, path.c_str(), nullptr, &executable), TERN_OK)
      << LastError();
  const uint64_t anon_after = ProcStatusKb("RssAnon:");
  // Validation read every byte (checksums), yet no anonymous copy was made.
  EXPECT_LT(anon_after, anon_before + (kConstants >> 10) / 4)
      << "RssAnon grew from " << anon_before << " kB to " << anon_after << " kB";
  EXPECT_TRUE(Mapped(path)) << "the constants should be used in place from a mapping of " << path;
  // Still charged to the device as constants.
  const tern_memory_stats_t loaded = Stats();
  EXPECT_EQ(loaded.used_by_category[TERN_MEMORY_CONSTANTS],
            before.used_by_category[TERN_MEMORY_CONSTANTS] + kConstants);
  EXPECT_EQ(loaded.node_used_by_category[TERN_MEMORY_CONSTANTS],
            before.node_used_by_category[TERN_MEMORY_CONSTANTS] + kConstants);
  EXPECT_EQ(loaded.used_bytes, before.used_bytes + kConstants);

  ASSERT_EQ(tern_executable_unload(executable), TERN_OK);
  EXPECT_FALSE(Mapped(path));
  const tern_memory_stats_t after = Stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.used_by_category[TERN_MEMORY_CONSTANTS],
            before.used_by_category[TERN_MEMORY_CONSTANTS]);
  EXPECT_EQ(after.node_used_bytes, before.node_used_bytes);
}

TEST_F(LoaderTest, FileWithoutConstantsIsNotKeptMapped) {
  const std::string path = Temp("small.bin", exetest::BuildAdd());
  tern_executable_t executable = nullptr;
  ASSERT_EQ(tern_executable_load_file(device_, path.c_str(), nullptr, &executable), TERN_OK)
      << LastError();
  EXPECT_FALSE(Mapped(path));
  EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
}

TEST_F(LoaderTest, UnloadFreesDeviceMemory) {
  const Bytes data = BuildWithConstants(1 << 20);
  const tern_memory_stats_t before = Stats();
  std::vector<tern_executable_t> executables(4);
  for (auto& executable : executables) {
    ASSERT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, &executable),
              TERN_OK)
        << LastError();
  }
  const tern_memory_stats_t loaded = Stats();
  EXPECT_EQ(loaded.used_by_category[TERN_MEMORY_CONSTANTS],
            before.used_by_category[TERN_MEMORY_CONSTANTS] + 4 * (1 << 20));
  EXPECT_EQ(loaded.allocation_count, before.allocation_count + 4);
  for (auto& executable : executables) ASSERT_EQ(tern_executable_unload(executable), TERN_OK);
  const tern_memory_stats_t after = Stats();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.allocation_count, before.allocation_count);
  EXPECT_EQ(after.node_used_bytes, before.node_used_bytes);
  for (int c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) {
    EXPECT_EQ(after.used_by_category[c], before.used_by_category[c]) << c;
  }
}

TEST_F(LoaderTest, ConstantsThatDoNotFitAreOutOfMemory) {
  // 256 MiB devices: with 224 MiB of tensors allocated, 64 MiB of constants
  // cannot be charged.
  tern_buffer_params_t params{};
  params.struct_size = sizeof(params);
  params.size = 224ull << 20;
  params.category = TERN_MEMORY_TENSORS;
  tern_buffer_t filler = nullptr;
  ASSERT_EQ(tern_buffer_alloc(device_, &params, &filler), TERN_OK) << LastError();
  const std::string path = Temp("big.bin", {});
  BuildWithConstants(64ull << 20, path);
  const tern_memory_stats_t before = Stats();
  tern_executable_t executable = nullptr;
  EXPECT_EQ(tern_executable_load_file(device_, path.c_str(), nullptr, &executable),
            TERN_ERROR_OUT_OF_MEMORY);
  EXPECT_CONTAINS(LastError(), "constants");
  EXPECT_FALSE(Mapped(path));
  EXPECT_EQ(Stats().used_bytes, before.used_bytes);
  // From memory too: the device allocation fails the same way.
  std::ifstream in(path, std::ios::binary);
  const Bytes data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, &executable),
            TERN_ERROR_OUT_OF_MEMORY);
  EXPECT_CONTAINS(LastError(), "constants");
  EXPECT_EQ(Stats().used_bytes, before.used_bytes);
  EXPECT_EQ(tern_buffer_free(filler), TERN_OK);
}

TEST_F(LoaderTest, ShutdownWithLoadedExecutablesFreesThem) {
  const Bytes data = BuildWithConstants(1 << 20);
  const std::string path = Temp("shutdown.bin", data);
  tern_executable_t a = nullptr, b = nullptr;
  ASSERT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, &a), TERN_OK);
  ASSERT_EQ(tern_executable_load_file(device_, path.c_str(), nullptr, &b), TERN_OK);
  ASSERT_EQ(tern_shutdown(), TERN_OK);
  EXPECT_FALSE(Mapped(path));
  ASSERT_EQ(tern_init(nullptr), TERN_OK);
  ASSERT_EQ(tern_device_get(0, &device_), TERN_OK);
  EXPECT_EQ(tern_executable_unload(a), TERN_ERROR_INVALID_HANDLE);
  EXPECT_EQ(Stats().used_by_category[TERN_MEMORY_CONSTANTS], 0u);
}

// --- Latency -------------------------------------------------------------------------

TEST_F(LoaderTest, SingleOpBuildAndLoadLatency) {
  // Measured, printed, not asserted (the target is <= 50 us; sanitizers and
  // loaded CI machines make timing assertions flaky).
  const int iterations = 2000;
  std::vector<double> samples;
  samples.reserve(iterations);
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const Bytes data = exetest::BuildAdd();
    tern_executable_t executable = nullptr;
    ASSERT_EQ(tern_executable_load(device_, data.data(), data.size(), nullptr, &executable),
              TERN_OK);
    const auto end = std::chrono::steady_clock::now();
    ASSERT_EQ(tern_executable_unload(executable), TERN_OK);
    samples.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  std::sort(samples.begin(), samples.end());
  std::printf("single-op build+load: median %.1f us, p90 %.1f us over %d (target <= 50 us)\n",
              samples[samples.size() / 2], samples[samples.size() * 9 / 10], iterations);
}

}  // namespace
