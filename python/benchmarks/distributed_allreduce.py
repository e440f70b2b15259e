"""torch.distributed on tern against tern's C API and gloo, on 2 processes.

    python python/benchmarks/distributed_allreduce.py [--c-bench PATH] [--json OUT]

Measures, with two ranks on this host (each launched by torchrun):
  * all_reduce (float32, SUM, in place) bus bandwidth at 8 B, 1 MiB and 16 MiB
    - through torch.distributed with the tern backend (tern tensors),
    - through tern's C API directly, twice: in the same worker processes,
      called through ctypes on the same tensors' buffers (torch_tern.c_api),
      each loop alternated with a torch loop so that both see the same state
      of the machine (the ratio the issue's 0.9x target is judged on; at 8 B
      it includes ctypes' few microseconds per call), and from
      bench/tern_bench_collectives in processes of its own (no torch and no
      ctypes in between: what the 8 B target is judged against),
    - through torch.distributed with gloo (CPU tensors);
  * the DDP step time of a small transformer, tern vs gloo on CPU tensors.

Timing: operations issued back to back after `--warmup`, then one
synchronization; the time per operation is the slowest rank's. `--iters`
operations at 16 MiB, 20x as many at 1 MiB and 50x at 8 B, so that every timing
spans milliseconds: over 20 operations of 10 us, one wake-up of a sleeping
virtual CPU (15-80 us here) doubled the figure. (1 MiB ran 5x, 3 ms a loop,
until 2026-12-07: the start of each loop then weighed on torch and the C API
alike and hid part of the host's cost per operation; see docs/torch.md.)
Inside each worker, `--pairs` torch loops alternate with as many in-process
C API loops at each size. Rounds
(`--rounds`) alternate the torch workers and the C API program; the figures are
medians over the rounds (and pairs). busbw =
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
    return iters * {8: 50, 1 << 20: 20}.get(size, 1)


def _busbw(size: int, seconds: float, ranks: int) -> float:
    return size / seconds * 2 * (ranks - 1) / ranks / 1e9


class _InProcessCApi:
    """tern's C API called through ctypes from a torch worker: a communicator of
    its own (its unique id passed through the process group's store), a queue of
    its own on the core the plugin runs this device on, and all_reduce in place
    on a torch tensor's buffer (torch_tern.c_api's handles)."""

    F32, SUM, INFINITE = 0, 0, 2**64 - 1

    def __init__(self, rank: int, world: int, store) -> None:
        import ctypes

        from torch_tern import c_api

        self._c_api = c_api
        lib = self._lib = c_api.library()
        lib.tern_last_error_message.restype = ctypes.c_char_p
        p, u64 = ctypes.c_void_p, ctypes.c_uint64
        lib.tern_comm_all_reduce.argtypes = [p, p, u64, p, u64, u64, ctypes.c_int, ctypes.c_int, p]
        lib.tern_queue_synchronize.argtypes = [p, u64]
        unique_id = ctypes.create_string_buffer(128)
        if rank == 0:
            self._check("tern_comm_get_unique_id", lib.tern_comm_get_unique_id(unique_id))
            store.set("distributed_allreduce/c_api_unique_id", unique_id.raw)
        else:
            unique_id.raw = store.get("distributed_allreduce/c_api_unique_id")
        core = p(c_api.core())
        self._comm = p()
        self._check(
            "tern_comm_init_rank",
            lib.tern_comm_init_rank(core, world, unique_id, rank, None, ctypes.byref(self._comm)),
        )

        class QueueParams(ctypes.Structure):
            _fields_ = [("struct_size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                        ("name", ctypes.c_char_p)]

        params = QueueParams(ctypes.sizeof(QueueParams), 0, b"benchmark C API")
        self._queue = p()
        self._check("tern_queue_create",
                    lib.tern_queue_create(core, ctypes.byref(params), ctypes.byref(self._queue)))

    def _check(self, what: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"{what}: {self._lib.tern_last_error_message().decode()}")

    def run(self, t, count: int) -> None:
        """`count` all-reduces of `t` in place back to back, then waits for them."""
        buffer, offset = self._c_api.buffer(t)
        all_reduce, comm, queue = self._lib.tern_comm_all_reduce, self._comm, self._queue
        n = t.numel()
        for _ in range(count):
            status = all_reduce(comm, buffer, offset, buffer, offset, n, self.F32, self.SUM, queue)
            if status != 0:
                self._check("tern_comm_all_reduce", status)
        self._check("tern_queue_synchronize", self._lib.tern_queue_synchronize(queue, self.INFINITE))

    def close(self) -> None:
        self._check("tern_comm_destroy", self._lib.tern_comm_destroy(self._comm))
        self._check("tern_queue_destroy", self._lib.tern_queue_destroy(self._queue))


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.tern.set_device(int(os.environ["LOCAL_RANK"]) % torch.tern.device_count())
    dist.init_process_group(backend="cpu:gloo,tern:tern")
    dev = torch.device("tern", torch.tern.current_device())
    c_api = _InProcessCApi(rank, world, dist.distributed_c10d._get_default_store())

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

    def time_c_api(t) -> float:
        """Seconds per operation through the C API, on `t`'s buffer, same loop shape."""
        iters = _iterations(t.numel() * t.element_size(), args.iters)
        c_api.run(t, args.warmup)
        dist.barrier(device_ids=[dev.index])
        torch.tern.synchronize()
        start = time.perf_counter()
        c_api.run(t, iters)
        return slowest((time.perf_counter() - start) / iters)

    results = {"all_reduce": [], "ddp": {}}
    for size in SIZES:
        n = max(1, size // 4)
        t = torch.ones(n, device=dev)
        torch_us, issue_us, c_us = [], [], []
        for _ in range(args.pairs):
            tern_s, tern_issue_s = time_allreduce(t, torch.tern.synchronize)
            torch_us.append(tern_s * 1e6)
            issue_us.append(tern_issue_s * 1e6)
            c_us.append(time_c_api(t) * 1e6)
        gloo_s, _ = time_allreduce(torch.ones(n), lambda: None)
        results["all_reduce"].append(
            {
                "size": size,
                "torch_tern_us": statistics.median(torch_us),
                "torch_tern_issue_us": statistics.median(issue_us),
                "torch_tern_pairs_us": torch_us,
                "c_api_in_process_pairs_us": c_us,
                "gloo_us": gloo_s * 1e6,
            }
        )
    c_api.close()

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
    # Each model runs with DDP and, to tell DDP's own cost from the model's,
    # without it (the same step on one rank's data, no communication); the
    # four alternate in chunks of steps so that they see the same machine.
    setups = {}
    for name, device, wrap in (
        ("tern", dev, True),
        ("gloo_cpu", torch.device("cpu"), True),
        ("tern_plain", dev, False),
        ("cpu_plain", torch.device("cpu"), False),
    ):
        model = make_model().to(device)
        model = DDP(model) if wrap else model
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = x_cpu.to(device), y_cpu.to(device)

        def step(model=model, opt=opt, x=x, y=y):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        sync = torch.tern.synchronize if device.type == "tern" else (lambda: None)
        for _ in range(args.warmup):
            step()
        sync()
        setups[name] = (step, sync)
    # Eight chunks of ten steps by default: with four of five, the DDP step's
    # ratio to gloo's moved 0.95-1.60x between the rounds of one run.
    chunks = 8
    per_chunk = max(1, args.ddp_steps // chunks)
    times = {name: [] for name in setups}
    for _ in range(chunks):
        for name, (step, sync) in setups.items():
            start = time.perf_counter()
            for _ in range(per_chunk):
                step()
            sync()
            times[name].append(slowest((time.perf_counter() - start) / per_chunk) * 1e3)
    for name, chunk_ms in times.items():
        results["ddp"][name + "_ms"] = statistics.median(chunk_ms)
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
                "--pairs",
                str(args.pairs),
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
        + f", {args.rounds} rounds of {args.pairs} torch / in-process C API pairs (medians; "
        "ratios: median [min-max] of the pairs' or rounds')"
    )
    print(
        f"{'size':>10} {'torch+tern us':>14} {'C in-proc us':>13} {'C API us':>10} "
        f"{'gloo us':>10} {'torch+tern busbw':>17} {'C API busbw':>12} {'gloo busbw':>11} "
        f"{'tern/C in-proc':>20} {'tern/C busbw':>20} {'tern/gloo busbw':>20}"
    )
    summary = []
    for i, size in enumerate(SIZES):
        per_round = [r["torch"]["all_reduce"][i] for r in rounds]
        tern_us = [r["torch_tern_us"] for r in per_round]
        gloo_us = [r["gloo_us"] for r in per_round]
        c_us = [r["c_api_us"][size] for r in rounds if size in r["c_api_us"]]
        # busbw ratios are time ratios upside down. The in-process ratio is
        # taken per pair of loops that ran one after the other.
        vs_in_process = [
            c / t
            for r in per_round
            for t, c in zip(r["torch_tern_pairs_us"], r["c_api_in_process_pairs_us"])
        ]
        in_process_us = [c for r in per_round for c in r["c_api_in_process_pairs_us"]]
        vs_c = [r["c_api_us"][size] / t for r, t in zip(rounds, tern_us) if size in r["c_api_us"]]
        vs_gloo = [g / t for g, t in zip(gloo_us, tern_us)]
        row = {
            "size": size,
            "torch_tern_us": statistics.median(tern_us),
            "c_api_in_process_us": statistics.median(in_process_us),
            "c_api_us": statistics.median(c_us) if c_us else None,
            "gloo_us": statistics.median(gloo_us),
            "tern_vs_c_api_in_process": vs_in_process,
            "tern_vs_c_api": vs_c,
            "tern_vs_gloo": vs_gloo,
        }
        summary.append(row)
        c_med = row["c_api_us"]
        nan = float("nan")
        print(
            f"{size:>10} {row['torch_tern_us']:>14.1f} {row['c_api_in_process_us']:>13.1f} "
            f"{c_med if c_med else nan:>10.1f} "
            f"{row['gloo_us']:>10.1f} {_busbw(size, row['torch_tern_us'] * 1e-6, 2):>17.3f} "
            f"{_busbw(size, c_med * 1e-6, 2) if c_med else nan:>12.3f} "
            f"{_busbw(size, row['gloo_us'] * 1e-6, 2):>11.3f} "
            f"{_spread(vs_in_process):>20} {_spread(vs_c):>20} {_spread(vs_gloo):>20}"
        )
    print("host time to issue one all_reduce (enqueue only, no waiting), medians:")
    for i, size in enumerate(SIZES):
        issue = statistics.median(r["torch"]["all_reduce"][i]["torch_tern_issue_us"] for r in rounds)
        c_enq = [r["c_api_enqueue_us"][size] for r in rounds if size in r["c_api_enqueue_us"]]
        print(
            f"{size:>10} torch+tern {issue:.1f} us, C API "
            + (f"{statistics.median(c_enq):.1f} us" if c_enq else "n/a")
        )
    ddp = {k: [r["torch"]["ddp"][k] for r in rounds] for k in rounds[0]["torch"]["ddp"]}
    tern_ms, gloo_ms = ddp["tern_ms"], ddp["gloo_cpu_ms"]
    print(
        "DDP step, 2-layer transformer (d_model 64, batch 8 x 32): "
        f"tern {statistics.median(tern_ms):.2f} ms, gloo on CPU tensors "
        f"{statistics.median(gloo_ms):.2f} ms (gloo/tern "
        f"{_spread([g / t for g, t in zip(gloo_ms, tern_ms)])}x)"
    )
    # DDP's own share: the DDP step less the same step without DDP, same round.
    tern_ddp = [d - p for d, p in zip(tern_ms, ddp["tern_plain_ms"])]
    gloo_ddp = [d - p for d, p in zip(gloo_ms, ddp["cpu_plain_ms"])]
    print(
        "  the same step without DDP: tern "
        f"{statistics.median(ddp['tern_plain_ms']):.2f} ms, CPU "
        f"{statistics.median(ddp['cpu_plain_ms']):.2f} ms; DDP's own share (DDP step less "
        f"plain step): tern {statistics.median(tern_ddp):.2f} ms, gloo "
        f"{statistics.median(gloo_ddp):.2f} ms"
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
    parser.add_argument("--ddp-steps", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=5, help="torch / C API runs alternated")
    parser.add_argument(
        "--pairs", type=int, default=3, help="torch / in-process C API loops alternated per size"
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "RANK" in os.environ and args.worker_out:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()
