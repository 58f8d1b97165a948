"""A spatially partitioned Flax conv net trained with optax under gp.spmd.

The images' height is split over mesh axis "y" (4 ways) and the batch over "x" (2 ways) of
a (2, 4) mesh: each device holds a horizontal band of each image. The 3x3 convolutions and
the 2x2 pooling exchange one halo row with their neighbours (collective-permutes) instead
of gathering the images. Each step's loss is printed beside the unpartitioned run's.

    python examples/spatial_conv.py [--steps 6]
"""
from __future__ import annotations

import argparse
import os
import sys

if "jax" not in sys.modules:  # 8 CPU devices for the (2, 4) mesh, before jax is imported
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn
import jax
import numpy as np
import optax

import gspmd_py as gp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _compare import compare  # noqa: E402

P = gp.P


class ConvNet(nn.Module):
    classes: int = 4

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), padding="SAME", name="conv1")(x))
        x = gp.tag(nn.max_pool(x, (2, 2), strides=(2, 2)), "pooled")
        x = nn.relu(nn.Conv(16, (3, 3), padding="SAME", name="conv2")(x))
        return nn.Dense(self.classes, name="head")(x.mean(axis=(1, 2)))


def main(argv=None, *, steps: int = 6, batch: int = 8, size: int = 16) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    args = ap.parse_args(argv)

    model = ConvNet()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, size, size, 3)).astype(np.float32)
    labels = (images[:, : size // 2].mean(axis=(1, 2, 3)) > images[:, size // 2:].mean(axis=(1, 2, 3))).astype(np.int32)
    labels = labels + 2 * (images[..., 0].mean(axis=(1, 2)) > 0)
    params = model.init(jax.random.PRNGKey(0), images[:1])["params"]
    tx = optax.adam(3e-3)
    opt_state = tx.init(params)

    def train_step(params, opt_state, images, labels):
        def loss_fn(p):
            logits = model.apply({"params": p}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    mesh = gp.Mesh((2, 4), ("x", "y"))
    # images: batch over x, height over y (spatial partitioning); parameters and optimizer state
    # None: left to propagation
    spmd_step = gp.spmd(train_step, mesh, in_shardings=(None, None, P("x", "y", None, None), P("x")))
    plain_step = jax.jit(train_step)
    plan = spmd_step.plan(params, opt_state, images, labels)
    kinds = {}
    for c in plan.collectives:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    print(f"conv net on {mesh}, images {images.shape} split {plan.sharding_of('arg2').spec}: "
          f"{len(plan.collectives)} collectives per step {kinds}, {len(plan.fallbacks)} replicated fallbacks; "
          f"pooled activations {plan.sharding_of('pooled').spec}")

    return compare(spmd_step, plain_step, params, opt_state, [(images, labels)] * args.steps)


if __name__ == "__main__":
    sys.exit(0 if main() < 1e-3 else 1)
