"""JAX's own sharding constraints read as gspmd_py annotations.

``jax.lax.with_sharding_constraint`` (primitive ``sharding_constraint``) inside a function
under ``gp.spmd`` is an annotation with gp.annotate's priority: trace.py turns its eqn into
a ``gspmd_annotate`` op whose params keep the spec entries and the jax mesh they name; at
plan time ``specs.annotation_dims`` reads them over the function's mesh (same axis names and
sizes, device order honoured or refused, see ``sharding.named_spec``). Flax's
``nn.with_logical_constraint`` lowers to it, so logical-axis rules work::

    with nn.logical_axis_rules([("batch", "x"), ("mlp", "y")]):
        plan = gp.spmd(apply, mesh).plan(params, x)    # constraints become annotations

While it traces, ``gp.spmd`` makes the function's mesh JAX's abstract mesh (Auto axes) unless
the caller set one, so a bare ``PartitionSpec`` in with_sharding_constraint,
and Flax's logical constraints, refer to it without ``jax.set_mesh``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as JP

from .annotate import OPEN, annotate_p
from .errors import SpecError
from .mesh import Mesh

ORIGIN = "jax.lax.with_sharding_constraint"


@contextlib.contextmanager
def tracing_mesh(mesh: Mesh | None) -> Iterator[None]:
    """JAX's abstract mesh while gspmd_py traces: ``mesh`` with Auto axes, unless the caller set
    one (``jax.set_mesh``): then that one, whose constraints are read over ``mesh`` at plan time
    (and refused when its axes differ)."""
    if mesh is None or not jax.sharding.get_abstract_mesh().empty:
        yield
        return
    am = jax.sharding.AbstractMesh(mesh.shape, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.shape))
    with jax.sharding.use_abstract_mesh(am):
        yield


CONSTRAINTS = ("sharding_constraint", "reshard")


@contextlib.contextmanager
def outside_user_mesh() -> Iterator[None]:
    """No ``jax.set_mesh`` mesh while the SPMD program is built: its shard_map runs over
    gspmd_py's own (fine) mesh, which a caller's mesh context must not contradict."""
    if jax.sharding.get_abstract_mesh().empty:
        yield
        return
    try:
        ctx = jax.set_mesh(None)
    except ValueError:  # under a jax transformation: leave the context as it is
        yield
        return
    try:
        yield
    finally:
        ctx.__exit__(None, None, None)


def as_annotation(op) -> None:
    """Turn an IR op made from a ``sharding_constraint`` (or ``reshard``) eqn into a
    ``gspmd_annotate`` op, in place.

    ``reshard`` is what ``jax.sharding.reshard`` and JAX's own indexing code emit under a mesh
    context: over Explicit axes it asks for its layout (an annotation, None dims replicated),
    over Auto axes it asks for nothing (its None dims are left open).
    """
    p = op.params
    reshard = op.prim == "reshard"
    sharding, rank = p.get("dst_sharding" if reshard else "sharding"), op.outputs[0].rank
    origin = "jax.sharding.reshard" if reshard else ORIGIN
    where = f"{origin} at {op.source or 'op %d' % op.id} on {op.outputs[0].type_str}"
    if not isinstance(sharding, NamedSharding):
        raise SpecError(f"{where}: a {type(sharding).__name__}; gspmd_py reads a NamedSharding or a "
                        f"PartitionSpec (under jax.set_mesh)")
    entries = list(sharding.spec) + [None] * (rank - len(sharding.spec))
    if len(entries) > rank:
        raise SpecError(f"{where}: spec {sharding.spec} has {len(sharding.spec)} entries for a tensor of rank {rank}")
    for d in p.get("unconstrained_dims") or ():
        entries[d] = OPEN
    entries = [OPEN if e is JP.UNCONSTRAINED else e for e in entries]
    if reshard and all(t == AxisType.Auto for t in sharding.mesh.axis_types):
        entries = [OPEN if e is None else e for e in entries]
    op.prim, op.primitive = "gspmd_annotate", annotate_p
    unspecified = all(e == OPEN for e in entries)
    op.params = {"spec": tuple(entries), "priority": 0, "unspecified": unspecified, "jax_mesh": sharding.mesh,
                 "origin": origin}
