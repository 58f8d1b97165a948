"""``gp.auto_shard`` over open pipelines: which schedule, if any, for a stack of layers.

A pipeline schedule is a different traced program (frontend/pipeline.py writes the loop at
trace time), so the sharding search, which works on one traced graph, cannot switch it on.
When the function calls ``gp.pipeline`` with no schedule (an open pipeline: a stack of L
layers over a batch of B rows), ``gp.auto_shard`` compares programs:

1. no pipeline: the layers in sequence, searched over every mesh axis as usual (full search);
2. each schedule that applies: a mesh axis of size S > 1 that divides every open pipeline's L
   (R = L / S circular repeats), and M = S, 2S or 4S microbatches (``MICROBATCH_FACTORS``)
   dividing every B (M >= S, as R > 1 needs); the program traced with
   ``gp.tactics.pipeline(axis, M)``, the other axes searched by an auto tactic (the pipe axis
   is the pipeline's). Each is first screened: a search stopped after ``SCREEN_EVALUATIONS``
   candidates (its start states, replicated, data parallel, FSDP, Megatron... over the other
   axes, then what its beam reaches within that count), the plan built;
3. the ``FINALISTS`` schedules whose screened plans are predicted fastest are searched in full
   (the same ``max_evaluations`` as the search without a pipeline);
4. the plan predicted fastest (every one returned fits ``memory_limit``: a search raises
   MemoryLimitError otherwise) wins; on a tie, no pipeline.

Budgets are counts (evaluations, schedules), so the result depends only on the inputs and the
seed (``time_budget_s``, the safety cap, applies to each search). A schedule whose program cannot be built or searched (an error, or no plan under the
memory limit) is skipped and counted in ``res.report()``, never fatal; only when nothing fits
at all is the no-pipeline search's error raised, with what the schedules gave.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs

from ..core.errors import ShardingError, first_line as _said
from ..frontend.pipeline import OpenPipeline, Schedule
from ..core.mesh import Mesh
from ..search.result import MemoryLimitError

MICROBATCH_FACTORS = (1, 2, 4)  # microbatches M = k * S per schedule tried
SCREEN_EVALUATIONS = 32  # a screen: the search's start states and a round or two of its beam, no more
FINALISTS = 2  # schedules searched in full after the screen


@attrs.frozen
class PipelineTrial:
    """One program ``gp.auto_shard`` priced for the open pipelines: no pipeline (``axis`` "")
    or a schedule over ``axis``; how far it went ("searched", "screened", "skipped"), its
    built plan's predicted step and peak, and why it was skipped."""

    axis: str
    microbatches: int
    schedule: Optional[Schedule]
    stage: str
    step_s: float = float("inf")
    peak_bytes: float = 0.0
    note: str = ""

    @property
    def name(self) -> str:
        if self.schedule is None:
            return "no pipeline"
        s = self.schedule
        return f"pipeline({self.axis!r}, microbatches={self.microbatches}): {s.stages}x{s.microbatches}x{s.repeats}"


def schedules_for(found: Sequence[OpenPipeline], mesh: Mesh) -> tuple[list, list[str]]:
    """The schedules that apply to every open pipeline of ``found`` on ``mesh``:
    [(axis, microbatches, Schedule of the first pipeline)], and why each axis gave none."""
    out, why = [], []
    for axis, S in zip(mesh.axis_names, mesh.shape):
        if S < 2:
            why.append(f"axis {axis!r} has size {S}")
            continue
        bad = [p for p in found if p.layers % S]
        if bad:
            why.append(f"{bad[0].layers} layers do not split into the {S} stages of axis {axis!r}")
            continue
        ms = [k * S for k in MICROBATCH_FACTORS if all(p.batch % (k * S) == 0 for p in found)]
        if not ms:
            why.append(f"batch {found[0].batch} does not split into {S} microbatches (axis {axis!r})")
            continue
        out += [(axis, m, Schedule(S, m, found[0].layers // S)) for m in ms]
    return out, why


def _shape(s: Schedule) -> str:
    return (f"{s.stages} stages x {s.microbatches} microbatches x {s.repeats} repeats ({s.iterations} iterations, "
            f"bubble {s.bubble:.1%})")


def _trial(axis: str, m: int, sched, stage: str, res) -> PipelineTrial:
    return PipelineTrial(axis, m, sched, stage, res.cost.step_s, res.cost.peak_memory_bytes)


def choose(found: Sequence[OpenPipeline], mesh: Mesh, one: Callable, max_evaluations: Optional[int]):
    """The AutoResult of the cheapest program among no pipeline and the schedules that apply
    (see the module docstring); ``one(max_evaluations, prefix tactics)`` runs one search."""
    from ..search.tactics import Pipeline

    trials: list[PipelineTrial] = []
    best = None  # (step, order, AutoResult)
    base_error = None
    try:
        base = one(max_evaluations)
        trials.append(_trial("", 0, None, "searched", base))
        best = (base.cost.step_s, 0, base)
    except Exception as e:  # noqa: BLE001 - said at the end if no schedule does better
        base_error = e
        trials.append(PipelineTrial("", 0, None, "skipped", note=_said(e)))
    cands, why = schedules_for(found, mesh)
    screened = []
    for i, (axis, m, sched) in enumerate(cands):
        try:
            res = one(SCREEN_EVALUATIONS, (Pipeline(axis, m),))
        except Exception as e:  # noqa: BLE001 - an unbuildable schedule is skipped and counted
            trials.append(PipelineTrial(axis, m, sched, "skipped", note=_said(e)))
            continue
        screened.append((res.cost.step_s, i, axis, m, sched, len(trials)))
        trials.append(_trial(axis, m, sched, "screened", res))
    for step, i, axis, m, sched, at in sorted(screened)[:FINALISTS]:
        try:
            res = one(max_evaluations, (Pipeline(axis, m),))
        except Exception as e:  # noqa: BLE001 - the screen's plan stands in the table; this one is not kept
            trials[at] = attrs.evolve(trials[at], note=f"full search failed: {_said(e)}")
            continue
        trials[at] = _trial(axis, m, sched, "searched", res)
        if best is None or (res.cost.step_s, 1 + i) < best[:2]:
            best = (res.cost.step_s, 1 + i, res)
    if best is None:
        raise _nothing_fits(base_error, trials, why) from base_error
    res = best[2]
    return attrs.evolve(res, pipelines=tuple(trials), pipeline_text=_verdict(res, trials, why, found))


def _verdict(res, trials: list[PipelineTrial], why: list[str], found) -> str:
    """Which schedule was chosen, or why none was."""
    n = len(found)
    what = (f"{n} open gp.pipeline call{'s' if n > 1 else ''} ({found[0].layers} layers, batch "
            f"{found[0].x_type})")
    base = next((t for t in trials if t.schedule is None and t.stage == "searched"), None)
    piped = [t for t in trials if t.schedule is not None and t.stage != "skipped"]
    skipped = sum(t.stage == "skipped" for t in trials if t.schedule is not None)
    tail = f"; {skipped} schedule{'s' if skipped != 1 else ''} skipped (unbuildable or over the memory limit)" \
        if skipped else ""
    if res.pipeline is not None:
        t = next(t for t in trials if t.axis == res.pipeline.axis and t.microbatches == res.pipeline.microbatches)
        vs = (f"vs {base.step_s * 1e3:.4g} ms without a pipeline" if base is not None
              else "no plan without a pipeline fits")
        return (f"pipeline chosen for {what}: {_shape(t.schedule)} over mesh axis {t.axis!r} "
                f"(gp.tactics.pipeline({t.axis!r}, {t.microbatches})); predicted {t.step_s * 1e3:.4g} ms, {vs}{tail}")
    if not piped and not skipped:
        return f"no pipeline for {what}: no schedule applies ({'; '.join(why)})"
    if not piped:
        return (f"no pipeline for {what}: every schedule that applies was skipped ({skipped}: unbuildable or over "
                f"the memory limit; the table says why)")
    b = min(piped, key=lambda t: t.step_s)
    return (f"no pipeline for {what}: the best pipelined plan, {_shape(b.schedule)} over mesh axis {b.axis!r}, is "
            f"predicted {b.step_s * 1e3:.4g} ms vs {res.cost.step_s * 1e3:.4g} ms without{tail}")


def _nothing_fits(base_error: BaseException, trials, why) -> BaseException:
    """No program built: the no-pipeline search's error (a MemoryLimitError stays one), with what
    the schedules gave; an error that is no ShardingError (a bug) as it was."""
    if not isinstance(base_error, ShardingError):
        return base_error
    tried = "; ".join(f"{t.name}: {t.note}" for t in trials if t.schedule is not None) or \
        ("no schedule applies: " + "; ".join(why))
    kind = MemoryLimitError if isinstance(base_error, MemoryLimitError) else ShardingError
    return kind(f"{base_error}\npipeline schedules tried for the open gp.pipeline calls: {tried}")
