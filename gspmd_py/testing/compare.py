"""Comparing a partitioned result with its reference: what must be exact, and how close floats must be.

Integers and bools are compared bit for bit. Floats are compared by what computed them (read
from the function's jaxpr):

* only data movement (reshape, transpose, slice, concatenate, gather, select, negate...):
  the same bits (NaN == NaN, the signs of zeros and infinities);
* movement plus max/min and comparisons: the same, except that a zero may have either sign
  (IEEE 754 leaves max(-0.0, +0.0) open; a reduction in another order picks the other one);
* arithmetic: NaN where NaN, the same infinities, finite values within
  ``factor * eps * (|want| + scale)``: ``eps`` the dtype's, ``factor`` 8 plus log2 of the largest
  reduction in the program (a sum split over devices is rounded in another order), ``scale``
  the largest finite magnitude among the inputs and the reference's intermediate values.

``tol=`` overrides the automatic relative tolerance with a number.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import attrs
import jax.numpy as jnp
import numpy as np

from ..core import dtypes

EXACT, EXACT_UP_TO_ZERO_SIGN, INEXACT = 2, 1, 0
EXACTNESS_NAMES = {EXACT: "bit-exact", EXACT_UP_TO_ZERO_SIGN: "exact up to the sign of zero", INEXACT: "within tolerance"}

MOVEMENT = {
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "rev", "gather", "select_n", "copy", "copy_p", "neg", "abs",
    "convert_element_type", "iota", "gspmd_annotate", "gspmd_tag", "sharding_constraint", "pjit", "jit",
    "closed_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint",
    "stop_gradient", "sort", "argsort", "argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge", "not", "and", "or",
    "xor", "sign", "floor", "ceil", "round", "is_finite", "scan", "while", "cond", "split", "squeeze",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "bitcast_convert_type", "device_put",
    "clamp", "top_k", "reduce_and", "reduce_or", "reduce_xor", "scatter", "mesh_cast", "reshard",
}
MAXMIN = {"max", "min", "reduce_max", "reduce_min", "cummax", "cummin", "reduce_window_max", "reduce_window_min",
          "argmax", "argmin", "select_and_gather_add", "pmax", "pmin"}


def sub_jaxprs(params) -> list:
    """The jaxprs inside an equation's params (scan/while/cond bodies, calls)."""
    out = []
    for v in params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            j = getattr(x, "jaxpr", x)
            if hasattr(j, "eqns"):
                out.append(j)
    return out


def walk_eqns(jaxpr):
    """Every equation of ``jaxpr`` (a Jaxpr or ClosedJaxpr), bodies included, in order."""
    j = getattr(jaxpr, "jaxpr", jaxpr)
    for e in j.eqns:
        yield e
        for s in sub_jaxprs(e.params):
            yield from walk_eqns(s)


def count_ops(jaxpr) -> int:
    """The program's ops as a reader counts them: equations other than annotations and calls' wrappers."""
    skip = {"gspmd_annotate", "gspmd_tag", "pjit", "jit", "closed_call", "custom_jvp_call", "custom_vjp_call"}
    return sum(1 for e in walk_eqns(jaxpr) if e.primitive.name not in skip)


def _reduction_size(e) -> int:
    name, p = e.primitive.name, e.params
    try:
        shape = e.invars[0].aval.shape
        if name in ("reduce_sum", "reduce_prod", "argmax", "argmin"):
            return math.prod(shape[a] for a in p.get("axes", ()))
        if name == "dot_general":
            (lc, _), _ = p["dimension_numbers"]
            return math.prod(shape[a] for a in lc)
        if name in ("cumsum", "cumprod", "cumlogsumexp"):
            return shape[p["axis"]]
        if name == "conv_general_dilated":
            return math.prod(e.invars[1].aval.shape)
        if name.startswith("reduce_window"):
            return math.prod(p.get("window_dimensions", (1,)))
        if name == "scan":
            return int(p.get("length", 1)) * max([1] + [_reduction_size(s) for s in walk_eqns(p["jaxpr"])])
    except (KeyError, TypeError, IndexError, ValueError):
        return 1
    return 1


@attrs.frozen
class Analysis:
    """What the comparison needs to know about a function's program (from its jaxpr)."""

    exactness: int  # for float outputs
    max_reduction: int
    n_ops: int


def analyze(closed_jaxpr) -> Analysis:
    """How exactly the partitioned program must match the unpartitioned one (EXACT, EXACT_UP_TO_ZERO_SIGN or INEXACT) and the largest reduction size, read from the jaxpr's ops."""
    e = EXACT
    k = 1
    for eqn in walk_eqns(closed_jaxpr):
        name = eqn.primitive.name
        k = max(k, _reduction_size(eqn))
        if name in MOVEMENT:
            continue
        if name in MAXMIN:
            e = min(e, EXACT_UP_TO_ZERO_SIGN)
            continue
        e = INEXACT
    return Analysis(e, k, count_ops(closed_jaxpr))


def float_factor(analysis: Analysis) -> float:
    return 8.0 + math.log2(1 + analysis.max_reduction)


def _bits_equal(g, w, zero_sign_free: bool):
    """Elementwise: the same value bit for bit (NaN == NaN); with ``zero_sign_free`` a zero may have either sign."""
    if not dtypes.is_float(w.dtype):
        return g == w
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    same_sign = np.signbit(g64) == np.signbit(w64)
    if zero_sign_free:
        same_sign = same_sign | (w64 == 0)
    return ((g64 == w64) & same_sign) | (np.isnan(g64) & np.isnan(w64))


def diff(got, want, exactness: int, rtol: float, scale: float) -> tuple[str, Optional[tuple]]:
    """('' or what differs, the index of the first differing element or None)."""
    g, w = np.asarray(got), np.asarray(want)
    if g.dtype != w.dtype or g.shape != w.shape:
        return f"got {dtypes.short_name(g.dtype)}{list(g.shape)}, want {dtypes.short_name(w.dtype)}{list(w.shape)}", None
    if g.size == 0:
        return "", None
    g, w = np.atleast_1d(g), np.atleast_1d(w)
    if np.iscomplexobj(w):  # as (real, imag) float pairs: NaN == NaN, tolerances per part
        bad = _bad(np.stack([g.real, g.imag], -1), np.stack([w.real, w.imag], -1), exactness, rtol, scale).any(-1)
    else:
        bad = _bad(g, w, exactness, rtol, scale)
    if not bad.any():
        return "", None
    i = tuple(int(v[0]) for v in np.nonzero(bad))
    return f"{int(bad.sum())} of {bad.size} elements differ, first at {list(i)}: got {g[i]!r}, want {w[i]!r}", i


def _bad(g, w, exactness: int, rtol: float, scale: float):
    """Elementwise: does ``g`` differ from ``w`` (real dtypes)?"""
    if not dtypes.is_float(w.dtype) or exactness != INEXACT:
        return ~_bits_equal(g, w, exactness == EXACT_UP_TO_ZERO_SIGN)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    gn, wn = np.isnan(g64), np.isnan(w64)
    fin = np.isfinite(g64) & np.isfinite(w64)
    bad = (gn != wn) | (~fin & ~gn & ~wn & (g64 != w64))
    with np.errstate(all="ignore"):
        err = np.abs(g64 - w64) > rtol * (np.abs(w64) + scale)
    return bad | (fin & err)


def finite_scale(arrays) -> float:
    """The largest finite magnitude among ``arrays`` (float ones), at least 1."""
    m = 1.0
    for a in arrays:
        a = np.asarray(a)
        if a.size and dtypes.is_inexact(a.dtype):  # complex: its magnitudes
            a = np.abs(a).astype(np.float64)
            a = a[np.isfinite(a)]
            if a.size:
                m = max(m, float(a.max()))
    return m


def intermediates(closed_jaxpr, args) -> list:
    """Every value the reference computes (top-level equations' outputs), evaluated op by op."""
    out: list = []
    interpret(closed_jaxpr, args, lambda i, eqn, vals: out.extend(vals) or vals)
    return out


def interpret(closed_jaxpr, args, hook: Optional[Callable[[int, Any, list], list]] = None):
    """Evaluate ``closed_jaxpr`` on ``args`` equation by equation (top level); ``hook(i, eqn,
    outs)`` may replace equation i's outputs (gp.testing's metamorphic checks annotate them)."""
    from jax.extend.core import Literal

    j = closed_jaxpr.jaxpr
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for v, c in zip(j.constvars, closed_jaxpr.consts):
        env[v] = c
    for v, a in zip(j.invars, args):
        env[v] = a
    for i, eqn in enumerate(j.eqns):
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns, params = params if isinstance(params, tuple) else ((), params)  # older jax: (subfuns, params)
        outs = eqn.primitive.bind(*subfuns, *[read(v) for v in eqn.invars], **params)
        outs = list(outs) if eqn.primitive.multiple_results else [outs]
        if hook is not None:
            outs = hook(i, eqn, outs)
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    return [read(v) for v in j.outvars]


def eps(dtype) -> float:
    return float(jnp.finfo(dtype).eps)
