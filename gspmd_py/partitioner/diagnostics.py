"""What the partition pass found while it built the per-device program: a value.

``compiler.partition`` (partitioner/passes.py) returns it inside ``Partitioned``; the Plan carries it (with the
boundary's layout notes, and the compiler's note on collective matmul, each added as a NEW
value by ``with_notes``); ``plan.report()`` prints it::

    d = part.diagnostics
    d.notes          # ("dot_general #3 (model.py:40): operand 0 dim 1 ... gathered whole", ...)
    d.fallbacks      # (Fallback("sort #7", "sort has no partitioned form: computed replicated"),)
    d.shaped         # collectives shaped for a hardware (shaping.Shaped), in the order chosen
    d.held           # value id -> Held: what the traced program holds for it (partials included)
    d.seen_operands  # op id -> the operand shardings its handler received
    d.host_calls     # host_calls.HostCall per jax.pure_callback / debug callback (re-raised on failure)
    d2 = d.with_notes("output 0 ... is returned over the execution mesh")   # d is unchanged

``host_calls`` are the one live part: each HostCall keeps the exception its callback raised
during a run, for ``Compiled.run`` (runtime/stages.py) to re-raise (the tuple holding them never changes).
"""
from __future__ import annotations

import types
from typing import Any, Mapping, Optional

import attrs

from .pvalue import FineDims, Partial
from .shaping import Shaped


@attrs.frozen
class Fallback:
    """An op computed replicated although it moves or recomputes a sharded tensor."""

    op: str
    reason: str


@attrs.frozen
class Held:
    """What the traced per-device program holds for one IR value."""

    local_shape: tuple[int, ...]  # the tracer's shape (uneven dims padded to whole shards)
    dims: FineDims  # per dim its fine mesh axes
    partial: Optional[Partial] = None  # not yet reduced over these axes (a deferred all-reduce)


def _frozen_map(m: Mapping) -> Mapping:
    return m if isinstance(m, types.MappingProxyType) else types.MappingProxyType(dict(m))


@attrs.frozen(hash=False)
class Diagnostics:
    """The partition pass's findings (see the module doc); immutable: ``with_notes`` returns a new value."""

    notes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    fallbacks: tuple[Fallback, ...] = attrs.field(default=(), converter=tuple)
    shaped: tuple[Shaped, ...] = attrs.field(default=(), converter=tuple)
    host_calls: tuple[Any, ...] = attrs.field(default=(), converter=tuple)
    held: Mapping[int, Held] = attrs.field(factory=dict, converter=_frozen_map)
    seen_operands: Mapping[int, tuple[FineDims, ...]] = attrs.field(factory=dict, converter=_frozen_map)

    def with_notes(self, *notes: str) -> "Diagnostics":
        """These diagnostics with ``notes`` added after the ones there (self is unchanged)."""
        return attrs.evolve(self, notes=self.notes + tuple(notes)) if notes else self
