// A loaded program as the driver runs it: functions whose instructions are
// already validated and put in one schedule (an order of the per-engine
// streams that honours every semaphore wait). Produced by libtern's loader
// (src/executable/), executed by a backend's engines.
#ifndef TERN_DRIVER_SHIM_PROGRAM_H_
#define TERN_DRIVER_SHIM_PROGRAM_H_

#include <cstdint>
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
};

struct TensorSignature {
  std::string name;
  tern_dtype_t dtype = TERN_DTYPE_F32;
  uint32_t rank = 0;
  int64_t shape[TERN_MAX_RANK] = {};
  uint64_t size_bytes = 0;
};

struct Function {
  std::string name;
  std::vector<TensorSignature> inputs;
  std::vector<TensorSignature> outputs;
  uint64_t scratch_bytes = 0;
  std::vector<Instruction> schedule;  // sync instructions removed: the order honours them
  uint32_t instruction_count = 0;     // in the file, sync included
};

struct Program {
  std::string target;
  std::vector<Function> functions;
  uint64_t constants_bytes = 0;
};

}  // namespace tern::driver

#endif  // TERN_DRIVER_SHIM_PROGRAM_H_
