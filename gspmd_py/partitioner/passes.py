"""The passes that build the per-device program from a propagation, as records, and the one
driver that runs pass records: the compiler (compiler.py's ``PASSES``) and the search's
pricer (search/price.py) run the same records, so the program a candidate is priced by is
built by the code that builds the program that runs.

    part = partition_graph(graph, mesh, prop)        # partition: the program + diagnostics
    raw = index_program(part.program, part.fine, graph)                  # index
    program = combine(raw, threshold, part.axis_env)  # combine (program/combine.py)
    idx = reindex(raw, program, part.fine, graph)    # reindex: raw itself when nothing merged

A ``Pass`` names its input (the entries of the state it reads), its output (the entry it
writes) and what the compiler's dumps and verifier read beside the output (its context,
views/pass_check.py); ``run_passes`` runs a list of them over a state (a dict by name),
handing each output to an observer. ``program_passes`` is the slice of a list from
``partition`` to ``reindex``: what the search runs per candidate, from the propagation it
made (``PROGRAM_PASSES``, the compiler's slice, by default; the compiler hands the search
the slice of its own list).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Sequence

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
from ..program.combine import combine
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


# -- pass records and their driver -----------------------------------------------------
@attrs.frozen
class Pass:
    """One compiler pass as a record: ``run`` computes its output from its input, the
    entries ``reads`` of the state (a read-only mapping of exactly those); the output becomes
    the state's entry ``writes``; ``context``: the entries the observer (the compiler's dumps
    and verifier, views/pass_check.py) reads beside the output."""

    name: str
    run: Callable[[Mapping[str, Any]], Any]
    reads: tuple[str, ...]
    writes: str
    context: tuple[str, ...] = ()


#: what sees each pass's output: (pass name, output, **context) -> None
Observer = Callable[..., Any]


def run_passes(passes: Sequence[Pass], state: dict[str, Any], observe: Optional[Observer] = None) -> dict[str, Any]:
    """Run ``passes`` in order over ``state`` (updated in place and returned): each reads its
    input from it and writes its output to it; ``observe`` sees each output with its context."""
    for p in passes:
        missing = [k for k in p.reads + p.context if k not in state]
        if missing:
            raise ValueError(f"compiler pass {p.name!r} reads {missing}, which no pass before it wrote "
                                f"(the state holds {sorted(state)})")
        out = p.run(MappingProxyType({k: state[k] for k in p.reads}))
        state[p.writes] = out
        if observe is not None:
            observe(p.name, out, **{k: state[k] for k in p.context})
    return state


def program_passes(passes: Sequence[Pass]) -> tuple[Pass, ...]:
    """The slice of ``passes`` that builds the program from a propagation: ``partition`` to
    ``reindex``, whatever was put between them."""
    names = [p.name for p in passes]
    return tuple(passes[names.index("partition"): names.index("reindex") + 1])


#: the passes from a propagation to the indexed program; the state they start from holds
#: graph, mesh, prop (a Propagation), shaping (partitioner/shaping.py) and threshold (the
#: combiner's, bytes); they add part (Partitioned), raw (its index), program (combined) and
#: idx (the combined program's index: the plan's collective records)
PROGRAM_PASSES: tuple[Pass, ...] = (
    Pass("partition", lambda s: partition_graph(s["graph"], s["mesh"], s["prop"], s["shaping"]),
         ("graph", "mesh", "prop", "shaping"), "part", ("graph",)),
    Pass("index", lambda s: index_program(s["part"].program, s["part"].fine, s["graph"]), ("part", "graph"), "raw",
         ("graph",)),
    Pass("combine", lambda s: combine(s["raw"], s["threshold"], s["part"].axis_env), ("raw", "threshold", "part"),
         "program"),
    Pass("reindex", lambda s: reindex(s["raw"], s["program"], s["part"].fine, s["graph"]),
         ("raw", "program", "part", "graph"), "idx", ("graph", "raw", "part")),
)
