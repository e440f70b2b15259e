// Stress tests of queues and events under many threads (run under TSan by
// CI, label "concurrency").
//
// MixedCommandsAcrossThreadsQueuesAndDevices: 8 threads each own 4 queues
// spread over the node's 4 cores (2 devices x 2 cores; several queues per
// core) and submit an interleaved random mix of small copies, fills, nops,
// host callbacks and event record/wait pairs, including waits on events that
// other threads record on other devices, plus chains of dependent copies
// that carry data across all 4 queues. Every thread submits at least
// TERN_STRESS_COMMANDS commands (default 100000). The test then checks that
// every command completed, that every queue's host callbacks ran exactly
// once and in order, that the chained data arrived intact, and that each
// queue's device and host memory holds exactly what its command sequence
// implies.
//
// ConcurrentSubmittersToOneQueue: 4 threads submit to one queue; callbacks
// must run in sequence-number order, each exactly once.
#include <gtest/gtest.h>
#include <tern/tern.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 8;
constexpr int kQueuesPerThread = 4;
constexpr int kCores = 4;                 // 2 devices x 2 cores
constexpr uint64_t kScratchBytes = 4096;  // per queue, random small commands
constexpr uint64_t kMaxSmallCopy = 256;
constexpr uint64_t kSourceBytes = 64 * 1024;  // immutable host source of H2D copies
constexpr int kChainSlots = 8;                // chains in flight per thread
constexpr uint64_t kChainBytes = 2048;
constexpr int kChainPatterns = 16;
constexpr int kPublishedEvents = 4;  // per thread, waited on by every thread
constexpr uint64_t kWindow = 4096;   // commands a queue may run ahead of its engine
constexpr uint64_t kTimeoutNs = 120ull * 1000000000ull;

std::string LastError() { return tern_last_error_message(); }

uint64_t CommandsPerThread() {
  const char* text = std::getenv("TERN_STRESS_COMMANDS");
  if (text == nullptr || *text == '\0') return 100000;
  const long long value = std::atoll(text);
  return value > 0 ? static_cast<uint64_t>(value) : 100000;
}

// FNV-1a: enough to tell a mangled block from the right one.
uint64_t Checksum(const uint8_t* data, size_t size) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 1099511628211ull;
  return hash;
}

// What a host callback knows: its queue's log, its own sequence number and,
// for the last link of a chain, the block it must find intact.
struct CallbackArg {
  std::vector<uint64_t>* log = nullptr;
  uint64_t sequence = 0;
  const uint8_t* check_data = nullptr;
  uint64_t check_sum = 0;
  std::atomic<uint64_t>* corrupt = nullptr;
  std::atomic<uint64_t>* bad_status = nullptr;
};

void LogCallback(void* user_data, tern_status_t status) {
  auto* arg = static_cast<CallbackArg*>(user_data);
  arg->log->push_back(arg->sequence);
  if (status != TERN_OK) arg->bad_status->fetch_add(1);
  if (arg->check_data != nullptr && Checksum(arg->check_data, kChainBytes) != arg->check_sum) {
    arg->corrupt->fetch_add(1);
  }
}

// One queue of one thread, and everything the thread knows it should hold.
struct QueueState {
  tern_queue_t queue = nullptr;
  int core = 0;  // node-wide core index 0..3
  tern_buffer_t scratch = nullptr;
  std::vector<uint8_t> scratch_shadow = std::vector<uint8_t>(kScratchBytes, 0);
  std::vector<uint8_t> sink = std::vector<uint8_t>(kScratchBytes, 0);  // D2H target
  std::vector<uint8_t> sink_shadow = std::vector<uint8_t>(kScratchBytes, 0);
  std::vector<uint64_t> log;           // appended by this queue's callbacks only
  std::vector<uint64_t> expected_log;  // the callbacks' sequence numbers
  std::deque<CallbackArg> args;        // stable addresses for user_data
  uint64_t submitted = 0;
  uint64_t next_window_check = kWindow + 1;
  uint64_t failures = 0;  // submissions that did not return TERN_OK
};

struct ChainSlot {
  tern_buffer_t stage[3] = {};  // on the devices of queues 0, 1 and 3
  tern_event_t step[3] = {};    // recorded after each of the first three links
  tern_event_t done = nullptr;  // recorded after the last link: the slot is free
  std::vector<uint8_t> landing = std::vector<uint8_t>(kChainBytes, 0);
};

struct ThreadState {
  QueueState queues[kQueuesPerThread];
  ChainSlot slots[kChainSlots];
  tern_event_t published[kPublishedEvents] = {};
  std::vector<uint8_t> source;  // immutable while commands run
  std::vector<std::vector<uint8_t>> patterns;
  std::vector<uint64_t> pattern_sums;
  uint64_t chains = 0;
  std::atomic<uint64_t> corrupt{0};
  std::atomic<uint64_t> bad_status{0};
};

class StressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(tern_init(nullptr), TERN_OK) << LastError();
    uint32_t count = 0;
    ASSERT_EQ(tern_device_count(&count), TERN_OK);
    ASSERT_EQ(count, 2u);
    for (uint32_t d = 0; d < 2; ++d) {
      ASSERT_EQ(tern_device_get(d, &devices_[d]), TERN_OK);
      for (uint32_t c = 0; c < 2; ++c) {
        ASSERT_EQ(tern_core_open(devices_[d], c, &cores_[d * 2 + c]), TERN_OK) << LastError();
      }
    }
  }

  void TearDown() override {
    for (tern_event_t event : events_) EXPECT_EQ(tern_event_destroy(event), TERN_OK);
    for (tern_buffer_t buffer : buffers_) EXPECT_EQ(tern_buffer_free(buffer), TERN_OK);
    for (tern_queue_t queue : queues_) EXPECT_EQ(tern_queue_destroy(queue), TERN_OK) << LastError();
    for (tern_core_t core : cores_) {
      if (core != nullptr) {
        EXPECT_EQ(tern_core_close(core), TERN_OK) << LastError();
      }
    }
    EXPECT_EQ(tern_shutdown(), TERN_OK);
  }

  static tern_device_t DeviceOfCore(const tern_device_t devices[2], int core) {
    return devices[core / 2];
  }

  tern_buffer_t Alloc(int core, uint64_t size) {
    tern_buffer_params_t params = {};
    params.struct_size = sizeof(params);
    params.size = size;
    params.category = TERN_MEMORY_TENSORS;
    tern_buffer_t buffer = nullptr;
    EXPECT_EQ(tern_buffer_alloc(DeviceOfCore(devices_, core), &params, &buffer), TERN_OK)
        << LastError();
    buffers_.push_back(buffer);
    return buffer;
  }

  tern_queue_t CreateQueue(int core, const std::string& name) {
    tern_queue_params_t params = {};
    params.struct_size = sizeof(params);
    params.name = name.c_str();
    tern_queue_t queue = nullptr;
    EXPECT_EQ(tern_queue_create(cores_[core], &params, &queue), TERN_OK) << LastError();
    queues_.push_back(queue);
    return queue;
  }

  tern_event_t CreateEvent() {
    tern_event_t event = nullptr;
    EXPECT_EQ(tern_event_create(&event), TERN_OK) << LastError();
    events_.push_back(event);
    return event;
  }

  tern_device_t devices_[2] = {};
  tern_core_t cores_[kCores] = {};
  std::vector<tern_queue_t> queues_;
  std::vector<tern_buffer_t> buffers_;
  std::vector<tern_event_t> events_;
};

// Submits one command to `q` and keeps the local count in step with the
// queue's sequence numbers (this thread is the queue's only submitter).
template <typename Submit>
void Count(QueueState& q, Submit submit) {
  uint64_t sequence = 0;
  const tern_status_t status = submit(&sequence);
  if (status != TERN_OK || sequence != q.submitted + 1) {
    ++q.failures;
    ADD_FAILURE() << "submission " << q.submitted + 1 << " returned " << tern_status_string(status)
                  << " with sequence " << sequence << ": " << LastError();
  }
  if (sequence != 0) q.submitted = sequence;
}

void SubmitCallback(ThreadState& t, QueueState& q, const uint8_t* check_data, uint64_t check_sum) {
  CallbackArg& arg = q.args.emplace_back();
  arg.log = &q.log;
  arg.sequence = q.submitted + 1;
  arg.check_data = check_data;
  arg.check_sum = check_sum;
  arg.corrupt = &t.corrupt;
  arg.bad_status = &t.bad_status;
  q.expected_log.push_back(arg.sequence);
  Count(q, [&](uint64_t* s) { return tern_queue_host_callback(q.queue, LogCallback, &arg, s); });
}

// A chain carries one block through all four queues of the thread:
//   q0: wait(done) H2D(stage0) record(step0)     q1: wait(step0) D2D(stage1<-stage0) record(step1)
//   q2: wait(step1) D2D(stage2<-stage1) record(step2)
//   q3: wait(step2) D2H(landing<-stage2) callback(check) record(done)
// Waiting on `done` before reusing a slot keeps the previous use's reads
// ahead of the next use's writes.
uint64_t SubmitChain(ThreadState& t) {
  ChainSlot& slot = t.slots[t.chains % kChainSlots];
  const int pattern = static_cast<int>(t.chains % kChainPatterns);
  ++t.chains;
  QueueState* q = t.queues;
  Count(q[0], [&](uint64_t* s) { return tern_queue_wait_event(q[0].queue, slot.done, s); });
  Count(q[0], [&](uint64_t* s) {
    return tern_queue_copy_h2d(q[0].queue, slot.stage[0], 0, t.patterns[pattern].data(),
                               kChainBytes, s);
  });
  Count(q[0], [&](uint64_t* s) { return tern_queue_record_event(q[0].queue, slot.step[0], s); });
  Count(q[1], [&](uint64_t* s) { return tern_queue_wait_event(q[1].queue, slot.step[0], s); });
  Count(q[1], [&](uint64_t* s) {
    return tern_queue_copy_d2d(q[1].queue, slot.stage[1], 0, slot.stage[0], 0, kChainBytes, s);
  });
  Count(q[1], [&](uint64_t* s) { return tern_queue_record_event(q[1].queue, slot.step[1], s); });
  Count(q[2], [&](uint64_t* s) { return tern_queue_wait_event(q[2].queue, slot.step[1], s); });
  Count(q[2], [&](uint64_t* s) {
    return tern_queue_copy_d2d(q[2].queue, slot.stage[2], 0, slot.stage[1], 0, kChainBytes, s);
  });
  Count(q[2], [&](uint64_t* s) { return tern_queue_record_event(q[2].queue, slot.step[2], s); });
  Count(q[3], [&](uint64_t* s) { return tern_queue_wait_event(q[3].queue, slot.step[2], s); });
  Count(q[3], [&](uint64_t* s) {
    return tern_queue_copy_d2h(q[3].queue, slot.landing.data(), slot.stage[2], 0, kChainBytes, s);
  });
  SubmitCallback(t, q[3], slot.landing.data(), t.pattern_sums[pattern]);
  Count(q[3], [&](uint64_t* s) { return tern_queue_record_event(q[3].queue, slot.done, s); });
  return 13;
}

// One random small command on a random queue of the thread; returns 1.
uint64_t SubmitRandom(ThreadState& t, ThreadState* all, std::mt19937_64& rng) {
  QueueState& q = t.queues[rng() % kQueuesPerThread];
  const uint64_t size = 4 * (1 + rng() % (kMaxSmallCopy / 4));
  const uint64_t offset = 4 * (rng() % ((kScratchBytes - size) / 4 + 1));
  switch (rng() % 8) {
    case 0:
      Count(q, [&](uint64_t* s) { return tern_queue_nop(q.queue, s); });
      break;
    case 1: {
      const uint64_t from = rng() % (kSourceBytes - size + 1);
      std::memcpy(q.scratch_shadow.data() + offset, t.source.data() + from, size);
      Count(q, [&](uint64_t* s) {
        return tern_queue_copy_h2d(q.queue, q.scratch, offset, t.source.data() + from, size, s);
      });
      break;
    }
    case 2: {
      const uint64_t to = 4 * (rng() % ((kScratchBytes - size) / 4 + 1));
      std::memcpy(q.sink_shadow.data() + to, q.scratch_shadow.data() + offset, size);
      Count(q, [&](uint64_t* s) {
        return tern_queue_copy_d2h(q.queue, q.sink.data() + to, q.scratch, offset, size, s);
      });
      break;
    }
    case 3: {
      const uint32_t pattern = static_cast<uint32_t>(rng());
      for (uint64_t i = 0; i < size; i += 4) {
        std::memcpy(q.scratch_shadow.data() + offset + i, &pattern, 4);
      }
      Count(q, [&](uint64_t* s) {
        return tern_queue_fill(q.queue, q.scratch, offset, size, pattern, s);
      });
      break;
    }
    case 4:
    case 5:
      SubmitCallback(t, q, nullptr, 0);
      break;
    case 6: {
      tern_event_t event = t.published[rng() % kPublishedEvents];
      Count(q, [&](uint64_t* s) { return tern_queue_record_event(q.queue, event, s); });
      break;
    }
    case 7: {
      // Any thread's published event: its queues run on other cores and
      // devices. Events only point at commands already submitted, so waits
      // never form a cycle.
      tern_event_t event = all[rng() % kThreads].published[rng() % kPublishedEvents];
      Count(q, [&](uint64_t* s) { return tern_queue_wait_event(q.queue, event, s); });
      break;
    }
  }
  return 1;
}

void RunThread(int index, ThreadState* all, uint64_t commands) {
  ThreadState& t = all[index];
  std::mt19937_64 rng(0x5eed0000u + static_cast<uint64_t>(index));
  uint64_t total = 0;
  while (total < commands) {
    total += (rng() % 8 == 0) ? SubmitChain(t) : SubmitRandom(t, all, rng);
    // Keep each queue within a window of its engine so that memory for
    // pending commands stays bounded.
    for (QueueState& q : t.queues) {
      if (q.submitted >= q.next_window_check) {
        q.next_window_check = q.submitted + 1024;
        const tern_status_t status =
            tern_queue_wait_sequence(q.queue, q.submitted - kWindow, kTimeoutNs);
        if (status != TERN_OK) ADD_FAILURE() << "window wait: " << LastError();
      }
    }
  }
  for (QueueState& q : t.queues) {
    const tern_status_t status = tern_queue_synchronize(q.queue, kTimeoutNs);
    if (status != TERN_OK) ADD_FAILURE() << "thread " << index << " sync: " << LastError();
  }
}

TEST_F(StressTest, MixedCommandsAcrossThreadsQueuesAndDevices) {
  const uint64_t commands = CommandsPerThread();
  auto threads_state = std::make_unique<ThreadState[]>(kThreads);
  ThreadState* all = threads_state.get();
  std::vector<int> queues_per_core(kCores, 0);
  for (int i = 0; i < kThreads; ++i) {
    ThreadState& t = all[i];
    std::mt19937_64 rng(0xda7a0000u + static_cast<uint64_t>(i));
    t.source.resize(kSourceBytes);
    for (auto& byte : t.source) byte = static_cast<uint8_t>(rng());
    for (int p = 0; p < kChainPatterns; ++p) {
      std::vector<uint8_t> block(kChainBytes);
      for (auto& byte : block) byte = static_cast<uint8_t>(rng());
      t.pattern_sums.push_back(Checksum(block.data(), block.size()));
      t.patterns.push_back(std::move(block));
    }
    for (int k = 0; k < kQueuesPerThread; ++k) {
      QueueState& q = t.queues[k];
      q.core = (i + k) % kCores;  // thread i's queue k: every thread spans all 4 cores
      ++queues_per_core[q.core];
      q.queue = CreateQueue(q.core, "t" + std::to_string(i) + "q" + std::to_string(k));
      q.scratch = Alloc(q.core, kScratchBytes);
      ASSERT_EQ(tern_buffer_write(q.scratch, 0, q.scratch_shadow.data(), kScratchBytes), TERN_OK);
      q.log.reserve(commands / 8);
    }
    // Chain stages: stage 0 next to queue 0, stage 1 next to queue 1, stage 2
    // next to queue 3; queue 2 shares a device with queue 1 or queue 3 (any
    // three consecutive cores of 0..3 do), so every link is legal.
    for (ChainSlot& slot : t.slots) {
      slot.stage[0] = Alloc(t.queues[0].core, kChainBytes);
      slot.stage[1] = Alloc(t.queues[1].core, kChainBytes);
      slot.stage[2] = Alloc(t.queues[3].core, kChainBytes);
      for (tern_event_t& event : slot.step) event = CreateEvent();
      slot.done = CreateEvent();
    }
    for (tern_event_t& event : t.published) event = CreateEvent();
  }
  for (int c = 0; c < kCores; ++c) EXPECT_EQ(queues_per_core[c], kThreads) << "core " << c;
  ASSERT_FALSE(HasFailure());

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(RunThread, i, all, commands);
  for (auto& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  uint64_t grand_total = 0;
  for (int i = 0; i < kThreads; ++i) {
    ThreadState& t = all[i];
    uint64_t thread_total = 0;
    for (int k = 0; k < kQueuesPerThread; ++k) {
      QueueState& q = t.queues[k];
      SCOPED_TRACE("thread " + std::to_string(i) + " queue " + std::to_string(k));
      thread_total += q.submitted;
      EXPECT_EQ(q.failures, 0u);
      // Every command completed, and without error.
      uint64_t completed = 0;
      EXPECT_EQ(tern_queue_query(q.queue, &completed), TERN_OK) << LastError();
      EXPECT_EQ(completed, q.submitted);
      // Callbacks: each exactly once, in submission order.
      EXPECT_EQ(q.log.size(), q.expected_log.size());
      for (size_t n = 1; n < q.log.size(); ++n) {
        ASSERT_GT(q.log[n], q.log[n - 1]) << "callback log is not strictly increasing at " << n;
      }
      EXPECT_TRUE(q.log == q.expected_log) << "callback log has gaps, repeats or strangers";
      // The queue's memory holds what its commands, in order, imply.
      std::vector<uint8_t> scratch(kScratchBytes);
      EXPECT_EQ(tern_buffer_read(q.scratch, 0, scratch.data(), kScratchBytes), TERN_OK);
      EXPECT_TRUE(scratch == q.scratch_shadow) << "device scratch differs from its shadow";
      EXPECT_TRUE(q.sink == q.sink_shadow) << "host sink differs from its shadow";
    }
    EXPECT_GE(thread_total, commands) << "thread " << i;
    EXPECT_GT(t.chains, 0u);
    EXPECT_EQ(t.corrupt.load(), 0u) << "thread " << i << ": chained data arrived corrupted";
    EXPECT_EQ(t.bad_status.load(), 0u) << "thread " << i << ": a callback saw an error";
    grand_total += thread_total;
  }
  // Each chain's last block is also where it should be at the end.
  for (int i = 0; i < kThreads; ++i) {
    ThreadState& t = all[i];
    for (uint64_t c = t.chains > kChainSlots ? t.chains - kChainSlots : 0; c < t.chains; ++c) {
      const ChainSlot& slot = t.slots[c % kChainSlots];
      EXPECT_TRUE(slot.landing == t.patterns[c % kChainPatterns])
          << "thread " << i << " chain " << c;
    }
  }
  RecordProperty("commands", static_cast<int>(grand_total));
  RecordProperty("milliseconds", static_cast<int>(seconds * 1000));
  std::printf("%llu commands on %d queues from %d threads in %.2f s (%.0f commands/s)\n",
              static_cast<unsigned long long>(grand_total), kThreads * kQueuesPerThread, kThreads,
              seconds, static_cast<double>(grand_total) / seconds);
}

// Several submitters, one queue: the queue orders commands as their calls
// are, and runs callbacks in that order.
struct SharedEntry {
  std::vector<uint32_t>* log = nullptr;  // appended only by the queue's engine
  uint32_t id = 0;
  uint64_t sequence = 0;  // written by the submitter after its call returns
};

void SharedCallback(void* user_data, tern_status_t status) {
  auto* entry = static_cast<SharedEntry*>(user_data);
  entry->log->push_back(status == TERN_OK ? entry->id : UINT32_MAX);
}

TEST_F(StressTest, ConcurrentSubmittersToOneQueue) {
  constexpr int kSubmitters = 4;
  const uint64_t per_thread = std::max<uint64_t>(1000, CommandsPerThread() / 4);
  tern_queue_t queue = CreateQueue(0, "shared");
  std::vector<uint32_t> log;
  log.reserve(kSubmitters * per_thread);
  std::vector<SharedEntry> entries(kSubmitters * per_thread);
  for (uint32_t id = 0; id < entries.size(); ++id) {
    entries[id].log = &log;
    entries[id].id = id;
  }
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> nops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kSubmitters; ++t) {
    threads.emplace_back([&, t] {
      uint64_t last = 0;
      for (uint64_t i = 0; i < per_thread; ++i) {
        SharedEntry& entry = entries[t * per_thread + i];
        uint64_t sequence = 0;
        if (tern_queue_host_callback(queue, SharedCallback, &entry, &sequence) != TERN_OK ||
            sequence <= last) {
          failures.fetch_add(1);
        }
        entry.sequence = last = sequence;
        if (i % 3 == 0) {  // interleave other commands
          if (tern_queue_nop(queue, &sequence) != TERN_OK || sequence <= last)
            failures.fetch_add(1);
          last = sequence;
          nops.fetch_add(1);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(tern_queue_synchronize(queue, kTimeoutNs), TERN_OK) << LastError();
  EXPECT_EQ(failures.load(), 0u) << "a submission failed or a thread saw its sequence go back";

  uint64_t completed = 0;
  EXPECT_EQ(tern_queue_query(queue, &completed), TERN_OK);
  EXPECT_EQ(completed, entries.size() + nops.load());
  ASSERT_EQ(log.size(), entries.size()) << "every callback runs exactly once";
  std::vector<bool> seen(entries.size(), false);
  uint64_t previous = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    ASSERT_NE(log[i], UINT32_MAX) << "callback " << i << " saw an error";
    ASSERT_LT(log[i], entries.size());
    ASSERT_FALSE(seen[log[i]]) << "callback " << log[i] << " ran twice";
    seen[log[i]] = true;
    const uint64_t sequence = entries[log[i]].sequence;
    ASSERT_GT(sequence, previous) << "callback at position " << i << " ran out of sequence order";
    previous = sequence;
  }
}

}  // namespace
