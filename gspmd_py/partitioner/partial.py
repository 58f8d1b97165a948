"""Partial values in one place: how they are made, which ops carry them, how they are reduced.

A value is replicated, tiled, or *partial* over some mesh axes with a reduce op (sum, max,
min, and, or, xor, prod; DTensor's ``Partial(reduce_op)``; "pick": exactly one device holds
each element and the others hold zero bits, reduced bit-exactly: a dynamic slice of sharded
rows). Reduction factors of a rule
make partial results (a dot contracting a sharded dim, a max over a sharded dim); reshard
reduces them with the matching collective.

Which ops carry a partial *unreduced* is declared with each op's rule (``OpFacts.linearity``,
ops/facts.py) and read once, here (``carry_modes``): only ops that are exactly linear on
every value, inf and NaN included, in a dtype where that holds:

    neg, add/sub of two sums over the same axes, add_any (AD's cotangent sums: a
    non-partial operand joins as "the value on the first device, -0.0 elsewhere"),
    select_n on its value operands, data movement (transpose, reshape, broadcast, copy,
    slice, and pad with a constant zero: the transposes of slicing in a gradient),
    reduce_sum, float -> wider float converts, and mul / div by a plan-time constant that
    is finite (and nonzero, as a divisor).

Not mul or div by a value computed at run time (c * (a1 + a2) != c*a1 + c*a2 when c is
inf and a2 is 0), not dot (the same 0 * inf), not a narrowing convert (float16 sums
overflow), not reduce_precision. Those reduce first.

Where a partial that forks is reduced: a value whose uses would each reduce it (directly or
after carrying it) is reduced once where it is made, when that costs less (fork.py's look-ahead
over the graph; an Adam step's gradient), else each branch is reduced where it ends.

Given a hardware (``gp.spmd(..., hardware=hw)``), a sum over axes that span link levels is
reduced by the cheapest program of reduce-scatters, an all-reduce and all-gathers over
sub-groups (hierarchy.py); still one reduction of the partial, whatever its collectives.

Sums are accumulated in ``dtypes.accumulation_dtype`` (float16 in float32) and cast after
the all-reduce. Max/min all-reduces propagate NaN (XLA's CPU all-reduce does not): floats
are mapped to order-preserving integer keys with NaN at the extreme, reduced as integers
and mapped back, so no extra bytes move::

    key(x) = bits(x) ^ ((bits(x) >> (w-1)) & 0x7f..f)     (monotone: -inf < ... < -0 < +0 < ... < inf)
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import dtypes
from ..ops import facts as F
from ..ops import facts_of
from . import hierarchy
from .pvalue import Partial, PValue

KEEP, REDUCE, TO_PARTIAL = "keep", "reduce", "to_partial"



def result_dtype_ok(op, partial: Partial) -> bool:
    return partial.op == "sum" and bool(op.outputs) and not dtypes.is_bool(op.outputs[0].dtype)


def carry_modes(op, args: Sequence[PValue]) -> tuple[list[str], Optional[Partial]]:
    """How each operand enters ``op`` (KEEP its partial, REDUCE it first, or TO_PARTIAL: a
    non-partial operand joins a partial sum), and the partial the results carry."""
    reduce_all = [REDUCE] * len(args), None
    idx = [i for i, a in enumerate(args) if a.partial is not None]
    if not idx:
        return reduce_all
    p = args[idx[0]].partial
    if any(args[i].partial != p for i in idx) or not result_dtype_ok(op, p):
        return reduce_all
    lin = facts_of(op.prim).linearity
    if lin == F.MOVE:  # data movement: slice(a1 + a2) = slice(a1) + slice(a2)
        return ([KEEP] + [REDUCE] * (len(args) - 1), p) if idx == [0] else reduce_all
    if lin == F.ZERO_PAD and idx == [0] and _is_zero(op.inputs[1]):  # zero padding on every device sums to 0
        return [KEEP, REDUCE], p
    if lin == F.CONVERT:
        src, dst = np.dtype(op.inputs[0].dtype), np.dtype(op.outputs[0].dtype)
        widening = dtypes.is_float(src) and dtypes.is_float(dst) and dst.itemsize >= src.itemsize and (
            jnp.finfo(dst).nmant >= jnp.finfo(src).nmant)
        return ([KEEP], p) if (src == dst or widening) else reduce_all
    if lin in (F.NEGATE, F.SUM):
        return ([KEEP] * len(args), p) if len(idx) == len(args) else reduce_all
    if lin == F.JOIN:
        return [KEEP if a.partial is not None else TO_PARTIAL for a in args], p
    if lin in (F.SCALE, F.DIVIDE) and len(args) == 2 and len(idx) == 1 and (lin == F.SCALE or idx == [0]):
        other = op.inputs[1 - idx[0]]
        if _safe_factor(other, divisor=lin == F.DIVIDE):
            return [KEEP if i == idx[0] else REDUCE for i in range(2)], p
        return reduce_all
    if lin == F.SELECT and 0 not in idx:
        return [REDUCE] + [KEEP if a.partial is not None else TO_PARTIAL for a in args[1:]], p
    return reduce_all


def settle_kept(ctx, xs: list[PValue], modes: list[str]) -> tuple[list[str], Optional[Partial]]:
    """After the operands' reshards: the partial an op's results carry, read from the kept
    operands as the reshards returned them (a reshard onto a partial axis reduced it).

    Kept operands that no longer agree (one reduced by its reshard, another not) are all
    reduced, so each partial value is reduced exactly once; ``xs`` is updated in place.
    Returns the modes (KEEP/TO_PARTIAL become REDUCE when nothing stays partial) and the
    partial the results carry, or None."""
    kept = [i for i, m in enumerate(modes) if m == KEEP]
    partials = {xs[i].partial for i in kept}
    if len(partials) == 1 and None not in partials:
        return list(modes), partials.pop()
    for i in kept:
        xs[i] = reduce(ctx, xs[i])
    return [REDUCE] * len(modes), None


def _is_zero(v) -> bool:
    """A plan-time constant +0 or -0 (a sum of zeros is that zero on every device count)."""
    return v.const is not None and not dtypes.is_key(v.dtype) and bool(np.all(np.asarray(v.const) == 0))


def _safe_factor(v, divisor: bool) -> bool:
    """A plan-time constant c with c * (a1 + a2) == c*a1 + c*a2 for every a1, a2 (c finite;
    nonzero too as a divisor: (5 + 0) / 0 = inf but 5/0 + 0/0 = nan)."""
    if v.const is None or dtypes.is_key(v.dtype):
        return False
    c = np.asarray(v.const)
    if dtypes.is_int(c.dtype) or dtypes.is_bool(c.dtype):
        return not divisor
    if not dtypes.is_inexact(c.dtype):
        return False
    c = c.astype(np.complex128 if dtypes.is_complex(c.dtype) else np.float64)
    return bool(np.all(np.isfinite(c)) and (not divisor or np.all(c != 0)))


# ops whose result is zero in every element when their first operand is (and any other is not data)
_ZERO_KEEPING = frozenset({"broadcast_in_dim", "convert_element_type", "reshape", "transpose", "copy", "squeeze"})


def zero_everywhere(v, depth: int = 8) -> bool:
    """``v`` is zero in every element whatever the inputs: a plan-time constant zero, or one
    broadcast / reshaped / converted / transposed from one (``jnp.zeros``, the zeros a
    segment_sum or an embedding's gradient scatter-adds into, a backward scan's gradient
    accumulator). Held on every device it already is a partial sum of itself (n zeros sum to
    that zero, +0.0 and -0.0 alike), so it joins a partial as it is (``join(..., zero=True)``)."""
    if _is_zero(v):
        return True
    op = v.producer
    if op is None or depth <= 0 or op.prim not in _ZERO_KEEPING or not op.inputs:
        return False
    return zero_everywhere(op.inputs[0], depth - 1)


def join(ctx, x, partial: Partial, acc_dtype, zero: bool = False):
    """A non-partial local value as a partial sum: itself on the first device of the partial
    axes, the additive identity (-0.0 for floats) elsewhere; ``zero``: the value is zero
    everywhere (``zero_everywhere``), a partial sum of itself on every device already: as it is."""
    x = x.astype(acc_dtype)
    if zero:
        return x
    return jnp.where(ctx.index(partial.axes) == 0, x, jnp.asarray(dtypes.additive_identity(acc_dtype)))


def accumulate(pv_dtype, op: str):
    return dtypes.accumulation_dtype(op, pv_dtype)


# ------------------------------------------------------------------------------------------
# reducing
# ------------------------------------------------------------------------------------------

def all_reduce(ctx, x, axes: Sequence[str], op: str, dtype):
    """x (partial over ``axes`` with ``op``) reduced over them, cast to ``dtype``."""
    axes = tuple(axes)
    if not axes:
        return x.astype(dtype)
    if op == "sum":
        if dtypes.is_bool(x.dtype):
            return ctx.all_reduce(x.astype(jnp.uint8), axes, "max").astype(dtype)
        return hierarchy.all_reduce_sum(ctx, x, axes).astype(dtype)
    if op in ("max", "min"):
        return _nan_aware(ctx, x, axes, op).astype(dtype)
    if op == "pick":  # one device holds each element, the others zero bits: sum the bits
        return _pick(ctx, x, axes).astype(dtype)
    if op in ("and", "or") and dtypes.is_bool(x.dtype):
        return ctx.all_reduce(x.astype(jnp.uint8), axes, "min" if op == "and" else "max").astype(dtype)
    # prod, xor, bitwise and/or of integers: gather the partial results and reduce them locally
    g = ctx.all_gather(x[None], axes, 0)
    fn = {"prod": jnp.prod, "xor": lambda v, axis: lax.reduce_xor_p.bind(v, axes=(axis,)),
          "and": lambda v, axis: lax.reduce_and_p.bind(v, axes=(axis,)),
          "or": lambda v, axis: lax.reduce_or_p.bind(v, axes=(axis,))}[op]
    return fn(g, axis=0).astype(dtype)


def _pick(ctx, x, axes):
    """The holder's value, bit for bit (-0.0, NaN payloads, inf): an integer sum of the bit
    patterns, since every other device contributes zero bits (a float sum would turn -0.0
    into +0.0: XLA's all-reduce starts from +0.0)."""
    if dtypes.is_bool(x.dtype):
        return ctx.all_reduce(x.astype(jnp.uint8), axes, "max").astype(jnp.bool_)
    bits = _bits(x.dtype)
    if bits is None:
        return ctx.all_reduce(x, axes, "sum")
    return lax.bitcast_convert_type(ctx.all_reduce(lax.bitcast_convert_type(x, bits), axes, "sum"), x.dtype)


def _bits(dtype):
    """The unsigned integer type a float's bit pattern is summed in (None: an integer, summed as it is)."""
    if dtypes.is_int(dtype):
        return None
    return {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[np.dtype(dtype).itemsize]


def _nan_aware(ctx, x, axes, op: str):
    if dtypes.is_bool(x.dtype):
        return ctx.all_reduce(x.astype(jnp.uint8), axes, op).astype(jnp.bool_)
    if not dtypes.is_float(x.dtype):
        return ctx.all_reduce(x, axes, op)
    bits = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[np.dtype(x.dtype).itemsize]
    nan = jnp.asarray(np.nan if op == "max" else -np.nan, x.dtype)
    xc = jnp.where(jnp.isnan(x), nan, x)
    b = lax.bitcast_convert_type(xc, bits)
    w = np.dtype(bits).itemsize * 8
    low = jnp.asarray(np.iinfo(bits).max, bits)
    key = b ^ ((b >> (w - 1)) & low)
    key = ctx.all_reduce(key, axes, op)
    b = key ^ ((key >> (w - 1)) & low)
    return lax.bitcast_convert_type(b, x.dtype)


def reduce_scatter(ctx, x, axes: Sequence[str], op: str, dtype, dim: int):
    """Reduce over ``axes`` leaving each device its block of ``dim`` (tiled over ``axes``)."""
    if op == "sum" and not dtypes.is_bool(x.dtype):
        return hierarchy.reduce_scatter_sum(ctx, x, tuple(axes), dim).astype(dtype)
    if op == "pick" and not dtypes.is_bool(x.dtype):  # one holder per element: sum the bit patterns
        bits = _bits(x.dtype)
        y = ctx.reduce_scatter(x if bits is None else lax.bitcast_convert_type(x, bits), tuple(axes), dim)
        return (y if bits is None else lax.bitcast_convert_type(y, x.dtype)).astype(dtype)
    full = all_reduce(ctx, x, axes, op, dtype)
    c = full.shape[dim] // ctx.k(axes)
    return lax.dynamic_slice_in_dim(full, ctx.index(axes) * c, c, axis=dim)


def reduce(ctx, pv: PValue) -> PValue:
    """pv with its partial reduced over all its axes (the same dims, no longer partial)."""
    if pv.partial is None:
        return pv
    x = all_reduce(ctx, pv.x, pv.partial.axes, pv.partial.op, pv.dtype)
    return ctx.pv(x, pv.shape, pv.dims, dtype=pv.dtype)
