"""Reductions, arg-reductions and cumulative ops over sharded dims.

    reduce_sum [m,n]{x,-} axes=(0,)  mask padding rows with 0, local sum, result partial over x
    reduce_max [m,n]{x,-} axes=(0,)  mask with -inf, local max, all-reduce(max) over x
    argmax     [m,n]{-,y} axes=(1,)  local (value, global index), all-gather over y, pick first max
    cumsum     [m]{x}                local cumsum + exclusive prefix of the shard totals
                                     (one all-gather of k numbers, not of the tensor)
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops.reduce import REDUCERS
from .context import Ctx, dyn_slice_dim
from .registry import handler
from .reshard import reshard


def identity(kind: str, dtype):
    dt = np.dtype(dtype)
    if kind in ("sum", "or", "xor"):
        return np.zeros((), dt)
    if kind in ("prod", "and"):
        return np.ones((), dt)
    if kind == "max":
        return np.array(-np.inf, dt) if np.issubdtype(dt, np.floating) else (
            np.array(False) if dt == np.bool_ else np.array(np.iinfo(dt).min, dt))
    if kind == "min":
        return np.array(np.inf, dt) if np.issubdtype(dt, np.floating) else (
            np.array(True) if dt == np.bool_ else np.array(np.iinfo(dt).max, dt))
    raise ValueError(kind)


def _operand_target(ctx: Ctx, a, axes, w):
    """Kept dims as wanted; reduced dims keep their current axes unless the result needs them."""
    used = {x for d in w for x in d}
    t, j = [], 0
    for d in range(a.rank):
        if d in axes:
            keep = []
            for x in a.dims[d]:
                if x in used:
                    break
                keep.append(x)
            t.append(tuple(keep))
            used.update(keep)
        else:
            t.append(w[j])
            j += 1
    return tuple(t)


@handler("reduce")
def reduce(ctx: Ctx, op, rule, args, want):
    kind = REDUCERS[op.prim]
    axes = tuple(op.params["axes"])
    w = want[0]
    a = args[0]
    t = _operand_target(ctx, a, axes, w)
    a = reshard(ctx, a, t, keep_partial=(kind == "sum"))
    red = [x for d in axes for x in a.dims[d]]
    x = ctx.mask(a, axes, identity(kind, a.x.dtype))
    y = op.primitive.bind(x, **op.params)
    out_dims = tuple(a.dims[d] for d in range(a.rank) if d not in axes)
    shape = op.outputs[0].shape
    if not red:
        return [ctx.pv(y, shape, out_dims, a.partial)]
    if kind == "sum":
        return [ctx.pv(y, shape, out_dims, tuple(a.partial) + tuple(red))]
    if kind in ("max", "min"):
        if y.dtype == jnp.bool_:
            y = ctx.all_reduce(y.astype(jnp.int32), red, kind).astype(jnp.bool_)
        else:
            y = ctx.all_reduce(y, red, kind)
    elif kind in ("and", "or") and y.dtype == jnp.bool_:
        y = ctx.all_reduce(y.astype(jnp.int32), red, "min" if kind == "and" else "max").astype(jnp.bool_)
    else:  # prod, xor, integer and/or: gather the k partial results and reduce them
        g = ctx.all_gather(y[None], red, 0)
        y = op.primitive.bind(g, axes=(0,), **{k: v for k, v in op.params.items() if k != "axes"})
    return [ctx.pv(y, shape, out_dims)]


@handler("argreduce")
def argreduce(ctx: Ctx, op, rule, args, want):
    (axis,) = op.params["axes"]
    w = want[0]
    a = reshard(ctx, args[0], _operand_target(ctx, args[0], (axis,), w))
    red = a.dims[axis]
    kind = "max" if op.prim == "argmax" else "min"
    x = ctx.mask(a, (axis,), identity(kind, a.x.dtype))
    idx = op.primitive.bind(x, **op.params)
    shape = op.outputs[0].shape
    out_dims = tuple(a.dims[d] for d in range(a.rank) if d != axis)
    if not red:
        return [ctx.pv(idx, shape, out_dims)]
    val = jnp.take_along_axis(x, jnp.expand_dims(idx, axis).astype(jnp.int32), axis=axis).squeeze(axis)
    gidx = idx + ctx.offset(a.shape[axis], red).astype(idx.dtype)
    gv = ctx.all_gather(val[None], red, 0)
    gi = ctx.all_gather(gidx[None], red, 0)
    pick = op.primitive.bind(gv, axes=(0,), index_dtype=op.params["index_dtype"])
    out = jnp.take_along_axis(gi, pick[None].astype(jnp.int32), axis=0)[0]
    return [ctx.pv(out, shape, out_dims)]


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
def cumulative(ctx: Ctx, op, rule, args, want):
    axis, reverse = op.params["axis"], op.params["reverse"]
    w = want[0]
    t = list(w)
    a = args[0]
    # the scanned dim keeps the operand's axes (local scans + a prefix of shard totals),
    # less any axis the result wants on another dim
    t[axis] = tuple(x for x in a.dims[axis] if x not in {y for i, d in enumerate(w) if i != axis for y in d})
    a = reshard(ctx, a, tuple(t))
    red = a.dims[axis]
    scan, kind = _SCAN[op.prim]
    ident = identity(kind, a.x.dtype) if kind else np.array(-np.inf, a.x.dtype)
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
def along_dim(ctx: Ctx, op, rule, args, want):
    """sort / top_k: the op's dim must be whole; its axes move to another dim (all-to-all)."""
    dim = op.params.get("dimension", args[0].rank - 1)
    w = want[0]
    rank = args[0].rank
    t = [tuple(w[d]) if d != dim else () for d in range(rank)]
    if op.prim == "top_k":
        t = [tuple(w[d]) for d in range(rank - 1)] + [()]
    moving = args[0].dims[dim]
    used = {x for d in t for x in d}
    if moving and not (set(moving) & used):
        for j in range(rank):
            if j != dim and not t[j] and not args[0].dims[j] and args[0].shape[j] % ctx.k(moving) == 0:
                t[j] = tuple(moving)
                break
    t = tuple(t)
    xs = [reshard(ctx, a, t).x for a in args]
    out_dims = t
    outs = op.primitive.bind(*xs, **op.params)
    outs = list(outs) if op.primitive.multiple_results else [outs]
    return [ctx.pv(o, v.shape, out_dims) for o, v in zip(outs, op.outputs)]
