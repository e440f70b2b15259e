// gather, scatter_add, take_along_axis and scatter_add_along_axis: exact
// results against naive references, negative indices, duplicates summed in
// order, bf16 accumulation in f32, and out-of-range indices failing with the
// position before anything is written.

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

void RandomIndices(Tensor& idx, int64_t size, std::mt19937_64& rng, bool negative = true) {
  for (int64_t i = 0; i < idx.count(); ++i) {
    int64_t v = std::uniform_int_distribution<int64_t>(negative ? -size : 0, size - 1)(rng);
    idx.SetInt(i, v);
  }
}

int64_t Norm(int64_t v, int64_t size) { return v < 0 ? v + size : v; }

// out = table[:axis] + idx.shape + table[axis+1:]
Shape GatherShape(const Shape& t, const Shape& idx, int axis) {
  Shape s(t.begin(), t.begin() + axis);
  s.insert(s.end(), idx.begin(), idx.end());
  s.insert(s.end(), t.begin() + axis + 1, t.end());
  return s;
}

// Linear index into `table` of element `o` of the gathered tensor.
int64_t GatherSource(const Tensor& table, const Tensor& idx, const Tensor& gathered, int axis,
                     int64_t o) {
  std::vector<int64_t> gi = gathered.Index(o);
  const size_t ir = idx.shape().size();
  int64_t ilin = 0;
  for (size_t d = 0; d < ir; ++d) ilin = ilin * idx.shape()[d] + gi[axis + d];
  int64_t t = 0;
  for (size_t d = 0; d < table.shape().size(); ++d) {
    int64_t coord;
    if (static_cast<int>(d) < axis) {
      coord = gi[d];
    } else if (static_cast<int>(d) == axis) {
      coord = Norm(idx.GetInt(ilin), table.shape()[axis]);
    } else {
      coord = gi[d - 1 + ir];
    }
    t = t * table.shape()[d] + coord;
  }
  return t;
}

TEST(GatherTest, AxesIndexRanksDtypesLayouts) {
  std::mt19937_64 rng(21);
  for (tern_dtype_t dt : kAllDtypes) {
    for (tern_dtype_t it : {TERN_DTYPE_I32, TERN_DTYPE_I64}) {
      for (int axis : {0, 1, 2}) {
        for (const Shape& ishape : {Shape{}, Shape{5}, Shape{2, 3}, Shape{0}}) {
          Shape tshape = {4, 6, 3};
          Tensor table = axis == 1 ? Tensor::Permuted(dt, tshape, {2, 0, 1}) : Tensor(dt, tshape);
          table.Randomize(rng, -100, 100);
          Tensor idx =
              ishape.size() == 2 ? Tensor::Permuted(it, ishape, {1, 0}) : Tensor(it, ishape);
          RandomIndices(idx, tshape[axis], rng);
          Tensor out = Tensor::Spaced(dt, GatherShape(tshape, ishape, axis));
          Status st = Exec(TERN_OP_GATHER, {&out, &table, &idx}, {axis});
          ASSERT_TRUE(st.ok()) << st.message();
          std::vector<double> ref(out.count());
          for (int64_t o = 0; o < out.count(); ++o)
            ref[o] = table.Get(GatherSource(table, idx, out, axis, o));
          ASSERT_TRUE(Equal(out, ref))
              << isa::DTypeName(dt) << " axis " << axis << " idx " << ShapeStr(ishape);
        }
      }
    }
  }
}

TEST(GatherTest, EmbeddingSizedAndNegativeAxis) {
  std::mt19937_64 rng(22);
  Tensor table(TERN_DTYPE_BF16, {1000, 64}), idx(TERN_DTYPE_I64, {8, 128});
  table.Randomize(rng);
  RandomIndices(idx, 1000, rng, false);
  Tensor out(TERN_DTYPE_BF16, {8, 128, 64});
  ASSERT_TRUE(Exec(TERN_OP_GATHER, {&out, &table, &idx}, {-2}).ok());
  std::vector<double> ref(out.count());
  for (int64_t o = 0; o < out.count(); ++o) ref[o] = table.Get(GatherSource(table, idx, out, 0, o));
  EXPECT_TRUE(Equal(out, ref));
}

TEST(GatherTest, OutOfRangeIndexFailsBeforeWriting) {
  Tensor table(TERN_DTYPE_F32, {10, 2}), idx(TERN_DTYPE_I64, {5}), out(TERN_DTYPE_F32, {5, 2});
  idx.SetAll({0, 1, 2, 12, 4});
  out.Poison();
  Status st = Exec(TERN_OP_GATHER, {&out, &table, &idx}, {0});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_EQ(st.message(), "gather: index 12 at position [3] is out of range for axis 0 of size 10");
  EXPECT_EQ(out.Bits(0), 0xABABABABu);  // nothing written
  idx.SetInt(3, -11);
  st = Exec(TERN_OP_GATHER, {&out, &table, &idx}, {0});
  EXPECT_EQ(st.message(),
            "gather: index -11 at position [3] is out of range for axis 0 of size 10");
  idx.SetInt(3, -10);  // the first row, counted from the end
  ASSERT_TRUE(Exec(TERN_OP_GATHER, {&out, &table, &idx}, {0}).ok());
  // Empty axis: every index is out of range.
  Tensor empty(TERN_DTYPE_F32, {0, 2}), one(TERN_DTYPE_I32, {1}), out1(TERN_DTYPE_F32, {1, 2});
  st = Exec(TERN_OP_GATHER, {&out1, &empty, &one}, {0});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_NE(st.message().find("of size 0"), std::string::npos);
}

TEST(ScatterAddTest, DuplicatesDtypesLayouts) {
  std::mt19937_64 rng(23);
  for (tern_dtype_t dt : {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I8,
                          TERN_DTYPE_I32, TERN_DTYPE_I64}) {
    for (int axis : {0, 1}) {
      for (const Shape& ishape : {Shape{7}, Shape{3, 4}, Shape{}, Shape{0}}) {
        Shape oshape = {5, 6};
        Tensor out = axis == 0 ? Tensor::Permuted(dt, oshape, {1, 0}) : Tensor(dt, oshape);
        out.Randomize(rng, -10, 10);
        Tensor idx(TERN_DTYPE_I32, ishape);
        RandomIndices(idx, oshape[axis], rng);
        Shape sshape = GatherShape(oshape, ishape, axis);
        Tensor src = Tensor::Spaced(dt, sshape);
        src.Randomize(rng, -10, 10);
        // Reference in double, contributions in order, then one rounding.
        std::vector<double> ref = out.Values();
        for (int64_t s = 0; s < src.count(); ++s)
          ref[GatherSource(out, idx, src, axis, s)] += src.Get(s);
        for (double& v : ref) {
          v = isa::IsFloat(dt) ? RoundToDtype(dt, v)
              : dt == TERN_DTYPE_I8
                  ? static_cast<double>(static_cast<int8_t>(static_cast<int64_t>(v)))
                  : v;
        }
        ASSERT_TRUE(Exec(TERN_OP_SCATTER_ADD, {&out, &idx, &src}, {axis}).ok());
        ASSERT_TRUE(isa::IsFloat(dt) ? Near(out, ref, TolFor(dt)) : Equal(out, ref))
            << isa::DTypeName(dt) << " axis " << axis << " idx " << ShapeStr(ishape);
      }
    }
  }
}

TEST(ScatterAddTest, Bf16AccumulatesInF32AndIsDeterministic) {
  // 256 additions of 1 into one bf16 element: accumulating in bf16 would
  // stop at 256 (256 + 1 rounds back to 256); in f32 it reaches 257.
  Tensor out(TERN_DTYPE_BF16, {2, 3}), idx(TERN_DTYPE_I64, {257}), src(TERN_DTYPE_BF16, {257, 3});
  for (int64_t i = 0; i < 257; ++i) idx.SetInt(i, 1);
  for (int64_t i = 0; i < src.count(); ++i) src.Set(i, 1.0);
  ASSERT_TRUE(Exec(TERN_OP_SCATTER_ADD, {&out, &idx, &src}, {0}).ok());
  EXPECT_EQ(out.Get(3), 256.0);  // 257 rounds to 256 in bf16 (ties to even), once
  // Float sums in index order, identical across thread counts.
  std::mt19937_64 rng(24);
  Tensor big_idx(TERN_DTYPE_I64, {4096}), big_src(TERN_DTYPE_F32, {4096, 128});
  RandomIndices(big_idx, 50, rng);
  big_src.Randomize(rng);
  Tensor a(TERN_DTYPE_F32, {50, 128}), b(TERN_DTYPE_F32, {50, 128});
  const int threads = KernelThreadsForHost();
  SetKernelThreadsForTesting(1);
  ASSERT_TRUE(Exec(TERN_OP_SCATTER_ADD, {&a, &big_idx, &big_src}, {0}).ok());
  SetKernelThreadsForTesting(std::max(2, threads));
  ASSERT_TRUE(Exec(TERN_OP_SCATTER_ADD, {&b, &big_idx, &big_src}, {0}).ok());
  SetKernelThreadsForTesting(0);
  for (int64_t i = 0; i < a.count(); ++i) ASSERT_EQ(a.Bits(i), b.Bits(i));
  // And equal to summing in index order in f32.
  std::vector<float> ref(50 * 128, 0.0f);
  for (int64_t j = 0; j < 4096; ++j) {
    const int64_t row = Norm(big_idx.GetInt(j), 50);
    for (int64_t k = 0; k < 128; ++k)
      ref[row * 128 + k] += static_cast<float>(big_src.Get(j * 128 + k));
  }
  for (int64_t i = 0; i < a.count(); ++i) ASSERT_EQ(a.Get(i), ref[i]) << i;
}

TEST(ScatterAddTest, OutOfRangeFails) {
  Tensor out(TERN_DTYPE_F32, {4, 2}), idx(TERN_DTYPE_I32, {2, 2}), src(TERN_DTYPE_F32, {2, 2, 2});
  idx.SetAll({0, 1, 3, 4});
  Status st = Exec(TERN_OP_SCATTER_ADD, {&out, &idx, &src}, {0});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_EQ(st.message(),
            "scatter_add: index 4 at position [1, 1] is out of range for axis 0 of size 4");
}

TEST(TakeAlongAxisTest, MatchesTorchGather) {
  std::mt19937_64 rng(25);
  for (tern_dtype_t dt : kAllDtypes) {
    for (int axis : {0, 1, 2}) {
      Shape in_shape = {4, 5, 6};
      Shape idx_shape = {3, 5, 2};
      idx_shape[axis] = 7;  // any length along the axis
      Tensor in = Tensor::Permuted(dt, in_shape, {1, 2, 0});
      in.Randomize(rng, -100, 100);
      Tensor idx(TERN_DTYPE_I64, idx_shape);
      RandomIndices(idx, in_shape[axis], rng);
      Tensor out = Tensor::Spaced(dt, idx_shape);
      ASSERT_TRUE(Exec(TERN_OP_TAKE_ALONG_AXIS, {&out, &in, &idx}, {axis}).ok());
      std::vector<double> ref(out.count());
      for (int64_t o = 0; o < out.count(); ++o) {
        std::vector<int64_t> c = out.Index(o);
        c[axis] = Norm(idx.GetInt(o), in_shape[axis]);
        ref[o] = in.Get((c[0] * in_shape[1] + c[1]) * in_shape[2] + c[2]);
      }
      ASSERT_TRUE(Equal(out, ref)) << isa::DTypeName(dt) << " axis " << axis;
    }
  }
  Tensor in(TERN_DTYPE_F32, {2, 3}), idx(TERN_DTYPE_I64, {2, 1}), out(TERN_DTYPE_F32, {2, 1});
  idx.SetAll({2, 3});
  Status st = Exec(TERN_OP_TAKE_ALONG_AXIS, {&out, &in, &idx}, {1});
  EXPECT_EQ(st.message(),
            "take_along_axis: index 3 at position [1, 0] is out of range for axis 1 of size 3");
}

TEST(ScatterAddAlongAxisTest, MatchesTorchScatterAdd) {
  std::mt19937_64 rng(26);
  for (tern_dtype_t dt :
       {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_F16, TERN_DTYPE_I32, TERN_DTYPE_I64}) {
    for (int axis : {0, 1}) {
      Shape out_shape = {4, 5};
      Shape idx_shape = {3, 4};
      idx_shape[axis] = 9;
      Tensor out = Tensor::Permuted(dt, out_shape, {1, 0});
      out.Randomize(rng, -10, 10);
      Tensor idx(TERN_DTYPE_I32, idx_shape), src = Tensor::Spaced(dt, idx_shape);
      RandomIndices(idx, out_shape[axis], rng);
      src.Randomize(rng, -10, 10);
      std::vector<double> ref = out.Values();
      for (int64_t s = 0; s < src.count(); ++s) {
        std::vector<int64_t> c = src.Index(s);
        c[axis] = Norm(idx.GetInt(s), out_shape[axis]);
        ref[c[0] * out_shape[1] + c[1]] += src.Get(s);
      }
      for (double& v : ref) v = RoundToDtype(dt, v);
      ASSERT_TRUE(Exec(TERN_OP_SCATTER_ADD_ALONG_AXIS, {&out, &idx, &src}, {axis}).ok());
      ASSERT_TRUE(isa::IsFloat(dt) ? Near(out, ref, TolFor(dt)) : Equal(out, ref))
          << isa::DTypeName(dt) << " " << axis;
    }
  }
  Tensor out(TERN_DTYPE_F32, {2, 3}), idx(TERN_DTYPE_I64, {2, 2}), src(TERN_DTYPE_F32, {2, 2});
  idx.SetAll({0, -4, 1, 1});
  Status st = Exec(TERN_OP_SCATTER_ADD_ALONG_AXIS, {&out, &idx, &src}, {1});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_EQ(
      st.message(),
      "scatter_add_along_axis: index -4 at position [0, 1] is out of range for axis 1 of size 3");
}

}  // namespace
}  // namespace tern::testing
