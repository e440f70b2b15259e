// The graph passes (compiler/passes): golden graphs for dead-code
// elimination, common-subexpression elimination, constant folding (bytes
// worked out by hand as PyTorch computes them) and symbol binding with each
// of its errors; the pipeline's determinism and idempotence; optimised
// graphs compiled and run on the simulated device against the original
// graphs; ternc's --bind and --no-optimize; and the time to optimise a
// 1,500-node graph (printed).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <tern/tern.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "compiler/graph_file/graph_file.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/hash.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/verify.h"
#include "compiler/lower/compile.h"
#include "compiler/passes/bind_symbols.h"
#include "compiler/passes/constant_fold.h"
#include "compiler/passes/cse.h"
#include "compiler/passes/dead_code.h"
#include "compiler/passes/pipeline.h"

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
using Ints = std::vector<int64_t>;

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<uint8_t> FloatBits(const std::vector<uint32_t>& bits) { return Bytes(bits); }

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

std::vector<std::string> NodeNames(const Graph& graph) {
  std::vector<std::string> names;
  for (const Node& node : graph.nodes) names.push_back(node.name);
  return names;
}

std::vector<std::string> ConstantNames(const Graph& graph) {
  std::vector<std::string> names;
  for (const Value& value : graph.values) {
    if (value.kind == Value::kConstant) names.push_back(value.name);
  }
  return names;
}

// The bytes of the graph output `name` when it is a constant; empty
// otherwise.
std::vector<uint8_t> ConstantOutput(const Graph& graph, const std::string& name) {
  for (const Graph::Output& output : graph.outputs) {
    if (output.name != name) continue;
    const Value& value = graph.values[output.value];
    if (value.kind != Value::kConstant) return {};
    return graph.constants[value.index];
  }
  return {};
}

bool IsNodeOutput(const Graph& graph, const std::string& name, const std::string& op) {
  for (const Graph::Output& output : graph.outputs) {
    if (output.name != name) continue;
    const Value& value = graph.values[output.value];
    return value.kind == Value::kNode && graph.nodes[value.node].op == op;
  }
  return false;
}

Graph Optimized(const Graph& graph, PassStats* stats = nullptr, PassOptions options = {}) {
  absl::StatusOr<Graph> optimized = OptimizeGraph(graph, options, stats);
  EXPECT_TRUE(optimized.ok()) << optimized.status();
  return optimized.ok() ? *std::move(optimized) : Graph{};
}

// ---- Dead-code elimination -------------------------------------------------------------

TEST(DeadCode, DropsExactlyTheDeadNodesAndUnreadConstants) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4})));
  const uint32_t unused_input = g.AddInput("unused", F32(S({4})));
  const uint32_t c_used = g.AddConstant("c_used", F32(S({4})), Bytes(Values(4, 1)));
  const uint32_t c_dead = g.AddConstant("c_dead", F32(S({4})), Bytes(Values(4, 2)));
  g.AddConstant("c_unread", F32(S({4})), Bytes(Values(4, 3)));
  const uint32_t e = Out(g, AddNode(&g, "aten.exp.default", {x}, {}, "exp"));
  const uint32_t r = Out(g, AddNode(&g, "aten.relu.default", {x}, {}, "dead_relu"));
  Out(g, AddNode(&g, "aten.add.Tensor", {r, c_dead}, {}, "dead_add"));
  const uint32_t sum = Out(g, AddNode(&g, "aten.add.Tensor", {e, c_used}, {}, "add"));
  // Layer norm with only its first output used stays whole.
  absl::StatusOr<uint32_t> ln =
      AddNode(&g, "aten.native_layer_norm.default", {sum, kNoValue, kNoValue},
              {A("normalized_shape", Ints{4})}, "ln");
  ASSERT_TRUE(ln.ok()) << ln.status();
  Out(g, AddNode(&g, "aten.neg.default", {unused_input}, {}, "dead_neg"));
  // A mutated state: its output is written back into `state`.
  const uint32_t state = g.AddInput("state", F32(S({4})));
  const uint32_t next = Out(g, AddNode(&g, "aten.add.Tensor", {state, x}, {}, "state_next"));
  g.AddOutput("y", g.nodes[*ln].outputs[0]);
  g.AddOutput("state_out", next);
  g.mutations.push_back({2, 1});
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);

  absl::StatusOr<DeadCodeStats> stats = EliminateDeadCode(&g);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->nodes_removed, 3u);
  EXPECT_EQ(stats->constants_removed, 2u);
  EXPECT_EQ(NodeNames(g), (std::vector<std::string>{"exp", "add", "ln", "state_next"}));
  EXPECT_EQ(ConstantNames(g), (std::vector<std::string>{"c_used"}));
  EXPECT_EQ(g.inputs.size(), 3u) << "inputs are the signature: they stay";
  // Dense renumbering: 3 inputs, 1 constant, 1 + 1 + 3 + 1 node outputs.
  EXPECT_EQ(g.values.size(), 10u);
  EXPECT_EQ(g.constants.size(), 1u);
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);
  EXPECT_EQ(g.values[g.outputs[1].value].name, "state_next");

  // Nothing left to remove: the graph is untouched.
  const uint64_t hash = GraphHash(g);
  stats = EliminateDeadCode(&g);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->nodes_removed + stats->constants_removed, 0u);
  EXPECT_EQ(GraphHash(g), hash);
}

// ---- Common-subexpression elimination ----------------------------------------------------

TEST(Cse, MergesDuplicateChainsAndConstants) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({2, 4})));
  const std::vector<float> data = Values(8, 7);
  const uint32_t c1 = g.AddConstant("c1", F32(S({2, 4})), Bytes(data));
  const uint32_t c2 = g.AddConstant("c2", F32(S({2, 4})), Bytes(data));  // same as c1
  const uint32_t c3 = g.AddConstant("c3", F32(S({8})), Bytes(data));     // other shape
  const uint32_t a = Out(g, AddNode(&g, "aten.exp.default", {x}, {}, "exp_a"));
  const uint32_t b = Out(g, AddNode(&g, "aten.exp.default", {x}, {}, "exp_b"));
  const uint32_t ra = Out(g, AddNode(&g, "aten.add.Tensor", {a, c1}, {}, "add_a"));
  const uint32_t rb = Out(g, AddNode(&g, "aten.add.Tensor", {b, c2}, {}, "add_b"));  // chain
  // Attributes compared exactly.
  const uint32_t s0 =
      Out(g, AddNode(&g, "aten.mul.Tensor", {x, kNoValue}, {A("other", 2.0)}, "m0"));
  const uint32_t s1 =
      Out(g, AddNode(&g, "aten.mul.Tensor", {x, kNoValue}, {A("other", 2.0)}, "m1"));
  const uint32_t z0 =
      Out(g, AddNode(&g, "aten.mul.Tensor", {x, kNoValue}, {A("other", 0.0)}, "z0"));
  const uint32_t z1 =
      Out(g, AddNode(&g, "aten.mul.Tensor", {x, kNoValue}, {A("other", -0.0)}, "z1"));
  const uint32_t i2 =
      Out(g, AddNode(&g, "aten.mul.Tensor", {x, kNoValue}, {A("other", int64_t{2})}, "i2"));
  const uint32_t sm0 =
      Out(g, AddNode(&g, "aten._softmax.default", {x}, {A("dim", int64_t{0})}, "softmax0"));
  const uint32_t sm1 =
      Out(g, AddNode(&g, "aten._softmax.default", {x}, {A("dim", int64_t{1})}, "softmax1"));
  const uint32_t v = Out(g, AddNode(&g, "aten.view.default", {c3}, {A("size", S({2, 4}))}, "v"));
  int index = 0;
  for (uint32_t value : {ra, rb, s0, s1, z0, z1, i2, sm0, sm1, v}) {
    g.AddOutput("y" + std::to_string(index++), value);
  }
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);

  absl::StatusOr<CseStats> stats = EliminateCommonSubexpressions(&g);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->constants_merged, 1u);
  EXPECT_EQ(stats->nodes_merged, 3u);  // exp_b, add_b (through exp_b and c2), m1
  EXPECT_EQ(NodeNames(g), (std::vector<std::string>{"exp_a", "add_a", "m0", "z0", "z1", "i2",
                                                    "softmax0", "softmax1", "v"}));
  EXPECT_EQ(ConstantNames(g), (std::vector<std::string>{"c1", "c3"}));
  EXPECT_EQ(g.outputs[0].value, g.outputs[1].value);
  EXPECT_EQ(g.outputs[2].value, g.outputs[3].value);
  EXPECT_NE(g.outputs[4].value, g.outputs[5].value) << "0.0 and -0.0 differ";
  EXPECT_NE(g.outputs[2].value, g.outputs[6].value) << "2.0 and the int 2 are other attributes";
  EXPECT_NE(g.outputs[7].value, g.outputs[8].value);
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);
}

TEST(Cse, NeverMergesRandomOps) {
  // The op table has no random op yet: these nodes are built with their
  // types (CSE needs no inference), as a front end that knew them would.
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4})));
  const std::vector<TensorType> one = {F32(S({4}))};
  const std::vector<TensorType> two = {F32(S({4})), {TERN_DTYPE_BOOL, S({4})}};
  const uint32_t d0 = g.AddNodeWithTypes("aten.native_dropout.default", {x},
                                         {A("p", 0.5), A("train", true)}, two, "dropout0");
  const uint32_t d1 = g.AddNodeWithTypes("aten.native_dropout.default", {x},
                                         {A("p", 0.5), A("train", true)}, two, "dropout1");
  const uint32_t r0 = g.AddNodeWithTypes("aten.rand_like.default", {x}, {}, one, "rand0");
  const uint32_t r1 = g.AddNodeWithTypes("aten.rand_like.default", {x}, {}, one, "rand1");
  const uint32_t e0 = g.AddNodeWithTypes("aten.exp.default", {x}, {}, one, "exp0");
  const uint32_t e1 = g.AddNodeWithTypes("aten.exp.default", {x}, {}, one, "exp1");
  int index = 0;
  for (uint32_t node : {d0, d1, r0, r1, e0, e1}) {
    g.AddOutput("y" + std::to_string(index++), g.nodes[node].outputs[0]);
  }
  absl::StatusOr<CseStats> stats = EliminateCommonSubexpressions(&g);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->nodes_merged, 1u);
  EXPECT_EQ(NodeNames(g),
            (std::vector<std::string>{"dropout0", "dropout1", "rand0", "rand1", "exp0"}));

  for (const char* op :
       {"aten.rand.default", "aten.randn_like.default", "aten.randint.low", "aten.bernoulli.p",
        "aten.native_dropout.default", "aten.normal.Tensor_float", "aten.uniform.default",
        "aten.multinomial.default", "aten.randperm.default", "aten.empty.memory_format",
        "aten.add_.Tensor", "aten.copy_.default", "aten._assert_async.msg"}) {
    EXPECT_FALSE(MayMerge(op)) << op;
  }
  // Every op the table knows is deterministic and free of side effects.
  for (std::string_view op : KnownOps()) EXPECT_TRUE(MayMerge(op)) << op;
}

// ---- Constant folding -------------------------------------------------------------------

// A graph of constants: each output is one node over them.
struct FoldCase {
  Graph g;
  uint32_t Constant(const char* name, TensorType type, std::vector<uint8_t> bytes) {
    return g.AddConstant(name, std::move(type), std::move(bytes));
  }
  uint32_t Node(const char* op, std::vector<uint32_t> inputs, std::vector<Attribute> attrs,
                const char* name) {
    return Out(g, AddNode(&g, op, std::move(inputs), std::move(attrs), name));
  }
};

TEST(Fold, F32ArithmeticGivesPyTorchsBytes) {
  FoldCase f;
  const uint32_t a = f.Constant("a", F32(S({2, 2})), Bytes(std::vector<float>{1, 2, 3, 4}));
  const uint32_t b = f.Constant("b", F32(S({2})), Bytes(std::vector<float>{0.5f, -1}));
  const uint32_t three = f.Constant("three", F32(S({1})), Bytes(std::vector<float>{3}));
  const uint32_t zero = f.Constant("zero", F32(S({})), Bytes(std::vector<float>{0}));
  Graph& g = f.g;
  g.AddOutput("add", f.Node("aten.add.Tensor", {a, b}, {}, "add"));  // b broadcast over rows
  g.AddOutput("sub", f.Node("aten.sub.Tensor", {a, b}, {}, "sub"));
  g.AddOutput("mul", f.Node("aten.mul.Tensor", {a, kNoValue}, {A("other", 0.1)}, "mul"));
  g.AddOutput("div", f.Node("aten.div.Tensor", {b, three}, {}, "div"));
  g.AddOutput("div0", f.Node("aten.div.Tensor", {b, zero}, {}, "div0"));
  g.AddOutput("neg", f.Node("aten.neg.default", {b}, {}, "neg"));
  g.AddOutput("addi", f.Node("aten.add.Scalar", {b}, {A("other", int64_t{2})}, "addi"));
  g.AddOutput("alpha1", f.Node("aten.add.Tensor", {a, b}, {A("alpha", int64_t{1})}, "alpha1"));
  g.AddOutput("alpha2", f.Node("aten.add.Tensor", {a, b}, {A("alpha", 2.0)}, "alpha2"));
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);

  PassStats stats;
  const Graph o = Optimized(g, &stats);
  EXPECT_EQ(ConstantOutput(o, "add"), Bytes(std::vector<float>{1.5f, 1, 3.5f, 3}));
  EXPECT_EQ(ConstantOutput(o, "sub"), Bytes(std::vector<float>{0.5f, 3, 2.5f, 5}));
  // 0.1 becomes the float 0x3DCCCCCD first; 3 * that rounds to 0x3E99999A
  // (0.3000000119), 2 * and 4 * are exact.
  EXPECT_EQ(ConstantOutput(o, "mul"),
            FloatBits({0x3DCCCCCDu, 0x3E4CCCCDu, 0x3E99999Au, 0x3ECCCCCDu}));
  // 0.5 / 3 = 0x3E2AAAAB (round to nearest), -1 / 3 = 0xBEAAAAAB.
  EXPECT_EQ(ConstantOutput(o, "div"), FloatBits({0x3E2AAAABu, 0xBEAAAAABu}));
  EXPECT_EQ(ConstantOutput(o, "div0"), FloatBits({0x7F800000u, 0xFF800000u}));  // +-inf
  EXPECT_EQ(ConstantOutput(o, "neg"), Bytes(std::vector<float>{-0.5f, 1}));
  EXPECT_EQ(ConstantOutput(o, "addi"), Bytes(std::vector<float>{2.5f, 1}));
  EXPECT_EQ(ConstantOutput(o, "alpha1"), Bytes(std::vector<float>{1.5f, 1, 3.5f, 3}));
  EXPECT_TRUE(IsNodeOutput(o, "alpha2", "aten.add.Tensor")) << "alpha 2 is not folded";
  EXPECT_EQ(stats.nodes_folded, 8u);
  // The folded constants are named after their nodes.
  EXPECT_EQ(o.values[o.outputs[0].value].name, "add");
  // Only the inputs of the unfolded node stay.
  EXPECT_EQ(o.nodes.size(), 1u);
}

TEST(Fold, LayoutOpsFeedFoldsAndLeafViewsStayStrided) {
  FoldCase f;
  std::vector<float> iota(12);
  for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<float>(i);
  const uint32_t c = f.Constant("c", F32(S({3, 4})), Bytes(iota));
  Graph& g = f.g;
  const uint32_t x = g.AddInput("x", F32(S({4, 3})));
  // permute -> neg: both folded (the permute through the neg).
  const uint32_t t = f.Node("aten.permute.default", {c}, {A("dims", Ints{1, 0})}, "t");
  g.AddOutput("neg_t", f.Node("aten.neg.default", {t}, {}, "neg_t"));
  // slice (cols 1 and 3) and select (last row), through a neg.
  const uint32_t sl =
      f.Node("aten.slice.Tensor", {c},
             {A("dim", int64_t{1}), A("start", int64_t{1}), A("step", int64_t{2})}, "slice");
  g.AddOutput("neg_slice", f.Node("aten.neg.default", {sl}, {}, "neg_slice"));
  const uint32_t se =
      f.Node("aten.select.int", {c}, {A("dim", int64_t{0}), A("index", int64_t{-1})}, "select");
  g.AddOutput("neg_select", f.Node("aten.neg.default", {se}, {}, "neg_select"));
  // A view of the constant read by a node of the input: left to the
  // lowering's strided operands.
  g.AddOutput("leaf", f.Node("aten.add.Tensor", {x, t}, {}, "leaf"));
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);

  const Graph o = Optimized(g);
  auto negated = [](std::vector<float> v) {
    for (float& e : v) e = -e;
    return Bytes(v);
  };
  EXPECT_EQ(ConstantOutput(o, "neg_t"), negated({0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(ConstantOutput(o, "neg_slice"), negated({1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(ConstantOutput(o, "neg_select"), negated({8, 9, 10, 11}));
  EXPECT_EQ(NodeNames(o), (std::vector<std::string>{"t", "leaf"}));
  EXPECT_EQ(ConstantNames(o), (std::vector<std::string>{"c", "neg_t", "neg_slice", "neg_select"}));

  // With fold_layout_leaves, the permute becomes a constant too.
  PassOptions options;
  options.fold_options.fold_layout_leaves = true;
  const Graph all = Optimized(g, nullptr, options);
  EXPECT_EQ(NodeNames(all), (std::vector<std::string>{"leaf"}));
  const Node& leaf = all.nodes[0];
  const Value& folded_t = all.values[leaf.inputs[1]];
  ASSERT_EQ(folded_t.kind, Value::kConstant);
  EXPECT_EQ(folded_t.name, "t");
  EXPECT_EQ(all.constants[folded_t.index],
            Bytes(std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

TEST(Fold, CatAndRelabelsAndExpand) {
  FoldCase f;
  const uint32_t p = f.Constant("p", F32(S({2, 1})), Bytes(std::vector<float>{1, 2}));
  const uint32_t q = f.Constant("q", {TERN_DTYPE_BF16, S({2, 2})},
                                Bytes(std::vector<uint16_t>{0x3F80, 0x4040, 0xC000, 0x3F00}));
  const uint32_t s = f.Constant("s", F32(S({1})), Bytes(std::vector<float>{7}));
  Graph& g = f.g;
  // cat of f32 [2,1] and bf16 [2,2] along dim 1: f32 [2,3] (1, 3, -2, 0.5).
  g.AddOutput("cat", f.Node("aten.cat.default", {p, q}, {A("dim", int64_t{1})}, "cat"));
  const uint32_t v = f.Node("aten.view.default", {p}, {A("size", S({2}))}, "v");
  const uint32_t u = f.Node("aten.unsqueeze.default", {v}, {A("dim", int64_t{0})}, "u");
  g.AddOutput("relabel", f.Node("aten.neg.default", {u}, {}, "neg_u"));
  const uint32_t e4 = f.Node("aten.expand.default", {s}, {A("size", S({4}))}, "expand4");
  g.AddOutput("expand4", f.Node("aten.neg.default", {e4}, {}, "neg_e4"));
  // 4 KiB from 4 bytes: over the growth limit; stays a broadcast view.
  const uint32_t big = f.Node("aten.expand.default", {s}, {A("size", S({1024}))}, "expand_big");
  g.AddOutput("expand_big", f.Node("aten.neg.default", {big}, {}, "neg_big"));
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);

  PassStats stats;
  const Graph o = Optimized(g, &stats);
  EXPECT_EQ(ConstantOutput(o, "cat"), Bytes(std::vector<float>{1, 1, 3, 2, -2, 0.5f}));
  EXPECT_EQ(ConstantOutput(o, "relabel"), Bytes(std::vector<float>{-1, -2}));
  EXPECT_EQ(ConstantOutput(o, "expand4"), Bytes(std::vector<float>{-7, -7, -7, -7}));
  EXPECT_TRUE(IsNodeOutput(o, "expand_big", "aten.neg.default"));
  EXPECT_EQ(NodeNames(o), (std::vector<std::string>{"expand_big", "neg_big"}));
  EXPECT_EQ(stats.folds_declined, 1u);
}

TEST(Fold, SizeLimits) {
  // neg of a constant just over 16 MiB: not folded.
  FoldCase f;
  const size_t count = (16u << 20) / 4 + 1;
  const uint32_t c =
      f.Constant("big", F32(S({static_cast<int64_t>(count)})), std::vector<uint8_t>(count * 4, 0));
  f.g.AddOutput("y", f.Node("aten.neg.default", {c}, {}, "neg"));
  PassStats stats;
  const Graph o = Optimized(f.g, &stats);
  EXPECT_TRUE(IsNodeOutput(o, "y", "aten.neg.default"));
  EXPECT_EQ(stats.nodes_folded, 0u);
  EXPECT_EQ(stats.folds_declined, 1u);

  // The growth limit is exactly 4x: [1] -> [4] folds, [1] -> [5] does not.
  FoldCase g;
  const uint32_t s = g.Constant("s", F32(S({1})), Bytes(std::vector<float>{2}));
  const uint32_t e4 = g.Node("aten.expand.default", {s}, {A("size", S({4}))}, "e4");
  const uint32_t e5 = g.Node("aten.expand.default", {s}, {A("size", S({5}))}, "e5");
  g.g.AddOutput("four", g.Node("aten.neg.default", {e4}, {}, "n4"));
  g.g.AddOutput("five", g.Node("aten.neg.default", {e5}, {}, "n5"));
  const Graph o2 = Optimized(g.g, &stats);
  EXPECT_EQ(ConstantOutput(o2, "four"), Bytes(std::vector<float>{-2, -2, -2, -2}));
  EXPECT_TRUE(IsNodeOutput(o2, "five", "aten.neg.default"));
}

TEST(Fold, ToCopyRoundsToNearestEvenAndIsExactWithIntegers) {
  FoldCase f;
  // f32 -> bf16: 1 + 2^-8 is a tie (to 1.0, even), 1 + 3 * 2^-8 a tie to
  // 1 + 2^-6 (even), 1 + 2^-8 + 2^-20 above the tie; -2.5; 1e-40 (a
  // subnormal: 0x000116C2 rounds to 0x0001).
  const uint32_t a = f.Constant(
      "a", F32(S({6})),
      FloatBits({0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F808010u, 0xC0200000u, 0x000116C2u}));
  // f32 -> f16: 1.0, 65504 (largest), 65520 (ties up to inf), 1 + 2^-11
  // (tie to 1.0), 1 + 3 * 2^-11 (tie to 1 + 2^-9), 6e-8 (nearest 2^-24),
  // 2^-25 (a tie to 0), 1e-4 (subnormal 0x068E), -0.0.
  const uint32_t h =
      f.Constant("h", F32(S({9})),
                 FloatBits({0x3F800000u, 0x477FE000u, 0x477FF000u, 0x3F801000u, 0x3F803000u,
                            0x3380D959u, 0x33000000u, 0x38D1B717u, 0x80000000u}));
  const uint32_t ints = f.Constant("ints", {TERN_DTYPE_I64, S({3})}, Bytes(Ints{1, -2, 16777216}));
  const uint32_t odd = f.Constant("odd", {TERN_DTYPE_I64, S({1})}, Bytes(Ints{16777217}));
  const uint32_t whole = f.Constant("whole", F32(S({2})), Bytes(std::vector<float>{2, -3}));
  const uint32_t half = f.Constant("half", F32(S({1})), Bytes(std::vector<float>{2.5f}));
  const uint32_t nan = f.Constant("nan", F32(S({1})), FloatBits({0x7FC00000u}));
  const uint32_t f16 =
      f.Constant("f16", {TERN_DTYPE_F16, S({2})}, Bytes(std::vector<uint16_t>{0x3C01, 0x7E00}));
  auto to = [&](uint32_t input, tern_dtype_t dtype, const char* name) {
    return f.Node("aten._to_copy.default", {input}, {A("dtype", DTypeAttr{dtype})}, name);
  };
  Graph& g = f.g;
  g.AddOutput("bf16", to(a, TERN_DTYPE_BF16, "to_bf16"));
  g.AddOutput("f16", to(h, TERN_DTYPE_F16, "to_f16"));
  g.AddOutput("i64_f32", to(ints, TERN_DTYPE_F32, "i64_f32"));
  g.AddOutput("inexact", to(odd, TERN_DTYPE_F32, "inexact"));  // 2^24 + 1: not a float
  g.AddOutput("f32_i32", to(whole, TERN_DTYPE_I32, "f32_i32"));
  g.AddOutput("f32_i32_frac", to(half, TERN_DTYPE_I32, "f32_i32_frac"));
  g.AddOutput("nan_bf16", to(nan, TERN_DTYPE_BF16, "nan_bf16"));
  g.AddOutput("f16_f32", to(f16, TERN_DTYPE_F32, "f16_f32"));  // widening keeps NaN bits
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);

  PassStats stats;
  const Graph o = Optimized(g, &stats);
  EXPECT_EQ(ConstantOutput(o, "bf16"),
            Bytes(std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x0001}));
  EXPECT_EQ(ConstantOutput(o, "f16"),
            Bytes(std::vector<uint16_t>{0x3C00, 0x7BFF, 0x7C00, 0x3C00, 0x3C02, 0x0001, 0x0000,
                                        0x068E, 0x8000}));
  EXPECT_EQ(ConstantOutput(o, "i64_f32"), Bytes(std::vector<float>{1, -2, 16777216}));
  EXPECT_TRUE(IsNodeOutput(o, "inexact", "aten._to_copy.default"));
  EXPECT_EQ(ConstantOutput(o, "f32_i32"), Bytes(std::vector<int32_t>{2, -3}));
  EXPECT_TRUE(IsNodeOutput(o, "f32_i32_frac", "aten._to_copy.default"));
  EXPECT_TRUE(IsNodeOutput(o, "nan_bf16", "aten._to_copy.default"));
  EXPECT_EQ(ConstantOutput(o, "f16_f32"), FloatBits({0x3F802000u, 0x7FC00000u}));
  EXPECT_EQ(stats.folds_declined, 3u);
}

// ---- Symbol binding ---------------------------------------------------------------------

// x [s0, 64] -> view [s0 * 64] -> exp; y [s1, 4] -> relu; an unused s2.
Graph Dynamic() {
  Graph g;
  g.symbols = {{"s0", 1, 512}, {"s1", 1, 8}, {"s2", 2, 4}};
  const uint32_t x = g.AddInput("x", F32({Dim::Of(0), Dim::Constant(64)}));
  const uint32_t y = g.AddInput("y", F32({Dim::Of(1), Dim::Constant(4)}));
  const uint32_t v = Out(
      g, AddNode(&g, "aten.view.default", {x}, {A("size", Shape{Dim::Affine(0, 64, 0)})}, "flat"));
  g.AddOutput("a", Out(g, AddNode(&g, "aten.exp.default", {v}, {}, "exp")));
  g.AddOutput("b", Out(g, AddNode(&g, "aten.relu.default", {y}, {}, "relu")));
  EXPECT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);
  return g;
}

TEST(Bind, SubstitutesTypesAndShapeAttributes) {
  const Graph g = Dynamic();
  absl::StatusOr<Graph> bound = BindSymbols(g, {{"s0", 128}});
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_TRUE(VerifyGraph(*bound).ok()) << VerifyGraph(*bound);
  ASSERT_EQ(bound->symbols.size(), 2u);
  EXPECT_EQ(bound->symbols[0].name, "s1");
  EXPECT_EQ(bound->values[bound->inputs[0]].type.shape, S({128, 64}));
  // y's s1 is renumbered: symbol 0 of the result.
  EXPECT_EQ(bound->values[bound->inputs[1]].type.shape, (Shape{Dim::Of(0), Dim::Constant(4)}));
  const Attribute* size = FindAttr(bound->nodes[0], "size");
  ASSERT_NE(size, nullptr);
  EXPECT_EQ(std::get<Shape>(size->value), S({8192}));

  // Fully static: s2 is used by nothing and goes too.
  absl::StatusOr<Graph> all = BindSymbols(g, {{"s0", 1}, {"s1", 8}}, {.require_static = true});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->symbols.empty());
  ASSERT_TRUE(VerifyGraph(*all).ok()) << VerifyGraph(*all);
  EXPECT_TRUE(CompileGraph(*all, {}, nullptr).ok());
}

TEST(Bind, ErrorsNameTheSymbolTheValueAndTheRange) {
  const Graph g = Dynamic();
  absl::StatusOr<Graph> bound = BindSymbols(g, {{"n", 3}});
  ASSERT_FALSE(bound.ok());
  EXPECT_CONTAINS(bound.status().message(), "cannot bind 'n'");
  EXPECT_CONTAINS(bound.status().message(), "s0 in [1, 512], s1 in [1, 8], s2 in [2, 4]");

  bound = BindSymbols(g, {{"s0", 1000}});
  ASSERT_FALSE(bound.ok());
  EXPECT_CONTAINS(bound.status().message(), "cannot bind s0 = 1000");
  EXPECT_CONTAINS(bound.status().message(), "[1, 512]");
  bound = BindSymbols(g, {{"s0", 0}});
  ASSERT_FALSE(bound.ok());
  EXPECT_CONTAINS(bound.status().message(), "s0 = 0");

  bound = BindSymbols(g, {{"s0", 16}}, {.require_static = true});
  ASSERT_FALSE(bound.ok());
  EXPECT_CONTAINS(bound.status().message(), "s1 in [1, 8] are not bound");
  EXPECT_EQ(std::string(bound.status().message()).find("s2"), std::string::npos)
      << "s2 is used by nothing: " << bound.status().message();

  // A dim that overflows for the value bound.
  Graph huge;
  huge.symbols = {{"s0", 1, int64_t{1} << 40}};
  huge.AddInput("x", F32({Dim::Affine(0, int64_t{1} << 30, 0)}));
  bound = BindSymbols(huge, {{"s0", int64_t{1} << 40}});
  ASSERT_FALSE(bound.ok());
  EXPECT_CONTAINS(bound.status().message(), "out of the int64 range");

  // In place: an error leaves the graph as it was.
  Graph copy = g;
  EXPECT_FALSE(BindSymbolsInPlace(&copy, {{"s1", 9}}).ok());
  EXPECT_EQ(GraphHash(copy), GraphHash(g));
  EXPECT_EQ(copy.symbols.size(), 3u);

  // Through the pipeline.
  PassOptions options;
  options.bindings = {{"s0", 4}};
  options.require_static = true;
  absl::StatusOr<Graph> optimized = OptimizeGraph(g, options, nullptr);
  ASSERT_FALSE(optimized.ok());
  EXPECT_CONTAINS(optimized.status().message(), "s1 in [1, 8]");
  options.bindings["s1"] = 2;
  PassStats stats;
  optimized = OptimizeGraph(g, options, &stats);
  ASSERT_TRUE(optimized.ok()) << optimized.status();
  EXPECT_EQ(stats.symbols_bound, 3u);  // s0, s1, and the unused s2
  EXPECT_EQ(optimized->values[optimized->inputs[1]].type.shape, S({2, 4}));
}

// ---- The pipeline ------------------------------------------------------------------------

TEST(Pipeline, RefusesAnInvalidGraph) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4})));
  g.AddNodeWithTypes("aten.exp.default", {x}, {}, {F32(S({5}))}, "exp");
  g.AddOutput("y", g.nodes[0].outputs[0]);
  absl::StatusOr<Graph> optimized = OptimizeGraph(g, {}, nullptr);
  ASSERT_FALSE(optimized.ok());
  EXPECT_CONTAINS(optimized.status().message(), "recorded as f32 [5]");
}

// A graph with something for every pass: duplicated blocks, constant
// arithmetic (a scaled bias), dead branches. `blocks` blocks of about 15
// nodes, each x -> mm -> add bias -> relu -> ... accumulated into y.
Graph Mixed(int blocks, int64_t width = 16) {
  Graph g;
  const uint32_t x = g.AddInput("x", F32(S({4, width})));
  uint32_t y = x;
  for (int b = 0; b < blocks; ++b) {
    const std::string p = "b" + std::to_string(b) + "_";
    const uint32_t w = g.AddConstant(p + "w", F32(S({width, width})),
                                     Bytes(Values(static_cast<size_t>(width * width), b + 1)));
    const uint32_t bias = g.AddConstant(p + "bias", F32(S({width})),
                                        Bytes(Values(static_cast<size_t>(width), b + 1000)));
    const uint32_t scale = g.AddConstant(p + "scale", F32(S({1})), Bytes(std::vector<float>{0.5f}));
    auto node = [&](const char* op, std::vector<uint32_t> in, std::vector<Attribute> attrs,
                    const std::string& name) {
      return Out(g, AddNode(&g, op, std::move(in), std::move(attrs), p + name));
    };
    const uint32_t wt = node("aten.permute.default", {w}, {A("dims", Ints{1, 0})}, "wt");
    const uint32_t h = node("aten.mm.default", {y, wt}, {}, "mm");
    const uint32_t h2 = node("aten.mm.default", {y, wt}, {}, "mm_dup");             // CSE
    const uint32_t sb = node("aten.mul.Tensor", {bias, scale}, {}, "scaled_bias");  // folds
    const uint32_t sb2 = node("aten.add.Tensor", {sb, kNoValue}, {A("other", 1.0)}, "bias1");
    const uint32_t a = node("aten.add.Tensor", {h, sb2}, {}, "add");
    const uint32_t a2 = node("aten.add.Tensor", {h2, sb2}, {}, "add_dup");  // CSE after mm_dup
    const uint32_t r = node("aten.relu.default", {a}, {}, "relu");
    const uint32_t r2 = node("aten.relu.default", {a2}, {}, "relu_dup");
    node("aten.exp.default", {r}, {}, "dead_exp");  // DCE
    node("aten.tanh.default", {node("aten.neg.default", {a}, {}, "dead_neg")}, {}, "dead_tanh");
    const uint32_t s = node("aten.add.Tensor", {r, r2}, {}, "sum");
    const uint32_t t = node("aten.tanh.default", {s}, {}, "tanh");
    y = node("aten.mul.Tensor", {t, kNoValue}, {A("other", 0.5)}, "out");
  }
  g.AddOutput("y", y);
  return g;
}

TEST(Pipeline, IsDeterministicAndIdempotent) {
  const Graph g = Mixed(6);
  ASSERT_TRUE(VerifyGraph(g).ok()) << VerifyGraph(g);
  PassStats stats;
  const Graph first = Optimized(g, &stats);
  EXPECT_EQ(stats.nodes_folded, 12u);     // scaled_bias, bias1 per block
  EXPECT_EQ(stats.nodes_merged, 18u);     // mm_dup, add_dup, relu_dup per block
  EXPECT_EQ(stats.constants_merged, 5u);  // the six scale constants are equal
  EXPECT_EQ(stats.nodes_removed, 18u);    // dead_exp, dead_neg, dead_tanh per block
  // Per block the bias and the folded scaled_bias (read only by bias1's
  // fold), and the one scale left after merging.
  EXPECT_EQ(stats.constants_removed, 13u);
  EXPECT_EQ(stats.nodes_before, g.nodes.size());
  EXPECT_EQ(stats.nodes_after, first.nodes.size());
  EXPECT_EQ(first.nodes.size(), 6u * 7u);  // wt, mm, add, relu, sum, tanh, out
  EXPECT_LE(stats.iterations, 2u);
  const Graph second = Optimized(g);
  EXPECT_EQ(GraphHash(first), GraphHash(second));
  EXPECT_EQ(NodeNames(first), NodeNames(second));
  EXPECT_EQ(first.values.size(), second.values.size());

  Graph in_place = g;
  ASSERT_TRUE(OptimizeGraphInPlace(&in_place, {}, nullptr).ok());
  EXPECT_EQ(GraphHash(in_place), GraphHash(first));

  PassStats again;
  const Graph twice = Optimized(first, &again);
  EXPECT_EQ(GraphHash(twice), GraphHash(first));
  EXPECT_EQ(again.nodes_folded + again.nodes_merged + again.nodes_removed + again.constants_merged +
                again.constants_removed,
            0u);
  EXPECT_EQ(again.iterations, 1u);
}

// ---- Optimised graphs compile and compute the same ----------------------------------------

class PassesRunTest : public ::testing::Test {
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

  // Compiles and runs `graph` on `inputs`; returns every output's bytes.
  std::vector<std::vector<uint8_t>> Run(const Graph& graph,
                                        const std::vector<std::vector<uint8_t>>& inputs,
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
    for (const std::vector<uint8_t>& bytes : inputs) {
      buffers.push_back(Buffer(bytes.size()));
      EXPECT_EQ(tern_buffer_write(buffers.back(), 0, bytes.data(), bytes.size()), TERN_OK);
      in_bindings.push_back({buffers.back(), 0});
    }
    std::vector<size_t> sizes;
    for (const Graph::Output& output : graph.outputs) {
      const TensorType& type = graph.values[output.value].type;
      sizes.push_back(static_cast<size_t>(*ConstantElements(type.shape)) *
                      tern_dtype_size(type.dtype));
      buffers.push_back(Buffer(sizes.back()));
      out_bindings.push_back({buffers.back(), 0});
    }
    EXPECT_EQ(tern_queue_execute(queue_, loaded, 0, in_bindings.data(),
                                 static_cast<uint32_t>(in_bindings.size()), out_bindings.data(),
                                 static_cast<uint32_t>(out_bindings.size()), nullptr),
              TERN_OK)
        << tern_last_error_message();
    EXPECT_EQ(tern_queue_synchronize(queue_, kTimeout), TERN_OK) << tern_last_error_message();
    std::vector<std::vector<uint8_t>> results;
    for (size_t j = 0; j < sizes.size(); ++j) {
      std::vector<uint8_t> bytes(sizes[j]);
      EXPECT_EQ(tern_buffer_read(out_bindings[j].buffer, 0, bytes.data(), sizes[j]), TERN_OK);
      results.push_back(std::move(bytes));
    }
    EXPECT_EQ(tern_executable_unload(loaded), TERN_OK);
    for (tern_buffer_t buffer : buffers) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    return results;
  }

  // The optimised graph compiles into no more instructions and computes
  // the same bytes as the original.
  void ExpectSameResults(const Graph& graph, const std::vector<std::vector<uint8_t>>& inputs,
                         const char* what) {
    SCOPED_TRACE(what);
    PassStats pass_stats;
    const Graph optimized = Optimized(graph, &pass_stats);
    CompileStats before, after;
    const auto want = Run(graph, inputs, &before);
    const auto got = Run(optimized, inputs, &after);
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) EXPECT_EQ(got[j], want[j]) << "output " << j;
    EXPECT_LE(after.instructions, before.instructions);
    EXPECT_LE(after.constant_bytes, before.constant_bytes);
    std::printf(
        "[ passes   ] %s: %u -> %u nodes, %u -> %u instructions, %llu -> %llu constant "
        "bytes (%u folded, %u merged, %u removed)\n",
        what, pass_stats.nodes_before, pass_stats.nodes_after, before.instructions,
        after.instructions, static_cast<unsigned long long>(before.constant_bytes),
        static_cast<unsigned long long>(after.constant_bytes), pass_stats.nodes_folded,
        pass_stats.nodes_merged, pass_stats.nodes_removed);
  }

  tern_device_t device_ = nullptr;
  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

TEST_F(PassesRunTest, OptimizedGraphsComputeTheSameBytes) {
  ExpectSameResults(Mixed(3), {Bytes(Values(4 * 16, 11))}, "mixed blocks");

  // An MLP as torch exports it: nothing to do, the same graph.
  {
    Graph g;
    const uint32_t x = g.AddInput("x", F32(S({4, 8})));
    const uint32_t w = g.AddConstant("fc.weight", F32(S({16, 8})), Bytes(Values(128, 2)));
    const uint32_t b = g.AddConstant("fc.bias", F32(S({16})), Bytes(Values(16, 3)));
    const uint32_t wt = Out(g, AddNode(&g, "aten.permute.default", {w}, {A("dims", Ints{1, 0})}));
    const uint32_t h = Out(g, AddNode(&g, "aten.addmm.default", {b, x, wt}, {}, "fc"));
    g.AddOutput("y", Out(g, AddNode(&g, "aten.relu.default", {h}, {}, "relu")));
    const Graph o = Optimized(g);
    EXPECT_EQ(GraphHash(o), GraphHash(g));
    EXPECT_EQ(o.values.size(), g.values.size());
    ExpectSameResults(g, {Bytes(Values(32, 1))}, "mlp");
  }

  // Positional encodings: a constant table sliced, cast and concatenated
  // at compile time, added to the input; outputs that are constants.
  {
    Graph g;
    const uint32_t x = g.AddInput("x", F32(S({4, 6})));
    const uint32_t table = g.AddConstant("table", F32(S({8, 4})), Bytes(Values(32, 9)));
    const uint32_t rows =
        Out(g, AddNode(&g, "aten.slice.Tensor", {table}, {A("end", int64_t{4})}, "rows"));
    const uint32_t half = Out(g, AddNode(&g, "aten._to_copy.default", {rows},
                                         {A("dtype", DTypeAttr{TERN_DTYPE_BF16})}, "half"));
    const uint32_t back = Out(g, AddNode(&g, "aten._to_copy.default", {half},
                                         {A("dtype", DTypeAttr{TERN_DTYPE_F32})}, "back"));
    const uint32_t extra = g.AddConstant("extra", F32(S({4, 2})), Bytes(Values(8, 10)));
    const uint32_t pe =
        Out(g, AddNode(&g, "aten.cat.default", {back, extra}, {A("dim", int64_t{1})}, "pe"));
    const uint32_t scaled =
        Out(g, AddNode(&g, "aten.mul.Tensor", {pe, kNoValue}, {A("other", 0.125)}, "pe_scaled"));
    g.AddOutput("y", Out(g, AddNode(&g, "aten.add.Tensor", {x, scaled}, {}, "add")));
    g.AddOutput("pe", scaled);
    ExpectSameResults(g, {Bytes(Values(24, 4))}, "positional encodings");
  }
}

// ---- Time ---------------------------------------------------------------------------------

TEST(Pipeline, FifteenHundredNodesTime) {
  const Graph g = Mixed(100);  // 1,500 nodes
  ASSERT_EQ(g.nodes.size(), 1500u);
  PassStats stats;
  double best = 1e9;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<Graph> optimized = OptimizeGraph(g, {}, &stats);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(optimized.ok()) << optimized.status();
    best = std::min(best, ms);
  }
  std::printf(
      "[ passes   ] 1,500 nodes -> %u in %.2f ms (best of 3; %u folded, %u merged, "
      "%u removed, %u rounds)\n",
      stats.nodes_after, best, stats.nodes_folded, stats.nodes_merged, stats.nodes_removed,
      stats.iterations);
}

// ---- ternc --bind and --no-optimize -------------------------------------------------------

class TerncPassesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ternc-passes-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  int Ternc(const std::string& args, std::string* out, std::string* err) {
    const std::string command =
        std::string(TERNC_PATH) + " " + args + " >'" + dir_ + "/stdout' 2>'" + dir_ + "/stderr'";
    const int status = std::system(command.c_str());
    *out = Slurp(dir_ + "/stdout");
    *err = Slurp(dir_ + "/stderr");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static std::string Slurp(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  std::string dir_;
};

TEST_F(TerncPassesTest, BindAndNoOptimize) {
  ASSERT_TRUE(WriteGraphFile(Dynamic(), dir_ + "/d.ternir").ok());
  const std::string compile =
      "compile '" + dir_ + "/d.ternir' -o '" + dir_ + "/d.tern' --no-cache ";
  std::string out, err;
  EXPECT_EQ(Ternc(compile + "--bind s0=4,s1=2 --stats", &out, &err), 0) << err;
  EXPECT_CONTAINS(out, "passes:");
  EXPECT_CONTAINS(out, "3 symbols bound");
  std::printf("%s", out.c_str());
  EXPECT_EQ(Ternc(compile + "--bind s0=4 --bind s1=2 --no-optimize --stats", &out, &err), 0) << err;
  EXPECT_CONTAINS(out, "passes:         off (--no-optimize); 3 symbols bound");

  EXPECT_EQ(Ternc(compile + "--bind s0=4", &out, &err), 1);
  EXPECT_CONTAINS(err, "s1 in [1, 8] are not bound");
  EXPECT_EQ(Ternc(compile, &out, &err), 1);
  EXPECT_CONTAINS(err, "--bind");
  EXPECT_EQ(Ternc(compile + "--bind s0=4,s1=9", &out, &err), 1);
  EXPECT_CONTAINS(err, "cannot bind s1 = 9: s1 must be in [1, 8]");
  EXPECT_EQ(Ternc(compile + "--bind s0", &out, &err), 64);
  EXPECT_CONTAINS(err, "NAME=VALUE");
  EXPECT_EQ(Ternc(compile + "--bind s0=x", &out, &err), 64);
  EXPECT_EQ(Ternc(compile + "--bind s0=4,s0=5", &out, &err), 64);
  EXPECT_CONTAINS(err, "twice");
  EXPECT_EQ(Ternc(compile + "--bind", &out, &err), 64);
}

}  // namespace
}  // namespace tern::compiler
