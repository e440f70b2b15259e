// CTS: graphs (graph.h): recording copies, fills, executions, host
// callbacks and event waits; launching them with recorded and rebound
// operands; ordering, failures, and launches that must be refused because
// what the graph names is gone. (The handle, state and argument checks of
// every function are in negative_test.cc.)
#include <cstring>
#include <thread>

#include "cts_fixture.h"
#include "cts_negative_util.h"

namespace tern::cts {
namespace {

constexpr auto kEnterTimeout = std::chrono::milliseconds(10000);
const int64_t kShape[2] = {4, 8};  // 32 floats
constexpr uint32_t kFloats = 32;
constexpr uint64_t kTensorBytes = kFloats * sizeof(float);

tern_operand_t Operand(tern_segment_t segment, uint32_t index) {
  tern_operand_t operand{};
  operand.segment = segment;
  operand.index = index;
  operand.dtype = TERN_DTYPE_F32;
  operand.rank = 2;
  operand.shape = kShape;
  return operand;
}

// An executable with one function "add": z = x + y, f32 [4, 8].
std::vector<uint8_t> BuildAdd() {
  tern_builder_t builder = nullptr;
  EXPECT_EQ(TERN_OK, tern_builder_create(nullptr, &builder));
  EXPECT_EQ(TERN_OK, tern_builder_begin_function(builder, "add", nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, kShape, nullptr));
  const tern_operand_t operands[3] = {Operand(TERN_SEGMENT_OUTPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 0),
                                      Operand(TERN_SEGMENT_INPUT, 1)};
  const int64_t ints[1] = {TERN_BINARY_ADD};
  tern_instruction_t instruction{};
  instruction.struct_size = sizeof(instruction);
  instruction.opcode = TERN_OP_BINARY;
  instruction.operand_count = 3;
  instruction.operands = operands;
  instruction.int_count = 1;
  instruction.ints = ints;
  EXPECT_EQ(TERN_OK, tern_builder_add_instruction(builder, &instruction))
      << tern_last_error_message();
  EXPECT_EQ(TERN_OK, tern_builder_end_function(builder));
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(TERN_OK, tern_builder_finish(builder, &data, &size));
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  EXPECT_EQ(TERN_OK, tern_builder_destroy(builder));
  return bytes;
}

// "twice_plus": s = x + x into scratch, then z = s + y: needs 128 bytes of
// scratch per execution.
std::vector<uint8_t> BuildWithScratch() {
  tern_builder_t builder = nullptr;
  EXPECT_EQ(TERN_OK, tern_builder_create(nullptr, &builder));
  EXPECT_EQ(TERN_OK, tern_builder_begin_function(builder, "twice_plus", nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_input(builder, "x", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_input(builder, "y", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_add_output(builder, "z", TERN_DTYPE_F32, 2, kShape, nullptr));
  EXPECT_EQ(TERN_OK, tern_builder_set_scratch(builder, kTensorBytes));
  const int64_t ints[1] = {TERN_BINARY_ADD};
  const tern_operand_t first[3] = {Operand(TERN_SEGMENT_SCRATCH, 0), Operand(TERN_SEGMENT_INPUT, 0),
                                   Operand(TERN_SEGMENT_INPUT, 0)};
  const tern_operand_t second[3] = {Operand(TERN_SEGMENT_OUTPUT, 0),
                                    Operand(TERN_SEGMENT_SCRATCH, 0),
                                    Operand(TERN_SEGMENT_INPUT, 1)};
  for (const tern_operand_t* operands : {first, second}) {
    tern_instruction_t instruction{};
    instruction.struct_size = sizeof(instruction);
    instruction.opcode = TERN_OP_BINARY;
    instruction.operand_count = 3;
    instruction.operands = operands;
    instruction.int_count = 1;
    instruction.ints = ints;
    EXPECT_EQ(TERN_OK, tern_builder_add_instruction(builder, &instruction))
        << tern_last_error_message();
  }
  EXPECT_EQ(TERN_OK, tern_builder_end_function(builder));
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(TERN_OK, tern_builder_finish(builder, &data, &size)) << tern_last_error_message();
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  tern_builder_free_data(data);
  EXPECT_EQ(TERN_OK, tern_builder_destroy(builder));
  return bytes;
}

std::vector<float> Floats(float start) {
  std::vector<float> values(kFloats);
  for (uint32_t i = 0; i < kFloats; ++i) values[i] = start + static_cast<float>(i);
  return values;
}

class GraphTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    core_ = OpenCore(0, 0);
    ASSERT_NE(nullptr, core_);
    queue_ = CreateQueue(core_, "cts-graph");
    ASSERT_NE(nullptr, queue_);
  }

  tern_graph_t CreateGraph(const char* name = nullptr, uint32_t device_index = 0) {
    tern_graph_params_t params{};
    params.struct_size = sizeof(params);
    params.name = name;
    tern_graph_t graph = nullptr;
    EXPECT_EQ(TERN_OK, tern_graph_create(device(device_index), &params, &graph))
        << tern_last_error_message();
    return graph;
  }

  tern_graph_info_t Info(tern_graph_t graph) {
    tern_graph_info_t info{};
    info.struct_size = sizeof(info);
    CTS_EXPECT_OK(tern_graph_get_info(graph, &info));
    return info;
  }

  tern_executable_t LoadAdd(uint32_t device_index = 0) {
    const std::vector<uint8_t> bytes = BuildAdd();
    tern_executable_t executable = nullptr;
    EXPECT_EQ(TERN_OK, tern_executable_load(device(device_index), bytes.data(), bytes.size(),
                                            nullptr, &executable))
        << tern_last_error_message();
    return executable;
  }

  std::vector<float> ReadFloats(tern_buffer_t buffer, uint64_t offset = 0) {
    std::vector<float> values(kFloats);
    CTS_EXPECT_OK(tern_buffer_read(buffer, offset, values.data(), kTensorBytes));
    return values;
  }

  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

TEST_P(GraphTest, CopiesAndFillReplay) {
  tern_buffer_t a = Alloc(0, 4096);
  tern_buffer_t b = Alloc(0, 4096);
  auto* in = HostBytes(256);
  auto* out = HostBytes(256);
  tern_graph_t graph = CreateGraph("copies");
  uint32_t command = 99;
  CTS_ASSERT_OK(tern_graph_add_fill(graph, a, 0, 4096, 0x11223344u, &command));
  EXPECT_EQ(0u, command);
  CTS_ASSERT_OK(tern_graph_add_copy_h2d(graph, a, 64, in->data(), 256, &command));
  EXPECT_EQ(1u, command);
  CTS_ASSERT_OK(tern_graph_add_copy_d2d(graph, b, 128, a, 0, 512, &command));
  EXPECT_EQ(2u, command);
  CTS_ASSERT_OK(tern_graph_add_copy_d2h(graph, out->data(), b, 192, 256, &command));
  EXPECT_EQ(3u, command);
  tern_graph_info_t info = Info(graph);
  EXPECT_EQ(4u, info.command_count);
  EXPECT_EQ(0u, info.finalized);
  EXPECT_STREQ("copies", info.name);
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  EXPECT_EQ(1u, Info(graph).finalized);

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const std::vector<uint8_t> pattern = Pattern(256, 100 + round);
    std::copy(pattern.begin(), pattern.end(), in->begin());  // in place: the graph holds in->data()
    std::fill(out->begin(), out->end(), 0);
    uint64_t sequence = 0;
    CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, &sequence));
    EXPECT_EQ(static_cast<uint64_t>(round + 1), sequence) << "a launch is one command";
    CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
    // b[192, 448) = a[64, 320) = in; b[128, 192) = a[0, 64): the fill.
    EXPECT_TRUE(*in == *out);
    std::vector<uint8_t> head(64);
    CTS_ASSERT_OK(tern_buffer_read(b, 128, head.data(), head.size()));
    for (size_t i = 0; i < head.size(); i += 4) {
      uint32_t word;
      std::memcpy(&word, &head[i], 4);
      EXPECT_EQ(0x11223344u, word) << "at " << i;
    }
  }
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphTest, ExecutionsWithRecordedAndRebuiltBindings) {
  tern_executable_t add = LoadAdd();
  ASSERT_NE(nullptr, add);
  tern_buffer_t x = Alloc(0, 4096), y = Alloc(0, 4096), z = Alloc(0, 4096);
  tern_buffer_t other = Alloc(0, 8192);
  const std::vector<float> xs = Floats(1), ys = Floats(100), others = Floats(1000);
  CTS_ASSERT_OK(tern_buffer_write(x, 0, xs.data(), kTensorBytes));
  CTS_ASSERT_OK(tern_buffer_write(y, 0, ys.data(), kTensorBytes));
  CTS_ASSERT_OK(tern_buffer_write(other, 4096, others.data(), kTensorBytes));
  tern_graph_t graph = CreateGraph();
  // z = x + y; then z = z + y (reads the first execution's result).
  const tern_binding_t in1[2] = {{x, 0}, {y, 0}};
  const tern_binding_t in2[2] = {{z, 0}, {y, 0}};
  const tern_binding_t out[1] = {{z, 0}};
  uint32_t first = 99, second = 99;
  CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in1, 2, out, 1, &first));
  CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in2, 2, out, 1, &second));
  EXPECT_EQ(0u, first);
  EXPECT_EQ(1u, second);
  uint32_t x_param = 99, z_param = 99;
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, first, TERN_GRAPH_OPERAND_INPUT, 0, &x_param));
  EXPECT_EQ(0u, x_param);
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, second, TERN_GRAPH_OPERAND_OUTPUT, 0, &z_param));
  EXPECT_EQ(1u, z_param);
  EXPECT_EQ(2u, Info(graph).parameter_count);
  CTS_ASSERT_OK(tern_graph_finalize(graph));

  // Recorded bindings: z = x + 2y.
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<float> got = ReadFloats(z);
  for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(xs[i] + 2 * ys[i], got[i]) << i;

  // x rebound to other+4096, the second output to other+0: other[0..) =
  // others + 2y, and z holds others + y (the first execution's output).
  tern_graph_argument_t arguments[2] = {};
  arguments[0].parameter = x_param;
  arguments[0].buffer = other;
  arguments[0].offset = 4096;
  arguments[1].parameter = z_param;
  arguments[1].buffer = other;
  arguments[1].offset = 0;
  tern_graph_launch_params_t params{};
  params.struct_size = sizeof(params);
  params.argument_count = 2;
  params.arguments = arguments;
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, &params, &sequence));
  EXPECT_EQ(2u, sequence);
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  got = ReadFloats(other, 0);
  for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(others[i] + 2 * ys[i], got[i]) << i;
  got = ReadFloats(z);
  for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(others[i] + ys[i], got[i]) << i;

  // The arguments did not stick: the next launch uses the recorded bindings.
  CTS_ASSERT_OK(tern_buffer_write(z, 0, Floats(-5).data(), kTensorBytes));
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  got = ReadFloats(z);
  for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(xs[i] + 2 * ys[i], got[i]) << i;

  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_OK(tern_executable_unload(add));
}

TEST_P(GraphTest, CopyParametersRebindBufferAndOffset) {
  tern_buffer_t a = Alloc(0, 4096), b = Alloc(0, 4096);
  auto* host = HostBytes(64);
  tern_graph_t graph = CreateGraph();
  uint32_t fill = 0, copy = 0, fill_dst = 0, copy_src = 0;
  CTS_ASSERT_OK(tern_graph_add_fill(graph, a, 0, 64, 0x01010101u, &fill));
  CTS_ASSERT_OK(tern_graph_add_copy_d2h(graph, host->data(), a, 0, 64, &copy));
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, fill, TERN_GRAPH_OPERAND_DST, 0, &fill_dst));
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, copy, TERN_GRAPH_OPERAND_SRC, 0, &copy_src));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  tern_graph_argument_t arguments[2] = {};
  arguments[0].parameter = fill_dst;
  arguments[0].buffer = b;
  arguments[0].offset = 1024;
  arguments[1].parameter = copy_src;
  arguments[1].buffer = b;
  arguments[1].offset = 1024;
  tern_graph_launch_params_t params{};
  params.struct_size = sizeof(params);
  params.argument_count = 2;
  params.arguments = arguments;
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, &params, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(std::vector<uint8_t>(64, 0x01), *host);
  // With only the fill rebound, the copy reads a (recorded), zeroed here.
  CTS_ASSERT_OK(tern_queue_fill(queue_, a, 0, 64, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  params.argument_count = 1;
  std::fill(host->begin(), host->end(), 0xee);
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, &params, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(std::vector<uint8_t>(64, 0), *host);
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphTest, HostCallbacksRunInOrderEveryLaunch) {
  auto* log = Make<CallbackLog>();
  tern_graph_t graph = CreateGraph();
  for (int id = 0; id < 3; ++id) {
    CTS_ASSERT_OK(
        tern_graph_add_host_callback(graph, CallbackLog::Callback, log->NewTag(id), nullptr));
  }
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, CallbackLog::Callback, log->NewTag(10), nullptr));
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  const auto entries = log->entries();
  const std::vector<int> expected = {0, 1, 2, 10, 0, 1, 2};
  ASSERT_EQ(expected.size(), entries.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i], entries[i].first) << i;
    EXPECT_EQ(TERN_OK, entries[i].second) << i;
  }
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphTest, EventWaitUsesTheRecordingAtLaunch) {
  tern_core_t other_core = OpenCore(0, 1);
  tern_queue_t other = CreateQueue(other_core, "cts-graph-other");
  tern_event_t event = CreateEvent();
  auto* log = Make<CallbackLog>();
  tern_graph_t graph = CreateGraph();
  CTS_ASSERT_OK(tern_graph_add_wait_event(graph, event, nullptr));
  CTS_ASSERT_OK(
      tern_graph_add_host_callback(graph, CallbackLog::Callback, log->NewTag(1), nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  // Never recorded at launch: no wait.
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(1u, log->entries().size());
  // Recorded behind a closed gate on another queue: the launch waits for it.
  Gate* gate = NewGate();
  CTS_ASSERT_OK(tern_queue_host_callback(other, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(other, event, nullptr));
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, &sequence));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_wait_sequence(queue_, sequence, 20 * kMs));
  EXPECT_EQ(1u, log->entries().size());
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(2u, log->entries().size());
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_OK(tern_queue_destroy(other));
}

TEST_P(GraphTest, LaunchesOfOneGraphOnTwoQueuesAreOrdered) {
  tern_core_t other_core = OpenCore(0, 1);
  tern_queue_t other = CreateQueue(other_core, "cts-graph-other");
  Gate* gate = NewGate();
  tern_graph_t graph = CreateGraph();
  CTS_ASSERT_OK(tern_graph_add_host_callback(graph, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  uint64_t first = 0, second = 0;
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, &first));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_ASSERT_OK(tern_queue_launch_graph(other, graph, nullptr, &second));
  // The second launch waits for the first, held by the gate.
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_wait_sequence(other, second, 20 * kMs));
  gate->Open();
  CTS_EXPECT_OK(tern_queue_synchronize(other, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_OK(tern_queue_destroy(other));
}

TEST_P(GraphTest, DestroyWhileLaunchInFlight) {
  tern_executable_t add = LoadAdd();
  tern_buffer_t x = Alloc(0, 4096), z = Alloc(0, 4096);
  const std::vector<float> xs = Floats(3);
  CTS_ASSERT_OK(tern_buffer_write(x, 0, xs.data(), kTensorBytes));
  Gate* gate = NewGate();
  tern_graph_t graph = CreateGraph();
  const tern_binding_t in[2] = {{x, 0}, {x, 0}};
  const tern_binding_t out[1] = {{z, 0}};
  CTS_ASSERT_OK(tern_graph_add_host_callback(graph, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in, 2, out, 1, nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_OK(tern_executable_unload(add));
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  const std::vector<float> got = ReadFloats(z);
  for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(2 * xs[i], got[i]) << i;
}

TEST_P(GraphTest, EmptyGraphIsOneCommand) {
  tern_graph_t graph = CreateGraph();
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, &sequence));
  EXPECT_EQ(1u, sequence);
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, sequence, kLongTimeout));
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphTest, CrossDeviceCopy) {
  CTS_NEED_DEVICES(2);
  tern_buffer_t local = Alloc(0, 4096), remote = Alloc(1, 4096);
  const std::vector<uint8_t> bytes = Pattern(4096, 7);
  CTS_ASSERT_OK(tern_buffer_write(local, 0, bytes.data(), bytes.size()));
  tern_graph_t graph = CreateGraph();
  CTS_ASSERT_OK(tern_graph_add_copy_d2d(graph, remote, 0, local, 0, 4096, nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<uint8_t> got(4096);
  CTS_ASSERT_OK(tern_buffer_read(remote, 0, got.data(), got.size()));
  EXPECT_TRUE(bytes == got);
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

// Graphs hold scratch for their executions (none for "add") and nothing
// else: destroying them returns the device's memory to what it was.
TEST_P(GraphTest, DestroyReleasesEverything) {
  const uint64_t before = MemoryStats(0).used_bytes;
  tern_executable_t add = LoadAdd();
  tern_buffer_t x = Alloc(0, 4096);
  const uint64_t loaded = MemoryStats(0).used_bytes;
  for (int i = 0; i < 4; ++i) {
    tern_graph_t graph = CreateGraph();
    const tern_binding_t in[2] = {{x, 0}, {x, 0}};
    const tern_binding_t out[1] = {{x, 512}};
    CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in, 2, out, 1, nullptr));
    CTS_ASSERT_OK(tern_graph_finalize(graph));
    CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
    CTS_ASSERT_OK(tern_graph_destroy(graph));
  }
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(loaded, MemoryStats(0).used_bytes);
  CTS_EXPECT_OK(tern_executable_unload(add));
  CTS_EXPECT_OK(tern_buffer_free(x));
  EXPECT_EQ(before, MemoryStats(0).used_bytes);
}

// The executions of a graph share one scratch block, reserved at finalize
// and released with the graph.
TEST_P(GraphTest, ExecutionsShareTheGraphsScratch) {
  const std::vector<uint8_t> bytes = BuildWithScratch();
  tern_executable_t exe = nullptr;
  CTS_ASSERT_OK(tern_executable_load(device(0), bytes.data(), bytes.size(), nullptr, &exe));
  tern_buffer_t x = Alloc(0, 4096), y = Alloc(0, 4096), z = Alloc(0, 4096);
  const std::vector<float> xs = Floats(1), ys = Floats(50);
  CTS_ASSERT_OK(tern_buffer_write(x, 0, xs.data(), kTensorBytes));
  CTS_ASSERT_OK(tern_buffer_write(y, 0, ys.data(), kTensorBytes));
  const uint64_t scratch_before = MemoryStats(0).used_by_category[TERN_MEMORY_SCRATCH];
  tern_graph_t graph = CreateGraph();
  // z0 = 2x + y; z1 = 2 z0 + y; z2 = 2 z1 + y, in three slots of z.
  for (uint64_t i = 0; i < 3; ++i) {
    const tern_binding_t in[2] = {{i == 0 ? x : z, i == 0 ? 0 : (i - 1) * 512}, {y, 0}};
    const tern_binding_t out[1] = {{z, i * 512}};
    CTS_ASSERT_OK(tern_graph_add_execute(graph, exe, 0, in, 2, out, 1, nullptr));
  }
  EXPECT_EQ(kTensorBytes, Info(graph).scratch_bytes);
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  EXPECT_LT(scratch_before, MemoryStats(0).used_by_category[TERN_MEMORY_SCRATCH])
      << "finalize reserves the scratch";
  for (int launch = 0; launch < 2; ++launch) {
    CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  }
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<float> expected(kFloats);
  for (uint32_t i = 0; i < kFloats; ++i) expected[i] = 2 * xs[i] + ys[i];
  for (uint64_t slot = 0; slot < 3; ++slot) {
    const std::vector<float> got = ReadFloats(z, slot * 512);
    for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(expected[i], got[i]) << slot << " " << i;
    for (uint32_t i = 0; i < kFloats; ++i) expected[i] = 2 * expected[i] + ys[i];
  }
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  EXPECT_EQ(scratch_before, MemoryStats(0).used_by_category[TERN_MEMORY_SCRATCH]);
  CTS_EXPECT_OK(tern_executable_unload(exe));
}

CTS_INSTANTIATE(GraphTest);

// --- A failing recorded command (needs fault injection) ----------------------------

TEST_P(GraphTest, FailedCommandNamesItsIndexAndSkipsTheRest) {
  tern_buffer_t buffer = Alloc(0, 4096);
  auto* log = Make<CallbackLog>();
  tern_graph_t graph = CreateGraph("failing");
  CTS_ASSERT_OK(tern_graph_add_fill(graph, buffer, 0, 64, 0x01010101u, nullptr));
  CTS_ASSERT_OK(tern_graph_add_fill(graph, buffer, 0, 64, 0x02020202u, nullptr));
  CTS_ASSERT_OK(
      tern_graph_add_host_callback(graph, CallbackLog::Callback, log->NewTag(1), nullptr));
  CTS_ASSERT_OK(tern_graph_add_fill(graph, buffer, 0, 64, 0x03030303u, nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  tern_fault_params_t fault{};
  fault.struct_size = sizeof(fault);
  fault.kind = TERN_FAULT_DMA_ABORT;
  fault.core = core_;
  fault.after_commands = 1;  // the second fill
  CTS_ASSERT_OK(tern_debug_inject_fault(&fault));
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, &sequence));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_synchronize(queue_, kLongTimeout),
                   "command 1 (fill) of graph 'failing'", "cts-graph");
  const auto entries = log->entries();
  ASSERT_EQ(1u, entries.size());
  EXPECT_EQ(TERN_ERROR_DMA_ABORT, entries[0].second) << StatusName(entries[0].second);
  std::vector<uint8_t> bytes(4);
  CTS_ASSERT_OK(tern_buffer_read(buffer, 0, bytes.data(), 4));
  EXPECT_EQ(0x01, bytes[0]) << "a command after the failure ran";
  // A launch after the failure is skipped, its callback told so; after
  // clearing the error the graph runs again.
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_synchronize(queue_, kLongTimeout));
  ASSERT_EQ(2u, log->entries().size());
  EXPECT_EQ(TERN_ERROR_DMA_ABORT, log->entries()[1].second);
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_clear_error(queue_));
  CTS_ASSERT_OK(tern_queue_launch_graph(queue_, graph, nullptr, nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_ASSERT_OK(tern_buffer_read(buffer, 0, bytes.data(), 4));
  EXPECT_EQ(0x03, bytes[0]);
  ASSERT_EQ(3u, log->entries().size());
  EXPECT_EQ(TERN_OK, log->entries()[2].second);
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

// --- Concurrency (also run under ThreadSanitizer) ----------------------------------

// Threads launch one graph on queues of their own, each with its own output
// buffer as an argument, while another thread records into a second graph.
TEST_P(GraphTest, ConcurrentLaunchesOfOneGraph) {
  constexpr int kThreads = 4;
  constexpr int kLaunches = 50;
  tern_executable_t add = LoadAdd();
  tern_buffer_t x = Alloc(0, 4096);
  const std::vector<float> xs = Floats(2);
  CTS_ASSERT_OK(tern_buffer_write(x, 0, xs.data(), kTensorBytes));
  tern_buffer_t outputs[kThreads];
  tern_queue_t queues[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    outputs[t] = Alloc(0, 4096);
    queues[t] = CreateQueue(core_);
  }
  tern_graph_t graph = CreateGraph();
  const tern_binding_t in[2] = {{x, 0}, {x, 0}};
  const tern_binding_t out[1] = {{x, 1024}};
  uint32_t command = 0, parameter = 0;
  CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in, 2, out, 1, &command));
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_OUTPUT, 0, &parameter));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  tern_graph_t recording = CreateGraph();
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      tern_graph_argument_t argument{};
      argument.parameter = parameter;
      argument.buffer = outputs[t];
      argument.offset = static_cast<uint64_t>(t) * 256;
      tern_graph_launch_params_t params{};
      params.struct_size = sizeof(params);
      params.argument_count = 1;
      params.arguments = &argument;
      for (int i = 0; i < kLaunches; ++i) {
        if (tern_queue_launch_graph(queues[t], graph, &params, nullptr) != TERN_OK) ++failures;
      }
      if (tern_queue_synchronize(queues[t], kLongTimeout) != TERN_OK) ++failures;
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 100; ++i) {
      if (tern_graph_add_fill(recording, x, 2048, 64, 0, nullptr) != TERN_OK) ++failures;
    }
  });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(0, failures.load());
  for (int t = 0; t < kThreads; ++t) {
    const std::vector<float> got = ReadFloats(outputs[t], static_cast<uint64_t>(t) * 256);
    for (uint32_t i = 0; i < kFloats; ++i) EXPECT_EQ(2 * xs[i], got[i]) << t << " " << i;
    CTS_EXPECT_OK(tern_queue_destroy(queues[t]));
  }
  EXPECT_EQ(100u, Info(recording).command_count);
  CTS_EXPECT_OK(tern_graph_destroy(recording));
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_OK(tern_executable_unload(add));
}

// --- What a launch refuses: what the graph names is gone ---------------------------

class GraphNegativeTest : public GraphTest {};

TEST_P(GraphNegativeTest, LaunchWithFreedBufferEnqueuesNothing) {
  tern_buffer_t a = Alloc(0, 4096), b = Alloc(0, 4096);
  tern_graph_t graph = CreateGraph("g1");
  uint32_t parameter = 0;
  CTS_ASSERT_OK(tern_graph_add_fill(graph, b, 0, 64, 0x05050505u, nullptr));
  CTS_ASSERT_OK(tern_graph_add_fill(graph, a, 0, 64, 0, nullptr));
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, 1, TERN_GRAPH_OPERAND_DST, 0, &parameter));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  CTS_ASSERT_OK(tern_buffer_free(a));
  uint64_t sequence = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_launch_graph(queue_, graph, nullptr, &sequence),
                   "command 1 (fill) of graph 'g1'", "dst", "freed");
  EXPECT_EQ(0u, sequence);
  std::vector<uint8_t> bytes(4, 0);
  CTS_ASSERT_OK(tern_buffer_read(b, 0, bytes.data(), 4));
  EXPECT_EQ(0, bytes[0]) << "a refused launch ran a command";
  // Rebinding the freed buffer's only use makes the launch good.
  tern_buffer_t c = Alloc(0, 4096);
  tern_graph_argument_t argument{};
  argument.parameter = parameter;
  argument.buffer = c;
  tern_graph_launch_params_t params{};
  params.struct_size = sizeof(params);
  params.argument_count = 1;
  params.arguments = &argument;
  ExpectNoSubmissionTaken(
      queue_, [&](uint64_t* s) { return tern_queue_launch_graph(queue_, graph, &params, s); });
  CTS_ASSERT_OK(tern_buffer_read(b, 0, bytes.data(), 4));
  EXPECT_EQ(0x05, bytes[0]);
  // b freed too: its use is not a parameter.
  CTS_ASSERT_OK(tern_buffer_free(b));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_launch_graph(queue_, graph, &params, nullptr), "command 0 (fill)");
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphNegativeTest, LaunchWithUnloadedExecutable) {
  tern_executable_t add = LoadAdd();
  tern_buffer_t x = Alloc(0, 4096);
  tern_graph_t graph = CreateGraph("g2");
  const tern_binding_t in[2] = {{x, 0}, {x, 0}};
  const tern_binding_t out[1] = {{x, 512}};
  CTS_ASSERT_OK(tern_graph_add_fill(graph, x, 0, 4, 0, nullptr));
  CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in, 2, out, 1, nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  CTS_ASSERT_OK(tern_executable_unload(add));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_launch_graph(queue_, graph, nullptr, nullptr),
                   "command 1 (execute) of graph 'g2'", "unloaded");
  ExpectNoSubmissionTaken(queue_, [&](uint64_t* s) { return tern_queue_nop(queue_, s); });
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphNegativeTest, LaunchWithDestroyedEvent) {
  tern_event_t event = CreateEvent();
  tern_graph_t graph = CreateGraph("g3");
  CTS_ASSERT_OK(tern_graph_add_wait_event(graph, event, nullptr));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  CTS_ASSERT_OK(tern_event_destroy(event));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_launch_graph(queue_, graph, nullptr, nullptr),
                   "command 0 (event wait) of graph 'g3'");
  ExpectNoSubmissionTaken(queue_, [&](uint64_t* s) { return tern_queue_nop(queue_, s); });
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(GraphNegativeTest, RecordExecuteChecksAsQueueExecute) {
  tern_executable_t add = LoadAdd();
  tern_buffer_t x = Alloc(0, 4096);
  tern_buffer_t small = Alloc(0, 64);
  tern_graph_t graph = CreateGraph();
  const tern_binding_t in[2] = {{x, 0}, {x, 0}};
  const tern_binding_t out[1] = {{x, 512}};
  const tern_binding_t small_out[1] = {{small, 0}};
  const tern_binding_t past_end[1] = {{x, 4096 - 64}};
  uint32_t command = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_graph_add_execute(graph, add, 1, in, 2, out, 1, &command), "function 1");
  EXPECT_EQ(0u, command);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_execute(graph, add, 0, in, 1, out, 1, &command), "2 inputs");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_execute(graph, add, 0, nullptr, 2, out, 1, &command), "inputs");
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_graph_add_execute(graph, add, 0, in, 2, small_out, 1, &command),
                   "outputs[0] ('z')");
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_graph_add_execute(graph, add, 0, in, 2, past_end, 1, &command), "z");
  CTS_EXPECT_ERROR(
      TERN_ERROR_INVALID_HANDLE,
      tern_graph_add_execute(graph, Forge<tern_executable_t>(0x1234), 0, in, 2, out, 1, &command),
      "executable");
  const tern_binding_t dead_in[2] = {{x, 0}, {Forge<tern_buffer_t>(0x99), 0}};
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_graph_add_execute(graph, add, 0, dead_in, 2, out, 1, &command),
                   "inputs[1] ('y')");
  if (device_count() > 1) {
    tern_executable_t remote = LoadAdd(1);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_graph_add_execute(graph, remote, 0, in, 2, out, 1, &command), "device 1",
                     "graph records for device 0");
    tern_buffer_t remote_buffer = Alloc(1, 4096);
    const tern_binding_t remote_in[2] = {{remote_buffer, 0}, {x, 0}};
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_graph_add_execute(graph, add, 0, remote_in, 2, out, 1, &command),
                     "inputs[0]", "device 1");
    CTS_EXPECT_OK(tern_executable_unload(remote));
  }
  EXPECT_EQ(0u, Info(graph).command_count) << "a refused command was recorded";
  // An execute's parameters: inputs and outputs only, in range.
  CTS_ASSERT_OK(tern_graph_add_execute(graph, add, 0, in, 2, out, 1, &command));
  uint32_t parameter = 99;
  CTS_EXPECT_ERROR(
      TERN_ERROR_OUT_OF_RANGE,
      tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_INPUT, 2, &parameter),
      "2 inputs");
  EXPECT_EQ(0u, parameter);
  CTS_EXPECT_ERROR(
      TERN_ERROR_OUT_OF_RANGE,
      tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_OUTPUT, 1, &parameter),
      "1 outputs");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                   "TERN_GRAPH_OPERAND_DST");
  CTS_ASSERT_OK(tern_graph_add_parameter(graph, command, TERN_GRAPH_OPERAND_OUTPUT, 0, &parameter));
  CTS_ASSERT_OK(tern_graph_finalize(graph));
  // A launch argument must hold the tensor.
  tern_graph_argument_t argument{};
  argument.parameter = parameter;
  argument.buffer = small;
  tern_graph_launch_params_t params{};
  params.struct_size = sizeof(params);
  params.argument_count = 1;
  params.arguments = &argument;
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_queue_launch_graph(queue_, graph, &params, nullptr), "arguments[0]",
                   "outputs[0] ('z')");
  ExpectNoSubmissionTaken(queue_, [&](uint64_t* s) { return tern_queue_nop(queue_, s); });
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_OK(tern_executable_unload(add));
}

CTS_INSTANTIATE(GraphNegativeTest);

}  // namespace
}  // namespace tern::cts
