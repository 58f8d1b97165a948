"""A search state's decisions: which dims of which values its actions shard, and whether
the state is legal (every action can apply on top of the others and of what the context
decided before the search).

A state is a tuple of actions (class, dim, axis name), in canonical order (``canon``). The
answers are memoised: the search asks for the same states again and again (legality of each
neighbour, the seeds of each candidate). The point classes share no value (points.py), so
a class's answer is a function of its own actions: it is memoised per class, and a state's
is the union of its classes' (a neighbour differs from its state by one class).
"""
from __future__ import annotations

import collections
from typing import Optional, Sequence

from .context import TacticContext
from .points import PointClass

_UNSEEN = object()  # a memo miss (None is a memoised answer)


class Decider:
    def __init__(self, ctx: TacticContext, classes: Sequence[PointClass], axes: Sequence[str], uneven: bool):
        self.ctx, self.classes, self.uneven = ctx, classes, uneven
        self.refs = {a: ctx.mesh.ref(a) for a in axes}
        self._order = {a: i for i, a in enumerate(ctx.mesh.axis_names)}
        self._decided: dict = {}  # state -> decisions (memo)
        self._cvals: dict = {}  # class index -> _class_values (memo)
        self._first_add: dict = {}  # (value id, dim, axis) -> can_add on a value with nothing on it (memo)
        self._by_class: dict = {}  # one class's actions -> _class_decisions (memo, when classes share no value)
        counted = collections.Counter(vid for pc in classes for vid in pc.values)
        self._disjoint = all(n == 1 for n in counted.values())

    def canon(self, state) -> tuple:
        order = self._order
        return tuple(sorted(set(state), key=lambda x: (x[0], x[1], order[x[2]])))

    def decisions(self, state) -> Optional[dict]:
        """value id -> dims for the state's actions, or None when one is illegal (memoised by
        the canonical state: legality and seeds ask for the same states many times; callers
        never write into the answer)."""
        state = tuple(state)
        if state in self._decided:
            return self._decided[state]
        got = self._decided[state] = self._decisions(state)
        return got

    def _decisions(self, state) -> Optional[dict]:
        """The state's actions grouped by class, in order; classes share no value (points.py),
        so each class's answer is memoised on its own actions and the state's is their union
        (in the order the one loop over the state would make it)."""
        if not self._disjoint:
            return self._class_decisions(state)
        groups: dict = {}
        for act in state:
            groups.setdefault(act[0], []).append(act)
        out: dict = {}
        memo = self._by_class
        for acts in groups.values():
            acts = tuple(acts)
            got = memo.get(acts, _UNSEEN)
            if got is _UNSEEN:
                got = memo[acts] = self._class_decisions(acts)
            if got is None:
                return None
            out.update(got)
        return out

    def _class_decisions(self, state) -> Optional[dict]:
        out: dict = {}
        ctx = self.ctx
        first = self._first_add
        for c, d, a in state:
            ref = self.refs[a]
            for vid, v, base in self._class_values(c):
                mine = out.get(vid)
                if mine is None:
                    mine = out[vid] = [[] for _ in v.shape]
                    if base is None:  # (nothing on the value yet: the answer is a function of (value, dim, axis))
                        ok = first.get((vid, d, a))
                        if ok is None:
                            ok = first[vid, d, a] = ctx.can_add(v, d, ref, mine, uneven=self.uneven)
                        if not ok:
                            return None
                        mine[d].append(ref)
                        continue
                cur = mine if base is None else [x + y for x, y in zip(base, mine)]
                if not ctx.can_add(v, d, ref, cur, uneven=self.uneven):
                    return None
                mine[d].append(ref)
        return out

    def _class_values(self, c: int) -> list:
        """(value id, value, its dims decided before the search, None when none is) per value of class ``c``
        (the context's decisions do not change during a search)."""
        got = self._cvals.get(c)
        if got is None:
            ctx = self.ctx
            got = []
            for vid in self.classes[c].values:
                v = ctx.value(vid)
                base = ctx.dims(v)
                got.append((vid, v, base if any(base) else None))  # None: nothing decided before
            self._cvals[c] = got
        return got

    def legal(self, state, action) -> bool:
        return action not in state and self.decisions(self.canon(state + (action,))) is not None
