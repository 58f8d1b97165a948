"""The compiler: a closed jaxpr and a mesh in, a Plan out, by named passes over plain data.

    PASSES = ("trace", "seed", "propagate", "partition", "combine", "index")

* ``trace``: the user's jaxpr -> ``ir.Graph`` (shifts folded, dead code removed).
* ``seed``: annotations, in/out shardings and tactics -> ``Seed`` s (``Seeded``).
* ``propagate``: graph + seeds -> ``Propagation`` (a sharding per value, a projection per op).
* ``partition``: graph + propagation -> the per-device program and its diagnostics
  (``Partitioned``: notes, fallbacks, host calls, the collectives shaped for a hardware).
* ``combine``: the per-device program with independent collectives merged.
* ``index``: the program read once (``ProgramIndex``): per equation its op, its loops' trip
  counts and its collectives (the ``Collective`` records), read by the cost model.

Each pass is a function that can be run on its own (tests, the search); ``plan_jaxpr`` runs
them in order and wraps the result in a ``Plan``::

    g = trace(closed, mesh)
    s = seed(g, mesh, in_dims=[dims_x, None])
    prop = propagate(s.graph, mesh, s.seeds)
    part = partition(s.graph, mesh, prop)
    program = combine(part.program, DEFAULT_THRESHOLD_BYTES, part.fine)
    idx = index(program, part.fine, s.graph)       # idx.collectives: the Collective records
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator, Optional, Sequence

import attrs
import jax
from jax.extend.core import ClosedJaxpr

from .annotate import annotate_p
from .constraints import outside_user_mesh
from .errors import AnnotationError
from .ir import Graph, Op, Value
from .layout import own_mesh
from .mesh import Mesh
from .partitioner import combine as combiner
from .partitioner.context import Ctx
from .partitioner.fine_mesh import FineMesh
from .partitioner.hierarchy import link_refs
from .partitioner.program import build_body, fine_plan, op_label, warn_fallbacks
from .partitioner.pvalue import FineDims
from .partitioner.program_index import ProgramIndex
from .partitioner.shaping import Shaping
from .plan import Plan
from .propagation import Propagation, Seed
from .sharding import Sharding
from .specs import annotation_dims
from .trace import trace_jaxpr

Dims = tuple  # per tensor dim: a tuple of AxisRefs

#: the passes, in the order ``plan_jaxpr`` runs them; each is the function of that name here
PASSES: tuple[str, ...] = ("trace", "seed", "propagate", "partition", "combine", "index")
DEFAULT_THRESHOLD_BYTES = combiner.DEFAULT_THRESHOLD_BYTES


@attrs.frozen
class Seeded:
    """What the seed pass made of a traced graph: the graph it seeded (the traced one, its
    boundary annotations replaced by seeds and each output a value of its own) and the seeds."""

    graph: Graph
    seeds: tuple[Seed, ...]
    tactics: tuple = ()  # search.context.TacticRecord per gp.tactics entry, in order


@attrs.frozen(eq=False)
class Partitioned:
    """The per-device program of a propagated graph (before the combiner) and its diagnostics.

    ``ctx``: the partitioner's record of the build (notes, fallbacks, host calls, shaped
    collectives, what the program holds per value); ``shardings``: value id -> Sharding;
    ``in_dims`` / ``out_dims``: the inputs' and outputs' shardings over the fine mesh."""

    fine: FineMesh
    ctx: Ctx
    shardings: dict[int, Sharding]
    in_dims: tuple[FineDims, ...]
    out_dims: tuple[FineDims, ...]
    program: ClosedJaxpr

    @property
    def shaping(self) -> Shaping:
        return self.ctx.shaping

    @property
    def axis_env(self) -> list[tuple[str, int]]:
        return list(zip(self.fine.names, self.fine.sizes))


# -- the passes ---------------------------------------------------------------------------
def trace(closed: ClosedJaxpr, mesh: Optional[Mesh] = None, in_names: Optional[Sequence[str]] = None) -> Graph:
    """Pass 1: the IR of ``closed`` (shifts folded, dead code removed), inputs named
    ``in_names`` (default ``arg0``, ``arg1``...)."""
    graph = trace_jaxpr(closed, mesh)
    in_names = in_names or [f"arg{i}" for i in range(len(graph.inputs))]
    for v, nm in zip(graph.inputs, in_names):
        v.name = v.name or nm
    return graph


def seed(graph: Graph, mesh: Mesh, *, in_dims: Optional[Sequence[Optional[Dims]]] = None,
         in_labels: Optional[Sequence[str]] = None, out_labels: Optional[Sequence[str]] = None,
         boundary: bool = False, tactics: Sequence = (), leaves=None, args_tree=None,
         donate_argnums: Sequence[int] = ()) -> Seeded:
    """Pass 2: the seeds of ``graph``: ``in_dims`` on the inputs themselves (in_shardings, or
    the layouts inputs arrive in; ``in_labels`` say which, for ``plan.explain``), every
    ``gp.annotate`` op, then the decisions of ``tactics``.

    ``boundary``: the graph is a gp.spmd function's own (``Spmd._build``): its first annotate
    ops are the in_shardings of the inputs that have ``in_dims`` (dropped: the inputs are
    seeded instead) and each output is an annotate op of its own (the out_shardings, or
    unspecified). Otherwise each output gets an unspecified annotate op of its own, so that
    an output may be laid out unlike the value it returns. ``graph`` is edited in place.
    """
    n_in = len(graph.inputs)
    in_dims = list(in_dims) if in_dims is not None else [None] * n_in
    in_names = [v.name or f"arg{i}" for i, v in enumerate(graph.inputs)]
    in_labels = in_labels or [f"in_shardings of {nm}" for nm in in_names]
    if boundary:
        _drop_input_annotations(graph, in_dims)
    seeds = [Seed(v, d, 0, what) for v, d, what in zip(graph.inputs, in_dims, in_labels) if d is not None]
    labels: dict[int, str] = {}  # annotate op id -> what the user called it
    for i, lab in enumerate(out_labels or []):
        p = graph.outputs[i].producer
        if lab and p is not None and p.prim == "gspmd_annotate" and not p.params.get("unspecified"):
            labels[p.id] = lab
    if not boundary:  # distinct output values, so an output may be laid out unlike the value it returns
        for i, v in enumerate(graph.outputs):
            out = Value(_next_id(graph), v.shape, v.dtype, name=None)
            op = Op(_next_id(graph) + 1, "gspmd_annotate", [v], [out],
                    {"spec": (), "priority": 0, "unspecified": True}, annotate_p, source=f"output {i}")
            out.producer = op
            graph.ops.append(op)
            graph.outputs[i] = out
    for op in graph.walk():
        if op.prim == "gspmd_annotate" and not op.params.get("unspecified"):
            dims, what = annotation_dims(mesh, op, op.outputs[0].rank)
            seeds.append(Seed(op.outputs[0], dims, op.params["priority"], labels.get(op.id, what)))
    log: tuple = ()
    if tactics:  # gspmd_py/tactics.py: each adds decisions over its axes; they become seeds
        from .search.context import Leaf, TacticContext
        from .tactics import apply_tactics

        leaves = list(leaves) if leaves is not None else [Leaf(i, "", nm) for i, nm in enumerate(in_names)]
        with gc_resumed():  # the search traces a program per candidate: let their garbage go
            ctx = apply_tactics(tactics, TacticContext(graph, mesh, leaves, seeds, args_tree, tuple(donate_argnums)))
        seeds, log = ctx.seeds(), tuple(ctx.log)
    return Seeded(graph, tuple(seeds), log)


def propagate(graph: Graph, mesh: Mesh, seeds: Sequence[Seed]) -> Propagation:
    """Pass 3: a sharding for every value of ``graph`` and a projection for every op."""
    return Propagation(graph, mesh, seeds).run()


def partition(graph: Graph, mesh: Mesh, prop: Propagation, shaping: Shaping = Shaping(), *,
              name: str = "f") -> Partitioned:
    """Pass 4: the per-device program that computes ``graph`` under ``prop``'s shardings,
    traced once (``jax.make_jaxpr`` over the fine mesh's axes), and its diagnostics."""
    shardings = {v.id: Sharding.of(mesh, prop.dims_of(v)) for v in graph.all_values()}
    refs = [a for s in shardings.values() for a in s.used_axes]
    refs += [a for proj in prop.projections.values() for axes in proj.factors.values() for a in axes]
    check_tag_names(graph, name)
    if shaping.hardware is not None:  # mesh axes crossing a node boundary, split there (hierarchy.py)
        refs += link_refs(mesh, shaping.hardware, refs)
    fine = FineMesh.build(mesh, refs)
    ctx = Ctx(fine, shaping)
    fdims = lambda v: fine.fine_dims(shardings[v.id].dims)
    in_dims = tuple(fdims(v) for v in graph.inputs)
    out_dims = tuple(fdims(v) for v in graph.outputs)
    ctx.want = {v.id: fdims(v) for v in graph.all_values()}
    ctx.rules = prop.rules
    ctx.plans = {i: fine_plan(fine, p) for i, p in prop.projections.items()}
    body = build_body(graph, ctx, in_dims, out_dims)
    local = [jax.ShapeDtypeStruct(ctx.local_shape(v.shape, d), v.dtype) for v, d in zip(graph.inputs, in_dims)]
    program = jax.make_jaxpr(body, axis_env=list(zip(fine.names, fine.sizes)))(*local)
    return Partitioned(fine, ctx, shardings, in_dims, out_dims, program)


def combine(program: ClosedJaxpr, threshold_bytes: int, fine: FineMesh) -> ClosedJaxpr:
    """Pass 5: ``program`` with independent collectives merged (partitioner/combine.py)."""
    return combiner.combine(program, threshold_bytes, list(zip(fine.names, fine.sizes)))


def index(program: ClosedJaxpr, fine: FineMesh, graph: Graph) -> ProgramIndex:
    """Pass 6: the program index (partitioner/program_index.py): per equation of ``program``
    (loop and branch bodies included) the op of ``graph`` that caused it, its loops' trip
    counts and its collectives; ``.collectives``: every collective, in program order."""
    labels = {op.id: op_label(op) for op in graph.walk()}
    return ProgramIndex.build(program, fine, lambda i: labels.get(i, f"op {i}"))


# -- all of them --------------------------------------------------------------------------
def plan_jaxpr(closed, mesh: Mesh, *, name: str, in_tree=None, out_tree=None, in_names: Optional[list[str]] = None,
               in_dims: Optional[Sequence[Optional[Dims]]] = None, in_labels: Optional[Sequence[str]] = None,
               out_labels: Optional[Sequence[str]] = None, donate_argnums: Sequence[int] = (),
               boundary: bool = False, combine_threshold_bytes: Optional[int] = None, tactics: Sequence = (),
               leaves=None, args_tree=None, shaping: Shaping = Shaping()) -> Plan:
    """Plan a closed jaxpr over ``mesh``: the passes in order (see ``seed`` for the arguments
    that seed it). ``shaping``: collectives shaped for a hardware (partitioner/shaping.py);
    where it may use collective matmuls, the plan without them is built too and the faster
    one kept (the hardware's overlapped schedule of the whole program decides)."""
    graph = trace(closed, mesh, in_names)
    in_names = [v.name for v in graph.inputs]
    seeded = seed(graph, mesh, in_dims=in_dims, in_labels=in_labels, out_labels=out_labels, boundary=boundary,
                  tactics=tactics, leaves=leaves, args_tree=args_tree, donate_argnums=donate_argnums)
    prop = propagate(seeded.graph, mesh, seeded.seeds)
    if in_tree is None:
        in_tree = jax.tree_util.tree_structure([0] * len(graph.inputs))
    if out_tree is None:
        out_tree = jax.tree_util.tree_structure([0] * len(graph.outputs))
    threshold = DEFAULT_THRESHOLD_BYTES if combine_threshold_bytes is None else combine_threshold_bytes

    def build(shaping: Shaping) -> Plan:
        part = partition(seeded.graph, mesh, prop, shaping, name=name)
        program = combine(part.program, threshold, part.fine)
        return Plan(name, mesh, seeded.graph, prop, part, program, index(program, part.fine, seeded.graph),
                    in_tree=in_tree, out_tree=out_tree, in_names=in_names, donate_argnums=tuple(donate_argnums),
                    combine_threshold_bytes=threshold, tactics=seeded.tactics)

    with outside_user_mesh(), own_mesh(), gc_paused():
        plan = build(shaping)
        if shaping.decides_matmul and any(s.kind == "matmul" for s in plan.ctx.shaped):
            plan = _cheaper_without_matmul(plan, build)
    warn_fallbacks(plan.ctx)
    return plan


_GC_PAUSED = [False]  # set while gc_paused holds the collector off


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a plan is built.

    Planning allocates many small, long-lived objects (IR values, shardings, projections, the
    per-device jaxpr's equations and tracers): each young collection then walks them again and
    the full ones walk the whole heap. For 96 transformer blocks that was ~0.6-0.9 s of a ~2.3 s
    plan, none of it reclaiming much. Reference counting still frees acyclic garbage at once;
    the cycles made meanwhile are collected once the collector is back on. Nested plans (a
    gp.spmd inside another) leave it to the outermost; a collector the caller turned off stays
    off; the sharding search runs with it on (``gc_resumed``)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    _GC_PAUSED[0] = True
    try:
        yield
    finally:
        _GC_PAUSED[0] = False
        gc.enable()


@contextlib.contextmanager
def gc_resumed() -> Iterator[None]:
    """The collector back on inside ``gc_paused``: for work that makes garbage for long (the
    sharding search traces a program per candidate for up to its time budget)."""
    if not _GC_PAUSED[0]:
        yield
        return
    _GC_PAUSED[0] = False
    gc.enable()
    try:
        yield
    finally:
        gc.disable()
        _GC_PAUSED[0] = True


def _cheaper_without_matmul(plan: Plan, build) -> Plan:
    """The plan with its collective matmuls, or the one without them where the hardware's
    overlapped schedule of the whole program says that is faster (partitioner/shaping.py)."""
    hw = plan.shaping.hardware
    alt = build(attrs.evolve(plan.shaping, matmul=False))
    t, t_alt = plan.cost(hw, overlap=True).step_s, alt.cost(hw, overlap=True).step_s
    n = sum(s.kind == "matmul" for s in plan.ctx.shaped)
    if t_alt <= t:
        alt.ctx.notes.append(f"collective matmul of {n} dot(s) not used: the program's overlapped step on {hw.name} "
                             f"is {t * 1e6:.1f} us with it, {t_alt * 1e6:.1f} us without")
        return alt
    plan.ctx.notes.append(f"collective matmul of {n} dot(s): the program's overlapped step on {hw.name} is "
                          f"{t * 1e6:.1f} us with it, {t_alt * 1e6:.1f} us without")
    return plan


def _drop_input_annotations(graph: Graph, in_dims: Sequence[Optional[Dims]]) -> None:
    """Remove the leading in_shardings annotations of a gp.spmd function's own jaxpr, their uses
    rewired to the inputs (which carry the same shardings as seeds)."""
    k, replace = 0, {}
    for v, d in zip(graph.inputs, in_dims):
        if d is None:
            continue
        op = graph.ops[k] if k < len(graph.ops) else None
        if op is None or op.prim != "gspmd_annotate" or op.inputs[0] is not v:
            return  # not the jaxpr Spmd._build makes: keep every annotation
        replace[op.outputs[0].id] = v
        k += 1
    del graph.ops[:k]
    for op in graph.walk():
        op.inputs = [replace.get(x.id, x) for x in op.inputs]
    graph.outputs = [replace.get(x.id, x) for x in graph.outputs]


def _next_id(graph: Graph) -> int:
    m = max([v.id for v in graph.values()] + [op.id for op in graph.walk()] + [-1])
    return m + 1


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
