#include "driver_shim/sim/sim_driver.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "common/logging.h"
#include "common/timeline.h"
#include "driver_shim/sim/byte_mover.h"
#include "driver_shim/sim/engines/run_instruction.h"
#include "driver_shim/sim/engines/streaming_stores.h"
#include "driver_shim/sim/engines/warm_up.h"
#include "driver_shim/sim/sim_queue.h"
#include "tern/version.h"

namespace tern::sim {

using driver::Command;
using driver::CommandKind;
using driver::MemoryRef;

namespace {

constexpr uint64_t kPageSize = 4096;
// Freed blocks at least this large give their pages back to the host.
constexpr uint64_t kDiscardThreshold = 1ull << 20;

bool RangesOverlap(uint64_t a, uint64_t a_size, uint64_t b, uint64_t b_size) {
  return a < b + b_size && b < a + a_size;
}

// Maps `size` bytes of `fd` at `skew` bytes past an address aligned to
// `alignment`: reserve a larger range, trim it, map the file over the part
// wanted.
void* MapAligned(int fd, uint64_t size, uint64_t alignment, uint64_t skew, int protection,
                 Status* status) {
  const uint64_t span = size + alignment + skew;
  void* reserved =
      mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) {
    *status = ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, errno,
                          "reserving address space for device memory");
    return nullptr;
  }
  const uint64_t start = reinterpret_cast<uint64_t>(reserved);
  const uint64_t begin = ((start + alignment - 1) & ~(alignment - 1)) + skew;
  if (begin > start) munmap(reserved, begin - start);
  const uint64_t tail = start + span - (begin + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(begin + size), tail);
  void* mapped = mmap(reinterpret_cast<void*>(begin), size, protection,
                      MAP_SHARED | MAP_NORESERVE | MAP_FIXED, fd, 0);
  if (mapped == MAP_FAILED) {
    *status = ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, errno, "mapping simulated device memory");
    munmap(reinterpret_cast<void*>(begin), size);
    return nullptr;
  }
  return mapped;
}

// The stable identity of device `index` of node `node`: a 128-bit hash of the
// two, written as an RFC 9562 UUID of version 8 (custom) and variant 10. The
// same node and index give the same UUID in every process and run.
std::string DeviceUuid(const std::string& node, uint32_t index) {
  auto fnv1a = [&](uint64_t seed) {
    uint64_t h = seed;
    auto mix_byte = [&h](uint8_t b) {
      h ^= b;
      h *= 0x100000001b3ull;
    };
    for (char c : node) mix_byte(static_cast<uint8_t>(c));
    mix_byte(0);
    for (int shift = 0; shift < 32; shift += 8) mix_byte(static_cast<uint8_t>(index >> shift));
    // A final avalanche (SplitMix64's), so that near names differ everywhere.
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  };
  uint64_t high = fnv1a(0xcbf29ce484222325ull), low = fnv1a(0x84222325cbf29ce4ull);
  high = (high & ~0xf000ull) | 0x8000ull;          // version 8
  low = (low & ~(0x3ull << 62)) | (0x2ull << 62);  // variant 10
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xffff,
                     high & 0xffff, low >> 48, low & 0xffffffffffffull);
}

}  // namespace

// --- SimDevice --------------------------------------------------------------

SimDevice::SimDevice(SimDriver* driver, driver::DeviceStaticInfo info)
    : driver_(driver), info_(std::move(info)) {}

SimDevice::~SimDevice() {
  for (auto& [offset, region] : shared_) {
    registry().ReleaseShared(index(), region.id);
    close(region.fd);
  }
  if (user_view_ != nullptr) munmap(user_view_, info_.memory_bytes);
  if (engine_view_ != nullptr) munmap(engine_view_, info_.memory_bytes);
  if (prefaulted_ != nullptr) munmap(prefaulted_, prefaulted_bytes_);
  if (memfd_ >= 0) close(memfd_);
}

Status SimDevice::Init() {
  const std::string name = fmt::format("tern-sim-hbm{}", info_.physical_index);
  memfd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (memfd_ < 0) return ErrnoStatus(TERN_ERROR_IO, errno, "memfd_create for device memory");
  if (ftruncate(memfd_, static_cast<off_t>(info_.memory_bytes)) != 0) {
    return ErrnoStatus(
        TERN_ERROR_HOST_OUT_OF_MEMORY, errno,
        fmt::format("sizing {} bytes of simulated device memory", info_.memory_bytes));
  }
  // The user view starts at an address aligned to the memory's size rounded
  // up to a power of two, so any alignment a buffer can ask for holds for its
  // device address too. MAP_NORESERVE: pages are committed on first touch.
  const uint64_t alignment = std::bit_ceil(info_.memory_bytes);
  Status status;
  user_view_ = static_cast<uint8_t*>(
      MapAligned(memfd_, info_.memory_bytes, alignment, 0, user_protection(), &status));
  if (user_view_ == nullptr) return status;
  // The engine view is internal, and deliberately not that aligned: the
  // kernel places large host mappings (pinned buffers among them) at 2 MiB
  // boundaries, often right next to this one, and a copy between two
  // addresses a large power of two apart (2^28, 2^30) ran 10-20% slower on
  // the development VM than one 17 pages further apart (rep movsb and glibc
  // memcpy alike; H2D and D2H at 1-4 MiB measured 0.77-0.86x memcpy in the
  // runtime benchmark whenever the pinned buffers landed so). 17 pages past
  // the boundary, no such distance arises; buffers keep page alignment
  // here, which is all the engines need.
  const uint64_t engine_view_skew = 17 * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  engine_view_ = static_cast<uint8_t*>(MapAligned(
      memfd_, info_.memory_bytes, alignment, engine_view_skew, PROT_READ | PROT_WRITE, &status));
  if (engine_view_ == nullptr) return status;
  const uint64_t pages = (info_.memory_bytes + kPageSize - 1) / kPageSize;
  prefaulted_bytes_ = (pages + 63) / 64 * sizeof(uint64_t);
  void* bits = mmap(nullptr, prefaulted_bytes_, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  // Without it PrefaultMemory maps every time it is asked (no record).
  prefaulted_ = bits == MAP_FAILED ? nullptr : static_cast<uint64_t*>(bits);
  return OkStatus();
}

namespace {

// Calls visit(word, mask) for each 64-bit word of a page bitmap that holds
// bits of pages [first_page, end_page), `mask` the bits of those pages in
// it, until visit returns false. False when it did.
template <typename Visit>
bool ForEachBitmapWord(uint64_t first_page, uint64_t end_page, Visit&& visit) {
  for (uint64_t page = first_page; page < end_page;) {
    const uint64_t bit = page % 64;
    const uint64_t count = std::min<uint64_t>(64 - bit, end_page - page);
    const uint64_t mask = (count == 64 ? ~uint64_t{0} : ((uint64_t{1} << count) - 1)) << bit;
    if (!visit(page / 64, mask)) return false;
    page += count;
  }
  return true;
}

}  // namespace

void SimDevice::MarkPrefaulted(uint64_t first_page, uint64_t end_page, bool mapped) {
  if (!prefaulted_) return;
  ForEachBitmapWord(first_page, end_page, [&](uint64_t word, uint64_t mask) {
    std::atomic_ref<uint64_t> bits(prefaulted_[word]);
    if (mapped) {
      bits.fetch_or(mask, std::memory_order_relaxed);
    } else {
      bits.fetch_and(~mask, std::memory_order_relaxed);
    }
    return true;
  });
}

bool SimDevice::AllPrefaulted(uint64_t first_page, uint64_t end_page) const {
  if (!prefaulted_) return false;
  return ForEachBitmapWord(first_page, end_page, [&](uint64_t word, uint64_t mask) {
    const uint64_t have =
        std::atomic_ref<uint64_t>(prefaulted_[word]).load(std::memory_order_relaxed);
    return (have & mask) == mask;
  });
}

NodeRegistry& SimDevice::registry() const { return driver_->registry(); }

int SimDevice::user_protection() const {
  return driver_->config().protect ? PROT_NONE  // a host dereference faults
                                   : PROT_READ | PROT_WRITE;
}

uint64_t SimDevice::exec_timeout_ns() const { return driver_->options().exec_timeout_ns; }

Status SimDevice::OpenCore(uint32_t core) { return registry().AcquireCore(index(), core); }

void SimDevice::CloseCore(uint32_t core) { registry().ReleaseCore(index(), core); }

Status SimDevice::ReserveMemory(uint64_t bytes, tern_memory_category_t category) {
  return registry().ReserveMemory(index(), bytes, category);
}

void SimDevice::ReleaseMemory(uint64_t bytes, tern_memory_category_t category) {
  registry().ReleaseMemory(index(), bytes, category);
}

uint64_t SimDevice::NodeMemoryUsed(uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) const {
  return registry().NodeMemoryUsed(index(), by_category);
}

void SimDevice::MemoryFreed(uint64_t offset, uint64_t size, tern_memory_category_t category) {
  if (armed_fault_count_.load(std::memory_order_acquire) != 0) {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    std::erase_if(armed_faults_, [&](const Fault& f) {
      return f.has_range && RangesOverlap(f.offset, f.size, offset, size);
    });
    armed_fault_count_.store(static_cast<uint32_t>(armed_faults_.size()),
                             std::memory_order_release);
  }
  if (size < kDiscardThreshold) return;
  // An execution's scratch is freed when it completes and allocated again,
  // at the same place (first fit), by the next: discarding its pages made
  // every execution fault them in afresh (a 1.8 MiB scratch: ~450 faults,
  // a GPT-2 block's matmuls 2x slower). They stay committed; a later free of
  // another category over them gives them back.
  if (category == TERN_MEMORY_SCRATCH) return;
  // Give whole pages inside the block back to the host: device memory stays
  // lazily committed after a large allocation is freed.
  uint64_t begin = (offset + kPageSize - 1) & ~(kPageSize - 1);
  uint64_t end = (offset + size) & ~(kPageSize - 1);
  if (end > begin) {
    MarkPrefaulted(begin / kPageSize, end / kPageSize, false);
    fallocate(memfd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin),
              static_cast<off_t>(end - begin));
  }
}

Status SimDevice::CreateQueue(uint32_t core, const std::string& name,
                              std::unique_ptr<driver::HwQueue>* out_queue) {
  *out_queue = std::make_unique<SimQueue>(this, core, name);
  return OkStatus();
}

uint8_t* SimDevice::EnginePointer(const MemoryRef& ref, uint64_t size, Status* status) const {
  if (ref.device == nullptr) return static_cast<uint8_t*>(ref.host);
  auto* device = static_cast<const SimDevice*>(ref.device);
  const uint64_t capacity = device->info_.memory_bytes;
  if (ref.offset > capacity || size > capacity - ref.offset) {
    *status = MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                         "device memory range [{:#x}, +{}) is outside device {}'s {} bytes",
                         ref.offset, size, device->index(), capacity);
    return nullptr;
  }
  return device->engine_view_ + ref.offset;
}

Status SimDevice::Move(const Command& command) {
  Status status;
  switch (command.kind) {
    case CommandKind::kCopy: {
      uint8_t* dst = EnginePointer(command.dst, command.size, &status);
      const uint8_t* src = EnginePointer(command.src, command.size, &status);
      if (!status.ok()) return status;
      MoveBytes(dst, src, command.size);
      return OkStatus();
    }
    case CommandKind::kFill: {
      uint8_t* dst = EnginePointer(command.dst, command.size, &status);
      if (!status.ok()) return status;
      if ((command.pattern & 0xff) * 0x01010101u == command.pattern) {
        std::memset(dst, static_cast<int>(command.pattern & 0xff), command.size);
      } else {
        for (uint64_t i = 0; i + 4 <= command.size; i += 4) {
          std::memcpy(dst + i, &command.pattern, 4);
        }
      }
      return OkStatus();
    }
    default:
      return MakeStatus(TERN_ERROR_INTERNAL, "command kind {} cannot run on the DMA path",
                        driver::CommandKindName(command.kind));
  }
}

Status SimDevice::CheckPoison(const Command& command) {
  if (armed_fault_count_.load(std::memory_order_acquire) == 0) return OkStatus();
  std::lock_guard<std::mutex> lock(fault_mutex_);
  for (const Fault& fault : armed_faults_) {
    if (!fault.has_range) continue;
    for (const MemoryRef* ref : {&command.dst, &command.src}) {
      if (ref->device == this &&
          RangesOverlap(ref->offset, command.size, fault.offset, fault.size)) {
        registry().CountEcc(index(), /*uncorrected=*/true);
        return MakeStatus(TERN_ERROR_HBM_UNCORRECTABLE,
                          "uncorrectable ECC error in device {} memory at offset {:#x} "
                          "(injected); the data in that buffer is lost: free it and allocate a "
                          "new one",
                          index(), fault.offset);
      }
    }
  }
  return OkStatus();
}

Status SimDevice::CheckFaults(uint32_t core, const Command& command,
                              tern_error_class_t* out_class) {
  const bool is_dma = command.kind == CommandKind::kCopy || command.kind == CommandKind::kFill;
  if (is_dma) {
    // Poisoned memory first, on whichever device it lives: it fails every
    // command that touches it.
    for (const MemoryRef* ref : {&command.dst, &command.src}) {
      if (ref->device == nullptr) continue;
      Status poisoned = static_cast<SimDevice*>(ref->device)->CheckPoison(command);
      if (!poisoned.ok()) {
        *out_class = TERN_ERROR_CLASS_HBM_UNCORRECTABLE;
        return poisoned;
      }
    }
  }
  if (armed_fault_count_.load(std::memory_order_acquire) == 0) return OkStatus();
  std::unique_lock<std::mutex> lock(fault_mutex_);
  for (auto it = armed_faults_.begin(); it != armed_faults_.end(); ++it) {
    Fault& fault = *it;
    if (fault.has_range || fault.core != core) continue;
    if (fault.kind == TERN_FAULT_DMA_ABORT && !is_dma) continue;
    if (fault.after_commands > 0) {
      --fault.after_commands;
      continue;
    }
    const Fault fired = fault;
    armed_faults_.erase(it);
    armed_fault_count_.store(static_cast<uint32_t>(armed_faults_.size()),
                             std::memory_order_release);
    switch (fired.kind) {
      case TERN_FAULT_DMA_ABORT:
        *out_class = TERN_ERROR_CLASS_DMA_ABORT;
        return MakeStatus(TERN_ERROR_DMA_ABORT,
                          "the DMA engine of device {} core {} aborted the transfer (injected); "
                          "the destination may hold partial data: clear the queue's error and "
                          "submit the copy again",
                          index(), core);
      case TERN_FAULT_HBM_UNCORRECTABLE:
        registry().CountEcc(index(), /*uncorrected=*/true);
        *out_class = TERN_ERROR_CLASS_HBM_UNCORRECTABLE;
        return MakeStatus(TERN_ERROR_HBM_UNCORRECTABLE,
                          "uncorrectable ECC error in device {} memory while core {} ran the "
                          "command (injected); results of this command are lost",
                          index(), core);
      case TERN_FAULT_CORE_HANG: {
        // The core stops responding; only the execution timeout ends it.
        const uint64_t timeout = exec_timeout_ns();
        const uint64_t interrupts = hang_interrupts_;
        hang_wakeup_.wait_for(lock, std::chrono::nanoseconds(timeout),
                              [&] { return hang_interrupts_ != interrupts; });
        *out_class = TERN_ERROR_CLASS_EXEC_TIMEOUT;
        return MakeStatus(TERN_ERROR_EXEC_TIMEOUT,
                          "core {} of device {} did not complete the command within "
                          "TERN_EXEC_TIMEOUT ({:.3f} s): the core stopped responding (injected "
                          "hang); the command was abandoned",
                          core, index(), static_cast<double>(timeout) / 1e9);
      }
    }
  }
  return OkStatus();
}

void SimDevice::InterruptHangs() {
  std::lock_guard<std::mutex> lock(fault_mutex_);
  ++hang_interrupts_;
  hang_wakeup_.notify_all();
}

Status SimDevice::Run(uint32_t core, const Command& command, tern_error_class_t* out_class,
                      uint32_t trace_track) {
  *out_class = TERN_ERROR_CLASS_OTHER;
  TERN_RETURN_IF_ERROR(CheckFaults(core, command, out_class));
  switch (command.kind) {
    case CommandKind::kNop:
      return OkStatus();
    case CommandKind::kCopy:
    case CommandKind::kFill: {
      Status status = Move(command);
      if (!status.ok()) *out_class = TERN_ERROR_CLASS_INVALID_COMMAND;
      return status;
    }
    case CommandKind::kTimestamp:
      if (command.timestamp_out != nullptr) {
        command.timestamp_out->store(MonotonicNs(), std::memory_order_release);
      }
      return OkStatus();
    case CommandKind::kExecute:
      return ExecuteProgram(core, command, out_class, trace_track);
    case CommandKind::kHostFunction:
    case CommandKind::kHostTask:
    case CommandKind::kWait:
    case CommandKind::kSequence:
      // Handled by the queue, which owns ordering and error state.
      return OkStatus();
  }
  return MakeStatus(TERN_ERROR_INTERNAL, "unknown command kind {}", static_cast<int>(command.kind));
}

void* SimDevice::EngineAddress(uint64_t offset, uint64_t size) const {
  if (offset > info_.memory_bytes || size > info_.memory_bytes - offset) return nullptr;
  return engine_view_ + offset;
}

void SimDevice::PrefaultMemory(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || offset > info_.memory_bytes || bytes > info_.memory_bytes - offset) return;
  const uint64_t begin = offset / kPageSize * kPageSize;
  const uint64_t end = std::min<uint64_t>((offset + bytes + kPageSize - 1) / kPageSize * kPageSize,
                                          info_.memory_bytes);
  if (AllPrefaulted(begin / kPageSize, end / kPageSize)) return;
    // One call maps every page writable (Linux 5.14); older kernels refuse the
    // advice, and then a read of each page maps it (a first write still faults
    // where the kernel maps shared pages read-only until written).
#ifdef MADV_POPULATE_WRITE
  if (madvise(engine_view_ + begin, end - begin, MADV_POPULATE_WRITE) == 0) {
    MarkPrefaulted(begin / kPageSize, end / kPageSize, true);
    return;
  }
#endif
  for (uint64_t at = begin; at < end; at += kPageSize) {
    (void)*reinterpret_cast<volatile const uint8_t*>(engine_view_ + at);
  }
}

Status SimDevice::ExecuteSync(const Command& command) {
  TERN_RETURN_IF_ERROR(CheckPoison(command));
  return Move(command);
}

Status SimDevice::GetTelemetry(tern_device_telemetry_t* out) const {
  return registry().Snapshot(index(), out);
}

Status SimDevice::InjectFault(const Fault& fault) {
  if (!fault.has_range && fault.core >= info_.core_count) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE, "core {} does not exist on device {}", fault.core,
                      index());
  }
  std::lock_guard<std::mutex> lock(fault_mutex_);
  armed_faults_.push_back(fault);
  armed_fault_count_.store(static_cast<uint32_t>(armed_faults_.size()), std::memory_order_release);
  TERN_LOG_INFO("armed fault kind {} on device {} core {} after {} commands",
                static_cast<int>(fault.kind), index(), fault.core, fault.after_commands);
  return OkStatus();
}

// --- Shareable memory -------------------------------------------------------

namespace {

constexpr char kShareNamePrefix[] = "tern-buffer:";
constexpr int kShareSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// The accounting id of a shareable memfd: its inode (which no other file has
// while it lives, and which a process without the memfd cannot produce)
// mixed with the random nonce of its name (which no later memfd that reuses
// the inode number has). Never 0.
uint64_t ShareId(const struct stat& st, uint64_t nonce) {
  uint64_t h = nonce ^ (static_cast<uint64_t>(st.st_ino) * 0x9e3779b97f4a7c15ull) ^
               (static_cast<uint64_t>(st.st_dev) << 32);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

bool ParseU64(std::string_view text, int base, uint64_t* out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, base);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

Status SimDevice::MapShared(int fd, uint64_t offset, uint64_t bytes) {
  if (offset % driver::Device::kShareGranule != 0 || bytes % driver::Device::kShareGranule != 0 ||
      bytes == 0 || offset > info_.memory_bytes || bytes > info_.memory_bytes - offset) {
    return MakeStatus(TERN_ERROR_INTERNAL,
                      "shareable range [{:#x}, +{}) of device {} is not whole pages inside its "
                      "memory",
                      offset, bytes, index());
  }
  MarkPrefaulted(offset / kPageSize, (offset + bytes) / kPageSize, false);
  if (mmap(user_view_ + offset, bytes, user_protection(), MAP_SHARED | MAP_FIXED | MAP_NORESERVE,
           fd, 0) == MAP_FAILED) {
    const int err = errno;
    RestoreRange(offset, bytes);
    return ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, err, "mapping shared device memory");
  }
  if (mmap(engine_view_ + offset, bytes, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0) == MAP_FAILED) {
    const int err = errno;
    RestoreRange(offset, bytes);
    return ErrnoStatus(TERN_ERROR_HOST_OUT_OF_MEMORY, err, "mapping shared device memory");
  }
  return OkStatus();
}

void SimDevice::RestoreRange(uint64_t offset, uint64_t bytes) {
  // MAP_FIXED replaces the shared mapping in one step; should it fail (the
  // kernel out of mapping entries), the range stays on the shared object,
  // which is still correct memory, only not returned to the device.
  const off_t file_offset = static_cast<off_t>(offset);
  MarkPrefaulted(offset / kPageSize, (offset + bytes + kPageSize - 1) / kPageSize, false);
  if (mmap(user_view_ + offset, bytes, user_protection(), MAP_SHARED | MAP_FIXED | MAP_NORESERVE,
           memfd_, file_offset) == MAP_FAILED ||
      mmap(engine_view_ + offset, bytes, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_FIXED | MAP_NORESERVE, memfd_, file_offset) == MAP_FAILED) {
    TERN_LOG_WARN("device {}: cannot map device memory back over [{:#x}, +{}): {}", index(), offset,
                  bytes, std::strerror(errno));
  }
}

Status SimDevice::CreateShareable(uint64_t offset, uint64_t bytes, uint64_t size,
                                  tern_memory_category_t category) {
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), 0) != static_cast<ssize_t>(sizeof(nonce))) {
    return ErrnoStatus(TERN_ERROR_IO, errno, "getrandom for a shareable buffer's name");
  }
  const std::string name = fmt::format("{}{}:{:016x}:{}:{}", kShareNamePrefix, info_.uuid, nonce,
                                       size, static_cast<int>(category));
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(TERN_ERROR_IO, errno, "memfd_create for a shareable buffer");
  struct stat st;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fcntl(fd, F_ADD_SEALS, kShareSeals) != 0 ||
      fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(
        TERN_ERROR_HOST_OUT_OF_MEMORY, err,
        fmt::format("sizing and sealing {} bytes of shareable device memory", bytes));
  }
  const uint64_t id = ShareId(st, nonce);
  Status status = registry().ReserveShared(index(), id, bytes, category);
  if (!status.ok()) {
    close(fd);
    return status;
  }
  status = MapShared(fd, offset, bytes);
  if (!status.ok()) {
    registry().ReleaseShared(index(), id);
    close(fd);
    return status;
  }
  std::lock_guard<std::mutex> lock(shared_mutex_);
  shared_[offset] = SharedRegion{fd, bytes, id};
  return OkStatus();
}

Status SimDevice::ExportShareable(uint64_t offset, int* out_fd) {
  *out_fd = -1;
  std::lock_guard<std::mutex> lock(shared_mutex_);
  auto it = shared_.find(offset);
  if (it == shared_.end()) {
    return MakeStatus(TERN_ERROR_INTERNAL, "device {} has no shareable memory at offset {:#x}",
                      index(), offset);
  }
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(TERN_ERROR_IO, errno, "duplicating a shareable buffer's memfd");
  *out_fd = fd;
  return OkStatus();
}

Status SimDevice::InspectShareable(int fd, SharedMemoryDesc* out_desc) {
  *out_desc = SharedMemoryDesc{};
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd {} is not an open file descriptor; pass the descriptor that "
                      "tern_buffer_export() returned (or the one received from the exporting "
                      "process)",
                      fd);
  }
  // A memfd's link in /proc reads "/memfd:<name> (deleted)".
  char link[512];
  const ssize_t n = readlink(fmt::format("/proc/self/fd/{}", fd).c_str(), link, sizeof(link) - 1);
  std::string_view target(link, n > 0 ? static_cast<size_t>(n) : 0);
  const std::string memfd_prefix = std::string("/memfd:") + kShareNamePrefix;
  const std::string_view deleted = " (deleted)";
  if (!S_ISREG(st.st_mode) || !target.starts_with(memfd_prefix)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd {} ({}) is not a device buffer exported by tern_buffer_export(); pass "
                      "the descriptor that it returned",
                      fd, target.empty() ? "unknown file" : std::string(target));
  }
  std::string_view name = target.substr(memfd_prefix.size());
  if (name.ends_with(deleted)) name.remove_suffix(deleted.size());
  // <uuid>:<nonce>:<size>:<category>
  std::string_view fields[4];
  size_t count = 0;
  while (count < 4) {
    const size_t colon = name.find(':');
    fields[count++] = name.substr(0, colon);
    if (colon == std::string_view::npos) break;
    name.remove_prefix(colon + 1);
  }
  uint64_t nonce = 0, size = 0, category = 0;
  if (count != 4 || fields[0].size() != 36 || !ParseU64(fields[1], 16, &nonce) ||
      !ParseU64(fields[2], 10, &size) || !ParseU64(fields[3], 10, &category) || size == 0 ||
      category >= TERN_MEMORY_CATEGORY_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd {} ({}) is named like an exported device buffer but its name does not "
                      "parse; pass the descriptor that tern_buffer_export() returned",
                      fd, std::string(target));
  }
  if (fields[0] != info_.uuid) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd {} holds a buffer of the device with UUID {}, not of device {} (UUID "
                      "{}); import it on the device it was allocated on (tern_device_get_info "
                      "gives each device's uuid)",
                      fd, std::string(fields[0]), index(), info_.uuid);
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  const uint64_t bytes =
      (size + driver::Device::kShareGranule - 1) & ~(driver::Device::kShareGranule - 1);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd {} is not sealed against resizing, so it is not a buffer exported by "
                      "tern_buffer_export() (whose memory cannot shrink under an importer)",
                      fd);
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "fd {} holds {} bytes, but a buffer of {} bytes needs {}: it was truncated "
                      "or is not a buffer exported by tern_buffer_export()",
                      fd, static_cast<uint64_t>(st.st_size), size, bytes);
  }
  out_desc->size = size;
  out_desc->bytes = bytes;
  out_desc->category = static_cast<tern_memory_category_t>(category);
  out_desc->id = ShareId(st, nonce);
  return OkStatus();
}

Status SimDevice::ImportShareable(int fd, uint64_t offset, const SharedMemoryDesc& desc) {
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return ErrnoStatus(TERN_ERROR_IO, errno, "duplicating an imported buffer's fd");
  Status status = registry().ReserveShared(index(), desc.id, desc.bytes, desc.category);
  if (!status.ok()) {
    close(own);
    return status;
  }
  status = MapShared(own, offset, desc.bytes);
  if (!status.ok()) {
    registry().ReleaseShared(index(), desc.id);
    close(own);
    return status;
  }
  std::lock_guard<std::mutex> lock(shared_mutex_);
  shared_[offset] = SharedRegion{own, desc.bytes, desc.id};
  return OkStatus();
}

void SimDevice::ReleaseShareable(uint64_t offset) {
  SharedRegion region;
  {
    std::lock_guard<std::mutex> lock(shared_mutex_);
    auto it = shared_.find(offset);
    if (it == shared_.end()) return;
    region = it->second;
    shared_.erase(it);
  }
  RestoreRange(offset, region.bytes);
  close(region.fd);
  registry().ReleaseShared(index(), region.id);
}

// --- SimDriver --------------------------------------------------------------

SimDriver::SimDriver(const driver::DriverOptions& options, SimConfig config)
    : options_(options), config_(std::move(config)) {}

Status SimDriver::Init() {
  PrefaultKernelCode();
  if (!config_.topology_explicit) {
    // No topology asked for: join the node as it is, if a process set it up;
    // the defaults apply only to a node this process creates.
    std::unique_ptr<NodeRegistry> probe;
    if (NodeRegistry::Open(config_.node_name, NodeRegistry::Topology{},
                           NodeRegistry::Role::kObserver, &probe)
            .ok()) {
      config_.device_count = probe->topology().device_count;
      config_.cores_per_device = probe->topology().cores_per_device;
      config_.hbm_bytes = probe->topology().hbm_bytes;
      TERN_LOG_INFO("sim node '{}' exists: adopting its topology {}x{}x{} bytes", config_.node_name,
                    config_.device_count, config_.cores_per_device, config_.hbm_bytes);
    }
  }
  NodeRegistry::Topology topology{config_.device_count, config_.cores_per_device,
                                  config_.hbm_bytes};
  TERN_RETURN_IF_ERROR(NodeRegistry::Open(config_.node_name, topology,
                                          NodeRegistry::Role::kParticipant, &registry_));
  std::vector<DevicePlacement> placements = PlaceDevices(config_.device_count);
  for (uint32_t i = 0; i < config_.device_count; ++i) {
    driver::DeviceStaticInfo info;
    info.physical_index = i;
    info.core_count = config_.cores_per_device;
    info.memory_bytes = config_.hbm_bytes;
    info.memory_alignment = 64;
    info.numa_node = placements[i].numa_node;
    info.cpu_affinity = placements[i].cpu_affinity;
    info.name = "tern-sim trn2";
    info.uuid = DeviceUuid(config_.node_name, i);
    info.bus_id = fmt::format("sim:{}:{}", config_.node_name, i);
    info.driver_version =
        fmt::format("sim {}.{}.{}", TERN_VERSION_MAJOR, TERN_VERSION_MINOR, TERN_VERSION_PATCH);
    devices_.push_back(std::move(info));
  }
  return OkStatus();
}

Status SimDriver::Enumerate(std::vector<driver::DeviceStaticInfo>* out_devices) {
  *out_devices = devices_;
  return OkStatus();
}

Status SimDriver::OpenDevice(uint32_t physical_index, std::unique_ptr<driver::Device>* out_device) {
  out_device->reset();
  if (physical_index >= devices_.size()) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE, "device {} does not exist: the node has {} devices",
                      physical_index, devices_.size());
  }
  auto device = std::make_unique<SimDevice>(this, devices_[physical_index]);
  TERN_RETURN_IF_ERROR(device->Init());
  *out_device = std::move(device);
  return OkStatus();
}

void SimDriver::AfterForkInChild() {
  if (registry_) registry_->AfterForkInChild();
}

Status CreateSimDriver(const driver::DriverOptions& options, std::unique_ptr<driver::Driver>* out) {
  out->reset();
  SimConfig config;
  TERN_RETURN_IF_ERROR(ConfigFromEnvironment(&config));
  // The environment variables that engine threads consult are read here, on
  // the thread that calls tern_init: getenv may crash while another thread
  // of the program calls setenv, and engine threads run while it does.
  ReadByteMoverEnvironment();
  kernels::ReadStreamingStoresEnvironment();
  StartKernelPool();  // reads TERN_SIM_KERNEL_THREADS
  auto driver = std::make_unique<SimDriver>(options, std::move(config));
  TERN_RETURN_IF_ERROR(driver->Init());
  *out = std::move(driver);
  return OkStatus();
}

}  // namespace tern::sim
