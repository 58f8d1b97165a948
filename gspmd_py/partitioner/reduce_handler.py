"""Reductions, arg-reductions and cumulative ops over sharded dims.

    reduce_sum [m,n]{x,-} axes=(0,)  mask padding rows with 0, local sum, result partial sum
                                     over x (float16 accumulated in float32)
    reduce_max [m,n]{x,-} axes=(0,)  mask with -inf, local max, result partial max over x
                                     (reduced by a NaN-propagating all-reduce max)
    argmax     [m,n]{-,y} axes=(1,)  local (value, global index), all-gather over y, pick first max
    cumsum     [m]{x}                local cumsum + exclusive prefix of the shard totals
                                     (one all-gather of k numbers, not of the tensor)
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import dtypes
from ..ops.reduce import REDUCERS
from .context import Ctx, dyn_slice_dim

from .registry import handler


@handler("reduce")
def reduce(ctx: Ctx, op, rule, plan, args):
    kind = REDUCERS[op.prim]
    axes = tuple(op.params["axes"])
    a = args[0]
    red = plan.partial_axes  # the projection's partial results (reduced with ``kind``)
    out = op.outputs[0]
    x = ctx.mask(a, axes, dtypes.identity(kind, a.x.dtype))
    if red and kind == "sum":
        x = x.astype(np.dtype(dtypes.accumulation_dtype("sum", a.x.dtype)))
    y = op.primitive.bind(x, **op.params)
    carried = a.partial is not None  # a partial sum summed again (the driver merges its axes)
    return [ctx.pv(y if (red or carried) else y.astype(out.dtype), out.shape, plan.results[0], plan.partial, out.dtype)]


@handler("argreduce")
def argreduce(ctx: Ctx, op, rule, plan, args):
    """Local (value, global index) of every shard, all-gathered, the first best one picked."""
    (axis,) = op.params["axes"]
    a = args[0]
    red = a.dims[axis]
    kind = "max" if op.prim == "argmax" else "min"
    x = ctx.mask(a, (axis,), dtypes.identity(kind, a.x.dtype))
    idx = op.primitive.bind(x, **op.params)
    shape = op.outputs[0].shape
    out_dims = plan.results[0]
    if not red:
        return [ctx.pv(idx, shape, out_dims)]
    val = jnp.take_along_axis(x, jnp.expand_dims(idx, axis).astype(jnp.int32), axis=axis).squeeze(axis)
    gidx = idx + ctx.offset(a.shape[axis], red).astype(idx.dtype)
    gv = ctx.all_gather(val[None], red, 0)
    gi = ctx.all_gather(gidx[None], red, 0)
    pick = op.primitive.bind(gv, axes=(0,), index_dtype=op.params["index_dtype"])
    res = jnp.take_along_axis(gi, pick[None].astype(jnp.int32), axis=0)[0]
    return [ctx.pv(res, shape, out_dims)]


_SCAN = {
    "cumsum": (lax.cumsum, "sum"),
    "cumprod": (lax.cumprod, "prod"),
    "cummax": (lax.cummax, "max"),
    "cummin": (lax.cummin, "min"),
    "cumlogsumexp": (lax.cumlogsumexp, None),
}


def _combine(prim: str, a, b):
    return {"cumsum": jnp.add, "cumprod": jnp.multiply, "cummax": jnp.maximum, "cummin": jnp.minimum,
            "cumlogsumexp": jnp.logaddexp}[prim](a, b)


@handler("cumulative")
def cumulative(ctx: Ctx, op, rule, plan, args):
    """Local scans, then each device combines the scan of the shard totals before it."""
    axis, reverse = op.params["axis"], op.params["reverse"]
    a = args[0]
    red = a.dims[axis]
    scan, kind = _SCAN[op.prim]
    ident = dtypes.identity(kind, a.x.dtype) if kind else np.array(-np.inf, a.x.dtype)
    x = ctx.mask(a, (axis,), ident)
    local = op.primitive.bind(x, **op.params)
    if not red:
        return [ctx.pv(local, op.outputs[0].shape, a.dims)]
    # totals of every shard, then an exclusive scan over shards
    last = lax.slice_in_dim(local, 0 if reverse else local.shape[axis] - 1,
                            1 if reverse else local.shape[axis], axis=axis)
    g = ctx.all_gather(last, red, axis)  # [.., k, ..]
    incl = scan(g, axis=axis, reverse=reverse)
    k = g.shape[axis]
    ident_slab = jnp.full_like(lax.slice_in_dim(g, 0, 1, axis=axis), ident)
    if reverse:
        excl = jnp.concatenate([lax.slice_in_dim(incl, 1, k, axis=axis), ident_slab], axis=axis)
    else:
        excl = jnp.concatenate([ident_slab, lax.slice_in_dim(incl, 0, k - 1, axis=axis)], axis=axis)
    mine = dyn_slice_dim(excl, axis, ctx.index(red), 1)
    return [ctx.pv(_combine(op.prim, mine, local), op.outputs[0].shape, a.dims)]


@handler("along_dim")
def along_dim(ctx: Ctx, op, rule, plan, args):
    """sort / top_k: the op's dim is whole (its axes moved to another dim by the projection)."""
    outs = op.primitive.bind(*[a.x for a in args], **op.params)
    outs = list(outs) if op.primitive.multiple_results else [outs]
    return [ctx.pv(o, v.shape, t) for o, v, t in zip(outs, op.outputs, plan.results)]
