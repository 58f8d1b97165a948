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
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "shard_bounds", "shard_bounds_np", "shard_bounds_nb",
    "window_halos", "window_halos_np", "window_halos_nb",
    "device_groups", "device_groups_np", "device_groups_nb",
    "fetch_rounds", "fetch_rounds_np", "fetch_rounds_nb",
    "jit_kernels", "NUMBA_COLD_WORK", "NUMBA_WARM_WORK",
]

I64 = np.int64
_I64_MAX = np.iinfo(np.int64).max

#: Per kernel: the work (about: shards x inner iterations) from which ``foo`` loads Numba to run
#: the kernel in a process that has not loaded it yet, i.e. where the NumPy twin's extra time
#: over the kernel's pays for Numba's import and the kernel's cache load (~0.5-1.5 s); measured
#: by ``python -m benchmarks --only index`` (benchmarks/results/index_math.md), rounded to a
#: power of two. No mesh that exists comes near: 8,192 shards are at most ~10^5 units of work.
NUMBA_COLD_WORK: dict[str, int] = {
    "shard_bounds": 1 << 30, "window_halos": 1 << 25, "device_groups": 1 << 31, "fetch_rounds": 1 << 23,
}
#: Work from which a kernel already loaded in this process beats its NumPy twin call for call
#: (measured: from the smallest sizes).
NUMBA_WARM_WORK = 1 << 8


# ----------------------------------------------------------------------------------------
# Lazy Numba: kernels are plain module-level Python functions (valid Numba code); they are
# jitted on first use and memoised. Module level => ``cache=True`` can locate them.
# ----------------------------------------------------------------------------------------

_JITTED: dict[str, Callable[..., Any]] = {}
_LOADED: set[str] = set()  # kernels compiled or loaded from the cache in this process
_JIT_LOCK = threading.Lock()
_KERNELS: dict[str, Callable[..., Any]] = {}  # name -> plain Python kernel (module level, any module)


def kernels(*fns: Callable[..., Any]) -> None:
    """Register module-level kernels named ``_<name>_kernel`` (this module's and halo_tables')."""
    for fn in fns:
        _KERNELS[fn.__name__[1:-len("_kernel")]] = fn


def _jit(name: str) -> Callable[..., Any]:
    """The ``njit(cache=True)`` version of kernel ``_<name>_kernel`` (built once, then memoised)."""
    fn = _JITTED.get(name)
    if fn is None:
        with _JIT_LOCK:
            fn = _JITTED.get(name)
            if fn is None:
                import numba  # lazy: keeps the cold import of gspmd_py fast

                kernel = _KERNELS[name]
                # The on-disk cache pickles the kernel's module name: only use it under the
                # canonical package name (not e.g. when a file is run by path).
                cacheable = kernel.__module__.startswith("gspmd_py.partitioner.")
                fn = numba.njit(cache=cacheable, nogil=True)(kernel)
                _JITTED[name] = fn
    return fn


def run_kernel(name: str, *args: Any) -> Any:
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
    return ("shard_bounds", "window_halos", "device_groups", "fetch_rounds")


# ----------------------------------------------------------------------------------------
# argument helpers
# ----------------------------------------------------------------------------------------

def as_int(x: Any, name: str, lo: int | None = None) -> int:
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
    n, k = as_int(n, "n", 0), as_int(k, "k", 1)
    return run_kernel("shard_bounds", I64(n), I64(k))


def shard_bounds_np(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy twin of :func:`shard_bounds_nb`.

    >>> [a.tolist() for a in shard_bounds_np(10, 4)]
    [[0, 3, 6, 9], [3, 6, 9, 10]]
    """
    n, k = as_int(n, "n", 0), as_int(k, "k", 1)
    c = _ceil_div(n, k)
    i = np.arange(k, dtype=I64)
    return np.minimum(i * c, n), np.minimum((i + 1) * c, n)


def shard_bounds(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shard_bounds_np` or :func:`shard_bounds_nb`, whichever pays (work: ``k``).

    >>> [a.tolist() for a in shard_bounds(10, 4)]
    [[0, 3, 6, 9], [3, 6, 9, 10]]
    """
    kk = as_int(k, "k", 1)
    return shard_bounds_nb(n, k) if use_numba("shard_bounds", kk) else shard_bounds_np(n, k)


# ========================================================================================
# 2. window_halos
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
    n_in = as_int(n_in, "n_in", 0)
    k = as_int(k, "k", 1)
    window = as_int(window, "window", 1)
    stride = as_int(stride, "stride", 1)
    dilation = as_int(dilation, "dilation", 1)
    pad_lo = as_int(pad_lo, "pad_lo")
    pad_hi = as_int(pad_hi, "pad_hi")
    ld = as_int(lhs_dilation, "lhs_dilation", 1)
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
                if tlo > thi or (-q0) % g != 0:  # no step lands on a real (undilated) row
                    continue
                tmin = tlo
                tmax = thi
                if m > 1:  # every m-th step lands on a real row, from t0 on
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
    arrays = run_kernel("window_halos", *[I64(v) for v in p])
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
    i = np.arange(k, dtype=I64)
    a = np.minimum(i * c_out, n_out)
    b = np.minimum(a + c_out, n_out)
    cnt_o = b - a
    ss = np.minimum(i * c_in, n_in)
    se = np.minimum(ss + c_in, n_in)
    best_lo = np.full(k, _I64_MAX, dtype=I64)
    best_hi = np.full(k, -1, dtype=I64)
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
            u = np.arange(u0, min(n_loop, u0 + blk), dtype=I64)[None, :]
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


kernels(_shard_bounds_kernel, _window_halos_kernel)
