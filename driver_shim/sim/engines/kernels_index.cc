// Index kernels: gather, scatter-add and their along-axis forms. Every index
// is checked before anything is written, so a bad index leaves the output
// untouched. Scatter-adds are deterministic: each output element receives its
// contributions in index order, and threads split only the dimensions that
// are not indexed. bf16/f16 outputs accumulate in f32 and round once.
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "driver_shim/sim/engines/kernels_internal.h"
#include "driver_shim/sim/engines/numerics.h"

namespace tern::sim::kernels {

// Loads an index tensor in row-major order.
std::vector<int64_t> LoadIndices(const TensorView& v) {
  const isa::OperandDesc& d = *v.desc;
  std::vector<int64_t> out(d.element_count());
  const Layout l = MakeLayout(d.rank, d.shape.data(), {d.strides.data()});
  if (l.count == 0) return out;
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(d.dtype));
  int64_t* p = out.data();
  ForEachRun(l, 0, l.count, [&](const int64_t* off, int64_t n) {
    LoadI64(d.dtype, v.data + off[0] * esize, l.strides[0][l.rank - 1], n, p);
    p += n;
  });
  return out;
}

namespace {

std::string PositionOf(const isa::OperandDesc& d, int64_t pos) {
  int64_t index[TERN_MAX_RANK] = {};
  for (int k = static_cast<int>(d.rank) - 1; k >= 0; --k) {
    index[k] = pos % d.shape[k];
    pos /= d.shape[k];
  }
  return IndexString(index, d.rank);
}

}  // namespace

Status NormalizeIndices(const char* op, const isa::OperandDesc& idx, std::vector<int64_t>* values,
                        int64_t axis, int64_t size) {
  for (size_t i = 0; i < values->size(); ++i) {
    int64_t v = (*values)[i];
    if (v < -size || v >= size) {
      return MakeStatus(TERN_ERROR_EXECUTION_FAILED,
                        "{}: index {} at position {} is out of range for axis {} of size {}", op, v,
                        PositionOf(idx, static_cast<int64_t>(i)), axis, size);
    }
    if (v < 0) (*values)[i] = v + size;
  }
  return OkStatus();
}

namespace {

// An output that scatter-adds accumulate into: the output itself (f32 and
// integers) or an f32 shadow of it (bf16, f16) written back at the end.
struct Accumulator {
  TensorView view;
  isa::OperandDesc desc;
  std::vector<float> shadow;

  explicit Accumulator(const TensorView& out) : view(out), desc(*out.desc) {
    if (desc.dtype == TERN_DTYPE_BF16 || desc.dtype == TERN_DTYPE_F16) {
      shadow.resize(desc.element_count());
      GatherF32(out, shadow.data());
      desc.dtype = TERN_DTYPE_F32;
      isa::SetContiguousStrides(&desc);
      view.data = reinterpret_cast<uint8_t*>(shadow.data());
    }
    view.desc = &desc;
  }
  void Finish(const TensorView& out) {
    if (!shadow.empty()) ScatterF32(out, shadow.data());
  }
};

// dst[i * ds] += src[i * ss] in the accumulator's dtype (f32 or integers,
// wrapping); src is converted from its dtype.
template <typename T>
TERN_INLINE void AddRunTyped(uint8_t* dst, int64_t ds, const T* src, int64_t n) {
  T* d = reinterpret_cast<T*>(dst);
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < n; ++i) d[i * ds] += src[i];
  } else {
    for (int64_t i = 0; i < n; ++i) {
      d[i * ds] = static_cast<T>(static_cast<uint64_t>(d[i * ds]) + static_cast<uint64_t>(src[i]));
    }
  }
}

// Adds n elements of `src` (dtype sdt, stride ss) into `dst` (dtype ddt,
// stride ds).
void AddRun(tern_dtype_t ddt, uint8_t* dst, int64_t ds, tern_dtype_t sdt, const uint8_t* src,
            int64_t ss, int64_t n) {
  constexpr int64_t kChunk = 512;
  const int64_t dsz = static_cast<int64_t>(isa::DTypeSize(ddt)),
                ssz = static_cast<int64_t>(isa::DTypeSize(sdt));
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t m = std::min(kChunk, n - done);
    uint8_t* d = dst + done * ds * dsz;
    const uint8_t* s = src + done * ss * ssz;
    if (ddt == TERN_DTYPE_F32) {
      float buf[kChunk];
      LoadF32(sdt, s, ss, m, buf);
      AddRunTyped<float>(d, ds, buf, m);
    } else {
      int64_t buf[kChunk];
      LoadI64(sdt, s, ss, m, buf);
      switch (ddt) {
        case TERN_DTYPE_I8: {
          int8_t tmp[kChunk];
          for (int64_t i = 0; i < m; ++i) tmp[i] = static_cast<int8_t>(buf[i]);
          AddRunTyped<int8_t>(d, ds, tmp, m);
          break;
        }
        case TERN_DTYPE_I32: {
          int32_t tmp[kChunk];
          for (int64_t i = 0; i < m; ++i) tmp[i] = static_cast<int32_t>(buf[i]);
          AddRunTyped<int32_t>(d, ds, tmp, m);
          break;
        }
        default:
          AddRunTyped<int64_t>(d, ds, buf, m);
          break;
      }
    }
  }
}

}  // namespace

Status RunGather(const driver::Instruction& ins, Operands ops) {
  // [out, table, indices]; out = table[:axis] + idx.shape + table[axis+1:]
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& t = *ops[1].desc;
  const isa::OperandDesc& idx = *ops[2].desc;
  const int64_t axis = NormAxis(ins.ints[0], t.rank);
  std::vector<int64_t> indices = LoadIndices(ops[2]);
  TERN_RETURN_IF_ERROR(NormalizeIndices("gather", idx, &indices, axis, t.shape[axis]));
  if (out.element_count() == 0) return OkStatus();
  const uint32_t outer_rank = static_cast<uint32_t>(axis);
  int64_t outer = 1;
  for (uint32_t d = 0; d < outer_rank; ++d) outer *= t.shape[d];
  const int64_t nidx = static_cast<int64_t>(indices.size());
  // Inner dims: table[axis+1:], matching out's last dims.
  const uint32_t inner_rank = t.rank - 1 - outer_rank;
  const int64_t* inner_shape = t.shape.data() + axis + 1;
  const Layout inner =
      MakeLayout(inner_rank, inner_shape,
                 {out.strides.data() + outer_rank + idx.rank, t.strides.data() + axis + 1});
  const size_t esize = isa::DTypeSize(t.dtype);
  const int64_t last = inner.rank - 1;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, inner.count));
  ParallelFor(outer * nidx, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / nidx, j = item % nidx;
      int64_t out_off = 0, t_off = 0, out_j = 0;
      OffsetsOf(o, outer_rank, t.shape.data(),
                {{out.strides.data(), &out_off}, {t.strides.data(), &t_off}});
      OffsetsOf(j, idx.rank, idx.shape.data(), {{out.strides.data() + outer_rank, &out_j}});
      out_off += out_j;
      t_off += indices[j] * t.strides[axis];
      ForEachRun(inner, 0, inner.count, [&](const int64_t* off, int64_t n) {
        CopyStrided(esize, At(ops[0], out_off + off[0]), inner.strides[0][last],
                    At(ops[1], t_off + off[1]), inner.strides[1][last], n);
      });
    }
  });
  return OkStatus();
}

Status RunScatterAdd(const driver::Instruction& ins, Operands ops) {
  // [out, indices, src]; src = out[:axis] + idx.shape + out[axis+1:]
  const isa::OperandDesc& idx = *ops[1].desc;
  const isa::OperandDesc& src = *ops[2].desc;
  const int64_t axis = NormAxis(ins.ints[0], ops[0].desc->rank);
  std::vector<int64_t> indices = LoadIndices(ops[1]);
  TERN_RETURN_IF_ERROR(
      NormalizeIndices("scatter_add", idx, &indices, axis, ops[0].desc->shape[axis]));
  if (src.element_count() == 0) return OkStatus();
  Accumulator acc(ops[0]);
  const isa::OperandDesc& out = acc.desc;
  const uint32_t outer_rank = static_cast<uint32_t>(axis);
  int64_t outer = 1;
  for (uint32_t d = 0; d < outer_rank; ++d) outer *= out.shape[d];
  const int64_t nidx = static_cast<int64_t>(indices.size());
  const uint32_t inner_rank = out.rank - 1 - outer_rank;
  const Layout inner =
      MakeLayout(inner_rank, out.shape.data() + axis + 1,
                 {out.strides.data() + axis + 1, src.strides.data() + outer_rank + idx.rank});
  const int64_t last = inner.rank - 1;
  // Work items: (outer position, tile of the inner elements); each walks all
  // indices in order, so every output element sums in index order.
  constexpr int64_t kTile = 4096;
  const int64_t tiles = (inner.count + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(
      1, kParallelGrain / std::max<int64_t>(1, std::min(inner.count, kTile) * nidx));
  ParallelFor(outer * tiles, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / tiles, tile = item % tiles;
      int64_t out_off = 0, src_off = 0;
      OffsetsOf(o, outer_rank, out.shape.data(),
                {{out.strides.data(), &out_off}, {src.strides.data(), &src_off}});
      for (int64_t j = 0; j < nidx; ++j) {
        int64_t src_j = 0;
        OffsetsOf(j, idx.rank, idx.shape.data(), {{src.strides.data() + outer_rank, &src_j}});
        const int64_t d0 = out_off + indices[j] * out.strides[axis], s0 = src_off + src_j;
        ForEachRun(inner, tile * kTile, std::min(inner.count, (tile + 1) * kTile),
                   [&](const int64_t* off, int64_t n) {
                     AddRun(out.dtype, At(acc.view, d0 + off[0]), inner.strides[0][last], src.dtype,
                            At(ops[2], s0 + off[1]), inner.strides[1][last], n);
                   });
      }
    }
  });
  acc.Finish(ops[0]);
  return OkStatus();
}

Status RunTakeAlongAxis(const driver::Instruction& ins, Operands ops) {
  // [out, in, indices]: out[p] = in[p with p[axis] = indices[p]]
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& in = *ops[1].desc;
  const isa::OperandDesc& idx = *ops[2].desc;
  const int64_t axis = NormAxis(ins.ints[0], in.rank);
  std::vector<int64_t> indices = LoadIndices(ops[2]);
  TERN_RETURN_IF_ERROR(NormalizeIndices("take_along_axis", idx, &indices, axis, in.shape[axis]));
  if (out.element_count() == 0) return OkStatus();
  isa::OperandDesc in_view = in;
  in_view.strides[axis] = 0;  // the index supplies the axis coordinate
  const Layout l =
      MakeLayout(out.rank, out.shape.data(), {out.strides.data(), in_view.strides.data()});
  const size_t esize = isa::DTypeSize(out.dtype);
  const int64_t last = l.rank - 1;
  const int64_t axis_stride = in.strides[axis];
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    int64_t pos = begin;
    ForEachRun(l, begin, end, [&](const int64_t* off, int64_t n) {
      for (int64_t i = 0; i < n; ++i, ++pos) {
        const uint8_t* s = At(ops[1], off[1] + i * l.strides[1][last] + indices[pos] * axis_stride);
        std::memcpy(At(ops[0], off[0] + i * l.strides[0][last]), s, esize);
      }
    });
  });
  return OkStatus();
}

Status RunScatterAddAlongAxis(const driver::Instruction& ins, Operands ops) {
  // [out, indices, src]: out[p with p[axis] = indices[p]] += src[p]
  const isa::OperandDesc& idx = *ops[1].desc;
  const isa::OperandDesc& src = *ops[2].desc;
  const int64_t axis = NormAxis(ins.ints[0], ops[0].desc->rank);
  std::vector<int64_t> indices = LoadIndices(ops[1]);
  TERN_RETURN_IF_ERROR(
      NormalizeIndices("scatter_add_along_axis", idx, &indices, axis, ops[0].desc->shape[axis]));
  if (idx.element_count() == 0) return OkStatus();
  Accumulator acc(ops[0]);
  const isa::OperandDesc& out = acc.desc;
  // Rows: every position of the non-axis dimensions of the indices; each row
  // walks the axis in order and writes only its own output elements.
  uint32_t rrank = 0;
  int64_t rshape[TERN_MAX_RANK], rout[TERN_MAX_RANK], rsrc[TERN_MAX_RANK], ridx[TERN_MAX_RANK];
  int64_t rows = 1;
  for (uint32_t d = 0; d < idx.rank; ++d) {
    if (d == axis) continue;
    rshape[rrank] = idx.shape[d];
    rout[rrank] = out.strides[d];
    rsrc[rrank] = src.strides[d];
    ridx[rrank++] = 1;  // placeholder, logical index computed below
    rows *= idx.shape[d];
  }
  const int64_t len = idx.shape[axis];
  // Logical strides of the indices (row-major over idx's shape).
  int64_t logical[TERN_MAX_RANK];
  {
    int64_t s = 1;
    for (int d = static_cast<int>(idx.rank) - 1; d >= 0; --d) {
      logical[d] = s;
      s *= idx.shape[d];
    }
    uint32_t r = 0;
    for (uint32_t d = 0; d < idx.rank; ++d) {
      if (d != axis) ridx[r++] = logical[d];
    }
  }
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, len));
  ParallelFor(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t out_off = 0, src_off = 0, idx_off = 0;
      OffsetsOf(r, rrank, rshape, {{rout, &out_off}, {rsrc, &src_off}, {ridx, &idx_off}});
      for (int64_t j = 0; j < len; ++j) {
        const int64_t k = indices[idx_off + j * logical[axis]];
        AddRun(out.dtype, At(acc.view, out_off + k * out.strides[axis]), 1, src.dtype,
               At(ops[2], src_off + j * src.strides[axis]), 1, 1);
      }
    }
  });
  acc.Finish(ops[0]);
  return OkStatus();
}

}  // namespace tern::sim::kernels
