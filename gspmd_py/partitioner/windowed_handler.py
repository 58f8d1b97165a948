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

from ..ops.rule import PASS, WINDOW
from .context import Ctx
from .factors import choose
from .halo import (fetch_or_gather, gather, plan_fetch, row_mask, scatter_add, too_costly,
                   window_geometry, window_segment, device_table, pad_rows)
from .pvalue import ceil_div
from .registry import handler
from .reshard import reshard


def _plan_dims(ctx: Ctx, rule, args, want, operand: int = 0):
    """Per-factor axes, and per dim of operand ``operand``: (factor kind, axes of the result)."""
    fa = choose(ctx.sizes, rule, args, want, kinds=(PASS, WINDOW))
    per_dim = []
    for fs in rule.operands[operand]:
        if not fs:
            per_dim.append((PASS, ()))
            continue
        f = fs[0]
        per_dim.append((rule.factors[f].kind, tuple(fa.get(f, ()))))
    return fa, per_dim


def _operand_target(pv, per_dim):
    """Pass dims take the chosen axes; window dims keep a whole operand whole (local slicing)."""
    return tuple(axes if kind == PASS else (axes if pv.dims[d] else ()) for d, (kind, axes) in enumerate(per_dim))


def _is_windowed(kind, axes) -> bool:
    return kind == WINDOW and bool(axes)


def _scalar(ctx: Ctx, pv):
    return reshard(ctx, pv, ()).x


# ---------------------------------------------------------------------------------------
# reduce_window
# ---------------------------------------------------------------------------------------

def _init_value(prim: str, dtype):
    dt = np.dtype(dtype)
    if prim == "reduce_window_sum":
        return np.zeros((), dt)
    big = prim == "reduce_window_min"
    if dt == np.bool_:
        return np.asarray(big)
    if np.issubdtype(dt, np.inexact):
        return np.asarray(np.inf if big else -np.inf, dt)
    info = np.iinfo(dt)
    return np.asarray(info.max if big else info.min, dt)


@handler("reduce_window")
def partition_reduce_window(ctx: Ctx, op, rule, args, want):
    p = op.params
    n_arr = len(op.outputs)
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    if op.prim == "reduce_window":
        fills = [_scalar(ctx, a) for a in args[n_arr:]]
    else:
        fills = [_init_value(op.prim, op.inputs[0].dtype)]
    xs = [reshard(ctx, a, _operand_target(a, per_dim)) for a in args[:n_arr]]
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
def partition_select_and_scatter_add(ctx: Ctx, op, rule, args, want):
    p = op.params
    source, operand = args
    fa = choose(ctx.sizes, rule, args, want, kinds=(PASS, WINDOW))
    tdims = tuple(tuple(fa.get(fs[0], ())) if fs else () for fs in rule.results[0])
    src = reshard(ctx, source, tdims)
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
            ctx.notes.append(f"{ctx.current_op}: select_and_scatter_add dim {d}: halo would move as much as an "
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
def partition_pad(ctx: Ctx, op, rule, args, want):
    cfg = [tuple(int(v) for v in c) for c in op.params["padding_config"]]
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    xv = reshard(ctx, args[0], _operand_target(args[0], per_dim))
    fill = _scalar(ctx, args[1])
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
def partition_slice(ctx: Ctx, op, rule, args, want):
    p = op.params
    start, limit = p["start_indices"], p["limit_indices"]
    strides = p.get("strides") or (1,) * len(start)
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    xv = reshard(ctx, args[0], _operand_target(args[0], per_dim))
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
def partition_rev(ctx: Ctx, op, rule, args, want):
    dims = tuple(op.params["dimensions"])
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    # a rev dim held whole stays whole here: reversing a whole dim is local
    tgt = tuple(axes if (kind == PASS or args[0].dims[d] or d not in dims) else () for d, (kind, axes)
                in enumerate(per_dim))
    xv = reshard(ctx, args[0], tgt)
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
def partition_concatenate(ctx: Ctx, op, rule, args, want):
    dim = op.params["dimension"]
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    axes = per_dim[dim][1]
    n_out = op.outputs[0].shape[dim]
    if not axes:
        xs = [reshard(ctx, a, tuple(ax for _, ax in per_dim)).x for a in args]
        tout = tuple(ax for _, ax in per_dim)
        return [ctx.pv(lax.concatenate(xs, dim), op.outputs[0].shape, tout)]
    k = ctx.k(axes)
    c_out = ceil_div(n_out, k)
    out = None
    off = 0
    idx = ctx.index(axes)
    a_base = np.arange(k, dtype=np.int64) * c_out
    for a, v in zip(args, op.inputs):
        n_j = v.shape[dim]
        xv = reshard(ctx, a, _operand_target(a, per_dim))
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
        s = _scalar(ctx, a).astype(jnp.int32)
        out.append(jnp.clip(s, 0, n - m))
    return out


def _numeric(dtype) -> bool:
    dt = np.dtype(dtype)
    return np.issubdtype(dt, np.number)


@handler("dynamic_slice")
def partition_dynamic_slice(ctx: Ctx, op, rule, args, want):
    sizes = tuple(op.params["slice_sizes"])
    shape = op.inputs[0].shape
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    rank = len(shape)
    # window dims that stay sharded: each device contributes the rows it holds (partial sums)
    contrib = []
    tgt = []
    for d, (kind, axes) in enumerate(per_dim):
        if kind == PASS:
            tgt.append(axes)
            continue
        cur = tuple(args[0].dims[d])
        if cur and _numeric(op.inputs[0].dtype) and 2 * sizes[d] < shape[d] and not (
                set(cur) & {a for t in tgt for a in t}):
            contrib.append(d)
            tgt.append(cur)
        else:
            tgt.append(())
    # pass dims must not reuse axes kept by contributing dims
    used = {a for d in contrib for a in tgt[d]}
    tgt = [(() if d not in contrib and set(t) & used else t) for d, t in enumerate(tgt)]
    xv = reshard(ctx, args[0], tuple(tgt))
    starts = _starts(ctx, args[1:1 + rank], shape, sizes)
    x = xv.x
    partial: list[str] = []
    for d in range(rank):
        if per_dim[d][0] == PASS:
            continue
        m = sizes[d]
        if d in contrib:
            axes = tgt[d]
            c = x.shape[d]
            g0 = ctx.index(axes) * jnp.int32(c)
            big = pad_rows(x, d, m, m)
            loc = jnp.clip(starts[d] - g0 + jnp.int32(m), 0, c + m)
            y = lax.dynamic_slice_in_dim(big, loc, m, axis=d)
            hi = jnp.minimum(g0 + jnp.int32(c), jnp.int32(shape[d]))
            x = jnp.where(row_mask(y.ndim, d, m, g0, hi, starts[d]), y, jnp.zeros((), y.dtype))
            partial.extend(axes)
        else:
            x = lax.dynamic_slice_in_dim(x, starts[d], m, axis=d)
    gathered = [d for d in range(rank) if per_dim[d][0] != PASS and d not in contrib and args[0].dims[d]]
    if gathered:
        ctx.notes.append(f"{ctx.current_op}: dynamic_slice of {[sizes[d] for d in gathered]} rows of sharded dims "
                         f"{gathered} (sizes {[shape[d] for d in gathered]}): operand dim gathered whole")
    if contrib:
        ctx.notes.append(f"{ctx.current_op}: dynamic_slice of {[sizes[d] for d in contrib]} rows from sharded dims "
                         f"{contrib}: each device contributes its rows (partial sums), no all-gather")
    tout = tuple(tgt[d] if (per_dim[d][0] == PASS) else () for d in range(rank))
    return [ctx.pv(x, op.outputs[0].shape, tout, tuple(partial))]


@handler("dynamic_update_slice")
def partition_dynamic_update_slice(ctx: Ctx, op, rule, args, want):
    shape, usize = op.inputs[0].shape, op.inputs[1].shape
    rank = len(shape)
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    tgt = tuple(axes for _, axes in per_dim)  # the operand keeps (or takes) the output's sharding
    xv = reshard(ctx, args[0], tgt)
    utgt = tuple(tgt[d] if per_dim[d][0] == PASS else () for d in range(rank))
    uv = reshard(ctx, args[1], utgt)
    starts = _starts(ctx, args[2:2 + rank], shape, usize)
    x, u = xv.x, uv.x
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
def partition_split(ctx: Ctx, op, rule, args, want):
    axis = op.params["axis"]
    fa, per_dim = _plan_dims(ctx, rule, args, want)
    xv = reshard(ctx, args[0], _operand_target(args[0], per_dim))
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
