"""User annotations as JAX primitives: ``annotate``, ``mesh_split``, ``tag``.

Each is the identity on its operand. Outside ``gp.spmd`` it lowers to nothing, so the
same function runs unpartitioned; under ``gp.spmd`` the tracer sees the primitive and
records the constraint. They compose with ``jax.grad`` (the tangent and the cotangent
carry the same constraint, as XLA's sharding constraints do), ``jax.vmap`` (the new
batch dim is left open) and ``lax.scan``.

    >>> y = gp.annotate(y, gp.P("x", None))         # dim 0 over mesh axis x, dim 1 replicated
    >>> y = gp.annotate(y, gp.P("x", None), priority=1)
    >>> y = gp.mesh_split(y, mesh, [0, -1])          # GSPMD paper API: same as P("x", None)
    >>> y = gp.tag(y, "hidden")                      # names the value for plan.sharding_of
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..core import jax_compat as compat
from ..core.errors import AnnotationError, SpecError
from ..core.mesh import Mesh
from ..core.sharding import Sharding, entry_axes, spec_of

# source locations in messages should point at the user's code, not at gspmd_py's
compat.exclude_from_tracebacks(os.path.dirname(os.path.abspath(__file__)) + os.sep)

OPEN = "?"  # spec entry for a dim propagation may choose (Shardy's open dim); used by vmap


def _norm_spec(spec) -> tuple:
    try:
        entries = spec_of(spec)
    except SpecError as e:
        raise AnnotationError(str(e)) from None
    out = []
    for e in entries:
        if e == OPEN:
            out.append(OPEN)
            continue
        names = tuple(str(a) for a in entry_axes(e))
        out.append(names)
    return tuple(out)


def _check_array(x, what: str):
    if isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex, bool)) or hasattr(x, "aval"):
        return
    raise AnnotationError(f"{what} expects a JAX array, got {type(x).__name__}: {x!r:.80}")


# -- annotate -----------------------------------------------------------------------
annotate_p = Primitive("gspmd_annotate")
annotate_p.def_impl(lambda x, **_: x)
annotate_p.def_abstract_eval(lambda x, **_: x)
mlir.register_lowering(annotate_p, lambda ctx, x, **_: [x])


def spec_entries(dims) -> tuple:
    """annotate's ``spec`` parameter for canonical dims (per dim a tuple of AxisRefs, None: open):
    per dim the axis names ("y:(2)2" for a sub-axis), or OPEN."""
    return tuple(OPEN if axes is None else tuple(str(r) for r in axes) for axes in dims)


def _annotate_batch(axis_data, args, dims, *, spec, priority, unspecified, **kw):
    """The batch dim is open, or sharded over ``jax.vmap(..., spmd_axis_name=...)``'s axes (as
    jax.lax.with_sharding_constraint under such a vmap)."""
    (x,), (d,) = args, dims
    if d is None:
        return annotate_p.bind(x, spec=spec, priority=priority, unspecified=unspecified, **kw), d
    spec = list(spec) + [()] * (x.ndim - 1 - len(spec))
    name = axis_data.spmd_name
    spec.insert(d, OPEN if name is None else tuple(name) if isinstance(name, (tuple, list)) else (name,))
    return annotate_p.bind(x, spec=tuple(spec), priority=priority, unspecified=unspecified and name is None, **kw), d


batching.fancy_primitive_batchers[annotate_p] = _annotate_batch
ad.deflinear2(annotate_p, lambda ct, x, **kw: [annotate_p.bind(ad.instantiate_zeros(ct), **kw)])


def annotate(x, spec, *, priority: int = 0, unspecified: bool = False):
    """Constrain ``x`` to the sharding ``spec`` (GSPMD's sharding constraint / mesh_split).

    ``priority``: lower propagates first (0 is the default and the strongest).
    """
    _check_array(x, "gp.annotate")
    if not isinstance(priority, (int, np.integer)) or isinstance(priority, bool) or priority < 0:
        raise AnnotationError(f"gp.annotate: priority must be a non-negative int, got {priority!r}")
    # a NamedSharding's names refer to its own mesh (order checked against the function's at plan time)
    extra = {"jax_mesh": spec.mesh} if isinstance(spec, jax.sharding.NamedSharding) else {}
    if isinstance(spec, Sharding):  # as in_shardings takes it: its mesh must be the function's (plan time)
        extra, spec = {"gp_mesh": spec.mesh}, spec.spec
    return _bind(x, spec, priority, unspecified, extra)


def _bind(x, spec, priority: int, unspecified: bool, extra: dict):
    spec = _norm_spec(spec)
    x = jax.numpy.asarray(x)
    if len(spec) > x.ndim:
        raise SpecError(f"gp.annotate: spec with {len(spec)} entries for an array of rank {x.ndim} (shape {x.shape})")
    return annotate_p.bind(x, spec=spec, priority=int(priority), unspecified=unspecified, **extra)


def mesh_split(x, mesh, dims_mapping: Sequence[int], *, priority: int = 0):
    """The GSPMD paper's API: ``dims_mapping[i]`` is the mesh axis index of tensor dim i, -1 for none.

    ``mesh`` must be the gp.spmd function's mesh (same axis sizes and device order; checked when
    the function is planned): the indices mean its axes."""
    _check_array(x, "gp.mesh_split")
    if not isinstance(mesh, Mesh):
        raise SpecError(f"gp.mesh_split: mesh must be a gp.Mesh (the gp.spmd function's), got {type(mesh).__name__}")
    dims_mapping = list(dims_mapping)
    rank = np.ndim(x)
    if len(dims_mapping) < rank:  # the paper's API maps every dim (P allows a prefix; this does not)
        raise SpecError(f"gp.mesh_split: dims_mapping {dims_mapping} has {len(dims_mapping)} entries but the tensor "
                        f"{jax.numpy.result_type(x)}{list(np.shape(x))} has rank {rank}: give every dim a mesh axis "
                        f"index or -1")
    entries: list[Any] = []
    for i, m in enumerate(dims_mapping):
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
            raise SpecError(f"gp.mesh_split: dims_mapping[{i}] = {m!r} must be an int (mesh axis index or -1)")
        if m < -1 or m >= len(mesh.shape):
            raise SpecError(
                f"gp.mesh_split: dims_mapping[{i}] = {m} is not a mesh axis index of {mesh} (0..{len(mesh.shape) - 1} or -1)"
            )
        entries.append(None if m == -1 else mesh.axis_names[m])
    used = [e for e in entries if e is not None]
    if len(used) != len(set(used)):
        raise SpecError(f"gp.mesh_split: dims_mapping {dims_mapping} maps two tensor dims to one mesh axis")
    if not isinstance(priority, (int, np.integer)) or isinstance(priority, bool) or priority < 0:
        raise AnnotationError(f"gp.mesh_split: priority must be a non-negative int, got {priority!r}")
    return _bind(x, tuple(entries), priority, False, {"gp_mesh": mesh, "origin": "gp.mesh_split"})


# -- tag ------------------------------------------------------------------------------
tag_p = Primitive("gspmd_tag")
tag_p.def_impl(lambda x, **_: x)
tag_p.def_abstract_eval(lambda x, **_: x)
mlir.register_lowering(tag_p, lambda ctx, x, **_: [x])
batching.primitive_batchers[tag_p] = lambda args, dims, *, name: (tag_p.bind(args[0], name=name), dims[0])
ad.deflinear2(tag_p, lambda ct, x, *, name: [tag_p.bind(ad.instantiate_zeros(ct), name=name + "/grad")])


def tag(x, name: str):
    """Name ``x`` so that ``plan.sharding_of(name)`` and ``plan.explain(name)`` find it. No constraint."""
    _check_array(x, "gp.tag")
    if not isinstance(name, str) or not name:
        raise AnnotationError(f"gp.tag: name must be a non-empty string, got {name!r}")
    return tag_p.bind(jax.numpy.asarray(x), name=name)
