"""Links between devices and the topologies that turn a group of device ids into link levels.

Plain values, read by the collective times (collectives.py) and by ``gp.Hardware``
(hardware.py, which says how mesh axes map to them).
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Union

import attrs
import numpy as np

from ..core.errors import ShardingError


@attrs.frozen
class Link:
    """One kind of link: ``alpha`` seconds per message step, ``beta`` bytes/s moved by each device;
    ``name`` labels it in reports.

    ``all_to_all``: "switch" (full bisection: each device sends its (p-1)/p share at beta)
    or "ring" (a torus dimension: traffic crosses p/4 hops on average, so an all-to-all
    over p devices takes p^2/(4(p-1)) times the switch's bandwidth term).
    ``per_kind``: (kind, alpha, beta) fitted for one collective kind (``Hardware.calibrate``
    fits each kind on its own where one pair does not fit all, as on a CPU host).
    """

    alpha: float
    beta: float
    name: str = ""
    all_to_all: str = attrs.field(default="switch", validator=attrs.validators.in_(("switch", "ring")))
    per_kind: tuple[tuple[str, float, float], ...] = ()  # (kind, alpha, beta) measured for one kind

    def for_kind(self, kind: str) -> tuple[float, float]:
        """(alpha, beta) for a collective of ``kind``: its own fit if calibrated, else the link's."""
        for k, a, b in self.per_kind:
            if k == kind:
                return a, b
        return self.alpha, self.beta


@attrs.frozen
class Level:
    """``p`` devices of a collective's group that talk over ``link``."""

    p: int
    link: Link


# -- topologies: a group of device ids -> link levels ------------------------------------

@attrs.frozen
class Switched:
    """Nodes of ``node_size`` devices on a switch (``intra``), nodes on a network (``inter``).

    ``node_size=None``: one flat switch (every group uses ``intra``).
    """

    intra: Link
    inter: Optional[Link] = None
    node_size: Optional[int] = None

    def levels_of(self, ids: np.ndarray, n_devices: int) -> list[Level]:
        p = len(ids)
        if self.node_size is None or self.inter is None:
            return [Level(p, self.intra)]
        nodes = len(np.unique(ids // self.node_size))
        p_in = p // nodes
        return [lv for lv in (Level(p_in, self.intra), Level(nodes, self.inter)) if lv.p > 1]


@attrs.frozen
class Torus:
    """Chips on a ``dims``-D torus linked by ``ici`` (per link and direction); ``cores_per_chip``
    devices per chip, linked by ``on_chip``. The torus shape comes from the chip count."""

    dims: int
    ici: Link
    cores_per_chip: int = 1
    on_chip: Optional[Link] = None

    def shape(self, chips: int) -> tuple[int, ...]:
        return _box(chips, self.dims)

    def levels_of(self, ids: np.ndarray, n_devices: int) -> list[Level]:
        c = self.cores_per_chip
        chips = ids // c
        out = []
        per_chip = len(ids) // len(np.unique(chips))
        if per_chip > 1:
            out.append(Level(per_chip, self.on_chip or self.ici))
        shape = self.shape(max(1, -(-n_devices // c)))
        coords = np.stack(np.unravel_index(chips, shape[::-1])[::-1])  # x fastest
        # a bidirectional ring moves 2 links' worth per chip, shared by the chip's cores
        ring = Link(self.ici.alpha, 2 * self.ici.beta / c, self.ici.name, "ring")
        for d in range(self.dims):
            k = len(np.unique(coords[d]))
            if k > 1:
                out.append(Level(k, ring))
        return out


@attrs.frozen
class PerAxis:
    """One link per mesh axis (what ``Hardware.calibrate`` measures); ``default`` for others."""

    links: tuple[tuple[str, Link], ...]
    default: Optional[Link] = None

    def link(self, axis: str) -> Link:
        for a, lk in self.links:
            if a == axis:
                return lk
        if self.default is None:
            raise ShardingError(f"this hardware has no link for mesh axis {axis!r} "
                                f"(it was calibrated for axes {[a for a, _ in self.links]})")
        return self.default


Topology = Union[Switched, Torus, PerAxis]


@functools.lru_cache(maxsize=1024)  # (chip count, torus dims), and their divisors' on the way
def _box(n: int, dims: int) -> tuple[int, ...]:
    """The most nearly square/cubic shape of ``dims`` factors of ``n`` (largest first)."""
    if dims == 1:
        return (n,)
    best = None
    for a in _divisors(n):
        shape = tuple(sorted((a,) + _box(n // a, dims - 1), reverse=True))
        score = (max(shape) / min(shape), shape)
        if best is None or score < best[0]:
            best = (score, shape)
    return best[1]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
