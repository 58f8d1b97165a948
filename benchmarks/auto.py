"""``python -m benchmarks --only auto``: the searched plan against hand-written ones.

* reference programs (benchmarks/programs.py, on their (2, 4) meshes of 8 CPU devices): the
  program's own hand-written plan (data parallel + Megatron, the GSPMD 2D FFN, the spatial
  conv net), data parallel over all 8 devices, ZeRO (``gp.tactics.zero`` on both axes,
  training steps only) and replicated, beside ``gp.auto_shard``'s plan searched on this
  machine's calibrated hardware (``gp.Hardware.calibrate``, once per run: about 9 s) and
  on the h100-node preset; each plan predicted on both, and measured here;
* search time on deeper programs: a transformer block's training step, a scanned 24-layer
  stack's and 24 unrolled blocks' (small dims);
* the search's pre-screen (gspmd_py/search/tables.py): every reference program and deeper
  program searched twice in one run, without the cost tables (every neighbour priced by
  tracing its per-device program) and with them (neighbours ranked by the tables, the best
  few traced): search time, candidates, and the chosen plan's predicted step, side by side;
  and the tables' kernel (``table_sums``) uncompiled against Numba (warm, and its first call
  in a fresh process) by table size: the crossover;
* the GSPMD paper's DenseLm layer (d_model 8192, FFN 65536, 128 heads x 128, sequence
  1024; forward) on 128 / 512 / 2,048 TPU v3 cores (abstract meshes, tpu-v3 preset,
  16 GiB per core): the searched plan's predicted step beside the paper's 2D plan's, for one
  layer and for the whole 64-layer model (scanned over stacked weights).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp

from .programs import gp_constrain, programs
from .report import md_table
from .timing import fmt_s, interleaved

P = gp.P
BF16, F32 = jnp.bfloat16, jnp.float32

# (reference program, the name of its own hand-written plan, is it a training step)
REFERENCE = (("megatron_mlp", "data parallel (x) + Megatron (y)", False),
             ("block_grad", "data parallel (x) + Megatron (y)", True),
             ("ffn_2d", "2D (GSPMD 2D FFN)", False),
             ("conv_net", "spatial (H over y, batch over x)", False),
             ("scan_block_grad", "data parallel (x) + Megatron (y)", True))


@functools.lru_cache(maxsize=None)
def calibrated(mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> gp.Hardware:
    """This machine over the mesh, measured once per benchmark run (cached)."""
    t0 = time.perf_counter()
    hw = gp.Hardware.calibrate(gp.Mesh(mesh_shape, axis_names))
    print(f"  calibrated {mesh_shape} in {time.perf_counter() - t0:.1f} s: matmul "
          f"{hw.peak('float32') / 1e9:.1f} GFLOP/s per device, step overhead {hw.step_overhead * 1e3:.2f} ms",
          flush=True)
    return hw


def _hand_plans(prog, args, mesh, train: bool, own: str) -> dict:
    """name -> gp.Spmd of each hand-written plan that applies to the program."""
    names = mesh.axis_names
    out = {own: gp.spmd(prog.make(gp_constrain), mesh, in_shardings=prog.in_specs, out_shardings=prog.out_specs)}
    plain = prog.make(lambda x, spec: x)
    b = args[0].shape[0]
    batch_axes = tuple(names) if b % mesh.size == 0 else names[:1]
    dp = (P(batch_axes, *([None] * (args[0].ndim - 1))),) + (None,) * (len(args) - 1)
    out[f"data parallel ({','.join(batch_axes)})"] = gp.spmd(plain, mesh, in_shardings=dp)
    if train:
        weights = tuple(range(1, len(args)))
        tac = [gp.tactics.batch(a, argnums=(0,)) for a in batch_axes]
        tac += [gp.tactics.zero(a, argnums=weights) for a in names]
        out[f"ZeRO ({','.join(names)}) + data parallel"] = gp.spmd(plain, mesh, tactics=tac)
    out["replicated"] = gp.spmd(plain, mesh, in_shardings=(None,) * len(args))
    return out


def _specs(f, args) -> tuple:
    """A plan's in and out shardings, as text: equal for the same plan reached two ways."""
    plan = f.plan(*args)
    return str(plan.in_shardings), str(plan.out_shardings)


def reference(quick: bool) -> tuple[str, list[str]]:
    preset = gp.Hardware.preset("h100-node")
    rows, notes = [], []
    for name, own, train in REFERENCE:
        prog = programs()[name]
        mesh = gp.Mesh(prog.mesh_shape, prog.axis_names)
        cal = calibrated(prog.mesh_shape, prog.axis_names)
        args = prog.args(quick)
        plain = prog.make(lambda x, spec: x)
        plans = _hand_plans(prog, args, mesh, train, own)
        searched = {}
        for label, hw in (("searched (calibrated)", cal), ("searched (h100-node)", preset)):
            t0 = time.perf_counter()
            res = gp.auto_shard(plain, mesh, *args, hardware=hw, time_budget_s=60)
            searched[label] = (res, time.perf_counter() - t0)
            plans[label] = res.spmd
        pred = {k: (f.plan(*args).cost(cal), f.plan(*args).cost(preset)) for k, f in plans.items()}
        fastest: dict = {}  # the fastest sample per plan: what the ratios use (a shared machine's load
        # slows some samples of any plan; the fastest is the least disturbed)
        med = interleaved({k: (lambda f=f: jax.block_until_ready(f(*args))) for k, f in plans.items()},
                          repeats=7 if quick else 15, warmup=1, mins=fastest)
        meas = fastest
        same = {k: next((h for h in plans if not h.startswith("searched") and _specs(plans[h], args) == _specs(f, args)),
                        None) for k, f in plans.items() if k.startswith("searched")}
        hand = [k for k in plans if not k.startswith("searched")]
        best_meas = min(hand, key=lambda k: meas[k])
        best_cal = min(hand, key=lambda k: pred[k][0].step_s)
        best_pre = min(hand, key=lambda k: pred[k][1].step_s)
        for i, (k, f) in enumerate(plans.items()):
            c, p = pred[k]
            srch = ""
            if k in searched:
                res, st = searched[k]
                srch = f"{st:.1f} s ({res.explored} cand.)"
            label = k + (f" (= {same[k]})" if same.get(k) else "")
            rows.append([prog.title if i == 0 else "", label, fmt_s(c.step_s), f"{fmt_s(meas[k])} ({fmt_s(med[k])})",
                         f"{meas[k] / meas[best_meas]:.2f}x", fmt_s(p.step_s), f"{c.comm_bytes / 2**20:.2f} MiB", srch])
        sc = "searched (calibrated)"
        sp = "searched (h100-node)"
        line = (f"{prog.title}: searched (calibrated) measured {fmt_s(meas[sc])} vs best hand-written "
                f"{fmt_s(meas[best_meas])} ({best_meas}) = {meas[sc] / meas[best_meas]:.2f}x; predicted "
                f"{fmt_s(pred[sc][0].step_s)} vs {fmt_s(pred[best_cal][0].step_s)} ({best_cal}) calibrated, "
                f"{fmt_s(pred[sp][1].step_s)} vs {fmt_s(pred[best_pre][1].step_s)} ({best_pre}) on h100-node")
        print("  " + line, flush=True)
        notes.append(line)
    table = md_table(["program", "plan", "predicted (calibrated)", "measured: fastest (median)", "vs best hand measured",
                      "predicted (h100-node)", "collective bytes", "search"], rows)
    return table, notes


# -- search time on deeper programs -------------------------------------------------------
DEEP = 24


def _deep_programs(quick: bool):
    from gspmd_py.demo import transformer_block

    from .programs import block_shapes

    S = jax.ShapeDtypeStruct
    sh = block_shapes(8, 32, 64, 4, 16, 256)
    x = S(sh[0][0], F32)

    def one_block(x, *w):
        return jax.grad(lambda *w: transformer_block(x, *w).sum(), argnums=tuple(range(8)))(*w)

    def unrolled(params, x):
        def loss(params):
            h = x
            for w in params:
                h = transformer_block(h, *w)
            return h.sum()
        return jax.grad(loss)(params)

    def scanned(stack, x):
        def loss(stack):
            h, _ = lax.scan(lambda h, w: (transformer_block(h, *w), None), x, stack)
            return h.sum()
        return jax.grad(loss)(stack)

    yield "transformer block training step", one_block, [x] + [S(s, F32) for s, _ in sh[1:]], 10
    yield f"scanned {DEEP}-layer stack training step", scanned, [[S((DEEP,) + s, F32) for s, _ in sh[1:]], x], 60
    if not quick:
        yield (f"{DEEP} unrolled blocks training step", unrolled,
               [[[S(s, F32) for s, _ in sh[1:]] for _ in range(DEEP)], x], 60)


def _searched(fn, mesh, args, hw, budget: float, screen: bool):
    """gp.auto_shard with the pre-screen on or off: (result, seconds)."""
    from gspmd_py.search import optimizer

    saved = optimizer.SCREEN
    optimizer.SCREEN = screen
    try:
        t0 = time.perf_counter()
        res = gp.auto_shard(fn, mesh, *args, hardware=hw, time_budget_s=budget)
        return res, time.perf_counter() - t0
    finally:
        optimizer.SCREEN = saved


def _ab_cells(before, after, budget: float) -> list[str]:
    (rb, tb), (ra, ta) = before, after
    cut = lambda r: f" ({r.search.stopped_by} budget reached)" if r.search.stopped_by else ""
    pb, pa = rb.cost.step_s, ra.cost.step_s
    verdict = ("same plan" if rb.search.best.actions == ra.search.best.actions
               else "better" if pa < pb * (1 - 1e-9) else "equal step" if pa <= pb * (1 + 1e-9) else "WORSE")
    return [f"{tb:.1f} s{cut(rb)}", f"{rb.explored} / {rb.search.programs}", fmt_s(pb),
            f"{ta:.1f} s{cut(ra)}", f"{ra.explored} / {ra.search.programs} / {ra.search.screened}", fmt_s(pa),
            f"{tb / ta:.2f}x", verdict]


AB_HEAD = ["without tables: search", "candidates / programs", "predicted", "with tables: search",
           "candidates / programs / screened", "predicted", "speedup", "plan"]


def search_times(quick: bool) -> str:
    mesh = gp.Mesh((2, 4), ("x", "y"))
    hw = calibrated((2, 4), ("x", "y"))
    rows = []
    for name, fn, args, target in _deep_programs(quick):
        before = _searched(fn, mesh, args, hw, 120, False)
        after = _searched(fn, mesh, args, hw, 120, True)
        s = after[0].search
        best_hand = min(c.price.step_s for _, c in s.baselines)
        rows.append([name, f"<= {target} s", str(len(s.classes))] + _ab_cells(before, after, 120) + [fmt_s(best_hand)])
        print(f"  search {name}: {before[1]:.1f} s without tables, {after[1]:.1f} s with (target {target} s); "
              f"predicted {fmt_s(before[0].cost.step_s)} / {fmt_s(after[0].cost.step_s)}", flush=True)
    return md_table(["program (small dims, (2, 4) mesh, calibrated)", "target", "decision classes"] + AB_HEAD
                    + ["best start (hand-written) predicted"], rows)


def prescreen_reference(quick: bool) -> str:
    """The reference programs searched without and with the cost tables (calibrated, h100-node)."""
    preset = gp.Hardware.preset("h100-node")
    rows = []
    for name, _, _ in REFERENCE:
        prog = programs()[name]
        mesh = gp.Mesh(prog.mesh_shape, prog.axis_names)
        args = prog.args(quick)
        plain = prog.make(lambda x, spec: x)
        for label, hw in (("calibrated", calibrated(prog.mesh_shape, prog.axis_names)), ("h100-node", preset)):
            before = _searched(plain, mesh, args, hw, 60, False)
            after = _searched(plain, mesh, args, hw, 60, True)
            rows.append([prog.title, label] + _ab_cells(before, after, 60))
            print(f"  pre-screen {prog.title} ({label}): {before[1]:.1f} s -> {after[1]:.1f} s, predicted "
                  f"{fmt_s(before[0].cost.step_s)} -> {fmt_s(after[0].cost.step_s)}", flush=True)
    return md_table(["program", "hardware"] + AB_HEAD, rows)


# -- the tables' kernel: uncompiled vs Numba ---------------------------------------------------
KERNEL_SIZES = ((739, 8), (739, 64), (18_000, 8), (18_000, 64), (100_000, 64))


def _kernel_args(terms: int, cands: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows, groups = max(terms // 2, 2), 16
    table = rng.random((rows, 2))
    grp = rng.integers(-1, groups, (rows, 2))
    mult = rng.integers(1, 4, terms).astype(np.float64)
    return rng.integers(0, rows, (cands, terms)), mult, mult, table, grp, rng.random(groups)


def _kernel_child(cache_dir: str) -> None:
    """In a fresh process: the first compiled call (numba import + compile or cache load)."""
    os.environ["NUMBA_CACHE_DIR"] = cache_dir
    t0 = time.perf_counter()
    from gspmd_py.search import tables

    tables.sums(*_kernel_args(739, 8), use_numba=True)
    print(json.dumps({"first": time.perf_counter() - t0}))


def _first_call(cache_dir: str) -> float:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"from benchmarks.auto import _kernel_child; _kernel_child({cache_dir!r})"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["first"]


def kernel_crossover(quick: bool) -> tuple[str, str]:
    import tempfile

    from gspmd_py.search import tables

    try:
        import numba  # noqa: F401
    except ImportError:
        return "numba is not installed: the kernel runs uncompiled only.", ""
    with tempfile.TemporaryDirectory() as d:
        cold = _first_call(d)  # nothing cached: import + compile
        warm_load = min(_first_call(d) for _ in range(2 if quick else 3))  # compiled once: import + cache load
    rows, cross = [], None
    for terms, cands in KERNEL_SIZES[: 4 if quick else None]:
        args = _kernel_args(terms, cands)
        t_py = _best_of(lambda: tables.sums(*args, use_numba=False), 1 if terms * cands > 5e6 else 3)
        t_nb = _best_of(lambda: tables.sums(*args, use_numba=True), 5)
        assert np.array_equal(tables.sums(*args, use_numba=False), tables.sums(*args, use_numba=True))
        rows.append([f"{terms:,} x {cands}", f"{terms * cands:,}", fmt_s(t_py), fmt_s(t_nb), f"{t_py / t_nb:.0f}x",
                     f"{warm_load / max(t_py - t_nb, 1e-12):.1f}"])
        if cross is None and t_py - t_nb >= warm_load:
            cross = terms * cands
    note = (f"numba's first compiled call in a fresh process: {fmt_s(cold)} with nothing cached (import + compile), "
            f"{fmt_s(warm_load)} from the on-disk cache (import + load). One uncompiled call costs as much as that "
            + (f"from about {cross:,} (candidate, term) pairs" if cross else "at none of these sizes")
            + f"; a search switches to the compiled kernel once its tables have summed tables.NUMBA_MIN_PAIRS = "
            f"{tables.NUMBA_MIN_PAIRS:,} pairs uncompiled.")
    return md_table(["terms x candidates", "(candidate, term) pairs", "uncompiled", "numba (warm)", "ratio",
                     "calls to repay the cached load"], rows), note


def _best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# -- DenseLm layer (GSPMD paper) ------------------------------------------------------------
M, H, NH, D, L = 8192, 65536, 128, 128, 1024
LAYER_SPECS = {"wq": P("x", "y", None), "wk": P("x", "y", None), "wv": P("x", "y", None), "wo": P("y", None, "x"),
               "wi0": P("x", "y"), "wi1": P("x", "y"), "wout": P("y", "x"), "ln1": P("y"), "ln2": P("y")}


def _rms(x, scale):
    x32 = x.astype(F32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6) * scale).astype(BF16)


def dense_layer(p, x):
    h = _rms(x, p["ln1"])
    q = jnp.einsum("blm,mhd->blhd", h, p["wq"].astype(BF16))
    k = jnp.einsum("blm,mhd->blhd", h, p["wk"].astype(BF16))
    v = jnp.einsum("blm,mhd->blhd", h, p["wv"].astype(BF16))
    w = jax.nn.softmax(jnp.einsum("blhd,bshd->bhls", q, k, preferred_element_type=F32) * D ** -0.5, axis=-1)
    o = jnp.einsum("bhls,bshd->blhd", w.astype(BF16), v)
    x = x + jnp.einsum("blhd,hdm->blm", o, p["wo"].astype(BF16))
    h = _rms(x, p["ln2"])
    ff = jax.nn.gelu(h @ p["wi0"].astype(BF16)) * (h @ p["wi1"].astype(BF16))
    return x + ff @ p["wout"].astype(BF16)


LAYERS = 64  # DenseLm128B's depth


def dense_model(p, x):
    """The whole DenseLm: ``LAYERS`` layers scanned over weights stacked ``[LAYERS, ...]``."""
    return lax.scan(lambda h, lp: (dense_layer(lp, h), None), x, p)[0]


def denselm(quick: bool, layers: int = 1) -> str:
    """The searched plan beside the paper's 2D plan, for one layer (``layers=1``) or the
    whole model scanned over ``layers`` stacked layers, under 16 GiB per core."""
    S = jax.ShapeDtypeStruct
    hw = gp.Hardware.preset("tpu-v3")
    shapes = {"wq": (M, NH, D), "wk": (M, NH, D), "wv": (M, NH, D), "wo": (NH, D, M), "wi0": (M, H), "wi1": (M, H),
              "wout": (H, M), "ln1": (M,), "ln2": (M,)}
    lead = () if layers == 1 else (layers,)
    p = {k: S(lead + s, F32) for k, s in shapes.items()}
    specs = LAYER_SPECS if layers == 1 else {k: P(None, *v) for k, v in LAYER_SPECS.items()}
    fn = dense_layer if layers == 1 else dense_model
    rows = []
    configs = [((8, 16), 16), ((16, 32), 128), ((32, 64), 512)][: 1 if quick else 3]
    for mesh_shape, batch in configs:
        mesh = gp.Mesh.abstract(mesh_shape, ("x", "y"))
        x = S((batch, L, M), BF16)
        paper = gp.spmd(fn, mesh, in_shardings=(specs, P("x", None, "y"))).plan(p, x).cost(hw)
        t0 = time.perf_counter()
        res = gp.auto_shard(fn, mesh, p, x, hardware=hw, memory_limit=16 * 2**30, time_budget_s=60)
        search_s = time.perf_counter() - t0
        c = res.cost
        rows.append([f"{mesh.size} cores {mesh_shape}, batch {batch}", f"{paper.step_s * 1e3:.2f} ms",
                     f"{paper.peak_memory_bytes / 2**30:.2f} GiB", f"{c.step_s * 1e3:.2f} ms",
                     f"{c.peak_memory_bytes / 2**30:.2f} GiB", f"{c.step_s / paper.step_s:.3f}x",
                     f"{search_s:.1f} s ({res.explored} cand.)", res.search.best.text[:90]])
        print(f"  DenseLm {layers} layer(s) {mesh.size} cores: paper 2D {paper.step_s * 1e3:.2f} ms, searched "
              f"{c.step_s * 1e3:.2f} ms ({c.peak_memory_bytes / 2**30:.2f} GiB), search {search_s:.1f} s", flush=True)
    return md_table(["configuration", "paper's 2D plan", "its peak", "searched", "searched peak", "searched / paper",
                     "search", "decisions"], rows)


def _stack_step(params, x):
    """A training step through an open gp.pipeline (the schedule left to gp.auto_shard)."""
    def loss(params, x):
        return jnp.mean(gp.pipeline(lambda p, h: jnp.tanh(h @ p["w"]), params, x) ** 2)

    g = jax.grad(loss)(params, x)
    return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)


def pipelines(quick: bool) -> str:
    """gp.auto_shard on a stack of 8 layers through an open gp.pipeline (abstract meshes,
    h100-node presets): the schedule chosen or not, beside the plain stack's plan, and the cost of
    searching the schedules (programs traced and searched)."""
    S = jax.ShapeDtypeStruct
    configs = [((8,), ("x",), 1, 8192), ((8,), ("x",), 8, 8192), ((2, 4), ("x", "y"), 4, 8192)]
    rows = []
    for mesh_shape, names, node, width in configs[: 2 if quick else 3]:
        mesh = gp.Mesh.abstract(mesh_shape, names)
        hw = gp.Hardware.preset("h100-node", node_size=node)
        args = ({"w": S((8, width, width), F32)}, S((8192, width), F32))
        t0 = time.perf_counter()
        res = gp.auto_shard(_stack_step, mesh, *args, hardware=hw, time_budget_s=120)
        search_s = time.perf_counter() - t0
        base = next(t for t in res.pipelines if t.schedule is None)
        chosen = "none"
        if res.pipeline is not None:
            t = next(t for t in res.pipelines if (t.axis, t.microbatches) == (res.pipeline.axis,
                                                                              res.pipeline.microbatches))
            sc = t.schedule
            chosen = f"{t.axis}: {sc.stages} x {sc.microbatches} x {sc.repeats}, bubble {sc.bubble:.0%}"
        rows.append([f"{mesh_shape} on {hw.name}", chosen, f"{res.cost.step_s * 1e3:.2f} ms",
                     f"{base.step_s * 1e3:.2f} ms" if base.stage == "searched" else "over the limit",
                     f"{res.cost.peak_memory_bytes / 2**30:.2f} GiB", str(len(res.pipelines)), f"{search_s:.1f} s"])
        print(f"  pipelines {mesh_shape} {hw.name}: {chosen}, {res.cost.step_s * 1e3:.2f} ms, {search_s:.1f} s",
              flush=True)
    return md_table(["mesh, hardware", "pipeline chosen", "predicted step", "no pipeline", "peak", "programs",
                     "auto_shard"], rows)


def run(quick: bool) -> str:
    table, notes = reference(quick)
    text = ("## gp.auto_shard against hand-written plans (reference programs, 8 CPU devices)\n\n"
            "Each plan is predicted on this machine's calibrated hardware (`gp.Hardware.calibrate`, measured once "
            "per run) and on the h100-node preset, and measured here: the fastest of 15 interleaved samples (the median "
            "in brackets; other engineers share this machine's 2 cores, and the fastest sample is the least "
            "disturbed; ratios use it). A searched plan with the shardings of a hand-written one says so "
            "(`= data parallel (x,y)`): the same program, so any measured difference between them is noise. "
            "`searched (calibrated)` searched with the calibrated hardware, `searched (h100-node)` with the preset "
            "(a plan for H100s, measured here only for comparison). Targets: the searched plan never predicted "
            "slower than the best hand-written plan; measured within 10% of (or faster than) it.\n\n"
            + table + "\n\n" + "\n".join(f"* {n}" for n in notes) + "\n")
    text += ("\n## Search time (this machine), without and with the cost tables' pre-screen\n\n"
             "`without tables`: every neighbour priced by building its per-device program (the search before "
             "gspmd_py/search/tables.py); `with tables`: neighbours ranked by the cost tables over their "
             "propagation, the best few priced by building their program (the default). Both in this run, one "
             "after the other; `screened`: states the tables ranked.\n\n" + search_times(quick) + "\n")
    text += ("\n## Pre-screen on the reference programs\n\n" + prescreen_reference(quick) + "\n")
    ktable, knote = kernel_crossover(quick)
    text += ("\n## The tables' kernel: uncompiled vs Numba\n\n`tables.table_sums` (one loop over candidates x "
             "terms) run as Python and compiled by `numba.njit(cache=True)`, on random tables of the sizes the "
             "search meets (739 terms: a transformer block's training step; 18,000: 24 unrolled blocks; 8-64 "
             "candidates per call).\n\n" + ktable + "\n\n" + knote + "\n")
    text += ("\n## Pipeline schedules: 8 stacked layers through an open gp.pipeline (abstract meshes)\n\n"
             "A training step over weights f32[8, 8192, 8192] and a batch f32[8192, 8192]; gp.auto_shard prices "
             "the plain stack (searched) and every schedule (stages over an axis dividing the layers, S / 2S / 4S "
             "microbatches; screened, the best two searched). `pipeline chosen`: axis: stages x microbatches x "
             "repeats. `programs`: the programs priced.\n\n"
             + pipelines(quick) + "\n")
    text += ("\n## DenseLm layer (GSPMD paper), tpu-v3 preset, 16 GiB per core, forward\n\n" + denselm(quick) + "\n")
    text += (f"\n## The whole DenseLm ({LAYERS} layers scanned over stacked weights), tpu-v3 preset, 16 GiB per "
             "core, forward\n\nThe layer above decides a layer's weights alone; here the whole model's weights "
             f"({LAYERS} x 2.1 G parameters, f32) must fit 16 GiB per core beside the activations.\n\n"
             + denselm(quick, LAYERS) + "\n")
    return text
