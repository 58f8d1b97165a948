"""Timing helpers: interleaved medians, so that both contestants see the same machine load.

    >>> t = interleaved({"a": lambda: sum(range(100)), "b": lambda: sum(range(200))}, repeats=5)
    >>> sorted(t)                           # median seconds per call, per contestant
    ['a', 'b']
"""
from __future__ import annotations

import statistics
import time
from typing import Callable


def _calls_per_sample(fn: Callable[[], object], min_sample_s: float) -> int:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return max(1, min(1000, int(min_sample_s / max(dt, 1e-7))))


def interleaved(fns: dict[str, Callable[[], object]], repeats: int = 15, warmup: int = 2,
                min_sample_s: float = 0.01, mins: dict[str, float] | None = None,
                samples_out: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Median seconds per call of each function, sampled round-robin (order rotated each round).

    Each function is warmed up ``warmup`` times; a sample is the mean over as many calls
    as fill ``min_sample_s`` (sized once, after warm-up). ``mins``, if given, receives each
    function's fastest sample (less sensitive to a shared machine's load than the median);
    ``samples_out`` every sample, in round order (sample r of each function is from round r).
    """
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    number = {n: _calls_per_sample(fns[n], min_sample_s) for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            fn, k = fns[n], number[n]
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            samples[n].append((time.perf_counter() - t0) / k)
    if mins is not None:
        mins.update({n: min(s) for n, s in samples.items()})
    if samples_out is not None:
        samples_out.update(samples)
    return {n: statistics.median(s) for n, s in samples.items()}


def once_interleaved(makers: dict[str, Callable[[], Callable[[], object]]], repeats: int) -> dict[str, float]:
    """Median seconds of ONE call of a freshly made function (first calls), round-robin.

    ``makers[name]()`` builds a fresh callable (not timed); the call is timed.
    """
    names = list(makers)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            fn = makers[n]()
            t0 = time.perf_counter()
            fn()
            samples[n].append(time.perf_counter() - t0)
    return {n: statistics.median(s) for n, s in samples.items()}


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` single calls (no warm-up: every call is a first call)."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def fmt_s(sec: float) -> str:
    """Human-readable seconds: ``fmt_s(0.0123)`` -> ``'12.3 ms'``."""
    if sec != sec:  # nan
        return "-"
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} us"
    if sec < 1.0:
        return f"{sec * 1e3:.1f} ms" if sec < 0.1 else f"{sec * 1e3:.0f} ms"
    return f"{sec:.2f} s"


def sampled(fns: dict[str, Callable[[], object]], repeats: int = 9, warmup: int = 1,
            min_sample_s: float = 0.01) -> dict[str, tuple[list[float], list[float]]]:
    """Per function, (wall seconds per call, process CPU seconds per call) of each sample,
    sampled round-robin as ``interleaved`` does (order rotated each round). CPU time counts
    every thread of the process (XLA's device threads too): less sensitive to other
    processes on a shared machine than wall time."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    number = {n: _calls_per_sample(fns[n], min_sample_s) for n in names}
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            fn, k = fns[n], number[n]
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(k):
                fn()
            out[n][0].append((time.perf_counter() - t0) / k)
            out[n][1].append((time.process_time() - c0) / k)
    return out
