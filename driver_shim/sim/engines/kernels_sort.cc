// The SORT and TOPK kernels. Each line along the axis is loaded as (key,
// position) pairs and ordered by key, equal keys by position, so the order is
// total: SORT is stable and both are deterministic whatever the thread count
// (threads split the lines, never a line). NaN orders above every number, as
// in PyTorch's CPU sort and topk; -0.0 equals 0.0. Float keys are loaded as
// f32 (exact for bf16 and f16), integer and bool keys as i64.
#include <algorithm>
#include <cmath>
#include <vector>

#include "driver_shim/sim/engines/kernels_internal.h"

namespace tern::sim::kernels {
namespace {

template <typename K>
struct Entry {
  K key;
  int64_t position;
};

// a < b with NaN above everything (and equal to itself).
template <typename K>
TERN_INLINE bool KeyLess(K a, K b) {
  if constexpr (std::is_floating_point_v<K>) {
    if (std::isnan(b)) return !std::isnan(a);
  }
  return a < b;
}

// Whether a goes before b: by key (ascending or descending), then position.
template <typename K, bool kDescending>
TERN_INLINE bool Before(const Entry<K>& a, const Entry<K>& b) {
  const bool first = kDescending ? KeyLess(b.key, a.key) : KeyLess(a.key, b.key);
  if (first) return true;
  const bool second = kDescending ? KeyLess(a.key, b.key) : KeyLess(b.key, a.key);
  return !second && a.position < b.position;
}

// Orders the best `k` of entries[0, n) first: all of them for a sort; for a
// topk, a selection then a sort of the k (O(n + k log k)).
template <typename K, bool kDescending>
void Order(std::vector<Entry<K>>& entries, int64_t k) {
  auto before = Before<K, kDescending>;
  if (k < static_cast<int64_t>(entries.size())) {
    std::nth_element(entries.begin(), entries.begin() + k, entries.end(), before);
  }
  std::sort(entries.begin(), entries.begin() + k, before);
}

// The best k (>= 1) of keys[0, n) into best[0, k), best first, for a small k:
// a heap of the k best so far whose top is the worst of them, so most keys
// cost one comparison (O(n log k), and no n-element array of pairs).
template <typename K, bool kDescending>
void SelectFew(const K* keys, int64_t n, int64_t k, Entry<K>* best) {
  auto before = Before<K, kDescending>;
  for (int64_t i = 0; i < k; ++i) best[i] = {keys[i], i};
  std::make_heap(best, best + k, before);
  for (int64_t i = k; i < n; ++i) {
    const Entry<K> e{keys[i], i};
    if (!before(e, best[0])) continue;
    std::pop_heap(best, best + k, before);
    best[k - 1] = e;
    std::push_heap(best, best + k, before);
  }
  std::sort_heap(best, best + k, before);
}

// A topk takes SelectFew when k is this many times smaller than the line.
inline constexpr int64_t kFewFactor = 8;

// Sorts (k == length) or selects (k < length) every line of ops[2] along
// `axis` into values ops[0] and indices ops[1].
template <typename K>
void SortLines(Operands ops, uint32_t axis, int64_t k, bool descending) {
  const isa::OperandDesc& values = *ops[0].desc;
  const isa::OperandDesc& indices = *ops[1].desc;
  const isa::OperandDesc& in = *ops[2].desc;
  const bool scalar = in.rank == 0;
  const int64_t length = scalar ? 1 : in.shape[axis];
  const int64_t vs = scalar ? 0 : values.strides[axis], is = scalar ? 0 : indices.strides[axis],
                s = scalar ? 0 : in.strides[axis];
  const Layout lines =
      AxisLines(in.rank, in.shape.data(), axis,
                {values.strides.data(), indices.strides.data(), in.strides.data()});
  // A sort costs some log2(length) passes over a line: fewer lines per thread.
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (8 * length));
  ParallelFor(lines.count, grain, [&](int64_t begin, int64_t end) {
    std::vector<K> keys(length);
    std::vector<int64_t> positions(k);
    std::vector<Entry<K>> entries(length);
    ForEachLine(lines, begin, end, [&](const int64_t* off) {
      if constexpr (std::is_floating_point_v<K>) {
        LoadF32(in.dtype, At(ops[2], off[2]), s, length, keys.data());
      } else {
        LoadI64(in.dtype, At(ops[2], off[2]), s, length, keys.data());
      }
      if (k * kFewFactor <= length) {
        if (descending) {
          SelectFew<K, true>(keys.data(), length, k, entries.data());
        } else {
          SelectFew<K, false>(keys.data(), length, k, entries.data());
        }
      } else {
        for (int64_t i = 0; i < length; ++i) entries[i] = {keys[i], i};
        if (descending) {
          Order<K, true>(entries, k);
        } else {
          Order<K, false>(entries, k);
        }
      }
      for (int64_t i = 0; i < k; ++i) {
        keys[i] = entries[i].key;
        positions[i] = entries[i].position;
      }
      if constexpr (std::is_floating_point_v<K>) {
        StoreF32(values.dtype, At(ops[0], off[0]), vs, k, keys.data());
      } else {
        StoreI64(values.dtype, At(ops[0], off[0]), vs, k, keys.data());
      }
      StoreI64(TERN_DTYPE_I64, At(ops[1], off[1]), is, k, positions.data());
    });
  });
}

// SORT and TOPK: [values, indices, in] ints [axis, descending | largest]. A
// TOPK is the first k of SORT's order (largest: of the descending order).
Status SortOrSelect(const driver::Instruction& ins, Operands ops) {
  const isa::OperandDesc& in = *ops[2].desc;
  const uint32_t axis =
      in.rank == 0 ? 0
                   : static_cast<uint32_t>(ins.ints[0] < 0 ? ins.ints[0] + in.rank : ins.ints[0]);
  const int64_t k = in.rank == 0 ? 1 : ops[0].desc->shape[axis];
  if (ops[0].desc->element_count() == 0) return OkStatus();
  const bool descending = ins.ints[1] != 0;
  if (isa::IsFloat(in.dtype)) {
    SortLines<float>(ops, axis, k, descending);
  } else {
    SortLines<int64_t>(ops, axis, k, descending);
  }
  return OkStatus();
}

}  // namespace

Status RunSort(const driver::Instruction& ins, Operands ops) { return SortOrSelect(ins, ops); }

Status RunTopk(const driver::Instruction& ins, Operands ops) { return SortOrSelect(ins, ops); }

}  // namespace tern::sim::kernels
