// Executables (include/tern/executable.h): load from memory or a file (all
// validation is in src/executable/loader.cc), introspection, unload, and
// execution on a queue.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "src/executable/loader.h"
#include "src/runtime/api_checks.h"
#include "src/runtime/execution.h"
#include "src/runtime/runtime_state.h"
#include "tern/executable.h"
#include "tern/io_set.h"

namespace tern {

// Where an executable's constants live. Shared by the executable and by the
// executions in flight, so that an unload during an execution is safe.
struct ExecutableConstants {
  DeviceObject* device = nullptr;
  // Loaded from memory: a device allocation (category constants).
  std::optional<BufferObject> buffer;
  // Loaded from a file: the read-only mapping and the bytes charged.
  void* mapping = nullptr;
  size_t mapping_size = 0;
  const uint8_t* host = nullptr;
  uint64_t charged = 0;

  ExecutableConstants() = default;
  ExecutableConstants(const ExecutableConstants&) = delete;
  ExecutableConstants& operator=(const ExecutableConstants&) = delete;
  ~ExecutableConstants() {
    if (buffer) ReleaseBuffer(*buffer);
    if (charged != 0) UnchargeDeviceMemory(device, charged, TERN_MEMORY_CONSTANTS);
    if (mapping != nullptr) munmap(mapping, mapping_size);
  }

  driver::MemoryRef Ref() const {
    if (buffer) return driver::MemoryRef{nullptr, device->hw.get(), buffer->offset};
    if (host != nullptr) return driver::MemoryRef{const_cast<uint8_t*>(host), nullptr, 0};
    return driver::MemoryRef{nullptr, device->hw.get(), 0};  // no constants: never read
  }
};

struct ExecutableObject {
  DeviceObject* device = nullptr;
  std::shared_ptr<const driver::Program> program;
  std::shared_ptr<ExecutableConstants> constants;
};

struct IoSetObject {
  tern_executable_t executable = nullptr;  // looked up at each execution
  DeviceObject* device = nullptr;          // the executable's
  uint32_t function = 0;
  std::mutex mutex;                             // binds and executions of the set, one at a time
  std::vector<tern_binding_t> inputs, outputs;  // guarded by mutex
  std::vector<bool> input_bound, output_bound;  // guarded by mutex
};

namespace {

// What an execution holds until its command completes.
struct ExecutionResources {
  std::shared_ptr<ExecutableConstants> constants;
  std::shared_ptr<QueueScratch> scratch;
};

// The queue's scratch block, at least `bytes` large: the one it holds, or a
// larger one that replaces it (the old one is freed at once when no
// execution holds it, else with the last that does).
Status TakeQueueScratch(QueueObject* queue, uint64_t bytes, const std::string& function,
                        std::shared_ptr<QueueScratch>* out) {
  std::shared_ptr<QueueScratch> outgrown;
  {
    std::lock_guard<std::mutex> lock(queue->scratch_mutex);
    if (queue->scratch && queue->scratch->buffer.size >= bytes) {
      *out = queue->scratch;
      return OkStatus();
    }
    // Freed below, outside the lock, before the larger block is placed.
    if (queue->scratch.use_count() == 1) outgrown = std::move(queue->scratch);
  }
  outgrown.reset();
  BufferObject block;
  TERN_RETURN_IF_ERROR(
      AllocateDeviceMemory(queue->core->device, bytes, 0, TERN_MEMORY_SCRATCH, &block)
          .WithContext(fmt::format("allocating the scratch of function '{}'", function)));
  auto fresh = std::make_shared<QueueScratch>(block);
  std::lock_guard<std::mutex> lock(queue->scratch_mutex);
  // Another thread may have grown it meanwhile: keep the larger.
  if (!queue->scratch || queue->scratch->buffer.size < bytes) queue->scratch = fresh;
  *out = queue->scratch;
  return OkStatus();
}

Status LookupExecutable(Runtime* rt, tern_executable_t handle,
                        std::shared_ptr<ExecutableObject>* out) {
  *out = rt->executable_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (!*out) {
    return NotALiveHandle("executable", "executable", "already unloaded",
                          "load one with tern_executable_load()");
  }
  return OkStatus();
}

// Checks the params and turns them into the loader's options.
Status CheckLoadParams(const tern_executable_load_params_t* params, exe::LoadOptions* options) {
  *options = exe::LoadOptions{};
  if (params == nullptr) return OkStatus();
  TERN_RETURN_IF_ERROR(CheckStructSize(params->struct_size, sizeof(tern_executable_load_params_t),
                                       "tern_executable_load_params_t"));
  TERN_RETURN_IF_ERROR(CheckFlags(params->flags, TERN_EXECUTABLE_LOAD_ALLOW_RACES,
                                  "tern_executable_load_params_t",
                                  "TERN_EXECUTABLE_LOAD_ALLOW_RACES (0x1)"));
  options->allow_races = (params->flags & TERN_EXECUTABLE_LOAD_ALLOW_RACES) != 0;
  return OkStatus();
}

// A load is most often followed by an execution, on the queue that ran the
// device's last execution, else on the device's first queue: that queue gets
// ready for it, the loader paying what the first execution would have paid.
//  - Its engine is roused (driver::HwQueue::ExpectWork). On the simulator
//    that is the futex wake-up of an engine asleep since its last command:
//    25-50 us of the submitter's time on a 2-CPU virtual machine, and the
//    process's first execution of an MLP 104-110 us instead of 133-138
//    (medians of 20 processes each, alternated).
//  - It takes the program's scratch (TakeQueueScratch) and the device maps
//    the scratch's pages: the first execution on a queue allocated it, 11-13
//    us of a first tern_queue_execute that later took 1-2.6 (AMD Zen 5). Up
//    to kScratchTakenAtLoad only: a queue keeps its scratch, and a guess
//    that is wrong should not hold much device memory. Larger scratch is
//    taken and given back at once, its pages mapped: the allocator hands out
//    the range it just freed, so the first execution's scratch is as cheap
//    to touch as a later one's.
// One queue, not all: each sleeping queue woken costs the loader that much.
// Best effort: without memory now, the execution allocates (and reports) as
// it would have.
constexpr uint64_t kScratchTakenAtLoad = uint64_t{16} << 20;

void ReadyTheLikelyQueue(DeviceObject* dev, const driver::Program& program) {
  uint64_t scratch_bytes = 0;
  for (const driver::Function& function : program.functions) {
    scratch_bytes = std::max(scratch_bytes, function.scratch_bytes);
  }
  const QueueObject* last = dev->last_executing_queue.load(std::memory_order_relaxed);
  std::shared_ptr<QueueObject> chosen;
  {
    std::lock_guard<std::mutex> lock(dev->queues_mutex);
    for (const std::weak_ptr<QueueObject>& weak : dev->queues) {
      std::shared_ptr<QueueObject> queue = weak.lock();
      if (!queue || !queue->hw) continue;
      if (!chosen || queue.get() == last) chosen = std::move(queue);
      if (chosen.get() == last) break;
    }
    // Under the lock: a queue leaves the list before its hardware queue goes.
    if (chosen) chosen->hw->ExpectWork();
  }
  if (scratch_bytes == 0) return;
  if (chosen && scratch_bytes <= kScratchTakenAtLoad) {
    std::shared_ptr<QueueScratch> scratch;
    if (TakeQueueScratch(chosen.get(), scratch_bytes, program.functions.front().name, &scratch)
            .ok()) {
      dev->hw->PrefaultMemory(scratch->buffer.offset, scratch->buffer.size);
    }
    return;
  }
  BufferObject scratch;
  if (!AllocateDeviceMemory(dev, scratch_bytes, 0, TERN_MEMORY_SCRATCH, &scratch).ok()) return;
  dev->hw->PrefaultMemory(scratch.offset, scratch_bytes);
  ReleaseBuffer(scratch);
}

Status Insert(Runtime* rt, DeviceObject* dev, exe::ValidatedExecutable validated,
              std::shared_ptr<ExecutableConstants> constants, tern_executable_t* out) {
  auto object = std::make_shared<ExecutableObject>();
  object->device = dev;
  // Prepared while the program is still this load's alone (each load
  // validates its own), with the constants this executable's executions read.
  dev->hw->PrepareProgram(*validated.program, constants->Ref());
  object->program = std::move(validated.program);
  ReadyTheLikelyQueue(dev, *object->program);
  object->constants = std::move(constants);
  const uint64_t handle = rt->executable_table.Insert(std::move(object));
  if (handle == 0) return HandleTableFull("executables");
  *out = reinterpret_cast<tern_executable_t>(handle);
  return OkStatus();
}

Status LoadFromMemory(Runtime* rt, tern_device_t device, const void* data, uint64_t size,
                      const tern_executable_load_params_t* params, tern_executable_t* out) {
  DeviceObject* dev;
  TERN_RETURN_IF_ERROR(LookupDevice(rt, device, "device", &dev));
  exe::LoadOptions options;
  TERN_RETURN_IF_ERROR(CheckLoadParams(params, &options));
  options.device_memory_bytes = dev->info.memory_bytes;  // no segment may be larger
  if (data == nullptr && size > 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "data is NULL but size is {}", size);
  }
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(data), size);
  exe::ValidatedExecutable validated;
  TERN_RETURN_IF_ERROR(exe::ValidateExecutable(bytes, &validated, options));
  auto constants = std::make_shared<ExecutableConstants>();
  constants->device = dev;
  const uint64_t constants_bytes = validated.program->constants_bytes;
  if (constants_bytes > 0) {
    BufferObject buffer;
    TERN_RETURN_IF_ERROR(
        AllocateDeviceMemory(dev, constants_bytes, 4096, TERN_MEMORY_CONSTANTS, &buffer)
            .WithContext("loading the executable's constants"));
    constants->buffer = buffer;
    driver::Command copy;
    copy.kind = driver::CommandKind::kCopy;
    copy.size = constants_bytes;
    copy.dst = driver::MemoryRef{nullptr, dev->hw.get(), buffer.offset};
    copy.src = driver::MemoryRef{const_cast<uint8_t*>(bytes.data() + validated.constants_offset),
                                 nullptr, 0};
    TERN_RETURN_IF_ERROR(
        dev->hw->ExecuteSync(copy).WithContext("copying the executable's constants to the device"));
  }
  return Insert(rt, dev, std::move(validated), std::move(constants), out);
}

Status LoadFromFile(Runtime* rt, tern_device_t device, const char* path,
                    const tern_executable_load_params_t* params, tern_executable_t* out) {
  DeviceObject* dev;
  TERN_RETURN_IF_ERROR(LookupDevice(rt, device, "device", &dev));
  exe::LoadOptions options;
  TERN_RETURN_IF_ERROR(CheckLoadParams(params, &options));
  options.device_memory_bytes = dev->info.memory_bytes;  // no segment may be larger
  if (path == nullptr) return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "path is NULL");
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("opening the executable '{}'", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(TERN_ERROR_IO, err, fmt::format("reading the size of '{}'", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "'{}' is not a regular file", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    exe::ValidatedExecutable ignored;
    return exe::ValidateExecutable({}, &ignored).WithContext(fmt::format("loading '{}'", path));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) {
    return ErrnoStatus(TERN_ERROR_IO, map_errno, fmt::format("mapping '{}'", path));
  }
  auto constants = std::make_shared<ExecutableConstants>();
  constants->device = dev;
  constants->mapping = mapping;  // unmapped by the destructor on every path
  constants->mapping_size = size;
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(mapping), size);
  // Validation reads the whole file once, in order.
  ::madvise(mapping, size, MADV_SEQUENTIAL);
  exe::ValidatedExecutable validated;
  TERN_RETURN_IF_ERROR(exe::ValidateExecutable(bytes, &validated, options)
                           .WithContext(fmt::format("loading '{}'", path)));
  ::madvise(mapping, size, MADV_NORMAL);
  const uint64_t constants_bytes = validated.program->constants_bytes;
  if (constants_bytes > 0) {
    TERN_RETURN_IF_ERROR(ChargeDeviceMemory(dev, constants_bytes, TERN_MEMORY_CONSTANTS)
                             .WithContext(fmt::format("loading the constants of '{}'", path)));
    constants->charged = constants_bytes;
    constants->host = bytes.data() + validated.constants_offset;
  } else {
    // Everything the executable needs was copied out: drop the mapping now.
    ::munmap(mapping, size);
    constants->mapping = nullptr;
  }
  return Insert(rt, dev, std::move(validated), std::move(constants), out);
}

// Function `function` of `object`, or OUT_OF_RANGE.
Status GetFunction(const ExecutableObject& object, uint32_t function,
                   const driver::Function** out) {
  const auto& functions = object.program->functions;
  if (function >= functions.size()) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                      "function {} does not exist: the executable has {} functions", function,
                      functions.size());
  }
  *out = &functions[function];
  return OkStatus();
}

// Resolves binding `index` of the inputs or outputs to device memory.
Status Bind(Runtime* rt, DeviceObject* dev, const char* place,
            const driver::TensorSignature& tensor, const tern_binding_t& binding, bool input,
            uint32_t index, driver::MemoryRef* out) {
  auto arg = [&] {
    return fmt::format("{}[{}] ('{}')", input ? "inputs" : "outputs", index, tensor.name);
  };
  if (binding.buffer == nullptr && tensor.size_bytes == 0) {
    *out = driver::MemoryRef{nullptr, dev->hw.get(), 0};  // nothing to read or write
    return OkStatus();
  }
  // The argument's name is formatted only for an error: this runs for every
  // binding of every execution.
  std::shared_ptr<BufferObject> buffer =
      rt->buffer_table.Lookup(reinterpret_cast<uint64_t>(binding.buffer));
  if (!buffer) TERN_RETURN_IF_ERROR(LookupBuffer(rt, binding.buffer, arg().c_str(), &buffer));
  if (buffer->device != dev) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "{} is a buffer of device {} but {} device {}; bind buffers of device {} "
                      "(copy the data there first)",
                      arg(), buffer->device->index, place, dev->index, dev->index);
  }
  if (binding.offset > buffer->size || tensor.size_bytes > buffer->size - binding.offset) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                      "{}: the tensor needs {} bytes at offset {} but the buffer has {} bytes; "
                      "bind a larger buffer or a smaller offset",
                      arg(), tensor.size_bytes, binding.offset, buffer->size);
  }
  *out = driver::MemoryRef{nullptr, dev->hw.get(), buffer->offset + binding.offset};
  return OkStatus();
}

}  // namespace

Status PrepareExecution(Runtime* rt, DeviceObject* dev, const char* place,
                        tern_executable_t executable_handle, uint32_t function_index,
                        const tern_binding_t* inputs, uint32_t input_count,
                        const tern_binding_t* outputs, uint32_t output_count,
                        PreparedExecution* out) {
  std::shared_ptr<ExecutableObject> executable;
  TERN_RETURN_IF_ERROR(LookupExecutable(rt, executable_handle, &executable));
  if (executable->device != dev) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "the executable is loaded on device {} but {} device {}; load it on device "
                      "{} too",
                      executable->device->index, place, dev->index, dev->index);
  }
  const driver::Function* function_object = nullptr;
  TERN_RETURN_IF_ERROR(GetFunction(*executable, function_index, &function_object));
  const driver::Function& function = *function_object;
  if (input_count != function.inputs.size() || output_count != function.outputs.size()) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "function '{}' has {} inputs and {} outputs, but {} and {} bindings were "
                      "given; bind every input and output, in order",
                      function.name, function.inputs.size(), function.outputs.size(), input_count,
                      output_count);
  }
  if ((input_count > 0 && inputs == nullptr) || (output_count > 0 && outputs == nullptr)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "{} is NULL but function '{}' has {} of them",
                      inputs == nullptr && input_count > 0 ? "inputs" : "outputs", function.name,
                      inputs == nullptr && input_count > 0 ? input_count : output_count);
  }
  driver::Command& command = out->command;
  command = driver::Command{};
  command.kind = driver::CommandKind::kExecute;
  driver::CommandDetails& run = command.Details();
  run.program = executable->program;
  run.function = function_index;
  run.inputs.resize(input_count);
  run.outputs.resize(output_count);
  for (uint32_t i = 0; i < input_count; ++i) {
    TERN_RETURN_IF_ERROR(
        Bind(rt, dev, place, function.inputs[i], inputs[i], true, i, &run.inputs[i]));
  }
  for (uint32_t i = 0; i < output_count; ++i) {
    TERN_RETURN_IF_ERROR(
        Bind(rt, dev, place, function.outputs[i], outputs[i], false, i, &run.outputs[i]));
  }
  run.constants = executable->constants->Ref();
  run.scratch = driver::MemoryRef{nullptr, dev->hw.get(), 0};  // never read without scratch
  out->scratch_bytes = function.scratch_bytes;
  out->constants = executable->constants;
  return OkStatus();
}

Status CheckExecutableLive(Runtime* rt, tern_executable_t executable, const char* arg) {
  if (rt->executable_table.Peek(reinterpret_cast<uint64_t>(executable)) != nullptr) {
    return OkStatus();
  }
  return NotALiveHandle(arg, "executable", "already unloaded",
                        "load one with tern_executable_load()");
}

namespace {

Status Execute(Runtime* rt, tern_queue_t queue_handle, tern_executable_t executable_handle,
               uint32_t function_index, const tern_binding_t* inputs, uint32_t input_count,
               const tern_binding_t* outputs, uint32_t output_count, uint64_t* out_sequence) {
  std::shared_ptr<QueueObject> queue;
  TERN_RETURN_IF_ERROR(LookupQueue(rt, queue_handle, "queue", &queue));
  DeviceObject* dev = queue->core->device;
  PreparedExecution prepared;
  TERN_RETURN_IF_ERROR(PrepareExecution(rt, dev, "the queue runs on", executable_handle,
                                        function_index, inputs, input_count, outputs, output_count,
                                        &prepared));
  driver::Command& command = prepared.command;
  driver::CommandDetails& run = command.Details();
  if (prepared.scratch_bytes > 0) {
    auto resources = std::make_shared<ExecutionResources>();
    resources->constants = std::static_pointer_cast<ExecutableConstants>(prepared.constants);
    TERN_RETURN_IF_ERROR(TakeQueueScratch(queue.get(), prepared.scratch_bytes,
                                          run.program->functions[run.function].name,
                                          &resources->scratch));
    run.scratch = driver::MemoryRef{nullptr, dev->hw.get(), resources->scratch->buffer.offset};
    command.keep_alive = std::move(resources);
  } else {
    // Nothing to release at completion but a reference: no allocation.
    run.constants_owner = std::move(prepared.constants);
  }
  uint64_t sequence = 0;
  TERN_RETURN_IF_ERROR(queue->hw->Submit(std::move(command), &sequence));
  // Written only when it changes: executions on several queues from
  // several threads would otherwise pass the line between their CPUs.
  if (dev->last_executing_queue.load(std::memory_order_relaxed) != queue.get()) {
    dev->last_executing_queue.store(queue.get(), std::memory_order_relaxed);
  }
  if (out_sequence != nullptr) *out_sequence = sequence;
  return OkStatus();
}

Status GetExecutable(tern_executable_t executable, std::shared_ptr<ExecutableObject>* out) {
  Runtime* rt;
  TERN_RETURN_IF_ERROR(GetRuntime(&rt));
  return LookupExecutable(rt, executable, out);
}

// OK when `is_output` selects inputs (0) or outputs (1).
Status CheckIsOutput(int is_output) {
  if (is_output == 0 || is_output == 1) return OkStatus();
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                    "is_output is {}; pass 0 for an input or 1 for an output", is_output);
}

// The names of `items` (functions or tensors), quoted, at most 16 and "..."
// after them, or "none": what a failed lookup by name lists.
template <typename Item>
std::string QuotedNames(const std::vector<Item>& items) {
  std::string names;
  for (size_t i = 0; i < items.size() && i < 16; ++i) {
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", items[i].name);
  }
  if (items.size() > 16) names += ", ...";
  return names.empty() ? "none" : names;
}

}  // namespace
}  // namespace tern

extern "C" {

using namespace tern;

TERN_API tern_status_t tern_executable_load(tern_device_t device, const void* data, uint64_t size,
                                            const tern_executable_load_params_t* params,
                                            tern_executable_t* out_executable) {
  TERN_API_CLEAR_OUT(out_executable, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(LoadFromMemory(rt, device, data, size, params, out_executable));
}

TERN_API tern_status_t tern_executable_load_file(tern_device_t device, const char* path,
                                                 const tern_executable_load_params_t* params,
                                                 tern_executable_t* out_executable) {
  TERN_API_CLEAR_OUT(out_executable, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(LoadFromFile(rt, device, path, params, out_executable));
}

TERN_API tern_status_t tern_executable_unload(tern_executable_t executable) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  // The constants go when the last execution holding them completes.
  if (!rt->executable_table.Remove(reinterpret_cast<uint64_t>(executable))) {
    return Report(
        NotALiveHandleToDestroy("executable", "executable", "already unloaded", "never loaded"));
  }
  return TERN_OK;
}

TERN_API tern_status_t tern_executable_function_count(tern_executable_t executable,
                                                      uint32_t* out_count) {
  TERN_API_CLEAR_OUT(out_count, 0);
  std::shared_ptr<ExecutableObject> object;
  TERN_API_TRY(GetExecutable(executable, &object));
  *out_count = static_cast<uint32_t>(object->program->functions.size());
  return TERN_OK;
}

TERN_API tern_status_t tern_executable_find_function(tern_executable_t executable, const char* name,
                                                     uint32_t* out_function) {
  TERN_API_CLEAR_OUT(out_function, 0);
  std::shared_ptr<ExecutableObject> object;
  TERN_API_TRY(GetExecutable(executable, &object));
  TERN_API_CHECK_NOT_NULL(name);
  const auto& functions = object->program->functions;
  for (size_t i = 0; i < functions.size(); ++i) {
    if (functions[i].name == name) {
      *out_function = static_cast<uint32_t>(i);
      return TERN_OK;
    }
  }
  return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                           "the executable has no function named '{}'; it has {}", name,
                           QuotedNames(functions)));
}

TERN_API tern_status_t tern_executable_find_tensor(tern_executable_t executable, uint32_t function,
                                                   int is_output, const char* name,
                                                   uint32_t* out_index) {
  TERN_API_CLEAR_OUT(out_index, 0);
  std::shared_ptr<ExecutableObject> object;
  TERN_API_TRY(GetExecutable(executable, &object));
  TERN_API_CHECK_NOT_NULL(name);
  const driver::Function* f = nullptr;
  TERN_API_TRY(CheckIsOutput(is_output));
  TERN_API_TRY(GetFunction(*object, function, &f));
  const auto& tensors = is_output ? f->outputs : f->inputs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) {
      *out_index = static_cast<uint32_t>(i);
      return TERN_OK;
    }
  }
  return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                           "function '{}' has no {} named '{}'; its {} are {}", f->name,
                           is_output ? "output" : "input", name, is_output ? "outputs" : "inputs",
                           QuotedNames(tensors)));
}

TERN_API tern_status_t tern_executable_function_info(tern_executable_t executable,
                                                     uint32_t function,
                                                     tern_function_info_t* out_info) {
  TERN_API_CLEAR_OUT_STRUCT(out_info, tern_function_info_t);
  std::shared_ptr<ExecutableObject> object;
  const driver::Function* function_object = nullptr;
  TERN_API_TRY(GetExecutable(executable, &object));
  TERN_API_TRY(GetFunction(*object, function, &function_object));
  const driver::Function& f = *function_object;
  out_info->input_count = static_cast<uint32_t>(f.inputs.size());
  out_info->output_count = static_cast<uint32_t>(f.outputs.size());
  out_info->instruction_count = f.instruction_count;
  out_info->scratch_bytes = f.scratch_bytes;
  out_info->name = f.name.c_str();
  return TERN_OK;
}

TERN_API tern_status_t tern_executable_tensor_info(tern_executable_t executable, uint32_t function,
                                                   int is_output, uint32_t index,
                                                   tern_tensor_info_t* out_info) {
  TERN_API_CLEAR_OUT_STRUCT(out_info, tern_tensor_info_t);
  std::shared_ptr<ExecutableObject> object;
  const driver::Function* function_object = nullptr;
  TERN_API_TRY(GetExecutable(executable, &object));
  TERN_API_TRY(CheckIsOutput(is_output));
  TERN_API_TRY(GetFunction(*object, function, &function_object));
  const driver::Function& f = *function_object;
  const auto& tensors = is_output ? f.outputs : f.inputs;
  if (index >= tensors.size()) {
    return Report(MakeStatus(TERN_ERROR_OUT_OF_RANGE, "function '{}' has {} {}; there is no {} {}",
                             f.name, tensors.size(), is_output ? "outputs" : "inputs",
                             is_output ? "output" : "input", index));
  }
  const driver::TensorSignature& tensor = tensors[index];
  out_info->dtype = tensor.dtype;
  out_info->rank = tensor.rank;
  out_info->reserved = 0;
  for (uint32_t i = 0; i < TERN_MAX_RANK; ++i)
    out_info->shape[i] = i < tensor.rank ? tensor.shape[i] : 0;
  out_info->size_bytes = tensor.size_bytes;
  out_info->name = tensor.name.c_str();
  return TERN_OK;
}

TERN_API tern_status_t tern_queue_execute(tern_queue_t queue, tern_executable_t executable,
                                          uint32_t function, const tern_binding_t* inputs,
                                          uint32_t input_count, const tern_binding_t* outputs,
                                          uint32_t output_count, uint64_t* out_sequence) {
  if (out_sequence != nullptr) *out_sequence = 0;
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  return Report(Execute(rt, queue, executable, function, inputs, input_count, outputs, output_count,
                        out_sequence));
}

TERN_API tern_status_t tern_io_set_create(tern_executable_t executable, const char* function,
                                          tern_io_set_t* out_set) {
  TERN_API_CLEAR_OUT(out_set, nullptr);
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<ExecutableObject> object;
  TERN_API_TRY(LookupExecutable(rt, executable, &object));
  const auto& functions = object->program->functions;
  uint32_t index = 0;
  if (function != nullptr) {
    while (index < functions.size() && functions[index].name != function) ++index;
    if (index == functions.size()) {
      return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                               "the executable has no function named '{}'; its functions are {}",
                               function, QuotedNames(functions)));
    }
  } else if (functions.empty()) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "the executable has no functions"));
  }
  auto set = std::make_shared<IoSetObject>();
  set->executable = executable;
  set->device = object->device;
  set->function = index;
  const driver::Function& f = functions[index];
  set->inputs.assign(f.inputs.size(), tern_binding_t{nullptr, 0});
  set->outputs.assign(f.outputs.size(), tern_binding_t{nullptr, 0});
  set->input_bound.assign(f.inputs.size(), false);
  set->output_bound.assign(f.outputs.size(), false);
  const uint64_t handle = rt->io_set_table.Insert(std::move(set));
  if (handle == 0) return Report(HandleTableFull("I/O sets"));
  *out_set = reinterpret_cast<tern_io_set_t>(handle);
  return TERN_OK;
}

}  // extern "C"

// Helpers of the functions below, outside the C block: they return C++ types.
namespace tern {
namespace {

Status LookupIoSet(Runtime* rt, tern_io_set_t handle, std::shared_ptr<IoSetObject>* out) {
  *out = rt->io_set_table.Lookup(reinterpret_cast<uint64_t>(handle));
  if (!*out) {
    return NotALiveHandle("set", "I/O set", "already destroyed",
                          "create one with tern_io_set_create()");
  }
  return OkStatus();
}

}  // namespace
}  // namespace tern

extern "C" {

TERN_API tern_status_t tern_io_set_bind(tern_io_set_t set, int is_output, const char* name,
                                        tern_buffer_t buffer, uint64_t offset) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<IoSetObject> object;
  TERN_API_TRY(LookupIoSet(rt, set, &object));
  TERN_API_TRY(CheckIsOutput(is_output));
  TERN_API_CHECK_NOT_NULL(name);
  std::shared_ptr<ExecutableObject> executable;
  TERN_API_TRY(LookupExecutable(rt, object->executable, &executable));
  const driver::Function& f = executable->program->functions[object->function];
  const auto& tensors = is_output ? f.outputs : f.inputs;
  size_t index = 0;
  while (index < tensors.size() && tensors[index].name != name) ++index;
  if (index == tensors.size()) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "function '{}' has no {} named '{}'; its {} are {}", f.name,
                             is_output ? "output" : "input", name, is_output ? "outputs" : "inputs",
                             QuotedNames(tensors)));
  }
  const driver::TensorSignature& tensor = tensors[index];
  std::shared_ptr<BufferObject> buffer_object;
  const std::string arg =
      fmt::format("the buffer for {} '{}'", is_output ? "output" : "input", tensor.name);
  TERN_API_TRY(LookupBuffer(rt, buffer, arg.c_str(), &buffer_object));
  if (buffer_object->device != object->device) {
    return Report(MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                             "{} is on device {} but the executable is loaded on device {}; bind "
                             "a buffer of device {}",
                             arg, buffer_object->device->index, object->device->index,
                             object->device->index));
  }
  if (offset > buffer_object->size || tensor.size_bytes > buffer_object->size - offset) {
    return Report(MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                             "{}: the tensor needs {} bytes at offset {} but the buffer has {} "
                             "bytes; bind a larger buffer or a smaller offset",
                             arg, tensor.size_bytes, offset, buffer_object->size));
  }
  std::lock_guard<std::mutex> lock(object->mutex);
  auto& bindings = is_output ? object->outputs : object->inputs;
  auto& bound = is_output ? object->output_bound : object->input_bound;
  bindings[index] = tern_binding_t{buffer, offset};
  bound[index] = true;
  return TERN_OK;
}

TERN_API tern_status_t tern_queue_execute_io_set(tern_queue_t queue, tern_io_set_t set,
                                                 uint64_t* out_sequence) {
  if (out_sequence != nullptr) *out_sequence = 0;
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  std::shared_ptr<IoSetObject> object;
  TERN_API_TRY(LookupIoSet(rt, set, &object));
  std::shared_ptr<ExecutableObject> executable;
  TERN_API_TRY(LookupExecutable(rt, object->executable, &executable));
  const driver::Function& f = executable->program->functions[object->function];
  std::lock_guard<std::mutex> lock(object->mutex);
  std::string unbound;
  auto list_unbound = [&](const auto& tensors, const std::vector<bool>& bound, const char* kind) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (bound[i] || tensors[i].size_bytes == 0) continue;
      unbound += fmt::format("{}{} '{}'", unbound.empty() ? "" : ", ", kind, tensors[i].name);
    }
  };
  list_unbound(f.inputs, object->input_bound, "input");
  list_unbound(f.outputs, object->output_bound, "output");
  if (!unbound.empty()) {
    return Report(MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                             "the I/O set of function '{}' has nothing bound to {}; bind them "
                             "with tern_io_set_bind() first",
                             f.name, unbound));
  }
  TERN_API_TRY(Execute(rt, queue, object->executable, object->function, object->inputs.data(),
                       static_cast<uint32_t>(object->inputs.size()), object->outputs.data(),
                       static_cast<uint32_t>(object->outputs.size()), out_sequence));
  return TERN_OK;
}

TERN_API tern_status_t tern_io_set_destroy(tern_io_set_t set) {
  Runtime* rt;
  TERN_API_TRY(GetRuntime(&rt));
  if (!rt->io_set_table.Remove(reinterpret_cast<uint64_t>(set))) {
    return Report(NotALiveHandle("set", "I/O set", "already destroyed",
                                 "create one with tern_io_set_create()"));
  }
  return TERN_OK;
}

}  // extern "C"
