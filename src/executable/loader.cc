#include "src/executable/loader.h"

#include <flatbuffers/flatbuffers.h>

#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/logging.h"
#include "src/executable/checks.h"
#include "src/executable/fb_util.h"
#include "src/executable/format.h"
#include "src/executable/hazards.h"
#include "src/executable/schedule.h"
#include "src/executable/tern_executable_generated.h"

namespace tern::exe {
namespace {

constexpr tern_status_t kInvalid = TERN_ERROR_EXECUTABLE_INVALID;
constexpr tern_status_t kUnsupported = TERN_ERROR_EXECUTABLE_UNSUPPORTED;
constexpr const char* kRebuild = "the executable is malformed; rebuild it with the tern builder";

// A FlatBuffer section viewed at an 8-aligned address (copied when the data
// given to the loader is not aligned, which only happens for memory loads).
std::span<const uint8_t> AlignedView(std::span<const uint8_t> bytes, std::vector<uint64_t>* copy) {
  if (reinterpret_cast<uintptr_t>(bytes.data()) % kFlatBufferAlignment == 0) return bytes;
  copy->resize((bytes.size() + 7) / 8);
  std::memcpy(copy->data(), bytes.data(), bytes.size());
  return {reinterpret_cast<const uint8_t*>(copy->data()), bytes.size()};
}

template <typename Root>
Status VerifyFlatBuffer(std::span<const uint8_t> bytes, const char* section, const Root** out) {
  if (bytes.size() < 8 || bytes.size() >= FLATBUFFERS_MAX_BUFFER_SIZE) {
    return MakeStatus(kInvalid,
                      "the {} section is {} bytes, which cannot hold a valid FlatBuffer (8 bytes "
                      "to 2 GiB); {}",
                      section, bytes.size(), kRebuild);
  }
  flatbuffers::Verifier::Options options;
  options.max_depth = 32;
  // Every table takes at least 4 bytes, so a well-formed buffer has fewer
  // tables than this; the bound keeps verification linear in the size even
  // when a hostile buffer references one table many times.
  options.max_tables = static_cast<flatbuffers::uoffset_t>(bytes.size() / 4 + 16);
  options.check_alignment = true;
  flatbuffers::Verifier verifier(bytes.data(), bytes.size(), options);
  if (!verifier.VerifyBuffer<Root>(nullptr)) {
    return MakeStatus(kInvalid,
                      "the {} section fails FlatBuffers verification (an offset, vector or "
                      "string points outside it, data is misaligned, or it nests or repeats "
                      "tables beyond the limits); {}",
                      section, kRebuild);
  }
  *out = flatbuffers::GetRoot<Root>(bytes.data());
  return OkStatus();
}

// Bounds the work of converting the module: each element visited (a table
// in a vector, an integer) takes at least 4 bytes of a well-formed buffer, so
// visiting more than size/4 of them means tables are aliased to blow up the
// loader's time and memory.
class WorkBudget {
 public:
  explicit WorkBudget(uint64_t module_bytes) : left_(module_bytes / 4 + 1024) {}
  Status Spend(uint64_t elements) {
    if (elements > left_) {
      return MakeStatus(kInvalid,
                        "the module section refers to the same data many times over (more "
                        "elements than its size can hold), as only a hostile file does; {}",
                        kRebuild);
    }
    left_ -= elements;
    return OkStatus();
  }

 private:
  uint64_t left_;
};

// Holds each segment size of the file (constants, a function's scratch, an
// input or output) to what a device can hold, so that an executable no
// execution could ever run is refused at load rather than when it runs.
class SegmentLimit {
 public:
  explicit SegmentLimit(uint64_t device_memory_bytes) : device_memory_(device_memory_bytes) {}

  // `field` names the field for the message: "function 'f' (0): scratch_bytes".
  // `advice` says how to make the segment smaller.
  Status Check(std::string_view field, uint64_t bytes, std::string_view advice) const {
    if (bytes > kMaxSegmentBytes) {
      return MakeStatus(kInvalid,
                        "{} is {} bytes ({:.4g} GiB), more than any device can address ({} bytes "
                        "= 256 TiB, 48-bit device addresses); {}",
                        field, bytes, Gib(bytes), kMaxSegmentBytes, kRebuild);
    }
    if (device_memory_ != 0 && bytes > device_memory_) {
      return MakeStatus(kUnsupported,
                        "{} is {} bytes ({:.4g} GiB), more than the {} bytes ({:.4g} GiB) of "
                        "memory of the device it is loaded on, so it could never run there; {}, "
                        "or load it on a device with more memory",
                        field, bytes, Gib(bytes), device_memory_, Gib(device_memory_), advice);
    }
    return OkStatus();
  }

 private:
  static double Gib(uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }

  const uint64_t device_memory_;
};

template <typename T>
uint32_t Size(const flatbuffers::Vector<T>* vector) {
  return vector == nullptr ? 0 : vector->size();
}

std::string_view View(const flatbuffers::String* text) {
  return text == nullptr ? std::string_view() : std::string_view(text->c_str(), text->size());
}

Status ConvertTensor(const format::Tensor* tensor, const std::string& where,
                     const SegmentLimit& limit, driver::TensorSignature* out, WorkBudget* budget) {
  const std::string_view name = View(tensor->name());
  if (name.empty()) {
    return MakeStatus(kInvalid, "{} has no name; every input and output needs one; {}", where,
                      kRebuild);
  }
  if (name.find('\0') != std::string_view::npos) {
    return MakeStatus(kInvalid, "{}: its name contains a NUL byte; {}", where, kRebuild);
  }
  out->name.assign(name);
  const std::string described = fmt::format("{} '{}'", where, out->name);
  const uint8_t dtype = tensor->dtype();
  if (dtype >= TERN_DTYPE_COUNT) {
    return MakeStatus(kUnsupported,
                      "{} has dtype {}, which this tern does not know: the executable needs a "
                      "newer tern; upgrade tern or rebuild it",
                      described, dtype);
  }
  out->dtype = static_cast<tern_dtype_t>(dtype);
  const auto* shape = tensor->shape();
  const uint32_t rank = Size(shape);
  TERN_RETURN_IF_ERROR(budget->Spend(rank + 1));
  if (rank > TERN_MAX_RANK) {
    return MakeStatus(kInvalid, "{} has rank {}, more than the maximum {}; {}", described, rank,
                      TERN_MAX_RANK, kRebuild);
  }
  out->rank = rank;
  CopyScalars(shape, out->shape);
  uint64_t bytes = 0;
  Status size =
      TensorBytes(kInvalid, out->dtype, std::span<const int64_t>(out->shape, rank), &bytes);
  if (!size.ok()) return size.WithContext(described);
  if (bytes != tensor->size_bytes()) {
    return MakeStatus(kInvalid,
                      "{} is {} but its size_bytes is {} instead of {} (product of the shape "
                      "times the dtype size); {}",
                      described, isa::DescribeOperand([&] {
                        isa::OperandDesc desc;
                        desc.dtype = out->dtype;
                        desc.rank = rank;
                        for (uint32_t i = 0; i < rank; ++i) desc.shape[i] = out->shape[i];
                        return desc;
                      }()),
                      tensor->size_bytes(), bytes, kRebuild);
  }
  TERN_RETURN_IF_ERROR(limit.Check(fmt::format("{}: size_bytes", described), bytes,
                                   "give the tensor a smaller shape"));
  out->size_bytes = bytes;
  return OkStatus();
}

// Fails with a message that starts with "{where}: " where `where` is built
// only on failure.
template <typename Where>
Status ConvertOperand(const format::Operand* operand, const Where& where, isa::OperandDesc* out,
                      WorkBudget* budget) {
  const uint8_t segment = operand->segment();
  if (segment > TERN_SEGMENT_SCRATCH && segment != TERN_SEGMENT_NONE) {
    return MakeStatus(kUnsupported,
                      "{} is in segment {}, which this tern does not know: the executable needs "
                      "a newer tern; upgrade tern or rebuild it",
                      where(), segment);
  }
  out->segment = static_cast<tern_segment_t>(segment);
  if (segment == TERN_SEGMENT_NONE) return OkStatus();
  out->index = operand->index();
  out->offset = operand->offset();
  if (operand->dtype() >= TERN_DTYPE_COUNT) {
    return MakeStatus(kUnsupported,
                      "{} has dtype {}, which this tern does not know: the executable needs a "
                      "newer tern; upgrade tern or rebuild it",
                      where(), operand->dtype());
  }
  out->dtype = static_cast<tern_dtype_t>(operand->dtype());
  const auto* shape = operand->shape();
  const auto* strides = operand->strides();
  const uint32_t rank = Size(shape);
  TERN_RETURN_IF_ERROR(budget->Spend(uint64_t{rank} + Size(strides)));
  if (rank > TERN_MAX_RANK) {
    return MakeStatus(kInvalid, "{} has rank {}, more than the maximum {}; {}", where(), rank,
                      TERN_MAX_RANK, kRebuild);
  }
  out->rank = rank;
  CopyScalars(shape, out->shape.data());
  if (Size(strides) == 0) {
    Status contiguous = ContiguousStrides(kInvalid, out);
    if (!contiguous.ok()) {
      return MakeStatus(kInvalid, "{}: {}; {}", where(), contiguous.message(), kRebuild);
    }
  } else if (strides->size() != rank) {
    return MakeStatus(kInvalid, "{} has {} strides for rank {}: give one per dimension or none; {}",
                      where(), strides->size(), rank, kRebuild);
  } else {
    CopyScalars(strides, out->strides.data());
  }
  return OkStatus();
}

// Where an instruction is, for messages: "function 'main' (0), vector
// engine of core 0, instruction 3 (binary)". Built only on failure.
struct InstructionPlace {
  const std::string& where;
  tern_engine_t engine;
  uint32_t core;
  uint32_t index;
  const char* opcode_name;  // nullptr for an unknown opcode

  std::string Text() const {
    std::string text = fmt::format("{}, {} engine of core {}, instruction {}", where,
                                   isa::EngineName(engine), core, index);
    if (opcode_name != nullptr) text += fmt::format(" ({})", opcode_name);
    return text;
  }
};

// Turns one function of the module into a driver::Function: the signature,
// then each stream and its instructions (every rule of the spec on each),
// then the order the driver runs them in. Each step is a method; the first
// error ends the conversion.
class FunctionConverter {
 public:
  FunctionConverter(
      const format::Function* function, uint32_t function_index, uint64_t constants_bytes,
      const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* debug_names,
      bool has_debug, uint64_t declared_features, const SegmentLimit& limit, WorkBudget* budget,
      const LoadOptions& options, driver::Function* out)
      : function_(function),
        function_index_(function_index),
        constants_bytes_(constants_bytes),
        debug_names_(debug_names),
        has_debug_(has_debug),
        declared_features_(declared_features),
        limit_(limit),
        budget_(budget),
        options_(options),
        out_(out) {}

  Status Convert() {
    out_->name.assign(View(function_->name()));
    where_ = fmt::format("function '{}' ({})", out_->name, function_index_);
    TERN_RETURN_IF_ERROR(ConvertSignature());
    out_->scratch_bytes = function_->scratch_bytes();
    TERN_RETURN_IF_ERROR(limit_.Check(fmt::format("{}: scratch_bytes", where_), out_->scratch_bytes,
                                      "build it with less scratch (tern_builder_set_scratch)"));
    sizes_.inputs = out_->inputs;
    sizes_.outputs = out_->outputs;
    sizes_.constants = constants_bytes_;
    sizes_.scratch = out_->scratch_bytes;

    const uint32_t stream_count = Size(function_->streams());
    TERN_RETURN_IF_ERROR(budget_->Spend(stream_count));
    schedule_.streams.resize(stream_count);
    for (uint32_t s = 0; s < stream_count; ++s) TERN_RETURN_IF_ERROR(ConvertStream(s));
    out_->instruction_count = static_cast<uint32_t>(instructions_.size());
    return Schedule();
  }

 private:
  // Inputs and outputs: each a valid tensor, the names unique.
  Status ConvertSignature() {
    const uint32_t input_count = Size(function_->inputs());
    const uint32_t output_count = Size(function_->outputs());
    TERN_RETURN_IF_ERROR(budget_->Spend(uint64_t{input_count} + output_count));
    out_->inputs.resize(input_count);
    out_->outputs.resize(output_count);
    std::unordered_set<std::string_view> names;
    for (uint32_t i = 0; i < input_count + output_count; ++i) {
      const bool input = i < input_count;
      const uint32_t index = input ? i : i - input_count;
      const auto* tensor =
          input ? function_->inputs()->Get(index) : function_->outputs()->Get(index);
      driver::TensorSignature* signature = input ? &out_->inputs[index] : &out_->outputs[index];
      TERN_RETURN_IF_ERROR(
          ConvertTensor(tensor, fmt::format("{}, {} {}", where_, input ? "input" : "output", index),
                        limit_, signature, budget_));
      if (!names.insert(signature->name).second) {
        return MakeStatus(kInvalid,
                          "{}: more than one input or output is named '{}'; names must be unique "
                          "within a function; {}",
                          where_, signature->name, kRebuild);
      }
    }
    return OkStatus();
  }

  // A stream's engine and core: one that has a stream, known, on a core
  // that exists, and the only stream of that engine of that core.
  Status CheckStream(uint32_t s, const format::Stream* stream) {
    const uint32_t core = stream->core();
    const uint8_t engine_value = stream->engine();
    const std::string stream_where = fmt::format("{}, stream {}", where_, s);
    if (engine_value == TERN_ENGINE_SYNC || engine_value == 0) {
      return MakeStatus(kInvalid,
                        "{} is for engine {}, which has no stream (sync instructions go in the "
                        "stream of the engine they order); {}",
                        stream_where, engine_value, kRebuild);
    }
    if (engine_value > TERN_ENGINE_SYNC) {
      return MakeStatus(kUnsupported,
                        "{} is for engine {}, which this tern does not know: the executable "
                        "needs a newer tern; upgrade tern or rebuild it",
                        stream_where, engine_value);
    }
    if (core >= kMaxCores) {
      return MakeStatus(kInvalid, "{} is for core {}; cores are numbered below {}; {}",
                        stream_where, core, kMaxCores, kRebuild);
    }
    if (!seen_streams_.insert({core, engine_value}).second) {
      return MakeStatus(
          kInvalid, "{}: there is more than one stream for the {} engine of core {}; {}",
          stream_where, isa::EngineName(static_cast<tern_engine_t>(engine_value)), core, kRebuild);
    }
    return OkStatus();
  }

  Status ConvertStream(uint32_t s) {
    const format::Stream* stream = function_->streams()->Get(s);
    TERN_RETURN_IF_ERROR(CheckStream(s, stream));
    ScheduleInput::Stream& scheduled = schedule_.streams[s];
    scheduled.core = stream->core();
    scheduled.engine = static_cast<tern_engine_t>(stream->engine());
    scheduled.begin = static_cast<uint32_t>(instructions_.size());
    const uint32_t count = Size(stream->instructions());
    TERN_RETURN_IF_ERROR(budget_->Spend(count));
    if (instructions_.size() + count > UINT32_MAX / 2) {
      return MakeStatus(kInvalid, "{} has too many instructions; {}", where_, kRebuild);
    }
    for (uint32_t i = 0; i < count; ++i) {
      TERN_RETURN_IF_ERROR(
          ConvertInstruction(stream->instructions()->Get(i), scheduled.engine, scheduled.core, i));
    }
    scheduled.end = static_cast<uint32_t>(instructions_.size());
    return OkStatus();
  }

  static Status CheckOpcodeKnown(uint32_t opcode, const InstructionPlace& at) {
    if (at.opcode_name == nullptr) {
      return MakeStatus(kUnsupported,
                        "{}: opcode {:#06x} is not an instruction this tern knows (engine "
                        "byte {:#04x}): the executable needs a newer tern; upgrade tern or "
                        "rebuild it for this version",
                        at.Text(), opcode, opcode >> 8);
    }
    return OkStatus();
  }

  // Sync opcodes go in any engine's stream; the others in their engine's.
  static Status CheckOpcodeEngine(uint32_t opcode, const InstructionPlace& at) {
    const tern_engine_t opcode_engine = isa::OpcodeEngine(opcode);
    if (opcode_engine != TERN_ENGINE_SYNC && opcode_engine != at.engine) {
      return MakeStatus(
          kInvalid, "{}: it runs on the {} engine but is in the {} engine's stream; {}", at.Text(),
          isa::EngineName(opcode_engine), isa::EngineName(at.engine), kRebuild);
    }
    return OkStatus();
  }

  // The operands converted into descs_ and the instruction checked against
  // its opcode's rules (isa::ValidateInstruction).
  Status ConvertOperandsAndValidate(const format::Instruction* instruction,
                                    const driver::Instruction& converted,
                                    const InstructionPlace& at) {
    const uint32_t operand_count = Size(instruction->operands());
    descs_.assign(operand_count, isa::OperandDesc{});
    for (uint32_t k = 0; k < operand_count; ++k) {
      TERN_RETURN_IF_ERROR(ConvertOperand(
          instruction->operands()->Get(k),
          [&] { return fmt::format("{}, operand {}", at.Text(), k); }, &descs_[k], budget_));
    }
    Status valid =
        isa::ValidateInstruction(converted.opcode, descs_, converted.ints, converted.floats);
    if (!valid.ok()) {
      // ValidateInstruction says UNSUPPORTED for enum values it does not know.
      const tern_status_t code = valid.code() == kUnsupported ? kUnsupported : kInvalid;
      return Status(code, fmt::format("{}: {}; {}", at.Text(), valid.message(),
                                      code == kUnsupported
                                          ? "the executable needs a newer tern: upgrade tern or "
                                            "rebuild it for this version"
                                          : kRebuild));
    }
    // A file must declare the features its instructions need, so that an
    // older tern refuses it by its header rather than by an opcode.
    const uint64_t undeclared =
        isa::FeaturesOf(converted.opcode, descs_, converted.ints) & ~declared_features_;
    if (undeclared != 0) {
      return MakeStatus(kInvalid,
                        "{}: it needs the feature {} but the file header does not declare it "
                        "(required features {:#x}): the file was written by a broken producer; {}",
                        at.Text(), isa::FeatureNames(undeclared), declared_features_, kRebuild);
    }
    return OkStatus();
  }

  // Every present operand lies inside its segment (and a written one in a
  // writable segment).
  Status CheckPlacements(uint32_t opcode, const InstructionPlace& at) const {
    for (uint32_t k = 0; k < descs_.size(); ++k) {
      if (!descs_[k].present()) continue;
      uint64_t end = 0;
      Status placed = CheckOperandPlacement(kInvalid, descs_[k], isa::OperandIsWritten(opcode, k),
                                            sizes_, &end);
      if (!placed.ok()) {
        return MakeStatus(kInvalid, "{}, {}: {}; {}", at.Text(),
                          DescribeOperandSlot(k, descs_[k], sizes_), placed.message(), kRebuild);
      }
    }
    return OkStatus();
  }

  // The debug op index: -1 or, with a debug section, one of its names.
  Status ResolveDebugOp(int32_t debug_op, const InstructionPlace& at, std::string* name) const {
    if (debug_op < -1) {
      return MakeStatus(kInvalid, "{}: debug op index {} is negative (use -1 for none); {}",
                        at.Text(), debug_op, kRebuild);
    }
    if (has_debug_ && debug_op >= 0) {
      const uint32_t debug_count = Size(debug_names_);
      if (static_cast<uint32_t>(debug_op) >= debug_count) {
        return MakeStatus(kInvalid,
                          "{}: debug op index {} is out of range: the debug section names {} "
                          "ops; {}",
                          at.Text(), debug_op, debug_count, kRebuild);
      }
      name->assign(View(debug_names_->Get(debug_op)));
    }
    return OkStatus();
  }

  Status ConvertInstruction(const format::Instruction* instruction, tern_engine_t engine,
                            uint32_t core, uint32_t i) {
    const uint32_t opcode = instruction->opcode();
    const InstructionPlace at{where_, engine, core, i, isa::OpcodeName(opcode)};
    TERN_RETURN_IF_ERROR(CheckOpcodeKnown(opcode, at));
    const uint32_t operand_count = Size(instruction->operands());
    const uint32_t int_count = Size(instruction->ints());
    const uint32_t float_count = Size(instruction->floats());
    TERN_RETURN_IF_ERROR(budget_->Spend(uint64_t{operand_count} + int_count + float_count));

    driver::Instruction converted;
    converted.opcode = opcode;
    converted.engine = engine;
    converted.core = core;
    converted.position = i;
    CopyScalars(instruction->ints(), &converted.ints);
    CopyScalars(instruction->floats(), &converted.floats);
    TERN_RETURN_IF_ERROR(CheckOpcodeEngine(opcode, at));
    TERN_RETURN_IF_ERROR(ConvertOperandsAndValidate(instruction, converted, at));
    SyncStep step;
    if (isa::OpcodeEngine(opcode) == TERN_ENGINE_SYNC) {
      // [semaphore, value], checked above; the stream gives the engine.
      step.kind = opcode == TERN_OP_SEM_WAIT ? SyncStep::kWait : SyncStep::kSignal;
      step.semaphore = converted.ints[0];
      step.value = converted.ints[1];
    }
    TERN_RETURN_IF_ERROR(CheckPlacements(opcode, at));
    TERN_RETURN_IF_ERROR(ResolveDebugOp(instruction->debug_op(), at, &converted.debug_op));
    converted.operands = descs_;
    schedule_.steps.push_back(step);
    instructions_.push_back(std::move(converted));
    return OkStatus();
  }

  // On hardware the engines run their streams concurrently: a pair of
  // instructions that nothing orders must not touch the same bytes with a
  // write (hazards.h). Refused, or logged with LoadOptions::allow_races.
  Status CheckRaces(const std::vector<ScheduledStep>& order) const {
    constexpr size_t kNamed = 4;
    std::vector<Race> races;
    const size_t count = FindRaces(schedule_, instructions_, order, kNamed, &races);
    if (count == 0) return OkStatus();
    if (options_.allow_races) {
      for (const Race& race : races) {
        TERN_LOG_WARN("{}: loaded with TERN_EXECUTABLE_LOAD_ALLOW_RACES although {}", where_,
                      DescribeRace(race, instructions_));
      }
      if (count > races.size()) {
        TERN_LOG_WARN("{}: and {} more races", where_, count - races.size());
      }
      return OkStatus();
    }
    return MakeStatus(kInvalid,
                      "{}: its engine streams race: {}. {} (or pass "
                      "TERN_EXECUTABLE_LOAD_ALLOW_RACES to load it anyway, for an experiment)",
                      where_, DescribeRaces(races, count, instructions_), kRaceAdvice);
  }

  // Proves that the streams finish (the semaphore simulation) and do not
  // race, then hands them over with their sync instructions: the engines
  // run them concurrently.
  Status Schedule() {
    std::vector<ScheduledStep> order;
    Status scheduled = ScheduleStreams(schedule_, &order);
    if (!scheduled.ok()) return scheduled.WithContext(where_);
    TERN_RETURN_IF_ERROR(CheckRaces(order));
    out_->streams.resize(schedule_.streams.size());
    for (size_t s = 0; s < schedule_.streams.size(); ++s) {
      const ScheduleInput::Stream& from = schedule_.streams[s];
      driver::Stream& to = out_->streams[s];
      to.core = from.core;
      to.engine = from.engine;
      to.instructions.assign(std::make_move_iterator(instructions_.begin() + from.begin),
                             std::make_move_iterator(instructions_.begin() + from.end));
    }
    return OkStatus();
  }

  const format::Function* function_;
  const uint32_t function_index_;
  const uint64_t constants_bytes_;
  const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* debug_names_;
  const bool has_debug_;
  const uint64_t declared_features_;
  const SegmentLimit& limit_;
  WorkBudget* budget_;
  const LoadOptions& options_;
  driver::Function* out_;

  std::string where_;  // "function 'main' (0)"
  SegmentSizes sizes_;
  ScheduleInput schedule_;
  std::vector<driver::Instruction> instructions_;
  std::set<std::pair<uint32_t, uint32_t>> seen_streams_;  // (core, engine)
  std::vector<isa::OperandDesc> descs_;                   // the current instruction's operands
};

}  // namespace

Status ValidateExecutable(std::span<const uint8_t> data, ValidatedExecutable* out,
                          const LoadOptions& options) {
  Container container;
  TERN_RETURN_IF_ERROR(ParseContainer(data, ContainerOptions{}, &container));

  std::vector<uint64_t> module_copy, debug_copy;
  const format::Module* module = nullptr;
  TERN_RETURN_IF_ERROR(
      VerifyFlatBuffer(AlignedView(container.module, &module_copy), "module", &module));
  const format::DebugInfo* debug = nullptr;
  if (container.has_debug) {
    TERN_RETURN_IF_ERROR(
        VerifyFlatBuffer(AlignedView(container.debug, &debug_copy), "debug", &debug));
  }

  auto program = std::make_shared<driver::Program>();
  const std::string_view target = View(module->target());
  if (target != kTarget) {
    return MakeStatus(kUnsupported,
                      "the executable is for target '{}', but this tern runs '{}' executables: "
                      "build it for '{}'",
                      target, kTarget, kTarget);
  }
  program->target.assign(target);
  program->constants_bytes = module->constants_bytes();
  if (program->constants_bytes != container.constants_size) {
    return MakeStatus(kInvalid,
                      "the module declares {} bytes of constants but the constants section has "
                      "{}; {}",
                      program->constants_bytes, container.constants_size, kRebuild);
  }

  const SegmentLimit limit(options.device_memory_bytes);
  TERN_RETURN_IF_ERROR(limit.Check("the module's constants_bytes", program->constants_bytes,
                                   "keep large weights out of the constants and pass them as "
                                   "inputs"));

  WorkBudget budget(container.module.size());
  const uint32_t function_count = Size(module->functions());
  TERN_RETURN_IF_ERROR(budget.Spend(function_count));
  program->functions.resize(function_count);
  std::unordered_set<std::string_view> names;
  for (uint32_t f = 0; f < function_count; ++f) {
    const format::Function* function = module->functions()->Get(f);
    const std::string_view name = View(function->name());
    if (name.empty() || name.find('\0') != std::string_view::npos) {
      return MakeStatus(kInvalid, "function {} has {}; every function needs a name; {}", f,
                        name.empty() ? "no name" : "a name with a NUL byte", kRebuild);
    }
    if (!names.insert(name).second) {
      return MakeStatus(kInvalid, "more than one function is named '{}'; names must be unique; {}",
                        name, kRebuild);
    }
    FunctionConverter converter(function, f, program->constants_bytes,
                                debug ? debug->op_names() : nullptr, container.has_debug,
                                container.header.required_features, limit, &budget, options,
                                &program->functions[f]);
    TERN_RETURN_IF_ERROR(converter.Convert());
  }
  out->program = std::move(program);
  out->constants_offset = container.constants_offset;
  return OkStatus();
}

}  // namespace tern::exe
