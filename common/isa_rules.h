// The rules of the instruction set (include/tern/isa.h): names, engines,
// dtype sizes, and the per-opcode checks of operands and parameters that the
// builder applies as it goes and the loader applies to every instruction of
// a file. Shared by libtern and the simulated engines.
#ifndef TERN_COMMON_ISA_RULES_H_
#define TERN_COMMON_ISA_RULES_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "common/status_with_message.h"
#include "tern/isa.h"

namespace tern::isa {

// An operand as the loader and the engines see it: strides always filled in
// (elements; contiguous row-major when the file gave none).
struct OperandDesc {
  tern_segment_t segment = TERN_SEGMENT_NONE;
  uint32_t index = 0;
  uint64_t offset = 0;  // bytes from the start of the segment
  tern_dtype_t dtype = TERN_DTYPE_F32;
  uint32_t rank = 0;
  std::array<int64_t, TERN_MAX_RANK> shape{};
  std::array<int64_t, TERN_MAX_RANK> strides{};

  bool present() const { return segment != TERN_SEGMENT_NONE; }
  int64_t element_count() const;  // product of shape (1 for rank 0)
};

// Bytes per element; 0 for an unknown dtype.
size_t DTypeSize(tern_dtype_t dtype);
const char* DTypeName(tern_dtype_t dtype);  // "f32"; "unknown" otherwise
bool IsFloat(tern_dtype_t dtype);           // f32, bf16, f16
bool IsInteger(tern_dtype_t dtype);         // i8, i32, i64 (not bool)

// Opcode name ("matmul") or nullptr for an opcode this version does not know.
const char* OpcodeName(uint32_t opcode);
// The engine an opcode runs on (its high byte); 0 when unknown.
tern_engine_t OpcodeEngine(uint32_t opcode);
const char* EngineName(tern_engine_t engine);
const char* UnaryFnName(int64_t fn);  // nullptr when unknown
const char* BinaryFnName(int64_t fn);
const char* ReduceFnName(int64_t fn);
const char* ScanFnName(int64_t fn);
const char* RandomFnName(int64_t fn);

// Fills contiguous row-major strides for desc->shape. Returns false when a
// stride does not fit in int64 (it is then INT64_MAX) or a dimension is
// negative; never overflows, whatever the shape (hostile files included).
bool SetContiguousStrides(OperandDesc* desc);

// The bytes [*begin, *end) of its segment that an operand can touch, given its
// offset, shape and strides (negative strides are invalid). Fails on
// overflow, negative sizes or strides, or an unknown dtype.
Status OperandExtent(const OperandDesc& desc, uint64_t* begin, uint64_t* end);

// Checks one instruction against its opcode's rules: operand count and which
// are optional, dtypes, shapes (including broadcasting and matmul/conv
// geometry), and the count and range of ints and floats. Does not check
// segment bounds (the loader does, with the segment sizes). The message says
// what is wrong in terms of the opcode's operands ("matmul: a is [4,8] but b
// is [9,2]: inner dimensions differ").
Status ValidateInstruction(uint32_t opcode, std::span<const OperandDesc> operands,
                           std::span<const int64_t> ints, std::span<const double> floats);

// The required-feature bits (TERN_FEATURE_*) one instruction needs: an
// ELEMENTWISE program, a MATMUL or CONV2D epilogue, a SCAN, a SORT or TOPK. 0 for everything tern
// 1.0 could run. Call on a validated instruction.
uint64_t FeaturesOf(uint32_t opcode, std::span<const OperandDesc> operands,
                    std::span<const int64_t> ints);
// The parameters (floats) a unary function takes when all are given: an
// ELEMENTWISE step or a MATMUL/CONV2D activation gives all, without defaults.
size_t UnaryParameterCount(int64_t fn);
// "elementwise-programs, tensor-epilogues, scan, sort" (unknown bits as "bit 5"),
// "none".
std::string FeatureNames(uint64_t bits);

// "[4, 8] f32" for messages.
std::string DescribeOperand(const OperandDesc& desc);
// "[4, 8]" for messages: `rank` dimensions, strides or index components.
std::string ShapeString(const int64_t* dims, uint32_t rank);

// Semaphore ids of SEM_SIGNAL / SEM_WAIT are below this (per core).
inline constexpr int64_t kMaxSemaphores = 256;

// Operand slots of an opcode: how many there can be, the name of each for
// messages ("a", "bias"), which are optional (may be TERN_SEGMENT_NONE or,
// at the end, left out) and which the instruction writes. Unknown opcodes or
// slots give 0, nullptr and false.
size_t MaxOperands(uint32_t opcode);
const char* OperandName(uint32_t opcode, size_t slot);
bool OperandIsOptional(uint32_t opcode, size_t slot);
bool OperandIsWritten(uint32_t opcode, size_t slot);

// ValidateInstruction's codes: TERN_ERROR_EXECUTABLE_UNSUPPORTED for an
// opcode or function enum value this version does not know (enums grow),
// TERN_ERROR_EXECUTABLE_INVALID for everything else.

}  // namespace tern::isa

#endif  // TERN_COMMON_ISA_RULES_H_
