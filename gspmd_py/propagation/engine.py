"""Sharding completion: GSPMD's priority-based propagation over the ops' factor rules.

Layers, as in GSPMD and Shardy, over one worklist engine:

* user priority: annotations of priority 0 propagate to a fixed point first, then
  priority 1 fills what is still open, and so on; annotated values never change;
* op priority (aggressiveness): level 0 moves shardings through elementwise-like ops
  only; level 1 adds dot/conv; level 2 every other op (reshape, reduce, slice...) and
  broadcast backwards; level 3 broadcast forwards. Whenever a higher level changes
  something the engine drops back to level 0, so cheap pass-through ops always speak
  first;
* per op (``projection.project_key``): each tensor dim offers its axes to the op's
  factors, the offers merge, the factors take axes; each tensor dim then takes its
  factors' axes if they extend what it has.

Only ops next to a value whose sharding changed are visited again (a worklist swept in
program order, then in reverse, as Shardy's), so planning is linear in program size.
At the end every op's projection is recorded (``Propagation.projections``): the
partitioner executes it and the cost model prices it.

Worked example (XLA's sharding_propagation_test, partial shardings merge): add(a `[{},{y}]`, b `[{x},{}]`) -> factor i:
{x}, factor j: {y} -> result `[{x},{y}]`.
"""
from __future__ import annotations

import heapq
from typing import Optional, Sequence

import attrs

from ..core.ir import Graph, Op, Value, user_name
from ..core.mesh import AxisRef, Mesh
from ..ops import rule_for
from ..ops.control import region_values
from ..ops.rule import BROADCAST, NEED_REPLICATION, OpRule
from . import axes as ax
from .projection import INF, Projection, project_key, record_key


@attrs.frozen
class DimState:
    """One dim of one value during propagation; replaced, never changed in place (so every
    open dim of a fresh run shares ``OPEN``)."""

    axes: tuple[AxisRef, ...] = ()
    prio: float = INF
    closed: bool = False
    why: Optional[tuple[int, int]] = None  # (op id, source value id) that set it


OPEN = DimState()
_UNSEEN = object()  # a memo miss (None is a memoised answer)


@attrs.define
class Seed:
    """A user constraint on a value: its spec per dim (None = open), priority, origin text."""

    value: Value
    dims: tuple[Optional[tuple[AxisRef, ...]], ...]
    priority: int
    origin: str


def op_tensors(op: Op) -> list[Value]:
    """The values an op's rule covers: operands, results, then region boundary values."""
    return list(op.inputs) + list(op.outputs) + region_values(op)


class _Memo:
    """Per graph (shared by every Propagation ``with_seeds`` / ``extend`` makes): each distinct
    tensor key (axes per dim, priority per dim, size) interned as a small int, and the pure
    functions of (rule, keys) propagation asks at every visit memoised on (rule number, ints):
    a dictionary lookup of a short int tuple instead of hashing the nested shardings."""

    def __init__(self, ops: Sequence[Op], rules: dict):
        self._ids: dict[tuple, int] = {}
        self.keys: list[tuple] = []  # int -> key
        numbers: dict[int, int] = {}  # id(rule) -> its number (the rules dict keeps them alive)
        self.rule_no = {op.id: numbers.setdefault(id(rules[op.id]), len(numbers)) for op in ops}
        self._project: dict[tuple, Optional[tuple]] = {}
        self.recorded: dict[tuple, Projection] = {}  # (rule number, keys) -> ``record``'s answer
        # (op signature, keys, forward) -> what a visit writes (``Propagation._plan``), and
        # op index -> its signature: rule number and which of its tensors are the same value
        self.applied: dict[tuple, tuple] = {}
        # (op index, id of an ``applied`` plan) -> that plan bound to the op's values (``_bind``)
        self.bound: dict[tuple[int, int], tuple] = {}
        sig_ids: dict[tuple, int] = {}
        self.op_sig: list[int] = []
        self.tensor_ids: list[tuple] = [tuple(v.id for v in op_tensors(op)) for op in ops]  # per op index
        # per op index: its rule's level and forward level (the sweep's filters)
        self.level = [rules[op.id].level for op in ops]
        self.forward_level = [rules[op.id].forward_level for op in ops]
        for op in ops:
            first: dict[int, int] = {}
            alias = tuple(first.setdefault(v.id, t) for t, v in enumerate(op_tensors(op)))
            self.op_sig.append(sig_ids.setdefault((self.rule_no[op.id], alias), len(sig_ids)))
        self.open: Optional[dict] = None  # value id -> its key with every dim open
        self.seeded: dict[tuple, DimState] = {}  # (axes, priority) -> a seed's closed DimState (frozen: shared)

    def intern(self, key: tuple) -> int:
        k = self._ids.get(key)
        if k is None:
            k = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return k

    def project(self, mesh: Mesh, op_id: int, rule: OpRule, kids: tuple) -> Optional[tuple]:
        """``project_key`` of the op's tensors, or None when it has nothing to offer (no tensor
        has axes, no factor takes any, or every tensor already holds its projection)."""
        mk = (self.rule_no[op_id], kids)
        try:
            return self._project[mk]
        except KeyError:
            pass
        keys = tuple(self.keys[k] for k in kids)
        got = None
        if any(a for k in keys for a in k[0]):
            final, source, projected = project_key(mesh, rule, keys)
            if final and not all(p == k[0] for p, k in zip(projected, keys)):
                got = (final, source, projected)
        self._project[mk] = got
        return got

    def record(self, mesh: Mesh, op_id: int, rule: OpRule, kids: tuple) -> Projection:
        mk = (self.rule_no[op_id], kids)
        got = self.recorded.get(mk)
        if got is None:
            got = self.recorded[mk] = record_key(mesh, rule, tuple(self.keys[k] for k in kids))
        return got


class Propagation:
    # False: every visit goes through ``_apply_projected`` (no memoised plans): the reference
    # the tests compare the fast path with (tests/search/test_search_speed.py)
    fast: bool = True

    def __init__(self, graph: Graph, mesh: Mesh, seeds: Sequence[Seed]):
        self.graph, self.mesh, self.seeds = graph, mesh, list(seeds)
        values = graph.all_values()
        self.state: dict[int, list[DimState]] = {v.id: [OPEN] * len(v.shape) for v in values}
        self.values: dict[int, Value] = {v.id: v for v in values}
        self.ops: list[Op] = list(graph.walk())
        memo: dict = {}  # one rule per distinct (prim, params, shapes): ops/registry.py
        self.rules: dict[int, OpRule] = {op.id: rule_for(op, memo) for op in self.ops}
        self.tensors: dict[int, list[Value]] = {op.id: op_tensors(op) for op in self.ops}
        self.op_by_id = {op.id: op for op in self.ops}
        self.origin: dict[int, str] = {}
        self.projections: dict[int, Projection] = {}
        # value id -> indices (program order) of the ops whose rule covers it
        self._near: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for v in self.tensors[op.id]:
                lst = self._near.setdefault(v.id, [])
                if not lst or lst[-1] != i:
                    lst.append(i)
        self._memo = _Memo(self.ops, self.rules)  # per graph, shared by with_seeds / extend
        # value id -> its interned key (_Memo.intern), while unchanged
        self._ts = self._open_keys()
        # an op is visited once one of its tensors changes (a seed counts): an op whose tensors
        # are all open has nothing to offer, so a fresh run starts with every op clean.
        # Op indices: dirty (a tensor changed since its last visit), owed a forward pass (a
        # tensor changed since its last forward visit), and the ops the current visit made
        # dirty (_fixed_point's heap takes those ahead of it)
        self._dirty: set[int] = set()
        self._owed: set[int] = set()
        self._woke: list[int] = []
        self._cmask: dict[int, tuple] = {}  # op index -> its tensors' closed dims (_closed_mask)
        self._touched: Optional[set] = None  # value ids changed (extend: what to re-record)

    def _open_keys(self) -> dict:
        """A fresh copy of the key cache of a run's start (every dim open), made once per graph."""
        m = self._memo
        if m.open is None:
            m.open = {vid: m.intern((((),) * len(v.shape), (INF,) * len(v.shape), v.size))
                      for vid, v in self.values.items()}
        return dict(m.open)

    def with_seeds(self, seeds: Sequence[Seed]) -> "Propagation":
        """A fresh Propagation of this one's graph from ``seeds``, sharing its per-graph tables
        (rules, op lists, neighbours): only the per-run state is new, as ``__init__`` makes it.
        What the search prices each candidate with (search/price.py)."""
        fresh = Propagation.__new__(Propagation)
        fresh.graph, fresh.mesh, fresh.seeds = self.graph, self.mesh, list(seeds)
        fresh.values, fresh.ops, fresh.rules = self.values, self.ops, self.rules
        fresh.tensors, fresh.op_by_id = self.tensors, self.op_by_id
        fresh._near, fresh._memo = self._near, self._memo
        fresh.state = {}  # (a value's dims are made when first written: _dim_states)
        fresh.origin, fresh.projections = {}, {}
        fresh._ts = fresh._open_keys()
        fresh._dirty, fresh._owed, fresh._woke, fresh._cmask = set(), set(), [], {}
        fresh._touched = None
        return fresh

    def extend(self, seeds: Sequence[Seed]) -> "Propagation":
        """This finished propagation with ``seeds`` more, propagated from where it ended: only
        the ops the new seeds reach are visited again, and only theirs re-recorded. Not always
        what a fresh run from all the seeds gives (a fresh run lets the new seeds claim dims at
        a lower op level than the ones this run already filled), so it is for ranking (the
        search's pre-screen), never for the plan or a kept price."""
        ext = Propagation.__new__(Propagation)
        ext.graph, ext.mesh, ext.seeds = self.graph, self.mesh, self.seeds + list(seeds)
        ext.values, ext.ops, ext.rules = self.values, self.ops, self.rules
        ext.tensors, ext.op_by_id, ext._near = self.tensors, self.op_by_id, self._near
        ext._memo = self._memo
        ext.state = {vid: list(st) for vid, st in self.state.items()}
        ext.origin, ext.projections, ext._ts = dict(self.origin), dict(self.projections), dict(self._ts)
        ext._dirty, ext._owed, ext._woke, ext._cmask = set(), set(), [], {}
        ext._touched = set()
        ext._propagate(seeds)
        ext._record(sorted({i for vid in ext._touched for i in self._near.get(vid, ())}))
        return ext

    # -- driver -------------------------------------------------------------
    def run(self) -> "Propagation":
        self._propagate(self.seeds)
        self._record()
        return self

    def _propagate(self, seeds: Sequence[Seed]) -> None:
        # the ops next to a seeded value (the only values with closed dims): their memoised
        # plans are keyed by which dims are closed too (_closed_mask)
        self._by_seeds = {i for s in self.seeds for i in self._near.get(s.value.id, ())}
        for p in sorted({s.priority for s in seeds} | {0}):
            for s in seeds:
                if s.priority == p:
                    self._seed(s)
            level = 0
            while level <= BROADCAST:
                changed = self._fixed_point(level)
                level = 0 if (changed and level > 0) else level + 1

    def _seed(self, s: Seed) -> None:
        st = self._dim_states(s.value.id)
        made = self._memo.seeded
        for d, axes in enumerate(s.dims):
            if axes is None:
                continue
            key = (tuple(axes), s.priority)
            ds = made.get(key)
            if ds is None:
                ds = made[key] = DimState(key[0], s.priority, True, None)
            st[d] = ds
        self.origin[s.value.id] = s.origin
        for i in self._near.get(s.value.id, ()):
            self._cmask.pop(i, None)
        self._touch(s.value.id)

    def _closed_mask(self, i: int) -> tuple:
        """Per tensor of the op at index ``i``: its closed dims (a tuple of bools), or None when
        none is; only seeds close dims, so it is kept until a seed touches one of them."""
        got = self._cmask.get(i)
        if got is None:
            state = self.state
            out = []
            for v in self.tensors[self.ops[i].id]:
                st = state.get(v.id)
                m = tuple(x.closed for x in st) if st is not None else None
                out.append(m if m is not None and any(m) else None)
            got = self._cmask[i] = tuple(out)
        return got

    def _dim_states(self, vid: int) -> list[DimState]:
        """The value's per-dim states, made (all open) when first asked: a run made by
        ``with_seeds`` starts with none, since most values of a candidate stay open."""
        st = self.state.get(vid)
        if st is None:
            st = self.state[vid] = [OPEN] * len(self.values[vid].shape)
        return st

    def _touch(self, vid: int) -> None:
        self._ts.pop(vid, None)
        if self._touched is not None:
            self._touched.add(vid)
        near = self._near.get(vid, ())
        self._dirty.update(near)
        self._owed.update(near)
        self._woke.extend(near)

    def _fixed_point(self, level: int) -> bool:
        """Sweep forward then backward until nothing changes. Only the ops of this level are
        looked at (level 0: the elementwise ones), and of those only the ones that may want a
        visit (dirty, or owed a forward pass), taken in program order (a
        forward sweep) or its reverse from a heap: an op woken by a visit joins the sweep when
        it lies ahead, and waits for the next sweep when it lies behind, as a sweep over every
        op in order would find it. A visit is inlined up to its memoised projection: most
        visits end there (nothing to offer)."""
        any_change = False
        lv, fls = self._memo.level, self._memo.forward_level
        woke, dirty, owed, memo = self._woke, self._dirty, self._owed, self._memo
        memo_project, rule_no, all_ops, rules = memo._project, memo.rule_no, self.ops, self.rules
        applied, op_sig, bound = memo.applied, memo.op_sig, memo.bound
        ts_get, tids = self._ts.get, memo.tensor_ids
        by_seeds, fast = self._by_seeds, self.fast
        pop, push = heapq.heappop, heapq.heappush
        while True:
            changed = False
            for sign in (1, -1):  # forward (ascending indices), then backward (negated)
                heap = [sign * i for i in dirty | owed if lv[i] <= level]
                heapq.heapify(heap)
                woke.clear()
                last = None
                while heap:
                    k = pop(heap)
                    if k == last:
                        continue
                    last = k
                    i = sign * k
                    fl = fls[i]
                    if not (i in dirty or (fl is not None and level >= fl and i in owed)):
                        continue
                    forward = fl is None or level >= fl
                    dirty.discard(i)
                    if forward:
                        owed.discard(i)
                    else:
                        owed.add(i)
                    op = all_ops[i]
                    kids = tuple(map(ts_get, tids[i]))  # (_kids when every key is cached)
                    if None in kids:
                        kids = self._kids(op)
                    got = memo_project.get((rule_no[op.id], kids), _UNSEEN)
                    if got is _UNSEEN:
                        got = memo.project(self.mesh, op.id, rules[op.id], kids)
                    if got is not None:
                        if not fast:
                            changed_values = self._apply_projected(op, rules[op.id], forward, got)
                            for vid in changed_values:
                                self._touch(vid)
                            if changed_values:
                                changed = True
                        else:
                            cm = self._closed_mask(i) if i in by_seeds else None
                            mk = (op_sig[i], kids, forward, cm)
                            plan = applied.get(mk)
                            if plan is None:
                                plan = applied[mk] = self._plan(op, rules[op.id], forward, got, kids, cm)
                            bk = (i, id(plan))
                            b = bound.get(bk)
                            if b is None:
                                b = bound[bk] = self._bind(op, plan)
                            if self._apply_plan(b):
                                changed = True
                        if woke:  # the ops this visit made dirty: ahead of it, they join this sweep
                            for j in woke:
                                if lv[j] <= level and sign * j > k:
                                    push(heap, sign * j)
                            woke.clear()
            any_change |= changed
            if not changed:
                return any_change

    # -- one op -------------------------------------------------------------
    def _kids(self, op: Op) -> tuple:
        """Per tensor of ``op``: its interned key (``_Memo.intern``: axes per dim, priority per
        dim, size), cached per value while it is unchanged."""
        cache = self._ts
        tensors = self.tensors[op.id]
        out = [cache.get(v.id) for v in tensors]
        if None in out:
            state, intern = self.state, self._memo.intern
            for t, v in enumerate(tensors):
                if out[t] is None:
                    st = state[v.id]
                    out[t] = cache[v.id] = intern((tuple([s.axes for s in st]), tuple([s.prio for s in st]), v.size))
        return tuple(out)

    def _apply_projected(self, op: Op, rule: OpRule, forward: bool, got: tuple) -> list[int]:
        """The tensors' dims take what the op's projection ``got`` (``_Memo.project``) offers."""
        tensors = self.tensors[op.id]
        final, source, projected = got
        source = dict(source)
        mesh = self.mesh
        n_in = len(op.inputs)
        changed: list[int] = []
        for t, (v, dims) in enumerate(zip(tensors, rule.tensors)):
            if n_in <= t < n_in + len(op.outputs) and not forward:
                continue
            st = self._dim_states(v.id)
            for d, fs in enumerate(dims):
                new = projected[t][d]
                if not new or new == st[d].axes or not fs or st[d].closed:  # (most visits: nothing new)
                    continue
                if rule.factors[fs[0]].kind == NEED_REPLICATION and not rule.factors[fs[0]].carried:
                    continue
                new = ax.grown(mesh, st[d].axes, new, tuple(a for e, s in enumerate(st) if e != d for a in s.axes))
                if new is None:
                    continue
                srcs = [source[f] for f in fs if f in source]
                prio, src_t = next((x for x in srcs if tensors[x[1]].id != v.id), srcs[0])
                st[d] = DimState(new, min(prio, st[d].prio) if st[d].axes else prio, False, (op.id, tensors[src_t].id))
                if not changed or changed[-1] != v.id:
                    changed.append(v.id)
        return changed

    def _plan(self, op: Op, rule: OpRule, forward: bool, got: tuple, kids: tuple, closed: Optional[tuple]) -> tuple:
        """What ``_apply_projected`` writes at a visit of ``op`` whose tensors hold ``kids``, with
        ``closed`` the closed dims per tensor (``_closed_mask``; None: none is, as for every op
        not next to a seed): ((tensor, dim, axes, priority, source tensor) per dim written,
        (tensor, its new interned key) per tensor whose value changed). A function of (the op's
        signature, ``kids``, ``forward``, ``closed``) only (the keys hold every dim's axes and
        priority; the signature, the rule and which tensors are one value; a closed dim is never
        written), so it is memoised on them across ops and runs: the 24 layers of a model meet
        the same keys again and again."""
        keys = self._memo.keys
        tensors = self.tensors[op.id]
        final, source, projected = got
        source = dict(source)
        mesh = self.mesh
        n_in = len(op.inputs)
        first: dict[int, int] = {}
        rep = [first.setdefault(v.id, t) for t, v in enumerate(tensors)]
        cur = {r: (list(keys[kids[r]][0]), list(keys[kids[r]][1])) for r in first.values()}
        writes: list[tuple] = []
        changed: list[int] = []
        for t, dims in enumerate(rule.tensors):
            if n_in <= t < n_in + len(op.outputs) and not forward:
                continue
            axs, prs = cur[rep[t]]
            shut = closed[rep[t]] if closed is not None else None
            for d, fs in enumerate(dims):
                new = projected[t][d]
                if not new or new == axs[d] or not fs or (shut is not None and shut[d]):
                    continue
                if rule.factors[fs[0]].kind == NEED_REPLICATION and not rule.factors[fs[0]].carried:
                    continue
                new = ax.grown(mesh, axs[d], new, tuple(a for e, s in enumerate(axs) if e != d for a in s))
                if new is None:
                    continue
                srcs = [source[f] for f in fs if f in source]
                prio, src_t = next((x for x in srcs if rep[x[1]] != rep[t]), srcs[0])
                prs[d] = min(prio, prs[d]) if axs[d] else prio
                axs[d] = new
                writes.append((t, d, new, prs[d], src_t))
                if not changed or changed[-1] != rep[t]:
                    changed.append(rep[t])
        intern = self._memo.intern
        return tuple(writes), tuple((r, intern((tuple(cur[r][0]), tuple(cur[r][1]), tensors[r].size))) for r in changed)

    def _bind(self, op: Op, plan: tuple) -> tuple:
        """A memoised ``_plan`` bound to ``op``'s values: ((value id, dim, its new DimState) per
        write, (value id, its new key) per changed value, the indices of the ops next to the
        changed values); memoised per (op, plan), since the DimStates name the op (DimState is
        frozen: one object serves every run)."""
        writes, changed = plan
        tensors = self.tensors[op.id]
        near = self._near
        return (tuple((tensors[t].id, d, DimState(new, prio, False, (op.id, tensors[src_t].id)))
                      for t, d, new, prio, src_t in writes),
                tuple((tensors[t].id, key) for t, key in changed),
                tuple(i for t, _ in changed for i in near.get(tensors[t].id, ())))

    def _apply_plan(self, bound: tuple) -> bool:
        """Write a memoised ``_plan`` bound to its op (``_bind``: what ``_apply_projected``
        would write) and touch the changed values, whose keys the plan knows (so ``_kids``
        need not intern them again)."""
        writes, changed, near = bound
        state = self.state
        for vid, d, ds in writes:
            st = state.get(vid)
            if st is None:
                st = self._dim_states(vid)
            st[d] = ds
        if not changed:
            return False
        ts = self._ts
        for vid, key in changed:  # (_touch, at once)
            ts[vid] = key
        if self._touched is not None:
            self._touched.update(vid for vid, _ in changed)
        self._dirty.update(near)
        self._owed.update(near)
        self._woke.extend(near)
        return True

    def _record(self, which: Optional[Sequence[int]] = None) -> None:
        """Record the projection of every op (``which``: of the ops at these indices only)."""
        mesh, rules, projections, memo = self.mesh, self.rules, self.projections, self._memo
        ops, ts_get, tids, recorded, rule_no = self.ops, self._ts.get, memo.tensor_ids, memo.recorded, memo.rule_no
        for i in (range(len(ops)) if which is None else which):
            op = ops[i]
            kids = tuple(map(ts_get, tids[i]))  # (_kids when every key is cached)
            if None in kids:
                kids = self._kids(op)
            got = recorded.get((rule_no[op.id], kids))
            projections[op.id] = got if got is not None else memo.record(mesh, op.id, rules[op.id], kids)

    # -- results ------------------------------------------------------------
    @property
    def value_keys(self) -> dict:
        """Value id -> its interned key, for the values whose key is cached (unchanged since
        last read); ``key_table[k][0]`` is then its axes per dim (what ``dims_of`` answers)."""
        return self._ts

    @property
    def key_table(self) -> list:
        """Interned key -> (axes per dim, priority per dim, size)."""
        return self._memo.keys

    def dims_of(self, v: Value) -> tuple[tuple[AxisRef, ...], ...]:
        k = self._ts.get(v.id)
        if k is not None:  # (the cached key of an unchanged value: its axes per dim)
            return self._memo.keys[k][0]
        st = self.state.get(v.id)
        return tuple(s.axes for s in st) if st else ((),) * v.rank

    def explain(self, v: Value, name: str) -> str:
        from ..core.sharding import Sharding

        lines = [f"{name}: {v.type_str} sharded {Sharding.of(self.mesh, self.dims_of(v)).spec!r}"]
        st = self.state.get(v.id) or ([OPEN] * len(v.shape) if v.id in self.values else None)
        if st is None:
            return lines[0]
        for d, s in enumerate(st):
            if not s.axes:
                why = "closed by an annotation" if s.closed else "no sharding reached it"
                lines.append(f"  dim {d}: replicated ({why})")
                continue
            names = tuple(str(a) for a in s.axes)
            lines.append(f"  dim {d}: {(names[0] if len(names) == 1 else names)!r}")  # as a P entry
            cur, dim_state, seen = v, s, set()
            while dim_state.why is not None and cur.id not in seen:
                seen.add(cur.id)
                op_id, src_id = dim_state.why
                op = self.op_by_id[op_id]
                src = self.values[src_id]
                lines.append(f"    <- {user_name(op)} (op {op_id}{', ' + op.source if op.source else ''}) from "
                             f"%{src.id} {src.type_str} {Sharding.of(self.mesh, self.dims_of(src)).spec!r}")
                cur = src
                # follow the first dim of the source that has a provenance
                nxt = [x for x in self.state.get(src.id, ()) if x.axes]
                dim_state = next((x for x in nxt if x.why is not None), nxt[0] if nxt else DimState())
            origin = self.origin.get(cur.id)
            if origin:
                lines.append(f"    <- {origin}")
        return "\n".join(lines)
