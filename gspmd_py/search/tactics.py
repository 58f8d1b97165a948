"""Tactics: the sharding schedule, kept apart from the model code (PartIR).

    f = gp.spmd(train_step, mesh, tactics=[gp.tactics.batch("x"),
                                          gp.tactics.rules([("*attn*/kernel", gp.P(None, "y"))]),
                                          gp.tactics.zero("x"),
                                          gp.tactics.auto("y", time_budget_s=10)])

Tactics run in order at plan time, over the traced program. Each decides shardings over
the mesh axes it names ("dim d of value v over axis a") and leaves everything else to the
next; what they decided becomes seeds of propagation (decided dims closed, the rest open),
so ``plan.explain(v)`` names the tactic behind a value and ``plan.report()`` lists the
tactics, what each decided and the predicted step after each. Values the user fixed
(``in_shardings``, ``gp.annotate``) are never changed by a tactic.

* ``batch(axis, argnums=None)``: the leading dim of every data argument over ``axis``
  (every positional argument but the first, JAX's ``fn(params, *batch)``, or ``argnums``).
* ``rules(rules)``: specs by key path (a ``gp.rules`` object or a list of (pattern, spec)),
  matched inside every positional argument.
* ``zero(axis, argnums=(0,))``: weight-update sharding (ZeRO-3 / FSDP, GSPMD paper §3.3):
  every parameter leaf (of ``argnums``), and every value of its shape derived from it
  elementwise (optimizer state, gradients, updates, the new parameters), sharded over
  ``axis`` on the largest dim it divides; uses of the parameters (dots) see them gathered,
  gradients arrive reduce-scattered.
* ``auto(*axes, hardware=None, memory_limit=None, time_budget_s=30, seed=0)``: the search
  (gspmd_py/search/) over the named axes (none named: every axis no earlier tactic named).
* ``pipeline(axis, microbatches)``: the schedule of the function's open ``gp.pipeline`` calls
  (those given no axis / microbatches): stages over ``axis`` (S = its size), ``microbatches``
  microbatches, R = layers / S circular repeats. Unlike the others it changes the traced
  program: gp.spmd traces the function with the schedule decided (frontend/pipeline.py's
  ``scheduled``); at plan time it checks that an open pipeline took it and takes ``axis``
  (a later ``auto`` searches the other axes). At most one per tactics list.
"""
from __future__ import annotations

from typing import Optional, Sequence

import attrs
import numpy as np

from ..core.errors import ShardingError, SpecError
from ..core.mesh import AxisRef
from .context import TacticContext, TacticRecord


class TacticError(ShardingError):
    """A tactic cannot apply: an unknown axis, a bad argument number, a bad rule."""


def _axis(ctx: TacticContext, name: str, tactic: str) -> AxisRef:
    if name not in ctx.mesh.axis_names:
        raise TacticError(f"{tactic}: mesh {ctx.mesh} has no axis {name!r} (axes: {', '.join(ctx.mesh.axis_names)})")
    return ctx.mesh.ref(name)


def _argnums(v, what: str) -> Optional[tuple[int, ...]]:
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,)
    try:
        out = tuple(v)
    except TypeError:
        raise TacticError(f"{what}: argnums must be an int or a sequence of ints, got {v!r}") from None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in out):
        raise TacticError(f"{what}: argnums must be ints, got {v!r}")
    return out


def _resolve_argnums(ctx: TacticContext, nums: tuple[int, ...], tactic: str) -> tuple[int, ...]:
    """``nums`` as argument positions (negative ones from the end, as jax.jit counts them); one
    that names no positional argument is a TacticError."""
    n_args = max([lf.argnum for lf in ctx.leaves if lf.argnum is not None], default=-1) + 1
    bad = [i for i in nums if not -n_args <= i < n_args]
    if bad:
        raise TacticError(f"{tactic}: the function takes {n_args} positional array arguments; no argument {bad}")
    return tuple(i % n_args for i in nums)


def _check_axis_name(axis, what: str) -> str:
    if not isinstance(axis, str):
        raise TacticError(f"{what}: the mesh axis must be a name (str), got {axis!r}")
    return axis


def _record(ctx: TacticContext, text: str, before: dict, result=None) -> None:
    raw = []
    for vid, dims in ctx.decided.items():
        old = before.get(vid, [[] for _ in dims])
        for d, axes in enumerate(dims):
            for a in axes:
                if a not in old[d]:
                    raw.append((vid, d, a))
    decided = tuple((ctx.label(ctx.value(vid)), d, str(a)) for vid, d, a in raw)
    ctx.log.append(TacticRecord(text, decided, None, result, tuple(raw)))


def _snapshot(ctx: TacticContext) -> dict:
    return {k: [list(d) for d in v] for k, v in ctx.decided.items()}


class _OneAxis:
    """A tactic that decides one mesh axis (``self.axis``)."""

    axis: str

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes this tactic decides."""
        return (self.axis,)


@attrs.frozen
class Batch(_OneAxis):
    """``gp.tactics.batch(axis, argnums)``: the leading dim of the data arguments over ``axis``."""

    axis: str
    argnums: Optional[tuple[int, ...]] = None

    def __str__(self) -> str:
        return f"batch({self.axis!r}" + (f", argnums={self.argnums}" if self.argnums is not None else "") + ")"

    def apply(self, ctx: TacticContext) -> None:
        """Add this tactic's decisions to ``ctx`` (plan time; search/context.py)."""
        a = _axis(ctx, self.axis, str(self))
        before = _snapshot(ctx)
        nums = self.argnums if self.argnums is None else _resolve_argnums(ctx, self.argnums, str(self))
        found = 0
        for v, lf in zip(ctx.graph.inputs, ctx.leaves):
            if lf.argnum is None or v.rank == 0:
                continue
            if (nums is None and lf.argnum == 0) or (nums is not None and lf.argnum not in nums):
                continue
            ctx.add(v, 0, a, str(self))
            found += 1
        if not found:
            _batch_found_nothing(self, ctx, nums)
        _record(ctx, str(self), before)


def _batch_found_nothing(tactic: Batch, ctx: TacticContext, nums) -> None:
    """A batch tactic with no array argument of rank >= 1 to shard: said (a warning), not a silent no-op."""
    import warnings

    argnums = sorted({lf.argnum for lf in ctx.leaves if lf.argnum is not None})
    if nums is None and argnums in ([], [0]):
        why = ("the function's only positional argument is arg0, which batch() takes as the parameters (JAX's "
               "fn(params, *batch)): pass argnums=(0,) to shard its leading dim")
    else:
        why = "the arguments it takes are all scalars (rank 0)"
    warnings.warn(f"gp.tactics.{tactic}: no argument to shard: {why}", UserWarning, stacklevel=2)


@attrs.frozen
class Rules:
    """``gp.tactics.rules(rules)``: specs by key path (``rules``, a gp.Rules) inside every argument."""

    rules: object  # a gp.Rules

    def __str__(self) -> str:
        return f"rules({self.rules!r})"

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes the rules' specs name."""
        out = []
        for _, spec in getattr(self.rules, "rules", ()):
            for e in (spec or ()):
                for n in (e if isinstance(e, tuple) else (e,)):
                    if isinstance(n, str) and n not in out:
                        out.append(n)
        return tuple(out)

    def apply(self, ctx: TacticContext) -> None:
        """Add this tactic's decisions to ``ctx`` (plan time; search/context.py)."""
        import jax

        from ..frontend.specs import spec_dims

        before = _snapshot(ctx)
        args = ctx.args_tree if ctx.args_tree is not None else ()
        pos = [(v, lf) for v, lf in zip(ctx.graph.inputs, ctx.leaves) if lf.argnum is not None]
        leaves = jax.tree_util.tree_leaves(args)
        if len(leaves) != len(pos):  # pragma: no cover - the same call flattened twice
            raise TacticError(f"{self}: {len(leaves)} argument leaves for {len(pos)} inputs")
        dims = spec_dims(ctx.mesh, tuple(self.rules for _ in args), tuple(args), [v.rank for v, _ in pos],
                         [v.type_str for v, _ in pos], "tactics.rules", [lf.name for _, lf in pos])
        for (v, lf), d in zip(pos, dims):
            if d is None:
                continue
            for i, axes in enumerate(d):
                for a in axes or ():
                    if not ctx.fixed(v) and any(x.name == a.name for dd in ctx.dims(v) for x in dd):
                        continue  # an earlier tactic decided this axis for this value
                    ctx.add(v, i, a, "rules", even=False)  # a rule says so explicitly: uneven is padded
        _record(ctx, "rules", before)


@attrs.frozen
class Zero(_OneAxis):
    """``gp.tactics.zero(axis, argnums)``: weight-update sharding of the parameters over ``axis``."""

    axis: str
    argnums: tuple[int, ...] = (0,)

    def __str__(self) -> str:
        return f"zero({self.axis!r}" + (f", argnums={self.argnums}" if self.argnums != (0,) else "") + ")"

    def apply(self, ctx: TacticContext) -> None:
        """Add this tactic's decisions to ``ctx`` (plan time; search/context.py)."""
        from .points import elementwise_family, users_of

        a = _axis(ctx, self.axis, str(self))
        before = _snapshot(ctx)
        nums = _resolve_argnums(ctx, self.argnums, str(self))
        params = [v for v, lf in zip(ctx.graph.inputs, ctx.leaves) if lf.argnum in nums and v.rank > 0]
        users = users_of(ctx.graph)
        for p in params:
            dim = _zero_dim(ctx, p, a)
            if dim is None:
                continue  # too small to split: stays as it is (replicated over the axis)
            for v in elementwise_family(ctx.graph, p, users=users):
                if v.shape == p.shape:
                    ctx.add(v, dim, a, str(self))
        _record(ctx, str(self), before)


def _zero_dim(ctx: TacticContext, v, a: AxisRef) -> Optional[int]:
    """The dim ``a`` shards: an unsharded one if any divides, the largest of those (first on ties)."""
    dims = ctx.dims(v)
    ok = [d for d in range(v.rank) if ctx.can_add(v, d, a)]
    return min(ok, key=lambda d: (bool(dims[d]), -v.shape[d], d), default=None)


@attrs.frozen
class Auto:
    """``gp.tactics.auto(*axes, ...)``: the search over ``axes_`` (the mesh axes it may use) on
    ``hardware`` under ``memory_limit``, ``time_budget_s``, ``seed`` and ``max_evaluations``;
    ``sink``: gp.auto_shard's list that receives the search's result."""

    axes_: tuple[str, ...] = ()
    hardware: object = None
    memory_limit: Optional[float] = None
    time_budget_s: float = 30.0
    seed: int = 0
    max_evaluations: Optional[int] = None  # None: the search's default (optimizer.MAX_EVALUATIONS)
    # gp.auto_shard's: a list the search's result is appended to, so that a plan that fails to
    # build after the search can fall back to the next candidate without searching again
    sink: Optional[list] = attrs.field(default=None, eq=False, repr=False)

    def __str__(self) -> str:
        return "auto(" + ", ".join(repr(a) for a in self.axes_) + ")"

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes the search may decide (none: every axis no earlier tactic named)."""
        return self.axes_

    def apply(self, ctx: TacticContext) -> None:
        """Run the search over the open dims of ``ctx`` and add its decisions (plan time)."""
        from .optimizer import search

        names = list(self.axes_) or ctx.free_axes()
        # earlier tactics used every axis: nothing to search, and the report says so (gp.auto_shard's,
        # with a sink, still prices the plan: a pipeline over the mesh's only axis is a plan it compares)
        if not names and self.sink is None:
            ctx.log.append(TacticRecord(str(self), (), note="every mesh axis was decided by an earlier tactic: "
                                                            "nothing left to search, no decision made"))
            return
        for n in names:
            _axis(ctx, n, str(self))
        before = _snapshot(ctx)
        from .optimizer import MAX_EVALUATIONS

        evals = MAX_EVALUATIONS if self.max_evaluations is None else self.max_evaluations
        ctx.hardware = auto_hardware(self, ctx)
        result = search(ctx, names, hardware=ctx.hardware, memory_limit=self.memory_limit,
                        time_budget_s=self.time_budget_s, seed=self.seed, who=str(self), max_evaluations=evals)
        if self.sink is not None:
            self.sink.append(result)
        for vid, dims in result.decisions.items():
            v = ctx.value(vid)
            for d, axes in enumerate(dims):
                for x in axes:
                    ctx.add(v, d, x, str(self), even=False)  # the search checked them (uneven: padded)
        _record(ctx, str(self), before, result)


def auto_hardware(tactic: "Auto", ctx: TacticContext):
    """The hardware an auto tactic prices on: its ``hardware=``, else the mesh's devices'
    (cost/machine.py: a GPU's / TPU's preset, CPU devices calibrated once and cached on disk,
    an abstract mesh h100-node), as ``gp.auto_shard`` chooses it."""
    if tactic.hardware is not None:
        return tactic.hardware
    from ..cost.machine import default_hardware

    largest = max((v.nbytes for v in ctx.graph.inputs), default=0)
    return default_hardware(ctx.mesh, largest)[0]


@attrs.frozen
class Pipeline(_OneAxis):
    """``gp.tactics.pipeline(axis, microbatches)``: the schedule of the open gp.pipeline calls."""

    axis: str
    microbatches: int

    def __str__(self) -> str:
        return f"pipeline({self.axis!r}, microbatches={self.microbatches})"

    def apply(self, ctx: TacticContext) -> None:
        """Check that an open gp.pipeline took this schedule; record it (plan time)."""
        from ..frontend.pipeline import schedules

        _axis(ctx, self.axis, str(self))
        got = [sc for a, sc in schedules(ctx.graph) if a == self.axis and sc.microbatches == self.microbatches]
        if not got:
            raise TacticError(f"{self}: the traced program has no gp.pipeline scheduled by it: the function calls no "
                              f"open gp.pipeline (one given neither axis nor microbatches), or calls it inside a "
                              f"jax.jit whose cached trace predates the schedule")
        ctx.log.append(TacticRecord(str(self), (), note=str(got[0])))


def pipeline_decision(tactics: Sequence, mesh):
    """The frontend's ``Decision`` for the Pipeline tactic among ``tactics`` (None: none), the
    stages the size of its axis in ``mesh``."""
    from ..frontend.pipeline import Decision

    pipes = [t for t in tactics if isinstance(t, Pipeline)]
    if not pipes:
        return None
    t = pipes[0]
    if t.axis not in mesh.axis_names:
        raise TacticError(f"{t}: mesh {mesh} has no axis {t.axis!r} (axes: {', '.join(mesh.axis_names)})")
    return Decision(t.axis, mesh.shape[mesh.axis_names.index(t.axis)], t.microbatches)


@attrs.frozen
class Decided:
    """Decisions replayed by value id (``AutoResult.spmd``): the same program traced again has
    the same value ids; a decision whose value is missing or has another shape is skipped.
    ``decisions``: ((value id, shape, dims as axis-name tuples), ...); ``text``: how it prints."""

    decisions: tuple  # ((value id, shape (None: not checked), dims as axis-name tuples), ...)
    text: str = "auto"

    def __str__(self) -> str:
        return self.text

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes the decisions use."""
        return tuple(sorted({a for _, _, dims in self.decisions for d in dims for a in d}))

    def apply(self, ctx: TacticContext) -> None:
        """Add the recorded decisions to ``ctx`` (plan time; search/context.py)."""
        before = _snapshot(ctx)
        vals = {v.id: v for v in ctx.graph.all_values()}
        for vid, shape, dims in self.decisions:
            v = vals.get(vid)
            if v is None or (shape is not None and v.shape != tuple(shape)):
                continue
            for d, axes in enumerate(dims):
                for n in axes:
                    ctx.add(v, d, ctx.mesh.ref(n), self.text, even=False)  # as the search decided
        _record(ctx, self.text, before)


TACTICS = (Batch, Rules, Zero, Auto, Decided, Pipeline)


# -- the public constructors -------------------------------------------------------------

def batch(axis: str, argnums=None) -> Batch:
    """The leading dim of every data argument over ``axis`` (default: every positional argument
    but the first; or those in ``argnums``)."""
    return Batch(_check_axis_name(axis, "gp.tactics.batch"), _argnums(argnums, "gp.tactics.batch"))


def rules(r) -> Rules:
    """Specs by parameter name: a ``gp.rules`` object or a list of (pattern, spec) pairs."""
    from ..frontend.rules import Rules as RulesObj, rules as make

    if isinstance(r, RulesObj):
        return Rules(r)
    try:
        return Rules(make(r))
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - said as a tactic error
        raise TacticError(f"gp.tactics.rules: expected gp.rules(...) or a list of (pattern, spec), got {r!r}: {e}") \
            from None


def zero(axis: str, argnums=(0,)) -> Zero:
    """Weight-update sharding over ``axis`` (ZeRO-3 / FSDP) of the parameters in ``argnums``."""
    return Zero(_check_axis_name(axis, "gp.tactics.zero"), _argnums(argnums, "gp.tactics.zero"))


def auto(*axes: str, hardware=None, memory_limit=None, time_budget_s: float = 30, seed: int = 0,
         max_evaluations: Optional[int] = None) -> Auto:
    """Search the shardings over ``axes`` (default: every axis no earlier tactic named); see
    gspmd_py/search/optimizer.py. ``hardware=None``: the mesh's devices' hardware, as
    ``gp.auto_shard`` chooses it (cost/machine.py: a GPU's / TPU's preset, CPU devices
    calibrated once and cached on disk, an abstract mesh the h100-node preset).
    ``max_evaluations``: the deterministic budget (candidate states); ``time_budget_s`` a
    safety cap (a search that hits it depends on the machine's speed, and its report says so)."""
    from ..cost import Hardware

    for a in axes:
        _check_axis_name(a, "gp.tactics.auto")
    if len(set(axes)) != len(axes):
        raise TacticError(f"gp.tactics.auto: axes {axes} name an axis twice")
    if hardware is not None and not isinstance(hardware, Hardware):
        raise TacticError(f"gp.tactics.auto: hardware must be a gp.Hardware, got {type(hardware).__name__}")
    if memory_limit is not None and (isinstance(memory_limit, bool) or not (isinstance(memory_limit, (int, float))
                                                                         and memory_limit > 0)):
        raise TacticError(f"gp.tactics.auto: memory_limit must be a positive number of bytes, got {memory_limit!r}")
    if not (isinstance(time_budget_s, (int, float)) and time_budget_s > 0):
        raise TacticError(f"gp.tactics.auto: time_budget_s must be positive, got {time_budget_s!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TacticError(f"gp.tactics.auto: seed must be an int, got {seed!r}")
    if max_evaluations is not None and (isinstance(max_evaluations, bool) or not (isinstance(max_evaluations, int)
                                                                                and max_evaluations > 0)):
        raise TacticError(f"gp.tactics.auto: max_evaluations must be a positive int, got {max_evaluations!r}")
    return Auto(tuple(axes), hardware, memory_limit, float(time_budget_s), int(seed), max_evaluations)


def pipeline(axis: str, microbatches: int) -> Pipeline:
    """Schedule the function's open ``gp.pipeline`` calls: stages over mesh axis ``axis``,
    ``microbatches`` microbatches, layers / stages circular repeats (see the module docstring)."""
    _check_axis_name(axis, "gp.tactics.pipeline")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise TacticError(f"gp.tactics.pipeline: microbatches must be a positive int, got {microbatches!r}")
    return Pipeline(axis, microbatches)


def check_tactics(tactics) -> tuple:
    """The ``tactics=`` argument of gp.spmd as a tuple of tactics (None: none; one tactic: a
    list of one), or a TacticError naming the entry that is not a tactic."""
    if tactics is None:
        return ()
    if isinstance(tactics, TACTICS):
        tactics = [tactics]
    if callable(tactics) or not isinstance(tactics, (list, tuple)):
        tactics = [tactics]  # one tactic not called (gp.tactics.batch), or not a list: said below
    out = tuple(tactics)
    for t in out:
        if not isinstance(t, TACTICS):
            made = getattr(t, "__name__", "") if getattr(t, "__module__", "") == __name__ else ""
            if made in _CONSTRUCTORS:  # the constructor itself, not called
                raise TacticError(f"gp.spmd: tactics got gp.tactics.{made} itself: call it, e.g. "
                                  f"tactics=[gp.tactics.{made}(...)]")
            raise TacticError(f"gp.spmd: tactics must be a list of gp.tactics.batch/rules/zero/auto/pipeline(...), "
                              f"got {t!r}")
    pipes = [str(t) for t in out if isinstance(t, Pipeline)]
    if len(pipes) > 1:
        raise TacticError(f"gp.spmd: tactics has {len(pipes)} pipeline schedules ({', '.join(pipes)}); the open "
                          f"gp.pipeline calls take one")
    return out


_CONSTRUCTORS = ("batch", "rules", "zero", "auto", "pipeline")


def apply_tactics(tactics: Sequence, ctx: TacticContext, hardware=None) -> TacticContext:
    """Run ``tactics`` in order over ``ctx``; each record gets the predicted step after it
    (priced on the last auto tactic's hardware (``auto_hardware``), else ``hardware``, else h100-node)."""
    from ..cost import Hardware
    from .price import Pricer

    for t in tactics:
        t.apply(ctx)
        ctx.used_axes.extend(a for a in t.axes if a not in ctx.used_axes)
    hw = ctx.hardware or hardware or Hardware.preset("h100-node")  # ctx.hardware: the last auto tactic's
    pricer = Pricer(ctx.graph, ctx.mesh, hw, ctx.donate, ctx.combine_threshold_bytes, ctx.passes)
    full, upto = ctx.decided, {}
    try:
        for i, rec in enumerate(ctx.log):  # the step after each tactic: its decisions and those before it
            for vid, d, a in rec.raw:
                upto.setdefault(vid, [[] for _ in ctx.value(vid).shape])[d].append(a)
            ctx.decided = upto
            try:
                price, _ = pricer.price(ctx.seeds())
            except Exception:  # noqa: BLE001 - the step after a tactic is only said: unknown, not fatal
                continue
            ctx.log[i] = attrs.evolve(rec, step_s=price.step_s)
    finally:
        ctx.decided = full
    return ctx
