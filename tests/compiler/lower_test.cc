// Lowering: graphs built with AddNode are compiled into executables, loaded
// on the simulated device, run, and compared with plain CPU references; the
// memory plan is checked against numbers worked out by hand, and the engine
// ordering by the builder's race check (every compile goes through it).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <tern/executable.h>
#include <tern/tern.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compiler/graph_file/graph_file.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/ops.h"
#include "compiler/lower/compile.h"
#include "compiler/lower/lowering.h"
#include "compiler/lower/memory_planner.h"
#include "compiler/lower/tensor_ref.h"

namespace tern::compiler {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

constexpr uint64_t kTimeout = 30ull * 1000000000ull;

Shape S(std::initializer_list<int64_t> dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(Dim::Constant(d));
  return shape;
}
TensorType F32(Shape shape) { return {TERN_DTYPE_F32, std::move(shape)}; }
Attribute A(std::string name, decltype(Attribute::value) value) {
  return Attribute{std::move(name), std::move(value)};
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Deterministic values in [-1, 1).
std::vector<float> Values(size_t count, uint32_t seed) {
  std::vector<float> values(count);
  uint32_t state = seed * 2654435761u + 1;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
  }
  return values;
}

// The single output of a node.
uint32_t Out(const Graph& graph, absl::StatusOr<uint32_t> node) {
  EXPECT_TRUE(node.ok()) << node.status();
  return node.ok() ? graph.nodes[*node].outputs[0] : 0;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * (1.0 + std::fabs(want[i]))) << what << " at " << i;
  }
}

std::vector<uint32_t> BitsOf(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

class LowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << tern_last_error_message();
    ASSERT_EQ(tern_device_get(0, &device_), TERN_OK);
    ASSERT_EQ(tern_core_open(device_, 0, &core_), TERN_OK) << tern_last_error_message();
    ASSERT_EQ(tern_queue_create(core_, nullptr, &queue_), TERN_OK) << tern_last_error_message();
  }
  void TearDown() override {
    EXPECT_EQ(tern_queue_destroy(queue_), TERN_OK);
    EXPECT_EQ(tern_core_close(core_), TERN_OK);
    EXPECT_EQ(tern_shutdown(), TERN_OK);
  }

  tern_buffer_t Buffer(uint64_t size) {
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = size == 0 ? 64 : size;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    EXPECT_EQ(tern_buffer_alloc(device_, &params, &buffer), TERN_OK) << tern_last_error_message();
    return buffer;
  }

  // Compiles `graph`, runs it on `inputs` (bytes, in the graph's input
  // order) and returns every output as f32 values. A mutation's output is
  // bound to its input's buffer (the execution updates the input in place)
  // unless `mutations_in_place` is false.
  std::vector<std::vector<float>> Run(const Graph& graph,
                                      const std::vector<std::vector<uint8_t>>& inputs,
                                      CompileStats* stats = nullptr,
                                      const CompileOptions& options = {},
                                      bool mutations_in_place = true) {
    absl::StatusOr<std::vector<uint8_t>> executable = CompileGraph(graph, options, stats);
    EXPECT_TRUE(executable.ok()) << executable.status();
    if (!executable.ok()) return {};
    tern_executable_t loaded = nullptr;
    EXPECT_EQ(
        tern_executable_load(device_, executable->data(), executable->size(), nullptr, &loaded),
        TERN_OK)
        << tern_last_error_message();
    if (loaded == nullptr) return {};
    std::vector<tern_buffer_t> buffers;
    std::vector<tern_binding_t> in_bindings, out_bindings;
    for (const std::vector<uint8_t>& bytes : inputs) {
      buffers.push_back(Buffer(bytes.size()));
      EXPECT_EQ(tern_buffer_write(buffers.back(), 0, bytes.data(), bytes.size()), TERN_OK);
      in_bindings.push_back({buffers.back(), 0});
    }
    std::vector<size_t> counts;
    std::vector<tern_buffer_t> read_from;  // per graph output
    for (uint32_t k = 0; k < graph.outputs.size(); ++k) {
      const Value& value = graph.values[graph.outputs[k].value];
      EXPECT_EQ(value.type.dtype, TERN_DTYPE_F32) << "the tests read f32 outputs";
      counts.push_back(static_cast<size_t>(*ConstantElements(value.type.shape)));
      const auto mutation = std::find_if(graph.mutations.begin(), graph.mutations.end(),
                                         [&](const Graph::Mutation& m) { return m.output == k; });
      if (mutations_in_place && mutation != graph.mutations.end()) {
        out_bindings.push_back(in_bindings[mutation->input]);
        read_from.push_back(in_bindings[mutation->input].buffer);
        continue;
      }
      buffers.push_back(Buffer(counts.back() * 4));
      out_bindings.push_back({buffers.back(), 0});
      read_from.push_back(buffers.back());
    }
    EXPECT_EQ(tern_queue_execute(queue_, loaded, 0, in_bindings.data(),
                                 static_cast<uint32_t>(in_bindings.size()), out_bindings.data(),
                                 static_cast<uint32_t>(out_bindings.size()), nullptr),
              TERN_OK)
        << tern_last_error_message();
    EXPECT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << tern_last_error_message();
    std::vector<std::vector<float>> results;
    for (size_t j = 0; j < counts.size(); ++j) {
      std::vector<float> values(counts[j]);
      EXPECT_EQ(tern_buffer_read(read_from[j], 0, values.data(), counts[j] * 4), TERN_OK);
      results.push_back(std::move(values));
    }
    EXPECT_EQ(tern_executable_unload(loaded), TERN_OK);
    for (tern_buffer_t buffer : buffers) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    return results;
  }

  // Compiles `graph` with and without fusion and runs both: every output
  // must have the same bits. Returns the fused run's outputs (none when the
  // runs gave different numbers of outputs).
  std::vector<std::vector<float>> RunFusedAndUnfused(
      const Graph& graph, const std::vector<std::vector<uint8_t>>& inputs, CompileStats* fused,
      CompileStats* unfused) {
    CompileOptions off;
    off.fusion = false;
    std::vector<std::vector<float>> with = Run(graph, inputs, fused);
    const std::vector<std::vector<float>> without = Run(graph, inputs, unfused, off);
    EXPECT_EQ(with.size(), without.size());
    if (with.size() != without.size()) return {};
    for (size_t k = 0; k < with.size(); ++k) {
      EXPECT_EQ(BitsOf(with[k]), BitsOf(without[k])) << "output " << k;
    }
    return with;
  }

  tern_device_t device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

// y = relu(x W1^T + b1) W2^T + b2, as torch.nn.Linear exports it (the
// transposed weight is a permuted view: a strided operand, no copy).
struct Mlp {
  static constexpr int64_t kBatch = 4, kIn = 8, kHidden = 16, kOut = 3;
  std::vector<float> x = Values(kBatch * kIn, 1), w1 = Values(kHidden * kIn, 2),
                     b1 = Values(kHidden, 3), w2 = Values(kOut * kHidden, 4), b2 = Values(kOut, 5);

  Graph Build() const {
    Graph g;
    const uint32_t xv = g.AddInput("x", F32(S({kBatch, kIn})));
    const uint32_t w1v = g.AddConstant("fc1.weight", F32(S({kHidden, kIn})), Bytes(w1));
    const uint32_t b1v = g.AddConstant("fc1.bias", F32(S({kHidden})), Bytes(b1));
    const uint32_t w2v = g.AddConstant("fc2.weight", F32(S({kOut, kHidden})), Bytes(w2));
    const uint32_t b2v = g.AddConstant("fc2.bias", F32(S({kOut})), Bytes(b2));
    const std::vector<int64_t> swap = {1, 0};
    const uint32_t w1t = Out(g, AddNode(&g, "aten.permute.default", {w1v}, {A("dims", swap)}, "t"));
    const uint32_t h = Out(
        g, AddNode(&g, "aten.addmm.default", {b1v, xv, w1t}, {}, "fc1", "model.py:10 in forward"));
    const uint32_t r = Out(g, AddNode(&g, "aten.relu.default", {h}, {}, "relu"));
    const uint32_t w2t =
        Out(g, AddNode(&g, "aten.permute.default", {w2v}, {A("dims", swap)}, "t_1"));
    const uint32_t y = Out(
        g, AddNode(&g, "aten.addmm.default", {b2v, r, w2t}, {}, "fc2", "model.py:11 in forward"));
    g.AddOutput("y", y);
    return g;
  }

  std::vector<double> Reference() const {
    std::vector<double> y(kBatch * kOut);
    for (int64_t b = 0; b < kBatch; ++b) {
      std::vector<double> h(kHidden);
      for (int64_t j = 0; j < kHidden; ++j) {
        double sum = b1[j];
        for (int64_t i = 0; i < kIn; ++i) sum += double(x[b * kIn + i]) * w1[j * kIn + i];
        h[j] = sum > 0 ? sum : 0;
      }
      for (int64_t o = 0; o < kOut; ++o) {
        double sum = b2[o];
        for (int64_t j = 0; j < kHidden; ++j) sum += h[j] * w2[o * kHidden + j];
        y[b * kOut + o] = sum;
      }
    }
    return y;
  }
};

TEST_F(LowerTest, MlpMatchesTheReference) {
  Mlp mlp;
  CompileStats stats;
  const auto outputs = Run(mlp.Build(), {Bytes(mlp.x)}, &stats);
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], mlp.Reference(), 1e-5, "y");
  EXPECT_EQ(stats.nodes, 5u);
  // The relu is fc1's epilogue: both matmuls on the Tensor engine, in
  // order, so no semaphores.
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_TENSOR], 2u);
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_SCALAR], 0u);
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_SYNC], 0u);
  EXPECT_EQ(stats.semaphores, 0u);
  EXPECT_EQ(stats.compute_instructions_unfused, 3u);
  EXPECT_EQ(stats.compute_instructions, 2u);
  EXPECT_EQ(stats.epilogues, 1u);
  // h [4, 16] f32.
  EXPECT_EQ(stats.scratch_peak, 256u);
  EXPECT_EQ(stats.scratch_naive_sum, 256u);
}

TEST_F(LowerTest, MlpWithoutFusionHasItsReluOnTheScalarEngine) {
  Mlp mlp;
  CompileStats stats;
  CompileOptions options;
  options.fusion = false;
  const auto outputs = Run(mlp.Build(), {Bytes(mlp.x)}, &stats, options);
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], mlp.Reference(), 1e-5, "y");
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_SCALAR], 1u);
  // Tensor -> Scalar -> Tensor: one signal and one wait each way.
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_SYNC], 4u);
  EXPECT_EQ(stats.semaphores, 2u);
  EXPECT_EQ(stats.compute_instructions, 3u);
  EXPECT_EQ(stats.epilogues, 0u);
}

TEST_F(LowerTest, IdenticalGraphsGiveIdenticalBytes) {
  Mlp mlp;
  absl::StatusOr<std::vector<uint8_t>> first = CompileGraph(mlp.Build(), {}, nullptr);
  absl::StatusOr<std::vector<uint8_t>> second = CompileGraph(mlp.Build(), {}, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
}

TEST_F(LowerTest, IdenticalConstantsAreStoredOnce) {
  Graph g;
  const std::vector<float> w = Values(16, 7);
  const uint32_t x = g.AddInput("x", F32(S({16})));
  const uint32_t c1 = g.AddConstant("c1", F32(S({16})), Bytes(w));
  const uint32_t c2 = g.AddConstant("c2", F32(S({16})), Bytes(w));
  const uint32_t a = Out(g, AddNode(&g, "aten.add.Tensor", {x, c1}, {}, "add"));
  const uint32_t b = Out(g, AddNode(&g, "aten.mul.Tensor", {a, c2}, {}, "mul"));
  g.AddOutput("out", b);
  CompileStats stats;
  const std::vector<float> xs = Values(16, 8);
  const auto outputs = Run(g, {Bytes(xs)}, &stats);
  EXPECT_EQ(stats.constant_bytes, 64u);
  std::vector<double> want(16);
  for (size_t i = 0; i < 16; ++i) want[i] = (double(xs[i]) + w[i]) * w[i];
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-6, "out");
}

TEST_F(LowerTest, SoftmaxOfAProduct) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4, 8})));
  const uint32_t w = g.AddInput("w", F32(S({8, 6})));
  const uint32_t mm = Out(g, AddNode(&g, "aten.mm.default", {x, w}, {}, "scores"));
  const uint32_t sm = Out(g, AddNode(&g, "aten._softmax.default", {mm},
                                     {A("dim", int64_t{-1}), A("half_to_float", false)}, "probs"));
  g.AddOutput("probs", sm);
  const std::vector<float> xs = Values(32, 11), ws = Values(48, 12);
  const auto outputs = Run(g, {Bytes(xs), Bytes(ws)});
  std::vector<double> want(24);
  for (int r = 0; r < 4; ++r) {
    double row[6], max = -1e300, total = 0;
    for (int c = 0; c < 6; ++c) {
      row[c] = 0;
      for (int k = 0; k < 8; ++k) row[c] += double(xs[r * 8 + k]) * ws[k * 6 + c];
      max = std::max(max, row[c]);
    }
    for (double& v : row) total += (v = std::exp(v - max));
    for (int c = 0; c < 6; ++c) want[r * 6 + c] = row[c] / total;
  }
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-5, "probs");
}

TEST_F(LowerTest, LayerNormWithItsStatistics) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({2, 3, 8})));
  const std::vector<float> weight = Values(8, 21), bias = Values(8, 22);
  const uint32_t wv = g.AddConstant("ln.weight", F32(S({8})), Bytes(weight));
  const uint32_t bv = g.AddConstant("ln.bias", F32(S({8})), Bytes(bias));
  absl::StatusOr<uint32_t> ln =
      AddNode(&g, "aten.native_layer_norm.default", {x, wv, bv},
              {A("normalized_shape", std::vector<int64_t>{8}), A("eps", 1e-5)}, "ln");
  ASSERT_TRUE(ln.ok()) << ln.status();
  g.AddOutput("out", g.nodes[*ln].outputs[0]);
  g.AddOutput("rstd", g.nodes[*ln].outputs[2]);  // mean is unused: not computed
  const std::vector<float> xs = Values(48, 23);
  const auto outputs = Run(g, {Bytes(xs)});
  std::vector<double> want(48), want_rstd(6);
  for (int row = 0; row < 6; ++row) {
    double mean = 0, var = 0;
    for (int i = 0; i < 8; ++i) mean += xs[row * 8 + i] / 8.0;
    for (int i = 0; i < 8; ++i) var += (xs[row * 8 + i] - mean) * (xs[row * 8 + i] - mean) / 8.0;
    want_rstd[row] = 1.0 / std::sqrt(var + 1e-5);
    for (int i = 0; i < 8; ++i) {
      want[row * 8 + i] = (xs[row * 8 + i] - mean) * want_rstd[row] * weight[i] + bias[i];
    }
  }
  ASSERT_EQ(outputs.size(), 2u);
  ExpectNear(outputs[0], want, 1e-5, "out");
  ExpectNear(outputs[1], want_rstd, 1e-5, "rstd");
}

TEST_F(LowerTest, ViewChainsNeedNoCopiesExceptForOutputs) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({2, 3, 4})));
  // permute [4, 2, 3], then view [4, 6]: the strides express it.
  const uint32_t p = Out(g, AddNode(&g, "aten.permute.default", {x},
                                    {A("dims", std::vector<int64_t>{2, 0, 1})}, "perm"));
  const uint32_t v = Out(g, AddNode(&g, "aten.view.default", {p}, {A("size", S({4, 6}))}, "v"));
  const uint32_t scaled =
      Out(g, AddNode(&g, "aten.mul.Tensor", {v, kNoValue}, {A("other", 2.0)}, "scaled"));
  // view [24] of the permuted tensor: the strides cannot, so one copy.
  const uint32_t flat = Out(g, AddNode(&g, "aten.view.default", {p}, {A("size", S({24}))}, "flat"));
  // select, unsqueeze, expand, slice, then an add that reads them all.
  const uint32_t sel = Out(g, AddNode(&g, "aten.select.int", {x},
                                      {A("dim", int64_t{0}), A("index", int64_t{1})}, "sel"));
  const uint32_t un =
      Out(g, AddNode(&g, "aten.unsqueeze.default", {sel}, {A("dim", int64_t{0})}, "un"));
  const uint32_t ex =
      Out(g, AddNode(&g, "aten.expand.default", {un}, {A("size", S({2, 3, 4}))}, "ex"));
  const uint32_t sl = Out(g, AddNode(&g, "aten.slice.Tensor", {ex},
                                     {A("dim", int64_t{2}), A("start", int64_t{1}),
                                      A("end", int64_t{4}), A("step", int64_t{2})},
                                     "sl"));
  const uint32_t sum = Out(g, AddNode(&g, "aten.add.Tensor", {sl, sl}, {}, "twice"));
  g.AddOutput("scaled", scaled);
  g.AddOutput("flat", flat);
  g.AddOutput("perm", p);  // a view as an output: copied
  g.AddOutput("twice", sum);
  const std::vector<float> xs = Values(24, 31);
  CompileStats stats;
  const auto outputs = Run(g, {Bytes(xs)}, &stats);
  ASSERT_EQ(outputs.size(), 4u);
  auto at = [&](int i, int j, int k) { return double(xs[i * 12 + j * 4 + k]); };
  std::vector<double> perm(24), scaled_want(24), twice(12);
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) perm[k * 6 + i * 3 + j] = at(i, j, k);
    }
  }
  for (int e = 0; e < 24; ++e) scaled_want[e] = 2.0 * perm[e];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int c = 0; c < 2; ++c) twice[i * 6 + j * 2 + c] = 2.0 * at(1, j, 1 + 2 * c);
    }
  }
  ExpectNear(outputs[0], scaled_want, 0, "scaled");
  ExpectNear(outputs[1], perm, 0, "flat");
  ExpectNear(outputs[2], perm, 0, "perm");
  ExpectNear(outputs[3], twice, 0, "twice");
  // Two binaries; the reshape copy and the output copy of the view.
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_VECTOR], 2u);
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_DMA], 2u);
  EXPECT_EQ(stats.scratch_peak, 0u);  // everything else is an output or a view
}

TEST_F(LowerTest, BroadcastingArithmeticWithScalarsAndAlpha) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({3, 4})));
  const uint32_t b = g.AddInput("b", F32(S({4})));
  // (x + b) + 2 * 0.5, minus 3 * b, times 4, divided by 8
  const uint32_t s1 = Out(g, AddNode(&g, "aten.add.Tensor", {x, b}, {}, "add"));
  const uint32_t s2 = Out(g, AddNode(&g, "aten.add.Tensor", {s1, kNoValue},
                                     {A("other", 0.5), A("alpha", 2.0)}, "add1"));
  const uint32_t s3 =
      Out(g, AddNode(&g, "aten.sub.Tensor", {s2, b}, {A("alpha", int64_t{3})}, "sub"));
  const uint32_t s4 =
      Out(g, AddNode(&g, "aten.mul.Tensor", {s3, kNoValue}, {A("other", int64_t{4})}, "mul"));
  const uint32_t s5 =
      Out(g, AddNode(&g, "aten.div.Tensor", {s4, kNoValue}, {A("other", 8.0)}, "div"));
  g.AddOutput("out", s5);
  const std::vector<float> xs = Values(12, 41), bs = Values(4, 42);
  const auto outputs = Run(g, {Bytes(xs), Bytes(bs)});
  std::vector<double> want(12);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) {
      want[i * 4 + j] = ((double(xs[i * 4 + j]) + bs[j] + 1.0 - 3.0 * bs[j]) * 4.0) / 8.0;
    }
  }
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-6, "out");
}

TEST_F(LowerTest, CatAlongBothDims) {
  Graph g;
  const uint32_t a = g.AddInput("a", F32(S({2, 3})));
  const uint32_t b = g.AddInput("b", F32(S({2, 5})));
  const uint32_t wide =
      Out(g, AddNode(&g, "aten.cat.default", {a, b}, {A("dim", int64_t{-1})}, "wide"));
  const uint32_t r = Out(g, AddNode(&g, "aten.relu.default", {a}, {}, "relu"));
  const uint32_t tall = Out(g, AddNode(&g, "aten.cat.default", {a, r}, {}, "tall"));
  // split_with_sizes gives views: its second piece is an output (copied).
  absl::StatusOr<uint32_t> split =
      AddNode(&g, "aten.split_with_sizes.default", {wide},
              {A("split_sizes", std::vector<int64_t>{3, 5}), A("dim", int64_t{1})}, "split");
  ASSERT_TRUE(split.ok()) << split.status();
  g.AddOutput("wide", wide);
  g.AddOutput("tall", tall);
  g.AddOutput("b_again", g.nodes[*split].outputs[1]);
  const std::vector<float> as = Values(6, 51), bs = Values(10, 52);
  const auto outputs = Run(g, {Bytes(as), Bytes(bs)});
  std::vector<double> want_wide, want_tall;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) want_wide.push_back(as[i * 3 + j]);
    for (int j = 0; j < 5; ++j) want_wide.push_back(bs[i * 5 + j]);
  }
  for (float v : as) want_tall.push_back(v);
  for (float v : as) want_tall.push_back(v > 0 ? v : 0);
  ASSERT_EQ(outputs.size(), 3u);
  ExpectNear(outputs[0], want_wide, 0, "wide");
  ExpectNear(outputs[1], want_tall, 0, "tall");
  ExpectNear(outputs[2], std::vector<double>(bs.begin(), bs.end()), 0, "b_again");
}

TEST_F(LowerTest, EmbeddingReductionsAndWhere) {
  Graph g;
  const std::vector<float> table = Values(40, 61);
  const uint32_t weight = g.AddConstant("emb.weight", F32(S({10, 4})), Bytes(table));
  const uint32_t ids = g.AddInput("ids", {TERN_DTYPE_I64, S({3})});
  const uint32_t e = Out(g, AddNode(&g, "aten.embedding.default", {weight, ids}, {}, "emb"));
  const uint32_t m =
      Out(g, AddNode(&g, "aten.mean.dim", {e},
                     {A("dim", std::vector<int64_t>{-1}), A("keepdim", true)}, "mean"));
  const uint32_t mx =
      Out(g, AddNode(&g, "aten.amax.default", {e}, {A("dim", std::vector<int64_t>{0})}, "amax"));
  const uint32_t gt = Out(g, AddNode(&g, "aten.gt.Tensor", {e, m}, {}, "above"));
  const uint32_t w = Out(g, AddNode(&g, "aten.where.self", {gt, e, m}, {}, "clip"));
  const uint32_t s =
      Out(g, AddNode(&g, "aten.sum.dim_IntList", {w}, {A("dim", std::vector<int64_t>{1})}, "sum"));
  g.AddOutput("amax", mx);
  g.AddOutput("sum", s);
  const std::vector<int64_t> indices = {7, 0, 3};
  const auto outputs = Run(g, {Bytes(indices)});
  std::vector<double> want_max(4, -1e300), want_sum(3, 0);
  for (int r = 0; r < 3; ++r) {
    const float* row = &table[static_cast<size_t>(indices[r]) * 4];
    double mean = 0;
    for (int c = 0; c < 4; ++c) mean += row[c];
    mean = static_cast<float>(mean / 4);
    for (int c = 0; c < 4; ++c) {
      want_max[c] = std::max(want_max[c], double(row[c]));
      want_sum[r] += row[c] > mean ? row[c] : mean;
    }
  }
  ASSERT_EQ(outputs.size(), 2u);
  ExpectNear(outputs[0], want_max, 0, "amax");
  ExpectNear(outputs[1], want_sum, 1e-6, "sum");
}

// `value` converted to f32 (Run reads f32 outputs).
uint32_t AsF32(Graph& g, uint32_t value, const std::string& name) {
  return Out(g, AddNode(&g, "aten._to_copy.default", {value},
                        {A("dtype", DTypeAttr{TERN_DTYPE_F32})}, name));
}

// full_like feeding instructions is a broadcast constant (no fill, no
// scratch): the attention mask's where(mask, scores, full_like(scores,
// -inf)), and an integer one in arithmetic. As a graph output it is filled.
TEST_F(LowerTest, FullLikeIsABroadcastConstantUnlessItIsAnOutput) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({2, 3, 4})));
  const uint32_t ids = g.AddInput("ids", {TERN_DTYPE_I64, S({3})});
  const uint32_t mask = Out(g, AddNode(&g, "aten.gt.Scalar", {x}, {A("other", 0.0)}, "mask"));
  const uint32_t low =
      Out(g, AddNode(&g, "aten.full_like.default", {x}, {A("fill_value", -1e30)}, "low"));
  const uint32_t masked = Out(g, AddNode(&g, "aten.where.self", {mask, x, low}, {}, "masked"));
  const uint32_t seven =
      Out(g, AddNode(&g, "aten.full_like.default", {ids}, {A("fill_value", int64_t{7})}, "seven"));
  const uint32_t shifted = Out(g, AddNode(&g, "aten.add.Tensor", {ids, seven}, {}, "shifted"));
  g.AddOutput("masked", masked);
  g.AddOutput("shifted", AsF32(g, shifted, "shifted_f32"));
  const std::vector<float> xs = Values(24, 91);
  const std::vector<int64_t> is = {4, -1, 9};
  CompileOptions unfused;
  unfused.fusion = false;
  CompileStats stats;
  const auto outputs = Run(g, {Bytes(xs), Bytes(is)}, &stats, unfused);
  ASSERT_EQ(outputs.size(), 2u);
  std::vector<double> want(24);
  for (int e = 0; e < 24; ++e) {
    want[e] = xs[e] > 0 ? xs[e] : static_cast<double>(-1e30f);
  }
  ExpectNear(outputs[0], want, 0, "where(x > 0, x, -1e30)");
  ExpectNear(outputs[1], {11, 6, 16}, 0, "ids + 7");
  // gt, where, add, cast: no fill.
  uint32_t compute = 0;
  for (int engine = TERN_ENGINE_DMA; engine < TERN_ENGINE_SYNC; ++engine) {
    compute += stats.instructions_per_engine[engine];
  }
  EXPECT_EQ(compute, 4u);

  // The same constant as an output is written out.
  Graph h;
  const uint32_t y = h.AddInput("y", F32(S({2, 2})));
  const uint32_t half =
      Out(h, AddNode(&h, "aten.full_like.default", {y}, {A("fill_value", 0.5)}, "half"));
  const uint32_t sum = Out(h, AddNode(&h, "aten.add.Tensor", {y, half}, {}, "sum"));
  h.AddOutput("half", half);
  h.AddOutput("sum", sum);
  const auto both = Run(h, {Bytes(std::vector<float>{1, 2, 3, 4})});
  ASSERT_EQ(both.size(), 2u);
  ExpectNear(both[0], {0.5, 0.5, 0.5, 0.5}, 0, "full_like as an output");
  ExpectNear(both[1], {1.5, 2.5, 3.5, 4.5}, 0, "y + full_like");
}

TEST_F(LowerTest, LogicalAndBitwiseOpsMatchTheReference) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({2, 3})));
  const uint32_t y = g.AddInput("y", F32(S({2, 3})));
  const uint32_t m = g.AddInput("m", {TERN_DTYPE_BOOL, S({3})});
  const uint32_t i = g.AddInput("i", {TERN_DTYPE_I32, S({2, 3})});
  const uint32_t j = g.AddInput("j", {TERN_DTYPE_I32, S({3})});
  // Two dtypes (f32 and a broadcast bool: both read as bool), then one.
  const uint32_t land = Out(g, AddNode(&g, "aten.logical_and.default", {x, m}, {}, "land"));
  const uint32_t lor = Out(g, AddNode(&g, "aten.logical_or.default", {x, y}, {}, "lor"));
  const uint32_t band = Out(g, AddNode(&g, "aten.bitwise_and.Tensor", {i, j}, {}, "band"));
  const uint32_t bor = Out(g, AddNode(&g, "aten.bitwise_or.Tensor", {m, i}, {}, "bor"));
  const uint32_t inot = Out(g, AddNode(&g, "aten.bitwise_not.default", {i}, {}, "inot"));
  const uint32_t mnot = Out(g, AddNode(&g, "aten.bitwise_not.default", {m}, {}, "mnot"));
  for (const auto& [name, value] : std::vector<std::pair<std::string, uint32_t>>{{"land", land},
                                                                                 {"lor", lor},
                                                                                 {"band", band},
                                                                                 {"bor", bor},
                                                                                 {"inot", inot},
                                                                                 {"mnot", mnot}}) {
    g.AddOutput(name, AsF32(g, value, name + "_f32"));
  }
  // -0 is false; NaN and a tiny 1e-30 are true.
  const std::vector<float> xs = {0.0f, 1.5f, NAN, -0.0f, 1e-30f, 2.0f};
  const std::vector<float> ys = {0.0f, 0.0f, 0.0f, 3.0f, 0.0f, -1.0f};
  const std::vector<uint8_t> ms = {1, 0, 1};
  const std::vector<int32_t> is = {0, 5, -1, 12, 7, -8}, js = {3, 6, 255};
  const auto outputs = Run(g, {Bytes(xs), Bytes(ys), Bytes(ms), Bytes(is), Bytes(js)});
  std::vector<double> want_and, want_or, want_band, want_bor, want_inot, want_mnot;
  for (size_t k = 0; k < 6; ++k) {
    const bool tx = xs[k] != 0.0f, ty = ys[k] != 0.0f, tm = ms[k % 3] != 0;  // NaN != 0
    want_and.push_back(tx && tm);
    want_or.push_back(tx || ty);
    want_band.push_back(is[k] & js[k % 3]);
    want_bor.push_back(static_cast<int32_t>(tm) | is[k]);
    want_inot.push_back(~is[k]);
  }
  for (uint8_t v : ms) want_mnot.push_back(v == 0);
  ASSERT_EQ(outputs.size(), 6u);
  ExpectNear(outputs[0], want_and, 0, "logical_and");
  ExpectNear(outputs[1], want_or, 0, "logical_or");
  ExpectNear(outputs[2], want_band, 0, "bitwise_and");
  ExpectNear(outputs[3], want_bor, 0, "bitwise_or");
  ExpectNear(outputs[4], want_inot, 0, "bitwise_not i32");
  ExpectNear(outputs[5], want_mnot, 0, "bitwise_not bool");
}

TEST_F(LowerTest, ClampMatchesTheReferenceFusedOrNot) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({8})));
  const uint32_t i = g.AddInput("i", {TERN_DTYPE_I64, S({7})});
  // clamp_min, clamp_max, mul: one elementwise program when fused.
  const uint32_t low = Out(g, AddNode(&g, "aten.clamp_min.default", {x}, {A("min", -0.5)}, "lo"));
  const uint32_t high =
      Out(g, AddNode(&g, "aten.clamp_max.default", {low}, {A("max", 0.25)}, "hi"));
  const uint32_t twice =
      Out(g, AddNode(&g, "aten.mul.Tensor", {high, kNoValue}, {A("other", int64_t{2})}, "mul"));
  const uint32_t both =
      Out(g, AddNode(&g, "aten.clamp.default", {x}, {A("min", -0.1), A("max", 0.1)}, "clamp"));
  const uint32_t ints = Out(g, AddNode(&g, "aten.clamp.default", {i},
                                       {A("min", int64_t{-2}), A("max", int64_t{3})}, "ints"));
  // A float bound makes the i64 tensor f32.
  const uint32_t promoted =
      Out(g, AddNode(&g, "aten.clamp_min.default", {i}, {A("min", 0.5)}, "promoted"));
  g.AddOutput("twice", twice);
  g.AddOutput("both", both);
  g.AddOutput("ints", AsF32(g, ints, "ints_f32"));
  g.AddOutput("promoted", promoted);
  std::vector<float> xs = Values(8, 71);
  xs[3] = NAN;  // propagates, as in PyTorch
  xs[5] = INFINITY;
  const std::vector<int64_t> is = {-5, -2, 0, 1, 3, 4, 100};
  CompileStats fused, unfused;
  const auto outputs = RunFusedAndUnfused(g, {Bytes(xs), Bytes(is)}, &fused, &unfused);
  EXPECT_LT(fused.compute_instructions, unfused.compute_instructions);
  ASSERT_EQ(outputs.size(), 4u);
  for (size_t k = 0; k < xs.size(); ++k) {
    const float a = std::min(std::max(xs[k], -0.5f), 0.25f) * 2.0f;
    const float b = std::min(std::max(xs[k], -0.1f), 0.1f);
    if (std::isnan(xs[k])) {
      EXPECT_TRUE(std::isnan(outputs[0][k]) && std::isnan(outputs[1][k])) << k;
      continue;
    }
    EXPECT_EQ(outputs[0][k], a) << k;
    EXPECT_EQ(outputs[1][k], b) << k;
  }
  ExpectNear(outputs[2], {-2, -2, 0, 1, 3, 3, 3}, 0, "clamp i64");
  ExpectNear(outputs[3], {0.5, 0.5, 0.5, 1, 3, 4, 100}, 0, "clamp_min i64 with 0.5");
}

TEST_F(LowerTest, ConstantPadNdFillsAndCrops) {
  using Ints = std::vector<int64_t>;
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({2, 3})));
  const uint32_t i = g.AddInput("i", {TERN_DTYPE_I64, S({3})});
  const uint32_t wide = Out(g, AddNode(&g, "aten.constant_pad_nd.default", {x},
                                       {A("pad", Ints{1, 2}), A("value", 0.5)}, "wide"));
  // Crop one column in front, pad one behind and a row on top (value 0).
  const uint32_t shifted = Out(
      g, AddNode(&g, "aten.constant_pad_nd.default", {x}, {A("pad", Ints{-1, 1, 1, 0})}, "shift"));
  const uint32_t ints = Out(g, AddNode(&g, "aten.constant_pad_nd.default", {i},
                                       {A("pad", Ints{2, 0}), A("value", int64_t{7})}, "ints"));
  g.AddOutput("wide", wide);
  g.AddOutput("shifted", shifted);
  g.AddOutput("ints", AsF32(g, ints, "ints_f32"));
  const std::vector<float> xs = Values(6, 81);
  const std::vector<int64_t> is = {4, -1, 9};
  const auto outputs = Run(g, {Bytes(xs), Bytes(is)});
  std::vector<double> want_wide, want_shifted = {0, 0, 0};
  for (int r = 0; r < 2; ++r) {
    want_wide.insert(want_wide.end(), {0.5, xs[r * 3], xs[r * 3 + 1], xs[r * 3 + 2], 0.5, 0.5});
    want_shifted.insert(want_shifted.end(), {xs[r * 3 + 1], xs[r * 3 + 2], 0.0});
  }
  ASSERT_EQ(outputs.size(), 3u);
  ExpectNear(outputs[0], want_wide, 0, "pad (1, 2) with 0.5");
  ExpectNear(outputs[1], want_shifted, 0, "pad (-1, 1, 1, 0)");
  ExpectNear(outputs[2], {7, 7, 4, -1, 9}, 0, "pad i64 with 7");
}

// What nll_loss's backward does: scatter(zeros, 1, target, -1.0); repeated
// indices write the same value.
TEST_F(LowerTest, ScatterValueWritesWhereTheIndexPoints) {
  Graph g;
  const uint32_t self = g.AddInput("self", F32(S({3, 4})));
  const uint32_t rows = g.AddInput("rows", {TERN_DTYPE_I64, S({3, 2})});
  const uint32_t cols = g.AddInput("cols", {TERN_DTYPE_I32, S({1, 3})});
  const uint32_t flat = g.AddInput("flat", {TERN_DTYPE_I32, S({5})});
  const uint32_t where = g.AddInput("where", {TERN_DTYPE_I64, S({2})});
  const uint32_t along_rows = Out(g, AddNode(&g, "aten.scatter.value", {self, rows},
                                             {A("dim", int64_t{1}), A("value", -1.0)}, "s1"));
  const uint32_t along_cols =
      Out(g, AddNode(&g, "aten.scatter.value", {self, cols}, {A("value", int64_t{7})}, "s0"));
  // A float value into an integer tensor is truncated, as PyTorch converts it.
  const uint32_t ints =
      Out(g, AddNode(&g, "aten.scatter.value", {flat, where}, {A("value", 2.5)}, "s_int"));
  g.AddOutput("along_rows", along_rows);
  g.AddOutput("along_cols", along_cols);
  g.AddOutput("ints", AsF32(g, ints, "ints_f32"));
  const std::vector<float> xs = Values(12, 91);
  const std::vector<int64_t> row_index = {2, 2, 0, 3, 1, 1};
  const std::vector<int32_t> col_index = {2, 0, 1};
  const std::vector<int32_t> fs = {10, 20, 30, 40, 50};
  const std::vector<int64_t> at = {4, 1};
  const auto outputs =
      Run(g, {Bytes(xs), Bytes(row_index), Bytes(col_index), Bytes(fs), Bytes(at)});
  std::vector<double> want_rows(xs.begin(), xs.end()), want_cols(xs.begin(), xs.end());
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 2; ++k) want_rows[r * 4 + row_index[r * 2 + k]] = -1.0;
  }
  for (int c = 0; c < 3; ++c) want_cols[col_index[c] * 4 + c] = 7.0;
  ASSERT_EQ(outputs.size(), 3u);
  ExpectNear(outputs[0], want_rows, 0, "scatter along dim 1");
  ExpectNear(outputs[1], want_cols, 0, "scatter along dim 0");
  ExpectNear(outputs[2], {10, 2, 30, 40, 2}, 0, "scatter into i32");
}

// An embedding's backward: index_put(zeros, [ids], grad, accumulate=True);
// repeated ids sum.
TEST_F(LowerTest, IndexPutAccumulatesRepeatedIndices) {
  Graph g;
  const uint32_t table = g.AddInput("table", F32(S({5, 3})));
  const uint32_t ids = g.AddInput("ids", {TERN_DTYPE_I64, S({2, 2})});
  const uint32_t grad = g.AddInput("grad", F32(S({2, 2, 3})));
  const uint32_t few = g.AddInput("few", {TERN_DTYPE_I32, S({3})});
  const uint32_t row = g.AddInput("row", F32(S({3})));
  const uint32_t summed = Out(
      g, AddNode(&g, "aten.index_put.default", {table, ids, grad}, {A("accumulate", true)}, "put"));
  // values broadcast to index.shape + self.shape[1:].
  const uint32_t broadcast = Out(g, AddNode(&g, "aten.index_put.default", {table, few, row},
                                            {A("accumulate", true)}, "put_row"));
  g.AddOutput("summed", summed);
  g.AddOutput("broadcast", broadcast);
  const std::vector<float> ts = Values(15, 101), gs = Values(12, 102), rs = {0.25f, -1.0f, 2.0f};
  const std::vector<int64_t> id_values = {4, 1, 4, 0};
  const std::vector<int32_t> few_values = {0, 0, 2};
  const auto outputs =
      Run(g, {Bytes(ts), Bytes(id_values), Bytes(gs), Bytes(few_values), Bytes(rs)});
  std::vector<float> want_sum = ts, want_row = ts;  // f32 sums in index order
  for (size_t k = 0; k < id_values.size(); ++k) {
    for (size_t c = 0; c < 3; ++c) want_sum[id_values[k] * 3 + c] += gs[k * 3 + c];
  }
  for (int32_t id : few_values) {
    for (size_t c = 0; c < 3; ++c) want_row[id * 3 + c] += rs[c];
  }
  ASSERT_EQ(outputs.size(), 2u);
  ExpectNear(outputs[0], std::vector<double>(want_sum.begin(), want_sum.end()), 1e-6, "summed");
  ExpectNear(outputs[1], std::vector<double>(want_row.begin(), want_row.end()), 1e-6, "broadcast");
}

// 1 - x is sub.Tensor(1, x) after the core ATen decompositions: the number
// stands for self.
TEST_F(LowerTest, APythonNumberOnTheLeft) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4})));
  const uint32_t i = g.AddInput("i", {TERN_DTYPE_I64, S({3})});
  const uint32_t one_minus =
      Out(g, AddNode(&g, "aten.sub.Tensor", {kNoValue, x}, {A("self", int64_t{1})}, "rsub"));
  const uint32_t scaled = Out(g, AddNode(&g, "aten.sub.Tensor", {kNoValue, x},
                                         {A("self", 2.0), A("alpha", int64_t{3})}, "rsub_alpha"));
  const uint32_t less =
      Out(g, AddNode(&g, "aten.lt.Tensor", {kNoValue, x}, {A("self", 0.25)}, "less"));
  const uint32_t from_int =
      Out(g, AddNode(&g, "aten.sub.Tensor", {kNoValue, i}, {A("self", 2.5)}, "rsub_int"));
  g.AddOutput("one_minus", one_minus);
  g.AddOutput("scaled", scaled);
  g.AddOutput("less", AsF32(g, less, "less_f32"));
  g.AddOutput("from_int", from_int);
  const std::vector<float> xs = Values(4, 111);
  const std::vector<int64_t> is = {-3, 0, 7};
  const auto outputs = Run(g, {Bytes(xs), Bytes(is)});
  std::vector<double> want_one, want_scaled, want_less;
  for (float v : xs) {
    want_one.push_back(1.0f - v);
    want_scaled.push_back(2.0f - 3.0f * v);
    want_less.push_back(0.25f < v);
  }
  ASSERT_EQ(outputs.size(), 4u);
  ExpectNear(outputs[0], want_one, 0, "1 - x");
  ExpectNear(outputs[1], want_scaled, 0, "2 - 3 * x");
  ExpectNear(outputs[2], want_less, 0, "0.25 < x");
  ExpectNear(outputs[3], {5.5, 2.5, -4.5}, 0, "2.5 - i");
}

// exp, neg (Scalar), cat (two DMA copies), relu in place (Scalar: cat's
// result dies there), exp (Scalar), add (Vector) into the output:
//   buffer  bytes  live (instructions)
//   a       256    0..2     offset 0
//   b       256    1..3     offset 256
//   c = d   512    2..6     offset 512 (nothing free yet)
//   e       512    5..6     offset 0 (a and b freed and coalesced: a best fit)
// peak 1024, naive 1536, max-live 1024 (at instruction 2: a, b, c; at 5: c, e).
// The relu writes where the DMA engine wrote and the second exp where it
// read: the ordering covers both.
TEST_F(LowerTest, MemoryPlanGolden) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({64})));
  const uint32_t a = Out(g, AddNode(&g, "aten.exp.default", {x}, {}, "a"));
  const uint32_t b = Out(g, AddNode(&g, "aten.neg.default", {a}, {}, "b"));
  const uint32_t c = Out(g, AddNode(&g, "aten.cat.default", {a, b}, {}, "c"));
  const uint32_t d = Out(g, AddNode(&g, "aten.relu.default", {c}, {}, "d"));
  const uint32_t e = Out(g, AddNode(&g, "aten.exp.default", {d}, {}, "e"));
  const uint32_t out = Out(g, AddNode(&g, "aten.add.Tensor", {d, e}, {}, "out"));
  g.AddOutput("out", out);
  CompileStats stats;
  const std::vector<float> xs = Values(64, 71);
  // Unfused: one instruction per op, as the liveness above counts them.
  CompileOptions unfused;
  unfused.fusion = false;
  const auto outputs = Run(g, {Bytes(xs)}, &stats, unfused);
  EXPECT_EQ(stats.scratch_peak, 1024u);
  EXPECT_EQ(stats.scratch_naive_sum, 1536u);
  EXPECT_EQ(stats.scratch_max_live, 1024u);
  std::vector<double> want(128);
  for (size_t i = 0; i < 64; ++i) {
    const double ex = std::exp(double(xs[i]));
    want[i] = ex + std::exp(ex);
    want[64 + i] = 1.0;  // relu(-exp(x)) is 0, and 0 + exp(0)
  }
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-5, "out");
}

// One attention block with a residual, a layer norm and a GELU MLP: every
// engine but GpSimd takes part, and scratch regions are reused across
// engines, so the ordering is exercised (run it under
// TERN_SIM_SCHEDULE=random:SEED too).
TEST_F(LowerTest, AttentionBlockMatchesTheReference) {
  constexpr int B = 2, T = 4, D = 8, H = 16;
  const std::vector<float> xs = Values(B * T * D, 81), wq = Values(D * D, 82),
                           wk = Values(D * D, 83), wv = Values(D * D, 84), w1 = Values(H * D, 85),
                           w2 = Values(D * H, 86), b1 = Values(H, 87);
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({B, T, D})));
  auto constant = [&](const char* name, const std::vector<float>& v, Shape shape) {
    return g.AddConstant(name, F32(std::move(shape)), Bytes(v));
  };
  const std::vector<int64_t> swap = {1, 0};
  auto linear = [&](uint32_t in2d, uint32_t weight, const std::string& name) {
    const uint32_t t =
        Out(g, AddNode(&g, "aten.permute.default", {weight}, {A("dims", swap)}, name + "_t"));
    return Out(g, AddNode(&g, "aten.mm.default", {in2d, t}, {}, name));
  };
  const uint32_t x2 =
      Out(g, AddNode(&g, "aten.view.default", {x}, {A("size", S({B * T, D}))}, "x2"));
  auto project = [&](const std::vector<float>& w, const char* name) {
    const uint32_t p = linear(x2, constant(name, w, S({D, D})), name);
    return Out(g, AddNode(&g, "aten.view.default", {p}, {A("size", S({B, T, D}))},
                          std::string(name) + "_3d"));
  };
  const uint32_t q = project(wq, "q"), k = project(wk, "k"), v = project(wv, "v");
  const uint32_t kt = Out(g, AddNode(&g, "aten.permute.default", {k},
                                     {A("dims", std::vector<int64_t>{0, 2, 1})}, "kt"));
  const uint32_t scores = Out(g, AddNode(&g, "aten.bmm.default", {q, kt}, {}, "scores"));
  const uint32_t scaled = Out(g, AddNode(&g, "aten.mul.Tensor", {scores, kNoValue},
                                         {A("other", 1.0 / std::sqrt(double(D)))}, "scaled"));
  const uint32_t probs =
      Out(g, AddNode(&g, "aten._softmax.default", {scaled},
                     {A("dim", int64_t{-1}), A("half_to_float", false)}, "probs"));
  const uint32_t attn = Out(g, AddNode(&g, "aten.bmm.default", {probs, v}, {}, "attn"));
  const uint32_t res = Out(g, AddNode(&g, "aten.add.Tensor", {attn, x}, {}, "residual"));
  absl::StatusOr<uint32_t> ln =
      AddNode(&g, "aten.native_layer_norm.default", {res, kNoValue, kNoValue},
              {A("normalized_shape", std::vector<int64_t>{D}), A("eps", 1e-5)}, "ln");
  ASSERT_TRUE(ln.ok()) << ln.status();
  const uint32_t normed = g.nodes[*ln].outputs[0];
  const uint32_t n2 =
      Out(g, AddNode(&g, "aten.view.default", {normed}, {A("size", S({B * T, D}))}, "n2"));
  const uint32_t w1t = Out(g, AddNode(&g, "aten.permute.default", {constant("w1", w1, S({H, D}))},
                                      {A("dims", swap)}, "w1t"));
  const uint32_t h =
      Out(g, AddNode(&g, "aten.addmm.default", {constant("b1", b1, S({H})), n2, w1t}, {}, "fc1"));
  const uint32_t act = Out(
      g, AddNode(&g, "aten.gelu.default", {h}, {A("approximate", std::string("tanh"))}, "gelu"));
  const uint32_t y2 = linear(act, constant("w2", w2, S({D, H})), "fc2");
  const uint32_t y = Out(g, AddNode(&g, "aten.view.default", {y2}, {A("size", S({B, T, D}))}, "y"));
  g.AddOutput("y", y);

  // The reference, in double.
  auto mat = [](const std::vector<double>& a, const std::vector<float>& w, int rows, int in,
                int out) {  // a [rows, in] @ w^T, w [out, in]
    std::vector<double> r(static_cast<size_t>(rows * out), 0.0);
    for (int i = 0; i < rows; ++i) {
      for (int o = 0; o < out; ++o) {
        for (int c = 0; c < in; ++c) r[i * out + o] += a[i * in + c] * w[o * in + c];
      }
    }
    return r;
  };
  const std::vector<double> xd(xs.begin(), xs.end());
  const auto qd = mat(xd, wq, B * T, D, D), kd = mat(xd, wk, B * T, D, D),
             vd = mat(xd, wv, B * T, D, D);
  std::vector<double> normed_d(B * T * D);
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < T; ++i) {
      double p[T], max = -1e300, total = 0;
      for (int j = 0; j < T; ++j) {
        p[j] = 0;
        for (int c = 0; c < D; ++c) p[j] += qd[(b * T + i) * D + c] * kd[(b * T + j) * D + c];
        p[j] /= std::sqrt(double(D));
        max = std::max(max, p[j]);
      }
      for (double& e : p) total += (e = std::exp(e - max));
      double row[D], mean = 0, var = 0;
      for (int c = 0; c < D; ++c) {
        row[c] = xd[(b * T + i) * D + c];
        for (int j = 0; j < T; ++j) row[c] += p[j] / total * vd[(b * T + j) * D + c];
        mean += row[c] / D;
      }
      for (int c = 0; c < D; ++c) var += (row[c] - mean) * (row[c] - mean) / D;
      for (int c = 0; c < D; ++c) {
        normed_d[(b * T + i) * D + c] = (row[c] - mean) / std::sqrt(var + 1e-5);
      }
    }
  }
  auto hd = mat(normed_d, w1, B * T, D, H);
  for (int i = 0; i < B * T; ++i) {
    for (int o = 0; o < H; ++o) {
      const double z = hd[i * H + o] + b1[o];
      hd[i * H + o] =
          0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
    }
  }
  const auto want = mat(hd, w2, B * T, H, D);

  CompileStats stats;
  const auto outputs = Run(g, {Bytes(xs)}, &stats);
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-4, "y");
  EXPECT_GT(stats.instructions_per_engine[TERN_ENGINE_TENSOR], 0u);
  EXPECT_GT(stats.instructions_per_engine[TERN_ENGINE_VECTOR], 0u);
  // The gelu chain is one program, the residual adds matmul epilogues.
  EXPECT_GT(stats.fused_groups + stats.epilogues, 0u);
  EXPECT_LT(stats.compute_instructions, stats.compute_instructions_unfused);
  EXPECT_LE(stats.semaphores, 5u);
  EXPECT_LT(stats.scratch_peak, stats.scratch_naive_sum);
  EXPECT_GE(stats.scratch_peak, stats.scratch_max_live);
}

TEST(MemoryPlanner, BestFitReusesTheSmallestHoleAndGrowsAtTheTop) {
  // 0: [0,640) 1: [640,768) 2: [768,1024); at 1, 0 and 2 die; 3 (100 -> 128
  // bytes) takes 2's 256-byte hole, not 0's 640; 4 (700 -> 704) finds no
  // hole that fits, so it grows the segment from the top free block
  // (768 + 128 = 896).
  const std::vector<ScratchBuffer> buffers = {
      {640, 0, 1}, {128, 0, 3}, {256, 0, 1}, {100, 2, 3}, {700, 2, 3},
  };
  const MemoryPlan plan = PlanScratch(buffers);
  EXPECT_EQ(plan.offsets, (std::vector<uint64_t>{0, 640, 768, 768, 896}));
  EXPECT_EQ(plan.peak, 1600u);  // 896 + 704
  EXPECT_EQ(plan.naive_sum, 640u + 128u + 256u + 128u + 704u);
  EXPECT_EQ(plan.max_live, 1024u);  // 0, 1 and 2 at 0 (1, 3 and 4 at 2: 960)
}

TEST(TensorRefs, ReshapeOfStridedViews) {
  const TensorRef base = TensorRef::Contiguous({BufferRef::kInput, 0}, TERN_DTYPE_F32, {2, 3, 4});
  const TensorRef permuted = base.Permute({2, 0, 1});  // [4, 2, 3] strides [1, 12, 4]
  std::optional<TensorRef> merged = permuted.Reshape({4, 6});
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->strides, (std::vector<int64_t>{1, 4}));
  std::optional<TensorRef> split = permuted.Reshape({4, 1, 2, 3, 1});
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->strides[0], 1);
  EXPECT_EQ(split->strides[2], 12);
  EXPECT_EQ(split->strides[3], 4);
  EXPECT_FALSE(permuted.Reshape({24}).has_value());
  EXPECT_FALSE(permuted.Reshape({8, 3}).has_value());
}

TEST(LowerErrors, SymbolicShapesAreNamed) {
  Graph g;
  g.symbols.push_back({"s0", 1, 128});
  const uint32_t x = g.AddInput("tokens", {TERN_DTYPE_F32, {Dim::Of(0), Dim::Constant(4)}});
  const uint32_t r = Out(g, AddNode(&g, "aten.relu.default", {x}, {}, "relu"));
  g.AddOutput("out", r);
  absl::StatusOr<std::vector<uint8_t>> result = CompileGraph(g, {}, nullptr);
  ASSERT_FALSE(result.ok());
  EXPECT_CONTAINS(result.status().message(), "'tokens'");
  EXPECT_CONTAINS(result.status().message(), "[s0, 4]");
  EXPECT_CONTAINS(result.status().message(), "symbolic shapes are not lowered yet");
}

TEST(LowerErrors, UnsupportedOpsAreNamedWithTheirSource) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4})));
  const uint32_t node = g.AddNodeWithTypes("aten.cumsum.default", {x}, {}, {F32(S({4}))},
                                           "cumsum_3", "model.py:7 in forward");
  g.AddOutput("out", g.nodes[node].outputs[0]);
  absl::StatusOr<LoweredProgram> lowered = LowerGraph(g);
  ASSERT_FALSE(lowered.ok());
  EXPECT_CONTAINS(lowered.status().message(), "cumsum_3");
  EXPECT_CONTAINS(lowered.status().message(), "model.py:7");
  EXPECT_CONTAINS(lowered.status().message(), "not supported by the compiler yet");
}

TEST(LowerErrors, NewOpsRefuseWhatTheyCannotLower) {
  Graph g;
  const uint32_t small = g.AddInput("small", {TERN_DTYPE_I8, S({3})});
  const uint32_t x = g.AddInput("x", F32(S({3})));
  const uint32_t big = g.AddInput("big", {TERN_DTYPE_I64, S({3})});
  auto lower = [](Graph graph, uint32_t value) {
    graph.AddOutput("out", value);
    return LowerGraph(graph).status();
  };
  const uint32_t pad =
      Out(g, AddNode(&g, "aten.constant_pad_nd.default", {small},
                     {A("pad", std::vector<int64_t>{1, 1}), A("value", int64_t{300})}, "pad"));
  EXPECT_CONTAINS(lower(g, pad).message(),
                  "node 'pad' (aten.constant_pad_nd.default): the value "
                  "300 does not fit its dtype i8");
  const uint32_t endless =
      Out(g, AddNode(&g, "aten.constant_pad_nd.default", {big},
                     {A("pad", std::vector<int64_t>{1, 0}), A("value", double(INFINITY))}, "inf"));
  EXPECT_CONTAINS(lower(g, endless).message(), "the value inf does not fit its dtype i64");
  const uint32_t at = g.AddInput("at", {TERN_DTYPE_I64, S({1})});
  const uint32_t scatter = Out(
      g, AddNode(&g, "aten.scatter.value", {small, at}, {A("value", int64_t{-129})}, "scatter"));
  EXPECT_CONTAINS(lower(g, scatter).message(),
                  "node 'scatter' (aten.scatter.value): the value -129 does not fit its dtype i8");
  const uint32_t nan_bound =
      Out(g, AddNode(&g, "aten.clamp_min.default", {x}, {A("min", double(NAN))}, "nan_min"));
  EXPECT_CONTAINS(lower(g, nan_bound).message(), "a NaN bound is not lowered");
  const uint32_t wide_bound = Out(
      g, AddNode(&g, "aten.clamp_max.default", {big}, {A("max", int64_t{1} << 60)}, "wide_max"));
  EXPECT_CONTAINS(lower(g, wide_bound).message(), "its bound 1152921504606846976 is beyond 2^53");
}

// ---- The ternc command ----------------------------------------------------------------

class TerncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ternc-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs ternc with `args`; returns its exit status, stdout and stderr.
  int Ternc(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
    const std::string command =
        std::string(TERNC_PATH) + " " + args + " >'" + dir_ + "/stdout' 2>'" + dir_ + "/stderr'";
    const int status = std::system(command.c_str());
    if (out != nullptr) *out = Slurp(dir_ + "/stdout");
    if (err != nullptr) *err = Slurp(dir_ + "/stderr");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  static std::string Slurp(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }

  std::string dir_;
};

TEST_F(TerncTest, CompilesTheSameBytesAsTheLibraryAndPrintsStats) {
  const Graph graph = Mlp().Build();
  ASSERT_TRUE(WriteGraphFile(graph, dir_ + "/mlp.ternir").ok());
  std::string out, err;
  ASSERT_EQ(
      Ternc("compile '" + dir_ + "/mlp.ternir' -o '" + dir_ + "/mlp.tern' --stats", &out, &err), 0)
      << err;
  EXPECT_CONTAINS(out, "semaphores:");
  EXPECT_CONTAINS(out, "scratch peak:");
  EXPECT_CONTAINS(out, "tensor");
  absl::StatusOr<std::vector<uint8_t>> bytes = CompileGraph(graph, {}, nullptr);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string written = Slurp(dir_ + "/mlp.tern");
  EXPECT_EQ(written, std::string(bytes->begin(), bytes->end()));

  ASSERT_EQ(Ternc("inspect '" + dir_ + "/mlp.ternir'", &out, &err), 0) << err;
  EXPECT_CONTAINS(out, "aten.addmm.default");
  EXPECT_CONTAINS(out, "fc1 @ model.py:10 in forward");
  EXPECT_CONTAINS(out, "x: f32 [4, 8]");
}

TEST_F(TerncTest, ExitCodesSayWhatWentWrong) {
  std::string out, err;
  EXPECT_EQ(Ternc("--help", &out), 0);
  EXPECT_CONTAINS(out, "ternc compile");
  EXPECT_EQ(Ternc("", nullptr, &err), 64);
  EXPECT_EQ(Ternc("compile '" + dir_ + "/missing.ternir'", nullptr, &err), 64);
  EXPECT_CONTAINS(err, "-o");
  EXPECT_EQ(Ternc("frobnicate", nullptr, &err), 64);
  // The list the compiler's "does not know this operator" error points to.
  EXPECT_EQ(Ternc("ops", &out), 0);
  EXPECT_CONTAINS(out, "aten.addmm.default\n");
  EXPECT_CONTAINS(out, "aten.convolution.default\n");
  EXPECT_EQ(Ternc("ops extra", nullptr, &err), 64);
  EXPECT_EQ(Ternc("compile '" + dir_ + "/missing.ternir' -o '" + dir_ + "/x.tern'", nullptr, &err),
            3);
  EXPECT_CONTAINS(err, "missing.ternir");

  Graph g;
  g.symbols.push_back({"s0", 1, 128});
  const uint32_t x = g.AddInput("tokens", {TERN_DTYPE_F32, {Dim::Of(0), Dim::Constant(4)}});
  g.AddOutput("out", Out(g, AddNode(&g, "aten.exp.default", {x}, {}, "exp")));
  ASSERT_TRUE(WriteGraphFile(g, dir_ + "/dynamic.ternir").ok());
  EXPECT_EQ(Ternc("compile '" + dir_ + "/dynamic.ternir' -o '" + dir_ + "/d.tern'", nullptr, &err),
            1);
  EXPECT_CONTAINS(err, "symbolic shapes are not lowered yet");
  EXPECT_NE(access((dir_ + "/d.tern").c_str(), F_OK), 0) << "nothing is written on failure";
}

// ---- Convolutions, batch norm and pooling (ResNet-style CNNs) ------------------------

using Ints = std::vector<int64_t>;

// Plain-loop references over NCHW f32 tensors.
struct Conv2dParams {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
};

std::vector<double> Conv2dReference(const std::vector<float>& x, Ints x_shape,
                                    const std::vector<float>& w, Ints w_shape,
                                    const std::vector<float>* bias, Conv2dParams p) {
  const int64_t n = x_shape[0], c = x_shape[1], h = x_shape[2], wd = x_shape[3];
  const int64_t o = w_shape[0], cg = w_shape[1], kh = w_shape[2], kw = w_shape[3];
  const int64_t oh = (h + 2 * p.padding - p.dilation * (kh - 1) - 1) / p.stride + 1;
  const int64_t ow = (wd + 2 * p.padding - p.dilation * (kw - 1) - 1) / p.stride + 1;
  const int64_t per_group = o / p.groups;
  std::vector<double> y(static_cast<size_t>(n * o * oh * ow));
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oc = 0; oc < o; ++oc) {
      const int64_t first_channel = (oc / per_group) * cg;
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double sum = bias ? (*bias)[oc] : 0.0;
          for (int64_t ic = 0; ic < cg; ++ic) {
            for (int64_t u = 0; u < kh; ++u) {
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t row = i * p.stride - p.padding + u * p.dilation;
                const int64_t col = j * p.stride - p.padding + v * p.dilation;
                if (row < 0 || row >= h || col < 0 || col >= wd) continue;
                sum += double(x[((b * c + first_channel + ic) * h + row) * wd + col]) *
                       w[((oc * cg + ic) * kh + u) * kw + v];
              }
            }
          }
          y[((b * o + oc) * oh + i) * ow + j] = sum;
        }
      }
    }
  }
  return y;
}

// y = (x - mean) / sqrt(var + eps) * weight + bias per channel (dim 1).
std::vector<double> BatchNormReference(const std::vector<double>& x, Ints shape,
                                       const std::vector<float>& weight,
                                       const std::vector<float>& bias,
                                       const std::vector<float>& mean,
                                       const std::vector<float>& var, double eps) {
  std::vector<double> y(x.size());
  const int64_t c = shape[1], inner = shape[2] * shape[3];
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t ch = static_cast<size_t>((static_cast<int64_t>(i) / inner) % c);
    y[i] = (x[i] - mean[ch]) / std::sqrt(double(var[ch]) + eps) * weight[ch] + bias[ch];
  }
  return y;
}

std::vector<double> MaxPoolReference(const std::vector<double>& x, Ints shape, int64_t kernel,
                                     int64_t stride, int64_t padding) {
  const int64_t nc = shape[0] * shape[1], h = shape[2], w = shape[3];
  const int64_t oh = (h + 2 * padding - kernel) / stride + 1;
  const int64_t ow = (w + 2 * padding - kernel) / stride + 1;
  std::vector<double> y(static_cast<size_t>(nc * oh * ow));
  for (int64_t plane = 0; plane < nc; ++plane) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double best = -INFINITY;
        for (int64_t u = 0; u < kernel; ++u) {
          for (int64_t v = 0; v < kernel; ++v) {
            const int64_t row = i * stride - padding + u, col = j * stride - padding + v;
            if (row >= 0 && row < h && col >= 0 && col < w) {
              best = std::max(best, x[(plane * h + row) * w + col]);
            }
          }
        }
        y[(plane * oh + i) * ow + j] = best;
      }
    }
  }
  return y;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<Attribute> ConvAttrs(Conv2dParams p) {
  return {A("stride", Ints{p.stride, p.stride}),
          A("padding", Ints{p.padding, p.padding}),
          A("dilation", Ints{p.dilation, p.dilation}),
          A("transposed", false),
          A("output_padding", Ints{0, 0}),
          A("groups", p.groups)};
}

std::vector<Attribute> PoolAttrs(int64_t kernel, int64_t stride, int64_t padding) {
  return {A("kernel_size", Ints{kernel, kernel}), A("stride", Ints{stride, stride}),
          A("padding", Ints{padding, padding})};
}

TEST_F(LowerTest, Conv2dMatchesTheReference) {
  struct Case {
    Ints x_shape, w_shape;
    Conv2dParams params;
    bool bias;
  };
  const Case cases[] = {
      {{2, 3, 9, 9}, {4, 3, 3, 3}, {2, 1, 1, 1}, true},   // a ResNet stem
      {{1, 4, 7, 6}, {6, 2, 3, 2}, {1, 2, 2, 2}, false},  // grouped, dilated, padded
  };
  uint32_t seed = 200;
  for (const Case& c : cases) {
    const std::vector<float> x =
        Values(size_t(c.x_shape[0] * c.x_shape[1] * c.x_shape[2] * c.x_shape[3]), seed++);
    const std::vector<float> w =
        Values(size_t(c.w_shape[0] * c.w_shape[1] * c.w_shape[2] * c.w_shape[3]), seed++);
    const std::vector<float> b = Values(size_t(c.w_shape[0]), seed++);
    Graph g;
    const uint32_t xv =
        g.AddInput("x", F32(S({c.x_shape[0], c.x_shape[1], c.x_shape[2], c.x_shape[3]})));
    std::vector<uint32_t> inputs = {
        xv, g.AddConstant("w", F32(S({c.w_shape[0], c.w_shape[1], c.w_shape[2], c.w_shape[3]})),
                          Bytes(w))};
    if (c.bias) inputs.push_back(g.AddConstant("b", F32(S({c.w_shape[0]})), Bytes(b)));
    g.AddOutput(
        "y", Out(g, AddNode(&g, "aten.convolution.default", inputs, ConvAttrs(c.params), "conv")));
    const auto outputs = Run(g, {Bytes(x)});
    ASSERT_EQ(outputs.size(), 1u);
    ExpectNear(outputs[0],
               Conv2dReference(x, c.x_shape, w, c.w_shape, c.bias ? &b : nullptr, c.params), 1e-5,
               "conv");
  }
}

struct BatchNormParams {
  std::vector<float> weight, bias, mean, var;
  explicit BatchNormParams(size_t channels, uint32_t seed)
      : weight(Values(channels, seed)),
        bias(Values(channels, seed + 1)),
        mean(Values(channels, seed + 2)),
        var(Values(channels, seed + 3)) {
    for (float& v : var) v = v + 1.5f;  // positive variances
  }
  std::vector<uint32_t> Constants(Graph* g, const std::string& prefix) const {
    const int64_t c = static_cast<int64_t>(weight.size());
    return {g->AddConstant(prefix + ".weight", F32(S({c})), Bytes(weight)),
            g->AddConstant(prefix + ".bias", F32(S({c})), Bytes(bias)),
            g->AddConstant(prefix + ".running_mean", F32(S({c})), Bytes(mean)),
            g->AddConstant(prefix + ".running_var", F32(S({c})), Bytes(var))};
  }
};

uint32_t AddBatchNorm(Graph* g, uint32_t x, const std::vector<uint32_t>& params,
                      const std::string& name) {
  std::vector<uint32_t> inputs = {x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  return Out(*g, AddNode(g, "aten._native_batch_norm_legit_no_training.default", inputs,
                         {A("momentum", 0.1), A("eps", 1e-5)}, name));
}

TEST_F(LowerTest, BatchNormWithConstantsIsScaleAndShift) {
  const Ints shape = {2, 3, 4, 5};
  const std::vector<float> x = Values(2 * 3 * 4 * 5, 300);
  const BatchNormParams bn(3, 301);
  Graph g;
  const uint32_t xv = g.AddInput("x", F32(S({2, 3, 4, 5})));
  g.AddOutput("y", AddBatchNorm(&g, xv, bn.Constants(&g, "bn"), "bn"));
  absl::StatusOr<LoweredProgram> lowered = LowerGraph(g);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  // Scale and shift are computed at compile time: a multiply and an add.
  EXPECT_EQ(lowered->instructions.size(), 2u);
  const auto outputs = Run(g, {Bytes(x)});
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0],
             BatchNormReference(ToDouble(x), shape, bn.weight, bn.bias, bn.mean, bn.var, 1e-5),
             1e-5, "bn");
}

TEST_F(LowerTest, BatchNormWithRuntimeStatisticsMatchesTheReference) {
  const Ints shape = {2, 3, 4, 5};
  const std::vector<float> x = Values(2 * 3 * 4 * 5, 310);
  const BatchNormParams bn(3, 311);
  Graph g;
  const uint32_t xv = g.AddInput("x", F32(S({2, 3, 4, 5})));
  const uint32_t mean = g.AddInput("mean", F32(S({3})));
  const uint32_t var = g.AddInput("var", F32(S({3})));
  std::vector<uint32_t> params = bn.Constants(&g, "bn");
  params[2] = mean;
  params[3] = var;
  g.AddOutput("y", AddBatchNorm(&g, xv, params, "bn"));
  const auto outputs = Run(g, {Bytes(x), Bytes(bn.mean), Bytes(bn.var)});
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0],
             BatchNormReference(ToDouble(x), shape, bn.weight, bn.bias, bn.mean, bn.var, 1e-5),
             1e-5, "bn");
}

TEST_F(LowerTest, BatchNormIsFoldedIntoItsConvolution) {
  const Ints x_shape = {1, 3, 6, 6}, w_shape = {4, 3, 3, 3};
  const std::vector<float> x = Values(3 * 36, 320), w = Values(4 * 27, 321);
  const BatchNormParams bn(4, 322);
  const Conv2dParams p{1, 1, 1, 1};
  Graph g;
  const uint32_t xv = g.AddInput("x", F32(S({1, 3, 6, 6})));
  const uint32_t wv = g.AddConstant("w", F32(S({4, 3, 3, 3})), Bytes(w));
  const uint32_t conv = Out(g, AddNode(&g, "aten.convolution.default", {xv, wv}, ConvAttrs(p)));
  g.AddOutput("y", AddBatchNorm(&g, conv, bn.Constants(&g, "bn"), "bn"));
  absl::StatusOr<LoweredProgram> lowered = LowerGraph(g);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  ASSERT_EQ(lowered->instructions.size(), 1u);
  EXPECT_EQ(lowered->instructions[0].opcode, TERN_OP_CONV2D);
  // Only the folded weight and bias are stored, not the originals.
  EXPECT_EQ(lowered->constants.stored_bytes(), (4u * 27u + 4u) * 4u);
  const auto outputs = Run(g, {Bytes(x)});
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0],
             BatchNormReference(Conv2dReference(x, x_shape, w, w_shape, nullptr, p), {1, 4, 6, 6},
                                bn.weight, bn.bias, bn.mean, bn.var, 1e-5),
             1e-5, "conv+bn");
}

TEST_F(LowerTest, BatchNormIsNotFoldedWhenTheConvolutionIsReadElsewhere) {
  const std::vector<float> x = Values(3 * 16, 330), w = Values(2 * 3, 331);
  const BatchNormParams bn(2, 332);
  Graph g;
  const uint32_t xv = g.AddInput("x", F32(S({1, 3, 4, 4})));
  const uint32_t wv = g.AddConstant("w", F32(S({2, 3, 1, 1})), Bytes(w));
  const uint32_t conv = Out(g, AddNode(&g, "aten.convolution.default", {xv, wv}, ConvAttrs({})));
  g.AddOutput("y", AddBatchNorm(&g, conv, bn.Constants(&g, "bn"), "bn"));
  g.AddOutput("conv", conv);
  const auto outputs = Run(g, {Bytes(x)});
  ASSERT_EQ(outputs.size(), 2u);
  const std::vector<double> conv_want =
      Conv2dReference(x, {1, 3, 4, 4}, w, {2, 3, 1, 1}, nullptr, {});
  ExpectNear(outputs[1], conv_want, 1e-5, "conv");
  ExpectNear(outputs[0],
             BatchNormReference(conv_want, {1, 2, 4, 4}, bn.weight, bn.bias, bn.mean, bn.var, 1e-5),
             1e-5, "bn");
}

TEST_F(LowerTest, MaxPoolMatchesTheReference) {
  struct Case {
    int64_t kernel, stride, padding;
  };
  const Ints shape = {2, 3, 7, 8};
  const std::vector<float> x = Values(2 * 3 * 7 * 8, 340);
  for (const Case& c : {Case{3, 2, 1}, Case{2, 2, 0}, Case{3, 1, 0}}) {
    Graph g;
    const uint32_t xv = g.AddInput("x", F32(S({2, 3, 7, 8})));
    g.AddOutput("y", Out(g, AddNode(&g, "aten.max_pool2d_with_indices.default", {xv},
                                    PoolAttrs(c.kernel, c.stride, c.padding), "pool")));
    const auto outputs = Run(g, {Bytes(x)});
    ASSERT_EQ(outputs.size(), 1u);
    ExpectNear(outputs[0], MaxPoolReference(ToDouble(x), shape, c.kernel, c.stride, c.padding), 0.0,
               "pool k" + std::to_string(c.kernel) + " s" + std::to_string(c.stride) + " p" +
                   std::to_string(c.padding));
  }
}

TEST(LowerErrors, UnsupportedConvolutionsAndPoolsAreNamed) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({1, 2, 8, 8})));
  const uint32_t w = g.AddConstant("w", F32(S({2, 2, 3, 3})), std::vector<uint8_t>(72 * 4));
  std::vector<Attribute> transposed = ConvAttrs({});
  transposed[3] = A("transposed", true);
  absl::StatusOr<uint32_t> node =
      AddNode(&g, "aten.convolution.default", {x, w}, transposed, "deconv");
  ASSERT_FALSE(node.ok());
  EXPECT_CONTAINS(node.status().message(), "deconv");
  EXPECT_CONTAINS(node.status().message(), "transposed convolution");

  const uint32_t x1d = g.AddInput("x1d", F32(S({1, 2, 8})));
  const uint32_t w1d = g.AddConstant("w1d", F32(S({2, 2, 3})), std::vector<uint8_t>(12 * 4));
  node = AddNode(&g, "aten.convolution.default", {x1d, w1d}, ConvAttrs({}), "conv1d");
  ASSERT_FALSE(node.ok());
  EXPECT_CONTAINS(node.status().message(), "conv1d");
  EXPECT_CONTAINS(node.status().message(), "only 2-D convolutions");

  std::vector<Attribute> ceil = PoolAttrs(2, 2, 0);
  ceil.push_back(A("ceil_mode", true));
  node = AddNode(&g, "aten.max_pool2d_with_indices.default", {x}, ceil, "pool_ceil");
  ASSERT_FALSE(node.ok());
  EXPECT_CONTAINS(node.status().message(), "pool_ceil");
  EXPECT_CONTAINS(node.status().message(), "ceil_mode=True");

  // The indices output is not computed.
  absl::StatusOr<uint32_t> pool =
      AddNode(&g, "aten.max_pool2d_with_indices.default", {x}, PoolAttrs(2, 2, 0), "pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  g.AddOutput("indices", g.nodes[*pool].outputs[1]);
  absl::StatusOr<LoweredProgram> lowered = LowerGraph(g);
  ASSERT_FALSE(lowered.ok());
  EXPECT_CONTAINS(lowered.status().message(), "pool");
  EXPECT_CONTAINS(lowered.status().message(), "indices");
}

// stem conv (stride 2) -> bn -> relu -> max pool -> residual block (conv, bn,
// relu, conv, bn, + skip, relu) -> mean over H, W -> flatten -> linear, as
// torch.export gives nn.Conv2d/BatchNorm2d/MaxPool2d/AdaptiveAvgPool2d(1).
TEST_F(LowerTest, ResNetStyleCnnMatchesTheReference) {
  constexpr int64_t N = 2, C = 4, H = 12, K = 5;
  const std::vector<float> x = Values(N * 3 * H * H, 400), stem_w = Values(C * 3 * 9, 401),
                           stem_b = Values(C, 402), w1 = Values(C * C * 9, 403),
                           w2 = Values(C * C * 9, 404), fc_w = Values(K * C, 405),
                           fc_b = Values(K, 406);
  const BatchNormParams bn0(C, 410), bn1(C, 420), bn2(C, 430);
  Graph g;
  const uint32_t xv = g.AddInput("x", F32(S({N, 3, H, H})));
  auto conv = [&](uint32_t in, const std::vector<float>& w, Ints shape, const std::vector<float>* b,
                  Conv2dParams p, const std::string& name) {
    std::vector<uint32_t> inputs = {
        in, g.AddConstant(name + ".weight", F32(S({shape[0], shape[1], shape[2], shape[3]})),
                          Bytes(w))};
    if (b) inputs.push_back(g.AddConstant(name + ".bias", F32(S({shape[0]})), Bytes(*b)));
    return Out(g, AddNode(&g, "aten.convolution.default", inputs, ConvAttrs(p), name));
  };
  auto relu = [&](uint32_t in, const std::string& name) {
    return Out(g, AddNode(&g, "aten.relu.default", {in}, {}, name));
  };
  const Conv2dParams stem_p{2, 1, 1, 1}, same{1, 1, 1, 1};
  const uint32_t s0 = conv(xv, stem_w, {C, 3, 3, 3}, &stem_b, stem_p, "stem");
  const uint32_t r0 = relu(AddBatchNorm(&g, s0, bn0.Constants(&g, "bn0"), "bn0"), "relu0");
  const uint32_t pool =
      Out(g, AddNode(&g, "aten.max_pool2d_with_indices.default", {r0}, PoolAttrs(3, 2, 1), "pool"));
  const uint32_t c1 = conv(pool, w1, {C, C, 3, 3}, nullptr, same, "conv1");
  const uint32_t r1 = relu(AddBatchNorm(&g, c1, bn1.Constants(&g, "bn1"), "bn1"), "relu1");
  const uint32_t c2 = conv(r1, w2, {C, C, 3, 3}, nullptr, same, "conv2");
  const uint32_t b2 = AddBatchNorm(&g, c2, bn2.Constants(&g, "bn2"), "bn2");
  const uint32_t sum = Out(g, AddNode(&g, "aten.add.Tensor", {b2, pool}, {}, "add"));
  const uint32_t r2 = relu(sum, "relu2");
  const uint32_t mean = Out(
      g, AddNode(&g, "aten.mean.dim", {r2}, {A("dim", Ints{-1, -2}), A("keepdim", true)}, "mean"));
  const uint32_t flat = Out(g, AddNode(&g, "aten.view.default", {mean}, {A("size", S({N, C}))}));
  const uint32_t fc_t = Out(g, AddNode(&g, "aten.permute.default",
                                       {g.AddConstant("fc.weight", F32(S({K, C})), Bytes(fc_w))},
                                       {A("dims", Ints{1, 0})}, "fc_t"));
  g.AddOutput(
      "logits",
      Out(g, AddNode(&g, "aten.addmm.default",
                     {g.AddConstant("fc.bias", F32(S({K})), Bytes(fc_b)), flat, fc_t}, {}, "fc")));

  // The reference, step by step.
  auto relu_ref = [](std::vector<double> v) {
    for (double& e : v) e = std::max(e, 0.0);
    return v;
  };
  auto to_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  const int64_t h0 = H / 2, h1 = h0 / 2;
  const std::vector<double> a0 = relu_ref(
      BatchNormReference(Conv2dReference(x, {N, 3, H, H}, stem_w, {C, 3, 3, 3}, &stem_b, stem_p),
                         {N, C, h0, h0}, bn0.weight, bn0.bias, bn0.mean, bn0.var, 1e-5));
  const std::vector<double> p0 = MaxPoolReference(a0, {N, C, h0, h0}, 3, 2, 1);
  const std::vector<double> a1 = relu_ref(BatchNormReference(
      Conv2dReference(to_float(p0), {N, C, h1, h1}, w1, {C, C, 3, 3}, nullptr, same),
      {N, C, h1, h1}, bn1.weight, bn1.bias, bn1.mean, bn1.var, 1e-5));
  std::vector<double> a2 = BatchNormReference(
      Conv2dReference(to_float(a1), {N, C, h1, h1}, w2, {C, C, 3, 3}, nullptr, same),
      {N, C, h1, h1}, bn2.weight, bn2.bias, bn2.mean, bn2.var, 1e-5);
  for (size_t i = 0; i < a2.size(); ++i) a2[i] = std::max(a2[i] + p0[i], 0.0);
  std::vector<double> want(N * K);
  for (int64_t b = 0; b < N; ++b) {
    for (int64_t k = 0; k < K; ++k) {
      double y = fc_b[k];
      for (int64_t c = 0; c < C; ++c) {
        double avg = 0;
        for (int64_t i = 0; i < h1 * h1; ++i) avg += a2[(b * C + c) * h1 * h1 + i];
        y += avg / double(h1 * h1) * fc_w[k * C + c];
      }
      want[b * K + k] = y;
    }
  }

  CompileStats stats;
  const auto outputs = Run(g, {Bytes(x)}, &stats);
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-4, "logits");
  // Three convolutions (the batch norms folded in) and the linear layer.
  EXPECT_EQ(stats.instructions_per_engine[TERN_ENGINE_TENSOR], 4u);
}

// --- fusion (compiler/lower/fusion.h) -----------------------------------------------

// y1 = x * w + b is both a graph output and read by y2 = relu(y1) * 0.5 - x:
// one program storing both; the same bits as one instruction per op.
TEST_F(LowerTest, ElementwiseChainBecomesOneProgramWithTheSameBits) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({6, 70})));
  const std::vector<float> ws = Values(70, 61), bs = Values(6 * 70, 62), xs = Values(6 * 70, 63);
  const uint32_t w = g.AddConstant("w", F32(S({70})), Bytes(ws));
  const uint32_t b = g.AddInput("b", F32(S({6, 70})));
  const uint32_t m = Out(g, AddNode(&g, "aten.mul.Tensor", {x, w}, {}, "mul"));
  const uint32_t y1 = Out(g, AddNode(&g, "aten.add.Tensor", {m, b}, {}, "add"));
  const uint32_t r = Out(g, AddNode(&g, "aten.relu.default", {y1}, {}, "relu"));
  const uint32_t h =
      Out(g, AddNode(&g, "aten.mul.Tensor", {r, kNoValue}, {A("other", 0.5)}, "half"));
  const uint32_t y2 = Out(g, AddNode(&g, "aten.sub.Tensor", {h, x}, {}, "sub"));
  g.AddOutput("y1", y1);
  g.AddOutput("y2", y2);
  CompileStats fused, unfused;
  const auto a = RunFusedAndUnfused(g, {Bytes(xs), Bytes(bs)}, &fused, &unfused);
  ASSERT_EQ(a.size(), 2u);
  std::vector<double> want(6 * 70);
  for (int i = 0; i < 6 * 70; ++i) {
    const float v = xs[i] * ws[i % 70] + bs[i];
    want[i] = (v > 0 ? v : 0.0f) * 0.5f - xs[i];
  }
  ExpectNear(a[1], want, 1e-6, "y2");
  EXPECT_EQ(unfused.compute_instructions, 5u);
  EXPECT_EQ(fused.compute_instructions, 1u);
  EXPECT_EQ(fused.fused_groups, 1u);
  EXPECT_EQ(fused.fused_members, 5u);
  // Nothing in scratch: the intermediates live in the program's registers.
  EXPECT_EQ(fused.scratch_peak, 0u);
  EXPECT_GT(unfused.scratch_peak, 0u);
}

// An optimizer's update as a compiled graph lists each step for every
// parameter before the next step (a foreach operator per step): two
// parameters' chains interleaved, the second half of each reading a
// one-element value computed in between. Each chain becomes one program (the
// instructions of the other chain and the scalar passed over, the scalar
// hoisted before the program that reads it), with the unfused bits.
TEST_F(LowerTest, InterleavedChainsBecomeOneProgramEach) {
  Graph g;
  const uint32_t p = g.AddInput("p", F32(S({6, 70})));
  const uint32_t q = g.AddInput("q", F32(S({70})));
  const uint32_t t = g.AddInput("t", F32(S({})));
  const auto scale = [&](uint32_t v, double by, const char* name) {
    return Out(g, AddNode(&g, "aten.mul.Tensor", {v, kNoValue}, {A("other", by)}, name));
  };
  const uint32_t p1 = scale(p, 0.75, "p_decay");
  const uint32_t q1 = scale(q, 0.75, "q_decay");
  const uint32_t p2 = Out(g, AddNode(&g, "aten.sqrt.default", {p1}, {}, "p_sqrt"));
  const uint32_t q2 = Out(g, AddNode(&g, "aten.sqrt.default", {q1}, {}, "q_sqrt"));
  const uint32_t c = Out(g, AddNode(&g, "aten.add.Tensor", {t, kNoValue}, {A("other", 1.0)}, "c"));
  const uint32_t p3 = Out(g, AddNode(&g, "aten.div.Tensor", {p2, c}, {}, "p_div"));
  const uint32_t q3 = Out(g, AddNode(&g, "aten.div.Tensor", {q2, c}, {}, "q_div"));
  const uint32_t p4 = Out(g, AddNode(&g, "aten.sub.Tensor", {p, p3}, {}, "p_step"));
  const uint32_t q4 = Out(g, AddNode(&g, "aten.sub.Tensor", {q, q3}, {}, "q_step"));
  g.AddOutput("p_new", p4);
  g.AddOutput("q_new", q4);
  g.AddOutput("c", c);
  const std::vector<float> ps = Values(6 * 70, 71), qs = Values(70, 72), ts = {0.5f};
  std::vector<float> pa(ps.size()), qa(qs.size());
  for (size_t k = 0; k < ps.size(); ++k) pa[k] = std::fabs(ps[k]);
  for (size_t k = 0; k < qs.size(); ++k) qa[k] = std::fabs(qs[k]);
  CompileStats fused, unfused;
  const auto a = RunFusedAndUnfused(g, {Bytes(pa), Bytes(qa), Bytes(ts)}, &fused, &unfused);
  ASSERT_EQ(a.size(), 3u);
  std::vector<double> want(pa.size());
  for (size_t k = 0; k < pa.size(); ++k) want[k] = pa[k] - std::sqrt(pa[k] * 0.75f) / 1.5f;
  ExpectNear(a[0], want, 1e-6, "p_new");
  EXPECT_EQ(unfused.compute_instructions, 9u);
  // One program per parameter; the scalar's add stays an instruction.
  EXPECT_EQ(fused.compute_instructions, 3u);
  EXPECT_EQ(fused.fused_groups, 2u);
  EXPECT_EQ(fused.fused_members, 8u);
}

// Mutations run in place: each mutated output bound to its input's memory.
// An optimizer-like update p -= 0.5 * g is written straight there (its
// instruction reads p and writes it in the same layout); q * 2, which the
// graph computes before reading the old q again (q + 1), is computed into
// scratch and copied into its output by a last instruction. Bound to
// memory of their own, the outputs are the same and the inputs unchanged.
TEST_F(LowerTest, MutationsAreWrittenIntoTheirInputs) {
  Graph g;
  const uint32_t p = g.AddInput("p", F32(S({6, 70})));
  const uint32_t grad = g.AddInput("g", F32(S({6, 70})));
  const uint32_t q = g.AddInput("q", F32(S({70})));
  const uint32_t step =
      Out(g, AddNode(&g, "aten.mul.Tensor", {grad, kNoValue}, {A("other", 0.5)}, "step"));
  const uint32_t p_new = Out(g, AddNode(&g, "aten.sub.Tensor", {p, step}, {}, "p_new"));
  const uint32_t q_new =
      Out(g, AddNode(&g, "aten.mul.Tensor", {q, kNoValue}, {A("other", 2.0)}, "q_new"));
  const uint32_t q_old =
      Out(g, AddNode(&g, "aten.add.Tensor", {q, kNoValue}, {A("other", 1.0)}, "q_old"));
  g.AddOutput("p_new", p_new);
  g.AddOutput("q_new", q_new);
  g.AddOutput("q_old_plus_one", q_old);
  g.mutations = {{0, 0}, {2, 1}};
  const std::vector<float> ps = Values(6 * 70, 81), gs = Values(6 * 70, 82), qs = Values(70, 83);
  for (bool fusion : {true, false}) {
    SCOPED_TRACE(fusion ? "fused" : "unfused");
    CompileOptions options;
    options.fusion = fusion;
    CompileStats stats;
    const auto a = Run(g, {Bytes(ps), Bytes(gs), Bytes(qs)}, &stats, options);
    ASSERT_EQ(a.size(), 3u);
    std::vector<double> want_p(ps.size()), want_q(qs.size()), want_old(qs.size());
    for (size_t k = 0; k < ps.size(); ++k) want_p[k] = ps[k] - gs[k] * 0.5f;
    for (size_t k = 0; k < qs.size(); ++k) want_q[k] = qs[k] * 2.0f;
    for (size_t k = 0; k < qs.size(); ++k) want_old[k] = qs[k] + 1.0f;
    ExpectNear(a[0], want_p, 0, "p (in place)");
    ExpectNear(a[1], want_q, 0, "q (copied in)");
    ExpectNear(a[2], want_old, 0, "q + 1 from the old q");
    EXPECT_EQ(stats.mutations_in_place, 1u);
    EXPECT_EQ(stats.mutations_copied, 1u);
    const auto apart = Run(g, {Bytes(ps), Bytes(gs), Bytes(qs)}, nullptr, options, false);
    ASSERT_EQ(apart.size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(BitsOf(apart[k]), BitsOf(a[k])) << "output " << k;
  }
}

// 250 x (relu(x * w_i + b_i) - x): 1,000 elementwise nodes become programs
// of at most 8 inputs (x and three iterations' w_i, b_i: 12 instructions
// each), bit-identical to the unfused executable and to the CPU.
TEST_F(LowerTest, LongChainsAreCutIntoProgramsOfAtMost64Steps) {
  Graph g;
  uint32_t x = g.AddInput("x", F32(S({8, 64})));
  const uint32_t x0 = x;
  for (int i = 0; i < 250; ++i) {
    const uint32_t w = g.AddConstant("w" + std::to_string(i), F32(S({64})), Bytes(Values(64, i)));
    const uint32_t b =
        g.AddConstant("b" + std::to_string(i), F32(S({64})), Bytes(Values(64, 1000 + i)));
    const uint32_t m = Out(g, AddNode(&g, "aten.mul.Tensor", {x, w}, {}, "mul"));
    const uint32_t s = Out(g, AddNode(&g, "aten.add.Tensor", {m, b}, {}, "add"));
    const uint32_t r = Out(g, AddNode(&g, "aten.relu.default", {s}, {}, "relu"));
    x = Out(g, AddNode(&g, "aten.sub.Tensor", {r, x}, {}, "sub"));
  }
  (void)x0;
  g.AddOutput("y", x);
  const std::vector<float> xs = Values(8 * 64, 5);
  CompileStats fused, unfused;
  CompileOptions off;
  off.fusion = false;
  const auto a = Run(g, {Bytes(xs)}, &fused);
  const auto c = Run(g, {Bytes(xs)}, &unfused, off);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(BitsOf(a[0]), BitsOf(c[0]));
  {
    std::vector<float> ref = xs;
    for (int i = 0; i < 250; ++i) {
      const std::vector<float> w = Values(64, i), b = Values(64, 1000 + i);
      for (int e = 0; e < 8 * 64; ++e) {
        const float s = ref[e] * w[e % 64] + b[e % 64];
        ref[e] = (s < 0 ? 0.0f : s) - ref[e];
      }
    }
    EXPECT_EQ(BitsOf(a[0]), BitsOf(ref)) << "fused";
    EXPECT_EQ(BitsOf(c[0]), BitsOf(ref)) << "unfused";
  }
  EXPECT_EQ(unfused.compute_instructions, 1000u);
  EXPECT_LE(fused.compute_instructions, 1000u / 12 + 1);
  EXPECT_EQ(fused.fused_members, 1000u);
}

// fc(x) + residual, then relu: one matmul with a residual and an activation.
TEST_F(LowerTest, ResidualAddAndActivationBecomeTheMatmulsEpilogue) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({5, 12})));
  const uint32_t res = g.AddInput("res", F32(S({5, 7})));
  const std::vector<float> ws = Values(7 * 12, 71), bs = Values(7, 72);
  const uint32_t w = g.AddConstant("w", F32(S({7, 12})), Bytes(ws));
  const uint32_t b = g.AddConstant("b", F32(S({7})), Bytes(bs));
  const std::vector<int64_t> swap = {1, 0};
  const uint32_t wt = Out(g, AddNode(&g, "aten.permute.default", {w}, {A("dims", swap)}, "t"));
  const uint32_t fc = Out(g, AddNode(&g, "aten.addmm.default", {b, x, wt}, {}, "fc"));
  const uint32_t sum = Out(g, AddNode(&g, "aten.add.Tensor", {res, fc}, {}, "add"));
  const uint32_t y = Out(g, AddNode(&g, "aten.relu.default", {sum}, {}, "relu"));
  g.AddOutput("y", y);
  const std::vector<float> xs = Values(5 * 12, 73), rs = Values(5 * 7, 74);
  CompileStats fused, unfused;
  const auto a = RunFusedAndUnfused(g, {Bytes(xs), Bytes(rs)}, &fused, &unfused);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(fused.epilogues, 1u);
  EXPECT_EQ(fused.compute_instructions, 1u);
  EXPECT_EQ(unfused.compute_instructions, 3u);
  EXPECT_EQ(fused.instructions_per_engine[TERN_ENGINE_SYNC], 0u);
  std::vector<double> want(5 * 7);
  for (int i = 0; i < 5; ++i) {
    for (int o = 0; o < 7; ++o) {
      double sum_ = bs[o] + rs[i * 7 + o];
      for (int k = 0; k < 12; ++k) sum_ += double(xs[i * 12 + k]) * ws[o * 12 + k];
      want[i * 7 + o] = sum_ > 0 ? sum_ : 0;
    }
  }
  ExpectNear(a[0], want, 1e-5, "y");
}

// (x @ w) viewed as [1, 5, 7], times 0.25, plus a [1, 5, 7] residual: the
// scale becomes the matmul's alpha (a power of two: exact) and the add its
// residual, through the reshape.
TEST_F(LowerTest, ScaleAndResidualThroughAReshapeJoinTheMatmul) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({5, 12})));
  const uint32_t res = g.AddInput("res", F32(S({1, 5, 7})));
  const std::vector<float> ws = Values(12 * 7, 81);
  const uint32_t w = g.AddConstant("w", F32(S({12, 7})), Bytes(ws));
  const uint32_t mm = Out(g, AddNode(&g, "aten.mm.default", {x, w}, {}, "mm"));
  const uint32_t v =
      Out(g, AddNode(&g, "aten.view.default", {mm}, {A("size", S({1, 5, 7}))}, "view"));
  const uint32_t scaled =
      Out(g, AddNode(&g, "aten.mul.Tensor", {v, kNoValue}, {A("other", 0.25)}, "scale"));
  const uint32_t y = Out(g, AddNode(&g, "aten.add.Tensor", {scaled, res}, {}, "add"));
  g.AddOutput("y", y);
  const std::vector<float> xs = Values(5 * 12, 83), rs = Values(5 * 7, 84);
  CompileStats fused, unfused;
  const auto a = RunFusedAndUnfused(g, {Bytes(xs), Bytes(rs)}, &fused, &unfused);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(fused.epilogues, 1u);
  EXPECT_EQ(fused.compute_instructions, 1u);
  EXPECT_EQ(unfused.compute_instructions, 3u);
}

// Attention's heads merged back: bmm -> permute -> view -> mm. The view of
// the permuted product needs a copy unfused; fused, the bmm writes its
// result in the merged layout and the copy (and its DMA hand-offs) go.
TEST_F(LowerTest, APermutedResultIsWrittenInItsConsumersLayout) {
  constexpr int64_t kHeads = 4, kTokens = 6, kDim = 5;
  Graph g;
  const uint32_t q = g.AddInput("q", F32(S({kHeads, kTokens, 3})));
  const uint32_t k = g.AddInput("k", F32(S({kHeads, 3, kDim})));
  const std::vector<float> ws = Values(kHeads * kDim * 7, 91);
  const uint32_t w = g.AddConstant("w", F32(S({kHeads * kDim, 7})), Bytes(ws));
  const uint32_t heads = Out(g, AddNode(&g, "aten.bmm.default", {q, k}, {}, "bmm"));
  const uint32_t merged = Out(g, AddNode(&g, "aten.permute.default", {heads},
                                         {A("dims", std::vector<int64_t>{1, 0, 2})}, "permute"));
  const uint32_t flat = Out(g, AddNode(&g, "aten.view.default", {merged},
                                       {A("size", S({kTokens, kHeads * kDim}))}, "view"));
  const uint32_t y = Out(g, AddNode(&g, "aten.mm.default", {flat, w}, {}, "proj"));
  g.AddOutput("y", y);
  const std::vector<float> qs = Values(kHeads * kTokens * 3, 92),
                           ks = Values(kHeads * 3 * kDim, 93);
  CompileStats fused, unfused;
  const auto a = RunFusedAndUnfused(g, {Bytes(qs), Bytes(ks)}, &fused, &unfused);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(unfused.instructions_per_engine[TERN_ENGINE_DMA], 1u);
  EXPECT_EQ(fused.instructions_per_engine[TERN_ENGINE_DMA], 0u);
  EXPECT_EQ(fused.instructions_per_engine[TERN_ENGINE_SYNC], 0u);
  EXPECT_EQ(fused.compute_instructions, 2u);
}

// Review regressions. (1) s = (x @ w) * 0.125 is a graph output and also
// feeds s + mask: the scale may not become the matmul's alpha (output 0
// would never be written). (2) addmm with beta 0.5 reads its output (the
// bias copied there) and may not be redirected through the transposing copy
// of the graph output.
TEST_F(LowerTest, FusionKeepsGraphOutputsAndMatmulsThatReadTheirOutput) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4, 6})));
  const uint32_t mask = g.AddInput("mask", F32(S({4, 5})));
  const std::vector<float> ws = Values(6 * 5, 101), bs = Values(5, 102);
  const uint32_t w = g.AddConstant("w", F32(S({6, 5})), Bytes(ws));
  const uint32_t b = g.AddConstant("b", F32(S({5})), Bytes(bs));
  const uint32_t mm = Out(g, AddNode(&g, "aten.mm.default", {x, w}, {}, "mm"));
  const uint32_t s_ =
      Out(g, AddNode(&g, "aten.mul.Tensor", {mm, kNoValue}, {A("other", 0.125)}, "scale"));
  const uint32_t masked = Out(g, AddNode(&g, "aten.add.Tensor", {s_, mask}, {}, "masked"));
  const uint32_t addmm =
      Out(g, AddNode(&g, "aten.addmm.default", {b, x, w}, {A("beta", 0.5)}, "addmm"));
  const uint32_t t = Out(g, AddNode(&g, "aten.permute.default", {addmm},
                                    {A("dims", std::vector<int64_t>{1, 0})}, "t"));
  g.AddOutput("s", s_);
  g.AddOutput("masked", masked);
  g.AddOutput("t", t);
  const std::vector<float> xs = Values(4 * 6, 103), ms = Values(4 * 5, 104);
  CompileStats fused, unfused;
  const auto a = RunFusedAndUnfused(g, {Bytes(xs), Bytes(ms)}, &fused, &unfused);
  ASSERT_EQ(a.size(), 3u);
  std::vector<double> want_s(20), want_t(20);
  for (int i = 0; i < 4; ++i) {
    for (int o = 0; o < 5; ++o) {
      double dot = 0;
      for (int k = 0; k < 6; ++k) dot += double(xs[i * 6 + k]) * ws[k * 5 + o];
      want_s[i * 5 + o] = dot * 0.125;
      want_t[o * 4 + i] = 0.5 * bs[o] + dot;
    }
  }
  ExpectNear(a[0], want_s, 1e-5, "s");
  ExpectNear(a[2], want_t, 1e-5, "t");
}

// ---- Backward ops (what torch.compile's backward graphs keep) -------------------------

// Inputs of a layer norm's backward: x, grad_out, and mean/rstd computed
// from x as the forward does (f32, biased variance, eps 1e-5).
struct LayerNormBackwardCase {
  int64_t rows, len;
  std::vector<float> x, grad, mean, rstd, weight;

  LayerNormBackwardCase(int64_t rows_, int64_t len_, uint32_t seed)
      : rows(rows_),
        len(len_),
        x(Values(rows_ * len_, seed)),
        grad(Values(rows_ * len_, seed + 1)),
        weight(Values(len_, seed + 2)) {
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0, var = 0;
      for (int64_t i = 0; i < len; ++i) m += x[r * len + i] / double(len);
      for (int64_t i = 0; i < len; ++i) {
        var += (x[r * len + i] - m) * (x[r * len + i] - m) / double(len);
      }
      mean.push_back(static_cast<float>(m));
      rstd.push_back(static_cast<float>(1.0 / std::sqrt(var + 1e-5)));
    }
  }

  // PyTorch's formulas, in double: grad_input, grad_weight, grad_bias.
  std::vector<std::vector<double>> Reference(bool weighted) const {
    std::vector<double> gi(rows * len), gw(len, 0.0), gb(len, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> xhat(len), gh(len);
      double mean_gh = 0, mean_ghx = 0;
      for (int64_t i = 0; i < len; ++i) {
        const double g = grad[r * len + i];
        xhat[i] = (double(x[r * len + i]) - mean[r]) * rstd[r];
        gh[i] = weighted ? g * weight[i] : g;
        mean_gh += gh[i] / double(len);
        mean_ghx += gh[i] * xhat[i] / double(len);
        gw[i] += g * xhat[i];
        gb[i] += g;
      }
      for (int64_t i = 0; i < len; ++i) {
        gi[r * len + i] = rstd[r] * (gh[i] - mean_gh - xhat[i] * mean_ghx);
      }
    }
    return {gi, gw, gb};
  }
};

TEST_F(LowerTest, LayerNormBackwardMatchesTheReference) {
  const LayerNormBackwardCase c(6, 8, 41);
  const std::vector<float> bias = Values(8, 45);
  Graph g;
  const uint32_t grad = g.AddInput("grad", F32(S({2, 3, 8})));
  const uint32_t x = g.AddInput("x", F32(S({2, 3, 8})));
  const uint32_t mean = g.AddInput("mean", F32(S({2, 3, 1})));
  const uint32_t rstd = g.AddInput("rstd", F32(S({2, 3, 1})));
  const uint32_t w = g.AddConstant("ln.weight", F32(S({8})), Bytes(c.weight));
  const uint32_t b = g.AddConstant("ln.bias", F32(S({8})), Bytes(bias));
  absl::StatusOr<uint32_t> n =
      AddNode(&g, "aten.native_layer_norm_backward.default", {grad, x, mean, rstd, w, b},
              {A("normalized_shape", std::vector<int64_t>{8}),
               A("output_mask", std::vector<int64_t>{1, 1, 1})},
              "ln_bwd");
  ASSERT_TRUE(n.ok()) << n.status();
  g.AddOutput("grad_input", g.nodes[*n].outputs[0]);
  g.AddOutput("grad_weight", g.nodes[*n].outputs[1]);
  g.AddOutput("grad_bias", g.nodes[*n].outputs[2]);
  CompileStats stats;
  const auto outputs = Run(g, {Bytes(c.grad), Bytes(c.x), Bytes(c.mean), Bytes(c.rstd)}, &stats);
  ASSERT_EQ(outputs.size(), 3u);
  const auto want = c.Reference(true);
  ExpectNear(outputs[0], want[0], 1e-5, "grad_input");
  ExpectNear(outputs[1], want[1], 1e-5, "grad_weight");
  ExpectNear(outputs[2], want[2], 1e-5, "grad_bias");
  // One instruction (the bias is not an operand: its gradient needs none).
  EXPECT_EQ(stats.compute_instructions, 1u);
  EXPECT_EQ(stats.scratch_peak, 0u);
}

TEST_F(LowerTest, LayerNormBackwardComputesOnlyWhatTheMaskAsksFor) {
  // Two normalised dims; the statistics in the leading shape; no bias.
  const LayerNormBackwardCase c(4, 10, 51);
  auto build = [&](std::vector<int64_t> mask, bool weighted) {
    Graph g;
    const uint32_t grad = g.AddInput("grad", F32(S({4, 2, 5})));
    const uint32_t x = g.AddInput("x", F32(S({4, 2, 5})));
    const uint32_t mean = g.AddInput("mean", F32(S({4})));
    const uint32_t rstd = g.AddInput("rstd", F32(S({4})));
    std::vector<uint32_t> inputs = {grad, x, mean, rstd};
    if (weighted) inputs.push_back(g.AddConstant("w", F32(S({2, 5})), Bytes(c.weight)));
    absl::StatusOr<uint32_t> n = AddNode(
        &g, "aten.native_layer_norm_backward.default", inputs,
        {A("normalized_shape", std::vector<int64_t>{2, 5}), A("output_mask", std::move(mask))},
        "ln_bwd");
    EXPECT_TRUE(n.ok()) << n.status();
    return std::make_pair(std::move(g), n.ok() ? *n : 0u);
  };
  const std::vector<std::vector<uint8_t>> inputs = {Bytes(c.grad), Bytes(c.x), Bytes(c.mean),
                                                    Bytes(c.rstd)};
  {
    // Only grad_weight: grad_input goes to scratch, grad_bias is not computed.
    auto [g, n] = build({0, 1, 0}, true);
    EXPECT_EQ(g.values[g.nodes[n].outputs[0]].type, F32(S({0})));
    g.AddOutput("grad_weight", g.nodes[n].outputs[1]);
    CompileStats stats;
    const auto outputs = Run(g, inputs, &stats);
    ASSERT_EQ(outputs.size(), 1u);
    ExpectNear(outputs[0], c.Reference(true)[1], 1e-5, "grad_weight");
    EXPECT_EQ(stats.scratch_peak, 192u);  // grad_input's 160 bytes, 64-byte aligned
  }
  {
    // Only grad_input, without a weight.
    auto [g, n] = build({1, 0, 0}, false);
    g.AddOutput("grad_input", g.nodes[n].outputs[0]);
    const auto outputs = Run(g, inputs);
    ASSERT_EQ(outputs.size(), 1u);
    ExpectNear(outputs[0], c.Reference(false)[0], 1e-5, "grad_input");
  }
  // An output PyTorch gives as None cannot be used.
  for (const auto& [mask, weighted, used, what] :
       {std::make_tuple(std::vector<int64_t>{1, 1, 0}, true, 2, "grad_bias"),
        std::make_tuple(std::vector<int64_t>{1, 1, 1}, false, 1, "grad_weight"),
        std::make_tuple(std::vector<int64_t>{0, 1, 1}, true, 0, "grad_input")}) {
    auto [g, n] = build(mask, weighted);
    g.AddOutput("used", g.nodes[n].outputs[static_cast<size_t>(used)]);
    absl::StatusOr<std::vector<uint8_t>> compiled = CompileGraph(g, {}, nullptr);
    ASSERT_FALSE(compiled.ok()) << what;
    EXPECT_CONTAINS(compiled.status().message(), "node 'ln_bwd'");
    EXPECT_CONTAINS(compiled.status().message(),
                    std::string("uses its ") + what + " output, which is None in PyTorch");
  }
}

// The gradients of a convolution, in double: grad_input, grad_weight and
// grad_bias (the sum of grad_out over N, H, W).
std::vector<std::vector<double>> ConvBackwardReference(const std::vector<float>& grad, Ints g_shape,
                                                       const std::vector<float>& x, Ints x_shape,
                                                       const std::vector<float>& w, Ints w_shape,
                                                       Conv2dParams p) {
  const int64_t n = x_shape[0], c = x_shape[1], h = x_shape[2], wd = x_shape[3];
  const int64_t o = w_shape[0], cpg = w_shape[1], kh = w_shape[2], kw = w_shape[3];
  const int64_t oh = g_shape[2], ow = g_shape[3], opg = o / p.groups;
  std::vector<double> gi(x.size(), 0.0), gw(w.size(), 0.0), gb(static_cast<size_t>(o), 0.0);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oc = 0; oc < o; ++oc) {
      const int64_t group = oc / opg;
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          const double go = grad[static_cast<size_t>(((b * o + oc) * oh + i) * ow + j)];
          gb[static_cast<size_t>(oc)] += go;
          for (int64_t ci = 0; ci < cpg; ++ci) {
            const int64_t ic = group * cpg + ci;
            for (int64_t u = 0; u < kh; ++u) {
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t row = i * p.stride - p.padding + u * p.dilation;
                const int64_t col = j * p.stride - p.padding + v * p.dilation;
                if (row < 0 || row >= h || col < 0 || col >= wd) continue;
                const size_t xi = static_cast<size_t>(((b * c + ic) * h + row) * wd + col);
                const size_t wi = static_cast<size_t>(((oc * cpg + ci) * kh + u) * kw + v);
                gi[xi] += go * w[wi];
                gw[wi] += go * x[xi];
              }
            }
          }
        }
      }
    }
  }
  return {gi, gw, gb};
}

std::vector<Attribute> ConvBackwardAttrs(Conv2dParams p, int64_t out_channels,
                                         std::vector<int64_t> mask) {
  std::vector<Attribute> attrs = ConvAttrs(p);
  attrs.push_back(A("bias_sizes", Ints{out_channels}));
  attrs.push_back(A("output_mask", std::move(mask)));
  return attrs;
}

TEST_F(LowerTest, ConvolutionBackwardMatchesTheReference) {
  struct Case {
    Ints x_shape, w_shape, g_shape;
    Conv2dParams params;
  };
  const Case cases[] = {
      {{2, 3, 7, 7}, {4, 3, 3, 3}, {2, 4, 4, 4}, {2, 1, 1, 1}},  // strided, padded
      {{1, 4, 7, 6}, {6, 2, 3, 2}, {1, 6, 5, 6}, {1, 1, 2, 2}},  // grouped, dilated
  };
  uint32_t seed = 700;
  for (const Case& c : cases) {
    auto count = [](const Ints& s) { return static_cast<size_t>(s[0] * s[1] * s[2] * s[3]); };
    const std::vector<float> x = Values(count(c.x_shape), seed++);
    const std::vector<float> w = Values(count(c.w_shape), seed++);
    const std::vector<float> grad = Values(count(c.g_shape), seed++);
    auto shape = [](const Ints& s) { return S({s[0], s[1], s[2], s[3]}); };
    Graph g;
    const uint32_t gv = g.AddInput("grad", F32(shape(c.g_shape)));
    const uint32_t xv = g.AddInput("x", F32(shape(c.x_shape)));
    const uint32_t wv = g.AddInput("w", F32(shape(c.w_shape)));
    absl::StatusOr<uint32_t> n =
        AddNode(&g, "aten.convolution_backward.default", {gv, xv, wv},
                ConvBackwardAttrs(c.params, c.w_shape[0], {1, 1, 1}), "conv_bwd");
    ASSERT_TRUE(n.ok()) << n.status();
    g.AddOutput("grad_input", g.nodes[*n].outputs[0]);
    g.AddOutput("grad_weight", g.nodes[*n].outputs[1]);
    g.AddOutput("grad_bias", g.nodes[*n].outputs[2]);
    CompileStats stats;
    const auto outputs = Run(g, {Bytes(grad), Bytes(x), Bytes(w)}, &stats);
    ASSERT_EQ(outputs.size(), 3u);
    const auto want = ConvBackwardReference(grad, c.g_shape, x, c.x_shape, w, c.w_shape, c.params);
    ExpectNear(outputs[0], want[0], 1e-5, "grad_input");
    ExpectNear(outputs[1], want[1], 1e-5, "grad_weight");
    ExpectNear(outputs[2], want[2], 1e-5, "grad_bias");
    // conv2d_backward_input, conv2d_backward_weight and a reduce sum.
    EXPECT_EQ(stats.compute_instructions, 3u);
    EXPECT_EQ(stats.scratch_peak, 0u);
  }
}

TEST_F(LowerTest, ConvolutionBackwardComputesOnlyWhatTheMaskAsksFor) {
  const Ints x_shape = {2, 3, 6, 6}, w_shape = {4, 3, 3, 3}, g_shape = {2, 4, 6, 6};
  const Conv2dParams p{1, 1, 1, 1};
  const std::vector<float> x = Values(2 * 3 * 36, 720), w = Values(4 * 27, 721),
                           grad = Values(2 * 4 * 36, 722);
  auto build = [&](std::vector<int64_t> mask) {
    Graph g;
    const uint32_t gv = g.AddInput("grad", F32(S({2, 4, 6, 6})));
    const uint32_t xv = g.AddInput("x", F32(S({2, 3, 6, 6})));
    const uint32_t wv = g.AddInput("w", F32(S({4, 3, 3, 3})));
    absl::StatusOr<uint32_t> n = AddNode(&g, "aten.convolution_backward.default", {gv, xv, wv},
                                         ConvBackwardAttrs(p, 4, std::move(mask)), "conv_bwd");
    EXPECT_TRUE(n.ok()) << n.status();
    return std::make_pair(std::move(g), n.ok() ? *n : 0u);
  };
  const auto want = ConvBackwardReference(grad, g_shape, x, x_shape, w, w_shape, p);
  {
    // The first layer of a network: no grad_input.
    auto [g, n] = build({0, 1, 1});
    EXPECT_EQ(g.values[g.nodes[n].outputs[0]].type, F32(S({0})));
    g.AddOutput("grad_weight", g.nodes[n].outputs[1]);
    g.AddOutput("grad_bias", g.nodes[n].outputs[2]);
    CompileStats stats;
    const auto outputs = Run(g, {Bytes(grad), Bytes(x), Bytes(w)}, &stats);
    ASSERT_EQ(outputs.size(), 2u);
    ExpectNear(outputs[0], want[1], 1e-5, "grad_weight");
    ExpectNear(outputs[1], want[2], 1e-5, "grad_bias");
    EXPECT_EQ(stats.compute_instructions, 2u);
  }
  for (const auto& [mask, used, what] :
       {std::make_tuple(std::vector<int64_t>{1, 1, 0}, 2, "grad_bias"),
        std::make_tuple(std::vector<int64_t>{0, 1, 1}, 0, "grad_input"),
        std::make_tuple(std::vector<int64_t>{1, 0, 1}, 1, "grad_weight")}) {
    auto [g, n] = build(mask);
    g.AddOutput("used", g.nodes[n].outputs[static_cast<size_t>(used)]);
    absl::StatusOr<std::vector<uint8_t>> compiled = CompileGraph(g, {}, nullptr);
    ASSERT_FALSE(compiled.ok()) << what;
    EXPECT_CONTAINS(compiled.status().message(), "node 'conv_bwd'");
    EXPECT_CONTAINS(compiled.status().message(),
                    std::string("uses its ") + what + " output, which is None in PyTorch");
  }
}

TEST_F(LowerTest, MaxPoolBackwardAddsTheGradientAtTheIndices) {
  // Overlapping windows (kernel 3, stride 2) with padding: an input element
  // that is the maximum of several windows gets the sum of their gradients.
  const int64_t n = 2, c = 3, h = 7, w = 6, kernel = 3, stride = 2, padding = 1;
  const int64_t oh = (h + 2 * padding - kernel) / stride + 1;
  const int64_t ow = (w + 2 * padding - kernel) / stride + 1;
  std::vector<float> x = Values(static_cast<size_t>(n * c * h * w), 730);
  for (size_t i = 0; i < x.size(); i += 5) x[i] = 2.0f;  // ties: the first one wins
  const std::vector<float> grad = Values(static_cast<size_t>(n * c * oh * ow), 731);
  // The forward's indices as PyTorch's CPU kernel picks them (the first
  // maximum in row-major window order), and the reference gradient.
  std::vector<int64_t> indices(grad.size());
  std::vector<double> want(x.size(), 0.0);
  for (int64_t plane = 0; plane < n * c; ++plane) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        int64_t best = -1;
        for (int64_t u = 0; u < kernel; ++u) {
          for (int64_t v = 0; v < kernel; ++v) {
            const int64_t row = i * stride - padding + u, col = j * stride - padding + v;
            if (row < 0 || row >= h || col < 0 || col >= w) continue;
            if (best < 0 || x[plane * h * w + row * w + col] > x[plane * h * w + best]) {
              best = row * w + col;
            }
          }
        }
        const size_t k = static_cast<size_t>((plane * oh + i) * ow + j);
        indices[k] = best;
        want[static_cast<size_t>(plane * h * w + best)] += grad[k];
      }
    }
  }
  Graph g;
  const uint32_t gv = g.AddInput("grad", F32(S({n, c, oh, ow})));
  const uint32_t xv = g.AddInput("x", F32(S({n, c, h, w})));
  const uint32_t iv = g.AddInput("indices", {TERN_DTYPE_I64, S({n, c, oh, ow})});
  std::vector<Attribute> attrs = PoolAttrs(kernel, stride, padding);
  attrs.push_back(A("dilation", Ints{1, 1}));
  attrs.push_back(A("ceil_mode", false));
  g.AddOutput("grad_input", Out(g, AddNode(&g, "aten.max_pool2d_with_indices_backward.default",
                                           {gv, xv, iv}, attrs, "pool_bwd")));
  CompileStats stats;
  const auto outputs = Run(g, {Bytes(grad), Bytes(x), Bytes(indices)}, &stats);
  ASSERT_EQ(outputs.size(), 1u);
  ExpectNear(outputs[0], want, 1e-6, "grad_input");
  EXPECT_EQ(stats.scratch_peak, 0u);
}

TEST_F(LowerTest, TrainingBatchNormMatchesPyTorch) {
  // PyTorch's CPU semantics, in double: the batch statistics over N, H, W
  // (the biased variance normalises), the running statistics updated with
  // the unbiased one.
  const int64_t n = 3, c = 4, h = 5, w = 2, inner = h * w, count = n * h * w;
  const double momentum = 0.1, eps = 1e-5;
  std::vector<float> x = Values(static_cast<size_t>(n * c * inner), 740);
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * 3.0f + float(i % 7);  // mean away from 0
  const BatchNormParams bn(static_cast<size_t>(c), 741);
  std::vector<double> mean(c, 0.0), var(c, 0.0), want(x.size());
  for (size_t i = 0; i < x.size(); ++i) mean[(i / inner) % c] += x[i] / double(count);
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = x[i] - mean[(i / inner) % c];
    var[(i / inner) % c] += d * d / double(count);
  }
  std::vector<double> rstd(c), new_mean(c), new_var(c);
  for (int64_t k = 0; k < c; ++k) {
    rstd[k] = 1.0 / std::sqrt(var[k] + eps);
    new_mean[k] = momentum * mean[k] + (1 - momentum) * bn.mean[k];
    new_var[k] = momentum * var[k] * count / (count - 1) + (1 - momentum) * bn.var[k];
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t k = (i / inner) % c;
    want[i] = (x[i] - mean[k]) * rstd[k] * bn.weight[k] + bn.bias[k];
  }
  Graph g;
  const uint32_t xv = g.AddInput("x", F32(S({n, c, h, w})));
  const uint32_t rm = g.AddInput("running_mean", F32(S({c})));
  const uint32_t rv = g.AddInput("running_var", F32(S({c})));
  const std::vector<uint32_t> params = bn.Constants(&g, "bn");
  absl::StatusOr<uint32_t> node = AddNode(
      &g, "aten._native_batch_norm_legit_functional.default", {xv, params[0], params[1], rm, rv},
      {A("training", true), A("momentum", momentum), A("eps", eps)}, "bn");
  ASSERT_TRUE(node.ok()) << node.status();
  static const char* const kNames[] = {"output", "save_mean", "save_rstd", "new_running_mean",
                                       "new_running_var"};
  for (size_t k = 0; k < 5; ++k) g.AddOutput(kNames[k], g.nodes[*node].outputs[k]);
  const auto outputs = Run(g, {Bytes(x), Bytes(bn.mean), Bytes(bn.var)});
  ASSERT_EQ(outputs.size(), 5u);
  ExpectNear(outputs[0], want, 1e-5, "output");
  ExpectNear(outputs[1], mean, 1e-5, "save_mean");
  ExpectNear(outputs[2], rstd, 1e-5, "save_rstd");
  ExpectNear(outputs[3], new_mean, 1e-5, "new_running_mean");
  ExpectNear(outputs[4], new_var, 1e-5, "new_running_var");

  // Without weight and bias, only the output used: (x - mean) * rstd.
  Graph plain;
  const uint32_t px = plain.AddInput("x", F32(S({n, c, h, w})));
  const uint32_t prm = plain.AddInput("running_mean", F32(S({c})));
  const uint32_t prv = plain.AddInput("running_var", F32(S({c})));
  plain.AddOutput(
      "y",
      Out(plain, AddNode(&plain, "aten._native_batch_norm_legit_functional.default",
                         {px, kNoValue, kNoValue, prm, prv},
                         {A("training", true), A("momentum", momentum), A("eps", eps)}, "bn")));
  const auto normalised = Run(plain, {Bytes(x), Bytes(bn.mean), Bytes(bn.var)});
  ASSERT_EQ(normalised.size(), 1u);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t k = (i / inner) % c;
    want[i] = (x[i] - mean[k]) * rstd[k];
  }
  ExpectNear(normalised[0], want, 1e-5, "plain output");
}

TEST_F(LowerTest, BatchNormBackwardMatchesPyTorch) {
  // PyTorch's CPU formulas, in double, per channel k with n elements:
  //   training: grad_input = (g - Σg / n - xhat · Σ(g · xhat) / n) · invstd · weight
  //   eval:     grad_input = g · rsqrt(running_var + eps) · weight
  // grad_weight = Σ g · xhat, grad_bias = Σ g.
  const int64_t n = 2, c = 3, h = 4, w = 5, inner = h * w, count = n * h * w;
  const double eps = 1e-5;
  std::vector<float> x = Values(static_cast<size_t>(n * c * inner), 750);
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * 2.0f + float(i % 3);
  const std::vector<float> grad = Values(x.size(), 751);
  const BatchNormParams bn(static_cast<size_t>(c), 752);
  std::vector<float> save_mean(c, 0.0f), save_invstd(c, 0.0f);
  {
    std::vector<double> mean(c, 0.0), var(c, 0.0);
    for (size_t i = 0; i < x.size(); ++i) mean[(i / inner) % c] += x[i] / double(count);
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = x[i] - mean[(i / inner) % c];
      var[(i / inner) % c] += d * d / double(count);
    }
    for (int64_t k = 0; k < c; ++k) {
      save_mean[k] = static_cast<float>(mean[k]);
      save_invstd[k] = static_cast<float>(1.0 / std::sqrt(var[k] + eps));
    }
  }
  auto reference = [&](bool train) {
    std::vector<double> mean(c), invstd(c), gsum(c, 0.0), gxsum(c, 0.0), gi(x.size());
    for (int64_t k = 0; k < c; ++k) {
      mean[k] = train ? save_mean[k] : bn.mean[k];
      invstd[k] = train ? save_invstd[k] : 1.0 / std::sqrt(double(bn.var[k]) + eps);
    }
    auto xhat = [&](size_t i) {
      const size_t k = (i / inner) % c;
      return (x[i] - mean[k]) * invstd[k];
    };
    for (size_t i = 0; i < x.size(); ++i) {
      gsum[(i / inner) % c] += grad[i];
      gxsum[(i / inner) % c] += grad[i] * xhat(i);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t k = (i / inner) % c;
      const double centred =
          train ? grad[i] - gsum[k] / double(count) - xhat(i) * gxsum[k] / double(count) : grad[i];
      gi[i] = centred * invstd[k] * bn.weight[k];
    }
    return std::vector<std::vector<double>>{gi, gxsum, gsum};
  };
  auto build = [&](bool train, std::vector<int64_t> mask) {
    Graph g;
    const uint32_t gv = g.AddInput("grad", F32(S({n, c, h, w})));
    const uint32_t xv = g.AddInput("x", F32(S({n, c, h, w})));
    const uint32_t sm = g.AddInput("save_mean", F32(S({c})));
    const uint32_t si = g.AddInput("save_invstd", F32(S({c})));
    const std::vector<uint32_t> params = bn.Constants(&g, "bn");
    absl::StatusOr<uint32_t> node = AddNode(
        &g, "aten.native_batch_norm_backward.default",
        {gv, xv, params[0], params[2], params[3], train ? sm : kNoValue, train ? si : kNoValue},
        {A("train", train), A("eps", eps), A("output_mask", std::move(mask))}, "bn_bwd");
    EXPECT_TRUE(node.ok()) << node.status();
    return std::make_pair(std::move(g), node.ok() ? *node : 0u);
  };
  const std::vector<std::vector<uint8_t>> inputs = {Bytes(grad), Bytes(x), Bytes(save_mean),
                                                    Bytes(save_invstd)};
  {
    auto [g, node] = build(true, {1, 1, 1});
    for (size_t k = 0; k < 3; ++k) g.AddOutput("out" + std::to_string(k), g.nodes[node].outputs[k]);
    const auto outputs = Run(g, inputs);
    ASSERT_EQ(outputs.size(), 3u);
    const auto want = reference(true);
    ExpectNear(outputs[0], want[0], 1e-5, "grad_input");
    ExpectNear(outputs[1], want[1], 1e-5, "grad_weight");
    ExpectNear(outputs[2], want[2], 1e-5, "grad_bias");
  }
  {
    // Eval: only grad_input (the statistics are the running ones).
    auto [g, node] = build(false, {1, 0, 0});
    g.AddOutput("grad_input", g.nodes[node].outputs[0]);
    const auto outputs = Run(g, inputs);
    ASSERT_EQ(outputs.size(), 1u);
    ExpectNear(outputs[0], reference(false)[0], 1e-5, "eval grad_input");
  }
  {
    // Only the parameters' gradients.
    auto [g, node] = build(true, {0, 1, 1});
    g.AddOutput("grad_weight", g.nodes[node].outputs[1]);
    g.AddOutput("grad_bias", g.nodes[node].outputs[2]);
    const auto outputs = Run(g, inputs);
    ASSERT_EQ(outputs.size(), 2u);
    ExpectNear(outputs[0], reference(true)[1], 1e-5, "grad_weight");
    ExpectNear(outputs[1], reference(true)[2], 1e-5, "grad_bias");
  }
  {
    // An output PyTorch gives as None cannot be used.
    auto [g, node] = build(true, {1, 0, 1});
    g.AddOutput("grad_weight", g.nodes[node].outputs[1]);
    absl::StatusOr<std::vector<uint8_t>> compiled = CompileGraph(g, {}, nullptr);
    ASSERT_FALSE(compiled.ok());
    EXPECT_CONTAINS(compiled.status().message(), "node 'bn_bwd'");
    EXPECT_CONTAINS(compiled.status().message(),
                    "uses its grad_weight output, which is None in PyTorch");
  }
}

TEST_F(LowerTest, SoftmaxBackwardsMatchTheReference) {
  // Along dim 0 of [3, 5]: a strided axis.
  constexpr int kRows = 3, kCols = 5;
  const std::vector<float> xs = Values(kRows * kCols, 61), gs = Values(kRows * kCols, 62);
  std::vector<float> soft(kRows * kCols), logsoft(kRows * kCols);
  for (int c = 0; c < kCols; ++c) {
    double max = -1e300, total = 0;
    for (int r = 0; r < kRows; ++r) max = std::max(max, double(xs[r * kCols + c]));
    for (int r = 0; r < kRows; ++r) total += std::exp(xs[r * kCols + c] - max);
    for (int r = 0; r < kRows; ++r) {
      soft[r * kCols + c] = static_cast<float>(std::exp(xs[r * kCols + c] - max) / total);
      logsoft[r * kCols + c] = static_cast<float>(xs[r * kCols + c] - max - std::log(total));
    }
  }
  Graph g;
  const uint32_t grad = g.AddInput("grad", F32(S({kRows, kCols})));
  const uint32_t y = g.AddInput("y", F32(S({kRows, kCols})));
  const uint32_t logy = g.AddInput("logy", F32(S({kRows, kCols})));
  const std::vector<Attribute> attrs = {A("dim", int64_t{0}),
                                        A("input_dtype", DTypeAttr{TERN_DTYPE_F32})};
  g.AddOutput("soft", Out(g, AddNode(&g, "aten._softmax_backward_data.default", {grad, y}, attrs,
                                     "softmax_bwd")));
  g.AddOutput("log", Out(g, AddNode(&g, "aten._log_softmax_backward_data.default", {grad, logy},
                                    attrs, "log_softmax_bwd")));
  const auto outputs = Run(g, {Bytes(gs), Bytes(soft), Bytes(logsoft)});
  ASSERT_EQ(outputs.size(), 2u);
  std::vector<double> want_soft(kRows * kCols), want_log(kRows * kCols);
  for (int c = 0; c < kCols; ++c) {
    double dot = 0, total = 0;
    for (int r = 0; r < kRows; ++r) {
      dot += double(gs[r * kCols + c]) * soft[r * kCols + c];
      total += gs[r * kCols + c];
    }
    for (int r = 0; r < kRows; ++r) {
      const int i = r * kCols + c;
      want_soft[i] = soft[i] * (gs[i] - dot);
      want_log[i] = gs[i] - std::exp(double(logsoft[i])) * total;
    }
  }
  ExpectNear(outputs[0], want_soft, 1e-5, "softmax backward");
  ExpectNear(outputs[1], want_log, 1e-5, "log_softmax backward");
}

TEST_F(LowerTest, ActivationBackwardsMatchTheReference) {
  constexpr int kRows = 2, kCols = 16, kCount = kRows * kCols;
  const std::vector<float> gs = Values(kCount, 71);
  std::vector<float> xs = Values(kCount, 72), row = Values(kCols, 73);
  for (float& v : xs) v *= 4.0f;  // [-4, 4): gelu's and silu's curved parts
  std::vector<float> ts(kCount), ss(kCount), relu_in = xs;
  for (int i = 0; i < kCount; ++i) {
    ts[i] = std::tanh(xs[i]);
    ss[i] = static_cast<float>(1.0 / (1.0 + std::exp(-double(xs[i]))));
  }
  // threshold_backward at the threshold gives 0; NaN passes the gradient.
  relu_in[3] = 0.0f;
  relu_in[4] = -0.0f;
  relu_in[5] = std::nanf("");
  Graph g;
  const uint32_t grad = g.AddInput("grad", F32(S({kRows, kCols})));
  const uint32_t x = g.AddInput("x", F32(S({kRows, kCols})));
  const uint32_t y_tanh = g.AddInput("y_tanh", F32(S({kRows, kCols})));
  const uint32_t y_sigmoid = g.AddInput("y_sigmoid", F32(S({kRows, kCols})));
  const uint32_t relu_x = g.AddInput("relu_x", F32(S({kRows, kCols})));
  const uint32_t x_row = g.AddInput("x_row", F32(S({kCols})));
  g.AddOutput("tanh", Out(g, AddNode(&g, "aten.tanh_backward.default", {grad, y_tanh}, {})));
  g.AddOutput("sigmoid",
              Out(g, AddNode(&g, "aten.sigmoid_backward.default", {grad, y_sigmoid}, {})));
  g.AddOutput("relu", Out(g, AddNode(&g, "aten.threshold_backward.default", {grad, relu_x},
                                     {A("threshold", int64_t{0})})));
  g.AddOutput("gelu", Out(g, AddNode(&g, "aten.gelu_backward.default", {grad, x}, {})));
  g.AddOutput("gelu_tanh", Out(g, AddNode(&g, "aten.gelu_backward.default", {grad, x},
                                          {A("approximate", std::string("tanh"))})));
  g.AddOutput("silu", Out(g, AddNode(&g, "aten.silu_backward.default", {grad, x}, {})));
  g.AddOutput("silu_row", Out(g, AddNode(&g, "aten.silu_backward.default", {grad, x_row}, {})));
  CompileStats fused, unfused;
  const auto outputs = RunFusedAndUnfused(
      g, {Bytes(gs), Bytes(xs), Bytes(ts), Bytes(ss), Bytes(relu_in), Bytes(row)}, &fused,
      &unfused);
  ASSERT_EQ(outputs.size(), 7u);
  const double pi = std::acos(-1.0), k = std::sqrt(2.0 / pi), c = 0.044715;
  auto silu = [](double v) {
    const double s = 1.0 / (1.0 + std::exp(-v));
    return s * (1.0 + v * (1.0 - s));
  };
  std::vector<std::vector<double>> want(7, std::vector<double>(kCount));
  for (int i = 0; i < kCount; ++i) {
    const double gv = gs[i], v = xs[i];
    want[0][i] = gv * (1.0 - double(ts[i]) * ts[i]);
    want[1][i] = gv * (1.0 - ss[i]) * ss[i];
    want[2][i] = relu_in[i] <= 0.0f ? 0.0 : gv;
    const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * pi);
    want[3][i] = gv * (cdf + v * pdf);
    const double t = std::tanh(k * (v + c * v * v * v));
    want[4][i] = gv * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * c * v * v));
    want[5][i] = gv * silu(v);
    want[6][i] = gv * silu(row[i % kCols]);
  }
  EXPECT_EQ(outputs[2][5], gs[5]);  // NaN input: the gradient passes
  EXPECT_EQ(outputs[2][3], 0.0f);
  EXPECT_EQ(outputs[2][4], 0.0f);
  const char* const names[] = {"tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "silu_row"};
  for (size_t j = 0; j < 7; ++j) ExpectNear(outputs[j], want[j], 2e-6, names[j]);
  // gelu and silu are unary_backward on the Scalar engine; the others a
  // few elementwise instructions that fusion turns into programs.
  EXPECT_GE(unfused.instructions_per_engine[TERN_ENGINE_SCALAR], 4u);
  EXPECT_LT(fused.compute_instructions, unfused.compute_instructions);
}

// bf16 to f32 and back (nearest even; the tests' values are finite).
float FromBf16(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}
uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

// bf16 gradients: the sequences compute in f32 and round once, the
// instructions that take bf16 directly do too; an input_dtype other than
// grad_output's converts the softmax's gradient at the end.
TEST_F(LowerTest, HalfBackwardsConvertAtTheEnd) {
  constexpr int kCount = 32;
  std::vector<uint16_t> g(kCount), y_tanh(kCount), y_sigmoid(kCount), x(kCount);
  const std::vector<float> gs = Values(kCount, 81), xs = Values(kCount, 82);
  for (int i = 0; i < kCount; ++i) {
    g[i] = ToBf16(gs[i]);
    x[i] = ToBf16(3.0f * xs[i]);
    y_tanh[i] = ToBf16(std::tanh(FromBf16(x[i])));
    y_sigmoid[i] = ToBf16(static_cast<float>(1.0 / (1.0 + std::exp(-FromBf16(x[i])))));
  }
  const std::vector<float> soft_grad = Values(kCount, 83);
  std::vector<float> soft(kCount);
  for (int i = 0; i < kCount; ++i) soft[i] = 1.0f / kCount + 0.01f * xs[i];
  Graph graph;
  const TensorType bf16{TERN_DTYPE_BF16, S({kCount})};
  const uint32_t gv = graph.AddInput("g", bf16);
  const uint32_t tv = graph.AddInput("y_tanh", bf16);
  const uint32_t sv = graph.AddInput("y_sigmoid", bf16);
  const uint32_t xv = graph.AddInput("x", bf16);
  const uint32_t sgv = graph.AddInput("soft_grad", F32(S({kCount})));
  const uint32_t softv = graph.AddInput("soft", F32(S({kCount})));
  auto to_f32 = [&](absl::StatusOr<uint32_t> node, const char* name) {
    const uint32_t value = Out(graph, node);
    EXPECT_EQ(graph.values[value].type.dtype, TERN_DTYPE_BF16) << name;
    graph.AddOutput(name, Out(graph, AddNode(&graph, "aten._to_copy.default", {value},
                                             {A("dtype", DTypeAttr{TERN_DTYPE_F32})})));
  };
  to_f32(AddNode(&graph, "aten.tanh_backward.default", {gv, tv}, {}), "tanh");
  to_f32(AddNode(&graph, "aten.sigmoid_backward.default", {gv, sv}, {}), "sigmoid");
  to_f32(AddNode(&graph, "aten.threshold_backward.default", {gv, xv}, {A("threshold", 0.25)}),
         "threshold");
  to_f32(AddNode(&graph, "aten.gelu_backward.default", {gv, xv}, {}), "gelu");
  to_f32(AddNode(&graph, "aten._softmax_backward_data.default", {sgv, softv},
                 {A("dim", int64_t{0}), A("input_dtype", DTypeAttr{TERN_DTYPE_BF16})}),
         "softmax");
  const auto outputs = Run(
      graph, {Bytes(g), Bytes(y_tanh), Bytes(y_sigmoid), Bytes(x), Bytes(soft_grad), Bytes(soft)});
  ASSERT_EQ(outputs.size(), 5u);
  std::vector<std::vector<double>> want(5, std::vector<double>(kCount));
  double dot = 0;
  for (int i = 0; i < kCount; ++i) dot += double(soft_grad[i]) * soft[i];
  for (int i = 0; i < kCount; ++i) {
    const double gd = FromBf16(g[i]), v = FromBf16(x[i]);
    const double t = FromBf16(y_tanh[i]), sg = FromBf16(y_sigmoid[i]);
    const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    const double exact[5] = {gd * (1.0 - t * t), gd * (1.0 - sg) * sg, v <= 0.25 ? 0.0 : gd,
                             gd * (cdf + v * pdf), soft[i] * (soft_grad[i] - dot)};
    // Rounded once to bf16: within half a bf16 ulp (2^-9 relative).
    for (int j = 0; j < 5; ++j) want[j][i] = FromBf16(ToBf16(static_cast<float>(exact[j])));
  }
  const char* const names[] = {"tanh", "sigmoid", "threshold", "gelu", "softmax"};
  for (size_t j = 0; j < 5; ++j) {
    for (int i = 0; i < kCount; ++i) {
      EXPECT_NEAR(outputs[j][i], want[j][i], std::fabs(want[j][i]) / 128.0 + 1e-30)
          << names[j] << " at " << i;
    }
  }
}

TEST_F(LowerTest, EmbeddingDenseBackwardSumsRepeatedIndicesAndSkipsThePadding) {
  constexpr int64_t kVocab = 7, kWidth = 4;
  // Repeated indices (3 three times), the padding index 5 twice, rows never
  // used (0, 6).
  const std::vector<int64_t> ids = {3, 1, 5, 3, 2, 5, 3, 4};
  const std::vector<float> gs = Values(ids.size() * kWidth, 91);
  Graph g;
  const uint32_t grad = g.AddInput("grad", F32(S({2, 4, kWidth})));
  const uint32_t idv = g.AddInput("ids", {TERN_DTYPE_I64, S({2, 4})});
  for (int64_t padding : {int64_t{-1}, int64_t{5}}) {
    g.AddOutput(padding < 0 ? "grad_weight" : "grad_weight_padded",
                Out(g, AddNode(&g, "aten.embedding_dense_backward.default", {grad, idv},
                               {A("num_weights", kVocab), A("padding_idx", padding),
                                A("scale_grad_by_freq", false)})));
  }
  const auto outputs = Run(g, {Bytes(gs), Bytes(ids)});
  ASSERT_EQ(outputs.size(), 2u);
  std::vector<double> want(kVocab * kWidth, 0.0), want_padded;
  for (size_t j = 0; j < ids.size(); ++j) {
    for (int64_t d = 0; d < kWidth; ++d) want[ids[j] * kWidth + d] += gs[j * kWidth + d];
  }
  want_padded = want;
  for (int64_t d = 0; d < kWidth; ++d) want_padded[5 * kWidth + d] = 0.0;
  ExpectNear(outputs[0], want, 1e-6, "grad_weight");
  ExpectNear(outputs[1], want_padded, 1e-6, "grad_weight_padded");
}

}  // namespace
}  // namespace tern::compiler
