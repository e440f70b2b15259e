"""Eager-mode overhead of torch_tern beside the CPU, in one run.

    .venv/bin/python -P python/bench_eager.py [--iters N] [--rounds N] [--json FILE]

1. `a + b` on two 16-element float32 tensors: the cost of one small op
   (dispatch, kernel-cache lookup, tern_queue_execute) against the CPU's own
   add. Reported as time per op while queueing (tern runs asynchronously)
   and per op including a final synchronize.
2. One training step of a 2-layer MLP (64x256 -> 256 -> 1, MSE, SGD with
   momentum): zero_grad, forward, backward, optimizer step, and reading the
   loss (.item(), a synchronization) on tern beside the CPU.

The CPU and tern loops alternate round by round (--rounds), and each figure
is printed beside the ratio of the rounds' pairs, because this kind of
machine's speed moves from one second to the next.

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
from torch_tern.collect_env import cpu_model  # noqa: E402

# The benchmarks' shared helpers (also under python -P).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks"))
from settle import settle  # noqa: E402


def sync(device):
    if device == "tern":
        torch.tern.synchronize()


def small_add_loop(device, iters):
    """A function that times `iters` adds queued, and the same with the
    final synchronize: (per op queueing, per op with sync)."""
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    for _ in range(200):  # warm up (and build the tern program once)
        a + b
    sync(device)

    def run():
        start = time.perf_counter()
        for _ in range(iters):
            a + b
        mid = time.perf_counter()
        sync(device)
        end = time.perf_counter()
        return (mid - start) / iters, (end - start) / iters

    return run


def mlp_step_loop(device, iters):
    """A function that times `iters` MLP training steps: per step."""
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

    def run():
        start = time.perf_counter()
        for _ in range(iters):
            one_step()
        return (time.perf_counter() - start) / iters

    return run


def interleaved(cpu_run, tern_run, rounds):
    """Runs the two loops alternately (the first of each pair alternating
    too), `rounds` pairs: the lists of their figures, round by round. On a
    machine whose speed moves from one second to the next, the ratio of a
    round's two figures is what holds. Each loop starts once the process's
    other threads have gone quiet (settle): PyTorch's OpenMP workers spin
    for milliseconds after the CPU loop's last op, and a tern loop timed
    while they spin shares the CPUs with them, which a program running only
    tern never does."""
    cpu, tern = [], []
    for r in range(rounds):
        if r % 2 == 0:
            settle()
            cpu.append(cpu_run())
            settle()
            tern.append(tern_run())
        else:
            settle()
            tern.append(tern_run())
            settle()
            cpu.append(cpu_run())
    return cpu, tern


def summary(ratios):
    ratios = sorted(ratios)
    return statistics.median(ratios), ratios[0], ratios[-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000, help="small adds per repeat")
    parser.add_argument("--steps", type=int, default=50, help="MLP steps per repeat")
    parser.add_argument("--rounds", type=int, default=9,
                        help="alternated CPU and tern repeats of each loop")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    cpu_add, tern_add = interleaved(small_add_loop("cpu", args.iters),
                                    small_add_loop("tern", args.iters), args.rounds)
    torch_tern.clear_op_tracking()
    cpu_mlp, tern_mlp = interleaved(mlp_step_loop("cpu", args.steps),
                                    mlp_step_loop("tern", args.steps), args.rounds)
    fallbacks = torch_tern.get_fallback_ops()
    info = torch_tern.kernel_cache_info()

    cpu_t = statistics.median(t for _, t in cpu_add)
    tern_q = statistics.median(q for q, _ in tern_add)
    tern_t = statistics.median(t for _, t in tern_add)
    add_q = summary([tq / ct for (_, ct), (tq, _) in zip(cpu_add, tern_add)])
    add_t = summary([tt / ct for (_, ct), (_, tt) in zip(cpu_add, tern_add)])
    cpu_step = statistics.median(cpu_mlp)
    tern_step = statistics.median(tern_mlp)
    mlp = summary([t / c for c, t in zip(cpu_mlp, tern_mlp)])

    us = 1e6
    print(f"torch {torch.__version__}, torch_tern {torch_tern.__version__}, "
          f"{torch.get_num_threads()} CPU threads, CPU: {cpu_model()}")
    print(f"{args.rounds} rounds, the CPU and tern loops alternated; times are medians, "
          "ratios the median (min-max) of each round's tern / cpu")
    print("add of two 16-element float32 tensors, per op:")
    print(f"  cpu                 {cpu_t * us:8.2f} us")
    print(f"  tern (queueing)     {tern_q * us:8.2f} us   {add_q[0]:5.2f}x cpu "
          f"({add_q[1]:.2f}-{add_q[2]:.2f})")
    print(f"  tern (with sync)    {tern_t * us:8.2f} us   {add_t[0]:5.2f}x cpu "
          f"({add_t[1]:.2f}-{add_t[2]:.2f})")
    print("MLP training step (64x256 -> 256 -> 1, SGD momentum, loss.item()):")
    print(f"  cpu                 {cpu_step * 1e3:8.3f} ms")
    print(f"  tern                {tern_step * 1e3:8.3f} ms   {mlp[0]:5.2f}x cpu "
          f"({mlp[1]:.2f}-{mlp[2]:.2f})")
    print(f"  tern fallbacks during the steps: {fallbacks or 'none'}")
    print(f"  kernel cache: {info['entries']} executables, {info['hits']} hits, "
          f"{info['misses']} builds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "add_cpu_us": cpu_t * us,
                       "add_tern_queue_us": tern_q * us, "add_tern_sync_us": tern_t * us,
                       "add_queue_ratio": add_q[0], "add_sync_ratio": add_t[0],
                       "mlp_cpu_ms": cpu_step * 1e3, "mlp_tern_ms": tern_step * 1e3,
                       "mlp_ratio": mlp[0], "fallbacks": fallbacks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
