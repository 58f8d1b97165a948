"""Running a Plan from gp.spmd's call: the executable, a handle held beside the plan (by gp.spmd's
plan cache entry, api/api.py), never inside it. It composes the stages (stages.py: Plan ->
Lowered -> Compiled) and keeps what the call path needs built once::

    exe = Executable(plan)         # cheap: the jit of the program, not traced yet
    exe.jitted                     # jax.jit of the shard_map of the per-device program (padded global inputs)
    exe.traced                     # exe.jitted traced at the padded input shapes (jax.stages.Traced)
    exe.lower_text()               # StableHLO of the program (works on an abstract mesh)
    exe.stage()                    # the Compiled stage (stages.py), built on first use, once per handle
    exe.compiled()                 # its jax.stages.Compiled
    exe.boundary                   # how arguments enter the program (boundary.Boundary)
    exe.check_same_program()       # multi-process runs: every process planned this program (plancheck.py)
    outs = exe.run(leaves)         # the call: the outputs as the user's pytree
    exe.staged_in_shardings(), exe.staged_out_shardings()   # a staged call's layouts over the user's mesh

The plan holds none of this state: ``plan.executable`` builds a new handle on each access, and
``plan.lower()``, ``plan.compiled()``, ``plan.run(...)`` build their stage on demand.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import jaxpr_as_fun
from jax.extend.core.primitives import jit_p
from jax.sharding import NamedSharding

from ..errors import ShardingError
from .boundary import Boundary
from .layout import even_dims, staged_sharding
from .plancheck import check_same_program
from .stages import Compiled, Lowered, out_shardings, trace_program


class Executable:
    """How one Plan runs from gp.spmd's call (see the module doc). Mutable only in what it builds
    on first use; a new one per plan cache entry."""

    def __init__(self, plan):
        self.plan = plan
        self.out_shardings: Optional[tuple[NamedSharding, ...]] = out_shardings(plan)
        self.jitted = jit_program(plan, self.out_shardings)
        self._stage: Optional[Compiled] = None
        self._same_program_checked = False

    def check_same_program(self) -> None:
        """Multi-process runs: raise unless every process planned this program (plancheck.py), once
        per handle (the first call of each process, at the same point: it is a collective)."""
        if not self._same_program_checked:
            check_same_program(self.plan)
            self._same_program_checked = True

    @functools.cached_property
    def traced(self):
        """``self.jitted`` traced once at the padded input shapes (``jax.stages.Traced``)."""
        return trace_program(self.plan, self.jitted)

    def lower_text(self) -> str:
        """StableHLO of the SPMD program (lowered for CPU: works on abstract meshes too)."""
        return self.traced.lower(lowering_platforms=("cpu",)).as_text()

    def stage(self) -> Compiled:
        """The Compiled stage of this handle's jit (a concrete mesh only), built once."""
        if self._stage is None:
            if self.plan.mesh.is_abstract:
                raise ShardingError(f"{self.plan.mesh} is abstract: it can be planned and lowered, not run")
            lowered = Lowered(self.plan, self.jitted, self.traced, self.traced.lower())
            self._stage = Compiled(self.plan, lowered, lowered.lowered.compile(), self.boundary)
        return self._stage

    def compiled(self):
        """The compiled program (``jax.stages.Compiled``); a concrete mesh only."""
        return self.stage().compiled

    @functools.cached_property
    def boundary(self) -> Boundary:
        """How arguments enter the program (boundary.Boundary), shared with the Compiled stage."""
        return Boundary.of(self.plan, self.traced.jaxpr)

    def place(self, leaves: Sequence[Any]) -> list:
        """Every leaf as a global jax.Array in its input sharding (boundary.Boundary.place)."""
        return self.boundary.place(leaves)

    def run(self, leaves: Sequence[Any]):
        """The program on the flat input leaves; its outputs as the user's pytree (Compiled.run)."""
        return (self._stage or self.stage()).run(leaves)

    # -- staged into a caller's trace (api/primitive.py, api/api.py) ---------------
    @functools.cached_property
    def _staged_out(self) -> tuple:
        return tuple(staged_sharding(self.plan, d) for d in self.plan.out_fine_dims)

    def staged_out_shardings(self) -> tuple:
        """Per output: (NamedSharding over the user's mesh, whether it differs from the plan's
        layout): how an output leaves the program staged into a caller's trace."""
        return self._staged_out

    def staged_in_shardings(self) -> tuple[NamedSharding, ...]:
        """Per input: the NamedSharding over the user's mesh a staged call takes it in."""
        plan = self.plan
        return tuple(staged_sharding(plan, even_dims(plan, v.shape, plan.fine_dims(v)))[0] for v in plan.graph.inputs)


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

    def program_fn(*xs):
        got = iter(smap(*[xs[i] for i in live_in]) if live_out else ())
        return tuple(next(got) if v.size else jnp.zeros(v.shape, v.dtype) for v in g.outputs)

    jit_kw = {} if out_shardings is None else {
        "out_shardings": tuple(out_shardings),  # and in_shardings, so that donated inputs can alias outputs
        "in_shardings": tuple(NamedSharding(plan.jax_mesh, s) for s in in_specs)}
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
