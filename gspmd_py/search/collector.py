"""Python's cyclic garbage collector during the sharding search: young collections only.

The search keeps large tables alive for its whole run (propagation memos, the cost tables,
every candidate's propagation and price) and makes a program per priced candidate, whose
tracing leaves cyclic garbage. With the collector on, each full collection walks the whole
heap, the tables included, and the search's allocation rate triggers one every few hundred
thousand objects, each reclaiming little (docs/performance.md's appendix measures it). ``young_only`` turns the automatic collector off for the search and
hands back ``collect``, which the pricer calls once per program it builds: a collection of
the two young generations, which walks only what was made since the last one and reclaims
that candidate's cycles (so its garbage does not pile up, as it would with the collector
simply off), then promotes the survivors to the old generation, which the search never
walks. The old generation is collected as usual once the collector is back on.

A collector the caller turned off stays off, and nothing is collected then; a search inside
another (gp.auto_shard's pipeline screens) leaves it to the outermost (the collector is off
by then).
"""
from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterator


def _young() -> None:
    gc.collect(1)


def _nothing() -> None:
    return None


@contextlib.contextmanager
def young_only() -> Iterator[Callable[[], None]]:
    """The automatic collector off inside; yields what collects the young generations (a no-op
    when the collector was off already)."""
    if not gc.isenabled():
        yield _nothing
        return
    gc.disable()
    try:
        yield _young
    finally:
        gc.enable()
