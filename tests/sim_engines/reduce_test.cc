// Reductions, softmax and the normalisations (forward and backward) against
// naive double references, with the backward references checked against
// finite differences of the forward ones.

#include <cmath>
#include <limits>

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

// ----------------------------------------------------------------------------
// reduce

struct RefReduce {
  std::vector<double> values;  // per output element
};

// Reference: walk every input element in row-major order.
std::vector<double> ReferenceReduce(int fn, const Tensor& in, const std::vector<bool>& reduced,
                                    const Shape& out_shape) {
  Tensor shape_only(TERN_DTYPE_F32, out_shape);
  const int64_t outs = shape_only.count();
  const size_t rank = in.shape().size();
  std::vector<double> acc(outs), best(outs);
  std::vector<int64_t> iacc(outs), index(outs, 0), count(outs, 0);
  const bool fl = isa::IsFloat(in.dtype());
  for (int64_t o = 0; o < outs; ++o) {
    acc[o] = fn == TERN_REDUCE_PROD || fn == TERN_REDUCE_ALL ? 1 : 0;
    iacc[o] = fn == TERN_REDUCE_PROD || fn == TERN_REDUCE_ALL ? 1 : 0;
    best[o] = NAN;
  }
  int64_t idx[TERN_MAX_RANK];
  for (int64_t i = 0; i < in.count(); ++i) {
    for (int64_t d = static_cast<int64_t>(rank) - 1, rest = i; d >= 0; --d) {
      idx[d] = rest % in.shape()[d];
      rest /= in.shape()[d];
    }
    int64_t o = 0, r = 0;
    for (size_t d = 0; d < rank; ++d) {
      o = o * out_shape[d] + (reduced[d] ? 0 : idx[d]);
      if (reduced[d]) r = r * in.shape()[d] + idx[d];
    }
    const double v = in.Get(i);
    const int64_t iv = in.GetInt(i);
    switch (fn) {
      case TERN_REDUCE_SUM:
      case TERN_REDUCE_MEAN:
        acc[o] += v;
        iacc[o] = static_cast<int64_t>(static_cast<uint64_t>(iacc[o]) + static_cast<uint64_t>(iv));
        break;
      case TERN_REDUCE_PROD:
        acc[o] *= v;
        iacc[o] = static_cast<int64_t>(static_cast<uint64_t>(iacc[o]) * static_cast<uint64_t>(iv));
        break;
      case TERN_REDUCE_MAX:
      case TERN_REDUCE_ARGMAX:
      case TERN_REDUCE_MIN:
      case TERN_REDUCE_ARGMIN: {
        const bool is_max = fn == TERN_REDUCE_MAX || fn == TERN_REDUCE_ARGMAX;
        const bool first = count[o] == 0;
        const bool take = first || (!std::isnan(best[o]) &&
                                    (std::isnan(v) || (is_max ? v > best[o] : v < best[o])));
        if (take) {
          best[o] = v;
          index[o] = r;
        }
        break;
      }
      case TERN_REDUCE_ANY:
        acc[o] = acc[o] != 0 || v != 0 || std::isnan(v);
        break;
      case TERN_REDUCE_ALL:
        acc[o] = acc[o] != 0 && (v != 0 || std::isnan(v));
        break;
    }
    ++count[o];
  }
  std::vector<double> out(outs);
  for (int64_t o = 0; o < outs; ++o) {
    switch (fn) {
      case TERN_REDUCE_SUM:
      case TERN_REDUCE_PROD:
        out[o] = fl ? acc[o] : static_cast<double>(iacc[o]);
        break;
      case TERN_REDUCE_MEAN:
        out[o] = acc[o] / static_cast<double>(count[o]);
        break;
      case TERN_REDUCE_MAX:
      case TERN_REDUCE_MIN:
        out[o] = best[o];
        break;
      case TERN_REDUCE_ARGMAX:
      case TERN_REDUCE_ARGMIN:
        out[o] = static_cast<double>(index[o]);
        break;
      default:
        out[o] = acc[o];
    }
  }
  return out;
}

int64_t WrapTo(tern_dtype_t dt, int64_t v) {
  return dt == TERN_DTYPE_I8    ? static_cast<int8_t>(v)
         : dt == TERN_DTYPE_I32 ? static_cast<int32_t>(v)
                                : v;
}

tern_dtype_t ReduceOutDtype(int fn, tern_dtype_t in) {
  if (fn == TERN_REDUCE_ARGMAX || fn == TERN_REDUCE_ARGMIN) return TERN_DTYPE_I64;
  if (fn == TERN_REDUCE_ANY || fn == TERN_REDUCE_ALL) return TERN_DTYPE_BOOL;
  return in;
}

bool ReduceTakes(int fn, tern_dtype_t dt) {
  if (dt == TERN_DTYPE_BOOL)
    return fn != TERN_REDUCE_SUM && fn != TERN_REDUCE_MEAN && fn != TERN_REDUCE_PROD;
  if (fn == TERN_REDUCE_MEAN) return isa::IsFloat(dt);
  return true;
}

// Runs one reduce and compares with the reference.
void CheckReduce(int fn, Tensor& in, std::vector<int64_t> axes, tern_dtype_t out_dtype) {
  const size_t rank = in.shape().size();
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) reduced[a < 0 ? a + rank : a] = true;
  Shape out_shape = in.shape();
  for (size_t d = 0; d < rank; ++d) {
    if (reduced[d]) out_shape[d] = 1;
  }
  Tensor out = Tensor::Spaced(out_dtype, out_shape);
  std::vector<int64_t> ints = {fn};
  ints.insert(ints.end(), axes.begin(), axes.end());
  Status st = Exec(TERN_OP_REDUCE, {&out, &in}, ints);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<double> ref = ReferenceReduce(fn, in, reduced, out_shape);
  const bool fl = isa::IsFloat(out_dtype);
  for (double& v : ref)
    v = fl ? RoundToDtype(out_dtype, v)
           : static_cast<double>(WrapTo(out_dtype, static_cast<int64_t>(v)));
  const std::string what =
      fmt::format("reduce {} {} {} axes {}", isa::ReduceFnName(fn), isa::DTypeName(in.dtype()),
                  ShapeStr(in.shape()), ShapeStr(axes));
  if (fl && (fn == TERN_REDUCE_SUM || fn == TERN_REDUCE_MEAN || fn == TERN_REDUCE_PROD)) {
    EXPECT_TRUE(Near(out, ref, TolFor(out_dtype, 4))) << what;
  } else {
    EXPECT_TRUE(Equal(out, ref)) << what;
  }
}

TEST(ReduceTest, EveryFunctionDtypeAndAxes) {
  std::mt19937_64 rng(11);
  const std::vector<std::vector<int64_t>> axes_sets = {{0}, {1}, {2}, {-1}, {0, 2}, {}};
  for (int fn = 0; fn < TERN_REDUCE_COUNT; ++fn) {
    for (tern_dtype_t dt : kAllDtypes) {
      if (!ReduceTakes(fn, dt)) continue;
      for (const auto& axes : axes_sets) {
        for (int layout = 0; layout < 3; ++layout) {
          Shape shape = {5, 7, 9};
          Tensor in = layout == 0   ? Tensor(dt, shape)
                      : layout == 1 ? Tensor::Permuted(dt, shape, {2, 0, 1})
                                    : Tensor::Broadcast(dt, shape, {false, true, false});
          if (fn == TERN_REDUCE_PROD) {
            in.Randomize(rng, isa::IsFloat(dt) ? 0.6 : -2, isa::IsFloat(dt) ? 1.4 : 2);
          } else {
            in.Randomize(rng, -50, 50);
          }
          if (fn >= TERN_REDUCE_MAX && isa::IsFloat(dt)) {
            // Repeated extremes: argmax/argmin take the first.
            in.Set(3, 60.0);
            in.Set(in.count() - 1, 60.0);
          }
          CheckReduce(fn, in, axes, ReduceOutDtype(fn, dt));
        }
      }
    }
  }
}

TEST(ReduceTest, EmptyScalarAndMixedOutputs) {
  std::mt19937_64 rng(12);
  Tensor empty_rows(TERN_DTYPE_F32, {3, 0});
  for (int fn :
       {TERN_REDUCE_SUM, TERN_REDUCE_PROD, TERN_REDUCE_MEAN, TERN_REDUCE_ANY, TERN_REDUCE_ALL}) {
    CheckReduce(fn, empty_rows, {1}, ReduceOutDtype(fn, TERN_DTYPE_F32));
  }
  Tensor out(TERN_DTYPE_F32, {3, 1});
  ASSERT_TRUE(Exec(TERN_OP_REDUCE, {&out, &empty_rows}, {TERN_REDUCE_MEAN, 1}).ok());
  EXPECT_TRUE(std::isnan(out.Get(0)));  // 0 / 0
  Tensor no_outputs(TERN_DTYPE_F32, {0, 5});
  CheckReduce(TERN_REDUCE_MAX, no_outputs, {1}, TERN_DTYPE_F32);
  Tensor scalar(TERN_DTYPE_I32, {});
  scalar.SetInt(0, -4);
  for (int fn = 0; fn < TERN_REDUCE_COUNT; ++fn) {
    if (fn == TERN_REDUCE_MEAN) continue;
    CheckReduce(fn, scalar, {}, ReduceOutDtype(fn, TERN_DTYPE_I32));
  }
  // bf16 in, f32 out: accumulate and round once.
  Tensor in(TERN_DTYPE_BF16, {4, 1000});
  in.Randomize(rng);
  CheckReduce(TERN_REDUCE_SUM, in, {1}, TERN_DTYPE_F32);
  // NaN: max propagates it, argmax points at the first NaN.
  Tensor nan(TERN_DTYPE_F32, {5});
  nan.SetAll({1, NAN, 7, NAN, 2});
  CheckReduce(TERN_REDUCE_MAX, nan, {0}, TERN_DTYPE_F32);
  CheckReduce(TERN_REDUCE_ARGMAX, nan, {0}, TERN_DTYPE_I64);
  CheckReduce(TERN_REDUCE_ARGMIN, nan, {0}, TERN_DTYPE_I64);
  Tensor idx(TERN_DTYPE_I64, {1});
  ASSERT_TRUE(Exec(TERN_OP_REDUCE, {&idx, &nan}, {TERN_REDUCE_ARGMAX, 0}).ok());
  EXPECT_EQ(idx.GetInt(0), 1);
  // Integer sums wrap.
  Tensor i8(TERN_DTYPE_I8, {3});
  i8.SetAll({100, 100, 100});
  Tensor i8out(TERN_DTYPE_I8, {1});
  ASSERT_TRUE(Exec(TERN_OP_REDUCE, {&i8out, &i8}, {TERN_REDUCE_SUM, 0}).ok());
  EXPECT_EQ(i8out.GetInt(0), static_cast<int8_t>(300));
}

// ANY / ALL of bool and i8 rows whose reduced dimensions are innermost and
// contiguous take a byte scan (kernels_reduce.cc, AnyAllOfBytes): rows that
// are all true, all false, or true but for one element at either end; kept
// dimensions contiguous, permuted and broadcast; enough rows that the pool
// splits them (each part starts its row walk mid-tensor).
TEST(ReduceTest, AnyAndAllOfByteRowsMatchTheReference) {
  std::mt19937_64 rng(14);
  struct Case {
    Shape shape;
    std::vector<int> order;  // storage order (empty: row-major)
    std::vector<int64_t> axes;
  };
  const Case cases[] = {
      {{8, 4, 32, 32}, {}, {-1}},   // the attention softmax's rows
      {{64, 64, 40}, {}, {2}},      // split across the pool
      {{6, 5, 7}, {}, {1, 2}},      // two reduced dimensions, one run
      {{6, 5, 7}, {1, 0, 2}, {2}},  // kept dimensions permuted
      {{6, 5, 7}, {2, 0, 1}, {0}},  // reduced dimension strided: general path
      {{9, 1, 33}, {}, {-1}},       // a size-1 kept dimension
  };
  for (tern_dtype_t dt : {TERN_DTYPE_BOOL, TERN_DTYPE_I8}) {
    for (const Case& c : cases) {
      Tensor in = c.order.empty() ? Tensor(dt, c.shape) : Tensor::Permuted(dt, c.shape, c.order);
      // Per element: mostly true, with whole false rows and lone zeros.
      std::uniform_int_distribution<int> pick(0, 9);
      for (int64_t i = 0; i < in.count(); ++i) {
        const int r = pick(rng);
        in.SetInt(i, r == 0 ? 0 : (dt == TERN_DTYPE_I8 && r == 1 ? -3 : 1));
      }
      for (int fn : {TERN_REDUCE_ANY, TERN_REDUCE_ALL}) {
        CheckReduce(fn, in, c.axes, TERN_DTYPE_BOOL);
      }
      // All ones, then all zeros: ALL true and ANY false everywhere.
      for (int64_t i = 0; i < in.count(); ++i) in.SetInt(i, 1);
      for (int fn : {TERN_REDUCE_ANY, TERN_REDUCE_ALL})
        CheckReduce(fn, in, c.axes, TERN_DTYPE_BOOL);
      for (int64_t i = 0; i < in.count(); ++i) in.SetInt(i, 0);
      for (int fn : {TERN_REDUCE_ANY, TERN_REDUCE_ALL})
        CheckReduce(fn, in, c.axes, TERN_DTYPE_BOOL);
    }
  }
}

TEST(ReduceTest, LargeColumnRowAndBlockedPathsAreThreadCountIndependent) {
  std::mt19937_64 rng(13);
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  // Columns (reduce the outer axis of contiguous data), rows, and a few
  // long rows (the blocked path).
  for (const Case& c :
       {Case{{400, 300}, {0}}, Case{{300, 400}, {1}}, Case{{2, 140000}, {1}}, Case{{140000}, {}}}) {
    for (int fn : {TERN_REDUCE_SUM, TERN_REDUCE_MAX, TERN_REDUCE_ARGMIN}) {
      Tensor in(TERN_DTYPE_F32, c.shape);
      in.Randomize(rng, -1, 1);
      CheckReduce(fn, in, c.axes, ReduceOutDtype(fn, TERN_DTYPE_F32));
      Shape out_shape = c.shape;
      for (int64_t a : c.axes) out_shape[a] = 1;
      if (c.axes.empty()) out_shape.assign(c.shape.size(), 1);
      Tensor one(ReduceOutDtype(fn, TERN_DTYPE_F32), out_shape),
          two(ReduceOutDtype(fn, TERN_DTYPE_F32), out_shape);
      std::vector<int64_t> ints = {fn};
      ints.insert(ints.end(), c.axes.begin(), c.axes.end());
      const int threads = KernelThreadsForHost();
      SetKernelThreadsForTesting(1);
      ASSERT_TRUE(Exec(TERN_OP_REDUCE, {&one, &in}, ints).ok());
      SetKernelThreadsForTesting(std::max(2, threads));
      ASSERT_TRUE(Exec(TERN_OP_REDUCE, {&two, &in}, ints).ok());
      SetKernelThreadsForTesting(0);
      for (int64_t i = 0; i < one.count(); ++i)
        ASSERT_EQ(one.Bits(i), two.Bits(i)) << ShapeStr(c.shape);
    }
  }
}

// A column sum of f32 (a bias gradient: [tokens, features] summed over the
// tokens, here also over a second, strided reduced dimension) adds each
// output's rows in order in double: exactly the sequential sum, rounded once.
TEST(ReduceTest, ColumnSumsAddTheRowsInOrderInDouble) {
  std::mt19937_64 rng(17);
  Tensor in(TERN_DTYPE_F32, {37, 3, 300});
  in.Randomize(rng, -1, 1);
  for (int fn : {TERN_REDUCE_SUM, TERN_REDUCE_MEAN}) {
    Tensor out(TERN_DTYPE_F32, {1, 1, 300});
    out.Poison();
    ASSERT_TRUE(Exec(TERN_OP_REDUCE, {&out, &in}, {fn, 0, 1}).ok());
    for (int64_t j = 0; j < 300; ++j) {
      double sum = 0;
      for (int64_t r = 0; r < 37 * 3; ++r) sum += in.Get(r * 300 + j);
      if (fn == TERN_REDUCE_MEAN) sum /= 37 * 3;
      ASSERT_EQ(out.Get(j), static_cast<double>(static_cast<float>(sum))) << j;
    }
  }
}

// ----------------------------------------------------------------------------
// softmax

// Softmax over `axis` of a tensor's values (row-major), in double.
std::vector<double> RefSoftmax(const Tensor& in, int64_t axis, bool log) {
  std::vector<double> out(in.count());
  const Shape& s = in.shape();
  if (s.empty()) return {log ? 0.0 : 1.0};
  const int64_t len = s[axis];
  int64_t inner = 1;
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t outer = in.count() / std::max<int64_t>(1, len * inner);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t k) { return (o * len + k) * inner + j; };
      double m = -INFINITY;
      for (int64_t k = 0; k < len; ++k) m = std::max(m, in.Get(at(k)));
      double sum = 0;
      for (int64_t k = 0; k < len; ++k) sum += std::exp(in.Get(at(k)) - m);
      for (int64_t k = 0; k < len; ++k) {
        out[at(k)] = log ? in.Get(at(k)) - m - std::log(sum) : std::exp(in.Get(at(k)) - m) / sum;
      }
    }
  }
  return out;
}

TEST(SoftmaxTest, AxesDtypesLayouts) {
  std::mt19937_64 rng(14);
  for (tern_dtype_t dt : kFloatDtypes) {
    for (const Shape& shape : {Shape{7, 33}, Shape{4, 5, 6}, Shape{3, 0}, Shape{1, 1000}}) {
      for (int64_t axis = -1; axis < static_cast<int64_t>(shape.size()); ++axis) {
        for (int log = 0; log < 2; ++log) {
          Tensor in = shape.size() == 2 ? Tensor::Permuted(dt, shape, {1, 0}) : Tensor(dt, shape);
          in.Randomize(rng, -6, 6);
          Tensor out = Tensor::Spaced(dt, shape);
          ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&out, &in}, {axis, log}).ok());
          std::vector<double> ref = RefSoftmax(in, axis < 0 ? axis + shape.size() : axis, log);
          for (double& v : ref) v = RoundToDtype(dt, v);
          ASSERT_TRUE(Near(out, ref, TolFor(dt, 2)))
              << (log ? "log_" : "") << "softmax " << isa::DTypeName(dt) << " " << ShapeStr(shape)
              << " axis " << axis;
        }
      }
    }
  }
  Tensor scalar(TERN_DTYPE_F32, {}), sout(TERN_DTYPE_F32, {});
  scalar.Set(0, 3.0);
  ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&sout, &scalar}, {0, 0}).ok());
  EXPECT_EQ(sout.Get(0), 1.0);
  ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&sout, &scalar}, {-1, 1}).ok());
  EXPECT_EQ(sout.Get(0), 0.0);
}

TEST(SoftmaxTest, InfinitiesAndLargeRows) {
  Tensor in(TERN_DTYPE_F32, {3, 3}), out(TERN_DTYPE_F32, {3, 3});
  in.SetAll({-INFINITY, 0.0, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 1000.0, 1000.0, -1000.0});
  ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&out, &in}, {1, 0}).ok());
  EXPECT_EQ(out.Get(0), 0.0);
  EXPECT_EQ(out.Get(1), 1.0);
  EXPECT_TRUE(std::isnan(out.Get(3)));  // a row of -inf: NaN, as PyTorch
  EXPECT_FLOAT_EQ(out.Get(6), 0.5);
  EXPECT_EQ(out.Get(8), 0.0);
  std::mt19937_64 rng(15);
  Tensor big(TERN_DTYPE_BF16, {64, 4096}), bout(TERN_DTYPE_BF16, {64, 4096});
  big.Randomize(rng, -10, 10);
  ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&bout, &big}, {1, 1}).ok());
  std::vector<double> ref = RefSoftmax(big, 1, true);
  for (double& v : ref) v = RoundToDtype(TERN_DTYPE_BF16, v);
  EXPECT_TRUE(Near(bout, ref, TolFor(TERN_DTYPE_BF16)));
}

// The row maximum runs sixteen lanes at a time and then the tail: a NaN in
// either part makes its row NaN, and the maximum may sit in either.
TEST(SoftmaxTest, NanRowsAndMaximumInTheTail) {
  const int64_t len = 37;  // two blocks of sixteen and a tail of five
  Tensor in(TERN_DTYPE_F32, {4, len}), out(TERN_DTYPE_F32, {4, len});
  std::vector<double> values(4 * len);
  for (int64_t i = 0; i < 4 * len; ++i) values[i] = static_cast<double>(i % len) / len;
  values[0 * len + 3] = NAN;    // in a block
  values[1 * len + 35] = NAN;   // in the tail
  values[2 * len + 36] = 50.0;  // the maximum in the tail
  in.SetAll(values);
  ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&out, &in}, {1, 0}).ok());
  for (int64_t i = 0; i < len; ++i) {
    EXPECT_TRUE(std::isnan(out.Get(0 * len + i))) << i;
    EXPECT_TRUE(std::isnan(out.Get(1 * len + i))) << i;
  }
  EXPECT_FLOAT_EQ(out.Get(2 * len + 36), 1.0f);
  EXPECT_LT(out.Get(2 * len + 35), 1e-20);
  const std::vector<double> ref = RefSoftmax(in, 1, false);
  for (int64_t i = 3 * len; i < 4 * len; ++i) EXPECT_NEAR(out.Get(i), ref[i], 1e-6) << i;
}

// Rows that are contiguous and evenly spaced are computed where they lie;
// any other layout goes through a row buffer. Both give the same bits,
// forward and backward: a contiguous 4-D tensor, rows spaced wider than they
// are long (a slice), and in place (output = input), against the same rows
// into a spaced output.
TEST(SoftmaxTest, RowsInPlaceMatchRowsThroughABuffer) {
  std::mt19937_64 rng(16);
  for (int log = 0; log < 2; ++log) {
    for (const auto& [shape, strides] :
         {std::pair<Shape, Shape>{{3, 4, 5, 37}, {740, 185, 37, 1}},
          std::pair<Shape, Shape>{{6, 37}, {40, 1}}, std::pair<Shape, Shape>{{2, 64}, {64, 1}}}) {
      Tensor in = Tensor::Strided(TERN_DTYPE_F32, shape, strides);
      in.Randomize(rng, -8, 8);
      Tensor fast(TERN_DTYPE_F32, shape), buffered = Tensor::Spaced(TERN_DTYPE_F32, shape);
      ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&fast, &in}, {-1, log}).ok());
      ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&buffered, &in}, {-1, log}).ok());
      for (int64_t i = 0; i < fast.count(); ++i) {
        ASSERT_EQ(fast.Bits(i), buffered.Bits(i)) << (log ? "log_" : "") << "softmax " << i;
      }
      // The backward of the same rows: [grad_in, grad_out, out].
      Tensor grad = Tensor::Strided(TERN_DTYPE_F32, shape, strides);
      grad.Randomize(rng, -1, 1);
      Tensor fast_grad(TERN_DTYPE_F32, shape),
          buffered_grad = Tensor::Spaced(TERN_DTYPE_F32, shape);
      ASSERT_TRUE(Exec(TERN_OP_SOFTMAX_BACKWARD, {&fast_grad, &grad, &fast}, {-1, log}).ok());
      ASSERT_TRUE(Exec(TERN_OP_SOFTMAX_BACKWARD, {&buffered_grad, &grad, &fast}, {-1, log}).ok());
      for (int64_t i = 0; i < fast.count(); ++i) {
        ASSERT_EQ(fast_grad.Bits(i), buffered_grad.Bits(i))
            << (log ? "log_" : "") << "backward " << i;
      }
      ASSERT_TRUE(Exec(TERN_OP_SOFTMAX, {&in, &in}, {-1, log}).ok());
      for (int64_t i = 0; i < fast.count(); ++i) {
        ASSERT_EQ(in.Bits(i), fast.Bits(i)) << (log ? "log_" : "") << "softmax in place " << i;
      }
    }
  }
}

TEST(SoftmaxTest, Backward) {
  std::mt19937_64 rng(16);
  for (tern_dtype_t dt : kFloatDtypes) {
    for (const Shape& shape : {Shape{6, 17}, Shape{2, 3, 4}}) {
      for (int64_t axis : {int64_t{0}, int64_t{-1}}) {
        for (int log = 0; log < 2; ++log) {
          Tensor x(dt, shape);
          x.Randomize(rng, -3, 3);
          const int64_t a = axis < 0 ? axis + shape.size() : axis;
          Tensor y(dt, shape);
          y.SetAll(RefSoftmax(x, a, log));
          Tensor g = Tensor::Permuted(
              dt, shape, shape.size() == 2 ? std::vector<int>{1, 0} : std::vector<int>{2, 1, 0});
          g.Randomize(rng, -1, 1);
          Tensor gi = Tensor::Spaced(dt, shape);
          ASSERT_TRUE(Exec(TERN_OP_SOFTMAX_BACKWARD, {&gi, &g, &y}, {axis, log}).ok());
          // Reference from the stored y and g, along the axis.
          std::vector<double> ref(gi.count());
          int64_t inner = 1;
          for (size_t d = a + 1; d < shape.size(); ++d) inner *= shape[d];
          const int64_t len = shape[a], outer = gi.count() / (len * inner);
          for (int64_t o = 0; o < outer; ++o) {
            for (int64_t j = 0; j < inner; ++j) {
              double s = 0;
              for (int64_t k = 0; k < len; ++k) {
                const int64_t i = (o * len + k) * inner + j;
                s += log ? g.Get(i) : g.Get(i) * y.Get(i);
              }
              for (int64_t k = 0; k < len; ++k) {
                const int64_t i = (o * len + k) * inner + j;
                ref[i] = RoundToDtype(
                    dt, log ? g.Get(i) - std::exp(y.Get(i)) * s : y.Get(i) * (g.Get(i) - s));
              }
            }
          }
          ASSERT_TRUE(Near(gi, ref, TolFor(dt, 2)))
              << isa::DTypeName(dt) << " " << ShapeStr(shape) << " log " << log;
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------
// layer norm and rms norm

struct NormRef {
  std::vector<double> out, mean, rstd;
};

// Rows are the leading dims, the last k axes are normalized.
NormRef RefLayerNorm(const std::vector<double>& x, int64_t rows, int64_t len,
                     const std::vector<double>* w, const std::vector<double>* b, double eps,
                     bool rms) {
  NormRef r;
  r.out.resize(rows * len);
  for (int64_t i = 0; i < rows; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < len; ++j) mean += x[i * len + j];
    mean = rms ? 0.0 : (len ? mean / len : 0.0);
    for (int64_t j = 0; j < len; ++j) var += (x[i * len + j] - mean) * (x[i * len + j] - mean);
    var = len ? var / len : 0.0;
    const double rstd = 1 / std::sqrt(var + eps);
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
    for (int64_t j = 0; j < len; ++j) {
      double y = (x[i * len + j] - mean) * rstd;
      if (w) y *= (*w)[j];
      if (b) y += (*b)[j];
      r.out[i * len + j] = y;
    }
  }
  return r;
}

struct NormGrads {
  std::vector<double> gi, gw, gb;
};

NormGrads RefNormBackward(const std::vector<double>& x, const std::vector<double>& g, int64_t rows,
                          int64_t len, const std::vector<double>& mean,
                          const std::vector<double>& rstd, const std::vector<double>* w, bool rms) {
  NormGrads r;
  r.gi.resize(rows * len);
  r.gw.assign(len, 0.0);
  r.gb.assign(len, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double c1 = 0, c2 = 0;
    std::vector<double> xhat(len), gw(len);
    for (int64_t j = 0; j < len; ++j) {
      xhat[j] = (x[i * len + j] - (rms ? 0.0 : mean[i])) * rstd[i];
      gw[j] = g[i * len + j] * (w ? (*w)[j] : 1.0);
      c1 += gw[j] * xhat[j];
      c2 += gw[j];
      r.gw[j] += g[i * len + j] * xhat[j];
      r.gb[j] += g[i * len + j];
    }
    c1 /= len;
    c2 /= len;
    for (int64_t j = 0; j < len; ++j)
      r.gi[i * len + j] = rstd[i] * (gw[j] - (rms ? 0.0 : c2) - xhat[j] * c1);
  }
  return r;
}

TEST(NormTest, ReferenceGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(17);
  const int64_t rows = 3, len = 5;
  std::vector<double> x(rows * len), g(rows * len), w(len), b(len);
  std::uniform_real_distribution<double> u(-2, 2);
  for (double& v : x) v = u(rng);
  for (double& v : g) v = u(rng);
  for (double& v : w) v = u(rng);
  for (double& v : b) v = u(rng);
  for (bool rms : {false, true}) {
    const double eps = 1e-3;
    auto loss = [&](const std::vector<double>& xs, const std::vector<double>& ws,
                    const std::vector<double>& bs) {
      NormRef r = RefLayerNorm(xs, rows, len, &ws, rms ? nullptr : &bs, eps, rms);
      double l = 0;
      for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * g[i];
      return l;
    };
    NormRef fwd = RefLayerNorm(x, rows, len, &w, rms ? nullptr : &b, eps, rms);
    NormGrads grads = RefNormBackward(x, g, rows, len, fwd.mean, fwd.rstd, &w, rms);
    const double h = 1e-6;
    for (int64_t i = 0; i < rows * len; ++i) {
      std::vector<double> xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      EXPECT_NEAR(grads.gi[i], (loss(xp, w, b) - loss(xm, w, b)) / (2 * h), 1e-5)
          << "rms " << rms << " x " << i;
    }
    for (int64_t j = 0; j < len; ++j) {
      std::vector<double> wp = w, wm = w, bp = b, bm = b;
      wp[j] += h;
      wm[j] -= h;
      bp[j] += h;
      bm[j] -= h;
      EXPECT_NEAR(grads.gw[j], (loss(x, wp, b) - loss(x, wm, b)) / (2 * h), 1e-5);
      if (!rms) {
        EXPECT_NEAR(grads.gb[j], (loss(x, w, bp) - loss(x, w, bm)) / (2 * h), 1e-5);
      }
    }
  }
}

Shape Leading(const Shape& s, int k) { return Shape(s.begin(), s.end() - k); }
Shape Trailing(const Shape& s, int k) { return Shape(s.end() - k, s.end()); }

TEST(NormTest, LayerNormForwardAndBackward) {
  std::mt19937_64 rng(18);
  for (tern_dtype_t dt : kFloatDtypes) {
    for (const Shape& shape : {Shape{4, 6, 10}, Shape{3, 1000}, Shape{0, 8}, Shape{2, 0}}) {
      for (int k : {1, 2}) {
        if (k > static_cast<int>(shape.size())) continue;
        for (bool affine : {false, true}) {
          Tensor x = shape.size() == 3 ? Tensor::Permuted(dt, shape, {1, 0, 2}) : Tensor(dt, shape);
          x.Randomize(rng, -3, 3);
          Tensor w(dt, Trailing(shape, k)), b(dt, Trailing(shape, k));
          w.Randomize(rng, 0.5, 1.5);
          b.Randomize(rng, -1, 1);
          Tensor out = Tensor::Spaced(dt, shape), mean(TERN_DTYPE_F32, Leading(shape, k)),
                 rstd(TERN_DTYPE_F32, Leading(shape, k));
          ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM,
                           {&out, &mean, &rstd, &x, affine ? &w : kAbsent, affine ? &b : kAbsent},
                           {k}, {1e-5})
                          .ok());
          const int64_t len = Tensor(dt, Trailing(shape, k)).count(),
                        rows = len ? x.count() / len : Tensor(dt, Leading(shape, k)).count();
          std::vector<double> wv = w.Values(), bv = b.Values();
          NormRef ref = RefLayerNorm(x.Values(), rows, len, affine ? &wv : nullptr,
                                     affine ? &bv : nullptr, 1e-5, false);
          std::vector<double> ro = ref.out;
          for (double& v : ro) v = RoundToDtype(dt, v);
          ASSERT_TRUE(Near(out, ro, TolFor(dt, 4)))
              << isa::DTypeName(dt) << " " << ShapeStr(shape) << " k " << k;
          ASSERT_TRUE(Near(mean, ref.mean, {1e-5, 1e-6}));
          ASSERT_TRUE(Near(rstd, ref.rstd, {1e-5, 1e-6}));
          // Backward from the kernel's own mean/rstd.
          Tensor g = Tensor::Spaced(dt, shape), gi(dt, shape),
                 gw(TERN_DTYPE_F32, Trailing(shape, k)), gb(TERN_DTYPE_F32, Trailing(shape, k));
          g.Randomize(rng, -1, 1);
          ASSERT_TRUE(
              Exec(TERN_OP_LAYER_NORM_BACKWARD,
                   {&gi, &gw, affine ? &gb : kAbsent, &g, &x, &mean, &rstd, affine ? &w : kAbsent},
                   {k})
                  .ok());
          NormGrads grads = RefNormBackward(x.Values(), g.Values(), rows, len, mean.Values(),
                                            rstd.Values(), affine ? &wv : nullptr, false);
          for (double& v : grads.gi) v = RoundToDtype(dt, v);
          ASSERT_TRUE(Near(gi, grads.gi, TolFor(dt, 8)))
              << "grad_in " << isa::DTypeName(dt) << " " << ShapeStr(shape);
          ASSERT_TRUE(Near(gw, grads.gw, {1e-4, 1e-4})) << "grad_weight";
          if (affine) {
            ASSERT_TRUE(Near(gb, grads.gb, {1e-4, 1e-4})) << "grad_bias";
          }
        }
      }
    }
  }
}

// Rows of f32 that are contiguous and evenly spaced are normalized where
// they lie; other layouts go through a row buffer. The same bits either way
// (output, mean and rstd), with and without weight and bias, over one or two
// normalized dims, rows spaced wider than they are long, and in place.
TEST(NormTest, LayerNormRowsInPlaceMatchRowsThroughABuffer) {
  std::mt19937_64 rng(19);
  for (const auto& [shape, strides, k] :
       {std::tuple<Shape, Shape, int>{{4, 64, 128}, {8192, 128, 1}, 1},
        std::tuple<Shape, Shape, int>{{6, 5, 7}, {40, 7, 1}, 2},
        std::tuple<Shape, Shape, int>{{9, 33}, {40, 1}, 1}}) {
    for (bool affine : {false, true}) {
      SCOPED_TRACE(ShapeStr(shape) + (affine ? " affine" : ""));
      Tensor x = Tensor::Strided(TERN_DTYPE_F32, shape, strides);
      x.Randomize(rng, -3, 3);
      Tensor w(TERN_DTYPE_F32, Trailing(shape, k)), b(TERN_DTYPE_F32, Trailing(shape, k));
      w.Randomize(rng, 0.5, 1.5);
      b.Randomize(rng, -1, 1);
      Tensor fast(TERN_DTYPE_F32, shape), buffered = Tensor::Spaced(TERN_DTYPE_F32, shape);
      Tensor mean_fast(TERN_DTYPE_F32, Leading(shape, k)),
          rstd_fast(TERN_DTYPE_F32, Leading(shape, k));
      Tensor mean_buffered(TERN_DTYPE_F32, Leading(shape, k)),
          rstd_buffered(TERN_DTYPE_F32, Leading(shape, k));
      Tensor* wp = affine ? &w : kAbsent;
      Tensor* bp = affine ? &b : kAbsent;
      ASSERT_TRUE(
          Exec(TERN_OP_LAYER_NORM, {&fast, &mean_fast, &rstd_fast, &x, wp, bp}, {k}, {1e-5}).ok());
      ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM, {&buffered, &mean_buffered, &rstd_buffered, &x, wp, bp},
                       {k}, {1e-5})
                      .ok());
      for (int64_t i = 0; i < fast.count(); ++i) ASSERT_EQ(fast.Bits(i), buffered.Bits(i)) << i;
      for (int64_t i = 0; i < mean_fast.count(); ++i) {
        ASSERT_EQ(mean_fast.Bits(i), mean_buffered.Bits(i)) << i;
        ASSERT_EQ(rstd_fast.Bits(i), rstd_buffered.Bits(i)) << i;
      }
      ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM, {&x, kAbsent, kAbsent, &x, wp, bp}, {k}, {1e-5}).ok());
      for (int64_t i = 0; i < fast.count(); ++i) ASSERT_EQ(x.Bits(i), fast.Bits(i)) << i;
    }
  }
}

// The backward reads and writes contiguous f32 rows where they lie and other
// layouts through row buffers: the same bits either way, for layer norm and
// RMS norm, and with grad_in written over grad_out's memory.
TEST(NormTest, BackwardRowsInPlaceMatchRowsThroughABuffer) {
  std::mt19937_64 rng(23);
  const Shape shape = {8, 32, 64};
  Tensor x(TERN_DTYPE_F32, shape), x_spaced = Tensor::Spaced(TERN_DTYPE_F32, shape);
  x.Randomize(rng, -3, 3);
  x_spaced.SetAll(x.Values());
  Tensor w(TERN_DTYPE_F32, {64}), b(TERN_DTYPE_F32, {64});
  w.Randomize(rng, 0.5, 1.5);
  b.Randomize(rng, -1, 1);
  Tensor out(TERN_DTYPE_F32, shape), mean(TERN_DTYPE_F32, {8, 32}), rstd(TERN_DTYPE_F32, {8, 32});
  ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM, {&out, &mean, &rstd, &x, &w, &b}, {1}, {1e-5}).ok());
  Tensor g(TERN_DTYPE_F32, shape), g_spaced = Tensor::Spaced(TERN_DTYPE_F32, shape);
  g.Randomize(rng, -1, 1);
  g_spaced.SetAll(g.Values());
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rms norm" : "layer norm");
    auto run = [&](Tensor* gi, Tensor* gw, Tensor* gb, Tensor* grad, Tensor* in) {
      return rms ? Exec(TERN_OP_RMS_NORM_BACKWARD, {gi, gw, grad, in, &rstd, &w}, {1})
                 : Exec(TERN_OP_LAYER_NORM_BACKWARD, {gi, gw, gb, grad, in, &mean, &rstd, &w}, {1});
    };
    Tensor gi(TERN_DTYPE_F32, shape), gw(TERN_DTYPE_F32, {64}), gb(TERN_DTYPE_F32, {64});
    ASSERT_TRUE(run(&gi, &gw, &gb, &g, &x).ok());
    Tensor gi2 = Tensor::Spaced(TERN_DTYPE_F32, shape), gw2(TERN_DTYPE_F32, {64}),
           gb2(TERN_DTYPE_F32, {64});
    ASSERT_TRUE(run(&gi2, &gw2, &gb2, &g_spaced, &x_spaced).ok());
    EXPECT_TRUE(SameBits(gi, gi2));
    EXPECT_TRUE(SameBits(gw, gw2));
    if (!rms) {
      EXPECT_TRUE(SameBits(gb, gb2));
    }
    Tensor in_place(TERN_DTYPE_F32, shape);
    in_place.SetAll(g.Values());
    ASSERT_TRUE(run(&in_place, &gw2, &gb2, &in_place, &x).ok());
    EXPECT_TRUE(SameBits(in_place, gi));
    EXPECT_TRUE(SameBits(gw, gw2));
  }
}

TEST(NormTest, RmsNormForwardAndBackward) {
  std::mt19937_64 rng(19);
  for (tern_dtype_t dt : kFloatDtypes) {
    for (const Shape& shape : {Shape{4, 6, 10}, Shape{5, 777}, Shape{0, 8}}) {
      for (bool weighted : {false, true}) {
        const int k = 1;
        Tensor x = shape.size() == 3 ? Tensor::Permuted(dt, shape, {2, 0, 1}) : Tensor(dt, shape);
        x.Randomize(rng, -3, 3);
        Tensor w(dt, Trailing(shape, k));
        w.Randomize(rng, 0.5, 1.5);
        Tensor out(dt, shape), rstd = Tensor::Spaced(TERN_DTYPE_F32, Leading(shape, k));
        ASSERT_TRUE(
            Exec(TERN_OP_RMS_NORM, {&out, &rstd, &x, weighted ? &w : kAbsent}, {k}, {1e-6}).ok());
        const int64_t len = shape.back(), rows = x.count() / len;
        std::vector<double> wv = w.Values();
        NormRef ref =
            RefLayerNorm(x.Values(), rows, len, weighted ? &wv : nullptr, nullptr, 1e-6, true);
        for (double& v : ref.out) v = RoundToDtype(dt, v);
        ASSERT_TRUE(Near(out, ref.out, TolFor(dt, 4)))
            << isa::DTypeName(dt) << " " << ShapeStr(shape);
        ASSERT_TRUE(Near(rstd, ref.rstd, {1e-5, 1e-6}));
        Tensor g(dt, shape), gi = Tensor::Spaced(dt, shape), gw(TERN_DTYPE_F32, Trailing(shape, k));
        g.Randomize(rng, -1, 1);
        ASSERT_TRUE(
            Exec(TERN_OP_RMS_NORM_BACKWARD, {&gi, &gw, &g, &x, &rstd, weighted ? &w : kAbsent}, {k})
                .ok());
        NormGrads grads = RefNormBackward(x.Values(), g.Values(), rows, len, ref.mean,
                                          rstd.Values(), weighted ? &wv : nullptr, true);
        for (double& v : grads.gi) v = RoundToDtype(dt, v);
        ASSERT_TRUE(Near(gi, grads.gi, TolFor(dt, 8))) << "grad_in " << isa::DTypeName(dt);
        ASSERT_TRUE(Near(gw, grads.gw, {1e-4, 1e-4})) << "grad_weight";
      }
    }
  }
}

TEST(NormTest, GradWeightIsThreadCountIndependent) {
  std::mt19937_64 rng(20);
  Tensor x(TERN_DTYPE_F32, {4096, 64}), g(TERN_DTYPE_F32, {4096, 64}),
      gi(TERN_DTYPE_F32, {4096, 64});
  Tensor mean(TERN_DTYPE_F32, {4096}), rstd(TERN_DTYPE_F32, {4096}), y(TERN_DTYPE_F32, {4096, 64});
  x.Randomize(rng);
  g.Randomize(rng);
  ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM, {&y, &mean, &rstd, &x}, {1}, {1e-5}).ok());
  Tensor gw1(TERN_DTYPE_F32, {64}), gw2(TERN_DTYPE_F32, {64}), gb1(TERN_DTYPE_F32, {64}),
      gb2(TERN_DTYPE_F32, {64});
  const int threads = KernelThreadsForHost();
  SetKernelThreadsForTesting(1);
  ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM_BACKWARD, {&gi, &gw1, &gb1, &g, &x, &mean, &rstd}, {1}).ok());
  SetKernelThreadsForTesting(std::max(2, threads));
  ASSERT_TRUE(Exec(TERN_OP_LAYER_NORM_BACKWARD, {&gi, &gw2, &gb2, &g, &x, &mean, &rstd}, {1}).ok());
  SetKernelThreadsForTesting(0);
  for (int64_t j = 0; j < 64; ++j) {
    EXPECT_EQ(gw1.Bits(j), gw2.Bits(j));
    EXPECT_EQ(gb1.Bits(j), gb2.Bits(j));
  }
}

}  // namespace
}  // namespace tern::testing
