// The fused RNN cells PyTorch sends to accelerators. For a tensor that is
// not on the CPU, ATen's lstm_cell and gru_cell (and so nn.LSTM, nn.GRU and
// their cells) compute the two gate products and hand the rest to
// _thnn_fused_lstm_cell / _thnn_fused_gru_cell, and autograd calls their
// backwards; PyTorch has CUDA kernels for the four and no CPU kernel, so the
// CPU fallback cannot run them. Here each is the cell's formula in tern
// operators (sigmoid, tanh, products, cat): every piece runs on the device.
//
// The workspace is what the backward reads, laid out as CUDA's kernels lay it
// out, so a workspace is interchangeable between the two:
//   LSTM: [batch, 4 * hidden] = the activated gates i, f, g, o;
//   GRU:  [batch, 5 * hidden] = r, z, n, hx and the hidden n-gate (with bias).
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

#include "aten/native.h"
#include "aten/register.h"

namespace torch_tern::native {
namespace {

bool Has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The checks CUDA's kernels make, with what was wrong in the message.
void CheckCell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
               const at::Tensor& state, const std::optional<at::Tensor>& input_bias,
               const std::optional<at::Tensor>& hidden_bias, int64_t gates) {
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.sizes() == hidden_gates.sizes(), op,
              ": input_gates and hidden_gates must both be [batch, ", gates, " * hidden]; got ",
              input_gates.sizes(), " and ", hidden_gates.sizes());
  TORCH_CHECK(state.dim() == 2 && state.size(0) == input_gates.size(0) &&
                  state.size(1) * gates == input_gates.size(1),
              op, ": the state must be [batch, hidden] = [", input_gates.size(0), ", ",
              input_gates.size(1) / gates, "]; got ", state.sizes());
  TORCH_CHECK(Has(input_bias) == Has(hidden_bias), op,
              ": give both biases or neither (got only one)");
  for (const auto* bias : {&input_bias, &hidden_bias}) {
    if (!Has(*bias)) continue;
    TORCH_CHECK((*bias)->dim() == 1 && (*bias)->size(0) == input_gates.size(1), op,
                ": a bias must be [", input_gates.size(1), "]; got ", (*bias)->sizes());
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FusedLstmCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  CheckCell("_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  at::Tensor gates = input_gates + hidden_gates;
  if (Has(input_bias)) gates = gates + *input_bias + *hidden_bias;
  const std::vector<at::Tensor> chunk = gates.chunk(4, 1);
  const at::Tensor in = chunk[0].sigmoid(), forget = chunk[1].sigmoid(), cell = chunk[2].tanh(),
                   out = chunk[3].sigmoid();
  at::Tensor cy = forget * cx + in * cell;
  at::Tensor hy = out * cy.tanh();
  return {hy, cy, at::cat({in, forget, cell, out}, 1)};
}
TERN_ATEN_IMPL("_thnn_fused_lstm_cell", FusedLstmCell);

std::tuple<at::Tensor, at::Tensor, at::Tensor> FusedLstmCellBackward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  if (!Has(grad_hy) && !Has(grad_cy)) return {};  // as CUDA's: no gradient flows
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(1) == 4 * cx.size(1),
              "_thnn_fused_lstm_cell_backward_impl: the workspace must be [batch, 4 * hidden] "
              "(from _thnn_fused_lstm_cell); got ",
              workspace.sizes(), " for a cell state of ", cx.sizes());
  const std::vector<at::Tensor> gate = workspace.chunk(4, 1);
  const at::Tensor &in = gate[0], &forget = gate[1], &cell = gate[2], &out = gate[3];
  const at::Tensor tanh_cy = cy.tanh();
  // The gradient reaching the cell state: through hy = out * tanh(cy), and
  // directly.
  at::Tensor grad_c;
  if (Has(grad_hy)) grad_c = *grad_hy * out * (1 - tanh_cy * tanh_cy);
  if (Has(grad_cy)) grad_c = grad_c.defined() ? grad_c + *grad_cy : *grad_cy;
  const at::Tensor grad_out =
      Has(grad_hy) ? *grad_hy * tanh_cy * out * (1 - out) : at::zeros_like(out);
  at::Tensor grad_gates =
      at::cat({grad_c * cell * in * (1 - in), grad_c * cx * forget * (1 - forget),
               grad_c * in * (1 - cell * cell), grad_out},
              1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_c * forget, grad_bias};
}
TERN_ATEN_IMPL("_thnn_fused_lstm_cell_backward_impl", FusedLstmCellBackward);

std::tuple<at::Tensor, at::Tensor> FusedGruCell(const at::Tensor& input_gates,
                                                const at::Tensor& hidden_gates,
                                                const at::Tensor& hx,
                                                const std::optional<at::Tensor>& input_bias,
                                                const std::optional<at::Tensor>& hidden_bias) {
  CheckCell("_thnn_fused_gru_cell", input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  const at::Tensor in_gates = Has(input_bias) ? input_gates + *input_bias : input_gates;
  const at::Tensor h_gates = Has(hidden_bias) ? hidden_gates + *hidden_bias : hidden_gates;
  const std::vector<at::Tensor> i = in_gates.chunk(3, 1), h = h_gates.chunk(3, 1);
  const at::Tensor reset = (i[0] + h[0]).sigmoid();
  const at::Tensor update = (i[1] + h[1]).sigmoid();
  const at::Tensor candidate = (i[2] + reset * h[2]).tanh();
  at::Tensor hy = candidate + update * (hx - candidate);
  return {hy, at::cat({reset, update, candidate, hx, h[2]}, 1)};
}
TERN_ATEN_IMPL("_thnn_fused_gru_cell", FusedGruCell);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> FusedGruCellBackward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(1) == 5 * grad_hy.size(-1),
              "_thnn_fused_gru_cell_backward: the workspace must be [batch, 5 * hidden] (from "
              "_thnn_fused_gru_cell); got ",
              workspace.sizes(), " for a gradient of ", grad_hy.sizes());
  const std::vector<at::Tensor> w = workspace.chunk(5, 1);
  const at::Tensor &reset = w[0], &update = w[1], &candidate = w[2], &hx = w[3], &h_cand = w[4];
  const at::Tensor grad_update = grad_hy * (hx - candidate) * update * (1 - update);
  const at::Tensor grad_cand = grad_hy * (1 - update) * (1 - candidate * candidate);
  const at::Tensor grad_reset = grad_cand * h_cand * reset * (1 - reset);
  at::Tensor grad_input_gates = at::cat({grad_reset, grad_update, grad_cand}, 1);
  at::Tensor grad_hidden_gates = at::cat({grad_reset, grad_update, grad_cand * reset}, 1);
  at::Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = grad_input_gates.sum(0);
    grad_hidden_bias = grad_hidden_gates.sum(0);
  }
  return {grad_input_gates, grad_hidden_gates, grad_hy * update, grad_input_bias, grad_hidden_bias};
}
TERN_ATEN_IMPL("_thnn_fused_gru_cell_backward", FusedGruCellBackward);

}  // namespace
}  // namespace torch_tern::native
