"""The partitioner's index math, vectorised over all shards (Numba kernels + NumPy twins).

Conventions. A tensor dim of global size ``n`` split into ``k`` shards uses shards of
``c = ceil(n / k)`` elements: shard ``i`` holds global rows ``[i*c, min(n, (i+1)*c))``
and the rest of its ``c`` local rows is padding. When ``k*c - n >= c`` some trailing
shards are entirely padding (empty), e.g. ``n=5, k=4`` gives ``c=2`` and shards
``[0,2) [2,4) [4,5) [5,5)``.

Every function exists three times, with identical results:

* ``foo_np``: a pure-NumPy twin, vectorised over shards (Python loops only over mesh
  axes, blocks of window elements or halo rounds, never over shards).
* ``foo_nb``: a thin Python wrapper (argument checking, conversion to int64 NumPy) around
  a Numba ``@njit(cache=True)`` kernel. Numba is imported lazily, on the first call of
  a kernel, so ``import gspmd_py`` stays cheap; ``cache=True`` stores the compiled code
  next to this file so later processes only load it.
* ``foo``: what the partitioner calls. Loading Numba costs far more (about 0.2 s to
  import it and 0.05-0.4 s to load the first cached kernel) than the NumPy twins take on
  any mesh that exists (tens of microseconds at 8,192 shards), so ``foo`` runs the NumPy
  twin unless the work (about: shards x inner iterations) is at least the kernel's
  :data:`NUMBA_COLD_WORK` (where the twin's extra time pays for loading Numba), or the
  kernel is already loaded in this process and the work is at least
  :data:`NUMBA_WARM_WORK` (where the kernel beats the twin call for call). Both
  crossovers are measured by ``python -m benchmarks --only index``
  (``benchmarks/results/index_math.md``).

All outputs are int64 (or bool) NumPy arrays. Scalars in the dicts returned by
:func:`window_halos` are Python ints.
"""
from __future__ import annotations

import math
import operator
import threading
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

__all__ = [
    "shard_bounds", "shard_bounds_np", "shard_bounds_nb",
    "valid_mask", "valid_mask_np", "valid_mask_nb",
    "window_halos", "window_halos_np", "window_halos_nb",
    "device_groups", "device_groups_np", "device_groups_nb",
    "permutation_pairs", "permutation_pairs_np", "permutation_pairs_nb",
    "offsets_for", "offsets_for_np", "offsets_for_nb",
    "fetch_rounds", "fetch_rounds_np", "fetch_rounds_nb",
    "jit_kernels", "NUMBA_COLD_WORK", "NUMBA_WARM_WORK",
]

_I64 = np.int64
_I64_MAX = np.iinfo(np.int64).max

#: Per kernel: the work (about: shards x inner iterations) from which ``foo`` loads Numba to run
#: the kernel in a process that has not loaded it yet, i.e. where the NumPy twin's extra time
#: over the kernel's pays for Numba's import and the kernel's cache load (~0.5-1.5 s); measured
#: by ``python -m benchmarks --only index`` (benchmarks/results/index_math.md), rounded to a
#: power of two. No mesh that exists comes near: 8,192 shards are at most ~10^5 units of work.
NUMBA_COLD_WORK: dict[str, int] = {
    "shard_bounds": 1 << 30, "valid_mask": 1 << 29, "window_halos": 1 << 25, "device_groups": 1 << 31,
    "permutation_pairs": 1 << 22, "offsets_for": 1 << 40, "fetch_rounds": 1 << 23,
}
#: Work from which a kernel already loaded in this process beats its NumPy twin call for call
#: (measured: from the smallest sizes for all but ``offsets_for``, which only ties).
NUMBA_WARM_WORK = 1 << 8


# ----------------------------------------------------------------------------------------
# Lazy Numba: kernels are plain module-level Python functions (valid Numba code); they are
# jitted on first use and memoised. Module level => ``cache=True`` can locate them.
# ----------------------------------------------------------------------------------------

_JITTED: dict[str, Callable[..., Any]] = {}
_LOADED: set[str] = set()  # kernels compiled or loaded from the cache in this process
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


def _call(name: str, *args: Any) -> Any:
    out = _jit(name)(*args)
    _LOADED.add(name)
    return out


def use_numba(name: str, work: int) -> bool:
    """Does running kernel ``name`` on ``work`` units pay for Numba (see the module docstring)?

    >>> use_numba("shard_bounds", 8)
    False
    >>> use_numba("shard_bounds", NUMBA_COLD_WORK["shard_bounds"])
    True
    """
    return work >= NUMBA_COLD_WORK[name] or (work >= NUMBA_WARM_WORK and name in _LOADED)


def jit_kernels() -> tuple[str, ...]:
    """Names of the Numba kernels (``jit_kernels()`` -> ``("shard_bounds", ...)``).

    Useful for warm-up: ``for n in jit_kernels(): ...``. Does not import Numba.
    """
    return ("shard_bounds", "valid_mask", "window_halos", "device_groups", "permutation_pairs",
            "offsets_for", "fetch_rounds")


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


def shard_bounds_nb(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Global row range ``[start[i], stop[i])`` of each of ``k`` shards of a dim of size ``n``.

    ``c = ceil(n/k)``; ``start = min(i*c, n)``, ``stop = min((i+1)*c, n)`` (int64[k]).

    >>> start, stop = shard_bounds(10, 4)          # c = 3
    >>> start.tolist(), stop.tolist()
    ([0, 3, 6, 9], [3, 6, 9, 10])
    >>> [a.tolist() for a in shard_bounds_nb(5, 4)]   # c = 2: last shard is empty
    [[0, 2, 4, 5], [2, 4, 5, 5]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    return _call("shard_bounds", _I64(n), _I64(k))


def shard_bounds_np(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of :func:`shard_bounds_nb`.

    >>> [a.tolist() for a in shard_bounds_np(10, 4)]
    [[0, 3, 6, 9], [3, 6, 9, 10]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    c = _ceil_div(n, k)
    i = np.arange(k, dtype=_I64)
    return np.minimum(i * c, n), np.minimum((i + 1) * c, n)


def shard_bounds(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shard_bounds_np` or :func:`shard_bounds_nb`, whichever pays (work: ``k``).

    >>> [a.tolist() for a in shard_bounds(10, 4)]
    [[0, 3, 6, 9], [3, 6, 9, 10]]
    """
    kk = _int(k, "k", 1)
    return shard_bounds_nb(n, k) if use_numba("shard_bounds", kk) else shard_bounds_np(n, k)


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


def valid_mask_nb(n: int, k: int) -> np.ndarray:
    """bool[k, c]: True where local row ``r`` of shard ``i`` is a real row (``i*c + r < n``).

    >>> valid_mask(5, 4).astype(int).tolist()      # c = 2
    [[1, 1], [1, 1], [1, 0], [0, 0]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    return _call("valid_mask", _I64(n), _I64(k))


def valid_mask_np(n: int, k: int) -> np.ndarray:
    """NumPy twin of :func:`valid_mask_nb`.

    >>> valid_mask_np(5, 4).astype(int).tolist()
    [[1, 1], [1, 1], [1, 0], [0, 0]]
    """
    n, k = _int(n, "n", 0), _int(k, "k", 1)
    c = _ceil_div(n, k)
    return (np.arange(k, dtype=_I64)[:, None] * c + np.arange(c, dtype=_I64)[None, :]) < n


def valid_mask(n: int, k: int) -> np.ndarray:
    """:func:`valid_mask_np` or :func:`valid_mask_nb`, whichever pays (work: ``k * c``).

    >>> valid_mask(3, 2).astype(int).tolist()
    [[1, 1], [1, 0]]
    """
    nn, kk = _int(n, "n", 0), _int(k, "k", 1)
    return valid_mask_nb(n, k) if use_numba("valid_mask", kk * _ceil_div(nn, kk)) else valid_mask_np(n, k)


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


def window_halos_nb(n_in: int, k: int, window: int, stride: int = 1, dilation: int = 1,
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
    arrays = _call("window_halos", *[_I64(v) for v in p])
    return _halo_dict(arrays, p[7])


def window_halos_np(n_in: int, k: int, window: int, stride: int = 1, dilation: int = 1,
                    pad_lo: int = 0, pad_hi: int = 0, lhs_dilation: int = 1,
                    *, block_elems: int = 1 << 20) -> dict[str, Any]:
    """NumPy twin of :func:`window_halos_nb` (``block_elems`` bounds the temporaries' size).

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


def window_halos(n_in: int, k: int, window: int, stride: int = 1, dilation: int = 1,
                 pad_lo: int = 0, pad_hi: int = 0, lhs_dilation: int = 1) -> dict[str, Any]:
    """:func:`window_halos_np` or :func:`window_halos_nb` (the semantics), whichever pays
    (work: ``k * min(window, c_out)``, the slow path's inner loop).

    >>> window_halos(10, 2, window=3, pad_lo=1, pad_hi=1)["right_halo"].tolist()
    [1, 0]
    """
    args = (n_in, k, window, stride, dilation, pad_lo, pad_hi, lhs_dilation)
    p = _window_params(*args)
    if use_numba("window_halos", p[1] * min(p[2], p[8])):
        return window_halos_nb(*args)
    return window_halos_np(*args)


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


def device_groups_nb(mesh_shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
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
    return _call("device_groups", shape, ax)


def device_groups_np(mesh_shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """NumPy twin of :func:`device_groups_nb`.

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


def device_groups(mesh_shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """:func:`device_groups_np` or :func:`device_groups_nb`, whichever pays (work: devices).

    >>> device_groups((2, 3), (0,)).tolist()
    [[0, 3], [1, 4], [2, 5]]
    """
    shape, _ = _mesh_args(mesh_shape, axes)
    work = int(np.prod(shape, dtype=np.int64))
    return device_groups_nb(mesh_shape, axes) if use_numba("device_groups", work) else device_groups_np(mesh_shape, axes)


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


def permutation_pairs_nb(have: Any, need: Any) -> np.ndarray:
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
    pairs, bad = _call("permutation_pairs", h, n)
    if bad >= 0:
        raise _missing_error(n, int(bad))
    return pairs


def permutation_pairs_np(have: Any, need: Any) -> np.ndarray:
    """NumPy twin of :func:`permutation_pairs_nb`.

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


def permutation_pairs(have: Any, need: Any) -> np.ndarray:
    """:func:`permutation_pairs_np` or :func:`permutation_pairs_nb`, whichever pays (work: devices).

    >>> permutation_pairs([0, 1, 2, 3], [1, 2, 3, 0]).tolist()   # cyclic shift
    [[1, 0], [2, 1], [3, 2], [0, 3]]
    """
    h, n = _perm_args(have, need)
    return permutation_pairs_nb(h, n) if use_numba("permutation_pairs", h.size) else permutation_pairs_np(h, n)


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


def offsets_for_nb(shard_index: Any, c: Any) -> np.ndarray:
    """Elementwise ``shard_index * c`` as int64 (first global row of a shard; broadcasts).

    Returns an ndarray of the broadcast shape (0-d for scalar arguments).

    >>> offsets_for([0, 1, 3], 4).tolist()
    [0, 4, 12]
    >>> offsets_for([[0], [1]], [2, 3]).tolist()
    [[0, 0], [2, 3]]
    """
    i, cc, shape = _offset_args(shard_index, c)
    return _call("offsets_for", i, cc).reshape(shape)


def offsets_for_np(shard_index: Any, c: Any) -> np.ndarray:
    """NumPy twin of :func:`offsets_for_nb`.

    >>> offsets_for_np([0, 1, 3], 4).tolist()
    [0, 4, 12]
    """
    i, cc, shape = _offset_args(shard_index, c)
    return (i * cc).reshape(shape)


def offsets_for(shard_index: Any, c: Any) -> np.ndarray:
    """:func:`offsets_for_np` or :func:`offsets_for_nb`, whichever pays (work: elements).

    >>> offsets_for([0, 1, 3], 4).tolist()
    [0, 4, 12]
    """
    i, _, _ = _offset_args(shard_index, c)
    return offsets_for_nb(shard_index, c) if use_numba("offsets_for", i.size) else offsets_for_np(shard_index, c)


# ========================================================================================
# 7. fetch_rounds (the halo planner's transfers)
# ========================================================================================

class FetchRounds(NamedTuple):
    """The transfers that give every device the rows it needs (see :func:`fetch_rounds_nb`).

    ``own_*`` are int64[k]; the rest are int64[R, k] for the R rounds (one per shift).
    """

    own_src: np.ndarray  # per device: first local row of its own piece
    own_dst: np.ndarray  # per device: where its own piece goes in its segment
    own_len: np.ndarray  # per device: rows of its own piece (0: none)
    shift: np.ndarray  # int64[R], increasing: source shard minus destination device
    src_off: np.ndarray  # [r, s]: first local row device s sends in round r
    dst_off: np.ndarray  # [r, d]: where device d puts the rows it receives in round r
    length: np.ndarray  # [r, d]: rows device d receives in round r (0: none)
    source: np.ndarray  # [r, d]: the device d receives from in round r (-1: none)


def _fetch_args(lo: Any, hi: Any, a: Any, c: int, holder: Any) -> tuple:
    lo = np.ascontiguousarray(np.asarray(lo), dtype=_I64).reshape(-1)
    hi = np.ascontiguousarray(np.asarray(hi), dtype=_I64).reshape(-1)
    a = np.ascontiguousarray(np.asarray(a), dtype=_I64).reshape(-1)
    c = _int(c, "c", 1)
    k = lo.size
    holder = (np.arange(k, dtype=_I64) if holder is None
              else np.ascontiguousarray(np.asarray(holder), dtype=_I64).reshape(-1))
    if not (hi.size == a.size == holder.size == k):
        raise ValueError(f"lo, hi, a and holder must have one entry per device, got sizes "
                         f"{lo.size}, {hi.size}, {a.size}, {holder.size}")
    has = hi > lo
    if k and (np.any(lo[has] < 0) or np.any(hi[has] > k * c)):
        raise ValueError(f"rows to fetch must lie in [0, k*c) = [0, {k * c})")
    return lo, hi, a, c, holder


def _fetch_rounds_kernel(lo, hi, a, c, holder):
    k = lo.shape[0]
    own_src = np.zeros(k, np.int64)
    own_dst = np.zeros(k, np.int64)
    own_len = np.zeros(k, np.int64)
    # pass 1: which shifts occur (shift = m - i lies in [-(k-1), k-1])
    present = np.zeros(2 * k + 1, np.bool_)
    for i in range(k):
        if hi[i] <= lo[i]:
            continue
        for m in range(lo[i] // c, (hi[i] - 1) // c + 1):
            if holder[m] != i:
                present[m - i + k] = True
    slot = np.full(2 * k + 1, -1, np.int64)
    nr = 0
    for t in range(2 * k + 1):
        if present[t]:
            slot[t] = nr
            nr += 1
    shift = np.empty(nr, np.int64)
    for t in range(2 * k + 1):
        if slot[t] >= 0:
            shift[slot[t]] = t - k
    src_off = np.zeros((nr, k), np.int64)
    dst_off = np.zeros((nr, k), np.int64)
    length = np.zeros((nr, k), np.int64)
    source = np.full((nr, k), -1, np.int64)
    # pass 2: fill the pieces
    for i in range(k):
        if hi[i] <= lo[i]:
            continue
        for m in range(lo[i] // c, (hi[i] - 1) // c + 1):
            r0 = max(lo[i], m * c)
            r1 = min(hi[i], m * c + c)
            src = holder[m]
            if src == i:
                own_src[i] = r0 - m * c
                own_dst[i] = r0 - a[i]
                own_len[i] = r1 - r0
            else:
                r = slot[m - i + k]
                src_off[r, src] = r0 - m * c
                dst_off[r, i] = r0 - a[i]
                length[r, i] = r1 - r0
                source[r, i] = src
    return own_src, own_dst, own_len, shift, src_off, dst_off, length, source


def fetch_rounds_nb(lo: Any, hi: Any, a: Any, c: int, holder: Any = None) -> FetchRounds:
    """The transfers that give device ``i`` the real rows ``[lo[i], hi[i])`` of a sharded dim.

    The dim is held in shards of ``c`` rows: shard ``m`` (rows ``[m*c, (m+1)*c)``) lives on
    device ``holder[m]`` (default: device ``m``). Device ``i`` places its rows in a segment
    whose row 0 is global row ``a[i]``. Every overlap of ``[lo[i], hi[i])`` with a shard is
    one piece: from the device itself (``own_*``: source row, segment row, length), or a
    transfer in the round of its shift ``m - i`` (left halo: shift -1, right halo: +1). In a
    round each device receives at most one piece and sends at most one (``holder`` is a
    permutation), so a round is one collective-permute: pairs ``(source[r, d], d)`` for
    every ``d`` with ``source[r, d] >= 0``.

    >>> # 3x3 SAME conv, 16 rows over 4 shards (c = 4): device i needs rows [4i-1, 4i+5)
    >>> r = fetch_rounds_nb([0, 3, 7, 11], [5, 9, 13, 16], a=[-1, 3, 7, 11], c=4)
    >>> r.shift.tolist(), r.source.tolist()
    ([-1, 1], [[-1, 0, 1, 2], [1, 2, 3, -1]])
    >>> r.length.tolist(), r.own_len.tolist()
    ([[0, 1, 1, 1], [1, 1, 1, 0]], [4, 4, 4, 4])
    >>> r.src_off.tolist(), r.dst_off.tolist()        # left halo: a neighbour's last row
    ([[3, 3, 3, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [5, 5, 5, 0]])
    """
    return FetchRounds(*_call("fetch_rounds", *_fetch_args(lo, hi, a, c, holder)))


def fetch_rounds_np(lo: Any, hi: Any, a: Any, c: int, holder: Any = None) -> FetchRounds:
    """NumPy twin of :func:`fetch_rounds_nb` (vectorised over pieces; no loop over shards).

    >>> fetch_rounds_np([0, 3, 7, 11], [5, 9, 13, 16], a=[-1, 3, 7, 11], c=4).shift.tolist()
    [-1, 1]
    """
    lo, hi, a, c, holder = _fetch_args(lo, hi, a, c, holder)
    k = lo.size
    has = hi > lo
    m0 = np.where(has, lo // c, 0)
    cnt = np.where(has, (hi - 1) // c + 1 - m0, 0)
    dev = np.repeat(np.arange(k, dtype=_I64), cnt)
    first = np.cumsum(cnt) - cnt
    m = np.repeat(m0, cnt) + (np.arange(dev.size, dtype=_I64) - np.repeat(first, cnt))
    r0 = np.maximum(lo[dev], m * c)
    r1 = np.minimum(hi[dev], m * c + c)
    src = holder[m]
    so, do, ln = r0 - m * c, r0 - a[dev], r1 - r0
    own = src == dev
    own_src, own_dst, own_len = (np.zeros(k, _I64) for _ in range(3))
    own_src[dev[own]], own_dst[dev[own]], own_len[dev[own]] = so[own], do[own], ln[own]
    t = ~own
    shift, r = np.unique(m[t] - dev[t], return_inverse=True)
    r = r.reshape(-1)
    src_off, dst_off, length = (np.zeros((shift.size, k), _I64) for _ in range(3))
    source = np.full((shift.size, k), -1, _I64)
    src_off[r, src[t]] = so[t]
    dst_off[r, dev[t]] = do[t]
    length[r, dev[t]] = ln[t]
    source[r, dev[t]] = src[t]
    return FetchRounds(own_src, own_dst, own_len, shift.astype(_I64), src_off, dst_off, length, source)


def fetch_rounds(lo: Any, hi: Any, a: Any, c: int, holder: Any = None) -> FetchRounds:
    """:func:`fetch_rounds_np` or :func:`fetch_rounds_nb`, whichever pays (work: pieces).

    >>> fetch_rounds([0, 3], [5, 8], a=[-1, 3], c=4).source.tolist()
    [[-1, 0], [1, -1]]
    """
    lo_, hi_ = np.asarray(lo, dtype=_I64).reshape(-1), np.asarray(hi, dtype=_I64).reshape(-1)
    span = int(np.max(hi_ - lo_)) if lo_.size else 0
    work = lo_.size * (max(span, 0) // max(_int(c, "c", 1), 1) + 2)
    if use_numba("fetch_rounds", work):
        return fetch_rounds_nb(lo, hi, a, c, holder)
    return fetch_rounds_np(lo, hi, a, c, holder)
