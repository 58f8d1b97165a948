"""Partial values through the per-device program: reduced exactly once before a use that needs them whole.

One forward walk over the symbolic per-device program (the same program on every device, so
the walk costs the same on 8 or 65,536 devices) gives every value, per fine mesh axis, one of:

* whole (invariant over the axis: every device of a group holds the same value; absent);
* ``"V"``: varies over the axis as a whole value does (a tile, a device's own rows);
* a reduce op (``"sum"``, ``"max"``, ``"pick"``...): a *partial* value over the axis, whose
  devices' contributions make the value only once reduced with that op.

Partials enter where the plan's records say an op's result is partial (``Diagnostics.held``:
read when the value leaves the op's scope, ``op<id>``) and where the program joins a whole
value into a partial sum (``where(index == 0, x, 0)``; device_eval.py counts the devices
that keep ``x``: exactly one per group). A partial passes through the ops that are linear in
it (``OpFacts.linearity``, as partial.py carries them) and is reduced by an all-reduce or
reduce-scatter of its op over its axis. Findings (plan_check.py's ``Finding``):

* ``unreduced``: a partial value reaches a use that needs it whole (a non-linear op, an output,
  the end of an op whose records say it is whole), or a collective that moves but does not
  reduce it (an all-gather, an all-to-all, a permute that is not a permutation);
* ``reduced-twice``: a sum all-reduce (or reduce-scatter) over an axis the value is already
  whole over: each device's copy is counted once per device;
* ``wrong-reduce-op``: a partial of one op reduced with another (a max partial summed);
* ``replicated-joins-partial``: a whole value added to a partial sum without being joined
  on one device only (counted once per device of the partial axis);
* ``varies-but-whole``: a value the records hold whole (or an output returned whole) over an
  axis the program leaves it varying over (a tile never gathered, a partial never reduced).

Loops are walked to a fixed point over their carries; branches are joined.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import numpy as np
from jax.extend.core import Literal

from ..ops import facts as F
from ..ops import facts_of
from .device_eval import DeviceGrid, evaluate

V = "V"
WHOLE: tuple = ()
# partial ops each reducing collective reduces ("pick": one holder, its bits summed; and/or of
# booleans are reduced as uint8 max/min)
_REDUCES = {"sum": ("sum", "pick"), "max": ("max", "or", "pick"), "min": ("min", "and")}
_CALL_JAXPR = ("jaxpr", "call_jaxpr", "fun_jaxpr")
# linear in operand 0 beyond OpFacts.linearity: program-level data movement the partitioner and
# the combiner emit on partial buffers
_MOVES = ("dynamic_slice", "rev", "concatenate", "cumsum")
_SCATTER_ADD = ("scatter-add", "scatter_add")


class State:
    """A value's standing per fine mesh axis (``tags``: axis -> "V" or a partial's op; an axis
    absent is whole), whether it is known zero, and whether it is a function of the device
    position alone (``pure``: axis_index, iota, literals, constant tables)."""

    __slots__ = ("tags", "zero", "pure", "origin")

    def __init__(self, tags: Mapping[str, str] = (), zero: bool = False, pure: bool = False, origin: str = ""):
        self.tags = dict(tags)
        self.zero = zero
        self.pure = pure
        self.origin = origin  # a partial's IR value ("%12"), where the records made it partial

    def partial(self) -> dict:
        return {a: t for a, t in self.tags.items() if t != V}

    def key(self) -> tuple:
        return tuple(sorted(self.tags.items())), self.zero


CONST = State(pure=True)


class Walk:
    """One walk of a program (see the module doc). ``exit_state(var, key, state)`` is the
    plan's say on a value leaving op scope ``key``; ``report(kind, path, var, axis, detail)``
    records a finding."""

    def __init__(self, index, fine, exit_state: Callable, report: Callable):
        self.index = index
        self.fine = fine
        self.sizes = fine.size_of
        self.exit_state = exit_state
        self.report = report
        self.muted = 0  # > 0 while a loop body is walked towards its fixed point
        self._alias: dict = {}  # the body being walked: its invars -> its caller's operands

    # -- helpers -----------------------------------------------------------------------
    def _say(self, kind: str, entry, origin: str, axis: str, detail: str) -> None:
        """Report a finding at ``entry``; ``origin``: the IR value it concerns ("" when unknown)."""
        if not self.muted:
            self.report(kind, entry, origin, axis, detail)

    def _big(self, axes) -> list[str]:
        return [a for a in axes if self.sizes.get(a, 1) > 1]

    # -- the walk ----------------------------------------------------------------------
    def body(self, body, ins: Sequence[State], consts: Mapping = (), leave: bool = False,
             caller: Optional[tuple] = None) -> list[State]:
        """Walk ``body`` (a program index Body) with its invars' states; its outvars' states
        (``leave``: the program's own outputs, each leaving the scope of the op making it;
        ``caller``: a call body's caller (producers, constants, aliases, its operands), so a
        device position computed outside is still known inside)."""
        jaxpr = body.jaxpr
        env: dict = {}
        where: dict = {}  # var -> the scope key of the equation producing it
        producers: dict = {}
        constvals = dict(consts)
        alias: dict = {}
        if caller is not None:
            producers.update(caller[0])
            constvals.update(caller[1])
            alias.update(caller[2])
            alias.update(zip(jaxpr.invars, caller[3]))
        self._alias = alias
        for v in getattr(jaxpr, "constvars", ()):
            env[v] = CONST
        for v, s in zip(jaxpr.invars, ins):
            env[v] = s
        exits: dict = {}

        def read(v, entry):
            if isinstance(v, Literal):
                return State(zero=_is_zero(v.val), pure=True)
            s = env.get(v, CONST)
            k = where.get(v)
            if k is not None and k != entry.key and k.startswith("op") and not _owns(entry.key, k):
                hit = exits.get(v)
                if hit is None:
                    hit = exits[v] = self.exit_state(v, k, s, entry, self._say)
                return hit
            return s

        for entry in body.entries:
            eqn = entry.eqn
            args = [read(v, entry) for v in eqn.invars]
            self._alias = alias
            outs = self.equation(entry, eqn, args, producers, constvals)
            for v, s in zip(eqn.outvars, outs):
                env[v] = s
                where[v] = entry.key
                producers[v] = eqn
        outs = []
        for v in jaxpr.outvars:
            if isinstance(v, Literal):
                outs.append(State(zero=_is_zero(v.val), pure=True))
                continue
            s, k = env.get(v, CONST), where.get(v)
            if leave and k is not None and k.startswith("op"):
                s = exits.get(v) or self.exit_state(v, k, s, None, self._say)
            outs.append(s)
        return outs

    def equation(self, entry, eqn, args: list[State], producers: dict, consts: dict) -> list[State]:
        name = eqn.primitive.name
        facts = facts_of(name)
        if facts.collective:
            return self._collective(entry, eqn, args, facts)
        subs = self.index.subs(entry) if facts.region else ()  # a scatter's combiner is no region
        if subs:
            return self._region(entry, eqn, args, subs, facts, producers, consts)
        if name == "axis_index":
            a = eqn.params["axis_name"]
            axes = tuple(a) if isinstance(a, (tuple, list)) else (a,)
            return [State({x: V for x in self._big(axes)}, pure=True)]
        if name == "iota":
            return [State(pure=True)]
        partial_args = [i for i, s in enumerate(args) if s.partial()]
        if name == "select_n" and not partial_args:
            joined = self._join_pattern(entry, eqn, args, producers, consts)
            if joined is not None:
                return [joined] * len(eqn.outvars)
        if not partial_args:
            tags = {a: V for s in args for a, t in s.tags.items()}
            zero = _makes_zero(name, eqn, args)
            pure = all(s.pure for s in args)
            return [State(tags, zero, pure) for _ in eqn.outvars]
        return self._carry(entry, eqn, args, partial_args, facts)

    # -- partial values through ordinary ops ---------------------------------------------
    def _carry(self, entry, eqn, args: list[State], idx: list[int], facts) -> list[State]:
        name = eqn.primitive.name
        lin = facts.linearity
        p = args[idx[0]].partial()
        out = {a: V for s in args for a, t in s.tags.items() if t == V}
        ok = all(args[i].partial() == p for i in idx)
        var = args[idx[0]].origin
        if not ok:
            self._say("unreduced", entry, var, sorted(p)[0], f"{name} mixes partial values over different axes or ops")
            return [State(out | {a: V for a in p}) for _ in eqn.outvars]
        others = [i for i in range(len(args)) if i not in idx]
        monotone = set(p.values()) <= {"max", "min"} and facts.flops == F.ELEMENTWISE_FLOPS
        # a pick (one holder, zeros elsewhere) keeps its bits through a bitcast: summed as integers
        monotone = monotone or (name == "bitcast_convert_type" and set(p.values()) == {"pick"})
        if lin in (F.MOVE, F.CONVERT, F.NEGATE) or name in _MOVES or monotone:
            if idx != [0] and name != "concatenate" and not monotone:
                return self._needs_whole(entry, eqn, var, p, out, f"{name} reads it as an index or shape")
            if name == "bitcast_convert_type" and "sum" in p.values():
                return self._needs_whole(entry, eqn, var, p, out, "bitcast_convert_type of a partial sum")
            return self._keep(entry, eqn, var, p, out, [args[i] for i in others],
                              zero_ok=name == "concatenate")
        if lin == F.ZERO_PAD and idx == [0] and args[1].zero:
            return [State(out | p, origin=var) for _ in eqn.outvars]
        if lin in (F.SUM, F.JOIN):
            return self._keep(entry, eqn, var, p, out, [args[i] for i in others], zero_ok=True, joining=True)
        if lin == F.SCALE and len(idx) == 1:
            return self._keep(entry, eqn, var, p, out, [args[i] for i in others])
        if lin == F.DIVIDE and idx == [0]:
            return self._keep(entry, eqn, var, p, out, [args[i] for i in others])
        if lin == F.SELECT and 0 not in idx:
            return self._keep(entry, eqn, var, p, out, [args[i] for i in others[1:]], zero_ok=True, joining=True,
                              pred=args[0])
        if name in _SCATTER_ADD:  # linear in the operand and the updates together (the handler joins them)
            return [State(out | p, origin=var) for _ in eqn.outvars]
        if name in ("reduce_max", "reduce_min", "cummax", "cummin") and set(p.values()) <= {"max", "min"}:
            return [State(out | p, origin=var) for _ in eqn.outvars]
        return self._needs_whole(entry, eqn, var, p, out, f"{name} needs it whole")

    def _keep(self, entry, eqn, var, p: dict, out: dict, others: list[State], *, zero_ok: bool = False,
              joining: bool = False, pred: Optional[State] = None) -> list[State]:
        """The result carries ``p`` when the other operands are whole over its axes (zero, when
        they join the sum: a whole nonzero term would be counted on every device)."""
        for s in others + ([pred] if pred is not None else []):
            for a in p:
                t = s.tags.get(a)
                if t is not None and t != V and t != p[a]:
                    self._say("unreduced", entry, var, a, f"{eqn.primitive.name} meets a partial {t} over {a} "
                              f"while this one is a partial {p[a]} over it")
                    return [State(out | {x: V for x in p}) for _ in eqn.outvars]
        # a value that varies over a partial axis (a masked local gather's rows beside its fill
        # on one device): what the result is, the records say where the op ends
        mixed = {a for a in p for s in others + ([pred] if pred is not None else []) if s.tags.get(a) == V}
        if mixed:
            p = {a: t for a, t in p.items() if a not in mixed}
            out = out | {a: V for a in mixed}
        if joining:
            for s in others:
                if not s.zero and any(a not in s.tags for a in p) and "sum" in p.values():
                    a = next(a for a in sorted(p) if a not in s.tags)
                    self._say("replicated-joins-partial", entry, var, a,
                              f"{eqn.primitive.name} adds a value whole over {a} to a partial sum over it: "
                              f"it is counted once per device ({self.sizes[a]})")
                    break
        return [State(out | p, origin=var) for _ in eqn.outvars]

    def _needs_whole(self, entry, eqn, var, p: dict, out: dict, why: str) -> list[State]:
        a = sorted(p)[0]
        self._say("unreduced", entry, var, a, f"a partial {p[a]} over {tuple(sorted(p))} reaches {why}, "
                  "never reduced")
        return [State({x: t for x, t in out.items() if x not in p}) for _ in eqn.outvars]  # said once

    def _join_pattern(self, entry, eqn, args: list[State], producers, consts) -> Optional[State]:
        """``select_n(pred(device), 0, x)`` with x whole over the pred's axes: a join of x into a
        partial sum when exactly one device of each group keeps x (else None: just a value
        that varies)."""
        pred, cases = args[0], args[1:]
        axes = [a for a, t in pred.tags.items() if t == V]
        if not pred.pure or not axes or len(cases) != 2:
            return None
        zero = [k for k, c in enumerate(cases) if c.zero]
        if len(zero) != 1:
            return None
        x = cases[1 - zero[0]]
        if any(a in x.tags for a in axes):
            return None
        order = [a for a in self.fine.names if a in axes]
        grid = DeviceGrid(order, self.sizes)
        if int(np.prod(grid.sizes, dtype=np.int64)) > 1 << 20:
            return None
        val = evaluate(eqn.invars[0], producers, consts, grid, alias=self._alias)
        if val is None:
            return None
        keep = (val.astype(np.int64) == (1 - zero[0]))
        keep = keep.reshape(keep.shape[:len(order)] + (-1,)).all(axis=-1) if keep.ndim > len(order) else keep
        if int(keep.sum()) != 1:
            return None
        return State({**{a: t for a, t in x.tags.items()}, **{a: "sum" for a in axes}})

    # -- collectives -----------------------------------------------------------------
    def _collective(self, entry, eqn, args: list[State], facts) -> list[State]:
        kind = facts.collective
        a = eqn.params.get("axes", eqn.params.get("axis_name"))
        axes = self._big(tuple(a) if isinstance(a, (tuple, list)) else (a,))
        outs = []
        for k, s in enumerate(args[:len(eqn.outvars)] if kind != "all-to-all" else args[:1]):
            var = s.origin
            tags = dict(s.tags)
            if kind in ("all-reduce", "reduce-scatter"):
                op = facts.collective_reduce
                for x in axes:
                    t = tags.get(x)
                    if t is None:
                        if op == "sum" and not s.zero:
                            self._say("reduced-twice", entry, var, x, f"a {kind} (sum) over {x} of a value already "
                                      f"whole over it: counted {self.sizes[x]} times")
                    elif t != V and t not in _REDUCES[op]:
                        self._say("wrong-reduce-op", entry, var, x, f"a partial {t} over {x} reduced with {op}")
                    tags.pop(x, None)
                    if kind == "reduce-scatter":
                        tags[x] = V
            elif kind == "all-gather":
                for x in axes:
                    t = tags.pop(x, None)
                    if t is not None and t in ("sum", "max", "min", "pick"):
                        self._say("unreduced", entry, var, x, f"an all-gather over {x} of a partial {t}: the "
                                  "partial contributions are concatenated, never reduced")
            elif kind == "all-to-all":
                for x in axes:
                    t = tags.get(x)
                    if t is not None and t != V:
                        self._say("unreduced", entry, var, x, f"an all-to-all over {x} of a partial {t}")
                    tags[x] = V
            else:  # collective-permute
                full = _is_full_permutation(eqn.params["perm"], int(np.prod([self.sizes[x] for x in axes] or [1])))
                for x in axes:
                    t = tags.get(x)
                    if t is not None and t != V and not full:
                        self._say("unreduced", entry, var, x, f"a collective-permute over {x} that is not a "
                                  f"permutation moves a partial {t}: some contributions are lost")
                    if t is None and not full:
                        tags[x] = V
                    elif t != V and t is not None and not full:
                        tags[x] = V
            outs.append(State(tags, s.zero, origin=s.origin if any(t != V for t in tags.values()) else ""))
        while len(outs) < len(eqn.outvars):
            outs.append(State({x: V for x in axes}))
        return outs

    # -- regions -----------------------------------------------------------------------
    def _region(self, entry, eqn, args: list[State], subs, facts, producers: dict, consts: dict) -> list[State]:
        name = eqn.primitive.name
        n_out = len(eqn.outvars)
        if name == "scan":
            nc, ncarry = eqn.params["num_consts"], eqn.params["num_carry"]
            body = subs[0]
            consts, carry, xs = args[:nc], args[nc:nc + ncarry], args[nc + ncarry:]
            outs = self._fixpoint(entry, lambda c: self.body(body, consts + c + xs, _closed_consts(body)),
                                  carry, ncarry)
            return outs[:n_out]
        if name == "while":
            cn, bn = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
            cond = next(b for b in subs if b.param == "cond_jaxpr")
            body = next(b for b in subs if b.param == "body_jaxpr")
            cconsts, bconsts, carry = args[:cn], args[cn:cn + bn], args[cn + bn:]

            def step(c):
                self.body(cond, cconsts + c, _closed_consts(cond))
                return self.body(body, bconsts + c, _closed_consts(body))

            return self._fixpoint(entry, step, carry, len(carry))[:n_out]
        if name in ("cond", "switch"):
            outs = None
            for b in subs:
                got = self.body(b, args[1:], _closed_consts(b))
                outs = got if outs is None else [_join(x, y, self, entry) for x, y in zip(outs, got)]
            pred = args[0]
            return [State({**o.tags, **{a: V for a in pred.tags if a not in o.tags}}, o.zero) for o in outs]
        for b in subs:
            if len(b.jaxpr.invars) == len(args) and len(b.jaxpr.outvars) == n_out and (
                    b.param in _CALL_JAXPR or len(subs) == 1):
                caller = (producers, consts, self._alias, list(eqn.invars))
                return self.body(b, args, _closed_consts(b), caller=caller)
        partial_args = [i for i, s in enumerate(args) if s.partial()]
        if partial_args:
            return self._needs_whole(entry, eqn, args[partial_args[0]].origin, args[partial_args[0]].partial(),
                                     {}, f"{name}, a region this check does not read")[:n_out]
        tags = {a: V for s in args for a in s.tags}
        return [State(tags) for _ in range(n_out)]

    def _fixpoint(self, entry, step, carry: list[State], n: int) -> list[State]:
        cur = list(carry)
        self.muted += 1
        try:
            for _ in range(4):
                outs = step(cur)
                new = [_join(c, o, None, entry) for c, o in zip(cur, outs[:n])]
                if [s.key() for s in new] == [s.key() for s in cur]:
                    break
                cur = new
        finally:
            self.muted -= 1
        outs = step(cur)  # once more, reporting
        for c, o in zip(cur, outs[:n]):
            _join(c, o, self, entry)
        return [*cur, *outs[n:]] if len(outs) > n else cur


def _join(x: State, y: State, walk: Optional[Walk], entry) -> State:
    tags = {}
    for a in set(x.tags) | set(y.tags):
        s, t = x.tags.get(a), y.tags.get(a)
        if s == t:
            tags[a] = s
        elif s is None and x.zero and t != V:
            tags[a] = t
        elif t is None and y.zero and s != V:
            tags[a] = s
        else:
            if walk is not None and V not in (s, t) and (s, t) != (None, None):
                walk._say("unreduced", entry, x.origin or y.origin, a, f"a loop carry or branch result is partial ({s or t}) over "
                          f"{a} on one path and {'whole' if None in (s, t) else (s, t)} on another")
            tags[a] = V
    return State(tags, x.zero and y.zero)


def _owns(consumer: str, producer: str) -> bool:
    """A combined collective of op ``producer``'s own reduction (the combiner moved it out of
    the op's scope): the value has not left the op yet."""
    return consumer.startswith("combined:") and producer[2:] in consumer[len("combined:"):].split(",")


def _closed_consts(body) -> dict:
    c = body.closed
    if c is None:
        return {}
    return dict(zip(c.jaxpr.constvars, c.consts))


def _is_full_permutation(perm, n: int) -> bool:
    src = [int(s) for s, _ in perm]
    dst = [int(d) for _, d in perm]
    return sorted(src) == list(range(n)) and sorted(dst) == list(range(n))


def _is_zero(val) -> bool:
    try:
        a = np.asarray(val)
        return a.dtype.kind in "biufc" and bool(np.all(a == 0))
    except Exception:  # noqa: BLE001 - a typed key or an opaque literal: not a known zero
        return False


def _makes_zero(name: str, eqn, args: list[State]) -> bool:
    if name in ("broadcast_in_dim", "reshape", "convert_element_type", "transpose", "squeeze", "expand_dims",
                "copy", "copy_p", "slice", "neg"):
        return bool(args) and args[0].zero
    if name in ("pad", "concatenate", "add", "sub", "max", "min", "select_n", "add_any"):
        vals = args[1:] if name == "select_n" else args
        return bool(vals) and all(s.zero for s in vals)
    if name == "mul":
        return any(s.zero for s in args)
    return False
