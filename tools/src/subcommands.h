// The subcommands of `tern`. Adding one: write tools/src/<name>.cc with an
// Add<Name>Command() that registers its options on the parent app and returns
// what runs it, declare it here, and list it in kSubcommands in main.cc.
#ifndef TERN_TOOLS_SRC_SUBCOMMANDS_H_
#define TERN_TOOLS_SRC_SUBCOMMANDS_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace tern::tools {

struct Subcommand {
  CLI::App* app = nullptr;   // the parsed options live in the runner's closure
  std::function<int()> run;  // returns the exit code; may throw ToolError
};

// Adds subcommand `name` to `parent` with its one-line `summary` (in `tern
// --help`) and the longer `footer` of its own --help.
inline CLI::App* AddSubcommandApp(CLI::App& parent, const std::string& name,
                                  const std::string& summary, const std::string& footer) {
  CLI::App* app = parent.add_subcommand(name, summary);
  app->footer(footer);
  return app;
}

// -j/--json, the same flag for every subcommand that prints a table.
inline void AddJsonFlag(CLI::App* app, bool* json) {
  app->add_flag("-j,--json", *json, "Print one JSON document instead of a table");
}

// A period in seconds (between samples, refreshes), 1 s by default.
inline CLI::Option* AddPeriodOption(CLI::App* app, const std::string& names, double* seconds,
                                    const std::string& help, double min_s, double max_s) {
  return app->add_option(names, *seconds, help)->default_val(1.0)->check(CLI::Range(min_s, max_s));
}

Subcommand AddLsCommand(CLI::App& parent);
Subcommand AddTopCommand(CLI::App& parent);
Subcommand AddMonitorCommand(CLI::App& parent);
Subcommand AddDiagCommand(CLI::App& parent);
Subcommand AddDumpCommand(CLI::App& parent);

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_SUBCOMMANDS_H_
