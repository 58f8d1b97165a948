"""``check_plan(plan)``: a static check of a plan's per-device program against its records
(``gpt.check_plan``; the verifier runs it with ``GSPMD_PY_VERIFY=plan``). Nothing runs, so
abstract meshes of any size check in the time one walk of the symbolic program takes.

It proves, or lists as a ``Finding`` (an attrs value naming the kind, the op, the value and
the mesh axis):

* every partial value is reduced exactly once before a use that needs it whole
  (partial_flow.py: ``unreduced``, ``reduced-twice``, ``wrong-reduce-op``,
  ``replicated-joins-partial``, ``varies-but-whole``);
* every collective-permute's pairs are a (partial) permutation of the devices of its axes,
  named in mesh order (``not-a-permutation``, ``permute-order``): two sends from one device
  or two into one are a bug, a halo exchange's missing edge pairs are not;
* padding is neutral for every reduction, contraction and cumulative op that reads it
  (pad_flow.py: ``non-neutral-pad``).

``[]`` when the plan is clean.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

import attrs

from .pad_flow import PadWalk

MANUAL = ("shard_map", "xla_pmap")  # jax.shard_map regions: the user's own collectives
from .partial_flow import V, State, Walk


@attrs.frozen
class Finding:
    """One defect of a plan: ``kind`` (module doc), ``op`` (the op that caused it, as the
    plan's records label it), ``value`` (the IR value ``%id`` when known, else the program
    equation's primitive and path), ``axis`` (the fine mesh axis), ``detail``."""

    kind: str
    op: str
    value: str
    axis: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.value} over {self.axis!r} at {self.op}: {self.detail}"


def check_plan(plan) -> list[Finding]:
    """Every finding of the static check on ``plan`` (a gp.Plan), in program order; [] when clean."""
    return _Checker(plan).run()


class _Checker:
    def __init__(self, plan):
        self.plan = plan
        self.index = plan.index
        self.fine = plan.fine
        self.held = plan.diagnostics.held
        self.ops = {op.id: op for op in plan.graph.walk()}
        self.labels = {e.key: e.label for e in self.index.entries}
        self.found: list[Finding] = []
        self.seen: set = set()

    def run(self) -> list[Finding]:
        self._permutes()
        root = self.index.root
        ins = [self._input_state(k) for k in range(len(root.jaxpr.invars))]
        walk = Walk(self.index, self.fine, self._exit_state, self._report)
        outs = walk.body(root, ins, _consts(root), leave=True)
        for k, s in enumerate(outs):
            dims = self.plan.out_dims[k] if k < len(self.plan.out_dims) else ()
            sharded = {a for d in dims for a in d}
            for a, t in sorted(s.tags.items()):
                if t != V:
                    self._add("unreduced", "boundary", f"output {k}", a, f"returned as a partial {t}, never reduced")
                elif a not in sharded:
                    self._add("varies-but-whole", "boundary", f"output {k}", a,
                              f"returned whole over {a} but differs between its devices")
        PadWalk(self.plan, self._report_pad).run()
        return self.found

    # -- states the records give ------------------------------------------------------
    def _input_state(self, k: int) -> State:
        dims = self.plan.in_dims[k] if k < len(self.plan.in_dims) else ()
        return State({a: V for d in dims for a in d if self.fine.size_of.get(a, 1) > 1})

    def _held_for(self, var, key: str):
        op = self.ops.get(int(key[2:])) if key[2:].isdigit() else None
        if op is None:
            return None, None
        shape = tuple(var.aval.shape)
        cands = [(v, self.held[v.id]) for v in op.outputs if v.id in self.held
                 and self.held[v.id].local_shape == shape]
        if not cands or len({(h.dims, h.partial) for _, h in cands}) != 1:
            return None, None
        return cands[0]

    def _exit_state(self, var, key: str, s: State, entry, say) -> State:
        """The state of ``var`` as it leaves op scope ``key``: checked against, then set to, what
        the records hold for the op's result."""
        value, h = self._held_for(var, key)
        if h is None:
            return s
        label = self.labels.get(key, key)
        sizes = self.fine.size_of
        hp = {a: h.partial.op for a in h.partial.axes if sizes.get(a, 1) > 1} if h.partial is not None else {}
        sharded = {a for d in h.dims for a in d}
        tags = dict(s.tags)
        name = f"%{value.id}"
        for a, t in sorted(s.tags.items()):
            if t != V and a not in hp:
                self._add("unreduced", label, name, a, f"partial {t} over {a} in the program, but the plan holds "
                          "it whole here: it is never reduced")
                del tags[a]  # said once, not again downstream
            elif t == V and a not in hp and a not in sharded:
                self._add("varies-but-whole", label, name, a, f"the plan holds it whole over {a}, the program "
                          "leaves it differing between those devices (a reduction or gather missing)")
        for a, op in sorted(hp.items()):
            if a not in s.tags and not s.zero and op == "sum":
                self._add("reduced-twice", label, name, a, f"the plan holds it partial ({op}) over {a}, the program "
                          "already made it whole: reducing it again counts it "
                          f"{sizes[a]} times")
            tags[a] = op
        return State(tags, s.zero, s.pure, origin=name if hp else "")

    # -- findings ---------------------------------------------------------------------
    def _add(self, kind: str, op: str, value: str, axis: str, detail: str) -> None:
        f = Finding(kind, op, value, axis, detail)
        if f not in self.seen:
            self.seen.add(f)
            self.found.append(f)

    def _report(self, kind: str, entry, origin: str, axis: str, detail: str) -> None:
        if kind == "reduced-twice" and self._in_manual_region(entry):
            return  # the user's own collective in a jax.shard_map (psum of ones counts devices)
        self._add(kind, entry.label, origin or f"{entry.prim} {_path(entry.path)}", axis, detail)

    def _in_manual_region(self, entry) -> bool:
        return any(getattr(self.ops.get(i), "prim", "") in MANUAL for i in entry.op_ids)

    def _report_pad(self, entry, value: str, axis: str, detail: str) -> None:
        self._add("non-neutral-pad", entry.label, value, axis, detail)

    def _permutes(self) -> None:
        order = {a: i for i, a in enumerate(self.fine.names)}
        for e in self.index.entries:
            if e.prim != "ppermute":
                continue
            a = e.eqn.params["axis_name"]
            axes = tuple(a) if isinstance(a, (tuple, list)) else (a,)
            where = f"ppermute {_path(e.path)}"
            if [order.get(x, -1) for x in axes] != sorted(order.get(x, -1) for x in axes):
                self._add("permute-order", e.label, where, ",".join(axes),
                          f"axes {axes} not in mesh order {self.fine.names}: jax linearises them in mesh order")
            n = 1
            for x in axes:
                n *= self.fine.size_of.get(x, 1)
            bad = _permutation_problem(e.eqn.params["perm"], n)
            if bad is not None:
                self._add("not-a-permutation", e.label, where, ",".join(axes), bad)


def _permutation_problem(perm, n: int) -> Optional[str]:
    src = [int(s) for s, _ in perm]
    dst = [int(d) for _, d in perm]
    out = [i for i in src + dst if not 0 <= i < n]
    if out:
        return f"device {out[0]} is outside the {n} devices of its axes"
    for what, xs in (("sends", src), ("receives", dst)):
        dup = sorted((i, c) for i, c in Counter(xs).items() if c > 1)
        if dup:
            shown = tuple(perm) if len(perm) <= 16 else f"{len(perm)} pairs"
            return f"device {dup[0][0]} {what} {dup[0][1]} times in {shown}"
    return None


def _consts(body) -> dict:
    c = body.closed
    return {} if c is None else dict(zip(c.jaxpr.constvars, c.consts))


def _path(path) -> str:
    return "@" + ".".join(str(i) for i in path)
