// The overwriting scatters: SCATTER (the adjoint of GATHER, index_put
// without accumulate; negative indices count from the end) and
// SCATTER_ALONG_AXIS (torch.scatter; indices in [0, size) only, as
// torch.scatter). Every index is checked before anything is written, so a bad index leaves the
// output untouched. Where several indices name one output element, the last write in index order
// wins (row-major over the indices for SCATTER, the last position along the axis for
// SCATTER_ALONG_AXIS), as a serial CPU loop gives; results never depend on the thread count:
// SCATTER writes only the winning index of each group (so threads never write one element twice)
// and SCATTER_ALONG_AXIS splits the lines, never a line.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "driver_shim/sim/engines/kernels_internal.h"

namespace tern::sim::kernels {
namespace {

// The positions j of `indices` whose value no later position repeats, in
// increasing order: the writes that survive "last write wins".
std::vector<int64_t> LastOfEachIndex(const std::vector<int64_t>& indices) {
  std::vector<std::pair<int64_t, int64_t>> by_value(indices.size());
  for (size_t j = 0; j < indices.size(); ++j) by_value[j] = {indices[j], static_cast<int64_t>(j)};
  std::sort(by_value.begin(), by_value.end());
  std::vector<int64_t> winners;
  winners.reserve(by_value.size());
  for (size_t i = 0; i < by_value.size(); ++i) {
    if (i + 1 == by_value.size() || by_value[i + 1].first != by_value[i].first) {
      winners.push_back(by_value[i].second);
    }
  }
  std::sort(winners.begin(), winners.end());
  return winners;
}

}  // namespace

Status RunScatter(const driver::Instruction& ins, Operands ops) {
  // [out, indices, src]; src = out[:axis] + idx.shape + out[axis+1:]
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& idx = *ops[1].desc;
  const isa::OperandDesc& src = *ops[2].desc;
  const int64_t axis = NormAxis(ins.ints[0], out.rank);
  std::vector<int64_t> indices = LoadIndices(ops[1]);
  TERN_RETURN_IF_ERROR(NormalizeIndices("scatter", idx, &indices, axis, out.shape[axis]));
  if (src.element_count() == 0) return OkStatus();
  const std::vector<int64_t> winners = LastOfEachIndex(indices);
  const uint32_t outer_rank = static_cast<uint32_t>(axis);
  int64_t outer = 1;
  for (uint32_t d = 0; d < outer_rank; ++d) outer *= out.shape[d];
  const int64_t count = static_cast<int64_t>(winners.size());
  const uint32_t inner_rank = out.rank - 1 - outer_rank;
  const Layout inner =
      MakeLayout(inner_rank, out.shape.data() + axis + 1,
                 {out.strides.data() + axis + 1, src.strides.data() + outer_rank + idx.rank});
  const size_t esize = isa::DTypeSize(out.dtype);
  const int64_t last = inner.rank - 1;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, inner.count));
  // Work items (outer position, winning index): distinct output elements.
  ParallelFor(outer * count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / count, j = winners[item % count];
      int64_t out_off = 0, src_off = 0, src_j = 0;
      OffsetsOf(o, outer_rank, out.shape.data(),
                {{out.strides.data(), &out_off}, {src.strides.data(), &src_off}});
      OffsetsOf(j, idx.rank, idx.shape.data(), {{src.strides.data() + outer_rank, &src_j}});
      out_off += indices[j] * out.strides[axis];
      src_off += src_j;
      ForEachRun(inner, 0, inner.count, [&](const int64_t* off, int64_t n) {
        CopyStrided(esize, At(ops[0], out_off + off[0]), inner.strides[0][last],
                    At(ops[2], src_off + off[1]), inner.strides[1][last], n);
      });
    }
  });
  return OkStatus();
}

Status RunScatterAlongAxis(const driver::Instruction& ins, Operands ops) {
  // [out, indices, src]: out[p with p[axis] = indices[p]] = src[p]
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& idx = *ops[1].desc;
  const isa::OperandDesc& src = *ops[2].desc;
  const int64_t axis = NormAxis(ins.ints[0], out.rank);
  const std::vector<int64_t> indices = LoadIndices(ops[1]);
  // torch.scatter's rule: [0, size), no counting from the end.
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= out.shape[axis]) {
      int64_t at[TERN_MAX_RANK] = {};
      int64_t rest = static_cast<int64_t>(i);
      for (int d = static_cast<int>(idx.rank) - 1; d >= 0; --d) {
        at[d] = rest % idx.shape[d];
        rest /= idx.shape[d];
      }
      return MakeStatus(TERN_ERROR_EXECUTION_FAILED,
                        "scatter_along_axis: index {} at position {} is out of range for axis {} "
                        "of size {} (valid: 0 to {}; negative indices do not count from the end "
                        "here, as in torch.scatter)",
                        indices[i], IndexString(at, idx.rank), axis, out.shape[axis],
                        out.shape[axis] - 1);
    }
  }
  if (idx.element_count() == 0) return OkStatus();
  // Rows: every position of the indices' other dimensions. A row writes only
  // out's line at the same position and walks the axis in order, so the
  // last position wins.
  uint32_t rrank = 0;
  int64_t rshape[TERN_MAX_RANK], rout[TERN_MAX_RANK], rsrc[TERN_MAX_RANK], ridx[TERN_MAX_RANK];
  int64_t logical[TERN_MAX_RANK];  // row-major strides of the loaded indices
  int64_t step = 1;
  for (int d = static_cast<int>(idx.rank) - 1; d >= 0; --d) {
    logical[d] = step;
    step *= idx.shape[d];
  }
  int64_t rows = 1;
  for (uint32_t d = 0; d < idx.rank; ++d) {
    if (d == axis) continue;
    rshape[rrank] = idx.shape[d];
    rout[rrank] = out.strides[d];
    rsrc[rrank] = src.strides[d];
    ridx[rrank++] = logical[d];
    rows *= idx.shape[d];
  }
  const int64_t len = idx.shape[axis];
  const size_t esize = isa::DTypeSize(out.dtype);
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, len));
  ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t out_off = 0, src_off = 0, idx_off = 0;
      OffsetsOf(r, rrank, rshape, {{rout, &out_off}, {rsrc, &src_off}, {ridx, &idx_off}});
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = indices[idx_off + j * logical[axis]];
        std::memcpy(At(ops[0], out_off + k * out.strides[axis]),
                    At(ops[2], src_off + j * src.strides[axis]), esize);
      }
    }
  });
  return OkStatus();
}

}  // namespace tern::sim::kernels
