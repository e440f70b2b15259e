// tern_workload: a process that uses devices the way a job does, so the
// tools tests can watch it from another process. Public C API only.
//
//   tern_workload [--device D] [--cores LIST] [--bytes N] [--all]
//
// Opens cores LIST ("0" or "0,1", default "0") of device D (default 0), or
// every core of every device with --all; allocates N bytes of tensor memory
// per device (default 8 MiB) and writes it; loads a small executable (an
// elementwise add, built with the builder API) per device; creates a queue
// per core; prints "ready <pid>" and then runs batches of fills and one
// execution on every queue until SIGTERM, SIGINT or end of its stdin; then
// shuts tern down and exits 0.
// A failure prints "error: <step>: <status> <message>" and exits 1.
#include <poll.h>
#include <signal.h>
#include <tern/tern.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

void Check(const char* step, tern_status_t status) {
  if (status == TERN_OK) return;
  std::printf("error: %s: %s %s\n", step, tern_status_string(status), tern_last_error_message());
  std::fflush(stdout);
  std::exit(1);
}

[[noreturn]] void Usage() {
  std::fprintf(stderr, "usage: tern_workload [--device D] [--cores LIST] [--bytes N] [--all]\n");
  std::exit(2);
}

bool StdinClosed() {
  pollfd pfd = {STDIN_FILENO, POLLIN, 0};
  if (poll(&pfd, 1, 0) <= 0) return false;
  if (pfd.revents & (POLLHUP | POLLERR)) return true;
  char byte;
  return read(STDIN_FILENO, &byte, 1) == 0;
}

struct Lane {
  tern_core_t core = nullptr;
  tern_queue_t queue = nullptr;
  tern_buffer_t buffer = nullptr;
  tern_executable_t executable = nullptr;
  tern_event_t event = nullptr;
  tern_comm_t comm = nullptr;  // a communicator of this one core
};

// z = x + y over f32[1024]: the executions the tools should see counted.
constexpr int64_t kAddElements = 1024;

tern_executable_t LoadAddExecutable(tern_device_t device) {
  tern_builder_t builder = nullptr;
  Check("tern_builder_create", tern_builder_create(nullptr, &builder));
  const int64_t shape[1] = {kAddElements};
  Check("tern_builder_begin_function", tern_builder_begin_function(builder, "add", nullptr));
  Check("tern_builder_add_input",
        tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 1, shape, nullptr));
  Check("tern_builder_add_input",
        tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 1, shape, nullptr));
  Check("tern_builder_add_output",
        tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 1, shape, nullptr));
  const tern_operand_t operands[3] = {
      {TERN_SEGMENT_OUTPUT, 0, 0, TERN_DTYPE_F32, 1, shape, nullptr},
      {TERN_SEGMENT_INPUT, 0, 0, TERN_DTYPE_F32, 1, shape, nullptr},
      {TERN_SEGMENT_INPUT, 1, 0, TERN_DTYPE_F32, 1, shape, nullptr},
  };
  const int64_t add[1] = {TERN_BINARY_ADD};
  tern_instruction_t instruction = {};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_BINARY;
  instruction.operand_count = 3;
  instruction.operands = operands;
  instruction.int_count = 1;
  instruction.ints = add;
  instruction.debug_op = "workload.add";
  Check("tern_builder_add_instruction", tern_builder_add_instruction(builder, &instruction));
  Check("tern_builder_end_function", tern_builder_end_function(builder));
  void* data = nullptr;
  uint64_t size = 0;
  Check("tern_builder_finish", tern_builder_finish(builder, &data, &size));
  tern_executable_t executable = nullptr;
  Check("tern_executable_load", tern_executable_load(device, data, size, nullptr, &executable));
  tern_builder_free_data(data);
  Check("tern_builder_destroy", tern_builder_destroy(builder));
  return executable;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t device_index = 0;
  std::vector<uint32_t> core_list = {0};
  uint64_t bytes = 8ull << 20;
  bool all = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--all") {
      all = true;
    } else if (i + 1 < argc && arg == "--device") {
      device_index = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (i + 1 < argc && arg == "--bytes") {
      bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (i + 1 < argc && arg == "--cores") {
      core_list.clear();
      std::string list = argv[++i];
      for (size_t begin = 0; begin <= list.size();) {
        size_t comma = list.find(',', begin);
        if (comma == std::string::npos) comma = list.size();
        core_list.push_back(static_cast<uint32_t>(std::stoul(list.substr(begin, comma - begin))));
        begin = comma + 1;
      }
    } else {
      Usage();
    }
  }

  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  Check("tern_init", tern_init(nullptr));
  uint32_t device_count = 0;
  Check("tern_device_count", tern_device_count(&device_count));
  std::vector<uint32_t> devices;
  if (all) {
    for (uint32_t d = 0; d < device_count; ++d) devices.push_back(d);
  } else {
    devices.push_back(device_index);
  }

  std::vector<Lane> lanes;
  std::vector<tern_buffer_t> buffers;
  std::vector<tern_executable_t> executables;
  if (bytes < 3 * kAddElements * sizeof(float)) {
    std::fprintf(stderr, "tern_workload: --bytes must be at least %llu\n",
                 static_cast<unsigned long long>(3 * kAddElements * sizeof(float)));
    return 2;
  }
  std::vector<unsigned char> data(bytes, 0x5a);
  for (uint32_t d : devices) {
    tern_device_t device = nullptr;
    Check("tern_device_get", tern_device_get(d, &device));
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = bytes;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    Check("tern_buffer_alloc", tern_buffer_alloc(device, &params, &buffer));
    Check("tern_buffer_write", tern_buffer_write(buffer, 0, data.data(), bytes));
    buffers.push_back(buffer);
    executables.push_back(LoadAddExecutable(device));
    std::vector<uint32_t> cores = core_list;
    if (all) {
      tern_device_info_t info = {};
      info.struct_size = sizeof(info);
      Check("tern_device_get_info", tern_device_get_info(device, &info));
      cores.clear();
      for (uint32_t c = 0; c < info.core_count; ++c) cores.push_back(c);
    }
    for (uint32_t c : cores) {
      Lane lane;
      lane.buffer = buffer;
      lane.executable = executables.back();
      Check("tern_core_open", tern_core_open(device, c, &lane.core));
      Check("tern_queue_create", tern_queue_create(lane.core, nullptr, &lane.queue));
      Check("tern_event_create", tern_event_create(&lane.event));
      Check("tern_comm_init_all", tern_comm_init_all(&lane.core, 1, nullptr, &lane.comm));
      lanes.push_back(lane);
    }
  }
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);

  // Small fills keep the load light on a 2-CPU machine while the counters grow.
  const uint64_t fill_bytes = std::min<uint64_t>(bytes, 256 * 1024) & ~3ull;
  constexpr uint64_t kVectorBytes = kAddElements * sizeof(float);
  while (!g_stop && !StdinClosed()) {
    for (Lane& lane : lanes) {
      for (int i = 0; i < 8; ++i) {
        Check("tern_queue_fill",
              tern_queue_fill(lane.queue, lane.buffer, 0, fill_bytes, 0x01020304u, nullptr));
      }
      const tern_binding_t inputs[2] = {{lane.buffer, 0}, {lane.buffer, kVectorBytes}};
      const tern_binding_t outputs[1] = {{lane.buffer, 2 * kVectorBytes}};
      Check("tern_queue_execute",
            tern_queue_execute(lane.queue, lane.executable, 0, inputs, 2, outputs, 1, nullptr));
      // An event wait and a collective, so that traces show every kind.
      Check("tern_queue_record_event", tern_queue_record_event(lane.queue, lane.event, nullptr));
      Check("tern_queue_wait_event", tern_queue_wait_event(lane.queue, lane.event, nullptr));
      Check("tern_comm_all_reduce",
            tern_comm_all_reduce(lane.comm, lane.buffer, 2 * kVectorBytes, lane.buffer,
                                 2 * kVectorBytes, kAddElements, TERN_DTYPE_F32, TERN_COMM_SUM,
                                 lane.queue));
    }
    for (Lane& lane : lanes) {
      Check("tern_queue_synchronize", tern_queue_synchronize(lane.queue, TERN_TIMEOUT_INFINITE));
    }
    usleep(2000);
  }

  for (Lane& lane : lanes) {
    Check("tern_comm_destroy", tern_comm_destroy(lane.comm));
    Check("tern_event_destroy", tern_event_destroy(lane.event));
    Check("tern_queue_destroy", tern_queue_destroy(lane.queue));
    Check("tern_core_close", tern_core_close(lane.core));
  }
  for (tern_executable_t executable : executables) {
    Check("tern_executable_unload", tern_executable_unload(executable));
  }
  for (tern_buffer_t buffer : buffers) Check("tern_buffer_free", tern_buffer_free(buffer));
  Check("tern_shutdown", tern_shutdown());
  return 0;
}
