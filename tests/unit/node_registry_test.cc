// Tests of the sim node registry with real processes: children are forked,
// use only the registry, report over a pipe and _exit.
#include "driver_shim/sim/node_registry.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
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
    // Sends text after the Ready() byte; the parent reads it with ReadText().
    void Send(const std::string& text) { (void)!write(to_parent_, text.data(), text.size()); }
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
  // Everything the child sent after its Ready() byte, up to its exit.
  std::string ReadText() {
    std::string text;
    char buf[4096];
    for (;;) {
      struct pollfd pfd = {from_child_, POLLIN, 0};
      if (poll(&pfd, 1, 10000) != 1) break;
      const ssize_t n = read(from_child_, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    return text;
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

// --- Hardening: who may use a node, bounded waits, crash-consistent and
// validated accounting (docs/sim.md, "Security model of the simulated node").

std::string NodePath(const std::string& node) { return "/dev/shm/tern-sim-" + node; }

// Lock bytes as node_registry.cc places them: past the data, at offsets that
// no layout version moves.
constexpr off_t kInitLockByte = off_t{1} << 32;
off_t SlotLockByte(uint32_t slot) { return kInitLockByte + 64 + slot; }
off_t CoreLockByte(uint32_t device, uint32_t core) {
  return kInitLockByte + 4096 + static_cast<off_t>(device) * NodeRegistry::kMaxCoresPerDevice +
         core;
}

bool OfdLock(int fd, short type, off_t offset) {
  struct flock fl = {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = offset;
  fl.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

// In a forked child: becomes "nobody" (another, unprivileged user). False
// when that fails.
bool BecomeNobody() {
  constexpr uid_t kNobody = 65534;
  return setgroups(0, nullptr) == 0 && setgid(kNobody) == 0 && setuid(kNobody) == 0 &&
         geteuid() == kNobody;
}

#define SKIP_UNLESS_ROOT()                                                                        \
  if (geteuid() != 0) {                                                                           \
    GTEST_SKIP() << "needs root: a forked child must setuid to 65534 (nobody) to act as another " \
                    "user";                                                                       \
  }

struct OpenResult {
  int code = -1;  // the status code; -1: the child hung or died
  int64_t elapsed_ms = 0;
  std::string message;
};

// Runs NodeRegistry::Open in a forked child, so that a hang or a crash shows
// as a failed result instead of a hung or dead test.
OpenResult OpenInChild(const std::string& node, const Topology& topology, Role role) {
  ChildProcess child([&](ChildProcess::Channel& channel) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<NodeRegistry> registry;
    Status status = NodeRegistry::Open(node, topology, role, &registry);
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    channel.Ready(0);
    channel.Send(std::to_string(static_cast<int>(status.code())) + " " +
                 std::to_string(elapsed.count()) + " " + status.message());
    return 0;
  });
  OpenResult result;
  if (child.WaitReady() != 0) return result;
  const std::string text = child.ReadText();
  size_t first = text.find(' '), second = text.find(' ', first + 1);
  if (first == std::string::npos || second == std::string::npos) return result;
  result.code = std::atoi(text.substr(0, first).c_str());
  result.elapsed_ms = std::atoll(text.substr(first + 1, second - first - 1).c_str());
  result.message = text.substr(second + 1);
  child.Wait();
  return result;
}

TEST_F(NodeRegistryTest, NodeFileIsCreatedOwnerOnlyWhateverTheUmask) {
  for (mode_t mask : {mode_t{0}, mode_t{022}, mode_t{0277}}) {
    const std::string node = NewNode();
    const mode_t old_mask = umask(mask);
    auto registry = MustOpen(node, kSmall);
    umask(old_mask);
    ASSERT_NE(registry, nullptr);
    struct stat st;
    ASSERT_EQ(stat(NodePath(node).c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, geteuid());
    EXPECT_EQ(st.st_mode & 07777, 0600u) << "umask " << mask;
  }
}

TEST_F(NodeRegistryTest, WideModeOrSymlinkNodeFileIsRefused) {
  const std::string node = NewNode();
  const std::string path = NodePath(node);
  // In use (a live participant holds its slot's lock): refused, never replaced.
  auto user = MustOpen(node, kSmall);
  ASSERT_NE(user, nullptr);
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  for (Role role : {Role::kParticipant, Role::kObserver}) {
    std::unique_ptr<NodeRegistry> registry;
    Status status =
        NodeRegistry::Open(node, role == Role::kObserver ? Topology{} : kSmall, role, &registry);
    EXPECT_EQ(status.code(), TERN_ERROR_FAILED_PRECONDITION) << status.message();
    EXPECT_EQ(registry, nullptr);
    EXPECT_NE(status.message().find("\"" + path + "\" has mode 0644"), std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("rm \"" + path + "\""), std::string::npos);
  }
  user.reset();

  ASSERT_EQ(unlink(path.c_str()), 0);
  const std::string target = path + "-target";
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  std::unique_ptr<NodeRegistry> registry;
  Status status = NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry);
  EXPECT_EQ(status.code(), TERN_ERROR_FAILED_PRECONDITION) << status.message();
  EXPECT_NE(status.message().find("symbolic link"), std::string::npos) << status.message();
  EXPECT_EQ(access(target.c_str(), F_OK), -1);  // nothing created through the link
}

TEST_F(NodeRegistryTest, StaleWideModeFileOfThisUserIsReplaced) {
  // What older tern left behind: a 0644 file of this user's that no process uses.
  const std::string node = NewNode();
  const std::string path = NodePath(node);
  MustOpen(node, kSmall).reset();
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  // A descriptor someone kept on the old file (no lock): it must stay on the
  // old file, which leaves the path.
  const int old_fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old_fd, 0);
  struct stat before;
  ASSERT_EQ(fstat(old_fd, &before), 0);
  std::unique_ptr<NodeRegistry> observer;
  EXPECT_EQ(NodeRegistry::Open(node, Topology{}, Role::kObserver, &observer).code(),
            TERN_ERROR_FAILED_PRECONDITION);  // observers never replace anything
  auto registry = MustOpen(node, kSmall);
  ASSERT_NE(registry, nullptr);
  struct stat after;
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_mode & 07777, 0600u);
  EXPECT_NE(after.st_ino, before.st_ino);  // a new file, not the old one chmodded
  struct stat old_file;
  ASSERT_EQ(fstat(old_fd, &old_file), 0);
  EXPECT_EQ(old_file.st_nlink, 0u);
  close(old_fd);
  EXPECT_EQ(registry->ReserveMemory(0, 4096, TERN_MEMORY_TENSORS).code(), TERN_OK);
}

TEST_F(NodeRegistryTest, AnotherUserCannotLockTheNodeFile) {
  SKIP_UNLESS_ROOT();
  const std::string node = NewNode();
  const std::string path = NodePath(node);
  auto first = MustOpen(node, kSmall);
  ASSERT_NE(first, nullptr);

  // Another user tries to hold the init, core and slot bytes with read locks.
  ChildProcess intruder([&](ChildProcess::Channel& channel) {
    if (!BecomeNobody()) return 1;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      channel.Ready(errno == EACCES ? 0 : 2);  // refused, as designed
    } else {
      bool locked = OfdLock(fd, F_RDLCK, kInitLockByte) && OfdLock(fd, F_RDLCK, CoreLockByte(0, 0));
      for (uint32_t slot = 0; slot < NodeRegistry::kMaxProcesses; ++slot) {
        locked = OfdLock(fd, F_RDLCK, SlotLockByte(slot)) && locked;
      }
      channel.Ready(locked ? 3 : 4);
    }
    channel.WaitForParent();
    return 0;
  });
  EXPECT_EQ(intruder.WaitReady(), 0) << "3: the other user opened and locked the node file";

  // Root's next process opens at once, gets a slot and a core.
  ChildProcess user([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
    channel.Ready(registry->AcquireCore(0, 0).ok() ? 0 : 2);
    return 0;
  });
  EXPECT_EQ(user.WaitReady(), 0) << "-1: Open hung";
  intruder.Release();
}

TEST_F(NodeRegistryTest, StuckInitLockTimesOutNamingTheHolder) {
  const std::string node = NewNode();
  const std::string path = NodePath(node);
  ASSERT_NE(MustOpen(node, kSmall), nullptr);  // creates the file
  ChildProcess holder([&](ChildProcess::Channel& channel) {
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    channel.Ready(fd >= 0 && OfdLock(fd, F_RDLCK, kInitLockByte) ? 0 : 1);
    channel.WaitForParent();
    return 0;
  });
  ASSERT_EQ(holder.WaitReady(), 0);

  ASSERT_EQ(setenv("TERN_SIM_NODE_LOCK_TIMEOUT_MS", "300", 1), 0);
  const OpenResult result = OpenInChild(node, kSmall, Role::kParticipant);
  unsetenv("TERN_SIM_NODE_LOCK_TIMEOUT_MS");
  ASSERT_NE(result.code, -1) << "Open hung";
  EXPECT_EQ(result.code, TERN_ERROR_TIMEOUT) << result.message;
  EXPECT_GE(result.elapsed_ms, 300);
  EXPECT_LT(result.elapsed_ms, 3000);
  EXPECT_NE(result.message.find("\"" + path + "\""), std::string::npos) << result.message;
  EXPECT_NE(result.message.find(std::to_string(holder.pid()) + " (" + kChildName + ")"),
            std::string::npos)
      << result.message;
  EXPECT_NE(result.message.find("TERN_SIM_NODE_LOCK_TIMEOUT_MS"), std::string::npos);

  holder.Release();
  EXPECT_EQ(holder.Wait(), 0);
  EXPECT_NE(MustOpen(node, kSmall), nullptr);  // free again
}

TEST_F(NodeRegistryTest, AnotherUsersNodeFileIsRefused) {
  SKIP_UNLESS_ROOT();
  const std::string node = NewNode();
  const std::string path = NodePath(node);

  // The other user runs tern first and so creates the node file.
  ChildProcess squatter([&](ChildProcess::Channel& channel) {
    if (!BecomeNobody()) return 1;
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 2;
    channel.Ready(0);
    channel.WaitForParent();
    return 0;
  });
  ASSERT_EQ(squatter.WaitReady(), 0);
  for (Role role : {Role::kParticipant, Role::kObserver}) {
    std::unique_ptr<NodeRegistry> registry;
    Status status =
        NodeRegistry::Open(node, role == Role::kObserver ? Topology{} : kSmall, role, &registry);
    EXPECT_EQ(status.code(), TERN_ERROR_FAILED_PRECONDITION) << status.message();
    EXPECT_EQ(registry, nullptr);
    EXPECT_NE(status.message().find("\"" + path + "\" belongs to uid 65534"), std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("rm \"" + path + "\""), std::string::npos);
  }
  squatter.Release();
  EXPECT_EQ(squatter.Wait(), 0);

  // A file the other user wrote by hand, open to all: refused as well.
  ASSERT_TRUE(NodeRegistry::RemoveNode(node).ok());
  ChildProcess writer([&](ChildProcess::Channel& channel) {
    if (!BecomeNobody()) return 1;
    umask(0);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0666);
    std::vector<char> garbage(1 << 20, '\x7f');
    channel.Ready(fd >= 0 && write(fd, garbage.data(), garbage.size()) > 0 ? 0 : 2);
    return 0;
  });
  ASSERT_EQ(writer.WaitReady(), 0);
  EXPECT_EQ(writer.Wait(), 0);
  std::unique_ptr<NodeRegistry> registry;
  Status status = NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry);
  EXPECT_EQ(status.code(), TERN_ERROR_FAILED_PRECONDITION) << status.message();
  EXPECT_NE(status.message().find("belongs to uid 65534"), std::string::npos) << status.message();

  // Root's own node: the other user can neither open nor truncate it, so a
  // live process's mapping cannot be cut from under it.
  ASSERT_TRUE(NodeRegistry::RemoveNode(node).ok());
  auto live = MustOpen(node, kSmall);
  ASSERT_NE(live, nullptr);
  ASSERT_TRUE(live->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok());
  ChildProcess truncater([&](ChildProcess::Channel& channel) {
    if (!BecomeNobody()) return 1;
    const bool opened = open(path.c_str(), O_RDWR | O_CLOEXEC) >= 0;
    const bool truncated = truncate(path.c_str(), 0) == 0;
    channel.Ready(!opened && !truncated ? 0 : 2);
    return 0;
  });
  EXPECT_EQ(truncater.WaitReady(), 0);
  EXPECT_EQ(truncater.Wait(), 0);
  EXPECT_TRUE(live->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok());
  EXPECT_EQ(live->NodeMemoryUsed(0, nullptr), 2 * kGiB);
}

// Processes killed at random moments while two threads reserve and release
// must leave the accounting exact: no leak, totals equal to the categories.
TEST_F(NodeRegistryTest, SigkillAtRandomMomentsLeavesExactAccounting) {
  const std::string node = NewNode();
  const Topology topology{2, 1, 64 * kGiB};
  auto survivor = MustOpen(node, topology);
  ASSERT_NE(survivor, nullptr);
  ASSERT_TRUE(survivor->ReserveMemory(0, 3 * kMiB, TERN_MEMORY_TENSORS).ok());
  ASSERT_TRUE(survivor->ReserveMemory(1, 5 * kMiB, TERN_MEMORY_CODE).ok());

  std::mt19937 rng(std::random_device{}());
  constexpr int kKills = 100;
  int ready = 0;
  for (int kill = 0; kill < kKills; ++kill) {
    const uint32_t seed = rng();
    ChildProcess child([&](ChildProcess::Channel& channel) {
      std::unique_ptr<NodeRegistry> registry;
      if (!NodeRegistry::Open(node, topology, Role::kParticipant, &registry).ok()) return 1;
      auto churn = [&](uint32_t thread_seed) {
        std::mt19937 local(thread_seed);
        struct Held {
          uint32_t device;
          tern_memory_category_t category;
          uint64_t bytes;
        };
        std::vector<Held> held;
        for (;;) {
          if (held.size() < 8 || local() % 2 == 0) {
            Held h{static_cast<uint32_t>(local() % 2),
                   static_cast<tern_memory_category_t>(local() % TERN_MEMORY_CATEGORY_COUNT),
                   1 + local() % (1 << 20)};
            if (registry->ReserveMemory(h.device, h.bytes, h.category).ok()) held.push_back(h);
          } else {
            const size_t i = local() % held.size();
            registry->ReleaseMemory(held[i].device, held[i].bytes, held[i].category);
            held[i] = held.back();
            held.pop_back();
          }
        }
      };
      std::thread(churn, seed).detach();
      std::thread(churn, seed + 1).detach();
      channel.Ready(0);
      pause();
      return 0;
    });
    // Half the kills land while the child churns, half anywhere from fork on
    // (opening, claiming its slot).
    if (kill % 2 == 0) ready += child.WaitReady() == 0;
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    child.Kill();
    EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  }
  EXPECT_EQ(ready, kKills / 2);

  // One live process: the node holds exactly what it holds.
  survivor->ReapDeadProcesses();
  for (uint32_t device = 0; device < 2; ++device) {
    uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT];
    const uint64_t expected = device == 0 ? 3 * kMiB : 5 * kMiB;
    EXPECT_EQ(survivor->NodeMemoryUsed(device, by_category), expected) << "device " << device;
    for (uint32_t c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) {
      const bool held =
          (device == 0 && c == TERN_MEMORY_TENSORS) || (device == 1 && c == TERN_MEMORY_CODE);
      EXPECT_EQ(by_category[c], held ? expected : 0) << "device " << device << " category " << c;
    }
    tern_device_telemetry_t t;
    ASSERT_TRUE(survivor->Snapshot(device, &t).ok());
    ASSERT_EQ(t.process_count, 1u);
    EXPECT_EQ(t.processes[0].pid, getpid());
  }

  // No live process: nothing in use, and the categories agree.
  survivor.reset();
  auto observer = MustOpen(node, Topology{}, Role::kObserver);
  ASSERT_NE(observer, nullptr);
  for (uint32_t device = 0; device < 2; ++device) {
    tern_device_telemetry_t t;
    ASSERT_TRUE(observer->Snapshot(device, &t).ok());
    uint64_t sum = 0;
    for (uint64_t bytes : t.memory_by_category) sum += bytes;
    EXPECT_EQ(t.memory_used, 0u) << "device " << device;
    EXPECT_EQ(sum, 0u) << "device " << device;
    EXPECT_EQ(t.process_count, 0u);
  }
}

// Garbage after a valid header while no process is live: recovered, never a
// permanent out-of-memory. First only the 64 bytes after the header (where
// layout 3 kept device 0's node-wide used total: a huge total there made
// every reservation fail), then everything after the header (huge ledgers,
// bogus slot states).
TEST_F(NodeRegistryTest, GarbageLedgerWithoutLiveProcessIsRecovered) {
  constexpr off_t kHeaderBytes = 64;  // the header's fields, kept valid
  for (bool whole_file : {false, true}) {
    const std::string node = NewNode();
    ChildProcess child([&](ChildProcess::Channel& channel) {
      std::unique_ptr<NodeRegistry> registry;
      if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
      if (!registry->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok()) return 2;
      channel.Ready(0);
      return 0;  // exits without cleaning up
    });
    ASSERT_EQ(child.WaitReady(), 0);
    ASSERT_EQ(child.Wait(), 0);

    const int fd = open(NodePath(node).c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    const size_t bytes = whole_file ? static_cast<size_t>(st.st_size - kHeaderBytes) : 64;
    std::vector<char> garbage(bytes, '\xff');
    ASSERT_EQ(pwrite(fd, garbage.data(), garbage.size(), kHeaderBytes),
              static_cast<ssize_t>(garbage.size()));
    close(fd);

    auto registry = MustOpen(node, kSmall);
    ASSERT_NE(registry, nullptr);
    for (uint32_t device = 0; device < kSmall.device_count; ++device) {
      EXPECT_EQ(registry->NodeMemoryUsed(device, nullptr), 0u) << whole_file;
    }
    Status status = registry->ReserveMemory(0, kSmall.hbm_bytes, TERN_MEMORY_TENSORS);
    EXPECT_TRUE(status.ok()) << status.message();
    EXPECT_TRUE(registry->AcquireCore(0, 0).ok());
    tern_device_telemetry_t t;
    ASSERT_TRUE(registry->Snapshot(0, &t).ok());
    EXPECT_EQ(t.memory_used, kSmall.hbm_bytes);
    ASSERT_EQ(t.process_count, 1u);
    EXPECT_EQ(t.processes[0].pid, getpid());
  }
}

// A live process's ledger that claims more than the device has can only be
// corrupt: a failed reservation names that process and says to stop it, and
// stopping it recovers the node.
TEST_F(NodeRegistryTest, CorruptLedgerOfLiveProcessIsNamed) {
  const std::string node = NewNode();
  const uint64_t marker = 0x1234567;  // an amount to find in the file: the child's ledger
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->ReserveMemory(1, marker, TERN_MEMORY_SCRATCH).ok()) return 2;
    channel.Ready(0);
    pause();
    return 3;
  });
  ASSERT_EQ(child.WaitReady(), 0);

  const int fd = open(NodePath(node).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  std::vector<uint64_t> words(static_cast<size_t>(st.st_size) / 8);
  ASSERT_EQ(pread(fd, words.data(), words.size() * 8, 0), static_cast<ssize_t>(words.size() * 8));
  int found = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] != marker) continue;
    const uint64_t huge = uint64_t{1} << 60;
    ASSERT_EQ(pwrite(fd, &huge, 8, static_cast<off_t>(i * 8)), 8);
    ++found;
  }
  close(fd);
  ASSERT_EQ(found, 1);

  auto registry = MustOpen(node, kSmall);
  ASSERT_NE(registry, nullptr);
  EXPECT_TRUE(registry->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok());  // device 0 is fine
  Status oom = registry->ReserveMemory(1, 1, TERN_MEMORY_TENSORS);
  EXPECT_EQ(oom.code(), TERN_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(oom.message().find("is corrupt"), std::string::npos) << oom.message();
  EXPECT_NE(oom.message().find(std::to_string(child.pid()) + " (" + kChildName + "): "),
            std::string::npos)
      << oom.message();
  EXPECT_NE(oom.message().find("Stop those processes"), std::string::npos) << oom.message();

  child.Kill();
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
  EXPECT_TRUE(registry->ReserveMemory(1, kSmall.hbm_bytes, TERN_MEMORY_TENSORS).ok());
  EXPECT_EQ(registry->NodeMemoryUsed(1, nullptr), kSmall.hbm_bytes);
}

TEST_F(NodeRegistryTest, HeaderBeyondTheLimitsIsNotAdopted) {
  std::unique_ptr<NodeRegistry> registry;
  Status status = NodeRegistry::Open(NewNode(), Topology{1, 1, NodeRegistry::kMaxHbmBytes + 1},
                                     Role::kParticipant, &registry);
  EXPECT_EQ(status.code(), TERN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(status.message().find("1.00 TiB"), std::string::npos) << status.message();

  const std::string node = NewNode();
  ASSERT_NE(MustOpen(node, kSmall), nullptr);
  const int fd = open(NodePath(node).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const uint64_t huge = uint64_t{1} << 62;
  constexpr off_t kHbmBytesOffset = 32;  // Header::hbm_bytes
  ASSERT_EQ(pwrite(fd, &huge, sizeof(huge), kHbmBytesOffset), static_cast<ssize_t>(sizeof(huge)));
  close(fd);

  status = NodeRegistry::Open(node, Topology{}, Role::kObserver, &registry);
  EXPECT_EQ(status.code(), TERN_ERROR_INCOMPATIBLE) << "adopted 2^62 bytes of HBM";
  EXPECT_EQ(registry, nullptr);
  // Nobody is live: a process that asks for a valid topology reformats it.
  registry = MustOpen(node, kSmall);
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(registry->topology(), kSmall);
  EXPECT_TRUE(registry->ReserveMemory(0, kSmall.hbm_bytes, TERN_MEMORY_TENSORS).ok());
}

TEST_F(NodeRegistryTest, TruncatedFileUnderLiveProcessIsNotReformatted) {
  const std::string node = NewNode();
  const std::string path = NodePath(node);
  ChildProcess child([&](ChildProcess::Channel& channel) {
    std::unique_ptr<NodeRegistry> registry;
    if (!NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry).ok()) return 1;
    if (!registry->ReserveMemory(0, kGiB, TERN_MEMORY_TENSORS).ok()) return 2;
    if (!registry->AcquireCore(0, 0).ok()) return 3;
    channel.Ready(0);
    channel.WaitForParent();
    registry->ReleaseMemory(0, kGiB, TERN_MEMORY_TENSORS);  // touches the mapping
    registry.reset();
    return 0;
  });
  ASSERT_EQ(child.WaitReady(), 0);
  struct stat before;
  ASSERT_EQ(stat(path.c_str(), &before), 0);
  ASSERT_EQ(truncate(path.c_str(), 0), 0);

  std::unique_ptr<NodeRegistry> registry;
  Status status = NodeRegistry::Open(node, kSmall, Role::kParticipant, &registry);
  EXPECT_EQ(status.code(), TERN_ERROR_FAILED_PRECONDITION) << status.message();
  EXPECT_EQ(registry, nullptr);
  EXPECT_NE(status.message().find("was truncated to 0 bytes"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find(std::to_string(child.pid()) + " (" + kChildName + ")"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("rm \"" + path + "\""), std::string::npos);
  struct stat after;
  ASSERT_EQ(stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);

  child.Release();
  EXPECT_EQ(child.Wait(), 0) << "the live process died (128 + 7: SIGBUS)";
  // Once nobody is live, the lost state is formatted afresh.
  registry = MustOpen(node, kSmall);
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(registry->NodeMemoryUsed(0, nullptr), 0u);
}

}  // namespace
}  // namespace tern::sim
