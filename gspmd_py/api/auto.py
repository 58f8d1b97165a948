"""``gp.auto_shard``: search the shardings of a whole function, get them back as data.

    res = gp.auto_shard(train_step, mesh, params, batch, hardware=gp.Hardware.preset("h100-node"),
                        memory_limit=16 * 2**30, time_budget_s=30, seed=0)
    res.in_shardings      # a pytree of gp.P like the arguments: ready for gp.spmd
    res.cost.step_s       # the chosen plan, built and costed for real
    print(res.report())   # the best candidates beside replicated / data parallel / Megatron
    out = res.spmd(params, batch)   # runs exactly res.plan
    # the plan as data: gp.spmd builds the same program from it (no search)
    f = gp.spmd(train_step, mesh, in_shardings=res.in_shardings, out_shardings=res.out_shardings,
                tactics=res.rules())

It is ``gp.spmd(fn, mesh, in_shardings, out_shardings, tactics=[gp.tactics.auto(...)])``
planned once: the search (search/optimizer.py) decides over every mesh axis, keeping the fixed
parts of ``in_shardings``; ``res.spmd`` replays its decisions (intermediate annotations
included) without searching again, and so does ``gp.spmd`` given ``res.rules()`` (a tactics
list holding the decisions as plain data: value id, shape and mesh axes per dim), with or
without ``res.in_shardings`` / ``res.out_shardings``.

The result depends only on the function, the arguments' shapes, the mesh, the hardware and
the seed: the search stops after ``max_evaluations`` candidates (search/optimizer.py), and
``time_budget_s`` is a safety cap (CPU seconds of the search) that ``res.report()`` mentions when it cut the search
short. Candidates the partitioner cannot build are skipped and counted in the report. If the
chosen plan then fails to build as a whole plan, the next of the search's best candidates that
builds is kept (replayed from its decisions, no new search) and ``res.report()`` says which
failed and why (``res.fallback``); none builds: a ``gp.ShardingError`` naming them.

    res.constraints()     # [(value, NamedSharding)]: the intermediate annotations, for
                          # jax.lax.with_sharding_constraint under jax.jit (res.jax_shardings())

Pipelines: when ``fn`` calls ``gp.pipeline`` with no schedule (an open pipeline: a stack of
layers), a schedule is a different traced program, so ``gp.auto_shard`` searches several
programs (api/auto_pipeline.py): the plain stack, and each schedule ``gp.tactics.pipeline(axis,
microbatches)`` that applies with the other axes searched; the cheapest plan that fits wins.
``res.pipeline`` is the schedule chosen (None: none), ``res.rules()`` starts with it, and
``res.report()`` says why and lists every program priced (``res.pipelines``).
``time_budget_s`` then caps each of those searches.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any, Callable, Optional

import attrs
import jax

from ..core.errors import NotPicklableError, ShardingError
from ..core.ir import user_name
from ..core.mesh import Mesh
from ..core.sharding import P
from ..plan import Plan
from ..search.optimizer import SearchResult
from ..search.tactics import Decided

# progress through the standard logging module: INFO lines under "gspmd_py" (shown once the
# application configures logging, e.g. logging.basicConfig(level=logging.INFO); silenced by
# logging.getLogger("gspmd_py").setLevel(logging.WARNING)); they work in notebooks and logs alike
log = logging.getLogger("gspmd_py.auto")


@attrs.frozen(repr=False)
class SearchedRules(Decided):
    """The search's decisions as one tactic (``res.rules()``): replayed by value id as a
    ``Decided`` tactic is, and printed by the names a user knows, one ``name: P(...)`` line per
    decision (``names``): an argument's pytree path, a ``gp.tag`` name, or the op that makes
    the value and its source line. ``decisions`` and ``text`` are Decided's."""

    names: tuple = attrs.field(default=(), eq=False)

    def __repr__(self) -> str:
        lines = [f"\n  {name}: {_spec_of(dims)!r}" for name, (_, _, dims) in zip(self.names, self.decisions)]
        if not lines:
            return f"<{self.text}: no decisions (every value left to propagation)>"
        return f"<{self.text}: {len(lines)} decisions, replayed by value id:" + "".join(lines) + ">"


def _spec_of(dims) -> P:
    """A decision's dims (axis-name tuples per dim) as the P that says them."""
    return P(*[None if not d else d[0] if len(d) == 1 else tuple(d) for d in dims])


def _value_names(plan, decisions) -> tuple:
    """Per decision, the name a user knows its value by (see SearchedRules)."""
    inputs = {v.id: n for v, n in zip(plan.graph.inputs, plan.in_names)}
    out = []
    for vid, _, _ in decisions:
        v = plan.prop.values[vid]
        if vid in inputs:
            out.append(inputs[vid])
        elif v.name:
            out.append(v.name)
        else:
            op = v.producer
            at = f" at {os.path.basename(op.source.split(' ', 1)[0])}" if op is not None and op.source else ""
            out.append(f"%{vid} {v.type_str}" + (f" = {user_name(op)}{at}" if op is not None else ""))
    return tuple(out)


@attrs.frozen
class AutoResult:
    """What ``gp.auto_shard`` found (see the module docstring).

    ``in_shardings`` / ``out_shardings``: the chosen boundary (pytrees of gp.Sharding);
    ``plan``: the chosen gp.Plan; ``cost``: its gp.Cost on the search's hardware;
    ``explored``: how many candidates were priced; ``spmd``: a gp.spmd function that runs the
    plan; ``search``: the search's own record; ``decided``: the tactic that replays its
    decisions (``rules()``); ``hardware_text``: which hardware priced the plans and why;
    ``fallback``: "" or which candidate replaced a best plan that failed to build;
    ``pipeline``, ``pipelines``, ``pipeline_text``: the pipeline schedule chosen for open
    ``gp.pipeline`` calls, the schedules priced, and why; ``measured``: the measured tie-break
    (``measure=k``; None when 0): the candidates timed and whether measurement changed the
    choice; ``times``: the search's time split, (phase, seconds) for trace, build, solve (CPU)
    and measure (wall)."""

    in_shardings: Any
    out_shardings: Any
    plan: Plan
    cost: Any  # gp.Cost of plan on the search's hardware
    explored: int
    search: SearchResult
    spmd: Any  # gp.Spmd running plan
    decided: Any = None  # the Decided tactic replaying the search's decisions
    hardware_text: str = ""  # which hardware priced the plans, and why that one
    fallback: str = ""  # "": the search's best plan built; else which failed and which candidate replaced it
    pipeline: Any = None  # the gp.tactics.pipeline schedule of the plan's open gp.pipeline calls (None: none)
    pipelines: tuple = ()  # api/auto_pipeline.py's PipelineTrial per schedule priced (open pipelines only)
    pipeline_text: str = ""  # which schedule was chosen, or why none was (open pipelines only)
    measured: Any = None  # api/auto_measure.py's Measured: the measured tie-break (None: measure=0)
    times: tuple = ()  # (phase, seconds): trace, build, solve (CPU), measure (wall)

    def __copy__(self) -> "AutoResult":
        return self  # frozen

    def __deepcopy__(self, memo) -> "AutoResult":
        """Its fields deep-copied (the plan and the gp.spmd function are themselves, as copies)."""
        fields = attrs.fields(AutoResult)
        return attrs.evolve(self, **{f.name: copy.deepcopy(getattr(self, f.name), memo) for f in fields})

    def __reduce__(self):
        raise NotPicklableError(
            "a gp.AutoResult holds its gp.Plan, which does not pickle; pickle the search's result as data, "
            "res.rules() with res.in_shardings and res.out_shardings, and replay it where it is loaded: "
            "gp.spmd(fn, mesh, in_shardings=..., out_shardings=..., tactics=rules) builds the same program")

    def report(self) -> str:
        """The chosen plan beside the best candidates and every hand-written plan (predicted
        step, peak memory, collectives), why it won, and how the search went (search/autoreport.py)."""
        from ..search.autoreport import report

        return report(self)

    def rules(self) -> list:
        """The plan as a tactics list for ``gp.spmd(fn, mesh, tactics=res.rules())``: the
        search's decisions (inputs and intermediate annotations) as data, replayed as they
        were made; with ``in_shardings=res.in_shardings, out_shardings=res.out_shardings``
        too, gp.spmd builds the same program. A pipelined plan's list starts with its
        ``gp.tactics.pipeline`` schedule (it changes the traced program)."""
        names = _value_names(self.plan, self.decided.decisions)
        return ([self.pipeline] if self.pipeline is not None else []) + [
            SearchedRules(self.decided.decisions, self.decided.text, names)]

    def jax_shardings(self):
        """The plan for ``jax.jit``'s own partitioner: NamedSharding trees for the inputs and
        outputs, the intermediate annotations as constraints, and the program with them in
        (search/jaxrun.py): ``js = res.jax_shardings(); js.jit()(*args)``."""
        from ..search.jaxrun import jax_shardings

        return jax_shardings(self.plan, [vid for vid, _, _ in self.decided.decisions])


    def constraints(self) -> list:
        """The search's intermediate annotations as ``(value, NamedSharding)`` pairs, in value
        order: what to put in ``jax.lax.with_sharding_constraint`` after each of those values
        (the value said by id, type and the op and source line that make it) so that
        ``jax.jit`` with ``res.jax_shardings()``'s in/out shardings runs this plan. Empty when
        the search annotated only inputs."""
        return list(self.jax_shardings().constraints)


def _spec(sharding) -> P:
    return sharding.spec


def auto_shard(fn: Callable, mesh: Mesh, *args, in_shardings=None, out_shardings=None, hardware=None,
               memory_limit: Optional[float] = None, time_budget_s: float = 30, seed: int = 0, static_argnums=(),
               donate_argnums=(), max_evaluations: Optional[int] = None, measure: int = 3) -> AutoResult:
    """Search shardings for ``fn(*args)`` over every axis of ``mesh`` (``args``: arrays or
    jax.ShapeDtypeStruct; an abstract mesh plans for devices this machine does not have).
    ``hardware=None``: the mesh's devices' (cost/machine.py: a GPU's or TPU's preset, CPU
    devices calibrated once and cached on disk; an abstract mesh: h100-node). Raises ``MemoryLimitError`` (a
    gp.ShardingError) when no plan's predicted peak fits ``memory_limit`` bytes per device. Open
    ``gp.pipeline`` calls in ``fn``: pipeline schedules are priced too (module docstring).
    ``measure=k``: on a mesh of this process's devices priced as those devices (``hardware=None``),
    the best ``k`` candidates the cost model cannot separate are compiled and timed, and the
    measured best kept (api/auto_measure.py); 0: the cost model alone decides."""
    from .api import Spmd
    from ..cost.machine import default_hardware

    mesh = _check_call(fn, mesh, hardware)
    if hardware is not None:
        hw, hw_text = hardware, f"hardware {hardware.name} (given)"
    else:
        hw, how = default_hardware(mesh, _largest_bytes(args))
        hw_text = f"hardware {hw.name}: {how}"
    kw = dict(static_argnums=static_argnums, donate_argnums=donate_argnums)

    from .auto_measure import why_not

    if not isinstance(measure, int) or isinstance(measure, bool) or measure < 0:
        raise ShardingError(f"gp.auto_shard: measure must be an int >= 0 (candidates to time), got {measure!r}")
    no_measure = why_not(mesh, hardware is not None) if measure else "measure=0: the cost model alone decides"

    def one(evaluations: Optional[int], prefix: tuple = ()) -> AutoResult:
        return _auto_one(fn, mesh, args, in_shardings, out_shardings, hw, hw_text, kw, prefix,
                         dict(memory_limit=memory_limit, time_budget_s=time_budget_s, seed=seed,
                              max_evaluations=evaluations), (measure, no_measure))

    found = Spmd(fn, mesh, in_shardings, out_shardings, **kw).open_pipelines(*args)
    if not found:
        return one(max_evaluations)
    from .auto_pipeline import choose

    return choose(found, mesh, one, max_evaluations)


def _check_call(fn, mesh, hardware) -> Mesh:
    """``gp.auto_shard``'s function, mesh (a jax.sharding.Mesh converted) and hardware checked
    before the search reads them."""
    from ..cost import Hardware
    from ..core.errors import HardwareError, ShardingError, short_repr

    if not callable(fn):
        raise ShardingError(f"gp.auto_shard: first argument must be the function, got {type(fn).__name__}")
    if isinstance(mesh, jax.sharding.Mesh):
        mesh = Mesh.from_jax(mesh)
    if not isinstance(mesh, Mesh):
        raise ShardingError(f"gp.auto_shard needs a gp.Mesh or a jax.sharding.Mesh as its mesh, got "
                            f"{type(mesh).__name__} {short_repr(mesh, 40)}")
    if hardware is not None and not isinstance(hardware, Hardware):
        hint = f"gp.Hardware.preset({hardware!r})" if isinstance(hardware, str) else "gp.Hardware.preset('h100-node')"
        raise HardwareError(f"gp.auto_shard: hardware must be a gp.Hardware (e.g. {hint}), got "
                            f"{type(hardware).__name__} {short_repr(hardware, 40)}")
    return mesh


def _auto_one(fn, mesh, args, in_shardings, out_shardings, hw, hw_text, kw, prefix: tuple, search_kw,
              measuring: tuple = (0, "")) -> AutoResult:
    """One search: ``gp.spmd`` with ``prefix`` tactics (a pipeline schedule, or none) then an auto
    tactic, planned; the measured tie-break (``measuring``: (k, why not: '' when it may run));
    the AutoResult replays the choice."""
    from .api import Spmd
    from ..search.tactics import auto

    c0 = time.process_time()
    sink: list = []
    tac = attrs.evolve(auto(hardware=hw, **search_kw), sink=sink)
    f = Spmd(fn, mesh, in_shardings, out_shardings, tactics=[*prefix, tac], **kw)
    fallback = ""
    name = getattr(fn, "__name__", type(fn).__name__)
    budget = search_kw.get("max_evaluations")
    log.info("auto_shard(%s) on %s: searching%s, %s; %s", name, mesh,
             f" with {', '.join(map(str, prefix))}" if prefix else "",
             f"up to {budget} candidates" if budget is not None else "the default budget", hw_text)
    t0 = time.perf_counter()
    try:
        plan = f.plan(*args)
        result: SearchResult = plan.tactics[-1].result
    except Exception as e:  # noqa: BLE001 - the search ran: the plan it chose did not build
        if not sink:
            raise  # the search itself failed (said by its own error)
        result, f, plan, fallback = _fallback(sink[-1], e, fn, mesh, in_shardings, out_shardings, args, str(tac), kw,
                                              prefix)
    plan_cpu = time.process_time() - c0
    measured, f, plan, result = _tie_break(measuring, result, f, plan, args, fn, mesh, in_shardings, out_shardings,
                                           str(tac), kw, prefix, hw)
    times = (("trace", max(plan_cpu - sum(t for _, t in result.times), 0.0)),) + tuple(result.times) \
        + (("measure", measured.seconds if measured is not None else 0.0),)
    cost = plan.cost(hw)
    log.info("auto_shard(%s): %d candidates priced in %.1f s; chosen: predicted step %.4g ms, peak %.4g MiB "
             "per device%s", name, result.explored, time.perf_counter() - t0, cost.step_s * 1e3,
             cost.peak_memory_bytes / 2 ** 20, f" ({fallback})" if fallback else "")
    decided = Decided(_as_data(result.decisions, plan), str(tac))
    replay = Spmd(fn, mesh, in_shardings, out_shardings, tactics=[*prefix, decided], **kw)
    replay.reuse_plans(f)  # the plan is built: the replay runs it (other signatures replay the decisions)
    ins = jax.tree_util.tree_map(_spec, plan.in_shardings)
    outs = jax.tree_util.tree_map(_spec, plan.out_shardings)
    return AutoResult(ins, outs, plan, cost, result.explored, result, replay, decided, hw_text, fallback,
                      prefix[0] if prefix else None, measured=measured, times=times)


def _tie_break(measuring: tuple, result, f, plan, args, fn, mesh, in_shardings, out_shardings, text, kw, prefix, hw):
    """api/auto_measure.py over the best candidates the model cannot separate: (Measured or
    None, the Spmd, plan and result of the choice)."""
    from .api import Spmd
    from .auto_measure import TIE, Measured, concrete, measure, record
    from ..core.errors import first_line as said
    from ..search.tactics import Decided

    k, why = measuring
    if k <= 0:
        return None, f, plan, result
    if why:
        return Measured(note=why), f, plan, result
    best = result.best
    cands = [(c, d) for c, d in zip(result.top, result.top_decisions) if c.actions != best.actions and c.built
             and c.fits and c.price.step_s <= best.price.step_s * (1 + TIE)][:k - 1]
    if not cands:
        return Measured(note="no other candidate within 3% of the best: the cost model separates them"), f, plan, \
            result
    cargs = concrete(args)
    spmds, plans = [f], [plan]
    try:
        for c, d in cands:
            g = Spmd(fn, mesh, in_shardings, out_shardings, tactics=[*prefix, Decided(_decided_data(d), text)], **kw)
            plans.append(g.plan(*cargs))
            spmds.append(g)
        runs = [(lambda g=g: jax.block_until_ready(g(*cargs))) for g in spmds]
        m = measure(runs, [best.text] + [c.text for c, _ in cands],
                    [best.price.step_s] + [c.price.step_s for c, _ in cands])
    except Exception as e:  # noqa: BLE001 - measurement is a tie-break: the model's choice stands
        return Measured(note=f"measurement failed ({said(e)}): the cost model's choice stands"), f, plan, result
    where = record(plan.fn_name, mesh, hw.name, m)
    if where:
        m = attrs.evolve(m, note=f"recorded in {where}")
    if not m.changed:
        return m, f, plan, result
    c, d = cands[m.chosen - 1]
    return m, spmds[m.chosen], plans[m.chosen], attrs.evolve(result, best=c, decisions=d)


def _as_data(decisions: dict, plan: Plan) -> tuple:
    """The search's decisions as a ``Decided`` tactic's data: (value id, shape, axis names per dim)."""
    return tuple((vid, plan.prop.values[vid].shape, tuple(tuple(a.name if a.whole else str(a) for a in d)
                                                            for d in dims))
                 for vid, dims in sorted(decisions.items()))


def _fallback(result: SearchResult, error: BaseException, fn, mesh, in_shardings, out_shardings, args, text, kw,
              prefix: tuple = ()):
    """The search's chosen plan failed to build: the next candidates (``result.top``, best
    first) replayed as decisions, the first that builds kept. (result, Spmd, plan, what happened)."""
    from .api import Spmd
    from ..core.errors import ShardingError, first_line as said
    from ..search.tactics import Decided

    failed = [f"{result.best.text} ({said(error)})"]
    for i, (cand, dec) in enumerate(zip(result.top, result.top_decisions)):
        if cand.actions == result.best.actions or not cand.built or not cand.fits:
            continue
        f = Spmd(fn, mesh, in_shardings, out_shardings, tactics=[*prefix, Decided(_decided_data(dec), text)], **kw)
        try:
            plan = f.plan(*args)
        except Exception as e:  # noqa: BLE001 - this candidate does not build either: the next
            failed.append(f"{cand.text} ({said(e)})")
            continue
        note = (f"the search's best plan failed to build ({failed[0]}); fell back to candidate {i + 1}"
                + (f" after {len(failed) - 1} more failed: " + "; ".join(failed[1:]) if len(failed) > 1 else ""))
        return attrs.evolve(result, best=cand, decisions=dec), f, plan, note
    raise ShardingError("gp.auto_shard: no candidate the search found builds as a plan: " + "; ".join(failed)) \
        from error


def _decided_data(decisions: dict) -> tuple:
    """``_as_data`` before a plan exists: no shapes (None: the Decided tactic does not check
    them; the program is the one the search traced)."""
    return tuple((vid, None, tuple(tuple(a.name if a.whole else str(a) for a in d) for d in dims))
                 for vid, dims in sorted(decisions.items()))


def _largest_bytes(args) -> int:
    """The largest argument's bytes: about the largest collective the program can move."""
    import numpy as np

    from ..core import dtypes

    out = 0
    for x in jax.tree_util.tree_leaves(args):
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if shape is not None and dtype is not None:
            out = max(out, int(np.prod(shape, dtype=np.int64)) * dtypes.itemsize(dtype))
    return out
