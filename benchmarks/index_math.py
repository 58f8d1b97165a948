"""Index math: NumPy twins against Numba kernels, warm and cold, and where each pays.

* cold: in a fresh process (after ``import gspmd_py``), the first call of a Numba kernel:
  Numba's import plus loading the kernel from the on-disk cache (filled beforehand);
* warm: per-call times of both versions at 8 to 262,144 shards (after warm-up).

Crossovers, in units of work (what ``index_math.use_numba`` compares; about shards x
inner iterations): warm, the smallest measured work at which the kernel beats the twin;
cold, the work at which the twin's extra time over the kernel's equals loading Numba
(extrapolated from both times per unit of work at the largest size).

    python -m benchmarks --only index
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

from .report import md_table
from .timing import fmt_s

SHARDS = (8, 64, 512, 4096, 32768, 262144)
QUICK_SHARDS = (8, 512, 32768)


def _mesh_for(k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    a = 1 << (int(np.log2(k)) // 2)
    return (a, k // a), (1,)


def cases(k: int) -> dict[str, tuple[int, Callable[[str], Any]]]:
    """kernel -> (work, run(version)) at k shards; version is "np" or "nb"."""
    from gspmd_py.partitioner import index_math as im

    n_in = 64 * k + 3
    strided = dict(window=7, stride=2, dilation=2, pad_lo=3, pad_hi=2, lhs_dilation=2)
    p = im._window_params(n_in, k, strided["window"], strided["stride"], strided["dilation"], strided["pad_lo"],
                          strided["pad_hi"], strided["lhs_dilation"])
    shape, axes = _mesh_for(k)
    c = 4
    a = np.arange(k, dtype=np.int64) * c - 2
    lo, hi = np.maximum(a, 0), np.minimum(a + c + 4, k * c)
    f = lambda name: (lambda v: getattr(im, f"{name}_{v}"))
    return {
        "shard_bounds": (k, lambda v: f("shard_bounds")(v)(1_000_000_007, k)),
        "window_halos": (k * min(p[2], p[8]), lambda v: f("window_halos")(v)(n_in, k, **strided)),
        "device_groups": (k, lambda v: f("device_groups")(v)(shape, axes)),
        "fetch_rounds": (k * ((c + 4) // c + 2), lambda v: f("fetch_rounds")(v)(lo, hi, a, c)),
    }


def _best(fn: Callable[[], Any], min_time: float = 0.02, repeats: int = 5) -> float:
    fn()
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time or number >= 1 << 16:
            break
        number *= 4
    best = dt / number
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _cold_child(name: str) -> dict[str, float]:
    import gspmd_py  # noqa: F401
    from gspmd_py.partitioner import index_math as im  # noqa: F401

    run = cases(8)[name][1]
    t0 = time.perf_counter()
    run("np")
    t1 = time.perf_counter()
    run("nb")
    t2 = time.perf_counter()
    return {"np_first": t1 - t0, "nb_first": t2 - t1}


def cold(names, repeats: int) -> dict[str, dict[str, float]]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for _, run in cases(8).values():  # fill the on-disk cache: cold = load, not compile
        run("nb")
    out = {}
    for name in names:
        samples = []
        for _ in range(repeats):
            p = subprocess.run([sys.executable, "-m", "benchmarks.index_math", name], env=env, cwd=root,
                               capture_output=True, text=True, check=True)
            samples.append(json.loads(p.stdout.strip().splitlines()[-1]))
        out[name] = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    return out


def run(quick: bool) -> str:
    from gspmd_py.partitioner import index_math as im

    shards = QUICK_SHARDS if quick else SHARDS
    names = list(cases(8))
    cold_t = cold(names, 1 if quick else 3)
    warm: dict[str, list[tuple[int, int, float, float]]] = {n: [] for n in names}
    for k in shards:
        for name, (work, fn) in cases(k).items():
            warm[name].append((k, work, _best(lambda: fn("np")), _best(lambda: fn("nb"))))
    rows, summary = [], []
    for name in names:
        for k, work, t_np, t_nb in warm[name]:
            rows.append([name, k, work, fmt_s(t_np), fmt_s(t_nb), f"{t_np / t_nb:.2f}x",
                         "numba" if im.use_numba(name, work) else "numpy"])
        beat = [w for _, w, t_np, t_nb in warm[name] if t_nb < t_np]
        k_last, w_last, t_last, _ = warm[name][-1]
        per_work = t_last / w_last
        cold_s = cold_t[name]["nb_first"]
        nb_per_work = warm[name][-1][3] / w_last
        gain = per_work - nb_per_work
        summary.append([name, fmt_s(cold_t[name]["np_first"]), fmt_s(cold_s), f"{per_work * 1e9:.1f} ns",
                        f"{nb_per_work * 1e9:.1f} ns", f"{min(beat):,}" if beat else f"> {w_last:,}",
                        f"{cold_s / gain:,.0f}" if gain > 0 else "never", f"{im.NUMBA_COLD_WORK[name]:,}"])
    text = "## Index math: NumPy twins vs Numba kernels\n\n"
    text += ("Policy in `index_math.use_numba`: Numba from work >= NUMBA_COLD_WORK[kernel] (last column) in a "
             f"process that has not loaded the kernel, from NUMBA_WARM_WORK = {im.NUMBA_WARM_WORK:,} once it is "
             "loaded; the NumPy twin below.\n\n")
    text += "### Cold (fresh process) and crossovers\n\n"
    text += md_table(["kernel", "first NumPy call", "first Numba call (import + cache load)",
                      "NumPy per unit of work (largest size)", "Numba per unit", "warm crossover (work)",
                      "cold crossover (work, extrapolated)", "NUMBA_COLD_WORK"], summary)
    text += "\n### Warm, per call\n\n"
    text += md_table(["kernel", "shards", "work", "NumPy", "Numba", "NumPy / Numba", "index_math picks (warm)"],
                     rows)
    return text


if __name__ == "__main__":
    print(json.dumps(_cold_child(sys.argv[1])))
