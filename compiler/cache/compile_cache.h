// The persistent compile cache: executables kept on disk, keyed by what
// determines their bytes, so that compiling a graph that was compiled before
// (by this process or any other of the same user) costs a file read.
// docs/compiler.md ("Compile cache") describes the key, the location, the
// entry format, the locking and the crash safety.
//
// Key: GraphHash (hash.h; names and debug info left out) + the graph's input
// and output names (the executable's signature) + kCompilerVersion + the tern
// version the builder comes from + the target + the other CompileOptions.
// An entry is a file named after the XXH3-128 of the serialised key; it
// holds a copy of the key (a hash collision is a miss, never a wrong
// executable), the CompileStats of the compile that made it, and the
// executable, each part checksummed. Entries are written to a temporary file
// and renamed; a per-key lock (flock) lets one process compile while the
// others wait and then reuse its entry.
#ifndef TERN_COMPILER_CACHE_COMPILE_CACHE_H_
#define TERN_COMPILER_CACHE_COMPILE_CACHE_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/lower/compile.h"

namespace tern::compiler {

// The version of the code that turns a graph into bytes. Bump it in any
// change that makes CompileGraph emit different bytes for the same graph and
// options (lowering, planning, ordering, emission, a default): every entry
// made before then stops matching and is compiled again. Forgetting to bump
// it serves executables of the previous compiler.
inline constexpr std::string_view kCompilerVersion =
    "tern-compiler emission 6";  // 2: fusion; 3: fused debug names, write-through copies; 4:
                                 // fusion fixes (graph outputs, beta, alpha range); 5:
                                 // full_like read as a broadcast constant; 6: programs
                                 // gather a component's steps past other instructions

// What CompileCached did.
enum class CacheOutcome : uint8_t {
  kHit = 0,       // a valid entry was there
  kMiss = 1,      // no entry: compiled here and stored
  kWaited = 2,    // another process was compiling it: waited for it, then reused its entry
  kRepaired = 3,  // the entry was corrupt or truncated: removed, compiled again and stored
  kDisabled = 4,  // not used (callers that skip the cache report this)
};

// "hit", "miss", "waited", "repaired", "disabled".
// Thread-safety: a pure function.
std::string_view CacheOutcomeName(CacheOutcome outcome);

// What CompileCached did, for messages and statistics.
struct CacheReport {
  CacheOutcome outcome = CacheOutcome::kDisabled;
  std::string entry_path;  // the entry's file
  std::string repaired;    // kRepaired: what was wrong with the old entry
  // Non-empty when the executable was compiled but could not be stored (disk
  // full, ...): the caller has its executable; the next compile misses again.
  std::string store_error;
};

// Where and how the cache works. The defaults are what ternc and the Python
// plugin use.
struct CacheConfig {
  // Empty: TERN_COMPILE_CACHE_DIR, else $XDG_CACHE_HOME/tern/compile, else
  // $HOME/.cache/tern/compile.
  std::string directory;
  // How long to wait for another process compiling the same key before
  // failing (the error names the lock file).
  std::chrono::milliseconds lock_timeout = std::chrono::minutes(5);
  // Temporary files older than this are left over from a killed writer and
  // are removed by the next miss.
  std::chrono::seconds stale_temporary_age = std::chrono::minutes(10);
  // For tests only: called at each step of writing an entry ("open",
  // "chunk" after each chunk written, "fsync", "rename", "dirsync") and
  // "compiled" after a compile under the lock, so that a test can kill the
  // process at a chosen point or hold the lock longer.
  std::function<void(std::string_view step)> test_hook;
};

// The cache directory for `config` (see CacheConfig::directory), created
// with mode 0700 (and its missing parents) when absent. Refused
// (FailedPrecondition) when it is not a directory, is not owned by the
// current user, or is writable by group or others: another user could plant
// executables there.
// Thread-safety: safe from any thread and process.
absl::StatusOr<std::string> OpenCacheDirectory(const CacheConfig& config);

// Compiles `graph` through the cache: returns the stored executable when the
// key has a valid entry, else compiles it (CompileGraph) and stores it. On a
// hit `stats` gets the stored compile's statistics, except compile_ms, which
// is this call's time. `report` (may be null) says what happened. A compile
// error is CompileGraph's own; a cache error (directory refused, lock timeout,
// I/O) starts with "compile cache:" and says what to do; failing to *store* a
// compiled executable is not an error (the executable is returned).
// Thread-safety: safe from any thread and any number of processes; callers
// of one key in parallel compile it once.
absl::StatusOr<std::vector<uint8_t>> CompileCached(const Graph& graph,
                                                   const CompileOptions& options,
                                                   CompileStats* stats, CacheReport* report,
                                                   const CacheConfig& config = {});

// One entry, as `ternc cache ls` shows it (from its header; not verified).
struct CacheEntryInfo {
  std::string file;                   // file name in the cache directory
  uint64_t bytes = 0;                 // the file's size
  int64_t modified_unix_seconds = 0;  // when it was written
  bool readable = false;              // false: the header is damaged (verify removes it)
  std::string compiler_version;       // kCompilerVersion of the compiler that made it
  std::string target;                 // CompileOptions::target
  bool fusion = true;                 // CompileOptions::fusion
  uint64_t graph_hash = 0;            // GraphHash
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
  uint64_t executable_bytes = 0;
};

// Every entry, sorted by file name. Temporary, lock and counter files are not
// entries.
// Thread-safety: safe alongside any other cache use.
absl::StatusOr<std::vector<CacheEntryInfo>> ListEntries(const CacheConfig& config = {});

struct CacheSummary {
  std::string directory;
  uint64_t entries = 0;
  uint64_t bytes = 0;  // the entries' file sizes
  uint64_t temporary_files = 0;
  uint64_t lock_files = 0;
  // Counted by every CompileCached of this directory since the last clear
  // (a small counters file updated under flock; advisory).
  uint64_t hits = 0, misses = 0, waited = 0, repaired = 0;
};

// The entries' count and size and the outcome counters.
// Thread-safety: safe alongside any other cache use.
absl::StatusOr<CacheSummary> CacheStats(const CacheConfig& config = {});

struct ClearResult {
  uint64_t entries_removed = 0;
  uint64_t bytes_removed = 0;
  uint64_t other_files_removed = 0;  // temporary, lock and counter files
};

// Removes every entry, temporary file, lock file and the counters. A process
// compiling meanwhile still gets its executable; its entry may or may not
// survive.
// Thread-safety: safe alongside any other cache use.
absl::StatusOr<ClearResult> ClearCache(const CacheConfig& config = {});

struct VerifyResult {
  uint64_t entries_checked = 0;
  uint64_t entries_good = 0;
  struct Bad {
    std::string file;
    std::string problem;  // "payload checksum mismatch", "truncated: ..."
  };
  std::vector<Bad> removed;                // bad entries, removed
  uint64_t stale_temporaries_removed = 0;  // older than CacheConfig::stale_temporary_age
};

// Reads every entry in full and checks its header, key (against its file
// name), statistics and executable checksums; removes the bad ones and stale
// temporary files and reports them.
// Thread-safety: safe alongside any other cache use.
absl::StatusOr<VerifyResult> VerifyCache(const CacheConfig& config = {});

}  // namespace tern::compiler

#endif  // TERN_COMPILER_CACHE_COMPILE_CACHE_H_
