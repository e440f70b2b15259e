#include "src/executable/dump.h"

#include <flatbuffers/flatbuffers.h>

#include <cstring>
#include <vector>

#include "common/isa_rules.h"
#include "src/executable/fb_util.h"
#include "src/executable/format.h"
#include "src/executable/loader.h"
#include "src/executable/tern_executable_generated.h"

namespace tern::exe {
namespace {

template <typename... Args>
void Line(std::string* text, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(*text), format, std::forward<Args>(args)...);
  text->push_back('\n');
}

template <typename T>
std::string List(const flatbuffers::Vector<T>* values) {
  std::string text = "[";
  if (values != nullptr) {
    for (uint32_t i = 0; i < values->size(); ++i) {
      if (i > 0) text += ", ";
      text += fmt::format("{}", ScalarAt(values, i));
    }
  }
  return text + "]";
}

// Names of raw enum values from the file, which may be out of range.
std::string DTypeText(uint8_t dtype) {
  if (dtype >= TERN_DTYPE_COUNT) return fmt::format("dtype{}", dtype);
  return isa::DTypeName(static_cast<tern_dtype_t>(dtype));
}

std::string EngineText(uint8_t engine) {
  if (engine < TERN_ENGINE_DMA || engine > TERN_ENGINE_SYNC) return fmt::format("engine{}", engine);
  return isa::EngineName(static_cast<tern_engine_t>(engine));
}

std::string SegmentName(uint8_t segment, uint32_t index) {
  switch (segment) {
    case TERN_SEGMENT_INPUT:
      return fmt::format("in{}", index);
    case TERN_SEGMENT_OUTPUT:
      return fmt::format("out{}", index);
    case TERN_SEGMENT_CONSTANT:
      return "const";
    case TERN_SEGMENT_SCRATCH:
      return "scratch";
    default:
      return fmt::format("segment{}", segment);
  }
}

std::string DescribeOperand(const format::Operand* operand) {
  if (operand->segment() == TERN_SEGMENT_NONE) return "-";
  std::string text =
      fmt::format("{}+{}:{}{}", SegmentName(operand->segment(), operand->index()),
                  operand->offset(), DTypeText(operand->dtype()), List(operand->shape()));
  if (operand->strides() != nullptr && operand->strides()->size() > 0) {
    text += fmt::format("/strides{}", List(operand->strides()));
  }
  return text;
}

// The name of the function enum value that an opcode takes as ints[0]
// ("add" for binary 0); nullptr for other opcodes and unknown values.
const char* FunctionName(uint32_t opcode, int64_t fn) {
  switch (opcode) {
    case TERN_OP_UNARY:
    case TERN_OP_UNARY_BACKWARD:
      return isa::UnaryFnName(fn);
    case TERN_OP_BINARY:
      return isa::BinaryFnName(fn);
    case TERN_OP_REDUCE:
    case TERN_OP_ALL_REDUCE:
      return isa::ReduceFnName(fn);
    case TERN_OP_RANDOM:
      return isa::RandomFnName(fn);
    case TERN_OP_SCAN:
      return isa::ScanFnName(fn);
    default:
      return nullptr;
  }
}

std::string DescribeParameters(const format::Instruction* instruction) {
  const uint32_t opcode = instruction->opcode();
  const auto* ints = instruction->ints();
  std::string text;
  if (ints != nullptr && ints->size() > 0) {
    const char* fn = FunctionName(opcode, ScalarAt(ints, 0));
    if (fn != nullptr) text += fmt::format(" fn={}", fn);
    text += fmt::format(" ints={}", List(ints));
  }
  if (instruction->floats() != nullptr && instruction->floats()->size() > 0) {
    text += fmt::format(" floats={}", List(instruction->floats()));
  }
  return text;
}

void DumpModule(const format::Module* module, const format::DebugInfo* debug, std::string* text,
                const DumpOptions& options) {
  const auto* functions = module->functions();
  const uint32_t function_count = functions ? functions->size() : 0;
  Line(text, "module: target '{}', producer '{}', {} bytes of constants, {} function{}",
       module->target() ? module->target()->str() : "",
       module->producer() ? module->producer()->str() : "", module->constants_bytes(),
       function_count, function_count == 1 ? "" : "s");
  const auto* debug_names = debug ? debug->op_names() : nullptr;
  for (uint32_t f = 0; f < function_count; ++f) {
    const format::Function* function = functions->Get(f);
    Line(text, "");
    Line(text, "function {} '{}': scratch {} bytes", f,
         function->name() ? function->name()->str() : "", function->scratch_bytes());
    for (int output = 0; output < 2; ++output) {
      const auto* tensors = output ? function->outputs() : function->inputs();
      const uint32_t count = tensors ? tensors->size() : 0;
      for (uint32_t i = 0; i < count; ++i) {
        const format::Tensor* tensor = tensors->Get(i);
        Line(text, "  {} {} '{}': {}{} ({} bytes)", output ? "output" : "input ", i,
             tensor->name() ? tensor->name()->str() : "", DTypeText(tensor->dtype()),
             List(tensor->shape()), tensor->size_bytes());
      }
    }
    const auto* streams = function->streams();
    const uint32_t stream_count = streams ? streams->size() : 0;
    for (uint32_t s = 0; s < stream_count; ++s) {
      const format::Stream* stream = streams->Get(s);
      const auto* instructions = stream->instructions();
      const uint32_t count = instructions ? instructions->size() : 0;
      Line(text, "  stream {}: {} engine, core {}: {} instruction{}", s,
           EngineText(stream->engine()), stream->core(), count, count == 1 ? "" : "s");
      if (!options.disassemble) continue;
      for (uint32_t i = 0; i < count; ++i) {
        const format::Instruction* instruction = instructions->Get(i);
        const char* name = isa::OpcodeName(instruction->opcode());
        std::string line = fmt::format(
            "    {:4}  {:<14}", i, name ? name : fmt::format("?{:#06x}", instruction->opcode()));
        const auto* operands = instruction->operands();
        if (operands != nullptr) {
          for (uint32_t k = 0; k < operands->size(); ++k) {
            line += (k == 0 ? " " : ", ") + DescribeOperand(operands->Get(k));
          }
        }
        const auto* ints = instruction->ints();
        if ((instruction->opcode() == TERN_OP_SEM_SIGNAL ||
             instruction->opcode() == TERN_OP_SEM_WAIT) &&
            ints != nullptr && ints->size() == 2) {
          line += fmt::format(
              " semaphore {} {} {}", ScalarAt(ints, 0),
              instruction->opcode() == TERN_OP_SEM_WAIT ? ">=" : "+=", ScalarAt(ints, 1));
        } else {
          line += DescribeParameters(instruction);
        }
        const int32_t op = instruction->debug_op();
        if (op >= 0) {
          if (debug_names != nullptr && static_cast<uint32_t>(op) < debug_names->size()) {
            line += fmt::format("  # {}", debug_names->Get(op)->str());
          } else {
            line += fmt::format("  # debug op {} (missing)", op);
          }
        }
        Line(text, "{}", line);
      }
    }
  }
}

template <typename Root>
const Root* VerifiedRoot(std::span<const uint8_t> bytes, std::vector<uint64_t>* copy) {
  if (bytes.size() < 8 || bytes.size() >= FLATBUFFERS_MAX_BUFFER_SIZE) return nullptr;
  copy->resize((bytes.size() + 7) / 8);
  std::memcpy(copy->data(), bytes.data(), bytes.size());
  const auto* data = reinterpret_cast<const uint8_t*>(copy->data());
  flatbuffers::Verifier::Options options;
  options.max_tables = static_cast<flatbuffers::uoffset_t>(bytes.size() / 4 + 16);
  flatbuffers::Verifier verifier(data, bytes.size(), options);
  if (!verifier.VerifyBuffer<Root>(nullptr)) return nullptr;
  return flatbuffers::GetRoot<Root>(data);
}

}  // namespace

Status DumpExecutable(std::span<const uint8_t> data, std::string* text,
                      const DumpOptions& options) {
  Line(text, "tern executable: {} bytes", data.size());
  ContainerOptions container_options;
  container_options.verify_checksums = false;
  Container container;
  Status parsed = ParseContainer(data, container_options, &container);
  if (!parsed.ok()) {
    Line(text, "cannot read the container: {}: {}", StatusCodeName(parsed.code()),
         parsed.message());
    return parsed;
  }
  const FileHeader& header = container.header;
  const uint64_t header_checksum =
      HeaderChecksum(data.first(header.header_size),
                     data.subspan(header.section_table_offset,
                                  uint64_t{header.section_count} * header.section_entry_size));
  Line(text, "header: format {}.{}, {} bytes; section table at {}: {} entries of {} bytes",
       header.format_major, header.format_minor, header.header_size, header.section_table_offset,
       header.section_count, header.section_entry_size);
  Line(text, "  required features {:#x}{}, optional features {:#x}", header.required_features,
       header.required_features != 0
           ? fmt::format(" ({})", isa::FeatureNames(header.required_features))
           : std::string(),
       header.optional_features);
  Line(text, "  checksum {:#018x} {}", header.header_checksum,
       header_checksum == header.header_checksum
           ? std::string("(ok)")
           : fmt::format("(MISMATCH: the contents hash to {:#018x})", header_checksum));
  Line(text, "sections:");
  Line(text, "  {:>3}  {:<10} {:<9} {:>12} {:>12}  {}", "#", "kind", "flags", "offset", "size",
       "checksum");
  for (size_t i = 0; i < container.sections.size(); ++i) {
    const SectionEntry& entry = container.sections[i];
    const uint64_t actual = Checksum(data.subspan(entry.offset, entry.size));
    Line(text, "  {:>3}  {:<10} {:<9} {:>12} {:>12}  {:#018x} {}", i,
         entry.kind <= kSectionDebug && entry.kind >= kSectionModule
             ? SectionKindName(entry.kind)
             : fmt::format("kind{}", entry.kind),
         (entry.flags & kSectionFlagOptional) ? "optional" : "-", entry.offset, entry.size,
         entry.checksum,
         actual == entry.checksum ? std::string("ok")
                                  : fmt::format("MISMATCH (contents hash to {:#018x})", actual));
  }

  std::vector<uint64_t> module_copy, debug_copy;
  const auto* module = VerifiedRoot<format::Module>(container.module, &module_copy);
  const format::DebugInfo* debug = nullptr;
  if (container.has_debug) {
    debug = VerifiedRoot<format::DebugInfo>(container.debug, &debug_copy);
    if (debug == nullptr) Line(text, "debug section: fails FlatBuffers verification");
  }
  if (module == nullptr) {
    Status status(TERN_ERROR_EXECUTABLE_INVALID,
                  "the module section fails FlatBuffers verification");
    Line(text, "module: {}", status.message());
    return status;
  }
  DumpModule(module, debug, text, options);

  ValidatedExecutable validated;
  Status verdict = ValidateExecutable(data, &validated);
  Line(text, "");
  if (verdict.ok()) {
    Line(text, "loader verdict: accepted");
  } else {
    Line(text, "loader verdict: rejected: {}: {}", StatusCodeName(verdict.code()),
         verdict.message());
  }
  return verdict;
}

}  // namespace tern::exe
