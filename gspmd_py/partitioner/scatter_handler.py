"""scatter: the window dims as the rule passes them, and indexed dims held sharded.

An indexed operand dim with a one-row window (ops/gather.py: an inserted window dim of a
scatter that drops out-of-bounds updates) may be sharded: each device scatters into the
rows it holds, every index shifted by the device's first row; an update of a row another
device holds (or of no row at all) goes to one spare row past the device's rows, cut off
afterwards::

    state [S,mb]{pipe,-}.at[0].set(x [mb])   device on stage s: rows [s, s+1) plus a spare;
                                             index 0 - s, in range on stage 0 only, else
                                             the spare: a local select, no communication

A scatter-add's update rows sharded (a sum reduction factor, ops/gather.py): each device
adds its own updates into its block, the operand joined on the first device of those axes,
and the result is partial over them (a scatter-max / -min's: each device scatters its own
updates into the whole operand, the result partial-max / -min): an embedding gradient's data-parallel sum, reduced
(or reduce-scattered onto a sharded table gradient) once, where it is consumed. A clip-mode
scatter clamps the global indices first, as lax does, then shifts them.

A scatter-add / -sub into a sharded one-row dim is done in place, as jax.jit's partitioner
emits it: the indices shifted by the device's first row, the scatter in FILL_OR_DROP mode
dropping the updates of rows other devices hold (no pass over the updates, no spare row:
the per-device program is jax.jit's). Any other scatter sends every shifted index in bounds
(the spare row). The op's mode still decides for an index out of the global bounds of an
unsharded dim. Rows past the end of an uneven dim are padding: an update that lands there
is never read.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..core import dtypes
from ..ops.gather import additive, dropping, one_row_dims
from .context import Ctx
from .partial import accumulate, join, zero_everywhere
from .registry import handler


@handler("scatter")
def partition_scatter(ctx: Ctx, op, rule, plan, args):
    dn = op.params["dimension_numbers"]
    x, idx = args[0].x, args[1].x
    v = op.outputs[0]
    # the one-row dims held sharded (an indexed whole window dim passes: its start stays as given)
    sharded = [d for d in one_row_dims(op) if plan.operands[0][d]]
    params = dict(op.params)
    partial = plan.partial
    summed = partial is not None and partial.op == "sum"
    if summed:  # each device adds its own updates: the operand joins on the first device
        acc = accumulate(v.dtype, "sum")
        x = join(ctx, x, partial, acc, zero=zero_everywhere(op.inputs[0]))
    if sharded and not dropping(op):  # clip: clamp the global starts first (as lax does), then shift
        idx = _clamp(idx, op, dn)
    kind = op.prim.replace("_", "-")
    upd = args[2].x
    if partial is not None:
        rows = [d for d in range(args[2].rank) if d not in dn.update_window_dims]
        # padding rows of an uneven update dim add nothing (max / min: their identity)
        upd = ctx.mask(args[2], rows, 0 if summed else dtypes.identity(partial.op, args[2].x.dtype))
    if sharded and additive(op):  # in place: updates of rows held elsewhere add the identity
        return [_add_own_rows(ctx, op, plan, x, idx, upd, sharded, partial, kind)]
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
    if summed:
        scat = lax.scatter_add if kind == "scatter-add" else lax.scatter_sub
        out = scat(x, idx, upd.astype(x.dtype), dn, indices_are_sorted=params["indices_are_sorted"],
                   unique_indices=params["unique_indices"], mode=params["mode"])
    else:
        out = op.primitive.bind(x, idx, upd, *[a.x for a in args[3:]], **params)
    if sharded:
        out = lax.slice(out, (0,) * out.ndim, local)
    if partial is not None:
        how = "adds its own updates (partial sums" if summed else f"scatters its own updates (partial {partial.op}"
        ctx.note(f"{op.prim}: each device {how} over {ctx.fine.label(partial.axes)})"
                 + (", into the rows it holds" if sharded else ""))
    return [ctx.pv(out, v.shape, plan.results[0], partial, v.dtype)]


def _add_own_rows(ctx: Ctx, op, plan, x, idx, upd, sharded, partial, kind: str):
    """scatter-add / -sub into the rows this device holds, in place: every index shifted by the
    device's first row, the updates of rows it does not hold (or of no row) dropped by the
    scatter itself (FILL_OR_DROP: an index out of the local block adds nothing), as jax.jit's
    own partitioner emits it; no pass over the updates, no spare row."""
    dn = op.params["dimension_numbers"]
    v = op.outputs[0]
    cols = []
    for k, d in enumerate(dn.scatter_dims_to_operand_dims):
        i = idx[..., k]
        if d in sharded:
            i = i - ctx.offset(op.inputs[0].shape[d], plan.operands[0][d]).astype(i.dtype)
        cols.append(i)
    idx = jnp.stack(cols, axis=-1) if len(cols) > 1 else cols[0][..., None]
    scat = lax.scatter_add if kind == "scatter-add" else lax.scatter_sub
    out = scat(x, idx, upd.astype(x.dtype), dn, indices_are_sorted=False, unique_indices=False,
               mode=lax.GatherScatterMode.FILL_OR_DROP)
    if partial is not None:
        ctx.note(f"{op.prim}: each device adds its own updates (partial sums over {ctx.fine.label(partial.axes)}) "
                 f"into the rows it holds")
    return ctx.pv(out, v.shape, plan.results[0], partial, v.dtype)


def _clamp(idx, op, dn):
    """lax's clip mode: each start clamped to [0, n - window] in the indices' dtype."""
    shape = op.inputs[0].shape
    upd = op.inputs[2].shape
    window = iter(upd[d] for d in dn.update_window_dims)
    sizes = [1 if d in dn.inserted_window_dims or d in dn.operand_batching_dims else next(window)
             for d in range(len(shape))]
    top = jnp.iinfo(idx.dtype).max
    hi = jnp.asarray([min(shape[d] - sizes[d], top) for d in dn.scatter_dims_to_operand_dims], idx.dtype)
    return jnp.clip(idx, jnp.asarray(0, idx.dtype), hi)
