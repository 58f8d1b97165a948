"""Handlers that the projection alone drives: elementwise, transpose, broadcast, reshape,
iota, and the generic one (gather, scatter: pass factors sharded, the rest whole).

    tanh [{x},{y}] -> local tanh on the [ceil(m/2), ceil(n/4)] shard, no communication
    gather operand [V,D]{-,y}, indices [B,1]{x,-} -> [B,D]{x,y}: local gather of the
        local slices (V whole, the slice dim D passes; a sharded V is gather_handler.py's)
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..ops import facts_of
from .context import Ctx
from .registry import handler
from .reshard import reshard


def bind_local(op, xs, out_shapes):
    """Re-bind op's primitive on local arrays, with shape parameters made local (as the op's
    ``OpFacts.localize`` says: ops/facts.py)."""
    params = dict(op.params)
    localize = facts_of(op.prim).localize
    if localize is not None:
        params = localize(params, [v.shape for v in op.inputs], [x.shape for x in xs], out_shapes)
    out = op.primitive.bind(*xs, **params)
    return list(out) if op.primitive.multiple_results else [out]


@handler("elementwise")
def elementwise(ctx: Ctx, op, rule, plan, args):
    w = plan.results[0]
    outs = bind_local(op, [a.x for a in args], [ctx.local_shape(v.shape, w) for v in op.outputs])
    return [ctx.pv(o, v.shape, w, dtype=v.dtype) for o, v in zip(outs, op.outputs)]


@handler("transpose")
def transpose(ctx: Ctx, op, rule, plan, args):
    a = args[0]
    return [ctx.pv(lax.transpose(a.x, op.params["permutation"]), op.outputs[0].shape, plan.results[0],
                   dtype=op.outputs[0].dtype)]


@handler("broadcast")
def broadcast(ctx: Ctx, op, rule, plan, args):
    out = op.outputs[0].shape
    dims = plan.results[0]
    y = lax.broadcast_in_dim(args[0].x, ctx.local_shape(out, dims), op.params["broadcast_dimensions"])
    return [ctx.pv(y, out, dims, dtype=op.outputs[0].dtype)]


@handler("reshape")
def reshape(ctx: Ctx, op, rule, plan, args):
    """The projection keeps every factor whole or evenly split on both sides (projection.py),
    so the local reshape of the local block is the global reshape's block."""
    a = args[0]
    out = op.outputs[0].shape
    x = a.x
    perm = op.params.get("dimensions") if op.prim == "reshape" else None
    if perm is not None:  # lax.reshape's transpose-then-reshape form
        x = lax.transpose(x, tuple(perm))
    y = jnp.reshape(x, ctx.local_shape(out, plan.results[0]))
    return [ctx.pv(y, out, plan.results[0], dtype=op.outputs[0].dtype)]


@handler("iota")
def iota(ctx: Ctx, op, rule, plan, args):
    w = plan.results[0]
    out = op.outputs[0].shape
    d = op.params["dimension"]
    dtype = op.params["dtype"]
    y = lax.broadcasted_iota(dtype, ctx.local_shape(out, w), d)
    if w[d]:  # a sharded iota dim counts from this device's first row
        y = y + ctx.offset(out[d], w[d]).astype(dtype)
    return [ctx.pv(y, out, w)]


@handler("stack")
def stack(ctx: Ctx, op, rule, plan, args):
    """Stack the local blocks (the new dim whole), then keep this device's rows of the new
    dim: a local slice, no communication (every device holds the operands it stacks)."""
    axis = op.params["axis"]
    out = op.outputs[0]
    y = op.primitive.bind(*[a.x for a in args], **op.params)
    dims = list(plan.results[0])
    whole = tuple(dims[:axis]) + ((),) + tuple(dims[axis + 1:])
    return [reshard(ctx, ctx.pv(y, out.shape, whole, dtype=out.dtype), plan.results[0])]


@handler("generic")
def rule_driven(ctx: Ctx, op, rule, plan, args):
    """Pass factors sharded, everything else whole (gather, scatter): bind locally."""
    outs = bind_local(op, [a.x for a in args], [ctx.local_shape(v.shape, t) for v, t in zip(op.outputs, plan.results)])
    return [ctx.pv(o, v.shape, t) for o, v, t in zip(outs, op.outputs, plan.results)]
