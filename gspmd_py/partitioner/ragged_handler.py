"""ragged_dot_general: a local ragged dot on the projected operands, its group sizes made local.

    tokens [M,K]{x,-} . experts [G,K,N]{-,-} -> [M,N]{x,-}   each device's rows: its groups'
        overlap with rows [r0, r1) (uneven shards: padding rows get no group), no collective
    tokens [M,K]{-,-} . experts [G,K,N]{x,-} -> [M,N] partial over x: each device multiplies
        the rows of its own groups [g0, g1) (the rows moved to start at 0, multiplied, moved
        back; rows of other groups are zeros), one all-reduce when the sum is wanted
    tokens [M,K]{-,y} . experts [G,K,N]{-,y,-} -> partial over y (contracting, as a dot)
    rhs gradient [M,K]{x,-} . [M,N]{x,-} -> [G,K,N] partial over x: local group sizes, as above
    rhs gradient with G sharded: each device computes only its groups (rows moved as above)

The global group sizes arrive whole (the rule makes their group dim need replication); a
device holding rows [r0, r1) and groups [g0, g1) gives group j the rows
[clip(start_j, r0, r1), clip(end_j, r0, r1)); its groups' rows are contiguous, from a, so
the ragged dim is rolled by a - r0 to start them at local row 0. Rows outside them are
zeroed first (a NaN there must not reach another group's sum), and so are the padding rows
and groups of uneven shards. Forms the rule keeps whole (group sizes with batch dims, a
ragged batch dim, a group offset) run as the plain op on their local operands; a group
offset is computed replicated and reported.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import dtypes
from ..ops.ragged import BATCH, CONTRACTING, NONCONTRACTING, mode, shardable
from .context import Ctx
from .fallback import say_if_sharded
from .registry import handler


@handler("ragged_dot")
def ragged_dot(ctx: Ctx, op, rule, plan, args):
    lhs, rhs, gs = args
    out = op.outputs[0]
    params = dict(op.params)
    if params.get("group_offset") is not None:
        say_if_sharded(ctx, op, "a group offset is computed replicated")
        y = op.primitive.bind(lhs.x, rhs.x, gs.x, **params)
        return [ctx.pv(y, out.shape, ((),) * out.rank)]
    rdn = params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, _) = rdn.dot_dimension_numbers
    kind, ragged = mode(params)
    xl, xr, sizes = lhs.x, rhs.x, gs.x
    if plan.partial_axes:
        xl, xr = ctx.mask(lhs, lc, 0), ctx.mask(rhs, rc, 0)
        acc = dtypes.accumulation_dtype("sum", out.dtype)
        if acc != np.dtype(out.dtype):
            params["preferred_element_type"] = acc
    if shardable(op) and kind in (NONCONTRACTING, CONTRACTING):
        rows = lhs.dims[ragged]
        if kind == NONCONTRACTING:
            gdim = rdn.rhs_group_dimensions[0]
            groups = rhs.dims[gdim]
            xr = ctx.mask(rhs, [gdim], 0) if ctx.has_padding(rhs, gdim) else xr
            rr, odim = None, len(lb) + [d for d in range(lhs.rank) if d not in lc and d not in lb].index(ragged)
        else:
            groups, rr, odim = plan.results[0][0], rc[list(lc).index(ragged)], None
        if rows or groups:
            sizes, shift, total = _local_groups(ctx, gs.x, lhs.shape[ragged], rows, xl.shape[ragged],
                                                out.shape[0] if kind == CONTRACTING else rhs.shape[gdim], groups)
            moved = bool(groups)  # own groups start at row 0 unless the groups are split
            xl = _take_rows(xl, ragged, shift, total, moved)
            if rr is not None:
                xr = _take_rows(xr, rr, shift, total, moved)
            y = op.primitive.bind(xl, xr, sizes, **params)
            if odim is not None and moved:
                y = _roll(y, odim, shift)
            return [ctx.pv(y, out.shape, plan.results[0], plan.partial, out.dtype)]
    else:
        _say_whole(ctx, kind, ragged, rdn.rhs_group_dimensions)
    y = op.primitive.bind(xl, xr, sizes, **params)
    return [ctx.pv(y, out.shape, plan.results[0], plan.partial, out.dtype)]


def _say_whole(ctx: Ctx, kind: str, ragged: int, gdims) -> None:
    """Report a form kept whole (group sizes with batch dims, a ragged batch dim) whose ragged
    rows or groups arrived sharded: they were gathered, the op computed on every device."""
    lhs, rhs = ctx.op.incoming[0], ctx.op.incoming[1]
    if lhs.dims[ragged] or any(rhs.dims[d] for d in gdims):
        why = "a ragged batch dim" if kind == BATCH else "group sizes with batch dims"
        ctx.fallback(f"ragged_dot_general with {why}: its ragged rows and groups are computed whole")


def _local_groups(ctx: Ctx, gs, n_rows: int, rows, local_rows: int, n_groups: int, groups):
    """(local group sizes, roll, covered rows): this device's groups' overlaps with its rows."""
    gs_dtype, gs = gs.dtype, gs.astype(jnp.int32)
    ends = jnp.cumsum(gs)
    starts = ends - gs
    r0 = ctx.offset(n_rows, rows)
    r1 = jnp.minimum(r0 + local_rows, n_rows)
    local_groups = -(-n_groups // ctx.k(groups)) if groups else n_groups
    j = ctx.offset(n_groups, groups) + lax.iota(jnp.int32, local_groups)
    real = j < n_groups
    jj = jnp.minimum(j, n_groups - 1)
    lo = jnp.clip(jnp.where(real, starts[jj], r1), r0, r1)
    hi = jnp.clip(jnp.where(real, ends[jj], r1), r0, r1)
    sizes = jnp.maximum(hi - lo, 0)
    return sizes.astype(gs_dtype), lo[0] - r0, jnp.sum(sizes)


def _take_rows(x, d: int, shift, total, moved: bool):
    """x with its rows [shift, shift + total) along d moved to the start, the others zero."""
    if moved:
        x = _roll(x, d, -shift)
    keep = lax.broadcasted_iota(jnp.int32, x.shape, d) < total
    return jnp.where(keep, x, jnp.zeros((), x.dtype))


def _roll(x, d: int, shift):
    return jnp.roll(x, shift, axis=d)
