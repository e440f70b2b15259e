#include "driver_shim/sim/engines/panel_weight.h"

#include <algorithm>
#include <cstring>

#include "driver_shim/sim/engines/kernels_internal.h"

namespace tern::sim::kernels {
namespace {

using F32x16 = float __attribute__((vector_size(64)));
static_assert(PanelWeight::kColumns == 4 * 16, "a panel row is four vectors of 16 floats");

// The kColumns sums of x [k] times one panel [k, kColumns], in k order, in
// four vector registers (named, not an array: GCC kept an array of them in
// memory and ran at 70% of the bandwidth).
TERN_VECTOR_CLONES
void PanelSums(const float* x, const float* panel, int64_t k, float* sums) {
  F32x16 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  for (int64_t i = 0; i < k; ++i, panel += PanelWeight::kColumns) {
    F32x16 w0, w1, w2, w3;
    std::memcpy(&w0, panel, sizeof w0);
    std::memcpy(&w1, panel + 16, sizeof w1);
    std::memcpy(&w2, panel + 32, sizeof w2);
    std::memcpy(&w3, panel + 48, sizeof w3);
    const float xi = x[i];
    s0 += xi * w0;
    s1 += xi * w1;
    s2 += xi * w2;
    s3 += xi * w3;
  }
  std::memcpy(sums, &s0, sizeof s0);
  std::memcpy(sums + 16, &s1, sizeof s1);
  std::memcpy(sums + 32, &s2, sizeof s2);
  std::memcpy(sums + 48, &s3, sizeof s3);
}

}  // namespace

std::unique_ptr<const PanelWeight> PanelWeight::Pack(const float* b, int64_t k, int64_t n,
                                                     int64_t row_stride, int64_t column_stride) {
  if (k <= 0 || n <= 0) return nullptr;
  const int64_t panels = (n + kColumns - 1) / kColumns;
  const size_t bytes = static_cast<size_t>(panels * k * kColumns) * sizeof(float);
  // aligned_alloc wants a multiple of the alignment: a panel row is 256 bytes.
  std::unique_ptr<float[], Free> data(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (!data) return nullptr;
  std::memset(data.get(), 0, bytes);
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = data.get() + p * k * kColumns;
    const int64_t first = p * kColumns, columns = std::min(kColumns, n - first);
    if (row_stride == 1) {
      // Each column of B is contiguous (an [N, K] weight seen transposed):
      // read along it.
      for (int64_t c = 0; c < columns; ++c) {
        const float* column = b + (first + c) * column_stride;
        for (int64_t i = 0; i < k; ++i) panel[i * kColumns + c] = column[i];
      }
    } else {
      for (int64_t i = 0; i < k; ++i) {
        const float* row = b + i * row_stride + first * column_stride;
        for (int64_t c = 0; c < columns; ++c) panel[i * kColumns + c] = row[c * column_stride];
      }
    }
  }
  return std::unique_ptr<const PanelWeight>(new PanelWeight(k, n, std::move(data)));
}

void PanelWeight::Multiply(const float* a, int64_t rows, int64_t a_row_stride, float alpha,
                           const float* bias, int64_t bias_m_stride, int64_t bias_n_stride,
                           float* out, int64_t out_row_stride, int64_t out_column_stride) const {
  // ~16K multiply-adds per task, as the dot products (SmallMatmulF32) take.
  const int64_t grain = std::max<int64_t>(1, 16384 / (k_ * kColumns * std::max<int64_t>(rows, 1)));
  ParallelFor(
      panels(), grain,
      [&](int64_t begin, int64_t end) {
        float sums[kColumns];
        for (int64_t p = begin; p < end; ++p) {
          const float* panel = data_.get() + p * k_ * kColumns;
          const int64_t first = p * kColumns, columns = std::min(kColumns, n_ - first);
          for (int64_t m = 0; m < rows; ++m) {
            PanelSums(a + m * a_row_stride, panel, k_, sums);
            float* o = out + m * out_row_stride + first * out_column_stride;
            // (No "+ 0" without a bias: it would turn -0 into +0.)
            if (bias != nullptr) {
              const float* bm = bias + m * bias_m_stride + first * bias_n_stride;
              for (int64_t c = 0; c < columns; ++c) {
                o[c * out_column_stride] = alpha * sums[c] + bm[c * bias_n_stride];
              }
            } else {
              for (int64_t c = 0; c < columns; ++c) o[c * out_column_stride] = alpha * sums[c];
            }
          }
        }
      },
      KernelPool::Wake::kPollersElseSleepingHelpers);
}

}  // namespace tern::sim::kernels
