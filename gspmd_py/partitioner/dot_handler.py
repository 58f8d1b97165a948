"""dot_general: a local dot on the projected operands; sharded contracting dims give partials.

    x [B,D]{x,-} @ W1 [D,H]{-,y} -> [B,H]{x,y}     local dot, no collective
    h [B,H]{x,y} @ W2 [H,D]{y,-} -> [B,D]{x,-}     local dot, partial sum over y (one
                                                    all-reduce when a consumer needs the sum)
    [M,K]{-,y} @ [K,N]{y,-} -> [M,N]{-,y}          local dot + reduce-scatter over y

With ``collective_matmul_bytes`` or a hardware, a dot whose sum is wanted reduce-scattered
runs as a ring of partial dots and permutes of the accumulator (collective_matmul.py).

Padding rows of uneven contracting dims are zeroed on both sides. float16 partial sums
are computed in float32 (``preferred_element_type``) and cast after the all-reduce; a bool
dot's contraction is an OR (the rule's reduction(or)).
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from . import collective_matmul
from .context import Ctx

from .registry import handler


@handler("dot")
def dot(ctx: Ctx, op, rule, plan, args):
    if ctx.shaping.active:  # the sum wanted reduce-scattered: a ring of partial dots (collective_matmul.py)
        looped = collective_matmul.dot_reduce_scatter(ctx, op, rule, plan, args)
        if looped is not None:
            return looped
    lhs, rhs = args
    (lc, rc), _ = op.params["dimension_numbers"]
    red = plan.partial_axes  # the projection's partial results
    out = op.outputs[0]
    xl, xr = lhs.x, rhs.x
    params = dict(op.params)
    if red:
        xl = ctx.mask(lhs, lc, 0)
        xr = ctx.mask(rhs, rc, 0)
        acc = dtypes.accumulation_dtype("sum", out.dtype)
        if acc != np.dtype(out.dtype):
            params["preferred_element_type"] = acc
    y = op.primitive.bind(xl, xr, **params)
    return [ctx.pv(y, out.shape, plan.results[0], plan.partial, out.dtype)]
