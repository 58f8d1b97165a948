"""Sharding in types for a gp.spmd program staged over a mesh with Explicit axes.

Under ``jax.set_mesh`` of a mesh with ``jax.sharding.AxisType.Explicit`` axes, JAX carries
the layout of every value in its type (``jax.typeof(y).sharding``). A gp.spmd program staged
into an enclosing trace (api/primitive.py's ``spmd_call``) gives its outputs the types of the
layouts its plan returns them in, over the explicit axes of the user's mesh (Auto axes are
not part of a type, and an axis that does not divide its dim is left out, as the staged
boundary leaves it out); the inputs' types are the layouts they arrive in, seeded as such
into the programs gspmd_py derives (jvp, transpose, vmap, partial evaluation), and a
cotangent or tangent is pinned to its primal's type, as JAX's AD checks.

    >>> gp.spmd(f, explicit_mesh, out_shardings=P("x", None)) inside jax.jit, under set_mesh:
    >>> jax.typeof(y).sharding.spec == P("x", None)
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from ..core.mesh import Mesh
from ..plan import Plan
from ..runtime.layout import staged_sharding, user_jax_mesh


def typed(mesh: Mesh) -> bool:
    """Whether values of a program over ``mesh`` carry their layouts in their types."""
    return bool(mesh.explicit_axes) and not mesh.is_abstract


def _entry_axes(entry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def type_spec(mesh: Mesh, spec: JP, shape: Sequence[int]) -> JP:
    """``spec`` (over the user's mesh) as a type: per dim its explicit axes, when they divide it."""
    explicit = set(mesh.explicit_axes)
    entries = []
    for d, n in enumerate(shape):
        axes = tuple(a for a in _entry_axes(spec[d] if d < len(spec) else None) if a in explicit)
        k = int(np.prod([mesh.axis_size(a) for a in axes], dtype=np.int64))
        entries.append(None if not axes or n % k else axes[0] if len(axes) == 1 else axes)
    return JP(*entries)


def out_avals(plan: Plan, avals: Sequence) -> list:
    """``avals`` (the outputs of ``plan``'s program) with the types of the layouts a staged call
    returns them in."""
    mesh = plan.mesh
    am = user_jax_mesh(mesh).abstract_mesh
    out = []
    for a, d in zip(avals, plan.out_fine_dims):
        s, _ = staged_sharding(plan, d)
        out.append(a.update(sharding=NamedSharding(am, type_spec(mesh, s.spec, a.shape))))
    return out


def type_dims(mesh: Mesh, aval) -> Optional[tuple]:
    """The canonical dims (per dim a tuple of AxisRefs) of ``aval``'s type over ``mesh``'s explicit
    axes, or None when it has none (no sharding in its type, or one over another mesh)."""
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    amesh = getattr(sharding, "mesh", None)
    if spec is None or amesh is None or getattr(amesh, "empty", True):
        return None
    if tuple(amesh.axis_names) != mesh.axis_names or tuple(amesh.axis_sizes) != mesh.shape:
        return None
    explicit = set(mesh.explicit_axes)
    entries = [_entry_axes(spec[d] if d < len(spec) else None) for d in range(len(aval.shape))]
    return tuple(tuple(mesh.ref(a) for a in axes if a in explicit) for axes in entries)


def cotangent_dims(mesh: Mesh, aval) -> Optional[tuple]:
    """The canonical dims a cotangent of a primal of type ``aval`` must be returned in: its
    type's; replicated for a primal with no sharding in its type (JAX types the cotangent as
    its primal); None (the user's in_sharding decides) for one typed over another mesh."""
    dims = type_dims(mesh, aval)
    if dims is not None:
        return dims
    amesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    return ((),) * len(aval.shape) if amesh is None or getattr(amesh, "empty", False) else None
