// Internals shared by the kernel files: the CPU thread split, strided
// layouts, typed loads and stores through float / int64 buffers, and one
// entry point per opcode family.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_INTERNAL_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/sanitizers.h"
#include "driver_shim/sim/engines/kernel_pool.h"
#include "driver_shim/sim/engines/numerics.h"
#include "driver_shim/sim/engines/run_instruction.h"

// Hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at
// load time, so the library stays portable and still uses the wide units.
// The AVX2 clone is the x86-64-v3 level (AVX2 with FMA, which every AVX2 CPU
// of both vendors has): "avx2" alone leaves FMA out, and without it the
// float math of numerics.h loses accuracy (gelu's negative tail 1.16e-6
// absolute instead of 9.7e-7; found on an AMD Zen 1, which has no AVX-512).
// Not under ThreadSanitizer: the clones' load-time resolvers (IFUNC) run
// before TSan initialises and crash the process while libtern loads.
// Nor with clang (14): it names no ISA level in target_clones (its
// "arch=x86-64-v3" clone is never picked), and a function declared in a header
// without the attribute and defined with it came out as its avx512f clone
// alone. clang builds (the ASan build of the tests) run the baseline code.
#if defined(__x86_64__) && !defined(__clang__) && !TERN_UNDER_TSAN
#define TERN_VECTOR_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#define TERN_VECTOR_CLONES_BUILT 1
#else
#define TERN_VECTOR_CLONES
#endif

namespace tern::sim::kernels {

using Operands = std::span<const TensorView>;

// --- threads ----------------------------------------------------------------

// Elementwise work below this many elements runs on the calling thread.
inline constexpr int64_t kParallelGrain = 32 * 1024;

#if TERN_UNDER_TSAN
// Kernels stay on their thread under ThreadSanitizer: oneDNN is not
// instrumented, and the pool itself has its own test under TSan.
inline constexpr bool kUseThreads = false;
#else
inline constexpr bool kUseThreads = true;
#endif

// Set by KeepKernelsOnThisThread() (run_instruction.h).
extern thread_local bool t_kernels_on_this_thread;
// Set by SetKernelThreadsForTesting() (kernels_testing.h); 0: none.
extern thread_local int t_kernel_threads_for_testing;

// How many CPU threads a kernel may split its work across (kernel_pool.h).
inline int KernelThreads() {
  if (!kUseThreads || t_kernels_on_this_thread) return 1;
  if (t_kernel_threads_for_testing > 0) return t_kernel_threads_for_testing;
  return KernelPool::Instance().threads();
}

// Splits [0, n) into contiguous ranges of at least `grain` items and calls
// fn(begin, end) on each, on the kernel pool's threads (on the calling thread
// when the work is small). Ranges are handed out dynamically, a few per
// thread, so a thread that the OS preempts (a busy machine, several engines
// running at once) delays the others little. Callers never let results
// depend on the split. `wake`: whom the ranges go to besides the caller
// (KernelPool::Wake).
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn,
                 KernelPool::Wake wake = KernelPool::Wake::kSleepingHelpers) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int threads = 1;
  if (n >= 2 * grain) threads = static_cast<int>(std::min<int64_t>(KernelThreads(), n / grain));
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(n / grain, int64_t{threads} * 4);
  KernelPool::Instance().Run(
      static_cast<int>(chunks),
      [&](int chunk) { fn(n * chunk / chunks, n * (chunk + 1) / chunks); }, wake);
}

// --- strided layouts ----------------------------------------------------------

// (an ELEMENTWISE program's 4 outputs and 8 inputs)
inline constexpr int kMaxLayoutOperands = TERN_PROGRAM_OUTPUTS + TERN_PROGRAM_INPUTS;

// Several operands walked together over one logical shape: dimensions of
// size 1 are dropped and neighbours that are contiguous in every operand
// are merged. Always rank >= 1 (a scalar is [1]).
struct Layout {
  int rank = 1;
  int operands = 0;
  int64_t count = 1;  // logical elements
  int64_t shape[TERN_MAX_RANK] = {1};
  int64_t strides[kMaxLayoutOperands][TERN_MAX_RANK] = {};
};

Layout MakeLayout(uint32_t rank, const int64_t* shape, std::span<const int64_t* const> strides);
inline Layout MakeLayout(uint32_t rank, const int64_t* shape,
                         std::initializer_list<const int64_t*> strides) {
  return MakeLayout(rank, shape, std::span<const int64_t* const>(strides.begin(), strides.size()));
}

// The same layout with its dimensions first put in memory order, for walks
// that may visit the elements in any order (an elementwise operation, a
// fill): the dimension with the smallest stride becomes the innermost, as
// PyTorch's TensorIterator orders them. The first operand's strides decide,
// the later ones break its ties; a broadcast (stride 0) decides nothing. A
// permuted view and its like-permuted result (`q.transpose(1, 2) * s`) are
// then one contiguous run instead of one element per cache line.
Layout MakeLayoutInMemoryOrder(uint32_t rank, const int64_t* shape,
                               std::span<const int64_t* const> strides);

// Calls fn(offsets, n) for each run of the innermost dimension within the
// logical elements [begin, end) (row-major order): offsets[i] is operand i's
// element offset at the run start; the run's elements follow at
// layout.strides[i][rank - 1].
template <typename Fn>
void ForEachRun(const Layout& layout, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;  // (an empty layout may have a 0 dimension)
  const int rank = layout.rank;
  const int ops = layout.operands;
  int64_t index[TERN_MAX_RANK] = {};
  int64_t offsets[kMaxLayoutOperands] = {};
  int64_t rest = begin;
  for (int d = rank - 1; d >= 0; --d) {
    index[d] = rest % layout.shape[d];
    rest /= layout.shape[d];
    for (int o = 0; o < ops; ++o) offsets[o] += index[d] * layout.strides[o][d];
  }
  int64_t pos = begin;
  const int last = rank - 1;
  while (pos < end) {
    const int64_t n = std::min(layout.shape[last] - index[last], end - pos);
    fn(static_cast<const int64_t*>(offsets), n);
    pos += n;
    if (pos >= end) break;
    index[last] += n;
    for (int o = 0; o < ops; ++o) offsets[o] += n * layout.strides[o][last];
    for (int d = last; d > 0 && index[d] == layout.shape[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
      for (int o = 0; o < ops; ++o) {
        offsets[o] += layout.strides[o][d - 1] - layout.shape[d] * layout.strides[o][d];
      }
    }
  }
}

// The lines along `axis` of operands that share every other dimension: a
// layout over the other dimensions (the axis counts as 1), one line per
// logical element. A rank-0 shape is one line of one element.
inline Layout AxisLines(uint32_t rank, const int64_t* shape, uint32_t axis,
                        std::initializer_list<const int64_t*> strides) {
  int64_t others[TERN_MAX_RANK] = {};
  for (uint32_t d = 0; d < rank; ++d) others[d] = d == axis ? 1 : shape[d];
  return MakeLayout(rank, others, strides);
}

// Calls fn(offsets) for each of the lines [begin, end) of AxisLines():
// offsets[i] is operand i's element offset at the line's start.
template <typename Fn>
void ForEachLine(const Layout& lines, int64_t begin, int64_t end, Fn&& fn) {
  const int last = lines.rank - 1;
  ForEachRun(lines, begin, end, [&](const int64_t* start, int64_t n) {
    int64_t offsets[kMaxLayoutOperands];
    for (int64_t j = 0; j < n; ++j) {
      for (int o = 0; o < lines.operands; ++o) offsets[o] = start[o] + j * lines.strides[o][last];
      fn(static_cast<const int64_t*>(offsets));
    }
  });
}

// --- typed loads and stores -------------------------------------------------

// n elements at p, `stride` elements apart (0 repeats one), to or from a
// contiguous buffer. Float stores round to nearest even; float to integer
// truncates toward zero, saturates, and maps NaN to 0; to bool is != 0.
void LoadF32(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, float* out);
void StoreF32(tern_dtype_t dtype, uint8_t* p, int64_t stride, int64_t n, const float* in);
// Integer and bool dtypes (floats convert as above). Integer stores wrap.
void LoadI64(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, int64_t* out);
void StoreI64(tern_dtype_t dtype, uint8_t* p, int64_t stride, int64_t n, const int64_t* in);
// Any dtype to and from f64 (integers exact up to 2^53; to the 16-bit floats
// through f32, as PyTorch rounds).
void LoadF64(tern_dtype_t dtype, const uint8_t* p, int64_t stride, int64_t n, double* out);
void StoreF64(tern_dtype_t dtype, uint8_t* p, int64_t stride, int64_t n, const double* in);

// n elements of `esize` bytes (1, 2, 4 or 8) from src, `ss` elements apart
// (0 repeats one), to dst, `ds` apart: the copy instruction's runs and the
// gathers' rows. A contiguous run is one memmove, since a copy's source and
// destination may overlap.
template <typename E>
TERN_INLINE void CopyElements(uint8_t* dst, int64_t ds, const uint8_t* src, int64_t ss, int64_t n) {
  E* d = reinterpret_cast<E*>(dst);
  const E* s = reinterpret_cast<const E*>(src);
  if (ss == 0) {
    const E v = s[0];
    for (int64_t i = 0; i < n; ++i) d[i * ds] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
  }
}

// fn(E{}) with E the unsigned integer type of an element of `esize` bytes
// (1, 2, 4, else 8): for kernels that move elements without reading them.
template <typename Fn>
TERN_INLINE void WithElementBits(size_t esize, Fn&& fn) {
  switch (esize) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    default:
      return fn(uint64_t{});
  }
}

TERN_INLINE void CopyStrided(size_t esize, uint8_t* dst, int64_t ds, const uint8_t* src, int64_t ss,
                             int64_t n) {
  if (ds == 1 && ss == 1) {
    std::memmove(dst, src, n * esize);
    return;
  }
  WithElementBits(esize, [&](auto e) { CopyElements<decltype(e)>(dst, ds, src, ss, n); });
}

double LoadOneF64(tern_dtype_t dtype, const uint8_t* p);
int64_t LoadOneI64(tern_dtype_t dtype, const uint8_t* p);

inline uint8_t* At(const TensorView& view, int64_t element_offset) {
  return view.data + element_offset * static_cast<int64_t>(isa::DTypeSize(view.desc->dtype));
}

// Copies a strided operand into a contiguous f32 buffer and back.
void GatherF32(const TensorView& view, float* out);
void ScatterF32(const TensorView& view, const float* in);

// Formats "[1, 2, 3]".
std::string IndexString(const int64_t* index, uint32_t rank);

// --- index operands (kernels_index.cc), shared with kernels_scatter.cc -----

// Loads an index tensor (i32 or i64) in row-major order.
std::vector<int64_t> LoadIndices(const TensorView& v);
// Checks every index against [-size, size) and makes it non-negative; the
// error names `op`, the index, its position and the axis.
Status NormalizeIndices(const char* op, const isa::OperandDesc& idx, std::vector<int64_t>* values,
                        int64_t axis, int64_t size);
inline int64_t NormAxis(int64_t axis, uint32_t rank) { return axis < 0 ? axis + rank : axis; }
// Offsets of multi-index `pos` over dims [0, rank) of `shape` for several
// stride sets.
TERN_INLINE void OffsetsOf(int64_t pos, uint32_t rank, const int64_t* shape,
                           std::initializer_list<std::pair<const int64_t*, int64_t*>> sets) {
  for (auto& s : sets) *s.second = 0;
  for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
    const int64_t i = pos % shape[d];
    pos /= shape[d];
    for (auto& s : sets) *s.second += i * s.first[d];
  }
}

// --- opcode families ----------------------------------------------------------

Status RunCopy(const driver::Instruction& ins, Operands ops);
Status RunCast(const driver::Instruction& ins, Operands ops);
Status RunFill(const driver::Instruction& ins, Operands ops);
Status RunBinary(const driver::Instruction& ins, Operands ops);
Status RunWhere(const driver::Instruction& ins, Operands ops);
Status RunUnary(const driver::Instruction& ins, Operands ops);
Status RunElementwiseProgram(const driver::Instruction& ins, Operands ops);
// The epilogue of matmul and conv2d, on their finished output:
// out = act(out + residual), computed in f32 with the kernels of `binary
// add` and `unary act`, rounded once. residual may be null, activation
// TERN_ACTIVATION_NONE; with neither, nothing is done.
Status ApplyTensorEpilogue(const TensorView& out, const TensorView* residual, int64_t activation,
                           std::span<const double> parameters);
Status RunUnaryBackward(const driver::Instruction& ins, Operands ops);
Status RunIota(const driver::Instruction& ins, Operands ops);
Status RunRandom(const driver::Instruction& ins, Operands ops);

Status RunReduce(const driver::Instruction& ins, Operands ops);
Status RunScan(const driver::Instruction& ins, Operands ops);
Status RunSoftmax(const driver::Instruction& ins, Operands ops);
Status RunSoftmaxBackward(const driver::Instruction& ins, Operands ops);
Status RunLayerNorm(const driver::Instruction& ins, Operands ops);
Status RunLayerNormBackward(const driver::Instruction& ins, Operands ops);
Status RunRmsNorm(const driver::Instruction& ins, Operands ops);
Status RunRmsNormBackward(const driver::Instruction& ins, Operands ops);

Status RunGather(const driver::Instruction& ins, Operands ops);
Status RunScatterAdd(const driver::Instruction& ins, Operands ops);
Status RunTakeAlongAxis(const driver::Instruction& ins, Operands ops);
Status RunScatterAddAlongAxis(const driver::Instruction& ins, Operands ops);
Status RunScatter(const driver::Instruction& ins, Operands ops);
Status RunScatterAlongAxis(const driver::Instruction& ins, Operands ops);
Status RunSort(const driver::Instruction& ins, Operands ops);
Status RunTopk(const driver::Instruction& ins, Operands ops);

Status RunMatmul(const driver::Instruction& ins, Operands ops);
// Makes and caches the oneDNN primitives a matmul or convolution will use,
// reading no operand memory but the constants segment's (`ops` of other
// segments may point anywhere non-null); other opcodes are ignored. Returns
// what the instruction keeps (Instruction::prepared): for a matmul whose
// weight is a constant, the weight in oneDNN's layout; else null. See
// PrepareInstruction (run_instruction.h).
std::shared_ptr<const void> PrepareDnnlKernels(const driver::Instruction& ins, Operands ops);

// Makes the calling thread's oneDNN stream and OpenMP state (warm_up.h).
// Thread-safety: any thread (acts on the calling one).
void PrepareDnnlThread();
Status RunConv2d(const driver::Instruction& ins, Operands ops);
Status RunConv2dBackwardInput(const driver::Instruction& ins, Operands ops);
Status RunConv2dBackwardWeight(const driver::Instruction& ins, Operands ops);

}  // namespace tern::sim::kernels

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_KERNELS_INTERNAL_H_
