#!/usr/bin/env bash
# Compares tern's all-reduce with torch.distributed (gloo) and Open MPI on
# this host, in one go: 2 ranks, one process each, pinned to CPUs 0 and 1;
# float32 sum from 8 B to 64 MiB (nccl-tests conventions). The three run
# interleaved, ROUNDS times (tern, MPI, gloo, tern, MPI, gloo, ...), because
# this machine's CPUs drift between a fast and a slow state: compare ratios
# within a round, never figures from different runs. Prints, per size, the
# median over rounds of each implementation's time and bus bandwidth and the
# median of the per-round ratios, checks the targets, and writes the table to
# OUT/table.md and every row to OUT/results.csv.
#
# Usage: scripts/bench-collectives.sh [--rounds N] [--quick] [--out DIR]
#   --quick: sizes by factors of 4 up to 16 MiB, fewer iterations.
# Sets up what it needs: Debian packages (Open MPI) and the venv with torch.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
quick=0
out=bench-collectives-out
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
scripts/install-deps.sh
# The gloo peer runs on torch.distributed: the repository's venv (created and
# filled by scripts/setup-venv.sh) unless PYTHON names another interpreter.
python=${PYTHON:-$(scripts/setup-venv.sh)}
if ! "$python" -c "import torch.distributed" 2>/dev/null; then
  echo "torch is not importable with $python: set PYTHON to an interpreter that has torch" >&2
  exit 1
fi
command -v mpicc >/dev/null || { echo "mpicc missing: run scripts/install-deps.sh" >&2; exit 1; }

build=build-bench-comm
echo "=== building tern_bench_collectives (Release, $build) ==="
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTERN_BUILD_TESTS=OFF \
  -DTERN_BUILD_EXAMPLES=OFF >/dev/null
ninja -C "$build" -j "$(nproc)" tern_bench_collectives >/dev/null
mpicc -O2 -o "$out/mpi_bench_allreduce" bench/collectives_peers/mpi_bench_allreduce.c

# Two passes per implementation: small sizes with many iterations (latency),
# large ones with fewer (bandwidth). In the latency pass the warm-up is as
# deep as the timed batch, so that the first size measured does not pay for
# first touches (tern's command ring grows to hold the whole batch).
if [ "$quick" -eq 1 ]; then
  passes=("-b 8 -e 64K -f 8 -n 500 -w 500" "-b 256K -e 16M -f 4 -n 10 -w 3")
else
  passes=("-b 8 -e 64K -f 2 -n 2000 -w 2000" "-b 128K -e 64M -f 2 -n 20 -w 5")
fi

# Other work on this machine skews everything: say when, and under what load.
when() { echo "$(date -u '+%F %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"; }
started=$(when)
echo "=== start: $started ==="

port=$(( 20000 + RANDOM % 20000 ))
csv="$out/results.csv"
echo "round,impl,collective,ranks,size,count,type,redop,placement,time_us,algbw,busbw,wrong" > "$csv"

run_tern() {
  local args=$1 round=$2 node="bench-comm-$$"
  port=$((port + 1))
  local pids=()
  for r in 0 1; do
    TERN_COMM_ID=127.0.0.1:$port TERN_COMM_RANK=$r TERN_COMM_WORLD_SIZE=2 TERN_SIM_NODE=$node \
      TERN_SIM_TOPOLOGY=1x2x1G taskset -c "$r" "$build/bench/tern_bench_collectives" --csv -c 0 \
      --device-time $args \
      > "$out/tern.$r.txt" &
    pids+=($!)
  done
  wait "${pids[@]}"
  rm -f "/dev/shm/tern-sim-$node"
  grep '^tern' "$out/tern.0.txt" | sed "s/^/$round,/" >> "$csv"
}

run_mpi() {
  local args=$1 round=$2
  mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to core --map-by core \
    --mca btl self,vader "$out/mpi_bench_allreduce" $args > "$out/mpi.txt" 2> "$out/mpi.err"
  grep '^mpi,' "$out/mpi.txt" | sed "s/^/$round,/" >> "$csv"
}

run_gloo() {
  local args=$1 round=$2
  port=$((port + 1))
  local pids=()
  for r in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 OMP_NUM_THREADS=1 \
      taskset -c "$r" "$python" bench/collectives_peers/gloo_bench_allreduce.py $args \
      > "$out/gloo.$r.txt" 2> "$out/gloo.$r.err" &
    pids+=($!)
  done
  wait "${pids[@]}"
  grep '^gloo,' "$out/gloo.0.txt" | sed "s/^/$round,/" >> "$csv"
}

for round in $(seq 1 "$rounds"); do
  for pass in "${passes[@]}"; do
    # gloo is slow at small sizes: it runs a tenth of the iterations there.
    gloo_pass=${pass/-n 2000 -w 2000/-n 200 -w 20}
    gloo_pass=${gloo_pass/-n 500 -w 500/-n 50 -w 5}
    echo "=== round $round/$rounds: $pass ==="
    run_tern "$pass" "$round"
    run_mpi "$pass" "$round"
    run_gloo "$gloo_pass" "$round"
  done
done

python3 - "$csv" "$out/table.md" <<'EOF'
import csv, statistics, sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
# (impl, placement, size) -> round -> (time, busbw)
data = defaultdict(dict)
for r in rows:
    data[(r["impl"], r["placement"], int(r["size"]))][int(r["round"])] = (float(r["time_us"]), float(r["busbw"]))
sizes = sorted({int(r["size"]) for r in rows})
def med(impl, place, size, k):
    v = [x[k] for x in data[(impl, place, size)].values()]
    return statistics.median(v) if v else float("nan")
def ratio(a, b, size, k, inverse=False):
    # Median over rounds of a/b within the same round.
    ra, rb = data[a + (size,)], data[b + (size,)]
    vals = [(rb[r][k] / ra[r][k]) if inverse else (ra[r][k] / rb[r][k]) for r in ra if r in rb and rb[r][k] > 0 and ra[r][k] > 0]
    return statistics.median(vals) if vals else float("nan")
tern, dev, mpi, gloo = ("tern", "out"), ("tern-device", "out"), ("mpi", "out"), ("gloo", "in")
enq = ("tern-enqueue", "out")  # the host's enqueuing alone, per operation
def human(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f: return f"{n // f} {unit}"
    return f"{n} B"
lines = ["| size | tern time (us) | tern busbw (GB/s) | tern device time (us) | tern enqueue (us) | Open MPI time (us) | Open MPI busbw (GB/s) | gloo time (us) | gloo busbw (GB/s) | tern/MPI busbw | tern/gloo busbw | tern device/MPI busbw |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for s in sizes:
    lines.append(f"| {human(s)} | {med(*tern, s, 0):.2f} | {med(*tern, s, 1):.2f} | {med(*dev, s, 0):.2f} | {med(*enq, s, 0):.2f} | {med(*mpi, s, 0):.2f} | {med(*mpi, s, 1):.2f} | "
                 f"{med(*gloo, s, 0):.2f} | {med(*gloo, s, 1):.3f} | {ratio(tern, mpi, s, 1):.2f} | {ratio(tern, gloo, s, 1):.2f} | {ratio(dev, mpi, s, 1):.2f} |")
table = "\n".join(lines)
print(table)
verdicts = []
def target(name, ok):
    verdicts.append(f"- {name}: {'met' if ok else 'MISSED'}")
for s in (1 << 20, 16 << 20):
    if s in sizes:
        g, m = ratio(tern, gloo, s, 1), ratio(tern, mpi, s, 1)
        target(f"busbw at {human(s)} >= 2x gloo ({g:.2f}x)", g >= 2)
        target(f"busbw at {human(s)} >= 1x Open MPI ({m:.2f}x)", m >= 1)
if 8 in sizes:
    lat = ratio(tern, mpi, 8, 0)
    target(f"8 B latency within 2x of Open MPI (tern {med(*tern, 8, 0):.2f} us, MPI {med(*mpi, 8, 0):.2f} us: {lat:.2f}x)", lat <= 2)
    lat = ratio(dev, mpi, 8, 0)
    target(f"8 B latency, device time, within 2x of Open MPI (tern {med(*dev, 8, 0):.2f} us: {lat:.2f}x)", lat <= 2)
print("\n".join(verdicts))
open(sys.argv[2], "w").write(table + "\n\n" + "\n".join(verdicts) + "\n")
EOF
finished=$(when)
echo "Run: started $started; finished $finished; $rounds round(s)$([ "$quick" -eq 1 ] && echo ", --quick")." \
  | tee -a "$out/table.md"
