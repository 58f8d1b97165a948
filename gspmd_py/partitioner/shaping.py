"""Collectives shaped for the hardware: what ``gp.spmd(..., hardware=hw, collective_matmul_bytes=N)`` asks.

A ``Shaping`` is a value the plan carries (Ctx.shaping). Without a hardware and without
``collective_matmul_bytes`` it is ``Shaping()`` and every handler emits today's program.

* ``hardware``: reductions whose group spans link levels are synthesized as the cheapest
  sequence of reduce-scatter / all-reduce / all-gather over sub-groups (hierarchy.py);
  the mesh axes that cross a node boundary are split there (``link_refs``), so a
  sub-group can be named.
* ``collective_matmul_bytes``: an all-gather feeding a dot, or a dot feeding a
  reduce-scatter, becomes a ring of collective-permutes and partial dots (collective_matmul.py)
  when the looped operand reaches this many bytes per device (0: always); ``None``: when
  the hardware's overlapped schedule says it pays (never without a hardware): each dot is
  decomposed where its own overlapped steps beat the collective and the dot, then the
  whole program is priced (``plan.cost(hw, overlap=True)``) with and without them, and
  the cheaper kept (a plain all-gather of a weight may already hide behind earlier work).

Each choice is recorded as a ``Shaped`` (op, what, the chosen program, its predicted price
and the plain program's): ``plan.report()`` prints them.
"""
from __future__ import annotations

from typing import Optional

import attrs

from ..core.errors import HardwareError


def _threshold(inst, attr, value) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise HardwareError(f"gp.spmd: collective_matmul_bytes must be a non-negative int (0: always decompose) "
                            f"or None, got {value!r}")


def _hardware(inst, attr, value) -> None:
    from ..cost.hardware import Hardware

    if value is not None and not isinstance(value, Hardware):
        raise HardwareError(f"gp.spmd: hardware must be a gp.Hardware (e.g. gp.Hardware.preset('h100-node')), "
                            f"got {type(value).__name__}")


@attrs.frozen
class Shaping:
    hardware: Optional[object] = attrs.field(default=None, validator=_hardware)  # gp.Hardware
    collective_matmul_bytes: Optional[int] = attrs.field(default=None, validator=_threshold)
    matmul: bool = True  # False: no collective matmul (the plan compared against, compiler.plan_jaxpr)

    @property
    def active(self) -> bool:
        return self.hardware is not None or self.collective_matmul_bytes is not None

    @property
    def decides_matmul(self) -> bool:
        """Collective matmul left to the cost model: the whole program is priced both ways."""
        return self.hardware is not None and self.collective_matmul_bytes is None and self.matmul


@attrs.frozen
class Shaped:
    """One collective the hardware shaped: ``what`` it replaces (e.g. "all-reduce(x,y) 4096B"),
    the program ``chosen`` ("reduce-scatter(y) 4096B; all-reduce(x) 1024B; all-gather(y) 1024B"),
    its predicted seconds and the plain program's (``nan`` without a hardware)."""

    op: str
    what: str
    chosen: str
    seconds: float
    plain_seconds: float
    kind: str = "reduction"  # or "matmul" (collective_matmul.py)

    def __str__(self) -> str:
        if self.seconds != self.seconds:  # no hardware: forced by collective_matmul_bytes
            return f"{self.op}: {self.what} as {self.chosen}"
        return (f"{self.op}: {self.what} as {self.chosen}: {self.seconds * 1e6:.1f} us predicted "
                f"(flat: {self.plain_seconds * 1e6:.1f} us)")
