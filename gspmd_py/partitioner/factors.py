"""From an op's factor rule and the shardings at hand to per-factor mesh axes, and back.

    rule   "b m k, b k n -> b m n"  (k reduction)
    want   result [{x}, {}, {y}]    -> b: x, n: y
    lhs    [{x}, {}, {y}]  offers k: y, but y is taken by n -> k stays unsharded
    so lhs target [{x}, {}, {}], rhs target [{x}, {}, {y}]

Fine axes are atomic here: a factor takes whole fine axes while they divide it.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..ops.rule import PASS, OpRule
from .pvalue import FineDims, PValue

FactorAxes = dict[int, tuple[str, ...]]


def split_dim(sizes: dict[str, int], axes: Sequence[str], factor_sizes: Sequence[int]) -> Optional[list[tuple[str, ...]]]:
    """Distribute a dim's fine axes over its factors (major first); None if they do not fit evenly.

    A dim with a single factor takes all its axes (uneven allowed).
    """
    if len(factor_sizes) == 1:
        return [tuple(axes)]
    if not factor_sizes:
        return None if axes else []
    out: list[list[str]] = [[] for _ in factor_sizes]
    f, rest = 0, factor_sizes[0]
    for a in axes:
        while f < len(factor_sizes) and rest == 1:
            f += 1
            rest = factor_sizes[f] if f < len(factor_sizes) else 1
        if f >= len(factor_sizes) or rest % sizes[a]:
            return None
        out[f].append(a)
        rest //= sizes[a]
    return [tuple(o) for o in out]


def project(sizes: dict[str, int], fa: FactorAxes, fs: Sequence[int], factor_sizes: Sequence[int]) -> tuple[str, ...]:
    out: list[str] = []
    for f, s in zip(fs, factor_sizes):
        axes = fa.get(f, ())
        out.extend(axes)
        k = 1
        for a in axes:
            k *= sizes[a]
        if len(fs) > 1 and k != s:
            break
    return tuple(out)


def choose(sizes: dict[str, int], rule: OpRule, args: Sequence[PValue], want: Sequence[FineDims],
           kinds=(PASS,), operand_first: Sequence[int] = ()) -> FactorAxes:
    """Per-factor axes: first the factors in ``operand_first`` from the operands' current
    shardings, then every allowed factor from the wanted result shardings, then remaining
    allowed factors from the operands. An axis is never used twice."""
    fa: FactorAxes = {}
    used: set[str] = set()

    def offer(f: int, axes: Sequence[str]) -> None:
        if f in fa or rule.factors[f].kind not in kinds:
            return
        take: list[str] = []
        for a in axes:
            if a in used:
                break
            take.append(a)
        if take:
            fa[f] = tuple(take)
            used.update(take)

    def from_tensors(tensors, dims_list, only=None):
        for dims, tdims in zip(dims_list, tensors):
            for fs, axes in zip(tdims, dims):
                if not fs or not axes:
                    continue
                parts = split_dim(sizes, axes, [rule.factors[f].size for f in fs])
                if parts is None:
                    continue
                for f, p in zip(fs, parts):
                    if only is None or f in only:
                        offer(f, p)

    if operand_first:
        from_tensors(rule.operands, [a.dims for a in args], set(operand_first))
    from_tensors(rule.results, want)
    from_tensors(rule.operands, [a.dims for a in args])
    return fa


def targets(sizes: dict[str, int], rule: OpRule, fa: FactorAxes, tensors) -> list[FineDims]:
    out = []
    for tdims in tensors:
        out.append(tuple(project(sizes, fa, fs, [rule.factors[f].size for f in fs]) if fs else () for fs in tdims))
    return out
