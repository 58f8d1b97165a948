"""``python -m benchmarks --only modelgen [--n 30 --seed 0]``: generated models (benchmarks/modelgen.py).

For each of ``n`` models drawn from ``seed`` and each mesh, (2, 4) ("x", "y") and (8,) ("x",):

1. ``gp.auto_shard(fn, mesh, *args)`` with its defaults (the public API only): search time,
   candidates, crashes; the searched plan's result against the unpartitioned step;
2. every hand plan of benchmarks/modelgen_plans.py under ``gp.spmd``;
3. each of those plans (searched and hand) also under plain ``jax.jit`` with the same shardings
   (the searched plan through ``res.jax_shardings()``, a hand plan through its plan's in / out
   shardings as NamedShardings);
4. all of them timed interleaved, inputs placed in each one's input shardings: per-call wall
   time (fastest sample: the least disturbed on a shared machine) and process CPU time (median),
   with the deterministic side of each gp / XLA pair from the optimized HLO
   (benchmarks/hlo.py: collectives and their bytes, fusions, copies, transposes).

The results file is rewritten after every case, so a run cut short still reports what it did.
"""
from __future__ import annotations

import math
import statistics
import time
import traceback

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

import gspmd_py as gp

from . import hlo
from .modelgen import generate
from .modelgen_plans import hand_plans
from .report import md_table
from .timing import sampled

MESHES = (((2, 4), ("x", "y")), ((8,), ("x",)))
SEARCHED = "searched"


def _whole(entry):
    """A spec entry with only whole mesh axes (a sub-axis such as ``y:(2)2`` has no NamedSharding
    over the user's mesh: that part of the dim is left replicated, as res.jax_shardings() does)."""
    names = entry if isinstance(entry, tuple) else (entry,)
    kept = tuple(n for n in names if n is not None and ":" not in n)
    return None if not kept else kept[0] if len(kept) == 1 else kept


def _named(jm, tree):
    return jax.tree.map(lambda s: NamedSharding(jm, JP(*map(_whole, s.spec))), tree,
                        is_leaf=lambda s: isinstance(s, gp.Sharding))


def _xla_twin(fn, plan, jm, args):
    """``jax.jit(fn)`` with ``plan``'s input and output shardings: (call on placed inputs, compiled text)."""
    ins, outs = _named(jm, plan.in_shardings), _named(jm, plan.out_shardings)
    jitted = jax.jit(fn, in_shardings=ins, out_shardings=outs)
    placed = jax.device_put(args, ins)
    text = jitted.lower(*args).compile().as_text()
    jax.block_until_ready(jitted(*placed))
    return (lambda: jax.block_until_ready(jitted(*placed))), text


def _ours(f, args):
    """``f`` (a gp.spmd function) on inputs placed as planned: (call, compiled text, plan)."""
    plan = f.plan(*args)
    leaves, tree = jax.tree_util.tree_flatten(args)
    placed = jax.tree_util.tree_unflatten(tree, plan.place(leaves))
    text = plan.lower().compile().as_text()
    jax.block_until_ready(f(*placed))
    return (lambda: jax.block_until_ready(f(*placed))), text, plan


def _max_err(got, want) -> float:
    return max((float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64)), initial=0.0))
                for u, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))), default=0.0)


def case(seed: int, mesh_shape, axis_names, repeats: int) -> dict:
    """One (model, mesh): the search, every plan under gp.spmd and under jax.jit, timed interleaved."""
    m = generate(seed, "bench")
    mesh = gp.Mesh(mesh_shape, axis_names)
    jm = jax.sharding.Mesh(mesh.jax_devices(), mesh.axis_names)
    out = {"seed": seed, "title": m.title, "mesh": tuple(mesh_shape), "crash": "", "broken": {}, "rows": {},
           "search_s": float("nan"), "explored": 0, "stopped_by": "", "err": float("nan")}
    want = jax.jit(m.fn)(*m.args)
    calls, texts = {}, {}
    t0 = time.perf_counter()
    try:
        res = gp.auto_shard(m.fn, mesh, *m.args)
        out["search_s"], out["explored"] = time.perf_counter() - t0, res.explored
        out["stopped_by"] = str(getattr(getattr(res, "search", None), "stopped_by", "") or "")
        call, text, _ = _ours(res.spmd, m.args)
        out["err"] = _max_err(res.spmd(*m.args), want)
        calls[SEARCHED], texts[SEARCHED] = call, text
        js = res.jax_shardings()
        jitted = js.jit()
        placed = jax.device_put(m.args, js.in_shardings)
        texts[SEARCHED + " [XLA]"] = jitted.lower(*m.args).compile().as_text()
        jax.block_until_ready(jitted(*placed))
        calls[SEARCHED + " [XLA]"] = lambda: jax.block_until_ready(jitted(*placed))
    except Exception as e:  # noqa: BLE001 - a crash is a result here: recorded, never hidden
        out["search_s"] = out["search_s"] if out["explored"] else time.perf_counter() - t0
        out["crash"] = f"{type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc()
    for name, kw in hand_plans(m, mesh).items():
        try:
            call, text, plan = _ours(gp.spmd(m.fn, mesh, **kw), m.args)
            calls[name], texts[name] = call, text
        except Exception as e:  # noqa: BLE001 - a hand plan that does not build is reported
            out["broken"][name] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        try:
            xcall, xtext = _xla_twin(m.fn, plan, jm, m.args)
            calls[name + " [XLA]"], texts[name + " [XLA]"] = xcall, xtext
        except Exception as e:  # noqa: BLE001 - recorded: jax.jit could not take the plan's shardings
            out["broken"][name + " [XLA]"] = f"{type(e).__name__}: {str(e)[:200]}"
    samples = sampled(calls, repeats=repeats, warmup=1)
    for k, (wall, cpu) in samples.items():
        out["rows"][k] = {"wall": min(wall), "cpu": statistics.median(cpu), "hlo": hlo.profile(texts[k])}
    rows = out["rows"]
    hands = [k for k in rows if k != SEARCHED and not k.endswith("[XLA]")]
    if SEARCHED in rows and hands:
        best = min(hands, key=lambda k: rows[k]["wall"])
        best_cpu = min(hands, key=lambda k: rows[k]["cpu"])
        out.update(best=best, ratio=rows[SEARCHED]["wall"] / rows[best]["wall"], best_cpu=best_cpu,
                   ratio_cpu=rows[SEARCHED]["cpu"] / rows[best_cpu]["cpu"])
    out["gp_xla"] = {k: (rows[k]["wall"] / rows[k + " [XLA]"]["wall"], rows[k]["cpu"] / rows[k + " [XLA]"]["cpu"])
                     for k in rows if not k.endswith("[XLA]") and k + " [XLA]" in rows}
    return out


def _q(xs: list, p: float) -> float:
    return float(np.quantile(xs, p)) if xs else float("nan")


def _dist(xs: list) -> str:
    if not xs:
        return "-"
    gm = math.exp(sum(map(math.log, xs)) / len(xs))
    return (f"n {len(xs)}, min {min(xs):.2f}, p10 {_q(xs, .1):.2f}, median {_q(xs, .5):.2f}, p90 {_q(xs, .9):.2f}, "
            f"max {max(xs):.2f}, geomean {gm:.2f}")


def _hlo_cell(h: dict) -> str:
    return (f"{h['kinds']} ({h['collective_bytes'] / 2**10:.0f} KiB), fus {h['fusions']}, copy {h['copies']}, "
            f"tr {h['transposes']}, ops {h['instructions']}")


def report(cases: list, n: int, seed: int, repeats: int, load: str) -> str:
    """The results page: the distribution first, then a row per case and the slow gp / XLA pairs."""
    done = [c for c in cases if "ratio" in c]
    r_wall = [c["ratio"] for c in done]
    r_cpu = [c["ratio_cpu"] for c in done]
    pairs = [(c, k, w, u) for c in cases for k, (w, u) in c["gp_xla"].items()]
    searched_pairs = [u for c, k, w, u in pairs if k == SEARCHED]
    all_cpu = [u for *_, u in pairs]
    all_wall = [w for _, _, w, _ in pairs]
    search = [c["search_s"] for c in cases if not c["crash"]]
    crashes = [c for c in cases if c["crash"]]
    wrong = [c for c in cases if c["err"] == c["err"] and c["err"] > 1e-2]
    broken = sum(len(c["broken"]) for c in cases)
    text = [f"## gp.auto_shard and gp.spmd on generated models (benchmarks/modelgen.py): --n {n} --seed {seed}\n",
            f"{len(cases)} cases ({len({c['seed'] for c in cases})} models x meshes (2, 4), (8,)), 8 CPU devices; "
            f"{repeats} interleaved samples per plan. Machine load while running: {load}. Wall times on a shared "
            "2-core machine are noisy: ratios by the fastest wall sample and by the median process CPU time "
            "(all threads of this process, so XLA's device threads too) are both given; the HLO columns are "
            "deterministic.\n",
            "### Distribution\n",
            f"* searched / best hand plan, fastest wall: {_dist(r_wall)}; within 10%: "
            f"{sum(r <= 1.10 for r in r_wall)} of {len(r_wall)}; over 1.25x: {sum(r > 1.25 for r in r_wall)}; "
            f"better than every hand plan by >= 5%: {sum(r <= 0.95 for r in r_wall)}",
            f"* searched / best hand plan, median CPU: {_dist(r_cpu)}; within 10%: {sum(r <= 1.10 for r in r_cpu)} "
            f"of {len(r_cpu)}; over 1.25x: {sum(r > 1.25 for r in r_cpu)}",
            f"* gp.spmd / jax.jit per call, same shardings, the searched plans (median CPU): {_dist(searched_pairs)}",
            f"* gp.spmd / jax.jit per call, every plan (median CPU): {_dist(all_cpu)}; <= 1.05x: "
            f"{sum(u <= 1.05 for u in all_cpu)} of {len(all_cpu)}; over 1.25x: {sum(u > 1.25 for u in all_cpu)}",
            f"* gp.spmd / jax.jit per call, every plan (fastest wall): {_dist(all_wall)}",
            f"* search time (s): {_dist(search)}; stopped by: "
            + ", ".join(f"{k or 'none said'} {v}" for k, v in sorted(_count(c['stopped_by'] for c in cases).items())),
            f"* crashes of gp.auto_shard: {len(crashes)}; searched results off the unpartitioned step by > 1e-2: "
            f"{len(wrong)}; hand plans that did not build: {broken}\n",
            "### Per case\n"]
    rows = []
    for c in cases:
        gx = c["gp_xla"]
        hand_gx = [u for k, (w, u) in gx.items() if k != SEARCHED]
        rows.append([f"gen{c['seed']}", "x".join(map(str, c["mesh"])), c["title"].split(": ", 1)[1][:90],
                     f"{c['search_s']:.1f} s / {c['explored']}" + (f" ({c['stopped_by']})" if c["stopped_by"] else ""),
                     (f"{c['ratio']:.2f}x / {c['ratio_cpu']:.2f}x ({c['best']})" if "ratio" in c
                      else ("CRASH " + c["crash"][:80]).replace("|", "/")),
                     f"{gx[SEARCHED][1]:.2f}x" if SEARCHED in gx else "-",
                     f"{min(hand_gx):.2f}-{max(hand_gx):.2f}x" if hand_gx else "-"])
    text.append(md_table(["model", "mesh", "blocks", "search time / candidates", "searched / best hand (wall / CPU)",
                          "gp/XLA searched (CPU)", "gp/XLA hand plans (CPU)"], rows))
    slow = sorted(((u, w, c, k) for c, k, w, u in pairs if u > 1.10), key=lambda t: -t[0])
    text.append("\n### gp.spmd slower than jax.jit by > 10% (median CPU), with both optimized HLOs\n")
    text.append(md_table(["model", "mesh", "plan", "CPU / wall ratio", "gp.spmd HLO", "jax.jit HLO"],
                         [[f"gen{c['seed']}", "x".join(map(str, c["mesh"])), k, f"{u:.2f}x / {w:.2f}x",
                           _hlo_cell(c["rows"][k]["hlo"]), _hlo_cell(c["rows"][k + " [XLA]"]["hlo"])]
                          for u, w, c, k in slow]) if slow else "none\n")
    bad = [(c, k, e) for c in cases for k, e in c["broken"].items()]
    if bad or crashes:
        text.append("\n### Crashes and plans that did not build\n")
        text += [f"* gen{c['seed']} {c['mesh']}: gp.auto_shard: `{c['crash']}`" for c in crashes]
        text += [f"* gen{c['seed']} {c['mesh']} {k}: `{e}`" for c, k, e in bad]
    return "\n".join(text) + "\n"


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


def _load() -> str:
    import os

    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


def run(n: int, seed: int, quick: bool, write=lambda text: None, header: str = "") -> str:
    """The benchmark: ``n`` models from ``seed`` (model i has seed ``seed + i``) on both meshes."""
    repeats = 5 if quick else 9
    cases, loads = [], []
    for i in range(n):
        for shape, axes in MESHES:
            loads.append(_load())
            c = case(seed + i, shape, axes, repeats)
            cases.append(c)
            gx = c["gp_xla"].get(SEARCHED, (float("nan"),) * 2)
            print(f"  modelgen gen{seed + i} {shape}: searched/best {c.get('ratio', float('nan')):.2f}x "
                  f"({c.get('best')}), gp/XLA searched {gx[1]:.2f}x, search {c['search_s']:.1f} s"
                  f"{', CRASH ' + c['crash'] if c['crash'] else ''}", flush=True)
            write(header + report(cases, n, seed, repeats, f"{loads[0]} at the start, {_load()} now"))
    return header + report(cases, n, seed, repeats, f"{loads[0]} at the start, {_load()} at the end")
