"""Alpha-beta times of collectives over link levels (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005; hierarchical
all-reduce as in NCCL's tree/ring-of-rings and Horovod's hierarchical allreduce).

One level of ``p`` devices on a link (alpha, beta), ``n`` bytes of the full buffer:

* all-gather, reduce-scatter (ring): ``(p-1) alpha + (p-1)/p * n / beta``
* all-reduce: twice that (reduce-scatter then all-gather)
* all-to-all: ``(p-1) alpha + (p-1)/p^2 * n / beta`` on a switch (full bisection); on a
  ring (a torus dimension) the bandwidth term is ``p^2 / (4 (p-1))`` times larger
* collective-permute: ``alpha + b / beta`` for the ``b`` bytes each device sends

Several levels (fastest first, e.g. NVLink inside a node then the network): the collective
runs in phases, one per level, the data shrinking by each level's ``p`` on the way out::

    all-reduce over p = p_in * p_out:  reduce-scatter inside (n), all-reduce across (n / p_in),
                                       all-gather inside (n)
    >>> nv, ib = Link(1e-6, 100e9), Link(1e-5, 10e9)
    >>> t = collective_time("all-reduce", 8 * 2**20, [Level(8, nv), Level(4, ib)])
    >>> round(t * 1e6, 1)   # 2 * (7 us + 7/8 * 8 MiB / 100 GB/s) + 2 * (30 us + 3/4 * 1 MiB / 10 GB/s)
    378.1

That is ``algorithm="hierarchical"`` (the runtime phases the collective itself). Under
``algorithm="ring"`` (NCCL) one collective over several levels is one ring over all ``p``
devices, paced by the slowest link (largest alpha, smallest beta)::

    >>> t = collective_time("all-reduce", 8 * 2**20, [Level(8, nv), Level(4, ib)], "ring")
    >>> round(t * 1e6, 1)   # 2 * (31 * 10 us + 31/32 * 8 MiB / 10 GB/s)
    2245.3

A permute pays the slowest level its pairs cross. ``bytes_per_device`` is what a record of
``plan.collectives`` holds: an all-gather's shard, the buffer of the others.
"""
from __future__ import annotations

from typing import Sequence

from ..ops.collectives import (ALL_TO_ALL, ALL_TO_ALL_FORMULA, COLLECTIVE_PERMUTE, PAIRWISE, RING, RING_TWICE,
                               kind_of)
from .topology import Level, Link


def full_bytes(kind: str, bytes_per_device: int, p: int) -> int:
    """``n``, the collective's full buffer, from the bytes one device puts in."""
    return bytes_per_device * p if kind_of(kind).gathers else bytes_per_device


def _ring(kind: str, p: int, n: float, link: Link) -> float:
    alpha, beta = link.for_kind(kind)
    return (p - 1) * alpha + (p - 1) / p * n / beta


def _a2a(p: int, b: float, link: Link) -> float:
    """All-to-all of the local buffer ``b`` over one level."""
    alpha, beta = link.for_kind(ALL_TO_ALL)
    factor = 1.0 if link.all_to_all == "switch" or p <= 2 else p * p / (4.0 * (p - 1))
    return (p - 1) * alpha + (p - 1) / p * b / beta * factor


def collective_time(kind: str, bytes_per_device: int, levels: Sequence[Level],
                    algorithm: str = "hierarchical") -> float:
    """Seconds for one collective of ``kind`` whose record holds ``bytes_per_device``, over
    ``levels`` run as ``algorithm`` says ("hierarchical": one phase per level; "ring": one
    ring over every device, paced by the slowest link)."""
    formula = kind_of(kind).formula
    levels = [lv for lv in levels if lv.p > 1]
    if algorithm == "ring" and len(levels) > 1 and formula in (RING, RING_TWICE):
        p = 1
        for lv in levels:
            p *= lv.p
        ab = [lv.link.for_kind(kind) for lv in levels]
        slow = Link(max(a for a, _ in ab), min(b for _, b in ab))
        levels = [Level(p, slow)]
    if not levels or bytes_per_device == 0 and formula != RING_TWICE:
        return 0.0
    p = 1
    for lv in levels:
        p *= lv.p
    if formula == PAIRWISE:
        return max(_permute(bytes_per_device, lv.link) for lv in levels)
    if formula == ALL_TO_ALL_FORMULA:
        return sum(_a2a(lv.p, bytes_per_device, lv.link) for lv in levels)
    n = float(full_bytes(kind, bytes_per_device, p))
    t = 0.0
    for lv in levels:  # fastest level carries the whole buffer, each next one 1/p of it
        t += _ring(kind, lv.p, n, lv.link)
        n /= lv.p
    return 2 * t if formula == RING_TWICE else t


def _permute(b: float, link: Link) -> float:
    alpha, beta = link.for_kind(COLLECTIVE_PERMUTE)
    return alpha + b / beta


def sent_bytes(kind: str, bytes_per_device: int, p: int) -> float:
    """Bytes each device sends under the ring / direct algorithms above (one level)."""
    if p <= 1:
        return 0.0
    n = full_bytes(kind, bytes_per_device, p)
    formula = kind_of(kind).formula
    if formula == RING:
        return (p - 1) / p * n
    if formula == RING_TWICE:
        return 2 * (p - 1) / p * n
    if formula == ALL_TO_ALL_FORMULA:
        return (p - 1) / p * bytes_per_device
    return float(bytes_per_device)
