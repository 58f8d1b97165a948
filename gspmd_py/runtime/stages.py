"""The stages of a plan, as values (JAX's Traced / Lowered / Compiled, ``jax/_src/stages.py``),
the one run-time object of gspmd_py:

    plan = f.plan(x, w)              # Plan: what gspmd_py decided (plan.py); runs nothing
    lowered = plan.lower()           # Lowered: the jit of the program, traced and lowered on first use
    lowered.as_text()                # its StableHLO
    compiled = lowered.compile()     # Compiled: XLA's executable (a concrete mesh only)
    compiled.as_text()               # the optimised HLO
    out = compiled(x, w)             # the call, arguments as f takes them (no static ones)

Each stage is built from the one before, frozen in its fields, and built once: the plan
holds its Lowered (``plan.lower()``; other ``platforms``: a new one), a Lowered its trace,
its lowering and its Compiled (``compile()`` compiles on its first call only), a Compiled
its boundary. gp.spmd's call runs ``plan.lower().compile()``, so a plan compiles once
however it is run (``f(...)``, ``plan.run(...)``, ``compiled(...)``). A staged call (a
gp.spmd function under a caller's jax.jit) uses the Lowered's jit and its staged layouts
(``staged_in_shardings``, ``staged_out_shardings``) and compiles nothing here.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
from jax.extend.core import jaxpr_as_fun
from jax.extend.core.primitives import jit_p
from jax.sharding import NamedSharding

from ..core import jax_compat as compat
from ..core.errors import ArgumentError, ShardingError
from ..frontend.constraints import outside_user_mesh
from ..partitioner.host_calls import raise_failures
from .boundary import Boundary
from .layout import boundary_sharding, even_dims, input_sharding, own_mesh, staged_sharding
from .plancheck import check_same_program


def out_shardings(plan) -> Optional[tuple]:
    """The outputs' NamedShardings over the user's mesh where the layout can be said there
    (layout.py; same devices, no copy), in their memory kinds; None on an abstract mesh."""
    if plan.mesh.is_abstract:
        return None
    return tuple(in_memory(boundary_sharding(plan, d), plan, i) for i, d in enumerate(plan.out_fine_dims))


def in_memory(sharding: NamedSharding, plan, i: int) -> NamedSharding:
    """``sharding`` of output ``i`` in the memory kind the plan returns it in (plan.out_memory_kinds)."""
    kinds = plan.out_memory_kinds
    return sharding.with_memory_kind(kinds[i]) if i < len(kinds) and kinds[i] else sharding


def trace_program(plan, jitted):
    """``jitted`` (``jit_program(plan, ...)``) traced at the padded input shapes."""
    avals = [jax.ShapeDtypeStruct(s, v.dtype) for s, v in zip(plan.padded_in_shapes, plan.graph.inputs)]
    with outside_user_mesh(), own_mesh():
        return jitted.trace(*avals)


@attrs.frozen(eq=False, repr=False, slots=False)
class Lowered:
    """A plan's program to lower: ``jitted`` (the jit of the shard_map of the per-device
    program) for ``platforms`` (None: the backend's); built on first use, once: ``traced``
    (``jax.stages.Traced`` at the padded input shapes), ``lowered`` (``jax.stages.Lowered``;
    for CPU on an abstract mesh, which can be lowered, not compiled) and its Compiled."""

    plan: Any
    jitted: Any
    platforms: Optional[tuple[str, ...]] = None

    @classmethod
    def of(cls, plan, platforms: Optional[Sequence[str]] = None) -> "Lowered":
        """The Lowered stage of ``plan`` (``platforms``: lower for these, default the backend's,
        CPU on an abstract mesh)."""
        if platforms is None and plan.mesh.is_abstract:
            platforms = ("cpu",)
        return cls(plan, jit_program(plan, out_shardings(plan)), None if platforms is None else tuple(platforms))

    def __repr__(self) -> str:
        return f"<Lowered {self.plan.fn_name} on {self.plan.mesh}>"

    @functools.cached_property
    def traced(self):
        """``self.jitted`` traced at the padded input shapes, once."""
        return trace_program(self.plan, self.jitted)

    @functools.cached_property
    def lowered(self):
        """``self.traced`` lowered, once."""
        return self.traced.lower(lowering_platforms=self.platforms) if self.platforms else self.traced.lower()

    def as_text(self) -> str:
        """StableHLO of the SPMD program."""
        return self.lowered.as_text()

    def compile(self) -> "Compiled":
        """The Compiled stage: XLA compiles on the first call, later calls return it."""
        return self._compiled

    @functools.cached_property
    def _compiled(self) -> "Compiled":
        if self.plan.mesh.is_abstract:
            raise ShardingError(f"{self.plan.mesh} is abstract: it can be planned and lowered, not run")
        return Compiled(self.plan, self, self.lowered.compile(), Boundary.of(self.plan, self.traced.jaxpr))

    def check_same_program(self) -> None:
        """Multi-process runs: raise unless every process planned this program (plancheck.py),
        once per stage (the first call of each process, at the same point: it is a collective)."""
        return self._same_program

    @functools.cached_property
    def _same_program(self) -> None:
        check_same_program(self.plan)

    # -- staged into a caller's trace (api/primitive.py, api/api.py) ---------------------
    @functools.cached_property
    def _staged_out(self) -> tuple:
        staged = [staged_sharding(self.plan, d) for d in self.plan.out_fine_dims]
        return tuple((in_memory(s, self.plan, i), moved) for i, (s, moved) in enumerate(staged))

    def staged_out_shardings(self) -> tuple:
        """Per output: (NamedSharding over the user's mesh, whether it differs from the plan's
        layout): how an output leaves the program staged into a caller's trace."""
        return self._staged_out

    def staged_in_shardings(self) -> tuple[NamedSharding, ...]:
        """Per input: the NamedSharding over the user's mesh a staged call takes it in."""
        plan = self.plan
        return tuple(staged_sharding(plan, even_dims(plan, v.shape, plan.fine_dims(v)))[0] for v in plan.graph.inputs)


@attrs.frozen(eq=False, repr=False, slots=False)
class Compiled:
    """A plan's program compiled: ``compiled`` (``jax.stages.Compiled``), ``boundary`` (how
    arguments enter it: boundary.Boundary), ``lowered`` (the stage it came from)."""

    plan: Any
    lowered: Lowered
    compiled: Any
    boundary: Boundary

    def __repr__(self) -> str:
        return f"<Compiled {self.plan.fn_name} on {self.plan.mesh}>"

    def as_text(self) -> str:
        """The HLO XLA optimised (collectives as XLA runs them)."""
        return self.compiled.as_text()

    def place(self, leaves: Sequence[Any]) -> list:
        """Every flat input leaf as a global jax.Array in its input sharding (Boundary.place)."""
        return self.boundary.place(leaves)

    def run(self, leaves: Sequence[Any]):
        """The program on the flat input leaves; its outputs as the user's pytree. A host
        callback that failed is re-raised as itself (the call is waited for then)."""
        plan = self.plan
        calls = tuple(plan.diagnostics.host_calls)
        if calls:
            with raise_failures(calls, plan.fn_name):
                outs = jax.block_until_ready(self.boundary.call(self.compiled, leaves))
        else:
            outs = self.boundary.call(self.compiled, leaves)
        return jax.tree_util.tree_unflatten(plan.out_tree, outs)

    def __call__(self, *args, **kwargs):
        """The program on arguments as the gp.spmd function takes them (static ones left out)."""
        tree = self.plan.in_tree
        for given in ([(args, kwargs)] if kwargs else [args, (args, kwargs)]):
            leaves, got = jax.tree_util.tree_flatten(given)
            if got == tree:
                return self.run(leaves)
        raise ArgumentError(f"{self.plan.fn_name} was compiled for arguments of structure {tree}, got "
                            f"{jax.tree_util.tree_structure(args if not kwargs else (args, kwargs))}")


def jit_program(plan, out_shardings: Optional[Sequence[NamedSharding]]):
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
                for i, (v, d) in enumerate(zip(g.inputs, plan.in_dims)) if not v.size}

    def local(*xs):
        it = iter(xs)
        full = [jnp.zeros(empty_in[i].shape, empty_in[i].dtype) if i in empty_in else next(it)
                for i in range(len(g.inputs))]
        outs = run(*full)
        return tuple(outs[j] for j in live_out)

    smap = jax.shard_map(local, mesh=plan.jax_mesh, in_specs=tuple(in_specs[i] for i in live_in),
                         out_specs=tuple(out_specs[j] for j in live_out), check_vma=False)

    weak = plan.out_weak or (False,) * len(g.outputs)

    def program_fn(*xs):
        got = iter(smap(*[xs[i] for i in live_in]) if live_out else ())
        outs = [next(got) if v.size else jnp.zeros(v.shape, v.dtype) for v in g.outputs]
        return tuple(compat.weakly_typed(o) if w else o for o, w in zip(outs, weak))  # the traced types, as jax.jit

    jit_kw = {} if out_shardings is None else {
        "out_shardings": tuple(out_shardings),  # and in_shardings, so that donated inputs can alias outputs
        "in_shardings": tuple(input_sharding(plan, i) for i in range(len(in_specs)))}
    return jax.jit(program_fn, donate_argnums=plan.donate_argnums, **jit_kw)


def _staged_call(program):
    """The planned per-device program as a function that stages it as ONE jit eqn (jax.jit's default
    inlining: XLA inlines the call when it compiles), not re-traced op by op as ``jaxpr_as_fun`` would:
    for 96 transformer blocks that re-trace was ~10% of planning. The eqn's parameters are
    copied from a trivial jit traced in the same context (its mesh), so no internal default
    is spelled out here."""
    n_in, n_out = len(program.in_avals), len(program.out_avals)
    if n_in == 0:
        return jaxpr_as_fun(program)

    def run(*xs):
        tmpl = jax.make_jaxpr(jax.jit(lambda a: a))(xs[0]).eqns[0].params
        # inline: the template's (jax.jit's default: staged as a call that XLA inlines)
        params = dict(tmpl, jaxpr=program, name="spmd_program", keep_unused=True)
        for key, val in tmpl.items():  # per-input / per-output entries: the template's one, repeated
            if isinstance(val, tuple) and len(val) == 1:  # (its element's type is this JAX's own)
                if key.startswith("in_") or key == "donated_invars":
                    params[key] = val * n_in
                elif key.startswith("out_"):
                    params[key] = val * n_out
        return jit_p.bind(*xs, **params)

    return run
