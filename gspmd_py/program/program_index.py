"""The program index: the per-device program read once, per equation its op, its loop trip
counts and its collectives (the ``index`` pass, compiler.py).

The partitioner emits each op under ``jax.named_scope("op<id>")`` (partitioner/program.py) and the
combiner emits its merged collectives under ``"combined<id>,<id>,..."``; one walk over the
program's equations in order (into loop, branch and call bodies) gives, per equation:

* ``key`` / ``op_ids`` / ``label``: the op that caused it ("op12", "combined:3,7",
  "boundary"; the innermost scope of its name stack wins, else its region's);
* ``loops``: the trip counts of its enclosing loops (``Trips``), outermost first (``scan``:
  ``length``; ``while``: derived when the loop counts a constant range, ``i = c0; while
  i < c1: i += s``, else None; a while's condition runs once more than its body);
* ``trip_count``: for a loop equation, its own count (as ``loops`` says it);
* ``collectives``: the ``Collective`` it issues (records.py's fields), in program order.

* ``deps``: the positions, in its own body, of the equations that produce its operands;
* ``emitted``: for a collective, how the program emits it (``Emitted``: its primitive's
  fine mesh axes, dtype, bytes, operand count, grouping): what the combiner merges on;
* ``eqn``: the equation itself, for the readers that price or re-emit it.

Equations are addressed by their *path*: ``(i,)`` is equation ``i`` of the top-level jaxpr,
``(i, k, j)`` equation ``j`` of the ``k``-th sub-jaxpr of equation ``i`` (in parameter
order), so a jaxpr shared by two calls is two entries. Each jaxpr is a ``Body`` (its
path, its entries in order, the loop trips it adds, the parameter it came from); readers
walk bodies (``root``, ``subs(entry)``), never the jaxpr's equations themselves.

This module is the one reader of the emitted program: the combiner (combine.py: which
collectives, over which axes, how many bytes, caused by which op, depending on which), the
collective records (``plan.collectives``), the cost model and the memory walk (cost/) read
an index, and nothing else parses equation names, scopes or collectives::

    psum[axes=('y',)] f32[8,16] in scope op12 inside scan(length=4)
        -> EqnIndex(key="op12", op_ids=(12,), loops=(Trips(4),), collectives=(Collective("all-reduce", ...),))

The compiler indexes the partitioned program, the combiner rewrites it from that index, and
the combined program is indexed again only if the combiner changed it (combine.py).
"""
from __future__ import annotations

import functools
import math
import re
from typing import Callable, Optional

import attrs
import numpy as np
from jax.extend.core import ClosedJaxpr, Literal

from ..core.dtypes import itemsize
from ..ops import facts as F
from ..ops import facts_of
from .collective import Collective
from ..core.fine_mesh import FineMesh

Path = tuple[int, ...]
_SCOPE = re.compile(r"(?:^|/)(op(\d+)|combined([\d,]+)|boundary)(?:/|$)")


@attrs.frozen
class Trips:
    """One enclosing loop's executions of a body per execution of the loop: ``count`` (None:
    a while loop whose count is not derivable) plus ``extra`` (1 for a while's condition)."""

    count: Optional[int]
    extra: int = 0

    def resolve(self, while_trips: int = 1) -> int:
        return (while_trips if self.count is None else self.count) + self.extra


@attrs.frozen
class Emitted:
    """A collective equation as the program emits it: what the combiner merges on."""

    axes: tuple[str, ...]  # fine mesh axes, as the equation names them
    dtype: str  # of its first operand
    nbytes: int  # all its operands
    operands: int
    grouped: bool  # axis_index_groups given
    tiled: bool


@attrs.frozen
class EqnIndex:
    """One equation of the program, as the index read it (see the module docstring)."""

    path: Path
    prim: str
    key: str  # "op12" | "combined:3,7" | "boundary"
    op_ids: tuple[int, ...]
    label: str
    loops: tuple[Trips, ...] = ()
    trip_count: Optional[int] = None  # a loop equation's own count (None: not derivable, or no loop)
    collectives: tuple[Collective, ...] = ()
    deps: tuple[int, ...] = ()  # positions in its body of the equations producing its operands
    emitted: Optional[Emitted] = None  # a collective's primitive, as emitted
    eqn: object = attrs.field(default=None, eq=False, repr=False)  # the equation itself

    @property
    def position(self) -> int:
        """Its position in its body."""
        return self.path[-1]

    @property
    def in_loop(self) -> bool:
        return bool(self.loops)

    def trips(self, while_trips: int = 1) -> int:
        """Executions per step: the product of the enclosing loops' counts (``while_trips``
        for a while loop whose count is not derivable)."""
        return math.prod(t.resolve(while_trips) for t in self.loops)


@attrs.frozen(eq=False)
class Body:
    """One jaxpr of the program: the top-level one (path ``()``) or sub-jaxpr ``k`` of the
    equation at ``p`` (path ``p + (k,)``), with its equations' entries in order.

    ``loop``: the trips this body adds per execution of its equation (a scan's length; a
    while body's count, its condition's once more), None for branches and calls.
    ``param`` / ``position``: where the equation holds it (its parameter, the place in a
    tuple parameter or None); ``closed``: the ClosedJaxpr held there, if one is."""

    path: Path
    jaxpr: object
    entries: tuple[EqnIndex, ...]
    loop: Optional[Trips] = None
    param: str = ""
    position: Optional[int] = None
    closed: object = None

    @property
    def equations(self) -> tuple:
        return tuple(e.eqn for e in self.entries)


@attrs.frozen(eq=False)
class ProgramIndex:
    """Every equation of one per-device program (``program``, a ClosedJaxpr) by path, in
    program order, and every body (jaxpr) of it by path."""

    program: object
    entries: tuple[EqnIndex, ...]
    bodies: dict = attrs.field(factory=dict, repr=False)  # Path -> Body
    by_path: dict = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "by_path", {e.path: e for e in self.entries})

    @property
    def collectives(self) -> tuple[Collective, ...]:
        return tuple(c for e in self.entries for c in e.collectives)

    @property
    def root(self) -> Body:
        """The program's own jaxpr."""
        return self.bodies[()]

    def at(self, path: Path) -> EqnIndex:
        return self.by_path[path]

    def subs(self, entry: EqnIndex) -> tuple[Body, ...]:
        """The bodies of ``entry`` (loop, branch and call bodies), in parameter order."""
        out, k = [], 0
        while entry.path + (k,) in self.bodies:
            out.append(self.bodies[entry.path + (k,)])
            k += 1
        return tuple(out)

    @classmethod
    def build(cls, program, fine: FineMesh, label: Callable[[int], str]) -> "ProgramIndex":
        """Index ``program`` (a ClosedJaxpr); ``label(i)``: how op ``i`` is named in records."""
        entries: list[EqnIndex] = []
        bodies: dict = {}
        root = _Sub(program.jaxpr, "", None, program)
        _walk(root, (), (), None, ((), "boundary", "boundary"), fine, label, entries, bodies, {})
        return cls(program, tuple(entries), bodies)


@attrs.frozen(eq=False)
class _Sub:
    """A sub-jaxpr of an equation and where the equation holds it."""

    jaxpr: object
    param: str
    position: Optional[int]
    closed: object


def _subs(eqn) -> list[_Sub]:
    out = []
    for name, v in eqn.params.items():
        many = isinstance(v, (tuple, list))
        for pos, j in enumerate(v if many else (v,)):
            inner = getattr(j, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                out.append(_Sub(inner, name, pos if many else None, j if isinstance(j, ClosedJaxpr) else None))
            elif hasattr(j, "eqns"):
                out.append(_Sub(j, name, pos if many else None, None))
    return out


def _walk(sub: _Sub, path: Path, loops: tuple, loop: Optional[Trips], outer: tuple, fine: FineMesh, label,
          out: list, bodies: dict, stacks: dict) -> None:
    """``stacks``: id of a name stack -> its text, for this build (an op's equations share
    one name stack object; the jaxpr keeps them alive while it is walked)."""
    jaxpr = sub.jaxpr
    known: dict = {}  # scalar constants of this jaxpr (literals and arithmetic on them): while trip counts
    producer: dict = {}  # var -> position of the equation producing it
    mine: list[EqnIndex] = []
    for i, eqn in enumerate(jaxpr.eqns):
        ns = eqn.source_info.name_stack
        st = stacks.get(id(ns))
        if st is None:
            st = stacks[id(ns)] = str(ns)
        ids, key, text = _scope_of(st, outer, label)
        facts = facts_of(eqn.primitive.name)
        subs = _subs(eqn)
        colls = (_record(eqn, facts, ids, text, bool(loops), fine),) if facts.collective else ()
        count, inner = _loop_counts(eqn, facts, [s.jaxpr for s in subs], known)
        deps = tuple(sorted({producer[v] for v in eqn.invars if not isinstance(v, Literal) and v in producer}))
        entry = EqnIndex(path + (i,), eqn.primitive.name, key, ids, text, loops, count, colls, deps,
                         _emitted(eqn) if facts.collective else None, eqn)
        out.append(entry)
        mine.append(entry)
        for k, j in enumerate(subs):
            _walk(j, path + (i, k), loops + inner[k], inner[k][0] if inner[k] else None, (ids, key, text), fine,
                  label, out, bodies, stacks)
        if not facts.collective and not subs and not _free(eqn, facts):
            _fold_const(eqn, known)
        for v in eqn.outvars:
            producer[v] = i
    bodies[path] = Body(path, jaxpr, tuple(mine), loop, sub.param, sub.position, sub.closed)


def equations_of(jaxpr) -> list:
    """A jaxpr's equations in order: for the combiner's splice (combine.py), which reads the
    small program it traces for one merged group here (this module is the one reader of
    equations)."""
    return list(jaxpr.eqns)


def _emitted(eqn) -> Emitted:
    a = eqn.params.get("axes", eqn.params.get("axis_name"))
    axes = tuple(a) if isinstance(a, (tuple, list)) else (a,)
    return Emitted(axes, str(eqn.invars[0].aval.dtype), _nbytes(_moved(eqn)), len(eqn.invars),
                   eqn.params.get("axis_index_groups") is not None, bool(eqn.params.get("tiled")))


def _moved(eqn) -> list:
    """The operands a collective sends: all of them, but a ragged all-to-all's data operand only
    (its output buffer and offsets stay)."""
    return eqn.invars[:1] if facts_of(eqn.primitive.name).sends == F.FIRST_OPERAND else eqn.invars


def _nbytes(vs) -> int:
    return sum(math.prod(v.aval.shape) * itemsize(v.aval.dtype) for v in vs)


def _scope_of(stack: str, outer: tuple, label) -> tuple[tuple[int, ...], str, str]:
    """The op ids, key and label an equation's name stack points at (innermost scope wins)."""
    found = _innermost_scope(stack)
    if found is None:
        return outer
    one, many = found
    if one:
        i = int(one)
        return (i,), f"op{i}", label(i)
    if many:
        ids = tuple(int(t) for t in many.split(","))
        return ids, f"combined:{many}", "combined: " + "; ".join(label(i) for i in ids)
    return (), "boundary", "boundary"


@functools.lru_cache(maxsize=1 << 14)
def _innermost_scope(stack: str) -> Optional[tuple[str, str]]:
    """The innermost scope of a name stack: (op id text, combined ids text), both "" for the
    boundary; None when it names none (a pure function of the text, memoised: every op's
    equations share a few stacks, and every candidate the search prices repeats them)."""
    found = None
    for m in _SCOPE.finditer(stack):
        found = m
    return None if found is None else (found.group(2) or "", found.group(3) or "")


def _record(eqn, facts, ids: tuple[int, ...], text: str, in_loop: bool, fine: FineMesh) -> Collective:
    a = eqn.params.get("axes", eqn.params.get("axis_name"))
    axes = tuple(a) if isinstance(a, (tuple, list)) else (a,)
    aval = eqn.invars[0].aval
    moved = _moved(eqn)
    nbytes = _nbytes(moved)
    group = int(np.prod([fine.size_of[a] for a in axes], dtype=np.int64))
    # several operands (a combined all-reduce): the shape of the buffer they make together
    shape = tuple(aval.shape) if len(moved) == 1 else (sum(math.prod(v.aval.shape) for v in moved),)
    return Collective(facts.collective, tuple(str(r) for r in fine.coarse(axes)), nbytes, text,
                      op_id=ids[0] if len(ids) == 1 else -1, dtype=str(aval.dtype), shape=shape,
                      reduce=facts.collective_reduce, tensors=max(1, len(ids)), group_size=group, in_loop=in_loop)


def _loop_counts(eqn, facts, subs: list, known: dict) -> tuple[Optional[int], list[tuple]]:
    """A loop equation's own trip count, and per sub-jaxpr the loop counts it adds."""
    name = eqn.primitive.name
    if facts.region != F.LOOP:
        return None, [()] * len(subs)
    if name == "scan":
        n = int(eqn.params["length"])
        return n, [(Trips(n),)] * len(subs)
    n = while_trip_count(eqn, known)
    cond = eqn.params["cond_jaxpr"].jaxpr
    return n, [(Trips(n, 1 if j is cond else 0),) for j in subs]


def _free(eqn, facts) -> bool:
    if facts.flops == F.FREE or facts.alias == F.ALWAYS:
        return True
    return facts.alias == F.SAME_DTYPE and facts.aliases(eqn.invars[0].aval.dtype, eqn.outvars[0].aval.dtype)


def _fold_const(eqn, known: dict) -> None:
    """Track scalar constants (literals and arithmetic on them) for while trip counts."""
    vals = []
    for v in eqn.invars:
        if isinstance(v, Literal):
            vals.append(v.val)
        elif v in known:
            vals.append(known[v])
        else:
            return
    name = eqn.primitive.name
    try:
        if name in ("convert_element_type", "copy", "copy_p"):
            res = vals[0]
        elif name == "add":
            res = vals[0] + vals[1]
        elif name == "sub":
            res = vals[0] - vals[1]
        elif name == "mul":
            res = vals[0] * vals[1]
        else:
            return
        if np.ndim(res) == 0:
            known[eqn.outvars[0]] = res
    except Exception:  # noqa: BLE001 - best effort only
        return


def while_trip_count(eqn, known: dict) -> Optional[int]:
    """Trips of ``while i < c1: ...; i += s`` with i's start, c1 and s constants, else None."""
    p = eqn.params
    cond, body = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    ops = eqn.invars
    cond_consts, init = ops[:nc], ops[nc + nb:]
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name not in ("lt", "le", "gt", "ge", "ne"):
        return None
    ce = cond.eqns[0]
    if list(cond.outvars) != list(ce.outvars):
        return None

    def value(v):
        if isinstance(v, Literal):
            return v.val
        if v in cond.invars[:nc]:
            src = cond_consts[cond.invars.index(v)]
            return value_outer(src)
        if v in cond.invars[nc:]:
            k = cond.invars.index(v) - nc
            if body.outvars[k] is body.invars[nb + k]:  # loop-invariant carry
                return value_outer(init[k])
        return None

    def value_outer(v):
        if isinstance(v, Literal):
            return v.val
        return known.get(v)

    a, b = ce.invars
    rel = ce.primitive.name
    if rel in ("gt", "ge"):
        a, b = b, a
        rel = "lt" if rel == "gt" else "le"
    if isinstance(a, Literal) or a not in cond.invars[nc:]:
        return None
    k = cond.invars.index(a) - nc
    start, stop = value_outer(init[k]), value(b)
    if start is None or stop is None:
        return None
    out = body.outvars[k]
    step = None
    for be in body.eqns:
        if out in be.outvars and be.primitive.name == "add":
            x, y = be.invars
            if x is body.invars[nb + k] and isinstance(y, Literal):
                step = y.val
            elif y is body.invars[nb + k] and isinstance(x, Literal):
                step = x.val
    if not step or step <= 0:
        return None
    span = float(stop) - float(start) + (1 if rel == "le" else 0)
    return max(0, int(math.ceil(span / float(step))))
