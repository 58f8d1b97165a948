"""Shape ops: broadcast, reshape, transpose, squeeze, expand_dims, iota, concatenate, pad,
slice, rev, dynamic_slice, dynamic_update_slice.

    transpose        [a,b,c] perm=(1,2,0) -> [b,c,a]     "[i,j,k] -> [j,k,i]"
    broadcast_in_dim [m] dims=(1,) -> [4,m]              "[j] -> [i,j]"   (i new: propagates forward last)
    reshape          [8] -> [2,4]                        "[(i j)] -> [i,j]"
    reshape          [14,32] -> [7,2,2,16]               "[(i j),(k l)] -> [i,j,k,l]"
    pad              [m] lo=1 hi=2 -> [m+3]              "[i] -> [i]"     i: window (halo on a sharded dim)
    concatenate      [m],[n] -> [m+n]                    "[i], [i] -> [i]"  i: window
    dynamic_slice    [m,n] sizes=(2,n) -> [2,n]          "[i,j] -> [k,j]"   i: reduction(pick), k:
                     need_replication (a small slice: each device contributes the rows it holds)
    dynamic_slice    [m,n] sizes=(m-1,n) -> [m-1,n]      "[i,j] -> [k,j]"   i, k: need_replication
"""
from __future__ import annotations

import attrs

from . import facts as F
from .registry import declare, register
from .rule import BROADCAST, ELEMENTWISE, NEED_REPLICATION, OTHER, PASS, REDUCTION, WINDOW, OpRule, RuleBuilder


@register("transpose", handler="transpose")
def transpose(op) -> OpRule:
    perm = op.params["permutation"]
    b = RuleBuilder()
    fs = b.factors(op.inputs[0].shape)
    return b.operand(fs).result([fs[p] for p in perm]).build(ELEMENTWISE)


@register("broadcast_in_dim", handler="broadcast")
def broadcast_in_dim(op) -> OpRule:
    out = op.outputs[0].shape
    bdims = op.params["broadcast_dimensions"]
    b = RuleBuilder()
    fs = b.factors(out)
    src = op.inputs[0].shape
    b.operand([fs[d] if src[i] == out[d] else None for i, d in enumerate(bdims)])
    for _ in op.inputs[1:]:  # dynamic shapes: scalars
        b.operand([])
    return b.result(fs).build(OTHER, forward_level=BROADCAST)


@register("squeeze", "expand_dims", "reshape", handler="reshape")
def reshape(op) -> OpRule:
    b = RuleBuilder()
    src = op.inputs[0].shape
    perm = op.params.get("dimensions") if op.prim == "reshape" else None
    if perm is None:
        in_dims, out_dims = reshape_factors(b, src, op.outputs[0].shape)
    else:  # reshape with a transpose first: factor the transposed shape, map back to operand dims
        t_dims, out_dims = reshape_factors(b, [src[d] for d in perm], op.outputs[0].shape)
        in_dims = [None] * len(src)
        for i, d in enumerate(perm):
            in_dims[d] = t_dims[i]
    b.operand(in_dims)
    for _ in op.inputs[1:]:
        b.operand([])
    return b.result(out_dims).build(OTHER)


def reshape_factors(b: RuleBuilder, src, dst):
    """Common refinement of two shapes into factors (Shardy's reshape rule).

    Walk both shapes major to minor; where one remaining size divides the other, the
    smaller becomes a factor of both. Groups that do not refine (e.g. [6,4] -> [4,6])
    get need_replication factors on both sides.
    """
    src = [int(s) for s in src]
    dst = [int(s) for s in dst]
    if 0 in src or 0 in dst:  # no elements: nothing relates the dims (and nothing moves)
        return ([[b.factor(s, NEED_REPLICATION)] for s in src], [[b.factor(s, NEED_REPLICATION)] for s in dst])
    in_dims: list[list[int]] = [[] for _ in src]
    out_dims: list[list[int]] = [[] for _ in dst]
    i = j = 0
    ri = src[0] if src else 1
    rj = dst[0] if dst else 1
    while i < len(src) and j < len(dst):
        if ri == 1:
            i += 1
            ri = src[i] if i < len(src) else 1
            continue
        if rj == 1:
            j += 1
            rj = dst[j] if j < len(dst) else 1
            continue
        if ri % rj == 0 or rj % ri == 0:
            f = b.factor(min(ri, rj))
            in_dims[i].append(f)
            out_dims[j].append(f)
            ri, rj = ri // min(ri, rj), rj // min(ri, rj)
            continue
        # incompatible group: extend both sides until the products meet
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(i)
                pi *= src[i]
            else:
                j += 1
                gj.append(j)
                pj *= dst[j]
        for d in gi:
            in_dims[d] = [b.factor(src[d], NEED_REPLICATION)] if src[d] > 1 else []
        for d in gj:
            out_dims[d] = [b.factor(dst[d], NEED_REPLICATION)] if dst[d] > 1 else []
        i += 1
        j += 1
        ri = src[i] if i < len(src) else 1
        rj = dst[j] if j < len(dst) else 1
    return in_dims, out_dims


@register("iota", handler="iota")
def iota(op) -> OpRule:
    b = RuleBuilder()
    fs = b.factors(op.outputs[0].shape)
    for _ in op.inputs:
        b.operand([])
    return b.result(fs).build(OTHER)


def _windowed(op, windowed_dims) -> OpRule:
    """Operand 0 and result 0 share one factor per dim; ``windowed_dims`` are WINDOW factors."""
    b = RuleBuilder()
    out = op.outputs[0].shape
    fs = [b.factor(s, WINDOW if d in windowed_dims else PASS) for d, s in enumerate(out)]
    b.operand(fs)
    for v in op.inputs[1:]:
        if v.rank == len(out):
            b.operand(fs)
        else:
            b.operand([None] * v.rank)
    return b.result(fs).build(OTHER)


@register("pad", handler="pad")
def pad(op) -> OpRule:
    cfg = op.params["padding_config"]
    return _windowed(op, {d for d, (lo, hi, interior) in enumerate(cfg) if (lo, hi, interior) != (0, 0, 0)})


@register("slice", handler="slice")
def slice_(op) -> OpRule:
    src, out = op.inputs[0].shape, op.outputs[0].shape
    return _windowed(op, {d for d in range(len(out)) if src[d] != out[d] or
                          (op.params.get("strides") and op.params["strides"][d] not in (None, 1))})


@register("rev", handler="rev")
def rev(op) -> OpRule:
    return _windowed(op, set(op.params["dimensions"]))


@register("concatenate", handler="concatenate")
def concatenate(op) -> OpRule:
    d = op.params["dimension"]
    b = RuleBuilder()
    out = op.outputs[0].shape
    fs = [b.factor(s, WINDOW if i == d else PASS) for i, s in enumerate(out)]
    for _ in op.inputs:
        b.operand(fs)
    return b.result(fs).build(OTHER)


def small_slice(m: int, n: int) -> bool:
    """Is a dynamic slice of m of n rows small enough that the devices holding the rows
    contribute them (a "pick" reduction), rather than the dim being gathered whole?"""
    return 2 * m < n


@register("dynamic_slice", handler="dynamic_slice")
def dynamic_slice(op) -> OpRule:
    src, out = op.inputs[0].shape, op.outputs[0].shape
    b = RuleBuilder()
    in_f, out_f = [], []
    for n, m in zip(src, out):
        if n == m:
            f = b.factor(n)
            in_f.append(f), out_f.append(f)
            continue
        in_f.append(b.factor(n, REDUCTION, "pick") if small_slice(m, n) else b.factor(n, NEED_REPLICATION))
        out_f.append(b.factor(m, NEED_REPLICATION))
    b.operand(in_f)
    for _ in op.inputs[1:]:
        b.operand([])
    return b.result(out_f).build(OTHER)


@register("dynamic_update_slice", handler="dynamic_update_slice")
def dynamic_update_slice(op) -> OpRule:
    src, upd = op.inputs[0].shape, op.inputs[1].shape
    b = RuleBuilder()
    fs = [b.factor(s, PASS if upd[i] == s else WINDOW) for i, s in enumerate(src)]
    b.operand(fs)
    b.operand([fs[i] if upd[i] == src[i] else None for i in range(len(src))])
    for _ in op.inputs[2:]:
        b.operand([])
    return b.result(fs).build(OTHER)


# -- facts -----------------------------------------------------------------------------------
def _local_slice(params: dict, shapes, local, out_local) -> dict:
    """A whole-dim slice (start 0, to the end) of a sharded dim ends at the local block's end."""
    limits = tuple(l if s == lim and st == 0 else lim for s, lim, st, l in
                   zip(shapes[0], params["limit_indices"], params["start_indices"], local[0]))
    return {**params, "limit_indices": limits}


def _local_dynamic_slice(params: dict, shapes, local, out_local) -> dict:
    return {**params, "slice_sizes": tuple(out_local[0])}


_MOVEMENT = F.OpFacts(F.ZERO, fusion=F.FUSIBLE)
declare("transpose", facts=attrs.evolve(_MOVEMENT, linearity=F.MOVE))
declare("broadcast_in_dim", facts=attrs.evolve(_MOVEMENT, linearity=F.MOVE, localize=F.local_shape))
declare("slice", facts=attrs.evolve(_MOVEMENT, linearity=F.MOVE, localize=_local_slice, access=F.WINDOW_READ))
declare("squeeze", "expand_dims", "reshape", facts=attrs.evolve(_MOVEMENT, linearity=F.MOVE, alias=F.ALWAYS))
declare("iota", facts=attrs.evolve(_MOVEMENT, localize=F.local_shape))
declare("concatenate", "rev", facts=_MOVEMENT)
declare("dynamic_slice", facts=attrs.evolve(_MOVEMENT, localize=_local_dynamic_slice, access=F.WINDOW_READ))
declare("pad", facts=attrs.evolve(_MOVEMENT, linearity=F.ZERO_PAD))
declare("dynamic_update_slice", facts=F.OpFacts(F.ZERO, inplace=True, access=F.UPDATE))
