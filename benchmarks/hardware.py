"""``python -m benchmarks --only hw``: collectives shaped for the hardware (issue 20).

* Predicted, per reference program (benchmarks/cost_programs.py, (2, 4) meshes) on the
  GPU presets as 2 nodes of 4 (``node_size=4``) and the TPU presets: ``plan.cost(hw,
  overlap=True)`` of the plain program (collectives priced as the runtime runs them: one
  flat ring over NVLink and the network on GPU) and of ``gp.spmd(..., hardware=hw)``
  (hierarchy-aware reductions, collective matmul where the overlapped schedule pays).
* The DenseLm128B layer (benchmarks/cost_denselm.py), forward and backward, on (8, 16):
  TPU v3 cores (the paper's) and H100s (16 nodes of 8: the "y" axis of 16 spans 2 nodes).
* Placement (P²'s point): ``gp.rank_meshes`` over the device orders of the (2, 4) mesh,
  best and worst beside the algorithm's gain at the mesh's own order.
* Measured on 8 CPU devices (``hardware=h100-node/4``, so the shaped program is the GPU
  one): per-call time against the plain program, and the largest difference of results.
"""
from __future__ import annotations

import time
import warnings

import jax
import numpy as np

import gspmd_py as gp

from . import cost_programs as cp
from .report import md_table
from .timing import interleaved

PRESETS = [("h100-node", 4), ("a100-node", 4), ("tpu-v3", None), ("tpu-v4", None)]
# 2D shardings, where the axis kept inside a node decides which reductions cross the network
PLACED = ("mlp 2D (dp x, mp y)", "layer step megatron 2D", "conv grad spatial H x W")


def _hw(name, node):
    return gp.Hardware.preset(name, node_size=node) if node else gp.Hardware.preset(name)


def _abstract(args):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype), args)


def _plan(cfg, mesh, hw, args):
    return gp.spmd(cfg.fn, mesh, in_shardings=cfg.in_shardings, out_shardings=cfg.out_shardings,
                   hardware=hw).plan(*args)


def _us(s: float) -> str:
    return f"{s * 1e6:.1f}"


def _shaped_summary(plan) -> str:
    kinds = []
    for s in plan.diagnostics.shaped:
        kinds.append("hier" if s.what.startswith(("all-reduce", "reduce-scatter")) else "cm")
    return ", ".join(f"{k} x{kinds.count(k)}" for k in sorted(set(kinds))) or "-"


def predicted(configs) -> str:
    rows = []
    for cfg in configs:
        args = _abstract(cfg.args(np.random.default_rng(0)))
        mesh = gp.Mesh.abstract(*cfg.mesh)
        plain = _plan(cfg, mesh, None, args)
        for name, node in PRESETS:
            hw = _hw(name, node)
            a = plain.cost(hw, overlap=True)
            shaped = _plan(cfg, mesh, hw, args)
            b = shaped.cost(hw, overlap=True)
            rows.append([cfg.name, hw.name, _us(a.comm_s), _us(b.comm_s), _us(a.step_s), _us(b.step_s),
                         f"{a.step_s / b.step_s:.2f}x", _shaped_summary(shaped)])
    return md_table(["program", "hardware", "comm plain (us)", "comm shaped (us)", "step plain (us)",
                     "step shaped (us)", "gain", "shaped (hier: reductions, cm: collective matmul)"], rows)


def denselm(quick: bool) -> str:
    from . import cost_denselm as dl

    S = jax.ShapeDtypeStruct
    m, h, nh, d, seq, batch, shape = (dl.M, dl.H, dl.NH, dl.D, dl.L, 16, (8, 16))
    if quick:  # a quarter of the widths: same collectives, faster planning
        m, h, nh = m // 4, h // 4, nh // 4
    shp = {"wq": (m, nh, d), "wk": (m, nh, d), "wv": (m, nh, d), "wo": (nh, d, m), "wi0": (m, h), "wi1": (m, h),
           "wout": (h, m), "ln1": (m,), "ln2": (m,)}
    lp = {k: S(v, dl.F32) for k, v in shp.items()}
    ls = {k: dl.slot_shapes(v) for k, v in shp.items()}
    lspec = dict(dl.LAYER_SPECS)
    sspec = {k: dl.slot_spec(v) for k, v in lspec.items()}
    act = S((batch, seq, m), dl.BF16)
    A = gp.P("x", None, "y")
    mesh = gp.Mesh.abstract(shape, ("x", "y"))
    progs = {"layer forward": (dl.layer_forward, (lspec, A), A, (lp, act)),
             "layer backward": (dl.layer_backward, (lspec, sspec, A, A), (lspec, sspec, A), (lp, ls, act, act))}
    rows = []
    for pname, (fn, ins, outs, args) in progs.items():
        plain = gp.spmd(fn, mesh, in_shardings=ins, out_shardings=outs).plan(*args)
        for hw in (gp.Hardware.preset("tpu-v3"), gp.Hardware.preset("h100-node")):
            shaped = gp.spmd(fn, mesh, in_shardings=ins, out_shardings=outs, hardware=hw).plan(*args)
            a, b = plain.cost(hw, overlap=True), shaped.cost(hw, overlap=True)
            rows.append([pname, hw.name, f"{a.comm_s * 1e3:.3f}", f"{b.comm_s * 1e3:.3f}", f"{a.step_s * 1e3:.3f}",
                         f"{b.step_s * 1e3:.3f}", f"{a.step_s / b.step_s:.2f}x", _shaped_summary(shaped)])
    fn, ins, outs, args = progs["layer forward"]
    h100 = gp.Hardware.preset("h100-node")
    ranked = gp.rank_meshes(fn, shape, ("x", "y"), h100, *args, in_shardings=ins, out_shardings=outs)
    plain = gp.rank_meshes(fn, shape, ("x", "y"), h100, *args, in_shardings=ins, out_shardings=outs, shaped=False)
    place = ("\nPlacement of the layer forward on h100-node (16 nodes of 8), step in ms by device order "
             "(shaped / plain): " + "; ".join(
                 f"{' > '.join(r.order)}: {r.step_s * 1e3:.3f} / "
                 f"{next(q for q in plain if q.order == r.order).step_s * 1e3:.3f}" for r in ranked) + "\n")
    head = (f"DenseLm128B{'/4 widths (--quick)' if quick else ''} layer (d_model {m}, FFN {h}, {nh} heads), "
            f"batch {batch} x {seq}, mesh {shape}:\n\n")
    return head + md_table(["program", "hardware", "comm plain (ms)", "comm shaped (ms)", "step plain (ms)",
                            "step shaped (ms)", "gain", "shaped"], rows) + place


def placement(configs) -> str:
    hw = _hw("h100-node", 4)
    rows = []
    for cfg in configs:
        args = _abstract(cfg.args(np.random.default_rng(0)))
        shape, names = cfg.mesh
        ranked = gp.rank_meshes(cfg.fn, shape, names, hw, *args, in_shardings=cfg.in_shardings,
                                out_shardings=cfg.out_shardings)
        own = next(r for r in ranked if r.order == tuple(names))
        plain_own = gp.rank_meshes(cfg.fn, shape, names, hw, *args, in_shardings=cfg.in_shardings,
                                   out_shardings=cfg.out_shardings, shaped=False)
        plain_own = next(r for r in plain_own if r.order == tuple(names))
        best, worst = ranked[0], ranked[-1]
        rows.append([cfg.name, " > ".join(best.order), _us(best.step_s), " > ".join(worst.order), _us(worst.step_s),
                     f"{worst.step_s / best.step_s:.2f}x", f"{plain_own.step_s / own.step_s:.2f}x"])
    return ("h100-node as 2 nodes of 4, mesh (2, 4) laid out in each order of its axes (major > minor in "
            "device ids; the minor axis stays inside a node):\n\n"
            + md_table(["program", "best order", "step (us)", "worst order", "step (us)", "placement: worst / best",
                        "algorithm: plain / shaped at (x, y)"], rows))


def measured(configs, quick: bool) -> str:
    hw = _hw("h100-node", 4)
    rows = []
    for cfg in configs:
        args = cfg.args(np.random.default_rng(0))
        mesh = gp.Mesh(*cfg.mesh)
        kw = dict(in_shardings=cfg.in_shardings, out_shardings=cfg.out_shardings)
        plain = gp.spmd(cfg.fn, mesh, **kw)
        shaped = gp.spmd(cfg.fn, mesh, hardware=hw, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref, out = plain(*args), shaped(*args)
        diff = max(float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64))))
                   for u, v in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(out)))
        scale = max(float(np.max(np.abs(np.asarray(u)))) for u in jax.tree_util.tree_leaves(ref))
        same = plain.plan(*args).spmd_text() == shaped.plan(*args).spmd_text()
        if same:
            rows.append([cfg.name, "same program", "", "", "1.00x", f"{diff:.1e}"])
            continue
        t = interleaved({"plain": lambda: jax.block_until_ready(plain(*args)),
                         "shaped": lambda: jax.block_until_ready(shaped(*args))},
                        repeats=5 if quick else 11, min_sample_s=0.02)
        rows.append([cfg.name, _shaped_summary(shaped.plan(*args)), f"{t['plain'] * 1e3:.2f}",
                     f"{t['shaped'] * 1e3:.2f}", f"{t['shaped'] / t['plain']:.2f}x",
                     f"{diff:.1e} (of {scale:.1e})"])
    return md_table(["program", "shaped", "plain (ms)", "shaped (ms)", "shaped / plain", "max |difference|"], rows)


def run(quick: bool) -> str:
    t0 = time.perf_counter()
    configs = cp.CONFIGS[::3] if quick else cp.CONFIGS
    text = "## Collectives shaped for the hardware (issue 20)\n\n"
    text += ("### Predicted: plain program vs gp.spmd(..., hardware=hw)\n\n"
             "plan.cost(hw, overlap=True) of both programs, each priced as exactly the collectives it holds "
             "(GPU presets: one flat collective over NVLink and the network is one NCCL ring paced by the "
             "network; TPU presets: the runtime phases it over the torus). The (2, 4) meshes are 2 nodes of "
             "4 GPUs (node_size=4) or 4 TPU v3 chips of 2 cores / 8 TPU v4 chips.\n\n")
    text += predicted(configs) + "\n"
    text += "### DenseLm128B layer\n\n" + denselm(quick) + "\n"
    placed = [c for c in cp.CONFIGS if c.name in PLACED]
    text += "### Placement matters more than the algorithm (P²)\n\n" + placement(placed) + "\n"
    text += ("### Measured on 8 CPU devices\n\n"
             "hardware=h100-node/4 on the CPU host: the program XLA runs is the GPU-shaped one; median of "
             "interleaved calls. The CPU's collectives are memory copies, so phases cost launches without "
             "saving network time: the target here is no large regression and equal results.\n\n")
    text += measured(configs, quick) + "\n"
    text += f"({time.perf_counter() - t0:.0f} s)\n"
    return text
