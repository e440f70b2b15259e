// PrivateUse1 hooks: what ATen asks of a device backend it does not know
// (availability, devices, generators, pinned memory, storage resizing).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>

#include "aten/minimal.h"
#include "runtime/allocator.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/runtime.h"

namespace torch_tern {
namespace {

struct TernHooks final : public at::PrivateUse1HooksInterface {
  void init() const override { EnsureInitialized(); }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return DeviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    return IsInitialized() && device >= 0 && device < DeviceCount() && OpenedCoreIndex(device) >= 0;
  }
  c10::DeviceIndex deviceCount() const override { return DeviceCount(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { SetDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override { return CurrentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return ExchangeDevice(device);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    if (device < 0 || device >= DeviceCount()) return CurrentDevice();
    return ExchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return GetDefaultGenerator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return MakeGenerator(device);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    auto device = TernDeviceAllocator::Get().FindDevice(data);
    TORCH_CHECK(device.has_value(), "torch_tern: ", data, " is not tern device memory");
    return at::Device(c10::DeviceType::PrivateUse1, *device);
  }
  bool isPinnedPtr(const void* data) const override {
    return TernHostAllocator::Get().IsPinned(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return &TernHostAllocator::Get(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    ResizeStorageBytes(storage, new_bytes);
  }
};

struct Registerer {
  Registerer() { at::RegisterPrivateUse1HooksInterface(new TernHooks()); }
};
Registerer g_registerer;

}  // namespace
}  // namespace torch_tern
