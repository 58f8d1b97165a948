"""An op's sharding projection: its factor -> mesh axes assignment (Shardy's ShardingProjection).

One memoised function, ``project_key``, turns the shardings of an op's tensors into per-factor axes.
Propagation calls it on every visit of an op (then writes the factors' axes back onto the
tensors); at its end it records the projection of every op, and the partitioner executes
exactly that record: operands are resharded to ``operand_dims``, the local op runs, its
results come out in ``result_dims``, partial over ``partial`` (the axes of its sharded
reduction factors, with their reduce op: one record of partial results, read by the
partitioner's handlers rather than decided by them).

Worked example (rule "[i,k], [k,j] -> [i,j]", k: reduction) on mesh {x:2, y:4}::

    lhs [{x},{y}], rhs [{y},{}], result [{x},{}]
    offers: i <- {x} (lhs, result), k <- {y} (lhs, rhs)
    projection: i: {x}, k: {y}, j: {}   ->   operands [{x},{y}], [{y},{}]; result [{x},{}]
    partial over {y} (sum):  Projection(..., partial=PartialResult(("y",), "sum"))

Offers for one factor merge the same way in both modes: a better (lower) user priority
wins; an offer that extends another (``{x,y}`` extends ``{x}``) wins, since the shorter
holder gets there by a local slice. Conflicting offers at one priority differ by mode:

* ``decide=False`` (propagation): keep their longest common prefix, as Shardy does, so
  that no guess spreads through the program;
* ``decide=True`` (the recorded projection): an op must run in *some* sharding, so the
  axes held by the most data win (sum of the sizes of the tensors that offer them).

Factors are then served in order and never reuse an axis within one data-flow edge (the whole
op, except for loops: ``OpRule.edges``, each carry/constant/xs/ys position its own edge): by priority, then (propagation)
the tensors that carry them and their size, or (decide) the data that agrees on their
axes, so that a contested factor cannot take an axis from an agreed one. Two constraints make every projection executable:

* a factor that shares a dim with other factors gets only axes that divide its size (a
  local reshape needs whole factors), and a factor whose axes a dim cannot show (a more
  major factor of that dim is not fully sharded) gets none;
* ``need_replication`` factors get none (a ``carried`` one does in propagation, so that a
  sort's result keeps its operand's sharding). In decide mode a dim that loses its axes that
  way hands them to an unsharded pass factor of the same tensor that they divide; a carried
  dim's axes may also go to a sharded one (appended) or an uneven one (padded, a row per
  shard at least): sort along a sharded dim: the axes move to another dim by one all-to-all,
  GSPMD paper §3.5, and back by another where the consumer holds the sorted dim sharded.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import attrs

from ..core.mesh import AxisRef, Mesh
from ..ops.rule import NEED_REPLICATION, PASS, REDUCTION, OpRule
from . import axes as ax

Axes = tuple[AxisRef, ...]
FactorAxes = dict[int, Axes]
INF = float("inf")


@attrs.frozen
class TensorState:
    """What an op sees of one of its tensors: per dim its axes and their priority."""

    axes: tuple[Axes, ...]
    prios: tuple[float, ...]
    size: int  # elements, for tie-breaks
    value_id: int


@attrs.frozen
class Offer:
    prio: float
    tensor: int
    axes: Axes
    size: int


@attrs.frozen
class PartialResult:
    """The op's results are partial over ``axes`` (its sharded reduction factors' axes, in
    factor order), to be combined with ``op`` (its first reduction factor's reduce op)."""

    axes: Axes
    op: str


@attrs.frozen
class Projection:
    """The recorded outcome for one op: per-factor axes, the tensors' dims under it, and
    which axes its results are partial over (None: none)."""

    factors: FactorAxes  # factor id -> axes (only factors with axes)
    operand_dims: tuple[tuple[Axes, ...], ...]
    result_dims: tuple[tuple[Axes, ...], ...]
    partial: Optional[PartialResult] = None


def offers(mesh: Mesh, rule: OpRule, tensors: Sequence[TensorState], decide: bool = False
           ) -> dict[int, list[Offer]]:
    """Each tensor dim offers its axes to its factors (distributed over them, major first);
    need_replication factors take none, except carried ones in propagation (not ``decide``)."""
    out: dict[int, list[Offer]] = {}
    for t, (st, dims) in enumerate(zip(tensors, rule.tensors)):
        for d, fs in enumerate(dims):
            if not fs or not st.axes[d]:
                continue
            sizes = [rule.factors[f].size for f in fs]
            for f, axes in zip(fs, ax.distribute(mesh, st.axes[d], sizes)):
                fac = rule.factors[f]
                if axes and (fac.kind != NEED_REPLICATION or (fac.carried and not decide)):
                    out.setdefault(f, []).append(Offer(st.prios[d], t, axes, st.size))
    return out


def merge(mesh: Mesh, cands: list[Offer], decide: bool) -> Optional[tuple[Axes, float, Offer]]:
    """One factor's axes from its offers (see the module docstring)."""
    cands = sorted(cands, key=lambda c: (c.prio, c.tensor))
    best_prio = cands[0].prio
    top = [c for c in cands if c.prio == best_prio]
    # an offer extending another wins; keep the maximal ones
    maximal: list[Offer] = []
    for c in top:
        if any(ax.is_prefix(mesh, c.axes, o.axes) and len(ax.atoms(mesh, o.axes)) > len(ax.atoms(mesh, c.axes))
               for o in top):
            continue
        if any(o.axes == c.axes for o in maximal):
            continue
        maximal.append(c)
    if len(maximal) == 1:
        win = maximal[0]
        for c in cands[len(top):]:  # a lower priority may still extend the winner
            if ax.is_prefix(mesh, win.axes, c.axes) and len(ax.atoms(mesh, c.axes)) > len(ax.atoms(mesh, win.axes)):
                win = attrs.evolve(c, prio=best_prio)
        return win.axes, best_prio, win
    if not decide:
        common = maximal[0].axes
        for c in maximal[1:]:
            common = ax.common_prefix(mesh, common, c.axes)
        return (common, best_prio, maximal[0]) if common else None
    # decide: the axes held by the most data (an offer counts for every maximal offer it prefixes)
    def score(m: Offer) -> int:
        return sum(c.size for c in top if ax.is_prefix(mesh, c.axes, m.axes))

    win = max(maximal, key=lambda m: (score(m), -m.tensor))
    return win.axes, best_prio, win


def project_dim(mesh: Mesh, factor_axes: Sequence[Axes], sizes: Sequence[int]) -> Axes:
    """A dim's axes from its factors' axes: a minor factor counts only if the ones before are full."""
    return ax.project(mesh, factor_axes, sizes)


def project_key(mesh: Mesh, rule: OpRule, key: tuple):
    """(factor axes, (factor, (priority, source tensor index)), per tensor its dims' projected
    axes) as sorted tuples from the tensors' (axes, priorities, size) per tensor (propagation's
    hot loop keeps these keys, not TensorStates), memoised on the rule and the shardings."""
    return _project_cached(mesh, rule, key, False)


@functools.lru_cache(maxsize=1 << 13)  # 8192: a few MiB; the distinct (rule, shardings) of many plans
def _project_cached(mesh: Mesh, rule: OpRule, key: tuple, decide: bool):
    tensors = [TensorState(axes, prios, size, -1) for axes, prios, size in key]
    final, source = _project(mesh, rule, tensors, decide)
    dims = tensor_dims(mesh, rule, final, rule.tensors)
    return tuple(sorted(final.items())), tuple(sorted(source.items())), dims


def _project(mesh: Mesh, rule: OpRule, tensors: Sequence[TensorState], decide: bool):
    chosen: dict[int, tuple[Axes, float, Offer]] = {}
    agree: dict[int, int] = {}
    for f, cands in offers(mesh, rule, tensors, decide).items():
        m = merge(mesh, cands, decide)
        if m is not None and m[0]:
            chosen[f] = m
            agree[f] = sum(c.size for c in cands if c.prio == m[1] and ax.is_prefix(mesh, c.axes, m[0]))

    def order(f: int):
        _, prio, src = chosen[f]
        if decide:  # the factors that the most data agrees on are served first
            return (prio, -agree[f], -len(rule.factor_dims(f)), f)
        return (prio, -len(rule.factor_dims(f)), -src.size, f)

    used: dict[int, list[AxisRef]] = {}  # per data-flow edge (one for most ops; per loop position)
    final: FactorAxes = {}
    source: dict[int, tuple[float, int]] = {}
    for f in sorted(chosen, key=order):
        axes, prio, src = chosen[f]
        taken = used.setdefault(rule.edge(f), [])
        axes = ax.truncate_at_overlap(mesh, axes, taken)
        if axes:
            taken.extend(axes)
            final[f] = axes
            source[f] = (prio, src.tensor)
    _make_executable(mesh, rule, final)
    if decide:
        _rehome(mesh, rule, tensors, final)
    source = {f: s for f, s in source.items() if f in final}
    return final, source


def _make_executable(mesh: Mesh, rule: OpRule, fa: FactorAxes) -> None:
    multi = {f for dims in rule.tensors for fs in dims if len(fs) > 1 for f in fs}
    for f in multi:
        if f in fa:
            fa[f] = _dividing_prefix(mesh, fa[f], rule.factors[f].size)
            if not fa[f]:
                del fa[f]
    changed = True
    while changed:  # drop factors a dim cannot show (a more major factor is not full)
        changed = False
        for dims in rule.tensors:
            for fs in dims:
                full = True
                for f in fs:
                    if not full and f in fa:
                        del fa[f]
                        changed = True
                    if ax.size(fa.get(f, ())) != rule.factors[f].size:
                        full = False


def _dividing_prefix(mesh: Mesh, axes: Axes, n: int) -> Axes:
    out: list[AxisRef] = []
    k = 1
    for a in ax.atoms(mesh, axes):
        if n % (k * a.size):
            break
        out.append(a)
        k *= a.size
    return ax.merge(mesh, out)


def _rehome(mesh: Mesh, rule: OpRule, tensors: Sequence[TensorState], fa: FactorAxes) -> None:
    """Axes of a need-replication dim move to an unsharded pass factor of the same tensor."""
    used: dict[int, list[AxisRef]] = {}
    for f, axes in fa.items():
        used.setdefault(rule.edge(f), []).extend(axes)
    for st, dims in zip(tensors, rule.tensors):
        for d, fs in enumerate(dims):
            if not fs or not st.axes[d] or any(rule.factors[f].kind != NEED_REPLICATION for f in fs):
                continue
            taken = used.setdefault(rule.edge(fs[0]), [])
            moving = ax.truncate_at_overlap(mesh, st.axes[d], taken)
            if not moving:
                continue
            carried = all(rule.factors[f].carried for f in fs)
            k = ax.size(moving)
            for e, gs in enumerate(dims):
                if len(gs) != 1 or e == d:
                    continue
                g = gs[0]
                have = fa.get(g, ())
                n, shards = rule.factors[g].size, ax.size(have) * k
                if rule.factors[g].kind != PASS:
                    continue
                if carried:  # a sort's axes: onto a sharded dim too, uneven padded
                    if n % shards and n < shards:
                        continue
                elif have or n % k:  # others (gather's indexed dims, conv's kernel): an unsharded dim they divide
                    continue
                fa[g] = ax.merge(mesh, list(ax.atoms(mesh, have)) + list(ax.atoms(mesh, moving)))
                taken.extend(moving)
                break


def tensor_dims(mesh: Mesh, rule: OpRule, fa: FactorAxes, dims_list) -> tuple[tuple[Axes, ...], ...]:
    out = []
    for dims in dims_list:
        out.append(tuple(project_dim(mesh, [fa.get(f, ()) for f in fs], [rule.factors[f].size for f in fs])
                         if fs else () for fs in dims))
    return tuple(out)


def record(mesh: Mesh, rule: OpRule, tensors: Sequence[TensorState]) -> Projection:
    """The projection the partitioner executes for one op (decide mode)."""
    return record_key(mesh, rule, tuple((st.axes, st.prios, st.size) for st in tensors))


@functools.lru_cache(maxsize=1 << 16)
def record_key(mesh: Mesh, rule: OpRule, key: tuple) -> Projection:
    """``record`` from the tensors' (axes, priorities, size) per tensor, memoised: a repeated
    layer, and every op of a candidate that a priced one already met, is one lookup (the
    Projection is frozen and shared; nothing writes its ``factors``)."""
    final, _, dims = _project_cached(mesh, rule, key, True)
    n = len(rule.operands)
    factors = dict(final)
    return Projection(factors, dims[:n], dims[n:], partial_result(rule, factors))


def partial_result(rule: OpRule, factors: FactorAxes) -> Optional[PartialResult]:
    """Which axes the results of an op projected as ``factors`` are partial over, and how they combine."""
    red = rule.of_kind(REDUCTION)
    axes = tuple(a for f in red for a in factors.get(f, ()))
    return PartialResult(axes, rule.factors[red[0]].reduce) if axes else None
