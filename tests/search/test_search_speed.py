"""The search's speed-ups change no result (optimizer.py's "Speed, same results"): propagation's
per-graph memo (interned tensor keys, projections memoised on (rule, keys), shared by every
``with_seeds`` run) gives exactly a fresh run's shardings and projections, and the combiner's
cycle check by group dependency bitsets merges exactly the collectives the member-by-member
walk did (the program the search prices is the compiler's: test_pass_list.py)."""
import itertools

import jax
import jax.numpy as jnp
import pytest

import gspmd_py as gp
from gspmd_py.frontend.constraints import outside_user_mesh
from gspmd_py.partitioner.passes import index_program, partition_graph
from gspmd_py.program import combine as C
from gspmd_py.propagation import Propagation, Seed
from gspmd_py.propagation.engine import DimState
from gspmd_py.runtime.layout import own_mesh
from gspmd_py.search.price import fingerprint
from models import REFERENCE

S = jax.ShapeDtypeStruct


def _graph(fn, shapes, mesh):
    return gp.spmd(fn, mesh).plan(*[S(s, jnp.float32) for s in shapes]).graph


def _seed_sets(graph, mesh):
    """Single-dim seeds on the inputs over each axis, then pairs of them (what the search's
    input actions make)."""
    one = []
    for v in graph.inputs:
        for d, n in enumerate(v.shape):
            for a in mesh.axis_names:
                if n % mesh.axis_size(a) == 0:
                    one.append(Seed(v, tuple((mesh.ref(a),) if e == d else None for e in range(v.rank)), 0, "t"))
    pairs = [[a, b] for a, b in itertools.combinations(one, 2) if a.value.id != b.value.id]
    return [[s] for s in one] + pairs[:24]


def _old_groups(body, threshold):
    """combine.merge_groups as it was: the cycle check walks groups member by member."""
    deps, cand = [], {}
    for i, e in enumerate(body.entries):
        d = 0
        for j in e.deps:
            d |= deps[j] | ((1 << j) if j in cand else 0)
        deps.append(d)
        k = C.collective_key(e)
        if k is not None:
            cand[i] = k
    groups, open_ = [], {}

    def feeds(a, b):
        return any(deps[m] & a.bits for m in b.members)

    def reaches(src, dst):
        seen, todo = {id(src)}, [src]
        while todo:
            g = todo.pop()
            if g is dst:
                return True
            for h in groups:
                if id(h) not in seen and feeds(g, h):
                    seen.add(id(h))
                    todo.append(h)
        return False

    for i, k in cand.items():
        g = open_.get(k)
        n = body.entries[i].emitted.nbytes
        if g is not None and not (deps[i] & g.bits) and g.nbytes + n <= threshold and not any(
                (deps[i] & h.bits) and reaches(g, h) for h in groups if h is not g):
            g.members.append(i)
            g.bits |= 1 << i
            g.nbytes += n
            continue
        g = C.Group(k, [i], 1 << i, n)
        open_[k] = g
        groups.append(g)
    return [g.members for g in groups if len(g.members) > 1]


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_shared_memo_propagation_equals_a_fresh_run(name, fn, shapes, mesh_shape, names):
    mesh = gp.Mesh(mesh_shape, names)
    graph = _graph(fn, shapes, mesh)
    template = Propagation(graph, mesh, [])
    sets = _seed_sets(graph, mesh)
    assert len(sets) > 4
    for seeds in sets + sets[::-1]:  # the second pass meets every key memoised
        shared = template.with_seeds(seeds).run()
        fresh = Propagation(graph, mesh, seeds).run()
        assert fingerprint(shared, graph) == fingerprint(fresh, graph)
        assert shared.projections == fresh.projections


def _unrolled(x, w1, w2, w3):
    """Three identical blocks and their gradient: visits of different layers meet the same
    keys, so memoised visit plans are reused across ops and runs."""
    def loss(ws, x):
        for w in ws:
            x = x + jnp.tanh(x @ w) * 0.5
        return jnp.sum(x * x)
    return jax.grad(loss)((w1, w2, w3), x)


def _all_states(prop, graph):
    """Every value's dim states (axes, priority, closed, provenance), open ones included."""
    return {v.id: tuple(prop.state.get(v.id) or ()) or ((DimState(),) * v.rank) for v in graph.all_values()}


def _assert_same_run(a, b, graph):
    """Two propagations of one graph ended alike: every dim state, projection and origin."""
    assert _all_states(a, graph) == _all_states(b, graph)
    assert a.projections == b.projections and a.origin == b.origin


PLAN_PROGRAMS = list(REFERENCE) + [("unrolled", _unrolled, [(16, 32), (32, 32), (32, 32), (32, 32)], (2, 4), ("x", "y"))]


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", PLAN_PROGRAMS, ids=[r[0] for r in PLAN_PROGRAMS])
def test_memoised_visit_plans_equal_the_visit_by_visit_path(name, fn, shapes, mesh_shape, names):
    """engine.py ``_plan``: a visit of an op without closed tensors writes what its memoised
    plan says; every dim state (priority and provenance included), projection and origin equals
    the run where every visit goes through ``_apply_projected`` (``Propagation.fast = False``)."""
    mesh = gp.Mesh(mesh_shape, names)
    graph = _graph(fn, shapes, mesh)
    template = Propagation(graph, mesh, [])
    sets = _seed_sets(graph, mesh)
    # seeds on intermediate values too: the ops next to them take the closed path, the rest plans
    inner = [v for v in graph.all_values() if v.rank == 2 and not v.is_const][:6]
    sets += [[Seed(v, ((mesh.ref(names[0]),), None), 1, "t")] for v in inner if v.shape[0] % mesh.axis_size(names[0]) == 0]
    # and with an input seed of another priority: dims grown by axes of two priorities
    ax1 = names[-1]
    sets += [[sets[0][0], Seed(v, (None, (mesh.ref(ax1),)), 1, "t")] for v in inner
             if v.shape[1] % mesh.axis_size(ax1) == 0 and v.id != sets[0][0].value.id]
    both = tuple(mesh.ref(a) for a in names)
    sets += [[sets[0][0], Seed(v, (both, None), 1, "t")] for v in inner
             if v.shape[0] % mesh.size == 0 and v.id != sets[0][0].value.id]
    planned = 0
    for seeds in sets + sets[::-1]:
        fast = template.with_seeds(seeds).run()
        slow = template.with_seeds(seeds)
        slow.fast = False
        _assert_same_run(fast, slow.run(), graph)
        assert fingerprint(fast, graph) == fingerprint(Propagation(graph, mesh, seeds).run(), graph)
        planned = len(template._memo.applied)
    assert planned > 0  # the plans were used


MERGING = [r for r in REFERENCE if r[0] in ("train_step", "block_grad")]  # programs whose collectives merge


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", MERGING, ids=[r[0] for r in MERGING])
@pytest.mark.parametrize("threshold", [C.DEFAULT_THRESHOLD_BYTES])
def test_combiner_groups_equal_the_member_by_member_walk(name, fn, shapes, mesh_shape, names, threshold):
    mesh = gp.Mesh(mesh_shape, names)
    graph = _graph(fn, shapes, mesh)
    merged = 0
    for seeds in _seed_sets(graph, mesh)[:12]:
        prop = Propagation(graph, mesh, seeds).run()
        with outside_user_mesh(), own_mesh():
            part = partition_graph(graph, mesh, prop)
            index = index_program(part.program, part.fine, graph)
        for body in index.bodies.values():
            want = _old_groups(body, threshold)
            assert [g.members for g in C.merge_groups(body, threshold)] == want
            merged += len(want)
    assert merged > 0  # the check saw collectives merge


class _FullSweep(Propagation):
    """engine.py's sweep before the worklist: every op of the level looked at, in program
    order then reversed, each visit through ``_apply_projected``."""

    def _fixed_point(self, level):
        ops = [(i, self.rules[op.id].forward_level) for i, op in enumerate(self.ops) if self.rules[op.id].level <= level]
        any_change = False
        while True:
            changed = False
            for order in (ops, ops[::-1]):
                for i, fl in order:
                    if not (i in self._dirty or (fl is not None and level >= fl and i in self._owed)):
                        continue
                    forward = fl is None or level >= fl
                    self._dirty.discard(i)
                    (self._owed.discard if forward else self._owed.add)(i)
                    op = self.ops[i]
                    got = self._memo.project(self.mesh, op.id, self.rules[op.id], self._kids(op))
                    if got is None:
                        continue
                    touched = self._apply_projected(op, self.rules[op.id], forward, got)
                    for vid in touched:
                        self._touch(vid)
                    changed |= bool(touched)
            any_change |= changed
            if not changed:
                return any_change


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", PLAN_PROGRAMS, ids=[r[0] for r in PLAN_PROGRAMS])
def test_worklist_sweep_visits_as_the_full_sweep(name, fn, shapes, mesh_shape, names):
    """engine.py ``_fixed_point`` takes only the ops that may want a visit, from a heap: every
    dim state (priority and provenance included), projection and origin equals the sweep that
    looks at every op of the level in order (a visit's order decides priorities and sources)."""
    mesh = gp.Mesh(mesh_shape, names)
    graph = _graph(fn, shapes, mesh)
    template = Propagation(graph, mesh, [])
    inner = [v for v in graph.all_values() if v.rank == 2 and not v.is_const][:6]
    sets = _seed_sets(graph, mesh) + [[Seed(v, ((mesh.ref(names[0]),), None), 1, "t")] for v in inner
                                      if v.shape[0] % mesh.axis_size(names[0]) == 0]
    for seeds in sets:
        full = template.with_seeds(seeds)
        full.__class__ = _FullSweep
        _assert_same_run(template.with_seeds(seeds).run(), full.run(), graph)


def _terms(tables, prop):
    """Per term of one candidate: (seconds, bytes, the latency its group charges) (what the
    sums add, whatever the order rows and groups were made in)."""
    import numpy as np

    idx = tables.indices(prop)
    groups = tables.groups[idx]
    alpha = np.append(tables.alpha, np.nan)[groups]  # (index -1, no group: nan)
    return [tuple(x) for x in np.concatenate([tables.table[idx], alpha], axis=1)]


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", MERGING, ids=[r[0] for r in MERGING])
def test_tables_memoised_op_rows_equal_fresh_tables(name, fn, shapes, mesh_shape, names):
    """tables.py ``indices``: an op's rows memoised on (projection, its values' keys) across
    candidates give every term the row that tables with nothing memoised give it, in either
    order of the candidates (an operand resharded twice to one target paid once)."""
    from gspmd_py.search.tables import CostTables

    mesh = gp.Mesh(mesh_shape, names)
    graph = _graph(fn, shapes, mesh)
    hw = gp.Hardware.preset("h100-node")
    template = Propagation(graph, mesh, [])
    props = [template.with_seeds(s).run() for s in _seed_sets(graph, mesh)]
    fresh = [_terms(CostTables(graph, mesh, hw), p) for p in props]
    shared = CostTables(graph, mesh, hw)
    for order in (range(len(props)), reversed(range(len(props)))):
        for i in order:
            assert str(_terms(shared, props[i])) == str(fresh[i])  # (str: nan == nan)
    assert len(shared._block_rows) > len(shared._block_layout())  # (candidates met other rows)


def test_class_memoised_decisions_equal_the_state_loop():
    """decide.py: a state's decisions as the union of its classes' memoised answers equal the
    one loop over the state's actions (the point classes share no value)."""
    from gspmd_py.search.context import Leaf, TacticContext
    from gspmd_py.search.decide import Decider
    from gspmd_py.search.points import point_classes

    name, fn, shapes, mesh_shape, names = next(r for r in REFERENCE if r[0] == "block_grad")
    mesh = gp.Mesh(mesh_shape, names)
    graph = _graph(fn, shapes, mesh)
    ctx = TacticContext(graph, mesh, [Leaf(i, "", f"arg{i}") for i in range(len(graph.inputs))], [])
    classes = point_classes(ctx)
    by_class, one_loop = Decider(ctx, classes, names, True), Decider(ctx, classes, names, True)
    assert by_class._disjoint
    one_loop._disjoint = False
    acts = [(c, d, a) for c, pc in enumerate(classes) for d in range(len(pc.shape)) for a in names]
    states = [(a,) for a in acts] + list(itertools.combinations(acts, 2)) + list(itertools.combinations(acts, 3))[:400]
    legal = 0
    for st in states:
        st = by_class.canon(st)
        got, want = by_class.decisions(st), one_loop.decisions(st)
        assert got == want and (got is None or list(got) == list(want))
        legal += got is not None
    assert 0 < legal < len(states)


def test_search_runs_with_young_collections_only(monkeypatch):
    """collector.py: the search turns the automatic collector off, collects the young
    generations before each program it builds, and turns the collector back on; a
    collector the caller turned off stays off and is never run."""
    import gc

    calls = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: (calls.append((a, gc.isenabled())), real(*a))[1])
    name, fn, shapes, mesh_shape, names = REFERENCE[0]
    mesh = gp.Mesh.abstract(mesh_shape, names)
    args = [S(s, jnp.float32) for s in shapes]
    assert gc.isenabled()
    res = gp.auto_shard(fn, mesh, *args, hardware=gp.Hardware.preset("h100-node"))
    assert gc.isenabled()
    young = [c for c in calls if c == ((1,), False)]
    assert len(young) == res.search.programs > 1 and young == calls
    calls.clear()
    gc.disable()
    try:
        gp.auto_shard(fn, mesh, *args, hardware=gp.Hardware.preset("h100-node"), seed=1)
        assert not gc.isenabled() and calls == []
    finally:
        gc.enable()
