// Matmul and convolution. The fast path is oneDNN, with primitives cached by
// a key of everything that shapes them (dtypes, dims, strides, attributes)
// and a user-managed scratchpad per call, so one primitive runs concurrently
// from several engine threads. What oneDNN does not take directly (f16 on
// CPUs without f16 units, broadcast or odd strides, alpha with a bias) is
// packed into contiguous f32 first and still multiplied by oneDNN; integer
// matmuls, empty shapes, and anything oneDNN rejects run portable loops.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/logging.h"
#include "driver_shim/sim/engines/kernels_internal.h"
#include "driver_shim/sim/engines/kernels_testing.h"
#include "driver_shim/sim/engines/openmp_runtime.h"
#include "driver_shim/sim/engines/panel_weight.h"

namespace tern::sim {

namespace {
std::atomic<bool> g_onednn_disabled{false};
}  // namespace

bool SetOneDnnDisabledForTesting(bool disabled) { return g_onednn_disabled.exchange(disabled); }

namespace kernels {
namespace {

// Set while PrepareDnnlKernels runs: the kernels below make (and cache)
// their oneDNN primitives and return before touching any operand's memory.
thread_local bool t_prepare_only = false;

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine& Engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

bool OneDnnEnabled() { return !g_onednn_disabled.load(std::memory_order_relaxed); }

memory::data_type DnnlType(tern_dtype_t dtype) {
  switch (dtype) {
    case TERN_DTYPE_F32:
      return memory::data_type::f32;
    case TERN_DTYPE_BF16:
      return memory::data_type::bf16;
    case TERN_DTYPE_F16:
      return memory::data_type::f16;
    default:
      return memory::data_type::undef;
  }
}

// What shapes a primitive (dtypes, dims, strides, attributes), as integers:
// built and compared without formatting or allocation, because a lookup is
// on every matmul and convolution an execution runs.
class PrimitiveKey {
 public:
  void Add(int64_t v) {
    if (size_ < values_.size()) values_[size_] = v;
    ++size_;  // past the capacity: Valid() is false and nothing is cached
  }
  void Add(const Dims& dims) {
    Add(static_cast<int64_t>(dims.size()));
    for (int64_t v : dims) Add(v);
  }
  void AddFloat(float f) { Add(static_cast<int64_t>(std::bit_cast<uint32_t>(f))); }
  bool Valid() const { return size_ <= values_.size(); }
  bool operator==(const PrimitiveKey& other) const {
    return size_ == other.size_ &&
           std::equal(values_.begin(), values_.begin() + static_cast<std::ptrdiff_t>(size_),
                      other.values_.begin());
  }
  size_t Hash() const {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the values
    for (size_t i = 0; i < size_ && i < values_.size(); ++i) {
      h ^= static_cast<uint64_t>(values_[i]);
      h *= 0x100000001b3ull;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }

 private:
  std::array<int64_t, 112> values_{};
  size_t size_ = 0;
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& key) const { return key.Hash(); }
};

// Cache of primitives (or of the knowledge that oneDNN refused a key).
template <typename Entry>
class PrimitiveCache {
 public:
  std::shared_ptr<Entry> Find(const PrimitiveKey& key) {
    if (!key.Valid()) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void Insert(const PrimitiveKey& key, std::shared_ptr<Entry> entry) {
    if (!key.Valid()) return;  // too many dimensions to key: made again each call
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= 4096) map_.clear();  // bound memory on pathological shape churn
    map_.emplace(key, std::move(entry));
  }
  // Records that oneDNN refused `key` after the entry was cached (an error
  // at execution), so later calls go straight to the fallback.
  void Refuse(const PrimitiveKey& key) {
    if (!key.Valid()) return;
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = std::make_shared<Entry>();
  }

 private:
  std::mutex mu_;
  std::unordered_map<PrimitiveKey, std::shared_ptr<Entry>, PrimitiveKeyHash> map_;
};

// oneDNN runs single-threaded inside tern's kernels, on whatever thread
// calls them: the kernel pool splits the work (kernel_pool.h), and an OpenMP
// team of oneDNN's would compete with the pool and with the framework's own
// team. Held around every primitive's creation and execution (oneDNN sizes a
// primitive's split for its creator's team, and runs it with that team).
class OneDnnSingleThreaded {
 public:
  OneDnnSingleThreaded() : caller_threads_(omp_get_max_threads()) {
    if (caller_threads_ != 1) omp_set_num_threads(1);
  }
  ~OneDnnSingleThreaded() {
    if (caller_threads_ != 1) omp_set_num_threads(caller_threads_);
  }
  OneDnnSingleThreaded(const OneDnnSingleThreaded&) = delete;
  OneDnnSingleThreaded& operator=(const OneDnnSingleThreaded&) = delete;

 private:
  const int caller_threads_;
};

// The calling thread's oneDNN stream, made once: a stream per call cost an
// allocation and a oneDNN object on every matmul and convolution.
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

// oneDNN's scratchpads (the user-managed kind), shared by every thread: a
// kernel takes one for the length of its call and gives it back. A buffer
// comes back with its pages already faulted in, and loading a program
// reserves what its primitives need (Reserve), so the first execution does
// not fault in a fresh scratchpad (~130 us for a 16x256x512 matmul's on a
// 2-CPU Xeon, 4x the whole warm matmul). A buffer per thread did that on
// every thread's first call, and a queue thread's first call is a program's
// first execution.
class ScratchPool {
 public:
  class Lease {
   public:
    Lease(ScratchPool* pool, std::vector<uint8_t> buffer)
        : pool_(pool), buffer_(std::move(buffer)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { pool_->Return(std::move(buffer_)); }
    uint8_t* data() { return buffer_.data(); }

   private:
    ScratchPool* pool_;
    std::vector<uint8_t> buffer_;
  };

  // A buffer of at least `bytes` (the pool's largest free one, grown if
  // need be) until the lease ends.
  // Thread-safety: any thread.
  Lease Acquire(size_t bytes) {
    std::vector<uint8_t> buffer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        buffer = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (buffer.size() < bytes) buffer.resize(bytes);
    return Lease(this, std::move(buffer));
  }

  // Makes sure a free buffer of at least `bytes` exists, its pages touched.
  // Thread-safety: any thread.
  void Reserve(size_t bytes) {
    if (bytes == 0) return;
    Lease lease = Acquire(bytes);
    (void)lease;  // grown (and so zero-filled, pages faulted in) if it was smaller
  }

 private:
  void Return(std::vector<uint8_t> buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    // Largest last, so Acquire hands out the largest; a few at most (one
    // per thread that ran a kernel at the same time).
    auto at = std::lower_bound(
        free_.begin(), free_.end(), buffer.size(),
        [](const std::vector<uint8_t>& b, size_t size) { return b.size() < size; });
    free_.insert(at, std::move(buffer));
  }

  std::mutex mu_;
  std::vector<std::vector<uint8_t>> free_;  // guarded by mu_; by size, ascending
};

ScratchPool& Scratchpads() {
  static auto* pool = new ScratchPool();  // never destroyed: kernels may run at exit
  return *pool;
}

// --- matmul -------------------------------------------------------------------

struct MatmulGeometry {
  uint32_t rank = 2;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  // Logical (transposes applied) shapes and strides: a [.., M, K], b [.., K, N].
  int64_t a_shape[TERN_MAX_RANK], a_strides[TERN_MAX_RANK];
  int64_t b_shape[TERN_MAX_RANK], b_strides[TERN_MAX_RANK];
  float alpha = 1, beta = 0;
};

MatmulGeometry MakeGeometry(const driver::Instruction& ins, Operands ops) {
  MatmulGeometry g;
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& a = *ops[1].desc;
  const isa::OperandDesc& b = *ops[2].desc;
  const bool ta = ins.ints.size() > 0 && ins.ints[0];
  const bool tb = ins.ints.size() > 1 && ins.ints[1];
  g.alpha = ins.floats.size() > 0 ? static_cast<float>(ins.floats[0]) : 1.0f;
  g.beta = ins.floats.size() > 1 ? static_cast<float>(ins.floats[1]) : 0.0f;
  const uint32_t r = out.rank;
  g.rank = r;
  g.m = out.shape[r - 2];
  g.n = out.shape[r - 1];
  g.k = ta ? a.shape[r - 2] : a.shape[r - 1];
  for (uint32_t d = 0; d + 2 < r; ++d) {
    g.batch *= out.shape[d];
    // A broadcast batch dimension (stride 0) becomes size 1.
    g.a_shape[d] = a.strides[d] == 0 ? 1 : a.shape[d];
    g.a_strides[d] = a.strides[d];
    g.b_shape[d] = b.strides[d] == 0 ? 1 : b.shape[d];
    g.b_strides[d] = b.strides[d];
  }
  g.a_shape[r - 2] = g.m;
  g.a_shape[r - 1] = g.k;
  g.a_strides[r - 2] = ta ? a.strides[r - 1] : a.strides[r - 2];
  g.a_strides[r - 1] = ta ? a.strides[r - 2] : a.strides[r - 1];
  g.b_shape[r - 2] = g.k;
  g.b_shape[r - 1] = g.n;
  g.b_strides[r - 2] = tb ? b.strides[r - 1] : b.strides[r - 2];
  g.b_strides[r - 1] = tb ? b.strides[r - 2] : b.strides[r - 1];
  return g;
}

// A row-vector bias: rank 1, or full rank with stride 0 on all but the last
// dimension. Returns its stride along N. A bias broadcast along N too
// (stride 0 with N > 1, e.g. from a 0-d tensor) is not one: oneDNN cannot
// repeat one element, so it goes through the packed path.
bool RowBias(const isa::OperandDesc& bias, int64_t n, int64_t* stride) {
  if (bias.rank == 0) return false;
  const uint32_t last = bias.rank - 1;
  for (uint32_t d = 0; d < last; ++d) {
    if (bias.strides[d] != 0 && bias.shape[d] != 1) return false;
  }
  *stride = bias.strides[last];
  return *stride != 0 || n <= 1;
}

// oneDNN takes a stride per dimension; one of size 1 may be anything but 0
// (nor an overlapping-looking value, which oneDNN may refuse), so it gets
// the row-major stride it would have in a dense tensor of the inner
// dimensions. The elements read do not change (the index is always 0).
// Callers pass no stride 0 on a dimension of size > 1 (see NoBroadcast).
Dims SafeStrides(const int64_t* shape, const int64_t* strides, uint32_t rank) {
  Dims s(strides, strides + rank);
  for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
    if (shape[d] != 1 && s[d] != 0) continue;
    s[d] = d + 1 == static_cast<int>(rank) ? 1 : std::max<int64_t>(1, shape[d + 1]) * s[d + 1];
  }
  return s;
}

// True when no dimension of size > 1 has stride 0 (oneDNN cannot express
// those; they go through packing).
bool NoBroadcast(const int64_t* shape, const int64_t* strides, uint32_t begin, uint32_t end) {
  for (uint32_t d = begin; d < end; ++d) {
    if (shape[d] > 1 && strides[d] == 0) return false;
  }
  return true;
}

struct MatmulEntry {
  bool ok = false;
  dnnl::matmul prim;
  memory::desc a_md, b_md, out_md, bias_md, scratch_md;
  // Memory objects for the operands, made once and pointed at each call's
  // data (set_data_handle): making five per call cost more than a small
  // product. A set serves one caller at a time: the parts of a split product
  // run at once on the kernel pool's threads, so there are a few; a caller
  // that finds them all in use makes its own.
  struct Memories {
    std::mutex mu;
    std::array<memory, 5> objects;  // guarded by mu
  };
  std::array<Memories, 4> memories;
};

PrimitiveCache<MatmulEntry>& MatmulCache() {
  static auto* cache = new PrimitiveCache<MatmulEntry>();
  return *cache;
}

// Says once per process that oneDNN refused at execution a product it had
// made. That happens when another copy of oneDNN in the process took over
// some of the system libdnnl's symbols: PyTorch's libtorch_cpu exports the
// call_once trampolines of oneDNN's gemm set-up (gemm_info_t<...>::jit_init)
// under the same names, and where the dynamic linker resolves libdnnl's
// references to them before libdnnl's own (libtorch_cpu earlier in the
// lookup scope), libdnnl's gemm kernels are never generated and every
// "gemm:jit" product fails with unimplemented. The products then run on
// tern's loops, several times slower, with the same results.
void NoteRefusedAtExecution(const char* what, int status) {
  static std::once_flag said;
  std::call_once(said, [&] {
    TERN_LOG_WARN(
        "oneDNN made a {} primitive and then refused to run it (status {}); what it refuses "
        "runs on tern's own loops, several times slower. In a process that also loads PyTorch "
        "this means PyTorch's copy of oneDNN took over symbols of the system's libdnnl: load "
        "libtern before libtorch (torch_tern does; a program that links both lists libdnnl "
        "before libtorch_cpu). See docs/sim.md, \"One oneDNN per process\"",
        what, status);
  });
}

// Runs a matmul primitive on the given memory (bias may be null when the
// entry has none). Returns false if oneDNN refused at execution, and then
// records the refusal under `key` in the cache (when the entry is cached).
bool ExecuteMatmulEntry(const PrimitiveKey* key, MatmulEntry& entry, const void* a, const void* b,
                        void* out, const void* bias, bool has_bias) {
  // oneDNN may still refuse at execution (NoteRefusedAtExecution); it
  // checks before computing, so the caller's fallback starts from untouched
  // memory.
  // Executed through the C API with an argument array: the C++ API takes an
  // unordered_map, a handful of allocations per call.
  ScratchPool::Lease scratch = Scratchpads().Acquire(entry.scratch_md.get_size());
  void* handles[5] = {const_cast<void*>(a), const_cast<void*>(b), out, scratch.data(),
                      const_cast<void*>(bias)};
  const int arg_ids[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD,
                          DNNL_ARG_BIAS};
  const int arg_count = has_bias ? 5 : 4;
  try {
    dnnl::engine& eng = Engine();
    std::array<memory, 5> local;
    std::array<memory, 5>* held = &local;
    std::unique_lock<std::mutex> own;
    for (MatmulEntry::Memories& set : entry.memories) {
      own = std::unique_lock<std::mutex>(set.mu, std::try_to_lock);
      if (own.owns_lock()) {
        held = &set.objects;
        break;
      }
    }
    std::array<memory, 5>& memories = *held;
    const memory::desc* mds[5] = {&entry.a_md, &entry.b_md, &entry.out_md, &entry.scratch_md,
                                  &entry.bias_md};
    dnnl_exec_arg_t args[5];
    for (int i = 0; i < arg_count; ++i) {
      if (!memories[i]) {
        memories[i] = memory(*mds[i], eng, handles[i]);
      } else {
        memories[i].set_data_handle(handles[i]);
      }
      args[i] = {arg_ids[i], memories[i].get()};
    }
    dnnl::stream& stream = ThreadStream();
    const dnnl_status_t executed =
        dnnl_primitive_execute(entry.prim.get(), stream.get(), arg_count, args);
    if (executed != dnnl_success) {
      NoteRefusedAtExecution("matmul", static_cast<int>(executed));
      if (key != nullptr) MatmulCache().Refuse(*key);
      return false;
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    NoteRefusedAtExecution("matmul", static_cast<int>(e.status));
    if (key != nullptr) MatmulCache().Refuse(*key);
    return false;
  }
  return true;
}

// Products of up to this many multiply-adds, whose operands take up to this
// many bytes, are run once when a program is loaded (WarmUpMatmul): a
// primitive's first execution in the process costs oneDNN's lazy set-up, its
// kernels' first pass through cold code and a first memory object for each
// operand (~70 us for a 16x256x512 product whose warm run takes 25 us),
// which would otherwise land on the program's first execution. Larger
// products run long enough that it does not show.
constexpr double kWarmUpMultiplyAdds = 1 << 24;
constexpr size_t kWarmUpBytes = 2 << 20;

// Runs a freshly made primitive once on zero-filled host memory of its
// operands' sizes, while a program is loaded. A refusal here is recorded as
// at execution (the real call then takes the fallback at once).
void WarmUpMatmul(const PrimitiveKey* key, MatmulEntry& entry, bool has_bias) {
  const memory::dims a = entry.a_md.dims();
  const memory::dims b = entry.b_md.dims();
  if (a.size() < 2 || b.empty()) return;
  double multiply_adds = static_cast<double>(b.back());
  for (int64_t d : a) multiply_adds *= static_cast<double>(d);
  if (multiply_adds > kWarmUpMultiplyAdds) return;
  // Each operand at a cache-line boundary of one zeroed buffer per loading
  // thread, kept: its pages are faulted in once, not at every load.
  const size_t sizes[4] = {entry.a_md.get_size(), entry.b_md.get_size(), entry.out_md.get_size(),
                           has_bias ? entry.bias_md.get_size() : 0};
  size_t offsets[4], total = 0;
  for (int i = 0; i < 4; ++i) {
    offsets[i] = total;
    total += (sizes[i] + 63) / 64 * 64;
  }
  if (total > kWarmUpBytes) return;
  thread_local std::vector<uint8_t> operands;
  if (operands.size() < total + 64) operands.resize(total + 64);
  uint8_t* base = operands.data() + (64 - reinterpret_cast<uintptr_t>(operands.data()) % 64) % 64;
  // The product overwrote the output region last time: zero it again, so
  // that every operand reads as zeros (finite, whatever the dtype).
  std::memset(base + offsets[2], 0, sizes[2]);
  ExecuteMatmulEntry(key, entry, base + offsets[0], base + offsets[1], base + offsets[2],
                     has_bias ? base + offsets[3] : nullptr, has_bias);
}

// Makes the primitive out = alpha * a @ b (+ beta * out) (+ bias) into
// `entry` (entry->ok false if oneDNN refused it or would only take it with
// its slow reference code). `b` may have format "any": entry->b_md is then
// the layout oneDNN chose for the weight.
void MakeMatmulEntry(const memory::desc& a, const memory::desc& b, const memory::desc& out,
                     const Dims* bias_dims, const Dims* bias_strides, memory::data_type bias_dt,
                     float alpha, float beta, MatmulEntry* entry) {
  try {
    entry->a_md = a;
    entry->out_md = out;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    std::unique_ptr<dnnl::matmul::desc> desc;
    if (bias_dims) {
      entry->bias_md = memory::desc(*bias_dims, bias_dt, *bias_strides);
      desc = std::make_unique<dnnl::matmul::desc>(a, b, entry->bias_md, out);
    } else {
      desc = std::make_unique<dnnl::matmul::desc>(a, b, out);
    }
    dnnl::matmul::primitive_desc pd(*desc, attr, Engine());
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) != 0) {
      entry->prim = dnnl::matmul(pd);
      entry->b_md = pd.weights_desc();
      entry->scratch_md = pd.scratchpad_desc();
      entry->ok = true;
    }
  } catch (const dnnl::error&) {
    entry->ok = false;
  }
}

// Runs out = alpha * a @ b (+ beta * out) (+ bias) through oneDNN on the
// given memory. Returns false if oneDNN refused (or would only take it with
// its slow reference code).
bool DnnlMatmul(const Dims& a_dims, const Dims& a_strides, memory::data_type a_dt, const void* a,
                const Dims& b_dims, const Dims& b_strides, const void* b, const Dims& out_dims,
                const Dims& out_strides, memory::data_type out_dt, void* out, float alpha,
                float beta, const Dims* bias_dims, const Dims* bias_strides,
                memory::data_type bias_dt, const void* bias) {
  const OneDnnSingleThreaded single_threaded;
  PrimitiveKey key;
  for (const Dims* dims : {&a_dims, &a_strides, &b_dims, &b_strides, &out_dims, &out_strides}) {
    key.Add(*dims);
  }
  key.Add(static_cast<int64_t>(a_dt));
  key.Add(static_cast<int64_t>(out_dt));
  key.AddFloat(alpha);
  key.AddFloat(beta);
  if (bias_dims) {
    key.Add(*bias_dims);
    key.Add(*bias_strides);
    key.Add(static_cast<int64_t>(bias_dt));
  }
  std::shared_ptr<MatmulEntry> entry = MatmulCache().Find(key);
  const bool fresh = !entry;
  if (!entry) {
    entry = std::make_shared<MatmulEntry>();
    MakeMatmulEntry(memory::desc(a_dims, a_dt, a_strides), memory::desc(b_dims, a_dt, b_strides),
                    memory::desc(out_dims, out_dt, out_strides), bias_dims, bias_strides, bias_dt,
                    alpha, beta, entry.get());
    MatmulCache().Insert(key, entry);
  }
  if (!entry->ok) return false;
  if (t_prepare_only) {
    Scratchpads().Reserve(entry->scratch_md.get_size());
    if (fresh) WarmUpMatmul(&key, *entry, bias_dims != nullptr);
    return true;
  }
  return ExecuteMatmulEntry(&key, *entry, a, b, out, bias, bias_dims != nullptr);
}

// Packs a logical operand (shape/strides in elements) into contiguous f32.
std::vector<float> PackF32(const TensorView& view, uint32_t rank, const int64_t* shape,
                           const int64_t* strides) {
  isa::OperandDesc d = *view.desc;
  d.rank = rank;
  for (uint32_t i = 0; i < rank; ++i) {
    d.shape[i] = shape[i];
    d.strides[i] = strides[i];
  }
  std::vector<float> out(d.element_count());
  TensorView v{view.data, &d};
  GatherF32(v, out.data());
  return out;
}

std::vector<int64_t> PackI64(const TensorView& view, uint32_t rank, const int64_t* shape,
                             const int64_t* strides) {
  int64_t count = 1;
  for (uint32_t i = 0; i < rank; ++i) count *= shape[i];
  std::vector<int64_t> out(count);
  if (count == 0) return out;
  const Layout l = MakeLayout(rank, shape, {strides});
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(view.desc->dtype));
  int64_t* p = out.data();
  ForEachRun(l, 0, l.count, [&](const int64_t* off, int64_t n) {
    LoadI64(view.desc->dtype, view.data + off[0] * esize, l.strides[0][l.rank - 1], n, p);
    p += n;
  });
  return out;
}

// Offsets of batch index `bi` in a packed operand whose batch dims may be 1.
int64_t BatchOffset(int64_t bi, const MatmulGeometry& g, const int64_t* out_shape,
                    const int64_t* packed_shape, int64_t matrix) {
  int64_t off = 0, scale = matrix;
  for (int d = static_cast<int>(g.rank) - 3; d >= 0; --d) {
    const int64_t i = bi % out_shape[d];
    bi /= out_shape[d];
    if (packed_shape[d] != 1) off += i * scale;
    scale *= packed_shape[d];
  }
  return off;
}

TERN_VECTOR_CLONES
void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// C [batch, M, N] = alpha * A @ B on packed f32 (batch dims of A and B may
// be 1), by oneDNN or by loops.
// `b_transposed`: b holds each matrix as N x K (PackF32 of B's last two
// dimensions swapped), not K x N.
void PackedMatmulF32(const MatmulGeometry& g, const int64_t* out_shape, const std::vector<float>& a,
                     std::vector<float> b, bool b_transposed, std::vector<float>* c) {
  const uint32_t r = g.rank;
  auto dense = [](const Dims& dims) {
    Dims s(dims.size());
    int64_t v = 1;
    for (int i = static_cast<int>(dims.size()) - 1; i >= 0; --i) {
      s[i] = v;
      v *= dims[i];
    }
    return s;
  };
  Dims bd(g.b_shape, g.b_shape + r), b_strides = dense(bd);
  if (b_transposed) {
    Dims nk = bd;
    std::swap(nk[r - 2], nk[r - 1]);
    b_strides = dense(nk);
    std::swap(b_strides[r - 2], b_strides[r - 1]);
  }
  if (OneDnnEnabled() && g.m > 0 && g.n > 0 && g.k > 0 && g.batch > 0) {
    Dims ad(g.a_shape, g.a_shape + r), cd(out_shape, out_shape + r);
    if (DnnlMatmul(ad, dense(ad), memory::data_type::f32, a.data(), bd, b_strides, b.data(), cd,
                   dense(cd), memory::data_type::f32, c->data(), g.alpha, 0.0f, nullptr, nullptr,
                   memory::data_type::undef, nullptr)) {
      return;
    }
  }
  if (b_transposed) {
    // The loops below read K x N matrices.
    std::vector<float> rows(b.size());
    const int64_t matrices = g.k * g.n == 0 ? 0 : static_cast<int64_t>(b.size()) / (g.k * g.n);
    for (int64_t mi = 0; mi < matrices; ++mi) {
      const float* from = b.data() + mi * g.k * g.n;
      float* to = rows.data() + mi * g.k * g.n;
      for (int64_t kk = 0; kk < g.k; ++kk) {
        for (int64_t j = 0; j < g.n; ++j) to[kk * g.n + j] = from[j * g.k + kk];
      }
    }
    b = std::move(rows);
  }
  const int64_t am = g.m * g.k, bm = g.k * g.n;
  ParallelFor(g.batch * g.m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.n * g.k)),
              [&](int64_t begin, int64_t end) {
                std::vector<float> row(g.n);
                for (int64_t item = begin; item < end; ++item) {
                  const int64_t bi = item / g.m, i = item % g.m;
                  const float* ap =
                      a.data() + BatchOffset(bi, g, out_shape, g.a_shape, am) + i * g.k;
                  const float* bp = b.data() + BatchOffset(bi, g, out_shape, g.b_shape, bm);
                  std::fill(row.begin(), row.end(), 0.0f);
                  for (int64_t kk = 0; kk < g.k; ++kk) Axpy(row.data(), ap[kk], bp + kk * g.n, g.n);
                  float* cp = c->data() + item * g.n;
                  for (int64_t j = 0; j < g.n; ++j) cp[j] = g.alpha * row[j];
                }
              });
}

// out = C + beta * out + bias, rounding once into out's dtype.
void MatmulEpilogueF32(Operands ops, const MatmulGeometry& g, std::vector<float>& c) {
  const isa::OperandDesc& out = *ops[0].desc;
  if (g.beta != 0.0f) {
    std::vector<float> old(c.size());
    GatherF32(ops[0], old.data());
    for (size_t i = 0; i < c.size(); ++i) c[i] += g.beta * old[i];
  }
  if (ops.size() > 3 && ops[3].desc->present() && ops[3].data) {
    isa::OperandDesc bias = *ops[3].desc;
    if (bias.rank == 1) {  // [N] broadcast over every row
      const int64_t s = bias.strides[0];
      bias.rank = out.rank;
      bias.shape = out.shape;
      bias.strides.fill(0);
      bias.strides[out.rank - 1] = s;
    }
    std::vector<float> bv(c.size());
    TensorView v{ops[3].data, &bias};
    GatherF32(v, bv.data());
    for (size_t i = 0; i < c.size(); ++i) c[i] += bv[i];
  }
  ScatterF32(ops[0], c.data());
}

Status MatmulInteger(Operands ops, const MatmulGeometry& g) {
  const isa::OperandDesc& out = *ops[0].desc;
  const uint32_t r = g.rank;
  const std::vector<int64_t> a = PackI64(ops[1], r, g.a_shape, g.a_strides);
  const std::vector<int64_t> b = PackI64(ops[2], r, g.b_shape, g.b_strides);
  const int64_t count = out.element_count();
  std::vector<int64_t> c(count, 0);
  const auto wrap = [](uint64_t v) { return static_cast<int64_t>(v); };
  const int64_t alpha = static_cast<int64_t>(g.alpha), beta = static_cast<int64_t>(g.beta);
  const int64_t am = g.m * g.k, bm = g.k * g.n;
  ParallelFor(
      g.batch * g.m, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, g.n * g.k)),
      [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t bi = item / g.m, i = item % g.m;
          const int64_t* ap =
              a.data() + BatchOffset(bi, g, out.shape.data(), g.a_shape, am) + i * g.k;
          const int64_t* bp = b.data() + BatchOffset(bi, g, out.shape.data(), g.b_shape, bm);
          int64_t* cp = c.data() + item * g.n;
          for (int64_t kk = 0; kk < g.k; ++kk) {
            const uint64_t av = static_cast<uint64_t>(ap[kk]);
            for (int64_t j = 0; j < g.n; ++j) {
              cp[j] =
                  wrap(static_cast<uint64_t>(cp[j]) + av * static_cast<uint64_t>(bp[kk * g.n + j]));
            }
          }
          for (int64_t j = 0; j < g.n; ++j)
            cp[j] = wrap(static_cast<uint64_t>(cp[j]) * static_cast<uint64_t>(alpha));
        }
      });
  if (beta != 0) {
    const std::vector<int64_t> old =
        PackI64(ops[0], out.rank, out.shape.data(), out.strides.data());
    for (int64_t i = 0; i < count; ++i) {
      c[i] = wrap(static_cast<uint64_t>(c[i]) +
                  static_cast<uint64_t>(beta) * static_cast<uint64_t>(old[i]));
    }
  }
  if (ops.size() > 3 && ops[3].desc->present() && ops[3].data) {
    isa::OperandDesc bias = *ops[3].desc;
    if (bias.rank == 1) {
      const int64_t s = bias.strides[0];
      bias.rank = out.rank;
      bias.shape = out.shape;
      bias.strides.fill(0);
      bias.strides[out.rank - 1] = s;
    }
    const std::vector<int64_t> bv =
        PackI64(TensorView{ops[3].data, &bias}, bias.rank, bias.shape.data(), bias.strides.data());
    for (int64_t i = 0; i < count; ++i)
      c[i] = wrap(static_cast<uint64_t>(c[i]) + static_cast<uint64_t>(bv[i]));
  }
  const Layout l = MakeLayout(out.rank, out.shape.data(), {out.strides.data()});
  const int64_t esize = static_cast<int64_t>(isa::DTypeSize(out.dtype));
  const int64_t* p = c.data();
  ForEachRun(l, 0, l.count, [&](const int64_t* off, int64_t n) {
    StoreI64(out.dtype, ops[0].data + off[0] * esize, l.strides[0][l.rank - 1], n, p);
    p += n;
  });
  return OkStatus();
}

}  // namespace

namespace {

// Dot products of `k` floats in a fixed order (16 partial sums, combined
// pairwise): deterministic whatever the thread count.
TERN_VECTOR_CLONES
float DotF32(const float* x, const float* y, int64_t k) {
  float partial[16] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    for (int l = 0; l < 16; ++l) partial[l] += x[i + l] * y[i + l];
  }
  for (int l = 0; i < k; ++i, ++l) partial[l] += x[i] * y[i];
  for (int width = 8; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) partial[l] += partial[l + width];
  }
  return partial[0];
}

// Four dot products of `x` with y[0..3], each summed exactly as DotF32 sums
// it (so a result does not depend on which columns were grouped). The four
// independent sums keep the vector unit busy where one waits on the latency
// of its own additions: a product reading a weight it cannot keep in cache
// gets close to the bandwidth of the cache level that holds the weight.
// `next` (null for none) are the four vectors of the next call, fetched into
// the cache line by line as these are read: the hardware's stream prefetchers
// lose a weight's rows every few kilobytes, where the next group of rows
// starts, and a matrix-vector product read from the L3 waited there
// (1x512 by [1024, 512] and 1x1024 by [512, 1024] in turn, one thread:
// 42.8-45.9 us with, 44.6-50.1 without, on an AMD EPYC Zen 5).
TERN_VECTOR_CLONES
void DotF32x4(const float* x, const float* const* y, int64_t k, const float* const* next,
              float* out) {
  const float *y0 = y[0], *y1 = y[1], *y2 = y[2], *y3 = y[3];
  float p0[16] = {}, p1[16] = {}, p2[16] = {}, p3[16] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    if (next != nullptr) {
      for (int j = 0; j < 4; ++j) __builtin_prefetch(next[j] + i, 0, 3);
    }
    for (int l = 0; l < 16; ++l) {
      const float xl = x[i + l];
      p0[l] += xl * y0[i + l];
      p1[l] += xl * y1[i + l];
      p2[l] += xl * y2[i + l];
      p3[l] += xl * y3[i + l];
    }
  }
  for (int l = 0; i < k; ++i, ++l) {
    p0[l] += x[i] * y0[i];
    p1[l] += x[i] * y1[i];
    p2[l] += x[i] * y2[i];
    p3[l] += x[i] * y3[i];
  }
  for (int width = 8; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) {
      p0[l] += p0[l + width];
      p1[l] += p1[l + width];
      p2[l] += p2[l + width];
      p3[l] += p3[l + width];
    }
  }
  out[0] = p0[0];
  out[1] = p1[0];
  out[2] = p2[0];
  out[3] = p3[0];
}

// Where a matmul's bias element for output (m, n) lies: bias[m * *m_stride
// + n * *n_stride]. False when the bias varies along an outer (batch)
// dimension.
bool BiasGrid(const isa::OperandDesc& bias, int64_t* m_stride, int64_t* n_stride) {
  if (bias.rank == 0) return false;
  const uint32_t last = bias.rank - 1;
  for (uint32_t d = 0; d + 2 <= last; ++d) {
    if (bias.strides[d] != 0 && bias.shape[d] != 1) return false;
  }
  *n_stride = bias.shape[last] == 1 ? 0 : bias.strides[last];
  *m_stride = last == 0 || bias.shape[last - 1] == 1 ? 0 : bias.strides[last - 1];
  return true;
}

// A matrix-vector product (batch 1, f32, beta 0) with a's rows and b's
// columns contiguous along K: out[m, n] = alpha * dot(a[m, :], b[:, n]) +
// bias[m, n], one dot product per output. Two shapes are one: few rows
// (M <= 4: a linear layer's [N, K] weight seen transposed, at batch 1-4) and
// few columns (N <= 4: the same product computed transposed, out^T = W x^T,
// as the PyTorch plugin computes a one-row product). The many side is split
// across threads, four of its vectors per pass. oneDNN's kernels for such
// shapes (brgemm with N = 1 after transposing) move the whole weight through
// a blocked kernel at a fraction of the bandwidth a plain dot product gets:
// 235 us against ~20 for a 1x512 by 512x1024 product computed transposed.
struct SmallMatmulShape {
  bool few_rows = false;  // else few columns
  int64_t bias_m = 0, bias_n = 0;
};

// Whether SmallMatmulF32 takes this product, and how.
bool IsSmallMatmulF32(const MatmulGeometry& g, Operands ops, bool has_bias,
                      SmallMatmulShape* shape) {
  const isa::OperandDesc& out = *ops[0].desc;
  const uint32_t r = g.rank;
  if (g.batch != 1 || g.m < 1 || g.n < 1 || g.k < 16 || g.beta != 0.0f) return false;
  if (g.m > 4 && g.n > 4) return false;
  if (out.dtype != TERN_DTYPE_F32 || ops[1].desc->dtype != TERN_DTYPE_F32 ||
      ops[2].desc->dtype != TERN_DTYPE_F32) {
    return false;
  }
  if (g.a_strides[r - 1] != 1 || g.b_strides[r - 2] != 1) return false;
  shape->few_rows = g.m <= 4;
  if (!has_bias) return true;
  return ops[3].desc->dtype == TERN_DTYPE_F32 &&
         BiasGrid(*ops[3].desc, &shape->bias_m, &shape->bias_n);
}

bool SmallMatmulF32(const MatmulGeometry& g, Operands ops, bool has_bias) {
  const isa::OperandDesc& out = *ops[0].desc;
  const uint32_t r = g.rank;
  SmallMatmulShape shape;
  if (!IsSmallMatmulF32(g, ops, has_bias, &shape)) return false;
  const float* a = reinterpret_cast<const float*>(ops[1].data);
  const float* b = reinterpret_cast<const float*>(ops[2].data);
  const float* bias = has_bias ? reinterpret_cast<const float*>(ops[3].data) : nullptr;
  float* o = reinterpret_cast<float*>(ops[0].data);
  const int64_t a_row = g.a_strides[r - 2], b_col = g.b_strides[r - 1];
  const int64_t o_row = out.strides[r - 2], o_col = out.strides[r - 1];
  const float alpha = g.alpha;
  // The side with few vectors, and the side split across threads.
  const bool few_rows = shape.few_rows;
  const int64_t vectors = few_rows ? g.m : g.n;
  const int64_t many = few_rows ? g.n : g.m;
  const float* vector_base = few_rows ? a : b;
  const int64_t vector_step = few_rows ? a_row : b_col;
  const float* many_base = few_rows ? b : a;
  const int64_t many_step = few_rows ? b_col : a_row;
  // ~16K multiply-adds per task: enough to pay for a thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / (g.k * vectors));
  // (No "+ 0" without a bias: it would turn -0 into +0.)
  auto store = [&](int64_t v, int64_t i, float dot) {
    const int64_t m = few_rows ? v : i, n = few_rows ? i : v;
    const float product = alpha * dot;
    o[m * o_row + n * o_col] = bias ? product + bias[m * shape.bias_m + n * shape.bias_n] : product;
  };
  ParallelFor(
      many, grain,
      [&](int64_t begin, int64_t end) {
        int64_t i = begin;
        for (; i + 4 <= end; i += 4) {
          const float* group[4] = {many_base + i * many_step, many_base + (i + 1) * many_step,
                                   many_base + (i + 2) * many_step,
                                   many_base + (i + 3) * many_step};
          // The next group of this part is fetched while this one is first read.
          const float* next[4] = {};
          const bool has_next = i + 8 <= end;
          if (has_next) {
            for (int j = 0; j < 4; ++j) next[j] = group[j] + 4 * many_step;
          }
          for (int64_t v = 0; v < vectors; ++v) {
            float dots[4];
            DotF32x4(vector_base + v * vector_step, group, g.k, has_next && v == 0 ? next : nullptr,
                     dots);
            for (int j = 0; j < 4; ++j) store(v, i + j, dots[j]);
          }
        }
        for (; i < end; ++i) {
          for (int64_t v = 0; v < vectors; ++v) {
            store(v, i, DotF32(vector_base + v * vector_step, many_base + i * many_step, g.k));
          }
        }
      },
      KernelPool::Wake::kPollersElseSleepingHelpers);
  return true;
}

// A product oneDNN takes in place: its operands as oneDNN memory (dims,
// strides, type, data).
struct DnnlOperands {
  Dims a_dims, a_strides;
  memory::data_type a_dt;
  const void* a;
  Dims b_dims, b_strides;
  const void* b;
  Dims out_dims, out_strides;
  memory::data_type out_dt;
  void* out;
  const Dims* bias_dims;
  const Dims* bias_strides;
  memory::data_type bias_dt;
  const void* bias;
};

// Products with fewer multiply-adds run as one part, on the calling thread: a
// part must be worth more than handing it over. From 1M multiply-adds (10-15
// us on one core) a product is split for the hands that are awake (a thread
// polling for the execution's completion, a helper still looking for work);
// from 4M (~40 us) it also wakes sleeping helpers. A wake-up costs tens of
// microseconds on a virtual machine whose other CPU sits idle: a 16x256 by
// 256x512 product, ~20 us of work, took longer split than whole when the
// helper had gone to sleep, and half as long when a host thread waiting for
// the execution took the second half.
constexpr int64_t kMinSplitMacs = int64_t{1} << 20;
constexpr int64_t kMinWakeMacs = int64_t{1} << 22;

KernelPool::Wake WakeFor(int64_t multiply_adds) {
  return multiply_adds >= kMinWakeMacs ? KernelPool::Wake::kSleepingHelpers
                                       : KernelPool::Wake::kAwakeHandsOnly;
}

// Runs run_part(0 .. parts - 1), each a oneDNN call that returns false when
// oneDNN refuses it, on the kernel pool (one part: on this thread). False
// when a part was refused.
template <typename RunPart>
bool RunPartsOnPool(int parts, KernelPool::Wake wake, RunPart&& run_part) {
  std::atomic<bool> all_ok{true};
  KernelPool::Instance().Run(
      parts,
      [&](int part) {
        if (!run_part(part)) all_ok.store(false, std::memory_order_relaxed);
      },
      wake);
  return all_ok.load(std::memory_order_relaxed);
}

// As RunPartsOnPool, with the parts' primitives made (or found) first, the
// first and the last (a shorter last slab has its own), so that a refusal
// runs nothing; when loading a program, that is all.
template <typename RunPart>
bool RunDnnlParts(int parts, KernelPool::Wake wake, RunPart&& run_part) {
  const bool was_prepare_only = t_prepare_only;
  t_prepare_only = true;
  const bool ok = run_part(0) && run_part(parts - 1);
  t_prepare_only = was_prepare_only;
  if (!ok || t_prepare_only) return ok;
  return RunPartsOnPool(parts, wake, run_part);
}

// How a product is split into parts: slabs of `step` along out dimension
// `dim`, `parts` of them (1: whole), and whom the parts call on.
struct MatmulSplit {
  size_t dim = 0;
  int64_t step = 0;
  int parts = 1;
  KernelPool::Wake wake = KernelPool::Wake::kSleepingHelpers;
};

// A part is a slab of whole matrices (the first batch dimension) when there
// are enough, else of the output's rows (M), else of its columns (N): in that
// order the slabs stay dense, which oneDNN's fastest kernels want (a column
// slab of a row-major B is strided and gets its slower jit gemm, whose
// kernels are generated at the first call in the process). The parts are the
// same on every call for a shape, so loading a program prepares them.
// Products with beta != 0 are not split: a part refused at execution would
// leave the others' accumulation to be done twice by the fallback.
MatmulSplit PlanSplit(const DnnlOperands& p, float beta) {
  const size_t r = p.out_dims.size();
  const int64_t m = p.out_dims[r - 2], n = p.out_dims[r - 1], k = p.a_dims[r - 1];
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < r; ++d) batch *= p.out_dims[d];
  const int threads = KernelThreads();
  MatmulSplit split;
  const int64_t macs = batch * m * n * k;
  if (threads <= 1 || beta != 0.0f || macs < kMinSplitMacs) return split;
  split.wake = WakeFor(macs);
  size_t dim = r - 1;
  int64_t align = 16;  // column slabs of whole cache lines of f32
  if (r > 2 && p.out_dims[0] >= threads) {
    dim = 0;
    align = 1;
  } else if (m >= 8) {
    dim = r - 2;
    align = 1;
  }
  const int64_t extent = p.out_dims[dim];
  int64_t step = (extent + threads - 1) / threads;
  step = (step + align - 1) / align * align;
  split.dim = dim;
  split.step = step;
  split.parts = static_cast<int>((extent + step - 1) / step);
  return split;
}

// The operands of part `part` of the product `p` split by `split`;
// `bias_dims` holds the part's bias dims when they differ from p's.
DnnlOperands PartOf(const DnnlOperands& p, const MatmulSplit& split, int part, Dims* bias_dims) {
  if (split.parts <= 1) return p;
  const size_t r = p.out_dims.size(), dim = split.dim;
  const int64_t extent = p.out_dims[dim];
  const int64_t begin = part * split.step, size = std::min(split.step, extent - begin);
  DnnlOperands q = p;
  const uint8_t* a = static_cast<const uint8_t*>(p.a);
  const uint8_t* b = static_cast<const uint8_t*>(p.b);
  uint8_t* out = static_cast<uint8_t*>(p.out);
  const uint8_t* bias = static_cast<const uint8_t*>(p.bias);
  q.out_dims[dim] = size;
  q.out = out + begin * p.out_strides[dim] * memory::data_type_size(p.out_dt);
  // An operand takes the slab unless the split dimension is not its own
  // (N for a, M for b) or it broadcasts there (a batch dimension of 1).
  if (dim != r - 1 && p.a_dims[dim] != 1) {
    q.a_dims[dim] = size;
    q.a = a + begin * p.a_strides[dim] * memory::data_type_size(p.a_dt);
  }
  if (dim != r - 2 && p.b_dims[dim] != 1) {
    q.b_dims[dim] = size;
    q.b = b + begin * p.b_strides[dim] * memory::data_type_size(p.a_dt);
  }
  if (bias && dim == r - 1) {
    *bias_dims = *p.bias_dims;
    (*bias_dims)[dim] = size;
    q.bias_dims = bias_dims;
    q.bias = bias + begin * (*p.bias_strides)[dim] * memory::data_type_size(p.bias_dt);
  }
  return q;
}

// Runs the product through oneDNN, split across the kernel pool's threads
// (PlanSplit), with oneDNN single-threaded in each part. A shape whose parts
// oneDNN refuses runs whole. Returns false where DnnlMatmul would.
bool SplitDnnlMatmul(const DnnlOperands& p, float alpha, float beta) {
  auto run = [&](const DnnlOperands& q) {
    return DnnlMatmul(q.a_dims, q.a_strides, q.a_dt, q.a, q.b_dims, q.b_strides, q.b, q.out_dims,
                      q.out_strides, q.out_dt, q.out, alpha, beta, q.bias_dims, q.bias_strides,
                      q.bias_dt, q.bias);
  };
  const MatmulSplit split = PlanSplit(p, beta);
  if (split.parts <= 1) return run(p);
  auto run_part = [&](int part) {
    Dims bias_dims;
    return run(PartOf(p, split, part, &bias_dims));
  };
  // Refused parts (beta is 0: whatever a part wrote is overwritten).
  return RunDnnlParts(split.parts, split.wake, run_part) || run(p);
}

// --- matmuls whose weight is one of the program's constants ----------------------

// A matmul whose B operand lies in the program's constants (a model's
// weight). No instruction writes the constants segment
// (docs/executable-format.md), and every execution of the program reads the
// same constants, so when the program is loaded the weight is copied once
// into the layout oneDNN's kernels read fastest (a blocked layout of their
// choosing), as a compiler for a real device lays weights out for its
// engines. Otherwise oneDNN repacks a plain B on every call, in every part
// of a split product: a 32x256 by 256x1024 part took 1.3x as long that way,
// a 16x256 by 256x512 product 1.5x (AMD Zen 5, one thread). The copies are
// host memory of the simulated engines, not device memory, within a budget
// of the host's memory (PackedWeightBudget); past it, weights run as they lie.
struct ConstantWeightMatmul {
  ConstantWeightMatmul() = default;
  ConstantWeightMatmul(const ConstantWeightMatmul&) = delete;
  ConstantWeightMatmul& operator=(const ConstantWeightMatmul&) = delete;
  ~ConstantWeightMatmul();

  struct Part {
    std::shared_ptr<MatmulEntry> entry;  // its b_md is the packed layout
    const void* slab = nullptr;          // the part's weight in the constants
    std::shared_ptr<memory> weights;     // shared by parts with the same slab and layout
    void* weights_data = nullptr;
  };
  const void* source = nullptr;  // the weight where the constants hold it
  MatmulSplit split;
  std::vector<Part> parts;
  // Or, for a product with few rows, the weight in panels (no parts).
  std::unique_ptr<const PanelWeight> panels;
  int64_t packed_bytes = 0;
  // Set if oneDNN refused a part at execution: run as the weight lies from then on.
  mutable std::atomic<bool> refused{false};
};

std::atomic<int64_t> g_packed_weight_bytes{0};

ConstantWeightMatmul::~ConstantWeightMatmul() {
  g_packed_weight_bytes.fetch_sub(packed_bytes, std::memory_order_relaxed);
}

// Bytes of packed weights the process may hold: an eighth of the host's
// memory (a copy per weight; the model's constants themselves are in device
// memory or the file's mapping).
int64_t PackedWeightBudget() {
  static const int64_t budget = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / 8 : int64_t{1} << 30;
  }();
  return budget;
}

// Lays the weight of `p` (whose B lies in the constants, beta 0, B's batch
// dimensions all 1) out for each part of its split, makes the parts'
// primitives and runs each once. Null where oneDNN refuses a part, or past
// the budget: the execution then takes the usual path.
std::shared_ptr<const ConstantWeightMatmul> PackConstantWeight(const DnnlOperands& p, float alpha) {
  const OneDnnSingleThreaded single_threaded;
  auto packed = std::make_shared<ConstantWeightMatmul>();
  packed->source = p.b;
  packed->split = PlanSplit(p, 0.0f);
  try {
    dnnl::stream& stream = ThreadStream();
    for (int part = 0; part < packed->split.parts; ++part) {
      Dims bias_dims;
      const DnnlOperands q = PartOf(p, packed->split, part, &bias_dims);
      ConstantWeightMatmul::Part made;
      made.slab = q.b;
      made.entry = std::make_shared<MatmulEntry>();
      MakeMatmulEntry(memory::desc(q.a_dims, q.a_dt, q.a_strides),
                      memory::desc(q.b_dims, q.a_dt, memory::format_tag::any),
                      memory::desc(q.out_dims, q.out_dt, q.out_strides), q.bias_dims,
                      q.bias_strides, q.bias_dt, alpha, 0.0f, made.entry.get());
      if (!made.entry->ok) return nullptr;
      for (const ConstantWeightMatmul::Part& earlier : packed->parts) {
        if (earlier.slab == made.slab && earlier.entry->b_md == made.entry->b_md) {
          made.weights = earlier.weights;
          break;
        }
      }
      if (!made.weights) {
        const auto bytes = static_cast<int64_t>(made.entry->b_md.get_size());
        if (g_packed_weight_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes >
            PackedWeightBudget()) {
          g_packed_weight_bytes.fetch_sub(bytes, std::memory_order_relaxed);
          return nullptr;
        }
        packed->packed_bytes += bytes;
        made.weights = std::make_shared<memory>(made.entry->b_md, Engine());
        memory plain(memory::desc(q.b_dims, q.a_dt, q.b_strides), Engine(), const_cast<void*>(q.b));
        dnnl::reorder(plain, *made.weights).execute(stream, plain, *made.weights);
        stream.wait();
      }
      made.weights_data = made.weights->get_data_handle();
      Scratchpads().Reserve(made.entry->scratch_md.get_size());
      WarmUpMatmul(nullptr, *made.entry, q.bias_dims != nullptr);
      packed->parts.push_back(std::move(made));
    }
  } catch (const dnnl::error&) {
    return nullptr;
  }
  return packed;
}

// Whether a product runs from panels when its weight is a constant
// (panel_weight.h): one matrix of at most PanelWeight::kMaxRows rows, f32,
// beta 0, a's rows contiguous, a bias (if any) on a grid; *bias_m and *bias_n
// get the bias's strides.
bool PanelsTake(const MatmulGeometry& g, Operands ops, bool has_bias, int64_t* bias_m,
                int64_t* bias_n) {
  const uint32_t r = g.rank;
  if (g.batch != 1 || g.m < 1 || g.m > PanelWeight::kMaxRows || g.n < 1 || g.k < 1 ||
      g.beta != 0.0f) {
    return false;
  }
  if (ops[0].desc->dtype != TERN_DTYPE_F32 || ops[1].desc->dtype != TERN_DTYPE_F32 ||
      ops[2].desc->dtype != TERN_DTYPE_F32 || g.a_strides[r - 1] != 1) {
    return false;
  }
  *bias_m = *bias_n = 0;
  if (!has_bias) return true;
  return ops[3].desc->dtype == TERN_DTYPE_F32 && BiasGrid(*ops[3].desc, bias_m, bias_n);
}

// The panels of a product's constant weight (made when the program is
// loaded), or null where panels do not take the product or past the budget.
std::shared_ptr<const ConstantWeightMatmul> PackPanels(const MatmulGeometry& g, Operands ops,
                                                       bool has_bias) {
  int64_t bias_m = 0, bias_n = 0;
  if (!PanelsTake(g, ops, has_bias, &bias_m, &bias_n)) return nullptr;
  const uint32_t r = g.rank;
  auto panels = PanelWeight::Pack(reinterpret_cast<const float*>(ops[2].data), g.k, g.n,
                                  g.b_strides[r - 2], g.b_strides[r - 1]);
  if (!panels) return nullptr;
  const int64_t bytes = panels->bytes();
  if (g_packed_weight_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes >
      PackedWeightBudget()) {
    g_packed_weight_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    return nullptr;
  }
  auto packed = std::make_shared<ConstantWeightMatmul>();
  packed->source = ops[2].data;
  packed->packed_bytes = bytes;
  packed->panels = std::move(panels);
  return packed;
}

// Runs the product from its weight's panels; false (nothing written) when
// `packed` has none or they are not this product's.
bool RunPanels(const ConstantWeightMatmul& packed, const MatmulGeometry& g, Operands ops,
               bool has_bias) {
  int64_t bias_m = 0, bias_n = 0;
  if (!packed.panels || ops[2].data != packed.source || packed.panels->k() != g.k ||
      packed.panels->n() != g.n || !PanelsTake(g, ops, has_bias, &bias_m, &bias_n)) {
    return false;
  }
  const uint32_t r = g.rank;
  const isa::OperandDesc& out = *ops[0].desc;
  packed.panels->Multiply(reinterpret_cast<const float*>(ops[1].data), g.m, g.a_strides[r - 2],
                          g.alpha, has_bias ? reinterpret_cast<const float*>(ops[3].data) : nullptr,
                          bias_m, bias_n, reinterpret_cast<float*>(ops[0].data), out.strides[r - 2],
                          out.strides[r - 1]);
  return true;
}

// Runs `p` with its packed weight. False (nothing written that a later run
// does not overwrite) when p's weight is not the one packed or oneDNN
// refused a part.
bool RunConstantWeightMatmul(const ConstantWeightMatmul& packed, const DnnlOperands& p) {
  if (p.b != packed.source || packed.parts.empty() ||
      packed.refused.load(std::memory_order_relaxed)) {
    return false;
  }
  auto run_part = [&](int part) {
    const OneDnnSingleThreaded single_threaded;
    Dims bias_dims;
    const DnnlOperands q = PartOf(p, packed.split, part, &bias_dims);
    const ConstantWeightMatmul::Part& own = packed.parts[static_cast<size_t>(part)];
    return ExecuteMatmulEntry(nullptr, *own.entry, q.a, own.weights_data, q.out, q.bias,
                              q.bias != nullptr);
  };
  const bool ok =
      RunPartsOnPool(static_cast<int>(packed.parts.size()), packed.split.wake, run_part);
  if (!ok) packed.refused.store(true, std::memory_order_relaxed);
  return ok;
}

// Whether every batch dimension of an operand's dims is 1 (a weight).
bool BatchOfOne(const Dims& dims) {
  for (size_t d = 0; d + 2 < dims.size(); ++d) {
    if (dims[d] != 1) return false;
  }
  return true;
}

// The product of a matmul instruction into ops[0]. At execution, `packed` is
// what loading made for the instruction (its weight laid out, or null). When
// loading (t_prepare_only), `prepare_into` receives that.
Status MatmulProduct(const driver::Instruction& ins, Operands ops,
                     const ConstantWeightMatmul* packed,
                     std::shared_ptr<const void>* prepare_into) {
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& a = *ops[1].desc;
  const MatmulGeometry g = MakeGeometry(ins, ops);
  if (out.element_count() == 0) return OkStatus();
  if (isa::IsInteger(a.dtype)) return MatmulInteger(ops, g);
  const uint32_t r = g.rank;
  const bool has_bias = ops.size() > 3 && ops[3].desc->present() && ops[3].data != nullptr;
  try {
    // Direct: oneDNN on the operands in place.
    const bool native_types = (a.dtype == TERN_DTYPE_F32 && out.dtype == TERN_DTYPE_F32) ||
                              (a.dtype == TERN_DTYPE_BF16 &&
                               (out.dtype == TERN_DTYPE_BF16 || out.dtype == TERN_DTYPE_F32));
    int64_t bias_stride = 0;
    const bool bias_ok = !has_bias || (g.alpha == 1.0f && RowBias(*ops[3].desc, g.n, &bias_stride));
    // Batch broadcasts became size 1 (oneDNN broadcasts those itself); a
    // stride 0 left on a dimension of size > 1 goes through packing.
    const bool strides_ok = NoBroadcast(g.a_shape, g.a_strides, 0, r) &&
                            NoBroadcast(g.b_shape, g.b_strides, 0, r) &&
                            NoBroadcast(out.shape.data(), out.strides.data(), 0, r);
    if (t_prepare_only) {
      if (prepare_into != nullptr && ops[2].desc->segment == TERN_SEGMENT_CONSTANT) {
        if (auto made = PackPanels(g, ops, has_bias)) {
          *prepare_into = std::move(made);
          return OkStatus();
        }
      }
      SmallMatmulShape small;
      if (IsSmallMatmulF32(g, ops, has_bias, &small)) return OkStatus();
    } else if ((packed != nullptr && RunPanels(*packed, g, ops, has_bias)) ||
               SmallMatmulF32(g, ops, has_bias)) {
      return OkStatus();
    }
    if (OneDnnEnabled() && native_types && bias_ok && strides_ok && g.k > 0) {
      Dims ad(g.a_shape, g.a_shape + r), bd(g.b_shape, g.b_shape + r),
          od(out.shape.begin(), out.shape.begin() + r);
      Dims bias_dims, bias_strides;
      if (has_bias) {
        bias_dims.assign(r, 1);
        bias_dims[r - 1] = g.n;
        bias_strides.assign(r, 1);
        bias_strides[r - 1] = bias_stride;
        bias_strides = SafeStrides(bias_dims.data(), bias_strides.data(), r);
      }
      const DnnlOperands operands{ad,
                                  SafeStrides(g.a_shape, g.a_strides, r),
                                  DnnlType(a.dtype),
                                  ops[1].data,
                                  bd,
                                  SafeStrides(g.b_shape, g.b_strides, r),
                                  ops[2].data,
                                  od,
                                  SafeStrides(out.shape.data(), out.strides.data(), r),
                                  DnnlType(out.dtype),
                                  ops[0].data,
                                  has_bias ? &bias_dims : nullptr,
                                  has_bias ? &bias_strides : nullptr,
                                  DnnlType(ops[3 < ops.size() ? 3 : 0].desc->dtype),
                                  has_bias ? ops[3].data : nullptr};
      if (t_prepare_only && prepare_into != nullptr &&
          ops[2].desc->segment == TERN_SEGMENT_CONSTANT && g.beta == 0.0f && BatchOfOne(bd)) {
        if (auto made = PackConstantWeight(operands, g.alpha)) {
          *prepare_into = std::move(made);
          return OkStatus();
        }
      }
      if (!t_prepare_only && packed != nullptr && RunConstantWeightMatmul(*packed, operands)) {
        return OkStatus();
      }
      if (SplitDnnlMatmul(operands, g.alpha, g.beta)) return OkStatus();
    }
    if (t_prepare_only) return OkStatus();  // the packed path makes its primitive when it runs
    // Packed: contiguous f32 copies (batch broadcasts kept as size 1), f32
    // product, then beta/bias and one rounding into out.
    const std::vector<float> pa = PackF32(ops[1], r, g.a_shape, g.a_strides);
    // A B whose K dimension is the contiguous one (a transposed view, such
    // as attention's keys) is gathered as N x K, in runs along K: gathered as
    // K x N its elements came one at a time, a strided load each. GPT-2's
    // 4x64x64 attention scores come here in a PyTorch process (oneDNN
    // refused their per-head layout, dnnl_unimplemented, when loading ran the
    // primitive; why there and not in the kernel tests is not known): 54 us
    // that way, 30 us now, of which oneDNN's product is 20-24.
    const bool b_transposed =
        r >= 2 && g.b_strides[r - 2] == 1 && g.b_strides[r - 1] != 1 && g.b_shape[r - 1] > 1;
    std::vector<float> pb;
    if (b_transposed) {
      int64_t shape[TERN_MAX_RANK], strides[TERN_MAX_RANK];
      std::copy(g.b_shape, g.b_shape + r, shape);
      std::copy(g.b_strides, g.b_strides + r, strides);
      std::swap(shape[r - 2], shape[r - 1]);
      std::swap(strides[r - 2], strides[r - 1]);
      pb = PackF32(ops[2], r, shape, strides);
    } else {
      pb = PackF32(ops[2], r, g.b_shape, g.b_strides);
    }
    std::vector<float> c(out.element_count());
    PackedMatmulF32(g, out.shape.data(), pa, std::move(pb), b_transposed, &c);
    MatmulEpilogueF32(ops, g, c);
  } catch (const dnnl::error& e) {
    return MakeStatus(TERN_ERROR_INTERNAL, "matmul: oneDNN failed: {} (status {})", e.what(),
                      static_cast<int>(e.status));
  }
  return OkStatus();
}

// The residual operand (slot 4) of matmul and conv2d, or null.
const TensorView* ResidualOf(Operands ops) {
  return ops.size() > 4 && ops[4].desc->present() ? &ops[4] : nullptr;
}

}  // namespace

Status RunMatmul(const driver::Instruction& ins, Operands ops) {
  // Instruction::prepared of a matmul is only ever PrepareDnnlKernels's.
  const auto* packed = static_cast<const ConstantWeightMatmul*>(ins.prepared.get());
  TERN_RETURN_IF_ERROR(MatmulProduct(ins, ops, packed, nullptr));
  const int64_t activation = ins.ints.size() > 2 ? ins.ints[2] : TERN_ACTIVATION_NONE;
  const std::span<const double> parameters = ins.floats.size() > 2
                                                 ? std::span<const double>(ins.floats).subspan(2)
                                                 : std::span<const double>();
  return ApplyTensorEpilogue(ops[0], ResidualOf(ops), activation, parameters);
}

// --- convolution ----------------------------------------------------------------

namespace {

struct ConvParams {
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
};

ConvParams ConvParamsOf(const driver::Instruction& ins) {
  ConvParams p;
  if (ins.ints.size() >= 7) {  // (an 8th int is conv2d's activation)
    p = {ins.ints[0], ins.ints[1], ins.ints[2], ins.ints[3], ins.ints[4], ins.ints[5], ins.ints[6]};
  }
  return p;
}

// Shapes: input [N, C, H, W], weight [O, C/G, KH, KW], out [N, O, OH, OW].
struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
};

ConvShape ShapeOf(const isa::OperandDesc& in, const isa::OperandDesc& wt,
                  const isa::OperandDesc& out) {
  return {in.shape[0], in.shape[1], in.shape[2],  in.shape[3], wt.shape[0],
          wt.shape[2], wt.shape[3], out.shape[2], out.shape[3]};
}

// --- portable loops, on contiguous f32 buffers ---

void ConvForwardLoops(const ConvShape& s, const ConvParams& p, const float* in, const float* wt,
                      const float* bias, float* out) {
  const int64_t cg = s.c / p.groups, og = s.o / p.groups;
  ParallelFor(s.n * s.o, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / s.o, o = item % s.o, g = o / og;
      for (int64_t y = 0; y < s.oh; ++y) {
        for (int64_t x = 0; x < s.ow; ++x) {
          double acc = bias ? bias[o] : 0.0;
          for (int64_t c = 0; c < cg; ++c) {
            for (int64_t ky = 0; ky < s.kh; ++ky) {
              const int64_t iy = y * p.sh - p.ph + ky * p.dh;
              if (iy < 0 || iy >= s.h) continue;
              for (int64_t kx = 0; kx < s.kw; ++kx) {
                const int64_t ix = x * p.sw - p.pw + kx * p.dw;
                if (ix < 0 || ix >= s.w) continue;
                acc += static_cast<double>(in[((n * s.c + g * cg + c) * s.h + iy) * s.w + ix]) *
                       wt[((o * cg + c) * s.kh + ky) * s.kw + kx];
              }
            }
          }
          out[((n * s.o + o) * s.oh + y) * s.ow + x] = static_cast<float>(acc);
        }
      }
    }
  });
}

void ConvBackwardInputLoops(const ConvShape& s, const ConvParams& p, const float* go,
                            const float* wt, float* gi) {
  const int64_t cg = s.c / p.groups, og = s.o / p.groups;
  std::fill(gi, gi + s.n * s.c * s.h * s.w, 0.0f);
  // Each (n, group) owns its input channels: no two items write one element.
  ParallelFor(s.n * p.groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(cg * s.h * s.w);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / p.groups, g = item % p.groups;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t o = g * og; o < (g + 1) * og; ++o) {
        for (int64_t y = 0; y < s.oh; ++y) {
          for (int64_t x = 0; x < s.ow; ++x) {
            const double gv = go[((n * s.o + o) * s.oh + y) * s.ow + x];
            for (int64_t c = 0; c < cg; ++c) {
              for (int64_t ky = 0; ky < s.kh; ++ky) {
                const int64_t iy = y * p.sh - p.ph + ky * p.dh;
                if (iy < 0 || iy >= s.h) continue;
                for (int64_t kx = 0; kx < s.kw; ++kx) {
                  const int64_t ix = x * p.sw - p.pw + kx * p.dw;
                  if (ix < 0 || ix >= s.w) continue;
                  acc[(c * s.h + iy) * s.w + ix] += gv * wt[((o * cg + c) * s.kh + ky) * s.kw + kx];
                }
              }
            }
          }
        }
      }
      float* dst = gi + (n * s.c + g * cg) * s.h * s.w;
      for (size_t i = 0; i < acc.size(); ++i) dst[i] = static_cast<float>(acc[i]);
    }
  });
}

void ConvBackwardWeightLoops(const ConvShape& s, const ConvParams& p, const float* go,
                             const float* in, float* gw) {
  const int64_t cg = s.c / p.groups, og = s.o / p.groups;
  ParallelFor(s.o, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const int64_t g = o / og;
      for (int64_t c = 0; c < cg; ++c) {
        for (int64_t ky = 0; ky < s.kh; ++ky) {
          for (int64_t kx = 0; kx < s.kw; ++kx) {
            double acc = 0;
            for (int64_t n = 0; n < s.n; ++n) {
              for (int64_t y = 0; y < s.oh; ++y) {
                const int64_t iy = y * p.sh - p.ph + ky * p.dh;
                if (iy < 0 || iy >= s.h) continue;
                for (int64_t x = 0; x < s.ow; ++x) {
                  const int64_t ix = x * p.sw - p.pw + kx * p.dw;
                  if (ix < 0 || ix >= s.w) continue;
                  acc += static_cast<double>(go[((n * s.o + o) * s.oh + y) * s.ow + x]) *
                         in[((n * s.c + g * cg + c) * s.h + iy) * s.w + ix];
                }
              }
            }
            gw[((o * cg + c) * s.kh + ky) * s.kw + kx] = static_cast<float>(acc);
          }
        }
      }
    }
  });
}

// --- oneDNN ---

enum class ConvKind { kForward, kBackwardInput, kBackwardWeight };

struct ConvEntry {
  bool ok = false;
  dnnl::primitive prim;
  // User (strided) descs, the primitive's descs, and reorders between them.
  memory::desc user_md[3], prim_md[3], scratch_md;
  bool reorder[3] = {};
  dnnl::reorder to_prim[3], from_prim[3];
  memory::desc bias_md;
};

PrimitiveCache<ConvEntry>& ConvCache() {
  static auto* cache = new PrimitiveCache<ConvEntry>();
  return *cache;
}

Dims ConvDims(const isa::OperandDesc& d) { return Dims(d.shape.begin(), d.shape.begin() + 4); }

// Weight [O, C/G, KH, KW] as oneDNN wants it: [G, O/G, C/G, KH, KW] when grouped.
void WeightDesc(const isa::OperandDesc& w, int64_t groups, Dims* dims, Dims* strides) {
  if (groups == 1) {
    *dims = ConvDims(w);
    *strides = SafeStrides(w.shape.data(), w.strides.data(), 4);
    return;
  }
  *dims = {groups, w.shape[0] / groups, w.shape[1], w.shape[2], w.shape[3]};
  int64_t sh[5] = {groups, w.shape[0] / groups, w.shape[1], w.shape[2], w.shape[3]};
  int64_t st[5] = {w.strides[0] * (w.shape[0] / groups), w.strides[0], w.strides[1], w.strides[2],
                   w.strides[3]};
  *strides = SafeStrides(sh, st, 5);
}

// Slots: 0 the "src" side (input or grad_input), 1 weight (or grad_weight),
// 2 the "dst" side (out or grad_out). `data` in that order.
bool DnnlConv(ConvKind kind, const ConvParams& p, const ConvShape& s,
              const isa::OperandDesc* descs[3], uint8_t* data[3], const float* bias) {
  const tern_dtype_t dt = descs[0]->dtype;
  Dims md_dims[3], md_strides[3];
  md_dims[0] = ConvDims(*descs[0]);
  md_strides[0] = SafeStrides(descs[0]->shape.data(), descs[0]->strides.data(), 4);
  WeightDesc(*descs[1], p.groups, &md_dims[1], &md_strides[1]);
  md_dims[2] = ConvDims(*descs[2]);
  md_strides[2] = SafeStrides(descs[2]->shape.data(), descs[2]->strides.data(), 4);
  const Dims strides = {p.sh, p.sw}, dilates = {p.dh - 1, p.dw - 1}, pad_l = {p.ph, p.pw};
  const Dims pad_r = {(s.oh - 1) * p.sh + (s.kh - 1) * p.dh + 1 - s.h - p.ph,
                      (s.ow - 1) * p.sw + (s.kw - 1) * p.dw + 1 - s.w - p.pw};
  const OneDnnSingleThreaded single_threaded;
  PrimitiveKey key;
  key.Add(static_cast<int64_t>(kind));
  key.Add(static_cast<int64_t>(dt));
  for (int i = 0; i < 3; ++i) {
    key.Add(md_dims[i]);
    key.Add(md_strides[i]);
  }
  for (const Dims* dims : {&strides, &dilates, &pad_l, &pad_r}) key.Add(*dims);
  key.Add(bias != nullptr);
  std::shared_ptr<ConvEntry> entry = ConvCache().Find(key);
  dnnl::engine& eng = Engine();
  if (!entry) {
    entry = std::make_shared<ConvEntry>();
    try {
      const memory::data_type t = DnnlType(dt);
      memory::desc any[3];
      for (int i = 0; i < 3; ++i) {
        entry->user_md[i] = memory::desc(md_dims[i], t, md_strides[i]);
        any[i] = memory::desc(md_dims[i], t, memory::format_tag::any);
      }
      if (bias) entry->bias_md = memory::desc({s.o}, memory::data_type::f32, memory::format_tag::a);
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const dnnl::prop_kind prop = kind == ConvKind::kForward ? dnnl::prop_kind::forward_inference
                                                              : dnnl::prop_kind::forward_training;
      dnnl::convolution_forward::desc fwd_desc =
          bias ? dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, any[0],
                                                 any[1], entry->bias_md, any[2], strides, dilates,
                                                 pad_l, pad_r)
               : dnnl::convolution_forward::desc(prop, dnnl::algorithm::convolution_direct, any[0],
                                                 any[1], any[2], strides, dilates, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, attr, eng);
      std::string impl;
      if (kind == ConvKind::kForward) {
        impl = fwd_pd.impl_info_str();
        entry->prim_md[0] = fwd_pd.src_desc();
        entry->prim_md[1] = fwd_pd.weights_desc();
        entry->prim_md[2] = fwd_pd.dst_desc();
        entry->scratch_md = fwd_pd.scratchpad_desc();
        entry->prim = dnnl::convolution_forward(fwd_pd);
      } else if (kind == ConvKind::kBackwardInput) {
        dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, any[0], any[1],
                                                any[2], strides, dilates, pad_l, pad_r);
        dnnl::convolution_backward_data::primitive_desc pd(d, attr, eng, fwd_pd);
        impl = pd.impl_info_str();
        entry->prim_md[0] = pd.diff_src_desc();
        entry->prim_md[1] = pd.weights_desc();
        entry->prim_md[2] = pd.diff_dst_desc();
        entry->scratch_md = pd.scratchpad_desc();
        entry->prim = dnnl::convolution_backward_data(pd);
      } else {
        dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, any[0],
                                                   any[1], any[2], strides, dilates, pad_l, pad_r);
        dnnl::convolution_backward_weights::primitive_desc pd(d, attr, eng, fwd_pd);
        impl = pd.impl_info_str();
        entry->prim_md[0] = pd.src_desc();
        entry->prim_md[1] = pd.diff_weights_desc();
        entry->prim_md[2] = pd.diff_dst_desc();
        entry->scratch_md = pd.scratchpad_desc();
        entry->prim = dnnl::convolution_backward_weights(pd);
      }
      for (int i = 0; i < 3; ++i) {
        entry->reorder[i] = entry->user_md[i] != entry->prim_md[i];
        if (entry->reorder[i]) {
          entry->to_prim[i] = dnnl::reorder(
              dnnl::reorder::primitive_desc(eng, entry->user_md[i], eng, entry->prim_md[i]));
          entry->from_prim[i] = dnnl::reorder(
              dnnl::reorder::primitive_desc(eng, entry->prim_md[i], eng, entry->user_md[i]));
        }
      }
      entry->ok = impl.rfind("ref", 0) != 0;
    } catch (const dnnl::error&) {
      entry->ok = false;
    }
    ConvCache().Insert(key, entry);
  }
  if (!entry->ok) return false;
  if (t_prepare_only) {
    Scratchpads().Reserve(entry->scratch_md.get_size());
    return true;
  }
  // oneDNN may still refuse at execution (status 3 has been seen for grouped
  // convolutions); the caller then runs the portable loops, which write the
  // whole output.
  try {
    dnnl::stream& stream = ThreadStream();
    // Which slot the primitive writes.
    const int written = kind == ConvKind::kForward ? 2 : kind == ConvKind::kBackwardInput ? 0 : 1;
    memory mem[3];
    std::vector<std::vector<uint8_t>> staging(3);
    for (int i = 0; i < 3; ++i) {
      memory user(entry->user_md[i], eng, data[i]);
      if (!entry->reorder[i]) {
        mem[i] = user;
        continue;
      }
      staging[i].resize(entry->prim_md[i].get_size());
      mem[i] = memory(entry->prim_md[i], eng, staging[i].data());
      if (i != written) entry->to_prim[i].execute(stream, user, mem[i]);
    }
    ScratchPool::Lease scratch = Scratchpads().Acquire(entry->scratch_md.get_size());
    std::unordered_map<int, memory> args;
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(entry->scratch_md, eng, scratch.data()));
    if (kind == ConvKind::kForward) {
      args.emplace(DNNL_ARG_SRC, mem[0]);
      args.emplace(DNNL_ARG_WEIGHTS, mem[1]);
      args.emplace(DNNL_ARG_DST, mem[2]);
      if (bias) args.emplace(DNNL_ARG_BIAS, memory(entry->bias_md, eng, const_cast<float*>(bias)));
    } else if (kind == ConvKind::kBackwardInput) {
      args.emplace(DNNL_ARG_DIFF_SRC, mem[0]);
      args.emplace(DNNL_ARG_WEIGHTS, mem[1]);
      args.emplace(DNNL_ARG_DIFF_DST, mem[2]);
    } else {
      args.emplace(DNNL_ARG_SRC, mem[0]);
      args.emplace(DNNL_ARG_DIFF_WEIGHTS, mem[1]);
      args.emplace(DNNL_ARG_DIFF_DST, mem[2]);
    }
    entry->prim.execute(stream, args);
    if (entry->reorder[written]) {
      memory user(entry->user_md[written], eng, data[written]);
      entry->from_prim[written].execute(stream, mem[written], user);
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    NoteRefusedAtExecution("convolution", static_cast<int>(e.status));
    ConvCache().Refuse(key);
    return false;
  }
  return true;
}

// Runs one convolution kind. slots: src side, weight side, dst side in ops.
// DnnlConv split across the kernel pool's threads by slabs of the batch,
// oneDNN single-threaded in each part (as SplitDnnlMatmul). The weight
// gradient sums over the batch and runs whole, as do shapes whose parts
// oneDNN refuses.
bool SplitDnnlConv(ConvKind kind, const ConvParams& p, const ConvShape& s,
                   const isa::OperandDesc* descs[3], uint8_t* data[3], const float* bias) {
  const int threads = KernelThreads();
  const int64_t macs =
      s.n * s.o * s.oh * s.ow * (s.c / std::max<int64_t>(1, p.groups)) * s.kh * s.kw;
  if (kind == ConvKind::kBackwardWeight || threads <= 1 || s.n < 2 || macs < kMinSplitMacs) {
    return DnnlConv(kind, p, s, descs, data, bias);
  }
  const int64_t step = (s.n + threads - 1) / threads;
  const int parts = static_cast<int>((s.n + step - 1) / step);
  auto run_part = [&](int part) {
    const int64_t begin = part * step, size = std::min(step, s.n - begin);
    isa::OperandDesc slab[3] = {*descs[0], *descs[1], *descs[2]};
    const isa::OperandDesc* slab_descs[3] = {&slab[0], &slab[1], &slab[2]};
    uint8_t* slab_data[3] = {data[0], data[1], data[2]};
    for (int i : {0, 2}) {  // the input and the output (or their gradients)
      slab[i].shape[0] = size;
      slab_data[i] +=
          begin * slab[i].strides[0] * static_cast<int64_t>(isa::DTypeSize(slab[i].dtype));
    }
    ConvShape part_shape = s;
    part_shape.n = size;
    return DnnlConv(kind, p, part_shape, slab_descs, slab_data, bias);
  };
  return RunDnnlParts(parts, WakeFor(macs), run_part) || DnnlConv(kind, p, s, descs, data, bias);
}

Status RunConv(ConvKind kind, const driver::Instruction& ins, Operands ops, int src_slot,
               int wt_slot, int dst_slot) {
  const ConvParams p = ConvParamsOf(ins);
  const isa::OperandDesc* descs[3] = {ops[src_slot].desc, ops[wt_slot].desc, ops[dst_slot].desc};
  const ConvShape s = ShapeOf(*descs[0], *descs[1], *descs[2]);
  const int written = kind == ConvKind::kForward ? 2 : kind == ConvKind::kBackwardInput ? 0 : 1;
  if (descs[written]->element_count() == 0) return OkStatus();
  std::vector<float> bias;
  if (kind == ConvKind::kForward && ops.size() > 3 && ops[3].desc->present() && ops[3].data) {
    bias.resize(s.o);
    if (!t_prepare_only) GatherF32(ops[3], bias.data());
  }
  const bool nonempty = s.n > 0 && s.c > 0 && s.o > 0 && s.oh > 0 && s.ow > 0;
  const tern_dtype_t dt = descs[0]->dtype;
  try {
    if (OneDnnEnabled() && nonempty) {
      uint8_t* data[3] = {ops[src_slot].data, ops[wt_slot].data, ops[dst_slot].data};
      bool strides_ok = true;
      for (const isa::OperandDesc* d : descs)
        strides_ok = strides_ok && NoBroadcast(d->shape.data(), d->strides.data(), 0, 4);
      if (dt != TERN_DTYPE_F16 && strides_ok &&
          SplitDnnlConv(kind, p, s, descs, data, bias.empty() ? nullptr : bias.data())) {
        return OkStatus();
      }
    }
    if (t_prepare_only) return OkStatus();  // the packed path makes its primitive when it runs
    // f32 copies of the two inputs; f32 result rounded once into the output.
    std::vector<float> buf[3];
    isa::OperandDesc dense[3];
    for (int i = 0; i < 3; ++i) {
      dense[i] = *descs[i];
      dense[i].dtype = TERN_DTYPE_F32;
      isa::SetContiguousStrides(&dense[i]);
      buf[i].resize(descs[i]->element_count());
      if (i != written)
        GatherF32(ops[i == 0 ? src_slot : i == 1 ? wt_slot : dst_slot], buf[i].data());
    }
    bool done = false;
    if (OneDnnEnabled() && nonempty) {
      uint8_t* data[3] = {reinterpret_cast<uint8_t*>(buf[0].data()),
                          reinterpret_cast<uint8_t*>(buf[1].data()),
                          reinterpret_cast<uint8_t*>(buf[2].data())};
      const isa::OperandDesc* dd[3] = {&dense[0], &dense[1], &dense[2]};
      done = DnnlConv(kind, p, s, dd, data, bias.empty() ? nullptr : bias.data());
    }
    if (!done) {
      switch (kind) {
        case ConvKind::kForward:
          ConvForwardLoops(s, p, buf[0].data(), buf[1].data(), bias.empty() ? nullptr : bias.data(),
                           buf[2].data());
          break;
        case ConvKind::kBackwardInput:
          ConvBackwardInputLoops(s, p, buf[2].data(), buf[1].data(), buf[0].data());
          break;
        case ConvKind::kBackwardWeight:
          ConvBackwardWeightLoops(s, p, buf[2].data(), buf[0].data(), buf[1].data());
          break;
      }
    }
    ScatterF32(ops[written == 0   ? src_slot
                   : written == 1 ? wt_slot
                                  : dst_slot],
               buf[written].data());
  } catch (const dnnl::error& e) {
    return MakeStatus(TERN_ERROR_INTERNAL, "{}: oneDNN failed: {} (status {})",
                      isa::OpcodeName(ins.opcode), e.what(), static_cast<int>(e.status));
  }
  return OkStatus();
}

}  // namespace

void PrepareDnnlThread() {
  const OneDnnSingleThreaded single_threaded;
  (void)ThreadStream();
}

std::shared_ptr<const void> PrepareDnnlKernels(const driver::Instruction& ins, Operands ops) {
  struct PrepareOnly {
    PrepareOnly() { t_prepare_only = true; }
    ~PrepareOnly() { t_prepare_only = false; }
  } prepare_only;
  std::shared_ptr<const void> prepared;
  switch (ins.opcode) {
    case TERN_OP_MATMUL:
      (void)MatmulProduct(ins, ops, nullptr, &prepared);
      break;
    case TERN_OP_CONV2D:
      (void)RunConv(ConvKind::kForward, ins, ops, 1, 2, 0);
      break;
    case TERN_OP_CONV2D_BACKWARD_INPUT:
      (void)RunConv(ConvKind::kBackwardInput, ins, ops, 0, 2, 1);
      break;
    case TERN_OP_CONV2D_BACKWARD_WEIGHT:
      (void)RunConv(ConvKind::kBackwardWeight, ins, ops, 2, 0, 1);
      break;
    default:
      break;
  }
  return prepared;
}

Status RunConv2d(const driver::Instruction& ins, Operands ops) {
  // [out, input, weight, bias?, residual?]
  TERN_RETURN_IF_ERROR(RunConv(ConvKind::kForward, ins, ops, 1, 2, 0));
  const int64_t activation = ins.ints.size() > 7 ? ins.ints[7] : TERN_ACTIVATION_NONE;
  return ApplyTensorEpilogue(ops[0], ResidualOf(ops), activation, ins.floats);
}

Status RunConv2dBackwardInput(const driver::Instruction& ins, Operands ops) {
  // [grad_input, grad_out, weight]
  return RunConv(ConvKind::kBackwardInput, ins, ops, 0, 2, 1);
}

Status RunConv2dBackwardWeight(const driver::Instruction& ins, Operands ops) {
  // [grad_weight, grad_out, input]
  return RunConv(ConvKind::kBackwardWeight, ins, ops, 2, 0, 1);
}

}  // namespace kernels

bool OneDnnHasFastMatmulForTesting(tern_dtype_t in, tern_dtype_t out) {
  using dnnl::memory;
  const memory::dims a_dims = {16, 40}, b_dims = {40, 48}, out_dims = {16, 48};
  kernels::MatmulEntry entry;
  kernels::MakeMatmulEntry(memory::desc(a_dims, kernels::DnnlType(in), memory::format_tag::ab),
                           memory::desc(b_dims, kernels::DnnlType(in), memory::format_tag::any),
                           memory::desc(out_dims, kernels::DnnlType(out), memory::format_tag::ab),
                           nullptr, nullptr, memory::data_type::undef, 1.0f, 0.0f, &entry);
  return entry.ok;
}

}  // namespace tern::sim
