// Streaming stores for large kernel outputs (driver_shim/sim/engines/
// streaming_stores.h): exact copies at every alignment, the machine's
// threshold, and elementwise kernels giving the same bits whether their
// output is streamed or stored through the cache.
#include "driver_shim/sim/engines/streaming_stores.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

using sim::kernels::LastLevelCacheBytes;
using sim::kernels::SetStreamingThresholdForTesting;
using sim::kernels::ShouldStreamOutput;
using sim::kernels::StoreStreaming;

// Streams every output of at least `bytes` while it lives.
class StreamingThreshold {
 public:
  explicit StreamingThreshold(int64_t bytes) { SetStreamingThresholdForTesting(bytes); }
  ~StreamingThreshold() { SetStreamingThresholdForTesting(0); }
  StreamingThreshold(const StreamingThreshold&) = delete;
  StreamingThreshold& operator=(const StreamingThreshold&) = delete;
};

TEST(StreamingStoresTest, CopiesExactlyAtEveryAlignment) {
  constexpr int64_t kGuard = 32;
  std::vector<float> src(1100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 7.0f;
  for (int64_t shift = 0; shift < 17; ++shift) {
    for (int64_t n : {0, 1, 3, 4, 15, 16, 17, 31, 33, 100, 1024}) {
      alignas(64) float dst[1100 + 2 * kGuard + 17];
      std::fill(std::begin(dst), std::end(dst), -1.0f);
      float* out = dst + kGuard + shift;
      StoreStreaming(out, src.data(), n);
      sim::kernels::StreamingStoresDone();
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], src[i]) << "shift " << shift << " n " << n << " at " << i;
      }
      // Nothing outside [out, out + n) was written.
      for (float* p = dst; p < out; ++p) ASSERT_EQ(*p, -1.0f) << "shift " << shift << " n " << n;
      for (float* p = out + n; p < std::end(dst); ++p) {
        ASSERT_EQ(*p, -1.0f) << "shift " << shift << " n " << n;
      }
    }
  }
}

TEST(StreamingStoresTest, OutputsFromTheLastLevelCacheSizeStream) {
  const int64_t cache = LastLevelCacheBytes();
  if (cache <= 0) {
    EXPECT_FALSE(ShouldStreamOutput(std::numeric_limits<int64_t>::max()));
    GTEST_SKIP() << "this machine does not report its last-level cache";
  }
  EXPECT_TRUE(ShouldStreamOutput(cache));
  EXPECT_FALSE(ShouldStreamOutput(cache - 1));
  EXPECT_FALSE(ShouldStreamOutput(4096));
  {
    StreamingThreshold everything(1);
    EXPECT_TRUE(ShouldStreamOutput(4));
  }
  EXPECT_FALSE(ShouldStreamOutput(4096));
}

// The same instruction with its output streamed and cached: equal bits.
void ExpectSameBitsStreamed(uint32_t opcode, std::vector<Tensor*> operands,
                            std::vector<int64_t> ints, const std::string& what) {
  Tensor& out = *operands[0];
  out.Poison(0x11);
  std::vector<uint8_t> before_inputs;
  for (size_t i = 1; i < operands.size(); ++i) {
    before_inputs.insert(before_inputs.end(), operands[i]->data(),
                         operands[i]->data() + operands[i]->storage_bytes());
  }
  ASSERT_TRUE(Exec(opcode, operands, ints).ok()) << what;
  const std::vector<uint8_t> cached(out.data(), out.data() + out.storage_bytes());
  // Restore the inputs (in place, the output was one of them) and run again.
  size_t at = 0;
  for (size_t i = 1; i < operands.size(); ++i) {
    std::memcpy(operands[i]->data(), before_inputs.data() + at, operands[i]->storage_bytes());
    at += operands[i]->storage_bytes();
  }
  if (std::find(operands.begin() + 1, operands.end(), &out) == operands.end()) out.Poison(0x11);
  {
    StreamingThreshold everything(1);
    ASSERT_TRUE(Exec(opcode, operands, ints).ok()) << what;
  }
  const std::vector<uint8_t> streamed(out.data(), out.data() + out.storage_bytes());
  EXPECT_TRUE(cached == streamed) << what;
}

TEST(StreamingStoresTest, ElementwiseOutputsEqualWhenStreamed) {
  std::mt19937_64 rng(21);
  const std::vector<Shape> shapes = {{1000}, {17, 33}, {300, 1001}, {3}};
  for (const Shape& shape : shapes) {
    for (int fn : {TERN_BINARY_ADD, TERN_BINARY_MUL, TERN_BINARY_DIV, TERN_BINARY_MAX}) {
      for (int layout = 0; layout < 3; ++layout) {
        Tensor a = layout == 2 && shape.size() == 2
                       ? Tensor::Permuted(TERN_DTYPE_F32, shape, {1, 0})
                       : Tensor(TERN_DTYPE_F32, shape);
        std::vector<bool> first(shape.size(), false);
        first[0] = true;
        Tensor b = layout == 1 ? Tensor::Broadcast(TERN_DTYPE_F32, shape, first)
                               : Tensor(TERN_DTYPE_F32, shape);
        a.Randomize(rng, -4, 4);
        b.Randomize(rng, 0.5, 4);
        Tensor out(TERN_DTYPE_F32, shape);
        const std::string what = "binary " + std::to_string(fn) + " " + ShapeStr(shape) +
                                 " layout " + std::to_string(layout);
        ExpectSameBitsStreamed(TERN_OP_BINARY, {&out, &a, &b}, {fn}, what);
        // In place (the output is the first input), when a is plain.
        if (layout != 2)
          ExpectSameBitsStreamed(TERN_OP_BINARY, {&a, &a, &b}, {fn}, what + " in place");
      }
    }
    Tensor in(TERN_DTYPE_F32, shape), out(TERN_DTYPE_F32, shape);
    in.Randomize(rng, -8, 8);
    // Unary functions do not stream (kernels_elementwise.cc); unchanged either way.
    ExpectSameBitsStreamed(TERN_OP_UNARY, {&out, &in}, {TERN_UNARY_GELU},
                           "gelu " + ShapeStr(shape));
    // A bf16 output is converted on the way out and never streamed.
    Tensor half(TERN_DTYPE_BF16, shape);
    ExpectSameBitsStreamed(TERN_OP_CAST, {&half, &in}, {}, "cast to bf16 " + ShapeStr(shape));
  }
}

}  // namespace
}  // namespace tern::testing
