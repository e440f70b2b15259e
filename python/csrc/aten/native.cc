#include "aten/native.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <c10/util/irange.h>

#include <algorithm>

#include "aten/minimal.h"

namespace torch_tern::native {

Operand ScalarArg(Program& p, const c10::Scalar& s, at::ScalarType dtype) {
  const tern_dtype_t d = *TD(dtype);
  if (at::isFloatingType(dtype)) return p.Arg(s.toDouble(), d);
  if (dtype == at::kBool) return p.ArgInt(s.toBool() ? 1 : 0, d);
  return p.ArgInt(s.toLong(), d);
}

Operand ScalarConst(Program& p, const c10::Scalar& s, at::ScalarType dtype) {
  const tern_dtype_t d = *TD(dtype);
  if (at::isFloatingType(dtype)) return p.Const(s.toDouble(), d);
  if (dtype == at::kBool) return p.ConstInt(s.toBool() ? 1 : 0, d);
  return p.ConstInt(s.toLong(), d);
}

Operand Input(Program& p, const at::Tensor& t, at::ScalarType dtype, c10::IntArrayRef shape,
              bool constant) {
  if (!Supported(dtype)) {
    p.In(at::Tensor());  // marks the program not ok
    return Operand{};
  }
  if (IsCpuScalar(t)) {
    const c10::Scalar s = t.item();
    return (constant ? ScalarConst(p, s, dtype) : ScalarArg(p, s, dtype)).Expand(shape);
  }
  Operand o = p.In(t);
  if (!p.ok()) return o;
  if (t.scalar_type() != dtype) {
    Operand tmp = p.Temp(*TD(dtype), t.sizes());
    p.Emit(TERN_OP_CAST, {tmp, o});
    o = tmp;
  }
  return o.Expand(shape);
}

Target BeginOut(Program& p, const at::Tensor& out, at::ScalarType dtype) {
  Operand o = p.Out(out);
  return BeginOut(p, out, dtype, out.sizes(), o);
}

Target BeginOut(Program& p, const at::Tensor& out, at::ScalarType dtype, c10::IntArrayRef shape,
                const Operand& out_view) {
  Target t;
  t.out = out_view;
  if (out.scalar_type() == dtype || !Supported(dtype)) {
    t.write = out_view;
    if (!Supported(dtype)) p.In(at::Tensor());
    return t;
  }
  t.write = p.Temp(*TD(dtype), shape);
  t.cast = true;
  return t;
}

void Finish(Program& p, const Target& t) {
  if (t.cast) p.Emit(TERN_OP_CAST, {t.out, t.write});
}

namespace {

std::pair<uintptr_t, uintptr_t> ByteRange(const at::Tensor& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {begin, begin + static_cast<uintptr_t>(SpanElements(t)) * t.element_size()};
}

}  // namespace

bool OutputOk(const at::Tensor& out, std::initializer_list<at::Tensor> inputs) {
  if (!IsTern(out) || !Supported(out.scalar_type()) || out.is_conj() || out.is_neg()) return false;
  if (out.numel() > 1 && at::has_internal_overlap(out) != at::MemOverlap::No) return false;
  if (out.numel() == 0) return true;
  const auto [ob, oe] = ByteRange(out);
  for (const at::Tensor& t : inputs) {
    if (!IsTern(t) || t.numel() == 0) continue;
    if (!t.storage().is_alias_of(out.storage())) continue;
    const auto [b, e] = ByteRange(t);
    if (e <= ob || b >= oe) continue;  // disjoint
    if (b == ob && t.sizes() == out.sizes() && t.strides() == out.strides() &&
        t.scalar_type() == out.scalar_type()) {
      continue;  // the same elements: in place
    }
    return false;
  }
  return true;
}

void ResizeOut(const at::Tensor& out, c10::IntArrayRef shape) {
  if (out.sizes() != shape) at::native::resize_output(out, shape);
}

at::ScalarType ResultType(const at::Tensor& a, const at::Tensor& b) {
  return at::native::result_type(a, b);
}

std::vector<int64_t> ReduceDims(const at::Tensor& self, at::OptionalIntArrayRef dims) {
  const int64_t rank = self.dim();
  std::vector<int64_t> out;
  if (rank == 0) return out;
  if (!dims.has_value() || dims->empty()) {
    for (int64_t d = 0; d < rank; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : *dims) out.push_back(c10::maybe_wrap_dim(d, rank));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int64_t> ReducedShape(c10::IntArrayRef sizes, const std::vector<int64_t>& dims,
                                  bool keepdim) {
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) {
      shape.push_back(sizes[d]);
    } else if (keepdim) {
      shape.push_back(1);
    }
  }
  return shape;
}

Operand KeepdimView(Program& p, const Operand& out, const std::vector<int64_t>& dims,
                    bool keepdim) {
  if (keepdim) return out;
  Operand o = out;
  for (int64_t d : dims) o = o.Unsqueeze(d);  // dims ascending: positions are final
  return o;
}

}  // namespace torch_tern::native
