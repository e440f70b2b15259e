// Collectives with every rank in this process (tern_comm_init_all, one
// thread per rank): the exact-check matrix for 1 to 4 ranks, split, info,
// ordering with other queue commands and events, groups, and argument
// errors.
#include <tern/tern.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "comm_test_util.h"
#include "common/sanitizers.h"

namespace tern_test {
namespace {

class CommInProcessTest : public CommFixture {
 protected:
  void RunMatrixOn(uint32_t n, const MatrixOptions& options) {
    InitAll(n);
    std::vector<MatrixResult> results(n);
    OnRanks(n, [&](uint32_t r) {
      results[r] = RunMatrix(comms_[r], queues_[r], devices_[(r / 2) % 2], r, n, options);
    });
    for (uint32_t r = 0; r < n; ++r) {
      EXPECT_TRUE(results[r].failures.empty()) << results[r].failures;
      EXPECT_GT(results[r].checks, 100u);
    }
  }
};

MatrixOptions InProcessOptions() {
  MatrixOptions options;
#if TERN_UNDER_TSAN
  // ThreadSanitizer is ~10x slower: fewer dtypes, smaller counts.
  options.dtypes = {TERN_DTYPE_F32, TERN_DTYPE_BF16, TERN_DTYPE_I8};
  options.counts = {1, 7};
  options.large_counts = {20001};
#endif
  return options;
}

TEST_F(CommInProcessTest, MatrixOneRank) { RunMatrixOn(1, InProcessOptions()); }
TEST_F(CommInProcessTest, MatrixTwoRanks) { RunMatrixOn(2, InProcessOptions()); }
TEST_F(CommInProcessTest, MatrixThreeRanks) { RunMatrixOn(3, InProcessOptions()); }
TEST_F(CommInProcessTest, MatrixFourRanks) { RunMatrixOn(4, InProcessOptions()); }
// Without direct access large operations take the ring, Rabenseifner and
// chain algorithms through the local channel; small chunks add rounds.
TEST_F(CommInProcessTest, MatrixThreeRanksWithoutDirectAccess) {
  setenv("TERN_COMM_DIRECT", "0", 1);
  setenv("TERN_COMM_CHUNK", "8K", 1);
  RunMatrixOn(3, InProcessOptions());
  unsetenv("TERN_COMM_DIRECT");
  unsetenv("TERN_COMM_CHUNK");
}
// Direct access from the smallest sizes on: every dtype takes that path.
TEST_F(CommInProcessTest, MatrixThreeRanksDirectEverywhere) {
  setenv("TERN_COMM_DIRECT_MIN", "0", 1);
  RunMatrixOn(3, InProcessOptions());
  unsetenv("TERN_COMM_DIRECT_MIN");
}

TEST_F(CommInProcessTest, InfoDescribesTheRanks) {
  InitAll(3);
  for (uint32_t r = 0; r < 3; ++r) {
    tern_comm_info_t info;
    std::memset(&info, 0xcd, sizeof(info));
    info.struct_size = sizeof(info);
    COMM_ASSERT_OK(tern_comm_get_info(comms_[r], &info));
    EXPECT_EQ(r, info.rank);
    EXPECT_EQ(3u, info.size);
    EXPECT_EQ(r, info.local_rank);
    EXPECT_EQ(3u, info.local_size);
    EXPECT_EQ(1u, info.node_count);
    EXPECT_EQ(cores_[r], info.core);
    EXPECT_EQ(devices_[(r / 2) % 2], info.device);
    EXPECT_STREQ("local", info.transport);
    tern_status_t async = -1;
    COMM_ASSERT_OK(tern_comm_get_async_error(comms_[r], &async));
    EXPECT_EQ(TERN_OK, async);
  }
}

// Split 4 ranks by parity, ordered by descending key: each half all-reduces
// on its own; a NOCOLOR rank gets NULL.
TEST_F(CommInProcessTest, SplitByColorAndKey) {
  InitAll(4);
  std::vector<tern_comm_t> halves(4, nullptr);
  std::vector<tern_status_t> status(4, TERN_OK);
  OnRanks(4, [&](uint32_t r) {
    const int32_t color = r == 3 ? TERN_COMM_SPLIT_NOCOLOR : static_cast<int32_t>(r % 2);
    status[r] = tern_comm_split(comms_[r], color, -static_cast<int32_t>(r), nullptr, &halves[r]);
  });
  for (uint32_t r = 0; r < 4; ++r) ASSERT_EQ(TERN_OK, status[r]) << r;
  EXPECT_EQ(nullptr, halves[3]);
  // Evens {0, 2} in descending key order: rank 2 is new rank 0.
  const uint32_t expected_rank[3] = {1, 0, 0};
  const uint32_t expected_size[3] = {2, 1, 2};
  for (uint32_t r = 0; r < 3; ++r) {
    tern_comm_info_t info = {};
    info.struct_size = sizeof(info);
    COMM_ASSERT_OK(tern_comm_get_info(halves[r], &info));
    EXPECT_EQ(expected_rank[r], info.rank) << r;
    EXPECT_EQ(expected_size[r], info.size) << r;
    EXPECT_EQ(cores_[r], info.core);
  }
  std::vector<tern_buffer_t> buffers(3);
  for (uint32_t r = 0; r < 3; ++r) {
    buffers[r] = Alloc(devices_[(r / 2) % 2], 64);
    const int32_t value[4] = {static_cast<int32_t>(r + 1), 10, 20, 30};
    COMM_ASSERT_OK(tern_buffer_write(buffers[r], 0, value, sizeof(value)));
    COMM_ASSERT_OK(tern_comm_all_reduce(halves[r], buffers[r], 0, buffers[r], 0, 4, TERN_DTYPE_I32,
                                        TERN_COMM_SUM, queues_[r]));
  }
  for (uint32_t r = 0; r < 3; ++r)
    COMM_ASSERT_OK(tern_queue_synchronize(queues_[r], TERN_TIMEOUT_INFINITE));
  const int32_t want[3][4] = {{1 + 3, 20, 40, 60}, {2, 10, 20, 30}, {1 + 3, 20, 40, 60}};
  for (uint32_t r = 0; r < 3; ++r) {
    int32_t got[4];
    COMM_ASSERT_OK(tern_buffer_read(buffers[r], 0, got, sizeof(got)));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(want[r][i], got[i]) << "rank " << r << " element " << i;
    COMM_EXPECT_OK(tern_comm_destroy(halves[r]));
    tern_buffer_free(buffers[r]);
  }
}

// A collective is one more command of its queue: a copy before it feeds
// it, a copy after it sees its result, and another queue can wait for it
// through an event; nothing is synchronized in between.
TEST_F(CommInProcessTest, OrderedWithCopiesAndEvents) {
  InitAll(2);
  constexpr uint64_t kCount = 50000;
  std::vector<std::vector<float>> input(2, std::vector<float>(kCount));
  std::vector<std::vector<float>> output(2, std::vector<float>(kCount, -1.0f));
  std::vector<std::vector<float>> copied(2, std::vector<float>(kCount, -1.0f));
  tern_buffer_t buffer[2], other[2];
  tern_queue_t side[2];
  tern_event_t done[2];
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint64_t i = 0; i < kCount; ++i) input[r][i] = static_cast<float>((i % 100) * (r + 1));
    buffer[r] = Alloc(devices_[0], kCount * 4);
    other[r] = Alloc(devices_[0], kCount * 4);
    COMM_ASSERT_OK(tern_queue_create(cores_[r], nullptr, &side[r]));
    COMM_ASSERT_OK(tern_event_create(&done[r]));
  }
  OnRanks(2, [&](uint32_t r) {
    COMM_ASSERT_OK(
        tern_queue_copy_h2d(queues_[r], buffer[r], 0, input[r].data(), kCount * 4, nullptr));
    COMM_ASSERT_OK(tern_comm_all_reduce(comms_[r], buffer[r], 0, buffer[r], 0, kCount,
                                        TERN_DTYPE_F32, TERN_COMM_SUM, queues_[r]));
    COMM_ASSERT_OK(tern_queue_record_event(queues_[r], done[r], nullptr));
    COMM_ASSERT_OK(
        tern_queue_copy_d2h(queues_[r], output[r].data(), buffer[r], 0, kCount * 4, nullptr));
    // The side queue copies the result once the event says it is there.
    COMM_ASSERT_OK(tern_queue_wait_event(side[r], done[r], nullptr));
    COMM_ASSERT_OK(tern_queue_copy_d2d(side[r], other[r], 0, buffer[r], 0, kCount * 4, nullptr));
    COMM_ASSERT_OK(
        tern_queue_copy_d2h(side[r], copied[r].data(), other[r], 0, kCount * 4, nullptr));
    COMM_ASSERT_OK(tern_queue_synchronize(queues_[r], TERN_TIMEOUT_INFINITE));
    COMM_ASSERT_OK(tern_queue_synchronize(side[r], TERN_TIMEOUT_INFINITE));
  });
  for (uint32_t r = 0; r < 2; ++r) {
    for (uint64_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>((i % 100) * 3);
      ASSERT_EQ(want, output[r][i]) << "rank " << r << " element " << i;
      ASSERT_EQ(want, copied[r][i]) << "rank " << r << " element " << i;
    }
    tern_event_destroy(done[r]);
    tern_queue_destroy(side[r]);
    tern_buffer_free(buffer[r]);
    tern_buffer_free(other[r]);
  }
}

// Many operations in flight on one queue before a single synchronize.
TEST_F(CommInProcessTest, ManyOperationsQueuedBackToBack) {
  InitAll(3);
  constexpr int kOps = 200;
  tern_buffer_t buffer[3];
  for (uint32_t r = 0; r < 3; ++r) {
    buffer[r] = Alloc(devices_[(r / 2) % 2], 256);
    const int64_t one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    COMM_ASSERT_OK(tern_buffer_write(buffer[r], 0, one, sizeof(one)));
  }
  OnRanks(3, [&](uint32_t r) {
    for (int k = 0; k < kOps; ++k) {
      COMM_ASSERT_OK(tern_comm_all_reduce(comms_[r], buffer[r], 0, buffer[r], 0, 8, TERN_DTYPE_I64,
                                          k % 2 ? TERN_COMM_MAX : TERN_COMM_SUM, queues_[r]));
      if (k % 50 == 0) COMM_ASSERT_OK(tern_comm_barrier(comms_[r], queues_[r]));
    }
    COMM_ASSERT_OK(tern_queue_synchronize(queues_[r], TERN_TIMEOUT_INFINITE));
  });
  // Sums multiply by 3, maxes keep: 3^(kOps/2), wrapping around as int64 sums do.
  uint64_t wrapped = 1;
  for (int k = 0; k < kOps / 2; ++k) wrapped *= 3;
  const int64_t want = static_cast<int64_t>(wrapped);
  for (uint32_t r = 0; r < 3; ++r) {
    int64_t got[8];
    COMM_ASSERT_OK(tern_buffer_read(buffer[r], 0, got, sizeof(got)));
    for (int i = 0; i < 8; ++i) EXPECT_EQ(want, got[i]);
    tern_buffer_free(buffer[r]);
  }
}

// A receive from any source takes the first message of whichever rank
// sends, and the receives enqueued after it take their place in each peer's
// order: rank 1 sends A then B; rank 0 receives from any source, then from
// rank 1, and must get A then B (numbering the later receive when it is
// enqueued would have matched it with A).
TEST_F(CommInProcessTest, ReceiveFromAnySourceThenFromThePeer) {
  InitAll(3);
  tern_buffer_t buffer[3];
  for (uint32_t r = 0; r < 3; ++r) buffer[r] = Alloc(devices_[(r / 2) % 2], 64);
  const int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  COMM_ASSERT_OK(tern_buffer_write(buffer[1], 0, a, sizeof(a)));
  COMM_ASSERT_OK(tern_buffer_write(buffer[1], 16, b, sizeof(b)));
  uint32_t sender = UINT32_MAX;
  OnRanks(3, [&](uint32_t r) {
    if (r == 0) {
      COMM_ASSERT_OK(
          tern_comm_recv_any(comms_[0], buffer[0], 0, 4, TERN_DTYPE_I32, &sender, queues_[0]));
      COMM_ASSERT_OK(tern_comm_recv(comms_[0], buffer[0], 16, 4, TERN_DTYPE_I32, 1, queues_[0]));
    } else if (r == 1) {
      COMM_ASSERT_OK(tern_comm_send(comms_[1], buffer[1], 0, 4, TERN_DTYPE_I32, 0, queues_[1]));
      COMM_ASSERT_OK(tern_comm_send(comms_[1], buffer[1], 16, 4, TERN_DTYPE_I32, 0, queues_[1]));
    }
    COMM_ASSERT_OK(tern_queue_synchronize(queues_[r], TERN_TIMEOUT_INFINITE));
  });
  EXPECT_EQ(1u, sender);
  int32_t got[8];
  COMM_ASSERT_OK(tern_buffer_read(buffer[0], 0, got, sizeof(got)));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i], got[i]);
    EXPECT_EQ(b[i], got[4 + i]);
  }
  // Afterwards receives are numbered at enqueue again, and still match.
  OnRanks(3, [&](uint32_t r) {
    if (r == 0) {
      COMM_ASSERT_OK(tern_comm_recv(comms_[0], buffer[0], 32, 4, TERN_DTYPE_I32, 2, queues_[0]));
    } else if (r == 2) {
      COMM_ASSERT_OK(tern_buffer_write(buffer[2], 0, b, sizeof(b)));
      COMM_ASSERT_OK(tern_comm_send(comms_[2], buffer[2], 0, 4, TERN_DTYPE_I32, 0, queues_[2]));
    }
    COMM_ASSERT_OK(tern_queue_synchronize(queues_[r], TERN_TIMEOUT_INFINITE));
  });
  COMM_ASSERT_OK(tern_buffer_read(buffer[0], 32, got, 16));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b[i], got[i]);
  for (tern_buffer_t buf : buffer) tern_buffer_free(buf);
}

// Nobody sends: the receive fails after the communicator's timeout with a
// message that says so, and the communicator stays usable.
TEST_F(CommInProcessTest, ReceiveFromAnySourceTimesOut) {
  tern_comm_config_t config = {};
  config.struct_size = sizeof(config);
  config.timeout_ns = 500ull * 1000 * 1000;
  InitAll(2, &config);
  tern_buffer_t buffer = Alloc(devices_[0], 64);
  uint32_t sender = UINT32_MAX;
  COMM_ASSERT_OK(tern_comm_recv_any(comms_[0], buffer, 0, 4, TERN_DTYPE_F32, &sender, queues_[0]));
  const tern_status_t status = tern_queue_synchronize(queues_[0], TERN_TIMEOUT_INFINITE);
  EXPECT_EQ(TERN_ERROR_COMM_TIMEOUT, status) << LastError(status);
  EXPECT_NE(std::string::npos, std::string(tern_last_error_message()).find("from any rank"))
      << tern_last_error_message();
  EXPECT_EQ(UINT32_MAX, sender);
  tern_queue_clear_error(queues_[0]);
  tern_buffer_free(buffer);
}

// Bad arguments: a clear code and a message naming the problem; nothing
// is enqueued (the queue stays usable).
TEST_F(CommInProcessTest, ArgumentErrors) {
  InitAll(2);
  tern_buffer_t small = Alloc(devices_[0], 64);
  tern_buffer_t other_device = Alloc(devices_[1], 64);
  tern_comm_t comm = comms_[0];
  tern_queue_t queue = queues_[0];
  struct Case {
    const char* name;
    tern_status_t status;
    tern_status_t want;
    const char* needle;
  };
  auto check = [](const char* name, tern_status_t got, tern_status_t want, const char* needle) {
    EXPECT_EQ(want, got) << name << ": " << LastError(got);
    EXPECT_NE(std::string::npos, std::string(tern_last_error_message()).find(needle))
        << name << ": " << tern_last_error_message();
  };
  check("null comm", tern_comm_barrier(nullptr, queue), TERN_ERROR_INVALID_HANDLE,
        "communicator handle");
  check("wrong core", tern_comm_barrier(comm, queues_[1]), TERN_ERROR_INVALID_ARGUMENT,
        "queue of its core");
  check("bool dtype",
        tern_comm_all_reduce(comm, small, 0, small, 0, 4, TERN_DTYPE_BOOL, TERN_COMM_SUM, queue),
        TERN_ERROR_INVALID_ARGUMENT, "not supported by collectives");
  check("bad dtype",
        tern_comm_all_reduce(comm, small, 0, small, 0, 4, static_cast<tern_dtype_t>(99),
                             TERN_COMM_SUM, queue),
        TERN_ERROR_INVALID_ARGUMENT, "dtype 99");
  check("bad redop",
        tern_comm_all_reduce(comm, small, 0, small, 0, 4, TERN_DTYPE_F32,
                             static_cast<tern_comm_redop_t>(7), queue),
        TERN_ERROR_INVALID_ARGUMENT, "reduction 7");
  check("too large",
        tern_comm_all_reduce(comm, small, 0, small, 0, 17, TERN_DTYPE_F32, TERN_COMM_SUM, queue),
        TERN_ERROR_OUT_OF_RANGE, "does not fit");
  check("count overflows",
        tern_comm_all_reduce(comm, small, 0, small, 0, UINT64_MAX / 2, TERN_DTYPE_F32,
                             TERN_COMM_SUM, queue),
        TERN_ERROR_INVALID_ARGUMENT, "is too large");
  check("other device",
        tern_comm_all_reduce(comm, other_device, 0, other_device, 0, 4, TERN_DTYPE_F32,
                             TERN_COMM_SUM, queue),
        TERN_ERROR_INVALID_ARGUMENT, "lives on device 1");
  check("overlap",
        tern_comm_all_reduce(comm, small, 0, small, 4, 4, TERN_DTYPE_F32, TERN_COMM_SUM, queue),
        TERN_ERROR_INVALID_ARGUMENT, "overlap");
  check("root", tern_comm_broadcast(comm, small, 0, small, 0, 4, TERN_DTYPE_F32, 2, queue),
        TERN_ERROR_INVALID_ARGUMENT, "root 2 is out of range");
  check("a2a in place", tern_comm_all_to_all(comm, small, 0, small, 0, 2, TERN_DTYPE_F32, queue),
        TERN_ERROR_INVALID_ARGUMENT, "cannot run in place");
  check("all-gather misplaced",
        tern_comm_all_gather(comm, small, 4, small, 0, 2, TERN_DTYPE_F32, queue),
        TERN_ERROR_INVALID_ARGUMENT, "this rank's block");
  check("send to self", tern_comm_send(comm, small, 0, 4, TERN_DTYPE_F32, 0, queue),
        TERN_ERROR_INVALID_ARGUMENT, "this rank itself");
  check("peer", tern_comm_recv(comm, small, 0, 4, TERN_DTYPE_F32, 5, queue),
        TERN_ERROR_INVALID_ARGUMENT, "peer 5 is out of range");
  check("null buffer",
        tern_comm_all_reduce(comm, nullptr, 0, small, 0, 4, TERN_DTYPE_F32, TERN_COMM_SUM, queue),
        TERN_ERROR_INVALID_HANDLE, "send");
  uint32_t sender = 0;
  check("any source, no count",
        tern_comm_recv_any(comm, small, 0, 0, TERN_DTYPE_F32, &sender, queue),
        TERN_ERROR_INVALID_ARGUMENT, "count is 0");
  check("any source, no out_peer",
        tern_comm_recv_any(comm, small, 0, 4, TERN_DTYPE_F32, nullptr, queue),
        TERN_ERROR_INVALID_ARGUMENT, "out_peer is NULL");
  COMM_ASSERT_OK(tern_comm_group_start());
  check("collective in group", tern_comm_barrier(comm, queue), TERN_ERROR_FAILED_PRECONDITION,
        "group");
  check("any source in group",
        tern_comm_recv_any(comm, small, 0, 4, TERN_DTYPE_F32, &sender, queue),
        TERN_ERROR_FAILED_PRECONDITION, "group");
  COMM_ASSERT_OK(tern_comm_group_end());
  check("group end", tern_comm_group_end(), TERN_ERROR_FAILED_PRECONDITION,
        "without tern_comm_group_start");
  tern_comm_config_t config = {};
  config.struct_size = 4;
  tern_comm_t split = nullptr;
  check("config size", tern_comm_split(comm, 0, 0, &config, &split), TERN_ERROR_INVALID_ARGUMENT,
        "struct_size");
  tern_comm_info_t info = {};
  info.struct_size = 8;
  check("info size", tern_comm_get_info(comm, &info), TERN_ERROR_INVALID_ARGUMENT, "struct_size");
  tern_comm_unique_id_t garbage;
  std::memset(&garbage, 0x42, sizeof(garbage));
  tern_comm_t out = reinterpret_cast<tern_comm_t>(1);
  check("bad id", tern_comm_init_rank(cores_[2], 2, &garbage, 0, nullptr, &out),
        TERN_ERROR_INVALID_ARGUMENT, "unique id");
  EXPECT_EQ(nullptr, out);
  check("rank", tern_comm_init_rank(cores_[2], 2, &garbage, 2, nullptr, &out),
        TERN_ERROR_INVALID_ARGUMENT, "rank 2 is out of range");
  const tern_core_t twice[2] = {cores_[2], cores_[2]};
  tern_comm_t pair[2];
  check("same core", tern_comm_init_all(twice, 2, nullptr, pair), TERN_ERROR_INVALID_ARGUMENT,
        "same core");
  unsetenv("TERN_COMM_ID");
  unsetenv("MASTER_ADDR");
  check("env", tern_comm_init_from_env(cores_[2], nullptr, &out), TERN_ERROR_INVALID_ARGUMENT,
        "TERN_COMM_ID");
  // Nothing was enqueued: the queue is clean and count 0 is a no-op.
  COMM_EXPECT_OK(
      tern_comm_all_reduce(comm, small, 0, small, 0, 0, TERN_DTYPE_F32, TERN_COMM_SUM, queue));
  COMM_EXPECT_OK(tern_queue_synchronize(queue, TERN_TIMEOUT_INFINITE));
  tern_status_t async = -1;
  COMM_EXPECT_OK(tern_comm_get_async_error(comm, &async));
  EXPECT_EQ(TERN_OK, async);
  tern_buffer_free(small);
  tern_buffer_free(other_device);
}

}  // namespace
}  // namespace tern_test
