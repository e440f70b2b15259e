// The batch-norm pieces that torch.nn.SyncBatchNorm is built from
// (torch/nn/modules/_functions.py): per-rank statistics, their merge across
// ranks, the elementwise normalisation and the two halves of its backward.
// ATen has them for CUDA only (no CPU kernel, so no CPU fallback either); on
// tern each is a short composition of ATen operators on tern tensors, which
// run as tern kernels.
//
// Statistics are computed in float32 (float64 for float64 input), as CUDA's
// kernels accumulate, and returned in that type; the elementwise results
// have the input's dtype and memory format. invstd is 1 / sqrt(var + eps),
// with var the biased (population) variance.
#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

bool Defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

at::ScalarType StatType(const at::Tensor& input) {
  return input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Every dim but the channels (dim 1).
std::vector<int64_t> ReduceDims(const at::Tensor& input) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d != 1) dims.push_back(d);
  }
  return dims;
}

// [1, C, 1, ...]: a per-channel vector broadcast against the input.
at::Tensor PerChannel(const at::Tensor& v, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return v.reshape(shape);
}

void CheckInput(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input of at least 2 dims (N, C, ...), got ",
              input.dim(), " dims");
}

// A result with `like`'s sizes, dtype and memory format, holding `value`.
at::Tensor ShapedLike(const at::Tensor& like, const at::Tensor& value) {
  at::Tensor out = at::empty_like(like, like.suggest_memory_format());
  out.copy_(value);
  return out;
}

std::tuple<at::Tensor, at::Tensor> BatchNormStats(const at::Tensor& input, double eps) {
  CheckInput(input, "batch_norm_stats");
  const at::Tensor x = input.to(StatType(input));
  const std::vector<int64_t> dims = ReduceDims(input);
  const at::Tensor mean = x.mean(dims);
  const at::Tensor var = (x - PerChannel(mean, input)).square().mean(dims);
  // As CUDA's: a zero variance with eps 0 gives invstd 0, not infinity.
  const at::Tensor shifted = var + eps;
  const at::Tensor invstd = at::where(shifted == 0, at::zeros_like(shifted), shifted.rsqrt());
  return {mean, invstd};
}
TERN_ATEN_IMPL("batch_norm_stats", BatchNormStats);

// Merges the ranks' statistics (mean and invstd [ranks, C], counts [ranks])
// into the global ones, and updates the running statistics in place with the
// unbiased variance.
std::tuple<at::Tensor, at::Tensor> GatherStatsWithCounts(
    const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    double momentum, double eps, const at::Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(),
              "batch_norm_gather_stats_with_counts: expected mean and invstd of shape [ranks, "
              "channels], got ",
              mean.sizes(), " and ", invstd.sizes());
  TORCH_CHECK(counts.numel() == mean.size(0),
              "batch_norm_gather_stats_with_counts: ", counts.numel(), " counts for ", mean.size(0),
              " ranks' statistics");
  (void)input;  // only its dtype matters to CUDA's kernel; the statistics carry theirs
  const at::Tensor n = counts.to(mean.scalar_type()).reshape({-1, 1});
  const at::Tensor total = n.sum(0);
  const at::Tensor global_mean = (mean * n).sum(0) / total;
  const at::Tensor var = invstd.square().reciprocal() - eps;  // each rank's biased variance
  const at::Tensor global_var = (n * (var + (mean - global_mean).square())).sum(0) / total;
  const at::Tensor global_invstd = (global_var + eps).rsqrt();
  at::NoGradGuard no_grad;
  if (Defined(running_mean)) {
    running_mean->copy_(running_mean->to(mean.scalar_type()) * (1.0 - momentum) +
                        global_mean * momentum);
  }
  if (Defined(running_var)) {
    const at::Tensor unbiased = global_var * total / (total - 1);
    running_var->copy_(running_var->to(mean.scalar_type()) * (1.0 - momentum) +
                       unbiased * momentum);
  }
  return {global_mean, global_invstd};
}
TERN_ATEN_IMPL("batch_norm_gather_stats_with_counts", GatherStatsWithCounts);

// The same with one count for every rank.
std::tuple<at::Tensor, at::Tensor> GatherStats(const at::Tensor& input, const at::Tensor& mean,
                                               const at::Tensor& invstd,
                                               const std::optional<at::Tensor>& running_mean,
                                               const std::optional<at::Tensor>& running_var,
                                               double momentum, double eps, int64_t count) {
  const at::Tensor counts = at::full({mean.size(0)}, static_cast<double>(count), mean.options());
  return GatherStatsWithCounts(input, mean, invstd, running_mean, running_var, momentum, eps,
                               counts);
}
TERN_ATEN_IMPL("batch_norm_gather_stats", GatherStats);

at::Tensor Normalized(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                      const at::Tensor& invstd) {
  CheckInput(input, "batch_norm_elemt");
  const at::ScalarType stat = mean.scalar_type();
  at::Tensor y = (input.to(stat) - PerChannel(mean, input)) * PerChannel(invstd, input);
  if (Defined(weight)) y = y * PerChannel(weight->to(stat), input);
  if (Defined(bias)) y = y + PerChannel(bias->to(stat), input);
  return y;
}

at::Tensor BatchNormElemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                          const at::Tensor& invstd, double /*eps: folded into invstd*/) {
  return ShapedLike(input, Normalized(input, weight, bias, mean, invstd));
}
TERN_ATEN_IMPL("batch_norm_elemt", BatchNormElemt);

at::Tensor& BatchNormElemtOut(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                              const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                              const at::Tensor& invstd, double /*eps*/, at::Tensor& out) {
  const at::Tensor y = Normalized(input, weight, bias, mean, invstd);
  at::native::resize_output(out, input.sizes());
  out.copy_(y);
  return out;
}
TERN_ATEN_IMPL("batch_norm_elemt.out", BatchNormElemtOut);

// Per channel: sum(dy) and sum(dy * (x - mean)) (for the input's gradient,
// once summed across ranks), and the weight's and bias's gradients. Outputs
// not asked for are undefined, as CUDA's.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> BatchNormBackwardReduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
    const at::Tensor& invstd, const std::optional<at::Tensor>& weight, bool input_g, bool weight_g,
    bool bias_g) {
  CheckInput(input, "batch_norm_backward_reduce");
  TORCH_CHECK(grad_out.sizes() == input.sizes(), "batch_norm_backward_reduce: grad_out ",
              grad_out.sizes(), " and input ", input.sizes(), " differ in shape");
  const at::ScalarType stat = mean.scalar_type();
  const std::vector<int64_t> dims = ReduceDims(input);
  const at::Tensor dy = grad_out.to(stat);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu = (dy * (input.to(stat) - PerChannel(mean, input))).sum(dims);
  const at::ScalarType param = Defined(weight) ? weight->scalar_type() : stat;
  at::Tensor grad_weight, grad_bias;
  if (weight_g) grad_weight = (sum_dy_xmu * invstd).to(param);
  if (bias_g) grad_bias = sum_dy.to(param);
  return {input_g ? sum_dy : at::Tensor(), input_g ? sum_dy_xmu : at::Tensor(), grad_weight,
          grad_bias};
}
TERN_ATEN_IMPL("batch_norm_backward_reduce", BatchNormBackwardReduce);

// The input's gradient from the statistics summed across ranks; `count` holds
// every rank's element count per channel.
at::Tensor BatchNormBackwardElemt(const at::Tensor& grad_out, const at::Tensor& input,
                                  const at::Tensor& mean, const at::Tensor& invstd,
                                  const std::optional<at::Tensor>& weight, const at::Tensor& sum_dy,
                                  const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  CheckInput(input, "batch_norm_backward_elemt");
  const at::ScalarType stat = mean.scalar_type();
  const at::Tensor total = count.to(stat).sum();
  const at::Tensor mean_dy = sum_dy / total;
  const at::Tensor mean_dy_xmu = sum_dy_xmu / total;
  at::Tensor scale = invstd;
  if (Defined(weight)) scale = scale * weight->to(stat);
  const at::Tensor x_mu = input.to(stat) - PerChannel(mean, input);
  const at::Tensor grad = (grad_out.to(stat) - PerChannel(mean_dy, input) -
                           x_mu * PerChannel(invstd.square() * mean_dy_xmu, input)) *
                          PerChannel(scale, input);
  return ShapedLike(input, grad);
}
TERN_ATEN_IMPL("batch_norm_backward_elemt", BatchNormBackwardElemt);

}  // namespace
}  // namespace torch_tern::native
