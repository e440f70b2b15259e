// The subcommands of `tern`. Their names, summaries and long help live in
// one table, kSubcommands in subcommands.cc (the order of `tern --help`);
// each <name>.cc holds only what differs: Add<Name>Options(), which adds the
// subcommand's options and returns what runs it.
//
// Adding one: write tools/src/<name>.cc with its Add<Name>Options(), declare
// it here, and add its row to kSubcommands.
#ifndef TERN_TOOLS_SRC_SUBCOMMANDS_H_
#define TERN_TOOLS_SRC_SUBCOMMANDS_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <span>
#include <string>

namespace tern::tools {

// Runs a parsed subcommand (its options live in the closure) and returns the
// exit code; may throw ToolError.
using Runner = std::function<int()>;

struct SubcommandSpec {
  const char* name;
  const char* summary;  // one line, in `tern --help`
  const char* help;     // the footer of `tern <name> --help`
  // Adds the options to the subcommand's app and returns what runs it.
  Runner (*add_options)(CLI::App* app);
};

// Every subcommand, in the order of `tern --help`.
std::span<const SubcommandSpec> Subcommands();

Runner AddLsOptions(CLI::App* app);
Runner AddTopOptions(CLI::App* app);
Runner AddMonitorOptions(CLI::App* app);
Runner AddDiagOptions(CLI::App* app);
Runner AddDumpOptions(CLI::App* app);

// -j/--json, the same flag for every subcommand that prints a table.
inline void AddJsonFlag(CLI::App* app, bool* json) {
  app->add_flag("-j,--json", *json, "Print one JSON document instead of a table");
}

// A period in seconds (between samples, refreshes), 1 s by default.
inline CLI::Option* AddPeriodOption(CLI::App* app, const std::string& names, double* seconds,
                                    const std::string& help, double min_s, double max_s) {
  return app->add_option(names, *seconds, help)->default_val(1.0)->check(CLI::Range(min_s, max_s));
}

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_SUBCOMMANDS_H_
