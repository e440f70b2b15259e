// `tern`: administration tools for the devices of a node, git-style
// subcommands over the public C API. See docs/tools.md.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <vector>

#include "subcommands.h"
#include "util.h"

namespace {

using tern::tools::Runner;

// A subcommand added to the app, and what runs it once it is parsed.
struct AddedSubcommand {
  CLI::App* app;
  Runner run;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "tern: inspect and check the accelerator devices of this node.\n"
      "Tools read the devices' shared telemetry and never take a core from a workload.",
      "tern");
  app.require_subcommand(1, 1);
  app.fallthrough(false);
  app.set_version_flag(
      "--version",
      [] {
        tern_version_t version = {};
        version.struct_size = sizeof(version);
        if (tern_get_version(&version) != TERN_OK) return std::string("tern (unknown version)");
        return "tern " + std::to_string(version.major) + "." + std::to_string(version.minor) + "." +
               std::to_string(version.patch) +
               (version.build ? std::string(" (") + version.build + ")" : "");
      },
      "Print the version of the tern library and exit");
  app.footer(
      "Run 'tern SUBCOMMAND --help' for the options of one subcommand.\n"
      "Environment: TERN_SIM_NODE and TERN_SIM_TOPOLOGY select the simulated node to inspect "
      "(use the workload's values).");

  std::vector<AddedSubcommand> subcommands;
  for (const tern::tools::SubcommandSpec& spec : tern::tools::Subcommands()) {
    CLI::App* subcommand = app.add_subcommand(spec.name, spec.summary);
    subcommand->footer(spec.help);
    subcommands.push_back({subcommand, spec.add_options(subcommand)});
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return tern::tools::kExitUsage;
  }

  for (const AddedSubcommand& subcommand : subcommands) {
    if (!subcommand.app->parsed()) continue;
    try {
      return subcommand.run();
    } catch (const tern::tools::ToolError& e) {
      std::cout.flush();
      std::fprintf(stderr, "tern %s: %s\n", subcommand.app->get_name().c_str(), e.what());
      return e.exit_code();
    } catch (const std::exception& e) {
      std::cout.flush();
      std::fprintf(stderr, "tern %s: internal error: %s\n", subcommand.app->get_name().c_str(),
                   e.what());
      return tern::tools::kExitError;
    }
  }
  return tern::tools::kExitUsage;  // unreachable: require_subcommand(1)
}
