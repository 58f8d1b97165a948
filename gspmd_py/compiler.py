"""The compiler: a closed jaxpr and a mesh in, a Plan out, by named passes over plain data.

``PASSES`` is a list of pass records (partitioner/passes.py's ``Pass``: a name, the entries
of the state it reads, the entry it writes, what its dump and verifier read beside it)::

    trace, fold_shifts, seed, apply_tactics, propagate, partition, index, combine, reindex,
    choose_matmul

``plan_jaxpr`` runs exactly these, in this order, by one driver (``run_passes``; the slice
from ``partition`` to ``reindex`` runs twice where ``choose_matmul`` compares two plans);
the search prices each candidate by running that same slice of this list (``apply_tactics``
hands it to the search), so a pass added there is run by both. Each is also the function of
that name here, to run on its own:

* ``trace``: the user's jaxpr -> ``ir.Graph`` (dead code removed), each output a value of
  its own (its port, below).
* ``fold_shifts``: shifts and rotations written the long way folded into one op
  (frontend/shifts.py), dead code removed again.
* ``seed``: annotations and in/out shardings -> ``Seed`` s (``Seeded``).
* ``apply_tactics``: the gp.tactics entries (the sharding search among them) add their
  decisions as seeds (``Seeded.tactics``: what each decided); nothing without tactics.
* ``propagate``: graph + seeds -> ``Propagation`` (a sharding per value, a projection per op).
* ``partition``: graph + propagation -> the per-device program and its diagnostics
  (``Partitioned``: notes, fallbacks, host calls, the collectives shaped for a hardware).
* ``index``: the program read (``ProgramIndex``): per equation its op, its loops' trip
  counts, its collectives (the ``Collective`` records) and its dependencies; the one reader
  of the program: the combiner, the records, the cost model and the memory walk read it.
* ``combine``: the per-device program with independent collectives merged; it reads the
  program through its index.
* ``reindex``: the combined program's index (the ``index`` pass again, only where the
  combiner changed the program): the plan's collective records.
* ``choose_matmul``: where the hardware may use collective matmuls (partitioner/shaping.py),
  the plan without them is built too (partition to reindex again) and the faster one kept,
  by the hardware's overlapped schedule of the whole program; any other plan as it is.

Between the passes, ``views/pass_check.PassRun`` dumps each pass's output as text with
``GSPMD_PY_DUMP=dir`` (pass_text.py: the graph with shardings, the per-device program, the
collectives) and verifies the invariants the next pass relies on with ``GSPMD_PY_VERIFY=1``
(every value has a sharding, every partial is reduced once, the program's collectives equal
the records; the tests turn it on).

Each pass is a function that can be run on its own (tests, the search)::

    g = fold_shifts(trace(closed, mesh))
    s = seed(g, mesh, in_dims=[dims_x, None], out_dims=[dims_out])
    prop = propagate(s.graph, mesh, s.seeds)
    part = partition(s.graph, mesh, prop)
    raw = index(part.program, part.fine, s.graph)
    program = combine(raw, DEFAULT_THRESHOLD_BYTES, part.fine)
    idx = reindex(raw, program, part.fine, s.graph)  # idx.collectives: the Collective records

The program boundary is data, not edits. gp.spmd traces the user's function as written;
its in_shardings and out_shardings reach ``seed`` as explicit per-input / per-output dims
with their labels ("in_shardings of arg0", "out_shardings of output 0"), and a derived
program (jvp, transpose, vmap, a known/unknown split: api/primitive.py) gets them per
position of the transformed program. The trace pass gives every output a value of its own:
its port, an unspecified ``gp.annotate`` op (an identity that constrains nothing) of the
value it returns, built with the other ops' ids. So an output can be laid out unlike the
value it returns (an input returned as is, one value returned twice under two
out_shardings, a constant returned, a partial sum returned sharded: reduced once, at its
port). ``seed`` reads the graph and never changes it:
in_dims seed the inputs, every specified annotate op its result, out_dims the ports, then
then the tactics (``apply_tactics``) add theirs; all at the user's priority 0, as
gp.annotate's default.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator, Optional, Sequence

import attrs
import jax
from jax.extend.core import ClosedJaxpr

from .core import jax_compat as compat
from .frontend import shifts
from .frontend.constraints import outside_user_mesh
from .core.errors import AnnotationError
from .core.ir import Graph, Value, eliminate_dead_code
from .runtime.layout import layout_notes, own_mesh
from .core.mesh import Mesh
from .program import combine as combiner
from .core.fine_mesh import FineMesh
from .partitioner.passes import (PROGRAM_PASSES, Partitioned, Pass, index_program, partition_graph,
                                 program_passes, run_passes)
from .partitioner.passes import reindex as reindex_program
from .views.pass_check import PassRun
from .partitioner.program import warn_fallbacks
from .program.program_index import ProgramIndex
from .partitioner.shaping import Shaping
from .plan import Plan
from .propagation import Propagation, Seed
from .frontend.specs import annotation_dims
from .frontend.trace import trace_jaxpr

Dims = tuple  # per tensor dim: a tuple of AxisRefs

DEFAULT_THRESHOLD_BYTES = combiner.DEFAULT_THRESHOLD_BYTES


@attrs.frozen
class Seeded:
    """What the seed pass made of a traced graph: the graph it seeded (the one it was given,
    unchanged) and the seeds."""

    graph: Graph
    seeds: tuple[Seed, ...]
    tactics: tuple = ()  # search.context.TacticRecord per gp.tactics entry, in order


# -- the passes ---------------------------------------------------------------------------
def trace(closed: ClosedJaxpr, mesh: Optional[Mesh] = None, in_names: Optional[Sequence[str]] = None) -> Graph:
    """Pass 1: the IR of ``closed`` (dead code removed; shifts are left for ``fold_shifts``),
    inputs named ``in_names`` (default ``arg0``, ``arg1``...), each output its own port (an
    unspecified annotate op of the value it returns)."""
    graph = trace_jaxpr(closed, mesh, output_ports=True, fold_shifts=False)
    in_names = in_names or [f"arg{i}" for i in range(len(graph.inputs))]
    for v, nm in zip(graph.inputs, in_names):
        v.name = v.name or nm
    return graph


def fold_shifts(graph: Graph) -> Graph:
    """Pass 2: ``graph`` with shifts and rotations written the long way (jnp.roll, a pad
    then a slice...) folded into one op each (frontend/shifts.py), dead code removed."""
    return eliminate_dead_code(shifts.fold(graph))


def seed(graph: Graph, mesh: Mesh, *, in_dims: Optional[Sequence[Optional[Dims]]] = None,
         in_labels: Optional[Sequence[str]] = None, out_dims: Optional[Sequence[Optional[Dims]]] = None,
         out_labels: Optional[Sequence[str]] = None, tactics: Sequence = (), leaves=None, args_tree=None,
         donate_argnums: Sequence[int] = ()) -> Seeded:
    """Pass 3: the seeds of ``graph``, in this order: ``in_dims`` on the inputs (in_shardings,
    or the layouts inputs arrive in; ``in_labels`` say which, for ``plan.explain``), every
    specified ``gp.annotate`` op on its result, ``out_dims`` on the outputs (the ports
    ``trace`` made; ``out_labels``, default "out_shardings of output i"), then the decisions
    of ``tactics`` (the ``apply_tactics`` pass, run here when given). A None entry of
    ``in_dims`` / ``out_dims`` leaves that value open, a None per dim leaves that dim open.
    ``graph`` is read, never changed."""
    in_names = [v.name or f"arg{i}" for i, v in enumerate(graph.inputs)]
    seeds = _boundary_seeds(graph.inputs, in_dims, in_labels or [f"in_shardings of {nm}" for nm in in_names])
    seeds += annotation_seeds(graph, mesh)
    seeds += _boundary_seeds(graph.outputs, out_dims,
                             out_labels or [f"out_shardings of output {i}" for i in range(len(graph.outputs))])
    seeded = Seeded(graph, tuple(seeds))
    if tactics:
        seeded = apply_tactics(seeded, mesh, tactics, leaves=leaves, args_tree=args_tree, donate_argnums=donate_argnums)
    return seeded


def apply_tactics(seeded: Seeded, mesh: Mesh, tactics: Sequence = (), *, leaves=None, args_tree=None,
                  donate_argnums: Sequence[int] = (), passes: Optional[Sequence[Pass]] = None,
                  combine_threshold_bytes: Optional[int] = None, out_tree=None) -> Seeded:
    """Pass 4: ``seeded`` with the decisions of ``tactics`` (gp.tactics entries: batch, rules,
    zero, auto: the sharding search) added as seeds, each tactic over its axes, in order;
    ``Seeded.tactics`` records what each decided. No tactics: ``seeded`` itself. The search
    prices a candidate by running ``passes`` (``partition`` to ``reindex``; None:
    ``PROGRAM_PASSES``) with the combiner's ``combine_threshold_bytes``."""
    if not tactics:
        return seeded
    from .search.context import Leaf, TacticContext, out_leaves_of
    from .search.tactics import apply_tactics as run_tactics

    graph = seeded.graph
    in_names = [v.name or f"arg{i}" for i, v in enumerate(graph.inputs)]
    leaves = list(leaves) if leaves is not None else [Leaf(i, "", nm) for i, nm in enumerate(in_names)]
    ctx = TacticContext(graph, mesh, leaves, list(seeded.seeds), args_tree, tuple(donate_argnums),
                        passes=None if passes is None else tuple(passes),
                        combine_threshold_bytes=combine_threshold_bytes,
                        out_leaves=out_leaves_of(out_tree, len(graph.outputs)))
    ctx = run_tactics(tactics, ctx)
    return Seeded(graph, tuple(ctx.seeds()), seeded.tactics + tuple(ctx.log))


def _boundary_seeds(values: Sequence[Value], dims: Optional[Sequence[Optional[Dims]]],
                    labels: Sequence[str]) -> list[Seed]:
    """A seed at the user's priority per value that ``dims`` gives a sharding."""
    if dims is None:
        return []
    if len(dims) != len(values):
        raise ValueError(f"seed: {len(dims)} dims for {len(values)} values")
    return [Seed(v, d, 0, what) for v, d, what in zip(values, dims, labels) if d is not None]


def annotation_seeds(graph: Graph, mesh: Mesh) -> list[Seed]:
    """A seed per specified ``gp.annotate`` op of ``graph`` (regions included), in program order."""
    seeds = []
    for op in graph.walk():
        if op.prim == "gspmd_annotate" and not op.params.get("unspecified"):
            dims, what = annotation_dims(mesh, op, op.outputs[0].rank)
            seeds.append(Seed(op.outputs[0], dims, op.params["priority"], what))
    return seeds


def propagate(graph: Graph, mesh: Mesh, seeds: Sequence[Seed]) -> Propagation:
    """Pass 5: a sharding for every value of ``graph`` and a projection for every op."""
    return Propagation(graph, mesh, seeds).run()


def partition(graph: Graph, mesh: Mesh, prop: Propagation, shaping: Shaping = Shaping()) -> Partitioned:
    """Pass 6: the per-device program that computes ``graph`` under ``prop``'s shardings,
    traced once (``jax.make_jaxpr`` over the fine mesh's axes), and its diagnostics
    (partitioner/passes.py; the search's pricer runs the same)."""
    return partition_graph(graph, mesh, prop, shaping)


def index(program: ClosedJaxpr, fine: FineMesh, graph: Graph) -> ProgramIndex:
    """Pass 7: the program index (program/program_index.py): per equation of ``program``
    (loop and branch bodies included) the op of ``graph`` that caused it, its loops' trip
    counts and its collectives; ``.collectives``: every collective, in program order."""
    return index_program(program, fine, graph)


def combine(idx: ProgramIndex, threshold_bytes: int, fine: FineMesh) -> ClosedJaxpr:
    """Pass 8: the program ``idx`` indexes with independent collectives merged
    (program/combine.py); it reads the program through ``idx`` only."""
    return combiner.combine(idx, threshold_bytes, list(zip(fine.names, fine.sizes)))


def reindex(idx: ProgramIndex, program: ClosedJaxpr, fine: FineMesh, graph: Graph) -> ProgramIndex:
    """Pass 9: the index of ``program``, what ``combine`` made of the program ``idx``
    indexes: ``idx`` itself when the combiner left the program as it was, else ``index``
    run again on it. Its ``.collectives`` are the plan's collective records."""
    return reindex_program(idx, program, fine, graph)


# -- all of them --------------------------------------------------------------------------
def _seed(s) -> Seeded:
    check_tag_names(s["graph"], s["name"])  # one gp.tag name, one place (before anything reads the tags)
    return seed(s["graph"], s["mesh"], in_dims=s["in_dims"], in_labels=s["in_labels"], out_dims=s["out_dims"],
                out_labels=s["out_labels"])


def _choose_matmul(s) -> Plan:
    return choose_matmul(assemble(s), s["rebuild"])


#: the passes, in the order ``plan_jaxpr`` runs them (see the module doc); the state they
#: start from holds plan_jaxpr's arguments by name, and ``rebuild`` (``choose_matmul``'s
#: way to build the plan again with another shaping: this list's program slice run again)
PASSES: tuple[Pass, ...] = (
    Pass("trace", lambda s: trace(s["closed"], s["mesh"], s["in_names"]), ("closed", "mesh", "in_names"), "graph"),
    Pass("fold_shifts", lambda s: fold_shifts(s["graph"]), ("graph",), "graph"),
    Pass("seed", _seed, ("graph", "mesh", "name", "in_dims", "in_labels", "out_dims", "out_labels"), "seeded"),
    Pass("apply_tactics", lambda s: apply_tactics(s["seeded"], s["mesh"], s["tactics"], leaves=s["leaves"],
                                                  args_tree=s["args_tree"], donate_argnums=s["donate_argnums"],
                                                  passes=program_passes(s["passes"]),
                                                  combine_threshold_bytes=s["threshold"], out_tree=s["given_out_tree"]),
         ("seeded", "mesh", "tactics", "leaves", "args_tree", "donate_argnums", "passes", "threshold",
          "given_out_tree"), "seeded"),
    Pass("propagate", lambda s: propagate(s["seeded"].graph, s["mesh"], s["seeded"].seeds), ("seeded", "mesh"),
         "prop", ("graph",)),
    *PROGRAM_PASSES,
    Pass("choose_matmul", _choose_matmul, ("name", "mesh", "graph", "prop", "part", "program", "idx", "seeded",
                                           "in_tree", "out_tree", "donate_argnums", "threshold", "rebuild",
                                           "closed", "out_memory_kinds", "in_memory_kinds"), "plan"),
)


def assemble(s) -> Plan:
    """The Plan of what the passes made (``s``: the state, by name), with the notes the
    boundary adds on layouts the user's mesh cannot say."""
    g, part = s["graph"], s["part"]
    out_avals = s["closed"].out_avals
    out_weak = tuple(bool(getattr(a, "weak_type", False)) for a in out_avals)  # results keep them, as jax.jit's
    given = list(s["out_memory_kinds"] or ())
    given += [None] * (len(out_avals) - len(given))
    out_kinds = tuple(k or compat.memory_kind(a) for k, a in zip(given, out_avals))
    in_kinds = s["in_memory_kinds"]
    plan = Plan(s["name"], s["mesh"], g, s["prop"], part.fine, part.shaping, part.diagnostics, s["program"], s["idx"],
                part.in_dims, part.out_dims, part.op_plans, part.shardings, s["in_tree"], s["out_tree"],
                [v.name for v in g.inputs], donate_argnums=tuple(s["donate_argnums"]),
                combine_threshold_bytes=s["threshold"], tactics=s["seeded"].tactics,
                out_weak=out_weak, out_memory_kinds=out_kinds if any(out_kinds) else (),
                in_memory_kinds=tuple(in_kinds) if any(in_kinds or ()) else ())
    return plan.with_notes(*layout_notes(plan))


def plan_jaxpr(closed, mesh: Mesh, *, name: str, in_tree=None, out_tree=None, in_names: Optional[list[str]] = None,
               in_dims: Optional[Sequence[Optional[Dims]]] = None, in_labels: Optional[Sequence[str]] = None,
               out_dims: Optional[Sequence[Optional[Dims]]] = None, out_labels: Optional[Sequence[str]] = None,
               donate_argnums: Sequence[int] = (), combine_threshold_bytes: Optional[int] = None, tactics: Sequence = (),
               leaves=None, args_tree=None, shaping: Shaping = Shaping(),
               out_memory_kinds: Optional[Sequence[Optional[str]]] = None,
               in_memory_kinds: Optional[Sequence[Optional[str]]] = None) -> Plan:
    """Plan a closed jaxpr over ``mesh``: ``PASSES`` in order (see ``seed`` for the arguments
    that seed it). ``shaping``: collectives shaped for a hardware (partitioner/shaping.py);
    where it may use collective matmuls, the plan without them is built too and the faster
    one kept (the hardware's overlapped schedule of the whole program decides). ``out_memory_kinds``:
    per output the memory kind its out_sharding asks for (None: its traced type's);
    ``in_memory_kinds``: per input the one its in_sharding asks for (None: device memory)."""
    observe = PassRun.from_env(name, mesh)  # dumps and verifies each pass's output (views/pass_check.py)
    passes = PASSES
    threshold = DEFAULT_THRESHOLD_BYTES if combine_threshold_bytes is None else combine_threshold_bytes
    state = dict(closed=closed, mesh=mesh, name=name, in_names=in_names, in_dims=in_dims, in_labels=in_labels,
                 out_dims=out_dims, out_labels=out_labels, tactics=tactics, leaves=leaves, args_tree=args_tree,
                 donate_argnums=tuple(donate_argnums), threshold=threshold, shaping=shaping, passes=passes,
                 out_memory_kinds=out_memory_kinds, in_memory_kinds=in_memory_kinds,
                 given_out_tree=out_tree)  # (the tactics read the outputs' pytree paths: a training step's state)
    state["rebuild"] = lambda other: assemble(run_passes(program_passes(passes), {**state, "shaping": other}, observe))
    # the passes before the program's are run as they are (the search, in apply_tactics, collects
    # its own garbage); from partition on, off the user's mesh, with the collector paused
    cut = [p.name for p in passes].index("partition")
    run_passes(passes[:cut], state, observe)
    graph = state["graph"]
    state["in_tree"] = jax.tree_util.tree_structure([0] * len(graph.inputs)) if in_tree is None else in_tree
    state["out_tree"] = jax.tree_util.tree_structure([0] * len(graph.outputs)) if out_tree is None else out_tree
    with outside_user_mesh(), own_mesh(), gc_paused():
        run_passes(passes[cut:], state, observe)
    plan = state["plan"]
    observe.finish(plan)
    warn_fallbacks(plan.diagnostics)
    return plan


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a plan is built.

    Planning allocates many small, long-lived objects (IR values, shardings, projections, the
    per-device jaxpr's equations and tracers): each young collection then walks them again and
    the full ones walk the whole heap. For 96 transformer blocks that was ~0.6-0.9 s of a ~2.3 s
    plan, none of it reclaiming much. Reference counting still frees acyclic garbage at once;
    the cycles made meanwhile are collected once the collector is back on. Nested plans (a
    gp.spmd inside another) leave it to the outermost; a collector the caller turned off stays
    off. The sharding search (tactics) is not paused here: it traces a program per candidate,
    and that garbage must not pile up (``Spmd._entry`` pauses only plans without tactics;
    ``plan_jaxpr`` pauses after the seed pass, where the search runs); the search itself runs
    with young collections only, one per program it builds (search/collector.py)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def choose_matmul(plan: Plan, build) -> Plan:
    """Pass 10: ``plan`` as it is, unless its shaping may decide on collective matmuls and
    it used some: then ``build`` (partition to reindex) makes the plan without them and the
    one the hardware's overlapped schedule of the whole program says is faster is kept,
    with a note saying why (partitioner/shaping.py)."""
    if not (plan.shaping.decides_matmul and any(s.kind == "matmul" for s in plan.diagnostics.shaped)):
        return plan
    hw = plan.shaping.hardware
    alt = build(attrs.evolve(plan.shaping, matmul=False))
    t, t_alt = plan.cost(hw, overlap=True).step_s, alt.cost(hw, overlap=True).step_s
    n = sum(s.kind == "matmul" for s in plan.diagnostics.shaped)
    if t_alt <= t:
        return alt.with_notes(f"collective matmul of {n} dot(s) not used: the program's overlapped step on "
                              f"{hw.name} is {t * 1e6:.1f} us with it, {t_alt * 1e6:.1f} us without")
    return plan.with_notes(f"collective matmul of {n} dot(s): the program's overlapped step on {hw.name} is "
                           f"{t * 1e6:.1f} us with it, {t_alt * 1e6:.1f} us without")


def check_tag_names(graph: Graph, fn_name: str) -> None:
    """One gp.tag name, one place in the user's code.

    Two ``gp.tag(.., "h")`` calls on different source lines are a mistake (the plan could
    answer ``sharding_of("h")`` for only one of them): an AnnotationError naming both lines.
    One line that tags several values (a layer called in a loop, jax.checkpoint's
    recomputation, jvp's tangent) is allowed; ``sharding_of`` then refuses only if those
    values are sharded differently.
    """
    where: dict[str, str] = {}
    for op in graph.walk():
        if op.prim != "gspmd_tag":
            continue
        name, src = op.params["name"], op.source
        first = where.setdefault(name, src)
        if first and src and first != src:
            raise AnnotationError(f"gp.tag name {name!r} is used twice in {fn_name}: at {first} and at {src}; "
                                  f"give each value its own name")
