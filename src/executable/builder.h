// The executable builder: accumulates constants, functions and instructions,
// checks each as it is added (the rules the loader applies, as far as they
// are known at that point), and serializes the container
// (docs/executable-format.md). Used by the C API (src/runtime/
// api_builder.cc) and by the compiler.
// Thread-safety: one thread at a time per builder.
#ifndef TERN_SRC_EXECUTABLE_BUILDER_H_
#define TERN_SRC_EXECUTABLE_BUILDER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/isa_rules.h"
#include "common/status_with_message.h"
#include "driver_shim/program.h"
#include "src/executable/schedule.h"

namespace tern::exe {

class Builder {
 public:
  // An operand as given by the caller: `desc.strides` is used only when
  // `explicit_strides` (otherwise contiguous strides are filled in). The
  // builder stores it the same way, strides filled in.
  struct Operand {
    isa::OperandDesc desc;
    bool explicit_strides = false;
  };
  struct InstructionSpec {
    uint32_t opcode = 0;
    uint32_t core = 0;
    std::span<const Operand> operands;
    std::span<const int64_t> ints;
    std::span<const double> floats;
    std::string_view debug_op;  // empty: none
  };

  // `target` empty means "trn2".
  explicit Builder(std::string_view target = {});

  void set_producer(std::string_view producer) { producer_.assign(producer); }

  Status AddConstants(std::span<const uint8_t> data, uint64_t alignment, uint64_t* out_offset);
  Status BeginFunction(std::string_view name, uint32_t* out_function);
  Status AddInput(std::string_view name, tern_dtype_t dtype, std::span<const int64_t> shape,
                  uint32_t* out_index);
  Status AddOutput(std::string_view name, tern_dtype_t dtype, std::span<const int64_t> shape,
                   uint32_t* out_index);
  Status SetScratch(uint64_t bytes);
  Status AddInstruction(const InstructionSpec& spec);
  // Ends the function after the semaphore simulation (no deadlock) and the
  // race check (hazards.h), unless set_allow_races(true).
  Status EndFunction();
  void set_allow_races(bool allow) { allow_races_ = allow; }

  // Serializes the executable into `*out` (resized). The builder stays usable.
  Status Finish(std::vector<uint8_t>* out) const;
  // Serializes into memory from `allocate(size)` (nullptr: out of memory).
  Status FinishInto(void* (*allocate)(size_t), void** out_data, uint64_t* out_size) const;
  // Serializes into `path`, replaced atomically (a temporary file renamed).
  Status WriteFile(const std::string& path) const;

  uint64_t constants_bytes() const { return constants_.size(); }

 private:
  struct StoredInstruction {
    uint16_t opcode = 0;
    uint32_t operand_begin = 0;  // into operands_
    uint32_t operand_count = 0;
    uint32_t int_begin = 0;  // into ints_
    uint32_t int_count = 0;
    uint32_t float_begin = 0;  // into floats_
    uint32_t float_count = 0;
    int32_t debug_op = -1;
  };
  struct StoredStream {
    uint32_t core = 0;
    tern_engine_t engine = TERN_ENGINE_DMA;
    std::vector<uint32_t> instructions;  // into instructions_
  };
  struct StoredFunction {
    std::string name;
    std::vector<driver::TensorSignature> inputs;
    std::vector<driver::TensorSignature> outputs;
    uint64_t scratch_bytes = 0;
    uint64_t scratch_used = 0;  // largest end of a scratch operand
    std::vector<StoredStream> streams;
    uint32_t instruction_count = 0;
  };

  Status AddTensor(bool input, std::string_view name, tern_dtype_t dtype,
                   std::span<const int64_t> shape, uint32_t* out_index);
  Status RequireOpenFunction(const char* call) const;
  Status CheckRaces(const StoredFunction& function, const ScheduleInput& input,
                    std::span<const ScheduledStep> order) const;
  Status Serialize(std::vector<uint8_t>* module, std::vector<uint8_t>* debug) const;
  struct Serialized;  // the sections and their layout (builder.cc)
  Status Plan(Serialized* out) const;

  std::string target_;
  std::string producer_ = "tern builder";
  std::vector<uint8_t> constants_;
  uint64_t required_features_ = 0;  // TERN_FEATURE_* of the instructions added
  std::vector<StoredFunction> functions_;
  bool function_open_ = false;
  bool allow_races_ = false;
  std::vector<StoredInstruction> instructions_;
  std::vector<Operand> operands_;  // strides filled in
  std::vector<int64_t> ints_;
  std::vector<double> floats_;
  std::vector<std::string> debug_ops_;
  std::unordered_map<std::string, int32_t> debug_op_index_;
};

}  // namespace tern::exe

#endif  // TERN_SRC_EXECUTABLE_BUILDER_H_
