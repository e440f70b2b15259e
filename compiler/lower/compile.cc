#include "compiler/lower/compile.h"

#include <absl/status/status.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "compiler/ir/verify.h"
#include "compiler/lower/engine_sync.h"
#include "compiler/lower/fusion.h"
#include "compiler/lower/lowering.h"
#include "compiler/lower/memory_planner.h"
#include "compiler/lower/mutations.h"
#include "tern/builder.h"
#include "tern/status.h"

namespace tern::compiler {
namespace {

struct BuilderDeleter {
  void operator()(tern_builder_s* builder) const { tern_builder_destroy(builder); }
};
using BuilderPtr = std::unique_ptr<tern_builder_s, BuilderDeleter>;

absl::Status BuilderError(tern_status_t status, std::string_view what) {
  return absl::InternalError(fmt::format("{} failed with {}: {}", what, tern_status_string(status),
                                         tern_last_error_message()));
}

// The debug op of an instruction: "linear_1 @ model.py:42", or what it copies.
std::string DebugOp(const Graph& graph, const LoweredInstruction& instruction) {
  if (instruction.node == kNoNode) {
    return fmt::format("output '{}'", graph.outputs[instruction.output].name);
  }
  const Node& node = graph.nodes[instruction.node];
  // A fused instruction lists what it took in: "addmm_2 + mul_1 + tanh @ model.py:42".
  std::string name = node.name;
  size_t named = 0, more = 0;
  for (uint32_t other : instruction.fused_nodes) {
    if (other == kNoNode || other == instruction.node) continue;
    if (named++ < 7) {
      name += " + " + graph.nodes[other].name;
    } else {
      ++more;
    }
  }
  if (more > 0) name += fmt::format(" + {} more", more);
  return node.source.empty() ? name : fmt::format("{} @ {}", name, node.source);
}

uint64_t MemoryKey(tern_segment_t segment, uint32_t index) {
  return (static_cast<uint64_t>(segment) << 32) | index;
}

// Everything the builder needs to resolve buffers into segments.
struct Placement {
  std::vector<uint64_t> constant_offsets;  // per ConstantPool entry
  std::vector<uint64_t> scratch_offsets;   // per scratch buffer
};

tern_segment_t SegmentOf(BufferRef::Kind kind) {
  switch (kind) {
    case BufferRef::kInput:
      return TERN_SEGMENT_INPUT;
    case BufferRef::kOutput:
      return TERN_SEGMENT_OUTPUT;
    case BufferRef::kConstant:
      return TERN_SEGMENT_CONSTANT;
    case BufferRef::kScratch:
      return TERN_SEGMENT_SCRATCH;
    case BufferRef::kNone:
      break;
  }
  return TERN_SEGMENT_NONE;
}

tern_operand_t Resolve(const TensorRef& ref, const Placement& placement) {
  tern_operand_t operand;
  std::memset(&operand, 0, sizeof(operand));
  operand.segment = SegmentOf(ref.buffer.kind);
  if (!ref.present()) return operand;
  uint64_t base = 0;
  if (ref.buffer.kind == BufferRef::kConstant) {
    base = placement.constant_offsets[ref.buffer.index];
  } else if (ref.buffer.kind == BufferRef::kScratch) {
    base = placement.scratch_offsets[ref.buffer.index];
  } else {
    operand.index = ref.buffer.index;
  }
  operand.offset = base + static_cast<uint64_t>(ref.offset) * tern_dtype_size(ref.dtype);
  operand.dtype = ref.dtype;
  operand.rank = static_cast<uint32_t>(ref.shape.size());
  operand.shape = ref.shape.data();
  operand.strides = ref.strides.data();
  return operand;
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> CompileGraph(const Graph& graph, const CompileOptions& options,
                                                  CompileStats* stats) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status status = VerifyGraph(graph); !status.ok()) {
    return absl::InvalidArgumentError(fmt::format(
        "the graph is not valid, so it was not compiled: {}", std::string(status.message())));
  }
  absl::StatusOr<LoweredProgram> lowered = LowerGraph(graph);
  if (!lowered.ok()) return lowered.status();
  FusionStats fusion;
  fusion.instructions_before = fusion.instructions_after =
      static_cast<uint32_t>(lowered->instructions.size());
  if (options.fusion) FuseInstructions(&*lowered, &fusion);
  MutationStats mutations;
  const std::vector<uint32_t> shared_input = MakeMutationsSafeInPlace(graph, &*lowered, &mutations);
  const LoweredProgram& program = *lowered;

  // Liveness of each scratch buffer: the first and last instruction touching it.
  std::vector<ScratchBuffer> scratch(program.scratch_bytes.size());
  std::vector<bool> seen(scratch.size(), false);
  for (uint32_t position = 0; position < program.instructions.size(); ++position) {
    for (const TensorRef& ref : program.instructions[position].operands) {
      if (ref.buffer.kind != BufferRef::kScratch) continue;
      ScratchBuffer& buffer = scratch[ref.buffer.index];
      if (!seen[ref.buffer.index]) buffer.first_use = position;
      seen[ref.buffer.index] = true;
      buffer.last_use = position;
    }
  }
  // (A buffer no instruction touches, such as an intermediate that fusion
  // keeps in registers, takes no space.)
  for (size_t id = 0; id < scratch.size(); ++id) {
    scratch[id].bytes = seen[id] ? program.scratch_bytes[id] : 0;
  }
  const MemoryPlan plan = PlanScratch(scratch);

  tern_builder_t raw_builder = nullptr;
  if (tern_status_t s = tern_builder_create(options.target.c_str(), &raw_builder); s != TERN_OK) {
    return BuilderError(s, fmt::format("creating a builder for target '{}'", options.target));
  }
  BuilderPtr builder(raw_builder);

  Placement placement;
  placement.scratch_offsets = plan.offsets;
  for (const std::vector<uint8_t>& bytes : program.constants.entries()) {
    uint64_t offset = 0;
    if (!bytes.empty()) {
      if (tern_status_t s =
              tern_builder_add_constants(builder.get(), bytes.data(), bytes.size(), 64, &offset);
          s != TERN_OK) {
        return BuilderError(s, "adding constants");
      }
    }
    placement.constant_offsets.push_back(offset);
  }

  if (tern_status_t s = tern_builder_begin_function(builder.get(), "forward", nullptr);
      s != TERN_OK) {
    return BuilderError(s, "beginning function 'forward'");
  }
  for (uint32_t id : graph.inputs) {
    const Value& value = graph.values[id];
    const std::vector<int64_t> shape = StaticSizes(value.type.shape);
    if (tern_status_t s =
            tern_builder_add_input(builder.get(), value.name.c_str(), value.type.dtype,
                                   static_cast<uint32_t>(shape.size()), shape.data(), nullptr);
        s != TERN_OK) {
      return BuilderError(s, fmt::format("declaring input '{}'", value.name));
    }
  }
  for (const Graph::Output& output : graph.outputs) {
    const TensorType& type = graph.values[output.value].type;
    const std::vector<int64_t> shape = StaticSizes(type.shape);
    if (tern_status_t s =
            tern_builder_add_output(builder.get(), output.name.c_str(), type.dtype,
                                    static_cast<uint32_t>(shape.size()), shape.data(), nullptr);
        s != TERN_OK) {
      return BuilderError(s, fmt::format("declaring output '{}'", output.name));
    }
  }
  if (tern_status_t s = tern_builder_set_scratch(builder.get(), plan.peak); s != TERN_OK) {
    return BuilderError(s, "setting the scratch size");
  }

  CompileStats counted;
  EngineSynchronizer synchronizer;
  std::set<uint32_t> shared_inputs;
  for (uint32_t input : shared_input) {
    if (input != kNoSharedInput) shared_inputs.insert(input);
  }
  for (const LoweredInstruction& instruction : program.instructions) {
    const std::string debug_op = DebugOp(graph, instruction);
    const tern_engine_t engine = EngineOf(instruction.opcode);
    std::vector<tern_operand_t> operands;
    std::vector<MemoryAccess> accesses;
    for (size_t i = 0; i < instruction.operands.size(); ++i) {
      const TensorRef& ref = instruction.operands[i];
      operands.push_back(Resolve(ref, placement));
      const tern_segment_t segment = operands.back().segment;
      // Constants are never written: reads of them never race. Nor are
      // inputs, but those whose memory a mutation's output may share
      // (mutations.h): the two are one memory here, so that the output's
      // writes wait for the input's reads on other engines.
      if (segment == TERN_SEGMENT_CONSTANT) continue;
      if (segment == TERN_SEGMENT_INPUT && !shared_inputs.contains(ref.buffer.index)) continue;
      ByteExtent extent = ExtentOf(ref);
      const uint64_t base = operands.back().offset - extent.first;
      extent.first += base;
      extent.end += base;
      uint64_t memory = MemoryKey(segment, operands.back().index);
      if (segment == TERN_SEGMENT_OUTPUT && shared_input[ref.buffer.index] != kNoSharedInput) {
        memory = MemoryKey(TERN_SEGMENT_INPUT, shared_input[ref.buffer.index]);
      }
      accesses.push_back({memory, extent, i < instruction.written});
    }
    for (const SyncInstruction& sync : synchronizer.Add(engine, accesses)) {
      const int64_t ints[3] = {sync.semaphore, static_cast<int64_t>(sync.value), sync.engine};
      tern_instruction_t added;
      std::memset(&added, 0, sizeof(added));
      added.struct_size = sizeof(added);
      added.opcode = sync.opcode;
      added.int_count = 3;
      added.ints = ints;
      added.debug_op = debug_op.c_str();
      if (tern_status_t s = tern_builder_add_instruction(builder.get(), &added); s != TERN_OK) {
        return BuilderError(s, fmt::format("adding a semaphore instruction for {}", debug_op));
      }
      counted.instructions_per_engine[TERN_ENGINE_SYNC] += 1;
    }
    tern_instruction_t added;
    std::memset(&added, 0, sizeof(added));
    added.struct_size = sizeof(added);
    added.opcode = instruction.opcode;
    added.operand_count = static_cast<uint32_t>(operands.size());
    added.operands = operands.data();
    added.int_count = static_cast<uint32_t>(instruction.ints.size());
    added.ints = instruction.ints.data();
    added.float_count = static_cast<uint32_t>(instruction.floats.size());
    added.floats = instruction.floats.data();
    added.debug_op = debug_op.c_str();
    if (tern_status_t s = tern_builder_add_instruction(builder.get(), &added); s != TERN_OK) {
      const std::string where =
          instruction.node == kNoNode ? debug_op : DescribeNode(graph.nodes[instruction.node]);
      return absl::InternalError(fmt::format(
          "{}: the builder refused the lowered instruction ({}): {}. This is a compiler bug or "
          "a dtype combination the lowering does not handle yet; please report it with the "
          "graph",
          where, tern_status_string(s), tern_last_error_message()));
    }
    counted.instructions_per_engine[engine] += 1;
  }
  if (tern_status_t s = tern_builder_end_function(builder.get()); s != TERN_OK) {
    return absl::InternalError(fmt::format(
        "the builder refused function 'forward' ({}): {}. The compiler ordered the engines "
        "wrongly: please report it with the graph",
        tern_status_string(s), tern_last_error_message()));
  }
  void* data = nullptr;
  uint64_t size = 0;
  if (tern_status_t s = tern_builder_finish(builder.get(), &data, &size); s != TERN_OK) {
    return BuilderError(s, "producing the executable");
  }
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);

  if (stats != nullptr) {
    counted.nodes = static_cast<uint32_t>(graph.nodes.size());
    for (uint32_t count : counted.instructions_per_engine) counted.instructions += count;
    counted.semaphores = synchronizer.semaphores_used();
    counted.scratch_peak = plan.peak;
    counted.scratch_naive_sum = plan.naive_sum;
    counted.scratch_max_live = plan.max_live;
    counted.constant_bytes = program.constants.stored_bytes();
    counted.compute_instructions_unfused = fusion.instructions_before;
    counted.compute_instructions = fusion.instructions_after;
    counted.epilogues = fusion.epilogues;
    counted.fused_groups = fusion.fused_groups;
    counted.fused_members = fusion.fused_members;
    counted.mutations_in_place = mutations.in_place;
    counted.mutations_copied = mutations.copied;
    counted.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    *stats = counted;
  }
  return bytes;
}

}  // namespace tern::compiler
