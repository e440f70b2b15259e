// The persistent compile cache: hits and misses, what the key holds, corrupt
// entries, eight processes compiling one graph, writers killed mid-write,
// the directory's permissions, the lock timeout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compiler/cache/compile_cache.h"
#include "compiler/graph_file/graph_file.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/ops.h"
#include "compiler/lower/compile.h"

namespace tern::compiler {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

Shape S(std::initializer_list<int64_t> dims) {
  Shape shape;
  for (int64_t d : dims) shape.push_back(Dim::Constant(d));
  return shape;
}
TensorType F32(Shape shape) { return {TERN_DTYPE_F32, std::move(shape)}; }

uint32_t Out(const Graph& graph, absl::StatusOr<uint32_t> node) {
  EXPECT_TRUE(node.ok()) << node.status();
  return node.ok() ? graph.nodes[*node].outputs[0] : 0;
}

// y = relu(x + c), with `elements` floats: a larger graph has a larger
// constant, so a larger entry that takes longer to write.
Graph MakeGraph(int64_t elements = 64, std::string input = "x", std::string output = "y",
                std::string node_name = "add") {
  Graph g;
  const uint32_t x = g.AddInput(std::move(input), F32(S({elements})));
  std::vector<uint8_t> bytes(static_cast<size_t>(elements) * 4);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  const uint32_t c = g.AddConstant("c", F32(S({elements})), std::move(bytes));
  const uint32_t sum = Out(g, AddNode(&g, "aten.add.Tensor", {x, c}, {}, std::move(node_name)));
  const uint32_t y = Out(g, AddNode(&g, "aten.relu.default", {sum}, {}, "relu"));
  g.AddOutput(std::move(output), y);
  return g;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tern_cache_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    root_ = pattern;
    config_.directory = root_ + "/cache";
  }
  void TearDown() override {
    chmod(root_.c_str(), 0700);
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }

  // Compiles through the cache, expecting success.
  std::vector<uint8_t> Compile(const Graph& graph, CacheOutcome expected,
                               const CompileOptions& options = {}) {
    CacheReport report;
    CompileStats stats;
    absl::StatusOr<std::vector<uint8_t>> bytes =
        CompileCached(graph, options, &stats, &report, config_);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(CacheOutcomeName(report.outcome), CacheOutcomeName(expected));
    EXPECT_EQ(report.store_error, "");
    last_entry_ = report.entry_path;
    last_repaired_ = report.repaired;
    return bytes.ok() ? *bytes : std::vector<uint8_t>{};
  }

  std::vector<uint8_t> Reference(const Graph& graph) {
    absl::StatusOr<std::vector<uint8_t>> bytes = CompileGraph(graph, {}, nullptr);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : std::vector<uint8_t>{};
  }

  std::string root_;
  CacheConfig config_;
  std::string last_entry_, last_repaired_;
};

TEST_F(CacheTest, HitAfterMissReturnsIdenticalBytes) {
  const Graph graph = MakeGraph();
  const std::vector<uint8_t> reference = Reference(graph);
  CompileStats compiled;
  CacheReport report;
  absl::StatusOr<std::vector<uint8_t>> first =
      CompileCached(graph, {}, &compiled, &report, config_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(report.outcome, CacheOutcome::kMiss);
  EXPECT_EQ(*first, reference);
  CompileStats served;
  absl::StatusOr<std::vector<uint8_t>> second = CompileCached(graph, {}, &served, &report, config_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(report.outcome, CacheOutcome::kHit);
  EXPECT_EQ(*second, reference);
  // The stored statistics come back (compile_ms is the lookup's).
  EXPECT_EQ(served.nodes, compiled.nodes);
  EXPECT_EQ(served.instructions, compiled.instructions);
  EXPECT_EQ(served.scratch_peak, compiled.scratch_peak);
  EXPECT_EQ(served.constant_bytes, compiled.constant_bytes);
  for (int e = 0; e < 8; ++e) {
    EXPECT_EQ(served.instructions_per_engine[e], compiled.instructions_per_engine[e]);
  }
  // The directory was created private.
  struct stat st;
  ASSERT_EQ(stat(config_.directory.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  absl::StatusOr<CacheSummary> summary = CacheStats(config_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->entries, 1u);
  EXPECT_EQ(summary->hits, 1u);
  EXPECT_EQ(summary->misses, 1u);
  EXPECT_GT(summary->bytes, reference.size());

  absl::StatusOr<std::vector<CacheEntryInfo>> entries = ListEntries(config_);
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 1u);
  const CacheEntryInfo& entry = (*entries)[0];
  EXPECT_TRUE(entry.readable);
  EXPECT_EQ(entry.target, "trn2");
  EXPECT_EQ(entry.compiler_version, kCompilerVersion);
  EXPECT_EQ(entry.input_names, std::vector<std::string>{"x"});
  EXPECT_EQ(entry.output_names, std::vector<std::string>{"y"});
  EXPECT_EQ(entry.executable_bytes, reference.size());
  EXPECT_EQ(config_.directory + "/" + entry.file, report.entry_path);

  absl::StatusOr<ClearResult> cleared = ClearCache(config_);
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  EXPECT_EQ(cleared->entries_removed, 1u);
  Compile(graph, CacheOutcome::kMiss);
}

TEST_F(CacheTest, NamesAndOptionsAreInTheKeyDebugNamesAreNot) {
  Compile(MakeGraph(), CacheOutcome::kMiss);
  Compile(MakeGraph(64, "input"), CacheOutcome::kMiss);
  Compile(MakeGraph(64, "x", "output"), CacheOutcome::kMiss);
  Compile(MakeGraph(32), CacheOutcome::kMiss);
  CompileOptions other_target;
  other_target.target = "trn1";
  Compile(MakeGraph(), CacheOutcome::kMiss, other_target);
  Compile(MakeGraph(), CacheOutcome::kHit, other_target);
  // Node names are debug information: the same computation hits (GraphHash
  // ignores them; the served executable carries the first compile's names).
  Compile(MakeGraph(64, "x", "y", "renamed_add"), CacheOutcome::kHit);
  absl::StatusOr<CacheSummary> summary = CacheStats(config_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->entries, 5u);
}

TEST_F(CacheTest, InvalidGraphIsTheCompilersError) {
  Graph graph = MakeGraph();
  graph.outputs[0].value = 999;
  CacheReport report;
  absl::StatusOr<std::vector<uint8_t>> bytes = CompileCached(graph, {}, nullptr, &report, config_);
  EXPECT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().message().find("compile cache"), std::string::npos) << bytes.status();
}

TEST_F(CacheTest, CorruptEntriesAreDetectedRemovedAndRecompiled) {
  const Graph graph = MakeGraph();
  const std::vector<uint8_t> reference = Compile(graph, CacheOutcome::kMiss);
  const std::string entry = last_entry_;
  const std::vector<uint8_t> good = ReadAll(entry);
  ASSERT_FALSE(good.empty());

  struct Damage {
    const char* what;
    std::vector<uint8_t> bytes;
    const char* problem;
  };
  std::vector<Damage> damages;
  std::vector<uint8_t> flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;  // in the executable
  damages.push_back({"executable byte flipped", flipped, "executable checksum"});
  flipped = good;
  flipped[60] ^= 0x01;  // in the key
  damages.push_back({"key byte flipped", flipped, "header checksum"});
  flipped = good;
  flipped[9] ^= 0x01;  // the format version
  damages.push_back({"version flipped", flipped, "format version"});
  damages.push_back(
      {"truncated", std::vector<uint8_t>(good.begin(), good.end() - 100), "truncated"});
  damages.push_back(
      {"header only", std::vector<uint8_t>(good.begin(), good.begin() + 20), "truncated"});
  damages.push_back({"empty", {}, "truncated"});
  damages.push_back({"padded", good, "truncated or padded"});
  damages.back().bytes.push_back(0);

  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.what);
    WriteAll(entry, damage.bytes);
    EXPECT_EQ(Compile(graph, CacheOutcome::kRepaired), reference);
    EXPECT_CONTAINS(last_repaired_, damage.problem);
    // Stored again, whole (its stats hold another compile time).
    EXPECT_EQ(ReadAll(entry).size(), good.size());
    EXPECT_EQ(Compile(graph, CacheOutcome::kHit), reference);
  }

  // verify finds and removes a damaged entry, and keeps good ones.
  Compile(MakeGraph(32), CacheOutcome::kMiss);
  WriteAll(entry, damages[0].bytes);
  absl::StatusOr<VerifyResult> verified = VerifyCache(config_);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->entries_checked, 2u);
  EXPECT_EQ(verified->entries_good, 1u);
  ASSERT_EQ(verified->removed.size(), 1u);
  EXPECT_EQ(config_.directory + "/" + verified->removed[0].file, entry);
  EXPECT_CONTAINS(verified->removed[0].problem, "executable checksum");
  EXPECT_FALSE(fs::exists(entry));
  // A valid entry under another key's name is not served either.
  const std::vector<uint8_t> other = ReadAll(last_entry_);
  WriteAll(entry, other);
  EXPECT_EQ(Compile(graph, CacheOutcome::kRepaired), reference);
  EXPECT_CONTAINS(last_repaired_, "stored key differs");
  WriteAll(entry, other);
  verified = VerifyCache(config_);
  ASSERT_TRUE(verified.ok()) << verified.status();
  ASSERT_EQ(verified->removed.size(), 1u);
  EXPECT_CONTAINS(verified->removed[0].problem, "file name is not the hash");
}

TEST_F(CacheTest, StaleTemporaryFilesAreRemoved) {
  const Graph graph = MakeGraph();
  Compile(graph, CacheOutcome::kMiss);
  const std::string stale = last_entry_ + ".tmp.1.deadbeef";
  const std::string fresh = last_entry_ + ".tmp.2.deadbeef";
  WriteAll(stale, {1, 2, 3});
  WriteAll(fresh, {1, 2, 3});
  const struct timeval old_times[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  ASSERT_EQ(utimes(stale.c_str(), old_times), 0);
  absl::StatusOr<CacheSummary> summary = CacheStats(config_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->temporary_files, 2u);
  EXPECT_EQ(summary->entries, 1u);
  // A miss removes temporary files older than ten minutes, not newer ones.
  Compile(MakeGraph(32), CacheOutcome::kMiss);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  ASSERT_EQ(utimes(fresh.c_str(), old_times), 0);
  absl::StatusOr<VerifyResult> verified = VerifyCache(config_);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->stale_temporaries_removed, 1u);
  EXPECT_TRUE(verified->removed.empty());
}

// Child exit codes: 10 + outcome when the executable equals the reference,
// 30 + outcome when it differs, 1 on an error.
int ChildCompile(const Graph& graph, const std::vector<uint8_t>& reference,
                 const CacheConfig& config) {
  CacheReport report;
  absl::StatusOr<std::vector<uint8_t>> bytes = CompileCached(graph, {}, nullptr, &report, config);
  if (!bytes.ok()) {
    std::fprintf(stderr, "child %d: %s\n", getpid(), std::string(bytes.status().message()).c_str());
    return 1;
  }
  return (*bytes == reference ? 10 : 30) + static_cast<int>(report.outcome);
}

TEST_F(CacheTest, EightProcessesCompileOnceAndShareTheResult) {
  constexpr int kProcesses = 8;
  const Graph graph = MakeGraph(1 << 16);
  const std::vector<uint8_t> reference = Reference(graph);
  // The compiling process holds the lock a while, so that the others
  // certainly find it taken.
  config_.test_hook = [](std::string_view step) {
    if (step == "compiled") std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  ASSERT_TRUE(OpenCacheDirectory(config_).ok());
  int barrier[2];
  ASSERT_EQ(pipe(barrier), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      close(barrier[1]);
      char byte;
      while (read(barrier[0], &byte, 1) < 0 && errno == EINTR) {
      }
      _exit(ChildCompile(graph, reference, config_));
    }
    children.push_back(pid);
  }
  close(barrier[0]);
  close(barrier[1]);  // all start at once
  int outcomes[5] = {};
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
    const int code = WEXITSTATUS(status);
    ASSERT_TRUE(code >= 10 && code < 15)
        << "child exit code " << code << " (1: error, 30+: different bytes)";
    ++outcomes[code - 10];
  }
  EXPECT_EQ(outcomes[static_cast<int>(CacheOutcome::kMiss)], 1) << "exactly one compile";
  EXPECT_EQ(outcomes[static_cast<int>(CacheOutcome::kWaited)] +
                outcomes[static_cast<int>(CacheOutcome::kHit)],
            kProcesses - 1);
  EXPECT_GE(outcomes[static_cast<int>(CacheOutcome::kWaited)], 1);
  EXPECT_EQ(outcomes[static_cast<int>(CacheOutcome::kRepaired)], 0);
  absl::StatusOr<CacheSummary> summary = CacheStats(config_);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->entries, 1u);
  EXPECT_EQ(summary->misses, 1u);
  EXPECT_EQ(summary->hits + summary->waited, uint64_t{kProcesses - 1});
}

// After a writer was killed: no entry, or a whole one; never a corrupt one.
void ExpectNoCorruptEntry(const CacheConfig& config, int iteration) {
  absl::StatusOr<VerifyResult> verified = VerifyCache(config);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->removed.empty())
      << "iteration " << iteration << ": " << verified->removed[0].file << ": "
      << verified->removed[0].problem;
}

TEST_F(CacheTest, WriterKilledAtEachStepLeavesNoCorruptEntry) {
  const Graph graph = MakeGraph(1 << 20);  // a 4 MiB constant: several write chunks
  const std::vector<uint8_t> reference = Reference(graph);
  ASSERT_TRUE(OpenCacheDirectory(config_).ok());
  for (int iteration = 0; iteration < 60; ++iteration) {
    const int kill_at = iteration % 12;  // which hook call kills the writer
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      CacheConfig config = config_;
      int calls = 0;
      config.test_hook = [&](std::string_view) {
        if (calls++ == kill_at) raise(SIGKILL);
      };
      _exit(ChildCompile(graph, reference, config));
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) ||
                (WIFEXITED(status) && WEXITSTATUS(status) >= 10 && WEXITSTATUS(status) < 15))
        << "iteration " << iteration << " status " << status;
    ExpectNoCorruptEntry(config_, iteration);
    CacheReport report;
    absl::StatusOr<std::vector<uint8_t>> bytes =
        CompileCached(graph, {}, nullptr, &report, config_);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, reference) << "iteration " << iteration;
    EXPECT_NE(report.outcome, CacheOutcome::kRepaired) << report.repaired;
    ASSERT_TRUE(ClearCache(config_).ok());
  }
}

TEST_F(CacheTest, WriterKilledAtRandomTimesLeavesNoCorruptEntry) {
  const Graph graph = MakeGraph(1 << 20);
  const std::vector<uint8_t> reference = Reference(graph);
  ASSERT_TRUE(OpenCacheDirectory(config_).ok());
  std::mt19937 random(12345);
  int killed_mid_loop = 0;
  for (int iteration = 0; iteration < 60; ++iteration) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Compile and store over and over, removing the entry each time so
      // that every round writes.
      CacheConfig config = config_;
      while (true) {
        CacheReport report;
        if (!CompileCached(graph, {}, nullptr, &report, config).ok()) _exit(1);
        unlink(report.entry_path.c_str());
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 40000));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed: status " << status;
    ++killed_mid_loop;
    ExpectNoCorruptEntry(config_, iteration);
    absl::StatusOr<std::vector<uint8_t>> bytes =
        CompileCached(graph, {}, nullptr, nullptr, config_);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, reference) << "iteration " << iteration;
  }
  EXPECT_EQ(killed_mid_loop, 60);
  // Killed writers leave temporary files; clear removes them.
  absl::StatusOr<ClearResult> cleared = ClearCache(config_);
  ASSERT_TRUE(cleared.ok());
  absl::StatusOr<CacheSummary> summary = CacheStats(config_);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->temporary_files, 0u);
  EXPECT_EQ(summary->entries, 0u);
}

TEST_F(CacheTest, WaitForALockIsBoundedAndNamesTheLockFile) {
  const Graph graph = MakeGraph();
  Compile(graph, CacheOutcome::kMiss);
  const std::string entry = last_entry_;
  const std::string lock_path =
      entry.substr(0, entry.size() - std::string(".entry").size()) + ".lock";
  ASSERT_TRUE(fs::exists(lock_path));
  ASSERT_EQ(unlink(entry.c_str()), 0);
  // Another holder of the key's lock (a separate open file: flock conflicts).
  const int holder = open(lock_path.c_str(), O_RDWR);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(flock(holder, LOCK_EX), 0);
  config_.lock_timeout = std::chrono::milliseconds(200);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<uint8_t>> bytes = CompileCached(graph, {}, nullptr, nullptr, config_);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_CONTAINS(bytes.status().message(), lock_path);
  // The holder goes away: the lock is free again.
  close(holder);
  Compile(graph, CacheOutcome::kMiss);
}

TEST_F(CacheTest, UnsafeDirectoriesAreRefused) {
  ASSERT_EQ(mkdir(config_.directory.c_str(), 0700), 0);
  ASSERT_TRUE(OpenCacheDirectory(config_).ok());
  for (mode_t mode : {0777, 0770, 0702, 0720}) {
    ASSERT_EQ(chmod(config_.directory.c_str(), mode), 0);
    absl::StatusOr<std::string> opened = OpenCacheDirectory(config_);
    ASSERT_FALSE(opened.ok()) << "mode " << mode;
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_CONTAINS(opened.status().message(), "writable by group or others");
    EXPECT_CONTAINS(opened.status().message(), config_.directory);
    EXPECT_CONTAINS(opened.status().message(), "chmod 700");
    absl::StatusOr<std::vector<uint8_t>> bytes =
        CompileCached(MakeGraph(), {}, nullptr, nullptr, config_);
    EXPECT_FALSE(bytes.ok());
    EXPECT_FALSE(ListEntries(config_).ok());
    EXPECT_FALSE(ClearCache(config_).ok());
  }
  ASSERT_EQ(chmod(config_.directory.c_str(), 0755), 0);  // others may read, not write
  EXPECT_TRUE(OpenCacheDirectory(config_).ok());

  // A file where the directory should be.
  config_.directory = root_ + "/file";
  WriteAll(config_.directory, {1});
  absl::StatusOr<std::string> opened = OpenCacheDirectory(config_);
  ASSERT_FALSE(opened.ok());
  EXPECT_CONTAINS(opened.status().message(), "is not a directory");

  // Missing parents are created, the cache directory 0700.
  config_.directory = root_ + "/a/b/c";
  ASSERT_TRUE(OpenCacheDirectory(config_).ok());
  struct stat st;
  ASSERT_EQ(stat(config_.directory.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  if (geteuid() != 0) {
    // Someone else's directory (/ is root's).
    config_.directory = "/";
    opened = OpenCacheDirectory(config_);
    ASSERT_FALSE(opened.ok());
    EXPECT_CONTAINS(opened.status().message(), "not to you");
  }
}

TEST_F(CacheTest, DirectoryComesFromTheEnvironment) {
  const std::string saved_home = std::getenv("HOME") ? std::getenv("HOME") : "";
  CacheConfig config;  // no directory: the environment decides
  setenv("TERN_COMPILE_CACHE_DIR", (root_ + "/env").c_str(), 1);
  EXPECT_EQ(OpenCacheDirectory(config).value_or(""), root_ + "/env");
  unsetenv("TERN_COMPILE_CACHE_DIR");
  setenv("XDG_CACHE_HOME", (root_ + "/xdg").c_str(), 1);
  EXPECT_EQ(OpenCacheDirectory(config).value_or(""), root_ + "/xdg/tern/compile");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", (root_ + "/home").c_str(), 1);
  EXPECT_EQ(OpenCacheDirectory(config).value_or(""), root_ + "/home/.cache/tern/compile");
  setenv("HOME", saved_home.c_str(), 1);
}

// ternc compile goes through the cache (TERN_COMPILE_CACHE_DIR) unless
// --no-cache; ternc cache ls|stats|verify|clear.
TEST_F(CacheTest, TerncUsesAndManagesTheCache) {
  auto ternc = [&](const std::string& args, std::string* out) {
    const std::string command = "TERN_COMPILE_CACHE_DIR='" + config_.directory + "' " + TERNC_PATH +
                                " " + args + " >'" + root_ + "/out' 2>&1";
    const int status = std::system(command.c_str());
    const std::vector<uint8_t> text = ReadAll(root_ + "/out");
    *out = std::string(text.begin(), text.end());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const Graph graph = MakeGraph();
  const std::string graph_path = root_ + "/g.ternir", exe = root_ + "/g.tern";
  ASSERT_TRUE(WriteGraphFile(graph, graph_path).ok());
  std::string out;
  ASSERT_EQ(ternc("compile " + graph_path + " -o " + exe + " --stats", &out), 0) << out;
  EXPECT_CONTAINS(out, "cache: miss");
  ASSERT_EQ(ternc("compile " + graph_path + " -o " + exe + " --stats", &out), 0) << out;
  EXPECT_CONTAINS(out, "cache: hit");
  EXPECT_EQ(ReadAll(exe), Reference(graph));
  ASSERT_EQ(ternc("compile " + graph_path + " -o " + exe + " --stats --no-cache", &out), 0) << out;
  EXPECT_CONTAINS(out, "cache: disabled");
  ASSERT_EQ(ternc("cache ls", &out), 0) << out;
  EXPECT_CONTAINS(out, "1 entries in " + config_.directory);
  EXPECT_CONTAINS(out, "(x) -> (y)");
  ASSERT_EQ(ternc("cache stats", &out), 0) << out;
  EXPECT_CONTAINS(out, "1 hits, 1 misses");
  ASSERT_EQ(ternc("cache verify", &out), 0) << out;
  EXPECT_CONTAINS(out, "1 good, 0 bad");
  EXPECT_EQ(ternc("cache", &out), 64);
  EXPECT_EQ(ternc("cache frobnicate", &out), 64);

  // A damaged entry: verify removes it and fails.
  absl::StatusOr<std::vector<CacheEntryInfo>> entries = ListEntries(config_);
  ASSERT_TRUE(entries.ok() && entries->size() == 1);
  const std::string entry = config_.directory + "/" + (*entries)[0].file;
  std::vector<uint8_t> bytes = ReadAll(entry);
  bytes.back() ^= 1;
  WriteAll(entry, bytes);
  EXPECT_EQ(ternc("cache verify", &out), 1) << out;
  EXPECT_CONTAINS(out, "executable checksum mismatch");

  ASSERT_EQ(ternc("cache clear", &out), 0) << out;
  EXPECT_CONTAINS(out, "removed 0 entries");
  ASSERT_EQ(chmod(config_.directory.c_str(), 0777), 0);
  EXPECT_EQ(ternc("compile " + graph_path + " -o " + exe, &out), 1);
  EXPECT_CONTAINS(out, "writable by group or others");
  EXPECT_CONTAINS(out, "--no-cache");
  EXPECT_EQ(ternc("cache ls", &out), 1);
  EXPECT_EQ(ternc("compile " + graph_path + " -o " + exe + " --no-cache", &out), 0) << out;
}

}  // namespace
}  // namespace tern::compiler
