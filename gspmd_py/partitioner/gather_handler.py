"""gather from an operand sharded on an indexed dim: XLA's masked local lookup.

    table [V,D]{y,-}, ids [B,1]{x,-} -> [B,D]{x,-} partial over y ("pick")
        device (x, y) with rows [o, o+c) of V: i' = ids - o; owned = 0 <= i' < c
        local gather of clamp(i', 0, c-1) from its [c,D] block; rows it does not own are
        zero bits: exactly one device holds each looked-up row, so the all-reduce (or the
        reduce-scatter a sharded consumer asks for) of the bit patterns is exact (-0.0, NaN
        payloads survive). The table never moves; only the looked-up rows' partials do.

The op's mode is applied to the global indices first, as jax does: ``clip`` and
``promise_in_bounds`` clamp each start to [0, n - slice] (XLA clamps promised indices
too), ``fill`` converts them to the operand's index dtype (as jax's lowering does) and
gives the fill value where any start is out of [0, n - slice]: the first device of the
partial axes contributes the fill, the others zero bits. Padding rows of an uneven dim are
never owned (a global index < n lands in a real row of exactly one device).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops import facts_of
from ..ops.rule import REDUCTION
from .context import Ctx
from .generic import rule_driven
from .registry import handler


def _mode(op) -> str:
    return str(op.params.get("mode", "")).rsplit(".", 1)[-1]


def fill_value(op):
    """The value a FILL_OR_DROP gather gives an out-of-bounds slice (lax.gather's default)."""
    v = op.params.get("fill_value")
    dt = np.dtype(op.outputs[0].dtype)
    if v is not None:
        return np.asarray(v).astype(dt)
    if np.issubdtype(dt, np.inexact) or dt.name == "bfloat16" or dt.kind == "V":
        return np.asarray(np.nan, dt)
    if np.issubdtype(dt, np.signedinteger):
        return np.asarray(np.iinfo(dt).min, dt)
    if np.issubdtype(dt, np.unsignedinteger):
        return np.asarray(np.iinfo(dt).max, dt)
    return np.asarray(True, dt)


def _index_dtype(shape) -> type:
    return jnp.int32 if all(n < 2 ** 31 for n in shape) else jnp.int64


@handler("gather")
def partition_gather(ctx: Ctx, op, rule, plan, args):
    dn = op.params["dimension_numbers"]
    shape = op.inputs[0].shape
    sizes = op.params["slice_sizes"]
    sharded = {}
    for k, d in enumerate(dn.start_index_map):
        fs = rule.operands[0][d]
        if fs and rule.factors[fs[0]].kind == REDUCTION and plan.axes(fs[0]):
            sharded[k] = (d, plan.axes(fs[0]))
    if not sharded:
        return rule_driven(ctx, op, rule, plan, args)
    x, idx = args[0].x, args[1].x
    mode = _mode(op)
    wide = _index_dtype(shape)
    valid = None
    cols = []
    for k, d in enumerate(dn.start_index_map):
        hi = shape[d] - sizes[d]
        i = idx[..., k]
        if mode == "FILL_OR_DROP":
            i = i.astype(wide)
            ok = (i >= 0) & (i <= hi)
            valid = ok if valid is None else valid & ok
            i = jnp.where(ok, i, jnp.zeros((), wide))
        else:  # clip; promise_in_bounds: XLA clamps the starts
            top = min(hi, int(jnp.iinfo(i.dtype).max))
            i = jnp.clip(i, jnp.asarray(0, i.dtype), jnp.asarray(top, i.dtype)).astype(wide)
        cols.append(i)
    owned = None
    for k, (d, axes) in sharded.items():
        c = x.shape[d]
        loc = cols[k] - ctx.offset(shape[d], axes).astype(wide)
        mine = (loc >= 0) & (loc < c)
        owned = mine if owned is None else owned & mine
        cols[k] = jnp.clip(loc, 0, c - 1)
    local_idx = jnp.stack(cols, axis=-1) if cols else idx.astype(wide)
    params = dict(op.params, mode=type(op.params["mode"]).CLIP, fill_value=None)
    out = op.outputs[0]
    out_local = ctx.local_shape(out.shape, plan.results[0])
    y = op.primitive.bind(x, local_idx, **_localized(op, params, [x, local_idx], out_local))
    batch = tuple(d for d in range(y.ndim) if d not in dn.offset_dims)
    dt = np.dtype(out.dtype)
    zero = jnp.zeros((), y.dtype)
    y = jnp.where(lax.broadcast_in_dim(owned, y.shape, batch), y, zero)
    partial = plan.partial
    if valid is not None:
        first = ctx.index(partial.axes) == 0
        fill = jnp.where(first, jnp.asarray(fill_value(op), y.dtype), zero)
        y = jnp.where(lax.broadcast_in_dim(valid, y.shape, batch), y, fill)
    ctx.note(f"gather from rows sharded over {ctx.fine.label(partial.axes)}: each device looks up the rows it "
             f"holds (masked), one reduction of the looked-up rows, the operand never moves")
    return [ctx.pv(y, out.shape, plan.results[0], partial, dt)]


def _localized(op, params: dict, xs, out_local) -> dict:
    """The gather's params made local (generic.bind_local's localize), on the new params."""
    localize = facts_of(op.prim).localize
    if localize is None:
        return params
    return localize(params, [v.shape for v in op.inputs], [x.shape for x in xs], [out_local])
