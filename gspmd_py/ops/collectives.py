"""The collective kinds, one table: what the partitioner emits for each, which primitives of
the per-device program the program index reads as it, how the combiner merges it, by which
formula the cost model prices it, and whether views print a reduction with it.

    ALL_REDUCE = "all-reduce"                      (gp.Collective.kind, fixed by the design)
    KINDS[ALL_REDUCE].primitives == ("psum", "pmax", "pmin", ...)    (ops/program.py's facts)
    KINDS[ALL_REDUCE].merge == VARIADIC            (program/combine.py)
    KINDS[ALL_REDUCE].formula == RING_TWICE        (cost/collectives.py)

A new kind is a row here, its primitives' facts (``OpFacts.collective``, ops/program.py),
and, where its merge or formula is new, the branch that reads it. ``check`` runs at import
(``gspmd_py.ops``): every primitive whose facts name a kind is in that kind's row and the
other way round, and every field is one of its options.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

import attrs

ALL_GATHER = "all-gather"
ALL_REDUCE = "all-reduce"
REDUCE_SCATTER = "reduce-scatter"
ALL_TO_ALL = "all-to-all"
COLLECTIVE_PERMUTE = "collective-permute"

# -- how the combiner merges independent ones of a kind (program/combine.py) ----------------
NO_MERGE = ""
VARIADIC = "variadic"  # one equation over every operand (program/variadic.py)
FLAT_GATHER = "flat_gather"  # tiled ones: each device's flat concatenation gathered as [k, L]
FLAT_SCATTER = "flat_scatter"  # tiled ones: each scatter dim split into its k blocks, one [k, L] scatter
MERGES = (NO_MERGE, VARIADIC, FLAT_GATHER, FLAT_SCATTER)

# -- the cost model's formula (cost/collectives.py) -------------------------------------------
RING = "ring"  # (p-1) alpha + (p-1)/p n / beta per level, the full buffer shrinking by p per level
RING_TWICE = "ring_twice"  # a reduce-scatter then an all-gather: twice the ring
ALL_TO_ALL_FORMULA = "all_to_all"  # (p-1)/p of the local buffer per level (a torus pays p^2/4(p-1))
PAIRWISE = "pairwise"  # one message per pair: alpha + b / beta at the slowest level crossed
FORMULAS = (RING, RING_TWICE, ALL_TO_ALL_FORMULA, PAIRWISE)


def _one_of(options: tuple) -> Callable:
    def check(inst, attribute, value) -> None:
        if value not in options:
            raise ValueError(f"CollectiveKind.{attribute.name}={value!r}: expected one of {options}")
    return check


@attrs.frozen
class CollectiveKind:
    """One kind of collective (see the module doc)."""

    name: str  # gp.Collective.kind
    emits: str  # the jax.lax function the partitioner emits it with (partitioner/context.py)
    primitives: tuple[str, ...]  # the per-device program's primitives the program index reads as it
    merge: str = attrs.field(validator=_one_of(MERGES))
    formula: str = attrs.field(validator=_one_of(FORMULAS))
    reduces: bool = False  # carries a reduction (sum, max, min): records hold it, views print it
    gathers: bool = False  # its full buffer is p times what one device puts in (all-gather, all-to-all)


KINDS: Mapping[str, CollectiveKind] = MappingProxyType({k.name: k for k in (
    CollectiveKind(ALL_GATHER, "all_gather", ("all_gather",), FLAT_GATHER, RING, gathers=True),
    CollectiveKind(ALL_REDUCE, "psum", ("psum", "pmax", "pmin", "psum_combined", "pmax_combined", "pmin_combined"),
                   VARIADIC, RING_TWICE, reduces=True),
    CollectiveKind(REDUCE_SCATTER, "psum_scatter", ("reduce_scatter", "psum_scatter"), FLAT_SCATTER, RING,
                   reduces=True),
    CollectiveKind(ALL_TO_ALL, "all_to_all", ("all_to_all", "ragged_all_to_all"), NO_MERGE, ALL_TO_ALL_FORMULA,
                   gathers=True),
    CollectiveKind(COLLECTIVE_PERMUTE, "ppermute", ("ppermute",), NO_MERGE, PAIRWISE),
)})


def kind_of(name: str) -> CollectiveKind:
    """The row of collective kind ``name`` (a ValueError naming the kinds for any other)."""
    got = KINDS.get(name)
    if got is None:
        raise ValueError(f"unknown collective kind {name!r}: expected one of {tuple(KINDS)}")
    return got


def check(collective_of: Mapping[str, str]) -> None:
    """The table against the declared facts (``collective_of``: primitive -> its
    ``OpFacts.collective``, "" for none): each kind's primitives declare it, and every
    primitive that declares a kind is in its row."""
    bad = [f"{p} (declared {collective_of.get(p, 'nothing')!r}, listed under {k.name!r})"
           for k in KINDS.values() for p in k.primitives if collective_of.get(p) != k.name]
    bad += [f"{p} (declares {c!r}, not listed there)" for p, c in sorted(collective_of.items())
            if c and p not in KINDS.get(c, CollectiveKind(c, "", (), NO_MERGE, RING)).primitives]
    if bad:
        raise ValueError("the collective kinds (ops/collectives.py) and the primitives' facts disagree: "
                         + "; ".join(bad))
