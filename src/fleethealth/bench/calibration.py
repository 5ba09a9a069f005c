"""The CPU calibration figure every benchmark prints next to its timings."""

from __future__ import annotations

import time


def cpu_calibration_ms() -> float:
    """CPU time (``time.process_time``, the clock the rates use) of a fixed pure-Python loop, best of three,
    so numbers from a busy machine can be judged: about 13 ms on an idle core of the 2-core box this was
    tuned on, 18-35 ms while others run (a shared core's caches and memory bandwidth slow this process's
    CPU time too)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        sum(range(1_000_000))
        best = min(best, time.process_time() - t0)
    return round(best * 1000, 2)
