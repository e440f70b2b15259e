#include "compiler/passes/patterns.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "compiler/passes/graph_edit.h"

namespace tern::compiler {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.7071067811865476;     // 1/sqrt(2)
constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kGeluCubic = 0.044715;

bool IsFloatType(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16;
}

// The constant, as written, equals `target` once both are rounded to f32.
bool SameAsF32(double value, double target) {
  return std::isfinite(value) && static_cast<float>(value) == static_cast<float>(target);
}

bool Exactly(double target, double value) { return value == target; }

// A number attribute (int or float), or nullopt.
std::optional<double> NumberAttr(const Node& node, const char* name) {
  const Attribute* attr = FindAttr(node, name);
  if (attr == nullptr) return std::nullopt;
  if (const auto* d = std::get_if<double>(&attr->value)) return *d;
  if (const auto* i = std::get_if<int64_t>(&attr->value)) return static_cast<double>(*i);
  return std::nullopt;
}

// Only these attributes are present (`node.attrs` is sorted by name).
bool OnlyAttrs(const Node& node, std::initializer_list<std::string_view> allowed) {
  for (const Attribute& attr : node.attrs) {
    if (std::find(allowed.begin(), allowed.end(), attr.name) == allowed.end()) return false;
  }
  return true;
}

// One match under construction: the nodes it takes, in any order.
using Nodes = std::vector<uint32_t>;

class Replacer {
 public:
  explicit Replacer(Graph* graph)
      : g_(*graph),
        edit_(*graph),
        readers_(graph->values.size()),
        is_output_(graph->values.size(), false),
        claimed_(graph->nodes.size(), false) {
    for (uint32_t n = 0; n < g_.nodes.size(); ++n) {
      for (uint32_t id : g_.nodes[n].inputs) {
        if (id != kNoValue) readers_[id].push_back(n);
      }
    }
    for (const Graph::Output& output : g_.outputs) is_output_[output.value] = true;
  }

  absl::StatusOr<PatternStats> Run() {
    // From the last node backwards: a chain's last node comes after every
    // other node of it, so the largest chain ending at a node is tried before
    // the smaller ones inside it (a LayerNorm before the RMSNorm of x - mean).
    for (uint32_t n = static_cast<uint32_t>(g_.nodes.size()); n-- > 0;) {
      if (claimed_[n]) continue;
      if (TryLayerNorm(n) || TryRmsNorm(n) || TryGelu(n) || TrySoftmax(n)) continue;
    }
    if (absl::Status status = edit_.Apply(&g_); !status.ok()) return status;
    return stats_;
  }

 private:
  // ---- Reading the graph ---------------------------------------------------------------

  const TensorType& Type(uint32_t value) const { return g_.values[value].type; }

  // The node that makes `value` (its only output) when its op is one of
  // `ops` and no earlier match took it; appended to `nodes`.
  std::optional<uint32_t> Def(uint32_t value, std::initializer_list<std::string_view> ops,
                              Nodes* nodes) const {
    if (value == kNoValue || value >= g_.values.size()) return std::nullopt;
    const Value& v = g_.values[value];
    if (v.kind != Value::kNode || claimed_[v.node]) return std::nullopt;
    const Node& node = g_.nodes[v.node];
    if (node.outputs.size() != 1) return std::nullopt;
    if (std::find(ops.begin(), ops.end(), node.op) == ops.end()) return std::nullopt;
    nodes->push_back(v.node);
    return v.node;
  }

  // A Python number operand (the `self`/`other` attribute of an absent
  // input) or a one-element f32 constant.
  std::optional<double> Number(const Node& node, size_t slot) const {
    if (slot >= node.inputs.size() || node.inputs[slot] == kNoValue) {
      return NumberAttr(node, slot == 0 ? "self" : "other");
    }
    const Value& v = g_.values[node.inputs[slot]];
    if (v.kind != Value::kConstant || v.type.dtype != TERN_DTYPE_F32 ||
        ConstantElements(v.type.shape) != std::optional<int64_t>(1)) {
      return std::nullopt;
    }
    float f = 0.0f;
    std::memcpy(&f, g_.constants[v.index].data(), sizeof(f));
    return f;
  }

  static bool AlphaIsOne(const Node& node) {
    const std::optional<double> alpha = NumberAttr(node, "alpha");
    return FindAttr(node, "alpha") == nullptr || (alpha.has_value() && *alpha == 1.0);
  }

  // The tensor operand of a binary node whose other operand is a number
  // that satisfies `is`; the number may be either operand when
  // `commutative`.
  template <typename Pred>
  std::optional<uint32_t> TensorWithNumber(const Node& node, bool commutative, Pred is) const {
    if (!AlphaIsOne(node) || !OnlyAttrs(node, {"self", "other", "alpha"})) return std::nullopt;
    for (size_t slot = commutative ? 0 : 1; slot < 2; ++slot) {
      const size_t tensor_slot = 1 - slot;
      if (tensor_slot >= node.inputs.size() || node.inputs[tensor_slot] == kNoValue) continue;
      const std::optional<double> number = Number(node, slot);
      if (number.has_value() && is(*number)) return node.inputs[tensor_slot];
    }
    return std::nullopt;
  }

  // `value` = op(t, c) with c a number that satisfies `is`: t.
  template <typename Pred>
  std::optional<uint32_t> ScalarOp(uint32_t value, std::initializer_list<std::string_view> ops,
                                   bool commutative, Pred is, Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, ops, nodes);
    if (!n.has_value()) return std::nullopt;
    std::optional<uint32_t> t = TensorWithNumber(g_.nodes[*n], commutative, is);
    if (!t.has_value()) nodes->resize(mark);
    return t;
  }

  // `value` = op(a, b) with two tensors.
  std::optional<std::pair<uint32_t, uint32_t>> TensorOp(uint32_t value,
                                                        std::initializer_list<std::string_view> ops,
                                                        Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, ops, nodes);
    if (!n.has_value()) return std::nullopt;
    const Node& node = g_.nodes[*n];
    if (node.inputs.size() != 2 || node.inputs[0] == kNoValue || node.inputs[1] == kNoValue ||
        !node.attrs.empty()) {
      nodes->resize(mark);
      return std::nullopt;
    }
    return std::make_pair(node.inputs[0], node.inputs[1]);
  }

  // `value` = op(t), a unary op without attributes.
  std::optional<uint32_t> UnaryOp(uint32_t value, std::string_view op, Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, {op}, nodes);
    if (!n.has_value()) return std::nullopt;
    const Node& node = g_.nodes[*n];
    if (node.inputs.size() != 1 || node.inputs[0] == kNoValue || !node.attrs.empty()) {
      nodes->resize(mark);
      return std::nullopt;
    }
    return node.inputs[0];
  }

  // `value` = t * t or t.pow(2): t.
  std::optional<uint32_t> Square(uint32_t value, Nodes* nodes) const {
    const size_t mark = nodes->size();
    if (std::optional<uint32_t> n = Def(value, {"aten.pow.Tensor_Scalar"}, nodes)) {
      const Node& node = g_.nodes[*n];
      const std::optional<double> exponent = NumberAttr(node, "exponent");
      if (node.inputs.size() == 1 && node.inputs[0] != kNoValue && OnlyAttrs(node, {"exponent"}) &&
          exponent == std::optional<double>(2.0)) {
        return node.inputs[0];
      }
      nodes->resize(mark);
      return std::nullopt;
    }
    if (auto ab = TensorOp(value, {"aten.mul.Tensor"}, nodes); ab && ab->first == ab->second) {
      return ab->first;
    }
    nodes->resize(mark);
    return std::nullopt;
  }

  // `value` is x.pow(3), x*x*x or x*(x*x).
  bool Cube(uint32_t value, uint32_t x, Nodes* nodes) const {
    const size_t mark = nodes->size();
    if (std::optional<uint32_t> n = Def(value, {"aten.pow.Tensor_Scalar"}, nodes)) {
      const Node& node = g_.nodes[*n];
      const std::optional<double> exponent = NumberAttr(node, "exponent");
      if (node.inputs.size() == 1 && node.inputs[0] == x && OnlyAttrs(node, {"exponent"}) &&
          exponent == std::optional<double>(3.0)) {
        return true;
      }
      nodes->resize(mark);
      return false;
    }
    if (auto ab = TensorOp(value, {"aten.mul.Tensor"}, nodes)) {
      for (auto [p, q] : {*ab, std::make_pair(ab->second, ab->first)}) {
        const size_t inner = nodes->size();
        if (p != x) continue;
        if (Square(q, nodes) == std::optional<uint32_t>(x)) return true;
        nodes->resize(inner);
      }
    }
    nodes->resize(mark);
    return false;
  }

  // A reduction over one dim with keepdim: its input, and its dims in `dims`.
  std::optional<uint32_t> KeepdimReduce(uint32_t value, std::string_view op,
                                        std::vector<int64_t>* dims, Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, {op}, nodes);
    if (!n.has_value()) return std::nullopt;
    const Node& node = g_.nodes[*n];
    const Attribute* dim = FindAttr(node, "dim");
    const Attribute* keepdim = FindAttr(node, "keepdim");
    const auto* list = dim != nullptr ? std::get_if<std::vector<int64_t>>(&dim->value) : nullptr;
    const auto* keep = keepdim != nullptr ? std::get_if<bool>(&keepdim->value) : nullptr;
    if (node.inputs.size() != 1 || node.inputs[0] == kNoValue || list == nullptr || list->empty() ||
        keep == nullptr || !*keep || !OnlyAttrs(node, {"dim", "keepdim"})) {
      nodes->resize(mark);
      return std::nullopt;
    }
    *dims = *list;
    return node.inputs[0];
  }

  // The dims, normalised and sorted; nullopt when one is out of range or
  // repeated.
  static std::optional<std::vector<int64_t>> Normalized(std::vector<int64_t> dims, size_t rank) {
    for (int64_t& d : dims) {
      if (d < 0) d += static_cast<int64_t>(rank);
      if (d < 0 || d >= static_cast<int64_t>(rank)) return std::nullopt;
    }
    std::sort(dims.begin(), dims.end());
    if (std::adjacent_find(dims.begin(), dims.end()) != dims.end()) return std::nullopt;
    return dims;
  }

  // x's shape with `dims` (normalised) set to 1.
  static Shape KeptShape(const Shape& shape, const std::vector<int64_t>& dims) {
    Shape kept = shape;
    for (int64_t d : dims) kept[static_cast<size_t>(d)] = Dim::Constant(1);
    return kept;
  }

  // The last k dims of a static shape, when `dims` (normalised) are exactly
  // the last k.
  static std::optional<std::vector<int64_t>> TrailingShape(const Shape& shape,
                                                           const std::vector<int64_t>& dims) {
    const size_t rank = shape.size(), k = dims.size();
    if (k == 0 || k > rank) return std::nullopt;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < k; ++i) {
      if (dims[i] != static_cast<int64_t>(rank - k + i)) return std::nullopt;
      const std::optional<int64_t> size = shape[rank - k + i].constant();
      if (!size.has_value()) return std::nullopt;
      sizes.push_back(*size);
    }
    return sizes;
  }

  // `value` = _to_copy(t) that keeps t's dtype (a cast that does nothing):
  // t, with the cast appended to `nodes`; otherwise `value` itself.
  uint32_t ThroughIdentityCast(uint32_t value, Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, {"aten._to_copy.default"}, nodes);
    if (!n.has_value()) return value;
    const Node& node = g_.nodes[*n];
    if (node.inputs.size() == 1 && node.inputs[0] != kNoValue && OnlyAttrs(node, {"dtype"}) &&
        Type(node.inputs[0]) == Type(value)) {
      return node.inputs[0];
    }
    nodes->resize(mark);
    return value;
  }

  // ---- Checking and committing a match ------------------------------------------------

  bool Taken(const Nodes& nodes, uint32_t value) const {
    if (value == kNoValue || g_.values[value].kind != Value::kNode) return false;
    return std::find(nodes.begin(), nodes.end(), g_.values[value].node) != nodes.end();
  }

  // Every node but `root` makes values read by the match alone; the external
  // operands are made outside it.
  bool SelfContained(uint32_t root, Nodes* nodes, const std::vector<uint32_t>& external) const {
    std::sort(nodes->begin(), nodes->end());
    nodes->erase(std::unique(nodes->begin(), nodes->end()), nodes->end());
    for (uint32_t n : *nodes) {
      if (claimed_[n]) return false;
      if (n == root) continue;
      for (uint32_t out : g_.nodes[n].outputs) {
        if (is_output_[out]) return false;
        for (uint32_t reader : readers_[out]) {
          if (!std::binary_search(nodes->begin(), nodes->end(), reader)) return false;
        }
      }
    }
    for (uint32_t value : external) {
      if (Taken(*nodes, value)) return false;
    }
    return true;
  }

  void Commit(uint32_t root, const Nodes& nodes, std::string op, std::vector<uint32_t> inputs,
              std::vector<Attribute> attrs, const std::vector<TensorType>& extra_outputs = {}) {
    for (uint32_t n : nodes) {
      claimed_[n] = true;
      if (n != root) {
        edit_.DropNode(n);
        ++stats_.nodes_removed;
      }
    }
    while (!inputs.empty() && inputs.back() == kNoValue) inputs.pop_back();
    for (uint32_t value : inputs) {
      if (value != kNoValue) readers_[value].push_back(root);
    }
    Node& node = g_.nodes[root];
    node.op = std::move(op);
    node.inputs = std::move(inputs);
    std::sort(attrs.begin(), attrs.end(),
              [](const Attribute& a, const Attribute& b) { return a.name < b.name; });
    node.attrs = std::move(attrs);
    static constexpr const char* kSuffixes[] = {"_mean", "_rstd"};
    for (size_t i = 0; i < extra_outputs.size(); ++i) {
      Value value;
      value.kind = Value::kNode;
      value.type = extra_outputs[i];
      value.name = node.name + (i < 2 ? kSuffixes[i] : "_out");
      value.node = root;
      value.index = static_cast<uint32_t>(node.outputs.size());
      node.outputs.push_back(static_cast<uint32_t>(g_.values.size()));
      g_.values.push_back(std::move(value));
      readers_.emplace_back();
      is_output_.push_back(false);
    }
  }

  // ---- GELU ---------------------------------------------------------------------------

  // `value` = 1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) or 1 + erf(x/sqrt(2)).
  std::optional<bool> OnePlus(uint32_t value, uint32_t x, Nodes* nodes) const {
    const size_t mark = nodes->size();
    auto is_one = [](double v) { return Exactly(1.0, v); };
    const std::optional<uint32_t> t =
        ScalarOp(value, {"aten.add.Tensor", "aten.add.Scalar"}, true, is_one, nodes);
    if (!t.has_value()) return std::nullopt;
    if (std::optional<uint32_t> u = UnaryOp(*t, "aten.tanh.default", nodes)) {
      auto is_scale = [](double v) { return SameAsF32(v, kSqrt2OverPi); };
      const std::optional<uint32_t> v =
          ScalarOp(*u, {"aten.mul.Tensor", "aten.mul.Scalar"}, true, is_scale, nodes);
      if (v.has_value()) {
        if (auto ab = TensorOp(*v, {"aten.add.Tensor"}, nodes)) {
          for (auto [p, q] : {*ab, std::make_pair(ab->second, ab->first)}) {
            const size_t inner = nodes->size();
            if (p != x) continue;
            auto is_cubic = [](double c) { return SameAsF32(c, kGeluCubic); };
            const std::optional<uint32_t> cube =
                ScalarOp(q, {"aten.mul.Tensor", "aten.mul.Scalar"}, true, is_cubic, nodes);
            if (cube.has_value() && Cube(*cube, x, nodes)) return true;
            nodes->resize(inner);
          }
        }
      }
    } else if (std::optional<uint32_t> e = UnaryOp(*t, "aten.erf.default", nodes)) {
      auto is_inv = [](double v) { return SameAsF32(v, kInvSqrt2); };
      auto is_sqrt2 = [](double v) { return SameAsF32(v, kSqrt2); };
      const size_t inner = nodes->size();
      if (ScalarOp(*e, {"aten.mul.Tensor", "aten.mul.Scalar"}, true, is_inv, nodes) ==
          std::optional<uint32_t>(x)) {
        return false;
      }
      nodes->resize(inner);
      if (ScalarOp(*e, {"aten.div.Tensor", "aten.div.Scalar"}, false, is_sqrt2, nodes) ==
          std::optional<uint32_t>(x)) {
        return false;
      }
    }
    nodes->resize(mark);
    return std::nullopt;
  }

  bool TryGelu(uint32_t root) {
    const Node& node = g_.nodes[root];
    if (node.op != "aten.mul.Tensor" && node.op != "aten.mul.Scalar") return false;
    const uint32_t out = node.outputs[0];
    const TensorType& type = Type(out);
    if (!IsFloatType(type.dtype)) return false;
    auto is_half = [](double v) { return Exactly(0.5, v); };
    // (x, the 1 + ... value) pairs to try, each with the nodes that make
    // 0.5 * x * (...) of them.
    struct Candidate {
      uint32_t x, rest;
      Nodes nodes;
    };
    std::vector<Candidate> candidates;
    Nodes base = {root};
    if (auto ab = TensorOp(out, {"aten.mul.Tensor"}, &base)) {
      for (auto [p, q] : {*ab, std::make_pair(ab->second, ab->first)}) {
        Nodes nodes = base;
        // (x * 0.5) * (1 + ...)
        if (auto x = ScalarOp(p, {"aten.mul.Tensor", "aten.mul.Scalar"}, true, is_half, &nodes)) {
          candidates.push_back({*x, q, nodes});
        }
        nodes = base;
        // x * ((1 + ...) * 0.5)
        if (auto r = ScalarOp(q, {"aten.mul.Tensor", "aten.mul.Scalar"}, true, is_half, &nodes)) {
          candidates.push_back({p, *r, nodes});
        }
      }
    }
    base = {};
    // (x * (1 + ...)) * 0.5
    if (auto s = ScalarOp(out, {"aten.mul.Tensor", "aten.mul.Scalar"}, true, is_half, &base)) {
      Nodes nodes = base;
      if (auto ab = TensorOp(*s, {"aten.mul.Tensor"}, &nodes)) {
        candidates.push_back({ab->first, ab->second, nodes});
        candidates.push_back({ab->second, ab->first, nodes});
      }
    }
    for (Candidate& c : candidates) {
      if (Type(c.x) != type) continue;
      const std::optional<bool> tanh = OnePlus(c.rest, c.x, &c.nodes);
      if (!tanh.has_value()) continue;
      bool types_match = true;
      for (uint32_t n : c.nodes) types_match = types_match && Type(g_.nodes[n].outputs[0]) == type;
      if (!types_match || !SelfContained(root, &c.nodes, {c.x})) continue;
      std::vector<Attribute> attrs;
      if (*tanh) attrs.push_back({"approximate", std::string("tanh")});
      Commit(root, c.nodes, "aten.gelu.default", {c.x}, std::move(attrs));
      ++(*tanh ? stats_.gelu_tanh : stats_.gelu_erf);
      return true;
    }
    return false;
  }

  // ---- Norms --------------------------------------------------------------------------

  struct Norm {
    uint32_t x = kNoValue;
    std::vector<int64_t> dims;  // normalised, sorted
    std::vector<int64_t> normalized_shape;
    double eps = 0.0;
  };

  // var + eps -> eps and var.
  std::optional<uint32_t> PlusEps(uint32_t value, double* eps, Nodes* nodes) const {
    auto positive = [eps](double v) {
      if (!std::isfinite(v) || v <= 0.0) return false;
      *eps = v;
      return true;
    };
    return ScalarOp(value, {"aten.add.Tensor", "aten.add.Scalar"}, true, positive, nodes);
  }

  // `value` = x * rsqrt(mean(x^2, dims) + eps), x maybe through an identity
  // cast; f32.
  std::optional<Norm> RmsCore(uint32_t value, Nodes* nodes) const {
    const size_t mark = nodes->size();
    const TensorType& type = Type(value);
    if (type.dtype != TERN_DTYPE_F32) return std::nullopt;
    if (auto ab = TensorOp(value, {"aten.mul.Tensor"}, nodes)) {
      for (auto [xv, rv] : {*ab, std::make_pair(ab->second, ab->first)}) {
        const size_t inner = nodes->size();
        Norm norm;
        std::vector<int64_t> dims;
        const std::optional<uint32_t> a = UnaryOp(rv, "aten.rsqrt.default", nodes);
        const std::optional<uint32_t> mv = a ? PlusEps(*a, &norm.eps, nodes) : std::nullopt;
        const std::optional<uint32_t> pv =
            mv ? KeepdimReduce(*mv, "aten.mean.dim", &dims, nodes) : std::nullopt;
        if (pv.has_value() && Square(*pv, nodes) == std::optional<uint32_t>(xv) &&
            Type(xv) == type) {
          const std::optional<std::vector<int64_t>> d = Normalized(dims, type.shape.size());
          const std::optional<std::vector<int64_t>> trailing =
              d ? TrailingShape(type.shape, *d) : std::nullopt;
          if (trailing.has_value()) {
            const TensorType stat{TERN_DTYPE_F32, KeptShape(type.shape, *d)};
            if (Type(*a) == stat && Type(*mv) == stat && Type(rv) == stat && Type(*pv) == type) {
              norm.dims = *d;
              norm.normalized_shape = *trailing;
              norm.x = ThroughIdentityCast(xv, nodes);
              return norm;
            }
          }
        }
        nodes->resize(inner);
      }
    }
    nodes->resize(mark);
    return std::nullopt;
  }

  // A weight or bias: an f32 tensor of the normalised shape.
  bool IsParam(uint32_t value, const std::vector<int64_t>& normalized_shape) const {
    const TensorType& type = Type(value);
    if (type.dtype != TERN_DTYPE_F32 || type.shape.size() != normalized_shape.size()) return false;
    for (size_t i = 0; i < normalized_shape.size(); ++i) {
      if (type.shape[i] != Dim::Constant(normalized_shape[i])) return false;
    }
    return true;
  }

  static std::vector<Attribute> NormAttrs(const Norm& norm) {
    return {{"eps", norm.eps}, {"normalized_shape", norm.normalized_shape}};
  }

  bool TryRmsNorm(uint32_t root) {
    const Node& node = g_.nodes[root];
    if (node.op != "aten.mul.Tensor") return false;
    const uint32_t out = node.outputs[0];
    Nodes base = {root};
    // weight * norm (either order), the norm maybe through an identity cast.
    if (auto ab = TensorOp(out, {"aten.mul.Tensor"}, &base)) {
      for (auto [w, n] : {*ab, std::make_pair(ab->second, ab->first)}) {
        Nodes nodes = base;
        const uint32_t core = ThroughIdentityCast(n, &nodes);
        std::optional<Norm> norm = RmsCore(core, &nodes);
        if (!norm.has_value() || Type(core) != Type(out) || Type(norm->x) != Type(out) ||
            !IsParam(w, norm->normalized_shape) || !SelfContained(root, &nodes, {norm->x, w})) {
          continue;
        }
        Commit(root, nodes, "aten.rms_norm.default", {norm->x, w}, NormAttrs(*norm));
        ++stats_.rms_norm;
        return true;
      }
    }
    Nodes nodes;
    std::optional<Norm> norm = RmsCore(out, &nodes);
    if (!norm.has_value() || Type(norm->x) != Type(out) ||
        !SelfContained(root, &nodes, {norm->x})) {
      return false;
    }
    Commit(root, nodes, "aten.rms_norm.default", {norm->x}, NormAttrs(*norm));
    ++stats_.rms_norm;
    return true;
  }

  // `value` = x - mean(x, dims): x and the dims.
  std::optional<uint32_t> Centered(uint32_t value, std::vector<int64_t>* dims, uint32_t* mean_value,
                                   Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, {"aten.sub.Tensor"}, nodes);
    if (n.has_value()) {
      const Node& sub = g_.nodes[*n];
      if (sub.inputs.size() == 2 && sub.inputs[0] != kNoValue && sub.inputs[1] != kNoValue &&
          sub.attrs.empty()) {
        const uint32_t x = sub.inputs[0];
        *mean_value = sub.inputs[1];
        if (KeepdimReduce(*mean_value, "aten.mean.dim", dims, nodes) ==
            std::optional<uint32_t>(x)) {
          return x;
        }
      }
    }
    nodes->resize(mark);
    return std::nullopt;
  }

  // `value` = (x - mean) / sqrt(var + eps) or (x - mean) * rsqrt(var + eps),
  // var = mean((x - mean)^2); f32.
  std::optional<Norm> LayerNormCore(uint32_t value, Nodes* nodes) const {
    const TensorType& type = Type(value);
    if (type.dtype != TERN_DTYPE_F32) return std::nullopt;
    const size_t mark = nodes->size();
    // (centred, the sqrt or rsqrt value, whether it is rsqrt) to try.
    std::vector<std::pair<uint32_t, uint32_t>> splits;
    bool rsqrt = false;
    if (auto ab = TensorOp(value, {"aten.div.Tensor"}, nodes)) {
      splits.push_back(*ab);
    } else if ((ab = TensorOp(value, {"aten.mul.Tensor"}, nodes))) {
      rsqrt = true;
      splits.push_back(*ab);
      splits.emplace_back(ab->second, ab->first);
    }
    for (auto [xc, sv] : splits) {
      const size_t inner = nodes->size();
      Norm norm;
      std::vector<int64_t> mean_dims, var_dims;
      uint32_t mean = kNoValue, mean2 = kNoValue;
      const std::optional<uint32_t> a =
          UnaryOp(sv, rsqrt ? "aten.rsqrt.default" : "aten.sqrt.default", nodes);
      const std::optional<uint32_t> var = a ? PlusEps(*a, &norm.eps, nodes) : std::nullopt;
      const std::optional<uint32_t> sq =
          var ? KeepdimReduce(*var, "aten.mean.dim", &var_dims, nodes) : std::nullopt;
      const std::optional<uint32_t> xc2 = sq ? Square(*sq, nodes) : std::nullopt;
      // The two centred values may be one node, or two equal ones (as
      // export writes them before CSE).
      const std::optional<uint32_t> x = xc2 ? Centered(xc, &mean_dims, &mean, nodes) : std::nullopt;
      std::vector<int64_t> dims2;
      const std::optional<uint32_t> x2 =
          x && *xc2 != xc ? Centered(*xc2, &dims2, &mean2, nodes) : x;
      if (x.has_value() && x2 == x && (*xc2 == xc || mean2 == mean) && Type(*x) == type &&
          Type(xc) == type && Type(*xc2) == type && Type(*sq) == type) {
        const std::optional<std::vector<int64_t>> d1 = Normalized(mean_dims, type.shape.size());
        const std::optional<std::vector<int64_t>> d2 = Normalized(var_dims, type.shape.size());
        const std::optional<std::vector<int64_t>> trailing =
            d1 && d1 == d2 ? TrailingShape(type.shape, *d1) : std::nullopt;
        if (trailing.has_value()) {
          const TensorType stat{TERN_DTYPE_F32, KeptShape(type.shape, *d1)};
          if (Type(mean) == stat && Type(*var) == stat && Type(*a) == stat && Type(sv) == stat) {
            norm.x = *x;
            norm.dims = *d1;
            norm.normalized_shape = *trailing;
            return norm;
          }
        }
      }
      nodes->resize(inner);
    }
    nodes->resize(mark);
    return std::nullopt;
  }

  bool TryLayerNorm(uint32_t root) {
    const Node& node = g_.nodes[root];
    if (node.op != "aten.add.Tensor" && node.op != "aten.mul.Tensor" &&
        node.op != "aten.div.Tensor") {
      return false;
    }
    const uint32_t out = node.outputs[0];
    struct Candidate {
      uint32_t core, weight, bias;
      Nodes nodes;
    };
    std::vector<Candidate> candidates;
    Nodes base = {root};
    if (auto ab = TensorOp(out, {"aten.add.Tensor"}, &base)) {
      // (weight * norm) + bias or norm + bias, either order.
      for (auto [m, b] : {*ab, std::make_pair(ab->second, ab->first)}) {
        Nodes nodes = base;
        if (auto wn = TensorOp(m, {"aten.mul.Tensor"}, &nodes)) {
          candidates.push_back({wn->second, wn->first, b, nodes});
          candidates.push_back({wn->first, wn->second, b, nodes});
        }
        candidates.push_back({m, kNoValue, b, base});
      }
    }
    base = {root};
    if (auto wn = TensorOp(out, {"aten.mul.Tensor"}, &base)) {
      candidates.push_back({wn->second, wn->first, kNoValue, base});
      candidates.push_back({wn->first, wn->second, kNoValue, base});
    }
    candidates.push_back({out, kNoValue, kNoValue, {}});
    for (Candidate& c : candidates) {
      std::optional<Norm> norm = LayerNormCore(c.core, &c.nodes);
      if (!norm.has_value() || Type(norm->x) != Type(out) || Type(c.core) != Type(out)) continue;
      if (c.weight != kNoValue && !IsParam(c.weight, norm->normalized_shape)) continue;
      if (c.bias != kNoValue && !IsParam(c.bias, norm->normalized_shape)) continue;
      if (!SelfContained(root, &c.nodes, {norm->x, c.weight, c.bias})) continue;
      const Shape& shape = Type(out).shape;
      Shape stats(shape.begin(), shape.end() - static_cast<ptrdiff_t>(norm->dims.size()));
      stats.insert(stats.end(), norm->dims.size(), Dim::Constant(1));
      const TensorType stat{TERN_DTYPE_F32, stats};
      Commit(root, c.nodes, "aten.native_layer_norm.default", {norm->x, c.weight, c.bias},
             NormAttrs(*norm), {stat, stat});
      ++stats_.layer_norm;
      return true;
    }
    return false;
  }

  // ---- Softmax ------------------------------------------------------------------------

  // `value` = x - amax(x, [d], keepdim): x and d as written.
  std::optional<uint32_t> Shifted(uint32_t value, int64_t* dim, Nodes* nodes) const {
    const size_t mark = nodes->size();
    const std::optional<uint32_t> n = Def(value, {"aten.sub.Tensor"}, nodes);
    if (n.has_value()) {
      const Node& sub = g_.nodes[*n];
      std::vector<int64_t> dims;
      if (sub.inputs.size() == 2 && sub.inputs[0] != kNoValue && sub.inputs[1] != kNoValue &&
          sub.attrs.empty() &&
          KeepdimReduce(sub.inputs[1], "aten.amax.default", &dims, nodes) ==
              std::optional<uint32_t>(sub.inputs[0]) &&
          dims.size() == 1) {
        *dim = dims[0];
        return sub.inputs[0];
      }
    }
    nodes->resize(mark);
    return std::nullopt;
  }

  bool TrySoftmax(uint32_t root) {
    const Node& node = g_.nodes[root];
    const bool log = node.op == "aten.sub.Tensor";
    if (!log && node.op != "aten.div.Tensor") return false;
    const uint32_t out = node.outputs[0];
    const TensorType& type = Type(out);
    if (!IsFloatType(type.dtype) || type.shape.empty()) return false;
    Nodes nodes = {root};
    const auto ab = TensorOp(out, {node.op}, &nodes);
    if (!ab.has_value()) return false;
    // softmax: e / sum(e), e = exp(d); log-softmax: d - log(sum(exp(d))).
    uint32_t e = ab->first, s = ab->second, d = kNoValue;
    if (log) {
      d = ab->first;
      const std::optional<uint32_t> l = UnaryOp(ab->second, "aten.log.default", &nodes);
      if (!l.has_value()) return false;
      s = *l;
    }
    std::vector<int64_t> sum_dims;
    const std::optional<uint32_t> summed =
        KeepdimReduce(s, "aten.sum.dim_IntList", &sum_dims, &nodes);
    if (!summed.has_value() || sum_dims.size() != 1) return false;
    if (log) {
      e = *summed;
    } else if (*summed != e) {
      return false;
    }
    const std::optional<uint32_t> exp_in = UnaryOp(e, "aten.exp.default", &nodes);
    if (!exp_in.has_value()) return false;
    if (log && *exp_in != d) return false;
    d = *exp_in;
    int64_t dim = 0;
    const std::optional<uint32_t> x = Shifted(d, &dim, &nodes);
    if (!x.has_value() || Type(*x) != type || Type(d) != type || Type(e) != type) return false;
    const std::optional<std::vector<int64_t>> d1 = Normalized({dim}, type.shape.size());
    const std::optional<std::vector<int64_t>> d2 = Normalized(sum_dims, type.shape.size());
    if (!d1.has_value() || d1 != d2) return false;
    const TensorType stat{type.dtype, KeptShape(type.shape, *d1)};
    const uint32_t amax = g_.nodes[g_.values[d].node].inputs[1];
    if (Type(amax) != stat || Type(s) != stat || (log && Type(ab->second) != stat)) return false;
    if (!SelfContained(root, &nodes, {*x})) return false;
    Commit(root, nodes, log ? "aten._log_softmax.default" : "aten._softmax.default", {*x},
           {{"dim", dim}, {"half_to_float", false}});
    ++(log ? stats_.log_softmax : stats_.softmax);
    return true;
  }

  Graph& g_;
  passes_internal::GraphEdit edit_;
  std::vector<std::vector<uint32_t>> readers_;  // node indices, once per input slot
  std::vector<bool> is_output_;
  std::vector<bool> claimed_;
  PatternStats stats_;
};

}  // namespace

absl::StatusOr<PatternStats> ReplacePatterns(Graph* graph) { return Replacer(graph).Run(); }

}  // namespace tern::compiler
