// scatter and scatter_along_axis (the overwriting scatters): exact results
// against naive references that write in index order (so the last duplicate
// wins), every dtype including bool, strided layouts, negative indices
// (counted from the end by scatter, refused by scatter_along_axis), empty
// indices, the same bits on any thread count, and out-of-range indices
// failing with the position before anything is written.

#include "kernel_test_util.h"

namespace tern::testing {
namespace {

void RandomIndices(Tensor& idx, int64_t size, std::mt19937_64& rng) {
  for (int64_t i = 0; i < idx.count(); ++i) {
    idx.SetInt(i, std::uniform_int_distribution<int64_t>(-size, size - 1)(rng));
  }
}

int64_t Norm(int64_t v, int64_t size) { return v < 0 ? v + size : v; }

// src's shape for SCATTER: out[:axis] + idx.shape + out[axis+1:].
Shape IndexedShape(const Shape& out, const Shape& idx, int axis) {
  Shape s(out.begin(), out.begin() + axis);
  s.insert(s.end(), idx.begin(), idx.end());
  s.insert(s.end(), out.begin() + axis + 1, out.end());
  return s;
}

// Row-major linear index into `out` of src element `s` of a SCATTER.
int64_t Destination(const Shape& out, const Tensor& idx, const Tensor& src, int axis, int64_t s) {
  const std::vector<int64_t> c = src.Index(s);
  const size_t ir = idx.shape().size();
  int64_t ilin = 0;
  for (size_t d = 0; d < ir; ++d) ilin = ilin * idx.shape()[d] + c[axis + d];
  int64_t lin = 0;
  for (size_t d = 0; d < out.size(); ++d) {
    const int64_t coord = static_cast<int>(d) < axis    ? c[d]
                          : static_cast<int>(d) == axis ? Norm(idx.GetInt(ilin), out[axis])
                                                        : c[d - 1 + ir];
    lin = lin * out[d] + coord;
  }
  return lin;
}

TEST(ScatterTest, LastDuplicateWinsEveryDtypeAndLayout) {
  std::mt19937_64 rng(31);
  for (tern_dtype_t dt : kAllDtypes) {
    for (tern_dtype_t it : {TERN_DTYPE_I32, TERN_DTYPE_I64}) {
      for (int axis : {0, 1, 2}) {
        for (const Shape& ishape : {Shape{9}, Shape{3, 4}, Shape{}, Shape{0}}) {
          const Shape oshape = {4, 3, 5};
          Tensor out = axis == 1 ? Tensor::Permuted(dt, oshape, {2, 0, 1}) : Tensor(dt, oshape);
          out.Randomize(rng, -50, 50);
          Tensor idx(it, ishape);
          RandomIndices(idx, oshape[axis], rng);  // 9 or 12 of 3..5: duplicates
          Tensor src = Tensor::Spaced(dt, IndexedShape(oshape, ishape, axis));
          src.Randomize(rng, -50, 50);
          // src is visited in row-major order, which walks the indices in
          // order for each position of the other dimensions.
          std::vector<double> ref = out.Values();
          for (int64_t s = 0; s < src.count(); ++s) {
            ref[Destination(oshape, idx, src, axis, s)] = src.Get(s);
          }
          ASSERT_TRUE(Exec(TERN_OP_SCATTER, {&out, &idx, &src}, {axis}).ok());
          ASSERT_TRUE(Equal(out, ref)) << isa::DTypeName(dt) << " " << isa::DTypeName(it)
                                       << " axis " << axis << " idx " << ShapeStr(ishape);
        }
      }
    }
  }
}

TEST(ScatterTest, BroadcastSourceAndNegativeAxis) {
  // x[:, idx] = v with v broadcast along the indexed dimension (stride 0).
  Tensor out(TERN_DTYPE_F32, {2, 4}), idx(TERN_DTYPE_I64, {3});
  Tensor src = Tensor::Broadcast(TERN_DTYPE_F32, {2, 3}, {false, true});
  idx.SetAll({-1, 0, 3});
  src.SetAll({7, 7, 7, 9, 9, 9});
  ASSERT_TRUE(Exec(TERN_OP_SCATTER, {&out, &idx, &src}, {-1}).ok());
  EXPECT_TRUE(Equal(out, {7, 0, 0, 7, 9, 0, 0, 9}));
}

TEST(ScatterTest, SameBitsOnAnyThreadCount) {
  std::mt19937_64 rng(32);
  Tensor idx(TERN_DTYPE_I64, {4096}), src(TERN_DTYPE_F32, {4096, 64});
  RandomIndices(idx, 50, rng);
  src.Randomize(rng);
  Tensor a(TERN_DTYPE_F32, {50, 64}), b(TERN_DTYPE_F32, {50, 64});
  const int threads = KernelThreadsForHost();
  SetKernelThreadsForTesting(1);
  ASSERT_TRUE(Exec(TERN_OP_SCATTER, {&a, &idx, &src}, {0}).ok());
  SetKernelThreadsForTesting(std::max(2, threads));
  ASSERT_TRUE(Exec(TERN_OP_SCATTER, {&b, &idx, &src}, {0}).ok());
  SetKernelThreadsForTesting(0);
  std::vector<double> ref(50 * 64, 0.0);
  for (int64_t j = 0; j < 4096; ++j) {
    for (int64_t k = 0; k < 64; ++k) ref[Norm(idx.GetInt(j), 50) * 64 + k] = src.Get(j * 64 + k);
  }
  EXPECT_TRUE(Equal(a, ref));
  EXPECT_TRUE(Equal(b, ref));
}

TEST(ScatterTest, OutOfRangeFailsBeforeWriting) {
  Tensor out(TERN_DTYPE_F32, {4, 2}), idx(TERN_DTYPE_I32, {2, 2}), src(TERN_DTYPE_F32, {2, 2, 2});
  idx.SetAll({0, 1, -5, 2});
  src.SetAll({1, 1, 1, 1, 1, 1, 1, 1});
  Status st = Exec(TERN_OP_SCATTER, {&out, &idx, &src}, {0});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_EQ(st.message(),
            "scatter: index -5 at position [1, 0] is out of range for axis 0 of size 4");
  EXPECT_TRUE(Equal(out, std::vector<double>(8, 0.0)));  // nothing written
}

TEST(ScatterAlongAxisTest, MatchesTorchScatterLastPositionWins) {
  std::mt19937_64 rng(33);
  for (tern_dtype_t dt : kAllDtypes) {
    for (int axis : {0, 1, 2}) {
      const Shape out_shape = {4, 5, 3};
      Shape idx_shape = {3, 4, 2};
      idx_shape[axis] = 8;  // longer than the axis: duplicates in every line
      Tensor out = Tensor::Permuted(dt, out_shape, {1, 2, 0});
      out.Randomize(rng, -50, 50);
      Tensor idx(TERN_DTYPE_I64, idx_shape);
      for (int64_t i = 0; i < idx.count(); ++i) {
        idx.SetInt(i, std::uniform_int_distribution<int64_t>(0, out_shape[axis] - 1)(rng));
      }
      // src as a strided view into a larger buffer (torch.scatter reads only
      // the first indices.shape elements of a larger src).
      Tensor view = Tensor::Strided(dt, idx_shape, {15 * 8, 3 * 8, 1});
      view.Randomize(rng, -50, 50);
      std::vector<double> ref = out.Values();
      for (int64_t s = 0; s < view.count(); ++s) {
        std::vector<int64_t> c = view.Index(s);
        c[axis] = idx.GetInt(s);
        ref[(c[0] * out_shape[1] + c[1]) * out_shape[2] + c[2]] = view.Get(s);
      }
      ASSERT_TRUE(Exec(TERN_OP_SCATTER_ALONG_AXIS, {&out, &idx, &view}, {axis}).ok());
      ASSERT_TRUE(Equal(out, ref)) << isa::DTypeName(dt) << " axis " << axis;
    }
  }
  // Empty indices write nothing.
  Tensor out(TERN_DTYPE_F32, {2, 3}), none(TERN_DTYPE_I64, {2, 0}), src0(TERN_DTYPE_F32, {2, 0});
  out.SetAll({1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(Exec(TERN_OP_SCATTER_ALONG_AXIS, {&out, &none, &src0}, {1}).ok());
  EXPECT_TRUE(Equal(out, {1, 2, 3, 4, 5, 6}));
}

TEST(ScatterAlongAxisTest, OutOfRangeFailsBeforeWriting) {
  Tensor out(TERN_DTYPE_BOOL, {2, 3}), idx(TERN_DTYPE_I64, {2, 2}), src(TERN_DTYPE_BOOL, {2, 2});
  idx.SetAll({0, 1, 2, 3});
  src.SetAll({1, 1, 1, 1});
  Status st = Exec(TERN_OP_SCATTER_ALONG_AXIS, {&out, &idx, &src}, {1});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_EQ(st.message(),
            "scatter_along_axis: index 3 at position [1, 1] is out of range for axis 1 of size 3 "
            "(valid: 0 to 2; negative indices do not count from the end here, as in "
            "torch.scatter)");
  EXPECT_TRUE(Equal(out, std::vector<double>(6, 0.0)));
  // Negative indices are refused too (torch.scatter raises for them).
  idx.SetAll({0, 1, -1, 2});
  st = Exec(TERN_OP_SCATTER_ALONG_AXIS, {&out, &idx, &src}, {1});
  EXPECT_EQ(st.code(), TERN_ERROR_EXECUTION_FAILED);
  EXPECT_NE(st.message().find("index -1 at position [1, 0]"), std::string::npos);
  EXPECT_TRUE(Equal(out, std::vector<double>(6, 0.0)));
}

TEST(ScatterRulesTest, FeatureBitNamesAndOperandRules) {
  Tensor out(TERN_DTYPE_F32, {5, 3}), idx(TERN_DTYPE_I64, {4}), src(TERN_DTYPE_F32, {4, 3});
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_SCATTER, {&out.desc(), 1}, {}), TERN_FEATURE_SCATTER);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_SCATTER_ALONG_AXIS, {&out.desc(), 1}, {}),
            TERN_FEATURE_SCATTER);
  EXPECT_EQ(isa::FeaturesOf(TERN_OP_SCATTER_ADD, {&out.desc(), 1}, {}), 0u);
  EXPECT_EQ(isa::FeatureNames(TERN_FEATURE_SORT | TERN_FEATURE_SCATTER), "sort, scatter");
  EXPECT_STREQ(isa::OpcodeName(TERN_OP_SCATTER), "scatter");
  EXPECT_STREQ(isa::OpcodeName(TERN_OP_SCATTER_ALONG_AXIS), "scatter_along_axis");
  EXPECT_EQ(isa::OpcodeEngine(TERN_OP_SCATTER), TERN_ENGINE_GPSIMD);
  EXPECT_TRUE(isa::OperandIsWritten(TERN_OP_SCATTER, 0));
  EXPECT_FALSE(isa::OperandIsWritten(TERN_OP_SCATTER_ALONG_AXIS, 2));
  EXPECT_TRUE(Validate(TERN_OP_SCATTER, {&out, &idx, &src}, {0}).ok());
  // Bool is allowed (scatter_add refuses it): masks are assigned, not summed.
  Tensor bout(TERN_DTYPE_BOOL, {5, 3}), bsrc(TERN_DTYPE_BOOL, {4, 3});
  EXPECT_TRUE(Validate(TERN_OP_SCATTER, {&bout, &idx, &bsrc}, {0}).ok());
  EXPECT_EQ(Validate(TERN_OP_SCATTER_ADD, {&bout, &idx, &bsrc}, {0}).code(),
            TERN_ERROR_EXECUTABLE_INVALID);
  // Malformed operands and ints, each with a message that names the problem.
  auto message = [](const Status& st) {
    EXPECT_EQ(st.code(), TERN_ERROR_EXECUTABLE_INVALID);
    return st.message();
  };
  Tensor wrong(TERN_DTYPE_F32, {3, 3}), fidx(TERN_DTYPE_F32, {4}), i32src(TERN_DTYPE_I32, {4, 3});
  EXPECT_NE(
      message(Validate(TERN_OP_SCATTER, {&out, &idx, &wrong}, {0})).find("src must be [4, 3]"),
      std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_SCATTER, {&out, &fidx, &src}, {0})).find("i32 or i64"),
            std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_SCATTER, {&out, &idx, &i32src}, {0})).find("dtypes must be"),
            std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_SCATTER, {&out, &idx, &src}, {2})).find("axis 2"),
            std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_SCATTER, {&out, &idx, &src}, {0, 1}))
                .find("takes 1 int (axis), got 2"),
            std::string::npos);
  Tensor aidx(TERN_DTYPE_I64, {6, 3}), asrc(TERN_DTYPE_F32, {6, 3}), wide(TERN_DTYPE_I64, {2, 4}),
      wide_src(TERN_DTYPE_F32, {2, 4}), short_src(TERN_DTYPE_F32, {5, 3});
  EXPECT_TRUE(Validate(TERN_OP_SCATTER_ALONG_AXIS, {&out, &aidx, &asrc}, {0}).ok());
  EXPECT_NE(message(Validate(TERN_OP_SCATTER_ALONG_AXIS, {&out, &wide, &wide_src}, {0}))
                .find("dimension 1 of the indices (4) exceeds out (3)"),
            std::string::npos);
  EXPECT_NE(message(Validate(TERN_OP_SCATTER_ALONG_AXIS, {&out, &aidx, &short_src}, {0}))
                .find("shapes must be equal"),
            std::string::npos);
  // A broadcast (overlapping) output is refused: it is written.
  Tensor bcast = Tensor::Broadcast(TERN_DTYPE_F32, {5, 3}, {false, true});
  EXPECT_NE(message(Validate(TERN_OP_SCATTER, {&bcast, &idx, &src}, {0})).find("overlap"),
            std::string::npos);
}

}  // namespace
}  // namespace tern::testing
