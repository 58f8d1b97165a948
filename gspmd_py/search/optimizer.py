"""The search over shardings: automap-style actions, priced by propagation + the cost model.

An action is "shard dim d of point class c over mesh axis a" (points.py: an open input or a
dot/conv result; a class decides repeated layers at once). A state is a set of actions; its
price comes from running propagation with the state's seeds on top of the earlier tactics'
and the user's, then the cost model over the per-device program (price.py; no XLA
compile, memoised by the propagated shardings). Score: predicted step (serial), then
collective bytes, then fewer actions; a state whose peak memory is over ``memory_limit``
is rejected.

Method, deterministic for a seed:

0. the exact search (exact.py, ``EXACT``): the hand-written plans priced, then a MILP over
   every value's layout and every op's strategy (their layouts and projections among the
   choices: each is a point the solver reaches), priced by the cost tables' terms and solved
   by HiGHS within a node budget; its plan, said as actions, joins the start states (always
   priced); the steps below are the fallback and polish, and the best priced plan wins;
1. start states: nothing decided (replicated over the searched axes), and the hand-written
   plans as starting points (data parallel, Megatron, and both on 2+ axes; baselines.py);
2. beam search (width 2) over the input actions: expand every state of the beam by every
   legal action, keep the best distinct (by propagated shardings) states, until the beam
   stops improving;
3. hill climbing from the best state over every action (intermediate annotations too) and
   drops, first improvement in a seeded order; then, when ``RUNNERS_UP`` > 0, from the
   runners-up (the ``RUNNERS_UP`` best distinct start states and beam states not climbed yet:
   other families of plans), within ``RUNNERS_UP_SHARE`` times the work done so far. Off by
   default: the wider search finds plans predicted faster that exploit the cost model's errors
   (docs/performance.md, appendix);
4. restarts: perturb the best state (drop an action, add a random one; ``random.Random(seed)``)
   and hill-climb (as 3); stop after 3 restarts without a better state, or once the restarts
   have evaluated half as many new states (priced or ranked by the tables: each is propagated)
   as steps 1-3 did (a count, not a clock: the result stays the same on a slower machine; the
   restarts add at most half the search's work).

Pre-screen (``SCREEN``, on by default; tables.py): in steps 2-4 a neighbour is first
propagated and priced by the cost tables (per-op compute, per-edge resharding and per-result
partial-sum terms over its propagation, summed by one kernel), and only the best are priced
for real: per beam round the ``SCREEN_BEAM`` best children by the tables; per hill-climbing
round the moves, in their seeded order, go through the tables in chunks of ``SCREEN_CHUNK``,
those the tables predict better than the current state are priced in the tables' order, the
first that prices better wins, and the round gives up after ``SCREEN_CLIMB`` priced no better.
Every score the search keeps is the traced pricer's; the tables only choose what to price.

Speed, same results: what the search repeats is memoised. Propagation starts with every op
clean (only ops a seed or a change reaches are visited), interns each value's key per graph
and memoises each visit's projection and record (propagation/engine.py's ``_Memo``); a state's
decisions and seeds are memoised (decide.py); a state the tables ranked once is never
propagated again for them (its propagation is kept, with the last ``KEEP_PROPAGATIONS``, for
pricing); the combiner checks cycles on group dependency bitsets (program/combine.py); the
search runs with young garbage collections only (collector.py).
tests/search/test_search_speed.py checks that each gives the results of the plain code; the
measurements are in docs/performance.md's appendix.

Incremental pre-screen (``INCREMENTAL``, off by default): a neighbour the tables rank is
propagated from the kept exact propagation of the largest state it extends, by
``Propagation.extend`` (only the ops its new seeds reach are visited and re-recorded); a
priced candidate is always propagated afresh. An extended propagation is not always the
fresh one (a fresh run lets the new seeds claim dims before the base's seeds reach them at a
higher op level), so the ranking, and with it which candidates get priced, can change
(tests/search/test_auto_incremental.py). Off, so that results stay those of the full search.

Budgets. The search stops after ``max_evaluations`` candidate states (those priced plus those
the tables ranked): a count, so the result depends only on the program, the hardware and the
seed, never on the machine's speed or load. ``time_budget_s`` stays as a safety cap checked
between candidates, on this process's CPU seconds (a busy machine slows the wall clock, not
the CPU time a search takes); a search that hits it says so in ``res.report()`` (its result then
depends on the machine's speed). Progress goes to stderr when it is a terminal and the
search runs longer than 2 s.

Robustness: a candidate whose propagation or per-device program fails (the partitioner
cannot build it) is skipped, never fatal: it scores worse than any built one, and the
result counts the skips by reason (``SearchResult.skipped``, said in ``res.report()``).

``hardware=None`` (``search`` called directly): ``gp.Hardware.preset("h100-node")`` (8 H100s
on NVLink). ``gp.tactics.auto`` and ``gp.auto_shard`` pass the mesh's devices' hardware
(tactics.auto_hardware, cost/machine.py) unless given one.
"""
from __future__ import annotations

import collections
import random
import sys
import time
from typing import Optional, Sequence

from ..core.errors import ShardingError
from .baselines import baseline_states
from .collector import young_only
from .decide import Decider
from .exact import relayouts, run as exact_run
from .context import TacticContext
from .points import point_classes
from .price import Price, Pricer
from .result import MAX_EVALUATIONS, Action, Candidate, MemoryLimitError, SearchResult, bytes_text
from .tables import CostTables

__all__ = ["Action", "Candidate", "MAX_EVALUATIONS", "MemoryLimitError", "SearchResult", "bytes_text", "search"]

BEAM = 2
PATIENCE = 3
RUNNERS_UP = 0  # start states and beam states climbed after the best one (runners_up; off: see step 3)
RUNNERS_UP_SHARE = 2.0  # their climbs evaluate at most this share of the states the search had evaluated
RESTART_SHARE = 0.5  # the restarts evaluate (price or rank) at most this share of the states steps 1-3 did
# the pre-screen (tables.py): neighbours are ranked by the cost tables over their propagation,
# and only the best are priced for real: per beam round the SCREEN_BEAM best children, per
# hill-climbing round moves in table order until SCREEN_CLIMB of them priced no better
SCREEN = True
SCREEN_BEAM = 3 * BEAM
SCREEN_CLIMB = 3
SCREEN_CHUNK = 8
KEEP_PROPAGATIONS = 64  # ranked states' propagations kept for pricing (rank, keep), and exact bases
# the pre-screen propagates a neighbour from the kept exact propagation of a state it extends
# (Propagation.extend: only what the new seeds reach); the traced pricer propagates afresh
INCREMENTAL = False
EXACT = True  # the exact search (exact.py: a MILP) first; its plan joins the start states
UNEVEN = True  # actions may split a dim its shards do not divide (padded; context.fair_split)




class _Search:
    def __init__(self, ctx: TacticContext, axes: Sequence[str], hw, memory_limit, budget: float, seed: int,
                 who: str, screen: Optional[bool] = None, max_evaluations: int = MAX_EVALUATIONS):
        self.ctx, self.axes, self.hw = ctx, tuple(axes), hw
        self.memory_limit = memory_limit
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.deadline = time.process_time() + budget  # CPU seconds: other processes' load does not move it
        self.rng = random.Random(seed)
        self.who = who
        self.classes = point_classes(ctx)
        self.pricer = Pricer(ctx.graph, ctx.mesh, hw, ctx.donate, ctx.combine_threshold_bytes, ctx.passes)
        self.memo: dict = {}  # state -> (score, Candidate, fingerprint)
        self.actions = [(c, d, a) for c, pc in enumerate(self.classes) for d in range(len(pc.shape))
                        for a in self.axes]
        self.input_actions = [x for x in self.actions if self.classes[x[0]].is_input]
        self._shown = 0.0
        self.cap = float("inf")  # evaluation cap, set when the restarts begin
        self._tty = sys.stderr.isatty()
        self.screen = SCREEN if screen is None else screen
        self.tables = None
        self.skipped: dict = {}  # reason -> candidates skipped for it
        self.decider = Decider(ctx, self.classes, self.axes, UNEVEN)
        self._seeds: dict = {}  # canonical state -> its seeds (memo)
        if self.screen:
            try:
                self.tables = CostTables(ctx.graph, ctx.mesh, hw)
            except Exception as e:  # noqa: BLE001 - the tables only rank: search without them
                self.skip(e)
                self.screen = False
        self.tscore: dict = {}  # state -> the tables' score (pre-screen)
        self.targs: dict = {}  # state -> its arguments' local bytes (the tables' memory bound)
        self.props: collections.OrderedDict = collections.OrderedDict()  # state -> propagation (keep)
        self.exact: collections.OrderedDict = collections.OrderedDict()  # state -> fresh propagation (bases)
        self.extended = 0  # propagations extended from a base (INCREMENTAL)
        self.screened = 0  # states ranked by the tables
        self.max_evaluations = int(max_evaluations)
        self.stopped_by = ""

    # -- states ----------------------------------------------------------------------
    def canon(self, state) -> tuple:
        return self.decider.canon(state)

    def decisions(self, state) -> Optional[dict]:
        return self.decider.decisions(state)

    def legal(self, state, action) -> bool:
        return self.decider.legal(state, action)

    def describe(self, state) -> str:
        if not state:
            return ("nothing more (replicated over " + ",".join(self.axes) + ")" if self.axes
                    else "nothing more (no mesh axis left to search)")
        parts = []
        for c, d, a in state:
            pc = self.classes[c]
            k = pc.roots or len(pc.values)
            n = f" (x{k})" if k > 1 else ""
            parts.append(f"{pc.what}{n} dim {d} on {a}")
        return "; ".join(parts)

    # -- pricing ----------------------------------------------------------------------
    def out_of_time(self) -> bool:
        """Past a budget: ``max_evaluations`` states (deterministic), or the time cap (safety)."""
        if self.stopped_by:
            return True
        if self.work() >= self.max_evaluations:
            self.stopped_by = "evaluations"
        elif time.process_time() > self.deadline:
            self.stopped_by = "time"
        return bool(self.stopped_by)

    def work(self) -> int:
        """Candidate states evaluated so far: priced, plus ranked by the tables (each propagated)."""
        return len(self.memo) + self.screened

    def skip(self, e: BaseException) -> None:
        """Count a candidate the partitioner could not build (by the error's type and first line)."""
        line = (str(e).strip().splitlines() or [""])[0]
        reason = f"{type(e).__name__}: {line[:160]}" if line else type(e).__name__
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def evaluate(self, state, prop=None) -> tuple:
        state = self.canon(state)
        got = self.memo.get(state)
        if got is not None:
            return got
        try:
            price, prop = self.pricer.price(self.seeds(state), prop)
            key = self.pricer.last_key
            self.exact[state] = prop
            while len(self.exact) > KEEP_PROPAGATIONS:
                self.exact.popitem(last=False)
        except Exception as e:  # noqa: BLE001 - any failure to build a candidate skips it
            self.skip(e)
            price, key = Price(float("inf"), 0, 0.0, 0), ("unbuildable", state)
            cand = Candidate(state, self.describe(state), price, False, built=False)
            got = self.memo[state] = ((2, state), cand, key)
            return got
        fits = self.memory_limit is None or price.peak_memory_bytes <= self.memory_limit
        score = ((0, price.step_s, price.comm_bytes, len(state)) if fits
                 else (1, price.peak_memory_bytes, price.step_s, len(state)))
        cand = Candidate(state, self.describe(state), price, fits)
        got = self.memo[state] = (score, cand, key)
        self.progress()
        return got

    def seeds(self, state) -> list:
        got = self._seeds.get(state)
        if got is None:
            got = self._seeds[state] = self.ctx.seeds(self.decisions(state), origin=self.who)
        return got

    def rank(self, states) -> list:
        """``states`` (canonical, legal; repeats dropped) ordered by the cost tables' score
        (stable), each with its propagation when it is not priced yet (None when it is).
        Past the time budget, the states not propagated yet are left out."""
        props, todo = {}, []
        states = list(dict.fromkeys(states))
        for st in states:
            if st in self.tscore:  # ranked before: its score stands, its propagation may be kept
                if st not in self.memo and st in self.props:
                    props[st] = self.props[st]  # (kept only when exact)
                continue
            if self.out_of_time():
                break
            try:
                props[st] = self.propagate(st)
            except Exception as e:  # noqa: BLE001 - any failure skips the candidate
                self.skip(e)
                self.memo[st] = ((2, st), Candidate(st, self.describe(st), Price(float("inf"), 0, 0.0, 0), False,
                                                    built=False), ("unbuildable", st))
                self.tscore[st] = (3, st)
                self.screened += 1
                continue
            todo.append(st)
            if st in self.exact:
                self.keep(st, props[st])
        if todo:
            try:
                tab = self.tables.price([props[st] for st in todo])
            except Exception as e:  # noqa: BLE001 - the tables only rank: fall back to program order
                self.skip(e)
                tab = [(0.0, 0.0)] * len(todo)
            for st, (sec, nb) in zip(todo, tab):
                self.targs[st] = self.tables.argument_bytes(props[st])
                fits = self.memory_limit is None or self.targs[st] <= self.memory_limit
                self.tscore[st] = (0, sec, nb, len(st)) if fits else (1, sec, nb, len(st))
            self.screened += len(todo)
        known = [st for st in states if st in self.tscore]
        exact = lambda st: props.get(st) if props.get(st) is not None and self.exact.get(st) is props[st] else None
        return [(st, exact(st)) for st in sorted(known, key=lambda st: self.tscore[st])]

    def propagate(self, state):
        """``state``'s propagation for the tables: extended from the kept exact propagation of
        the largest state inside it (``INCREMENTAL``: only what the new seeds reach is visited),
        else run afresh (then kept as exact). Only a fresh one is ever priced."""
        seeds = self.seeds(state)
        base = self.base_of(state) if INCREMENTAL else None
        if base is None:
            prop = self.pricer.propagate(seeds)
            self.exact[state] = prop
            while len(self.exact) > KEEP_PROPAGATIONS:
                self.exact.popitem(last=False)
            return prop
        bprop, bseeds = self.exact[base], {(sd.value.id, sd.dims) for sd in self.seeds(base)}
        self.extended += 1
        return bprop.extend([sd for sd in seeds if (sd.value.id, sd.dims) not in bseeds])

    def base_of(self, state):
        """The largest kept exact state whose actions ``state`` holds (ties: the first in
        canonical order), or None."""
        have = set(state)
        best = None
        for b in self.exact:
            if len(b) < len(state) and have.issuperset(b) and (best is None or (-len(b), b) < (-len(best), best)):
                best = b
        return best

    def keep(self, state, prop) -> None:
        """Keep the last ``KEEP_PROPAGATIONS`` propagations of ranked states: a hill-climbing
        round meets the same neighbours again, and prices them from these."""
        self.props[state] = prop
        self.props.move_to_end(state)
        while len(self.props) > KEEP_PROPAGATIONS:
            self.props.popitem(last=False)

    def progress(self, final: bool = False) -> None:
        if not self._tty:
            return
        now = time.perf_counter()
        if now - self.t0 < 2.0 or (not final and now - self._shown < 0.25):
            return
        self._shown = now
        best = min(self.memo.values(), key=lambda g: g[0])[1]
        msg = (f"\r[gspmd_py {self.who}] {len(self.memo)} candidates, {self.pricer.priced} programs, best "
               f"{best.price.step_s * 1e3:.4g} ms{'' if best.fits else ' (over the memory limit)'}, "
               f"{now - self.t0:.1f} s")
        sys.stderr.write(msg + ("\n" if final else ""))
        sys.stderr.flush()

    # -- the optimizer ---------------------------------------------------------------
    def best(self):
        return min(self.memo.values(), key=lambda g: g[0])

    def beam(self, starts, actions) -> None:
        beam = [self.evaluate(s) for s in starts]  # always priced, whatever the budgets: the answer's floor
        beam = self._top(beam)
        while beam and not self.out_of_time():
            children = []
            if self.screen:
                kids = [self.canon(cand.actions + (act,)) for _, cand, _ in beam for act in actions
                        if self.legal(cand.actions, act)]
                for st, prop in self.rank(kids)[:SCREEN_BEAM]:
                    if self.out_of_time():
                        break
                    children.append(self.evaluate(st, prop))
            for _, cand, _ in (() if self.screen else beam):
                for act in actions:
                    if self.out_of_time():
                        break
                    if self.legal(cand.actions, act):
                        children.append(self.evaluate(cand.actions + (act,)))
            new = self._top(beam + children)
            if [g[1].actions for g in new] == [g[1].actions for g in beam]:
                break
            beam = new

    @staticmethod
    def _top(gots) -> list:
        seen, out = set(), []
        for g in sorted(gots, key=lambda g: (g[0], g[1].actions)):
            if g[2] in seen:
                continue
            seen.add(g[2])
            out.append(g)
            if len(out) == BEAM:
                break
        return out

    def runners_up(self, starts) -> None:
        """Climb again from the runners-up: the best ``RUNNERS_UP`` distinct start states and
        states the beam kept, other than the one climbed (different families of plans: the
        climb from the best start can end on a local optimum another family's climb beats),
        within ``RUNNERS_UP_SHARE`` of the work so far (a count: deterministic)."""
        if RUNNERS_UP <= 0:
            return
        climbed = self.best()[2]
        self.cap = int(RUNNERS_UP_SHARE * self.work()) + self.work()
        firsts = [self.evaluate(s) for s in starts]
        beamed = sorted(self.memo.values(), key=lambda g: (g[0], g[1].actions))
        seen, todo = {climbed}, []
        for pool in (firsts, beamed):
            picked = 0
            for g in sorted(pool, key=lambda g: (g[0], g[1].actions)):
                if picked == RUNNERS_UP or not g[1].built:
                    break
                if g[2] not in seen:
                    seen.add(g[2])
                    todo.append(g)
                    picked += 1
        for g in todo:
            if self.out_of_time() or self.work() >= self.cap:
                break
            self.climb(g)

    def restarts(self) -> None:
        stale = 0
        cap = int(RESTART_SHARE * self.work()) + self.work()
        self.cap = cap
        while stale < PATIENCE and not self.out_of_time() and self.work() < cap:
            best_score, best, _ = self.best()
            state = list(best.actions)
            if state and self.rng.random() < 0.7:
                state.pop(self.rng.randrange(len(state)))
            legal = [a for a in self.actions if self.legal(tuple(state), a)]
            if legal:
                state.append(legal[self.rng.randrange(len(legal))])
            cur = self.climb(self.evaluate(tuple(state)))
            stale = stale + 1 if not cur[0] < best_score else 0

    def climb(self, cur):
        """First-improvement hill climbing over add / drop moves, in a seeded random order
        (stops early once the restarts' evaluation cap is reached)."""
        improved = True
        while improved and not self.out_of_time() and self.work() < self.cap:
            improved = False
            moves = [("add", a) for a in self.actions if self.legal(cur[1].actions, a)]
            moves += [("drop", a) for a in cur[1].actions]
            self.rng.shuffle(moves)
            if self.screen:
                cur, improved = self._climb_screened(cur, moves)
                continue
            for kind, a in moves:
                if self.out_of_time() or self.work() >= self.cap:
                    break
                acts = cur[1].actions
                nxt = acts + (a,) if kind == "add" else tuple(x for x in acts if x != a)
                got = self.evaluate(nxt)
                if got[0] < cur[0]:
                    cur, improved = got, True
                    break
        return cur

    def _climb_screened(self, cur, moves) -> tuple:
        """One hill-climbing round: ``moves`` (in their seeded order) go in chunks of
        SCREEN_CHUNK through the tables; in each chunk, the moves the tables predict better
        than ``cur`` are priced in the tables' order, the first that prices better wins. The
        round gives up after SCREEN_CLIMB priced no better. While ``cur`` is over the memory
        limit (its priced peak: the tables bound memory by the arguments only), every move of
        a chunk is priced, those that shrink the arguments' bytes most first."""
        acts = cur[1].actions
        states = [self.canon(acts + (a,) if kind == "add" else tuple(x for x in acts if x != a)) for kind, a in moves]
        here = self.table_score(acts)
        over = not cur[1].fits  # over the memory limit: the tables see arguments only, not the peak
        misses = 0
        for i in range(0, len(states), SCREEN_CHUNK):
            ranked = self.rank(states[i:i + SCREEN_CHUNK])
            if over:  # the moves that shrink the arguments most first, priced whatever their time
                ranked.sort(key=lambda sp: self.targs.get(sp[0], float("inf")))
            for st, prop in ranked:
                if self.out_of_time() or self.work() >= self.cap:
                    return cur, False
                if not over and not self.tscore[st] < here:
                    break
                fresh = st not in self.memo
                got = self.evaluate(st, prop)
                if got[0] < cur[0]:
                    return got, True
                misses += fresh
                if misses >= SCREEN_CLIMB:
                    return cur, False
        return cur, False

    def table_score(self, state) -> tuple:
        state = self.canon(state)
        if state not in self.tscore:
            self.rank([state])
        return self.tscore.get(state, (2,))  # (2,): past the budget, nothing is predicted better

    def run(self, baselines) -> SearchResult:
        starts = [()] + [s for _, s in baselines]
        self.ilp = None
        if EXACT and self.axes:
            self.ilp = exact_run(self, starts)
            if self.ilp.state is not None:
                starts.append(self.ilp.state)
        self.beam(starts, self.input_actions)  # inputs first: they decide the most
        self.climb(self.best())  # then intermediate annotations (and drops) on the best
        self.runners_up(starts)
        self.restarts()
        self.progress(final=True)
        score, best, _ = self.best()
        if not best.built:
            raise ShardingError(
                f"{self.who}: the partitioner could not build any of the {len(self.memo)} candidates over "
                f"{', '.join(self.axes)}: " + "; ".join(f"{n} x {r}" for r, n in sorted(self.skipped.items())))
        if not best.fits:
            raise MemoryLimitError(
                f"{self.who}: no plan over {', '.join(self.axes) or 'no searched axis'} fits "
                f"memory_limit={bytes_text(self.memory_limit)} per "
                f"device ({len(self.memo)} candidates in {time.perf_counter() - self.t0:.1f} s); the smallest peak "
                f"found is {bytes_text(best.price.peak_memory_bytes)} ({best.text}), dominated by "
                + "; ".join(f"{w}: {bytes_text(b)}" for w, b in best.price.top_buffers)
                + ". Shard more axes, raise the limit, or shrink these tensors")
        seen, top = set(), []
        for g in sorted(self.memo.values(), key=lambda g: (g[0], g[1].actions)):
            if g[2] not in seen and g[1].built:
                seen.add(g[2])
                top.append(g[1])
            if len(top) == 5:
                break
        base = tuple((name, self.evaluate(s)[1]) for name, s in baselines)
        copy = lambda d: {vid: [list(x) for x in dims] for vid, dims in d.items()}
        return SearchResult(copy(self.decisions(best.actions)), best, tuple(top), base, len(self.memo),
                            self.pricer.priced, time.perf_counter() - self.t0, self.axes, self.hw.name,
                            self.memory_limit, tuple(self.classes), self.screened,
                            tuple(sorted(self.skipped.items(), key=lambda t: (-t[1], t[0]))), self.stopped_by,
                            self.max_evaluations, tuple(copy(self.decisions(c.actions)) for c in top),
                            self.ilp, None if self.ilp is None or self.ilp.state is None else self.evaluate(self.ilp.state)[1],
                            relayouts(self, best.actions), self.times())

    def times(self) -> tuple:
        """(phase, CPU seconds) of this search: building (pricing candidates, the tables, the
        exact search's problem) and solving (the MILP)."""
        solve = self.ilp.solve_s if self.ilp is not None else 0.0
        return (("build", time.process_time() - self.c0 - solve), ("solve", solve))


def searcher(ctx: TacticContext, axes: Sequence[str], hardware, memory_limit=None, seed: int = 0):
    """A search over ``axes`` of ``ctx`` not run yet, and its hand plans as (name, state): what
    the exact search's tests pin (exact.hand_points)."""
    s = _Search(ctx, axes, hardware, memory_limit, 600.0, seed, "auto")
    return s, [(name, s.canon(st)) for name, st in baseline_states(ctx, s.classes, tuple(axes))]


def search(ctx: TacticContext, axes: Sequence[str], *, hardware=None, memory_limit=None, time_budget_s: float = 30,
           seed: int = 0, who: str = "auto", screen: Optional[bool] = None,
           max_evaluations: int = MAX_EVALUATIONS) -> SearchResult:
    """Search shardings over ``axes`` on top of ``ctx``'s decisions (see the module docstring)."""
    from ..cost import Hardware

    hw = hardware or Hardware.preset("h100-node")
    with young_only() as collect:  # (collector.py: full collections walk the search's tables)
        return _search(ctx, axes, hw, memory_limit, time_budget_s, seed, who, screen, max_evaluations, collect)


def _search(ctx: TacticContext, axes: Sequence[str], hw, memory_limit, time_budget_s: float, seed: int, who: str,
            screen: Optional[bool], max_evaluations: int, collect) -> SearchResult:
    """``search``'s body: its tables are garbage once this returns (before the collector is back
    on: collector.py)."""
    s = _Search(ctx, axes, hw, memory_limit, time_budget_s, seed, who, screen, max_evaluations)
    s.pricer.collect = collect
    try:
        states = baseline_states(ctx, s.classes, tuple(axes)) if axes else []  # no axis: no hand plan
    except Exception as e:  # noqa: BLE001 - the hand plans are starting points: search from nothing
        s.skip(e)
        states = [("replicated", ())]
    baselines = [(name, s.canon(st)) for name, st in states]
    baselines = [(n, st) for n, st in baselines if s.decisions(st) is not None]
    return s.run(baselines)
