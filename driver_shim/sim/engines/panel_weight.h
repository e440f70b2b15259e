// A constant weight laid out for products with few rows (a linear layer at
// batch 1-4, where the product streams the whole weight once per call and
// is bound by the bandwidth of the cache that holds it).
//
// Loading a program copies such a weight B [K, N] into panels of kColumns
// columns, each stored row after row (K x kColumns, the last panel padded
// with zeros), 64-byte aligned. A part of the product then reads one
// sequential stream and keeps its kColumns sums in vector registers. The dot
// products that run the same product on a weight as it lies (SmallMatmulF32
// in kernels_dnnl.cc) read four columns of an [N, K] weight at once and fold
// sixteen partial sums per output; on an AMD Zen 4 (one thread, a 1x512 by
// 512x1024 product whose weight comes from L3) panels ran at 96 GB/s against
// their 70, and two threads at 187 GB/s.
//
// Each output is one sum in K order (fused multiply-adds where the CPU has
// them), so its bits may differ from the other matmul paths' by rounding.
#ifndef TERN_DRIVER_SHIM_SIM_ENGINES_PANEL_WEIGHT_H_
#define TERN_DRIVER_SHIM_SIM_ENGINES_PANEL_WEIGHT_H_

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace tern::sim::kernels {

class PanelWeight {
 public:
  static constexpr int64_t kColumns = 64;
  // Products with more rows than this read each panel once per row: past
  // it, oneDNN's blocked kernels (which reuse what they load) are faster.
  static constexpr int64_t kMaxRows = 4;

  // The panels of B [k, n] (element (i, j) at b[i * row_stride + j *
  // column_stride]), or null when k or n is not positive or the memory
  // cannot be had.
  // Thread-safety: any thread; B must not change meanwhile.
  static std::unique_ptr<const PanelWeight> Pack(const float* b, int64_t k, int64_t n,
                                                 int64_t row_stride, int64_t column_stride);

  PanelWeight(const PanelWeight&) = delete;
  PanelWeight& operator=(const PanelWeight&) = delete;

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t panels() const { return (n_ + kColumns - 1) / kColumns; }
  // Bytes the panels take.
  int64_t bytes() const { return panels() * k_ * kColumns * static_cast<int64_t>(sizeof(float)); }

  // out[m, j] = alpha * sum_i a[m, i] * B[i, j] (+ bias[m * bias_m_stride +
  // j * bias_n_stride] when bias is not null), for m < rows and j < n; row m
  // of a starts at a + m * a_row_stride and is contiguous. Splits the panels
  // across the kernel pool.
  // Thread-safety: any thread, concurrently with other calls.
  void Multiply(const float* a, int64_t rows, int64_t a_row_stride, float alpha, const float* bias,
                int64_t bias_m_stride, int64_t bias_n_stride, float* out, int64_t out_row_stride,
                int64_t out_column_stride) const;

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  PanelWeight(int64_t k, int64_t n, std::unique_ptr<float[], Free> data)
      : k_(k), n_(n), data_(std::move(data)) {}

  const int64_t k_, n_;
  const std::unique_ptr<float[], Free> data_;
};

}  // namespace tern::sim::kernels

#endif  // TERN_DRIVER_SHIM_SIM_ENGINES_PANEL_WEIGHT_H_
