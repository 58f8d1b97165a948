"""Collective matmul (CollectiveEinsum, Wang et al. ASPLOS 2023; XLA's windowed einsum): the
collective next to a dot becomes a ring of collective-permutes and partial dots, so each
step's communication overlaps the previous step's dot.

All-gather feeding a dot: operand i sharded over axes ``A`` (P devices) on a free dim that
the dot wants whole. Device j holds chunk j; at step s it holds chunk (j - s) mod P, dots
it with the other operand into its rows of the result, and passes it on (j -> j+1)::

    a [M,K]{x,-} @ b [K,N]{-,x}:   all-gather(a) ; dot            (plain)
                                   P dots of [M/P,K] ; P-1 permutes of a's shard

Bidirectional (on a torus ring, whose links carry both directions): the chunk's first half
travels j -> j+1 and its second half j -> j-1, 2(P-1) permutes of half a shard.

Dot feeding a reduce-scatter: the dot's sum over ``A`` is wanted scattered over ``A`` on a
free dim of operand i. At step s device j computes the partial of block (j-1-s) mod P, adds
it to the accumulator it received, and passes it on; after P-1 permutes it holds its own
block, reduced::

    a [M,K]{-,x} @ b [K,N]{x,-} -> [M,N]{x,-}:   dot ; reduce-scatter       (plain)
                                                P dots of [M/P,K] ; P-1 permutes of [M/P,N]

All-gather of a contracting dim feeding a dot: operand i's contracting dim sharded over
``A``, the other operand's partner dim whole. At step s device j holds block (j - s) mod P,
multiplies it with the other operand's rows of that block and adds the product up (in
float32 at least); the block passes on::

    a [M,K]{x,-} @ b [K,N]{x,-}:   all-gather(b) ; dot            (plain)
                                   P dots of [M/P,K/P] @ [K/P,N] accumulated ; P-1 permutes of b's shard

Uneven dims: the looped dim is padded to P chunks (the padding rows are cut, land in the
canonical padding of the scattered result, or read as zero); uneven contracting dims are
masked as in the plain dot.

Each ring is ONE loop (``lax.fori_loop``, a scan) over its steps, so the program does not
grow with P (an unrolled ring over 256 devices was 0.5-1 GiB of StableHLO): inside a step
the permute that feeds the next step does not depend on the step's dot, so XLA runs them
side by side. ``plan.collectives`` lists the ring's permute once, ``in_loop``.

When: ``collective_matmul_bytes`` given: when the looped buffer (the shard, or the
accumulator) reaches that many bytes per device. Else with a hardware: when the overlapped
schedule, priced with the cost model's formulas (a permute per step beside a P-th of the
dot), beats the collective and then the whole dot. Else never.
"""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops import facts as F
from ..ops import facts_of
from ..ops.collectives import ALL_GATHER, COLLECTIVE_PERMUTE, REDUCE_SCATTER
from ..core import dtypes
from . import hierarchy
from .context import Ctx, pad_dim
from .pvalue import PValue, ceil_div
from .shaping import Shaped


def _free_dims(ndim: int, contract, batch) -> list[int]:
    return [d for d in range(ndim) if d not in contract and d not in batch]


def _out_dim(op, i: int, d: int) -> int:
    """Result dim of operand i's free dim d (dot_general: batch, lhs free, rhs free)."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    nl = op.inputs[0].rank
    lf = _free_dims(nl, lc, lb)
    rf = _free_dims(op.inputs[1].rank, rc, rb)
    return len(lb) + (lf.index(d) if i == 0 else len(lf) + rf.index(d))


def _bidirectional(ctx: Ctx, axes) -> bool:
    hw = ctx.shaping.hardware
    if hw is None:
        return False
    levels = hw.levels(ctx.fine.mesh, ctx.fine.coarse(axes))
    return bool(levels) and all(lv.link.all_to_all == "ring" for lv in levels)


def _pays(ctx: Ctx, kind: str, coll_bytes: int, looped: int, dot: tuple[float, int, int, int], dtype, p: int,
          parts: int, axes) -> tuple[bool, float, float]:
    """Whether to decompose, with (decomposed, plain) predicted seconds (nan without a hardware).

    ``dot``: (flops, bytes of the looped operand whole, bytes of the other operand, bytes of
    the result) of the plain dot; the decomposed one runs ``parts`` partial dots, each
    reading the whole other operand (the cost model's time per equation: max of FLOPs at
    peak and bytes at memory bandwidth, plus a launch)."""
    hw, thr = ctx.shaping.hardware, ctx.shaping.collective_matmul_bytes
    if hw is None:
        return thr is not None and looped >= thr, float("nan"), float("nan")
    refs = ctx.fine.coarse(axes)
    flops, whole, other, result = dot
    t_dot = max(flops / hw.peak(dtype), (whole + other + result) / hw.mem_bandwidth) + hw.op_overhead
    t_part = max(flops / parts / hw.peak(dtype), (whole / parts + other + 2 * result / parts) / hw.mem_bandwidth)
    t_part += hw.op_overhead
    if kind == REDUCE_SCATTER:  # the plain program's reduce-scatter, phased where that is cheaper
        t_coll = hierarchy.reduce_scatter_time(ctx, tuple(axes), coll_bytes)
    else:
        t_coll = hw.collective_time(kind, coll_bytes, ctx.fine.mesh, refs)
    plain = t_coll + t_dot
    per_step = parts // p
    step = per_step * hw.collective_time(COLLECTIVE_PERMUTE, looped // per_step, ctx.fine.mesh, refs)
    # a step's partial dots beside the permutes feeding the next step; the first step's dots wait for nothing
    ovl = per_step * t_part + (p - 1) * max(per_step * t_part, step)
    if thr is not None:
        return looped >= thr, ovl, plain
    return ovl < plain, ovl, plain


def _record(ctx: Ctx, what: str, chosen: str, t: float, plain: float) -> None:
    ctx.record_shaped(Shaped(ctx.current_op, what, chosen, t, plain, "matmul"))


def _dot(ctx: Ctx, op, xl, xr, partial: bool):
    params = dict(op.params)
    if partial:
        acc = dtypes.accumulation_dtype("sum", op.outputs[0].dtype)
        if acc != np.dtype(op.outputs[0].dtype):
            params["preferred_element_type"] = acc
    return op.primitive.bind(xl, xr, **params)


def _mod(x, k: int, p: int):
    """(x + k) mod p for a device index 0 <= x < p, as one integer remainder."""
    return lax.rem(x + jnp.int32(k % p + p), jnp.int32(p))


def _ring(ctx: Ctx, x, axes, step: int):
    """x sent from each device to the one ``step`` after it (mod P) over ``axes``."""
    p = ctx.k(axes)
    return ctx.permute(x, axes, [(j, (j + step) % p) for j in range(p)])


# -- all-gather feeding a dot ------------------------------------------------------------------

def looped_operand(op, args, targets) -> Optional[tuple[int, int, tuple[str, ...]]]:
    """(operand i, dim d, axes A) when operand i differs from its target only by A on a dim
    d that the dot wants whole, and nothing else needs moving there; else None. ``d`` is a
    free dim, or a contracting dim whose partner in the other operand is whole."""
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    for i, (a, t) in enumerate(zip(args, targets)):
        if a.partial is not None:
            return None
        diff = [d for d in range(a.rank) if tuple(a.dims[d]) != tuple(t[d])]
        if not diff:
            continue
        if len(diff) != 1:
            return None
        d = diff[0]
        mine, theirs = (lc, rc) if i == 0 else (rc, lc)
        if t[d] or d in (lb if i == 0 else rb):
            return None
        if d in mine and targets[1 - i][theirs[list(mine).index(d)]]:
            return None
        return i, d, tuple(a.dims[d])
    return None


def _put(y, part, od: int, start):
    """``part`` written into ``y`` at ``start`` along dim ``od`` (0 elsewhere)."""
    at = [jnp.int32(0)] * y.ndim
    at[od] = start
    return lax.dynamic_update_slice(y, part, at)


def _two_operand_dot(op) -> bool:
    """A dot of two operands (dot_general; a ragged dot's third operand, its group sizes, rules it out)."""
    return facts_of(op.prim).flops == F.DOT_FLOPS and len(op.inputs) == 2


def all_gather_dot(ctx: Ctx, op, rule, plan, args, targets, reshard) -> Optional[list[PValue]]:
    if not _two_operand_dot(op) or not ctx.shaping.matmul or any(a.partial is not None for a in args):
        return None
    found = looped_operand(op, args, targets)
    if found is None:
        return None
    i, d, axes = found
    j = 1 - i
    a = args[i]
    p = ctx.k(axes)
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    contracting = d in (lc if i == 0 else rc)
    out = op.outputs[0]
    if p < 2 or 0 in a.shape or (contracting and dtypes.is_bool(out.dtype)):
        return None
    c = ceil_div(a.shape[d], p)
    local_a = ctx.local_shape(a.shape, a.dims)
    item = np.dtype(a.x.dtype).itemsize
    shard = int(math.prod(local_a)) * item
    other_local = ctx.local_shape(args[j].shape, targets[j])
    contract = math.prod(other_local[k] for k in (rc if i == 0 else lc))
    out_full = ctx.local_shape(out.shape, plan.results[0])
    flops = 2.0 * math.prod(out_full) * contract
    bidir = _bidirectional(ctx, axes) and c >= 2 and not contracting
    other_bytes = int(math.prod(other_local)) * np.dtype(args[j].x.dtype).itemsize
    out_bytes = int(math.prod(out_full)) * np.dtype(out.dtype).itemsize
    go, t, plain = _pays(ctx, ALL_GATHER, shard, shard, (flops, shard * p, other_bytes, out_bytes), a.x.dtype, p,
                         2 * p if bidir else p, axes)
    if not go:
        return None
    xj = reshard(ctx, args[j], targets[j], keep_partial=False)
    red = plan.partial_axes
    xa = a.x
    if red or contracting:  # contracting padding reads as zero on both sides, as in the plain dot
        xa = ctx.mask(a, lc if i == 0 else rc, 0)
        xj = ctx.pv(ctx.mask(xj, rc if i == 0 else lc, 0), xj.shape, xj.dims, None, xj.dtype)
    if contracting:
        y = _contracting_ring(ctx, op, i, d, xa, xj.x, axes, c, bool(red))
        what = f"{p} partial dots accumulated and {p - 1} collective-permutes"
    else:
        y = _free_ring(ctx, op, i, d, xa, xj.x, axes, c, bool(red), bidir)
        what = f"{p} partial dots and {(2 if bidir else 1) * (p - 1)} {'bidirectional ' if bidir else ''}" \
               f"collective-permutes"
    _record(ctx, f"all-gather({ctx.fine.label(axes)}) {shard}B + dot", what, t, plain)
    return [ctx.pv(y, out.shape, plan.results[0], plan.partial, out.dtype)]


def _free_ring(ctx: Ctx, op, i: int, d: int, xa, xo, axes, c: int, red: bool, bidir: bool):
    """The looped operand's free dim d: at step s device j holds chunk (j - s) mod P (and,
    bidirectional, the second halves of chunk (j + s) mod P), dots it into its rows of the
    result and passes it on. One loop over the P - 1 steps that send (a step's dots do not
    wait for its permutes), the last step's dots after it: the program does not grow with P."""
    out = op.outputs[0]
    od = _out_dim(op, i, d)
    p = ctx.k(axes)
    me = ctx.index(axes)

    def dot_with(chunk):
        return _dot(ctx, op, chunk, xo, red) if i == 0 else _dot(ctx, op, xo, chunk, red)

    part = jax.eval_shape(dot_with, xa)
    shape = list(part.shape)
    shape[od] = p * c
    y = jnp.zeros(shape, part.dtype)
    h = c // 2

    def step(s, carry):
        y, chunks = carry
        if bidir:
            fwd, bwd = chunks
            y = _put(y, dot_with(fwd), od, _mod(me - s, 0, p) * jnp.int32(c))
            y = _put(y, dot_with(bwd), od, _mod(me + s, 0, p) * jnp.int32(c) + jnp.int32(h))
            return y, (fwd, bwd)
        return _put(y, dot_with(chunks[0]), od, _mod(me - s, 0, p) * jnp.int32(c)), chunks

    def body(s, carry):
        y, chunks = carry
        sent = (_ring(ctx, chunks[0], axes, 1),) + ((_ring(ctx, chunks[1], axes, -1),) if bidir else ())
        y, _ = step(s, (y, chunks))
        return y, sent

    chunks = (lax.slice_in_dim(xa, 0, h, axis=d), lax.slice_in_dim(xa, h, c, axis=d)) if bidir else (xa,)
    y, chunks = lax.fori_loop(0, p - 1, body, (y, chunks))
    y, _ = step(jnp.int32(p - 1), (y, chunks))
    return lax.slice_in_dim(y, 0, out.shape[od], axis=od)


def _contracting_ring(ctx: Ctx, op, i: int, d: int, xa, xo, axes, c: int, red: bool):
    """The looped operand's contracting dim d: at step s device j holds block (j - s) mod P of
    it, multiplies it with the same rows of the other operand's (whole) contracting dim and
    adds the product to its result; the block passes on. P dots, P - 1 permutes, one loop."""
    (lc, rc), _ = op.params["dimension_numbers"]
    mine, theirs = (lc, rc) if i == 0 else (rc, lc)
    e = theirs[list(mine).index(d)]
    p = ctx.k(axes)
    me = ctx.index(axes)
    xo = pad_dim(xo, e, p * c)
    out = op.outputs[0]
    held = dtypes.accumulation_dtype("sum", out.dtype)  # what a partial result is held in
    # the P partial products add up in float32 at least (the plain dot accumulates so inside)
    acc_dtype = np.promote_types(held, np.float32) if jnp.issubdtype(held, jnp.floating) else np.dtype(held)

    def dot_block(s, chunk):
        rows = lax.dynamic_slice_in_dim(xo, _mod(me - s, 0, p) * jnp.int32(c), c, axis=e)
        pair = (chunk, rows) if i == 0 else (rows, chunk)
        params = dict(op.params, preferred_element_type=acc_dtype)
        return op.primitive.bind(pair[0], pair[1], **params).astype(acc_dtype)

    def body(s, carry):
        acc, chunk = carry
        return acc + dot_block(s, chunk), _ring(ctx, chunk, axes, 1)

    acc = jnp.zeros(jax.eval_shape(dot_block, jnp.int32(0), xa).shape, acc_dtype)
    acc, chunk = lax.fori_loop(0, p - 1, body, (acc, xa))
    acc = acc + dot_block(jnp.int32(p - 1), chunk)
    return acc.astype(held if red else out.dtype)  # a partial is held as _dot holds it


# -- dot feeding a reduce-scatter --------------------------------------------------------------

def scattered_dim(ctx: Ctx, op, rule, plan, args) -> Optional[tuple[int, int, int]]:
    """(operand i, its free dim d, result dim) when the dot's sum over its reduction axes is
    wanted scattered over exactly them on a result dim that is whole in the projection."""
    red = plan.partial_axes
    out = op.outputs[0]
    if not red or dtypes.is_bool(out.dtype) or plan.partial_op != "sum":
        return None
    want = ctx.want.get(out.id)
    res = plan.results[0]
    if want is None:
        return None
    diff = [k for k in range(out.rank) if tuple(want[k]) != tuple(res[k])]
    if len(diff) != 1 or res[diff[0]] or tuple(want[diff[0]]) != tuple(red):
        return None
    od = diff[0]
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    for i in (0, 1):
        free = _free_dims(op.inputs[i].rank, lc if i == 0 else rc, lb if i == 0 else rb)
        for d in free:
            if _out_dim(op, i, d) == od and not args[i].dims[d]:
                return i, d, od
    return None


def dot_reduce_scatter(ctx: Ctx, op, rule, plan, args) -> Optional[list[PValue]]:
    found = scattered_dim(ctx, op, rule, plan, args) if ctx.shaping.matmul else None
    if found is None:
        return None
    i, d, od = found
    axes = plan.partial_axes
    p = ctx.k(axes)
    out = op.outputs[0]
    if p < 2 or 0 in out.shape or 0 in args[0].shape or 0 in args[1].shape:
        return None
    (lc, rc), _ = op.params["dimension_numbers"]
    xl, xr = ctx.mask(args[0], lc, 0), ctx.mask(args[1], rc, 0)
    acc_dtype = dtypes.accumulation_dtype("sum", out.dtype)
    n = args[i].shape[d]
    c = ceil_div(n, p)
    full = list(ctx.local_shape(out.shape, plan.results[0]))
    full[od] = c
    looped = int(math.prod(full)) * np.dtype(acc_dtype).itemsize
    contract = math.prod(xl.shape[k] for k in lc)
    flops = 2.0 * math.prod(full) * p * contract
    sizes = [int(x.size) * np.dtype(x.dtype).itemsize for x in (xl, xr)]
    go, t, plain = _pays(ctx, REDUCE_SCATTER, looped * p, looped, (flops, sizes[i], sizes[1 - i], looped * p),
                         xl.dtype, p, p, axes)
    if not go:
        return None
    xs = [xl, xr]
    xs[i] = pad_dim(xs[i], d, p * c)
    me = ctx.index(axes)

    def part(s):  # the partial of block (j - 1 - s) mod P
        ops = list(xs)
        ops[i] = lax.dynamic_slice_in_dim(xs[i], _mod(me - s, -1, p) * jnp.int32(c), c, axis=d)
        return _dot(ctx, op, ops[0], ops[1], True).astype(acc_dtype)

    # one loop over the steps that receive (the step's dot does not wait for the permute)
    acc = lax.fori_loop(1, p, lambda s, acc: _ring(ctx, acc, axes, 1) + part(s), part(jnp.int32(0)))
    want = tuple(tuple(w) for w in ctx.want[out.id])
    _record(ctx, f"dot + reduce-scatter({ctx.fine.label(axes)}) {looped * p}B",
            f"{p} partial dots and {p - 1} collective-permutes of the accumulator", t, plain)
    return [ctx.pv(acc.astype(out.dtype), out.shape, want, None, out.dtype)]
