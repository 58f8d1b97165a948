"""The compiler: a closed jaxpr and a mesh in, a Plan out.

    plan = plan_jaxpr(closed, mesh, name="f", in_dims=...)
"""
from __future__ import annotations

from typing import Optional, Sequence

import attrs
import jax

from .annotate import annotate_p
from .constraints import outside_user_mesh
from .ir import Graph, Op, Value
from .layout import own_mesh
from .mesh import Mesh
from .partitioner.shaping import Shaping
from .plan import Plan
from .propagation import Propagation, Seed
from .specs import annotation_dims
from .trace import trace_jaxpr

Dims = tuple  # per tensor dim: a tuple of AxisRefs


def plan_jaxpr(closed, mesh: Mesh, *, name: str, in_tree=None, out_tree=None, in_names: Optional[list[str]] = None,
               in_dims: Optional[Sequence[Optional[Dims]]] = None, in_labels: Optional[Sequence[str]] = None,
               out_labels: Optional[Sequence[str]] = None, donate_argnums: Sequence[int] = (),
               boundary: bool = False, combine_threshold_bytes: Optional[int] = None, tactics: Sequence = (),
               leaves=None, args_tree=None, shaping: Shaping = Shaping()) -> Plan:
    """Plan a closed jaxpr over ``mesh``: its ``gp.annotate`` ops are the annotations; ``in_dims``
    seeds the inputs themselves (in_shardings, or the layouts inputs arrive in; ``in_labels`` say
    which, for ``plan.explain``).

    ``boundary``: the jaxpr is a gp.spmd function's own (``Spmd._build``): its first annotate ops
    are the in_shardings of the inputs that have ``in_dims`` (dropped: the inputs are seeded
    instead) and each output is an annotate op of its own (the out_shardings, or unspecified).
    ``shaping``: collectives shaped for a hardware (partitioner/shaping.py).
    """
    graph = trace_jaxpr(closed, mesh)
    n_in = len(graph.inputs)
    in_dims = list(in_dims) if in_dims is not None else [None] * n_in
    in_names = in_names or [f"arg{i}" for i in range(n_in)]
    in_labels = in_labels or [f"in_shardings of {nm}" for nm in in_names]
    for v, nm in zip(graph.inputs, in_names):
        v.name = v.name or nm
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
        ctx = apply_tactics(tactics, TacticContext(graph, mesh, leaves, seeds, args_tree, tuple(donate_argnums)))
        seeds, log = ctx.seeds(), tuple(ctx.log)
    prop = Propagation(graph, mesh, seeds).run()
    if in_tree is None:
        in_tree = jax.tree_util.tree_structure([0] * n_in)
    if out_tree is None:
        out_tree = jax.tree_util.tree_structure([0] * len(graph.outputs))
    with outside_user_mesh(), own_mesh():
        extra = {} if combine_threshold_bytes is None else {"combine_threshold_bytes": combine_threshold_bytes}
        plan = Plan(name, mesh, graph, prop, in_tree, out_tree, in_names, donate_argnums=tuple(donate_argnums),
                    shaping=shaping, **extra)
        if shaping.decides_matmul and any(s.kind == "matmul" for s in plan.ctx.shaped):
            plan = _cheaper_without_matmul(plan, lambda s: Plan(name, mesh, graph, prop, in_tree, out_tree, in_names,
                                                                 donate_argnums=tuple(donate_argnums), shaping=s,
                                                                 **extra))
    plan.tactics = log
    return plan


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
