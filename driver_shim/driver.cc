#include "driver.h"

#include "driver_shim/null/null_driver.h"
#include "driver_shim/sim/sim_driver.h"

namespace tern::driver {

const char* CommandKindName(CommandKind kind) {
  switch (kind) {
    case CommandKind::kNop:
      return "nop";
    case CommandKind::kCopy:
      return "copy";
    case CommandKind::kFill:
      return "fill";
    case CommandKind::kHostFunction:
      return "host callback";
    case CommandKind::kWait:
      return "event wait";
    case CommandKind::kTimestamp:
      return "event record";
    case CommandKind::kExecute:
      return "execute";
    case CommandKind::kHostTask:
      return "host task";
    case CommandKind::kSequence:
      return "graph launch";
  }
  return "unknown";
}

Status CreateDriver(const std::string& name, const DriverOptions& options,
                    std::unique_ptr<Driver>* out_driver) {
  out_driver->reset();
  if (name == "sim") return sim::CreateSimDriver(options, out_driver);
  if (name == "null") return null::CreateNullDriver(options, out_driver);
  return MakeStatus(TERN_ERROR_INVALID_ARGUMENT,
                    "unknown driver backend '{}'; set TERN_DRIVER to 'sim' (the simulated device) "
                    "or 'null' (the skeleton backend)",
                    name);
}

}  // namespace tern::driver
