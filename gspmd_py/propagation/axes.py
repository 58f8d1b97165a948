"""Pure helpers on per-dim axis lists (major first), sub-axis aware.

A dim's axes are compared as sequences of *atoms*: every (sub-)axis expanded into
prime-sized sub-axes, major first. So ``[y]`` (y of size 4) is a prefix of
``[y:(1)2]``'s extension ``[y:(1)2, y:(2)2]`` and equals it::

    >>> merge([y12, y22]) == [y]          # y:(1)2, y:(2)2 -> y
    >>> distribute([a4], [2, 4])          # a of size 4 over factors of sizes 2 and 4
    [[a:(1)2], [a:(2)2]]
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

from ..core.mesh import AxisRef, Mesh

Axes = tuple[AxisRef, ...]


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def atoms(mesh: Mesh, axes: Sequence[AxisRef]) -> list[AxisRef]:
    return list(_atoms(mesh, tuple(axes)))


@functools.lru_cache(maxsize=8192)
def _atoms(mesh: Mesh, axes: tuple[AxisRef, ...]) -> tuple[AxisRef, ...]:
    # a pure function of hashable values: the cache only saves work (the hot spot of propagation)
    out: list[AxisRef] = []
    for a in axes:
        pre = a.pre
        for p in _primes(a.size):
            out.append(mesh.sub(a.name, pre, p))
            pre *= p
    return tuple(out)


def merge(mesh: Mesh, axes: Sequence[AxisRef]) -> Axes:
    """Merge adjacent sub-axes of one axis (``y:(1)2, y:(2)2`` -> ``y``)."""
    return mesh.merge(axes)


def is_prefix(mesh: Mesh, a: Sequence[AxisRef], b: Sequence[AxisRef]) -> bool:
    aa, bb = _atoms(mesh, tuple(a)), _atoms(mesh, tuple(b))
    return len(aa) <= len(bb) and bb[: len(aa)] == aa


@functools.lru_cache(maxsize=1 << 14)
def grown(mesh: Mesh, old: Axes, new: Axes, others: Axes) -> Optional[Axes]:
    """What a dim sharded ``old`` takes when offered ``new`` while the tensor's other dims use
    ``others``: ``new`` cut at its first atom overlapping ``others``, when that strictly
    extends ``old`` (more atoms, ``old`` a prefix of it); else None. Memoised: propagation
    asks this for the same few shardings at every op of a repeated layer."""
    n_old = len(_atoms(mesh, tuple(old)))
    if len(_atoms(mesh, tuple(new))) <= n_old or not is_prefix(mesh, old, new):
        return None
    new = truncate_at_overlap(mesh, new, others)
    if len(_atoms(mesh, tuple(new))) <= n_old or not is_prefix(mesh, old, new):
        return None
    return new


def common_prefix(mesh: Mesh, a: Sequence[AxisRef], b: Sequence[AxisRef]) -> Axes:
    aa, bb = atoms(mesh, a), atoms(mesh, b)
    n = 0
    while n < min(len(aa), len(bb)) and aa[n] == bb[n]:
        n += 1
    return merge(mesh, aa[:n])


def size(axes: Sequence[AxisRef]) -> int:
    n = 1
    for a in axes:
        n *= a.size
    return n


def overlaps(a: AxisRef, used: Sequence[AxisRef]) -> bool:
    return any(a.overlaps(u) for u in used)


def truncate_at_overlap(mesh: Mesh, axes: Sequence[AxisRef], used: Sequence[AxisRef]) -> Axes:
    out = []
    for a in atoms(mesh, axes):
        if overlaps(a, used):
            break
        out.append(a)
    return merge(mesh, out)


def distribute(mesh: Mesh, axes: Sequence[AxisRef], sizes: Sequence[int]) -> list[Axes]:
    """Split a dim's axes over its factors (major first), as Shardy does for reshape.

    A factor takes axes while they divide what is left of it; an axis larger than the
    rest of a factor is split into sub-axes when divisible. A dim with one factor takes
    all its axes (uneven sharding allowed). Axes that fit nowhere are dropped.
    """
    if len(sizes) == 1:
        return [tuple(axes)]
    out: list[list[AxisRef]] = [[] for _ in sizes]
    f = 0
    rest = sizes[0] if sizes else 1
    for a in axes:
        while f < len(sizes) and rest == 1:
            f += 1
            rest = sizes[f] if f < len(sizes) else 1
        if f >= len(sizes):
            break
        if rest % a.size == 0:
            out[f].append(a)
            rest //= a.size
            continue
        if a.size % rest == 0:
            out[f].append(mesh.sub(a.name, a.pre, rest))
            remaining = mesh.sub(a.name, a.pre * rest, a.size // rest)
            f += 1
            rest = sizes[f] if f < len(sizes) else 1
            while f < len(sizes) and rest == 1:
                f += 1
                rest = sizes[f] if f < len(sizes) else 1
            if f >= len(sizes) or rest % remaining.size:
                break
            out[f].append(remaining)
            rest //= remaining.size
            continue
        break
    return [merge(mesh, o) for o in out]


def project(mesh: Mesh, factor_axes: Sequence[Axes], sizes: Sequence[int]) -> Axes:
    """A dim's axes from its factors' axes: a minor factor counts only if the ones before are full."""
    out: list[AxisRef] = []
    for i, (axes, s) in enumerate(zip(factor_axes, sizes)):
        out.extend(axes)
        if len(sizes) > 1 and size(axes) != s:
            break
    return merge(mesh, out)
