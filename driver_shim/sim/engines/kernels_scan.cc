// The SCAN kernel: inclusive prefix sums, products, maxima and minima along
// one axis. Each line is loaded whole, scanned in order and stored, so an
// output may be its own input; threads split the lines, never a line, so a
// result does not depend on the thread count. Accumulators follow PyTorch's
// CPU kernels: f32 sums and products in f64, bf16/f16 in f32 (each output
// rounded from the running value), integers in i64 with wrap-around.
#include <cmath>
#include <vector>

#include "driver_shim/sim/engines/kernels_internal.h"

namespace tern::sim::kernels {
namespace {

// Running max (or min) that keeps the first NaN, as torch.cummax does.
template <typename T, bool kMax>
TERN_INLINE T Extreme(T running, T x) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(running)) return running;
    if (std::isnan(x)) return x;
  }
  return (kMax ? x > running : x < running) ? x : running;
}

// Scans v[0, n) in place; `Acc` accumulates sums and products.
template <typename Acc, typename T>
void ScanLine(int64_t fn, T* v, int64_t n) {
  switch (fn) {
    case TERN_SCAN_SUM: {
      Acc acc = 0;
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_integral_v<T>) {
          acc = static_cast<Acc>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v[i]));
        } else {
          acc += v[i];
        }
        v[i] = static_cast<T>(acc);
      }
      return;
    }
    case TERN_SCAN_PROD: {
      Acc acc = 1;
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_integral_v<T>) {
          acc = static_cast<Acc>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v[i]));
        } else {
          acc *= v[i];
        }
        v[i] = static_cast<T>(acc);
      }
      return;
    }
    case TERN_SCAN_MAX:
      for (int64_t i = 1; i < n; ++i) v[i] = Extreme<T, true>(v[i - 1], v[i]);
      return;
    default:  // MIN
      for (int64_t i = 1; i < n; ++i) v[i] = Extreme<T, false>(v[i - 1], v[i]);
      return;
  }
}

}  // namespace

Status RunScan(const driver::Instruction& ins, Operands ops) {
  // [out, in] ints [fn, axis]
  const isa::OperandDesc& out = *ops[0].desc;
  const isa::OperandDesc& in = *ops[1].desc;
  const int64_t fn = ins.ints[0];
  const uint32_t axis =
      in.rank == 0 ? 0
                   : static_cast<uint32_t>(ins.ints[1] < 0 ? ins.ints[1] + in.rank : ins.ints[1]);
  if (in.element_count() == 0) return OkStatus();
  const int64_t length = in.rank == 0 ? 1 : in.shape[axis];
  const int64_t out_stride = in.rank == 0 ? 0 : out.strides[axis];
  const int64_t in_stride = in.rank == 0 ? 0 : in.strides[axis];
  const Layout lines =
      AxisLines(in.rank, in.shape.data(), axis, {out.strides.data(), in.strides.data()});
  const bool floating = isa::IsFloat(out.dtype);
  const bool wide = out.dtype == TERN_DTYPE_F32;  // accumulates in f64
  ParallelFor(lines.count, std::max<int64_t>(1, kParallelGrain / length),
              [&](int64_t begin, int64_t end) {
                std::vector<float> f(floating ? length : 0);
                std::vector<int64_t> i64(floating ? 0 : length);
                ForEachLine(lines, begin, end, [&](const int64_t* off) {
                  if (floating) {
                    LoadF32(in.dtype, At(ops[1], off[1]), in_stride, length, f.data());
                    if (wide) {
                      ScanLine<double>(fn, f.data(), length);
                    } else {
                      ScanLine<float>(fn, f.data(), length);
                    }
                    StoreF32(out.dtype, At(ops[0], off[0]), out_stride, length, f.data());
                  } else {
                    LoadI64(in.dtype, At(ops[1], off[1]), in_stride, length, i64.data());
                    ScanLine<int64_t>(fn, i64.data(), length);
                    StoreI64(out.dtype, At(ops[0], off[0]), out_stride, length, i64.data());
                  }
                });
              });
  return OkStatus();
}

}  // namespace tern::sim::kernels
