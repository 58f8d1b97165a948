"""A ``jax.shard_map`` inside a gp.spmd function: what the tracer reads of it.

The region (primitive ``shard_map``) stays one op (its rule: ops/manual.py; its local
computation: partitioner/manual_handler.py). Its boundary is fixed by its specs, which the
tracer turns into ``gp.annotate`` ops: one per operand (its ``in_specs`` entry) before the
region and one per result (its ``out_specs`` entry) after it. An axis a spec does not name
is replicated there (JAX's own meaning of a spec: with ``check_vma`` the region's results
are checked to be; without it, the user's promise, as JAX takes it).

The region's mesh must be the gp.spmd function's mesh (same axis names and sizes: an
abstract mesh or a ``jax.sharding.Mesh`` of that shape), and every one of its axes manual
(a partial-auto region, ``axis_names=`` a subset, is refused with the axes it leaves to
the compiler).

The equation's parameters are read through jax_compat (``shard_map_specs``,
``shard_map_manual``): ``in_specs`` / ``out_specs`` and ``newly_manual_axes`` (0.10 to 0.12),
or older releases' ``in_names`` / ``out_names`` and ``auto``. ``check_vma`` (``check_rep``)
is not read: an out_spec's replication is JAX's check or the user's promise either way.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from ..core import jax_compat as compat
from ..core.errors import AnnotationError, ShardingError, UnsupportedOpError

Dims = tuple[tuple[str, ...], ...]


def mesh_axes(mesh: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(axis names, sizes) of a gp.Mesh, a jax.sharding.Mesh or an AbstractMesh."""
    names = tuple(mesh.axis_names)
    sizes = getattr(mesh, "axis_sizes", None)
    if sizes is None:
        shape = mesh.shape
        sizes = tuple(shape[n] for n in names) if isinstance(shape, Mapping) else tuple(shape)
    return names, tuple(int(s) for s in sizes)


def manual_axes(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The region's manual axes, in mesh order."""
    return compat.shard_map_manual(dict(params), mesh_axes(params["mesh"])[0])


def label(where: str) -> str:
    return "jax.shard_map region" + (f" at {where}" if where else "")


def check(params: Mapping[str, Any], mesh: Optional[Any], where: str, annotated: Optional[str] = None) -> None:
    """A clear error unless the region's mesh is ``mesh`` (None: not known here) and all manual,
    and ``annotated`` is None (a gp.annotate inside the region, as trace.py found it: said so)."""
    names, sizes = mesh_axes(params["mesh"])
    if mesh is not None:
        want_names, want_sizes = mesh_axes(mesh)
        want = dict(zip(want_names, want_sizes))
        have = dict(zip(names, sizes))
        bad = next((n for n in names if n not in want), None) or next(
            (n for n in want_names if n not in have or have[n] != want[n]), None) or (
            None if names == want_names else names[0])
        if bad is not None:
            got = f"size {have[bad]}" if bad in have else "absent"
            size = f"size {want[bad]}" if bad in want else "absent"
            raise ShardingError(
                f"{label(where)}: its mesh {dict(have)} is not the gp.spmd function's mesh {dict(want)}: mesh axis "
                f"{bad!r} is {got} in the shard_map and {size} in the gp.spmd mesh (a shard_map inside a gp.spmd "
                f"function must use the same axis names and sizes, in the same order)")
    manual = manual_axes(params)
    if annotated is not None:
        raise AnnotationError(
            f"{label(where)}: {annotated} inside it: the region's values are per-device blocks over its manual mesh "
            f"axes {manual}, where a sharding means nothing (jax.jit refuses with_sharding_constraint there too); "
            f"annotate the region's operands or results outside it")
    auto = tuple(n for n in names if n not in manual)
    if auto:
        raise UnsupportedOpError(
            f"{label(where)} is manual over {manual} only, leaving mesh axes {auto} to the compiler "
            f"(partial-auto shard_map): gspmd_py supports shard_map regions manual over every mesh axis "
            f"(drop axis_names=, or annotate the values outside the region over {auto})")


_MISMATCH = re.compile(r"context mesh (\w*Mesh\(.*?\)) should match the mesh passed to\s+shard_map (\w*Mesh\(.*?\))",
                       re.S)
_AXIS = re.compile(r"'(\w+)': (\d+)")


def mesh_mismatch(text: str, mesh: Any, where: str) -> str:
    """The error to raise for JAX's own refusal of a shard_map whose mesh is not the context
    mesh (gp.spmd's, while it traces), '' when ``text`` is not that refusal."""
    m = _MISMATCH.search(text)
    if m is None:
        return ""
    have = {n: int(s) for n, s in _AXIS.findall(m[2])}
    try:
        check({"mesh": _Named(tuple(have), tuple(have.values()))}, mesh, where)
    except ShardingError as e:
        return str(e)
    return (f"{label(where)}: its mesh {m[2]} is not the gp.spmd function's mesh {mesh} (a shard_map inside a "
            f"gp.spmd function must use a mesh of the same axis names, sizes and device kind)")


class _Named:
    def __init__(self, names: tuple[str, ...], sizes: tuple[int, ...]):
        self.axis_names, self.axis_sizes = names, sizes


def _spec_dims(spec: Any, ndim: int) -> Dims:
    """Per dim the mesh axes of a PartitionSpec (or an older ``names`` dict: dim -> axes)."""
    if isinstance(spec, Mapping):
        return tuple(tuple(spec.get(d, ())) for d in range(ndim))
    out = []
    for entry in tuple(spec)[:ndim]:
        if entry is None:
            out.append(())
        elif isinstance(entry, (tuple, list)):
            out.append(tuple(str(a) for a in entry))
        else:
            out.append((str(entry),))
    return tuple(out) + ((),) * (ndim - len(out))


def in_dims(params: Mapping[str, Any], ndims: Sequence[int]) -> list[Dims]:
    return [_spec_dims(s, n) for s, n in zip(compat.shard_map_specs(dict(params))[0], ndims)]


def out_dims(params: Mapping[str, Any], ndims: Sequence[int]) -> list[Dims]:
    return [_spec_dims(s, n) for s, n in zip(compat.shard_map_specs(dict(params))[1], ndims)]


def body(params: Mapping[str, Any]):
    """The region's body jaxpr (open: the region's consts are its operands)."""
    return params["jaxpr"]
