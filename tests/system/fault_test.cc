// Fault-injection system tests: every injected device fault (DMA abort, HBM
// uncorrectable on a buffer or after N commands, core hang) must surface as
// its documented code on the queue that ran the failing command, name that
// command, abort the commands after it until tern_queue_clear_error(), fail
// queues that wait on it with DEPENDENCY_FAILED, show in telemetry, and leave
// every other queue working.
#include <gtest/gtest.h>
#include <tern/tern.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kBlock = 4096;
constexpr uint64_t kBufferBytes = 64 * 1024;
constexpr uint8_t kUntouched = 0xee;

std::string LastError() { return tern_last_error_message(); }

// What a host callback saw.
struct CallbackRecord {
  std::atomic<int> calls{0};
  std::atomic<tern_status_t> status{-1};
};

void RecordCallback(void* user_data, tern_status_t status) {
  auto* record = static_cast<CallbackRecord*>(user_data);
  record->status.store(status);
  record->calls.fetch_add(1);
}

std::vector<uint8_t> Pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(i * 31 + seed);
  return data;
}

// One kind of injected fault and what it must look like.
struct FaultCase {
  const char* name;
  tern_fault_kind_t kind;
  bool on_buffer;                  // HBM poison on the source buffer instead of a core count
  uint64_t after_commands;         // commands of the victim's core that still succeed first
  tern_status_t code;              // what the failing command reports
  tern_error_class_t error_class;  // the telemetry counter it moves
  bool counts_ecc;                 // moves the device's uncorrected-ECC counter
  const char* message_words;       // the fault's own words in the message
};

// Every case fails command 5 of the victim queue, a copy (device to host):
//   1 h2d  2 nop  3 fill  4 callback  5 d2h  6 callback  7 d2h  8 record  9 nop
// DMA aborts count copies and fills (1, 3, then 5); the core-count faults
// count every command (1-4, then 5).
const FaultCase kFaultCases[] = {
    {"DmaAbort", TERN_FAULT_DMA_ABORT, false, 2, TERN_ERROR_DMA_ABORT, TERN_ERROR_CLASS_DMA_ABORT,
     false, "DMA engine"},
    {"HbmUncorrectableOnBuffer", TERN_FAULT_HBM_UNCORRECTABLE, true, 0,
     TERN_ERROR_HBM_UNCORRECTABLE, TERN_ERROR_CLASS_HBM_UNCORRECTABLE, true, "ECC"},
    {"HbmUncorrectableAfterCommands", TERN_FAULT_HBM_UNCORRECTABLE, false, 4,
     TERN_ERROR_HBM_UNCORRECTABLE, TERN_ERROR_CLASS_HBM_UNCORRECTABLE, true, "ECC"},
    {"CoreHang", TERN_FAULT_CORE_HANG, false, 4, TERN_ERROR_EXEC_TIMEOUT,
     TERN_ERROR_CLASS_EXEC_TIMEOUT, false, "TERN_EXEC_TIMEOUT"},
};

// Names the case in test listings (ctest shows GetParam()).
void PrintTo(const FaultCase& fault, std::ostream* os) { *os << fault.name; }

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A hung command becomes EXEC_TIMEOUT after 0.3 s instead of 30 s. Read
    // at tern_init, so it is set first; nothing else here runs that long.
    setenv("TERN_EXEC_TIMEOUT", "0.3", 1);
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    for (uint32_t i = 0; i < 2; ++i) ASSERT_EQ(tern_device_get(i, &devices_[i]), TERN_OK);
    ASSERT_EQ(tern_core_open(devices_[0], 0, &victim_core_), TERN_OK) << LastError();
    ASSERT_EQ(tern_core_open(devices_[0], 1, &other_core_), TERN_OK) << LastError();
    ASSERT_EQ(tern_core_open(devices_[1], 0, &waiter_core_), TERN_OK) << LastError();
    victim_ = CreateQueue(victim_core_, "victim");
    same_core_ = CreateQueue(victim_core_, "same-core");
    other_ = CreateQueue(other_core_, "other-core");
    waiter_ = CreateQueue(waiter_core_, "waiter");
    good_ = Alloc(devices_[0], kBufferBytes);
    source_ = Alloc(devices_[0], kBufferBytes);
    spare_ = Alloc(devices_[0], kBufferBytes);
    remote_ = Alloc(devices_[1], kBufferBytes);
    const std::vector<uint8_t> data = Pattern(kBufferBytes, 9);
    ASSERT_EQ(tern_buffer_write(source_, 0, data.data(), data.size()), TERN_OK) << LastError();
    ASSERT_EQ(tern_event_create(&event_), TERN_OK);
  }

  void TearDown() override {
    // Destroying a queue returns its sticky error, if a test left one.
    for (tern_queue_t queue : {victim_, same_core_, other_, waiter_}) {
      if (queue != nullptr) {
        tern_queue_destroy(queue);
      }
    }
    if (event_ != nullptr) {
      EXPECT_EQ(tern_event_destroy(event_), TERN_OK);
    }
    for (tern_buffer_t buffer : {good_, source_, spare_, remote_}) {
      if (buffer != nullptr) {
        EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
      }
    }
    for (tern_core_t core : {victim_core_, other_core_, waiter_core_}) {
      if (core != nullptr) {
        EXPECT_EQ(tern_core_close(core), TERN_OK) << LastError();
      }
    }
    EXPECT_EQ(tern_shutdown(), TERN_OK);
    unsetenv("TERN_EXEC_TIMEOUT");
  }

  tern_queue_t CreateQueue(tern_core_t core, const char* name) {
    tern_queue_params_t params = {};
    params.struct_size = sizeof(params);
    params.name = name;
    tern_queue_t queue = nullptr;
    EXPECT_EQ(tern_queue_create(core, &params, &queue), TERN_OK) << LastError();
    return queue;
  }

  tern_buffer_t Alloc(tern_device_t device, uint64_t size) {
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    EXPECT_EQ(tern_buffer_alloc(device, &params, &buffer), TERN_OK) << LastError();
    return buffer;
  }

  tern_device_telemetry_t Telemetry(tern_device_t device) {
    tern_device_telemetry_t telemetry = {};
    telemetry.struct_size = sizeof(telemetry);
    EXPECT_EQ(tern_device_get_telemetry(device, &telemetry), TERN_OK) << LastError();
    return telemetry;
  }

  // H2D, D2H and a callback on `queue`; all must succeed and the data must
  // come back intact.
  ::testing::AssertionResult RoundTrip(tern_queue_t queue, tern_buffer_t buffer, uint8_t seed) {
    const std::vector<uint8_t> in = Pattern(kBlock, seed);
    std::vector<uint8_t> out(kBlock, 0);
    CallbackRecord record;
    tern_status_t status = tern_queue_copy_h2d(queue, buffer, kBlock, in.data(), kBlock, nullptr);
    if (status == TERN_OK) {
      status = tern_queue_copy_d2h(queue, out.data(), buffer, kBlock, kBlock, nullptr);
    }
    if (status == TERN_OK)
      status = tern_queue_host_callback(queue, RecordCallback, &record, nullptr);
    if (status != TERN_OK) {
      return ::testing::AssertionFailure() << "submission failed: " << LastError();
    }
    status = tern_queue_synchronize(queue, UINT64_MAX);
    if (status != TERN_OK) return ::testing::AssertionFailure() << "sync: " << LastError();
    if (record.calls.load() != 1 || record.status.load() != TERN_OK) {
      return ::testing::AssertionFailure()
             << "callback ran " << record.calls.load() << " times with " << record.status.load();
    }
    if (in != out) return ::testing::AssertionFailure() << "data changed on the way";
    return ::testing::AssertionSuccess();
  }

  tern_device_t devices_[2] = {};
  tern_core_t victim_core_ = nullptr;  // device 0 core 0: where faults are armed
  tern_core_t other_core_ = nullptr;   // device 0 core 1
  tern_core_t waiter_core_ = nullptr;  // device 1 core 0
  tern_queue_t victim_ = nullptr;
  tern_queue_t same_core_ = nullptr;
  tern_queue_t other_ = nullptr;
  tern_queue_t waiter_ = nullptr;
  tern_buffer_t good_ = nullptr;    // device 0
  tern_buffer_t source_ = nullptr;  // device 0; poisoned in the buffer case
  tern_buffer_t spare_ = nullptr;   // device 0, for the bystander queues
  tern_buffer_t remote_ = nullptr;  // device 1
  tern_event_t event_ = nullptr;
};

class FaultKindTest : public FaultTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(FaultKindTest, SurfacesOnTheRightQueueAndIsStickyUntilCleared) {
  const FaultCase& fault = GetParam();
  const tern_device_telemetry_t before = Telemetry(devices_[0]);
  const tern_device_telemetry_t before_remote = Telemetry(devices_[1]);

  tern_fault_params_t params = {};
  params.struct_size = sizeof(params);
  params.kind = fault.kind;
  params.core = victim_core_;
  params.buffer = fault.on_buffer ? source_ : nullptr;
  params.after_commands = fault.after_commands;
  ASSERT_EQ(tern_debug_inject_fault(&params), TERN_OK) << LastError();

  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint8_t> in = Pattern(kBlock, 1);
  std::vector<uint8_t> out(kBlock, kUntouched), aborted_out(kBlock, kUntouched);
  CallbackRecord before_failure, after_failure, waiter_record;
  uint64_t seq[10] = {};
  ASSERT_EQ(tern_queue_copy_h2d(victim_, good_, 0, in.data(), kBlock, &seq[1]), TERN_OK);
  ASSERT_EQ(tern_queue_nop(victim_, &seq[2]), TERN_OK);
  ASSERT_EQ(tern_queue_fill(victim_, good_, kBlock, kBlock, 0xa5a5a5a5u, &seq[3]), TERN_OK);
  ASSERT_EQ(tern_queue_host_callback(victim_, RecordCallback, &before_failure, &seq[4]), TERN_OK);
  ASSERT_EQ(tern_queue_copy_d2h(victim_, out.data(), source_, 0, kBlock, &seq[5]), TERN_OK);
  ASSERT_EQ(tern_queue_host_callback(victim_, RecordCallback, &after_failure, &seq[6]), TERN_OK);
  ASSERT_EQ(tern_queue_copy_d2h(victim_, aborted_out.data(), good_, 0, kBlock, &seq[7]), TERN_OK);
  ASSERT_EQ(tern_queue_record_event(victim_, event_, &seq[8]), TERN_OK);
  ASSERT_EQ(tern_queue_nop(victim_, &seq[9]), TERN_OK);
  for (uint64_t i = 1; i <= 9; ++i) ASSERT_EQ(seq[i], i);
  // A queue on another device waits for the event recorded after the failure.
  ASSERT_EQ(tern_queue_wait_event(waiter_, event_, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_host_callback(waiter_, RecordCallback, &waiter_record, nullptr), TERN_OK);

  // Meanwhile, a queue on another core works; so does one on the same core
  // when the fault is tied to a buffer (core-count faults would count its
  // commands, so it waits until the fault has fired).
  EXPECT_TRUE(RoundTrip(other_, spare_, 2));
  if (fault.kind == TERN_FAULT_CORE_HANG) {
    uint64_t completed = 0;
    EXPECT_EQ(tern_queue_query(victim_, &completed), TERN_ERROR_NOT_READY)
        << "the other core's queue finished while the victim still hangs";
    EXPECT_LT(completed, 5u);
  }
  if (fault.on_buffer) {
    EXPECT_TRUE(RoundTrip(same_core_, spare_, 3));
  }

  // The failure: its code, naming command 5, a copy, on queue 'victim'.
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), fault.code);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string message = LastError();
  EXPECT_EQ(message.rfind(tern_status_string(fault.code), 0), 0u) << message;
  EXPECT_NE(message.find("command 5 "), std::string::npos) << message;
  EXPECT_NE(message.find("(copy)"), std::string::npos) << message;
  EXPECT_NE(message.find("'victim'"), std::string::npos) << message;
  EXPECT_NE(message.find(fault.message_words), std::string::npos) << message;
  if (fault.kind == TERN_FAULT_CORE_HANG) {
    EXPECT_GE(seconds, 0.29) << "the hang ended before TERN_EXEC_TIMEOUT";
    EXPECT_LT(seconds, 10.0) << "the hang was not cut off by TERN_EXEC_TIMEOUT";
  }

  // Commands before it succeeded; it and those after it did not run.
  EXPECT_EQ(before_failure.calls.load(), 1);
  EXPECT_EQ(before_failure.status.load(), TERN_OK);
  EXPECT_EQ(after_failure.calls.load(), 1) << "aborted callbacks still run, with the error";
  EXPECT_EQ(after_failure.status.load(), fault.code);
  EXPECT_EQ(aborted_out, std::vector<uint8_t>(kBlock, kUntouched)) << "an aborted copy moved data";
  EXPECT_EQ(tern_queue_wait_sequence(victim_, 4, UINT64_MAX), TERN_OK) << LastError();
  EXPECT_EQ(tern_queue_wait_sequence(victim_, 5, UINT64_MAX), fault.code);
  EXPECT_EQ(tern_queue_wait_sequence(victim_, 9, UINT64_MAX), fault.code);
  uint64_t completed = 0;
  EXPECT_EQ(tern_queue_query(victim_, &completed), fault.code);
  EXPECT_EQ(completed, 9u) << "every command completes, aborted or not";
  EXPECT_EQ(tern_event_query(event_), fault.code);

  // The queue that waited on the failed queue's event fails as a dependency.
  EXPECT_EQ(tern_queue_synchronize(waiter_, UINT64_MAX), TERN_ERROR_DEPENDENCY_FAILED);
  message = LastError();
  EXPECT_NE(message.find("'waiter'"), std::string::npos) << message;
  EXPECT_NE(message.find("command 8 of queue 'victim'"), std::string::npos) << message;
  EXPECT_EQ(waiter_record.calls.load(), 1);
  EXPECT_EQ(waiter_record.status.load(), TERN_ERROR_DEPENDENCY_FAILED);

  // Sticky: new commands are aborted too, and every sync repeats the error.
  CallbackRecord sticky;
  EXPECT_EQ(tern_queue_nop(victim_, nullptr), TERN_OK) << "submission itself still works";
  EXPECT_EQ(tern_queue_host_callback(victim_, RecordCallback, &sticky, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), fault.code);
  EXPECT_NE(LastError().find("command 5 "), std::string::npos) << LastError();
  EXPECT_EQ(sticky.calls.load(), 1);
  EXPECT_EQ(sticky.status.load(), fault.code);
  EXPECT_EQ(tern_queue_query(victim_, &completed), fault.code);
  EXPECT_EQ(completed, 11u);

  // Every other queue still works, the same core included now that the fault
  // has fired.
  EXPECT_TRUE(RoundTrip(same_core_, spare_, 4));
  EXPECT_TRUE(RoundTrip(other_, spare_, 5));

  // Telemetry: one error of the fault's class on the victim's core, one
  // dependency failure (class OTHER) on the waiter's, nothing elsewhere.
  const tern_device_telemetry_t after = Telemetry(devices_[0]);
  const tern_device_telemetry_t after_remote = Telemetry(devices_[1]);
  for (int c = 0; c < TERN_ERROR_CLASS_COUNT; ++c) {
    EXPECT_EQ(after.cores[0].errors[c], before.cores[0].errors[c] + (c == fault.error_class))
        << "error class " << c;
    EXPECT_EQ(after.cores[1].errors[c], before.cores[1].errors[c]) << "error class " << c;
    EXPECT_EQ(after_remote.cores[0].errors[c],
              before_remote.cores[0].errors[c] + (c == TERN_ERROR_CLASS_OTHER))
        << "error class " << c;
  }
  EXPECT_EQ(after.ecc_uncorrected, before.ecc_uncorrected + (fault.counts_ecc ? 1 : 0));
  EXPECT_EQ(after_remote.ecc_uncorrected, before_remote.ecc_uncorrected);
  EXPECT_GT(after.cores[0].commands, before.cores[0].commands);

  // Clearing returns the cleared error once; then the queue works again.
  EXPECT_EQ(tern_queue_clear_error(victim_), fault.code);
  EXPECT_NE(LastError().find("command 5 "), std::string::npos) << LastError();
  EXPECT_EQ(tern_queue_clear_error(victim_), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_OK) << LastError();
  EXPECT_TRUE(RoundTrip(victim_, good_, 6));
  EXPECT_EQ(tern_queue_query(victim_, &completed), TERN_OK);
  EXPECT_EQ(completed, 14u);
  // The fault fired once: the same script now runs clean (the poisoned
  // buffer aside, which stays poisoned until freed).
  ASSERT_EQ(tern_queue_copy_h2d(victim_, good_, 0, in.data(), kBlock, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_nop(victim_, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_fill(victim_, good_, kBlock, kBlock, 0xa5a5a5a5u, nullptr), TERN_OK);
  ASSERT_EQ(tern_queue_copy_d2h(victim_, out.data(), fault.on_buffer ? good_ : source_, 0, kBlock,
                                nullptr),
            TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_OK) << LastError();
  EXPECT_EQ(out, fault.on_buffer ? in : Pattern(kBlock, 9));

  // The waiter recovers the same way; re-recording the event moves it past
  // the failure, so waiting on it succeeds again.
  EXPECT_EQ(tern_queue_clear_error(waiter_), TERN_ERROR_DEPENDENCY_FAILED);
  EXPECT_EQ(tern_queue_record_event(victim_, event_, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_wait_event(waiter_, event_, nullptr), TERN_OK);
  EXPECT_TRUE(RoundTrip(waiter_, remote_, 7));
  EXPECT_EQ(tern_event_query(event_), TERN_OK);
}

INSTANTIATE_TEST_SUITE_P(AllFaults, FaultKindTest, ::testing::ValuesIn(kFaultCases),
                         [](const ::testing::TestParamInfo<FaultCase>& info) {
                           return std::string(info.param.name);
                         });

// A poisoned buffer fails every access, synchronous ones included, until it
// is freed; the memory it occupied is healthy for the next allocation.
TEST_F(FaultTest, PoisonedBufferFailsUntilFreed) {
  const uint64_t ecc_before = Telemetry(devices_[0]).ecc_uncorrected;
  tern_fault_params_t params = {};
  params.struct_size = sizeof(params);
  params.kind = TERN_FAULT_HBM_UNCORRECTABLE;
  params.buffer = source_;
  ASSERT_EQ(tern_debug_inject_fault(&params), TERN_OK) << LastError();

  std::vector<uint8_t> data(kBlock, kUntouched);
  EXPECT_EQ(tern_buffer_read(source_, 0, data.data(), kBlock), TERN_ERROR_HBM_UNCORRECTABLE);
  EXPECT_NE(LastError().find("free it"), std::string::npos) << LastError();
  EXPECT_EQ(data, std::vector<uint8_t>(kBlock, kUntouched));
  EXPECT_EQ(tern_buffer_write(source_, 0, data.data(), kBlock), TERN_ERROR_HBM_UNCORRECTABLE);
  // Any part of the buffer: the last byte too.
  EXPECT_EQ(tern_buffer_read(source_, kBufferBytes - 1, data.data(), 1),
            TERN_ERROR_HBM_UNCORRECTABLE);
  EXPECT_EQ(Telemetry(devices_[0]).ecc_uncorrected, ecc_before + 3);

  // Neighbours are healthy, synchronously and on queues.
  EXPECT_EQ(tern_buffer_read(good_, 0, data.data(), kBlock), TERN_OK) << LastError();
  EXPECT_TRUE(RoundTrip(victim_, good_, 1));

  // Clearing the queue's error does not heal the buffer.
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(tern_queue_fill(victim_, source_, 0, kBlock, 0, nullptr), TERN_OK);
    EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_ERROR_HBM_UNCORRECTABLE);
    EXPECT_NE(LastError().find("(fill)"), std::string::npos) << LastError();
    EXPECT_EQ(tern_queue_clear_error(victim_), TERN_ERROR_HBM_UNCORRECTABLE);
    EXPECT_TRUE(RoundTrip(victim_, good_, static_cast<uint8_t>(2 + round)));
  }
  // A device-to-device copy out of it fails as well (same device).
  EXPECT_EQ(tern_queue_copy_d2d(victim_, good_, 0, source_, 0, kBlock, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_ERROR_HBM_UNCORRECTABLE);
  EXPECT_EQ(tern_queue_clear_error(victim_), TERN_ERROR_HBM_UNCORRECTABLE);

  // Free every buffer of device 0 and take the whole device: the new buffer
  // necessarily covers the poisoned range, and it reads and writes fine.
  tern_buffer_info_t info = {};
  info.struct_size = sizeof(info);
  ASSERT_EQ(tern_buffer_get_info(source_, &info), TERN_OK);
  const uint64_t poisoned_address = info.device_address;
  for (tern_buffer_t* buffer : {&good_, &source_, &spare_}) {
    ASSERT_EQ(tern_buffer_free(*buffer), TERN_OK);
    *buffer = nullptr;
  }
  tern_buffer_t whole = Alloc(devices_[0], 256 * kMiB);
  ASSERT_NE(whole, nullptr);
  ASSERT_EQ(tern_buffer_get_info(whole, &info), TERN_OK);
  ASSERT_LE(info.device_address, poisoned_address);
  const uint64_t offset = poisoned_address - info.device_address;
  const std::vector<uint8_t> pattern = Pattern(kBufferBytes, 5);
  EXPECT_EQ(tern_buffer_write(whole, offset, pattern.data(), pattern.size()), TERN_OK)
      << LastError();
  std::vector<uint8_t> back(kBufferBytes, 0);
  EXPECT_EQ(tern_buffer_read(whole, offset, back.data(), back.size()), TERN_OK) << LastError();
  EXPECT_EQ(back, pattern);
  std::fill(back.begin(), back.end(), 0);
  EXPECT_EQ(tern_queue_copy_d2h(victim_, back.data(), whole, offset, back.size(), nullptr),
            TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_OK) << LastError();
  EXPECT_EQ(back, pattern);
  EXPECT_EQ(Telemetry(devices_[0]).ecc_uncorrected, ecc_before + 3 + 3);
  EXPECT_EQ(tern_buffer_free(whole), TERN_OK);
}

// Poisoned memory is poisoned whichever device's engine reads it: a copy
// into device 1, run by a queue of device 1, fails too.
TEST_F(FaultTest, PoisonedBufferFailsCrossDeviceCopies) {
  tern_fault_params_t params = {};
  params.struct_size = sizeof(params);
  params.kind = TERN_FAULT_HBM_UNCORRECTABLE;
  params.buffer = source_;
  ASSERT_EQ(tern_debug_inject_fault(&params), TERN_OK) << LastError();
  const uint64_t ecc_before = Telemetry(devices_[0]).ecc_uncorrected;

  EXPECT_EQ(tern_queue_copy_d2d(waiter_, remote_, 0, source_, 0, kBlock, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(waiter_, UINT64_MAX), TERN_ERROR_HBM_UNCORRECTABLE)
      << "a queue of device 1 read poisoned device-0 memory without an error";
  EXPECT_EQ(Telemetry(devices_[0]).ecc_uncorrected, ecc_before + 1);
  tern_queue_clear_error(waiter_);

  // And the other way round: a device-0 queue writing into poisoned memory of
  // device 1.
  params.buffer = remote_;
  ASSERT_EQ(tern_debug_inject_fault(&params), TERN_OK) << LastError();
  EXPECT_EQ(tern_queue_copy_d2d(victim_, remote_, 0, good_, 0, kBlock, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_ERROR_HBM_UNCORRECTABLE)
      << "a queue of device 0 wrote poisoned device-1 memory without an error";
  tern_queue_clear_error(victim_);
}

// Faults are armed per core: a DMA abort armed on one core never fires on
// another core's copies, and fires exactly once.
TEST_F(FaultTest, DmaAbortStaysOnItsCoreAndFiresOnce) {
  tern_fault_params_t params = {};
  params.struct_size = sizeof(params);
  params.kind = TERN_FAULT_DMA_ABORT;
  params.core = victim_core_;
  params.after_commands = 0;
  ASSERT_EQ(tern_debug_inject_fault(&params), TERN_OK) << LastError();

  // Plenty of copies on the other core: none aborts.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(RoundTrip(other_, spare_, static_cast<uint8_t>(i)));
  // Non-DMA commands on the victim's core do not trigger it either.
  ASSERT_EQ(tern_queue_nop(victim_, nullptr), TERN_OK);
  CallbackRecord record;
  ASSERT_EQ(tern_queue_host_callback(victim_, RecordCallback, &record, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(victim_, UINT64_MAX), TERN_OK) << LastError();
  // The first copy on the victim's core does, on whichever queue runs it.
  EXPECT_EQ(tern_queue_fill(same_core_, spare_, 0, kBlock, 7, nullptr), TERN_OK);
  EXPECT_EQ(tern_queue_synchronize(same_core_, UINT64_MAX), TERN_ERROR_DMA_ABORT);
  EXPECT_NE(LastError().find("command 1 (fill) on queue 'same-core'"), std::string::npos)
      << LastError();
  EXPECT_EQ(tern_queue_clear_error(same_core_), TERN_ERROR_DMA_ABORT);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(RoundTrip(victim_, good_, static_cast<uint8_t>(i)));
    EXPECT_TRUE(RoundTrip(same_core_, spare_, static_cast<uint8_t>(i)));
  }
}

// Invalid fault requests are refused with a clear code.
TEST_F(FaultTest, BadFaultParametersAreRejected) {
  EXPECT_EQ(tern_debug_inject_fault(nullptr), TERN_ERROR_INVALID_ARGUMENT);
  tern_fault_params_t params = {};
  params.struct_size = sizeof(params);
  // What a C caller can pass: any int in the enum's place.
  const int32_t unknown_kind = 99;
  static_assert(sizeof(params.kind) == sizeof(unknown_kind));
  std::memcpy(&params.kind, &unknown_kind, sizeof(unknown_kind));
  params.core = victim_core_;
  EXPECT_EQ(tern_debug_inject_fault(&params), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("99"), std::string::npos) << LastError();
  params.kind = TERN_FAULT_DMA_ABORT;
  params.core = nullptr;
  EXPECT_EQ(tern_debug_inject_fault(&params), TERN_ERROR_INVALID_HANDLE);
  params.kind = TERN_FAULT_HBM_UNCORRECTABLE;
  params.buffer = reinterpret_cast<tern_buffer_t>(victim_core_);  // a core is not a buffer
  EXPECT_EQ(tern_debug_inject_fault(&params), TERN_ERROR_INVALID_HANDLE);
  params.struct_size = 4;
  EXPECT_EQ(tern_debug_inject_fault(&params), TERN_ERROR_INVALID_ARGUMENT);
  // Nothing was armed: the queues run clean.
  EXPECT_TRUE(RoundTrip(victim_, good_, 1));
}

}  // namespace
