#include "src/executable/checks.h"

namespace tern::exe {

bool IsSyncOpcode(uint32_t opcode) { return isa::OpcodeEngine(opcode) == TERN_ENGINE_SYNC; }

Status TensorBytes(tern_status_t code, tern_dtype_t dtype, std::span<const int64_t> shape,
                   uint64_t* out_bytes) {
  const size_t element = isa::DTypeSize(dtype);
  if (element == 0) {
    return MakeStatus(code, "dtype {} is not a tern_dtype_t this version knows",
                      static_cast<int>(dtype));
  }
  if (shape.size() > TERN_MAX_RANK) {
    return MakeStatus(code, "rank {} exceeds the maximum of {}", shape.size(), TERN_MAX_RANK);
  }
  uint64_t bytes = element;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return MakeStatus(code, "dimension {} is {}; dimensions must be >= 0", i, shape[i]);
    }
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(shape[i]), &bytes)) {
      return MakeStatus(code, "the size in bytes overflows 64 bits");
    }
  }
  *out_bytes = bytes;
  return OkStatus();
}

Status ContiguousStrides(tern_status_t code, isa::OperandDesc* desc) {
  int64_t stride = 1;
  for (int i = static_cast<int>(desc->rank) - 1; i >= 0; --i) {
    if (desc->shape[i] < 0) {
      return MakeStatus(code, "dimension {} is {}; dimensions must be >= 0", i, desc->shape[i]);
    }
    desc->strides[i] = stride;
    if (i > 0 && __builtin_mul_overflow(stride, desc->shape[i], &stride)) {
      return MakeStatus(code, "its shape has more elements than 64 bits can count");
    }
  }
  return OkStatus();
}

std::string DescribeOperandSlot(size_t position, const isa::OperandDesc& desc,
                                const SegmentSizes& sizes) {
  switch (desc.segment) {
    case TERN_SEGMENT_INPUT:
      if (desc.index < sizes.inputs.size()) {
        return fmt::format("operand {} (input {} '{}')", position, desc.index,
                           sizes.inputs[desc.index].name);
      }
      return fmt::format("operand {} (input {})", position, desc.index);
    case TERN_SEGMENT_OUTPUT:
      if (desc.index < sizes.outputs.size()) {
        return fmt::format("operand {} (output {} '{}')", position, desc.index,
                           sizes.outputs[desc.index].name);
      }
      return fmt::format("operand {} (output {})", position, desc.index);
    case TERN_SEGMENT_CONSTANT:
      return fmt::format("operand {} (constants)", position);
    case TERN_SEGMENT_SCRATCH:
      return fmt::format("operand {} (scratch)", position);
    case TERN_SEGMENT_NONE:
      return fmt::format("operand {} (absent)", position);
    default:
      return fmt::format("operand {} (segment {})", position, static_cast<int>(desc.segment));
  }
}

Status CheckOperandPlacement(tern_status_t code, const isa::OperandDesc& desc, bool written,
                             const SegmentSizes& sizes, uint64_t* out_end) {
  uint64_t segment_size = 0;
  std::string segment_name;
  switch (desc.segment) {
    case TERN_SEGMENT_INPUT:
    case TERN_SEGMENT_OUTPUT: {
      const bool input = desc.segment == TERN_SEGMENT_INPUT;
      const auto& tensors = input ? sizes.inputs : sizes.outputs;
      if (desc.index >= tensors.size()) {
        return MakeStatus(code, "it names {} {}, but the function has {} {}",
                          input ? "input" : "output", desc.index, tensors.size(),
                          input ? "inputs" : "outputs");
      }
      segment_size = tensors[desc.index].size_bytes;
      segment_name = fmt::format("{} {} '{}'", input ? "input" : "output", desc.index,
                                 tensors[desc.index].name);
      break;
    }
    case TERN_SEGMENT_CONSTANT:
    case TERN_SEGMENT_SCRATCH: {
      const bool constants = desc.segment == TERN_SEGMENT_CONSTANT;
      if (desc.index != 0) {
        return MakeStatus(code, "its index is {}, but {} operands must have index 0", desc.index,
                          constants ? "constants" : "scratch");
      }
      if (constants && written) {
        return MakeStatus(code,
                          "the instruction writes it, but it is in the constants segment, which "
                          "is read-only; write to an output or to scratch");
      }
      if (!constants && !sizes.check_scratch) {
        segment_size = UINT64_MAX;
      } else {
        segment_size = constants ? sizes.constants : sizes.scratch;
      }
      segment_name = constants ? "the constants" : "the scratch";
      break;
    }
    default:
      return MakeStatus(code, "segment {} is not a tern_segment_t this version knows",
                        static_cast<int>(desc.segment));
  }
  if (desc.rank > TERN_MAX_RANK) {
    return MakeStatus(code, "rank {} exceeds the maximum of {}", desc.rank, TERN_MAX_RANK);
  }
  uint64_t begin = 0, end = 0;
  Status extent = isa::OperandExtent(desc, &begin, &end);
  if (!extent.ok()) return Status(code, extent.message());
  if (end > segment_size) {
    return MakeStatus(code, "{} at offset {} can touch bytes [{}, {}), but {} is only {} bytes",
                      isa::DescribeOperand(desc), desc.offset, begin, end, segment_name,
                      segment_size);
  }
  *out_end = end;
  return OkStatus();
}

Status SplitSyncEngine(tern_status_t code, uint32_t opcode, std::span<const int64_t> ints,
                       tern_engine_t* out_engine) {
  const bool wait = opcode == TERN_OP_SEM_WAIT;
  if (ints.size() != 3) {
    return MakeStatus(code,
                      "{} takes 3 ints here, [semaphore, {}, engine], but has {}: the last names "
                      "the engine (tern_engine_t) whose stream it belongs to",
                      isa::OpcodeName(opcode), wait ? "value" : "increment", ints.size());
  }
  const int64_t engine = ints[2];
  if (engine < TERN_ENGINE_DMA || engine >= TERN_ENGINE_SYNC) {
    return MakeStatus(code,
                      "ints[2] is {}, which is not the tern_engine_t of a stream (DMA {} to "
                      "collective {})",
                      engine, static_cast<int>(TERN_ENGINE_DMA),
                      static_cast<int>(TERN_ENGINE_COLLECTIVE));
  }
  *out_engine = static_cast<tern_engine_t>(engine);
  return OkStatus();
}

}  // namespace tern::exe
