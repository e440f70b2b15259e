// The loader refuses sizes no execution could ever get: a function's scratch,
// an input's or output's size beyond the device's memory, or beyond what any
// device can address (docs/executable-format.md, "Size limits"). Without
// these checks such a file loads and fails only when it runs.
#include <gtest/gtest.h>

#include <string>

#include "exe_test_util.h"

namespace {

using exetest::Bytes;
using exetest::LastError;

constexpr uint64_t kAddressableBytes = uint64_t{1} << 48;

class LoaderLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    ASSERT_EQ(tern_device_get(0, &device_), TERN_OK) << LastError();
    tern_device_info_t info{};
    info.struct_size = sizeof(info);
    ASSERT_EQ(tern_device_get_info(device_, &info), TERN_OK) << LastError();
    memory_bytes_ = info.memory_bytes;
    ASSERT_GT(memory_bytes_, 0u);
  }
  void TearDown() override { EXPECT_EQ(tern_shutdown(), TERN_OK) << LastError(); }

  // Loads `data` from memory and from a file, expecting `code` from both;
  // returns the message of the memory load ("" on success).
  std::string Load(const Bytes& data, tern_status_t code) {
    tern_executable_t executable = nullptr;
    const tern_status_t status =
        tern_executable_load(device_, data.data(), data.size(), nullptr, &executable);
    EXPECT_EQ(status, code) << tern_status_string(status) << ": " << LastError();
    const std::string message = status == TERN_OK ? "" : LastError();
    if (status == TERN_OK) {
      EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
    }

    const std::string path = exetest::WriteTemp("limits", data);
    executable = nullptr;
    const tern_status_t from_file =
        tern_executable_load_file(device_, path.c_str(), nullptr, &executable);
    EXPECT_EQ(from_file, code) << LastError();
    if (from_file == TERN_OK) {
      EXPECT_EQ(tern_executable_unload(executable), TERN_OK);
    }
    std::remove(path.c_str());
    return message;
  }

  static Bytes WithScratch(uint64_t bytes) {
    return exetest::EditModule(exetest::BuildAdd(), [bytes](tern::format::ModuleT* m) {
      m->functions[0]->scratch_bytes = bytes;
    });
  }

  tern_device_t device_ = nullptr;
  uint64_t memory_bytes_ = 0;
};

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST_F(LoaderLimitsTest, RefusesScratchNoDeviceCanAddress) {
  const uint64_t scratch = uint64_t{1} << 62;
  const std::string message = Load(WithScratch(scratch), TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "function 'add' (0): scratch_bytes");
  EXPECT_CONTAINS(message, std::to_string(scratch));
  EXPECT_CONTAINS(message, std::to_string(kAddressableBytes));
  EXPECT_CONTAINS(message, "rebuild it");
}

TEST_F(LoaderLimitsTest, RefusesScratchLargerThanTheDevice) {
  const std::string message =
      Load(WithScratch(memory_bytes_ + 1), TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  EXPECT_CONTAINS(message, "scratch_bytes is " + std::to_string(memory_bytes_ + 1));
  EXPECT_CONTAINS(message, std::to_string(memory_bytes_) + " bytes");
  EXPECT_CONTAINS(message, "tern_builder_set_scratch");
  EXPECT_CONTAINS(message, "device with more memory");
}

TEST_F(LoaderLimitsTest, LoadsScratchOfExactlyTheDevicesMemory) {
  Load(WithScratch(memory_bytes_), TERN_OK);
}

TEST_F(LoaderLimitsTest, RefusesAnInputLargerThanTheDevice) {
  // x: [2^40] f32, 4 TiB: consistent (size_bytes matches the shape) but
  // more than the device holds. The instruction reads its first 32 floats.
  const int64_t elements = int64_t{1} << 40;
  const Bytes data = exetest::EditModule(exetest::BuildAdd(), [&](tern::format::ModuleT* m) {
    m->functions[0]->inputs[0]->shape = {elements};
    m->functions[0]->inputs[0]->size_bytes = static_cast<uint64_t>(elements) * 4;
  });
  const std::string message = Load(data, TERN_ERROR_EXECUTABLE_UNSUPPORTED);
  EXPECT_CONTAINS(message, "input 0 'x': size_bytes is " + std::to_string(elements * 4));
  EXPECT_CONTAINS(message, std::to_string(memory_bytes_));
}

TEST_F(LoaderLimitsTest, RefusesAnOutputNoDeviceCanAddress) {
  const int64_t elements = int64_t{1} << 50;
  const Bytes data = exetest::EditModule(exetest::BuildAdd(), [&](tern::format::ModuleT* m) {
    m->functions[0]->outputs[0]->shape = {elements};
    m->functions[0]->outputs[0]->size_bytes = static_cast<uint64_t>(elements) * 4;
  });
  const std::string message = Load(data, TERN_ERROR_EXECUTABLE_INVALID);
  EXPECT_CONTAINS(message, "output 0 'z': size_bytes");
  EXPECT_CONTAINS(message, std::to_string(kAddressableBytes));
}

}  // namespace
