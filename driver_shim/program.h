// A loaded program as the driver runs it: functions whose engine streams are
// already validated (every rule of docs/executable-format.md, no deadlock, no
// race between streams). Produced by libtern's loader (src/executable/),
// executed by a backend's engines, each engine running its own stream.
#ifndef TERN_DRIVER_SHIM_PROGRAM_H_
#define TERN_DRIVER_SHIM_PROGRAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/isa_rules.h"

namespace tern::driver {

struct Instruction {
  uint32_t opcode = 0;
  tern_engine_t engine = TERN_ENGINE_DMA;
  uint32_t core = 0;
  uint32_t position = 0;  // index in its engine stream, for messages
  std::vector<isa::OperandDesc> operands;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::string debug_op;  // graph op it came from ("" if none)
  // What the backend made for this instruction when the program was loaded
  // (Device::PrepareProgram), read-only from then on; null if nothing. Its
  // type is the backend's, by opcode.
  std::shared_ptr<const void> prepared;
};

struct TensorSignature {
  std::string name;
  tern_dtype_t dtype = TERN_DTYPE_F32;
  uint32_t rank = 0;
  int64_t shape[TERN_MAX_RANK] = {};
  uint64_t size_bytes = 0;
};

// The instructions one engine of one core runs in order, sync instructions
// (TERN_OP_SEM_SIGNAL / _WAIT, ints [semaphore, value]) included.
struct Stream {
  uint32_t core = 0;
  tern_engine_t engine = TERN_ENGINE_DMA;
  std::vector<Instruction> instructions;
};

struct Function {
  std::string name;
  std::vector<TensorSignature> inputs;
  std::vector<TensorSignature> outputs;
  uint64_t scratch_bytes = 0;
  std::vector<Stream> streams;     // at most one per (core, engine)
  uint32_t instruction_count = 0;  // in all streams, sync included
};

struct Program {
  std::string target;
  std::vector<Function> functions;
  uint64_t constants_bytes = 0;
};

}  // namespace tern::driver

#endif  // TERN_DRIVER_SHIM_PROGRAM_H_
