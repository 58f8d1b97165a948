"""Index math: the NumPy definitions against the Numba kernels they replaced, and whether Numba pays.

gspmd_py's tables (partitioner/index_math.py, partitioner/halo_tables.py, core/fine_mesh.py's
device_groups) are one vectorised NumPy definition each.
Until commit ``REF_COMMIT`` every table also had a loop kernel compiled by Numba; this
benchmark loads those kernels from git (``git show REF_COMMIT:...``: no copy of them lives
in the tree) into a scratch package, so the decision to drop them stays measurable:

* per kernel and size: the NumPy definition (what planning runs), the loop kernel run
  uncompiled (plain Python, the other way to write the math once) and compiled by Numba
  (warm: after its first call);
* cold: the first call of a Numba kernel in a fresh process (Numba's import plus loading
  the kernel from the on-disk cache, filled beforehand);
* crossovers in units of work (about shards x inner iterations): warm, the smallest measured
  work from which the Numba kernel beats NumPy; cold, the work at which NumPy's extra time
  over Numba's equals the cold load (extrapolated from the largest size); the same two for
  the uncompiled loop kernel against Numba;
* planning: plan time of a 5x5 SAME conv with H split over all devices of abstract meshes of
  8,192 to 65,536 devices, and a gp.auto_shard of a 3-conv net, with the NumPy tables and
  with the Numba kernels swapped in (warm), side by side; and a first plan in a fresh process.

    python -m benchmarks --only index
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Any, Callable

import numpy as np

from .report import md_table
from .timing import fmt_s

#: The last commit with the Numba kernels (index_math.py and halo_tables.py).
REF_COMMIT = "3d1ec47bce5dbaafd4907f55573e898be5a2c598"
SHARDS = (8, 64, 512, 4096, 32768, 262144)
QUICK_SHARDS = (8, 512, 32768)
PY_MAX_SHARDS = 32768  # the uncompiled loop kernels take seconds beyond
PLAN_MESHES = ((64, 128), (128, 256), (256, 256))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def ref() -> tuple[ModuleType, ModuleType]:
    """(index_math, halo_tables) as of REF_COMMIT, importable as ``_gspmd_numba_ref.*``,
    their Numba kernels cached on disk next to the scratch copies."""
    pkg = "_gspmd_numba_ref"
    base = os.path.join(tempfile.gettempdir(), f"gspmd_py_index_ref_{REF_COMMIT[:12]}")
    os.makedirs(os.path.join(base, pkg), exist_ok=True)
    for name in ("index_math", "halo_tables"):
        text = subprocess.run(["git", "-C", ROOT, "show", f"{REF_COMMIT}:gspmd_py/partitioner/{name}.py"],
                              capture_output=True, text=True, check=True).stdout
        old = 'cacheable = kernel.__module__.startswith("gspmd_py.partitioner.")'
        if name == "index_math":
            assert old in text, "REF_COMMIT's _jit changed"
            text = text.replace(old, "cacheable = True")
        path = os.path.join(base, pkg, f"{name}.py")
        if not os.path.exists(path) or open(path).read() != text:
            with open(path, "w") as fh:
                fh.write(text)
    open(os.path.join(base, pkg, "__init__.py"), "a").close()
    if base not in sys.path:
        sys.path.insert(0, base)
    return importlib.import_module(f"{pkg}.index_math"), importlib.import_module(f"{pkg}.halo_tables")


def _mesh_for(k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    a = 1 << (int(np.log2(k)) // 2)
    return (a, k // a), (1,)


def cases(k: int) -> dict[str, tuple[int, Callable[[str], Any]]]:
    """kernel -> (work, run(version)) at k shards; version: "np" (gspmd_py's definition),
    "py" (the old loop kernel, uncompiled) or "nb" (the old loop kernel under Numba)."""
    from gspmd_py.core import fine_mesh as fm
    from gspmd_py.partitioner import halo_tables as ht
    from gspmd_py.partitioner import index_math as im

    rim, rht = ref()
    n_in = 64 * k + 3
    strided = dict(window=7, stride=2, dilation=2, pad_lo=3, pad_hi=2, lhs_dilation=2)
    wargs = (n_in, k, *strided.values())
    p = rim._window_params(*wargs)
    shape, axes = _mesh_for(k)
    c = 4
    a = np.arange(k, dtype=np.int64) * c - 2
    lo, hi = np.maximum(a, 0), np.minimum(a + c + 4, k * c)

    def version(np_fn, nb_fn, kernel, prep):
        return lambda v: (np_fn() if v == "np" else nb_fn() if v == "nb" else kernel(*prep()))

    I = rim.I64
    return {
        "shard_bounds": (k, version(lambda: im.shard_bounds(1_000_000_007, k), lambda: rim.shard_bounds_nb(1_000_000_007, k),
                                    rim._shard_bounds_kernel, lambda: (I(1_000_000_007), I(k)))),
        "window_halos": (k * min(p[2], p[8]), version(lambda: im.window_halos(*wargs), lambda: rim.window_halos_nb(*wargs),
                                                      rim._window_halos_kernel, lambda: [I(v) for v in rim._window_params(*wargs)])),
        "device_groups": (k, version(lambda: fm.device_groups(shape, axes), lambda: rht.device_groups_nb(shape, axes),
                                     rht._device_groups_kernel, lambda: rht._mesh_args(shape, axes))),
        "fetch_rounds": (k * ((c + 4) // c + 2), version(lambda: ht.fetch_rounds(lo, hi, a, c), lambda: rht.fetch_rounds_nb(lo, hi, a, c),
                                                         rht._fetch_rounds_kernel, lambda: rht._fetch_args(lo, hi, a, c, None))),
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


def _child(argv: list[str]) -> dict[str, float]:
    """In a fresh process: the first call of a kernel (``kernel NAME``) or a first plan
    (``plan SHAPE np|nb``)."""
    import gspmd_py  # noqa: F401

    if argv[0] == "kernel":
        run = cases(8)[argv[1]][1]
        t0 = time.perf_counter()
        run("np")
        t1 = time.perf_counter()
        run("nb")
        t2 = time.perf_counter()
        return {"np_first": t1 - t0, "nb_first": t2 - t1}
    shape = tuple(int(s) for s in argv[1].split("x"))
    if argv[2] == "nb":
        _swap_in_numba()
    make, avals = _conv_all(shape)
    t0 = time.perf_counter()
    make().plan(*avals)
    return {"plan": time.perf_counter() - t0}


def _fresh(args: list[str], repeats: int) -> dict[str, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    samples = []
    for _ in range(repeats):
        p = subprocess.run([sys.executable, "-m", "benchmarks.index_math", *args], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True)
        samples.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


# -- planning with the NumPy tables / the Numba kernels swapped in --------------------------------

def _swap_in_numba() -> Callable[[], None]:
    """Route the partitioner's table calls to REF_COMMIT's Numba kernels; returns the undo."""
    from gspmd_py.core import fine_mesh as fm
    from gspmd_py.partitioner import halo_tables as ht
    from gspmd_py.partitioner import index_math as im

    rim, rht = ref()
    saved = [(im, "window_halos", im.window_halos), (ht, "fetch_rounds", ht.fetch_rounds),
             (fm, "device_groups", fm.device_groups)]
    im.window_halos, ht.fetch_rounds, fm.device_groups = rim.window_halos_nb, rht.fetch_rounds_nb, rht.device_groups_nb

    def undo() -> None:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    return undo


def _conv_all(shape: tuple[int, int]):
    """One 5x5 SAME conv, H split over every device (the halo tables have a row per device)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import gspmd_py as gp

    n = shape[0] * shape[1]
    mesh = gp.Mesh.abstract(shape, ("x", "y"))
    spec = gp.P(None, ("x", "y"), None, None)
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    S = jax.ShapeDtypeStruct
    avals = [S((2, 16 * n + 3, 8, 4), jnp.float32), S((5, 5, 4, 4), jnp.float32)]
    return (lambda: gp.spmd(lambda x, w: conv(x, w), mesh, in_shardings=(spec, None), out_shardings=spec)), avals


def _search(shape: tuple[int, int]) -> Callable[[], Any]:
    """gp.auto_shard of three 3x3 SAME convs on an abstract mesh (prices candidates by planning)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import gspmd_py as gp

    n = shape[0] * shape[1]
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def net(x, w1, w2, w3):
        h = jax.nn.relu(conv(x, w1))
        h = jax.nn.relu(conv(h, w2))
        return conv(h, w3).sum()

    S = jax.ShapeDtypeStruct
    avals = [S((8, 4 * n, 64, 16), jnp.float32)] + [S((3, 3, 16, 16), jnp.float32)] * 3
    mesh = gp.Mesh.abstract(shape, ("x", "y"))
    return lambda: gp.auto_shard(net, mesh, *avals, time_budget_s=600)


def planning(quick: bool) -> str:
    meshes = PLAN_MESHES[::2] if quick else PLAN_MESHES
    reps = 2 if quick else 5
    rows = []
    for shape in meshes:
        make, avals = _conv_all(shape)
        tables = {}
        for v in ("np", "nb", "np", "nb"):  # warm-up round, then measured rounds, interleaved
            undo = _swap_in_numba() if v == "nb" else (lambda: None)
            try:
                tables[v] = [median_plan(make, avals, reps)]
            finally:
                undo()
        n = shape[0] * shape[1]
        rows.append(["conv, H over all devices", f"{n:,}", fmt_s(tables["np"][0]), fmt_s(tables["nb"][0]),
                     f"{tables['np'][0] / tables['nb'][0]:.2f}x"])
    for shape in meshes[::-1][:1] + meshes[:1]:
        run = _search(shape)
        t = {}
        for v in ("np", "nb", "np", "nb"):
            undo = _swap_in_numba() if v == "nb" else (lambda: None)
            try:
                t0 = time.perf_counter()
                run()
                t[v] = time.perf_counter() - t0
            finally:
                undo()
        rows.append(["gp.auto_shard, 3 convs", f"{shape[0] * shape[1]:,}", fmt_s(t["np"]), fmt_s(t["nb"]),
                     f"{t['np'] / t['nb']:.2f}x"])
    cold_rows = []
    for shape in (meshes[0], meshes[-1]):
        label = f"{shape[0]}x{shape[1]}"
        c_np = _fresh(["plan", label, "np"], 1 if quick else 3)["plan"]
        c_nb = _fresh(["plan", label, "nb"], 1 if quick else 3)["plan"]
        cold_rows.append([f"{shape[0] * shape[1]:,}", fmt_s(c_np), fmt_s(c_nb), f"{c_np / c_nb:.2f}x"])
    text = ("### Planning at 8,192-65,536 abstract devices: NumPy tables vs the Numba kernels swapped in\n\n"
            "Warm: the kernels loaded before timing (median of repeats; the search: one run, after a warm-up run).\n\n")
    text += md_table(["program", "devices", "NumPy tables", "Numba kernels (warm)", "NumPy / Numba"], rows)
    text += "\nFirst plan in a fresh process (after `import gspmd_py`; Numba: import + cache load included):\n\n"
    text += md_table(["devices", "NumPy tables", "Numba kernels (cold)", "NumPy / Numba"], cold_rows)
    return text


def median_plan(make, avals, reps: int) -> float:
    ts = []
    for _ in range(reps):
        f = make()
        t0 = time.perf_counter()
        f.plan(*avals)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _check_same(name: str, x: Any, y: Any) -> None:
    """The NumPy definition and the old Numba kernel agree (else the comparison is void)."""
    if isinstance(x, dict):
        x, y = [x[key] for key in sorted(x)], [y[key] for key in sorted(y)]
    for u, v in zip(x if isinstance(x, (tuple, list)) else [x], y if isinstance(y, (tuple, list)) else [y]):
        if not np.array_equal(np.asarray(u), np.asarray(v)):
            raise AssertionError(f"{name}: NumPy and Numba results differ")


def _crossover(cold_s: float, slow_per_work: float, fast_per_work: float) -> str:
    gain = slow_per_work - fast_per_work
    return f"{cold_s / gain:,.0f}" if gain > 0 else "never"


def run(quick: bool) -> str:
    shards = QUICK_SHARDS if quick else SHARDS
    names = list(cases(8))
    for _, fn in cases(8).values():  # fill the on-disk cache: cold = load, not compile
        fn("nb")
    cold_t = {name: _fresh(["kernel", name], 1 if quick else 3) for name in names}
    warm: dict[str, list[tuple[int, int, float, float, float]]] = {n: [] for n in names}
    for k in shards:
        for name, (work, fn) in cases(k).items():
            _check_same(name, fn("np"), fn("nb"))
            t_py = _best(lambda: fn("py"), repeats=2) if k <= PY_MAX_SHARDS else float("nan")
            warm[name].append((k, work, _best(lambda: fn("np")), t_py, _best(lambda: fn("nb"))))
    rows, summary = [], []
    for name in names:
        for k, work, t_np, t_py, t_nb in warm[name]:
            rows.append([name, f"{k:,}", f"{work:,}", fmt_s(t_np), "-" if t_py != t_py else fmt_s(t_py), fmt_s(t_nb),
                         f"{t_np / t_nb:.2f}x", "-" if t_py != t_py else f"{t_py / t_nb:.1f}x"])
        cold_s = cold_t[name]["nb_first"]
        _, w_last, np_last, _, nb_last = warm[name][-1]
        py_rows = [r for r in warm[name] if r[3] == r[3]]
        _, w_py, _, py_last, nb_py = py_rows[-1]
        beat_np = [w for _, w, t_np, _, t_nb in warm[name] if t_nb < t_np]
        beat_py = [w for _, w, _, t_py, t_nb in py_rows if t_nb < t_py]
        summary.append([name, fmt_s(cold_t[name]["np_first"]), fmt_s(cold_s),
                        f"{np_last / w_last * 1e9:.1f} ns", f"{py_last / w_py * 1e9:.0f} ns", f"{nb_last / w_last * 1e9:.1f} ns",
                        f"{min(beat_py):,}" if beat_py else f"> {w_py:,}",
                        _crossover(cold_s, py_last / w_py, nb_py / w_py),
                        f"{min(beat_np):,}" if beat_np else f"> {w_last:,}",
                        _crossover(cold_s, np_last / w_last, nb_last / w_last)])
    text = "## Index math: NumPy definitions vs the Numba kernels they replaced\n\n"
    text += (f"gspmd_py runs one vectorised NumPy definition per table, always: there is no Numba path and no "
             f"dispatcher (threshold: none). The loop kernels below are those of commit {REF_COMMIT[:10]}, loaded from "
             "git, run uncompiled (plain Python) and under Numba. Work: about shards x inner iterations; "
             "largest planned meshes: 65,536 devices are ~2x10^5 units for window_halos/fetch_rounds.\n\n")
    text += "### Cold (fresh process) and crossovers\n\n"
    text += md_table(["kernel", "first NumPy call", "first Numba call (import + cache load)",
                      "NumPy per unit (largest size)", "loop uncompiled per unit", "Numba per unit",
                      "Numba beats uncompiled from (work, warm)", "... cold (work, extrapolated)",
                      "Numba beats NumPy from (work, warm)", "... cold (work, extrapolated)"], summary)
    text += "\n### Warm, per call\n\n"
    text += md_table(["kernel", "shards", "work", "NumPy (gspmd_py)", "loop uncompiled", "loop under Numba",
                      "NumPy / Numba", "uncompiled / Numba"], rows)
    text += "\n" + planning(quick)
    return text


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1:])))
