"""Waiting for a quiet machine between the contenders of a benchmark."""

import os
import threading
import time


def _another_thread_runnable() -> bool:
    """Whether a thread of this process other than the caller is running or
    waiting for a CPU (state R in /proc/self/task/<tid>/stat)."""
    me = threading.get_native_id()
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                line = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name_end = line.rfind(b")")  # the name may hold spaces
        if line[name_end + 2:name_end + 3] == b"R":
            return True
    return False


def settle(cap: float = 0.5) -> None:
    """Waits until the process's other threads have gone quiet: none of them
    runnable in eight looks 0.25 ms apart, at most `cap` seconds. PyTorch's
    OpenMP workers spin for milliseconds after each CPU op (libgomp's
    GOMP_SPINCOUNT: about 7 ms on the AMD Zen 5), and a contender timed while
    they spin shares the CPUs with them, which a program running only that
    contender never does; tern's threads poll for tens of microseconds.

    The threads' states, not the process's CPU clock: a thread that runs
    without a break has its time added only at the scheduler's tick (every
    1-4 ms), so a spinning worker could look idle over a short window (seen in
    bench/tern_bench_kernels.cc: oneDNN's worker spinning through most of the
    kernel timed after it). Where /proc is missing, a 2 ms sleep during which
    the process used under a tenth of a CPU."""
    start = time.perf_counter()
    if not os.path.isdir("/proc/self/task"):
        while time.perf_counter() - start < cap:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            time.sleep(0.002)
            if time.process_time() - cpu0 < 0.1 * (time.perf_counter() - wall0):
                return
        return
    quiet_looks = 0
    while quiet_looks < 8 and time.perf_counter() - start < cap:
        quiet_looks = 0 if _another_thread_runnable() else quiet_looks + 1
        time.sleep(0.00025)
