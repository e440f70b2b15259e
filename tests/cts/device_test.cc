// CTS: devices, cores, visible cores and telemetry.
#include <unistd.h>

#include <cctype>
#include <set>

#include "cts_fixture.h"

namespace tern::cts {
namespace {

// "0-15,32-47": comma-separated CPU numbers and ascending ranges.
bool IsCpuList(const char* text) {
  const std::string list = text;
  if (list.empty()) return false;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    const size_t dash = item.find('-');
    auto is_number = [](const std::string& s) {
      if (s.empty()) return false;
      for (char c : s) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      }
      return true;
    };
    if (dash == std::string::npos) {
      if (!is_number(item)) return false;
    } else {
      const std::string first = item.substr(0, dash), last = item.substr(dash + 1);
      if (!is_number(first) || !is_number(last) || std::stoul(last) < std::stoul(first)) {
        return false;
      }
    }
    pos = end + 1;
  }
  return true;
}

bool IsTerminated(const char* text, size_t capacity) {
  return std::memchr(text, '\0', capacity) != nullptr;
}

tern_core_info_t CoreInfo(tern_core_t core) {
  tern_core_info_t info;
  std::memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CTS_EXPECT_OK(tern_core_get_info(core, &info));
  return info;
}

class DeviceTest : public RuntimeTest {};

// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hexadecimal.
bool IsUuid(const char* text) {
  const std::string s(text);
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash != (s[i] == '-')) return false;
    if (!dash && !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    if (!dash && std::isupper(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

TEST_P(DeviceTest, CountAndGetTestTopology) {
  uint32_t count = 0;
  CTS_ASSERT_OK(tern_device_count(&count));
  EXPECT_EQ(kTestDevices, count);
  std::set<tern_device_t> seen;
  for (uint32_t i = 0; i < count; ++i) {
    tern_device_t device = nullptr;
    CTS_ASSERT_OK(tern_device_get(i, &device));
    EXPECT_NE(nullptr, device);
    EXPECT_TRUE(seen.insert(device).second) << "device " << i << " repeats a handle";
    // Handles are stable for the runtime's lifetime.
    tern_device_t again = nullptr;
    CTS_ASSERT_OK(tern_device_get(i, &again));
    EXPECT_EQ(device, again);
  }
  tern_device_t device = reinterpret_cast<tern_device_t>(uintptr_t{0x1234});
  CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_device_get(count, &device));
  EXPECT_EQ(nullptr, device) << "out_device must be cleared on failure";
}

TEST_P(DeviceTest, InfoFieldsTestTopology) {
  for (uint32_t i = 0; i < device_count(); ++i) {
    SCOPED_TRACE("device " + std::to_string(i));
    tern_device_info_t info = DeviceInfo(i);
    EXPECT_EQ(sizeof(info), info.struct_size);
    EXPECT_EQ(i, info.index);
    EXPECT_EQ(i, info.physical_index);
    EXPECT_EQ(kTestCoresPerDevice, info.core_count);
    EXPECT_EQ(kTestCoresPerDevice, info.physical_core_count);
    EXPECT_EQ(kTestMemoryBytes, info.memory_bytes);
    EXPECT_GE(info.memory_alignment, 64u);
    EXPECT_EQ(0u, info.memory_alignment & (info.memory_alignment - 1)) << "power of two";
    EXPECT_GE(info.numa_node, -1);
    ASSERT_TRUE(IsTerminated(info.name, sizeof(info.name)));
    ASSERT_TRUE(IsTerminated(info.driver, sizeof(info.driver)));
    ASSERT_TRUE(IsTerminated(info.cpu_affinity, sizeof(info.cpu_affinity)));
    EXPECT_GT(std::strlen(info.name), 0u);
    EXPECT_STREQ(backend(), info.driver);
    EXPECT_TRUE(IsCpuList(info.cpu_affinity)) << "cpu_affinity \"" << info.cpu_affinity << "\"";
    ASSERT_TRUE(IsTerminated(info.uuid, sizeof(info.uuid)));
    ASSERT_TRUE(IsTerminated(info.bus_id, sizeof(info.bus_id)));
    ASSERT_TRUE(IsTerminated(info.driver_version, sizeof(info.driver_version)));
    EXPECT_TRUE(IsUuid(info.uuid)) << "uuid \"" << info.uuid << "\"";
    EXPECT_GT(std::strlen(info.bus_id), 0u);
    EXPECT_GT(std::strlen(info.driver_version), 0u);
  }
}

TEST_P(DeviceTest, IdentityIsStableAndDistinct) {
  std::set<std::string> uuids, bus_ids;
  for (uint32_t i = 0; i < device_count(); ++i) {
    const tern_device_info_t first = DeviceInfo(i), again = DeviceInfo(i);
    EXPECT_STREQ(first.uuid, again.uuid);
    EXPECT_STREQ(first.bus_id, again.bus_id);
    uuids.insert(first.uuid);
    bus_ids.insert(first.bus_id);
  }
  EXPECT_EQ(uuids.size(), device_count());
  EXPECT_EQ(bus_ids.size(), device_count());
}

TEST_P(DeviceTest, InfoWithTheSizeBeforeTheAddedFields) {
  // A caller built against the header before uuid, bus_id and driver_version.
  tern_device_info_t info;
  std::memset(&info, 0xcd, sizeof(info));
  info.struct_size = TERN_DEVICE_INFO_MIN_SIZE;
  CTS_EXPECT_OK(tern_device_get_info(device(0), &info));
  EXPECT_EQ(0u, info.index);
  EXPECT_GT(std::strlen(info.name), 0u);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&info);
  for (size_t i = TERN_DEVICE_INFO_MIN_SIZE; i < sizeof(info); ++i) {
    ASSERT_EQ(0xcd, bytes[i]) << "byte " << i << " past the caller's struct was written";
  }
}

TEST_P(DeviceTest, CoreOpenInfoClose) {
  for (uint32_t d = 0; d < device_count(); ++d) {
    const tern_device_info_t device_info = DeviceInfo(d);
    std::vector<tern_core_t> cores;
    for (uint32_t c = 0; c < device_info.core_count; ++c) {
      SCOPED_TRACE("device " + std::to_string(d) + " core " + std::to_string(c));
      tern_core_t core = OpenCore(d, c);
      ASSERT_NE(nullptr, core);
      const tern_core_info_t info = CoreInfo(core);
      EXPECT_EQ(c, info.index);
      EXPECT_EQ(c, info.physical_index);
      EXPECT_EQ(d * device_info.physical_core_count + c, info.node_index);
      EXPECT_EQ(device(d), info.device);
      cores.push_back(core);
    }
    for (tern_core_t core : cores) CTS_EXPECT_OK(tern_core_close(core));
    // Closed handles are dead; the cores themselves can be opened again.
    for (tern_core_t core : cores) {
      tern_core_info_t info{};
      info.struct_size = sizeof(info);
      CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_core_get_info(core, &info));
    }
    for (uint32_t c = 0; c < device_info.core_count; ++c) {
      tern_core_t core = OpenCore(d, c);
      ASSERT_NE(nullptr, core);
      CTS_EXPECT_OK(tern_core_close(core));
    }
  }
}

TEST_P(DeviceTest, DoubleOpenInOneProcessFailsPrecondition) {
  tern_core_t core = OpenCore(0, 0);
  ASSERT_NE(nullptr, core);
  tern_core_t second = reinterpret_cast<tern_core_t>(uintptr_t{0x1234});
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_core_open(device(0), 0, &second),
                   "already open");
  EXPECT_EQ(nullptr, second);
  // The first handle still works, and the refusal took nothing.
  EXPECT_EQ(0u, CoreInfo(core).index);
  tern_core_t other = OpenCore(0, 1);
  EXPECT_NE(nullptr, other);
  CTS_EXPECT_OK(tern_core_close(core));
  CTS_EXPECT_OK(tern_core_close(other));
  core = OpenCore(0, 0);
  EXPECT_NE(nullptr, core);
  CTS_EXPECT_OK(tern_core_close(core));
}

TEST_P(DeviceTest, CloseWithLiveQueuesFailsPrecondition) {
  tern_core_t core = OpenCore(0, 0);
  ASSERT_NE(nullptr, core);
  tern_queue_t first = CreateQueue(core);
  tern_queue_t second = CreateQueue(core);
  ASSERT_NE(nullptr, first);
  ASSERT_NE(nullptr, second);
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_core_close(core), "queue");
  CTS_EXPECT_OK(tern_queue_destroy(first));
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_core_close(core), "queue");
  // The refused closes left the core and its queue working.
  uint64_t sequence = 0;
  CTS_EXPECT_OK(tern_queue_nop(second, &sequence));
  EXPECT_EQ(1u, sequence);
  CTS_EXPECT_OK(tern_queue_synchronize(second, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_destroy(second));
  CTS_EXPECT_OK(tern_core_close(core));
}

TEST_P(DeviceTest, TelemetryReportsOwnershipMemoryAndCommands) {
  tern_core_t core = OpenCore(0, 0);
  ASSERT_NE(nullptr, core);
  tern_buffer_t buffer = Alloc(0, 1 << 20, TERN_MEMORY_CONSTANTS);
  ASSERT_NE(nullptr, buffer);
  auto snapshot = [&](tern_device_telemetry_t* out) {
    std::memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    CTS_EXPECT_OK(tern_device_get_telemetry(device(0), out));
  };
  auto* before = Make<tern_device_telemetry_t>();
  snapshot(before);
  const tern_device_info_t info = DeviceInfo(0);
  EXPECT_EQ(info.physical_core_count, before->core_count);
  EXPECT_EQ(info.memory_bytes, before->memory_capacity);
  const tern_memory_stats_t stats = MemoryStats(0);
  EXPECT_EQ(stats.node_used_bytes, before->memory_used);
  EXPECT_EQ(stats.node_used_by_category[TERN_MEMORY_CONSTANTS],
            before->memory_by_category[TERN_MEMORY_CONSTANTS]);
  EXPECT_GE(before->memory_by_category[TERN_MEMORY_CONSTANTS], 1u << 20);
  EXPECT_EQ(static_cast<int32_t>(getpid()), before->cores[0].owner_pid);
  EXPECT_EQ(0, before->cores[1].owner_pid);
  bool found_self = false;
  for (uint32_t p = 0; p < before->process_count && p < TERN_TELEMETRY_MAX_PROCESSES; ++p) {
    if (before->processes[p].pid != static_cast<int32_t>(getpid())) continue;
    found_self = true;
    EXPECT_EQ(1u, before->processes[p].cores_owned & 1u);
    EXPECT_GE(before->processes[p].memory_by_category[TERN_MEMORY_CONSTANTS], 1u << 20);
  }
  EXPECT_TRUE(found_self) << "this process is missing from the device's process list";

  // Completed commands are counted on the core that ran them.
  tern_queue_t queue = CreateQueue(core);
  constexpr uint64_t kCommands = 5;
  for (uint64_t i = 0; i < kCommands; ++i) CTS_ASSERT_OK(tern_queue_nop(queue, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue, kLongTimeout));
  auto* after = Make<tern_device_telemetry_t>();
  snapshot(after);
  EXPECT_EQ(before->cores[0].commands + kCommands, after->cores[0].commands);
  EXPECT_EQ(before->cores[1].commands, after->cores[1].commands);
  // Each of them also lands in one bucket of the core's latency histogram;
  // a nop runs in well under 2^22 us, so never in the last bucket.
  auto histogram_total = [](const tern_device_telemetry_t& t, uint32_t core) {
    uint64_t total = 0;
    for (uint64_t count : t.latency_histogram[core]) total += count;
    return total;
  };
  EXPECT_EQ(histogram_total(*before, 0) + kCommands, histogram_total(*after, 0));
  EXPECT_EQ(histogram_total(*before, 1), histogram_total(*after, 1));
  EXPECT_EQ(before->latency_histogram[0][TERN_TELEMETRY_LATENCY_BUCKETS - 1],
            after->latency_histogram[0][TERN_TELEMETRY_LATENCY_BUCKETS - 1]);

  // A caller built against the first version of the structure passes a
  // smaller struct_size: it gets the fields it has, and nothing past them.
  auto* old_layout = Make<tern_device_telemetry_t>();
  std::memset(old_layout, 0xcd, sizeof(*old_layout));
  old_layout->struct_size = TERN_DEVICE_TELEMETRY_MIN_SIZE;
  CTS_EXPECT_OK(tern_device_get_telemetry(device(0), old_layout));
  EXPECT_EQ(uint32_t{TERN_DEVICE_TELEMETRY_MIN_SIZE}, old_layout->struct_size);
  EXPECT_EQ(after->cores[0].commands, old_layout->cores[0].commands);
  const auto* tail =
      reinterpret_cast<const unsigned char*>(old_layout) + TERN_DEVICE_TELEMETRY_MIN_SIZE;
  for (size_t i = 0; i < sizeof(*old_layout) - TERN_DEVICE_TELEMETRY_MIN_SIZE; ++i) {
    ASSERT_EQ(0xcd, tail[i]) << "byte " << i << " past struct_size was written";
  }

  CTS_EXPECT_OK(tern_queue_destroy(queue));
  CTS_EXPECT_OK(tern_core_close(core));
  snapshot(after);
  EXPECT_EQ(0, after->cores[0].owner_pid) << "closing the core must end ownership";
}

CTS_INSTANTIATE(DeviceTest);

// --- TERN_VISIBLE_CORES ------------------------------------------------------------------
// Read by the first tern_init, so these tests set it before initializing.
// Node-wide core numbering with the test topology: device 0 has cores 0-1,
// device 1 has cores 2-3.

class DeviceVisibleCoresTest : public RuntimeTest {
 protected:
  void SetUp() override {}  // each test initializes after setting the variable

  // Initializes with TERN_VISIBLE_CORES=value (restored at the end of the test).
  void InitWithVisibleCores(const char* value) {
    env_.emplace("TERN_VISIBLE_CORES", value);
    InitOrSkip();
    if (IsSkipped() || HasFatalFailure()) return;
    RefreshDevices();
  }

  struct Expect {
    uint32_t physical_device;
    uint32_t node_core;  // of the one visible core
  };
  // Checks that the process sees exactly one core on each device listed.
  void ExpectOneCorePerDevice(const std::vector<Expect>& expected) {
    ASSERT_EQ(expected.size(), device_count());
    for (uint32_t d = 0; d < device_count(); ++d) {
      SCOPED_TRACE("device " + std::to_string(d));
      const tern_device_info_t info = DeviceInfo(d);
      EXPECT_EQ(d, info.index);
      EXPECT_EQ(expected[d].physical_device, info.physical_index);
      EXPECT_EQ(1u, info.core_count);
      EXPECT_EQ(kTestCoresPerDevice, info.physical_core_count);
      EXPECT_EQ(kTestMemoryBytes, info.memory_bytes) << "memory is not split by core";
      tern_core_t core = OpenCore(d, 0);
      ASSERT_NE(nullptr, core);
      const tern_core_info_t core_info = CoreInfo(core);
      EXPECT_EQ(0u, core_info.index);
      EXPECT_EQ(expected[d].node_core, core_info.node_index);
      EXPECT_EQ(expected[d].node_core % kTestCoresPerDevice, core_info.physical_index);
      tern_core_t hidden = nullptr;
      CTS_EXPECT_ERROR(TERN_ERROR_OUT_OF_RANGE, tern_core_open(device(d), 1, &hidden));
      CTS_EXPECT_OK(tern_core_close(core));
    }
  }

  std::optional<ScopedEnv> env_;
};

#define CTS_INIT_WITH_VISIBLE_CORES(value)        \
  do {                                            \
    InitWithVisibleCores(value);                  \
    if (IsSkipped() || HasFatalFailure()) return; \
  } while (0)

TEST_P(DeviceVisibleCoresTest, RangeAcrossDevices) {
  CTS_INIT_WITH_VISIBLE_CORES("1-2");
  ExpectOneCorePerDevice({{0, 1}, {1, 2}});
}

TEST_P(DeviceVisibleCoresTest, SingleCoreHidesOtherDevice) {
  CTS_INIT_WITH_VISIBLE_CORES("3");
  ExpectOneCorePerDevice({{1, 3}});
}

TEST_P(DeviceVisibleCoresTest, List) {
  CTS_INIT_WITH_VISIBLE_CORES("0,3");
  ExpectOneCorePerDevice({{0, 0}, {1, 3}});
}

TEST_P(DeviceVisibleCoresTest, AllCoresListedOutOfOrderWithDuplicates) {
  CTS_INIT_WITH_VISIBLE_CORES("3,0-1,2,1");
  ASSERT_EQ(kTestDevices, device_count());
  for (uint32_t d = 0; d < device_count(); ++d) {
    EXPECT_EQ(kTestCoresPerDevice, DeviceInfo(d).core_count);
  }
}

TEST_P(DeviceVisibleCoresTest, BadValuesNegative) {
  const char* const kBad[] = {"x",   "5",    "4",           "2-1", ",",   "0,",
                              ",1",  "1,,2", "-1",          "1-",  "0-4", "1-2-3",
                              "a-b", "0x1",  "99999999999", "1;2", "0 1"};
  for (const char* value : kBad) {
    SCOPED_TRACE(std::string("TERN_VISIBLE_CORES='") + value + "'");
    ScopedEnv env("TERN_VISIBLE_CORES", value);
    const tern_status_t status = InitBackend();
    if (status == TERN_OK) {
      ADD_FAILURE() << "tern_init accepted it";
      ShutdownAll();
      continue;
    }
    if (const SkipEntry* entry = FindSkip(backend(), CurrentTestName(), status)) {
      GTEST_SKIP() << backend() << " backend: " << entry->reason << " ("
                   << tern_last_error_message() << ")";
    }
    EXPECT_EQ(TERN_ERROR_INVALID_ARGUMENT, status) << StatusName(status);
    const std::string message = tern_last_error_message();
    EXPECT_NE(std::string::npos, message.find("TERN_VISIBLE_CORES")) << message;
    EXPECT_NE(std::string::npos, message.find(value)) << message;
    EXPECT_EQ(nullptr, tern_driver_name()) << "a failed tern_init must not initialize";
  }
}

TEST_P(DeviceVisibleCoresTest, EmptyValueNegative) {
  // Set but empty is a mistake (a script that lost its value), not "all cores".
  ScopedEnv env("TERN_VISIBLE_CORES", "");
  const tern_status_t status = InitBackend();
  const std::string message = tern_last_error_message();
  if (const SkipEntry* entry = FindSkip(backend(), CurrentTestName(), status)) {
    ShutdownAll();
    GTEST_SKIP() << backend() << " backend: " << entry->reason << " (" << message << ")";
  }
  EXPECT_EQ(TERN_ERROR_INVALID_ARGUMENT, status)
      << StatusName(status) << ": TERN_VISIBLE_CORES='' must be refused";
  if (status != TERN_OK) {
    EXPECT_NE(std::string::npos, message.find("TERN_VISIBLE_CORES")) << message;
  }
}

TEST_P(DeviceVisibleCoresTest, RestoredAfterShutdown) {
  // The variable is read when the runtime is created, so a new session sees a
  // new value.
  {
    CTS_INIT_WITH_VISIBLE_CORES("2");
    ASSERT_EQ(1u, device_count());
    ShutdownAll();
    env_.reset();
  }
  CTS_INIT_OR_SKIP();
  RefreshDevices();
  EXPECT_EQ(kTestDevices, device_count());
}

CTS_INSTANTIATE(DeviceVisibleCoresTest);

}  // namespace
}  // namespace tern::cts
