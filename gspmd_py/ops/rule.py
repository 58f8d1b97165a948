"""Sharding rules as factor mappings (Shardy's OpShardingRule).

An op's rule names a *factor* for every way the op relates tensor dims: each operand
and result dim maps to a list of factors (major first; reshape may need several, a
size-1 dim none). Worked examples in the notation used by the tests::

    dot_general  [b,m,k] x [b,k,n] -> [b,m,n]   "b m k, b k n -> b m n"   k: reduction
    reduce_sum   [m,n] axes=(1,)    -> [m]      "m n -> m"                n: reduction
    reshape      [8] -> [2,4]                   "(p q) -> p q"            p=2, q=4
    cumsum       [m,n] axis=0       -> [m,n]    "m n -> m n"              m: need_replication
    conv         [b,h,c] x [w,c,o]  -> [b,h,o]  "b h c, w c o -> b h o"   h: window, c: reduction

Factor kinds:
  pass              same index in every tensor that has it (elementwise-like)
  reduction         appears in operands only: a sharded one gives partial sums
  need_replication  must be unsharded for the op (sort axis, cumsum axis, gather slice dims)
  window            windowed/offset dims (conv spatial, pad, slice, concat): may be sharded,
                    the partitioner exchanges halos
Propagation reads factors to move shardings between tensors; the partitioner reads the
same rule to pick each operand's sharding and the local computation.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import attrs

PASS, REDUCTION, NEED_REPLICATION, WINDOW = "pass", "reduction", "need_replication", "window"
KINDS = (PASS, REDUCTION, NEED_REPLICATION, WINDOW)

# op priority levels for propagation (lower runs first), as GSPMD's aggressiveness/Shardy's op priority
ELEMENTWISE, DOT, OTHER, BROADCAST = 0, 1, 2, 3

TensorDims = tuple[tuple[int, ...], ...]  # per dim: factor ids, major first


@attrs.frozen
class Factor:
    size: int
    kind: str = PASS


@attrs.frozen
class OpRule:
    factors: tuple[Factor, ...]
    operands: tuple[TensorDims, ...]
    results: tuple[TensorDims, ...]
    level: int = ELEMENTWISE
    forward_level: int | None = None  # level at which operand->result propagation opens (broadcast)
    handler: str = "generic"

    @property
    def tensors(self) -> tuple[TensorDims, ...]:
        return self.operands + self.results

    def factor_dims(self, f: int) -> list[tuple[int, int]]:
        """(tensor index, dim) pairs that carry factor f."""
        return [(t, d) for t, dims in enumerate(self.tensors) for d, fs in enumerate(dims) if f in fs]

    def __str__(self) -> str:
        names = [chr(ord("i") + i) if i < 18 else f"f{i}" for i in range(len(self.factors))]

        def fmt(dims: TensorDims) -> str:
            return "[" + ",".join("(" + " ".join(names[f] for f in fs) + ")" if len(fs) > 1 else
                                  (names[fs[0]] if fs else "1") for fs in dims) + "]"

        kinds = ", ".join(f"{names[i]}: {f.kind}" for i, f in enumerate(self.factors) if f.kind != PASS)
        text = ", ".join(fmt(t) for t in self.operands) + " -> " + ", ".join(fmt(t) for t in self.results)
        return text + (f"   ({kinds})" if kinds else "")


class RuleBuilder:
    """Fluent construction: ``b = RuleBuilder(); k = b.factor(4, REDUCTION); b.operand([[m], [k]])``."""

    def __init__(self) -> None:
        self._factors: list[Factor] = []
        self._operands: list[TensorDims] = []
        self._results: list[TensorDims] = []

    def factor(self, size: int, kind: str = PASS) -> int:
        assert kind in KINDS, kind
        self._factors.append(Factor(int(size), kind))
        return len(self._factors) - 1

    def factors(self, sizes: Iterable[int], kind: str = PASS) -> list[int]:
        return [self.factor(s, kind) for s in sizes]

    def operand(self, dims: Sequence[Sequence[int] | int | None]) -> "RuleBuilder":
        self._operands.append(_dims(dims, self._factors))
        return self

    def result(self, dims: Sequence[Sequence[int] | int | None]) -> "RuleBuilder":
        self._results.append(_dims(dims, self._factors))
        return self

    def build(self, level: int = ELEMENTWISE, handler: str = "generic", forward_level: int | None = None) -> OpRule:
        return OpRule(tuple(self._factors), tuple(self._operands), tuple(self._results), level, forward_level, handler)


def _dims(dims, factors: list[Factor]) -> TensorDims:
    out = []
    for d in dims:
        fs = () if d is None else (d,) if isinstance(d, int) else tuple(d)
        out.append(tuple(f for f in fs if factors[f].size != 1 or len(fs) == 1))
    return tuple(out)


def einsum_rule(spec: str, shapes: Sequence[Sequence[int]], *, reduction: str = "", need_replication: str = "",
                window: str = "", level: int = ELEMENTWISE, handler: str = "generic") -> OpRule:
    """Build a rule from einsum-like text, e.g. ``einsum_rule("b m k, b k n -> b m n", shapes, reduction="k")``.

    ``shapes`` are the operand shapes then the result shapes; a size-1 dim's letter is dropped
    (it carries no sharding), and a letter that is ``1`` maps the dim to no factor.
    """
    lhs, rhs = spec.split("->")
    tensors = [t.split() for t in lhs.split(",")] + [t.split() for t in rhs.split(",")]
    kinds = {c: k for k, cs in ((REDUCTION, reduction), (NEED_REPLICATION, need_replication), (WINDOW, window))
             for c in re.findall(r"\w+", cs)}
    b = RuleBuilder()
    ids: dict[str, int] = {}
    dims_all = []
    for letters, shape in zip(tensors, shapes):
        dims = []
        for letter, size in zip(letters, shape):
            if letter == "1":
                dims.append(None)
                continue
            if letter not in ids:
                ids[letter] = b.factor(size, kinds.get(letter, PASS))
            dims.append(ids[letter])
        dims_all.append(dims)
    n_ops = len(lhs.split(","))
    for dims in dims_all[:n_ops]:
        b.operand(dims)
    for dims in dims_all[n_ops:]:
        b.result(dims)
    return b.build(level, handler)
