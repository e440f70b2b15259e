// Native indexing and assembly operators: index_select, gather, scatter_add,
// scatter (a value or a src tensor), index_add, index_put_ with one index
// tensor (integer or boolean mask, assigning or accumulating), single-tensor
// advanced indexing, embedding's backward, cat,
// tril/triu, arange, and the negative log-likelihood loss forward and
// backward (cross_entropy = log_softmax + nll_loss).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

bool IndexDtype(const at::Tensor& t) {
  return IsTern(t) && (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt);
}

bool IndexSelect(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                 const at::Tensor& out) {
  if (!IsTern(self) || self.dim() == 0 || !IndexDtype(index) || index.dim() > 1 ||
      out.scalar_type() != self.scalar_type()) {
    return false;
  }
  dim = c10::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> shape = self.sizes().vec();
  shape[dim] = index.numel();
  ResizeOut(out, shape);
  if (!OutputOk(out, {self, index})) return false;
  Program p("aten::index_select");
  Operand idx = p.In(index);
  if (index.dim() == 0) idx = idx.Unsqueeze(0);
  p.Emit(TERN_OP_GATHER, {p.Out(out), p.In(self), idx}, {dim});
  return p.Run();
}

at::Tensor& IndexSelectOut(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                           at::Tensor& out) {
  if (IndexSelect(self, dim, index, out)) return out;
  return TERN_FALLBACK(index_select_out, self, dim, index, out);
}
TERN_ATEN_IMPL("index_select.out", IndexSelectOut);

at::Tensor IndexSelectFn(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  if (IsTern(self)) {
    at::Tensor out = at::empty({0}, self.options());
    if (IndexSelect(self, dim, index, out)) return out;
  }
  return TERN_FALLBACK(index_select, self, dim, index);
}
TERN_ATEN_IMPL("index_select", IndexSelectFn);

// Whether exactly one of `indices` is a tensor (the others None); it and its
// position go to *index and *axis.
bool OneIndexTensor(const c10::List<std::optional<at::Tensor>>& indices, int64_t* axis,
                    at::Tensor* index) {
  int64_t defined = 0;
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::optional<at::Tensor> t = indices.get(i);
    if (t.has_value() && t->defined()) {
      *axis = static_cast<int64_t>(i);
      *index = *t;
      ++defined;
    }
  }
  return defined == 1;
}

// The shape x[..., index, ...] has: self's dims before `axis`, the index's
// dims, then self's dims after `axis + consumed` (a k-dim mask consumes k).
std::vector<int64_t> IndexedShape(const at::Tensor& self, int64_t axis, c10::IntArrayRef index,
                                  int64_t consumed) {
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().begin() + axis);
  shape.insert(shape.end(), index.begin(), index.end());
  shape.insert(shape.end(), self.sizes().begin() + axis + consumed, self.sizes().end());
  return shape;
}

// Whether `indices` holds k >= 2 integer tern index tensors at adjacent
// positions [*first, *first + k) (None elsewhere); they go to *adjacent.
bool AdjacentIndexTensors(const c10::List<std::optional<at::Tensor>>& indices, int64_t* first,
                          std::vector<at::Tensor>* adjacent) {
  *first = -1;
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::optional<at::Tensor> t = indices.get(i);
    if (!t.has_value() || !t->defined()) continue;
    if (*first < 0) *first = static_cast<int64_t>(i);
    if (static_cast<int64_t>(i) != *first + static_cast<int64_t>(adjacent->size()) ||
        !IndexDtype(*t)) {
      return false;
    }
    adjacent->push_back(*t);
  }
  return adjacent->size() >= 2;
}

// x[i, j] (x[..., i, j, ...]) with several adjacent integer index tensors:
// one GATHER along the indexed dims merged into one, at the linear index
// sum(i_d * stride_d) of the broadcast indices. Each index is first checked
// against its own dim by a GATHER from a zero-stride table of that size (so
// an out-of-range index fails with its own value, before anything is
// written) and counted from the end when negative.
bool IndexSeveral(const at::Tensor& self, int64_t first, const std::vector<at::Tensor>& adjacent,
                  const at::Tensor& out) {
  const int64_t k = static_cast<int64_t>(adjacent.size());
  if (first + k > self.dim()) return false;
  // The indexed dims must merge into one (a view of self): each dim of
  // size > 1 steps over all the dims after it.
  int64_t merged = 1;
  for (int64_t d = first + k - 1; d >= first; --d) {
    if (self.size(d) > 1 && self.stride(d) != self.stride(first + k - 1) * merged) return false;
    merged *= self.size(d);
  }
  // The indices' broadcast shape (none: the CPU's error, through the fallback).
  std::vector<int64_t> broadcast;
  for (const at::Tensor& index : adjacent) {
    const int64_t rank = std::max<int64_t>(static_cast<int64_t>(broadcast.size()), index.dim());
    std::vector<int64_t> shape(static_cast<size_t>(rank), 1);
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t a = d - (rank - static_cast<int64_t>(broadcast.size()));
      const int64_t b = d - (rank - index.dim());
      const int64_t x = a >= 0 ? broadcast[a] : 1, y = b >= 0 ? index.size(b) : 1;
      if (x != y && x != 1 && y != 1) return false;
      shape[d] = x == 1 ? y : x;
    }
    broadcast = std::move(shape);
  }
  ResizeOut(out, IndexedShape(self, first, broadcast, k));
  std::vector<at::Tensor> inputs = {self};
  inputs.insert(inputs.end(), adjacent.begin(), adjacent.end());
  for (const at::Tensor& t : inputs) {
    if (t.storage().is_alias_of(out.storage())) return false;
  }
  if (!OutputOk(out, {})) return false;
  if (out.numel() == 0) return true;
  Program p("aten::index.Tensor_out");
  Operand linear;
  int64_t stride = 1;  // elements of the merged dim per step of dim d
  for (int64_t d = first + k - 1; d >= first; --d) {
    const int64_t size = self.size(d);
    const at::Tensor& index = adjacent[d - first];
    Operand check = p.Temp(TERN_DTYPE_I64, index.dim() == 0 ? c10::IntArrayRef{1} : index.sizes());
    Operand table = p.ConstInt(0, TERN_DTYPE_I64).Expand({size});
    Operand raw = p.In(index);
    p.Emit(TERN_OP_GATHER, {check, table, index.dim() == 0 ? raw.Unsqueeze(0) : raw}, {0});
    Operand wide = Input(p, index, at::kLong, broadcast);
    Operand negative = p.Temp(TERN_DTYPE_BOOL, broadcast);
    p.Emit(TERN_OP_BINARY, {negative, wide, p.ConstInt(0, TERN_DTYPE_I64).Expand(broadcast)},
           {TERN_BINARY_LT});
    Operand term = p.Temp(TERN_DTYPE_I64, broadcast);
    p.Emit(TERN_OP_BINARY, {term, wide, p.ConstInt(size, TERN_DTYPE_I64).Expand(broadcast)},
           {TERN_BINARY_ADD});
    p.Emit(TERN_OP_WHERE, {term, negative, term, wide});
    if (stride != 1) {
      p.Emit(TERN_OP_BINARY, {term, term, p.ConstInt(stride, TERN_DTYPE_I64).Expand(broadcast)},
             {TERN_BINARY_MUL});
    }
    if (linear.present()) {
      p.Emit(TERN_OP_BINARY, {linear, linear, term}, {TERN_BINARY_ADD});
    } else {
      linear = term;
    }
    stride *= size;
  }
  std::vector<int64_t> merged_shape(self.sizes().begin(), self.sizes().begin() + first);
  merged_shape.push_back(merged);
  merged_shape.insert(merged_shape.end(), self.sizes().begin() + first + k, self.sizes().end());
  std::vector<int64_t> merged_strides(self.strides().begin(), self.strides().begin() + first);
  merged_strides.push_back(self.stride(first + k - 1));
  merged_strides.insert(merged_strides.end(), self.strides().begin() + first + k,
                        self.strides().end());
  Operand table = p.In(self.as_strided(merged_shape, merged_strides));
  if (broadcast.empty()) linear = linear.Unsqueeze(0);
  Operand O = p.Out(out);
  if (broadcast.empty()) O = O.Unsqueeze(first);
  p.Emit(TERN_OP_GATHER, {O, table, linear}, {first});
  return p.ok() && p.Run();
}

// x[..., mask, ...] with one boolean (or uint8) mask over self's dims
// [axis, axis + mask.dim()): those dims merged into one, the rows of the
// mask's true elements selected (their flat indices from nonzero, which reads
// their count on the host first, as every device's must).
bool IndexBoolMask(const at::Tensor& self, int64_t axis, const at::Tensor& mask, at::Tensor& out) {
  const int64_t k = mask.dim();
  if (k == 0 || axis + k > self.dim() ||
      mask.sizes() != self.sizes().slice(static_cast<size_t>(axis), static_cast<size_t>(k))) {
    return false;  // the CPU's error for a mismatched mask
  }
  std::vector<int64_t> merged(self.sizes().begin(), self.sizes().begin() + axis);
  merged.push_back(mask.numel());
  merged.insert(merged.end(), self.sizes().begin() + axis + k, self.sizes().end());
  const at::Tensor rows = at::nonzero(mask.reshape({-1})).squeeze(1);
  const at::Tensor selected = self.reshape(merged).index_select(axis, rows);
  ResizeOut(out, selected.sizes().vec());
  out.copy_(selected);
  return true;
}

// x[..., idx, ...] with one integer index tensor (the other indices None),
// or several adjacent ones (x[i, j]).
// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& IndexTensorOut(const at::Tensor& self,
                           const c10::List<std::optional<at::Tensor>>& indices, at::Tensor& out) {
  bool done = false;
  int64_t axis = -1;
  at::Tensor index;
  const bool one_index = OneIndexTensor(indices, &axis, &index);
  std::vector<at::Tensor> adjacent;
  if (one_index && IsTern(self) && IndexDtype(index) && axis < self.dim() &&
      out.scalar_type() == self.scalar_type()) {
    std::vector<int64_t> shape(self.sizes().begin(), self.sizes().begin() + axis);
    shape.insert(shape.end(), index.sizes().begin(), index.sizes().end());
    shape.insert(shape.end(), self.sizes().begin() + axis + 1, self.sizes().end());
    ResizeOut(out, shape);
    if (OutputOk(out, {self, index})) {
      Program p("aten::index.Tensor_out");
      p.Emit(TERN_OP_GATHER, {p.Out(out), p.In(self), p.In(index)}, {axis});
      done = p.Run();
    }
  } else if (one_index && IsTern(self) && IsTern(index) && IsTern(out) &&
             (index.scalar_type() == at::kBool || index.scalar_type() == at::kByte) &&
             out.scalar_type() == self.scalar_type()) {
    done = IndexBoolMask(self, axis, index, out);
  } else if (!one_index && IsTern(self) && IsTern(out) && out.scalar_type() == self.scalar_type() &&
             Supported(self.scalar_type()) && AdjacentIndexTensors(indices, &axis, &adjacent)) {
    done = IndexSeveral(self, axis, adjacent, out);
  }
  if (done) return out;
  return TERN_FALLBACK(index_Tensor_out, self, indices, out);
}
TERN_ATEN_IMPL("index.Tensor_out", IndexTensorOut);

at::Tensor& GatherOut(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                      bool sparse_grad, at::Tensor& out) {
  bool done = false;
  if (IsTern(self) && self.dim() > 0 && index.dim() == self.dim() && IndexDtype(index) &&
      out.scalar_type() == self.scalar_type()) {
    dim = c10::maybe_wrap_dim(dim, self.dim());
    bool shapes_ok = true;
    for (int64_t d = 0; d < self.dim(); ++d) {
      shapes_ok = shapes_ok && (d == dim || index.size(d) <= self.size(d));
    }
    ResizeOut(out, index.sizes());
    if (shapes_ok && OutputOk(out, {self, index})) {
      Program p("aten::gather.out");
      p.Emit(TERN_OP_TAKE_ALONG_AXIS, {p.Out(out), p.In(self), p.In(index)}, {dim});
      done = p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(gather_out, self, dim, index, sparse_grad, out);
}
TERN_ATEN_IMPL("gather.out", GatherOut);

// Whether `t` can be written in place natively: OutputOk's rules, but a
// strided view (x[..., 1] of a contiguous x) counts as well when no two of
// its elements share memory (sorted by stride, each stride exceeds the span
// of the smaller ones), which at::has_internal_overlap does not decide.
bool WritableInPlace(const at::Tensor& t) {
  if (OutputOk(t, {})) return true;
  if (!IsTern(t) || !Supported(t.scalar_type()) || t.is_conj() || t.is_neg()) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements covered by the dims so far
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span += (size - 1) * stride;
  }
  return true;
}

// Whether a scatter-like op may write `out` natively: in place (scatter_,
// index_add_ on a strided view such as x[:, :, 2:-2]) when no two of its
// elements share memory, else OutputOk's rules.
bool ScatterTargetOk(const at::Tensor& self, const at::Tensor& out) {
  return self.is_same(out) ? WritableInPlace(out) : OutputOk(out, {self});
}

// Copies self into out unless out is self (in place).
void CopyUnlessSame(Program& p, const at::Tensor& self, const at::Tensor& out, Operand O) {
  if (self.data_ptr() == out.data_ptr() && self.sizes() == out.sizes() &&
      self.strides() == out.strides()) {
    return;
  }
  p.Emit(TERN_OP_COPY, {O, p.In(self)});
}

at::Tensor& ScatterAddOut(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                          const at::Tensor& src, at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  if (IsTern(self) && IsTern(src) && self.dim() > 0 && dtype != at::kBool &&
      src.scalar_type() == dtype && out.scalar_type() == dtype && IndexDtype(index) &&
      index.dim() == self.dim() && src.dim() == self.dim()) {
    dim = c10::maybe_wrap_dim(dim, self.dim());
    bool shapes_ok = true;
    for (int64_t d = 0; d < self.dim(); ++d) {
      shapes_ok =
          shapes_ok && index.size(d) <= src.size(d) && (d == dim || index.size(d) <= self.size(d));
    }
    ResizeOut(out, self.sizes());
    const bool aliased =
        (src.storage().is_alias_of(out.storage()) || index.storage().is_alias_of(out.storage()));
    if (shapes_ok && !aliased && ScatterTargetOk(self, out)) {
      Program p("aten::scatter_add.out");
      Operand O = p.Out(out);
      CopyUnlessSame(p, self, out, O);
      Operand S = p.In(src);
      for (int64_t d = 0; d < src.dim(); ++d) S = S.Slice(d, 0, index.size(d));
      p.Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS, {O, p.In(index), S}, {dim});
      done = p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(scatter_add_out, self, dim, index, src, out);
}
TERN_ATEN_IMPL("scatter_add.out", ScatterAddOut);

// scatter(dim, index, value) with a number: every position that `index`
// names along `dim` becomes `value`: one SCATTER_ALONG_AXIS of the number
// broadcast to the index's shape, whose index rule is torch.scatter's (a
// negative or too large index raises, as on the CPU).
// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& ScatterValueOut(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                            const at::Scalar& value, at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  if (IsTern(self) && self.dim() > 0 && Supported(dtype) && out.scalar_type() == dtype &&
      IndexDtype(index) && index.dim() == self.dim()) {
    dim = c10::maybe_wrap_dim(dim, self.dim());
    bool shapes_ok = true;
    for (int64_t d = 0; d < self.dim(); ++d) {
      shapes_ok = shapes_ok && (d == dim || index.size(d) <= self.size(d));
    }
    ResizeOut(out, self.sizes());
    if (shapes_ok && !index.storage().is_alias_of(out.storage()) && ScatterTargetOk(self, out)) {
      Program p("aten::scatter.value_out");
      Operand O = p.Out(out);
      CopyUnlessSame(p, self, out, O);
      p.Emit(TERN_OP_SCATTER_ALONG_AXIS,
             {O, p.In(index), ScalarArg(p, value, dtype).Expand(index.sizes())}, {dim});
      done = p.ok() && p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(scatter_value_out, self, dim, index, value, out);
}
TERN_ATEN_IMPL("scatter.value_out", ScatterValueOut);

// scatter(dim, index, src): out[i][index[i][j]] = src[i][j] (dim 1), the
// last position along `dim` winning where an index repeats within a line, as
// the CPU's kernel (which walks each line in order). One SCATTER_ALONG_AXIS
// after the copy of self; sort's and topk's backward.
// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& ScatterSrcOut(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                          const at::Tensor& src, at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  if (IsTern(self) && IsTern(src) && self.dim() > 0 && Supported(dtype) &&
      src.scalar_type() == dtype && out.scalar_type() == dtype && IndexDtype(index) &&
      index.dim() == self.dim() && src.dim() == self.dim()) {
    dim = c10::maybe_wrap_dim(dim, self.dim());
    bool shapes_ok = true;
    for (int64_t d = 0; d < self.dim(); ++d) {
      shapes_ok =
          shapes_ok && index.size(d) <= src.size(d) && (d == dim || index.size(d) <= self.size(d));
    }
    ResizeOut(out, self.sizes());
    const bool aliased =
        (src.storage().is_alias_of(out.storage()) || index.storage().is_alias_of(out.storage()));
    if (shapes_ok && !aliased && ScatterTargetOk(self, out)) {
      Program p("aten::scatter.src_out");
      Operand O = p.Out(out);
      CopyUnlessSame(p, self, out, O);
      Operand S = p.In(src);
      for (int64_t d = 0; d < src.dim(); ++d) S = S.Slice(d, 0, index.size(d));
      p.Emit(TERN_OP_SCATTER_ALONG_AXIS, {O, p.In(index), S}, {dim});
      done = p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(scatter_src_out, self, dim, index, src, out);
}
TERN_ATEN_IMPL("scatter.src_out", ScatterSrcOut);

at::Tensor& IndexAddOut(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                        const at::Tensor& source, const at::Scalar& alpha, at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  if (IsTern(self) && IsTern(source) && self.dim() > 0 && dtype != at::kBool &&
      source.scalar_type() == dtype && out.scalar_type() == dtype && IndexDtype(index) &&
      index.dim() <= 1 && source.dim() == self.dim()) {
    dim = c10::maybe_wrap_dim(dim, self.dim());
    std::vector<int64_t> expected = self.sizes().vec();
    expected[dim] = index.numel();
    ResizeOut(out, self.sizes());
    const bool aliased =
        (source.storage().is_alias_of(out.storage()) || index.storage().is_alias_of(out.storage()));
    if (source.sizes() == at::IntArrayRef(expected) && !aliased && ScatterTargetOk(self, out)) {
      Program p("aten::index_add.out");
      Operand O = p.Out(out);
      CopyUnlessSame(p, self, out, O);
      Operand S = p.In(source);
      const bool unit = (alpha.isIntegral(false) && alpha.toLong() == 1) ||
                        (alpha.isFloatingPoint() && alpha.toDouble() == 1.0);
      if (!unit) {
        Operand scaled = p.Temp(*TD(dtype), source.sizes());
        p.Emit(TERN_OP_BINARY, {scaled, S, ScalarArg(p, alpha, dtype).Expand(source.sizes())},
               {TERN_BINARY_MUL});
        S = scaled;
      }
      Operand idx = p.In(index);
      if (index.dim() == 0) idx = idx.Unsqueeze(0);
      p.Emit(TERN_OP_SCATTER_ADD, {O, idx, S}, {dim});
      done = p.ok() && p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(index_add_out, self, dim, index, source, alpha, out);
}
TERN_ATEN_IMPL("index_add.out", IndexAddOut);

// self[..., index, ...] = values (or += with accumulate) with one integer
// index tensor at `axis` (the indices before it None, none after): the
// backward of x[:, :, idx], x[idx] = v, and what index_put_ does in models.
// One SCATTER_ADD or SCATTER (the last of duplicate indices wins, as the
// CPU's serial loop) along the axis; values broadcast to the indexed shape.
bool IndexPutInteger(at::Tensor& self, int64_t axis, const at::Tensor& index,
                     const at::Tensor& values, bool accumulate) {
  const std::vector<int64_t> shape = IndexedShape(self, axis, index.sizes(), 1);
  if (!at::is_expandable_to(values.sizes(), shape)) return false;
  Program p("aten::_index_put_impl_");
  Operand idx = p.In(index);
  if (index.dim() == 0) idx = idx.Unsqueeze(0);
  Operand src = Input(p, values, self.scalar_type(), shape);
  // A 0-dim index removes the axis from the indexed shape; the instruction
  // wants it back, of size 1.
  if (index.dim() == 0) src = src.Unsqueeze(axis);
  p.Emit(accumulate ? TERN_OP_SCATTER_ADD : TERN_OP_SCATTER, {p.Out(self), idx, src}, {axis});
  return p.ok() && p.Run();
}

// self[..., mask, ...] = values (+= with accumulate) with one boolean mask over self's dims
// [axis, axis + mask.dim()). Values that broadcast along the selected
// elements (x[mask] = 0, a value per trailing position) are a WHERE, with no
// synchronisation. Values with one row per selected element are gathered
// through the mask's running count (SCAN): row c - 1 for the c-th true
// element. That needs the count on the host first, as the CPU's nonzero
// does, to check the rows (a mismatch falls back for the CPU's error).
bool IndexPutMask(at::Tensor& self, int64_t axis, const at::Tensor& mask, const at::Tensor& values,
                  bool accumulate) {
  const int64_t k = mask.dim();
  if (k == 0 || axis + k > self.dim() ||
      mask.sizes() != self.sizes().slice(static_cast<size_t>(axis), static_cast<size_t>(k))) {
    return false;
  }
  const int64_t post = self.dim() - axis - k;
  // The selected dimension's place in values, right-aligned with the
  // indexed shape [pre..., count, post...]; < 0 when values lacks it.
  const int64_t vd = values.dim() - 1 - post;
  const bool broadcast = vd < 0 || values.size(vd) == 1;
  std::vector<int64_t> one_row = IndexedShape(self, axis, {1}, k);
  Program p("aten::_index_put_impl_");
  Operand O = p.Out(self);
  Operand M = p.In(mask);
  for (int64_t d = 0; d < post; ++d) M = M.Unsqueeze(M.dim());
  M = M.Expand(self.sizes());
  Operand V;
  if (broadcast) {
    if (!at::is_expandable_to(values.sizes(), one_row)) return false;
    V = Input(p, values, self.scalar_type(), one_row).Select(axis, 0);
    for (int64_t d = 0; d < k; ++d) V = V.Unsqueeze(axis);
    V = V.Expand(self.sizes());
  } else {
    if (!IsTern(values)) return false;
    const int64_t count = mask.sum().item<int64_t>();
    if (values.size(vd) != count) return false;
    if (count == 0) return true;  // nothing is selected
    const std::vector<int64_t> rows = IndexedShape(self, axis, {count}, k);
    if (!at::is_expandable_to(values.sizes(), rows)) return false;
    // The row of each position: the mask's running count minus one (-1,
    // the last row, before the first true element, where WHERE ignores it).
    Operand flat = p.Temp(TERN_DTYPE_BOOL, mask.sizes());
    p.Emit(TERN_OP_COPY, {flat, p.In(mask)});
    Operand counts = p.Temp(TERN_DTYPE_I64, {mask.numel()});
    p.Emit(TERN_OP_SCAN, {counts, flat.View({mask.numel()})}, {TERN_SCAN_SUM, 0});
    Operand row = p.Temp(TERN_DTYPE_I64, {mask.numel()});
    p.Emit(TERN_OP_BINARY, {row, counts, p.ConstInt(1, TERN_DTYPE_I64).Expand({mask.numel()})},
           {TERN_BINARY_SUB});
    V = p.Temp(*TD(self.scalar_type()), self.sizes());
    p.Emit(TERN_OP_GATHER, {V, p.In(values).Expand(rows), row.View(mask.sizes())}, {axis});
  }
  if (accumulate) {
    // A mask selects each position once: accumulating is adding there (the
    // backward of x[mask]).
    Operand sum = p.Temp(*TD(self.scalar_type()), self.sizes());
    p.Emit(TERN_OP_BINARY, {sum, O, V}, {TERN_BINARY_ADD});
    V = sum;
  }
  p.Emit(TERN_OP_WHERE, {O, M, V, O});
  return p.ok() && p.Run();
}

// index_put_ with one index tensor (integer or boolean) among slices, into
// a tern tensor of its own dtype. Anything else (several index tensors, CPU
// indices, values that alias self) falls back.
// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& IndexPutImpl(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                         const at::Tensor& values, bool accumulate, bool unsafe) {
  bool done = false;
  int64_t axis = -1;
  at::Tensor index;
  const bool one_index = OneIndexTensor(indices, &axis, &index);
  const at::ScalarType dtype = self.scalar_type();
  // Values: a tern tensor of self's dtype, or a number (a 0-dim CPU tensor).
  if (one_index && IsTern(self) && (IsTern(values) || IsCpuScalar(values)) && IsTern(index) &&
      axis < self.dim() && Supported(dtype) && values.scalar_type() == dtype &&
      !values.storage().is_alias_of(self.storage()) &&
      !index.storage().is_alias_of(self.storage()) && WritableInPlace(self)) {
    if (IndexDtype(index)) {
      done = (!accumulate || dtype != at::kBool) &&
             IndexPutInteger(self, axis, index, values, accumulate);
    } else if (index.scalar_type() == at::kBool && (!accumulate || dtype != at::kBool)) {
      done = IndexPutMask(self, axis, index, values, accumulate);
    }
  }
  if (done) return self;
  return TERN_FALLBACK(_index_put_impl_, self, indices, values, accumulate, unsafe);
}
TERN_ATEN_IMPL("_index_put_impl_", IndexPutImpl);

// flip: one GATHER per flipped dimension, with the indices n-1, ..., 0 made
// on the device (IOTA). Never in place (the output must not overlap self).
at::Tensor& FlipOut(const at::Tensor& self, at::IntArrayRef dims, at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  std::vector<int64_t> axes;
  bool axes_ok = true;
  for (int64_t d : dims) {
    if (self.dim() == 0) {  // a scalar flips to itself (dims 0 and -1 name it)
      axes_ok = axes_ok && (d == 0 || d == -1);
      continue;
    }
    if (!axes_ok || d < -self.dim() || d >= self.dim()) {
      axes_ok = false;
      break;
    }
    const int64_t axis = c10::maybe_wrap_dim(d, self.dim());
    for (int64_t seen : axes) axes_ok = axes_ok && seen != axis;
    if (self.size(axis) > 1) axes.push_back(axis);
  }
  if (axes_ok && IsTern(self) && Supported(dtype) && out.scalar_type() == dtype &&
      (!IsTern(out) || !out.storage().is_alias_of(self.storage()))) {
    ResizeOut(out, self.sizes());
    if (OutputOk(out, {self})) {
      Program p("aten::flip");
      Operand current = p.In(self);
      if (axes.empty() || self.numel() == 0) {
        p.Emit(TERN_OP_COPY, {p.Out(out), current});
      }
      for (size_t i = 0; i < axes.size() && self.numel() > 0; ++i) {
        const int64_t n = self.size(axes[i]);
        Operand reversed = p.Temp(TERN_DTYPE_I64, {n});
        p.Emit(TERN_OP_IOTA, {reversed}, {0}, {static_cast<double>(n - 1), -1.0});
        Operand next = i + 1 == axes.size() ? p.Out(out) : p.Temp(*TD(dtype), self.sizes());
        p.Emit(TERN_OP_GATHER, {next, current, reversed}, {axes[i]});
        current = next;
      }
      done = p.ok() && p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(flip_out, self, dims, out);
}
TERN_ATEN_IMPL("flip.out", FlipOut);

at::Tensor Flip(const at::Tensor& self, at::IntArrayRef dims) {
  at::Tensor out = at::empty({0}, self.options());
  return FlipOut(self, dims, out);
}
TERN_ATEN_IMPL("flip", Flip);

// roll: per rolled dimension two strided copies (the last `shift` elements
// move to the front); several dimensions chain through temporaries. With no
// dims the tensor rolls as if flattened: a contiguous copy viewed as 1-D.
at::Tensor& RollOut(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims,
                    at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  // The CPU's rules: one shift and no dims (flattened), or one shift per dim.
  bool ok = !shifts.empty() && (dims.empty() ? shifts.size() == 1 : shifts.size() == dims.size());
  for (int64_t d : dims) ok = ok && self.dim() > 0 && d >= -self.dim() && d < self.dim();
  if (ok && IsTern(self) && Supported(dtype) && out.scalar_type() == dtype &&
      (!IsTern(out) || !out.storage().is_alias_of(self.storage()))) {
    ResizeOut(out, self.sizes());
    if (OutputOk(out, {self})) {
      Program p("aten::roll");
      Operand result = p.Out(out);
      std::vector<std::pair<int64_t, int64_t>> moves;  // (axis, shift in [1, n))
      Operand current = p.In(self);
      if (dims.empty()) {
        const int64_t n = self.numel();
        if (!current.IsContiguous()) {
          Operand dense = p.Temp(*TD(dtype), self.sizes());
          p.Emit(TERN_OP_COPY, {dense, current});
          current = dense;
        }
        current = current.View({n});
        result = result.IsContiguous() ? result.View({n}) : Operand{};
        if (n > 0 && shifts[0] % n != 0) moves.emplace_back(0, ((shifts[0] % n) + n) % n);
      } else {
        for (size_t i = 0; i < dims.size(); ++i) {
          const int64_t axis = c10::maybe_wrap_dim(dims[i], self.dim());
          const int64_t n = self.size(axis);
          if (n > 0 && shifts[i] % n != 0) moves.emplace_back(axis, ((shifts[i] % n) + n) % n);
        }
      }
      if (result.present()) {
        if (moves.empty() || self.numel() == 0) p.Emit(TERN_OP_COPY, {result, current});
        for (size_t i = 0; i < moves.size() && self.numel() > 0; ++i) {
          const auto [axis, shift] = moves[i];
          const int64_t n = current.shape[axis];
          Operand next = i + 1 == moves.size() ? result : p.Temp(*TD(dtype), current.shape);
          p.Emit(TERN_OP_COPY,
                 {next.Slice(axis, shift, n - shift), current.Slice(axis, 0, n - shift)});
          p.Emit(TERN_OP_COPY, {next.Slice(axis, 0, shift), current.Slice(axis, n - shift, shift)});
          current = next;
        }
        done = p.ok() && p.Run();
      }
    }
  }
  if (done) return out;
  return TERN_FALLBACK(roll_out, self, shifts, dims, out);
}
TERN_ATEN_IMPL("roll.out", RollOut);

at::Tensor Roll(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims) {
  at::Tensor out = at::empty({0}, self.options());
  return RollOut(self, shifts, dims, out);
}
TERN_ATEN_IMPL("roll", Roll);

// The gradient of an embedding lookup: zeros, then every row of grad added
// at its index (in index order), the padding row left at zero.
at::Tensor EmbeddingDenseBackward(const at::Tensor& grad_output, const at::Tensor& indices,
                                  int64_t num_weights, int64_t padding_idx,
                                  bool scale_grad_by_freq) {
  const at::ScalarType dtype = grad_output.scalar_type();
  if (!scale_grad_by_freq && IsTern(grad_output) && at::isFloatingType(dtype) && Supported(dtype) &&
      IndexDtype(indices) && grad_output.dim() == indices.dim() + 1 &&
      grad_output.sizes().slice(0, indices.dim()) == indices.sizes()) {
    const int64_t width = grad_output.size(-1);
    at::Tensor out = at::empty({num_weights, width}, grad_output.options());
    Program p("aten::embedding_dense_backward");
    Operand O = p.Out(out);
    p.Emit(TERN_OP_FILL, {O}, {}, {0.0});
    p.Emit(TERN_OP_SCATTER_ADD, {O, p.In(indices), p.In(grad_output)}, {0});
    if (padding_idx >= 0 && padding_idx < num_weights) {
      p.Emit(TERN_OP_FILL, {O.Select(0, padding_idx)}, {}, {0.0});
    }
    if (p.Run()) return out;
  }
  return TERN_FALLBACK(embedding_dense_backward, grad_output, indices, num_weights, padding_idx,
                       scale_grad_by_freq);
}
TERN_ATEN_IMPL("embedding_dense_backward", EmbeddingDenseBackward);

// ---- cat, tril/triu, arange ------------------------------------------------------------

at::Tensor& CatOut(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  bool done = false;
  const auto list = tensors.materialize();
  std::vector<at::Tensor> pieces;
  bool ok = IsTern(out) && !list.empty();
  for (const at::Tensor& t : list) {
    // Legacy empty 1-D tensors take no part.
    if (t.dim() == 1 && t.numel() == 0) continue;
    ok = ok && IsTern(t) && Supported(t.scalar_type());
    pieces.push_back(t);
  }
  if (ok && !pieces.empty()) {
    const int64_t rank = pieces[0].dim();
    ok = rank > 0;
    if (ok) dim = c10::maybe_wrap_dim(dim, rank);
    std::vector<int64_t> shape = ok ? pieces[0].sizes().vec() : std::vector<int64_t>{};
    if (ok) shape[dim] = 0;
    for (const at::Tensor& t : pieces) {
      ok = ok && t.dim() == rank;
      for (int64_t d = 0; ok && d < rank; ++d) ok = d == dim || t.size(d) == shape[d];
      if (ok) shape[dim] += t.size(dim);
    }
    if (ok) {
      ResizeOut(out, shape);
      for (const at::Tensor& t : pieces) {
        ok = ok && !t.storage().is_alias_of(out.storage());
      }
      ok = ok && OutputOk(out, {});
    }
    if (ok) {
      Program p("aten::cat.out");
      Operand O = p.Out(out);
      int64_t offset = 0;
      for (const at::Tensor& t : pieces) {
        const int64_t size = t.size(dim);
        if (size > 0) {
          p.Emit(t.scalar_type() == out.scalar_type() ? TERN_OP_COPY : TERN_OP_CAST,
                 {O.Slice(dim, offset, size), p.In(t)});
        }
        offset += size;
      }
      done = p.ok() && p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(cat_out, tensors, dim, out);
}
TERN_ATEN_IMPL("cat.out", CatOut);

// Keeps elements whose column minus row is <= k (tril) or >= k (triu).
bool Triangle(const char* name, bool lower, const at::Tensor& self, int64_t k,
              const at::Tensor& out) {
  if (!IsTern(self) || self.dim() < 2 || out.scalar_type() != self.scalar_type()) return false;
  ResizeOut(out, self.sizes());
  if (!OutputOk(out, {self})) return false;
  const int64_t rows = self.size(-2), cols = self.size(-1);
  Program p(name);
  Operand r = p.Temp(TERN_DTYPE_I64, {rows, 1}), c = p.Temp(TERN_DTYPE_I64, {1, cols});
  p.Emit(TERN_OP_IOTA, {r}, {0}, {0.0, 1.0});
  p.Emit(TERN_OP_IOTA, {c}, {1}, {0.0, 1.0});
  Operand diff = p.Temp(TERN_DTYPE_I64, {rows, cols});
  p.Emit(TERN_OP_BINARY, {diff, c.Expand({rows, cols}), r.Expand({rows, cols})}, {TERN_BINARY_SUB});
  Operand keep = p.Temp(TERN_DTYPE_BOOL, {rows, cols});
  p.Emit(TERN_OP_BINARY, {keep, diff, p.ConstInt(k, TERN_DTYPE_I64).Expand({rows, cols})},
         {lower ? TERN_BINARY_LE : TERN_BINARY_GE});
  const tern_dtype_t d = *TD(self.scalar_type());
  const Operand zero = at::isFloatingType(self.scalar_type()) ? p.Const(0.0, d) : p.ConstInt(0, d);
  p.Emit(TERN_OP_WHERE,
         {p.Out(out), keep.Expand(self.sizes()), p.In(self), zero.Expand(self.sizes())});
  return p.ok() && p.Run();
}

at::Tensor& TrilOut(const at::Tensor& self, int64_t k, at::Tensor& out) {
  if (Triangle("aten::tril.out", true, self, k, out)) return out;
  return TERN_FALLBACK(tril_out, self, k, out);
}
TERN_ATEN_IMPL("tril.out", TrilOut);

at::Tensor& TriuOut(const at::Tensor& self, int64_t k, at::Tensor& out) {
  if (Triangle("aten::triu.out", false, self, k, out)) return out;
  return TERN_FALLBACK(triu_out, self, k, out);
}
TERN_ATEN_IMPL("triu.out", TriuOut);

// start + i * step (computed in f64, then rounded), as the CPU does.
at::Tensor& ArangeStartOut(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                           at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = out.scalar_type();
  if (IsTern(out) && Supported(dtype) && dtype != at::kBool) {
    const double s = start.toDouble(), e = end.toDouble(), st = step.toDouble();
    const bool integral = at::isIntegralType(dtype, false);
    bool ok = st != 0 && std::isfinite(s) && std::isfinite(e) && std::isfinite(st) &&
              ((st > 0 && e >= s) || (st < 0 && e <= s));
    if (integral)
      ok = ok && s == std::trunc(s) && st == std::trunc(st) && std::abs(s) < 9e15 &&
           std::abs(e) < 9e15;
    if (ok) {
      double size_d;
      if (dtype == at::kLong) {
        const int64_t xs = start.toLong(), xe = end.toLong(), xst = step.toLong();
        const int64_t sgn = (xst > 0) - (xst < 0);
        size_d = std::ceil(static_cast<double>((xe - xs + xst - sgn) / xst));  // as ATen
      } else {
        size_d = std::ceil((e - s) / st);
      }
      const int64_t size = static_cast<int64_t>(size_d);
      if (out.numel() != size) out.resize_({size});
      if (out.dim() == 1 && OutputOk(out, {})) {
        Program p("aten::arange.start_out");
        p.Emit(TERN_OP_IOTA, {p.Out(out)}, {0}, {s, st});
        done = p.Run();
      }
    }
  }
  if (done) return out;
  return TERN_FALLBACK(arange_start_out, start, end, step, out);
}
TERN_ATEN_IMPL("arange.start_out", ArangeStartOut);

// eye(n, m): zeros, then ones along the diagonal (a view of stride m + 1).
at::Tensor& EyeMOut(int64_t n, int64_t m, at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = out.scalar_type();
  if (n >= 0 && m >= 0 && IsTern(out) && Supported(dtype)) {
    ResizeOut(out, {n, m});
    if (OutputOk(out, {})) {
      Program p("aten::eye.m_out");
      Operand O = p.Out(out);
      // FILL takes an integer dtype's value exactly in ints[0].
      const bool integral = at::isIntegralType(dtype, /*includeBool=*/true);
      auto fill = [&](const Operand& o, int64_t value) {
        if (integral) {
          p.Emit(TERN_OP_FILL, {o}, {value});
        } else {
          p.Emit(TERN_OP_FILL, {o}, {}, {static_cast<double>(value)});
        }
      };
      fill(O, 0);
      if (std::min(n, m) > 0) {
        Operand diagonal = O;
        diagonal.shape = {std::min(n, m)};
        diagonal.strides = {O.strides[0] + O.strides[1]};
        fill(diagonal, 1);
      }
      done = p.ok() && p.Run();
    }
  }
  if (done) return out;
  return TERN_FALLBACK(eye_m_out, n, m, out);
}
TERN_ATEN_IMPL("eye.m_out", EyeMOut);

at::Tensor& EyeOut(int64_t n, at::Tensor& out) { return EyeMOut(n, n, out); }
TERN_ATEN_IMPL("eye.out", EyeOut);

// The CPU's linspace: start + i*step for the first half, end - (steps-1-i)*step
// for the second (two IOTAs).
at::Tensor& LinspaceOut(const at::Scalar& start, const at::Scalar& end, int64_t steps,
                        at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = out.scalar_type();
  if (IsTern(out) && at::isFloatingType(dtype) && Supported(dtype) && steps >= 0 &&
      !start.isComplex() && !end.isComplex()) {
    if (out.numel() != steps) out.resize_({steps});
    if (out.dim() == 1 && OutputOk(out, {})) {
      const double s = start.toDouble(), e = end.toDouble();
      Program p("aten::linspace.out");
      Operand O = p.Out(out);
      if (steps == 1) {
        p.Emit(TERN_OP_FILL, {O}, {}, {s});
      } else if (steps > 1) {
        const double step = (e - s) / static_cast<double>(steps - 1);
        const int64_t half = steps / 2;
        if (half > 0) p.Emit(TERN_OP_IOTA, {O.Slice(0, 0, half)}, {0}, {s, step});
        p.Emit(TERN_OP_IOTA, {O.Slice(0, half, steps - half)}, {0},
               {e - step * static_cast<double>(steps - 1 - half), step});
      }
      done = steps == 0 || (p.ok() && p.Run());
    }
  }
  if (done) return out;
  return TERN_FALLBACK(linspace_out, start, end, steps, out);
}
TERN_ATEN_IMPL("linspace.out", LinspaceOut);

// The CPU's logspace: base ** the exponents linspace would give, where the
// step is computed from start and end rounded to the output dtype (as the CPU
// does: (scalar_t(end) - scalar_t(start)) / (steps - 1)) and the exponents in
// f64 (IOTA) rounded to f32. The power is taken in f32, then cast for bf16/f16.
// Thread-safety: any thread (the current stream's queue orders the work).
at::Tensor& LogspaceOut(const at::Scalar& start, const at::Scalar& end, int64_t steps, double base,
                        at::Tensor& out) {
  bool done = false;
  const at::ScalarType dtype = out.scalar_type();
  if (IsTern(out) && at::isFloatingType(dtype) && Supported(dtype) && steps >= 0 &&
      !start.isComplex() && !end.isComplex()) {
    if (out.numel() != steps) out.resize_({steps});
    if (out.dim() == 1 && OutputOk(out, {})) {
      // start and end in the output dtype, their difference rounded there too.
      double s = 0.0, e = 0.0, diff = 0.0;
      if (dtype == at::kHalf) {
        const c10::Half hs = start.to<c10::Half>(), he = end.to<c10::Half>();
        s = hs;
        e = he;
        diff = static_cast<c10::Half>(he - hs);
      } else if (dtype == at::kBFloat16) {
        const c10::BFloat16 bs = start.to<c10::BFloat16>(), be = end.to<c10::BFloat16>();
        s = bs;
        e = be;
        diff = static_cast<c10::BFloat16>(be - bs);
      } else {
        const float fs = start.to<float>(), fe = end.to<float>();
        s = fs;
        e = fe;
        diff = fe - fs;
      }
      Program p("aten::logspace.out");
      const Target t = BeginOut(p, out, at::kFloat);
      if (steps == 1) {
        p.Emit(TERN_OP_FILL, {t.write}, {}, {std::pow(base, start.toDouble())});
      } else if (steps > 1) {
        const double step = diff / static_cast<double>(steps - 1);
        const int64_t half = steps / 2;
        Operand x = p.Temp(TERN_DTYPE_F32, {steps});
        if (half > 0) p.Emit(TERN_OP_IOTA, {x.Slice(0, 0, half)}, {0}, {s, step});
        p.Emit(TERN_OP_IOTA, {x.Slice(0, half, steps - half)}, {0},
               {e - step * static_cast<double>(steps - 1 - half), step});
        p.Emit(TERN_OP_BINARY, {t.write, p.Const(base, TERN_DTYPE_F32).Expand({steps}), x},
               {TERN_BINARY_POW});
      }
      Finish(p, t);
      done = steps == 0 || (p.ok() && p.Run());
    }
  }
  if (done) return out;
  return TERN_FALLBACK(logspace_out, start, end, steps, base, out);
}
TERN_ATEN_IMPL("logspace.out", LogspaceOut);

// ---- nll_loss ----------------------------------------------------------------------------

struct NllParts {
  Operand safe_target;  // [N] i64: target with ignored entries replaced by 0
  Operand ignored;      // [N] bool
  Operand weights;      // [N] f: weight of each row's target, 0 where ignored
};

NllParts NllCommon(Program& p, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                   int64_t ignore_index, int64_t n, tern_dtype_t fd) {
  NllParts parts;
  Operand T = p.In(target).View({n});
  parts.ignored = p.Temp(TERN_DTYPE_BOOL, {n});
  p.Emit(TERN_OP_BINARY, {parts.ignored, T, p.ConstInt(ignore_index, TERN_DTYPE_I64).Expand({n})},
         {TERN_BINARY_EQ});
  parts.safe_target = p.Temp(TERN_DTYPE_I64, {n});
  p.Emit(TERN_OP_WHERE,
         {parts.safe_target, parts.ignored, p.ConstInt(0, TERN_DTYPE_I64).Expand({n}), T});
  Operand w = p.Const(1.0, fd).Expand({n});
  if (weight.has_value() && weight->defined()) {
    w = p.Temp(fd, {n});
    p.Emit(TERN_OP_GATHER, {w, p.In(*weight), parts.safe_target}, {0});
  }
  parts.weights = p.Temp(fd, {n});
  p.Emit(TERN_OP_WHERE, {parts.weights, parts.ignored, p.Const(0.0, fd).Expand({n}), w});
  return parts;
}

bool NllSupported(const at::Tensor& self, const at::Tensor& target,
                  const std::optional<at::Tensor>& weight) {
  const at::ScalarType dtype = self.scalar_type();
  if (!IsTern(self) || !IsTern(target) || target.scalar_type() != at::kLong ||
      !at::isFloatingType(dtype) || !Supported(dtype) || self.numel() == 0) {
    return false;
  }
  if (!((self.dim() == 2 && target.dim() == 1 && target.size(0) == self.size(0)) ||
        (self.dim() == 1 && target.dim() == 0))) {
    return false;
  }
  if (weight.has_value() && weight->defined()) {
    const int64_t classes = self.size(-1);
    if (!IsTern(*weight) || weight->scalar_type() != dtype || weight->dim() != 1 ||
        weight->size(0) != classes) {
      return false;
    }
  }
  return true;
}

std::tuple<at::Tensor&, at::Tensor&> NllLossForwardOut(
    const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
    int64_t reduction, int64_t ignore_index, at::Tensor& output, at::Tensor& total_weight) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  if (NllSupported(self, target, weight) && output.scalar_type() == dtype &&
      total_weight.scalar_type() == dtype) {
    const bool batched = self.dim() == 2;
    const int64_t n = batched ? self.size(0) : 1;
    const int64_t classes = self.size(-1);
    ResizeOut(output, reduction == 0 && batched ? std::vector<int64_t>{n} : std::vector<int64_t>{});
    ResizeOut(total_weight, {});
    if (OutputOk(output, {self, target}) && OutputOk(total_weight, {self, target})) {
      const tern_dtype_t fd = *TD(dtype);
      Program p("aten::nll_loss_forward.output");
      NllParts parts = NllCommon(p, target, weight, ignore_index, n, fd);
      Operand picked = p.Temp(fd, {n, 1});
      p.Emit(TERN_OP_TAKE_ALONG_AXIS,
             {picked, p.In(self).View({n, classes}), parts.safe_target.View({n, 1})}, {1});
      Operand weighted = p.Temp(fd, {n});
      p.Emit(TERN_OP_BINARY, {weighted, picked.View({n}), parts.weights}, {TERN_BINARY_MUL});
      Operand TW = p.Out(total_weight).View({1});
      if (reduction == 0) {
        p.Emit(TERN_OP_UNARY, {p.Out(output).View({n}), weighted}, {TERN_UNARY_NEG});
        p.Emit(TERN_OP_FILL, {TW}, {}, {0.0});
      } else {
        Operand sum = p.Temp(fd, {1});
        p.Emit(TERN_OP_REDUCE, {sum, weighted}, {TERN_REDUCE_SUM});
        p.Emit(TERN_OP_REDUCE, {TW, parts.weights}, {TERN_REDUCE_SUM});
        if (reduction == 1) {
          Operand mean = p.Temp(fd, {1});
          p.Emit(TERN_OP_BINARY, {mean, sum, TW}, {TERN_BINARY_DIV});
          sum = mean;
        }
        p.Emit(TERN_OP_UNARY, {p.Out(output).View({1}), sum}, {TERN_UNARY_NEG});
      }
      done = p.ok() && p.Run();
    }
  }
  if (done) return {output, total_weight};
  return TERN_FALLBACK(nll_loss_forward_output, self, target, weight, reduction, ignore_index,
                       output, total_weight);
}
TERN_ATEN_IMPL("nll_loss_forward.output", NllLossForwardOut);

at::Tensor& NllLossBackwardOut(const at::Tensor& grad_output, const at::Tensor& self,
                               const at::Tensor& target, const std::optional<at::Tensor>& weight,
                               int64_t reduction, int64_t ignore_index,
                               const at::Tensor& total_weight, at::Tensor& grad_input) {
  bool done = false;
  const at::ScalarType dtype = self.scalar_type();
  const bool batched = self.dim() == 2;
  const int64_t n = batched ? self.size(0) : 1;
  if (NllSupported(self, target, weight) && IsTern(grad_output) && IsTern(total_weight) &&
      grad_output.scalar_type() == dtype && total_weight.scalar_type() == dtype &&
      grad_input.scalar_type() == dtype && total_weight.numel() == 1 &&
      ((reduction == 0 && batched) ? grad_output.numel() == n : grad_output.numel() == 1)) {
    const int64_t classes = self.size(-1);
    ResizeOut(grad_input, self.sizes());
    if (OutputOk(grad_input, {grad_output, self, target, total_weight})) {
      const tern_dtype_t fd = *TD(dtype);
      Program p("aten::nll_loss_backward.grad_input");
      Operand GI = p.Out(grad_input).View({n, classes});
      p.Emit(TERN_OP_FILL, {GI}, {}, {0.0});
      NllParts parts = NllCommon(p, target, weight, ignore_index, n, fd);
      Operand g = p.In(grad_output);
      if (reduction == 0 && batched) {
        g = g.View({n});
      } else if (reduction == 1) {
        Operand q = p.Temp(fd, {1});
        p.Emit(TERN_OP_BINARY, {q, g.View({1}), p.In(total_weight).View({1})}, {TERN_BINARY_DIV});
        g = q.Expand({n});
      } else {
        g = g.View({1}).Expand({n});
      }
      Operand prod = p.Temp(fd, {n}), src = p.Temp(fd, {n});
      p.Emit(TERN_OP_BINARY, {prod, parts.weights, g}, {TERN_BINARY_MUL});
      p.Emit(TERN_OP_UNARY, {src, prod}, {TERN_UNARY_NEG});
      p.Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS, {GI, parts.safe_target.View({n, 1}), src.View({n, 1})},
             {1});
      done = p.ok() && p.Run();
    }
  }
  if (done) return grad_input;
  return TERN_FALLBACK(nll_loss_backward_grad_input, grad_output, self, target, weight, reduction,
                       ignore_index, total_weight, grad_input);
}
TERN_ATEN_IMPL("nll_loss_backward.grad_input", NllLossBackwardOut);

}  // namespace

}  // namespace torch_tern::native
