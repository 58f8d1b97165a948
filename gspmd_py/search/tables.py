"""Cost tables for the search's pre-screen (Alpa / automap style): price a propagated
candidate without building its per-device program.

A candidate's propagation (search/price.py) gives every op its projection (factor -> mesh
axes) and every value its sharding. ``CostTables`` turns that into one integer per *term*,
a fixed list per graph:

* one compute term per op: its local FLOPs and bytes under the projection (padded shards),
  timed by the cost model's ``cost.rates.op_seconds`` (the rate of the op's shape class for
  dot/conv, else the vector rate, or the memory bandwidth, whichever binds);
* one resharding term per operand edge (the value's sharding -> the operand dims the
  projection executes) and per result edge (the result dims -> the value's sharding): the
  collectives of the reshard planner's steps (program/reshard_plan.py), the very steps the
  partitioner emits, each at the bytes it sends;
* one partial term per result of an op with sharded reduction factors: the planner's
  reduce-scatters and all-reduces that combine it towards the value's sharding.

Each term's integer indexes a row of one table (seconds, collective bytes per device),
filled once per distinct (op signature, layout) or (value type, source layout, target
layout) and shared by every candidate and every repeated layer. Collectives are priced by
``Hardware.collective_time`` (the cost model's alpha-beta formulas, not a copy). A term
inside a loop body counts its trip count (scan ``length``; a while loop once).

The sum over terms is ``table_sums``: a plain loop over (candidate, term) written once,
run as Python, or compiled with ``numba.njit(cache=True)`` when numba is importable and the
search has summed enough that it pays (``NUMBA_MIN_PAIRS``; the measurements are in
docs/performance.md's appendix). The tables rank
candidates; the traced pricer (price.py) stays authoritative for every score the search
keeps.

Loops: a partial sum inside a loop body that only ops carrying partials unreduced lead to the
body's outputs (partitioner/partial.py's ``linearity``: a gradient accumulated in a carry)
is reduced once after the loop, and its latency counts so. Latencies of independent
collectives (values no matmul depends on: gradient syncs) count once per (kind, axes), as the
combiner issues them; the others once per collective.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from ..cost.rates import op_seconds, padded_shard_shape
from ..core.ir import Graph, Op
from ..core.mesh import Mesh
from ..ops import facts as F
from ..ops import facts_of
from ..program.reshard_plan import REDUCTIONS, plan_reshard
from ..propagation import Propagation

LOOP_TRIPS = {"scan": lambda op: int(op.params.get("length", 1))}
# once a search's tables have summed this many (candidate, term) pairs uncompiled (about the
# time numba takes to import and load the cached kernel: benchmarks/auto.py measures both),
# its later sums run compiled: at most twice the better of the two, whatever the search's size
NUMBA_MIN_PAIRS = 2_000_000


def table_sums(idx, mult, amult, table, groups, alpha, used, out) -> None:
    """Per candidate ``c`` (a row of ``idx``): ``out[c][0]`` = the seconds of its terms
    (``table[idx[c][t]][0] * mult[t]``) plus one latency ``alpha[g]`` per collective group
    ``g`` its terms use (``groups[row]``, -1: none), counted at the largest ``amult[t]`` (the
    times the term's collective is issued) of the terms using it; ``out[c][1]`` = its
    collective bytes. ``used``: scratch, one per group.
    Written for both runners: NumPy arrays under numba, nested lists in Python (list indexing
    is several times faster than NumPy's scalar indexing there)."""
    for c in range(len(idx)):
        row = idx[c]
        s = 0.0
        b = 0.0
        for g in range(len(used)):
            used[g] = 0.0
        for t in range(len(row)):
            k = row[t]
            m = mult[t]
            tk = table[k]
            s += tk[0] * m
            b += tk[1] * m
            gk = groups[k]
            for j in range(len(gk)):
                g = gk[j]
                if g >= 0 and amult[t] > used[g]:
                    used[g] = amult[t]
        for g in range(len(alpha)):
            s += alpha[g] * used[g]
        out[c][0] = s
        out[c][1] = b


_compiled: Optional[Callable] = None


def compiled_sums() -> Optional[Callable]:
    """``table_sums`` compiled by numba (cached on disk), or None when numba is not installed."""
    global _compiled
    if _compiled is None:
        try:
            import numba
        except ImportError:
            return None
        _compiled = numba.njit(cache=True)(table_sums)
    return _compiled


def sums(idx: np.ndarray, mult: np.ndarray, amult: np.ndarray, table: np.ndarray, groups: np.ndarray,
         alpha: np.ndarray, use_numba: Optional[bool] = None) -> np.ndarray:
    """Per candidate (row of ``idx``): (seconds, collective bytes); compiled when ``use_numba``
    and numba is importable."""
    fn = compiled_sums() if use_numba else None
    if fn is not None:
        out = np.zeros((idx.shape[0], 2), np.float64)
        fn(idx, mult, amult, table, groups, alpha, np.zeros(alpha.shape[0], np.float64), out)
        return out
    out_l = [[0.0, 0.0] for _ in range(idx.shape[0])]
    table_sums(idx.tolist(), mult.tolist(), amult.tolist(), table.tolist(), groups.tolist(), alpha.tolist(),
               [0.0] * alpha.shape[0], out_l)
    return np.asarray(out_l, np.float64).reshape(-1, 2)


def late_values(graph: Graph) -> set:
    """Ids of the top-level values no matmul depends on (a training step's gradient syncs,
    the updates after them): their collectives are independent of one another, and the
    combiner issues those of one kind over the same axes as one (one latency)."""
    feeds_matmul: set = set()
    for op in reversed(graph.ops):
        if facts_of(op.prim).matmul or op.regions or any(v.id in feeds_matmul for v in op.outputs):
            feeds_matmul.update(v.id for v in op.inputs)
    return {v.id for v in graph.values() if v.id not in feeds_matmul}


def carried_out(body: Graph) -> set:
    """Ids of the values of a loop body whose partial sums can reach only the body's outputs
    through ops that carry them unreduced (partitioner/partial.py: ``linearity``): the
    partitioner carries them out of the loop and reduces them once, after it."""
    users: dict = {}
    for op in body.ops:
        for v in op.inputs:
            users.setdefault(v.id, []).append(op)
    out: set = set()
    for op in reversed(body.ops):
        for v in op.outputs:
            if all(not u.regions and facts_of(u.prim).linearity != F.NONLINEAR
                   and all(w.id in out for w in u.outputs) for u in users.get(v.id, ())):
                out.add(v.id)
    return out


def _local_bytes(shape: Sequence[int], itemsize: int, dims) -> int:
    n = itemsize
    for s in padded_shard_shape(shape, dims):
        n *= s
    return n


class CostTables:
    """The terms of one graph and the table they index (see the module docstring)."""

    def __init__(self, graph: Graph, mesh: Mesh, hw):
        self.graph, self.mesh, self.hw = graph, mesh, hw
        self.ops: list[Op] = []
        mult: list[float] = []
        amult: list[float] = []
        self._layout: list[tuple] = []  # per term: what it reads, for ``indices``
        sigs: dict = {}

        def visit(g: Graph, trips: float, outer: float) -> None:
            carried = carried_out(g) if trips > outer else set()
            for op in g.ops:
                self.ops.append(op)
                region = bool(op.regions)
                sig = sigs.setdefault((op.prim, tuple((v.shape, str(v.dtype)) for v in op.inputs + op.outputs)),
                                      len(sigs))
                if not region:
                    self._layout.append(("op", op, sig))
                    mult.append(trips)
                    amult.append(trips)
                for i, v in enumerate(op.inputs):
                    if not v.is_const:
                        self._layout.append(("in", op, i, v))
                        mult.append(trips)
                        amult.append(trips)
                for i, v in enumerate(op.outputs):
                    self._layout.append(("out", op, i, v))
                    mult.append(trips)
                    amult.append(trips)
                    if not region:
                        deferred = v.id in carried
                        self._layout.append(("partial", op, i, v, deferred or v.id in late))
                        mult.append(trips)
                        amult.append(outer if deferred else trips)
                if region:
                    n = LOOP_TRIPS.get(op.prim, lambda op: 1)(op)
                    for sub in op.regions:
                        visit(sub, trips * n, trips)

        late = self._late = late_values(graph)
        visit(graph, 1.0, 1.0)
        self.mult = np.asarray(mult, np.float64)
        self.amult = np.asarray(amult, np.float64)
        self._keys: dict = {None: 0}
        self._rows: list[tuple[float, float]] = [(0.0, 0.0)]
        self._groups: list[tuple[int, int]] = [(-1, -1)]
        self._coll: dict = {}
        self._group_of: dict = {}  # (kind, axes) -> group index
        self._alpha: list[float] = []
        self.pairs = 0  # (candidate, term) pairs summed so far
        # (term, id(projection)) -> (projection, row) of compute terms: propagation shares one
        # Projection object per (rule, tensor shardings), so a candidate's op meets a kept one
        self._block_rows: dict = {}  # (op block, id(projection), its values' keys) -> (projection, rows, reshards)
        self._blocks: Optional[list[tuple]] = None  # ``_block_layout``

    # -- the table --------------------------------------------------------------------
    @property
    def table(self) -> np.ndarray:
        return np.asarray(self._rows, np.float64).reshape(-1, 2)

    @property
    def groups(self) -> np.ndarray:
        return np.asarray(self._groups, np.int64).reshape(-1, 2)

    @property
    def alpha(self) -> np.ndarray:
        return np.asarray(self._alpha, np.float64)

    @property
    def terms(self) -> int:
        return len(self.mult)

    def _row(self, key, make: Callable[[], tuple]) -> int:
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = len(self._rows)
            seconds, nbytes, groups = make()
            self._rows.append((seconds, nbytes))
            self._groups.append((tuple(groups) + (-1, -1))[:2])
        return k

    def _coll_time(self, kind: str, nbytes: int, axes: tuple[str, ...], grouped: bool = False) -> tuple[float, int]:
        """(bandwidth seconds, latency group) of one collective over mesh ``axes`` (names): its
        latency (``collective_time`` of one byte) is charged once per group (kind, axes) per
        candidate, as the combiner issues independent collectives of one kind over the same
        axes as one."""
        key = (kind, nbytes, axes, grouped)
        got = self._coll.get(key)
        if got is None:
            names = list(axes)
            g = self._group_of.get((kind, axes))
            if g is None:
                g = self._group_of[(kind, axes)] = len(self._alpha)
                self._alpha.append(self.hw.collective_time(kind, 1, self.mesh, names))
            t = self.hw.collective_time(kind, nbytes, self.mesh, names)
            got = self._coll[key] = (max(t - self._alpha[g], 0.0), g) if grouped else (t, -1)
        return got

    # -- terms ------------------------------------------------------------------------
    def _op_cost(self, op: Op, rule, factors: dict, proj) -> tuple:
        hw = self.hw
        work = 1.0  # per device: each factor padded to a multiple of its shards (an uneven split)
        for i, f in enumerate(rule.factors):
            k = 1
            for a in factors.get(i, ()):
                k *= a.size
            work *= -(-f.size // k)
        nb = 0
        for v, dims in zip(op.inputs, proj.operand_dims):
            nb += _local_bytes(v.shape, v.dtype.itemsize, dims)
        for v, dims in zip(op.outputs, proj.result_dims):
            nb += _local_bytes(v.shape, v.dtype.itemsize, dims)
        return op_seconds(hw, op, 2 * work if facts_of(op.prim).matmul else work, nb, proj.operand_dims), 0.0, ()

    def _steps(self, shape, src, dst, partial=(), keep_partial: bool = False):
        """The reshard planner's steps (program/reshard_plan.py: the ones the partitioner emits)
        for mesh-axis dims ``src`` -> ``dst``, and the axes' names per step."""
        refs = {a for d in tuple(src) + tuple(dst) for a in d} | set(partial)
        order = sorted(refs, key=lambda r: (self.mesh.axis_index(r.name), r.pre, r.size))
        name = {r: str(r) for r in order}
        names = lambda dims: tuple(tuple(name[a] for a in d) for d in dims)  # noqa: E731
        return plan_reshard(tuple(shape), names(src), names(dst), tuple((name[r], r.size) for r in order),
                            tuple(name[a] for a in partial), keep_partial)

    def _price_steps(self, steps, itemsize: int, grouped: bool, kinds=None) -> tuple:
        t = b = 0.0
        groups = []
        for st in steps:
            if not st.communicates or (kinds is not None and st.kind not in kinds):
                continue
            nb = st.bytes(itemsize)
            dt, g = self._coll_time(st.kind, nb, st.axes, grouped)
            t, b = t + dt, b + nb
            groups.append(g)
        return t, b, groups

    def _reshard_cost(self, shape, itemsize: int, src, dst, grouped: bool) -> tuple:
        if src == dst:
            return 0.0, 0.0, ()
        return self._price_steps(self._steps(shape, src, dst), itemsize, grouped)

    def _partial_cost(self, shape, itemsize: int, rdims, axes, vdims, grouped: bool) -> tuple:
        """The reductions of the partial result (the reshard planner's reduce-scatters and
        all-reduces towards the value's layout; its other steps are the "out" term's)."""
        return self._price_steps(self._steps(shape, rdims, vdims, tuple(axes)), itemsize, grouped, REDUCTIONS)

    def _block_layout(self) -> list[tuple]:
        """The terms grouped by op (each op's terms are consecutive): (first term, end, the op's
        id, the ids of the values its terms read, those values) per op."""
        if self._blocks is None:
            blocks: list[tuple] = []
            for t, lay in enumerate(self._layout):
                if not blocks or blocks[-1][2] is not lay[1]:
                    blocks.append([t, t, lay[1], []])
                b = blocks[-1]
                b[1] = t + 1
                if lay[0] != "op" and lay[3] not in b[3]:
                    b[3].append(lay[3])
            self._blocks = [(a, e, op.id, tuple(v.id for v in vs), tuple(vs)) for a, e, op, vs in blocks]
        return self._blocks

    def indices(self, prop: Propagation) -> np.ndarray:
        """Row of the table per term for one propagated candidate (new rows filled as met).
        An op's rows are a function of its projection and its values' dims, memoised per op
        on (the projection object, the values' interned keys): candidates share most of them.
        A value resharded once per target, whatever reads it: the rows of an operand's
        reshard after the first to one target are zeroed here, across ops."""
        out: list[int] = []
        projs, ts_get, dims_of = prop.projections, prop.value_keys.get, prop.dims_of
        memo = self._block_rows
        seen: set = set()
        for b, (start, end, op_id, vids, vals) in enumerate(self._block_layout()):
            proj = projs[op_id]
            vk = tuple(map(ts_get, vids))
            if None in vk:
                vk = tuple(k if k is not None else dims_of(v) for k, v in zip(vk, vals))
            key = (b, id(proj), vk)
            got = memo.get(key)
            if got is None or got[0] is not proj:
                got = memo[key] = (proj,) + self._op_block(prop, start, end, proj)
            out.extend(got[1])
            if got[2]:
                for t, vid, dst in got[2]:
                    if (vid, dst) in seen:
                        out[t] = 0
                    else:
                        seen.add((vid, dst))
        return np.asarray(out, np.int64)

    def _op_block(self, prop: Propagation, start: int, end: int, proj) -> tuple[list[int], tuple]:
        """The rows of the terms ``start:end`` (one op's), and (term, value id, target dims) per
        operand reshard priced (``indices`` zeroes a repeat of one (value, target))."""
        dims_of, ts_get, keys = prop.dims_of, prop.value_keys.get, prop.key_table
        row = self._row
        rows: list[int] = []
        reshards: list[tuple] = []
        for t in range(start, end):
            lay = self._layout[t]
            kind, op = lay[0], lay[1]
            if kind == "op":
                fk = tuple(sorted(proj.factors.items()))
                rule = prop.rules[op.id]
                rows.append(row(("op", lay[2], rule, fk), lambda: self._op_cost(op, rule, proj.factors, proj)))
                continue
            v = lay[3]
            k = ts_get(v.id)
            vdims = keys[k][0] if k is not None else dims_of(v)
            if kind == "in":
                src, dst = vdims, proj.operand_dims[lay[2]] if lay[2] < len(proj.operand_dims) else None
                if dst is None or src == dst:
                    rows.append(0)
                    continue
                reshards.append((t, v.id, dst))
            elif kind == "out":
                i = lay[2]
                src, dst = (proj.result_dims[i] if i < len(proj.result_dims) else None), vdims
                if src is None or src == dst:
                    rows.append(0)
                    continue
            else:
                if proj.partial is None or lay[2] >= len(proj.result_dims):
                    rows.append(0)
                    continue
                rd, axes, late = proj.result_dims[lay[2]], proj.partial.axes, lay[4]
                rows.append(row(("pa", v.shape, v.dtype.itemsize, rd, axes, vdims, late),
                                lambda: self._partial_cost(v.shape, v.dtype.itemsize, rd, axes, vdims, late)))
                continue
            late = v.id in self._late
            rows.append(row(("re", v.shape, v.dtype.itemsize, src, dst, late),
                            lambda: self._reshard_cost(v.shape, v.dtype.itemsize, src, dst, late)))
        return rows, tuple(reshards)

    # -- single terms, for the exact search (ilp_build.py) -------------------------------
    @property
    def late(self) -> set:
        """Ids of the values whose collectives are independent (``late_values``)."""
        return self._late

    def op_cost(self, op: Op, rule, proj) -> tuple:
        """One op's compute term under ``proj``: (seconds, 0, ())."""
        return self._op_cost(op, rule, proj.factors, proj)

    def reshard_cost(self, shape, itemsize: int, src, dst, grouped: bool) -> tuple:
        """(bandwidth seconds, bytes, latency groups) of resharding ``src`` -> ``dst``."""
        return self._reshard_cost(shape, itemsize, src, dst, grouped)

    def partial_cost(self, shape, itemsize: int, rdims, axes, vdims, grouped: bool) -> tuple:
        """(seconds, bytes, latency groups) of a partial result's reductions towards ``vdims``."""
        return self._partial_cost(shape, itemsize, rdims, axes, vdims, grouped)

    def region_seconds(self, prop: Propagation, op_ids: set) -> float:
        """The seconds of the terms of the ops ``op_ids`` (a loop body's, at its trip counts)
        under ``prop``, latencies of grouped collectives counted once per group."""
        idx = self.indices(prop)
        table, groups, alpha = self.table, self.groups, self.alpha
        s, used = 0.0, set()
        for t, lay in enumerate(self._layout):
            if lay[1].id in op_ids:
                s += table[idx[t]][0] * self.mult[t]
                used.update(int(g) for g in groups[idx[t]] if g >= 0)
        return s + sum(float(alpha[g]) for g in used)

    def argument_bytes(self, prop: Propagation) -> int:
        """Local bytes of the inputs and outputs (a lower bound of the peak, for memory limits)."""
        return sum(_local_bytes(v.shape, v.dtype.itemsize, prop.dims_of(v))
                   for v in list(self.graph.inputs) + list(self.graph.outputs) if not v.is_const)

    def price(self, props: Sequence[Propagation], use_numba: Optional[bool] = None) -> np.ndarray:
        """(seconds, collective bytes) per candidate."""
        if not props:
            return np.zeros((0, 2))
        idx = np.stack([self.indices(p) for p in props])
        if use_numba is None:
            use_numba = self.pairs >= NUMBA_MIN_PAIRS
        self.pairs += idx.size
        return sums(idx, self.mult, self.amult, self.table, self.groups, self.alpha, use_numba)
