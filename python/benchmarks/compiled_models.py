"""Compiled models against the other ways to run them, in one process.

For each model and batch size, four contenders run in blocks of back-to-back
forwards, the blocks alternating round by round in a rotating order (each
meets the same machine state), each block after the other contenders'
threads went quiet (see rounds), and the median time per forward is printed
beside the ratios the P9 targets are stated in:

- compiled: torch_tern.compiler.export, then torch_tern.compiler.load, run on
  tern tensors (one execution per forward);
- tern eager: the model on the tern device, op by op;
- CPU eager: PyTorch on the CPU;
- inductor: torch.compile with PyTorch's own CPU backend.

Then: the compile time of a 1,000-node graph (export, and the compiler
alone) and the time to compile a graph that the compile cache already
holds.

    .venv/bin/python python/benchmarks/compiled_models.py [--quick]
"""

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn

import torch_tern.compiler as tc
from torch_tern.collect_env import cpu_model

# The benchmarks' shared helpers, beside this file (also under python -P).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from settle import settle  # noqa: E402


class Mlp(nn.Module):
    def __init__(self, d_in=512, hidden=1024, d_out=512):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Gpt2Block(nn.Module):
    """One GPT-2 block of transformers (small width), on hidden states."""

    def __init__(self, width=256, heads=4):
        super().__init__()
        import transformers

        config = transformers.GPT2Config(n_embd=width, n_head=heads, n_layer=1, n_positions=512)
        self.block = transformers.models.gpt2.modeling_gpt2.GPT2Block(config, layer_idx=0)

    def forward(self, x):
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def rounds(contenders: dict, min_rounds: int, min_seconds: float,
           block_seconds: float = 0.02) -> dict:
    """Times the contenders in blocks of back-to-back calls (about
    `block_seconds` each, at least one call), each block after the others'
    threads went quiet (settle) and two untimed calls (the wake-ups of threads
    that slept meanwhile); the blocks alternate, their order rotating from
    one round to the next. Returns every timed call per contender."""
    per_call = {}
    for name, fn in contenders.items():
        fn()  # warm-up: compilation, caches, page faults
        t0 = time.perf_counter()
        fn()
        per_call[name] = time.perf_counter() - t0
    times = {name: [] for name in contenders}
    names = list(contenders)
    start, r = time.perf_counter(), 0
    while r < min_rounds or time.perf_counter() - start < min_seconds:
        for k in range(len(names)):
            name = names[(k + r) % len(names)]
            fn = contenders[name]
            settle()
            fn()
            fn()
            for _ in range(max(1, round(block_seconds / per_call[name]))):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        r += 1
    return times


def bench_model(name, model, example, quick, tmp):
    model = model.eval()
    path = os.path.join(tmp, f"{name}.tern")
    stats = tc.export(model, (example,), path)
    compiled = tc.load(path)
    x_tern = example.to("tern")
    model_tern = copy.deepcopy(model).to("tern")
    inductor = torch.compile(copy.deepcopy(model))

    def run_compiled():
        compiled(x_tern)
        torch.tern.synchronize()

    def run_tern_eager():
        with torch.no_grad():
            model_tern(x_tern)
        torch.tern.synchronize()

    def run_cpu():
        with torch.no_grad():
            model(example)

    def run_inductor():
        with torch.no_grad():
            inductor(example)

    times = rounds({"compiled": run_compiled, "tern eager": run_tern_eager, "CPU eager": run_cpu,
                    "inductor": run_inductor}, 5 if quick else 20, 0.5 if quick else 3.0)
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(f"{name}: compiled {med['compiled']:.0f} us, tern eager {med['tern eager']:.0f} us, "
          f"CPU eager {med['CPU eager']:.0f} us, inductor {med['inductor']:.0f} us "
          f"(medians, n={len(times['compiled'])}); speedup of compiled: "
          f"{med['tern eager'] / med['compiled']:.2f}x tern eager (target >= 2), "
          f"{med['CPU eager'] / med['compiled']:.2f}x CPU eager (target >= 1.5), "
          f"{med['inductor'] / med['compiled']:.2f}x inductor (target >= 1); "
          f"{stats['compute_instructions']} compute instructions ({stats['compute_instructions_unfused']} "
          f"unfused: {1 - stats['compute_instructions'] / stats['compute_instructions_unfused']:.0%} fewer; "
          f"{stats['epilogues']} epilogues, {stats['fused_groups']} programs) and "
          f"{stats['instructions'] - stats['compute_instructions']} sync for {stats['nodes']} nodes, "
          f"scratch peak "
          f"{stats['scratch_peak']} B (naive {stats['scratch_naive_sum']}, max-live "
          f"{stats['scratch_max_live']})")


class SmallResNet(nn.Module):
    """Conv, batch norm (eval), ReLU, max pool, one residual block, average
    pool and a linear layer, on 3x32x32 images."""

    def __init__(self, channels=32, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.block = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1),
                                   nn.BatchNorm2d(channels), nn.ReLU(),
                                   nn.Conv2d(channels, channels, 3, padding=1),
                                   nn.BatchNorm2d(channels))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        return self.head(x.mean(dim=(2, 3)))


class Chain(nn.Module):
    """About 1,000 nodes: 167 times (x * w + b).relu() - x, six nodes each
    (two selects, mul, add, relu, sub). It had 250 links (1,500 nodes)
    until 2026-12-07, half again the graph the target names."""

    def __init__(self, length=167, width=64):
        super().__init__()
        self.w = nn.Parameter(torch.randn(length, width))
        self.b = nn.Parameter(torch.randn(length, width))
        self.length = length

    def forward(self, x):
        for i in range(self.length):
            x = torch.relu(x * self.w[i] + self.b[i]) - x
        return x


def bench_compile_time(tmp):
    # A compile cache of this run's own, so that the first export really
    # exports and compiles (a previous run's entries would make it a hit).
    saved = os.environ.get("TERN_COMPILE_CACHE_DIR")
    os.environ["TERN_COMPILE_CACHE_DIR"] = os.path.join(tmp, "compile-cache")
    try:
        model = Chain().eval()
        x = torch.randn(8, 64)
        t0 = time.perf_counter()
        stats = tc.export(model, (x,), os.path.join(tmp, "chain.tern"))
        total = time.perf_counter() - t0
        print(f"1,000-node graph ({stats['nodes']} nodes): torch.export + compile {total:.2f} s, "
              f"the compiler alone {stats['compile_ms']:.1f} ms (target <= 3 s)")
        # The graph-level cache only: torch.export runs, the compile hits.
        t0 = time.perf_counter()
        again = tc.export(model, (x,), os.path.join(tmp, "chain2.tern"), cache="graph")
        print(f"  again, compile cache only: {again.get('cache')}, torch.export + cache lookup "
              f"{(time.perf_counter() - t0) * 1e3:.0f} ms")
        # The export-level cache: no torch.export (median of a few hits).
        hits = []
        for k in range(5):
            t0 = time.perf_counter()
            hit = tc.export(model, (x,), os.path.join(tmp, f"chain-hit{k}.tern"))
            hits.append((time.perf_counter() - t0) * 1e3)
            assert hit.get("export_skipped"), hit.get("export_cache")
        print(f"  export cache hit: {statistics.median(hits):.1f} ms (target <= 50 ms; "
              f"key {hit['export_key_ms']:.1f} ms, median of {len(hits)})")
    finally:
        if saved is None:
            os.environ.pop("TERN_COMPILE_CACHE_DIR", None)
        else:
            os.environ["TERN_COMPILE_CACHE_DIR"] = saved


def cross_cpu_round_trip() -> str:
    """The round trip between two CPUs (tern_bench_collectives --round-trip), if
    the C tree is built: on a virtual machine it tells whether the host placed
    the two CPUs close or far apart, which moves every figure here that splits
    work across them."""
    import subprocess
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "build/bench/tern_bench_collectives"
    if not bench.exists():
        return "n/a (build the C tree for it)"
    out = subprocess.run([str(bench), "--round-trip"], capture_output=True, text=True, timeout=60)
    return f"{out.stdout.strip()} ns" if out.returncode == 0 else "n/a"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
          f"round trip between two CPUs {cross_cpu_round_trip()}")
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (1, 8):
            bench_model(f"MLP 512-1024-512, batch {batch}", Mlp(), torch.randn(batch, 512),
                        args.quick, tmp)
            bench_model(f"GPT-2 block (256 wide, 64 tokens), batch {batch}", Gpt2Block(),
                        torch.randn(batch, 64, 256), args.quick, tmp)
            bench_model(f"small ResNet (32 channels, 32x32), batch {batch}", SmallResNet(),
                        torch.randn(batch, 3, 32, 32), args.quick, tmp)
        bench_compile_time(tmp)
    print(f"round trip between two CPUs at the end: {cross_cpu_round_trip()}")


if __name__ == "__main__":
    main()
