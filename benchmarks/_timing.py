"""Side-by-side timing for the benchmarks: both candidates in one run, medians and ratios."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeat: int = 5, warmup: int = 1, sync=None) -> float:
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_medians(
    fn_a: Callable[[], object], fn_b: Callable[[], object], repeat: int = 15, warmup: int = 2
) -> tuple[float, float, float]:
    """(median a, median b, median of a/b over the pairs), a and b run back to back in
    each round, the order alternating: a neighbour's burst of load on a shared machine
    then lands on both sides of a pair instead of on one candidate's whole series."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for i in range(repeat):
        for fn, times in ((fn_a, times_a), (fn_b, times_b))[:: 1 if i % 2 == 0 else -1]:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times_a, times_b)]
    return statistics.median(times_a), statistics.median(times_b), statistics.median(ratios)


def fmt_seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:8.1f} us"
    if s < 1:
        return f"{s * 1e3:8.2f} ms"
    return f"{s:8.2f} s "
