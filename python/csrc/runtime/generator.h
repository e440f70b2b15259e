// The default generator of each tern device: a seed and an offset, the state
// of a counter-based RNG (Philox4x32-10, as tern's RANDOM instruction runs it).
// A random op reserves `n` counters (offset += n, rounded up to 4) and draws
// from (seed, old offset); the same seed and offset give the same numbers.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>

namespace torch_tern {

class TernGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit TernGeneratorImpl(c10::DeviceIndex device);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // Reserves `count` counters and returns the offset to draw from.
  // Callers hold mutex_.
  uint64_t Reserve(uint64_t count);

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  TernGeneratorImpl* clone_impl() const override;

  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

const at::Generator& GetDefaultGenerator(c10::DeviceIndex device);
at::Generator MakeGenerator(c10::DeviceIndex device);

}  // namespace torch_tern
