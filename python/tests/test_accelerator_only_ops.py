"""What PyTorch sends to accelerators but not to the CPU.

A CPU fallback is only as good as the CPU's kernel for what PyTorch sends to
an accelerator. Two kinds of gaps exist:

1. Operators with a CUDA kernel and neither a CPU kernel nor a composite:
   the audit lists every one of them (read from the installed torch's
   native_functions.yaml, so a new torch with new ones fails here until they
   are classified) as native on tern, or as never routed to a tern tensor
   (with the public function that would reach it, run here on tern where
   that is cheap to prove).
2. Operators whose CPU kernel lacks a dtype that accelerators' callers use:
   integer histc (transformers' mixture-of-experts routers).

docs/torch.md ("What PyTorch sends to accelerators only") has the table.
"""

import copy
import os

import pytest
import torch
import torch_tern
import yaml

# op -> (status, why). "native": tern implements it on the device (checked
# against _native_ops and run below). "not routed": ATen calls it only for
# CUDA/ROCm tensors, or only a user who names it does (then it raises).
ACCELERATOR_ONLY = {
    "_thnn_fused_lstm_cell": ("native", "lstm_cell for a non-CPU tensor (nn.LSTM, nn.LSTMCell)"),
    "_thnn_fused_lstm_cell_backward_impl": ("native", "its backward"),
    "_thnn_fused_gru_cell": ("native", "gru_cell for a non-CPU tensor (nn.GRU, nn.GRUCell)"),
    "_thnn_fused_gru_cell_backward": ("native", "its backward"),
    "record_stream": ("native", "Tensor.record_stream, the caching allocator's"),
}
# nn.SyncBatchNorm's pieces (csrc/aten/sync_batch_norm.cc; run under DDP by
# test_distributed.py::test_distributed_sync_batch_norm_matches_single_process).
for _op in ("batch_norm_stats", "batch_norm_elemt", "batch_norm_elemt.out",
            "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts",
            "batch_norm_backward_reduce", "batch_norm_backward_elemt"):
    ACCELERATOR_ONLY[_op] = ("native", "nn.SyncBatchNorm under torch.distributed")
_NOT_ROUTED = {
    "cuDNN and MIOpen (ATen checks for a CUDA tensor first)": [
        "_use_cudnn_ctc_loss", "_use_cudnn_ctc_loss.Tensor", "_cudnn_ctc_loss",
        "_cudnn_ctc_loss.Tensor", "_cudnn_rnn_flatten_weight", "_cudnn_rnn", "_cudnn_rnn_backward",
        "_cudnn_init_dropout_state", "cudnn_affine_grid_generator",
        "cudnn_affine_grid_generator_backward", "cudnn_batch_norm", "cudnn_batch_norm.out",
        "cudnn_batch_norm_backward", "cudnn_convolution", "cudnn_convolution.out",
        "cudnn_convolution_transpose", "cudnn_convolution_relu", "cudnn_convolution_add_relu",
        "cudnn_grid_sampler", "cudnn_grid_sampler_backward", "miopen_batch_norm",
        "miopen_batch_norm_backward", "miopen_convolution", "miopen_convolution_transpose",
        "miopen_depthwise_convolution", "miopen_convolution_relu", "miopen_convolution_add_relu",
        "miopen_rnn", "miopen_rnn_backward", "_use_miopen_ctc_loss", "_use_miopen_ctc_loss.Tensor",
        "miopen_ctc_loss", "miopen_ctc_loss.Tensor", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward", "_cudnn_attention_forward",
        "_cudnn_attention_backward"],
    "CUDA's attention kernels (scaled_dot_product_attention picks them for CUDA tensors only)": [
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention.quantized",
        "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward", "_flash_attention_forward",
        "_flash_attention_forward_no_dropout_inplace", "_flash_attention_forward.quantized",
        "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward",
        "_triton_scaled_dot_attention", "_fill_mem_eff_dropout_mask_",
        "_triton_multi_head_attention"],
    "CUDA's own choices inside composites (dropout, convolution, rms_norm on CUDA)": [
        "_fused_dropout", "_masked_scale", "_conv_depthwise2d.out", "_conv_depthwise2d",
        "conv_depthwise3d", "_fused_rms_norm_backward"],
    "called only by name (out_dtype products, int4 and fp8 matmuls, 2:4 sparsity, Philox keys)": [
        "baddbmm.dtype", "baddbmm.dtype_out", "bmm.dtype", "bmm.dtype_out", "mm.dtype",
        "mm.dtype_out", "addmm.dtype", "addmm.dtype_out", "_mixed_dtypes_linear",
        "_convert_weight_to_int4pack", "_weight_int4pack_mm", "_scaled_grouped_mm",
        "_scaled_grouped_mm_v2", "_cslt_compress", "_cslt_sparse_mm", "_cslt_sparse_mm_search",
        "_sparse_semi_structured_tile", "_sparse_semi_structured_apply",
        "_sparse_semi_structured_apply_dense", "_sparse_semi_structured_linear",
        "_sparse_semi_structured_mm", "_sparse_semi_structured_addmm",
        "_to_sparse_semi_structured", "_philox_key_split", "_philox_key_fold_in",
        "_philox_normal_", "_philox_uniform_"],
}
for _why, _ops in _NOT_ROUTED.items():
    for _op in _ops:
        ACCELERATOR_ONLY[_op] = ("not routed", _why)


def accelerator_only_ops() -> set[str]:
    """Ops whose dispatch table in the installed torch has CUDA but neither CPU
    nor a composite kernel."""
    import torchgen

    path = os.path.join(os.path.dirname(torchgen.__file__),
                        "packaged", "ATen", "native", "native_functions.yaml")
    with open(path, encoding="utf-8") as f:
        functions = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    found = set()
    for fn in functions:
        keys = {k.strip() for key in (fn.get("dispatch") or {}) for k in key.split(",")}
        if "CUDA" in keys and "CPU" not in keys and not any(k.startswith("Composite") for k in keys):
            found.add(fn["func"].split("(")[0])
    return found


def test_the_audit_lists_what_torch_sends_to_accelerators_only():
    listed, found = set(ACCELERATOR_ONLY), accelerator_only_ops()
    assert found - listed == set(), f"classify these (native or not routed): {sorted(found - listed)}"
    assert listed - found == set(), f"no longer accelerator-only in this torch: {sorted(listed - found)}"
    native = {name for _, name in torch_tern._C._native_ops()}
    for op, (status, _) in ACCELERATOR_ONLY.items():
        assert (op in native) == (status == "native"), op


def run_both(make, x, state=None):
    torch.manual_seed(0)
    cpu = make()
    tern = copy.deepcopy(cpu).to("tern")
    args_cpu = (x,) if state is None else (x, state)
    args_tern = tuple(a.to("tern") if isinstance(a, torch.Tensor) else
                      tuple(t.to("tern") for t in a) for a in args_cpu)
    return cpu, tern, cpu(*args_cpu), tern(*args_tern)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_training_matches_cpu(kind, fallback_log):
    """nn.LSTM / nn.GRU (2 layers, batch first) trained 5 SGD steps on tern and
    on the CPU: losses and parameters agree, and nothing falls back."""
    torch.manual_seed(0)
    cls = getattr(torch.nn, kind)
    cpu = cls(6, 12, num_layers=2, batch_first=True)
    tern = copy.deepcopy(cpu).to("tern")
    head_cpu = torch.nn.Linear(12, 3)
    head_tern = copy.deepcopy(head_cpu).to("tern")
    params_cpu = list(cpu.parameters()) + list(head_cpu.parameters())
    params_tern = list(tern.parameters()) + list(head_tern.parameters())
    opt_cpu, opt_tern = torch.optim.SGD(params_cpu, lr=0.1), torch.optim.SGD(params_tern, lr=0.1)
    for step in range(5):
        x, y = torch.randn(4, 7, 6), torch.randn(4, 3)
        losses = []
        for model, head, opt, dev in ((cpu, head_cpu, opt_cpu, "cpu"),
                                      (tern, head_tern, opt_tern, "tern")):
            opt.zero_grad()
            out, _ = model(x.to(dev))
            loss = (head(out[:, -1]) - y.to(dev)).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-5 * max(1.0, abs(losses[0])), (step, losses)
    for p, q in zip(params_cpu, params_tern):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-5)
    assert fallback_log.get_fallback_ops() == {}


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_recurrent_cells_match_cpu(kind, fallback_log):
    torch.manual_seed(0)
    cls = getattr(torch.nn, kind)
    x = torch.randn(5, 6, requires_grad=True)
    h = torch.randn(5, 10)
    state = (h, torch.randn(5, 10)) if kind == "LSTMCell" else h
    cpu = cls(6, 10)
    tern = copy.deepcopy(cpu).to("tern")
    x_t = x.detach().to("tern").requires_grad_()
    state_t = tuple(s.to("tern") for s in state) if kind == "LSTMCell" else state.to("tern")
    out_cpu, out_tern = cpu(x, state), tern(x_t, state_t)
    first_cpu = out_cpu[0] if isinstance(out_cpu, tuple) else out_cpu
    first_tern = out_tern[0] if isinstance(out_tern, tuple) else out_tern
    torch.testing.assert_close(first_tern.cpu(), first_cpu.detach(), rtol=1e-5, atol=1e-6)
    if kind == "LSTMCell":  # the cell state's gradient too: grad_cy alone
        (first_cpu.sum() + out_cpu[1].square().sum()).backward()
        (first_tern.sum() + out_tern[1].square().sum()).backward()
        torch.testing.assert_close(out_tern[1].cpu(), out_cpu[1].detach(), rtol=1e-5, atol=1e-6)
    else:
        first_cpu.sum().backward()
        first_tern.sum().backward()
    torch.testing.assert_close(x_t.grad.cpu(), x.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(cpu.parameters(), tern.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5)
    assert fallback_log.get_fallback_ops() == {}


def reference_histc(values: list[int], bins: int, lo: int, hi: int) -> list[int]:
    """CUDA's integer histc: 64-bit integer bounds and bins, the data's range
    for min == max == 0, a range widened by one each way when empty."""
    if lo == hi and values:
        lo, hi = min(values), max(values)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            counts[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return counts


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
@pytest.mark.parametrize("bins,lo,hi", [(8, 0, 7), (5, 0, 0), (3, -4, 10), (64, 2, 3), (1, 0, 0)])
def test_integer_histc_is_cudas(dtype, bins, lo, hi, fallback_log):
    high = 100 if dtype == torch.uint8 else 30
    low = 0 if dtype == torch.uint8 else -10
    x = torch.randint(low, high, (1000,), dtype=dtype)
    got = torch.histc(x.to("tern"), bins=bins, min=lo, max=hi)
    assert got.dtype == dtype and got.device.type == "tern"
    # The counts are in the input's dtype, as CUDA's (uint8 counts wrap at 256).
    want = torch.tensor(reference_histc(x.tolist(), bins, lo, hi)).to(dtype)
    assert got.cpu().tolist() == want.tolist()
    out = torch.empty(0, dtype=dtype, device="tern")
    torch.histc(x.to("tern"), bins=bins, min=lo, max=hi, out=out)
    assert out.cpu().tolist() == got.cpu().tolist()
    assert fallback_log.get_fallback_ops() == {}


def test_integer_histc_edge_cases():
    empty = torch.empty(0, dtype=torch.int64, device="tern")
    assert torch.histc(empty, bins=4).cpu().tolist() == [0, 0, 0, 0]
    same = torch.full((5,), 3, dtype=torch.int32, device="tern")
    assert torch.histc(same, bins=2).cpu().tolist() == reference_histc([3] * 5, 2, 0, 0)
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(same, bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(same, bins=3, min=5, max=1)
    # Float histc keeps the CPU's kernel: same result as the CPU.
    f = torch.randn(100)
    assert torch.equal(torch.histc(f.to("tern"), bins=7).cpu(), torch.histc(f, bins=7))


def test_moe_router_counts_experts(fallback_log):
    """What transformers' routers do: top-k experts per token, counted with histc."""
    torch.manual_seed(0)
    logits = torch.randn(64, 8)
    experts = logits.topk(2, dim=-1).indices.flatten()
    got = torch.histc(experts.to("tern"), bins=8, min=0, max=7)
    assert got.cpu().tolist() == torch.bincount(experts, minlength=8).tolist()


@pytest.mark.parametrize("case", ["dropout", "ctc_loss", "affine_grid_sample", "depthwise_conv"])
def test_composites_that_route_to_cuda_kernels_run_on_tern(case):
    """The public functions behind the 'not routed' rows run on tern: ATen
    takes another path for a tern tensor (native, or a CPU fallback that has a
    kernel)."""
    torch.manual_seed(0)
    if case == "dropout":
        y = torch.nn.functional.dropout(torch.ones(1000, device="tern"), p=0.5, training=True)
        kept = (y.cpu() != 0).float().mean().item()
        assert 0.4 < kept < 0.6 and set(torch.unique(y.cpu()).tolist()) <= {0.0, 2.0}
    elif case == "ctc_loss":
        log_probs = torch.randn(12, 2, 5).log_softmax(-1)
        targets = torch.randint(1, 5, (2, 4))
        args = (targets, torch.tensor([12, 10]), torch.tensor([4, 3]))
        ref = torch.nn.functional.ctc_loss(log_probs, *args)
        got = torch.nn.functional.ctc_loss(log_probs.to("tern"), *(a.to("tern") for a in args))
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    elif case == "affine_grid_sample":
        theta = torch.randn(2, 2, 3)
        image = torch.randn(2, 3, 8, 8)
        grid = torch.nn.functional.affine_grid(theta, [2, 3, 8, 8], align_corners=False)
        ref = torch.nn.functional.grid_sample(image, grid, align_corners=False)
        grid_t = torch.nn.functional.affine_grid(theta.to("tern"), [2, 3, 8, 8],
                                                 align_corners=False)
        got = torch.nn.functional.grid_sample(image.to("tern"), grid_t, align_corners=False)
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-5)
    else:
        conv = torch.nn.Conv2d(96, 96, 3, groups=96, padding=1)
        x = torch.randn(1, 96, 10, 10)
        got = copy.deepcopy(conv).to("tern")(x.to("tern"))
        torch.testing.assert_close(got.cpu(), conv(x), rtol=1e-4, atol=1e-5)
