"""``jax.vmap(f, spmd_axis_name=a)`` of a gp.spmd function that already shards over ``a``.

vmap puts its batch dim over ``a`` on every input and output of the program; one that is
already sharded over ``a`` would then name ``a`` twice (JAX's own error, DuplicateSpecError
from the staged jit, names neither the function nor the value). These checks say it as an
ArgumentError naming the axis, the value and its sharding::

    gp.spmd(f, mesh, in_shardings=(P("x", None),));  jax.vmap(f, spmd_axis_name="x")(xs)
    -> ArgumentError: f: jax.vmap(..., spmd_axis_name='x') puts the batch dim over mesh axis 'x', but
       in_shardings of arg0 (P('x', None)) already uses it; ...
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence

from ..core.errors import ArgumentError

_DUPLICATE = re.compile(r"duplicate entries for `([^`]+)`")


def check_batch_axes(fn_name: str, batch: Optional[Sequence], givens: Iterable) -> None:
    """Raise unless ``batch`` (the spmd_axis_name axes, AxisRefs; None: no axis) is free in
    every Given (api/primitive.py's: per dim a tuple of AxisRefs or None)."""
    if not batch:
        return
    names = {a.name for a in batch}
    for g in givens:
        if g is None or g.dims is None:
            continue
        used = {a.name for d in g.dims if d for a in d} & names
        if used:
            spec = "P(" + ", ".join("None" if not d else repr(str(d[0])) if len(d) == 1 else repr(tuple(map(str, d)))
                                    for d in g.dims) + ")"
            raise _error(fn_name, sorted(used)[0], batch, f"{g.label} ({spec}) already uses it")


def duplicate_axis_error(fn_name: str, e: Exception, where: Sequence[tuple[str, object]]) -> Optional[ArgumentError]:
    """JAX's DuplicateSpecError from a staged gp.spmd call under ``jax.vmap(spmd_axis_name=...)``
    as an ArgumentError naming the axis and which of ``where`` ((label, NamedSharding) per input
    and output) uses it; None for any other error."""
    if type(e).__name__ != "DuplicateSpecError":
        return None
    m = _DUPLICATE.search(str(e))
    axis = m.group(1) if m else None
    hits = [f"{label} ({sh.spec})" for label, sh in where
            if axis is not None and any(axis == n or (isinstance(n, tuple) and axis in n) for n in sh.spec)]
    what = (", ".join(hits[:3]) + (" ..." if len(hits) > 3 else "")) if hits else "a value of its plan"
    return _error(fn_name, axis or "?", (axis,), f"{what} already use{'s' if len(hits) <= 1 else ''} it")


def _error(fn_name: str, axis: str, batch, why: str) -> ArgumentError:
    said = [str(a) for a in batch]
    name = repr(said[0]) if len(said) == 1 else repr(tuple(said))
    return ArgumentError(
        f"{fn_name}: jax.vmap(..., spmd_axis_name={name}) puts the batch dim over mesh axis {axis!r}, but {why}; "
        f"a mesh axis can shard one dim of a value: vmap over another mesh axis, leave spmd_axis_name out, or "
        f"shard that value over other axes")
