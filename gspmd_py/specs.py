"""User specs -> per-leaf shardings: in_shardings/out_shardings over argument pytrees, and
annotation specs inside the function.

    _broadcast_specs((P("x", None), None), (x, w), "in_shardings")   # one spec per leaf
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from .annotate import OPEN
from .errors import AnnotationError, SpecError
from .mesh import AxisRef, Mesh
from .sharding import P, Sharding

_SPEC_LEAF = (P, JP, NamedSharding, Sharding)


def _is_spec(x) -> bool:
    return x is None or isinstance(x, _SPEC_LEAF)


def _broadcast_specs(specs, tree, what: str) -> list:
    """One spec per leaf of ``tree``: ``specs`` is a spec (applies to the whole subtree) or a
    pytree prefix of ``tree`` whose leaves are specs, as jax.jit's in_shardings."""
    if _is_spec(specs):
        return [specs] * len(jax.tree_util.tree_leaves(tree))
    if isinstance(specs, (list, tuple)) and isinstance(tree, (list, tuple)) and not isinstance(specs, _SPEC_LEAF):
        if len(specs) != len(tree):
            raise SpecError(f"{what}: got {len(specs)} entries for {len(tree)} arguments/outputs")
        out = []
        for i, (s, t) in enumerate(zip(specs, tree)):
            out += _broadcast_specs(s, t, f"{what}[{i}]")
        return out
    if isinstance(specs, dict) and isinstance(tree, dict):
        if set(specs) != set(tree):
            raise SpecError(f"{what}: keys {sorted(specs)} do not match the argument's keys {sorted(tree)}")
        out = []
        for k in sorted(tree):
            out += _broadcast_specs(specs[k], tree[k], f"{what}[{k!r}]")
        return out
    raise SpecError(f"{what}: {specs!r} is not a spec (gp.P / PartitionSpec / None) nor a pytree prefix of the arguments")


def _dims_from_spec(mesh: Mesh, spec, rank: int, what: str) -> tuple[Optional[tuple[AxisRef, ...]], ...]:
    if isinstance(spec, Sharding):
        if spec.mesh != mesh:
            raise SpecError(f"{what}: sharding is over {spec.mesh}, not the function's mesh {mesh}")
        s = spec
    else:
        try:
            s = Sharding(mesh, spec, what=what)
        except SpecError as e:
            msg = str(e)
            raise SpecError(msg if msg.startswith(what) else f"{what}: {msg}") from None
    s = s.with_rank(rank, what)
    return tuple(s.dims)


def _annotation_dims(mesh: Mesh, spec: tuple, rank: int, what: str):
    out = []
    for d, e in enumerate(spec):
        if e == OPEN:
            out.append(None)
            continue
        try:
            out.append(tuple(mesh.ref(a) for a in e))
        except SpecError as err:
            raise SpecError(f"{what}, dim {d}: {err}") from None
    out += [()] * (rank - len(out))
    try:
        Sharding.of(mesh, [o or () for o in out])
    except SpecError as err:
        raise SpecError(f"{what}: {err}") from None
    return tuple(out)


def _aval(x, i: int):
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    if isinstance(x, (int, float, complex, bool, np.generic)):
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, jnp.asarray(x).dtype)
    raise AnnotationError(f"argument leaf {i} is {type(x).__name__}, not an array or jax.ShapeDtypeStruct")


