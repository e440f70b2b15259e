#include "driver.h"

#include <fmt/format.h>

#include <memory>
#include <vector>

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

void CommandDetails::Clear() {
  wait_timeline.reset();
  wait_queue_name.reset();
  wait_value = 0;
  program.reset();
  function = 0;
  inputs.clear();
  outputs.clear();
  constants = MemoryRef{};
  scratch = MemoryRef{};
  launch.reset();
  constants_owner.reset();
}

std::string DescribeEventRecord(uint64_t sequence, const std::string* queue_name) {
  return fmt::format("the event recorded as command {} of queue '{}'", sequence,
                     queue_name != nullptr ? *queue_name : std::string("?"));
}

namespace {

// Recycled details of this thread, ready for its next commands.
constexpr size_t kRecycledDetailsPerThread = 32;
thread_local std::vector<std::unique_ptr<CommandDetails>> recycled_details;

}  // namespace

std::unique_ptr<CommandDetails> NewCommandDetails() {
  if (recycled_details.empty()) return std::make_unique<CommandDetails>();
  std::unique_ptr<CommandDetails> details = std::move(recycled_details.back());
  recycled_details.pop_back();
  return details;
}

void RecycleCommandDetails(std::unique_ptr<CommandDetails> details) {
  if (!details || recycled_details.size() >= kRecycledDetailsPerThread) return;
  details->Clear();
  recycled_details.push_back(std::move(details));
}

}  // namespace tern::driver
