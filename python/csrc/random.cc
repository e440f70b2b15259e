// Random operators driven by the tern generator's (seed, offset) state.
//
// Each call reserves numel() counters of its generator and draws from
// (seed, start offset): torch.tern.manual_seed(s) makes every tern random op
// reproducible, independently of the CPU generator. Until tern's counter-based
// RANDOM instruction runs them on the device (kernels.h), the numbers come
// from a CPU generator seeded with a hash of (seed, offset) and are copied to
// the device; only the stream of numbers will change when that happens, not
// the seeding contract.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <torch/library.h>

#include <mutex>

#include "generator.h"
#include "ops.h"

namespace torch_tern {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <typename Draw>
at::Tensor& Generate(at::Tensor& self, const std::optional<at::Generator>& generator, Draw&& draw) {
  if (self.numel() == 0) return self;
  auto* gen = at::get_generator_or_default<TernGeneratorImpl>(
      generator, GetDefaultGenerator(self.device().index()));
  uint64_t seed = 0;
  uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    seed = gen->current_seed();
    offset = gen->Reserve(static_cast<uint64_t>(self.numel()));
  }
  at::Generator cpu =
      at::make_generator<at::CPUGeneratorImpl>(SplitMix64(seed ^ SplitMix64(offset)));
  at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
  draw(host, cpu);
  Copy(host, self, false);
  return self;
}

at::Tensor& Uniform(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.uniform_(from, to, g); });
}

at::Tensor& Normal(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.normal_(mean, std, g); });
}

at::Tensor& BernoulliFloat(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.bernoulli_(p, g); });
}

at::Tensor& BernoulliTensor(at::Tensor& self, const at::Tensor& p,
                            std::optional<at::Generator> gen) {
  const at::Tensor p_host = p.to(at::kCPU);
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.bernoulli_(p_host, g); });
}

at::Tensor& RandomFrom(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                       std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(from, to, g); });
}

at::Tensor& RandomTo(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(to, g); });
}

at::Tensor& Random(at::Tensor& self, std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(g); });
}

at::Tensor& Exponential(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  return Generate(self, gen, [&](at::Tensor& t, at::Generator& g) { t.exponential_(lambd, g); });
}

// Dropout through the tern generator (the CPU kernel would use the CPU one).
std::tuple<at::Tensor, at::Tensor> NativeDropout(const at::Tensor& input, double p,
                                                 std::optional<bool> train) {
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  if (p >= 1) {
    mask.zero_();
    return {at::zeros_like(input), mask};
  }
  BernoulliFloat(mask, 1 - p, std::nullopt);
  const double scale = 1.0 / (1.0 - p);
  return {input * mask * scale, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("uniform_", Uniform);
  m.impl("normal_", Normal);
  m.impl("bernoulli_.float", BernoulliFloat);
  m.impl("bernoulli_.Tensor", BernoulliTensor);
  m.impl("random_.from", RandomFrom);
  m.impl("random_.to", RandomTo);
  m.impl("random_", Random);
  m.impl("exponential_", Exponential);
  m.impl("native_dropout", NativeDropout);
}

}  // namespace torch_tern
