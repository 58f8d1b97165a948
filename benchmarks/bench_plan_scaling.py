"""Plan + lower time of one Megatron-style block on meshes from 8 to 8,192 devices.

The SPMD program is built once whatever the mesh size (device positions come from
lax.axis_index, per-device tables are small constants), so planning and lowering for
Mesh.abstract((64, 128)) should take about as long as for a (2, 4) mesh. Prints the
times measured in this run and their ratio to the (2, 4) case.

    python benchmarks/bench_plan_scaling.py
"""
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import gspmd_py as gp  # noqa: E402


def block(x, w1, w2, wq):
    h = jax.nn.gelu(x @ w1) @ w2
    a = jax.nn.softmax(jnp.einsum("bd,dk->bk", h, wq), -1)
    return (a @ wq.T + x).sum(0)


def measure(shape, reps=3):
    mesh = gp.Mesh.abstract(shape, ("x", "y"))
    ins = (gp.P("x", None), gp.P(None, "y"), gp.P("y", None), gp.P(None, "y"))
    S = jax.ShapeDtypeStruct
    args = (S((1024, 512), jnp.float32), S((512, 2048), jnp.float32), S((2048, 512), jnp.float32),
            S((512, 1024), jnp.float32))
    best_plan = best_lower = float("inf")
    for _ in range(reps):
        f = gp.spmd(block, mesh, in_shardings=ins)
        t0 = time.perf_counter()
        plan = f.plan(*args)
        t1 = time.perf_counter()
        text = plan.lower_text()
        t2 = time.perf_counter()
        best_plan, best_lower = min(best_plan, t1 - t0), min(best_lower, t2 - t1)
    return best_plan, best_lower, len(text), len(plan.collectives)


def main():
    rows = [(s, *measure(s)) for s in [(2, 4), (8, 16), (64, 128)]]
    base = rows[0][1] + rows[0][2]
    print(f"{'mesh':>10} {'devices':>8} {'plan ms':>9} {'lower ms':>9} {'ratio to (2,4)':>15} {'hlo chars':>10} {'colls':>6}")
    for s, p, l, n, c in rows:
        print(f"{str(s):>10} {s[0] * s[1]:>8} {p * 1e3:>9.1f} {l * 1e3:>9.1f} {(p + l) / base:>15.2f} {n:>10} {c:>6}")


if __name__ == "__main__":
    main()
