"""``python -m benchmarks --only auto``: the searched plan against hand-written ones.

* reference programs on 8 CPU devices (h100-node preset for the prediction, so the
  plan does not depend on this machine; measured per-call time on this machine's CPU
  devices beside it): replicated, data parallel, Megatron, and gp.auto_shard's plan;
* the GSPMD paper's DenseLm layer (d_model 8192, FFN 65536, 128 heads x 128, sequence
  1024; forward) on 128 / 512 / 2,048 TPU v3 cores (abstract meshes, tpu-v3 preset,
  16 GiB per core): the searched plan's predicted step beside the paper's 2D plan's.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp

from .report import md_table
from .timing import fmt_s, median_time

P = gp.P
BF16, F32 = jnp.bfloat16, jnp.float32


def _mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def _train(w1, w2, x, y):
    g = jax.grad(lambda a, b: jnp.mean((_mlp(x, a, b) - y) ** 2), argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g[0], w2 - 0.1 * g[1]


def _block_step(*a):
    from gspmd_py.demo import transformer_block

    return jax.grad(lambda *b: transformer_block(*b).sum(), argnums=tuple(range(9)))(*a)


def _programs(quick: bool):
    d, f = (256, 1024) if quick else (512, 2048)
    meg = (None, P(None, "m"), P("m", None))
    yield ("megatron_mlp (small batch)", _mlp, [(16, d), (d, f), (f, d)],
           {"replicated": None, "data parallel": (P("m", None), None, None), "Megatron": meg})
    yield ("mlp training step (large batch)", _train, [(d, d), (d, d), (4096, d), (4096, d)],
           {"replicated": None, "data parallel": (None, None, P("m", None), P("m", None)),
            "Megatron": (P(None, "m"), P("m", None), None, None)})
    b, t, dm, h, k, ff = (8, 32, 128, 8, 16, 512) if quick else (8, 64, 256, 8, 32, 1024)
    shapes = [(b, t, dm), (dm, h, k), (dm, h, k), (dm, h, k), (h, k, dm), (dm, ff), (ff, dm), (dm,), (dm,)]
    megb = (None, P(None, "m", None), P(None, "m", None), P(None, "m", None), P("m", None, None), P(None, "m"),
            P("m", None), None, None)
    yield ("transformer block training step", _block_step, shapes,
           {"replicated": None, "data parallel": (P("m", None, None),) + (None,) * 8, "Megatron": megb})


def reference(quick: bool) -> str:
    hw = gp.Hardware.preset("h100-node")
    mesh = gp.Mesh((8,), ("m",))
    rows = []
    rng = np.random.default_rng(0)
    for name, fn, shapes, hand in _programs(quick):
        args = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in shapes]
        t0 = time.perf_counter()
        res = gp.auto_shard(fn, mesh, *args, hardware=hw, time_budget_s=30)
        search_s = time.perf_counter() - t0
        plans = {k: gp.spmd(fn, mesh, in_shardings=s) for k, s in hand.items()}
        plans["searched"] = res.spmd
        best_hand = None
        out = []
        for k, f in plans.items():
            c = f.plan(*args).cost(hw) if k != "searched" else res.cost
            f(*args)
            meas = median_time(lambda f=f: jax.block_until_ready(f(*args)), 5 if quick else 15)
            if k != "searched":
                best_hand = min(best_hand or (c.step_s, meas), (c.step_s, meas))
            out.append((k, c, meas))
        for k, c, meas in out:
            rows.append([name if k == "replicated" else "", k, f"{c.step_s * 1e6:.1f} us", f"{c.comm_bytes / 2**20:.2f} MiB",
                         fmt_s(meas), f"{search_s:.1f} s ({res.explored} cand.)" if k == "searched" else ""])
        print(f"  {name}: searched {out[-1][1].step_s * 1e6:.1f} us predicted vs best hand-written "
              f"{best_hand[0] * 1e6:.1f} us; search {search_s:.1f} s", flush=True)
    return md_table(["program", "plan", "predicted step (h100-node)", "collective bytes", "measured (8 CPU devices)",
                     "search"], rows)


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


def denselm(quick: bool) -> str:
    S = jax.ShapeDtypeStruct
    hw = gp.Hardware.preset("tpu-v3")
    shapes = {"wq": (M, NH, D), "wk": (M, NH, D), "wv": (M, NH, D), "wo": (NH, D, M), "wi0": (M, H), "wi1": (M, H),
              "wout": (H, M), "ln1": (M,), "ln2": (M,)}
    p = {k: S(s, F32) for k, s in shapes.items()}
    rows = []
    configs = [((8, 16), 16), ((16, 32), 128), ((32, 64), 512)][: 1 if quick else 3]
    for mesh_shape, batch in configs:
        mesh = gp.Mesh.abstract(mesh_shape, ("x", "y"))
        x = S((batch, L, M), BF16)
        paper = gp.spmd(dense_layer, mesh, in_shardings=(LAYER_SPECS, P("x", None, "y"))).plan(p, x).cost(hw)
        t0 = time.perf_counter()
        res = gp.auto_shard(dense_layer, mesh, p, x, hardware=hw, memory_limit=16 * 2**30, time_budget_s=60)
        search_s = time.perf_counter() - t0
        c = res.cost
        rows.append([f"{mesh.size} cores {mesh_shape}, batch {batch}", f"{paper.step_s * 1e3:.2f} ms",
                     f"{c.step_s * 1e3:.2f} ms", f"{c.peak_memory_bytes / 2**30:.2f} GiB",
                     f"{search_s:.1f} s ({res.explored} cand.)", res.search.best.text[:90]])
        print(f"  DenseLm layer {mesh.size} cores: paper 2D {paper.step_s * 1e3:.2f} ms, searched "
              f"{c.step_s * 1e3:.2f} ms, search {search_s:.1f} s", flush=True)
    return md_table(["configuration", "paper's 2D plan", "searched", "searched peak", "search", "decisions"], rows)


def run(quick: bool) -> str:
    text = "## gp.auto_shard against hand-written plans\n\n" + reference(quick) + "\n"
    text += ("\n## DenseLm layer (GSPMD paper), tpu-v3 preset, 16 GiB per core, forward\n\n" + denselm(quick) + "\n")
    return text
