// `tern dump FILE`: the executable inspector. Not written yet: the subcommand
// is registered so that `tern --help` lists it, and says so when run. It will
// print the header, sections, signature and program of an executable.
#include <iostream>
#include <memory>
#include <string>

#include "subcommands.h"
#include "util.h"

namespace tern::tools {

Subcommand AddDumpCommand(CLI::App& parent) {
  auto file = std::make_shared<std::string>();
  CLI::App* app = parent.add_subcommand("dump", "Inspect an executable file (not available yet)");
  app->footer(
      "Print the header, sections, signature and instruction streams of a tern executable. "
      "Not available yet in this version of the tools.");
  app->add_option("FILE", *file, "The executable to inspect")->required();
  return {app, [file]() -> int {
            throw ToolError(
                "not available yet: the executable inspector is not part of this "
                "version of the tools, so " +
                *file + " was not read");
          }};
}

}  // namespace tern::tools
