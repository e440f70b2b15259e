// Checks shared by the builder (as instructions are added) and the loader
// (for every instruction of a file): signatures, operand placement in their
// segments, sync parameters. Each returns a Status with the caller's error
// code and a message saying what is wrong; callers add where and what to do.
#ifndef TERN_SRC_EXECUTABLE_CHECKS_H_
#define TERN_SRC_EXECUTABLE_CHECKS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "common/isa_rules.h"
#include "common/status_with_message.h"
#include "driver_shim/program.h"

namespace tern::exe {

bool IsSyncOpcode(uint32_t opcode);

// Checks a signature tensor (known dtype, rank <= TERN_MAX_RANK, dimensions
// >= 0, no overflow) and stores product(shape) * dtype size.
Status TensorBytes(tern_status_t code, tern_dtype_t dtype, std::span<const int64_t> shape,
                   uint64_t* out_bytes);

// Fills contiguous row-major strides for desc->shape (rank already checked),
// failing on negative dimensions or strides that overflow 64 bits (unlike
// isa::SetContiguousStrides, safe on hostile shapes).
Status ContiguousStrides(tern_status_t code, isa::OperandDesc* desc);

// Segment sizes of one function, for operand placement checks.
struct SegmentSizes {
  std::span<const driver::TensorSignature> inputs;
  std::span<const driver::TensorSignature> outputs;
  uint64_t constants = 0;
  uint64_t scratch = 0;
  bool check_scratch = true;  // the builder checks scratch at end of function
};

// Checks that present operand `desc` names an existing segment and index and
// that every byte it can touch lies inside; stores its end in `*out_end`.
// `written` operands may not be constants.
Status CheckOperandPlacement(tern_status_t code, const isa::OperandDesc& desc, bool written,
                             const SegmentSizes& sizes, uint64_t* out_end);

// The builder's form of SEM_SIGNAL / SEM_WAIT ints is [semaphore, value,
// engine]: the engine whose stream the instruction goes to. Checks the third
// int and stores the engine; the file keeps [semaphore, value] (what
// isa::ValidateInstruction checks) in that engine's stream.
Status SplitSyncEngine(tern_status_t code, uint32_t opcode, std::span<const int64_t> ints,
                       tern_engine_t* out_engine);

// "operand 1 (input 0 'x')" for messages.
std::string DescribeOperandSlot(size_t position, const isa::OperandDesc& desc,
                                const SegmentSizes& sizes);

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_CHECKS_H_
