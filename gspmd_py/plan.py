"""A Plan: everything gspmd_py decided for one function and one set of input shapes.

    plan = f.plan(x, w)          # compiler.py's passes: trace -> ... -> index; runs nothing
    plan.sharding_of("hidden"), plan.collectives, plan.report(), plan.spmd_text()
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import jaxpr_as_fun
from jax.extend.core.primitives import jit_p
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from .runtime.boundary import Boundary
from .errors import AnnotationError, ShardingError
from .ir import Graph, Value
from .runtime.layout import boundary_sharding, layout_notes, staged_sharding
from .mesh import Mesh
from .partitioner.context import Collective
from .partitioner.host_calls import raise_failures
from .partitioner.program import boundary_out_dims
from .partitioner.combine import DEFAULT_THRESHOLD_BYTES
from .partitioner.pvalue import FineDims, ceil_div, local_shape, shards
from .propagation import Propagation
from .sharding import Sharding


class Plan:
    """Everything gspmd_py decided for one function and one set of input shapes (built by
    compiler.plan_jaxpr from its passes' results)."""

    def __init__(self, fn_name: str, mesh: Mesh, graph: Graph, prop: Propagation, partitioned, program,
                 index, *, in_tree, out_tree, in_names: list[str], donate_argnums: tuple[int, ...] = (),
                 combine_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, tactics: tuple = ()):
        self.fn_name, self.mesh, self.graph, self.prop = fn_name, mesh, graph, prop
        self.donate_argnums = tuple(donate_argnums)  # flat input indices, passed to jax.jit
        self.combine_threshold_bytes = combine_threshold_bytes
        self.tactics = tuple(tactics)  # search.context.TacticRecord per gp.tactics entry, in order
        self._in_tree, self._out_tree, self._in_names = in_tree, out_tree, in_names
        self._shardings = partitioned.shardings
        self.fine, self.shaping = partitioned.fine, partitioned.shaping
        self.diagnostics = partitioned.diagnostics  # the partition pass's, then the boundary's notes
        self.op_plans = partitioned.op_plans
        self.program = program  # the per-device program, collectives combined
        self.index = index  # partitioner/program_index.py: per equation its op, loop counts, collectives
        self._collectives = tuple(index.collectives)
        self._build(partitioned.in_dims, partitioned.out_dims)

    # -- what the views, the boundary and the primitive read -------------------------
    @property
    def in_names(self) -> tuple[str, ...]:
        """The inputs' names (``arg0``, ``arg1['w']``...), one per flat input."""
        return tuple(self._in_names)

    def sharding(self, v: Value) -> Sharding:
        """The sharding propagation chose for value ``v`` of ``self.graph``."""
        return self._shardings[v.id]

    def fine_dims(self, v: Value) -> FineDims:
        """``v``'s sharding over the fine mesh (per dim its fine mesh axes)."""
        return self.fine.fine_dims(self._shardings[v.id].dims)

    @property
    def out_fine_dims(self) -> tuple[FineDims, ...]:
        """The outputs' layouts as the program returns them (an uneven output's, evened)."""
        return tuple(self._out_fdims)

    @property
    def jitted(self):
        """The ``jax.jit`` of the SPMD program: padded global inputs in, global outputs out."""
        return self._jitted

    @property
    def traced(self):
        """``self.jitted`` traced once at the padded input shapes (``jax.stages.Traced``)."""
        return self._traced

    @property
    def boundary(self):
        """How arguments enter the program (boundary.Boundary), built on first use."""
        if self._boundary is None:
            self._boundary = Boundary.of(self)
        return self._boundary

    def staged_out_shardings(self) -> tuple:
        """Per output: (NamedSharding over the user's mesh, whether it differs from the plan's
        layout): how an output leaves the program staged into a caller's trace."""
        if self._staged_out is None:
            self._staged_out = tuple(staged_sharding(self, d) for d in self._out_fdims)
        return self._staged_out

    @property
    def ctx(self):
        """The partition pass's diagnostics (``self.diagnostics``), under the name plans had for them before."""
        return self.diagnostics

    def local_shape(self, shape, dims) -> tuple[int, ...]:
        """The per-device shape of a value of global ``shape`` sharded as ``dims`` (fine axes per dim)."""
        return local_shape(shape, dims, self.fine.size_of)

    def shards(self, axes) -> int:
        """How many shards the fine mesh ``axes`` make."""
        return shards(self.fine.size_of, axes)

    def note(self, text: str) -> None:
        self.diagnostics = self.diagnostics.with_notes(text)

    def _build(self, in_dims, out_dims) -> None:
        """The executable: the boundary specs and shapes, the jit of the program, traced once."""
        g = self.graph
        self.jax_mesh = self.fine.jax_mesh()
        spec = lambda dims: JP(*[tuple(d) if len(d) > 1 else (d[0] if d else None) for d in dims])
        # a zero-size value holds no data: it crosses the boundary replicated (see _jit_program)
        self.in_specs = tuple(spec(d if v.size else ((),) * v.rank) for v, d in zip(g.inputs, in_dims))
        self._out_fdims = [boundary_out_dims(self.fine.size_of, v.shape, d) for v, d in zip(g.outputs, out_dims)]
        self.out_specs = tuple(spec(d) for d in self._out_fdims)
        self.padded_in_shapes = [tuple(ceil_div(n, self.shards(a)) * self.shards(a) if a else n for n, a in zip(v.shape, d))
                                 for v, d in zip(g.inputs, in_dims)]
        # outputs over the user's mesh where the layout can be said there (layout.py); same devices, no copy
        self.out_jax_shardings = None if self.mesh.is_abstract else tuple(
            boundary_sharding(self, d) for d in self._out_fdims)
        self.diagnostics = self.diagnostics.with_notes(*layout_notes(self))
        self._jitted = _jit_program(self, in_dims)
        avals = [jax.ShapeDtypeStruct(s, v.dtype) for s, v in zip(self.padded_in_shapes, g.inputs)]
        self._traced = self._jitted.trace(*avals)
        self._compiled = None
        self._boundary = None
        self._staged_out = None

    # -- queries --------------------------------------------------------------------
    def _value(self, name: str) -> Value:
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
        if name in self._in_names:
            return self.graph.inputs[self._in_names.index(name)]
        if name.startswith("out") and name[3:].isdigit() and int(name[3:]) < len(self.graph.outputs):
            return self.graph.outputs[int(name[3:])]
        known = sorted({v.name for v in self.graph.values() if v.name} | set(self._in_names))
        raise ShardingError(f"no value named {name!r} in {self.fn_name}; named values: {known} (and out0, out1, ...)")

    def sharding_of(self, name: str) -> Sharding:
        return self._shardings[self._value(name).id]

    @property
    def in_shardings(self):
        return jax.tree_util.tree_unflatten(self._in_tree, [self._shardings[v.id] for v in self.graph.inputs])

    @property
    def out_shardings(self):
        return jax.tree_util.tree_unflatten(self._out_tree, [self._shardings[v.id] for v in self.graph.outputs])

    @property
    def collectives(self) -> list[Collective]:
        return list(self._collectives)

    @property
    def fallbacks(self):
        return list(self.diagnostics.fallbacks)

    def explain(self, name: str) -> str:
        return self.prop.explain(self._value(name), name)

    def spmd_text(self) -> str:
        """The per-device program (the body of the shard_map), as a jaxpr."""
        return str(self.program)

    def lower_text(self) -> str:
        """StableHLO of the SPMD program (works on abstract meshes too)."""
        return self._traced.lower(lowering_platforms=("cpu",)).as_text()

    def cost(self, hardware, *, donate=None, overlap: bool = False, while_trips: int = 1):
        """Predicted step time, memory and traffic per device on ``hardware`` (a gp.Hardware):
        a gp.Cost (see gspmd_py/cost/model.py). ``donate``: flat input indices whose buffers
        may be reused (default: the plan's donated inputs)."""
        from .cost import cost

        return cost(self, hardware, donate=donate, overlap=overlap, while_trips=while_trips)

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
        return visualize(s, v.shape, f"{name} {v.type_str} {s.shardy()} on {self.mesh}", show=show)

    def save_html(self, path: str | None = None) -> str:
        """Write one self-contained HTML page (per-op table, collectives, tile grids, explain
        chains) to ``path``; returns its text."""
        from .views.html import save_html

        return save_html(self, path)

    # -- execution --------------------------------------------------------------------
    def compiled(self):
        if self.mesh.is_abstract:
            raise ShardingError(f"{self.mesh} is abstract: it can be planned and lowered, not run")
        if self._compiled is None:
            self._compiled = self._traced.lower().compile()
        return self._compiled

    def place(self, leaves):
        return self.boundary.place(leaves)

    def run(self, leaves):
        if self.diagnostics.host_calls:  # waited for, so that a failed callback is raised here, as itself
            with raise_failures(self.diagnostics.host_calls, self.fn_name):
                outs = jax.block_until_ready(self.boundary.call(self._compiled or self.compiled(), leaves))
        else:
            outs = self.boundary.call(self._compiled or self.compiled(), leaves)
        return jax.tree_util.tree_unflatten(self._out_tree, outs)


def _jit_program(plan: Plan, in_dims):
    """jax.jit of the shard_map of the per-device program, taking every padded input.

    The jit names every input's and output's sharding: XLA drops the sharding of a
    parameter the program does not read (a program that constant-folds, or a zero-size
    input), and would then refuse the sharded argument at the call.

    Zero-size arrays hold no data; XLA fails to lower one that enters a manual computation
    and returns a zero-size output unsplit whatever its sharding. So they never cross the
    shard_map boundary and travel replicated: a zero-size input is made inside as an empty
    local array, a zero-size output outside as an empty global one (``jax.jit`` accepts and
    returns them, so must we)::

        f(x f32[0,4] over P("x", None), w f32[8,4])  ->  shard_map(program(empty, w_local))
    """
    g = plan.graph
    in_specs, out_specs = plan.in_specs, plan.out_specs
    run = _staged_call(plan.program)
    live_in = [i for i, v in enumerate(g.inputs) if v.size]
    live_out = [j for j, v in enumerate(g.outputs) if v.size]
    empty_in = {i: jax.ShapeDtypeStruct(plan.local_shape(v.shape, d), v.dtype)
                for i, (v, d) in enumerate(zip(g.inputs, in_dims)) if not v.size}

    def local(*xs):
        it = iter(xs)
        full = [jnp.zeros(empty_in[i].shape, empty_in[i].dtype) if i in empty_in else next(it)
                for i in range(len(g.inputs))]
        outs = run(*full)
        return tuple(outs[j] for j in live_out)

    smap = jax.shard_map(local, mesh=plan.jax_mesh, in_specs=tuple(in_specs[i] for i in live_in),
                         out_specs=tuple(out_specs[j] for j in live_out), check_vma=False)

    def program_fn(*xs):
        got = iter(smap(*[xs[i] for i in live_in]) if live_out else ())
        return tuple(next(got) if v.size else jnp.zeros(v.shape, v.dtype) for v in g.outputs)

    jit_kw = {} if plan.out_jax_shardings is None else {
        "out_shardings": plan.out_jax_shardings,  # and in_shardings, so that donated inputs can alias outputs
        "in_shardings": tuple(NamedSharding(plan.jax_mesh, s) for s in in_specs)}
    return jax.jit(program_fn, donate_argnums=plan.donate_argnums, **jit_kw)


def _staged_call(program):
    """The planned per-device program as a function that stages it as ONE jit eqn (inline=False:
    XLA inlines the call when it compiles), not re-traced op by op as ``jaxpr_as_fun`` would:
    for 96 transformer blocks that re-trace was ~10% of planning. The eqn's parameters are
    copied from a trivial jit traced in the same context (its mesh), so no internal default
    is spelled out here."""
    n_in, n_out = len(program.in_avals), len(program.out_avals)
    if n_in == 0:
        return jaxpr_as_fun(program)

    def run(*xs):
        tmpl = jax.make_jaxpr(jax.jit(lambda a: a))(xs[0]).eqns[0].params
        in_sh, in_lay = tmpl["in_shardings"][0], tmpl["in_layouts"][0]
        params = dict(tmpl, jaxpr=program, in_shardings=(in_sh,) * n_in, out_shardings=(in_sh,) * n_out,
                      in_layouts=(in_lay,) * n_in, out_layouts=(in_lay,) * n_out, donated_invars=(False,) * n_in,
                      name="spmd_program", keep_unused=True, inline=False)
        return jit_p.bind(*xs, **params)

    return run
