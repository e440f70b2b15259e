#include "compiler/lower/mutations.h"

#include <optional>

namespace tern::compiler {
namespace {

bool SameLayout(const TensorRef& a, const TensorRef& b) {
  return a.offset == b.offset && a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides;
}

// Instructions that read each element of their inputs before writing the
// same element of their output, so that an output may be an input's memory
// in the same layout (the kernels load a chunk, compute, then store it).
bool ElementwiseInPlace(tern_opcode_t opcode) {
  return opcode == TERN_OP_ELEMENTWISE || opcode == TERN_OP_BINARY || opcode == TERN_OP_UNARY ||
         opcode == TERN_OP_WHERE || opcode == TERN_OP_COPY;
}

// Whether output k may be written straight into input j: no instruction
// reads input j after the first one that writes output k, and that one, if
// it reads input j too, does so element by element in the layout it writes.
bool CanWriteInPlace(const std::vector<LoweredInstruction>& list, const BufferRef& input,
                     const BufferRef& output) {
  std::optional<size_t> first_write;
  for (size_t position = 0; position < list.size(); ++position) {
    const LoweredInstruction& instruction = list[position];
    bool reads_input = false, writes_output = false;
    for (size_t k = 0; k < instruction.operands.size(); ++k) {
      const TensorRef& ref = instruction.operands[k];
      if (!ref.present()) continue;
      if (k >= instruction.written && ref.buffer == input) reads_input = true;
      if (k < instruction.written && ref.buffer == output) writes_output = true;
    }
    if (first_write.has_value()) {
      if (reads_input) return false;
      continue;
    }
    if (!writes_output) continue;
    first_write = position;
    if (!reads_input) continue;
    if (!ElementwiseInPlace(instruction.opcode)) return false;
    for (size_t k = 0; k < instruction.operands.size(); ++k) {
      const TensorRef& ref = instruction.operands[k];
      if (!ref.present() || k < instruction.written) continue;
      if (ref.buffer != input) continue;
      for (size_t w = 0; w < instruction.written; ++w) {
        const TensorRef& out = instruction.operands[w];
        if (out.present() && out.buffer == output && !SameLayout(out, ref)) return false;
      }
    }
  }
  return first_write.has_value();
}

void Retarget(std::vector<LoweredInstruction>* list, const BufferRef& from, const BufferRef& to) {
  for (LoweredInstruction& instruction : *list) {
    for (TensorRef& ref : instruction.operands) {
      if (ref.present() && ref.buffer == from) ref.buffer = to;
    }
  }
}

}  // namespace

std::vector<uint32_t> MakeMutationsSafeInPlace(const Graph& graph, LoweredProgram* program,
                                               MutationStats* stats) {
  std::vector<uint32_t> shared(graph.outputs.size(), kNoSharedInput);
  std::vector<LoweredInstruction>& list = program->instructions;
  std::vector<LoweredInstruction> copies;
  for (const Graph::Mutation& mutation : graph.mutations) {
    const BufferRef input{BufferRef::kInput, mutation.input};
    const BufferRef output{BufferRef::kOutput, mutation.output};
    shared[mutation.output] = mutation.input;
    if (CanWriteInPlace(list, input, output)) {
      if (stats != nullptr) ++stats->in_place;
      continue;
    }
    // Computed into scratch of its own, copied into the output after every
    // instruction (the copy waits for the input's last reader).
    const TensorType& type = graph.values[graph.outputs[mutation.output].value].type;
    const BufferRef scratch{BufferRef::kScratch,
                            static_cast<uint32_t>(program->scratch_bytes.size())};
    const TensorRef whole = TensorRef::Contiguous(output, type.dtype, StaticSizes(type.shape));
    TensorRef staged = whole;
    staged.buffer = scratch;
    program->scratch_bytes.push_back(static_cast<uint64_t>(whole.Elements()) *
                                     tern_dtype_size(type.dtype));
    Retarget(&list, output, scratch);
    LoweredInstruction copy;
    copy.opcode = TERN_OP_COPY;
    copy.operands = {whole, staged};
    copy.output = mutation.output;
    copies.push_back(std::move(copy));
    if (stats != nullptr) ++stats->copied;
  }
  for (LoweredInstruction& copy : copies) list.push_back(std::move(copy));
  return shared;
}

}  // namespace tern::compiler
