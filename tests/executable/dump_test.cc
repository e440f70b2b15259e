// `tern dump`, the executable dumper: run as a real process on real files,
// checking what it prints and its exit status. (tools/tests/ covers the
// command's other subcommands; this file covers the dump of the format.)
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "exe_test_util.h"

namespace {

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// Runs `tern dump` with `args`; returns its output and stores its exit status.
std::string Dump(const std::string& args, int* exit_status) {
  const std::string command = std::string(TERN_TOOL_PATH) + " dump " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  *exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
}

TEST(DumpTest, PrintsHeaderSectionsSignatureAndDisassembly) {
  const std::string path = exetest::WriteTemp("dump.bin", exetest::BuildPipeline());
  int status = -1;
  const std::string text = Dump(path, &status);
  EXPECT_EQ(status, 0) << text;
  EXPECT_CONTAINS(text, "header: format 1.0");
  EXPECT_CONTAINS(text, "checksum");
  EXPECT_CONTAINS(text, "module");
  EXPECT_CONTAINS(text, "debug      optional");
  EXPECT_CONTAINS(text, "target 'trn2'");
  EXPECT_CONTAINS(text, "function 0 'pipeline': scratch 64 bytes");
  EXPECT_CONTAINS(text, "input  0 'x': f32[16] (64 bytes)");
  EXPECT_CONTAINS(text, "output 0 'y': f32[16] (64 bytes)");
  EXPECT_CONTAINS(text, "vector engine, core 0: 2 instructions");
  EXPECT_CONTAINS(text, "sem_wait       semaphore 0 >= 1");
  EXPECT_CONTAINS(text, "sem_signal     semaphore 0 += 1");
  EXPECT_CONTAINS(text, "copy           scratch+0:f32[16], in0+0:f32[16]  # model.stage");
  EXPECT_CONTAINS(text,
                  "binary         out0+0:f32[16], scratch+0:f32[16], scratch+0:f32[16] fn=add");
  EXPECT_CONTAINS(text, "loader verdict: accepted");
  std::remove(path.c_str());
}

TEST(DumpTest, ReportsDamageAndTheLoadersVerdict) {
  exetest::Bytes data = exetest::BuildAdd(true);
  data.back() ^= 1;  // in the constants
  const std::string path = exetest::WriteTemp("damaged.bin", data);
  int status = -1;
  std::string text = Dump(path, &status);
  EXPECT_EQ(status, 1) << text;
  EXPECT_CONTAINS(text, "constants");
  EXPECT_CONTAINS(text, "MISMATCH");
  EXPECT_CONTAINS(text, "const+0:f32[4, 8]");  // the program is still printed
  EXPECT_CONTAINS(text, "rejected: TERN_ERROR_EXECUTABLE_CHECKSUM");
  std::remove(path.c_str());

  text = Dump("--summary " + std::string(TERN_EXE_CORPUS_DIR) + "/bad_magic.400.bin", &status);
  EXPECT_EQ(status, 1);
  EXPECT_CONTAINS(text, "cannot read the container");
  // The exit codes every `tern` subcommand uses (tools/src/util.h): 3 the
  // file could not be read, 64 bad usage.
  text = Dump("/nonexistent.bin", &status);
  EXPECT_EQ(status, 3);
  EXPECT_CONTAINS(text, "cannot open");
  text = Dump("", &status);
  EXPECT_EQ(status, 64);
  EXPECT_CONTAINS(text, "FILE");
}

}  // namespace
