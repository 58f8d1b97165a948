"""``python -m gspmd_py demo``: a transformer block, Megatron tensor parallel on "y" and data
parallel on "x" of a (2, 4) CPU mesh, partitioned by gspmd_py, run, checked against
jax.jit of the same function, and timed against it: jax.jit is given the same input and output
shardings over the same 8 devices (XLA's own partitioner), so the two per-call times compare
like with like."""
from __future__ import annotations

import time

import numpy as np


def transformer_block(x, wq, wk, wv, wo, w1, w2, g1, g2):
    import jax
    import jax.numpy as jnp

    import gspmd_py as gp

    def layernorm(h, g):
        m = h.mean(-1, keepdims=True)
        v = ((h - m) ** 2).mean(-1, keepdims=True)
        return (h - m) * jax.lax.rsqrt(v + 1e-5) * g

    h = layernorm(x, g1)
    q = jnp.einsum("btd,dhk->bthk", h, wq)
    k = jnp.einsum("btd,dhk->bthk", h, wk)
    v = jnp.einsum("btd,dhk->bthk", h, wv)
    s = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    att = gp.tag(jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1), "attention")
    o = jnp.einsum("bhts,bshk->bthk", att, v)
    x = x + jnp.einsum("bthk,hkd->btd", o, wo)
    h2 = layernorm(x, g2)
    m = gp.tag(jax.nn.gelu(h2 @ w1), "mlp_hidden")
    return x + m @ w2


def main(runs: int = 20) -> int:
    """Plan, run and check the block; then time it against jax.jit given the same shardings on
    the same 8 devices (its inputs and output placed alike), best of ``runs`` calls each."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    import gspmd_py as gp

    B, T, D, H, K, F = 8, 32, 64, 8, 8, 256
    rng = np.random.default_rng(0)
    f32 = np.float32
    args = [rng.standard_normal(s).astype(f32) * sc for s, sc in [
        ((B, T, D), 1.0), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5),
        ((H, K, D), (H * K) ** -0.5), ((D, F), D ** -0.5), ((F, D), F ** -0.5), ((D,), 1.0), ((D,), 1.0)]]
    mesh = gp.Mesh((2, 4), ("x", "y"))
    P = gp.P
    in_shardings = (P("x", None, None),            # activations: data parallel over x
                    P(None, "y", None), P(None, "y", None), P(None, "y", None),  # heads over y
                    P("y", None, None),            # attention out-projection: row parallel
                    P(None, "y"), P("y", None),     # MLP: column then row parallel
                    None, None)                     # layernorm gains: propagation decides
    f = gp.spmd(transformer_block, mesh, in_shardings=in_shardings)
    t0 = time.perf_counter()
    plan = f.plan(*args)
    t_plan = time.perf_counter() - t0
    print(plan.report())
    print()
    print("collectives, in program order:")
    for c in plan.collectives:
        print("  ", c)

    # the same shardings for jax.jit, over the same devices: the plan's boundary as NamedShardings
    jmesh = jax.sharding.Mesh(np.asarray(mesh.jax_devices()), mesh.axis_names)
    jit_in = tuple(NamedSharding(jmesh, PartitionSpec(*s.spec)) for s in plan.in_shardings)
    jit_out = NamedSharding(jmesh, PartitionSpec(*plan.out_shardings.spec))
    placed = [jax.device_put(a, s) for a, s in zip(args, jit_in)]
    ref_fn = jax.jit(transformer_block, in_shardings=jit_in, out_shardings=jit_out)
    out = jax.block_until_ready(f(*placed))  # compiles and runs
    ref = jax.block_until_ready(ref_fn(*placed))
    err = float(np.max(np.abs(np.asarray(out) - np.asarray(ref))))

    def best(fn, n):
        times = []
        for _ in range(max(1, n)):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times.append(time.perf_counter() - t)
        return min(times)

    t_spmd = best(lambda: f(*placed), runs)
    t_ref = best(lambda: ref_fn(*placed), runs)
    print()
    print(f"output {out.shape} {out.dtype}, sharding {out.sharding.spec} on mesh {dict(out.sharding.mesh.shape)}")
    print(f"max |gp.spmd - jax.jit| = {err:.2e}  ->  {'OK' if err < 1e-3 else 'MISMATCH'}")
    print(f"plan (trace + propagate + partition): {t_plan * 1e3:.1f} ms")
    print(f"per call, best of {max(1, runs)}, the same inputs, shardings and 8 CPU devices: "
          f"gp.spmd {t_spmd * 1e3:.2f} ms, jax.jit (XLA's partitioner) {t_ref * 1e3:.2f} ms "
          f"(gp.spmd / jax.jit = {t_spmd / t_ref:.2f}; the 8 host devices share this machine's cores)")
    return 0 if err < 1e-3 else 1
