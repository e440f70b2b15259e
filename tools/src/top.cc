// `tern top`: a live terminal view of the node (ncurses), or one frame on
// stdout with --once.
#include <curses.h>
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "node.h"
#include "subcommands.h"
#include "util.h"

namespace tern::tools {
namespace {

struct TopOptions {
  double delay_s = 1.0;
  bool once = false;
};

enum class Style { kNormal, kTitle, kHeading, kTableHeader, kAlert };

struct FrameLine {
  std::string text;
  Style style = Style::kNormal;
};

std::string Bar(double ratio, int width) {
  const int filled = static_cast<int>(ratio * width + 0.5);
  return "[" + std::string(std::clamp(filled, 0, width), '#') +
         std::string(width - std::clamp(filled, 0, width), ' ') + "]";
}

void AppendTable(const Table& table, const std::string& indent, std::vector<FrameLine>* lines) {
  std::istringstream rendered(table.Render(indent));
  std::string line;
  bool first = true;
  while (std::getline(rendered, line)) {
    lines->push_back({line, first ? Style::kTableHeader : Style::kNormal});
    first = false;
  }
}

std::vector<FrameLine> RenderFrame(const Runtime& runtime, const NodeSample& before,
                                   const NodeSample& after, double delay_s, bool measuring) {
  std::vector<FrameLine> lines;
  const time_t now = static_cast<time_t>(after.unix_seconds);
  struct tm local;
  localtime_r(&now, &local);
  lines.push_back({fmt::format("tern top - driver {}, tern {}, {} device{}, every {:.1f} s, "
                               "{:02}:{:02}:{:02}   (q: quit)",
                               runtime.driver(), runtime.version(), after.devices.size(),
                               after.devices.size() == 1 ? "" : "s", delay_s, local.tm_hour,
                               local.tm_min, local.tm_sec),
                   Style::kTitle});
  for (size_t d = 0; d < after.devices.size(); ++d) {
    const DeviceSample& device = after.devices[d];
    const tern_device_telemetry_t& t = device.telemetry;
    const double used_pct = t.memory_capacity > 0 ? 100.0 * static_cast<double>(t.memory_used) /
                                                        static_cast<double>(t.memory_capacity)
                                                  : 0.0;
    lines.push_back({});
    lines.push_back({fmt::format("DEVICE {}  {}  NUMA {}  HBM {} / {} ({:.1f}%)  ECC {} corrected, "
                                 "{} uncorrected",
                                 device.info.index, device.info.name, device.info.numa_node,
                                 FormatBytes(t.memory_used), FormatBytes(t.memory_capacity),
                                 used_pct, t.ecc_corrected, t.ecc_uncorrected),
                     t.ecc_uncorrected > 0 ? Style::kAlert : Style::kHeading});

    Table cores({"CORE", "OWNER", "UTILIZATION", "CMD/S", "EXEC/S", "COMMANDS", "ERRORS"},
                {true, false, false, true, true, true, true});
    uint64_t errors_by_class[TERN_ERROR_CLASS_COUNT] = {};
    for (uint32_t c = 0; c < CoreCount(t); ++c) {
      const tern_core_telemetry_t& core = t.cores[c];
      const CoreRates rates = ComputeRates(before, after, d, c);
      for (uint32_t e = 0; e < TERN_ERROR_CLASS_COUNT; ++e) errors_by_class[e] += core.errors[e];
      const std::string owner =
          core.owner_pid != 0 ? fmt::format("{} {}", core.owner_pid, FieldText(core.owner_command))
                              : "free";
      cores.AddRow({std::to_string(c), owner,
                    measuring ? "measuring..."
                              : fmt::format("{} {:5.1f}%", Bar(rates.busy_ratio, 20),
                                            100.0 * rates.busy_ratio),
                    measuring ? "-" : fmt::format("{:.1f}", rates.commands_per_s),
                    measuring ? "-" : fmt::format("{:.1f}", rates.executions_per_s),
                    std::to_string(core.commands), std::to_string(TotalErrors(core))});
    }
    AppendTable(cores, "  ", &lines);

    // Only what is non-zero, so the lines fit a terminal.
    const std::string categories = DescribeCategories(t.memory_by_category, "  ");
    lines.push_back({"  HBM BY CATEGORY  " + (categories.empty() ? "none" : categories)});
    std::string errors;
    for (uint32_t e = 0; e < TERN_ERROR_CLASS_COUNT; ++e) {
      if (errors_by_class[e] == 0) continue;
      errors += fmt::format("  {} {}", ErrorClassName(e), errors_by_class[e]);
    }
    lines.push_back({"  ERRORS BY CLASS" + (errors.empty() ? "  none" : errors),
                     errors.empty() ? Style::kNormal : Style::kAlert});

    const uint32_t process_count = ProcessCount(t);
    if (process_count == 0) {
      lines.push_back({"  PROCESSES  none"});
      continue;
    }
    Table processes({"PID", "COMMAND", "CORES", "HBM", "BY CATEGORY"},
                    {true, false, false, true, false});
    for (uint32_t i = 0; i < process_count; ++i) {
      const tern_process_telemetry_t& p = t.processes[i];
      const std::string by_category = DescribeCategories(p.memory_by_category, ", ");
      processes.AddRow({std::to_string(p.pid), FieldText(p.command), FormatCoreMask(p.cores_owned),
                        FormatBytes(TotalBytes(p.memory_by_category)),
                        by_category.empty() ? "-" : by_category});
    }
    AppendTable(processes, "  ", &lines);
  }
  return lines;
}

// The curses session: set up on construction, and the terminal restored on
// destruction whatever way the loop ends (q, a signal, an exception).
class CursesScreen {
 public:
  CursesScreen() {
    screen_ = newterm(nullptr, stdout, stdin);
    if (screen_ == nullptr) {
      throw ToolError(
          "cannot start the terminal view (is TERM set to a known terminal?); use "
          "--once to print one frame");
    }
    set_term(screen_);
    cbreak();  // Ctrl-C still raises SIGINT, which stops the loop cleanly
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    // Short: keys and stop requests are noticed within 100 ms.
    timeout(100);
    if (has_colors()) {
      start_color();
      use_default_colors();
      init_pair(1, COLOR_RED, -1);
    }
  }
  ~CursesScreen() {
    endwin();
    delscreen(screen_);
  }
  CursesScreen(const CursesScreen&) = delete;
  CursesScreen& operator=(const CursesScreen&) = delete;

  void Draw(const std::vector<FrameLine>& lines) {
    erase();
    for (int row = 0; row < static_cast<int>(lines.size()) && row < LINES; ++row) {
      attr_t attributes = A_NORMAL;
      switch (lines[row].style) {
        case Style::kTitle:
          attributes = A_REVERSE;
          break;
        case Style::kHeading:
          attributes = A_BOLD;
          break;
        case Style::kTableHeader:
          attributes = A_UNDERLINE;
          break;
        case Style::kAlert:
          attributes = A_BOLD | (has_colors() ? COLOR_PAIR(1) : 0);
          break;
        case Style::kNormal:
          break;
      }
      attrset(attributes);
      mvaddnstr(row, 0, lines[row].text.c_str(), COLS);
      attrset(A_NORMAL);
    }
    refresh();
  }

 private:
  SCREEN* screen_ = nullptr;
};

int RunOnce(const TopOptions& options) {
  Runtime runtime;
  const NodeSample before = TakeSample(runtime);
  SleepUnlessStopped(options.delay_s);
  const NodeSample after = TakeSample(runtime);
  for (const FrameLine& line : RenderFrame(runtime, before, after, options.delay_s, false)) {
    std::cout << line.text << '\n';
  }
  std::cout.flush();
  return kExitOk;
}

int RunLive(const TopOptions& options) {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    throw ToolError(
        "the live view needs a terminal; use 'tern top --once' for one frame on "
        "stdout, or 'tern monitor' for a stream of samples");
  }
  Runtime runtime;
  NodeSample before = TakeSample(runtime);
  NodeSample after = before;
  bool measuring = true;  // no rates until the second sample
  CursesScreen screen;
  screen.Draw(RenderFrame(runtime, before, after, options.delay_s, measuring));
  uint64_t next_refresh = MonotonicNs() + static_cast<uint64_t>(options.delay_s * 1e9);
  while (!StopRequested()) {
    const int key = getch();
    if (key == 'q' || key == 'Q' || key == 3 /* Ctrl-C when ISIG is off */) break;
    const bool resized = key == KEY_RESIZE;
    const uint64_t now = MonotonicNs();
    if (now >= next_refresh) {
      before = std::move(after);
      after = TakeSample(runtime);
      measuring = false;
      next_refresh = now + static_cast<uint64_t>(options.delay_s * 1e9);
    } else if (!resized) {
      continue;
    }
    screen.Draw(RenderFrame(runtime, before, after, options.delay_s, measuring));
  }
  return kExitOk;
}

}  // namespace

Runner AddTopOptions(CLI::App* app) {
  auto options = std::make_shared<TopOptions>();
  AddPeriodOption(app, "-d,--delay", &options->delay_s, "Seconds between refreshes", 0.05, 3600.0);
  app->add_flag("--once", options->once,
                "Print one frame to stdout without the terminal view (rates over one delay)");
  return [options]() {
    // Before curses starts: ncurses installs its own SIGINT/SIGTERM
    // handlers only where none is set.
    InstallStopHandlers();
    return options->once ? RunOnce(*options) : RunLive(*options);
  };
}

}  // namespace tern::tools
