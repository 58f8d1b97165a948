"""The exact search's problem: nodes (tied groups of values, tied ops meeting three or more
groups), their choices and costs, and the pairwise blocks between them (ilp_space.py says
what each is; ilp_solve.py solves it).

A node's variables are one-hot over its choices (a group's layouts, an op's strategies); a
block (node a, node b) holds the cost of every pair of choices, summed over the instances of
the block (tied layers: one block for all of them). Latencies of grouped collectives
(tables.py: independent values' collectives of one kind over the same axes are issued as
one) are masks per latency group over the entries that issue one.
"""
from __future__ import annotations

from typing import Optional, Sequence

import attrs
import numpy as np

from ..core.ir import Graph, Op
from ..core.mesh import Mesh
from ..propagation import Propagation
from .ilp_space import (ELEMENTWISE, groups as value_groups, layouts, norm_path, projection, proj_key, rule_of,
                        strategies, tensors_of, tie)
from .tables import CostTables


@attrs.frozen
class Block:
    a: int
    b: int
    cost: np.ndarray  # [choices of a, choices of b] seconds
    masks: tuple  # ((latency group, bool [choices of a, choices of b]), ...)


@attrs.frozen
class Shared:
    """One value's operand reshards, shared by the ops that read it (the partitioner reshards a
    value once per target, whatever reads it: tables.py zeroes the repeats): ``w[l, t]`` is 1
    when the value (group node ``node`` in layout ``l``) is resharded to target ``t`` for some
    reader; ``uses``: (block index, target index per strategy of the block's op node)."""

    node: int
    cost: np.ndarray  # [layouts, targets] seconds (times the tied values that may use each target)
    masks: tuple  # ((latency group, bool [layouts, targets]), ...)
    uses: tuple  # ((block index, int array per strategy), ...)


@attrs.frozen
class Problem:
    """The exact search's problem (see the module docstring)."""

    kinds: tuple[str, ...]  # per node: "group" or "op"
    choices: tuple  # per node: layouts (group) or Projections (op)
    cost: tuple  # per node: seconds per choice
    masks: tuple  # per node: ((latency group, bool per choice), ...)
    memory: tuple  # per node: argument bytes per choice (inputs and outputs held)
    blocks: tuple[Block, ...]
    alpha: np.ndarray  # per latency group: one latency's seconds
    value_node: dict  # value id -> node (top-level values in a group)
    op_node: dict  # op id -> node (ops that are nodes)
    instances: tuple  # per node: how many values' groups / ops it ties
    fixed: dict  # node -> allowed choice indices (the user's fixed values)
    shared: tuple = ()  # Shared per value read by several op nodes

    @property
    def variables(self) -> int:
        return (sum(len(c) for c in self.choices) + sum(int(b.cost.size) for b in self.blocks)
                + sum(int(x.cost.size) for x in self.shared))


def _filter(dims, names: frozenset):
    return tuple(tuple(a for a in d if a.name in names) for d in dims)


class Builder:
    """Builds a ``Problem`` over ``graph``'s top-level ops (see the module docstring).
    ``hand``: the hand plans' propagations (their layouts and projections join the choices);
    ``fixed``: value id -> per dim the axes a user fixed (None: open); ``tied``: (input id,
    output id) pairs a training loop feeds back."""

    def __init__(self, graph: Graph, mesh: Mesh, axes: Sequence[str], tables: CostTables,
                 hand: Sequence[Propagation], fixed: Optional[dict] = None, tied: Sequence[tuple] = (),
                 narrow: bool = False):
        self.graph, self.mesh, self.tables = graph, mesh, tables
        self.names = frozenset(axes)
        self.refs = [mesh.ref(a) for a in sorted(axes, key=mesh.axis_index)]
        self.hand = list(hand)
        self.fixed = dict(fixed or {})
        self.tied = tuple(tied)
        self.narrow = narrow  # layouts and strategies with one sharded dim / factor (and the hand plans')
        self.rmemo: dict = {}
        self._term: dict = {}
        self._lay: dict = {}
        self._strat: dict = {}
        self._mats: dict = {}
        self.late = tables.late

    # -- choices ----------------------------------------------------------------------
    def value_layouts(self, v) -> list:
        key = (v.shape, str(v.dtype))
        got = self._lay.get(key)
        if got is None:
            got = layouts(v.shape, self.refs, narrow=self.narrow)
            seen = set(got)
            for lay in self.hand_layouts.get(v.shape, ()):
                if lay not in seen:
                    seen.add(lay)
                    got.append(lay)
            self._lay[key] = got
        return got

    def op_strategies(self, op: Op, rule) -> list:
        key = (op.id,) if op.regions else (op.prim, rule)
        got = self._strat.get(key)
        if got is None:
            got = [] if op.regions else strategies(rule, self.refs, self.mesh, self.narrow)
            seen = {proj_key(p) for p in got}
            for p in (self.hand_projs.get(op.id, ()) if op.regions else self.hand_by_rule.get(key, ())):
                if proj_key(p) not in seen:
                    seen.add(proj_key(p))
                    got.append(p)
            if not got:
                got = [projection(self.mesh, rule, {})]
            self._strat[key] = got
        return got

    # -- terms ------------------------------------------------------------------------
    def term(self, kind: str, v, lay, proj, i: int) -> tuple:
        """(seconds, latency groups) of one tensor of an op: the operand's reshard from the
        value's layout ``lay`` to what ``proj`` executes, or the result's back (and its partial
        sums' reductions)."""
        late = v.id in self.late
        if kind == "in":
            return self.reshard_in(v, lay, proj.operand_dims[i] if i < len(proj.operand_dims) else None)
        rd = proj.result_dims[i] if i < len(proj.result_dims) else None
        axes = proj.partial.axes if proj.partial is not None else ()
        key = ("out", v.shape, v.dtype.itemsize, rd, axes, lay, late)
        got = self._term.get(key)
        if got is None:
            if rd is None:
                got = (0.0, ())
            else:
                s, g = (0.0, ()) if rd == lay else self._pair(self.tables.reshard_cost(v.shape, v.dtype.itemsize,
                                                                                       rd, lay, late))
                if axes:
                    ps, pg = self._pair(self.tables.partial_cost(v.shape, v.dtype.itemsize, rd, axes, lay, late))
                    s, g = s + ps, tuple(g) + tuple(pg)
                got = (s, tuple(sorted(set(x for x in g if x >= 0))))
            self._term[key] = got
        return got

    def reshard_in(self, v, lay, dst) -> tuple:
        """(seconds, latency groups) of resharding operand ``v`` from ``lay`` to ``dst``."""
        late = v.id in self.late
        key = ("in", v.shape, v.dtype.itemsize, lay, dst, late)
        got = self._term.get(key)
        if got is None:
            got = (0.0, ()) if dst is None or dst == lay else \
                self._pair(self.tables.reshard_cost(v.shape, v.dtype.itemsize, lay, dst, late))
            self._term[key] = got
        return got

    @staticmethod
    def _pair(c) -> tuple:
        return float(c[0]), tuple(x for x in c[2] if x >= 0)

    def compute(self, op: Op, rule, proj) -> float:
        if op.regions:
            got = self.region_cost.get((op.id, proj_key(proj)))
            return float(got) if got is not None else 0.0
        return float(self.tables.op_cost(op, rule, proj)[0])

    def _elementwise_cost(self, op: Op, rule, lay) -> float:
        """An op merged into its group: its compute under the group's layout (factors read
        off its result's dims)."""
        fa: dict = {}
        for d, fs in enumerate(rule.results[0] if rule.results else ()):
            if len(fs) == 1 and lay[d]:
                fa[fs[0]] = lay[d]
        return float(self.tables.op_cost(op, rule, projection(self.mesh, rule, fa))[0])

    # -- the hand plans ---------------------------------------------------------------
    def _read_hand(self, top_values, top_ops) -> list[dict]:
        self.hand_layouts: dict = {}
        self.hand_projs: dict = {}
        self.hand_by_rule: dict = {}
        self.region_cost: dict = {}
        dims_per_plan = []
        for prop in self.hand:
            dims = {}
            for v in top_values:
                lay = _filter(prop.dims_of(v), self.names)
                dims[v.id] = lay
                self.hand_layouts.setdefault(v.shape, [])
                if lay not in self.hand_layouts[v.shape]:
                    self.hand_layouts[v.shape].append(lay)
            dims_per_plan.append(dims)
            for op in top_ops:
                p = prop.projections.get(op.id)
                if p is None:
                    continue
                lst = self.hand_projs.setdefault(op.id, [])
                if all(proj_key(q) != proj_key(p) for q in lst):
                    lst.append(p)
                    if op.regions:
                        inside = {o.id for sub in op.regions for o in sub.walk()}
                        self.region_cost[(op.id, proj_key(p))] = self.tables.region_seconds(prop, inside)
                if not op.regions:
                    lst2 = self.hand_by_rule.setdefault((op.prim, rule_of(op, self.rmemo)), [])
                    if all(proj_key(q) != proj_key(p) for q in lst2):
                        lst2.append(p)
        return dims_per_plan

    # -- the problem ------------------------------------------------------------------
    def build(self) -> Problem:
        g = self.graph
        top_values = [v for v in g.inputs if not v.is_const] + [v for op in g.ops for v in op.outputs]
        vals = {v.id: v for v in top_values}
        hand_dims = self._read_hand(top_values, g.ops)
        uf = value_groups(g, hand_dims, self.tied)
        inputs = {v.id: i for i, v in enumerate(g.inputs)}
        outputs = {v.id for v in g.outputs}
        members: dict = {}
        for v in top_values:
            members.setdefault(uf.find(v.id), []).append(v)
        merged, node_ops = [], []
        for op in g.ops:
            roots = {uf.find(v.id) for _, _, v in tensors_of(op)}
            if op.prim in ELEMENTWISE and not op.regions and len(roots) <= 1 and op.outputs:
                merged.append(op)
            else:
                node_ops.append(op)
        # labels for tying
        lab0: dict = {}
        nbrs: dict = {}
        for r, vs in members.items():
            rep = vs[0]
            lab0[("g", r)] = (rep.shape, str(rep.dtype),
                              tuple(sorted(norm_path(v.name or "") for v in vs if v.id in inputs)),
                              tuple(sorted(v.producer.prim if v.producer is not None else "" for v in vs)),
                              tuple(h.get(rep.id) for h in hand_dims), rep.id in self.late,
                              sum(v.id in outputs for v in vs),
                              tuple(sorted(str(self.fixed[v.id]) for v in vs if v.id in self.fixed)))
        for op in node_ops:
            rule = rule_of(op, self.rmemo)
            lab0[("o", op.id)] = (op.prim, rule, op.id if op.regions else -1,
                                  tuple(proj_key(h.projections[op.id]) if op.id in h.projections else None
                                        for h in self.hand))
            nb = []
            for kind, i, v in tensors_of(op):
                r = uf.find(v.id)
                nb.append(((kind, i), ("g", r)))
                nbrs.setdefault(("g", r), []).append(("*", ("o", op.id)))
            nbrs[("o", op.id)] = nb
        cls = tie(lab0, nbrs)
        return self._assemble(cls, members, merged, node_ops, uf, inputs, outputs, vals)

    def _assemble(self, cls, members, merged, node_ops, uf, inputs, outputs, vals) -> Problem:
        node_of: dict = {}  # class label -> node
        kinds, choices, cost, masks, memory, count = [], [], [], [], [], []

        def node(ent, kind, ch) -> int:
            c = (kind, cls[ent])
            n = node_of.get(c)
            if n is None:
                n = node_of[c] = len(kinds)
                kinds.append(kind)
                choices.append(ch)
                cost.append(np.zeros(len(ch)))
                masks.append({})
                memory.append(np.zeros(len(ch)))
                count.append(0)
            count[n] += 1
            return n

        value_node: dict = {}
        gnode: dict = {}
        fixed_nodes: dict = {}
        for r, vs in members.items():
            lays = self.value_layouts(vs[0])
            n = gnode[r] = node(("g", r), "group", lays)
            for v in vs:
                value_node[v.id] = n
                if v.id in inputs or v.id in outputs:
                    k = (v.id in inputs) + (v.id in outputs)
                    memory[n] += k * np.array([self._local_bytes(v, lay) for lay in lays])
                if v.id in self.fixed:
                    want = self.fixed[v.id]
                    ok = {j for j, lay in enumerate(lays) if all(w is None or tuple(lay[d]) == tuple(
                        a for a in w if a.name in self.names) for d, w in enumerate(want))}
                    fixed_nodes[n] = fixed_nodes.get(n, ok) & ok
        for op in merged:
            rule = rule_of(op, self.rmemo)
            roots = {uf.find(v.id) for _, _, v in tensors_of(op)}
            if not roots:
                continue
            n = gnode[roots.pop()]
            cost[n] += np.array([self._elementwise_memo(op, rule, lay) for lay in choices[n]])
        blocks: dict = {}
        op_node: dict = {}

        def add_block(a, b, mat, bmasks) -> None:
            if a == b:
                cost[a] += np.diag(mat)
                for gi, m in bmasks:
                    masks[a][gi] = masks[a].get(gi, np.zeros(len(choices[a]), bool)) | np.diag(m)
                return
            if a > b:
                a, b, mat = b, a, mat.T
                bmasks = [(gi, m.T) for gi, m in bmasks]
            cur = blocks.get((a, b))
            if cur is None:
                blocks[(a, b)] = [mat.copy(), {gi: m.copy() for gi, m in bmasks}]
            else:
                cur[0] += mat
                for gi, m in bmasks:
                    cur[1][gi] = cur[1].get(gi, np.zeros(mat.shape, bool)) | m

        reads: dict = {}  # value id -> operand reads by op nodes (ops meeting 3+ groups)
        for op in node_ops:
            if len({uf.find(v.id) for _, _, v in tensors_of(op)}) >= 3:
                for kind, _, v in tensors_of(op):
                    if kind == "in":
                        reads[v.id] = reads.get(v.id, 0) + 1
        shared: dict = {}  # (group node, shape, itemsize, late) -> [value, targets {dst: index}, counts, uses]
        for op in node_ops:
            rule = rule_of(op, self.rmemo)
            strat = self.op_strategies(op, rule)
            by_root: dict = {}
            for kind, i, v in tensors_of(op):
                by_root.setdefault(uf.find(v.id), []).append((kind, i, v))
            roots = list(by_root)
            comp = np.array([self.compute(op, rule, p) for p in strat])
            mats = [self._tensor_matrix(by_root[r], choices[gnode[r]], strat) for r in roots]
            # an op meeting 3+ groups is a node; so is one whose strategies issue grouped collectives
            # (their one latency per group is the u's: minimised out, it would be guessed)
            if len(roots) >= 3 or any(mm for _, mm in mats):
                n = node(("o", op.id), "op", strat)
                op_node[op.id] = n
                cost[n] += comp
                for r in roots:
                    mine = [t for t in by_root[r] if not (t[0] == "in" and reads.get(t[2].id, 0) >= 2)]
                    mat, mm = self._tensor_matrix(mine, choices[gnode[r]], strat)
                    add_block(gnode[r], n, mat, list(mm.items()))
                    for _, i, v in (t for t in by_root[r] if t not in mine):
                        sh = shared.setdefault((gnode[r], v.shape, v.dtype.itemsize, v.id in self.late),
                                               [v, {}, {}, set()])
                        tid = tuple(sh[1].setdefault(p.operand_dims[i] if i < len(p.operand_dims) else None,
                                                     len(sh[1])) for p in strat)
                        for t in set(tid):
                            sh[2].setdefault(t, set()).add(v.id)
                        sh[3].add((gnode[r], n, tid))
                continue
            if len(roots) == 2:  # an edge: the op's strategy minimised out
                tot = mats[0][0][:, None, :] + mats[1][0][None, :, :] + comp[None, None, :]
                add_block(gnode[roots[0]], gnode[roots[1]], tot.min(axis=2), [])
            elif len(roots) == 1:
                cost[gnode[roots[0]]] += (mats[0][0] + comp[None, :]).min(axis=1)
        order = sorted(blocks)
        out_blocks = tuple(Block(a, b, blocks[(a, b)][0], tuple(sorted(blocks[(a, b)][1].items()))) for a, b in order)
        out_shared = self._shared(shared, choices, {k: i for i, k in enumerate(order)})
        return Problem(tuple(kinds), tuple(choices), tuple(cost), tuple(tuple(sorted(m.items())) for m in masks),
                       tuple(memory), out_blocks, np.asarray(self.tables.alpha, np.float64), value_node, op_node,
                       tuple(count), {n: tuple(sorted(ok)) for n, ok in fixed_nodes.items()}, out_shared)

    def _shared(self, shared: dict, choices, block_index: dict) -> tuple:
        out = []
        for (g, _, _, _), (v, targets, counts, uses) in shared.items():
            lays = choices[g]
            cost = np.zeros((len(lays), len(targets)))
            mm: dict = {}
            for dst, t in targets.items():
                k = len(counts.get(t, ()))
                for li, lay in enumerate(lays):
                    sec, gs = self.reshard_in(v, lay, dst)
                    cost[li, t] = sec * k
                    for gi in gs:
                        mm.setdefault(gi, np.zeros(cost.shape, bool))[li, t] = True
            u = tuple((block_index[(a, b)], np.asarray(tid, np.int64)) for a, b, tid in sorted(uses))
            out.append(Shared(g, cost, tuple(sorted(mm.items())), u))
        return tuple(out)

    def _elementwise_memo(self, op, rule, lay) -> float:
        key = ("ew", op.prim, rule, str(op.outputs[0].dtype), lay)
        got = self._term.get(key)
        if got is None:
            got = self._term[key] = self._elementwise_cost(op, rule, lay)
        return got

    def _tensor_matrix(self, tensors, lays, strat) -> tuple:
        """[layouts, strategies] seconds of ``tensors`` (one group's, of one op), and the
        latency-group masks."""
        key = (tuple((k, i, v.shape, str(v.dtype), v.id in self.late) for k, i, v in tensors), id(lays), id(strat))
        got = self._mats.get(key)
        if got is not None:
            return got
        mat = np.zeros((len(lays), len(strat)))
        mm: dict = {}
        for li, lay in enumerate(lays):
            for si, p in enumerate(strat):
                for kind, i, v in tensors:
                    s, gs = self.term(kind, v, lay, p, i)
                    mat[li, si] += s
                    for gi in gs:
                        if gi not in mm:
                            mm[gi] = np.zeros(mat.shape, bool)
                        mm[gi][li, si] = True
        got = self._mats[key] = (mat, mm)
        return got

    @staticmethod
    def _local_bytes(v, lay) -> float:
        n = v.dtype.itemsize
        for s, d in zip(v.shape, lay):
            k = 1
            for a in d:
                k *= a.size
            n *= -(-s // k)
        return float(n)

