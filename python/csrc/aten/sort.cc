// Native sort and topk (the SORT and TOPK instructions, docs/isa.md).
// torch.sort, Tensor.sort(stable=...), argsort and msort all reach
// sort.values_stable (their functional forms are generated on top of it, or
// are composites calling it); topk's functional form is generated on top of
// topk.values. SORT is always stable, which is a valid result of an unstable
// sort too; NaN orders above every number, as on the CPU. TOPK selects the k
// best along the axis without sorting the whole of it, and returns them
// sorted (a valid result when sorted=False too).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

// values and indices of `opcode` over self along dim; `k` along dim (topk)
// or self's size (sort).
bool SortOrSelect(const char* name, tern_opcode_t opcode, const at::Tensor& self, int64_t dim,
                  int64_t k, bool descending, const at::Tensor& values, const at::Tensor& indices) {
  if (!IsTern(self) || !IsTern(values) || !IsTern(indices) || !Supported(self.scalar_type()) ||
      values.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong) {
    return false;
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> shape = self.sizes().vec();
  if (self.dim() > 0) {
    if (k < 0 || k > shape[dim]) return false;  // ATen's checks raise first
    shape[dim] = k;
  }
  ResizeOut(values, shape);
  ResizeOut(indices, shape);
  if (!OutputOk(values, {self, indices}) || !OutputOk(indices, {self, values})) return false;
  if (values.numel() == 0) return true;
  Program p(name);
  p.Emit(opcode, {p.Out(values), p.Out(indices), p.In(self)}, {dim, descending ? 1 : 0});
  return p.Run();
}

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor&, at::Tensor&> SortStableOut(const at::Tensor& self,
                                                   std::optional<bool> stable, int64_t dim,
                                                   bool descending, at::Tensor& values,
                                                   at::Tensor& indices) {
  const int64_t size = self.dim() == 0 ? 1 : self.size(c10::maybe_wrap_dim(dim, self.dim()));
  if (SortOrSelect("aten::sort.values_stable", TERN_OP_SORT, self, dim, size, descending, values,
                   indices)) {
    return {values, indices};
  }
  return TERN_FALLBACK2(sort, values_stable, self, stable, dim, descending, values, indices);
}
TERN_ATEN_IMPL("sort.values_stable", SortStableOut);

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor&, at::Tensor&> TopkOut(const at::Tensor& self, c10::SymInt k, int64_t dim,
                                             bool largest, bool sorted, at::Tensor& values,
                                             at::Tensor& indices) {
  const int64_t count = k.expect_int();  // a concrete tensor: k is known
  if (SortOrSelect("aten::topk.values", TERN_OP_TOPK, self, dim, count, largest, values, indices)) {
    return {values, indices};
  }
  return TERN_FALLBACK2(topk, values, self, count, dim, largest, sorted, values, indices);
}
TERN_ATEN_IMPL("topk.values", TopkOut);

// ---- searchsorted ------------------------------------------------------------------------

// searchsorted as a count: the CPU's binary search returns, for a sorted row,
// how many boundaries b satisfy !(b >= v) (left) or !(b > v) (right), so the
// result is M minus the count of b >= v (b > v). One comparison of every
// value with every boundary of its row ([..., N, M]) and a sum over M; rows
// that are not sorted give another (equally unspecified) answer than the CPU.
// `values` is a tensor operand of the boundaries' dtype; `vshape` its shape.
bool SearchSorted(const at::Tensor& seq, const Operand& values_in, c10::IntArrayRef vshape,
                  bool out_int32, bool right, const std::optional<at::Tensor>& sorter,
                  const at::Tensor& out, Program& p) {
  const at::ScalarType dtype = seq.scalar_type();
  const bool has_sorter = sorter.has_value() && sorter->defined();
  if (!IsTern(seq) || !Supported(dtype) || dtype == at::kBool || seq.dim() < 1 ||
      out.scalar_type() != (out_int32 ? at::kInt : at::kLong) ||
      (has_sorter && (!IsTern(*sorter) || sorter->scalar_type() != at::kLong ||
                      sorter->sizes() != seq.sizes()))) {
    return false;
  }
  // A 1-D sequence serves every value; else the leading dims must agree.
  if (seq.dim() > 1 &&
      (static_cast<int64_t>(vshape.size()) != seq.dim() ||
       vshape.slice(0, vshape.size() - 1) != seq.sizes().slice(0, seq.dim() - 1))) {
    return false;
  }
  ResizeOut(out, vshape);
  if (!OutputOk(out, {seq})) return false;
  if (out.numel() == 0) return true;
  const int64_t m = seq.size(-1);
  std::vector<int64_t> pairs = vshape.vec();  // [..., N, M]
  pairs.push_back(m);
  const std::vector<int64_t> counted = [&] {
    std::vector<int64_t> v = vshape.vec();
    v.push_back(1);
    return v;
  }();
  Operand boundaries = p.In(seq);
  if (has_sorter) {
    boundaries = p.Temp(*TD(dtype), seq.sizes());
    p.Emit(TERN_OP_TAKE_ALONG_AXIS, {boundaries, p.In(seq), p.In(*sorter)},
           {static_cast<int64_t>(seq.dim()) - 1});
  }
  const Operand b =
      seq.dim() == 1 ? boundaries.Expand(pairs) : boundaries.Unsqueeze(-2).Expand(pairs);
  const Operand v = values_in.Unsqueeze(-1).Expand(pairs);
  const Operand above = p.Temp(TERN_DTYPE_BOOL, pairs), ones = p.Temp(TERN_DTYPE_I64, pairs);
  p.Emit(TERN_OP_BINARY, {above, b, v}, {right ? TERN_BINARY_GT : TERN_BINARY_GE});
  p.Emit(TERN_OP_CAST, {ones, above});
  const Operand count = p.Temp(TERN_DTYPE_I64, counted);
  p.Emit(TERN_OP_REDUCE, {count, ones}, {TERN_REDUCE_SUM, static_cast<int64_t>(vshape.size())});
  const Operand result = p.Temp(TERN_DTYPE_I64, counted);
  p.Emit(TERN_OP_BINARY, {result, p.ConstInt(m, TERN_DTYPE_I64).Expand(counted), count},
         {TERN_BINARY_SUB});
  const Operand o = p.Out(out).Unsqueeze(-1);
  p.Emit(out_int32 ? TERN_OP_CAST : TERN_OP_COPY, {o, result});
  return p.ok() && p.Run();
}

bool Right(bool right, std::optional<c10::string_view> side) {
  return side.has_value() ? *side == "right" : right;
}

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& SearchSortedTensorOut(const at::Tensor& seq, const at::Tensor& self, bool out_int32,
                                  bool right, std::optional<c10::string_view> side,
                                  const std::optional<at::Tensor>& sorter, at::Tensor& out) {
  // A side that contradicts right=True is the CPU's error to raise.
  const bool valid_side = !side.has_value() || *side == "right" || (*side == "left" && !right);
  if (valid_side && IsTern(self) && self.scalar_type() == seq.scalar_type()) {
    Program p("aten::searchsorted.Tensor_out");
    if (SearchSorted(seq, p.In(self), self.sizes(), out_int32, Right(right, side), sorter, out,
                     p)) {
      return out;
    }
  }
  return TERN_FALLBACK2(searchsorted, Tensor_out, seq, self, out_int32, right, side, sorter, out);
}
TERN_ATEN_IMPL("searchsorted.Tensor_out", SearchSortedTensorOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor SearchSortedTensor(const at::Tensor& seq, const at::Tensor& self, bool out_int32,
                              bool right, std::optional<c10::string_view> side,
                              const std::optional<at::Tensor>& sorter) {
  const bool valid_side = !side.has_value() || *side == "right" || (*side == "left" && !right);
  if (valid_side && IsTern(self) && IsTern(seq) && self.scalar_type() == seq.scalar_type()) {
    at::Tensor out = at::empty({0}, seq.options().dtype(out_int32 ? at::kInt : at::kLong));
    Program p("aten::searchsorted.Tensor_out");
    if (SearchSorted(seq, p.In(self), self.sizes(), out_int32, Right(right, side), sorter, out,
                     p)) {
      return out;
    }
  }
  return TERN_FALLBACK2(searchsorted, Tensor, seq, self, out_int32, right, side, sorter);
}
TERN_ATEN_IMPL("searchsorted.Tensor", SearchSortedTensor);

// A scalar value: compared in the boundaries' dtype (the CPU promotes a
// wrapped number to it); the result is 0-dim.
bool SearchSortedScalar(const at::Tensor& seq, const at::Scalar& self, bool out_int32, bool right,
                        std::optional<c10::string_view> side,
                        const std::optional<at::Tensor>& sorter, const at::Tensor& out) {
  const bool valid_side = !side.has_value() || *side == "right" || (*side == "left" && !right);
  if (!valid_side || seq.dim() != 1 || !IsTern(seq) || !at::isFloatingType(seq.scalar_type()) ||
      !Supported(seq.scalar_type()) || self.isComplex()) {
    return false;
  }
  Program p("aten::searchsorted.Scalar_out");
  return SearchSorted(seq, ScalarArg(p, self, seq.scalar_type()), {}, out_int32, Right(right, side),
                      sorter, out, p);
}

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& SearchSortedScalarOut(const at::Tensor& seq, const at::Scalar& self, bool out_int32,
                                  bool right, std::optional<c10::string_view> side,
                                  const std::optional<at::Tensor>& sorter, at::Tensor& out) {
  if (SearchSortedScalar(seq, self, out_int32, right, side, sorter, out)) return out;
  return TERN_FALLBACK2(searchsorted, Scalar_out, seq, self, out_int32, right, side, sorter, out);
}
TERN_ATEN_IMPL("searchsorted.Scalar_out", SearchSortedScalarOut);

// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor SearchSortedScalarFn(const at::Tensor& seq, const at::Scalar& self, bool out_int32,
                                bool right, std::optional<c10::string_view> side,
                                const std::optional<at::Tensor>& sorter) {
  if (IsTern(seq)) {
    at::Tensor out = at::empty({0}, seq.options().dtype(out_int32 ? at::kInt : at::kLong));
    if (SearchSortedScalar(seq, self, out_int32, right, side, sorter, out)) return out;
  }
  return TERN_FALLBACK2(searchsorted, Scalar, seq, self, out_int32, right, side, sorter);
}
TERN_ATEN_IMPL("searchsorted.Scalar", SearchSortedScalarFn);

// ---- unique, unique_consecutive (flattened) ----------------------------------------------

// torch.unique (always sorted, as the CPU's, whatever `sorted` says) and
// unique_consecutive without a dim, in two programs around the one value the
// output size needs. The first sorts the flattened input (a stable SORT,
// which also gives each sorted element's position; unique_consecutive keeps
// the input's order), marks where a run of equal elements starts (NaN != NaN:
// every NaN is its own value, as on the CPU) and numbers the runs (an
// inclusive SCAN of the marks, minus 1). The run count, the last number + 1,
// is read back to size the outputs, as CUDA's unique does. The second
// scatters each element to its run: the values, the inverse (each input
// position's run) and the counts (a scatter-add of ones).
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> UniqueFlat(
    const char* name, const at::Tensor& self, bool sort, bool return_inverse, bool return_counts) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !Supported(dtype) || dtype == at::kBool) return std::nullopt;
  const int64_t n = self.numel();
  const auto long_options = self.options().dtype(at::kLong);
  at::Tensor inverse = at::empty(return_inverse ? self.sizes() : at::IntArrayRef{0}, long_options);
  if (n == 0) {
    return std::make_tuple(at::empty({0}, self.options()), inverse, at::empty({0}, long_options));
  }
  const tern_dtype_t d = *TD(dtype);
  at::Tensor ordered = at::empty({n}, self.options()), order = at::empty({n}, long_options);
  at::Tensor run = at::empty({n}, long_options);
  {
    Program p(name);
    Operand x = p.In(self);
    if (!x.IsContiguous()) {
      const Operand tmp = p.Temp(d, self.sizes());
      p.Emit(TERN_OP_COPY, {tmp, x});
      x = tmp;
    }
    x = x.View({n});
    const Operand S = p.Out(ordered), R = p.Out(run);
    if (sort) {
      p.Emit(TERN_OP_SORT, {S, p.Out(order), x}, {0, 0});
    } else {
      p.Emit(TERN_OP_COPY, {S, x});
    }
    const Operand starts = p.Temp(TERN_DTYPE_BOOL, {n});
    p.Emit(TERN_OP_FILL, {starts.Slice(0, 0, 1)}, {1});
    if (n > 1) {
      p.Emit(TERN_OP_BINARY,
             {starts.Slice(0, 1, n - 1), S.Slice(0, 1, n - 1), S.Slice(0, 0, n - 1)},
             {TERN_BINARY_NE});
    }
    p.Emit(TERN_OP_SCAN, {R, starts}, {TERN_SCAN_SUM, 0});
    p.Emit(TERN_OP_BINARY, {R, R, p.ConstInt(1, TERN_DTYPE_I64).Expand({n})}, {TERN_BINARY_SUB});
    if (!p.ok() || !p.Run()) return std::nullopt;
  }
  const int64_t k = run[n - 1].item<int64_t>() + 1;  // waits for the first program
  at::Tensor values = at::empty({k}, self.options());
  at::Tensor counts = at::empty({return_counts ? k : 0}, long_options);
  Program p(name);
  const Operand R = p.In(run);
  p.Emit(TERN_OP_SCATTER_ALONG_AXIS, {p.Out(values), R, p.In(ordered)}, {0});
  if (return_inverse) {
    const Operand inv = p.Out(inverse).View({n});
    if (sort) {
      p.Emit(TERN_OP_SCATTER_ALONG_AXIS, {inv, p.In(order), R}, {0});
    } else {
      p.Emit(TERN_OP_COPY, {inv, R});
    }
  }
  if (return_counts) {
    const Operand C = p.Out(counts), ones = p.Temp(TERN_DTYPE_I64, {n});
    p.Emit(TERN_OP_FILL, {C}, {0});
    p.Emit(TERN_OP_FILL, {ones}, {1});
    p.Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS, {C, R, ones}, {0});
  }
  if (!p.ok() || !p.Run()) return std::nullopt;
  return std::make_tuple(values, inverse, counts);
}

constexpr int64_t kMaxUniqueRowLength = 128;  // one SORT per element of a slice

// unique_dim and unique_dim_consecutive: the same with the slices along
// `dim` (rows of L elements) for elements. The rows are ordered
// lexicographically by L stable sorts, last column first (a least-significant
// first radix sort of the row order), runs start where a row differs from the
// one before in any element (NaN != NaN, as the CPU's at::equal), and the
// unique rows are scattered to their runs. The CPU returns the inverse and
// the counts whether they were asked for or not; so does this.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> UniqueRows(const char* name,
                                                                         const at::Tensor& self,
                                                                         int64_t dim, bool sort) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !Supported(dtype) || dtype == at::kBool || self.dim() == 0) {
    return std::nullopt;
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const int64_t r = self.size(dim);
  const auto long_options = self.options().dtype(at::kLong);
  if (r == 0) {
    return std::make_tuple(at::empty(self.sizes(), self.options()), at::empty({0}, long_options),
                           at::empty({0}, long_options));
  }
  const int64_t l = self.numel() / r;
  if (l == 0 || l > kMaxUniqueRowLength) return std::nullopt;  // l == 0: the CPU's error
  const tern_dtype_t d = *TD(dtype);
  // The dims with `dim` first: rows are the slices along it.
  std::vector<int64_t> dims = {dim};
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i != dim) dims.push_back(i);
  }
  at::Tensor ordered = at::empty({r, l}, self.options()), order = at::empty({r}, long_options);
  at::Tensor run = at::empty({r}, long_options);
  {
    Program p(name);
    const Operand moved = p.In(self).Permute(dims);
    const Operand rows = p.Temp(d, moved.shape);
    p.Emit(TERN_OP_COPY, {rows, moved});
    const Operand T = rows.View({r, l}), S = p.Out(ordered), R = p.Out(run);
    if (sort) {
      const Operand P = p.Out(order);
      const Operand key = p.Temp(d, {r}), sorted_key = p.Temp(d, {r});
      const Operand step = p.Temp(TERN_DTYPE_I64, {r}), next = p.Temp(TERN_DTYPE_I64, {r});
      p.Emit(TERN_OP_IOTA, {P}, {0}, {0.0, 1.0});
      for (int64_t c = l - 1; c >= 0; --c) {
        // key[i] = T[P[i], c]; a stable sort of the keys refines the order.
        p.Emit(TERN_OP_GATHER, {key, T.Select(1, c), P}, {0});
        p.Emit(TERN_OP_SORT, {sorted_key, step, key}, {0, 0});
        p.Emit(TERN_OP_GATHER, {next, P, step}, {0});
        p.Emit(TERN_OP_COPY, {P, next});
      }
      p.Emit(TERN_OP_GATHER, {S, T, P}, {0});
    } else {
      p.Emit(TERN_OP_COPY, {S, T});
    }
    const Operand starts = p.Temp(TERN_DTYPE_BOOL, {r});
    p.Emit(TERN_OP_FILL, {starts.Slice(0, 0, 1)}, {1});
    if (r > 1) {
      const Operand differs = p.Temp(TERN_DTYPE_BOOL, {r - 1, l});
      p.Emit(TERN_OP_BINARY, {differs, S.Slice(0, 1, r - 1), S.Slice(0, 0, r - 1)},
             {TERN_BINARY_NE});
      p.Emit(TERN_OP_REDUCE, {starts.Slice(0, 1, r - 1).Unsqueeze(1), differs},
             {TERN_REDUCE_ANY, 1});
    }
    p.Emit(TERN_OP_SCAN, {R, starts}, {TERN_SCAN_SUM, 0});
    p.Emit(TERN_OP_BINARY, {R, R, p.ConstInt(1, TERN_DTYPE_I64).Expand({r})}, {TERN_BINARY_SUB});
    if (!p.ok() || !p.Run()) return std::nullopt;
  }
  const int64_t k = run[r - 1].item<int64_t>() + 1;  // waits for the first program
  std::vector<int64_t> shape = self.sizes().vec();
  shape[dim] = k;
  at::Tensor values = at::empty(shape, self.options());
  at::Tensor inverse = at::empty({r}, long_options), counts = at::empty({k}, long_options);
  Program p(name);
  const Operand R = p.In(run);
  const Operand V = p.Out(values).Permute(dims);
  const Operand unique_rows = p.Temp(d, V.shape);
  p.Emit(TERN_OP_SCATTER, {unique_rows.View({k, l}), R, p.In(ordered)}, {0});
  p.Emit(TERN_OP_COPY, {V, unique_rows});
  if (sort) {
    p.Emit(TERN_OP_SCATTER_ALONG_AXIS, {p.Out(inverse), p.In(order), R}, {0});
  } else {
    p.Emit(TERN_OP_COPY, {p.Out(inverse), R});
  }
  const Operand C = p.Out(counts), ones = p.Temp(TERN_DTYPE_I64, {r});
  p.Emit(TERN_OP_FILL, {C}, {0});
  p.Emit(TERN_OP_FILL, {ones}, {1});
  p.Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS, {C, R, ones}, {0});
  if (!p.ok() || !p.Run()) return std::nullopt;
  return std::make_tuple(values, inverse, counts);
}

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor, at::Tensor, at::Tensor> UniqueDim(const at::Tensor& self, int64_t dim,
                                                         bool sorted, bool return_inverse,
                                                         bool return_counts) {
  if (auto r = UniqueRows("aten::unique_dim", self, dim, true)) return *r;
  return TERN_FALLBACK(unique_dim, self, dim, sorted, return_inverse, return_counts);
}
TERN_ATEN_IMPL("unique_dim", UniqueDim);

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor, at::Tensor, at::Tensor> UniqueDimConsecutive(const at::Tensor& self,
                                                                    int64_t dim,
                                                                    bool return_inverse,
                                                                    bool return_counts) {
  if (auto r = UniqueRows("aten::unique_dim_consecutive", self, dim, false)) return *r;
  return TERN_FALLBACK(unique_dim_consecutive, self, dim, return_inverse, return_counts);
}
TERN_ATEN_IMPL("unique_dim_consecutive", UniqueDimConsecutive);

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor, at::Tensor, at::Tensor> Unique2(const at::Tensor& self, bool sorted,
                                                       bool return_inverse, bool return_counts) {
  if (auto r = UniqueFlat("aten::_unique2", self, true, return_inverse, return_counts)) {
    return *r;
  }
  return TERN_FALLBACK(_unique2, self, sorted, return_inverse, return_counts);
}
TERN_ATEN_IMPL("_unique2", Unique2);

// Thread-safety: any thread (the current stream's queue orders the work).
std::tuple<at::Tensor, at::Tensor, at::Tensor> UniqueConsecutive(const at::Tensor& self,
                                                                 bool return_inverse,
                                                                 bool return_counts,
                                                                 std::optional<int64_t> dim) {
  // The CPU's rule: a dim other than 0 of a 1-D tensor takes the rows' path.
  if (!dim.has_value() || (*dim == 0 && self.dim() == 1)) {
    if (auto r =
            UniqueFlat("aten::unique_consecutive", self, false, return_inverse, return_counts)) {
      return *r;
    }
  } else if (auto r = UniqueRows("aten::unique_consecutive", self, *dim, false)) {
    return *r;
  }
  return TERN_FALLBACK(unique_consecutive, self, return_inverse, return_counts, dim);
}
TERN_ATEN_IMPL("unique_consecutive", UniqueConsecutive);

}  // namespace
}  // namespace torch_tern::native
