"""User-facing errors. Every error gspmd_py raises on bad input derives from ShardingError."""
from __future__ import annotations

import operator
from typing import Any


class ShardingError(ValueError):
    """Base of every user-facing gspmd_py error."""


class MeshError(ShardingError):
    """A mesh that cannot be built: bad shape, names or device ids."""


class SpecError(ShardingError):
    """A sharding spec that does not fit the tensor or the mesh."""


class TileAssignmentError(ShardingError):
    """A GSPMD tile assignment that the mesh cannot express."""


class AnnotationError(ShardingError):
    """An annotation on something that is not an array, or conflicting annotations."""


class ArgumentError(AnnotationError):
    """An argument a gp.spmd function cannot take: a non-array leaf, a jax.ShapeDtypeStruct in a
    call, a Python int out of its dtype's range, an unhashable static argument, or a
    transformation it cannot be part of. (An AnnotationError too: non-array leaves were those.)"""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type to a gp.testing helper (a mesh that is not a gp.Mesh, a
    tolerance that is not a number), or an array JAX refuses by its type (a numpy array in a
    non-native byte order): a TypeError too, as Python's own and jax.jit's for such a mistake."""


class DeletedArrayError(ArgumentError, RuntimeError):
    """An argument whose buffers are gone (donated to an earlier call, or deleted by ``.delete()``). A
    RuntimeError too, as jax.jit's "Array has been deleted"."""


class NotPicklableError(ShardingError, TypeError):
    """A gspmd_py object that cannot be pickled (a gp.Plan holds the traced jaxpr and the built
    program); the message says what to pickle instead. A TypeError too, as pickle's own
    "cannot pickle ... object"."""


class UnsupportedOpError(ShardingError):
    """A primitive with no sharding rule."""


class PartitionWarning(UserWarning):
    """An op was computed replicated (involuntary full rematerialization)."""


class HardwareError(ShardingError):
    """A gp.Hardware asked for something its topology does not have, or a bad hardware option."""


def short_repr(x, limit: int = 80) -> str:
    """``repr(x)`` cut to ``limit`` characters (messages never print a 3,000-character model)."""
    try:
        r = repr(x)
    except Exception:  # pragma: no cover - a broken __repr__ must not hide the real error
        r = f"<{type(x).__name__}>"
    r = " ".join(r.split())
    return r if len(r) <= limit else r[: limit - 5] + " ...>"


def first_line(e: BaseException, limit: int = 160) -> str:
    """An error said in one line: its type and the first line of its message (a skipped
    candidate or schedule in a search report)."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:limit]}"


def as_int(x: Any, name: str, lo: int | None = None) -> int:
    """``x`` as a Python int (an integer or an integer-like array scalar), at least ``lo``: a
    TypeError or ValueError naming ``name`` otherwise (the index tables' argument check)."""
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {x!r}") from None
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return int(v)
