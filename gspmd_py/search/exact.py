"""The exact search inside ``gp.auto_shard`` (issue 37): the MILP over per-value layouts and
per-op strategies (ilp_space.py, ilp_build.py, ilp_solve.py), its solution said as a search
state (seeds: the inputs' and matmul results' layouts, as the search's decisions are), then
built and priced by the normal path (optimizer.py's ``evaluate``).

The hand plans' propagations (priced first, as the search's start states) put their layouts
and projections into the space, so every hand plan is a point the solver can reach; the
search's start states and hill climbing stay as the fallback, and the final pick is the best
priced of all. A solved plan whose priced peak memory is over the limit is solved again with
the limit lowered by the overshoot (the MILP bounds memory by the arguments and outputs
only), at most ``MEMORY_RETRIES`` times.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import attrs

from .context import returned_state
from .ilp_build import Builder, Problem
from .ilp_solve import MAX_VARIABLES, NODE_LIMIT, Solution, solve

MEMORY_RETRIES = 2
NARROW_AT = 20_000  # a problem with more variables is built again over the narrow space


@attrs.frozen
class ExactResult:
    """What the exact search did: the solver's status, its plan as a state, times."""

    status: str  # Solution.status, or "skipped: why"
    state: Optional[tuple]  # the solved plan as the search's actions (None: no solution)
    objective_s: float  # the MILP's cost of its plan (the tables' terms), seconds
    variables: int = 0
    nodes: int = 0
    groups: int = 0  # nodes of the problem (tied groups of values and ops)
    instances: int = 0  # the values' groups and ops they stand for
    build_s: float = 0.0  # building the problem (the hand plans priced before: ``starts_s``)
    solve_s: float = 0.0
    starts_s: float = 0.0
    solves: int = 0

    def text(self) -> str:
        if self.state is None:
            return f"exact search (MILP): {self.status}"
        stop = {"optimal": "solved to optimality", "nodes": f"stopped by its work budget ({NODE_LIMIT} nodes)",
                "time": "stopped by the time cap (time_budget_s)"}.get(self.status, self.status)
        return (f"exact search (MILP, HiGHS): {stop}; {self.groups} tied nodes for {self.instances} values' groups "
                f"and ops, {self.variables} variables, {self.nodes} branch-and-bound nodes, "
                f"{self.solves} solve{'s' if self.solves != 1 else ''}; its plan costs {self.objective_s * 1e3:.4g} ms "
                f"by the cost tables (CPU: hand plans priced {self.starts_s:.2f} s, problem built {self.build_s:.2f} s, "
                f"solved {self.solve_s:.2f} s)")


def problem(search, props: Sequence) -> Problem:
    """The MILP's problem for ``search`` (optimizer.py's _Search), the hand plans' ``props`` in
    it; past ``NARROW_AT`` variables, the narrow space (one sharded dim per layout, one sharded
    factor per strategy, and the hand plans' choices)."""
    ctx = search.ctx
    fixed = {sd.value.id: sd.dims for sd in ctx.base_seeds}
    p = Builder(ctx.graph, ctx.mesh, search.axes, search.tables, props, fixed, returned_state(ctx)).build()
    if p.variables > NARROW_AT:
        p = Builder(ctx.graph, ctx.mesh, search.axes, search.tables, props, fixed, returned_state(ctx),
                    narrow=True).build()
    return p


def to_state(search, p: Problem, choice) -> tuple:
    """The solution as actions on the search's point classes (each class's first value's
    layout), those that apply together (Decider: legal) kept, in order. An intermediate
    class's actions are kept only where propagation from the inputs' actions does not give
    its layout already (no redundant annotation)."""
    per_class = []
    for c, pc in enumerate(search.classes):
        n = p.value_node.get(pc.values[0])
        if n is None or p.kinds[n] != "group" or len(p.choices[n][choice[n]]) != len(pc.shape):
            continue
        lay = p.choices[n][choice[n]]
        per_class.append((c, lay, [(c, d, a.name) for d, axes in enumerate(lay) for a in axes
                                   if a.whole and a.name in search.axes]))
    state = _legal(search, (), [a for c, _, acts in per_class if search.classes[c].is_input for a in acts])
    inter = [(c, lay, acts) for c, lay, acts in per_class if not search.classes[c].is_input]
    if inter:
        try:
            prop = search.pricer.propagate(search.seeds(state))
        except Exception:  # noqa: BLE001 - unbuildable: the inputs' actions alone are the answer's floor
            return state
        names = frozenset(search.axes)
        for c, lay, acts in inter:
            v = search.ctx.value(search.classes[c].values[0])
            if tuple(tuple(a for a in d if a.name in names) for d in prop.dims_of(v)) != lay:
                state = _legal(search, state, acts)
    return state


def _legal(search, state: tuple, acts) -> tuple:
    for a in acts:
        if search.legal(state, a):
            state = search.canon(state + (a,))
    return state


def run(search, starts: Sequence[tuple], node_limit: int = NODE_LIMIT) -> ExactResult:
    """Solve, price the solution (``search.evaluate``), solve again under a lower memory bound
    while its priced peak is over the limit (see the module docstring)."""
    t0 = time.process_time()
    props = []
    for st in starts:
        got = search.evaluate(st)
        prop = search.exact.get(search.canon(st))
        if got[1].built and prop is not None:
            props.append(prop)
    if search.tables is None:
        return ExactResult("skipped: no cost tables", None, float("inf"))
    priced = time.process_time() - t0
    t0 = time.process_time()
    try:
        p = problem(search, props)
    except Exception as e:  # noqa: BLE001 - the fallback search still runs
        search.skip(e)
        return ExactResult(f"skipped: the problem could not be built ({type(e).__name__}: {e})", None, float("inf"),
                           build_s=time.process_time() - t0)
    build = time.process_time() - t0
    limit = search.memory_limit
    solve_s, solves, best = 0.0, 0, None
    sol: Optional[Solution] = None
    for _ in range(MEMORY_RETRIES + 1):
        left = max(1.0, search.deadline - time.process_time())  # (the CPU-time cap: a safety net)
        sol = solve(p, limit, node_limit=node_limit, time_limit=left)
        solve_s += sol.seconds
        solves += 1
        if sol.choice is None:
            if sol.status == "too large":
                return ExactResult(f"skipped: {sol.variables} variables, over the work budget "
                                   f"({MAX_VARIABLES}): the fallback search alone", None, float("inf"),
                                   sol.variables, 0, len(p.kinds), sum(p.instances), build_s=build, starts_s=priced)
            break
        state = to_state(search, p, sol.choice)
        got = search.evaluate(state)
        best = (state, sol)
        if search.memory_limit is None or got[1].fits or not got[1].built:
            break
        args = sum(float(p.memory[i][c]) for i, c in enumerate(sol.choice))
        over = got[1].price.peak_memory_bytes - search.memory_limit
        limit = min(limit, args) - max(over, 0.01 * search.memory_limit)
        if limit <= 0:
            break
    if best is None:
        return ExactResult(sol.status if sol is not None else "no solve", None, float("inf"), sol.variables if sol else 0,
                           sol.nodes if sol else 0, len(p.kinds), sum(p.instances), build_s=build, solve_s=solve_s,
                           solves=solves, starts_s=priced)
    state, sol = best
    return ExactResult(sol.status, state, sol.objective_s, sol.variables, sol.nodes, len(p.kinds), sum(p.instances),
                       build_s=build, solve_s=solve_s, solves=solves, starts_s=priced)


def relayouts(search, state) -> tuple:
    """(input, its layout, the returned state's layout, seconds of the re-layout) for each
    returned state (context.returned_state) that comes back in another layout than its
    input's under ``state``: what a training loop pays per step (the cost tables' reshard
    price, the re-layout of the returned state back to the input's layout)."""
    from ..core.sharding import Sharding

    ctx = search.ctx
    pairs = returned_state(ctx)
    if not pairs or search.tables is None:
        return ()
    prop = search.exact.get(state)
    if prop is None:
        try:
            prop = search.pricer.propagate(search.seeds(state))
        except Exception:  # noqa: BLE001 - an unbuildable plan has no layouts to compare
            return ()
    out = []
    for vin, vout in pairs:
        v, o = ctx.value(vin), ctx.value(vout)
        a, b = prop.dims_of(v), prop.dims_of(o)
        if a != b:
            sec = search.tables.reshard_cost(v.shape, v.dtype.itemsize, b, a, False)[0]
            out.append((ctx.label(v), Sharding.of(ctx.mesh, a).shardy(), Sharding.of(ctx.mesh, b).shardy(), float(sec)))
    return tuple(out)


@attrs.frozen
class HandPoint:
    """A hand plan pinned in the exact search's problem: the tables' price of its propagation,
    and the MILP's cost of it (None: the solver found it infeasible)."""

    name: str
    tables_s: float
    milp_s: Optional[float]
    model_s: float  # the cost model's price of the plan's program (the traced pricer)


def pinned(p: Problem, prop, names) -> dict:
    """node -> (index,) of the choice ``prop`` (a plan's propagation) makes there."""
    from .ilp_space import proj_key

    fix: dict = {}
    for vid, n in sorted(p.value_node.items()):
        if n in fix:
            continue
        v = prop.values.get(vid)
        if v is None:
            continue
        lay = tuple(tuple(a for a in d if a.name in names) for d in prop.dims_of(v))
        fix[n] = tuple(i for i, c in enumerate(p.choices[n]) if c == lay)
    for oid, n in sorted(p.op_node.items()):
        if n in fix:
            continue
        k = proj_key(prop.projections[oid])
        fix[n] = tuple(i for i, c in enumerate(p.choices[n]) if proj_key(c) == k)
    return fix


def hand_points(search, hand: Sequence[tuple]) -> list[HandPoint]:
    """Each hand plan (name, state) priced, then pinned in the problem (every node's choice
    fixed to what its propagation makes there) and solved: a point the solver reaches when
    it is feasible, its cost beside the tables' and the cost model's."""
    starts = [()] + [st for _, st in hand]
    props = []
    for st in starts:
        search.evaluate(st)
        props.append(search.exact.get(search.canon(st)))
    p = problem(search, [q for q in props if q is not None])
    out = []
    for (name, st), prop in zip(hand, props[1:]):
        if prop is None:
            continue
        got = solve(p, None, fix=pinned(p, prop, frozenset(search.axes)))
        tab = float(search.tables.price([prop])[0][0])
        out.append(HandPoint(name, tab, None if got.choice is None else got.objective_s,
                             search.evaluate(st)[1].price.step_s))
    return out
