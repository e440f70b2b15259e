"""Eager-mode overhead of torch_tern beside the CPU, in one run.

    .venv/bin/python -P python/bench_eager.py [--iters N] [--json FILE]

1. `a + b` on two 16-element float32 tensors: the cost of one small op
   (dispatch, kernel-cache lookup, tern_queue_execute) against the CPU's own
   add. Reported as time per op while queueing (tern runs asynchronously)
   and per op including a final synchronize.
2. One training step of a 2-layer MLP (64x256 -> 256 -> 1, MSE, SGD with
   momentum): zero_grad, forward, backward, optimizer step, and reading the
   loss (.item(), a synchronization) on tern beside the CPU.

On the simulated device both "devices" share the host's cores: the figures
measure the plugin's and runtime's overhead, not accelerator speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if __name__ == "__main__":
    os.environ.setdefault("TERN_SIM_NODE", f"bench-{os.getpid()}")
    os.environ.setdefault("TERN_SIM_TOPOLOGY", "1x1x2G")
    if os.environ["TERN_SIM_NODE"] == f"bench-{os.getpid()}":
        # Our own node: remove its shared-memory files when the process ends.
        import atexit
        import glob

        atexit.register(lambda: [os.unlink(f) for f in glob.glob(
            f"/dev/shm/tern-sim-bench-{os.getpid()}*")])

import torch  # noqa: E402
import torch_tern  # noqa: E402


def sync(device):
    if device == "tern":
        torch.tern.synchronize()


def time_small_add(device, iters, repeats=5):
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    for _ in range(200):  # warm up (and build the tern program once)
        a + b
    sync(device)
    queued, total = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            a + b
        mid = time.perf_counter()
        sync(device)
        end = time.perf_counter()
        queued.append((mid - start) / iters)
        total.append((end - start) / iters)
    return statistics.median(queued), statistics.median(total)


def time_mlp_step(device, iters, repeats=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g).to(device)
    y = torch.randn(64, 1, generator=g).to(device)

    def one_step():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(10):
        one_step()
    per_step = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            one_step()
        per_step.append((time.perf_counter() - start) / iters)
    return statistics.median(per_step)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000, help="small adds per repeat")
    parser.add_argument("--steps", type=int, default=50, help="MLP steps per repeat")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    cpu_q, cpu_t = time_small_add("cpu", args.iters)
    tern_q, tern_t = time_small_add("tern", args.iters)
    cpu_step = time_mlp_step("cpu", args.steps)
    torch_tern.clear_op_tracking()
    tern_step = time_mlp_step("tern", args.steps)
    fallbacks = torch_tern.get_fallback_ops()
    info = torch_tern.kernel_cache_info()

    us = 1e6
    print(f"torch {torch.__version__}, torch_tern {torch_tern.__version__}, "
          f"{torch.get_num_threads()} CPU threads")
    print("add of two 16-element float32 tensors, per op:")
    print(f"  cpu                 {cpu_t * us:8.2f} us")
    print(f"  tern (queueing)     {tern_q * us:8.2f} us   {tern_q / cpu_t:6.1f}x cpu")
    print(f"  tern (with sync)    {tern_t * us:8.2f} us   {tern_t / cpu_t:6.1f}x cpu")
    print("MLP training step (64x256 -> 256 -> 1, SGD momentum, loss.item()):")
    print(f"  cpu                 {cpu_step * 1e3:8.3f} ms")
    print(f"  tern                {tern_step * 1e3:8.3f} ms   {tern_step / cpu_step:6.1f}x cpu")
    print(f"  tern fallbacks during the steps: {fallbacks or 'none'}")
    print(f"  kernel cache: {info['entries']} executables, {info['hits']} hits, "
          f"{info['misses']} builds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"add_cpu_us": cpu_t * us, "add_tern_queue_us": tern_q * us,
                       "add_tern_sync_us": tern_t * us, "mlp_cpu_ms": cpu_step * 1e3,
                       "mlp_tern_ms": tern_step * 1e3, "fallbacks": fallbacks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
