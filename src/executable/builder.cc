#include "src/executable/builder.h"

#include <fcntl.h>
#include <flatbuffers/flatbuffers.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "src/executable/checks.h"
#include "src/executable/format.h"
#include "src/executable/hazards.h"
#include "src/executable/schedule.h"
#include "src/executable/tern_executable_generated.h"

namespace tern::exe {
namespace {

constexpr tern_status_t kBad = TERN_ERROR_INVALID_ARGUMENT;

// Writes all of `bytes` to `fd`, retrying short writes.
Status WriteAll(int fd, const uint8_t* bytes, uint64_t size, const std::string& path) {
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1ull << 30));
    const ssize_t written = ::write(fd, bytes, chunk);
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("writing '{}'", path));
    }
    bytes += written;
    size -= static_cast<uint64_t>(written);
  }
  return OkStatus();
}

void CopyPlan(const ContainerPlan& plan, uint8_t* dst) {
  std::memcpy(dst, plan.head.data(), plan.head.size());
  uint64_t cursor = plan.head.size();
  for (const auto& piece : plan.pieces) {
    std::memset(dst + cursor, 0, piece.offset - cursor);
    if (!piece.bytes.empty())
      std::memcpy(dst + piece.offset, piece.bytes.data(), piece.bytes.size());
    cursor = piece.offset + piece.bytes.size();
  }
}

}  // namespace

Builder::Builder(std::string_view target) : target_(target.empty() ? kTarget : target) {}

Status Builder::RequireOpenFunction(const char* call) const {
  if (!function_open_) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "{} needs a function: call tern_builder_begin_function() first", call);
  }
  return OkStatus();
}

Status Builder::AddConstants(std::span<const uint8_t> data, uint64_t alignment,
                             uint64_t* out_offset) {
  if (alignment != 0 && ((alignment & (alignment - 1)) != 0 || alignment > kMaxConstantAlignment)) {
    return MakeStatus(kBad, "constants alignment {} is not a power of two from 64 to {}", alignment,
                      kMaxConstantAlignment);
  }
  alignment = std::max<uint64_t>(alignment, 64);
  const uint64_t offset = (constants_.size() + alignment - 1) & ~(alignment - 1);
  if (offset + data.size() < offset || offset + data.size() > (uint64_t{1} << 46)) {
    return MakeStatus(kBad, "{} more bytes of constants would exceed the limit of 64 TiB",
                      data.size());
  }
  try {
    constants_.resize(offset);  // zero padding
    constants_.insert(constants_.end(), data.begin(), data.end());
  } catch (const std::bad_alloc&) {
    return MakeStatus(TERN_ERROR_HOST_OUT_OF_MEMORY,
                      "cannot hold {} bytes of constants in host memory", offset + data.size());
  }
  *out_offset = offset;
  return OkStatus();
}

Status Builder::BeginFunction(std::string_view name, uint32_t* out_function) {
  if (function_open_) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "function '{}' is still open: call tern_builder_end_function() before "
                      "starting '{}'",
                      functions_.back().name, name);
  }
  if (name.empty() || name.find('\0') != std::string_view::npos) {
    return MakeStatus(kBad, "a function needs a non-empty name");
  }
  for (const auto& function : functions_) {
    if (function.name == name) {
      return MakeStatus(kBad, "a function named '{}' already exists; names must be unique", name);
    }
  }
  functions_.emplace_back();
  functions_.back().name.assign(name);
  function_open_ = true;
  *out_function = static_cast<uint32_t>(functions_.size() - 1);
  return OkStatus();
}

Status Builder::AddTensor(bool input, std::string_view name, tern_dtype_t dtype,
                          std::span<const int64_t> shape, uint32_t* out_index) {
  TERN_RETURN_IF_ERROR(
      RequireOpenFunction(input ? "tern_builder_add_input" : "tern_builder_add_output"));
  StoredFunction& function = functions_.back();
  const char* what = input ? "input" : "output";
  if (name.empty() || name.find('\0') != std::string_view::npos) {
    return MakeStatus(kBad, "{} {} of function '{}' needs a non-empty name", what,
                      input ? function.inputs.size() : function.outputs.size(), function.name);
  }
  for (const auto* list : {&function.inputs, &function.outputs}) {
    for (const auto& tensor : *list) {
      if (tensor.name == name) {
        return MakeStatus(kBad,
                          "function '{}' already has an input or output named '{}'; names must "
                          "be unique within a function",
                          function.name, name);
      }
    }
  }
  driver::TensorSignature tensor;
  tensor.name.assign(name);
  tensor.dtype = dtype;
  tensor.rank = static_cast<uint32_t>(shape.size());
  Status size = TensorBytes(kBad, dtype, shape, &tensor.size_bytes);
  if (!size.ok())
    return size.WithContext(fmt::format("{} '{}' of function '{}'", what, name, function.name));
  for (size_t i = 0; i < shape.size(); ++i) tensor.shape[i] = shape[i];
  auto& list = input ? function.inputs : function.outputs;
  list.push_back(std::move(tensor));
  *out_index = static_cast<uint32_t>(list.size() - 1);
  return OkStatus();
}

Status Builder::AddInput(std::string_view name, tern_dtype_t dtype, std::span<const int64_t> shape,
                         uint32_t* out_index) {
  return AddTensor(true, name, dtype, shape, out_index);
}

Status Builder::AddOutput(std::string_view name, tern_dtype_t dtype, std::span<const int64_t> shape,
                          uint32_t* out_index) {
  return AddTensor(false, name, dtype, shape, out_index);
}

Status Builder::SetScratch(uint64_t bytes) {
  TERN_RETURN_IF_ERROR(RequireOpenFunction("tern_builder_set_scratch"));
  functions_.back().scratch_bytes = bytes;
  return OkStatus();
}

Status Builder::AddInstruction(const InstructionSpec& spec) {
  TERN_RETURN_IF_ERROR(RequireOpenFunction("tern_builder_add_instruction"));
  StoredFunction& function = functions_.back();
  const char* opcode_name = isa::OpcodeName(spec.opcode);
  auto where = [&] {
    return fmt::format("instruction {} ({}) of function '{}'", function.instruction_count,
                       opcode_name ? opcode_name : "?", function.name);
  };
  if (opcode_name == nullptr || spec.opcode > UINT16_MAX) {
    return MakeStatus(kBad, "{}: opcode {:#06x} is not a tern_opcode_t this version knows", where(),
                      spec.opcode);
  }
  if (spec.core >= kMaxCores) {
    return MakeStatus(kBad, "{}: core {} is out of range: cores are numbered below {}", where(),
                      spec.core, kMaxCores);
  }
  tern_engine_t engine = isa::OpcodeEngine(spec.opcode);
  std::span<const int64_t> ints = spec.ints;
  if (engine == TERN_ENGINE_SYNC) {
    Status sync = SplitSyncEngine(kBad, spec.opcode, ints, &engine);
    if (!sync.ok()) return sync.WithContext(where());
    ints = ints.first(2);  // the stream says the engine in the file
  }

  // Operands, with strides filled in.
  isa::OperandDesc local[8];
  std::vector<isa::OperandDesc> heap;
  isa::OperandDesc* descs = local;
  if (spec.operands.size() > 8) {
    heap.resize(spec.operands.size());
    descs = heap.data();
  }
  for (size_t k = 0; k < spec.operands.size(); ++k) {
    const Operand& operand = spec.operands[k];
    isa::OperandDesc& desc = descs[k];
    desc = operand.desc;
    if (!desc.present()) continue;
    if (desc.segment > TERN_SEGMENT_SCRATCH) {
      return MakeStatus(kBad, "{}, operand {}: segment {} is not a tern_segment_t", where(), k,
                        static_cast<int>(desc.segment));
    }
    if (isa::DTypeSize(desc.dtype) == 0) {
      return MakeStatus(kBad, "{}, operand {}: dtype {} is not a tern_dtype_t", where(), k,
                        static_cast<int>(desc.dtype));
    }
    if (desc.rank > TERN_MAX_RANK) {
      return MakeStatus(kBad, "{}, operand {}: rank {} exceeds the maximum of {}", where(), k,
                        desc.rank, TERN_MAX_RANK);
    }
    if (!operand.explicit_strides) {
      Status contiguous = ContiguousStrides(kBad, &desc);
      if (!contiguous.ok())
        return contiguous.WithContext(fmt::format("{}, operand {}", where(), k));
    }
  }
  const std::span<const isa::OperandDesc> desc_span(descs, spec.operands.size());
  Status valid = isa::ValidateInstruction(spec.opcode, desc_span, ints, spec.floats);
  if (!valid.ok()) return Status(kBad, fmt::format("{}: {}", where(), valid.message()));
  const uint64_t features = isa::FeaturesOf(spec.opcode, desc_span, ints);

  SegmentSizes sizes;
  sizes.inputs = function.inputs;
  sizes.outputs = function.outputs;
  sizes.constants = constants_.size();
  sizes.check_scratch = false;
  uint64_t scratch_used = function.scratch_used;
  for (size_t k = 0; k < desc_span.size(); ++k) {
    if (!descs[k].present()) continue;
    uint64_t end = 0;
    Status placed =
        CheckOperandPlacement(kBad, descs[k], isa::OperandIsWritten(spec.opcode, k), sizes, &end);
    if (!placed.ok()) {
      std::string hint;
      if (descs[k].segment == TERN_SEGMENT_CONSTANT) {
        hint = " (add constants before the instructions that use them)";
      } else if (descs[k].segment != TERN_SEGMENT_SCRATCH) {
        hint = " (declare inputs and outputs before the instructions that use them)";
      }
      return Status(kBad,
                    fmt::format("{}, {}: {}{}", where(), DescribeOperandSlot(k, descs[k], sizes),
                                placed.message(), hint));
    }
    if (descs[k].segment == TERN_SEGMENT_SCRATCH) scratch_used = std::max(scratch_used, end);
  }

  int32_t debug_op = -1;
  if (!spec.debug_op.empty()) {
    auto [it, inserted] = debug_op_index_.try_emplace(std::string(spec.debug_op),
                                                      static_cast<int32_t>(debug_ops_.size()));
    if (inserted) debug_ops_.push_back(it->first);
    debug_op = it->second;
  }

  StoredInstruction stored;
  stored.opcode = static_cast<uint16_t>(spec.opcode);
  stored.operand_begin = static_cast<uint32_t>(operands_.size());
  stored.operand_count = static_cast<uint32_t>(spec.operands.size());
  stored.int_begin = static_cast<uint32_t>(ints_.size());
  stored.int_count = static_cast<uint32_t>(ints.size());
  stored.float_begin = static_cast<uint32_t>(floats_.size());
  stored.float_count = static_cast<uint32_t>(spec.floats.size());
  stored.debug_op = debug_op;
  for (size_t k = 0; k < spec.operands.size(); ++k) {
    operands_.push_back({descs[k], spec.operands[k].explicit_strides});
  }
  ints_.insert(ints_.end(), ints.begin(), ints.end());
  floats_.insert(floats_.end(), spec.floats.begin(), spec.floats.end());

  StoredStream* stream = nullptr;
  for (auto& candidate : function.streams) {
    if (candidate.core == spec.core && candidate.engine == engine) {
      stream = &candidate;
      break;
    }
  }
  if (stream == nullptr) {
    function.streams.push_back({spec.core, engine, {}});
    stream = &function.streams.back();
  }
  stream->instructions.push_back(static_cast<uint32_t>(instructions_.size()));
  instructions_.push_back(stored);
  function.scratch_used = scratch_used;
  ++function.instruction_count;
  required_features_ |= features;
  return OkStatus();
}

// The loader's race check, early: the instructions as the loader would
// convert them, in the steps' order.
Status Builder::CheckRaces(const StoredFunction& function, const ScheduleInput& input,
                           std::span<const ScheduledStep> order) const {
  std::vector<driver::Instruction> converted;
  converted.reserve(input.steps.size());
  for (const StoredStream& stream : function.streams) {
    for (size_t position = 0; position < stream.instructions.size(); ++position) {
      const StoredInstruction& stored = instructions_[stream.instructions[position]];
      driver::Instruction& instruction = converted.emplace_back();
      instruction.opcode = stored.opcode;
      instruction.engine = stream.engine;
      instruction.core = stream.core;
      instruction.position = static_cast<uint32_t>(position);
      for (uint32_t k = 0; k < stored.operand_count; ++k) {
        instruction.operands.push_back(operands_[stored.operand_begin + k].desc);
      }
      if (stored.debug_op >= 0) instruction.debug_op = debug_ops_[stored.debug_op];
    }
  }
  constexpr size_t kNamed = 4;
  std::vector<Race> races;
  const size_t count = FindRaces(input, converted, order, kNamed, &races);
  if (count == 0) return OkStatus();
  return MakeStatus(kBad,
                    "function '{}': its engine streams race: {}. {} (or call "
                    "tern_builder_set_flags() with TERN_BUILDER_ALLOW_RACES to build it anyway, "
                    "for an experiment or a test of the loader)",
                    function.name, DescribeRaces(races, count, converted), kRaceAdvice);
}

Status Builder::EndFunction() {
  TERN_RETURN_IF_ERROR(RequireOpenFunction("tern_builder_end_function"));
  const StoredFunction& function = functions_.back();
  if (function.scratch_used > function.scratch_bytes) {
    return MakeStatus(kBad,
                      "function '{}': its instructions use {} bytes of scratch but it has {}; "
                      "call tern_builder_set_scratch() with at least {}",
                      function.name, function.scratch_used, function.scratch_bytes,
                      function.scratch_used);
  }
  ScheduleInput input;
  for (const auto& stream : function.streams) {
    ScheduleInput::Stream scheduled;
    scheduled.core = stream.core;
    scheduled.engine = stream.engine;
    scheduled.begin = static_cast<uint32_t>(input.steps.size());
    for (uint32_t index : stream.instructions) {
      const StoredInstruction& instruction = instructions_[index];
      SyncStep step;
      if (instruction.opcode == TERN_OP_SEM_SIGNAL || instruction.opcode == TERN_OP_SEM_WAIT) {
        step.kind = instruction.opcode == TERN_OP_SEM_WAIT ? SyncStep::kWait : SyncStep::kSignal;
        step.semaphore = ints_[instruction.int_begin];
        step.value = ints_[instruction.int_begin + 1];
      }
      input.steps.push_back(step);
    }
    scheduled.end = static_cast<uint32_t>(input.steps.size());
    input.streams.push_back(scheduled);
  }
  std::vector<ScheduledStep> order;
  Status scheduled = ScheduleStreams(input, &order);
  if (!scheduled.ok()) {
    return Status(kBad, fmt::format("function '{}': {}", function.name, scheduled.message()));
  }
  if (!allow_races_) TERN_RETURN_IF_ERROR(CheckRaces(function, input, order));
  function_open_ = false;
  return OkStatus();
}

Status Builder::Serialize(std::vector<uint8_t>* module_bytes,
                          std::vector<uint8_t>* debug_bytes) const {
  flatbuffers::FlatBufferBuilder fbb(1024 + instructions_.size() * 96);
  std::vector<flatbuffers::Offset<format::Function>> functions;
  std::vector<flatbuffers::Offset<format::Tensor>> tensors;
  std::vector<flatbuffers::Offset<format::Stream>> streams;
  std::vector<flatbuffers::Offset<format::Instruction>> instructions;
  std::vector<flatbuffers::Offset<format::Operand>> operands;
  auto make_tensors = [&](const std::vector<driver::TensorSignature>& list) {
    tensors.clear();
    for (const auto& tensor : list) {
      auto name = fbb.CreateString(tensor.name);
      auto shape = fbb.CreateVector(tensor.shape, tensor.rank);
      tensors.push_back(format::CreateTensor(fbb, name, static_cast<uint8_t>(tensor.dtype), shape,
                                             tensor.size_bytes));
    }
    return fbb.CreateVector(tensors);
  };
  for (const StoredFunction& function : functions_) {
    streams.clear();
    for (const StoredStream& stream : function.streams) {
      instructions.clear();
      for (uint32_t index : stream.instructions) {
        const StoredInstruction& instruction = instructions_[index];
        operands.clear();
        for (uint32_t k = 0; k < instruction.operand_count; ++k) {
          const Operand& operand = operands_[instruction.operand_begin + k];
          const isa::OperandDesc& desc = operand.desc;
          if (!desc.present()) {
            operands.push_back(format::CreateOperand(fbb));
            continue;
          }
          auto shape = fbb.CreateVector(desc.shape.data(), desc.rank);
          flatbuffers::Offset<flatbuffers::Vector<int64_t>> strides;
          if (operand.explicit_strides) strides = fbb.CreateVector(desc.strides.data(), desc.rank);
          operands.push_back(
              format::CreateOperand(fbb, static_cast<uint8_t>(desc.segment), desc.index,
                                    desc.offset, static_cast<uint8_t>(desc.dtype), shape, strides));
        }
        auto operand_vector = fbb.CreateVector(operands);
        flatbuffers::Offset<flatbuffers::Vector<int64_t>> ints;
        flatbuffers::Offset<flatbuffers::Vector<double>> floats;
        if (instruction.int_count > 0) {
          ints = fbb.CreateVector(ints_.data() + instruction.int_begin, instruction.int_count);
        }
        if (instruction.float_count > 0) {
          floats =
              fbb.CreateVector(floats_.data() + instruction.float_begin, instruction.float_count);
        }
        instructions.push_back(format::CreateInstruction(fbb, instruction.opcode, operand_vector,
                                                         ints, floats, instruction.debug_op));
      }
      auto instruction_vector = fbb.CreateVector(instructions);
      streams.push_back(format::CreateStream(fbb, stream.core, static_cast<uint8_t>(stream.engine),
                                             instruction_vector));
    }
    auto name = fbb.CreateString(function.name);
    auto inputs = make_tensors(function.inputs);
    auto outputs = make_tensors(function.outputs);
    auto stream_vector = fbb.CreateVector(streams);
    functions.push_back(
        format::CreateFunction(fbb, name, inputs, outputs, function.scratch_bytes, stream_vector));
  }
  auto target = fbb.CreateString(target_);
  auto producer = fbb.CreateString(producer_);
  auto function_vector = fbb.CreateVector(functions);
  fbb.Finish(format::CreateModule(fbb, target, producer, constants_.size(), function_vector));
  if (fbb.GetSize() >= FLATBUFFERS_MAX_BUFFER_SIZE) {
    return MakeStatus(kBad, "the program is too large for one executable (over 2 GiB of metadata)");
  }
  module_bytes->assign(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());

  debug_bytes->clear();
  if (!debug_ops_.empty()) {
    flatbuffers::FlatBufferBuilder debug(256);
    auto names = debug.CreateVectorOfStrings(debug_ops_);
    debug.Finish(format::CreateDebugInfo(debug, names));
    debug_bytes->assign(debug.GetBufferPointer(), debug.GetBufferPointer() + debug.GetSize());
  }
  return OkStatus();
}

struct Builder::Serialized {
  std::vector<uint8_t> module;
  std::vector<uint8_t> debug;
  ContainerPlan plan;  // refers to the vectors above and to constants_
};

Status Builder::Plan(Serialized* out) const {
  if (function_open_) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "function '{}' is still open: call tern_builder_end_function() first",
                      functions_.back().name);
  }
  TERN_RETURN_IF_ERROR(Serialize(&out->module, &out->debug));
  SectionSource sources[3];
  size_t count = 0;
  sources[count++] = {kSectionModule, 0, out->module};
  if (!out->debug.empty()) sources[count++] = {kSectionDebug, kSectionFlagOptional, out->debug};
  if (!constants_.empty()) sources[count++] = {kSectionConstants, 0, constants_};
  out->plan = PlanContainer(std::span<const SectionSource>(sources, count), required_features_);
  return OkStatus();
}

Status Builder::Finish(std::vector<uint8_t>* out) const {
  Serialized serialized;
  TERN_RETURN_IF_ERROR(Plan(&serialized));
  out->resize(serialized.plan.file_size);
  CopyPlan(serialized.plan, out->data());
  return OkStatus();
}

Status Builder::FinishInto(void* (*allocate)(size_t), void** out_data, uint64_t* out_size) const {
  Serialized serialized;
  TERN_RETURN_IF_ERROR(Plan(&serialized));
  void* data = allocate(serialized.plan.file_size);
  if (data == nullptr) {
    return MakeStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, "cannot allocate {} bytes for the executable",
                      serialized.plan.file_size);
  }
  CopyPlan(serialized.plan, static_cast<uint8_t*>(data));
  *out_data = data;
  *out_size = serialized.plan.file_size;
  return OkStatus();
}

Status Builder::WriteFile(const std::string& path) const {
  if (path.empty()) return MakeStatus(kBad, "the path is empty");
  Serialized serialized;
  TERN_RETURN_IF_ERROR(Plan(&serialized));
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0) {
    return ErrnoStatus(TERN_ERROR_IO, errno,
                       fmt::format("creating a temporary file next to '{}' (check that the "
                                   "directory exists and is writable)",
                                   path));
  }
  static const uint8_t kZeros[4096] = {};
  Status status = WriteAll(fd, serialized.plan.head.data(), serialized.plan.head.size(), temp);
  uint64_t cursor = serialized.plan.head.size();
  for (const auto& piece : serialized.plan.pieces) {
    if (!status.ok()) break;
    status = WriteAll(fd, kZeros, piece.offset - cursor, temp);
    if (status.ok()) status = WriteAll(fd, piece.bytes.data(), piece.bytes.size(), temp);
    cursor = piece.offset + piece.bytes.size();
  }
  if (status.ok() && ::fchmod(fd, 0644) != 0) {
    status = ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("setting the mode of '{}'", temp));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("closing '{}'", temp));
  }
  if (status.ok() && std::rename(temp.c_str(), path.c_str()) != 0) {
    status = ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("renaming '{}' to '{}'", temp, path));
  }
  if (!status.ok()) ::unlink(temp.c_str());
  return status;
}

}  // namespace tern::exe
