"""The halo planner's transfer rounds, vectorised over all devices (one NumPy definition, no
Numba: see index_math's header for the measurement)."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..core.errors import as_int
from .index_math import I64


# ========================================================================================
# fetch_rounds (the halo planner's transfers)
# ========================================================================================

class FetchRounds(NamedTuple):
    """The transfers that give every device the rows it needs (see :func:`fetch_rounds`).

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
    lo = np.ascontiguousarray(np.asarray(lo), dtype=I64).reshape(-1)
    hi = np.ascontiguousarray(np.asarray(hi), dtype=I64).reshape(-1)
    a = np.ascontiguousarray(np.asarray(a), dtype=I64).reshape(-1)
    c = as_int(c, "c", 1)
    k = lo.size
    holder = (np.arange(k, dtype=I64) if holder is None
              else np.ascontiguousarray(np.asarray(holder), dtype=I64).reshape(-1))
    if not (hi.size == a.size == holder.size == k):
        raise ValueError(f"lo, hi, a and holder must have one entry per device, got sizes "
                         f"{lo.size}, {hi.size}, {a.size}, {holder.size}")
    has = hi > lo
    if k and (np.any(lo[has] < 0) or np.any(hi[has] > k * c)):
        raise ValueError(f"rows to fetch must lie in [0, k*c) = [0, {k * c})")
    return lo, hi, a, c, holder


def fetch_rounds(lo: Any, hi: Any, a: Any, c: int, holder: Any = None) -> FetchRounds:
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
    >>> r = fetch_rounds([0, 3, 7, 11], [5, 9, 13, 16], a=[-1, 3, 7, 11], c=4)
    >>> r.shift.tolist(), r.source.tolist()
    ([-1, 1], [[-1, 0, 1, 2], [1, 2, 3, -1]])
    >>> r.length.tolist(), r.own_len.tolist()
    ([[0, 1, 1, 1], [1, 1, 1, 0]], [4, 4, 4, 4])
    >>> r.src_off.tolist(), r.dst_off.tolist()        # left halo: a neighbour's last row
    ([[3, 3, 3, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [5, 5, 5, 0]])
    """
    lo, hi, a, c, holder = _fetch_args(lo, hi, a, c, holder)
    k = lo.size
    # every piece (device, shard it overlaps), device-major: vectorised over pieces
    has = hi > lo
    m0 = np.where(has, lo // c, 0)
    cnt = np.where(has, (hi - 1) // c + 1 - m0, 0)
    dev = np.repeat(np.arange(k, dtype=I64), cnt)
    first = np.cumsum(cnt) - cnt
    m = np.repeat(m0, cnt) + (np.arange(dev.size, dtype=I64) - np.repeat(first, cnt))
    r0 = np.maximum(lo[dev], m * c)
    r1 = np.minimum(hi[dev], m * c + c)
    src = holder[m]
    so, do, ln = r0 - m * c, r0 - a[dev], r1 - r0
    own = src == dev
    own_src, own_dst, own_len = (np.zeros(k, I64) for _ in range(3))
    own_src[dev[own]], own_dst[dev[own]], own_len[dev[own]] = so[own], do[own], ln[own]
    t = ~own
    # rounds: the shifts that occur (m - dev lies in [-(k-1), k-1]), in increasing order
    sh = m[t] - dev[t] + (k - 1)
    present = np.zeros(max(2 * k - 1, 0), dtype=bool)
    present[sh] = True
    shift = np.flatnonzero(present).astype(I64) - (k - 1)
    r = (np.cumsum(present, dtype=I64) - 1)[sh]
    src_off, dst_off, length = (np.zeros((shift.size, k), I64) for _ in range(3))
    source = np.full((shift.size, k), -1, I64)
    src_off[r, src[t]] = so[t]
    dst_off[r, dev[t]] = do[t]
    length[r, dev[t]] = ln[t]
    source[r, dev[t]] = src[t]
    return FetchRounds(own_src, own_dst, own_len, shift, src_off, dst_off, length, source)
