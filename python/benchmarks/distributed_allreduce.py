"""torch.distributed on tern against tern's C API and gloo, on 2 processes.

    python python/benchmarks/distributed_allreduce.py [--c-bench PATH] [--json OUT]

Measures, with two ranks on this host (each launched by torchrun):
  * all_reduce (float32, SUM, in place) bus bandwidth at 8 B, 1 MiB and 16 MiB
    - through torch.distributed with the tern backend (tern tensors),
    - through tern's C API directly (bench/tern_bench_collectives, the same
      runtime with no torch in between: the backend's overhead is the gap),
    - through torch.distributed with gloo (CPU tensors);
  * the DDP step time of a small transformer, tern vs gloo on CPU tensors.

Timing: operations issued back to back after `--warmup`, then one
synchronization; the time per operation is the slowest rank's. `--iters`
operations at 16 MiB, 5x as many at 1 MiB and 50x at 8 B, so that every timing
spans milliseconds: over 20 operations of 10 us, one wake-up of a sleeping
virtual CPU (15-80 us here) doubled the figure. Rounds (`--rounds`) alternate
the torch run and the C API run; the figures are medians over the rounds. busbw =
size / time x 2(n-1)/n (nccl-tests' all-reduce factor). The C API numbers
come from tern_bench_collectives' CSV at the same sizes and iteration count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [8, 1 << 20, 16 << 20]


def _iterations(size: int, iters: int) -> int:
    """Operations timed at `size`: more for small sizes (see the timing note)."""
    return iters * {8: 50, 1 << 20: 5}.get(size, 1)


def _busbw(size: int, seconds: float, ranks: int) -> float:
    return size / seconds * 2 * (ranks - 1) / ranks / 1e9


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.tern.set_device(int(os.environ["LOCAL_RANK"]) % torch.tern.device_count())
    dist.init_process_group(backend="cpu:gloo,tern:tern")
    dev = torch.device("tern", torch.tern.current_device())

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # CPU tensor: gloo
        return t.item()

    def time_allreduce(t, sync) -> tuple[float, float]:
        """(seconds per operation, seconds to issue one: the host's share)."""
        iters = _iterations(t.numel() * t.element_size(), args.iters)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        sync()
        dist.barrier(device_ids=[dev.index])
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        issued = time.perf_counter()
        sync()
        end = time.perf_counter()
        return slowest((end - start) / iters), slowest((issued - start) / iters)

    results = {"all_reduce": [], "ddp": {}}
    for size in SIZES:
        n = max(1, size // 4)
        tern_s, tern_issue_s = time_allreduce(torch.ones(n, device=dev), torch.tern.synchronize)
        gloo_s, _ = time_allreduce(torch.ones(n), lambda: None)
        results["all_reduce"].append(
            {
                "size": size,
                "torch_tern_us": tern_s * 1e6,
                "torch_tern_busbw": _busbw(size, tern_s, world),
                "torch_tern_issue_us": tern_issue_s * 1e6,
                "gloo_us": gloo_s * 1e6,
                "gloo_busbw": _busbw(size, gloo_s, world),
            }
        )

    from torch.nn.parallel import DistributedDataParallel as DDP

    def make_model():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            d_model=64, nhead=4, dim_feedforward=128, batch_first=True
        )
        return torch.nn.Sequential(
            torch.nn.TransformerEncoder(layer, num_layers=2), torch.nn.Linear(64, 8)
        )

    g = torch.Generator().manual_seed(rank)
    x_cpu = torch.randn(8, 32, 64, generator=g)
    y_cpu = torch.randn(8, 32, 8, generator=g)
    runs = (("tern", dev, torch.tern.synchronize), ("gloo_cpu", torch.device("cpu"), lambda: None))
    for name, device, sync in runs:
        model = DDP(make_model().to(device))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = x_cpu.to(device), y_cpu.to(device)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        for _ in range(args.warmup):
            step()
        sync()
        start = time.perf_counter()
        for _ in range(args.ddp_steps):
            step()
        sync()
        results["ddp"][name + "_ms"] = slowest((time.perf_counter() - start) / args.ddp_steps) * 1e3
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(results))
    dist.destroy_process_group()


def _torchrun(cmd: list[str], env) -> str:
    full = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    full += cmd
    proc = subprocess.run(full, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(full)}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout


def _round_trip_ns(bench):
    """tern_bench_collectives --round-trip: ns per round trip between two CPUs, or None."""
    if bench is None or not Path(bench).exists():
        return None
    proc = subprocess.run([str(bench), "--round-trip"], capture_output=True, text=True, timeout=60)
    try:
        return float(proc.stdout.strip())
    except ValueError:
        return None


def _torch_round(args, env) -> dict:
    """One torchrun of the workers: torch+tern and gloo all_reduce, the DDP steps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "torch.json"
        _torchrun(
            [
                __file__,
                "--worker-out",
                str(out),
                "--iters",
                str(args.iters),
                "--warmup",
                str(args.warmup),
                "--ddp-steps",
                str(args.ddp_steps),
            ],
            env,
        )
        return json.loads(out.read_text())


def _c_api_round(args, env, bench) -> tuple[dict, dict]:
    """tern_bench_collectives at each size: {size: us per operation}, {size: us to enqueue}."""
    # One rank per device, core 0 of each, as the process group places them.
    env = dict(env, TERN_BENCH_PLACEMENT="device")
    c_api, c_enqueue = {}, {}
    for size in SIZES:
        csv = _torchrun(
            [
                "--no-python",
                str(bench),
                "-b",
                str(size),
                "-e",
                str(size),
                "-t",
                "all_reduce",
                "-i",
                "-n",
                str(_iterations(size, args.iters)),
                "-w",
                str(args.warmup),
                "--csv",
                "--device-time",
            ],
            env,
        )
        for line in csv.splitlines():
            parts = line.split(",")
            if len(parts) == 12 and parts[3].isdigit() and int(parts[3]) == size:
                if parts[0] == "tern":
                    c_api[size] = float(parts[8])
                elif parts[0] == "tern-enqueue":
                    c_enqueue[size] = float(parts[8])
    return c_api, c_enqueue


def _spread(values: list[float]) -> str:
    """'median [min-max]' of per-round figures."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def driver(args) -> None:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    root = Path(__file__).resolve().parents[2]
    bench = Path(args.c_bench) if args.c_bench else root / "build/bench/tern_bench_collectives"
    have_c_api = bench.exists()
    if not have_c_api:
        print(
            "note: no tern_bench_collectives (build the C tree: cmake -B build && "
            "ninja -C build); the C API column is left out",
            file=sys.stderr,
        )
    # Rounds alternate the torch workers and the C API run, so that both
    # columns see the same states of the machine; each figure below is the
    # median over the rounds and each ratio the median of the rounds' ratios.
    round_trips = [_round_trip_ns(bench)]
    rounds = []
    for _ in range(args.rounds):
        torch_results = _torch_round(args, env)
        round_trips.append(_round_trip_ns(bench))
        c_api, c_enqueue = _c_api_round(args, env, bench) if have_c_api else ({}, {})
        round_trips.append(_round_trip_ns(bench))
        rounds.append({"torch": torch_results, "c_api_us": c_api, "c_api_enqueue_us": c_enqueue})
    if None not in round_trips:
        # The machine's state: on a virtual machine the host places the two
        # virtual CPUs close or far apart, and every figure below that moves
        # data between the ranks moves with it (up to 5x).
        print(
            "round trip between two CPUs (before the rounds, then after each torch run and each "
            "C API run): " + " / ".join(f"{ns:.0f}" for ns in round_trips) + " ns"
        )
    print(
        "all_reduce float32 SUM in place, 2 ranks, "
        + ", ".join(f"{_iterations(size, args.iters)} operations at {size} B" for size in SIZES)
        + f", {args.rounds} rounds (medians; ratios: median [min-max] of the rounds')"
    )
    print(
        f"{'size':>10} {'torch+tern us':>14} {'C API us':>10} {'gloo us':>10} "
        f"{'torch+tern busbw':>17} {'C API busbw':>12} {'gloo busbw':>11} "
        f"{'tern/C busbw':>20} {'tern/gloo busbw':>20}"
    )
    summary = []
    for i, size in enumerate(SIZES):
        tern_us = [r["torch"]["all_reduce"][i]["torch_tern_us"] for r in rounds]
        gloo_us = [r["torch"]["all_reduce"][i]["gloo_us"] for r in rounds]
        c_us = [r["c_api_us"][size] for r in rounds if size in r["c_api_us"]]
        # busbw ratios are time ratios upside down.
        vs_c = [r["c_api_us"][size] / t for r, t in zip(rounds, tern_us) if size in r["c_api_us"]]
        vs_gloo = [g / t for g, t in zip(gloo_us, tern_us)]
        row = {
            "size": size,
            "torch_tern_us": statistics.median(tern_us),
            "c_api_us": statistics.median(c_us) if c_us else None,
            "gloo_us": statistics.median(gloo_us),
            "tern_vs_c_api": vs_c,
            "tern_vs_gloo": vs_gloo,
        }
        summary.append(row)
        c_med = row["c_api_us"]
        nan = float("nan")
        print(
            f"{size:>10} {row['torch_tern_us']:>14.1f} {c_med if c_med else nan:>10.1f} "
            f"{row['gloo_us']:>10.1f} {_busbw(size, row['torch_tern_us'] * 1e-6, 2):>17.3f} "
            f"{_busbw(size, c_med * 1e-6, 2) if c_med else nan:>12.3f} "
            f"{_busbw(size, row['gloo_us'] * 1e-6, 2):>11.3f} "
            f"{_spread(vs_c):>20} {_spread(vs_gloo):>20}"
        )
    print("host time to issue one all_reduce (enqueue only, no waiting), medians:")
    for i, size in enumerate(SIZES):
        issue = statistics.median(r["torch"]["all_reduce"][i]["torch_tern_issue_us"] for r in rounds)
        c_enq = [r["c_api_enqueue_us"][size] for r in rounds if size in r["c_api_enqueue_us"]]
        print(
            f"{size:>10} torch+tern {issue:.1f} us, C API "
            + (f"{statistics.median(c_enq):.1f} us" if c_enq else "n/a")
        )
    tern_ms = [r["torch"]["ddp"]["tern_ms"] for r in rounds]
    gloo_ms = [r["torch"]["ddp"]["gloo_cpu_ms"] for r in rounds]
    print(
        "DDP step, 2-layer transformer (d_model 64, batch 8 x 32): "
        f"tern {statistics.median(tern_ms):.2f} ms, gloo on CPU tensors "
        f"{statistics.median(gloo_ms):.2f} ms (gloo/tern "
        f"{_spread([g / t for g, t in zip(gloo_ms, tern_ms)])}x)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"round_trip_ns": round_trips, "rounds": rounds, "all_reduce": summary}, indent=1
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--c-bench", help="path of tern_bench_collectives (default: build/bench/)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--ddp-steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5, help="torch / C API runs alternated")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "RANK" in os.environ and args.worker_out:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
