"""Sharding completion: GSPMD's priority-based propagation over the ops' factor rules.

Layers, as in GSPMD and Shardy, over one fixed-point engine:

* user priority: annotations of priority 0 propagate to a fixed point first, then
  priority 1 fills what is still open, and so on; annotated values never change;
* op priority (aggressiveness): level 0 moves shardings through elementwise-like ops
  only; level 1 adds dot/conv; level 2 every other op (reshape, reduce, slice...) and
  broadcast backwards; level 3 broadcast forwards. Whenever a higher level changes
  something the engine drops back to level 0, so cheap pass-through ops always speak
  first;
* per op: each tensor dim offers its axes to the op's factors; per factor the offers
  merge (an offer that extends another wins; at equal priority a conflict keeps the
  longest common prefix, Shardy's rule; a better user priority wins outright); factors
  are then served batch-first and larger-tensor-first so an axis is never used twice;
  finally each tensor dim takes its factors' axes if they extend what it has.

Worked example (REFERENCE 13): add(a `[{},{y}]`, b `[{x},{}]`) -> factor i: {x},
factor j: {y} -> result `[{x},{y}]`.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import attrs

from ..ir import Graph, Op, Value
from ..mesh import AxisRef, Mesh
from ..ops import rule_for
from ..ops.rule import BROADCAST, NEED_REPLICATION, OpRule
from . import axes as ax

INF = math.inf


@attrs.define
class DimState:
    axes: tuple[AxisRef, ...] = ()
    prio: float = INF
    closed: bool = False
    why: Optional[tuple[int, int]] = None  # (op id, source value id) that set it


@attrs.define
class Seed:
    """A user constraint on a value: its spec per dim (None = open), priority, origin text."""

    value: Value
    dims: tuple[Optional[tuple[AxisRef, ...]], ...]
    priority: int
    origin: str


class Propagation:
    def __init__(self, graph: Graph, mesh: Mesh, seeds: Sequence[Seed]):
        self.graph, self.mesh, self.seeds = graph, mesh, list(seeds)
        values = graph.all_values()
        self.state: dict[int, list[DimState]] = {v.id: [DimState() for _ in v.shape] for v in values}
        self.values: dict[int, Value] = {v.id: v for v in values}
        self.ops = list(graph.walk())
        self.rules: dict[int, OpRule] = {op.id: rule_for(op) for op in self.ops}
        for link, rule in region_links(graph):
            self.ops.append(link)
            self.rules[link.id] = rule
        self.origin: dict[int, str] = {}
        self.op_by_id = {op.id: op for op in self.ops}

    # -- driver -------------------------------------------------------------
    def run(self) -> "Propagation":
        for p in sorted({s.priority for s in self.seeds} | {0}):
            for s in self.seeds:
                if s.priority == p:
                    self._seed(s)
            level = 0
            while level <= BROADCAST:
                changed = self._fixed_point(level)
                level = 0 if (changed and level > 0) else level + 1
        return self

    def _seed(self, s: Seed) -> None:
        st = self.state[s.value.id]
        for d, axes in enumerate(s.dims):
            if axes is None:
                continue
            st[d] = DimState(tuple(axes), s.priority, True, None)
        self.origin[s.value.id] = s.origin

    def _fixed_point(self, level: int) -> bool:
        any_change = False
        while True:
            changed = False
            for op in self.ops:
                changed |= self._apply(op, level)
            for op in reversed(self.ops):
                changed |= self._apply(op, level)
            any_change |= changed
            if not changed:
                return any_change

    # -- one op -------------------------------------------------------------
    def _apply(self, op: Op, level: int) -> bool:
        rule = self.rules[op.id]
        if rule.level > level:
            return False
        forward = rule.forward_level is None or level >= rule.forward_level
        tensors = list(op.inputs) + list(op.outputs)
        n_in = len(op.inputs)
        mesh = self.mesh
        # 1. offers per factor
        offers: dict[int, list[tuple[float, int, tuple[AxisRef, ...], int]]] = {}
        for t, (v, dims) in enumerate(zip(tensors, rule.tensors)):
            st = self.state[v.id]
            for d, fs in enumerate(dims):
                if not fs or not st[d].axes:
                    continue
                sizes = [rule.factors[f].size for f in fs]
                for f, axes in zip(fs, ax.distribute(mesh, st[d].axes, sizes)):
                    if axes and rule.factors[f].kind != NEED_REPLICATION:
                        offers.setdefault(f, []).append((st[d].prio, t, axes, v.id))
        if not offers:
            return False
        # 2. merge offers per factor
        chosen: dict[int, tuple[tuple[AxisRef, ...], float, int, int]] = {}
        for f, cands in offers.items():
            cands.sort(key=lambda c: (c[0], c[1]))
            best_axes, best_prio, src_t, src_v = cands[0][2], cands[0][0], cands[0][1], cands[0][3]
            for prio, t, axes, vid in cands[1:]:
                if ax.is_prefix(mesh, best_axes, axes):
                    if len(ax.atoms(mesh, axes)) > len(ax.atoms(mesh, best_axes)):
                        best_axes, src_t, src_v = axes, t, vid
                elif ax.is_prefix(mesh, axes, best_axes):
                    continue
                elif prio == best_prio:
                    best_axes = ax.common_prefix(mesh, best_axes, axes)
            if best_axes:
                chosen[f] = (best_axes, best_prio, src_t, src_v)
        # 3. serve factors in order, never reusing an axis
        def order(f: int):
            axes, prio, t, _ = chosen[f]
            n_tensors = len(rule.factor_dims(f))
            return (prio, -n_tensors, -tensors[t].size, f)

        used: list[AxisRef] = []
        final: dict[int, tuple[tuple[AxisRef, ...], float, int]] = {}
        for f in sorted(chosen, key=order):
            axes, prio, _, vid = chosen[f]
            axes = ax.truncate_at_overlap(mesh, axes, used)
            if axes:
                used.extend(axes)
                final[f] = (axes, prio, vid)
        # 4. project back onto tensors
        changed = False
        for t, (v, dims) in enumerate(zip(tensors, rule.tensors)):
            if t >= n_in and not forward:
                continue
            st = self.state[v.id]
            for d, fs in enumerate(dims):
                if not fs or st[d].closed:
                    continue
                if any(rule.factors[f].kind == NEED_REPLICATION for f in fs[:1]):
                    continue
                sizes = [rule.factors[f].size for f in fs]
                new = ax.project(mesh, [final[f][0] if f in final else () for f in fs], sizes)
                if not new or not ax.is_prefix(mesh, st[d].axes, new) or len(ax.atoms(mesh, new)) <= len(
                        ax.atoms(mesh, st[d].axes)):
                    continue
                others = [a for e, s in enumerate(st) if e != d for a in s.axes]
                new = ax.truncate_at_overlap(mesh, new, others)
                if len(ax.atoms(mesh, new)) <= len(ax.atoms(mesh, st[d].axes)) or not ax.is_prefix(mesh, st[d].axes, new):
                    continue
                srcs = [final[f] for f in fs if f in final]
                src = next((x for x in srcs if x[2] != v.id), srcs[0])
                st[d] = DimState(new, min(src[1], st[d].prio) if st[d].axes else src[1], False, (op.id, src[2]))
                changed = True
        return changed

    # -- results ------------------------------------------------------------
    def dims_of(self, v: Value) -> tuple[tuple[AxisRef, ...], ...]:
        st = self.state.get(v.id)
        return tuple(s.axes for s in st) if st else ((),) * v.rank

    def explain(self, v: Value, name: str) -> str:
        from ..sharding import Sharding

        lines = [f"{name}: {v.type_str} sharded {Sharding.of(self.mesh, self.dims_of(v)).shardy()}"]
        st = self.state.get(v.id)
        if st is None:
            return lines[0]
        for d, s in enumerate(st):
            if not s.axes:
                why = "closed by an annotation" if s.closed else "no sharding reached it"
                lines.append(f"  dim {d}: replicated ({why})")
                continue
            lines.append(f"  dim {d}: {{{','.join(str(a) for a in s.axes)}}}")
            cur, dim_state, seen = v, s, set()
            while dim_state.why is not None and cur.id not in seen:
                seen.add(cur.id)
                op_id, src_id = dim_state.why
                op = self.op_by_id[op_id]
                src = self.values[src_id]
                lines.append(f"    <- {op.prim} (op {op_id}{', ' + op.source if op.source else ''}) from %{src.id} "
                             f"{src.type_str} {Sharding.of(self.mesh, self.dims_of(src)).shardy()}")
                cur = src
                # follow the first dim of the source that has a provenance
                nxt = [x for x in self.state[src.id] if x.axes]
                dim_state = next((x for x in nxt if x.why is not None), nxt[0] if nxt else DimState())
            origin = self.origin.get(cur.id)
            if origin:
                lines.append(f"    <- {origin}")
        return "\n".join(lines)


def region_links(graph: Graph) -> list[tuple[Op, OpRule]]:
    """Pseudo-ops tying region values to the region op's operands and results.

    scan: const i ~ body param i; carry i: operand ~ body param ~ body result ~ result;
    xs[T, ...] ~ body param [...] and ys[T, ...] ~ body result [...] (T stays whole).
    while: carries across cond and body params, body results and results. cond: each
    branch's params ~ the operands, its results ~ the op's results.
    """
    from ..ops.rule import ELEMENTWISE, RuleBuilder

    links: list[tuple[Op, OpRule]] = []

    def link(members: list[tuple[Value, int]]) -> None:
        """members: (value, lead) - a value whose first ``lead`` dims are loop dims."""
        ref = next(v for v, lead in members if lead == 0) if any(l == 0 for _, l in members) else members[0][0]
        ref_lead = next(l for v, l in members if v is ref)
        shape = ref.shape[ref_lead:]
        b = RuleBuilder()
        fs = b.factors(shape)
        for v, lead in members:
            loop = [b.factor(v.shape[d], NEED_REPLICATION) for d in range(lead)]
            b.operand(loop + fs)
        op = Op(-(len(links) + 1) - 10**9, "region_link", [v for v, _ in members], [], {})
        links.append((op, b.build(ELEMENTWISE)))

    for op in graph.walk():
        if op.prim == "scan":
            body = op.regions[0]
            nc, ncar = op.params["num_consts"], op.params["num_carry"]
            for i in range(nc):
                link([(op.inputs[i], 0), (body.inputs[i], 0)])
            for i in range(ncar):
                link([(op.inputs[nc + i], 0), (body.inputs[nc + i], 0), (body.outputs[i], 0), (op.outputs[i], 0)])
            for j, v in enumerate(body.inputs[nc + ncar:]):
                link([(v, 0), (op.inputs[nc + ncar + j], 1)])
            for j, v in enumerate(body.outputs[ncar:]):
                link([(v, 0), (op.outputs[ncar + j], 1)])
        elif op.prim == "while":
            cond, body = op.regions
            cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
            for i in range(cn):
                link([(op.inputs[i], 0), (cond.inputs[i], 0)])
            for i in range(bn):
                link([(op.inputs[cn + i], 0), (body.inputs[i], 0)])
            for i in range(len(op.outputs)):
                link([(op.inputs[cn + bn + i], 0), (cond.inputs[cn + i], 0), (body.inputs[bn + i], 0),
                      (body.outputs[i], 0), (op.outputs[i], 0)])
        elif op.prim == "cond":
            for br in op.regions:
                for i, v in enumerate(br.inputs):
                    link([(op.inputs[1 + i], 0), (v, 0)])
                for i, v in enumerate(br.outputs):
                    link([(op.outputs[i], 0), (v, 0)])
    return links
