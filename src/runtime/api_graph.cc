// Graphs (include/tern/graph.h): record commands once, check each as its
// queue call would, then launch the whole sequence as one command of a queue
// (driver::CommandKind::kSequence), rebinding the operands marked as
// parameters.
//
// What is checked when:
//   record    everything the queue call checks (handles, ranges, devices),
//             with the graph's device in place of the queue's;
//   launch    only what can have changed since: that the buffers, executables
//             and events named are still live (lock-free handle peeks, once
//             per distinct handle), the arguments, and the queue's device.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/runtime/api_checks.h"
#include "src/runtime/execution.h"
#include "src/runtime/runtime_state.h"
#include "tern/graph.h"

namespace tern {
namespace {

// A device operand of a recorded command: what it names, and what a launch
// argument for it must satisfy.
struct RecordedOperand {
  tern_graph_operand_t operand = TERN_GRAPH_OPERAND_DST;
  uint32_t index = 0;              // an execution's input or output index
  tern_buffer_t buffer = nullptr;  // NULL: an empty tensor left unbound
  uint64_t bytes = 0;              // the range the command reads or writes
  bool must_be_local = true;       // on the graph's device (D2D: checked as a pair)
  int64_t parameter = -1;          // its parameter number, once marked
  std::string arg;                 // "dst", "inputs[0] ('x')": for messages
};

struct RecordedCommand {
  std::vector<RecordedOperand> operands;
  tern_executable_t executable = nullptr;  // kExecute
  tern_event_t event = nullptr;            // kWait
};

struct ParameterSlot {
  uint32_t command = 0;
  uint32_t operand = 0;  // position in RecordedCommand::operands
};

// A buffer the graph names, with what a launch must know to check it.
struct BufferCheck {
  tern_buffer_t buffer = nullptr;
  uint32_t command = 0;              // the first command that names it
  std::string arg;                   // as that command names it
  bool fixed = false;                // some operand naming it is not a parameter
  std::vector<uint32_t> parameters;  // the parameters naming it
};

}  // namespace

// What launches share, immutable once finalized; each launch in flight holds it.
struct RecordedGraph {
  std::shared_ptr<const driver::CommandSequence> sequence;
  std::vector<std::shared_ptr<void>> constants;  // of every recorded execution
  std::optional<BufferObject> scratch;

  RecordedGraph() = default;
  RecordedGraph(const RecordedGraph&) = delete;
  RecordedGraph& operator=(const RecordedGraph&) = delete;
  ~RecordedGraph() {
    if (scratch) ReleaseBuffer(*scratch);
  }
};

struct GraphObject {
  DeviceObject* device = nullptr;
  std::string given_name;  // as created: "g"
  std::string name;        // for messages: "graph 'g'"

  // Every call on the graph holds it: recording, finalize, launches.
  std::mutex mutex;
  // Recording state, guarded by mutex.
  std::shared_ptr<driver::CommandSequence> sequence = std::make_shared<driver::CommandSequence>();
  std::vector<RecordedCommand> commands;
  std::vector<ParameterSlot> parameters;
  std::vector<std::shared_ptr<void>> constants;
  std::vector<uint32_t> executions_with_scratch;
  uint64_t scratch_bytes = 0;
  // Set by finalize, guarded by mutex.
  std::shared_ptr<RecordedGraph> recorded;
  std::vector<BufferCheck> buffer_checks;
  std::vector<std::pair<tern_executable_t, uint32_t>> executable_checks;  // handle, command
  std::vector<uint32_t> wait_commands;
  // The last launch, guarded by mutex: launches of one graph are ordered.
  std::shared_ptr<const Timeline> last_timeline;
  uint64_t last_sequence = 0;
};

namespace {

std::atomic<uint32_t> graph_counter{0};

const char* OperandName(tern_graph_operand_t operand) {
  switch (operand) {
    case TERN_GRAPH_OPERAND_DST:
      return "TERN_GRAPH_OPERAND_DST";
    case TERN_GRAPH_OPERAND_SRC:
      return "TERN_GRAPH_OPERAND_SRC";
    case TERN_GRAPH_OPERAND_INPUT:
      return "TERN_GRAPH_OPERAND_INPUT";
    case TERN_GRAPH_OPERAND_OUTPUT:
      return "TERN_GRAPH_OPERAND_OUTPUT";
  }
  return "an unknown operand";
}

Status LookupGraph(Runtime* rt, tern_graph_t handle, std::shared_ptr<GraphObject>* out) {
  *out = rt->graph_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (!*out) {
    return NotALiveHandle("graph", "graph", "already destroyed",
                          "create one with tern_graph_create()");
  }
  return OkStatus();
}

Status NotRecording(const GraphObject& graph) {
  return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                    "{} is finalized and records no more commands; create a new graph to record "
                    "more",
                    graph.name);
}

// The checks every recording call starts with (the graph's mutex held).
Status CheckRecording(const GraphObject& graph) {
  if (graph.recorded) return NotRecording(graph);
  if (graph.commands.size() >= TERN_GRAPH_MAX_COMMANDS) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "{} holds {} commands, the most a graph may; record the rest in another "
                      "graph",
                      graph.name, graph.commands.size());
  }
  return OkStatus();
}

// A device buffer range as a copy or fill operand, checked as the queue
// calls check it, against the graph's device when `must_be_local`.
Status DeviceOperand(Runtime* rt, const GraphObject& graph, tern_buffer_t buffer, uint64_t offset,
                     uint64_t size, const char* arg, bool must_be_local, driver::MemoryRef* out) {
  return ResolveDeviceRange(rt, buffer, offset, size, arg, must_be_local ? graph.device : nullptr,
                            "the graph records for", "record into a graph", out);
}

// Appends a recorded command; stores its index in *out_command when not NULL.
void Append(GraphObject& graph, driver::Command command, RecordedCommand recorded,
            uint32_t* out_command) {
  const uint32_t index = static_cast<uint32_t>(graph.commands.size());
  graph.sequence->commands.push_back(std::move(command));
  graph.commands.push_back(std::move(recorded));
  if (out_command != nullptr) *out_command = index;
}

// The body of every recording entry point: clears *out_command, resolves the
// graph, holds its lock, checks it still records, and reports what
// `record(rt, graph)` returns.
template <typename RecordFn>
tern_status_t RecordInto(tern_graph_t graph, uint32_t* out_command, RecordFn&& record) {
  if (out_command != nullptr) *out_command = 0;
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<GraphObject> object;
  TERN_API_TRY(LookupGraph(rt, graph, &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  TERN_API_TRY(CheckRecording(*object));
  return Report(record(rt, *object));
}

Status RecordCopy(Runtime* rt, GraphObject& graph, tern_buffer_t dst, uint64_t dst_offset,
                  void* host_dst, tern_buffer_t src, uint64_t src_offset, const void* host_src,
                  uint64_t size, uint32_t* out_command) {
  driver::Command command;
  command.kind = driver::CommandKind::kCopy;
  command.size = size;
  RecordedCommand recorded;
  const bool d2d = host_dst == nullptr && host_src == nullptr;
  if (host_dst == nullptr) {
    TERN_RETURN_IF_ERROR(
        DeviceOperand(rt, graph, dst, dst_offset, size, "dst", !d2d, &command.dst));
    recorded.operands.push_back(
        RecordedOperand{TERN_GRAPH_OPERAND_DST, 0, dst, size, !d2d, -1, "dst"});
  } else {
    command.dst.host = host_dst;
  }
  if (host_src == nullptr) {
    TERN_RETURN_IF_ERROR(
        DeviceOperand(rt, graph, src, src_offset, size, "src", !d2d, &command.src));
    recorded.operands.push_back(
        RecordedOperand{TERN_GRAPH_OPERAND_SRC, 0, src, size, !d2d, -1, "src"});
  } else {
    command.src.host = const_cast<void*>(host_src);
  }
  if (d2d && command.dst.device != graph.device->hw.get() &&
      command.src.device != graph.device->hw.get()) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "neither dst nor src lives on the graph's device {}; record the copy into a "
                      "graph of one of their devices",
                      graph.device->index);
  }
  Append(graph, std::move(command), std::move(recorded), out_command);
  return OkStatus();
}

// A copy of a recorded command, for a launch that changes it.
driver::Command Clone(const driver::Command& command) {
  driver::Command copy;
  copy.kind = command.kind;
  copy.pattern = command.pattern;
  if (command.details) copy.details = std::make_unique<driver::CommandDetails>(*command.details);
  copy.keep_alive = command.keep_alive;
  copy.dst = command.dst;
  copy.src = command.src;
  copy.size = command.size;
  copy.host_function = command.host_function;
  copy.host_user_data = command.host_user_data;
  copy.timestamp_out = command.timestamp_out;
  copy.host_task = command.host_task;
  return copy;
}

// Where operand `operand` of `command` points.
driver::MemoryRef* OperandRef(driver::Command& command, const RecordedOperand& operand) {
  switch (operand.operand) {
    case TERN_GRAPH_OPERAND_DST:
      return &command.dst;
    case TERN_GRAPH_OPERAND_SRC:
      return &command.src;
    case TERN_GRAPH_OPERAND_INPUT:
      return &command.Details().inputs[operand.index];
    case TERN_GRAPH_OPERAND_OUTPUT:
      return &command.Details().outputs[operand.index];
  }
  return nullptr;
}

// "command 3 (copy) of graph 'g'"
std::string DescribeCommand(const GraphObject& graph, uint32_t command) {
  return fmt::format("command {} ({}) of {}", command,
                     driver::CommandKindName(graph.recorded->sequence->commands[command].kind),
                     graph.name);
}

Status Finalize(GraphObject& graph) {
  auto recorded = std::make_shared<RecordedGraph>();
  if (graph.scratch_bytes > 0) {
    BufferObject scratch;
    TERN_RETURN_IF_ERROR(
        AllocateDeviceMemory(graph.device, graph.scratch_bytes, 0, TERN_MEMORY_SCRATCH, &scratch)
            .WithContext(fmt::format("reserving the scratch memory of {}", graph.name)));
    recorded->scratch = scratch;
    const driver::MemoryRef ref{nullptr, graph.device->hw.get(), scratch.offset};
    for (uint32_t command : graph.executions_with_scratch) {
      graph.sequence->commands[command].details->scratch = ref;
    }
  }
  // What each launch checks: every distinct buffer (unless all of its uses
  // are rebound by the launch), executable and event.
  std::vector<BufferCheck> buffers;
  std::vector<std::pair<tern_executable_t, uint32_t>> executables;
  std::vector<uint32_t> waits;
  for (uint32_t c = 0; c < graph.commands.size(); ++c) {
    const RecordedCommand& command = graph.commands[c];
    for (const RecordedOperand& operand : command.operands) {
      if (operand.buffer == nullptr) continue;
      auto it = std::find_if(buffers.begin(), buffers.end(), [&](const BufferCheck& check) {
        return check.buffer == operand.buffer;
      });
      if (it == buffers.end()) {
        buffers.push_back(BufferCheck{operand.buffer, c, operand.arg, false, {}});
        it = buffers.end() - 1;
      }
      if (operand.parameter < 0) {
        it->fixed = true;
      } else {
        it->parameters.push_back(static_cast<uint32_t>(operand.parameter));
      }
    }
    if (command.executable != nullptr &&
        std::none_of(executables.begin(), executables.end(),
                     [&](const auto& check) { return check.first == command.executable; })) {
      executables.emplace_back(command.executable, c);
    }
    if (graph.sequence->commands[c].kind == driver::CommandKind::kWait) waits.push_back(c);
  }
  recorded->sequence = graph.sequence;
  recorded->constants = std::move(graph.constants);
  graph.buffer_checks = std::move(buffers);
  graph.executable_checks = std::move(executables);
  graph.wait_commands = std::move(waits);
  graph.recorded = std::move(recorded);
  return OkStatus();
}

// Checks `params` and builds the commands the launch runs instead of the
// recorded ones (arguments, event waits), ascending by index.
Status BuildReplacements(Runtime* rt, const GraphObject& graph,
                         const tern_graph_launch_params_t* params,
                         std::vector<std::pair<uint32_t, driver::Command>>* out,
                         std::vector<bool>* covered) {
  const std::vector<driver::Command>& commands = graph.recorded->sequence->commands;
  uint32_t argument_count = 0;
  const tern_graph_argument_t* arguments = nullptr;
  if (params != nullptr) {
    TERN_RETURN_IF_ERROR(CheckStructSize(params->struct_size, sizeof(tern_graph_launch_params_t),
                                         "tern_graph_launch_params_t"));
    TERN_RETURN_IF_ERROR(CheckNoFlags(params->flags, "tern_graph_launch_params_t"));
    if (params->reserved != 0) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "tern_graph_launch_params_t.reserved is {}; it must be 0",
                        params->reserved);
    }
    argument_count = params->argument_count;
    arguments = params->arguments;
    if (argument_count > 0 && arguments == nullptr) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "params->arguments is NULL but params->argument_count is {}",
                        argument_count);
    }
  }
  if (argument_count > 0) {
    covered->assign(graph.parameters.size(), false);
    // Arguments in command order, so that each command is cloned once.
    std::vector<uint32_t> order(argument_count);
    for (uint32_t a = 0; a < argument_count; ++a) {
      const tern_graph_argument_t& argument = arguments[a];
      if (argument.parameter >= graph.parameters.size()) {
        return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                          "arguments[{}] names parameter {} but {} has {} parameters; mark "
                          "parameters with tern_graph_add_parameter() before finalizing",
                          a, argument.parameter, graph.name, graph.parameters.size());
      }
      if (argument.reserved != 0) {
        return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "arguments[{}].reserved is {}; it must be 0",
                          a, argument.reserved);
      }
      if ((*covered)[argument.parameter]) {
        return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                          "arguments[{}] gives parameter {} a second time; give each parameter "
                          "at most once",
                          a, argument.parameter);
      }
      (*covered)[argument.parameter] = true;
      order[a] = a;
    }
    std::stable_sort(order.begin(), order.end(), [&](uint32_t x, uint32_t y) {
      return graph.parameters[arguments[x].parameter].command <
             graph.parameters[arguments[y].parameter].command;
    });
    // Arguments often name one buffer at many offsets: look each up once in a row.
    tern_buffer_t last_handle = nullptr;
    std::shared_ptr<BufferObject> buffer;
    out->reserve(argument_count + graph.wait_commands.size());
    for (uint32_t a : order) {
      const tern_graph_argument_t& argument = arguments[a];
      const ParameterSlot& slot = graph.parameters[argument.parameter];
      const RecordedOperand& operand = graph.commands[slot.command].operands[slot.operand];
      if (out->empty() || out->back().first != slot.command) {
        out->emplace_back(slot.command, Clone(commands[slot.command]));
      }
      driver::Command& command = out->back().second;
      if (argument.buffer == nullptr && operand.bytes == 0 &&
          (operand.operand == TERN_GRAPH_OPERAND_INPUT ||
           operand.operand == TERN_GRAPH_OPERAND_OUTPUT)) {
        *OperandRef(command, operand) = driver::MemoryRef{nullptr, graph.device->hw.get(), 0};
        continue;  // an empty tensor: nothing to read or write
      }
      // For messages only: "arguments[2] (parameter 5: dst of command 3 (fill) of graph 'g')".
      auto arg = [&] {
        return fmt::format("arguments[{}] (parameter {}: {} of {})", a, argument.parameter,
                           operand.arg, DescribeCommand(graph, slot.command));
      };
      if (!buffer || argument.buffer != last_handle) {
        last_handle = argument.buffer;
        buffer = rt->buffer_table.Lookup(reinterpret_cast<uint64_t>(argument.buffer));
        if (!buffer) return LookupBuffer(rt, argument.buffer, arg().c_str(), &buffer);
      }
      if (argument.offset > buffer->size || operand.bytes > buffer->size - argument.offset) {
        TERN_RETURN_IF_ERROR(
            CheckBufferRange(*buffer, argument.offset, operand.bytes, arg().c_str()));
      }
      if (operand.must_be_local && buffer->device != graph.device) {
        return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                          "{} is a buffer of device {} but the graph runs on device {}; pass a "
                          "buffer of device {}",
                          arg(), buffer->device->index, graph.device->index, graph.device->index);
      }
      *OperandRef(command, operand) =
          driver::MemoryRef{nullptr, buffer->device->hw.get(), buffer->offset + argument.offset};
    }
    // A device-to-device copy needs one end on the graph's device, as rebound.
    for (const auto& [index, command] : *out) {
      if (command.kind == driver::CommandKind::kCopy && command.dst.device != nullptr &&
          command.src.device != nullptr && command.dst.device != graph.device->hw.get() &&
          command.src.device != graph.device->hw.get()) {
        return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                          "the arguments leave neither dst nor src of {} on the graph's device "
                          "{}; pass a buffer of device {} for one of them",
                          DescribeCommand(graph, index), graph.device->index, graph.device->index);
      }
    }
  }
  // Event waits wait on each event's latest recording, as of now.
  if (!graph.wait_commands.empty()) {
    std::vector<std::pair<uint32_t, driver::Command>> waits;
    waits.reserve(graph.wait_commands.size());
    for (uint32_t index : graph.wait_commands) {
      std::shared_ptr<EventObject> event;
      const std::string arg = fmt::format("the event of {}", DescribeCommand(graph, index));
      TERN_RETURN_IF_ERROR(LookupEvent(rt, graph.commands[index].event, arg.c_str(), &event)
                               .WithContext("record a new graph"));
      waits.emplace_back(index, MakeEventWaitCommand(*event));
    }
    // Waits have no parameters: the two lists never name one command twice.
    const size_t middle = out->size();
    for (auto& wait : waits) out->push_back(std::move(wait));
    std::inplace_merge(out->begin(), out->begin() + static_cast<std::ptrdiff_t>(middle), out->end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
  }
  return OkStatus();
}

// Checks that what the graph names, and the launch does not rebind, is live.
Status CheckLive(Runtime* rt, const GraphObject& graph, const std::vector<bool>& covered) {
  for (const BufferCheck& check : graph.buffer_checks) {
    if (!check.fixed) {
      // Every use is a parameter: rebound by this launch, or not.
      bool all_given = !covered.empty();
      for (uint32_t parameter : check.parameters) all_given = all_given && covered[parameter];
      if (all_given) continue;
    }
    if (rt->buffer_table.Peek(reinterpret_cast<uint64_t>(check.buffer)) == nullptr) {
      return MakeStatus(TERN_ERROR_INVALID_HANDLE,
                        "{} names {}, a buffer that was freed; record a new graph, or mark the "
                        "operand as a parameter and pass a live buffer for it",
                        DescribeCommand(graph, check.command), check.arg);
    }
  }
  for (const auto& [executable, command] : graph.executable_checks) {
    const std::string arg = fmt::format("the executable of {}", DescribeCommand(graph, command));
    TERN_RETURN_IF_ERROR(
        CheckExecutableLive(rt, executable, arg.c_str()).WithContext("record a new graph"));
  }
  return OkStatus();
}

Status Launch(Runtime* rt, QueueObject& queue, GraphObject& graph,
              const tern_graph_launch_params_t* params, uint64_t* out_sequence) {
  if (!graph.recorded) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "{} is still recording; finalize it with tern_graph_finalize() first",
                      graph.name);
  }
  if (queue.core->device != graph.device) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} records for device {} but queue '{}' runs on device {}; launch it on a "
                      "queue of device {}",
                      graph.name, graph.device->index, queue.name, queue.core->device->index,
                      graph.device->index);
  }
  std::vector<std::pair<uint32_t, driver::Command>> replacements;
  std::vector<bool> covered;
  TERN_RETURN_IF_ERROR(BuildReplacements(rt, graph, params, &replacements, &covered));
  TERN_RETURN_IF_ERROR(CheckLive(rt, graph, covered));

  driver::Command command;
  command.kind = driver::CommandKind::kSequence;
  driver::CommandDetails& details = command.Details();
  auto launch = std::make_shared<driver::SequenceLaunch>();
  launch->sequence = graph.recorded->sequence;
  launch->replacements = std::move(replacements);
  details.launch = std::move(launch);
  // On another queue than the previous launch: wait for it (the scratch).
  if (graph.last_timeline && graph.last_timeline.get() != queue.completion &&
      graph.last_timeline->value() < graph.last_sequence) {
    details.wait_timeline = graph.last_timeline;
    details.wait_value = graph.last_sequence;
  }
  command.keep_alive = graph.recorded;
  uint64_t sequence = 0;
  TERN_RETURN_IF_ERROR(queue.hw->Submit(std::move(command), &sequence));
  if (graph.last_timeline.get() != queue.completion) graph.last_timeline = queue.hw->completion();
  graph.last_sequence = sequence;
  if (out_sequence != nullptr) *out_sequence = sequence;
  return OkStatus();
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_graph_create(tern_device_t device, const tern_graph_params_t* params,
                                         tern_graph_t* out_graph) {
  TERN_API_CLEAR_OUT(out_graph, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  DeviceObject* dev;
  TERN_API_TRY(LookupDevice(rt, device, "device", &dev));
  std::string name;
  if (params != nullptr) {
    TERN_API_TRY(
        CheckStructSize(params->struct_size, sizeof(tern_graph_params_t), "tern_graph_params_t"));
    TERN_API_TRY(CheckNoFlags(params->flags, "tern_graph_params_t"));
    if (params->name != nullptr) name = params->name;
  }
  auto graph = std::make_shared<GraphObject>();
  graph->device = dev;
  if (name.empty()) name = fmt::format("g{}", graph_counter.fetch_add(1));
  graph->given_name = name;
  graph->name = fmt::format("graph '{}'", name);
  graph->sequence->name = graph->name;
  const uint64_t handle = rt->graph_table.Insert(std::move(graph));
  if (handle == 0) return Report(HandleTableFull("graphs"));
  *out_graph = reinterpret_cast<tern_graph_t>(handle);
  return TERN_OK;
}

TERN_API tern_status_t tern_graph_destroy(tern_graph_t graph) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  // Launches in flight hold the recorded commands and the scratch.
  if (!rt->graph_table.Remove(reinterpret_cast<uint64_t>(graph))) {
    return Report(NotALiveHandleToDestroy("graph", "graph", "already destroyed", "never created"));
  }
  return TERN_OK;
}

TERN_API tern_status_t tern_graph_add_copy_h2d(tern_graph_t graph, tern_buffer_t dst,
                                               uint64_t dst_offset, const void* src, uint64_t size,
                                               uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime* rt, GraphObject& g) {
    if (src == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "src is NULL");
    return RecordCopy(rt, g, dst, dst_offset, nullptr, nullptr, 0, src, size, out_command);
  });
}

TERN_API tern_status_t tern_graph_add_copy_d2h(tern_graph_t graph, void* dst, tern_buffer_t src,
                                               uint64_t src_offset, uint64_t size,
                                               uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime* rt, GraphObject& g) {
    if (dst == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "dst is NULL");
    return RecordCopy(rt, g, nullptr, 0, dst, src, src_offset, nullptr, size, out_command);
  });
}

TERN_API tern_status_t tern_graph_add_copy_d2d(tern_graph_t graph, tern_buffer_t dst,
                                               uint64_t dst_offset, tern_buffer_t src,
                                               uint64_t src_offset, uint64_t size,
                                               uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime* rt, GraphObject& g) {
    return RecordCopy(rt, g, dst, dst_offset, nullptr, src, src_offset, nullptr, size, out_command);
  });
}

TERN_API tern_status_t tern_graph_add_fill(tern_graph_t graph, tern_buffer_t dst,
                                           uint64_t dst_offset, uint64_t size, uint32_t pattern,
                                           uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime* rt, GraphObject& g) {
    if (dst_offset % 4 != 0 || size % 4 != 0) {
      return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                        "fill offset {} and size {} must be multiples of 4 (the pattern is 32-bit)",
                        dst_offset, size);
    }
    driver::Command command;
    command.kind = driver::CommandKind::kFill;
    command.size = size;
    command.pattern = pattern;
    TERN_RETURN_IF_ERROR(DeviceOperand(rt, g, dst, dst_offset, size, "dst", true, &command.dst));
    RecordedCommand recorded;
    recorded.operands.push_back(
        RecordedOperand{TERN_GRAPH_OPERAND_DST, 0, dst, size, true, -1, "dst"});
    Append(g, std::move(command), std::move(recorded), out_command);
    return OkStatus();
  });
}

TERN_API tern_status_t tern_graph_add_execute(tern_graph_t graph, tern_executable_t executable,
                                              uint32_t function, const tern_binding_t* inputs,
                                              uint32_t input_count, const tern_binding_t* outputs,
                                              uint32_t output_count, uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime* rt, GraphObject& g) {
    PreparedExecution prepared;
    TERN_RETURN_IF_ERROR(PrepareExecution(rt, g.device, "the graph records for", executable,
                                          function, inputs, input_count, outputs, output_count,
                                          &prepared));
    const driver::Function& f = prepared.command.details->program->functions[function];
    RecordedCommand recorded;
    recorded.executable = executable;
    for (uint32_t i = 0; i < input_count; ++i) {
      recorded.operands.push_back(
          RecordedOperand{TERN_GRAPH_OPERAND_INPUT, i, inputs[i].buffer, f.inputs[i].size_bytes,
                          true, -1, fmt::format("inputs[{}] ('{}')", i, f.inputs[i].name)});
    }
    for (uint32_t i = 0; i < output_count; ++i) {
      recorded.operands.push_back(
          RecordedOperand{TERN_GRAPH_OPERAND_OUTPUT, i, outputs[i].buffer, f.outputs[i].size_bytes,
                          true, -1, fmt::format("outputs[{}] ('{}')", i, f.outputs[i].name)});
    }
    if (prepared.scratch_bytes > 0) {
      g.executions_with_scratch.push_back(static_cast<uint32_t>(g.commands.size()));
      g.scratch_bytes = std::max(g.scratch_bytes, prepared.scratch_bytes);
    }
    g.constants.push_back(std::move(prepared.constants));
    Append(g, std::move(prepared.command), std::move(recorded), out_command);
    return OkStatus();
  });
}

TERN_API tern_status_t tern_graph_add_host_callback(tern_graph_t graph,
                                                    tern_host_callback_fn callback, void* user_data,
                                                    uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime*, GraphObject& g) {
    if (callback == nullptr) return NullArgument("callback");
    driver::Command command;
    command.kind = driver::CommandKind::kHostFunction;
    command.host_function = callback;
    command.host_user_data = user_data;
    Append(g, std::move(command), RecordedCommand{}, out_command);
    return OkStatus();
  });
}

TERN_API tern_status_t tern_graph_add_wait_event(tern_graph_t graph, tern_event_t event,
                                                 uint32_t* out_command) {
  return RecordInto(graph, out_command, [&](Runtime* rt, GraphObject& g) {
    std::shared_ptr<EventObject> object;
    TERN_RETURN_IF_ERROR(LookupEvent(rt, event, "event", &object));
    driver::Command command;
    command.kind = driver::CommandKind::kWait;  // resolved at each launch
    RecordedCommand recorded;
    recorded.event = event;
    Append(g, std::move(command), std::move(recorded), out_command);
    return OkStatus();
  });
}

TERN_API tern_status_t tern_graph_add_parameter(tern_graph_t graph, uint32_t command,
                                                tern_graph_operand_t operand, uint32_t index,
                                                uint32_t* out_parameter) {
  TERN_API_CLEAR_OUT(out_parameter, 0);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<GraphObject> object;
  TERN_API_TRY(LookupGraph(rt, graph, &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  if (object->recorded) TERN_API_TRY(NotRecording(*object));
  if (command >= object->commands.size()) {
    return Report(MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                             "command {} does not exist: {} has {} commands (numbered from 0)",
                             command, object->name, object->commands.size()));
  }
  const int32_t raw_operand = static_cast<int32_t>(operand);
  if (raw_operand < TERN_GRAPH_OPERAND_DST || raw_operand > TERN_GRAPH_OPERAND_OUTPUT) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "operand {} is not a tern_graph_operand_t; pass "
                             "TERN_GRAPH_OPERAND_DST, _SRC, _INPUT or _OUTPUT",
                             raw_operand));
  }
  const bool tensor = operand == TERN_GRAPH_OPERAND_INPUT || operand == TERN_GRAPH_OPERAND_OUTPUT;
  if (!tensor && index != 0) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "index is {} but {} takes none; pass 0",
                             index, OperandName(operand)));
  }
  RecordedCommand& recorded = object->commands[command];
  const driver::CommandKind kind = object->sequence->commands[command].kind;
  auto it = std::find_if(
      recorded.operands.begin(), recorded.operands.end(),
      [&](const RecordedOperand& o) { return o.operand == operand && o.index == index; });
  if (it == recorded.operands.end()) {
    if (tensor && kind == driver::CommandKind::kExecute) {
      uint32_t count = 0;
      for (const RecordedOperand& o : recorded.operands) count += o.operand == operand ? 1 : 0;
      return Report(MakeStatus(
          TERN_ERROR_OUT_OF_RANGE, "command {} of {} has {} {}; there is no {} {}", command,
          object->name, count, operand == TERN_GRAPH_OPERAND_INPUT ? "inputs" : "outputs",
          operand == TERN_GRAPH_OPERAND_INPUT ? "input" : "output", index));
    }
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "command {} ({}) of {} has no device operand {}; a copy or fill has "
                             "DST (device destination) and SRC (device source), an execution "
                             "INPUT and OUTPUT",
                             command, driver::CommandKindName(kind), object->name,
                             OperandName(operand)));
  }
  if (it->parameter >= 0) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "{} of command {} of {} is parameter {} already", it->arg, command,
                             object->name, it->parameter));
  }
  const uint32_t parameter = static_cast<uint32_t>(object->parameters.size());
  object->parameters.push_back(
      ParameterSlot{command, static_cast<uint32_t>(it - recorded.operands.begin())});
  it->parameter = parameter;
  *out_parameter = parameter;
  return TERN_OK;
}

TERN_API tern_status_t tern_graph_finalize(tern_graph_t graph) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<GraphObject> object;
  TERN_API_TRY(LookupGraph(rt, graph, &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  if (object->recorded) {
    return Report(
        MakeStatus(TERN_ERROR_FAILED_PRECONDITION, "{} is finalized already", object->name));
  }
  return Report(Finalize(*object));
}

TERN_API tern_status_t tern_graph_get_info(tern_graph_t graph, tern_graph_info_t* out_info) {
  TERN_API_CLEAR_OUT_STRUCT(out_info, tern_graph_info_t);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<GraphObject> object;
  TERN_API_TRY(LookupGraph(rt, graph, &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  out_info->command_count = static_cast<uint32_t>(object->commands.size());
  out_info->parameter_count = static_cast<uint32_t>(object->parameters.size());
  out_info->finalized = object->recorded ? 1 : 0;
  out_info->scratch_bytes = object->scratch_bytes;
  out_info->name = object->given_name.c_str();
  return TERN_OK;
}

TERN_API tern_status_t tern_queue_launch_graph(tern_queue_t queue, tern_graph_t graph,
                                               const tern_graph_launch_params_t* params,
                                               uint64_t* out_sequence) {
  if (out_sequence != nullptr) *out_sequence = 0;
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  QueueObject* q;
  TERN_API_TRY(PeekQueue(rt, queue, "queue", &q));
  std::shared_ptr<GraphObject> object;
  TERN_API_TRY(LookupGraph(rt, graph, &object));
  std::lock_guard<std::mutex> lock(object->mutex);
  return Report(Launch(rt, *q, *object, params, out_sequence));
}

}  // extern "C"
