"""reshard(value, target): move a partitioned value to another sharding, emitting the steps of
the one reshard planner (program/reshard_plan.py: which collectives, in which order, with which
pads; the search's cost tables price the same steps).

Results are cached per (value, target), so resharding one value twice costs once; an all-reduce
of a whole partial value is shared by all its consumers whatever layout each wants.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..ops.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVE_PERMUTE, REDUCE_SCATTER
from ..program.reshard_plan import Step, plan_reshard
from .context import Ctx, dyn_slice_dim, pad_dim
from .partial import all_reduce, reduce, reduce_scatter
from .pvalue import FineDims, Partial, PValue


def reshard(ctx: Ctx, pv: PValue, target: FineDims, keep_partial: bool = False) -> PValue:
    if pv.partial is None and pv.dims == target and 0 not in pv.shape:
        return pv  # already there (most operands and results of a planned program): nothing to emit
    target = tuple(tuple(t) for t in target)
    key = (pv.key, target, keep_partial)
    hit = ctx.cache.reshards.get(key)
    if hit is not None:
        return hit
    if 0 in pv.shape:  # no data: any layout is an empty local array (XLA refuses empty collectives)
        out = ctx.pv(jnp.zeros(ctx.local_shape(pv.shape, target), pv.dtype), pv.shape, target, dtype=pv.dtype)
    else:
        out = _reshard(ctx, pv, target, keep_partial)
    ctx.cache.reshards[key] = out
    return out


def _reshard(ctx: Ctx, pv: PValue, target: FineDims, keep_partial: bool) -> PValue:
    p = pv.partial
    partial = list(p.axes) if p is not None else []
    axes = tuple((a, ctx.sizes[a]) for a in ctx.fine.names)
    steps = plan_reshard(tuple(pv.shape), tuple(pv.dims), target, axes, tuple(partial), keep_partial,
                         tuple(int(n) for n in pv.x.shape))
    x = pv.x
    for st in steps:
        if st.kind == ALL_REDUCE and st.whole:
            reduced = _all_reduced(ctx, pv)
            return reshard(ctx, reduced, target) if reduced.dims != target else reduced
        if st.kind in (REDUCE_SCATTER, ALL_REDUCE):
            partial = [a for a in partial if a not in st.axes]
        x = _emit(ctx, x, st, p.op if p is not None else "", pv.dtype)
    left = Partial(tuple(partial), p.op) if partial else None
    return ctx.pv(x, pv.shape, target, left, pv.dtype)


def _emit(ctx: Ctx, x, st: Step, op: str, dtype):
    """One planned step on the local buffer ``x``."""
    if st.pad >= 0:
        x = pad_dim(x, st.dim, st.pad)
    if st.note:
        ctx.note(st.note)
    kind = st.kind
    if kind == REDUCE_SCATTER:
        return reduce_scatter(ctx, x, st.axes, op, dtype if st.final else x.dtype, st.dim)
    if kind == ALL_REDUCE:
        return all_reduce(ctx, x, st.axes, op, dtype if st.final else x.dtype)
    if kind == COLLECTIVE_PERMUTE:
        return ctx.permute(x, st.axes, st.perm)
    if kind == ALL_TO_ALL:
        x = ctx.all_to_all(x, st.axes, st.dim, st.src_dim)
        return pad_dim(x, st.src_dim, st.trim) if st.trim >= 0 else x
    if kind == ALL_GATHER:
        x = ctx.all_gather(x, st.axes, st.dim)
        return pad_dim(x, st.dim, st.trim) if st.trim >= 0 else x
    return dyn_slice_dim(x, st.dim, ctx.index(st.axes) * st.size, st.size)


def _all_reduced(ctx: Ctx, pv: PValue) -> PValue:
    hit = ctx.cache.reduced.get(pv.key)
    if hit is None:
        hit = ctx.cache.reduced[pv.key] = reduce(ctx, pv)
    return hit
