"""The partitioner's index math: per-shard tables of a sharded dim, vectorised over shards.

Each table is ONE NumPy definition, vectorised over all shards (Python loops only over mesh
axes and blocks of window elements, never over shards or devices); there is no Numba path
and no dispatcher: loading Numba costs more than the tables take at any mesh size planned
(``benchmarks/results/index_math.md``; docs/performance.md's appendix), so ``import gspmd_py``
and planning never load Numba.

Conventions. A tensor dim of global size ``n`` split into ``k`` shards uses shards of
``c = ceil(n / k)`` rows: shard ``i`` holds global rows ``[i*c, min(n, (i+1)*c))`` and the
rest of its ``c`` local rows is padding. When ``k*c - n >= c`` some trailing shards are
entirely padding (empty). Worked examples::

    shard_bounds(10, 4)    c = 3   start [0, 3, 6, 9]   stop [3, 6, 9, 10]
    shard_bounds(5, 4)     c = 2   start [0, 2, 4, 5]   stop [2, 4, 5, 5]    (shard 3 empty)
    shard_bounds(0, 3)     c = 0   start [0, 0, 0]      stop [0, 0, 0]

    window_halos(10, 2, window=3, pad_lo=1, pad_hi=1)      a "SAME" 3-tap conv over 2 shards
        out rows [0, 5) [5, 10); input held [0, 5) [5, 10); read [0, 6) [4, 10)
        left_halo [0, 1], right_halo [1, 0], window_start [-1, 4]

    fetch_rounds(lo=[0, 3, 7, 11], hi=[5, 9, 13, 16], a=[-1, 3, 7, 11], c=4)
        rounds by shift [-1, +1]; round -1: device d receives from d-1 (sources [-1, 0, 1, 2])

The other modules call :func:`shard_bounds`, :func:`window_halos` (partitioner/halo.py) and, in
halo_tables.py, :func:`fetch_rounds` (partitioner/halo.py). The device groups of a collective
(``device_groups``, read by the cost model too) live with the execution mesh, core/fine_mesh.py.
All outputs are int64 NumPy arrays; scalars in :func:`window_halos`'s dict are Python ints.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..core.errors import as_int

__all__ = ["shard_bounds", "window_halos", "I64"]

I64 = np.int64
_I64_MAX = np.iinfo(np.int64).max


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ========================================================================================
# 1. shard_bounds
# ========================================================================================

def shard_bounds(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Global row range ``[start[i], stop[i])`` of each of ``k`` shards of a dim of size ``n``.

    ``c = ceil(n/k)``; ``start = min(i*c, n)``, ``stop = min((i+1)*c, n)`` (int64[k]).

    >>> start, stop = shard_bounds(10, 4)          # c = 3
    >>> start.tolist(), stop.tolist()
    ([0, 3, 6, 9], [3, 6, 9, 10])
    >>> [a.tolist() for a in shard_bounds(5, 4)]   # c = 2: last shard is empty
    [[0, 2, 4, 5], [2, 4, 5, 5]]
    """
    n, k = as_int(n, "n", 0), as_int(k, "k", 1)
    c = _ceil_div(n, k)
    i = np.arange(k, dtype=I64)
    return np.minimum(i * c, n), np.minimum((i + 1) * c, n)


# ========================================================================================
# 2. window_halos
# ========================================================================================

_HALO_KEYS = ("out_start", "out_stop", "in_lo", "in_hi", "left_halo", "right_halo", "window_start",
              "shard_in_start", "shard_in_stop")


def _window_params(n_in: int, k: int, window: int, stride: int, dilation: int, pad_lo: int,
                   pad_hi: int, lhs_dilation: int) -> tuple[int, ...]:
    """Checked scalar parameters of :func:`window_halos`.

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


def _halo_dict(arrays: Sequence[np.ndarray], n_out: int) -> dict[str, Any]:
    d: dict[str, Any] = dict(zip(_HALO_KEYS, arrays))
    d["max_left"] = int(d["left_halo"].max()) if d["left_halo"].size else 0
    d["max_right"] = int(d["right_halo"].max()) if d["right_halo"].size else 0
    d["n_out"] = int(n_out)
    return d


def window_halos(n_in: int, k: int, window: int, stride: int = 1, dilation: int = 1,
                 pad_lo: int = 0, pad_hi: int = 0, lhs_dilation: int = 1,
                 *, block_elems: int = 1 << 20) -> dict[str, Any]:
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

    Method: a shard whose first and last window positions are real rows reads exactly the
    rows between them; the others walk, vectorised over those shards, the smaller of the two
    loop dims in blocks of at most ``block_elems`` elements and solve the other one in
    closed form (see :func:`_window_params`). ``block_elems`` changes only the temporaries' size.

    >>> h = window_halos(10, 2, window=3, pad_lo=1, pad_hi=1)   # "same" conv, 2 shards
    >>> [h[key].tolist() for key in ("out_start", "out_stop", "in_lo", "in_hi")]
    [[0, 5], [5, 10], [0, 4], [6, 10]]
    >>> h["left_halo"].tolist(), h["right_halo"].tolist(), h["window_start"].tolist()
    ([0, 1], [1, 0], [-1, 4])
    >>> h["max_left"], h["max_right"], h["n_out"]
    (1, 1, 10)
    """
    (n_in, k, window, stride, dilation, pad_lo, ld, n_out, c_out, c_in, over_o, step, g, m,
     inv) = _window_params(n_in, k, window, stride, dilation, pad_lo, pad_hi, lhs_dilation)
    a, b = shard_bounds(n_out, k)  # the shard's output rows
    ss, se = shard_bounds(n_in, k)  # the input rows it holds
    cnt_o = b - a
    block_elems = as_int(block_elems, "block_elems", 1)
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
