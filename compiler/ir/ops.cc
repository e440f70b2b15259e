// The operator table: arity and inference of each core ATen op the compiler
// knows. Shapes follow PyTorch's rules (broadcasting from the right, dims
// normalised from negative, views keeping the element count); a rule the
// inputs break is an error that names the node, the input and the shapes.
#include "compiler/ir/ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <unordered_map>
#include <utility>

namespace tern::compiler {
namespace {

using Types = std::vector<TensorType>;

bool IsFloat(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16;
}

// PyTorch's promotion for two tensors of the kinds tern has: a float beats
// an integer or bool, the wider float wins (f16 with bf16 gives f32), the
// wider integer wins, bool loses to everything.
tern_dtype_t Promote(tern_dtype_t a, tern_dtype_t b) {
  if (a == b) return a;
  if (IsFloat(a) && IsFloat(b)) {
    if (a == TERN_DTYPE_F32 || b == TERN_DTYPE_F32) return TERN_DTYPE_F32;
    return TERN_DTYPE_F32;  // f16 with bf16
  }
  if (IsFloat(a)) return a;
  if (IsFloat(b)) return b;
  if (a == TERN_DTYPE_BOOL) return b;
  if (b == TERN_DTYPE_BOOL) return a;
  auto rank = [](tern_dtype_t t) {
    return t == TERN_DTYPE_I64 ? 3 : t == TERN_DTYPE_I32 ? 2 : 1;  // i8
  };
  return rank(a) >= rank(b) ? a : b;
}

std::string Shp(const InferContext& c, const Shape& shape) {
  return ShapeString(shape, c.graph.symbols);
}

// `dim` of a rank-`rank` tensor made non-negative (PyTorch allows [-rank,
// rank); `extra` 1 for ops that insert a dim).
absl::StatusOr<int64_t> NormalizeDim(const InferContext& c, int64_t dim, size_t rank,
                                     size_t extra = 0) {
  const int64_t r = static_cast<int64_t>(rank + extra);
  const int64_t bound = std::max<int64_t>(r, 1);
  if (dim < -bound || dim >= bound) {
    return c.Error(fmt::format("dim {} is out of range for a tensor of rank {} (valid: [{}, {}])",
                               dim, rank, -bound, bound - 1));
  }
  return dim < 0 ? dim + bound : dim;
}

// Two dims under broadcasting: equal, or one of them the constant 1.
absl::StatusOr<Dim> BroadcastDim(const InferContext& c, const Dim& a, const Dim& b) {
  if (a == b) return a;
  if (a.constant() == 1) return b;
  if (b.constant() == 1) return a;
  return c.Error(
      fmt::format("dims {} and {} cannot broadcast (they must be equal or one of "
                  "them 1)",
                  a.ToString(c.graph.symbols), b.ToString(c.graph.symbols)));
}

absl::StatusOr<Shape> Broadcast(const InferContext& c, const std::vector<const Shape*>& shapes) {
  size_t rank = 0;
  for (const Shape* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, Dim::Constant(1));
  for (const Shape* s : shapes) {
    for (size_t i = 0; i < s->size(); ++i) {
      Dim& slot = out[rank - s->size() + i];
      auto merged = BroadcastDim(c, slot, (*s)[i]);
      if (!merged.ok()) {
        return c.Error(fmt::format(
            "shapes {} cannot broadcast together: {}",
            [&] {
              std::string text;
              for (const Shape* t : shapes) {
                if (!text.empty()) text += " and ";
                text += Shp(c, *t);
              }
              return text;
            }(),
            std::string(merged.status().message())));
      }
      slot = *merged;
    }
  }
  return out;
}

// The element count as a dim: a product in which at most one factor is
// symbolic.
std::optional<Dim> Elements(const Shape& shape) {
  Dim count = Dim::Constant(1);
  for (const Dim& d : shape) {
    auto product = count.Times(d);
    if (!product) return std::nullopt;
    count = *product;
  }
  return count;
}

absl::Status RequireInput(const InferContext& c, size_t i, const char* what) {
  if (i >= c.inputs.size() || c.inputs[i] == nullptr) {
    return c.Error(fmt::format("its {} (input {}) is missing", what, i));
  }
  return absl::OkStatus();
}

absl::Status RequireFloat(const InferContext& c, const TensorType& t, const char* what) {
  if (!IsFloat(t.dtype)) {
    return c.Error(fmt::format("its {} has dtype {}; this op takes f32, bf16 or f16", what,
                               tern_dtype_name(t.dtype)));
  }
  return absl::OkStatus();
}

// --- the ops ---------------------------------------------------------------

absl::Status SameAsInput(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  out->push_back(*c.inputs[0]);
  return absl::OkStatus();
}

absl::Status FloatUnary(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  // Integer inputs compute in the default float dtype, as in PyTorch.
  if (!IsFloat(t.dtype)) t.dtype = TERN_DTYPE_F32;
  out->push_back(t);
  return absl::OkStatus();
}

// A tensor with a Python number (attribute `name`, which stands for the
// absent tensor input): the tensor's shape and dtype, or f32 for a float
// number with an integer or bool tensor.
absl::StatusOr<TensorType> WithNumber(const InferContext& c, const TensorType& tensor,
                                      const char* name) {
  const Attribute* scalar = FindAttr(c.node, name);
  if (scalar == nullptr) {
    return c.Error(
        fmt::format("it has neither a tensor '{}' (input {}) nor a number attribute '{}'", name,
                    std::string_view(name) == "self" ? 0 : 1, name));
  }
  TensorType result = tensor;
  if (std::holds_alternative<double>(scalar->value) && !IsFloat(tensor.dtype)) {
    result.dtype = TERN_DTYPE_F32;
  } else if (!std::holds_alternative<double>(scalar->value) &&
             !std::holds_alternative<int64_t>(scalar->value) &&
             !std::holds_alternative<bool>(scalar->value)) {
    return c.Error(fmt::format("its attribute '{}' must be a number", name));
  }
  return result;
}

// self op other, where either may be a Python number (attribute "other", or
// "self" for `1 - x`, which core ATen writes as sub.Tensor(1, x)), not both.
absl::Status Binary(const InferContext& c, Types* out, bool true_division) {
  const TensorType* self = c.inputs.empty() ? nullptr : c.inputs[0];
  const TensorType* other = c.inputs.size() > 1 ? c.inputs[1] : nullptr;
  TensorType result;
  if (self != nullptr && other != nullptr) {
    auto shape = Broadcast(c, {&self->shape, &other->shape});
    if (!shape.ok()) return shape.status();
    result.shape = *shape;
    result.dtype = Promote(self->dtype, other->dtype);
  } else if (self != nullptr || other != nullptr) {
    auto mixed = self != nullptr ? WithNumber(c, *self, "other") : WithNumber(c, *other, "self");
    if (!mixed.ok()) return mixed.status();
    result = *mixed;
  } else {
    return RequireInput(c, 0, "self");
  }
  if (true_division && !IsFloat(result.dtype)) result.dtype = TERN_DTYPE_F32;
  out->push_back(std::move(result));
  return absl::OkStatus();
}

absl::Status Arithmetic(const InferContext& c, Types* out) { return Binary(c, out, false); }
absl::Status Division(const InferContext& c, Types* out) { return Binary(c, out, true); }

absl::Status Comparison(const InferContext& c, Types* out) {
  if (auto s = Binary(c, out, false); !s.ok()) return s;
  out->back().dtype = TERN_DTYPE_BOOL;
  return absl::OkStatus();
}

absl::Status PowScalar(const InferContext& c, Types* out) {
  auto exponent = c.Float("exponent", 1.0);
  if (!exponent.ok()) return exponent.status();
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  // As PyTorch: an integer exponent keeps an integer tensor's dtype (bool
  // becomes i64); a float exponent gives f32.
  const Attribute* attr = FindAttr(c.node, "exponent");
  if (!IsFloat(c.inputs[0]->dtype) && attr != nullptr &&
      std::holds_alternative<int64_t>(attr->value)) {
    TensorType t = *c.inputs[0];
    if (t.dtype == TERN_DTYPE_BOOL) t.dtype = TERN_DTYPE_I64;
    out->push_back(std::move(t));
    return absl::OkStatus();
  }
  return FloatUnary(c, out);
}

absl::Status Where(const InferContext& c, Types* out) {
  for (size_t i = 0; i < 3; ++i) {
    if (auto s = RequireInput(c, i, i == 0 ? "condition" : i == 1 ? "self" : "other"); !s.ok()) {
      return s;
    }
  }
  if (c.inputs[0]->dtype != TERN_DTYPE_BOOL) {
    return c.Error(fmt::format("its condition has dtype {}; it must be bool",
                               tern_dtype_name(c.inputs[0]->dtype)));
  }
  auto shape = Broadcast(c, {&c.inputs[0]->shape, &c.inputs[1]->shape, &c.inputs[2]->shape});
  if (!shape.ok()) return shape.status();
  out->push_back({Promote(c.inputs[1]->dtype, c.inputs[2]->dtype), *shape});
  return absl::OkStatus();
}

absl::Status MatmulOperands(const InferContext& c, const TensorType& a, const TensorType& b,
                            size_t rank) {
  if (a.shape.size() != rank || b.shape.size() != rank) {
    return c.Error(fmt::format("its operands have shapes {} and {}; both must have rank {}",
                               Shp(c, a.shape), Shp(c, b.shape), rank));
  }
  if (a.dtype != b.dtype) {
    return c.Error(fmt::format("its operands have dtypes {} and {}; they must match",
                               tern_dtype_name(a.dtype), tern_dtype_name(b.dtype)));
  }
  if (a.shape[rank - 1] != b.shape[rank - 2]) {
    return c.Error(fmt::format("shapes {} and {} cannot be multiplied (inner dims {} and {})",
                               Shp(c, a.shape), Shp(c, b.shape),
                               a.shape[rank - 1].ToString(c.graph.symbols),
                               b.shape[rank - 2].ToString(c.graph.symbols)));
  }
  if (rank == 3 && a.shape[0] != b.shape[0]) {
    return c.Error(fmt::format("batch dims of {} and {} differ", Shp(c, a.shape), Shp(c, b.shape)));
  }
  return absl::OkStatus();
}

absl::Status Mm(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "mat2"); !s.ok()) return s;
  const TensorType &a = *c.inputs[0], &b = *c.inputs[1];
  if (auto s = MatmulOperands(c, a, b, 2); !s.ok()) return s;
  out->push_back({a.dtype, {a.shape[0], b.shape[1]}});
  return absl::OkStatus();
}

absl::Status Bmm(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "mat2"); !s.ok()) return s;
  const TensorType &a = *c.inputs[0], &b = *c.inputs[1];
  if (auto s = MatmulOperands(c, a, b, 3); !s.ok()) return s;
  out->push_back({a.dtype, {a.shape[0], a.shape[1], b.shape[2]}});
  return absl::OkStatus();
}

absl::Status Addmm(const InferContext& c, Types* out) {
  for (size_t i = 0; i < 3; ++i) {
    if (auto s = RequireInput(c, i,
                              i == 0   ? "self (the bias)"
                              : i == 1 ? "mat1"
                                       : "mat2");
        !s.ok()) {
      return s;
    }
  }
  const TensorType &bias = *c.inputs[0], &a = *c.inputs[1], &b = *c.inputs[2];
  if (auto s = MatmulOperands(c, a, b, 2); !s.ok()) return s;
  const Shape product = {a.shape[0], b.shape[1]};
  auto shape = Broadcast(c, {&bias.shape, &product});
  if (!shape.ok()) return shape.status();
  if (*shape != product) {
    return c.Error(fmt::format("its bias of shape {} does not broadcast to the product's {}",
                               Shp(c, bias.shape), Shp(c, product)));
  }
  for (const char* name : {"alpha", "beta"}) {
    if (auto v = c.Float(name, 1.0); !v.ok()) return v.status();
  }
  out->push_back({a.dtype, product});
  return absl::OkStatus();
}

absl::Status View(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  auto size = c.ShapeAttr("size");
  if (!size.ok()) return size.status();
  Shape shape = *size;
  const auto total = Elements(self.shape);
  if (!total) {
    return c.Error(
        fmt::format("its input {} has more than one symbolic dim; a view of it "
                    "cannot be checked",
                    Shp(c, self.shape)));
  }
  // One dim may be -1: what the others leave.
  int inferred = -1;
  Shape known;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i].constant() == -1) {
      if (inferred >= 0) return c.Error("its size has more than one -1");
      inferred = static_cast<int>(i);
      continue;
    }
    if (shape[i].Min(c.graph.symbols) < 0) {
      return c.Error(fmt::format("its size {} has a negative dim", Shp(c, shape)));
    }
    known.push_back(shape[i]);
  }
  const auto known_total = Elements(known);
  if (!known_total) return c.Error("its size has more than one symbolic dim");
  if (inferred >= 0) {
    std::optional<Dim> rest;
    if (known_total->is_constant() && *known_total->constant() != 0) {
      rest = total->DividedBy(*known_total->constant());
    } else if (!known_total->is_constant() && !total->is_constant() &&
               known_total->symbol() == total->symbol() &&
               total->factor() % known_total->factor() == 0) {
      // (k*c)*s + k*d over c*s + d: the constant k.
      const int64_t k = total->factor() / known_total->factor();
      if (k * known_total->offset() == total->offset()) rest = Dim::Constant(k);
    }
    if (!rest) {
      return c.Error(fmt::format(
          "its size {} cannot be completed: {} elements do not divide "
          "into {}",
          Shp(c, shape), total->ToString(c.graph.symbols), known_total->ToString(c.graph.symbols)));
    }
    shape[static_cast<size_t>(inferred)] = *rest;
  } else if (*known_total != *total) {
    return c.Error(
        fmt::format("it views {} ({} elements) as {} ({} elements); the counts must "
                    "match",
                    Shp(c, self.shape), total->ToString(c.graph.symbols), Shp(c, shape),
                    known_total->ToString(c.graph.symbols)));
  }
  out->push_back({self.dtype, shape});
  return absl::OkStatus();
}

absl::Status Permute(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  auto dims = c.Ints("dims", {});
  if (!dims.ok()) return dims.status();
  if (dims->size() != self.shape.size()) {
    return c.Error(
        fmt::format("it has {} dims for a tensor of rank {}", dims->size(), self.shape.size()));
  }
  std::vector<bool> seen(self.shape.size(), false);
  Shape shape;
  for (int64_t d : *dims) {
    auto n = NormalizeDim(c, d, self.shape.size());
    if (!n.ok()) return n.status();
    if (seen[static_cast<size_t>(*n)]) return c.Error(fmt::format("dim {} appears twice", d));
    seen[static_cast<size_t>(*n)] = true;
    shape.push_back(self.shape[static_cast<size_t>(*n)]);
  }
  out->push_back({self.dtype, shape});
  return absl::OkStatus();
}

absl::Status Expand(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  auto size = c.ShapeAttr("size");
  if (!size.ok()) return size.status();
  if (size->size() < self.shape.size()) {
    return c.Error(fmt::format("it expands {} to {}, which has fewer dims", Shp(c, self.shape),
                               Shp(c, *size)));
  }
  Shape shape = *size;
  const size_t lead = shape.size() - self.shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i].constant() == -1) return c.Error("a new leading dim cannot be -1");
      continue;
    }
    const Dim& from = self.shape[i - lead];
    if (shape[i].constant() == -1) {
      shape[i] = from;
    } else if (from != shape[i] && from.constant() != 1) {
      return c.Error(fmt::format("it expands {} to {}: dim {} is {}, not 1", Shp(c, self.shape),
                                 Shp(c, *size), i - lead, from.ToString(c.graph.symbols)));
    }
  }
  out->push_back({self.dtype, shape});
  return absl::OkStatus();
}

absl::Status Unsqueeze(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  auto dim = c.Int("dim", 0);
  if (!dim.ok()) return dim.status();
  auto n = NormalizeDim(c, *dim, t.shape.size(), 1);
  if (!n.ok()) return n.status();
  t.shape.insert(t.shape.begin() + *n, Dim::Constant(1));
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status SqueezeDims(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  auto dims = c.Ints("dim", {});
  if (!dims.ok()) return dims.status();
  std::vector<bool> drop(self.shape.size(), false);
  for (int64_t d : *dims) {
    auto n = NormalizeDim(c, d, self.shape.size());
    if (!n.ok()) return n.status();
    if (self.shape.empty()) continue;  // rank 0: dim 0 (or -1) leaves it as it is
    // Like PyTorch: a listed dim that is not 1 stays.
    if (self.shape[static_cast<size_t>(*n)].constant() == 1) drop[static_cast<size_t>(*n)] = true;
  }
  TensorType t{self.dtype, {}};
  for (size_t i = 0; i < self.shape.size(); ++i) {
    if (!drop[i]) t.shape.push_back(self.shape[i]);
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Slice(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  if (t.shape.empty()) return c.Error("it slices a tensor of rank 0");
  auto dim = c.Int("dim", 0);
  auto start = c.Int("start", 0);
  auto end = c.Int("end", std::numeric_limits<int64_t>::max());
  auto step = c.Int("step", 1);
  for (const auto* v : {&dim, &start, &end, &step}) {
    if (!v->ok()) return v->status();
  }
  if (*step < 1) return c.Error(fmt::format("its step {} must be at least 1", *step));
  auto n = NormalizeDim(c, *dim, t.shape.size());
  if (!n.ok()) return n.status();
  Dim& size = t.shape[static_cast<size_t>(*n)];
  if (auto length = size.constant()) {
    auto clamp = [&](int64_t v) {
      if (v < 0) v += *length;
      return std::clamp<int64_t>(v, 0, *length);
    };
    const int64_t b = clamp(*start), e = clamp(*end);
    size = Dim::Constant(e > b ? (e - b - 1) / *step + 1 : 0);
  } else if (*start >= 0 && *step == 1 && *end >= size.Max(c.graph.symbols) &&
             *start <= size.Min(c.graph.symbols)) {
    size = *size.Plus(-*start);  // [start, end of a symbolic dim); start <= Min: no overflow
  } else if (*start >= 0 && *end >= 0 && *step == 1 && *end <= size.Min(c.graph.symbols) &&
             *start <= *end) {
    size = Dim::Constant(*end - *start);  // inside the smallest size
  } else {
    return c.Error(
        fmt::format("it slices the symbolic dim {} with start {}, end {}, step {}, "
                    "which the compiler cannot express",
                    size.ToString(c.graph.symbols), *start, *end, *step));
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Select(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  if (t.shape.empty()) return c.Error("it selects from a tensor of rank 0");
  auto dim = c.Int("dim", 0);
  auto index = c.Int("index", 0);
  if (!dim.ok()) return dim.status();
  if (!index.ok()) return index.status();
  auto n = NormalizeDim(c, *dim, t.shape.size());
  if (!n.ok()) return n.status();
  const Dim& size = t.shape[static_cast<size_t>(*n)];
  const int64_t low = size.Min(c.graph.symbols);
  if (*index >= low || *index < -low) {
    return c.Error(fmt::format("index {} is out of range for dim {} of size {}", *index, *n,
                               size.ToString(c.graph.symbols)));
  }
  t.shape.erase(t.shape.begin() + *n);
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status ToCopy(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  auto dtype = c.DType("dtype");
  if (!dtype.ok()) return dtype.status();
  if (*dtype) t.dtype = **dtype;
  out->push_back(std::move(t));
  return absl::OkStatus();
}

// sum.dim_IntList, mean.dim, amax: `dim` (empty: every dim) and `keepdim`.
absl::Status Reduce(const InferContext& c, Types* out, bool float_only) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  if (float_only) {
    if (auto s = RequireFloat(c, self, "input"); !s.ok()) return s;
  }
  auto dims = c.Ints("dim", {});
  auto keepdim = c.Bool("keepdim", false);
  if (!dims.ok()) return dims.status();
  if (!keepdim.ok()) return keepdim.status();
  std::vector<bool> reduced(self.shape.size(), dims->empty());
  for (int64_t d : *dims) {
    auto n = NormalizeDim(c, d, self.shape.size());
    if (!n.ok()) return n.status();
    if (self.shape.empty()) continue;  // rank 0: dim 0 (or -1) is the tensor itself
    if (reduced[static_cast<size_t>(*n)]) return c.Error(fmt::format("dim {} appears twice", d));
    reduced[static_cast<size_t>(*n)] = true;
  }
  TensorType t{self.dtype, {}};
  auto dtype = c.DType("dtype");
  if (!dtype.ok()) return dtype.status();
  if (*dtype) t.dtype = **dtype;
  for (size_t i = 0; i < self.shape.size(); ++i) {
    if (!reduced[i]) {
      t.shape.push_back(self.shape[i]);
    } else if (*keepdim) {
      t.shape.push_back(Dim::Constant(1));
    }
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Sum(const InferContext& c, Types* out) { return Reduce(c, out, false); }

// sum.dim_IntList: as PyTorch, an integer or bool tensor sums to i64 unless
// `dtype` says otherwise.
absl::Status SumDims(const InferContext& c, Types* out) {
  if (auto s = Reduce(c, out, false); !s.ok()) return s;
  auto dtype = c.DType("dtype");
  if (!dtype.ok()) return dtype.status();
  if (!*dtype && !IsFloat(c.inputs[0]->dtype)) out->back().dtype = TERN_DTYPE_I64;
  return absl::OkStatus();
}

absl::Status AnyDim(const InferContext& c, Types* out) {
  if (auto s = Reduce(c, out, false); !s.ok()) return s;
  out->back().dtype = TERN_DTYPE_BOOL;
  return absl::OkStatus();
}

absl::Status LogicalNot(const InferContext& c, Types* out) {
  if (auto s = SameAsInput(c, out); !s.ok()) return s;
  out->back().dtype = TERN_DTYPE_BOOL;
  return absl::OkStatus();
}

// Two tensors of any dtypes, broadcast; the result is bool (logical_and,
// logical_or: a non-zero element, NaN included, is true).
absl::Status Logical(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "other"); !s.ok()) return s;
  auto shape = Broadcast(c, {&c.inputs[0]->shape, &c.inputs[1]->shape});
  if (!shape.ok()) return shape.status();
  out->push_back({TERN_DTYPE_BOOL, *shape});
  return absl::OkStatus();
}

// The bitwise ops take integer and bool tensors only, as in PyTorch (and the
// ISA's bitwise functions).
absl::Status RequireIntegerOrBool(const InferContext& c, const TensorType& t, const char* what) {
  if (IsFloat(t.dtype)) {
    return c.Error(fmt::format("its {} has dtype {}; bitwise ops take integer or bool tensors",
                               what, tern_dtype_name(t.dtype)));
  }
  return absl::OkStatus();
}

// bitwise_and, bitwise_or: two integer or bool tensors, broadcast and
// promoted (bool with an integer gives the integer).
absl::Status Bitwise(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "other"); !s.ok()) return s;
  if (auto s = RequireIntegerOrBool(c, *c.inputs[0], "self"); !s.ok()) return s;
  if (auto s = RequireIntegerOrBool(c, *c.inputs[1], "other"); !s.ok()) return s;
  auto shape = Broadcast(c, {&c.inputs[0]->shape, &c.inputs[1]->shape});
  if (!shape.ok()) return shape.status();
  out->push_back({Promote(c.inputs[0]->dtype, c.inputs[1]->dtype), *shape});
  return absl::OkStatus();
}

absl::Status BitwiseNot(const InferContext& c, Types* out) {
  if (auto s = SameAsInput(c, out); !s.ok()) return s;
  return RequireIntegerOrBool(c, out->back(), "input");
}

// clamp(self, min?, max?) with Python numbers as bounds. The result type is
// PyTorch's promotion of the tensor with the bounds: a float bound makes an
// integer or bool tensor f32, an integer bound makes a bool tensor i64
// (clamping bool itself is refused by PyTorch, and here).
absl::Status ClampBounds(const InferContext& c, Types* out, bool need_min, bool need_max) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  bool any = false;
  const std::pair<const char*, bool> bounds[] = {{"min", need_min}, {"max", need_max}};
  for (const auto& [name, required] : bounds) {
    const Attribute* bound = FindAttr(c.node, name);
    if (bound == nullptr) {
      if (required) return c.Error(fmt::format("its number attribute '{}' is missing", name));
      continue;
    }
    any = true;
    if (std::holds_alternative<double>(bound->value)) {
      if (!IsFloat(t.dtype)) t.dtype = TERN_DTYPE_F32;
    } else if (std::holds_alternative<int64_t>(bound->value)) {
      if (t.dtype == TERN_DTYPE_BOOL) t.dtype = TERN_DTYPE_I64;
    } else if (!std::holds_alternative<bool>(bound->value)) {
      return c.Error(fmt::format(
          "its attribute '{}' must be a number (clamp with tensor bounds is clamp.Tensor)", name));
    }
  }
  if (!any) return c.Error("it has neither 'min' nor 'max'; clamp needs at least one of them");
  if (t.dtype == TERN_DTYPE_BOOL) {
    return c.Error("it clamps a bool tensor with bool bounds, which PyTorch does not do either");
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Clamp(const InferContext& c, Types* out) { return ClampBounds(c, out, false, false); }
absl::Status ClampMin(const InferContext& c, Types* out) {
  return ClampBounds(c, out, true, false);
}
absl::Status ClampMax(const InferContext& c, Types* out) {
  return ClampBounds(c, out, false, true);
}

// constant_pad_nd(self, pad, value=0): `pad` holds (before, after) pairs
// starting from the last dim; negative amounts crop, as in PyTorch.
absl::Status ConstantPadNd(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  TensorType t = *c.inputs[0];
  auto pad = c.Ints("pad", {});
  if (!pad.ok()) return pad.status();
  if (pad->size() % 2 != 0 || pad->size() > 2 * t.shape.size()) {
    return c.Error(fmt::format(
        "its pad has {} values; it takes (before, after) pairs for at most the {} dims of {}",
        pad->size(), t.shape.size(), Shp(c, t.shape)));
  }
  const Attribute* value = FindAttr(c.node, "value");
  if (value != nullptr && !std::holds_alternative<double>(value->value) &&
      !std::holds_alternative<int64_t>(value->value) &&
      !std::holds_alternative<bool>(value->value)) {
    return c.Error("its attribute 'value' must be a number");
  }
  for (size_t pair = 0; pair < pad->size() / 2; ++pair) {
    Dim& size = t.shape[t.shape.size() - 1 - pair];
    const int64_t before = (*pad)[2 * pair], after = (*pad)[2 * pair + 1];
    int64_t total = 0;
    std::optional<Dim> padded;
    if (!__builtin_add_overflow(before, after, &total)) padded = size.Plus(total);
    if (!padded.has_value() || padded->Min(c.graph.symbols) < 0) {
      return c.Error(fmt::format("its pad ({}, {}) makes dim {} of size {} negative", before, after,
                                 t.shape.size() - 1 - pair, size.ToString(c.graph.symbols)));
    }
    size = *padded;
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

// An index tensor of gather-like ops: i64 or i32 (a bool mask would select
// a data-dependent number of elements).
absl::Status RequireIndexDtype(const InferContext& c, const TensorType& index, const char* what) {
  if (index.dtype != TERN_DTYPE_I64 && index.dtype != TERN_DTYPE_I32) {
    return c.Error(fmt::format("its {} has dtype {}; it must be i64 or i32", what,
                               tern_dtype_name(index.dtype)));
  }
  return absl::OkStatus();
}

// scatter.value(self, dim, index, value): self with `value` written where
// index points along dim; index has self's rank and no larger dims elsewhere.
absl::Status ScatterValue(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "index"); !s.ok()) return s;
  const TensorType &self = *c.inputs[0], &index = *c.inputs[1];
  auto dim = c.Int("dim", 0);
  if (!dim.ok()) return dim.status();
  auto n = NormalizeDim(c, *dim, self.shape.size());
  if (!n.ok()) return n.status();
  if (auto s = RequireIndexDtype(c, index, "index"); !s.ok()) return s;
  const Attribute* value = FindAttr(c.node, "value");
  if (value == nullptr || (!std::holds_alternative<double>(value->value) &&
                           !std::holds_alternative<int64_t>(value->value) &&
                           !std::holds_alternative<bool>(value->value))) {
    return c.Error("its attribute 'value' must be a number");
  }
  // As PyTorch, a 0-d input or index counts as 1-d.
  if (std::max<size_t>(index.shape.size(), 1) != std::max<size_t>(self.shape.size(), 1)) {
    return c.Error(fmt::format("its index {} and input {} differ in rank", Shp(c, index.shape),
                               Shp(c, self.shape)));
  }
  for (size_t d = 0; d < index.shape.size() && d < self.shape.size(); ++d) {
    if (static_cast<int64_t>(d) != *n &&
        index.shape[d].Max(c.graph.symbols) > self.shape[d].Min(c.graph.symbols)) {
      return c.Error(fmt::format("its index {} is larger than its input {} in dim {}",
                                 Shp(c, index.shape), Shp(c, self.shape), d));
    }
  }
  out->push_back(self);
  return absl::OkStatus();
}

// index_put(self, indices, values, accumulate): only the form of an
// embedding's backward, index_put(zeros, [index], values, accumulate=True):
// one integer index on dim 0, values added at the indexed rows (duplicates
// sum). Inputs: self, the index, values.
absl::Status IndexPut(const InferContext& c, Types* out) {
  if (c.inputs.size() != 3 || c.inputs[1] == nullptr) {
    return c.Error(
        "it indexes with several tensors or not on dim 0, which the compiler does not lower "
        "yet; only index_put with one index tensor on dim 0 (x[index] += values) is supported");
  }
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 2, "values"); !s.ok()) return s;
  const TensorType &self = *c.inputs[0], &index = *c.inputs[1], &values = *c.inputs[2];
  auto accumulate = c.Bool("accumulate", false);
  if (!accumulate.ok()) return accumulate.status();
  if (!*accumulate) {
    return c.Error(
        "it has accumulate=False, which the compiler does not lower yet (PyTorch leaves its "
        "result with repeated indices undefined); only accumulate=True (x[index] += values) is "
        "supported");
  }
  if (index.dtype == TERN_DTYPE_BOOL) {
    return c.Error(
        "its index is a bool mask, which the compiler does not lower yet (it selects a "
        "data-dependent number of rows); index with i64 or i32 positions");
  }
  if (auto s = RequireIndexDtype(c, index, "index"); !s.ok()) return s;
  if (self.shape.empty() || self.dtype == TERN_DTYPE_BOOL) {
    return c.Error(fmt::format(
        "its input is {} {}, which the compiler does not lower yet: it must have rank 1 or "
        "more and not be bool (scatter_add does not take bool)",
        tern_dtype_name(self.dtype), Shp(c, self.shape)));
  }
  if (values.dtype != self.dtype) {
    return c.Error(fmt::format("its values are {} and its input {}; they must match",
                               tern_dtype_name(values.dtype), tern_dtype_name(self.dtype)));
  }
  // values broadcast to index.shape + self.shape[1:], one slice per index.
  Shape updates = index.shape;
  updates.insert(updates.end(), self.shape.begin() + 1, self.shape.end());
  auto shape = Broadcast(c, {&values.shape, &updates});
  if (!shape.ok() || *shape != updates) {
    return c.Error(fmt::format("its values {} do not broadcast to {} (index {} and input {})",
                               Shp(c, values.shape), Shp(c, updates), Shp(c, index.shape),
                               Shp(c, self.shape)));
  }
  out->push_back(self);
  return absl::OkStatus();
}

// full_like(self, fill_value, dtype?): self's shape.
absl::Status FullLike(const InferContext& c, Types* out) {
  if (auto s = ToCopy(c, out); !s.ok()) return s;
  const Attribute* fill = FindAttr(c.node, "fill_value");
  if (fill == nullptr || (!std::holds_alternative<double>(fill->value) &&
                          !std::holds_alternative<int64_t>(fill->value) &&
                          !std::holds_alternative<bool>(fill->value))) {
    return c.Error("its attribute 'fill_value' must be a number");
  }
  return absl::OkStatus();
}

// gather(self, dim, index): index's shape, self's dtype.
absl::Status Gather(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "index"); !s.ok()) return s;
  const TensorType &self = *c.inputs[0], &index = *c.inputs[1];
  auto dim = c.Int("dim", 0);
  if (!dim.ok()) return dim.status();
  if (auto n = NormalizeDim(c, *dim, self.shape.size()); !n.ok()) return n.status();
  if (index.dtype != TERN_DTYPE_I64 && index.dtype != TERN_DTYPE_I32) {
    return c.Error(
        fmt::format("its index has dtype {}; it must be i64 or i32", tern_dtype_name(index.dtype)));
  }
  // As PyTorch, a 0-d input or index counts as 1-d.
  if (std::max<size_t>(index.shape.size(), 1) != std::max<size_t>(self.shape.size(), 1)) {
    return c.Error(fmt::format("its index {} and input {} differ in rank", Shp(c, index.shape),
                               Shp(c, self.shape)));
  }
  out->push_back({self.dtype, index.shape});
  return absl::OkStatus();
}
absl::Status Mean(const InferContext& c, Types* out) { return Reduce(c, out, true); }

absl::Status Softmax(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  if (auto s = RequireFloat(c, self, "input"); !s.ok()) return s;
  auto dim = c.Int("dim", 0);
  auto half = c.Bool("half_to_float", false);
  if (!dim.ok()) return dim.status();
  if (!half.ok()) return half.status();
  if (auto n = NormalizeDim(c, *dim, self.shape.size()); !n.ok()) return n.status();
  TensorType t = self;
  if (*half) t.dtype = TERN_DTYPE_F32;
  out->push_back(std::move(t));
  return absl::OkStatus();
}

// The last dims of a normalisation's input that its normalized_shape
// attribute names (layer_norm, rms_norm), checking that they match; and
// that eps, when given, is a number.
absl::StatusOr<Shape> NormalizedDims(const InferContext& c, const TensorType& input) {
  auto normalized = c.Ints("normalized_shape", {});
  auto eps = c.Float("eps", 0.0);
  if (!normalized.ok()) return normalized.status();
  if (!eps.ok()) return eps.status();
  const size_t k = normalized->size();
  if (k == 0 || k > input.shape.size()) {
    return c.Error(fmt::format("its normalized_shape has {} dims for an input of rank {}", k,
                               input.shape.size()));
  }
  Shape last(input.shape.end() - static_cast<ptrdiff_t>(k), input.shape.end());
  for (size_t i = 0; i < k; ++i) {
    if (last[i] != Dim::Constant((*normalized)[i])) {
      return c.Error(fmt::format("its normalized_shape does not match the input's last dims {}",
                                 Shp(c, last)));
    }
  }
  return last;
}

absl::Status LayerNorm(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  const TensorType& input = *c.inputs[0];
  if (auto s = RequireFloat(c, input, "input"); !s.ok()) return s;
  absl::StatusOr<Shape> normalized = NormalizedDims(c, input);
  if (!normalized.ok()) return normalized.status();
  const Shape& last = *normalized;
  const size_t k = last.size();
  for (size_t i = 1; i < 3 && i < c.inputs.size(); ++i) {
    if (c.inputs[i] != nullptr && c.inputs[i]->shape != last) {
      return c.Error(fmt::format("its {} has shape {}; it must be {}", i == 1 ? "weight" : "bias",
                                 Shp(c, c.inputs[i]->shape), Shp(c, last)));
    }
  }
  Shape stats(input.shape.begin(), input.shape.end() - static_cast<ptrdiff_t>(k));
  stats.insert(stats.end(), k, Dim::Constant(1));
  out->push_back(input);
  out->push_back({TERN_DTYPE_F32, stats});
  out->push_back({TERN_DTYPE_F32, stats});
  return absl::OkStatus();
}

// rms_norm(input, normalized_shape, weight?, eps?) (aten.rms_norm, which
// the core ATen decompositions write out; the pattern pass, patterns.h, puts
// it back): the input's type. Without eps, PyTorch uses the dtype's epsilon.
absl::Status RmsNorm(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  const TensorType& input = *c.inputs[0];
  if (auto s = RequireFloat(c, input, "input"); !s.ok()) return s;
  absl::StatusOr<Shape> normalized = NormalizedDims(c, input);
  if (!normalized.ok()) return normalized.status();
  const Shape& last = *normalized;
  if (c.inputs.size() > 1 && c.inputs[1] != nullptr && c.inputs[1]->shape != last) {
    return c.Error(fmt::format("its weight has shape {}; it must be {}", Shp(c, c.inputs[1]->shape),
                               Shp(c, last)));
  }
  out->push_back(input);
  return absl::OkStatus();
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
// weight?, bias?, output_mask): inputs grad_out, input, mean, rstd, weight?,
// bias?; outputs (grad_input, grad_weight, grad_bias) with the types of the
// input, weight and bias, as PyTorch. An output that output_mask leaves out,
// and grad_weight (grad_bias) without a weight (bias), is None in PyTorch:
// here an empty [0] tensor of the input's dtype that lowering never computes.
absl::Status LayerNormBackward(const InferContext& c, Types* out) {
  static const char* const kNames[] = {"grad_out", "input", "mean", "rstd", "weight", "bias"};
  for (size_t i = 0; i < 4; ++i) {
    if (auto s = RequireInput(c, i, kNames[i]); !s.ok()) return s;
  }
  const TensorType &grad = *c.inputs[0], &input = *c.inputs[1];
  if (auto s = RequireFloat(c, input, "input"); !s.ok()) return s;
  if (grad.shape != input.shape || grad.dtype != input.dtype) {
    return c.Error(fmt::format("its grad_out is {} {} but its input {} {}; they must match",
                               tern_dtype_name(grad.dtype), Shp(c, grad.shape),
                               tern_dtype_name(input.dtype), Shp(c, input.shape)));
  }
  absl::StatusOr<Shape> normalized = NormalizedDims(c, input);
  if (!normalized.ok()) return normalized.status();
  const Shape& last = *normalized;
  const size_t k = last.size();
  // mean and rstd as native_layer_norm makes them (the leading shape with
  // k dims of size 1), or the leading shape itself.
  const Shape leading(input.shape.begin(), input.shape.end() - static_cast<ptrdiff_t>(k));
  Shape stats = leading;
  stats.insert(stats.end(), k, Dim::Constant(1));
  for (size_t i = 2; i < 4; ++i) {
    const TensorType& t = *c.inputs[i];
    if (auto s = RequireFloat(c, t, kNames[i]); !s.ok()) return s;
    if (t.shape != stats && t.shape != leading) {
      return c.Error(fmt::format("its {} has shape {}; it must be {} (or {})", kNames[i],
                                 Shp(c, t.shape), Shp(c, stats), Shp(c, leading)));
    }
  }
  for (size_t i = 4; i < 6 && i < c.inputs.size(); ++i) {
    const TensorType* t = c.inputs[i];
    if (t != nullptr && (t->shape != last || !IsFloat(t->dtype))) {
      return c.Error(fmt::format("its {} is {} {}; it must be a float {}", kNames[i],
                                 tern_dtype_name(t->dtype), Shp(c, t->shape), Shp(c, last)));
    }
  }
  absl::StatusOr<std::vector<bool>> mask = c.Flags("output_mask", 3);
  if (!mask.ok()) return mask.status();
  const TensorType* weight = c.inputs.size() > 4 ? c.inputs[4] : nullptr;
  const TensorType* bias = c.inputs.size() > 5 ? c.inputs[5] : nullptr;
  const TensorType absent{input.dtype, {Dim::Constant(0)}};
  out->push_back((*mask)[0] ? input : absent);
  out->push_back((*mask)[1] && weight != nullptr ? *weight : absent);
  out->push_back((*mask)[2] && bias != nullptr ? *bias : absent);
  return absl::OkStatus();
}

// _softmax_backward_data, _log_softmax_backward_data(grad_output, output,
// dim, input_dtype): the input's gradient, of input_dtype (the softmax's
// input dtype; grad_output's when absent).
absl::Status SoftmaxBackward(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "grad_output"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "output"); !s.ok()) return s;
  const TensorType &grad = *c.inputs[0], &output = *c.inputs[1];
  if (auto s = RequireFloat(c, grad, "grad_output"); !s.ok()) return s;
  if (grad.shape != output.shape || grad.dtype != output.dtype) {
    return c.Error(fmt::format("its grad_output is {} {} but its output {} {}; they must match",
                               tern_dtype_name(grad.dtype), Shp(c, grad.shape),
                               tern_dtype_name(output.dtype), Shp(c, output.shape)));
  }
  auto dim = c.Int("dim", 0);
  if (!dim.ok()) return dim.status();
  if (auto n = NormalizeDim(c, *dim, grad.shape.size()); !n.ok()) return n.status();
  auto dtype = c.DType("input_dtype");
  if (!dtype.ok()) return dtype.status();
  TensorType t = grad;
  if (*dtype) {
    if (!IsFloat(**dtype)) {
      return c.Error(fmt::format("its input_dtype is {}; a softmax's input is f32, bf16 or f16",
                                 tern_dtype_name(**dtype)));
    }
    t.dtype = **dtype;
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

// The backward functions of activations, (grad_output, x) with x the
// forward's input (gelu_backward, silu_backward, threshold_backward) or
// output (tanh_backward, sigmoid_backward): broadcast and promoted as a
// binary op, as PyTorch; float results only (gradients are).
absl::Status ActivationBackward(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "grad_output"); !s.ok()) return s;
  const bool of_output =
      c.node.op == "aten.tanh_backward.default" || c.node.op == "aten.sigmoid_backward.default";
  if (auto s = RequireInput(c, 1, of_output ? "output" : "self"); !s.ok()) return s;
  const TensorType &grad = *c.inputs[0], &x = *c.inputs[1];
  auto shape = Broadcast(c, {&grad.shape, &x.shape});
  if (!shape.ok()) return shape.status();
  TensorType t{Promote(grad.dtype, x.dtype), *shape};
  if (!IsFloat(t.dtype)) {
    return c.Error(fmt::format(
        "its grad_output is {} and its {} {}; a gradient is f32, bf16 or f16",
        tern_dtype_name(grad.dtype), of_output ? "output" : "self", tern_dtype_name(x.dtype)));
  }
  if (c.node.op == "aten.gelu_backward.default") {
    auto approximate = c.String("approximate", "none");
    if (!approximate.ok()) return approximate.status();
    if (*approximate != "none" && *approximate != "tanh") {
      return c.Error(
          fmt::format("its approximate is '{}'; gelu takes 'none' or 'tanh'", *approximate));
    }
  }
  if (c.node.op == "aten.threshold_backward.default") {
    const Attribute* threshold = FindAttr(c.node, "threshold");
    if (threshold == nullptr || (!std::holds_alternative<double>(threshold->value) &&
                                 !std::holds_alternative<int64_t>(threshold->value) &&
                                 !std::holds_alternative<bool>(threshold->value))) {
      return c.Error("its attribute 'threshold' must be a number");
    }
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Embedding(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "weight"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "indices"); !s.ok()) return s;
  const TensorType &weight = *c.inputs[0], &indices = *c.inputs[1];
  if (weight.shape.size() != 2) {
    return c.Error(fmt::format("its weight has shape {}; it must be 2-D", Shp(c, weight.shape)));
  }
  if (indices.dtype != TERN_DTYPE_I64 && indices.dtype != TERN_DTYPE_I32) {
    return c.Error(fmt::format("its indices have dtype {}; they must be i64 or i32",
                               tern_dtype_name(indices.dtype)));
  }
  TensorType t{weight.dtype, indices.shape};
  t.shape.push_back(weight.shape[1]);
  out->push_back(std::move(t));
  return absl::OkStatus();
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq): the weight's gradient [num_weights, D], grad_output
// being indices.shape + [D]. scale_grad_by_freq (a division by each index's
// count) is not lowered yet.
absl::Status EmbeddingDenseBackward(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "grad_output"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "indices"); !s.ok()) return s;
  const TensorType &grad = *c.inputs[0], &indices = *c.inputs[1];
  if (auto s = RequireFloat(c, grad, "grad_output"); !s.ok()) return s;
  if (auto s = RequireIndexDtype(c, indices, "indices"); !s.ok()) return s;
  if (grad.shape.size() != indices.shape.size() + 1 ||
      !std::equal(indices.shape.begin(), indices.shape.end(), grad.shape.begin())) {
    return c.Error(fmt::format("its grad_output {} is not its indices' shape {} and one more dim",
                               Shp(c, grad.shape), Shp(c, indices.shape)));
  }
  auto num_weights = c.Int("num_weights", -1);
  auto padding_idx = c.Int("padding_idx", -1);
  auto scale = c.Bool("scale_grad_by_freq", false);
  if (!num_weights.ok()) return num_weights.status();
  if (!padding_idx.ok()) return padding_idx.status();
  if (!scale.ok()) return scale.status();
  if (*num_weights < 0) {
    return c.Error(fmt::format("its num_weights is {}; it must be given, >= 0", *num_weights));
  }
  if (*scale) {
    return c.Error(
        "it has scale_grad_by_freq=True, which the compiler does not lower yet; use an "
        "embedding without scale_grad_by_freq");
  }
  out->push_back({grad.dtype, {Dim::Constant(*num_weights), grad.shape.back()}});
  return absl::OkStatus();
}

absl::Status Cat(const InferContext& c, Types* out) {
  if (c.inputs.empty()) return c.Error("it concatenates no tensors");
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (auto s = RequireInput(c, i, "tensor"); !s.ok()) return s;
  }
  // As PyTorch, 1-D tensors without elements (the legacy empty tensor) are
  // skipped; the first other input gives the rank.
  auto legacy_empty = [](const TensorType& t) {
    return t.shape.size() == 1 && t.shape[0].constant() == 0;
  };
  size_t ref = 0;
  while (ref + 1 < c.inputs.size() && legacy_empty(*c.inputs[ref])) ++ref;
  const TensorType& first = *c.inputs[ref];
  auto dim = c.Int("dim", 0);
  if (!dim.ok()) return dim.status();
  auto n = NormalizeDim(c, *dim, first.shape.size());
  if (!n.ok()) return n.status();
  const size_t axis = static_cast<size_t>(*n);
  TensorType t = first;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (i == ref) continue;
    const TensorType& next = *c.inputs[i];
    t.dtype = Promote(t.dtype, next.dtype);
    if (legacy_empty(next)) continue;
    if (next.shape.size() != first.shape.size()) {
      return c.Error(fmt::format("input {} has shape {}, input {} {}: ranks differ", i,
                                 Shp(c, next.shape), ref, Shp(c, first.shape)));
    }
    for (size_t d = 0; d < first.shape.size(); ++d) {
      if (d != axis && next.shape[d] != first.shape[d]) {
        return c.Error(
            fmt::format("input {} has shape {}, input {} {}: they differ outside dim "
                        "{}",
                        i, Shp(c, next.shape), ref, Shp(c, first.shape), axis));
      }
    }
    Dim& total = t.shape[axis];
    const Dim& more = next.shape[axis];
    std::optional<Dim> sum;
    int64_t factor = 0, offset = 0;
    if (more.is_constant()) {
      sum = total.Plus(*more.constant());
    } else if (total.is_constant()) {
      sum = more.Plus(*total.constant());
    } else if (total.symbol() == more.symbol() &&
               !__builtin_add_overflow(total.factor(), more.factor(), &factor) &&
               !__builtin_add_overflow(total.offset(), more.offset(), &offset)) {
      sum = Dim::Affine(total.symbol(), factor, offset);
    } else if (total.symbol() != more.symbol()) {
      return c.Error("it concatenates along two different symbolic sizes");
    }
    if (!sum) return c.Error("its concatenated size overflows");
    total = *sum;
  }
  out->push_back(std::move(t));
  return absl::OkStatus();
}

// split_with_sizes: consecutive pieces of `split_sizes` along `dim`, each a
// view of the input.
absl::Status SplitWithSizes(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  auto sizes = c.Ints("split_sizes", {});
  auto dim = c.Int("dim", 0);
  if (!sizes.ok()) return sizes.status();
  if (!dim.ok()) return dim.status();
  auto n = NormalizeDim(c, *dim, self.shape.size());
  if (!n.ok()) return n.status();
  const Dim& whole = self.shape[static_cast<size_t>(*n)];
  int64_t total = 0;
  for (int64_t size : *sizes) {
    if (size < 0 || __builtin_add_overflow(total, size, &total)) {
      return c.Error(fmt::format("its split size {} is negative or too large", size));
    }
  }
  if (sizes->empty() || whole != Dim::Constant(total)) {
    return c.Error(fmt::format("its split sizes add up to {} but dim {} is {}", total, *n,
                               whole.ToString(c.graph.symbols)));
  }
  for (int64_t size : *sizes) {
    TensorType piece = self;
    piece.shape[static_cast<size_t>(*n)] = Dim::Constant(size);
    out->push_back(std::move(piece));
  }
  return absl::OkStatus();
}

// --- convolution and pooling -------------------------------------------------

// A 2-D window parameter (kernel, stride, padding, dilation): one value for
// both H and W, or two; `fallback` when absent.
absl::StatusOr<std::array<int64_t, 2>> Pair(const InferContext& c, const std::string& name,
                                            std::vector<int64_t> fallback, int64_t minimum) {
  auto values = c.Ints(name, std::move(fallback));
  if (!values.ok()) return values.status();
  if (values->size() == 1) values->push_back(values->front());
  if (values->size() != 2) {
    return c.Error(fmt::format("its attribute '{}' has {} values; a 2-D window takes 1 or 2", name,
                               values->size()));
  }
  for (int64_t v : *values) {
    if (v < minimum) {
      return c.Error(fmt::format("its attribute '{}' has the value {}; it must be at least {}",
                                 name, v, minimum));
    }
  }
  return std::array<int64_t, 2>{(*values)[0], (*values)[1]};
}

// PyTorch's window output size (floor mode): (in + 2p - d(k-1) - 1) / s + 1.
absl::StatusOr<Dim> WindowOutput(const InferContext& c, const Dim& in, int64_t kernel,
                                 int64_t stride, int64_t padding, int64_t dilation,
                                 const char* axis) {
  const std::optional<int64_t> size = in.constant();
  if (!size) {
    return c.Error(
        fmt::format("its input's {} is the symbolic {}; convolutions and pools take "
                    "static spatial sizes (export with static shapes)",
                    axis, in.ToString(c.graph.symbols)));
  }
  const int64_t span = *size + 2 * padding - dilation * (kernel - 1) - 1;
  if (span < 0) {
    return c.Error(
        fmt::format("its window (kernel {}, dilation {}) is larger than the padded "
                    "input {} {} + 2 * {}",
                    kernel, dilation, axis, *size, padding));
  }
  return Dim::Constant(span / stride + 1);
}

// convolution(input, weight, bias?; stride, padding, dilation, transposed,
// output_padding, groups): 2-D (NCHW input, OIHW weight) only.
absl::Status Convolution(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  if (auto s = RequireInput(c, 1, "weight"); !s.ok()) return s;
  const TensorType &input = *c.inputs[0], &weight = *c.inputs[1];
  auto transposed = c.Bool("transposed", false);
  if (!transposed.ok()) return transposed.status();
  if (*transposed) {
    return c.Error(
        "it is a transposed convolution (ConvTranspose), which the compiler does not lower yet; "
        "use a regular convolution or run this layer outside the compiled graph");
  }
  if (input.shape.size() != 4 || weight.shape.size() != 4) {
    return c.Error(fmt::format(
        "its input {} and weight {} are not 4-D: only 2-D convolutions (NCHW input, OIHW "
        "weight, nn.Conv2d) are supported; Conv1d and Conv3d are not lowered yet",
        Shp(c, input.shape), Shp(c, weight.shape)));
  }
  if (auto s = RequireFloat(c, input, "input"); !s.ok()) return s;
  if (input.dtype != weight.dtype) {
    return c.Error(fmt::format("its input is {} and its weight {}; they must match",
                               tern_dtype_name(input.dtype), tern_dtype_name(weight.dtype)));
  }
  auto stride = Pair(c, "stride", {1}, 1);
  auto padding = Pair(c, "padding", {0}, 0);
  auto dilation = Pair(c, "dilation", {1}, 1);
  auto groups = c.Int("groups", 1);
  for (const auto* v : {&stride, &padding, &dilation}) {
    if (!v->ok()) return v->status();
  }
  if (!groups.ok()) return groups.status();
  const std::optional<int64_t> channels = input.shape[1].constant();
  const std::optional<int64_t> out_channels = weight.shape[0].constant();
  const std::optional<int64_t> per_group = weight.shape[1].constant();
  if (*groups < 1 || !channels || !out_channels || !per_group || *channels % *groups != 0 ||
      *out_channels % *groups != 0 || *channels / *groups != *per_group) {
    return c.Error(fmt::format(
        "its input {} and weight {} do not fit groups={} (the weight must be [O, C/groups, KH, "
        "KW] with groups dividing C and O)",
        Shp(c, input.shape), Shp(c, weight.shape), *groups));
  }
  if (c.inputs.size() > 2 && c.inputs[2] != nullptr &&
      (c.inputs[2]->shape != Shape{weight.shape[0]} || c.inputs[2]->dtype != input.dtype)) {
    return c.Error(fmt::format("its bias is {} {}; it must be [{}] {}",
                               tern_dtype_name(c.inputs[2]->dtype), Shp(c, c.inputs[2]->shape),
                               *out_channels, tern_dtype_name(input.dtype)));
  }
  Shape shape = {input.shape[0], weight.shape[0]};
  for (size_t axis = 0; axis < 2; ++axis) {
    const std::optional<int64_t> kernel = weight.shape[2 + axis].constant();
    if (!kernel) return c.Error("its weight has a symbolic kernel size");
    auto size = WindowOutput(c, input.shape[2 + axis], *kernel, (*stride)[axis], (*padding)[axis],
                             (*dilation)[axis], axis == 0 ? "height" : "width");
    if (!size.ok()) return size.status();
    shape.push_back(*size);
  }
  out->push_back({input.dtype, std::move(shape)});
  return absl::OkStatus();
}

// convolution_backward(grad_output, input, weight; bias_sizes, stride,
// padding, dilation, transposed, output_padding, groups, output_mask):
// 2-D, non-transposed only (as convolution). Outputs (grad_input,
// grad_weight, grad_bias) with the types of the input, the weight and a [O]
// bias of grad_output's dtype; one that output_mask leaves out (None in
// PyTorch) is an empty [0] tensor of the input's dtype, never computed.
absl::Status ConvolutionBackward(const InferContext& c, Types* out) {
  static const char* const kNames[] = {"grad_output", "input", "weight"};
  for (size_t i = 0; i < 3; ++i) {
    if (auto s = RequireInput(c, i, kNames[i]); !s.ok()) return s;
  }
  auto transposed = c.Bool("transposed", false);
  if (!transposed.ok()) return transposed.status();
  if (*transposed) {
    return c.Error(
        "it is the backward of a transposed convolution (ConvTranspose), which the compiler "
        "does not lower yet; it runs outside the compiled graph");
  }
  const TensorType &grad = *c.inputs[0], &input = *c.inputs[1], &weight = *c.inputs[2];
  if (input.shape.size() != 4 || weight.shape.size() != 4) {
    return c.Error(fmt::format(
        "its input {} and weight {} are not 4-D: the compiler does not lower yet the backward "
        "of Conv1d and Conv3d, only of 2-D convolutions (NCHW input, OIHW weight)",
        Shp(c, input.shape), Shp(c, weight.shape)));
  }
  // The forward's output type, checked as convolution checks its operands.
  Types forward;
  const InferContext conv{c.graph, c.node, {c.inputs[1], c.inputs[2]}};
  if (auto s = Convolution(conv, &forward); !s.ok()) return s;
  if (grad.shape != forward[0].shape || grad.dtype != input.dtype) {
    return c.Error(fmt::format("its grad_output is {} {}; the convolution's output is {} {}",
                               tern_dtype_name(grad.dtype), Shp(c, grad.shape),
                               tern_dtype_name(forward[0].dtype), Shp(c, forward[0].shape)));
  }
  if (FindAttr(c.node, "bias_sizes") != nullptr) {
    auto bias_sizes = c.ShapeAttr("bias_sizes");
    if (!bias_sizes.ok()) return bias_sizes.status();
    if (*bias_sizes != Shape{weight.shape[0]}) {
      return c.Error(fmt::format("its bias_sizes is {}; the bias of this convolution is {}",
                                 Shp(c, *bias_sizes), Shp(c, Shape{weight.shape[0]})));
    }
  }
  absl::StatusOr<std::vector<bool>> mask = c.Flags("output_mask", 3);
  if (!mask.ok()) return mask.status();
  const TensorType absent{input.dtype, {Dim::Constant(0)}};
  out->push_back((*mask)[0] ? input : absent);
  out->push_back((*mask)[1] ? weight : absent);
  out->push_back((*mask)[2] ? TensorType{grad.dtype, {weight.shape[0]}} : absent);
  return absl::OkStatus();
}

// _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean,
// running_var; momentum, eps): batch norm in eval mode over channel dim 1.
// Outputs: the normalised input and two empty statistics ([0]).
absl::Status BatchNormInference(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "input"); !s.ok()) return s;
  if (auto s = RequireInput(c, 3, "running_mean"); !s.ok()) return s;
  if (auto s = RequireInput(c, 4, "running_var"); !s.ok()) return s;
  const TensorType& input = *c.inputs[0];
  if (auto s = RequireFloat(c, input, "input"); !s.ok()) return s;
  if (input.shape.size() < 2) {
    return c.Error(fmt::format("its input {} has no channel dim (batch norm takes [N, C, ...])",
                               Shp(c, input.shape)));
  }
  static const char* const kNames[] = {"input", "weight", "bias", "running_mean", "running_var"};
  for (size_t i = 1; i < 5; ++i) {
    if (c.inputs[i] == nullptr) continue;
    if (c.inputs[i]->shape != Shape{input.shape[1]} || !IsFloat(c.inputs[i]->dtype)) {
      return c.Error(fmt::format("its {} is {} {}; it must be a float [{}] (one per channel)",
                                 kNames[i], tern_dtype_name(c.inputs[i]->dtype),
                                 Shp(c, c.inputs[i]->shape),
                                 input.shape[1].ToString(c.graph.symbols)));
    }
  }
  for (const char* name : {"momentum", "eps"}) {
    if (auto v = c.Float(name, 0.0); !v.ok()) return v.status();
  }
  out->push_back(input);
  out->push_back({input.dtype, {Dim::Constant(0)}});
  out->push_back({input.dtype, {Dim::Constant(0)}});
  return absl::OkStatus();
}

// _native_batch_norm_legit_functional(input, weight?, bias?, running_mean,
// running_var; training, momentum, eps): batch norm in training mode over
// channel dim 1, the running statistics returned updated instead of written
// in place. Outputs (output, save_mean, save_rstd, new_running_mean,
// new_running_var): the input's type and four f32 [C]. f32 only, as the
// eager plugin; eval mode is _native_batch_norm_legit_no_training.
absl::Status BatchNormTraining(const InferContext& c, Types* out) {
  static const char* const kNames[] = {"input", "weight", "bias", "running_mean", "running_var"};
  for (size_t i : {size_t{0}, size_t{3}, size_t{4}}) {
    if (auto s = RequireInput(c, i, kNames[i]); !s.ok()) return s;
  }
  const TensorType& input = *c.inputs[0];
  if (input.dtype != TERN_DTYPE_F32) {
    return c.Error(fmt::format(
        "its input is {}; the compiler does not lower yet a training batch norm of other dtypes "
        "than f32",
        tern_dtype_name(input.dtype)));
  }
  if (input.shape.size() < 2) {
    return c.Error(fmt::format("its input {} has no channel dim (batch norm takes [N, C, ...])",
                               Shp(c, input.shape)));
  }
  const Shape per_channel{input.shape[1]};
  for (size_t i = 1; i < 5; ++i) {
    if (c.inputs[i] == nullptr) continue;
    if (c.inputs[i]->shape != per_channel || c.inputs[i]->dtype != TERN_DTYPE_F32) {
      return c.Error(fmt::format("its {} is {} {}; it must be f32 {} (one per channel)", kNames[i],
                                 tern_dtype_name(c.inputs[i]->dtype), Shp(c, c.inputs[i]->shape),
                                 Shp(c, per_channel)));
    }
  }
  auto training = c.Bool("training", true);
  if (!training.ok()) return training.status();
  if (!*training) {
    return c.Error(
        "it has training=False, which the compiler does not lower yet in this op; eval graphs "
        "have _native_batch_norm_legit_no_training");
  }
  for (const char* name : {"momentum", "eps"}) {
    if (auto v = c.Float(name, 0.0); !v.ok()) return v.status();
  }
  out->push_back(input);
  for (int i = 0; i < 4; ++i) out->push_back({TERN_DTYPE_F32, per_channel});
  return absl::OkStatus();
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?,
// running_var?, save_mean?, save_invstd?; train, eps, output_mask): f32
// only, as the eager plugin. Training reads save_mean and save_invstd, eval
// running_mean and running_var. Outputs (grad_input, grad_weight,
// grad_bias): the input's type and f32 [C] (as PyTorch's CPU kernel, with or
// without a weight); one that output_mask leaves out (None in PyTorch) is an
// empty f32 [0], never computed.
absl::Status BatchNormBackward(const InferContext& c, Types* out) {
  static const char* const kNames[] = {"grad_out",    "input",     "weight",     "running_mean",
                                       "running_var", "save_mean", "save_invstd"};
  for (size_t i = 0; i < 2; ++i) {
    if (auto s = RequireInput(c, i, kNames[i]); !s.ok()) return s;
  }
  const TensorType &grad = *c.inputs[0], &input = *c.inputs[1];
  if (input.dtype != TERN_DTYPE_F32 || grad.dtype != TERN_DTYPE_F32) {
    return c.Error(fmt::format(
        "its grad_out is {} and its input {}; the compiler does not lower yet a batch norm "
        "backward of other dtypes than f32",
        tern_dtype_name(grad.dtype), tern_dtype_name(input.dtype)));
  }
  if (input.shape.size() < 2 || grad.shape != input.shape) {
    return c.Error(fmt::format("its grad_out {} and input {} must be the same [N, C, ...]",
                               Shp(c, grad.shape), Shp(c, input.shape)));
  }
  const Shape per_channel{input.shape[1]};
  for (size_t i = 2; i < 7 && i < c.inputs.size(); ++i) {
    if (c.inputs[i] == nullptr) continue;
    if (c.inputs[i]->shape != per_channel || c.inputs[i]->dtype != TERN_DTYPE_F32) {
      return c.Error(fmt::format("its {} is {} {}; it must be f32 {} (one per channel)", kNames[i],
                                 tern_dtype_name(c.inputs[i]->dtype), Shp(c, c.inputs[i]->shape),
                                 Shp(c, per_channel)));
    }
  }
  auto train = c.Bool("train", true);
  if (!train.ok()) return train.status();
  for (size_t i : *train ? std::vector<size_t>{5, 6} : std::vector<size_t>{3, 4}) {
    if (auto s = RequireInput(c, i, kNames[i]); !s.ok()) return s;
  }
  if (auto eps = c.Float("eps", 1e-5); !eps.ok()) return eps.status();
  absl::StatusOr<std::vector<bool>> mask = c.Flags("output_mask", 3);
  if (!mask.ok()) return mask.status();
  const TensorType absent{TERN_DTYPE_F32, {Dim::Constant(0)}};
  out->push_back((*mask)[0] ? input : absent);
  out->push_back((*mask)[1] ? TensorType{TERN_DTYPE_F32, per_channel} : absent);
  out->push_back((*mask)[2] ? TensorType{TERN_DTYPE_F32, per_channel} : absent);
  return absl::OkStatus();
}

// max_pool2d_with_indices(self; kernel_size, stride=kernel_size, padding=0,
// dilation=1, ceil_mode=False) over the last two dims of a CHW or NCHW input.
absl::Status MaxPool2d(const InferContext& c, Types* out) {
  if (auto s = RequireInput(c, 0, "self"); !s.ok()) return s;
  const TensorType& self = *c.inputs[0];
  if (self.shape.size() != 3 && self.shape.size() != 4) {
    return c.Error(fmt::format("its input {} is not 3-D or 4-D; max_pool2d takes CHW or NCHW",
                               Shp(c, self.shape)));
  }
  auto ceil_mode = c.Bool("ceil_mode", false);
  if (!ceil_mode.ok()) return ceil_mode.status();
  if (*ceil_mode) {
    return c.Error(
        "it uses ceil_mode=True, which the compiler does not lower yet; use ceil_mode=False "
        "(pad the input instead if the last partial window matters)");
  }
  auto kernel = Pair(c, "kernel_size", {}, 1);
  if (!kernel.ok()) return kernel.status();
  // An empty stride is the kernel, as PyTorch: max_pool2d_with_indices_backward's
  // schema has no default for it, so there it comes as [].
  auto given_stride = c.Ints("stride", {});
  if (!given_stride.ok()) return given_stride.status();
  auto stride = given_stride->empty() ? absl::StatusOr<std::array<int64_t, 2>>(*kernel)
                                      : Pair(c, "stride", {}, 1);
  auto padding = Pair(c, "padding", {0}, 0);
  auto dilation = Pair(c, "dilation", {1}, 1);
  for (const auto* v : {&stride, &padding, &dilation}) {
    if (!v->ok()) return v->status();
  }
  // As PyTorch: the padding is at most half the kernel, so that no window
  // is all padding.
  for (size_t axis = 0; axis < 2; ++axis) {
    if ((*padding)[axis] > (*kernel)[axis] / 2) {
      return c.Error(fmt::format("its padding {} is more than half its kernel size {}",
                                 (*padding)[axis], (*kernel)[axis]));
    }
  }
  TensorType t = self;
  const size_t h = self.shape.size() - 2;
  for (size_t axis = 0; axis < 2; ++axis) {
    auto size = WindowOutput(c, self.shape[h + axis], (*kernel)[axis], (*stride)[axis],
                             (*padding)[axis], (*dilation)[axis], axis == 0 ? "height" : "width");
    if (!size.ok()) return size.status();
    t.shape[h + axis] = *size;
  }
  out->push_back(t);
  out->push_back({TERN_DTYPE_I64, t.shape});
  return absl::OkStatus();
}

// max_pool2d_with_indices_backward(grad_output, self, indices; kernel_size,
// stride, padding, dilation, ceil_mode): the gradient of self (its type),
// grad_output added at the forward's indices (each into its own plane's
// H * W elements). The window is checked as max_pool2d_with_indices checks it.
absl::Status MaxPool2dBackward(const InferContext& c, Types* out) {
  static const char* const kNames[] = {"grad_output", "self", "indices"};
  for (size_t i = 0; i < 3; ++i) {
    if (auto s = RequireInput(c, i, kNames[i]); !s.ok()) return s;
  }
  const TensorType &grad = *c.inputs[0], &self = *c.inputs[1], &indices = *c.inputs[2];
  Types forward;
  const InferContext pool{c.graph, c.node, {c.inputs[1]}};
  if (auto s = MaxPool2d(pool, &forward); !s.ok()) return s;
  if (auto s = RequireFloat(c, self, "self"); !s.ok()) return s;
  if (grad.shape != forward[0].shape || grad.dtype != self.dtype) {
    return c.Error(fmt::format("its grad_output is {} {}; the pool's output is {} {}",
                               tern_dtype_name(grad.dtype), Shp(c, grad.shape),
                               tern_dtype_name(self.dtype), Shp(c, forward[0].shape)));
  }
  if (indices.shape != forward[0].shape || indices.dtype != TERN_DTYPE_I64) {
    return c.Error(fmt::format("its indices are {} {}; they must be i64 {}",
                               tern_dtype_name(indices.dtype), Shp(c, indices.shape),
                               Shp(c, forward[0].shape)));
  }
  out->push_back(self);
  return absl::OkStatus();
}

constexpr uint32_t kVariadic = UINT32_MAX;

// The table, sorted by name (KnownOps returns it in this order).
const std::vector<OpDef>& Table() {
  static const std::vector<OpDef>* table = [] {
    auto* ops = new std::vector<OpDef>{
        {"aten._log_softmax.default", 1, 1, 1, -1, Softmax},
        {"aten._log_softmax_backward_data.default", 2, 2, 1, -1, SoftmaxBackward},
        {"aten._native_batch_norm_legit_functional.default", 5, 5, 5, -1, BatchNormTraining},
        {"aten._native_batch_norm_legit_no_training.default", 5, 5, 3, -1, BatchNormInference},
        {"aten._softmax.default", 1, 1, 1, -1, Softmax},
        {"aten._softmax_backward_data.default", 2, 2, 1, -1, SoftmaxBackward},
        {"aten._to_copy.default", 1, 1, 1, -1, ToCopy},
        {"aten._unsafe_view.default", 1, 1, 1, -1, View},
        {"aten.abs.default", 1, 1, 1, -1, SameAsInput},
        {"aten.add.Scalar", 1, 1, 1, -1, Arithmetic},
        {"aten.add.Tensor", 1, 2, 1, -1, Arithmetic},
        {"aten.any.dim", 1, 1, 1, -1, AnyDim},
        {"aten.addmm.default", 3, 3, 1, -1, Addmm},
        {"aten.amax.default", 1, 1, 1, -1, Sum},
        {"aten.bmm.default", 2, 2, 1, -1, Bmm},
        {"aten.bitwise_and.Tensor", 2, 2, 1, -1, Bitwise},
        {"aten.bitwise_not.default", 1, 1, 1, -1, BitwiseNot},
        {"aten.bitwise_or.Tensor", 2, 2, 1, -1, Bitwise},
        {"aten.cat.default", 1, kVariadic, 1, -1, Cat},
        {"aten.clamp.default", 1, 1, 1, -1, Clamp},
        {"aten.clamp_max.default", 1, 1, 1, -1, ClampMax},
        {"aten.clamp_min.default", 1, 1, 1, -1, ClampMin},
        {"aten.clone.default", 1, 1, 1, -1, SameAsInput},
        {"aten.alias.default", 1, 1, 1, -1, SameAsInput},
        {"aten.constant_pad_nd.default", 1, 1, 1, -1, ConstantPadNd},
        {"aten.convolution.default", 2, 3, 1, -1, Convolution},
        {"aten.convolution_backward.default", 3, 3, 3, -1, ConvolutionBackward},
        {"aten.cos.default", 1, 1, 1, -1, FloatUnary},
        {"aten.div.Scalar", 1, 1, 1, -1, Division},
        {"aten.div.Tensor", 1, 2, 1, -1, Division},
        {"aten.embedding.default", 2, 2, 1, -1, Embedding},
        {"aten.embedding_dense_backward.default", 2, 2, 1, -1, EmbeddingDenseBackward},
        {"aten.eq.Scalar", 1, 1, 1, -1, Comparison},
        {"aten.eq.Tensor", 1, 2, 1, -1, Comparison},
        {"aten.erf.default", 1, 1, 1, -1, FloatUnary},
        {"aten.exp.default", 1, 1, 1, -1, FloatUnary},
        {"aten.expand.default", 1, 1, 1, 0, Expand},
        {"aten.full_like.default", 1, 1, 1, -1, FullLike},
        {"aten.gather.default", 2, 2, 1, -1, Gather},
        {"aten.ge.Scalar", 1, 1, 1, -1, Comparison},
        {"aten.ge.Tensor", 1, 2, 1, -1, Comparison},
        {"aten.gelu.default", 1, 1, 1, -1, FloatUnary},
        {"aten.gelu_backward.default", 2, 2, 1, -1, ActivationBackward},
        {"aten.gt.Scalar", 1, 1, 1, -1, Comparison},
        {"aten.gt.Tensor", 1, 2, 1, -1, Comparison},
        {"aten.index_put.default", 2, kVariadic, 1, -1, IndexPut},
        {"aten.log.default", 1, 1, 1, -1, FloatUnary},
        {"aten.le.Scalar", 1, 1, 1, -1, Comparison},
        {"aten.le.Tensor", 1, 2, 1, -1, Comparison},
        {"aten.logical_and.default", 2, 2, 1, -1, Logical},
        {"aten.logical_not.default", 1, 1, 1, -1, LogicalNot},
        {"aten.logical_or.default", 2, 2, 1, -1, Logical},
        {"aten.lt.Scalar", 1, 1, 1, -1, Comparison},
        {"aten.lt.Tensor", 1, 2, 1, -1, Comparison},
        {"aten.max_pool2d_with_indices.default", 1, 1, 2, -1, MaxPool2d},
        {"aten.max_pool2d_with_indices_backward.default", 3, 3, 1, -1, MaxPool2dBackward},
        {"aten.maximum.default", 2, 2, 1, -1, Arithmetic},
        {"aten.mean.dim", 1, 1, 1, -1, Mean},
        {"aten.minimum.default", 2, 2, 1, -1, Arithmetic},
        {"aten.mm.default", 2, 2, 1, -1, Mm},
        {"aten.mul.Scalar", 1, 1, 1, -1, Arithmetic},
        {"aten.mul.Tensor", 1, 2, 1, -1, Arithmetic},
        {"aten.ne.Scalar", 1, 1, 1, -1, Comparison},
        {"aten.ne.Tensor", 1, 2, 1, -1, Comparison},
        {"aten.native_batch_norm_backward.default", 2, 7, 3, -1, BatchNormBackward},
        {"aten.native_layer_norm.default", 1, 3, 3, -1, LayerNorm},
        {"aten.native_layer_norm_backward.default", 4, 6, 3, -1, LayerNormBackward},
        {"aten.neg.default", 1, 1, 1, -1, SameAsInput},
        {"aten.permute.default", 1, 1, 1, 0, Permute},
        {"aten.pow.Tensor_Scalar", 1, 1, 1, -1, PowScalar},
        {"aten.relu.default", 1, 1, 1, -1, SameAsInput},
        {"aten.rms_norm.default", 1, 2, 1, -1, RmsNorm},
        {"aten.rsqrt.default", 1, 1, 1, -1, FloatUnary},
        {"aten.scatter.value", 2, 2, 1, -1, ScatterValue},
        {"aten.select.int", 1, 1, 1, 0, Select},
        {"aten.sigmoid.default", 1, 1, 1, -1, FloatUnary},
        {"aten.sigmoid_backward.default", 2, 2, 1, -1, ActivationBackward},
        {"aten.silu.default", 1, 1, 1, -1, FloatUnary},
        {"aten.silu_backward.default", 2, 2, 1, -1, ActivationBackward},
        {"aten.sin.default", 1, 1, 1, -1, FloatUnary},
        {"aten.slice.Tensor", 1, 1, 1, 0, Slice},
        {"aten.sqrt.default", 1, 1, 1, -1, FloatUnary},
        {"aten.split_with_sizes.default", 1, 1, kAnyOutputs, 0, SplitWithSizes},
        {"aten.squeeze.dims", 1, 1, 1, 0, SqueezeDims},
        {"aten.sub.Scalar", 1, 1, 1, -1, Arithmetic},
        {"aten.sub.Tensor", 1, 2, 1, -1, Arithmetic},
        {"aten.sum.dim_IntList", 1, 1, 1, -1, SumDims},
        {"aten.tanh.default", 1, 1, 1, -1, FloatUnary},
        {"aten.tanh_backward.default", 2, 2, 1, -1, ActivationBackward},
        {"aten.threshold_backward.default", 2, 2, 1, -1, ActivationBackward},
        {"aten.unsqueeze.default", 1, 1, 1, 0, Unsqueeze},
        {"aten.view.default", 1, 1, 1, 0, View},
        {"aten.where.self", 3, 3, 1, -1, Where},
    };
    std::sort(ops->begin(), ops->end(),
              [](const OpDef& a, const OpDef& b) { return a.name < b.name; });
    return ops;
  }();
  return *table;
}

}  // namespace

// --- InferContext -----------------------------------------------------------

absl::Status InferContext::Error(std::string_view message) const {
  return absl::InvalidArgumentError(DescribeNode(node) + ": " + std::string(message));
}

namespace {

template <typename T>
absl::StatusOr<T> Get(const InferContext& c, const std::string& name, T fallback,
                      const char* kind) {
  const Attribute* attr = FindAttr(c.node, name);
  if (attr == nullptr) return fallback;
  if (const T* value = std::get_if<T>(&attr->value)) return *value;
  return c.Error(fmt::format("its attribute '{}' must be {}", name, kind));
}

}  // namespace

absl::StatusOr<int64_t> InferContext::Int(const std::string& name, int64_t fallback) const {
  return Get<int64_t>(*this, name, fallback, "an int");
}

absl::StatusOr<double> InferContext::Float(const std::string& name, double fallback) const {
  // An int where a float is expected is fine (eps=0 written as an int).
  const Attribute* attr = FindAttr(node, name);
  if (attr != nullptr) {
    if (const int64_t* value = std::get_if<int64_t>(&attr->value)) {
      return static_cast<double>(*value);
    }
  }
  return Get<double>(*this, name, fallback, "a number");
}

absl::StatusOr<bool> InferContext::Bool(const std::string& name, bool fallback) const {
  return Get<bool>(*this, name, fallback, "a bool");
}

absl::StatusOr<std::vector<int64_t>> InferContext::Ints(const std::string& name,
                                                        std::vector<int64_t> fallback) const {
  const Attribute* attr = FindAttr(node, name);
  if (attr != nullptr) {
    if (const int64_t* value = std::get_if<int64_t>(&attr->value)) {
      return std::vector<int64_t>{*value};  // dim=1 for dim=[1]
    }
  }
  return Get<std::vector<int64_t>>(*this, name, std::move(fallback), "a list of ints");
}

absl::StatusOr<Shape> InferContext::ShapeAttr(const std::string& name) const {
  const Attribute* attr = FindAttr(node, name);
  if (attr == nullptr) return Error(fmt::format("its attribute '{}' is missing", name));
  if (const Shape* shape = std::get_if<Shape>(&attr->value)) return *shape;
  if (const auto* ints = std::get_if<std::vector<int64_t>>(&attr->value)) {
    Shape shape;
    for (int64_t v : *ints) shape.push_back(Dim::Constant(v));
    return shape;
  }
  return Error(fmt::format("its attribute '{}' must be a shape", name));
}

absl::StatusOr<std::string> InferContext::String(const std::string& name,
                                                 std::string fallback) const {
  return Get<std::string>(*this, name, std::move(fallback), "a string");
}

absl::StatusOr<std::vector<bool>> InferContext::Flags(const std::string& name, size_t count) const {
  const Attribute* attr = FindAttr(node, name);
  if (attr == nullptr) return Error(fmt::format("its attribute '{}' is missing", name));
  std::vector<int64_t> values;
  if (const auto* ints = std::get_if<std::vector<int64_t>>(&attr->value)) {
    values = *ints;
  } else if (const Shape* shape = std::get_if<Shape>(&attr->value)) {
    for (const Dim& dim : *shape) values.push_back(dim.constant().value_or(-1));
  } else {
    return Error(fmt::format("its attribute '{}' must be a list of {} bools", name, count));
  }
  std::vector<bool> flags;
  for (int64_t v : values) {
    if (v != 0 && v != 1) break;
    flags.push_back(v == 1);
  }
  if (flags.size() != count || values.size() != count) {
    return Error(
        fmt::format("its attribute '{}' must be a list of {} bools (0 or 1)", name, count));
  }
  return flags;
}

absl::StatusOr<std::optional<tern_dtype_t>> InferContext::DType(const std::string& name) const {
  const Attribute* attr = FindAttr(node, name);
  if (attr == nullptr) return std::optional<tern_dtype_t>();
  if (const DTypeAttr* value = std::get_if<DTypeAttr>(&attr->value)) {
    if (value->dtype >= TERN_DTYPE_COUNT) {
      return Error(fmt::format("its attribute '{}' is dtype {}, which tern does not have", name,
                               static_cast<int>(value->dtype)));
    }
    return std::optional<tern_dtype_t>(value->dtype);
  }
  return Error(fmt::format("its attribute '{}' must be a dtype", name));
}

// --- the registry -----------------------------------------------------------

const OpDef* FindOp(std::string_view name) {
  const auto& table = Table();
  auto it = std::lower_bound(table.begin(), table.end(), name,
                             [](const OpDef& op, std::string_view n) { return op.name < n; });
  return it != table.end() && it->name == name ? &*it : nullptr;
}

std::vector<std::string_view> KnownOps() {
  std::vector<std::string_view> names;
  for (const OpDef& op : Table()) names.push_back(op.name);
  return names;
}

absl::Status InferNode(const Graph& graph, const Node& node, std::vector<TensorType>* outputs) {
  outputs->clear();
  const OpDef* op = FindOp(node.op);
  if (op == nullptr) {
    return absl::UnimplementedError(DescribeNode(node) +
                                    ": the compiler does not know this operator; the supported "
                                    "ones are listed by `ternc ops`");
  }
  const uint32_t count = static_cast<uint32_t>(node.inputs.size());
  if (count < op->min_inputs || count > op->max_inputs) {
    return absl::InvalidArgumentError(
        fmt::format("{}: it has {} tensor inputs; {} takes {}", DescribeNode(node), count, op->name,
                    op->max_inputs == kVariadic ? fmt::format("at least {}", op->min_inputs)
                    : op->min_inputs == op->max_inputs
                        ? std::to_string(op->min_inputs)
                        : fmt::format("{} to {}", op->min_inputs, op->max_inputs)));
  }
  InferContext context{graph, node, {}};
  for (uint32_t id : node.inputs) {
    if (id == kNoValue) {
      context.inputs.push_back(nullptr);
    } else if (id >= graph.values.size()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: input value {} does not exist", DescribeNode(node), id));
    } else {
      context.inputs.push_back(&graph.values[id].type);
    }
  }
  absl::Status status = op->infer(context, outputs);
  if (status.ok() && op->outputs != kAnyOutputs && outputs->size() != op->outputs) {
    return absl::InternalError(fmt::format("{}: inference gave {} outputs, the op has {}",
                                           DescribeNode(node), outputs->size(), op->outputs));
  }
  return status;
}

absl::StatusOr<uint32_t> AddNode(Graph* graph, std::string op, std::vector<uint32_t> inputs,
                                 std::vector<Attribute> attrs, std::string name,
                                 std::string source) {
  // Infer on a node that is not in the graph yet, then append it.
  Node node;
  node.op = op;
  node.inputs = inputs;
  node.attrs = attrs;
  std::sort(node.attrs.begin(), node.attrs.end(),
            [](const Attribute& a, const Attribute& b) { return a.name < b.name; });
  node.name = name.empty() ? fmt::format("node{}", graph->nodes.size()) : name;
  node.source = source;
  std::vector<TensorType> types;
  if (absl::Status status = InferNode(*graph, node, &types); !status.ok()) return status;
  return graph->AddNodeWithTypes(std::move(op), std::move(inputs), std::move(attrs), types,
                                 std::move(name), std::move(source));
}

}  // namespace tern::compiler
