#include "util.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "common/byte_size.h"

namespace tern::tools {

std::string DescribeFailure(const char* call, tern_status_t status) {
  const std::string name = tern_status_string(status);
  std::string message = fmt::format("{}: {}", call, name);
  const std::string detail = tern_last_error_message();
  if (detail.empty()) return message;
  // Sticky queue errors already start with the status name.
  if (detail.rfind(name, 0) == 0) return fmt::format("{}: {}", call, detail);
  return fmt::format("{}: {}", message, detail);
}

void Check(const char* call, tern_status_t status) {
  if (status != TERN_OK) throw ToolError(DescribeFailure(call, status));
}

std::string CategoryName(uint32_t category) {
  // The library's name; a category it does not know still gets a stable one.
  const char* name = tern_memory_category_name(static_cast<tern_memory_category_t>(category));
  if (std::string_view(name) != "unknown") return name;
  return fmt::format("category_{}", category);
}

std::string ErrorClassName(uint32_t error_class) {
  switch (error_class) {
    case TERN_ERROR_CLASS_EXEC_TIMEOUT:
      return "exec_timeout";
    case TERN_ERROR_CLASS_HBM_UNCORRECTABLE:
      return "hbm_uncorrectable";
    case TERN_ERROR_CLASS_DMA_ABORT:
      return "dma_abort";
    case TERN_ERROR_CLASS_INVALID_COMMAND:
      return "invalid_command";
    case TERN_ERROR_CLASS_OTHER:
      return "other";
    case TERN_ERROR_CLASS_EXECUTION_FAILED:
      return "execution_failed";
    default:
      return fmt::format("class_{}", error_class);
  }
}

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::vector<uint32_t> CoreMaskToList(uint32_t mask) {
  std::vector<uint32_t> cores;
  for (uint32_t i = 0; i < 32; ++i) {
    if (mask & (1u << i)) cores.push_back(i);
  }
  return cores;
}

std::string FormatCoreMask(uint32_t mask) {
  std::string text;
  for (uint32_t core : CoreMaskToList(mask)) {
    if (!text.empty()) text += ',';
    text += std::to_string(core);
  }
  return text.empty() ? "-" : text;
}

std::string IsoTimestampUtc(double unix_seconds) {
  const time_t whole = static_cast<time_t>(std::floor(unix_seconds));
  int millis = static_cast<int>((unix_seconds - static_cast<double>(whole)) * 1000.0);
  millis = std::clamp(millis, 0, 999);
  struct tm tm_utc;
  gmtime_r(&whole, &tm_utc);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm_utc.tm_year + 1900,
                     tm_utc.tm_mon + 1, tm_utc.tm_mday, tm_utc.tm_hour, tm_utc.tm_min,
                     tm_utc.tm_sec, millis);
}

bool ParseByteSize(const std::string& text, uint64_t* out) {
  return tern::ParseByteSize(text, out).ok();
}

uint64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

double UnixTimeSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

Table::Table(std::vector<std::string> header, std::vector<bool> numeric)
    : header_(std::move(header)), numeric_(std::move(numeric)) {
  numeric_.resize(header_.size(), false);
}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

std::string Table::Render(const std::string& indent) const {
  std::vector<size_t> widths(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      const bool last = i + 1 == row.size();
      const std::string pad(widths[i] - row[i].size(), ' ');
      if (numeric_[i]) {
        line += pad + row[i];
      } else {
        line += row[i];
        if (!last) line += pad;
      }
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  };
  emit(header_);
  for (const auto& row : rows_) emit(row);
  return out;
}

namespace {

volatile std::sig_atomic_t g_stop = 0;

void OnStopSignal(int) { g_stop = 1; }

}  // namespace

void InstallStopHandlers() {
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: let poll/read/sleep return EINTR
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &action, nullptr);
}

bool StopRequested() { return g_stop != 0; }

bool SleepUnlessStopped(double seconds) {
  const uint64_t deadline = MonotonicNs() + static_cast<uint64_t>(std::max(0.0, seconds) * 1e9);
  while (!StopRequested()) {
    const uint64_t now = MonotonicNs();
    if (now >= deadline) return true;
    // Short slices: a signal that lands just before nanosleep starts would
    // otherwise be noticed only at the deadline.
    const uint64_t slice = std::min<uint64_t>(deadline - now, 50'000'000ull);
    struct timespec ts = {static_cast<time_t>(slice / 1000000000ull),
                          static_cast<long>(slice % 1000000000ull)};
    nanosleep(&ts, nullptr);
  }
  return false;
}

}  // namespace tern::tools
