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
import os
import re
import traceback
from typing import Iterator

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as JP

from .annotate import OPEN, annotate_p
from .manual import mesh_mismatch
from ..core.errors import ShardingError, SpecError
from ..core.mesh import Mesh

ORIGIN = "jax.lax.with_sharding_constraint"


@contextlib.contextmanager
def tracing_mesh(mesh: Mesh | None) -> Iterator[None]:
    """JAX's abstract mesh while gspmd_py traces: ``mesh`` with its axis types, unless the caller set
    one (``jax.set_mesh``): then that one, whose constraints are read over ``mesh`` at plan time
    (and refused when its axes differ)."""
    if mesh is None or not jax.sharding.get_abstract_mesh().empty:
        yield
        return
    # Explicit axes stay Explicit: the function is traced as jax.jit traces it over such a mesh
    types = tuple(AxisType.Explicit if t == "explicit" else AxisType.Auto for t in mesh.axis_types)
    if mesh.is_abstract:
        am = jax.sharding.AbstractMesh(mesh.shape, mesh.axis_names, axis_types=types)
    else:  # with its devices' kind, as a jax.shard_map's concrete mesh of that shape has (frontend/manual.py)
        am = jax.sharding.Mesh(mesh.jax_devices().reshape(mesh.shape), mesh.axis_names, axis_types=types).abstract_mesh
    with jax.sharding.use_abstract_mesh(am):
        yield


CONSTRAINTS = ("sharding_constraint", "reshard")
ORIGINS = {"sharding_constraint": ORIGIN, "reshard": "jax.sharding.reshard", "device_put": "jax.device_put"}


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


_JAX_SAYS = (  # JAX's own checks of a bare PartitionSpec, while the user's function is traced
    (re.compile(r"Resource axis: (\S+) of (P\([^)]*\)) is not found in mesh: (\(.*?\))"),
     lambda m, mesh: f"spec {m[2]} names mesh axis {m[1]!r}, which the gp.spmd mesh {mesh} does not have "
                     f"(its axes: {m[3]})"),
    (re.compile(r"spec=(P\([^)]*\))\) is only valid for values of rank at least (\d+), but was applied to a "
                r"value of rank (\d+)"),
     lambda m, mesh: f"spec {m[1]} has {m[2]} entries for a tensor of rank {m[3]}"),
    (re.compile(r"Length of sharding\.spec \((\d+)\) must be equal to aval's ndim \((\d+)\)\. Got sharding\.spec "
                r"(P\([^)]*\))"),  # jax >= 0.12's words for the same
     lambda m, mesh: f"spec {m[3]} has {m[1]} entries for a tensor of rank {m[2]}"),
    (re.compile(r"PartitionSpec passed to reshard cannot contain axis names that are of type Auto.*?Got "
                r"PartitionSpec: (P\([^)]*\)) with axis name"),
     lambda m, mesh: f"a bare PartitionSpec {m[1]} needs mesh axes of type Explicit (jax.set_mesh of a mesh "
                     f"made with axis_types=Explicit); under gp.spmd's own mesh {mesh} use "
                     f"jax.lax.with_sharding_constraint or gp.annotate"),
    (re.compile(r"but (P\([^)]*\)) has duplicate entries for `(\S+)`"),
     lambda m, mesh: f"spec {m[1]} uses mesh axis {m[2]!r} on two dims; an axis may shard one dim only"),
)


@contextlib.contextmanager
def constraint_errors(mesh: Mesh) -> Iterator[None]:
    """While the user's function is traced: JAX's own errors for a bare PartitionSpec in
    with_sharding_constraint / reshard (an unknown axis, more entries than the rank, ...) become
    SpecErrors naming the constraint, the problem and the user's source line; JAX's refusal of a
    ``jax.shard_map(..., mesh=jax_mesh)`` whose mesh is not gp.spmd's becomes a ShardingError
    naming the region's line and the axis that differs (frontend/manual.py)."""
    try:
        yield
    except Exception as e:  # (JAX's DuplicateSpecError is no ValueError)
        if isinstance(e, ShardingError):
            raise
        text = str(e)
        region = mesh_mismatch(text, mesh, _user_frame(e))
        if region:
            raise ShardingError(region) from e
        for pattern, say in _JAX_SAYS:
            m = pattern.search(text)
            if m is not None:
                raise SpecError(f"{_origin_of(text, e)} at {_user_frame(e)}: {say(m, mesh)}") from e
        raise


def _origin_of(text: str, e: BaseException) -> str:
    frame = _user_frame(e, line=True)
    if "reshard" in text or "reshard(" in frame:
        return "jax.sharding.reshard"
    if "with_sharding_constraint" in text or "with_sharding_constraint" in frame:
        return ORIGIN
    return f"a sharding constraint ({ORIGIN} or jax.sharding.reshard)"


def _user_frame(e: BaseException, line: bool = False) -> str:
    """The innermost frame of ``e``'s traceback outside JAX, gspmd_py and the standard library,
    as ``file:line (function)``, or its source text (``line``)."""
    skip = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (jax, contextlib))
    skip += (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + "gspmd_py" + os.sep,)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not os.path.abspath(f.filename).startswith(skip)]
    if not frames:
        return "" if line else "an unknown line"
    f = frames[-1]
    return (f.line or "") if line else f"{f.filename}:{f.lineno} ({f.name})"


def put_layout(dst) -> NamedSharding | None:
    """What a ``device_put`` inside the function asks of one operand's layout: its
    NamedSharding (of a ``jax.sharding.NamedSharding`` or a ``Format`` holding one), read as
    a layout annotation like ``with_sharding_constraint`` (over the gp.spmd mesh; a mesh with
    other axes is refused as a constraint's is); None for an identity.

    A device_put to no destination (``jax.scipy.sparse.linalg.cg``'s copies), to a device,
    a single-device sharding or a memory space is an identity: the SPMD program places every
    value itself. Memory kinds (``memory_kind="pinned_host"``, ``jax.memory.Space.Host``) inside
    the program are not honoured: there the values stay in device memory (one program's values
    cannot move between memories inside the ``shard_map`` body it runs as), so results are the
    same and only the memory an offload of intermediates would save is not saved. An output whose
    traced type lives in host memory (``f32<host>[8]``) is returned there, as jax.jit returns it
    (``Plan.out_memory_kinds``, compiler.plan_jaxpr).
    """
    sharding = getattr(dst, "sharding", None) if not isinstance(dst, NamedSharding) else dst
    return sharding if isinstance(sharding, NamedSharding) else None


def as_annotation(op) -> None:
    """Turn an IR op made from a ``sharding_constraint`` (or ``reshard``) eqn, or from one
    operand of a ``device_put`` (param ``sharding``: its ``put_layout``), into a
    ``gspmd_annotate`` op, in place.

    ``reshard`` is what ``jax.sharding.reshard`` and JAX's own indexing code emit under a mesh
    context: over Explicit axes it asks for its layout (an annotation, None dims replicated),
    over Auto axes it asks for nothing (its None dims are left open).
    """
    p = op.params
    reshard = op.prim == "reshard"
    sharding, rank = p.get("dst_sharding" if reshard else "sharding"), op.outputs[0].rank
    origin = ORIGINS.get(op.prim, ORIGIN)
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
