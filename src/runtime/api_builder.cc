// The C API of the executable builder (include/tern/builder.h) over
// tern::exe::Builder. Builders need no runtime: their handles are tracked in
// a process-wide set so that a destroyed or forged handle is reported, not
// dereferenced.
#include <cstdlib>
#include <mutex>
#include <unordered_set>

#include "src/executable/builder.h"
#include "src/runtime/api_checks.h"
#include "src/runtime/runtime_state.h"
#include "tern/builder.h"

namespace tern {
namespace {

std::mutex g_builders_mutex;
std::unordered_set<exe::Builder*>& LiveBuilders() {
  static auto* builders = new std::unordered_set<exe::Builder*>();  // never destroyed
  return *builders;
}

Status NotALiveBuilder() {
  return NotALiveHandle("builder", "builder", "already destroyed",
                        "create one with tern_builder_create()");
}

Status GetBuilder(tern_builder_t handle, exe::Builder** out) {
  auto* builder = reinterpret_cast<exe::Builder*>(handle);
  std::lock_guard<std::mutex> lock(g_builders_mutex);
  if (builder == nullptr || LiveBuilders().count(builder) == 0) return NotALiveBuilder();
  *out = builder;
  return OkStatus();
}

Status CheckDType(uint32_t dtype, const std::string& what) {
  if (dtype >= TERN_DTYPE_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{}: dtype {} is not a tern_dtype_t", what,
                      dtype);
  }
  return OkStatus();
}

Status CheckShape(uint32_t rank, const int64_t* shape, const char* what) {
  if (rank > TERN_MAX_RANK) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{}: rank {} exceeds the maximum of {}", what,
                      rank, TERN_MAX_RANK);
  }
  if (rank > 0 && shape == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{}: shape is NULL but rank is {}", what, rank);
  }
  return OkStatus();
}

Status AddTensor(tern_builder_t handle, bool input, const char* name, tern_dtype_t dtype,
                 uint32_t rank, const int64_t* shape, uint32_t* out_index) {
  if (out_index != nullptr) *out_index = 0;
  exe::Builder* builder;
  TERN_RETURN_IF_ERROR(GetBuilder(handle, &builder));
  if (name == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "name is NULL");
  TERN_RETURN_IF_ERROR(CheckShape(rank, shape, input ? "input" : "output"));
  TERN_RETURN_IF_ERROR(CheckDType(static_cast<uint32_t>(dtype),
                                  fmt::format("{} '{}'", input ? "input" : "output", name)));
  uint32_t index = 0;
  std::span<const int64_t> dims(shape, rank);
  TERN_RETURN_IF_ERROR(input ? builder->AddInput(name, dtype, dims, &index)
                             : builder->AddOutput(name, dtype, dims, &index));
  if (out_index != nullptr) *out_index = index;
  return OkStatus();
}

Status AddInstruction(tern_builder_t handle, const tern_instruction_t* instruction) {
  exe::Builder* builder;
  TERN_RETURN_IF_ERROR(GetBuilder(handle, &builder));
  if (instruction == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "instruction is NULL");
  TERN_RETURN_IF_ERROR(
      CheckStructSize(instruction->struct_size, sizeof(tern_instruction_t), "tern_instruction_t"));
  if (instruction->operand_count > 0 && instruction->operands == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "operands is NULL but operand_count is {}",
                      instruction->operand_count);
  }
  if (instruction->int_count > 0 && instruction->ints == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "ints is NULL but int_count is {}",
                      instruction->int_count);
  }
  if (instruction->float_count > 0 && instruction->floats == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "floats is NULL but float_count is {}",
                      instruction->float_count);
  }
  if (instruction->operand_count > 64) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "operand_count is {}; no opcode takes more than a few operands",
                      instruction->operand_count);
  }
  exe::Builder::Operand operands[64];
  for (uint32_t k = 0; k < instruction->operand_count; ++k) {
    const tern_operand_t& given = instruction->operands[k];
    exe::Builder::Operand& operand = operands[k];
    const uint32_t segment = static_cast<uint32_t>(given.segment);
    if (segment == TERN_SEGMENT_NONE) continue;  // desc.segment is NONE by default
    if (segment > TERN_SEGMENT_SCRATCH) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "operand {}: segment {} is not a tern_segment_t", k, segment);
    }
    TERN_RETURN_IF_ERROR(CheckShape(given.rank, given.shape, fmt::format("operand {}", k).c_str()));
    TERN_RETURN_IF_ERROR(
        CheckDType(static_cast<uint32_t>(given.dtype), fmt::format("operand {}", k)));
    operand.desc.segment = static_cast<tern_segment_t>(segment);
    operand.desc.index = given.index;
    operand.desc.offset = given.offset;
    operand.desc.dtype = given.dtype;
    operand.desc.rank = given.rank;
    for (uint32_t i = 0; i < given.rank; ++i) operand.desc.shape[i] = given.shape[i];
    if (given.strides != nullptr) {
      operand.explicit_strides = true;
      for (uint32_t i = 0; i < given.rank; ++i) operand.desc.strides[i] = given.strides[i];
    }
  }
  exe::Builder::InstructionSpec spec;
  spec.opcode = static_cast<uint32_t>(instruction->opcode);
  spec.core = instruction->core;
  spec.operands = std::span<const exe::Builder::Operand>(operands, instruction->operand_count);
  spec.ints = std::span<const int64_t>(instruction->ints, instruction->int_count);
  spec.floats = std::span<const double>(instruction->floats, instruction->float_count);
  if (instruction->debug_op != nullptr) spec.debug_op = instruction->debug_op;
  return builder->AddInstruction(spec);
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_builder_create(const char* target, tern_builder_t* out_builder) {
  TERN_API_CLEAR_OUT(out_builder, nullptr);
  if (target != nullptr && *target == '\0') {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "target is empty: name a device kind (\"trn2\"), or pass NULL"));
  }
  auto* builder = new (std::nothrow) exe::Builder(target == nullptr ? "" : target);
  if (builder == nullptr) {
    return Report(MakeStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, "cannot allocate a builder"));
  }
  {
    std::lock_guard<std::mutex> lock(g_builders_mutex);
    LiveBuilders().insert(builder);
  }
  *out_builder = reinterpret_cast<tern_builder_t>(builder);
  return TERN_OK;
}

TERN_API tern_status_t tern_builder_destroy(tern_builder_t builder) {
  auto* object = reinterpret_cast<exe::Builder*>(builder);
  {
    std::lock_guard<std::mutex> lock(g_builders_mutex);
    if (object == nullptr || LiveBuilders().erase(object) == 0) return Report(NotALiveBuilder());
  }
  delete object;
  return TERN_OK;
}

TERN_API tern_status_t tern_builder_add_constants(tern_builder_t builder, const void* data,
                                                  uint64_t size, uint64_t alignment,
                                                  uint64_t* out_offset) {
  if (out_offset != nullptr) *out_offset = 0;
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  TERN_API_CHECK_NOT_NULL(out_offset);
  if (data == nullptr && size > 0) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "data is NULL but size is {}", size));
  }
  return Report(object->AddConstants(
      std::span<const uint8_t>(static_cast<const uint8_t*>(data), size), alignment, out_offset));
}

TERN_API tern_status_t tern_builder_begin_function(tern_builder_t builder, const char* name,
                                                   uint32_t* out_function) {
  if (out_function != nullptr) *out_function = 0;
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  TERN_API_CHECK_NOT_NULL(name);
  uint32_t index = 0;
  TERN_API_TRY(object->BeginFunction(name, &index));
  if (out_function != nullptr) *out_function = index;
  return TERN_OK;
}

TERN_API tern_status_t tern_builder_add_input(tern_builder_t builder, const char* name,
                                              tern_dtype_t dtype, uint32_t rank,
                                              const int64_t* shape, uint32_t* out_index) {
  return Report(AddTensor(builder, true, name, dtype, rank, shape, out_index));
}

TERN_API tern_status_t tern_builder_add_output(tern_builder_t builder, const char* name,
                                               tern_dtype_t dtype, uint32_t rank,
                                               const int64_t* shape, uint32_t* out_index) {
  return Report(AddTensor(builder, false, name, dtype, rank, shape, out_index));
}

TERN_API tern_status_t tern_builder_set_scratch(tern_builder_t builder, uint64_t bytes) {
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  return Report(object->SetScratch(bytes));
}

TERN_API tern_status_t tern_builder_add_instruction(tern_builder_t builder,
                                                    const tern_instruction_t* instruction) {
  return Report(AddInstruction(builder, instruction));
}

TERN_API tern_status_t tern_builder_set_flags(tern_builder_t builder, uint32_t flags) {
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  TERN_API_TRY(CheckFlags(flags, TERN_BUILDER_ALLOW_RACES, "tern_builder_set_flags",
                          "TERN_BUILDER_ALLOW_RACES (0x1)"));
  object->set_allow_races((flags & TERN_BUILDER_ALLOW_RACES) != 0);
  return Report(OkStatus());
}

TERN_API tern_status_t tern_builder_end_function(tern_builder_t builder) {
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  return Report(object->EndFunction());
}

TERN_API tern_status_t tern_builder_finish(tern_builder_t builder, void** out_data,
                                           uint64_t* out_size) {
  if (out_data != nullptr) *out_data = nullptr;
  if (out_size != nullptr) *out_size = 0;
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  TERN_API_CHECK_NOT_NULL(out_data);
  TERN_API_CHECK_NOT_NULL(out_size);
  return Report(object->FinishInto([](size_t n) { return std::malloc(n); }, out_data, out_size));
}

TERN_API tern_status_t tern_builder_write_file(tern_builder_t builder, const char* path) {
  exe::Builder* object;
  TERN_API_TRY(GetBuilder(builder, &object));
  TERN_API_CHECK_NOT_NULL(path);
  return Report(object->WriteFile(path));
}

TERN_API void tern_builder_free_data(void* data) { std::free(data); }

}  // extern "C"
