// CTS: runtime lifetime (tern_init / tern_shutdown reference counting, driver
// selection), the version query and status strings.
#include <thread>

#include "cts_fixture.h"

namespace tern::cts {
namespace {

// --- Backend-independent: callable before tern_init ------------------------------

struct CodeName {
  tern_status_t code;
  int32_t number;  // the stable number the header promises
  const char* name;
};

const CodeName kEveryCode[] = {
    {TERN_OK, 0, "TERN_OK"},
    {TERN_ERROR_INVALID_ARGUMENT, 1, "TERN_ERROR_INVALID_ARGUMENT"},
    {TERN_ERROR_INVALID_HANDLE, 2, "TERN_ERROR_INVALID_HANDLE"},
    {TERN_ERROR_OUT_OF_RANGE, 3, "TERN_ERROR_OUT_OF_RANGE"},
    {TERN_ERROR_NOT_INITIALIZED, 4, "TERN_ERROR_NOT_INITIALIZED"},
    {TERN_ERROR_UNAVAILABLE, 5, "TERN_ERROR_UNAVAILABLE"},
    {TERN_ERROR_UNIMPLEMENTED, 6, "TERN_ERROR_UNIMPLEMENTED"},
    {TERN_ERROR_BUSY, 7, "TERN_ERROR_BUSY"},
    {TERN_ERROR_TIMEOUT, 8, "TERN_ERROR_TIMEOUT"},
    {TERN_ERROR_NOT_READY, 9, "TERN_ERROR_NOT_READY"},
    {TERN_ERROR_FAILED_PRECONDITION, 10, "TERN_ERROR_FAILED_PRECONDITION"},
    {TERN_ERROR_ABORTED, 11, "TERN_ERROR_ABORTED"},
    {TERN_ERROR_FORKED, 12, "TERN_ERROR_FORKED"},
    {TERN_ERROR_INTERNAL, 13, "TERN_ERROR_INTERNAL"},
    {TERN_ERROR_INCOMPATIBLE, 14, "TERN_ERROR_INCOMPATIBLE"},
    {TERN_ERROR_IO, 15, "TERN_ERROR_IO"},
    {TERN_ERROR_DEPENDENCY_FAILED, 16, "TERN_ERROR_DEPENDENCY_FAILED"},
    {TERN_ERROR_OUT_OF_MEMORY, 100, "TERN_ERROR_OUT_OF_MEMORY"},
    {TERN_ERROR_HOST_OUT_OF_MEMORY, 101, "TERN_ERROR_HOST_OUT_OF_MEMORY"},
    {TERN_ERROR_EXEC_TIMEOUT, 200, "TERN_ERROR_EXEC_TIMEOUT"},
    {TERN_ERROR_EXECUTION_FAILED, 201, "TERN_ERROR_EXECUTION_FAILED"},
    {TERN_ERROR_HBM_UNCORRECTABLE, 300, "TERN_ERROR_HBM_UNCORRECTABLE"},
    {TERN_ERROR_DMA_ABORT, 301, "TERN_ERROR_DMA_ABORT"},
    {TERN_ERROR_CORE_HANG, 302, "TERN_ERROR_CORE_HANG"},
    {TERN_ERROR_EXECUTABLE_INVALID, 400, "TERN_ERROR_EXECUTABLE_INVALID"},
    {TERN_ERROR_EXECUTABLE_UNSUPPORTED, 401, "TERN_ERROR_EXECUTABLE_UNSUPPORTED"},
    {TERN_ERROR_EXECUTABLE_CHECKSUM, 402, "TERN_ERROR_EXECUTABLE_CHECKSUM"},
    {TERN_ERROR_COMM_PEER_LOST, 500, "TERN_ERROR_COMM_PEER_LOST"},
    {TERN_ERROR_COMM_TIMEOUT, 501, "TERN_ERROR_COMM_TIMEOUT"},
    {TERN_ERROR_COMM_MISMATCH, 502, "TERN_ERROR_COMM_MISMATCH"},
    {TERN_ERROR_COMM_ABORTED, 503, "TERN_ERROR_COMM_ABORTED"},
    {TERN_ERROR_COMM_TRANSPORT, 504, "TERN_ERROR_COMM_TRANSPORT"},
};

TEST(LifecycleApi, StatusCodesKeepTheirNumbersAndNames) {
  for (const CodeName& entry : kEveryCode) {
    SCOPED_TRACE(entry.name);
    EXPECT_EQ(entry.number, entry.code);
    const char* name = tern_status_string(entry.code);
    ASSERT_NE(name, nullptr);
    EXPECT_STREQ(entry.name, name);
  }
}

TEST(LifecycleApi, StatusStringOfUnknownCodes) {
  // Outside every range the header reserves (codes inside them may be added).
  const tern_status_t unknown[] = {-1, -100, 600, 999, 1000, 65536, INT32_MIN, INT32_MAX};
  for (tern_status_t code : unknown) {
    SCOPED_TRACE(code);
    const char* name = tern_status_string(code);
    ASSERT_NE(name, nullptr);
    EXPECT_STREQ("TERN_ERROR_UNKNOWN", name);
  }
}

// `value` as an enum argument, outside the enum's values: what a C caller can
// pass. Built without UBSan's enum check, which (at -O0) flags the load of an
// enum variable holding such a value; the callee is what is tested.
template <typename Enum>
__attribute__((no_sanitize("enum"))) Enum OutOfRange(int value) {
  Enum e;
  std::memcpy(&e, &value, sizeof(e));
  return e;
}

TEST(LifecycleApi, DtypeSizesAndNames) {
  // Callable before tern_init(), like the status strings.
  struct Expected {
    tern_dtype_t dtype;
    uint64_t size;
    const char* name;
  };
  const Expected every_dtype[] = {
      {TERN_DTYPE_F32, 4, "f32"},   {TERN_DTYPE_BF16, 2, "bf16"}, {TERN_DTYPE_F16, 2, "f16"},
      {TERN_DTYPE_I8, 1, "i8"},     {TERN_DTYPE_I32, 4, "i32"},   {TERN_DTYPE_I64, 8, "i64"},
      {TERN_DTYPE_BOOL, 1, "bool"}, {TERN_DTYPE_F64, 8, "f64"},
  };
  static_assert(sizeof(every_dtype) / sizeof(every_dtype[0]) == TERN_DTYPE_COUNT,
                "a dtype was added: list it here");
  for (const Expected& e : every_dtype) {
    SCOPED_TRACE(e.name);
    EXPECT_EQ(e.size, tern_dtype_size(e.dtype));
    EXPECT_STREQ(e.name, tern_dtype_name(e.dtype));
  }
  for (int value : {-1, static_cast<int>(TERN_DTYPE_COUNT), 255, INT32_MAX}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(0u, tern_dtype_size(OutOfRange<tern_dtype_t>(value)));
    EXPECT_STREQ("unknown", tern_dtype_name(OutOfRange<tern_dtype_t>(value)));
  }
}

TEST(LifecycleApi, MemoryCategoryNames) {
  const char* const expected[] = {"tensors", "constants",   "code",
                                  "scratch", "collectives", "runtime"};
  static_assert(sizeof(expected) / sizeof(expected[0]) == TERN_MEMORY_CATEGORY_COUNT,
                "a category was added: list it here");
  for (int i = 0; i < TERN_MEMORY_CATEGORY_COUNT; ++i) {
    EXPECT_STREQ(expected[i], tern_memory_category_name(static_cast<tern_memory_category_t>(i)));
  }
  for (int value : {-1, static_cast<int>(TERN_MEMORY_CATEGORY_COUNT), INT32_MAX}) {
    EXPECT_STREQ("unknown", tern_memory_category_name(OutOfRange<tern_memory_category_t>(value)));
  }
}

TEST(LifecycleApi, VersionMatchesHeaderMacros) {
  tern_version_t version;
  std::memset(&version, 0xab, sizeof(version));
  version.struct_size = sizeof(version);
  CTS_ASSERT_OK(tern_get_version(&version));
  EXPECT_EQ(sizeof(version), version.struct_size);
  EXPECT_EQ(static_cast<uint32_t>(TERN_VERSION_MAJOR), version.major);
  EXPECT_EQ(static_cast<uint32_t>(TERN_VERSION_MINOR), version.minor);
  EXPECT_EQ(static_cast<uint32_t>(TERN_VERSION_PATCH), version.patch);
  EXPECT_EQ(TERN_VERSION, version.major * 10000 + version.minor * 100 + version.patch);
  ASSERT_NE(version.build, nullptr);
  EXPECT_GT(std::strlen(version.build), 0u);
}

TEST(LifecycleApi, VersionLeavesFieldsBeyondStructSizeAlone) {
  // A caller that knows the struct without `build` (an older header).
  tern_version_t version;
  const char* sentinel = "untouched";
  std::memset(&version, 0, sizeof(version));
  version.build = sentinel;
  version.struct_size = offsetof(tern_version_t, build);
  CTS_ASSERT_OK(tern_get_version(&version));
  EXPECT_EQ(static_cast<uint32_t>(TERN_VERSION_MAJOR), version.major);
  EXPECT_EQ(static_cast<uint32_t>(TERN_VERSION_MINOR), version.minor);
  EXPECT_EQ(static_cast<uint32_t>(TERN_VERSION_PATCH), version.patch);
  EXPECT_EQ(sentinel, version.build);
  EXPECT_EQ(offsetof(tern_version_t, build), version.struct_size);
}

TEST(LifecycleApi, LastErrorMessageIsPerThread) {
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_device_count(nullptr), "out_count");
  const std::string main_message = tern_last_error_message();
  std::string fresh_thread_message = "not run";
  std::string other_message;
  std::thread thread([&] {
    fresh_thread_message = tern_last_error_message();
    (void)tern_get_version(nullptr);
    other_message = tern_last_error_message();
  });
  thread.join();
  EXPECT_EQ("", fresh_thread_message) << "a thread with no failed call must see \"\"";
  EXPECT_NE("", other_message);
  EXPECT_NE(main_message, other_message);
  EXPECT_EQ(main_message, tern_last_error_message()) << "another thread's failure leaked here";
  // A successful call does not clear the message.
  tern_version_t version{};
  version.struct_size = sizeof(version);
  CTS_EXPECT_OK(tern_get_version(&version));
  EXPECT_EQ(main_message, tern_last_error_message());
}

TEST(LifecycleApi, DriverNameIsNullBeforeInit) { EXPECT_EQ(nullptr, tern_driver_name()); }

// --- The null backend's refusal (runs; never skipped) ---------------------------------

TEST(LifecycleNullBackend, InitReportsUnavailableNamingSim) {
  tern_init_options_t options{};
  options.struct_size = sizeof(options);
  options.driver = "null";
  CTS_EXPECT_ERROR(TERN_ERROR_UNAVAILABLE, tern_init(&options), "TERN_DRIVER=sim");
  // A failed init takes no reference and leaves nothing behind.
  EXPECT_EQ(nullptr, tern_driver_name());
  uint32_t count = 7;
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_device_count(&count));
  EXPECT_EQ(0u, count);
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
  // And the process can still choose the simulated device afterwards.
  options.driver = "sim";
  CTS_ASSERT_OK(tern_init(&options));
  EXPECT_STREQ("sim", tern_driver_name());
  CTS_EXPECT_OK(tern_shutdown());
}

TEST(LifecycleNullBackend, TernDriverEnvironmentSelectsNull) {
  ScopedEnv env("TERN_DRIVER", "null");
  CTS_EXPECT_ERROR(TERN_ERROR_UNAVAILABLE, tern_init(nullptr), "TERN_DRIVER=sim");
  EXPECT_EQ(nullptr, tern_driver_name());
  // The options win over the environment.
  tern_init_options_t options{};
  options.struct_size = sizeof(options);
  options.driver = "sim";
  CTS_ASSERT_OK(tern_init(&options));
  EXPECT_STREQ("sim", tern_driver_name());
  CTS_EXPECT_OK(tern_shutdown());
}

// --- Per backend ------------------------------------------------------------------------

class LifecycleTest : public BackendTest {};

TEST_P(LifecycleTest, InitShutdownReferenceCounting) {
  CTS_INIT_OR_SKIP();
  CTS_ASSERT_OK(InitBackend());  // second reference
  ASSERT_NE(nullptr, tern_driver_name());
  EXPECT_STREQ(backend(), tern_driver_name());

  tern_device_t device = nullptr;
  CTS_ASSERT_OK(tern_device_get(0, &device));
  tern_buffer_t buffer = nullptr;
  const tern_buffer_params_t params = BufferParams(4096);
  CTS_ASSERT_OK(tern_buffer_alloc(device, &params, &buffer));

  // First shutdown: one reference left, everything still alive.
  CTS_ASSERT_OK(tern_shutdown());
  EXPECT_STREQ(backend(), tern_driver_name());
  tern_buffer_info_t info{};
  info.struct_size = sizeof(info);
  CTS_EXPECT_OK(tern_buffer_get_info(buffer, &info));
  EXPECT_EQ(4096u, info.size);

  // Second: the runtime is gone, with the buffer.
  CTS_ASSERT_OK(tern_shutdown());
  EXPECT_EQ(nullptr, tern_driver_name());
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_buffer_get_info(buffer, &info));
  uint32_t count = 0;
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_device_count(&count));

  // Third: nothing left to drop.
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown(), "tern_init");
}

TEST_P(LifecycleTest, InitWithNullOptionsAddsReference) {
  CTS_INIT_OR_SKIP();
  CTS_ASSERT_OK(tern_init(nullptr));
  tern_init_options_t options{};
  options.struct_size = sizeof(options);  // driver NULL: keep the active one
  CTS_ASSERT_OK(tern_init(&options));
  EXPECT_STREQ(backend(), tern_driver_name());
  CTS_EXPECT_OK(tern_shutdown());
  CTS_EXPECT_OK(tern_shutdown());
  CTS_EXPECT_OK(tern_shutdown());
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
}

TEST_P(LifecycleTest, SwitchingDriverWhileInitializedFails) {
  CTS_INIT_OR_SKIP();
  for (const char* other : kBackends) {
    if (std::strcmp(other, backend()) == 0) continue;
    tern_init_options_t options{};
    options.struct_size = sizeof(options);
    options.driver = other;
    CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_init(&options), backend(), other);
  }
  // The failed calls took no reference.
  CTS_EXPECT_OK(tern_shutdown());
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
}

TEST_P(LifecycleTest, DriverNameFollowsLifetime) {
  EXPECT_EQ(nullptr, tern_driver_name());
  CTS_INIT_OR_SKIP();
  ASSERT_NE(nullptr, tern_driver_name());
  EXPECT_STREQ(backend(), tern_driver_name());
  CTS_EXPECT_OK(tern_shutdown());
  EXPECT_EQ(nullptr, tern_driver_name());
}

TEST_P(LifecycleTest, LastShutdownReleasesEverything) {
  CTS_INIT_OR_SKIP();
  tern_device_t device = nullptr;
  CTS_ASSERT_OK(tern_device_get(0, &device));
  // Leave a core, a queue, a buffer, an event and pinned memory behind.
  tern_core_t core = nullptr;
  CTS_ASSERT_OK(tern_core_open(device, 0, &core));
  tern_queue_t queue = nullptr;
  CTS_ASSERT_OK(tern_queue_create(core, nullptr, &queue));
  tern_buffer_t buffer = nullptr;
  const tern_buffer_params_t params = BufferParams(8 << 20, TERN_MEMORY_CONSTANTS);
  CTS_ASSERT_OK(tern_buffer_alloc(device, &params, &buffer));
  tern_event_t event = nullptr;
  CTS_ASSERT_OK(tern_event_create(&event));
  CTS_ASSERT_OK(tern_queue_record_event(queue, event, nullptr));
  void* host = nullptr;
  CTS_ASSERT_OK(tern_host_alloc(4096, &host));
  CTS_ASSERT_OK(tern_shutdown());

  CTS_ASSERT_OK(InitBackend());
  CTS_ASSERT_OK(tern_device_get(0, &device));
  // The core is free again and the memory was given back.
  tern_core_t again = nullptr;
  CTS_EXPECT_OK(tern_core_open(device, 0, &again));
  tern_memory_stats_t stats{};
  stats.struct_size = sizeof(stats);
  CTS_ASSERT_OK(tern_device_memory_stats(device, &stats));
  EXPECT_EQ(0u, stats.used_bytes);
  EXPECT_EQ(0u, stats.allocation_count);
  EXPECT_EQ(0u, stats.peak_used_bytes) << "peak counts since tern_init";
  EXPECT_EQ(0u, stats.node_used_bytes);
  // Handles of the old session are dead.
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_nop(queue, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_buffer_free(buffer));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_query(event));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_core_close(core));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_ARGUMENT, tern_host_free(host));
}

void SleepThenSet(void* user_data, tern_status_t status) {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  static_cast<std::atomic<int>*>(user_data)->store(status == TERN_OK ? 1 : 2);
}

TEST_P(LifecycleTest, LastShutdownDrainsQueues) {
  CTS_INIT_OR_SKIP();
  tern_device_t device = nullptr;
  CTS_ASSERT_OK(tern_device_get(0, &device));
  tern_core_t core = nullptr;
  CTS_ASSERT_OK(tern_core_open(device, 0, &core));
  tern_queue_t queue = nullptr;
  CTS_ASSERT_OK(tern_queue_create(core, nullptr, &queue));
  auto* done = Make<std::atomic<int>>(0);
  CTS_ASSERT_OK(tern_queue_host_callback(queue, SleepThenSet, done, nullptr));
  CTS_ASSERT_OK(tern_shutdown());
  EXPECT_EQ(1, done->load()) << "the last shutdown must let queued work finish first";
}

TEST_P(LifecycleTest, ConcurrentInitAndShutdown) {
  CTS_INIT_OR_SKIP();  // holds one reference throughout
  constexpr int kThreads = 4;
  constexpr int kRounds = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        if (InitBackend() != TERN_OK) ++failures;
        uint32_t count = 0;
        if (tern_device_count(&count) != TERN_OK || count == 0) ++failures;
        if (tern_shutdown() != TERN_OK) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(0, failures.load());
  CTS_EXPECT_OK(tern_shutdown());
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
}

TEST_P(LifecycleTest, ConcurrentFirstInitAndLastShutdown) {
  // Every thread's init may be the first and its shutdown the last.
  {
    CTS_INIT_OR_SKIP();
    CTS_ASSERT_OK(tern_shutdown());
  }
  constexpr int kThreads = 3;
  constexpr int kRounds = 5;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        if (InitBackend() != TERN_OK) ++failures;
        if (tern_shutdown() != TERN_OK) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(0, failures.load());
  CTS_EXPECT_ERROR(TERN_ERROR_NOT_INITIALIZED, tern_shutdown());
}

CTS_INSTANTIATE(LifecycleTest);

}  // namespace
}  // namespace tern::cts
