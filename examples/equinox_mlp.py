"""An Equinox MLP trained with optax adam under gp.spmd, with a Module-shaped spec tree.

The model's arrays go in as an ``eqx.Module`` (its functions split off with
``eqx.partition``); the specs are the same Module with a spec in place of each array:
the hidden layers' weights column- then row-parallel on mesh axis "y", the batch over "x".
Each step's loss is printed beside the unpartitioned run's.

    python examples/equinox_mlp.py [--steps 10]
"""
from __future__ import annotations

import argparse
import os
import sys

if "jax" not in sys.modules:  # 8 CPU devices for the (2, 4) mesh, before jax is imported
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import gspmd_py as gp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _compare import compare  # noqa: E402

P = gp.P


def model_specs(params):
    """A spec tree shaped like the model: Megatron column/row parallel hidden layers."""
    specs = jax.tree.map(lambda _: None, params)
    return eqx.tree_at(
        lambda m: (m.layers[0].weight, m.layers[0].bias, m.layers[1].weight),
        specs, (P("y", None), P("y"), P(None, "y")), is_leaf=lambda v: v is None)


def main(argv=None, *, steps: int = 10, batch: int = 64, width: int = 64) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    args = ap.parse_args(argv)

    model = eqx.nn.MLP(in_size=8, out_size=1, width_size=width, depth=2, activation=jax.nn.tanh,
                       key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    def loss_fn(params, x, y):
        m = eqx.combine(params, static)
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    mesh = gp.Mesh((2, 4), ("x", "y"))
    specs = model_specs(params)
    # adam's moments have the parameters' structure: the same spec tree fits them (count: open)
    opt_specs = jax.tree.map(lambda _: None, opt_state)
    opt_specs = (opt_specs[0]._replace(mu=specs, nu=specs), opt_specs[1])
    spmd_step = gp.spmd(train_step, mesh, in_shardings=(specs, opt_specs, P("x", None), P("x", None)),
                        out_shardings=(specs, opt_specs, None))
    plain_step = jax.jit(train_step)

    rng = np.random.default_rng(0)  # one fixed batch: a regression onto sin(x . w), full-batch steps
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    y = np.sin(x @ rng.standard_normal((8, 1)).astype(np.float32) / 2)
    xs, ys = [x] * args.steps, [y] * args.steps
    plan = spmd_step.plan(params, opt_state, xs[0], ys[0])
    print(f"Equinox MLP on {mesh}: {len(plan.collectives)} collectives per step "
          f"({', '.join(sorted({c.kind for c in plan.collectives}))}), {len(plan.fallbacks)} replicated fallbacks; "
          f"layer 0 weight {plan.in_shardings[0].layers[0].weight.spec}, "
          f"layer 1 weight {plan.in_shardings[0].layers[1].weight.spec}")

    return compare(spmd_step, plain_step, params, opt_state, zip(xs, ys))


if __name__ == "__main__":
    sys.exit(0 if main() < 1e-3 else 1)
