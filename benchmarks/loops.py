"""``--only loops``: loops that keep their shardings, priced and measured.

* A scanned stack against the same layers unrolled (8 CPU devices, Megatron over y, batch
  over x): collectives per iteration vs per layer, and the step's per-call time.
* A pipelined model (``gp.pipeline``, pipe = 4 x data = 2) against the same model data
  parallel over 8, predicted on the "h100-node" preset for a GPT-like stack too large to
  hold replicated (abstract arguments, nothing runs): step time, bubble, memory per device.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp

from .report import md_table
from .timing import fmt_s, interleaved


def _layer(h, w):
    w1, w2 = w
    return h + jax.nn.gelu(h @ w1) @ w2, None


def _scanned(x, w1, w2):
    return lax.scan(_layer, x, (w1, w2))[0]


def _unrolled(x, w1, w2):
    for i in range(w1.shape[0]):
        x, _ = _layer(x, (w1[i], w2[i]))
    return x


def scanned_vs_unrolled(quick: bool) -> str:
    P = gp.P
    mesh = gp.Mesh((2, 4), ("x", "y"))
    L, b, d, f = (4, 64, 128, 512) if quick else (8, 128, 256, 1024)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, d)).astype(np.float32)
    w1 = (rng.standard_normal((L, d, f)) * d ** -0.5).astype(np.float32)
    w2 = (rng.standard_normal((L, f, d)) * f ** -0.5).astype(np.float32)
    specs = (P("x", None), P(None, None, "y"), P(None, "y", None))
    rows, fns = [], {}
    for name, fn in (("scanned", _scanned), ("unrolled", _unrolled)):
        for grad in (False, True):
            g = jax.grad(lambda *a: fn(*a).sum(), argnums=(1, 2)) if grad else fn
            f_ours = gp.spmd(g, mesh, in_shardings=specs)
            plan = f_ours.plan(x, w1, w2)
            per_iter = [c for c in plan.collectives if c.in_loop]
            once = [c for c in plan.collectives if not c.in_loop]
            label = f"{name}{' grad' if grad else ''}"
            fns[label] = (lambda f_ours=f_ours: jax.block_until_ready(f_ours(x, w1, w2)))
            rows.append([label, _colls(per_iter), _colls(once),
                         f"{sum(c.bytes_per_device for c in per_iter) * L + sum(c.bytes_per_device for c in once)} B"])
    t = interleaved(fns, repeats=5 if quick else 15)
    for r in rows:
        r.append(fmt_s(t[r[0]]))
    return md_table(["program", "collectives per iteration", "collectives once", "bytes moved per call", "per call"],
                    rows)


def _colls(cs) -> str:
    kinds: dict = {}
    for c in cs:
        key = f"{c.kind}({','.join(c.axes)}) {c.bytes_per_device} B"
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items())) or "none"


def pipeline_vs_data_parallel(quick: bool) -> str:
    P = gp.P
    hw = gp.Hardware.preset("h100-node")
    L, B, d = (8, 256, 4096) if quick else (16, 512, 8192)
    sds = jax.ShapeDtypeStruct
    params = {"w1": sds((L, d, 4 * d), jnp.bfloat16), "w2": sds((L, 4 * d, d), jnp.bfloat16)}
    x = sds((B, d), jnp.bfloat16)

    def stage(p, h):
        return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"]

    def sequential(params, x):
        return lax.scan(lambda h, p: (stage(p, h), None), x, params)[0]

    rows = []
    dp = gp.spmd(jax.grad(lambda p, x: sequential(p, x).astype(jnp.float32).sum()),
                 gp.Mesh.abstract((8,), ("data",)), in_shardings=({"w1": None, "w2": None}, P("data", None)))
    c = dp.plan(params, x).cost(hw)
    rows.append(["data parallel over 8", "-", f"{c.step_s * 1e3:.2f} ms", f"{c.peak_memory_bytes / 2 ** 30:.1f} GiB",
                 f"{c.comm_bytes / 2 ** 20:.0f} MiB"])
    mesh = gp.Mesh.abstract((2, 4), ("data", "pipe"))
    for m in (4, 8, 16, 32):
        def piped(p, x, m=m):
            return gp.pipeline(stage, p, x, axis="pipe", microbatches=m)

        g = gp.spmd(jax.grad(lambda p, x, m=m: piped(p, x, m).astype(jnp.float32).sum()), mesh,
                    in_shardings=({"w1": P("pipe"), "w2": P("pipe")}, P("data", None)))
        c = g.plan(params, x).cost(hw)
        s = gp.Schedule(4, m)
        rows.append([f"pipeline 4 stages x data 2, {m} microbatches", f"{s.bubble:.0%}", f"{c.step_s * 1e3:.2f} ms",
                     f"{c.peak_memory_bytes / 2 ** 30:.1f} GiB", f"{c.comm_bytes / 2 ** 20:.0f} MiB"])
    head = (f"Training step (gradient) of {L} residual MLP layers, d = {d}, batch {B}, bfloat16, predicted on "
            f"{hw.name} (nothing runs: abstract meshes).\n\n")
    return head + md_table(["plan", "bubble", "predicted step", "peak memory / device", "collective bytes / device"],
                           rows)


def run(quick: bool) -> str:
    text = "## Loops: a scanned stack against the same layers unrolled (8 CPU devices, measured)\n\n"
    text += scanned_vs_unrolled(quick)
    text += "\n## Pipeline (gp.pipeline) against data parallelism (predicted)\n\n"
    text += pipeline_vs_data_parallel(quick)
    return text
