"""The partitioner's two passes over plain data, shared by the compiler (compiler.py's
``partition`` and ``index``) and the search's pricer (search/price.py):

    part = partition_graph(graph, mesh, prop)        # the per-device program + diagnostics
    raw = index_program(part.program, part.fine, graph)
    program = combine(raw, threshold, part.axis_env)  # program/combine.py
    idx = reindex(raw, program, part.fine, graph)    # raw itself when nothing was merged
"""
from __future__ import annotations

from typing import Mapping

import attrs
import jax
from jax.extend.core import ClosedJaxpr

from ..core.ir import Graph
from ..core.mesh import Mesh
from ..propagation import Propagation
from ..core.sharding import Sharding
from .context import Ctx
from .diagnostics import Diagnostics
from ..core.fine_mesh import FineMesh
from .hierarchy import link_refs
from .program import OpPlan, build_body, fine_plan, op_label
from ..program.program_index import ProgramIndex
from .pvalue import FineDims
from .shaping import Shaping


@attrs.frozen(eq=False)
class Partitioned:
    """The per-device program of a propagated graph (before the combiner) and its diagnostics.

    ``diagnostics``: what the partitioner found while it built the program (notes,
    fallbacks, host calls, shaped collectives, what the program holds per value: a value,
    diagnostics.py); ``shardings``: value id -> Sharding; ``in_dims`` / ``out_dims``: the
    inputs' and outputs' shardings over the fine mesh; ``op_plans``: op id -> the projection
    the partitioner executed, in fine axes; ``shaping``: how its collectives were shaped for
    a hardware."""

    fine: FineMesh
    shaping: Shaping
    diagnostics: Diagnostics
    shardings: Mapping[int, Sharding]
    in_dims: tuple[FineDims, ...]
    out_dims: tuple[FineDims, ...]
    program: ClosedJaxpr
    op_plans: Mapping[int, OpPlan]

    @property
    def axis_env(self) -> list[tuple[str, int]]:
        return list(zip(self.fine.names, self.fine.sizes))


def partition_graph(graph: Graph, mesh: Mesh, prop: Propagation, shaping: Shaping = Shaping()) -> Partitioned:
    """The per-device program that computes ``graph`` under ``prop``'s shardings, traced once
    (``jax.make_jaxpr`` over the fine mesh's axes), and its diagnostics."""
    shardings = {v.id: Sharding.of(mesh, prop.dims_of(v)) for v in graph.all_values()}
    refs = [a for s in shardings.values() for a in s.used_axes]
    refs += [a for proj in prop.projections.values() for axes in proj.factors.values() for a in axes]
    if shaping.hardware is not None:  # mesh axes crossing a node boundary, split there (hierarchy.py)
        refs += link_refs(mesh, shaping.hardware, refs)
    fine = FineMesh.build(mesh, refs)
    fdims = lambda v: fine.fine_dims(shardings[v.id].dims)  # noqa: E731
    in_dims = tuple(fdims(v) for v in graph.inputs)
    out_dims = tuple(fdims(v) for v in graph.outputs)
    made: dict = {}  # id(projection) -> (projection, its plan): repeated layers share projections
    plans = {}
    for i, p in prop.projections.items():
        got = made.get(id(p))
        if got is None:
            got = made[id(p)] = (p, fine_plan(fine, p))
        plans[i] = got[1]
    ctx = Ctx(fine, shaping, want={v.id: fdims(v) for v in graph.all_values()}, rules=prop.rules, plans=plans)
    body = build_body(graph, ctx, in_dims, out_dims)
    local = [jax.ShapeDtypeStruct(ctx.local_shape(v.shape, d), v.dtype) for v, d in zip(graph.inputs, in_dims)]
    program = jax.make_jaxpr(body, axis_env=list(zip(fine.names, fine.sizes)))(*local)
    return Partitioned(fine, shaping, ctx.diagnostics(), shardings, in_dims, out_dims, program, plans)


def index_program(program: ClosedJaxpr, fine: FineMesh, graph: Graph) -> ProgramIndex:
    """The program index (program/program_index.py) of ``program``, its equations labelled by the op
    of ``graph`` that caused them."""
    labels = {op.id: op_label(op) for op in graph.walk()}
    return ProgramIndex.build(program, fine, lambda i: labels.get(i, f"op {i}"))


def reindex(idx: ProgramIndex, program: ClosedJaxpr, fine: FineMesh, graph: Graph) -> ProgramIndex:
    """The index of ``program``, the combiner's result from ``idx``: ``idx`` itself when the
    combiner left the program as it was, else the index of what it made."""
    return idx if program is idx.program else index_program(program, fine, graph)
