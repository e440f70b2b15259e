// The null backend: a skeleton with no devices. Every operation reports
// TERN_ERROR_UNAVAILABLE or TERN_ERROR_UNIMPLEMENTED. It is the place to start
// a backend for real hardware: implement Enumerate(), OpenDevice() and the
// Device methods against the kernel driver, one at a time.
#ifndef TERN_DRIVER_SHIM_NULL_NULL_DRIVER_H_
#define TERN_DRIVER_SHIM_NULL_NULL_DRIVER_H_

#include <memory>

#include "driver_shim/driver.h"

namespace tern::null {

Status CreateNullDriver(const driver::DriverOptions& options, std::unique_ptr<driver::Driver>* out);

}  // namespace tern::null

#endif  // TERN_DRIVER_SHIM_NULL_NULL_DRIVER_H_
