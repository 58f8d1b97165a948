"""The one reshard planner: ``plan_reshard(shape, src, dst, axes, ...) -> steps``, pure and cached
(DTensor's redistribute planner, XLA's reshard cache).

The partitioner emits from these steps (partitioner/reshard.py), the search's cost tables
price them (search/tables.py): the two can no longer disagree. A step is a value (kind,
dims, axes, the local elements it sends, pads and cuts); nothing here traces or runs.

Paths, in the order tried (XLA's partitioner and Shardy's reshard_to_collectives):

    partial -> tiled on a partial axis        reduce-scatter
    partial -> otherwise                      all-reduce (``whole``: of the value as it is)
    [{x},{y}] -> [{y},{x}]                     collective-permute (same shard counts, same axes)
    [{x},{}]  -> [{},{x}]                      all-to-all (an axis moves from one dim to another)
    [{x,y},{}] -> [{x},{}]                     all-gather within sub-groups (over y)
    [{},{}]   -> [{x},{y}]                     slice: local dynamic slice, no communication

Uneven dims keep the canonical layout (shards of ceil(n/k)); where a collective would leave a
non-canonical one, the dim is gathered whole and re-sliced (a step with ``note``).

``local``: the per-device shape of the source buffer (default: the canonical one; the
partitioner passes its buffer's, so that the plan follows what the program holds).

    >>> axes = (("x", 2), ("y", 4))
    >>> print(steps_text(plan_reshard((8, 16), (("x",), ()), ((), ("x",)), axes)))
    all-to-all(x) dim 0 -> dim 1 [4x16]
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import attrs
import numpy as np

from ..ops.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVE_PERMUTE, REDUCE_SCATTER

Dims = tuple[tuple[str, ...], ...]
REDUCTIONS = (REDUCE_SCATTER, ALL_REDUCE)


@attrs.frozen
class Step:
    """One step of a reshard.

    ``kind``: reduce-scatter, all-reduce, collective-permute, all-to-all, all-gather or slice
    ``dim``: the dim it acts on (all-to-all: the dim split, the one gaining ``axes``);
    ``src_dim``: all-to-all's concatenated dim (the one losing them). ``axes``: the mesh axes
    (slice: the axes indexing the slice). ``local``: the per-device shape entering the step
    (after ``pad``): ``elems`` of it are what a collective sends per device. ``pad``: pad
    ``dim`` with zeros to this length first (-1: no); ``trim``: pad or cut the dim that grew
    (all-to-all: ``src_dim``) to this length after (-1: no). ``size``: a slice's length. ``final``: a reduction that leaves
    no partial axes (its result takes the value's dtype). ``whole``: an all-reduce of every
    partial axis of the value as it is (one for all its consumers), or an all-gather of a whole
    uneven dim. ``perm``: a permute's (source, destination) pairs, linear over ``axes``.
    """

    kind: str
    dim: int = -1
    axes: tuple[str, ...] = ()
    local: tuple[int, ...] = ()
    src_dim: int = -1
    pad: int = -1
    trim: int = -1
    size: int = -1
    final: bool = False
    whole: bool = False
    perm: tuple[tuple[int, int], ...] = ()
    note: str = ""

    @property
    def elems(self) -> int:
        return int(math.prod(self.local))

    @property
    def communicates(self) -> bool:
        return self.kind != "slice"

    def bytes(self, itemsize: int) -> int:
        """Bytes each device sends into the collective (``Collective.bytes_per_device``)."""
        return self.elems * itemsize if self.communicates else 0

    def __str__(self) -> str:
        words = [f"{self.kind}({','.join(self.axes)})"]
        if self.kind == ALL_TO_ALL:
            words.append(f"dim {self.src_dim} -> dim {self.dim}")
        elif self.dim >= 0:
            words.append(f"dim {self.dim}")
        words += [w for w, on in (("whole", self.whole), (f"pad {self.pad}", self.pad >= 0),
                                  (f"trim {self.trim}", self.trim >= 0), (f"size {self.size}", self.size >= 0)) if on]
        return " ".join(words) + f" [{'x'.join(map(str, self.local))}]"


def steps_text(steps: Sequence[Step]) -> str:
    """One line per step: ``all-to-all(x) dim 0 -> dim 1 [4x16]`` (the local shape entering it)."""
    return "\n".join(str(s) for s in steps)


def collective_steps(steps: Sequence[Step]) -> tuple[Step, ...]:
    return tuple(s for s in steps if s.communicates)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=16384)
def plan_reshard(shape: tuple[int, ...], src: Dims, dst: Dims, axes: tuple[tuple[str, int], ...],
                 partial: tuple[str, ...] = (), keep_partial: bool = False,
                 local: Optional[tuple[int, ...]] = None) -> tuple[Step, ...]:
    """The steps that move a value of global ``shape`` laid out as ``src`` (mesh axes per dim),
    partial over ``partial``, to ``dst``. ``axes``: (name, size) of every mesh axis, in mesh
    order. ``keep_partial``: leave partial axes that ``dst`` does not tile unreduced.
    A pure function of its arguments (cached: the same reshard is planned once)."""
    sizes = dict(axes)
    if local is None:
        local = tuple(_ceil(n, math.prod(sizes[a] for a in d)) if d else n for n, d in zip(shape, src))
    p = _Planner(tuple(shape), sizes, tuple(a for a, _ in axes), list(local))
    p.run([tuple(d) for d in src], tuple(tuple(t) for t in dst), list(partial), keep_partial)
    return tuple(p.steps)


class _Planner:
    def __init__(self, shape: tuple[int, ...], sizes: dict[str, int], order: tuple[str, ...], local: list[int]):
        self.n, self.sizes, self.order, self.loc = shape, sizes, order, local
        self.steps: list[Step] = []

    def k(self, axes: Sequence[str]) -> int:
        return int(math.prod(self.sizes[a] for a in axes))

    def emit(self, kind: str, *, dim: int = -1, pad: int = -1, trim: int = -1, after: int = -1, **kw) -> None:
        """Add a step entering with the current local shape (``dim`` padded to ``pad`` first);
        ``after``: the length the step leaves of the dim it trims, cut or padded to ``trim``.
        Pads and cuts that change nothing are left out."""
        if pad >= 0:
            pad, self.loc[dim] = (-1 if self.loc[dim] == pad else pad), pad
        self.steps.append(Step(kind, dim=dim, local=tuple(self.loc), pad=pad,
                               trim=-1 if trim < 0 or after == trim else trim, **kw))

    def fit_split(self, d: int, have: Sequence[str], new: Sequence[str]) -> tuple[bool, int]:
        """Can dim d (sharded over ``have``) be split further over ``new`` canonically? (ok, the
        length to pad it to first: -1 for none)."""
        c_new = _ceil(self.n[d], self.k(have) * self.k(new))
        if not have:
            return True, c_new * self.k(new)
        return self.loc[d] == c_new * self.k(new), -1

    def concat_canonical(self, d: int, have: Sequence[str], keep: Sequence[str]) -> bool:
        if not keep:
            return True
        n = self.n[d]
        return _ceil(n, self.k(have)) * (self.k(have) // self.k(keep)) == _ceil(n, self.k(keep))

    # -- the plan ---------------------------------------------------------------------------
    def run(self, dims: list, target: Dims, partial: list, keep_partial: bool) -> None:
        src, given = tuple(dims), list(partial)
        target_axes = {a for t in target for a in t}
        # 1. partial results: reduce-scatter onto a dim that wants the axes next, else all-reduce
        if partial and (not keep_partial or target_axes & set(partial)):
            for d in range(len(self.n)):
                if not partial:
                    break
                t = target[d]
                if t[: len(dims[d])] != dims[d]:
                    continue
                run = []
                for a in t[len(dims[d]):]:
                    if a not in partial:
                        break
                    run.append(a)
                if not run:
                    continue
                ok, pad = self.fit_split(d, dims[d], run)
                if not ok:
                    continue
                rest = [a for a in partial if a not in run]
                self.emit(REDUCE_SCATTER, dim=d, axes=tuple(run), pad=pad, final=not rest)
                self.loc[d] //= self.k(run)
                dims[d] = dims[d] + tuple(run)
                partial = rest
            if partial and not keep_partial:
                whole = partial == given and tuple(dims) == src  # one all-reduce serves every consumer
                self.emit(ALL_REDUCE, axes=tuple(partial), final=True, whole=whole)
                partial = []
            elif partial and target_axes & set(partial):
                clash = [a for a in partial if a in target_axes]
                partial = [a for a in partial if a not in clash]
                self.emit(ALL_REDUCE, axes=tuple(clash), final=not partial)
        if tuple(dims) == target:
            return
        # 2. permute: same shard count per dim over the same set of axes
        if self.permute(dims, target):
            return
        # 3. all-to-all moves, 4. gathers, 5. slices
        self.all_to_all_moves(dims, target)
        # a dim that must lose axes anyway but is wanted by another dim's axes: gather it first
        # (on the smaller, still-sharded buffer), then the move is an all-to-all, e.g.
        # [{x},{y}] -> [{y},{}]: all-gather(x), all-to-all(y) rather than two all-gathers + slice
        blocked = False
        for j in range(len(self.n)):
            keep_j = _common(dims[j], target[j])
            if keep_j == dims[j]:
                continue
            add_j = target[j][len(keep_j):]
            if any(_longest_suffix_prefix(dims[i][len(_common(dims[i], target[i])):], add_j)
                   for i in range(len(self.n)) if i != j):
                dims[j] = self.gather(j, dims[j], keep_j)
                blocked = True
        if blocked:
            self.all_to_all_moves(dims, target)
        for i in range(len(self.n)):
            keep_i = _common(dims[i], target[i])
            if dims[i][len(keep_i):]:
                dims[i] = self.gather(i, dims[i], keep_i)
        for i in range(len(self.n)):
            add = target[i][len(dims[i]):]
            if add:
                self.slice(i, dims[i], add)
                dims[i] = target[i]

    def all_to_all_moves(self, dims: list, target: Dims) -> None:
        """Move axes from the minor end of a dim that must lose them to the minor end of a dim
        that wants them (one all-to-all each), while such a move exists; updates ``dims``."""
        while True:
            moved = False
            for i in range(len(self.n)):
                remove = dims[i][len(_common(dims[i], target[i])):]
                if not remove:
                    continue
                for j in range(len(self.n)):
                    if j == i or _common(dims[j], target[j]) != dims[j]:
                        continue
                    s = _longest_suffix_prefix(remove, target[j][len(dims[j]):])
                    if not s:
                        continue
                    new_i = dims[i][: len(dims[i]) - len(s)]
                    ok_j, pad = self.fit_split(j, dims[j], s)
                    if not ok_j or not self.concat_canonical(i, dims[i], new_i):
                        continue
                    trim = -1 if new_i else self.n[i]  # gathered whole: the padding cut
                    self.emit(ALL_TO_ALL, dim=j, src_dim=i, axes=s, pad=pad, trim=trim,
                              after=self.loc[i] * self.k(s))
                    self.loc[j] //= self.k(s)
                    self.loc[i] = trim if trim >= 0 else self.loc[i] * self.k(s)
                    dims[i], dims[j] = new_i, dims[j] + tuple(s)
                    moved = True
                    break
                if moved:
                    break
            if not moved:
                return

    def gather(self, d: int, have: tuple, keep: tuple) -> tuple:
        n = self.n[d]
        if self.concat_canonical(d, have, keep):
            trim = -1 if keep else n
            self.emit(ALL_GATHER, dim=d, axes=tuple(have[len(keep):]), trim=trim,
                      after=self.loc[d] * self.k(have[len(keep):]))
            self.loc[d] = trim if trim >= 0 else self.loc[d] * self.k(have[len(keep):])
            return tuple(keep)
        # non-canonical: gather the whole dim, then re-slice to `keep`
        self.emit(ALL_GATHER, dim=d, axes=tuple(have), trim=n, after=self.loc[d] * self.k(have), whole=True,
                  note=f"uneven dim of size {n} regathered whole to re-tile over {tuple(keep)}")
        self.loc[d] = n
        self.slice(d, (), keep)
        return tuple(keep)

    def slice(self, d: int, have: tuple, add: tuple) -> None:
        n = self.n[d]
        ok, pad = self.fit_split(d, have, add)
        if not ok:  # re-tile from the whole dim
            self.gather(d, have, ())
            have_all = tuple(have) + tuple(add)
            c = _ceil(n, self.k(have_all))
            self.emit("slice", dim=d, axes=have_all, pad=c * self.k(have_all), size=c)
        else:
            c = _ceil(n, self.k(tuple(have) + tuple(add)))
            self.emit("slice", dim=d, axes=tuple(add), pad=pad, size=c)
        self.loc[d] = c

    def permute(self, dims: list, target: Dims) -> bool:
        src_axes = [a for d in dims for a in d]
        dst_axes = [a for d in target for a in d]
        if set(src_axes) != set(dst_axes) or len(src_axes) != len(dst_axes):
            return False
        if any(self.k(a) != self.k(b) for a, b in zip(dims, target)):
            return False
        involved = tuple(a for a in self.order if a in set(src_axes))
        sizes = [self.sizes[a] for a in involved]
        coords = np.indices(sizes).reshape(len(sizes), -1).T  # linear order over `involved`
        pos = {a: i for i, a in enumerate(involved)}

        def shard_ids(dims) -> list:
            idx = np.zeros((len(coords), len(dims)), np.int64)
            for d, axes in enumerate(dims):
                for a in axes:
                    idx[:, d] = idx[:, d] * self.sizes[a] + coords[:, pos[a]]
            return [tuple(r) for r in idx]

        have, need = shard_ids(dims), shard_ids(target)
        holder = {h: s for s, h in enumerate(have)}
        self.emit(COLLECTIVE_PERMUTE, axes=involved, perm=tuple((holder[need[d]], d) for d in range(len(coords))))
        return True


def _common(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def _longest_suffix_prefix(remove: Sequence[str], add: Sequence[str]) -> tuple[str, ...]:
    for n in range(len(remove), 0, -1):
        if tuple(remove[-n:]) == tuple(add[:n]):
            return tuple(remove[-n:])
    return ()
