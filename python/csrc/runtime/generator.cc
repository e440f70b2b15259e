#include "runtime/generator.h"

#include <ATen/Functions.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/capture.h"
#include "runtime/runtime.h"

namespace torch_tern {

namespace {
constexpr size_t kStateBytes = 2 * sizeof(uint64_t);  // seed, offset
}

TernGeneratorImpl::TernGeneratorImpl(c10::DeviceIndex device)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

void TernGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t TernGeneratorImpl::current_seed() const { return seed_; }

uint64_t TernGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom();
  set_current_seed(random);
  return random;
}

void TernGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "tern generator offsets are multiples of 4, got ", offset);
  offset_ = offset;
}

uint64_t TernGeneratorImpl::get_offset() const { return offset_; }

uint64_t TernGeneratorImpl::Reserve(uint64_t count) {
  RefuseIfCurrentStreamCapturing(
      "drawing random numbers (every replay would repeat the numbers drawn at capture time)");
  const uint64_t start = offset_;
  offset_ += (count + 3) / 4 * 4;
  return start;
}

void TernGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.device().is_cpu() && new_state.numel() == kStateBytes,
              "tern generator state must be a CPU uint8 tensor of ", kStateBytes, " bytes");
  uint64_t words[2];
  std::memcpy(words, new_state.data(), kStateBytes);
  seed_ = words[0];
  set_offset(words[1]);
}

c10::intrusive_ptr<c10::TensorImpl> TernGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({static_cast<int64_t>(kStateBytes)}, at::kByte);
  const uint64_t words[2] = {seed_, offset_};
  std::memcpy(state.data_ptr(), words, kStateBytes);
  return state.getIntrusivePtr();
}

TernGeneratorImpl* TernGeneratorImpl::clone_impl() const {
  auto* copy = new TernGeneratorImpl(device().index());
  copy->seed_ = seed_;
  copy->offset_ = offset_;
  return copy;
}

const at::Generator& GetDefaultGenerator(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<at::Generator>>* generators =
      new std::vector<std::unique_ptr<at::Generator>>();
  if (device < 0) device = CurrentDevice();
  EnsureInitialized();
  CheckDeviceIndex(device);
  std::lock_guard<std::mutex> lock(mutex);
  if (generators->empty()) generators->resize(DeviceCount());
  auto& slot = (*generators)[device];
  if (!slot) slot = std::make_unique<at::Generator>(at::make_generator<TernGeneratorImpl>(device));
  return *slot;
}

at::Generator MakeGenerator(c10::DeviceIndex device) {
  if (device < 0) device = CurrentDevice();
  return at::make_generator<TernGeneratorImpl>(device);
}

}  // namespace torch_tern
