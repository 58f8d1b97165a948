"""Running a Plan from gp.spmd's call: the executable, a handle held beside the plan (by gp.spmd's
plan cache entry, api/api.py), never inside it. It composes the stages (stages.py: Plan ->
Lowered -> Compiled) and keeps what the call path needs built once::

    exe = Executable(plan)         # cheap: the jit of the program, not traced yet
    exe.jitted                     # stages.jit_program: jax.jit of the shard_map of the per-device program (padded global inputs)
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

from jax.sharding import NamedSharding

from ..core.errors import ShardingError
from .boundary import Boundary
from .layout import even_dims, staged_sharding
from .plancheck import check_same_program
from .stages import Compiled, Lowered, in_memory, jit_program, out_shardings, trace_program


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
