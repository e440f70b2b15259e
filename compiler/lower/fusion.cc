#include "compiler/lower/fusion.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tern::compiler {
namespace {

bool SameRef(const TensorRef& a, const TensorRef& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.dtype == b.dtype && a.shape == b.shape &&
         a.strides == b.strides;
}

// `ref` seen with `shape` (same elements, same order), when its strides allow.
std::optional<TensorRef> AsShape(const TensorRef& ref, const std::vector<int64_t>& shape) {
  if (ref.shape == shape) return ref;
  return ref.Reshape(shape);
}

// `a` and `b` are the same elements in the same order: the same window, or
// both contiguous from the same start (one a reshape of the other).
bool SameElements(const TensorRef& a, const TensorRef& b) {
  if (SameRef(a, b)) return true;
  return a.buffer == b.buffer && a.offset == b.offset && a.dtype == b.dtype &&
         a.Elements() == b.Elements() && a.IsContiguous() && b.IsContiguous();
}

// 2^k, finite and not 0: multiplying by it is exact (barring overflow and
// underflow), so it commutes with rounding.
bool IsPowerOfTwo(float value) {
  if (!std::isfinite(value) || value == 0.0f) return false;
  int exponent = 0;
  return std::fabs(std::frexp(value, &exponent)) == 0.5f;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool IsFloat(tern_dtype_t dtype) {
  return dtype == TERN_DTYPE_F32 || dtype == TERN_DTYPE_BF16 || dtype == TERN_DTYPE_F16;
}
bool IsFloatOrBool(tern_dtype_t dtype) { return IsFloat(dtype) || dtype == TERN_DTYPE_BOOL; }

uint64_t Key(const BufferRef& buffer) {
  return (static_cast<uint64_t>(buffer.kind) << 32) | buffer.index;
}

// The parameters a unary function takes (docs/isa.md, "unary"; the ISA's
// rules check the same table).
size_t UnaryParameterCount(int64_t fn) {
  switch (fn) {
    case TERN_UNARY_LEAKY_RELU:
    case TERN_UNARY_ELU:
    case TERN_UNARY_POW_SCALAR:
      return 1;
    case TERN_UNARY_CLAMP:
    case TERN_UNARY_AFFINE:
    case TERN_UNARY_SOFTPLUS:
      return 2;
    default:
      return 0;
  }
}

// All parameters of a unary function, defaults filled in: fused steps and
// epilogues give every parameter explicitly.
std::optional<std::vector<double>> FullParameters(int64_t fn, const std::vector<double>& given) {
  std::vector<double> defaults;
  switch (fn) {
    case TERN_UNARY_LEAKY_RELU:
      defaults = {0.01};
      break;
    case TERN_UNARY_ELU:
      defaults = {1.0};
      break;
    case TERN_UNARY_SOFTPLUS:
      defaults = {1.0, 20.0};
      break;
    default:
      break;
  }
  const size_t count = UnaryParameterCount(fn);
  if (given.size() > count) return std::nullopt;
  std::vector<double> full = given;
  while (full.size() < count) {
    if (full.size() >= defaults.size()) return std::nullopt;  // a required parameter is missing
    full.push_back(defaults[full.size()]);
  }
  return full;
}

bool IsActivation(int64_t fn) {
  return fn >= 0 && fn < TERN_UNARY_COUNT && fn != TERN_UNARY_ISNAN &&
         fn != TERN_UNARY_LOGICAL_NOT && fn != TERN_UNARY_BITWISE_NOT;
}

// The position after which nothing touches each buffer: a result written to
// a scratch buffer that nothing touches later needs no store.
std::unordered_map<uint64_t, uint32_t> LastTouches(const std::vector<LoweredInstruction>& list) {
  std::unordered_map<uint64_t, uint32_t> last;
  for (uint32_t position = 0; position < list.size(); ++position) {
    for (const TensorRef& ref : list[position].operands) {
      if (ref.present()) last[Key(ref.buffer)] = position;
    }
  }
  return last;
}

bool HasBuffer(const LoweredInstruction& instruction, size_t begin, size_t end,
               const BufferRef& buffer) {
  for (size_t k = begin; k < end && k < instruction.operands.size(); ++k) {
    if (instruction.operands[k].present() && instruction.operands[k].buffer == buffer) return true;
  }
  return false;
}

// The f32 value of a one-element (or fully broadcast) f32 constant, which a
// program holds as a constant step instead of an input.
std::optional<float> ScalarConstant(const TensorRef& ref, const ConstantPool& pool) {
  if (ref.buffer.kind != BufferRef::kConstant || ref.dtype != TERN_DTYPE_F32) return std::nullopt;
  for (size_t d = 0; d < ref.shape.size(); ++d) {
    if (ref.shape[d] != 1 && ref.strides[d] != 0) return std::nullopt;
  }
  const std::vector<uint8_t>& bytes = pool.entries()[ref.buffer.index];
  const uint64_t at = static_cast<uint64_t>(ref.offset) * sizeof(float);
  if (at + sizeof(float) > bytes.size()) return std::nullopt;
  float value;
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}

// --- 0. results written in their consumer's layout ------------------------------------------

// `producer`'s output as the window of `copy`'s destination that the copy
// would have put each element in, when the copy only permutes (and
// reshapes) what the producer wrote: then the producer can write there
// directly. nullopt otherwise.
std::optional<TensorRef> WrittenThroughCopy(const TensorRef& written,
                                            const LoweredInstruction& copy) {
  const TensorRef& dst = copy.operands[0];
  const TensorRef& src = copy.operands[1];
  if (!(src.buffer == written.buffer) || src.offset != written.offset ||
      src.dtype != written.dtype || dst.dtype != written.dtype ||
      src.Elements() != written.Elements()) {
    return std::nullopt;
  }
  // Each of the producer's dimensions is one of the source window's (same
  // size and stride, each used once); its stride in the destination is the
  // destination's stride of that dimension.
  std::vector<int64_t> strides(written.shape.size(), 0);
  std::vector<bool> used(src.shape.size(), false);
  for (size_t k = 0; k < written.shape.size(); ++k) {
    if (written.shape[k] == 1) continue;
    bool found = false;
    for (size_t m = 0; m < src.shape.size() && !found; ++m) {
      if (used[m] || src.shape[m] != written.shape[k] || src.strides[m] != written.strides[k]) {
        continue;
      }
      used[m] = found = true;
      strides[k] = dst.strides[m];
    }
    if (!found) return std::nullopt;
  }
  for (size_t m = 0; m < src.shape.size(); ++m) {
    if (src.shape[m] != 1 && !used[m]) return std::nullopt;
  }
  TensorRef placed = dst;
  placed.shape = written.shape;
  placed.strides = strides;
  return placed;
}

// A `copy` whose source is the whole result of an earlier instruction that
// nothing else reads (a permute made contiguous: attention's heads merged
// back) is dropped, the producer writing straight into the copy's
// destination in the permuted layout.
uint32_t WriteThroughCopies(std::vector<LoweredInstruction>* list) {
  const std::unordered_map<uint64_t, uint32_t> last = LastTouches(*list);
  std::vector<bool> removed(list->size(), false);
  // The position of the last instruction that wrote each scratch buffer.
  std::unordered_map<uint64_t, uint32_t> writer;
  uint32_t removed_count = 0;
  for (uint32_t c = 0; c < list->size(); ++c) {
    const LoweredInstruction& copy = (*list)[c];
    if (copy.opcode == TERN_OP_COPY) {
      const TensorRef& src = copy.operands[1];
      const auto found = writer.find(Key(src.buffer));
      if (src.buffer.kind == BufferRef::kScratch && found != writer.end() &&
          last.at(Key(src.buffer)) == c) {
        const uint32_t p = found->second;
        LoweredInstruction& producer = (*list)[p];
        // A single written operand (not layer_norm's statistics), strided
        // outputs allowed (not the copy itself, not gather/scatter, whose
        // writes are read-modify-write or data-dependent).
        // Nor a matmul with beta, which reads its output first.
        const bool reads_output = producer.opcode == TERN_OP_MATMUL && producer.floats.size() > 1 &&
                                  producer.floats[1] != 0.0;
        const bool plain_writer = producer.written == 1 && producer.opcode != TERN_OP_COPY &&
                                  producer.opcode != TERN_OP_SCATTER_ADD &&
                                  producer.opcode != TERN_OP_SCATTER_ADD_ALONG_AXIS &&
                                  !reads_output;
        std::optional<TensorRef> placed =
            plain_writer ? WrittenThroughCopy(producer.operands[0], copy) : std::nullopt;
        // Nothing between the producer and the copy may touch the
        // destination (the producer must not read it either), nor read the
        // result where the producer no longer writes it.
        bool clear = placed.has_value();
        for (uint32_t k = p; clear && k < c; ++k) {
          const LoweredInstruction& between = (*list)[k];
          if (removed[k]) continue;
          if (HasBuffer(between, 0, between.operands.size(), placed->buffer) ||
              (k > p && HasBuffer(between, 0, between.operands.size(), src.buffer))) {
            clear = false;
          }
        }
        if (clear) {
          producer.operands[0] = *placed;
          producer.fused_nodes.push_back(copy.node);
          removed[c] = true;
          ++removed_count;
          continue;
        }
      }
    }
    for (size_t k = 0; k < copy.written && k < copy.operands.size(); ++k) {
      if (copy.operands[k].present()) writer[Key(copy.operands[k].buffer)] = c;
    }
  }
  std::vector<LoweredInstruction> kept;
  kept.reserve(list->size() - removed_count);
  for (uint32_t i = 0; i < list->size(); ++i) {
    if (!removed[i]) kept.push_back(std::move((*list)[i]));
  }
  *list = std::move(kept);
  return removed_count;
}

// --- 1. matmul / conv2d epilogues ------------------------------------------------------------

bool CanTakeEpilogue(const LoweredInstruction& producer) {
  const TensorRef& out = producer.operands[0];
  if (!IsFloat(out.dtype) || out.buffer.kind != BufferRef::kScratch) return false;
  if (producer.opcode == TERN_OP_MATMUL) {
    if (producer.ints.size() > 2 || producer.operands.size() > 4) return false;
    return producer.floats.size() < 2 || producer.floats[1] == 0.0;  // beta reads out
  }
  return producer.opcode == TERN_OP_CONV2D && producer.ints.size() <= 7 &&
         producer.operands.size() <= 4;
}

// Folds the add of a residual and/or an activation that follow a matmul or
// conv2d into it. Returns the number of instructions removed.
uint32_t FuseEpilogues(std::vector<LoweredInstruction>* list, const ConstantPool& pool,
                       FusionStats* stats) {
  const std::unordered_map<uint64_t, uint32_t> last = LastTouches(*list);
  // `value` is read by nothing after `consumer` (at `position`): nothing
  // touches its buffer later, or the consumer overwrites it in place (later
  // reads of the buffer see the consumer's result).
  auto dead_after = [&](const TensorRef& value, const LoweredInstruction& consumer,
                        uint32_t position) {
    // (A graph output is read by the caller: never dead.)
    return value.buffer.kind == BufferRef::kScratch &&
           (last.at(Key(value.buffer)) == position || SameElements(consumer.operands[0], value));
  };
  std::vector<bool> removed(list->size(), false);
  uint32_t removed_count = 0;
  for (uint32_t i = 0; i < list->size(); ++i) {
    LoweredInstruction& producer = (*list)[i];
    if (removed[i] || !CanTakeEpilogue(producer)) continue;
    const TensorRef product = producer.operands[0];
    TensorRef final = product;
    std::optional<TensorRef> residual;
    int64_t activation = TERN_ACTIVATION_NONE;
    std::vector<double> parameters;
    std::vector<uint32_t> consumed;
    uint32_t j = i + 1;
    // The result must go nowhere but into the epilogue instruction; the new
    // destination must not be one of the producer's inputs.
    auto destination_ok = [&](const TensorRef& destination) {
      return destination.shape == product.shape && destination.dtype == product.dtype &&
             !HasBuffer(producer, 1, producer.operands.size(), destination.buffer);
    };
    // A bias-free matmul scaled by a power of two (attention's 1 / sqrt(d)):
    // the scale is its alpha. Exact either way, so the bits do not change.
    if (j < list->size() && producer.opcode == TERN_OP_MATMUL && producer.operands.size() < 4) {
      const LoweredInstruction& scale = (*list)[j];
      std::optional<float> factor;
      if (scale.opcode == TERN_OP_BINARY && scale.ints.size() == 1 &&
          dead_after(product, scale, j)) {
        const bool mul = scale.ints[0] == TERN_BINARY_MUL, div = scale.ints[0] == TERN_BINARY_DIV;
        if (mul && SameElements(scale.operands[1], product)) {
          factor = ScalarConstant(scale.operands[2], pool);
        } else if (mul && SameElements(scale.operands[2], product)) {
          factor = ScalarConstant(scale.operands[1], pool);
        } else if (div && SameElements(scale.operands[1], product)) {
          factor = ScalarConstant(scale.operands[2], pool);
          if (factor.has_value()) factor = 1.0f / *factor;
        }
      }
      const std::optional<TensorRef> out =
          factor.has_value() ? AsShape(scale.operands[0], product.shape) : std::nullopt;
      const double alpha = producer.floats.empty() ? 1.0 : producer.floats[0];
      // The combined alpha must stay a normal f32 (2^100 * 2^100 would be inf).
      const bool normal = factor.has_value() &&
                          std::isnormal(static_cast<float>(alpha * static_cast<double>(*factor)));
      if (out.has_value() && IsPowerOfTwo(*factor) && normal && destination_ok(*out)) {
        if (producer.floats.empty()) producer.floats.push_back(1.0);
        producer.floats[0] = alpha * static_cast<double>(*factor);
        final = *out;
        consumed.push_back(j++);
      }
    }
    if (j < list->size()) {
      const LoweredInstruction& add = (*list)[j];
      if (add.opcode == TERN_OP_BINARY && add.ints.size() == 1 && add.ints[0] == TERN_BINARY_ADD &&
          dead_after(final, add, j)) {
        // (The add may see the product through a reshape: [64, 256] as [1, 64, 256].)
        const bool first = SameElements(add.operands[1], final);
        const bool second = SameElements(add.operands[2], final);
        if (first != second) {
          const std::optional<TensorRef> other =
              AsShape(add.operands[first ? 2 : 1], product.shape);
          const std::optional<TensorRef> out = AsShape(add.operands[0], product.shape);
          if (other.has_value() && out.has_value() && other->dtype == product.dtype &&
              !(other->buffer == final.buffer) && !(other->buffer == product.buffer) &&
              !(other->buffer == out->buffer) && destination_ok(*out)) {
            residual = *other;
            final = *out;
            consumed.push_back(j++);
          }
        }
      }
    }
    if (j < list->size()) {
      const LoweredInstruction& unary = (*list)[j];
      if (unary.opcode == TERN_OP_UNARY && unary.ints.size() == 1 && IsActivation(unary.ints[0]) &&
          SameElements(unary.operands[1], final) && final.buffer.kind == BufferRef::kScratch &&
          dead_after(final, unary, j)) {
        std::optional<std::vector<double>> full = FullParameters(unary.ints[0], unary.floats);
        const std::optional<TensorRef> out = AsShape(unary.operands[0], product.shape);
        if (full.has_value() && out.has_value() && destination_ok(*out) &&
            !(residual.has_value() && residual->buffer == out->buffer)) {
          activation = unary.ints[0];
          parameters = *full;
          final = *out;
          consumed.push_back(j++);
        }
      }
    }
    if (consumed.empty()) continue;
    producer.operands[0] = final;
    if (residual.has_value()) {
      while (producer.operands.size() < 4) producer.operands.push_back(TensorRef::None());
      producer.operands.push_back(*residual);
    }
    if (producer.opcode == TERN_OP_MATMUL) {
      if (activation != TERN_ACTIVATION_NONE) {
        while (producer.ints.size() < 2) producer.ints.push_back(0);
        producer.ints.push_back(activation);
        if (!parameters.empty()) {
          if (producer.floats.empty()) producer.floats.push_back(1.0);
          if (producer.floats.size() < 2) producer.floats.push_back(0.0);
          producer.floats.insert(producer.floats.end(), parameters.begin(), parameters.end());
        }
      }
    } else if (activation != TERN_ACTIVATION_NONE) {
      if (producer.ints.empty()) producer.ints = {1, 1, 0, 0, 1, 1, 1};
      producer.ints.push_back(activation);
      producer.floats = parameters;
    }
    for (uint32_t position : consumed) {
      removed[position] = true;
      const LoweredInstruction& taken = (*list)[position];
      producer.fused_nodes.push_back(taken.node);
      producer.fused_nodes.insert(producer.fused_nodes.end(), taken.fused_nodes.begin(),
                                  taken.fused_nodes.end());
    }
    removed_count += static_cast<uint32_t>(consumed.size());
    ++stats->epilogues;
  }
  std::vector<LoweredInstruction> kept;
  kept.reserve(list->size() - removed_count);
  for (uint32_t i = 0; i < list->size(); ++i) {
    if (!removed[i]) kept.push_back(std::move((*list)[i]));
  }
  *list = std::move(kept);
  return removed_count;
}

// --- 2. elementwise programs -----------------------------------------------------------------

bool IsElementwiseCandidate(const LoweredInstruction& instruction) {
  switch (instruction.opcode) {
    case TERN_OP_BINARY: {
      const int64_t fn = instruction.ints[0];
      if (fn == TERN_BINARY_BITWISE_AND || fn == TERN_BINARY_BITWISE_OR ||
          fn == TERN_BINARY_BITWISE_XOR) {
        return false;
      }
      break;
    }
    case TERN_OP_UNARY:
      if (instruction.ints[0] == TERN_UNARY_BITWISE_NOT) return false;
      if (!FullParameters(instruction.ints[0], instruction.floats).has_value()) return false;
      break;
    case TERN_OP_WHERE:
      break;
    default:
      return false;
  }
  for (const TensorRef& ref : instruction.operands) {
    if (!ref.present() || !IsFloatOrBool(ref.dtype)) return false;
  }
  return true;
}

// A program under construction: the members so far as steps over registers.
struct Program {
  struct Written {
    TensorRef ref;  // where the unfused instruction wrote it
    int64_t reg = 0;
    uint32_t order = 0;  // first write among the members, for a stable output order
  };
  std::vector<TensorRef> inputs;
  std::vector<std::array<int64_t, 5>> steps;
  std::vector<double> floats;
  std::map<uint64_t, Written> written;  // buffer -> the last member's write to it
  std::vector<uint32_t> members;
};

// Adds `instruction` (at `position`) to `program`; false (program unchanged
// in what matters: the caller discards the copy) when it cannot join.
bool Join(Program* program, const LoweredInstruction& instruction, uint32_t position,
          const ConstantPool& pool) {
  std::vector<int64_t> regs;
  for (size_t k = instruction.written; k < instruction.operands.size(); ++k) {
    const TensorRef& ref = instruction.operands[k];
    const auto found = program->written.find(Key(ref.buffer));
    if (found != program->written.end()) {
      // A member's result: only in the very layout it was written in.
      if (!SameRef(found->second.ref, ref)) return false;
      regs.push_back(found->second.reg);
      continue;
    }
    if (std::optional<float> value = ScalarConstant(ref, pool); value.has_value()) {
      int64_t reg = -1;
      for (size_t s = 0; s < program->steps.size(); ++s) {
        const auto& step = program->steps[s];
        if (step[0] == TERN_STEP_CONSTANT &&
            SameBits(static_cast<float>(program->floats[step[2]]), *value)) {
          reg = TERN_PROGRAM_INPUTS + static_cast<int64_t>(s);
          break;
        }
      }
      if (reg < 0) {
        program->floats.push_back(*value);
        program->steps.push_back(
            {TERN_STEP_CONSTANT, 0, static_cast<int64_t>(program->floats.size() - 1), 0, 0});
        reg = TERN_PROGRAM_INPUTS + static_cast<int64_t>(program->steps.size() - 1);
      }
      if (reg >= 0) {
        regs.push_back(reg);
        continue;
      }
    }
    int64_t reg = -1;
    for (size_t i = 0; i < program->inputs.size(); ++i) {
      if (SameRef(program->inputs[i], ref)) reg = static_cast<int64_t>(i);
    }
    if (reg < 0) {
      if (program->inputs.size() == TERN_PROGRAM_INPUTS) return false;
      program->inputs.push_back(ref);
      reg = static_cast<int64_t>(program->inputs.size() - 1);
    }
    regs.push_back(reg);
  }
  switch (instruction.opcode) {
    case TERN_OP_BINARY:
      program->steps.push_back({TERN_STEP_BINARY, instruction.ints[0], regs[0], regs[1], 0});
      break;
    case TERN_OP_UNARY: {
      const std::vector<double> parameters =
          *FullParameters(instruction.ints[0], instruction.floats);
      const int64_t first = parameters.empty() ? 0 : static_cast<int64_t>(program->floats.size());
      program->floats.insert(program->floats.end(), parameters.begin(), parameters.end());
      program->steps.push_back({TERN_STEP_UNARY, instruction.ints[0], regs[0], first, 0});
      break;
    }
    default:  // TERN_OP_WHERE
      program->steps.push_back({TERN_STEP_WHERE, 0, regs[0], regs[1], regs[2]});
      break;
  }
  if (program->steps.size() > TERN_PROGRAM_MAX_STEPS ||
      program->floats.size() > TERN_PROGRAM_MAX_FLOATS) {
    return false;
  }
  const TensorRef& out = instruction.operands[0];
  // An output may be an input's memory only in the input's exact layout.
  for (const TensorRef& input : program->inputs) {
    if (input.buffer == out.buffer && !SameRef(input, out)) return false;
  }
  const int64_t reg = TERN_PROGRAM_INPUTS + static_cast<int64_t>(program->steps.size() - 1);
  auto [it, inserted] = program->written.try_emplace(
      Key(out.buffer), Program::Written{out, reg, static_cast<uint32_t>(program->written.size())});
  if (!inserted) {
    if (!SameRef(it->second.ref, out)) return false;
    it->second.reg = reg;
  }
  program->members.push_back(position);
  return true;
}

// The results a program must store: those a later instruction touches or
// that live outside scratch. nullopt when there are more than the ISA's 4.
std::optional<std::vector<Program::Written>> Outputs(
    const Program& program, const std::unordered_map<uint64_t, uint32_t>& last) {
  std::vector<Program::Written> outputs;
  const uint32_t end = program.members.back();
  for (const auto& [key, written] : program.written) {
    if (written.ref.buffer.kind != BufferRef::kScratch || last.at(key) > end) {
      outputs.push_back(written);
    }
  }
  if (outputs.empty() || outputs.size() > TERN_PROGRAM_OUTPUTS) return std::nullopt;
  std::sort(outputs.begin(), outputs.end(),
            [](const auto& a, const auto& b) { return a.order < b.order; });
  return outputs;
}

LoweredInstruction Emit(const Program& program, const std::vector<Program::Written>& outputs,
                        const std::vector<LoweredInstruction>& list) {
  LoweredInstruction fused;
  fused.opcode = TERN_OP_ELEMENTWISE;
  fused.written = TERN_PROGRAM_OUTPUTS;
  for (const Program::Written& output : outputs) fused.operands.push_back(output.ref);
  while (fused.operands.size() < TERN_PROGRAM_OUTPUTS) fused.operands.push_back(TensorRef::None());
  for (const TensorRef& input : program.inputs) fused.operands.push_back(input);
  fused.ints.push_back(static_cast<int64_t>(program.steps.size()));
  for (const auto& step : program.steps)
    fused.ints.insert(fused.ints.end(), step.begin(), step.end());
  for (size_t j = 0; j < TERN_PROGRAM_OUTPUTS; ++j) {
    fused.ints.push_back(j < outputs.size() ? outputs[j].reg : -1);
  }
  fused.floats = program.floats;
  // The debug op of the program names its first member, then the others.
  const LoweredInstruction& first = list[program.members.front()];
  fused.node = first.node;
  fused.output = first.output;
  fused.fused_nodes = first.fused_nodes;
  for (size_t k = 1; k < program.members.size(); ++k) {
    const LoweredInstruction& member = list[program.members[k]];
    fused.fused_nodes.push_back(member.node);
    fused.fused_nodes.insert(fused.fused_nodes.end(), member.fused_nodes.begin(),
                             member.fused_nodes.end());
  }
  return fused;
}

// Candidates whose results feed each other (directly or through other
// candidates of the same output shape) are one component: the steps of one
// computation. An optimizer's update of each parameter is one component whose
// steps the graph interleaves with every other parameter's.
std::vector<uint32_t> Components(const std::vector<LoweredInstruction>& list) {
  std::vector<uint32_t> parent(list.size());
  for (uint32_t k = 0; k < parent.size(); ++k) parent[k] = k;
  auto find = [&](uint32_t k) {
    while (parent[k] != k) k = parent[k] = parent[parent[k]];
    return k;
  };
  std::unordered_map<uint64_t, uint32_t> producer;  // buffer -> last candidate that wrote it
  for (uint32_t k = 0; k < list.size(); ++k) {
    const LoweredInstruction& instruction = list[k];
    if (!IsElementwiseCandidate(instruction)) continue;
    for (size_t r = instruction.written; r < instruction.operands.size(); ++r) {
      const auto found = producer.find(Key(instruction.operands[r].buffer));
      if (found != producer.end() &&
          list[found->second].operands[0].shape == instruction.operands[0].shape) {
        parent[find(k)] = find(found->second);
      }
    }
    for (uint32_t w = 0; w < instruction.written; ++w) {
      producer[Key(instruction.operands[w].buffer)] = k;
    }
  }
  for (uint32_t k = 0; k < parent.size(); ++k) parent[k] = find(k);
  return parent;
}

// The buffers the instructions of a window read and write.
struct Touches {
  std::unordered_map<uint64_t, std::vector<uint32_t>> readers, writers;  // buffer -> positions

  void Add(const LoweredInstruction& instruction, uint32_t position) {
    for (size_t k = 0; k < instruction.operands.size(); ++k) {
      const TensorRef& ref = instruction.operands[k];
      if (!ref.present() || ref.buffer.kind == BufferRef::kConstant) continue;
      (k < instruction.written ? writers : readers)[Key(ref.buffer)].push_back(position);
    }
  }

  // Calls `conflict` with each position whose access does not commute with
  // `instruction`'s: a write of a buffer it reads, any access of one it writes.
  template <typename Fn>
  void ForEachConflict(const LoweredInstruction& instruction, Fn conflict) const {
    for (size_t k = 0; k < instruction.operands.size(); ++k) {
      const TensorRef& ref = instruction.operands[k];
      if (!ref.present() || ref.buffer.kind == BufferRef::kConstant) continue;
      const uint64_t key = Key(ref.buffer);
      if (const auto w = writers.find(key); w != writers.end()) {
        for (uint32_t position : w->second) conflict(position);
      }
      if (k >= instruction.written) continue;
      if (const auto r = readers.find(key); r != readers.end()) {
        for (uint32_t position : r->second) conflict(position);
      }
    }
  }

  bool Conflicts(const LoweredInstruction& instruction) const {
    bool any = false;
    ForEachConflict(instruction, [&](uint32_t) { any = true; });
    return any;
  }
};

// How many instructions a program's growth looks past its first member.
constexpr uint32_t kFusionWindow = 4096;

uint32_t FuseElementwise(LoweredProgram* lowered, FusionStats* stats) {
  std::vector<LoweredInstruction>& list = lowered->instructions;
  const std::unordered_map<uint64_t, uint32_t> last = LastTouches(list);
  const std::vector<uint32_t> component = Components(list);
  std::vector<bool> done(list.size(), false);
  std::vector<LoweredInstruction> result;
  result.reserve(list.size());
  uint32_t removed = 0;
  for (uint32_t i = 0; i < list.size(); ++i) {
    if (done[i]) continue;
    if (!IsElementwiseCandidate(list[i])) {
      result.push_back(std::move(list[i]));
      done[i] = true;
      continue;
    }
    // Grow a program from list[i] with the later candidates of its component
    // (same output shape, results feeding each other). An instruction in
    // between is passed over when it commutes with the members so far (reads
    // nothing they write, writes nothing they touch): it stays after the
    // program, in its order, unless a later member needs it first (reads what
    // it writes, or writes what it touches); then it is hoisted before the
    // program, with the passed instructions it depends on. The longest prefix
    // that makes a valid program is taken.
    struct Passed {
      uint32_t position;
      size_t needed_by = 0;            // the member count that first needed it hoisted
      std::vector<size_t> depends_on;  // earlier passed instructions it must follow
    };
    struct Best {
      Program program;
      std::vector<Program::Written> outputs;
      size_t passed = 0;  // passed instructions before its last member
    };
    Program program;
    std::optional<Best> best;
    std::vector<Passed> passed;
    Touches members, passed_touches;
    std::unordered_map<uint32_t, size_t> passed_index;  // position -> index in `passed`
    uint32_t looked = 0;
    for (uint32_t j = i; j < list.size() && looked < kFusionWindow; ++j) {
      if (done[j]) continue;
      ++looked;
      const LoweredInstruction& instruction = list[j];
      if (component[j] == component[i] && IsElementwiseCandidate(instruction)) {
        Program grown = program;
        if (Join(&grown, instruction, j, lowered->constants)) {
          program = std::move(grown);
          passed_touches.ForEachConflict(instruction, [&](uint32_t position) {
            Passed& needed = passed[passed_index.at(position)];
            if (needed.needed_by == 0) needed.needed_by = program.members.size();
          });
          members.Add(instruction, j);
          if (program.members.size() >= 2) {
            if (std::optional<std::vector<Program::Written>> outputs = Outputs(program, last)) {
              best.emplace(Best{program, std::move(*outputs), passed.size()});
            }
          }
          continue;
        }
      }
      if (members.Conflicts(instruction)) break;
      Passed entry{j};
      passed_touches.ForEachConflict(instruction, [&](uint32_t position) {
        entry.depends_on.push_back(passed_index.at(position));
      });
      passed_index.emplace(j, passed.size());
      passed.push_back(std::move(entry));
      passed_touches.Add(instruction, j);
    }
    if (!best.has_value()) {
      result.push_back(std::move(list[i]));
      done[i] = true;
      continue;
    }
    const Program& chosen = best->program;
    // Hoisted: what the chosen members need first, and what that follows.
    std::vector<bool> hoisted(best->passed, false);
    for (size_t k = best->passed; k-- > 0;) {
      if (passed[k].needed_by != 0 && passed[k].needed_by <= chosen.members.size()) {
        hoisted[k] = true;
      }
      if (hoisted[k]) {
        for (size_t before : passed[k].depends_on) hoisted[before] = true;
      }
    }
    for (size_t k = 0; k < best->passed; ++k) {
      if (!hoisted[k]) continue;
      result.push_back(std::move(list[passed[k].position]));
      done[passed[k].position] = true;
    }
    result.push_back(Emit(chosen, best->outputs, list));
    for (uint32_t member : chosen.members) done[member] = true;
    removed += static_cast<uint32_t>(chosen.members.size()) - 1;
    ++stats->fused_groups;
    stats->fused_members += static_cast<uint32_t>(chosen.members.size());
  }
  list = std::move(result);
  return removed;
}

}  // namespace

void FuseInstructions(LoweredProgram* program, FusionStats* stats) {
  FusionStats counted;
  counted.instructions_before = static_cast<uint32_t>(program->instructions.size());
  counted.copies_removed = WriteThroughCopies(&program->instructions);
  FuseEpilogues(&program->instructions, program->constants, &counted);
  FuseElementwise(program, &counted);
  counted.instructions_after = static_cast<uint32_t>(program->instructions.size());
  if (stats != nullptr) *stats = counted;
}

}  // namespace tern::compiler
