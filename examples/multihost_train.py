"""Training steps of the demo's transformer block, on one process or many.

    python examples/multihost_train.py                       # 1 process x 8 CPU devices
    python -m gspmd_py.launch -n 2 --devices-per-process 4 examples/multihost_train.py
                                                             # 2 processes x 4 CPU devices

Both print the same losses. The step (loss, gradient, Adam update) is plain JAX; gspmd_py
partitions it over a (2, 4) mesh: "x" (data parallel) spans the two processes, "y"
(Megatron tensor parallel: heads and the MLP's hidden dim) stays inside each process,
so the frequent tensor-parallel all-reduces never leave a host and only the gradient
all-reduce over "x" crosses processes.

Each process passes only its own rows of the batch (``f.from_local``) and the full
parameters; the parameters come back as global jax.Arrays and feed the next step as
they are. ``gp.to_host`` gathers the loss on every process.
"""
from __future__ import annotations

import argparse
import os
import sys

if not os.environ.get("GSPMD_PY_COORDINATOR") and "device_count" not in os.environ.get("XLA_FLAGS", ""):
    # one process on its own: 8 CPU devices (read when JAX's backend starts)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import numpy as np  # noqa: E402

B, T, D, H, K, F = 8, 16, 32, 4, 8, 64   # batch, tokens, model dim, heads, head dim, MLP dim
NAMES = ("wq", "wk", "wv", "wo", "w1", "w2", "g1", "g2")


def make_problem(seed: int = 0):
    """Parameters (dict of numpy arrays), a batch x and regression targets y, the same on every process."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    shapes = {"wq": ((D, H, K), D ** -0.5), "wk": ((D, H, K), D ** -0.5), "wv": ((D, H, K), D ** -0.5),
              "wo": ((H, K, D), (H * K) ** -0.5), "w1": ((D, F), D ** -0.5), "w2": ((F, D), F ** -0.5)}
    params = {k: (rng.standard_normal(s) * sc).astype(f32) for k, (s, sc) in shapes.items()}
    params["g1"] = np.ones((D,), f32)
    params["g2"] = np.ones((D,), f32)
    x = rng.standard_normal((B, T, D)).astype(f32)
    y = rng.standard_normal((B, T, D)).astype(f32)
    return params, x, y


def param_specs():
    """Megatron over "y": attention heads, then the MLP's hidden dim (column then row parallel)."""
    import gspmd_py as gp

    P = gp.P
    return {"wq": P(None, "y", None), "wk": P(None, "y", None), "wv": P(None, "y", None),
            "wo": P("y", None, None), "w1": P(None, "y"), "w2": P("y", None), "g1": None, "g2": None}


def loss_fn(params, x, y):
    from gspmd_py.demo import transformer_block

    out = transformer_block(x, *(params[k] for k in NAMES))
    return ((out - y) ** 2).mean()


def train_step(params, m, v, x, y):
    """One Adam step (no bias correction), written for one device."""
    import jax
    import jax.numpy as jnp

    loss, g = jax.value_and_grad(loss_fn)(params, x, y)
    tm = jax.tree_util.tree_map
    m = tm(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = tm(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
    params = tm(lambda p, m, v: p - 1e-2 * m / (jnp.sqrt(v) + 1e-8), params, m, v)
    return params, m, v, loss


def make_step(mesh):
    import gspmd_py as gp

    ps, data = param_specs(), gp.P("x", None, None)
    return gp.spmd(train_step, mesh, in_shardings=(ps, ps, ps, data, data))


def train(steps: int, log=print):
    """Run ``steps`` training steps; returns (losses, final parameters as numpy)."""
    import jax

    import gspmd_py as gp

    mesh = gp.Mesh((2, 4), ("x", "y"))
    step = make_step(mesh)
    params, x, y = make_problem()
    m = {k: np.zeros_like(a) for k, a in params.items()}
    v = {k: np.zeros_like(a) for k, a in params.items()}
    rows = gp.distributed.local_slices(mesh, gp.P("x", None, None), x.shape)  # this process's rows
    log(f"process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local devices, "
        f"mesh {dict(zip(mesh.axis_names, mesh.shape))}, axes spanning processes: "
        f"{gp.distributed.axes_spanning_processes(mesh)}, batch rows {rows[0].start}:{rows[0].stop}")
    losses = []
    for i in range(steps):
        params, m, v, loss = step.from_local(params, m, v, x[rows], y[rows])
        losses.append(float(gp.to_host(loss)))
        log(f"step {i} loss {losses[-1]:.6f}")
    return losses, gp.to_host(params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", help="process 0 writes the losses and final parameters here (.npz)")
    args = ap.parse_args(argv)
    import gspmd_py as gp

    gp.distributed.initialize()   # launcher / cluster environment, else one process
    import jax

    losses, params = train(args.steps)
    if args.out and jax.process_index() == 0:
        np.savez(args.out, losses=np.asarray(losses), **params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
