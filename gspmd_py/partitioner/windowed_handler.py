"""Windowed and offset ops along sharded dims, by halo exchange instead of all-gathers.

    reduce_window (max/sum/avg pool)   output sharded like the input; halos as a conv, the
                                       masked rows read as the reduction's init value
    select_and_scatter_add             halo of the operand in, local op on the segment, the
                                       segment's rows sent back to their owners and added
    pad [m] lo=1 hi=2 -> [m+3]         output shard i = input rows [i*c'-1, i*c'-1+c'):
                                       own rows + a halo; rows outside read as the pad value
    slice x[a:b:s]                     output shard i = input rows from a + i*c'*s: halo/shift
    rev                                local rev + collective-permute shard i -> k-1-i
                                       (+ a one-neighbour shift of (k*c - n) rows if uneven)
    concatenate                        each operand's rows shifted to their output shards
    dynamic_slice (small slice)        each device contributes the rows it holds: partial sums
    dynamic_update_slice               the (small) update is made whole; each device writes the
                                       rows of its shard, no communication of the operand

Every dim that is not windowed (a pass factor of the rule) keeps its sharding. When a
halo would move as much as an all-gather the dim is gathered whole and each device
slices its rows locally (``ctx.notes`` says so).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import dtypes
from ..ops import facts_of
from ..ops.rule import PASS, REDUCTION, WINDOW
from .context import Ctx
from .halo import (fetch_or_gather, gather, plan_fetch, row_mask, scatter_add, too_costly,
                   window_geometry, window_segment, device_table, pad_rows)
from .pvalue import Partial, ceil_div
from .registry import handler
from .reshard import reshard


def _per_dim(rule, plan, operand: int = 0):
    """Per dim of operand ``operand``: (factor kind, the factor's axes in the projection)."""
    out = []
    for fs in rule.operands[operand]:
        out.append((PASS, ()) if not fs else (rule.factors[fs[0]].kind, plan.axes(fs[0])))
    return out


def _is_windowed(kind, axes) -> bool:
    return kind == WINDOW and bool(axes)


# ---------------------------------------------------------------------------------------
# reduce_window
# ---------------------------------------------------------------------------------------

def _init_value(prim: str, dtype):
    return dtypes.identity(facts_of(prim).init, dtype)


@handler("reduce_window")
def partition_reduce_window(ctx: Ctx, op, rule, plan, args):
    p = op.params
    n_arr = len(op.outputs)
    per_dim = _per_dim(rule, plan)
    if op.prim == "reduce_window":
        fills = [a.x for a in args[n_arr:]]
    elif op.prim == "select_and_gather_add":  # (tangents, operand): the max pool's jvp
        n_arr = 2
        kind = "max" if p["select_prim"] is lax.ge_p else "min"
        fills = [np.zeros((), op.inputs[0].dtype), dtypes.identity(kind, op.inputs[1].dtype)]
    else:
        fills = [_init_value(op.prim, op.inputs[0].dtype)]
    xs = args[:n_arr]
    wd, st = p["window_dimensions"], p["window_strides"]
    pads = [tuple(int(v) for v in pp) for pp in p["padding"]]
    bd = list(p.get("base_dilation") or (1,) * len(wd))
    wdl = p.get("window_dilation") or (1,) * len(wd)
    locs = [x.x for x in xs]
    new_pad = list(pads)
    for d, (kind, axes) in enumerate(per_dim):
        # (a whole dim with negative padding is cropped by a local slice too: see conv_handler)
        if not (_is_windowed(kind, axes) or (kind == WINDOW and min(pads[d]) < 0)):
            continue
        n_in, n_out = op.inputs[0].shape[d], op.outputs[0].shape[d]
        w, T, lo, hi = window_geometry(n_in, n_out, ctx.k(axes), wd[d], st[d], wdl[d], pads[d][0], pads[d][1], bd[d])
        segs = [window_segment(ctx, x, d, n_in, xv.dims[d], axes, w, T, bd[d], fill, lo, hi,
                               what=f"{op.prim} dim {d}") for x, xv, fill in zip(locs, xs, fills)]
        locs = [s.x for s in segs]
        new_pad[d] = (segs[0].lo, segs[0].hi)
        bd[d] = segs[0].ld
    params = dict(p)
    params["padding"] = tuple(new_pad)
    params["base_dilation"] = tuple(bd)
    if op.prim == "reduce_window":
        outs = op.primitive.bind(*locs, *fills, **params)
    else:
        outs = op.primitive.bind(*locs, **params)
    outs = list(outs) if op.primitive.multiple_results else [outs]
    tout = tuple(axes for _, axes in per_dim)
    return [ctx.pv(o, v.shape, tout) for o, v in zip(outs, op.outputs)]


# ---------------------------------------------------------------------------------------
# select_and_scatter_add (max-pool gradient)
# ---------------------------------------------------------------------------------------

@handler("select_and_scatter_add")
def partition_select_and_scatter_add(ctx: Ctx, op, rule, plan, args):
    p = op.params
    source, operand = args
    tdims = plan.results[0]
    src = reshard(ctx, source, tdims)  # a window operand held whole is sliced locally (no communication)
    opd = reshard(ctx, operand, tdims)
    wd, st = p["window_dimensions"], p["window_strides"]
    pads = [tuple(int(v) for v in pp) for pp in p["padding"]]
    kinds = [rule.factors[fs[0]].kind if fs else PASS for fs in rule.results[0]]
    win = [d for d in range(len(wd)) if kinds[d] == WINDOW and tdims[d]]
    # padding windows of the source scatter nothing; out-of-range operand rows are never selected
    s = ctx.mask(src, win, 0)
    dt = np.dtype(op.inputs[1].dtype)
    fill = _init_value("reduce_window_max" if p["select_prim"] is lax.ge_p else "reduce_window_min", dt)
    x = opd.x
    steps = []  # (d, plan, whole)
    new_pad = list(pads)
    for d in win:
        axes = tdims[d]
        k = ctx.k(axes)
        n_in, n_out = op.inputs[1].shape[d], op.inputs[0].shape[d]
        w, T, lo, hi = window_geometry(n_in, n_out, k, wd[d], st[d], 1, pads[d][0], pads[d][1], 1)
        c = x.shape[d]
        plan = plan_fetch(ctx, axes, n=n_in, c=c, a=w, S=T, whole=False, need_lo=lo, need_hi=hi)
        gathered = too_costly(plan)
        if gathered:
            ctx.note(f"select_and_scatter_add dim {d}: halo would move as much as an "
                     f"all-gather; operand gathered whole, result reduce-scattered")
            xw = lax.slice_in_dim(ctx.all_gather(x, axes, d), 0, n_in, axis=d)
            plan = plan_fetch(ctx, axes, n=n_in, c=n_in, a=w, S=T, whole=True, need_lo=lo, need_hi=hi)
            x = gather(ctx, plan, xw, d, fill)
        else:
            x = gather(ctx, plan, x, d, fill)
        steps.append((d, plan, gathered, c))
        new_pad[d] = (0, 0)
    params = dict(p)
    params["padding"] = tuple(new_pad)
    y = op.primitive.bind(s, x, **params)
    for d, plan, gathered, c in reversed(steps):
        if not gathered:
            y = scatter_add(ctx, plan, y, d)
            continue
        # transpose of gather-whole + slice: place the segment in the whole dim, reduce-scatter
        k = plan.k
        idx = ctx.index(plan.axes)
        a = device_table(plan.a, idx)
        ylo, yhi = device_table(plan.need_lo, idx), device_table(plan.need_hi, idx)
        y = jnp.where(row_mask(y.ndim, d, plan.S, ylo, yhi, a), y, jnp.zeros((), y.dtype))
        n_pad = k * c
        big = pad_rows(y, d, n_pad, n_pad)  # big[j] = y[j - n_pad]; whole row g = y[g - a]
        start = jnp.clip(jnp.int32(n_pad) - a, 0, n_pad + plan.S)
        whole = lax.dynamic_slice_in_dim(big, start, n_pad, axis=d)
        y = ctx.reduce_scatter(whole, plan.axes, d)
    return [ctx.pv(y, op.outputs[0].shape, tdims)]


# ---------------------------------------------------------------------------------------
# pad, slice, rev
# ---------------------------------------------------------------------------------------

@handler("pad")
def partition_pad(ctx: Ctx, op, rule, plan, args):
    cfg = [tuple(int(v) for v in c) for c in op.params["padding_config"]]
    per_dim = _per_dim(rule, plan)
    xv = args[0]
    fill = args[1].x
    x = xv.x
    local_cfg = list(cfg)
    for d, (kind, axes) in enumerate(per_dim):
        if not _is_windowed(kind, axes):
            continue
        lo, hi, interior = cfg[d]
        n_in, n_out = op.inputs[0].shape[d], op.outputs[0].shape[d]
        w, T, nlo, nhi = window_geometry(n_in, n_out, ctx.k(axes), 1, 1, 1, lo, hi, interior + 1)
        seg = window_segment(ctx, x, d, n_in, xv.dims[d], axes, w, T, interior + 1, fill, nlo, nhi,
                             what=f"pad dim {d}")
        x = seg.x
        local_cfg[d] = (seg.lo, seg.hi, seg.ld - 1)
    y = lax.pad(x, fill.astype(x.dtype), tuple(local_cfg))
    tout = tuple(axes for _, axes in per_dim)
    return [ctx.pv(y, op.outputs[0].shape, tout)]


@handler("slice")
def partition_slice(ctx: Ctx, op, rule, plan, args):
    p = op.params
    start, limit = p["start_indices"], p["limit_indices"]
    strides = p.get("strides") or (1,) * len(start)
    per_dim = _per_dim(rule, plan)
    xv = args[0]
    x = xv.x
    lstart, llimit, lstride = [], [], []
    for d, (kind, axes) in enumerate(per_dim):
        n_in, n_out = op.inputs[0].shape[d], op.outputs[0].shape[d]
        s = int(strides[d] or 1)
        if _is_windowed(kind, axes):
            w, T, nlo, nhi = window_geometry(n_in, n_out, ctx.k(axes), 1, s, 1, -int(start[d]), int(limit[d]) - n_in, 1)
            seg = window_segment(ctx, x, d, n_in, xv.dims[d], axes, w, T, 1, 0, nlo, nhi, what=f"slice dim {d}")
            x = seg.x
            lstart.append(0), llimit.append(T), lstride.append(s)
        elif kind == WINDOW:
            lstart.append(int(start[d])), llimit.append(int(limit[d])), lstride.append(s)
        else:
            lstart.append(0), llimit.append(x.shape[d]), lstride.append(1)
    y = lax.slice(x, tuple(lstart), tuple(llimit), tuple(lstride))
    tout = tuple(axes for _, axes in per_dim)
    return [ctx.pv(y, op.outputs[0].shape, tout)]


@handler("rev")
def partition_rev(ctx: Ctx, op, rule, plan, args):
    dims = tuple(op.params["dimensions"])
    xv = args[0]  # a rev dim held whole stays whole: reversing a whole dim is local
    x = lax.rev(xv.x, dims)
    for d in dims:
        axes = tuple(xv.dims[d])
        if not axes:
            continue
        n = op.inputs[0].shape[d]
        k = ctx.k(axes)
        c = ceil_div(n, k)
        P = k * c - n
        # after the local rev, device j holds rows [(k-1-j)c, (k-j)c) of the reversed padded dim
        # (R[g] = x[k*c-1-g], real rows [P, k*c)); output shard i is R rows [i*c + P, (i+1)*c + P)
        plan = plan_fetch(ctx, axes, n=k * c, c=c, a=np.arange(k) * c + P, S=c, whole=False,
                          holder=np.arange(k)[::-1].copy(), real=(P, k * c))
        assert not too_costly(plan)
        x = gather(ctx, plan, x, d, 0)
    return [ctx.pv(x, op.outputs[0].shape, xv.dims)]


# ---------------------------------------------------------------------------------------
# concatenate
# ---------------------------------------------------------------------------------------

@handler("concatenate")
def partition_concatenate(ctx: Ctx, op, rule, plan, args):
    dim = op.params["dimension"]
    per_dim = _per_dim(rule, plan)
    axes = per_dim[dim][1]
    n_out = op.outputs[0].shape[dim]
    if not axes:
        tout = tuple(ax for _, ax in per_dim)
        return [ctx.pv(lax.concatenate([a.x for a in args], dim), op.outputs[0].shape, tout)]
    k = ctx.k(axes)
    c_out = ceil_div(n_out, k)
    out = None
    off = 0
    idx = ctx.index(axes)
    a_base = np.arange(k, dtype=np.int64) * c_out
    for xv, v in zip(args, op.inputs):
        n_j = v.shape[dim]
        seg = fetch_or_gather(ctx, xv.x, dim, n_j, xv.dims[dim], axes, a_base - off, c_out, 0,
                              what=f"concatenate operand of size {n_j}")
        if out is None:
            out = seg
        else:
            start = device_table(a_base - off, idx)
            out = jnp.where(row_mask(seg.ndim, dim, c_out, 0, n_j, start), seg, out)
        off += n_j
    tout = tuple(ax for _, ax in per_dim)
    return [ctx.pv(out, op.outputs[0].shape, tout)]


# ---------------------------------------------------------------------------------------
# dynamic_slice / dynamic_update_slice
# ---------------------------------------------------------------------------------------

def _starts(ctx: Ctx, args, shape, sizes):
    out = []
    for a, n, m in zip(args, shape, sizes):
        out.append(jnp.clip(a.x.astype(jnp.int32), 0, n - m))
    return out


@handler("dynamic_slice")
def partition_dynamic_slice(ctx: Ctx, op, rule, plan, args):
    """Sliced dims: a small slice of a sharded dim is a "pick" reduction (each device
    contributes the rows it holds, zero bits elsewhere, reduced bit-exactly: -0.0 and NaN
    payloads survive); otherwise the dim is whole and sliced locally."""
    sizes = tuple(op.params["slice_sizes"])
    shape = op.inputs[0].shape
    per_dim = _per_dim(rule, plan)
    rank = len(shape)
    starts = _starts(ctx, args[1:1 + rank], shape, sizes)
    xv = args[0]
    x = xv.x
    dt = np.dtype(op.inputs[0].dtype)
    fill = np.zeros((), dt)
    contrib: list[str] = []
    for d, (kind, axes) in enumerate(per_dim):
        if kind == PASS:
            continue
        m = sizes[d]
        if kind == REDUCTION and axes:
            c = x.shape[d]
            g0 = ctx.index(axes) * jnp.int32(c)
            big = pad_rows(x, d, m, m)
            loc = jnp.clip(starts[d] - g0 + jnp.int32(m), 0, c + m)
            y = lax.dynamic_slice_in_dim(big, loc, m, axis=d)
            hi = jnp.minimum(g0 + jnp.int32(c), jnp.int32(shape[d]))
            x = jnp.where(row_mask(y.ndim, d, m, g0, hi, starts[d]), y, jnp.asarray(fill, y.dtype))
            contrib.extend(axes)
        else:
            x = lax.dynamic_slice_in_dim(x, starts[d], m, axis=d)
    p = Partial(tuple(contrib), "pick") if contrib else None
    if contrib:
        ctx.note(f"dynamic_slice of a sharded dim: each device contributes the rows it "
                 f"holds (partial sums over {ctx.fine.label(contrib)}), no all-gather")
    return [ctx.pv(x, op.outputs[0].shape, plan.results[0], p, dt)]


@handler("dynamic_update_slice")
def partition_dynamic_update_slice(ctx: Ctx, op, rule, plan, args):
    shape, usize = op.inputs[0].shape, op.inputs[1].shape
    rank = len(shape)
    per_dim = _per_dim(rule, plan)
    tgt = plan.results[0]
    # the operand has the output's sharding; the (small) update is whole on the window dims
    xv, uv = reshard(ctx, args[0], tgt), args[1]
    starts = _starts(ctx, args[2:2 + rank], shape, usize)
    x, u = xv.x, uv.x
    if all(per_dim[d][0] == PASS or not tgt[d] for d in range(rank)):
        # every updated window lies in an unsharded dim: the update is local, in place, as
        # XLA emits it (PASS dims hold the same local rows in x and u)
        idx = [starts[d] if per_dim[d][0] != PASS else jnp.int32(0) for d in range(rank)]
        return [ctx.pv(lax.dynamic_update_slice(x, u.astype(x.dtype), idx), op.outputs[0].shape, tgt)]
    mask = None
    for d in range(rank):
        if per_dim[d][0] == PASS:
            continue
        m = usize[d]
        axes = tgt[d]
        c = x.shape[d]
        g0 = ctx.index(axes) * jnp.int32(c) if axes else jnp.int32(0)
        big = pad_rows(u, d, c, c)
        loc = jnp.clip(g0 - starts[d] + jnp.int32(c), 0, m + c)
        u = lax.dynamic_slice_in_dim(big, loc, c, axis=d)
        md = row_mask(x.ndim, d, c, starts[d], starts[d] + jnp.int32(m), g0)
        mask = md if mask is None else (mask & md)
    y = x if mask is None else jnp.where(mask, u, x)
    return [ctx.pv(y, op.outputs[0].shape, tgt)]


@handler("split")
def partition_split(ctx: Ctx, op, rule, plan, args):
    axis = op.params["axis"]
    per_dim = _per_dim(rule, plan)
    xv = args[0]
    axes = per_dim[axis][1]
    n_in = op.inputs[0].shape[axis]
    tout = tuple(ax for _, ax in per_dim)
    outs = []
    off = 0
    for v in op.outputs:
        m = v.shape[axis]
        if axes:
            w, T, nlo, nhi = window_geometry(n_in, m, ctx.k(axes), 1, 1, 1, -off, off + m - n_in, 1)
            y = window_segment(ctx, xv.x, axis, n_in, xv.dims[axis], axes, w, T, 1, 0, nlo, nhi,
                               what=f"split piece of size {m}").x
        else:
            y = lax.slice_in_dim(xv.x, off, off + m, axis=axis)
        outs.append(ctx.pv(y, v.shape, tout))
        off += m
    return outs
