// RunInstruction: the dispatch to the opcode families, and the shared pieces
// of kernels_internal.h (layouts, typed loads and stores).
#include "driver_shim/sim/engines/run_instruction.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "driver_shim/sim/engines/kernels_internal.h"
#include "driver_shim/sim/engines/kernels_testing.h"
#include "driver_shim/sim/engines/numerics.h"

namespace tern::sim {
namespace kernels {

thread_local bool t_kernels_on_this_thread = false;
thread_local int t_kernel_threads_for_testing = 0;

Layout MakeLayout(uint32_t rank, const int64_t* shape, std::span<const int64_t* const> strides) {
  Layout layout;
  layout.operands = static_cast<int>(strides.size());
  const int64_t* const* s = strides.data();
  int64_t count = 1;
  for (uint32_t d = 0; d < rank; ++d) count *= shape[d];
  layout.count = count;
  // Walk from the innermost dimension outwards, merging where every operand
  // is contiguous across the boundary.
  int64_t dims[TERN_MAX_RANK];
  int64_t st[kMaxLayoutOperands][TERN_MAX_RANK];
  int n = 0;
  for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = n > 0 && count != 0;
    for (int o = 0; merge && o < layout.operands; ++o)
      merge = s[o][d] == st[o][n - 1] * dims[n - 1];
    if (merge) {
      dims[n - 1] *= shape[d];
      continue;
    }
    dims[n] = shape[d];
    for (int o = 0; o < layout.operands; ++o) st[o][n] = s[o][d];
    ++n;
  }
  if (n == 0) {
    layout.rank = 1;
    layout.shape[0] = 1;
    for (int o = 0; o < layout.operands; ++o) layout.strides[o][0] = 0;
    return layout;
  }
  layout.rank = n;
  for (int i = 0; i < n; ++i) {
    layout.shape[i] = dims[n - 1 - i];
    for (int o = 0; o < layout.operands; ++o) layout.strides[o][i] = st[o][n - 1 - i];
  }
  return layout;
}

Layout MakeLayoutInMemoryOrder(uint32_t rank, const int64_t* shape,
                               std::span<const int64_t* const> strides) {
  const int operands = static_cast<int>(strides.size());
  // <0 when dimension a lies inside b in memory, >0 when outside, 0 when no
  // operand tells.
  auto compare = [&](int a, int b) {
    for (int o = 0; o < operands; ++o) {
      const int64_t sa = strides[o][a] < 0 ? -strides[o][a] : strides[o][a];
      const int64_t sb = strides[o][b] < 0 ? -strides[o][b] : strides[o][b];
      if (sa == 0 || sb == 0 || sa == sb) continue;
      return sa < sb ? -1 : 1;
    }
    return 0;
  };
  // order[0] outermost; a stable insertion sort keeps the logical order
  // wherever the strides do not decide.
  int order[TERN_MAX_RANK];
  const int r = static_cast<int>(std::min<uint32_t>(rank, TERN_MAX_RANK));
  bool permuted = false;
  for (int d = 0; d < r; ++d) {
    order[d] = d;
    for (int j = d; j > 0 && compare(order[j - 1], order[j]) < 0; --j) {
      std::swap(order[j - 1], order[j]);
      permuted = true;
    }
  }
  if (!permuted) return MakeLayout(rank, shape, strides);
  int64_t sorted_shape[TERN_MAX_RANK];
  int64_t sorted_strides[kMaxLayoutOperands][TERN_MAX_RANK];
  const int64_t* sorted[kMaxLayoutOperands];
  for (int d = 0; d < r; ++d) {
    sorted_shape[d] = shape[order[d]];
    for (int o = 0; o < operands; ++o) sorted_strides[o][d] = strides[o][order[d]];
  }
  for (int o = 0; o < operands; ++o) sorted[o] = sorted_strides[o];
  return MakeLayout(static_cast<uint32_t>(r), sorted_shape,
                    std::span<const int64_t* const>(sorted, static_cast<size_t>(operands)));
}

namespace {

template <typename I>
TERN_INLINE I FloatToInt(float v) {
  constexpr float kLo = -static_cast<float>(uint64_t{1} << (sizeof(I) * 8 - 1));
  constexpr float kHi = static_cast<float>(uint64_t{1} << (sizeof(I) * 8 - 1));
  float c = v != v ? 0.0f : v;
  c = c < kLo ? kLo : c;
  return c >= kHi ? std::numeric_limits<I>::max() : static_cast<I>(c);
}

// The same rules from an f64 value.
template <typename I>
TERN_INLINE I DoubleToInt(double v) {
  constexpr double kLo = -static_cast<double>(uint64_t{1} << (sizeof(I) * 8 - 1));
  constexpr double kHi = static_cast<double>(uint64_t{1} << (sizeof(I) * 8 - 1));
  double c = v != v ? 0.0 : v;
  c = c < kLo ? kLo : c;
  return c >= kHi ? std::numeric_limits<I>::max() : static_cast<I>(c);
}

template <typename S, typename Conv>
TERN_INLINE void LoadLoop(const uint8_t* p, int64_t stride, int64_t n, float* out, Conv conv) {
  const S* src = reinterpret_cast<const S*>(p);
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = conv(src[i]);
  } else if (stride == 0) {
    const float v = conv(src[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = conv(src[i * stride]);
  }
}

template <typename D, typename Conv, typename In>
TERN_INLINE void StoreLoop(uint8_t* p, int64_t stride, int64_t n, const In* in, Conv conv) {
  D* dst = reinterpret_cast<D*>(p);
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = conv(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = conv(in[i]);
  }
}

}  // namespace

TERN_VECTOR_CLONES
void LoadF32(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, float* out) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      if (stride == 1) {
        std::memcpy(out, p, n * sizeof(float));
        return;
      }
      return LoadLoop<float>(p, stride, n, out, [](float v) { return v; });
    case TERN_DTYPE_BF16:
      return LoadLoop<uint16_t>(p, stride, n, out, [](uint16_t v) { return num::Bf16ToF32(v); });
    case TERN_DTYPE_F16:
      return LoadLoop<uint16_t>(p, stride, n, out, [](uint16_t v) { return num::F16ToF32(v); });
    case TERN_DTYPE_I8:
      return LoadLoop<int8_t>(p, stride, n, out, [](int8_t v) { return static_cast<float>(v); });
    case TERN_DTYPE_I32:
      return LoadLoop<int32_t>(p, stride, n, out, [](int32_t v) { return static_cast<float>(v); });
    case TERN_DTYPE_I64:
      return LoadLoop<int64_t>(p, stride, n, out, [](int64_t v) { return static_cast<float>(v); });
    case TERN_DTYPE_BOOL:
      return LoadLoop<uint8_t>(p, stride, n, out, [](uint8_t v) { return v ? 1.0f : 0.0f; });
    case TERN_DTYPE_F64:
      return LoadLoop<double>(p, stride, n, out, [](double v) { return static_cast<float>(v); });
    default:
      return;
  }
}

TERN_VECTOR_CLONES
void StoreF32(tern_dtype_t dtype, uint8_t* p, int64_t stride, int64_t n, const float* in) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      if (stride == 1) {
        std::memcpy(p, in, n * sizeof(float));
        return;
      }
      return StoreLoop<float>(p, stride, n, in, [](float v) { return v; });
    case TERN_DTYPE_BF16:
      return StoreLoop<uint16_t>(p, stride, n, in, [](float v) { return num::F32ToBf16(v); });
    case TERN_DTYPE_F16:
      return StoreLoop<uint16_t>(p, stride, n, in, [](float v) { return num::F32ToF16(v); });
    case TERN_DTYPE_I8:
      return StoreLoop<int8_t>(p, stride, n, in, [](float v) { return FloatToInt<int8_t>(v); });
    case TERN_DTYPE_I32:
      return StoreLoop<int32_t>(p, stride, n, in, [](float v) { return FloatToInt<int32_t>(v); });
    case TERN_DTYPE_I64:
      return StoreLoop<int64_t>(p, stride, n, in, [](float v) { return FloatToInt<int64_t>(v); });
    case TERN_DTYPE_BOOL:
      return StoreLoop<uint8_t>(p, stride, n, in,
                                [](float v) { return static_cast<uint8_t>(v != 0.0f); });
    case TERN_DTYPE_F64:
      return StoreLoop<double>(p, stride, n, in, [](float v) { return static_cast<double>(v); });
    default:
      return;
  }
}

namespace {

template <typename S>
TERN_INLINE void LoadI64Loop(const uint8_t* p, int64_t stride, int64_t n, int64_t* out) {
  const S* src = reinterpret_cast<const S*>(p);
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(src[i * stride]);
  }
}

template <typename D>
TERN_INLINE void StoreI64Loop(uint8_t* p, int64_t stride, int64_t n, const int64_t* in) {
  D* dst = reinterpret_cast<D*>(p);
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = static_cast<D>(in[i]);
  }
}

// Conversions that go through another load or store: n elements in chunks
// of 256 loaded as Mid by `load` and converted into out, or converted from
// in to Mid and stored by `store`.
template <typename Mid, typename Out, typename LoadFn, typename Convert>
TERN_INLINE void LoadThrough(LoadFn load, tern_dtype_t dtype, const uint8_t* p, int64_t stride,
                             int64_t n, Out* out, Convert convert) {
  Mid tmp[256];
  const int64_t step = stride * static_cast<int64_t>(isa::DTypeSize(dtype));
  for (int64_t done = 0; done < n; done += 256) {
    const int64_t m = std::min<int64_t>(256, n - done);
    load(dtype, p + done * step, stride, m, tmp);
    for (int64_t i = 0; i < m; ++i) out[done + i] = convert(tmp[i]);
  }
}

template <typename Mid, typename In, typename StoreFn>
TERN_INLINE void StoreThrough(StoreFn store, tern_dtype_t dtype, uint8_t* p, int64_t stride,
                              int64_t n, const In* in) {
  Mid tmp[256];
  const int64_t step = stride * static_cast<int64_t>(isa::DTypeSize(dtype));
  for (int64_t done = 0; done < n; done += 256) {
    const int64_t m = std::min<int64_t>(256, n - done);
    for (int64_t i = 0; i < m; ++i) tmp[i] = static_cast<Mid>(in[done + i]);
    store(dtype, p + done * step, stride, m, tmp);
  }
}

}  // namespace

TERN_VECTOR_CLONES
void LoadI64(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, int64_t* out) {
  switch (dtype) {
    case TERN_DTYPE_I8:
      return LoadI64Loop<int8_t>(p, stride, n, out);
    case TERN_DTYPE_I32:
      return LoadI64Loop<int32_t>(p, stride, n, out);
    case TERN_DTYPE_I64:
      return LoadI64Loop<int64_t>(p, stride, n, out);
    case TERN_DTYPE_BOOL: {
      const uint8_t* src = p;
      for (int64_t i = 0; i < n; ++i) out[i] = src[i * stride] != 0;
      return;
    }
    case TERN_DTYPE_F64: {
      const double* src = reinterpret_cast<const double*>(p);
      for (int64_t i = 0; i < n; ++i) out[i] = DoubleToInt<int64_t>(src[i * stride]);
      return;
    }
    default:  // floats: through f32, truncating
      return LoadThrough<float>(LoadF32, dtype, p, stride, n, out,
                                [](float v) { return FloatToInt<int64_t>(v); });
  }
}

TERN_VECTOR_CLONES
void StoreI64(tern_dtype_t dtype, uint8_t* p, int64_t stride, int64_t n, const int64_t* in) {
  switch (dtype) {
    case TERN_DTYPE_I8:
      return StoreI64Loop<int8_t>(p, stride, n, in);
    case TERN_DTYPE_I32:
      return StoreI64Loop<int32_t>(p, stride, n, in);
    case TERN_DTYPE_I64:
      return StoreI64Loop<int64_t>(p, stride, n, in);
    case TERN_DTYPE_BOOL:
      for (int64_t i = 0; i < n; ++i) p[i * stride] = in[i] != 0;
      return;
    case TERN_DTYPE_F64: {
      double* dst = reinterpret_cast<double*>(p);
      for (int64_t i = 0; i < n; ++i) dst[i * stride] = static_cast<double>(in[i]);
      return;
    }
    default:
      return StoreThrough<float>(StoreF32, dtype, p, stride, n, in);
  }
}

TERN_VECTOR_CLONES
void LoadF64(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, double* out) {
  if (dtype == TERN_DTYPE_F64) {
    const double* src = reinterpret_cast<const double*>(p);
    for (int64_t i = 0; i < n; ++i) out[i] = src[i * stride];
    return;
  }
  if (dtype == TERN_DTYPE_I64 || dtype == TERN_DTYPE_I32 || dtype == TERN_DTYPE_I8 ||
      dtype == TERN_DTYPE_BOOL) {
    return LoadThrough<int64_t>(LoadI64, dtype, p, stride, n, out,
                                [](int64_t v) { return static_cast<double>(v); });
  }
  // The 32- and 16-bit floats: exact in f64.
  LoadThrough<float>(LoadF32, dtype, p, stride, n, out,
                     [](float v) { return static_cast<double>(v); });
}

TERN_VECTOR_CLONES
void StoreF64(tern_dtype_t dtype, uint8_t* p, int64_t stride, int64_t n, const double* in) {
  switch (dtype) {
    case TERN_DTYPE_F64: {
      double* dst = reinterpret_cast<double*>(p);
      for (int64_t i = 0; i < n; ++i) dst[i * stride] = in[i];
      return;
    }
    case TERN_DTYPE_I8:
      return StoreLoop<int8_t>(p, stride, n, in, [](double v) { return DoubleToInt<int8_t>(v); });
    case TERN_DTYPE_I32:
      return StoreLoop<int32_t>(p, stride, n, in, [](double v) { return DoubleToInt<int32_t>(v); });
    case TERN_DTYPE_I64:
      return StoreLoop<int64_t>(p, stride, n, in, [](double v) { return DoubleToInt<int64_t>(v); });
    case TERN_DTYPE_BOOL:
      return StoreLoop<uint8_t>(p, stride, n, in,
                                [](double v) { return static_cast<uint8_t>(v != 0.0); });
    default:  // the 32- and 16-bit floats: through f32, as PyTorch's casts round
      return StoreThrough<float>(StoreF32, dtype, p, stride, n, in);
  }
}

double LoadOneF64(tern_dtype_t dtype, const uint8_t* p) {
  switch (dtype) {
    case TERN_DTYPE_I64:
      return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case TERN_DTYPE_F64:
      return *reinterpret_cast<const double*>(p);
    default: {
      float v;
      LoadF32(dtype, p, 1, 1, &v);
      return v;
    }
  }
}

int64_t LoadOneI64(tern_dtype_t dtype, const uint8_t* p) {
  int64_t v;
  LoadI64(dtype, p, 1, 1, &v);
  return v;
}

// Strided operand <-> contiguous f32 buffer (row-major).
void GatherF32(const TensorView& view, float* out) {
  const isa::OperandDesc& d = *view.desc;
  Layout l = MakeLayout(d.rank, d.shape.data(), {d.strides.data()});
  if (l.count == 0) return;
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(d.dtype));
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    float* o = out + begin;
    ForEachRun(l, begin, end, [&](const int64_t* off, int64_t n) {
      LoadF32(d.dtype, view.data + off[0] * esize, l.strides[0][l.rank - 1], n, o);
      o += n;
    });
  });
}

void ScatterF32(const TensorView& view, const float* in) {
  const isa::OperandDesc& d = *view.desc;
  Layout l = MakeLayout(d.rank, d.shape.data(), {d.strides.data()});
  if (l.count == 0) return;
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(d.dtype));
  ParallelFor(l.count, kParallelGrain, [&](int64_t begin, int64_t end) {
    const float* i = in + begin;
    ForEachRun(l, begin, end, [&](const int64_t* off, int64_t n) {
      StoreF32(d.dtype, view.data + off[0] * esize, l.strides[0][l.rank - 1], n, i);
      i += n;
    });
  });
}

std::string IndexString(const int64_t* index, uint32_t rank) {
  return isa::ShapeString(index, rank);
}

}  // namespace kernels

Status RunInstruction(const driver::Instruction& instruction,
                      std::span<const TensorView> operands) {
  using namespace kernels;
  if (operands.size() != instruction.operands.size()) {
    return MakeStatus(
        TERN_ERROR_INTERNAL, "{}: {} operand views for {} operands",
        isa::OpcodeName(instruction.opcode) ? isa::OpcodeName(instruction.opcode) : "?",
        operands.size(), instruction.operands.size());
  }
  for (size_t i = 0; i < operands.size(); ++i) {
    const bool present = instruction.operands[i].present();
    if (operands[i].desc == nullptr ||
        (present && operands[i].data == nullptr && operands[i].desc->element_count() != 0)) {
      return MakeStatus(
          TERN_ERROR_INTERNAL, "{}: operand {} has no memory",
          isa::OpcodeName(instruction.opcode) ? isa::OpcodeName(instruction.opcode) : "?", i);
    }
  }
  const auto& ins = instruction;
  switch (instruction.opcode) {
    case TERN_OP_COPY:
      return RunCopy(ins, operands);
    case TERN_OP_CAST:
      return RunCast(ins, operands);
    case TERN_OP_FILL:
      return RunFill(ins, operands);
    case TERN_OP_MATMUL:
      return RunMatmul(ins, operands);
    case TERN_OP_CONV2D:
      return RunConv2d(ins, operands);
    case TERN_OP_CONV2D_BACKWARD_INPUT:
      return RunConv2dBackwardInput(ins, operands);
    case TERN_OP_CONV2D_BACKWARD_WEIGHT:
      return RunConv2dBackwardWeight(ins, operands);
    case TERN_OP_BINARY:
      return RunBinary(ins, operands);
    case TERN_OP_WHERE:
      return RunWhere(ins, operands);
    case TERN_OP_REDUCE:
      return RunReduce(ins, operands);
    case TERN_OP_SOFTMAX:
      return RunSoftmax(ins, operands);
    case TERN_OP_SOFTMAX_BACKWARD:
      return RunSoftmaxBackward(ins, operands);
    case TERN_OP_LAYER_NORM:
      return RunLayerNorm(ins, operands);
    case TERN_OP_LAYER_NORM_BACKWARD:
      return RunLayerNormBackward(ins, operands);
    case TERN_OP_RMS_NORM:
      return RunRmsNorm(ins, operands);
    case TERN_OP_RMS_NORM_BACKWARD:
      return RunRmsNormBackward(ins, operands);
    case TERN_OP_ELEMENTWISE:
      return RunElementwiseProgram(ins, operands);
    case TERN_OP_SCAN:
      return RunScan(ins, operands);
    case TERN_OP_UNARY:
      return RunUnary(ins, operands);
    case TERN_OP_UNARY_BACKWARD:
      return RunUnaryBackward(ins, operands);
    case TERN_OP_GATHER:
      return RunGather(ins, operands);
    case TERN_OP_SCATTER_ADD:
      return RunScatterAdd(ins, operands);
    case TERN_OP_TAKE_ALONG_AXIS:
      return RunTakeAlongAxis(ins, operands);
    case TERN_OP_SCATTER_ADD_ALONG_AXIS:
      return RunScatterAddAlongAxis(ins, operands);
    case TERN_OP_IOTA:
      return RunIota(ins, operands);
    case TERN_OP_RANDOM:
      return RunRandom(ins, operands);
    case TERN_OP_SORT:
      return RunSort(ins, operands);
    case TERN_OP_TOPK:
      return RunTopk(ins, operands);
    case TERN_OP_SCATTER:
      return RunScatter(ins, operands);
    case TERN_OP_SCATTER_ALONG_AXIS:
      return RunScatterAlongAxis(ins, operands);
    case TERN_OP_ALL_REDUCE:
      return MakeStatus(
          TERN_ERROR_UNIMPLEMENTED,
          "all_reduce: collectives inside executables are not implemented yet; run the "
          "collective on a queue with the collectives API between executions");
    case TERN_OP_SEM_SIGNAL:
    case TERN_OP_SEM_WAIT:
      return OkStatus();  // the schedule already honours the semaphores
    default:
      return MakeStatus(TERN_ERROR_EXECUTABLE_UNSUPPORTED,
                        "opcode 0x{:04x} is not known to the simulated engines",
                        instruction.opcode);
  }
}

std::shared_ptr<const void> PrepareInstruction(const driver::Instruction& instruction,
                                               const uint8_t* constants) {
  if (instruction.opcode != TERN_OP_MATMUL && instruction.opcode != TERN_OP_CONV2D &&
      instruction.opcode != TERN_OP_CONV2D_BACKWARD_INPUT &&
      instruction.opcode != TERN_OP_CONV2D_BACKWARD_WEIGHT) {
    return nullptr;
  }
  // The kernels read the descriptors and the constants only: every other
  // present operand gets an address that is never dereferenced.
  alignas(64) static uint8_t placeholder[64];
  std::vector<TensorView> views(instruction.operands.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const isa::OperandDesc& desc = instruction.operands[i];
    views[i].desc = &desc;
    if (!desc.present()) continue;
    views[i].data = desc.segment == TERN_SEGMENT_CONSTANT && constants != nullptr
                        ? const_cast<uint8_t*>(constants) + desc.offset
                        : placeholder;
  }
  return kernels::PrepareDnnlKernels(instruction, views);
}

int SetKernelThreadsForTesting(int threads) {
  const int previous = kernels::t_kernel_threads_for_testing;
  kernels::t_kernel_threads_for_testing = threads > 0 ? threads : 0;
  return previous;
}

bool KernelsRunWithFmaForTesting() {
#if defined(TERN_VECTOR_CLONES_BUILT)
  // The clone that the resolvers pick: avx512f, or x86-64-v3 (AVX2 with FMA).
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ||
         (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
#else
  return false;
#endif
}

void KeepKernelsOnThisThread() { kernels::t_kernels_on_this_thread = true; }

namespace {

int HostCpus() {
  static const int host_cpus = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  }();
  return host_cpus;
}

// `text` as a whole decimal number in [min, max], else `otherwise`.
long ParseInRange(const char* text, long min, long max, long otherwise) {
  if (text == nullptr || *text == '\0') return otherwise;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && value >= min && value <= max ? value : otherwise;
}

// `text` as a whole decimal count in [1, max], else 0.
long ParseCount(const char* text, long max) { return ParseInRange(text, 1, max, 0); }

}  // namespace

int LocalRanksFromEnvironment() {
  // torchrun (and torch.distributed.elastic), Open MPI, MPICH's Hydra.
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const long ranks = ParseCount(std::getenv(name), 65536)) return static_cast<int>(ranks);
  }
  return 1;
}

int LocalRankFromEnvironment() {
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}) {
    const long rank = ParseInRange(std::getenv(name), 0, 65535, -1);
    if (rank >= 0) return static_cast<int>(rank);
  }
  return -1;
}

int CommunicationEngineCpu() {
  const int local_rank = LocalRankFromEnvironment();
  if (local_rank < 0 || HostCpusPerRank() >= 2 || LocalRanksFromEnvironment() < 2) return -1;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  const int count = CPU_COUNT(&allowed);
  if (count < 1) return -1;
  int turn = local_rank % count;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && turn-- == 0) return cpu;
  }
  return -1;
}

int ChooseKernelThreads(int host_cpus, const char* requested, int local_ranks) {
  if (const long threads = ParseCount(requested, 4096)) return static_cast<int>(threads);
  return std::max(1, host_cpus / std::max(1, local_ranks));
}

int KernelThreadsForHost() {
  static const int threads = ChooseKernelThreads(HostCpus(), std::getenv("TERN_SIM_KERNEL_THREADS"),
                                                 LocalRanksFromEnvironment());
  return threads;
}

int HostCpusPerRank() { return std::max(1, HostCpus() / std::max(1, LocalRanksFromEnvironment())); }

void StartKernelPool() {
  if (kernels::kUseThreads) kernels::KernelPool::Instance().Start();
}

bool KernelsLeaveACpuFree() { return kernels::KernelThreads() < HostCpus(); }

}  // namespace tern::sim
