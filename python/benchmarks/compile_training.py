"""Training with torch.compile(backend="tern") against the other ways to train (P10, point 8).

One run prints everything:

1. Training step time. A training step is forward, loss, backward and an
   AdamW step (the optimizer runs eagerly in the four main configurations:
   only the model, loss included, is compiled). Two models:

   - a small GPT-2 (transformers, 2 layers, 128 wide, 4 heads, vocabulary
     512, dropout 0) on batch 4 x 64 tokens, its loss the model's own
     (``labels=input_ids``);
   - a small CNN (three conv - batch norm (training mode) - ReLU - max-pool
     blocks, average pool, linear) on batch 8 x 3x32x32, cross-entropy loss
     (computed inside the compiled module).

   Four configurations each: compiled tern (``torch.compile(m,
   backend="tern")``), eager tern, PyTorch CPU eager, and CPU inductor
   (``torch.compile(m)`` on the CPU); and two that compile the optimizer's
   step too (``torch.compile(opt.step, ...)``): compiled tern + AdamW (the
   backend keeps its step counters on the device, as Dynamo does for CUDA
   parameters) and CPU inductor + AdamW. Each is warmed up (the compiles are
   timed apart, not in the step figures), then the configurations take turns
   round by round, their order rotating, a few steps at a time; every step
   ends with a synchronize (tern is asynchronous) and is timed on its own.
   Printed: the median ms per step of each, and the speedups of compiled tern
   (other time / compiled time) beside the targets: >= 2x eager tern and
   >= 1x CPU inductor on the transformer. Then one more round, apart, that
   synchronizes after the backward too, to split each step into forward +
   backward and AdamW, and what the tern backend compiled and left eager.

2. Compile time of the GPT-2 step, cold and warm: the first step of the
   compiled model in a fresh process with an empty tern compile cache
   (``clear_cache()`` on a new ``TORCH_TERN_CACHE_DIR``), then the same in a
   second fresh process on the same cache directory. Both run as
   subprocesses of this script (``--first-step-child``), so that each pays
   the same one-time process costs and neither sees this process's Dynamo
   state. Printed: the first step's wall time and stats() of each.

3. Variable-length training: the GPT-2 trained for ``--varlen-steps`` steps
   with the sequence length random in [1, 512] (fixed seed), once with
   ``dynamic=True`` and once with static shapes (``dynamic=False``, no
   automatic dynamic shapes, recompile limits raised so that every new length
   recompiles). See ``varlen_run`` for what "compile time" measures.

Every tern compile cache this script uses is a fresh directory of its own,
whatever TORCH_TERN_CACHE_DIR says, and so is inductor's, so that no earlier
run's artifacts turn a compile into a cache hit. On the simulated device the
script runs on a node of its own (TERN_SIM_NODE, unless set; one device with
one core and 8 GiB), as do its child processes. Between sections the device's
cached free memory is released (torch.tern.empty_cache()).

    python python/benchmarks/compile_training.py [--quick]
        [--only transformer|cnn|cold|varlen] [--varlen-steps N]

Run it from outside python/ (python/torch_tern would shadow the installed
torch_tern).
"""

from __future__ import annotations

import argparse
import atexit
import copy
import glob
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# A simulated tern node of this process's own (unless TERN_SIM_NODE names
# one): a core belongs to one process at a time, and the node's other users
# (tests, other benchmarks) would otherwise take the cores this one needs. It
# must be set before torch, whose backend autoloading imports torch_tern.
OWN_NODE = __name__ == "__main__" and "TERN_SIM_NODE" not in os.environ
if OWN_NODE:
    os.environ["TERN_SIM_NODE"] = f"compile-training-{os.getpid()}"
    os.environ.setdefault("TERN_SIM_TOPOLOGY", "1x1x8G")


def remove_node(node: str) -> None:
    """Removes the shared-memory files of a simulated node of ours."""
    for path in glob.glob(f"/dev/shm/tern-sim-{node}*"):
        try:
            os.unlink(path)
        except OSError:
            pass


if OWN_NODE:
    atexit.register(remove_node, os.environ["TERN_SIM_NODE"])

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_tern  # noqa: F401,E402  (registers the tern device and torch.tern)
import torch_tern.compiler as tc  # noqa: E402
# The benchmarks' shared helpers, beside this file (also under python -P).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from settle import settle  # noqa: E402
from torch_tern.collect_env import cpu_model  # noqa: E402

# GPT-2's sizes: the model is built from a config, nothing is downloaded.
VOCAB = 512
MAX_LEN = 512
CHILD_MARK = "@@first-step "  # how a child process's result line starts


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg()) + " (1/5/15 min)"
    except OSError:
        return "n/a"


def fresh_device_memory() -> None:
    """Returns the tern caching allocator's free blocks to the device, and
    zeroes the peaks. Called between independent runs: blocks cached for one
    run's sizes would otherwise count against the next (executables'
    scratch is allocated beside the caching allocator, which keeps them)."""
    torch.tern.synchronize()
    torch.tern.empty_cache()
    torch.tern.reset_peak_memory_stats()


def set_cache_dir(path: str) -> str:
    """Points tern's compile cache at `path` (read at every compile)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.environ["TORCH_TERN_CACHE_DIR"] = path
    return path


# --- the models -------------------------------------------------------------------


class Gpt2WithLoss(nn.Module):
    """A 2-layer GPT-2 language model; forward(ids) returns its loss."""

    def __init__(self):
        super().__init__()
        import transformers

        transformers.logging.set_verbosity_error()
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB,
                                         n_positions=MAX_LEN, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        self.lm = transformers.GPT2LMHeadModel(config)

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


class CnnWithLoss(nn.Module):
    """Three conv - batch norm - ReLU - max-pool blocks, average pool and a
    linear layer on 3x32x32 images; forward(x, y) returns the cross-entropy."""

    def __init__(self, widths=(16, 32, 64), classes=10):
        super().__init__()
        layers, c_in = [], 3
        for c_out in widths:
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
                       nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, classes)

    def forward(self, x, y):
        logits = self.head(self.features(x).mean(dim=(2, 3)))
        return F.cross_entropy(logits, y)


def gpt2_model() -> nn.Module:
    torch.manual_seed(0)  # every copy, in every process, starts from the same weights
    return Gpt2WithLoss().train()


def gpt2_batch(length: int, batch: int = 4, seed: int = 1) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (batch, length), generator=g),)


def cnn_model() -> nn.Module:
    torch.manual_seed(0)
    return CnnWithLoss().train()


def cnn_batch(batch: int = 8) -> tuple:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)


def sync(device: str) -> None:
    if device == "tern":
        torch.tern.synchronize()


class Trainer:
    """One configuration: a model (possibly compiled) on a device, its AdamW
    and its batch. step() runs one training step and waits for it."""

    def __init__(self, model: nn.Module, batch: tuple, device: str, compile_kwargs=None,
                 optimizer_kwargs=None):
        self.device = device
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.fn = self.model if compile_kwargs is None else torch.compile(self.model,
                                                                          **compile_kwargs)
        self.opt_step = (self.opt.step if optimizer_kwargs is None
                         else torch.compile(self.opt.step, **optimizer_kwargs))
        self.batch = tuple(t.to(device) for t in batch)
        self.loss = None
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        self.loss = self.fn(*self.batch)
        self.loss.backward()
        self.opt_step()
        self.opt.zero_grad(set_to_none=True)
        sync(self.device)

    def split_step(self) -> tuple:
        """step(), waiting for the backward before the optimizer: the seconds
        of forward + backward and of the AdamW step."""
        self.steps += 1
        t0 = time.perf_counter()
        self.loss = self.fn(*self.batch)
        self.loss.backward()
        sync(self.device)
        t1 = time.perf_counter()
        self.opt_step()
        self.opt.zero_grad(set_to_none=True)
        sync(self.device)
        return t1 - t0, time.perf_counter() - t1


# --- 1. training step time ---------------------------------------------------------


def graphs(stats: dict) -> int:
    """The graphs AOTAutograd handed to the tern backend (forward, backward, inference)."""
    return sum(stats["graphs_by_kind"].values())


def dynamo_frames() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


def bench_training(name: str, make_model, batch: tuple, quick: bool, targets: bool) -> None:
    """Times the configurations' training steps; `targets`: print the
    P10 targets beside the speedups."""
    base = make_model()
    configs = {
        "compiled tern": lambda: Trainer(copy.deepcopy(base), batch, "tern", {"backend": "tern"}),
        "eager tern": lambda: Trainer(copy.deepcopy(base), batch, "tern"),
        "CPU eager": lambda: Trainer(copy.deepcopy(base), batch, "cpu"),
        "CPU inductor": lambda: Trainer(copy.deepcopy(base), batch, "cpu", {}),
        # The same with the optimizer's step compiled too.
        "compiled tern + AdamW": lambda: Trainer(copy.deepcopy(base), batch, "tern",
                                                 {"backend": "tern"}, {"backend": "tern"}),
        "CPU inductor + AdamW": lambda: Trainer(copy.deepcopy(base), batch, "cpu", {}, {}),
    }
    torch._dynamo.reset()
    tc.reset_stats()
    trainers, first, failed = {}, {}, {}
    warmup = 2 if quick else 3
    for label, make in configs.items():
        try:
            trainer = make()
            t0 = time.perf_counter()
            trainer.step()  # the first step: compiles, for the compiled ones
            first[label] = time.perf_counter() - t0
            for _ in range(warmup - 1):
                trainer.step()
            trainers[label] = trainer
        except Exception as error:  # a configuration that cannot run is reported as n/a
            failed[label] = f"{type(error).__name__}: {error}"
            print(f"{name}: {label} FAILED, reported as n/a:")
            traceback.print_exc(file=sys.stdout)
    tern_stats = tc.stats()

    # Interleaved rounds: each configuration runs `steps` steps in a row, the
    # order rotating from round to round so that no one always follows the
    # same neighbour (the tern device's worker threads share the two cores).
    n_rounds, steps = (3, 3) if quick else (5, 10)
    names = list(trainers)
    times = {label: [] for label in names}
    frames_before, executables_before = dynamo_frames(), tern_stats["executables"]
    for r in range(n_rounds):
        for k in range(len(names)):
            label = names[(k + r) % len(names)]
            settle()  # the CPU configurations' OpenMP workers spin after their steps
            for _ in range(steps):
                t0 = time.perf_counter()
                trainers[label].step()
                times[label].append(time.perf_counter() - t0)
    # Where the time goes: one more round, each step synchronizing after the
    # backward too (which costs tern the overlap of the optimizer's queueing
    # with the backward's execution: apart from the figures above).
    split = {label: [] for label in names}
    for label in names:
        for _ in range(steps):
            split[label].append(trainers[label].split_step())
    recompiled = (dynamo_frames() - frames_before, tc.stats()["executables"] - executables_before)

    med = {label: statistics.median(v) * 1e3 for label, v in times.items()}
    print(f"{name}: median ms per training step (forward + backward + AdamW), "
          f"{n_rounds} rounds x {steps} steps, after {warmup} warm-up steps:")
    for label in configs:
        if label in med:
            t = times[label]
            print(f"  {label:21s} {med[label]:9.2f} ms  (min {min(t) * 1e3:.2f}, max "
                  f"{max(t) * 1e3:.2f}; first step, compiles included: {first[label]:.2f} s; "
                  f"loss after {trainers[label].steps} steps {trainers[label].loss.item():.5f})")
        else:
            print(f"  {label:21s}       n/a  ({failed[label].splitlines()[0][:300]})")

    def speedup(other: str, target: str = "", compiled: str = "compiled tern") -> str:
        if compiled not in med or other not in med:
            return f"vs {other}: n/a"
        return f"vs {other}: {med[other] / med[compiled]:.2f}x{target}"

    print("  speedup of compiled tern (other time / compiled time): "
          + "; ".join([speedup("eager tern", " (target >= 2)" if targets else ""),
                       speedup("CPU eager"),
                       speedup("CPU inductor", " (target >= 1)" if targets else "")]))
    print("  speedup of compiled tern + AdamW: "
          + "; ".join([speedup("eager tern", compiled="compiled tern + AdamW"),
                       speedup("compiled tern", compiled="compiled tern + AdamW"),
                       speedup("CPU inductor + AdamW", compiled="compiled tern + AdamW")]))
    print("  split, synchronizing after the backward too (median ms): " + "; ".join(
        f"{label} {statistics.median(f for f, _ in v) * 1e3:.2f} forward + backward, "
        f"{statistics.median(o for _, o in v) * 1e3:.2f} AdamW" for label, v in split.items()))
    fallbacks = tern_stats["fallback_nodes"]
    eager_ops = ", ".join(f"{op} x{n}" for op, n in fallbacks.items()) or "none"
    print(f"  tern backend: {graphs(tern_stats)} graphs {tern_stats['graphs_by_kind']}, "
          f"{tern_stats['partitions']} partitions, {tern_stats['compiled_nodes']} nodes "
          f"compiled, {sum(fallbacks.values())} run eagerly ({eager_ops}), "
          f"{tern_stats['executables']} executables; backend {tern_stats['backend_seconds']:.2f} "
          f"s, tern compiler {tern_stats['compile_seconds']:.2f} s")
    if any(recompiled):
        print(f"  NOTE: compiled during the timed rounds: {recompiled[0]} Dynamo frames, "
              f"{recompiled[1]} tern executables")


# --- 2. compile time, cold and warm ------------------------------------------------------


def first_step_child(clear: bool) -> None:
    """In a child process: the compiled GPT-2's first training step (compiles
    included) and its second; prints one line of JSON."""
    if clear:
        tc.clear_cache()
    trainer = Trainer(gpt2_model(), gpt2_batch(64), "tern", {"backend": "tern"})
    t0 = time.perf_counter()
    trainer.step()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.step()
    second = time.perf_counter() - t0
    stats = tc.stats()
    from torch._dynamo.utils import calculate_time_spent

    print(CHILD_MARK + json.dumps({
        "first_s": first, "second_s": second, "frames": dynamo_frames(),
        "dynamo_s": calculate_time_spent().get("entire_frame_compile", 0.0),
        "graphs": graphs(stats),
        **{k: stats[k] for k in ("partitions", "executables", "cache_hits", "cache_misses",
                                 "backend_seconds", "compile_seconds")}}))


def bench_cold_warm(tmp: str) -> None:
    cache = os.path.join(tmp, "cold-warm-cache")
    os.makedirs(cache, mode=0o700)
    results = {}
    for kind in ("cold", "warm"):
        command = [sys.executable, os.path.abspath(__file__), "--first-step-child"]
        if kind == "cold":
            command.append("--clear-cache")
        env = dict(os.environ, TORCH_TERN_CACHE_DIR=cache)
        if OWN_NODE:
            # A node of the child's own: this process holds its node's core.
            # (Under a TERN_SIM_NODE of the user's the child joins that node.)
            env["TERN_SIM_NODE"] = f"{os.environ['TERN_SIM_NODE']}-{kind}"
        t0 = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        process_s = time.perf_counter() - t0
        if OWN_NODE:
            remove_node(env["TERN_SIM_NODE"])
        lines = [line for line in proc.stdout.splitlines() if line.startswith(CHILD_MARK)]
        if proc.returncode != 0 or not lines:
            print(f"compile time, {kind}: the child process failed (exit {proc.returncode}):")
            print(proc.stdout[-4000:] + proc.stderr[-4000:])
            return
        results[kind] = dict(json.loads(lines[-1][len(CHILD_MARK):]), process_s=process_s)
    print(f"GPT-2 training step, compile time (each in a fresh process; cache {cache}):")
    for kind, r in results.items():
        print(f"  {kind}: first step {r['first_s']:.2f} s (second step "
              f"{r['second_s'] * 1e3:.1f} ms, whole process {r['process_s']:.1f} s); Dynamo's "
              f"entire_frame_compile {r['dynamo_s']:.2f} s; {r['frames']} Dynamo frames, "
              f"{r['graphs']} graphs, {r['partitions']} partitions, {r['executables']} "
              f"executables, tern cache hits {r['cache_hits']} / misses {r['cache_misses']}; "
              f"backend {r['backend_seconds']:.2f} s, tern compiler {r['compile_seconds']:.3f} s")
    cold, warm = results["cold"], results["warm"]
    print(f"  warm / cold first step: {warm['first_s'] / cold['first_s']:.2f} "
          f"({cold['first_s'] - warm['first_s']:.2f} s saved); the tern compile cache can "
          f"save at most the tern compiler's time: Dynamo and AOTAutograd trace again in "
          f"every process")


# --- 3. variable-length training ------------------------------------------------------------


def varlen_run(label: str, lengths: list, dynamic: bool, cache: str) -> dict:
    """Trains the compiled GPT-2 on tern for len(lengths) steps, one sequence
    length per step.

    Compile time: a step that compiled (a new Dynamo frame, or a new tern
    executable: with dynamic=True a new length binds the symbolic graph to its
    sizes) is timed, then its forward and backward run again at once with the
    same batch and sizes, nothing left to compile, and the difference is
    counted as compile time. This takes in everything a new length costs
    (Dynamo tracing and guards, AOTAutograd, the tern backend, the tern
    compiler, cache lookups, at trace time and at run time) and nothing of
    the execution. The repeat is not counted in the wall time, and gives the
    same gradients (grads are set to None before it, dropout is 0), so
    training is unchanged. Dynamo's own figure (entire_frame_compile: Dynamo
    frames, the backend compiles at trace time included) is printed beside.
    """
    from torch._dynamo.utils import calculate_time_spent, counters

    torch._dynamo.reset()
    tc.reset_stats()
    fresh_device_memory()
    set_cache_dir(cache)
    trainer = Trainer(gpt2_model(), gpt2_batch(8), "tern",
                      {"backend": "tern", "dynamic": dynamic})
    frames0 = dynamo_frames()
    graphs0 = counters["stats"]["unique_graphs"]
    dynamo0 = calculate_time_spent().get("entire_frame_compile", 0.0)
    wall = compile_s = first_compile = 0.0
    compiling_steps = 0
    repeat_compiled = 0
    for i, length in enumerate(lengths):
        (ids,) = gpt2_batch(length, seed=100 + i)
        ids = ids.to("tern")
        before = (dynamo_frames(), tc.stats()["executables"])
        t0 = time.perf_counter()
        loss = trainer.fn(ids)
        loss.backward()
        sync("tern")
        first = time.perf_counter() - t0
        after = (dynamo_frames(), tc.stats()["executables"])
        if after != before:
            compiling_steps += 1
            trainer.opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            trainer.fn(ids).backward()
            sync("tern")
            repeat = time.perf_counter() - t0
            if (dynamo_frames(), tc.stats()["executables"]) != after:
                repeat_compiled += 1  # should not happen: the figure would be low
            compile_s += max(first - repeat, 0.0)
            if compiling_steps == 1:
                first_compile = compile_s
        t0 = time.perf_counter()
        trainer.opt.step()
        trainer.opt.zero_grad(set_to_none=True)
        sync("tern")
        wall += first + time.perf_counter() - t0
    stats = tc.stats()
    result = {
        "label": label, "wall": wall, "compile": compile_s, "compiling_steps": compiling_steps,
        "first_compile": first_compile,
        "frames": dynamo_frames() - frames0,
        "graphs": counters["stats"]["unique_graphs"] - graphs0,
        "dynamo": calculate_time_spent().get("entire_frame_compile", 0.0) - dynamo0,
        "executables": stats["executables"], "specializations": stats["specializations"],
        "tern_compile": stats["compile_seconds"], "backend": stats["backend_seconds"],
        "recompiles": stats["recompiles"]["count"], "loss": loss.item(),
        "repeat_compiled": repeat_compiled,
        "reserved_mib": torch.tern.max_memory_reserved() / 2**20,
        "allocated_mib": torch.tern.max_memory_allocated() / 2**20,
    }
    print(f"  {label}: wall {wall:.1f} s; compile {compile_s:.1f} s, in the {compiling_steps} "
          f"steps that compiled (the first {first_compile:.1f} s, the others "
          f"{compile_s - first_compile:.1f} s); Dynamo's entire_frame_compile "
          f"{result['dynamo']:.1f} s; {result['frames']} Dynamo frames compiled "
          f"({result['graphs']} graphs); {result['executables']} tern executables "
          f"({result['specializations']} size specialisations; tern compiler "
          f"{result['tern_compile']:.2f} s, backend {result['backend']:.2f} s); "
          f"stats()['recompiles'] count {result['recompiles']}; tern memory peak: "
          f"{result['allocated_mib']:.0f} MiB allocated, {result['reserved_mib']:.0f} MiB "
          f"reserved; last loss {result['loss']:.4f}")
    if repeat_compiled:
        print(f"  NOTE: {repeat_compiled} repeats compiled again: their compile time is "
              f"underestimated")
    return result


def bench_varlen(steps: int, max_len: int, tmp: str) -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, max_len) for _ in range(steps)]
    print(f"GPT-2 variable-length training, {steps} steps, batch 4, lengths random in "
          f"[1, {max_len}] (seed 0; {len(set(lengths))} distinct):")
    # One-time costs of the process's first compile (imports, Dynamo's and
    # AOTAutograd's own warm-up) are paid here, outside both runs, so that
    # the first of them does not carry them.
    torch._dynamo.reset()
    set_cache_dir(os.path.join(tmp, "varlen-prime-cache"))
    Trainer(gpt2_model(), gpt2_batch(8), "tern", {"backend": "tern"}).step()
    runs = {}
    for label, dynamic in (("dynamic=True", True), ("static (dynamic=False)", False)):
        # Static shapes: every new length is a recompile. Dynamo would
        # otherwise make the length dynamic at its second value (automatic
        # dynamic shapes) and stop recompiling a frame after recompile_limit
        # (8) versions, or after accumulated_recompile_limit (256) over all.
        limits = {} if dynamic else {"automatic_dynamic_shapes": False,
                                     "recompile_limit": 1024,
                                     "accumulated_recompile_limit": 1 << 16}
        try:
            with torch._dynamo.config.patch(**limits):
                runs[dynamic] = varlen_run(label, lengths, dynamic,
                                           os.path.join(tmp, f"varlen-{dynamic}"))
        except Exception:  # printed; the other run still runs
            print(f"  {label}: FAILED:")
            traceback.print_exc(file=sys.stdout)
    torch._dynamo.reset()
    if len(runs) < 2:
        print("  compile time static / dynamic: n/a (target >= 5)")
        return
    dynamic, static = runs[True], runs[False]
    ratio = static["compile"] / dynamic["compile"] if dynamic["compile"] > 0 else float("inf")
    print(f"  compile time static / dynamic: {ratio:.1f}x (target >= 5); wall time static / "
          f"dynamic: {static['wall'] / dynamic['wall']:.2f}x; Dynamo entire_frame_compile "
          f"static / dynamic: {static['dynamo'] / max(dynamic['dynamo'], 1e-9):.1f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and steps; varlen: 20 steps, lengths in [1, 128]")
    parser.add_argument("--only", choices=("transformer", "cnn", "cold", "varlen"))
    parser.add_argument("--varlen-steps", type=int, default=None,
                        help="steps of the variable-length run (default 200, --quick 20)")
    parser.add_argument("--first-step-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clear-cache", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only, never a download
    if args.first_step_child:
        first_step_child(args.clear_cache)
        return

    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
          f"tern device: simulated on the same CPUs; load average {load_average()}")

    sections = {
        "transformer": lambda tmp: bench_training(
            "GPT-2 (2 layers, 128 wide, vocab 512), batch 4 x 64 tokens", gpt2_model,
            gpt2_batch(64), args.quick, targets=True),
        "cnn": lambda tmp: bench_training(
            "CNN (3 x conv-BN-ReLU-pool, linear), batch 8 x 3x32x32", cnn_model, cnn_batch(),
            args.quick, targets=False),
        "cold": bench_cold_warm,
        "varlen": lambda tmp: bench_varlen(args.varlen_steps or (20 if args.quick else 200),
                                           128 if args.quick else MAX_LEN, tmp),
    }
    with tempfile.TemporaryDirectory(prefix="compile-training-") as tmp:
        set_cache_dir(os.path.join(tmp, "step-cache"))
        # Inductor's caches too start empty (its first-step figures are
        # compiles, not cache hits of an earlier run).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor-cache")
        for part, run in sections.items():
            if args.only not in (None, part):
                continue
            try:
                run(tmp)
            except Exception:  # one section's failure is printed; the others still run
                print(f"{part}: FAILED:")
                traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
            torch._dynamo.reset()  # drops the section's compiled models (and their tensors)
            fresh_device_memory()
    # Other work on the machine shows in every figure: say how busy it was.
    print(f"load average at the end {load_average()}")


if __name__ == "__main__":
    main()
