// Tests of the sim node registry with real processes: children are forked,
// use only the registry, report over a pipe and _exit.
#include "driver_shim/sim/node_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace tern::sim {
namespace {

using Role = NodeRegistry::Role;
using Topology = NodeRegistry::Topology;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr char kChildName[] = "nr-child";

// The parent's side of a forked child. The child runs `body`, which reports
// a status byte with Ready() and may then wait for the parent's go-ahead.
class ChildProcess {
 public:
  class Channel {
   public:
    Channel(int to_parent, int from_parent) : to_parent_(to_parent), from_parent_(from_parent) {}
    void Ready(uint8_t code) { (void)!write(to_parent_, &code, 1); }
    void WaitForParent() {
      uint8_t byte;
      (void)!read(from_parent_, &byte, 1);  // returns on a byte or when the parent closes
    }

   private:
    int to_parent_;
    int from_parent_;
  };

  explicit ChildProcess(const std::function<int(Channel&)>& body) {
    int up[2], down[2];
    if (pipe2(up, O_CLOEXEC) != 0 || pipe2(down, O_CLOEXEC) != 0) std::abort();
    pid_ = fork();
    if (pid_ < 0) std::abort();
    if (pid_ == 0) {
      prctl(PR_SET_NAME, kChildName);
      close(up[0]);
      close(down[1]);
      Channel channel(up[1], down[0]);
      _exit(body(channel));
    }
    close(up[1]);
    close(down[0]);
    from_child_ = up[0];
    to_child_ = down[1];
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    close(from_child_);
    close(to_child_);
  }

  pid_t pid() const { return pid_; }

  // The child's Ready() code, or -1 if it exited or stayed silent for 10 s.
  int WaitReady() {
    struct pollfd pfd = {from_child_, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1) return -1;
    uint8_t code;
    return read(from_child_, &code, 1) == 1 ? code : -1;
  }
  void Release() {
    uint8_t byte = 0;
    (void)!write(to_child_, &byte, 1);
  }
  // Waits for the exit; returns the exit code, or 128 + signal.
  int Wait() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void Kill() { kill(pid_, SIGKILL); }

 private:
  pid_t pid_ = -1;
  int from_child_ = -1;
  int to_child_ = -1;
  bool reaped_ = false;
};

class NodeRegistryTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& node : nodes_) EXPECT_TRUE(NodeRegistry::RemoveNode(node).ok());
  }

  std::string NewNode() {
    static std::atomic<int> counter{0};
    nodes_.push_back("test-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    return nodes_.back();
  }

  static std::unique_ptr<NodeRegistry> MustOpen(const std::string& node, const Topology& topology,
                                                Role role = Role::kParticipant) {
    std::unique_ptr<NodeRegistry> registry;
    Status status = NodeRegistry::Open(node, topology, role, &registry);
    EXPECT_TRUE(status.ok()) << status.message();
    return registry;
  }

  std::vector<std::string> nodes_;
};

const Topology kSmall{2, 4, 4 * kGiB};

TEST_F(NodeRegistryTest, RejectsBadArguments) {
  std::unique_ptr<NodeRegistry> registry;
  for (const std::string& name :
       std::vector<std::string>{"", "a/b", "x y", "../etc", std::string(65, 'n')}) {
    Status status = NodeRegistry::Open(name, kSmall, Role::kParticipant, &registry);
    EXPECT_EQ(status.code(), TERN_ERROR_INVALID_ARGUMENT) << name;
    EXPECT_NE(status.message().find("TERN_SIM_NODE"), std::string::npos);
  }
  const std::string node = NewNode();
  for (const Topology& topology :
       {Topology{0, 1, kGiB}, Topology{17, 1, kGiB}, Topology{1, 0, kGiB}, Topology{1, 17, kGiB},
        Topology{1, 1, 0}}) {
    Status status = NodeRegistry::Open(node, topology, Role::kParticipant, &registry);
    EXPECT_EQ(status.code(), TERN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(status.message().find("TERN_SIM_TOPOLOGY"), std::string::npos);
  }
  EXPECT_EQ(NodeRegistry::Open(node, kSmall, Role::kParticipant, nullptr).code(),
            TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(NodeRegistry::RemoveNode("a/b").code(), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(NodeRegistry::RemoveNode(node).ok());  // missing file: fine

  auto participant = MustOpen(node, kSmall);
  ASSERT_NE(participant, nullptr);
  EXPECT_EQ(participant->AcquireCore(2, 0).code(), TERN_ERROR_OUT_OF_RANGE);
  EXPECT_EQ(participant->AcquireCore(0, 4).code(), TERN_ERROR_OUT_OF_RANGE);
  EXPECT_EQ(participant->ReserveMemory(2, 1, TERN_MEMORY_TENSORS).code(), TERN_ERROR_OUT_OF_RANGE);
  EXPECT_EQ(participant->ReserveMemory(0, 1, TERN_MEMORY_CATEGORY_COUNT).code(),
            TERN_ERROR_INVALID_ARGUMENT);
  tern_device_telemetry_t telemetry;
  EXPECT_EQ(participant->Snapshot(2, &telemetry).code(), TERN_ERROR_OUT_OF_RANGE);
  EXPECT_EQ(participant->Snapshot(0, nullptr).code(), TERN_ERROR_INVALID_ARGUMENT);
}

TEST_F(NodeRegistryTest, CoreExclusivityAcrossProcesses) {
  const std::string node = NewNode();
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->AcquireCore(0, 1).ok()) return 2;
    channel.Ready(0);
    channel.WaitForParent();
    registry.reset();  // a clean exit releases the core
    return 0;
  });
  ASSERT_EQ(child.WaitReady(), 0);

  auto registry = MustOpen(node, kSmall);
  ASSERT_NE(registry, nullptr);
  Status busy = registry->AcquireCore(0, 1);
  EXPECT_EQ(busy.code(), TERN_ERROR_BUSY);
  EXPECT_NE(busy.message().find("core 1 of device 0"), std::string::npos) << busy.message();
  EXPECT_NE(busy.message().find("process " + std::to_string(child.pid()) + " (" + kChildName + ")"),
            std::string::npos)
      << busy.message();
  EXPECT_NE(busy.message().find("TERN_VISIBLE_CORES"), std::string::npos);

  // Other cores are free; the same core on another device too.
  EXPECT_TRUE(registry->AcquireCore(0, 0).ok());
  EXPECT_TRUE(registry->AcquireCore(1, 1).ok());
  // Our own core again: the kernel would say yes (same file description).
  EXPECT_EQ(registry->AcquireCore(0, 0).code(), TERN_ERROR_FAILED_PRECONDITION);

  child.Release();
  EXPECT_EQ(child.Wait(), 0);
  EXPECT_TRUE(registry->AcquireCore(0, 1).ok());
}

TEST_F(NodeRegistryTest, TwoRegistriesInOneProcessAreExclusive) {
  const std::string node = NewNode();
  auto first = MustOpen(node, kSmall);
  auto second = MustOpen(node, kSmall);
  ASSERT_TRUE(first && second);
  ASSERT_TRUE(first->AcquireCore(1, 3).ok());
  Status busy = second->AcquireCore(1, 3);
  EXPECT_EQ(busy.code(), TERN_ERROR_BUSY);
  EXPECT_NE(busy.message().find("process " + std::to_string(getpid())), std::string::npos)
      << busy.message();

  second->ReleaseCore(1, 3);  // not its core: no effect
  EXPECT_EQ(second->AcquireCore(1, 3).code(), TERN_ERROR_BUSY);
  first->ReleaseCore(1, 3);
  first->ReleaseCore(1, 3);  // twice: no effect
  EXPECT_TRUE(second->AcquireCore(1, 3).ok());
  EXPECT_EQ(first->AcquireCore(1, 3).code(), TERN_ERROR_BUSY);
}

TEST_F(NodeRegistryTest, SigkilledOwnerIsReclaimedWithinOneSecond) {
  const std::string node = NewNode();
  const Topology topology{1, 2, 4 * kGiB};
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, topology, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->AcquireCore(0, 0).ok()) return 2;
    if (!registry->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok()) return 3;
    channel.Ready(0);
    pause();  // until SIGKILL
    return 4;
  });
  ASSERT_EQ(child.WaitReady(), 0);

  auto registry = MustOpen(node, topology);
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(registry->AcquireCore(0, 0).code(), TERN_ERROR_BUSY);
  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), kGiB);
  EXPECT_EQ(registry->ReserveMemory(0, topology.hbm_bytes, TERN_MEMORY_TENSORS).code(),
            TERN_ERROR_OUT_OF_MEMORY);

  child.Kill();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(1);
  bool core = false, memory = false;
  while (!(core && memory) && std::chrono::steady_clock::now() < deadline) {
    core = core || registry->AcquireCore(0, 0).ok();
    memory = memory || registry->ReserveMemory(0, topology.hbm_bytes, TERN_MEMORY_TENSORS).ok();
    if (!(core && memory)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(core);
  EXPECT_TRUE(memory);
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), topology.hbm_bytes);
}

TEST_F(NodeRegistryTest, NodeWideAccountingAcrossProcesses) {
  const std::string node = NewNode();
  const Topology topology{2, 1, kGiB};
  const uint64_t child_bytes = 300 * kMiB;
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, topology, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->ReserveMemory(1, child_bytes, TERN_MEMORY_CONSTANTS).ok()) return 2;
    channel.Ready(0);
    channel.WaitForParent();
    return 0;  // _exit without the destructor: the parent's reaping returns it
  });
  ASSERT_EQ(child.WaitReady(), 0);

  auto registry = MustOpen(node, topology);
  ASSERT_NE(registry, nullptr);
  uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT];
  EXPECT_EQ(registry->NodeMemoryUsed(1, by_category), child_bytes);
  EXPECT_EQ(by_category[TERN_MEMORY_CONSTANTS], child_bytes);
  EXPECT_EQ(by_category[TERN_MEMORY_TENSORS], 0u);
  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), 0u);

  const uint64_t free_bytes = topology.hbm_bytes - child_bytes;
  Status oom = registry->ReserveMemory(1, free_bytes + 1, TERN_MEMORY_TENSORS);
  EXPECT_EQ(oom.code(), TERN_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(oom.message().find(std::to_string(free_bytes + 1) + " bytes"), std::string::npos)
      << oom.message();
  EXPECT_NE(oom.message().find("300.00 MiB of its 1.00 GiB are in use node-wide"),
            std::string::npos)
      << oom.message();
  EXPECT_NE(oom.message().find("constants 300.00 MiB"), std::string::npos) << oom.message();
  EXPECT_TRUE(registry->ReserveMemory(0, topology.hbm_bytes, TERN_MEMORY_TENSORS).ok());

  ASSERT_TRUE(registry->ReserveMemory(1, free_bytes, TERN_MEMORY_TENSORS).ok());
  EXPECT_EQ(registry->NodeMemoryUsed(1, nullptr), topology.hbm_bytes);
  EXPECT_EQ(registry->ReserveMemory(1, 1, TERN_MEMORY_SCRATCH).code(), TERN_ERROR_OUT_OF_MEMORY);

  child.Release();
  EXPECT_EQ(child.Wait(), 0);
  EXPECT_TRUE(registry->ReserveMemory(1, child_bytes, TERN_MEMORY_SCRATCH).ok());
  EXPECT_EQ(registry->NodeMemoryUsed(1, by_category), topology.hbm_bytes);
  EXPECT_EQ(by_category[TERN_MEMORY_CONSTANTS], 0u);
  EXPECT_EQ(by_category[TERN_MEMORY_SCRATCH], child_bytes);
}

TEST_F(NodeRegistryTest, ObserverSnapshotShowsOwnersAndPerProcessMemory) {
  const std::string node = NewNode();
  const Topology topology{2, 2, 2 * kGiB};
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, topology, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->AcquireCore(0, 1).ok()) return 2;
    if (!registry->ReserveMemory(0, 64 * kMiB, TERN_MEMORY_CONSTANTS).ok()) return 3;
    if (!registry->ReserveMemory(0, 16 * kMiB, TERN_MEMORY_CODE).ok()) return 4;
    CoreCounters& counters = registry->core_counters(0, 1);
    counters.commands += 3;
    counters.executions += 2;
    counters.busy_ns += 12345;
    counters.errors[TERN_ERROR_CLASS_DMA_ABORT] += 1;
    registry->CountEcc(0, false);
    registry->CountEcc(0, true);
    registry->CountEcc(0, true);
    channel.Ready(0);
    pause();
    return 5;
  });
  ASSERT_EQ(child.WaitReady(), 0);

  auto parent = MustOpen(node, topology);
  ASSERT_NE(parent, nullptr);
  ASSERT_TRUE(parent->AcquireCore(0, 0).ok());
  ASSERT_TRUE(parent->ReserveMemory(0, 8 * kMiB, TERN_MEMORY_TENSORS).ok());

  // An admin tool: adopts the topology in use and owns nothing.
  auto observer = MustOpen(node, Topology{}, Role::kObserver);
  ASSERT_NE(observer, nullptr);
  EXPECT_EQ(observer->topology(), topology);
  EXPECT_EQ(observer->AcquireCore(0, 0).code(), TERN_ERROR_FAILED_PRECONDITION);
  EXPECT_EQ(observer->ReserveMemory(0, 1, TERN_MEMORY_TENSORS).code(),
            TERN_ERROR_FAILED_PRECONDITION);

  tern_device_telemetry_t t;
  ASSERT_TRUE(observer->Snapshot(0, &t).ok());
  EXPECT_EQ(t.struct_size, sizeof(t));
  EXPECT_EQ(t.core_count, 2u);
  EXPECT_EQ(t.memory_capacity, 2 * kGiB);
  EXPECT_EQ(t.memory_used, 88 * kMiB);
  EXPECT_EQ(t.memory_by_category[TERN_MEMORY_CONSTANTS], 64 * kMiB);
  EXPECT_EQ(t.memory_by_category[TERN_MEMORY_CODE], 16 * kMiB);
  EXPECT_EQ(t.memory_by_category[TERN_MEMORY_TENSORS], 8 * kMiB);
  EXPECT_EQ(t.ecc_corrected, 1u);
  EXPECT_EQ(t.ecc_uncorrected, 2u);
  EXPECT_EQ(t.cores[0].owner_pid, getpid());
  EXPECT_EQ(t.cores[1].physical_index, 1u);
  EXPECT_EQ(t.cores[1].owner_pid, child.pid());
  EXPECT_STREQ(t.cores[1].owner_command, kChildName);
  EXPECT_EQ(t.cores[1].commands, 3u);
  EXPECT_EQ(t.cores[1].executions, 2u);
  EXPECT_EQ(t.cores[1].busy_ns, 12345u);
  EXPECT_EQ(t.cores[1].errors[TERN_ERROR_CLASS_DMA_ABORT], 1u);
  ASSERT_EQ(t.process_count, 2u);
  const tern_process_telemetry_t* child_entry = nullptr;
  for (uint32_t i = 0; i < t.process_count; ++i) {
    if (t.processes[i].pid == child.pid()) child_entry = &t.processes[i];
  }
  ASSERT_NE(child_entry, nullptr);
  EXPECT_STREQ(child_entry->command, kChildName);
  EXPECT_EQ(child_entry->cores_owned, 0x2u);
  EXPECT_EQ(child_entry->memory_by_category[TERN_MEMORY_CONSTANTS], 64 * kMiB);
  EXPECT_EQ(child_entry->memory_by_category[TERN_MEMORY_CODE], 16 * kMiB);

  // The participant's own snapshot agrees, including its own core.
  tern_device_telemetry_t own;
  ASSERT_TRUE(parent->Snapshot(0, &own).ok());
  EXPECT_EQ(own.cores[0].owner_pid, getpid());
  EXPECT_EQ(own.cores[1].owner_pid, child.pid());
  EXPECT_EQ(own.process_count, 2u);

  // Device 1 is unused: no owners, no processes.
  ASSERT_TRUE(observer->Snapshot(1, &t).ok());
  EXPECT_EQ(t.memory_used, 0u);
  EXPECT_EQ(t.cores[0].owner_pid, 0);
  EXPECT_EQ(t.process_count, 0u);

  // After the child dies its core shows no owner, its memory is gone, the
  // counters stay.
  child.Kill();
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  ASSERT_TRUE(observer->Snapshot(0, &t).ok());
  EXPECT_EQ(t.cores[1].owner_pid, 0);
  EXPECT_STREQ(t.cores[1].owner_command, "");
  EXPECT_EQ(t.cores[1].commands, 3u);
  EXPECT_EQ(t.memory_used, 8 * kMiB);
  ASSERT_EQ(t.process_count, 1u);
  EXPECT_EQ(t.processes[0].pid, getpid());
  EXPECT_EQ(t.processes[0].cores_owned, 0x1u);
}

TEST_F(NodeRegistryTest, ObserverOfMissingNodeIsUnavailable) {
  const std::string node = NewNode();
  std::unique_ptr<NodeRegistry> registry;
  Status status = NodeRegistry::Open(node, Topology{}, Role::kObserver, &registry);
  EXPECT_EQ(status.code(), TERN_ERROR_UNAVAILABLE) << status.message();
  EXPECT_EQ(access(("/dev/shm/tern-sim-" + node).c_str(), F_OK), -1);  // not created
}

TEST_F(NodeRegistryTest, TopologyMismatchWithLiveProcessIsIncompatible) {
  const std::string node = NewNode();
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
    channel.Ready(0);
    channel.WaitForParent();
    return 0;
  });
  ASSERT_EQ(child.WaitReady(), 0);

  for (Role role : {Role::kParticipant, Role::kObserver}) {
    std::unique_ptr<NodeRegistry> registry;
    Status status = NodeRegistry::Open(node, Topology{1, 4, 4 * kGiB}, role, &registry);
    EXPECT_EQ(status.code(), TERN_ERROR_INCOMPATIBLE);
    EXPECT_EQ(registry, nullptr);
    const std::string& message = status.message();
    EXPECT_NE(message.find("2 device(s) x 4 core(s) x 4.00 GiB"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(child.pid()) + " (" + kChildName + ")"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("TERN_SIM_TOPOLOGY"), std::string::npos);
    EXPECT_NE(message.find("TERN_SIM_NODE"), std::string::npos);
  }
  // The live process is undisturbed: the same topology still opens.
  auto same = MustOpen(node, kSmall);
  EXPECT_NE(same, nullptr);
  child.Release();
  EXPECT_EQ(child.Wait(), 0);
}

TEST_F(NodeRegistryTest, StaleFileWithoutLiveProcessIsReformatted) {
  const std::string node = NewNode();
  const std::string path = "/dev/shm/tern-sim-" + node;
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok()) return 2;
    if (!registry->AcquireCore(0, 0).ok()) return 3;
    channel.Ready(0);
    return 0;  // dies without cleaning up
  });
  ASSERT_EQ(child.WaitReady(), 0);
  ASSERT_EQ(child.Wait(), 0);

  // An observer that adopted the old format learns that it changed.
  auto observer = MustOpen(node, Topology{}, Role::kObserver);
  ASSERT_NE(observer, nullptr);

  const Topology other{1, 2, 2 * kGiB};
  auto registry = MustOpen(node, other);
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(registry->topology(), other);
  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), 0u);
  EXPECT_TRUE(registry->AcquireCore(0, 0).ok());
  EXPECT_TRUE(registry->ReserveMemory(0, 2 * kGiB, TERN_MEMORY_TENSORS).ok());
  tern_device_telemetry_t t;
  EXPECT_EQ(observer->Snapshot(0, &t).code(), TERN_ERROR_INCOMPATIBLE);
  registry.reset();

  // Garbage and short files with nobody live are reformatted too.
  for (size_t size : {size_t{100}, size_t{1} << 20}) {
    int fd = open(path.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    std::vector<char> garbage(size, '\x5a');
    ASSERT_EQ(write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(size));
    close(fd);
    registry = MustOpen(node, kSmall);
    ASSERT_NE(registry, nullptr);
    EXPECT_EQ(registry->NodeMemoryUsed(1, nullptr), 0u);
    EXPECT_TRUE(registry->ReserveMemory(1, 4 * kGiB, TERN_MEMORY_TENSORS).ok());
    registry.reset();
  }
}

TEST_F(NodeRegistryTest, ConcurrentReservationsSumCorrectly) {
  const std::string node = NewNode();
  auto registry = MustOpen(node, Topology{1, 1, 64 * kGiB});
  ASSERT_NE(registry, nullptr);
  constexpr int kThreads = 4, kIterations = 20000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const auto category = static_cast<tern_memory_category_t>(i % TERN_MEMORY_CATEGORY_COUNT);
      for (int n = 0; n < kIterations; ++n) {
        const uint64_t bytes = 4096 * (1 + n % 7);
        EXPECT_TRUE(registry->ReserveMemory(0, bytes, category).ok());
        if (n % 2 == 1) registry->ReleaseMemory(0, bytes, category);
        if (n % 1000 == 0) {
          tern_device_telemetry_t t;
          EXPECT_TRUE(registry->Snapshot(0, &t).ok());
          registry->ReapDeadProcesses();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  uint64_t per_thread = 0;
  for (int n = 0; n < kIterations; n += 2) per_thread += 4096 * (1 + n % 7);
  uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT];
  EXPECT_EQ(registry->NodeMemoryUsed(0, by_category), kThreads * per_thread);
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(by_category[i], per_thread);
  tern_device_telemetry_t t;
  ASSERT_TRUE(registry->Snapshot(0, &t).ok());
  ASSERT_EQ(t.process_count, 1u);
  EXPECT_EQ(t.processes[0].memory_by_category[3], per_thread);
}

TEST_F(NodeRegistryTest, ConcurrentReservationsStopExactlyAtCapacity) {
  const std::string node = NewNode();
  const uint64_t capacity = 64 * kMiB;
  auto registry = MustOpen(node, Topology{1, 1, capacity});
  ASSERT_NE(registry, nullptr);
  std::atomic<uint64_t> granted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      while (registry->ReserveMemory(0, 4096, TERN_MEMORY_SCRATCH).ok()) granted += 4096;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(granted.load(), capacity);
  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), capacity);
}

TEST_F(NodeRegistryTest, ForkedChildGetsForkedErrorsWhileParentKeepsItsCore) {
  const std::string node = NewNode();
  auto registry = MustOpen(node, kSmall);
  ASSERT_NE(registry, nullptr);
  ASSERT_TRUE(registry->AcquireCore(0, 0).ok());
  ASSERT_TRUE(registry->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok());

  ChildProcess forked([&](ChildProcess::Channel& channel) {
    registry->AfterForkInChild();
    int failures = 0;
    failures += registry->AcquireCore(0, 1).code() != TERN_ERROR_FORKED;
    failures += registry->AcquireCore(0, 0).code() != TERN_ERROR_FORKED;
    failures += registry->ReserveMemory(0, 1, TERN_MEMORY_TENSORS).code() != TERN_ERROR_FORKED;
    tern_device_telemetry_t t;
    failures += registry->Snapshot(0, &t).code() != TERN_ERROR_FORKED;
    registry->ReleaseCore(0, 0);  // must not release the parent's core
    registry->ReleaseMemory(0, kGiB, TERN_MEMORY_TENSORS);
    registry->ReapDeadProcesses();
    registry.reset();  // nor must the destructor
    channel.Ready(static_cast<uint8_t>(failures));
    return 0;
  });
  EXPECT_EQ(forked.WaitReady(), 0);
  EXPECT_EQ(forked.Wait(), 0);

  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), kGiB);
  ChildProcess prober([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> other;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &other).ok()) return 1;
    channel.Ready(other->AcquireCore(0, 0).code() == TERN_ERROR_BUSY ? 0 : 2);
    return 0;
  });
  EXPECT_EQ(prober.WaitReady(), 0);
  EXPECT_EQ(prober.Wait(), 0);
  tern_device_telemetry_t t;
  ASSERT_TRUE(registry->Snapshot(0, &t).ok());
  EXPECT_EQ(t.cores[0].owner_pid, getpid());
  EXPECT_EQ(t.memory_used, kGiB);
}

TEST_F(NodeRegistryTest, SlotsRunOutAndComeBack) {
  const std::string node = NewNode();
  std::vector<std::unique_ptr<NodeRegistry>> registries;
  for (uint32_t i = 0; i < NodeRegistry::kMaxProcesses; ++i) {
    registries.push_back(MustOpen(node, kSmall));
    ASSERT_NE(registries.back(), nullptr);
  }
  std::unique_ptr<NodeRegistry> extra;
  Status status = NodeRegistry::Open(node, kSmall, Role::kParticipant, &extra);
  EXPECT_EQ(status.code(), TERN_ERROR_UNAVAILABLE) << status.message();
  // Observers need no slot.
  EXPECT_NE(MustOpen(node, kSmall, Role::kObserver), nullptr);
  registries.pop_back();
  EXPECT_NE(MustOpen(node, kSmall), nullptr);
}

TEST_F(NodeRegistryTest, DestructorReturnsCoresAndMemory) {
  const std::string node = NewNode();
  auto first = MustOpen(node, kSmall);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->AcquireCore(1, 2).ok());
  ASSERT_TRUE(first->ReserveMemory(1, 3 * kGiB, TERN_MEMORY_RUNTIME).ok());
  first->ReleaseMemory(1, 10 * kGiB, TERN_MEMORY_RUNTIME);  // more than held: clamped
  first->ReleaseMemory(1, kGiB, TERN_MEMORY_TENSORS);       // none held: no effect
  auto second = MustOpen(node, kSmall);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->NodeMemoryUsed(1, nullptr), 0u);
  ASSERT_TRUE(first->ReserveMemory(1, 3 * kGiB, TERN_MEMORY_RUNTIME).ok());
  EXPECT_EQ(second->NodeMemoryUsed(1, nullptr), 3 * kGiB);
  first.reset();
  EXPECT_EQ(second->NodeMemoryUsed(1, nullptr), 0u);
  EXPECT_TRUE(second->AcquireCore(1, 2).ok());
  tern_device_telemetry_t t;
  ASSERT_TRUE(second->Snapshot(1, &t).ok());
  EXPECT_EQ(t.process_count, 1u);
  EXPECT_EQ(t.cores[2].owner_pid, getpid());
}

}  // namespace
}  // namespace tern::sim
