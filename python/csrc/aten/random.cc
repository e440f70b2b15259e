// Random operators on the tern generator's (seed, offset) state, run on the
// device by tern's counter-based RANDOM instruction (Philox4x32-10).
//
// A draw of n elements reserves n counters of its generator (rounded up to
// 4) and uses the Philox stream of (seed, offset): element i is word i % 4
// of counter offset/4 + i/4. RANDOM takes seed and offset as instruction
// attributes, so an executable that contained it would be new for every
// draw. Instead, each device and stream keeps two pools (uniform [0, 1) and
// standard normal) holding that stream for a window of counters, filled by
// one one-off RANDOM execution; a draw binds the pool slice at its offset as
// an input (the offset is a binding offset, not part of the key) to a cached
// executable that transforms it (scale and shift, compare, cast, dropout's
// mask and product). The numbers are exactly those RANDOM would give for
// (seed, offset), so the pools change only the speed: draws larger than a
// quarter of a pool run the RANDOM instruction inside a one-off program.
//
// random_ over ranges wider than 2^32 values keeps the previous host path:
// a CPU generator seeded from (seed, offset), numbers copied over.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <torch/library.h>

#include <cmath>
#include <map>
#include <mutex>

#include "aten/minimal.h"
#include "aten/native.h"
#include "aten/register.h"
#include "runtime/generator.h"

namespace torch_tern {
namespace {

using native::IsTern;
using native::Operand;
using native::Program;
using native::Supported;
using native::TD;

constexpr int64_t kPoolElements = int64_t{1} << 18;  // 1 MiB of f32 per pool

enum class Source { kUniform, kNormal };

struct Pool {
  tern_buffer_t buffer = nullptr;
  bool filled = false;
  uint64_t seed = 0;
  uint64_t base = 0;  // element offset of the pool's first element (a multiple of 4)
};

std::mutex g_pool_mutex;
// (device, stream id, source) -> pool. Never freed (a few MiB per stream).
auto* g_pools = new std::map<std::tuple<int, int64_t, int>, Pool>();

struct Draw {
  uint64_t seed = 0;
  uint64_t offset = 0;  // elements
};

Draw Reserve(const at::Tensor& self, const std::optional<at::Generator>& generator, int64_t count) {
  auto* gen = at::get_generator_or_default<TernGeneratorImpl>(
      generator, GetDefaultGenerator(self.device().index()));
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return {gen->current_seed(), gen->Reserve(static_cast<uint64_t>(count))};
}

void EmitRandom(Program& p, const Operand& out, Source source, const Draw& d) {
  p.Emit(
      TERN_OP_RANDOM, {out},
      {source == Source::kUniform ? TERN_RANDOM_UNIFORM : TERN_RANDOM_NORMAL,
       static_cast<int64_t>(d.seed), static_cast<int64_t>(d.offset / 4)},
      source == Source::kUniform ? std::vector<double>{0.0, 1.0} : std::vector<double>{0.0, 1.0});
}

// The operand holding the `n` standard numbers of draw `d`, shaped `shape`.
// Sets *cache to false when the program must be one-off (large draws).
Operand SourceOperand(Program& p, c10::DeviceIndex device, Source source, const Draw& d,
                      at::IntArrayRef shape, bool* cache) {
  const int64_t n = c10::multiply_integers(shape);
  if (n > kPoolElements / 4) {
    *cache = false;
    Operand t = p.Temp(TERN_DTYPE_F32, shape);
    EmitRandom(p, t, source, d);
    return t;
  }
  // The caller holds g_pool_mutex until its program is queued (a refill by
  // another thread on the same stream must not come in between).
  const c10::Stream stream = GetCurrentStream(device);
  Pool& pool = (*g_pools)[{device, stream.id(), static_cast<int>(source)}];
  if (pool.buffer == nullptr) {
    tern_buffer_params_t params{};
    params.struct_size = sizeof(params);
    params.size = kPoolElements * sizeof(float);
    params.category = TERN_MEMORY_TENSORS;
    TERN_CHECK(tern_buffer_alloc(GetTernDevice(device), &params, &pool.buffer));
  }
  const bool covered =
      pool.filled && pool.seed == d.seed && pool.base <= d.offset &&
      d.offset + static_cast<uint64_t>(n) <= pool.base + static_cast<uint64_t>(kPoolElements);
  if (!covered) {
    // Refill from this draw on, in stream order (reads of the old contents
    // were queued before on the same stream).
    Program fill("tern::rng_pool");
    fill.SetDevice(device);
    EmitRandom(fill, fill.OutRaw(pool.buffer, 0, TERN_DTYPE_F32, kPoolElements), source, d);
    TORCH_CHECK(fill.Run(/*cache=*/false),
                "tern: filling the random pool failed: ", program::GetCacheInfo().last_error);
    pool.filled = true;
    pool.seed = d.seed;
    pool.base = d.offset;
  }
  *cache = true;
  return p.InRaw(pool.buffer, (d.offset - pool.base) * sizeof(float), TERN_DTYPE_F32, n)
      .View(shape);
}

bool FloatOk(const at::Tensor& t) {
  return IsTern(t) && at::isFloatingType(t.scalar_type()) && Supported(t.scalar_type()) &&
         program::ExecutablesAvailable();
}

// The largest value of `dtype` below `to` (uniform draws stay in [from, to)
// after rounding, as RANDOM's own uniform does).
double BelowInDtype(double to, at::ScalarType dtype) {
  const float f = static_cast<float>(to);
  if (dtype == at::kFloat) {
    return static_cast<double>(f) < to ? f : std::nextafter(f, -INFINITY);
  }
  auto step_down = [&](auto v) {
    using T = decltype(v);
    if (static_cast<double>(static_cast<float>(v)) < to) return static_cast<double>(v);
    uint16_t bits = v.x;
    if (static_cast<float>(v) == 0.0f) {
      bits = 0x8001;  // the smallest negative subnormal
    } else if (bits & 0x8000) {
      ++bits;
    } else {
      --bits;
    }
    return static_cast<double>(static_cast<float>(T(bits, T::from_bits())));
  };
  if (dtype == at::kBFloat16) return step_down(c10::BFloat16(f));
  return step_down(c10::Half(f));
}

// Runs the program `emit(p, drawn)` writes over `like.numel()` standard
// numbers of `source`, drawn with `gen` for `like` (its device and shape):
// a pool's numbers, read under the pools' lock until the program is queued.
// False when the program cannot run natively.
template <typename Emit>
bool RunOnDraws(const char* name, const at::Tensor& like, const std::optional<at::Generator>& gen,
                Source source, Emit&& emit) {
  const Draw d = Reserve(like, gen, like.numel());
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  Program p(name);
  bool cache = true;
  const Operand drawn = SourceOperand(p, like.device().index(), source, d, like.sizes(), &cache);
  emit(p, drawn);
  return p.ok() && p.Run(cache);
}

// self = scale * standard + shift, in f32, then rounded into self; with
// `below`, clamped to at most that value.
bool Affine(const char* name, at::Tensor& self, Source source,
            const std::optional<at::Generator>& gen, double scale, double shift,
            std::optional<double> below = std::nullopt) {
  if (!FloatOk(self) || self.numel() == 0) return self.numel() == 0 && IsTern(self);
  return RunOnDraws(name, self, gen, source, [&](Program& p, const Operand& s) {
    const native::Target t = native::BeginOut(p, self, at::kFloat);
    if (below.has_value()) {
      Operand scaled = p.Temp(TERN_DTYPE_F32, self.sizes());
      p.Emit(TERN_OP_UNARY, {scaled, s}, {TERN_UNARY_AFFINE}, {scale, shift});
      p.Emit(TERN_OP_UNARY, {t.write, scaled}, {TERN_UNARY_CLAMP}, {-INFINITY, *below});
    } else {
      p.Emit(TERN_OP_UNARY, {t.write, s}, {TERN_UNARY_AFFINE}, {scale, shift});
    }
    native::Finish(p, t);
  });
}

// ---- The host path (wide integer ranges) ---------------------------------------------

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <typename DrawFn>
at::Tensor& GenerateOnHost(at::Tensor& self, const std::optional<at::Generator>& generator,
                           DrawFn&& draw) {
  if (self.numel() == 0) return self;
  const Draw d = Reserve(self, generator, self.numel());
  at::Generator cpu =
      at::make_generator<at::CPUGeneratorImpl>(SplitMix64(d.seed ^ SplitMix64(d.offset)));
  at::Tensor host = at::empty(self.sizes(), self.options().device(at::kCPU));
  draw(host, cpu);
  Copy(host, self, false);
  return self;
}

// ---- Operators ------------------------------------------------------------------------

at::Tensor& Uniform(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from,
              " > to=", to);
  std::optional<double> below;
  if (to > from && IsTern(self) && at::isFloatingType(self.scalar_type()) &&
      Supported(self.scalar_type())) {
    below = BelowInDtype(to, self.scalar_type());
  }
  if (Affine("aten::uniform_", self, Source::kUniform, gen, to - from, from, below)) return self;
  return GenerateOnHost(self, gen,
                        [&](at::Tensor& t, at::Generator& g) { t.uniform_(from, to, g); });
}
TERN_ATEN_IMPL("uniform_", Uniform);

at::Tensor& Normal(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  if (Affine("aten::normal_", self, Source::kNormal, gen, std, mean)) return self;
  return GenerateOnHost(self, gen,
                        [&](at::Tensor& t, at::Generator& g) { t.normal_(mean, std, g); });
}
TERN_ATEN_IMPL("normal_", Normal);

at::Tensor& Exponential(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  // -log(1 - u) / lambda
  if (FloatOk(self) && self.numel() > 0 &&
      RunOnDraws(
          "aten::exponential_", self, gen, Source::kUniform, [&](Program& p, const Operand& u) {
            Operand one_minus = p.Temp(TERN_DTYPE_F32, self.sizes());
            Operand logged = p.Temp(TERN_DTYPE_F32, self.sizes());
            p.Emit(TERN_OP_UNARY, {one_minus, u}, {TERN_UNARY_AFFINE}, {-1.0, 1.0});
            p.Emit(TERN_OP_UNARY, {logged, one_minus}, {TERN_UNARY_LOG});
            const native::Target t = native::BeginOut(p, self, at::kFloat);
            p.Emit(TERN_OP_UNARY, {t.write, logged}, {TERN_UNARY_AFFINE}, {-1.0 / lambd, 0.0});
            native::Finish(p, t);
          })) {
    return self;
  }
  return GenerateOnHost(self, gen,
                        [&](at::Tensor& t, at::Generator& g) { t.exponential_(lambd, g); });
}
TERN_ATEN_IMPL("exponential_", Exponential);

// self = (u < p), p a scalar or a tensor broadcast to self.
bool Bernoulli(at::Tensor& self, const std::optional<double>& p_scalar, const at::Tensor& p_tensor,
               const std::optional<at::Generator>& gen) {
  if (!IsTern(self) || !Supported(self.scalar_type()) || !program::ExecutablesAvailable()) {
    return false;
  }
  if (p_tensor.defined() && (!IsTern(p_tensor) || !at::isFloatingType(p_tensor.scalar_type()) ||
                             !Supported(p_tensor.scalar_type()) ||
                             at::infer_size(self.sizes(), p_tensor.sizes()) != self.sizes())) {
    return false;
  }
  if (self.numel() == 0) return true;
  return RunOnDraws(
      "aten::bernoulli_", self, gen, Source::kUniform, [&](Program& p, const Operand& u) {
        const Operand prob = p_tensor.defined()
                                 ? native::Input(p, p_tensor, at::kFloat, self.sizes())
                                 : p.Const(*p_scalar, TERN_DTYPE_F32).Expand(self.sizes());
        const native::Target t = native::BeginOut(p, self, at::kBool);
        p.Emit(TERN_OP_BINARY, {t.write, u, prob}, {TERN_BINARY_LT});
        native::Finish(p, t);
      });
}

at::Tensor& BernoulliFloat(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(p >= 0 && p <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  if (Bernoulli(self, p, at::Tensor(), gen)) return self;
  return GenerateOnHost(self, gen, [&](at::Tensor& t, at::Generator& g) { t.bernoulli_(p, g); });
}
TERN_ATEN_IMPL("bernoulli_.float", BernoulliFloat);

at::Tensor& BernoulliTensor(at::Tensor& self, const at::Tensor& p,
                            std::optional<at::Generator> gen) {
  if (Bernoulli(self, std::nullopt, p, gen)) return self;
  const at::Tensor p_host = p.to(at::kCPU);
  return GenerateOnHost(self, gen,
                        [&](at::Tensor& t, at::Generator& g) { t.bernoulli_(p_host, g); });
}
TERN_ATEN_IMPL("bernoulli_.Tensor", BernoulliTensor);

// Integers uniform in [from, to): RANDOM's integer form, in one one-off
// program (the range is an attribute); wider ranges go to the host path.
bool RandomRange(at::Tensor& self, int64_t from, int64_t to,
                 const std::optional<at::Generator>& gen) {
  if (!IsTern(self) || !Supported(self.scalar_type()) || self.scalar_type() == at::kBool ||
      !program::ExecutablesAvailable() || from >= to ||
      static_cast<double>(to) - static_cast<double>(from) > 4294967296.0) {
    return false;
  }
  if (self.numel() == 0) return true;
  const at::ScalarType dtype = self.scalar_type();
  if (at::isIntegralType(dtype, false)) {
    // The range must fit the dtype.
    const double lo = dtype == at::kChar ? -128.0 : dtype == at::kInt ? -2147483648.0 : -9.2e18;
    const double hi = dtype == at::kChar ? 128.0 : dtype == at::kInt ? 2147483648.0 : 9.2e18;
    if (static_cast<double>(from) < lo || static_cast<double>(to) > hi) return false;
  } else if (std::abs(static_cast<double>(from)) > 16777216.0 ||
             std::abs(static_cast<double>(to)) > 16777217.0) {
    return false;  // beyond the exactly representable integers of f32
  }
  const Draw d = Reserve(self, gen, self.numel());
  Program p("aten::random_");
  const bool direct = at::isIntegralType(dtype, false);
  Operand target = direct ? p.Out(self) : p.Temp(TERN_DTYPE_I64, self.sizes());
  p.Emit(TERN_OP_RANDOM, {target},
         {TERN_RANDOM_UNIFORM, static_cast<int64_t>(d.seed), static_cast<int64_t>(d.offset / 4)},
         {static_cast<double>(from), static_cast<double>(to)});
  if (!direct) p.Emit(TERN_OP_CAST, {p.Out(self), target});
  return p.Run(/*cache=*/false);
}

at::Tensor& RandomFrom(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                       std::optional<at::Generator> gen) {
  if (to.has_value() && RandomRange(self, from, *to, gen)) return self;
  return GenerateOnHost(self, gen,
                        [&](at::Tensor& t, at::Generator& g) { t.random_(from, to, g); });
}
TERN_ATEN_IMPL("random_.from", RandomFrom);

at::Tensor& RandomTo(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  if (RandomRange(self, 0, to, gen)) return self;
  return GenerateOnHost(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(to, g); });
}
TERN_ATEN_IMPL("random_.to", RandomTo);

at::Tensor& Random(at::Tensor& self, std::optional<at::Generator> gen) {
  return GenerateOnHost(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(g); });
}
TERN_ATEN_IMPL("random_", Random);

// Dropout: keep = (u < 1 - p), out = input * keep * (1 / (1 - p)), one program.
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
  const double scale = 1.0 / (1.0 - p);
  if (FloatOk(input)) {
    at::Tensor out = at::empty_like(input);
    if (input.numel() == 0) return {out, mask};
    const at::ScalarType cd = native::OpMath(input.scalar_type());
    const tern_dtype_t f = *TD(cd);
    if (RunOnDraws("aten::native_dropout", input, std::nullopt, Source::kUniform,
                   [&](Program& prog, const Operand& u) {
                     const at::IntArrayRef shape = input.sizes();
                     const Operand keep = prog.Out(mask);
                     prog.Emit(TERN_OP_BINARY,
                               {keep, u, prog.Const(1.0 - p, TERN_DTYPE_F32).Expand(shape)},
                               {TERN_BINARY_LT});
                     Operand keep_f = prog.Temp(f, shape), kept = prog.Temp(f, shape);
                     prog.Emit(TERN_OP_CAST, {keep_f, keep});
                     prog.Emit(TERN_OP_BINARY,
                               {kept, native::Input(prog, input, cd, shape), keep_f},
                               {TERN_BINARY_MUL});
                     const native::Target t = native::BeginOut(prog, out, cd);
                     prog.Emit(TERN_OP_BINARY, {t.write, kept, prog.Const(scale, f).Expand(shape)},
                               {TERN_BINARY_MUL});
                     native::Finish(prog, t);
                   })) {
      return {out, mask};
    }
  }
  BernoulliFloat(mask, 1 - p, std::nullopt);
  return {input * mask * scale, mask};
}
TERN_ATEN_IMPL("native_dropout", NativeDropout);

}  // namespace
}  // namespace torch_tern
