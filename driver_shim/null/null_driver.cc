#include "driver_shim/null/null_driver.h"

namespace tern::null {
namespace {

class NullDriver final : public driver::Driver {
 public:
  const char* name() const override { return "null"; }

  Status Enumerate(std::vector<driver::DeviceStaticInfo>* out_devices) override {
    out_devices->clear();
    return MakeStatus(TERN_ERROR_UNAVAILABLE,
                      "the null driver backend has no devices: it is a skeleton for new hardware "
                      "backends; set TERN_DRIVER=sim to use the simulated device");
  }

  Status OpenDevice(uint32_t physical_index, std::unique_ptr<driver::Device>* out_device) override {
    out_device->reset();
    return MakeStatus(TERN_ERROR_UNIMPLEMENTED,
                      "the null driver backend cannot open device {}: opening devices is not "
                      "implemented in this skeleton",
                      physical_index);
  }
};

}  // namespace

Status CreateNullDriver(const driver::DriverOptions& /*options*/,
                        std::unique_ptr<driver::Driver>* out) {
  *out = std::make_unique<NullDriver>();
  return OkStatus();
}

}  // namespace tern::null
