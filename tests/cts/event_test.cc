// CTS: events (record, query, synchronize, elapsed time) and waits across
// queues, cores and devices.
#include <thread>

#include "cts_fixture.h"

namespace tern::cts {
namespace {

constexpr auto kEnterTimeout = std::chrono::milliseconds(10000);

class EventTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    core_ = OpenCore(0, 0);
    ASSERT_NE(nullptr, core_);
    queue_ = CreateQueue(core_, "cts-a");
    ASSERT_NE(nullptr, queue_);
  }

  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

TEST_P(EventTest, NeverRecordedEventCountsAsComplete) {
  tern_event_t event = CreateEvent();
  tern_event_t other = CreateEvent();
  ASSERT_NE(nullptr, event);
  CTS_EXPECT_OK(tern_event_query(event));
  CTS_EXPECT_OK(tern_event_synchronize(event, 0));
  CTS_EXPECT_OK(tern_event_synchronize(event, TERN_TIMEOUT_INFINITE));
  // A device-side wait on it completes at once.
  CTS_ASSERT_OK(tern_queue_wait_event(queue_, event, nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  // There is no time to measure.
  uint64_t ns = 123;
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_event_elapsed_ns(event, other, &ns));
  EXPECT_EQ(0u, ns);
  CTS_ASSERT_OK(tern_queue_record_event(queue_, other, nullptr));
  CTS_ASSERT_OK(tern_event_synchronize(other, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_event_elapsed_ns(event, other, &ns));
  CTS_EXPECT_ERROR(TERN_ERROR_FAILED_PRECONDITION, tern_event_elapsed_ns(other, event, &ns));
  CTS_EXPECT_OK(tern_event_destroy(event));
  CTS_EXPECT_OK(tern_event_destroy(other));
}

TEST_P(EventTest, RecordQuerySynchronize) {
  tern_event_t event = CreateEvent();
  Gate* gate = NewGate();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, &sequence));
  EXPECT_EQ(2u, sequence);
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_event_query(event));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_event_synchronize(event, 0));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_event_synchronize(event, 10 * kMs));
  gate->Open();
  CTS_EXPECT_OK(tern_event_synchronize(event, kLongTimeout));
  CTS_EXPECT_OK(tern_event_query(event));
  // Completing the event means every command before it completed.
  uint64_t completed = 0;
  (void)tern_queue_query(queue_, &completed);
  EXPECT_GE(completed, 2u);
}

TEST_P(EventTest, ReRecordingMovesTheEvent) {
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, nullptr));
  CTS_ASSERT_OK(tern_event_synchronize(event, kLongTimeout));
  // Now record it behind a shut gate on another queue.
  tern_queue_t other = CreateQueue(core_, "cts-b");
  Gate* gate = NewGate();
  CTS_ASSERT_OK(tern_queue_host_callback(other, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(other, event, nullptr));
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_event_query(event));
  gate->Open();
  CTS_EXPECT_OK(tern_event_synchronize(event, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_destroy(other));
}

void SleepMs(void* user_data, tern_status_t) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(user_data)));
}

TEST_P(EventTest, ElapsedTime) {
  tern_event_t start = CreateEvent();
  tern_event_t end = CreateEvent();
  auto* sleep_ms = Make<int>(5);
  CTS_ASSERT_OK(tern_queue_record_event(queue_, start, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, SleepMs, sleep_ms, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, end, nullptr));
  CTS_ASSERT_OK(tern_event_synchronize(end, kLongTimeout));
  uint64_t ns = 0;
  CTS_ASSERT_OK(tern_event_elapsed_ns(start, end, &ns));
  EXPECT_GE(ns, 5 * kMs) << "the events enclose a 5 ms callback";
  EXPECT_LT(ns, 60000 * kMs);
  CTS_ASSERT_OK(tern_event_elapsed_ns(start, start, &ns));
  EXPECT_EQ(0u, ns);

  // An event that has not completed yet.
  Gate* gate = NewGate();
  tern_event_t pending = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, pending, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  ns = 77;
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_event_elapsed_ns(start, pending, &ns));
  EXPECT_EQ(0u, ns);
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_event_elapsed_ns(pending, end, &ns));
  gate->Open();
  CTS_ASSERT_OK(tern_event_synchronize(pending, kLongTimeout));
  CTS_EXPECT_OK(tern_event_elapsed_ns(start, pending, &ns));
  EXPECT_GE(ns, 5 * kMs);
}

// Shared state of the cross-queue tests: queue A sets `value` in a host
// callback; queue B, after waiting on A's event, reads it in its own.
struct SideEffect {
  std::atomic<int> value{0};
  std::atomic<int> observed{-1};
  std::atomic<tern_status_t> observer_status{-1};
  int sleep_ms = 0;
};

void SleepThenSet(void* user_data, tern_status_t) {
  auto* effect = static_cast<SideEffect*>(user_data);
  if (effect->sleep_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(effect->sleep_ms));
  effect->value.store(42);
}

void Observe(void* user_data, tern_status_t status) {
  auto* effect = static_cast<SideEffect*>(user_data);
  effect->observed.store(effect->value.load());
  effect->observer_status.store(status);
}

TEST_P(EventTest, CrossQueueWaitBehindSleepingCallback) {
  tern_core_t core_b = OpenCore(0, 1);
  tern_queue_t queue_b = CreateQueue(core_b, "cts-b");
  ASSERT_NE(nullptr, queue_b);
  auto* effect = Make<SideEffect>();
  effect->sleep_ms = 50;
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, SleepThenSet, effect, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, event, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_b, Observe, effect, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_b, kLongTimeout));
  EXPECT_EQ(42, effect->observed.load()) << "queue B ran before queue A's event completed";
  EXPECT_EQ(TERN_OK, effect->observer_status.load());
  CTS_EXPECT_OK(tern_event_query(event));
  CTS_EXPECT_OK(tern_queue_destroy(queue_b));
}

TEST_P(EventTest, CrossQueueWaitIsDeviceSide) {
  // The waiting queue holds later work back while the host goes on.
  tern_queue_t queue_b = CreateQueue(core_, "cts-b");
  auto* effect = Make<SideEffect>();
  Gate* gate = NewGate();
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, SleepThenSet, effect, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, nullptr));
  uint64_t wait_sequence = 0, observe_sequence = 0;
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, event, &wait_sequence));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_b, Observe, effect, &observe_sequence));
  EXPECT_EQ(1u, wait_sequence);
  EXPECT_EQ(2u, observe_sequence);
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_event_query(event));
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_queue_query(queue_b, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_synchronize(queue_b, 10 * kMs));
  EXPECT_EQ(-1, effect->observed.load());
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_b, kLongTimeout));
  EXPECT_EQ(42, effect->observed.load());
  CTS_EXPECT_OK(tern_queue_destroy(queue_b));
}

// A queue with a run of waits on one event's queue queued (a stream that
// waits for each collective on the communication stream) sleeps once for
// the whole run on the simulator; a thread that waits for one of the run's
// points still gets it when that point's own event comes, not when the last
// one does.
TEST_P(EventTest, AWaiterForOneOfARunOfWaitsIsNotHeldForTheLast) {
  tern_queue_t queue_b = CreateQueue(core_, "cts-b");
  ASSERT_NE(nullptr, queue_b);
  Gate* first = NewGate();
  Gate* second = NewGate();
  tern_event_t first_done = CreateEvent();
  tern_event_t second_done = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, first, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, first_done, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, second, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, second_done, nullptr));
  uint64_t first_wait = 0;
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, first_done, &first_wait));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, second_done, nullptr));
  ASSERT_TRUE(first->WaitEntered(kEnterTimeout));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // queue B's engine at its waits
  first->Open();
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_b, first_wait, kLongTimeout));
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_queue_query(queue_b, nullptr));
  second->Open();
  CTS_EXPECT_OK(tern_queue_synchronize(queue_b, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_destroy(queue_b));
}

// The same run of waits, where another queue waits for an event recorded
// between two of them, and the second wait needs that queue's later work:
// the event must complete when the first wait does, or both queues wait for
// each other.
TEST_P(EventTest, AnEventBetweenTwoWaitsCompletesBeforeTheSecondWait) {
  tern_queue_t queue_b = CreateQueue(core_, "cts-b");
  ASSERT_NE(nullptr, queue_b);
  Gate* gate = NewGate();
  tern_event_t a_first = CreateEvent();
  tern_event_t a_second = CreateEvent();
  tern_event_t b_between = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, a_first, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, a_first, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_b, b_between, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_, b_between, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, a_second, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, a_second, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // queue B's engine at its waits
  gate->Open();
  CTS_EXPECT_OK(tern_queue_synchronize(queue_b, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_destroy(queue_b));
}

TEST_P(EventTest, CrossDeviceWait) {
  CTS_NEED_DEVICES(2);
  tern_core_t core1 = OpenCore(1, 0);
  tern_queue_t queue1 = CreateQueue(core1, "cts-dev1");
  ASSERT_NE(nullptr, queue1);
  constexpr uint64_t kSize = 50000;
  tern_buffer_t on0 = Alloc(0, kSize);
  tern_buffer_t on1 = Alloc(1, kSize);
  auto* input = Make<std::vector<uint8_t>>(Pattern(kSize, 808));
  auto* output = HostBytes(kSize);
  Gate* gate = NewGate();
  tern_event_t written = CreateEvent();
  // Device 0: (gate) write the data, then signal.
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, on0, 0, input->data(), kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, written, nullptr));
  // Device 1: wait, pull the data across, read it back.
  CTS_ASSERT_OK(tern_queue_fill(queue1, on1, 0, kSize, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(queue1, written, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue1, on1, 0, on0, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue1, output->data(), on1, 0, kSize, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_synchronize(queue1, 10 * kMs));
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue1, kLongTimeout));
  EXPECT_TRUE(*input == *output);
  CTS_EXPECT_OK(tern_queue_destroy(queue1));
}

TEST_P(EventTest, DestroyedEventStillReleasesSubmittedWaits) {
  tern_queue_t queue_b = CreateQueue(core_, "cts-b");
  Gate* gate = NewGate();
  auto* effect = Make<SideEffect>();
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, SleepThenSet, effect, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_b, event, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_b, Observe, effect, nullptr));
  CTS_ASSERT_OK(tern_event_destroy(event));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_event_query(event));
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_b, kLongTimeout));
  EXPECT_EQ(42, effect->observed.load());
  CTS_EXPECT_OK(tern_queue_destroy(queue_b));
}

TEST_P(EventTest, EventOutlivesItsQueue) {
  tern_queue_t queue_b = CreateQueue(core_, "cts-b");
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_queue_nop(queue_b, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_b, event, nullptr));
  CTS_ASSERT_OK(tern_queue_destroy(queue_b));
  CTS_EXPECT_OK(tern_event_query(event));
  CTS_EXPECT_OK(tern_event_synchronize(event, 0));
  CTS_ASSERT_OK(tern_queue_wait_event(queue_, event, nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
}

TEST_P(EventTest, ManyQueuesWaitOnOneEvent) {
  tern_core_t core_b = OpenCore(0, 1);
  auto* effect = Make<SideEffect>();
  Gate* gate = NewGate();
  tern_event_t event = CreateEvent();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, SleepThenSet, effect, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, nullptr));
  std::vector<tern_queue_t> waiters;
  std::vector<SideEffect*> seen;
  for (int i = 0; i < 4; ++i) {
    tern_queue_t waiter = CreateQueue(i % 2 == 0 ? core_ : core_b);
    ASSERT_NE(nullptr, waiter);
    // Each observer reads the shared value through its own record.
    auto* mine = Make<SideEffect>();
    CTS_ASSERT_OK(tern_queue_wait_event(waiter, event, nullptr));
    CTS_ASSERT_OK(tern_queue_host_callback(
        waiter,
        [](void* user_data, tern_status_t status) {
          auto* pair = static_cast<std::pair<SideEffect*, SideEffect*>*>(user_data);
          pair->second->observed.store(pair->first->value.load());
          pair->second->observer_status.store(status);
        },
        Make<std::pair<SideEffect*, SideEffect*>>(effect, mine), nullptr));
    waiters.push_back(waiter);
    seen.push_back(mine);
  }
  gate->Open();
  for (size_t i = 0; i < waiters.size(); ++i) {
    CTS_EXPECT_OK(tern_queue_synchronize(waiters[i], kLongTimeout));
    EXPECT_EQ(42, seen[i]->observed.load()) << "waiter " << i;
    CTS_EXPECT_OK(tern_queue_destroy(waiters[i]));
  }
}

CTS_INSTANTIATE(EventTest);

}  // namespace
}  // namespace tern::cts
