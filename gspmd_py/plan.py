"""A Plan: everything gspmd_py decided for one function and one set of input shapes, as a value.

    plan = f.plan(x, w)          # compiler.py's passes: trace -> ... -> index; runs nothing
    plan.sharding_of("hidden"), plan.collectives, plan.report(), plan.spmd_text()

A Plan is immutable (a frozen attrs class: setting an attribute raises). Its fields are the
passes' results; what is derived from them (the boundary's specs and shapes, the JAX mesh,
its first stage) is computed on first use and kept (pure functions of the fields). Its
stages, as JAX's (runtime/stages.py), are the one run-time object::

    lowered = plan.lower()        # Lowered: .as_text() (StableHLO), .compile(); the plan's own, built once
    compiled = lowered.compile()  # Compiled: .as_text() (HLO), compiled(*args) runs it; compiled once

``plan.run(leaves)`` and ``plan.place(leaves)`` run that Compiled stage (gp.spmd's call runs
the same), so however a plan is run it compiles once. A note added after the build makes a
new plan (``with_notes``).
"""
from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any, Mapping, Optional

import attrs
import jax
from jax.extend.core import ClosedJaxpr
from jax.sharding import PartitionSpec as JP

from .core.errors import AnnotationError, NotPicklableError, ShardingError
from .core.ir import Graph, Value
from .core.mesh import Mesh
from .program.combine import DEFAULT_THRESHOLD_BYTES
from .program.collective import Collective
from .partitioner.diagnostics import Diagnostics, Fallback
from .core.fine_mesh import FineMesh
from .partitioner.program import OpPlan, boundary_out_dims
from .program.program_index import ProgramIndex
from .partitioner.pvalue import FineDims, ceil_div, local_shape, shards
from .partitioner.shaping import Shaping
from .propagation import Propagation
from .runtime.layout import fine_spec
from .runtime.stages import Lowered
from .core.sharding import Sharding


def _read_only(m: Mapping) -> Mapping:
    return m if isinstance(m, MappingProxyType) else MappingProxyType(dict(m))


@attrs.frozen(slots=False, eq=False, repr=False)
class Plan:
    """Everything gspmd_py decided for one function and one set of input shapes (built by
    compiler.plan_jaxpr from its passes' results; see the module doc). ``f.plan(*args)``
    returns one; nothing in it runs until it is lowered and compiled.

    What a user reads: ``sharding_of``, ``in_shardings``, ``out_shardings``, ``collectives``,
    ``fallbacks``, ``report()``, ``explain()``, ``visualize()``, ``save_html()``, ``cost()``,
    ``spmd_text()``, ``lower_text()``, ``lower()``.

    Fields (the passes' results, for contributors): ``fn_name``; ``mesh`` (the gp.Mesh);
    ``graph`` (the traced IR); ``prop`` (the propagation: shardings, projections, provenance);
    ``fine`` (the execution mesh, sub-axes split); ``shaping``; ``diagnostics`` (notes,
    fallbacks); ``program`` (the per-device jaxpr); ``index`` (the program index); ``in_dims``
    and ``out_dims`` (the boundary over the fine mesh); ``op_plans``; ``in_tree``, ``out_tree``
    and ``in_names`` (the pytrees and the flat inputs' names); ``donate_argnums``;
    ``combine_threshold_bytes``; ``tactics`` (what each gp.tactics entry decided); ``out_weak``
    (per output, whether its traced type is weak); ``out_memory_kinds`` and ``in_memory_kinds``
    (per output / input, the memory kind it is returned in / taken from, None: device memory)."""

    fn_name: str
    mesh: Mesh
    graph: Graph  # the traced and seeded IR
    prop: Propagation  # a sharding per value, a projection per op; provenance for explain
    fine: FineMesh  # the execution mesh: the mesh's axes split where the plan uses sub-axes
    shaping: Shaping  # collectives shaped for a hardware (Shaping(): none)
    diagnostics: Diagnostics  # the partition pass's notes, fallbacks, host calls..., then the boundary's notes
    program: ClosedJaxpr  # the per-device program, collectives combined
    index: ProgramIndex  # per equation its op, loop counts, collectives
    in_dims: tuple[FineDims, ...]  # the inputs' shardings over the fine mesh
    out_dims: tuple[FineDims, ...]  # the outputs' shardings over the fine mesh (uneven ones as planned)
    op_plans: Mapping[int, OpPlan] = attrs.field(converter=_read_only)  # op id -> the projection executed, fine axes
    _shardings: Mapping[int, Sharding] = attrs.field(converter=_read_only)  # value id -> Sharding
    in_tree: Any  # the pytree structure of the inputs (flat leaves: in_names)
    out_tree: Any  # ... and of the outputs
    in_names: tuple[str, ...] = attrs.field(converter=tuple)  # ``arg0``, ``arg1['w']``..., one per flat input
    donate_argnums: tuple[int, ...] = attrs.field(default=(), converter=tuple)  # flat input indices
    combine_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES
    tactics: tuple = attrs.field(default=(), converter=tuple)  # search.context.TacticRecord per gp.tactics entry
    # per output, whether its traced type is weak (``0.1 * step``: ~float32[]); the program returns it so, as jax.jit
    out_weak: tuple[bool, ...] = attrs.field(default=(), converter=tuple)
    # per output, the memory kind it is returned in ("pinned_host"; None: device memory): its out_sharding's, else
    # its traced type's (a jax.device_put to host memory inside), as jax.jit returns it
    out_memory_kinds: tuple[Optional[str], ...] = attrs.field(default=(), converter=tuple)
    # per input, the memory kind its in_sharding asks for ("pinned_host"; None: device memory): the program takes it
    # there, as jax.jit does (the arguments are placed there; XLA reads them from it)
    in_memory_kinds: tuple[Optional[str], ...] = attrs.field(default=(), converter=tuple)

    def __repr__(self) -> str:
        return f"<Plan of {self.fn_name} on {self.mesh}>"

    def __copy__(self) -> "Plan":
        return self  # immutable: a copy is the plan itself

    def __deepcopy__(self, memo) -> "Plan":
        return self

    def __reduce__(self):
        raise NotPicklableError(
            f"{self!r} cannot be pickled: it holds the traced jaxpr and the built per-device program, which do "
            f"not pickle. Pickle what rebuilds it (the gp.spmd function, or fn, the gp.Mesh and the specs "
            f"plan.in_shardings / plan.out_shardings) and call .plan(...) again where it is loaded")

    def with_notes(self, *notes: str) -> "Plan":
        """This plan with ``notes`` added to its diagnostics (a new plan; self is unchanged)."""
        return attrs.evolve(self, diagnostics=self.diagnostics.with_notes(*notes)) if notes else self

    # -- what the views, the boundary and the primitive read -------------------------
    def sharding(self, v: Value) -> Sharding:
        """The sharding propagation chose for value ``v`` of ``self.graph``."""
        return self._shardings[v.id]

    def fine_dims(self, v: Value) -> FineDims:
        """``v``'s sharding over the fine mesh (per dim its fine mesh axes)."""
        return self.fine.fine_dims(self._shardings[v.id].dims)

    def local_shape(self, shape, dims) -> tuple[int, ...]:
        """The per-device shape of a value of global ``shape`` sharded as ``dims`` (fine axes per dim)."""
        return local_shape(shape, dims, self.fine.size_of)

    def shards(self, axes) -> int:
        """How many shards the fine mesh ``axes`` make."""
        return shards(self.fine.size_of, axes)

    @property
    def fallbacks(self) -> list[Fallback]:
        """The ops partitioned by the replicated fallback (each with its reason); [] when none."""
        return list(self.diagnostics.fallbacks)

    @property
    def collectives(self) -> list[Collective]:
        """Every collective of the per-device program, in program order (a list of gp.Collective:
        kind, mesh axes, bytes per device, the op that caused it, whether it runs in a loop)."""
        return list(self.index.collectives)

    @functools.cached_property
    def out_names(self) -> tuple[str, ...]:
        """One name per flat output, as ``in_names`` names the inputs: ``out`` for a function
        returning one array, else ``out`` and the leaf's pytree path (``out[0]``,
        ``out['loss']``). ``sharding_of`` and ``explain`` take them (and ``out0``, ``out1``...)."""
        n = len(self.graph.outputs)
        if self.out_tree is None:
            return tuple(f"out{i}" for i in range(n))
        leaves = jax.tree_util.tree_unflatten(self.out_tree, list(range(n)))
        return tuple("out" + jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(leaves)[0])

    @functools.cached_property
    def out_fine_dims(self) -> tuple[FineDims, ...]:
        """The outputs' layouts as the program returns them (an uneven output's, evened)."""
        return tuple(boundary_out_dims(self.fine.size_of, v.shape, d) for v, d in zip(self.graph.outputs, self.out_dims))

    @functools.cached_property
    def in_specs(self) -> tuple[JP, ...]:
        """The inputs' PartitionSpecs over the fine mesh (a zero-size input crosses replicated:
        runtime/stages.py's jit_program)."""
        return tuple(fine_spec(d if v.size else ((),) * v.rank) for v, d in zip(self.graph.inputs, self.in_dims))

    @functools.cached_property
    def out_specs(self) -> tuple[JP, ...]:
        """The outputs' PartitionSpecs over the fine mesh, as the program returns them."""
        return tuple(fine_spec(d) for d in self.out_fine_dims)

    @functools.cached_property
    def padded_in_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The inputs' global shapes as the program takes them: uneven dims padded to whole shards."""
        return tuple(tuple(ceil_div(n, self.shards(a)) * self.shards(a) if a else n for n, a in zip(v.shape, d))
                     for v, d in zip(self.graph.inputs, self.in_dims))

    @functools.cached_property
    def jax_mesh(self):
        """The JAX mesh the program runs on (the fine mesh's axes; abstract for an abstract mesh)."""
        return self.fine.jax_mesh()

    # -- its stages: Plan -> Lowered -> Compiled (runtime/stages.py) ----------------------
    def lower(self, platforms=None) -> Lowered:
        """The plan's ``Lowered`` stage (runtime/stages.py): the program's jit, traced and
        lowered on first use, built once (``platforms``: lowered for these instead, a new
        stage; default the backend's, CPU on an abstract mesh). ``.as_text()``: its StableHLO;
        ``.compile()``: its ``Compiled`` (``.as_text()``, called as ``f`` is), compiled once."""
        return self._lowered if platforms is None else Lowered.of(self, platforms=platforms)

    @functools.cached_property
    def _lowered(self) -> Lowered:
        return Lowered.of(self)

    def lower_text(self) -> str:
        """StableHLO of the SPMD program, lowered for CPU (works on abstract meshes too):
        ``self.lower(("cpu",)).as_text()``."""
        return self.lower(("cpu",)).as_text()

    def place(self, leaves) -> list:
        """Every flat input leaf as a global jax.Array in its input sharding (the plan's
        Compiled stage: ``self.lower().compile().place``)."""
        return self.lower().compile().place(leaves)

    def run(self, leaves):
        """The program on the flat input leaves: ``self.lower().compile().run`` (compiled on
        the first run, that stage run after)."""
        return self.lower().compile().run(leaves)

    # -- queries --------------------------------------------------------------------
    def _value(self, name: str) -> Value:
        if not isinstance(name, str):
            raise ShardingError(f"a value of {self.fn_name} is named by a string (a gp.tag name, 'arg0', 'out0'), "
                                f"got {type(name).__name__} {name!r}")
        found = [v for v in self.graph.all_values() if v.name == name]
        if len({self._shardings[v.id] for v in found}) > 1:
            shown = "; ".join(f"{v.type_str} {self._shardings[v.id].shardy()}"
                              + (f" at {v.producer.source}" if v.producer is not None and v.producer.source else "")
                              for v in found[:3])
            raise AnnotationError(f"{len(found)} values of {self.fn_name} are tagged {name!r} and they are sharded "
                                  f"differently ({shown}{'; ...' if len(found) > 3 else ''}): give each its own "
                                  f"gp.tag name")
        if found:
            return found[0]
        if name in self.in_names:
            return self.graph.inputs[self.in_names.index(name)]
        if name in self.out_names:
            return self.graph.outputs[self.out_names.index(name)]
        if name.startswith("out") and name[3:].isdigit() and int(name[3:]) < len(self.graph.outputs):
            return self.graph.outputs[int(name[3:])]
        known = sorted({v.name for v in self.graph.values() if v.name} | set(self.in_names)) + list(self.out_names)
        raise ShardingError(f"no value named {name!r} in {self.fn_name}; named values: {known} (and out0, out1, ...)")

    def sharding_of(self, name: str) -> Sharding:
        """The gp.Sharding of the value called ``name``: a ``gp.tag`` name, an input's path
        (``arg0``, ``arg1['w']``, as ``in_names``) or an output's (``out``, ``out['loss']``, as
        ``out_names``; or by position, ``out0``, ``out1``, ...).
        ``.spec`` is its ``P(...)``; ``str()`` the GSPMD tile form."""
        return self._shardings[self._value(name).id]

    @property
    def in_shardings(self):
        """The inputs' gp.Shardings, in the pytree structure of the arguments (propagation's
        choice where ``in_shardings`` said None)."""
        return jax.tree_util.tree_unflatten(self.in_tree, [self._shardings[v.id] for v in self.graph.inputs])

    @property
    def out_shardings(self):
        """The outputs' gp.Shardings, in the pytree structure of the function's result."""
        return jax.tree_util.tree_unflatten(self.out_tree, [self._shardings[v.id] for v in self.graph.outputs])

    def explain(self, name: str) -> str:
        """Why the value called ``name`` (as ``sharding_of``) has its sharding: the chain of ops
        back to the annotation, argument sharding or tactic each of its dims came from."""
        return self.prop.explain(self._value(name), name)

    def spmd_text(self) -> str:
        """The per-device program (the body of the shard_map), as a jaxpr."""
        return str(self.program)

    def cost(self, hardware, *, donate=None, overlap: bool = False, while_trips: int = 1):
        """Predicted step time, memory and traffic per device on ``hardware`` (a gp.Hardware):
        a gp.Cost (see gspmd_py/cost/model.py). ``donate``: flat input indices whose buffers
        may be reused (default: the plan's donated inputs)."""
        from .cost import cost

        return cost(self.cost_input(), hardware, donate=donate, overlap=overlap, while_trips=while_trips)

    def cost_input(self):
        """What the cost model reads of this plan (cost/model.py's CostInput): the program
        index, the mesh, the donated flat inputs."""
        from .cost import CostInput

        return CostInput(self.index, self.mesh, self.donate_argnums)

    def report(self) -> str:
        """Per-op table: global/local shapes, shardings, collectives; fallbacks and notes."""
        from .views.report import report

        text = report(self)
        if self.tactics:
            from .search.context import tactics_text

            text += "\n" + tactics_text(self.tactics)
        return text

    def visualize(self, name: str, *, show: bool = True) -> str:
        """Print the tile grid of value ``name`` over the mesh (as jax.debug.visualize_array_sharding;
        coloured with rich when installed) and return it as text."""
        from .views.visualize import visualize

        v = self._value(name)
        s = self._shardings[v.id]
        return visualize(s, v.shape, f"{name} {v.type_str} {s.spec!r} on {self.mesh}", show=show)

    def save_html(self, path: str | None = None) -> str:
        """Write one self-contained HTML page (per-op table, collectives, tile grids, explain
        chains) to ``path``; returns its text."""
        from .views.html import save_html

        return save_html(self, path)
