// The pattern pass (compiler/passes/patterns.h): written-out GELU (tanh and
// erf), RMSNorm, softmax, log-softmax and LayerNorm, built as torch.export
// with the core ATen decompositions writes them (GPT2MLP, LlamaRMSNorm,
// torch.nn.RMSNorm, hand-written softmax and LayerNorm), each replaced by
// one op; the graphs before and after compiled and run on the simulated
// device (outputs within 1e-5 relative); and the chains that must stay: an
// intermediate read elsewhere or a graph output, a wrong constant, another
// dim, a non-identity cast, the pass turned off.
#include "compiler/passes/patterns.h"

#include <gtest/gtest.h>
#include <tern/tern.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/ir/hash.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/verify.h"
#include "compiler/lower/compile.h"
#include "compiler/passes/pipeline.h"

namespace tern::compiler {
namespace {

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
using Ints = std::vector<int64_t>;

std::vector<uint8_t> Bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Deterministic values in [-scale, scale).
std::vector<float> Values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::vector<float> values(count);
  uint32_t state = seed * 2654435761u + 1;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = scale * (static_cast<float>(state >> 8) / 8388608.0f - 1.0f);
  }
  return values;
}

// A graph under construction, with the exporter's conventions: a Python
// number is the `other` attribute of an absent input.
struct Builder {
  Graph g;
  uint32_t Op(const std::string& op, std::vector<uint32_t> in, std::vector<Attribute> attrs = {},
              const std::string& name = {}) {
    absl::StatusOr<uint32_t> node = AddNode(&g, op, std::move(in), std::move(attrs), name);
    EXPECT_TRUE(node.ok()) << node.status();
    return node.ok() ? g.nodes[*node].outputs[0] : 0;
  }
  uint32_t Num(const std::string& op, uint32_t t, double number) {
    return Op(op, {t}, {A("other", number)});
  }
  uint32_t Mul(uint32_t t, double number) { return Num("aten.mul.Tensor", t, number); }
  uint32_t Add(uint32_t t, double number) { return Num("aten.add.Tensor", t, number); }
  uint32_t Mul(uint32_t a, uint32_t b) { return Op("aten.mul.Tensor", {a, b}); }
  uint32_t Add(uint32_t a, uint32_t b) { return Op("aten.add.Tensor", {a, b}); }
  uint32_t Sub(uint32_t a, uint32_t b) { return Op("aten.sub.Tensor", {a, b}); }
  uint32_t Div(uint32_t a, uint32_t b) { return Op("aten.div.Tensor", {a, b}); }
  uint32_t Unary(const std::string& op, uint32_t t) { return Op(op, {t}); }
  uint32_t Pow(uint32_t t, decltype(Attribute::value) exponent) {
    return Op("aten.pow.Tensor_Scalar", {t}, {A("exponent", std::move(exponent))});
  }
  uint32_t Reduce(const std::string& op, uint32_t t, Ints dims) {
    return Op(op, {t}, {A("dim", std::move(dims)), A("keepdim", true)});
  }
  uint32_t Const(const std::string& name, Shape shape, uint32_t seed, float scale = 1.0f) {
    const size_t count = static_cast<size_t>(*ConstantElements(shape));
    return g.AddConstant(name, F32(std::move(shape)), Bytes(Values(count, seed, scale)));
  }
};

size_t CountOp(const Graph& graph, const std::string& op) {
  size_t count = 0;
  for (const Node& node : graph.nodes) count += node.op == op ? 1 : 0;
  return count;
}

const Node* FindOpNode(const Graph& graph, const std::string& op) {
  for (const Node& node : graph.nodes) {
    if (node.op == op) return &node;
  }
  return nullptr;
}

Graph Optimized(const Graph& graph, PassStats* stats = nullptr, PassOptions options = {}) {
  EXPECT_TRUE(VerifyGraph(graph).ok()) << VerifyGraph(graph);
  absl::StatusOr<Graph> optimized = OptimizeGraph(graph, options, stats);
  EXPECT_TRUE(optimized.ok()) << optimized.status();
  return optimized.ok() ? *std::move(optimized) : Graph{};
}

// The graph with patterns off (fold, CSE, DCE only) and on.
struct Both {
  Graph off, on;
  PassStats stats;
};
Both OptimizeBoth(const Graph& graph) {
  Both both;
  PassOptions off;
  off.patterns = false;
  both.off = Optimized(graph, nullptr, off);
  both.on = Optimized(graph, &both.stats);
  return both;
}

// ---- GELU ----------------------------------------------------------------------------------

enum class Cube { kPow, kMulMul, kMulSquare };

struct GeluOptions {
  Cube cube = Cube::kPow;
  bool swapped = false;     // commutative operands the other way round
  double cubic = 0.044715;  // the constants
  double scale = 0.7978845608028654;
  double half = 0.5;
  bool tanh_is_output = false;   // an intermediate that is a graph output
  bool tanh_read_again = false;  // an intermediate another node reads
};

// GPT-2's gelu_new as GPT2MLP exports:
//   mul = h * 0.5; pow = h ** 3.0; mul_1 = pow * 0.044715; add = h + mul_1;
//   mul_2 = add * 0.7978845608028654; tanh; add_1 = tanh + 1.0; mul_3 = mul * add_1
uint32_t GeluTanh(Builder& b, uint32_t x, const GeluOptions& o) {
  const uint32_t half = b.Mul(x, o.half);
  uint32_t cube = 0;
  switch (o.cube) {
    case Cube::kPow:
      cube = b.Pow(x, 3.0);
      break;
    case Cube::kMulMul:
      cube = b.Mul(b.Mul(x, x), x);
      break;
    case Cube::kMulSquare:
      cube = b.Mul(x, b.Mul(x, x));
      break;
  }
  const uint32_t scaled_cube = b.Mul(cube, o.cubic);
  const uint32_t inner = o.swapped ? b.Add(scaled_cube, x) : b.Add(x, scaled_cube);
  const uint32_t t = b.Unary("aten.tanh.default", b.Mul(inner, o.scale));
  if (o.tanh_is_output) b.g.AddOutput("tanh", t);
  if (o.tanh_read_again) b.g.AddOutput("tanh_exp", b.Unary("aten.exp.default", t));
  const uint32_t one_plus = b.Add(t, 1.0);
  return o.swapped ? b.Mul(one_plus, half) : b.Mul(half, one_plus);
}

// GPT2MLP: c_fc (addmm with a [in, out] weight), gelu_new, c_proj.
Graph GptMlp(const GeluOptions& o) {
  Builder b;
  const uint32_t x = b.g.AddInput("x", F32(S({2, 3, 8})));
  const uint32_t fc_w = b.Const("c_fc.weight", S({8, 32}), 1, 0.5f);
  const uint32_t fc_b = b.Const("c_fc.bias", S({32}), 2, 0.5f);
  const uint32_t pr_w = b.Const("c_proj.weight", S({32, 8}), 3, 0.5f);
  const uint32_t pr_b = b.Const("c_proj.bias", S({8}), 4, 0.5f);
  const uint32_t v = b.Op("aten.view.default", {x}, {A("size", S({6, 8}))});
  const uint32_t h = b.Op("aten.addmm.default", {fc_b, v, fc_w});
  const uint32_t h3 = b.Op("aten.view.default", {h}, {A("size", S({2, 3, 32}))});
  const uint32_t act = GeluTanh(b, h3, o);
  const uint32_t a2 = b.Op("aten.view.default", {act}, {A("size", S({6, 32}))});
  const uint32_t y = b.Op("aten.addmm.default", {pr_b, a2, pr_w});
  b.g.AddOutput("y", b.Op("aten.view.default", {y}, {A("size", S({2, 3, 8}))}));
  return b.g;
}

TEST(Patterns, GeluTanhAsGpt2ExportsIt) {
  for (Cube cube : {Cube::kPow, Cube::kMulMul, Cube::kMulSquare}) {
    for (bool swapped : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "cube " << static_cast<int>(cube) << " swapped " << swapped);
      GeluOptions o;
      o.cube = cube;
      o.swapped = swapped;
      const Both both = OptimizeBoth(GptMlp(o));
      EXPECT_EQ(both.stats.patterns_replaced, 1u);
      const size_t chain = cube == Cube::kPow ? 8 : 9;
      EXPECT_EQ(both.on.nodes.size(), both.off.nodes.size() - chain + 1);
      const Node* gelu = FindOpNode(both.on, "aten.gelu.default");
      ASSERT_NE(gelu, nullptr);
      const Attribute* approximate = FindAttr(*gelu, "approximate");
      ASSERT_NE(approximate, nullptr);
      EXPECT_EQ(std::get<std::string>(approximate->value), "tanh");
      EXPECT_EQ(CountOp(both.on, "aten.tanh.default"), 0u);
    }
  }
}

TEST(Patterns, GeluTanhStaysWhenSomethingDiffers) {
  auto expect_kept = [](const GeluOptions& o, const char* what) {
    SCOPED_TRACE(what);
    const Both both = OptimizeBoth(GptMlp(o));
    EXPECT_EQ(both.stats.patterns_replaced, 0u);
    EXPECT_EQ(GraphHash(both.on), GraphHash(both.off));
  };
  GeluOptions o;
  o.tanh_is_output = true;
  expect_kept(o, "an intermediate is a graph output");
  o = {};
  o.tanh_read_again = true;
  expect_kept(o, "an intermediate is read elsewhere");
  o = {};
  o.cubic = 0.04472;
  expect_kept(o, "0.04472 for 0.044715");
  o = {};
  o.scale = 0.79788;
  expect_kept(o, "0.79788 for sqrt(2/pi)");
  o = {};
  o.half = 0.5000001;
  expect_kept(o, "0.5000001 for 0.5");
  // sqrt(2/pi) written with fewer digits that round to the same f32 is the
  // same constant.
  o = {};
  o.scale = static_cast<double>(static_cast<float>(0.7978845608028654));
  EXPECT_EQ(OptimizeBoth(GptMlp(o)).stats.patterns_replaced, 1u);
}

// The erf form: 0.5 * x * (1 + erf(x / sqrt(2))) or (x * 0.7071067811865476).
Graph GeluErf(bool divide, double constant, bool order_swapped) {
  Builder b;
  const uint32_t x = b.g.AddInput("x", F32(S({4, 16})));
  const uint32_t half = b.Mul(x, 0.5);
  const uint32_t scaled = divide ? b.Num("aten.div.Tensor", x, constant) : b.Mul(x, constant);
  const uint32_t one_plus = b.Add(b.Unary("aten.erf.default", scaled), 1.0);
  b.g.AddOutput("y", order_swapped ? b.Mul(one_plus, half) : b.Mul(half, one_plus));
  return b.g;
}

TEST(Patterns, GeluErf) {
  for (bool swapped : {false, true}) {
    const Both div = OptimizeBoth(GeluErf(true, 1.4142135623730951, swapped));
    EXPECT_EQ(div.stats.patterns_replaced, 1u);
    ASSERT_EQ(div.on.nodes.size(), 1u);
    EXPECT_EQ(div.on.nodes[0].op, "aten.gelu.default");
    EXPECT_TRUE(div.on.nodes[0].attrs.empty());  // approximate "none", the default
    const Both mul = OptimizeBoth(GeluErf(false, 0.7071067811865476, swapped));
    EXPECT_EQ(mul.stats.patterns_replaced, 1u);
    EXPECT_EQ(mul.on.nodes.size(), 1u);
  }
  EXPECT_EQ(OptimizeBoth(GeluErf(true, 1.41, false)).stats.patterns_replaced, 0u);
  EXPECT_EQ(OptimizeBoth(GeluErf(false, 1.4142135623730951, false)).stats.patterns_replaced, 0u);
}

// ---- RMSNorm -------------------------------------------------------------------------------

struct RmsOptions {
  Ints dims = {-1};
  bool weight = true;
  bool weight_first = true;     // LlamaRMSNorm: weight * x; nn.RMSNorm: x * weight
  bool add_scalar = false;      // nn.RMSNorm's add.Scalar
  bool identity_casts = false;  // _to_copy to f32 around it, on f32 data
  bool bf16 = false;            // LlamaRMSNorm in bf16: casts that change the dtype
  bool rstd_is_output = false;
  bool square_by_mul = false;
  Shape shape = S({2, 3, 16});
};

// LlamaRMSNorm: variance = x.pow(2).mean(-1, keepdim=True);
// x = x * torch.rsqrt(variance + eps); weight * x.
Graph Rms(const RmsOptions& o) {
  Builder b;
  const tern_dtype_t dtype = o.bf16 ? TERN_DTYPE_BF16 : TERN_DTYPE_F32;
  const uint32_t input = b.g.AddInput("x", {dtype, o.shape});
  Shape last(o.shape.end() - 1, o.shape.end());
  uint32_t w = 0;
  if (o.bf16) {
    std::vector<uint8_t> bytes(static_cast<size_t>(*ConstantElements(last)) * 2, 0x3f);
    w = b.g.AddConstant("weight", {TERN_DTYPE_BF16, last}, bytes);
  } else {
    w = b.Const("weight", last, 7);
  }
  uint32_t x = input;
  if (o.identity_casts || o.bf16) {
    x = b.Op("aten._to_copy.default", {x}, {A("dtype", DTypeAttr{TERN_DTYPE_F32})});
  }
  const uint32_t square = o.square_by_mul ? b.Mul(x, x) : b.Pow(x, int64_t{2});
  const uint32_t variance = b.Reduce("aten.mean.dim", square, o.dims);
  const uint32_t plus =
      o.add_scalar ? b.Num("aten.add.Scalar", variance, 1e-6) : b.Add(variance, 1e-6);
  const uint32_t rstd = b.Unary("aten.rsqrt.default", plus);
  if (o.rstd_is_output) b.g.AddOutput("rstd", rstd);
  uint32_t normed = b.Mul(x, rstd);
  if (o.identity_casts || o.bf16) {
    normed = b.Op("aten._to_copy.default", {normed}, {A("dtype", DTypeAttr{dtype})});
  }
  uint32_t y = normed;
  if (o.weight) y = o.weight_first ? b.Mul(w, normed) : b.Mul(normed, w);
  b.g.AddOutput("y", y);
  return b.g;
}

TEST(Patterns, RmsNormAsLlamaAndTorchExportIt) {
  struct Case {
    const char* what;
    RmsOptions o;
    size_t chain;
  };
  std::vector<Case> cases;
  cases.push_back({"LlamaRMSNorm f32", {}, 6});
  RmsOptions o;
  o.weight_first = false;
  o.add_scalar = true;
  o.dims = {2};
  cases.push_back({"torch.nn.RMSNorm", o, 6});
  o = {};
  o.identity_casts = true;
  cases.push_back({"identity casts", o, 8});
  o = {};
  o.weight = false;
  cases.push_back({"no weight", o, 5});
  o = {};
  o.square_by_mul = true;
  cases.push_back({"x * x", o, 6});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Graph g = Rms(c.o);
    const Both both = OptimizeBoth(g);
    EXPECT_EQ(both.stats.patterns_replaced, 1u);
    EXPECT_EQ(both.on.nodes.size(), both.off.nodes.size() - c.chain + 1);
    const Node* rms = FindOpNode(both.on, "aten.rms_norm.default");
    ASSERT_NE(rms, nullptr);
    EXPECT_EQ(rms->inputs.size(), c.o.weight ? 2u : 1u);
    EXPECT_EQ(rms->inputs[0], both.on.inputs[0]);
    EXPECT_EQ(std::get<double>(FindAttr(*rms, "eps")->value), 1e-6);
    EXPECT_EQ(std::get<Ints>(FindAttr(*rms, "normalized_shape")->value), Ints{16});
  }
}

TEST(Patterns, RmsNormStaysWhenSomethingDiffers) {
  RmsOptions o;
  o.bf16 = true;
  {
    // LlamaRMSNorm in bf16: the casts that change the dtype and the bf16
    // weight multiply stay; the f32 core between them is an rms_norm
    // without weight.
    const Both both = OptimizeBoth(Rms(o));
    EXPECT_EQ(both.stats.patterns_replaced, 1u);
    std::vector<std::string> ops;
    for (const Node& node : both.on.nodes) ops.push_back(node.op);
    EXPECT_EQ(ops, (std::vector<std::string>{"aten._to_copy.default", "aten.rms_norm.default",
                                             "aten._to_copy.default", "aten.mul.Tensor"}));
  }
  o = {};
  o.rstd_is_output = true;
  EXPECT_EQ(OptimizeBoth(Rms(o)).stats.patterns_replaced, 0u) << "rstd is an output";
  o = {};
  o.dims = {1};
  EXPECT_EQ(OptimizeBoth(Rms(o)).stats.patterns_replaced, 0u) << "mean over another dim";
  o = {};
  o.shape = S({2, 4, 4});
  o.dims = {0};
  EXPECT_EQ(OptimizeBoth(Rms(o)).stats.patterns_replaced, 0u) << "not a trailing dim";
}

TEST(Patterns, RmsNormOverTwoTrailingDims) {
  RmsOptions o;
  o.dims = {-1, -2};
  o.weight = false;
  const Both both = OptimizeBoth(Rms(o));
  EXPECT_EQ(both.stats.patterns_replaced, 1u);
  const Node* rms = FindOpNode(both.on, "aten.rms_norm.default");
  ASSERT_NE(rms, nullptr);
  EXPECT_EQ(std::get<Ints>(FindAttr(*rms, "normalized_shape")->value), (Ints{3, 16}));
}

// ---- Softmax -------------------------------------------------------------------------------

// x.amax(d, keepdim) ; sub ; exp ; sum(d, keepdim) ; div (or log ; sub).
Graph Softmax(bool log, Ints amax_dim, Ints sum_dim, bool exp_is_output = false) {
  Builder b;
  const uint32_t x = b.g.AddInput("x", F32(S({3, 5, 10})));
  const uint32_t shifted = b.Sub(x, b.Reduce("aten.amax.default", x, amax_dim));
  const uint32_t e = b.Unary("aten.exp.default", shifted);
  if (exp_is_output) b.g.AddOutput("e", e);
  const uint32_t sum = b.Reduce("aten.sum.dim_IntList", e, sum_dim);
  b.g.AddOutput("y", log ? b.Sub(shifted, b.Unary("aten.log.default", sum)) : b.Div(e, sum));
  return b.g;
}

TEST(Patterns, SoftmaxAndLogSoftmax) {
  for (bool log : {false, true}) {
    SCOPED_TRACE(log ? "log_softmax" : "softmax");
    const Both both = OptimizeBoth(Softmax(log, {-1}, {-1}));
    EXPECT_EQ(both.stats.patterns_replaced, 1u);
    ASSERT_EQ(both.on.nodes.size(), 1u);
    EXPECT_EQ(both.on.nodes[0].op, log ? "aten._log_softmax.default" : "aten._softmax.default");
    EXPECT_EQ(std::get<int64_t>(FindAttr(both.on.nodes[0], "dim")->value), -1);
    EXPECT_EQ(std::get<bool>(FindAttr(both.on.nodes[0], "half_to_float")->value), false);
    // The same dim written two ways.
    EXPECT_EQ(OptimizeBoth(Softmax(log, {1}, {-2})).stats.patterns_replaced, 1u);
    // Another dim, two dims, an intermediate that is an output: kept.
    EXPECT_EQ(OptimizeBoth(Softmax(log, {-1}, {1})).stats.patterns_replaced, 0u);
    EXPECT_EQ(OptimizeBoth(Softmax(log, {1, 2}, {1, 2})).stats.patterns_replaced, 0u);
    EXPECT_EQ(OptimizeBoth(Softmax(log, {-1}, {-1}, true)).stats.patterns_replaced, 0u);
  }
}

// ---- LayerNorm -----------------------------------------------------------------------------

// As torch.export writes `w * ((x - u) / sqrt(((x - u)^2).mean(-1) + eps)) + b`:
// the two x - u are two nodes until CSE merges them.
Graph LayerNorm(bool rsqrt, bool weight, bool bias, Ints var_dim = {-1}) {
  Builder b;
  const uint32_t x = b.g.AddInput("x", F32(S({4, 3, 12})));
  const uint32_t w = b.Const("weight", S({12}), 5);
  const uint32_t bb = b.Const("bias", S({12}), 6);
  const uint32_t mean = b.Reduce("aten.mean.dim", x, {-1});
  const uint32_t sub = b.Sub(x, mean);
  const uint32_t var = b.Reduce("aten.mean.dim", b.Pow(sub, int64_t{2}), var_dim);
  const uint32_t sub_1 = b.Sub(x, mean);
  const uint32_t plus = b.Add(var, 1e-5);
  const uint32_t normed = rsqrt ? b.Mul(sub_1, b.Unary("aten.rsqrt.default", plus))
                                : b.Div(sub_1, b.Unary("aten.sqrt.default", plus));
  uint32_t y = normed;
  if (weight) y = b.Mul(w, y);
  if (bias) y = b.Add(y, bb);
  b.g.AddOutput("y", y);
  return b.g;
}

TEST(Patterns, LayerNormWrittenOut) {
  for (bool rsqrt : {false, true}) {
    for (int params = 0; params < 4; ++params) {
      const bool weight = (params & 1) != 0, bias = (params & 2) != 0;
      SCOPED_TRACE(testing::Message()
                   << "rsqrt " << rsqrt << " weight " << weight << " bias " << bias);
      const Both both = OptimizeBoth(LayerNorm(rsqrt, weight, bias));
      EXPECT_EQ(both.stats.patterns_replaced, 1u);
      ASSERT_EQ(both.on.nodes.size(), 1u);
      const Node& ln = both.on.nodes[0];
      EXPECT_EQ(ln.op, "aten.native_layer_norm.default");
      EXPECT_EQ(ln.outputs.size(), 3u);
      EXPECT_EQ(ln.inputs.size(), bias ? 3u : weight ? 2u : 1u);
      EXPECT_EQ(std::get<double>(FindAttr(ln, "eps")->value), 1e-5);
    }
  }
  // The variance over another dim: no LayerNorm (nor an RMSNorm of x - mean).
  const Both other = OptimizeBoth(LayerNorm(false, true, true, {1}));
  EXPECT_EQ(other.stats.patterns_replaced, 0u);
}

// ---- Pipeline ------------------------------------------------------------------------------

TEST(Patterns, OffDeterministicAndIdempotent) {
  const Graph g = GptMlp({});
  PassOptions off;
  off.patterns = false;
  PassStats stats;
  const Graph without = Optimized(g, &stats, off);
  EXPECT_EQ(stats.patterns_replaced, 0u);
  EXPECT_EQ(CountOp(without, "aten.gelu.default"), 0u);
  const Graph first = Optimized(g);
  const Graph second = Optimized(g);
  EXPECT_EQ(GraphHash(first), GraphHash(second));
  PassStats again;
  const Graph twice = Optimized(first, &again);
  EXPECT_EQ(GraphHash(twice), GraphHash(first));
  EXPECT_EQ(again.patterns_replaced, 0u);
  EXPECT_EQ(again.iterations, 1u);
  // The pass alone on a graph with nothing to replace leaves it as it was.
  Graph plain = first;
  absl::StatusOr<PatternStats> none = ReplacePatterns(&plain);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->replaced(), 0u);
  EXPECT_EQ(GraphHash(plain), GraphHash(first));
  EXPECT_EQ(plain.values.size(), first.values.size());
}

// ---- Compiled and run ----------------------------------------------------------------------

class PatternsRunTest : public ::testing::Test {
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

  // Compiles and runs `graph` on `inputs`; returns every output as floats.
  std::vector<std::vector<float>> Run(const Graph& graph,
                                      const std::vector<std::vector<float>>& inputs,
                                      CompileStats* stats) {
    absl::StatusOr<std::vector<uint8_t>> executable = CompileGraph(graph, {}, stats);
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
    for (const std::vector<float>& values : inputs) {
      const std::vector<uint8_t> bytes = Bytes(values);
      buffers.push_back(Buffer(bytes.size()));
      EXPECT_EQ(tern_buffer_write(buffers.back(), 0, bytes.data(), bytes.size()), TERN_OK);
      in_bindings.push_back({buffers.back(), 0});
    }
    std::vector<size_t> counts;
    for (const Graph::Output& output : graph.outputs) {
      const TensorType& type = graph.values[output.value].type;
      EXPECT_EQ(type.dtype, TERN_DTYPE_F32);
      counts.push_back(static_cast<size_t>(*ConstantElements(type.shape)));
      buffers.push_back(Buffer(counts.back() * sizeof(float)));
      out_bindings.push_back({buffers.back(), 0});
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
      EXPECT_EQ(
          tern_buffer_read(out_bindings[j].buffer, 0, values.data(), counts[j] * sizeof(float)),
          TERN_OK);
      results.push_back(std::move(values));
    }
    EXPECT_EQ(tern_executable_unload(loaded), TERN_OK);
    for (tern_buffer_t buffer : buffers) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    return results;
  }

  // The graph as written and optimised (patterns on) give outputs within
  // 1e-5 relative (plus 1e-6 absolute, for values near 0); returns the
  // compile stats after.
  CompileStats ExpectClose(const Graph& graph, const std::vector<std::vector<float>>& inputs,
                           const char* what) {
    SCOPED_TRACE(what);
    PassStats pass_stats;
    const Graph optimized = Optimized(graph, &pass_stats);
    EXPECT_GE(pass_stats.patterns_replaced, 1u);
    CompileStats before, after;
    const auto want = Run(graph, inputs, &before);
    const auto got = Run(optimized, inputs, &after);
    EXPECT_EQ(got.size(), want.size());
    double worst = 0.0;
    for (size_t j = 0; j < got.size() && j < want.size(); ++j) {
      EXPECT_EQ(got[j].size(), want[j].size());
      for (size_t i = 0; i < got[j].size() && i < want[j].size(); ++i) {
        const double diff = std::abs(static_cast<double>(got[j][i]) - want[j][i]);
        EXPECT_LE(diff, 1e-5 * std::abs(want[j][i]) + 1e-6)
            << "output " << j << " element " << i << ": " << got[j][i] << " vs " << want[j][i];
        worst = std::max(worst, diff / std::max(1e-6, std::abs(static_cast<double>(want[j][i]))));
      }
    }
    EXPECT_LE(after.compute_instructions, before.compute_instructions);
    EXPECT_LT(after.compute_instructions_unfused, before.compute_instructions_unfused);
    std::printf(
        "[ patterns ] %s: %u -> %u nodes, %u -> %u compute instructions (%u -> %u unfused), "
        "worst relative difference %.2g\n",
        what, pass_stats.nodes_before, pass_stats.nodes_after, before.compute_instructions,
        after.compute_instructions, before.compute_instructions_unfused,
        after.compute_instructions_unfused, worst);
    return after;
  }

  tern_device_t device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

TEST_F(PatternsRunTest, ReplacedGraphsComputeTheSame) {
  {
    const CompileStats after = ExpectClose(GptMlp({}), {Values(48, 1, 2.0f)}, "GPT2MLP gelu_new");
    // addmm + gelu_tanh is one matmul with the activation epilogue; then
    // the second addmm.
    EXPECT_EQ(after.compute_instructions, 2u);
    EXPECT_EQ(after.epilogues, 1u);
  }
  GeluOptions mul_cube;
  mul_cube.cube = Cube::kMulSquare;
  mul_cube.swapped = true;
  ExpectClose(GptMlp(mul_cube), {Values(48, 2, 2.0f)}, "gelu_new x*(x*x), swapped");
  ExpectClose(GeluErf(true, 1.4142135623730951, false), {Values(64, 3, 3.0f)}, "gelu erf");
  ExpectClose(Rms({}), {Values(96, 4, 2.0f)}, "LlamaRMSNorm");
  RmsOptions casts;
  casts.identity_casts = true;
  casts.weight_first = false;
  ExpectClose(Rms(casts), {Values(96, 5, 2.0f)}, "RMSNorm with identity casts");
  ExpectClose(Softmax(false, {-1}, {-1}), {Values(150, 6, 4.0f)}, "softmax");
  ExpectClose(Softmax(true, {1}, {1}), {Values(150, 7, 4.0f)}, "log_softmax");
  ExpectClose(LayerNorm(false, true, true), {Values(144, 8, 2.0f)}, "LayerNorm sqrt/div");
  ExpectClose(LayerNorm(true, false, true), {Values(144, 9, 2.0f)}, "LayerNorm rsqrt");
}

}  // namespace
}  // namespace tern::compiler
