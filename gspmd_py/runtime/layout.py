"""Program-boundary layouts over the USER's mesh.

A plan that splits a mesh axis into sub-axes runs on a finer JAX mesh (``y`` of size 4
as ``y_0``, ``y_1``). Arrays it returns should still be NamedShardings over the user's
mesh, so the next ``jax.jit`` over that mesh takes them as they are. The two meshes
hold the same devices in the same order, so a sharding whose sub-axes merge back into
whole user axes (major first) is the same layout under the user's names: no data moves.

    >>> fine dims (("y_0", "y_1"), ("x",))   ->  P("y", "x") over Mesh(x=2, y=4)
    >>> fine dims (("y_1",), ())              ->  not expressible: dim 0 uses y:(2)2, part of y

A layout that cannot be said over the user's mesh is returned over the execution mesh
by a direct call (``boundary_sharding``; the report says why). A staged call (under a
JAX transformation) cannot do that: JAX converts the layouts of arrays leaving a jit to
its input mesh and refuses ones it cannot express, so there such outputs are resharded
to the nearest user-mesh layout (``staged_sharding``: the partial sub-axes dropped).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Optional, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from ..core.mesh import Mesh
from ..core.fine_mesh import FineMesh


@contextlib.contextmanager
def own_mesh() -> Iterator[None]:
    """No JAX mesh context while gspmd_py builds or stages its program (a shard_map over its own
    execution mesh): not the user's ``jax.set_mesh``, not the abstract mesh an enclosing gp.spmd
    traces under (constraints.tracing_mesh). Works inside a trace, unlike ``jax.set_mesh``."""
    if jax.sharding.get_abstract_mesh().empty:
        yield
        return
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        yield


@functools.lru_cache(maxsize=64)
def user_jax_mesh(mesh: Mesh) -> jax.sharding.Mesh:
    """The jax Mesh with the user's axis names, shape and axis types (same devices as the plan's mesh)."""
    types = tuple(jax.sharding.AxisType.Explicit if t == "explicit" else jax.sharding.AxisType.Auto
                  for t in mesh.axis_types)
    return jax.sharding.Mesh(mesh.jax_devices(), mesh.axis_names, axis_types=types)


def user_spec(fine: FineMesh, fdims: Sequence[Sequence[str]]) -> tuple[Optional[JP], str]:
    """``fdims`` (fine axis names per dim) as a PartitionSpec over the user's mesh, or why not."""
    entries = []
    for d, names in enumerate(fdims):
        if not names:
            entries.append(None)
            continue
        refs = fine.coarse(names)
        part = [str(r) for r in refs if not r.whole]
        if part:
            return None, f"dim {d} is sharded over {', '.join(part)}, part of a mesh axis"
        entries.append(refs[0].name if len(refs) == 1 else tuple(r.name for r in refs))
    return JP(*entries), ""


def nearest_user_spec(fine: FineMesh, fdims: Sequence[Sequence[str]]) -> JP:
    """The layout over the user's mesh nearest to ``fdims``: per dim, its whole user axes only."""
    entries = []
    for names in fdims:
        whole = [r.name for r in (fine.coarse(names) if names else ()) if r.whole]
        entries.append(None if not whole else whole[0] if len(whole) == 1 else tuple(whole))
    return JP(*entries)


def fine_spec(fdims: Sequence[Sequence[str]]) -> JP:
    return JP(*[tuple(d) if len(d) > 1 else (d[0] if d else None) for d in fdims])


def boundary_sharding(plan, fdims) -> NamedSharding:
    """The NamedSharding of a boundary array laid out as ``fdims``: over the user's mesh when the
    layout can be said there, else over the plan's fine mesh (``boundary_note`` says why)."""
    if plan.fine.names == plan.mesh.axis_names:
        return NamedSharding(user_jax_mesh(plan.mesh), fine_spec(fdims))
    spec, _ = user_spec(plan.fine, fdims)
    if spec is not None:
        return NamedSharding(user_jax_mesh(plan.mesh), spec)
    return NamedSharding(plan.jax_mesh, fine_spec(fdims))


def input_sharding(plan, i: int) -> NamedSharding:
    """The sharding the program takes input ``i`` in: its layout over the plan's mesh, in the memory
    kind its in_sharding asked for (plan.in_memory_kinds; device memory by default)."""
    sharding, kinds = NamedSharding(plan.jax_mesh, plan.in_specs[i]), plan.in_memory_kinds
    return sharding.with_memory_kind(kinds[i]) if i < len(kinds) and kinds[i] else sharding


def boundary_note(fine: FineMesh, mesh: Mesh, fdims, what: str) -> Optional[str]:
    """Why ``boundary_sharding`` returns ``what`` over the execution mesh (None: it does not)."""
    if fine.names == mesh.axis_names:
        return None
    spec, why = user_spec(fine, fdims)
    if spec is not None:
        return None
    return f"{what} is returned over the execution mesh {dict(zip(fine.names, fine.sizes))}, not over {mesh}: {why}"


def staged_sharding(plan, fdims) -> tuple[NamedSharding, bool]:
    """The user-mesh NamedSharding of a boundary array of a staged call, and whether the layout
    differs from ``fdims`` (then the program's value is resharded to it; ``staged_note`` says so)."""
    spec, _ = user_spec(plan.fine, fdims)
    if spec is not None:
        return NamedSharding(user_jax_mesh(plan.mesh), spec), False
    return NamedSharding(user_jax_mesh(plan.mesh), nearest_user_spec(plan.fine, fdims)), True


def staged_note(fine: FineMesh, mesh: Mesh, fdims, what: str) -> Optional[str]:
    """Why a staged call reshards ``what`` at the program boundary (None: it does not)."""
    spec, why = user_spec(fine, fdims)
    if spec is not None:
        return None
    return (f"under a JAX transformation, {what} is resharded to {nearest_user_spec(fine, fdims)} over {mesh} at "
            f"the program boundary: {why}")


def layout_notes(plan) -> tuple[str, ...]:
    """What the boundary does to a plan's layouts that the user's mesh cannot say: per output
    returned over the execution mesh by a direct call, then per argument and output resharded
    by a staged call (under a JAX transformation). None for an abstract mesh (it runs nothing)."""
    if plan.mesh.is_abstract:
        return ()
    g, fine, mesh = plan.graph, plan.fine, plan.mesh
    outs = [(f"output {i} {v.type_str}", d) for i, (v, d) in enumerate(zip(g.outputs, plan.out_fine_dims))]
    notes = [boundary_note(fine, mesh, d, what) for what, d in outs]
    notes += [staged_note(fine, mesh, even_dims(plan, v.shape, plan.fine_dims(v)), f"argument {n}")
              for v, n in zip(g.inputs, plan.in_names)]
    notes += [staged_note(fine, mesh, d, what) for what, d in outs]
    return tuple(n for n in notes if n is not None)


def even_dims(plan, shape, fdims):
    """``fdims`` with the axes of dims they do not divide dropped (a jax.Array's sharding)."""
    k = lambda axes: int(np.prod([plan.fine.size_of[a] for a in axes], dtype=np.int64))
    return tuple(tuple(a) if a and n % k(a) == 0 else () for n, a in zip(shape, fdims))
