"""The search's results as values: a priced candidate, the search's result, the memory-limit
error, and bytes for people (search/optimizer.py makes them; api/auto.py and
search/autoreport.py read them)."""
from __future__ import annotations

from typing import Optional

import attrs

from ..core.errors import ShardingError
from .points import PointClass
from .price import Price

Action = tuple  # (class index, dim, axis name)
MAX_EVALUATIONS = 2000  # default deterministic budget: candidate states priced or ranked


class MemoryLimitError(ShardingError):
    """No plan the search found fits the memory limit."""


@attrs.frozen
class Candidate:
    """One priced state: its actions, said in words, and the cost model's verdict."""

    actions: tuple[Action, ...]
    text: str
    price: Price
    fits: bool
    built: bool = True  # False: the partitioner could not build it (skipped; SearchResult.skipped)


@attrs.frozen
class SearchResult:
    decisions: dict  # value id -> per dim [AxisRef] (what the search decided)
    best: Candidate
    top: tuple[Candidate, ...]  # the best distinct candidates, best first
    baselines: tuple[tuple[str, Candidate], ...]
    explored: int  # states evaluated
    programs: int  # distinct per-device programs built and costed
    seconds: float
    axes: tuple[str, ...]
    hardware: str
    memory_limit: Optional[float]
    classes: tuple[PointClass, ...]
    screened: int = 0  # states the cost tables ranked (the pre-screen; tables.py)
    skipped: tuple[tuple[str, int], ...] = ()  # (reason, candidates) the partitioner could not build
    stopped_by: str = ""  # "" (converged), "evaluations" (max_evaluations) or "time" (time_budget_s)
    max_evaluations: int = MAX_EVALUATIONS
    top_decisions: tuple = ()  # per candidate of ``top``: its decisions (value id -> dims), as ``decisions``
    exact: object = None  # exact.ExactResult: what the MILP did (None: not run)
    exact_candidate: Optional[Candidate] = None  # the MILP's plan, priced by the normal path
    relayouts: tuple = ()  # (input, its layout, returned layout, seconds): returned state in another layout
    times: tuple = ()  # (phase, seconds): the search's time split (api/auto.py adds trace and measure)


def bytes_text(b: float) -> str:
    """``b`` bytes for people: "1.5 GiB", "12 KiB", "7 B"."""
    for unit, k in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(b) >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"
