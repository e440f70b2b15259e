// CTS: negative tests for every public function. Each bad input must give its
// exact documented code and a message of its own, never a crash, and must
// leave the objects involved as they were.
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "cts_fixture.h"
#include "cts_negative_util.h"

namespace tern::cts {
namespace {

constexpr uint64_t kBufferSize = 4096;

void NoopCallback(void*, tern_status_t) {}

// --- Every function at once: before init, after shutdown ----------------------------

struct Handles {
  tern_device_t device;
  tern_core_t core;
  tern_buffer_t buffer;
  tern_queue_t queue;
  tern_event_t event;
  void* host;  // from tern_host_alloc, or not tern's at all
  tern_memory_pool_t pool;
};

// Calls every function that needs a runtime; each must fail with `expected`
// and clear its out parameters.
void ExpectEveryFunctionFails(const Handles& h, tern_status_t expected, const char* needle) {
  EXPECT_EQ(nullptr, tern_driver_name());
  uint8_t bytes[16] = {};
  uint64_t sequence = 99;

  uint32_t count = 7;
  CTS_EXPECT_ERROR(expected, tern_device_count(&count), needle);
  EXPECT_EQ(0u, count);
  tern_device_t device = Forge<tern_device_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_device_get(0, &device), needle);
  EXPECT_EQ(nullptr, device);
  tern_device_info_t device_info{};
  device_info.struct_size = sizeof(device_info);
  CTS_EXPECT_ERROR(expected, tern_device_get_info(h.device, &device_info), needle);
  tern_core_t core = Forge<tern_core_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_core_open(h.device, 0, &core), needle);
  EXPECT_EQ(nullptr, core);
  CTS_EXPECT_ERROR(expected, tern_core_close(h.core), needle);
  tern_core_info_t core_info{};
  core_info.struct_size = sizeof(core_info);
  CTS_EXPECT_ERROR(expected, tern_core_get_info(h.core, &core_info), needle);
  tern_device_telemetry_t* telemetry = new tern_device_telemetry_t();
  telemetry->struct_size = sizeof(*telemetry);
  CTS_EXPECT_ERROR(expected, tern_device_get_telemetry(h.device, telemetry), needle);
  delete telemetry;

  tern_buffer_t buffer = Forge<tern_buffer_t>(0x1234);
  const tern_buffer_params_t params = BufferParams(4096);
  CTS_EXPECT_ERROR(expected, tern_buffer_alloc(h.device, &params, &buffer), needle);
  EXPECT_EQ(nullptr, buffer);
  CTS_EXPECT_ERROR(expected, tern_buffer_free(h.buffer), needle);
  tern_buffer_info_t buffer_info{};
  buffer_info.struct_size = sizeof(buffer_info);
  CTS_EXPECT_ERROR(expected, tern_buffer_get_info(h.buffer, &buffer_info), needle);
  CTS_EXPECT_ERROR(expected, tern_buffer_write(h.buffer, 0, bytes, sizeof(bytes)), needle);
  CTS_EXPECT_ERROR(expected, tern_buffer_read(h.buffer, 0, bytes, sizeof(bytes)), needle);
  int fd = 1234;
  CTS_EXPECT_ERROR(expected, tern_buffer_export(h.buffer, &fd), needle);
  EXPECT_EQ(-1, fd);
  buffer = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_buffer_import(h.device, 0, 4096, &buffer), needle);
  EXPECT_EQ(nullptr, buffer);
  tern_memory_stats_t stats{};
  stats.struct_size = sizeof(stats);
  CTS_EXPECT_ERROR(expected, tern_device_memory_stats(h.device, &stats), needle);
  void* host = reinterpret_cast<void*>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_host_alloc(4096, &host), needle);
  EXPECT_EQ(nullptr, host);
  CTS_EXPECT_ERROR(expected, tern_host_free(h.host), needle);
  CTS_EXPECT_ERROR(expected, tern_host_register(bytes, sizeof(bytes)), needle);
  CTS_EXPECT_ERROR(expected, tern_host_unregister(bytes), needle);

  tern_memory_pool_t pool = Forge<tern_memory_pool_t>(0x1234);
  tern_memory_pool_params_t pool_params{};
  pool_params.struct_size = sizeof(pool_params);
  CTS_EXPECT_ERROR(expected, tern_memory_pool_create(h.device, &pool_params, &pool), needle);
  EXPECT_EQ(nullptr, pool);
  pool = Forge<tern_memory_pool_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_device_default_memory_pool(h.device, &pool), needle);
  EXPECT_EQ(nullptr, pool);
  CTS_EXPECT_ERROR(expected, tern_memory_pool_destroy(h.pool), needle);
  CTS_EXPECT_ERROR(
      expected, tern_memory_pool_set_attribute(h.pool, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, 0),
      needle);
  uint64_t value = 99;
  CTS_EXPECT_ERROR(
      expected,
      tern_memory_pool_get_attribute(h.pool, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, &value),
      needle);
  EXPECT_EQ(0u, value);
  CTS_EXPECT_ERROR(expected, tern_memory_pool_trim_to(h.pool, 0), needle);
  tern_memory_pool_stats_t pool_stats{};
  pool_stats.struct_size = sizeof(pool_stats);
  pool_stats.reserved_bytes = 99;
  CTS_EXPECT_ERROR(expected, tern_memory_pool_get_stats(h.pool, &pool_stats), needle);
  EXPECT_EQ(0u, pool_stats.reserved_bytes);
  buffer = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_queue_alloc(h.queue, 4096, h.pool, &buffer), needle);
  EXPECT_EQ(nullptr, buffer);
  CTS_EXPECT_ERROR(expected, tern_queue_alloc(h.queue, 4096, nullptr, &buffer), needle);
  CTS_EXPECT_ERROR(expected, tern_queue_free(h.queue, h.buffer), needle);

  tern_io_set_t io_set = Forge<tern_io_set_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_io_set_create(Forge<tern_executable_t>(0x1234), nullptr, &io_set),
                   needle);
  EXPECT_EQ(nullptr, io_set);
  CTS_EXPECT_ERROR(expected, tern_io_set_bind(Forge<tern_io_set_t>(0x1234), 0, "x", h.buffer, 0),
                   needle);
  CTS_EXPECT_ERROR(expected, tern_io_set_destroy(Forge<tern_io_set_t>(0x1234)), needle);
  sequence = 99;
  CTS_EXPECT_ERROR(expected,
                   tern_queue_execute_io_set(h.queue, Forge<tern_io_set_t>(0x1234), &sequence),
                   needle);
  EXPECT_EQ(0u, sequence);

  const tern_graph_t forged_graph = Forge<tern_graph_t>(0x1234);
  tern_graph_t graph = forged_graph;
  CTS_EXPECT_ERROR(expected, tern_graph_create(h.device, nullptr, &graph), needle);
  EXPECT_EQ(nullptr, graph);
  CTS_EXPECT_ERROR(expected, tern_graph_destroy(forged_graph), needle);
  uint32_t command = 99;
  CTS_EXPECT_ERROR(expected,
                   tern_graph_add_copy_h2d(forged_graph, h.buffer, 0, bytes, 16, &command), needle);
  EXPECT_EQ(0u, command);
  command = 99;
  CTS_EXPECT_ERROR(expected,
                   tern_graph_add_copy_d2h(forged_graph, bytes, h.buffer, 0, 16, &command), needle);
  EXPECT_EQ(0u, command);
  CTS_EXPECT_ERROR(expected,
                   tern_graph_add_copy_d2d(forged_graph, h.buffer, 0, h.buffer, 16, 16, &command),
                   needle);
  CTS_EXPECT_ERROR(expected, tern_graph_add_fill(forged_graph, h.buffer, 0, 16, 0, &command),
                   needle);
  const tern_binding_t binding = {h.buffer, 0};
  CTS_EXPECT_ERROR(expected,
                   tern_graph_add_execute(forged_graph, Forge<tern_executable_t>(0x1234), 0,
                                          &binding, 1, &binding, 1, &command),
                   needle);
  CTS_EXPECT_ERROR(expected,
                   tern_graph_add_host_callback(forged_graph, NoopCallback, nullptr, &command),
                   needle);
  CTS_EXPECT_ERROR(expected, tern_graph_add_wait_event(forged_graph, h.event, &command), needle);
  uint32_t parameter = 99;
  CTS_EXPECT_ERROR(expected,
                   tern_graph_add_parameter(forged_graph, 0, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                   needle);
  EXPECT_EQ(0u, parameter);
  CTS_EXPECT_ERROR(expected, tern_graph_finalize(forged_graph), needle);
  tern_graph_info_t graph_info{};
  graph_info.struct_size = sizeof(graph_info);
  CTS_EXPECT_ERROR(expected, tern_graph_get_info(forged_graph, &graph_info), needle);
  sequence = 99;
  CTS_EXPECT_ERROR(expected, tern_queue_launch_graph(h.queue, forged_graph, nullptr, &sequence),
                   needle);
  EXPECT_EQ(0u, sequence);

  tern_queue_t queue = Forge<tern_queue_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_queue_create(h.core, nullptr, &queue), needle);
  EXPECT_EQ(nullptr, queue);
  CTS_EXPECT_ERROR(expected, tern_queue_nop(h.queue, &sequence), needle);
  EXPECT_EQ(0u, sequence);
  sequence = 99;
  CTS_EXPECT_ERROR(expected, tern_queue_copy_h2d(h.queue, h.buffer, 0, bytes, 16, &sequence),
                   needle);
  EXPECT_EQ(0u, sequence);
  CTS_EXPECT_ERROR(expected, tern_queue_copy_d2h(h.queue, bytes, h.buffer, 0, 16, &sequence),
                   needle);
  CTS_EXPECT_ERROR(expected, tern_queue_copy_d2d(h.queue, h.buffer, 0, h.buffer, 16, 16, &sequence),
                   needle);
  CTS_EXPECT_ERROR(expected, tern_queue_fill(h.queue, h.buffer, 0, 16, 0, &sequence), needle);
  CTS_EXPECT_ERROR(expected, tern_queue_host_callback(h.queue, NoopCallback, nullptr, &sequence),
                   needle);
  CTS_EXPECT_ERROR(expected, tern_queue_record_event(h.queue, h.event, &sequence), needle);
  CTS_EXPECT_ERROR(expected, tern_queue_wait_event(h.queue, h.event, &sequence), needle);
  CTS_EXPECT_ERROR(expected, tern_queue_synchronize(h.queue, 0), needle);
  CTS_EXPECT_ERROR(expected, tern_queue_wait_sequence(h.queue, 1, 0), needle);
  uint64_t completed = 99;
  CTS_EXPECT_ERROR(expected, tern_queue_query(h.queue, &completed), needle);
  EXPECT_EQ(0u, completed);
  uint64_t last = 99;
  CTS_EXPECT_ERROR(expected, tern_queue_last_submitted(h.queue, &last), needle);
  EXPECT_EQ(0u, last);
  CTS_EXPECT_ERROR(expected, tern_queue_clear_error(h.queue), needle);
  CTS_EXPECT_ERROR(expected, tern_queue_destroy(h.queue), needle);

  tern_event_t event = Forge<tern_event_t>(0x1234);
  CTS_EXPECT_ERROR(expected, tern_event_create(&event), needle);
  EXPECT_EQ(nullptr, event);
  CTS_EXPECT_ERROR(expected, tern_event_query(h.event), needle);
  CTS_EXPECT_ERROR(expected, tern_event_synchronize(h.event, 0), needle);
  uint64_t ns = 99;
  CTS_EXPECT_ERROR(expected, tern_event_elapsed_ns(h.event, h.event, &ns), needle);
  EXPECT_EQ(0u, ns);
  CTS_EXPECT_ERROR(expected, tern_event_destroy(h.event), needle);

  tern_fault_params_t fault{};
  fault.struct_size = sizeof(fault);
  fault.kind = TERN_FAULT_DMA_ABORT;
  fault.core = h.core;
  CTS_EXPECT_ERROR(expected, tern_debug_inject_fault(&fault), needle);

  CTS_EXPECT_ERROR(expected, tern_shutdown(), needle);
}

// Runs before tern_init, on every backend (nothing here depends on one).
class NegativeBeforeInitTest : public BackendTest {};

TEST_P(NegativeBeforeInitTest, EveryFunctionIsNotInitialized) {
  void* not_tern = std::malloc(64);
  const Handles forged = {
      Forge<tern_device_t>(0x0100000100000001),     Forge<tern_core_t>(0x0200000200000001),
      Forge<tern_buffer_t>(0x0300000300000001),     Forge<tern_queue_t>(0x0400000400000001),
      Forge<tern_event_t>(0x0500000500000001),      not_tern,
      Forge<tern_memory_pool_t>(0x0a00000a00000001)};
  ExpectEveryFunctionFails(forged, TERN_ERROR_NOT_INITIALIZED, "tern_init");
  std::free(not_tern);
}

TEST_P(NegativeBeforeInitTest, InitOptions) {
  tern_init_options_t options{};
  options.struct_size = sizeof(options);
  options.driver = backend();
  for (uint32_t size : TooSmallStructSizes<decltype(options)>()) {
    SCOPED_TRACE(size);
    options.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_init(&options), "struct_size");
    EXPECT_EQ(nullptr, tern_driver_name());
  }
  options.struct_size = sizeof(options);
  for (uint32_t flags : {1u, 2u, 0x80000000u, 0xffffffffu}) {
    SCOPED_TRACE(flags);
    options.flags = flags;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_init(&options), "flags");
    EXPECT_EQ(nullptr, tern_driver_name());
  }
  options.flags = 0;
  for (const char* driver : {"bogus", "", "SIM", "sim ", "nul"}) {
    SCOPED_TRACE(std::string("driver '") + driver + "'");
    options.driver = driver;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_init(&options), "sim", "null");
    EXPECT_NE(std::string::npos,
              std::string(tern_last_error_message()).find(std::string("'") + driver + "'"))
        << "the message must quote the bad name: " << tern_last_error_message();
    EXPECT_EQ(nullptr, tern_driver_name());
  }
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
}

TEST_P(NegativeBeforeInitTest, UnknownDriverFromEnvironment) {
  ScopedEnv env("TERN_DRIVER", "no-such-backend");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_init(nullptr), "no-such-backend");
  EXPECT_EQ(nullptr, tern_driver_name());
}

TEST_P(NegativeBeforeInitTest, GetVersion) {
  // tern_get_version(NULL) is the CTS's own primer, so check it by hand.
  (void)tern_device_count(nullptr);
  const std::string primed = tern_last_error_message();
  CTS_EXPECT_STATUS(TERN_ERROR_INVALID_ARGUMENT, tern_get_version(nullptr));
  EXPECT_NE(primed, tern_last_error_message());
  EXPECT_NE(std::string::npos, std::string(tern_last_error_message()).find("out_version"));

  tern_version_t version;
  for (uint32_t size : {0u, 4u, static_cast<uint32_t>(offsetof(tern_version_t, patch))}) {
    SCOPED_TRACE(size);
    std::memset(&version, 0xcd, sizeof(version));
    version.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_get_version(&version), "struct_size");
  }
}

TEST_P(NegativeBeforeInitTest, StatusStringNeverNull) {
  for (int64_t code = -300; code < 700; ++code) {
    const char* name = tern_status_string(static_cast<tern_status_t>(code));
    ASSERT_NE(nullptr, name) << code;
    EXPECT_EQ(0, std::strncmp(name, "TERN_", 5)) << code << ": " << name;
  }
}

TEST_P(NegativeBeforeInitTest, ShutdownWithoutInit) {
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown(), "tern_init");
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown(), "tern_init");
}

CTS_INSTANTIATE(NegativeBeforeInitTest);

class NegativeAfterShutdownTest : public RuntimeTest {};

TEST_P(NegativeAfterShutdownTest, EveryFunctionIsNotInitialized) {
  Handles live{};
  live.device = device(0);
  live.core = OpenCore(0, 0);
  live.queue = CreateQueue(live.core);
  live.buffer = Alloc(0, 4096);
  live.event = CreateEvent();
  CTS_ASSERT_OK(tern_host_alloc(4096, &live.host));
  tern_memory_pool_params_t pool_params{};
  pool_params.struct_size = sizeof(pool_params);
  CTS_ASSERT_OK(tern_memory_pool_create(live.device, &pool_params, &live.pool));
  CTS_ASSERT_OK(tern_queue_record_event(live.queue, live.event, nullptr));
  CTS_ASSERT_OK(tern_shutdown());
  ExpectEveryFunctionFails(live, TERN_ERROR_NOT_INITIALIZED, "tern_init");
}

CTS_INSTANTIATE(NegativeAfterShutdownTest);

// --- One function at a time, with a live runtime -------------------------------------

class NegativeTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // Handles of an earlier runtime session.
    stale_device_ = device(0);
    stale_core_ = OpenCore(0, 1);
    stale_queue_ = CreateQueue(stale_core_);
    stale_buffer_ = Alloc(0, 64);
    stale_event_ = CreateEvent();
    CTS_ASSERT_OK(tern_device_default_memory_pool(device(0), &stale_pool_));
    RestartRuntime();
    if (HasFatalFailure()) return;

    // Live objects the bad calls must leave alone.
    core_ = OpenCore(0, 0);
    queue_ = CreateQueue(core_, "cts-negative");
    buffer_ = Alloc(0, kBufferSize);
    if (device_count() > 1) buffer1_ = Alloc(1, kBufferSize);
    event_ = CreateEvent();
    ASSERT_TRUE(core_ && queue_ && buffer_ && event_);
    contents_ = Pattern(kBufferSize, 4242);
    CTS_ASSERT_OK(tern_buffer_write(buffer_, 0, contents_.data(), kBufferSize));

    // Destroyed ones.
    dead_core_ = OpenCore(0, 1);
    CTS_ASSERT_OK(tern_core_close(dead_core_));
    dead_queue_ = CreateQueue(core_);
    CTS_ASSERT_OK(tern_queue_destroy(dead_queue_));
    dead_buffer_ = Alloc(0, 64);
    CTS_ASSERT_OK(tern_buffer_free(dead_buffer_));
    dead_event_ = CreateEvent();
    CTS_ASSERT_OK(tern_event_destroy(dead_event_));
    tern_memory_pool_params_t pool_params = PoolParams();
    CTS_ASSERT_OK(tern_memory_pool_create(device(0), &pool_params, &pool_));
    CTS_ASSERT_OK(tern_memory_pool_create(device(0), &pool_params, &dead_pool_));
    CTS_ASSERT_OK(tern_memory_pool_destroy(dead_pool_));
  }

  static tern_memory_pool_params_t PoolParams() {
    tern_memory_pool_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.struct_size = sizeof(params);
    params.release_threshold = UINT64_MAX;
    params.category = TERN_MEMORY_TENSORS;
    return params;
  }

  // Labelled handles of type H that are not live objects of that type: NULL,
  // destroyed, stale, other kinds, forged values.
  template <typename H>
  std::vector<std::pair<std::string, H>> BadHandles(H dead, H stale, std::vector<H> live) {
    std::vector<std::pair<std::string, H>> bad;
    auto add = [&](std::string label, uintptr_t bits) {
      for (H handle : live) {
        if (handle != nullptr && Bits(handle) == bits) return;  // that one is valid
      }
      bad.emplace_back(std::move(label), Forge<H>(bits));
    };
    add("NULL", 0);
    if (dead != nullptr) add("destroyed", Bits(dead));
    if (stale != nullptr) add("from before a shutdown+init cycle", Bits(stale));
    add("a device handle", Bits(device(0)));
    add("a core handle", Bits(core_));
    add("a buffer handle", Bits(buffer_));
    add("a queue handle", Bits(queue_));
    add("an event handle", Bits(event_));
    add("a memory pool handle", Bits(pool_));
    add("forged 0x1", 1);
    add("forged 0xdeadbeef", 0xdeadbeef);
    add("forged all ones", ~uintptr_t{0});
    for (H handle : live) {
      if (handle == nullptr) continue;
      add("forged: live + 1", Bits(handle) + 1);
      add("forged: live + 4096", Bits(handle) + 4096);
      add("forged: live ^ bit 40", Bits(handle) ^ (uintptr_t{1} << 40));
      add("forged: live ^ bit 60", Bits(handle) ^ (uintptr_t{1} << 60));
    }
    return bad;
  }
  std::vector<std::pair<std::string, tern_device_t>> BadDevices() {
    return BadHandles<tern_device_t>(nullptr, nullptr, devices_);
  }
  std::vector<std::pair<std::string, tern_core_t>> BadCores() {
    return BadHandles<tern_core_t>(dead_core_, stale_core_, {core_});
  }
  std::vector<std::pair<std::string, tern_buffer_t>> BadBuffers() {
    return BadHandles<tern_buffer_t>(dead_buffer_, stale_buffer_, {buffer_, buffer1_});
  }
  std::vector<std::pair<std::string, tern_queue_t>> BadQueues() {
    return BadHandles<tern_queue_t>(dead_queue_, stale_queue_, {queue_});
  }
  std::vector<std::pair<std::string, tern_event_t>> BadEvents() {
    return BadHandles<tern_event_t>(dead_event_, stale_event_, {event_});
  }
  std::vector<std::pair<std::string, tern_memory_pool_t>> BadPools() {
    return BadHandles<tern_memory_pool_t>(dead_pool_, stale_pool_, {pool_});
  }

  // The stale device handle is checked separately: there is no destroyed one.
  std::vector<std::pair<std::string, tern_device_t>> BadDevicesWithStale() {
    auto bad = BadDevices();
    bad.emplace_back("from before a shutdown+init cycle", stale_device_);
    return bad;
  }

  // The failed submissions enqueued nothing: the next command is number 1.
  void ExpectQueueUntouched() {
    ExpectNoSubmissionTaken(queue_,
                            [&](uint64_t* sequence) { return tern_queue_nop(queue_, sequence); });
  }

  // buffer_ still holds what SetUp wrote.
  void ExpectBufferUntouched() {
    std::vector<uint8_t> bytes(kBufferSize);
    CTS_EXPECT_OK(tern_buffer_read(buffer_, 0, bytes.data(), kBufferSize));
    EXPECT_TRUE(contents_ == bytes) << "a failed call changed the buffer";
    const tern_buffer_info_t info = BufferInfo(buffer_);
    EXPECT_EQ(kBufferSize, info.size);
  }

  struct Range {
    uint64_t offset, size;
  };
  // Ranges outside a kBufferSize buffer, overflowing uint64 included. All
  // multiples of 4, so that fill reaches the range check.
  static std::vector<Range> BadRanges() {
    return {{kBufferSize, 4},
            {kBufferSize + 4, 4},
            {0, kBufferSize + 4},
            {kBufferSize - 4, 8},
            {UINT64_MAX - 3, 4},
            {8, UINT64_MAX - 7},
            {UINT64_MAX - 3, UINT64_MAX - 3},
            {kBufferSize / 2, UINT64_MAX / 2 + 1}};
  }

  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
  tern_buffer_t buffer_ = nullptr;
  tern_buffer_t buffer1_ = nullptr;
  tern_event_t event_ = nullptr;
  std::vector<uint8_t> contents_;
  tern_core_t dead_core_ = nullptr;
  tern_queue_t dead_queue_ = nullptr;
  tern_buffer_t dead_buffer_ = nullptr;
  tern_event_t dead_event_ = nullptr;
  tern_device_t stale_device_ = nullptr;
  tern_core_t stale_core_ = nullptr;
  tern_queue_t stale_queue_ = nullptr;
  tern_buffer_t stale_buffer_ = nullptr;
  tern_event_t stale_event_ = nullptr;
  tern_memory_pool_t pool_ = nullptr;
  tern_memory_pool_t dead_pool_ = nullptr;
  tern_memory_pool_t stale_pool_ = nullptr;  // a default pool of the earlier session
};

TEST_P(NegativeTest, InitWhileInitialized) {
  tern_init_options_t options{};
  options.struct_size = sizeof(options);
  options.struct_size = 0;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_init(&options), "struct_size");
  options.struct_size = sizeof(options);
  options.flags = 4;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_init(&options), "flags");
  options.flags = 0;
  options.driver = "bogus";
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_init(&options), "bogus");
  // None of them took a reference.
  CTS_EXPECT_OK(tern_shutdown());
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
}

TEST_P(NegativeTest, DeviceCount) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_count(nullptr), "out_count");
}

TEST_P(NegativeTest, DeviceGet) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_get(0, nullptr), "out_device");
  for (uint32_t index : {device_count(), device_count() + 1, 1000u, UINT32_MAX}) {
    SCOPED_TRACE(index);
    tern_device_t device = Forge<tern_device_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_device_get(index, &device),
                     std::to_string(index).c_str());
    EXPECT_EQ(nullptr, device);
  }
}

TEST_P(NegativeTest, DeviceGetInfo) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_get_info(device(0), nullptr),
                   "out_info");
  tern_device_info_t info;
  // Fields were added in 0.1: the smallest accepted size is the one before them.
  for (uint32_t size : {0u, 4u, static_cast<uint32_t>(TERN_DEVICE_INFO_MIN_SIZE - 1)}) {
    SCOPED_TRACE(size);
    std::memset(&info, 0, sizeof(info));
    info.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_get_info(device(0), &info),
                     "struct_size");
  }
  std::string kept_stale;
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_device_get_info(bad, &info), "device");
    if (info.memory_bytes != 0 || info.core_count != 0) kept_stale += " [" + label + "]";
  }
  EXPECT_EQ("", kept_stale) << "out_info kept stale contents after failing for these";
}

TEST_P(NegativeTest, CoreOpen) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_core_open(device(0), 1, nullptr), "out_core");
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    tern_core_t core = Forge<tern_core_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_core_open(bad, 1, &core), "device");
    EXPECT_EQ(nullptr, core);
  }
  const uint32_t cores = DeviceInfo(0).core_count;
  for (uint32_t index : {cores, cores + 1, UINT32_MAX}) {
    SCOPED_TRACE(index);
    tern_core_t core = Forge<tern_core_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_core_open(device(0), index, &core));
    EXPECT_EQ(nullptr, core);
  }
  tern_core_t again = Forge<tern_core_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_core_open(device(0), 0, &again));
  EXPECT_EQ(nullptr, again);
  // The refusals took no core: core 1 opens, core 0 still works.
  tern_core_t core1 = OpenCore(0, 1);
  EXPECT_NE(nullptr, core1);
  CTS_EXPECT_OK(tern_core_close(core1));
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, CoreClose) {
  for (const auto& [label, handle] : BadCores()) {
    SCOPED_TRACE(label);
    tern_core_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_core_close(bad), "core");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_core_close(core_), "queue");
  ExpectQueueUntouched();
  // A double close.
  tern_core_t core1 = OpenCore(0, 1);
  CTS_ASSERT_OK(tern_core_close(core1));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_core_close(core1));
}

TEST_P(NegativeTest, CoreGetInfo) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_core_get_info(core_, nullptr), "out_info");
  tern_core_info_t info;
  for (uint32_t size : {0u, static_cast<uint32_t>(sizeof(info) - 1)}) {
    SCOPED_TRACE(size);
    std::memset(&info, 0, sizeof(info));
    info.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_core_get_info(core_, &info), "struct_size");
  }
  std::string kept_stale;
  for (const auto& [label, handle] : BadCores()) {
    SCOPED_TRACE(label);
    tern_core_t bad = handle;
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_core_get_info(bad, &info), "core");
    if (info.device != nullptr || info.node_index != 0) kept_stale += " [" + label + "]";
  }
  // tern.h: "out_ parameters are set to zero/NULL on entry".
  EXPECT_EQ("", kept_stale) << "out_info kept stale contents after failing for these";
}

TEST_P(NegativeTest, BufferAlloc) {
  const tern_buffer_params_t good = BufferParams(4096);
  tern_buffer_t buffer = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &good, nullptr),
                   "out_buffer");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), nullptr, &buffer),
                   "params");
  EXPECT_EQ(nullptr, buffer);
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    buffer = Forge<tern_buffer_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_alloc(bad, &good, &buffer), "device");
    EXPECT_EQ(nullptr, buffer);
  }
  tern_buffer_params_t params = good;
  for (uint32_t size : {0u, 8u, static_cast<uint32_t>(sizeof(params) - 1)}) {
    SCOPED_TRACE(size);
    params.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &params, &buffer),
                     "struct_size");
  }
  params = good;
  for (uint32_t flags : {2u, 3u, 0x100u, 0x80000000u}) {
    SCOPED_TRACE(flags);
    params.flags = flags;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &params, &buffer),
                     "flags");
  }
  params = good;
  params.size = 0;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &params, &buffer),
                   "size");
  params = good;
  for (uint64_t alignment : {uint64_t{3}, uint64_t{48}, uint64_t{100}, uint64_t{4097},
                             (uint64_t{1} << 63) + 1, UINT64_MAX}) {
    SCOPED_TRACE(alignment);
    params.alignment = alignment;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &params, &buffer),
                     "alignment");
  }
  // Larger than the device's memory (rounded up to a power of two): no
  // device address can honour it.
  params = good;
  uint64_t too_aligned = 1;
  while (too_aligned < DeviceInfo(0).memory_bytes) too_aligned <<= 1;
  for (uint64_t alignment : {too_aligned << 1, uint64_t{1} << 63}) {
    SCOPED_TRACE(alignment);
    params.alignment = alignment;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &params, &buffer),
                     "alignment");
  }
  params = good;
  for (int category : {static_cast<int>(TERN_MEMORY_CATEGORY_COUNT), 7, 100, -1}) {
    SCOPED_TRACE(category);
    SetRawEnum(&params.category, category);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_alloc(device(0), &params, &buffer),
                     "category");
  }
  params = good;
  params.size = UINT64_MAX;
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_buffer_alloc(device(0), &params, &buffer));
  EXPECT_EQ(nullptr, buffer);
  // Nothing was allocated by any of it.
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(1u, stats.allocation_count);
  EXPECT_EQ(kBufferSize, stats.used_bytes);
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, BufferFree) {
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_free(bad));
  }
  // A double free.
  tern_buffer_t buffer = Alloc(0, 64);
  CTS_ASSERT_OK(tern_buffer_free(buffer));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_free(buffer), "freed");
  // The wrong-kind "frees" destroyed nothing.
  ExpectBufferUntouched();
  ExpectQueueUntouched();
  CTS_EXPECT_OK(tern_event_query(event_));
  tern_core_info_t info{};
  info.struct_size = sizeof(info);
  CTS_EXPECT_OK(tern_core_get_info(core_, &info));
}

TEST_P(NegativeTest, BufferExport) {
  int fd = 1234;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_export(buffer_, nullptr), "out_fd");
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    fd = 1234;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_export(bad, &fd), "buffer");
    EXPECT_EQ(-1, fd);
  }
  // A buffer allocated without TERN_BUFFER_FLAG_SHAREABLE.
  fd = 1234;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_buffer_export(buffer_, &fd),
                   "TERN_BUFFER_FLAG_SHAREABLE");
  EXPECT_EQ(-1, fd);
  // A freed shareable buffer.
  tern_buffer_params_t params = BufferParams(4096);
  params.flags = TERN_BUFFER_FLAG_SHAREABLE;
  tern_buffer_t shareable = nullptr;
  CTS_ASSERT_OK(tern_buffer_alloc(device(0), &params, &shareable));
  CTS_ASSERT_OK(tern_buffer_free(shareable));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_export(shareable, &fd), "buffer");
  EXPECT_EQ(-1, fd);
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, BufferImport) {
  tern_buffer_params_t params = BufferParams(kBufferSize);
  params.flags = TERN_BUFFER_FLAG_SHAREABLE;
  tern_buffer_t shareable = nullptr;
  CTS_ASSERT_OK(tern_buffer_alloc(device(0), &params, &shareable));
  int fd = -1;
  CTS_ASSERT_OK(tern_buffer_export(shareable, &fd));
  ASSERT_GE(fd, 0);
  const tern_memory_stats_t before = MemoryStats(0);

  tern_buffer_t buffer = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_buffer_import(device(0), fd, kBufferSize, nullptr), "out_buffer");
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    buffer = Forge<tern_buffer_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_import(bad, fd, kBufferSize, &buffer),
                     "device");
    EXPECT_EQ(nullptr, buffer);
  }
  // Bad sizes: 0, and anything but the buffer's own.
  for (uint64_t size :
       {uint64_t{0}, uint64_t{1}, kBufferSize - 1, kBufferSize + 1, 2 * kBufferSize, UINT64_MAX}) {
    SCOPED_TRACE(size);
    buffer = Forge<tern_buffer_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_import(device(0), fd, size, &buffer),
                     "size");
    EXPECT_EQ(nullptr, buffer);
  }
  // Bad descriptors: negative, not open, and open files that are no
  // exported buffer.
  int pipe_fds[2];
  ASSERT_EQ(0, pipe(pipe_fds));
  const int closed = dup(pipe_fds[0]);
  ASSERT_GE(closed, 0);
  close(closed);
  for (int bad : {-1, -100, closed, pipe_fds[0], pipe_fds[1], 0}) {
    SCOPED_TRACE(bad);
    buffer = Forge<tern_buffer_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_buffer_import(device(0), bad, kBufferSize, &buffer), "fd");
    EXPECT_EQ(nullptr, buffer);
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // Nothing was imported, and the descriptor still works.
  const tern_memory_stats_t after = MemoryStats(0);
  EXPECT_EQ(before.allocation_count, after.allocation_count);
  EXPECT_EQ(before.used_bytes, after.used_bytes);
  EXPECT_EQ(before.node_used_bytes, after.node_used_bytes);
  CTS_ASSERT_OK(tern_buffer_import(device(0), fd, kBufferSize, &buffer));
  CTS_EXPECT_OK(tern_buffer_free(buffer));
  // A double free of the imported handle.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_free(buffer), "freed");
  CTS_EXPECT_OK(tern_buffer_free(shareable));
  close(fd);
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, BufferGetInfo) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_get_info(buffer_, nullptr), "out_info");
  tern_buffer_info_t info;
  for (uint32_t size : {0u, static_cast<uint32_t>(sizeof(info) - 1)}) {
    SCOPED_TRACE(size);
    std::memset(&info, 0, sizeof(info));
    info.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_get_info(buffer_, &info),
                     "struct_size");
  }
  std::string kept_stale;
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_get_info(bad, &info), "buffer");
    if (info.size != 0 || info.device_address != 0 || info.device != nullptr) {
      kept_stale += " [" + label + "]";
    }
  }
  // tern.h: "out_ parameters are set to zero/NULL on entry".
  EXPECT_EQ("", kept_stale) << "out_info kept stale contents after failing for these";
}

TEST_P(NegativeTest, BufferWrite) {
  std::vector<uint8_t> data(64, 0x77);
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_write(bad, 0, data.data(), 64),
                     "buffer");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_write(buffer_, 0, nullptr, 64), "src");
  std::vector<uint8_t> big(kBufferSize + 8, 0x77);
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_buffer_write(buffer_, range.offset, big.data(), range.size));
  }
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, BufferRead) {
  std::vector<uint8_t> data(kBufferSize + 8, 0x77);
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_read(bad, 0, data.data(), 64),
                     "buffer");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_buffer_read(buffer_, 0, nullptr, 64), "dst");
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    // A read that fails writes nothing to the host either (only small sizes
    // would fit in `data`, so the huge ones prove there was no attempt).
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_buffer_read(buffer_, range.offset, data.data(), range.size));
  }
  EXPECT_EQ(std::vector<uint8_t>(kBufferSize + 8, 0x77), data);
}

TEST_P(NegativeTest, DeviceMemoryStats) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_memory_stats(device(0), nullptr),
                   "out_stats");
  tern_memory_stats_t stats;
  for (uint32_t size : {0u, static_cast<uint32_t>(sizeof(stats) - 1)}) {
    SCOPED_TRACE(size);
    std::memset(&stats, 0, sizeof(stats));
    stats.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_memory_stats(device(0), &stats),
                     "struct_size");
  }
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    std::memset(&stats, 0xcd, sizeof(stats));
    stats.struct_size = sizeof(stats);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_device_memory_stats(bad, &stats), "device");
    EXPECT_EQ(0u, stats.capacity_bytes) << "out_stats kept stale contents";
  }
}

TEST_P(NegativeTest, HostAlloc) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_alloc(4096, nullptr), "out_ptr");
  void* ptr = reinterpret_cast<void*>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_alloc(0, &ptr), "0 bytes");
  EXPECT_EQ(nullptr, ptr);
  ptr = reinterpret_cast<void*>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_HOST_OUT_OF_MEMORY, tern_host_alloc(UINT64_MAX, &ptr));
  EXPECT_EQ(nullptr, ptr);
  ptr = reinterpret_cast<void*>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_HOST_OUT_OF_MEMORY, tern_host_alloc(uint64_t{1} << 56, &ptr));
  EXPECT_EQ(nullptr, ptr);
}

TEST_P(NegativeTest, HostFree) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(nullptr));
  // Memory tern did not allocate is refused and left alone.
  auto* not_tern = static_cast<uint8_t*>(std::malloc(4096));
  std::memset(not_tern, 0x42, 4096);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(not_tern), "tern_host_alloc");
  EXPECT_EQ(0x42, not_tern[4095]);
  std::free(not_tern);
  uint8_t on_stack[64];
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(on_stack));
  // Interior pointers and double frees.
  void* ptr = nullptr;
  CTS_ASSERT_OK(tern_host_alloc(8192, &ptr));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(static_cast<uint8_t*>(ptr) + 64));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(static_cast<uint8_t*>(ptr) + 4096));
  static_cast<uint8_t*>(ptr)[8191] = 1;  // still mapped
  CTS_EXPECT_OK(tern_host_free(ptr));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(ptr));
}

TEST_P(NegativeTest, QueueCreate) {
  tern_queue_t queue = Forge<tern_queue_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_create(core_, nullptr, nullptr),
                   "out_queue");
  for (const auto& [label, handle] : BadCores()) {
    SCOPED_TRACE(label);
    tern_core_t bad = handle;
    queue = Forge<tern_queue_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_create(bad, nullptr, &queue), "core");
    EXPECT_EQ(nullptr, queue);
  }
  tern_queue_params_t params{};
  params.name = "bad";
  for (uint32_t size : TooSmallStructSizes<decltype(params)>()) {
    SCOPED_TRACE(size);
    params.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_create(core_, &params, &queue),
                     "struct_size");
    EXPECT_EQ(nullptr, queue);
  }
  params.struct_size = sizeof(params);
  for (uint32_t flags : {1u, 0x80000000u}) {
    SCOPED_TRACE(flags);
    params.flags = flags;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_create(core_, &params, &queue),
                     "flags");
    EXPECT_EQ(nullptr, queue);
  }
  // No queue was left behind: destroying queue_ lets the core close.
  CTS_ASSERT_OK(tern_queue_destroy(queue_));
  queue_ = nullptr;
  CTS_EXPECT_OK(tern_core_close(core_));
}

TEST_P(NegativeTest, QueueDestroy) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_destroy(bad), "queue");
  }
  tern_queue_t queue = CreateQueue(core_);
  CTS_ASSERT_OK(tern_queue_destroy(queue));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_destroy(queue));
  ExpectQueueUntouched();
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, QueueNop) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    uint64_t sequence = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_nop(bad, &sequence), "queue");
    EXPECT_EQ(0u, sequence);
  }
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueCopyH2D) {
  std::vector<uint8_t> data(kBufferSize + 8, 0x99);
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_h2d(bad, buffer_, 0, data.data(), 64, &sequence), "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_h2d(queue_, bad, 0, data.data(), 64, &sequence), "dst");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_copy_h2d(queue_, buffer_, 0, nullptr, 64, &sequence), "src");
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_queue_copy_h2d(queue_, buffer_, range.offset, data.data(), range.size, &sequence));
  }
  if (buffer1_ != nullptr) {
    // A queue of device 0 cannot write device 1's memory from the host.
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_copy_h2d(queue_, buffer1_, 0, data.data(), 64, &sequence),
                     "device");
  }
  ExpectQueueUntouched();
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, QueueCopyD2H) {
  std::vector<uint8_t> data(kBufferSize + 8, 0x99);
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_d2h(bad, data.data(), buffer_, 0, 64, &sequence), "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_d2h(queue_, data.data(), bad, 0, 64, &sequence), "src");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_copy_d2h(queue_, nullptr, buffer_, 0, 64, &sequence), "dst");
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_queue_copy_d2h(queue_, data.data(), buffer_, range.offset, range.size, &sequence));
  }
  if (buffer1_ != nullptr) {
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_copy_d2h(queue_, data.data(), buffer1_, 0, 64, &sequence),
                     "device");
  }
  ExpectQueueUntouched();
  EXPECT_EQ(std::vector<uint8_t>(kBufferSize + 8, 0x99), data);
}

TEST_P(NegativeTest, QueueCopyD2D) {
  tern_buffer_t other = Alloc(0, kBufferSize);
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_d2d(bad, other, 0, buffer_, 0, 64, &sequence), "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_d2d(queue_, bad, 0, buffer_, 0, 64, &sequence), "dst");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_copy_d2d(queue_, other, 0, bad, 0, 64, &sequence), "src");
  }
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_queue_copy_d2d(queue_, other, range.offset, buffer_, 0, range.size, &sequence));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_queue_copy_d2d(queue_, buffer_, 0, other, range.offset, range.size, &sequence));
  }
  if (buffer1_ != nullptr) {
    // Neither end on the queue's device.
    tern_buffer_t other1 = Alloc(1, kBufferSize);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_copy_d2d(queue_, other1, 0, buffer1_, 0, 64, &sequence), "device");
  }
  ExpectQueueUntouched();
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, QueueFill) {
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_fill(bad, buffer_, 0, 64, 0, &sequence),
                     "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_fill(queue_, bad, 0, 64, 0, &sequence),
                     "dst");
  }
  // Offsets and sizes that are not multiples of the 32-bit pattern.
  for (const Range& range : {Range{1, 4}, Range{2, 8}, Range{0, 3}, Range{4, 6}, Range{3, 1}}) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_fill(queue_, buffer_, range.offset, range.size, 0, &sequence),
                     "multiple");
  }
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_queue_fill(queue_, buffer_, range.offset, range.size, 0, &sequence));
  }
  if (buffer1_ != nullptr) {
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_fill(queue_, buffer1_, 0, 64, 0, &sequence), "device");
  }
  ExpectQueueUntouched();
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, QueueHostCallback) {
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_host_callback(bad, NoopCallback, nullptr, &sequence), "queue");
    EXPECT_EQ(0u, sequence);
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_host_callback(queue_, nullptr, nullptr, &sequence), "callback");
  EXPECT_EQ(0u, sequence);
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueRecordEvent) {
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_record_event(bad, event_, &sequence),
                     "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_record_event(queue_, bad, &sequence),
                     "event");
  }
  // event_ was never recorded by any of it.
  tern_event_t other = CreateEvent();
  CTS_ASSERT_OK(tern_queue_record_event(queue_, other, nullptr));
  CTS_ASSERT_OK(tern_event_synchronize(other, kLongTimeout));
  uint64_t ns = 0;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_event_elapsed_ns(event_, other, &ns));
}

TEST_P(NegativeTest, QueueWaitEvent) {
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_wait_event(bad, event_, &sequence),
                     "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_wait_event(queue_, bad, &sequence),
                     "event");
  }
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueSynchronize) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_synchronize(bad, 0), "queue");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_synchronize(bad, kLongTimeout), "queue");
  }
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueWaitSequence) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_wait_sequence(bad, 1, 0), "queue");
  }
  // Numbers that were never handed out.
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_queue_wait_sequence(queue_, 0, 0));
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_queue_wait_sequence(queue_, 1, kLongTimeout));
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_nop(queue_, &sequence));
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, sequence, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_queue_wait_sequence(queue_, sequence + 1, 0),
                   std::to_string(sequence + 1).c_str());
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_queue_wait_sequence(queue_, UINT64_MAX, 0));
}

TEST_P(NegativeTest, QueueQuery) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    uint64_t completed = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_query(bad, &completed), "queue");
    EXPECT_EQ(0u, completed);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_query(bad, nullptr), "queue");
  }
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueLastSubmitted) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;  // (clang: a lambda in the macro cannot name a binding)
    uint64_t last = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_last_submitted(bad, &last), "queue");
    EXPECT_EQ(0u, last);
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_last_submitted(queue_, nullptr),
                   "out_sequence");
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueClearError) {
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_clear_error(bad), "queue");
  }
  CTS_EXPECT_OK(tern_queue_clear_error(queue_)) << "no error to clear is not an error";
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, EventCreate) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_event_create(nullptr), "out_event");
}

TEST_P(NegativeTest, EventDestroy) {
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_destroy(bad), "event");
  }
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_event_destroy(event));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_destroy(event));
  CTS_EXPECT_OK(tern_event_query(event_)) << "a wrong-kind destroy must not hit event_";
  ExpectQueueUntouched();
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, EventQuery) {
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_query(bad), "event");
  }
}

TEST_P(NegativeTest, EventSynchronize) {
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_synchronize(bad, 0), "event");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_synchronize(bad, kLongTimeout), "event");
  }
}

TEST_P(NegativeTest, EventElapsed) {
  tern_event_t done = CreateEvent();
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event_, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, done, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_event_elapsed_ns(event_, done, nullptr),
                   "out_ns");
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    uint64_t ns = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_elapsed_ns(bad, done, &ns), "event");
    EXPECT_EQ(0u, ns);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_elapsed_ns(event_, bad, &ns), "event");
  }
  tern_event_t never = CreateEvent();
  uint64_t ns = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_event_elapsed_ns(never, done, &ns),
                   "never recorded");
  EXPECT_EQ(0u, ns);
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_event_elapsed_ns(done, never, &ns),
                   "never recorded");
  CTS_EXPECT_OK(tern_event_elapsed_ns(event_, done, &ns));
}

TEST_P(NegativeTest, DeviceGetTelemetry) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_get_telemetry(device(0), nullptr),
                   "out_telemetry");
  auto* telemetry = Make<tern_device_telemetry_t>();
  for (uint32_t size : {0u, static_cast<uint32_t>(TERN_DEVICE_TELEMETRY_MIN_SIZE - 1)}) {
    SCOPED_TRACE(size);
    std::memset(telemetry, 0, sizeof(*telemetry));
    telemetry->struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_get_telemetry(device(0), telemetry),
                     "struct_size");
  }
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    std::memset(telemetry, 0xcd, sizeof(*telemetry));
    telemetry->struct_size = sizeof(*telemetry);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_device_get_telemetry(bad, telemetry),
                     "device");
    EXPECT_EQ(0u, telemetry->memory_capacity) << "out_telemetry kept stale contents";
  }
}

TEST_P(NegativeTest, DebugInjectFault) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_debug_inject_fault(nullptr), "params");
  tern_fault_params_t fault{};
  fault.kind = TERN_FAULT_DMA_ABORT;
  fault.core = core_;
  for (uint32_t size : {0u, static_cast<uint32_t>(sizeof(fault) - 1)}) {
    SCOPED_TRACE(size);
    fault.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_debug_inject_fault(&fault), "struct_size");
  }
  fault.struct_size = sizeof(fault);
  for (int kind : {0, 4, 99, -1}) {
    SCOPED_TRACE(kind);
    SetRawEnum(&fault.kind, kind);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_debug_inject_fault(&fault), "kind");
  }
  for (tern_fault_kind_t kind :
       {TERN_FAULT_DMA_ABORT, TERN_FAULT_CORE_HANG, TERN_FAULT_HBM_UNCORRECTABLE}) {
    fault.kind = kind;
    fault.buffer = nullptr;
    for (const auto& [label, handle] : BadCores()) {
      SCOPED_TRACE(label);
      fault.core = handle;
      CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_debug_inject_fault(&fault), "core");
    }
  }
  fault.kind = TERN_FAULT_HBM_UNCORRECTABLE;
  fault.core = core_;
  for (const auto& [label, handle] : BadBuffers()) {
    if (handle == nullptr) continue;  // NULL selects the command-counting form
    SCOPED_TRACE(label);
    fault.buffer = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_debug_inject_fault(&fault), "buffer");
  }
  // Nothing was armed: copies and fills on core_ and buffer_ still work.
  uint8_t bytes[64];
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer_, 0, 64, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, bytes, buffer_, 0, 64, nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_OK(tern_buffer_read(buffer_, 0, bytes, 64));
}

// --- Memory pools and stream-ordered allocation (tern/memory_pool.h) ------------------

TEST_P(NegativeTest, MemoryPoolCreate) {
  const tern_memory_pool_params_t good = PoolParams();
  tern_memory_pool_t pool = Forge<tern_memory_pool_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_memory_pool_create(device(0), &good, nullptr),
                   "out_pool");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_memory_pool_create(device(0), nullptr, &pool),
                   "params");
  EXPECT_EQ(nullptr, pool);
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    pool = Forge<tern_memory_pool_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_memory_pool_create(bad, &good, &pool),
                     "device");
    EXPECT_EQ(nullptr, pool);
  }
  tern_memory_pool_params_t params = good;
  for (uint32_t size : TooSmallStructSizes<tern_memory_pool_params_t>()) {
    SCOPED_TRACE(size);
    params.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_memory_pool_create(device(0), &params, &pool), "struct_size");
  }
  params = good;
  for (uint32_t flags : {1u, 0x100u, 0x80000000u}) {
    SCOPED_TRACE(flags);
    params.flags = flags;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_memory_pool_create(device(0), &params, &pool), "flags");
  }
  params = good;
  params.reserved = 1;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_memory_pool_create(device(0), &params, &pool),
                   "reserved");
  params = good;
  for (int category : {static_cast<int>(TERN_MEMORY_CATEGORY_COUNT), 7, 100, -1}) {
    SCOPED_TRACE(category);
    SetRawEnum(&params.category, category);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_memory_pool_create(device(0), &params, &pool), "category");
    EXPECT_EQ(nullptr, pool);
  }
  ExpectBufferUntouched();
}

TEST_P(NegativeTest, MemoryPoolDestroy) {
  for (const auto& [label, handle] : BadPools()) {
    SCOPED_TRACE(label);
    tern_memory_pool_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_memory_pool_destroy(bad), "pool");
  }
  // Default pools live until shutdown.
  for (uint32_t d = 0; d < device_count(); ++d) {
    tern_memory_pool_t pool = nullptr;
    CTS_ASSERT_OK(tern_device_default_memory_pool(device(d), &pool));
    CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_memory_pool_destroy(pool), "default");
  }
  // Outstanding allocations: refused, the pool unchanged.
  tern_buffer_t a = nullptr, b = nullptr;
  CTS_ASSERT_OK(tern_queue_alloc(queue_, 1000, pool_, &a));
  CTS_ASSERT_OK(tern_queue_alloc(queue_, 3000, pool_, &b));
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_memory_pool_destroy(pool_),
                   "2 live allocations", "tern_queue_free");
  CTS_ASSERT_OK(tern_queue_free(queue_, a));
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_memory_pool_destroy(pool_),
                   "1 live allocation");
  CTS_EXPECT_OK(tern_queue_fill(queue_, b, 0, 4, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_free(queue_, b));
  // A double destroy.
  CTS_EXPECT_OK(tern_memory_pool_destroy(pool_));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_memory_pool_destroy(pool_), "destroyed");
  // The wrong-kind "destroys" destroyed nothing.
  ExpectBufferUntouched();
  CTS_EXPECT_OK(tern_event_query(event_));
}

TEST_P(NegativeTest, DeviceDefaultMemoryPool) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_default_memory_pool(device(0), nullptr),
                   "out_pool");
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    tern_memory_pool_t pool = Forge<tern_memory_pool_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_device_default_memory_pool(bad, &pool),
                     "device");
    EXPECT_EQ(nullptr, pool);
  }
}

TEST_P(NegativeTest, MemoryPoolSetAttribute) {
  for (const auto& [label, handle] : BadPools()) {
    SCOPED_TRACE(label);
    tern_memory_pool_t bad = handle;
    CTS_EXPECT_ERROR(
        TERN_ERROR_INVALID_HANDLE,
        tern_memory_pool_set_attribute(bad, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, 0), "pool");
  }
  // Unknown values a C++ caller can form (C callers can pass any int; the
  // library reads it as an integer).
  tern_memory_pool_attribute_t attribute;
  for (int raw : {static_cast<int>(TERN_MEMORY_POOL_ATTR_COUNT), 3}) {
    SCOPED_TRACE(raw);
    SetRawEnum(&attribute, raw);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_memory_pool_set_attribute(pool_, attribute, 0), "attribute");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_memory_pool_set_attribute(pool_, TERN_MEMORY_POOL_ATTR_CATEGORY, 1),
                   "read-only");
  // Nothing changed.
  uint64_t value = 0;
  CTS_EXPECT_OK(
      tern_memory_pool_get_attribute(pool_, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, &value));
  EXPECT_EQ(UINT64_MAX, value);
  CTS_EXPECT_OK(tern_memory_pool_get_attribute(pool_, TERN_MEMORY_POOL_ATTR_CATEGORY, &value));
  EXPECT_EQ(static_cast<uint64_t>(TERN_MEMORY_TENSORS), value);
}

TEST_P(NegativeTest, MemoryPoolGetAttribute) {
  CTS_EXPECT_ERROR(
      TERN_ERROR_INVALID_ARGUMENT,
      tern_memory_pool_get_attribute(pool_, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, nullptr),
      "out_value");
  for (const auto& [label, handle] : BadPools()) {
    SCOPED_TRACE(label);
    tern_memory_pool_t bad = handle;
    uint64_t value = 99;
    CTS_EXPECT_ERROR(
        TERN_ERROR_INVALID_HANDLE,
        tern_memory_pool_get_attribute(bad, TERN_MEMORY_POOL_ATTR_RELEASE_THRESHOLD, &value),
        "pool");
    EXPECT_EQ(0u, value);
  }
  // Unknown values a C++ caller can form (C callers can pass any int; the
  // library reads it as an integer).
  tern_memory_pool_attribute_t attribute;
  for (int raw : {static_cast<int>(TERN_MEMORY_POOL_ATTR_COUNT), 3}) {
    SCOPED_TRACE(raw);
    SetRawEnum(&attribute, raw);
    uint64_t value = 99;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_memory_pool_get_attribute(pool_, attribute, &value), "attribute");
    EXPECT_EQ(0u, value);
  }
}

TEST_P(NegativeTest, MemoryPoolTrimTo) {
  for (const auto& [label, handle] : BadPools()) {
    SCOPED_TRACE(label);
    tern_memory_pool_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_memory_pool_trim_to(bad, 0), "pool");
  }
}

TEST_P(NegativeTest, MemoryPoolGetStats) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_memory_pool_get_stats(pool_, nullptr),
                   "out_stats");
  tern_memory_pool_stats_t stats;
  for (uint32_t size : TooSmallStructSizes<tern_memory_pool_stats_t>()) {
    SCOPED_TRACE(size);
    std::memset(&stats, 0, sizeof(stats));
    stats.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_memory_pool_get_stats(pool_, &stats),
                     "struct_size");
  }
  std::string kept_stale;
  for (const auto& [label, handle] : BadPools()) {
    SCOPED_TRACE(label);
    tern_memory_pool_t bad = handle;
    std::memset(&stats, 0xcd, sizeof(stats));
    stats.struct_size = sizeof(stats);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_memory_pool_get_stats(bad, &stats), "pool");
    if (stats.reserved_bytes != 0 || stats.allocations != 0) kept_stale += " [" + label + "]";
  }
  EXPECT_EQ("", kept_stale) << "out_stats kept stale contents after failing for these";
}

TEST_P(NegativeTest, QueueAlloc) {
  tern_buffer_t buffer = Forge<tern_buffer_t>(0x1234);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_alloc(queue_, 64, pool_, nullptr),
                   "out_buffer");
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    buffer = Forge<tern_buffer_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_alloc(bad, 64, pool_, &buffer), "queue");
    EXPECT_EQ(nullptr, buffer);
  }
  for (const auto& [label, handle] : BadPools()) {
    if (handle == nullptr) continue;  // NULL: the default pool
    SCOPED_TRACE(label);
    tern_memory_pool_t bad = handle;
    buffer = Forge<tern_buffer_t>(0x1234);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_alloc(queue_, 64, bad, &buffer), "pool");
    EXPECT_EQ(nullptr, buffer);
  }
  for (tern_memory_pool_t pool : {pool_, static_cast<tern_memory_pool_t>(nullptr)}) {
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_alloc(queue_, 0, pool, &buffer),
                     "0 bytes");
    EXPECT_EQ(nullptr, buffer);
    const uint64_t capacity = DeviceInfo(0).memory_bytes;
    for (uint64_t size : {capacity + 1, UINT64_MAX / 2, UINT64_MAX - 63, UINT64_MAX}) {
      SCOPED_TRACE(size);
      buffer = Forge<tern_buffer_t>(0x1234);
      CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_MEMORY, tern_queue_alloc(queue_, size, pool, &buffer),
                       "whole memory");
      EXPECT_EQ(nullptr, buffer);
    }
  }
  if (device_count() > 1) {
    tern_memory_pool_t other_device = nullptr;
    CTS_ASSERT_OK(tern_device_default_memory_pool(device(1), &other_device));
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_alloc(queue_, 64, other_device, &buffer), "device 1");
    EXPECT_EQ(nullptr, buffer);
  }
  // Nothing was allocated, and nothing was enqueued.
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(1u, stats.allocation_count);
  EXPECT_EQ(kBufferSize, stats.used_bytes);
  tern_memory_pool_stats_t pool_stats{};
  pool_stats.struct_size = sizeof(pool_stats);
  CTS_EXPECT_OK(tern_memory_pool_get_stats(pool_, &pool_stats));
  EXPECT_EQ(0u, pool_stats.allocations);
  EXPECT_EQ(0u, pool_stats.reserved_bytes);
  ExpectQueueUntouched();
}

TEST_P(NegativeTest, QueueFree) {
  tern_buffer_t buffer = nullptr;
  CTS_ASSERT_OK(tern_queue_alloc(queue_, 4096, pool_, &buffer));
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_free(bad, buffer), "queue");
  }
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_free(queue_, bad), "buffer");
  }
  // A buffer from tern_buffer_alloc has no pool: refused, and still live.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_free(queue_, buffer_),
                   "tern_buffer_alloc", "tern_buffer_free");
  ExpectBufferUntouched();
  if (device_count() > 1) {
    tern_core_t core1 = OpenCore(1, 0);
    tern_queue_t queue1 = CreateQueue(core1);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_queue_free(queue1, buffer), "device 0",
                     "device 1");
    CTS_EXPECT_OK(tern_queue_destroy(queue1));
    CTS_EXPECT_OK(tern_core_close(core1));
  }
  // The refusals left the buffer live and its pool as it was.
  tern_memory_pool_stats_t stats{};
  stats.struct_size = sizeof(stats);
  CTS_EXPECT_OK(tern_memory_pool_get_stats(pool_, &stats));
  EXPECT_EQ(1u, stats.allocation_count);
  CTS_EXPECT_OK(tern_queue_fill(queue_, buffer, 0, 4096, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_free(queue_, buffer));
  // A double free, and use after free.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_free(queue_, buffer), "buffer");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_free(buffer), "freed");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_fill(queue_, buffer, 0, 4, 0, nullptr),
                   "buffer");
  uint8_t bytes[4];
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_read(buffer, 0, bytes, 4), "buffer");
  tern_buffer_info_t info{};
  info.struct_size = sizeof(info);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_get_info(buffer, &info), "buffer");
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_OK(tern_memory_pool_get_stats(pool_, &stats));
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(1u, stats.allocations);
}

CTS_INSTANTIATE(NegativeTest);

// --- graph.h --------------------------------------------------------------------------

class NegativeGraphTest : public NegativeTest {
 protected:
  void SetUp() override {
    NegativeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    CTS_ASSERT_OK(tern_graph_create(device(0), nullptr, &graph_));
    CTS_ASSERT_OK(tern_graph_create(device(0), nullptr, &dead_graph_));
    CTS_ASSERT_OK(tern_graph_destroy(dead_graph_));
  }
  void TearDown() override {
    if (graph_ != nullptr) {
      EXPECT_EQ(TERN_OK, tern_graph_destroy(graph_));
    }
    NegativeTest::TearDown();
  }

  std::vector<std::pair<std::string, tern_graph_t>> BadGraphs() {
    return BadHandles<tern_graph_t>(dead_graph_, nullptr, {graph_});
  }
  uint32_t CommandCount(tern_graph_t graph) {
    tern_graph_info_t info{};
    info.struct_size = sizeof(info);
    CTS_EXPECT_OK(tern_graph_get_info(graph, &info));
    return info.command_count;
  }
  // A finalized graph: fill buffer_[0, 64), parameter 0 its destination.
  tern_graph_t FinalizedGraph() {
    tern_graph_t graph = nullptr;
    EXPECT_EQ(TERN_OK, tern_graph_create(device(0), nullptr, &graph));
    EXPECT_EQ(TERN_OK, tern_graph_add_fill(graph, buffer_, 0, 64, 0xabababab, nullptr));
    uint32_t parameter = 99;
    EXPECT_EQ(TERN_OK, tern_graph_add_parameter(graph, 0, TERN_GRAPH_OPERAND_DST, 0, &parameter));
    EXPECT_EQ(TERN_OK, tern_graph_finalize(graph));
    return graph;
  }

  tern_graph_t graph_ = nullptr;
  tern_graph_t dead_graph_ = nullptr;
};

TEST_P(NegativeGraphTest, Create) {
  tern_graph_t graph = Forge<tern_graph_t>(0x1234);
  for (const auto& [label, handle] : BadDevicesWithStale()) {
    SCOPED_TRACE(label);
    tern_device_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_create(bad, nullptr, &graph), "device");
    EXPECT_EQ(nullptr, graph);
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_graph_create(device(0), nullptr, nullptr),
                   "out_graph");
  tern_graph_params_t params{};
  for (uint32_t size : TooSmallStructSizes<tern_graph_params_t>()) {
    params.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_graph_create(device(0), &params, &graph),
                     "struct_size");
  }
  params.struct_size = sizeof(params);
  params.flags = 0x4;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_graph_create(device(0), &params, &graph),
                   "flags");
  EXPECT_EQ(nullptr, graph);
}

TEST_P(NegativeGraphTest, DestroyTwiceAndWrongKinds) {
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_destroy(bad), "graph");
  }
  tern_graph_t graph = nullptr;
  CTS_ASSERT_OK(tern_graph_create(device(0), nullptr, &graph));
  CTS_ASSERT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_destroy(graph), "already destroyed");
  // A graph handle is no queue, buffer or event.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_destroy(reinterpret_cast<tern_queue_t>(graph_)));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_buffer_free(reinterpret_cast<tern_buffer_t>(graph_)));
  EXPECT_EQ(0u, CommandCount(graph_));
  ExpectQueueUntouched();
}

TEST_P(NegativeGraphTest, RecordCopiesAndFill) {
  std::vector<uint8_t> data(kBufferSize + 8, 0x99);
  uint32_t command = 99;
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_copy_h2d(bad, buffer_, 0, data.data(), 64, &command), "graph");
    EXPECT_EQ(0u, command);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_fill(bad, buffer_, 0, 64, 0, nullptr), "graph");
  }
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    tern_buffer_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_copy_h2d(graph_, bad, 0, data.data(), 64, &command), "dst");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_copy_d2h(graph_, data.data(), bad, 0, 64, &command), "src");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_copy_d2d(graph_, buffer_, 0, bad, 0, 64, &command), "src");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_copy_d2d(graph_, bad, 0, buffer_, 0, 64, &command), "dst");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_fill(graph_, bad, 0, 64, 0, &command), "dst");
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_copy_h2d(graph_, buffer_, 0, nullptr, 64, &command), "src");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_copy_d2h(graph_, nullptr, buffer_, 0, 64, &command), "dst");
  for (const Range& range : BadRanges()) {
    SCOPED_TRACE("offset " + std::to_string(range.offset) + " size " + std::to_string(range.size));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_graph_add_copy_h2d(graph_, buffer_, range.offset, data.data(), range.size, &command));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_graph_add_copy_d2h(graph_, data.data(), buffer_, range.offset, range.size, &command));
    CTS_EXPECT_ERROR(
        TERN_ERROR_OUT_OF_RANGE,
        tern_graph_add_copy_d2d(graph_, buffer_, range.offset, buffer_, 0, range.size, &command));
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_graph_add_fill(graph_, buffer_, range.offset, range.size, 0, &command));
  }
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_fill(graph_, buffer_, 2, 64, 0, &command), "multiples of 4");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_fill(graph_, buffer_, 0, 6, 0, &command), "multiples of 4");
  if (buffer1_ != nullptr) {
    // A graph of device 0 cannot write device 1's memory from the host, and
    // a device-to-device copy needs one end on device 0.
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_graph_add_copy_h2d(graph_, buffer1_, 0, data.data(), 64, &command),
                     "device 1", "graph records for device 0");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_graph_add_fill(graph_, buffer1_, 0, 64, 0, &command), "device");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_graph_add_copy_d2d(graph_, buffer1_, 0, buffer1_, 64, 64, &command),
                     "neither dst nor src");
  }
  EXPECT_EQ(0u, CommandCount(graph_)) << "a refused command was recorded";
  ExpectQueueUntouched();
  ExpectBufferUntouched();
}

TEST_P(NegativeGraphTest, RecordCallbackAndWait) {
  uint32_t command = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_host_callback(graph_, nullptr, nullptr, &command), "callback");
  EXPECT_EQ(0u, command);
  for (const auto& [label, handle] : BadEvents()) {
    SCOPED_TRACE(label);
    tern_event_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_add_wait_event(graph_, bad, &command),
                     "event");
  }
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_host_callback(bad, NoopCallback, nullptr, &command), "graph");
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_add_wait_event(bad, event_, &command),
                     "graph");
  }
  EXPECT_EQ(0u, CommandCount(graph_));
}

TEST_P(NegativeGraphTest, AddParameter) {
  uint32_t parameter = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph_, 0, TERN_GRAPH_OPERAND_DST, 0, nullptr),
                   "out_parameter");
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_graph_add_parameter(graph_, 0, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                   "command 0 does not exist");
  EXPECT_EQ(0u, parameter);
  std::vector<uint8_t> data(64);
  CTS_ASSERT_OK(tern_graph_add_copy_h2d(graph_, buffer_, 0, data.data(), 64, nullptr));
  CTS_ASSERT_OK(tern_graph_add_host_callback(graph_, NoopCallback, nullptr, nullptr));
  CTS_ASSERT_OK(tern_graph_add_copy_d2d(graph_, buffer_, 0, buffer_, 64, 64, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                   tern_graph_add_parameter(graph_, 3, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                   "3 commands");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph_, 0, TERN_GRAPH_OPERAND_SRC, 0, &parameter),
                   "TERN_GRAPH_OPERAND_SRC");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph_, 0, TERN_GRAPH_OPERAND_INPUT, 0, &parameter));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph_, 1, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                   "host callback");
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph_, 0, TERN_GRAPH_OPERAND_DST, 1, &parameter),
                   "index is 1");
  // The operand travels as an int until the call, as it would from C: a
  // tern_graph_operand_t variable holding 7 is undefined behaviour in C++.
  for (int32_t bad_operand : {7, -1, 4}) {
    SCOPED_TRACE(bad_operand);
    const std::string needle = "operand " + std::to_string(bad_operand);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_graph_add_parameter(
                         graph_, 0, static_cast<tern_graph_operand_t>(bad_operand), 0, &parameter),
                     needle.c_str());
  }
  CTS_ASSERT_OK(tern_graph_add_parameter(graph_, 2, TERN_GRAPH_OPERAND_SRC, 0, &parameter));
  EXPECT_EQ(0u, parameter);
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_graph_add_parameter(graph_, 2, TERN_GRAPH_OPERAND_SRC, 0, &parameter),
                   "parameter 0 already");
  CTS_ASSERT_OK(tern_graph_add_parameter(graph_, 2, TERN_GRAPH_OPERAND_DST, 0, &parameter));
  EXPECT_EQ(1u, parameter);
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_graph_add_parameter(bad, 0, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                     "graph");
  }
}

TEST_P(NegativeGraphTest, FinalizedGraphRecordsNothing) {
  tern_graph_t graph = FinalizedGraph();
  std::vector<uint8_t> data(64);
  uint32_t command = 99, parameter = 99;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_graph_finalize(graph), "finalized already");
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_graph_add_copy_h2d(graph, buffer_, 0, data.data(), 64, &command),
                   "finalized");
  EXPECT_EQ(0u, command);
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_graph_add_fill(graph, buffer_, 0, 64, 0, &command), "finalized");
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_graph_add_host_callback(graph, NoopCallback, nullptr, &command),
                   "finalized");
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_graph_add_wait_event(graph, event_, &command), "finalized");
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_graph_add_parameter(graph, 0, TERN_GRAPH_OPERAND_DST, 0, &parameter),
                   "finalized");
  EXPECT_EQ(0u, parameter);
  EXPECT_EQ(1u, CommandCount(graph));
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_finalize(bad), "graph");
  }
  CTS_EXPECT_OK(tern_graph_destroy(graph));
}

TEST_P(NegativeGraphTest, GetInfo) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_graph_get_info(graph_, nullptr), "out_info");
  tern_graph_info_t info{};
  for (uint32_t size : TooSmallStructSizes<tern_graph_info_t>()) {
    info.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_graph_get_info(graph_, &info),
                     "struct_size");
  }
  info.struct_size = sizeof(info);
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    info.command_count = 7;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_graph_get_info(bad, &info), "graph");
    EXPECT_EQ(0u, info.command_count);
  }
}

TEST_P(NegativeGraphTest, Launch) {
  tern_graph_t graph = FinalizedGraph();
  uint64_t sequence = 99;
  for (const auto& [label, handle] : BadQueues()) {
    SCOPED_TRACE(label);
    tern_queue_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_launch_graph(bad, graph, nullptr, &sequence), "queue");
    EXPECT_EQ(0u, sequence);
  }
  for (const auto& [label, handle] : BadGraphs()) {
    SCOPED_TRACE(label);
    tern_graph_t bad = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_launch_graph(queue_, bad, nullptr, &sequence), "graph");
  }
  // Still recording.
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION,
                   tern_queue_launch_graph(queue_, graph_, nullptr, &sequence),
                   "tern_graph_finalize");
  EXPECT_EQ(0u, sequence);
  tern_graph_launch_params_t params{};
  for (uint32_t size : TooSmallStructSizes<tern_graph_launch_params_t>()) {
    params.struct_size = size;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_launch_graph(queue_, graph, &params, &sequence), "struct_size");
  }
  params.struct_size = sizeof(params);
  params.flags = 1;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_launch_graph(queue_, graph, &params, &sequence), "flags");
  params.flags = 0;
  params.reserved = 1;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_launch_graph(queue_, graph, &params, &sequence), "reserved");
  params.reserved = 0;
  params.argument_count = 1;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_launch_graph(queue_, graph, &params, &sequence), "arguments is NULL");
  tern_graph_argument_t arguments[2] = {};
  arguments[0].buffer = buffer_;
  arguments[1].buffer = buffer_;
  params.arguments = arguments;
  arguments[0].parameter = 1;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_launch_graph(queue_, graph, &params, &sequence), "parameter 1",
                   "1 parameters");
  arguments[0].parameter = 0;
  arguments[0].reserved = 3;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_launch_graph(queue_, graph, &params, &sequence), "reserved");
  arguments[0].reserved = 0;
  params.argument_count = 2;
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                   tern_queue_launch_graph(queue_, graph, &params, &sequence), "second time");
  params.argument_count = 1;
  for (const auto& [label, handle] : BadBuffers()) {
    SCOPED_TRACE(label);
    arguments[0].buffer = handle;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                     tern_queue_launch_graph(queue_, graph, &params, &sequence), "arguments[0]");
  }
  arguments[0].buffer = buffer_;
  for (uint64_t offset : {kBufferSize - 60, kBufferSize, kBufferSize + 4, UINT64_MAX - 3}) {
    SCOPED_TRACE(offset);
    arguments[0].offset = offset;
    CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE,
                     tern_queue_launch_graph(queue_, graph, &params, &sequence), "arguments[0]");
  }
  arguments[0].offset = 0;
  if (buffer1_ != nullptr) {
    arguments[0].buffer = buffer1_;
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_launch_graph(queue_, graph, &params, &sequence), "device 1");
    // A queue of device 1 cannot run a graph of device 0.
    tern_core_t core1 = OpenCore(1, 0);
    tern_queue_t queue1 = CreateQueue(core1);
    CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT,
                     tern_queue_launch_graph(queue1, graph, nullptr, &sequence),
                     "records for device 0", "device 1");
    CTS_EXPECT_OK(tern_queue_destroy(queue1));
  }
  EXPECT_EQ(0u, sequence);
  ExpectQueueUntouched();
  ExpectBufferUntouched();
  CTS_EXPECT_OK(tern_graph_destroy(graph));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE,
                   tern_queue_launch_graph(queue_, graph, nullptr, &sequence), "graph");
}

CTS_INSTANTIATE(NegativeGraphTest);

}  // namespace
}  // namespace tern::cts
