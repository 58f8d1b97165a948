"""A partitioned value: the local shard of a global tensor inside the SPMD program.

    PValue(local f32[4,2], global (7, 8), dims=(("x",), ("y:0", "y:1")), partial=None)

Dim d of global size n over k shards (k = product of its fine axes' sizes) has local
size ceil(n/k); shard i holds rows [i*c, min(n, (i+1)*c)). Rows past n are padding
whose contents are unspecified: ops whose result depends on them (reductions, dot
contractions, cumulative ops, sort) mask them first. ``partial`` (partial.py) says the
local values are partial results (sums, maxima, ...) over some fine mesh axes; while
partial, ``x`` may be held in a wider accumulation dtype than the logical ``dtype``.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import attrs

FineDims = tuple[tuple[str, ...], ...]


@attrs.frozen
class Partial:
    """Local values are partial results over ``axes`` (fine axes), combined with ``op``.

    ``op``: "sum" | "max" | "min" | "and" | "or" | "xor" | "prod" (DTensor's
    ``Partial(reduce_op)``) | "pick" (one device holds each element, the others zero bits). Example: a dot whose contracting dim is sharded over y gives
    ``Partial(("y",), "sum")``; a max-reduction over a dim sharded over x gives
    ``Partial(("x",), "max")``.
    """

    axes: tuple[str, ...]
    op: str = "sum"


@attrs.define(eq=False)
class PValue:
    x: Any  # the local jax array (a tracer while the program is built)
    shape: tuple[int, ...]  # global logical shape
    dims: FineDims
    partial: Optional[Partial] = None
    dtype: Any = None  # logical dtype (x.dtype unless x is a partial held in an accumulation dtype)
    key: int = -1  # unique id, for the reshard cache

    def __attrs_post_init__(self) -> None:
        if self.dtype is None:
            self.dtype = self.x.dtype
        if self.partial is not None and not self.partial.axes:
            self.partial = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def partial_axes(self) -> tuple[str, ...]:
        return self.partial.axes if self.partial is not None else ()


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shards(sizes: dict[str, int], axes: Sequence[str]) -> int:
    return int(math.prod(sizes[a] for a in axes))


def local_shape(shape: Sequence[int], dims: FineDims, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(ceil_div(n, shards(sizes, axes)) if axes else n for n, axes in zip(shape, dims))
