"""scatter: the window dims as the rule passes them, and indexed dims held sharded.

An indexed operand dim with a one-row window (ops/gather.py: an inserted window dim of a
scatter that drops out-of-bounds updates) may be sharded: each device scatters into the
rows it holds, every index shifted by the device's first row; an update of a row another
device holds (or of no row at all) goes to one spare row past the device's rows, cut off
afterwards::

    state [S,mb]{pipe,-}.at[0].set(x [mb])   device on stage s: rows [s, s+1) plus a spare;
                                             index 0 - s, in range on stage 0 only, else
                                             the spare: a local select, no communication

Every shifted index lands in bounds (XLA's CPU scatter did not drop every out-of-bounds
index once the program was compiled across devices); the op's mode still decides for an
index out of the global bounds of an unsharded dim. Rows past the end of an uneven dim are
padding: an update that lands there is never read.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .context import Ctx
from .registry import handler


@handler("scatter")
def partition_scatter(ctx: Ctx, op, rule, plan, args):
    dn = op.params["dimension_numbers"]
    x, idx = args[0].x, args[1].x
    v = op.outputs[0]
    sharded = [d for d in dn.scatter_dims_to_operand_dims if plan.operands[0][d]]
    params = dict(op.params)
    if sharded:
        local = x.shape
        x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 1 if d in sharded else 0, 0) for d in range(x.ndim)])
        cols = []
        for k, d in enumerate(dn.scatter_dims_to_operand_dims):  # the index vector is the last dim
            i = idx[..., k]
            if d in sharded:
                i = i - ctx.offset(op.inputs[0].shape[d], plan.operands[0][d]).astype(i.dtype)
                i = jnp.where((i < 0) | (i >= local[d]), jnp.asarray(local[d], i.dtype), i)
            cols.append(i)
        idx = jnp.stack(cols, axis=-1)
        params["unique_indices"] = False  # several indices may now name the spare row
    out = op.primitive.bind(x, idx, *[a.x for a in args[2:]], **params)
    if sharded:
        out = lax.slice(out, (0,) * out.ndim, local)
    return [ctx.pv(out, v.shape, plan.results[0], dtype=v.dtype)]
