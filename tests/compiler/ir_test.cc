// The compiler's IR: inference of each op's outputs (broadcasting, views,
// reductions, symbolic dims), the verifier's checks and the canonical hash.
#include <gtest/gtest.h>

#include <cstring>

#include "compiler/ir/dim.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/hash.h"
#include "compiler/ir/ops.h"
#include "compiler/ir/verify.h"

namespace tern::compiler {
namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

Shape S(std::initializer_list<int64_t> dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(Dim::Constant(d));
  return shape;
}

TensorType F32(Shape shape) { return {TERN_DTYPE_F32, std::move(shape)}; }

Attribute A(std::string name, decltype(Attribute::value) value) {
  return Attribute{std::move(name), std::move(value)};
}

// out = relu(x @ w + b) with x [4, 8], w [8, 16], b [16].
Graph Mlp() {
  Graph graph;
  const uint32_t x = graph.AddInput("x", F32(S({4, 8})));
  std::vector<uint8_t> w(8 * 16 * 4, 0), b(16 * 4, 0);
  const uint32_t wv = graph.AddConstant("w", F32(S({8, 16})), w);
  const uint32_t bv = graph.AddConstant("b", F32(S({16})), b);
  const uint32_t linear =
      *AddNode(&graph, "aten.addmm.default", {bv, x, wv}, {}, "linear", "model.py:12 in forward");
  const uint32_t relu =
      *AddNode(&graph, "aten.relu.default", {graph.nodes[linear].outputs[0]}, {}, "relu");
  graph.AddOutput("out", graph.nodes[relu].outputs[0]);
  return graph;
}

TEST(Dims, AffineArithmeticAndStrings) {
  const std::vector<Symbol> symbols = {{"s0", 1, 2048}};
  const Dim s = Dim::Of(0);
  EXPECT_EQ(s.ToString(symbols), "s0");
  EXPECT_EQ(s.Times(12)->ToString(symbols), "12*s0");
  EXPECT_EQ(s.Times(12)->Plus(4)->ToString(symbols), "12*s0+4");
  EXPECT_EQ(s.Plus(-1)->ToString(symbols), "s0-1");
  EXPECT_EQ(s.Times(12)->DividedBy(4), s.Times(3));
  EXPECT_FALSE(s.Times(12)->Plus(1)->DividedBy(4).has_value());
  EXPECT_FALSE(s.Times(s).has_value());  // s0 * s0 is not affine
  EXPECT_EQ(s.Times(12)->Min(symbols), 12);
  EXPECT_EQ(s.Times(12)->Max(symbols), 12 * 2048);
  EXPECT_EQ(s.Times(-1)->Plus(2048)->Min(symbols), 0);
  EXPECT_EQ(Dim::Constant(5).Times(Dim::Constant(3)), Dim::Constant(15));
  EXPECT_FALSE(Dim::Constant(INT64_MAX).Times(2).has_value());
  EXPECT_EQ(ShapeString({Dim::Constant(2), s, Dim::Constant(64)}, symbols), "[2, s0, 64]");
}

TEST(Ops, MlpInfersAndVerifies) {
  const Graph graph = Mlp();
  ASSERT_TRUE(VerifyGraph(graph).ok()) << VerifyGraph(graph);
  EXPECT_EQ(graph.values[graph.outputs[0].value].type, F32(S({4, 16})));
}

TEST(Ops, BroadcastingAndPromotion) {
  Graph graph;
  const uint32_t a = graph.AddInput("a", F32(S({4, 1, 8})));
  const uint32_t b = graph.AddInput("b", {TERN_DTYPE_I64, S({3, 1})});
  auto n = AddNode(&graph, "aten.add.Tensor", {a, b}, {});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(graph.values[graph.nodes[*n].outputs[0]].type, F32(S({4, 3, 8})));
  // x * 2 with x an integer tensor and 2.5 a Python float: f32.
  auto m = AddNode(&graph, "aten.mul.Tensor", {b, kNoValue}, {A("other", 2.5)});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(graph.values[graph.nodes[*m].outputs[0]].type.dtype, TERN_DTYPE_F32);
  // Integer division is true division.
  auto d = AddNode(&graph, "aten.div.Tensor", {b, b}, {});
  EXPECT_EQ(graph.values[graph.nodes[*d].outputs[0]].type.dtype, TERN_DTYPE_F32);
  auto bad = AddNode(&graph, "aten.add.Tensor", {a, graph.AddInput("c", F32(S({5})))}, {}, "oops",
                     "m.py:3");
  ASSERT_FALSE(bad.ok());
  EXPECT_CONTAINS(bad.status().message(), "node 'oops' (aten.add.Tensor, m.py:3)");
  EXPECT_CONTAINS(bad.status().message(), "shapes [4, 1, 8] and [5] cannot broadcast");
}

TEST(Ops, ViewsPermutesAndExpands) {
  Graph graph;
  graph.symbols.push_back({"s0", 1, 2048});
  const Shape x_shape = {Dim::Constant(2), Dim::Of(0), Dim::Constant(12), Dim::Constant(64)};
  const uint32_t x = graph.AddInput("x", F32(x_shape));
  // [2, s0, 12, 64] -> [2, s0, 768] with -1.
  auto v = AddNode(&graph, "aten.view.default", {x},
                   {A("size", Shape{Dim::Constant(2), Dim::Of(0), Dim::Constant(-1)})});
  ASSERT_TRUE(v.ok()) << v.status();
  const TensorType& viewed = graph.values[graph.nodes[*v].outputs[0]].type;
  EXPECT_EQ(ShapeString(viewed.shape, graph.symbols), "[2, s0, 768]");
  // Flatten: [2*s0*768] = [1536*s0].
  auto flat = AddNode(&graph, "aten.view.default", {x}, {A("size", S({-1}))});
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(ShapeString(graph.values[graph.nodes[*flat].outputs[0]].type.shape, graph.symbols),
            "[1536*s0]");
  auto wrong = AddNode(&graph, "aten.view.default", {x}, {A("size", S({2, 12}))});
  ASSERT_FALSE(wrong.ok());
  EXPECT_CONTAINS(wrong.status().message(), "the counts must match");
  auto p =
      AddNode(&graph, "aten.permute.default", {x}, {A("dims", std::vector<int64_t>{0, 2, 1, -1})});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ShapeString(graph.values[graph.nodes[*p].outputs[0]].type.shape, graph.symbols),
            "[2, 12, s0, 64]");
  auto twice =
      AddNode(&graph, "aten.permute.default", {x}, {A("dims", std::vector<int64_t>{0, 0, 1, 2})});
  EXPECT_FALSE(twice.ok());
  const uint32_t b = graph.AddInput("b", F32(S({1, 64})));
  auto e = AddNode(&graph, "aten.expand.default", {b},
                   {A("size", Shape{Dim::Constant(3), Dim::Of(0), Dim::Constant(-1)})});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(ShapeString(graph.values[graph.nodes[*e].outputs[0]].type.shape, graph.symbols),
            "[3, s0, 64]");
  EXPECT_EQ(FindOp("aten.expand.default")->view_of, 0);
  // Slicing a symbolic dim from 1 to its end: s0-1.
  auto sl =
      AddNode(&graph, "aten.slice.Tensor", {x}, {A("dim", int64_t{1}), A("start", int64_t{1})});
  ASSERT_TRUE(sl.ok()) << sl.status();
  EXPECT_EQ(ShapeString(graph.values[graph.nodes[*sl].outputs[0]].type.shape, graph.symbols),
            "[2, s0-1, 12, 64]");
}

TEST(Ops, ReductionsNormsAndCat) {
  Graph graph;
  const uint32_t x = graph.AddInput("x", F32(S({2, 3, 8})));
  auto s = AddNode(&graph, "aten.sum.dim_IntList", {x},
                   {A("dim", std::vector<int64_t>{-1}), A("keepdim", true)});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(graph.values[graph.nodes[*s].outputs[0]].type, F32(S({2, 3, 1})));
  auto ln = AddNode(&graph, "aten.native_layer_norm.default", {x, kNoValue, kNoValue},
                    {A("normalized_shape", std::vector<int64_t>{8}), A("eps", 1e-5)});
  ASSERT_TRUE(ln.ok()) << ln.status();
  EXPECT_EQ(graph.nodes[*ln].outputs.size(), 3u);
  EXPECT_EQ(graph.values[graph.nodes[*ln].outputs[1]].type, F32(S({2, 3, 1})));
  auto c = AddNode(&graph, "aten.cat.default", {x, x, x}, {A("dim", int64_t{1})});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(graph.values[graph.nodes[*c].outputs[0]].type, F32(S({2, 9, 8})));
  auto split = AddNode(&graph, "aten.split_with_sizes.default", {x},
                       {A("split_sizes", std::vector<int64_t>{2, 6}), A("dim", int64_t{-1})});
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(graph.nodes[*split].outputs.size(), 2u);
  EXPECT_EQ(graph.values[graph.nodes[*split].outputs[1]].type, F32(S({2, 3, 6})));
  auto bad_split = AddNode(&graph, "aten.split_with_sizes.default", {x},
                           {A("split_sizes", std::vector<int64_t>{2, 5}), A("dim", int64_t{-1})});
  ASSERT_FALSE(bad_split.ok());
  EXPECT_CONTAINS(bad_split.status().message(), "add up to 7 but dim 2 is 8");
  auto unknown = AddNode(&graph, "aten.fft_fft.default", {x}, {}, "fft");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_CONTAINS(unknown.status().message(), "node 'fft' (aten.fft_fft.default)");
  auto mistyped = AddNode(&graph, "aten.sum.dim_IntList", {x}, {A("keepdim", int64_t{1})});
  ASSERT_FALSE(mistyped.ok());
  EXPECT_CONTAINS(mistyped.status().message(), "attribute 'keepdim' must be a bool");
  auto arity = AddNode(&graph, "aten.mm.default", {x}, {});
  ASSERT_FALSE(arity.ok());
  EXPECT_CONTAINS(arity.status().message(), "it has 1 tensor inputs; aten.mm.default takes 2");
}

TEST(Ops, ConvolutionBatchNormAndMaxPoolFollowPyTorchSizes) {
  using Ints = std::vector<int64_t>;
  Graph graph;
  const uint32_t x = graph.AddInput("x", F32(S({2, 3, 15, 16})));
  const uint32_t w = graph.AddConstant("w", F32(S({8, 3, 3, 3})), std::vector<uint8_t>(216 * 4));
  const uint32_t b = graph.AddConstant("b", F32(S({8})), std::vector<uint8_t>(8 * 4));
  // (15 + 2*1 - 2*(3-1) - 1) / 2 + 1 = 7 and (16 + 2 - 4 - 1) / 2 + 1 = 7.
  auto conv =
      AddNode(&graph, "aten.convolution.default", {x, w, b},
              {A("stride", Ints{2, 2}), A("padding", Ints{1, 1}), A("dilation", Ints{2, 2}),
               A("transposed", false), A("output_padding", Ints{0, 0}), A("groups", int64_t{1})});
  ASSERT_TRUE(conv.ok()) << conv.status();
  const uint32_t y = graph.nodes[*conv].outputs[0];
  EXPECT_EQ(graph.values[y].type, F32(S({2, 8, 7, 7})));
  auto bn = AddNode(&graph, "aten._native_batch_norm_legit_no_training.default",
                    {y, kNoValue, b, b, b}, {A("momentum", 0.1), A("eps", 1e-5)});
  ASSERT_TRUE(bn.ok()) << bn.status();
  ASSERT_EQ(graph.nodes[*bn].outputs.size(), 3u);
  EXPECT_EQ(graph.values[graph.nodes[*bn].outputs[0]].type, F32(S({2, 8, 7, 7})));
  EXPECT_EQ(graph.values[graph.nodes[*bn].outputs[1]].type, F32(S({0})));
  // Stride defaults to the kernel: (7 - 2) / 2 + 1 = 3; with padding 1:
  // (7 + 2 - 3) / 2 + 1 = 4.
  auto pool =
      AddNode(&graph, "aten.max_pool2d_with_indices.default", {y}, {A("kernel_size", Ints{2, 2})});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(graph.values[graph.nodes[*pool].outputs[0]].type, F32(S({2, 8, 3, 3})));
  EXPECT_EQ(graph.values[graph.nodes[*pool].outputs[1]].type,
            (TensorType{TERN_DTYPE_I64, S({2, 8, 3, 3})}));
  auto padded = AddNode(&graph, "aten.max_pool2d_with_indices.default", {y},
                        {A("kernel_size", Ints{3}), A("stride", Ints{2}), A("padding", Ints{1})});
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(graph.values[graph.nodes[*padded].outputs[0]].type, F32(S({2, 8, 4, 4})));

  auto wrong_channels = AddNode(&graph, "aten.convolution.default", {y, w}, {}, "conv_c");
  ASSERT_FALSE(wrong_channels.ok());
  EXPECT_CONTAINS(wrong_channels.status().message(), "do not fit groups=1");
  auto too_much_padding = AddNode(&graph, "aten.max_pool2d_with_indices.default", {y},
                                  {A("kernel_size", Ints{2}), A("padding", Ints{2})});
  ASSERT_FALSE(too_much_padding.ok());
  EXPECT_CONTAINS(too_much_padding.status().message(), "more than half its kernel size");
  auto wrong_stats = AddNode(&graph, "aten._native_batch_norm_legit_no_training.default",
                             {x, kNoValue, kNoValue, b, b}, {A("eps", 1e-5)}, "bn_c");
  ASSERT_FALSE(wrong_stats.ok());
  EXPECT_CONTAINS(wrong_stats.status().message(), "its running_mean is f32 [8]; it must be");
}

TEST(Verify, NamesWhatIsWrong) {
  {
    Graph graph = Mlp();
    graph.values[graph.outputs[0].value].type = F32(S({4, 17}));
    EXPECT_CONTAINS(VerifyGraph(graph).message(), "recorded as f32 [4, 17] but the op gives");
  }
  {
    Graph graph = Mlp();
    std::swap(graph.nodes[0], graph.nodes[1]);  // relu before the addmm it reads
    EXPECT_FALSE(VerifyGraph(graph).ok());
  }
  {
    Graph graph = Mlp();
    graph.constants[0].pop_back();
    EXPECT_CONTAINS(VerifyGraph(graph).message(), "holds 511 bytes");
  }
  {
    Graph graph = Mlp();
    graph.symbols.push_back({"s0", 5, 2});
    EXPECT_CONTAINS(VerifyGraph(graph).message(), "0 <= min <= max");
  }
  {
    Graph graph = Mlp();
    graph.AddOutput("x", graph.outputs[0].value);
    EXPECT_CONTAINS(VerifyGraph(graph).message(), "names must be unique");
  }
  {
    Graph graph = Mlp();
    graph.mutations.push_back({0, 0});  // x [4, 8] <- out [4, 16]
    EXPECT_CONTAINS(VerifyGraph(graph).message(), "their types differ");
  }
}

TEST(Hash, IgnoresNamesAndNumberingButNotWhatIsComputed) {
  const Graph a = Mlp();
  Graph renamed = Mlp();
  for (Value& value : renamed.values) {
    if (value.kind != Value::kInput) value.name += "_x";
  }
  for (Node& node : renamed.nodes) {
    node.name += "_y";
    node.source.clear();
  }
  EXPECT_EQ(GraphHash(a), GraphHash(renamed));
  Graph other_weights = Mlp();
  other_weights.constants[0][5] = 1;
  EXPECT_NE(GraphHash(a), GraphHash(other_weights));
  Graph other_op = Mlp();
  other_op.nodes[1].op = "aten.gelu.default";
  EXPECT_NE(GraphHash(a), GraphHash(other_op));
  Graph other_range = Mlp();
  other_range.symbols.push_back({"s0", 1, 8});
  Graph wider = Mlp();
  wider.symbols.push_back({"s0", 1, 16});
  EXPECT_NE(GraphHash(other_range), GraphHash(wider));
}

}  // namespace
}  // namespace tern::compiler
