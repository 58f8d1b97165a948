"""Hierarchy-aware reductions (P²: Xie et al., arXiv 2110.10548): a sum over mesh axes whose
devices span link levels, synthesized as the cheapest program of P²'s grammar.

The grammar: reduce-scatter over sub-groups ``S1, S2, ...`` (each a set of the reduction's
fine axes), an all-reduce over the rest ``R``, all-gathers back over ``..., S2, S1``::

    all-reduce over (node, gpu) of n bytes, 2 nodes x 4 GPUs:
        flat:        all-reduce(node,gpu) n                 one ring paced by the network
        candidate:   reduce-scatter(gpu) n; all-reduce(node) n/4; all-gather(gpu) n/4

A reduce-scatter over axes ``A`` is the same grammar without the all-reduce and
all-gathers: reduce-scatters over an ordered partition of ``A``. Every candidate is priced
by the cost model (``Hardware.collective_time``: the same formula ``plan.cost`` applies to
the collectives the program then holds), the cheapest wins, ties to the fewest
collectives, then to the flat one. A mesh axis that crosses a node boundary is split
there (``link_refs``: "x" of 8 devices laid 2 per node becomes ``x:(1)4`` across nodes
and ``x:(4)2`` inside one), so its in-node part is a sub-group of its own.

The buffer is flattened and padded to a multiple of the scattered groups' size, so any
shape decomposes; the all-gathers restore it. Only sums of numbers are decomposed
(reduce-scatter adds): max/min/pick/bool reductions stay flat.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterable, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from ..ops.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from ..core.mesh import AxisRef, Mesh
from .shaping import Shaped

MAX_ATOMS = 4  # every ordered partition up to this many fine axes; beyond it one split each


def link_refs(mesh: Mesh, hw, refs: Iterable[AxisRef]) -> list[AxisRef]:
    """Sub-axes at the link boundaries of ``mesh``'s axes on ``hw``: for an axis whose group
    spans levels, its largest minor (or major) part whose group stays on one level. Only
    boundaries that nest with those of ``refs`` (the plan's own sub-axes) are returned."""
    bounds = {a: {1, n} for a, n in zip(mesh.axis_names, mesh.shape)}
    for r in refs:
        bounds[r.name] |= {r.pre, r.pre * r.size}
    out = []
    for a, n in zip(mesh.axis_names, mesh.shape):
        if n < 4 or hw.is_flat(mesh, (a,)):
            continue
        for m in sorted((m for m in range(2, n) if n % m == 0), reverse=True):
            found = [r for r in (mesh.sub(a, n // m, m), mesh.sub(a, 1, m)) if hw.is_flat(mesh, (r,))]
            if found:
                r = found[0]
                new = sorted(bounds[a] | {r.pre, r.pre * r.size})
                if all(hi % lo == 0 for lo, hi in zip(new, new[1:])):
                    bounds[a] = set(new)
                    out.append(r)
                break
    return out


# -- candidates --------------------------------------------------------------------------------

def _ordered_partitions(atoms: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], ...]]:
    """Every sequence of disjoint non-empty subsets covering ``atoms`` (each subset in atom order)."""
    if not atoms:
        yield ()
        return
    for r in range(1, len(atoms) + 1):
        for first in itertools.combinations(atoms, r):
            rest = tuple(a for a in atoms if a not in first)
            for tail in _ordered_partitions(rest):
                yield (first,) + tail


def _subsets(atoms: tuple[str, ...]) -> Iterable[tuple[str, ...]]:
    for r in range(0, len(atoms) + 1):
        yield from itertools.combinations(atoms, r)


def all_reduce_candidates(atoms: tuple[str, ...]) -> list[tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]]:
    """(scatter phases, all-reduce axes) for every program of the grammar; the flat one first."""
    out = [((), atoms)]
    if len(atoms) <= MAX_ATOMS:
        for scattered in _subsets(atoms):
            if not scattered:
                continue
            rest = tuple(a for a in atoms if a not in scattered)
            for phases in _ordered_partitions(scattered):
                if phases == (atoms,):  # reduce-scatter + all-gather over everything: the flat ring again
                    continue
                out.append((phases, rest))
    else:
        for r in range(1, len(atoms)):
            for s in itertools.combinations(atoms, r):
                out.append(((s,), tuple(a for a in atoms if a not in s)))
    return out


class Synth:
    """Prices programs of the grammar on ``ctx``'s hardware, over the plan's mesh."""

    def __init__(self, ctx):
        self.ctx, self.hw, self.mesh = ctx, ctx.shaping.hardware, ctx.fine.mesh

    def time(self, kind: str, axes: Sequence[str], nbytes: int) -> float:
        key, memo = (kind, tuple(axes), int(nbytes)), self.ctx.prices.seconds
        hit = memo.get(key)
        if hit is None:
            refs = self.ctx.fine.coarse(axes)
            hit = memo[key] = self.hw.collective_time(kind, int(nbytes), self.mesh, refs)
        return hit

    def spans_levels(self, axes: Sequence[str]) -> bool:
        key, memo = tuple(axes), self.ctx.prices.spans_levels
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = not self.hw.is_flat(self.mesh, self.ctx.fine.coarse(axes))
        return hit

    def steps(self, phases, rest, nbytes: int, item: int) -> list[tuple[str, tuple[str, ...], int]]:
        """The collectives of a candidate, each (kind, axes, bytes per device as recorded)."""
        k = math.prod(self.ctx.k(s) for s in phases)
        n = -(-nbytes // (k * item)) * k * item if phases else nbytes
        out = []
        for s in phases:
            out.append((REDUCE_SCATTER, s, n))
            n //= self.ctx.k(s)
        if rest:
            out.append((ALL_REDUCE, rest, n))
        for s in reversed(phases):
            out.append((ALL_GATHER, s, n))
            n *= self.ctx.k(s)
        return out

    def price(self, steps) -> float:
        return sum(self.time(kind, axes, nb) for kind, axes, nb in steps)


def _choose(priced: list[tuple[float, int, object]]):
    """The cheapest; prices within 1e-9 of it are ties, won by the fewest collectives, then
    by the earliest candidate (the flat one is first)."""
    best = min(p for p, _, _ in priced)
    near = [(n, i, c) for i, (p, n, c) in enumerate(priced) if p <= best * (1 + 1e-9)]
    return min(near, key=lambda t: (t[0], t[1]))[2]


def _text(ctx, steps) -> str:
    return "; ".join(f"{k}({ctx.fine.label(a)}) {nb}B" for k, a, nb in steps)


def _record(ctx, what: str, chosen, priced_chosen: float, flat: float) -> None:
    ctx.record_shaped(Shaped(ctx.current_op, what, chosen, priced_chosen, flat))


# -- emission ----------------------------------------------------------------------------------

def all_reduce_sum(ctx, x, axes: tuple[str, ...]):
    """psum of ``x`` over ``axes``, as the cheapest program of the grammar on the plan's hardware."""
    if ctx.shaping.hardware is None or len(axes) == 0 or x.size == 0:
        return ctx.all_reduce(x, axes, "sum")
    syn = Synth(ctx)
    if not syn.spans_levels(axes):
        return ctx.all_reduce(x, axes, "sum")
    item = np.dtype(x.dtype).itemsize
    nbytes = int(x.size) * item
    cands = []
    for phases, rest in all_reduce_candidates(tuple(axes)):
        steps = syn.steps(phases, rest, nbytes, item)
        cands.append((syn.price(steps), len(steps), (phases, rest, steps)))
    phases, rest, steps = _choose(cands)
    if not phases:
        return ctx.all_reduce(x, axes, "sum")
    _record(ctx, f"all-reduce({ctx.fine.label(axes)}) {nbytes}B", _text(ctx, steps), syn.price(steps), cands[0][0])
    k = math.prod(ctx.k(s) for s in phases)
    flat = x.reshape(-1)
    n = flat.shape[0]
    if n % k:
        flat = jnp.pad(flat, (0, k - n % k))
    for s in phases:
        flat = ctx.reduce_scatter(flat, s, 0)
    if rest:
        flat = ctx.all_reduce(flat, rest, "sum")
    for s in reversed(phases):
        flat = ctx.all_gather(flat, s, 0)
    return flat[:n].reshape(x.shape)


def _scatter_candidates(ctx, syn: Synth, axes: tuple[str, ...], nbytes: int):
    parts = list(_ordered_partitions(tuple(axes))) if len(axes) <= MAX_ATOMS else [(tuple(axes),)]
    cands = []
    for phases in parts:
        steps, n = [], nbytes
        for s in phases:
            steps.append((REDUCE_SCATTER, s, n))
            n //= ctx.k(s)
        cands.append((syn.price(steps), len(steps), (phases, steps)))
    return cands


def reduce_scatter_time(ctx, axes: tuple[str, ...], nbytes: int) -> float:
    """Predicted seconds of the reduce-scatter ``reduce_scatter_sum`` would emit (ctx has a hardware)."""
    syn = Synth(ctx)
    if len(axes) < 2 or not syn.spans_levels(axes):
        return syn.time(REDUCE_SCATTER, axes, nbytes)
    return min(p for p, _, _ in _scatter_candidates(ctx, syn, axes, nbytes))


def reduce_scatter_sum(ctx, x, axes: tuple[str, ...], dim: int):
    """psum_scatter of ``x`` over ``axes`` (tiled, ``axes`` major first) on ``dim``, as the
    cheapest ordered sequence of reduce-scatters over sub-groups of ``axes``."""
    syn: Optional[Synth] = None
    if ctx.shaping.hardware is not None and len(axes) > 1 and x.size:
        syn = Synth(ctx)
    if syn is None or not syn.spans_levels(axes):
        return ctx.reduce_scatter(x, axes, dim)
    item = np.dtype(x.dtype).itemsize
    nbytes = int(x.size) * item
    cands = _scatter_candidates(ctx, syn, tuple(axes), nbytes)
    phases, steps = _choose(cands)
    if len(phases) == 1:
        return ctx.reduce_scatter(x, axes, dim)
    _record(ctx, f"reduce-scatter({ctx.fine.label(axes)}) {nbytes}B", _text(ctx, steps), syn.price(steps),
            cands[0][0])
    # view dim as (k_a for a in axes) x c, put the blocks in phase order, scatter phase by phase
    sizes = [ctx.k((a,)) for a in axes]
    c = x.shape[dim] // math.prod(sizes)
    y = jnp.moveaxis(x, dim, 0)
    rest_shape = y.shape[1:]
    y = y.reshape(tuple(sizes) + (c,) + rest_shape)
    order = [axes.index(a) for s in phases for a in s]
    y = jnp.transpose(y, order + list(range(len(axes), y.ndim)))
    y = y.reshape((math.prod(sizes) * c,) + rest_shape)
    for s in phases:
        y = ctx.reduce_scatter(y, s, 0)
    return jnp.moveaxis(y, 0, dim)
