"""Dtype classes and reduction identities, ml_dtypes aware (bfloat16, float8_*, int4).

NumPy's own predicates are wrong for the dtypes people train in:
``np.issubdtype(bfloat16, np.floating)`` is False (ml_dtypes registers them as void-like
scalar types), so every dtype question in gspmd_py goes through this module::

    >>> is_float(jnp.bfloat16), is_float(np.int8), is_int(np.uint8), is_bool(np.bool_)
    (True, False, True, True)
    >>> identity("max", jnp.bfloat16), identity("and", np.int8), identity("and", np.uint8)
    (-inf, -1, 255)
    >>> accumulation_dtype("sum", np.float16)     # f16 partial sums are held in f32
    dtype('float32')
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REDUCE_OPS = ("sum", "prod", "max", "min", "and", "or", "xor")


def dtype(dt: Any) -> np.dtype:
    """NumPy's dtype of ``dt``; extended dtypes (PRNG keys) become the void dtype."""
    try:
        return np.dtype(dt)
    except TypeError:
        return np.dtype("V")


def is_float0(dt: Any) -> bool:
    """JAX's float0: the tangent type of integers and booleans (no data)."""
    return dt is not None and dtype(dt) == jax.dtypes.float0


def is_float(dt: Any) -> bool:
    """Real floating point: float16/32/64, bfloat16, float8_* (not complex)."""
    return bool(jnp.issubdtype(dtype(dt), jnp.floating))


def is_complex(dt: Any) -> bool:
    return bool(jnp.issubdtype(dtype(dt), jnp.complexfloating))


def is_inexact(dt: Any) -> bool:
    return is_float(dt) or is_complex(dt)


def is_bool(dt: Any) -> bool:
    return dtype(dt) == np.bool_


def is_int(dt: Any) -> bool:
    """Signed or unsigned integers (int4 included), not bool."""
    return bool(jnp.issubdtype(dtype(dt), jnp.integer))


def is_unsigned(dt: Any) -> bool:
    return bool(jnp.issubdtype(dtype(dt), jnp.unsignedinteger))


def is_key(dt: Any) -> bool:
    """A typed PRNG key dtype (``key<fry>``): an extended dtype, uint32 words underneath."""
    return not isinstance(dt, np.dtype) and bool(jax.dtypes.issubdtype(dt, jax.dtypes.extended))


def itemsize(dt: Any) -> int:
    """Bytes per element; a typed key's are its words' (``key<fry>``: 2 uint32, 8 bytes)."""
    try:
        return np.dtype(dt).itemsize
    except TypeError:
        return int(getattr(dt, "itemsize", 8))


def identity(op: str, dt: Any) -> np.ndarray:
    """The identity element of reduction ``op`` in dtype ``dt`` (a 0-d array of that dtype).

    max/min of floats: -inf/+inf (also for float8 types without inf: their lowest/highest
    finite value then); integers: their min/max; bool: False/True. ``and`` on integers is
    all ones (-1 signed, max unsigned), not 1.
    """
    d = dtype(dt)
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduction {op!r}")
    if op in ("sum", "or", "xor"):
        return np.zeros((), d)
    if op == "prod":
        return np.ones((), d)
    if is_bool(d):
        return np.asarray(op in ("and", "min"), d)
    if op == "and":
        if not is_int(d):
            raise ValueError(f"bitwise and of {d}")
        return np.asarray(jnp.iinfo(d).max if is_unsigned(d) else -1, d)
    big = op == "min"
    if is_float(d):
        with np.errstate(all="ignore"):
            v = np.asarray(np.inf if big else -np.inf, d)
        if not np.isinf(v.astype(np.float32)):  # float8 types without inf (e4m3fn): finite extremes
            fi = jnp.finfo(d)
            v = np.asarray(fi.max if big else fi.min, d)
        return v
    if is_int(d):
        ii = jnp.iinfo(d)
        return np.asarray(ii.max if big else ii.min, d)
    if is_complex(d):  # lax.max/min order complex numbers lexicographically (real part first)
        inf = np.inf if big else -np.inf
        return np.asarray(complex(inf, inf), d)
    raise ValueError(f"no identity of {op} for {d}")


def accumulation_dtype(op: str, dt: Any) -> np.dtype:
    """The dtype partial results of ``op`` are held in until they are reduced across devices.

    float16 sums are held in float32 (its range is too small: 35000 + 35000 overflows), as
    XLA's own CPU/GPU reductions of float16 accumulate in float32; every other dtype keeps
    its own (bfloat16 has float32's range; integer sums wrap exactly in any order).
    """
    d = dtype(dt)
    if op == "sum" and d == np.float16:
        return np.dtype(np.float32)
    return d


def short_name(dt: Any) -> str:
    if is_key(dt):
        return str(dt)  # key<fry>
    try:
        name = dtype(dt).name
    except TypeError:
        return str(dt)
    return {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "s32",
            "int64": "s64", "int16": "s16", "int8": "s8", "uint32": "u32", "uint16": "u16", "uint8": "u8",
            "uint64": "u64", "bool": "pred", "complex64": "c64", "complex128": "c128"}.get(name, name)


def additive_identity(dt: Any) -> np.ndarray:
    """-0.0 for floating point (x + -0.0 == x for every x, +0.0 and -0.0 included), else 0."""
    d = dtype(dt)
    if is_inexact(d):
        return np.asarray(-0.0, d) if not is_complex(d) else np.asarray(complex(-0.0, -0.0), d)
    return np.zeros((), d)
