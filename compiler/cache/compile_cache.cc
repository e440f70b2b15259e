#include "compiler/cache/compile_cache.h"

#include <absl/status/status.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <utility>

#include "compiler/ir/hash.h"
#include "compiler/ir/verify.h"
#include "tern/version.h"

namespace tern::compiler {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A new CompileOptions field changes the executable, so it must enter the
// key (KeyBytes) before this assertion is updated.
static_assert(sizeof(CompileOptions) == sizeof(std::string) + 8,
              "a new CompileOptions field must be added to KeyBytes() in compile_cache.cc");
// A new CompileStats field must be stored in entries (PutStats/GetStats) and
// kFormatVersion bumped.
static_assert(sizeof(CompileStats) == 120,
              "a new CompileStats field must be stored in cache entries (PutStats, GetStats) "
              "and kFormatVersion bumped");

// Entry file layout, all integers little-endian:
//   0  magic "TERNCCE\0"
//   8  u32 format version        12 u32 key size
//  16  u32 stats size            20 u32 reserved (0)
//  24  u64 executable size       32 u64 XXH3-64 of the executable
//  40  u64 XXH3-64 of bytes 0..39, the key and the stats
//  48  key, stats, executable
constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'C', 'C', 'E', '\0'};
constexpr uint32_t kFormatVersion = 3;  // 2: the fusion counts in the stats; 3: mutations
constexpr size_t kHeaderSize = 48;
constexpr size_t kHeaderHashOffset = 40;
constexpr size_t kStatsSize = 18 * 4 + 5 * 8;
constexpr size_t kWriteChunk = 1 << 20;

constexpr std::string_view kEntrySuffix = ".entry";  // <32 hex digits>.entry
constexpr std::string_view kLockSuffix = ".lock";    // <32 hex digits>.lock
constexpr std::string_view kTemporaryMarker = ".tmp.";
constexpr std::string_view kCountersFile = "counters";
constexpr std::string_view kKeyTag = "tern compile cache key 2";  // 2: + fusion

std::string Errno(int error) { return std::strerror(error); }

// Fixed-width little-endian fields and length-prefixed strings.
class Writer {
 public:
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Text(std::string_view text) {
    U64(text.size());
    bytes_.insert(bytes_.end(), text.begin(), text.end());
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what Writer wrote; any read past the end sets failed() and returns 0.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint32_t U32() { return static_cast<uint32_t>(Little(4)); }
  uint64_t U64() { return Little(8); }
  std::string Text() {
    const uint64_t size = U64();
    if (failed_ || size > bytes_.size() - at_) {
      failed_ = true;
      return {};
    }
    std::string text(bytes_.begin() + static_cast<ptrdiff_t>(at_),
                     bytes_.begin() + static_cast<ptrdiff_t>(at_ + size));
    at_ += size;
    return text;
  }
  bool failed() const { return failed_; }
  bool at_end() const { return at_ == bytes_.size(); }

 private:
  uint64_t Little(size_t width) {
    if (failed_ || width > bytes_.size() - at_) {
      failed_ = true;
      return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v |= uint64_t{bytes_[at_ + i]} << (8 * i);
    at_ += width;
    return v;
  }
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
  bool failed_ = false;
};

std::vector<uint8_t> KeyBytes(const Graph& graph, const CompileOptions& options) {
  Writer key;
  key.Text(kKeyTag);
  key.Text(kCompilerVersion);
  key.U32(TERN_VERSION);  // the builder (libtern) that emits the executable
  key.Text(options.target);
  key.U32(options.fusion ? 1 : 0);
  key.U64(GraphHash(graph));
  key.U64(graph.inputs.size());
  for (uint32_t id : graph.inputs) key.Text(graph.values[id].name);
  key.U64(graph.outputs.size());
  for (const Graph::Output& output : graph.outputs) key.Text(output.name);
  return std::move(key.bytes());
}

// The key's fields, for `ternc cache ls`; false when they do not parse.
bool ParseKey(std::span<const uint8_t> bytes, CacheEntryInfo* info) {
  Reader key(bytes);
  if (key.Text() != kKeyTag) return false;
  info->compiler_version = key.Text();
  key.U32();
  info->target = key.Text();
  info->fusion = key.U32() != 0;
  info->graph_hash = key.U64();
  const uint64_t inputs = key.U64();
  for (uint64_t i = 0; i < inputs && !key.failed(); ++i) info->input_names.push_back(key.Text());
  const uint64_t outputs = key.U64();
  for (uint64_t i = 0; i < outputs && !key.failed(); ++i) info->output_names.push_back(key.Text());
  return !key.failed() && key.at_end();
}

std::string EntryName(std::span<const uint8_t> key) {
  const XXH128_hash_t hash = XXH3_128bits(key.data(), key.size());
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
}

void PutStats(const CompileStats& stats, Writer* out) {
  out->U32(stats.nodes);
  out->U32(stats.instructions);
  for (uint32_t count : stats.instructions_per_engine) out->U32(count);
  out->U32(stats.semaphores);
  out->U64(stats.scratch_peak);
  out->U64(stats.scratch_naive_sum);
  out->U64(stats.scratch_max_live);
  out->U64(stats.constant_bytes);
  out->U64(std::bit_cast<uint64_t>(stats.compile_ms));
  out->U32(stats.compute_instructions_unfused);
  out->U32(stats.compute_instructions);
  out->U32(stats.epilogues);
  out->U32(stats.fused_groups);
  out->U32(stats.fused_members);
  out->U32(stats.mutations_in_place);
  out->U32(stats.mutations_copied);
}

CompileStats GetStats(std::span<const uint8_t> bytes) {
  Reader in(bytes);
  CompileStats stats;
  stats.nodes = in.U32();
  stats.instructions = in.U32();
  for (uint32_t& count : stats.instructions_per_engine) count = in.U32();
  stats.semaphores = in.U32();
  stats.scratch_peak = in.U64();
  stats.scratch_naive_sum = in.U64();
  stats.scratch_max_live = in.U64();
  stats.constant_bytes = in.U64();
  stats.compile_ms = std::bit_cast<double>(in.U64());
  stats.compute_instructions_unfused = in.U32();
  stats.compute_instructions = in.U32();
  stats.epilogues = in.U32();
  stats.fused_groups = in.U32();
  stats.fused_members = in.U32();
  stats.mutations_in_place = in.U32();
  stats.mutations_copied = in.U32();
  return stats;
}

std::vector<uint8_t> EntryBytes(std::span<const uint8_t> key, const CompileStats& stats,
                                std::span<const uint8_t> executable) {
  Writer stats_bytes;
  PutStats(stats, &stats_bytes);
  Writer out;
  out.bytes().insert(out.bytes().end(), kMagic, kMagic + sizeof(kMagic));
  out.U32(kFormatVersion);
  out.U32(static_cast<uint32_t>(key.size()));
  out.U32(static_cast<uint32_t>(stats_bytes.bytes().size()));
  out.U32(0);
  out.U64(executable.size());
  out.U64(XXH3_64bits(executable.data(), executable.size()));
  std::vector<uint8_t>& bytes = out.bytes();
  bytes.insert(bytes.end(), key.begin(), key.end());
  bytes.insert(bytes.end(), stats_bytes.bytes().begin(), stats_bytes.bytes().end());
  // The header hash covers the header's first 40 bytes, the key and the
  // stats: all of `bytes` so far, where it is then inserted.
  Writer hash;
  hash.U64(XXH3_64bits(bytes.data(), bytes.size()));
  bytes.insert(bytes.begin() + kHeaderHashOffset, hash.bytes().begin(), hash.bytes().end());
  bytes.insert(bytes.end(), executable.begin(), executable.end());
  return bytes;
}

// The parts of an entry file, pointing into its bytes.
struct EntryParts {
  std::span<const uint8_t> key, stats, executable;
};

// Checks the header of `bytes` (the whole file, or its first
// `file_size` bytes' header part when `header_only`). Returns the problem,
// or "" and fills `parts`.
std::string ParseEntry(std::span<const uint8_t> bytes, uint64_t file_size, bool header_only,
                       EntryParts* parts) {
  if (file_size < kHeaderSize || bytes.size() < kHeaderSize) {
    return fmt::format("truncated: {} bytes, shorter than the {}-byte header", file_size,
                       kHeaderSize);
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return "not a compile cache entry (wrong magic)";
  }
  Reader header(bytes.subspan(8, kHeaderSize - 8));
  const uint32_t version = header.U32();
  const uint64_t key_size = header.U32();
  const uint64_t stats_size = header.U32();
  header.U32();
  const uint64_t executable_size = header.U64();
  const uint64_t executable_hash = header.U64();
  const uint64_t header_hash = header.U64();
  if (version != kFormatVersion) {
    return fmt::format("entry format version {}, this compiler reads version {}", version,
                       kFormatVersion);
  }
  if (stats_size != kStatsSize) return fmt::format("statistics of {} bytes", stats_size);
  const uint64_t expected = kHeaderSize + key_size + stats_size + executable_size;
  if (executable_size > file_size || expected != file_size) {
    return fmt::format("truncated or padded: {} bytes, the header says {}", file_size,
                       kHeaderSize + key_size + stats_size + executable_size);
  }
  if (bytes.size() < kHeaderSize + key_size + stats_size) return "truncated header";
  std::vector<uint8_t> covered(bytes.begin(), bytes.begin() + kHeaderHashOffset);
  covered.insert(covered.end(), bytes.begin() + kHeaderSize,
                 bytes.begin() + static_cast<ptrdiff_t>(kHeaderSize + key_size + stats_size));
  if (XXH3_64bits(covered.data(), covered.size()) != header_hash) {
    return "header checksum mismatch";
  }
  parts->key = bytes.subspan(kHeaderSize, key_size);
  parts->stats = bytes.subspan(kHeaderSize + key_size, stats_size);
  if (header_only) return "";
  parts->executable = bytes.subspan(kHeaderSize + key_size + stats_size, executable_size);
  if (XXH3_64bits(parts->executable.data(), parts->executable.size()) != executable_hash) {
    return "executable checksum mismatch";
  }
  return "";
}

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int fd_;
};

absl::Status IoError(int error, std::string_view what, const std::string& path) {
  return absl::UnavailableError(
      fmt::format("compile cache: cannot {} '{}': {} (check the disk "
                  "and the directory, or compile without the cache)",
                  what, path, Errno(error)));
}

// Reads up to `limit` bytes of the regular file `path`; nullopt when it does
// not exist. `file_size` gets its size.
absl::StatusOr<std::optional<std::vector<uint8_t>>> ReadFile(const std::string& path,
                                                             uint64_t limit, uint64_t* file_size) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<std::vector<uint8_t>>();
    return IoError(errno, "open", path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return IoError(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format(
        "compile cache: '{}' is not a regular file; remove it (ternc cache clear)", path));
  }
  *file_size = static_cast<uint64_t>(st.st_size);
  std::vector<uint8_t> bytes(std::min<uint64_t>(*file_size, limit));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError(errno, "read", path);
    if (n == 0) break;  // shrank meanwhile: the parse sees a truncated file
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return std::optional<std::vector<uint8_t>>(std::move(bytes));
}

// What a key's entry file holds.
struct Lookup {
  enum Kind { kAbsent, kValid, kBad } kind = kAbsent;
  std::string problem;  // kBad
  CompileStats stats;   // kValid
  std::vector<uint8_t> executable;
};

absl::StatusOr<Lookup> LookUp(const std::string& path, std::span<const uint8_t> key) {
  uint64_t file_size = 0;
  absl::StatusOr<std::optional<std::vector<uint8_t>>> bytes =
      ReadFile(path, UINT64_MAX, &file_size);
  if (!bytes.ok()) return bytes.status();
  Lookup lookup;
  if (!bytes->has_value()) return lookup;
  EntryParts parts;
  lookup.problem = ParseEntry(**bytes, (*bytes)->size(), false, &parts);
  if (lookup.problem.empty() &&
      !std::equal(parts.key.begin(), parts.key.end(), key.begin(), key.end())) {
    // Two keys with one XXH3-128: never expected, but never served either.
    lookup.problem = "the stored key differs from this graph's (a hash collision)";
  }
  if (!lookup.problem.empty()) {
    lookup.kind = Lookup::kBad;
    return lookup;
  }
  lookup.kind = Lookup::kValid;
  lookup.stats = GetStats(parts.stats);
  lookup.executable.assign(parts.executable.begin(), parts.executable.end());
  return lookup;
}

void Hook(const CacheConfig& config, std::string_view step) {
  if (config.test_hook) config.test_hook(step);
}

absl::Status SyncDirectory(const std::string& directory) {
  Fd fd(open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || fsync(fd.get()) != 0) return IoError(errno, "sync the directory", directory);
  return absl::OkStatus();
}

std::string UniqueSuffix() {
  std::random_device random;
  return fmt::format("{}.{:08x}{:08x}", getpid(), random(), random());
}

// Writes the entry to a new temporary file in `directory`, syncs it and
// renames it over `name`: a reader sees the old file or the whole new one,
// and a writer killed at any point leaves at most a temporary file.
absl::Status StoreEntry(const std::string& directory, const std::string& name,
                        const std::vector<uint8_t>& bytes, const CacheConfig& config) {
  const std::string path = directory + "/" + name;
  const std::string temporary = fmt::format("{}{}{}", path, kTemporaryMarker, UniqueSuffix());
  Fd fd(open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return IoError(errno, "create", temporary);
  auto fail = [&](int error, std::string_view what) {
    unlink(temporary.c_str());
    return IoError(error, what, temporary);
  };
  Hook(config, "open");
  size_t done = 0;
  while (done < bytes.size()) {
    const size_t size = std::min(kWriteChunk, bytes.size() - done);
    const ssize_t n = write(fd.get(), bytes.data() + done, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n < 0 ? errno : ENOSPC, "write");
    done += static_cast<size_t>(n);
    Hook(config, "chunk");
  }
  Hook(config, "fsync");
  if (fsync(fd.get()) != 0) return fail(errno, "sync");
  if (close(fd.Release()) != 0) return fail(errno, "close");
  Hook(config, "rename");
  if (rename(temporary.c_str(), path.c_str()) != 0) return fail(errno, "rename");
  Hook(config, "dirsync");
  return SyncDirectory(directory);
}

// An exclusive flock on a key's lock file, released on destruction (and by
// the kernel when the process dies).
class KeyLock {
 public:
  // Polls for the lock until `timeout`; `waited` is set when another process
  // held it.
  static absl::StatusOr<KeyLock> Acquire(const std::string& path, std::chrono::milliseconds timeout,
                                         bool* waited) {
    Fd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd.valid()) return IoError(errno, "open the lock file", path);
    const Clock::time_point deadline = Clock::now() + timeout;
    std::chrono::milliseconds pause(1);
    while (true) {
      if (flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return KeyLock(std::move(fd));
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) return IoError(errno, "lock", path);
      if (waited != nullptr) *waited = true;
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(fmt::format(
            "compile cache: waited {} ms for the lock file '{}', held by another process "
            "compiling the same graph; find it with `fuser {}`, wait for it, or compile "
            "without the cache",
            timeout.count(), path, path));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

 private:
  explicit KeyLock(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
};

enum class FileKind { kEntry, kTemporary, kLock, kCounters, kOther };

bool IsHex32(std::string_view text) {
  if (text.size() != 32) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

FileKind KindOf(std::string_view name) {
  if (name == kCountersFile) return FileKind::kCounters;
  if (name.size() < 32 || !IsHex32(name.substr(0, 32))) return FileKind::kOther;
  const std::string_view rest = name.substr(32);
  if (rest == kEntrySuffix) return FileKind::kEntry;
  if (rest == kLockSuffix) return FileKind::kLock;
  if (rest.starts_with(kEntrySuffix) &&
      rest.substr(kEntrySuffix.size()).starts_with(kTemporaryMarker)) {
    return FileKind::kTemporary;
  }
  return FileKind::kOther;
}

struct DirectoryFile {
  std::string name;
  FileKind kind;
  uint64_t size;
  int64_t modified;  // unix seconds
};

// The cache's files (not following links; other files are kOther).
absl::StatusOr<std::vector<DirectoryFile>> ListFiles(const std::string& directory) {
  std::error_code error;
  fs::directory_iterator it(directory, error);
  if (error) return IoError(error.value(), "list", directory);
  std::vector<DirectoryFile> files;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) return IoError(error.value(), "list", directory);
    const std::string name = it->path().filename().string();
    struct stat st;
    if (lstat(it->path().c_str(), &st) != 0) continue;  // removed meanwhile
    if (!S_ISREG(st.st_mode)) continue;
    files.push_back(
        {name, KindOf(name), static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_mtime)});
  }
  if (error) return IoError(error.value(), "list", directory);
  std::sort(files.begin(), files.end(),
            [](const DirectoryFile& a, const DirectoryFile& b) { return a.name < b.name; });
  return files;
}

// Removes temporary files older than `age`: left by a writer that was killed.
uint64_t RemoveStaleTemporaries(const std::string& directory, std::chrono::seconds age) {
  absl::StatusOr<std::vector<DirectoryFile>> files = ListFiles(directory);
  if (!files.ok()) return 0;
  const int64_t now = static_cast<int64_t>(time(nullptr));
  uint64_t removed = 0;
  for (const DirectoryFile& file : *files) {
    if (file.kind != FileKind::kTemporary || now - file.modified < age.count()) continue;
    if (unlink((directory + "/" + file.name).c_str()) == 0) ++removed;
  }
  return removed;
}

// The outcome counters: "hits N\nmisses N\nwaited N\nrepaired N\n".
struct Counters {
  uint64_t values[4] = {};
};

Counters ParseCounters(const std::string& text) {
  Counters counters;
  static constexpr std::string_view kNames[4] = {"hits", "misses", "waited", "repaired"};
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    for (int i = 0; i < 4; ++i) {
      if (line.substr(0, space) == kNames[i]) {
        counters.values[i] = std::strtoull(line.c_str() + space + 1, nullptr, 10);
      }
    }
  }
  return counters;
}

// Adds one to the outcome's counter under an flock of the counters file.
// Advisory: a failure, or a writer killed mid-update, only loses counts.
void Count(const std::string& directory, CacheOutcome outcome) {
  const int index = static_cast<int>(outcome);
  if (index > 3) return;
  const std::string path = directory + "/" + std::string(kCountersFile);
  // The lock is on the counters file itself (another open file than `fd`).
  absl::StatusOr<KeyLock> lock = KeyLock::Acquire(path, std::chrono::seconds(2), nullptr);
  if (!lock.ok()) return;
  Fd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return;
  char buffer[256];
  const ssize_t n = pread(fd.get(), buffer, sizeof(buffer) - 1, 0);
  Counters counters = ParseCounters(std::string(buffer, n > 0 ? static_cast<size_t>(n) : 0));
  ++counters.values[index];
  const std::string text =
      fmt::format("hits {}\nmisses {}\nwaited {}\nrepaired {}\n", counters.values[0],
                  counters.values[1], counters.values[2], counters.values[3]);
  if (pwrite(fd.get(), text.data(), text.size(), 0) == static_cast<ssize_t>(text.size())) {
    (void)!ftruncate(fd.get(), static_cast<off_t>(text.size()));
  }
}

std::string ResolveDirectory(const CacheConfig& config) {
  if (!config.directory.empty()) return config.directory;
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  if (std::string dir = env("TERN_COMPILE_CACHE_DIR"); !dir.empty()) return dir;
  // The XDG spec says a relative XDG_CACHE_HOME is invalid and ignored.
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg[0] == '/') {
    return xdg + "/tern/compile";
  }
  std::string home = env("HOME");
  if (home.empty()) {
    if (const passwd* user = getpwuid(getuid()); user != nullptr && user->pw_dir != nullptr) {
      home = user->pw_dir;
    }
  }
  return home.empty() ? std::string() : home + "/.cache/tern/compile";
}

// mkdir -p with mode 0700 for the directories it creates.
absl::Status MakeDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          fmt::format("compile cache: cannot create the cache directory '{}': {} at '{}'; set "
                      "TERN_COMPILE_CACHE_DIR to a directory you can write",
                      path, Errno(errno), prefix));
    }
    if (slash == std::string::npos) return absl::OkStatus();
  }
}

// What is wrong with the entry file `name` ("" when nothing); `exists` is
// false when it is gone.
absl::StatusOr<std::string> CheckEntryFile(const std::string& directory, const std::string& name,
                                           bool* exists) {
  uint64_t file_size = 0;
  absl::StatusOr<std::optional<std::vector<uint8_t>>> bytes =
      ReadFile(directory + "/" + name, UINT64_MAX, &file_size);
  if (!bytes.ok()) return bytes.status();
  *exists = bytes->has_value();
  if (!*exists) return std::string();
  EntryParts parts;
  std::string problem = ParseEntry(**bytes, (*bytes)->size(), false, &parts);
  CacheEntryInfo info;
  if (problem.empty() && !ParseKey(parts.key, &info)) problem = "the stored key does not parse";
  if (problem.empty() && EntryName(parts.key) + std::string(kEntrySuffix) != name) {
    problem = "the file name is not the hash of the stored key";
  }
  return problem;
}

}  // namespace

std::string_view CacheOutcomeName(CacheOutcome outcome) {
  switch (outcome) {
    case CacheOutcome::kHit:
      return "hit";
    case CacheOutcome::kMiss:
      return "miss";
    case CacheOutcome::kWaited:
      return "waited";
    case CacheOutcome::kRepaired:
      return "repaired";
    case CacheOutcome::kDisabled:
      break;
  }
  return "disabled";
}

absl::StatusOr<std::string> OpenCacheDirectory(const CacheConfig& config) {
  const std::string directory = ResolveDirectory(config);
  if (directory.empty()) {
    return absl::FailedPreconditionError(
        "compile cache: no cache directory: HOME is not set; set TERN_COMPILE_CACHE_DIR");
  }
  struct stat st;
  if (stat(directory.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          fmt::format("compile cache: cannot use the cache directory '{}': {}; set "
                      "TERN_COMPILE_CACHE_DIR to a directory of your own",
                      directory, Errno(errno)));
    }
    if (absl::Status made = MakeDirectories(directory); !made.ok()) return made;
    if (stat(directory.c_str(), &st) != 0) return IoError(errno, "stat", directory);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        fmt::format("compile cache: '{}' is not a directory; remove it or set "
                    "TERN_COMPILE_CACHE_DIR to a directory of your own",
                    directory));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(fmt::format(
        "compile cache: the cache directory '{}' belongs to uid {}, not to you (uid {}), so "
        "its owner could plant executables in it; set TERN_COMPILE_CACHE_DIR to a directory "
        "of your own",
        directory, st.st_uid, geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(fmt::format(
        "compile cache: the cache directory '{}' is writable by group or others (mode {:04o}), "
        "so another user could plant executables in it; run `chmod 700 {}` or set "
        "TERN_COMPILE_CACHE_DIR to a directory of your own",
        directory, st.st_mode & 07777, directory));
  }
  return directory;
}

absl::StatusOr<std::vector<uint8_t>> CompileCached(const Graph& graph,
                                                   const CompileOptions& options,
                                                   CompileStats* stats, CacheReport* report,
                                                   const CacheConfig& config) {
  const Clock::time_point start = Clock::now();
  CacheReport local_report;
  CacheReport& out = report != nullptr ? *report : local_report;
  out = CacheReport{};
  // GraphHash needs a verified graph; CompileGraph's errors for it are the same.
  if (absl::Status verified = VerifyGraph(graph); !verified.ok()) return verified;
  absl::StatusOr<std::string> directory = OpenCacheDirectory(config);
  if (!directory.ok()) return directory.status();
  const std::vector<uint8_t> key = KeyBytes(graph, options);
  const std::string name = EntryName(key);
  const std::string entry_name = name + std::string(kEntrySuffix);
  out.entry_path = *directory + "/" + entry_name;

  auto serve = [&](Lookup& lookup, CacheOutcome outcome) {
    out.outcome = outcome;
    if (stats != nullptr) {
      *stats = lookup.stats;
      stats->compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    }
    Count(*directory, outcome);
    return std::move(lookup.executable);
  };

  // Most compiles are hits: no lock needed, since entries appear by rename.
  absl::StatusOr<Lookup> lookup = LookUp(out.entry_path, key);
  if (!lookup.ok()) return lookup.status();
  if (lookup->kind == Lookup::kValid) return serve(*lookup, CacheOutcome::kHit);

  bool waited = false;
  absl::StatusOr<KeyLock> lock = KeyLock::Acquire(
      *directory + "/" + name + std::string(kLockSuffix), config.lock_timeout, &waited);
  if (!lock.ok()) return lock.status();
  // Whoever held the lock may have stored (or repaired) the entry.
  lookup = LookUp(out.entry_path, key);
  if (!lookup.ok()) return lookup.status();
  if (lookup->kind == Lookup::kValid) {
    return serve(*lookup, waited ? CacheOutcome::kWaited : CacheOutcome::kHit);
  }
  if (lookup->kind == Lookup::kBad) {
    out.repaired = lookup->problem;
    if (unlink(out.entry_path.c_str()) != 0 && errno != ENOENT) {
      return IoError(errno, "remove the corrupt entry", out.entry_path);
    }
  }
  RemoveStaleTemporaries(*directory, config.stale_temporary_age);

  CompileStats compiled_stats;
  absl::StatusOr<std::vector<uint8_t>> executable = CompileGraph(graph, options, &compiled_stats);
  if (!executable.ok()) return executable.status();
  Hook(config, "compiled");
  if (absl::Status stored =
          StoreEntry(*directory, entry_name, EntryBytes(key, compiled_stats, *executable), config);
      !stored.ok()) {
    out.store_error = std::string(stored.message());
  }
  out.outcome = out.repaired.empty() ? CacheOutcome::kMiss : CacheOutcome::kRepaired;
  Count(*directory, out.outcome);
  if (stats != nullptr) *stats = compiled_stats;
  return executable;
}

absl::StatusOr<std::vector<CacheEntryInfo>> ListEntries(const CacheConfig& config) {
  absl::StatusOr<std::string> directory = OpenCacheDirectory(config);
  if (!directory.ok()) return directory.status();
  absl::StatusOr<std::vector<DirectoryFile>> files = ListFiles(*directory);
  if (!files.ok()) return files.status();
  std::vector<CacheEntryInfo> entries;
  for (const DirectoryFile& file : *files) {
    if (file.kind != FileKind::kEntry) continue;
    CacheEntryInfo info;
    info.file = file.name;
    info.bytes = file.size;
    info.modified_unix_seconds = file.modified;
    // The header, key and statistics are small: read a bounded prefix.
    uint64_t file_size = 0;
    absl::StatusOr<std::optional<std::vector<uint8_t>>> prefix =
        ReadFile(*directory + "/" + file.name, 64 * 1024, &file_size);
    EntryParts parts;
    if (prefix.ok() && prefix->has_value() &&
        ParseEntry(**prefix, file_size, true, &parts).empty() && ParseKey(parts.key, &info)) {
      info.readable = true;
      info.executable_bytes = file_size - kHeaderSize - parts.key.size() - parts.stats.size();
    }
    if (prefix.ok() && !prefix->has_value()) continue;  // removed meanwhile
    entries.push_back(std::move(info));
  }
  return entries;
}

absl::StatusOr<CacheSummary> CacheStats(const CacheConfig& config) {
  absl::StatusOr<std::string> directory = OpenCacheDirectory(config);
  if (!directory.ok()) return directory.status();
  absl::StatusOr<std::vector<DirectoryFile>> files = ListFiles(*directory);
  if (!files.ok()) return files.status();
  CacheSummary summary;
  summary.directory = *directory;
  for (const DirectoryFile& file : *files) {
    switch (file.kind) {
      case FileKind::kEntry:
        ++summary.entries;
        summary.bytes += file.size;
        break;
      case FileKind::kTemporary:
        ++summary.temporary_files;
        break;
      case FileKind::kLock:
        ++summary.lock_files;
        break;
      case FileKind::kCounters:
      case FileKind::kOther:
        break;
    }
  }
  uint64_t size = 0;
  absl::StatusOr<std::optional<std::vector<uint8_t>>> counters =
      ReadFile(*directory + "/" + std::string(kCountersFile), 4096, &size);
  if (counters.ok() && counters->has_value()) {
    const Counters parsed = ParseCounters(std::string((*counters)->begin(), (*counters)->end()));
    summary.hits = parsed.values[0];
    summary.misses = parsed.values[1];
    summary.waited = parsed.values[2];
    summary.repaired = parsed.values[3];
  }
  return summary;
}

absl::StatusOr<ClearResult> ClearCache(const CacheConfig& config) {
  absl::StatusOr<std::string> directory = OpenCacheDirectory(config);
  if (!directory.ok()) return directory.status();
  absl::StatusOr<std::vector<DirectoryFile>> files = ListFiles(*directory);
  if (!files.ok()) return files.status();
  ClearResult result;
  for (const DirectoryFile& file : *files) {
    // Files the cache did not make are left alone.
    if (file.kind == FileKind::kOther) continue;
    const std::string path = *directory + "/" + file.name;
    if (unlink(path.c_str()) != 0) {
      if (errno == ENOENT) continue;
      return IoError(errno, "remove", path);
    }
    if (file.kind == FileKind::kEntry) {
      ++result.entries_removed;
      result.bytes_removed += file.size;
    } else {
      ++result.other_files_removed;
    }
  }
  return result;
}

absl::StatusOr<VerifyResult> VerifyCache(const CacheConfig& config) {
  absl::StatusOr<std::string> directory = OpenCacheDirectory(config);
  if (!directory.ok()) return directory.status();
  absl::StatusOr<std::vector<DirectoryFile>> files = ListFiles(*directory);
  if (!files.ok()) return files.status();
  VerifyResult result;
  for (const DirectoryFile& file : *files) {
    if (file.kind != FileKind::kEntry) continue;
    bool exists = false;
    absl::StatusOr<std::string> problem = CheckEntryFile(*directory, file.name, &exists);
    if (!problem.ok()) return problem.status();
    if (!exists) continue;  // removed meanwhile
    ++result.entries_checked;
    if (problem->empty()) {
      ++result.entries_good;
      continue;
    }
    // Remove it under the key's lock, if it is still bad then: a compile may
    // have renamed a good entry over it meanwhile.
    const std::string key_name = file.name.substr(0, file.name.size() - kEntrySuffix.size());
    absl::StatusOr<KeyLock> lock = KeyLock::Acquire(
        *directory + "/" + key_name + std::string(kLockSuffix), config.lock_timeout, nullptr);
    if (!lock.ok()) return lock.status();
    problem = CheckEntryFile(*directory, file.name, &exists);
    if (!problem.ok()) return problem.status();
    if (!exists) continue;
    if (problem->empty()) {
      ++result.entries_good;
      continue;
    }
    const std::string path = *directory + "/" + file.name;
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return IoError(errno, "remove", path);
    result.removed.push_back({file.name, *problem});
  }
  result.stale_temporaries_removed = RemoveStaleTemporaries(*directory, config.stale_temporary_age);
  return result;
}

}  // namespace tern::compiler
