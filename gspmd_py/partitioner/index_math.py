"""The partitioner's index math, vectorised over all shards (Numba kernels + NumPy twins).

Conventions. A tensor dim of global size ``n`` split into ``k`` shards uses shards of
``c = ceil(n / k)`` elements: shard ``i`` holds global rows ``[i*c, min(n, (i+1)*c))``
and the rest of its ``c`` local rows is padding. When ``k*c - n >= c`` some trailing
shards are entirely padding (empty), e.g. ``n=5, k=4`` gives ``c=2`` and shards
``[0,2) [2,4) [4,5) [5,5)``.

Every function exists twice with identical results:

* ``foo``: a thin Python wrapper (argument checking, conversion to int64 NumPy) around
  a Numba ``@njit(cache=True)`` kernel. Numba is imported lazily, on the first call of
  a jitted function, so ``import gspmd_py`` stays cheap; ``cache=True`` stores the
  compiled code next to this file so later processes only load it.
* ``foo_np``: a pure-NumPy twin, vectorised over shards (Python loops only over mesh
  axes or over blocks of window elements, never over shards).

All outputs are int64 (or bool) NumPy arrays. Scalars in the dicts returned by
:func:`window_halos` are Python ints.
"""
from __future__ import annotations

import math
import operator
import threading
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "shard_bounds", "shard_bounds_np",
    "valid_mask", "valid_mask_np",
    "window_halos", "window_halos_np",
    "device_groups", "device_groups_np",
    "permutation_pairs", "permutation_pairs_np",
    "offsets_for", "offsets_for_np",
    "jit_kernels",
]

_I64 = np.int64
_I64_MAX = np.iinfo(np.int64).max


# ----------------------------------------------------------------------------------------
# Lazy Numba: kernels are plain module-level Python functions (valid Numba code); they are
# jitted on first use and memoised. Module level => ``cache=True`` can locate them.
# ----------------------------------------------------------------------------------------

_JITTED: dict[str, Callable[..., Any]] = {}
_JIT_LOCK = threading.Lock()
_CACHEABLE = __name__ == "gspmd_py.partitioner.index_math"


def _jit(name: str) -> Callable[..., Any]:
    """The ``njit(cache=True)`` version of kernel ``_<name>_kernel`` (built once, then memoised)."""
    fn = _JITTED.get(name)
    if fn is None:
        with _JIT_LOCK:
            fn = _JITTED.get(name)
            if fn is None:
                import numba  # lazy: keeps the cold import of gspmd_py fast

                # The on-disk cache pickles this module's name: only use it under the
                # canonical name (not e.g. when the file is run by path as ``index_math``).
                fn = numba.njit(cache=_CACHEABLE, nogil=True)(globals()[f"_{name}_kernel"])
                _JITTED[name] = fn
    return fn


def jit_kernels() -> tuple[str, ...]:
    """Names of the Numba kernels (``jit_kernels()`` -> ``("shard_bounds", ...)``).

    Useful for warm-up: ``for n in jit_kernels(): ...``. Does not import Numba.
    """
    return ("shard_bounds", "valid_mask", "window_halos", "device_groups", "permutation_pairs",
            "offsets_for")


# ----------------------------------------------------------------------------------------
# argument helpers
# ----------------------------------------------------------------------------------------

def _int(x: Any, name: str, lo: int | None = None) -> int:
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {x!r}") from None
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return int(v)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ========================================================================================
# 1. shard_bounds
# ========================================================================================

def _shard_bounds_kernel(n, k):
    c = (n + k - 1) // k
    start = np.empty(k, np.int64)
    stop = np.empty(k, np.int64)
    for i in range(k):
        start[i] = min(i * c, n)
        stop[i] = min((i + 1) * c, n)
    return start, stop


def shard_bounds(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Global row range ``[start[i], stop[i])`` of each of ``k`` shards of a dim of size ``n``.

    ``c = ceil(n/k)``; ``start = min(i*c, n)``, ``stop = min((i+1)*c, n)`` (int64[k]).

    >>> start, stop = shard_bounds(10, 4)          # c = 3
    >>> start.tolist(), stop.tolist()
    ([0, 3, 6, 9], [3, 6, 9, 10])
    >>> [a.tolist() for a in shard_bounds(5, 4)]   # c = 2: last shard is empty
    [[0, 2, 4, 5], [2, 4, 5, 5]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    return _jit("shard_bounds")(_I64(n), _I64(k))


def shard_bounds_np(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of :func:`shard_bounds`.

    >>> [a.tolist() for a in shard_bounds_np(10, 4)]
    [[0, 3, 6, 9], [3, 6, 9, 10]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    c = _ceil_div(n, k)
    i = np.arange(k, dtype=_I64)
    return np.minimum(i * c, n), np.minimum((i + 1) * c, n)


# ========================================================================================
# 2. valid_mask
# ========================================================================================

def _valid_mask_kernel(n, k):
    c = (n + k - 1) // k
    out = np.empty((k, c), np.bool_)
    for i in range(k):
        base = i * c
        for r in range(c):
            out[i, r] = base + r < n
    return out


def valid_mask(n: int, k: int) -> np.ndarray:
    """bool[k, c]: True where local row ``r`` of shard ``i`` is a real row (``i*c + r < n``).

    >>> valid_mask(5, 4).astype(int).tolist()      # c = 2
    [[1, 1], [1, 1], [1, 0], [0, 0]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    return _jit("valid_mask")(_I64(n), _I64(k))


def valid_mask_np(n: int, k: int) -> np.ndarray:
    """NumPy twin of :func:`valid_mask`.

    >>> valid_mask_np(5, 4).astype(int).tolist()
    [[1, 1], [1, 1], [1, 0], [0, 0]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    c = _ceil_div(n, k)
    return (np.arange(k, dtype=_I64)[:, None] * c + np.arange(c, dtype=_I64)[None, :]) < n


# ========================================================================================
# 3. window_halos
# ========================================================================================

_HALO_KEYS = ("out_start", "out_stop", "in_lo", "in_hi", "left_halo", "right_halo", "window_start",
              "shard_in_start", "shard_in_stop")


def _window_params(n_in: int, k: int, window: int, stride: int, dilation: int, pad_lo: int,
                   pad_hi: int, lhs_dilation: int) -> tuple[int, ...]:
    """Checked scalar parameters shared by the kernel and the NumPy twin.

    Returns ``(n_in, k, window, stride, dilation, pad_lo, lhs_dilation, n_out, c_out, c_in,
    over_o, step, g, m, inv)``. The exact row search walks, per shard, the smaller of the
    two loop dims (output rows of the shard when ``over_o``, else window elements) and solves
    the other one, an arithmetic progression of positions with difference ``step``, in
    closed form: positions ``q0 + t*step`` that are multiples of ``lhs_dilation`` are those
    with ``t = t0 (mod m)``, ``m = ld/g``, ``g = gcd(step, ld)``, ``inv = (step/g)^-1 mod m``.
    """
    n_in = _int(n_in, "n_in", 0)
    k = _int(k, "k", 1)
    window = _int(window, "window", 1)
    stride = _int(stride, "stride", 1)
    dilation = _int(dilation, "dilation", 1)
    pad_lo = _int(pad_lo, "pad_lo")
    pad_hi = _int(pad_hi, "pad_hi")
    ld = _int(lhs_dilation, "lhs_dilation", 1)
    dilated = 0 if n_in == 0 else (n_in - 1) * ld + 1
    span = pad_lo + dilated + pad_hi - ((window - 1) * dilation + 1)
    n_out = span // stride + 1 if span >= 0 else 0
    c_out = _ceil_div(n_out, k)
    c_in = _ceil_div(n_in, k)
    over_o = 1 if c_out <= window else 0
    step = dilation if over_o else stride
    g = math.gcd(step, ld)
    m = ld // g
    inv = pow(step // g, -1, m) if m > 1 else 0
    return (n_in, k, window, stride, dilation, pad_lo, ld, n_out, c_out, c_in, over_o, step, g, m,
            inv)


def _window_halos_kernel(n_in, k, window, stride, dilation, pad_lo, ld, n_out, c_out, c_in,
                         over_o, step, g, m, inv):
    out_start = np.empty(k, np.int64)
    out_stop = np.empty(k, np.int64)
    in_lo = np.empty(k, np.int64)
    in_hi = np.empty(k, np.int64)
    left = np.empty(k, np.int64)
    right = np.empty(k, np.int64)
    wstart = np.empty(k, np.int64)
    s_start = np.empty(k, np.int64)
    s_stop = np.empty(k, np.int64)
    qmax_all = (n_in - 1) * ld  # last real position (dilated, unpadded coordinates)
    for i in range(k):
        a = min(i * c_out, n_out)
        b = min(a + c_out, n_out)
        cnt_o = b - a
        ss = min(i * c_in, n_in)
        se = min(ss + c_in, n_in)
        out_start[i] = a
        out_stop[i] = b
        wstart[i] = a * stride - pad_lo
        s_start[i] = ss
        s_stop[i] = se
        best_lo = 9223372036854775807
        best_hi = -1
        # fast path: the shard's first and last window positions are both real rows
        q_first = a * stride - pad_lo
        q_last = (b - 1) * stride + (window - 1) * dilation - pad_lo
        if (cnt_o > 0 and n_in > 0 and 0 <= q_first and q_last <= qmax_all
                and q_first % ld == 0 and q_last % ld == 0):
            best_lo = q_first
            best_hi = q_last
        elif cnt_o > 0 and n_in > 0:
            if over_o:
                outer = cnt_o
                cnt = window
            else:
                outer = window
                cnt = cnt_o
            for u in range(outer):
                if over_o:
                    q0 = (a + u) * stride - pad_lo
                else:
                    q0 = a * stride + u * dilation - pad_lo
                # positions q0 + t*step, t in [0, cnt), restricted to [0, qmax_all]
                tlo = -(q0 // step)
                if tlo < 0:
                    tlo = 0
                thi = (qmax_all - q0) // step
                if thi > cnt - 1:
                    thi = cnt - 1
                if tlo > thi:
                    continue
                if m == 1:  # every step stays on the same residue mod lhs_dilation
                    if (-q0) % g != 0:
                        continue
                    tmin = tlo
                    tmax = thi
                else:
                    if (-q0) % g != 0:
                        continue
                    t0 = (((-q0) // g) % m) * inv % m
                    tmin = tlo + (t0 - tlo) % m
                    if tmin > thi:
                        continue
                    tmax = thi - (thi - t0) % m
                qa = q0 + tmin * step
                qb = q0 + tmax * step
                if qa < best_lo:
                    best_lo = qa
                if qb > best_hi:
                    best_hi = qb
        if best_hi >= 0:
            lo = best_lo // ld
            hi = best_hi // ld + 1
        else:
            lo = ss
            hi = ss
        in_lo[i] = lo
        in_hi[i] = hi
        left[i] = max(0, ss - lo)
        right[i] = max(0, hi - se)
    return out_start, out_stop, in_lo, in_hi, left, right, wstart, s_start, s_stop


def _halo_dict(arrays: Sequence[np.ndarray], n_out: int) -> dict[str, Any]:
    d: dict[str, Any] = dict(zip(_HALO_KEYS, arrays))
    d["max_left"] = int(d["left_halo"].max()) if d["left_halo"].size else 0
    d["max_right"] = int(d["right_halo"].max()) if d["right_halo"].size else 0
    d["n_out"] = int(n_out)
    return d


def window_halos(n_in: int, k: int, window: int, stride: int = 1, dilation: int = 1,
                 pad_lo: int = 0, pad_hi: int = 0, lhs_dilation: int = 1) -> dict[str, Any]:
    """Per-shard input ranges and halo sizes of a 1-D windowed op (conv / reduce_window dim).

    The op's input dim (size ``n_in``) and output dim are both split into ``k`` canonical
    shards (``c_in = ceil(n_in/k)``, ``c_out = ceil(n_out/k)``).

    Geometry (XLA semantics). The input is lhs-dilated (``lhs_dilation - 1`` holes between
    rows; ``D = (n_in-1)*lhs_dilation + 1`` positions, ``D = 0`` when ``n_in = 0``), then
    padded by ``pad_lo``/``pad_hi`` (negative = cropping). The window covers
    ``(window-1)*dilation + 1`` positions, so
    ``n_out = floor((pad_lo + D + pad_hi - ((window-1)*dilation + 1)) / stride) + 1``
    (0 if the window does not fit). Output row ``o`` reads padded positions
    ``p = o*stride + j*dilation``, ``j in [0, window)``; ``p`` is input row
    ``(p - pad_lo) / lhs_dilation`` when that is an integer in ``[0, n_in)``, else padding.

    Returns a dict; every array is int64[k], indexed by shard ``i``:

    * ``out_start``, ``out_stop``: the shard's output rows ``[out_start, out_stop)``.
    * ``in_lo``, ``in_hi``: exact range of input rows read: ``in_lo`` is the smallest and
      ``in_hi - 1`` the largest input row read by any output row of the shard (so within
      ``[0, n_in)``). When the shard reads no input row (empty output shard, or its windows
      see only padding/holes) ``in_lo = in_hi = shard_in_start``.
    * ``shard_in_start``, ``shard_in_stop``: input rows held by shard ``i`` of the input.
    * ``left_halo = max(0, shard_in_start - in_lo)``,
      ``right_halo = max(0, in_hi - shard_in_stop)``: rows shard ``i`` must receive from
      lower / higher shards (0 when nothing is read).
    * ``window_start = out_start*stride - pad_lo``: the position of the shard's first window
      element in lhs-dilated *unpadded* input coordinates (input row ``r`` sits at position
      ``r*lhs_dilation``); may be negative (it is then padding). A shard that holds the
      input rows ``[s, e)`` (e.g. ``s = shard_in_start - left_halo``,
      ``e = shard_in_stop + right_halo``) computes its outputs with the same window, stride
      and dilations and local padding ``lo = s*lhs_dilation - window_start``,
      ``hi = (cnt-1)*stride + (window-1)*dilation + 1 - lo - ((e-s-1)*lhs_dilation + 1)``
      where ``cnt = out_stop - out_start`` (negative values crop).
    * ``max_left``, ``max_right``, ``n_out``: Python ints (max halos over shards, output size).

    >>> h = window_halos(10, 2, window=3, pad_lo=1, pad_hi=1)   # "same" conv, 2 shards
    >>> [h[key].tolist() for key in ("out_start", "out_stop", "in_lo", "in_hi")]
    [[0, 5], [5, 10], [0, 4], [6, 10]]
    >>> h["left_halo"].tolist(), h["right_halo"].tolist(), h["window_start"].tolist()
    ([0, 1], [1, 0], [-1, 4])
    >>> h["max_left"], h["max_right"], h["n_out"]
    (1, 1, 10)
    """
    p = _window_params(n_in, k, window, stride, dilation, pad_lo, pad_hi, lhs_dilation)
    arrays = _jit("window_halos")(*[_I64(v) for v in p])
    return _halo_dict(arrays, p[7])


def window_halos_np(n_in: int, k: int, window: int, stride: int = 1, dilation: int = 1,
                    pad_lo: int = 0, pad_hi: int = 0, lhs_dilation: int = 1,
                    *, block_elems: int = 1 << 20) -> dict[str, Any]:
    """NumPy twin of :func:`window_halos` (``block_elems`` bounds the temporaries' size).

    Vectorised over shards; loops over blocks of the smaller of (window, c_out).

    >>> h = window_halos_np(10, 2, window=3, pad_lo=1, pad_hi=1)
    >>> h["in_lo"].tolist(), h["in_hi"].tolist(), h["max_left"]
    ([0, 4], [6, 10], 1)
    """
    (n_in, k, window, stride, dilation, pad_lo, ld, n_out, c_out, c_in, over_o, step, g, m,
     inv) = _window_params(n_in, k, window, stride, dilation, pad_lo, pad_hi, lhs_dilation)
    i = np.arange(k, dtype=_I64)
    a = np.minimum(i * c_out, n_out)
    b = np.minimum(a + c_out, n_out)
    cnt_o = b - a
    ss = np.minimum(i * c_in, n_in)
    se = np.minimum(ss + c_in, n_in)
    best_lo = np.full(k, _I64_MAX, dtype=_I64)
    best_hi = np.full(k, -1, dtype=_I64)
    if n_in > 0 and n_out > 0:
        qmax_all = (n_in - 1) * ld
        # fast path: the shard's first and last window positions are both real rows
        q_first = a * stride - pad_lo
        q_last = (b - 1) * stride + (window - 1) * dilation - pad_lo
        fast = ((cnt_o > 0) & (q_first >= 0) & (q_last <= qmax_all) & (q_first % ld == 0)
                & (q_last % ld == 0))
        best_lo[fast] = q_first[fast]
        best_hi[fast] = q_last[fast]
        sel = np.flatnonzero(~fast & (cnt_o > 0))
        n_loop = min(window, c_out)
        blk = max(1, min(n_loop, block_elems // max(1, sel.size)))
        a2 = a[sel, None]
        cnt_o2 = cnt_o[sel, None]
        lo_sel = best_lo[sel]
        hi_sel = best_hi[sel]
        for u0 in range(0, n_loop if sel.size else 0, blk):
            u = np.arange(u0, min(n_loop, u0 + blk), dtype=_I64)[None, :]
            if over_o:
                q0 = (a2 + u) * stride - pad_lo
                cnt = window
                ok = u < cnt_o2
            else:
                q0 = a2 * stride + u * dilation - pad_lo
                cnt = cnt_o2
                ok = np.ones(q0.shape, dtype=bool)
            tlo = np.maximum(0, -(q0 // step))
            thi = np.minimum(cnt - 1, (qmax_all - q0) // step)
            ok &= tlo <= thi
            if g > 1:
                ok &= (-q0) % g == 0
            if m == 1:
                tmin, tmax = tlo, thi
            else:
                t0 = (((-q0) // g) % m) * inv % m
                tmin = tlo + (t0 - tlo) % m
                ok &= tmin <= thi
                tmax = thi - (thi - t0) % m
            lo_sel = np.minimum(lo_sel, np.where(ok, q0 + tmin * step, _I64_MAX).min(axis=1))
            hi_sel = np.maximum(hi_sel, np.where(ok, q0 + tmax * step, -1).max(axis=1))
        best_lo[sel] = lo_sel
        best_hi[sel] = hi_sel
    has = best_hi >= 0
    in_lo = np.where(has, best_lo // ld, ss)
    in_hi = np.where(has, best_hi // ld + 1, ss)
    left = np.maximum(0, ss - in_lo)
    right = np.maximum(0, in_hi - se)
    wstart = a * stride - pad_lo
    return _halo_dict((a, b, in_lo, in_hi, left, right, wstart, ss, se), n_out)


# ========================================================================================
# 4. device_groups
# ========================================================================================

def _mesh_args(mesh_shape: Sequence[int], axes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    shape = [_int(s, "mesh_shape entry", 1) for s in mesh_shape]
    nd = len(shape)
    ax = []
    for a in axes:
        a = _int(a, "axis")
        if not -nd <= a < nd:
            raise ValueError(f"axis {a} out of range for a {nd}-d mesh {tuple(shape)}")
        ax.append(a % nd)
    if len(set(ax)) != len(ax):
        raise ValueError(f"duplicate mesh axes in {tuple(axes)}")
    return np.asarray(shape, dtype=_I64).reshape(-1), np.asarray(ax, dtype=_I64).reshape(-1)


def _device_groups_kernel(shape, axes):
    nd = shape.shape[0]
    strides = np.empty(nd, np.int64)
    total = 1
    for d in range(nd - 1, -1, -1):
        strides[d] = total
        total *= shape[d]
    in_group = np.zeros(nd, np.bool_)
    gsize = 1
    for t in range(axes.shape[0]):
        in_group[axes[t]] = True
        gsize *= shape[axes[t]]
    ngroups = total // gsize
    rest = np.empty(nd - axes.shape[0], np.int64)
    j = 0
    for d in range(nd):
        if not in_group[d]:
            rest[j] = d
            j += 1
    base = np.empty(ngroups, np.int64)
    for gi in range(ngroups):
        rem = gi
        pos = 0
        for t in range(rest.shape[0] - 1, -1, -1):
            d = rest[t]
            pos += (rem % shape[d]) * strides[d]
            rem //= shape[d]
        base[gi] = pos
    off = np.empty(gsize, np.int64)
    for h in range(gsize):
        rem = h
        pos = 0
        for t in range(axes.shape[0] - 1, -1, -1):
            d = axes[t]
            pos += (rem % shape[d]) * strides[d]
            rem //= shape[d]
        off[h] = pos
    out = np.empty((ngroups, gsize), np.int64)
    for gi in range(ngroups):
        for h in range(gsize):
            out[gi, h] = base[gi] + off[h]
    return out


def device_groups(mesh_shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """int64[num_groups, group_size]: the device groups of a collective over mesh ``axes``.

    Devices are the row-major positions ``0 .. prod(mesh_shape)-1``. Row ``g`` lists the
    devices sharing every coordinate outside ``axes``, ordered by their linear index over
    ``axes`` taken in the order given (first = major); rows are ordered by the row-major
    linear index of the remaining coordinates. ``axes=()`` gives one device per group.

    >>> device_groups((2, 3), (1,)).tolist()          # along the minor axis
    [[0, 1, 2], [3, 4, 5]]
    >>> device_groups((2, 3), (0,)).tolist()
    [[0, 3], [1, 4], [2, 5]]
    >>> device_groups((2, 3), (1, 0)).tolist()        # axis 1 major within the group
    [[0, 3, 1, 4, 2, 5]]
    """
    shape, ax = _mesh_args(mesh_shape, axes)
    return _jit("device_groups")(shape, ax)


def device_groups_np(mesh_shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """NumPy twin of :func:`device_groups`.

    >>> device_groups_np((2, 2, 2), (2, 0)).tolist()
    [[0, 4, 1, 5], [2, 6, 3, 7]]
    """
    shape, ax = _mesh_args(mesh_shape, axes)
    nd = shape.size
    strides = np.ones(nd, dtype=_I64)
    if nd:
        strides[:-1] = np.cumprod(shape[::-1])[::-1][1:]
    grp = set(ax.tolist())
    rest = [d for d in range(nd) if d not in grp]

    def lin(dims: Sequence[int]) -> np.ndarray:
        pos = np.zeros(1, dtype=_I64)
        for d in dims:
            pos = (pos[:, None] + np.arange(shape[d], dtype=_I64)[None, :] * strides[d]).reshape(-1)
        return pos

    return lin(rest)[:, None] + lin(ax.tolist())[None, :]


# ========================================================================================
# 5. permutation_pairs
# ========================================================================================

def _perm_args(have: Any, need: Any) -> tuple[np.ndarray, np.ndarray]:
    h = np.ascontiguousarray(np.asarray(have), dtype=_I64)
    n = np.ascontiguousarray(np.asarray(need), dtype=_I64)
    if h.ndim != 1 or n.ndim != 1 or h.shape != n.shape:
        raise ValueError(f"have and need must be 1-d of equal length, got {h.shape} and {n.shape}")
    return h, n


def _missing_error(need: np.ndarray, d: int) -> ValueError:
    return ValueError(f"device {d} needs piece {int(need[d])} but no device holds it")


def _permutation_pairs_kernel(have, need):
    nd = have.shape[0]
    order = np.argsort(have, kind="mergesort")
    sh = have[order]
    used = np.zeros(nd + 1, np.int64)  # picks made so far per key group (indexed by group start)
    out = np.empty((nd, 2), np.int64)
    m = 0
    for d in range(nd):
        key = need[d]
        if key < 0 or have[d] == key:
            continue
        lo = np.searchsorted(sh, key)
        if lo >= nd or sh[lo] != key:
            return out[:0].copy(), d
        r = lo + used[lo]
        if r >= nd or sh[r] != key:
            r = lo
        used[lo] += 1
        out[m, 0] = order[r]
        out[m, 1] = d
        m += 1
    return out[:m].copy(), -1


def permutation_pairs(have: Any, need: Any) -> np.ndarray:
    """int64[m, 2] ``(source, dest)`` transfers so that each device gets the piece it needs.

    Device ``s`` holds the piece with key ``have[s]``; device ``d`` needs the piece with key
    ``need[d]`` (``need[d] < 0``: needs nothing). For each ``d`` with ``need[d] >= 0``:

    * if ``have[d] == need[d]`` the device already holds it: **no pair is emitted** (only
      pairs with ``source != dest`` are returned);
    * else, greedily in increasing ``d``, the source is the smallest device ``s`` with
      ``have[s] == need[d]`` not yet used as a source, falling back to the smallest such
      ``s`` when all are used (a source may then appear in several pairs; one
      ``collective_permute`` takes each source at most once, so such pairs need more rounds).

    Rows are ordered by increasing dest. Raises ``ValueError`` if a needed key has no holder.

    >>> permutation_pairs([0, 1, 2, 3], [1, 2, 3, 0]).tolist()   # cyclic shift
    [[1, 0], [2, 1], [3, 2], [0, 3]]
    >>> permutation_pairs([5, 5, 7, -1], [5, 7, 5, 5]).tolist()  # device 0 keeps its piece
    [[2, 1], [0, 2], [1, 3]]
    """
    h, n = _perm_args(have, need)
    pairs, bad = _jit("permutation_pairs")(h, n)
    if bad >= 0:
        raise _missing_error(n, int(bad))
    return pairs


def permutation_pairs_np(have: Any, need: Any) -> np.ndarray:
    """NumPy twin of :func:`permutation_pairs`.

    >>> permutation_pairs_np([5, 5, 7, -1], [5, 7, 5, 5]).tolist()
    [[2, 1], [0, 2], [1, 3]]
    """
    h, n = _perm_args(have, need)
    dests = np.flatnonzero((n >= 0) & (n != h))
    kd = n[dests]
    order = np.argsort(h, kind="stable")
    sh = h[order]
    lo = np.searchsorted(sh, kd, side="left")
    cnt = np.searchsorted(sh, kd, side="right") - lo
    missing = np.flatnonzero(cnt == 0)
    if missing.size:
        raise _missing_error(n, int(dests[missing[0]]))
    # rank of each dest among the earlier dests needing the same key
    o2 = np.argsort(kd, kind="stable")
    skd = kd[o2]
    rank = np.empty_like(kd)
    rank[o2] = np.arange(kd.size, dtype=_I64) - np.searchsorted(skd, skd, side="left")
    src = order[lo + np.where(rank < cnt, rank, 0)]
    return np.stack([src, dests], axis=1).astype(_I64, copy=False).reshape(-1, 2)


# ========================================================================================
# 6. offsets_for
# ========================================================================================

def _offsets_for_kernel(idx, c):
    out = np.empty(idx.shape[0], np.int64)
    for t in range(idx.shape[0]):
        out[t] = idx[t] * c[t]
    return out


def _offset_args(shard_index: Any, c: Any) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    i = np.asarray(shard_index)
    cc = np.asarray(c)
    for name, arr in (("shard_index", i), ("c", cc)):
        if arr.dtype.kind not in "iub" and arr.size:
            raise TypeError(f"{name} must be integer, got dtype {arr.dtype}")
    shape = np.broadcast_shapes(i.shape, cc.shape)
    flat = [np.array(np.broadcast_to(a, shape), dtype=_I64, order="C").reshape(-1) for a in (i, cc)]
    return flat[0], flat[1], shape


def offsets_for(shard_index: Any, c: Any) -> np.ndarray:
    """Elementwise ``shard_index * c`` as int64 (first global row of a shard; broadcasts).

    Returns an ndarray of the broadcast shape (0-d for scalar arguments).

    >>> offsets_for([0, 1, 3], 4).tolist()
    [0, 4, 12]
    >>> offsets_for([[0], [1]], [2, 3]).tolist()
    [[0, 0], [2, 3]]
    """
    i, cc, shape = _offset_args(shard_index, c)
    return _jit("offsets_for")(i, cc).reshape(shape)


def offsets_for_np(shard_index: Any, c: Any) -> np.ndarray:
    """NumPy twin of :func:`offsets_for`.

    >>> offsets_for_np([0, 1, 3], 4).tolist()
    [0, 4, 12]
    """
    i, cc, shape = _offset_args(shard_index, c)
    return (i * cc).reshape(shape)
