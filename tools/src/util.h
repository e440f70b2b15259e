// Small helpers shared by the `tern` subcommands: errors, names of the API's
// enums, human-readable numbers, text tables, clocks and signal handling.
#ifndef TERN_TOOLS_SRC_UTIL_H_
#define TERN_TOOLS_SRC_UTIL_H_

#include <tern/tern.h>

#include <csignal>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tern::tools {

// Exit codes every subcommand shares (diag adds 1 and 2 for its verdicts).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 3;   // the tool could not do what was asked
inline constexpr int kExitUsage = 64;  // bad command line (sysexits' EX_USAGE)

// A failure that ends the subcommand: main() prints "tern: <message>" and
// exits with `exit_code`.
class ToolError : public std::runtime_error {
 public:
  explicit ToolError(const std::string& message, int exit_code = kExitError)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// "tern_init: TERN_ERROR_INCOMPATIBLE: <tern_last_error_message()>".
std::string DescribeFailure(const char* call, tern_status_t status);
// Throws ToolError(DescribeFailure(call, status)) unless status is TERN_OK.
void Check(const char* call, tern_status_t status);

// Stable lower-case names used in tables, JSON keys and metric labels.
// Values this version does not know (the enums only grow) get "category_N"
// and "class_N".
std::string CategoryName(uint32_t category);       // "tensors", "constants", ...
std::string ErrorClassName(uint32_t error_class);  // "exec_timeout", "dma_abort", ...

// "0 B", "512 B", "1.5 KiB", "256.0 MiB", "8.0 GiB".
std::string FormatBytes(uint64_t bytes);
// "0,1,5" for the set bits of `mask` (bit i = core i); "-" when none.
std::string FormatCoreMask(uint32_t mask);
std::vector<uint32_t> CoreMaskToList(uint32_t mask);
// "2024-05-01T12:00:00.123Z" for the current wall-clock time.
std::string IsoTimestampUtc(double unix_seconds);
// Parses "16M", "1G", "4096" into bytes, as common/byte_size.h says (the rules
// of TERN_SIM_TOPOLOGY: K/M/G/T or KiB..TiB, powers of 1024).
bool ParseByteSize(const std::string& text, uint64_t* out);

uint64_t MonotonicNs();
double UnixTimeSeconds();

// A plain-text table: columns separated by two spaces, padded to the widest
// cell; columns marked numeric are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> numeric = {});
  void AddRow(std::vector<std::string> row);
  bool empty() const { return rows_.empty(); }
  // Each line prefixed by `indent` and ended by '\n'.
  std::string Render(const std::string& indent = "") const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> numeric_;
  std::vector<std::vector<std::string>> rows_;
};

// SIGINT, SIGTERM and SIGHUP set a flag instead of killing the process, so
// loops can stop cleanly (restore the terminal, close sockets). The handlers
// are installed without SA_RESTART: blocking calls return EINTR at once.
void InstallStopHandlers();
bool StopRequested();
// Sleeps `seconds`, waking early (returning false) when a stop was requested.
bool SleepUnlessStopped(double seconds);

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_UTIL_H_
