// CTS: queues (copies, fills, ordering, host callbacks, timelines,
// synchronization) and their sticky errors.
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "cts_fixture.h"

namespace tern::cts {
namespace {

constexpr auto kEnterTimeout = std::chrono::milliseconds(10000);

class QueueTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    core_ = OpenCore(0, 0);
    ASSERT_NE(nullptr, core_);
    queue_ = CreateQueue(core_, "cts-queue");
    ASSERT_NE(nullptr, queue_);
  }

  // Reads a whole buffer synchronously.
  std::vector<uint8_t> ReadAll(tern_buffer_t buffer) {
    std::vector<uint8_t> bytes(BufferInfo(buffer).size);
    CTS_EXPECT_OK(tern_buffer_read(buffer, 0, bytes.data(), bytes.size()));
    return bytes;
  }

  tern_core_t core_ = nullptr;
  tern_queue_t queue_ = nullptr;
};

TEST_P(QueueTest, SeveralQueuesPerCore) {
  tern_core_t other_core = OpenCore(0, 1);
  std::vector<tern_queue_t> queues = {queue_};
  for (int i = 0; i < 3; ++i) queues.push_back(CreateQueue(core_));
  for (int i = 0; i < 2; ++i) queues.push_back(CreateQueue(other_core));
  std::vector<tern_buffer_t> buffers;
  std::vector<std::vector<uint8_t>*> results;
  for (size_t i = 0; i < queues.size(); ++i) {
    ASSERT_NE(nullptr, queues[i]);
    tern_buffer_t buffer = Alloc(0, 10000);
    auto* input = Make<std::vector<uint8_t>>(Pattern(10000, static_cast<uint32_t>(i)));
    auto* output = HostBytes(10000);
    CTS_ASSERT_OK(tern_queue_copy_h2d(queues[i], buffer, 0, input->data(), 10000, nullptr));
    CTS_ASSERT_OK(tern_queue_copy_d2h(queues[i], output->data(), buffer, 0, 10000, nullptr));
    buffers.push_back(buffer);
    results.push_back(output);
  }
  for (size_t i = 0; i < queues.size(); ++i) {
    CTS_EXPECT_OK(tern_queue_synchronize(queues[i], kLongTimeout));
    EXPECT_TRUE(*results[i] == Pattern(10000, static_cast<uint32_t>(i))) << "queue " << i;
  }
  for (size_t i = 1; i < queues.size(); ++i) CTS_EXPECT_OK(tern_queue_destroy(queues[i]));
}

TEST_P(QueueTest, LastSubmittedCountsEverySubmissionBeforeItCompletes) {
  uint64_t last = 99;
  CTS_ASSERT_OK(tern_queue_last_submitted(queue_, &last));
  EXPECT_EQ(0u, last) << "a new queue";
  // A callback that holds the queue: what follows it is submitted, not run.
  std::atomic<bool> release{false};
  auto hold = [](void* user, tern_status_t) {
    auto* flag = static_cast<std::atomic<bool>*>(user);
    while (!flag->load()) std::this_thread::yield();
  };
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, hold, &release, &sequence));
  CTS_ASSERT_OK(tern_queue_last_submitted(queue_, &last));
  EXPECT_EQ(sequence, last);
  tern_event_t event = nullptr;
  CTS_ASSERT_OK(tern_event_create(&event));
  for (int i = 0; i < 5; ++i) CTS_ASSERT_OK(tern_queue_nop(queue_, &sequence));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, &sequence));
  CTS_ASSERT_OK(tern_queue_last_submitted(queue_, &last));
  EXPECT_EQ(sequence, last);
  EXPECT_EQ(7u, last);
  uint64_t completed = 0;
  EXPECT_EQ(TERN_ERROR_NOT_READY, tern_queue_query(queue_, &completed));
  EXPECT_LT(completed, last) << "counted while the commands wait behind the callback";
  release = true;
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_last_submitted(queue_, &last));
  EXPECT_EQ(7u, last) << "completion does not move it";
  CTS_EXPECT_OK(tern_event_destroy(event));
}

TEST_P(QueueTest, QueuesOfOneCoreRunIndependently) {
  tern_queue_t other = CreateQueue(core_);
  ASSERT_NE(nullptr, other);
  Gate* gate = NewGate();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  // queue_ is blocked; the other queue of the same core still makes progress.
  auto* log = Make<CallbackLog>();
  CTS_ASSERT_OK(tern_queue_nop(other, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(other, CallbackLog::Callback, log->NewTag(1), nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(other, kLongTimeout));
  EXPECT_EQ(1u, log->entries().size());
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_queue_query(queue_, nullptr));
  gate->Open();
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(TERN_OK, gate->status());
  CTS_EXPECT_OK(tern_queue_destroy(other));
}

TEST_P(QueueTest, CopyHostDeviceOffsetsAndOddSizes) {
  constexpr uint64_t kBufferSize = 128 << 10;
  tern_buffer_t buffer = Alloc(0, kBufferSize);
  ASSERT_NE(nullptr, buffer);
  const uint64_t kSizes[] = {1, 3, 5, 4095, 4097, 65537};
  const uint64_t kOffsets[] = {0, 1, 7, 4093};
  uint32_t seed = 100;
  for (uint64_t size : kSizes) {
    for (uint64_t offset : kOffsets) {
      SCOPED_TRACE("size " + std::to_string(size) + " offset " + std::to_string(offset));
      CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kBufferSize, 0, nullptr));
      auto* input = Make<std::vector<uint8_t>>(Pattern(size, ++seed));
      auto* output = HostBytes(size + 2, 0xee);
      auto* whole = HostBytes(kBufferSize, 0xee);
      CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, buffer, offset, input->data(), size, nullptr));
      // Read back into the middle of a host buffer: the bytes around stay.
      CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, output->data() + 1, buffer, offset, size, nullptr));
      CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, whole->data(), buffer, 0, kBufferSize, nullptr));
      CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
      EXPECT_EQ(0, std::memcmp(input->data(), output->data() + 1, size));
      EXPECT_EQ(0xee, (*output)[0]);
      EXPECT_EQ(0xee, (*output)[size + 1]);
      std::vector<uint8_t> expected(kBufferSize, 0);
      std::memcpy(expected.data() + offset, input->data(), size);
      EXPECT_TRUE(expected == *whole) << "the copy touched bytes outside its range";
    }
  }
}

TEST_P(QueueTest, CopyDeviceToDeviceSameDevice) {
  constexpr uint64_t kSize = 70001;
  tern_buffer_t src = Alloc(0, kSize);
  tern_buffer_t dst = Alloc(0, kSize);
  const std::vector<uint8_t> source = Pattern(kSize, 42);
  CTS_ASSERT_OK(tern_buffer_write(src, 0, source.data(), kSize));
  struct Case {
    uint64_t src_offset, dst_offset, size;
  };
  for (Case c : {Case{0, 0, kSize}, Case{1, 3, 1}, Case{17, 4096, 12345}, Case{kSize - 7, 0, 7},
                 Case{5, kSize - 9, 9}}) {
    SCOPED_TRACE("src+" + std::to_string(c.src_offset) + " dst+" + std::to_string(c.dst_offset) +
                 " size " + std::to_string(c.size));
    CTS_ASSERT_OK(tern_queue_fill(queue_, dst, 0, kSize - kSize % 4, 0x11111111, nullptr));
    CTS_ASSERT_OK(tern_buffer_write(dst, kSize - kSize % 4, "\x11\x11\x11\x11", kSize % 4));
    CTS_ASSERT_OK(
        tern_queue_copy_d2d(queue_, dst, c.dst_offset, src, c.src_offset, c.size, nullptr));
    CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
    std::vector<uint8_t> expected(kSize, 0x11);
    std::memcpy(expected.data() + c.dst_offset, source.data() + c.src_offset, c.size);
    EXPECT_TRUE(expected == ReadAll(dst));
  }
}

TEST_P(QueueTest, CopyDeviceToDeviceOverlappingIsMemmove) {
  constexpr uint64_t kSize = 8192;
  tern_buffer_t buffer = Alloc(0, kSize);
  std::vector<uint8_t> model = Pattern(kSize, 77);
  CTS_ASSERT_OK(tern_buffer_write(buffer, 0, model.data(), kSize));
  // Forward overlap, then backward overlap.
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, buffer, 100, buffer, 0, 5000, nullptr));
  std::memmove(model.data() + 100, model.data(), 5000);
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, buffer, 3, buffer, 1000, 7000, nullptr));
  std::memmove(model.data() + 3, model.data() + 1000, 7000);
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_TRUE(model == ReadAll(buffer));
}

TEST_P(QueueTest, CopyDeviceToDeviceAcrossDevices) {
  CTS_NEED_DEVICES(2);
  constexpr uint64_t kSize = 33333;
  tern_buffer_t on0 = Alloc(0, kSize);
  tern_buffer_t on1 = Alloc(1, kSize);
  const std::vector<uint8_t> first = Pattern(kSize, 1), second = Pattern(kSize, 2);
  CTS_ASSERT_OK(tern_buffer_write(on0, 0, first.data(), kSize));
  CTS_ASSERT_OK(tern_buffer_write(on1, 0, second.data(), kSize));
  // A queue of device 0 pushes to device 1 ...
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, on1, 11, on0, 5, 20000, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<uint8_t> expected1 = second;
  std::memcpy(expected1.data() + 11, first.data() + 5, 20000);
  EXPECT_TRUE(expected1 == ReadAll(on1));
  // ... and pulls from it.
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, on0, 0, on1, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_TRUE(expected1 == ReadAll(on0));
  // A queue of device 1 does the same the other way round.
  tern_core_t core1 = OpenCore(1, 0);
  tern_queue_t queue1 = CreateQueue(core1);
  CTS_ASSERT_OK(tern_buffer_write(on0, 0, first.data(), kSize));
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue1, on1, 0, on0, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue1, kLongTimeout));
  EXPECT_TRUE(first == ReadAll(on1));
  CTS_EXPECT_OK(tern_queue_destroy(queue1));
}

TEST_P(QueueTest, FillBytePatternAndWordPattern) {
  constexpr uint64_t kSize = 4096;
  tern_buffer_t buffer = Alloc(0, kSize);
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kSize, 0xabababab, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_TRUE(std::vector<uint8_t>(kSize, 0xab) == ReadAll(buffer));

  // A word pattern lands as the 32-bit value in host byte order, repeated.
  const uint32_t kWord = 0x01020304;
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 4, 12, kWord, nullptr));
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 2048, 2048, 0xdeadbeef, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<uint8_t> expected(kSize, 0xab);
  for (uint64_t i = 4; i < 16; i += 4) std::memcpy(expected.data() + i, &kWord, 4);
  const uint32_t kDead = 0xdeadbeef;
  for (uint64_t i = 2048; i < kSize; i += 4) std::memcpy(expected.data() + i, &kDead, 4);
  EXPECT_TRUE(expected == ReadAll(buffer));

  // Zero and a pattern whose bytes are equal except one.
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kSize, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 8, 8, 0x7f7f7f7e, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::vector<uint8_t> zeros(kSize, 0);
  const uint32_t kAlmost = 0x7f7f7f7e;
  std::memcpy(zeros.data() + 8, &kAlmost, 4);
  std::memcpy(zeros.data() + 12, &kAlmost, 4);
  EXPECT_TRUE(zeros == ReadAll(buffer));
}

TEST_P(QueueTest, InOrderExecutionOfDependentCommands) {
  // Each round overwrites the same buffers; every read must see exactly the
  // write submitted just before it.
  constexpr int kRounds = 40;
  constexpr uint64_t kSize = 1000;
  tern_buffer_t a = Alloc(0, kSize);
  tern_buffer_t b = Alloc(0, kSize);
  tern_buffer_t c = Alloc(1 % device_count(), kSize);
  std::vector<std::vector<uint8_t>*> inputs, outputs;
  for (int round = 0; round < kRounds; ++round) {
    auto* input = Make<std::vector<uint8_t>>(Pattern(kSize, 1000 + round));
    auto* output = HostBytes(kSize);
    CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, a, 0, input->data(), kSize, nullptr));
    CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, b, 0, a, 0, kSize, nullptr));
    CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, c, 0, b, 0, kSize, nullptr));
    CTS_ASSERT_OK(tern_queue_fill(queue_, a, 0, 8, 0, nullptr));  // must not reach c
    CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, b, 0, c, 0, kSize, nullptr));
    CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, output->data(), b, 0, kSize, nullptr));
    inputs.push_back(input);
    outputs.push_back(output);
  }
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_TRUE(*inputs[round] == *outputs[round]) << "round " << round;
  }
}

TEST_P(QueueTest, HostCallbacksRunInOrderWithOk) {
  auto* log = Make<CallbackLog>();
  constexpr int kCallbacks = 50;
  tern_buffer_t buffer = Alloc(0, 4096);
  for (int i = 0; i < kCallbacks; ++i) {
    CTS_ASSERT_OK(tern_queue_host_callback(queue_, CallbackLog::Callback, log->NewTag(i), nullptr));
    if (i % 3 == 0) {
      CTS_ASSERT_OK(tern_queue_nop(queue_, nullptr));
    }
    if (i % 5 == 0) {
      CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 4096, i, nullptr));
    }
  }
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  const auto entries = log->entries();
  ASSERT_EQ(static_cast<size_t>(kCallbacks), entries.size());
  for (int i = 0; i < kCallbacks; ++i) {
    EXPECT_EQ(i, entries[i].first);
    EXPECT_EQ(TERN_OK, entries[i].second) << StatusName(entries[i].second);
  }
}

TEST_P(QueueTest, CallbackSeesEarlierCopiesComplete) {
  struct Probe {
    tern_buffer_t buffer;
    std::vector<uint8_t> seen;
    tern_status_t read_status = -1;
  };
  auto* probe = Make<Probe>();
  probe->buffer = Alloc(0, 256);
  auto* input = Make<std::vector<uint8_t>>(Pattern(256, 31));
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, probe->buffer, 0, input->data(), 256, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(
      queue_,
      [](void* user_data, tern_status_t) {
        auto* p = static_cast<Probe*>(user_data);
        p->seen.resize(256);
        p->read_status = tern_buffer_read(p->buffer, 0, p->seen.data(), 256);
      },
      probe, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(TERN_OK, probe->read_status);
  EXPECT_TRUE(*input == probe->seen);
}

TEST_P(QueueTest, SequenceNumbersCountFromOne) {
  tern_buffer_t buffer = Alloc(0, 64);
  tern_buffer_t other = Alloc(0, 64);
  tern_event_t event = CreateEvent();
  auto* host = HostBytes(64);
  auto* log = Make<CallbackLog>();
  std::vector<uint64_t> sequences;
  uint64_t sequence = 0;
  CTS_ASSERT_OK(tern_queue_nop(queue_, &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, buffer, 0, host->data(), 64, &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, CallbackLog::Callback, log->NewTag(0), &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 64, 1, &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_wait_event(queue_, event, &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, host->data(), buffer, 0, 64, &sequence));
  sequences.push_back(sequence);
  CTS_ASSERT_OK(tern_queue_copy_d2d(queue_, other, 0, buffer, 0, 64, &sequence));
  sequences.push_back(sequence);
  for (size_t i = 0; i < sequences.size(); ++i) EXPECT_EQ(i + 1, sequences[i]);
  // Without out_sequence the command still takes its number.
  CTS_ASSERT_OK(tern_queue_nop(queue_, nullptr));
  CTS_ASSERT_OK(tern_queue_nop(queue_, &sequence));
  EXPECT_EQ(10u, sequence);
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  uint64_t completed = 0;
  CTS_EXPECT_OK(tern_queue_query(queue_, &completed));
  EXPECT_EQ(10u, completed);
  // Every queue has its own timeline.
  tern_queue_t fresh = CreateQueue(core_);
  CTS_ASSERT_OK(tern_queue_nop(fresh, &sequence));
  EXPECT_EQ(1u, sequence);
  CTS_EXPECT_OK(tern_queue_destroy(fresh));
}

TEST_P(QueueTest, QueryNotReadyThenOk) {
  uint64_t completed = 99;
  CTS_EXPECT_OK(tern_queue_query(queue_, &completed));
  EXPECT_EQ(0u, completed) << "a new queue has completed nothing";
  Gate* gate = NewGate();
  CTS_ASSERT_OK(tern_queue_nop(queue_, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  CTS_ASSERT_OK(tern_queue_nop(queue_, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_queue_query(queue_, &completed));
  EXPECT_LT(completed, 2u) << "the gated command (number 2) cannot have completed";
  CTS_EXPECT_STATUS(TERN_ERROR_NOT_READY, tern_queue_query(queue_, nullptr));
  gate->Open();
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_query(queue_, &completed));
  EXPECT_EQ(3u, completed);
}

TEST_P(QueueTest, WaitSequence) {
  Gate* gate = NewGate();
  uint64_t first = 0, gated = 0, last = 0;
  CTS_ASSERT_OK(tern_queue_nop(queue_, &first));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, &gated));
  CTS_ASSERT_OK(tern_queue_nop(queue_, &last));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, first, 0));
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, first, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_wait_sequence(queue_, gated, 0));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_wait_sequence(queue_, last, 5 * kMs));
  gate->Open();
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, last, kLongTimeout));
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, gated, 0));
  CTS_EXPECT_OK(tern_queue_query(queue_, nullptr));
}

TEST_P(QueueTest, SynchronizeWithTimeout) {
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, 0)) << "an idle queue is synchronized at once";
  Gate* gate = NewGate();
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, Gate::Callback, gate, nullptr));
  ASSERT_TRUE(gate->WaitEntered(kEnterTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_synchronize(queue_, 0), "cts-queue");
  const auto start = std::chrono::steady_clock::now();
  CTS_EXPECT_ERROR(TERN_ERROR_TIMEOUT, tern_queue_synchronize(queue_, 20 * kMs), "cts-queue");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20))
      << "returned before its timeout";
  gate->Open();
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, 0));
}

void SleepThenSet(void* user_data, tern_status_t status) {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  static_cast<std::atomic<int>*>(user_data)->store(status == TERN_OK ? 1 : 2);
}

TEST_P(QueueTest, DestroyWaitsForPendingCommands) {
  tern_queue_t queue = CreateQueue(core_);
  auto* done = Make<std::atomic<int>>(0);
  CTS_ASSERT_OK(tern_queue_host_callback(queue, SleepThenSet, done, nullptr));
  CTS_ASSERT_OK(tern_queue_nop(queue, nullptr));
  CTS_EXPECT_OK(tern_queue_destroy(queue));
  EXPECT_EQ(1, done->load()) << "destroy must drain the queue first";
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_nop(queue, nullptr));
}

TEST_P(QueueTest, PinnedHostMemoryCopies) {
  constexpr uint64_t kSize = 256 << 10;
  void* pinned_in = nullptr;
  void* pinned_out = nullptr;
  CTS_ASSERT_OK(tern_host_alloc(kSize, &pinned_in));
  CTS_ASSERT_OK(tern_host_alloc(kSize, &pinned_out));
  const std::vector<uint8_t> data = Pattern(kSize, 55);
  std::memcpy(pinned_in, data.data(), kSize);
  tern_buffer_t buffer = Alloc(0, kSize);
  CTS_ASSERT_OK(tern_queue_copy_h2d(queue_, buffer, 0, pinned_in, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, pinned_out, buffer, 0, kSize, nullptr));
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  EXPECT_EQ(0, std::memcmp(pinned_out, data.data(), kSize));
  CTS_EXPECT_OK(tern_host_free(pinned_in));
  CTS_EXPECT_OK(tern_host_free(pinned_out));
}

TEST_P(QueueTest, ConcurrentSubmittersAreOrderedByCall) {
  // Several threads submit to one queue: sequence numbers are unique and
  // dense, and callbacks run in sequence order.
  constexpr int kThreads = 3;
  constexpr int kPerThread = 100;
  struct Shared {
    std::mutex mutex;
    std::vector<uint64_t> order;        // sequence numbers, in callback order
    std::vector<uint64_t> sequence_of;  // by callback id
  };
  auto* shared = Make<Shared>();
  shared->sequence_of.assign(kThreads * kPerThread, 0);
  struct Tag {
    Shared* shared;
    int id;
  };
  auto* tags = Make<std::vector<Tag>>();
  tags->reserve(kThreads * kPerThread);
  for (int i = 0; i < kThreads * kPerThread; ++i) tags->push_back(Tag{shared, i});
  auto callback = [](void* user_data, tern_status_t) {
    auto* tag = static_cast<Tag*>(user_data);
    std::lock_guard<std::mutex> lock(tag->shared->mutex);
    tag->shared->order.push_back(static_cast<uint64_t>(tag->id));
  };
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int id = t * kPerThread + i;
        uint64_t sequence = 0;
        if (tern_queue_host_callback(queue_, callback, &(*tags)[id], &sequence) != TERN_OK) {
          ++failures;
        }
        shared->sequence_of[id] = sequence;
        if (i % 10 == 0 && tern_queue_nop(queue_, nullptr) != TERN_OK) ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(0, failures.load());
  CTS_ASSERT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  std::lock_guard<std::mutex> lock(shared->mutex);
  ASSERT_EQ(static_cast<size_t>(kThreads * kPerThread), shared->order.size());
  uint64_t previous = 0;
  for (uint64_t id : shared->order) {
    const uint64_t sequence = shared->sequence_of[id];
    EXPECT_GT(sequence, previous) << "callback " << id << " ran out of sequence order";
    previous = sequence;
  }
  uint64_t completed = 0;
  CTS_EXPECT_OK(tern_queue_query(queue_, &completed));
  EXPECT_EQ(static_cast<uint64_t>(kThreads * kPerThread + kThreads * kPerThread / 10), completed);
}

double ThreadCpuSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TEST_P(QueueTest, AWaiterWithoutDeadlineRunsWhatAnIdleEngineHasNotStarted) {
  // After a pause the queue's engine sleeps; a waiter without a deadline
  // that finds it not yet at the fill runs the fill itself, so its own CPU
  // time grows by about the fill's length. Waiting instead, it would poll
  // for at most 0.5 ms and sleep. The engine may wake and take the fill
  // first, so it is tried several times and must happen at least once.
  constexpr uint64_t kBytes = 64 << 20;
  tern_buffer_t buffer = Alloc(0, kBytes);
  ASSERT_NE(nullptr, buffer);
  int ran_here = 0;
  uint32_t pattern = 0;
  for (int trial = 0; trial < 20 && ran_here == 0; ++trial) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    pattern = 0x01020304u + static_cast<uint32_t>(trial);
    const double cpu_start = ThreadCpuSeconds();
    const double wall_start = WallSeconds();
    CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kBytes, pattern, nullptr));
    CTS_ASSERT_OK(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE));
    const double cpu = ThreadCpuSeconds() - cpu_start;
    const double wall = WallSeconds() - wall_start;
    if (wall > 2e-3 && cpu > 0.3 * wall) ++ran_here;
  }
  EXPECT_GT(ran_here, 0) << "the waiting thread never ran the fill itself";
  uint32_t first = 0, last = 0;
  CTS_EXPECT_OK(tern_buffer_read(buffer, 0, &first, sizeof(first)));
  CTS_EXPECT_OK(tern_buffer_read(buffer, kBytes - 4, &last, sizeof(last)));
  EXPECT_EQ(pattern, first);
  EXPECT_EQ(pattern, last);
}

TEST_P(QueueTest, ACommandNobodyWaitsForStartsOnItsOwn) {
  // After a pause the queue's engine naps (a submission does not wake it:
  // the submitter may be about to run the command itself) or, after a longer
  // one, sleeps. Either way a fill that no thread waits for, queries or
  // synchronizes on runs by itself: nothing here touches the queue until it
  // must be done.
  constexpr uint64_t kBytes = 4096;
  tern_buffer_t buffer = Alloc(0, kBytes);
  ASSERT_NE(nullptr, buffer);
  const std::chrono::microseconds pauses[] = {std::chrono::microseconds(200),
                                              std::chrono::microseconds(5000)};
  uint32_t pattern = 0x5a5a0000u;
  for (const auto pause : pauses) {
    std::this_thread::sleep_for(pause);
    ++pattern;
    CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kBytes, pattern, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    uint64_t completed = 0;
    EXPECT_EQ(TERN_OK, tern_queue_query(queue_, &completed))
        << "the fill submitted after a pause of " << pause.count()
        << " us had not run 200 ms later";
    CTS_ASSERT_OK(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE));
    uint32_t word = 0;
    CTS_EXPECT_OK(tern_buffer_read(buffer, kBytes - 4, &word, sizeof(word)));
    EXPECT_EQ(pattern, word);
  }
}

struct ThreadNameAndWord {
  char thread_name[16] = {};
  uint32_t copied = 0;  // a copy of the buffer's first word made before the callback
  uint32_t word = 0;    // `copied` as the callback saw it
};

void NoteThreadAndWord(void* user_data, tern_status_t) {
  auto* seen = static_cast<ThreadNameAndWord*>(user_data);
  pthread_getname_np(pthread_self(), seen->thread_name, sizeof(seen->thread_name));
  seen->word = seen->copied;
}

TEST_P(QueueTest, CallbacksStayOnTheQueuesThreadWhenAWaiterRunsTheRest) {
  // A waiter may run copies and fills itself, but never a callback: the
  // callback runs on the queue's own thread, after the commands before it
  // and before the fill after it, and the wait returns when all are done.
  constexpr uint64_t kBytes = 1 << 20;
  tern_buffer_t buffer = Alloc(0, kBytes);
  ASSERT_NE(nullptr, buffer);
  for (int trial = 0; trial < 10; ++trial) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto* seen = Make<ThreadNameAndWord>();
    const uint32_t before = 0x11110000u + static_cast<uint32_t>(trial);
    const uint32_t after = 0x22220000u + static_cast<uint32_t>(trial);
    CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kBytes, before, nullptr));
    CTS_ASSERT_OK(tern_queue_copy_d2h(queue_, &seen->copied, buffer, 0, 4, nullptr));
    CTS_ASSERT_OK(tern_queue_host_callback(queue_, NoteThreadAndWord, seen, nullptr));
    CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, kBytes, after, nullptr));
    CTS_ASSERT_OK(tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE));
    EXPECT_EQ(0, std::strncmp(seen->thread_name, "tern-queue", 10))
        << "trial " << trial << ": the callback ran on '" << seen->thread_name << "'";
    EXPECT_EQ(before, seen->word) << "trial " << trial;
    uint32_t word = 0;
    CTS_EXPECT_OK(tern_buffer_read(buffer, kBytes - 4, &word, sizeof(word)));
    EXPECT_EQ(after, word) << "trial " << trial;
  }
}

TEST_P(QueueTest, WaitersWithoutDeadlineOnOneQueueFromSeveralThreads) {
  // Threads that each copy their own pattern through the device and wait
  // without a deadline take turns running the queue's commands with its
  // engine and with each other; every round trip comes back whole.
  constexpr int kThreads = 3;
  constexpr int kRounds = 60;
  constexpr size_t kBytes = 8192;
  std::vector<tern_buffer_t> buffers;
  for (int t = 0; t < kThreads; ++t) {
    buffers.push_back(Alloc(0, kBytes));
    ASSERT_NE(nullptr, buffers.back());
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> back(kBytes);
      for (int round = 0; round < kRounds; ++round) {
        const std::vector<uint8_t> sent = Pattern(kBytes, static_cast<uint32_t>(t * 1000 + round));
        if (tern_queue_copy_h2d(queue_, buffers[t], 0, sent.data(), kBytes, nullptr) != TERN_OK ||
            tern_queue_copy_d2h(queue_, back.data(), buffers[t], 0, kBytes, nullptr) != TERN_OK ||
            tern_queue_synchronize(queue_, TERN_TIMEOUT_INFINITE) != TERN_OK || back != sent) {
          ++failures;
        }
        if (round % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(0, failures.load());
}

CTS_INSTANTIATE(QueueTest);

// --- Sticky errors (need fault injection) -------------------------------------------------

class QueueErrorTest : public QueueTest {
 protected:
  // Arms a DMA abort on core_'s (after+1)-th copy or fill.
  void ArmDmaAbort(uint64_t after) {
    tern_fault_params_t fault{};
    fault.struct_size = sizeof(fault);
    fault.kind = TERN_FAULT_DMA_ABORT;
    fault.core = core_;
    fault.after_commands = after;
    CTS_ASSERT_OK(tern_debug_inject_fault(&fault));
  }
};

TEST_P(QueueErrorTest, FailedCommandIsStickyUntilCleared) {
  tern_buffer_t buffer = Alloc(0, 4096);
  auto* log = Make<CallbackLog>();
  ArmDmaAbort(1);
  uint64_t good = 0, bad = 0, skipped = 0;
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 4096, 0x01010101, &good));
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 4096, 0x02020202, &bad));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, CallbackLog::Callback, log->NewTag(1), nullptr));
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 4096, 0x03030303, &skipped));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_synchronize(queue_, kLongTimeout), "cts-queue",
                   std::to_string(bad).c_str());
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_query(queue_, nullptr));
  CTS_EXPECT_OK(tern_queue_wait_sequence(queue_, good, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_wait_sequence(queue_, bad, kLongTimeout));
  // The callback after the failure ran, with the error.
  auto entries = log->entries();
  ASSERT_EQ(1u, entries.size());
  EXPECT_EQ(TERN_ERROR_DMA_ABORT, entries[0].second) << StatusName(entries[0].second);
  // The skipped fill did not run: the memory holds the first fill.
  std::vector<uint8_t> bytes(4096);
  CTS_ASSERT_OK(tern_buffer_read(buffer, 0, bytes.data(), bytes.size()));
  EXPECT_EQ(0x01, bytes[0]);

  // Other queues go on.
  tern_queue_t other = CreateQueue(core_);
  CTS_ASSERT_OK(tern_queue_fill(other, buffer, 0, 4096, 0x04040404, nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(other, kLongTimeout));

  // Clearing returns the error once; new commands run again.
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_clear_error(queue_));
  CTS_EXPECT_OK(tern_queue_clear_error(queue_));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 4096, 0x05050505, nullptr));
  CTS_ASSERT_OK(tern_queue_host_callback(queue_, CallbackLog::Callback, log->NewTag(2), nullptr));
  CTS_EXPECT_OK(tern_queue_synchronize(queue_, kLongTimeout));
  CTS_ASSERT_OK(tern_buffer_read(buffer, 0, bytes.data(), bytes.size()));
  EXPECT_EQ(0x05, bytes[0]);
  entries = log->entries();
  ASSERT_EQ(2u, entries.size());
  EXPECT_EQ(TERN_OK, entries[1].second);
  CTS_EXPECT_OK(tern_queue_destroy(other));
}

TEST_P(QueueErrorTest, DestroyReturnsStickyError) {
  tern_queue_t queue = CreateQueue(core_);
  tern_buffer_t buffer = Alloc(0, 64);
  ArmDmaAbort(0);
  CTS_ASSERT_OK(tern_queue_fill(queue, buffer, 0, 64, 0, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_destroy(queue));
  CTS_EXPECT_ERROR(TERN_ERROR_INVALID_HANDLE, tern_queue_destroy(queue));
  // The core can close: the queue is gone despite the error.
  CTS_EXPECT_OK(tern_queue_destroy(queue_));
  queue_ = nullptr;
  CTS_EXPECT_OK(tern_core_close(core_));
}

TEST_P(QueueErrorTest, WaitOnFailedQueueFailsDependency) {
  tern_core_t other_core = OpenCore(0, 1);
  tern_queue_t waiter = CreateQueue(other_core, "cts-waiter");
  tern_buffer_t buffer = Alloc(0, 64);
  tern_event_t event = CreateEvent();
  ArmDmaAbort(0);
  CTS_ASSERT_OK(tern_queue_fill(queue_, buffer, 0, 64, 0, nullptr));
  CTS_ASSERT_OK(tern_queue_record_event(queue_, event, nullptr));
  CTS_ASSERT_OK(tern_queue_wait_event(waiter, event, nullptr));
  CTS_EXPECT_ERROR(TERN_ERROR_DEPENDENCY_FAILED, tern_queue_synchronize(waiter, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_event_synchronize(event, kLongTimeout));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_event_query(event));
  CTS_EXPECT_ERROR(TERN_ERROR_DEPENDENCY_FAILED, tern_queue_clear_error(waiter));
  CTS_EXPECT_ERROR(TERN_ERROR_DMA_ABORT, tern_queue_clear_error(queue_));
  CTS_EXPECT_OK(tern_queue_destroy(waiter));
}

CTS_INSTANTIATE(QueueErrorTest);

}  // namespace
}  // namespace tern::cts
