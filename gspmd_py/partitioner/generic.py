"""Handlers that the factor rule alone drives: elementwise, transpose, broadcast, reshape,
iota, and the rule-driven default used by every op whose windowed/need-replication
dims are simply kept whole (pad, slice, concatenate, rev, dynamic_(update_)slice,
reduce_window, gather, scatter, conv when no halo handler applies).

    tanh [{x},{y}] -> local tanh on the [ceil(m/2), ceil(n/4)] shard, no communication
    slice [m] -> [m/2] with m sharded on x: gather m (a window dim), local slice
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops.elementwise import LINEAR, LINEAR_IN_ONE
from ..ops.rule import PASS, REDUCTION
from .context import Ctx
from .factors import choose, split_dim, targets
from .registry import handler
from .reshard import reshard


def is_float(dtype) -> bool:
    try:
        return np.issubdtype(np.dtype(dtype), np.inexact)
    except TypeError:
        return False


def bind_local(op, xs, out_shapes):
    """Re-bind op's primitive on local arrays, with shape parameters made local."""
    params = dict(op.params)
    prim = op.prim
    if prim == "broadcast_in_dim":
        params["shape"] = tuple(out_shapes[0])
    elif prim == "iota":
        params["shape"] = tuple(out_shapes[0])
    elif prim == "slice":
        src = op.inputs[0].shape
        loc = xs[0].shape
        params["limit_indices"] = tuple(l if s == lim and st == 0 else lim for s, lim, st, l in
                                        zip(src, params["limit_indices"], params["start_indices"], loc))
    elif prim == "dynamic_slice":
        params["slice_sizes"] = tuple(out_shapes[0])
    elif prim == "gather":
        src = op.inputs[0].shape
        loc = xs[0].shape
        params["slice_sizes"] = tuple(l if s == ss else ss for s, ss, l in zip(src, params["slice_sizes"], loc))
    out = op.primitive.bind(*xs, **params)
    return list(out) if op.primitive.multiple_results else [out]


@handler("elementwise")
def elementwise(ctx: Ctx, op, rule, args, want):
    w = want[0]
    rank = len(op.outputs[0].shape)
    modes, partial = _linear_modes(op, args, {a for d in w for a in d})
    xs = []
    for a, mode in zip(args, modes):
        t = (tuple(wd if n == m else () for wd, n, m in zip(w, a.shape, op.outputs[0].shape))
             if (a.rank == rank and rank > 0) else ((),) * a.rank)
        x = reshard(ctx, a, t, keep_partial=(mode == KEEP)).x
        if mode == TO_PARTIAL:  # v == sum over the partial axes of (v on their first device, 0 elsewhere)
            x = jnp.where(ctx.index(partial) == 0, x, jnp.zeros((), x.dtype))
        xs.append(x)
    outs = bind_local(op, xs, [ctx.local_shape(v.shape, w) for v in op.outputs])
    return [ctx.pv(o, v.shape, w, partial) for o, v in zip(outs, op.outputs)]


KEEP, REDUCE, TO_PARTIAL = "keep", "reduce", "to_partial"


def _linear_modes(op, args, want_axes) -> tuple[list[str], tuple[str, ...]]:
    """How each operand enters a linear op, and the result's partial axes.

    add/sub/neg/convert...: operands all partial over the same axes stay partial;
    add_any (AD's cotangent sums): non-partial operands are made partial locally, so a
    gradient summed from several partial contributions reduces once, later;
    mul: exactly one partial operand (c * sum = sum of c *); div: only the numerator.
    Anything else, or a result wanted sharded on a partial axis, reduces here.
    """
    reduce_all = [REDUCE] * len(args), ()
    partials = [i for i, a in enumerate(args) if a.partial]
    if not partials or not is_float(op.outputs[0].dtype):
        return reduce_all
    axes = args[partials[0]].partial
    if set(axes) & want_axes or any(args[i].partial != axes for i in partials):
        return reduce_all
    if op.prim in LINEAR and all(a.partial for a in args):
        return [KEEP] * len(args), axes
    if op.prim == "add_any":
        # AD's cotangent accumulation: the backward pass is linear in cotangents, so the
        # sum stays partial and reduces once where a non-linear consumer needs it
        return [KEEP if a.partial else TO_PARTIAL for a in args], axes
    if op.prim in LINEAR_IN_ONE and len(partials) == 1 and (op.prim == "mul" or partials == [0]):
        return [KEEP if i == partials[0] else REDUCE for i in range(len(args))], axes
    return reduce_all


@handler("transpose")
def transpose(ctx: Ctx, op, rule, args, want):
    perm = op.params["permutation"]
    w = want[0]
    src = [()] * len(perm)
    for out_d, in_d in enumerate(perm):
        src[in_d] = w[out_d]
    a = reshard(ctx, args[0], tuple(src), keep_partial=True)
    return [ctx.pv(lax.transpose(a.x, perm), op.outputs[0].shape, w, a.partial)]


@handler("broadcast")
def broadcast(ctx: Ctx, op, rule, args, want):
    w = want[0]
    out = op.outputs[0].shape
    bd = op.params["broadcast_dimensions"]
    src_shape = op.inputs[0].shape
    t = tuple(w[d] if src_shape[i] == out[d] else () for i, d in enumerate(bd))
    a = reshard(ctx, args[0], t, keep_partial=True)
    dims = tuple(w[d] if (d not in bd or src_shape[bd.index(d)] == out[d]) else () for d in range(len(out)))
    loc = ctx.local_shape(out, dims)
    y = lax.broadcast_in_dim(a.x, loc, bd)
    return [ctx.pv(y, out, dims, a.partial)]


@handler("reshape")
def reshape(ctx: Ctx, op, rule, args, want):
    w = want[0]
    src, out = op.inputs[0].shape, op.outputs[0].shape
    fa: dict[int, tuple[str, ...]] = {}
    ok = True
    for fs, axes in zip(rule.results[0], w):
        parts = split_dim(ctx.sizes, axes, [rule.factors[f].size for f in fs])
        if parts is None:
            ok = False
            break
        for f, p in zip(fs, parts):
            if p and rule.factors[f].size % ctx.k(p):
                ok = False
            fa[f] = p
    if ok:
        tin, tout = targets(ctx.sizes, rule, fa, [rule.operands[0], rule.results[0]])
        # every axis the result uses must ride on the operand too (a factor's axes are lost from
        # the operand when a more major factor of the same operand dim is left unsharded)
        ok = tout == tuple(w) and all(not axes for fs, axes in zip(rule.operands[0], tin) if not fs) and \
            sorted(a for d in tin for a in d) == sorted(a for d in tout for a in d)
    if not ok:
        ctx.notes.append(f"{ctx.current_op}: reshape {src} -> {out} cannot keep {w} local; operand gathered")
        tin, tout = ((),) * len(src), ((),) * len(out)
    a = reshard(ctx, args[0], tin, keep_partial=True)
    x = a.x
    perm = op.params.get("dimensions") if op.prim == "reshape" else None
    if perm is not None:  # lax.reshape's transpose-then-reshape form
        x = lax.transpose(x, tuple(perm))
    y = jnp.reshape(x, ctx.local_shape(out, tout))
    return [ctx.pv(y, out, tout, a.partial)]


@handler("iota")
def iota(ctx: Ctx, op, rule, args, want):
    w = want[0]
    out = op.outputs[0].shape
    d = op.params["dimension"]
    loc = ctx.local_shape(out, w)
    dtype = op.params["dtype"]
    y = lax.broadcasted_iota(dtype, loc, d) + ctx.offset(out[d], w[d]).astype(dtype)
    return [ctx.pv(y, out, w)]


def by_rule(ctx: Ctx, op, rule, args, want, *, kinds=(PASS,), linear: bool = False, mask_reduction=None):
    """Default: shard what the rule lets pass, keep windowed / need-replication dims whole.

    With ``linear`` (conv), REDUCTION factors may stay sharded: the local op yields partial sums.
    """
    fa = choose(ctx.sizes, rule, args, want, kinds=kinds + ((REDUCTION,) if linear else ()),
                operand_first=[f for f, fac in enumerate(rule.factors) if fac.kind == REDUCTION] if linear else ())
    tin = targets(ctx.sizes, rule, fa, rule.operands)
    tout = targets(ctx.sizes, rule, fa, rule.results)
    xs = []
    red_axes: list[str] = []
    for f, fac in enumerate(rule.factors):
        if fac.kind == REDUCTION and f in fa:
            red_axes.extend(fa[f])
    for i, (a, t) in enumerate(zip(args, tin)):
        r = reshard(ctx, a, t)
        x = r.x
        if red_axes and mask_reduction is not None:
            dims = [d for d, fs in enumerate(rule.operands[i]) if any(rule.factors[f].kind == REDUCTION for f in fs)]
            x = ctx.mask(r, dims, mask_reduction)
        xs.append(x)
    outs = bind_local(op, xs, [ctx.local_shape(v.shape, t) for v, t in zip(op.outputs, tout)])
    return [ctx.pv(o, v.shape, t, tuple(red_axes)) for o, v, t in zip(outs, op.outputs, tout)]


@handler("generic", "windowed", "gather", "scatter")
def rule_driven(ctx: Ctx, op, rule, args, want):
    return by_rule(ctx, op, rule, args, want)


# conv, reduce_window, select_and_scatter_add, pad, slice, rev, concatenate, dynamic_slice and
# dynamic_update_slice have halo handlers in conv_handler.py / windowed_handler.py.
