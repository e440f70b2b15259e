#include "driver_shim/sim/node_registry.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <pwd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tern::sim {

namespace node_layout {

constexpr uint32_t kMaxDevices = NodeRegistry::kMaxDevices;
constexpr uint32_t kMaxCores = NodeRegistry::kMaxCoresPerDevice;
constexpr uint32_t kMaxProcesses = NodeRegistry::kMaxProcesses;
constexpr uint32_t kCommandWords = 4;  // 32 characters, NUL-padded

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint64_t>) == 8 && sizeof(std::atomic<int32_t>) == 4);
static_assert(kMaxCores <= 32, "cores_owned is a 32-bit mask");

enum SlotState : uint32_t { kSlotFree = 0, kSlotInUse = 1, kSlotReaping = 2 };

// Commands are stored as atomic 8-byte words so that readers in other threads
// or processes never race with a writer (a torn name is harmless; UB is not).
struct alignas(64) CoreRecord {
  std::atomic<int32_t> owner_pid;  // 0: none; only meaningful while the core lock is held
  std::atomic<uint64_t> owner_command[kCommandWords];
  CoreCounters counters;
};

// No node-wide memory totals: a process accounts only in its own slot, and the
// node's usage is the sum over slots, so no crash can leave a total that
// disagrees with the slots (there is no second copy to disagree).
struct alignas(64) DeviceRecord {
  std::atomic<uint64_t> ecc_corrected;
  std::atomic<uint64_t> ecc_uncorrected;
  CoreRecord cores[kMaxCores];
};

// The process's whole ledger for one device: the only place its memory is
// counted. Reaping a dead process zeroes it.
struct SlotDeviceUsage {
  std::atomic<uint64_t> used_by_category[TERN_MEMORY_CATEGORY_COUNT];
  std::atomic<uint32_t> cores_owned;  // bit c: core c
};

// One shared allocation (tern_buffer_export / tern_buffer_import) that the
// process holds: `id` names the allocation node-wide (0: the entry is free),
// `info` packs its bytes, device and category (PackShared). Every holder
// lists it; the node's sum counts each id once, so the memory stays charged
// while any live process holds it and leaves the sum when the last holder
// frees it or is reaped.
struct SharedHold {
  std::atomic<uint64_t> id;
  std::atomic<uint64_t> info;
};

constexpr uint32_t kMaxSharedHolds = NodeRegistry::kMaxSharedPerProcess;

struct alignas(64) ProcessSlot {
  std::atomic<uint32_t> state;  // SlotState
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> command[kCommandWords];
  SlotDeviceUsage devices[kMaxDevices];
  // Entries of `shared` in use (or being filled): readers skip the array
  // when it is 0, so the node's sum costs nothing while nothing is shared.
  std::atomic<uint32_t> shared_count;
  SharedHold shared[kMaxSharedHolds];
};

// magic, version and generation keep their offsets in every layout version so
// that any version can recognise (and safely reformat) another's file.
struct alignas(64) Header {
  std::atomic<uint64_t> magic;  // written last when formatting
  uint32_t version;             // kLayoutVersion
  uint32_t reserved;
  std::atomic<uint64_t> generation;  // bumped by every format
  uint32_t device_count;
  uint32_t cores_per_device;
  uint64_t hbm_bytes;
};

constexpr uint64_t kMagic = 0x314d49534e524554ull;  // "TERNSIM1" in little-endian bytes
// Bump whenever SharedNodeState changes shape (e.g. TERN_ERROR_CLASS_COUNT grows).
// 4: memory counted only in process slots; 5: shared allocations held per slot.
constexpr uint32_t kLayoutVersion = 5;

}  // namespace node_layout

// Header fields only change under the init lock; everything else is atomic.
struct SharedNodeState {
  node_layout::Header header;
  node_layout::DeviceRecord devices[node_layout::kMaxDevices];
  node_layout::ProcessSlot slots[node_layout::kMaxProcesses];
};

using namespace node_layout;  // NOLINT: this file is the layout's only user

namespace {

constexpr size_t kFileSize = (sizeof(SharedNodeState) + 4095) & ~size_t{4095};

// Lock bytes live far past the data (locks beyond EOF are allowed) at offsets
// that no layout version moves, so a live process is visible to any version.
constexpr off_t kLockBase = off_t{1} << 32;
constexpr off_t kInitLock = kLockBase;
off_t SlotLock(uint32_t slot) { return kLockBase + 64 + slot; }
off_t CoreLock(uint32_t device, uint32_t core) {
  return kLockBase + 4096 + static_cast<off_t>(device) * kMaxCores + core;
}

struct flock ByteLock(short type, off_t offset) {
  struct flock fl = {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = offset;
  fl.l_len = 1;
  fl.l_pid = 0;  // required by the OFD commands
  return fl;
}

// Returns 0, or errno: EAGAIN/EACCES when another open file description holds it.
int TryLockByte(int fd, off_t offset) {
  struct flock fl = ByteLock(F_WRLCK, offset);
  while (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

bool IsHeldError(int err) { return err == EAGAIN || err == EACCES; }

void UnlockByte(int fd, off_t offset) {
  struct flock fl = ByteLock(F_UNLCK, offset);
  while (fcntl(fd, F_OFD_SETLK, &fl) != 0 && errno == EINTR) {
  }
}

// True when an open file description other than `fd`'s holds the byte. Our
// own locks never conflict with us, so they read as "not held". Errors read
// as held: the callers use this to decide that nothing is live.
bool HeldByOther(int fd, off_t offset) {
  struct flock fl = ByteLock(F_WRLCK, offset);
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// A shared hold's `info` word: bytes (at most kMaxHbmBytes, 41 bits) above
// 8 bits of device (4) and category (4).
uint64_t PackShared(uint64_t bytes, uint32_t device, uint32_t category) {
  return (bytes << 8) | (uint64_t{device & 0xf} << 4) | (category & 0xf);
}
uint64_t SharedBytes(uint64_t info) { return info >> 8; }
uint32_t SharedDevice(uint64_t info) { return static_cast<uint32_t>((info >> 4) & 0xf); }
uint32_t SharedCategory(uint64_t info) { return static_cast<uint32_t>(info & 0xf); }

// How long Open waits for another process's short critical section (the init
// lock) before it gives up and names what holds it.
constexpr int kDefaultLockTimeoutMs = 5000;

int LockTimeoutMs() {
  const char* text = std::getenv("TERN_SIM_NODE_LOCK_TIMEOUT_MS");
  if (text == nullptr || *text == '\0') return kDefaultLockTimeoutMs;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > 600000) return kDefaultLockTimeoutMs;
  return static_cast<int>(value);
}

// The processes other than this one that have the file open, "pid (command)"
// each, found through /proc: the kernel does not name the holder of an OFD
// lock (F_OFD_GETLK reports pid -1). Processes of other users are invisible
// to an unprivileged caller.
std::vector<std::string> ProcessesWithFileOpen(int fd) {
  std::vector<std::string> found;
  struct stat target;
  if (fstat(fd, &target) != 0) return found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  const pid_t self = getpid();
  while (struct dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    const std::string fd_dir = fmt::format("/proc/{}/fd", pid);
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    bool has_it = false;
    while (struct dirent* fd_entry = readdir(fds)) {
      struct stat st;
      if (fd_entry->d_name[0] == '.') continue;
      if (stat((fd_dir + "/" + fd_entry->d_name).c_str(), &st) == 0 && st.st_dev == target.st_dev &&
          st.st_ino == target.st_ino) {
        has_it = true;
        break;
      }
    }
    closedir(fds);
    if (!has_it) continue;
    std::string command = "?";
    const int comm = open(fmt::format("/proc/{}/comm", pid).c_str(), O_RDONLY | O_CLOEXEC);
    if (comm >= 0) {
      char buf[64] = {};
      const ssize_t n = read(comm, buf, sizeof(buf) - 1);
      close(comm);
      if (n > 0) command.assign(buf, static_cast<size_t>(n - (buf[n - 1] == '\n' ? 1 : 0)));
    }
    found.push_back(fmt::format("{} ({})", pid, command));
    if (found.size() == 8) break;
  }
  closedir(proc);
  return found;
}

// "held by ..." for messages about a lock or a file that another process has.
std::string DescribeOpeners(int fd) {
  const std::vector<std::string> openers = ProcessesWithFileOpen(fd);
  if (openers.empty()) {
    return "a process that this user cannot see (of another user, or in another PID namespace)";
  }
  return fmt::format("one of the processes that have it open: {}", fmt::join(openers, ", "));
}

// Takes the init lock, waiting at most LockTimeoutMs(): a process stopped (or
// malicious) inside its critical section must not hang every other process.
Status LockInitBounded(int fd, const std::string& path) {
  const int timeout_ms = LockTimeoutMs();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    const int err = TryLockByte(fd, kInitLock);
    if (err == 0) return OkStatus();
    if (!IsHeldError(err)) {
      return ErrnoStatus(TERN_ERROR_IO, err,
                         fmt::format("locking sim node state \"{}\" (fcntl F_OFD_SETLK)", path));
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
  return MakeStatus(TERN_ERROR_TIMEOUT,
                    "sim node file \"{}\": its init lock (byte {}) has been held for more than {} "
                    "ms by {}; a process opening the node takes it for a few milliseconds at most, "
                    "so that process is stopped or misbehaving: resume or stop it, or use another "
                    "TERN_SIM_NODE (TERN_SIM_NODE_LOCK_TIMEOUT_MS sets this wait)",
                    path, static_cast<int64_t>(kInitLock), timeout_ms, DescribeOpeners(fd));
}

std::string UserName(uid_t uid) {
  struct passwd entry;
  struct passwd* result = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &entry, buf, sizeof(buf), &result) == 0 && result != nullptr) {
    return fmt::format("uid {} ({})", uid, result->pw_name);
  }
  return fmt::format("uid {}", uid);
}

// A node file is trusted only when this user created it, nobody else can open
// it, and it is a plain file with one name: then no other user can lock,
// read, rewrite or truncate it.
Status CheckNodeFileTrusted(const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "sim node file \"{}\" is not a plain file with a single name (mode {:o}, {} "
                      "links), so tern does not trust it; remove it (rm \"{}\", as its owner or "
                      "root), or use another TERN_SIM_NODE",
                      path, st.st_mode, st.st_nlink, path);
  }
  if (st.st_uid != geteuid()) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "sim node file \"{}\" belongs to {}, not to this process's {}: a sim node "
                      "is private to the user who created it; use another TERN_SIM_NODE, ask its "
                      "owner to stop using it, or remove it (rm \"{}\", as its owner or root)",
                      path, UserName(st.st_uid), UserName(geteuid()), path);
  }
  if ((st.st_mode & 0077) != 0) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "sim node file \"{}\" has mode {:04o}, but tern creates it 0600 (owner "
                      "only): another user may have opened it; stop the processes that use it "
                      "and remove it (rm \"{}\"), or use another TERN_SIM_NODE",
                      path, st.st_mode & 07777, path);
  }
  return OkStatus();
}

// Older tern created node files 0644. One of those that belongs to this user
// and that no process holds a lock on (nobody uses it: every participant
// holds its slot's lock) is stale: it is unlinked so that a new owner-only
// file can be created. Unlinking rather than chmod leaves a descriptor that
// another user may have opened on the old file pointing at the old file.
// Returns true when the path was unlinked.
bool RemoveStaleWideModeFile(int fd, const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid() ||
      (st.st_mode & 0077) == 0) {
    return false;
  }
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = 0;
  probe.l_len = 0;  // the whole file
  if (fcntl(fd, F_OFD_GETLK, &probe) != 0 || probe.l_type != F_UNLCK) return false;
  struct stat now;
  if (lstat(path.c_str(), &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    return false;
  }
  return unlink(path.c_str()) == 0;
}

// Opens the node file: creates it owner-only with O_EXCL, or opens the
// existing one, and checks it with fstat (on the descriptor: no race with a
// rename). A participant (`create`) replaces a stale file of this user's with
// a wider mode (RemoveStaleWideModeFile). `*fd` is -1 on error.
Status OpenNodeFile(const std::string& path, bool create, int* fd, bool may_replace = true) {
  *fd = -1;
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (create) {
      *fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_CREAT | O_EXCL, 0600);
      if (*fd >= 0) {
        // The umask may have narrowed the mode; the owner must read and write.
        if (fchmod(*fd, 0600) != 0) {
          const int err = errno;
          close(*fd);
          *fd = -1;
          return ErrnoStatus(TERN_ERROR_IO, err, fmt::format("fchmod(\"{}\", 0600)", path));
        }
        return OkStatus();
      }
      if (errno != EEXIST) break;
    }
    *fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (*fd >= 0) break;
    if (errno != ENOENT || !create) break;  // removed between the two opens: create it again
  }
  if (*fd < 0) {
    const int err = errno;
    struct stat st;
    if (err != ENOENT && lstat(path.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) {
        return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                          "sim node file \"{}\" is a symbolic link, which tern never follows; "
                          "remove it (rm \"{}\"), or use another TERN_SIM_NODE",
                          path, path);
      }
      TERN_RETURN_IF_ERROR(CheckNodeFileTrusted(st, path));
    }
    return ErrnoStatus(err == ENOENT ? TERN_ERROR_UNAVAILABLE : TERN_ERROR_IO, err,
                       fmt::format("opening sim node state \"{}\"", path));
  }
  struct stat st;
  const bool have_stat = fstat(*fd, &st) == 0;
  Status status = have_stat ? CheckNodeFileTrusted(st, path)
                            : ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("fstat(\"{}\")", path));
  if (!status.ok()) {
    const bool replaced =
        create && may_replace && have_stat && RemoveStaleWideModeFile(*fd, st, path);
    close(*fd);
    *fd = -1;
    if (replaced) return OpenNodeFile(path, create, fd, /*may_replace=*/false);
  }
  return status;
}

void StoreCommand(std::atomic<uint64_t> (&words)[kCommandWords], std::string_view command) {
  char buf[kCommandWords * 8] = {};
  std::memcpy(buf, command.data(), std::min(command.size(), sizeof(buf) - 1));
  for (uint32_t i = 0; i < kCommandWords; ++i) {
    uint64_t word;
    std::memcpy(&word, buf + i * 8, 8);
    words[i].store(word, std::memory_order_relaxed);
  }
}

void LoadCommand(const std::atomic<uint64_t> (&words)[kCommandWords], char out[32]) {
  for (uint32_t i = 0; i < kCommandWords; ++i) {
    uint64_t word = words[i].load(std::memory_order_relaxed);
    std::memcpy(out + i * 8, &word, 8);
  }
  out[31] = '\0';
}

std::string ReadOwnCommand() {
  char buf[64] = {};
  ssize_t n = -1;
  int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
  }
  std::string command(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!command.empty() && (command.back() == '\n' || command.back() == '\0')) {
    command.pop_back();
  }
  return command.empty() ? "?" : command.substr(0, 31);
}

std::string FormatBytes(uint64_t bytes) {
  constexpr uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;
  if (bytes >= kTiB) return fmt::format("{:.2f} TiB", static_cast<double>(bytes) / kTiB);
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB);
  if (bytes >= kMiB) return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / kMiB);
  if (bytes >= kKiB) return fmt::format("{:.2f} KiB", static_cast<double>(bytes) / kKiB);
  return fmt::format("{} bytes", bytes);
}

const char* CategoryName(uint32_t category) {
  static constexpr const char* kNames[TERN_MEMORY_CATEGORY_COUNT] = {
      "tensors", "constants", "code", "scratch", "collectives", "runtime"};
  return category < TERN_MEMORY_CATEGORY_COUNT ? kNames[category] : "unknown";
}

std::string TopologyString(const NodeRegistry::Topology& t) {
  return fmt::format("{} device(s) x {} core(s) x {} HBM", t.device_count, t.cores_per_device,
                     FormatBytes(t.hbm_bytes));
}

std::string NodePath(const std::string& node_name) { return "/dev/shm/tern-sim-" + node_name; }

Status ValidateNodeName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  }
  if (ok) return OkStatus();
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                    "invalid sim node name '{}': it must be 1 to 64 characters from "
                    "[A-Za-z0-9._-]; fix TERN_SIM_NODE",
                    name);
}

Status ValidateTopology(const NodeRegistry::Topology& t) {
  if (t.device_count >= 1 && t.device_count <= kMaxDevices && t.cores_per_device >= 1 &&
      t.cores_per_device <= kMaxCores && t.hbm_bytes > 0 &&
      t.hbm_bytes <= NodeRegistry::kMaxHbmBytes) {
    return OkStatus();
  }
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                    "invalid sim topology {} devices x {} cores x {} bytes: the simulator supports "
                    "1 to {} devices of 1 to {} cores and 1 byte to {} of HBM; fix "
                    "TERN_SIM_TOPOLOGY",
                    t.device_count, t.cores_per_device, t.hbm_bytes, kMaxDevices, kMaxCores,
                    FormatBytes(NodeRegistry::kMaxHbmBytes));
}

}  // namespace

NodeRegistry::NodeRegistry(std::string node_name, std::string path, Role role)
    : node_name_(std::move(node_name)),
      path_(std::move(path)),
      role_(role),
      pid_(getpid()),
      command_(ReadOwnCommand()) {}

Status NodeRegistry::Open(const std::string& node_name, const Topology& topology, Role role,
                          std::unique_ptr<NodeRegistry>* out) {
  if (out == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "NodeRegistry::Open: `out` is null");
  }
  out->reset();
  TERN_RETURN_IF_ERROR(ValidateNodeName(node_name));
  const bool adopt = role == Role::kObserver && topology == Topology{};
  if (!adopt) TERN_RETURN_IF_ERROR(ValidateTopology(topology));

  std::unique_ptr<NodeRegistry> registry(new NodeRegistry(node_name, NodePath(node_name), role));
  Status opened = OpenNodeFile(registry->path_, !adopt, &registry->fd_);
  if (!opened.ok()) {
    if (adopt && opened.code() == TERN_ERROR_UNAVAILABLE) {
      return MakeStatus(TERN_ERROR_UNAVAILABLE,
                        "sim node '{}' does not exist ({} is missing): no tern process has used "
                        "it yet; check TERN_SIM_NODE, or start a tern program first",
                        node_name, registry->path_);
    }
    if (opened.code() != TERN_ERROR_IO && opened.code() != TERN_ERROR_UNAVAILABLE) return opened;
    return MakeStatus(TERN_ERROR_IO,
                      "{}; check that /dev/shm is a writable tmpfs, or use another TERN_SIM_NODE",
                      opened.message());
  }

  TERN_RETURN_IF_ERROR(LockInitBounded(registry->fd_, registry->path_));
  Status status = registry->AttachLocked(topology, adopt);
  if (status.ok() && role == Role::kParticipant) status = registry->ClaimSlotLocked();
  UnlockByte(registry->fd_, kInitLock);
  if (!status.ok()) return status;

  registry->ReapImpl();
  *out = std::move(registry);
  return OkStatus();
}

Status NodeRegistry::RemoveNode(const std::string& node_name) {
  TERN_RETURN_IF_ERROR(ValidateNodeName(node_name));
  const std::string path = NodePath(node_name);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("unlink(\"{}\")", path));
  }
  return OkStatus();
}

Status NodeRegistry::MapLocked() {
  void* addr = mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (addr == MAP_FAILED) {
    return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("mmap(\"{}\")", path_));
  }
  state_ = std::launder(static_cast<SharedNodeState*>(addr));
  return OkStatus();
}

Status NodeRegistry::AttachLocked(const Topology& wanted, bool adopt) {
  struct stat st;
  if (fstat(fd_, &st) != 0) {
    return ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("fstat(\"{}\")", path_));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  bool live = false;
  for (uint32_t slot = 0; slot < kMaxProcesses && !live; ++slot) {
    live = HeldByOther(fd_, SlotLock(slot));
  }
  if (size < kFileSize && live) {
    // Someone with the owner's rights shrank the file under live processes.
    // Growing it back keeps them from dying of SIGBUS; their accounting (now
    // zeroes) cannot be recovered, and formatting would hide that.
    const bool restored = ftruncate(fd_, kFileSize) == 0;
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "sim node file \"{}\" was truncated to {} bytes (it must hold {}) while live "
                      "processes use it: {}; their cores and memory accounting are lost{}. Stop "
                      "those processes, then remove the file (rm \"{}\"), or use another "
                      "TERN_SIM_NODE",
                      path_, size, kFileSize, DescribeOpeners(fd_),
                      restored ? " (its size is restored so that they do not crash)" : "", path_);
  }
  bool layout_known = false;
  if (size >= kFileSize) {
    TERN_RETURN_IF_ERROR(MapLocked());
    const Header& header = state_->header;
    const Topology existing{header.device_count, header.cores_per_device, header.hbm_bytes};
    // ValidateTopology bounds every header field (devices, cores, 1 TiB of
    // HBM), so nothing read from here can index past the layout's arrays.
    layout_known = header.magic.load(std::memory_order_acquire) == kMagic &&
                   header.version == kLayoutVersion && ValidateTopology(existing).ok();
    if (layout_known && (adopt || existing == wanted)) {
      topology_ = existing;
      generation_ = header.generation.load(std::memory_order_acquire);
      return OkStatus();
    }
  }
  if (adopt) {
    return MakeStatus(size == 0 ? TERN_ERROR_UNAVAILABLE : TERN_ERROR_INCOMPATIBLE,
                      "sim node '{}' ({}) {}; check TERN_SIM_NODE, or start a tern program of "
                      "this version first",
                      node_name_, path_,
                      size == 0 ? "has not been set up by any tern process yet"
                                : "holds state of another tern version or layout, or a header "
                                  "outside the simulator's limits");
  }
  if (live) return IncompatibleLocked(wanted, layout_known);
  return FormatLocked(wanted, size);
}

Status NodeRegistry::IncompatibleLocked(const Topology& wanted, bool layout_known) const {
  std::vector<std::string> live;
  for (uint32_t slot = 0; slot < kMaxProcesses; ++slot) {
    if (!HeldByOther(fd_, SlotLock(slot))) continue;
    if (layout_known) {
      char command[32];
      LoadCommand(state_->slots[slot].command, command);
      live.push_back(fmt::format("{} ({})", state_->slots[slot].pid.load(), command));
    } else {
      live.push_back("?");
    }
  }
  if (!layout_known) {
    return MakeStatus(TERN_ERROR_INCOMPATIBLE,
                      "sim node '{}' ({}) holds state of another tern version or layout and {} "
                      "live process(es) still use it; stop them, or use another TERN_SIM_NODE",
                      node_name_, path_, live.size());
  }
  const Header& header = state_->header;
  const Topology existing{header.device_count, header.cores_per_device, header.hbm_bytes};
  return MakeStatus(TERN_ERROR_INCOMPATIBLE,
                    "sim node '{}' is in use with topology {} by live process(es) {}, but this "
                    "process asked for {}; run with the same TERN_SIM_TOPOLOGY as those "
                    "processes, or use another TERN_SIM_NODE",
                    node_name_, TopologyString(existing), fmt::join(live, ", "),
                    TopologyString(wanted));
}

Status NodeRegistry::FormatLocked(const Topology& topology, uint64_t file_size) {
  if (file_size < kFileSize && ftruncate(fd_, kFileSize) != 0) {
    return MakeStatus(
        TERN_ERROR_IO, "{}; is /dev/shm full?",
        ErrnoStatus(TERN_ERROR_IO, errno, fmt::format("ftruncate(\"{}\")", path_)).message());
  }
  if (state_ == nullptr) TERN_RETURN_IF_ERROR(MapLocked());
  // Observers of the old format notice the new generation and fail cleanly.
  const uint64_t generation = state_->header.generation.load() + 1;
  state_ = new (static_cast<void*>(state_)) SharedNodeState();  // zeroes every field
  Header& header = state_->header;
  header.version = kLayoutVersion;
  header.device_count = topology.device_count;
  header.cores_per_device = topology.cores_per_device;
  header.hbm_bytes = topology.hbm_bytes;
  header.generation.store(generation == 0 ? 1 : generation);
  header.magic.store(kMagic, std::memory_order_release);
  topology_ = topology;
  generation_ = header.generation.load();
  return OkStatus();
}

Status NodeRegistry::ClaimSlotLocked() {
  for (uint32_t slot = 0; slot < kMaxProcesses; ++slot) {
    const int err = TryLockByte(fd_, SlotLock(slot));
    if (IsHeldError(err)) continue;
    if (err != 0) {
      return ErrnoStatus(
          TERN_ERROR_IO, err,
          fmt::format("locking a process slot of \"{}\" (fcntl F_OFD_SETLK)", path_));
    }
    ProcessSlot& s = state_->slots[slot];
    // The lock is ours, so whatever the slot holds (a dead process's ledger,
    // or garbage) belongs to nobody: clear it before using the slot.
    ReapSlotLocked(slot);
    s.pid.store(pid_);
    StoreCommand(s.command, command_);
    s.state.store(kSlotInUse);  // seq_cst: NodeMemoryUsed skips free slots
    slot_ = static_cast<int32_t>(slot);
    return OkStatus();
  }
  return MakeStatus(TERN_ERROR_UNAVAILABLE,
                    "all {} process slots of sim node '{}' are held by live processes; stop "
                    "some of them, or use another TERN_SIM_NODE",
                    kMaxProcesses, node_name_);
}

NodeRegistry::~NodeRegistry() {
  // A child that forked without AfterForkInChild() shares our open file
  // description: unlocking from it would free the parent's cores.
  if (getpid() != pid_) forked_.store(true);
  if (state_ != nullptr && !forked_.load() && slot_ >= 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (uint32_t d = 0; d < topology_.device_count; ++d) {
        for (uint32_t c = 0; c < topology_.cores_per_device; ++c) {
          if (owned_cores_[d] & (1u << c)) ReleaseCoreLocked(d, c);
        }
      }
    }
    // We hold our slot's lock, so "reaping" it returns our memory to the node.
    ReapSlotLocked(static_cast<uint32_t>(slot_));
    UnlockByte(fd_, SlotLock(slot_));
  }
  if (state_ != nullptr) munmap(state_, kFileSize);
  if (fd_ >= 0) close(fd_);
}

Status NodeRegistry::CheckUsable(const char* what) const {
  if (!forked_.load(std::memory_order_relaxed)) return OkStatus();
  return MakeStatus(TERN_ERROR_FORKED,
                    "{}: this process is a fork of process {}, which had opened sim node '{}'; a "
                    "forked child cannot use its parent's devices: initialize tern in the child "
                    "after exec, or fork before initializing tern",
                    what, pid_, node_name_);
}

Status NodeRegistry::CheckIndex(uint32_t device, uint32_t core, bool check_core) const {
  if (device >= topology_.device_count) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                      "device {} does not exist: sim node '{}' has {} device(s) "
                      "(TERN_SIM_TOPOLOGY)",
                      device, node_name_, topology_.device_count);
  }
  if (check_core && core >= topology_.cores_per_device) {
    return MakeStatus(TERN_ERROR_OUT_OF_RANGE,
                      "core {} of device {} does not exist: sim node '{}' has {} core(s) per "
                      "device (TERN_SIM_TOPOLOGY)",
                      core, device, node_name_, topology_.cores_per_device);
  }
  return OkStatus();
}

int32_t NodeRegistry::CoreOwner(uint32_t device, uint32_t core, char command[32]) const {
  const CoreRecord& record = state_->devices[device].cores[core];
  // The owner writes its command before its pid; re-reading the pid catches
  // a change of owner while we copied the command.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int32_t pid = record.owner_pid.load(std::memory_order_acquire);
    if (pid == 0) break;
    LoadCommand(record.owner_command, command);
    if (record.owner_pid.load(std::memory_order_acquire) == pid) return pid;
  }
  // Not published in the core record (yet): look for a slot that claims it.
  for (const ProcessSlot& slot : state_->slots) {
    if (slot.state.load(std::memory_order_acquire) == kSlotInUse &&
        (slot.devices[device].cores_owned.load() & (1u << core)) != 0) {
      LoadCommand(slot.command, command);
      return slot.pid.load();
    }
  }
  command[0] = '\0';
  return 0;
}

Status NodeRegistry::AcquireCore(uint32_t device, uint32_t core) {
  TERN_RETURN_IF_ERROR(CheckUsable("acquiring a core"));
  if (slot_ < 0) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "cannot acquire core {} of device {}: this node registry was opened as an "
                      "observer, which owns nothing; open it as a participant",
                      core, device);
  }
  TERN_RETURN_IF_ERROR(CheckIndex(device, core, true));
  const uint32_t bit = 1u << core;
  std::unique_lock<std::mutex> lock(mu_);
  if (owned_cores_[device] & bit) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "core {} of device {} is already owned by this process; use the core you "
                      "have, or release it before acquiring it again",
                      core, device);
  }
  const int err = TryLockByte(fd_, CoreLock(device, core));
  if (err == 0) {
    CoreRecord& record = state_->devices[device].cores[core];
    StoreCommand(record.owner_command, command_);
    record.owner_pid.store(pid_, std::memory_order_release);
    state_->slots[slot_].devices[device].cores_owned.fetch_or(bit);
    owned_cores_[device] |= bit;
    return OkStatus();
  }
  lock.unlock();
  if (!IsHeldError(err)) {
    return ErrnoStatus(TERN_ERROR_IO, err,
                       fmt::format("locking core {} of device {} in \"{}\" (fcntl F_OFD_SETLK)",
                                   core, device, path_));
  }
  // The owner publishes its pid right after taking the lock; give it a moment.
  char command[32];
  int32_t owner = CoreOwner(device, core, command);
  for (int i = 0; owner == 0 && i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    owner = CoreOwner(device, core, command);
  }
  if (owner == 0) {
    return MakeStatus(TERN_ERROR_BUSY,
                      "core {} of device {} is owned by another process that has not published "
                      "its pid yet; stop that process, or pick other cores with "
                      "TERN_VISIBLE_CORES",
                      core, device);
  }
  return MakeStatus(TERN_ERROR_BUSY,
                    "core {} of device {} is owned by process {} ({}); stop that process, or pick "
                    "other cores with TERN_VISIBLE_CORES",
                    core, device, owner, command);
}

void NodeRegistry::ReleaseCore(uint32_t device, uint32_t core) {
  if (forked_.load(std::memory_order_relaxed) || !CheckIndex(device, core, true).ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (owned_cores_[device] & (1u << core)) ReleaseCoreLocked(device, core);
}

void NodeRegistry::ReleaseCoreLocked(uint32_t device, uint32_t core) {
  const uint32_t bit = 1u << core;
  // Clear the record before unlocking so the next owner's record survives.
  int32_t expected = pid_;
  state_->devices[device].cores[core].owner_pid.compare_exchange_strong(expected, 0);
  state_->slots[slot_].devices[device].cores_owned.fetch_and(~bit);
  UnlockByte(fd_, CoreLock(device, core));
  owned_cores_[device] &= ~bit;
}

Status NodeRegistry::ReserveMemory(uint32_t device, uint64_t bytes,
                                   tern_memory_category_t category) {
  TERN_RETURN_IF_ERROR(CheckUsable("reserving device memory"));
  if (slot_ < 0) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "cannot reserve device memory: this node registry was opened as an "
                      "observer, which owns nothing; open it as a participant");
  }
  TERN_RETURN_IF_ERROR(CheckIndex(device, 0, false));
  if (static_cast<uint32_t>(category) >= TERN_MEMORY_CATEGORY_COUNT) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "unknown memory category {}",
                      static_cast<int>(category));
  }
  if (bytes == 0) return OkStatus();
  const uint64_t capacity = topology_.hbm_bytes;
  std::atomic<uint64_t>& mine = state_->slots[slot_].devices[device].used_by_category[category];
  // Claim first, in our own ledger only, then check the node's sum, which
  // includes the claim; undo on overflow. A process killed anywhere in here
  // leaves only its own ledger, which reaping zeroes. Every access is
  // seq_cst: of two racing claims at least one sees the other, so the node
  // never goes past capacity. Racing claims may both back off while one of
  // them would fit; they retry while a fresh sum says the request fits.
  constexpr int kAttempts = 1000;
  for (int attempt = 0; bytes <= capacity && attempt < kAttempts; ++attempt) {
    mine.fetch_add(bytes);
    if (NodeMemoryUsed(device, nullptr) <= capacity) return OkStatus();
    mine.fetch_sub(bytes);
    if (attempt == 0) ReapImpl();  // dead processes may still be charged
    if (NodeMemoryUsed(device, nullptr) > capacity - bytes) break;  // really full
    std::this_thread::yield();
  }
  return OutOfMemoryError(device, bytes, category);
}

Status NodeRegistry::OutOfMemoryError(uint32_t device, uint64_t bytes,
                                      tern_memory_category_t category) const {
  const uint64_t capacity = topology_.hbm_bytes;
  uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT];
  const uint64_t used = NodeMemoryUsed(device, by_category);
  uint64_t mine = 0;
  for (const auto& v : state_->slots[slot_].devices[device].used_by_category) {
    mine = SaturatingAdd(mine, v.load());
  }
  std::vector<std::string> breakdown;
  for (uint32_t c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) {
    if (by_category[c] != 0) {
      breakdown.push_back(fmt::format("{} {}", CategoryName(c), FormatBytes(by_category[c])));
    }
  }
  // More than the device has can only be a corrupt ledger of a live process
  // (dead ones were just reaped): name it, nothing else can fix it.
  std::vector<std::string> corrupt;
  for (uint32_t slot = 0; slot < kMaxProcesses && used > capacity; ++slot) {
    const ProcessSlot& s = state_->slots[slot];
    uint64_t held = 0;
    for (const auto& v : s.devices[device].used_by_category) held = SaturatingAdd(held, v.load());
    if (held > capacity) {
      char command[32];
      LoadCommand(s.command, command);
      corrupt.push_back(fmt::format("{} ({}): {}", s.pid.load(), command, FormatBytes(held)));
    }
  }
  if (!corrupt.empty()) {
    return MakeStatus(TERN_ERROR_OUT_OF_MEMORY,
                      "cannot reserve {} of {} memory on device {}: the ledger of sim node '{}' "
                      "({}) is corrupt: the slots of live processes hold more than the "
                      "device's {}: {}; something other than tern wrote the file. Stop "
                      "those processes; their slots are then cleared",
                      FormatBytes(bytes), CategoryName(category), device, node_name_, path_,
                      FormatBytes(capacity), fmt::join(corrupt, ", "));
  }
  return MakeStatus(TERN_ERROR_OUT_OF_MEMORY,
                    "cannot reserve {} ({} bytes) of {} memory on device {}: {} of its {} are in "
                    "use node-wide ({} free; this process holds {}; by category: {}); free "
                    "device memory, or stop other processes using device {} of sim node '{}'",
                    FormatBytes(bytes), bytes, CategoryName(category), device, FormatBytes(used),
                    FormatBytes(capacity), FormatBytes(capacity - std::min(used, capacity)),
                    FormatBytes(mine),
                    breakdown.empty() ? "none" : fmt::format("{}", fmt::join(breakdown, ", ")),
                    device, node_name_);
}

void NodeRegistry::ReleaseMemory(uint32_t device, uint64_t bytes, tern_memory_category_t category) {
  if (forked_.load(std::memory_order_relaxed) || slot_ < 0 || bytes == 0 ||
      device >= topology_.device_count ||
      static_cast<uint32_t>(category) >= TERN_MEMORY_CATEGORY_COUNT) {
    return;
  }
  // Never give back more than this process holds: a caller's bug must not
  // make the ledger wrap around.
  std::atomic<uint64_t>& mine = state_->slots[slot_].devices[device].used_by_category[category];
  uint64_t current = mine.load();
  while (!mine.compare_exchange_weak(current, current - std::min(current, bytes))) {
  }
}

uint64_t NodeRegistry::NodeMemoryUsed(uint32_t device,
                                      uint64_t by_category[TERN_MEMORY_CATEGORY_COUNT]) const {
  const bool usable = !forked_.load(std::memory_order_relaxed) && device < topology_.device_count;
  uint64_t sums[TERN_MEMORY_CATEGORY_COUNT] = {};
  uint64_t total = 0;
  if (usable) {
    // Every slot, live or dead: a dead process's memory counts until it is
    // reaped. Free slots hold zeroes. Saturating, since the file may hold
    // anything.
    std::vector<std::pair<uint64_t, uint64_t>> shared;  // (id, info), only when any is held
    for (const ProcessSlot& s : state_->slots) {
      // A free slot charges nothing: a process charges only once its slot is
      // in use, and a reap zeroes the ledgers before it frees the slot.
      // Skipping the free ones keeps an allocation from reading all 64 slots'
      // lines (a quarter of a device allocation's time on an AMD Zen 1). Two
      // racing claims still see each other: the claim's store of kSlotInUse
      // and this load are seq_cst, so a reader that finds the slot free has
      // its own charge ordered before the claimant's later scan.
      if (s.state.load() == kSlotFree) continue;
      for (uint32_t c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) {
        const uint64_t v = s.devices[device].used_by_category[c].load();
        sums[c] = SaturatingAdd(sums[c], v);
        total = SaturatingAdd(total, v);
      }
      if (s.shared_count.load() == 0) continue;
      for (const SharedHold& hold : s.shared) {
        // The id is published after the info and cleared before it changes:
        // an id read the same on both sides of the info belongs to it (one
        // id always names the same allocation).
        const uint64_t id = hold.id.load();
        if (id == 0) continue;
        const uint64_t info = hold.info.load();
        if (hold.id.load() != id || SharedDevice(info) != device) continue;
        shared.emplace_back(id, info);
      }
    }
    // Each shared allocation once, however many processes hold it.
    std::sort(shared.begin(), shared.end());
    for (size_t i = 0; i < shared.size(); ++i) {
      if (i > 0 && shared[i].first == shared[i - 1].first) continue;
      const uint32_t c = SharedCategory(shared[i].second);
      if (c >= TERN_MEMORY_CATEGORY_COUNT) continue;  // garbage in the file
      const uint64_t v = SharedBytes(shared[i].second);
      sums[c] = SaturatingAdd(sums[c], v);
      total = SaturatingAdd(total, v);
    }
  }
  if (by_category != nullptr) std::memcpy(by_category, sums, sizeof(sums));
  return total;
}

Status NodeRegistry::ReserveShared(uint32_t device, uint64_t id, uint64_t bytes,
                                   tern_memory_category_t category) {
  TERN_RETURN_IF_ERROR(CheckUsable("reserving shared device memory"));
  if (slot_ < 0) {
    return MakeStatus(TERN_ERROR_FAILED_PRECONDITION,
                      "cannot reserve shared device memory: this node registry was opened as an "
                      "observer, which owns nothing; open it as a participant");
  }
  TERN_RETURN_IF_ERROR(CheckIndex(device, 0, false));
  if (static_cast<uint32_t>(category) >= TERN_MEMORY_CATEGORY_COUNT || id == 0 ||
      bytes > kMaxHbmBytes) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                      "invalid shared allocation (id {:#x}, {} bytes, category {})", id, bytes,
                      static_cast<int>(category));
  }
  std::lock_guard<std::mutex> lock(shared_mu_);
  ProcessSlot& mine = state_->slots[slot_];
  SharedHold* hold = nullptr;
  for (SharedHold& h : mine.shared) {
    if (h.id.load() == 0) {
      hold = &h;
      break;
    }
  }
  if (hold == nullptr) {
    return MakeStatus(TERN_ERROR_UNAVAILABLE,
                      "this process already holds {} shared device buffers (exported or "
                      "imported), the most the simulated node tracks per process; free some",
                      kMaxSharedPerProcess);
  }
  // As in ReserveMemory: claim in our own slot (count, info, then the id that
  // publishes it), then check the node's sum, which includes the claim; undo
  // on overflow. seq_cst throughout, so of two racing claims one sees the
  // other.
  const uint64_t capacity = topology_.hbm_bytes;
  mine.shared_count.fetch_add(1);
  hold->info.store(PackShared(bytes, device, category));
  constexpr int kAttempts = 1000;
  for (int attempt = 0; bytes <= capacity && attempt < kAttempts; ++attempt) {
    hold->id.store(id);
    if (NodeMemoryUsed(device, nullptr) <= capacity) return OkStatus();
    hold->id.store(0);
    if (attempt == 0) ReapImpl();
    if (NodeMemoryUsed(device, nullptr) > capacity - bytes) break;
    std::this_thread::yield();
  }
  hold->info.store(0);
  mine.shared_count.fetch_sub(1);
  return OutOfMemoryError(device, bytes, category);
}

void NodeRegistry::ReleaseShared(uint32_t device, uint64_t id) {
  if (forked_.load(std::memory_order_relaxed) || slot_ < 0 || id == 0 ||
      device >= topology_.device_count) {
    return;
  }
  std::lock_guard<std::mutex> lock(shared_mu_);
  ProcessSlot& mine = state_->slots[slot_];
  for (SharedHold& h : mine.shared) {
    if (h.id.load() == id && SharedDevice(h.info.load()) == device) {
      h.id.store(0);  // leaves the node's sum (unless another holder lists it)
      h.info.store(0);
      mine.shared_count.fetch_sub(1);
      return;
    }
  }
}

void NodeRegistry::ReapDeadProcesses() { ReapImpl(); }

bool NodeRegistry::SlotIsClear(uint32_t slot) const {
  const ProcessSlot& s = state_->slots[slot];
  if (s.state.load(std::memory_order_acquire) != kSlotFree || s.pid.load() != 0) return false;
  for (const SlotDeviceUsage& usage : s.devices) {
    if (usage.cores_owned.load() != 0) return false;
    for (const auto& bytes : usage.used_by_category) {
      if (bytes.load() != 0) return false;
    }
  }
  if (s.shared_count.load() != 0) return false;
  for (const SharedHold& hold : s.shared) {
    if (hold.id.load() != 0 || hold.info.load() != 0) return false;
  }
  return true;
}

void NodeRegistry::ReapImpl() const {
  if (forked_.load(std::memory_order_relaxed) || state_ == nullptr) return;
  std::lock_guard<std::mutex> lock(reap_mu_);
  for (uint32_t slot = 0; slot < kMaxProcesses; ++slot) {
    if (static_cast<int32_t>(slot) == slot_ || SlotIsClear(slot)) continue;
    if (TryLockByte(fd_, SlotLock(slot)) != 0) continue;  // live, or being claimed or reaped
    if (!SlotIsClear(slot)) ReapSlotLocked(slot);
    UnlockByte(fd_, SlotLock(slot));
  }
}

void NodeRegistry::ReapSlotLocked(uint32_t slot) const {
  ProcessSlot& s = state_->slots[slot];
  s.state.store(kSlotReaping);  // hides it from snapshots while totals move
  const int32_t pid = s.pid.load();
  for (uint32_t d = 0; d < kMaxDevices; ++d) {
    DeviceRecord& dev = state_->devices[d];
    SlotDeviceUsage& usage = s.devices[d];
    // Each counter leaves the node's sum in one store: nothing to reconcile.
    for (auto& bytes : usage.used_by_category) bytes.store(0);
    // Only the cores this slot claimed: another registry of the same pid (or
    // a reused pid) may own the rest. Stale records elsewhere are harmless,
    // readers trust a record only while its core lock is held.
    const uint32_t cores = usage.cores_owned.exchange(0);
    for (uint32_t core = 0; core < kMaxCores; ++core) {
      int32_t expected = pid;
      if (cores & (1u << core)) dev.cores[core].owner_pid.compare_exchange_strong(expected, 0);
    }
  }
  // Its shared holds: each id leaves the node's sum unless a live process
  // holds it too (then that process is charged from now on).
  for (SharedHold& hold : s.shared) {
    hold.id.store(0);
    hold.info.store(0);
  }
  s.shared_count.store(0);
  s.pid.store(0);
  StoreCommand(s.command, "");
  s.state.store(kSlotFree, std::memory_order_release);
}

void CoreCounters::CountLatency(uint64_t ns) {
  const uint64_t us = ns / 1000;
  // Bucket 0: under 1 us; bucket i: [2^(i-1), 2^i) us; the last: the rest.
  const uint32_t bucket = std::min<uint32_t>(static_cast<uint32_t>(std::bit_width(us)),
                                             TERN_TELEMETRY_LATENCY_BUCKETS - 1);
  latency[bucket].fetch_add(1, std::memory_order_relaxed);
}

CoreCounters& NodeRegistry::core_counters(uint32_t device, uint32_t core) {
  if (forked_.load(std::memory_order_relaxed) || device >= topology_.device_count ||
      core >= topology_.cores_per_device) {
    return sink_counters_;
  }
  return state_->devices[device].cores[core].counters;
}

void NodeRegistry::CountEcc(uint32_t device, bool uncorrected) {
  if (forked_.load(std::memory_order_relaxed) || device >= topology_.device_count) return;
  DeviceRecord& dev = state_->devices[device];
  (uncorrected ? dev.ecc_uncorrected : dev.ecc_corrected).fetch_add(1, std::memory_order_relaxed);
}

Status NodeRegistry::Snapshot(uint32_t device, tern_device_telemetry_t* out) const {
  if (out == nullptr) {
    return MakeStatus(TERN_ERROR_INVALID_ARGUMENT, "telemetry output pointer is null");
  }
  TERN_RETURN_IF_ERROR(CheckUsable("reading telemetry"));
  TERN_RETURN_IF_ERROR(CheckIndex(device, 0, false));
  if (state_->header.generation.load(std::memory_order_acquire) != generation_) {
    return MakeStatus(TERN_ERROR_INCOMPATIBLE,
                      "sim node '{}' was reformatted since this tool opened it (every process "
                      "exited and one with another topology started); reopen it",
                      node_name_);
  }
  ReapImpl();

  std::memset(out, 0, sizeof(*out));
  out->struct_size = sizeof(*out);
  const DeviceRecord& dev = state_->devices[device];
  out->core_count = topology_.cores_per_device;
  out->memory_capacity = topology_.hbm_bytes;
  out->memory_used = NodeMemoryUsed(device, out->memory_by_category);
  out->ecc_corrected = dev.ecc_corrected.load(std::memory_order_relaxed);
  out->ecc_uncorrected = dev.ecc_uncorrected.load(std::memory_order_relaxed);

  uint32_t owned_here;
  {
    std::lock_guard<std::mutex> lock(mu_);
    owned_here = owned_cores_[device];
  }
  for (uint32_t c = 0; c < topology_.cores_per_device; ++c) {
    tern_core_telemetry_t& t = out->cores[c];
    const CoreRecord& record = dev.cores[c];
    t.physical_index = c;
    // Records of dead owners linger until someone takes the core: trust the
    // kernel lock, not the record.
    if ((owned_here & (1u << c)) != 0 || HeldByOther(fd_, CoreLock(device, c))) {
      t.owner_pid = CoreOwner(device, c, t.owner_command);
    }
    t.commands = record.counters.commands.load(std::memory_order_relaxed);
    t.executions = record.counters.executions.load(std::memory_order_relaxed);
    t.busy_ns = record.counters.busy_ns.load(std::memory_order_relaxed);
    for (uint32_t e = 0; e < TERN_ERROR_CLASS_COUNT; ++e) {
      t.errors[e] = record.counters.errors[e].load(std::memory_order_relaxed);
    }
    for (uint32_t b = 0; b < TERN_TELEMETRY_LATENCY_BUCKETS; ++b) {
      out->latency_histogram[c][b] = record.counters.latency[b].load(std::memory_order_relaxed);
    }
  }

  for (uint32_t slot = 0; slot < kMaxProcesses; ++slot) {
    const ProcessSlot& s = state_->slots[slot];
    if (s.state.load(std::memory_order_acquire) != kSlotInUse) continue;
    if (static_cast<int32_t>(slot) != slot_ && !HeldByOther(fd_, SlotLock(slot))) continue;
    tern_process_telemetry_t& p = out->processes[out->process_count];
    uint64_t total = 0;
    for (uint32_t c = 0; c < TERN_MEMORY_CATEGORY_COUNT; ++c) {
      p.memory_by_category[c] = s.devices[device].used_by_category[c].load();
      total += p.memory_by_category[c];
    }
    // Shared buffers count under every process that holds them (and once in
    // the device's total).
    if (s.shared_count.load() != 0) {
      for (const SharedHold& hold : s.shared) {
        const uint64_t id = hold.id.load();
        const uint64_t info = hold.info.load();
        if (id == 0 || hold.id.load() != id || SharedDevice(info) != device ||
            SharedCategory(info) >= TERN_MEMORY_CATEGORY_COUNT) {
          continue;
        }
        p.memory_by_category[SharedCategory(info)] += SharedBytes(info);
        total += SharedBytes(info);
      }
    }
    p.cores_owned = s.devices[device].cores_owned.load();
    if (total == 0 && p.cores_owned == 0) {
      p = tern_process_telemetry_t{};  // not using this device
      continue;
    }
    p.pid = s.pid.load();
    LoadCommand(s.command, p.command);
    ++out->process_count;
  }
  return OkStatus();
}

void NodeRegistry::AfterForkInChild() {
  if (forked_.exchange(true)) return;
  // The parent's reference to the open file description keeps its locks;
  // dropping ours only stops this child from keeping them alive.
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace tern::sim
