#include "cts_fixture.h"

#include <cinttypes>
#include <cstdio>

namespace tern::cts {

// --- Skip list -------------------------------------------------------------------

bool GlobMatch(const char* pattern, const char* text) {
  // Iterative matcher with one backtrack point for the last '*'.
  const char* star = nullptr;
  const char* resume = nullptr;
  while (*text != '\0') {
    if (*pattern == '*') {
      star = pattern++;
      resume = text;
    } else if (*pattern == '?' || *pattern == *text) {
      ++pattern;
      ++text;
    } else if (star != nullptr) {
      pattern = star + 1;
      text = ++resume;
    } else {
      return false;
    }
  }
  while (*pattern == '*') ++pattern;
  return *pattern == '\0';
}

std::string CurrentTestName() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "";
  std::string suite = info->test_suite_name();
  if (size_t slash = suite.find('/'); slash != std::string::npos) suite = suite.substr(slash + 1);
  std::string name = info->name();
  if (size_t slash = name.find('/'); slash != std::string::npos) name = name.substr(0, slash);
  return suite + "." + name;
}

const SkipEntry* FindSkip(const std::string& backend, const std::string& test,
                          tern_status_t init_status) {
  for (const SkipEntry& entry : kSkipList) {
    if (backend == entry.backend && entry.when_init_returns == init_status &&
        GlobMatch(entry.test_pattern, test.c_str())) {
      return &entry;
    }
  }
  return nullptr;
}

// --- Status assertions -------------------------------------------------------------

std::string StatusName(tern_status_t status) {
  return std::string(tern_status_string(status)) + " (" + std::to_string(status) + ")";
}

::testing::AssertionResult StatusIs(tern_status_t expected, tern_status_t actual,
                                    const char* expr) {
  if (actual == expected) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << expr << " returned " << StatusName(actual) << ", expected " << StatusName(expected)
         << "; last error message: \"" << tern_last_error_message() << "\"";
}

namespace {

// Two different failing calls that work before and after tern_init(), used to
// put a known message in place before the call under test.
void PrimeLastError(int which) {
  if (which == 0) {
    (void)tern_get_version(nullptr);
  } else {
    (void)tern_device_count(nullptr);
  }
}

}  // namespace

::testing::AssertionResult FailsWith(tern_status_t expected,
                                     const std::function<tern_status_t()>& call, const char* expr,
                                     std::initializer_list<const char*> needles) {
  PrimeLastError(0);
  std::string primed = tern_last_error_message();
  tern_status_t actual = call();
  std::string message = tern_last_error_message();
  if (actual != TERN_OK && message == primed) {
    // The call under test left exactly the primer's message (it is the
    // primer, or it set none): prime with the other one and call it again.
    PrimeLastError(1);
    primed = tern_last_error_message();
    actual = call();
    message = tern_last_error_message();
  }
  if (actual != expected) {
    return ::testing::AssertionFailure()
           << expr << " returned " << StatusName(actual) << ", expected " << StatusName(expected)
           << "; last error message: \"" << message << "\"";
  }
  if (message.empty()) {
    return ::testing::AssertionFailure()
           << expr << " failed with " << StatusName(actual) << " but left no error message";
  }
  if (message == primed) {
    return ::testing::AssertionFailure()
           << expr << " failed with " << StatusName(actual)
           << " but did not set its own error message (still \"" << message << "\")";
  }
  for (const char* needle : needles) {
    if (message.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << expr << " failed with " << StatusName(actual)
                                           << " as expected, but its message does not mention \""
                                           << needle << "\": \"" << message << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// --- Environment ---------------------------------------------------------------------

ScopedEnv::ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
  if (const char* old = std::getenv(name)) old_ = old;
  if (value) {
    setenv(name, value->c_str(), 1);
  } else {
    unsetenv(name);
  }
}

ScopedEnv::~ScopedEnv() {
  if (old_) {
    setenv(name_.c_str(), old_->c_str(), 1);
  } else {
    unsetenv(name_.c_str());
  }
}

// --- Callbacks -------------------------------------------------------------------------

void Gate::Callback(void* user_data, tern_status_t status) {
  auto* gate = static_cast<Gate*>(user_data);
  gate->status_.store(status);
  std::unique_lock<std::mutex> lock(gate->mutex_);
  gate->entered_.store(true);
  gate->cv_.notify_all();
  gate->cv_.wait_for(lock, kSafetyTimeout, [gate] { return gate->open_; });
}

void Gate::Open() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_ = true;
  cv_.notify_all();
}

bool Gate::WaitEntered(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [this] { return entered_.load(); });
}

void CallbackLog::Callback(void* user_data, tern_status_t status) {
  auto* tag = static_cast<Tag*>(user_data);
  std::lock_guard<std::mutex> lock(tag->log->mutex_);
  tag->log->entries_.emplace_back(tag->id, status);
}

void* CallbackLog::NewTag(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  tags_.push_back(Tag{this, id});
  return &tags_.back();
}

std::vector<std::pair<int, tern_status_t>> CallbackLog::entries() {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

// --- Fixtures --------------------------------------------------------------------------

tern_status_t BackendTest::InitBackend() {
  tern_init_options_t options;
  std::memset(&options, 0, sizeof(options));
  options.struct_size = sizeof(options);
  options.driver = backend();
  return tern_init(&options);
}

void BackendTest::InitOrSkip() {
  const std::string test = CurrentTestName();
  const tern_status_t status = InitBackend();
  const std::string message = status == TERN_OK ? "" : tern_last_error_message();
  if (const SkipEntry* entry = FindSkip(backend(), test, status)) {
    if (status == TERN_OK) {
      ShutdownAll();
      GTEST_SKIP() << backend() << " backend: " << entry->reason;
    }
    GTEST_SKIP() << backend() << " backend: " << entry->reason << " (" << message << ")";
  }
  ASSERT_EQ(TERN_OK, status) << "tern_init(driver=\"" << backend()
                             << "\") failed and the CTS skip list has no entry for " << test << ": "
                             << StatusName(status) << ": " << message;
}

void BackendTest::ShutdownAll() {
  // Bounded: a runtime that never reaches zero references is a bug to report,
  // not a reason to hang.
  for (int i = 0; i < 64 && tern_shutdown() == TERN_OK; ++i) {
  }
}

void BackendTest::TearDown() {
  // Release every blocked queue before the runtime drains them.
  for (Gate* gate : gates_) gate->Open();
  ShutdownAll();
}

void RuntimeTest::SetUp() {
  CTS_INIT_OR_SKIP();
  RefreshDevices();
}

void RuntimeTest::RestartRuntime() {
  CTS_ASSERT_OK(tern_shutdown());
  CTS_ASSERT_OK(InitBackend());
  RefreshDevices();
}

void RuntimeTest::RefreshDevices() {
  devices_.clear();
  uint32_t count = 0;
  CTS_ASSERT_OK(tern_device_count(&count));
  for (uint32_t i = 0; i < count; ++i) {
    tern_device_t device = nullptr;
    CTS_ASSERT_OK(tern_device_get(i, &device));
    ASSERT_NE(device, nullptr);
    devices_.push_back(device);
  }
}

bool RuntimeTest::NeedDevices(uint32_t count) { return device_count() >= count; }

tern_core_t RuntimeTest::OpenCore(uint32_t device_index, uint32_t core_index) {
  tern_core_t core = nullptr;
  EXPECT_LT(device_index, device_count());
  if (device_index >= device_count()) return nullptr;
  CTS_EXPECT_OK(tern_core_open(device(device_index), core_index, &core));
  return core;
}

tern_queue_t RuntimeTest::CreateQueue(tern_core_t core, const char* name) {
  tern_queue_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.name = name;
  tern_queue_t queue = nullptr;
  CTS_EXPECT_OK(tern_queue_create(core, &params, &queue));
  return queue;
}

tern_buffer_t RuntimeTest::Alloc(uint32_t device_index, uint64_t size,
                                 tern_memory_category_t category, uint64_t alignment) {
  tern_buffer_t buffer = nullptr;
  EXPECT_LT(device_index, device_count());
  if (device_index >= device_count()) return nullptr;
  const tern_buffer_params_t params = BufferParams(size, category, alignment);
  CTS_EXPECT_OK(tern_buffer_alloc(device(device_index), &params, &buffer));
  return buffer;
}

tern_event_t RuntimeTest::CreateEvent() {
  tern_event_t event = nullptr;
  CTS_EXPECT_OK(tern_event_create(&event));
  return event;
}

tern_buffer_info_t RuntimeTest::BufferInfo(tern_buffer_t buffer) {
  tern_buffer_info_t info;
  std::memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CTS_EXPECT_OK(tern_buffer_get_info(buffer, &info));
  return info;
}

tern_memory_stats_t RuntimeTest::MemoryStats(uint32_t device_index) {
  tern_memory_stats_t stats;
  std::memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  CTS_EXPECT_OK(tern_device_memory_stats(device(device_index), &stats));
  return stats;
}

tern_device_info_t RuntimeTest::DeviceInfo(uint32_t device_index) {
  tern_device_info_t info;
  std::memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CTS_EXPECT_OK(tern_device_get_info(device(device_index), &info));
  return info;
}

// --- Data helpers ------------------------------------------------------------------------

std::vector<uint8_t> Pattern(size_t size, uint32_t seed) {
  std::vector<uint8_t> bytes(size);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    bytes[i] = static_cast<uint8_t>(x >> 7);
  }
  return bytes;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f %s", value, kUnits[unit]);
  return text;
}

bool MentionsBytes(const std::string& message, uint64_t bytes) {
  return message.find(std::to_string(bytes)) != std::string::npos ||
         message.find(HumanBytes(bytes)) != std::string::npos;
}

}  // namespace tern::cts
