"""Benchmark the index math: Numba kernels vs NumPy twins at 8, 1,024 and 65,536 shards.

    python benchmarks/bench_index_math.py [--repeats 7] [--min-time 0.02]

Prints the first-call time of every Numba kernel (Numba import + compile, or cache load
when a previous process left the on-disk cache), then, per case, the best-of-repeats time
per call of both versions (each after one warm-up call) and the ratio numpy/numba.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gspmd_py.partitioner import index_math as im  # noqa: E402

SHARDS = (8, 1024, 65536)
MESHES = {8: ((2, 4), (1,)), 1024: ((4, 16, 16), (2, 0)), 65536: ((16, 64, 64), (2, 0))}


def best_time(fn: Callable[[], Any], repeats: int, min_time: float) -> float:
    """Best per-call seconds over ``repeats`` runs of a loop sized to last >= ``min_time``."""
    fn()  # warm-up
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time or number >= 1 << 20:
            break
        number *= 2 if dt * 10 > min_time else 10
    best = dt / number
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def fmt(sec: float) -> str:
    if sec < 1e-3:
        return f"{sec * 1e6:9.1f} us"
    if sec < 1.0:
        return f"{sec * 1e3:9.2f} ms"
    return f"{sec:9.3f} s "


def first_calls() -> list[tuple[str, float]]:
    """Time the very first call of each jitted function (in this process)."""
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("shard_bounds", lambda: im.shard_bounds(10, 4)),
        ("valid_mask", lambda: im.valid_mask(10, 4)),
        ("window_halos", lambda: im.window_halos(10, 4, 3, 1, 1, 1, 1, 1)),
        ("device_groups", lambda: im.device_groups((2, 4), (1,))),
        ("permutation_pairs", lambda: im.permutation_pairs([0, 1], [1, 0])),
        ("offsets_for", lambda: im.offsets_for([0, 1], 3)),
    ]
    out = []
    t0 = time.perf_counter()
    import numba  # noqa: F401  (separate the import from the per-kernel times)
    out.append(("(import numba)", time.perf_counter() - t0))
    for name, fn in calls:
        t0 = time.perf_counter()
        fn()
        out.append((name, time.perf_counter() - t0))
    return out


def cases(k: int) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    n = 1_000_000_007
    n_mask = 16 * k + 5  # c = 17: bool[k, 17]
    n_in = 64 * k + 3
    conv = dict(window=3, stride=1, pad_lo=1, pad_hi=1)
    strided = dict(window=7, stride=2, dilation=2, pad_lo=3, pad_hi=2, lhs_dilation=2)
    shape, axes = MESHES[k]
    return [
        ("shard_bounds(n=1e9+7)", lambda: im.shard_bounds(n, k), lambda: im.shard_bounds_np(n, k)),
        (f"valid_mask(n={n_mask})", lambda: im.valid_mask(n_mask, k),
         lambda: im.valid_mask_np(n_mask, k)),
        (f"window_halos(n={n_in}, w3 same)", lambda: im.window_halos(n_in, k, **conv),
         lambda: im.window_halos_np(n_in, k, **conv)),
        (f"window_halos(n={n_in}, w7 s2 d2 ld2)", lambda: im.window_halos(n_in, k, **strided),
         lambda: im.window_halos_np(n_in, k, **strided)),
        (f"device_groups({shape}, {axes})", lambda: im.device_groups(shape, axes),
         lambda: im.device_groups_np(shape, axes)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.02, help="seconds per timed loop")
    args = ap.parse_args()

    print("First call of each Numba kernel (compile, or load from the on-disk cache):")
    for name, sec in first_calls():
        print(f"  {name:<20s} {fmt(sec)}")
    print()

    header = f"{'shards':>7s}  {'function':<44s} {'numba':>12s} {'numpy':>12s} {'np/nb':>7s}"
    print(header)
    print("-" * len(header))
    for k in SHARDS:
        for label, f_nb, f_np in cases(k):
            t_nb = best_time(f_nb, args.repeats, args.min_time)
            t_np = best_time(f_np, args.repeats, args.min_time)
            print(f"{k:>7d}  {label:<44s} {fmt(t_nb):>12s} {fmt(t_np):>12s} {t_np / t_nb:6.1f}x")
        print()


if __name__ == "__main__":
    main()
