"""Where a partial value that forks is reduced: once, at the fork, or deferred per use.

The driver carries a partial sum unreduced through linear ops (partial.py's ``carry_modes``)
and reduces it where a consumer needs the sum. When one partial value has several uses that
each end in their own reduction, directly or after carrying it through linear ops, deferring
reduces the same sum several times, as different values. An Adam step is the common case::

    g = dot(x.T, dy)            # partial over the batch axis
    m = b1 * m + (1 - b1) * g   # (1 - b1) * g carried, reduced at the add
    v = b2 * v + (1 - b2) * g * g  # g reduced for the square, and (1 - b2) * g at the mul

three all-reduces of g's size where XLA moves one. ``reduce_at_fork`` looks ahead over a
graph before it is partitioned: it follows each partial value the way the driver will carry
it (the same ``carry_modes``, operand shardings and result reshards) and collects the
distinct reductions its carried descendants would need. A value whose descendants would be
reduced at more than one point, at more cost than reducing the value itself, is reduced
where it is made (through the one cached reshard), so every use reads the reduced value.
Deferral stays where it pays: a single chain (an add_any of cotangents reduced once, a sum
carried through a reduce_sum to a smaller value), or reduce-scatters (half an all-reduce)
whose total does not exceed the all-reduce at the fork.

The look-ahead only decides *where* a partial is reduced, never whether: reducing a partial
sum earlier is always exact (the NaN/inf rules of partial.py hold for every order), so an
inexact prediction costs bytes, never correctness.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional, Sequence

import attrs
import numpy as np

from ..core import dtypes
from ..core.ir import Graph
from .partial import KEEP, carry_modes
from .pvalue import FineDims, Partial

#: a reduction point: (value id, "ar") for an all-reduce, (value id, target dims) for a reduce-scatter
Point = tuple


@attrs.frozen
class _Abstract:
    """What ``carry_modes`` reads of an operand: its partial."""

    partial: Optional[Partial]


@attrs.define
class _Flow:
    """One look-ahead pass: per value id its partial as held, its layout, its direct reduction
    points and the values its partial is carried into."""

    partial: dict = attrs.field(factory=dict)
    dims: dict = attrs.field(factory=dict)
    direct: dict = attrs.field(factory=dict)
    carried: dict = attrs.field(factory=dict)
    order: list = attrs.field(factory=list)


def reduce_at_fork(ctx, graph: Graph, inputs: Sequence, keep: frozenset = frozenset()) -> frozenset:
    """The ids of values of ``graph`` (op results) to reduce where they are made.

    ``inputs``: the graph's partitioned inputs (their partials and layouts); ``keep``: output ids
    that may leave partial (run_graph's: a loop's accumulator, never forced). Decided root first: once a fork is reduced its
    descendants are no longer partial, so the pass is repeated until nothing changes."""
    if not any(getattr(p, "partial", None) is not None for p in inputs) and not any(
            ctx.plans[op.id].partial is not None for op in graph.ops if op.id in ctx.plans):
        return frozenset()
    forced: set = set()
    for _ in range(len(graph.ops) + 1):
        flow = _simulate(ctx, graph, inputs, keep, forced)
        new = _roots(flow, _candidates(ctx, flow) - set(keep))
        if not new:
            break
        forced |= new
    return frozenset(forced)


def _simulate(ctx, graph: Graph, inputs: Sequence, keep: frozenset, forced: set) -> _Flow:
    fl = _Flow()
    want: Mapping = ctx.want
    for v, pv in zip(graph.inputs, inputs):
        fl.dims[v.id] = tuple(want.get(v.id, pv.dims))
        fl.partial[v.id] = _left(pv.partial, fl.dims[v.id])
        fl.order.append(v)
    final = {v.id for v in graph.outputs} - set(keep)
    for op in graph.ops:
        plan = ctx.plans.get(op.id)
        if plan is None:
            continue
        args = [_Abstract(fl.partial.get(v.id)) for v in op.inputs]
        modes, carried = carry_modes(op, args)
        kept = []
        for i, (v, m, a) in enumerate(zip(op.inputs, modes, args)):
            if a.partial is None:
                continue
            target = tuple(plan.operands[i]) if i < len(plan.operands) else ()
            if m != KEEP:
                _reduced_at(fl, v.id, a.partial, target)
                continue
            left = _left(a.partial, target)
            if left != a.partial:
                _reduced_at(fl, v.id, a.partial, target)
            kept.append((v.id, left))
        if kept and (len({p for _, p in kept}) != 1 or kept[0][1] is None):
            for vid, left in kept:
                if left is not None:
                    _reduced_at(fl, vid, left, ())
            kept, carried = [], None
        elif kept:
            carried = kept[0][1]
        own = plan.partial
        for v in op.outputs:
            p = own
            if carried is not None:
                axes = set(carried.axes) | set(own.axes if own else ())
                p = Partial(tuple(sorted(axes, key=ctx.fine.names.index)), carried.op)
            dims = tuple(tuple(d) for d in want.get(v.id, ((),) * v.rank))
            fl.dims[v.id] = dims
            fl.order.append(v)
            if p is not None and (v.id in final or v.id in forced):
                _reduced_at(fl, v.id, p, dims)
                p = None
            elif p is not None and _left(p, dims) != p:
                _reduced_at(fl, v.id, p, dims)
                p = _left(p, dims)
            fl.partial[v.id] = p
            if p is not None and carried is not None:
                for vid, _ in kept:
                    fl.carried.setdefault(vid, []).append(v.id)
    for v in graph.outputs:
        if v.id in final and fl.partial.get(v.id) is not None:
            _reduced_at(fl, v.id, fl.partial[v.id], ())
    return fl


def _left(p: Optional[Partial], target: FineDims) -> Optional[Partial]:
    """The partial a reshard to ``target`` keeping partials leaves: the axes ``target`` does not tile."""
    if p is None:
        return None
    tiled = {a for t in target for a in t}
    rest = tuple(a for a in p.axes if a not in tiled)
    return Partial(rest, p.op) if rest else None


def _reduced_at(fl: _Flow, vid: int, p: Partial, target: FineDims) -> None:
    """Value ``vid`` is reduced here: a reduce-scatter where ``target`` tiles all its partial axes."""
    tiled = {a for t in target for a in t}
    kind = tuple(tuple(t) for t in target) if set(p.axes) <= tiled else "ar"
    fl.direct.setdefault(vid, set()).add((vid, kind))


def _points(fl: _Flow) -> dict:
    """Per partial value the distinct reduction points of it and its carried descendants."""
    pts: dict = {}
    for v in reversed(fl.order):
        if fl.partial.get(v.id) is None:
            continue
        s = set(fl.direct.get(v.id, ()))
        for c in fl.carried.get(v.id, ()):
            s |= pts.get(c, set())
        pts[v.id] = s
    return pts


def _candidates(ctx, fl: _Flow) -> set:
    pts = _points(fl)
    sizes = {v.id: v for v in fl.order}
    parents: dict = {}
    for vid, kids in fl.carried.items():
        for c in kids:
            parents.setdefault(c, set()).add(vid)
    out = set()
    for vid, s in pts.items():
        v = sizes[vid]
        if v.producer is None:
            continue
        if len(s) == 1 and _no_gain(ctx, fl, sizes, parents, vid, next(iter(s))):
            out.add(vid)
            continue
        if len(s) < 2:
            continue
        fork = _bytes(ctx, v, fl.dims[vid], fl.partial[vid])
        spread = sum(_bytes(ctx, sizes[p], fl.dims[p], fl.partial.get(p) or fl.partial[vid]) * (1.0 if k == "ar" else 0.5)
                     for p, k in s)
        if fork < spread:
            out.add(vid)
    return out


def _no_gain(ctx, fl: _Flow, sizes: dict, parents: dict, vid: int, point) -> bool:
    """Deferring ``vid``'s one reduction to ``point`` gains nothing: an all-reduce of at least
    ``vid``'s bytes, reached through values no other partial joins (a lone chain of scales,
    negations, converts, transposes: an SGD step's ``p - lr * g``, a weight gradient's
    transpose). Reduced where it is made instead, as XLA's partitioner reduces a dot's partial
    result, the chain runs on the reduced value and fuses with its consumer (deferred, it
    is a pass of its own over the partial before the all-reduce)."""
    pid, kind = point
    if kind != "ar" or pid == vid:
        return False
    todo, seen = [vid], set()
    while todo:
        c = todo.pop()
        for k in fl.carried.get(c, ()):
            if len(parents.get(k, ())) != 1:
                return False
            if k not in seen:
                seen.add(k)
                todo.append(k)
    p = fl.partial[vid]
    return _bytes(ctx, sizes[pid], fl.dims[pid], fl.partial.get(pid) or p) >= _bytes(ctx, sizes[vid], fl.dims[vid], p)


def _roots(fl: _Flow, cands: Iterable[int]) -> set:
    """The candidates no other candidate's partial is carried into (their descendants change
    once they are reduced: the next pass decides those)."""
    cands = set(cands)
    below: set = set()
    for v in fl.order:
        if v.id in cands or v.id in below:
            below.update(fl.carried.get(v.id, ()))
    return {c for c in cands if c not in below}


def _bytes(ctx, v, dims: FineDims, p: Partial) -> float:
    local = ctx.local_shape(v.shape, dims) if dims and len(dims) == len(v.shape) else tuple(v.shape)
    return float(math.prod(local)) * np.dtype(dtypes.accumulation_dtype(p.op, v.dtype)).itemsize
