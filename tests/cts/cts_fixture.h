// tern conformance test suite (CTS): shared fixtures and helpers.
//
// Every test is written once against the public C API and instantiated for
// each driver backend (INSTANTIATE_TEST_SUITE_P over kBackends). The fixture
// initializes the runtime with tern_init_options_t.driver set to the test's
// backend. A backend that cannot run a test skips it with a reason; every
// such skip is listed in kSkipList below, so the per-backend gaps are visible
// in one place instead of being scattered through the tests.
//
// The suite uses only the public headers. It expects the test environment of
// tests/common/test_main.cc: a private simulated node per process and
// TERN_SIM_TOPOLOGY=2x2x256M (2 devices, 2 cores each, 256 MiB of HBM).
#ifndef TERN_TESTS_CTS_CTS_FIXTURE_H_
#define TERN_TESTS_CTS_CTS_FIXTURE_H_

#include <gtest/gtest.h>
#include <tern/tern.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tern::cts {

// --- Backends and the skip list ---------------------------------------------

// Every backend the suite runs against.
inline constexpr const char* kBackends[] = {"sim", "null"};

// One backend limitation: the tests it does not run, and why.
struct SkipEntry {
  const char* backend;
  // Glob ('*' and '?') over "Suite.Test", without the instantiation prefix or
  // the "/backend" suffix: "MemoryTest.*", "*ProtectMode*", "*".
  const char* test_pattern;
  // The entry applies when tern_init() returns this code for the backend
  // (TERN_OK: whenever the backend initializes, i.e. a known missing feature).
  tern_status_t when_init_returns;
  const char* reason;
};

// The per-backend skip list. Tests that run before tern_init() (status
// strings, the version query, NOT_INITIALIZED checks) run on every backend.
// A skip reads "<backend> backend: <reason>", followed by tern_init()'s
// message in parentheses when the entry is about an init failure.
inline constexpr SkipEntry kSkipList[] = {
    // driver_shim/null is a template for new hardware backends: it loads, then
    // reports that it has no devices. Every test that needs an initialized
    // runtime is skipped; LifecycleNullBackend.* checks the refusal itself.
    {"null", "*", TERN_ERROR_UNAVAILABLE, "a skeleton with no devices"},
    // A hardware backend would add TERN_OK entries here for what only the
    // simulated device can do: "*TestTopology*" and "DeviceVisibleCoresTest.*"
    // (the layout TERN_SIM_TOPOLOGY=2x2x256M gives), "*ProtectMode*"
    // (TERN_SIM_PROTECT), "QueueErrorTest.*" (tern_debug_inject_fault) and
    // "*SharedBufferLimitOfTheSimulatedDevice" (the sim's 256 shared buffers).
};

// Matches `text` against a glob with '*' (any run) and '?' (one character).
bool GlobMatch(const char* pattern, const char* text);

// "Suite.Test" of the running test, without prefix and parameter suffix.
std::string CurrentTestName();

// The skip-list entry for this backend, test and init result, or null.
const SkipEntry* FindSkip(const std::string& backend, const std::string& test,
                          tern_status_t init_status);

// Test names "<Test>/<backend>".
struct BackendName {
  std::string operator()(const ::testing::TestParamInfo<const char*>& info) const {
    return info.param;
  }
};

#define CTS_INSTANTIATE(Fixture)                                                           \
  INSTANTIATE_TEST_SUITE_P(Backends, Fixture, ::testing::ValuesIn(::tern::cts::kBackends), \
                           ::tern::cts::BackendName())

// --- Status assertions -------------------------------------------------------

// Pretty "TERN_ERROR_X (n)".
std::string StatusName(tern_status_t status);

::testing::AssertionResult StatusIs(tern_status_t expected, tern_status_t actual, const char* expr);

// Runs `call`, which must fail with exactly `expected`, leave a non-empty
// last-error message of its own (not a stale one from an earlier call) and
// mention every string of `needles`.
::testing::AssertionResult FailsWith(tern_status_t expected,
                                     const std::function<tern_status_t()>& call, const char* expr,
                                     std::initializer_list<const char*> needles);

#define CTS_EXPECT_OK(expr) EXPECT_TRUE(::tern::cts::StatusIs(TERN_OK, (expr), #expr))
#define CTS_ASSERT_OK(expr) ASSERT_TRUE(::tern::cts::StatusIs(TERN_OK, (expr), #expr))
#define CTS_EXPECT_STATUS(expected, expr) \
  EXPECT_TRUE(::tern::cts::StatusIs((expected), (expr), #expr))
// CTS_EXPECT_ERROR(code, call, "needle", ...): see FailsWith().
#define CTS_EXPECT_ERROR(expected, expr, ...)                                                      \
  EXPECT_TRUE(::tern::cts::FailsWith((expected), [&]() -> tern_status_t { return (expr); }, #expr, \
                                     {__VA_ARGS__}))
#define CTS_ASSERT_ERROR(expected, expr, ...)                                                      \
  ASSERT_TRUE(::tern::cts::FailsWith((expected), [&]() -> tern_status_t { return (expr); }, #expr, \
                                     {__VA_ARGS__}))

// --- Environment -------------------------------------------------------------

// Sets (or, with nullopt, unsets) an environment variable for the scope and
// restores the previous value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// --- Host callback helpers ---------------------------------------------------

// A host callback that blocks its queue until the test opens the gate (or a
// safety timeout passes, so that a failing test never hangs). The fixture owns
// every gate and opens them all before tearing the runtime down.
class Gate {
 public:
  static constexpr auto kSafetyTimeout = std::chrono::seconds(20);

  static void Callback(void* user_data, tern_status_t status);
  void Open();
  // Waits until a queue has entered the callback.
  bool WaitEntered(std::chrono::milliseconds timeout);
  bool entered() const { return entered_.load(); }
  tern_status_t status() const { return status_.load(); }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  std::atomic<bool> entered_{false};
  std::atomic<tern_status_t> status_{-1};
};

// Records the order and status of host callbacks: each callback's user_data
// is a Tag{log, id}.
class CallbackLog {
 public:
  struct Tag {
    CallbackLog* log;
    int id;
  };
  static void Callback(void* user_data, tern_status_t status);
  // A tag that lives as long as the log.
  void* NewTag(int id);
  std::vector<std::pair<int, tern_status_t>> entries();

 private:
  std::mutex mutex_;
  std::deque<Tag> tags_;
  std::vector<std::pair<int, tern_status_t>> entries_;
};

// --- Fixtures ----------------------------------------------------------------

// Parameterized by backend name; does not initialize anything by itself.
class BackendTest : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override;

  const char* backend() const { return GetParam(); }

  // tern_init() with the test's backend (adds a reference when initialized).
  tern_status_t InitBackend();
  // InitBackend(), skipping the test as the skip list says, or failing it when
  // init fails for a reason the list does not give. Use through
  // CTS_INIT_OR_SKIP() so that the test body stops.
  void InitOrSkip();
  // Drops every reference this process holds.
  void ShutdownAll();

  // Objects owned by the fixture outlive the runtime: host callbacks and
  // in-flight copies may point at them even when a test stops early.
  template <typename T, typename... Args>
  T* Make(Args&&... args) {
    auto object = std::make_shared<T>(std::forward<Args>(args)...);
    T* raw = object.get();
    keep_alive_.push_back(std::move(object));
    return raw;
  }
  Gate* NewGate() {
    Gate* gate = Make<Gate>();
    gates_.push_back(gate);
    return gate;
  }
  std::vector<uint8_t>* HostBytes(size_t size, uint8_t fill = 0) {
    return Make<std::vector<uint8_t>>(size, fill);
  }

 private:
  std::vector<std::shared_ptr<void>> keep_alive_;
  std::vector<Gate*> gates_;
};

#define CTS_INIT_OR_SKIP()                        \
  do {                                            \
    InitOrSkip();                                 \
    if (IsSkipped() || HasFatalFailure()) return; \
  } while (0)

// Initializes the backend in SetUp (or skips) and lists the devices.
class RuntimeTest : public BackendTest {
 protected:
  void SetUp() override;

  // Fetches device handles again (after a shutdown + init cycle).
  void RefreshDevices();
  // tern_shutdown(), InitBackend() and RefreshDevices(): handles taken before
  // are now stale. Callers check HasFatalFailure() after.
  void RestartRuntime();

  uint32_t device_count() const { return static_cast<uint32_t>(devices_.size()); }
  tern_device_t device(uint32_t index) const { return devices_.at(index); }

  // Each helper records a test failure and returns NULL when the call fails.
  tern_core_t OpenCore(uint32_t device_index, uint32_t core_index);
  tern_queue_t CreateQueue(tern_core_t core, const char* name = nullptr);
  tern_buffer_t Alloc(uint32_t device_index, uint64_t size,
                      tern_memory_category_t category = TERN_MEMORY_TENSORS,
                      uint64_t alignment = 0);
  tern_event_t CreateEvent();
  tern_buffer_info_t BufferInfo(tern_buffer_t buffer);
  tern_memory_stats_t MemoryStats(uint32_t device_index);
  tern_device_info_t DeviceInfo(uint32_t device_index);

  // Skips the test when the backend has fewer devices than needed.
  bool NeedDevices(uint32_t count);

  std::vector<tern_device_t> devices_;
};

#define CTS_NEED_DEVICES(n)                                                              \
  do {                                                                                   \
    if (!NeedDevices(n))                                                                 \
      GTEST_SKIP() << "needs " << (n) << " devices, the backend has " << device_count(); \
  } while (0)

// --- Data helpers --------------------------------------------------------------

// Deterministic bytes: a different sequence for each seed.
std::vector<uint8_t> Pattern(size_t size, uint32_t seed);

// Byte counts as tern messages may write them: "268435456" or "256.00 MiB".
bool MentionsBytes(const std::string& message, uint64_t bytes);
std::string HumanBytes(uint64_t bytes);

inline tern_buffer_params_t BufferParams(uint64_t size,
                                         tern_memory_category_t category = TERN_MEMORY_TENSORS,
                                         uint64_t alignment = 0) {
  tern_buffer_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.size = size;
  params.alignment = alignment;
  params.category = category;
  return params;
}

// Test-topology constants (TERN_SIM_TOPOLOGY=2x2x256M).
inline constexpr uint32_t kTestDevices = 2;
inline constexpr uint32_t kTestCoresPerDevice = 2;
inline constexpr uint64_t kTestMemoryBytes = 256ull << 20;

inline constexpr uint64_t kMs = 1000000ull;  // nanoseconds
inline constexpr uint64_t kLongTimeout = 20000 * kMs;

}  // namespace tern::cts

#endif  // TERN_TESTS_CTS_CTS_FIXTURE_H_
