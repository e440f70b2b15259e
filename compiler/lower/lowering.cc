#include "compiler/lower/lowering.h"

#include <absl/status/status.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "compiler/ir/ops.h"

namespace tern::compiler {
namespace {

// A Python number attribute ("other", "alpha"), kept exact for integers.
struct Number {
  bool is_int = true;
  int64_t i = 0;
  double d = 0.0;

  double AsDouble() const { return is_int ? static_cast<double>(i) : d; }
  bool IsOne() const { return is_int ? i == 1 : d == 1.0; }
  bool IsZero() const { return is_int ? i == 0 : d == 0.0; }
};

bool IsFloat(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16;
}
bool IsHalf(tern_dtype_t dtype) { return dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16; }

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

class Lowerer;
using LowerFn = absl::Status (Lowerer::*)(const Node& node);

class Lowerer {
 public:
  explicit Lowerer(const Graph& graph) : graph_(graph) {}

  absl::StatusOr<LoweredProgram> Run() {
    MarkNeeded();
    FindBatchNormsToFold();
    FindLastUses();
    if (absl::Status status = CheckShapes(); !status.ok()) return status;
    refs_.resize(graph_.values.size());
    outputs_of_value_.resize(graph_.values.size());
    for (uint32_t j = 0; j < graph_.outputs.size(); ++j) {
      outputs_of_value_[graph_.outputs[j].value].push_back(j);
    }
    ChooseOutputsComputedInPlace();
    for (uint32_t id = 0; id < graph_.values.size(); ++id) {
      const Value& value = graph_.values[id];
      if (value.kind == Value::kInput) {
        refs_[id] =
            TensorRef::Contiguous({BufferRef::kInput, value.index}, value.type.dtype, ShapeOf(id));
      } else if (value.kind == Value::kConstant && needed_[id]) {
        const uint32_t entry = program_.constants.Add(graph_.constants[value.index]);
        refs_[id] =
            TensorRef::Contiguous({BufferRef::kConstant, entry}, value.type.dtype, ShapeOf(id));
      }
    }
    // Outputs that are inputs or constants: copied before anything else.
    for (uint32_t id = 0; id < graph_.values.size(); ++id) {
      if (graph_.values[id].kind != Value::kNode) CopyToOutputs(id);
    }
    for (uint32_t index = 0; index < graph_.nodes.size(); ++index) {
      if (!node_needed_[index]) continue;
      const Node& node = graph_.nodes[index];
      current_node_ = index;
      const auto found = Table().find(node.op);
      if (found == Table().end()) {
        return absl::UnimplementedError(fmt::format(
            "{}: the op {} is not supported by the compiler yet (docs/compiler.md lists what "
            "is lowered); rewrite the model around it or extend compiler/lower",
            DescribeNode(node), node.op));
      }
      if (absl::Status status = (this->*(found->second))(node); !status.ok()) return status;
      for (uint32_t output : node.outputs) {
        if (needed_[output] && !refs_[output].has_value()) {
          return absl::InternalError(
              fmt::format("{}: lowering left output '{}' without a buffer (a compiler bug)",
                          DescribeNode(node), graph_.values[output].name));
        }
        CopyToOutputs(output);
      }
    }
    return std::move(program_);
  }

 private:
  static const std::map<std::string_view, LowerFn>& Table();

  // ---- Analysis --------------------------------------------------------------------------

  // Values the outputs depend on; nodes none of whose outputs are needed
  // are dropped.
  void MarkNeeded() {
    needed_.assign(graph_.values.size(), false);
    node_needed_.assign(graph_.nodes.size(), false);
    for (const Graph::Output& output : graph_.outputs) needed_[output.value] = true;
    for (size_t index = graph_.nodes.size(); index-- > 0;) {
      const Node& node = graph_.nodes[index];
      for (uint32_t output : node.outputs)
        node_needed_[index] = node_needed_[index] || needed_[output];
      if (!node_needed_[index]) continue;
      for (uint32_t input : node.inputs) {
        if (input != kNoValue) needed_[input] = true;
      }
    }
  }

  // A batch norm (eval) whose input is a convolution that nothing else
  // reads, with every weight, bias and statistic an f32 graph constant (an
  // exported eval model), is folded into the convolution's weights and bias
  // at compile time: the standard inference fusion, two instructions fewer
  // per convolution. The constants only they read are then not stored.
  void FindBatchNormsToFold() {
    folded_into_conv_.assign(graph_.nodes.size(), kNoNode);
    std::vector<uint32_t> readers(graph_.values.size(), 0);
    for (const Graph::Output& output : graph_.outputs) ++readers[output.value];
    for (uint32_t index = 0; index < graph_.nodes.size(); ++index) {
      if (!node_needed_[index]) continue;
      for (uint32_t input : graph_.nodes[index].inputs) {
        if (input != kNoValue) ++readers[input];
      }
    }
    std::vector<bool> folded(graph_.nodes.size(), false);
    for (uint32_t index = 0; index < graph_.nodes.size(); ++index) {
      const Node& norm = graph_.nodes[index];
      if (!node_needed_[index] || norm.op != kBatchNormOp) continue;
      if (needed_[norm.outputs[1]] || needed_[norm.outputs[2]]) continue;
      const uint32_t conv_out = norm.inputs[0];
      const Value& produced = graph_.values[conv_out];
      if (produced.kind != Value::kNode || readers[conv_out] != 1) continue;
      const Node& conv = graph_.nodes[produced.node];
      if (conv.op != "aten.convolution.default" || !BatchNormScaleShift(norm).has_value() ||
          !ConstantFloats(conv.inputs[1]).has_value() ||
          (conv.inputs.size() > 2 && conv.inputs[2] != kNoValue &&
           !ConstantFloats(conv.inputs[2]).has_value())) {
        continue;
      }
      folded_into_conv_[produced.node] = index;
      folded[produced.node] = folded[index] = true;
    }
    // Constants read only by folded nodes (and no graph output) are not needed.
    std::vector<bool> read_elsewhere(graph_.values.size(), false);
    for (const Graph::Output& output : graph_.outputs) read_elsewhere[output.value] = true;
    for (uint32_t index = 0; index < graph_.nodes.size(); ++index) {
      if (!node_needed_[index] || folded[index]) continue;
      for (uint32_t input : graph_.nodes[index].inputs) {
        if (input != kNoValue) read_elsewhere[input] = true;
      }
    }
    for (uint32_t index = 0; index < graph_.nodes.size(); ++index) {
      if (!folded[index]) continue;
      const Node& node = graph_.nodes[index];
      for (size_t slot = 1; slot < node.inputs.size(); ++slot) {
        const uint32_t input = node.inputs[slot];
        if (input != kNoValue && graph_.values[input].kind == Value::kConstant &&
            !read_elsewhere[input]) {
          needed_[input] = false;
        }
      }
    }
  }

  // The elements of an f32 graph constant; nullopt for anything else.
  std::optional<std::vector<float>> ConstantFloats(uint32_t value) const {
    if (value == kNoValue || graph_.values[value].kind != Value::kConstant ||
        graph_.values[value].type.dtype != TERN_DTYPE_F32) {
      return std::nullopt;
    }
    const std::vector<uint8_t>& bytes = graph_.constants[graph_.values[value].index];
    std::vector<float> floats(bytes.size() / sizeof(float));
    if (!bytes.empty()) std::memcpy(floats.data(), bytes.data(), floats.size() * sizeof(float));
    return floats;
  }

  struct ScaleShift {
    std::vector<float> scale, shift;  // per channel
  };

  // A batch norm (eval) as out = x * scale + shift, computed here when its
  // weight, bias and statistics are f32 constants (absent weight: 1, bias: 0).
  std::optional<ScaleShift> BatchNormScaleShift(const Node& node) const {
    std::optional<std::vector<float>> mean = ConstantFloats(node.inputs[3]);
    std::optional<std::vector<float>> var = ConstantFloats(node.inputs[4]);
    std::optional<std::vector<float>> weight, bias;
    if (node.inputs[1] != kNoValue) weight = ConstantFloats(node.inputs[1]);
    if (node.inputs[2] != kNoValue) bias = ConstantFloats(node.inputs[2]);
    absl::StatusOr<double> eps = Context(node).Float("eps", 1e-5);
    if (!mean || !var || (node.inputs[1] != kNoValue && !weight) ||
        (node.inputs[2] != kNoValue && !bias) || !eps.ok()) {
      return std::nullopt;
    }
    ScaleShift result;
    for (size_t c = 0; c < mean->size(); ++c) {
      const double scale = (weight ? (*weight)[c] : 1.0) / std::sqrt(double((*var)[c]) + *eps);
      result.scale.push_back(static_cast<float>(scale));
      result.shift.push_back(static_cast<float>((bias ? (*bias)[c] : 0.0) - (*mean)[c] * scale));
    }
    return result;
  }

  // A graph output that is a reshape of a computed value (y = h.view(...),
  // a final squeeze or clone) needs no copy: the value is computed straight
  // into the output buffer, whose bytes the reshape only relabels.
  void ChooseOutputsComputedInPlace() {
    static const std::set<std::string_view> kRelabels = {
        "aten.view.default",    "aten._unsafe_view.default", "aten.clone.default",
        "aten.alias.default",   "aten.squeeze.dims",         "aten.squeeze.dim",
        "aten.squeeze.default", "aten.unsqueeze.default",
    };
    computed_into_.assign(graph_.values.size(), std::nullopt);
    for (uint32_t j = 0; j < graph_.outputs.size(); ++j) {
      uint32_t value = graph_.outputs[j].value;
      if (outputs_of_value_[value][0] != j) continue;
      while (graph_.values[value].kind == Value::kNode) {
        const Node& node = graph_.nodes[graph_.values[value].node];
        if (kRelabels.count(node.op) == 0) break;
        value = node.inputs[0];
        if (!outputs_of_value_[value].empty()) break;  // written into its own output
      }
      if (value == graph_.outputs[j].value || graph_.values[value].kind != Value::kNode ||
          !outputs_of_value_[value].empty() || computed_into_[value].has_value()) {
        continue;
      }
      computed_into_[value] = j;
    }
  }

  // The value owning each value's buffer (a view's is its input's; a view
  // that turns out to need a copy is counted with its input, which only
  // makes its input live longer), and the last node that reads each owner's
  // buffer, directly or through views.
  void FindLastUses() {
    static const std::set<std::string_view> kMaybeViews = {
        "aten.view.default",      "aten._unsafe_view.default",
        "aten.permute.default",   "aten.t.default",
        "aten.transpose.int",     "aten.expand.default",
        "aten.unsqueeze.default", "aten.squeeze.dims",
        "aten.squeeze.dim",       "aten.squeeze.default",
        "aten.slice.Tensor",      "aten.select.int",
        "aten.clone.default",     "aten.alias.default",
        "aten._to_copy.default",  "aten.split_with_sizes.default",
    };
    owner_.resize(graph_.values.size());
    for (uint32_t id = 0; id < graph_.values.size(); ++id) owner_[id] = id;
    last_use_.assign(graph_.values.size(), 0);
    for (uint32_t index = 0; index < graph_.nodes.size(); ++index) {
      const Node& node = graph_.nodes[index];
      if (!node_needed_[index]) continue;
      for (uint32_t input : node.inputs) {
        if (input != kNoValue) last_use_[owner_[input]] = index;
      }
      if (kMaybeViews.count(node.op) > 0) {
        for (uint32_t output : node.outputs) owner_[output] = owner_[node.inputs[0]];
      }
    }
  }

  absl::Status CheckShapes() const {
    for (uint32_t id = 0; id < graph_.values.size(); ++id) {
      const Value& value = graph_.values[id];
      if (!needed_[id] && value.kind != Value::kInput) continue;
      for (const Dim& dim : value.type.shape) {
        if (dim.is_constant()) continue;
        std::string where =
            value.kind == Value::kNode
                ? fmt::format(", output of {}", DescribeNode(graph_.nodes[value.node]))
                : std::string();
        return absl::UnimplementedError(fmt::format(
            "value '{}'{} has the symbolic shape {}: symbolic shapes are not lowered yet; "
            "export the model with static shapes",
            value.name, where, ShapeString(value.type.shape, graph_.symbols)));
      }
      if (value.type.shape.size() > TERN_MAX_RANK) {
        return absl::UnimplementedError(
            fmt::format("value '{}' has rank {}: executables take at most rank {}", value.name,
                        value.type.shape.size(), TERN_MAX_RANK));
      }
    }
    return absl::OkStatus();
  }

  std::vector<int64_t> ShapeOf(uint32_t value) const {
    return StaticSizes(graph_.values[value].type.shape);
  }
  tern_dtype_t DtypeOf(uint32_t value) const { return graph_.values[value].type.dtype; }

  // ---- Attributes ------------------------------------------------------------------------

  InferContext Context(const Node& node) const { return InferContext{graph_, node, {}}; }

  absl::Status Error(const Node& node, std::string_view message) const {
    return absl::InvalidArgumentError(fmt::format("{}: {}", DescribeNode(node), message));
  }

  std::optional<Number> NumberAttr(const Node& node, const std::string& name) const {
    const Attribute* attr = FindAttr(node, name);
    if (attr == nullptr) return std::nullopt;
    if (const auto* i = std::get_if<int64_t>(&attr->value)) return Number{true, *i, 0.0};
    if (const auto* d = std::get_if<double>(&attr->value)) return Number{false, 0, *d};
    if (const auto* b = std::get_if<bool>(&attr->value)) return Number{true, *b ? 1 : 0, 0.0};
    return std::nullopt;
  }

  absl::StatusOr<int64_t> NormalizeDim(const Node& node, int64_t dim, size_t rank) const {
    const int64_t r = static_cast<int64_t>(rank);
    const int64_t normalized = dim < 0 ? dim + r : dim;
    if (normalized < 0 || normalized >= std::max<int64_t>(r, 1)) {
      return Error(node, fmt::format("dim {} is out of range for rank {}", dim, rank));
    }
    return normalized;
  }

  absl::StatusOr<std::vector<int64_t>> NormalizeDims(const Node& node,
                                                     const std::vector<int64_t>& dims,
                                                     size_t rank) const {
    std::vector<int64_t> out;
    for (int64_t dim : dims) {
      absl::StatusOr<int64_t> normalized = NormalizeDim(node, dim, rank);
      if (!normalized.ok()) return normalized.status();
      out.push_back(*normalized);
    }
    return out;
  }

  // ---- Buffers and instructions ----------------------------------------------------------

  TensorRef NewScratch(tern_dtype_t dtype, std::vector<int64_t> shape) {
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    program_.scratch_bytes.push_back(static_cast<uint64_t>(elements) * tern_dtype_size(dtype));
    return TensorRef::Contiguous(
        {BufferRef::kScratch, static_cast<uint32_t>(program_.scratch_bytes.size() - 1)}, dtype,
        std::move(shape));
  }

  // Where a node's output is computed: straight into the first graph output
  // that names it, else a fresh scratch buffer. Records it as the value's ref.
  TensorRef Produce(uint32_t value) {
    std::optional<uint32_t> output = computed_into_[value];
    if (!outputs_of_value_[value].empty()) output = outputs_of_value_[value][0];
    TensorRef ref = output.has_value() ? TensorRef::Contiguous({BufferRef::kOutput, *output},
                                                               DtypeOf(value), ShapeOf(value))
                                       : NewScratch(DtypeOf(value), ShapeOf(value));
    refs_[value] = ref;
    return ref;
  }

  // The output of an elementwise instruction: computed in place over an
  // operand whose buffer dies here when the layouts are identical (what the
  // ISA allows for aliasing), else as Produce does.
  TensorRef ProduceElementwise(const Node& node, uint32_t value,
                               const std::vector<TensorRef>& operands) {
    if (!outputs_of_value_[value].empty() || computed_into_[value].has_value()) {
      return Produce(value);
    }
    const TensorRef wanted = TensorRef::Contiguous({}, DtypeOf(value), ShapeOf(value));
    for (uint32_t input : node.inputs) {
      if (input == kNoValue || last_use_[owner_[input]] != current_node_) continue;
      const TensorRef& candidate = *refs_[input];
      if (candidate.buffer.kind != BufferRef::kScratch || candidate.offset != 0 ||
          candidate.dtype != wanted.dtype || candidate.shape != wanted.shape ||
          !candidate.IsContiguous() ||
          program_.scratch_bytes[candidate.buffer.index] !=
              static_cast<uint64_t>(wanted.Elements()) * tern_dtype_size(wanted.dtype)) {
        continue;
      }
      // Every operand in that buffer must read it with this same layout.
      bool same_layout = true;
      for (const TensorRef& operand : operands) {
        if (operand.buffer == candidate.buffer) {
          same_layout = same_layout && operand.offset == 0 && operand.shape == candidate.shape &&
                        operand.strides == candidate.strides && operand.dtype == candidate.dtype;
        }
      }
      if (!same_layout) continue;
      refs_[value] = candidate;
      return candidate;
    }
    return Produce(value);
  }

  void Emit(tern_opcode_t opcode, std::vector<TensorRef> operands, std::vector<int64_t> ints = {},
            std::vector<double> floats = {}, uint32_t written = 1) {
    LoweredInstruction instruction;
    instruction.opcode = opcode;
    instruction.operands = std::move(operands);
    instruction.written = written;
    instruction.ints = std::move(ints);
    instruction.floats = std::move(floats);
    instruction.node = current_node_;
    program_.instructions.push_back(std::move(instruction));
  }

  // dst = src, converting the dtype when they differ.
  void CopyInto(const TensorRef& dst, const TensorRef& src) {
    Emit(dst.dtype == src.dtype ? TERN_OP_COPY : TERN_OP_CAST, {dst, src});
  }

  TensorRef CastTo(const TensorRef& ref, tern_dtype_t dtype) {
    if (ref.dtype == dtype) return ref;
    TensorRef converted = NewScratch(dtype, ref.shape);
    Emit(TERN_OP_CAST, {converted, ref});
    return converted;
  }

  TensorRef Scalar(const Number& number, tern_dtype_t dtype, const std::vector<int64_t>& shape) {
    const uint32_t entry = number.is_int && !IsFloat(dtype)
                               ? program_.constants.AddInt(number.i, dtype)
                               : program_.constants.AddScalar(number.AsDouble(), dtype);
    TensorRef ref;
    ref.buffer = {BufferRef::kConstant, entry};
    ref.dtype = dtype;
    ref.shape = shape;
    ref.strides.assign(shape.size(), 0);
    return ref;
  }

  // Tensor input `slot` of the node (or the Python number in attribute
  // `attr` when the input is absent), in `dtype`, broadcast to `shape`.
  absl::StatusOr<TensorRef> Operand(const Node& node, size_t slot, const std::string& attr,
                                    tern_dtype_t dtype, const std::vector<int64_t>& shape) {
    if (slot < node.inputs.size() && node.inputs[slot] != kNoValue) {
      const uint32_t value = node.inputs[slot];
      const TensorRef converted = CastTo(*refs_[value], dtype);
      std::optional<TensorRef> broadcast = converted.BroadcastTo(shape);
      if (!broadcast.has_value()) {
        return Error(node, fmt::format("input '{}' of shape {} does not broadcast to {}",
                                       graph_.values[value].name, ShapeText(converted.shape),
                                       ShapeText(shape)));
      }
      return *broadcast;
    }
    std::optional<Number> number = NumberAttr(node, attr);
    if (!number.has_value()) {
      return Error(node, fmt::format("has neither a tensor input {} nor a number attribute '{}'",
                                     slot, attr));
    }
    return Scalar(*number, dtype, shape);
  }

  const TensorRef& In(const Node& node, size_t slot) const { return *refs_[node.inputs[slot]]; }

  // Graph outputs naming `value` that it was not computed into get a copy.
  void CopyToOutputs(uint32_t value) {
    for (uint32_t j : outputs_of_value_[value]) {
      const TensorRef& ref = *refs_[value];
      if (ref.buffer == BufferRef{BufferRef::kOutput, j} && ref.offset == 0 && ref.IsContiguous()) {
        continue;  // computed in place
      }
      LoweredInstruction instruction;
      instruction.opcode = TERN_OP_COPY;
      instruction.operands = {
          TensorRef::Contiguous({BufferRef::kOutput, j}, DtypeOf(value), ShapeOf(value)), ref};
      instruction.node = graph_.values[value].kind == Value::kNode ? current_node_ : kNoNode;
      instruction.output = j;
      program_.instructions.push_back(std::move(instruction));
    }
  }

  // ---- View ops: no instruction ----------------------------------------------------------

  absl::Status SetView(const Node& node, TensorRef ref) {
    const uint32_t out = node.outputs[0];
    if (ref.shape != ShapeOf(out)) {
      return absl::InternalError(
          fmt::format("{}: the view's shape {} differs from the inferred {} (a compiler bug)",
                      DescribeNode(node), ShapeText(ref.shape), ShapeText(ShapeOf(out))));
    }
    refs_[out] = std::move(ref);
    return absl::OkStatus();
  }

  absl::Status LowerIdentity(const Node& node) { return SetView(node, In(node, 0)); }

  absl::Status LowerReshape(const Node& node) {
    const TensorRef& in = In(node, 0);
    const std::vector<int64_t> shape = ShapeOf(node.outputs[0]);
    if (std::optional<TensorRef> view = in.Reshape(shape)) return SetView(node, *view);
    // The strides cannot express it: copy into a contiguous buffer, written
    // through the input's shape.
    TensorRef out = Produce(node.outputs[0]);
    Emit(TERN_OP_COPY, {*out.Reshape(in.shape), in});
    return absl::OkStatus();
  }

  absl::Status LowerPermute(const Node& node) {
    absl::StatusOr<std::vector<int64_t>> dims = Context(node).Ints("dims", {});
    if (!dims.ok()) return dims.status();
    const TensorRef& in = In(node, 0);
    absl::StatusOr<std::vector<int64_t>> normalized = NormalizeDims(node, *dims, in.shape.size());
    if (!normalized.ok()) return normalized.status();
    return SetView(node, in.Permute(*normalized));
  }

  absl::Status LowerTranspose(const Node& node) {
    const TensorRef& in = In(node, 0);
    const size_t rank = in.shape.size();
    int64_t a = 0, b = 1;
    if (node.op == "aten.t.default") {
      if (rank < 2) return SetView(node, in);
    } else {
      absl::StatusOr<int64_t> dim0 = Context(node).Int("dim0", 0);
      absl::StatusOr<int64_t> dim1 = Context(node).Int("dim1", 1);
      if (!dim0.ok()) return dim0.status();
      if (!dim1.ok()) return dim1.status();
      absl::StatusOr<int64_t> na = NormalizeDim(node, *dim0, rank);
      absl::StatusOr<int64_t> nb = NormalizeDim(node, *dim1, rank);
      if (!na.ok()) return na.status();
      if (!nb.ok()) return nb.status();
      a = *na;
      b = *nb;
    }
    std::vector<int64_t> dims(rank);
    for (size_t i = 0; i < rank; ++i) dims[i] = static_cast<int64_t>(i);
    if (rank > 0) std::swap(dims[static_cast<size_t>(a)], dims[static_cast<size_t>(b)]);
    return SetView(node, in.Permute(dims));
  }

  absl::Status LowerExpand(const Node& node) {
    std::optional<TensorRef> view = In(node, 0).BroadcastTo(ShapeOf(node.outputs[0]));
    if (!view.has_value()) return Error(node, "the input does not broadcast to the size");
    return SetView(node, *view);
  }

  absl::Status LowerUnsqueeze(const Node& node) {
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
    if (!dim.ok()) return dim.status();
    const TensorRef& in = In(node, 0);
    absl::StatusOr<int64_t> normalized = NormalizeDim(node, *dim, in.shape.size() + 1);
    if (!normalized.ok()) return normalized.status();
    return SetView(node, in.Unsqueeze(*normalized));
  }

  absl::Status LowerSqueeze(const Node& node) {
    const TensorRef& in = In(node, 0);
    std::vector<int64_t> dims;
    if (node.op == "aten.squeeze.default") {
      for (size_t i = 0; i < in.shape.size(); ++i) dims.push_back(static_cast<int64_t>(i));
    } else if (node.op == "aten.squeeze.dim") {
      absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
      if (!dim.ok()) return dim.status();
      dims.push_back(*dim);
    } else {
      absl::StatusOr<std::vector<int64_t>> list = Context(node).Ints("dim", {});
      if (!list.ok()) return list.status();
      dims = *list;
    }
    if (in.shape.empty()) return SetView(node, in);
    absl::StatusOr<std::vector<int64_t>> normalized = NormalizeDims(node, dims, in.shape.size());
    if (!normalized.ok()) return normalized.status();
    return SetView(node, in.Squeeze(*normalized));
  }

  absl::Status LowerSlice(const Node& node) {
    const InferContext context = Context(node);
    const TensorRef& in = In(node, 0);
    absl::StatusOr<int64_t> dim = context.Int("dim", 0);
    absl::StatusOr<int64_t> start = context.Int("start", 0);
    absl::StatusOr<int64_t> end = context.Int("end", std::numeric_limits<int64_t>::max());
    absl::StatusOr<int64_t> step = context.Int("step", 1);
    for (const auto* s : {&dim, &start, &end, &step}) {
      if (!s->ok()) return s->status();
    }
    absl::StatusOr<int64_t> d = NormalizeDim(node, *dim, in.shape.size());
    if (!d.ok()) return d.status();
    if (*step < 1) return Error(node, "slice step must be positive");
    const int64_t size = in.shape[static_cast<size_t>(*d)];
    auto clamp = [size](int64_t at) {
      if (at < 0) at += size;
      return std::clamp<int64_t>(at, 0, size);
    };
    const int64_t first = clamp(*start);
    const int64_t last = std::max(first, clamp(*end));
    const int64_t length = (last - first + *step - 1) / *step;
    return SetView(node, in.Slice(*d, first, length, *step));
  }

  // Each output is a slice of the input: views, like slice.
  absl::Status LowerSplit(const Node& node) {
    const TensorRef& in = In(node, 0);
    absl::StatusOr<std::vector<int64_t>> sizes = Context(node).Ints("split_sizes", {});
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
    if (!sizes.ok()) return sizes.status();
    if (!dim.ok()) return dim.status();
    absl::StatusOr<int64_t> d = NormalizeDim(node, *dim, in.shape.size());
    if (!d.ok()) return d.status();
    if (sizes->size() != node.outputs.size()) {
      return Error(node, "has a different number of split sizes and outputs");
    }
    int64_t at = 0;
    for (size_t i = 0; i < sizes->size(); ++i) {
      refs_[node.outputs[i]] = in.Slice(*d, at, (*sizes)[i], 1);
      at += (*sizes)[i];
    }
    return absl::OkStatus();
  }

  absl::Status LowerSelect(const Node& node) {
    const TensorRef& in = In(node, 0);
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
    absl::StatusOr<int64_t> index = Context(node).Int("index", 0);
    if (!dim.ok()) return dim.status();
    if (!index.ok()) return index.status();
    absl::StatusOr<int64_t> d = NormalizeDim(node, *dim, in.shape.size());
    if (!d.ok()) return d.status();
    const int64_t size = in.shape[static_cast<size_t>(*d)];
    const int64_t at = *index < 0 ? *index + size : *index;
    if (at < 0 || at >= size) {
      return Error(node, fmt::format("index {} is out of range for size {}", *index, size));
    }
    return SetView(node, in.Select(*d, at));
  }

  absl::Status LowerToCopy(const Node& node) {
    const uint32_t out = node.outputs[0];
    if (DtypeOf(out) == In(node, 0).dtype) return SetView(node, In(node, 0));
    Emit(TERN_OP_CAST, {Produce(out), In(node, 0)});
    return absl::OkStatus();
  }

  // ---- Compute ops -----------------------------------------------------------------------

  absl::Status LowerBinary(const Node& node) {
    static const std::map<std::string_view, tern_binary_fn_t> kFns = {
        {"aten.add.Tensor", TERN_BINARY_ADD},
        {"aten.add.Scalar", TERN_BINARY_ADD},
        {"aten.sub.Tensor", TERN_BINARY_SUB},
        {"aten.sub.Scalar", TERN_BINARY_SUB},
        {"aten.mul.Tensor", TERN_BINARY_MUL},
        {"aten.mul.Scalar", TERN_BINARY_MUL},
        {"aten.div.Tensor", TERN_BINARY_DIV},
        {"aten.div.Scalar", TERN_BINARY_DIV},
        {"aten.maximum.default", TERN_BINARY_MAX},
        {"aten.minimum.default", TERN_BINARY_MIN},
        {"aten.eq.Tensor", TERN_BINARY_EQ},
        {"aten.gt.Tensor", TERN_BINARY_GT},
        {"aten.lt.Tensor", TERN_BINARY_LT},
        {"aten.ne.Tensor", TERN_BINARY_NE},
        {"aten.ge.Tensor", TERN_BINARY_GE},
        {"aten.le.Tensor", TERN_BINARY_LE},
        {"aten.eq.Scalar", TERN_BINARY_EQ},
        {"aten.ne.Scalar", TERN_BINARY_NE},
        {"aten.gt.Scalar", TERN_BINARY_GT},
        {"aten.ge.Scalar", TERN_BINARY_GE},
        {"aten.lt.Scalar", TERN_BINARY_LT},
        {"aten.le.Scalar", TERN_BINARY_LE},
        {"aten.logical_and.default", TERN_BINARY_LOGICAL_AND},
        {"aten.logical_or.default", TERN_BINARY_LOGICAL_OR},
        {"aten.bitwise_and.Tensor", TERN_BINARY_BITWISE_AND},
        {"aten.bitwise_or.Tensor", TERN_BINARY_BITWISE_OR},
    };
    tern_binary_fn_t fn = kFns.at(node.op);
    const uint32_t out = node.outputs[0];
    const bool comparison = fn == TERN_BINARY_EQ || fn == TERN_BINARY_NE || fn == TERN_BINARY_GT ||
                            fn == TERN_BINARY_GE || fn == TERN_BINARY_LT || fn == TERN_BINARY_LE;
    const bool logical = fn == TERN_BINARY_LOGICAL_AND || fn == TERN_BINARY_LOGICAL_OR;
    const tern_dtype_t dtype = comparison ? CompareDtype(node)
                               : logical  ? LogicalDtype(node)
                                          : DtypeOf(out);
    const std::vector<int64_t> shape = ShapeOf(out);
    const std::optional<Number> alpha = NumberAttr(node, "alpha");
    const bool scaled = alpha.has_value() && !alpha->IsOne();
    if (dtype == TERN_DTYPE_BOOL && !comparison) {
      // bool arithmetic is logical, as in PyTorch.
      if (fn == TERN_BINARY_ADD && !scaled) fn = TERN_BINARY_LOGICAL_OR;
      if (fn == TERN_BINARY_MUL) fn = TERN_BINARY_LOGICAL_AND;
    }
    absl::StatusOr<TensorRef> a = Operand(node, 0, "self", dtype, shape);
    if (!a.ok()) return a.status();
    absl::StatusOr<TensorRef> b;
    const bool other_is_number = node.inputs.size() < 2 || node.inputs[1] == kNoValue;
    if (scaled && other_is_number) {
      // a + alpha * number: fold alpha into the constant.
      std::optional<Number> other = NumberAttr(node, "other");
      if (!other.has_value()) return Error(node, "has neither a tensor 'other' nor a number");
      Number product;
      if (other->is_int && alpha->is_int) {
        product.i = other->i * alpha->i;
      } else {
        product = Number{false, 0, other->AsDouble() * alpha->AsDouble()};
      }
      b = Scalar(product, dtype, shape);
    } else {
      b = Operand(node, 1, "other", dtype, shape);
      if (!b.ok()) return b.status();
      if (scaled) {
        TensorRef product = NewScratch(dtype, shape);
        Emit(TERN_OP_BINARY, {product, *b, Scalar(*alpha, dtype, shape)}, {TERN_BINARY_MUL});
        b = product;
      }
    }
    Emit(TERN_OP_BINARY, {ProduceElementwise(node, out, {*a, *b}), *a, *b}, {fn});
    return absl::OkStatus();
  }

  // The dtype a comparison compares in: the tensors' common dtype (a float
  // one when either is float), or the tensor's own against a number.
  tern_dtype_t CompareDtype(const Node& node) const {
    std::optional<tern_dtype_t> common;
    for (uint32_t input : node.inputs) {
      if (input == kNoValue) continue;
      const tern_dtype_t dtype = DtypeOf(input);
      if (!common.has_value() || (IsFloat(dtype) && !IsFloat(*common)) ||
          (IsFloat(dtype) == IsFloat(*common) &&
           tern_dtype_size(dtype) > tern_dtype_size(*common))) {
        common = dtype;
      }
    }
    std::optional<Number> number = NumberAttr(node, "other");
    if (!number.has_value()) number = NumberAttr(node, "self");  // 2 < x as lt.Tensor(2, x)
    if (common.has_value() && number.has_value() && !number->is_int && !IsFloat(*common)) {
      return TERN_DTYPE_F32;
    }
    return common.value_or(TERN_DTYPE_F32);
  }

  // The dtype logical_and/or read their tensors in: their own when they
  // have one dtype; bool when they differ (a cast to bool is exactly "not
  // zero", NaN included, where promoting could round a tiny value to 0).
  tern_dtype_t LogicalDtype(const Node& node) const {
    const tern_dtype_t a = DtypeOf(node.inputs[0]), b = DtypeOf(node.inputs[1]);
    return a == b ? a : TERN_DTYPE_BOOL;
  }

  absl::Status LowerUnary(const Node& node) {
    static const std::map<std::string_view, tern_unary_fn_t> kFns = {
        {"aten.relu.default", TERN_UNARY_RELU},
        {"aten.tanh.default", TERN_UNARY_TANH},
        {"aten.sigmoid.default", TERN_UNARY_SIGMOID},
        {"aten.exp.default", TERN_UNARY_EXP},
        {"aten.neg.default", TERN_UNARY_NEG},
        {"aten.rsqrt.default", TERN_UNARY_RSQRT},
        {"aten.sqrt.default", TERN_UNARY_SQRT},
        {"aten.log.default", TERN_UNARY_LOG},
        {"aten.abs.default", TERN_UNARY_ABS},
        {"aten.gelu.default", TERN_UNARY_GELU},
        {"aten.cos.default", TERN_UNARY_COS},
        {"aten.sin.default", TERN_UNARY_SIN},
        {"aten.erf.default", TERN_UNARY_ERF},
        {"aten.silu.default", TERN_UNARY_SILU},
        {"aten.logical_not.default", TERN_UNARY_LOGICAL_NOT},
        {"aten.bitwise_not.default", TERN_UNARY_BITWISE_NOT},
    };
    tern_unary_fn_t fn = kFns.at(node.op);
    std::vector<double> floats;
    if (fn == TERN_UNARY_GELU) {
      absl::StatusOr<std::string> approximate = Context(node).String("approximate", "none");
      if (!approximate.ok()) return approximate.status();
      if (*approximate == "tanh") {
        fn = TERN_UNARY_GELU_TANH;
      } else if (*approximate != "none") {
        return Error(node,
                     fmt::format("gelu approximate='{}' is not 'none' or 'tanh'", *approximate));
      }
    }
    const uint32_t out = node.outputs[0];
    const TensorRef in = CastTo(In(node, 0), DtypeOf(out));
    Emit(TERN_OP_UNARY, {ProduceElementwise(node, out, {in}), in}, {fn}, std::move(floats));
    return absl::OkStatus();
  }

  absl::Status LowerPowScalar(const Node& node) {
    const std::optional<Number> exponent = NumberAttr(node, "exponent");
    if (!exponent.has_value()) return Error(node, "needs the number attribute 'exponent'");
    const uint32_t out = node.outputs[0];
    if (!IsFloat(DtypeOf(out))) {
      return Error(node, "pow with a scalar exponent is lowered for float tensors only so far");
    }
    const TensorRef in = CastTo(In(node, 0), DtypeOf(out));
    Emit(TERN_OP_UNARY, {Produce(out), in}, {TERN_UNARY_POW_SCALAR}, {exponent->AsDouble()});
    return absl::OkStatus();
  }

  absl::Status LowerMatmul(const Node& node) {
    Emit(TERN_OP_MATMUL, {Produce(node.outputs[0]), In(node, 0), In(node, 1)});
    return absl::OkStatus();
  }

  absl::Status LowerAddmm(const Node& node) {
    const Number beta = NumberAttr(node, "beta").value_or(Number{true, 1, 0.0});
    const Number alpha = NumberAttr(node, "alpha").value_or(Number{true, 1, 0.0});
    const uint32_t out_value = node.outputs[0];
    const std::vector<int64_t> shape = ShapeOf(out_value);
    const TensorRef out = Produce(out_value);
    std::vector<double> floats;
    if (!alpha.IsOne()) floats.push_back(alpha.AsDouble());
    if (beta.IsZero()) {
      Emit(TERN_OP_MATMUL, {out, In(node, 1), In(node, 2)}, {}, std::move(floats));
      return absl::OkStatus();
    }
    std::optional<TensorRef> bias = In(node, 0).BroadcastTo(shape);
    if (!bias.has_value()) return Error(node, "the bias does not broadcast to the product");
    if (beta.IsOne()) {
      const TensorRef converted = CastTo(*bias, DtypeOf(out_value));
      Emit(TERN_OP_MATMUL, {out, In(node, 1), In(node, 2), converted}, {}, std::move(floats));
      return absl::OkStatus();
    }
    // out = beta * bias + alpha * m1 @ m2: the bias goes into out first.
    CopyInto(out, *bias);
    Emit(TERN_OP_MATMUL, {out, In(node, 1), In(node, 2)}, {}, {alpha.AsDouble(), beta.AsDouble()});
    return absl::OkStatus();
  }

  absl::Status LowerReduce(const Node& node) {
    const InferContext context = Context(node);
    tern_reduce_fn_t fn = TERN_REDUCE_SUM;
    if (node.op == "aten.mean.dim") fn = TERN_REDUCE_MEAN;
    if (node.op == "aten.amax.default") fn = TERN_REDUCE_MAX;
    if (node.op == "aten.any.dim") fn = TERN_REDUCE_ANY;
    absl::StatusOr<std::vector<int64_t>> dims = context.Ints("dim", {});
    if (!dims.ok()) return dims.status();
    const uint32_t out_value = node.outputs[0];
    const tern_dtype_t dtype = DtypeOf(out_value);
    TensorRef in = In(node, 0);
    const size_t rank = in.shape.size();
    std::vector<int64_t> axes;
    if (dims->empty()) {
      for (size_t i = 0; i < rank; ++i) axes.push_back(static_cast<int64_t>(i));
    } else if (rank > 0) {
      absl::StatusOr<std::vector<int64_t>> normalized = NormalizeDims(node, *dims, rank);
      if (!normalized.ok()) return normalized.status();
      axes = *normalized;
      std::sort(axes.begin(), axes.end());
      axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    }
    std::vector<int64_t> kept = in.shape;
    for (int64_t axis : axes) kept[static_cast<size_t>(axis)] = 1;
    // The instruction writes the input's dtype (or f32 for a half sum or
    // mean); any other output dtype is reached by converting the input.
    const bool widening = fn != TERN_REDUCE_MAX && IsHalf(in.dtype) && dtype == TERN_DTYPE_F32;
    if (!widening) in = CastTo(in, dtype);
    const TensorRef out = Produce(out_value);
    std::vector<int64_t> ints = {fn};
    ints.insert(ints.end(), axes.begin(), axes.end());
    Emit(TERN_OP_REDUCE, {*out.Reshape(kept), in}, std::move(ints));
    return absl::OkStatus();
  }

  absl::Status LowerSoftmax(const Node& node) {
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", -1);
    if (!dim.ok()) return dim.status();
    const uint32_t out = node.outputs[0];
    const TensorRef in = CastTo(In(node, 0), DtypeOf(out));
    absl::StatusOr<int64_t> axis = NormalizeDim(node, *dim, in.shape.size());
    if (!axis.ok()) return axis.status();
    const int64_t log = node.op == "aten._log_softmax.default" ? 1 : 0;
    Emit(TERN_OP_SOFTMAX, {Produce(out), in}, {*axis, log});
    return absl::OkStatus();
  }

  absl::Status LowerLayerNorm(const Node& node) {
    const InferContext context = Context(node);
    absl::StatusOr<std::vector<int64_t>> normalized_shape = context.Ints("normalized_shape", {});
    absl::StatusOr<double> eps = context.Float("eps", 1e-5);
    if (!normalized_shape.ok()) return normalized_shape.status();
    if (!eps.ok()) return eps.status();
    if (!(std::isfinite(*eps) && *eps > 0)) {
      return absl::UnimplementedError(fmt::format(
          "{}: eps {} is not lowered yet: the layer_norm instruction takes a finite eps > 0",
          DescribeNode(node), *eps));
    }
    const TensorRef& in = In(node, 0);
    const size_t k = normalized_shape->size();
    if (k < 1 || k > in.shape.size()) {
      return Error(node, "normalized_shape must name 1 to rank trailing dims");
    }
    const std::vector<int64_t> leading(in.shape.begin(),
                                       in.shape.end() - static_cast<ptrdiff_t>(k));
    std::vector<TensorRef> operands;
    for (size_t i = 0; i < 3; ++i) {
      const uint32_t value = node.outputs[i];
      if (i == 0) {
        operands.push_back(needed_[value] ? Produce(value) : NewScratch(in.dtype, in.shape));
      } else {
        operands.push_back(needed_[value] ? *Produce(value).Reshape(leading) : TensorRef::None());
      }
    }
    operands.push_back(in);
    for (size_t slot = 1; slot < 3; ++slot) {
      const bool present = slot < node.inputs.size() && node.inputs[slot] != kNoValue;
      operands.push_back(present ? In(node, slot) : TensorRef::None());
    }
    Emit(TERN_OP_LAYER_NORM, std::move(operands), {static_cast<int64_t>(k)}, {*eps}, 3);
    return absl::OkStatus();
  }

  // `ref` viewed with `shape` (the same elements), copied into a contiguous
  // scratch first when its strides cannot express that.
  TensorRef ReshapedOrCopied(const TensorRef& ref, const std::vector<int64_t>& shape) {
    if (std::optional<TensorRef> view = ref.Reshape(shape)) return *view;
    const TensorRef copy = NewScratch(ref.dtype, ref.shape);
    Emit(TERN_OP_COPY, {copy, ref});
    return *copy.Reshape(shape);
  }

  // native_layer_norm_backward: one layer_norm_backward. grad_in is not
  // optional in the instruction: when only the parameters' gradients are
  // used it goes to scratch; grad_weight and grad_bias are left out when
  // unused. Outputs that output_mask leaves out (None in PyTorch) are never
  // computed, so using one is refused.
  absl::Status LowerLayerNormBackward(const Node& node) {
    const InferContext context = Context(node);
    absl::StatusOr<std::vector<int64_t>> normalized_shape = context.Ints("normalized_shape", {});
    absl::StatusOr<std::vector<bool>> mask = context.Flags("output_mask", 3);
    if (!normalized_shape.ok()) return normalized_shape.status();
    if (!mask.ok()) return mask.status();
    const TensorRef& in = In(node, 1);
    const size_t k = normalized_shape->size();
    if (k < 1 || k > in.shape.size()) {
      return Error(node, "normalized_shape must name 1 to rank trailing dims");
    }
    const std::vector<int64_t> leading(in.shape.begin(),
                                       in.shape.end() - static_cast<ptrdiff_t>(k));
    auto has = [&](size_t slot) {
      return slot < node.inputs.size() && node.inputs[slot] != kNoValue;
    };
    const bool present[3] = {(*mask)[0], (*mask)[1] && has(4), (*mask)[2] && has(5)};
    static const char* const kOutputs[3] = {"grad_input", "grad_weight", "grad_bias"};
    std::vector<TensorRef> operands;
    for (size_t i = 0; i < 3; ++i) {
      const uint32_t value = node.outputs[i];
      if (needed_[value] && !present[i]) {
        return Error(node, fmt::format("uses its {} output, which is None in PyTorch (output_mask "
                                       "leaves it out, or the {} is absent); use only the "
                                       "outputs output_mask asks for",
                                       kOutputs[i], i == 1 ? "weight" : "bias"));
      }
      if (needed_[value]) {
        operands.push_back(Produce(value));
      } else {
        operands.push_back(i == 0 ? NewScratch(in.dtype, in.shape) : TensorRef::None());
      }
    }
    operands.push_back(In(node, 0));
    operands.push_back(in);
    operands.push_back(ReshapedOrCopied(In(node, 2), leading));
    operands.push_back(ReshapedOrCopied(In(node, 3), leading));
    operands.push_back(has(4) ? In(node, 4) : TensorRef::None());
    Emit(TERN_OP_LAYER_NORM_BACKWARD, std::move(operands), {static_cast<int64_t>(k)}, {}, 3);
    return absl::OkStatus();
  }

  // _softmax_backward_data, _log_softmax_backward_data: softmax_backward in
  // grad_output's dtype, converted when input_dtype differs.
  absl::Status LowerSoftmaxBackward(const Node& node) {
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", -1);
    if (!dim.ok()) return dim.status();
    const uint32_t out = node.outputs[0];
    const TensorRef& grad = In(node, 0);
    int64_t axis = 0;  // a rank-0 tensor takes axis 0
    if (!grad.shape.empty()) {
      absl::StatusOr<int64_t> normalized = NormalizeDim(node, *dim, grad.shape.size());
      if (!normalized.ok()) return normalized.status();
      axis = *normalized;
    }
    const int64_t log = node.op == "aten._log_softmax_backward_data.default" ? 1 : 0;
    const bool converted = DtypeOf(out) != grad.dtype;
    const TensorRef result = converted ? NewScratch(grad.dtype, grad.shape) : Produce(out);
    Emit(TERN_OP_SOFTMAX_BACKWARD, {result, grad, In(node, 1)}, {axis, log});
    if (converted) Emit(TERN_OP_CAST, {Produce(out), result});
    return absl::OkStatus();
  }

  // gelu_backward, silu_backward: unary_backward, which takes the forward's
  // input, in the output's dtype (bf16/f16 compute in f32 and round once).
  absl::Status LowerUnaryBackward(const Node& node) {
    tern_unary_fn_t fn = TERN_UNARY_SILU;
    if (node.op == "aten.gelu_backward.default") {
      absl::StatusOr<std::string> approximate = Context(node).String("approximate", "none");
      if (!approximate.ok()) return approximate.status();
      if (*approximate != "none" && *approximate != "tanh") {
        return Error(node,
                     fmt::format("gelu approximate='{}' is not 'none' or 'tanh'", *approximate));
      }
      fn = *approximate == "tanh" ? TERN_UNARY_GELU_TANH : TERN_UNARY_GELU;
    }
    const uint32_t out = node.outputs[0];
    const tern_dtype_t dtype = DtypeOf(out);
    const std::vector<int64_t> shape = ShapeOf(out);
    absl::StatusOr<TensorRef> grad = Operand(node, 0, "grad_output", dtype, shape);
    if (!grad.ok()) return grad.status();
    absl::StatusOr<TensorRef> x = Operand(node, 1, "self", dtype, shape);
    if (!x.ok()) return x.status();
    Emit(TERN_OP_UNARY_BACKWARD, {ProduceElementwise(node, out, {*grad, *x}), *grad, *x}, {fn});
    return absl::OkStatus();
  }

  // tanh_backward, sigmoid_backward (given the forward's output y, which
  // unary_backward does not take) and threshold_backward (relu's): the
  // eager plugin's sequences, in PyTorch's CPU order and opmath (f32 for
  // bf16/f16, rounded once at the end):
  //   tanh:      g * (1 - y * y)
  //   sigmoid:   (g * (1 - y)) * y
  //   threshold: x <= threshold ? 0 : g, compared in f32 (as the CPU does).
  absl::Status LowerOutputBackward(const Node& node) {
    const uint32_t out = node.outputs[0];
    const tern_dtype_t dtype = DtypeOf(out);
    const tern_dtype_t compute = IsHalf(dtype) ? TERN_DTYPE_F32 : dtype;
    const std::vector<int64_t> shape = ShapeOf(out);
    absl::StatusOr<TensorRef> grad = Operand(node, 0, "grad_output", compute, shape);
    if (!grad.ok()) return grad.status();
    // The last instruction, straight into the output when it has the
    // compute dtype, else into a scratch converted into it.
    auto finish = [&](tern_opcode_t opcode, std::vector<TensorRef> operands,
                      std::vector<int64_t> ints) {
      const TensorRef result =
          compute == dtype ? ProduceElementwise(node, out, operands) : NewScratch(compute, shape);
      operands.insert(operands.begin(), result);
      Emit(opcode, std::move(operands), std::move(ints));
      if (compute != dtype) Emit(TERN_OP_CAST, {Produce(out), result});
    };
    if (node.op == "aten.threshold_backward.default") {
      absl::StatusOr<TensorRef> x = Operand(node, 1, "self", TERN_DTYPE_F32, shape);
      if (!x.ok()) return x.status();
      std::optional<Number> threshold = NumberAttr(node, "threshold");
      if (!threshold.has_value()) return Error(node, "needs the number attribute 'threshold'");
      const TensorRef mask = NewScratch(TERN_DTYPE_BOOL, shape);
      Emit(TERN_OP_BINARY,
           {mask, *x, Scalar(Number{false, 0, threshold->AsDouble()}, TERN_DTYPE_F32, shape)},
           {TERN_BINARY_LE});
      finish(TERN_OP_WHERE, {mask, Scalar(Number{false, 0, 0.0}, compute, shape), *grad}, {});
      return absl::OkStatus();
    }
    absl::StatusOr<TensorRef> y = Operand(node, 1, "output", compute, shape);
    if (!y.ok()) return y.status();
    const TensorRef scratch = NewScratch(compute, shape);
    if (node.op == "aten.tanh_backward.default") {
      Emit(TERN_OP_BINARY, {scratch, *y, *y}, {TERN_BINARY_MUL});
      Emit(TERN_OP_UNARY, {scratch, scratch}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
      finish(TERN_OP_BINARY, {*grad, scratch}, {TERN_BINARY_MUL});
    } else {
      Emit(TERN_OP_UNARY, {scratch, *y}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
      Emit(TERN_OP_BINARY, {scratch, *grad, scratch}, {TERN_BINARY_MUL});
      finish(TERN_OP_BINARY, {scratch, *y}, {TERN_BINARY_MUL});
    }
    return absl::OkStatus();
  }

  // aten.rms_norm (what the pattern pass makes of a written-out RMSNorm):
  // rms_norm without its rstd output.
  absl::Status LowerRmsNorm(const Node& node) {
    const InferContext context = Context(node);
    absl::StatusOr<std::vector<int64_t>> normalized_shape = context.Ints("normalized_shape", {});
    if (!normalized_shape.ok()) return normalized_shape.status();
    const uint32_t out = node.outputs[0];
    // Without eps, PyTorch uses the epsilon of the input's dtype.
    const tern_dtype_t dtype = DtypeOf(out);
    const double default_eps = dtype == TERN_DTYPE_BF16  ? 0.0078125
                               : dtype == TERN_DTYPE_F16 ? 0.0009765625
                                                         : 1.1920928955078125e-07;
    absl::StatusOr<double> eps = context.Float("eps", default_eps);
    if (!eps.ok()) return eps.status();
    const TensorRef& in = In(node, 0);
    const size_t k = normalized_shape->size();
    if (k < 1 || k > in.shape.size()) {
      return Error(node, "normalized_shape must name 1 to rank trailing dims");
    }
    const bool weighted = node.inputs.size() > 1 && node.inputs[1] != kNoValue;
    Emit(TERN_OP_RMS_NORM,
         {Produce(out), TensorRef::None(), in, weighted ? In(node, 1) : TensorRef::None()},
         {static_cast<int64_t>(k)}, {*eps}, 2);
    return absl::OkStatus();
  }

  absl::Status LowerWhere(const Node& node) {
    const uint32_t out = node.outputs[0];
    const std::vector<int64_t> shape = ShapeOf(out);
    absl::StatusOr<TensorRef> condition = Operand(node, 0, "condition", TERN_DTYPE_BOOL, shape);
    if (!condition.ok()) return condition.status();
    absl::StatusOr<TensorRef> a = Operand(node, 1, "self", DtypeOf(out), shape);
    if (!a.ok()) return a.status();
    absl::StatusOr<TensorRef> b = Operand(node, 2, "other", DtypeOf(out), shape);
    if (!b.ok()) return b.status();
    Emit(TERN_OP_WHERE, {Produce(out), *condition, *a, *b});
    return absl::OkStatus();
  }

  // torch.gather: out[i][j] = self[index[i][j]][j] along `dim`.
  absl::Status LowerGather(const Node& node) {
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
    if (!dim.ok()) return dim.status();
    absl::StatusOr<int64_t> d = NormalizeDim(node, *dim, In(node, 0).shape.size());
    if (!d.ok()) return d.status();
    // As PyTorch, a 0-d input or index is taken as 1-d (the instruction needs rank 1).
    TensorRef in = In(node, 0), index = In(node, 1), out = Produce(node.outputs[0]);
    if (in.shape.empty()) in = in.Unsqueeze(0);
    if (index.shape.empty()) {
      index = index.Unsqueeze(0);
      out = out.Unsqueeze(0);
    }
    Emit(TERN_OP_TAKE_ALONG_AXIS, {out, in, index}, {*d});
    return absl::OkStatus();
  }

  // A tensor of one value that only feeds instructions is no buffer at all:
  // its consumers read one constant element through zero strides (an
  // attention mask's `where(mask, scores, full_like(scores, -inf))` had
  // filled and then read back a [batch, heads, length, length] scratch
  // tensor). A graph output is filled.
  absl::Status LowerFullLike(const Node& node) {
    const std::optional<Number> value = NumberAttr(node, "fill_value");
    if (!value.has_value()) return Error(node, "has no number 'fill_value'");
    const uint32_t out = node.outputs[0];
    if (!outputs_of_value_[out].empty() || computed_into_[out].has_value()) {
      return Fill(node, Produce(out), *value);
    }
    absl::StatusOr<TensorRef> constant = NumberAs(node, *value, DtypeOf(out), ShapeOf(out));
    if (!constant.ok()) return constant.status();
    refs_[out] = *constant;
    return absl::OkStatus();
  }

  // A `fill` of `out` with a Python number converted as PyTorch converts a
  // scalar to the tensor's dtype (bool(v), int(v)).
  absl::Status Fill(const Node& node, const TensorRef& out, const Number& value) {
    if (IsFloat(out.dtype)) {
      Emit(TERN_OP_FILL, {out}, {}, {value.AsDouble()});
      return absl::OkStatus();
    }
    if (out.dtype == TERN_DTYPE_BOOL) {
      Emit(TERN_OP_FILL, {out}, {value.AsDouble() != 0.0 ? 1 : 0});  // as bool(v)
      return absl::OkStatus();
    }
    absl::StatusOr<int64_t> integer = IntegerFor(node, value, out.dtype);
    if (!integer.ok()) return integer.status();
    Emit(TERN_OP_FILL, {out}, {*integer});
    return absl::OkStatus();
  }

  // A Python number as a value of an integer dtype, int(v) (truncation);
  // refused when the dtype cannot hold it, rather than wrapped (and a float
  // beyond int64 would have no defined conversion).
  absl::StatusOr<int64_t> IntegerFor(const Node& node, const Number& value,
                                     tern_dtype_t dtype) const {
    const int64_t low = dtype == TERN_DTYPE_I8    ? INT8_MIN
                        : dtype == TERN_DTYPE_I32 ? INT32_MIN
                                                  : INT64_MIN;
    const int64_t high = dtype == TERN_DTYPE_I8    ? INT8_MAX
                         : dtype == TERN_DTYPE_I32 ? INT32_MAX
                                                   : INT64_MAX;
    // [-2^63, 2^63) as doubles: every double in it converts.
    const bool fits_i64 =
        value.is_int || (value.d >= -9223372036854775808.0 && value.d < 9223372036854775808.0);
    const int64_t integer = value.is_int ? value.i : fits_i64 ? static_cast<int64_t>(value.d) : 0;
    if (!fits_i64 || integer < low || integer > high) {
      return Error(node,
                   fmt::format("the value {} does not fit its dtype {}",
                               value.is_int ? std::to_string(value.i) : fmt::format("{}", value.d),
                               tern_dtype_name(dtype)));
    }
    return integer;
  }

  // A Python number as a one-element constant of a tensor's dtype, broadcast
  // to `shape`, converted as PyTorch converts a scalar: bool(v) (Scalar
  // would truncate 0.5 to false), int(v).
  absl::StatusOr<TensorRef> NumberAs(const Node& node, const Number& number, tern_dtype_t dtype,
                                     const std::vector<int64_t>& shape) {
    if (IsFloat(dtype)) return Scalar(number, dtype, shape);
    if (dtype == TERN_DTYPE_BOOL) {
      return Scalar(Number{true, number.AsDouble() != 0.0 ? 1 : 0, 0.0}, dtype, shape);
    }
    absl::StatusOr<int64_t> integer = IntegerFor(node, number, dtype);
    if (!integer.ok()) return integer.status();
    return Scalar(Number{true, *integer, 0.0}, dtype, shape);
  }

  // clamp, clamp_min, clamp_max: one `unary clamp`, an absent bound ±inf.
  // The input is converted first when a bound promotes it (an integer
  // tensor with a float bound computes in f32).
  absl::Status LowerClamp(const Node& node) {
    const std::optional<Number> min = NumberAttr(node, "min");
    const std::optional<Number> max = NumberAttr(node, "max");
    const double infinity = std::numeric_limits<double>::infinity();
    std::vector<double> bounds = {min ? min->AsDouble() : -infinity,
                                  max ? max->AsDouble() : infinity};
    for (const std::optional<Number>& bound : {min, max}) {
      // The instruction takes its bounds as doubles: exact up to 2^53.
      if (bound && bound->is_int &&
          (bound->i > (int64_t{1} << 53) || bound->i < -(int64_t{1} << 53))) {
        return Error(node, fmt::format("its bound {} is beyond 2^53 in magnitude, which is not "
                                       "lowered yet (clamp takes its bounds as doubles)",
                                       bound->i));
      }
      if (bound && !bound->is_int && std::isnan(bound->d)) {
        return Error(node, "a NaN bound is not lowered yet (the clamp instruction takes numbers)");
      }
    }
    const uint32_t out = node.outputs[0];
    const TensorRef in = CastTo(In(node, 0), DtypeOf(out));
    Emit(TERN_OP_UNARY, {ProduceElementwise(node, out, {in}), in}, {TERN_UNARY_CLAMP},
         std::move(bounds));
    return absl::OkStatus();
  }

  // constant_pad_nd: a `fill` of the output with the value, then a `copy`
  // of the input (cropped where a pad is negative) into its interior.
  absl::Status LowerConstantPad(const Node& node) {
    absl::StatusOr<std::vector<int64_t>> pad = Context(node).Ints("pad", {});
    if (!pad.ok()) return pad.status();
    const Number value = NumberAttr(node, "value").value_or(Number{});
    const TensorRef out = Produce(node.outputs[0]);
    if (absl::Status status = Fill(node, out, value); !status.ok()) return status;
    TensorRef interior = out, source = In(node, 0);
    for (size_t pair = 0; pair < pad->size() / 2; ++pair) {
      const int64_t dim = static_cast<int64_t>(source.shape.size() - 1 - pair);
      const int64_t before = (*pad)[2 * pair], after = (*pad)[2 * pair + 1];
      const int64_t length = source.shape[static_cast<size_t>(dim)] -
                             std::max<int64_t>(0, -before) - std::max<int64_t>(0, -after);
      if (length <= 0) return absl::OkStatus();  // cropped away: only the fill
      source = source.Slice(dim, std::max<int64_t>(0, -before), length, 1);
      interior = interior.Slice(dim, std::max<int64_t>(0, before), length, 1);
    }
    if (source.Elements() > 0) Emit(TERN_OP_COPY, {interior, source});
    return absl::OkStatus();
  }

  // scatter.value: out = where(mask, value, self), the mask marking the
  // positions index names. There is no scatter that overwrites, so the mask
  // counts them: `scatter_add_along_axis` of ones into zeros, then a cast to
  // bool (f32 counts never wrap back to 0, whatever the duplicates).
  absl::Status LowerScatterValue(const Node& node) {
    const std::optional<Number> value = NumberAttr(node, "value");
    if (!value.has_value()) return Error(node, "has no number 'value'");
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
    if (!dim.ok()) return dim.status();
    absl::StatusOr<int64_t> d = NormalizeDim(node, *dim, In(node, 0).shape.size());
    if (!d.ok()) return d.status();
    // As PyTorch, a 0-d input or index is taken as 1-d (the instruction needs rank 1).
    TensorRef self = In(node, 0), index = In(node, 1), out = Produce(node.outputs[0]);
    if (self.shape.empty()) {
      self = self.Unsqueeze(0);
      out = out.Unsqueeze(0);
    }
    if (index.shape.empty()) index = index.Unsqueeze(0);
    absl::StatusOr<TensorRef> written = NumberAs(node, *value, self.dtype, self.shape);
    if (!written.ok()) return written.status();
    const TensorRef counts = NewScratch(TERN_DTYPE_F32, self.shape);
    Emit(TERN_OP_FILL, {counts}, {}, {0.0});
    Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS,
         {counts, index, Scalar(Number{true, 1, 0.0}, TERN_DTYPE_F32, index.shape)}, {*d});
    const TensorRef mask = NewScratch(TERN_DTYPE_BOOL, self.shape);
    Emit(TERN_OP_CAST, {mask, counts});
    Emit(TERN_OP_WHERE, {out, mask, *written, self});
    return absl::OkStatus();
  }

  // index_put(self, [index], values, accumulate=True) (an embedding's
  // backward): self copied into the output, then `scatter_add` on axis 0,
  // which sums repeated indices in index order.
  absl::Status LowerIndexPut(const Node& node) {
    const TensorRef& self = In(node, 0);
    const TensorRef& index = In(node, 1);
    std::vector<int64_t> updates = index.shape;
    updates.insert(updates.end(), self.shape.begin() + 1, self.shape.end());
    const std::optional<TensorRef> values = In(node, 2).BroadcastTo(updates);
    if (!values.has_value()) {
      return Error(node, fmt::format("its values do not broadcast to {}", ShapeText(updates)));
    }
    const TensorRef out = Produce(node.outputs[0]);
    CopyInto(out, self);
    Emit(TERN_OP_SCATTER_ADD, {out, index, *values}, {0});
    return absl::OkStatus();
  }

  absl::Status LowerEmbedding(const Node& node) {
    Emit(TERN_OP_GATHER, {Produce(node.outputs[0]), In(node, 0), In(node, 1)}, {0});
    return absl::OkStatus();
  }

  // embedding_dense_backward: a `fill` with 0, then `scatter_add` on axis 0
  // (repeated indices sum in index order, as the CPU's kernel). The row of
  // padding_idx gets no gradient: only its own index adds into it, so it is
  // filled with 0 again afterwards.
  absl::Status LowerEmbeddingDenseBackward(const Node& node) {
    absl::StatusOr<int64_t> padding_idx = Context(node).Int("padding_idx", -1);
    if (!padding_idx.ok()) return padding_idx.status();
    const TensorRef out = Produce(node.outputs[0]);
    Emit(TERN_OP_FILL, {out}, {}, {0.0});
    Emit(TERN_OP_SCATTER_ADD, {out, In(node, 1), In(node, 0)}, {0});
    if (*padding_idx >= 0 && *padding_idx < out.shape[0]) {
      Emit(TERN_OP_FILL, {out.Slice(0, *padding_idx, 1, 1)}, {}, {0.0});
    }
    return absl::OkStatus();
  }

  absl::Status LowerCat(const Node& node) {
    absl::StatusOr<int64_t> dim = Context(node).Int("dim", 0);
    if (!dim.ok()) return dim.status();
    const uint32_t out_value = node.outputs[0];
    const TensorRef out = Produce(out_value);
    absl::StatusOr<int64_t> d = NormalizeDim(node, *dim, out.shape.size());
    if (!d.ok()) return d.status();
    int64_t at = 0;
    for (uint32_t input : node.inputs) {
      const TensorRef& piece = *refs_[input];
      if (piece.Elements() == 0) continue;  // also the legacy empty 1-D pieces
      const int64_t length = piece.shape[static_cast<size_t>(*d)];
      CopyInto(out.Slice(*d, at, length, 1), piece);
      at += length;
    }
    return absl::OkStatus();
  }

  // A 2-D window attribute (one value for H and W, or two).
  absl::StatusOr<std::array<int64_t, 2>> WindowPair(const Node& node, const std::string& name,
                                                    std::vector<int64_t> fallback) const {
    absl::StatusOr<std::vector<int64_t>> values = Context(node).Ints(name, fallback);
    if (!values.ok()) return values.status();
    // An empty list is the default (a max pool's stride [] is its kernel).
    if (values->empty()) *values = std::move(fallback);
    if (values->size() == 1) values->push_back(values->front());
    if (values->size() != 2) {
      return Error(node, fmt::format("attribute '{}' must have 1 or 2 values", name));
    }
    return std::array<int64_t, 2>{(*values)[0], (*values)[1]};
  }

  TensorRef NewConstant(const std::vector<float>& values, std::vector<int64_t> shape) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    return TensorRef::Contiguous({BufferRef::kConstant, program_.constants.Add(bytes)},
                                 TERN_DTYPE_F32, std::move(shape));
  }

  absl::Status LowerConvolution(const Node& node) {
    absl::StatusOr<std::array<int64_t, 2>> stride = WindowPair(node, "stride", {1});
    absl::StatusOr<std::array<int64_t, 2>> padding = WindowPair(node, "padding", {0});
    absl::StatusOr<std::array<int64_t, 2>> dilation = WindowPair(node, "dilation", {1});
    absl::StatusOr<int64_t> groups = Context(node).Int("groups", 1);
    for (const auto* v : {&stride, &padding, &dilation}) {
      if (!v->ok()) return v->status();
    }
    if (!groups.ok()) return groups.status();
    const std::vector<int64_t> ints = {(*stride)[0],   (*stride)[1],   (*padding)[0], (*padding)[1],
                                       (*dilation)[0], (*dilation)[1], *groups};
    const uint32_t out = node.outputs[0];
    const bool has_bias = node.inputs.size() > 2 && node.inputs[2] != kNoValue;
    const uint32_t norm_index = folded_into_conv_[current_node_];
    if (norm_index == kNoNode) {
      Emit(TERN_OP_CONV2D,
           {Produce(out), In(node, 0), In(node, 1), has_bias ? In(node, 2) : TensorRef::None()},
           ints);
      return absl::OkStatus();
    }
    // Folded batch norm: weight[o] * scale[o], bias[o] * scale[o] + shift[o].
    const Node& norm = graph_.nodes[norm_index];
    const ScaleShift folded = *BatchNormScaleShift(norm);
    std::vector<float> weight = *ConstantFloats(node.inputs[1]);
    const std::vector<int64_t> weight_shape = ShapeOf(node.inputs[1]);
    const size_t per_channel = weight.size() / folded.scale.size();
    for (size_t i = 0; i < weight.size(); ++i) weight[i] *= folded.scale[i / per_channel];
    std::vector<float> bias =
        has_bias ? *ConstantFloats(node.inputs[2]) : std::vector<float>(folded.scale.size(), 0.0f);
    for (size_t o = 0; o < bias.size(); ++o) bias[o] = bias[o] * folded.scale[o] + folded.shift[o];
    const TensorRef result = Produce(norm.outputs[0]);
    Emit(TERN_OP_CONV2D,
         {result, In(node, 0), NewConstant(weight, weight_shape),
          NewConstant(bias, {static_cast<int64_t>(bias.size())})},
         ints);
    // Only the folded batch norm read the convolution's own output.
    refs_[out] = result;
    return absl::OkStatus();
  }

  // convolution_backward: conv2d_backward_input and conv2d_backward_weight
  // (ints as conv2d, groups included) and grad_bias a reduce sum of
  // grad_output over N, H, W, each only when something uses it, as the eager
  // plugin runs it. Outputs that output_mask leaves out (None in PyTorch)
  // are never computed, so using one is refused.
  absl::Status LowerConvolutionBackward(const Node& node) {
    absl::StatusOr<std::array<int64_t, 2>> stride = WindowPair(node, "stride", {1});
    absl::StatusOr<std::array<int64_t, 2>> padding = WindowPair(node, "padding", {0});
    absl::StatusOr<std::array<int64_t, 2>> dilation = WindowPair(node, "dilation", {1});
    const InferContext context = Context(node);
    absl::StatusOr<int64_t> groups = context.Int("groups", 1);
    absl::StatusOr<std::vector<bool>> mask = context.Flags("output_mask", 3);
    for (const auto* v : {&stride, &padding, &dilation}) {
      if (!v->ok()) return v->status();
    }
    if (!groups.ok()) return groups.status();
    if (!mask.ok()) return mask.status();
    const std::vector<int64_t> ints = {(*stride)[0],   (*stride)[1],   (*padding)[0], (*padding)[1],
                                       (*dilation)[0], (*dilation)[1], *groups};
    static const char* const kOutputs[3] = {"grad_input", "grad_weight", "grad_bias"};
    for (size_t i = 0; i < 3; ++i) {
      if (needed_[node.outputs[i]] && !(*mask)[i]) {
        return Error(node, fmt::format("uses its {} output, which is None in PyTorch (output_mask "
                                       "leaves it out); use only the outputs output_mask asks for",
                                       kOutputs[i]));
      }
    }
    const TensorRef& grad = In(node, 0);
    if (needed_[node.outputs[0]]) {
      Emit(TERN_OP_CONV2D_BACKWARD_INPUT, {Produce(node.outputs[0]), grad, In(node, 2)}, ints);
    }
    if (needed_[node.outputs[1]]) {
      Emit(TERN_OP_CONV2D_BACKWARD_WEIGHT, {Produce(node.outputs[1]), grad, In(node, 1)}, ints);
    }
    if (needed_[node.outputs[2]]) {
      const TensorRef bias = Produce(node.outputs[2]);
      Emit(TERN_OP_REDUCE, {*bias.Reshape({1, bias.shape[0], 1, 1}), grad},
           {TERN_REDUCE_SUM, 0, 2, 3});
    }
    return absl::OkStatus();
  }

  absl::Status LowerBatchNorm(const Node& node) {
    if (needed_[node.outputs[1]] || needed_[node.outputs[2]]) {
      return Error(node,
                   "uses the saved mean or invstd of an eval batch norm, which are empty; use "
                   "only output 0");
    }
    if (refs_[node.outputs[0]].has_value()) return absl::OkStatus();  // folded into its conv
    absl::StatusOr<double> eps = Context(node).Float("eps", 1e-5);
    if (!eps.ok()) return eps.status();
    const TensorRef& x = In(node, 0);
    const int64_t channels = x.shape[1];
    TensorRef scale, shift;
    if (std::optional<ScaleShift> folded = BatchNormScaleShift(node)) {
      scale = NewConstant(folded->scale, {channels});
      shift = NewConstant(folded->shift, {channels});
    } else {
      // scale = weight * rsqrt(var + eps); shift = bias - mean * scale, in f32.
      const std::vector<int64_t> per_channel = {channels};
      scale = NewScratch(TERN_DTYPE_F32, per_channel);
      Emit(TERN_OP_BINARY,
           {scale, CastTo(In(node, 4), TERN_DTYPE_F32),
            Scalar(Number{false, 0, *eps}, TERN_DTYPE_F32, per_channel)},
           {TERN_BINARY_ADD});
      Emit(TERN_OP_UNARY, {scale, scale}, {TERN_UNARY_RSQRT});
      if (node.inputs[1] != kNoValue) {
        Emit(TERN_OP_BINARY, {scale, scale, CastTo(In(node, 1), TERN_DTYPE_F32)},
             {TERN_BINARY_MUL});
      }
      shift = NewScratch(TERN_DTYPE_F32, per_channel);
      Emit(TERN_OP_BINARY, {shift, CastTo(In(node, 3), TERN_DTYPE_F32), scale}, {TERN_BINARY_MUL});
      if (node.inputs[2] != kNoValue) {
        Emit(TERN_OP_BINARY, {shift, CastTo(In(node, 2), TERN_DTYPE_F32), shift},
             {TERN_BINARY_SUB});
      } else {
        Emit(TERN_OP_UNARY, {shift, shift}, {TERN_UNARY_NEG});
      }
    }
    // [C] -> [C, 1, ...] -> x's shape with stride 0 outside the channel dim.
    std::vector<int64_t> channel_shape(x.shape.size() - 1, 1);
    channel_shape[0] = channels;
    auto broadcast = [&](const TensorRef& per_channel) {
      return CastTo(per_channel, x.dtype).Reshape(channel_shape)->BroadcastTo(x.shape);
    };
    const std::optional<TensorRef> scale_all = broadcast(scale), shift_all = broadcast(shift);
    if (!scale_all || !shift_all) return Error(node, "its statistics do not broadcast over x");
    const TensorRef out = ProduceElementwise(node, node.outputs[0], {x});
    Emit(TERN_OP_BINARY, {out, x, *scale_all}, {TERN_BINARY_MUL});
    Emit(TERN_OP_BINARY, {out, out, *shift_all}, {TERN_BINARY_ADD});
    return absl::OkStatus();
  }

  // A batch norm's per-channel geometry over x ([N, C, ...]): C, the shape
  // [1, C, 1, ...] its statistics are kept in, the REDUCE ints (`fn`, then
  // every dim but 1) and the elements per channel (0 when there are none).
  struct ChannelGeometry {
    int64_t channels = 0, count = 0;
    std::vector<int64_t> kept, reduce;
  };
  static ChannelGeometry PerChannel(const TensorRef& x, int64_t fn) {
    ChannelGeometry geometry;
    geometry.channels = x.shape[1];
    geometry.kept.assign(x.shape.size(), 1);
    geometry.kept[1] = geometry.channels;
    geometry.reduce = {fn};
    for (size_t d = 0; d < x.shape.size(); ++d) {
      if (d != 1) geometry.reduce.push_back(static_cast<int64_t>(d));
    }
    geometry.count = geometry.channels > 0 ? x.Elements() / geometry.channels : 0;
    return geometry;
  }

  // Output k of `node` in the per-channel shape `kept` when the graph uses
  // it, else scratch of that shape (the instruction writes it either way).
  TensorRef StatisticOutput(const Node& node, size_t k, const std::vector<int64_t>& kept) {
    return needed_[node.outputs[k]] ? *Produce(node.outputs[k]).Reshape(kept)
                                    : NewScratch(TERN_DTYPE_F32, kept);
  }

  // _native_batch_norm_legit_functional (training, f32): the eager plugin's
  // sequence. mean and the biased var are reduce means over every dim but
  // 1, written straight into save_mean (and var into scratch); rstd =
  // rsqrt(var + eps) into save_rstd; output = (x - mean) * rstd * weight +
  // bias; new_running_mean = momentum * mean + (1 - momentum) * running_mean
  // and new_running_var the same with the unbiased var (var * n / (n - 1),
  // n the elements per channel), as PyTorch. Outputs nothing uses are not
  // computed.
  absl::Status LowerBatchNormTraining(const Node& node) {
    const InferContext context = Context(node);
    absl::StatusOr<double> momentum = context.Float("momentum", 0.1);
    absl::StatusOr<double> eps = context.Float("eps", 1e-5);
    if (!momentum.ok()) return momentum.status();
    if (!eps.ok()) return eps.status();
    const TensorRef& x = In(node, 0);
    const std::vector<int64_t>& shape = x.shape;
    const ChannelGeometry geometry = PerChannel(x, TERN_REDUCE_MEAN);
    const int64_t channels = geometry.channels, count = geometry.count;
    const std::vector<int64_t>&kept = geometry.kept, &reduce_mean = geometry.reduce;
    if (count == 0) return Error(node, "its input has no elements per channel");
    const std::vector<int64_t> per_channel = {channels};
    auto per_channel_output = [&](size_t k) { return StatisticOutput(node, k, kept); };
    const TensorRef mean = per_channel_output(1);
    Emit(TERN_OP_REDUCE, {mean, x}, reduce_mean);
    const TensorRef dev = NewScratch(TERN_DTYPE_F32, shape);
    Emit(TERN_OP_BINARY, {dev, x, *mean.BroadcastTo(shape)}, {TERN_BINARY_SUB});
    const TensorRef var = NewScratch(TERN_DTYPE_F32, kept);
    {
      const TensorRef squares = NewScratch(TERN_DTYPE_F32, shape);
      Emit(TERN_OP_BINARY, {squares, dev, dev}, {TERN_BINARY_MUL});
      Emit(TERN_OP_REDUCE, {var, squares}, reduce_mean);
    }
    if (needed_[node.outputs[0]] || needed_[node.outputs[2]]) {
      const TensorRef rstd = per_channel_output(2);
      Emit(TERN_OP_BINARY, {rstd, var, Scalar(Number{false, 0, *eps}, TERN_DTYPE_F32, kept)},
           {TERN_BINARY_ADD});
      Emit(TERN_OP_UNARY, {rstd, rstd}, {TERN_UNARY_RSQRT});
      if (needed_[node.outputs[0]]) {
        const TensorRef out = Produce(node.outputs[0]);
        Emit(TERN_OP_BINARY, {out, dev, *rstd.BroadcastTo(shape)}, {TERN_BINARY_MUL});
        if (node.inputs[1] != kNoValue) {
          Emit(TERN_OP_BINARY, {out, out, *In(node, 1).Reshape(kept)->BroadcastTo(shape)},
               {TERN_BINARY_MUL});
        }
        if (node.inputs[2] != kNoValue) {
          Emit(TERN_OP_BINARY, {out, out, *In(node, 2).Reshape(kept)->BroadcastTo(shape)},
               {TERN_BINARY_ADD});
        }
      }
    }
    // new = momentum * batch + (1 - momentum) * running.
    const double unbias =
        count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
    const struct {
      size_t output;
      const TensorRef& batch;
      double scale;
      size_t running;
    } updates[] = {{3, mean, *momentum, 3}, {4, var, *momentum * unbias, 4}};
    for (const auto& u : updates) {
      if (!needed_[node.outputs[u.output]]) continue;
      const TensorRef a = NewScratch(TERN_DTYPE_F32, per_channel);
      const TensorRef b = NewScratch(TERN_DTYPE_F32, per_channel);
      Emit(TERN_OP_UNARY, {a, *u.batch.Reshape(per_channel)}, {TERN_UNARY_AFFINE}, {u.scale, 0.0});
      Emit(TERN_OP_UNARY, {b, In(node, u.running)}, {TERN_UNARY_AFFINE}, {1.0 - *momentum, 0.0});
      Emit(TERN_OP_BINARY, {Produce(node.outputs[u.output]), a, b}, {TERN_BINARY_ADD});
    }
    return absl::OkStatus();
  }

  // native_batch_norm_backward (f32): the eager plugin's sequence, with
  // xhat = (x - mean) * invstd, gsum = Σ g and gxsum = Σ g · xhat over every
  // dim but 1 (written straight into grad_bias and grad_weight when used):
  //   training: grad_input = (g - gsum / n - xhat · gxsum / n) · invstd · weight
  //   eval:     grad_input = g · invstd · weight, invstd = rsqrt(running_var + eps)
  // Outputs that output_mask leaves out (None in PyTorch) are never
  // computed, so using one is refused.
  absl::Status LowerBatchNormBackward(const Node& node) {
    const InferContext context = Context(node);
    absl::StatusOr<bool> train = context.Bool("train", true);
    absl::StatusOr<double> eps = context.Float("eps", 1e-5);
    absl::StatusOr<std::vector<bool>> mask = context.Flags("output_mask", 3);
    if (!train.ok()) return train.status();
    if (!eps.ok()) return eps.status();
    if (!mask.ok()) return mask.status();
    static const char* const kOutputs[3] = {"grad_input", "grad_weight", "grad_bias"};
    for (size_t i = 0; i < 3; ++i) {
      if (needed_[node.outputs[i]] && !(*mask)[i]) {
        return Error(node, fmt::format("uses its {} output, which is None in PyTorch (output_mask "
                                       "leaves it out); use only the outputs output_mask asks for",
                                       kOutputs[i]));
      }
    }
    const TensorRef &g = In(node, 0), &x = In(node, 1);
    const std::vector<int64_t>& shape = x.shape;
    const ChannelGeometry geometry = PerChannel(x, TERN_REDUCE_SUM);
    const int64_t count = geometry.count;
    const std::vector<int64_t>&kept = geometry.kept, &reduce_sum = geometry.reduce;
    if (count == 0) return Error(node, "its input has no elements per channel");
    TensorRef mean, invstd;
    if (*train) {
      mean = *In(node, 5).Reshape(kept);
      invstd = *In(node, 6).Reshape(kept);
    } else {
      mean = *In(node, 3).Reshape(kept);
      invstd = NewScratch(TERN_DTYPE_F32, kept);
      Emit(TERN_OP_BINARY,
           {invstd, *In(node, 4).Reshape(kept),
            Scalar(Number{false, 0, *eps}, TERN_DTYPE_F32, kept)},
           {TERN_BINARY_ADD});
      Emit(TERN_OP_UNARY, {invstd, invstd}, {TERN_UNARY_RSQRT});
    }
    const bool grad_input = needed_[node.outputs[0]];
    auto per_channel = [&](size_t k) { return StatisticOutput(node, k, kept); };
    TensorRef xhat, gsum, gxsum;
    const bool statistics = (grad_input && *train) || needed_[node.outputs[1]];
    if (statistics) {
      xhat = NewScratch(TERN_DTYPE_F32, shape);
      Emit(TERN_OP_BINARY, {xhat, x, *mean.BroadcastTo(shape)}, {TERN_BINARY_SUB});
      Emit(TERN_OP_BINARY, {xhat, xhat, *invstd.BroadcastTo(shape)}, {TERN_BINARY_MUL});
      gxsum = per_channel(1);
      const TensorRef product = NewScratch(TERN_DTYPE_F32, shape);
      Emit(TERN_OP_BINARY, {product, g, xhat}, {TERN_BINARY_MUL});
      Emit(TERN_OP_REDUCE, {gxsum, product}, reduce_sum);
    }
    if ((grad_input && *train) || needed_[node.outputs[2]]) {
      gsum = per_channel(2);
      Emit(TERN_OP_REDUCE, {gsum, g}, reduce_sum);
    }
    if (!grad_input) return absl::OkStatus();
    TensorRef scale = invstd;
    if (node.inputs[2] != kNoValue) {
      scale = NewScratch(TERN_DTYPE_F32, kept);
      Emit(TERN_OP_BINARY, {scale, invstd, *In(node, 2).Reshape(kept)}, {TERN_BINARY_MUL});
    }
    const TensorRef out = Produce(node.outputs[0]);
    if (!*train) {
      Emit(TERN_OP_BINARY, {out, g, *scale.BroadcastTo(shape)}, {TERN_BINARY_MUL});
      return absl::OkStatus();
    }
    const double inv_n = 1.0 / static_cast<double>(count);
    const TensorRef mg = NewScratch(TERN_DTYPE_F32, kept), mgx = NewScratch(TERN_DTYPE_F32, kept);
    Emit(TERN_OP_UNARY, {mg, gsum}, {TERN_UNARY_AFFINE}, {inv_n, 0.0});
    Emit(TERN_OP_UNARY, {mgx, gxsum}, {TERN_UNARY_AFFINE}, {inv_n, 0.0});
    const TensorRef u = NewScratch(TERN_DTYPE_F32, shape);
    Emit(TERN_OP_BINARY, {u, g, *mg.BroadcastTo(shape)}, {TERN_BINARY_SUB});
    Emit(TERN_OP_BINARY, {xhat, xhat, *mgx.BroadcastTo(shape)}, {TERN_BINARY_MUL});
    Emit(TERN_OP_BINARY, {u, u, xhat}, {TERN_BINARY_SUB});
    Emit(TERN_OP_BINARY, {out, u, *scale.BroadcastTo(shape)}, {TERN_BINARY_MUL});
    return absl::OkStatus();
  }

  // One reduce max over a 6-D view [N, C, OH, OW, KH, KW] of the input whose
  // last two dims walk each window (overlapping reads are fine); padding
  // goes through a copy into a scratch filled with -inf.
  absl::Status LowerMaxPool(const Node& node) {
    if (needed_[node.outputs[1]]) {
      return Error(node,
                   "uses the indices of max_pool2d_with_indices, which the compiler does not "
                   "compute; use only the pooled values (output 0), as nn.MaxPool2d does");
    }
    absl::StatusOr<std::array<int64_t, 2>> kernel = WindowPair(node, "kernel_size", {});
    if (!kernel.ok()) return kernel.status();
    absl::StatusOr<std::array<int64_t, 2>> stride =
        WindowPair(node, "stride", {(*kernel)[0], (*kernel)[1]});
    absl::StatusOr<std::array<int64_t, 2>> padding = WindowPair(node, "padding", {0});
    absl::StatusOr<std::array<int64_t, 2>> dilation = WindowPair(node, "dilation", {1});
    for (const auto* v : {&stride, &padding, &dilation}) {
      if (!v->ok()) return v->status();
    }
    TensorRef in = In(node, 0);
    if (!IsFloat(in.dtype)) {
      return Error(node, fmt::format("max pooling is lowered for float tensors only, not {}",
                                     tern_dtype_name(in.dtype)));
    }
    if (in.shape.size() == 3) in = in.Unsqueeze(0);
    const int64_t n = in.shape[0], c = in.shape[1], h = in.shape[2], w = in.shape[3];
    const auto [ph, pw] = *padding;
    TensorRef source = in;
    if (ph > 0 || pw > 0) {
      source = NewScratch(in.dtype, {n, c, h + 2 * ph, w + 2 * pw});
      Emit(TERN_OP_FILL, {source}, {}, {-std::numeric_limits<double>::infinity()});
      Emit(TERN_OP_COPY, {source.Slice(2, ph, h, 1).Slice(3, pw, w, 1), in});
    }
    const TensorRef out = Produce(node.outputs[0]);
    const int64_t oh = out.shape[out.shape.size() - 2], ow = out.shape.back();
    TensorRef windows = source;
    windows.shape = {n, c, oh, ow, (*kernel)[0], (*kernel)[1]};
    const std::vector<int64_t>& s = source.strides;
    windows.strides = {s[0],
                       s[1],
                       s[2] * (*stride)[0],
                       s[3] * (*stride)[1],
                       s[2] * (*dilation)[0],
                       s[3] * (*dilation)[1]};
    Emit(TERN_OP_REDUCE, {*out.Reshape({n, c, oh, ow, 1, 1}), windows}, {TERN_REDUCE_MAX, 4, 5});
    return absl::OkStatus();
  }

  // max_pool2d_with_indices_backward: the eager plugin's fill 0 and
  // scatter_add_along_axis of grad_output at the forward's indices, over the
  // [N * C, H * W] planes (the indices count within a plane's H * W).
  absl::Status LowerMaxPoolBackward(const Node& node) {
    const TensorRef out = Produce(node.outputs[0]);
    const std::vector<int64_t>& shape = out.shape;
    const size_t rank = shape.size();
    int64_t planes = 1;
    for (size_t i = 0; i + 2 < rank; ++i) planes *= shape[i];
    const TensorRef& grad = In(node, 0);
    const int64_t pooled = grad.shape[rank - 2] * grad.shape[rank - 1];
    const TensorRef flat = *out.Reshape({planes, shape[rank - 2] * shape[rank - 1]});
    Emit(TERN_OP_FILL, {flat}, {}, {0.0});
    Emit(TERN_OP_SCATTER_ADD_ALONG_AXIS,
         {flat, ReshapedOrCopied(In(node, 2), {planes, pooled}),
          ReshapedOrCopied(grad, {planes, pooled})},
         {1});
    return absl::OkStatus();
  }

  static constexpr std::string_view kBatchNormOp =
      "aten._native_batch_norm_legit_no_training.default";

  const Graph& graph_;
  std::vector<bool> needed_;
  std::vector<bool> node_needed_;
  std::vector<std::optional<TensorRef>> refs_;
  std::vector<std::vector<uint32_t>> outputs_of_value_;
  std::vector<uint32_t> owner_;     // the value whose buffer each value is in
  std::vector<uint32_t> last_use_;  // per owner: the last node reading its buffer
  // Values computed into a graph output that is a reshape of them.
  std::vector<std::optional<uint32_t>> computed_into_;
  // Per convolution node: the batch norm folded into it, or kNoNode.
  std::vector<uint32_t> folded_into_conv_;
  LoweredProgram program_;
  uint32_t current_node_ = kNoNode;
};

const std::map<std::string_view, LowerFn>& Lowerer::Table() {
  static const std::map<std::string_view, LowerFn> table = {
      {"aten.mm.default", &Lowerer::LowerMatmul},
      {"aten.bmm.default", &Lowerer::LowerMatmul},
      {"aten.addmm.default", &Lowerer::LowerAddmm},
      {"aten.add.Tensor", &Lowerer::LowerBinary},
      {"aten.add.Scalar", &Lowerer::LowerBinary},
      {"aten.sub.Tensor", &Lowerer::LowerBinary},
      {"aten.sub.Scalar", &Lowerer::LowerBinary},
      {"aten.mul.Tensor", &Lowerer::LowerBinary},
      {"aten.mul.Scalar", &Lowerer::LowerBinary},
      {"aten.div.Tensor", &Lowerer::LowerBinary},
      {"aten.div.Scalar", &Lowerer::LowerBinary},
      {"aten.relu.default", &Lowerer::LowerUnary},
      {"aten.gelu.default", &Lowerer::LowerUnary},
      {"aten.tanh.default", &Lowerer::LowerUnary},
      {"aten.sigmoid.default", &Lowerer::LowerUnary},
      {"aten.exp.default", &Lowerer::LowerUnary},
      {"aten.neg.default", &Lowerer::LowerUnary},
      {"aten.rsqrt.default", &Lowerer::LowerUnary},
      {"aten.sqrt.default", &Lowerer::LowerUnary},
      {"aten.log.default", &Lowerer::LowerUnary},
      {"aten.abs.default", &Lowerer::LowerUnary},
      {"aten.cos.default", &Lowerer::LowerUnary},
      {"aten.sin.default", &Lowerer::LowerUnary},
      {"aten.erf.default", &Lowerer::LowerUnary},
      {"aten.silu.default", &Lowerer::LowerUnary},
      {"aten.maximum.default", &Lowerer::LowerBinary},
      {"aten.minimum.default", &Lowerer::LowerBinary},
      {"aten.eq.Tensor", &Lowerer::LowerBinary},
      {"aten.ne.Tensor", &Lowerer::LowerBinary},
      {"aten.ge.Tensor", &Lowerer::LowerBinary},
      {"aten.le.Tensor", &Lowerer::LowerBinary},
      {"aten.eq.Scalar", &Lowerer::LowerBinary},
      {"aten.ne.Scalar", &Lowerer::LowerBinary},
      {"aten.gt.Scalar", &Lowerer::LowerBinary},
      {"aten.ge.Scalar", &Lowerer::LowerBinary},
      {"aten.lt.Scalar", &Lowerer::LowerBinary},
      {"aten.le.Scalar", &Lowerer::LowerBinary},
      {"aten.logical_not.default", &Lowerer::LowerUnary},
      {"aten.any.dim", &Lowerer::LowerReduce},
      {"aten.gather.default", &Lowerer::LowerGather},
      {"aten.full_like.default", &Lowerer::LowerFullLike},
      {"aten.gt.Tensor", &Lowerer::LowerBinary},
      {"aten.lt.Tensor", &Lowerer::LowerBinary},
      {"aten.pow.Tensor_Scalar", &Lowerer::LowerPowScalar},
      {"aten.view.default", &Lowerer::LowerReshape},
      {"aten._unsafe_view.default", &Lowerer::LowerReshape},
      {"aten.permute.default", &Lowerer::LowerPermute},
      {"aten.t.default", &Lowerer::LowerTranspose},
      {"aten.transpose.int", &Lowerer::LowerTranspose},
      {"aten.expand.default", &Lowerer::LowerExpand},
      {"aten.unsqueeze.default", &Lowerer::LowerUnsqueeze},
      {"aten.squeeze.dims", &Lowerer::LowerSqueeze},
      {"aten.squeeze.dim", &Lowerer::LowerSqueeze},
      {"aten.squeeze.default", &Lowerer::LowerSqueeze},
      {"aten.slice.Tensor", &Lowerer::LowerSlice},
      {"aten.select.int", &Lowerer::LowerSelect},
      {"aten.split_with_sizes.default", &Lowerer::LowerSplit},
      // Graphs are functional: a clone or alias has the same elements, so
      // it is the same buffer (a graph output that is one gets its copy).
      {"aten.clone.default", &Lowerer::LowerIdentity},
      {"aten.alias.default", &Lowerer::LowerIdentity},
      {"aten._to_copy.default", &Lowerer::LowerToCopy},
      {"aten.sum.dim_IntList", &Lowerer::LowerReduce},
      {"aten.mean.dim", &Lowerer::LowerReduce},
      {"aten.amax.default", &Lowerer::LowerReduce},
      {"aten._softmax.default", &Lowerer::LowerSoftmax},
      {"aten._log_softmax.default", &Lowerer::LowerSoftmax},
      {"aten.native_layer_norm.default", &Lowerer::LowerLayerNorm},
      {"aten.native_layer_norm_backward.default", &Lowerer::LowerLayerNormBackward},
      {"aten._softmax_backward_data.default", &Lowerer::LowerSoftmaxBackward},
      {"aten._log_softmax_backward_data.default", &Lowerer::LowerSoftmaxBackward},
      {"aten.gelu_backward.default", &Lowerer::LowerUnaryBackward},
      {"aten.silu_backward.default", &Lowerer::LowerUnaryBackward},
      {"aten.tanh_backward.default", &Lowerer::LowerOutputBackward},
      {"aten.sigmoid_backward.default", &Lowerer::LowerOutputBackward},
      {"aten.threshold_backward.default", &Lowerer::LowerOutputBackward},
      {"aten.rms_norm.default", &Lowerer::LowerRmsNorm},
      {"aten.where.self", &Lowerer::LowerWhere},
      {"aten.embedding.default", &Lowerer::LowerEmbedding},
      {"aten.embedding_dense_backward.default", &Lowerer::LowerEmbeddingDenseBackward},
      {"aten.cat.default", &Lowerer::LowerCat},
      {"aten.convolution.default", &Lowerer::LowerConvolution},
      {"aten.convolution_backward.default", &Lowerer::LowerConvolutionBackward},
      {"aten._native_batch_norm_legit_no_training.default", &Lowerer::LowerBatchNorm},
      {"aten.native_batch_norm_backward.default", &Lowerer::LowerBatchNormBackward},
      {"aten._native_batch_norm_legit_functional.default", &Lowerer::LowerBatchNormTraining},
      {"aten.max_pool2d_with_indices.default", &Lowerer::LowerMaxPool},
      {"aten.max_pool2d_with_indices_backward.default", &Lowerer::LowerMaxPoolBackward},
      {"aten.logical_and.default", &Lowerer::LowerBinary},
      {"aten.logical_or.default", &Lowerer::LowerBinary},
      {"aten.bitwise_and.Tensor", &Lowerer::LowerBinary},
      {"aten.bitwise_or.Tensor", &Lowerer::LowerBinary},
      {"aten.bitwise_not.default", &Lowerer::LowerUnary},
      {"aten.clamp.default", &Lowerer::LowerClamp},
      {"aten.clamp_min.default", &Lowerer::LowerClamp},
      {"aten.clamp_max.default", &Lowerer::LowerClamp},
      {"aten.constant_pad_nd.default", &Lowerer::LowerConstantPad},
      {"aten.scatter.value", &Lowerer::LowerScatterValue},
      {"aten.index_put.default", &Lowerer::LowerIndexPut},
  };
  return table;
}

}  // namespace

absl::StatusOr<LoweredProgram> LowerGraph(const Graph& graph) { return Lowerer(graph).Run(); }

}  // namespace tern::compiler
