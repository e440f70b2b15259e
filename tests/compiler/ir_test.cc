// The compiler's IR: inference of each op's outputs (broadcasting, views,
// reductions, symbolic dims), the verifier's checks and the canonical hash.
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

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

// The type of node `n`'s single output.
const TensorType& OutType(const Graph& graph, absl::StatusOr<uint32_t> n) {
  EXPECT_TRUE(n.ok()) << n.status();
  static const TensorType kNone;
  return n.ok() ? graph.values[graph.nodes[*n].outputs[0]].type : kNone;
}

TEST(Ops, LogicalAndBitwiseOpsFollowPyTorchTypes) {
  Graph graph;
  const uint32_t m = graph.AddInput("m", {TERN_DTYPE_BOOL, S({4, 1})});
  const uint32_t x = graph.AddInput("x", F32(S({3})));
  const uint32_t i = graph.AddInput("i", {TERN_DTYPE_I32, S({3})});
  // Logical ops take any dtypes and give bool; bitwise ones promote.
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.logical_and.default", {m, x}, {})),
            (TensorType{TERN_DTYPE_BOOL, S({4, 3})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.logical_or.default", {x, i}, {})),
            (TensorType{TERN_DTYPE_BOOL, S({3})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.bitwise_and.Tensor", {m, i}, {})),
            (TensorType{TERN_DTYPE_I32, S({4, 3})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.bitwise_or.Tensor", {m, m}, {})),
            (TensorType{TERN_DTYPE_BOOL, S({4, 1})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.bitwise_not.default", {i}, {})),
            (TensorType{TERN_DTYPE_I32, S({3})}));

  auto float_and = AddNode(&graph, "aten.bitwise_and.Tensor", {i, x}, {}, "band");
  ASSERT_FALSE(float_and.ok());
  EXPECT_CONTAINS(float_and.status().message(),
                  "node 'band' (aten.bitwise_and.Tensor): its other has dtype f32; bitwise ops "
                  "take integer or bool tensors");
  auto float_not = AddNode(&graph, "aten.bitwise_not.default", {x}, {});
  ASSERT_FALSE(float_not.ok());
  EXPECT_CONTAINS(float_not.status().message(), "its input has dtype f32; bitwise ops take");
  auto missing = AddNode(&graph, "aten.logical_or.default", {x, kNoValue}, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_CONTAINS(missing.status().message(), "its other (input 1) is missing");
  auto apart =
      AddNode(&graph, "aten.logical_and.default", {x, graph.AddInput("y", F32(S({2})))}, {});
  ASSERT_FALSE(apart.ok());
  EXPECT_CONTAINS(apart.status().message(), "shapes [3] and [2] cannot broadcast");
  auto one = AddNode(&graph, "aten.bitwise_or.Tensor", {i}, {});
  ASSERT_FALSE(one.ok());
  EXPECT_CONTAINS(one.status().message(), "it has 1 tensor inputs; aten.bitwise_or.Tensor takes 2");
}

// What AOTAutograd's backward graphs keep when the core ATen decompositions
// leave the backward ops alone (torch.compile's backend).
TEST(Ops, LayerNormBackwardOutputsFollowTheMask) {
  using Ints = std::vector<int64_t>;
  Graph graph;
  const TensorType bf16_x{TERN_DTYPE_BF16, S({2, 3, 8})};
  const uint32_t x = graph.AddInput("x", bf16_x);
  const uint32_t g = graph.AddInput("g", bf16_x);
  const uint32_t mean = graph.AddInput("mean", F32(S({2, 3, 1})));
  const uint32_t rstd = graph.AddInput("rstd", F32(S({2, 3})));  // the leading shape also
  const uint32_t w = graph.AddInput("w", F32(S({8})));
  const uint32_t b = graph.AddInput("b", {TERN_DTYPE_BF16, S({8})});
  auto all = AddNode(&graph, "aten.native_layer_norm_backward.default", {g, x, mean, rstd, w, b},
                     {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 1, 1})});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(graph.nodes[*all].outputs.size(), 3u);
  auto type = [&](uint32_t n, size_t k) { return graph.values[graph.nodes[n].outputs[k]].type; };
  // grad_input as the input, grad_weight and grad_bias as the parameters.
  EXPECT_EQ(type(*all, 0), bf16_x);
  EXPECT_EQ(type(*all, 1), F32(S({8})));
  EXPECT_EQ(type(*all, 2), (TensorType{TERN_DTYPE_BF16, S({8})}));
  // Left out by output_mask, or without a weight/bias (None in PyTorch):
  // empty. The front end writes a list of Python bools as a shape of 0/1.
  const TensorType absent{TERN_DTYPE_BF16, S({0})};
  auto masked = AddNode(&graph, "aten.native_layer_norm_backward.default", {g, x, mean, rstd, w},
                        {A("normalized_shape", Ints{8}), A("output_mask", S({0, 1, 1}))});
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ(type(*masked, 0), absent);
  EXPECT_EQ(type(*masked, 1), F32(S({8})));
  EXPECT_EQ(type(*masked, 2), absent);
  const TensorType f32_x = F32(S({4, 2, 5}));
  const uint32_t x2 = graph.AddInput("x2", f32_x);
  const uint32_t stats2 = graph.AddInput("stats2", F32(S({4, 1, 1})));
  auto two_dims = AddNode(&graph, "aten.native_layer_norm_backward.default",
                          {x2, x2, stats2, stats2, kNoValue, kNoValue},
                          {A("normalized_shape", Ints{2, 5}), A("output_mask", Ints{1, 1, 1})});
  ASSERT_TRUE(two_dims.ok()) << two_dims.status();
  EXPECT_EQ(type(*two_dims, 0), f32_x);
  EXPECT_EQ(type(*two_dims, 1), F32(S({0})));

  const std::pair<std::vector<uint32_t>, std::vector<Attribute>> wrong[] = {
      {{g, x, mean, rstd}, {A("normalized_shape", Ints{8})}},
      {{g, x, mean, rstd}, {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 1})}},
      {{g, x, mean, rstd}, {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 2, 0})}},
      {{g, x, mean, rstd}, {A("normalized_shape", Ints{8}), A("output_mask", true)}},
      {{x2, x, mean, rstd}, {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 1, 1})}},
      {{g, x, stats2, rstd}, {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 1, 1})}},
      {{g, x, mean, rstd, x}, {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 1, 1})}},
      {{g, x, mean, rstd}, {A("normalized_shape", Ints{2, 8}), A("output_mask", Ints{1, 1, 1})}},
      {{g, x, mean}, {A("normalized_shape", Ints{8}), A("output_mask", Ints{1, 1, 1})}},
  };
  const char* const messages[] = {
      ("node 'ln_bwd' (aten.native_layer_norm_backward.default): its attribute 'output_mask' is "
       "missing"),
      "its attribute 'output_mask' must be a list of 3 bools (0 or 1)",
      "its attribute 'output_mask' must be a list of 3 bools (0 or 1)",
      "its attribute 'output_mask' must be a list of 3 bools",
      "its grad_out is f32 [4, 2, 5] but its input bf16 [2, 3, 8]; they must match",
      "its mean has shape [4, 1, 1]; it must be [2, 3, 1] (or [2, 3])",
      "its weight is bf16 [2, 3, 8]; it must be a float [8]",
      "its normalized_shape does not match the input's last dims [3, 8]",
      "it has 3 tensor inputs; aten.native_layer_norm_backward.default takes 4 to 6",
  };
  for (size_t i = 0; i < std::size(wrong); ++i) {
    auto n = AddNode(&graph, "aten.native_layer_norm_backward.default", wrong[i].first,
                     wrong[i].second, "ln_bwd");
    ASSERT_FALSE(n.ok()) << i;
    EXPECT_CONTAINS(n.status().message(), messages[i]);
  }
}

TEST(Ops, ConvolutionAndMaxPoolBackwardsFollowTheForward) {
  using Ints = std::vector<int64_t>;
  Graph graph;
  const uint32_t x = graph.AddInput("x", F32(S({2, 4, 9, 9})));
  const uint32_t w = graph.AddInput("w", F32(S({6, 2, 3, 3})));  // groups 2
  const uint32_t g = graph.AddInput("g", F32(S({2, 6, 5, 5})));  // stride 2, padding 1
  auto attrs = [](std::vector<int64_t> mask, bool transposed) {
    return std::vector<Attribute>{A("bias_sizes", Ints{6}),    A("stride", Ints{2, 2}),
                                  A("padding", Ints{1, 1}),    A("dilation", Ints{1, 1}),
                                  A("transposed", transposed), A("output_padding", Ints{0, 0}),
                                  A("groups", int64_t{2}),     A("output_mask", std::move(mask))};
  };
  auto type = [&](uint32_t n, size_t k) { return graph.values[graph.nodes[n].outputs[k]].type; };
  auto all =
      AddNode(&graph, "aten.convolution_backward.default", {g, x, w}, attrs({1, 1, 1}, false));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(graph.nodes[*all].outputs.size(), 3u);
  EXPECT_EQ(type(*all, 0), F32(S({2, 4, 9, 9})));
  EXPECT_EQ(type(*all, 1), F32(S({6, 2, 3, 3})));
  EXPECT_EQ(type(*all, 2), F32(S({6})));
  // Left out by output_mask (None in PyTorch): empty. A mask of Python bools
  // comes as a shape.
  std::vector<Attribute> as_shape = attrs({}, false);
  as_shape.back() = A("output_mask", S({0, 1, 0}));
  auto masked = AddNode(&graph, "aten.convolution_backward.default", {g, x, w}, as_shape);
  ASSERT_TRUE(masked.ok()) << masked.status();
  EXPECT_EQ(type(*masked, 0), F32(S({0})));
  EXPECT_EQ(type(*masked, 1), F32(S({6, 2, 3, 3})));
  EXPECT_EQ(type(*masked, 2), F32(S({0})));

  const uint32_t x1d = graph.AddInput("x1d", F32(S({2, 4, 9})));
  const uint32_t w1d = graph.AddInput("w1d", F32(S({6, 2, 3})));
  std::vector<Attribute> bad_bias = attrs({1, 1, 1}, false);
  bad_bias.front() = A("bias_sizes", Ints{4});
  const std::pair<std::vector<uint32_t>, std::vector<Attribute>> wrong[] = {
      {{g, x, w}, attrs({1, 1, 1}, true)},  {{g, x1d, w1d}, attrs({1, 1, 1}, false)},
      {{x, x, w}, attrs({1, 1, 1}, false)}, {{g, x, w}, bad_bias},
      {{g, x, w}, attrs({1, 1}, false)},    {{g, x}, attrs({1, 1, 1}, false)},
  };
  const char* const messages[] = {
      ("node 'conv_bwd' (aten.convolution_backward.default): it is the backward of a transposed "
       "convolution (ConvTranspose), which the compiler does not lower yet"),
      "its input [2, 4, 9] and weight [6, 2, 3] are not 4-D: the compiler does not lower yet",
      "its grad_output is f32 [2, 4, 9, 9]; the convolution's output is f32 [2, 6, 5, 5]",
      "its bias_sizes is [4]; the bias of this convolution is [6]",
      "its attribute 'output_mask' must be a list of 3 bools (0 or 1)",
      "it has 2 tensor inputs; aten.convolution_backward.default takes 3",
  };
  for (size_t i = 0; i < std::size(wrong); ++i) {
    auto n = AddNode(&graph, "aten.convolution_backward.default", wrong[i].first, wrong[i].second,
                     "conv_bwd");
    ASSERT_FALSE(n.ok()) << i;
    EXPECT_CONTAINS(n.status().message(), messages[i]);
  }

  // max_pool2d_with_indices_backward: self's type; grad_output and the
  // indices have the pool's output shape, (9 + 2 - 3) / 2 + 1 = 5.
  const uint32_t pg = graph.AddInput("pg", F32(S({2, 4, 5, 5})));
  const uint32_t pi = graph.AddInput("pi", {TERN_DTYPE_I64, S({2, 4, 5, 5})});
  const std::vector<Attribute> pool = {A("kernel_size", Ints{3}), A("stride", Ints{2}),
                                       A("padding", Ints{1}), A("dilation", Ints{1}),
                                       A("ceil_mode", false)};
  auto pool_bwd =
      AddNode(&graph, "aten.max_pool2d_with_indices_backward.default", {pg, x, pi}, pool);
  ASSERT_TRUE(pool_bwd.ok()) << pool_bwd.status();
  EXPECT_EQ(type(*pool_bwd, 0), F32(S({2, 4, 9, 9})));
  // The backward's schema has no default stride: an empty one is the kernel.
  const uint32_t pg2 = graph.AddInput("pg2", F32(S({2, 4, 3, 3})));
  const uint32_t pi2 = graph.AddInput("pi2", {TERN_DTYPE_I64, S({2, 4, 3, 3})});
  std::vector<Attribute> no_stride = pool;
  no_stride[1] = A("stride", Ints{});
  no_stride[2] = A("padding", Ints{0, 0});
  auto strided_as_kernel =
      AddNode(&graph, "aten.max_pool2d_with_indices_backward.default", {pg2, x, pi2}, no_stride);
  ASSERT_TRUE(strided_as_kernel.ok()) << strided_as_kernel.status();
  EXPECT_EQ(type(*strided_as_kernel, 0), F32(S({2, 4, 9, 9})));
  std::vector<Attribute> ceil = pool;
  ceil.back() = A("ceil_mode", true);
  const std::pair<std::vector<uint32_t>, std::vector<Attribute>> wrong_pool[] = {
      {{pg, x, pi}, ceil},
      {{pg, x, pg}, pool},
      {{pi, x, pi}, pool},
  };
  const char* const pool_messages[] = {
      "it uses ceil_mode=True, which the compiler does not lower yet",
      "its indices are f32 [2, 4, 5, 5]; they must be i64 [2, 4, 5, 5]",
      "its grad_output is i64 [2, 4, 5, 5]; the pool's output is f32 [2, 4, 5, 5]",
  };
  for (size_t i = 0; i < std::size(wrong_pool); ++i) {
    auto n = AddNode(&graph, "aten.max_pool2d_with_indices_backward.default", wrong_pool[i].first,
                     wrong_pool[i].second, "pool_bwd");
    ASSERT_FALSE(n.ok()) << i;
    EXPECT_CONTAINS(n.status().message(), pool_messages[i]);
  }
}

TEST(Ops, TrainingBatchNormReturnsTheStatistics) {
  Graph graph;
  const uint32_t x = graph.AddInput("x", F32(S({4, 3, 5, 5})));
  const uint32_t c = graph.AddInput("c", F32(S({3})));
  const std::vector<Attribute> attrs = {A("training", true), A("momentum", 0.1), A("eps", 1e-5)};
  auto bn = AddNode(&graph, "aten._native_batch_norm_legit_functional.default",
                    {x, c, kNoValue, c, c}, attrs);
  ASSERT_TRUE(bn.ok()) << bn.status();
  ASSERT_EQ(graph.nodes[*bn].outputs.size(), 5u);
  EXPECT_EQ(graph.values[graph.nodes[*bn].outputs[0]].type, F32(S({4, 3, 5, 5})));
  for (size_t k = 1; k < 5; ++k) {
    EXPECT_EQ(graph.values[graph.nodes[*bn].outputs[k]].type, F32(S({3}))) << k;
  }
  const uint32_t half = graph.AddInput("half", {TERN_DTYPE_BF16, S({4, 3, 5, 5})});
  const uint32_t c4 = graph.AddInput("c4", F32(S({4})));
  const std::pair<std::vector<uint32_t>, std::vector<Attribute>> wrong[] = {
      {{x, c, c, c, c}, {A("training", false), A("momentum", 0.1), A("eps", 1e-5)}},
      {{half, c, c, c, c}, attrs},
      {{x, c, c, c4, c}, attrs},
      {{x, c, c, c, kNoValue}, attrs},
  };
  const char* const messages[] = {
      "node 'bn' (aten._native_batch_norm_legit_functional.default): it has training=False, "
      "which the compiler does not lower yet in this op",
      "its input is bf16; the compiler does not lower yet a training batch norm of other dtypes "
      "than f32",
      "its running_mean is f32 [4]; it must be f32 [3] (one per channel)",
      "its running_var (input 4) is missing",
  };
  for (size_t i = 0; i < std::size(wrong); ++i) {
    auto n = AddNode(&graph, "aten._native_batch_norm_legit_functional.default", wrong[i].first,
                     wrong[i].second, "bn");
    ASSERT_FALSE(n.ok()) << i;
    EXPECT_CONTAINS(n.status().message(), messages[i]);
  }
}

TEST(Ops, BatchNormBackwardOutputsFollowTheMask) {
  using Ints = std::vector<int64_t>;
  Graph graph;
  const uint32_t x = graph.AddInput("x", F32(S({4, 3, 5, 5})));
  const uint32_t c = graph.AddInput("c", F32(S({3})));
  auto attrs = [](bool train, Ints mask) {
    return std::vector<Attribute>{A("train", train), A("eps", 1e-5),
                                  A("output_mask", std::move(mask))};
  };
  auto type = [&](uint32_t n, size_t k) { return graph.values[graph.nodes[n].outputs[k]].type; };
  // grad_weight without a weight, as PyTorch's CPU kernel.
  auto all = AddNode(&graph, "aten.native_batch_norm_backward.default",
                     {x, x, kNoValue, c, c, c, c}, attrs(true, {1, 1, 1}));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(graph.nodes[*all].outputs.size(), 3u);
  EXPECT_EQ(type(*all, 0), F32(S({4, 3, 5, 5})));
  EXPECT_EQ(type(*all, 1), F32(S({3})));
  EXPECT_EQ(type(*all, 2), F32(S({3})));
  auto eval = AddNode(&graph, "aten.native_batch_norm_backward.default",
                      {x, x, c, c, c, kNoValue, kNoValue}, attrs(false, {1, 0, 0}));
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(type(*eval, 0), F32(S({4, 3, 5, 5})));
  EXPECT_EQ(type(*eval, 1), F32(S({0})));

  const uint32_t half = graph.AddInput("half", {TERN_DTYPE_BF16, S({4, 3, 5, 5})});
  const uint32_t c4 = graph.AddInput("c4", F32(S({4})));
  const std::pair<std::vector<uint32_t>, std::vector<Attribute>> wrong[] = {
      {{half, half, c, c, c, c, c}, attrs(true, {1, 1, 1})},
      {{x, x, c, c, c, kNoValue, c}, attrs(true, {1, 1, 1})},
      {{x, x, c, c, kNoValue, c, c}, attrs(false, {1, 1, 1})},
      {{x, x, c4, c, c, c, c}, attrs(true, {1, 1, 1})},
      {{x, x, c, c, c, c, c}, attrs(true, {1, 1})},
  };
  const char* const messages[] = {
      ("node 'bn_bwd' (aten.native_batch_norm_backward.default): its grad_out is bf16 and its "
       "input bf16; the compiler does not lower yet a batch norm backward of other dtypes than "
       "f32"),
      "its save_mean (input 5) is missing",
      "its running_var (input 4) is missing",
      "its weight is f32 [4]; it must be f32 [3] (one per channel)",
      "its attribute 'output_mask' must be a list of 3 bools (0 or 1)",
  };
  for (size_t i = 0; i < std::size(wrong); ++i) {
    auto n = AddNode(&graph, "aten.native_batch_norm_backward.default", wrong[i].first,
                     wrong[i].second, "bn_bwd");
    ASSERT_FALSE(n.ok()) << i;
    EXPECT_CONTAINS(n.status().message(), messages[i]);
  }
}

TEST(Ops, SoftmaxAndActivationBackwardsFollowPyTorchTypes) {
  Graph graph;
  const TensorType bf16{TERN_DTYPE_BF16, S({4, 6})};
  const uint32_t g = graph.AddInput("g", bf16);
  const uint32_t y = graph.AddInput("y", bf16);
  const uint32_t f = graph.AddInput("f", F32(S({4, 6})));
  const uint32_t row = graph.AddInput("row", F32(S({6})));
  const uint32_t i = graph.AddInput("i", {TERN_DTYPE_I64, S({4, 6})});
  // The input's gradient has input_dtype (grad_output's without it).
  EXPECT_EQ(OutType(graph,
                    AddNode(&graph, "aten._softmax_backward_data.default", {g, y},
                            {A("dim", int64_t{-1}), A("input_dtype", DTypeAttr{TERN_DTYPE_BF16})})),
            bf16);
  EXPECT_EQ(
      OutType(graph, AddNode(&graph, "aten._log_softmax_backward_data.default", {f, f},
                             {A("dim", int64_t{0}), A("input_dtype", DTypeAttr{TERN_DTYPE_F16})})),
      (TensorType{TERN_DTYPE_F16, S({4, 6})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten._softmax_backward_data.default", {f, f},
                                   {A("dim", int64_t{1})})),
            F32(S({4, 6})));
  // Activations: broadcast and promoted as binary ops.
  for (const char* op : {"aten.tanh_backward.default", "aten.sigmoid_backward.default",
                         "aten.silu_backward.default", "aten.gelu_backward.default"}) {
    EXPECT_EQ(OutType(graph, AddNode(&graph, op, {g, y}, {})), bf16) << op;
    EXPECT_EQ(OutType(graph, AddNode(&graph, op, {g, row}, {})), F32(S({4, 6}))) << op;
  }
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.gelu_backward.default", {f, f},
                                   {A("approximate", std::string("tanh"))})),
            F32(S({4, 6})));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.threshold_backward.default", {g, f},
                                   {A("threshold", int64_t{0})})),
            F32(S({4, 6})));

  struct Wrong {
    const char* op;
    std::vector<uint32_t> inputs;
    std::vector<Attribute> attrs;
    const char* message;
  };
  const Wrong wrong[] = {
      {"aten._softmax_backward_data.default",
       {g, f},
       {A("dim", int64_t{1})},
       "node 'bwd' (aten._softmax_backward_data.default): its grad_output is bf16 [4, 6] but its "
       "output f32 [4, 6]; they must match"},
      {"aten._softmax_backward_data.default",
       {f, f},
       {A("dim", int64_t{2})},
       "dim 2 is out of range for a tensor of rank 2"},
      {"aten._log_softmax_backward_data.default",
       {f, f},
       {A("dim", int64_t{1}), A("input_dtype", DTypeAttr{TERN_DTYPE_I32})},
       "its input_dtype is i32; a softmax's input is f32, bf16 or f16"},
      {"aten._softmax_backward_data.default", {i, i}, {}, "its grad_output has dtype i64"},
      {"aten.tanh_backward.default",
       {i, i},
       {},
       "its grad_output is i64 and its output i64; a gradient is f32, bf16 or f16"},
      {"aten.sigmoid_backward.default",
       {f, graph.AddInput("short", F32(S({5})))},
       {},
       "shapes [4, 6] and [5] cannot broadcast"},
      {"aten.gelu_backward.default",
       {f, f},
       {A("approximate", std::string("erf"))},
       "its approximate is 'erf'; gelu takes 'none' or 'tanh'"},
      {"aten.threshold_backward.default", {f, f}, {}, "its attribute 'threshold' must be a number"},
      {"aten.silu_backward.default", {f}, {}, "it has 1 tensor inputs"},
      {"aten.threshold_backward.default",
       {f, kNoValue},
       {A("threshold", 0.0)},
       "its self (input 1) is missing"},
  };
  for (const Wrong& w : wrong) {
    auto n = AddNode(&graph, w.op, w.inputs, w.attrs, "bwd");
    ASSERT_FALSE(n.ok()) << w.op;
    EXPECT_CONTAINS(n.status().message(), w.message);
  }
}

TEST(Ops, EmbeddingDenseBackwardIsTheWeightsGradient) {
  Graph graph;
  const uint32_t g = graph.AddInput("g", {TERN_DTYPE_BF16, S({2, 5, 16})});
  const uint32_t ids = graph.AddInput("ids", {TERN_DTYPE_I64, S({2, 5})});
  const uint32_t fids = graph.AddInput("fids", F32(S({2, 5})));
  const std::vector<Attribute> attrs = {A("num_weights", int64_t{100}),
                                        A("padding_idx", int64_t{-1}),
                                        A("scale_grad_by_freq", false)};
  EXPECT_EQ(
      OutType(graph, AddNode(&graph, "aten.embedding_dense_backward.default", {g, ids}, attrs)),
      (TensorType{TERN_DTYPE_BF16, S({100, 16})}));
  struct Wrong {
    std::vector<uint32_t> inputs;
    std::vector<Attribute> attrs;
    const char* message;
  };
  const Wrong wrong[] = {
      {{g, fids}, attrs, "its indices has dtype f32; it must be i64 or i32"},
      {{g, g}, attrs, "its indices has dtype bf16"},
      {{ids, ids}, attrs, "its grad_output has dtype i64"},
      {{graph.AddInput("g3", F32(S({2, 4, 16}))), ids},
       attrs,
       "its grad_output [2, 4, 16] is not its indices' shape [2, 5] and one more dim"},
      {{g, ids},
       {A("padding_idx", int64_t{0}), A("scale_grad_by_freq", false)},
       "its num_weights is -1; it must be given"},
      {{g, ids},
       {A("num_weights", int64_t{100}), A("scale_grad_by_freq", true)},
       "node 'emb_bwd' (aten.embedding_dense_backward.default): it has scale_grad_by_freq=True, "
       "which the compiler does not lower yet"},
  };
  for (const Wrong& w : wrong) {
    auto n = AddNode(&graph, "aten.embedding_dense_backward.default", w.inputs, w.attrs, "emb_bwd");
    ASSERT_FALSE(n.ok()) << w.message;
    EXPECT_CONTAINS(n.status().message(), w.message);
  }
}

TEST(Ops, ClampPromotesAsPyTorch) {
  Graph graph;
  const uint32_t x = graph.AddInput("x", {TERN_DTYPE_BF16, S({5})});
  const uint32_t i = graph.AddInput("i", {TERN_DTYPE_I64, S({5})});
  const uint32_t b = graph.AddInput("b", {TERN_DTYPE_BOOL, S({5})});
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.clamp.default", {x},
                                   {A("min", -0.5), A("max", int64_t{2})})),
            (TensorType{TERN_DTYPE_BF16, S({5})}));
  // An integer tensor stays integer with integer bounds, f32 with a float one.
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.clamp.default", {i}, {A("max", int64_t{3})})),
            (TensorType{TERN_DTYPE_I64, S({5})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.clamp_min.default", {i}, {A("min", 0.5)})),
            (TensorType{TERN_DTYPE_F32, S({5})}));
  // bool with an integer bound is i64 (result_type(bool tensor, int) in PyTorch).
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.clamp_max.default", {b}, {A("max", int64_t{0})})),
            (TensorType{TERN_DTYPE_I64, S({5})}));

  auto bool_bounds = AddNode(&graph, "aten.clamp.default", {b}, {A("min", false)}, "cb");
  ASSERT_FALSE(bool_bounds.ok());
  EXPECT_CONTAINS(bool_bounds.status().message(),
                  "node 'cb' (aten.clamp.default): it clamps a bool");
  auto neither = AddNode(&graph, "aten.clamp.default", {x}, {});
  ASSERT_FALSE(neither.ok());
  EXPECT_CONTAINS(neither.status().message(), "it has neither 'min' nor 'max'");
  auto no_min = AddNode(&graph, "aten.clamp_min.default", {x}, {A("max", 1.0)});
  ASSERT_FALSE(no_min.ok());
  EXPECT_CONTAINS(no_min.status().message(), "its number attribute 'min' is missing");
  auto text = AddNode(&graph, "aten.clamp.default", {x}, {A("min", std::string("low"))});
  ASSERT_FALSE(text.ok());
  EXPECT_CONTAINS(text.status().message(), "its attribute 'min' must be a number");
}

TEST(Ops, ConstantPadNdScatterAndIndexPutShapes) {
  using Ints = std::vector<int64_t>;
  Graph graph;
  graph.symbols.push_back({"s0", 1, 64});
  const uint32_t x = graph.AddInput("x", F32(S({2, 3, 4})));
  // (before, after) pairs from the last dim; negative amounts crop.
  EXPECT_EQ(
      OutType(graph, AddNode(&graph, "aten.constant_pad_nd.default", {x}, {A("pad", Ints{1, 2})})),
      F32(S({2, 3, 7})));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.constant_pad_nd.default", {x},
                                   {A("pad", Ints{1, 1, -1, 0}), A("value", 0.5)})),
            F32(S({2, 2, 6})));
  const uint32_t tokens = graph.AddInput("tokens", F32({Dim::Of(0), Dim::Constant(4)}));
  auto padded =
      AddNode(&graph, "aten.constant_pad_nd.default", {tokens}, {A("pad", Ints{0, 0, 0, 3})});
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(ShapeString(graph.values[graph.nodes[*padded].outputs[0]].type.shape, graph.symbols),
            "[s0+3, 4]");
  auto odd = AddNode(&graph, "aten.constant_pad_nd.default", {x}, {A("pad", Ints{1})});
  ASSERT_FALSE(odd.ok());
  EXPECT_CONTAINS(odd.status().message(), "its pad has 1 values; it takes (before, after) pairs");
  auto too_many = AddNode(&graph, "aten.constant_pad_nd.default", {x},
                          {A("pad", Ints{0, 0, 0, 0, 0, 0, 1, 1})});
  ASSERT_FALSE(too_many.ok());
  EXPECT_CONTAINS(too_many.status().message(), "for at most the 3 dims of [2, 3, 4]");
  auto negative = AddNode(&graph, "aten.constant_pad_nd.default", {x}, {A("pad", Ints{-3, -2})});
  ASSERT_FALSE(negative.ok());
  EXPECT_CONTAINS(negative.status().message(), "its pad (-3, -2) makes dim 2 of size 4 negative");

  // scatter.value: self's type; the index has self's rank and fits it
  // outside `dim`.
  const uint32_t self = graph.AddInput("self", F32(S({3, 5})));
  const uint32_t index = graph.AddInput("index", {TERN_DTYPE_I64, S({2, 7})});
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.scatter.value", {self, index},
                                   {A("dim", int64_t{-1}), A("value", -1.0)})),
            F32(S({3, 5})));
  auto wide = AddNode(&graph, "aten.scatter.value", {self, index}, {A("value", 1.0)}, "sc");
  ASSERT_FALSE(wide.ok());
  EXPECT_CONTAINS(wide.status().message(),
                  "node 'sc' (aten.scatter.value): its index [2, 7] is larger than its input "
                  "[3, 5] in dim 1");
  auto float_index =
      AddNode(&graph, "aten.scatter.value", {self, self}, {A("dim", int64_t{1}), A("value", 1.0)});
  ASSERT_FALSE(float_index.ok());
  EXPECT_CONTAINS(float_index.status().message(), "its index has dtype f32; it must be i64 or i32");
  auto no_value = AddNode(&graph, "aten.scatter.value", {self, index}, {A("dim", int64_t{1})});
  ASSERT_FALSE(no_value.ok());
  EXPECT_CONTAINS(no_value.status().message(), "its attribute 'value' must be a number");
  auto flat_index = AddNode(&graph, "aten.scatter.value",
                            {self, graph.AddInput("flat", {TERN_DTYPE_I64, S({2})})},
                            {A("dim", int64_t{1}), A("value", 1.0)});
  ASSERT_FALSE(flat_index.ok());
  EXPECT_CONTAINS(flat_index.status().message(), "its index [2] and input [3, 5] differ in rank");

  // index_put(self, [index], values, accumulate=True): one index on dim 0.
  const uint32_t table = graph.AddInput("table", F32(S({10, 4})));
  const uint32_t ids = graph.AddInput("ids", {TERN_DTYPE_I64, S({2, 3})});
  const uint32_t grad = graph.AddInput("grad", F32(S({2, 3, 4})));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.index_put.default", {table, ids, grad},
                                   {A("accumulate", true)})),
            F32(S({10, 4})));
  const uint32_t row = graph.AddInput("row", F32(S({4})));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.index_put.default", {table, ids, row},
                                   {A("accumulate", true)})),
            F32(S({10, 4})));
  auto overwrite = AddNode(&graph, "aten.index_put.default", {table, ids, grad}, {});
  ASSERT_FALSE(overwrite.ok());
  EXPECT_CONTAINS(overwrite.status().message(),
                  "it has accumulate=False, which the compiler does not lower yet");
  auto two =
      AddNode(&graph, "aten.index_put.default", {table, ids, ids, grad}, {A("accumulate", true)});
  ASSERT_FALSE(two.ok());
  EXPECT_CONTAINS(two.status().message(), "only index_put with one index tensor on dim 0");
  auto second_dim = AddNode(&graph, "aten.index_put.default", {table, kNoValue, ids, grad},
                            {A("accumulate", true)});
  ASSERT_FALSE(second_dim.ok());
  EXPECT_CONTAINS(second_dim.status().message(), "only index_put with one index tensor on dim 0");
  auto skipped =
      AddNode(&graph, "aten.index_put.default", {table, kNoValue, grad}, {A("accumulate", true)});
  ASSERT_FALSE(skipped.ok());
  EXPECT_CONTAINS(skipped.status().message(), "only index_put with one index tensor on dim 0");
  const uint32_t mask = graph.AddInput("mask", {TERN_DTYPE_BOOL, S({10})});
  auto by_mask =
      AddNode(&graph, "aten.index_put.default", {table, mask, row}, {A("accumulate", true)});
  ASSERT_FALSE(by_mask.ok());
  EXPECT_CONTAINS(by_mask.status().message(),
                  "its index is a bool mask, which the compiler does not lower yet");
  auto wrong_dtype = AddNode(&graph, "aten.index_put.default",
                             {table, ids, graph.AddInput("half", {TERN_DTYPE_BF16, S({4})})},
                             {A("accumulate", true)});
  ASSERT_FALSE(wrong_dtype.ok());
  EXPECT_CONTAINS(wrong_dtype.status().message(), "its values are bf16 and its input f32");
  auto wrong_shape =
      AddNode(&graph, "aten.index_put.default",
              {table, ids, graph.AddInput("wide", F32(S({3, 1, 4})))}, {A("accumulate", true)});
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_CONTAINS(wrong_shape.status().message(), "its values [3, 1, 4] do not broadcast");
  auto flags = AddNode(&graph, "aten.index_put.default",
                       {mask, graph.AddInput("at", {TERN_DTYPE_I64, S({1})}),
                        graph.AddInput("on", {TERN_DTYPE_BOOL, S({1})})},
                       {A("accumulate", true)});
  ASSERT_FALSE(flags.ok());
  EXPECT_CONTAINS(flags.status().message(),
                  "which the compiler does not lower yet: it must have rank 1");
}

TEST(Ops, APythonNumberMayStandForEitherOperand) {
  Graph graph;
  const uint32_t x = graph.AddInput("x", {TERN_DTYPE_BF16, S({2, 3})});
  const uint32_t i = graph.AddInput("i", {TERN_DTYPE_I64, S({3})});
  // 1 - x is sub.Tensor(1, x) after the core ATen decompositions (rsub).
  EXPECT_EQ(
      OutType(graph, AddNode(&graph, "aten.sub.Tensor", {kNoValue, x}, {A("self", int64_t{1})})),
      (TensorType{TERN_DTYPE_BF16, S({2, 3})}));
  EXPECT_EQ(
      OutType(graph, AddNode(&graph, "aten.sub.Tensor", {kNoValue, i}, {A("self", int64_t{2})})),
      (TensorType{TERN_DTYPE_I64, S({3})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.sub.Tensor", {kNoValue, i}, {A("self", 2.5)})),
            (TensorType{TERN_DTYPE_F32, S({3})}));
  EXPECT_EQ(OutType(graph, AddNode(&graph, "aten.lt.Tensor", {kNoValue, i}, {A("self", 0.5)})),
            (TensorType{TERN_DTYPE_BOOL, S({3})}));
  auto neither = AddNode(&graph, "aten.sub.Tensor", {kNoValue, x}, {}, "rsub");
  ASSERT_FALSE(neither.ok());
  EXPECT_CONTAINS(neither.status().message(),
                  "node 'rsub' (aten.sub.Tensor): it has neither a tensor 'self' (input 0) nor a "
                  "number attribute 'self'");
  auto text = AddNode(&graph, "aten.sub.Tensor", {kNoValue, x}, {A("self", std::string("one"))});
  ASSERT_FALSE(text.ok());
  EXPECT_CONTAINS(text.status().message(), "its attribute 'self' must be a number");
  auto nothing = AddNode(&graph, "aten.sub.Tensor", {kNoValue, kNoValue}, {A("self", 1.0)});
  ASSERT_FALSE(nothing.ok());
  EXPECT_CONTAINS(nothing.status().message(), "its self (input 0) is missing");
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
