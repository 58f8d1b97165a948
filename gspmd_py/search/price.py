"""Pricing one candidate: propagate its seeds, build the per-device program, run the cost model.

The search prices many candidates of ONE traced graph. For each it runs what the cost model
needs and nothing more: ``Propagation`` (shardings and projections), then the compiler's own
pass records from ``partition`` to ``reindex`` (partitioner/passes.py: the per-device
program traced by ``jax.make_jaxpr``, indexed, combined, indexed again; no jit, no lowering,
no XLA compile), then ``cost.cost`` over it. The records are the slice of the compiler's
``PASSES`` the compiler hands the search (``TacticContext.passes``), so the program priced is
built by the code that builds the program that runs. Candidates whose propagation ends in
the same shardings share one price (``Pricer`` memoises by that fingerprint).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs

from ..cost import CostInput, Hardware, cost
from ..core.ir import Graph
from ..runtime.layout import own_mesh
from ..frontend.constraints import outside_user_mesh
from ..core.mesh import Mesh
from ..program.combine import DEFAULT_THRESHOLD_BYTES
from ..partitioner import passes as program_passes
from ..partitioner.passes import Pass, run_passes
from ..partitioner.shaping import Shaping
from ..propagation import Propagation, Seed
from ..core.sharding import Sharding


@attrs.frozen
class Price:
    """The cost model's verdict on one propagated candidate (per device)."""

    step_s: float
    peak_memory_bytes: int
    comm_bytes: float
    collectives: int  # collective records in the program (combined ones count once)
    top_buffers: tuple[tuple[str, int], ...] = ()  # the largest live values at the peak: (what, bytes)


def fingerprint(prop: Propagation, graph: Graph) -> tuple:
    """The propagated shardings of every value and the factor axes of every op: equal
    fingerprints give the same per-device program."""
    vals = tuple(prop.dims_of(v) for v in graph.all_values())
    facts = tuple(tuple(sorted(p.factors.items())) for _, p in sorted(prop.projections.items()))
    return vals, facts


def per_device_program(graph: Graph, mesh: Mesh, prop: Propagation,
                       combine_threshold_bytes: int = DEFAULT_THRESHOLD_BYTES, donate: Sequence[int] = (),
                       passes: Optional[Sequence[Pass]] = None) -> CostInput:
    """The per-device program for these shardings, as the cost model's typed input: ``passes``
    (default ``PROGRAM_PASSES``: the compiler's partition, index, combine and reindex) run over
    the propagation, without the jit around them."""
    passes = program_passes.PROGRAM_PASSES if passes is None else passes
    state = {"graph": graph, "mesh": mesh, "prop": prop, "shaping": Shaping(), "threshold": combine_threshold_bytes}
    with outside_user_mesh(), own_mesh():
        run_passes(passes, state)
    return CostInput(state["idx"], mesh, tuple(donate))


class Pricer:
    """Prices seed sets over one graph; memoised by the propagated fingerprint."""

    def __init__(self, graph: Graph, mesh: Mesh, hardware: Hardware, donate: Sequence[int] = (),
                 combine_threshold_bytes: Optional[int] = None, passes: Optional[Sequence[Pass]] = None):
        self.graph, self.mesh, self.hw = graph, mesh, hardware
        self.donate = tuple(donate)
        self.passes = passes  # the pass records that build a candidate's program (None: PROGRAM_PASSES)
        self.combine = DEFAULT_THRESHOLD_BYTES if combine_threshold_bytes is None else combine_threshold_bytes
        self._memo: dict = {}
        self.priced = 0  # distinct programs built and costed
        self.propagated = 0
        self.last_key = None  # the fingerprint of the last priced candidate
        self._template: Optional[Propagation] = None
        # called before each program is built: the search's young collections (collector.py)
        self.collect: Optional[Callable[[], None]] = None

    def propagate(self, seeds: Sequence[Seed]) -> Propagation:
        self.propagated += 1
        if self._template is None:
            self._template = Propagation(self.graph, self.mesh, [])
        return self._template.with_seeds(seeds).run()

    def price(self, seeds: Sequence[Seed], prop: Optional[Propagation] = None) -> tuple[Price, Propagation]:
        """``prop``: the seeds' propagation when the caller ran it already (the search's pre-screen)."""
        prop = self.propagate(seeds) if prop is None else prop
        key = fingerprint(prop, self.graph)
        self.last_key = key
        got = self._memo.get(key)
        if got is None:
            self.priced += 1
            got = self._memo[key] = self._build(prop)
        return got, prop

    def _build(self, prop: Propagation) -> Price:
        """Build and cost one candidate (a failure propagates: the search skips and counts it)."""
        if self.collect is not None:  # (the previous program's cycles: it is garbage by now)
            self.collect()
        prog = per_device_program(self.graph, self.mesh, prop, self.combine, self.donate, self.passes)
        c = cost(prog, self.hw)
        return Price(c.step_s, c.peak_memory_bytes, c.comm_bytes, len(prog.index.collectives),
                     _top_buffers(self.graph, self.mesh, prop))


def _top_buffers(graph: Graph, mesh: Mesh, prop: Propagation, n: int = 3) -> tuple[tuple[str, int], ...]:
    """The largest values per device under these shardings (what dominates a peak): the ``n``
    first distinct texts in (bytes descending, text) order. Texts are built only for the byte
    sizes that can reach the answer (largest first), not for every value."""
    by_bytes: dict[int, list] = {}
    for v in graph.all_values():
        if v.is_const:
            continue
        dims = prop.dims_of(v)
        k = 1
        for axes in dims:
            for a in axes:
                k *= a.size
        by_bytes.setdefault(v.nbytes // max(k, 1), []).append((v, dims))
    seen, out = set(), []
    for b in sorted(by_bytes, reverse=True):
        for w in sorted(_buffer_text(mesh, v, dims) for v, dims in by_bytes[b]):
            if w in seen:
                continue
            seen.add(w)
            out.append((w, int(b)))
            if len(out) == n:
                return tuple(out)
    return tuple(out)


def _buffer_text(mesh: Mesh, v, dims) -> str:
    s = Sharding.of(mesh, dims)
    what = v.name or (f"{v.producer.prim} at {v.producer.source}" if v.producer is not None
                      and v.producer.source else (v.producer.prim if v.producer is not None else f"%{v.id}"))
    return f"{what} {v.type_str} {s.shardy()}"
