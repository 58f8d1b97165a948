"""FLOPs and bytes of one equation of the per-device program (local shapes).

FLOPs (multiply and add count 2, as XLA's HloCostAnalysis does):

* ``dot_general``: ``2 * batch * lhs_free * rhs_free * contracting``
* ``conv_general_dilated``: ``2 * N_out * C_out * C_in_per_group * taps``, ``taps`` the
  product over spatial dims of the kernel positions that land on real input (not on
  padding or on the holes of lhs dilation), counted exactly per output position
* elementwise ops: 1 per output element (and 1 transcendental for exp, log, tanh, ...);
  reductions 1 per input element; sort ``n log2(len)``; windowed reductions
  ``out * window``; data movement (reshape, transpose, slice, gather, ...) 0.

Which count applies is the op's ``OpFacts.flops`` (declared with its rule in ``ops/``);
an op nobody declared counts one per output element.

Bytes: what an equation reads and writes under XLA-style loop fusion (``materialized``):
a value produced by a fusible op (elementwise, broadcast, layout) and consumed only by
fusible ops (or reductions) never reaches memory; everything else does. ``reshape``-like
ops and identities alias their operand (no bytes, no buffer).

    >>> import jax, jax.numpy as jnp
    >>> j = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b) + 1)(jnp.ones((8, 16)), jnp.ones((16, 4))).jaxpr
    >>> [eqn_flops(e) for e in j.eqns]        # dot 2*8*16*4, tanh 32 (+32 transcendental), add 32
    [(1024, 0), (32, 32), (32, 0)]
"""
from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np

from ..ops import facts as F
from ..ops import facts_of

def nbytes(aval) -> int:
    return math.prod(aval.shape) * _itemsize(aval.dtype)


@functools.lru_cache(maxsize=256)  # a pure function of the dtype; every equation of every priced program asks
def _itemsize(dt) -> int:
    try:
        return np.dtype(dt).itemsize
    except TypeError:  # extended dtypes (PRNG keys)
        return getattr(dt, "itemsize", 8)


def size(aval) -> int:
    return math.prod(getattr(aval, "shape", ()))


def is_alias(eqn) -> bool:
    facts = facts_of(eqn.primitive.name)
    if facts.alias == F.SAME_DTYPE:
        return eqn.invars[0].aval.dtype == eqn.outvars[0].aval.dtype
    return facts.alias == F.ALWAYS


def fusible_producer(eqn) -> bool:
    return facts_of(eqn.primitive.name).fusible


def fusible_consumer(eqn) -> bool:
    return facts_of(eqn.primitive.name).fused_consumer


def is_free(eqn) -> bool:
    """Nothing runs: an alias of its operand, or an op that costs nothing (axis_index)."""
    return facts_of(eqn.primitive.name).flops == F.FREE or is_alias(eqn)


def eqn_flops(eqn) -> tuple[int, int]:
    """(FLOPs, transcendental elements) of one equation, without its sub-jaxprs."""
    facts = facts_of(eqn.primitive.name)
    kind = facts.flops
    p = eqn.params
    outs = [v.aval for v in eqn.outvars]
    if kind == F.DOT_FLOPS:
        ragged = p.get("ragged_dot_dimension_numbers")  # ragged_dot_general: each row meets one group
        (lc, rc), (lb, rb) = p["dimension_numbers"] if ragged is None else ragged.dot_dimension_numbers
        groups = () if ragged is None else tuple(ragged.rhs_group_dimensions)
        la, ra = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
        batch = _prod(la[d] for d in lb)
        contract = _prod(la[d] for d in lc)
        lfree = _prod(la[d] for d in range(len(la)) if d not in lc and d not in lb)
        rfree = _prod(ra[d] for d in range(len(ra)) if d not in rc and d not in rb and d not in groups)
        return 2 * batch * lfree * rfree * contract, 0
    if kind == F.CONV_FLOPS:
        return conv_flops(eqn), 0
    if kind in (F.FREE, F.ZERO) or is_alias(eqn) or facts.collective:
        return 0, 0
    if kind in (F.ELEMENTWISE_FLOPS, F.PER_OUTPUT):
        n = sum(size(a) for a in outs)
        return n, (n if facts.transcendental else 0)
    if kind == F.REDUCTION_FLOPS:
        return sum(size(v.aval) for v in eqn.invars), 0
    if kind == F.CUMULATIVE_FLOPS:
        n = size(eqn.invars[0].aval)
        return n, (n if facts.transcendental else 0)
    if kind == F.SORT_FLOPS:
        a = eqn.invars[0].aval
        dim = a.shape[p.get("dimension", -1)] if a.shape else 1
        return size(a) * max(1, math.ceil(math.log2(max(dim, 2)))) * len(eqn.invars), 0
    if kind == F.TOP_K_FLOPS:
        a = eqn.invars[0].aval
        return size(a) * max(1, math.ceil(math.log2(max(p.get("k", 1), 2)))), 0
    if kind == F.FACTOR_FLOPS:
        a = eqn.invars[0].aval
        core = min(a.shape[-2:]) if len(a.shape) >= 2 else 1
        return size(a) * core, 0
    if kind == F.FFT_FLOPS:
        a = eqn.invars[0].aval
        n = _prod(p.get("fft_lengths", ()))
        return 5 * size(a) * max(1, math.ceil(math.log2(max(n, 2)))), 0
    if kind == F.SCATTER_FLOPS:
        return size(eqn.invars[2].aval) if len(eqn.invars) > 2 else 0, 0
    if kind == F.WINDOW_FLOPS:
        window = _prod(p.get("window_dimensions", ()))
        return sum(size(a) for a in outs) * window, 0
    if kind == F.SELECT_SCATTER_FLOPS:
        window = _prod(p.get("window_dimensions", ()))
        return size(eqn.invars[0].aval) * window, 0
    raise AssertionError(f"unknown FLOPs kind {kind!r}")


def conv_flops(eqn) -> int:
    """Exact multiply-adds x 2 of a conv_general_dilated: only taps that land on real input."""
    p = eqn.params
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    out = eqn.outvars[0].aval.shape
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    n_out, c_out = out[out_spec[0]], out[out_spec[1]]
    c_in = rhs[rhs_spec[1]]  # input features per group
    taps = 1
    strides = p["window_strides"]
    pads = p["padding"]
    lhs_dil = p.get("lhs_dilation") or (1,) * len(strides)
    rhs_dil = p.get("rhs_dilation") or (1,) * len(strides)
    for i in range(len(strides)):
        taps *= valid_taps(lhs[lhs_spec[2 + i]], rhs[rhs_spec[2 + i]], out[out_spec[2 + i]], strides[i],
                           pads[i][0], lhs_dil[i], rhs_dil[i])
    return 2 * n_out * c_out * c_in * taps


def valid_taps(n_in: int, k: int, n_out: int, stride: int, pad_lo: int, lhs_dil: int, rhs_dil: int) -> int:
    """Sum over output positions of the kernel taps that read a real input element."""
    if n_in == 0 or k == 0 or n_out == 0:
        return 0
    o = np.arange(n_out, dtype=np.int64)[:, None]
    t = np.arange(k, dtype=np.int64)[None, :]
    pos = o * stride + t * rhs_dil - pad_lo  # position in the lhs-dilated input
    ok = (pos >= 0) & (pos <= (n_in - 1) * lhs_dil) & (pos % lhs_dil == 0)
    return int(ok.sum())


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out
