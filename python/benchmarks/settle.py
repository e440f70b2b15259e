"""Waiting for a quiet machine between the contenders of a benchmark."""

import time


def settle(cap: float = 0.5) -> None:
    """Waits until the process's other threads have gone quiet: a 2 ms sleep
    during which the process used under a tenth of a CPU, at most `cap`
    seconds. PyTorch's OpenMP workers spin for milliseconds after each CPU op
    (libgomp's GOMP_SPINCOUNT), and a contender timed while they spin shares
    the CPUs with them, which a program running only that contender never
    does; tern's threads poll for tens of microseconds."""
    start = time.perf_counter()
    while time.perf_counter() - start < cap:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(0.002)
        if time.process_time() - cpu0 < 0.1 * (time.perf_counter() - wall0):
            return
