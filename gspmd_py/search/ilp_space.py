"""The exact search's space (issue 37): per-value layouts and per-op strategies, as Alpa's and
XLA auto-sharding's ILP poses it, priced term by term by the cost tables (tables.py).

* a *layout* of a value: per dim the searched mesh axes on it (mesh order), every axis on at
  most one dim, each split one ``context.fair_split`` allows (uneven ones padded); the layouts
  the hand plans' propagations give values of that shape are added, so that every hand plan
  is a point of the space (``layouts``);
* a *strategy* of an op: its rule's factors given mesh axes (``strategies``: each axis on one
  shardable factor or none; a factor sharing a dim with others only where the dim can show
  it), plus the projections the hand plans' propagations record for ops of that signature;
  region ops (scan, while, cond) have only those, each priced with its body's terms;
* values joined by elementwise ops at one shape are one *group* (one layout: a chain fused
  into one node, as Alpa merges elementwise chains) where every hand plan agrees they share a
  layout; ops whose tensors meet two groups become edges (their strategy minimised out), ops
  meeting three or more are nodes of their own;
* repeated structure (unrolled layers) is *tied*: groups and ops whose labels agree after
  ``TIE_ROUNDS`` rounds of Weisfeiler-Lehman refinement (shape, rule, input path with the
  layer numbers taken out, the hand plans' choices; then the neighbours' labels) share one
  set of variables (``tie``).

Costs are the tables' own (``CostTables.op_cost``, ``reshard_cost``, ``partial_cost``): per
op the local compute of the strategy, per operand the reshard from the value's layout to
what the strategy executes, per result the reshard and partial-sum reductions back to the
value's layout. Collective latencies of independent (late) values are grouped as the tables
group them (``groups``: one latency per (kind, axes) used).
"""
from __future__ import annotations

import itertools
import re
from typing import Optional, Sequence


from ..core.ir import Graph, Op, Value
from ..core.mesh import AxisRef, Mesh
from ..ops import rule_for
from ..ops.rule import SHARDABLE, OpRule
from ..propagation.projection import Projection, partial_result, tensor_dims
from .context import fair_split
from .points import ELEMENTWISE

MAX_LAYOUTS = 40  # layouts enumerated per value (fewest sharded dims first past this)
MAX_STRATEGIES = 64  # strategies enumerated per op
TIE_ROUNDS = 3
Layout = tuple  # per dim: tuple of AxisRef


def _prod(xs) -> int:
    k = 1
    for x in xs:
        k *= x
    return k


def layouts(shape: Sequence[int], refs: Sequence[AxisRef], uneven: bool = True, narrow: bool = False) -> list[Layout]:
    """Every layout of ``shape`` over the axes ``refs`` (mesh order) that ``fair_split`` allows
    (``narrow``: those with at most one sharded dim: the hand plans add their others)."""
    rank = len(shape)
    none = ((),) * rank
    if rank == 0 or _prod(shape) <= 1:
        return [none]
    out = []
    for choice in itertools.product(range(rank + 1), repeat=len(refs)):
        dims: list[list[AxisRef]] = [[] for _ in range(rank)]
        for a, c in zip(refs, choice):
            if c < rank:
                dims[c].append(a)
        if narrow and sum(1 for d in dims if d) > 1:
            continue
        if all(not d or fair_split(shape[i], _prod(a.size for a in d), even=not uneven) for i, d in enumerate(dims)):
            out.append(tuple(tuple(d) for d in dims))
    if len(out) > MAX_LAYOUTS:
        out.sort(key=lambda lay: sum(1 for d in lay if d))  # stable: fewest sharded dims first
        out = out[:MAX_LAYOUTS]
    return out


def strategies(rule: OpRule, refs: Sequence[AxisRef], mesh: Mesh, narrow: bool = False) -> list[Projection]:
    """Each searched axis on one shardable factor of ``rule`` or none (see the module docstring;
    ``narrow``: at most one factor sharded, the hand plans add their others)."""
    multi = {f for dims in rule.tensors for fs in dims if len(fs) > 1 for f in fs}
    used = {f for dims in rule.tensors for fs in dims for f in fs}
    cands = [f for f, fac in enumerate(rule.factors) if fac.kind in SHARDABLE and fac.size > 1 and f in used
             and (f not in multi or all(fs[0] == f for dims in rule.tensors for fs in dims if f in fs))]
    out, seen = [], set()
    for choice in itertools.product(range(len(cands) + 1), repeat=len(refs)):
        fa: dict = {}
        for a, c in zip(refs, choice):
            if c < len(cands):
                fa.setdefault(cands[c], []).append(a)
        ok = True
        for f, axes in fa.items():
            k, n = _prod(a.size for a in axes), rule.factors[f].size
            if (f in multi and n % k) or not fair_split(n, k, even=False):
                ok = False
                break
        if not ok or (narrow and len(fa) > 1):
            continue
        fa = {f: tuple(v) for f, v in sorted(fa.items())}
        key = tuple(fa.items())
        if key in seen:
            continue
        seen.add(key)
        out.append(projection(mesh, rule, fa))
        if len(out) == MAX_STRATEGIES:
            break
    return out


def projection(mesh: Mesh, rule: OpRule, fa: dict) -> Projection:
    dims = tensor_dims(mesh, rule, fa, rule.tensors)
    n = len(rule.operands)
    return Projection(dict(fa), dims[:n], dims[n:], partial_result(rule, fa))


def proj_key(p: Projection) -> tuple:
    return tuple(sorted(p.factors.items()))


class UnionFind:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        p = self.parent.setdefault(x, x)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[x] = p
        return p

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)  # the smallest id roots its group: deterministic


def tensors_of(op: Op) -> list[tuple[str, int, Value]]:
    """("in"/"out", position, value) of the op's tensors a layout can shard (no constants, no scalars)."""
    out = [("in", i, v) for i, v in enumerate(op.inputs) if not v.is_const and v.rank > 0 and v.size > 1]
    return out + [("out", i, v) for i, v in enumerate(op.outputs) if v.rank > 0 and v.size > 1]


def groups(graph: Graph, hand_dims: Sequence[dict], tied_pairs: Sequence[tuple[int, int]] = ()) -> UnionFind:
    """Values joined by elementwise ops at one shape (and ``tied_pairs``: a training step's
    returned state and its input), where every hand plan's dims (``hand_dims``: value id ->
    layout per plan) agree."""
    uf = UnionFind()
    agree = lambda a, b: all(h.get(a.id) == h.get(b.id) for h in hand_dims)  # noqa: E731
    for op in graph.ops:
        if op.prim not in ELEMENTWISE or op.regions or not op.outputs:
            continue
        out = op.outputs[0]
        for v in op.inputs:
            if not v.is_const and v.shape == out.shape and v.rank > 0 and agree(v, out):
                uf.union(v.id, out.id)
    for a, b in tied_pairs:
        uf.union(a, b)
    return uf


def tie(labels0: dict, nbrs: dict, rounds: int = TIE_ROUNDS) -> dict:
    """Weisfeiler-Lehman refinement: entity -> class number. ``labels0``: entity -> hashable
    first label; ``nbrs``: entity -> tuple of (role, entity), ordered where order matters
    (an op's operands), or a sorted-by-label multiset otherwise (a group's users: ``"*"`` roles)."""
    intern: dict = {}
    lab = {e: intern.setdefault(l0, len(intern)) for e, l0 in labels0.items()}
    for _ in range(rounds):
        intern = {}
        new = {}
        for e in labels0:
            ordered = tuple((r, lab[x]) for r, x in nbrs.get(e, ()) if r != "*")
            bag = tuple(sorted(lab[x] for r, x in nbrs.get(e, ()) if r == "*"))
            new[e] = intern.setdefault((lab[e], ordered, bag), len(intern))
        if len(set(new.values())) == len(set(lab.values())):
            lab = new
            break
        lab = new
    return lab


def norm_path(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def rule_of(op: Op, memo: Optional[dict] = None) -> OpRule:
    return rule_for(op, memo)

