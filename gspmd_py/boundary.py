"""The program boundary: user arrays in, global jax.Arrays in the plan's shardings."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding


def place(plan, leaves):
    """Each input leaf as a global jax.Array in the plan's input sharding (uneven dims padded)."""
    if jax.process_count() > 1:  # multi-process: place only this process's shards
        from .global_inputs import place_global

        return place_global(plan, leaves)
    out = []
    for x, v, shp, spec in zip(leaves, plan.graph.inputs, plan.padded_in_shapes, plan.in_specs):
        target = NamedSharding(plan.jax_mesh, spec)
        if isinstance(x, jax.Array) and tuple(x.shape) == shp and x.sharding.is_equivalent_to(target, x.ndim):
            out.append(x)
            continue
        if tuple(np.shape(x)) != shp:
            pads = [(0, p - n) for n, p in zip(np.shape(x), shp)]
            x = np.pad(np.asarray(x), pads) if not isinstance(x, jax.Array) else jnp.pad(x, pads)
        out.append(jax.device_put(jnp.asarray(x, dtype=v.dtype) if not isinstance(x, jax.Array) else x, target))
    return out

