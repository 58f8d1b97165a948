"""A partitioned value: the local shard of a global tensor inside the SPMD program.

    PValue(local f32[4,2], global (7, 8), dims=(("x",), ("y_0", "y_1")), partial=())

Dim d of global size n over k shards (k = product of its fine axes' sizes) has local
size ceil(n/k); shard i holds rows [i*c, min(n, (i+1)*c)). Rows past n are padding
whose contents are unspecified: ops whose result depends on them (reductions, dot
contractions, cumulative ops, sort) mask them first. ``partial`` lists fine mesh axes
over which the local values are partial sums of the true value.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import attrs

FineDims = tuple[tuple[str, ...], ...]


@attrs.define(eq=False)
class PValue:
    x: Any  # the local jax array (a tracer while the program is built)
    shape: tuple[int, ...]  # global logical shape
    dims: FineDims
    partial: tuple[str, ...] = ()
    key: int = -1  # unique id, for the reshard cache

    @property
    def rank(self) -> int:
        return len(self.shape)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shards(sizes: dict[str, int], axes: Sequence[str]) -> int:
    return int(math.prod(sizes[a] for a in axes))


def local_shape(shape: Sequence[int], dims: FineDims, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(ceil_div(n, shards(sizes, axes)) if axes else n for n, axes in zip(shape, dims))


def is_uneven(n: int, axes: Sequence[str], sizes: dict[str, int]) -> bool:
    k = shards(sizes, axes)
    return k > 1 and n % k != 0
