// The subcommands of `tern`. Adding one: write tools/src/<name>.cc with an
// Add<Name>Command() that registers its options on the parent app and returns
// what runs it, declare it here, and list it in kSubcommands in main.cc.
#ifndef TERN_TOOLS_SRC_SUBCOMMANDS_H_
#define TERN_TOOLS_SRC_SUBCOMMANDS_H_

#include <CLI/CLI.hpp>
#include <functional>

namespace tern::tools {

struct Subcommand {
  CLI::App* app = nullptr;   // the parsed options live in the runner's closure
  std::function<int()> run;  // returns the exit code; may throw ToolError
};

Subcommand AddLsCommand(CLI::App& parent);
Subcommand AddTopCommand(CLI::App& parent);
Subcommand AddMonitorCommand(CLI::App& parent);
Subcommand AddDiagCommand(CLI::App& parent);
Subcommand AddDumpCommand(CLI::App& parent);

}  // namespace tern::tools

#endif  // TERN_TOOLS_SRC_SUBCOMMANDS_H_
