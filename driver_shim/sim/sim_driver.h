// The simulated device backend ("sim"): a functional model of a
// Trainium2-class node in host memory, embedded in the process (nothing to
// start). See docs/sim.md.
//
// - Device memory is a memfd per device, mapped twice: an engine view the
//   simulated engines read and write, and a user view at the addresses users
//   see, mapped PROT_NONE in protect mode so a host dereference faults.
// - Cores, node-wide memory accounting and counters live in the node
//   registry (shared memory, kernel-released locks).
// - Each hardware queue is a host thread that executes its commands in order.
#ifndef TERN_DRIVER_SHIM_SIM_SIM_DRIVER_H_
#define TERN_DRIVER_SHIM_SIM_SIM_DRIVER_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "driver_shim/driver.h"
#include "driver_shim/sim/node_registry.h"
#include "driver_shim/sim/sim_topology.h"

namespace tern::sim {

Status CreateSimDriver(const driver::DriverOptions& options, std::unique_ptr<driver::Driver>* out);

class SimDriver;

class SimDevice final : public driver::Device {
 public:
  SimDevice(SimDriver* driver, driver::DeviceStaticInfo info);
  ~SimDevice() override;
  Status Init();

  const driver::DeviceStaticInfo& info() const override { return info_; }
  Status OpenCore(uint32_t core) override;
  void CloseCore(uint32_t core) override;
  uint64_t device_base() const override { return reinterpret_cast<uint64_t>(user_view_); }
  Status ReserveMemory(uint64_t bytes, tern_memory_category_t category) override;
  void ReleaseMemory(uint64_t bytes, tern_memory_category_t category) override;
  uint64_t NodeMemoryUsed(uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) const override;
  void MemoryFreed(uint64_t offset, uint64_t size, tern_memory_category_t category) override;
  Status CreateQueue(uint32_t core, const std::string& name,
                     std::unique_ptr<driver::HwQueue>* out_queue) override;
  void PrepareProgram(driver::Program& program, const driver::MemoryRef& constants) override;
  Status ExecuteSync(const driver::Command& command) override;
  void PrefaultMemory(uint64_t offset, uint64_t bytes) override;
  void* EngineAddress(uint64_t offset, uint64_t size) const override;
  int SharedMemoryFd() const override { return memfd_; }
  Status GetTelemetry(tern_device_telemetry_t* out) const override;
  Status InjectFault(const Fault& fault) override;

  // Shareable memory: each shareable range has a memfd of its own, sealed
  // against resizing and named "tern-buffer:<device uuid>:<nonce>:<size>:
  // <category>", mapped MAP_FIXED over the range in both views.
  Status CreateShareable(uint64_t offset, uint64_t bytes, uint64_t size,
                         tern_memory_category_t category) override;
  Status ExportShareable(uint64_t offset, int* out_fd) override;
  Status InspectShareable(int fd, SharedMemoryDesc* out_desc) override;
  Status ImportShareable(int fd, uint64_t offset, const SharedMemoryDesc& desc) override;
  void ReleaseShareable(uint64_t offset) override;

  // Runs one command for a queue of `core`: checks armed faults, moves the
  // data, counts it. `*out_class` gets the error class of a failure.
  // `trace_track` (0: none) receives a span per instruction of an execution.
  Status Run(uint32_t core, const driver::Command& command, tern_error_class_t* out_class,
             uint32_t trace_track = 0);
  // Runs `function` once on zeroed host memory of its own, for what a first
  // execution would pay (see PrepareProgram). Errors are dropped.
  void Rehearse(const driver::Function& function, const uint8_t* constants);
  // Runs a kExecute command's function (sim_execute.cc) on the calling queue
  // thread; its kernels use the kernel pool (engines/kernel_pool.h).
  Status ExecuteProgram(uint32_t core, const driver::Command& command,
                        tern_error_class_t* out_class, uint32_t trace_track);
  // Wakes commands that hang on an injected fault (queue shutdown).
  void InterruptHangs();
  NodeRegistry& registry() const;
  uint32_t index() const { return info_.physical_index; }
  uint64_t exec_timeout_ns() const;

 private:
  uint8_t* EnginePointer(const driver::MemoryRef& ref, uint64_t size, Status* status) const;
  // Fails a copy or fill that touches poisoned memory of this device.
  Status CheckPoison(const driver::Command& command);
  Status CheckFaults(uint32_t core, const driver::Command& command, tern_error_class_t* out_class);
  Status Move(const driver::Command& command);

  // Maps `fd` over [offset, offset + bytes) of both views; on failure puts
  // the device's own memory back.
  Status MapShared(int fd, uint64_t offset, uint64_t bytes);
  // Maps the device's own memory over [offset, offset + bytes) of both views.
  void RestoreRange(uint64_t offset, uint64_t bytes);
  int user_protection() const;

  SimDriver* driver_;
  driver::DeviceStaticInfo info_;
  int memfd_ = -1;

  struct SharedRegion {
    int fd = -1;  // this process's descriptor of the range's memfd
    uint64_t bytes = 0;
    uint64_t id = 0;  // the node-wide accounting id
  };
  std::mutex shared_mutex_;
  std::map<uint64_t, SharedRegion> shared_;  // by offset; guarded by shared_mutex_
  uint8_t* engine_view_ = nullptr;
  uint8_t* user_view_ = nullptr;
  // A bit per page of the engine view that PrefaultMemory mapped, so that a
  // range mapped already costs no system call (a small buffer's allocation
  // asks for it every time); cleared where pages are given back or mapped
  // anew. A clear bit may still be a mapped page (an engine touched it).
  // Zero pages mapped on demand (a bit per 4 KiB: 256 KiB for 8 GiB), read
  // and written through std::atomic_ref.
  uint64_t* prefaulted_ = nullptr;
  uint64_t prefaulted_bytes_ = 0;
  void MarkPrefaulted(uint64_t first_page, uint64_t end_page, bool mapped);
  bool AllPrefaulted(uint64_t first_page, uint64_t end_page) const;

  // Faults: a count checked on the hot path, details under a mutex.
  std::atomic<uint32_t> armed_fault_count_{0};
  std::mutex fault_mutex_;
  std::vector<Fault> armed_faults_;
  std::condition_variable hang_wakeup_;
  // The trace track of the loader's rehearsals (see Rehearse), made at the
  // first one a capture records.
  std::once_flag loader_track_once_;
  uint32_t loader_track_ = 0;
  uint64_t hang_interrupts_ = 0;
};

class SimDriver final : public driver::Driver {
 public:
  SimDriver(const driver::DriverOptions& options, SimConfig config);
  Status Init();
  const char* name() const override { return "sim"; }
  Status Enumerate(std::vector<driver::DeviceStaticInfo>* out_devices) override;
  Status OpenDevice(uint32_t physical_index, std::unique_ptr<driver::Device>* out_device) override;
  void AfterForkInChild() override;

  const SimConfig& config() const { return config_; }
  const driver::DriverOptions& options() const { return options_; }
  NodeRegistry& registry() { return *registry_; }

 private:
  driver::DriverOptions options_;
  SimConfig config_;
  std::unique_ptr<NodeRegistry> registry_;
  std::vector<driver::DeviceStaticInfo> devices_;
};

}  // namespace tern::sim

#endif  // TERN_DRIVER_SHIM_SIM_SIM_DRIVER_H_
